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
//! Sequences asking for `auto` depths get them chosen jointly each step (`depth.rs`):
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
//! ([`GenerateOptions::resume`], [`GenerateOptions::checkpoint`]: after the conversation
//! before the generation prompt, after the prompt, after the last token fed), so a batched
//! chat turn resumes the last one's state exactly as [`Engine::generate`] does. A solo call
//! *is* a batch of one: each sequence (`sequence::Sequence`) has one decode loop.
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
//!
//! [`Scheduler`]: crate::scheduler::Scheduler
//! [`Scheduler::submit_paced`]: crate::scheduler::Scheduler::submit_paced

use std::borrow::Cow;
use std::time::Instant;

use mtp_contract::FinishReason;

use crate::cache::SeqCache;
use crate::depth::{self, Choice, Fixed};
use crate::engine::{Engine, GenerateOptions, GenerationOutput};
use crate::error::{Error, Result};
use crate::qwen3_5::LogitsAt;
use crate::resume::PromptState;
use crate::sampling::Sampler;
use crate::sequence::{Lane, OnTokens, Sequence};
use crate::speculative::{self, Drafts};

/// Prompt tokens a step computes for one joining sequence, by default.
pub const DEFAULT_PREFILL_CHUNK: usize = 256;

/// Sequences decoded together on one engine.
pub struct Batch<'e> {
    engine: &'e Engine,
    slots: Vec<Sequence>,
    done: Vec<(u64, Result<GenerationOutput>)>,
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

    /// Adds a sequence: checks it, computes its prompt (alone, or a chunk per step when it is
    /// longer than the prefill chunk) and, when it speculates, emits its first token.
    /// `on_tokens(id, chunk)` receives its tokens here and in later steps (false cancels it).
    /// It resumes from [`GenerateOptions::resume`] and keeps the states
    /// [`GenerateOptions::checkpoint`] asks for, exactly as [`Engine::generate`] does.
    /// Errors of this sequence end only this sequence (in [`Batch::take_finished`]).
    pub fn join(
        &mut self,
        id: u64,
        prompt: &[u32],
        opts: &GenerateOptions,
        on_tokens: &mut dyn FnMut(u64, &[u32]) -> bool,
    ) {
        self.add(id, prompt, opts, false, on_tokens);
    }

    /// [`Batch::join`] for a caller that answers each chunk later, from elsewhere: after each
    /// chunk that does not end it, the sequence sits out the steps until [`Batch::answer`]
    /// says whether it goes on, so it ends exactly where a callback returning that answer
    /// would have ended it (its tokens, draft statistics, timings and states are the ones it
    /// gets alone). `on_tokens` returning false here means the caller is gone: the sequence
    /// is cancelled at once.
    pub fn join_paced(
        &mut self,
        id: u64,
        prompt: &[u32],
        opts: &GenerateOptions,
        on_tokens: &mut dyn FnMut(u64, &[u32]) -> bool,
    ) {
        self.add(id, prompt, opts, true, on_tokens);
    }

    fn add(
        &mut self,
        id: u64,
        prompt: &[u32],
        opts: &GenerateOptions,
        paced: bool,
        on: &mut OnTokens<'_>,
    ) {
        match Sequence::join(self.engine, id, prompt, opts, (paced, self.chunk), on) {
            Ok(seq) => {
                self.slots.push(seq);
                self.retire();
            }
            Err(e) => self.done.push((id, Err(e))),
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

    /// The state sequence `id` kept after [`GenerateOptions::checkpoint_at`] prompt tokens,
    /// once its prompt has been computed that far (also when it has ended since, until its
    /// output is taken): another sequence with the same prompt resumes from it
    /// ([`GenerateOptions::resume`]) rather than computing the prompt again.
    pub fn kept_history(&self, id: u64) -> Option<PromptState> {
        match self.slots.iter().find(|s| s.id == id) {
            Some(s) => s.kept_history().cloned(),
            None => self
                .done
                .iter()
                .find(|(i, _)| *i == id)
                .and_then(|(_, o)| o.as_ref().ok()?.states.after_history.clone()),
        }
    }

    /// Whether sequence `id` is in the batch (joined, not yet ended).
    pub fn holds(&self, id: u64) -> bool {
        self.slots.iter().any(|s| s.id == id)
    }

    /// Paced sequences waiting for their callers' answers (they sit out the steps).
    pub fn answers_due(&self) -> usize {
        self.slots.iter().filter(|s| s.held).count()
    }

    /// Ends a sequence now (its output so far goes to [`Batch::take_finished`], cancelled).
    pub fn cancel(&mut self, id: u64) {
        for s in self.slots.iter_mut().filter(|s| s.id == id) {
            s.finish.get_or_insert(FinishReason::Cancelled);
        }
        self.retire();
    }

    /// Sequences that ended since the last call, with their outputs (and the prefix-cache
    /// states each kept) or errors.
    pub fn take_finished(&mut self) -> Vec<(u64, Result<GenerationOutput>)> {
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

    /// One step for every sequence: a chunk of each prompt still filling, then a token for
    /// each target-only sequence and a round for each speculating one, in one target forward
    /// over all their rows (`1` per target-only sequence, `k + 1` per round of depth `k`).
    pub fn step(&mut self, on_tokens: &mut dyn FnMut(u64, &[u32]) -> bool) {
        // a cancelled request ends before its next prompt part or decode step
        if self
            .slots
            .iter_mut()
            .fold(false, |any, s| s.ends_if_cancelled() | any)
        {
            self.retire();
        }
        let engine = self.engine;
        let model = engine.model();
        let head = engine.drafter();
        let mut failed: Vec<(usize, Error)> = Vec::new();
        // 0. a chunk of each prompt still filling
        for (i, s) in self.slots.iter_mut().enumerate() {
            if let Err(e) = s.fill(engine, self.chunk, on_tokens) {
                failed.push((i, e));
            }
        }
        let t0 = Instant::now();
        let chosen = self.choose_depths();
        let mut head_calls = 0;
        // 1. each sequence's row: a target-only sequence samples and emits its next token (the
        //    row feeds it); a speculating one drafts its round
        let mut rows: Vec<Vec<u32>> = Vec::new();
        let mut members: Vec<(usize, Option<Drafts>)> = Vec::new();
        // the speculating sequences draft together (one head forward per draft position)
        let mut drafting: Vec<(usize, speculative::Drafting<'_>)> = Vec::new();
        for (i, s) in self.slots.iter_mut().enumerate() {
            if !s.steps() || failed.iter().any(|f| f.0 == i) {
                continue;
            }
            let pos = s.tokens.len();
            let remaining = s.remaining();
            // the lane's kind first: a target-only row borrows the whole sequence, a round
            // keeps its borrows until the drafts are made
            if matches!(s.lane, Lane::Target { .. }) {
                match s.target_row(on_tokens) {
                    Ok(Some(tok)) => {
                        rows.push(vec![tok]);
                        members.push((i, None));
                    }
                    Ok(None) => {}
                    Err(e) => failed.push((i, e)),
                }
                continue;
            }
            match &mut s.lane {
                Lane::Filling(_) | Lane::Ended | Lane::Target { .. } => {}
                Lane::Mtp { round, depth, .. } => {
                    if head.is_none() || remaining == 0 {
                        s.finish = Some(FinishReason::Length);
                        continue;
                    }
                    let k = chosen[i].unwrap_or((*depth).min(remaining));
                    let it = speculative::Drafting {
                        r: round,
                        k,
                        s: &mut s.sampler,
                        pos,
                    };
                    drafting.push((i, it));
                }
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
                    Err(e) => failed.push((i, e)),
                }
            }
        }
        let t1 = Instant::now();
        // 2. one forward over every row, each with its own cache
        if !rows.is_empty() {
            let mut caches: Vec<SeqCache> = members
                .iter()
                .map(|(i, _)| self.slots[*i].take_cache())
                .collect();
            // while it runs, each constrained sequence computes the mask of its next pick: a
            // target-only one's at its new position, a speculating one's after its drafts
            let mut ahead_of: Vec<Option<&[u32]>> = vec![None; self.slots.len()];
            for (i, d) in &members {
                ahead_of[*i] = Some(d.as_ref().map_or(&[][..], Drafts::tokens));
            }
            let ahead: Vec<(&mut Sampler, &[u32])> = self
                .slots
                .iter_mut()
                .zip(ahead_of)
                .filter_map(|(s, a)| Some((&mut s.sampler, a?)))
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
                self.slots[*i].put_cache(c);
            }
            let t2 = Instant::now();
            // 3. each sequence reads its rows: the next logits, or its round's acceptance
            match out {
                Err(e) => {
                    // a forward shared by several sequences that failed fails each of them
                    let message = e.to_string();
                    let mut e = Some(e);
                    for (i, _) in &members {
                        let e = e.take().unwrap_or_else(|| Error::Batch(message.clone()));
                        failed.push((*i, e));
                    }
                }
                Ok(mut out) => {
                    let (vocab, dm) = (model.vocab_size(), model.hidden_size());
                    // a forward whose only row is one target-only sequence's (a solo call's
                    // step) hands its logits over instead of copying them (a vocabulary of
                    // 248k is a megabyte per token)
                    let whole = rows.len() == 1 && rows[0].len() == 1;
                    let share = 1.0 / members.len() as f64;
                    let draft_ms = (t1 - t0).as_secs_f64() * 1e3 * share;
                    let verify_ms = (t2 - t1).as_secs_f64() * 1e3 * share;
                    let mut off = 0;
                    for ((i, d), row) in members.iter().zip(&rows) {
                        let n = row.len();
                        let hidden = &out.hidden[off * dm..(off + n) * dm];
                        let logits = &out.logits[off * vocab..(off + n) * vocab];
                        off += n;
                        let s = &mut self.slots[*i];
                        let took = match d {
                            None if whole => {
                                let logits = std::mem::take(&mut out.logits);
                                s.take_target(Cow::Owned(logits), hidden, dm, on_tokens)
                            }
                            None => s.take_target(Cow::Borrowed(logits), hidden, dm, on_tokens),
                            Some(d) => s.take_round(
                                engine,
                                d,
                                (logits, hidden),
                                (draft_ms, verify_ms),
                                on_tokens,
                            ),
                        };
                        if let Err(e) = took {
                            failed.push((*i, e));
                        }
                    }
                }
            }
        }
        failed.sort_unstable_by_key(|x| std::cmp::Reverse(x.0));
        failed.dedup_by_key(|x| x.0);
        for (i, e) in failed {
            let s = self.slots.remove(i);
            self.done.push((s.id, Err(e)));
        }
        self.retire();
    }

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
            if !s.steps() {
                continue;
            }
            let remaining = s.remaining();
            match &s.lane {
                Lane::Filling(_) | Lane::Ended => {}
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
