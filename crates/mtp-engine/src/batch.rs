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
//! Not yet: chunked prefill (a joining prompt is computed whole before the next step), drafting
//! the speculating sequences' heads in one forward (each drafts alone), and the prefix cache
//! (batched sequences start from their prompt).

use std::collections::{BTreeMap, VecDeque};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;

use mtp_contract::{FinishReason, Timings};

use crate::cache::SeqCache;
use crate::engine::{close_timings, Emitter, Engine, GenerateOptions, GenerationOutput};
use crate::error::{Error, Result};
use crate::qwen3_5::LogitsAt;
use crate::sampling::Sampler;
use crate::speculative::{self, Drafts, Round, SpecTimings};
use crate::SpeculationOutcome;

/// How a sequence decodes.
enum Lane {
    /// One token per step; `logits` are the target's for the next token.
    Target {
        cache: SeqCache,
        logits: Vec<f32>,
        history: Vec<u32>,
    },
    /// MTP rounds of at most `depth` proposals.
    Mtp { round: Box<Round>, depth: usize },
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
}

impl Slot {
    /// Emits `chunk` under the one emission rule ([`Emitter`]: stop ids, budget, cancel).
    fn emit(&mut self, chunk: &[u32], on: &mut dyn FnMut(u64, &[u32]) -> bool) -> bool {
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

    fn remaining(&self) -> usize {
        self.max.saturating_sub(self.tokens.len())
    }

    fn output(mut self) -> GenerationOutput {
        if let Some(o) = self.outcome.as_mut() {
            if matches!(self.lane, Lane::Mtp { .. }) {
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
            self.prompt_len,
        );
        self.timings.constraint_ms = self.sampler.constraint().map(|c| c.mask_cost().0);
        GenerationOutput {
            tokens: self.tokens,
            finish_reason: self.finish.unwrap_or(FinishReason::Length),
            timings: self.timings,
            speculation: self.outcome,
            prompt_tokens: self.prompt_len,
        }
    }
}

/// Sequences decoded together on one engine.
pub struct Batch<'e> {
    engine: &'e Engine,
    slots: Vec<Slot>,
    done: Vec<(u64, Result<GenerationOutput>)>,
}

impl<'e> Batch<'e> {
    /// An empty batch.
    pub fn new(engine: &'e Engine) -> Self {
        Batch {
            engine,
            slots: Vec::new(),
            done: Vec::new(),
        }
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
        if let Err(e) = self.try_join(id, prompt, opts, on_tokens) {
            self.done.push((id, Err(e)));
        }
    }

    fn try_join(
        &mut self,
        id: u64,
        prompt: &[u32],
        opts: &GenerateOptions,
        on_tokens: &mut dyn FnMut(u64, &[u32]) -> bool,
    ) -> Result<()> {
        let engine = self.engine;
        engine.check(prompt, opts)?;
        let (outcome, speculate) = engine.speculation_plan(opts);
        let start = Instant::now();
        let mut sampler = engine.sampler(opts)?;
        let mut spec_timings = SpecTimings::default();
        let mut timings = Timings::default();
        let lane = match (speculate, engine.drafter()) {
            (true, Some(head)) => {
                let mut computed = 0;
                let round = speculative::prefill(
                    engine.model(),
                    head,
                    prompt,
                    opts.images.as_ref(),
                    &mut sampler,
                    &mut spec_timings,
                    None,
                    false,
                    None,
                    &mut None,
                    &mut None,
                    &mut computed,
                )?;
                timings.prefill_ms = Some(spec_timings.prefill_ms);
                Lane::Mtp {
                    round: Box::new(round),
                    depth: opts.num_draft_tokens.unwrap_or(0),
                }
            }
            _ => {
                let mut cache = [engine.new_cache(opts)];
                let out = engine
                    .model()
                    .forward(&[prompt.to_vec()], &mut cache, LogitsAt::Last)?;
                timings.prefill_ms = Some(start.elapsed().as_secs_f64() * 1e3);
                let [cache] = cache;
                Lane::Target {
                    cache,
                    logits: out.logits,
                    history: prompt.to_vec(),
                }
            }
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
        };
        if slot.max == 0 {
            slot.finish = Some(FinishReason::Length);
        } else if let Lane::Mtp { round, .. } = &slot.lane {
            let b = round.bonus;
            slot.first_at = Some(Instant::now());
            slot.emit(&[b], on_tokens);
        }
        self.slots.push(slot);
        self.retire();
        Ok(())
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
        std::mem::take(&mut self.done)
    }

