//! The seam between the native provider and the engine: what a loaded model must offer.

use std::sync::Arc;

use mtp_chat::ReasoningStart;
use mtp_contract::{
    DraftStats, FinishReason, GenerateRequest, ProviderError, Sampling, Timings, TokenLogprob,
    Vocabulary,
};

use super::prefix_cache::CacheState;

/// A request rendered with the chat template and tokenized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderedPrompt {
    /// The prompt's token ids.
    pub ids: Vec<u32>,
    /// How to read the reply when the template writes reasoning blocks.
    pub reasoning: Option<ReasoningStart>,
    /// The length of the conversation before the generation prompt (the header that opens the
    /// assistant's turn), when it is a proper prefix of `ids`: the next turn of a chat re-renders
    /// the conversation up to there identically, so a state kept there can be resumed.
    pub history_len: Option<usize>,
    /// The request's images in the order the prompt shows them; `ids` holds each one's run of
    /// image tokens already.
    pub images: Vec<mtp_contract::ImageInput>,
    /// With images: `ids` with each image's run of tokens replaced by words of the image's
    /// digest, the prompt's key in the prefix cache (the image tokens are alike whatever the
    /// picture; the engine checks the images again before it resumes).
    pub cache_ids: Option<Vec<u32>>,
}

impl RenderedPrompt {
    /// The prompt's key in the prefix cache.
    pub fn key_ids(&self) -> &[u32] {
        self.cache_ids.as_deref().unwrap_or(&self.ids)
    }
}

/// The text of a reply, token by token: each step's cost does not grow with the reply.
pub trait TextDecoder {
    /// Adds one token; returns its text once a complete piece is ready.
    fn step(&mut self, id: u32) -> Result<Option<String>, ProviderError>;
    /// Ends the reply: what is still held back.
    fn finish(&mut self) -> Result<String, ProviderError>;
}

/// A drafter lane loaded next to the target.
#[derive(Debug, Clone, PartialEq)]
pub struct DrafterLane {
    /// Its name in reports: a repo id, a path, or `embedded`.
    pub name: String,
    /// The depth used when neither the provider nor the request names one.
    pub default_depth: u32,
    /// Whether greedy output is known to be unchanged by drafting.
    pub output_preserving: Option<bool>,
}

/// One generation job handed to the backend (on a blocking thread).
pub struct Job<'a, S> {
    /// The full prompt, rendered and tokenized.
    pub prompt: &'a [u32],
    /// A cached state covering `prompt[..n]`.
    pub resume: Option<(usize, Arc<S>)>,
    /// Draft depth; `None` decodes target-only. With `auto_depth`, the most a round drafts.
    pub depth: Option<u32>,
    /// Choose each round's depth up to `depth` (`num_draft_tokens: "auto"`).
    pub auto_depth: bool,
    /// Sampling controls.
    pub sampling: &'a Sampling,
    /// Generation bound.
    pub max_tokens: usize,
    /// The shape the reply must take (none for free text), enforced on every token.
    pub response_format: Option<&'a mtp_contract::ResponseFormat>,
    /// `response_format` compiled ahead ([`Backend::compile_constraint`]), when the backend
    /// compiles its constraints itself.
    pub constraint: Option<mtp_grammar::Constraint>,
    /// Keep the state at the end of the prompt and at the end of generation.
    pub checkpoint: bool,
    /// Also keep the state after this many prompt tokens (see
    /// [`RenderedPrompt::history_len`]), when `checkpoint` is set.
    pub checkpoint_at: Option<usize>,
    /// The prompt's images (see [`RenderedPrompt::images`]).
    pub images: &'a [mtp_contract::ImageInput],
    /// Called with each batch of accepted tokens and, when `logprobs` asked for them, their
    /// log probabilities (else none); returning `false` stops generation.
    pub on_tokens: &'a mut dyn FnMut(&[u32], Vec<TokenLogprob>) -> bool,
    /// Report each token's log probability with this many alternatives.
    pub logprobs: Option<u32>,
    /// Told how far the prompt's computation has got (from the thread that computes it).
    pub on_prompt_progress: Option<mtp_contract::ProgressSink>,
    /// The request's cancellation: the backend stops at its next step once it is cancelled
    /// (a prompt part, a decode step), as when `on_tokens` returns `false`.
    pub cancel: mtp_contract::Cancel,
}

/// What a finished job returns.
pub struct RunOutput<S> {
    /// Generated tokens (excluding the prompt; excluding an end-of-sequence token).
    pub tokens: Vec<u32>,
    /// Why it stopped (`Stop` for end-of-sequence, `Length`, `Cancelled`).
    pub finish: FinishReason,
    /// Draft statistics (empty for target-only runs).
    pub stats: DraftStats,
    /// Timings measured by the backend.
    pub timings: Timings,
    /// Prompt tokens actually computed (not resumed from cache).
    pub computed_prompt_tokens: usize,
    /// The state after the prompt, when `checkpoint` was asked for.
    pub prompt_state: Option<Arc<S>>,
    /// The state after `checkpoint_at` prompt tokens, when asked for and computed here.
    pub history_state: Option<Arc<S>>,
    /// The state after the last generated token, when `checkpoint` was asked for.
    pub final_state: Option<Arc<S>>,
}

