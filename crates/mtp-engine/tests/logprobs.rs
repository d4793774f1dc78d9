//! Log probabilities of generated and prompt tokens: equal with MTP on and off (the verify rows
//! are the target's), in a batch and alone, streamed as they are emitted, and equal to an
//! independent computation: the log-softmax (in f64, here) of the last-position logits of a
//! forward over the prompt and the tokens before each one, through the public API.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use candle_core::{DType, Device};
use mtp_engine::batch::Batch;
use mtp_engine::{Engine, GenerateOptions, LogprobSink, Sampling, TokenLogprob};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name)
}

fn load(name: &str, drafter: Option<&str>) -> Engine {
    let d = drafter.map(fixture);
    Engine::load_with_drafter(&fixture(name), d.as_deref(), &Device::Cpu, DType::F32).expect("load")
}

fn prompt(s: &str) -> Vec<u32> {
    s.bytes().map(u32::from).collect()
}

/// The log-softmax of `row` in f64.
fn log_softmax(row: &[f32]) -> Vec<f64> {
    let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let z: f64 = row.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln() + m;
    row.iter().map(|&x| x as f64 - z).collect()
}

/// Checks `lps` (of `tokens`, generated after `prompt`) against the reference, and their
/// alternatives' order.
fn check_against_reference(engine: &Engine, prompt: &[u32], tokens: &[u32], lps: &[TokenLogprob]) {
    assert_eq!(lps.len(), tokens.len(), "one log probability per token");
    let mut ids = prompt.to_vec();
    for (i, (t, lp)) in tokens.iter().zip(lps).enumerate() {
        assert_eq!(lp.id, *t, "token {i}");
        let reference = log_softmax(&engine.prompt_logits(&ids).unwrap());
        let want = reference[*t as usize];
        assert!(
            (lp.logprob as f64 - want).abs() < 2e-4,
            "token {i}: {} vs reference {want}",
            lp.logprob
        );
        // the alternatives: the reference's most likely, in order, with their values
        let mut order: Vec<usize> = (0..reference.len()).collect();
        order.sort_by(|&a, &b| reference[b].total_cmp(&reference[a]).then(a.cmp(&b)));
        for (j, (id, v)) in lp.top.iter().enumerate() {
            assert!(
                (reference[*id as usize] - *v as f64).abs() < 2e-4,
                "token {i}, alternative {j}"
            );
            // (ids may swap only where the reference's values tie within rounding)
            let r = order[j];
            assert!(
                *id as usize == r || (reference[r] - *v as f64).abs() < 2e-4,
                "token {i}, alternative {j}: {id} vs reference {r}"
            );
        }
        ids.push(*t);
    }
}

#[test]
fn greedy_logprobs_equal_with_mtp_on_and_off_and_the_reference() {
    for (name, drafter) in [("tiny-trained", None), ("tiny-mlx4", Some("tiny-mlx4-mtp"))] {
        let engine = load(name, drafter);
        for text in ["the quick brown fox ", "Hello, world! 12345", "a"] {
            let p = prompt(text);
            let opts = GenerateOptions::greedy(24).ignore_eos(true).logprobs(5);
            let base = engine.generate(&p, &opts, |_| true).unwrap();
            assert_eq!(base.logprobs.len(), base.tokens.len());
            for lp in &base.logprobs {
                // greedy picks the most likely token
                assert_eq!(lp.top[0].0, lp.id, "{name}");
                assert_eq!(lp.top[0].1, lp.logprob, "{name}");
                assert_eq!(lp.top.len(), 5);
                assert!(lp.top.windows(2).all(|w| w[0].1 >= w[1].1));
            }
            check_against_reference(&engine, &p, &base.tokens, &base.logprobs);
            for depth in [1, 2, 4] {
                let spec = engine
                    .generate(&p, &opts.clone().num_draft_tokens(depth), |_| true)
                    .unwrap();
                assert!(spec.speculation.as_ref().is_some_and(|s| s.used));
                assert_eq!(spec.tokens, base.tokens, "{name} depth {depth}");
                assert_eq!(
                    spec.logprobs, base.logprobs,
                    "{name} depth {depth}: log probabilities with MTP on equal those with it off"
                );
            }
        }
    }
}

