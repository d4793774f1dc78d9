//! Prefix-cache support: the decoding state after a prompt, to resume a later request whose
//! prompt extends it without recomputing the shared prefix.
//!
//! A hybrid model's recurrent state cannot be trimmed back to an earlier position, so a state
//! is only reusable at exactly the position it was taken. [`PromptState`] holds the target's
//! caches after `tokens()` prompt tokens, the final hidden state of the last of them (the MTP
//! head pairs it with the next token), and, when it was taken by a speculative call, the
//! drafter's cache over the same prefix.

use std::sync::Arc;

use crate::cache::SeqCache;
use crate::qwen3_5_mtp::MtpCache;
use crate::vision::MultimodalPrompt;

/// The decoding state after a prompt prefix.
#[derive(Debug, Clone)]
pub struct PromptState {
    pub(crate) cache: SeqCache,
    /// Drafter entries for the pairs `(token[p + 1], hidden[p])`, `p < tokens - 1`.
    pub(crate) mcache: Option<MtpCache>,
    /// Final-normed hidden state at position `tokens - 1`.
    pub(crate) last_hidden: Vec<f32>,
    pub(crate) tokens: usize,
}

impl PromptState {
    /// Prompt tokens this state covers.
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    /// Bytes held (caches and hidden state).
    pub fn bytes(&self) -> usize {
        self.cache.bytes()
            + self.mcache.as_ref().map_or(0, MtpCache::bytes)
            + self.last_hidden.len() * std::mem::size_of::<f32>()
    }

    /// True when the state also carries the drafter's cache (taken by a speculative call).
    pub fn has_drafter_cache(&self) -> bool {
        self.mcache.is_some()
    }

    /// True when the state's prefix holds the same images at the same places as the prompt
    /// whose images are `images` (or neither holds any there): only then does it continue that
    /// prompt.
    pub fn same_images(&self, images: Option<&Arc<MultimodalPrompt>>) -> bool {
        MultimodalPrompt::same_prefix(
            self.cache.images().map(|m| &**m),
            images.map(|m| &**m),
            self.tokens,
        )
    }
}

/// The result of [`Engine::generate_resumable`](crate::Engine::generate_resumable).
#[derive(Debug, Clone)]
pub struct ResumableOutput {
    /// What `generate` returns.
    pub output: crate::engine::GenerationOutput,
    /// Prompt tokens computed by this call (the rest came from the resumed state).
    pub computed_prompt_tokens: usize,
    /// The state after the whole prompt, when a checkpoint was asked for.
    pub prompt_state: Option<PromptState>,
    /// The state after the last generated token fed to the model (the prompt followed by the
    /// first `tokens() - prompt_len` output tokens), when a checkpoint was asked for and
    /// generation fed at least one token. A later call whose prompt extends the prompt and the
    /// reply (the next chat turn) resumes from it.
    pub final_state: Option<PromptState>,
    /// The state after `checkpoint_at` prompt tokens, when a checkpoint was asked for with
    /// [`GenerateOptions::checkpoint_at`](crate::GenerateOptions::checkpoint_at) inside the part
    /// of the prompt this call computed.
    pub history_state: Option<PromptState>,
}
