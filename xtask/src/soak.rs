//! `cargo xtask soak`: `mtp serve` under mixed normal, malformed and slow clients for a while,
//! checking that it never dies, that its memory stays bounded, that every normal request gets
//! the answer it gets alone, and that `/metrics` adds up to what the clients received.
//!
//! ```text
//! cargo xtask soak [--minutes 5] [--model models/tiny-code] [--max-batch 4] [--out target/soak]
//! ```
//!
//! Loopback only, bounded in time: every client loop stops at the deadline, and the server is
//! stopped with SIGTERM at the end (its exit within the grace period is checked too). The
//! normal clients send greedy completions and chats (whole and streamed, speculation off, at
//! depth 3 and `auto`, some with a `prompt_cache_key`) whose text must equal a solo run's; the
//! malformed clients send what an attacker or a broken client sends (garbage JSON, wrong
//! types, thousands of stop strings, a 300-link `$ref` chain, an 800-rule Lark grammar, a
//! prompt over the context, a wrong key, unknown routes, a forced tool call whose schema
//! branches on itself, schemas past the walk's budget, megabyte `prompt_cache_key`s, history
//! tool calls whose arguments are not objects, out-of-vocabulary `logit_bias`, `best_of`,
//! repeated JSON keys, a 5 MiB prompt); the slow clients half-send headers and bodies, open
//! idle connections past the cap (so idle ones are evicted) and start streams they never read;
//! the abandoning client starts long generations and hangs up within a second (whole and
//! streamed, so prompts, decode steps and queue waits are all cancelled). The figures
//! (requests and errors by kind, peak RSS, latency percentiles, the exit after SIGTERM) are
//! printed and written to `soak.json`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use futures::StreamExt;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::llama::Server;

const HELP: &str = "\
cargo xtask soak [options]   mtp serve under mixed normal, malformed and slow clients

  --minutes N      how long the load runs (5)
  --model DIR      checkpoint to serve (models/tiny-code)
  --max-batch N    the server's --max-batch (4)
  --out DIR        where soak.json goes (target/soak)
";

const KEY: &str = "soak-key";
const MAX_TOKENS: u64 = 48;

/// Code prompts for the normal clients (`bench serve`'s).
use crate::bench_serve::PROMPTS;

struct Args {
    minutes: f64,
    model: PathBuf,
    max_batch: usize,
    out: PathBuf,
}

fn parse(args: &[String]) -> Result<Args> {
    let mut a = Args {
        minutes: 5.0,
        model: PathBuf::from("models/tiny-code"),
        max_batch: 4,
        out: PathBuf::from("target/soak"),
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let v = it.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--minutes" => {
                a.minutes = v
                    .parse()
                    .ok()
                    .filter(|m: &f64| *m > 0.0 && *m <= 24.0 * 60.0)
                    .with_context(|| format!("--minutes takes 0-1440, got `{v}`"))?
            }
            "--model" => a.model = PathBuf::from(v),
            "--max-batch" => {
                a.max_batch =
                    v.parse().ok().filter(|n| *n >= 1).with_context(|| {
                        format!("--max-batch takes a positive integer, got `{v}`")
                    })?
            }
            "--out" => a.out = PathBuf::from(v),
            _ => bail!("unknown flag {flag}\n\n{HELP}"),
        }
    }
    Ok(a)
}

fn start(a: &Args) -> Result<Server> {
    // the dev build (the engine and every dependency optimised, as the tests run it): the
    // soak checks robustness, not speed
    let mut cmd = Command::new(crate::bench_serve::build_mtp(false)?);
    cmd.args(["serve", "--port", "0", "--model"])
        .arg(&a.model)
        .args([
            "--max-batch",
            &a.max_batch.to_string(),
            "--max-queue",
            "256",
        ])
        .args(["--api-key", KEY, "--max-connections", "64"])
        .args([
            "--header-timeout",
            "2",
            "--body-timeout",
            "4",
            "--write-timeout",
            "2",
        ])
        .args(["--shutdown-grace", "10"])
        // a 4 KiB model name in every chunk: a stream its client never reads outgrows the
        // socket buffers for sure, so the write timeout, not the end of generation, ends it
        .args(["--served-model-name", &"soak".repeat(1024)])
        .stderr(Stdio::null());
    crate::bench_serve::spawn_mtp_serve(cmd)
}

