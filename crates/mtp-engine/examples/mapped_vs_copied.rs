//! Decode speed of a half-precision checkpoint multiplied where it lies in the mapped file,
//! against the same weights copied into memory (`MTP_NO_MMAP`), loaded side by side and timed
//! alternately (medians).
//!
//! ```text
//! cargo xtask fixtures --out /tmp/big --dtype bf16 --hidden 2048 --layers 16 --intermediate 6144 --shard-mib 512
//! cargo run --release -p mtp-engine --example mapped_vs_copied -- /tmp/big 64 5
//! ```

use std::path::PathBuf;

use candle_core::Device;
use mtp_engine::{Engine, GenerateOptions, WeightDtype};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(
        args.next()
            .ok_or("usage: mapped_vs_copied DIR [TOKENS] [REPS]")?,
    );
    let tokens: usize = args.next().map_or(Ok(64), |s| s.parse())?;
    let reps: usize = args.next().map_or(Ok(5), |s| s.parse())?;
    std::env::remove_var("MTP_NO_MMAP");
    let mapped = Engine::load(&dir, &Device::Cpu, WeightDtype::Stored)?;
    std::env::set_var("MTP_NO_MMAP", "1");
    let copied = Engine::load(&dir, &Device::Cpu, WeightDtype::Stored)?;
    let prompt: Vec<u32> = (1..=64).collect();
    let opts = GenerateOptions::greedy(tokens).ignore_eos(true);
    let (mut a, mut b) = (Vec::new(), Vec::new());
    // a first run each pages the mapped weights in
    let first = mapped.generate(&prompt, &opts, |_| true)?.tokens;
    assert_eq!(
        first,
        copied.generate(&prompt, &opts, |_| true)?.tokens,
        "same tokens"
    );
    for _ in 0..reps {
        let order = if a.len() % 2 == 0 {
            [(&mapped, 0), (&copied, 1)]
        } else {
            [(&copied, 1), (&mapped, 0)]
        };
        for (engine, which) in order {
            let out = if which == 0 { &mut a } else { &mut b };
            let o = engine.generate(&prompt, &opts, |_| true)?;
            out.push(o.timings.decode_tokens_per_s.unwrap_or(0.0));
        }
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (ma, mb) = (med(&mut a), med(&mut b));
    println!(
        "decode tok/s, median of {reps}: mapped {ma:.2}, copied {mb:.2}, ratio {:.3}",
        ma / mb
    );
    Ok(())
}
