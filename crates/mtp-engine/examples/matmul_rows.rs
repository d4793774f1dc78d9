//! Memory-bound few-row matmul: the time of the few-row product (`kernels::matmul_rows`, reached
//! through `nn::Linear::forward`, which takes it for up to 32 rows) for `n = 1..=5` rows against
//! one row, on a weight matrix larger than the caches (the decode regime of a large model),
//! with f32, bf16 or f16 weights, or MLX-quantized ones kept packed (`q2`, `q3`, `q4`, `q5`,
//! `q6`, `q8`; group size 64; `kernels::matmul_quant`).
//!
//! ```text
//! cargo run --release -p mtp-engine --example matmul_rows -- 256 20 bf16
//! ```
//! Arguments: matrix size in MiB (of the weights as stored; fractions allowed, e.g. `0.1875`
//! for a cache-resident 384 × 128 f32 matrix), repetitions, weight dtype, and for f32 / bf16 /
//! f16 the input width (default 1024).

use std::time::Instant;

#[path = "support/packed.rs"]
mod packed;

use candle_core::{Device, Tensor, WithDType};
use mtp_engine::nn::Linear;
use mtp_engine::WeightDtype;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mib: f64 = args.next().map_or(Ok(256.0), |s| s.parse())?;
    let reps: usize = args.next().map_or(Ok(20), |s| s.parse())?;
    let dtype = args.next().unwrap_or_else(|| "f32".into());
    let inp: usize = args.next().map_or(Ok(1024), |s| s.parse())?;
    match dtype.as_str() {
        "f32" => run::<f32>(mib, reps, inp, |v| v),
        "bf16" => run(mib, reps, inp, half::bf16::from_f32),
        "f16" => run(mib, reps, inp, half::f16::from_f32),
        q if q
            .strip_prefix('q')
            .and_then(|b| b.parse::<usize>().ok())
            .is_some() =>
        {
            run_quant(mib, reps, q[1..].parse()?)
        }
        other => Err(format!("weight dtype `{other}`: use f32, bf16, f16 or q2-q8").into()),
    }
}

fn run<E: WithDType>(
    mib: f64,
    reps: usize,
    inp: usize,
    from: fn(f32) -> E,
) -> Result<(), Box<dyn std::error::Error>> {
    let bytes = std::mem::size_of::<E>();
    let out = ((mib * (1 << 20) as f64) as usize / bytes / inp).max(1);
    let w: Vec<E> = (0..out * inp)
        .map(|i| from(((i % 97) as f32 - 48.0) / 97.0))
        .collect();
    let linear = Linear::dense(Tensor::from_vec(w, (out, inp), &Device::Cpu)?);
    table(reps, inp, out * inp * bytes, |x, n| {
        linear.forward(x, n).expect("the input is n rows")
    })
}

fn run_quant(mib: f64, reps: usize, bits: usize) -> Result<(), Box<dyn std::error::Error>> {
    let inp = 1024;
    // `bits` / 8 bytes per weight (plus two f32 per group of 64)
    let out = (mib * (1 << 20) as f64) as usize * 8 / bits / inp;
    // packed weights as a checkpoint stores them, kept packed (`WeightDtype::Stored`)
    let linear = packed::linear(out, inp, bits, WeightDtype::Stored)?;
    let (held, bytes) = linear.held();
    assert_eq!(held, format!("q{bits}"), "kept packed");
    table(reps, inp, bytes, |x, n| {
        linear.forward(x, n).expect("the input is n rows")
    })
}

/// Times `product(x, n)` for `n = 1..=5`, each repetition back to back, and prints medians.
fn table(
    reps: usize,
    inp: usize,
    bytes: usize,
    product: impl Fn(&[f32], usize) -> Vec<f32>,
) -> Result<(), Box<dyn std::error::Error>> {
    let x: Vec<f32> = (0..5 * inp)
        .map(|i| ((i % 31) as f32 - 15.0) / 31.0)
        .collect();
    let time = |n: usize| {
        let started = Instant::now();
        let y = product(&x[..n * inp], n);
        (started.elapsed().as_secs_f64(), y[0])
    };
    // each repetition times every row count back to back; medians of the paired ratios
    let mut secs = vec![Vec::new(); 5];
    let mut ratios = vec![Vec::new(); 5];
    let mut sink = 0f32;
    for _ in 0..reps {
        let mut one = 0.0;
        for n in 1..=5 {
            let (s, y) = time(n);
            sink += y;
            if n == 1 {
                one = s;
            }
            secs[n - 1].push(s);
            ratios[n - 1].push(s / one);
        }
    }
    println!("| rows | µs (median) | / one row (median of paired ratios) | GB/s |");
    println!("| --- | --- | --- | --- |");
    for (n, (s, r)) in secs.into_iter().zip(ratios).enumerate() {
        let s = median(s);
        println!(
            "| {} | {:.1} | {:.2} | {:.1} |",
            n + 1,
            s * 1e6,
            median(r),
            bytes as f64 / s / 1e9
        );
    }
    assert!(sink.is_finite());
    Ok(())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}
