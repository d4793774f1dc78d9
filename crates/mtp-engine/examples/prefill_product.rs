//! Compute-bound many-row products (prefill): `nn::Linear::forward` with more than 32 rows
//! (`fgemm`) on an MLX-quantized matrix kept packed and on the same matrix dequantized to f32
//! at load, against candle's `matmul` of the f32 matrix (the `gemm` crate, which the engine's
//! prefill used before), for several row counts, interleaved repetition by repetition, medians
//! and the medians of the paired ratios.
//!
//! ```text
//! cargo run --release -p mtp-engine --example prefill_product -- 3072 1024 q4 9 64,256,1024
//! ```
//! Arguments: output features, input features, `q2`-`q8` (group size 64), repetitions, row
//! counts. The last column is the largest difference between the packed product and candle's,
//! over the largest output.

use std::time::Instant;

#[path = "support/packed.rs"]
mod packed;

use candle_core::{DType, Device, Tensor};
use mtp_engine::WeightDtype;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let out: usize = args.next().map_or(Ok(3072), |s| s.parse())?;
    let inp: usize = args.next().map_or(Ok(1024), |s| s.parse())?;
    let kind = args.next().unwrap_or_else(|| "q4".into());
    let bits: usize = kind
        .strip_prefix('q')
        .and_then(|b| b.parse().ok())
        .ok_or_else(|| format!("weights `{kind}`: use q2-q8"))?;
    let reps: usize = args.next().map_or(Ok(9), |s| s.parse())?;
    let rows: Vec<usize> = args
        .next()
        .unwrap_or_else(|| "64,256,1024".into())
        .split(',')
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let packed = packed::linear(out, inp, bits, WeightDtype::Stored)?;
    let widened = packed::linear(out, inp, bits, WeightDtype::Convert(DType::F32))?;
    assert_eq!(packed.held().0, format!("q{bits}"), "kept packed");
    // `w^T` as f32, `[inp, out]`: the identity's rows through the f32 matrix (exact: each output
    // is one weight times one)
    let eye: Vec<f32> = (0..inp * inp)
        .map(|i| if i / inp == i % inp { 1.0 } else { 0.0 })
        .collect();
    let wt = Tensor::from_vec(widened.forward(&eye, inp)?, (inp, out), &Device::Cpu)?;
    println!("{out} x {inp}, {bits} bits, group 64, {reps} reps interleaved, medians");
    println!(
        "| rows | packed ms | f32 ms | candle f32 ms | candle / packed | candle / f32 | GMAC/s packed, f32, candle | max |Δ| / max |y| |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    for n in rows {
        let x: Vec<f32> = (0..n * inp)
            .map(|i| {
                let v = ((i.wrapping_mul(2654435761) >> 7) % 2001) as f32 / 1000.0 - 1.0;
                if i % 131 == 7 {
                    v * 30.0
                } else {
                    v
                }
            })
            .collect();
        let xt = Tensor::from_slice(&x, (n, inp), &Device::Cpu)?;
        let mut times = [Vec::new(), Vec::new(), Vec::new()];
        let (mut r_packed, mut r_f32) = (Vec::new(), Vec::new());
        let (mut yp, mut yc) = (Vec::new(), Vec::new());
        for _ in 0..reps {
            let t = Instant::now();
            yp = packed.forward(&x, n)?;
            let p = t.elapsed().as_secs_f64();
            let t = Instant::now();
            let _ = widened.forward(&x, n)?;
            let f = t.elapsed().as_secs_f64();
            let t = Instant::now();
            yc = xt.matmul(&wt)?.flatten_all()?.to_vec1::<f32>()?;
            let c = t.elapsed().as_secs_f64();
            for (v, s) in times.iter_mut().zip([p, f, c]) {
                v.push(s);
            }
            r_packed.push(c / p);
            r_f32.push(c / f);
        }
        let top = yc.iter().fold(0f32, |m, v| m.max(v.abs()));
        let worst = yp
            .iter()
            .zip(&yc)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        let macs = (n * out * inp) as f64 / 1e9;
        let [p, f, c] = times.map(median);
        println!(
            "| {n} | {:.2} | {:.2} | {:.2} | {:.2}x | {:.2}x | {:.1}, {:.1}, {:.1} | {:.1e} |",
            p * 1e3,
            f * 1e3,
            c * 1e3,
            median(r_packed),
            median(r_f32),
            macs / p,
            macs / f,
            macs / c,
            worst / top
        );
    }
    Ok(())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}
