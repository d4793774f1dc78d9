//! The engine's public safe entry points that reach its `unsafe` kernels check every length they
//! rely on: a wrong length is a typed error (or, for the bare `nn::attention` kernel, a panic
//! that names the length at fault), never a read past a slice's end.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;

use candle_core::{DType, Device, Tensor};
use mtp_engine::config::ModelConfig;
use mtp_engine::loader::{Checkpoint, Param};
use mtp_engine::nn::Positions;
use mtp_engine::nn::{attention, AttentionShape, Linear, Store};
use mtp_engine::qwen3_5::DecoderLayer;
use mtp_engine::{Error, KvType, WeightDtype};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name)
}

fn values(n: usize) -> Vec<f32> {
    (0..n).map(|i| ((i % 13) as f32 - 6.0) / 13.0).collect()
}

/// A `[4, 8]` layer in each dtype a dense layer holds.
fn dense_layers() -> Vec<(&'static str, Linear)> {
    let w = Tensor::from_vec(values(32), (4, 8), &Device::Cpu).unwrap();
    ["f32", "bf16", "f16"]
        .into_iter()
        .zip([DType::F32, DType::BF16, DType::F16])
        .map(|(name, dt)| (name, Linear::dense(w.to_dtype(dt).unwrap())))
        .collect()
}

/// A `[4, 64]` layer kept packed at 4 bits (MLX affine, groups of 32), as a checkpoint's
/// `weight` / `scales` / `biases` / `bits` tensors give it.
fn packed_layer() -> Linear {
    let cpu = &Device::Cpu;
    let words: Vec<u32> = (0..4 * 8)
        .map(|i| (i as u32).wrapping_mul(2654435761))
        .collect();
    let mut map: HashMap<String, Param> = HashMap::new();
    map.insert(
        "p.weight".into(),
        Tensor::from_vec(words, (4, 8), cpu).unwrap().into(),
    );
    map.insert(
        "p.scales".into(),
        Tensor::from_vec(vec![0.01f32; 8], (4, 2), cpu)
            .unwrap()
            .into(),
    );
    map.insert(
        "p.biases".into(),
        Tensor::from_vec(vec![-0.05f32; 8], (4, 2), cpu)
            .unwrap()
            .into(),
    );
    map.insert("p.bits".into(), Tensor::new(4u32, cpu).unwrap().into());
    let mut st = Store::new(map, "qwen3_5", WeightDtype::Stored, cpu);
    let l = st.linear("p", 4, 64).unwrap();
    assert_eq!(l.held().0, "q4", "kept packed");
    l
}

fn assert_shape_error(got: mtp_engine::Result<Vec<f32>>, what: &str) {
    match got {
        Err(Error::ShapeMismatch { name, .. }) => assert!(name.contains(what), "{name}"),
        other => panic!("expected a shape error naming {what}, got {other:?}"),
    }
}

/// `Linear::forward` with an input that is not `n` rows of the layer's width is a typed error
/// on every weight kind, on both sides of the few-row kernels' limit (32 rows) and for counts
/// whose product overflows, never a read past the input.
#[test]
fn linear_forward_checks_the_input_length() {
    let mut layers = dense_layers();
    layers.push(("packed", packed_layer()));
    for (kind, layer) in &layers {
        let inp = if *kind == "packed" { 64 } else { 8 };
        for n in [1usize, 2, 32, 33, 100] {
            // the exact length works
            let y = layer.forward(&values(n * inp), n).unwrap();
            assert_eq!(y.len(), n * 4, "{kind}, {n} rows");
            // one float short, one long, and a single float for many rows
            for len in [n * inp - 1, n * inp + 1, 1] {
                assert_shape_error(layer.forward(&values(len), n), "linear layer");
            }
        }
        // the case: one float claimed to be 33 rows
        assert_shape_error(layer.forward(&[0.0], 33), "linear layer");
        // a row count whose product with the width overflows
        assert_shape_error(layer.forward(&values(8), usize::MAX / 2), "linear layer");
        // no rows: nothing to read, nothing returned
        assert!(layer.forward(&[], 0).unwrap().is_empty());
    }
}

