//! One sequence being generated: its caches, sampler (with its constraint), emitted tokens,
//! prompt states and timings, and the two halves of its step.
//!
//! A step is one target forward shared by every sequence of a [`crate::batch::Batch`]; a
//! sequence's part of it is
//! 1. [`Sequence::target_row`] (target-only: pick, emit and feed the next token) or a round's
//!    drafts (speculating: `speculative::draft_batch`, with the other speculating sequences),
//!    giving its row of the forward;
//! 2. the forward, run by the batch over every sequence's row, each with its own cache;
//! 3. [`Sequence::take_target`] (the next logits) or [`Sequence::take_round`] (accept, roll
//!    back, update the drafter, emit).
//!
//! [`crate::Engine::generate`] is a batch of one, so there is one decode loop.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;

use mtp_contract::{FinishReason, PromptProgress, Timings};

use crate::cache::SeqCache;
use crate::depth::Acceptance;
use crate::engine::{prefill_target, Engine, GenerateOptions, GenerationOutput, ProgressSink};
use crate::error::Result;
use crate::logprobs::{self, LogprobSink, TokenLogprob};
use crate::resume::{Keep, KeptStates, PrefillKept, PromptIn, PromptState};
use crate::sampling::Sampler;
use crate::speculative::{self, Drafts, Round, SpecTimings};
use crate::vision::MultimodalPrompt;
use crate::SpeculationOutcome;

/// A caller's callback: a sequence's id and its new tokens; false cancels it.
pub(crate) type OnTokens<'a> = dyn FnMut(u64, &[u32]) -> bool + 'a;

/// How a sequence decodes, decided when it joins.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Plan {
    /// MTP rounds (the engine has a drafter and the sampling allows them).
    pub(crate) speculate: bool,
    /// Proposals per round (with `auto`, the most a round drafts).
    pub(crate) depth: usize,
    /// Each round's depth is chosen.
    pub(crate) auto: bool,
}

/// A prompt still being computed, a chunk per step.
pub(crate) struct Filling {
    prompt: Vec<u32>,
    /// The state after the chunks computed so far.
    state: Option<PromptState>,
    images: Option<Arc<MultimodalPrompt>>,
    /// Milliseconds of the chunks so far.
    ms: f64,
}

/// How a sequence decodes.
pub(crate) enum Lane {
    /// Its prompt is being computed (the batch's prefill chunk per step).
    Filling(Box<Filling>),
    /// One token per step; `logits` are the target's for the next token, `hidden` the last
    /// fed position's hidden row (kept for a final state), `fed` the generated tokens fed.
    Target {
        cache: SeqCache,
        logits: Vec<f32>,
        hidden: Vec<f32>,
        history: Vec<u32>,
        fed: usize,
        /// A paced sequence's last token, emitted and not yet fed (it is fed once the caller
        /// has answered for it).
        unfed: Option<u32>,
    },
    /// MTP rounds of at most `depth` proposals; with `auto`, each round's depth is chosen up to
    /// `depth` from this acceptance estimate.
    Mtp {
        round: Box<Round>,
        depth: usize,
        auto: Option<Acceptance>,
    },
    /// Its output has been taken.
    Ended,
}

/// Fills the rates of `timings` at the end of a generation: time to first token and decode
/// figures from `first_at` (the first token) to now, prefill rate from its milliseconds.
fn close_timings(
    timings: &mut Timings,
    start: Instant,
    first_at: Option<Instant>,
    n_tokens: usize,
    computed: usize,
) {
    let end = Instant::now();
    if let Some(f) = first_at {
        timings.time_to_first_token_ms = Some((f - start).as_secs_f64() * 1e3);
        let decode = (end - f).as_secs_f64();
        timings.decode_ms = Some(decode * 1e3);
        if n_tokens > 1 && decode > 0.0 {
            timings.decode_tokens_per_s = Some((n_tokens - 1) as f64 / decode);
        }
    }
    if let Some(p) = timings.prefill_ms {
        if p > 0.0 {
            timings.prefill_tokens_per_s = Some(computed as f64 / (p / 1e3));
        }
    }
}

