//! `cargo xtask bench --llama-server PATH`: the native engine against llama-server on the same
//! weights, prefill and decode tok/s side by side, target-only and with MTP at each depth, in one
//! run with the lanes interleaved rep by rep (medians).
//!
//! ```text
//! cargo xtask bench --llama-server PATH [--model DIR] [--drafter DIR]
//!     [--gguf-from HF_DIR] [--gguf-type F32|BF16|Q8_0|Q4_0] [--prompt-len 1006] [--tokens 128]
//!     [--reps 3] [--depths 1,2,3]
//! ```
//!
//! The GGUF is written from `--gguf-from` (default: `--model`, which must then be unquantized)
//! by `cargo xtask gguf`'s converter as F32 and, for any other `--gguf-type`, re-encoded by
//! llama.cpp's `llama-quantize` from the same sdist. With an MLX-quantized `--model` (made by
//! `mlx_vlm.convert -q` from the Hugging Face checkpoint given as `--gguf-from`), both engines
//! read weights quantized from the same f32 values: MLX affine 4-bit against `Q4_0`, 8-bit
//! against `Q8_0`. The default type follows the model: `Q4_0` / `Q8_0` for MLX 4 / 8 bits,
//! `BF16` for a bf16 checkpoint, `F32` otherwise.
//!
//! Each rep runs, in turn, the engine target-only and llama-server without drafting on the same
//! random prompt of `--prompt-len` ids (llama-server with `cache_prompt: false`, so it prefills
//! the whole prompt every time), then each depth on both (llama-server restarted per depth with
//! `--spec-type draft-mtp --spec-draft-n-max D`). Both run greedy with `ignore_eos` for exactly
//! `--tokens` tokens, on as many threads as the engine's team. llama-server's figures are its
//! own `timings` (`prompt_per_second`, `predicted_per_second`); the engine's are its report's.
//! Next to decode, the table prints the weight bytes a step reads over the step time (routed
//! experts counted for the ones a token uses, see `bench::step_read_bytes`), with the machine's
//! copy bandwidth measured in the same run, and both engines' peak RSS. Writes
//! `bench-llama.json`.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use candle_core::Device;
use mtp_engine::{Engine, GenerateOptions, WeightDtype};
use serde_json::{json, Value};

use crate::bench::{
    copy_bandwidth, median, peak_rss_mib, peak_rss_mib_of, step_read_bytes, synthetic_prompt, Args,
};
use crate::llama::{quantize_tool, start_llama, Server};

/// The GGUF type that matches the checkpoint's own weights, from the config as the engine
/// reads it (MLX `quantization` bits, the declared dtype).
fn default_type(model: &Path) -> Result<String> {
    let cfg = mtp_engine::config::ModelConfig::load(model)
        .with_context(|| format!("reading {}/config.json", model.display()))?;
    let bits = cfg.quantization.as_ref().and_then(|q| q["bits"].as_u64());
    Ok(match (bits, cfg.declared_dtype.as_deref()) {
        (Some(4), _) => "Q4_0",
        (Some(8), _) => "Q8_0",
        (Some(b), _) => bail!("no GGUF type matches MLX {b}-bit weights; pass --gguf-type"),
        (None, Some("bfloat16")) => "BF16",
        _ => "F32",
    }
    .to_string())
}

/// Writes the GGUF llama-server reads: the converter's F32, re-encoded to `ty` by
/// llama-quantize unless `ty` is F32.
fn gguf_for(out_dir: &Path, server: &Path, source: &Path, ty: &str) -> Result<PathBuf> {
    std::fs::create_dir_all(out_dir)?;
    let name = source
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into());
    let f32_path = out_dir.join(format!("{name}-F32.gguf"));
    crate::gguf::convert::convert(source, &f32_path, &Default::default())
        .with_context(|| format!("converting {} to GGUF", source.display()))?;
    if ty == "F32" {
        return Ok(f32_path);
    }
    let out = out_dir.join(format!("{name}-{ty}.gguf"));
    let tool = quantize_tool(server)?;
    let st = std::process::Command::new(&tool)
        .arg(&f32_path)
        .arg(&out)
        .arg(ty)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .with_context(|| format!("running {}", tool.display()))?;
    if !st.success() {
        bail!(
            "{} {} {ty} failed ({st})",
            tool.display(),
            f32_path.display()
        );
    }
    Ok(out)
}

