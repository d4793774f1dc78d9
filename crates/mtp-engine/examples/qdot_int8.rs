//! Exact (mlx's f32 arithmetic, `kernels::matmul_quant`) against fast (int8 activations,
//! integer products, `kernels::int8`) products with one MLX-quantized matrix kept packed, as
//! `nn::Linear::forward` runs them in each `Arith`: milliseconds per product (median) for a few
//! row counts, on this CPU's widest path, then again on the portable path (the example runs
//! itself with `MTP_NO_AVX2=1`).
//!
//! ```text
//! cargo run --release -p mtp-engine --example qdot_int8 -- 4096 4096 4 30
//! ```
//! Arguments: output and input features, bits (4 or 8; groups of 64), repetitions, and the row
//! counts (default `1,4`).

use std::time::Instant;

#[path = "support/packed.rs"]
mod packed;

use mtp_engine::arith::with_arith;
use mtp_engine::{Arith, WeightDtype};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, default: usize| -> Result<usize, Box<dyn std::error::Error>> {
        Ok(args.get(i).map_or(Ok(default), |s| s.parse())?)
    };
    let (out, inp, bits, reps) = (arg(0, 4096)?, arg(1, 4096)?, arg(2, 4)?, arg(3, 30)?);
    let rows: Vec<usize> = match args.get(4) {
        Some(s) => s.split(',').map(str::parse).collect::<Result<_, _>>()?,
        None => vec![1, 4],
    };
    let portable = std::env::var_os("MTP_NO_AVX2").is_some_and(|v| !v.is_empty() && v != "0");
    let linear = packed::linear(out, inp, bits, WeightDtype::Stored)?;
    let (held, bytes) = linear.held();
    assert_eq!(held, format!("q{bits}"), "kept packed");
    let x: Vec<f32> = (0..rows.iter().max().copied().unwrap_or(1) * inp)
        .map(|i| ((i * 7919 % 61) as f32 - 30.0) / 31.0)
        .collect();
    println!(
        "{out} x {inp} q{bits} (group 64, {:.1} MiB), {} path:",
        bytes as f64 / (1 << 20) as f64,
        if portable { "portable" } else { "widest" }
    );
    println!("| rows | exact ms | fast ms | exact / fast | max |fast - exact| / max |exact| |");
    println!("| --- | --- | --- | --- | --- |");
    for &n in &rows {
        let x = &x[..n * inp];
        let time = |arith: Arith| {
            let mut secs = Vec::with_capacity(reps);
            let mut y = Vec::new();
            for _ in 0..reps.max(1) {
                let started = Instant::now();
                y = with_arith(arith, || linear.forward(x, n)).expect("n rows");
                secs.push(started.elapsed().as_secs_f64());
            }
            secs.sort_by(f64::total_cmp);
            (secs[secs.len() / 2], y)
        };
        // interleaved: exact, fast, exact, fast (the second pair is reported)
        let _ = (time(Arith::Exact), time(Arith::Fast));
        let ((te, ye), (tf, yf)) = (time(Arith::Exact), time(Arith::Fast));
        let diff = ye
            .iter()
            .zip(&yf)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        let top = ye.iter().fold(0f32, |m, v| m.max(v.abs()));
        println!(
            "| {n} | {:.3} | {:.3} | {:.2} | {:.2e} |",
            te * 1e3,
            tf * 1e3,
            te / tf,
            diff / top
        );
    }
    if !portable {
        println!();
        let status = std::process::Command::new(std::env::current_exe()?)
            .args(&args)
            .env("MTP_NO_AVX2", "1")
            .status()?;
        if !status.success() {
            return Err(format!("the portable run failed: {status}").into());
        }
    }
    Ok(())
}