/// The most reply positions a sequence's KV caches get room for up front, beyond its prompt
/// (see [`crate::SeqCache::reserve`]): the room is address space, not memory, but a limit
/// keeps a request for a huge `max_tokens` from reserving gigabytes of it (which a host that
/// does not overcommit would refuse); a longer reply grows its caches as it goes, a doubling
/// at a time.
const REPLY_ROOM: usize = 8192;

/// One sequence of a batch.
pub(crate) struct Sequence {
    pub(crate) id: u64,
    prompt_len: usize,
    plan: Plan,
    pub(crate) sampler: Sampler,
    pub(crate) tokens: Vec<u32>,
    stops: Vec<u32>,
    max: usize,
    pub(crate) finish: Option<FinishReason>,
    start: Instant,
    first_at: Option<Instant>,
    spec_timings: SpecTimings,
    timings: Timings,
    outcome: Option<SpeculationOutcome>,
    pub(crate) lane: Lane,
    keep: Keep,
    kept: PrefillKept,
    /// Its caller answers each chunk ([`crate::batch::Batch::answer`]) before it goes on.
    paced: bool,
    /// A paced sequence waiting for the answer to its last chunk: it sits out the steps.
    pub(crate) held: bool,
    /// Where its prompt's progress goes.
    progress: Option<ProgressSink>,
    /// Its request's cancellation ([`GenerateOptions::cancel`]).
    cancel: Option<mtp_contract::Cancel>,
    /// The positions its caches get room for up front: prompt, reply (up to [`REPLY_ROOM`])
    /// and a verify's rows.
    room: usize,
    /// Alternatives per token's log probability, when they are reported
    /// ([`GenerateOptions::logprobs`]).
    top_logprobs: Option<usize>,
    /// The log probabilities of `tokens`, when reported.
    logprobs: Vec<TokenLogprob>,
    on_logprobs: Option<LogprobSink>,
}

impl Sequence {
    /// A joining sequence: checks it, then computes its prompt when it is at most `chunk`
    /// tokens past the resumed state (a longer one is computed a chunk per step, see
    /// [`Sequence::fill`]) and, when it speculates, emits its first token.
    pub(crate) fn join(
        engine: &Engine,
        id: u64,
        prompt: &[u32],
        opts: &GenerateOptions,
        (paced, chunk): (bool, usize),
        on: &mut OnTokens<'_>,
    ) -> Result<Sequence> {
        engine.check(prompt, opts)?;
        let (outcome, speculate) = engine.speculation_plan(opts);
        let plan = Plan {
            speculate: speculate && engine.drafter().is_some(),
            depth: opts.num_draft_tokens.unwrap_or(0),
            auto: opts.auto_depth,
        };
        let start = Instant::now();
        // a state is resumed only when it leaves a token to compute, holds the same images
        // and, for a speculating sequence, carries the drafter's cache
        let resume = opts.resume.as_deref().filter(|st| {
            st.tokens() < prompt.len()
                && st.same_images(opts.images.as_ref())
                && (!plan.speculate || st.has_drafter_cache())
        });
        let from = resume.map_or(0, PromptState::tokens);
        let mut seq = Sequence {
            id,
            prompt_len: prompt.len(),
            plan,
            sampler: engine.sampler(opts)?,
            tokens: Vec::new(),
            stops: engine.stop_ids(opts),
            max: opts.max_tokens,
            finish: None,
            start,
            first_at: None,
            spec_timings: SpecTimings::default(),
            timings: Timings::default(),
            outcome,
            lane: Lane::Ended,
            keep: opts.keep(),
            kept: PrefillKept {
                computed: prompt.len() - from,
                ..PrefillKept::default()
            },
            paced,
            held: false,
            progress: opts.on_prompt_progress.clone(),
            cancel: opts.cancel.clone(),
            room: prompt
                .len()
                .saturating_add(opts.max_tokens.min(REPLY_ROOM))
                .saturating_add(crate::kernels::MAX_ROWS),
            top_logprobs: opts.logprobs,
            logprobs: Vec::new(),
            on_logprobs: opts.on_logprobs.clone(),
        };
        seq.report_prompt(from);
        if prompt.len() - from > chunk {
            seq.lane = Lane::Filling(Box::new(Filling {
                prompt: prompt.to_vec(),
                state: resume.cloned(),
                images: opts.images.clone(),
                ms: 0.0,
            }));
        } else {
            let p = PromptIn {
                ids: prompt,
                images: opts.images.as_ref(),
                room: seq.room,
            };
            seq.start_decoding(engine, p, resume.map(Cow::Borrowed))?;
            seq.timings.prefill_ms = Some(start.elapsed().as_secs_f64() * 1e3);
            seq.report_prompt(prompt.len());
        }
        if seq.max == 0 {
            seq.finish = Some(FinishReason::Length);
        } else {
            seq.first_speculative_token(on);
        }
        Ok(seq)
    }

