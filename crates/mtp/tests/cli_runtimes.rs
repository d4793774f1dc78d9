//! The real binary against a shipped HTTP runtime: `--provider llama-server --base-url` with a
//! local stand-in server that replays the response shapes recorded for `mtp-runtimes`'
//! contract tests (`crates/mtp-runtimes/tests/fixtures/llama_server`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use assert_cmd::Command;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use predicates::prelude::*;
use serde_json::Value;

fn fixture(name: &str) -> Vec<u8> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../mtp-runtimes/tests/fixtures/llama_server")
        .join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("fixture {}: {e}", p.display()))
}

#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<(HeaderMap, Value)>>>);

async fn props() -> Response {
    Response::builder()
        .header("content-type", "application/json")
        .body(Body::from(fixture("props_mtp.json")))
        .unwrap()
}

async fn chat(State(seen): State<Seen>, headers: HeaderMap, body: Bytes) -> Response {
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let stream = v["stream"] == true;
    seen.0.lock().unwrap().push((headers, v));
    let (ct, body) = if stream {
        ("text/event-stream", fixture("chat_stream.sse"))
    } else {
        ("application/json", fixture("chat.json"))
    };
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", ct)
        .body(Body::from(body))
        .unwrap()
}

fn serve() -> (String, Seen) {
    let seen = Seen::default();
    let app = Router::new()
        .route("/props", get(props))
        .route("/v1/chat/completions", post(chat))
        .with_state(seen.clone());
    (serve_app(app), seen)
}

fn serve_app(app: Router) -> String {
    let (tx, rx) = std::sync::mpsc::channel::<SocketAddr>();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(l.local_addr().unwrap()).unwrap();
            axum::serve(l, app).await.unwrap();
        });
    });
    format!("http://{}", rx.recv().unwrap())
}

fn bin() -> Command {
    let mut c = Command::cargo_bin("mtp").unwrap();
    c.env_remove("MTP_API_KEY");
    c
}

#[test]
fn generate_streams_from_llama_server_and_reports_its_draft_counts() {
    let (url, seen) = serve();
    bin()
        .env("MTP_API_KEY", "sk-from-env")
        .args([
            "generate",
            "--provider",
            "llama-server",
            "--model",
            "qwen35-mtp",
            "--base-url",
            &url,
            "--max-tokens",
            "64",
            "def fib",
        ])
        .assert()
        .success()
        .stdout("def fib(n):\n    a, b = 0, 1 — “π”\n")
        .stderr(predicate::str::contains("665 tokens"))
        .stderr(predicate::str::contains("MTP on").and(predicate::str::contains("(515/604)")))
        .stderr(predicate::str::contains("804 prompt tokens from cache"));
    let seen = seen.0.lock().unwrap();
    let (headers, body) = &seen[0];
    assert_eq!(body["stream"], true);
    assert_eq!(body["max_tokens"], 64);
    assert_eq!(
        headers.get("authorization").and_then(|v| v.to_str().ok()),
        Some("Bearer sk-from-env"),
        "--api-key falls back to MTP_API_KEY"
    );
}

#[test]
fn generate_json_from_llama_server() {
    let (url, _seen) = serve();
    let out = bin()
        .args([
            "generate",
            "--provider",
            "llama-server",
            "--model",
            "qwen35-mtp",
            "--base-url",
            &url,
            "--json",
            "def fib",
        ])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let v: Value = serde_json::from_slice(&out).unwrap();
    assert!(v["content"].as_str().is_some_and(|c| !c.is_empty()));
    assert_eq!(v["metadata"]["speculation"]["used"], true);
    for key in ["token_ids", "finish_reason", "usage"] {
        assert!(v.get(key).is_some(), "missing {key}");
    }
    assert!(v["metadata"]["timings"].is_object());
}

#[test]
fn require_acceleration_is_enforced_per_call_when_the_server_has_not_shown_its_lane() {
    let (url, seen) = serve();
    // The stand-in shows an MTP lane, so the call goes through: the flag travels with the
    // provider default instead of refusing at startup on a status that is not known yet.
    bin()
        .args([
            "generate",
            "--provider",
            "llama-server",
            "--model",
            "qwen35-mtp",
            "--base-url",
            &url,
            "--require-acceleration",
            "def fib",
        ])
        .assert()
        .success()
        .stderr(predicate::str::contains("MTP on"));
    assert_eq!(seen.0.lock().unwrap().len(), 1);
}