/// Resident memory of a process, in bytes (Linux `/proc`).
fn rss(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: u64 = s
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// One normal request: its body and the text it must get.
#[derive(Clone)]
struct Normal {
    path: &'static str,
    body: Value,
}

fn normals() -> Vec<Normal> {
    let mut v = Vec::new();
    for (i, p) in PROMPTS.iter().enumerate() {
        v.push(Normal {
            path: "/v1/completions",
            body: json!({"prompt": p, "max_tokens": MAX_TOKENS, "temperature": 0}),
        });
        v.push(Normal {
            path: "/v1/chat/completions",
            body: json!({"messages": [{"role": "user", "content": p}],
                         "max_tokens": MAX_TOKENS, "temperature": 0,
                         "prompt_cache_key": format!("soak-{i}")}),
        });
    }
    v
}

/// The text of an answer, whole or streamed; `(status, text, drafted)`.
async fn ask(
    client: &reqwest::Client,
    base: &str,
    n: &Normal,
    stream: bool,
    speculation: &Value,
) -> Result<(u16, String, u64)> {
    let mut body = n.body.clone();
    body["speculation"] = speculation.clone();
    body["stream"] = json!(stream);
    let r = client
        .post(format!("{base}{}", n.path))
        .bearer_auth(KEY)
        .json(&body)
        .send()
        .await?;
    let status = r.status().as_u16();
    if status != 200 {
        return Ok((status, r.text().await.unwrap_or_default(), 0));
    }
    let piece = |v: &Value| -> String {
        v.pointer("/choices/0/text")
            .or_else(|| v.pointer("/choices/0/message/content"))
            .or_else(|| v.pointer("/choices/0/delta/content"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let drafted = |v: &Value| v.pointer("/speculation/drafted").and_then(Value::as_u64);
    if !stream {
        let v: Value = r.json().await?;
        return Ok((200, piece(&v), drafted(&v).unwrap_or(0)));
    }
    let (mut text, mut d, mut buf) = (String::new(), 0u64, Vec::new());
    let mut s = r.bytes_stream();
    while let Some(chunk) = s.next().await {
        buf.extend_from_slice(&chunk?);
        while let Some(nl) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=nl).collect();
            let line = String::from_utf8_lossy(&line);
            let Some(data) = line.trim().strip_prefix("data:") else {
                continue;
            };
            let Ok(v) = serde_json::from_str::<Value>(data.trim()) else {
                continue;
            };
            if v.get("error").is_some() {
                bail!("stream ended on an error: {v}");
            }
            text.push_str(&piece(&v));
            d = drafted(&v).unwrap_or(d);
        }
    }
    Ok((200, text, d))
}

#[derive(Default)]
struct Tally {
    /// `kind/outcome` -> count.
    counts: BTreeMap<String, u64>,
    normal_latency_s: Vec<f64>,
    normal_ok: u64,
    /// 200s of the malformed client's constrained requests.
    constrained_ok: u64,
    /// Draft tokens the reports of every 200 say.
    drafted: u64,
    mismatches: Vec<String>,
    /// Answers a client did not expect (a 5xx from a malformed request, a transport error on
    /// a normal one).
    unexpected: Vec<String>,
    /// Requests the abandoning client hung up on before their answer.
    abandoned: u64,
}

impl Tally {
    fn count(&mut self, key: impl Into<String>) {
        *self.counts.entry(key.into()).or_default() += 1;
    }
}

type Shared = Arc<Mutex<Tally>>;

fn tally(t: &Shared) -> std::sync::MutexGuard<'_, Tally> {
    t.lock().unwrap_or_else(|p| p.into_inner())
}

async fn normal_client(
    w: usize,
    base: String,
    refs: Arc<Vec<(Normal, String)>>,
    until: Instant,
    t: Shared,
) {
    let client = reqwest::Client::new();
    let specs = [
        json!(false),
        json!({"mode": "native_mtp", "num_draft_tokens": 3}),
        json!({"mode": "native_mtp", "num_draft_tokens": "auto"}),
    ];
    let mut i = w * 7;
    while Instant::now() < until {
        let (n, want) = &refs[i % refs.len()];
        let stream = i.is_multiple_of(2);
        let spec = &specs[(i / 2) % specs.len()];
        i += 1;
        let t0 = Instant::now();
        match ask(&client, &base, n, stream, spec).await {
            Ok((200, text, drafted)) => {
                let mut g = tally(&t);
                g.count("normal/200");
                g.normal_ok += 1;
                g.drafted += drafted;
                g.normal_latency_s.push(t0.elapsed().as_secs_f64());
                if &text != want {
                    g.mismatches.push(format!(
                        "{} stream={stream} spec={spec}: got {text:?}, alone {want:?}",
                        n.path
                    ));
                }
            }
            // the queue was full: the server said so, as it should
            Ok((429, _, _)) => tally(&t).count("normal/429"),
            Ok((s, body, _)) => {
                let mut g = tally(&t);
                g.count(format!("normal/{s}"));
                g.unexpected
                    .push(format!("normal request answered {s}: {body}"));
            }
            Err(e) => {
                let mut g = tally(&t);
                g.count("normal/transport-error");
                g.unexpected.push(format!("normal request failed: {e:#}"));
            }
        }
    }
}

/// One malformed request: its name, route, body, bearer key and the status it must get.
type Case = (
    &'static str,
    &'static str,
    Vec<u8>,
    Option<&'static str>,
    u16,
);

/// Requests a broken or hostile client sends, with the status each must get.
fn malformed() -> Vec<Case> {
    let chain = {
        let defs: serde_json::Map<String, Value> = (0..300)
            .map(|i| {
                let v = if i < 299 {
                    json!({"type": "object", "properties": {"x": {"$ref": format!("#/$defs/a{}", i + 1)}}, "required": ["x"]})
                } else {
                    json!({"type": "string"})
                };
                (format!("a{i}"), v)
            })
            .collect();
        json!({"$defs": defs, "$ref": "#/$defs/a0"})
    };
    let lark = {
        let mut g = String::from("start: r0\n");
        for i in 0..799 {
            g += &format!("r{i}: r{}\n", i + 1);
        }
        g + "r799: \"x\"\n"
    };
    let body = |v: Value| v.to_string().into_bytes();
    let auth = Some(KEY);
    vec![
        (
            "garbage",
            "/v1/chat/completions",
            b"{\"messages\": [".to_vec(),
            auth,
            400,
        ),
        (
            "wrong-type",
            "/v1/chat/completions",
            body(json!({"messages": "hi"})),
            auth,
            400,
        ),
        (
            "bad-speculation",
            "/v1/completions",
            body(json!({"prompt": "fn", "speculation": {"mode": "warp"}})),
            auth,
            400,
        ),
        (
            "many-stops",
            "/v1/completions",
            body(json!({"prompt": "fn", "stop": vec!["abc".repeat(100); 30_000]})),
            auth,
            400,
        ),
        (
            "ref-chain",
            "/v1/chat/completions",
            body(
                json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 8,
                     "response_format": {"type": "json_schema",
                                         "json_schema": {"name": "c", "schema": chain}}}),
            ),
            auth,
            200,
        ),
        (
            "lark-chain",
            "/v1/chat/completions",
            body(
                json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 8,
                     "response_format": {"type": "grammar", "grammar": lark}}),
            ),
            auth,
            200,
        ),
        (
            "over-context",
            "/v1/completions",
            body(json!({"prompt": "x".repeat(1 << 20)})),
            auth,
            400,
        ),
        (
            "wrong-key",
            "/v1/completions",
            body(json!({"prompt": "fn"})),
            Some("nope"),
            401,
        ),
        ("no-route", "/v1/nothing", body(json!({})), auth, 404),
        (
            "branching-tool-schema",
            "/v1/chat/completions",
            body(
                json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 8,
                "tool_choice": "required",
                "tools": [{"type": "function", "function": {"name": "f", "parameters":
                    {"type": "object", "$defs": {"a": {"anyOf": vec![json!({"$ref": "#/$defs/a"}); 8]}},
                     "properties": {"x": {"$ref": "#/$defs/a"}}}}}]}),
            ),
            auth,
            // read in microseconds now (it once took the schema walk for ever); the bundled
            // model's template has no tool-call format to force, so the answer is that 400
            400,
        ),
        (
            "schema-past-budget",
            "/v1/chat/completions",
            body(json!({"messages": [{"role": "user", "content": "x"}],
                "tools": [{"type": "function", "function": {"name": "f", "parameters":
                    {"type": "object", "properties": {"x": {"anyOf":
                        (0..5000).map(|i| json!({"const": i})).collect::<Vec<_>>()}}}}}]})),
            auth,
            400,
        ),
        (
            "huge-cache-key",
            "/v1/chat/completions",
            body(json!({"messages": [{"role": "user", "content": "x"}],
                        "prompt_cache_key": "k".repeat(1 << 20)})),
            auth,
            400,
        ),
        (
            "history-call-not-object",
            "/v1/chat/completions",
            body(json!({"messages": [{"role": "user", "content": "x"},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function",
                    "function": {"name": "f", "arguments": "[1,2]"}}]},
                {"role": "tool", "tool_call_id": "c", "content": "1"}]})),
            auth,
            400,
        ),
        (
            "logit-bias-out-of-vocabulary",
            "/v1/completions",
            body(json!({"prompt": "fn", "logit_bias": {"999999999": 1}})),
            auth,
            400,
        ),
        (
            "best-of",
            "/v1/completions",
            body(json!({"prompt": "fn", "best_of": 3})),
            auth,
            400,
        ),
        (
            "repeated-key",
            "/v1/completions",
            br#"{"prompt": "fn", "prompt": "other"}"#.to_vec(),
            auth,
            400,
        ),
        (
            "prompt-past-byte-cap",
            "/v1/completions",
            body(json!({"prompt": "x".repeat(5 << 20)})),
            auth,
            413,
        ),
    ]
}

