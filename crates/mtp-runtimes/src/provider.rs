//! [`HttpProvider`]: the [`Provider`] implementation shared by every server kind.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::stream::BoxStream;
use futures::StreamExt;
use mtp_contract::{
    resolve, Capabilities, EventStream, FinishReason, GenerateRequest, GenerateResponse, Metadata,
    Provider, ProviderError, ProviderOptions, Reason, ResolvedSpeculation, Speculation,
    SpeculationStatus, StreamEvent, Usage,
};
use serde_json::Value;

use crate::evidence::{self, Evidence, ServerSpec};
use crate::http::{truncate, BodyRead, Transport};
use crate::options::{HttpOptions, MetricsMode, ServerKind};
use crate::prometheus::Metrics;
use crate::sse::SseParser;
use crate::wire::{self, Absorb, Accum, Endpoint};

/// An adapter for one model on one HTTP server.
///
/// Construct it with [`HttpProvider::new`] (or the crate's [`create`](crate::create)); it
/// does no I/O until the first call.
///
/// ```
/// use mtp_contract::{Provider, ProviderOptions};
/// use mtp_runtimes::{HttpProvider, ServerKind};
/// let p = HttpProvider::new(ServerKind::Vllm, "Qwen/Qwen3-8B", &ProviderOptions::default()).unwrap();
/// assert_eq!(p.name(), "vllm");
/// assert!(!p.capabilities().per_request_speculation);
/// ```
#[derive(Clone)]
pub struct HttpProvider {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for HttpProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpProvider")
            .field("kind", &self.inner.t.kind)
            .field("model", &self.inner.t.model)
            .field("options", &self.inner.t.opts)
            .finish()
    }
}

struct Inner {
    t: Transport,
    default: Option<Speculation>,
    /// The last server settings seen (for `speculation_status`).
    last_spec: Mutex<Option<ServerSpec>>,
    /// `/metrics` answered "not here" once; stop asking (metrics = auto).
    metrics_absent: AtomicBool,
    in_flight: AtomicUsize,
    unloaded: AtomicBool,
}

/// What is known before the request is sent.
struct Prepared {
    resolved: ResolvedSpeculation,
    spec: ServerSpec,
    metrics_before: Option<Metrics>,
    endpoint: Endpoint,
    body: mtp_openai::ChatCompletionRequest,
    started: Instant,
    /// The request's constraint, checked against the finished reply.
    format: Option<mtp_contract::ResponseFormat>,
    /// The constraint was asked for in the prompt, not sent (`wire::prompted`).
    prompted: bool,
    /// `parallel_tool_calls: false` with tools offered: keep the first call only.
    single_call: bool,
}

impl HttpProvider {
    /// An adapter for `model` on a server of `kind`, with settings from `opts` (see
    /// [`HttpOptions`] for the `extra` keys). Fails on an empty model name, a bad base URL,
    /// or an unknown option.
    pub fn new(
        kind: ServerKind,
        model: &str,
        opts: &ProviderOptions,
    ) -> Result<HttpProvider, ProviderError> {
        let http = HttpOptions::from_provider_options(kind, opts)?;
        Self::build(kind, model, opts, http)
    }

    /// An adapter with its settings typed: `opts` carries what every provider shares (the
    /// speculation block); an `extra` string, a `base_url` or an `api_key` there would be
    /// ignored beside `http`, so any is refused. `http` is held to the ranges the strings are
    /// read with ([`HttpOptions::checked`]).
    pub fn with_options(
        kind: ServerKind,
        model: &str,
        opts: &ProviderOptions,
        http: HttpOptions,
    ) -> Result<HttpProvider, ProviderError> {
        opts.refuse_extra("HttpOptions")?;
        for (key, given) in [
            ("base_url", opts.base_url.is_some()),
            ("api_key", opts.api_key.is_some()),
        ] {
            if given {
                return Err(mtp_contract::OptionError::BesideTyped {
                    key: key.into(),
                    typed: "HttpOptions".into(),
                }
                .into());
            }
        }
        Self::build(kind, model, opts, http.checked()?)
    }

