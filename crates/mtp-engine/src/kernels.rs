//! Plain-Rust f32 kernels for the parts of the forward pass that are sequential or tiny per
//! token: RMS norms, rotary embedding, the activations (on a branch-free `exp` of our own) and
//! the causal depthwise conv step. The loops over slices are compiled for AVX2 too, where
//! they vectorize with the same bits. Few-row matrix products, cached attention and the gated
//! delta rule are in `simd`, large products in candle.

/// `x * rsqrt(mean(x^2) + eps) * w` over each `dim`-wide row of `x`, in place (MLX
/// `fast.rms_norm`). `w = None` means no weight.
pub fn rms_norm_rows(x: &mut [f32], w: Option<&[f32]>, dim: usize, eps: f32) {
    for row in x.chunks_exact_mut(dim) {
        let ms = row.iter().map(|v| v * v).sum::<f32>() / dim as f32;
        let r = 1.0 / (ms + eps).sqrt();
        match w {
            Some(w) => row.iter_mut().zip(w).for_each(|(v, w)| *v = *v * r * w),
            None => row.iter_mut().for_each(|v| *v *= r),
        }
    }
}

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

/// Rotary embedding tables: `inv_freq[i] = theta^(-2i / rot_dim)`, and which of a row's three
/// position ids (temporal, height, width: Qwen's multimodal rope) each frequency turns with.
#[derive(Debug, Clone)]
pub struct Rope {
    inv_freq: Vec<f32>,
    /// Position id (0, 1 or 2) of frequency `i`.
    axis: Vec<u8>,
    rot_dim: usize,
}

impl Rope {
    /// Rotary embedding over the first `rot_dim` features of each head; every frequency turns
    /// with the temporal id (which, for text, is the position).
    pub fn new(rot_dim: usize, theta: f64) -> Self {
        let inv_freq: Vec<f32> = (0..rot_dim / 2)
            .map(|i| (1.0 / theta.powf((2 * i) as f64 / rot_dim as f64)) as f32)
            .collect();
        let axis = vec![0; inv_freq.len()];
        Rope {
            inv_freq,
            axis,
            rot_dim,
        }
    }

    /// [`Rope::new`] with Qwen3.5's interleaved multimodal layout (mlx-vlm's
    /// `_interleaved_position_selector`): frequency `i` turns with the height id when
    /// `i % 3 == 1 && i < 3 * section[1]`, with the width id when `i % 3 == 2 && i < 3 *
    /// section[2]`, else with the temporal id.
    pub fn interleaved(rot_dim: usize, theta: f64, section: [usize; 3]) -> Self {
        let mut r = Self::new(rot_dim, theta);
        for (i, a) in r.axis.iter_mut().enumerate() {
            for (dim, offset) in [(1u8, 1usize), (2, 2)] {
                if i % 3 == offset && i < section[dim as usize] * 3 {
                    *a = dim;
                }
            }
        }
        r
    }

    /// A rope over explicit frequencies (the vision tower's 2D rope: `inv_freq` and the axis
    /// each frequency turns with), rotating `2 * inv_freq.len()` features.
    pub fn from_parts(inv_freq: Vec<f32>, axis: Vec<u8>) -> Self {
        assert_eq!(inv_freq.len(), axis.len(), "rope: one axis per frequency");
        assert!(axis.iter().all(|&a| a < 3), "rope: axes are 0, 1 or 2");
        let rot_dim = 2 * inv_freq.len();
        Rope {
            inv_freq,
            axis,
            rot_dim,
        }
    }

    /// Rotates one head vector in place at position `pos` on every axis (rotate-half pairing,
    /// as the text positions of Qwen's interleaved multimodal rope reduce to).
    pub fn apply(&self, x: &mut [f32], pos: usize) {
        let half = self.rot_dim / 2;
        for (i, f) in self.inv_freq.iter().enumerate() {
            let angle = pos as f32 * f;
            let (s, c) = angle.sin_cos();
            let a = x[i];
            let b = x[i + half];
            x[i] = a * c - b * s;
            x[i + half] = b * c + a * s;
        }
    }

    /// Rotates one head vector at the three position ids `pos` (temporal, height, width): each
    /// frequency turns with its own axis. Equal ids give the bits of [`Rope::apply`].
    pub fn apply_at(&self, x: &mut [f32], pos: [usize; 3]) {
        let half = self.rot_dim / 2;
        for (i, (f, &a)) in self.inv_freq.iter().zip(&self.axis).enumerate() {
            let angle = pos[a as usize] as f32 * f;
            let (s, c) = angle.sin_cos();
            let a = x[i];
            let b = x[i + half];
            x[i] = a * c - b * s;
            x[i + half] = b * c + a * s;
        }
    }
}