/// The GGUF llama-server reads for `model`, and its tensor type: converted from `gguf_from`
/// (default: `model`, which must then be unquantized) and re-encoded by `llama-quantize` to
/// `gguf_type` (default: the type matching `model`'s MLX quantization, F32 otherwise). Shared by
/// `bench --llama-server` and `bench serve --llama-server`.
pub(crate) fn same_weights_gguf(
    out_dir: &Path,
    server: &Path,
    model: &Path,
    gguf_from: Option<&Path>,
    gguf_type: Option<&str>,
) -> Result<(PathBuf, String)> {
    let ty = match gguf_type {
        Some(t) => t.to_ascii_uppercase(),
        None => default_type(model)?,
    };
    let quantized = matches!(default_type(model).as_deref(), Ok("Q4_0" | "Q8_0"));
    let source = match gguf_from {
        Some(dir) => dir.to_path_buf(),
        None if quantized => bail!(
            "{} holds MLX-quantized weights, which the GGUF converter does not read: pass \
             --gguf-from with the Hugging Face checkpoint it was made from",
            model.display()
        ),
        None => model.to_path_buf(),
    };
    let gguf = gguf_for(out_dir, server, &source, &ty)?;
    Ok((gguf, ty))
}

/// One llama-server completion: (prefill tok/s, decode tok/s, drafted, accepted).
async fn llama_once(
    client: &reqwest::Client,
    base: &str,
    prompt: &[u32],
    tokens: usize,
) -> Result<(f64, f64, u64, u64)> {
    let body = json!({
        "prompt": prompt, "n_predict": tokens, "temperature": 0.0, "top_k": 1,
        "ignore_eos": true, "cache_prompt": false, "stream": false,
    });
    let r = client
        .post(format!("{base}/completion"))
        .json(&body)
        .send()
        .await?
        .error_for_status()?;
    let v: Value = r.json().await?;
    let t = &v["timings"];
    let n = t["predicted_n"].as_u64().unwrap_or(0);
    if n as usize != tokens {
        bail!("llama-server generated {n} tokens, asked for {tokens}: {v}");
    }
    Ok((
        t["prompt_per_second"].as_f64().unwrap_or(f64::NAN),
        t["predicted_per_second"].as_f64().unwrap_or(f64::NAN),
        t["draft_n"].as_u64().unwrap_or(0),
        t["draft_n_accepted"].as_u64().unwrap_or(0),
    ))
}