/// Starts long generations (the end token banned) and hangs up within a second: whole or
/// streamed, at every stage (queued, prefill, decode). Counts the requests it abandoned.
async fn abandoning_client(base: String, until: Instant, t: Shared) {
    let mut round = 0u64;
    while Instant::now() < until {
        round += 1;
        let wait = Duration::from_millis(100 + (round * 137) % 900);
        let client = match reqwest::Client::builder().timeout(wait).build() {
            Ok(c) => c,
            Err(_) => return,
        };
        let body = json!({"prompt": PROMPTS[round as usize % PROMPTS.len()],
                          "max_tokens": 3000, "logit_bias": {"0": -100},
                          "stream": round.is_multiple_of(2)});
        let r = async {
            let resp = client
                .post(format!("{base}/v1/completions"))
                .bearer_auth(KEY)
                .json(&body)
                .send()
                .await?;
            let status = resp.status().as_u16();
            resp.bytes().await?;
            Ok::<u16, reqwest::Error>(status)
        }
        .await;
        let mut g = tally(&t);
        match r {
            Ok(s) => g.count(format!("abandon/finished-{s}")),
            Err(e) if e.is_timeout() => {
                g.count("abandon/hung-up");
                g.abandoned += 1;
            }
            Err(_) => g.count("abandon/transport-error"),
        }
    }
}