    /// Computes one chunk of a prompt still filling; its last chunk starts its decoding (and
    /// emits a speculating sequence's first token). Nothing for a sequence that is decoding.
    pub(crate) fn fill(
        &mut self,
        engine: &Engine,
        chunk: usize,
        on: &mut OnTokens<'_>,
    ) -> Result<()> {
        if !matches!(self.lane, Lane::Filling(_)) || self.finish.is_some() || self.held {
            return Ok(());
        }
        let Lane::Filling(mut f) = std::mem::replace(&mut self.lane, Lane::Ended) else {
            return Ok(());
        };
        let t0 = Instant::now();
        let done = f.state.as_ref().map_or(0, PromptState::tokens);
        if f.prompt.len() - done > chunk {
            let head = engine.drafter().filter(|_| self.plan.speculate);
            // a chunk ends where a history state is to be kept
            let to = match self.keep.at {
                Some(h) if h > done && h < done + chunk => h,
                _ => done + chunk,
            };
            let p = PromptIn {
                ids: &f.prompt,
                images: f.images.as_ref(),
                room: self.room,
            };
            let st = speculative::prefill_part(engine.model(), head, p, f.state.take(), to)?;
            if self.keep.at == Some(to) {
                self.kept.history = Some(st.clone());
            }
            f.state = Some(st);
            f.ms += t0.elapsed().as_secs_f64() * 1e3;
            self.lane = Lane::Filling(f);
            self.report_prompt(to);
            return Ok(());
        }
        // the state of the first chunks is this sequence's own: moved on, not copied
        let p = PromptIn {
            ids: &f.prompt,
            images: f.images.as_ref(),
            room: self.room,
        };
        self.start_decoding(engine, p, f.state.take().map(Cow::Owned))?;
        self.timings.prefill_ms = Some(f.ms + t0.elapsed().as_secs_f64() * 1e3);
        self.report_prompt(self.prompt_len);
        self.first_speculative_token(on);
        Ok(())
    }

    /// Computes the prompt (from `resume`, a prefix-cache state or the state after the first
    /// chunks, when given) into the decoding lane: an MTP round state (its first token not
    /// yet emitted) or the target's next logits. The prefix-cache states asked for are kept.
    fn start_decoding(
        &mut self,
        engine: &Engine,
        p: PromptIn<'_>,
        resume: Option<Cow<'_, PromptState>>,
    ) -> Result<()> {
        let model = engine.model();
        let (lane, kept) = match (self.plan.speculate, engine.drafter()) {
            (true, Some(head)) => {
                let (round, kept) =
                    speculative::prefill(model, head, p, &mut self.sampler, resume, self.keep)?;
                let lane = Lane::Mtp {
                    round: Box::new(round),
                    depth: self.plan.depth,
                    auto: self
                        .plan
                        .auto
                        .then(|| speculative::lock(engine.depths()).new_sequence()),
                };
                (lane, kept)
            }
            _ => {
                let pre = prefill_target(model, p, resume, self.keep)?;
                let lane = Lane::Target {
                    cache: pre.cache,
                    logits: pre.logits,
                    hidden: if self.keep.on { pre.hidden } else { Vec::new() },
                    history: p.ids.to_vec(),
                    fed: 0,
                    unfed: None,
                };
                (lane, pre.kept)
            }
        };
        self.lane = lane;
        self.kept.prompt = kept.prompt;
        if kept.history.is_some() {
            self.kept.history = kept.history;
        }
        Ok(())
    }

