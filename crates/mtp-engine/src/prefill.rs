//! A prompt computed a chunk per step: the commit side of a prompt chunk.
//!
//! A joining sequence's prompt is never run by a forward of its own: each step's plan gives
//! it a chunk (`batch.rs`), the chunk's rows ride in the step's one target forward, and the
//! sequence takes the chunk's hidden rows here ([`PromptFill::absorb`]): the drafter's pairs
//! for a speculating sequence, and the prefix-cache state after the conversation when the
//! chunk ends there. The last chunk's logits row starts the decoding
//! ([`PromptFill::into_target`], [`PromptFill::into_round`]). Chunks end where the plan says
//! ([`PromptFill::next_end`]), so a prompt computed in parts resumes exactly as a prefix-cache
//! state does.

use std::borrow::Cow;
use std::sync::Arc;

use crate::cache::SeqCache;
use crate::error::Result;
use crate::qwen3_5::Qwen35Model;
use crate::qwen3_5_mtp::{MtpCache, MtpHead};
use crate::resume::{Keep, PromptState};
use crate::sampling::Sampler;
use crate::speculative::{self, Round};
use crate::vision::MultimodalPrompt;

/// A prompt being computed: the caches after its first `done` tokens.
pub(crate) struct PromptFill {
    pub(crate) cache: SeqCache,
    /// The drafter's pairs so far (a speculating sequence's).
    mcache: Option<MtpCache>,
    /// The final-normed hidden row at position `done - 1` (empty at the start): it pairs with
    /// the next chunk's first token.
    last_hidden: Vec<f32>,
    pub(crate) done: usize,
}

/// What the last chunk leaves a target-only sequence.
pub(crate) struct TargetStart {
    pub(crate) cache: SeqCache,
    /// The last prompt position's hidden row.
    pub(crate) hidden: Vec<f32>,
    /// The state after the prompt, when kept.
    pub(crate) state: Option<PromptState>,
}

impl PromptFill {
    /// The caches to compute a prompt with `images` into: from `resume` (a state that covers a
    /// proper prefix of the prompt with the same images, chosen by the request's spec) or from
    /// the start, with room for `room` positions; with `head`, the drafter's too.
    pub(crate) fn new(
        model: &Qwen35Model,
        head: Option<&MtpHead>,
        (images, room): (Option<&Arc<MultimodalPrompt>>, usize),
        resume: Option<&PromptState>,
    ) -> Self {
        match resume {
            Some(st) => {
                let st = PromptState::resumed(Cow::Borrowed(st), room);
                let mut cache = st.cache;
                // the images of this prompt (those of the resumed prefix are the same)
                cache.set_images(images.cloned());
                PromptFill {
                    cache,
                    mcache: head.and(st.mcache),
                    last_hidden: st.last_hidden,
                    done: st.tokens,
                }
            }
            None => {
                let mut cache = model.new_cache();
                cache.reserve(room);
                cache.set_images(images.cloned());
                let mcache = head.map(|h| {
                    let mut m = h.new_cache();
                    m.reserve(room);
                    m
                });
                PromptFill {
                    cache,
                    mcache,
                    last_hidden: Vec::new(),
                    done: 0,
                }
            }
        }
    }

    /// Where the next chunk ends: `chunk` tokens on, or the prompt's end, or where the state
    /// after the conversation (`keep.at`) is to be kept.
    pub(crate) fn next_end(&self, len: usize, chunk: usize, keep: Keep) -> usize {
        let to = self.done.saturating_add(chunk.max(1)).min(len);
        match keep.at {
            Some(h) if keep.on && h > self.done && h < to => h,
            _ => to,
        }
    }

    /// The state after the tokens computed so far.
    pub(crate) fn state(&self) -> PromptState {
        PromptState {
            cache: self.cache.clone(),
            mcache: self.mcache.clone(),
            last_hidden: self.last_hidden.clone(),
            tokens: self.done,
        }
    }

