//! What a generation is asked ([`GenerateOptions`]) and what it gives back
//! ([`GenerationOutput`], [`SpeculationOutcome`]): the engine's request and answer types, apart
//! from the model that runs them and from the batch that steps them.

use std::sync::Arc;

pub use mtp_contract::ProgressSink;
use mtp_contract::{DraftStats, FinishReason, Reason, ResponseFormat, Sampling, Timings};

use crate::constraint::Constraint;
use crate::resume::{Keep, KeptStates, PromptState};
use crate::vision::MultimodalPrompt;

/// The most proposals one MTP round verifies: the verify forward computes `depth + 1` rows,
/// and up to `kernels::MAX_ROWS` (32) rows every product keeps the single-step arithmetic
/// (beyond, prefill's panel product takes over, whose bits differ), so greedy output stays the
/// target's own. A deeper request is refused with this limit named.
pub const MAX_VERIFY_DEPTH: usize = crate::kernels::MAX_ROWS - 1;

/// Options of one `generate` call (builder style; defaults: greedy, 256 tokens, no speculation).
///
/// ```
/// use mtp_engine::GenerateOptions;
/// let o = GenerateOptions::greedy(64).num_draft_tokens(3);
/// assert_eq!(o.max_tokens, 64);
/// assert_eq!(o.num_draft_tokens, Some(3));
/// ```
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    /// Tokens to generate at most.
    pub max_tokens: usize,
    /// Sampling controls (the contract's type).
    pub sampling: Sampling,
    /// MTP proposals per round; `None` or `Some(0)` = target-only decoding. With
    /// `auto_depth`, the most a round may draft.
    pub num_draft_tokens: Option<usize>,
    /// Choose each round's depth, from 0 (a plain target step) to `num_draft_tokens`, from
    /// the measured acceptance and round costs (`num_draft_tokens: "auto"`); the tokens are
    /// the same as at any fixed depth.
    pub auto_depth: bool,
    /// Extra stop token ids (the checkpoint's EOS ids are always included unless `ignore_eos`).
    pub stop_token_ids: Vec<u32>,
    /// Do not stop at EOS (parity tests, benchmarks).
    pub ignore_eos: bool,
    /// A prefix-cache state to resume from: one taken after a prefix of the prompt (by an
    /// earlier call's [`GenerationOutput::states`], or read back with [`crate::persist`]).
    /// One that covers the whole prompt, holds other images or, when this call speculates,
    /// lacks the drafter's cache is not used (the prompt is computed in full);
    /// [`GenerationOutput::computed_prompt_tokens`] says what was computed. Output is the same
    /// with or without a resumed state.
    pub resume: Option<Arc<PromptState>>,
    /// Keep the prefix-cache states after the prompt and after the last token fed (and after
    /// `checkpoint_at`), returned in [`GenerationOutput::states`].
    pub checkpoint: bool,
    /// With `checkpoint`, also keep the state after this many prompt tokens (a chat's
    /// conversation before its generation prompt: the next turn renders the same tokens there
    /// and can resume from it). Ignored when it is not inside the part of the prompt this call
    /// computes.
    pub checkpoint_at: Option<usize>,
    /// The shape the reply must take (JSON Schema, regex, Lark grammar), enforced on every
    /// pick, drafts included; compiled before any model work.
    pub response_format: Option<ResponseFormat>,
    /// `response_format` compiled already ([`Engine::constraint`](crate::Engine::constraint), on the thread that
    /// prepared the request, before it was queued): the reply starts from a copy of it, so
    /// compilation never runs on the scheduler's thread.
    pub constraint: Option<Constraint>,
    /// The images of the prompt, placed on its expanded `<|image_pad|>` runs (see
    /// [`Engine::multimodal_prompt`](crate::Engine::multimodal_prompt)).
    pub images: Option<Arc<MultimodalPrompt>>,
    /// Told how far the prompt's computation has got: when it starts (with the tokens
    /// resumed), after each part of a long prompt, and when the prompt is in (called on the
    /// thread that computes it, so it must return at once).
    pub on_prompt_progress: Option<ProgressSink>,
    /// The request's cancellation: once cancelled, the sequence ends at the next step (a
    /// prompt part or a decode step), finish `Cancelled`, as a caller's `false` ends it.
    pub cancel: Option<mtp_contract::Cancel>,
    /// Report each generated token's log probability under the target model, with this many
    /// of the most likely alternatives (0: the token's alone; at most
    /// [`crate::MAX_TOP_LOGPROBS`]), in [`GenerationOutput::logprobs`] and to `on_logprobs`.
    /// Taken from the target's logits before penalties, temperature and a constraint's mask,
    /// so they are the same with MTP on and off.
    pub logprobs: Option<usize>,
    /// Told each chunk's log probabilities (with `logprobs`), just before the chunk's tokens
    /// reach the caller's callback.
    pub on_logprobs: Option<crate::LogprobSink>,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_tokens: 256,
            sampling: Sampling::default(),
            num_draft_tokens: None,
            auto_depth: false,
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            resume: None,
            checkpoint: false,
            checkpoint_at: None,
            response_format: None,
            constraint: None,
            images: None,
            on_prompt_progress: None,
            cancel: None,
            logprobs: None,
            on_logprobs: None,
        }
    }
}

