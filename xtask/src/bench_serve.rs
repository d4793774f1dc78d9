//! `cargo xtask bench serve`: `mtp serve` under load, at several concurrencies, MTP off and at a
//! fixed depth and `auto` depth, and with `--llama-server PATH` the same load against llama-server on the same
//! checkpoint converted to GGUF, in the same run, as side-by-side columns.
//!
//! ```text
//! cargo xtask bench serve [--model models/tiny-code] [--concurrency 1,2,4,8,16]
//!     [--requests 2] [--max-tokens 64] [--depth 3] [--drafter DIR] [--llama-server PATH]
//!     [--gguf-from DIR] [--gguf-type TYPE] [--out target/bench]
//! ```
//!
//! The load generator (Rust, loopback only) keeps `c` requests in flight: each of `c` workers
//! sends raw completions one after another, streamed, until `requests × c` (at least 4) are
//! done; a level stops early after 120 s. Per request: time to first token, latency, tokens,
//! drafts; per level: aggregate decode throughput (tokens over the level's wall time), median
//! per-request decode rate, TTFT and latency p50/p99, acceptance. The levels run interleaved
//! (for each concurrency, every lane in turn), so the ratios compare like with like. Prints a
//! table, writes `bench-serve.json` and `bench-serve.svg` (aggregate tok/s against concurrency).

use std::io::{BufRead, BufReader};

use crate::llama::{start_llama, Server};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use futures::StreamExt;
use serde_json::{json, Value};

/// Varied code prompts (none is in the demo model's training text verbatim).
pub(crate) const PROMPTS: [&str; 6] = [
    "fn fibonacci(n: u64) -> u64 {\n",
    "pub struct Config {\n    pub name: String,\n",
    "impl Iterator for Counter {\n    type Item = u32;\n",
    "use std::collections::HashMap;\n\nfn count_words(text: &str) -> HashMap<",
    "#[derive(Debug, Clone)]\npub enum Shape {\n",
    "fn main() {\n    let args: Vec<String> = std::env::args().collect();\n",
];

/// How long one level may run.
const LEVEL_LIMIT: Duration = Duration::from_secs(120);

struct Args {
    model: PathBuf,
    concurrency: Vec<usize>,
    requests: usize,
    max_tokens: usize,
    depth: u32,
    llama: Option<PathBuf>,
    drafter: Option<PathBuf>,
    gguf_from: Option<PathBuf>,
    gguf_type: Option<String>,
    out_dir: PathBuf,
}

const HELP: &str = "\
cargo xtask bench serve [options]   mtp serve under load, at each concurrency

  --model DIR           checkpoint to serve (models/tiny-code)
  --concurrency LIST    clients at once, e.g. 1,2,4,8,16 (1,2,4,8,16)
  --requests N          requests per client at each level (2)
  --max-tokens N        tokens per reply (64)
  --depth N             drafted tokens per round, 1-16 (3)
  --drafter DIR         a companion drafter (mlx_vlm.convert --mtp-output) for the model
  --llama-server PATH   the same load against llama-server on the same weights
  --gguf-from DIR       the checkpoint llama-server's GGUF is converted from (default: the
                        model, which must then be unquantized)
  --gguf-type TYPE      llama-quantize's tensor type (default: from the model: Q4_0 for MLX
                        4-bit, Q8_0 for 8-bit, F32 otherwise)
  --out DIR             where the results go (target/bench)
";

