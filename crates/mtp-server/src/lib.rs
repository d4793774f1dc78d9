//! # mtp-server
//!
//! `mtp serve`: an OpenAI-compatible HTTP server (axum on tokio) over any [`Provider`], where
//! each request may turn speculation on or off, or choose its depth, with the contract's
//! `speculation` block, and every answer carries the contract's report (`speculation`) and
//! llama-server's `timings.draft_n` / `timings.draft_n_accepted`, so llama-server clients and
//! our own `llama-server` adapter read real counts.
//!
//! Endpoints: `POST /v1/chat/completions`, `POST /v1/completions` (both with `stream: true` as
//! server-sent events ending in `data: [DONE]`, and `stream_options.include_usage`),
//! `GET /v1/models`, `GET /health`, `GET /metrics` (Prometheus text), and llama-server's
//! native `POST /completion` and `GET /props` (what its clients read to learn whether a drafter
//! is loaded); and Anthropic's Messages API, `POST /v1/messages` (streamed as Anthropic's
//! events) and `POST /v1/messages/count_tokens`, for Claude Code and the `anthropic` SDKs
//! ([`anthropic`]: the same request path as the chat route, answers and errors in Anthropic's
//! shapes); and OpenAI's Responses API, `POST /v1/responses` (streamed as its events), for Codex
//! CLI and the `openai-agents` SDK ([`responses`]: the same request path again, answers as
//! response objects).
//!
//! Requests are admitted up to [`ServerConfig::max_batch`] at once (the provider's own
//! concurrency: 1 for an in-process runtime that generates one sequence at a time); up to
//! [`ServerConfig::max_queue`] more wait their turn, and beyond that the answer is 429 with
//! `Retry-After`. A client that goes away (connection closed, stream dropped) cancels its
//! generation: the provider's stream is dropped and the runtime stops at its next token.
//!
//! ```no_run
//! # async fn demo(llm: std::sync::Arc<dyn mtp_contract::Provider>) -> Result<(), mtp_server::ServerError> {
//! let config = mtp_server::ServerConfig::new("127.0.0.1:8080");
//! mtp_server::serve(llm, config, mtp_server::shutdown_signal()).await
//! # }
//! ```
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod anthropic;
mod conn;
mod error;
mod metrics;
pub mod openai;
pub mod responses;
mod segments;
mod strict;

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::{Stream, StreamExt};
use mtp_contract::{Cancel, GenerateResponse, Provider, ProviderError, StreamEvent};
use mtp_openai::{self as oa, Field};
use serde::Serialize;
use serde_json::Value;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

pub use error::{ApiError, ServerError};
pub use metrics::Metrics;
use openai::{Endpoint, Limits, Parsed};

/// Default request body limit: 16 MiB (a long conversation with tool schemas fits; a runaway
/// upload does not).
pub const DEFAULT_MAX_BODY_BYTES: usize = 16 << 20;
/// Default number of requests that may wait for a slot.
pub const DEFAULT_MAX_QUEUE: usize = 64;
/// Default cap on open connections: far below the usual 1,024 file descriptors of a process,
/// far above what a local server's clients open.
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;
/// Default time a connection has to send a request's headers, from when it opens or from the
/// end of its previous answer (so also the keep-alive idle timeout).
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(15);
/// Default time a request's whole body has to arrive.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(60);
/// Default time a write may make no progress (a client that stopped reading its stream)
/// before the connection is closed and the generation cancelled.
pub const DEFAULT_WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// Default time the requests in flight get to finish after SIGTERM.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
/// How long a request waits for a provider that says it is still busy (the previous request's
/// generation ending after its client went away) before the server answers 503.
const BUSY_WAIT: Duration = Duration::from_secs(30);

/// How the server runs.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// `host:port` to listen on.
    pub addr: String,
    /// The bearer key clients must send; `None` serves everyone.
    pub api_key: Option<String>,
    /// Requests generating at once (the provider's concurrency).
    pub max_batch: usize,
    /// Requests that may wait for a slot before the server answers 429.
    pub max_queue: usize,
    /// The largest request body accepted (413 above it).
    pub max_body_bytes: usize,
    /// The model id shown in `/v1/models` and responses (default: the provider's model).
    pub model_id: Option<String>,
    /// Connections open at once; beyond, a connection is answered 503 and closed.
    pub max_connections: usize,
    /// See [`DEFAULT_HEADER_TIMEOUT`].
    pub header_timeout: Duration,
    /// See [`DEFAULT_BODY_TIMEOUT`] (408 past it).
    pub body_timeout: Duration,
    /// See [`DEFAULT_WRITE_TIMEOUT`].
    pub write_timeout: Duration,
    /// See [`DEFAULT_SHUTDOWN_GRACE`].
    pub shutdown_grace: Duration,
    /// Caps on what one request may hold (stop strings, messages, content parts, tools).
    pub limits: Limits,
}

