//! The activations, on a branch-free `exp` of our own: per value (`silu`, `sigmoid`,
//! `softplus`) and over slices, whose loops are compiled for AVX2 too (see
//! [`super::cpu::multiversion!`]), where they vectorize with the same bits.

use super::cpu::multiversion;

/// `e^x` in f32 without a library call and without branches, so that loops over it
/// vectorize: Cephes' degree-6 polynomial after reduction by `ln 2`, within 2 ulp of the true
/// value. Arguments are clamped to `[-87, 88]` (below, about 1.6e-38 instead of a smaller
/// number or 0; above, about 1.7e38 instead of a larger number or infinity); NaN gives NaN.
/// Only additions, multiplications and exact conversions, so every instruction set gives the
/// same bits.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    // clamped; NaN (every comparison fails) is reduced as 0 and given back at the end
    let c = if x >= -87.0 {
        x.min(88.0)
    } else if x < -87.0 {
        -87.0
    } else {
        0.0
    };
    // round to nearest, as `floor(y + 0.5)`, by the 1.5 * 2^23 trick (no SSE4.1 `floor`)
    const MAGIC: f32 = 12_582_912.0;
    let t = c * std::f32::consts::LOG2_E + 0.5;
    let n = (t + MAGIC) - MAGIC;
    let n = if n > t { n - 1.0 } else { n };
    let r = c - n * 0.693_359_4 - n * -2.121_944_4e-4;
    let p = 1.987_569_1e-4;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 0.166_666_65;
    let p = p * r + 0.5;
    let y = p * (r * r) + r + 1.0;
    // SAFETY: `n` is an integer in [-126, 127] (c in [-87, 88], never NaN), so the conversion
    // is exact and `n + 127` is a normal exponent.
    let n = unsafe { n.to_int_unchecked::<i32>() };
    let scale = f32::from_bits(((n + 127) << 23) as u32);
    if x.is_nan() {
        x
    } else {
        y * scale
    }
}

/// `x * sigmoid(x)`.
#[inline(always)]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + exp(-x))
}

/// `1 / (1 + exp(-x))`.
#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// `log(1 + exp(x))`, computed as MLX's `logaddexp(x, 0)`.
#[inline]
pub fn softplus(x: f32) -> f32 {
    x.max(0.0) + exp(-x.abs()).ln_1p()
}

/// Panics unless `out`, `a` and `b` have one length (the message starts with `what`).
fn check_same(what: &str, out: &[f32], a: &[f32], b: &[f32]) {
    assert!(
        out.len() == a.len() && a.len() == b.len(),
        "{what}: lengths {}, {} and {} differ",
        out.len(),
        a.len(),
        b.len()
    );
}

multiversion! {
    /// `out[i] = silu(a[i]) * b[i]` (SwiGLU, and the gated RMSNorm's `y * silu(z)`).
    ///
    /// # Panics
    /// When the three lengths differ.
    pub fn silu_mul(out: &mut [f32], a: &[f32], b: &[f32]) {
        check_same("silu_mul", out, a, b);
        for ((o, a), b) in out.iter_mut().zip(a).zip(b) {
            *o = silu(*a) * b;
        }
    }
}

multiversion! {
    /// `out[i] = sigmoid(a[i]) * b[i]` (the output gate of full attention).
    ///
    /// # Panics
    /// When the three lengths differ.
    pub fn sigmoid_mul(out: &mut [f32], a: &[f32], b: &[f32]) {
        check_same("sigmoid_mul", out, a, b);
        for ((o, a), b) in out.iter_mut().zip(a).zip(b) {
            *o = sigmoid(*a) * b;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Within 2 ulp of the true value over the whole unclamped range, NaN kept, the ends
    /// clamped to finite values.
    #[test]
    fn exp_is_accurate_and_total() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x <= 88.0 {
            let got = exp(x) as f64;
            let want = (x as f64).exp();
            let ulp = (want as f32).next_up() as f64 - want as f32 as f64;
            worst = worst.max((got - want).abs() / ulp);
            x += 0.001_37;
        }
        assert!(worst <= 2.0, "worst error {worst} ulp");
        assert_eq!(exp(0.0), 1.0);
        assert!(exp(f32::NAN).is_nan());
        assert!(exp(-1e30) > 0.0 && exp(-1e30) == exp(-87.0));
        assert!(exp(f32::NEG_INFINITY) == exp(-87.0));
        assert!(exp(1e30).is_finite() && exp(f32::INFINITY) == exp(88.0));
        assert!(silu(-1e4).abs() < 1e-30 && silu(1e4) == 1e4);
        assert!(sigmoid(f32::NAN).is_nan() && silu(f32::NAN).is_nan());
    }

    /// The slice kernels give, on whichever path the CPU takes, the bits of the scalar
    /// functions applied one element at a time (lengths with and without a vector tail).
    #[test]
    fn slice_kernels_match_scalar_bits() {
        for len in [1usize, 7, 8, 9, 33, 300] {
            let a: Vec<f32> = (0..len).map(|i| (i as f32 * 0.37).sin() * 12.0).collect();
            let b: Vec<f32> = (0..len).map(|i| (i as f32 * 0.11).cos() * 3.0).collect();
            let mut out = vec![0f32; len];
            silu_mul(&mut out, &a, &b);
            for i in 0..len {
                assert_eq!(out[i].to_bits(), (silu(a[i]) * b[i]).to_bits());
            }
            sigmoid_mul(&mut out, &a, &b);
            for i in 0..len {
                assert_eq!(out[i].to_bits(), (sigmoid(a[i]) * b[i]).to_bits());
            }
        }
    }
}
