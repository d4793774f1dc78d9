//! Bounded input: whatever a server sends, the adapters hold at most `max_body_bytes` of a
//! body and `max_sse_event_bytes` of one streamed line or event, and going over either is a
//! typed error that names the URL, the cap and the option.
//!
//! The servers here are the local mock of `tests/common` with lazily made bodies (one 1 MiB
//! buffer served again and again), so a "1 GiB line" or an "endless body" costs the test
//! server nothing. The two tests at the default caps measure the process's peak resident
//! memory (`VmHWM`, reset through `/proc/self/clear_refs` where the kernel allows) and print
//! it with the time taken (`cargo test --test bounded_input -- --nocapture`). They run one
//! at a time so each peak is its own. This file is its own test binary, so no other test
//! shares the peak.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{collect, fixture, Mock, Reply};
use mtp_contract::{GenerateRequest, Provider, ProviderError, ProviderOptions, Speculation};

const MIB: usize = 1 << 20;

/// The heavy tests run one at a time, so each one's memory peak is its own.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn opts(base: &str) -> ProviderOptions {
    ProviderOptions::default()
        .base_url(base)
        .extra("idle_timeout_ms", "5000")
        .extra("request_timeout_ms", "5000")
        .extra("connect_timeout_ms", "500")
}

fn provider(kind: &str, o: &ProviderOptions) -> Arc<dyn Provider> {
    mtp_runtimes::create(kind, "m", o).expect("create")
}

fn req() -> GenerateRequest {
    GenerateRequest::new("Write fib in Python.").max_output_tokens(64)
}

/// A chunk of `n` bytes of `b'a'`.
fn filler(n: usize) -> Vec<u8> {
    vec![b'a'; n]
}

/// The message of an `Api` error without an HTTP status (the answer was a 2xx), checked to
/// name every one of `needles`.
fn api_message(err: Option<ProviderError>, needles: &[&str]) -> String {
    match err {
        Some(ProviderError::Api {
            status: None,
            message,
            ..
        }) => {
            for n in needles {
                assert!(message.contains(n), "missing {n:?} in: {message}");
            }
            message
        }
        other => panic!("expected an Api error naming {needles:?}, got {other:?}"),
    }
}