    fn build(
        kind: ServerKind,
        model: &str,
        opts: &ProviderOptions,
        http: HttpOptions,
    ) -> Result<HttpProvider, ProviderError> {
        if model.trim().is_empty() {
            return Err(ProviderError::InvalidRequest {
                field: "model",
                message: format!("the {kind} provider needs the model name the server serves"),
            });
        }
        Ok(HttpProvider {
            inner: Arc::new(Inner {
                t: Transport::new(kind, model.to_string(), http)?,
                default: opts.speculation.clone(),
                last_spec: Mutex::new(None),
                metrics_absent: AtomicBool::new(false),
                in_flight: AtomicUsize::new(0),
                unloaded: AtomicBool::new(false),
            }),
        })
    }

    /// The server kind.
    pub fn kind(&self) -> ServerKind {
        self.inner.t.kind
    }

    /// The server root this adapter talks to.
    pub fn base_url(&self) -> &str {
        self.inner.t.server()
    }

    /// Reads the server's launch-time speculation settings now (llama-server `/props`, vLLM
    /// `/metrics`), remembers them for [`Provider::speculation_status`], and returns them.
    pub async fn probe(&self) -> Result<ServerSpec, ProviderError> {
        let (spec, _) = self.inner.server_spec(true).await?;
        Ok(spec)
    }
}

impl Inner {
    fn kind(&self) -> ServerKind {
        self.t.kind
    }

    fn metrics_wanted(&self) -> bool {
        match self.t.opts.metrics {
            MetricsMode::Off => false,
            MetricsMode::On => true,
            MetricsMode::Auto => !self.metrics_absent.load(Ordering::Relaxed),
        }
    }

    async fn scrape(&self) -> Result<Option<Metrics>, ProviderError> {
        if !self.metrics_wanted() {
            return Ok(None);
        }
        match self.t.get_optional("/metrics").await? {
            Some(text) => Ok(Some(Metrics::parse(&text))),
            None => {
                if self.t.opts.metrics == MetricsMode::Auto {
                    self.metrics_absent.store(true, Ordering::Relaxed);
                }
                Ok(None)
            }
        }
    }

    /// The launch settings and, when metrics are read, the scrape taken now. `requested`
    /// false skips `/props` (nothing in the report depends on it then).
    async fn server_spec(
        &self,
        requested: bool,
    ) -> Result<(ServerSpec, Option<Metrics>), ProviderError> {
        let mut spec = ServerSpec::default();
        match self.kind() {
            ServerKind::LlamaServer | ServerKind::OpenAiCompatible if requested => {
                if let Some(text) = self.t.get_optional("/props").await? {
                    match serde_json::from_str::<Value>(&text) {
                        Ok(v) => spec = ServerSpec::from_llama_props(&v),
                        Err(e) => {
                            tracing::debug!(server = %self.t.server(), "unreadable /props: {e}")
                        }
                    }
                }
                // `/props` naming MTP, or another drafter, is what an older build launched;
                // otherwise (b11434 always says `none` there) `/slots` shows whether a
                // speculative context exists
                if spec.lane != Some(true) && !spec.non_mtp_drafter() {
                    if let Some(text) = self.t.get_optional("/slots").await? {
                        let lane = serde_json::from_str::<Value>(&text)
                            .ok()
                            .and_then(|v| ServerSpec::lane_from_llama_slots(&v));
                        if let Some(lane) = lane {
                            spec.lane = Some(lane);
                            spec.detail = Some(format!(
                                "/slots speculative = {lane} (a drafter {} loaded at launch; \
                                 this build's /props shows only sampling defaults)",
                                if lane { "is" } else { "is not" }
                            ));
                        }
                    }
                }
            }
            _ => {}
        }
        let metrics = match self.kind() {
            ServerKind::Ollama | ServerKind::LmStudio => None,
            _ => self.scrape().await?,
        };
        if let Some(m) = &metrics {
            if spec.lane.is_none() {
                spec.lane = evidence::lane_from_metrics(self.kind(), m);
                if self.kind() == ServerKind::Vllm && spec.lane == Some(false) {
                    spec.detail = Some("/metrics has no vllm:spec_decode counters".into());
                }
            }
        }
        if self.kind() == ServerKind::Ollama {
            spec.lane = Some(false);
        }
        if let Ok(mut last) = self.last_spec.lock() {
            *last = Some(spec.clone());
        }
        Ok((spec, metrics))
    }