impl ServerConfig {
    /// Defaults: no key, one request at a time, 64 waiting, 16 MiB bodies, the timeouts and
    /// caps of the `DEFAULT_*` constants and [`Limits::default`].
    pub fn new(addr: impl Into<String>) -> ServerConfig {
        ServerConfig {
            addr: addr.into(),
            api_key: None,
            max_batch: 1,
            max_queue: DEFAULT_MAX_QUEUE,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            model_id: None,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            body_timeout: DEFAULT_BODY_TIMEOUT,
            write_timeout: DEFAULT_WRITE_TIMEOUT,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            limits: Limits::default(),
        }
    }

    fn validate(&self) -> Result<(), ServerError> {
        if self.max_batch == 0 {
            return Err(ServerError::Config {
                setting: "max_batch",
                message: "must be at least 1".into(),
            });
        }
        if self.max_body_bytes < 1024 {
            return Err(ServerError::Config {
                setting: "max_body_bytes",
                message: format!("{} is too small for any request", self.max_body_bytes),
            });
        }
        if self.max_connections == 0 {
            return Err(ServerError::Config {
                setting: "max_connections",
                message: "must be at least 1".into(),
            });
        }
        for (setting, d) in [
            ("header_timeout", self.header_timeout),
            ("body_timeout", self.body_timeout),
            ("write_timeout", self.write_timeout),
        ] {
            if d.is_zero() {
                return Err(ServerError::Config {
                    setting,
                    message: "must be longer than zero".into(),
                });
            }
        }
        if matches!(&self.api_key, Some(k) if k.is_empty()) {
            return Err(ServerError::Config {
                setting: "api_key",
                message: "an empty key would let anyone in; leave it unset instead".into(),
            });
        }
        Ok(())
    }
}

/// The shared state of the handlers.
struct AppState {
    llm: Arc<dyn Provider>,
    model_id: String,
    api_key: Option<String>,
    slots: Arc<Semaphore>,
    max_batch: usize,
    waiting: AtomicUsize,
    max_queue: usize,
    metrics: Arc<Metrics>,
    shutting_down: AtomicBool,
    next_id: AtomicU64,
    started: u64,
    max_body_bytes: usize,
    body_timeout: Duration,
    limits: Limits,
    /// The cancellation of every request being served, by its [`Work`] number: the shutdown
    /// deadline cancels them all.
    live: Mutex<HashMap<u64, Cancel>>,
    next_work: AtomicU64,
}

impl AppState {
    fn live(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Cancel>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Cancels every request being served (the shutdown deadline); returns how many.
    pub(crate) fn cancel_all(&self) -> usize {
        let live = self.live();
        live.values().for_each(Cancel::cancel);
        live.len()
    }
}

type Shared = Arc<AppState>;

/// Serves `llm` until `shutdown` resolves, then finishes the requests in flight (streams
/// included) and returns.
pub async fn serve(
    llm: Arc<dyn Provider>,
    config: ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    let listener = tokio::net::TcpListener::bind(&config.addr)
        .await
        .map_err(|source| ServerError::Bind {
            addr: config.addr.clone(),
            source,
        })?;
    serve_on(listener, llm, config, shutdown).await
}

/// [`serve`] on a listener already bound (tests bind port 0 and read the address).
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    llm: Arc<dyn Provider>,
    config: ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    config.validate()?;
    let (app, state) = app(llm, &config);
    tracing::info!(addr = %listener.local_addr()?, model = %state.model_id, "serving");
    conn::run(listener, app, state, &config, shutdown).await
}

