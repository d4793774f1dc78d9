//! The seam between the native provider and the engine: what a loaded model must offer.

use std::sync::Arc;

use mtp_contract::{DraftStats, FinishReason, GenerateRequest, ProviderError, Sampling, Timings};

use super::prefix_cache::CacheState;

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
    /// Draft depth; `None` decodes target-only.
    pub depth: Option<u32>,
    /// Sampling controls.
    pub sampling: &'a Sampling,
    /// Generation bound.
    pub max_tokens: usize,
    /// Keep the state at the end of the prompt and at the end of generation.
    pub checkpoint: bool,
    /// Called with each batch of accepted tokens; returning `false` stops generation.
    pub on_tokens: &'a mut dyn FnMut(&[u32]) -> bool,
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
    /// The state after the last generated token, when `checkpoint` was asked for.
    pub final_state: Option<Arc<S>>,
}

/// A loaded model the native provider can drive.
pub trait Backend: Send + Sync + 'static {
    /// A snapshot of the full decoding state (caches of target and drafter).
    type State: CacheState + 'static;

    /// What executes, e.g. `candle-cpu`.
    fn runtime(&self) -> String;

    /// The drafter loaded with the model, if any.
    fn drafter(&self) -> Option<DrafterLane>;

    /// Renders the request (chat template, system prompt, history, `thinking`) into token ids.
    fn render(&self, request: &GenerateRequest) -> Result<Vec<u32>, ProviderError>;

    /// Decodes token ids into text.
    fn detokenize(&self, ids: &[u32]) -> Result<String, ProviderError>;

    /// Runs one generation job.
    fn run(&self, job: Job<'_, Self::State>) -> Result<RunOutput<Self::State>, ProviderError>;

    /// Approximate bytes of weights held in memory.
    fn weight_bytes(&self) -> usize;
}
