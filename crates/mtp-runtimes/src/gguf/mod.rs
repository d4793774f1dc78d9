//! The in-process `gguf` provider (cargo feature `gguf`): llama.cpp b11434 linked through
//! `llama-cpp-2`, with MTP speculation run in-process by `MtpSpeculative`.
//!
//! Tested by `tests/gguf_provider.rs` (`cargo test -p mtp-runtimes --features gguf`, part of
//! `cargo xtask test`) on GGUF files converted at test time from the tiny checkpoints: greedy
//! output with MTP equals greedy output without it at depths 1, 3 and 5 and equals the mlx-vlm
//! reference tokens; the facade's `gguf_vs_native` test compares it with the native engine on
//! the bundled demo model.
//!
//! Before llama.cpp sees the file, its header is read with `mtp-detect`:
//!
//! | header | what runs | report |
//! | --- | --- | --- |
//! | `<arch>.nextn_predict_layers > 0`, arch has an MTP graph in b11434 (the detection registry's `llama_cpp_mtp_archs`) | target + MTP head (loaded with `with_load_mtp(true)`) | `used: true`, real drafted/accepted/rounds, `runtime: "llama.cpp b11434"` |
//! | head present, arch without an MTP graph | target only; a warning once per model | `runtime_unsupported`, naming a newer llama-server or LM Studio |
//! | no head | target only | `no_mtp_head` |
//!
//! Whether a call speculates is decided by [`mtp_contract::plan`] like every other provider:
//! per-call overrides, `require_acceleration`, and penalties/logit bias (target-only).
//!
//! ```no_run
//! use mtp_contract::{GenerateRequest, ProviderOptions, Speculation};
//! # async fn demo() -> Result<(), mtp_contract::ProviderError> {
//! let llm = mtp_runtimes::gguf::create(
//!     "models/tiny-mtp.gguf",
//!     &ProviderOptions::default().speculation(Speculation::native_mtp()),
//! )?;
//! let r = llm.generate(GenerateRequest::new("the quick brown fox ").raw().max_output_tokens(32)).await?;
//! let s = &r.metadata.speculation;
//! println!("{} drafted={:?} accepted={:?}", r.content, s.drafted, s.accepted);
//! # Ok(()) }
//! ```

mod engine;
mod header;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use futures::StreamExt;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::sampling::LlamaSampler;
use mtp_chat::{ChatError, ChatTemplate, ChatTemplates, Prompt, Split};
use mtp_contract::{
    plan, resolve, Capabilities, EventStream, FinishReason, GenerateRequest, GenerateResponse,
    Lane, Metadata, Plan, Provider, ProviderError, ProviderOptions, Speculation, SpeculationStatus,
    StreamEvent, Timings, Usage,
};

pub use crate::GgufOptions;
pub use header::{read_head, HeadInfo, DEFAULT_DEPTH};

/// The provider name.
pub const PROVIDER: &str = mtp_contract::ProviderKind::Gguf.name();
/// The linked llama.cpp release.
pub const LLAMA_BUILD: &str = "b11434";
/// `runtime` in reports.
pub const RUNTIME: &str = "llama.cpp b11434";
/// The `ProviderOptions.extra` keys this provider reads ([`GgufOptions::EXTRA_KEYS`]).
pub const EXTRA_KEYS: [&str; 4] = GgufOptions::EXTRA_KEYS;

const DEFAULT_N_CTX: u32 = 4096;