    async fn prepare(
        &self,
        req: &GenerateRequest,
        stream: bool,
    ) -> Result<Prepared, ProviderError> {
        if self.unloaded.load(Ordering::Relaxed) {
            return Err(ProviderError::Unloaded {
                model: self.t.model.clone(),
            });
        }
        let kind = self.kind();
        req.refuse_token_level(kind.kind().name())?;
        wire::check_request(kind, req)?;
        let resolved = resolve(self.default.as_ref(), req.speculation.as_ref());
        let (spec, metrics_before) = self.server_spec(resolved.requested).await?;
        if resolved.requested && resolved.require_acceleration && spec.lane != Some(true) {
            let reason = if kind == ServerKind::Ollama {
                Reason::RuntimeUnsupported
            } else {
                Reason::ServerSide
            };
            return Err(ProviderError::SpeculationUnavailable {
                reason,
                message: evidence::unavailable_message(
                    kind,
                    self.t.server(),
                    &self.t.model,
                    &resolved,
                    &spec,
                ),
            });
        }
        let endpoint = Endpoint::for_request(kind, req);
        let depth = wire::requested_depth(kind, &resolved);
        let mut body = wire::build_body(kind, endpoint, &self.t.model, req, stream, depth);
        // LM Studio takes a draft model per request (`draft_model`, LM Studio 0.3.10+): the
        // one server here where the block's `drafter` can act.
        if let (ServerKind::LmStudio, true, Some(d)) =
            (kind, resolved.requested, resolved.drafter.as_ref())
        {
            body.draft_model = Some(d.clone().into());
        }
        Ok(Prepared {
            resolved,
            spec,
            metrics_before,
            endpoint,
            body,
            started: Instant::now(),
            format: req.constraint().cloned(),
            prompted: wire::prompted(kind, req).is_some(),
            single_call: req.parallel_tool_calls == Some(false) && !req.offered_tools().is_empty(),
        })
    }

    /// An empty accumulator for the call `p` prepared (its tool-call bounds).
    fn accum(&self, p: &Prepared) -> Accum {
        Accum::new(self.t.opts.max_tool_calls, p.single_call)
    }

    /// The error for an answer `absorb` refused.
    fn absorb_error(&self, e: Absorb, path: &str, mid_stream: bool) -> ProviderError {
        let server = self.t.server();
        match e {
            Absorb::Server(m) if mid_stream => self
                .t
                .api_error(None, format!("{server} reported an error mid-stream: {m}")),
            Absorb::Server(m) => self
                .t
                .api_error(None, format!("{server} reported an error: {m}")),
            Absorb::Malformed(m) => self.t.api_error(
                None,
                format!("a tool call in the answer from {server}{path} cannot be read: {m}"),
            ),
        }
    }

