//! The steps of one native MTP round: `draft_batch` → the verify forward (run by the batch,
//! `verify_row` makes a sequence's row) → `accept` → `rollback` → `update_drafter`
//! (`Round::finish`), each a named step over `Round` state; statistics go to one
//! [`DraftStats`]. A `Sequence` runs them; a solo call is a batch of one.
//!
//! * Greedy: a draft is accepted when it equals the target's argmax; output is identical to
//!   target-only greedy decoding (the verify forward's rows are computed exactly as single-token
//!   forwards would be, see `kernels::matmul_rows`).
//! * Seeded sampling: the drafter drafts greedily; the target's token at generated position `i`
//!   is drawn with the position-keyed uniform `u(seed, i)`, exactly as plain decoding draws it,
//!   and accepted on equality — the text is the same as plain seeded decoding.
//! * Unseeded sampling: standard speculative sampling. The drafter samples `d ~ q`; the target
//!   accepts with probability `min(1, p(d) / q(d))` and on rejection resamples from
//!   `norm(max(0, p - q))`; when all drafts pass, the bonus token is drawn from `p`.
//!
//! Drafter bookkeeping follows mlx-vlm 0.7.10: the drafter's entry at position `p` pairs the
//! token at `p + 1` with the target hidden at `p`; drafter entries appended while drafting are
//! kept for accepted drafts, the rest are trimmed, and the accepted tail plus the bonus token are
//! fed with the verified hidden states. They are fed when the next round drafts (its first step
//! produces the seed from them), so a round of depth 0 (a plain target step, which an `auto`
//! depth may choose) costs no drafter work and the last round's update is never computed; the
//! drafter catches up with every pending pair in one forward.

use std::sync::Mutex;
use std::time::Instant;

use mtp_contract::DraftStats;

use crate::cache::SeqCache;
use crate::depth::DepthModel;
use crate::error::{Error, Result};
use crate::qwen3_5::Qwen35Model;
use crate::qwen3_5_mtp::{MtpCache, MtpHead};
use crate::resume::PromptState;
use crate::sampling::{argmax, Sampler};

/// Milliseconds spent in each step.
#[derive(Debug, Clone, Copy, Default)]
pub struct SpecTimings {
    /// Drafting, including the drafter update after acceptance.
    pub draft_ms: f64,
    /// Verify forwards.
    pub verify_ms: f64,
    /// Cache rollback.
    pub rollback_ms: f64,
}

/// The state carried between rounds.
pub(crate) struct Round {
    cache: SeqCache,
    mcache: MtpCache,
    /// The target's last token (first input of the next verify).
    pub(crate) bonus: u32,
    /// The drafter's next proposal and its hidden state, produced when the drafter was updated.
    seed: u32,
    seed_q: Option<Vec<f32>>,
    seed_hidden: Vec<f32>,
    /// Drafter entries appended while drafting this round.
    appended: usize,
    /// Generated tokens fed to the target so far (bonus inputs and accepted drafts).
    fed: Vec<u32>,
    /// The target's final hidden state at the last fed position.
    last_hidden: Vec<f32>,
    /// Pairs not yet fed to the drafter (tokens and the target hidden states before them);
    /// while any are pending, `seed` is stale.
    pending: Vec<u32>,
    pending_hidden: Vec<f32>,
}

/// Pairs a run of plain (depth-0) steps may leave pending before the drafter catches up.
const MAX_PENDING: usize = 64;

/// Proposals of one round (with their draft distributions for unseeded sampling).
pub(crate) struct Drafts {
    tokens: Vec<u32>,
    q: Vec<Vec<f32>>,
    /// Drafter forwards this round ran (the catch-up that made the seed, and the recurrent
    /// drafts).
    pub(crate) heads: usize,
}

impl Drafts {
    /// The proposals.
    pub(crate) fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Proposals made.
    pub(crate) fn len(&self) -> usize {
        self.tokens.len()
    }
}

