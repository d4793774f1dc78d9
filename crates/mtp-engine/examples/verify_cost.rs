//! What a verify forward costs against a plain single-token step: the time of `begin_verify`,
//! one forward of `l = 1..=5` tokens (logits at every position, as verify computes them) and
//! `commit_verify` keeping all `l`, at a given context length, next to a plain one-token
//! forward, for each way of rolling linear-attention states back (`cache::VerifyMode`:
//! `Deferred` leaves the state and settles kept steps in the next forward, `Backup` advances
//! it with a copy). As in the speculation loop after a fully accepted depth-1 round, each
//! verify starts from an earlier verify of two positions that kept both (whose steps a
//! `Deferred` forward settles); the cache is put back (untimed) after each repetition.
//!
//! ```text
//! cargo run --release -p mtp-engine --example verify_cost -- models/tiny-code 64 3000
//! ```
//! Arguments: checkpoint, context length, repetitions per `l`.

use std::path::PathBuf;
use std::time::Instant;

use candle_core::Device;
use mtp_engine::cache::{SeqCache, VerifyMode};
use mtp_engine::{Engine, LogitsAt, WeightDtype};

const MODES: [VerifyMode; 2] = [VerifyMode::Deferred, VerifyMode::Backup];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(args.next().unwrap_or_else(|| "models/tiny-code".into()));
    let ctx: usize = args.next().map_or(Ok(64), |s| s.parse())?;
    let reps: usize = args.next().map_or(Ok(1000), |s| s.parse())?;
    let engine = Engine::load(&dir, &Device::Cpu, WeightDtype::Stored)?;
    let model = engine.model();
    let vocab = model.vocab_size() as u32;
    let mut cache = model.new_cache();
    let prompt: Vec<u32> = (0..ctx as u32).map(|i| 2 + i % (vocab - 2)).collect();
    model.forward(&[prompt], std::slice::from_mut(&mut cache), LogitsAt::Last)?;
    // Only the forward (and, for verify, `begin_verify` and `commit_verify`) is timed; the
    // snapshot and restore that put the cache back between repetitions are not.
    let snap = cache.snapshot();
    let mut time =
        |tokens: &[u32], mode: Option<VerifyMode>| -> Result<f64, Box<dyn std::error::Error>> {
            let forward = |cache: &mut SeqCache, tokens: &[u32]| {
                model.forward(
                    std::slice::from_ref(&tokens.to_vec()),
                    std::slice::from_mut(cache),
                    LogitsAt::All,
                )
            };
            if let Some(mode) = mode {
                cache.set_verify_mode(mode);
                cache.begin_verify();
                forward(&mut cache, &[3 % vocab, 4 % vocab])?;
                cache.commit_verify(2);
            }
            let started = Instant::now();
            if mode.is_some() {
                cache.begin_verify();
            }
            forward(&mut cache, tokens)?;
            if mode.is_some() {
                cache.commit_verify(tokens.len());
            }
            let t = started.elapsed().as_secs_f64() * 1e6;
            cache.restore(&snap);
            Ok(t)
        };
    // Each repetition times a plain step and then every verify length in every mode, so that
    // the ratios compare neighbours in time (this machine's speed drifts); medians over
    // repetitions.
    let lens = 5usize;
    let mut plain = Vec::with_capacity(reps);
    let mut ratios = vec![vec![Vec::new(); MODES.len()]; lens];
    for _ in 0..reps {
        let step = time(&[5 % vocab], None)?;
        plain.push(step);
        for l in 1..=lens {
            let tokens: Vec<u32> = (0..l as u32).map(|i| (5 + i) % vocab).collect();
            for (m, mode) in MODES.into_iter().enumerate() {
                ratios[l - 1][m].push(time(&tokens, Some(mode))? / step);
            }
        }
    }
    println!("plain step: {:.1} µs (median)", median(plain));
    println!();
    println!("| forward | / plain step, Deferred | / plain step, Backup |");
    println!("| --- | --- | --- |");
    for (l, r) in ratios.into_iter().enumerate() {
        let [d, b] = [0, 1].map(|m| median(r[m].clone()));
        println!("| verify of {} | {d:.2} | {b:.2} |", l + 1);
    }
    Ok(())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}
