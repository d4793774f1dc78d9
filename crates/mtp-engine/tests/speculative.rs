//! MTP speculation: exact greedy equivalence with target-only decoding across depths 1–8 and
//! many prompts (random and trained checkpoints, embedded and companion heads), seeded sampling
//! equivalence, and a chi-square test that unseeded speculative sampling keeps the target's
//! distribution.

use std::path::PathBuf;
use std::sync::Arc;

use candle_core::{DType, Device};
use mtp_engine::cache::VerifyMode;
use mtp_engine::{Engine, GenerateOptions, LogitsAt, Sampling};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name)
}

fn load(name: &str, drafter: Option<&str>) -> Engine {
    let d = drafter.map(fixture);
    Engine::load_with_drafter(&fixture(name), d.as_deref(), &Device::Cpu, DType::F32).expect("load")
}

/// Prompts: the golden prompts plus pseudo-random byte strings of varied length.
fn prompts() -> Vec<Vec<u32>> {
    let mut p: Vec<Vec<u32>> = [
        "the quick brown fox ",
        "dyl aaza utpto cfwd qph ",
        "vro tvc sbircuj lihugo vaqcake ",
        "Hello, world! 12345",
        "a",
        "fn main() { println!(\"hi\"); }",
    ]
    .iter()
    .map(|s| s.bytes().map(u32::from).collect())
    .collect();
    let mut x: u64 = 99;
    for len in [3usize, 9, 17, 33] {
        p.push(
            (0..len)
                .map(|_| {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    1 + ((x >> 33) % 255) as u32
                })
                .collect(),
        );
    }
    p
}

fn greedy_equivalence(engine: &Engine, name: &str, tokens: usize) -> f64 {
    let (mut drafted, mut accepted) = (0u64, 0u64);
    for (pi, prompt) in prompts().iter().enumerate() {
        let base = engine
            .generate(
                prompt,
                &GenerateOptions::greedy(tokens).ignore_eos(true),
                |_| true,
            )
            .expect("target-only");
        for k in 1..=8 {
            let mut chunks = 0;
            let out = engine
                .generate(
                    prompt,
                    &GenerateOptions::greedy(tokens)
                        .ignore_eos(true)
                        .num_draft_tokens(k),
                    |_| {
                        chunks += 1;
                        true
                    },
                )
                .expect("speculative");
            assert_eq!(
                out.tokens, base.tokens,
                "{name}: prompt {pi} depth {k} differs from target-only"
            );
            let sp = out.speculation.expect("speculation outcome");
            assert!(
                sp.used,
                "{name}: speculation not used: {:?}",
                sp.not_used_reason
            );
            assert_eq!(
                sp.stats.rounds as usize + 1,
                chunks,
                "{name}: one callback per round plus the first token"
            );
            drafted += sp.stats.drafted;
            accepted += sp.stats.accepted;
        }
    }
    let rate = accepted as f64 / drafted.max(1) as f64;
    eprintln!(
        "{name}: identical at depths 1-8 on {} prompts; acceptance {:.1}%",
        prompts().len(),
        rate * 100.0
    );
    rate
}

/// Both ways of rolling the recurrent state back (the fixtures' states are small, so `Auto`
/// advances with a backup copy; `Deferred` is what larger models get).
const MODES: [VerifyMode; 2] = [VerifyMode::Backup, VerifyMode::Deferred];

#[test]
fn greedy_identical_trained_embedded_head() {
    let mut engine = load("tiny-trained", None);
    engine.set_verify_mode(VerifyMode::Deferred);
    greedy_equivalence(&engine, "tiny-trained (deferred)", 48);
    let rate = greedy_equivalence(&load("tiny-trained", None), "tiny-trained", 48);
    // averaged over depths 1-8 (deep drafts are accepted less often)
    assert!(
        rate > 0.4,
        "a trained head should be accepted often, got {rate}"
    );
}

#[test]
fn greedy_identical_random_hf() {
    for mode in MODES {
        let mut engine = load("tiny-hf", None);
        engine.set_verify_mode(mode);
        greedy_equivalence(&engine, &format!("tiny-hf ({mode:?})"), 40);
    }
}

#[test]
fn greedy_identical_moe() {
    greedy_equivalence(&load("tiny-moe", None), "tiny-moe", 32);
}

