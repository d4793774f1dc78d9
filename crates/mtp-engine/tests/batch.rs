//! Continuous batching gives every sequence exactly the tokens it gets alone: at batch sizes 1
//! to 8, target-only and MTP sequences mixed, depths mixed, greedy and seeded sampling,
//! sequences joining mid-run, on dense, MoE and MLX-quantized checkpoints (with embedded and
//! companion heads) and with both verify modes. Solo decoding is itself checked against
//! mlx-vlm's goldens (`parity.rs`) and against target-only greedy (`speculative.rs`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use candle_core::{DType, Device};
use mtp_engine::batch::Batch;
use mtp_engine::cache::VerifyMode;
use mtp_engine::scheduler::{BatchEvent, Scheduler, SchedulerConfig};
use mtp_engine::{Engine, FinishReason, GenerateOptions, GenerationOutput, PromptState, Sampling};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name)
}

fn load(name: &str, drafter: Option<&str>) -> Engine {
    let d = drafter.map(fixture);
    Engine::load_with_drafter(&fixture(name), d.as_deref(), &Device::Cpu, DType::F32).expect("load")
}

fn prompt(i: usize) -> Vec<u32> {
    let texts = [
        "the quick brown fox ",
        "fn main() { println!(\"hi\"); }",
        "a",
        "Hello, world! 12345",
        "vro tvc sbircuj lihugo vaqcake ",
    ];
    let mut p: Vec<u32> = texts[i % texts.len()].bytes().map(u32::from).collect();
    // distinct prompts beyond the first five
    p.extend((0..i / texts.len()).map(|j| 97 + (j as u32 * 7 + i as u32) % 26));
    p
}

/// Sequence `i`'s options: depths 0 (target-only), 1, 2, 3, 5 in turn; every third seeded
/// sampling; budgets of different lengths so sequences leave at different steps.
fn opts(i: usize) -> GenerateOptions {
    let depth = [0, 1, 2, 3, 5][i % 5];
    let mut o = GenerateOptions::greedy(12 + 5 * (i % 4)).ignore_eos(true);
    if depth > 0 {
        o = o.num_draft_tokens(depth);
    }
    if i % 3 == 2 {
        o = o.sampling(Sampling {
            temperature: Some(0.8),
            seed: Some(7 + i as u64),
            ..Default::default()
        });
    }
    o
}

fn solo(engine: &Engine, i: usize) -> GenerationOutput {
    engine.generate(&prompt(i), &opts(i), |_| true).unwrap()
}

/// Runs sequences `0..n` in one batch; the second half joins after `late` steps.
fn batched_with(
    mut batch: Batch<'_>,
    n: usize,
    late: usize,
) -> BTreeMap<u64, (Vec<u32>, GenerationOutput)> {
    let mut streamed: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
    let mut outs = BTreeMap::new();
    let mut on = |id: u64, t: &[u32]| {
        streamed.entry(id).or_default().extend_from_slice(t);
        true
    };
    let first = n.div_ceil(2);
    for i in 0..first {
        batch.join(i as u64, &prompt(i), &opts(i));
    }
    let mut steps = 0;
    let mut joined = first;
    while batch.active() > 0 || joined < n {
        if steps == late {
            for i in joined..n {
                batch.join(i as u64, &prompt(i), &opts(i));
            }
            joined = n;
        }
        batch.step(&mut on);
        steps += 1;
        for (id, out) in batch.take_finished() {
            outs.insert(id, out.unwrap());
        }
        assert!(steps < 1000, "the batch does not end");
    }
    for (id, out) in batch.take_finished() {
        outs.insert(id, out.unwrap());
    }
    outs.into_iter()
        .map(|(id, o)| (id, (streamed.remove(&id).unwrap_or_default(), o)))
        .collect()
}

fn check(engine: &Engine, what: &str) {
    check_with(engine, what, None)
}