/// Resolves on Ctrl-C (SIGINT) or, on Unix, SIGTERM. The handlers are installed when this is
/// called (inside a tokio runtime), not when the future is first polled, so a signal that
/// arrives while the server starts is not lost.
pub fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let int = signal(SignalKind::interrupt());
        let term = signal(SignalKind::terminate());
        async move {
            match (int, term) {
                (Ok(mut int), Ok(mut term)) => {
                    tokio::select! {
                        _ = int.recv() => {},
                        _ = term.recv() => {},
                    }
                }
                (int, term) => {
                    let e = int
                        .err()
                        .or(term.err())
                        .map(|e| e.to_string())
                        .unwrap_or_default();
                    tracing::warn!("cannot listen for SIGINT/SIGTERM ({e}); waiting for Ctrl-C");
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        }
    }
    #[cfg(not(unix))]
    {
        async {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

fn app(llm: Arc<dyn Provider>, config: &ServerConfig) -> (Router, Shared) {
    let state = Arc::new(AppState {
        model_id: config
            .model_id
            .clone()
            .unwrap_or_else(|| llm.model().to_string()),
        llm,
        api_key: config.api_key.clone(),
        slots: Arc::new(Semaphore::new(config.max_batch)),
        max_batch: config.max_batch,
        waiting: AtomicUsize::new(0),
        max_queue: config.max_queue,
        metrics: Arc::new(Metrics::default()),
        shutting_down: AtomicBool::new(false),
        next_id: AtomicU64::new(1),
        started: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        max_body_bytes: config.max_body_bytes,
        body_timeout: config.body_timeout,
        limits: config.limits.clone(),
        live: Mutex::new(HashMap::new()),
        next_work: AtomicU64::new(0),
    });
    let api = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/messages", post(messages))
        .route("/v1/messages/count_tokens", post(count_tokens))
        .route("/v1/responses", post(responses))
        .route("/completion", post(native_completion))
        .route("/v1/models", get(models))
        .route("/props", get(props))
        .route_layer(middleware::from_fn_with_state(Arc::clone(&state), auth));
    let app = Router::new()
        .merge(api)
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(config.max_body_bytes))
        .layer(middleware::from_fn(framing))
        .with_state(Arc::clone(&state));
    (app, state)
}

/// Requests whose framing another HTTP reader could take differently are refused before any
/// handler reads them, and their connection closed (RFC 9112 §3.2: an HTTP/1.1 request
/// without `Host` is a 400; §6.1: `chunked` applied twice is not a framing this server
/// reads, and a proxy in front may read the body's end elsewhere).
async fn framing(req: Request, next: Next) -> Response {
    let refuse = |message: &str| {
        let mut r = ApiError::invalid("headers", message.to_string()).into_response();
        r.headers_mut().insert(
            header::CONNECTION,
            header::HeaderValue::from_static("close"),
        );
        r
    };
    if req.version() == axum::http::Version::HTTP_11 && !req.headers().contains_key(header::HOST) {
        return refuse("an HTTP/1.1 request must carry a Host header");
    }
    let chunked = req
        .headers()
        .get_all(header::TRANSFER_ENCODING)
        .iter()
        .flat_map(|v| v.to_str().unwrap_or("").split(','))
        .filter(|c| c.trim().eq_ignore_ascii_case("chunked"))
        .count();
    if chunked > 1 {
        return refuse("Transfer-Encoding names `chunked` more than once");
    }
    next.run(req).await
}

/// Key check, in constant time over the key's bytes: `Authorization: Bearer KEY` (OpenAI's
/// clients) or `x-api-key: KEY` (Anthropic's), on every route. The key is never logged.
async fn auth(State(s): State<Shared>, req: Request, next: Next) -> Response {
    if let Some(key) = &s.api_key {
        let headers = req.headers();
        let bearer_key = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer);
        let x_api_key = headers.get("x-api-key").and_then(|v| v.to_str().ok());
        // both compared, whichever is sent, so the time taken says nothing of which matched
        let ok = [bearer_key, x_api_key]
            .map(|sent| key_matches(key, sent.unwrap_or("")))
            .contains(&true);
        if !ok {
            s.metrics.rejected();
            let e = ApiError::unauthorized();
            if is_anthropic(req.uri().path()) {
                return anthropic::error(e);
            }
            return e.into_response();
        }
    }
    next.run(req).await
}

/// Whether a path is one of Anthropic's routes, whose errors take Anthropic's shape.
fn is_anthropic(path: &str) -> bool {
    path == "/v1/messages" || path.starts_with("/v1/messages/")
}

/// The credentials of an `Authorization: Bearer ...` header (the scheme is case-insensitive,
/// RFC 9110 §11.1).
fn bearer(header: &str) -> Option<&str> {
    let (scheme, rest) = header.trim_start().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| rest.trim_matches(' '))
}

/// Constant-time in the key's content (the length of the expected key is not secret).
fn key_matches(expected: &str, sent: &str) -> bool {
    use subtle::ConstantTimeEq;
    expected.len() == sent.len() && bool::from(expected.as_bytes().ct_eq(sent.as_bytes()))
}

/// `ok`, or 503 while the server drains after SIGTERM (what load balancers take as "send no
/// more").
async fn health(State(s): State<Shared>) -> Response {
    if s.shutting_down.load(Ordering::SeqCst) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(oa::Health::new("shutting_down")),
        )
            .into_response();
    }
    Json(oa::Health::new("ok")).into_response()
}

