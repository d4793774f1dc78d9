//! The server over a scripted provider: the HTTP surface (shapes, SSE, errors, keys, the queue,
//! cancellation, shutdown). The native engine behind `mtp serve` is tested end to end in
//! `crates/mtp/tests/serve.rs`.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use mtp_contract::{
    plan, Capabilities, DraftStats, EventStream, FinishReason, GenerateRequest, GenerateResponse,
    Lane, Metadata, Provider, ProviderError, Speculation, SpeculationMode, SpeculationStatus,
    StreamEvent, Timings, Usage,
};
use mtp_server::{serve_on, ServerConfig};
use serde_json::{json, Value};
use tokio::sync::Semaphore;

/// Answers every request with `words`, one delta per word, `pause` apart; drafting (depth 2,
/// one of two proposals accepted per round) when the plan says so. `gate`, when set, holds each
/// generation until a permit is added.
struct Scripted {
    words: Vec<&'static str>,
    pause: Duration,
    gate: Option<Arc<Semaphore>>,
    dropped_early: Arc<AtomicUsize>,
    calls: Arc<AtomicUsize>,
    busy: Arc<AtomicBool>,
}

impl Scripted {
    fn new(words: &[&'static str]) -> Scripted {
        Scripted {
            words: words.to_vec(),
            pause: Duration::ZERO,
            gate: None,
            dropped_early: Arc::default(),
            calls: Arc::default(),
            busy: Arc::default(),
        }
    }
}

struct Watch {
    done: bool,
    dropped_early: Arc<AtomicUsize>,
    busy: Arc<AtomicBool>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        if !self.done {
            self.dropped_early.fetch_add(1, Ordering::SeqCst);
        }
        self.busy.store(false, Ordering::SeqCst);
    }
}

#[async_trait::async_trait]
impl Provider for Scripted {
    fn name(&self) -> &str {
        "scripted"
    }
    fn model(&self) -> &str {
        "scripted-model"
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            provider: "scripted".into(),
            runtime: "test".into(),
            streaming: true,
            prompt_cache: false,
            images: false,
            per_request_speculation: true,
        }
    }
    fn speculation_status(&self) -> SpeculationStatus {
        SpeculationStatus {
            lane_loaded: true,
            drafter: Some("embedded".into()),
            num_draft_tokens: Some(2),
            default_mode: SpeculationMode::NativeMtp,
            reason: None,
            message: None,
            output_preserving: Some(true),
            auto_depth: false,
        }
    }
    async fn generate(&self, request: GenerateRequest) -> Result<GenerateResponse, ProviderError> {
        let mut s = self.generate_stream(request).await?;
        while let Some(ev) = s.next().await {
            if let StreamEvent::Done(r) = ev? {
                return Ok(*r);
            }
        }
        Err(ProviderError::Cancelled)
    }
    async fn generate_stream(
        &self,
        request: GenerateRequest,
    ) -> Result<EventStream, ProviderError> {
        request.validate()?;
        if self.busy.swap(true, Ordering::SeqCst) {
            return Err(ProviderError::Busy {
                model: "scripted-model".into(),
            });
        }
        let default = Speculation::depth(2).unwrap();
        let p = plan(
            Some(&default),
            request.speculation.as_ref(),
            &request.sampling,
            &Lane::Ready {
                drafter: "embedded".into(),
                default_depth: 2,
                depth_source: mtp_contract::DepthSource::Registry,
                output_preserving: Some(true),
            },
        );
        let p = match p {
            Ok(p) => p,
            Err(e) => {
                self.busy.store(false, Ordering::SeqCst);
                return Err(e);
            }
        };
        self.calls.fetch_add(1, Ordering::SeqCst);
        let n = self
            .words
            .len()
            .min(request.max_output_tokens.unwrap_or(u32::MAX) as usize);
        let words: Vec<String> = self.words[..n].iter().map(|w| w.to_string()).collect();
        let (pause, gate) = (self.pause, self.gate.clone());
        let mut watch = Watch {
            done: false,
            dropped_early: Arc::clone(&self.dropped_early),
            busy: Arc::clone(&self.busy),
        };
        let stream = async_stream(words, pause, gate, move |content, out| {
            watch.done = true;
            let rounds = out.div_ceil(2);
            let stats = DraftStats {
                drafted: 2 * rounds,
                accepted: rounds,
                rounds,
                accepted_per_position: vec![rounds, 0],
                ..Default::default()
            };
            let report = p.report("test", &stats);
            let _keep = &watch;
            GenerateResponse {
                content,
                reasoning_content: None,
                token_ids: None,
                finish_reason: if out == n as u64 && n < 4 {
                    FinishReason::Length
                } else {
                    FinishReason::Stop
                },
                usage: Usage {
                    input_tokens: 5,
                    output_tokens: out,
                    cached_input_tokens: 0,
                },
                metadata: Metadata {
                    speculation: report,
                    timings: Timings {
                        time_to_first_token_ms: Some(1.0),
                        decode_ms: Some(10.0),
                        decode_tokens_per_s: Some(100.0),
                        ..Default::default()
                    },
                },
                partial: false,
                warnings: Vec::new(),
                tool_calls: Vec::new(),
                stop_sequence: None,
                prompt_logprobs: None,
                logprobs: None,
            }
        });
        Ok(stream)
    }
    /// The prompt size every answer reports.
    async fn count_tokens(&self, request: GenerateRequest) -> Result<u64, ProviderError> {
        request.validate()?;
        Ok(5)
    }
    async fn unload(&self) -> Result<(), ProviderError> {
        Ok(())
    }
}