/// With `chunk`, prompts longer than it are computed that many tokens per step.
fn check_with(engine: &Engine, what: &str, chunk: Option<usize>) {
    let solos: Vec<GenerationOutput> = (0..8).map(|i| solo(engine, i)).collect();
    for n in [1, 2, 3, 5, 8] {
        for late in [0, 3] {
            let batch = match chunk {
                Some(c) => Batch::new(engine).with_prefill_chunk(c),
                None => Batch::new(engine),
            };
            let got = batched_with(batch, n, late);
            assert_eq!(got.len(), n, "{what}: every sequence ends");
            for (id, (streamed, out)) in got {
                let s = &solos[id as usize];
                let tag = format!("{what}: sequence {id} of {n} (late {late})");
                assert_eq!(out.tokens, s.tokens, "{tag}: tokens");
                assert_eq!(streamed, s.tokens, "{tag}: streamed tokens");
                assert_eq!(out.finish_reason, s.finish_reason, "{tag}");
                let (a, b) = (out.speculation.as_ref(), s.speculation.as_ref());
                assert_eq!(a.map(|x| x.used), b.map(|x| x.used), "{tag}: used");
                assert_eq!(
                    a.map(|x| (x.stats.drafted, x.stats.accepted, x.stats.rounds)),
                    b.map(|x| (x.stats.drafted, x.stats.accepted, x.stats.rounds)),
                    "{tag}: draft statistics"
                );
            }
        }
    }
}

#[test]
fn batched_equals_solo_on_a_trained_dense_model_with_its_head() {
    for mode in [VerifyMode::Backup, VerifyMode::Deferred] {
        let mut e = load("tiny-trained", None);
        e.set_verify_mode(mode);
        check(&e, &format!("tiny-trained ({mode:?})"));
    }
}

/// One forward over many sequences (80 rows: more than one few-row product takes, which
/// would switch to `fgemm` and other bits) gives every sequence the bits it gets alone, for
/// f32, bf16 and MLX 4-bit matrices.
#[test]
fn a_forward_over_many_sequences_gives_each_its_solo_bits() {
    for (name, dtype) in [
        ("tiny-trained", DType::F32),
        ("tiny-trained", DType::BF16),
        ("tiny-mlx4", DType::F32),
    ] {
        let e = Engine::load(&fixture(name), &Device::Cpu, dtype).unwrap();
        let m = e.model();
        let n = 40;
        let rows: Vec<Vec<u32>> = (0..n).map(|i| vec![97 + (i % 26) as u32, 98]).collect();
        let mut caches: Vec<_> = (0..n).map(|_| m.new_cache()).collect();
        let all = m
            .forward(&rows, &mut caches, mtp_engine::LogitsAt::All)
            .unwrap();
        let v = m.vocab_size();
        for (i, row) in rows.iter().enumerate() {
            let mut c = [m.new_cache()];
            let one = m
                .forward(std::slice::from_ref(row), &mut c, mtp_engine::LogitsAt::All)
                .unwrap();
            assert!(
                one.logits[..] == all.logits[i * 2 * v..(i + 1) * 2 * v],
                "{name} {dtype:?}: sequence {i}"
            );
        }
    }
}

