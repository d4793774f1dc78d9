//! End to end against a real `llama-server` b11434 (issue 7).
//!
//! The tiny trained checkpoint of `tests/fixtures/tiny-trained` (and the bundled demo model
//! `models/tiny-code` when it has a tokenizer) is converted to a `qwen35` GGUF with its NextN head at test
//! time, by the converter behind `cargo xtask gguf` (included below by path). llama-server runs
//! twice on a free loopback port, without and with `--spec-type draft-mtp --spec-draft-n-max 3`,
//! and the `llama-server` adapter drives both:
//!
//! - greedy text is identical between the two runs and equals the reference (mlx-vlm) greedy
//!   tokens of `golden.json`;
//! - with MTP the report says `used`, with the server's drafted/accepted counts; without it,
//!   `server_side`.
//!
//! `cargo xtask test` builds the server once (cached outside the clone), sets
//! `MTP_LLAMA_SERVER` and runs this test; a plain `cargo test` ignores it (it never passes
//! without running), and run by hand without the variable it fails saying so. With `MTP_RECORD_FIXTURES=1` the run also writes the real
//! `/props`, `/completion` and `/v1/chat/completions` bodies under
//! `tests/fixtures/llama_server/recorded_b11434/`.

#[path = "../../../xtask/src/gguf/convert.rs"]
#[allow(dead_code)]
mod convert;

use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt;
use mtp_contract::{
    FinishReason, GenerateRequest, GenerateResponse, ProviderError, ProviderOptions, Reason,
    Sampling, Speculation, StreamEvent,
};
use serde_json::{json, Value};

const ENV_SERVER: &str = "MTP_LLAMA_SERVER";
const DRAFT_N_MAX: u32 = 3;

fn server_bin() -> PathBuf {
    let p = std::env::var_os(ENV_SERVER)
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            panic!(
                "{ENV_SERVER} is unset: this test needs llama-server b11434 \
             (`cargo xtask test` builds it and sets the variable)"
            )
        });
    assert!(p.is_file(), "{ENV_SERVER}={} is not a file", p.display());
    p
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A running llama-server, killed when dropped (also when a test panics).
struct Server {
    child: Child,
    base: String,
    log: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn log_text(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }
}

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    l.local_addr().expect("local addr").port()
}

