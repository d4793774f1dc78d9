//! `NativeProvider`: the contract's `Provider` over an in-process [`Backend`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use futures::StreamExt;
use mtp_contract::{
    plan, Capabilities, DraftDepth, EventStream, FinishReason, GenerateRequest, GenerateResponse,
    Lane, Metadata, Plan, Provider, ProviderError, Speculation, SpeculationStatus, StreamEvent,
    TokenLogprob, Usage, MAX_PROMPT_BYTES_PER_TOKEN,
};
use tokio::sync::mpsc;

use mtp_chat::ReplyText;

use super::backend::{Backend, Job, RenderedPrompt};
use super::disk_cache::DiskCache;
use super::prefix_cache::{CacheState, PrefixCache};

/// A loaded model plus the prefix cache that every provider on these weights shares.
pub struct Loaded<B: Backend> {
    /// The model.
    pub backend: B,
    /// The shared native prefix cache.
    pub cache: Mutex<PrefixCache<B::State>>,
    /// Its disk tier, when a cache directory was given.
    pub disk: Option<DiskCache<B::State>>,
}

impl<B: Backend> Loaded<B> {
    /// Wraps a backend with an empty cache of the given budget.
    pub fn new(backend: B, cache_bytes: usize, checkpoints_per_key: usize) -> Self {
        Loaded {
            backend,
            cache: Mutex::new(PrefixCache::new(cache_bytes, checkpoints_per_key)),
            disk: None,
        }
    }

    /// Adds a disk tier: every checkpoint kept in memory is also written there, and a lookup
    /// reads a longer one from there.
    pub fn with_disk(mut self, disk: DiskCache<B::State>) -> Self {
        self.disk = Some(disk);
        self
    }

    fn memory(&self) -> std::sync::MutexGuard<'_, PrefixCache<B::State>> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The longest checkpoint under `key` that covers a strict prefix of `ids`, from memory or,
    /// when the disk has a longer one that reads back, from the disk (then kept in memory too).
    fn resume(&self, key: &str, ids: &[u32]) -> Option<(usize, Arc<B::State>)> {
        let hit = self.memory().lookup(key, ids).map(|h| (h.tokens, h.state));
        let Some(disk) = &self.disk else { return hit };
        let have = hit.as_ref().map_or(0, |h| h.0);
        if have > 0 {
            // (the disk evicts as the memory does: what was just used stays)
            disk.touch(key, &ids[..have]);
        }
        let Some((n, bytes)) = disk.lookup(key, ids, have) else {
            return hit;
        };
        match self.backend.state_from_bytes(&bytes) {
            Ok(state) if state.tokens() == n => {
                let state = Arc::new(state);
                self.memory()
                    .insert(key, ids[..n].to_vec(), Arc::clone(&state));
                Some((n, state))
            }
            Ok(_) | Err(_) => {
                tracing::warn!(
                    key,
                    tokens = n,
                    "a prefix-cache file does not fit this model; removed"
                );
                disk.discard(key, &ids[..n]);
                hit
            }
        }
    }

    /// Keeps a checkpoint in memory and, with a disk tier, on disk.
    fn keep(&self, key: &str, tokens: Vec<u32>, state: Arc<B::State>) {
        if let Some(disk) = &self.disk {
            disk.store(key, tokens.clone(), Arc::clone(&state));
        }
        self.memory().insert(key, tokens, state);
    }
}

/// The in-process provider. Speculation is switched per call on the same loaded weights.
pub struct NativeProvider<B: Backend> {
    name: String,
    model: String,
    loaded: RwLock<Option<Arc<Loaded<B>>>>,
    default: Option<Speculation>,
    lane: Lane,
    busy: Arc<AtomicBool>,
    /// A context shorter than the model's (`ctx_size`), if asked for.
    ctx_size: Option<usize>,
    /// Continuous batching of up to this many sequences (`max_batch`), when above 1: calls
    /// run together instead of being refused as busy.
    max_batch: Option<usize>,
}