    /// Turns everything read into the final response.
    async fn finish(
        &self,
        p: &Prepared,
        acc: Accum,
        partial: bool,
        ttft_ms: Option<f64>,
    ) -> GenerateResponse {
        let kind = self.kind();
        let mut ev: Option<Evidence> = evidence::per_request(kind, &acc, &p.spec);
        if ev.is_none() && !partial {
            if let Some(before) = &p.metrics_before {
                match self.scrape().await {
                    Ok(Some(after)) => ev = evidence::metrics_delta(kind, before, &after),
                    Ok(None) => {}
                    Err(e) => tracing::debug!(server = %self.t.server(), "metrics after call: {e}"),
                }
            }
        }
        let mut speculation =
            evidence::build_report(kind, &self.t.model, &p.resolved, &p.spec, ev.as_ref());
        let overlapping = self.in_flight.load(Ordering::Relaxed).saturating_sub(1);
        if ev.as_ref().is_some_and(|e| e.approximate) && overlapping > 0 {
            if let Some(m) = speculation.message.as_mut() {
                m.push_str(&format!(
                    " {overlapping} other call(s) through this provider were running at the same time."
                ));
            }
        }
        let mut timings = evidence::timings(&acc);
        if timings.time_to_first_token_ms.is_none() {
            timings.time_to_first_token_ms = ttft_ms;
        }
        // Servers that report no timings (vLLM, Ollama): measure decode on the client, from
        // the first streamed token to the end.
        if let (None, Some(first), Some(out)) =
            (timings.decode_tokens_per_s, ttft_ms, acc.output_tokens)
        {
            let decode_ms = p.started.elapsed().as_secs_f64() * 1000.0 - first;
            if out > 1 && decode_ms > 0.0 && !partial {
                timings.decode_ms = Some(decode_ms);
                timings.decode_tokens_per_s = Some((out - 1) as f64 / (decode_ms / 1000.0));
            }
        }
        let tool_calls = acc.tools.calls();
        let mut warnings = acc.tools.warnings(!partial);
        let finish_reason = match (partial, acc.finish.unwrap_or(FinishReason::Stop)) {
            (true, _) => FinishReason::Error,
            // a reply that ends with calls is over for the caller to run them (vLLM answers a
            // named tool_choice with `stop`)
            (false, FinishReason::Stop) if !tool_calls.is_empty() => FinishReason::ToolCalls,
            (false, FinishReason::ToolCalls) if tool_calls.is_empty() => {
                warnings.push(format!(
                    "{} finished the reply with `tool_calls` but sent no tool call",
                    self.t.server()
                ));
                FinishReason::Stop
            }
            (false, f) => f,
        };
        warnings.extend(wire::constraint_warning(
            p.format.as_ref(),
            p.prompted,
            &acc.content,
            finish_reason,
        ));
        GenerateResponse {
            content: acc.content,
            reasoning_content: (!acc.reasoning.is_empty()).then_some(acc.reasoning),
            token_ids: acc.saw_token_ids.then_some(acc.token_ids),
            finish_reason,
            usage: Usage {
                input_tokens: acc.input_tokens.unwrap_or(0),
                output_tokens: acc.output_tokens.unwrap_or(0),
                cached_input_tokens: acc.cached_tokens.unwrap_or(0),
            },
            metadata: Metadata {
                speculation,
                timings,
            },
            partial,
            warnings,
            tool_calls,
            stop_sequence: None,
            prompt_logprobs: None,
            logprobs: None,
        }
    }

    fn malformed(&self, what: &str, e: &serde_json::Error, text: &[u8]) -> ProviderError {
        self.t.api_error(
            None,
            format!(
                "malformed JSON in the {what} from {}: {e}; it began {:?}",
                self.t.server(),
                truncate(&String::from_utf8_lossy(text), 120)
            ),
        )
    }

