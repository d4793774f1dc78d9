//! Parity with mlx-vlm 0.7.10 goldens (`tests/fixtures/*/golden.json`): first-step logits within
//! 1e-3 (f32) and 64 greedy tokens identical for every prompt, for the HF layout, MLX layout,
//! MLX 3-, 4- and 6-bit, MoE and MLX 4-bit MoE fixtures, each loaded both as stored (quantized
//! matrices packed) and converted to f32. Each fixture has two sets: `golden.json` (prompts of
//! 19-31 tokens, prefilled by the few-row products decode uses) and `golden_long.json` (188-587
//! tokens, prefilled by the many-row products of `fgemm`, over panels widened or dequantized as
//! they are packed).

use std::path::PathBuf;

use mtp_engine::{Engine, GenerateOptions};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name)
}

struct Golden {
    prompt_ids: Vec<Vec<u32>>,
    first_logits: Vec<Vec<f32>>,
    off: Vec<Vec<u32>>,
}

fn golden(name: &str, file: &str) -> Golden {
    let text = std::fs::read_to_string(fixture(name).join(file)).expect(file);
    let v: serde_json::Value = serde_json::from_str(&text).expect("json");
    let ids = |k: &str| -> Vec<Vec<u32>> {
        v[k].as_array()
            .expect(k)
            .iter()
            .map(|r| {
                r.as_array()
                    .expect("row")
                    .iter()
                    .map(|x| x.as_u64().expect("id") as u32)
                    .collect()
            })
            .collect()
    };
    Golden {
        prompt_ids: ids("prompt_ids"),
        first_logits: v["first_logits"]
            .as_array()
            .expect("first_logits")
            .iter()
            .map(|r| {
                r.as_array()
                    .expect("row")
                    .iter()
                    .map(|x| x.as_f64().expect("f") as f32)
                    .collect()
            })
            .collect(),
        off: ids("off"),
    }
}

/// The largest |a - b| over two logit rows.
fn max_delta(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max)
}

/// Both ways of holding the weights: converted to f32 at load, and as stored (MLX 4-bit
/// matrices packed).
fn check(name: &str) {
    check_as(name, candle_core::DType::F32.into());
    check_as(name, mtp_engine::WeightDtype::Stored);
}

fn check_as(name: &str, dtype: mtp_engine::WeightDtype) {
    let engine = Engine::load(&fixture(name), &candle_core::Device::Cpu, dtype).expect("load");
    for file in ["golden.json", "golden_long.json"] {
        check_with(&engine, name, dtype, file);
    }
}

fn check_with(engine: &Engine, name: &str, dtype: mtp_engine::WeightDtype, file: &str) {
    let g = golden(name, file);
    let mut worst = 0f32;
    for (i, ids) in g.prompt_ids.iter().enumerate() {
        let logits = engine.prompt_logits(ids).expect("logits");
        assert_eq!(logits.len(), g.first_logits[i].len());
        let delta = max_delta(&logits, &g.first_logits[i]);
        worst = worst.max(delta);
        assert!(
            delta < 1e-3,
            "{name} {dtype:?} {file} prompt {i}: max |logit delta| {delta}"
        );
        let opts = GenerateOptions::greedy(g.off[i].len()).ignore_eos(true);
        let out = engine.generate(ids, &opts, |_| true).expect("generate");
        assert_eq!(
            out.tokens, g.off[i],
            "{name} {dtype:?} {file} prompt {i}: greedy tokens differ"
        );
    }
    eprintln!(
        "{name} ({dtype:?}, {file}): max |logit delta| {worst:.2e}, {} prompts x 64 tokens identical",
        g.prompt_ids.len()
    );
}

#[test]
fn hf_layout() {
    check("tiny-hf");
}

#[test]
fn mlx_layout() {
    check("tiny-mlx");
}

#[test]
fn mlx_4bit() {
    check("tiny-mlx4");
}

#[test]
fn moe() {
    check("tiny-moe");
}

#[test]
fn trained() {
    check("tiny-trained");
}

#[test]
fn moe_mlx_4bit() {
    check("tiny-moe-mlx4");
}

#[test]
fn mlx_3bit() {
    check("tiny-mlx3");
}

#[test]
fn mlx_6bit() {
    check("tiny-mlx6");
}

/// A half-precision KV cache (`KvType::F16`, llama.cpp's default, or `Bf16`) against the same
/// mlx-vlm goldens (computed with f32 caches): each key and value is rounded once as it is
/// stored, so the first-step logits stay within a bound set by the type's precision (f16:
/// 11 bits, bf16: 8) of the reference's, on the dense, MoE and MLX 4-bit fixtures, short and
/// long prompts.
#[test]
fn half_precision_kv_caches_stay_close() {
    use mtp_engine::KvType;
    for (kv, bound) in [(KvType::F16, 5e-3f32), (KvType::Bf16, 1e-2)] {
        for name in ["tiny-trained", "tiny-moe", "tiny-mlx4"] {
            let mut engine = Engine::load(
                &fixture(name),
                &candle_core::Device::Cpu,
                mtp_engine::WeightDtype::Stored,
            )
            .expect("load");
            engine.set_kv_type(kv);
            for file in ["golden.json", "golden_long.json"] {
                let g = golden(name, file);
                let (mut worst, mut same, mut total) = (0f32, 0usize, 0usize);
                for (i, ids) in g.prompt_ids.iter().enumerate() {
                    let logits = engine.prompt_logits(ids).expect("logits");
                    worst = worst.max(max_delta(&logits, &g.first_logits[i]));
                    let opts = GenerateOptions::greedy(g.off[i].len()).ignore_eos(true);
                    let out = engine.generate(ids, &opts, |_| true).expect("generate");
                    same += out
                        .tokens
                        .iter()
                        .zip(&g.off[i])
                        .take_while(|(a, b)| a == b)
                        .count();
                    total += g.off[i].len();
                }
                eprintln!(
                    "{name} {kv} KV cache ({file}): max |logit delta| {worst:.2e}, greedy tokens identical up to the first difference: {same} of {total}"
                );
                assert!(worst < bound, "{name} {kv} {file}: {worst}");
            }
        }
    }
}
