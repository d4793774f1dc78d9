//! A request's cancellation (`GenerateOptions::cancel`, the contract's token) ends its
//! sequence at the next step: between the parts of a long prompt, and between decode steps,
//! solo or in a batch, without touching the other sequences of the batch.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use candle_core::{DType, Device};
use mtp_contract::{Cancel, FinishReason};
use mtp_engine::batch::Batch;
use mtp_engine::{Engine, GenerateOptions};

fn load() -> Engine {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny-trained");
    Engine::load(&dir, &Device::Cpu, DType::F32).expect("load")
}

/// A prompt of three parts and a bit (parts are 1,024 tokens), of byte-level ids.
fn long_prompt() -> Vec<u32> {
    "fn main() { let x = 1; }\n"
        .bytes()
        .cycle()
        .take(3300)
        .map(u32::from)
        .collect()
}

fn opts(depth: usize, n: usize) -> GenerateOptions {
    let o = GenerateOptions::greedy(n).ignore_eos(true);
    if depth > 0 {
        o.num_draft_tokens(depth)
    } else {
        o
    }
}

#[test]
fn a_cancelled_prompt_stops_after_the_part_in_progress() {
    let engine = load();
    let prompt = long_prompt();
    for depth in [0, 2] {
        let cancel = Cancel::new();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let mut o = opts(depth, 16).on_prompt_progress({
            let (cancel, seen) = (cancel.clone(), Arc::clone(&seen));
            move |p| {
                seen.lock().unwrap().push(p.processed);
                // the client goes away once the first part is in
                if p.processed >= 1024 {
                    cancel.cancel();
                }
            }
        });
        o.cancel = Some(cancel);
        let out = engine.generate(&prompt, &o, |_| true).unwrap();
        assert_eq!(out.finish_reason, FinishReason::Cancelled, "depth {depth}");
        assert!(out.tokens.is_empty(), "depth {depth}: {:?}", out.tokens);
        let seen = seen.lock().unwrap();
        let furthest = seen.iter().copied().max().unwrap_or(0);
        assert!(
            (1024..prompt.len()).contains(&furthest),
            "depth {depth}: the prompt went on to {furthest} of {} tokens",
            prompt.len()
        );
    }
}

#[test]
fn a_cancelled_reply_stops_at_the_next_step_and_an_untouched_token_changes_nothing() {
    let engine = load();
    let prompt: Vec<u32> = "fn main() {".bytes().map(u32::from).collect();
    for depth in [0, 3] {
        let whole = engine
            .generate(&prompt, &opts(depth, 40), |_| true)
            .unwrap();
        // a token nobody cancels gives the same reply
        let mut o = opts(depth, 40);
        o.cancel = Some(Cancel::new());
        let same = engine.generate(&prompt, &o, |_| true).unwrap();
        assert_eq!(same.tokens, whole.tokens, "depth {depth}");
        // cancelled after the first chunk of tokens: the next step does not run
        let cancel = Cancel::new();
        let mut o = opts(depth, 40);
        o.cancel = Some(cancel.clone());
        let mut chunks = 0;
        let out = engine
            .generate(&prompt, &o, |_| {
                chunks += 1;
                cancel.cancel();
                true
            })
            .unwrap();
        assert_eq!(out.finish_reason, FinishReason::Cancelled, "depth {depth}");
        assert_eq!(chunks, 1, "depth {depth}");
        assert!(whole.tokens.starts_with(&out.tokens), "depth {depth}");
        assert!(out.tokens.len() < whole.tokens.len(), "depth {depth}");
    }
}

#[test]
fn in_a_batch_only_the_cancelled_sequence_ends() {
    let engine = load();
    let a: Vec<u32> = "fn main() {".bytes().map(u32::from).collect();
    let b = long_prompt();
    let alone = engine.generate(&a, &opts(2, 24), |_| true).unwrap();
    let cancel = Cancel::new();
    let mut ob = opts(0, 24);
    ob.cancel = Some(cancel.clone());
    let mut batch = Batch::new(&engine).with_prefill_chunk(256);
    let mut on = |_: u64, _: &[u32]| true;
    batch.join(1, &a, &opts(2, 24));
    batch.join(2, &b, &ob);
    let mut steps = 0;
    while batch.active() > 0 {
        batch.step(&mut on);
        steps += 1;
        if steps == 3 {
            cancel.cancel();
        }
    }
    let mut done = batch.take_finished();
    done.sort_by_key(|(id, _)| *id);
    let first = done[0].1.as_ref().unwrap();
    let second = done[1].1.as_ref().unwrap();
    assert_eq!(
        first.tokens, alone.tokens,
        "the other sequence is unchanged"
    );
    assert_eq!(second.finish_reason, FinishReason::Cancelled);
    assert!(
        second.tokens.is_empty(),
        "cancelled while its prompt filled"
    );
}