    /// Tells the progress sink that `processed` of the prompt's tokens are in (those of a
    /// resumed state among them).
    fn report_prompt(&self, processed: usize) {
        if let Some(sink) = &self.progress {
            sink.report(PromptProgress {
                total: self.prompt_len,
                cache: self.prompt_len - self.kept.computed,
                processed,
                time_ms: self.start.elapsed().as_millis() as u64,
            });
        }
    }

    /// A speculating sequence's prefill produced its first token: emit it.
    fn first_speculative_token(&mut self, on: &mut OnTokens<'_>) {
        if let Lane::Mtp { round, .. } = &mut self.lane {
            let b = round.bonus;
            // the prompt's last logits, kept for this (a vocabulary of floats, freed now)
            let row = std::mem::take(&mut round.first_logits);
            let lps = self
                .top_logprobs
                .map(|n| vec![logprobs::of_row(&row, b, n)])
                .unwrap_or_default();
            self.first_at = Some(Instant::now());
            self.emit(&[b], lps, on);
        }
    }

    /// Ends it (finish `Cancelled`) when its request was cancelled; true when it has ended.
    pub(crate) fn ends_if_cancelled(&mut self) -> bool {
        if self
            .cancel
            .as_ref()
            .is_some_and(mtp_contract::Cancel::is_cancelled)
        {
            self.finish.get_or_insert(FinishReason::Cancelled);
        }
        self.finish.is_some()
    }

    /// The state it kept after [`GenerateOptions::checkpoint_at`] prompt tokens, once
    /// computed.
    pub(crate) fn kept_history(&self) -> Option<&PromptState> {
        self.kept.history.as_ref()
    }

    /// Whether it takes the next step (it has not ended and does not wait for an answer).
    pub(crate) fn steps(&self) -> bool {
        self.finish.is_none() && !self.held
    }

    /// Emits `chunk`, the one emission rule for every sequence: the budget and the stop ids
    /// cut it, the caller gets what is left, and its answer is taken by
    /// [`Sequence::settle`]. A paced sequence whose chunk leaves it going is held until its
    /// caller answers ([`crate::batch::Batch::answer`]); its callback here only says whether
    /// the caller is still there. True when it may go on.
    ///
    /// `lps` are the chunk's log probabilities (empty when none are reported): cut with it,
    /// kept, and told to the sink just before the tokens go to `on`.
    fn emit(&mut self, chunk: &[u32], mut lps: Vec<TokenLogprob>, on: &mut OnTokens<'_>) -> bool {
        let mut take = chunk.len().min(self.remaining());
        if let Some(i) = chunk[..take].iter().position(|t| self.stops.contains(t)) {
            take = i;
            self.finish = Some(FinishReason::Stop);
        }
        let part = &chunk[..take];
        self.tokens.extend_from_slice(part);
        if part.is_empty() {
            return self.settle(true);
        }
        lps.truncate(take);
        if let Some(sink) = &self.on_logprobs {
            sink.send(&lps);
        }
        self.logprobs.extend(lps);
        let go = on(self.id, part);
        if !self.paced || self.finish.is_some() {
            // answered now (or an answer that changes nothing: a stop id ended it)
            return self.settle(go);
        }
        if !go {
            // the caller is gone
            self.finish = Some(FinishReason::Cancelled);
            return false;
        }
        self.held = true;
        true
    }

    /// The caller's answer to the last chunk (at once, or later for a paced sequence): false
    /// cancels; then the budget and a complete constraint end it. True when it goes on.
    pub(crate) fn settle(&mut self, go: bool) -> bool {
        self.held = false;
        if !go && self.finish.is_none() {
            self.finish = Some(FinishReason::Cancelled);
        }
        if self.finish.is_none() && self.tokens.len() >= self.max {
            self.finish = Some(FinishReason::Length);
        }
        if self.finish.is_none() && self.sampler.constraint_complete() {
            self.finish = Some(FinishReason::Stop);
        }
        self.finish.is_none()
    }

