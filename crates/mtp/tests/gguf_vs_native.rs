//! The two in-process engines on the same weights: the bundled demo model (`models/tiny-code`)
//! run by the native engine and, converted to GGUF at test time (the converter behind
//! `cargo xtask gguf`, included by path), by llama.cpp b11434 through the `gguf` provider.
//! Both keep greedy output unchanged by MTP; the test compares the two engines' text and, where
//! they differ (different kernels), reports the first divergence instead of hiding it: with each
//! engine's own KV cache type (f32 native, f16 llama.cpp) and with both in f16, f32 and bf16
//! (`cache_type`).
#![cfg(feature = "gguf")]

#[path = "../../../xtask/src/gguf/convert.rs"]
#[allow(dead_code)]
mod convert;

use std::path::{Path, PathBuf};

use mtp::{create_llm, GenerateRequest, ProviderOptions, Sampling, Speculation};

fn demo_model() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny-code")
}

fn on(depth: u32) -> ProviderOptions {
    ProviderOptions::default().speculation(
        Speculation::native_mtp()
            .with_num_draft_tokens(depth)
            .unwrap(),
    )
}

fn first_divergence(a: &[u32], b: &[u32]) -> Option<usize> {
    a.iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .or_else(|| (a.len() != b.len()).then(|| a.len().min(b.len())))
}

const PROMPTS: [&str; 4] = [
    "fn main() {",
    "impl Iterator for Counter {\n    type Item = u32;\n",
    "let mut v = Vec::new();\n",
    "pub struct Point {\n    x: f64,\n",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gguf_and_native_agree_on_the_demo_model() {
    agree_with_cache_types(None).await;
}

/// The same comparison with both engines' KV caches in one type (`cache_type`: the native
/// engine's `KvType`, llama.cpp's `type_k`/`type_v`): f16 (llama.cpp's default, so the first
/// comparison's llama.cpp side) and f32 and bf16 on both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gguf_and_native_agree_with_the_same_kv_cache_type() {
    for kv in ["f16", "f32", "bf16"] {
        agree_with_cache_types(Some(kv)).await;
    }
}

/// Greedy tokens of both engines, MTP on and off, on the demo model; `kv`: both engines'
/// KV cache type (else each one's default: f32 native, f16 llama.cpp).
async fn agree_with_cache_types(kv: Option<&str>) {
    std::env::set_var(
        "HF_HUB_CACHE",
        std::env::temp_dir().join("mtp-empty-hub-cache"),
    );
    let tmp = tempfile::tempdir().unwrap();
    let gguf_path = tmp.path().join("tiny-code.gguf");
    convert::convert(
        &demo_model(),
        &gguf_path,
        &convert::ConvertOptions::default(),
    )
    .expect("convert the demo model");
    let with_kv = |o: ProviderOptions| match kv {
        Some(kv) => o.extra("cache_type", kv),
        None => o,
    };
    let native = create_llm("native", demo_model().to_str().unwrap(), with_kv(on(3))).unwrap();
    let gguf = create_llm(
        "gguf",
        gguf_path.to_str().unwrap(),
        with_kv(on(3).extra("n_ctx", "512").extra("threads", "2")),
    )
    .unwrap();
    assert!(gguf.speculation_status().lane_loaded);

    let greedy = Sampling {
        temperature: Some(0.0),
        ..Default::default()
    };
    let (mut drafted, mut accepted) = ([0u64; 2], [0u64; 2]);
    for prompt in PROMPTS {
        let req = GenerateRequest::new(prompt)
            .raw()
            .max_output_tokens(48)
            .sampling(greedy.clone());
        let mut ids = Vec::new();
        for (e, llm) in [&native, &gguf].into_iter().enumerate() {
            let off = llm.generate(req.clone().speculation(false)).await.unwrap();
            let with = llm.generate(req.clone()).await.unwrap();
            let s = &with.metadata.speculation;
            assert!(s.used, "{}: {s:?}", llm.name());
            assert_eq!(
                with.token_ids,
                off.token_ids,
                "{}: MTP changed greedy output for {prompt:?}",
                llm.name()
            );
            drafted[e] += s.drafted.unwrap();
            accepted[e] += s.accepted.unwrap();
            ids.push(off.token_ids.unwrap());
        }
        if let Some(at) = first_divergence(&ids[0], &ids[1]) {
            panic!(
                "{prompt:?}, KV caches {kv:?}: native and llama.cpp greedy tokens first differ at \
                 output token {at}: native {:?} vs llama.cpp {:?}",
                &ids[0][at..(at + 4).min(ids[0].len())],
                &ids[1][at..(at + 4).min(ids[1].len())]
            );
        }
    }
    let rate = |e: usize| accepted[e] as f64 / drafted[e].max(1) as f64;
    eprintln!(
        "depth 3 on code, KV caches {kv:?}: native accepted {}/{} ({:.2}), llama.cpp accepted {}/{} ({:.2})",
        accepted[0],
        drafted[0],
        rate(0),
        accepted[1],
        drafted[1],
        rate(1)
    );
    // Same weights, same greedy drafts: the two engines' acceptance is close.
    assert!(
        (rate(0) - rate(1)).abs() < 0.1,
        "{} vs {}",
        rate(0),
        rate(1)
    );
}

#[tokio::test]
async fn a_bad_gguf_is_a_typed_error() {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("truncated.gguf");
    std::fs::write(&p, b"GGUF\x03\x00\x00\x00").unwrap();
    match create_llm("gguf", p.to_str().unwrap(), ProviderOptions::default()) {
        Err(mtp::Error::Provider(mtp::ProviderError::ModelLoad { model, message })) => {
            assert!(model.contains("truncated.gguf"), "{model}");
            assert!(!message.is_empty());
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("loaded a truncated file"),
    }
}
