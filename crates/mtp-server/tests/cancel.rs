//! Work a client abandons stops, and holds its slot until it has: the server over a provider
//! whose prompt preparation is slow (as rendering a huge prompt, decoding images or a long
//! prefill are) and checks the request's cancellation as the real runtimes do. Also the
//! shutdown deadline, idle connections at the cap, and requests whose framing is ambiguous.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mtp_contract::{
    Capabilities, EventStream, FinishReason, GenerateRequest, GenerateResponse, Metadata, Provider,
    ProviderError, SpeculationMode, SpeculationReport, SpeculationStatus, StreamEvent, Usage,
};
use mtp_server::{serve_on, ServerConfig};
use serde_json::{json, Value};

/// Prepares each prompt for `prep` on a blocking thread (checking the request's cancellation
/// every few milliseconds, and taking `stop_lag` to stop once it sees it, as a prefill part
/// finishes), then answers "ok".
struct Slow {
    prep: Duration,
    stop_lag: Duration,
    /// Preparations running now, and the most that ever ran at once.
    running: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
    /// How each preparation ended: `true` when it saw the cancellation.
    ended: Arc<Mutex<Vec<bool>>>,
}

impl Slow {
    fn new(prep: Duration, stop_lag: Duration) -> Slow {
        Slow {
            prep,
            stop_lag,
            running: Arc::default(),
            most: Arc::default(),
            ended: Arc::default(),
        }
    }
}

#[async_trait::async_trait]
impl Provider for Slow {
    fn name(&self) -> &str {
        "slow"
    }
    fn model(&self) -> &str {
        "slow-model"
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            provider: "slow".into(),
            runtime: "test".into(),
            streaming: true,
            prompt_cache: false,
            images: false,
            per_request_speculation: false,
        }
    }
    fn speculation_status(&self) -> SpeculationStatus {
        SpeculationStatus {
            lane_loaded: false,
            drafter: None,
            num_draft_tokens: None,
            default_mode: SpeculationMode::Off,
            reason: None,
            message: None,
            output_preserving: None,
            auto_depth: false,
        }
    }
    async fn generate(&self, _: GenerateRequest) -> Result<GenerateResponse, ProviderError> {
        Err(ProviderError::Cancelled)
    }
    async fn generate_stream(
        &self,
        request: GenerateRequest,
    ) -> Result<EventStream, ProviderError> {
        let lease = request.cancel.lease();
        let cancel = request.cancel.clone();
        let (prep, lag) = (self.prep, self.stop_lag);
        let (running, most, ended) = (
            Arc::clone(&self.running),
            Arc::clone(&self.most),
            Arc::clone(&self.ended),
        );
        let prepared = tokio::task::spawn_blocking(move || {
            let _lease = lease;
            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            let end = Instant::now() + prep;
            let mut seen = false;
            while Instant::now() < end {
                if cancel.is_cancelled() {
                    seen = true;
                    std::thread::sleep(lag);
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            ended.lock().unwrap().push(seen);
            running.fetch_sub(1, Ordering::SeqCst);
            if seen {
                Err(ProviderError::Cancelled)
            } else {
                Ok(())
            }
        })
        .await
        .map_err(|_| ProviderError::Cancelled)?;
        prepared?;
        let done = GenerateResponse {
            content: "ok".into(),
            reasoning_content: None,
            token_ids: None,
            finish_reason: FinishReason::Stop,
            usage: Usage {
                input_tokens: 1,
                output_tokens: 1,
                cached_input_tokens: 0,
            },
            metadata: Metadata {
                speculation: SpeculationReport::not_used(
                    &mtp_contract::resolve(None, None),
                    "test",
                    mtp_contract::Reason::DisabledByDefault,
                    None,
                ),
                timings: Default::default(),
            },
            partial: false,
            warnings: Vec::new(),
            tool_calls: Vec::new(),
            stop_sequence: None,
            prompt_logprobs: None,
            logprobs: None,
        };
        Ok(Box::pin(futures::stream::iter([Ok(StreamEvent::Done(
            Box::new(done),
        ))])))
    }
    async fn unload(&self) -> Result<(), ProviderError> {
        Ok(())
    }
}

struct Running {
    base: String,
    addr: String,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), mtp_server::ServerError>>,
}