fn mode_uses_q(s: &Sampler) -> bool {
    !s.is_greedy() && !s.is_seeded()
}

/// Picks the drafter's token from its logits: argmax for greedy and seeded modes, a sample from
/// the processed distribution otherwise.
/// Under a constraint the logits are masked with the state at this position first.
fn draft_pick(s: &mut Sampler, logits: &[f32], position: usize) -> Result<(u32, Option<Vec<f32>>)> {
    let logits = s.constrain(logits)?;
    Ok(if mode_uses_q(s) {
        let q = s.distribution(&logits);
        let u = s.uniform(1, position);
        (Sampler::draw(&q, u), Some(q))
    } else {
        (argmax(&logits), None)
    })
}

/// One sequence's part in [`draft_batch`]: its round, depth, sampler and output position.
pub(crate) struct Drafting<'a> {
    pub(crate) r: &'a mut Round,
    pub(crate) k: usize,
    pub(crate) s: &'a mut Sampler,
    pub(crate) pos: usize,
}

/// Where one sequence's drafting stands.
struct DraftWalk {
    d: Drafts,
    /// The last draft and the head's hidden state after it.
    tok: u32,
    h: Vec<f32>,
    /// Drafts fed to the grammar (rolled back at the end).
    fed: usize,
    open: bool,
}