fn parse(args: &[String]) -> Result<Args> {
    let mut a = Args {
        model: PathBuf::from("models/tiny-code"),
        concurrency: vec![1, 2, 4, 8, 16],
        requests: 2,
        max_tokens: 64,
        depth: 3,
        llama: None,
        drafter: None,
        gguf_from: None,
        gguf_type: None,
        out_dir: PathBuf::from("target/bench"),
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let v = it.next().with_context(|| format!("{flag} needs a value"))?;
        let num = |v: &str| -> Result<usize> {
            v.parse()
                .with_context(|| format!("{flag} needs a positive integer, got `{v}`"))
        };
        match flag.as_str() {
            "--model" => a.model = PathBuf::from(v),
            "--concurrency" => {
                a.concurrency = v.split(',').map(num).collect::<Result<_>>()?;
            }
            "--requests" => a.requests = num(v)?,
            "--max-tokens" => a.max_tokens = num(v)?,
            "--depth" => a.depth = num(v)? as u32,
            "--llama-server" => a.llama = Some(PathBuf::from(v)),
            "--drafter" => a.drafter = Some(PathBuf::from(v)),
            "--gguf-from" => a.gguf_from = Some(PathBuf::from(v)),
            "--gguf-type" => a.gguf_type = Some(v.clone()),
            "--out" => a.out_dir = PathBuf::from(v),
            other => bail!("unknown bench serve flag `{other}`\n\n{HELP}"),
        }
    }
    if a.concurrency.is_empty() || a.concurrency.contains(&0) {
        bail!("--concurrency needs positive counts, e.g. 1,2,4,8,16");
    }
    if a.requests == 0 || a.max_tokens == 0 || !(1..=16).contains(&a.depth) {
        bail!("--requests and --max-tokens must be at least 1, --depth 1 to 16");
    }
    Ok(a)
}

fn start_mtp(a: &Args, max_batch: usize) -> Result<Server> {
    let mut cmd = Command::new(build_mtp(true)?);
    cmd.args(["serve", "--port", "0", "--model"])
        .arg(&a.model)
        .args(["--num-draft-tokens", &a.depth.to_string()]);
    if let Some(d) = &a.drafter {
        cmd.arg("--drafter").arg(d);
    }
    cmd.args(["--max-batch", &max_batch.to_string(), "--max-queue", "1024"]);
    spawn_mtp_serve(cmd)
}

/// Builds the `mtp` command (release, or the dev build the tests run) and returns its path.
pub(crate) fn build_mtp(release: bool) -> Result<PathBuf> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut build = Command::new(&cargo);
    build.args(["build", "--quiet", "-p", "mtp"]);
    if release {
        build.arg("--release");
    }
    let st = build
        .status()
        .with_context(|| format!("running {build:?}"))?;
    if !st.success() {
        bail!("{build:?} failed");
    }
    // where cargo put it: CARGO_TARGET_DIR when set, else the workspace's target/
    let dir =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| PathBuf::from("target"), PathBuf::from);
    Ok(dir
        .join(if release { "release" } else { "debug" })
        .join("mtp"))
}

/// Starts `mtp serve` (its command line in `cmd`, with `--port 0`) and reads the address
/// from its first line; the rest of its output is read and dropped, so that it never blocks
/// on a full pipe.
pub(crate) fn spawn_mtp_serve(mut cmd: Command) -> Result<Server> {
    let mut child = cmd
        .env_remove("MTP_API_KEY")
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {cmd:?}"))?;
    let mut out = BufReader::new(child.stdout.take().context("no stdout")?);
    let mut line = String::new();
    out.read_line(&mut line)
        .context("reading mtp serve's first line")?;
    let start = line
        .find("http://")
        .with_context(|| format!("mtp serve printed no address: {line:?}"))?;
    let url = line[start..].split_whitespace().next().unwrap_or_default();
    let base = url.trim_end_matches("/v1").to_string();
    std::thread::spawn(move || {
        let mut sink = String::new();
        while out.read_line(&mut sink).map(|n| n > 0).unwrap_or(false) {
            sink.clear();
        }
    });
    Ok(Server { child, base })
}

/// One request's figures.
#[derive(Debug, Clone, Default)]
struct Sample {
    ttft_s: f64,
    latency_s: f64,
    tokens: u64,
    drafted: u64,
    accepted: u64,
}