    /// A target-only sequence's token for this step's forward: the one it picks and emits
    /// now, or a paced sequence's token emitted earlier and answered since. `None` when
    /// nothing is fed (it ended, or it waits for its caller's answer).
    pub(crate) fn target_row(&mut self, on: &mut OnTokens<'_>) -> Result<Option<u32>> {
        let pos = self.tokens.len();
        let Lane::Target {
            logits,
            history,
            unfed,
            ..
        } = &mut self.lane
        else {
            return Ok(None);
        };
        if let Some(tok) = unfed.take() {
            return Ok(Some(tok));
        }
        // the log probabilities are the model's: the row is kept as it was only when the
        // penalties (or a bias) will change it (`pick` leaves it as it is)
        let raw = self
            .top_logprobs
            .filter(|_| self.sampler.alters_logits())
            .map(|_| logits.clone());
        self.sampler.apply_penalties(logits, history);
        let tok = self.sampler.pick(logits, pos)?;
        history.push(tok);
        self.first_at.get_or_insert_with(Instant::now);
        let lps = self
            .top_logprobs
            .map(|n| vec![logprobs::of_row(raw.as_deref().unwrap_or(logits), tok, n)])
            .unwrap_or_default();
        if !self.emit(&[tok], lps, on) {
            return Ok(None);
        }
        if self.held {
            if let Lane::Target { unfed, .. } = &mut self.lane {
                *unfed = Some(tok);
            }
            return Ok(None);
        }
        Ok(Some(tok))
    }

    /// Tokens still allowed.
    pub(crate) fn remaining(&self) -> usize {
        self.max.saturating_sub(self.tokens.len())
    }

    /// The target cache, taken out for the step's forward (an empty one is left in its
    /// place).
    pub(crate) fn take_cache(&mut self) -> SeqCache {
        match &mut self.lane {
            Lane::Target { cache, .. } => std::mem::replace(cache, SeqCache::new(Vec::new())),
            Lane::Mtp { round, .. } => round.take_cache(),
            Lane::Filling(_) | Lane::Ended => SeqCache::new(Vec::new()),
        }
    }

    /// Puts the target cache back after the step's forward.
    pub(crate) fn put_cache(&mut self, c: SeqCache) {
        match &mut self.lane {
            Lane::Target { cache, .. } => *cache = c,
            Lane::Mtp { round, .. } => round.put_cache(c),
            Lane::Filling(_) | Lane::Ended => {}
        }
    }

    /// A target-only sequence's rows of the step's forward (`n` rows of `dm` hidden values):
    /// the next logits; a paced one emits its next token now, so that its caller answers for
    /// it before the next step feeds it.
    pub(crate) fn take_target(
        &mut self,
        logits: Cow<'_, [f32]>,
        hidden: &[f32],
        dm: usize,
        on: &mut OnTokens<'_>,
    ) -> Result<()> {
        let keep = self.keep.on;
        let Lane::Target {
            logits: next,
            hidden: last,
            fed,
            ..
        } = &mut self.lane
        else {
            return Err(crate::Error::Batch(
                "a sequence changed lanes mid-step".into(),
            ));
        };
        match logits {
            Cow::Owned(v) => *next = v,
            Cow::Borrowed(l) => {
                next.clear();
                next.extend_from_slice(l);
            }
        }
        *fed += 1;
        if keep {
            last.clear();
            last.extend_from_slice(&hidden[hidden.len() - dm..]);
        }
        if self.paced {
            self.target_row(on)?;
        }
        Ok(())
    }