async fn malformed_client(base: String, until: Instant, t: Shared) {
    let client = reqwest::Client::new();
    let cases = malformed();
    let mut i = 0;
    while Instant::now() < until {
        let (name, path, body, key, want) = &cases[i % cases.len()];
        i += 1;
        let mut r = client
            .post(format!("{base}{path}"))
            .header("content-type", "application/json")
            .body(body.clone());
        if let Some(k) = key {
            r = r.bearer_auth(k);
        }
        match r.send().await {
            Ok(resp) => {
                let s = resp.status().as_u16();
                let body: Value = resp.json().await.unwrap_or(Value::Null);
                let mut g = tally(&t);
                g.count(format!("malformed/{name}/{s}"));
                if s == 200 {
                    g.constrained_ok += 1;
                    g.drafted += body
                        .pointer("/speculation/drafted")
                        .and_then(Value::as_u64)
                        .unwrap_or(0);
                }
                if s != *want && s != 429 {
                    g.unexpected
                        .push(format!("malformed `{name}` answered {s}, expected {want}"));
                }
            }
            Err(e) => {
                let mut g = tally(&t);
                g.count(format!("malformed/{name}/transport-error"));
                g.unexpected
                    .push(format!("malformed `{name}` failed: {e:#}"));
            }
        }
    }
}