struct BusyGuard(Arc<AtomicBool>);
impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl<B: Backend> NativeProvider<B> {
    /// A provider named `name` for `model` over loaded weights, with the provider default
    /// and the lane decided at construction.
    pub fn new(
        name: impl Into<String>,
        model: impl Into<String>,
        loaded: Arc<Loaded<B>>,
        default: Option<Speculation>,
        lane: Lane,
    ) -> Self {
        NativeProvider {
            name: name.into(),
            model: model.into(),
            loaded: RwLock::new(Some(loaded)),
            default,
            lane,
            busy: Arc::new(AtomicBool::new(false)),
            ctx_size: None,
            max_batch: None,
        }
    }

    /// Generates up to `n` sequences together (continuous batching; each one's tokens are the
    /// ones it gets alone, and each resumes and keeps prefix-cache states as it would alone).
    /// `None` or 1: one call at a time, others are refused as busy.
    pub fn with_max_batch(mut self, n: Option<usize>) -> Self {
        self.max_batch = n.filter(|&n| n > 1);
        self
    }

    /// Limits the context (prompt and reply) to `n` tokens, or the model's own length if that
    /// is shorter; `None` keeps the model's.
    pub fn with_ctx_size(mut self, n: Option<usize>) -> Self {
        self.ctx_size = n;
        self
    }

    fn loaded(&self) -> Result<Arc<Loaded<B>>, ProviderError> {
        self.loaded
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| ProviderError::Unloaded {
                model: self.model.clone(),
            })
    }

    fn runtime(&self) -> String {
        self.loaded()
            .map(|l| l.backend.runtime())
            .unwrap_or_else(|_| "unloaded".into())
    }

    /// What a message about context `c` adds when `ctx_size` set it.
    fn raise(&self, c: usize) -> &'static str {
        match self.ctx_size {
            Some(s) if s == c => " or raise ctx_size (--ctx-size)",
            _ => "",
        }
    }

    /// The context (the model's length, `max_position_embeddings`, or `ctx_size` if shorter),
    /// after refusing, before any work, text that could not fit it at a generous number of
    /// bytes per token (so it is never rendered or tokenized).
    fn context(
        &self,
        loaded: &Loaded<B>,
        request: &GenerateRequest,
    ) -> Result<Option<usize>, ProviderError> {
        let ctx = self.context_of(loaded);
        if let Some(c) = ctx {
            let (bytes, most) = (
                request.text_bytes(),
                c.saturating_mul(MAX_PROMPT_BYTES_PER_TOKEN),
            );
            if bytes > most {
                return Err(ProviderError::ContextLengthExceeded {
                    context: c,
                    message: format!(
                        "this model's maximum context length is {c} tokens; the request holds \
                         {bytes} bytes of text, more than that can take at \
                         {MAX_PROMPT_BYTES_PER_TOKEN} bytes a token ({most}); shorten it{}",
                        self.raise(c)
                    ),
                });
            }
        }
        Ok(ctx)
    }

    /// Refuses images a text-only model cannot take.
    fn check_images(
        &self,
        loaded: &Loaded<B>,
        request: &GenerateRequest,
    ) -> Result<(), ProviderError> {
        if request.has_images() {
            if let Err(why) = loaded.backend.accepts_images() {
                return Err(ProviderError::Unsupported {
                    provider: self.name.clone(),
                    what: format!("image input ({why})"),
                });
            }
        }
        Ok(())
    }

    /// Refuses a `logit_bias` naming a token id past the model's vocabulary.
    fn check_logit_bias(
        &self,
        loaded: &Loaded<B>,
        request: &GenerateRequest,
    ) -> Result<(), ProviderError> {
        let Some(vocab) = loaded.backend.vocab_size() else {
            return Ok(());
        };
        match request
            .sampling
            .logit_bias
            .keys()
            .find(|&&id| id as usize >= vocab)
        {
            Some(id) => Err(ProviderError::InvalidRequest {
                field: "logit_bias",
                message: format!("token id {id} is outside the model's vocabulary of {vocab} ids"),
            }),
            None => Ok(()),
        }
    }

    /// Renders and tokenizes the request as `generate_stream` does (on the blocking pool),
    /// within the same bounds; no generation, no engine time.
    async fn rendered(&self, request: GenerateRequest) -> Result<RenderedPrompt, ProviderError> {
        request.validate()?;
        request.cancel.check()?;
        let loaded = self.loaded()?;
        self.check_images(&loaded, &request)?;
        self.context(&loaded, &request)?;
        // on the blocking pool like a generation's preparation, cancelled like it, and held
        // (a lease) until it has stopped
        let lease = request.cancel.lease();
        let render = move || {
            let _lease = lease;
            request.cancel.check()?;
            loaded.backend.render(&request)
        };
        tokio::task::spawn_blocking(render)
            .await
            .map_err(|e| self.join_error("rendering the prompt", e))?
    }

    /// The context requests are served with: the model's length, or `ctx_size` if shorter.
    fn context_of(&self, loaded: &Loaded<B>) -> Option<usize> {
        match (loaded.backend.context_length(), self.ctx_size) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// A failure of the blocking pool, as this provider's error.
    fn join_error(&self, what: &str, e: tokio::task::JoinError) -> ProviderError {
        ProviderError::Api {
            provider: self.name.clone(),
            model: self.model.clone(),
            status: None,
            message: format!("{what} failed: {e}"),
        }
    }
}