async fn start(llm: Arc<dyn Provider>, config: ServerConfig) -> Running {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (stop, rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(serve_on(listener, llm, config, async {
        let _ = rx.await;
    }));
    Running {
        base: format!("http://{addr}"),
        addr,
        stop,
        task,
    }
}

fn chat() -> Value {
    json!({"messages": [{"role": "user", "content": "hi"}]})
}

/// The value of a gauge or counter of `/metrics`.
async fn metric(base: &str, name: &str) -> u64 {
    let text = reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find(|l| l.starts_with(&format!("{name}{{")))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

/// Sends a request on a raw socket and reads the whole answer (the server closes it).
fn raw(addr: &str, request: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_work_keeps_its_slot_until_it_has_stopped() {
    // a prompt that takes 30 s to prepare, and half a second to stop once cancelled
    let llm = Arc::new(Slow::new(
        Duration::from_secs(30),
        Duration::from_millis(500),
    ));
    let (most, ended) = (Arc::clone(&llm.most), Arc::clone(&llm.ended));
    let srv = start(llm, ServerConfig::new("unused")).await;
    // the client gives up after 300 ms
    let gone = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", srv.base))
        .timeout(Duration::from_millis(300))
        .json(&chat())
        .send()
        .await;
    assert!(gone.is_err());
    // the work is told at once, and is still stopping: it keeps its slot meanwhile
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(metric(&srv.base, "mtp:request_cancelled_total").await, 1);
    assert_eq!(metric(&srv.base, "mtp:num_requests_cancelling").await, 1);
    assert_eq!(metric(&srv.base, "mtp:num_requests_running").await, 1);
    // a short request now waits for that slot instead of running beside the abandoned work
    let started = Instant::now();
    let next = tokio::spawn({
        let base = srv.base.clone();
        async move {
            reqwest::Client::new()
                .post(format!("{base}/v1/chat/completions"))
                .timeout(Duration::from_secs(40))
                .json(&json!({"messages": [{"role": "user", "content": "again"}]}))
                .send()
                .await
                .map(|r| r.status().as_u16())
        }
    });
    // the second request would prepare for 30 s too: cancel it by stopping the wait once it
    // has started, then check that the two never ran at once
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        ended.lock().unwrap().as_slice(),
        &[true],
        "the first stopped"
    );
    assert_eq!(
        most.load(Ordering::SeqCst),
        1,
        "never two preparations at once"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(metric(&srv.base, "mtp:num_requests_cancelling").await, 0);
    next.abort();
    let _ = srv.stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_cancels_the_work_in_flight_and_meets_its_grace() {
    let llm = Arc::new(Slow::new(
        Duration::from_secs(60),
        Duration::from_millis(50),
    ));
    let ended = Arc::clone(&llm.ended);
    let mut config = ServerConfig::new("unused");
    config.shutdown_grace = Duration::from_secs(2);
    let srv = start(llm, config).await;
    let pending = tokio::spawn({
        let base = srv.base.clone();
        async move {
            reqwest::Client::new()
                .post(format!("{base}/v1/chat/completions"))
                .json(&chat())
                .send()
                .await
                .map(|r| r.status().as_u16())
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let signalled = Instant::now();
    srv.stop.send(()).unwrap();
    srv.task.await.unwrap().unwrap();
    let took = signalled.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_millis(2600),
        "the server stopped {took:?} after the signal (grace 2 s)"
    );
    assert_eq!(
        ended.lock().unwrap().as_slice(),
        &[true],
        "the work saw its cancellation"
    );
    // the client got an answer or a closed connection, not a hang
    let _ = tokio::time::timeout(Duration::from_secs(5), pending)
        .await
        .expect("the client's request ended");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_at_the_cap_make_room_and_busy_ones_do_not() {
    let llm = Arc::new(Slow::new(Duration::from_secs(20), Duration::ZERO));
    let mut config = ServerConfig::new("unused");
    config.max_connections = 4;
    config.max_batch = 4;
    config.header_timeout = Duration::from_secs(60);
    let srv = start(llm, config).await;
    // four sockets that never send a byte fill the cap
    let idle: Vec<TcpStream> = (0..4)
        .map(|_| TcpStream::connect(&srv.addr).unwrap())
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    // a real client still gets in, each time in the place of the longest-idle connection
    // (the clients are kept, with their idle keep-alive connections)
    let mut clients = Vec::new();
    for _ in 0..6 {
        clients.push(reqwest::Client::new());
        let r = clients[clients.len() - 1]
            .get(format!("{}/health", srv.base))
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
    }
    assert!(metric(&srv.base, "mtp:connections_evicted_total").await >= 4);
    drop(idle);
    // four connections each waiting on a request are never closed for a new one
    let busy: Vec<_> = (0..4)
        .map(|_| {
            let addr = srv.addr.clone();
            std::thread::spawn(move || {
                let body = chat().to_string();
                raw(
                    &addr,
                    format!(
                        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\
                         content-type: application/json\r\ncontent-length: {}\r\n\
                         connection: close\r\n\r\n{body}",
                        body.len()
                    )
                    .as_bytes(),
                )
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let addr = srv.addr.clone();
    let refused =
        tokio::task::spawn_blocking(move || raw(&addr, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"))
            .await
            .unwrap();
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    assert!(refused.contains("too_many_connections"), "{refused}");
    let _ = srv.stop.send(());
    drop(busy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ambiguous_framing_and_repeated_keys_are_400s() {
    let srv = start(
        Arc::new(Slow::new(Duration::ZERO, Duration::ZERO)),
        ServerConfig::new("unused"),
    )
    .await;
    let addr = srv.addr.clone();
    let answers = tokio::task::spawn_blocking(move || {
        let body = r#"{"messages": [{"role": "user", "content": "hi"}]}"#;
        let dup = r#"{"messages": [{"role": "user", "content": "hi"}], "messages": []}"#;
        [
            // HTTP/1.1 without Host
            raw(&addr, b"GET /health HTTP/1.1\r\n\r\n"),
            // chunked twice
            raw(
                &addr,
                format!(
                    "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\
                     transfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n\r\n\
                     {:x}\r\n{body}\r\n0\r\n\r\n",
                    body.len()
                )
                .as_bytes(),
            ),
            // a key named twice
            raw(
                &addr,
                format!(
                    "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nconnection: close\r\n\
                     content-type: application/json\r\ncontent-length: {}\r\n\r\n{dup}",
                    dup.len()
                )
                .as_bytes(),
            ),
        ]
    })
    .await
    .unwrap();
    for (a, what) in answers.iter().zip(["Host", "chunked", "appears twice"]) {
        assert!(a.starts_with("HTTP/1.1 400"), "{what}: {a}");
        assert!(a.contains(what), "{what}: {a}");
    }
    // the framing refusals close their connection
    assert!(answers[0]
        .to_ascii_lowercase()
        .contains("connection: close"));
    let _ = srv.stop.send(());
}
