//! Prefix-cache states outside the process and inside a batch:
//! - a state written as bytes and read back resumes exactly as the original (same tokens as a
//!   fresh run, which `speculative.rs` and `parity.rs` tie to target-only greedy and mlx-vlm),
//!   and bytes that do not fit the model (truncated, altered, another model's) are errors;
//! - the engine's state identity tells checkpoints, drafters and precisions apart;
//! - a batched sequence keeps the same states a solo call keeps (bit for bit: compared as
//!   bytes) and resumes from them to the tokens it gets alone.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use candle_core::{DType, Device};
use mtp_engine::batch::Batch;
use mtp_engine::{Engine, GenerateOptions, GenerationOutput, KvType, PromptState, WeightDtype};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name)
}

fn load(name: &str, drafter: Option<&str>, dtype: impl Into<WeightDtype>) -> Engine {
    let d = drafter.map(fixture);
    Engine::load_with_drafter(&fixture(name), d.as_deref(), &Device::Cpu, dtype).expect("load")
}

fn ids(s: &str) -> Vec<u32> {
    s.bytes().map(u32::from).collect()
}

fn opts(depth: usize, n: usize) -> GenerateOptions {
    let o = GenerateOptions::greedy(n).ignore_eos(true);
    if depth > 0 {
        o.num_draft_tokens(depth)
    } else {
        o
    }
}

/// The models of these tests: dense f32, dense with an MLX 4-bit target and a companion
/// drafter, MoE, and the last two with half-precision KV caches.
fn engines() -> Vec<(&'static str, Engine)> {
    vec![
        ("tiny-trained", load("tiny-trained", None, DType::F32)),
        (
            "tiny-mlx4",
            load("tiny-mlx4", Some("tiny-mlx4-mtp"), WeightDtype::Stored),
        ),
        ("tiny-moe", load("tiny-moe", None, DType::F32)),
        ("tiny-mlx4, f16 KV cache", {
            let mut e = load("tiny-mlx4", Some("tiny-mlx4-mtp"), WeightDtype::Stored);
            e.set_kv_type(KvType::F16);
            e
        }),
        ("tiny-moe, bf16 KV cache", {
            let mut e = load("tiny-moe", None, DType::F32);
            e.set_kv_type(KvType::Bf16);
            e
        }),
    ]
}

fn states(out: &GenerationOutput) -> Vec<(&'static str, &PromptState)> {
    [
        ("history", out.states.after_history.as_ref()),
        ("prompt", out.states.after_prompt.as_ref()),
        ("final", out.states.after_reply.as_ref()),
    ]
    .into_iter()
    .filter_map(|(n, s)| s.map(|s| (n, s)))
    .collect()
}

#[test]
fn saved_states_resume_as_the_originals() {
    let first = ids("the quick brown fox jumps over ");
    for (name, engine) in engines() {
        for depth in [0, 1, 3] {
            let mut o = opts(depth, 10);
            o.checkpoint_at = Some(first.len() - 6);
            let out = engine
                .generate(&first, &o.clone().checkpoint(true), |_| true)
                .unwrap();
            let all = states(&out);
            assert_eq!(all.len(), 3, "{name} depth {depth}: every state kept");
            // the next turn: the prompt, the reply and more
            let mut next = first.clone();
            next.extend_from_slice(&out.tokens);
            next.extend(ids(" and then"));
            let fresh = engine.generate(&next, &o, |_| true).unwrap();
            for (which, st) in all {
                let tag = format!("{name} depth {depth} {which} state");
                let bytes = st.to_bytes();
                let back = Arc::new(engine.state_from_bytes(&bytes).expect(&tag));
                assert_eq!(
                    back.to_bytes(),
                    bytes,
                    "{tag}: written again, the same bytes"
                );
                assert_eq!(back.tokens(), st.tokens(), "{tag}");
                assert_eq!(back.has_drafter_cache(), st.has_drafter_cache(), "{tag}");
                let resumed = engine
                    .generate(&next, &o.clone().resume_from(Arc::clone(&back)), |_| true)
                    .unwrap();
                assert_eq!(
                    resumed.computed_prompt_tokens,
                    next.len() - st.tokens(),
                    "{tag}: resumed where it was taken"
                );
                assert_eq!(resumed.tokens, fresh.tokens, "{tag}");
            }
        }
    }
}

