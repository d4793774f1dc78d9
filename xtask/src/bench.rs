//! `cargo xtask bench`: decode speed of the native engine, MTP off vs on per call on one loaded
//! model (interleaved A/B reps, medians), a depth sweep, and mlx-vlm side by side when an
//! interpreter with mlx-vlm is given.
//!
//! ```text
//! cargo xtask bench --target-only                  # prefill / decode tok/s, peak memory
//! cargo xtask bench --model models/tiny-code --depths 1,2,3,4,5 --mlx-vlm /tmp/mlxref/bin/python
//! cargo xtask bench --model models/tiny-code --depths 1,3,auto   # auto: depth chosen per round
//! cargo xtask bench --model DIR-4bit --drafter DIR-MTP-4bit   # a companion drafter
//! cargo xtask bench --provider gguf                # native vs in-process llama.cpp, same weights
//! cargo xtask bench --model models/tiny-code --json-schema schema.json   # constrained vs free
//! cargo xtask bench --llama-server PATH --model DIR-4bit --gguf-from DIR   # vs llama.cpp
//! ```
//!
//! With `--provider NAME` the benchmark runs through the provider API instead (`mtp bench`, the
//! same interleaved A/B table for every provider). `--provider gguf` converts the checkpoint to
//! GGUF (the converter of `cargo xtask gguf`), benchmarks the native provider on the checkpoint
//! and the `gguf` provider on the converted file, and prints both tables and a side-by-side one.
//! Without `--model`, the benchmark-shape checkpoint is generated with `cargo xtask fixtures`'
//! writer (hidden 1024, 8 layers 3:1, 8/2 heads of 128, intermediate 3072, vocab 32000).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use candle_core::Device;
use mtp_engine::{Engine, GenerateOptions, WeightDtype};

pub(crate) struct Args {
    pub(crate) model: Option<PathBuf>,
    /// A companion drafter directory (`qwen3_5_mtp`) replacing any embedded head.
    pub(crate) drafter: Option<PathBuf>,
    pub(crate) target_only: bool,
    pub(crate) tokens: usize,
    pub(crate) prompt_len: usize,
    pub(crate) reps: usize,
    pub(crate) depths: Vec<usize>,
    /// `auto` in `--depths`: also run with the depth chosen per round (up to 8).
    pub(crate) auto: bool,
    pub(crate) mlx: Option<String>,
    pub(crate) out_dir: PathBuf,
    pub(crate) provider: Option<String>,
    /// A JSON Schema file: compare constrained and free decoding instead.
    pub(crate) json_schema: Option<PathBuf>,
    /// llama-server to compare against on the same weights (`bench_llama`).
    pub(crate) llama: Option<PathBuf>,
    /// The Hugging Face checkpoint the GGUF is converted from (default: the model).
    pub(crate) gguf_from: Option<PathBuf>,
    /// The GGUF tensor type (`llama-quantize`'s names); default from the model.
    pub(crate) gguf_type: Option<String>,
    /// The KV cache's type, for the engine and llama-server alike (default: each one's own,
    /// f32 for the engine, f16 for llama-server).
    pub(crate) cache_type: Option<mtp_engine::KvType>,
}

