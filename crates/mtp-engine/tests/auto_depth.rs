//! `num_draft_tokens: "auto"`: the engine chooses each round's depth (0 to the ceiling) and
//! the tokens are the target's own, alone and batched, greedy, seeded and constrained, on
//! dense, MoE and MLX-quantized checkpoints; the depths it used are counted exactly; a state
//! taken after an `auto` reply resumes to the same output. (Which depth is best for given
//! costs and acceptance is checked in `depth.rs`'s unit tests against a brute-force search.)

use std::path::PathBuf;
use std::sync::Arc;

use candle_core::{DType, Device};
use mtp_engine::batch::Batch;
use mtp_engine::{Engine, GenerateOptions, GenerationOutput, ResponseFormat, Sampling};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name)
}

fn load(name: &str, drafter: Option<&str>) -> Engine {
    let d = drafter.map(fixture);
    Engine::load_with_drafter(&fixture(name), d.as_deref(), &Device::Cpu, DType::F32).expect("load")
}

const PROMPTS: [&str; 5] = [
    "the quick brown fox ",
    "fn main() { println!(\"hi\"); }",
    "a",
    "Hello, world! 12345",
    "vro tvc sbircuj lihugo vaqcake ",
];

fn ids(i: usize) -> Vec<u32> {
    PROMPTS[i % PROMPTS.len()].bytes().map(u32::from).collect()
}

fn sampling(i: usize) -> Sampling {
    if i % 2 == 1 {
        Sampling {
            temperature: Some(0.8),
            seed: Some(11 + i as u64),
            ..Default::default()
        }
    } else {
        Sampling::default()
    }
}

fn base(i: usize) -> GenerateOptions {
    GenerateOptions::greedy(40 + 7 * (i % 3))
        .ignore_eos(true)
        .sampling(sampling(i))
}

/// The statistics agree with themselves: depths counted per round add up to the rounds and
/// to the proposals, and no round passed the ceiling.
fn check_depths(out: &GenerationOutput, ceiling: usize, tag: &str) {
    let o = out.speculation.as_ref().expect("speculation outcome");
    assert!(o.used && o.auto_depth, "{tag}: auto used");
    let per = o.stats.rounds_per_depth();
    assert!(per.len() <= ceiling + 1, "{tag}: {per:?} past {ceiling}");
    assert_eq!(per.iter().sum::<u64>(), o.stats.rounds, "{tag}: {per:?}");
    let drafted: u64 = per.iter().enumerate().map(|(d, n)| d as u64 * n).sum();
    assert_eq!(drafted, o.stats.drafted, "{tag}: {per:?}");
    // every token came from a round: one of the target's own plus the accepted drafts
    assert_eq!(
        o.stats.rounds + o.stats.accepted + 1,
        out.tokens.len() as u64,
        "{tag}: rounds {} accepted {} tokens {}",
        o.stats.rounds,
        o.stats.accepted,
        out.tokens.len()
    );
}

fn solo_equals_target_only(engine: &Engine, what: &str) -> u64 {
    let mut drafted = 0;
    for i in 0..PROMPTS.len() {
        let want = engine.generate(&ids(i), &base(i), |_| true).unwrap();
        for ceiling in [1usize, 3, 8] {
            let tag = format!("{what}: prompt {i}, auto up to {ceiling}");
            let mut streamed = Vec::new();
            let got = engine
                .generate(&ids(i), &base(i).auto_depth(ceiling), |t| {
                    streamed.extend_from_slice(t);
                    true
                })
                .unwrap();
            assert_eq!(got.tokens, want.tokens, "{tag}");
            assert_eq!(streamed, want.tokens, "{tag}: streamed");
            check_depths(&got, ceiling, &tag);
            let o = got.speculation.as_ref().unwrap();
            eprintln!("{tag}: rounds per depth {:?}", o.stats.rounds_per_depth());
            drafted += got.speculation.as_ref().map_or(0, |o| o.stats.drafted);
        }
    }
    drafted
}

#[test]
fn auto_depth_gives_the_target_tokens_on_every_checkpoint_kind() {
    let trained = load("tiny-trained", None);
    let drafted = solo_equals_target_only(&trained, "tiny-trained");
    // a trained head is worth drafting with: auto must not have switched it off everywhere
    assert!(drafted > 0, "auto never drafted on the trained model");
    solo_equals_target_only(&load("tiny-moe", None), "tiny-moe");
    solo_equals_target_only(&load("tiny-mlx4", Some("tiny-mlx4-mtp")), "tiny-mlx4");
}