async fn not_found(req: Request) -> Response {
    let e = ApiError {
        status: StatusCode::NOT_FOUND,
        kind: "invalid_request_error",
        param: None,
        code: Some("not_found".into()),
        message: format!(
            "no route {} {}: this server answers POST /v1/chat/completions, POST /v1/completions, \
             POST /v1/messages, POST /v1/messages/count_tokens, POST /v1/responses, GET /v1/models, GET /health, \
             GET /metrics, and llama-server's POST /completion and GET /props",
            req.method(),
            req.uri().path()
        ),
        retry_after: None,
    };
    if is_anthropic(req.uri().path()) {
        return anthropic::error(e);
    }
    e.into_response()
}

async fn metrics(State(s): State<Shared>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        s.metrics.render(&s.model_id),
    )
}

async fn models(State(s): State<Shared>) -> Json<oa::ModelList> {
    Json(oa::ModelList::of(vec![oa::Model {
        id: s.model_id.clone(),
        object: Some("model".into()),
        created: Some(s.started),
        owned_by: Some("mtp".into()),
        runtime: Some(s.llm.capabilities().runtime),
        speculation: Some(s.llm.speculation_status()),
        extra: Default::default(),
    }]))
}

/// llama-server's `/props`, the part its clients read: whether a drafter is loaded
/// (`speculative.types`) and its depth, the slots and the model.
async fn props(State(s): State<Shared>) -> Json<oa::Props> {
    let status = s.llm.speculation_status();
    let types = if status.lane_loaded {
        "draft-mtp"
    } else {
        "none"
    };
    Json(oa::Props {
        model_path: Some(s.model_id.clone()),
        build_info: Some(format!("mtp-server {}", env!("CARGO_PKG_VERSION"))),
        total_slots: Some(s.max_batch as u64),
        default_generation_settings: Some(oa::GenerationSettings {
            params: Some(oa::SpeculativeParams {
                types: Some(oa::SpeculativeTypes::Text(types.into())),
                n_max: Some(status.num_draft_tokens.map(u64::from)),
                ..Default::default()
            }),
            settings: Default::default(),
        }),
        extra: Default::default(),
    })
}

async fn chat(State(s): State<Shared>, body: Body) -> Response {
    handle(s, Endpoint::Chat, body).await
}

async fn completions(State(s): State<Shared>, body: Body) -> Response {
    handle(s, Endpoint::Completion, body).await
}

async fn native_completion(State(s): State<Shared>, body: Body) -> Response {
    handle(s, Endpoint::Native, body).await
}

