//! The tensor-name rule lives once, in `mtp-detect`: every namespace that detection reports as
//! an embedded MTP head (`mtp.`, `model.mtp.`, `language_model.mtp.`, ...) is the head the
//! engine loads, so detection's "head present" never meets the engine's "no drafter".

use std::path::{Path, PathBuf};

use candle_core::Device;
use mtp_engine::{Engine, GenerateOptions, WeightDtype};

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny-hf")
}

/// A copy of `tiny-hf` whose `mtp.*` tensors live under `prefix` instead.
fn renamed(prefix: &str, out: &Path) {
    let src = fixture();
    let tensors = candle_core::safetensors::load(src.join("model.safetensors"), &Device::Cpu)
        .expect("fixture weights");
    let renamed: std::collections::HashMap<String, candle_core::Tensor> = tensors
        .into_iter()
        .map(|(k, v)| match k.strip_prefix("mtp.") {
            Some(rest) => (format!("{prefix}{rest}"), v),
            None => (k, v),
        })
        .collect();
    candle_core::safetensors::save(&renamed, out.join("model.safetensors")).expect("save");
    for f in [
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        std::fs::copy(src.join(f), out.join(f)).expect("copy");
    }
}

#[test]
fn every_namespace_detection_accepts_is_the_head_the_engine_loads() {
    let prompt: Vec<u32> = "the quick brown fox ".bytes().map(u32::from).collect();
    let base = Engine::load(&fixture(), &Device::Cpu, WeightDtype::Stored).unwrap();
    let opts = GenerateOptions::greedy(24)
        .ignore_eos(true)
        .num_draft_tokens(2);
    let want = base.generate(&prompt, &opts, |_| true).unwrap();
    assert!(want.speculation.as_ref().is_some_and(|s| s.used));
    for prefix in mtp_detect::MTP_PREFIXES {
        let dir = tempfile::tempdir().unwrap();
        renamed(prefix, dir.path());
        // detection sees a head...
        let names: Vec<String> =
            candle_core::safetensors::load(dir.path().join("model.safetensors"), &Device::Cpu)
                .unwrap()
                .into_keys()
                .collect();
        let head = mtp_detect::mtp_tensor_names(names.iter().map(String::as_str), None);
        assert_eq!(head.len(), 15, "{prefix}: detection finds the head");
        // ...and the engine loads it and speculates with it, with the same output
        let e = Engine::load(dir.path(), &Device::Cpu, WeightDtype::Stored).unwrap();
        assert!(
            e.drafter().is_some(),
            "{prefix}: the engine loaded no drafter"
        );
        let got = e.generate(&prompt, &opts, |_| true).unwrap();
        assert_eq!(got.tokens, want.tokens, "{prefix}");
        let s = got.speculation.unwrap();
        assert!(s.used && s.stats.drafted > 0, "{prefix}");
    }
}
