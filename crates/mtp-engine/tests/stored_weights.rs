//! Weights kept as the checkpoint stores them (`WeightDtype::Stored`). Checkpoints stored in
//! bf16 or f16 keep their matrices in half precision and compute exactly what the same
//! checkpoint converted to f32 at load computes: the same logits bit for bit (prompts up to 32
//! positions through the few-row kernels, longer ones through `fgemm`), the same greedy
//! tokens with and without MTP, on a dense, a tied-embedding and an MoE fixture. MLX-quantized
//! matrices kept packed compute what their dequantized load computes: bit for bit at 3 and 6
//! bits, within 1e-3 of the largest logit at 4 and 8 bits (dequantized in registers, rounded
//! once, in another order), with the same
//! greedy tokens. Converting an f32
//! checkpoint's matrices with `WeightDtype::Convert(BF16)` rounds them, and speculation stays
//! exact on them.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use mtp_engine::{Engine, GenerateOptions, LogitsAt, WeightDtype};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name)
}

/// A copy of fixture `name` with every f32 tensor stored as `dtype` (others as they are); with
/// `tied`, its config says the LM head is the embedding (the checkpoint's `lm_head` is then
/// ignored).
fn half_copy(name: &str, dtype: DType, tied: bool) -> PathBuf {
    let src = fixture(name);
    let dst = std::env::temp_dir().join(format!(
        "mtp-half-{name}-{dtype:?}-{tied}-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dst).unwrap();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "json") {
            std::fs::copy(&path, dst.join(path.file_name().unwrap())).unwrap();
        }
    }
    let tensors = candle_core::safetensors::load(src.join("model.safetensors"), &Device::Cpu)
        .expect("fixture tensors");
    let half: HashMap<String, Tensor> = tensors
        .into_iter()
        .map(|(k, t)| {
            let t = if t.dtype() == DType::F32 {
                t.to_dtype(dtype).unwrap()
            } else {
                t
            };
            (k, t)
        })
        .collect();
    candle_core::safetensors::save(&half, dst.join("model.safetensors")).unwrap();
    if tied {
        let path = dst.join("config.json");
        let mut cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        cfg["tie_word_embeddings"] = true.into();
        if cfg.get("text_config").is_some() {
            cfg["text_config"]["tie_word_embeddings"] = true.into();
        }
        std::fs::write(&path, cfg.to_string()).unwrap();
    }
    dst
}

fn load(dir: &Path, dtype: impl Into<WeightDtype>) -> Engine {
    Engine::load(dir, &Device::Cpu, dtype).expect("load")
}

fn logits(engine: &Engine, prompt: &[u32]) -> Vec<f32> {
    let model = engine.model();
    let mut cache = model.new_cache();
    let mut out = model
        .forward(
            &[prompt.to_vec()],
            std::slice::from_mut(&mut cache),
            LogitsAt::All,
        )
        .expect("prefill")
        .logits;
    // and one decode step after it
    out.extend(
        model
            .forward(&[vec![7]], std::slice::from_mut(&mut cache), LogitsAt::Last)
            .expect("step")
            .logits,
    );
    out
}

fn prompt(len: usize) -> Vec<u32> {
    (0..len as u32).map(|i| 2 + (i * 37 + 11) % 200).collect()
}

fn greedy(engine: &Engine, prompt: &[u32], depth: Option<usize>) -> Vec<u32> {
    let mut opts = GenerateOptions::greedy(24).ignore_eos(true);
    if let Some(k) = depth {
        opts = opts.num_draft_tokens(k);
    }
    engine
        .generate(prompt, &opts, |_| true)
        .expect("generate")
        .tokens
}

