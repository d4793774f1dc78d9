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
mod tokens;

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
    /// The reply's bound for a request that sets none; `None`: to the end of the context.
    pub default_max_tokens: Option<u32>,
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
            default_max_tokens: None,
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
    default_max_tokens: Option<u32>,
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
        default_max_tokens: config.default_max_tokens,
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
        .route("/v1/models/{id}", get(tokens::model))
        .route("/props", get(props))
        .route("/tokenize", post(tokens::tokenize))
        .route("/detokenize", post(tokens::detokenize))
        .route("/tokenizer_info", get(tokens::tokenizer_info))
        .route("/apply-template", post(tokens::apply_template))
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
             POST /v1/messages, POST /v1/messages/count_tokens, POST /v1/responses, \
             GET /v1/models, GET /v1/models/{{id}}, POST /tokenize, POST /detokenize, \
             GET /tokenizer_info, POST /apply-template, GET /health, GET /metrics, and \
             llama-server's POST /completion and GET /props",
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
    Json(oa::ModelList::of(vec![model_entry(&s)]))
}

/// The served model as `/v1/models` lists it, with its context length as vLLM
/// (`max_model_len`) and llama-server (`meta.n_ctx_train`) say it.
fn model_entry(s: &AppState) -> oa::Model {
    let mut extra = serde_json::Map::new();
    if let Some(c) = s.llm.context_length() {
        extra.insert("max_model_len".into(), c.into());
        let mut meta = serde_json::Map::new();
        meta.insert("n_ctx_train".into(), c.into());
        if let Some(v) = s.llm.vocabulary() {
            meta.insert("n_vocab".into(), v.info().vocab_size.into());
        }
        extra.insert("meta".into(), meta.into());
    }
    oa::Model {
        id: s.model_id.clone(),
        object: Some("model".into()),
        created: Some(s.started),
        owned_by: Some("mtp".into()),
        runtime: Some(s.llm.capabilities().runtime),
        speculation: Some(s.llm.speculation_status()),
        extra,
    }
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
    // the context length where llama-server's clients read it
    let mut settings = oa::SpeculativeParams::default();
    if let Some(c) = s.llm.context_length() {
        settings.extra.insert("n_ctx".into(), c.into());
    }
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
            settings,
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
    if parsed.stream && parsed.request.echo {
        s.metrics.rejected();
        return ApiError::unsupported("echo", "`echo` is answered whole: send it without `stream`")
            .into_response();
    }
    let (mut run, first) = match begin(&s, &mut parsed, endpoint, endpoint.id_prefix()).await {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    // every choice's request, with the sampling `begin` settled on
    let rest: Vec<_> = parsed.choice_requests().into_iter().skip(1).collect();
    run.choices = 1 + rest.len();
    run.n = parsed.n;
    run.logprobs = parsed.request.logprobs.is_some();
    run.echo = parsed.request.echo;
    let events = choice_streams(&s, first, rest);
    if parsed.stream {
        stream_response(run, events, parsed.include_usage, parsed.return_tokens).into_response()
    } else {
        whole_response(run, events, parsed.return_tokens).await
    }
}

/// The events of every choice of a request, each tagged with its index: the first choice's
/// stream (opened by [`begin`]) and the others', opened in order. A provider that batches
/// (`max_batch` > 1) runs them side by side as sequences of its batch; one that runs a request
/// at a time runs them one after the other.
type Choices = futures::stream::BoxStream<'static, (usize, Result<StreamEvent, ProviderError>)>;

fn choice_streams(
    s: &Shared,
    first: mtp_contract::EventStream,
    rest: Vec<mtp_contract::GenerateRequest>,
) -> Choices {
    let head = first.map(|e| (0, e)).boxed();
    if rest.is_empty() {
        return head;
    }
    let sh = Arc::clone(s);
    let opened = futures::stream::iter(rest.into_iter().enumerate()).then(move |(k, r)| {
        let sh = Arc::clone(&sh);
        async move {
            let i = k + 1;
            match open_stream(&sh, &r).await {
                Ok(ev) => ev.map(move |e| (i, e)).boxed(),
                Err(e) => futures::stream::once(async move { (i, Err(e)) }).boxed(),
            }
        }
    });
    if s.max_batch > 1 {
        futures::stream::select(head, opened.flatten_unordered(None)).boxed()
    } else {
        head.chain(opened.flatten()).boxed()
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
    if parsed.request.max_output_tokens.is_none() {
        parsed.request.max_output_tokens = s.default_max_tokens;
    }
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
    let events = match open_stream(s, &parsed.request).await {
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
        choices: 1,
        n: 1,
        logprobs: false,
        echo: false,
        pending: HashMap::new(),
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
    request: &mtp_contract::GenerateRequest,
) -> Result<mtp_contract::EventStream, ProviderError> {
    let deadline = Instant::now() + BUSY_WAIT;
    loop {
        match s.llm.generate_stream(request.clone()).await {
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
    /// Choices of the request (prompts times `n`).
    choices: usize,
    /// `n`: choices per prompt.
    n: usize,
    /// The request asked for log probabilities.
    logprobs: bool,
    /// A text completion's `echo`.
    echo: bool,
    /// A streamed choice's log probabilities not sent yet (their tokens' text is held back),
    /// and where its next token's text starts (text completions' `text_offset`).
    pending: HashMap<usize, (Vec<mtp_contract::TokenLogprob>, usize)>,
}

impl Run {
    fn finish(&mut self, r: &GenerateResponse) {
        self.finish_all(std::slice::from_ref(r));
    }

    /// Every choice has ended: each counts as a generation in the metrics.
    fn finish_all(&mut self, rs: &[GenerateResponse]) {
        self.work.done = true;
        let e2e = self.started.elapsed().as_secs_f64();
        for r in rs {
            self.s.metrics.finished(r, e2e);
        }
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

    /// A chat chunk's choice `index`: `delta`, and `finish_reason` (`null` until the end).
    fn delta(index: usize, delta: oa::Delta, finish: Option<&str>) -> oa::Choice {
        oa::Choice {
            index: Some(index as u64),
            delta: Some(delta),
            finish_reason: finish.map(str::to_string),
            ..Default::default()
        }
    }

    /// A text completion's choice `index` (`logprobs: null` unless set after).
    fn text(index: usize, text: &str, finish: Option<&str>) -> oa::Choice {
        oa::Choice {
            index: Some(index as u64),
            text: Some(text.to_string()),
            logprobs: Some(None),
            finish_reason: finish.map(str::to_string),
            ..Default::default()
        }
    }

    /// The log probabilities a streamed chunk of choice `index` carries: those held for it
    /// (the request asked for them), in the endpoint's shape.
    fn take_logprobs(&mut self, index: usize) -> Option<Value> {
        if !self.logprobs {
            return None;
        }
        let (held, offset) = self.pending.entry(index).or_default();
        let lps = std::mem::take(held);
        match self.endpoint {
            Endpoint::Chat => serde_json::to_value(oa::ChatLogprobs::of(&lps)).ok(),
            Endpoint::Completion => {
                let mut c = oa::CompletionLogprobs::default();
                *offset = c.extend(&lps, *offset);
                serde_json::to_value(c).ok()
            }
            Endpoint::Native => None,
        }
    }

    /// The event of new text of choice `index`: a chunk, or llama-server's native object
    /// (`stop: false`).
    fn delta_event(&mut self, index: usize, text: &str, reasoning: &str) -> oa::Completion {
        let logprobs = self.take_logprobs(index);
        let mut choice = match self.endpoint {
            Endpoint::Native => {
                return oa::Completion {
                    content: Some(text.to_string()),
                    stop: Some(false),
                    ..Default::default()
                }
            }
            Endpoint::Chat => Run::delta(
                index,
                oa::Delta {
                    reasoning_content: (!reasoning.is_empty()).then(|| reasoning.to_string()),
                    content: (!text.is_empty()).then(|| text.to_string()),
                    ..Default::default()
                },
                None,
            ),
            Endpoint::Completion => Run::text(index, text, None),
        };
        if logprobs.is_some() {
            choice.logprobs = Some(logprobs);
        }
        self.chunk(Some(choice))
    }

    /// The answer of every choice (`rs[i]` is choice `i`'s).
    fn whole_all(&self, rs: &[GenerateResponse], tokens: bool) -> oa::Completion {
        let [first, ..] = rs else {
            return oa::Completion::default();
        };
        if rs.len() == 1 || self.endpoint == Endpoint::Native {
            return self.whole(0, first, tokens);
        }
        let mut body = self.whole(0, first, tokens);
        body.choices = Some(
            rs.iter()
                .enumerate()
                .map(|(i, r)| {
                    let mut c = self.choice(i, r);
                    // each choice's own report (the top level's is the first choice's)
                    if let Ok(v) = serde_json::to_value(&r.metadata.speculation) {
                        c.extra.insert("speculation".into(), v);
                    }
                    c.into()
                })
                .collect(),
        );
        // prompt tokens once per prompt (its `n` choices share it), reply tokens of all
        let mut u = first.usage;
        u.input_tokens = rs
            .iter()
            .step_by(self.n.max(1))
            .map(|r| r.usage.input_tokens)
            .sum();
        u.cached_input_tokens = rs
            .iter()
            .step_by(self.n.max(1))
            .map(|r| r.usage.cached_input_tokens)
            .sum();
        u.output_tokens = rs.iter().map(|r| r.usage.output_tokens).sum();
        body.usage = Some(Some(oa::Usage::of(&u)));
        body
    }

    fn whole(&self, index: usize, r: &GenerateResponse, tokens: bool) -> oa::Completion {
        if self.endpoint == Endpoint::Native {
            return openai::native_final(r, &self.s.model_id, &r.content, tokens);
        }
        let choice = self.choice(index, r);
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

    /// Choice `index` of a whole answer: the chat message (text, reasoning, tool calls) or the
    /// completion's text (after the prompt's, with `echo`), and its log probabilities.
    fn choice(&self, index: usize, r: &GenerateResponse) -> oa::Choice {
        let finish = openai::finish_reason(r.finish_reason);
        let lps = r.logprobs.as_deref().unwrap_or_default();
        let mut choice = match self.endpoint {
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
                let mut c = oa::Choice {
                    index: Some(index as u64),
                    message: Some(m),
                    finish_reason: Some(finish.into()),
                    ..Default::default()
                };
                if self.logprobs {
                    c.logprobs = Some(serde_json::to_value(oa::ChatLogprobs::of(lps)).ok());
                }
                c
            }
            Endpoint::Completion | Endpoint::Native => {
                let mut c = Run::text(index, &r.content, Some(finish));
                let prompt = r.prompt_logprobs.as_deref().filter(|_| self.echo);
                if let Some(p) = prompt {
                    // the prompt's text as its tokens spell it (token-id prompts too)
                    let bytes: Vec<u8> = p.iter().flat_map(|t| t.bytes.iter().copied()).collect();
                    c.text = Some(String::from_utf8_lossy(&bytes).into_owned() + &r.content);
                }
                if self.logprobs {
                    let mut l = oa::CompletionLogprobs::default();
                    let offset = l.extend(prompt.unwrap_or_default(), 0);
                    l.extend(lps, offset);
                    c.logprobs = Some(serde_json::to_value(l).ok());
                }
                c
            }
        };
        if self.endpoint == Endpoint::Native {
            choice.logprobs = None;
        }
        choice
    }
}

/// The speculation report as response headers, for frameworks that keep the headers of an
/// answer and drop the body fields they do not know: `x-mtp-speculation-used`, and when known
/// `-drafted`, `-accepted`, `-acceptance` (accepted / drafted) and `-reason`.
pub(crate) fn speculation_headers(r: &mtp_contract::SpeculationReport) -> axum::http::HeaderMap {
    let mut h = axum::http::HeaderMap::new();
    let mut put = |k: &'static str, v: String| {
        if let Ok(v) = axum::http::HeaderValue::from_str(&v) {
            h.insert(k, v);
        }
    };
    put("x-mtp-speculation-used", r.used.to_string());
    if let Some(d) = r.drafted {
        put("x-mtp-speculation-drafted", d.to_string());
    }
    if let Some(a) = r.accepted {
        put("x-mtp-speculation-accepted", a.to_string());
    }
    if let Some(a) = r.acceptance_rate {
        put("x-mtp-speculation-acceptance", format!("{a:.4}"));
    }
    if let Some(reason) = r.reason {
        put("x-mtp-speculation-reason", reason.as_str().to_string());
    }
    h
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

/// The provider's final answer of a one-choice request (its other events are not needed for a
/// whole answer), counted as finished, or its error counted as failed.
pub(crate) async fn answer(
    run: &mut Run,
    mut events: mtp_contract::EventStream,
) -> Result<GenerateResponse, ApiError> {
    let e = loop {
        match events.next().await {
            Some(Ok(StreamEvent::Done(r))) => {
                run.finish(&r);
                return Ok(*r);
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => break e,
            // the provider's stream ended without an answer
            None => break ProviderError::Cancelled,
        }
    };
    run.fail(&e);
    Err(ApiError::from_provider(&e))
}

async fn whole_response(mut run: Run, mut events: Choices, tokens: bool) -> Response {
    let mut done: Vec<Option<GenerateResponse>> = vec![None; run.choices];
    while let Some((i, ev)) = events.next().await {
        match ev {
            Ok(
                StreamEvent::Delta { .. }
                | StreamEvent::ToolCall(_)
                | StreamEvent::PromptProgress(_),
            ) => {}
            Ok(StreamEvent::Done(r)) => {
                if let Some(slot) = done.get_mut(i) {
                    *slot = Some(*r);
                }
                if done.iter().all(Option::is_some) {
                    let rs: Vec<GenerateResponse> = done.into_iter().flatten().collect();
                    run.finish_all(&rs);
                    let headers = speculation_headers(&rs[0].metadata.speculation);
                    return (headers, Json(run.whole_all(&rs, tokens))).into_response();
                }
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
    events: Choices,
    include_usage: bool,
    tokens: bool,
) -> Sse<impl Stream<Item = Result<Event, std::convert::Infallible>>> {
    // each choice's final answer, kept for the usage at the end
    let finals: Vec<Option<GenerateResponse>> = vec![None; run.choices];
    let state = (run, events, 0u8, finals);
    let out = futures::stream::unfold(
        state,
        move |(mut run, mut events, phase, mut finals)| async move {
            // phase 0: role chunks; 1: deltas; 2: [DONE]; 3: ended
            match phase {
                0 => {
                    if run.endpoint != Endpoint::Chat {
                        return Some((vec![], (run, events, 1, finals)));
                    }
                    let firsts = (0..run.choices)
                        .map(|i| {
                            data(&run.chunk(Some(Run::delta(
                                i,
                                oa::Delta {
                                    role: Some("assistant".into()),
                                    content: Some(String::new()),
                                    ..Default::default()
                                },
                                None,
                            ))))
                        })
                        .collect();
                    Some((firsts, (run, events, 1, finals)))
                }
                1 => match events.next().await {
                    Some((
                        i,
                        Ok(StreamEvent::Delta {
                            text,
                            reasoning,
                            token_ids,
                            logprobs,
                        }),
                    )) => {
                        if run.logprobs {
                            run.pending.entry(i).or_default().0.extend(logprobs);
                        }
                        let c = if run.endpoint == Endpoint::Native {
                            if text.is_empty() && (!tokens || token_ids.is_empty()) {
                                return Some((vec![], (run, events, 1, finals)));
                            }
                            let mut c = run.delta_event(i, &text, &reasoning);
                            if tokens {
                                c.tokens = Some(token_ids.into_iter().map(u64::from).collect());
                            }
                            c
                        } else if text.is_empty() && reasoning.is_empty() {
                            // (the tokens' log probabilities go with the text they make)
                            return Some((vec![], (run, events, 1, finals)));
                        } else {
                            run.delta_event(i, &text, &reasoning)
                        };
                        Some((vec![data(&c)], (run, events, 1, finals)))
                    }
                    Some((_, Ok(StreamEvent::PromptProgress(p)))) => {
                        if !run.progress {
                            return Some((vec![], (run, events, 1, finals)));
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
                        Some((vec![data(&c)], (run, events, 1, finals)))
                    }
                    Some((i, Ok(StreamEvent::ToolCall(d)))) => {
                        // OpenAI's `delta.tool_calls`: only the chat endpoint has them (a raw
                        // prompt offers no tools)
                        if run.endpoint != Endpoint::Chat {
                            return Some((vec![], (run, events, 1, finals)));
                        }
                        let call = Field::Ok(openai::tool_call_delta(&d));
                        let c = run.chunk(Some(Run::delta(
                            i,
                            oa::Delta {
                                tool_calls: Some(vec![call].into()),
                                ..Default::default()
                            },
                            None,
                        )));
                        Some((vec![data(&c)], (run, events, 1, finals)))
                    }
                    Some((i, Ok(StreamEvent::Done(r)))) => {
                        let finish = openai::finish_reason(r.finish_reason);
                        let logprobs = run.take_logprobs(i);
                        let mut choice = match run.endpoint {
                            Endpoint::Chat => Run::delta(i, oa::Delta::default(), Some(finish)),
                            Endpoint::Completion => Run::text(i, "", Some(finish)),
                            // llama-server's stream ends with its final object, no [DONE]
                            Endpoint::Native => {
                                run.finish(&r);
                                let last = openai::native_final(&r, &run.s.model_id, "", false);
                                return Some((vec![data(&last)], (run, events, 3, finals)));
                            }
                        };
                        if logprobs.is_some() {
                            choice.logprobs = Some(logprobs);
                        }
                        let mut last = run.chunk(Some(choice));
                        extras(&mut last, &r);
                        let mut out = vec![data(&last)];
                        if let Some(slot) = finals.get_mut(i) {
                            *slot = Some(*r);
                        }
                        if !finals.iter().all(Option::is_some) {
                            return Some((out, (run, events, 1, finals)));
                        }
                        let rs: Vec<GenerateResponse> =
                            std::mem::take(&mut finals).into_iter().flatten().collect();
                        run.finish_all(&rs);
                        if include_usage {
                            let mut u = run.chunk(None);
                            u.usage = run.whole_all(&rs, false).usage;
                            out.push(data(&u));
                        }
                        Some((out, (run, events, 2, finals)))
                    }
                    Some((_, Err(e))) => {
                        run.fail(&e);
                        let body = ApiError::from_provider(&e).body();
                        Some((vec![data(&body)], (run, events, 2, finals)))
                    }
                    None => {
                        run.fail(&ProviderError::Cancelled);
                        let body = ApiError::from_provider(&ProviderError::Cancelled).body();
                        Some((vec![data(&body)], (run, events, 2, finals)))
                    }
                },
                2 => Some((
                    vec![Event::default().data("[DONE]")],
                    (run, events, 3, finals),
                )),
                _ => None,
            }
        },
    )
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