#[test]
fn sampled_logprobs_are_the_models_not_the_samplers() {
    let engine = load("tiny-trained", None);
    let p = prompt("dyl aaza utpto ");
    let sampling = Sampling {
        temperature: Some(0.8),
        top_k: Some(5),
        seed: Some(7),
        ..Sampling::default()
    };
    let opts = GenerateOptions::greedy(20)
        .ignore_eos(true)
        .sampling(sampling)
        .logprobs(3);
    let base = engine.generate(&p, &opts, |_| true).unwrap();
    // before temperature and top-k: the reference's raw distribution
    check_against_reference(&engine, &p, &base.tokens, &base.logprobs);
    let spec = engine
        .generate(&p, &opts.clone().num_draft_tokens(3), |_| true)
        .unwrap();
    assert_eq!(spec.tokens, base.tokens);
    assert_eq!(spec.logprobs, base.logprobs);
    // none asked for, none computed
    let plain = engine
        .generate(&p, &GenerateOptions::greedy(4), |_| true)
        .unwrap();
    assert!(plain.logprobs.is_empty());
}

#[test]
fn streamed_chunks_carry_their_logprobs_in_a_batch_as_alone() {
    let engine = load("tiny-trained", None);
    let texts = ["the quick brown fox ", "vro tvc sbircuj ", "fn main() {"];
    let opts = |depth: usize, sink: Option<LogprobSink>| {
        let mut o = GenerateOptions::greedy(16)
            .ignore_eos(true)
            .logprobs(2)
            .num_draft_tokens(depth);
        o.on_logprobs = sink;
        o
    };
    let solos: Vec<_> = texts
        .iter()
        .map(|t| {
            engine
                .generate(&prompt(t), &opts(0, None), |_| true)
                .unwrap()
        })
        .collect();
    for depth in [0, 3] {
        let sunk: Arc<Mutex<Vec<Vec<TokenLogprob>>>> =
            Arc::new(Mutex::new(vec![Vec::new(); texts.len()]));
        let mut batch = Batch::new(&engine);
        let chunks: Arc<Mutex<Vec<usize>>> = Arc::new(Mutex::new(Vec::new()));
        for (i, t) in texts.iter().enumerate() {
            let s = Arc::clone(&sunk);
            let c = Arc::clone(&chunks);
            let sink = LogprobSink::new(move |lps| {
                s.lock().unwrap()[i].extend_from_slice(lps);
                c.lock().unwrap().push(lps.len());
            });
            batch.join(i as u64, &prompt(t), &opts(depth, Some(sink)));
        }
        let sizes = Arc::clone(&chunks);
        let mut on = |_: u64, t: &[u32]| {
            // the sink was told this chunk's log probabilities just before
            assert_eq!(sizes.lock().unwrap().last().copied(), Some(t.len()));
            true
        };
        while batch.active() > 0 {
            batch.step(&mut on);
        }
        for (id, out) in batch.take_finished() {
            let out = out.unwrap();
            let solo = &solos[id as usize];
            assert_eq!(out.tokens, solo.tokens, "depth {depth}, sequence {id}");
            assert_eq!(out.logprobs, solo.logprobs, "depth {depth}, sequence {id}");
            assert_eq!(sunk.lock().unwrap()[id as usize], solo.logprobs);
        }
    }
}

#[test]
fn prompt_logprobs_match_the_reference_and_refuse_too_many_alternatives() {
    let engine = load("tiny-hf", None);
    // long enough for several blocks of rows
    let p: Vec<u32> = prompt("the quick brown fox jumps over the lazy dog, then sleeps: 12345");
    let lps = engine
        .prompt_logprobs(&p, 4, &GenerateOptions::default())
        .unwrap();
    assert_eq!(lps.len(), p.len());
    assert!(lps[0].is_none(), "nothing comes before the first token");
    let got: Vec<TokenLogprob> = lps[1..].iter().map(|l| l.clone().unwrap()).collect();
    check_against_reference(&engine, &p[..1], &p[1..], &got);
    assert!(engine
        .prompt_logprobs(&p, 21, &GenerateOptions::default())
        .is_err());
    assert!(engine
        .generate(&p, &GenerateOptions::greedy(2).logprobs(21), |_| true)
        .is_err());
}
