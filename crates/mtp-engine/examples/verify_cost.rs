//! What a verify forward costs against a plain single-token step: the time of `begin_verify`,
//! one forward of `l = 1..=5` tokens (logits at every position, as verify computes them) and
//! `commit_verify` keeping all `l`, at a given context length, next to a plain one-token
//! forward. As in the speculation loop, the verify starts from an earlier round's commit (whose
//! kept steps the forward settles); the cache is put back (untimed) after each repetition.
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
    // Only the forward (and, for verify, `begin_verify` and `commit_verify`) is timed; the
    // snapshot and restore that put the cache back between repetitions are not. A verify is
    // timed as it runs in the speculation loop: after an earlier, untimed verify and commit,
    // whose kept steps it settles.
    let mut time = |tokens: &[u32], verify: bool| -> Result<f64, Box<dyn std::error::Error>> {
        let snap = cache.snapshot();
        let forward = |cache: &mut mtp_engine::cache::SeqCache, tokens: &[u32]| {
            model.forward(
                std::slice::from_ref(&tokens.to_vec()),
                std::slice::from_mut(cache),
                LogitsAt::All,
            )
        };
        if verify {
            cache.begin_verify();
            forward(&mut cache, &[3 % vocab, 4 % vocab])?;
            cache.commit_verify(1);
        }
        let started = Instant::now();
        if verify {
            cache.begin_verify();
        }
        forward(&mut cache, tokens)?;
        if verify {
            cache.commit_verify(tokens.len());
        }
        let t = started.elapsed().as_secs_f64() * 1e6;
        cache.restore(&snap);
        Ok(t)
    };
    // Each repetition times a plain step and then every verify length, so that the ratios
    // compare neighbours in time (this machine's speed drifts); medians over repetitions.
    let lens = 5usize;
    let mut plain = Vec::with_capacity(reps);
    let mut ratios = vec![Vec::new(); lens];
    let mut micros = vec![Vec::new(); lens];
    for _ in 0..reps {
        let step = time(&[5 % vocab], false)?;
        plain.push(step);
        for l in 1..=lens {
            let tokens: Vec<u32> = (0..l as u32).map(|i| (5 + i) % vocab).collect();
            let us = time(&tokens, true)?;
            micros[l - 1].push(us);
            ratios[l - 1].push(us / step);
        }
    }
    println!("| forward | µs (median) | / plain step (median of paired ratios) |");
    println!("| --- | --- | --- |");
    println!("| plain step (1 token) | {:.1} | 1.00 |", median(plain));
    for (l, (us, r)) in micros.into_iter().zip(ratios).enumerate() {
        println!(
            "| verify of {} | {:.1} | {:.2} |",
            l + 1,
            median(us),
            median(r)
        );
    }
    Ok(())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}