const HELP: &str = "\
cargo xtask bench [options]     MTP off vs on, interleaved reps, medians

  --model DIR          checkpoint (default: the generated benchmark shape)
  --drafter DIR        a companion drafter (mlx_vlm.convert --mtp-output) for the model
  --target-only        prefill / decode tok/s and peak memory only
  --tokens N           tokens generated per call (128)
  --prompt-len N       prompt tokens (128)
  --reps N             interleaved repetitions (3)
  --depths LIST        drafted tokens per round, e.g. 1,2,3 or 1,3,auto (1,2,3,4,5)
  --mlx-vlm PYTHON     also run mlx-vlm 0.7.10 with this interpreter
  --provider NAME      through the provider API (gguf: against in-process llama.cpp)
  --json-schema FILE   constrained against free decoding
  --llama-server PATH  against llama-server on the same weights
  --gguf-from DIR      the checkpoint the GGUF is converted from (default: the model)
  --gguf-type TYPE     llama-quantize's tensor type (default: from the model)
  --cache-type TYPE    the KV cache's type, f32, f16 or bf16, in the engine and in
                       llama-server (-ctk/-ctv) alike (default: each one's own: f32, f16)
  --out DIR            where the JSON and the plot go (target/bench)
";

fn parse(args: &[String]) -> Result<Args> {
    let mut a = Args {
        model: None,
        drafter: None,
        target_only: false,
        tokens: 128,
        prompt_len: 128,
        reps: 3,
        depths: vec![1, 2, 3, 4, 5],
        auto: false,
        mlx: None,
        out_dir: PathBuf::from("target/bench"),
        provider: None,
        json_schema: None,
        llama: None,
        gguf_from: None,
        gguf_type: None,
        cache_type: None,
    };
    let mut it = args.iter();
    while let Some(f) = it.next() {
        let mut val = || it.next().with_context(|| format!("{f} needs a value"));
        match f.as_str() {
            "--model" => a.model = Some(PathBuf::from(val()?)),
            "--drafter" => a.drafter = Some(PathBuf::from(val()?)),
            "--target-only" => a.target_only = true,
            "--tokens" => a.tokens = val()?.parse()?,
            "--prompt-len" => a.prompt_len = val()?.parse()?,
            "--reps" => a.reps = val()?.parse::<usize>()?.max(1),
            "--depths" => {
                let list = val()?;
                a.auto = list.split(',').any(|d| d.trim() == "auto");
                a.depths = list
                    .split(',')
                    .filter(|d| d.trim() != "auto")
                    .map(|d| d.trim().parse::<usize>())
                    .collect::<std::result::Result<_, _>>()?
            }
            "--mlx-vlm" => a.mlx = Some(val()?.clone()),
            "--out" => a.out_dir = PathBuf::from(val()?),
            "--provider" => a.provider = Some(val()?.clone()),
            "--json-schema" => a.json_schema = Some(PathBuf::from(val()?)),
            "--llama-server" => a.llama = Some(PathBuf::from(val()?)),
            "--gguf-from" => a.gguf_from = Some(PathBuf::from(val()?)),
            "--gguf-type" => a.gguf_type = Some(val()?.clone()),
            "--cache-type" => {
                a.cache_type = Some(val()?.parse().map_err(anyhow::Error::msg)?);
            }
            other => bail!("unknown bench flag `{other}`\n\n{HELP}"),
        }
    }
    Ok(a)
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

pub(crate) fn peak_rss_mib() -> Option<f64> {
    peak_rss_mib_of("self")
}

/// The peak resident memory (`VmHWM`) of process `pid` (`self` for this one), MiB.
pub(crate) fn peak_rss_mib_of(pid: &str) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// The machine's copy bandwidth (GB/s, bytes read plus written), from the best of a few copies
/// of 256 MiB on the engine's team.
pub(crate) fn copy_bandwidth() -> f64 {
    let n = 64 << 20;
    let src = vec![1f32; n];
    let mut dst = vec![0f32; n];
    let threads = mtp_engine::team::threads().max(1);
    let chunk = n.div_ceil(threads);
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let t = std::time::Instant::now();
        std::thread::scope(|s| {
            for (d, c) in dst.chunks_mut(chunk).zip(src.chunks(chunk)) {
                s.spawn(move || d.copy_from_slice(c));
            }
        });
        best = best.min(t.elapsed().as_secs_f64());
        std::hint::black_box(&dst);
    }
    (2 * 4 * n) as f64 / best / 1e9
}

/// Bytes of weights one target-only decode step reads, from the checkpoint's safetensors
/// headers: every tensor (packed words, scales and biases as stored) except the token
/// embedding (a step reads one row of it; all of it when it is also the LM head), the MTP
/// head's and the vision tower's, with each layer's routed experts (`switch_mlp`, `experts`)
/// counted for the `num_experts_per_tok` of `num_experts` that a token uses.
pub(crate) fn step_read_bytes(dir: &Path) -> Result<u64> {
    let read = |p: &Path| -> Result<serde_json::Value> {
        let text =
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
        Ok(serde_json::from_str(&text)?)
    };
    let cfg = read(&dir.join("config.json"))?;
    let text = if cfg["text_config"].is_object() {
        &cfg["text_config"]
    } else {
        &cfg
    };
    let tied = cfg["tie_word_embeddings"]
        .as_bool()
        .or(text["tie_word_embeddings"].as_bool())
        .unwrap_or(false);
    let experts = text["num_experts"].as_u64().unwrap_or(0);
    let used = text["num_experts_per_tok"].as_u64().unwrap_or(0);
    let index = dir.join("model.safetensors.index.json");
    let mut files: Vec<PathBuf> = if index.is_file() {
        let v = read(&index)?;
        let mut f: Vec<PathBuf> = v["weight_map"]
            .as_object()
            .context("weight_map")?
            .values()
            .filter_map(|f| f.as_str().map(|f| dir.join(f)))
            .collect();
        f.sort();
        f.dedup();
        f
    } else {
        vec![dir.join("model.safetensors")]
    };
    files.retain(|f| f.is_file());
    let (mut dense, mut routed) = (0u64, 0u64);
    for f in files {
        use std::io::Read;
        let mut file = std::fs::File::open(&f).with_context(|| format!("{}", f.display()))?;
        let mut len = [0u8; 8];
        file.read_exact(&mut len)?;
        let len = u64::from_le_bytes(len);
        if len > 1 << 30 {
            bail!("{}: a header of {len} bytes", f.display());
        }
        let mut header = vec![0u8; len as usize];
        file.read_exact(&mut header)?;
        let header: serde_json::Value = serde_json::from_slice(&header)?;
        for (name, t) in header.as_object().context("safetensors header")? {
            let offsets: Vec<u64> = t["data_offsets"]
                .as_array()
                .map(|o| o.iter().filter_map(serde_json::Value::as_u64).collect())
                .unwrap_or_default();
            let [start, end] = offsets[..] else {
                continue;
            };
            let bytes = end.saturating_sub(start);
            let head = name.starts_with("mtp.") || name.contains(".mtp.");
            let vision = name.contains("visual.") || name.contains("vision_tower");
            let embedding = name.contains("embed_tokens") && !tied;
            if head || vision || embedding {
                continue;
            }
            let expert = (name.contains(".switch_mlp.") || name.contains(".experts."))
                && !name.contains("shared_expert");
            if expert && experts > 0 {
                routed += bytes;
            } else {
                dense += bytes;
            }
        }
    }
    Ok(dense + routed * used / experts.max(1))
}

/// A short greedy generation on `prompt` before anything is timed (caches, the worker team,
/// first-touch pages).
pub(crate) fn warm_up(engine: &Engine, prompt: &[u32]) -> Result<()> {
    engine.generate(prompt, &GenerateOptions::greedy(8).ignore_eos(true), |_| {
        true
    })?;
    Ok(())
}

pub(crate) fn synthetic_prompt(len: usize, vocab: usize) -> Vec<u32> {
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            1 + (x % (vocab as u64 - 1)) as u32
        })
        .collect()
}