/// Defines a function over slices whose body is compiled twice: for AVX2 and FMA, used where
/// the CPU has them, so that the plain loops vectorize 8 wide, and for the baseline. Both give
/// the same bits, since Rust never fuses a multiply and an add on its own.
macro_rules! multiversion {
    ($(#[$m:meta])* pub fn $name:ident($($a:ident: $t:ty),* $(,)?) $body:block) => {
        $(#[$m])*
        pub fn $name($($a: $t),*) {
            #[inline(always)]
            fn imp($($a: $t),*) $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx,avx2,fma")]
                unsafe fn avx($($a: $t),*) {
                    imp($($a),*)
                }
                if crate::simd::has_avx() {
                    // SAFETY: AVX2 and FMA were detected on this CPU.
                    return unsafe { avx($($a),*) };
                }
            }
            imp($($a),*)
        }
    };
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

multiversion! {
    /// The causal depthwise conv1d of `out.len() / c` new time steps, followed by SiLU, into
    /// `out` (`[s, c]`). `window`: `[k - 1, c]`, the inputs before `x` (`[s, c]`). `w`:
    /// `[k, c]`, tap by tap (the checkpoint's `[c, 1, k]` transposed, so that the channels run
    /// contiguously). Each output sums its `k` taps in order, oldest first.
    ///
    /// # Panics
    /// When `c` is zero, `window` or `x` is not whole rows of `c`, `out` is not as long as
    /// `x`, or `w` is not one row more than `window`.
    pub fn conv_silu_into(out: &mut [f32], window: &[f32], x: &[f32], w: &[f32], c: usize) {
        assert!(
            c > 0
                && window.len().is_multiple_of(c)
                && x.len().is_multiple_of(c)
                && out.len() == x.len()
                && Some(w.len()) == window.len().checked_add(c),
            "conv_silu_into: output {}, window {}, input {}, taps {} for {c} channels",
            out.len(),
            window.len(),
            x.len(),
            w.len()
        );
        let hist = window.len() / c;
        for (t, o) in out.chunks_exact_mut(c).enumerate() {
            o.fill(0.0);
            for (j, wj) in w.chunks_exact(c).enumerate() {
                // input row `t + j` of `[window; x]`
                let src = if t + j < hist {
                    &window[(t + j) * c..(t + j + 1) * c]
                } else {
                    &x[(t + j - hist) * c..(t + j - hist + 1) * c]
                };
                for ((o, a), b) in o.iter_mut().zip(src).zip(wj) {
                    *o += a * b;
                }
            }
            for v in o.iter_mut() {
                *v = silu(*v);
            }
        }
    }
}

/// One sequence's causal depthwise conv1d over `s` new time steps, followed by SiLU (see
/// [`conv_silu_into`]; `w` is `[k, c]`). `state`: `[k - 1, c]`, the previous inputs, updated
/// in place to the last `k - 1` rows of `[state; x]` (see [`conv_window_push`]). `x`: `[s, c]`.
/// Returns `[s, c]`.
///
/// # Panics
/// As [`conv_silu_into`].
pub fn causal_conv_silu(state: &mut [f32], x: &[f32], w: &[f32], c: usize) -> Vec<f32> {
    let mut out = crate::scratch::zeroed(x.len());
    conv_silu_into(&mut out, state, x, w, c);
    conv_window_push(state, x, c);
    out
}

/// Moves a causal conv's input window (`[k - 1, c]`, oldest first) past the rows `x`
/// (`[s, c]`): the window becomes the last `k - 1` rows of `[window; x]`.
pub fn conv_window_push(window: &mut [f32], x: &[f32], c: usize) {
    let (w, s) = (window.len(), x.len());
    debug_assert!(w % c.max(1) == 0 && s % c.max(1) == 0);
    if s >= w {
        window.copy_from_slice(&x[s - w..]);
    } else {
        window.copy_within(s.., 0);
        window[w - s..].copy_from_slice(x);
    }
}

/// Shapes of the gated delta rule.
#[derive(Debug, Clone, Copy, Default)]
pub struct DeltaDims {
    /// Key heads.
    pub hk: usize,
    /// Value heads (a multiple of `hk`).
    pub hv: usize,
    /// Key head width.
    pub dk: usize,
    /// Value head width.
    pub dv: usize,
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

    /// The conv over `[k, c]` weights sums each channel's taps oldest first, as the
    /// definition over the checkpoint's `[c, k]` weights does, bit for bit; the window moves.
    #[test]
    fn conv_matches_the_definition() {
        let (c, k, s) = (11usize, 4usize, 3usize);
        let w_ck: Vec<f32> = (0..c * k).map(|i| (i as f32 * 0.7).sin()).collect();
        let w_kc: Vec<f32> = (0..k * c).map(|i| w_ck[(i % c) * k + i / c]).collect();
        let window: Vec<f32> = (0..(k - 1) * c).map(|i| (i as f32 * 0.3).cos()).collect();
        let x: Vec<f32> = (0..s * c).map(|i| (i as f32 * 0.9).sin() * 2.0).collect();
        let full: Vec<f32> = window.iter().chain(&x).copied().collect();
        let mut state = window.clone();
        let got = causal_conv_silu(&mut state, &x, &w_kc, c);
        for t in 0..s {
            for ch in 0..c {
                let mut acc = 0f32;
                for j in 0..k {
                    acc += full[(t + j) * c + ch] * w_ck[ch * k + j];
                }
                assert_eq!(got[t * c + ch].to_bits(), silu(acc).to_bits());
            }
        }
        assert_eq!(state, full[s * c..]);
    }
}