/// Reads and checks the body, waits for a slot, and answers whole or as a stream.
async fn handle(s: Shared, endpoint: Endpoint, body: Body) -> Response {
    let body = read_body(&s, body).await;
    let mut parsed = match body.and_then(|v| openai::parse(endpoint, &v, &s.limits)) {
        Ok(p) => p,
        Err(e) => {
            s.metrics.rejected();
            return e.into_response();
        }
    };
    let (run, events) = match begin(&s, &mut parsed, endpoint, endpoint.id_prefix()).await {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    if parsed.stream {
        stream_response(run, events, parsed.include_usage, parsed.return_tokens).into_response()
    } else {
        whole_response(run, events, parsed.return_tokens).await
    }
}

/// Anthropic's Messages: the chat route's request path, Anthropic's answers and errors.
async fn messages(State(s): State<Shared>, body: Body) -> Response {
    let body = read_body(&s, body).await;
    let mut parsed = match body.and_then(|v| anthropic::parse(&v, &s.limits, false)) {
        Ok(p) => p,
        Err(e) => {
            s.metrics.rejected();
            return anthropic::error(e);
        }
    };
    let (run, events) = match begin(&s, &mut parsed, Endpoint::Chat, "msg_").await {
        Ok(r) => r,
        Err(e) => return anthropic::error(e),
    };
    if parsed.stream {
        anthropic::stream(run, events).into_response()
    } else {
        anthropic::whole(run, events).await
    }
}

/// OpenAI's Responses API: the chat route's request path, answers as response objects.
async fn responses(State(s): State<Shared>, body: Body) -> Response {
    let body = read_body(&s, body).await;
    let (mut parsed, echo) = match body.and_then(|v| responses::parse(&v, &s.limits)) {
        Ok(p) => p,
        Err(e) => {
            s.metrics.rejected();
            return responses::error(e);
        }
    };
    let (run, events) = match begin(&s, &mut parsed, Endpoint::Chat, "resp_").await {
        Ok(r) => r,
        Err(e) => return responses::error(e),
    };
    if parsed.stream {
        responses::stream(run, events, echo).into_response()
    } else {
        responses::whole(run, events, echo).await
    }
}

/// Anthropic's `count_tokens`: the prompt the same body would be given to the model as,
/// rendered and tokenized by the provider, with no generation (so no slot is taken: it waits
/// behind no generation).
async fn count_tokens(State(s): State<Shared>, body: Body) -> Response {
    let body = read_body(&s, body).await;
    let parsed = match body.and_then(|v| anthropic::parse(&v, &s.limits, true)) {
        Ok(p) => p,
        Err(e) => {
            s.metrics.rejected();
            return anthropic::error(e);
        }
    };
    if s.shutting_down.load(Ordering::SeqCst) {
        return anthropic::error(ApiError::shutting_down());
    }
    // no slot, but cancelled like any request when its client leaves or the server stops
    let mut work = Work::new(&s, parsed.request.cancel.clone());
    let counted = s.llm.count_tokens(parsed.request).await;
    work.done = true;
    match counted {
        Ok(n) => Json(mtp_openai::anthropic::TokenCount { input_tokens: n }).into_response(),
        Err(e) => anthropic::error(ApiError::from_provider(&e)),
    }
}

/// What every generating route does once its body is read: the recommended sampling where
/// none was chosen, admission (a slot, the queue, or 429), the provider's stream, and the
/// [`Run`] that holds the slot and counts the request; its errors are counted.
async fn begin(
    s: &Shared,
    parsed: &mut Parsed,
    endpoint: Endpoint,
    id_prefix: &str,
) -> Result<(Run, mtp_contract::EventStream), ApiError> {
    // no decoding chosen: the model's generation_config.json, as vLLM serves it
    let recommended = s.llm.recommended_sampling();
    parsed.request.sampling = std::mem::take(&mut parsed.request.sampling)
        .or_recommended(recommended.as_ref())
        .0;
    if s.shutting_down.load(Ordering::SeqCst) {
        s.metrics.rejected();
        return Err(ApiError::shutting_down());
    }
    // from here to its last byte the request is cancelled when dropped unfinished
    let mut work = Work::new(s, parsed.request.cancel.clone());
    match admit(s).await {
        Ok(p) => work.admitted(p),
        Err(e) => {
            work.done = true;
            s.metrics.rejected();
            return Err(e);
        }
    };
    let started = Instant::now();
    let events = match open_stream(s, parsed).await {
        Ok(ev) => ev,
        Err(e) => {
            // the request's own fault (too long, a bad constraint, a lane it requires) is a
            // refusal, not a failure of the server
            work.done = true;
            s.metrics.errored(&e);
            return Err(ApiError::from_provider(&e));
        }
    };
    let id = format!("{id_prefix}{}", s.next_id.fetch_add(1, Ordering::Relaxed));
    let run = Run {
        s: Arc::clone(s),
        endpoint,
        id,
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        started,
        usage_nulls: parsed.stream && parsed.include_usage,
        progress: parsed.return_progress,
        work,
    };
    Ok((run, events))
}

/// The body as JSON: whole within `--body-timeout` (408), at most `--max-body-bytes` (413).
async fn read_body(s: &AppState, body: Body) -> Result<Value, ApiError> {
    let read = axum::body::to_bytes(body, s.max_body_bytes);
    let bytes = match tokio::time::timeout(s.body_timeout, read).await {
        Err(_) => return Err(ApiError::body_timeout(s.body_timeout)),
        Ok(Ok(b)) => b,
        Ok(Err(e)) if is_length_limit(&e) => {
            return Err(ApiError {
                status: StatusCode::PAYLOAD_TOO_LARGE,
                code: Some("body_too_large".into()),
                ..ApiError::invalid(
                    "body",
                    format!(
                        "the request body is over this server's limit of {} bytes \
                         (--max-body-bytes)",
                        s.max_body_bytes
                    ),
                )
            })
        }
        Ok(Err(e)) => return Err(ApiError::invalid("body", format!("unreadable body: {e}"))),
    };
    strict::from_slice(&bytes)
        .map_err(|e| ApiError::invalid("body", format!("the body is not valid JSON: {e}")))
}

/// Whether reading a body failed on the size limit (axum's `LengthLimitError`, under its
/// error's sources).
fn is_length_limit(e: &axum::Error) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if err.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        cur = err.source();
    }
    false
}