#[test]
fn greedy_identical_mlx_companion_drafter() {
    greedy_equivalence(
        &load("tiny-mlx4", Some("tiny-mlx4-mtp")),
        "tiny-mlx4 + drafter",
        32,
    );
}

/// With a half-precision KV cache (target and drafter) speculation still gives exactly the
/// target-only greedy output at depths 1-8: a verify's rows round their keys and values as
/// single steps do, so the identity does not depend on the cache's type; and the trained head
/// is still accepted as often.
#[test]
fn greedy_identical_with_half_precision_kv_caches() {
    use mtp_engine::KvType;
    for kv in [KvType::F16, KvType::Bf16] {
        let mut engine = load("tiny-trained", None);
        engine.set_kv_type(kv);
        assert_eq!(engine.kv_type(), kv);
        let rate = greedy_equivalence(&engine, &format!("tiny-trained ({kv} KV)"), 48);
        assert!(rate > 0.4, "{kv}: acceptance {rate}");
        let mut engine = load("tiny-mlx4", Some("tiny-mlx4-mtp"));
        engine.set_kv_type(kv);
        engine.set_verify_mode(VerifyMode::Deferred);
        greedy_equivalence(&engine, &format!("tiny-mlx4 + drafter ({kv} KV)"), 32);
    }
    let mut engine = load("tiny-moe", None);
    engine.set_kv_type(KvType::F16);
    greedy_equivalence(&engine, "tiny-moe (f16 KV)", 32);
}

#[test]
fn acceptance_close_to_mlx_vlm() {
    // mlx-vlm's acceptance at block size 3 (2 drafts) on the trained fixture, from golden.json.
    let g: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixture("tiny-trained").join("golden.json")).expect("golden"),
    )
    .expect("json");
    let engine = load("tiny-trained", None);
    let ids: Vec<Vec<u32>> = g["prompt_ids"]
        .as_array()
        .expect("ids")
        .iter()
        .map(|r| {
            r.as_array()
                .expect("row")
                .iter()
                .map(|x| x.as_u64().expect("id") as u32)
                .collect()
        })
        .collect();
    for (i, p) in ids.iter().enumerate() {
        let out = engine
            .generate(
                p,
                &GenerateOptions::greedy(64)
                    .ignore_eos(true)
                    .num_draft_tokens(2),
                |_| true,
            )
            .expect("gen");
        let want: Vec<u32> = g["mtp"][i]
            .as_array()
            .expect("mtp")
            .iter()
            .map(|x| x.as_u64().expect("id") as u32)
            .collect();
        assert_eq!(
            out.tokens, want,
            "prompt {i}: MTP output differs from mlx-vlm's"
        );
        let ours = out
            .speculation
            .expect("spec")
            .stats
            .acceptance_rate()
            .expect("rate");
        let theirs = g["acceptance"][i].as_f64().expect("acc");
        eprintln!("prompt {i}: acceptance ours {ours:.3} mlx-vlm {theirs:.3}");
        assert!(
            (ours - theirs).abs() < 0.1,
            "prompt {i}: acceptance {ours} vs mlx-vlm {theirs}"
        );
    }
}

#[test]
fn seeded_sampling_same_text_with_and_without_mtp() {
    let engine = load("tiny-trained", None);
    for seed in [1u64, 7, 42] {
        let s = Sampling {
            temperature: Some(0.8),
            top_p: Some(0.95),
            top_k: Some(20),
            seed: Some(seed),
            ..Default::default()
        };
        for prompt in prompts().iter().take(4) {
            let base = engine
                .generate(
                    prompt,
                    &GenerateOptions::greedy(40)
                        .ignore_eos(true)
                        .sampling(s.clone()),
                    |_| true,
                )
                .expect("plain");
            for k in [1, 3, 5] {
                let out = engine
                    .generate(
                        prompt,
                        &GenerateOptions::greedy(40)
                            .ignore_eos(true)
                            .sampling(s.clone())
                            .num_draft_tokens(k),
                        |_| true,
                    )
                    .expect("spec");
                assert_eq!(out.tokens, base.tokens, "seed {seed} depth {k}");
            }
        }
    }
}