    /// The hidden rows before the next pairs: the last one kept, then the chunk's.
    fn rows(&mut self, hidden: &[f32]) -> Vec<f32> {
        let mut hid = std::mem::take(&mut self.last_hidden);
        hid.extend_from_slice(hidden);
        hid
    }

    /// Takes a chunk that does not end the prompt: `hidden` are the rows of
    /// `prompt[done..to]`. A speculating sequence's drafter takes the pairs
    /// `(token[p + 1], hidden[p])` for `p < to - 1` (the last row pairs with the next chunk's
    /// first token).
    pub(crate) fn absorb(
        &mut self,
        model: &Qwen35Model,
        head: Option<&MtpHead>,
        prompt: &[u32],
        to: usize,
        hidden: &[f32],
    ) -> Result<()> {
        let dm = model.hidden_size();
        let hid = self.rows(hidden);
        if let (Some(head), Some(mc)) = (head, self.mcache.as_mut()) {
            let pairs = &prompt[self.done.max(1)..to];
            if !pairs.is_empty() {
                head.forward(model, pairs, &hid[..pairs.len() * dm], mc)?;
            }
        }
        self.last_hidden = hid[hid.len().saturating_sub(dm)..].to_vec();
        self.done = to;
        Ok(())
    }

    /// The last chunk of a target-only sequence: `hidden` are its rows; the caches and the
    /// state after the prompt when `keep.on`.
    pub(crate) fn into_target(
        self,
        dm: usize,
        hidden: &[f32],
        keep: Keep,
        len: usize,
    ) -> TargetStart {
        let hidden = hidden[hidden.len().saturating_sub(dm)..].to_vec();
        let state = keep.on.then(|| PromptState {
            cache: self.cache.clone(),
            mcache: None,
            last_hidden: hidden.clone(),
            tokens: len,
        });
        TargetStart {
            cache: self.cache,
            hidden,
            state,
        }
    }

    /// The last chunk of a speculating sequence: `hidden` are its rows and `logits` the
    /// prompt's last logits. Picks the first token (the round's `bonus`, not yet emitted),
    /// feeds the drafter the prompt's remaining pairs and `(bonus, hidden[len - 1])`, and
    /// picks its first proposal; the state after the prompt is kept between the two when
    /// `keep.on` (it holds the prompt's pairs only, as a resumed call expects).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn into_round(
        mut self,
        model: &Qwen35Model,
        head: &MtpHead,
        prompt: &[u32],
        hidden: &[f32],
        logits: &[f32],
        s: &mut Sampler,
        keep: Keep,
    ) -> Result<(Round, Option<PromptState>)> {
        let dm = model.hidden_size();
        let hid_all = self.rows(hidden);
        let mut mcache = self.mcache.take().unwrap_or_else(|| head.new_cache());
        // the pairs (token[p + 1], hidden[p]) for p < len - 1, then (b, hidden[len - 1])
        let pair_toks = &prompt[self.done.max(1)..];
        let n_pairs = pair_toks.len();
        let b = s.pick(logits, 0)?;
        let last_row = &hid_all[n_pairs * dm..(n_pairs + 1) * dm];
        let mut state = None;
        let last = if keep.on {
            if n_pairs > 0 {
                head.forward(model, pair_toks, &hid_all[..n_pairs * dm], &mut mcache)?;
            }
            state = Some(PromptState {
                cache: self.cache.clone(),
                mcache: Some(mcache.clone()),
                last_hidden: last_row.to_vec(),
                tokens: prompt.len(),
            });
            head.forward(model, &[b], last_row, &mut mcache)?
        } else {
            let mut shifted = pair_toks.to_vec();
            shifted.push(b);
            head.forward(model, &shifted, &hid_all[..(n_pairs + 1) * dm], &mut mcache)?
        };
        let round = speculative::Round::start(model, s, (self.cache, mcache), b, last)?;
        Ok((round, state))
    }
}