/// Step 1, for every speculating sequence of a step at once: each drafts `k` tokens (the
/// seed, made by feeding the drafter the last rounds' pairs, plus `k - 1` recurrent head
/// forwards; `k = 0` drafts nothing: the round is a target step). Each head forward and each LM-head product serves
/// every sequence still drafting ([`MtpHead::forward_ragged`]), so a batch reads the head's
/// weights once per draft position instead of once per sequence. Each sequence gets the
/// drafts (and bits) it gets alone; one that fails ends alone with its error.
pub(crate) fn draft_batch(
    model: &Qwen35Model,
    head: &MtpHead,
    items: &mut [Drafting<'_>],
) -> Vec<Result<Drafts>> {
    let n = items.len();
    let mut out: Vec<Option<Result<Drafts>>> = (0..n).map(|_| None).collect();
    let heads = catch_up(model, head, items, &mut out);
    let mut walks = seed_walks(items, &heads, &mut out);
    recurrent_drafts(model, head, items, &mut walks, &mut out);
    for (i, it) in items.iter_mut().enumerate() {
        if let Some(w) = walks[i].take() {
            out[i] = Some(it.s.rollback(w.fed).map(|()| w.d));
        }
    }
    out.into_iter()
        .map(|o| o.unwrap_or_else(|| Err(Error::Batch("a draft was not made".into()))))
        .collect()
}

/// Step 1a of [`draft_batch`], the catch-up: a long run of plain steps catches the drafter up
/// now and then rather than hold every hidden state until the next draft; a sequence that
/// drafts this round feeds its pending pairs and picks its seed from them. The head forwards
/// each sequence ran.
fn catch_up(
    model: &Qwen35Model,
    head: &MtpHead,
    items: &mut [Drafting<'_>],
    out: &mut [Option<Result<Drafts>>],
) -> Vec<usize> {
    let mut heads = vec![0usize; items.len()];
    let mut catch: Vec<usize> = Vec::new();
    for (i, it) in items.iter_mut().enumerate() {
        it.r.appended = 0;
        if !it.r.pending.is_empty() && (it.k > 0 || it.r.pending.len() >= MAX_PENDING) {
            catch.push(i);
        }
    }
    if !catch.is_empty() {
        let pending: Vec<(Vec<u32>, Vec<f32>)> = catch
            .iter()
            .map(|&i| {
                let r = &mut *items[i].r;
                (
                    std::mem::take(&mut r.pending),
                    std::mem::take(&mut r.pending_hidden),
                )
            })
            .collect();
        let rows: Vec<(&[u32], &[f32])> = pending
            .iter()
            .map(|(t, h)| (t.as_slice(), h.as_slice()))
            .collect();
        let lasts = heads_and_logits(model, head, items, &catch, &rows);
        match lasts {
            Err(e) => share_error(e, &catch, out),
            Ok(lasts) => {
                for (&i, (last, logits)) in catch.iter().zip(lasts) {
                    let it = &mut items[i];
                    match draft_pick(it.s, &logits, it.pos) {
                        Ok((t, q)) => {
                            it.r.seed = t;
                            it.r.seed_q = q;
                            it.r.seed_hidden = last;
                            heads[i] += 1;
                        }
                        Err(e) => out[i] = Some(Err(e)),
                    }
                }
            }
        }
    }
    heads
}

/// Step 1b of [`draft_batch`], the seeds: each sequence's first draft (a depth-0 round drafts
/// nothing and is done here). Under a constraint the grammar walks through the drafts (each
/// is picked with the state after the ones before it) and is rolled back before verifying;
/// drafting stops at an end token or where the grammar is complete (only the end could
/// follow).
fn seed_walks(
    items: &mut [Drafting<'_>],
    heads: &[usize],
    out: &mut [Option<Result<Drafts>>],
) -> Vec<Option<DraftWalk>> {
    let n = items.len();
    let mut walks: Vec<Option<DraftWalk>> = (0..n).map(|_| None).collect();
    for (i, it) in items.iter_mut().enumerate() {
        if out[i].is_some() {
            continue;
        }
        if it.k == 0 {
            out[i] = Some(Ok(Drafts {
                tokens: Vec::new(),
                q: Vec::new(),
                heads: heads[i],
            }));
            continue;
        }
        let tok = it.r.seed;
        let mut w = DraftWalk {
            d: Drafts {
                tokens: vec![tok],
                q: it.r.seed_q.take().into_iter().collect(),
                heads: heads[i],
            },
            tok,
            h: it.r.seed_hidden.clone(),
            fed: 0,
            open: !it.s.is_constrained_end(tok),
        };
        if w.open {
            match it.s.advance(tok) {
                Ok(()) => {
                    w.fed += 1;
                    w.open = !it.s.constraint_complete();
                }
                Err(e) => {
                    out[i] = Some(Err(e));
                    continue;
                }
            }
        }
        walks[i] = Some(w);
    }
    walks
}

/// Step 1c of [`draft_batch`], the recurrent drafts: one head forward per position for every
/// sequence still drafting.
fn recurrent_drafts(
    model: &Qwen35Model,
    head: &MtpHead,
    items: &mut [Drafting<'_>],
    walks: &mut [Option<DraftWalk>],
    out: &mut [Option<Result<Drafts>>],
) {
    let n = items.len();
    loop {
        let active: Vec<usize> = (0..n)
            .filter(|&i| {
                walks[i]
                    .as_ref()
                    .is_some_and(|w| w.open && w.d.tokens.len() < items[i].k)
            })
            .collect();
        if active.is_empty() {
            break;
        }
        let inputs: Vec<(u32, Vec<f32>)> = active
            .iter()
            .map(|&i| {
                let w = walks[i].as_ref().expect("active");
                (w.tok, w.h.clone())
            })
            .collect();
        let rows: Vec<(&[u32], &[f32])> = inputs
            .iter()
            .map(|(t, h)| (std::slice::from_ref(t), h.as_slice()))
            .collect();
        let lasts = match heads_and_logits(model, head, items, &active, &rows) {
            Ok(l) => l,
            Err(e) => {
                for &i in &active {
                    walks[i] = None;
                }
                share_error(e, &active, out);
                continue;
            }
        };
        for (&i, (h, logits)) in active.iter().zip(lasts) {
            let it = &mut items[i];
            let w = walks[i].as_mut().expect("active");
            w.h = h;
            it.r.appended += 1;
            w.d.heads += 1;
            let step = draft_pick(it.s, &logits, it.pos + w.d.tokens.len()).and_then(|(t, q)| {
                w.tok = t;
                w.d.tokens.push(t);
                if let Some(q) = q {
                    w.d.q.push(q);
                }
                if it.s.is_constrained_end(t) || w.d.tokens.len() == it.k {
                    w.open = false;
                    return Ok(());
                }
                it.s.advance(t)?;
                w.fed += 1;
                w.open = !it.s.constraint_complete();
                Ok(())
            });
            if let Err(e) = step {
                walks[i] = None;
                out[i] = Some(Err(e));
            }
        }
    }
}

/// A forward shared by the sequences `which` failed: the first gets the error, the others
/// (in a batch) its message.
fn share_error(e: Error, which: &[usize], out: &mut [Option<Result<Drafts>>]) {
    let message = e.to_string();
    let mut e = Some(e);
    for &i in which {
        out[i] = Some(Err(e
            .take()
            .unwrap_or_else(|| Error::Batch(message.clone()))));
    }
}

/// One head forward over `rows` (the sequences `which` of `items`, in that order) and the LM
/// head over their last hidden states: per sequence, its hidden state and its logits. The LM
/// head runs in groups of at most [`crate::kernels::MAX_ROWS`] rows, as the head does.
fn heads_and_logits(
    model: &Qwen35Model,
    head: &MtpHead,
    items: &mut [Drafting<'_>],
    which: &[usize],
    rows: &[(&[u32], &[f32])],
) -> Result<Vec<(Vec<f32>, Vec<f32>)>> {
    let mut caches: Vec<&mut MtpCache> = Vec::with_capacity(which.len());
    // each sequence's grammar computes the mask of its next draft pick while the head runs
    let mut ahead: Vec<(&mut Sampler, &[u32])> = Vec::with_capacity(which.len());
    {
        // the caches of `which`, in order (indices are increasing)
        let mut rest: &mut [Drafting<'_>] = items;
        let mut base = 0;
        for &i in which {
            let (_, tail) = rest.split_at_mut(i - base);
            let (it, tail) = tail.split_first_mut().expect("an index in range");
            caches.push(&mut it.r.mcache);
            ahead.push((&mut *it.s, &[]));
            rest = tail;
            base = i + 1;
        }
    }
    crate::sampling::masks_beside(ahead, || {
        let lasts = head.forward_ragged(model, rows, &mut caches)?;
        let mut out = Vec::with_capacity(lasts.len());
        for group in lasts.chunks(crate::kernels::MAX_ROWS) {
            let flat: Vec<f32> = group.iter().flatten().copied().collect();
            let logits = model.logits(&flat, group.len())?;
            let v = model.vocab_size();
            for (j, h) in group.iter().enumerate() {
                out.push((h.clone(), logits[j * v..(j + 1) * v].to_vec()));
            }
        }
        Ok(out)
    })
}

/// Step 2: the verify forward's row `[bonus, d_1 .. d_k]`, with the cache set to record
/// per-position linear states (the row is run next to the other sequences' rows in a step's
/// one forward, or alone in a batch of one).
pub(crate) fn verify_row(r: &mut Round, d: &Drafts) -> Vec<u32> {
    let mut input = Vec::with_capacity(d.tokens.len() + 1);
    input.push(r.bonus);
    input.extend_from_slice(&d.tokens);
    // a round without drafts is a plain step: nothing to roll back
    if !d.tokens.is_empty() {
        r.cache.begin_verify();
    }
    input
}

impl Round {
    /// The target cache, taken out for a batch's forward (an empty one is left in its place).
    pub(crate) fn take_cache(&mut self) -> SeqCache {
        std::mem::replace(&mut self.cache, SeqCache::new(Vec::new()))
    }

    /// Puts the target cache back after a batch's forward.
    pub(crate) fn put_cache(&mut self, c: SeqCache) {
        self.cache = c;
    }
}

/// Step 3: walk the drafts; returns the number accepted and the new tokens (accepted drafts plus
/// the target's own token).
///
/// Under a constraint each row is masked with the grammar state after the tokens before it,
/// and every token kept is fed to the grammar (drafts as they are accepted, then the target's).
/// An accepted draft that completes the grammar ends the walk: the reply is over, and plain
/// decoding would pick nothing after it.
fn accept(
    logits: &[f32],
    vocab: usize,
    d: &Drafts,
    s: &mut Sampler,
    pos: usize,
) -> Result<(usize, Vec<u32>)> {
    let k = d.tokens.len();
    let mut new = Vec::with_capacity(k + 1);
    for j in 0..=k {
        if j > 0 {
            // the draft just accepted moves the grammar on
            s.advance(new[j - 1])?;
            if s.constraint_complete() {
                return Ok((j, new));
            }
        }
        let row = s.constrain(&logits[j * vocab..(j + 1) * vocab])?;
        let row = &row[..];
        if mode_uses_q(s) {
            let p = s.distribution(row);
            if j < k {
                let t = d.tokens[j] as usize;
                let q = &d.q[j];
                let ratio = if q[t] > 0.0 { p[t] / q[t] } else { 1.0 };
                if s.uniform(0, pos + j) < ratio.min(1.0) as f64 {
                    new.push(d.tokens[j]);
                    continue;
                }
                // residual max(0, p - q)
                let mut res: Vec<f32> = p.iter().zip(q).map(|(a, b)| (a - b).max(0.0)).collect();
                let sum: f32 = res.iter().sum();
                let t = if sum > 0.0 {
                    res.iter_mut().for_each(|x| *x /= sum);
                    Sampler::draw(&res, s.uniform(2, pos + j))
                } else {
                    Sampler::draw(&p, s.uniform(2, pos + j))
                };
                new.push(t);
                return walked(s, j, new);
            }
            let t = Sampler::draw(&p, s.uniform(0, pos + j));
            new.push(t);
            return walked(s, j, new);
        }
        let t = s.sample(row, pos + j);
        new.push(t);
        if j < k && t == d.tokens[j] {
            continue;
        }
        return walked(s, j, new);
    }
    walked(s, k, new)
}

/// The end of the acceptance walk: the target's own token (the last new one) moves the grammar on.
fn walked(s: &mut Sampler, accepted: usize, new: Vec<u32>) -> Result<(usize, Vec<u32>)> {
    if let Some(&t) = new.last() {
        s.advance(t)?;
    }
    Ok((accepted, new))
}

/// Step 4: keep the verified positions of the accepted prefix plus the bonus input.
fn rollback(r: &mut Round, accepted: usize) {
    r.cache.commit_verify(accepted + 1);
}

/// Step 5: trim the drafter's rejected entries and queue the accepted tokens with their
/// verified hidden states for it (fed when the next round drafts, see [`draft`]).
fn update_drafter(
    dm: usize,
    r: &mut Round,
    d: &Drafts,
    accepted: usize,
    new: &[u32],
    verify_hidden: &[f32],
) {
    let keep = accepted.min(r.appended);
    r.mcache.trim(r.appended - keep);
    r.appended = 0;
    let bonus = *new.last().unwrap_or(&r.bonus);
    r.pending.extend_from_slice(&d.tokens[keep..accepted]);
    r.pending.push(bonus);
    r.pending_hidden
        .extend_from_slice(&verify_hidden[keep * dm..(accepted + 1) * dm]);
    r.bonus = bonus;
}

/// The engine's depth model, also after a panic elsewhere (it holds only estimates).
pub(crate) fn lock(m: &Mutex<DepthModel>) -> std::sync::MutexGuard<'_, DepthModel> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What [`Round::finish`] did: the drafts accepted, the round's new tokens (the accepted
/// drafts and the target's own token, which a completed grammar leaves out) and the
/// milliseconds of its steps.
pub(crate) struct Finished {
    pub(crate) accepted: usize,
    pub(crate) new: Vec<u32>,
    /// The acceptance walk (counted as verifying).
    pub(crate) verify_ms: f64,
    pub(crate) rollback_ms: f64,
    /// The drafter's update (counted as drafting).
    pub(crate) draft_ms: f64,
}

impl Finished {
    /// Adds the round to the draft statistics and its times to `t`.
    pub(crate) fn record(&self, drafted: usize, stats: &mut DraftStats, t: &mut SpecTimings) {
        stats.record_round(drafted, self.accepted);
        t.draft_ms += self.draft_ms;
        t.verify_ms += self.verify_ms;
        t.rollback_ms += self.rollback_ms;
    }
}

impl Round {
    /// The round state after a prompt (see [`crate::prefill::PromptFill::into_round`]): the
    /// caches, the first token `bonus` (not yet emitted) and the drafter's hidden row after
    /// `(bonus, hidden[len - 1])`, from which its first proposal is picked here.
    pub(crate) fn start(
        model: &Qwen35Model,
        s: &mut Sampler,
        (cache, mcache): (SeqCache, MtpCache),
        bonus: u32,
        head_hidden: Vec<f32>,
    ) -> Result<Round> {
        let (seed, seed_q) = draft_pick(s, &model.logits(&head_hidden, 1)?, 1)?;
        Ok(Round {
            cache,
            mcache,
            bonus,
            seed,
            seed_q,
            seed_hidden: head_hidden,
            appended: 0,
            fed: Vec::new(),
            last_hidden: Vec::new(),
            pending: Vec::new(),
            pending_hidden: Vec::new(),
        })
    }
}

impl Round {
    /// Steps 3 to 5 of a round whose verify ran (alone or batched with other sequences'):
    /// accept, roll back, update the drafter; `logits` and `hidden` are the verify's rows,
    /// `pos` the output position of the round's first new token.
    pub(crate) fn finish(
        &mut self,
        model: &Qwen35Model,
        d: &Drafts,
        logits: &[f32],
        hidden: &[f32],
        s: &mut Sampler,
        pos: usize,
    ) -> Result<Finished> {
        let dm = model.hidden_size();
        let t2 = Instant::now();
        let (accepted, new) = accept(logits, model.vocab_size(), d, s, pos)?;
        let t3 = Instant::now();
        rollback(self, accepted);
        self.fed.push(self.bonus);
        self.fed.extend_from_slice(&new[..accepted]);
        self.last_hidden = hidden[accepted * dm..(accepted + 1) * dm].to_vec();
        let t4 = Instant::now();
        update_drafter(dm, self, d, accepted, &new, hidden);
        let t5 = Instant::now();
        Ok(Finished {
            accepted,
            new,
            verify_ms: (t3 - t2).as_secs_f64() * 1e3,
            rollback_ms: (t4 - t3).as_secs_f64() * 1e3,
            draft_ms: (t5 - t4).as_secs_f64() * 1e3,
        })
    }
}

/// The state after the last fed token, for a prefix cache: only when the fed tokens are a
/// prefix of what was emitted (a stop token or the budget can cut a round's accepted tokens,
/// and a state must never cover tokens the caller did not receive).
pub(crate) fn end_state(
    model: &Qwen35Model,
    head: &MtpHead,
    mut r: Round,
    prompt_len: usize,
    emitted: &[u32],
) -> Result<Option<PromptState>> {
    if r.fed.is_empty() || !emitted.starts_with(&r.fed) {
        return Ok(None);
    }
    // The drafter takes the pending pairs but the last, which pairs the next (unfed) token
    // with the last hidden state: a resumed call adds that pair itself.
    match r.pending.len() {
        0 => r.mcache.trim(1),
        1 => {}
        n => {
            let dm = model.hidden_size();
            head.forward(
                model,
                &r.pending[..n - 1],
                &r.pending_hidden[..(n - 1) * dm],
                &mut r.mcache,
            )?;
        }
    }
    Ok(Some(PromptState {
        cache: r.cache,
        mcache: Some(r.mcache),
        last_hidden: r.last_hidden,
        tokens: prompt_len + r.fed.len(),
    }))
}