async fn launch(bin: &Path, gguf: &Path, mtp: bool, dir: &Path) -> Server {
    let mut last_err = String::new();
    for attempt in 0..3 {
        let port = free_port();
        let log = dir.join(format!(
            "server-{}-{attempt}.log",
            if mtp { "mtp" } else { "plain" }
        ));
        let log_file = std::fs::File::create(&log).expect("log file");
        let mut cmd = Command::new(bin);
        cmd.arg("-m")
            .arg(gguf)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args([
                "-c",
                "1024",
                "-np",
                "1",
                "-t",
                "2",
                "--no-webui",
                "--no-warmup",
            ])
            .args(["--alias", "tiny-mtp"]);
        if mtp {
            cmd.args(["--spec-type", "draft-mtp", "--spec-draft-n-max"])
                .arg(DRAFT_N_MAX.to_string());
        }
        cmd.stdin(Stdio::null())
            .stdout(log_file.try_clone().expect("dup log"))
            .stderr(log_file);
        let child = cmd.spawn().expect("spawn llama-server");
        let mut server = Server {
            child,
            base: format!("http://127.0.0.1:{port}"),
            log,
        };
        let client = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Ok(Some(status)) = server.child.try_wait() {
                last_err = format!("llama-server exited ({status}):\n{}", server.log_text());
                break;
            }
            if let Ok(r) = client
                .get(format!("{}/health", server.base))
                .timeout(Duration::from_secs(2))
                .send()
                .await
            {
                if r.status().is_success() {
                    return server;
                }
            }
            if Instant::now() > deadline {
                panic!(
                    "llama-server not healthy after 120 s:\n{}",
                    server.log_text()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // A port race (another process took it) shows as an early exit: try another port.
        if !last_err.contains("bind") && !last_err.contains("address") {
            break;
        }
    }
    panic!("{last_err}");
}

fn greedy() -> Sampling {
    Sampling {
        temperature: Some(0.0),
        ..Default::default()
    }
}

fn opts(base: &str) -> ProviderOptions {
    ProviderOptions::default()
        .base_url(base)
        .speculation(Speculation::native_mtp())
        .extra("request_timeout_ms", "120000")
        .extra("idle_timeout_ms", "60000")
}

async fn complete(base: &str, prompt: &str, n: u32) -> GenerateResponse {
    let p = mtp_runtimes::create("llama-server", "tiny-mtp", &opts(base)).expect("create");
    p.generate(
        GenerateRequest::new(prompt)
            .raw()
            .max_output_tokens(n)
            .sampling(greedy()),
    )
    .await
    .expect("generate")
}

async fn stream(base: &str, prompt: &str, n: u32) -> (String, GenerateResponse) {
    let p = mtp_runtimes::create("llama-server", "tiny-mtp", &opts(base)).expect("create");
    let mut s = p
        .generate_stream(
            GenerateRequest::new(prompt)
                .raw()
                .max_output_tokens(n)
                .sampling(greedy()),
        )
        .await
        .expect("stream");
    let mut text = String::new();
    let mut done = None;
    let mut progress = Vec::new();
    while let Some(ev) = s.next().await {
        match ev.expect("stream event") {
            StreamEvent::Delta { text: t, .. } => text.push_str(&t),
            StreamEvent::ToolCall(d) => panic!("no tools were offered: {d:?}"),
            StreamEvent::PromptProgress(p) => {
                assert!(
                    text.is_empty(),
                    "prompt progress after the reply began: {p:?}"
                );
                progress.push(p);
            }
            StreamEvent::Done(r) => done = Some(*r),
        }
    }
    let done = done.expect("a Done event");
    // the adapter asks for `return_progress`; llama-server's `prompt_progress` chunks come
    // through as the contract's events, counted over the whole prompt
    let total = done.usage.input_tokens as usize;
    assert!(!progress.is_empty(), "no prompt progress from llama-server");
    assert!(
        progress
            .iter()
            .all(|p| p.total == total && p.cache <= p.processed && p.processed <= total),
        "{progress:?} for a {total}-token prompt"
    );
    assert!(progress
        .windows(2)
        .all(|w| w[0].processed <= w[1].processed));
    (text, done)
}

/// The checkpoints to run: the trained fixture (with reference goldens) and the bundled demo
/// model (`models/tiny-code`) once it ships its tokenizer.
fn checkpoints() -> Vec<(String, PathBuf)> {
    let mut v = vec![(
        "tiny-trained".to_string(),
        workspace().join("tests/fixtures/tiny-trained"),
    )];
    for name in ["tiny-code", "tiny-mtp"] {
        let demo = workspace().join("models").join(name);
        if demo.join("config.json").is_file() && demo.join("tokenizer.json").is_file() {
            v.push((name.to_string(), demo));
        }
    }
    v
}

fn golden(dir: &Path) -> Option<Value> {
    let text = std::fs::read_to_string(dir.join("golden.json")).ok()?;
    serde_json::from_str(&text).ok()
}

/// The byte-level fixture tokenizer maps token id `b` (1..=255) to byte `b`.
fn bytes_text(ids: &[Value]) -> String {
    let bytes: Vec<u8> = ids
        .iter()
        .filter_map(|v| v.as_u64())
        .filter_map(|v| u8::try_from(v).ok())
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// A request for `n` greedy tokens of `prompt` that refuses to run unaccelerated.
fn strict(prompt: &str, n: u32) -> GenerateRequest {
    GenerateRequest::new(prompt)
        .raw()
        .max_output_tokens(n)
        .sampling(greedy())
        .speculation(Speculation::native_mtp().with_require_acceleration(true))
}

// The name holds `llama_cpp_src`: `cargo xtask test` runs the ignored tests that need the
// llama.cpp build by that filter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs llama-server b11434 (MTP_LLAMA_SERVER); cargo xtask test builds it and runs this"]
async fn llama_cpp_src_real_llama_server_with_and_without_mtp() {
    let bin = server_bin();
    let tmp = tempfile::tempdir().expect("tempdir");
    for (name, dir) in checkpoints() {
        let gguf = tmp.path().join(format!("{name}.gguf"));
        let started = Instant::now();
        let summary = convert::convert(&dir, &gguf, &convert::ConvertOptions::default())
            .unwrap_or_else(|e| panic!("converting {}: {e}", dir.display()));
        eprintln!(
            "{name}: converted in {:.2}s: {summary:?}",
            started.elapsed().as_secs_f64()
        );
        assert!(summary.nextn_layers >= 1, "{name}: no NextN layer written");

        let gold = golden(&dir);
        let prompts: Vec<String> = match &gold {
            Some(g) => g["prompts"]
                .as_array()
                .expect("prompts")
                .iter()
                .filter_map(|p| p.as_str().map(str::to_string))
                .collect(),
            None => vec!["the quick brown fox ".to_string()],
        };
        let n = 64;

        // Without MTP.
        let plain = launch(&bin, &gguf, false, tmp.path()).await;
        let mut off = Vec::new();
        for p in &prompts {
            let r = complete(&plain.base, p, n).await;
            assert!(!r.metadata.speculation.used, "{name}: plain server drafted");
            assert_eq!(r.metadata.speculation.reason, Some(Reason::ServerSide));
            // the server's own counts: every prompt token, none more from the cache
            let u = r.usage;
            assert!(
                u.input_tokens > 0 && u.cached_input_tokens <= u.input_tokens,
                "{u:?}"
            );
            assert_eq!(u.output_tokens, u64::from(n));
            off.push(r);
        }
        // the same prompt twice in a row: the second time the slot's cache serves part of the
        // prompt (a hybrid model resumes at a recurrent-state checkpoint), and the usage says
        // so: never the whole cache's length, which counts the reply too
        let _ = complete(&plain.base, &prompts[0], n).await;
        let again = complete(&plain.base, &prompts[0], n).await;
        let u = again.usage;
        assert_eq!(u.input_tokens, off[0].usage.input_tokens);
        assert!(
            u.cached_input_tokens > 0 && u.cached_input_tokens < u.input_tokens,
            "{u:?}"
        );
        // no drafter: --require-acceleration refuses before generating
        let p =
            mtp_runtimes::create("llama-server", "tiny-mtp", &opts(&plain.base)).expect("create");
        match p.generate(strict(&prompts[0], 4)).await {
            Err(ProviderError::SpeculationUnavailable { message, .. }) => {
                assert!(message.contains("/slots speculative = false"), "{message}")
            }
            other => panic!("{name}: a plain server passed require_acceleration: {other:?}"),
        }
        drop(plain);

        // With MTP.
        let mtp = launch(&bin, &gguf, true, tmp.path()).await;
        for (i, p) in prompts.iter().enumerate() {
            let r = complete(&mtp.base, p, n).await;
            let s = &r.metadata.speculation;
            assert_eq!(
                r.content, off[i].content,
                "{name}: greedy text differs with MTP for prompt {p:?}"
            );
            assert!(s.used, "{name}: MTP server did not draft: {s:?}");
            let drafted = s.drafted.expect("drafted count");
            let accepted = s.accepted.expect("accepted count");
            assert!(drafted > 0 && accepted <= drafted, "{name}: {s:?}");
            eprintln!(
                "{name}: prompt {i}: drafted {drafted}, accepted {accepted}, text {:?}",
                r.content
            );
            if let Some(g) = &gold {
                let want = bytes_text(g["off"][i].as_array().expect("golden off"));
                assert_eq!(
                    r.content, want,
                    "{name}: llama.cpp greedy differs from the reference for prompt {p:?}"
                );
                // A trained head is accepted most of the time (the reference: ~0.85).
                assert!(accepted * 2 > drafted, "{name}: low acceptance {s:?}");
            }
            assert_eq!(r.finish_reason, FinishReason::Length);
            assert_eq!(r.usage.output_tokens, u64::from(n));
        }

        // A drafting server passes --require-acceleration: b11434's /props says
        // `speculative.types = none` on every server, its /slots shows the drafter.
        let p = mtp_runtimes::create("llama-server", "tiny-mtp", &opts(&mtp.base)).expect("create");
        let r = p
            .generate(strict(&prompts[0], n))
            .await
            .unwrap_or_else(|e| {
                panic!("{name}: require_acceleration refused a drafting server: {e}")
            });
        assert!(r.metadata.speculation.used, "{name}");
        assert_eq!(r.content, off[0].content);
        assert!(
            p.speculation_status().lane_loaded,
            "{name}: {:?}",
            p.speculation_status()
        );

        // Streaming reports the same text and counts from the final chunk.
        let (text, done) = stream(&mtp.base, &prompts[0], n).await;
        assert_eq!(text, off[0].content, "{name}: streamed text differs");
        assert!(done.metadata.speculation.used, "{name}: stream report");
        assert!(done.metadata.speculation.drafted.unwrap_or(0) > 0);

        // A per-request depth of 0 (speculation pinned off for this call).
        let p = mtp_runtimes::create("llama-server", "tiny-mtp", &opts(&mtp.base)).expect("create");
        let r = p
            .generate(
                GenerateRequest::new(prompts[0].as_str())
                    .raw()
                    .max_output_tokens(n)
                    .sampling(greedy())
                    .speculation(false),
            )
            .await
            .expect("generate with speculation off");
        assert_eq!(r.content, off[0].content);
        eprintln!(
            "{name}: per-request speculation=false on an MTP server: used={} drafted={:?} reason={:?}",
            r.metadata.speculation.used, r.metadata.speculation.drafted, r.metadata.speculation.reason
        );

        // A JSON Schema travels as llama-server's `json_schema` and the reply follows it.
        let schema = serde_json::json!({"type": "object", "properties": {
            "n": {"type": "integer", "minimum": 0, "maximum": 99}},
            "required": ["n"], "additionalProperties": false});
        let r = p
            .generate(
                GenerateRequest::new(prompts[0].as_str())
                    .raw()
                    .max_output_tokens(32)
                    .sampling(greedy())
                    .response_format(mtp_contract::ResponseFormat::json_schema(schema)),
            )
            .await
            .expect("generate with a json_schema");
        let v: Value = serde_json::from_str(&r.content)
            .unwrap_or_else(|e| panic!("{name}: {:?} is not JSON: {e}", r.content));
        let n = v["n"].as_u64().unwrap_or_else(|| panic!("{name}: {v}"));
        assert!(
            n <= 99 && v.as_object().is_some_and(|o| o.len() == 1),
            "{name}: {v}"
        );
        assert!(r.warnings.is_empty(), "{name}: {:?}", r.warnings);

        // An image travels as an OpenAI `image_url` part, which llama-server reads; this one
        // runs without a vision projector and says so, and the error reaches the caller.
        let err = p
            .generate(
                GenerateRequest::new("what is in the picture?")
                    .image("data:image/png;base64,iVBORw0KGgo=")
                    .max_output_tokens(4)
                    .sampling(greedy()),
            )
            .await
            .expect_err("a server without an mmproj refuses images");
        assert!(err.to_string().contains("mmproj"), "{name}: {err}");

        if std::env::var_os("MTP_RECORD_FIXTURES").is_some() && name == "tiny-trained" {
            record(&mtp.base, &prompts[0]).await;
        }
        drop(mtp);
    }
}

/// Writes the real response bodies of b11434 next to the transcribed fixtures.
async fn record(base: &str, prompt: &str) {
    let out =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/llama_server/recorded_b11434");
    std::fs::create_dir_all(&out).expect("fixture dir");
    let c = reqwest::Client::new();
    let get = |path: &str| c.get(format!("{base}{path}")).send();
    let props = get("/props")
        .await
        .expect("/props")
        .text()
        .await
        .expect("body");
    std::fs::write(out.join("props_mtp.json"), pretty(&props)).expect("write");
    let body = json!({"prompt": prompt, "n_predict": 16, "temperature": 0.0});
    let r = c
        .post(format!("{base}/completion"))
        .json(&body)
        .send()
        .await
        .expect("/completion")
        .text()
        .await
        .expect("body");
    std::fs::write(out.join("completion_native.json"), pretty(&r)).expect("write");
    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let r = c
        .post(format!("{base}/completion"))
        .json(&sbody)
        .send()
        .await
        .expect("/completion stream")
        .text()
        .await
        .expect("body");
    std::fs::write(out.join("completion_native_stream.sse"), r).expect("write");
    let chat = json!({"model": "tiny-mtp", "messages": [{"role": "user", "content": prompt}], "max_tokens": 16, "temperature": 0.0});
    let r = c
        .post(format!("{base}/v1/chat/completions"))
        .json(&chat)
        .send()
        .await
        .expect("chat")
        .text()
        .await
        .expect("body");
    std::fs::write(out.join("chat.json"), pretty(&r)).expect("write");
    let mut schat = chat.clone();
    schat["stream"] = json!(true);
    schat["stream_options"] = json!({"include_usage": true});
    let r = c
        .post(format!("{base}/v1/chat/completions"))
        .json(&schat)
        .send()
        .await
        .expect("chat stream")
        .text()
        .await
        .expect("body");
    std::fs::write(out.join("chat_stream.sse"), r).expect("write");
}

fn pretty(text: &str) -> String {
    match serde_json::from_str::<Value>(text) {
        Ok(v) => serde_json::to_string_pretty(&v).unwrap_or_else(|_| text.to_string()) + "\n",
        Err(_) => text.to_string(),
    }
}