/// The MTP head over several sequences at once (batched drafting) gives each the bits it gets
/// alone: catch-ups of different lengths (45 rows in all) and then one row each.
#[test]
fn the_head_over_many_sequences_gives_each_its_solo_bits() {
    for (name, drafter) in [("tiny-trained", None), ("tiny-mlx4", Some("tiny-mlx4-mtp"))] {
        let e = load(name, drafter);
        let (m, head) = (e.model(), e.drafter().expect("a head"));
        let d = m.hidden_size();
        let lens = [1usize, 7, 2, 12, 1, 9, 5, 8];
        let toks: Vec<Vec<u32>> = lens
            .iter()
            .enumerate()
            .map(|(i, &l)| (0..l).map(|j| 97 + ((i * 5 + j) % 26) as u32).collect())
            .collect();
        let hid: Vec<Vec<f32>> = lens
            .iter()
            .enumerate()
            .map(|(i, &l)| {
                (0..l * d)
                    .map(|j| (((i * 31 + j * 7) % 97) as f32 / 48.0) - 1.0)
                    .collect()
            })
            .collect();
        for round in 0..2 {
            // round 0: the catch-ups; round 1: one more token each on the caches they left
            let rows: Vec<(&[u32], &[f32])> = toks
                .iter()
                .zip(&hid)
                .map(|(t, h)| {
                    if round == 0 {
                        (t.as_slice(), h.as_slice())
                    } else {
                        (&t[..1], &h[..d])
                    }
                })
                .collect();
            let mut alone: Vec<_> = (0..lens.len()).map(|_| head.new_cache()).collect();
            let mut together: Vec<_> = (0..lens.len()).map(|_| head.new_cache()).collect();
            if round == 1 {
                for (i, (t, h)) in toks.iter().zip(&hid).enumerate() {
                    head.forward(m, t, h, &mut alone[i]).unwrap();
                    head.forward(m, t, h, &mut together[i]).unwrap();
                }
            }
            let want: Vec<Vec<f32>> = rows
                .iter()
                .zip(alone.iter_mut())
                .map(|((t, h), c)| head.forward(m, t, h, c).unwrap())
                .collect();
            let mut refs: Vec<&mut _> = together.iter_mut().collect();
            let got = head.forward_ragged(m, &rows, &mut refs).unwrap();
            assert!(got == want, "{name}, round {round}");
        }
    }
}

/// More rows in a step than the few-row product takes at once (14 sequences at depth 3: 56
/// rows; the kernels' limit is 32): each sequence still gets its solo tokens and draft counts.
#[test]
fn a_step_of_more_rows_than_one_product_takes_equals_solo() {
    let e = load("tiny-trained", None);
    let o = |i: usize| {
        let mut o = GenerateOptions::greedy(10 + i % 3)
            .ignore_eos(true)
            .num_draft_tokens(3);
        if i % 4 == 1 {
            o = o.sampling(Sampling {
                temperature: Some(0.9),
                seed: Some(3 + i as u64),
                ..Default::default()
            });
        }
        o
    };
    let n = 14;
    let solos: Vec<GenerationOutput> = (0..n)
        .map(|i| e.generate(&prompt(i), &o(i), |_| true).unwrap())
        .collect();
    let mut batch = Batch::new(&e);
    let mut on = |_: u64, _: &[u32]| true;
    for i in 0..n {
        batch.join(i as u64, &prompt(i), &o(i));
    }
    let mut outs = BTreeMap::new();
    while batch.active() > 0 {
        batch.step(&mut on);
    }
    for (id, out) in batch.take_finished() {
        outs.insert(id, out.unwrap());
    }
    assert_eq!(outs.len(), n);
    for (id, out) in outs {
        let s = &solos[id as usize];
        assert_eq!(out.tokens, s.tokens, "sequence {id}: tokens");
        let (a, b) = (out.speculation.unwrap(), s.speculation.clone().unwrap());
        assert_eq!(
            (a.stats.drafted, a.stats.accepted, a.stats.rounds),
            (b.stats.drafted, b.stats.accepted, b.stats.rounds),
            "sequence {id}: draft statistics"
        );
    }
}

/// Prompts computed a chunk per step (1, 4 and 7 tokens: every prompt here is longer than a
/// chunk) give each sequence its solo tokens and draft counts, joining early or late.
#[test]
fn chunked_prefill_gives_the_solo_tokens() {
    let e = load("tiny-trained", None);
    for c in [1, 4, 7] {
        check_with(&e, &format!("tiny-trained, chunk {c}"), Some(c));
    }
    check_with(
        &load("tiny-mlx4", Some("tiny-mlx4-mtp")),
        "tiny-mlx4 + drafter, chunk 5",
        Some(5),
    );
}

