//! The time of one `nn::attention` call (the kernel in `kernels`) (median over repetitions) on random data: `l` new
//! queries, `h` query heads over `hkv` KV heads of `hd` channels, `t` cached positions.
//!
//! ```text
//! cargo run --release -p mtp-engine --example attention -- 1 16 2 256 4096 200
//! ```
//! Arguments: l, h, hkv, hd, t, repetitions.

use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|s| s.parse())
        .collect::<Result<_, _>>()?;
    let [l, h, hkv, hd, t, reps] = args[..] else {
        return Err("arguments: l h hkv hd t repetitions".into());
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
    let mut times = Vec::with_capacity(reps);
    let mut sink = 0f32;
    for _ in 0..reps {
        let started = Instant::now();
        let out = mtp_engine::nn::attention(
            &q,
            &keys,
            &values,
            mtp_engine::nn::AttentionShape {
                l,
                h,
                hkv,
                hd,
                scale,
            },
        );
        times.push(started.elapsed().as_secs_f64() * 1e6);
        sink += out[0];
    }
    times.sort_by(|a, b| a.total_cmp(b));
    println!(
        "l {l}, h {h}, hkv {hkv}, hd {hd}, t {t}: {:.1} µs (median of {reps}; checksum {sink})",
        times[reps / 2]
    );
    Ok(())
}
