//! Real layouts: headers recorded from checkpoints that the reference tools wrote (see
//! `tests/fixtures/mlx-vlm-0.7.10/README.md`), rebuilt here with zero-filled data.

mod common;

use std::path::{Path, PathBuf};

use common::cache_snapshot;
use mtp_detect::{
    check_drafter, probe, probe_local, CacheConfig, MtpStyle, ProbeOptions, Reason, Registry, Role,
    Runtime, Verdict,
};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/mlx-vlm-0.7.10")
        .join(name)
}

/// Copies a recorded fixture into `dst`, rebuilding `model.safetensors` from its header.
fn rebuild(name: &str, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    let src = fixture(name);
    for f in ["config.json", "model.safetensors.index.json"] {
        if src.join(f).exists() {
            std::fs::copy(src.join(f), dst.join(f)).unwrap();
        }
    }
    let header = std::fs::read(src.join("model.safetensors.header.json")).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&header).unwrap();
    let data_len = v
        .as_object()
        .unwrap()
        .values()
        .filter_map(|t| t.get("data_offsets").and_then(|o| o[1].as_u64()))
        .max()
        .unwrap_or(0);
    let json = serde_json::to_vec(&v).unwrap();
    let mut file = (json.len() as u64).to_le_bytes().to_vec();
    file.extend(&json);
    file.resize(file.len() + data_len as usize, 0);
    std::fs::write(dst.join("model.safetensors"), file).unwrap();
}

#[test]
fn make_tiny_hf_checkpoint_carries_the_head() {
    let dir = tempfile::tempdir().unwrap();
    rebuild("hf", dir.path());
    let r = probe_local(dir.path()).unwrap();
    assert!(r.mtp_head);
    assert_eq!(r.mtp_layers, 1);
    assert_eq!(r.mtp_tensor_count, 15);
    assert_eq!(r.mtp_style, Some(MtpStyle::MtpPrefix));
    assert_eq!(r.mtp_dtypes, vec!["F32".to_string()]);
    assert!(!r.mlx_affine_quantized);
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
    assert!(r.runtime(Runtime::Native).unwrap().can_run_mtp);
    assert!(r.runtime(Runtime::Vllm).unwrap().can_run_mtp);
}

#[test]
fn mlx_4bit_conversion_drops_the_head_but_keeps_the_claim() {
    let dir = tempfile::tempdir().unwrap();
    rebuild("mlx4", dir.path());
    let r = probe_local(dir.path()).unwrap();
    assert!(!r.mtp_head, "{r:#?}");
    assert!(r.config_claims_mtp);
    assert_eq!(
        r.config_claim.as_deref(),
        Some("text_config.mtp_num_hidden_layers = 1")
    );
    assert!(r
        .warnings
        .iter()
        .any(|w| w.contains("carry no MTP tensors")));
}

#[test]
fn mlx_drafter_is_a_quantized_companion_that_fits_its_target() {
    let d = tempfile::tempdir().unwrap();
    let t = tempfile::tempdir().unwrap();
    rebuild("mlx4-mtp", d.path());
    rebuild("mlx4", t.path());
    let r = probe_local(d.path()).unwrap();
    assert_eq!(r.role, Role::Drafter);
    assert!(r.mtp_head);
    assert!(r.mlx_affine_quantized);
    assert_eq!(r.mtp_style, Some(MtpStyle::Drafter));
    let info = check_drafter(t.path(), d.path()).unwrap();
    assert_eq!(info.model_type, "qwen3_5_mtp");
    assert_eq!(info.hidden_size, 64);
    assert_eq!(info.block_size, Some(3));
    assert_eq!(info.config_depth, Some(2));
    assert!(info.mlx_affine_quantized);
    // The HF target fits the same drafter (same hidden size and vocabulary).
    let hf = tempfile::tempdir().unwrap();
    rebuild("hf", hf.path());
    assert!(check_drafter(hf.path(), d.path()).is_ok());
}

/// The whole companion flow on recorded layouts: a registered target without a head, its
/// drafter absent, then present in the cache.
#[test]
fn registered_target_resolves_its_companion_through_the_cache() {
    let cache = tempfile::tempdir().unwrap();
    let reg_file = cache.path().join("caps.json");
    std::fs::write(
        &reg_file,
        r#"{"models":[{"id":"tiny-qwen3.5","family":"test","targets":["test/tiny-4bit"],
            "speculation":{"drafter":"test/tiny-MTP-4bit","default_depth":2,"status":"tested",
            "output_preserving":true,"speedup":null,"evidence":"recorded fixture"}}]}"#,
    )
    .unwrap();
    let mut opts = ProbeOptions::offline(CacheConfig::new(cache.path()));
    opts.registry = Some(Registry::with_user_file(&reg_file).unwrap());
    rebuild(
        "mlx4",
        &cache_snapshot(cache.path(), "test/tiny-4bit", "c0ffee"),
    );

    let r = probe("test/tiny-4bit", &opts).unwrap();
    let native = r.runtime(Runtime::Native).unwrap();
    assert_eq!(native.verdict, Verdict::CompanionNotCached);
    assert_eq!(native.reason, Some(Reason::MtpHeadNotCached));
    assert!(native
        .note
        .contains("`mtp models download test/tiny-MTP-4bit`"));

    rebuild(
        "mlx4-mtp",
        &cache_snapshot(cache.path(), "test/tiny-MTP-4bit", "beef"),
    );
    let r = probe("test/tiny-4bit", &opts).unwrap();
    let native = r.runtime(Runtime::Native).unwrap();
    assert_eq!(native.verdict, Verdict::CompanionReady, "{native:?}");
    match r.lane(Runtime::Native) {
        mtp_contract::Lane::Ready {
            drafter,
            default_depth,
            ..
        } => {
            assert_eq!(drafter, "test/tiny-MTP-4bit");
            assert_eq!(default_depth, 2);
        }
        other => panic!("{other:?}"),
    }
}