#[test]
fn penalties_run_target_only_and_say_why() {
    let engine = load("tiny-trained", None);
    let s = Sampling {
        repetition_penalty: Some(1.3),
        ..Default::default()
    };
    let out = engine
        .generate(
            &[116, 104, 101],
            &GenerateOptions::greedy(8).sampling(s).num_draft_tokens(3),
            |_| true,
        )
        .expect("gen");
    let sp = out.speculation.expect("outcome");
    assert!(!sp.used);
    // the contract's code and message (the rule lives in `mtp_contract::plan`)
    assert_eq!(
        sp.not_used_reason,
        Some(mtp_contract::Reason::SamplingRequiresTargetOnly)
    );
    assert!(sp
        .not_used_message
        .expect("message")
        .contains("repetition_penalty"));
}

/// Chi-square: the second generated token under unseeded speculative sampling (depth 1, so it is
/// either an accepted draft or a residual resample) follows the target's distribution given the
/// first token.
#[test]
fn unseeded_speculative_sampling_keeps_target_distribution() {
    let engine = load("tiny-hf", None);
    let prompt: Vec<u32> = "the quick brown fox ".bytes().map(u32::from).collect();
    let s = Sampling {
        temperature: Some(1.0),
        top_k: Some(6),
        ..Default::default()
    };
    let opts = GenerateOptions::greedy(2)
        .ignore_eos(true)
        .sampling(s.clone())
        .num_draft_tokens(1);
    // condition on the most likely first token
    let first = {
        let l = engine.prompt_logits(&prompt).expect("logits");
        mtp_engine::sampling::argmax(&l)
    };
    let mut ctx = prompt.clone();
    ctx.push(first);
    let p = {
        let mut cache = [engine.model().new_cache()];
        let out = engine
            .model()
            .forward(&[ctx], &mut cache, LogitsAt::Last)
            .expect("fwd");
        mtp_engine::sampling::Sampler::new(&s).distribution(&out.logits)
    };
    let mut counts = vec![0u64; p.len()];
    let mut n = 0u64;
    let mut tries = 0;
    while n < 3000 && tries < 40000 {
        tries += 1;
        let out = engine.generate(&prompt, &opts, |_| true).expect("gen");
        if out.tokens.len() == 2 && out.tokens[0] == first {
            counts[out.tokens[1] as usize] += 1;
            n += 1;
        }
    }
    assert!(
        n >= 1000,
        "too few samples conditioned on the first token: {n}"
    );
    let support: Vec<usize> = (0..p.len()).filter(|i| p[*i] > 0.0).collect();
    let outside: u64 = (0..p.len())
        .filter(|i| p[*i] == 0.0)
        .map(|i| counts[i])
        .sum();
    assert_eq!(
        outside, 0,
        "tokens outside the target's support were produced"
    );
    let chi2: f64 = support
        .iter()
        .map(|&i| {
            let e = p[i] as f64 * n as f64;
            (counts[i] as f64 - e).powi(2) / e
        })
        .sum();
    // df = 5 (top-k 6): the 0.1% critical value is 20.5
    eprintln!(
        "chi-square {chi2:.2} over {} categories, {n} samples",
        support.len()
    );
    assert!(
        chi2 < 20.5,
        "chi-square {chi2} rejects the target distribution"
    );
}

/// A chat's next turn resumes from the state at the end of the previous reply: the output is
/// the same as computing the whole prompt, only the new tokens are computed, and this holds for
/// target-only decoding and every depth (states taken with and without MTP, used by either).
#[test]
fn resuming_from_the_end_of_a_reply_gives_the_same_output() {
    let engine = load("tiny-trained", None);
    let turn1: Vec<u32> = "the quick brown fox ".bytes().map(u32::from).collect();
    for depth in [0usize, 1, 3, 5] {
        let mut opts = GenerateOptions::greedy(12).ignore_eos(true);
        if depth > 0 {
            opts = opts.num_draft_tokens(depth);
        }
        let first = engine
            .generate(&turn1, &opts.clone().checkpoint(true), |_| true)
            .expect("turn 1");
        let end = Arc::new(first.states.after_reply.expect("end-of-reply state"));
        let reply = &first.tokens;
        assert!(end.tokens() > turn1.len() && end.tokens() < turn1.len() + reply.len() + 1);
        assert_eq!(end.has_drafter_cache(), depth > 0);
        let prompt_state = first.states.after_prompt.as_ref().expect("prompt state");
        assert_eq!(prompt_state.tokens(), turn1.len());

        // Turn 2: the whole history, then a new user message.
        let mut turn2 = turn1.clone();
        turn2.extend_from_slice(reply);
        turn2.extend("\nand then ".bytes().map(u32::from));
        for next_depth in [0usize, 2, 4] {
            let mut o2 = GenerateOptions::greedy(16).ignore_eos(true);
            if next_depth > 0 {
                o2 = o2.num_draft_tokens(next_depth);
            }
            let cold = engine.generate(&turn2, &o2, |_| true).expect("cold");
            let warm = engine
                .generate(&turn2, &o2.clone().resume_from(Arc::clone(&end)), |_| true)
                .expect("warm");
            assert_eq!(
                warm.tokens, cold.tokens,
                "state taken at depth {depth}, resumed at depth {next_depth}"
            );
            // A speculative call needs the drafter's cache; without it the prompt is recomputed.
            let expect = if next_depth > 0 && depth == 0 {
                turn2.len()
            } else {
                turn2.len() - end.tokens()
            };
            assert_eq!(warm.computed_prompt_tokens, expect, "{depth}->{next_depth}");
        }
    }
}

