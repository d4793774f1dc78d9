//! Continuous batching: sequences join and leave between steps, and each step reads the
//! weights once per row shape for every sequence in it.
//!
//! A step runs one target forward over every sequence's rows, each with its own cache: the next
//! token of each target-only sequence (one row) and the round of each speculating one (`k + 1`
//! rows at its depth `k`; each drafts on its own, then all verify in that forward, then each
//! accepts and rolls back on its own), so the weights are read once for the whole step. The kernels compute every row
//! independently, so a sequence's tokens are bit for bit the ones it gets alone
//! ([`Engine::generate`]); the tests check that at several batch sizes, with and without MTP and
//! with mixed depths.
//!
//! [`Batch`] is the synchronous core (the caller decides when to step); [`Scheduler`] is the
//! thread that owns a batch and takes requests from any thread.
//!
//! Sequences asking for `auto` depths get them chosen jointly each step ([`crate::depth`]):
//! one forward's rows are shared, so as the batch fills each draft buys less than the row it
//! costs and depths fall, to plain target steps where drafting would cost more than it gains.
//!
//! A joining prompt longer than the batch's prefill chunk ([`DEFAULT_PREFILL_CHUNK`] tokens
//! unless set) is computed a chunk per step, so one long prompt does not stall the sequences
//! already decoding: each step computes one chunk of each prompt still filling, then the
//! others' rows. A chunked prompt resumes exactly as a prefix-cache state does, so its tokens
//! are still the ones it gets alone.
//!
//! A sequence may resume from a prefix-cache state and keep the states a solo call keeps
//! ([`Batch::join_resumable`]: after the conversation before the generation prompt, after the
//! prompt, after the last token fed), so a batched chat turn resumes the last one's state
//! exactly as [`Engine::generate_resumable`] does.
//!
//! The speculating sequences draft together: each draft position is one MTP-head forward and
//! one LM-head product over every sequence still drafting (`speculative::draft_batch`), so the
//! head's weights are read once per position, not once per sequence.
//!
//! A caller on another thread (a [`Scheduler`] request) cannot answer a chunk of tokens while
//! the step that emitted it runs, so its sequence is *paced* ([`Batch::join_paced`],
//! [`Scheduler::submit_paced`]): after each chunk it waits, out of the steps, for the caller's
//! answer ([`Batch::answer`]) before it goes on or ends. Everything else is as with a callback
//! that answers at once, so a sequence its caller stops (a stop string) ends with the output,
//! the draft statistics, the timings and the prefix-cache states it gets alone.

use std::collections::{BTreeMap, VecDeque};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;

use mtp_contract::{FinishReason, Timings};

use crate::cache::SeqCache;
use crate::depth::{self, Acceptance, Choice, Fixed};
use crate::engine::{
    close_timings, prefill_target, Emitter, Engine, GenerateOptions, GenerationOutput,
};
use crate::error::{Error, Result};
use crate::qwen3_5::LogitsAt;
use crate::resume::{PromptState, ResumableOutput};
use crate::sampling::Sampler;
use crate::speculative::{self, Drafts, Round, SpecTimings};
use crate::vision::MultimodalPrompt;
use crate::SpeculationOutcome;

/// Prompt tokens a step computes for one joining sequence, by default.
pub const DEFAULT_PREFILL_CHUNK: usize = 256;

/// A prompt still being computed, a chunk per step.
struct Filling {
    prompt: Vec<u32>,
    /// The state after the chunks computed so far.
    state: Option<PromptState>,
    speculate: bool,
    depth: usize,
    auto: bool,
    images: Option<Arc<MultimodalPrompt>>,
    /// Milliseconds of the chunks so far.
    ms: f64,
}

/// A sequence's prefix-cache states: whether to keep them, and those kept so far.
#[derive(Default)]
struct Kept {
    /// Keep the states after the prompt and after the last token fed.
    on: bool,
    /// Also keep the state after this many prompt tokens.
    at: Option<usize>,
    prompt: Option<PromptState>,
    history: Option<PromptState>,
    /// Prompt tokens computed (not resumed).
    computed: usize,
}

/// How a sequence decodes.
enum Lane {
    /// Its prompt is being computed ([`Batch`]'s prefill chunk per step).
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
}

/// One sequence of a batch.
struct Slot {
    id: u64,
    prompt_len: usize,
    sampler: Sampler,
    tokens: Vec<u32>,
    stops: Vec<u32>,
    max: usize,
    finish: Option<FinishReason>,
    start: Instant,
    first_at: Option<Instant>,
    spec_timings: SpecTimings,
    timings: Timings,
    outcome: Option<SpeculationOutcome>,
    lane: Lane,
    kept: Kept,
    /// Its caller answers each chunk ([`Batch::answer`]) before it goes on.
    paced: bool,
    /// A paced sequence waiting for the answer to its last chunk: it sits out the steps.
    held: bool,
}

