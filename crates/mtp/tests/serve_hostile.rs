//! `mtp serve` against hostile and careless clients: the real binary on the bundled model,
//! driven over loopback. Each test is bounded in time and in the number of requests, and
//! each checks that the server still answers `/health` after what it was sent.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

fn demo_model() -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny-code");
    p.canonicalize().unwrap().display().to_string()
}

struct Server {
    child: Child,
    addr: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Whether the process is still running.
    fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits up to `limit` for the process to exit; its status.
    fn exit_within(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let end = Instant::now() + limit;
        while Instant::now() < end {
            if let Ok(Some(s)) = self.child.try_wait() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    fn sigterm(&self) {
        let ok = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
    }
}

/// Starts `mtp serve --port 0 ARGS` on the demo model.
fn serve(args: &[&str]) -> Server {
    let s = common::spawn_serve(&demo_model(), args, Stdio::null());
    assert!(s.banner.starts_with("serving "), "{}", s.banner);
    let addr = s.base.trim_start_matches("http://").to_string();
    // keep reading the banner pipe so the server never blocks on a full stdout
    let mut out = s.out;
    std::thread::spawn(move || {
        let mut sink = String::new();
        while out.read_line(&mut sink).map(|n| n > 0).unwrap_or(false) {
            sink.clear();
        }
    });
    Server {
        child: s.child,
        addr,
    }
}

fn client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

fn post(srv: &Server, path: &str, body: &Value, key: Option<&str>) -> (u16, Value) {
    let mut req = client().post(srv.url(path)).json(body);
    if let Some(k) = key {
        req = req.header("Authorization", k);
    }
    let r = req.send().unwrap();
    let status = r.status().as_u16();
    (status, r.json().unwrap_or(Value::Null))
}

fn health(srv: &Server) -> u16 {
    client()
        .get(srv.url("/health"))
        .timeout(Duration::from_secs(5))
        .send()
        .map(|r| r.status().as_u16())
        .unwrap_or(0)
}

fn metric(srv: &Server, name: &str) -> u64 {
    let text = client()
        .get(srv.url("/metrics"))
        .send()
        .unwrap()
        .text()
        .unwrap();
    text.lines()
        .find(|l| l.starts_with(&format!("{name}{{")))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

/// A stream of 4,000 tokens (the end token banned) asked by a client with a 2 KiB receive
/// buffer that never reads: with a long `--served-model-name` in every chunk, the answer
/// outgrows the socket buffers many times over and the server's writes stall. The runtime is returned with the socket to keep both alive.
fn stalled_stream(srv: &Server) -> (tokio::runtime::Runtime, tokio::net::TcpStream) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let addr: std::net::SocketAddr = srv.addr.parse().unwrap();
    let s = rt.block_on(async {
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.set_recv_buffer_size(2048).unwrap();
        let mut s = sock.connect(addr).await.unwrap();
        let body = json!({"prompt": "fn main() {", "max_tokens": 4000, "stream": true,
                          "logit_bias": {"0": -100}})
        .to_string();
        let req = format!(
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n\
             content-length: {}\r\n\r\n{body}",
            body.len()
        );
        tokio::io::AsyncWriteExt::write_all(&mut s, req.as_bytes())
            .await
            .unwrap();
        s
    });
    (rt, s)
}

fn chat(extra: Value) -> Value {
    let mut body =
        json!({"messages": [{"role": "user", "content": "fn main() {"}], "max_tokens": 8});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// A JSON schema whose `$defs` chain `n` objects (each holds the next).
fn ref_chain(n: usize) -> Value {
    let defs: serde_json::Map<String, Value> = (0..n)
        .map(|i| {
            let v = if i + 1 < n {
                json!({"type": "object", "properties": {"x": {"$ref": format!("#/$defs/a{}", i + 1)}},
                       "required": ["x"]})
            } else {
                json!({"type": "string"})
            };
            (format!("a{i}"), v)
        })
        .collect();
    json!({"$defs": defs, "$ref": "#/$defs/a0"})
}

fn rule_chain(n: usize) -> String {
    let mut g = String::from("start: r0\n");
    for i in 0..n - 1 {
        g += &format!("r{i}: r{}\n", i + 1);
    }
    g + &format!("r{}: \"x\"\n", n - 1)
}

#[test]
fn deep_schemas_and_grammars_never_take_the_server_down() {
    // batched (the scheduler's thread) and solo (a blocking-pool thread): before, a 300-link
    // chain overflowed either thread's stack and aborted the process
    for batch in ["4", "1"] {
        let mut srv = serve(&["--max-batch", batch]);
        let schema = ref_chain(300);
        let (s, v) = post(
            &srv,
            "/v1/chat/completions",
            &chat(json!({"response_format": {"type": "json_schema",
                "json_schema": {"name": "chain", "schema": schema}}})),
            None,
        );
        assert_eq!(s, 200, "{v}");
        let text = v["choices"][0]["message"]["content"].as_str().unwrap();
        assert!(text.starts_with("{\"x\": "), "{text}");
        let (s, v) = post(
            &srv,
            "/v1/chat/completions",
            &chat(json!({"response_format": {"type": "grammar", "grammar": rule_chain(800)}})),
            None,
        );
        assert_eq!(s, 200, "{v}");
        assert_eq!(v["choices"][0]["message"]["content"], "x");
        // past the grammar's limits: a 400 naming the limit, and the server goes on
        let (s, v) = post(
            &srv,
            "/v1/chat/completions",
            &chat(json!({"response_format": {"type": "json_schema",
                "json_schema": {"name": "chain", "schema": ref_chain(2_500)}}})),
            None,
        );
        assert_eq!(s, 400, "{v}");
        assert_eq!(v["error"]["param"], "response_format");
        assert!(
            v["error"]["message"].as_str().unwrap().contains("2000"),
            "{v}"
        );
        assert!(srv.alive());
        assert_eq!(health(&srv), 200);
        // a refusal of the request's own making is counted as rejected, not failed
        assert_eq!(metric(&srv, "mtp:request_failure_total"), 0);
        assert_eq!(metric(&srv, "mtp:request_rejected_total"), 1);
    }
}

#[test]
fn oversized_prompts_are_refused_before_they_are_tokenized() {
    // 15 MiB of text: past --max-prompt-bytes (4 MiB by default), a 413 before the request
    // waits for a slot, whatever the model's context
    let srv = serve(&[]);
    let huge = "x".repeat(15 << 20);
    let started = Instant::now();
    let (s, v) = post(
        &srv,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": huge.clone()}]}),
        None,
    );
    assert_eq!(s, 413, "{v}");
    assert_eq!(v["error"]["param"], "messages");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--max-prompt-bytes"),
        "{v}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    drop(srv);
    // raised past the body: the model's own check, from the context's size
    let mut srv = serve(&["--max-batch", "2", "--max-prompt-bytes", "16777216"]);
    let started = Instant::now();
    let (s, v) = post(
        &srv,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": huge}]}),
        None,
    );
    let took = started.elapsed();
    assert_eq!(s, 400, "{v}");
    assert_eq!(v["error"]["code"], "context_length_exceeded", "{v}");
    let m = v["error"]["message"].as_str().unwrap();
    assert!(
        m.contains("15728640 bytes") && m.contains("maximum context length is 4096 tokens"),
        "{m}"
    );
    // reading and parsing 15 MiB of JSON is all it costs
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert!(srv.alive());
    assert_eq!(health(&srv), 200);
    // a prompt that fits in bytes but not in tokens is still refused by its token count
    let (s, v) = post(
        &srv,
        "/v1/completions",
        &json!({"prompt": "x".repeat(5000), "max_tokens": 4}),
        None,
    );
    assert_eq!(s, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("5000 tokens"),
        "{v}"
    );
    assert_eq!(metric(&srv, "mtp:request_failure_total"), 0);
    assert_eq!(metric(&srv, "mtp:request_rejected_total"), 2);
}

#[test]
fn caps_on_stop_strings_messages_parts_and_tools_name_their_flag() {
    let srv = serve(&["--max-stop", "8", "--max-messages", "4", "--max-tools", "2"]);
    let cases = [
        (
            chat(json!({"stop": vec!["abc".repeat(100); 30_000]})),
            "stop",
            "--max-stop",
        ),
        (
            chat(json!({"stop": ["x".repeat(2_000)]})),
            "stop",
            "--max-stop-bytes",
        ),
        (
            json!({"messages": vec![json!({"role": "user", "content": "hi"}); 5]}),
            "messages",
            "--max-messages",
        ),
        (
            chat(json!({"tools": vec![json!({"type": "function",
                "function": {"name": "f", "parameters": {}}}); 3]})),
            "tools",
            "--max-tools",
        ),
        (
            json!({"messages": [{"role": "user",
                "content": vec![json!({"type": "text", "text": "a"}); 300]}]}),
            "messages[0]",
            "--max-content-parts",
        ),
    ];
    for (body, param, flag) in cases {
        let started = Instant::now();
        let (s, v) = post(&srv, "/v1/chat/completions", &body, None);
        assert_eq!(s, 400, "{flag}: {v}");
        assert_eq!(v["error"]["param"], param, "{v}");
        assert_eq!(v["error"]["code"], "over_limit", "{v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(flag),
            "{v}"
        );
        assert!(started.elapsed() < Duration::from_secs(5));
    }
    // within the caps, the same shapes are served
    let (s, v) = post(
        &srv,
        "/v1/chat/completions",
        &chat(json!({"stop": vec!["}"; 8]})),
        None,
    );
    assert_eq!(s, 200, "{v}");
}

#[test]
fn a_half_sent_header_is_closed_after_the_header_timeout() {
    let mut srv = serve(&["--header-timeout", "1"]);
    let mut half = TcpStream::connect(&srv.addr).unwrap();
    half.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    half.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let started = Instant::now();
    let mut buf = Vec::new();
    let _ = half.read_to_end(&mut buf);
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(5),
        "closed after {took:?}"
    );
    // an idle keep-alive connection is closed the same way
    let mut idle = TcpStream::connect(&srv.addr).unwrap();
    idle.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    idle.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let started = Instant::now();
    let mut buf = Vec::new();
    let _ = idle.read_to_end(&mut buf);
    assert!(String::from_utf8_lossy(&buf).starts_with("HTTP/1.1 200"));
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(srv.alive());
    assert_eq!(health(&srv), 200);
}

#[test]
fn a_slow_body_is_answered_408_after_the_body_timeout() {
    let srv = serve(&["--body-timeout", "1"]);
    let mut slow = TcpStream::connect(&srv.addr).unwrap();
    slow.write_all(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n\
          content-length: 100\r\n\r\n{\"prompt\"",
    )
    .unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut buf = [0u8; 512];
    let n = slow.read(&mut buf).unwrap();
    let head = String::from_utf8_lossy(&buf[..n]);
    assert!(head.starts_with("HTTP/1.1 408"), "{head}");
    assert!(head.contains("--body-timeout"), "{head}");
    assert_eq!(health(&srv), 200);
}

#[test]
fn idle_connections_at_the_cap_give_way_and_busy_ones_get_a_503() {
    let mut srv = serve(&[
        "--max-connections",
        "8",
        "--header-timeout",
        "30",
        "--max-batch",
        "1",
    ]);
    // 30 idle sockets against a cap of 8 (an attacker reopening what is closed): every real
    // client still gets in, in the place of the longest-idle socket
    let mut idle: Vec<TcpStream> = Vec::new();
    for round in 0..30 {
        idle.push(TcpStream::connect(&srv.addr).unwrap());
        if round % 3 == 0 {
            let started = Instant::now();
            let r = client()
                .get(srv.url("/health"))
                .timeout(Duration::from_secs(5))
                .send();
            let status = r.as_ref().map(|r| r.status().as_u16());
            assert!(matches!(status, Ok(200)), "round {round}: {r:?}");
            assert!(started.elapsed() < Duration::from_secs(3));
        }
    }
    assert!(metric(&srv, "mtp:connections_evicted_total") >= 20);
    assert_eq!(metric(&srv, "mtp:connections_refused_total"), 0);
    drop(idle);
    // eight connections with requests in flight (one generating, seven queued) are never
    // closed for a new one: that one gets the 503
    let busy: Vec<_> = (0..8)
        .map(|_| {
            let addr = srv.addr.clone();
            std::thread::spawn(move || {
                let mut s = TcpStream::connect(&addr).unwrap();
                let body = json!({"prompt": "fn main() {", "max_tokens": 3000,
                                  "logit_bias": {"0": -100}})
                .to_string();
                let _ = write!(
                    s,
                    "POST /v1/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n\
                     content-length: {}\r\n\r\n{body}",
                    body.len()
                );
                std::thread::sleep(Duration::from_secs(3));
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(700));
    let mut extra = TcpStream::connect(&srv.addr).unwrap();
    extra
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let _ = extra.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
    let mut buf = Vec::new();
    let _ = extra.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    assert!(text.starts_with("HTTP/1.1 503"), "{text}");
    assert!(text.contains("too_many_connections") && text.contains("--max-connections"));
    for b in busy {
        b.join().unwrap();
    }
    let end = Instant::now() + Duration::from_secs(10);
    while health(&srv) != 200 {
        assert!(Instant::now() < end, "/health did not come back");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(srv.alive());
}

#[test]
fn a_client_that_stops_reading_loses_its_slot_after_the_write_timeout() {
    let name = "m".repeat(8192);
    let mut srv = serve(&[
        "--max-batch",
        "1",
        "--write-timeout",
        "1",
        "--served-model-name",
        &name,
    ]);
    let stalled = stalled_stream(&srv);
    std::thread::sleep(Duration::from_millis(300));
    // the only slot is the stalled stream's until its write times out
    answered_within(&srv, Duration::from_secs(10));
    assert_eq!(metric(&srv, "mtp:request_cancelled_total"), 1);
    assert_eq!(metric(&srv, "mtp:request_success_total"), 1);
    drop(stalled);
    assert!(srv.alive());
}

#[test]
fn sigterm_drains_with_health_503_and_a_deadline() {
    let mut srv = serve(&["--shutdown-grace", "30"]);
    // a long stream in flight, read slowly enough to still run at the signal
    let addr = srv.addr.clone();
    let reader = std::thread::spawn(move || {
        let mut s = TcpStream::connect(&addr).unwrap();
        let body = json!({"prompt": "fn main() {", "max_tokens": 3000, "stream": true,
                          "logit_bias": {"0": -100}})
        .to_string();
        write!(
            s,
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n\
             content-length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut r = BufReader::new(s);
        let mut line = String::new();
        let mut done = false;
        while r.read_line(&mut line).map(|n| n > 0).unwrap_or(false) {
            if line.contains("[DONE]") {
                done = true;
            }
            line.clear();
            std::thread::sleep(Duration::from_micros(500));
        }
        done
    });
    // and a request half sent
    let mut half = TcpStream::connect(&srv.addr).unwrap();
    half.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\ncontent-length: 100\r\n\r\n{")
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    srv.sigterm();
    std::thread::sleep(Duration::from_millis(100));
    // draining: /health says so, new requests are refused
    assert_eq!(health(&srv), 503);
    let (s, v) = post(&srv, "/v1/completions", &json!({"prompt": "fn"}), None);
    assert_eq!(s, 503, "{v}");
    assert_eq!(v["error"]["code"], "shutting_down");
    // the stream in flight finishes whole; then the server exits without waiting for the
    // half-sent request
    assert!(reader.join().unwrap(), "the stream in flight was cut");
    let status = srv.exit_within(Duration::from_secs(10)).expect("exited");
    assert!(status.success(), "{status:?}");
    drop(half);

    // with a short grace, a stream that outlasts it is cut and the server exits on time
    let name = "m".repeat(8192);
    let mut srv = serve(&["--shutdown-grace", "1", "--served-model-name", &name]);
    let stalled = stalled_stream(&srv);
    std::thread::sleep(Duration::from_millis(300));
    srv.sigterm();
    let started = Instant::now();
    let status = srv.exit_within(Duration::from_secs(10)).expect("exited");
    assert!(status.success(), "{status:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    drop(stalled);
}

#[test]
fn bearer_is_case_insensitive_and_keys_still_compare_whole() {
    let srv = serve(&["--api-key", "secret"]);
    let body = json!({"prompt": "fn", "max_tokens": 2});
    for ok in ["Bearer secret", "bearer secret", "BEARER secret"] {
        assert_eq!(
            post(&srv, "/v1/completions", &body, Some(ok)).0,
            200,
            "{ok}"
        );
    }
    for bad in ["Bearer secre", "Basic secret", "bearersecret", "secret"] {
        assert_eq!(
            post(&srv, "/v1/completions", &body, Some(bad)).0,
            401,
            "{bad}"
        );
    }
}

#[test]
fn deeply_nested_json_is_refused_and_nested_tool_schemas_render() {
    let mut srv = serve(&[]);
    // 100,000 open brackets: the JSON reader's depth limit refuses it, no recursion runs
    let deep = format!(
        "{{\"messages\": {}{}}}",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    let r = client()
        .post(srv.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(deep)
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let v: Value = r.json().unwrap();
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("recursion"),
        "{v}"
    );
    // a tool schema nearly as deep as the reader allows (127 of its 128 levels) renders
    // through the template (minijinja grows its stack) and the request is answered
    let mut schema = json!({"type": "string"});
    for _ in 0..61 {
        let mut m = serde_json::Map::new();
        m.insert("type".into(), json!("object"));
        let mut props = serde_json::Map::new();
        props.insert("x".into(), schema);
        m.insert("properties".into(), Value::Object(props));
        schema = Value::Object(m);
    }
    let tool = json!({"type": "function", "function": {"name": "deep", "parameters": schema}});
    let (s, v) = post(
        &srv,
        "/v1/chat/completions",
        &chat(json!({"tools": [tool]})),
        None,
    );
    assert_eq!(s, 200, "{v}");
    assert!(srv.alive());
    assert_eq!(health(&srv), 200);
}

#[test]
fn a_branching_forced_tool_schema_is_answered_in_seconds() {
    // the 444-byte schema whose anyOf of eight $refs to itself once took exponential time:
    // each schema node is read once now
    let mut srv = serve(&[]);
    let branches = vec![json!({"$ref": "#/$defs/a"}); 8];
    let params = json!({"type": "object", "$defs": {"a": {"anyOf": branches}},
                        "properties": {"x": {"$ref": "#/$defs/a"}}});
    let tool = json!({"type": "function", "function": {"name": "f", "parameters": params}});
    let started = Instant::now();
    let (s, v) = post(
        &srv,
        "/v1/chat/completions",
        &chat(json!({"tools": [tool], "tool_choice": "required", "max_tokens": 32})),
        None,
    );
    assert!(s == 200 || s == 400, "{s}: {v}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    // one past the walk's budget is a 400 naming `tools`, before anything runs
    let wide: Vec<Value> = (0..5000).map(|i| json!({"const": i})).collect();
    let tool = json!({"type": "function", "function": {"name": "f", "parameters":
        {"type": "object", "properties": {"x": {"anyOf": wide}}}}});
    let (s, v) = post(
        &srv,
        "/v1/chat/completions",
        &chat(json!({"tools": [tool], "tool_choice": "required"})),
        None,
    );
    assert_eq!(s, 400, "{v}");
    assert_eq!(v["error"]["param"], "tools");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("too complex"),
        "{v}"
    );
    assert!(srv.alive());
    assert_eq!(health(&srv), 200);
}

#[test]
fn client_faults_in_history_sampling_and_keys_are_400s_naming_the_field() {
    let mut srv = serve(&[]);
    let call = |args: Value| {
        json!({"messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "get_weather", "arguments": args}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}],
            "max_tokens": 4})
    };
    let cases = [
        // arguments that are JSON but not an object
        (call(json!("[1,2]")), "messages"),
        (call(json!(5)), "messages"),
        // a token id the vocabulary does not have
        (chat(json!({"logit_bias": {"999999999": 5}})), "logit_bias"),
        // candidates the server does not generate
        (chat(json!({"best_of": 2})), "best_of"),
        // a key is a name, not a place to store data
        (
            chat(json!({"prompt_cache_key": "k".repeat(1 << 20)})),
            "prompt_cache_key",
        ),
        (chat(json!({"max_tokens": 0})), "max_tokens"),
    ];
    for (body, param) in cases {
        let (s, v) = post(&srv, "/v1/chat/completions", &body, None);
        assert_eq!(s, 400, "{param}: {v}");
        let named = v["error"]["param"].as_str().unwrap_or("");
        assert!(named.starts_with(param), "{param}: {v}");
    }
    assert_eq!(metric(&srv, "mtp:request_failure_total"), 0);
    assert!(srv.alive());
    assert_eq!(health(&srv), 200);
}

#[test]
fn prefix_cache_files_stay_within_the_disk_budget_whatever_the_keys() {
    let dir = tempfile_dir("cache-keys");
    let budget = 400_000u64;
    let srv = serve(&[
        "--cache-dir",
        dir.to_str().unwrap(),
        "--cache-disk-bytes",
        &budget.to_string(),
    ]);
    for i in 0..24 {
        let key = format!("{i}-{}", "k".repeat(200));
        let body = json!({"messages": [{"role": "user", "content": format!("fn f{i}() {{")}],
                          "max_tokens": 4, "prompt_cache_key": key});
        let (s, v) = post(&srv, "/v1/chat/completions", &body, None);
        assert_eq!(s, 200, "{v}");
    }
    // the writer runs beside the requests: give it a moment
    std::thread::sleep(Duration::from_millis(500));
    let total: u64 = walk(&dir).iter().map(|m| m.len()).sum();
    assert!(total <= budget, "{total} bytes on disk, budget {budget}");
    drop(srv);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_client_that_hangs_up_frees_its_slot_at_the_default_batch() {
    let srv = serve(&["--max-batch", "1"]);
    // a long reply whose client gives up at once
    let gone = client()
        .post(srv.url("/v1/completions"))
        .timeout(Duration::from_millis(150))
        .json(&json!({"prompt": "fn main() {", "max_tokens": 4000, "logit_bias": {"0": -100}}))
        .send();
    assert!(gone.is_err());
    answered_within(&srv, Duration::from_secs(10));
    let end = Instant::now() + Duration::from_secs(5);
    while metric(&srv, "mtp:num_requests_running") != 0 {
        assert!(Instant::now() < end, "the abandoned work still runs");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(metric(&srv, "mtp:request_cancelled_total"), 1);
}

/// A short completion is answered 200 within `limit`.
fn answered_within(srv: &Server, limit: Duration) {
    let started = Instant::now();
    let (s, v) = post(
        srv,
        "/v1/completions",
        &json!({"prompt": "fn", "max_tokens": 4}),
        None,
    );
    assert_eq!(s, 200, "{v}");
    assert!(started.elapsed() < limit, "{:?}", started.elapsed());
}

/// A fresh folder under the system's temporary directory.
fn tempfile_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mtp-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Every file's metadata under `dir`.
fn walk(dir: &std::path::Path) -> Vec<std::fs::Metadata> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let m = e.metadata().unwrap();
        if m.is_dir() {
            out.extend(walk(&e.path()));
        } else {
            out.push(m);
        }
    }
    out
}