/// A long prompt joining a batch does not hold the others up: they get a token each step
/// while it fills.
#[test]
fn a_long_prompt_fills_while_the_others_decode() {
    let e = load("tiny-trained", None);
    let mut batch = Batch::new(&e).with_prefill_chunk(8);
    let got: std::cell::RefCell<BTreeMap<u64, Vec<u32>>> = Default::default();
    let mut on = |id: u64, t: &[u32]| {
        got.borrow_mut().entry(id).or_default().extend_from_slice(t);
        true
    };
    let count = |id: u64| got.borrow().get(&id).map_or(0, Vec::len);
    // a prompt of one token: it decodes from the first step
    batch.join(0, &prompt(2), &GenerateOptions::greedy(64).ignore_eos(true));
    let long: Vec<u32> = (0..80).map(|i| 97 + (i % 26)).collect();
    let opts = GenerateOptions::greedy(4)
        .ignore_eos(true)
        .num_draft_tokens(2);
    batch.join(1, &long, &opts);
    // 80 tokens at 8 per step: sequence 1 fills for 10 steps, its first token in the 10th
    for _ in 0..9 {
        batch.step(&mut on);
    }
    assert_eq!(count(0), 9, "one token per step for the other");
    assert_eq!(count(1), 0, "still filling");
    batch.step(&mut on);
    assert!(count(1) > 0, "first token after the last chunk");
    while batch.active() > 0 {
        batch.step(&mut on);
    }
    let solo = e.generate(&long, &opts, |_| true).unwrap();
    assert_eq!(got.borrow()[&1], solo.tokens);
}

#[test]
fn batched_equals_solo_on_moe_and_quantized_with_a_companion_drafter() {
    check(&load("tiny-moe", None), "tiny-moe");
    check(
        &load("tiny-mlx4", Some("tiny-mlx4-mtp")),
        "tiny-mlx4 + drafter",
    );
}

#[test]
fn a_bad_sequence_fails_alone_and_cancel_ends_one() {
    let e = load("tiny-trained", None);
    let mut batch = Batch::new(&e);
    let mut on = |_: u64, _: &[u32]| true;
    batch.join(0, &prompt(1), &opts(1));
    batch.join(1, &[1_000_000], &opts(0)); // outside the vocabulary
    batch.join(2, &prompt(3), &opts(3));
    let bad = batch.take_finished();
    assert_eq!(bad.len(), 1);
    assert_eq!(bad[0].0, 1);
    assert!(bad[0].1.as_ref().is_err());
    batch.step(&mut on);
    batch.cancel(2);
    let c = batch.take_finished();
    assert_eq!(c.len(), 1);
    assert_eq!(
        c[0].1.as_ref().unwrap().finish_reason,
        FinishReason::Cancelled
    );
    while batch.active() > 0 {
        batch.step(&mut on);
    }
    let done = batch.take_finished();
    assert_eq!(done[0].1.as_ref().unwrap().tokens, solo(&e, 1).tokens);
}

#[test]
fn the_scheduler_serves_threads_and_a_dropped_receiver_cancels() {
    let e = Arc::new(load("tiny-trained", None));
    let sched = Arc::new(Scheduler::spawn(Arc::clone(&e), SchedulerConfig::new(3)));
    let handles: Vec<_> = (0..6)
        .map(|i| {
            let sched = Arc::clone(&sched);
            std::thread::spawn(move || {
                let rx = sched.submit(prompt(i), opts(i)).unwrap();
                let mut streamed = Vec::new();
                loop {
                    match rx.recv().unwrap() {
                        BatchEvent::Tokens(t) => streamed.extend(t),
                        BatchEvent::Done(out) => return (i, streamed, (*out).unwrap()),
                    }
                }
            })
        })
        .collect();
    // one request whose caller goes away at once
    drop(sched.submit(prompt(7), GenerateOptions::greedy(500).ignore_eos(true)));
    for h in handles {
        let (i, streamed, out) = h.join().unwrap();
        let s = solo(&e, i);
        assert_eq!(out.tokens, s.tokens, "sequence {i}");
        assert_eq!(streamed, s.tokens, "sequence {i} streamed");
    }
}