const MLX_SCRIPT: &str = r#"
import json, sys, time
import mlx.core as mx
from pathlib import Path
from mlx_vlm.generate import generate_step
from mlx_vlm.utils import load_model
a = json.loads(sys.argv[1])
model = load_model(Path(a["model"]))
draft = None
if a["depths"]:
    from mlx_vlm.speculative.drafters import load_drafter
    try:
        draft, _ = load_drafter(a["drafter"] or a["model"], kind="mtp")
    except Exception as e:
        print("no drafter:", e, file=sys.stderr)
def run(ids, n, depth=0):
    kw = dict(max_tokens=n, temperature=0.0, prefill_step_size=None)
    if depth and draft is not None:
        kw.update(draft_model=draft, draft_kind="mtp", draft_block_size=depth + 1)
    t0 = time.perf_counter(); tf = None; out = []
    for tok, _ in generate_step(mx.array([ids], dtype=mx.int32), model, None, None, **kw):
        if tf is None: tf = time.perf_counter()
        out.append(int(tok))
        if len(out) >= n: break
    t1 = time.perf_counter()
    return out, len(ids) / (tf - t0), (len(out) - 1) / (t1 - tf)
res = {"prompts": []}
for ids in a["prompts"]:
    run(ids, 8)
    r = {"off": [], "prefill": [], "on": {str(d): [] for d in a["depths"]}}
    for _ in range(a["reps"]):
        toks, pf, tps = run(ids, a["tokens"]); r["off"].append(tps); r["prefill"].append(pf)
        for d in a["depths"]:
            if draft is not None:
                _, _, t2 = run(ids, a["tokens"], d); r["on"][str(d)].append(t2)
    res["prompts"].append(r)
print(json.dumps(res))
"#;