/// What the fake runtimes report of their 5-token prompt before the reply.
const PROGRESS: mtp_contract::PromptProgress = mtp_contract::PromptProgress {
    total: 5,
    cache: 2,
    processed: 5,
    time_ms: 3,
};

/// The prompt's progress, deltas of `words`, then `Done(finish(content, count))`.
fn async_stream(
    words: Vec<String>,
    pause: Duration,
    gate: Option<Arc<Semaphore>>,
    mut finish: impl FnMut(String, u64) -> GenerateResponse + Send + 'static,
) -> EventStream {
    let state = (words.into_iter(), String::new(), 0u64, gate, false);
    let events = futures::stream::unfold(state, move |(mut it, mut content, n, gate, ended)| {
        let r = if ended { None } else { Some(()) };
        let next = it.next();
        let done = next.is_none();
        let resp = if done && r.is_some() {
            Some(finish(content.clone(), n))
        } else {
            None
        };
        async move {
            r?;
            if let Some(g) = &gate {
                g.acquire().await.ok()?.forget();
            }
            tokio::time::sleep(pause).await;
            match next {
                Some(w) => {
                    content.push_str(&w);
                    let ev = StreamEvent::Delta {
                        text: w,
                        token_ids: vec![],
                        reasoning: String::new(),
                        logprobs: Vec::new(),
                    };
                    Some((Ok(ev), (it, content, n + 1, None, false)))
                }
                None => Some((
                    Ok(StreamEvent::Done(Box::new(resp.unwrap()))),
                    (it, content, n, None, true),
                )),
            }
        }
    });
    futures::stream::once(async { Ok(StreamEvent::PromptProgress(PROGRESS)) })
        .chain(events)
        .boxed()
}

struct Running {
    base: String,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), mtp_server::ServerError>>,
}

async fn start(llm: Arc<dyn Provider>, config: ServerConfig) -> Running {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(serve_on(listener, llm, config, async {
        let _ = rx.await;
    }));
    Running { base, stop, task }
}

fn words() -> Scripted {
    Scripted::new(&["fn", " main", "()", " {", "}"])
}