/// A stop token inside a round's accepted drafts: the end state never covers tokens the caller
/// did not receive.
#[test]
fn end_state_never_covers_unreturned_tokens() {
    let engine = load("tiny-trained", None);
    let prompt: Vec<u32> = "the quick brown fox ".bytes().map(u32::from).collect();
    let base = engine
        .generate(
            &prompt,
            &GenerateOptions::greedy(24).ignore_eos(true),
            |_| true,
        )
        .expect("base");
    // Stop at a token that appears mid-output.
    let stop = base.tokens[base.tokens.len() / 2];
    for depth in [0usize, 2, 4, 6] {
        let mut opts = GenerateOptions::greedy(24).ignore_eos(true);
        opts.stop_token_ids = vec![stop];
        if depth > 0 {
            opts = opts.num_draft_tokens(depth);
        }
        let out = engine
            .generate(&prompt, &opts.checkpoint(true), |_| true)
            .expect("run");
        if let Some(end) = &out.states.after_reply {
            assert!(
                end.tokens() <= prompt.len() + out.tokens.len(),
                "depth {depth}"
            );
        }
    }
}

/// The rollback itself: a verify forward of 6 positions committed at `keep` leaves the cache
/// exactly where `keep` single-token forwards leave it (next forward's logits and hidden state
/// bit for bit), and each verify row is the single-token forward's row.
#[test]
fn verify_then_commit_equals_single_steps() {
    for (name, mode) in ["tiny-hf", "tiny-moe", "tiny-trained"]
        .into_iter()
        .flat_map(|n| MODES.map(|m| (n, m)))
    {
        let mut engine = load(name, None);
        engine.set_verify_mode(mode);
        let model = engine.model();
        let vocab = model.vocab_size();
        let prompt: Vec<u32> = "state of the art ".bytes().map(u32::from).collect();
        let draft: Vec<u32> = "round!".bytes().map(u32::from).collect();
        let mut base = model.new_cache();
        model
            .forward(
                std::slice::from_ref(&prompt),
                std::slice::from_mut(&mut base),
                LogitsAt::Last,
            )
            .expect("prefill");
        let bits = |a: &[f32], b: &[f32]| {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
        };
        // single-token forwards: logits after each draft token
        let mut plain = base.clone();
        let mut single = Vec::new();
        for &t in &draft {
            let out = model
                .forward(&[vec![t]], std::slice::from_mut(&mut plain), LogitsAt::All)
                .expect("step");
            single.push((out.logits, out.hidden));
        }
        for keep in 0..=draft.len() {
            let mut c = base.clone();
            c.begin_verify();
            let out = model
                .forward(
                    std::slice::from_ref(&draft),
                    std::slice::from_mut(&mut c),
                    LogitsAt::All,
                )
                .expect("verify");
            for (j, (logits, _)) in single.iter().enumerate() {
                assert!(
                    bits(&out.logits[j * vocab..(j + 1) * vocab], logits),
                    "{name} {mode:?}: verify row {j} differs from its single-token forward"
                );
            }
            // a snapshot taken inside the verify goes back to before it
            let inside = c.snapshot();
            c.commit_verify(keep);
            assert_eq!(c.position(), prompt.len() + keep);
            if keep == draft.len() {
                let mut back = c.clone();
                back.restore(&inside);
                let next = [vec![7u32]];
                let got = model
                    .forward(&next, std::slice::from_mut(&mut back), LogitsAt::All)
                    .expect("after restore");
                let want = model
                    .forward(
                        &next,
                        std::slice::from_mut(&mut base.clone()),
                        LogitsAt::All,
                    )
                    .expect("reference");
                assert!(
                    bits(&got.logits, &want.logits),
                    "{name} {mode:?}: a snapshot inside the verify restores to before it"
                );
            }
            // the next token after the kept prefix, from the committed cache and from scratch
            let next = [vec![7u32]];
            let got = model
                .forward(&next, std::slice::from_mut(&mut c), LogitsAt::All)
                .expect("after commit");
            let mut want_cache = base.clone();
            if keep > 0 {
                model
                    .forward(
                        &[draft[..keep].to_vec()],
                        std::slice::from_mut(&mut want_cache),
                        LogitsAt::None,
                    )
                    .expect("kept prefix");
            }
            let want = model
                .forward(&next, std::slice::from_mut(&mut want_cache), LogitsAt::All)
                .expect("reference");
            assert!(
                bits(&got.logits, &want.logits) && bits(&got.hidden, &want.hidden),
                "{name} {mode:?}: commit at {keep} differs from {keep} plain forwards"
            );
        }
    }
}