/// A slot now, or a place in the queue, or 429.
async fn admit(s: &Shared) -> Result<OwnedSemaphorePermit, ApiError> {
    if let Ok(p) = Arc::clone(&s.slots).try_acquire_owned() {
        return Ok(p);
    }
    let queued = s.waiting.fetch_add(1, Ordering::SeqCst);
    struct Leave<'a>(&'a AtomicUsize);
    impl Drop for Leave<'_> {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }
    let _leave = Leave(&s.waiting);
    if queued >= s.max_queue {
        // about as long as the requests ahead take, at the mean latency seen so far
        let mean = s.metrics.mean_latency_s().unwrap_or(1.0);
        let ahead = (queued + 1) as f64 / s.max_batch as f64;
        return Err(ApiError::queue_full(
            s.max_queue,
            (mean * ahead).ceil().clamp(1.0, 3600.0) as u64,
        ));
    }
    let _gauge = s.metrics.waiting();
    Arc::clone(&s.slots)
        .acquire_owned()
        .await
        .map_err(|_| ApiError::shutting_down())
}

/// The provider's stream, waiting out a provider that is still finishing a cancelled request.
async fn open_stream(
    s: &Shared,
    parsed: &Parsed,
) -> Result<mtp_contract::EventStream, ProviderError> {
    let deadline = Instant::now() + BUSY_WAIT;
    loop {
        match s.llm.generate_stream(parsed.request.clone()).await {
            Err(ProviderError::Busy { .. }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            other => return other,
        }
    }
}

/// One request's hold on the server, from when its body has been read to its last byte: its
/// cancellation token, its slot once admitted, its count among the running requests.
///
/// Dropped before `done` (the client went away, a write timed out, the shutdown deadline cut
/// the connection) it cancels the request, counts it as cancelled, and keeps the slot and the
/// running count until the work has really stopped ([`Cancel::idle`]): rendering, tokenizing
/// or a prefill that is still running on a blocking thread never runs beside the request
/// admitted in its place.
struct Work {
    s: Shared,
    key: u64,
    cancel: Cancel,
    permit: Option<OwnedSemaphorePermit>,
    done: bool,
}

impl Work {
    fn new(s: &Shared, cancel: Cancel) -> Work {
        let key = s.next_work.fetch_add(1, Ordering::Relaxed);
        s.live().insert(key, cancel.clone());
        Work {
            s: Arc::clone(s),
            key,
            cancel,
            permit: None,
            done: false,
        }
    }

    /// The request has a slot: it counts as running from now on (its prompt is prepared and
    /// computed in that slot).
    fn admitted(&mut self, permit: OwnedSemaphorePermit) {
        self.s.metrics.start_running();
        self.permit = Some(permit);
    }
}

impl Drop for Work {
    fn drop(&mut self) {
        let stopping = !self.done;
        if stopping {
            tracing::debug!(work = self.key, "client went away; request cancelled");
            self.cancel.cancel();
            self.s.metrics.cancelled();
        }
        let (s, key, permit) = (Arc::clone(&self.s), self.key, self.permit.take());
        let release = move |counted_stopping: bool| {
            s.live().remove(&key);
            if permit.is_some() {
                s.metrics.stop_running();
            }
            if counted_stopping {
                s.metrics.stopped_cancelling();
            }
            drop(permit);
        };
        if self.cancel.is_idle() {
            return release(false);
        }
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                if stopping {
                    self.s.metrics.start_cancelling();
                }
                let idle = self.cancel.idle();
                rt.spawn(async move {
                    idle.await;
                    release(stopping);
                });
            }
            Err(_) => release(false),
        }
    }
}

/// One admitted request's answer: what its chunks carry, and its [`Work`].
struct Run {
    s: Shared,
    endpoint: Endpoint,
    id: String,
    created: u64,
    started: Instant,
    /// `stream_options.include_usage`: every chunk carries `"usage": null` until the last
    /// one's usage, as OpenAI and vLLM send it (clients read the key on every chunk).
    usage_nulls: bool,
    /// `return_progress`: the prompt's progress goes out as chunks with no choices and a
    /// `prompt_progress` object, as llama-server sends them.
    progress: bool,
    work: Work,
}

impl Run {
    fn finish(&mut self, r: &GenerateResponse) {
        self.work.done = true;
        self.s
            .metrics
            .finished(r, self.started.elapsed().as_secs_f64());
    }

    fn fail(&mut self, e: &ProviderError) {
        self.work.done = true;
        self.s.metrics.errored(e);
    }

    /// The chunk of a stream carrying `choice` (`"usage": null` under `include_usage`).
    fn chunk(&self, choice: Option<oa::Choice>) -> oa::Completion {
        oa::Completion {
            id: Some(self.id.clone()),
            object: Some(self.endpoint.object(true).into()),
            created: Some(self.created),
            model: Some(self.s.model_id.clone()),
            choices: Some(choice.into_iter().map(Field::Ok).collect()),
            usage: self.usage_nulls.then_some(None),
            ..Default::default()
        }
    }