/// A `/proc/self/status` field in KiB (Linux), e.g. `VmHWM`.
fn status_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status
        .lines()
        .find(|l| l.starts_with(field) && l[field.len()..].starts_with(':'))?;
    line[field.len() + 1..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// The peak resident memory of this process from now on.
struct Peak {
    started: Instant,
    base_kib: Option<u64>,
}

impl Peak {
    fn start() -> Peak {
        // "5" resets the peak to the current resident size (Linux 4.0+); where that is not
        // allowed, the growth measured is the growth over the peak so far
        let _ = std::fs::write("/proc/self/clear_refs", "5");
        Peak {
            started: Instant::now(),
            base_kib: status_kib("VmHWM"),
        }
    }

    /// Prints the time taken and the peak's growth, and checks that it stayed under
    /// `limit_mib` (where `/proc` can tell).
    fn check(self, what: &str, limit_mib: u64) {
        let elapsed = self.started.elapsed();
        let growth_mib = match (self.base_kib, status_kib("VmHWM")) {
            (Some(before), Some(after)) => Some(after.saturating_sub(before) / 1024),
            _ => None,
        };
        eprintln!(
            "{what}: {:.2} s, peak resident memory grew by {}",
            elapsed.as_secs_f64(),
            growth_mib.map_or("(unknown: no /proc)".into(), |m| format!("{m} MiB"))
        );
        if let Some(m) = growth_mib {
            assert!(m < limit_mib, "{what}: peak grew by {m} MiB");
        }
    }
}

#[tokio::test]
async fn an_unterminated_sse_line_of_a_gibibyte_stops_at_the_default_cap() {
    let _serial = SERIAL.lock().await;
    // `data: ` then 1 GiB without a line end, made lazily from one 1 MiB chunk
    let m = Mock::start(vec![(
        "POST /v1/chat/completions",
        vec![Reply::endless(
            200,
            "text/event-stream",
            b"data: ",
            filler(MIB),
            Some(1024),
        )],
    )])
    .await;
    let p = provider("llama-server", &opts(&m.base));
    let peak = Peak::start();
    let (text, done, err) = collect(&p, req()).await;
    let url = format!("{}/v1/chat/completions", m.base);
    api_message(err, &[&url, "16 MiB", "max_sse_event_bytes"]);
    assert!(text.is_empty() && done.is_none());
    // the default cap is 16 MiB: the peak grows by about that, nowhere near 1 GiB
    peak.check("SSE line of 1 GiB, default cap", 200);
}

#[tokio::test]
async fn an_endless_json_body_stops_at_the_default_cap() {
    let _serial = SERIAL.lock().await;
    let m = Mock::start(vec![(
        "POST /v1/chat/completions",
        vec![Reply::endless(
            200,
            "application/json",
            b"{\"choices\":[{\"message\":{\"content\":\"",
            filler(MIB),
            None,
        )],
    )])
    .await;
    let p = provider("vllm", &opts(&m.base).extra("metrics", "off"));
    let peak = Peak::start();
    let err = p.generate(req()).await.err();
    let url = format!("{}/v1/chat/completions", m.base);
    api_message(err, &[&url, "64 MiB", "max_body_bytes", "goes on past it"]);
    // the default cap is 64 MiB
    peak.check("endless JSON body, default cap", 300);
}

#[tokio::test]
async fn smaller_caps_from_the_options_apply_to_every_body() {
    let _serial = SERIAL.lock().await;
    let small = |base: &str| {
        opts(base)
            .extra("max_body_bytes", "65536")
            .extra("max_sse_event_bytes", "4096")
    };
    let endless = |ct: &'static str, head: &[u8]| Reply::endless(200, ct, head, filler(MIB), None);
    let peak = Peak::start();

    // one event whose data lines never stop
    let m = Mock::start(vec![(
        "POST /v1/chat/completions",
        vec![Reply::endless(
            200,
            "text/event-stream",
            b"",
            b"data: {\"choices\":[]}\n".to_vec(),
            None,
        )],
    )])
    .await;
    let (_, done, err) = collect(&provider("openai-compatible", &small(&m.base)), req()).await;
    api_message(err, &["4 KiB", "max_sse_event_bytes"]);
    assert!(done.is_none());

    // well-formed events whose reply never ends: the deltas come, then the error
    let delta = b"data: {\"choices\":[{\"delta\":{\"content\":\"aaaaaaaaaaaaaaaa\"}}]}\n\n";
    let m = Mock::start(vec![(
        "POST /v1/chat/completions",
        vec![Reply::endless(
            200,
            "text/event-stream",
            b"",
            delta.to_vec(),
            None,
        )],
    )])
    .await;
    let (text, done, err) = collect(&provider("ollama", &small(&m.base)), req()).await;
    api_message(
        err,
        &["reply streamed from", "64 KiB", "max_body_bytes", &m.base],
    );
    assert!(done.is_none());
    assert!(text.len() > 60_000 && text.len() <= 65536, "{}", text.len());

    // a one-piece JSON answer to a stream request
    let m = Mock::start(vec![(
        "POST /api/v0/chat/completions",
        vec![endless("application/json", b"{\"choices\":[")],
    )])
    .await;
    let p = provider("lmstudio", &small(&m.base));
    let err = p.generate_stream(req()).await.err();
    api_message(
        err,
        &["/api/v0/chat/completions", "64 KiB", "max_body_bytes"],
    );

    // `/props` (read when speculation is asked for), then `/slots` (read when `/props` shows
    // no MTP lane), then `/metrics`; `props_none.json` is a transcribed fixture (shape from llama.cpp's
    // source, not recorded from a server), used only to get past `/props` to `/slots`
    let native = small("").speculation(Speculation::native_mtp());
    let m = Mock::start(vec![(
        "GET /props",
        vec![endless("application/json", b"{")],
    )])
    .await;
    let p = provider("llama-server", &native.clone().base_url(&m.base));
    api_message(
        p.generate(req()).await.err(),
        &[&format!("{}/props", m.base), "max_body_bytes"],
    );
    let m = Mock::start(vec![
        (
            "GET /props",
            vec![Reply::json("llama_server/props_none.json")],
        ),
        ("GET /slots", vec![endless("application/json", b"[")]),
    ])
    .await;
    let p = provider("llama-server", &native.clone().base_url(&m.base));
    api_message(
        p.generate(req()).await.err(),
        &[&format!("{}/slots", m.base), "max_body_bytes"],
    );
    let m = Mock::start(vec![(
        "GET /metrics",
        vec![endless("text/plain; version=0.0.4", b"# HELP ")],
    )])
    .await;
    let p = provider("vllm", &small(&m.base));
    api_message(
        p.generate(req()).await.err(),
        &[
            &format!("{}/metrics", m.base),
            "max_body_bytes",
            "`metrics` to off",
        ],
    );
    peak.check("small caps, six endless bodies", 64);
}

#[tokio::test]
async fn a_body_announced_over_the_cap_is_refused_and_one_at_the_cap_is_read() {
    let body = fixture("llama_server/recorded_b11434/chat.json");
    let m = Mock::start(vec![(
        "POST /v1/chat/completions",
        vec![Reply::status(200, "application/json", &body)],
    )])
    .await;
    let at = |cap: usize| {
        provider(
            "llama-server",
            &opts(&m.base).extra("max_body_bytes", cap.to_string()),
        )
    };
    let r = at(body.len())
        .generate(req())
        .await
        .expect("a body of exactly the cap");
    assert!(!r.content.is_empty());
    // axum sends a Content-Length for a whole body: refused before reading it
    let err = at(body.len() - 1).generate(req()).await.err();
    api_message(
        err,
        &[&format!("announces {} bytes", body.len()), "max_body_bytes"],
    );
}

#[tokio::test]
async fn an_endless_error_body_still_gives_the_status_and_the_servers_first_words() {
    let m = Mock::start(vec![(
        "POST /v1/chat/completions",
        vec![Reply::endless(
            500,
            "text/plain",
            b"out of memory: ",
            filler(MIB),
            None,
        )],
    )])
    .await;
    let t = Instant::now();
    match provider("llama-server", &opts(&m.base))
        .generate(req())
        .await
    {
        Err(ProviderError::Api {
            status: Some(500),
            message,
            ..
        }) => assert!(message.contains("out of memory: aaaa"), "{message}"),
        other => panic!("{other:?}"),
    }
    // only the first MiB is read
    assert!(t.elapsed() < Duration::from_secs(5));
}