impl GenerateOptions {
    /// Greedy decoding of at most `max_tokens` tokens.
    pub fn greedy(max_tokens: usize) -> Self {
        GenerateOptions {
            max_tokens,
            ..Default::default()
        }
    }

    /// Sets the sampling controls.
    pub fn sampling(mut self, s: Sampling) -> Self {
        self.sampling = s;
        self
    }

    /// Sets the speculation depth (0 = off).
    pub fn num_draft_tokens(mut self, k: usize) -> Self {
        self.num_draft_tokens = Some(k);
        self
    }

    /// Chooses each round's depth up to `max` (`num_draft_tokens: "auto"`).
    ///
    /// ```
    /// let o = mtp_engine::GenerateOptions::greedy(8).auto_depth(8);
    /// assert!(o.auto_depth);
    /// assert_eq!(o.num_draft_tokens, Some(8));
    /// ```
    pub fn auto_depth(mut self, max: usize) -> Self {
        self.num_draft_tokens = Some(max);
        self.auto_depth = true;
        self
    }

    /// Constrains the reply to `format`.
    pub fn response_format(mut self, format: ResponseFormat) -> Self {
        self.response_format = Some(format);
        self
    }

    /// Reports each generated token's log probability with `top` alternatives
    /// ([`GenerateOptions::logprobs`]).
    pub fn logprobs(mut self, top: usize) -> Self {
        self.logprobs = Some(top);
        self
    }

    /// Keeps generating past EOS.
    pub fn ignore_eos(mut self, yes: bool) -> Self {
        self.ignore_eos = yes;
        self
    }

    /// Resumes from a prefix-cache state (see [`GenerateOptions::resume`]).
    pub fn resume_from(mut self, state: Arc<PromptState>) -> Self {
        self.resume = Some(state);
        self
    }

    /// Reports the prompt's progress to `f` (see [`GenerateOptions::on_prompt_progress`]).
    pub fn on_prompt_progress(
        mut self,
        f: impl Fn(mtp_contract::PromptProgress) + Send + Sync + 'static,
    ) -> Self {
        self.on_prompt_progress = Some(ProgressSink::new(f));
        self
    }

    /// Keeps the prefix-cache states (see [`GenerateOptions::checkpoint`]).
    pub fn checkpoint(mut self, yes: bool) -> Self {
        self.checkpoint = yes;
        self
    }

    /// The prefix-cache states this call keeps.
    pub(crate) fn keep(&self) -> Keep {
        Keep {
            on: self.checkpoint,
            at: self.checkpoint_at.filter(|_| self.checkpoint),
        }
    }
}

/// What speculation did in one call.
#[derive(Debug, Clone, Default)]
pub struct SpeculationOutcome {
    /// True when MTP rounds ran.
    pub used: bool,
    /// Proposals per round requested (with `auto_depth`, the most a round could draft).
    pub num_draft_tokens: usize,
    /// Each round's depth was chosen (`GenerateOptions::auto_depth`); the depths used are in
    /// `stats` ([`DraftStats::rounds_per_depth`]).
    pub auto_depth: bool,
    /// Drafted / accepted / rounds / per-position acceptance.
    pub stats: DraftStats,
    /// Why speculation was not used although requested, in the contract's codes
    /// (`no_mtp_head`, `sampling_requires_target_only`), decided by [`mtp_contract::plan`].
    pub not_used_reason: Option<Reason>,
    /// What to do about it (the plan's message), with `not_used_reason`.
    pub not_used_message: Option<String>,
}

/// The result of `generate`.
#[derive(Debug, Clone)]
pub struct GenerationOutput {
    /// Generated token ids (without the stop token).
    pub tokens: Vec<u32>,
    /// Why generation ended.
    pub finish_reason: FinishReason,
    /// Prefill / decode / draft / verify / rollback timings.
    pub timings: Timings,
    /// Speculation statistics, when speculation was requested.
    pub speculation: Option<SpeculationOutcome>,
    /// Prompt tokens processed.
    pub prompt_tokens: usize,
    /// Prompt tokens computed by this call (the rest came from the resumed state).
    pub computed_prompt_tokens: usize,
    /// The prefix-cache states kept, when [`GenerateOptions::checkpoint`] asked for them.
    pub states: KeptStates,
    /// Each generated token's log probability, when [`GenerateOptions::logprobs`] asked for
    /// them (one per token of `tokens`).
    pub logprobs: Vec<crate::TokenLogprob>,
}
