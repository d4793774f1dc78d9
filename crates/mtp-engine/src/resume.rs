//! Prefix-cache support: the decoding state after a prompt, to resume a later request whose
//! prompt extends it without recomputing the shared prefix.
//!
//! A hybrid model's recurrent state cannot be trimmed back to an earlier position, so a state
//! is only reusable at exactly the position it was taken. [`PromptState`] holds the target's
//! caches after `tokens()` prompt tokens, the final hidden state of the last of them (the MTP
//! head pairs it with the next token), and, when it was taken by a speculative call, the
//! drafter's cache over the same prefix.

use std::borrow::Cow;
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

    /// The state a call computes on from: moved when the call owns it (its own earlier
    /// chunk), copied when kept elsewhere (a prefix cache's), its KV caches with room for
    /// `positions` in all either way (see [`SeqCache::reserve`]).
    pub(crate) fn resumed(st: Cow<'_, PromptState>, positions: usize) -> PromptState {
        match st {
            Cow::Owned(mut st) => {
                st.cache.reserve(positions);
                if let Some(m) = st.mcache.as_mut() {
                    m.reserve(positions);
                }
                st
            }
            Cow::Borrowed(st) => PromptState {
                cache: st.cache.clone_with_room(positions),
                mcache: st.mcache.as_ref().map(|m| m.clone_with_room(positions)),
                last_hidden: st.last_hidden.clone(),
                tokens: st.tokens,
            },
        }
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

/// Which prefix-cache states a call keeps ([`GenerateOptions::checkpoint`] and
/// [`GenerateOptions::checkpoint_at`](crate::GenerateOptions::checkpoint_at)).
///
/// [`GenerateOptions::checkpoint`]: crate::GenerateOptions::checkpoint
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Keep {
    /// Keep the states after the prompt and after the last token fed.
    pub(crate) on: bool,
    /// Also keep the state after this many prompt tokens (only with `on`).
    pub(crate) at: Option<usize>,
}

/// The prefix-cache states a generation kept, when [`GenerateOptions::checkpoint`] asked for
/// them (see [`GenerationOutput::states`](crate::GenerationOutput::states)).
///
/// [`GenerateOptions::checkpoint`]: crate::GenerateOptions::checkpoint
#[derive(Debug, Clone, Default)]
pub struct KeptStates {
    /// The state after the whole prompt.
    pub after_prompt: Option<PromptState>,
    /// The state after the last generated token fed to the model (the prompt followed by the
    /// first `tokens() - prompt_len` output tokens), when generation fed at least one token. A
    /// later call whose prompt extends the prompt and the reply (the next chat turn) resumes
    /// from it.
    pub after_reply: Option<PromptState>,
    /// The state after [`GenerateOptions::checkpoint_at`](crate::GenerateOptions::checkpoint_at)
    /// prompt tokens, when that position is inside the part of the prompt this call computed.
    pub after_history: Option<PromptState>,
}

impl KeptStates {
    /// The states kept, the earliest first (history, prompt, reply).
    pub fn into_vec(self) -> Vec<PromptState> {
        [self.after_history, self.after_prompt, self.after_reply]
            .into_iter()
            .flatten()
            .collect()
    }
}

/// What a prompt's computation kept besides the decoding state: the states [`Keep`] asked
/// for and how many prompt tokens it computed (the rest came from the resumed state).
#[derive(Debug, Default)]
pub(crate) struct PrefillKept {
    pub(crate) prompt: Option<PromptState>,
    pub(crate) history: Option<PromptState>,
    pub(crate) computed: usize,
}