#[test]
fn bytes_that_do_not_fit_the_model_are_errors() {
    let engine = load("tiny-trained", None, DType::F32);
    let with_head = load("tiny-mlx4", Some("tiny-mlx4-mtp"), WeightDtype::Stored);
    let moe = load("tiny-moe", None, DType::F32);
    let prompt = ids("hello there, ");
    let take = |e: &Engine, depth| {
        e.generate(&prompt, &opts(depth, 4).checkpoint(true), |_| true)
            .unwrap()
            .states
            .after_prompt
            .unwrap()
            .to_bytes()
    };
    let good = take(&engine, 1);
    assert!(engine.state_from_bytes(&good).is_ok());
    // every truncation, and one byte too many
    for cut in 0..good.len() {
        let e = engine.state_from_bytes(&good[..cut]).unwrap_err();
        assert!(matches!(e, mtp_engine::Error::State(_)), "cut {cut}: {e}");
    }
    let mut longer = good.clone();
    longer.push(0);
    assert!(engine
        .state_from_bytes(&longer)
        .unwrap_err()
        .to_string()
        .contains("after the end"));
    // a length field claiming more than there is: refused before allocating
    let mut huge = good.clone();
    huge[20..28].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(engine.state_from_bytes(&huge).is_err());
    let mut magic = good.clone();
    magic[0] ^= 1;
    assert!(engine
        .state_from_bytes(&magic)
        .unwrap_err()
        .to_string()
        .contains("magic"));
    let mut version = good.clone();
    version[8] = 99;
    assert!(engine
        .state_from_bytes(&version)
        .unwrap_err()
        .to_string()
        .contains("version"));
    // another shape's state (the bundled demo model: 8 layers of width 128), both ways; a
    // model of the same shape reads it (its identity is what keeps them apart)
    let demo = Engine::load(
        &PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny-code"),
        &Device::Cpu,
        DType::F32,
    )
    .unwrap();
    let e = engine.state_from_bytes(&take(&demo, 0)).unwrap_err();
    assert!(e.to_string().contains("this model has"), "{e}");
    assert!(demo.state_from_bytes(&good).is_err());
    assert!(moe.state_from_bytes(&take(&engine, 0)).is_ok());
    assert_ne!(
        moe.state_identity().unwrap(),
        engine.state_identity().unwrap()
    );
    // a state of another KV cache type, both ways: named by kind, never read as this one's
    let mut f16 = load("tiny-trained", None, DType::F32);
    f16.set_kv_type(KvType::F16);
    let e = engine.state_from_bytes(&take(&f16, 1)).unwrap_err();
    assert!(e.to_string().contains("KV cache in f32"), "{e}");
    let e = f16.state_from_bytes(&good).unwrap_err();
    assert!(e.to_string().contains("KV cache in f16"), "{e}");
    assert!(f16.state_from_bytes(&take(&f16, 1)).is_ok());
    // a drafter cache for an engine without a drafter
    let target_only =
        Engine::load_target_only(&fixture("tiny-mlx4"), &Device::Cpu, WeightDtype::Stored).unwrap();
    let e = target_only
        .state_from_bytes(&take(&with_head, 2))
        .unwrap_err();
    assert!(e.to_string().contains("no drafter"), "{e}");
    // every single-byte change is an error or a state of this model's shape (the disk
    // cache's checksum is what catches changed values)
    for i in 0..good.len().min(4096) {
        let mut b = good.clone();
        b[i] = b[i].wrapping_add(0x41);
        if let Ok(st) = engine.state_from_bytes(&b) {
            assert_eq!(st.to_bytes().len(), good.len(), "byte {i}");
        }
    }
}

#[test]
fn the_identity_names_weights_drafter_and_precision() {
    let a = load("tiny-trained", None, DType::F32);
    let again = load("tiny-trained", None, DType::F32);
    assert_eq!(a.state_identity().unwrap(), again.state_identity().unwrap());
    assert_eq!(a.state_identity().unwrap().len(), 64);
    let bf16 = load("tiny-trained", None, DType::BF16);
    assert_ne!(
        a.state_identity().unwrap(),
        bf16.state_identity().unwrap(),
        "precision"
    );
    let target_only =
        Engine::load_target_only(&fixture("tiny-trained"), &Device::Cpu, DType::F32).unwrap();
    assert_ne!(
        a.state_identity().unwrap(),
        target_only.state_identity().unwrap(),
        "drafter"
    );
    // the KV cache's type; set after a first identity was taken, the identity follows
    let mut f16 = load("tiny-trained", None, DType::F32);
    assert_eq!(a.state_identity().unwrap(), f16.state_identity().unwrap());
    f16.set_kv_type(KvType::F16);
    let mut bf16_kv = load("tiny-trained", None, DType::F32);
    bf16_kv.set_kv_type(KvType::Bf16);
    let ids = [
        a.state_identity().unwrap(),
        f16.state_identity().unwrap(),
        bf16_kv.state_identity().unwrap(),
    ];
    assert!(
        ids[0] != ids[1] && ids[1] != ids[2] && ids[0] != ids[2],
        "KV cache type"
    );
    let hf = load("tiny-hf", None, DType::F32);
    assert_ne!(
        a.state_identity().unwrap(),
        hf.state_identity().unwrap(),
        "weights"
    );
    let companion = load("tiny-mlx4", Some("tiny-mlx4-mtp"), WeightDtype::Stored);
    let embedded_or_none = load("tiny-mlx4", None, WeightDtype::Stored);
    assert_ne!(
        companion.state_identity().unwrap(),
        embedded_or_none.state_identity().unwrap()
    );
    // a copy of the same files elsewhere is the same model
    let dir = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(fixture("tiny-trained")).unwrap() {
        let p = e.unwrap().path();
        if p.is_file() {
            std::fs::copy(&p, dir.path().join(p.file_name().unwrap())).unwrap();
        }
    }
    let copy = Engine::load(dir.path(), &Device::Cpu, DType::F32).unwrap();
    assert_eq!(a.state_identity().unwrap(), copy.state_identity().unwrap());
    // one changed weight byte is another model
    let st = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .unwrap();
    let mut w = std::fs::read(&st).unwrap();
    let last = w.len() - 1;
    w[last] ^= 1;
    std::fs::write(&st, w).unwrap();
    let changed = Engine::load(dir.path(), &Device::Cpu, DType::F32).unwrap();
    assert_ne!(
        a.state_identity().unwrap(),
        changed.state_identity().unwrap()
    );
}