#[async_trait::async_trait]
impl<B: Backend> Provider for NativeProvider<B> {
    fn name(&self) -> &str {
        &self.name
    }

    fn model(&self) -> &str {
        &self.model
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            provider: self.name.clone(),
            runtime: self.runtime(),
            streaming: true,
            prompt_cache: true,
            images: self
                .loaded()
                .is_ok_and(|l| l.backend.accepts_images().is_ok()),
            per_request_speculation: true,
        }
    }

    fn speculation_status(&self) -> SpeculationStatus {
        let default_mode = mtp_contract::resolve(self.default.as_ref(), None).mode;
        match &self.lane {
            Lane::Ready {
                drafter,
                default_depth,
                output_preserving,
                ..
            } => SpeculationStatus {
                lane_loaded: true,
                drafter: Some(drafter.clone()),
                num_draft_tokens: Some(
                    match self.default.as_ref().and_then(|d| d.num_draft_tokens) {
                        Some(DraftDepth::Fixed(n)) => n,
                        Some(DraftDepth::Auto) => mtp_contract::AUTO_MAX_DRAFT_TOKENS,
                        None => *default_depth,
                    },
                ),
                default_mode,
                reason: None,
                message: None,
                output_preserving: *output_preserving,
                auto_depth: matches!(
                    self.default.as_ref().and_then(|d| d.num_draft_tokens),
                    Some(DraftDepth::Auto)
                ),
            },
            Lane::Unavailable { reason, message } => SpeculationStatus {
                lane_loaded: false,
                drafter: self.default.as_ref().and_then(|d| d.drafter.clone()),
                num_draft_tokens: None,
                default_mode,
                reason: Some(*reason),
                message: Some(message.clone()),
                output_preserving: None,
                auto_depth: false,
            },
        }
    }

    async fn generate(&self, request: GenerateRequest) -> Result<GenerateResponse, ProviderError> {
        let mut stream = self.generate_stream(request).await?;
        while let Some(ev) = stream.next().await {
            if let StreamEvent::Done(resp) = ev? {
                return Ok(*resp);
            }
        }
        Err(ProviderError::Api {
            provider: self.name.clone(),
            model: self.model.clone(),
            status: None,
            message: "generation ended without a final response".into(),
        })
    }

    async fn generate_stream(
        &self,
        request: GenerateRequest,
    ) -> Result<EventStream, ProviderError> {
        request.validate()?;
        request.cancel.check()?;
        let loaded = self.loaded()?;
        self.check_images(&loaded, &request)?;
        self.check_logit_bias(&loaded, &request)?;
        let mut plan = plan(
            self.default.as_ref(),
            request.speculation.as_ref(),
            &request.sampling,
            &self.lane,
        )?;
        // `auto`: the engine chooses each round's depth, up to the contract's ceiling
        if let Plan::Speculate {
            resolved, depth, ..
        } = &mut plan
        {
            if resolved.auto_depth {
                *depth = mtp_contract::AUTO_MAX_DRAFT_TOKENS;
            }
        }
        let guard = match self.max_batch {
            Some(_) => None,
            None => {
                if self
                    .busy
                    .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                    .is_err()
                {
                    return Err(ProviderError::Busy {
                        model: self.model.clone(),
                    });
                }
                Some(BusyGuard(Arc::clone(&self.busy)))
            }
        };
        let max_batch = self.max_batch;
        let started = Instant::now();
        let ctx = self.context(&loaded, &request)?;
        let raise = |c: usize| self.raise(c);
        // Any positive depth is a valid block; one this engine or context cannot hold is
        // refused here, naming the limit (the report warns of depths past the measured range).
        if let Plan::Speculate { depth, .. } = &plan {
            let d = *depth as usize;
            mtp_contract::check_depth(*depth, loaded.backend.max_depth())?;
            if let Some(c) = ctx.filter(|&c| d.saturating_add(2) > c) {
                return Err(ProviderError::InvalidRequest {
                    field: "speculation",
                    message: format!(
                        "num_draft_tokens {d} cannot fit: a round holds {d} proposals and the \
                         target's token in the {c}-token context{}",
                        raise(c)
                    ),
                });
            }
        }
        // Rendering, tokenizing and compiling the constraint take time in proportion to the
        // request: on the blocking pool, never on an async worker; their errors come back
        // here, before the stream is opened.
        // Each stage checks the request's cancellation before it starts, and the work holds a
        // lease on it until it has stopped (the caller waits for that before its slot is
        // given to another request).
        let prepare = {
            let loaded = Arc::clone(&loaded);
            let lease = request.cancel.lease();
            move || -> Result<_, ProviderError> {
                let _lease = lease;
                let cancel = request.cancel.clone();
                cancel.check()?;
                // the tool-call reader walks each parameter's schema within a budget; one
                // past it is the request's fault
                mtp_chat::toolcall::check_tool_schemas(&request.tools).map_err(|e| {
                    ProviderError::InvalidRequest {
                        field: "tools",
                        message: e.to_string(),
                    }
                })?;
                let prompt = loaded.backend.render(&request)?;
                cancel.check()?;
                // a forced tool call decodes under the grammar of the template's call markup
                let (tool_format, forced) = loaded
                    .backend
                    .tool_calls(&request, prompt.reasoning.as_ref())?;
                let format = forced.or_else(|| request.constraint().cloned());
                cancel.check()?;
                let constraint = match &format {
                    Some(f) => loaded.backend.compile_constraint(f)?,
                    None => None,
                };
                cancel.check()?;
                Ok((
                    request,
                    prompt,
                    Decoding {
                        constraint,
                        format,
                        tool_format,
                    },
                ))
            }
        };
        let (request, prompt, decoding) = tokio::task::spawn_blocking(prepare)
            .await
            .map_err(|e| self.join_error("preparing the prompt", e))??;
        // (a prompt alone, `echo` with no reply, may fill the context)
        let fits = |c: usize| match request.max_output_tokens {
            Some(0) => prompt.ids.len() <= c,
            _ => prompt.ids.len() < c,
        };
        if let Some(ctx) = ctx.filter(|&c| !fits(c)) {
            return Err(ProviderError::ContextLengthExceeded {
                context: ctx,
                message: format!(
                    "this model's maximum context length is {ctx} tokens (prompt and reply); \
                     the prompt is {} tokens: shorten it{}",
                    prompt.ids.len(),
                    raise(ctx)
                ),
            });
        }
        let runtime = loaded.backend.runtime();
        let (tx, rx) = mpsc::channel::<Result<StreamEvent, ProviderError>>(64);
        let provider = self.name.clone();
        let model = self.model.clone();
        let lease = request.cancel.lease();
        tokio::task::spawn_blocking(move || {
            let _lease = lease;
            let setting = JobSetting {
                plan: &plan,
                runtime: &runtime,
                ctx,
                max_batch,
                started,
            };
            let result = run_job(&loaded, &request, &prompt, decoding, setting, &tx);
            // Release the provider and this job's hold on the weights before the caller sees
            // the final event, so that its next call is never refused as busy and an
            // `unload` right after the call really frees the weights.
            drop(loaded);
            drop(guard);
            let ev = match result {
                Ok(resp) => Ok(StreamEvent::Done(Box::new(resp))),
                Err(ProviderError::Cancelled) => return,
                Err(e) => Err(match e {
                    ProviderError::Api {
                        message, status, ..
                    } => ProviderError::Api {
                        provider,
                        model,
                        status,
                        message,
                    },
                    other => other,
                }),
            };
            let _ = tx.blocking_send(ev);
        });
        Ok(tokio_stream_from(rx))
    }

    /// Renders and tokenizes the request as `generate_stream` does (on the blocking pool),
    /// within the same bounds, and counts its tokens; no generation, no engine time.
    async fn count_tokens(&self, request: GenerateRequest) -> Result<u64, ProviderError> {
        Ok(self.rendered(request).await?.ids.len() as u64)
    }

    /// The rendered prompt's ids, and its text: the ids decoded with their special tokens
    /// (each image's run of placeholder tokens as the template's placeholders).
    async fn render_prompt(
        &self,
        request: GenerateRequest,
    ) -> Result<mtp_contract::RenderedText, ProviderError> {
        let vocab = self
            .vocabulary()
            .ok_or_else(|| ProviderError::Unsupported {
                provider: self.name.clone(),
                what: "rendering a prompt without the checkpoint's tokenizer".into(),
            })?;
        let ids = self.rendered(request).await?.ids;
        let text = vocab.decode(&ids)?;
        Ok(mtp_contract::RenderedText {
            text,
            token_ids: ids,
        })
    }

    fn vocabulary(&self) -> Option<Arc<dyn mtp_contract::Vocabulary>> {
        self.loaded().ok()?.backend.vocabulary()
    }

    fn context_length(&self) -> Option<usize> {
        self.context_of(&*self.loaded().ok()?)
    }

    fn recommended_sampling(&self) -> Option<mtp_contract::Sampling> {
        self.loaded().ok()?.backend.recommended_sampling()
    }

    fn prompt_cache_clear(&self, key: Option<&str>) -> Result<(), ProviderError> {
        let loaded = self.loaded()?;
        if let Some(k) = key {
            tracing::warn!(
                key = k,
                "prompt_cache_clear(key) clears the whole shared native prefix cache, not only this key"
            );
        }
        loaded.memory().clear();
        if let Some(d) = &loaded.disk {
            d.clear();
        }
        Ok(())
    }

    async fn unload(&self) -> Result<(), ProviderError> {
        let mut slot = self.loaded.write().unwrap_or_else(|p| p.into_inner());
        *slot = None;
        Ok(())
    }
}