async fn post(base: &str, path: &str, body: Value) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// POSTs `body` to `path` and reads the answer as text (a stream's SSE body).
async fn post_text(base: &str, path: &str, body: Value) -> String {
    reqwest::Client::new()
        .post(format!("{base}{path}"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The text of `/metrics`.
async fn metrics(base: &str) -> String {
    reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The `data:` payloads of an SSE body.
fn sse_data(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:")))
        .map(|s| s.trim().to_string())
        .collect()
}

#[tokio::test]
async fn chat_answers_in_openais_shape_with_the_report_and_llama_timings() {
    let srv = start(Arc::new(words()), ServerConfig::new("unused")).await;
    let (status, v) = post(
        &srv.base,
        "/v1/chat/completions",
        json!({"model": "anything", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "scripted-model");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["choices"][0]["message"]["content"], "fn main() {}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["usage"]["completion_tokens"], 5);
    assert_eq!(v["usage"]["total_tokens"], 10);
    assert_eq!(v["speculation"]["used"], true);
    assert_eq!(v["speculation"]["drafted"], 6);
    assert_eq!(v["timings"]["draft_n"], 6);
    assert_eq!(v["timings"]["draft_n_accepted"], 3);
    assert_eq!(v["timings"]["predicted_n"], 5);

    // per request: off
    let (_, off) = post(
        &srv.base,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "hi"}], "speculation": false}),
    )
    .await;
    assert_eq!(off["speculation"]["used"], false);
    assert_eq!(off["speculation"]["reason"], "disabled_by_request");
    assert!(off["timings"].get("draft_n").is_none());
    srv.stop.send(()).unwrap();
    srv.task.await.unwrap().unwrap();
}

#[tokio::test]
async fn bad_requests_are_400s_naming_the_field_and_nothing_runs() {
    let llm = Arc::new(words());
    let calls = Arc::clone(&llm.calls);
    let srv = start(llm, ServerConfig::new("unused")).await;
    let (status, v) = post(
        &srv.base,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "hi"}], "speculation": {"mode": "warp"}}),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(v["error"]["param"], "speculation");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    let contract = Speculation::from_json(&json!({"mode": "warp"})).unwrap_err();
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&contract.to_string()),
        "{v}"
    );
    // garbled JSON
    let r = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", srv.base))
        .header("content-type", "application/json")
        .body("{\"messages\": [")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["param"], "body");
    // require_acceleration with sampling that forces target-only: refused with the reason code
    let (status, v) = post(
        &srv.base,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "hi"}], "repetition_penalty": 1.3,
               "speculation": {"mode": "native_mtp", "require_acceleration": true}}),
    )
    .await;
    assert_eq!(status, 422, "{v}");
    assert_eq!(v["error"]["code"], "sampling_requires_target_only");
    // unknown route
    let r = reqwest::get(format!("{}/v2/nothing", srv.base))
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn an_oversized_body_is_413() {
    let mut cfg = ServerConfig::new("unused");
    cfg.max_body_bytes = 4096;
    let srv = start(Arc::new(words()), cfg).await;
    let big = "x".repeat(8192);
    let (status, v) = post(
        &srv.base,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": big}]}),
    )
    .await;
    assert_eq!(status, 413, "{v}");
    assert_eq!(v["error"]["code"], "body_too_large");
}

#[tokio::test]
async fn streams_end_with_done_and_carry_usage_when_asked() {
    let srv = start(Arc::new(words()), ServerConfig::new("unused")).await;
    let text = post_text(
        &srv.base,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "hi"}], "stream": true,
                      "stream_options": {"include_usage": true}}),
    )
    .await;
    let data = sse_data(&text);
    assert_eq!(data.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let content: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(content, "fn main() {}");
    let last_choice = &chunks[chunks.len() - 2];
    assert_eq!(last_choice["choices"][0]["finish_reason"], "stop");
    assert_eq!(last_choice["timings"]["draft_n"], 6);
    assert_eq!(last_choice["speculation"]["used"], true);
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 5);
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk"));
    // every chunk before the usage chunk says `"usage": null` (OpenAI's and vLLM's shape:
    // clients look the key up on each chunk)
    for c in &chunks[..chunks.len() - 1] {
        assert_eq!(c.get("usage"), Some(&Value::Null), "{c}");
    }

    // completions, streamed
    let text = post_text(
        &srv.base,
        "/v1/completions",
        json!({"prompt": "x", "stream": true, "max_tokens": 2}),
    )
    .await;
    let data = sse_data(&text);
    assert_eq!(data.last().unwrap(), "[DONE]");
    let text: String = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str::<Value>(d).unwrap())
        .filter_map(|c| c["choices"][0]["text"].as_str().map(str::to_string))
        .collect();
    assert_eq!(text, "fn main");
    // without include_usage, no `usage` key on the chunks
    assert!(data[..data.len() - 1]
        .iter()
        .all(|d| serde_json::from_str::<Value>(d)
            .unwrap()
            .get("usage")
            .is_none()));
}