    /// A chat chunk's choice: `delta`, and `finish_reason` (`null` until the end).
    fn delta(delta: oa::Delta, finish: Option<&str>) -> oa::Choice {
        oa::Choice {
            index: Some(0),
            delta: Some(delta),
            finish_reason: finish.map(str::to_string),
            ..Default::default()
        }
    }

    /// A text completion's choice (`logprobs: null`).
    fn text(text: &str, finish: Option<&str>) -> oa::Choice {
        oa::Choice {
            index: Some(0),
            text: Some(text.to_string()),
            logprobs: Some(None),
            finish_reason: finish.map(str::to_string),
            ..Default::default()
        }
    }

    /// The event of new text: a chunk, or llama-server's native object (`stop: false`).
    fn delta_event(&self, text: &str, reasoning: &str) -> oa::Completion {
        match self.endpoint {
            Endpoint::Native => oa::Completion {
                content: Some(text.to_string()),
                stop: Some(false),
                ..Default::default()
            },
            Endpoint::Chat => self.chunk(Some(Run::delta(
                oa::Delta {
                    reasoning_content: (!reasoning.is_empty()).then(|| reasoning.to_string()),
                    content: (!text.is_empty()).then(|| text.to_string()),
                    ..Default::default()
                },
                None,
            ))),
            Endpoint::Completion => self.chunk(Some(Run::text(text, None))),
        }
    }

    fn whole(&self, r: &GenerateResponse, tokens: bool) -> oa::Completion {
        if self.endpoint == Endpoint::Native {
            return openai::native_final(r, &self.s.model_id, &r.content, tokens);
        }
        let finish = openai::finish_reason(r.finish_reason);
        let choice = match self.endpoint {
            Endpoint::Chat => {
                let mut m = oa::ChatMessage::text("assistant", r.content.clone());
                m.reasoning_content = r.reasoning_content.clone().map(Field::Ok);
                if !r.tool_calls.is_empty() {
                    // OpenAI: `content` is null when the reply is only calls
                    if r.content.is_empty() {
                        m.content = None;
                    }
                    let calls = openai::tool_calls(&r.tool_calls);
                    m.tool_calls =
                        Some(calls.into_iter().map(Field::Ok).collect::<Vec<_>>().into());
                }
                oa::Choice {
                    index: Some(0),
                    message: Some(m),
                    finish_reason: Some(finish.into()),
                    ..Default::default()
                }
            }
            Endpoint::Completion | Endpoint::Native => Run::text(&r.content, Some(finish)),
        };
        let mut body = oa::Completion {
            id: Some(self.id.clone()),
            object: Some(self.endpoint.object(false).into()),
            created: Some(self.created),
            model: Some(self.s.model_id.clone()),
            choices: Some(vec![choice.into()]),
            usage: Some(Some(openai::usage(r))),
            ..Default::default()
        };
        extras(&mut body, r);
        body
    }
}

/// What this server adds to OpenAI's shapes: the contract's report, llama-server's timings,
/// and warnings.
fn extras(body: &mut oa::Completion, r: &GenerateResponse) {
    body.timings = Some(openai::timings(r));
    body.speculation = Some(r.metadata.speculation.clone());
    if !r.warnings.is_empty() {
        body.warnings = Some(r.warnings.clone());
    }
}

/// One SSE event holding `v` as JSON.
fn data<T: Serialize>(v: &T) -> Event {
    Event::default().data(serde_json::to_string(v).unwrap_or_else(|_| "{}".into()))
}

async fn whole_response(
    mut run: Run,
    mut events: mtp_contract::EventStream,
    tokens: bool,
) -> Response {
    while let Some(ev) = events.next().await {
        match ev {
            Ok(
                StreamEvent::Delta { .. }
                | StreamEvent::ToolCall(_)
                | StreamEvent::PromptProgress(_),
            ) => {}
            Ok(StreamEvent::Done(r)) => {
                run.finish(&r);
                return Json(run.whole(&r, tokens)).into_response();
            }
            Err(e) => {
                run.fail(&e);
                return ApiError::from_provider(&e).into_response();
            }
        }
    }
    run.fail(&ProviderError::Cancelled);
    ApiError::from_provider(&ProviderError::Cancelled).into_response()
}