/// Sends the prompt's progress into a job's stream, never waiting: a report that finds the
/// stream full (its reader behind) is dropped, as the next one says more.
fn progress_sink(
    tx: &mpsc::Sender<Result<StreamEvent, ProviderError>>,
) -> mtp_contract::ProgressSink {
    let tx = tx.clone();
    mtp_contract::ProgressSink::new(move |p| {
        let _ = tx.try_send(Ok(StreamEvent::PromptProgress(p)));
    })
}

fn tokio_stream_from(mut rx: mpsc::Receiver<Result<StreamEvent, ProviderError>>) -> EventStream {
    Box::pin(futures::stream::poll_fn(move |cx| rx.poll_recv(cx)))
}

/// How a reply is decoded and read besides sampling: its constraint (a `response_format`, or
/// the grammar of a forced tool call) compiled and as given, and the tool-call format its
/// text is read in.
struct Decoding {
    constraint: Option<mtp_grammar::Constraint>,
    format: Option<mtp_contract::ResponseFormat>,
    tool_format: Option<mtp_chat::toolcall::ToolCallFormat>,
}

/// Where a request runs, besides its prompt and decoding: its plan (speculative or not), the
/// runtime its report names, the context it must fit (prompt and reply), the batch it may join
/// (continuous batching of up to `max_batch` sequences), and when it arrived.
struct JobSetting<'a> {
    plan: &'a Plan,
    runtime: &'a str,
    ctx: Option<usize>,
    max_batch: Option<usize>,
    started: Instant,
}