#[test]
fn chat_with_llama_server_reports_the_servers_lane() {
    let (url, seen) = serve();
    bin()
        .args([
            "chat",
            "--provider",
            "llama-server",
            "--model",
            "qwen35-mtp",
            "--base-url",
            &url,
        ])
        .write_stdin("/speculation\nfirst\nsecond\n/speculation\n/quit\n")
        .assert()
        .success()
        // Before any call the server's settings are unknown, and the report says so; after
        // a call the lane the server showed is reported.
        .stdout(predicate::str::contains(
            "⚡ speculation: no MTP lane loaded (not_reported)",
        ))
        .stdout(predicate::str::contains("def fib(n):"))
        .stdout(predicate::str::contains(
            "⚡ speculation: native MTP lane LOADED\n   drafter        : server-configured",
        ));
    let seen = seen.0.lock().unwrap();
    assert_eq!(seen.len(), 2);
    // The second turn carries the first exchange.
    let msgs = seen[1].1["messages"].as_array().unwrap();
    assert!(msgs.len() >= 3, "{msgs:?}");
}

#[test]
fn a_server_that_wants_a_key_gets_a_hint_naming_the_flag() {
    // llama-server --api-key answers 401 with an OpenAI-style error body
    let app = Router::new().fallback(|| async {
        Response::builder()
            .status(StatusCode::UNAUTHORIZED)
            .header("content-type", "application/json")
            .body(Body::from(
                r#"{"error":{"code":401,"message":"Invalid API Key","type":"authentication_error"}}"#,
            ))
            .unwrap()
    });
    let url = serve_app(app);
    bin()
        .args([
            "generate",
            "--provider",
            "llama-server",
            "--model",
            "m",
            "--base-url",
            &url,
            "--speculation",
            "off",
            "hi",
        ])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("HTTP 401"))
        .stderr(predicate::str::contains("Invalid API Key"))
        .stderr(predicate::str::contains("--api-key (or set MTP_API_KEY)"));
}

/// `--provider llama-server` without `--model`: the one model the server's `/v1/models`
/// lists is used (and named on stderr; the request carries it); a server listing several asks
/// for `--model` naming them; a dead server is an error naming it, never the demo model.
#[test]
fn without_model_the_servers_one_model_is_used() {
    fn models(ids: &'static [&'static str]) -> Router<Seen> {
        Router::new().route(
            "/v1/models",
            get(move || async move {
                let data: Vec<Value> = ids
                    .iter()
                    .map(|id| serde_json::json!({"id": id, "object": "model", "owned_by": "llamacpp"}))
                    .collect();
                axum::Json(serde_json::json!({"object": "list", "data": data}))
            }),
        )
    }
    let seen = Seen::default();
    let app = models(&["qwen35-mtp.gguf"])
        .route("/props", get(props))
        .route("/v1/chat/completions", post(chat))
        .with_state(seen.clone());
    let url = serve_app(app);
    bin()
        .env("MTP_DEFAULT_MODEL", "/nonexistent/tiny-mtp")
        .args([
            "generate",
            "--provider",
            "llama-server",
            "--base-url",
            &url,
            "def fib",
        ])
        .assert()
        .success()
        .stdout("def fib(n):\n    a, b = 0, 1 — “π”\n")
        .stderr(predicate::str::contains(
            "model: qwen35-mtp.gguf (the one model the llama-server server lists",
        ));
    assert_eq!(seen.0.lock().unwrap()[0].1["model"], "qwen35-mtp.gguf");

    let url = serve_app(models(&["a.gguf", "b.gguf"]).with_state(Seen::default()));
    bin()
        .args([
            "generate",
            "--provider",
            "llama-server",
            "--base-url",
            &url,
            "hi",
        ])
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "serves 2 models (a.gguf, b.gguf); name one with --model",
        ));

    let url = serve_app(models(&[]).with_state(Seen::default()));
    bin()
        .args(["generate", "--provider", "vllm", "--base-url", &url, "hi"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("lists no model"));

    // nothing listens there: the error names the server, not the bundled demo model
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    bin()
        .env("MTP_DEFAULT_MODEL", "/nonexistent/tiny-mtp")
        .args([
            "generate",
            "--provider",
            "llama-server",
            "--base-url",
            &dead,
            "hi",
        ])
        .assert()
        .code(1)
        .stderr(predicate::str::contains(dead.trim_start_matches("http://")))
        .stderr(predicate::str::contains("tiny-mtp").not());
}
