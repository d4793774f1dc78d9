//! The time of one `nn::attention` call (the kernel in `kernels`) (median over repetitions) on random data: `l` new
//! queries, `h` query heads over `hkv` KV heads of `hd` channels, `t` cached positions, the keys
//! and values in f32 or, with a seventh argument `f16` / `bf16`, in that half precision (the
//! KV cache's `KvType`).
//!
//! ```text
//! cargo run --release -p mtp-engine --example attention -- 1 16 2 256 4096 200
//! cargo run --release -p mtp-engine --example attention -- 1 4 2 256 32000 50 f16
//! ```
//! Arguments: l, h, hkv, hd, t, repetitions, [f32 | f16 | bf16].

use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let kind = match args.len() {
        7 => args.pop().unwrap_or_default(),
        _ => "f32".to_string(),
    };
    let args: Vec<usize> = args.iter().map(|s| s.parse()).collect::<Result<_, _>>()?;
    let [l, h, hkv, hd, t, reps] = args[..] else {
        return Err("arguments: l h hkv hd t repetitions [f32 | f16 | bf16]".into());
    };
    if hkv == 0 || !h.is_multiple_of(hkv) || t < l || reps == 0 {
        return Err("need h a multiple of hkv, t >= l and at least one repetition".into());
    }
    let mut seed = 1u32;
    let mut next = || {
        seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        (seed >> 8) as f32 / 16_777_216.0 - 0.5
    };
    let keys: Vec<f32> = (0..t * hkv * hd).map(|_| next()).collect();
    let values: Vec<f32> = (0..t * hkv * hd).map(|_| next()).collect();
    let q: Vec<f32> = (0..l * h * hd).map(|_| next()).collect();
    let scale = 1.0 / (hd as f32).sqrt();
    let shape = mtp_engine::nn::AttentionShape {
        l,
        h,
        hkv,
        hd,
        scale,
    };
    let times = match kind.as_str() {
        "f32" => time(&q, &keys, &values, shape, reps),
        "f16" => {
            let (k, v) = (
                rounded(&keys, half::f16::from_f32),
                rounded(&values, half::f16::from_f32),
            );
            time(&q, &k, &v, shape, reps)
        }
        "bf16" => {
            let (k, v) = (
                rounded(&keys, half::bf16::from_f32),
                rounded(&values, half::bf16::from_f32),
            );
            time(&q, &k, &v, shape, reps)
        }
        other => return Err(format!("cache type `{other}`: use f32, f16 or bf16").into()),
    };
    let (mut times, sink) = times;
    times.sort_by(|a, b| a.total_cmp(b));
    println!(
        "l {l}, h {h}, hkv {hkv}, hd {hd}, t {t}, {kind}: {:.1} µs (median of {reps}; checksum {sink})",
        times[reps / 2]
    );
    Ok(())
}

/// Microseconds of each of `reps` calls, and a checksum of their outputs.
fn time<E: mtp_engine::nn::Weight>(
    q: &[f32],
    keys: &[E],
    values: &[E],
    shape: mtp_engine::nn::AttentionShape,
    reps: usize,
) -> (Vec<f64>, f32) {
    let mut times = Vec::with_capacity(reps);
    let mut sink = 0f32;
    for _ in 0..reps {
        let started = Instant::now();
        let out = mtp_engine::nn::attention(q, keys, values, shape);
        times.push(started.elapsed().as_secs_f64() * 1e6);
        sink += out[0];
    }
    (times, sink)
}

/// `x` rounded to a half-precision type, as a KV cache stores it.
fn rounded<E>(x: &[f32], from: fn(f32) -> E) -> Vec<E> {
    x.iter().map(|&v| from(v)).collect()
}