fn run_job<B: Backend>(
    loaded: &Loaded<B>,
    request: &GenerateRequest,
    prompt: &RenderedPrompt,
    decoding: Decoding,
    setting: JobSetting<'_>,
    tx: &mpsc::Sender<Result<StreamEvent, ProviderError>>,
) -> Result<GenerateResponse, ProviderError> {
    let JobSetting {
        plan,
        runtime,
        ctx,
        max_batch,
        started,
    } = setting;
    let backend = &loaded.backend;
    let ids = prompt.ids.as_slice();
    let key = request.prompt_cache_key.as_deref();
    // with images, the key names each picture by its digest
    let key_ids = prompt.key_ids();
    let resume = key.and_then(|k| loaded.resume(k, key_ids));
    let (depth, auto_depth) = match plan {
        Plan::Speculate {
            depth, resolved, ..
        } => (Some(*depth), resolved.auto_depth),
        Plan::TargetOnly { .. } => (None, false),
    };
    // never past the context: the reply gets what the prompt leaves; no bound asked for
    // means to the end of the context (vLLM's and llama-server's default)
    let room = ctx.map_or(usize::MAX, |c| c.saturating_sub(ids.len()));
    let asked = request.max_output_tokens.map_or(room, |n| n as usize);
    let max_tokens = asked.min(room);
    // `echo`: the prompt's tokens, with their log probabilities when asked for
    let prompt_logprobs = if request.echo {
        Some(echo_tokens(backend, request, prompt)?)
    } else {
        None
    };
    if max_tokens == 0 {
        // (`max_tokens: 0` with `echo`: the prompt alone)
        let report = plan.report(runtime, &Default::default());
        return Ok(prompt_only(
            request,
            prompt,
            prompt_logprobs,
            report,
            started,
        ));
    }
    let mut decoder = backend.decoder()?;
    let Decoding {
        constraint,
        format,
        tool_format,
    } = decoding;
    let mut reply = ReplyText::new(request.stop.clone(), prompt.reasoning.clone())
        .with_tool_calls(tool_format, request);
    let mut first_token_at: Option<Instant> = None;
    let mut cancelled = false;
    let mut failure: Option<ProviderError> = None;
    let mut logprobs: Vec<TokenLogprob> = Vec::new();
    let mut on_tokens = |toks: &[u32], lps: Vec<TokenLogprob>| -> bool {
        first_token_at.get_or_insert_with(Instant::now);
        let mut piece = String::new();
        for &t in toks {
            match decoder.step(t) {
                Ok(Some(p)) => piece.push_str(&p),
                Ok(None) => {}
                Err(e) => {
                    failure = Some(e);
                    return false;
                }
            }
        }
        let split = reply.push(&piece);
        if request.logprobs.is_some() {
            logprobs.extend_from_slice(&lps);
        }
        if !send_split(tx, split, toks.to_vec(), lps) {
            cancelled = true;
            return false;
        }
        !reply.stopped()
    };
    let job = Job {
        prompt: ids,
        resume,
        depth,
        auto_depth,
        sampling: &request.sampling,
        max_tokens,
        response_format: format.as_ref(),
        constraint,
        checkpoint: key.is_some(),
        checkpoint_at: prompt.history_len,
        images: &prompt.images,
        on_tokens: &mut on_tokens,
        logprobs: request.logprobs,
        on_prompt_progress: Some(progress_sink(tx)),
        cancel: request.cancel.clone(),
    };
    let out = match max_batch {
        Some(n) => backend.run_batched(n, job)?,
        None => backend.run(job)?,
    };
    if let Some(e) = failure {
        return Err(e);
    }
    if cancelled || (out.finish == FinishReason::Cancelled && request.cancel.is_cancelled()) {
        return Err(ProviderError::Cancelled);
    }
    // What the decoder and the reply still hold (an incomplete character, a suffix that could
    // have started a stop string or a tag) goes out last.
    let tail = decoder.finish()?;
    let mut last = reply.push(&tail);
    // a tool call the token limit cut is incomplete: no call, its markup is content
    let rest = if out.finish == FinishReason::Length {
        reply.finish_cut()
    } else {
        reply.finish()
    };
    last.content.push_str(&rest.content);
    last.reasoning.push_str(&rest.reasoning);
    last.tool_calls.extend(rest.tool_calls);
    if !send_split(tx, last, Vec::new(), Vec::new()) {
        return Err(ProviderError::Cancelled);
    }
    if let Some(k) = key {
        let mut all = key_ids.to_vec();
        all.extend_from_slice(&out.tokens);
        for state in [out.history_state, out.prompt_state, out.final_state]
            .into_iter()
            .flatten()
        {
            let n = state.tokens().min(all.len());
            loaded.keep(k, all[..n].to_vec(), state);
        }
    }
    let finish = match (reply.stopped(), out.finish) {
        // a reply that ends with tool calls is over for the caller to run them
        (true, _) | (false, FinishReason::Stop) if !reply.tool_calls().is_empty() => {
            FinishReason::ToolCalls
        }
        (true, _) => FinishReason::Stop,
        (false, f) => f,
    };
    let mut warnings: Vec<String> = reply.tool_call_warnings().to_vec();
    if finish == FinishReason::Length && max_tokens < asked && out.tokens.len() >= max_tokens {
        warnings.push(format!(
            "stopped at the context length: {} prompt and {} reply tokens fill the {}-token \
             context, before max_output_tokens ({asked})",
            ids.len(),
            out.tokens.len(),
            ctx.unwrap_or(0)
        ));
    }
    let mut speculation = plan.report(runtime, &out.stats);
    if auto_depth {
        speculation = speculation.chosen_per_round();
    }
    let mut timings = out.timings;
    if let Some(t) = first_token_at {
        timings.time_to_first_token_ms = Some(t.duration_since(started).as_secs_f64() * 1e3);
    }
    Ok(GenerateResponse {
        content: reply.content().to_string(),
        reasoning_content: reply.reasoning().map(str::to_string),
        token_ids: Some(out.tokens.clone()),
        finish_reason: finish,
        usage: Usage {
            input_tokens: ids.len() as u64,
            output_tokens: out.tokens.len() as u64,
            cached_input_tokens: ids.len().saturating_sub(out.computed_prompt_tokens) as u64,
        },
        metadata: Metadata {
            speculation,
            timings,
        },
        partial: false,
        warnings,
        tool_calls: reply.tool_calls().to_vec(),
        // a stop string ends the reply even after tool calls; the reason is then theirs
        stop_sequence: reply.stop_sequence().map(str::to_string),
        logprobs: request.logprobs.map(|_| logprobs),
        prompt_logprobs,
    })
}