async fn one(
    client: &reqwest::Client,
    base: &str,
    prompt: &str,
    max_tokens: usize,
    speculation: Option<&Value>,
) -> Result<Sample> {
    let mut body = json!({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
        "stream": true, "stream_options": {"include_usage": true}});
    if let Some(s) = speculation {
        body["speculation"] = s.clone();
    }
    let t0 = Instant::now();
    let r = client
        .post(format!("{base}/v1/completions"))
        .json(&body)
        .send()
        .await?;
    if !r.status().is_success() {
        bail!("{}: {}", r.status(), r.text().await.unwrap_or_default());
    }
    let mut s = Sample::default();
    let mut buf = Vec::new();
    let mut stream = r.bytes_stream();
    let mut pieces = 0u64;
    'read: while let Some(chunk) = stream.next().await {
        buf.extend_from_slice(&chunk?);
        while let Some(nl) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=nl).collect();
            let line = String::from_utf8_lossy(&line);
            let Some(data) = line.trim().strip_prefix("data:") else {
                continue;
            };
            let data = data.trim();
            if data == "[DONE]" {
                break 'read;
            }
            let Ok(v) = serde_json::from_str::<Value>(data) else {
                continue;
            };
            if v["choices"][0]["text"]
                .as_str()
                .is_some_and(|t| !t.is_empty())
            {
                if s.ttft_s == 0.0 {
                    s.ttft_s = t0.elapsed().as_secs_f64();
                }
                pieces += 1;
            }
            if let Some(t) = v.get("timings") {
                s.drafted = t["draft_n"].as_u64().unwrap_or(s.drafted);
                s.accepted = t["draft_n_accepted"].as_u64().unwrap_or(s.accepted);
                s.tokens = t["predicted_n"].as_u64().unwrap_or(s.tokens);
            }
            if let Some(n) = v
                .pointer("/usage/completion_tokens")
                .and_then(Value::as_u64)
            {
                s.tokens = n;
            }
        }
    }
    s.latency_s = t0.elapsed().as_secs_f64();
    if s.tokens == 0 {
        s.tokens = pieces;
    }
    Ok(s)
}

/// Keeps `c` requests in flight until `n` are done (or the level's time is up).
async fn level(
    base: &str,
    c: usize,
    n: usize,
    max_tokens: usize,
    speculation: Option<Value>,
) -> Result<(Vec<Sample>, f64)> {
    // a fresh connection per request: llama-server closes idle keep-alive connections, and a
    // request sent on one as it closes fails ("connection closed before message completed")
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()?;
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let t0 = Instant::now();
    let workers = (0..c).map(|_| {
        let (client, next, spec) = (client.clone(), next.clone(), speculation.clone());
        async move {
            let mut out = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if i >= n || t0.elapsed() > LEVEL_LIMIT {
                    return Ok::<_, anyhow::Error>(out);
                }
                let p = PROMPTS[i % PROMPTS.len()];
                out.push(one(&client, base, p, max_tokens, spec.as_ref()).await?);
            }
        }
    });
    let mut all = Vec::new();
    for r in futures::future::join_all(workers).await {
        all.extend(r?);
    }
    Ok((all, t0.elapsed().as_secs_f64()))
}

fn pct(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let i = ((p / 100.0) * (s.len() - 1) as f64).round() as usize;
    s[i.min(s.len() - 1)]
}