async fn slow_client(addr: String, until: Instant, t: Shared) {
    let mut round = 0usize;
    while Instant::now() < until {
        round += 1;
        match round % 4 {
            // a header never finished: the server must close it (header timeout)
            0 => {
                let r = async {
                    let mut s = tokio::net::TcpStream::connect(&addr).await?;
                    s.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
                        .await?;
                    let mut buf = [0u8; 64];
                    tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf)).await??;
                    Ok::<(), anyhow::Error>(())
                }
                .await;
                tally(&t).count(format!("slow/half-header/{}", outcome(&r)));
            }
            // a body never finished: 408 (body timeout)
            1 => {
                let r = async {
                    let mut s = tokio::net::TcpStream::connect(&addr).await?;
                    s.write_all(
                        format!(
                            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nauthorization: Bearer \
                             {KEY}\r\ncontent-length: 200\r\n\r\n{{\"prompt\""
                        )
                        .as_bytes(),
                    )
                    .await?;
                    let mut buf = [0u8; 64];
                    let n =
                        tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf)).await??;
                    if !buf[..n].starts_with(b"HTTP/1.1 408") {
                        bail!("got {:?}", String::from_utf8_lossy(&buf[..n]));
                    }
                    Ok(())
                }
                .await;
                tally(&t).count(format!("slow/half-body/{}", outcome(&r)));
            }
            // a burst of idle connections past the cap (64), held a while: the idle ones
            // give way to new ones, nobody is locked out
            2 => {
                let mut held = Vec::new();
                for _ in 0..80 {
                    if let Ok(s) = tokio::net::TcpStream::connect(&addr).await {
                        held.push(s);
                    }
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
                tally(&t).count(format!("slow/idle-burst-{}", held.len()));
            }
            // a stream never read, from a 2 KiB receive buffer: cut by the write timeout
            _ => {
                let r = async {
                    let sock = tokio::net::TcpSocket::new_v4()?;
                    sock.set_recv_buffer_size(2048)?;
                    let mut s = sock.connect(addr.parse()?).await?;
                    let body = json!({"prompt": "fn main() {", "max_tokens": 4000,
                        "stream": true, "logit_bias": {"0": -100}})
                    .to_string();
                    s.write_all(
                        format!(
                            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nauthorization: Bearer \
                             {KEY}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
                             \r\n{body}",
                            body.len()
                        )
                        .as_bytes(),
                    )
                    .await?;
                    tokio::time::sleep(Duration::from_secs(4)).await;
                    Ok::<(), anyhow::Error>(())
                }
                .await;
                tally(&t).count(format!("slow/stalled-stream/{}", outcome(&r)));
            }
        }
    }
}

fn outcome<T>(r: &Result<T>) -> &'static str {
    if r.is_ok() {
        "closed-as-expected"
    } else {
        "error"
    }
}

fn pct(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[((s.len() - 1) as f64 * p).round() as usize]
}

fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find(|l| l.starts_with(&format!("{name}{{")))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

