//! Continuous batching: sequences join and leave between steps, and each step reads the
//! weights once per row shape for every sequence in it.
//!
//! A step is **plan, run, commit** ([`Batch::step`]), the shape of vLLM's v1 scheduler:
//! 1. *plan*: what each sequence puts in the step (`sequence::Work`): a chunk of a prompt
//!    still being computed, the next token of a target-only sequence (picked at the last
//!    commit), or a round of `k` proposals for a speculating one (`auto` depths chosen
//!    together, `depth.rs`). The plan reads the sequences' states and the depth model, never
//!    the model or its logits;
//! 2. *run*: the rounds draft together (`speculative::draft_batch`: each draft position is one
//!    MTP-head forward and one LM-head product over every sequence still drafting), then one
//!    target forward over every row (prompt chunks, target tokens, `k + 1` verify rows per
//!    round), each sequence with its own cache ([`crate::Qwen35Model::forward_each`]: the
//!    logits of the rows that need them only);
//! 3. *commit*: each sequence takes its rows: a prompt chunk feeds the drafter its pairs and
//!    keeps the states asked for, the prompt's last chunk starts the decoding and emits the
//!    first token; a target-only sequence picks and emits its next token; a round accepts,
//!    rolls back, updates the drafter and emits.
//!
//! **The step's invariant**: every row is computed as it would be alone (the forward groups
//! sequences so that no product changes arithmetic with the rows beside it), and every token
//! is picked in the commit of the step whose rows it comes from, from the sequence's own state;
//! so a sequence's tokens are bit for bit the ones it gets alone ([`Engine::generate`]). The
//! tests check that at several batch sizes, with and without MTP and with mixed depths.
//!
//! A joining request is resolved once (`spec::SeqSpec`: its checks, the speculation decision
//! by the contract's `plan`, its sampler, stops and the state it resumes), then joins with no
//! model work; its prompt is computed by the steps, at most the batch's prefill chunk
//! ([`DEFAULT_PREFILL_CHUNK`] tokens unless set) per step, so one long prompt does not stall
//! the sequences already decoding. A chunked prompt resumes exactly as a prefix-cache state
//! does, so its tokens are still the ones it gets alone.
//!
//! Sequences asking for `auto` depths get them chosen jointly each step: one forward's rows
//! are shared, so as the batch fills each draft buys less than the row it costs and depths
//! fall, to plain target steps where drafting would cost more than it gains.
//!
//! A sequence may resume from a prefix-cache state and keep the states a solo call keeps
//! ([`GenerateOptions::resume`], [`GenerateOptions::checkpoint`]: after the conversation
//! before the generation prompt, after the prompt, after the last token fed), so a batched
//! chat turn resumes the last one's state exactly as [`Engine::generate`] does. A solo call
//! *is* a batch of one: each sequence (`sequence::Sequence`) has one decode loop.
//!
//! [`Batch`] is the synchronous core (the caller decides when to step); [`Scheduler`] is the
//! thread that owns a batch and takes requests from any thread. A caller on another thread
//! cannot answer a chunk of tokens while the step that emitted it runs, so its sequence is
//! *paced* ([`Batch::join_paced`], [`Scheduler::submit_paced`]): after each chunk it waits,
//! out of the steps, for the caller's answer ([`Batch::answer`]) before it goes on or ends.
//! Everything else is as with a callback that answers at once, so a sequence its caller stops
//! (a stop string) ends with the output, the draft statistics, the timings and the
//! prefix-cache states it gets alone.
//!
//! [`Scheduler`]: crate::scheduler::Scheduler
//! [`Scheduler::submit_paced`]: crate::scheduler::Scheduler::submit_paced

use std::time::{Duration, Instant};

use mtp_contract::FinishReason;

