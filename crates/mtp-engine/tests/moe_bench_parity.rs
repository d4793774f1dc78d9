//! Parity with mlx-vlm 0.7.10 on the MoE benchmark shape (`cargo xtask fixtures --moe`: 0.73B
//! parameters, 256 experts, the real 248k vocabulary), too large to ship as a fixture: the
//! checkpoints and their goldens are made locally and named by `MTP_MOE_BENCH` (directories
//! separated by `:`), each holding a `golden.json` (and optionally `golden_long.json`) written
//! by `tests/fixtures/make_goldens.py`:
//!
//! ```text
//! cargo xtask fixtures --moe --out /tmp/moe
//! mlx_vlm.convert --hf-path /tmp/moe --mlx-path /tmp/moe-q4 -q --q-bits 4 --mtp --mtp-output /tmp/moe-q4-mtp
//! python tests/fixtures/make_goldens.py /tmp/moe 64
//! python tests/fixtures/make_goldens.py /tmp/moe-q4 64 --drafter /tmp/moe-q4-mtp [--long]
//! MTP_MOE_BENCH=/tmp/moe:/tmp/moe-q4 cargo test --release -p mtp-engine --test moe_bench_parity -- --ignored
//! ```
//!
//! Checks as `tests/parity.rs` does: first-step logits within 1e-3 of mlx-vlm's and 64 greedy
//! tokens identical for every prompt, the weights as stored (4-bit packed) and converted to f32.

use std::path::{Path, PathBuf};

use mtp_engine::{Engine, GenerateOptions, WeightDtype};

struct Golden {
    prompt_ids: Vec<Vec<u32>>,
    first_logits: Vec<Vec<f32>>,
    off: Vec<Vec<u32>>,
}

fn golden(path: &Path) -> Option<Golden> {
    let text = std::fs::read_to_string(path).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).expect("golden json");
    let rows = |k: &str| -> Vec<Vec<f64>> {
        v[k].as_array()
            .expect(k)
            .iter()
            .map(|r| {
                r.as_array()
                    .expect("row")
                    .iter()
                    .map(|x| x.as_f64().expect("number"))
                    .collect()
            })
            .collect()
    };
    let ids = |k: &str| -> Vec<Vec<u32>> {
        rows(k)
            .into_iter()
            .map(|r| r.into_iter().map(|x| x as u32).collect())
            .collect()
    };
    Some(Golden {
        prompt_ids: ids("prompt_ids"),
        first_logits: rows("first_logits")
            .into_iter()
            .map(|r| r.into_iter().map(|x| x as f32).collect())
            .collect(),
        off: ids("off"),
    })
}

fn check(dir: &Path, dtype: WeightDtype) {
    let engine = Engine::load(dir, &candle_core::Device::Cpu, dtype).expect("load");
    for file in ["golden.json", "golden_long.json"] {
        let Some(g) = golden(&dir.join(file)) else {
            continue;
        };
        let mut worst = 0f32;
        for (i, ids) in g.prompt_ids.iter().enumerate() {
            let logits = engine.prompt_logits(ids).expect("logits");
            assert_eq!(logits.len(), g.first_logits[i].len());
            let delta = logits
                .iter()
                .zip(&g.first_logits[i])
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            worst = worst.max(delta);
            assert!(
                delta < 1e-3,
                "{} {dtype:?} {file} prompt {i}: max |logit delta| {delta}",
                dir.display()
            );
            let opts = GenerateOptions::greedy(g.off[i].len()).ignore_eos(true);
            let out = engine.generate(ids, &opts, |_| true).expect("generate");
            assert_eq!(
                out.tokens,
                g.off[i],
                "{} {dtype:?} {file} prompt {i}: greedy tokens differ",
                dir.display()
            );
        }
        eprintln!(
            "{} ({dtype:?}, {file}): max |logit delta| {worst:.2e}, {} prompts x {} tokens identical",
            dir.display(),
            g.prompt_ids.len(),
            g.off.first().map_or(0, Vec::len)
        );
    }
}

#[test]
#[ignore = "needs the MoE benchmark checkpoints and their mlx-vlm goldens (MTP_MOE_BENCH), made locally: see the file's doc"]
fn moe_bench_shape_matches_mlx_vlm() {
    let dirs = std::env::var("MTP_MOE_BENCH")
        .expect("MTP_MOE_BENCH: checkpoint directories separated by `:`");
    for dir in dirs.split(':').filter(|d| !d.is_empty()).map(PathBuf::from) {
        assert!(
            dir.join("golden.json").is_file(),
            "{}: no golden.json",
            dir.display()
        );
        check(&dir, WeightDtype::Stored);
        check(&dir, candle_core::DType::F32.into());
    }
}
