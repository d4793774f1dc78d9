//! Sharded checkpoints, as published ones are laid out: `model.safetensors.index.json` naming
//! several `model-0000i-of-0000n.safetensors` files. Loading them gives the model of the single
//! file, with and without MTP; a broken layout is an error naming the file at fault.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use mtp_engine::{Engine, GenerateOptions, WeightDtype};

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny-hf")
}

fn copy_configs(out: &Path) {
    for f in [
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        std::fs::copy(fixture().join(f), out.join(f)).expect("copy");
    }
}

/// `tiny-hf` in `shards` files (tensors dealt round-robin), in `dtype`, with its index.
fn sharded(out: &Path, shards: usize, dtype: DType) -> HashMap<String, String> {
    let tensors = candle_core::safetensors::load(fixture().join("model.safetensors"), &Device::Cpu)
        .expect("fixture");
    let mut names: Vec<&String> = tensors.keys().collect();
    names.sort();
    let mut parts: Vec<HashMap<String, Tensor>> = vec![HashMap::new(); shards];
    let mut map = HashMap::new();
    for (i, name) in names.into_iter().enumerate() {
        let file = format!("model-{:05}-of-{shards:05}.safetensors", i % shards + 1);
        parts[i % shards].insert(name.clone(), tensors[name].to_dtype(dtype).unwrap());
        map.insert(name.clone(), file);
    }
    for (i, part) in parts.iter().enumerate() {
        let file = out.join(format!("model-{:05}-of-{shards:05}.safetensors", i + 1));
        candle_core::safetensors::save(part, file).expect("save shard");
    }
    let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": map});
    std::fs::write(out.join("model.safetensors.index.json"), index.to_string()).unwrap();
    copy_configs(out);
    map
}

fn greedy(e: &Engine, depth: Option<usize>) -> Vec<u32> {
    let prompt: Vec<u32> = "the quick brown fox ".bytes().map(u32::from).collect();
    let mut opts = GenerateOptions::greedy(24).ignore_eos(true);
    if let Some(d) = depth {
        opts = opts.num_draft_tokens(d);
    }
    e.generate(&prompt, &opts, |_| true).unwrap().tokens
}

#[test]
fn shards_load_as_the_single_file() {
    let single = Engine::load(&fixture(), &Device::Cpu, WeightDtype::Stored).unwrap();
    let want = greedy(&single, None);
    for dtype in [DType::F32, DType::BF16] {
        let dir = tempfile::tempdir().unwrap();
        sharded(dir.path(), 3, dtype);
        let e = Engine::load(dir.path(), &Device::Cpu, WeightDtype::Stored).unwrap();
        assert!(
            e.drafter().is_some(),
            "{dtype:?}: the head across shards is loaded"
        );
        let held = e.weights_held();
        assert_eq!(
            held.keys().collect::<Vec<_>>(),
            [dtype.as_str()],
            "{held:?}"
        );
        let got = greedy(&e, None);
        if dtype == DType::F32 {
            assert_eq!(got, want, "f32 shards = the single file");
        }
        assert_eq!(
            greedy(&e, Some(2)),
            got,
            "{dtype:?}: MTP keeps greedy output"
        );
    }
}

#[test]
fn broken_layouts_name_the_file() {
    // a shard the index names is missing
    let dir = tempfile::tempdir().unwrap();
    sharded(dir.path(), 2, DType::F32);
    std::fs::remove_file(dir.path().join("model-00002-of-00002.safetensors")).unwrap();
    let err = Engine::load(dir.path(), &Device::Cpu, WeightDtype::Stored)
        .unwrap_err()
        .to_string();
    assert!(err.contains("model-00002-of-00002.safetensors"), "{err}");

    // a truncated shard
    let dir = tempfile::tempdir().unwrap();
    sharded(dir.path(), 2, DType::F32);
    let f = dir.path().join("model-00001-of-00002.safetensors");
    let len = std::fs::metadata(&f).unwrap().len();
    let file = std::fs::OpenOptions::new().write(true).open(&f).unwrap();
    file.set_len(len - 100).unwrap();
    let err = Engine::load(dir.path(), &Device::Cpu, WeightDtype::Stored)
        .unwrap_err()
        .to_string();
    assert!(err.contains("model-00001-of-00002.safetensors"), "{err}");

    // the same tensor in two shards
    let dir = tempfile::tempdir().unwrap();
    let map = sharded(dir.path(), 2, DType::F32);
    let (name, file) = map
        .iter()
        .find(|(_, f)| f.starts_with("model-00001"))
        .unwrap();
    let mut other = candle_core::safetensors::load(
        dir.path().join("model-00002-of-00002.safetensors"),
        &Device::Cpu,
    )
    .unwrap();
    let t =
        candle_core::safetensors::load(dir.path().join(file), &Device::Cpu).unwrap()[name].clone();
    other.insert(name.clone(), t);
    candle_core::safetensors::save(&other, dir.path().join("model-00002-of-00002.safetensors"))
        .unwrap();
    let err = Engine::load(dir.path(), &Device::Cpu, WeightDtype::Stored)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("more than one file") && err.contains(name.as_str()),
        "{err}"
    );

    // an index that is not JSON, has no weight_map, or names a file outside the folder
    for text in [
        "{",
        r#"{"metadata": {}}"#,
        r#"{"weight_map": {"a": "../../etc/passwd"}}"#,
        r#"{"weight_map": {"a": "/etc/passwd"}}"#,
        r#"{"weight_map": {"a": "C:model.safetensors"}}"#,
        r#"{"weight_map": {"a": 5}}"#,
    ] {
        let dir = tempfile::tempdir().unwrap();
        sharded(dir.path(), 2, DType::F32);
        std::fs::write(dir.path().join("model.safetensors.index.json"), text).unwrap();
        let err = Engine::load(dir.path(), &Device::Cpu, WeightDtype::Stored)
            .unwrap_err()
            .to_string();
        assert!(err.contains("model.safetensors.index.json"), "{err}");
    }
}