    fn retire(&mut self) {
        let mut i = 0;
        while i < self.slots.len() {
            if self.slots[i].finish.is_some() {
                let s = self.slots.swap_remove(i);
                self.done.push((s.id, Ok(s.output())));
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
        let t0 = Instant::now();
        // 1. each sequence's row: a target-only sequence samples and emits its next token (the
        //    row feeds it); a speculating one drafts its round
        let mut rows: Vec<Vec<u32>> = Vec::new();
        let mut members: Vec<(usize, Option<Drafts>)> = Vec::new();
        let mut failed: Vec<(usize, String)> = Vec::new();
        for (i, s) in self.slots.iter_mut().enumerate() {
            if s.finish.is_some() {
                continue;
            }
            let pos = s.tokens.len();
            let remaining = s.remaining();
            match &mut s.lane {
                Lane::Target {
                    logits, history, ..
                } => {
                    s.sampler.apply_penalties(logits, history);
                    let tok = match s.sampler.pick(logits, pos) {
                        Ok(t) => t,
                        Err(e) => {
                            failed.push((i, e.to_string()));
                            continue;
                        }
                    };
                    history.push(tok);
                    s.first_at.get_or_insert_with(Instant::now);
                    if s.emit(&[tok], on_tokens) {
                        rows.push(vec![tok]);
                        members.push((i, None));
                    }
                }
                Lane::Mtp { round, depth } => {
                    let k = (*depth).min(remaining);
                    let Some(head) = head.filter(|_| k > 0) else {
                        s.finish = Some(FinishReason::Length);
                        continue;
                    };
                    match speculative::draft(model, head, round, k, &mut s.sampler, pos) {
                        Ok(d) => {
                            rows.push(speculative::verify_row(round, &d));
                            members.push((i, Some(d)));
                        }
                        Err(e) => failed.push((i, e.to_string())),
                    }
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
                })
                .collect();
            let out = model.forward(&rows, &mut caches, LogitsAt::All);
            for ((i, _), c) in members.iter().zip(caches) {
                match &mut self.slots[*i].lane {
                    Lane::Target { cache, .. } => *cache = c,
                    Lane::Mtp { round, .. } => round.put_cache(c),
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
                        match (&mut s.lane, d, head) {
                            (Lane::Target { logits: next, .. }, None, _) => {
                                *next = logits.to_vec();
                            }
                            (Lane::Mtp { round, .. }, Some(d), Some(head)) => {
                                s.spec_timings.draft_ms += draft_ms;
                                s.spec_timings.verify_ms += verify_ms;
                                let mut stats = s
                                    .outcome
                                    .as_mut()
                                    .map(|o| std::mem::take(&mut o.stats))
                                    .unwrap_or_default();
                                let new = speculative::finish_round(
                                    model,
                                    head,
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
                                    Ok(new) => {
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

/// What a [`Scheduler`] sends back for one request.
#[derive(Debug)]
pub enum BatchEvent {
    /// Newly accepted tokens.
    Tokens(Vec<u32>),
    /// The end: the output, or why it failed.
    Done(Box<Result<GenerationOutput>>),
}

struct Job {
    prompt: Vec<u32>,
    opts: GenerateOptions,
    events: mpsc::Sender<BatchEvent>,
}

/// The thread that owns a [`Batch`]: requests from any thread join between steps, up to
/// `max_batch` at once (the rest wait in order). Dropping a request's receiver cancels it at
/// the next token. The thread ends when the scheduler is dropped and its sequences are done.
pub struct Scheduler {
    tx: Option<mpsc::Sender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Scheduler {
    /// Starts the thread.
    pub fn spawn(engine: Arc<Engine>, max_batch: usize) -> Scheduler {
        let (tx, rx) = mpsc::channel::<Job>();
        let max_batch = max_batch.max(1);
        let thread = std::thread::Builder::new()
            .name("mtp-scheduler".into())
            .spawn(move || run_scheduler(&engine, rx, max_batch))
            .ok();
        Scheduler {
            tx: Some(tx),
            thread,
        }
    }

    /// Queues a request; its tokens and its end come on the returned receiver.
    pub fn submit(
        &self,
        prompt: Vec<u32>,
        opts: GenerateOptions,
    ) -> Result<mpsc::Receiver<BatchEvent>> {
        let (events, rx) = mpsc::channel();
        let job = Job {
            prompt,
            opts,
            events,
        };
        self.tx
            .as_ref()
            .and_then(|tx| tx.send(job).ok())
            .ok_or_else(|| Error::Batch("the scheduler thread has stopped".into()))?;
        Ok(rx)
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

fn run_scheduler(engine: &Engine, rx: mpsc::Receiver<Job>, max_batch: usize) {
    let mut batch = Batch::new(engine);
    let mut waiting: VecDeque<Job> = VecDeque::new();
    let mut senders: BTreeMap<u64, mpsc::Sender<BatchEvent>> = BTreeMap::new();
    let mut next_id = 0u64;
    let mut open = true;
    loop {
        // take what arrived; block only when there is nothing to do
        if batch.active() == 0 && waiting.is_empty() {
            match rx.recv() {
                Ok(job) => waiting.push_back(job),
                Err(_) => return,
            }
        }
        while open {
            match rx.try_recv() {
                Ok(job) => waiting.push_back(job),
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => open = false,
            }
        }
        while batch.active() < max_batch {
            let Some(job) = waiting.pop_front() else {
                break;
            };
            let id = next_id;
            next_id += 1;
            senders.insert(id, job.events);
            let s = &senders;
            batch.join(id, &job.prompt, &job.opts, &mut |id, t| forward(s, id, t));
        }
        if batch.active() > 0 {
            let s = &senders;
            batch.step(&mut |id, t| forward(s, id, t));
        }
        for (id, out) in batch.take_finished() {
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
