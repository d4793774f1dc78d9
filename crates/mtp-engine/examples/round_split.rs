//! Where an MTP round's time goes: per depth, the median over repetitions of decode tok/s off
//! and on, and the on-call's draft / verify / rollback milliseconds per round, next to the
//! cost of one target-only step.
//!
//! ```text
//! cargo run --release -p mtp-engine --example round_split -- models/tiny-code 512 7 1,2,3
//! ```
//! Arguments: checkpoint, tokens per call, repetitions, depths, and optionally a companion
//! drafter's directory (an `mlx_vlm.convert --mtp-output` one).

use std::path::PathBuf;

use candle_core::Device;
use mtp_engine::{Engine, GenerateOptions, WeightDtype};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(args.next().unwrap_or_else(|| "models/tiny-code".into()));
    let tokens: usize = args.next().map_or(Ok(512), |s| s.parse())?;
    let reps: usize = args.next().map_or(Ok(7), |s| s.parse())?;
    let depths: Vec<usize> = match args.next() {
        Some(s) => s
            .split(',')
            .map(|d| d.trim().parse())
            .collect::<Result<_, _>>()?,
        None => (1..=5).collect(),
    };
    let drafter = args.next().map(PathBuf::from);
    let engine =
        Engine::load_with_drafter(&dir, drafter.as_deref(), &Device::Cpu, WeightDtype::Stored)?;
    let mut prompt: Vec<u32> = match engine.tokenizer() {
        Some(t) => t.encode("fn main() {\n    let mut total = 0;\n")?,
        None => Vec::new(),
    };
    if prompt.is_empty() {
        // no tokenizer, or one that has no tokens for this text (a benchmark vocabulary)
        prompt = (1..16).collect();
    }
    let off = GenerateOptions::greedy(tokens).ignore_eos(true);
    println!("| depth | tok/s off | tok/s on | speedup | tokens/round | step µs | round µs | draft µs | verify µs | rollback µs | round / step |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for depth in depths {
        let on = off.clone().num_draft_tokens(depth);
        let (mut a, mut b, mut d, mut v, mut r, mut tpr) =
            (vec![], vec![], vec![], vec![], vec![], vec![]);
        for _ in 0..reps {
            let o = engine.generate(&prompt, &off, |_| true)?;
            let s = engine.generate(&prompt, &on, |_| true)?;
            a.push(o.timings.decode_tokens_per_s.unwrap_or(f64::NAN));
            b.push(s.timings.decode_tokens_per_s.unwrap_or(f64::NAN));
            let st = &s.speculation.as_ref().ok_or("no speculation")?.stats;
            let rounds = st.rounds.max(1) as f64;
            d.push(s.timings.draft_ms.unwrap_or(0.0) * 1e3 / rounds);
            v.push(s.timings.verify_ms.unwrap_or(0.0) * 1e3 / rounds);
            r.push(s.timings.rollback_ms.unwrap_or(0.0) * 1e3 / rounds);
            tpr.push(st.tokens_per_round().unwrap_or(1.0));
        }
        let (a, b, d, v, r, tpr) = (
            median(a),
            median(b),
            median(d),
            median(v),
            median(r),
            median(tpr),
        );
        let step = 1e6 / a;
        let round = d + v + r;
        println!(
            "| {depth} | {a:.0} | {b:.0} | {:.2}x | {tpr:.2} | {step:.1} | {round:.1} | {d:.1} | {v:.1} | {r:.1} | {:.2} |",
            b / a,
            round / step
        );
    }
    Ok(())
}