    /// A speculating sequence's verify rows of the step's forward: accept, roll back, update
    /// the drafter, record, emit. `(draft_ms, verify_ms)` is its share of the step's drafting
    /// and forward.
    pub(crate) fn take_round(
        &mut self,
        engine: &Engine,
        d: &Drafts,
        (logits, hidden): (&[f32], &[f32]),
        (draft_ms, verify_ms): (f64, f64),
        on: &mut OnTokens<'_>,
    ) -> Result<()> {
        let pos = self.tokens.len();
        let Lane::Mtp { round, auto, .. } = &mut self.lane else {
            return Err(crate::Error::Batch(
                "a sequence changed lanes mid-step".into(),
            ));
        };
        self.spec_timings.draft_ms += draft_ms;
        self.spec_timings.verify_ms += verify_ms;
        let t3 = Instant::now();
        let done = round.finish(engine.model(), d, logits, hidden, &mut self.sampler, pos)?;
        let mut stats = self
            .outcome
            .as_mut()
            .map(|o| std::mem::take(&mut o.stats))
            .unwrap_or_default();
        done.record(d.len(), &mut stats, &mut self.spec_timings);
        if let Some(o) = self.outcome.as_mut() {
            o.stats = stats;
        }
        {
            let mut m = speculative::lock(engine.depths());
            m.cost
                .record_after(d.len() > 0, t3.elapsed().as_secs_f64() * 1e3);
            if let Some(a) = auto.as_mut() {
                m.record_round(a, d.len(), done.accepted);
            }
        }
        let lps = self
            .top_logprobs
            .map(|n| logprobs::of_rows(logits, engine.model().vocab_size(), &done.new, n))
            .unwrap_or_default();
        self.emit(&done.new, lps, on);
        Ok(())
    }

    /// The sequence's output and the states it kept; the state after the last token fed is
    /// taken here (only over tokens the caller received).
    pub(crate) fn output(mut self, engine: &Engine) -> GenerationOutput {
        // (before the final state takes the lane)
        let speculated = matches!(self.lane, Lane::Mtp { .. });
        let after_reply = if self.keep.on {
            self.final_state(engine)
        } else {
            None
        };
        if let Some(o) = self.outcome.as_mut() {
            if speculated {
                o.used = true;
                let st = self.spec_timings;
                self.timings.draft_ms = Some(st.draft_ms);
                self.timings.verify_ms = Some(st.verify_ms);
                self.timings.rollback_ms = Some(st.rollback_ms);
            }
        }
        close_timings(
            &mut self.timings,
            self.start,
            self.first_at,
            self.tokens.len(),
            self.kept.computed,
        );
        self.timings.constraint_ms = self.sampler.constraint().map(|c| c.mask_cost().0);
        GenerationOutput {
            tokens: self.tokens,
            finish_reason: self.finish.unwrap_or(FinishReason::Length),
            timings: self.timings,
            speculation: self.outcome,
            prompt_tokens: self.prompt_len,
            computed_prompt_tokens: self.kept.computed,
            states: KeptStates {
                after_prompt: self.kept.prompt,
                after_reply,
                after_history: self.kept.history,
            },
            logprobs: self.logprobs,
        }
    }

    /// The state after the last generated token fed to the model, when it extends the prompt
    /// with tokens the caller received.
    fn final_state(&mut self, engine: &Engine) -> Option<PromptState> {
        match std::mem::replace(&mut self.lane, Lane::Ended) {
            Lane::Target {
                cache,
                hidden,
                history,
                fed,
                ..
            } => {
                let fed_tokens = history.get(self.prompt_len..self.prompt_len + fed)?;
                (fed > 0 && !hidden.is_empty() && self.tokens.starts_with(fed_tokens)).then(|| {
                    PromptState {
                        cache,
                        mcache: None,
                        last_hidden: hidden,
                        tokens: self.prompt_len + fed,
                    }
                })
            }
            Lane::Mtp { round, .. } => {
                let head = engine.drafter()?;
                match speculative::end_state(
                    engine.model(),
                    head,
                    *round,
                    self.prompt_len,
                    &self.tokens,
                ) {
                    Ok(st) => st,
                    Err(e) => {
                        tracing::debug!(error = %e, "no final prefix-cache state");
                        None
                    }
                }
            }
            Lane::Filling(_) | Lane::Ended => None,
        }
    }
}