/// `return_progress` (llama-server's field): with `stream`, the prompt's progress goes out as
/// chunks with no choices and a `prompt_progress` object before the reply, on the chat, text
/// and native endpoints; without it, none (the streams above carry none).
#[tokio::test]
async fn streamed_prompt_progress_when_asked() {
    let srv = start(Arc::new(words()), ServerConfig::new("unused")).await;
    let want = json!({"total": 5, "cache": 2, "processed": 5, "time_ms": 3});
    for (path, body) in [
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "stream": true,
                   "return_progress": true}),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "stream": true, "return_progress": true}),
        ),
        (
            "/completion",
            json!({"prompt": "x", "stream": true, "return_progress": true}),
        ),
    ] {
        let text = post_text(&srv.base, path, body).await;
        let chunks: Vec<Value> = sse_data(&text)
            .iter()
            .filter(|d| *d != "[DONE]")
            .map(|d| serde_json::from_str(d).unwrap())
            .collect();
        let at = chunks
            .iter()
            .position(|c| c.get("prompt_progress").is_some())
            .unwrap_or_else(|| panic!("{path}: no prompt_progress in {chunks:?}"));
        assert_eq!(chunks[at]["prompt_progress"], want, "{path}");
        if path == "/completion" {
            assert_eq!(chunks[at]["content"], "", "{path}");
        } else {
            assert_eq!(chunks[at]["choices"], json!([]), "{path}");
        }
        // before any text of the reply
        let first_text = chunks.iter().position(|c| {
            [
                &c["choices"][0]["delta"]["content"],
                &c["choices"][0]["text"],
                &c["content"],
            ]
            .iter()
            .any(|t| t.as_str().is_some_and(|t| !t.is_empty()))
        });
        assert!(first_text.is_some_and(|f| f > at), "{path}: {chunks:?}");
    }
    // not asked for: no progress chunk
    let text = post_text(
        &srv.base,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "hi"}], "stream": true}),
    )
    .await;
    assert!(!text.contains("prompt_progress"), "{text}");
    // a `return_progress` that is not a boolean is the request's fault, named
    let (status, body) = post(
        &srv.base,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "hi"}], "return_progress": "yes"}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.to_string().contains("return_progress"), "{body}");
}

#[tokio::test]
async fn the_key_is_required_where_set() {
    let mut cfg = ServerConfig::new("unused");
    cfg.api_key = Some("s3cret".into());
    let srv = start(Arc::new(words()), cfg).await;
    let c = reqwest::Client::new();
    let body = json!({"messages": [{"role": "user", "content": "hi"}]});
    let r = c
        .post(format!("{}/v1/chat/completions", srv.base))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = c
        .post(format!("{}/v1/chat/completions", srv.base))
        .bearer_auth("s3cres")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let v: Value = r.json().await.unwrap();
    assert!(!v.to_string().contains("s3cret"));
    let r = c
        .post(format!("{}/v1/chat/completions", srv.base))
        .bearer_auth("s3cret")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // health stays open (load balancers probe it)
    assert_eq!(
        reqwest::get(format!("{}/health", srv.base))
            .await
            .unwrap()
            .status(),
        200
    );
}