/// A batched sequence: its prompt, options, state to resume and whether to keep states.
type Seq = (Vec<u32>, GenerateOptions, Option<Arc<PromptState>>, bool);

/// Runs `(prompt, opts, resume, checkpoint)` sequences in one batch (all joining at once,
/// with a target-only neighbour that keeps nothing) and returns their outputs.
fn batched(engine: &Engine, chunk: Option<usize>, seqs: &[Seq]) -> BTreeMap<u64, GenerationOutput> {
    let mut batch = match chunk {
        Some(c) => Batch::new(engine).with_prefill_chunk(c),
        None => Batch::new(engine),
    };
    let mut on = |_: u64, _: &[u32]| true;
    for (i, (p, o, r, c)) in seqs.iter().enumerate() {
        let mut o = o.clone().checkpoint(*c);
        if let Some(r) = r {
            o = o.resume_from(Arc::clone(r));
        }
        batch.join(i as u64, p, &o);
    }
    batch.join(99, &ids("a neighbour "), &opts(0, 7));
    let mut outs = BTreeMap::new();
    let mut steps = 0;
    while batch.active() > 0 {
        batch.step(&mut on);
        steps += 1;
        assert!(steps < 500, "the batch does not end");
    }
    for (id, out) in batch.take_finished() {
        outs.insert(id, out.unwrap());
    }
    outs.remove(&99).expect("the neighbour ends");
    outs
}

#[test]
fn batched_sequences_keep_and_resume_states_as_solo_calls() {
    let first = ids("fn main() { let x = ");
    for (name, engine) in engines() {
        // turn 1: alone and batched, keeping every state
        let depths = [0, 1, 3];
        let turn1: Vec<_> = depths
            .iter()
            .map(|&d| {
                let mut o = opts(d, 9 + d);
                o.checkpoint_at = Some(first.len() - 4);
                (first.clone(), o, None, true)
            })
            .collect();
        let got = batched(&engine, None, &turn1);
        let mut finals = Vec::new();
        for (i, (p, o, _, _)) in turn1.iter().enumerate() {
            let tag = format!("{name} depth {}", depths[i]);
            let solo = engine
                .generate(p, &o.clone().checkpoint(true), |_| true)
                .unwrap();
            let b = &got[&(i as u64)];
            assert_eq!(b.tokens, solo.tokens, "{tag}");
            assert_eq!(b.computed_prompt_tokens, p.len(), "{tag}");
            let (s, bs) = (states(&solo), states(b));
            assert_eq!(s.len(), 3, "{tag}");
            assert_eq!(bs.len(), 3, "{tag}: the batch keeps every state");
            for ((which, x), (_, y)) in s.iter().zip(&bs) {
                assert_eq!(x.tokens(), y.tokens(), "{tag} {which}");
                assert!(
                    x.to_bytes() == y.to_bytes(),
                    "{tag} {which}: the same state"
                );
            }
            let mut next = p.clone();
            next.extend_from_slice(&b.tokens);
            next.extend(ids("; y"));
            finals.push((next, b.states.after_reply.clone().map(Arc::new)));
        }
        // turn 2: each resumes its final state in a batch, also when its prompt is filled a
        // chunk per step, and gets the tokens of a fresh solo run
        for chunk in [None, Some(3)] {
            let turn2: Vec<_> = finals
                .iter()
                .zip(&turn1)
                .map(|((next, st), (_, o, _, _))| {
                    let mut o = o.clone();
                    o.checkpoint_at = Some(next.len() - 2);
                    (next.clone(), o, st.clone(), true)
                })
                .collect();
            let got = batched(&engine, chunk, &turn2);
            for (i, (p, o, st, _)) in turn2.iter().enumerate() {
                let tag = format!("{name} depth {} chunk {chunk:?}", depths[i]);
                let fresh = engine.generate(p, o, |_| true).unwrap();
                let b = &got[&(i as u64)];
                assert_eq!(b.tokens, fresh.tokens, "{tag}");
                let from = st.as_ref().expect("a final state").tokens();
                assert_eq!(b.computed_prompt_tokens, p.len() - from, "{tag}");
                let h = b.states.after_history.clone().expect("a history state");
                assert_eq!(h.tokens(), p.len() - 2, "{tag}");
                // and the history state taken in the batch resumes too
                let again = engine
                    .generate(p, &o.clone().resume_from(Arc::new(h)), |_| true)
                    .unwrap();
                assert_eq!(again.tokens, fresh.tokens, "{tag}");
                assert_eq!(again.computed_prompt_tokens, 2, "{tag}");
            }
        }
    }
}