impl Slot {
    /// A speculating sequence's prefill produced its first token: emit it.
    fn first_speculative_token(&mut self, on: &mut dyn FnMut(u64, &[u32]) -> bool) {
        if let Lane::Mtp { round, .. } = &self.lane {
            let b = round.bonus;
            self.first_at = Some(Instant::now());
            self.emit(&[b], on);
        }
    }

    /// Emits `chunk` under the one emission rule ([`Emitter`]: stop ids, budget, cancel).
    /// A paced sequence is held after a chunk that does not end it (true: it may go on once
    /// answered).
    fn emit(&mut self, chunk: &[u32], on: &mut dyn FnMut(u64, &[u32]) -> bool) -> bool {
        if self.paced {
            return self.emit_paced(chunk, on);
        }
        let id = self.id;
        let mut cb = |t: &[u32]| on(id, t);
        let mut em = Emitter::new(
            std::mem::take(&mut self.tokens),
            &self.stops,
            self.max,
            &mut cb,
        );
        let going = em.emit(chunk) && !em.constraint_done(&self.sampler);
        self.finish = em.finish;
        self.tokens = std::mem::take(&mut em.tokens);
        going
    }

    /// [`Emitter::emit`] split at the caller's answer: the stop ids and the budget cut the
    /// chunk now, `on` only says whether the caller is still there, and what a callback's
    /// answer decides (cancel, then the budget and a complete constraint) waits for
    /// [`Slot::settle`].
    fn emit_paced(&mut self, chunk: &[u32], on: &mut dyn FnMut(u64, &[u32]) -> bool) -> bool {
        let mut take = chunk.len().min(self.remaining());
        if let Some(i) = chunk[..take].iter().position(|t| self.stops.contains(t)) {
            take = i;
            self.finish = Some(FinishReason::Stop);
        }
        let part = &chunk[..take];
        self.tokens.extend_from_slice(part);
        if part.is_empty() || self.finish.is_some() {
            // nothing to answer, or an answer that changes nothing (a stop id ended it)
            if !part.is_empty() {
                on(self.id, part);
            }
            return self.settle(true);
        }
        if !on(self.id, part) {
            // the caller is gone
            self.finish = Some(FinishReason::Cancelled);
            return false;
        }
        self.held = true;
        true
    }