pub fn run(args: &[String]) -> Result<()> {
    if crate::print_help_if_asked(args, HELP) {
        return Ok(());
    }
    let a = parse(args)?;
    let mut srv = start(&a)?;
    let pid = srv.child.id();
    let base = srv.base.clone();
    let addr = base.trim_start_matches("http://").to_string();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    // each normal request alone, first: the answers the load must reproduce
    let refs = rt.block_on(async {
        let client = reqwest::Client::new();
        let mut refs = Vec::new();
        for n in normals() {
            let (s, text, _) = ask(&client, &base, &n, false, &json!(false)).await?;
            if s != 200 {
                bail!("solo request answered {s}: {text}");
            }
            refs.push((n, text));
        }
        Ok(refs)
    })?;
    let rss_start = rss(pid).unwrap_or(0);
    let t: Shared = Arc::default();
    let started = Instant::now();
    let until = started + Duration::from_secs_f64(a.minutes * 60.0);
    let refs = Arc::new(refs);
    let (peak, died, health_fail) = rt.block_on(async {
        let mut tasks = Vec::new();
        for w in 0..3 {
            tasks.push(tokio::spawn(normal_client(
                w,
                base.clone(),
                Arc::clone(&refs),
                until,
                Arc::clone(&t),
            )));
        }
        tasks.push(tokio::spawn(malformed_client(
            base.clone(),
            until,
            Arc::clone(&t),
        )));
        tasks.push(tokio::spawn(slow_client(
            addr.clone(),
            until,
            Arc::clone(&t),
        )));
        tasks.push(tokio::spawn(abandoning_client(
            base.clone(),
            until,
            Arc::clone(&t),
        )));
        // watch: alive, memory, /health (a failed probe is retried once: the connection cap
        // may be full of the slow clients' idle connections for a moment)
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()?;
        let (mut peak, mut died, mut health_fail) = (0u64, false, 0u64);
        let mut last_report = Instant::now();
        while Instant::now() < until {
            tokio::time::sleep(Duration::from_secs(1)).await;
            match rss(pid) {
                Some(r) => peak = peak.max(r),
                None => {
                    died = true;
                    break;
                }
            }
            let ok = client
                .get(format!("{base}/health"))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if !ok {
                health_fail += 1;
            }
            if last_report.elapsed() > Duration::from_secs(60) {
                last_report = Instant::now();
                let g = tally(&t);
                eprintln!(
                    "soak: {:.0} s, {} normal answers, {} mismatches, {} unexpected, RSS {} MiB",
                    started.elapsed().as_secs_f64(),
                    g.normal_ok,
                    g.mismatches.len(),
                    g.unexpected.len(),
                    peak >> 20
                );
            }
        }
        for task in tasks {
            let _ = task.await;
        }
        Ok::<_, anyhow::Error>((peak, died, health_fail))
    })?;
    let wall = started.elapsed().as_secs_f64();
    // what the server counted, against what the clients received
    // (the last abandoned request may still be stopping: a few seconds for the gauges)
    let metrics = rt.block_on(async {
        let settle = Instant::now() + Duration::from_secs(5);
        loop {
            let m = reqwest::get(format!("{base}/metrics"))
                .await?
                .text()
                .await
                .map_err(anyhow::Error::from)?;
            let busy =
                metric(&m, "mtp:num_requests_running") + metric(&m, "mtp:num_requests_cancelling");
            if busy == 0 || Instant::now() > settle {
                return Ok::<String, anyhow::Error>(m);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let alive_at_end = srv.child.try_wait().ok().flatten().is_none();
    let g = tally(&t);
    let mut problems: Vec<String> = Vec::new();
    if died || !alive_at_end {
        problems.push("the server died".into());
    }
    if let Ok(m) = &metrics {
        // every 200 a client received is one success (the solo runs before the load too),
        // and the draft counters are the sum of those answers' reports
        // (an abandoned request may have ended on the server as its client gave up)
        let received = g.normal_ok + g.constrained_ok + refs.len() as u64;
        let ok = metric(m, "mtp:request_success_total");
        if ok < received || ok > received + g.abandoned {
            problems.push(format!(
                "mtp:request_success_total is {ok}, the clients received {received} answers \
                 and abandoned {}",
                g.abandoned
            ));
        }
        let drafted = metric(m, "mtp:spec_decode_num_draft_tokens_total");
        if drafted < g.drafted {
            problems.push(format!(
                "mtp:spec_decode_num_draft_tokens_total is {drafted}, the answers' reports add \
                 up to {}",
                g.drafted
            ));
        }
        // every stalled stream was cut (write timeout or its client leaving), none finished
        let stalled = g
            .counts
            .get("slow/stalled-stream/closed-as-expected")
            .copied()
            .unwrap_or(0);
        let cancelled = metric(m, "mtp:request_cancelled_total");
        if cancelled < stalled || cancelled > stalled + g.abandoned {
            problems.push(format!(
                "mtp:request_cancelled_total is {cancelled}, {stalled} streams were left unread \
                 and {} requests abandoned",
                g.abandoned
            ));
        }
        // the abandoned work has stopped: nothing runs, nothing is still stopping
        for gauge in ["mtp:num_requests_running", "mtp:num_requests_cancelling"] {
            let n = metric(m, gauge);
            if n != 0 {
                problems.push(format!("{gauge} is {n} after the load"));
            }
        }
    } else {
        problems.push("/metrics did not answer at the end".into());
    }
    // memory: the prefix cache (512 MiB budget) and the forward's buffers may grow after the
    // start, nothing else should
    let bound = rss_start + (1u64 << 30);
    if peak > bound {
        problems.push(format!(
            "peak RSS {} MiB over the bound {} MiB",
            peak >> 20,
            bound >> 20
        ));
    }
    if !g.mismatches.is_empty() {
        problems.push(format!(
            "{} answers differ from their solo run",
            g.mismatches.len()
        ));
    }
    if !g.unexpected.is_empty() {
        problems.push(format!("{} unexpected answers", g.unexpected.len()));
    }
    // shutdown: SIGTERM, exit within the grace period
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let t0 = Instant::now();
    let mut exited = false;
    // the grace (10 s) and a moment to exit
    while t0.elapsed() < Duration::from_secs(11) {
        if let Ok(Some(_)) = srv.child.try_wait() {
            exited = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if !exited {
        problems.push("the server did not exit within 11 s of SIGTERM (grace 10 s)".into());
    }
    let summary = json!({
        "minutes": a.minutes,
        "wall_s": wall,
        "max_batch": a.max_batch,
        "requests": g.counts,
        "normal_answers": g.normal_ok,
        "normal_latency_p50_s": pct(&g.normal_latency_s, 0.5),
        "normal_latency_p99_s": pct(&g.normal_latency_s, 0.99),
        "rss_start_mib": rss_start >> 20,
        "rss_peak_mib": peak >> 20,
        "health_probes_failed": health_fail,
        "abandoned": g.abandoned,
        "mismatches": g.mismatches.iter().take(10).collect::<Vec<_>>(),
        "unexpected": g.unexpected.iter().take(20).collect::<Vec<_>>(),
        "exit_after_sigterm_s": t0.elapsed().as_secs_f64(),
        "problems": problems,
    });
    std::fs::create_dir_all(&a.out)?;
    let path = a.out.join("soak.json");
    std::fs::write(&path, serde_json::to_string_pretty(&summary)?)?;
    println!(
        "soak: {:.1} min on {}, --max-batch {}",
        wall / 60.0,
        a.model.display(),
        a.max_batch
    );
    println!("{:<48} {:>8}", "requests (kind/outcome)", "count");
    for (k, v) in &g.counts {
        println!("{k:<48} {v:>8}");
    }
    println!(
        "normal answers {} (identical to solo: {}), latency p50 {:.3} s, p99 {:.3} s",
        g.normal_ok,
        g.normal_ok as usize - g.mismatches.len().min(g.normal_ok as usize),
        pct(&g.normal_latency_s, 0.5),
        pct(&g.normal_latency_s, 0.99)
    );
    println!(
        "RSS {} MiB after the solo runs, peak {} MiB; /health probes failed: {health_fail}; \
         exit {:.2} s after SIGTERM",
        rss_start >> 20,
        peak >> 20,
        t0.elapsed().as_secs_f64()
    );
    println!("written to {}", path.display());
    if !problems.is_empty() {
        for p in &problems {
            eprintln!("soak: {p}");
        }
        for m in g.mismatches.iter().chain(&g.unexpected).take(10) {
            eprintln!("  {m}");
        }
        bail!("the soak found {} problem(s)", problems.len());
    }
    Ok(())
}