/// Sequence `i`'s caller stops it once it has received this many tokens (before its budget),
/// or never.
fn stop_after(i: usize) -> Option<usize> {
    [None, Some(1), Some(3), None, Some(5), Some(2)][i % 6]
}

/// [`opts`] that also keep the state after half the prompt (a chat's history) for every other
/// sequence.
fn opts_kept(i: usize) -> GenerateOptions {
    let mut o = opts(i);
    if i % 2 == 1 {
        o.checkpoint_at = Some(prompt(i).len() / 2).filter(|&h| h > 0);
    }
    o
}

/// A caller that stops after `stop` tokens (see [`stop_after`]): whether it goes on after
/// receiving `t`.
fn caller(got: &mut Vec<u32>, stop: Option<usize>, t: &[u32]) -> bool {
    got.extend_from_slice(t);
    stop.is_none_or(|n| got.len() < n)
}

/// [`opts_kept`] with checkpoints on, resuming from `resume` when given.
fn opts_resumed(i: usize, resume: Option<Arc<PromptState>>) -> GenerateOptions {
    let o = opts_kept(i).checkpoint(true);
    match resume {
        Some(r) => o.resume_from(r),
        None => o,
    }
}

/// What [`Engine::generate`] gives sequence `i` alone, with checkpoints and its caller
/// stopping it at [`stop_after`].
fn solo_kept(
    engine: &Engine,
    i: usize,
    resume: Option<Arc<PromptState>>,
    p: &[u32],
) -> GenerationOutput {
    let mut got = Vec::new();
    let stop = stop_after(i);
    let out = engine
        .generate(p, &opts_resumed(i, resume), |t| caller(&mut got, stop, t))
        .unwrap();
    assert_eq!(got, out.tokens, "solo {i}: streamed tokens");
    out
}

fn state_bytes(s: &Option<PromptState>) -> Option<(usize, Vec<u8>)> {
    s.as_ref().map(|s| (s.tokens(), s.to_bytes()))
}

/// A batched sequence's output, report and states are the ones it gets alone, bit for bit.
fn same_resumable(tag: &str, got: &GenerationOutput, want: &GenerationOutput) {
    let (g, w) = (got, want);
    assert_eq!(g.tokens, w.tokens, "{tag}: tokens");
    assert_eq!(g.finish_reason, w.finish_reason, "{tag}: finish");
    let (a, b) = (g.speculation.as_ref(), w.speculation.as_ref());
    assert_eq!(a.map(|x| x.used), b.map(|x| x.used), "{tag}: used");
    assert_eq!(
        a.map(|x| (x.stats.drafted, x.stats.accepted, x.stats.rounds)),
        b.map(|x| (x.stats.drafted, x.stats.accepted, x.stats.rounds)),
        "{tag}: draft statistics"
    );
    let present = |t: &mtp_engine::Timings| {
        [
            t.prefill_ms.is_some(),
            t.prefill_tokens_per_s.is_some(),
            t.time_to_first_token_ms.is_some(),
            t.decode_ms.is_some(),
            t.draft_ms.is_some(),
            t.verify_ms.is_some(),
            t.rollback_ms.is_some(),
        ]
    };
    assert_eq!(present(&g.timings), present(&w.timings), "{tag}: timings");
    assert!(g.timings.prefill_ms.is_some(), "{tag}: prefill timing");
    assert_eq!(
        got.computed_prompt_tokens, want.computed_prompt_tokens,
        "{tag}: computed prompt tokens"
    );
    for (what, a, b) in [
        (
            "prompt",
            &got.states.after_prompt,
            &want.states.after_prompt,
        ),
        (
            "history",
            &got.states.after_history,
            &want.states.after_history,
        ),
        ("final", &got.states.after_reply, &want.states.after_reply),
    ] {
        assert_eq!(state_bytes(a), state_bytes(b), "{tag}: {what} state");
    }
}