/// The prompt's tokens for `echo`: with `logprobs`, each with its log probability and
/// alternatives (the backend's forward over the prompt); else their texts alone.
fn echo_tokens<B: Backend>(
    backend: &B,
    request: &GenerateRequest,
    prompt: &RenderedPrompt,
) -> Result<Vec<TokenLogprob>, ProviderError> {
    if let Some(top) = request.logprobs {
        return backend.prompt_logprobs(&prompt.ids, top, &prompt.images, &request.cancel);
    }
    let vocab = backend.vocabulary();
    Ok(prompt
        .ids
        .iter()
        .map(|&id| {
            TokenLogprob::unscored(
                id,
                vocab.as_ref().map(|v| v.token_text(id)).unwrap_or_default(),
            )
        })
        .collect())
}

/// The answer to a request for the prompt alone (`max_tokens: 0` with `echo`): no reply.
fn prompt_only(
    request: &GenerateRequest,
    prompt: &RenderedPrompt,
    prompt_logprobs: Option<Vec<TokenLogprob>>,
    speculation: mtp_contract::SpeculationReport,
    started: Instant,
) -> GenerateResponse {
    let timings = mtp_contract::Timings {
        prefill_ms: Some(started.elapsed().as_secs_f64() * 1e3),
        ..Default::default()
    };
    GenerateResponse {
        content: String::new(),
        reasoning_content: None,
        token_ids: Some(Vec::new()),
        finish_reason: FinishReason::Length,
        usage: Usage {
            input_tokens: prompt.ids.len() as u64,
            output_tokens: 0,
            cached_input_tokens: 0,
        },
        metadata: Metadata {
            speculation,
            timings,
        },
        partial: false,
        warnings: Vec::new(),
        tool_calls: Vec::new(),
        stop_sequence: None,
        logprobs: request.logprobs.map(|_| Vec::new()),
        prompt_logprobs,
    }
}

/// Sends what a piece of the reply gave: its text and reasoning (with the tokens behind them),
/// then its tool-call pieces; false once the caller has gone.
fn send_split(
    tx: &mpsc::Sender<Result<StreamEvent, ProviderError>>,
    split: mtp_chat::Split,
    token_ids: Vec<u32>,
    logprobs: Vec<TokenLogprob>,
) -> bool {
    if !split.content.is_empty() || !split.reasoning.is_empty() || !token_ids.is_empty() {
        let ev = StreamEvent::Delta {
            text: split.content,
            token_ids,
            reasoning: split.reasoning,
            logprobs,
        };
        if tx.blocking_send(Ok(ev)).is_err() {
            return false;
        }
    }
    split
        .tool_calls
        .into_iter()
        .all(|d| tx.blocking_send(Ok(StreamEvent::ToolCall(d))).is_ok())
}