fn backend() -> Result<&'static LlamaBackend, String> {
    static BACKEND: OnceLock<Result<LlamaBackend, String>> = OnceLock::new();
    BACKEND
        .get_or_init(|| {
            let mut b = LlamaBackend::init().map_err(|e| format!("initialising llama.cpp: {e}"))?;
            b.void_logs();
            Ok(b)
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// Warns once per model path that its head cannot run here.
fn warn_once(path: &Path, message: &str) {
    static WARNED: OnceLock<Mutex<HashSet<PathBuf>>> = OnceLock::new();
    let set = WARNED.get_or_init(|| Mutex::new(HashSet::new()));
    if let Ok(mut s) = set.lock() {
        if s.insert(path.to_path_buf()) {
            tracing::warn!(model = %path.display(), "{message}");
        }
    }
}

/// Finds the `.gguf` file: the path itself, or the only `.gguf` file in a directory.
fn locate(model: &str) -> Result<PathBuf, ProviderError> {
    let load_err = |message: String| ProviderError::ModelLoad {
        model: model.to_string(),
        message,
    };
    let p = PathBuf::from(model);
    if p.is_file() {
        return Ok(p);
    }
    if p.is_dir() {
        let mut found: Vec<PathBuf> = std::fs::read_dir(&p)
            .map_err(|e| load_err(format!("{}: {e}", p.display())))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|f| {
                f.is_file()
                    && f.file_name()
                        .is_some_and(|n| mtp_detect::is_gguf_model_file(&n.to_string_lossy()))
            })
            .collect();
        found.sort();
        return match found.len() {
            1 => Ok(found.remove(0)),
            0 => Err(load_err(format!(
                "no GGUF model file in {} (vision projectors `mmproj*` and later shards of a \
                 split model do not count)",
                p.display()
            ))),
            _ => Err(load_err(format!(
                "{} holds several GGUF models; name one of them: {}",
                p.display(),
                found
                    .iter()
                    .filter_map(|f| f.file_name())
                    .map(|n| n.to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        };
    }
    Err(load_err(
        "not a local .gguf file or a directory holding one (download the file first)".into(),
    ))
}

struct Loaded {
    model: LlamaModel,
    /// The grammar compiler over this GGUF's vocabulary, built on the first constrained call
    /// (it walks the whole vocabulary), or why it cannot be.
    constraints: OnceLock<Result<mtp_grammar::Compiler, String>>,
}

impl Loaded {
    /// The grammar state for `format` over this model's vocabulary; a format that does not
    /// compile is the request's fault (`InvalidRequest` naming `field`: `response_format`, or
    /// `tool_choice` for the grammar of a forced call).
    fn constraint(
        &self,
        format: &mtp_contract::ResponseFormat,
        field: &'static str,
    ) -> Result<Option<mtp_grammar::Constraint>, ProviderError> {
        let compiler = self.constraints.get_or_init(|| {
            let env = LlamaSampler::llguidance_tok_env(&self.model);
            mtp_grammar::Compiler::new(&env).map_err(|e| e.to_string())
        });
        let compiler = compiler.as_ref().map_err(|m| ProviderError::Unsupported {
            provider: PROVIDER.into(),
            what: format!("{field} `{}` on this GGUF ({m})", format.kind()),
        })?;
        compiler
            .compile(format)
            .map_err(|e| ProviderError::InvalidRequest {
                field,
                message: e.to_string(),
            })
    }
}

/// The GGUF's `tokenizer.chat_template` and the special tokens it sees (the vocabulary's BOS
/// and EOS token texts, as transformers passes `bos_token`/`eos_token`).
fn chat_templates(
    llama: &LlamaModel,
    path: &Path,
    model: &str,
) -> Result<ChatTemplates, ChatError> {
    let Ok(source) = llama.meta_val_str("tokenizer.chat_template") else {
        return Err(ChatError::NoTemplate);
    };
    let name = format!("{} tokenizer.chat_template", path.display());
    let template = ChatTemplate::new(source, name).map_err(|e| {
        tracing::warn!(model, "chat template unusable: {e}");
        ChatError::Template(e)
    })?;
    let vocab = llama.vocab();
    let mut special = serde_json::Map::new();
    for (key, tok) in [("bos_token", vocab.bos()), ("eos_token", vocab.eos())] {
        if tok.0 < 0 {
            continue;
        }
        let bytes = vocab.token_to_piece(tok, true, None);
        if let Ok(text) = String::from_utf8(bytes) {
            if !text.is_empty() {
                special.insert(key.into(), text.into());
            }
        }
    }
    Ok(ChatTemplates::single(template, special))
}

struct Inner {
    name: String,
    path: PathBuf,
    head: HeadInfo,
    lane: Lane,
    default: Option<Speculation>,
    n_ctx: u32,
    threads: i32,
    /// The KV cache's type (llama.cpp's default when not given).
    cache_type: Option<mtp_contract::KvType>,
    /// The GGUF's chat template, compiled once, or the error chat requests get.
    templates: Result<ChatTemplates, ChatError>,
    loaded: Mutex<Option<Arc<Loaded>>>,
    busy: Arc<AtomicBool>,
}

/// The in-process GGUF provider. Create it with [`create`].
#[derive(Clone)]
pub struct GgufProvider {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for GgufProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufProvider")
            .field("model", &self.inner.name)
            .field("path", &self.inner.path)
            .field("head", &self.inner.head)
            .finish()
    }
}

/// Loads `model` (a `.gguf` path, or a directory holding one) for in-process generation.
///
/// The header is read first: the MTP head is loaded only when the linked llama.cpp has an MTP
/// graph for the architecture. `opts.extra` takes `n_ctx` or `ctx_size` (at least 16;
/// default 4096), `threads` (positive; default: the available cores) and `cache_type` (`f32`,
/// `f16`, `bf16`; default llama.cpp's f16), read once by [`GgufOptions::from_extra`] with the
/// contract's rules; any other key is an `InvalidOption` listing these.
pub fn create(model: &str, opts: &ProviderOptions) -> Result<Arc<dyn Provider>, ProviderError> {
    Ok(Arc::new(GgufProvider::new(model, opts)?))
}

/// [`create`] with the provider's options typed. `opts` carries what every provider shares
/// (the speculation block); an `extra` key there would be ignored beside typed options, so it
/// is refused.
pub fn create_with(
    model: &str,
    opts: &ProviderOptions,
    gguf: GgufOptions,
) -> Result<Arc<dyn Provider>, ProviderError> {
    opts.refuse_extra("GgufOptions")?;
    Ok(Arc::new(GgufProvider::with_options(model, opts, gguf)?))
}

impl GgufProvider {
    /// See [`create`].
    pub fn new(model: &str, opts: &ProviderOptions) -> Result<GgufProvider, ProviderError> {
        Self::with_options(model, opts, GgufOptions::from_extra(opts)?)
    }

    /// See [`create_with`] (`opts.extra` is not read).
    pub fn with_options(
        model: &str,
        opts: &ProviderOptions,
        gguf: GgufOptions,
    ) -> Result<GgufProvider, ProviderError> {
        // (values out of range are refused, never replaced by the default)
        gguf.check()?;
        let n_ctx = gguf.n_ctx.unwrap_or(DEFAULT_N_CTX);
        let threads = match gguf.threads {
            // check() bounds it by i32::MAX
            Some(n) => i32::try_from(n).unwrap_or(i32::MAX),
            None => std::thread::available_parallelism()
                .map(|n| i32::try_from(n.get()).unwrap_or(4))
                .unwrap_or(4),
        };
        let path = locate(model)?;
        let load_err = |message: String| ProviderError::ModelLoad {
            model: model.to_string(),
            message,
        };
        let head = read_head(&path).map_err(load_err)?;
        // the registry's entry for the model (by the name it was given: a repo id or a file)
        let registry = mtp_detect::RegistryView::lookup(model).or_else(|| {
            path.file_name()
                .and_then(|f| f.to_str())
                .and_then(mtp_detect::RegistryView::lookup)
        });
        let lane = head.lane(RUNTIME, registry.as_ref());
        if let Lane::Unavailable {
            reason: mtp_contract::Reason::RuntimeUnsupported,
            message,
        } = &lane
        {
            warn_once(&path, message);
        }
        let backend = backend().map_err(load_err)?;
        // Never ask for the head of an architecture without an MTP graph; never drive an MTP
        // context on a model loaded without its head (llama.cpp aborts the process then).
        let params = LlamaModelParams::default().with_load_mtp(head.mtp_runnable());
        let llama = LlamaModel::load_from_file(backend, &path, &params).map_err(|e| {
            load_err(format!(
                "{}: llama.cpp could not load it: {e}",
                path.display()
            ))
        })?;
        let templates = chat_templates(&llama, &path, model);
        Ok(GgufProvider {
            inner: Arc::new(Inner {
                name: model.to_string(),
                path,
                head,
                lane,
                default: opts.speculation.clone(),
                n_ctx,
                threads,
                cache_type: gguf.cache_type,
                templates,
                loaded: Mutex::new(Some(Arc::new(Loaded {
                    model: llama,
                    constraints: OnceLock::new(),
                }))),
                busy: Arc::new(AtomicBool::new(false)),
            }),
        })
    }

    /// What the header said.
    pub fn head(&self) -> &HeadInfo {
        &self.inner.head
    }

    fn loaded(&self) -> Result<Arc<Loaded>, ProviderError> {
        self.inner
            .loaded
            .lock()
            .ok()
            .and_then(|l| l.clone())
            .ok_or_else(|| ProviderError::Unloaded {
                model: self.inner.name.clone(),
            })
    }

    fn api_err(&self, message: String) -> ProviderError {
        ProviderError::Api {
            provider: PROVIDER.into(),
            model: self.inner.name.clone(),
            status: None,
            message,
        }
    }

    /// The prompt: verbatim for raw requests, else the GGUF's `tokenizer.chat_template`
    /// rendered by the workspace's one renderer, with the GGUF's own special tokens.
    fn prompt(&self, req: &GenerateRequest) -> Result<Prompt, ProviderError> {
        if req.raw_prompt {
            return Ok(Prompt::raw(req));
        }
        match &self.inner.templates {
            Ok(t) => t
                .render_request(req)
                .map_err(|e| e.into_provider_error(&self.inner.name)),
            Err(e) => Err(e.clone().into_provider_error(&self.inner.name)),
        }
    }

    /// How the reply's tool calls are read and, for a forced call (`tool_choice` `required`
    /// or a named function), the grammar of the template's call markup it decodes under
    /// (after the reasoning block when the prompt opened one), as the native provider does.
    /// A forced call without a chat template that writes calls is an `InvalidRequest` naming
    /// `tool_choice`.
    fn tool_calls(
        &self,
        req: &GenerateRequest,
        reasoning: Option<&mtp_chat::ReasoningStart>,
    ) -> Result<mtp_chat::ToolDecoding, ProviderError> {
        mtp_chat::tool_decoding(
            self.inner.templates.as_ref(),
            req,
            reasoning,
            &self.inner.name,
        )
    }

    /// Validates, plans, tokenizes and starts the blocking loop; events arrive on the stream.
    fn start(&self, req: GenerateRequest) -> Result<EventStream, ProviderError> {
        req.validate()?;
        req.refuse_token_level(PROVIDER)?;
        if req.has_images() {
            return Err(ProviderError::Unsupported {
                provider: PROVIDER.into(),
                what: "image input (llama.cpp reads images through a vision projector, an \
                       mmproj*.gguf file, which this lane does not load yet; the native \
                       provider runs a safetensors checkpoint's vision tower)"
                    .into(),
            });
        }
        let loaded = self.loaded()?;
        let decision = plan(
            self.inner.default.as_ref(),
            req.speculation.as_ref(),
            &req.sampling,
            &self.inner.lane,
        )?;
        let prompt = self.prompt(&req)?;
        // a forced tool call decodes under the grammar of the template's call markup, in
        // place of a response_format (the contract refuses both at once)
        let (tool_format, forced) = self.tool_calls(&req, prompt.reasoning.as_ref())?;
        let constraint = match (&forced, req.constraint()) {
            (Some(f), _) => loaded.constraint(f, "tool_choice")?,
            (None, Some(f)) => loaded.constraint(f, "response_format")?,
            (None, None) => None,
        };
        let vocab = loaded.model.vocab();
        // A chat template writes the BOS token itself (transformers tokenizes its output with
        // `add_special_tokens=False`); a raw prompt gets the one the vocabulary asks for.
        let add_bos = req.raw_prompt && vocab.should_add_bos();
        let tokens = vocab.tokenize(prompt.text.as_bytes(), add_bos, true);
        let depth = match &decision {
            Plan::Speculate { depth, .. } => Some(*depth),
            Plan::TargetOnly { .. } => None,
        };
        if let Some(d) = depth.filter(|&d| d as usize + 2 >= self.inner.n_ctx as usize) {
            return Err(ProviderError::InvalidRequest {
                field: "speculation",
                message: format!(
                    "num_draft_tokens {d} cannot fit: a round holds {d} proposals and the \
                     target's token in the {}-token context (set extra n_ctx, or draft fewer)",
                    self.inner.n_ctx
                ),
            });
        }
        let reserve = depth.unwrap_or(0) as usize + 2;
        let room = (self.inner.n_ctx as usize).saturating_sub(tokens.len() + reserve);
        if room == 0 {
            return Err(ProviderError::ContextLengthExceeded {
                context: self.inner.n_ctx as usize,
                message: format!(
                    "this model's maximum context length is {} tokens (n_ctx); {} prompt tokens \
                     leave no room in it (set extra n_ctx)",
                    self.inner.n_ctx,
                    tokens.len(),
                ),
            });
        }
        // no bound asked for: to the end of the context, as llama-server does
        let asked = req.max_output_tokens.map_or(room, |n| n as usize);
        let max_new = asked.min(room);
        if self.inner.busy.swap(true, Ordering::AcqRel) {
            return Err(ProviderError::Busy {
                model: self.inner.name.clone(),
            });
        }
        let job = engine::Job {
            tokens,
            max_new,
            stop: req.stop.clone(),
            reasoning: prompt.reasoning.clone(),
            tool_format,
            // what `ReplyText::with_tool_calls` reads of the request
            tool_request: GenerateRequest {
                tools: req.tools.clone(),
                tool_choice: req.tool_choice.clone(),
                parallel_tool_calls: req.parallel_tool_calls,
                ..GenerateRequest::default()
            },
            sampling: req.sampling.clone(),
            depth,
            n_ctx: self.inner.n_ctx,
            threads: self.inner.threads,
            cache_type: self.inner.cache_type,
            cancel: req.cancel.clone(),
        };
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Result<StreamEvent, ProviderError>>();
        let busy = self.inner.busy.clone();
        let this = self.clone();
        let input_tokens = job.tokens.len() as u64;
        // the caller may wait for this thread to have stopped (see `Cancel::idle`)
        let lease = req.cancel.lease();
        std::thread::Builder::new()
            .name("mtp-gguf".into())
            .spawn(move || {
                let _lease = lease;
                struct Release(Arc<AtomicBool>);
                impl Drop for Release {
                    fn drop(&mut self) {
                        self.0.store(false, Ordering::Release);
                    }
                }
                let release = Release(busy);
                let mut sink = ChannelSink { tx: tx.clone() };
                let result = match backend() {
                    Ok(b) => engine::run(b, &loaded.model, &job, constraint, &mut sink),
                    Err(e) => Err(e),
                };
                // Free the provider (and this job's hold on the weights) before the caller
                // sees the final event: its next call is never refused as busy, and an
                // `unload` right after it frees the model.
                drop(loaded);
                drop(release);
                let event = match result {
                    Ok(out) => Ok(StreamEvent::Done(Box::new(this.response(
                        &decision,
                        out,
                        input_tokens,
                        (max_new < asked).then_some(asked),
                    )))),
                    Err(e) => Err(this.api_err(e)),
                };
                let _ = tx.send(event);
            })
            .map_err(|e| {
                self.inner.busy.store(false, Ordering::Release);
                self.api_err(format!("starting the generation thread: {e}"))
            })?;
        let stream =
            futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|e| (e, rx)) });
        Ok(stream.boxed())
    }

    /// The final response; `clipped` is the `max_output_tokens` asked for when the context
    /// left less room than that.
    fn response(
        &self,
        decision: &Plan,
        out: engine::Outcome,
        input_tokens: u64,
        clipped: Option<usize>,
    ) -> GenerateResponse {
        let speculation = decision.report(RUNTIME, &out.stats);
        let n_out = out.ids.len() as u64;
        let per_s = |n: f64, ms: f64| (ms > 0.0).then(|| n * 1000.0 / ms);
        let timings = Timings {
            time_to_first_token_ms: Some(out.first_token_ms),
            prefill_ms: Some(out.prefill_ms),
            prefill_tokens_per_s: per_s(input_tokens as f64, out.prefill_ms),
            decode_ms: Some(out.decode_ms),
            decode_tokens_per_s: per_s(n_out as f64, out.decode_ms),
            draft_ms: matches!(decision, Plan::Speculate { .. }).then_some(out.draft_ms),
            verify_ms: matches!(decision, Plan::Speculate { .. }).then_some(out.verify_ms),
            rollback_ms: matches!(decision, Plan::Speculate { .. }).then_some(out.rollback_ms),
            constraint_ms: out.constraint_ms,
        };
        let finish_reason = match out.finish.unwrap_or(FinishReason::Length) {
            // a reply that ends with tool calls is over for the caller to run them
            FinishReason::Stop if !out.tool_calls.is_empty() => FinishReason::ToolCalls,
            f => f,
        };
        let mut warnings = out.tool_warnings;
        if let (Some(asked), FinishReason::Length) = (clipped, finish_reason) {
            warnings.push(format!(
                "stopped at the context length: {input_tokens} prompt and {n_out} reply tokens \
                 fill the {}-token context (n_ctx), before max_output_tokens ({asked})",
                self.inner.n_ctx
            ));
        }
        GenerateResponse {
            content: out.text,
            reasoning_content: out.reasoning,
            token_ids: Some(out.ids),
            finish_reason,
            usage: Usage {
                input_tokens,
                output_tokens: n_out,
                cached_input_tokens: 0,
            },
            metadata: Metadata {
                speculation,
                timings,
            },
            partial: false,
            warnings,
            tool_calls: out.tool_calls,
            stop_sequence: None,
            prompt_logprobs: None,
            logprobs: None,
        }
    }
}

struct ChannelSink {
    tx: tokio::sync::mpsc::UnboundedSender<Result<StreamEvent, ProviderError>>,
}

impl engine::Sink for ChannelSink {
    fn prompt(&mut self, progress: mtp_contract::PromptProgress) {
        let _ = self.tx.send(Ok(StreamEvent::PromptProgress(progress)));
    }

    /// The piece's text and reasoning (with the tokens behind them), then its tool-call
    /// pieces, as the native provider sends them.
    fn delta(&mut self, text: Split, ids: &[u32]) -> bool {
        if (!text.content.is_empty() || !text.reasoning.is_empty() || !ids.is_empty())
            && self
                .tx
                .send(Ok(StreamEvent::Delta {
                    text: text.content,
                    token_ids: ids.to_vec(),
                    reasoning: text.reasoning,
                    logprobs: Vec::new(),
                }))
                .is_err()
        {
            return false;
        }
        text.tool_calls
            .into_iter()
            .all(|d| self.tx.send(Ok(StreamEvent::ToolCall(d))).is_ok())
    }
}

#[async_trait::async_trait]
impl Provider for GgufProvider {
    fn name(&self) -> &str {
        PROVIDER
    }

    fn model(&self) -> &str {
        &self.inner.name
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            provider: PROVIDER.into(),
            runtime: RUNTIME.into(),
            streaming: true,
            prompt_cache: false,
            images: false,
            per_request_speculation: true,
        }
    }

    fn speculation_status(&self) -> SpeculationStatus {
        let resolved = resolve(self.inner.default.as_ref(), None);
        match &self.inner.lane {
            Lane::Ready {
                drafter,
                default_depth,
                output_preserving,
                ..
            } => SpeculationStatus {
                lane_loaded: true,
                drafter: Some(drafter.clone()),
                num_draft_tokens: Some(resolved.depth_or(*default_depth)),
                default_mode: resolved.mode,
                reason: None,
                message: Some(format!("embedded MTP head run in-process by {RUNTIME}")),
                output_preserving: *output_preserving,
                // llama.cpp drafts at a fixed depth
                auto_depth: false,
            },
            Lane::Unavailable { reason, message } => SpeculationStatus {
                lane_loaded: false,
                drafter: None,
                num_draft_tokens: None,
                default_mode: resolved.mode,
                reason: Some(*reason),
                message: Some(message.clone()),
                output_preserving: None,
                auto_depth: false,
            },
        }
    }

    async fn generate(&self, request: GenerateRequest) -> Result<GenerateResponse, ProviderError> {
        let mut stream = self.start(request)?;
        while let Some(ev) = stream.next().await {
            if let StreamEvent::Done(r) = ev? {
                return Ok(*r);
            }
        }
        Err(self.api_err("the generation thread ended without a result".into()))
    }

    async fn generate_stream(
        &self,
        request: GenerateRequest,
    ) -> Result<EventStream, ProviderError> {
        self.start(request)
    }

    fn context_length(&self) -> Option<usize> {
        Some(self.inner.n_ctx as usize)
    }

    async fn unload(&self) -> Result<(), ProviderError> {
        if let Ok(mut l) = self.inner.loaded.lock() {
            *l = None;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::locate;

    fn dir_with(names: &[&str]) -> tempfile::TempDir {
        let d = tempfile::tempdir().expect("tempdir");
        for n in names {
            std::fs::write(d.path().join(n), b"GGUF").expect("write");
        }
        d
    }

    fn message(r: Result<std::path::PathBuf, mtp_contract::ProviderError>) -> String {
        match r {
            Ok(p) => panic!("expected an error, got {}", p.display()),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_folder_resolves_to_its_one_model_file() {
        // the vision projector and the later shards of a split model are not models to load
        let d = dir_with(&[
            "Model-Q4_K_M-00001-of-00002.gguf",
            "Model-Q4_K_M-00002-of-00002.gguf",
            "mmproj-Model-F16.gguf",
            "README.md",
        ]);
        let p = locate(&d.path().to_string_lossy()).expect("one model");
        assert_eq!(
            p.file_name().expect("name"),
            "Model-Q4_K_M-00001-of-00002.gguf"
        );
    }

    #[test]
    fn several_models_or_none_are_named() {
        let d = dir_with(&["Model-Q8_0.gguf", "Model-Q4_K_M.gguf"]);
        let m = message(locate(&d.path().to_string_lossy()));
        assert!(
            m.contains("several GGUF models; name one of them: Model-Q4_K_M.gguf, Model-Q8_0.gguf"),
            "{m}"
        );
        let d = dir_with(&["mmproj-F16.gguf"]);
        let m = message(locate(&d.path().to_string_lossy()));
        assert!(m.contains("no GGUF model file in"), "{m}");
    }
}