/// Sequences with checkpoints (as a prefix-cache key asks for), some stopped early by their
/// caller, in one batch (whole prompts, then a prefill chunk of 4): each gets the output, the
/// draft statistics, the timings and the states (bit for bit) it gets alone, and so does the
/// next turn resumed from them.
#[test]
fn checkpointed_and_caller_stopped_sequences_equal_solo() {
    for (name, drafter) in [("tiny-trained", None), ("tiny-mlx4", Some("tiny-mlx4-mtp"))] {
        let e = load(name, drafter);
        let n = 8;
        let solos: Vec<GenerationOutput> =
            (0..n).map(|i| solo_kept(&e, i, None, &prompt(i))).collect();
        assert!(
            solos
                .iter()
                .any(|s| s.finish_reason == FinishReason::Cancelled),
            "some callers stop"
        );
        assert!(solos.iter().all(|s| s.states.after_prompt.is_some()));
        // the next turn: the prompt, the reply and more, from the state after the reply (or
        // after the prompt when nothing was fed)
        let next: Vec<Vec<u32>> = (0..n)
            .map(|i| {
                let mut p = prompt(i);
                p.extend_from_slice(&solos[i].tokens);
                p.extend(b" and then ".iter().map(|&b| u32::from(b)));
                p
            })
            .collect();
        let resume = |i: usize| {
            let kept = &solos[i].states;
            let state = kept.after_reply.as_ref().or(kept.after_prompt.as_ref());
            state.cloned().map(Arc::new)
        };
        let solos2: Vec<GenerationOutput> = (0..n)
            .map(|i| solo_kept(&e, i, resume(i), &next[i]))
            .collect();
        for chunk in [None, Some(4)] {
            for turn in [0, 1] {
                let mut batch = match chunk {
                    Some(c) => Batch::new(&e).with_prefill_chunk(c),
                    None => Batch::new(&e),
                };
                let got: std::cell::RefCell<BTreeMap<u64, Vec<u32>>> = Default::default();
                let mut on = |id: u64, t: &[u32]| {
                    caller(
                        got.borrow_mut().entry(id).or_default(),
                        stop_after(id as usize),
                        t,
                    )
                };
                for (i, later) in next.iter().enumerate() {
                    let (p, r) = match turn {
                        0 => (prompt(i), None),
                        _ => (later.clone(), resume(i)),
                    };
                    batch.join(i as u64, &p, &opts_resumed(i, r));
                }
                let mut outs = BTreeMap::new();
                let mut steps = 0;
                while batch.active() > 0 {
                    batch.step(&mut on);
                    steps += 1;
                    assert!(steps < 1000, "the batch does not end");
                }
                for (id, out) in batch.take_finished() {
                    outs.insert(id, out.unwrap());
                }
                assert_eq!(outs.len(), n);
                for (id, out) in outs {
                    let i = id as usize;
                    let want = if turn == 0 { &solos[i] } else { &solos2[i] };
                    let tag = format!("{name}: sequence {i}, turn {turn}, chunk {chunk:?}");
                    same_resumable(&tag, &out, want);
                    assert_eq!(got.borrow()[&id], want.tokens, "{tag}: streamed");
                }
            }
        }
    }
}

