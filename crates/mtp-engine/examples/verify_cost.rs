//! What a verify forward costs against a plain single-token step: the mean time of one
//! recorded forward of `l = 1..=5` tokens (logits at every position, as verify computes them,
//! with `begin_verify`'s state copy) at a given context length, next to an unrecorded
//! one-token forward; the cache is put back (untimed) after each repetition.
//!
//! ```text
//! cargo run --release -p mtp-engine --example verify_cost -- models/tiny-code 64 3000
//! ```
//! Arguments: checkpoint, context length, repetitions per `l`.

use std::path::PathBuf;
use std::time::Instant;

use candle_core::{DType, Device};
use mtp_engine::{Engine, LogitsAt};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(args.next().unwrap_or_else(|| "models/tiny-code".into()));
    let ctx: usize = args.next().map_or(Ok(64), |s| s.parse())?;
    let reps: usize = args.next().map_or(Ok(1000), |s| s.parse())?;
    let engine = Engine::load(&dir, &Device::Cpu, DType::F32)?;
    let model = engine.model();
    let vocab = model.vocab_size() as u32;
    let mut cache = model.new_cache();
    let prompt: Vec<u32> = (0..ctx as u32).map(|i| 2 + i % (vocab - 2)).collect();
    model.forward(&[prompt], std::slice::from_mut(&mut cache), LogitsAt::Last)?;
    // Only the forward (and, for verify, `begin_verify`'s state copy) is timed; the snapshot
    // and restore that put the cache back between repetitions are not.
    let mut time = |tokens: &[u32], verify: bool| -> Result<f64, Box<dyn std::error::Error>> {
        let mut total = 0.0;
        for _ in 0..reps {
            let snap = cache.snapshot();
            let started = Instant::now();
            if verify {
                cache.begin_verify();
            }
            model.forward(
                std::slice::from_ref(&tokens.to_vec()),
                std::slice::from_mut(&mut cache),
                LogitsAt::All,
            )?;
            total += started.elapsed().as_secs_f64();
            cache.restore(&snap);
        }
        Ok(total * 1e6 / reps as f64)
    };
    let step = time(&[5 % vocab], false)?;
    println!("| forward | µs | / plain step |");
    println!("| --- | --- | --- |");
    println!("| plain step (1 token) | {step:.1} | 1.00 |");
    for l in 1..=5u32 {
        let tokens: Vec<u32> = (0..l).map(|i| (5 + i) % vocab).collect();
        let us = time(&tokens, true)?;
        println!("| verify of {l} | {us:.1} | {:.2} |", us / step);
    }
    Ok(())
}
