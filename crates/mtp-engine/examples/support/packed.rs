//! A random MLX-quantized matrix as a checkpoint stores it, for the product examples.

use std::collections::HashMap;

use candle_core::{Device, Tensor};
use mtp_engine::loader::Param;
use mtp_engine::nn::{Linear, Store};
use mtp_engine::WeightDtype;

/// An `out x inp` matrix of `bits`-bit codes in groups of 64 (spread codes, small scales and
/// biases), loaded as `dtype`: `Stored` keeps it packed, `Convert(F32)` dequantizes it at load.
pub fn linear(
    out: usize,
    inp: usize,
    bits: usize,
    dtype: WeightDtype,
) -> Result<Linear, Box<dyn std::error::Error>> {
    let group = 64;
    let words: Vec<u32> = (0..out * inp * bits / 32)
        .map(|i| (i as u32).wrapping_mul(2654435761))
        .collect();
    let groups = out * inp / group;
    let scales: Vec<f32> = (0..groups).map(|i| 0.01 + (i % 7) as f32 * 1e-3).collect();
    let biases: Vec<f32> = (0..groups).map(|i| -0.05 + (i % 5) as f32 * 1e-3).collect();
    let cpu = &Device::Cpu;
    let params: HashMap<String, Param> = [
        (
            "bench.weight",
            Tensor::from_vec(words, (out, inp * bits / 32), cpu)?,
        ),
        (
            "bench.scales",
            Tensor::from_vec(scales, (out, inp / group), cpu)?,
        ),
        (
            "bench.biases",
            Tensor::from_vec(biases, (out, inp / group), cpu)?,
        ),
        ("bench.bits", Tensor::new(bits as u32, cpu)?),
    ]
    .into_iter()
    .map(|(k, t)| (k.to_string(), Param::from(t)))
    .collect();
    let mut store = Store::new(params, "bench", dtype, cpu);
    Ok(store.linear("bench", out, inp)?)
}