fn run_mlx(
    py: &str,
    model: &Path,
    prompts: &[Vec<u32>],
    a: &Args,
    depths: &[usize],
) -> Result<serde_json::Value> {
    let arg = serde_json::json!({
        "model": model, "drafter": a.drafter, "prompts": prompts,
        "tokens": a.tokens, "reps": a.reps, "depths": depths,
    });
    let out = Command::new(py)
        .arg("-c")
        .arg(MLX_SCRIPT)
        .arg(arg.to_string())
        .output()
        .with_context(|| format!("running {py}"))?;
    if !out.status.success() {
        bail!(
            "mlx-vlm run failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let last = text.lines().last().unwrap_or_default();
    Ok(serde_json::from_str(last)?)
}

fn med_of(v: &serde_json::Value) -> f64 {
    median(
        v.as_array()
            .map(|a| a.iter().filter_map(|x| x.as_f64()).collect())
            .unwrap_or_default(),
    )
}

/// Texts for the speculative sweep: code, prose and a repetitive table.
const PROMPTS: [(&str, &str); 3] = [
    (
        "code",
        "fn fibonacci(n: u64) -> u64 {\n    if n < 2 {\n        return n;\n    }\n",
    ),
    (
        "prose",
        "The river wound slowly through the valley, and the old miller watched it from",
    ),
    (
        "table",
        "| id | name | qty |\n|----|------|-----|\n| 1 | apple | 3 |\n| 2 | pear | 5 |\n",
    ),
];

pub fn run(args: &[String]) -> Result<()> {
    if crate::print_help_if_asked(args, HELP) {
        return Ok(());
    }
    let a = parse(args)?;
    if let Some(p) = a.provider.clone() {
        return run_provider(&p, &a);
    }
    let model_dir = match &a.model {
        Some(m) => m.clone(),
        None => {
            let dir = PathBuf::from("target/fixtures/bench-qwen3_5");
            if !dir.join("model.safetensors").is_file() {
                println!(
                    "generating the benchmark checkpoint in {} ...",
                    dir.display()
                );
                crate::fixtures::write_checkpoint(&dir, &crate::fixtures::Shape::default())?;
            }
            dir
        }
    };
    if let Some(server) = &a.llama {
        return crate::bench_llama::run(&a, server, &model_dir);
    }
    let t = std::time::Instant::now();
    let mut engine = Engine::load_with_drafter(
        &model_dir,
        a.drafter.as_deref(),
        &Device::Cpu,
        WeightDtype::Stored,
    )?;
    if let Some(kv) = a.cache_type {
        engine.set_kv_type(kv);
    }
    println!(
        "loaded {} in {:.1}s ({} KV cache)",
        model_dir.display(),
        t.elapsed().as_secs_f64(),
        engine.kv_type()
    );
    let vocab = engine.model().vocab_size();
    std::fs::create_dir_all(&a.out_dir)?;
    if let Some(schema) = &a.json_schema {
        return run_constrained(&engine, &a, schema);
    }

    // ---- target-only: prefill / decode tok/s, peak memory
    let prompt = synthetic_prompt(a.prompt_len, vocab);
    let opts = GenerateOptions::greedy(a.tokens).ignore_eos(true);
    warm_up(&engine, &prompt)?;
    let (mut pf, mut dec) = (Vec::new(), Vec::new());
    for _ in 0..a.reps {
        let o = engine.generate(&prompt, &opts, |_| true)?;
        pf.push(o.timings.prefill_tokens_per_s.unwrap_or(f64::NAN));
        dec.push(o.timings.decode_tokens_per_s.unwrap_or(f64::NAN));
    }
    let (pf, dec) = (median(pf), median(dec));
    let peak = peak_rss_mib();
    println!(
        "\n## target-only ({} prompt tokens, {} generated, median of {})\n",
        a.prompt_len, a.tokens, a.reps
    );
    let held = engine
        .weights_held()
        .iter()
        .map(|(kind, bytes)| match *bytes as f64 {
            b if b >= (1 << 20) as f64 => format!("{kind} {:.0} MiB", b / (1 << 20) as f64),
            b => format!("{kind} {:.0} KiB", b / 1024.0),
        })
        .collect::<Vec<_>>()
        .join(" + ");
    println!("| runtime | prefill tok/s | decode tok/s | peak RSS MiB |");
    println!("| --- | --- | --- | --- |");
    println!(
        "| mtp-engine (candle, {held} weights, f32 arithmetic, {} KV cache) | {pf:.1} | {dec:.2} | {:.0} |",
        engine.kv_type(),
        peak.unwrap_or(f64::NAN)
    );
    let step_bytes = step_read_bytes(&model_dir)?;
    let bandwidth = copy_bandwidth();
    let step_bw = step_bytes as f64 * dec / 1e9;
    println!(
        "\nweights read per decode step: {:.1} MiB; at {dec:.1} tok/s {step_bw:.1} GB/s, {:.0}% of \
         this machine's copy bandwidth ({bandwidth:.1} GB/s, read + write), whose rate would \
         allow {:.0} tok/s",
        step_bytes as f64 / (1 << 20) as f64,
        100.0 * step_bw / bandwidth,
        bandwidth * 1e9 / step_bytes as f64
    );
    let mut report = serde_json::json!({
        "model": model_dir, "weights_held_bytes": engine.weights_held(), "target_only": {"prefill_tps": pf, "decode_tps": dec, "peak_rss_mib": peak,
            "step_read_bytes": step_bytes, "weights_gb_per_s": step_bw, "copy_gb_per_s": bandwidth},
    });
    let speculate = !a.target_only && engine.drafter().is_some();
    let depths: Vec<usize> = if speculate { a.depths.clone() } else { vec![] };
    let auto = speculate && a.auto;
    let tok = engine.tokenizer();
    let spec_prompts: Vec<(String, Vec<u32>)> = PROMPTS
        .iter()
        .map(|(name, text)| {
            let ids = tok
                .and_then(|t| t.encode(text).ok())
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| text.bytes().map(|b| b as u32 % vocab as u32).collect());
            (name.to_string(), ids)
        })
        .collect();
    let mlx = match &a.mlx {
        Some(py) => {
            let mut ps = vec![prompt.clone()];
            ps.extend(spec_prompts.iter().map(|(_, p)| p.clone()));
            Some(run_mlx(py, &model_dir, &ps, &a, &depths)?)
        }
        None => None,
    };
    if let Some(m) = &mlx {
        let p0 = &m["prompts"][0];
        let (mpf, mdec) = (med_of(&p0["prefill"]), med_of(&p0["off"]));
        println!("| mlx-vlm 0.7.10 (mlx cpu) | {mpf:.1} | {mdec:.2} | - |");
        println!(
            "\ndecode ratio mtp-engine / mlx-vlm: **{:.2}x**, prefill ratio {:.2}x",
            dec / mdec,
            pf / mpf
        );
        report["mlx_vlm"] =
            serde_json::json!({"prefill_tps": mpf, "decode_tps": mdec, "decode_ratio": dec / mdec});
    }
    if depths.is_empty() && !auto {
        std::fs::write(
            a.out_dir.join("bench.json"),
            serde_json::to_string_pretty(&report)?,
        )?;
        return Ok(());
    }

    // ---- MTP on vs off, same loaded engine, interleaved reps
    println!(
        "\n## MTP speculation ({} tokens, greedy, median of {} interleaved reps)\n",
        a.tokens, a.reps
    );
    let mlx_col = mlx.is_some();
    println!(
        "| prompt | depth | tok/s off | tok/s on | speedup | acceptance | accepted/round | identical | efficiency |{}",
        if mlx_col { " mlx-vlm speedup |" } else { "" }
    );
    println!(
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |{}",
        if mlx_col { " --- |" } else { "" }
    );
    let mut rows = Vec::new();
    // fixed depths, then `auto` (None): the depth chosen per round, up to the contract's ceiling
    let runs: Vec<Option<usize>> = depths
        .iter()
        .map(|&k| Some(k))
        .chain(auto.then_some(None))
        .collect();
    for (pi, (name, ids)) in spec_prompts.iter().enumerate() {
        for &k in &runs {
            let (mut off, mut on, mut acc, mut tpr, mut mean_depth) =
                (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
            let mut identical = true;
            let spec = match k {
                Some(k) => opts.clone().num_draft_tokens(k),
                None => opts
                    .clone()
                    .auto_depth(mtp_contract::AUTO_MAX_DRAFT_TOKENS as usize),
            };
            for _ in 0..a.reps {
                let o = engine.generate(ids, &opts, |_| true)?;
                let s = engine.generate(ids, &spec, |_| true)?;
                identical &= o.tokens == s.tokens;
                off.push(o.timings.decode_tokens_per_s.unwrap_or(f64::NAN));
                on.push(s.timings.decode_tokens_per_s.unwrap_or(f64::NAN));
                if let Some(sp) = &s.speculation {
                    acc.push(sp.stats.acceptance_rate().unwrap_or(0.0));
                    tpr.push(sp.stats.tokens_per_round().unwrap_or(1.0));
                    mean_depth.push(sp.stats.drafted as f64 / sp.stats.rounds.max(1) as f64);
                }
            }
            let (off, on, acc, tpr) = (median(off), median(on), median(acc), median(tpr));
            let speedup = on / off;
            let mlx_speedup = match (&mlx, k) {
                (Some(m), Some(k)) => {
                    let p = &m["prompts"][pi + 1];
                    Some(med_of(&p["on"][k.to_string()]) / med_of(&p["off"]))
                }
                _ => None,
            };
            let label = match k {
                Some(k) => k.to_string(),
                None => format!("auto (mean {:.1})", median(mean_depth)),
            };
            println!(
                "| {name} | {label} | {off:.2} | {on:.2} | {speedup:.2}x | {:.0}% | {:.2} | {} | {:.2} |{}",
                acc * 100.0,
                tpr - 1.0,
                if identical { "yes" } else { "NO" },
                speedup / tpr,
                mlx_speedup.map(|s| format!(" {s:.2}x |")).unwrap_or_default()
            );
            rows.push(serde_json::json!({
                "prompt": name, "depth": k.map_or(serde_json::json!("auto"), |k| k.into()), "tps_off": off, "tps_on": on, "speedup": speedup,
                "acceptance": acc, "tokens_per_round": tpr, "identical": identical,
                "efficiency": speedup / tpr, "mlx_vlm_speedup": mlx_speedup,
            }));
        }
    }
    report["mtp"] = serde_json::Value::Array(rows.clone());
    std::fs::write(
        a.out_dir.join("bench.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    let fixed: Vec<serde_json::Value> = rows
        .iter()
        .filter(|r| r["depth"].is_u64())
        .cloned()
        .collect();
    std::fs::write(a.out_dir.join("bench.svg"), svg(&fixed, &depths))?;
    println!(
        "\nwrote {0}/bench.json and {0}/bench.svg",
        a.out_dir.display()
    );
    Ok(())
}

/// Tok/s (MTP on) against depth, one line per prompt, with the MTP-off level dashed.
fn svg(rows: &[serde_json::Value], depths: &[usize]) -> String {
    let (w, h, m) = (640.0, 400.0, 50.0);
    let ymax = rows
        .iter()
        .flat_map(|r| {
            [
                r["tps_on"].as_f64().unwrap_or(0.0),
                r["tps_off"].as_f64().unwrap_or(0.0),
            ]
        })
        .fold(1.0, f64::max)
        * 1.1;
    let dmax = *depths.iter().max().unwrap_or(&1) as f64;
    let x = |d: f64| m + (d - 1.0) / (dmax - 1.0).max(1.0) * (w - 2.0 * m);
    let y = |v: f64| h - m - v / ymax * (h - 2.0 * m);
    let mut s = format!(
        "<svg xmlns='http://www.w3.org/2000/svg' width='{w}' height='{h}' font-family='sans-serif' font-size='12'>\
         <rect width='100%' height='100%' fill='white'/>\
         <line x1='{m}' y1='{b}' x2='{r}' y2='{b}' stroke='black'/><line x1='{m}' y1='{m}' x2='{m}' y2='{b}' stroke='black'/>\
         <text x='{cx}' y='{ty}' text-anchor='middle'>num_draft_tokens</text>\
         <text x='12' y='{cy}' transform='rotate(-90 12 {cy})' text-anchor='middle'>decode tok/s</text>",
        b = h - m,
        r = w - m,
        cx = w / 2.0,
        ty = h - 12.0,
        cy = h / 2.0
    );
    for d in depths {
        s += &format!(
            "<text x='{}' y='{}' text-anchor='middle'>{d}</text>",
            x(*d as f64),
            h - m + 16.0
        );
    }
    for i in 0..=4 {
        let v = ymax * i as f64 / 4.0;
        s += &format!(
            "<text x='{}' y='{}' text-anchor='end'>{v:.0}</text>",
            m - 4.0,
            y(v) + 4.0
        );
    }
    let colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];
    let mut names: Vec<&str> = rows.iter().filter_map(|r| r["prompt"].as_str()).collect();
    names.dedup();
    for (i, name) in names.iter().enumerate() {
        let c = colors[i % colors.len()];
        let pts: Vec<String> = rows
            .iter()
            .filter(|r| r["prompt"].as_str() == Some(name))
            .map(|r| {
                format!(
                    "{:.1},{:.1}",
                    x(r["depth"].as_f64().unwrap_or(1.0)),
                    y(r["tps_on"].as_f64().unwrap_or(0.0))
                )
            })
            .collect();
        s += &format!(
            "<polyline fill='none' stroke='{c}' stroke-width='2' points='{}'/>",
            pts.join(" ")
        );
        let off = rows
            .iter()
            .filter(|r| r["prompt"].as_str() == Some(name))
            .filter_map(|r| r["tps_off"].as_f64())
            .sum::<f64>()
            / depths.len().max(1) as f64;
        s += &format!(
            "<line x1='{m}' y1='{0:.1}' x2='{1}' y2='{0:.1}' stroke='{c}' stroke-dasharray='4 4'/>",
            y(off),
            w - m
        );
        s += &format!(
            "<text x='{}' y='{}' fill='{c}'>{name} (dashed: MTP off)</text>",
            w - m - 150.0,
            m + 16.0 * i as f64
        );
    }
    s + "</svg>"
}

/// Runs `mtp bench --json` (release build; the `gguf` feature when asked) and returns its rows.
fn mtp_bench(provider: &str, model: &Path, a: &Args) -> Result<Vec<serde_json::Value>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["run", "--quiet", "--release", "-p", "mtp"]);
    if provider == "gguf" {
        // The workspace config builds llama.cpp at -O1 for tests; a benchmark wants -O3. The
        // release target directory has its own llama.cpp build, so this is the one it gets.
        cmd.args(["--features", "gguf"])
            .env("CMAKE_C_FLAGS_RELEASE", "-O3 -DNDEBUG")
            .env("CMAKE_CXX_FLAGS_RELEASE", "-O3 -DNDEBUG");
    }
    let depths: Vec<String> = a.depths.iter().map(usize::to_string).collect();
    cmd.args(["--", "bench", "--provider", provider, "--model"])
        .arg(model)
        .args(["--depths", &depths.join(",")])
        .args(["--reps", &a.reps.to_string()])
        .args(["--max-tokens", &a.tokens.to_string()])
        .args(["--raw", "--json"]);
    if let Some(d) = a.drafter.as_ref().filter(|_| provider != "gguf") {
        cmd.arg("--drafter").arg(d);
    }
    for (_, text) in PROMPTS {
        cmd.args(["--prompt", text]);
    }
    println!(
        "running mtp bench --provider {provider} on {}",
        model.display()
    );
    let out = cmd
        .output()
        .with_context(|| format!("running mtp bench for {provider}"))?;
    if !out.status.success() {
        bail!(
            "mtp bench --provider {provider} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let start = text.find('[').context("mtp bench printed no JSON rows")?;
    let mut rows: Vec<serde_json::Value> =
        serde_json::from_str(text[start..].trim()).context("reading mtp bench's JSON rows")?;
    // `mtp bench` names `--prompt` prompts by position; give them the table's names.
    for r in &mut rows {
        if let Some(i) = r["prompt"]
            .as_str()
            .and_then(|p| p.strip_prefix("prompt "))
            .and_then(|i| i.parse::<usize>().ok())
        {
            r["prompt"] = serde_json::json!(PROMPTS.get(i - 1).map_or("?", |p| p.0));
        }
    }
    Ok(rows)
}

fn provider_table(title: &str, rows: &[serde_json::Value]) {
    let f = |r: &serde_json::Value, k: &str| r[k].as_f64().unwrap_or(f64::NAN);
    println!("\n## {title}\n");
    println!("| prompt | depth | tok/s off | tok/s on | speedup | acceptance | accepted/round | identical | efficiency |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for r in rows {
        println!(
            "| {} | {} | {:.2} | {:.2} | {:.2}x | {:.0}% | {:.2} | {} | {:.2} |",
            r["prompt"].as_str().unwrap_or("?"),
            r["depth"],
            f(r, "tok_s_off"),
            f(r, "tok_s_on"),
            f(r, "speedup"),
            f(r, "acceptance") * 100.0,
            f(r, "accepted_per_round"),
            if r["identical"].as_bool() == Some(true) {
                "yes"
            } else {
                "NO"
            },
            f(r, "efficiency"),
        );
    }
}

/// `--provider NAME`: the provider-level benchmark; for `gguf`, native and llama.cpp side by side.
fn run_provider(provider: &str, a: &Args) -> Result<()> {
    let model = a
        .model
        .clone()
        .unwrap_or_else(|| PathBuf::from("models/tiny-code"));
    std::fs::create_dir_all(&a.out_dir)?;
    if provider == "gguf" && a.drafter.is_some() {
        bail!("--drafter: the GGUF conversion takes the head embedded in the checkpoint (mtp.*); a companion drafter directory cannot be converted with it");
    }
    if provider != "gguf" {
        let rows = mtp_bench(provider, &model, a)?;
        provider_table(&format!("{provider}: {}", model.display()), &rows);
        std::fs::write(
            a.out_dir.join(format!("bench-{provider}.json")),
            serde_json::to_string_pretty(&rows)?,
        )?;
        return Ok(());
    }
    let (gguf_file, hf_dir) = if model.extension().is_some_and(|e| e == "gguf") {
        (model.clone(), None)
    } else {
        let name = model
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into());
        let out = a.out_dir.join(format!("{name}.gguf"));
        crate::gguf::convert::convert(&model, &out, &Default::default())
            .with_context(|| format!("converting {} to GGUF", model.display()))?;
        (out, Some(model.clone()))
    };
    let gguf_rows = mtp_bench("gguf", &gguf_file, a)?;
    provider_table(
        &format!(
            "gguf (llama.cpp b11434 in-process): {}",
            gguf_file.display()
        ),
        &gguf_rows,
    );
    let mut report = serde_json::json!({"gguf": gguf_rows});
    if let Some(dir) = hf_dir {
        let native_rows = mtp_bench("native", &dir, a)?;
        provider_table(
            &format!("native (mtp-engine-cpu): {}", dir.display()),
            &native_rows,
        );
        println!("\n## side by side (same weights)\n");
        println!("| prompt | depth | native off | native on | native speedup | gguf off | gguf on | gguf speedup |");
        println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
        let f = |r: &serde_json::Value, k: &str| r[k].as_f64().unwrap_or(f64::NAN);
        for (n, g) in native_rows.iter().zip(&gguf_rows) {
            println!(
                "| {} | {} | {:.1} | {:.1} | {:.2}x | {:.1} | {:.1} | {:.2}x |",
                n["prompt"].as_str().unwrap_or("?"),
                n["depth"],
                f(n, "tok_s_off"),
                f(n, "tok_s_on"),
                f(n, "speedup"),
                f(g, "tok_s_off"),
                f(g, "tok_s_on"),
                f(g, "speedup"),
            );
        }
        report["native"] = serde_json::Value::Array(native_rows);
    }
    let path = a.out_dir.join("bench-gguf.json");
    std::fs::write(&path, serde_json::to_string_pretty(&report)?)?;
    println!("\nwrote {}", path.display());
    Ok(())
}

/// `--json-schema FILE`: the same prompts decoded free and under the schema, MTP off and at
/// each depth, interleaved, on one loaded engine: tok/s, acceptance, and the time spent on
/// token masks per generated token.
fn run_constrained(engine: &Engine, a: &Args, schema_path: &Path) -> Result<()> {
    let text = std::fs::read_to_string(schema_path)
        .with_context(|| format!("reading {}", schema_path.display()))?;
    let schema: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("{} is not JSON", schema_path.display()))?;
    let format = mtp_engine::ResponseFormat::json_schema(schema);
    let tok = engine
        .tokenizer()
        .context("the checkpoint has no tokenizer.json")?;
    let depths: Vec<usize> = if engine.drafter().is_some() {
        std::iter::once(0).chain(a.depths.iter().copied()).collect()
    } else {
        vec![0]
    };
    println!(
        "\n## constrained ({}) vs free decoding (at most {} tokens, greedy, median of {} interleaved reps)\n",
        schema_path.display(),
        a.tokens,
        a.reps
    );
    println!("| prompt | depth | free tok/s | free acceptance | constrained tok/s | constrained acceptance | tokens | mask µs/token | identical to depth 0 |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    let mut rows = Vec::new();
    for (name, text) in PROMPTS {
        let ids = tok.encode(text)?;
        let mut base: Option<Vec<u32>> = None;
        for &k in &depths {
            let free = GenerateOptions::greedy(a.tokens).num_draft_tokens(k);
            let constrained = free.clone().response_format(format.clone());
            let (mut ft, mut ct, mut fa, mut ca, mut mask) =
                (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
            let mut out_tokens = Vec::new();
            for _ in 0..a.reps {
                for (opts, rate, acc) in
                    [(&free, &mut ft, &mut fa), (&constrained, &mut ct, &mut ca)]
                {
                    let o = engine.generate(&ids, opts, |_| true)?;
                    rate.push(o.timings.decode_tokens_per_s.unwrap_or(f64::NAN));
                    if let Some(sp) = o.speculation.as_ref().filter(|s| s.used) {
                        acc.push(sp.stats.accepted as f64 / sp.stats.drafted.max(1) as f64);
                    }
                    if let Some(ms) = o.timings.constraint_ms {
                        mask.push(ms * 1e3 / o.tokens.len().max(1) as f64);
                        out_tokens = o.tokens;
                    }
                }
            }
            let identical = match &base {
                None => {
                    base = Some(out_tokens.clone());
                    true
                }
                Some(b) => *b == out_tokens,
            };
            let (ft, ct, mask) = (median(ft), median(ct), median(mask));
            let fmt_acc = |v: Vec<f64>| {
                if v.is_empty() {
                    "-".to_string()
                } else {
                    format!("{:.0}%", median(v) * 100.0)
                }
            };
            let (fa_s, ca_s) = (fmt_acc(fa.clone()), fmt_acc(ca.clone()));
            println!(
                "| {name} | {k} | {ft:.0} | {fa_s} | {ct:.0} | {ca_s} | {} | {mask:.0} | {identical} |",
                out_tokens.len()
            );
            rows.push(
                serde_json::json!({"prompt": name, "depth": k, "free_tps": ft,
                "constrained_tps": ct, "free_acceptance": fa, "constrained_acceptance": ca,
                "tokens": out_tokens.len(), "mask_us_per_token": mask, "identical": identical}),
            );
        }
    }
    std::fs::write(
        a.out_dir.join("bench-constrained.json"),
        serde_json::to_string_pretty(&rows)?,
    )?;
    Ok(())
}