fn same_as_f32(name: &str, dtype: DType, tied: bool) {
    let dir = half_copy(name, dtype, tied);
    let stored = load(&dir, WeightDtype::Stored);
    let widened = load(&dir, DType::F32);
    assert!(stored.drafter().is_some(), "{name}: MTP head loaded");
    // every matrix held in the checkpoint's precision, at half the bytes of the f32 load
    let (held, wide) = (stored.weights_held(), widened.weights_held());
    assert_eq!(
        held.keys().collect::<Vec<_>>(),
        [dtype.as_str()],
        "{name}: {held:?}"
    );
    assert_eq!(2 * held.values().sum::<usize>(), wide["f32"], "{name}");
    // up to 32 positions the few-row products, past them `fgemm` over panels widened as they
    // are packed: the same bits as the f32 load's either way
    for len in [1, 5, 20, 32, 45] {
        let (a, b) = (
            logits(&stored, &prompt(len)),
            logits(&widened, &prompt(len)),
        );
        assert_eq!(a.len(), b.len());
        assert!(
            a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
            "{name} {dtype:?}: logits after {len} prompt tokens differ from the f32 load"
        );
    }
    for len in [3, 17] {
        let p = prompt(len);
        let base = greedy(&widened, &p, None);
        assert_eq!(greedy(&stored, &p, None), base, "{name} {dtype:?}");
        for k in [1, 3] {
            assert_eq!(
                greedy(&stored, &p, Some(k)),
                base,
                "{name} {dtype:?}: MTP depth {k}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bf16_checkpoint_computes_what_its_f32_load_computes() {
    same_as_f32("tiny-hf", DType::BF16, false);
}

#[test]
fn bf16_tied_embeddings_compute_what_their_f32_load_computes() {
    same_as_f32("tiny-hf", DType::BF16, true);
}

#[test]
fn f16_checkpoint_computes_what_its_f32_load_computes() {
    same_as_f32("tiny-hf", DType::F16, false);
}

#[test]
fn bf16_moe_checkpoint_computes_what_its_f32_load_computes() {
    same_as_f32("tiny-moe", DType::BF16, false);
}

#[test]
fn converting_to_bf16_at_load_rounds_the_matrices_only() {
    let f32_load = load(&fixture("tiny-trained"), DType::F32);
    let converted = load(&fixture("tiny-trained"), DType::BF16);
    let p = prompt(12);
    let (a, b) = (logits(&converted, &p), logits(&f32_load, &p));
    let worst = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs() / (1.0 + y.abs()))
        .fold(0f32, f32::max);
    assert!(worst > 0.0, "bf16 matrices round the weights");
    assert!(worst < 0.1, "bf16 rounding moved logits by {worst}");
    // speculation stays exact on the rounded weights
    assert_eq!(
        greedy(&converted, &p, Some(2)),
        greedy(&converted, &p, None)
    );
}

/// How close the packed products come to the dequantized load's.
#[derive(Clone, Copy, PartialEq)]
enum Agree {
    /// The same bits (the widths multiplied as dequantized f32 rows: 3, 5, 6 bits).
    Bits,
    /// Within 1e-3 of the largest logit (4 and 8 bits, dequantized in registers by a fused
    /// multiply-add and summed in another order; the bound the engine keeps to mlx-vlm's own
    /// logits).
    Close,
}

/// Fixture `dir` (with companion drafter `drafter`) loaded as stored, MLX-quantized matrices
/// kept packed, computes what its load dequantized to f32 computes: logits up to 45 positions
/// as `agree` says, greedy tokens with and without MTP. Returns what each load holds.
fn packed_same_as_dequantized(
    dir: &Path,
    drafter: &Path,
    agree: Agree,
) -> (
    std::collections::BTreeMap<String, usize>,
    std::collections::BTreeMap<String, usize>,
) {
    let load = |dtype: WeightDtype| {
        Engine::load_with_drafter(dir, Some(drafter), &Device::Cpu, dtype).expect("load")
    };
    let (packed, dequantized) = (load(WeightDtype::Stored), load(DType::F32.into()));
    let name = dir.display();
    // up to 32 positions the few-row products; past them the prompt goes through `fgemm` over
    // panels dequantized as they are packed (the dequantized load's arithmetic), and the last
    // position's LM head through the few-row products again: 45 positions agree as `agree` says
    for len in [1, 5, 20, 32, 45] {
        let (a, b) = (
            logits(&packed, &prompt(len)),
            logits(&dequantized, &prompt(len)),
        );
        if agree == Agree::Bits {
            assert!(
                a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
                "{name}: logits after {len} prompt tokens differ from the dequantized load"
            );
        } else {
            let top = b.iter().fold(0f32, |m, v| m.max(v.abs()));
            let worst = a
                .iter()
                .zip(&b)
                .map(|(x, y)| (x - y).abs())
                .fold(0f32, f32::max);
            assert!(
                worst <= 1e-3 * top,
                "{name}: logits after {len} prompt tokens off by {worst} (largest {top})"
            );
        }
    }
    for len in [3, 17] {
        let p = prompt(len);
        let base = greedy(&dequantized, &p, None);
        assert_eq!(greedy(&packed, &p, None), base, "{name}");
        for k in [1, 3] {
            assert_eq!(greedy(&packed, &p, Some(k)), base, "{name}: MTP depth {k}");
        }
    }
    let (held, wide) = (packed.weights_held(), dequantized.weights_held());
    assert_eq!(
        wide.keys().collect::<Vec<_>>(),
        ["f32"],
        "{name}: the dequantized load holds f32 only"
    );
    (held, wide)
}

/// MLX 4-bit matrices kept packed (the default), the embedding included, compute what the same
/// checkpoint dequantized to f32 at load computes, target and companion drafter alike.
#[test]
fn packed_4bit_checkpoint_computes_what_its_dequantized_load_computes() {
    let (held, wide) = packed_same_as_dequantized(
        &fixture("tiny-mlx4"),
        &fixture("tiny-mlx4-mtp"),
        Agree::Close,
    );
    // every matrix held packed, the embedding included, in much less memory
    assert_eq!(held.keys().collect::<Vec<_>>(), ["q4"], "{held:?}");
    assert!(4 * held["q4"] < wide["f32"], "{held:?} / {wide:?}");
}

/// Scales and biases stored in bf16 (what mlx writes for a bf16 model) stay bf16 (widened
/// exactly inside the products), in less memory.
#[test]
fn packed_4bit_with_bf16_scales_keeps_them_in_bf16() {
    let dir = half_copy("tiny-mlx4", DType::BF16, false);
    let drafter = fixture("tiny-mlx4-mtp");
    let (held, _) = packed_same_as_dequantized(&dir, &drafter, Agree::Close);
    let (f32_scales, _) = packed_same_as_dequantized(&fixture("tiny-mlx4"), &drafter, Agree::Close);
    assert_eq!(held.keys().collect::<Vec<_>>(), ["q4"], "{held:?}");
    assert!(held["q4"] < f32_scales["q4"], "{held:?} / {f32_scales:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Widths whose values straddle words (3 and 6 bits) stay packed too.
#[test]
fn packed_3_and_6_bit_checkpoints_compute_what_their_dequantized_loads_compute() {
    for bits in [3, 6] {
        let (dir, drafter) = (
            fixture(&format!("tiny-mlx{bits}")),
            fixture(&format!("tiny-mlx{bits}-mtp")),
        );
        let (held, wide) = packed_same_as_dequantized(&dir, &drafter, Agree::Bits);
        let kind = format!("q{bits}");
        assert_eq!(held.keys().collect::<Vec<_>>(), [&kind], "{held:?}");
        assert!(4 * held[&kind] < wide["f32"], "{held:?} / {wide:?}");
    }
}

/// A tied LM head over a packed 4-bit embedding: the product reads the packed rows, and the
/// embedding is held once.
#[test]
fn packed_4bit_tied_embeddings_compute_what_their_dequantized_load_computes() {
    let dir = half_copy("tiny-mlx4", DType::F32, true);
    let (held, _) = packed_same_as_dequantized(&dir, &fixture("tiny-mlx4-mtp"), Agree::Close);
    assert_eq!(held.keys().collect::<Vec<_>>(), ["q4"], "{held:?}");
    let untied = Engine::load_with_drafter(
        &fixture("tiny-mlx4"),
        Some(&fixture("tiny-mlx4-mtp")),
        &Device::Cpu,
        WeightDtype::Stored,
    )
    .expect("load")
    .weights_held();
    // [256, 64] at 4 bits: 256 rows of 8 words, one f32 scale and bias each
    assert_eq!(untied["q4"] - held["q4"], 256 * (8 + 2) * 4, "{held:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// An MLX 4-bit MoE with mlx's mixed precision (8-bit routers, expert `down_proj` stacks left
/// unquantized because their 32 inputs are less than a group): packed expert stacks, 8-bit
/// routers and f32 stacks side by side compute what the dequantized load computes.
#[test]
fn packed_moe_checkpoint_computes_what_its_dequantized_load_computes() {
    let (held, wide) = packed_same_as_dequantized(
        &fixture("tiny-moe-mlx4"),
        &fixture("tiny-moe-mlx4-mtp"),
        Agree::Close,
    );
    assert_eq!(
        held.keys().collect::<Vec<_>>(),
        ["f32", "q4", "q8"],
        "{held:?}"
    );
    assert!(
        2 * held.values().sum::<usize>() < wide["f32"],
        "{held:?} / {wide:?}"
    );
}