    async fn generate_once(&self, req: GenerateRequest) -> Result<GenerateResponse, ProviderError> {
        let p = self.prepare(&req, false).await?;
        let path = p.endpoint.path(self.kind());
        let resp = self.t.post_json(path, &p.body).await?;
        let bytes = match self.t.read_body(resp, path).await? {
            BodyRead::Complete(b) => b,
            BodyRead::Cut(b, cause) => {
                return Err(self.t.api_error(
                    None,
                    format!(
                        "the response from {}{path} broke off after {} bytes: {cause}",
                        self.t.server(),
                        b.len()
                    ),
                ))
            }
        };
        let v: Value =
            serde_json::from_slice(&bytes).map_err(|e| self.malformed("response", &e, &bytes))?;
        let mut acc = self.accum(&p);
        acc.absorb(&v)
            .map_err(|e| self.absorb_error(e, path, false))?;
        if v.get("choices").is_none() && v.get("content").is_none() {
            return Err(self.t.api_error(
                None,
                format!(
                    "unexpected response from {}{path}: neither `choices` nor `content` in {:?}",
                    self.t.server(),
                    truncate(&String::from_utf8_lossy(&bytes), 120)
                ),
            ));
        }
        Ok(self.finish(&p, acc, false, None).await)
    }
}

/// Decrements the in-flight counter when a call ends, however it ends.
struct InFlight(Arc<Inner>);