#[tokio::test]
async fn a_full_queue_answers_429_with_retry_after() {
    let gate = Arc::new(Semaphore::new(0));
    let mut llm = words();
    llm.gate = Some(Arc::clone(&gate));
    let mut cfg = ServerConfig::new("unused");
    cfg.max_queue = 1;
    let srv = start(Arc::new(llm), cfg).await;
    let body = json!({"messages": [{"role": "user", "content": "hi"}]});
    let (b1, b2) = (srv.base.clone(), srv.base.clone());
    let (j1, j2) = (body.clone(), body.clone());
    let first = tokio::spawn(async move { post(&b1, "/v1/chat/completions", j1).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let second = tokio::spawn(async move { post(&b2, "/v1/chat/completions", j2).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let r = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", srv.base))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    assert!(r.headers().get("retry-after").is_some());
    let metrics = metrics(&srv.base).await;
    assert!(metrics.contains("mtp:num_requests_waiting{model_name=\"scripted-model\"} 1"));
    assert!(metrics.contains("mtp:num_requests_running{model_name=\"scripted-model\"} 1"));
    gate.add_permits(1000);
    assert_eq!(first.await.unwrap().0, 200);
    assert_eq!(second.await.unwrap().0, 200);
}

#[tokio::test]
async fn a_client_that_goes_away_cancels_its_generation() {
    let mut llm = words();
    llm.pause = Duration::from_millis(300);
    let dropped = Arc::clone(&llm.dropped_early);
    let srv = start(Arc::new(llm), ServerConfig::new("unused")).await;
    let mut r = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", srv.base))
        .json(&json!({"messages": [{"role": "user", "content": "hi"}], "stream": true}))
        .send()
        .await
        .unwrap();
    // read the first chunk, then hang up
    let _ = r.chunk().await.unwrap();
    drop(r);
    let mut waited = 0;
    while dropped.load(Ordering::SeqCst) == 0 && waited < 50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        waited += 1;
    }
    assert_eq!(
        dropped.load(Ordering::SeqCst),
        1,
        "the provider's stream was not dropped"
    );
    let metrics = metrics(&srv.base).await;
    assert!(metrics.contains("mtp:request_cancelled_total{model_name=\"scripted-model\"} 1"));
    // the next request is served
    let (status, _) = post(
        &srv.base,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn shutdown_finishes_the_stream_in_flight() {
    let mut llm = words();
    llm.pause = Duration::from_millis(100);
    let srv = start(Arc::new(llm), ServerConfig::new("unused")).await;
    let r = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", srv.base))
        .json(&json!({"messages": [{"role": "user", "content": "hi"}], "stream": true}))
        .send()
        .await
        .unwrap();
    srv.stop.send(()).unwrap();
    let text = r.text().await.unwrap();
    assert_eq!(sse_data(&text).last().unwrap(), "[DONE]");
    srv.task.await.unwrap().unwrap();
}

#[tokio::test]
async fn models_metrics_and_props_describe_the_lane() {
    let srv = start(Arc::new(words()), ServerConfig::new("unused")).await;
    let _ = post(
        &srv.base,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    let m: Value = reqwest::get(format!("{}/v1/models", srv.base))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(m["data"][0]["id"], "scripted-model");
    assert_eq!(m["data"][0]["speculation"]["lane_loaded"], true);
    let p: Value = reqwest::get(format!("{}/props", srv.base))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        p["default_generation_settings"]["params"]["speculative.types"],
        "draft-mtp"
    );
    let text = metrics(&srv.base).await;
    for line in [
        "mtp:spec_decode_num_drafts_total{model_name=\"scripted-model\"} 3",
        "mtp:spec_decode_num_draft_tokens_total{model_name=\"scripted-model\"} 6",
        "mtp:spec_decode_num_accepted_tokens_total{model_name=\"scripted-model\"} 3",
        "mtp:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"scripted-model\",position=\"0\"} 3",
        "mtp:generation_tokens_total{model_name=\"scripted-model\"} 5",
        "mtp:request_success_total{model_name=\"scripted-model\"} 1",
    ] {
        assert!(text.contains(line), "missing {line} in\n{text}");
    }
}

/// The `(event, data)` pairs of an SSE body.
fn sse_events(text: &str) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let mut name = String::new();
    for l in text.lines() {
        if let Some(n) = l.strip_prefix("event:") {
            name = n.trim().to_string();
        } else if let Some(d) = l.strip_prefix("data:") {
            out.push((
                std::mem::take(&mut name),
                serde_json::from_str(d.trim()).unwrap(),
            ));
        }
    }
    out
}

fn anthropic_body() -> Value {
    json!({"model": "claude-x", "max_tokens": 64, "system": "Be brief.",
           "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
           "metadata": {"user_id": "u1"}})
}

#[tokio::test]
async fn messages_answer_in_anthropics_shape_whole_and_streamed() {
    let srv = start(Arc::new(words()), ServerConfig::new("unused")).await;
    let (status, v) = post(&srv.base, "/v1/messages", anthropic_body()).await;
    assert_eq!(status, 200, "{v}");
    assert!(v["id"].as_str().unwrap().starts_with("msg_"), "{v}");
    assert_eq!(v["type"], "message");
    assert_eq!(v["role"], "assistant");
    assert_eq!(v["model"], "scripted-model");
    assert_eq!(
        v["content"],
        json!([{"type": "text", "text": "fn main() {}"}])
    );
    assert_eq!(v["stop_reason"], "end_turn");
    assert_eq!(v["stop_sequence"], Value::Null);
    assert_eq!(v["usage"]["input_tokens"], 5);
    assert_eq!(v["usage"]["output_tokens"], 5);
    assert_eq!(v["usage"]["cache_read_input_tokens"], 0);
    assert_eq!(v["speculation"]["used"], true);

    // the token limit: max_tokens
    let mut short = anthropic_body();
    short["max_tokens"] = json!(2);
    let (_, v) = post(&srv.base, "/v1/messages", short).await;
    assert_eq!(v["stop_reason"], "max_tokens", "{v}");
    assert_eq!(v["content"][0]["text"], "fn main");

    // speculation off for one request, as the chat route takes it
    let mut off = anthropic_body();
    off["speculation"] = json!(false);
    let (_, v) = post(&srv.base, "/v1/messages", off).await;
    assert_eq!(v["speculation"]["used"], false, "{v}");
    assert_eq!(v["content"][0]["text"], "fn main() {}");

    // streamed: Anthropic's events in order, each `event:` naming its data's type
    let mut body = anthropic_body();
    body["stream"] = json!(true);
    let text = post_text(&srv.base, "/v1/messages", body).await;
    let events = sse_events(&text);
    for (name, data) in &events {
        assert_eq!(data["type"], name.as_str(), "{text}");
    }
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    let mut want = vec!["message_start", "ping", "content_block_start"];
    want.extend(["content_block_delta"; 5]);
    want.extend(["content_block_stop", "message_delta", "message_stop"]);
    assert_eq!(names, want, "{text}");
    let start = &events[0].1["message"];
    assert!(start["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(start["content"], json!([]));
    assert_eq!(start["stop_reason"], Value::Null);
    // the prompt's size, from the runtime's first progress report
    assert_eq!(start["usage"]["input_tokens"], 3);
    assert_eq!(start["usage"]["cache_read_input_tokens"], 2);
    assert_eq!(
        events[2].1["content_block"],
        json!({"type": "text", "text": ""})
    );
    let joined: String = events
        .iter()
        .filter(|(n, _)| n == "content_block_delta")
        .map(|(_, d)| {
            assert_eq!(d["delta"]["type"], "text_delta");
            assert_eq!(d["index"], 0);
            d["delta"]["text"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(joined, "fn main() {}");
    let delta = &events[events.len() - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], "end_turn");
    assert_eq!(delta["usage"]["output_tokens"], 5);
    assert_eq!(delta["usage"]["input_tokens"], 5);
    assert_eq!(delta["speculation"]["used"], true);

    // count_tokens: the provider's count of the same request, no generation
    let mut count = anthropic_body();
    count.as_object_mut().unwrap().remove("max_tokens");
    let (status, v) = post(&srv.base, "/v1/messages/count_tokens", count).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v, json!({"input_tokens": 5}));
}

#[tokio::test]
async fn messages_errors_take_anthropics_shape() {
    let mut cfg = ServerConfig::new("unused");
    cfg.max_body_bytes = 4096;
    let srv = start(Arc::new(words()), cfg).await;
    let is_error = |v: &Value, kind: &str| {
        assert_eq!(v["type"], "error", "{v}");
        assert_eq!(v["error"]["type"], kind, "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{v}"
        );
    };
    let mut no_max = anthropic_body();
    no_max.as_object_mut().unwrap().remove("max_tokens");
    let (status, v) = post(&srv.base, "/v1/messages", no_max).await;
    assert_eq!(status, 400);
    is_error(&v, "invalid_request_error");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_tokens"),
        "{v}"
    );

    let c = reqwest::Client::new();
    let raw = |path: &str, body: Vec<u8>| {
        c.post(format!("{}{path}", srv.base))
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    for path in ["/v1/messages", "/v1/messages/count_tokens"] {
        let r = raw(path, b"{\"max_tokens\": 5, \"messages\": [".to_vec())
            .await
            .unwrap();
        assert_eq!(r.status(), 400);
        is_error(&r.json().await.unwrap(), "invalid_request_error");
    }
    let mut big = anthropic_body();
    big["system"] = json!("x".repeat(8192));
    let r = raw("/v1/messages", big.to_string().into_bytes())
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    is_error(&r.json().await.unwrap(), "request_too_large");

    let (status, v) = post(&srv.base, "/v1/messages/batches", json!({})).await;
    assert_eq!(status, 404);
    is_error(&v, "not_found_error");

    // an image the server would have to fetch
    let mut url = anthropic_body();
    url["messages"][0]["content"] = json!([{"type": "image",
        "source": {"type": "url", "url": "https://example.invalid/a.png"}}]);
    let (status, v) = post(&srv.base, "/v1/messages", url).await;
    assert_eq!(status, 400);
    is_error(&v, "invalid_request_error");
}

#[tokio::test]
async fn x_api_key_is_taken_beside_bearer_on_every_route() {
    let mut cfg = ServerConfig::new("unused");
    cfg.api_key = Some("s3cret".into());
    let srv = start(Arc::new(words()), cfg).await;
    let c = reqwest::Client::new();
    let send = |path: &str, body: &Value, key: Option<(&'static str, &'static str)>| {
        let mut r = c.post(format!("{}{path}", srv.base)).json(body);
        if let Some((h, v)) = key {
            r = r.header(h, v);
        }
        r.send()
    };
    let chat = json!({"messages": [{"role": "user", "content": "hi"}]});
    let msgs = anthropic_body();
    for (path, body) in [("/v1/chat/completions", &chat), ("/v1/messages", &msgs)] {
        for (key, want) in [
            (None, 401),
            (Some(("x-api-key", "s3cres")), 401),
            (Some(("authorization", "Bearer s3cres")), 401),
            (Some(("x-api-key", "s3cret")), 200),
            (Some(("authorization", "Bearer s3cret")), 200),
        ] {
            let r = send(path, body, key).await.unwrap();
            assert_eq!(r.status().as_u16(), want, "{path} {key:?}");
            let v: Value = r.json().await.unwrap();
            assert!(!v.to_string().contains("s3cret"));
            if want == 401 && path == "/v1/messages" {
                assert_eq!(v["type"], "error", "{v}");
                assert_eq!(v["error"]["type"], "authentication_error", "{v}");
            } else if want == 401 {
                assert_eq!(v["error"]["type"], "authentication_error", "{v}");
                assert_eq!(v["error"]["code"], "invalid_api_key", "{v}");
            }
        }
    }
}

#[tokio::test]
async fn a_full_queue_answers_anthropic_clients_429_rate_limit_error() {
    let gate = Arc::new(Semaphore::new(0));
    let mut llm = words();
    llm.gate = Some(Arc::clone(&gate));
    let mut cfg = ServerConfig::new("unused");
    cfg.max_queue = 0;
    let srv = start(Arc::new(llm), cfg).await;
    let b1 = srv.base.clone();
    let first = tokio::spawn(async move { post(&b1, "/v1/messages", anthropic_body()).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let r = reqwest::Client::new()
        .post(format!("{}/v1/messages", srv.base))
        .json(&anthropic_body())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    assert!(r.headers().contains_key("retry-after"));
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "rate_limit_error", "{v}");
    gate.add_permits(100);
    let (status, v) = first.await.unwrap();
    assert_eq!(status, 200, "{v}");
}

fn responses_body() -> Value {
    json!({"model": "gpt-x", "instructions": "Be brief.", "store": false,
           "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
           "metadata": {"k": "v"}})
}

#[tokio::test]
async fn responses_answer_as_response_objects_whole_and_streamed() {
    let srv = start(Arc::new(words()), ServerConfig::new("unused")).await;
    let (status, v) = post(&srv.base, "/v1/responses", responses_body()).await;
    assert_eq!(status, 200, "{v}");
    let id = v["id"].as_str().unwrap();
    assert!(id.starts_with("resp_"), "{v}");
    assert_eq!(v["object"], "response");
    assert_eq!(v["status"], "completed");
    assert_eq!(v["incomplete_details"], Value::Null);
    assert_eq!(v["error"], Value::Null);
    assert_eq!(v["model"], "scripted-model");
    assert_eq!(v["instructions"], "Be brief.");
    assert_eq!(v["metadata"], json!({"k": "v"}));
    let out = v["output"].as_array().unwrap();
    assert_eq!(out.len(), 1, "{v}");
    assert_eq!(out[0]["type"], "message");
    assert_eq!(out[0]["role"], "assistant");
    assert_eq!(out[0]["status"], "completed");
    assert!(out[0]["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(
        out[0]["content"],
        json!([{"type": "output_text", "text": "fn main() {}", "annotations": [], "logprobs": []}])
    );
    assert_eq!(
        v["usage"],
        json!({"input_tokens": 5, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
               "output_tokens": 5, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 10})
    );
    assert_eq!(v["speculation"]["used"], true);

    // the token limit: incomplete, naming max_output_tokens
    let mut short = responses_body();
    short["max_output_tokens"] = json!(2);
    let (_, v) = post(&srv.base, "/v1/responses", short).await;
    assert_eq!(v["status"], "incomplete", "{v}");
    assert_eq!(
        v["incomplete_details"],
        json!({"reason": "max_output_tokens"})
    );
    assert_eq!(v["max_output_tokens"], 2);
    assert_eq!(v["output"][0]["status"], "incomplete");
    assert_eq!(v["output"][0]["content"][0]["text"], "fn main");

    // speculation off for one request, as the chat route takes it
    let mut off = responses_body();
    off["speculation"] = json!(false);
    let (_, v) = post(&srv.base, "/v1/responses", off).await;
    assert_eq!(v["speculation"]["used"], false, "{v}");

    // streamed: the Responses events in order, numbered, each `event:` naming its data's type
    let mut body = responses_body();
    body["stream"] = json!(true);
    let text = post_text(&srv.base, "/v1/responses", body).await;
    let events = sse_events(&text);
    for (i, (name, data)) in events.iter().enumerate() {
        assert_eq!(data["type"], name.as_str(), "{text}");
        assert_eq!(data["sequence_number"], i, "{text}");
    }
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    let mut want = vec![
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ];
    want.extend(["response.output_text.delta"; 5]);
    want.extend([
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]);
    assert_eq!(names, want, "{text}");
    let created = &events[0].1["response"];
    assert_eq!(created["status"], "in_progress");
    assert_eq!(created["output"], json!([]));
    assert_eq!(created["usage"], Value::Null);
    let added = &events[2].1;
    assert_eq!(added["output_index"], 0);
    assert_eq!(added["item"]["content"], json!([]));
    let item_id = added["item"]["id"].clone();
    let joined: String = events
        .iter()
        .filter(|(n, _)| n == "response.output_text.delta")
        .map(|(_, d)| {
            assert_eq!(
                (&d["item_id"], &d["output_index"], &d["content_index"]),
                (&item_id, &json!(0), &json!(0))
            );
            d["delta"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(joined, "fn main() {}");
    assert_eq!(events[9].1["text"], "fn main() {}");
    let done = &events[events.len() - 1].1["response"];
    assert_eq!(done["id"], created["id"]);
    assert_eq!(done["status"], "completed");
    assert_eq!(done["output"][0]["content"][0]["text"], "fn main() {}");
    assert_eq!(done["output"][0]["id"], item_id);
    assert_eq!(done["usage"]["output_tokens"], 5);
    assert_eq!(done["speculation"]["used"], true);

    // streamed and cut by the token limit: response.incomplete
    let mut body = responses_body();
    body["stream"] = json!(true);
    body["max_output_tokens"] = json!(2);
    let events = sse_events(&post_text(&srv.base, "/v1/responses", body).await);
    let (name, last) = events.last().unwrap();
    assert_eq!(name, "response.incomplete");
    assert_eq!(
        last["response"]["incomplete_details"]["reason"],
        "max_output_tokens"
    );
}

#[tokio::test]
async fn responses_errors_name_the_responses_field() {
    let mut cfg = ServerConfig::new("unused");
    cfg.max_body_bytes = 4096;
    cfg.api_key = Some("k".into());
    let srv = start(Arc::new(words()), cfg).await;
    let send = |body: Value, key: Option<&'static str>| {
        let base = srv.base.clone();
        async move {
            let mut r = reqwest::Client::new()
                .post(format!("{base}/v1/responses"))
                .json(&body);
            if let Some(k) = key {
                r = r.bearer_auth(k);
            }
            let r = r.send().await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    let (status, v) = send(responses_body(), None).await;
    assert_eq!(status, 401, "{v}");
    assert_eq!(v["error"]["code"], "invalid_api_key", "{v}");
    for (k, val, param) in [
        (
            "previous_response_id",
            json!("resp_1"),
            "previous_response_id",
        ),
        ("max_output_tokens", json!(0), "max_output_tokens"),
        ("tools", json!([{"type": "web_search"}]), "tools[0]"),
        ("input", json!([]), "input"),
    ] {
        let mut b = responses_body();
        b[k] = val;
        let (status, v) = send(b, Some("k")).await;
        assert_eq!(status, 400, "{k}: {v}");
        assert_eq!(v["error"]["param"], param, "{v}");
        assert!(v["error"]["message"].as_str().unwrap().contains(k), "{v}");
    }
    let mut big = responses_body();
    big["input"] = json!("x".repeat(5000));
    let (status, v) = send(big, Some("k")).await;
    assert_eq!(status, 413, "{v}");
    // the route is listed where an unknown one is answered
    let r = reqwest::Client::new()
        .get(format!("{}/v1/responses/resp_1", srv.base))
        .bearer_auth("k")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    let v: Value = r.json().await.unwrap();
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("POST /v1/responses"),
        "{v}"
    );
    let _ = srv.stop.send(());
}