use crate::cache::SeqCache;
use crate::depth::{self, Choice, Fixed};
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::qwen3_5::{ForwardOutput, LogitsAt, FORWARD_PART};
use crate::request::{GenerateOptions, GenerationOutput};
use crate::resume::PromptState;
use crate::sampling::Sampler;
use crate::sequence::{Lane, OnTokens, Sequence, Work};
use crate::spec::SeqSpec;
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

    /// Sets the prompt tokens a step computes for each joining sequence (at least 1).
    pub fn with_prefill_chunk(mut self, tokens: usize) -> Self {
        self.chunk = tokens.max(1);
        self
    }

    /// Sequences still generating.
    pub fn active(&self) -> usize {
        self.slots.len()
    }

    /// Adds a sequence: resolves its request (every check and decision, before any model
    /// work; a refused request ends at once with its error in [`Batch::take_finished`]), and
    /// its prompt is computed by the next steps, a chunk per step. `on_tokens` of each
    /// [`Batch::step`] receives its tokens (false cancels it). It resumes from
    /// [`GenerateOptions::resume`] and keeps the states [`GenerateOptions::checkpoint`] asks
    /// for, exactly as [`Engine::generate`] does. Errors of this sequence end only this
    /// sequence.
    pub fn join(&mut self, id: u64, prompt: &[u32], opts: &GenerateOptions) {
        self.add(id, prompt, opts, false);
    }

    /// [`Batch::join`] for a caller that answers each chunk later, from elsewhere: after each
    /// chunk that does not end it, the sequence sits out the steps until [`Batch::answer`]
    /// says whether it goes on, so it ends exactly where a callback returning that answer
    /// would have ended it (its tokens, draft statistics, timings and states are the ones it
    /// gets alone). `on_tokens` of a step returning false means the caller is gone: the
    /// sequence is cancelled at once.
    pub fn join_paced(&mut self, id: u64, prompt: &[u32], opts: &GenerateOptions) {
        self.add(id, prompt, opts, true);
    }

    fn add(&mut self, id: u64, prompt: &[u32], opts: &GenerateOptions, paced: bool) {
        match SeqSpec::resolve(self.engine, prompt, opts) {
            Ok(spec) => self
                .slots
                .push(Sequence::join(self.engine, id, spec, paced)),
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

    /// One step for every sequence: plan, run, commit.
    ///
    /// 1. **plan** (`Batch::plan`): what each sequence puts in the step (a prompt chunk, its
    ///    next token, or a round of a chosen depth), from the sequences' states and the depth
    ///    model alone, before the model runs;
    /// 2. **run** (`Batch::run`): the rounds draft together, then one target forward over
    ///    every row (prompt chunks, target tokens, verify rows), each sequence with its own
    ///    cache;
    /// 3. **commit** (`Batch::commit`): each sequence takes its rows: picks, accepts, rolls
    ///    back, keeps states, emits.
    ///
    /// The invariant: every row is computed as it is alone (the forward groups sequences so no
    /// product changes arithmetic, see [`crate::Qwen35Model::forward_each`]), and every token
    /// is picked in the commit of the step whose rows it comes from, so a sequence's tokens
    /// are bit for bit the ones it gets alone.
    pub fn step(&mut self, on_tokens: &mut dyn FnMut(u64, &[u32]) -> bool) {
        // a cancelled request ends before its next prompt part or decode step
        if self
            .slots
            .iter_mut()
            .fold(false, |any, s| s.ends_if_cancelled() | any)
        {
            self.retire();
        }
        let plan = self.plan();
        let mut failed = Vec::new();
        if let Some(ran) = self.run(&plan, &mut failed) {
            self.commit(ran, on_tokens, &mut failed);
        }
        failed.sort_unstable_by_key(|x: &(usize, Error)| std::cmp::Reverse(x.0));
        failed.dedup_by_key(|x| x.0);
        for (i, e) in failed {
            let s = self.slots.remove(i);
            self.done.push((s.id, Err(e)));
        }
        self.retire();
    }

    /// The step's plan: each stepping sequence's [`Work`], with the depths of the `auto` ones
    /// chosen together. Reads no model output.
    fn plan(&self) -> StepPlan {
        let chosen = self.choose_depths();
        StepPlan {
            work: self
                .slots
                .iter()
                .enumerate()
                .filter_map(|(i, s)| Some((i, s.work(self.chunk, chosen[i])?)))
                .collect(),
        }
    }

    /// Runs a plan: the rounds' drafts, then the one forward. `None` when no row is left (every
    /// sequence failed drafting, or none steps).
    fn run(&mut self, plan: &StepPlan, failed: &mut Vec<(usize, Error)>) -> Option<Ran> {
        let engine = self.engine;
        let model = engine.model();
        let t0 = Instant::now();
        let mut ran = Ran::default();
        for &(i, w) in &plan.work {
            let s = &self.slots[i];
            match w {
                Work::Prompt { to } => {
                    ran.rows.push(s.chunk_tokens(to));
                    ran.at.push(match s.ends_prompt(to) {
                        true => LogitsAt::Last,
                        false => LogitsAt::None,
                    });
                    ran.members.push((i, Member::Prompt { to }));
                }
                Work::Target { token } => {
                    ran.rows.push(vec![token]);
                    ran.at.push(LogitsAt::All);
                    ran.members.push((i, Member::Target));
                }
                Work::Round { .. } => {}
            }
        }
        let heads = self.draft(plan, &mut ran, failed);
        if ran.rows.is_empty() {
            return None;
        }
        let t1 = Instant::now();
        let mut caches: Vec<SeqCache> = ran
            .members
            .iter()
            .map(|(i, _)| self.slots[*i].take_cache())
            .collect();
        // while it runs, each constrained sequence computes the mask of its next pick: a
        // target-only one's at its new position, a speculating one's after its drafts
        let mut ahead_of: Vec<Option<&[u32]>> = vec![None; self.slots.len()];
        for (i, m) in &ran.members {
            match m {
                Member::Target => ahead_of[*i] = Some(&[]),
                Member::Round(d) => ahead_of[*i] = Some(d.tokens()),
                Member::Prompt { .. } => {}
            }
        }
        let ahead: Vec<(&mut Sampler, &[u32])> = self
            .slots
            .iter_mut()
            .zip(ahead_of)
            .filter_map(|(s, a)| Some((&mut s.sampler, a?)))
            .collect();
        let out = crate::sampling::masks_beside(ahead, || {
            model.forward_each(&ran.rows, &mut caches, &ran.at)
        });
        for ((i, _), c) in ran.members.iter().zip(caches) {
            self.slots[*i].put_cache(c);
        }
        let t2 = Instant::now();
        (ran.draft_ms, ran.forward_ms) = (ms(t1 - t0), ms(t2 - t1));
        // the cost model learns from decode steps only (a prompt chunk is not a row's cost)
        if !ran
            .members
            .iter()
            .any(|(_, m)| matches!(m, Member::Prompt { .. }))
        {
            let mut m = speculative::lock(engine.depths());
            m.cost
                .record_forward(ran.rows.iter().map(Vec::len).sum(), ran.forward_ms);
            m.cost.record_heads(heads, ran.draft_ms);
        }
        ran.out = Some(out);
        Some(ran)
    }

    /// The rounds of a plan draft together (one head forward per draft position for all of
    /// them); each adds its verify rows to the step. The head forwards run.
    fn draft(&mut self, plan: &StepPlan, ran: &mut Ran, failed: &mut Vec<(usize, Error)>) -> usize {
        let engine = self.engine;
        let depth_of = |i: usize| {
            plan.work.iter().find_map(|&(j, w)| match w {
                Work::Round { depth } if j == i => Some(depth),
                _ => None,
            })
        };
        let mut drafting: Vec<(usize, speculative::Drafting<'_>)> = Vec::new();
        for (i, s) in self.slots.iter_mut().enumerate() {
            let Some(k) = depth_of(i) else { continue };
            let pos = s.tokens.len();
            if let Lane::Mtp { round, .. } = &mut s.lane {
                let it = speculative::Drafting {
                    r: round,
                    k,
                    s: &mut s.sampler,
                    pos,
                };
                drafting.push((i, it));
            }
        }
        if drafting.is_empty() {
            return 0;
        }
        let Some(head) = engine.drafter() else {
            for (i, _) in drafting {
                failed.push((
                    i,
                    Error::Batch("a speculating sequence without a drafter".into()),
                ));
            }
            return 0;
        };
        let mut heads = 0;
        let (which, mut items): (Vec<usize>, Vec<speculative::Drafting<'_>>) =
            drafting.into_iter().unzip();
        let drafts = speculative::draft_batch(engine.model(), head, &mut items);
        for ((i, it), d) in which.into_iter().zip(items).zip(drafts) {
            match d {
                Ok(d) => {
                    heads += d.heads;
                    ran.rows.push(speculative::verify_row(it.r, &d));
                    ran.at.push(LogitsAt::All);
                    ran.members.push((i, Member::Round(d)));
                }
                Err(e) => failed.push((i, e)),
            }
        }
        heads
    }

    /// Each sequence takes its rows of the step's forward: a prompt chunk's, its next token's
    /// logits, or its round's verify rows. A forward that failed fails every sequence in it.
    fn commit(
        &mut self,
        mut ran: Ran,
        on_tokens: &mut OnTokens<'_>,
        failed: &mut Vec<(usize, Error)>,
    ) {
        let engine = self.engine;
        let mut out = match ran.out.take() {
            Some(Ok(out)) => out,
            Some(Err(e)) => {
                // a forward shared by several sequences that failed fails each of them
                let message = e.to_string();
                let mut e = Some(e);
                for (i, _) in &ran.members {
                    let e = e.take().unwrap_or_else(|| Error::Batch(message.clone()));
                    failed.push((*i, e));
                }
                return;
            }
            None => return,
        };
        let (vocab, dm) = (engine.model().vocab_size(), engine.model().hidden_size());
        let decoding = ran
            .members
            .iter()
            .filter(|(_, m)| !matches!(m, Member::Prompt { .. }))
            .count()
            .max(1);
        let share = 1.0 / decoding as f64;
        let (draft_ms, verify_ms) = (ran.draft_ms * share, ran.forward_ms * share);
        let ForwardOutput { hidden, logits } = &mut out;
        let (mut h, mut l) = (0, 0);
        for (((i, m), row), at) in ran.members.iter().zip(&ran.rows).zip(&ran.at) {
            let n = row.len();
            let nl = match at {
                LogitsAt::All => n,
                LogitsAt::Last => 1,
                LogitsAt::None => 0,
            };
            let hid = &hidden[h * dm..(h + n) * dm];
            let lg = &mut logits[l * vocab..(l + nl) * vocab];
            (h, l) = (h + n, l + nl);
            let s = &mut self.slots[*i];
            let took = match m {
                Member::Prompt { to } => {
                    s.take_chunk(engine, *to, (hid, lg), ran.forward_ms, on_tokens)
                }
                Member::Target => s.take_target(lg, hid, dm, on_tokens),
                Member::Round(d) => {
                    s.take_round(engine, d, (lg, hid), (draft_ms, verify_ms), on_tokens)
                }
            };
            if let Err(e) = took {
                failed.push((*i, e));
            }
        }
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

/// Milliseconds of a duration.
fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// What one step does: each stepping sequence's [`Work`], by slot, in slot order.
struct StepPlan {
    work: Vec<(usize, Work)>,
}

/// A sequence's part of the step's forward.
enum Member {
    /// A prompt chunk ending at `to`.
    Prompt { to: usize },
    /// A target-only sequence's token.
    Target,
    /// A round's verify rows, with its drafts.
    Round(Drafts),
}

/// What [`Batch::run`] did: the forward's rows, by member, and its output.
#[derive(Default)]
struct Ran {
    rows: Vec<Vec<u32>>,
    at: Vec<LogitsAt>,
    members: Vec<(usize, Member)>,
    out: Option<Result<ForwardOutput>>,
    draft_ms: f64,
    forward_ms: f64,
}

impl Engine {
    /// Generates from `prompt` token ids. `on_tokens` receives each accepted chunk (one token in
    /// target-only decoding, up to `k + 1` per MTP round) and returns `false` to cancel.
    ///
    /// A solo call is a batch of one ([`Batch`]): the same sequence, stepped alone, its prompt
    /// computed in parts of `FORWARD_PART` (1,024) tokens (as one forward of it would be, so
    /// that [`GenerateOptions::on_prompt_progress`] hears of each). With
    /// [`GenerateOptions::resume`] and [`GenerateOptions::checkpoint`] it resumes from and
    /// keeps prefix-cache states.
    pub fn generate(
        &self,
        prompt: &[u32],
        opts: &GenerateOptions,
        mut on_tokens: impl FnMut(&[u32]) -> bool,
    ) -> Result<GenerationOutput> {
        let mut batch = Batch::new(self).with_prefill_chunk(FORWARD_PART);
        let mut on = |_: u64, t: &[u32]| on_tokens(t);
        batch.join(0, prompt, opts);
        while batch.active() > 0 {
            batch.step(&mut on);
        }
        batch.take_finished().pop().map_or_else(
            || Err(Error::Batch("the sequence did not end".into())),
            |(_, r)| r,
        )
    }
}
