//! Times local probes (goal: under 20 ms each). Prints medians; asserts nothing.
//!
//! `cargo run --release -p mtp-detect --example probe_bench [OUT_DIR]`
//!
//! Builds three artifacts in a temporary directory (or `OUT_DIR`, kept for `cargo xtask
//! probe`): a sharded Qwen3.5 safetensors checkpoint with an `mtp.*` head and 48 layers, a
//! qwen35 GGUF with a 150k-token vocabulary in its metadata and a NextN block, and the
//! mlx-community-style checkpoint whose config claims a head its weights lack.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::*;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let keep = std::env::args().nth(1).map(std::path::PathBuf::from);
    let tmp = tempfile::tempdir().expect("temp dir");
    let root = keep.clone().unwrap_or_else(|| tmp.path().to_path_buf());

    let st_dir = root.join("qwen3_5-mtp-sharded");
    let mut names = qwen_base_names(48);
    names.extend(qwen_mtp_names());
    write_checkpoint(
        &st_dir,
        &qwen_config(4096, 151_936, 48, Some(1)),
        &names,
        safetensors::Dtype::BF16,
        true,
    );

    let claim_dir = root.join("claims-without-head");
    write_checkpoint(
        &claim_dir,
        &qwen_config(4096, 151_936, 48, Some(1)),
        &qwen_base_names(48),
        safetensors::Dtype::BF16,
        false,
    );

    std::fs::create_dir_all(&root).expect("out dir");
    let gguf = root.join("qwen35-Q4_K_M.gguf");
    let mut w = qwen35_gguf("qwen35", 64, 1, true, true);
    w.kv.insert(
        5,
        (
            "tokenizer.ggml.tokens".into(),
            V::Arr(
                8,
                (0..150_000).map(|i| V::Str(format!("token{i}"))).collect(),
            ),
        ),
    );
    w.write(&gguf);

    println!("local probe timings (median of 21 runs, after one warm-up):");
    for (label, path) in [
        ("safetensors, sharded index", st_dir.as_path()),
        ("safetensors, config claim only", claim_dir.as_path()),
        ("gguf, 150k-token metadata", gguf.as_path()),
    ] {
        let first = mtp_detect::probe_local(path).expect("probe");
        let mut times = Vec::new();
        for _ in 0..21 {
            let t = Instant::now();
            let r = mtp_detect::probe_local(path).expect("probe");
            times.push(t.elapsed());
            std::hint::black_box(r);
        }
        let m = median(times);
        println!(
            "  {label:<32} {:>8.2} ms  (head: {}, {} bytes read){}",
            m.as_secs_f64() * 1e3,
            first.mtp_head,
            first.bytes_read,
            if m < Duration::from_millis(20) {
                ""
            } else {
                "  over the 20 ms goal"
            }
        );
    }
    if let Some(k) = keep {
        println!("artifacts kept in {}", k.display());
    }
}