/// Requests from several threads whose callers answer each chunk (`submit_paced`, as the
/// native provider's batched calls do), some stopping early as a stop string does: each ends
/// with the output, draft statistics, timings and states (bit for bit) it gets alone with a
/// callback giving the same answers. A request dropped before its end is cancelled.
#[test]
fn paced_requests_stopped_by_their_callers_equal_solo() {
    let e = Arc::new(load("tiny-trained", None));
    let n = 8;
    let solos: Vec<GenerationOutput> = (0..n).map(|i| solo_kept(&e, i, None, &prompt(i))).collect();
    for chunk in [mtp_engine::batch::DEFAULT_PREFILL_CHUNK, 4] {
        let config = SchedulerConfig::new(3).prefill_chunk(chunk);
        let sched = Arc::new(Scheduler::spawn(Arc::clone(&e), config));
        // a request whose caller goes away at once, and one that goes after its first chunk
        drop(sched.submit_paced(prompt(5), opts_resumed(5, None)));
        let gone = sched
            .submit_paced(
                prompt(6),
                GenerateOptions::greedy(500)
                    .ignore_eos(true)
                    .checkpoint(true),
            )
            .unwrap();
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let sched = Arc::clone(&sched);
                std::thread::spawn(move || {
                    let req = sched
                        .submit_paced(prompt(i), opts_resumed(i, None))
                        .unwrap();
                    let mut streamed = Vec::new();
                    loop {
                        match req.recv().unwrap() {
                            BatchEvent::Tokens(t) => {
                                req.answer(caller(&mut streamed, stop_after(i), &t))
                            }
                            BatchEvent::Done(out) => return (i, streamed, (*out).unwrap()),
                        }
                    }
                })
            })
            .collect();
        assert!(matches!(gone.recv().unwrap(), BatchEvent::Tokens(_)));
        drop(gone);
        for h in handles {
            let (i, streamed, out) = h.join().unwrap();
            let tag = format!("paced sequence {i}, chunk {chunk}");
            same_resumable(&tag, &out, &solos[i]);
            assert_eq!(streamed, solos[i].tokens, "{tag}: streamed");
        }
    }
}

/// Requests with the same prompt queued together (a request's `n` choices) compute it once:
/// the first keeps the state before its last token and the others resume from it, computing
/// one token each; every output is the one each gets alone (target-only and speculating,
/// greedy and seeded), and the lender's output carries no states it did not ask for.
#[test]
fn queued_requests_with_one_prompt_compute_it_once() {
    let e = Arc::new(load("tiny-trained", None));
    let shared: Vec<u32> = "the quick brown fox jumps over the lazy dog "
        .bytes()
        .map(u32::from)
        .collect();
    let choice = |j: usize| {
        let base = GenerateOptions::greedy(12).ignore_eos(true);
        match j {
            0 => base,
            1 => base.num_draft_tokens(3),
            _ => base.sampling(Sampling {
                temperature: Some(0.9),
                seed: Some(j as u64),
                ..Sampling::default()
            }),
        }
    };
    let solos: Vec<_> = (0..4)
        .map(|j| e.generate(&shared, &choice(j), |_| true).unwrap())
        .collect();
    let mut shared_once = false;
    for _attempt in 0..4 {
        let config = SchedulerConfig::new(5).prefill_chunk(8);
        let sched = Scheduler::spawn(Arc::clone(&e), config);
        // a long prompt keeps the scheduler busy, so the next ones queue together
        let blocker = sched
            .submit(prompt(1).repeat(20), GenerateOptions::greedy(4))
            .unwrap();
        let rxs: Vec<_> = (0..4)
            .map(|j| sched.submit(shared.clone(), choice(j)).unwrap())
            .collect();
        let outs: Vec<GenerationOutput> = rxs
            .into_iter()
            .map(|rx| loop {
                if let BatchEvent::Done(out) = rx.recv().unwrap() {
                    break (*out).unwrap();
                }
            })
            .collect();
        drop(blocker);
        for (j, (out, solo)) in outs.iter().zip(&solos).enumerate() {
            assert_eq!(out.tokens, solo.tokens, "choice {j}");
            assert!(out.states.after_history.is_none() && out.states.after_prompt.is_none());
        }
        let computed: Vec<usize> = outs.iter().map(|o| o.computed_prompt_tokens).collect();
        // the target-only lender's state serves the other target-only choices (a speculating
        // one needs the drafter's cache in it, so it computes its own)
        if computed == [shared.len(), shared.len(), 1, 1] {
            shared_once = true;
            break;
        }
    }
    assert!(shared_once, "the queued choices never shared their prompt");
}