fn summarize(lane: &str, c: usize, samples: &[Sample], wall: f64) -> Value {
    let tokens: u64 = samples.iter().map(|s| s.tokens).sum();
    let (drafted, accepted): (u64, u64) = samples
        .iter()
        .fold((0, 0), |(d, a), s| (d + s.drafted, a + s.accepted));
    let ttft: Vec<f64> = samples.iter().map(|s| s.ttft_s * 1e3).collect();
    let lat: Vec<f64> = samples.iter().map(|s| s.latency_s * 1e3).collect();
    let decode: Vec<f64> = samples
        .iter()
        .filter(|s| s.tokens > 1 && s.latency_s > s.ttft_s)
        .map(|s| (s.tokens - 1) as f64 / (s.latency_s - s.ttft_s))
        .collect();
    json!({
        "lane": lane, "concurrency": c, "requests": samples.len(), "tokens": tokens,
        "wall_s": wall, "aggregate_tok_s": tokens as f64 / wall,
        "decode_tok_s_p50": pct(&decode, 50.0),
        "ttft_ms_p50": pct(&ttft, 50.0), "ttft_ms_p99": pct(&ttft, 99.0),
        "latency_ms_p50": pct(&lat, 50.0), "latency_ms_p99": pct(&lat, 99.0),
        "drafted": drafted, "accepted": accepted,
        "acceptance": if drafted > 0 { json!(accepted as f64 / drafted as f64) } else { Value::Null },
    })
}

/// `cargo xtask bench serve`.
pub fn run(args: &[String]) -> Result<()> {
    if crate::print_help_if_asked(args, HELP) {
        return Ok(());
    }
    let a = parse(args)?;
    std::fs::create_dir_all(&a.out_dir)?;
    let max_c = *a.concurrency.iter().max().unwrap_or(&1);
    let mtp = start_mtp(&a, max_c)?;
    println!(
        "mtp serve on {} ({}), --max-batch {max_c}",
        mtp.base,
        a.model.display()
    );
    let d = a.depth;
    let mut lanes: Vec<(String, String, Option<Value>)> = vec![
        ("mtp off".into(), mtp.base.clone(), Some(json!(false))),
        (
            format!("mtp depth {d}"),
            mtp.base.clone(),
            Some(json!({"mode": "native_mtp", "num_draft_tokens": d})),
        ),
        (
            "mtp auto".into(),
            mtp.base.clone(),
            Some(json!({"mode": "native_mtp", "num_draft_tokens": "auto"})),
        ),
    ];
    let mut _llama = Vec::new();
    if let Some(bin) = &a.llama {
        let (gguf, ty) = crate::bench_llama::same_weights_gguf(
            &a.out_dir,
            bin,
            &a.model,
            a.gguf_from.as_deref(),
            a.gguf_type.as_deref(),
        )?;
        println!("llama-server reads {} ({ty})", gguf.display());
        let off = start_llama(bin, &gguf, max_c, 1024, None, None)?;
        let on = start_llama(bin, &gguf, max_c, 1024, Some(d), None)?;
        println!(
            "llama-server -np {max_c}: off on {}, draft-mtp {d} on {}",
            off.base, on.base
        );
        lanes.push(("llama-server off".into(), off.base.clone(), None));
        lanes.push((format!("llama-server draft-mtp {d}"), on.base.clone(), None));
        _llama.push(off);
        _llama.push(on);
    }
    let rt = tokio::runtime::Runtime::new()?;
    // warm-up: one request per lane
    for (_, base, spec) in &lanes {
        rt.block_on(level(base, 1, 1, 8, spec.clone()))?;
    }
    let mut rows = Vec::new();
    for &c in &a.concurrency {
        let n = (a.requests * c).max(4);
        for (lane, base, spec) in &lanes {
            let (samples, wall) = rt.block_on(level(base, c, n, a.max_tokens, spec.clone()))?;
            let row = summarize(lane, c, &samples, wall);
            println!(
                "c={c:>2} {lane:<24} {:>8.1} tok/s aggregate",
                row["aggregate_tok_s"].as_f64().unwrap_or(f64::NAN)
            );
            rows.push(row);
        }
    }
    print_table(&rows, &lanes);
    let path = a.out_dir.join("bench-serve.json");
    std::fs::write(&path, serde_json::to_string_pretty(&rows)?)?;
    let svg_path = a.out_dir.join("bench-serve.svg");
    std::fs::write(&svg_path, svg(&rows, &lanes, &a.concurrency))?;
    println!("\nwrote {} and {}", path.display(), svg_path.display());
    Ok(())
}

