//! One sequence being generated: its caches, sampler (with its constraint), emitted tokens,
//! prompt states and timings, and its part of each step.
//!
//! A sequence is built from its request's [`SeqSpec`] (every rule already applied) and makes
//! no call back into the engine's rules; it reads the engine only for the model and the
//! drafter that run its rows. A step of a [`crate::batch::Batch`] is plan, run, commit; a
//! sequence's part of it is
//! 1. plan: [`Sequence::work`] says what it puts in the step (a prompt chunk, its next token,
//!    or a round of a given depth), from its state alone;
//! 2. run: the batch drafts the rounds (`speculative::draft_batch`) and runs one target forward
//!    over every sequence's rows, each with its own cache;
//! 3. commit: [`Sequence::take_chunk`] (a prompt chunk: the drafter's pairs, the states kept;
//!    the last chunk starts the decoding and emits the first token), [`Sequence::take_target`]
//!    (pick and emit the next token from its row) or [`Sequence::take_round`] (accept, roll
//!    back, update the drafter, emit).
//!
//! Every token is picked and emitted in the commit of the step whose rows it comes from, and
//! fed in the next step's forward. [`crate::Engine::generate`] is a batch of one, so there is
//! one decode loop.

use std::time::Instant;

use mtp_contract::{FinishReason, PromptProgress, Timings};

use crate::cache::SeqCache;
use crate::depth::Acceptance;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::logprobs::{self, LogprobSink, TokenLogprob};
use crate::prefill::PromptFill;
use crate::request::{GenerationOutput, ProgressSink, SpeculationOutcome};
use crate::resume::{Keep, KeptStates, PrefillKept, PromptState};
use crate::sampling::Sampler;
use crate::spec::{Decoding, SeqSpec};
use crate::speculative::{self, Drafts, Round, SpecTimings};

/// A caller's callback: a sequence's id and its new tokens; false cancels it.
pub(crate) type OnTokens<'a> = dyn FnMut(u64, &[u32]) -> bool + 'a;

/// What a sequence puts in one step, decided before the model runs ([`Sequence::work`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Work {
    /// The prompt's tokens up to `to` (from where it stands) ride in the step's forward.
    Prompt {
        /// Where the chunk ends.
        to: usize,
    },
    /// A target-only sequence feeds its last token (picked and emitted at the last commit).
    Target {
        /// That token.
        token: u32,
    },
    /// An MTP round of `depth` proposals: drafted, then verified in the forward (`depth + 1`
    /// rows).
    Round {
        /// Proposals this round.
        depth: usize,
    },
}

/// A prompt still being computed, a chunk per step.
pub(crate) struct Filling {
    fill: PromptFill,
    /// Milliseconds of the chunks so far.
    ms: f64,
}

