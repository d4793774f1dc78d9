//! Peak resident memory of loading a checkpoint, against the size of its weights.
//!
//! ```text
//! cargo xtask fixtures --out /tmp/big --dtype bf16 --hidden 2048 --layers 16 --intermediate 6144 --shard-mib 512
//! cargo run --release -p mtp-engine --example load_rss -- /tmp/big
//! ```
//!
//! Prints the safetensors bytes, the process's peak RSS (`VmHWM`) before and after `Engine::load`,
//! the RSS once loaded, the peak after generating a few tokens (every weight read once), and
//! both peaks over the weights.

use std::path::PathBuf;

use candle_core::Device;
use mtp_engine::{Engine, WeightDtype};

fn status_kib(key: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = PathBuf::from(std::env::args().nth(1).ok_or("usage: load_rss DIR")?);
    let files = mtp_engine::loader::safetensors_files(&dir)?;
    let bytes: u64 = files
        .iter()
        .map(|f| std::fs::metadata(f).map(|m| m.len()).unwrap_or(0))
        .sum();
    let before = status_kib("VmHWM:") * 1024;
    let t = std::time::Instant::now();
    let engine = Engine::load(&dir, &Device::Cpu, WeightDtype::Stored)?;
    let secs = t.elapsed().as_secs_f64();
    let peak = status_kib("VmHWM:") * 1024;
    let now = status_kib("VmRSS:") * 1024;
    // one prompt and a few tokens: every weight is read once
    let t = std::time::Instant::now();
    let opts = mtp_engine::GenerateOptions::greedy(4).ignore_eos(true);
    engine.generate(&[1, 2, 3, 4, 5, 6, 7, 8], &opts, |_| true)?;
    let gen_secs = t.elapsed().as_secs_f64();
    let after = status_kib("VmHWM:") * 1024;
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    println!("checkpoint      {} ({} files)", dir.display(), files.len());
    println!("weights         {:.0} MiB", mib(bytes));
    println!("held            {:?}", engine.weights_held());
    println!("peak RSS before {:.0} MiB", mib(before));
    println!("peak RSS load   {:.0} MiB", mib(peak));
    println!("RSS loaded      {:.0} MiB", mib(now));
    println!("peak RSS after a generation {:.0} MiB", mib(after));
    println!(
        "load peak / weights = {:.3} ({:.2} s); after generating = {:.3} ({:.2} s)",
        peak as f64 / bytes as f64,
        secs,
        after as f64 / bytes as f64,
        gen_secs
    );
    Ok(())
}