impl InFlight {
    fn new(inner: &Arc<Inner>) -> Self {
        inner.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(inner.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// State of one streamed call.
struct StreamState {
    inner: Arc<Inner>,
    prepared: Prepared,
    bytes: BoxStream<'static, reqwest::Result<Vec<u8>>>,
    parser: SseParser,
    acc: Accum,
    queue: VecDeque<Result<StreamEvent, ProviderError>>,
    finished: bool,
    ttft_ms: Option<f64>,
    _guard: InFlight,
}

impl StreamState {
    async fn next_item(&mut self) -> Option<Result<StreamEvent, ProviderError>> {
        loop {
            if let Some(item) = self.queue.pop_front() {
                return Some(item);
            }
            if self.finished {
                return None;
            }
            let idle = self.inner.t.idle_timeout();
            match tokio::time::timeout(idle, self.bytes.next()).await {
                Err(_) => {
                    self.finished = true;
                    return Some(Err(ProviderError::Timeout {
                        server: self.inner.t.server().to_string(),
                        message: format!(
                            "the stream went silent for {} ms (idle_timeout_ms) after {} characters",
                            idle.as_millis(),
                            self.acc.content.chars().count()
                        ),
                    }));
                }
                Ok(Some(Ok(chunk))) => self.take_chunk(&chunk).await,
                Ok(Some(Err(e))) => {
                    let cause = crate::http::chain(&e);
                    self.end_of_input(Some(cause)).await;
                }
                Ok(None) => self.end_of_input(None).await,
            }
        }
    }

    async fn take_chunk(&mut self, chunk: &[u8]) {
        self.take_events(chunk).await;
        if self.finished {
            return;
        }
        // the events completed before the overflow went out above; the oversized one ends
        // the stream
        if let Some(cap) = self.parser.overflow() {
            let path = self.prepared.endpoint.path(self.inner.kind());
            let err = self.inner.t.event_too_large(path, cap);
            self.queue.push_back(Err(err));
            self.finished = true;
        }
    }

    async fn take_events(&mut self, chunk: &[u8]) {
        for ev in self.parser.feed(chunk) {
            if self.finished {
                return;
            }
            if ev.is_done() {
                self.complete().await;
                return;
            }
            let v: Value = match serde_json::from_str(&ev.data) {
                Ok(v) => v,
                Err(e) => {
                    let err = self.inner.malformed("stream event", &e, ev.data.as_bytes());
                    self.queue.push_back(Err(err));
                    self.finished = true;
                    return;
                }
            };
            match self.acc.absorb(&v) {
                Err(e) => {
                    let path = self.prepared.endpoint.path(self.inner.kind());
                    let err = self.inner.absorb_error(e, path, true);
                    self.queue.push_back(Err(err));
                    self.finished = true;
                    return;
                }
                Ok(_) if self.reply_bytes() > self.inner.t.opts.max_body_bytes => {
                    let path = self.prepared.endpoint.path(self.inner.kind());
                    let err = self.inner.t.reply_too_large(path);
                    self.queue.push_back(Err(err));
                    self.finished = true;
                    return;
                }
                Ok(piece) => {
                    if let Some(p) = piece.progress {
                        self.queue.push_back(Ok(StreamEvent::PromptProgress(p)));
                    }
                    let said = !piece.text.is_empty()
                        || !piece.reasoning.is_empty()
                        || !piece.token_ids.is_empty();
                    if (said || !piece.tool_calls.is_empty()) && self.ttft_ms.is_none() {
                        self.ttft_ms = Some(self.prepared.started.elapsed().as_secs_f64() * 1000.0);
                    }
                    if said {
                        self.queue.push_back(Ok(StreamEvent::Delta {
                            text: piece.text,
                            token_ids: piece.token_ids,
                            reasoning: piece.reasoning,
                            logprobs: Vec::new(),
                        }));
                    }
                    // a chunk's call pieces after its text, as the native provider sends them
                    self.queue.extend(
                        piece
                            .tool_calls
                            .into_iter()
                            .map(|d| Ok(StreamEvent::ToolCall(d))),
                    );
                }
            }
            if self.acc.native_stop {
                self.complete().await;
                return;
            }
        }
    }

    /// What the call has gathered of the reply so far: text, reasoning, tool calls and token
    /// ids.
    fn reply_bytes(&self) -> usize {
        self.acc.content.len()
            + self.acc.reasoning.len()
            + self.acc.tools.bytes()
            + self.acc.token_ids.len() * std::mem::size_of::<u32>()
    }

    /// The stream ended (cleanly or with a transport error) without `[DONE]`.
    async fn end_of_input(&mut self, cause: Option<String>) {
        let complete = cause.is_none() && self.acc.finish.is_some() && !self.parser.has_pending();
        if complete {
            self.complete().await;
            return;
        }
        tracing::warn!(
            server = %self.inner.t.server(),
            received = self.acc.content.len(),
            "stream cut before its end: {}",
            cause.as_deref().unwrap_or("connection closed")
        );
        let acc = std::mem::take(&mut self.acc);
        let resp = self
            .inner
            .finish(&self.prepared, acc, true, self.ttft_ms)
            .await;
        self.queue.push_back(Ok(StreamEvent::Done(Box::new(resp))));
        self.finished = true;
    }

    async fn complete(&mut self) {
        let acc = std::mem::take(&mut self.acc);
        let resp = self
            .inner
            .finish(&self.prepared, acc, false, self.ttft_ms)
            .await;
        self.queue.push_back(Ok(StreamEvent::Done(Box::new(resp))));
        self.finished = true;
    }
}

#[async_trait::async_trait]
impl Provider for HttpProvider {
    fn name(&self) -> &str {
        self.inner.kind().name()
    }

    fn model(&self) -> &str {
        &self.inner.t.model
    }

    fn capabilities(&self) -> Capabilities {
        let runtime = self
            .inner
            .last_spec
            .lock()
            .ok()
            .and_then(|s| s.clone())
            .map(|s| evidence::runtime_name(self.kind(), &s))
            .unwrap_or_else(|| self.kind().name().to_string());
        Capabilities {
            provider: self.kind().name().into(),
            runtime,
            streaming: true,
            prompt_cache: false,
            // sent inline as `image_url` parts; a server without a vision projector answers
            // with its own error
            images: true,
            per_request_speculation: false,
        }
    }

    fn speculation_status(&self) -> SpeculationStatus {
        let kind = self.kind();
        let resolved = resolve(self.inner.default.as_ref(), None);
        let spec = self.inner.last_spec.lock().ok().and_then(|s| s.clone());
        let hint = kind.launch_hint(
            &self.inner.t.model,
            resolved
                .num_draft_tokens
                .or(spec.as_ref().and_then(|s| s.n_max))
                .unwrap_or(3),
        );
        let lane = spec.as_ref().and_then(|s| s.lane);
        let (reason, message) = match (kind, lane) {
            (ServerKind::Ollama, _) => (Some(Reason::RuntimeUnsupported), Some(format!("{hint}."))),
            (_, Some(true)) => (
                None,
                Some(format!("the {kind} server shows an MTP lane (configured at launch)")),
            ),
            (_, Some(false)) => (
                Some(Reason::ServerSide),
                Some(format!("the {kind} server shows no MTP lane; {hint}")),
            ),
            (_, None) => (
                Some(Reason::NotReported),
                Some(format!(
                    "not known yet: the {kind} server's speculative settings are read on the next call (or probe()); to enable MTP, {hint}"
                )),
            ),
        };
        SpeculationStatus {
            lane_loaded: lane == Some(true),
            drafter: (lane == Some(true)).then(|| "server-configured".to_string()),
            num_draft_tokens: spec.and_then(|s| s.n_max),
            default_mode: resolved.mode,
            reason,
            message,
            output_preserving: (lane == Some(true))
                .then(|| mtp_detect::RegistryView::lookup(&self.inner.t.model))
                .flatten()
                .and_then(|v| v.output_preserving),
            auto_depth: false,
        }
    }

    async fn generate(&self, request: GenerateRequest) -> Result<GenerateResponse, ProviderError> {
        let _guard = InFlight::new(&self.inner);
        self.inner.generate_once(request).await
    }

    async fn generate_stream(
        &self,
        request: GenerateRequest,
    ) -> Result<EventStream, ProviderError> {
        let guard = InFlight::new(&self.inner);
        let inner = self.inner.clone();
        let prepared = inner.prepare(&request, true).await?;
        let path = prepared.endpoint.path(inner.kind());
        let resp = inner.t.post_json(path, &prepared.body).await?;
        let is_json = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.starts_with("application/json"));
        if is_json {
            // The server answered in one piece despite `stream: true`.
            let bytes = match inner.t.read_body(resp, path).await? {
                BodyRead::Complete(b) => b,
                BodyRead::Cut(b, cause) => {
                    return Err(inner.t.api_error(
                        None,
                        format!("the response broke off after {} bytes: {cause}", b.len()),
                    ))
                }
            };
            let v: Value = serde_json::from_slice(&bytes)
                .map_err(|e| inner.malformed("response", &e, &bytes))?;
            let mut acc = inner.accum(&prepared);
            let piece = acc
                .absorb(&v)
                .map_err(|e| inner.absorb_error(e, path, false))?;
            let resp = inner.finish(&prepared, acc, false, None).await;
            let mut events = vec![Ok(StreamEvent::Delta {
                text: piece.text,
                token_ids: piece.token_ids,
                reasoning: piece.reasoning,
                logprobs: Vec::new(),
            })];
            events.extend(
                piece
                    .tool_calls
                    .into_iter()
                    .map(|d| Ok(StreamEvent::ToolCall(d))),
            );
            events.push(Ok(StreamEvent::Done(Box::new(resp))));
            drop(guard);
            return Ok(futures::stream::iter(events).boxed());
        }
        let bytes = resp.bytes_stream().map(|r| r.map(|b| b.to_vec())).boxed();
        let parser = SseParser::with_max_event_bytes(inner.t.opts.max_sse_event_bytes);
        let acc = inner.accum(&prepared);
        let state = StreamState {
            inner,
            prepared,
            bytes,
            parser,
            acc,
            queue: VecDeque::new(),
            finished: false,
            ttft_ms: None,
            _guard: guard,
        };
        Ok(futures::stream::unfold(state, |mut s| async move {
            s.next_item().await.map(|item| (item, s))
        })
        .boxed())
    }

    async fn unload(&self) -> Result<(), ProviderError> {
        self.inner.unloaded.store(true, Ordering::Relaxed);
        Ok(())
    }
}