#[test]
fn auto_depth_in_a_batch_gives_each_sequence_its_tokens() {
    let engine = load("tiny-trained", None);
    // sequences: auto, fixed depth 2, target-only, auto with ceiling 3, ... at different budgets
    let opts = |i: usize| match i % 4 {
        0 => base(i).auto_depth(8),
        1 => base(i).num_draft_tokens(2),
        2 => base(i),
        _ => base(i).auto_depth(3),
    };
    let n = 9;
    let want: Vec<Vec<u32>> = (0..n)
        .map(|i| engine.generate(&ids(i), &base(i), |_| true).unwrap().tokens)
        .collect();
    let mut batch = Batch::new(&engine);
    let mut streamed = vec![Vec::new(); n];
    let mut on = |id: u64, t: &[u32]| {
        streamed[id as usize].extend_from_slice(t);
        true
    };
    for i in 0..n {
        batch.join(i as u64, &ids(i), &opts(i));
    }
    let mut outs = Vec::new();
    while batch.active() > 0 {
        batch.step(&mut on);
        outs.extend(batch.take_finished());
    }
    outs.extend(batch.take_finished());
    assert_eq!(outs.len(), n);
    for (id, out) in outs {
        let i = id as usize;
        let out = out.unwrap();
        assert_eq!(out.tokens, want[i], "sequence {i}");
        match i % 4 {
            0 => check_depths(&out, 8, &format!("sequence {i}")),
            3 => check_depths(&out, 3, &format!("sequence {i}")),
            _ => {}
        }
    }
    for (i, s) in streamed.iter().enumerate() {
        assert_eq!(s, &want[i], "sequence {i} streamed");
    }
}

#[test]
fn auto_depth_keeps_a_constrained_reply() {
    let engine = load("tiny-trained", None);
    let regex = ResponseFormat::Regex {
        regex: "[a-z ]{3,30}\\.".into(),
    };
    for i in 0..3 {
        let o = base(i).response_format(regex.clone());
        let want = engine.generate(&ids(i), &o, |_| true).unwrap();
        let got = engine
            .generate(&ids(i), &o.clone().auto_depth(8), |_| true)
            .unwrap();
        assert_eq!(got.tokens, want.tokens, "prompt {i}");
        assert_eq!(got.finish_reason, want.finish_reason, "prompt {i}");
    }
}

/// The drafter catches up lazily under `auto`; the state kept after the reply still resumes
/// to the output of computing everything.
#[test]
fn a_state_after_an_auto_reply_resumes_to_the_same_output() {
    let engine = load("tiny-trained", None);
    let turn1 = ids(0);
    let first = engine
        .generate(
            &turn1,
            &GenerateOptions::greedy(20)
                .ignore_eos(true)
                .auto_depth(4)
                .checkpoint(true),
            |_| true,
        )
        .unwrap();
    let end = Arc::new(first.states.after_reply.expect("end-of-reply state"));
    assert!(end.has_drafter_cache());
    let mut turn2 = turn1.clone();
    turn2.extend_from_slice(&first.tokens);
    turn2.extend("\nand then ".bytes().map(u32::from));
    for o in [
        GenerateOptions::greedy(16).ignore_eos(true),
        GenerateOptions::greedy(16)
            .ignore_eos(true)
            .num_draft_tokens(3),
        GenerateOptions::greedy(16).ignore_eos(true).auto_depth(8),
    ] {
        let cold = engine.generate(&turn2, &o, |_| true).unwrap();
        let warm = engine
            .generate(&turn2, &o.resume_from(Arc::clone(&end)), |_| true)
            .unwrap();
        assert_eq!(warm.tokens, cold.tokens);
        assert_eq!(warm.computed_prompt_tokens, turn2.len() - end.tokens());
    }
}

/// The lazy drafter update changes nothing at a fixed depth: a resumed call drafts and accepts
/// exactly as a cold one (the drafter's cache after the reply is the one it would have had).
#[test]
fn fixed_depth_statistics_are_the_same_after_resuming() {
    let engine = load("tiny-trained", None);
    let turn1 = ids(1);
    let o = GenerateOptions::greedy(24)
        .ignore_eos(true)
        .num_draft_tokens(3);
    let first = engine
        .generate(&turn1, &o.clone().checkpoint(true), |_| true)
        .unwrap();
    let end = Arc::new(first.states.after_reply.expect("end state"));
    let mut turn2 = turn1.clone();
    turn2.extend_from_slice(&first.tokens[..end.tokens() - turn1.len()]);
    turn2.extend(" x".bytes().map(u32::from));
    let cold = engine.generate(&turn2, &o, |_| true).unwrap();
    let warm = engine
        .generate(&turn2, &o.clone().resume_from(Arc::clone(&end)), |_| true)
        .unwrap();
    assert_eq!(warm.tokens, cold.tokens);
    let stats = |g: &GenerationOutput| {
        let s = &g.speculation.as_ref().unwrap().stats;
        (
            s.drafted,
            s.accepted,
            s.rounds,
            s.accepted_per_position.clone(),
        )
    };
    assert_eq!(stats(&warm), stats(&cold));
}