/// A mapped bf16 matrix (multiplied where it lies in the file) checks the input the same way.
#[test]
fn mapped_linear_forward_checks_the_input_length() {
    let dir = tempfile::tempdir().unwrap();
    let w = Tensor::from_vec(values(4 * 8), (4, 8), &Device::Cpu)
        .unwrap()
        .to_dtype(DType::BF16)
        .unwrap();
    let tensors = HashMap::from([("p.weight".to_string(), w)]);
    candle_core::safetensors::save(&tensors, dir.path().join("model.safetensors")).unwrap();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let layer = Linear::mapped(ckpt.mapped("p.weight").unwrap());
    for n in [1usize, 33] {
        assert_eq!(layer.forward(&values(n * 8), n).unwrap().len(), n * 4);
        assert_shape_error(layer.forward(&values(n * 8 - 1), n), "linear layer");
    }
    assert_shape_error(layer.forward(&[0.0], 33), "linear layer");
    assert!(layer.rows(&[4]).is_err(), "row 4 of 4 rows");
}

/// A decoder layer of the tiny checkpoint checks its input rows, caches and positions.
#[test]
fn decoder_layer_forward_checks_its_inputs() {
    let dir = fixture("tiny-hf");
    let cfg = ModelConfig::load(&dir).unwrap();
    let ckpt = Checkpoint::open(&dir).unwrap();
    let s = mtp_engine::qwen3_5::sanitize(&ckpt, &cfg).unwrap();
    let mut st = Store::new(s.target, &cfg.model_type, WeightDtype::Stored, &Device::Cpu);
    let d = cfg.text.hidden_size;
    for i in 0..cfg.text.num_hidden_layers {
        let layer = DecoderLayer::load(
            &mut st,
            &cfg,
            &format!("layers.{i}"),
            cfg.is_full_attention(i),
            cfg.is_moe_layer(i),
        )
        .unwrap();
        // (every KV cache type checks the same)
        let kv = [KvType::F32, KvType::F16, KvType::Bf16][i % 3];
        let mut cache = layer.new_cache(kv);
        // three positions of one sequence work
        let y = layer
            .forward(
                &values(3 * d),
                1,
                3,
                &mut [&mut cache],
                &[Positions::From(0)],
            )
            .unwrap();
        assert_eq!(y.len(), 3 * d);
        // a row short
        assert_shape_error(
            layer.forward(
                &values(3 * d - 1),
                1,
                3,
                &mut [&mut cache],
                &[Positions::From(3)],
            ),
            "decoder layer",
        );
        // two sequences claimed, one cache and one position given
        let err = layer
            .forward(
                &values(2 * d),
                2,
                1,
                &mut [&mut cache],
                &[Positions::From(3)],
            )
            .unwrap_err();
        assert!(matches!(err, Error::InvalidRequest(_)), "{err:?}");
        // position ids that do not cover the new tokens
        if cfg.is_full_attention(i) {
            let ids = [[3usize; 3]; 2];
            let err = layer
                .forward(
                    &values(3 * d),
                    1,
                    3,
                    &mut [&mut cache],
                    &[Positions::Each(&ids)],
                )
                .unwrap_err();
            assert!(matches!(err, Error::InvalidRequest(_)), "{err:?}");
        }
        // the last-position form
        assert_shape_error(
            layer.forward_last(&values(d + 1), 1, &mut cache, 3),
            "decoder layer",
        );
        assert_shape_error(
            layer.forward_last(&[0.0], 33, &mut cache, 3),
            "decoder layer",
        );
    }
}

/// The bare attention kernel panics with a message naming the length at fault.
#[test]
fn attention_names_the_wrong_length() {
    let (l, h, hkv, hd, t) = (2, 4, 2, 8, 5);
    let q = values(l * h * hd);
    let kv = values(t * hkv * hd);
    assert_eq!(
        attention(
            &q,
            &kv,
            &kv,
            AttentionShape {
                l,
                h,
                hkv,
                hd,
                scale: 0.3
            }
        )
        .len(),
        l * h * hd
    );
    type Case<'a> = (&'a str, &'a [f32], &'a [f32], &'a [f32], usize, usize);
    let cases: [Case; 5] = [
        ("the queries hold", &q[1..], &kv, &kv, l, h),
        (
            "are not the same whole positions",
            &q,
            &kv[1..],
            &kv[1..],
            l,
            h,
        ),
        (
            "are not the same whole positions",
            &q,
            &kv,
            &kv[hkv * hd..],
            l,
            h,
        ),
        ("cached positions for", &values(6 * h * hd), &kv, &kv, 6, h),
        ("heads over", &q, &kv, &kv, l, 3),
    ];
    for (want, q, k, v, l, h) in cases {
        let err = catch_unwind(AssertUnwindSafe(|| {
            attention(
                q,
                k,
                v,
                AttentionShape {
                    l,
                    h,
                    hkv,
                    hd,
                    scale: 0.3,
                },
            )
        }))
        .expect_err(want);
        let msg = err
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| err.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        assert!(msg.starts_with("attention:") && msg.contains(want), "{msg}");
    }
}