    /// The caller's answer to a paced sequence's last chunk, as [`Emitter`] takes a callback's:
    /// false cancels; then the budget and a complete constraint end it. True when it goes on.
    fn settle(&mut self, go: bool) -> bool {
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
    fn target_row(&mut self, on: &mut dyn FnMut(u64, &[u32]) -> bool) -> Result<Option<u32>> {
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
        self.sampler.apply_penalties(logits, history);
        let tok = self.sampler.pick(logits, pos)?;
        history.push(tok);
        self.first_at.get_or_insert_with(Instant::now);
        if !self.emit(&[tok], on) {
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

    fn remaining(&self) -> usize {
        self.max.saturating_sub(self.tokens.len())
    }

    /// The sequence's output and the states it kept; the state after the last token fed is
    /// taken here (only over tokens the caller received).
    fn output(mut self, engine: &Engine) -> ResumableOutput {
        // (before the final state takes the lane)
        let speculated = matches!(self.lane, Lane::Mtp { .. });
        let final_state = if self.kept.on {
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
        ResumableOutput {
            output: GenerationOutput {
                tokens: self.tokens,
                finish_reason: self.finish.unwrap_or(FinishReason::Length),
                timings: self.timings,
                speculation: self.outcome,
                prompt_tokens: self.prompt_len,
            },
            computed_prompt_tokens: self.kept.computed,
            prompt_state: self.kept.prompt,
            final_state,
            history_state: self.kept.history,
        }
    }

    /// The state after the last generated token fed to the model, when it extends the prompt
    /// with tokens the caller received.
    fn final_state(&mut self, engine: &Engine) -> Option<PromptState> {
        let lane = std::mem::replace(
            &mut self.lane,
            Lane::Filling(Box::new(Filling {
                prompt: Vec::new(),
                state: None,
                speculate: false,
                depth: 0,
                auto: false,
                images: None,
                ms: 0.0,
            })),
        );
        match lane {
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
            Lane::Filling(_) => None,
        }
    }
}

/// Sequences decoded together on one engine.
pub struct Batch<'e> {
    engine: &'e Engine,
    slots: Vec<Slot>,
    done: Vec<(u64, Result<ResumableOutput>)>,
    chunk: usize,
}

impl<'e> Batch<'e> {
    /// An empty batch.
    pub fn new(engine: &'e Engine) -> Self {
        Batch {
            engine,
            slots: Vec::new(),
            done: Vec::new(),
            chunk: DEFAULT_PREFILL_CHUNK,
        }
    }

    /// Sets the prompt tokens a step computes for each joining sequence (at least 1; a prompt
    /// no longer than this is computed when it joins).
    pub fn with_prefill_chunk(mut self, tokens: usize) -> Self {
        self.chunk = tokens.max(1);
        self
    }

    /// Sequences still generating.
    pub fn active(&self) -> usize {
        self.slots.len()
    }

    /// Adds a sequence: checks it, computes its prompt (alone) and, when it speculates, emits
    /// its first token. `on_tokens(id, chunk)` receives its tokens here and in later steps
    /// (false cancels it). Errors of this sequence end only this sequence (in
    /// [`Batch::take_finished`]).
    pub fn join(
        &mut self,
        id: u64,
        prompt: &[u32],
        opts: &GenerateOptions,
        on_tokens: &mut dyn FnMut(u64, &[u32]) -> bool,
    ) {
        self.join_resumable(id, prompt, opts, None, false, on_tokens);
    }

    /// [`Batch::join`] for a prefix cache, as [`Engine::generate_resumable`]: the sequence
    /// resumes from `resume` (a state after a prefix of `prompt`; one that covers the whole
    /// prompt, holds other images or, for a speculating sequence, lacks the drafter's cache is
    /// not used) and, with `checkpoint`, keeps the states after the prompt, after
    /// `opts.checkpoint_at` prompt tokens and after the last token fed, which
    /// [`Batch::take_finished_resumable`] returns. The tokens are the same either way.
    pub fn join_resumable(
        &mut self,
        id: u64,
        prompt: &[u32],
        opts: &GenerateOptions,
        resume: Option<&PromptState>,
        checkpoint: bool,
        on_tokens: &mut dyn FnMut(u64, &[u32]) -> bool,
    ) {
        let how = (resume, checkpoint, false);
        if let Err(e) = self.try_join(id, prompt, opts, how, on_tokens) {
            self.done.push((id, Err(e)));
        }
    }

    /// [`Batch::join_resumable`] for a caller that answers each chunk later, from elsewhere:
    /// after each chunk that does not end it, the sequence sits out the steps until
    /// [`Batch::answer`] says whether it goes on, so it ends exactly where a callback
    /// returning that answer would have ended it (its tokens, draft statistics, timings and
    /// states are the ones it gets alone). `on_tokens` returning false here means the caller
    /// is gone: the sequence is cancelled at once.
    pub fn join_paced(
        &mut self,
        id: u64,
        prompt: &[u32],
        opts: &GenerateOptions,
        resume: Option<&PromptState>,
        checkpoint: bool,
        on_tokens: &mut dyn FnMut(u64, &[u32]) -> bool,
    ) {
        let how = (resume, checkpoint, true);
        if let Err(e) = self.try_join(id, prompt, opts, how, on_tokens) {
            self.done.push((id, Err(e)));
        }
    }

    /// A paced sequence's caller's answer to its last chunk (see [`Batch::join_paced`]): true
    /// lets it take the next step, false ends it there (finish `Cancelled`, unless the chunk
    /// ended it already), with its output and states. False also cancels a sequence that is
    /// not waiting for an answer; an answer for a sequence that has ended does nothing.
    pub fn answer(&mut self, id: u64, go: bool) {
        for s in self.slots.iter_mut().filter(|s| s.id == id) {
            if s.held {
                s.settle(go);
            } else if !go {
                s.finish.get_or_insert(FinishReason::Cancelled);
            }
        }
        self.retire();
    }

    /// Paced sequences waiting for their callers' answers (they sit out the steps).
    pub fn answers_due(&self) -> usize {
        self.slots.iter().filter(|s| s.held).count()
    }

    fn try_join(
        &mut self,
        id: u64,
        prompt: &[u32],
        opts: &GenerateOptions,
        (resume, checkpoint, paced): (Option<&PromptState>, bool, bool),
        on_tokens: &mut dyn FnMut(u64, &[u32]) -> bool,
    ) -> Result<()> {
        let engine = self.engine;
        engine.check(prompt, opts)?;
        let (outcome, speculate) = engine.speculation_plan(opts);
        let start = Instant::now();
        let mut sampler = engine.sampler(opts)?;
        let mut spec_timings = SpecTimings::default();
        let mut timings = Timings::default();
        let speculate = speculate && engine.drafter().is_some();
        let depth = opts.num_draft_tokens.unwrap_or(0);
        // the rules `generate_resumable` resumes by
        let resume = resume.filter(|st| {
            st.tokens() < prompt.len()
                && st.same_images(opts.images.as_ref())
                && (!speculate || st.has_drafter_cache())
        });
        let from = resume.map_or(0, PromptState::tokens);
        let mut kept = Kept {
            on: checkpoint,
            at: opts.checkpoint_at.filter(|_| checkpoint),
            computed: prompt.len() - from,
            ..Kept::default()
        };
        let lane = if prompt.len() - from > self.chunk {
            Lane::Filling(Box::new(Filling {
                prompt: prompt.to_vec(),
                state: resume.cloned(),
                speculate,
                depth,
                auto: opts.auto_depth,
                images: opts.images.clone(),
                ms: 0.0,
            }))
        } else {
            let lane = start_lane(
                engine,
                prompt,
                opts.images.as_ref(),
                resume,
                (speculate, depth, opts.auto_depth),
                &mut sampler,
                &mut spec_timings,
                &mut kept,
            )?;
            timings.prefill_ms = Some(start.elapsed().as_secs_f64() * 1e3);
            lane
        };
        let mut slot = Slot {
            id,
            prompt_len: prompt.len(),
            sampler,
            tokens: Vec::new(),
            stops: engine.stop_ids(opts),
            max: opts.max_tokens,
            finish: None,
            start,
            first_at: None,
            spec_timings,
            timings,
            outcome,
            lane,
            kept,
            paced,
            held: false,
        };
        if slot.max == 0 {
            slot.finish = Some(FinishReason::Length);
        } else {
            slot.first_speculative_token(on_tokens);
        }
        self.slots.push(slot);
        self.retire();
        Ok(())
    }

    /// Computes one chunk of each prompt still filling; a prompt's last chunk starts its
    /// decoding (and emits a speculating sequence's first token).
    fn fill(&mut self, on_tokens: &mut dyn FnMut(u64, &[u32]) -> bool) -> Vec<(usize, String)> {
        let engine = self.engine;
        let chunk = self.chunk;
        let mut failed = Vec::new();
        for (i, s) in self.slots.iter_mut().enumerate() {
            let Lane::Filling(f) = &mut s.lane else {
                continue;
            };
            if s.finish.is_some() || s.held {
                continue;
            }
            let t0 = Instant::now();
            let done = f.state.as_ref().map_or(0, PromptState::tokens);
            let head = engine.drafter().filter(|_| f.speculate);
            let next = if f.prompt.len() - done > chunk {
                // a chunk ends where a history state is to be kept
                let to = match s.kept.at {
                    Some(h) if h > done && h < done + chunk => h,
                    _ => done + chunk,
                };
                speculative::prefill_part(
                    engine.model(),
                    head,
                    &f.prompt,
                    f.images.as_ref(),
                    f.state.take(),
                    to,
                )
                .map(|st| {
                    if s.kept.at == Some(to) {
                        s.kept.history = Some(st.clone());
                    }
                    f.state = Some(st);
                    None
                })
            } else {
                start_lane(
                    engine,
                    &f.prompt,
                    f.images.as_ref(),
                    f.state.as_ref(),
                    (f.speculate, f.depth, f.auto),
                    &mut s.sampler,
                    &mut s.spec_timings,
                    &mut s.kept,
                )
                .map(Some)
            };
            f.ms += t0.elapsed().as_secs_f64() * 1e3;
            match next {
                Ok(None) => {}
                Ok(Some(lane)) => {
                    s.timings.prefill_ms = Some(f.ms);
                    s.lane = lane;
                    s.first_speculative_token(on_tokens);
                }
                Err(e) => failed.push((i, e.to_string())),
            }
        }
        failed
    }

    /// Ends a sequence now (its output so far goes to [`Batch::take_finished`], cancelled).
    pub fn cancel(&mut self, id: u64) {
        for s in self.slots.iter_mut().filter(|s| s.id == id) {
            s.finish.get_or_insert(FinishReason::Cancelled);
        }
        self.retire();
    }

    /// Sequences that ended since the last call, with their outputs or errors.
    pub fn take_finished(&mut self) -> Vec<(u64, Result<GenerationOutput>)> {
        self.take_finished_resumable()
            .into_iter()
            .map(|(id, r)| (id, r.map(|o| o.output)))
            .collect()
    }

    /// [`Batch::take_finished`] with the prefix-cache states each sequence kept (see
    /// [`Batch::join_resumable`]).
    pub fn take_finished_resumable(&mut self) -> Vec<(u64, Result<ResumableOutput>)> {
        std::mem::take(&mut self.done)
    }

    fn retire(&mut self) {
        let mut i = 0;
        while i < self.slots.len() {
            if self.slots[i].finish.is_some() {
                let s = self.slots.swap_remove(i);
                self.done.push((s.id, Ok(s.output(self.engine))));
            } else {
                i += 1;
            }
        }
        // keep join order for the next step (swap_remove moved the last one forward)
        self.slots.sort_by_key(|s| s.id);
    }

    /// One step for every sequence: a token for each target-only one, a round for each
    /// speculating one, in one target forward over all their rows (`1` per target-only
    /// sequence, `k + 1` per round of depth `k`).
    pub fn step(&mut self, on_tokens: &mut dyn FnMut(u64, &[u32]) -> bool) {
        let engine = self.engine;
        let model = engine.model();
        let head = engine.drafter();
        // 0. a chunk of each prompt still filling
        let mut failed: Vec<(usize, String)> = self.fill(on_tokens);
        let t0 = Instant::now();
        let chosen = self.choose_depths();
        let mut head_calls = 0;
        // 1. each sequence's row: a target-only sequence samples and emits its next token (the
        //    row feeds it); a speculating one drafts its round
        let mut rows: Vec<Vec<u32>> = Vec::new();
        let mut members: Vec<(usize, Option<Drafts>)> = Vec::new();
        // the speculating sequences draft together (one head forward per draft position)
        let mut drafting: Vec<(usize, speculative::Drafting<'_>)> = Vec::new();
        let mut wants: Vec<(usize, usize, usize)> = Vec::new();
        for (i, s) in self.slots.iter_mut().enumerate() {
            if s.finish.is_some() || s.held || failed.iter().any(|f| f.0 == i) {
                continue;
            }
            let pos = s.tokens.len();
            let remaining = s.remaining();
            match &mut s.lane {
                Lane::Filling(_) => {}
                Lane::Target { .. } => match s.target_row(on_tokens) {
                    Ok(Some(tok)) => {
                        rows.push(vec![tok]);
                        members.push((i, None));
                    }
                    Ok(None) => {}
                    Err(e) => failed.push((i, e.to_string())),
                },
                Lane::Mtp { depth, .. } => {
                    let k = chosen[i].unwrap_or((*depth).min(remaining));
                    if head.is_none() || remaining == 0 {
                        s.finish = Some(FinishReason::Length);
                        continue;
                    }
                    wants.push((i, k, pos));
                }
            }
        }
        let mut wants = wants.into_iter().peekable();
        for (i, s) in self.slots.iter_mut().enumerate() {
            let Some(&(_, k, pos)) = wants.peek().filter(|w| w.0 == i) else {
                continue;
            };
            wants.next();
            if let Slot {
                lane: Lane::Mtp { round, .. },
                sampler,
                ..
            } = s
            {
                drafting.push((
                    i,
                    speculative::Drafting {
                        r: round,
                        k,
                        s: sampler,
                        pos,
                    },
                ));
            }
        }
        if let (Some(head), false) = (head, drafting.is_empty()) {
            let (which, mut items): (Vec<usize>, Vec<speculative::Drafting<'_>>) =
                drafting.into_iter().unzip();
            let drafts = speculative::draft_batch(model, head, &mut items);
            for ((i, it), d) in which.into_iter().zip(items).zip(drafts) {
                match d {
                    Ok(d) => {
                        head_calls += d.heads;
                        rows.push(speculative::verify_row(it.r, &d));
                        members.push((i, Some(d)));
                    }
                    Err(e) => failed.push((i, e.to_string())),
                }
            }
        }
        let t1 = Instant::now();
        // 2. one forward over every row, each with its own cache
        if !rows.is_empty() {
            let mut caches: Vec<SeqCache> = members
                .iter()
                .map(|(i, _)| match &mut self.slots[*i].lane {
                    Lane::Target { cache, .. } => {
                        std::mem::replace(cache, SeqCache::new(Vec::new()))
                    }
                    Lane::Mtp { round, .. } => round.take_cache(),
                    Lane::Filling(_) => SeqCache::new(Vec::new()),
                })
                .collect();
            // while it runs, each constrained sequence computes the mask of its next pick: a
            // target-only one's at its new position, a speculating one's after its drafts
            let ahead_of: BTreeMap<usize, &[u32]> = members
                .iter()
                .map(|(i, d)| (*i, d.as_ref().map_or(&[][..], Drafts::tokens)))
                .collect();
            let ahead: Vec<(&mut Sampler, &[u32])> = self
                .slots
                .iter_mut()
                .enumerate()
                .filter_map(|(i, s)| Some((&mut s.sampler, *ahead_of.get(&i)?)))
                .collect();
            let out = crate::sampling::masks_beside(ahead, || {
                model.forward(&rows, &mut caches, LogitsAt::All)
            });
            {
                let forward_ms = t1.elapsed().as_secs_f64() * 1e3;
                let mut m = speculative::lock(engine.depths());
                m.cost
                    .record_forward(rows.iter().map(Vec::len).sum(), forward_ms);
                m.cost
                    .record_heads(head_calls, (t1 - t0).as_secs_f64() * 1e3);
            }
            for ((i, _), c) in members.iter().zip(caches) {
                match &mut self.slots[*i].lane {
                    Lane::Target { cache, .. } => *cache = c,
                    Lane::Mtp { round, .. } => round.put_cache(c),
                    Lane::Filling(_) => {}
                }
            }
            let t2 = Instant::now();
            // 3. each sequence reads its rows: the next logits, or its round's acceptance
            match out {
                Err(e) => failed.extend(members.iter().map(|(i, _)| (*i, e.to_string()))),
                Ok(out) => {
                    let (vocab, dm) = (model.vocab_size(), model.hidden_size());
                    let share = 1.0 / members.len() as f64;
                    let draft_ms = (t1 - t0).as_secs_f64() * 1e3 * share;
                    let verify_ms = (t2 - t1).as_secs_f64() * 1e3 * share;
                    let mut off = 0;
                    for ((i, d), row) in members.iter().zip(&rows) {
                        let n = row.len();
                        let logits = &out.logits[off * vocab..(off + n) * vocab];
                        let hidden = &out.hidden[off * dm..(off + n) * dm];
                        off += n;
                        let s = &mut self.slots[*i];
                        let pos = s.tokens.len();
                        let keep = s.kept.on;
                        match (&mut s.lane, d, head) {
                            (
                                Lane::Target {
                                    logits: next,
                                    hidden: last,
                                    fed,
                                    ..
                                },
                                None,
                                _,
                            ) => {
                                *next = logits.to_vec();
                                *fed += 1;
                                if keep {
                                    last.clear();
                                    last.extend_from_slice(&hidden[(n - 1) * dm..]);
                                }
                                // a paced sequence emits its next token now, so that its
                                // caller answers for it before the next step feeds it
                                if s.paced {
                                    if let Err(e) = s.target_row(on_tokens) {
                                        failed.push((*i, e.to_string()));
                                    }
                                }
                            }
                            (Lane::Mtp { round, auto, .. }, Some(d), Some(_)) => {
                                s.spec_timings.draft_ms += draft_ms;
                                s.spec_timings.verify_ms += verify_ms;
                                let mut stats = s
                                    .outcome
                                    .as_mut()
                                    .map(|o| std::mem::take(&mut o.stats))
                                    .unwrap_or_default();
                                let t3 = Instant::now();
                                let new = speculative::finish_round(
                                    model,
                                    round,
                                    d,
                                    logits,
                                    hidden,
                                    &mut s.sampler,
                                    pos,
                                    &mut stats,
                                    &mut s.spec_timings,
                                );
                                if let Some(o) = s.outcome.as_mut() {
                                    o.stats = stats;
                                }
                                match new {
                                    Ok((accepted, new)) => {
                                        let mut m = speculative::lock(engine.depths());
                                        m.cost.record_after(
                                            d.len() > 0,
                                            t3.elapsed().as_secs_f64() * 1e3,
                                        );
                                        if let Some(a) = auto.as_mut() {
                                            m.record_round(a, d.len(), accepted);
                                        }
                                        drop(m);
                                        s.emit(&new, on_tokens);
                                    }
                                    Err(e) => failed.push((*i, e.to_string())),
                                }
                            }
                            _ => failed.push((*i, "a sequence changed lanes mid-step".into())),
                        }
                    }
                }
            }
        }
        // a forward shared by several sequences that failed fails each of them
        failed.sort_unstable_by_key(|x| std::cmp::Reverse(x.0));
        failed.dedup_by_key(|x| x.0);
        for (i, m) in failed {
            let s = self.slots.remove(i);
            self.done.push((s.id, Err(Error::Batch(m))));
        }
        self.retire();
    }
}

/// A sequence's decoding lane once its prompt is computed (from `resume`, a prefix-cache state
/// or the state after its first chunks, when given): an MTP round state (its first token not
/// yet emitted) or the target's next logits. The prefix-cache states `kept` asks for are kept.
#[allow(clippy::too_many_arguments)]
fn start_lane(
    engine: &Engine,
    prompt: &[u32],
    images: Option<&Arc<MultimodalPrompt>>,
    resume: Option<&PromptState>,
    (speculate, depth, auto): (bool, usize, bool),
    sampler: &mut Sampler,
    spec_timings: &mut SpecTimings,
    kept: &mut Kept,
) -> Result<Lane> {
    if let (true, Some(head)) = (speculate, engine.drafter()) {
        let mut computed = 0;
        let mut history = None;
        let round = speculative::prefill(
            engine.model(),
            head,
            prompt,
            images,
            sampler,
            spec_timings,
            resume,
            kept.on,
            kept.at,
            &mut kept.prompt,
            &mut history,
            &mut computed,
        )?;
        if history.is_some() {
            kept.history = history;
        }
        return Ok(Lane::Mtp {
            round: Box::new(round),
            depth,
            auto: auto.then(|| speculative::lock(engine.depths()).new_sequence()),
        });
    }
    let pre = prefill_target(engine.model(), prompt, images, resume, kept.on, kept.at)?;
    kept.prompt = pre.prompt_state;
    if pre.history_state.is_some() {
        kept.history = pre.history_state;
    }
    Ok(Lane::Target {
        cache: pre.cache,
        logits: pre.logits,
        hidden: if kept.on { pre.hidden } else { Vec::new() },
        history: prompt.to_vec(),
        fed: 0,
        unfed: None,
    })
}

impl Batch<'_> {
    /// The depth of every `auto` sequence for the next step, by slot (`None` for the others),
    /// chosen together with what the other sequences put in the step.
    fn choose_depths(&self) -> Vec<Option<usize>> {
        let mut chosen = vec![None; self.slots.len()];
        if !self
            .slots
            .iter()
            .any(|s| matches!(&s.lane, Lane::Mtp { auto: Some(_), .. }))
        {
            return chosen;
        }
        let mut m = speculative::lock(self.engine.depths());
        let prior = m.new_sequence();
        let mut fixed = Fixed::default();
        let mut seqs = Vec::new();
        let mut which = Vec::new();
        for (i, s) in self.slots.iter().enumerate() {
            if s.finish.is_some() || s.held {
                continue;
            }
            let remaining = s.remaining();
            match &s.lane {
                Lane::Filling(_) => {}
                Lane::Target { .. } => {
                    fixed.rows += 1;
                    fixed.tokens += 1.0;
                }
                Lane::Mtp {
                    auto: Some(a),
                    depth,
                    ..
                } => {
                    seqs.push(Choice {
                        acceptance: a,
                        max: (*depth).min(remaining.saturating_sub(1)),
                    });
                    which.push(i);
                }
                Lane::Mtp {
                    auto: None, depth, ..
                } => {
                    let k = (*depth).min(remaining);
                    fixed.rows += k + 1;
                    fixed.tokens += 1.0 + prior.gains(k).iter().sum::<f64>();
                    fixed.heads += k;
                    fixed.drafting += usize::from(k > 0);
                }
            }
        }
        let depths = depth::choose(&mut m.cost, fixed, &seqs);
        for (i, k) in which.into_iter().zip(depths) {
            chosen[i] = Some(k);
        }
        chosen
    }
}

/// What a [`Scheduler`] sends back for one request.
#[derive(Debug)]
pub enum BatchEvent {
    /// Newly accepted tokens.
    Tokens(Vec<u32>),
    /// The end: the output (with the prefix-cache states kept, when asked for), or why it
    /// failed.
    Done(Box<Result<ResumableOutput>>),
}

struct Job {
    id: u64,
    prompt: Vec<u32>,
    opts: GenerateOptions,
    resume: Option<Arc<PromptState>>,
    checkpoint: bool,
    paced: bool,
    events: mpsc::Sender<BatchEvent>,
}

/// What the scheduler thread receives.
enum Msg {
    Job(Box<Job>),
    /// A paced request's answer to its last chunk (see [`Batch::answer`]).
    Answer {
        id: u64,
        go: bool,
    },
}

/// How long the scheduler waits, before a step, for the answers still due from paced
/// requests' callers (usually microseconds away): a sequence whose answer comes later sits out
/// that step, so a slow caller never holds the others up by more than this.
const ANSWER_WAIT: std::time::Duration = std::time::Duration::from_millis(2);

/// The thread that owns a [`Batch`]: requests from any thread join between steps, up to
/// `max_batch` at once (the rest wait in order). Dropping a request's receiver cancels it at
/// the next token. The thread ends when the scheduler is dropped and its sequences are done.
pub struct Scheduler {
    tx: Option<mpsc::Sender<Msg>>,
    next_id: std::sync::atomic::AtomicU64,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// A request whose caller answers each chunk of tokens ([`Scheduler::submit_paced`]): after
/// each [`BatchEvent::Tokens`], [`Paced::answer`] says whether its sequence goes on.
/// Dropping it cancels the request.
pub struct Paced {
    id: u64,
    events: mpsc::Receiver<BatchEvent>,
    answers: mpsc::Sender<Msg>,
}

impl Paced {
    /// The next event: a chunk of tokens (answer it), or the end.
    pub fn recv(&self) -> std::result::Result<BatchEvent, mpsc::RecvError> {
        self.events.recv()
    }

    /// The answer to the last chunk: true goes on, false ends the sequence there, as a
    /// callback returning false ends a solo call (its output, draft statistics, timings and
    /// states still come, in [`BatchEvent::Done`]).
    pub fn answer(&self, go: bool) {
        let _ = self.answers.send(Msg::Answer { id: self.id, go });
    }
}

impl Drop for Paced {
    fn drop(&mut self) {
        // (after the end, an answer for a sequence that is gone does nothing)
        let _ = self.answers.send(Msg::Answer {
            id: self.id,
            go: false,
        });
    }
}

impl Scheduler {
    /// Starts the thread.
    pub fn spawn(engine: Arc<Engine>, max_batch: usize) -> Scheduler {
        Self::spawn_with_chunk(engine, max_batch, DEFAULT_PREFILL_CHUNK)
    }

    /// [`Scheduler::spawn`] whose batch computes joining prompts `chunk` tokens per step (see
    /// [`Batch::with_prefill_chunk`]).
    pub fn spawn_with_chunk(engine: Arc<Engine>, max_batch: usize, chunk: usize) -> Scheduler {
        let (tx, rx) = mpsc::channel::<Msg>();
        let max_batch = max_batch.max(1);
        let thread = std::thread::Builder::new()
            .name("mtp-scheduler".into())
            .spawn(move || run_scheduler(&engine, rx, max_batch, chunk))
            .ok();
        Scheduler {
            tx: Some(tx),
            next_id: std::sync::atomic::AtomicU64::new(0),
            thread,
        }
    }

    /// Queues a request; its tokens and its end come on the returned receiver.
    pub fn submit(
        &self,
        prompt: Vec<u32>,
        opts: GenerateOptions,
    ) -> Result<mpsc::Receiver<BatchEvent>> {
        self.submit_resumable(prompt, opts, None, false)
    }

    /// [`Scheduler::submit`] for a prefix cache (see [`Batch::join_resumable`]).
    pub fn submit_resumable(
        &self,
        prompt: Vec<u32>,
        opts: GenerateOptions,
        resume: Option<Arc<PromptState>>,
        checkpoint: bool,
    ) -> Result<mpsc::Receiver<BatchEvent>> {
        let (_, events) = self.queue(prompt, opts, resume, checkpoint, false)?;
        Ok(events)
    }

    /// [`Scheduler::submit_resumable`] for a caller that decides after each chunk whether the
    /// sequence goes on (a stop string): the sequence waits for each answer
    /// ([`Paced::answer`]; see [`Batch::join_paced`]), so one its caller stops ends with what
    /// it gets alone when its callback stops it.
    pub fn submit_paced(
        &self,
        prompt: Vec<u32>,
        opts: GenerateOptions,
        resume: Option<Arc<PromptState>>,
        checkpoint: bool,
    ) -> Result<Paced> {
        let (id, events) = self.queue(prompt, opts, resume, checkpoint, true)?;
        let answers = self
            .tx
            .clone()
            .ok_or_else(|| Error::Batch("the scheduler thread has stopped".into()))?;
        Ok(Paced {
            id,
            events,
            answers,
        })
    }

    fn queue(
        &self,
        prompt: Vec<u32>,
        opts: GenerateOptions,
        resume: Option<Arc<PromptState>>,
        checkpoint: bool,
        paced: bool,
    ) -> Result<(u64, mpsc::Receiver<BatchEvent>)> {
        let (events, rx) = mpsc::channel();
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let job = Job {
            id,
            prompt,
            opts,
            resume,
            checkpoint,
            paced,
            events,
        };
        self.tx
            .as_ref()
            .and_then(|tx| tx.send(Msg::Job(Box::new(job))).ok())
            .ok_or_else(|| Error::Batch("the scheduler thread has stopped".into()))?;
        Ok((id, rx))
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A message for the scheduler thread: a request queues, an answer goes to its sequence (a
/// request that has not joined yet and whose caller went away leaves the queue).
fn receive(msg: Msg, batch: &mut Batch<'_>, waiting: &mut VecDeque<Box<Job>>) {
    match msg {
        Msg::Job(job) => waiting.push_back(job),
        Msg::Answer { id, go } => {
            if !go {
                waiting.retain(|j| j.id != id);
            }
            batch.answer(id, go);
        }
    }
}

fn run_scheduler(engine: &Engine, rx: mpsc::Receiver<Msg>, max_batch: usize, chunk: usize) {
    let mut batch = Batch::new(engine).with_prefill_chunk(chunk);
    let mut waiting: VecDeque<Box<Job>> = VecDeque::new();
    let mut senders: BTreeMap<u64, mpsc::Sender<BatchEvent>> = BTreeMap::new();
    let mut open = true;
    loop {
        // take what arrived; block only when there is nothing to do (every sequence waits for
        // its caller's answer, and nothing can join)
        let idle = batch.active() == batch.answers_due()
            && (waiting.is_empty() || batch.active() >= max_batch);
        if idle {
            if !open {
                return;
            }
            match rx.recv() {
                Ok(m) => receive(m, &mut batch, &mut waiting),
                Err(_) => open = false,
            }
        }
        while open {
            match rx.try_recv() {
                Ok(m) => receive(m, &mut batch, &mut waiting),
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => open = false,
            }
        }
        // the answers still due are usually a moment away: wait for them (not long), so that
        // their sequences take this step
        let until = Instant::now() + ANSWER_WAIT;
        while open && batch.answers_due() > 0 {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            match rx.recv_timeout(left) {
                Ok(m) => receive(m, &mut batch, &mut waiting),
                Err(mpsc::RecvTimeoutError::Timeout) => break,
                Err(mpsc::RecvTimeoutError::Disconnected) => open = false,
            }
        }
        while batch.active() < max_batch {
            let Some(job) = waiting.pop_front() else {
                break;
            };
            let id = job.id;
            senders.insert(id, job.events);
            let s = &senders;
            let mut on = |id, t: &[u32]| forward(s, id, t);
            let resume = job.resume.as_deref();
            if job.paced {
                batch.join_paced(id, &job.prompt, &job.opts, resume, job.checkpoint, &mut on);
            } else {
                batch.join_resumable(id, &job.prompt, &job.opts, resume, job.checkpoint, &mut on);
            }
        }
        if batch.active() > batch.answers_due() {
            let s = &senders;
            batch.step(&mut |id, t| forward(s, id, t));
        }
        for (id, out) in batch.take_finished_resumable() {
            if let Some(tx) = senders.remove(&id) {
                let _ = tx.send(BatchEvent::Done(Box::new(out)));
            }
        }
        if !open && batch.active() == 0 && waiting.is_empty() {
            return;
        }
    }
}

/// Sends a sequence's tokens to its requester; false (cancel) when the requester is gone.
fn forward(senders: &BTreeMap<u64, mpsc::Sender<BatchEvent>>, id: u64, t: &[u32]) -> bool {
    senders
        .get(&id)
        .is_some_and(|tx| tx.send(BatchEvent::Tokens(t.to_vec())).is_ok())
}