/// Runs the comparison (see the module docs).
pub fn run(a: &Args, server: &Path, model: &Path) -> Result<()> {
    let (gguf, ty) = same_weights_gguf(
        &a.out_dir,
        server,
        model,
        a.gguf_from.as_deref(),
        a.gguf_type.as_deref(),
    )?;
    let mut engine = Engine::load_with_drafter(
        model,
        a.drafter.as_deref(),
        &Device::Cpu,
        WeightDtype::Stored,
    )?;
    if let Some(kv) = a.cache_type {
        engine.set_kv_type(kv);
    }
    let depths: Vec<usize> = if a.target_only || engine.drafter().is_none() {
        vec![]
    } else {
        a.depths.clone()
    };
    let held: usize = engine.weights_held().values().sum();
    let vocab = engine.model().vocab_size();
    let prompt = synthetic_prompt(a.prompt_len, vocab);
    let ctx = (a.prompt_len + a.tokens + 64).next_power_of_two();
    let rt = tokio::runtime::Runtime::new()?;
    let client = reqwest::Client::new();
    let mut servers: Vec<(Option<usize>, Server)> = vec![(
        None,
        start_llama(server, &gguf, 1, ctx, None, a.cache_type)?,
    )];
    for &d in &depths {
        servers.push((
            Some(d),
            start_llama(server, &gguf, 1, ctx, Some(d as u32), a.cache_type)?,
        ));
    }
    println!(
        "mtp-engine on {} ({:.0} MiB held, {} KV cache) vs llama-server on {} ({ty}, {} KV cache), {} threads each",
        model.display(),
        held as f64 / (1 << 20) as f64,
        engine.kv_type(),
        gguf.display(),
        a.cache_type.map_or("f16 (its default)".to_string(), |k| k.to_string()),
        mtp_engine::team::threads()
    );
    // warm-up: both engines, every lane
    let opts = GenerateOptions::greedy(a.tokens).ignore_eos(true);
    crate::bench::warm_up(&engine, &prompt)?;
    for (_, s) in &servers {
        rt.block_on(llama_once(&client, &s.base, &prompt, 8))?;
    }
    // lanes: None = target-only, Some(d) = depth d; per lane (mtp prefill, mtp decode, llama
    // prefill, llama decode, mtp acceptance, llama acceptance)
    let lanes: Vec<Option<usize>> = std::iter::once(None)
        .chain(depths.iter().map(|&d| Some(d)))
        .collect();
    let mut samples = vec![vec![Vec::new(); 6]; lanes.len()];
    for rep in 0..a.reps {
        for (li, lane) in lanes.iter().enumerate() {
            let o = match lane {
                None => engine.generate(&prompt, &opts, |_| true)?,
                Some(d) => {
                    engine.generate(&prompt, &opts.clone().num_draft_tokens(*d), |_| true)?
                }
            };
            let s = &mut samples[li];
            s[0].push(o.timings.prefill_tokens_per_s.unwrap_or(f64::NAN));
            s[1].push(o.timings.decode_tokens_per_s.unwrap_or(f64::NAN));
            if let Some(sp) = &o.speculation {
                s[4].push(sp.stats.acceptance_rate().unwrap_or(0.0));
            }
            let base = &servers[li].1.base;
            let (pf, dec, drafted, accepted) =
                rt.block_on(llama_once(&client, base, &prompt, a.tokens))?;
            s[2].push(pf);
            s[3].push(dec);
            if drafted > 0 {
                s[5].push(accepted as f64 / drafted as f64);
            }
        }
        println!("rep {}/{} done", rep + 1, a.reps);
    }
    let med: Vec<Vec<f64>> = samples
        .into_iter()
        .map(|l| l.into_iter().map(median).collect())
        .collect();
    println!(
        "\n## mtp-engine vs llama-server b11434 ({} prompt ids, {} tokens greedy, median of {} interleaved reps)\n",
        a.prompt_len, a.tokens, a.reps
    );
    println!("| lane | mtp prefill tok/s | llama.cpp prefill tok/s | prefill ratio | mtp decode tok/s | llama.cpp decode tok/s | decode ratio | acceptance mtp / llama.cpp |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    let mut rows = Vec::new();
    for (lane, m) in lanes.iter().zip(&med) {
        let name = lane.map_or("target-only".to_string(), |d| format!("MTP depth {d}"));
        let acc = match lane {
            None => "-".to_string(),
            Some(_) => format!("{:.2} / {:.2}", m[4], m[5]),
        };
        let pf = if lane.is_none() {
            format!("| {:.1} | {:.1} | {:.2}x ", m[0], m[2], m[0] / m[2])
        } else {
            "| - | - | - ".to_string()
        };
        println!(
            "| {name} {pf}| {:.1} | {:.1} | **{:.2}x** | {acc} |",
            m[1],
            m[3],
            m[1] / m[3]
        );
        rows.push(json!({
            "lane": name, "depth": lane, "mtp_prefill_tps": m[0], "mtp_decode_tps": m[1],
            "llama_prefill_tps": m[2], "llama_decode_tps": m[3],
            "prefill_ratio": m[0] / m[2], "decode_ratio": m[1] / m[3],
            "mtp_acceptance": m[4], "llama_acceptance": m[5],
        }));
    }
    // the peaks before the copy's buffers (which the allocator may keep) are counted
    let engine_peak = peak_rss_mib();
    let server_peak = peak_rss_mib_of(&servers[0].1.child.id().to_string());
    let bandwidth = copy_bandwidth();
    let step_bytes = step_read_bytes(model)?;
    let step_bw = step_bytes as f64 * med[0][1] / 1e9;
    println!(
        "\nweights read per target-only step over its time: {step_bw:.1} GB/s ({:.1} MiB a step), \
         {:.0}% of this machine's copy bandwidth: {bandwidth:.1} GB/s (read + write), which \
         would allow {:.0} tok/s",
        step_bytes as f64 / (1 << 20) as f64,
        100.0 * step_bw / bandwidth,
        bandwidth * 1e9 / step_bytes as f64
    );
    println!(
        "peak RSS: mtp-engine {:.0} MiB (this process: every lane, and the GGUF conversion before them; \
         `--target-only` without `--llama-server` measures the engine alone), llama-server \
         (target-only) {:.0} MiB",
        engine_peak.unwrap_or(f64::NAN),
        server_peak.unwrap_or(f64::NAN)
    );
    let report = json!({
        "model": model, "gguf": gguf, "gguf_type": ty, "prompt_len": a.prompt_len,
        "tokens": a.tokens, "reps": a.reps, "threads": mtp_engine::team::threads(),
        "weights_held_bytes": held, "step_read_bytes": step_bytes, "weights_gb_per_s": step_bw,
        "copy_gb_per_s": bandwidth, "mtp_peak_rss_mib": engine_peak,
        "llama_peak_rss_mib": server_peak,
        "lanes": rows,
    });
    let path = a.out_dir.join("bench-llama.json");
    std::fs::write(&path, serde_json::to_string_pretty(&report)?)?;
    println!("wrote {}", path.display());
    drop(servers);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures")
            .join(name)
    }

    /// The GGUF type follows the checkpoint: MLX 4 bits → Q4_0, f32 → F32, and a width
    /// llama.cpp has no match for is an error naming the flag to pass.
    #[test]
    fn the_gguf_type_follows_the_checkpoint() {
        assert_eq!(default_type(&fixture("tiny-mlx4")).unwrap(), "Q4_0");
        assert_eq!(default_type(&fixture("tiny-hf")).unwrap(), "F32");
        let err = default_type(&fixture("tiny-mlx3")).unwrap_err().to_string();
        assert!(err.contains("--gguf-type"), "{err}");
        let err = default_type(Path::new("/nonexistent"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("/nonexistent/config.json"), "{err}");
    }
}