fn stream_response(
    run: Run,
    events: mtp_contract::EventStream,
    include_usage: bool,
    tokens: bool,
) -> Sse<impl Stream<Item = Result<Event, std::convert::Infallible>>> {
    let state = (run, events, 0u8);
    let out = futures::stream::unfold(state, move |(mut run, mut events, phase)| async move {
        // phase 0: role chunk; 1: deltas; 2: [DONE]; 3: ended
        match phase {
            0 => {
                let first = match run.endpoint {
                    Endpoint::Chat => run.chunk(Some(Run::delta(
                        oa::Delta {
                            role: Some("assistant".into()),
                            content: Some(String::new()),
                            ..Default::default()
                        },
                        None,
                    ))),
                    Endpoint::Completion | Endpoint::Native => {
                        return Some((vec![], (run, events, 1)));
                    }
                };
                Some((vec![data(&first)], (run, events, 1)))
            }
            1 => match events.next().await {
                Some(Ok(StreamEvent::Delta {
                    text,
                    reasoning,
                    token_ids,
                })) => {
                    let c = if run.endpoint == Endpoint::Native {
                        if text.is_empty() && (!tokens || token_ids.is_empty()) {
                            return Some((vec![], (run, events, 1)));
                        }
                        let mut c = run.delta_event(&text, &reasoning);
                        if tokens {
                            c.tokens = Some(token_ids.into_iter().map(u64::from).collect());
                        }
                        c
                    } else if text.is_empty() && reasoning.is_empty() {
                        return Some((vec![], (run, events, 1)));
                    } else {
                        run.delta_event(&text, &reasoning)
                    };
                    Some((vec![data(&c)], (run, events, 1)))
                }
                Some(Ok(StreamEvent::PromptProgress(p))) => {
                    if !run.progress {
                        return Some((vec![], (run, events, 1)));
                    }
                    let mut c = match run.endpoint {
                        // llama-server's native stream: an object with empty content
                        Endpoint::Native => oa::Completion {
                            content: Some(String::new()),
                            stop: Some(false),
                            ..Default::default()
                        },
                        Endpoint::Chat | Endpoint::Completion => run.chunk(None),
                    };
                    c.prompt_progress = Some(p);
                    Some((vec![data(&c)], (run, events, 1)))
                }
                Some(Ok(StreamEvent::ToolCall(d))) => {
                    // OpenAI's `delta.tool_calls`: only the chat endpoint has them (a raw
                    // prompt offers no tools)
                    if run.endpoint != Endpoint::Chat {
                        return Some((vec![], (run, events, 1)));
                    }
                    let call = Field::Ok(openai::tool_call_delta(&d));
                    let c = run.chunk(Some(Run::delta(
                        oa::Delta {
                            tool_calls: Some(vec![call].into()),
                            ..Default::default()
                        },
                        None,
                    )));
                    Some((vec![data(&c)], (run, events, 1)))
                }
                Some(Ok(StreamEvent::Done(r))) => {
                    run.finish(&r);
                    let finish = openai::finish_reason(r.finish_reason);
                    let mut last = match run.endpoint {
                        Endpoint::Chat => {
                            run.chunk(Some(Run::delta(oa::Delta::default(), Some(finish))))
                        }
                        Endpoint::Completion => run.chunk(Some(Run::text("", Some(finish)))),
                        // llama-server's stream ends with its final object, no [DONE]
                        Endpoint::Native => {
                            let last = openai::native_final(&r, &run.s.model_id, "", false);
                            return Some((vec![data(&last)], (run, events, 3)));
                        }
                    };
                    extras(&mut last, &r);
                    let mut out = vec![data(&last)];
                    if include_usage {
                        let mut u = run.chunk(None);
                        u.usage = Some(Some(openai::usage(&r)));
                        out.push(data(&u));
                    }
                    Some((out, (run, events, 2)))
                }
                Some(Err(e)) => {
                    run.fail(&e);
                    let body = ApiError::from_provider(&e).body();
                    Some((vec![data(&body)], (run, events, 2)))
                }
                None => {
                    run.fail(&ProviderError::Cancelled);
                    let body = ApiError::from_provider(&ProviderError::Cancelled).body();
                    Some((vec![data(&body)], (run, events, 2)))
                }
            },
            2 => Some((vec![Event::default().data("[DONE]")], (run, events, 3))),
            _ => None,
        }
    })
    .flat_map(|evs| futures::stream::iter(evs.into_iter().map(Ok)));
    Sse::new(out).keep_alive(KeepAlive::default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_compare_whole() {
        assert!(key_matches("secret", "secret"));
        assert!(!key_matches("secret", "secre"));
        assert!(!key_matches("secret", "secret2"));
        assert!(!key_matches("secret", ""));
    }

    #[test]
    fn settings_are_checked() {
        let mut c = ServerConfig::new("127.0.0.1:0");
        c.max_batch = 0;
        assert!(matches!(
            c.validate(),
            Err(ServerError::Config {
                setting: "max_batch",
                ..
            })
        ));
        let mut c = ServerConfig::new("127.0.0.1:0");
        c.api_key = Some(String::new());
        assert!(c.validate().is_err());
    }
}