fn print_table(rows: &[Value], lanes: &[(String, String, Option<Value>)]) {
    let f = |r: &Value, k: &str| r[k].as_f64().unwrap_or(f64::NAN);
    let base = |lane: &str| {
        rows.iter()
            .find(|r| r["lane"] == lane && r["concurrency"] == 1)
            .map(|r| f(r, "aggregate_tok_s"))
    };
    println!("\n| concurrency | lane | aggregate tok/s | vs c=1 | vs mtp off | decode tok/s per request (p50) | TTFT ms p50 / p99 | latency ms p50 / p99 | acceptance |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for r in rows {
        let lane = r["lane"].as_str().unwrap_or("?");
        let agg = f(r, "aggregate_tok_s");
        let off = rows
            .iter()
            .find(|o| o["lane"] == "mtp off" && o["concurrency"] == r["concurrency"])
            .map(|o| f(o, "aggregate_tok_s"));
        let _ = lanes;
        println!(
            "| {} | {lane} | {agg:.1} | {} | {} | {:.1} | {:.0} / {:.0} | {:.0} / {:.0} | {} |",
            r["concurrency"],
            base(lane).map_or("-".into(), |b| format!("{:.2}x", agg / b)),
            off.map_or("-".into(), |o| format!("{:.2}x", agg / o)),
            f(r, "decode_tok_s_p50"),
            f(r, "ttft_ms_p50"),
            f(r, "ttft_ms_p99"),
            f(r, "latency_ms_p50"),
            f(r, "latency_ms_p99"),
            r["acceptance"]
                .as_f64()
                .map_or("-".into(), |x| format!("{:.0}%", x * 100.0)),
        );
    }
}

/// Aggregate tok/s against concurrency (log scale), one line per lane.
fn svg(rows: &[Value], lanes: &[(String, String, Option<Value>)], conc: &[usize]) -> String {
    let (w, h, m) = (640.0, 400.0, 60.0);
    let max_y = rows
        .iter()
        .filter_map(|r| r["aggregate_tok_s"].as_f64())
        .fold(1.0f64, f64::max)
        * 1.1;
    let max_c = *conc.iter().max().unwrap_or(&1) as f64;
    let x = |c: f64| {
        m + (w - 2.0 * m)
            * if max_c > 1.0 {
                c.log2() / max_c.log2()
            } else {
                0.5
            }
    };
    let y = |v: f64| h - m - (h - 2.0 * m) * v / max_y;
    let colors = [
        "#999", "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e",
    ];
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <text x=\"{m}\" y=\"20\">aggregate decode tok/s against concurrency</text>\n\
         <line x1=\"{m}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n<line x1=\"{m}\" y1=\"{m}\" x2=\"{m}\" y2=\"{}\" stroke=\"black\"/>\n",
        h - m, w - m, h - m, h - m
    );
    for &c in conc {
        s += &format!(
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{c}</text>\n",
            x(c as f64),
            h - m + 16.0
        );
    }
    s += &format!(
        "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{max_y:.0}</text>\n",
        m - 4.0,
        y(max_y)
    );
    for (i, (lane, _, _)) in lanes.iter().enumerate() {
        let pts: Vec<String> = rows
            .iter()
            .filter(|r| r["lane"] == lane.as_str())
            .filter_map(|r| {
                Some(format!(
                    "{:.1},{:.1}",
                    x(r["concurrency"].as_f64()?),
                    y(r["aggregate_tok_s"].as_f64()?)
                ))
            })
            .collect();
        let col = colors[i % colors.len()];
        s += &format!(
            "<polyline fill=\"none\" stroke=\"{col}\" stroke-width=\"2\" points=\"{}\"/>\n\
             <text x=\"{}\" y=\"{}\" fill=\"{col}\">{lane}</text>\n",
            pts.join(" "),
            w - m - 150.0,
            m + 16.0 * i as f64
        );
    }
    s + "</svg>\n"
}