/// A loaded model the native provider can drive.
pub trait Backend: Send + Sync + 'static {
    /// A snapshot of the full decoding state (caches of target and drafter).
    type State: CacheState + 'static;

    /// What executes, e.g. `mtp-engine-cpu`.
    fn runtime(&self) -> String;

    /// The drafter loaded with the model, if any.
    fn drafter(&self) -> Option<DrafterLane>;

    /// Renders the request (chat template, system prompt, history, tools, `thinking`) into
    /// token ids.
    fn render(&self, request: &GenerateRequest) -> Result<RenderedPrompt, ProviderError>;

    /// Compiles a request's `response_format` before its job is queued (on the blocking pool,
    /// so a constraint that does not compile or is past the grammar's limits is refused
    /// before any generation, and never compiles on the thread that batches sequences).
    /// `None`: the backend compiles nothing ahead.
    fn compile_constraint(
        &self,
        format: &mtp_contract::ResponseFormat,
    ) -> Result<Option<mtp_grammar::Constraint>, ProviderError> {
        let _ = format;
        Ok(None)
    }

    /// Whether requests may carry images (`Err` says why not).
    fn accepts_images(&self) -> Result<(), String> {
        Err("this model takes no images".into())
    }

    /// An incremental decoder for one reply.
    fn decoder(&self) -> Result<Box<dyn TextDecoder + '_>, ProviderError>;

    /// Runs one generation job.
    fn run(&self, job: Job<'_, Self::State>) -> Result<RunOutput<Self::State>, ProviderError>;

    /// Runs one job alongside the others in flight (continuous batching, at most `max_batch`
    /// sequences per step); the tokens, and the prefix-cache states resumed and kept, are the
    /// ones [`Backend::run`] gives. A backend without a batching engine runs the job alone.
    fn run_batched(
        &self,
        max_batch: usize,
        job: Job<'_, Self::State>,
    ) -> Result<RunOutput<Self::State>, ProviderError> {
        let _ = max_batch;
        self.run(job)
    }

    /// Reads a state written by [`CacheState::to_bytes`] on this model (a prefix cache on
    /// disk); `Err` says why it does not fit.
    fn state_from_bytes(&self, bytes: &[u8]) -> Result<Self::State, String> {
        let _ = bytes;
        Err("this backend keeps prefix-cache states in memory only".into())
    }

    /// What this model's states depend on (weights, drafter, precision, state format): a
    /// prefix cache on disk keeps each identity's states apart. `None`: states are not
    /// persisted; `Err`: why it cannot be known.
    fn state_identity(&self) -> Result<Option<String>, String> {
        Ok(None)
    }

    /// Approximate bytes of weights held in memory.
    fn weight_bytes(&self) -> usize;

    /// The longest sequence (prompt and reply) the model takes, when its config says.
    fn context_length(&self) -> Option<usize> {
        None
    }

    /// The number of token ids the model knows, when the backend says: a request's
    /// `logit_bias` naming an id past it is refused.
    fn vocab_size(&self) -> Option<usize> {
        None
    }

    /// The model's vocabulary as a service (`/tokenize`, log probabilities' token texts);
    /// `None` when the backend has no tokenizer.
    fn vocabulary(&self) -> Option<Arc<dyn Vocabulary>> {
        None
    }

    /// The log probability of each of `prompt`'s tokens after the ones before it (the first
    /// has none), with `top` alternatives each: `echo` with `logprobs`. `images` are the
    /// prompt's (see [`RenderedPrompt::images`]).
    fn prompt_logprobs(
        &self,
        prompt: &[u32],
        top: u32,
        images: &[mtp_contract::ImageInput],
        cancel: &mtp_contract::Cancel,
    ) -> Result<Vec<TokenLogprob>, ProviderError> {
        let _ = (prompt, top, images, cancel);
        Err(ProviderError::Unsupported {
            provider: mtp_contract::ProviderKind::Native.name().into(),
            what: "the prompt's log probabilities (echo)".into(),
        })
    }

    /// The most proposals one round can verify, when the backend has a limit.
    fn max_depth(&self) -> Option<u32> {
        None
    }

    /// How the reply's tool calls are read: the tool-call format of the template `request`
    /// renders with (`None`: no calls are read), and the constraint a forced call
    /// (`tool_choice` `required` or a named function) decodes under, after the reasoning
    /// block `reasoning` says the prompt opened. A backend without templates refuses a
    /// forced call.
    fn tool_calls(
        &self,
        request: &GenerateRequest,
        reasoning: Option<&ReasoningStart>,
    ) -> Result<mtp_chat::ToolDecoding, ProviderError> {
        let _ = reasoning;
        if request.tool_choice.forces_a_call() {
            return Err(ProviderError::InvalidRequest {
                field: "tool_choice",
                message: "this backend cannot force a tool call".into(),
            });
        }
        Ok((None, None))
    }

    /// The checkpoint's recommended sampling (see `Provider::recommended_sampling`).
    fn recommended_sampling(&self) -> Option<Sampling> {
        None
    }
}