/// The head's multi-position forward (prefill, drafter update) computes only keys and values
/// for all but the last position in its last layer; its output must be the bits of feeding the
/// positions one at a time.
#[test]
fn head_forward_last_equals_position_by_position() {
    for (name, drafter) in [
        ("tiny-trained", None),
        ("tiny-moe", None),
        ("tiny-mlx", Some("tiny-mlx-mtp")),
    ] {
        let engine = load(name, drafter);
        let (model, head) = (engine.model(), engine.drafter().expect("a drafter"));
        let d = model.hidden_size();
        let tokens: Vec<u32> = "head check".bytes().map(u32::from).collect();
        let hidden: Vec<f32> = (0..tokens.len() * d)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
            .collect();
        let mut all = head.new_cache();
        let got = head
            .forward(model, &tokens, &hidden, &mut all)
            .expect("all at once");
        let mut one = head.new_cache();
        let mut want = Vec::new();
        for (i, t) in tokens.iter().enumerate() {
            want = head
                .forward(model, &[*t], &hidden[i * d..(i + 1) * d], &mut one)
                .expect("one at a time");
        }
        assert_eq!(got.len(), d);
        assert!(
            got.iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{name}: the last position differs"
        );
        assert_eq!(all.position(), one.position());
    }
}

/// `begin_verify` covers one forward: a second one before the commit is refused with an error
/// before it touches the cache (its outputs would ignore the first one's uncommitted steps).
#[test]
fn second_forward_inside_a_verify_is_an_error() {
    let engine = load("tiny-hf", None);
    let model = engine.model();
    let mut c = model.new_cache();
    let run = |c: &mut mtp_engine::cache::SeqCache, t: &[u32]| {
        model.forward(&[t.to_vec()], std::slice::from_mut(c), LogitsAt::All)
    };
    run(&mut c, b"abc".map(u32::from).as_slice()).expect("prefill");
    c.begin_verify();
    run(&mut c, &[100, 101]).expect("verify");
    let err = run(&mut c, &[102]).expect_err("a second forward");
    assert!(err.to_string().contains("verify"), "{err}");
    assert_eq!(c.position(), 5);
    c.commit_verify(1);
    let got = run(&mut c, &[103]).expect("after the commit");
    let mut want = model.new_cache();
    run(&mut want, b"abc".map(u32::from).as_slice()).expect("prefill");
    let want = run(&mut want, &[100, 103]).expect("reference");
    let vocab = model.vocab_size();
    assert!(got
        .logits
        .iter()
        .zip(&want.logits[vocab..])
        .all(|(a, b)| a.to_bits() == b.to_bits()));
}

#[test]
fn a_drafter_loaded_as_the_target_says_how_to_use_it() {
    let dir = fixture("tiny-mlx4-mtp");
    let err = match Engine::load(&dir, &Device::Cpu, DType::F32) {
        Ok(_) => panic!("a drafter must not load as a target"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("companion drafter, not a target model"),
        "{err}"
    );
    assert!(
        err.contains(&format!("--drafter {}", dir.display())),
        "{err}"
    );
}