/// How a sequence decodes.
pub(crate) enum Lane {
    /// Its prompt is being computed (a chunk per step).
    Filling(Box<Filling>),
    /// One token per step: `next` is the token picked and emitted at the last commit, fed in
    /// the next forward; `hidden` the last fed position's hidden row (kept for a final
    /// state), `history` the prompt and the tokens picked (for penalties), `fed` the generated
    /// tokens fed.
    Target {
        cache: SeqCache,
        next: u32,
        hidden: Vec<f32>,
        history: Vec<u32>,
        fed: usize,
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

/// One sequence of a batch.
pub(crate) struct Sequence {
    pub(crate) id: u64,
    prompt: Vec<u32>,
    decoding: Decoding,
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
    /// Its request's cancellation ([`crate::GenerateOptions::cancel`]).
    cancel: Option<mtp_contract::Cancel>,
    /// Alternatives per token's log probability, when they are reported.
    top_logprobs: Option<usize>,
    /// The log probabilities of `tokens`, when reported.
    logprobs: Vec<TokenLogprob>,
    on_logprobs: Option<LogprobSink>,
}

impl Sequence {
    /// A joining sequence, from its resolved request: its caches (from the state it resumes,
    /// or empty), its prompt to be computed by the steps. No model work.
    pub(crate) fn join(engine: &Engine, id: u64, spec: SeqSpec, paced: bool) -> Sequence {
        let head = engine.drafter().filter(|_| spec.decoding.speculate);
        let fill = PromptFill::new(
            engine.model(),
            head,
            (spec.images.as_ref(), spec.room),
            spec.resume.as_deref(),
        );
        let seq = Sequence {
            id,
            kept: PrefillKept {
                computed: spec.prompt.len() - fill.done,
                ..PrefillKept::default()
            },
            lane: Lane::Filling(Box::new(Filling { fill, ms: 0.0 })),
            prompt: spec.prompt,
            decoding: spec.decoding,
            sampler: spec.sampler,
            tokens: Vec::new(),
            stops: spec.stops,
            max: spec.max_tokens,
            finish: None,
            start: Instant::now(),
            first_at: None,
            spec_timings: SpecTimings::default(),
            timings: Timings::default(),
            outcome: spec.outcome,
            keep: spec.keep,
            paced,
            held: false,
            progress: spec.progress,
            cancel: spec.cancel,
            top_logprobs: spec.top_logprobs,
            logprobs: Vec::new(),
            on_logprobs: spec.on_logprobs,
        };
        seq.report_prompt(seq.prompt.len() - seq.kept.computed);
        seq
    }

    /// What it puts in the next step (`None`: nothing), from its state alone: a prompt chunk
    /// of at most `chunk` tokens, its next token, or a round of `depth` proposals (an `auto`
    /// sequence's depth is chosen by the batch, else its own, at most what its budget leaves).
    pub(crate) fn work(&self, chunk: usize, depth: Option<usize>) -> Option<Work> {
        if !self.steps() {
            return None;
        }
        match &self.lane {
            Lane::Filling(f) => Some(Work::Prompt {
                to: f.fill.next_end(self.prompt.len(), chunk, self.keep),
            }),
            Lane::Target { next, .. } => Some(Work::Target { token: *next }),
            Lane::Mtp { depth: own, .. } => {
                let remaining = self.remaining();
                (remaining > 0).then(|| Work::Round {
                    depth: depth.unwrap_or((*own).min(remaining)),
                })
            }
            Lane::Ended => None,
        }
    }

    /// The prompt's tokens a [`Work::Prompt`] chunk ending at `to` computes.
    pub(crate) fn chunk_tokens(&self, to: usize) -> Vec<u32> {
        let done = match &self.lane {
            Lane::Filling(f) => f.fill.done,
            _ => to,
        };
        self.prompt[done.min(to)..to].to_vec()
    }

    /// Whether a chunk ending at `to` ends the prompt (its last row's logits are wanted).
    pub(crate) fn ends_prompt(&self, to: usize) -> bool {
        to == self.prompt.len()
    }

    /// Tells the progress sink that `processed` of the prompt's tokens are in (those of a
    /// resumed state among them).
    fn report_prompt(&self, processed: usize) {
        if let Some(sink) = &self.progress {
            sink.report(PromptProgress {
                total: self.prompt.len(),
                cache: self.prompt.len() - self.kept.computed,
                processed,
                time_ms: self.start.elapsed().as_millis() as u64,
            });
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

    /// The state it kept after [`GenerateOptions::checkpoint_at`](crate::GenerateOptions::checkpoint_at) prompt tokens, once
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

    /// Tokens still allowed.
    pub(crate) fn remaining(&self) -> usize {
        self.max.saturating_sub(self.tokens.len())
    }

    /// Takes a prompt chunk's rows from the step's forward (`hidden`: the chunk's rows;
    /// `logits`: the prompt's last row when the chunk ends it, else empty; `forward_ms`: the
    /// forward it rode in). A chunk that does not end the prompt feeds the drafter its pairs
    /// and keeps the state after the conversation when it ends there; the last one starts
    /// the decoding (the state after the prompt kept) and emits the first token.
    pub(crate) fn take_chunk(
        &mut self,
        engine: &Engine,
        to: usize,
        (hidden, logits): (&[f32], &mut [f32]),
        forward_ms: f64,
        on: &mut OnTokens<'_>,
    ) -> Result<()> {
        let t0 = Instant::now();
        let Lane::Filling(mut f) = std::mem::replace(&mut self.lane, Lane::Ended) else {
            return Err(Error::Batch("a sequence changed lanes mid-step".into()));
        };
        let model = engine.model();
        let head = engine.drafter().filter(|_| self.decoding.speculate);
        if to < self.prompt.len() {
            f.fill.absorb(model, head, &self.prompt, to, hidden)?;
            if self.keep.on && self.keep.at == Some(to) {
                self.kept.history = Some(f.fill.state());
            }
            f.ms += forward_ms + t0.elapsed().as_secs_f64() * 1e3;
            self.lane = Lane::Filling(f);
            self.report_prompt(to);
            return Ok(());
        }
        let ms = f.ms + forward_ms;
        let first = match head {
            Some(head) => {
                let (round, state) = f.fill.into_round(
                    model,
                    head,
                    &self.prompt,
                    hidden,
                    logits,
                    &mut self.sampler,
                    self.keep,
                )?;
                self.kept.prompt = state;
                let b = round.bonus;
                self.lane = Lane::Mtp {
                    round: Box::new(round),
                    depth: self.decoding.depth,
                    auto: self
                        .decoding
                        .auto
                        .then(|| speculative::lock(engine.depths()).new_sequence()),
                };
                Some(b)
            }
            None => {
                let t = f
                    .fill
                    .into_target(model.hidden_size(), hidden, self.keep, to);
                self.kept.prompt = t.state;
                self.lane = Lane::Target {
                    cache: t.cache,
                    next: 0,
                    hidden: if self.keep.on { t.hidden } else { Vec::new() },
                    history: self.prompt.clone(),
                    fed: 0,
                };
                None
            }
        };
        self.timings.prefill_ms = Some(ms + t0.elapsed().as_secs_f64() * 1e3);
        self.report_prompt(to);
        match first {
            // the round's first token, picked from the prompt's last logits
            Some(b) => {
                let lps = self
                    .top_logprobs
                    .map(|n| vec![logprobs::of_row(logits, b, n)])
                    .unwrap_or_default();
                self.first_at = Some(Instant::now());
                self.emit(&[b], lps, on);
                Ok(())
            }
            None => self.pick_next(logits, on),
        }
    }

    /// A target-only sequence picks its next token from `logits` (its row of the step, or the
    /// prompt's last) and emits it; it is fed in the next step's forward.
    fn pick_next(&mut self, logits: &mut [f32], on: &mut OnTokens<'_>) -> Result<()> {
        let pos = self.tokens.len();
        let Lane::Target { history, .. } = &mut self.lane else {
            return Err(Error::Batch("a sequence changed lanes mid-step".into()));
        };
        // the log probabilities are the model's: the row is kept as it was only when the
        // penalties (or a bias) will change it (`pick` leaves it as it is)
        let raw = self
            .top_logprobs
            .filter(|_| self.sampler.alters_logits())
            .map(|_| logits.to_vec());
        self.sampler.apply_penalties(logits, history);
        let tok = self.sampler.pick(logits, pos)?;
        history.push(tok);
        self.first_at.get_or_insert_with(Instant::now);
        let lps = self
            .top_logprobs
            .map(|n| vec![logprobs::of_row(raw.as_deref().unwrap_or(logits), tok, n)])
            .unwrap_or_default();
        if let Lane::Target { next, .. } = &mut self.lane {
            *next = tok;
        }
        self.emit(&[tok], lps, on);
        Ok(())
    }

    /// A target-only sequence's row of the step's forward (`dm` hidden values): its next
    /// token is picked from `logits` and emitted now.
    pub(crate) fn take_target(
        &mut self,
        logits: &mut [f32],
        hidden: &[f32],
        dm: usize,
        on: &mut OnTokens<'_>,
    ) -> Result<()> {
        let keep = self.keep.on;
        let Lane::Target {
            hidden: last, fed, ..
        } = &mut self.lane
        else {
            return Err(Error::Batch("a sequence changed lanes mid-step".into()));
        };
        *fed += 1;
        if keep {
            last.clear();
            last.extend_from_slice(&hidden[hidden.len() - dm..]);
        }
        self.pick_next(logits, on)
    }

    /// The target cache, taken out for the step's forward (an empty one is left in its
    /// place).
    pub(crate) fn take_cache(&mut self) -> SeqCache {
        let empty = || SeqCache::new(Vec::new());
        match &mut self.lane {
            Lane::Filling(f) => std::mem::replace(&mut f.fill.cache, empty()),
            Lane::Target { cache, .. } => std::mem::replace(cache, empty()),
            Lane::Mtp { round, .. } => round.take_cache(),
            Lane::Ended => empty(),
        }
    }

    /// Puts the target cache back after the step's forward.
    pub(crate) fn put_cache(&mut self, c: SeqCache) {
        match &mut self.lane {
            Lane::Filling(f) => f.fill.cache = c,
            Lane::Target { cache, .. } => *cache = c,
            Lane::Mtp { round, .. } => round.put_cache(c),
            Lane::Ended => {}
        }
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
            return Err(Error::Batch("a sequence changed lanes mid-step".into()));
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
            prompt_tokens: self.prompt.len(),
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
        let prompt_len = self.prompt.len();
        match std::mem::replace(&mut self.lane, Lane::Ended) {
            Lane::Target {
                cache,
                hidden,
                history,
                fed,
                ..
            } => {
                let fed_tokens = history.get(prompt_len..prompt_len + fed)?;
                (fed > 0 && !hidden.is_empty() && self.tokens.starts_with(fed_tokens)).then(|| {
                    PromptState {
                        cache,
                        mcache: None,
                        last_hidden: hidden,
                        tokens: prompt_len + fed,
                    }
                })
            }
            Lane::Mtp { round, .. } => {
                let head = engine.drafter()?;
                match speculative::end_state(engine.model(), head, *round, prompt_len, &self.tokens)
                {
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
