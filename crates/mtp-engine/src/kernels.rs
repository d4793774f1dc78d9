//! Plain-Rust f32 kernels for the parts of the forward pass that are sequential or tiny per
//! token: RMS norms, rotary embedding and the causal depthwise conv step. Few-row matrix
//! products, cached attention and the gated delta rule are in `simd`, large products in candle.

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

/// `x * sigmoid(x)`.
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// `1 / (1 + exp(-x))`.
#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `log(1 + exp(x))`, computed as MLX's `logaddexp(x, 0)`.
#[inline]
pub fn softplus(x: f32) -> f32 {
    x.max(0.0) + (-x.abs()).exp().ln_1p()
}

/// Rotary embedding tables: `inv_freq[i] = theta^(-2i / rot_dim)`.
#[derive(Debug, Clone)]
pub struct Rope {
    inv_freq: Vec<f32>,
    rot_dim: usize,
}

impl Rope {
    /// Rotary embedding over the first `rot_dim` features of each head.
    pub fn new(rot_dim: usize, theta: f64) -> Self {
        let inv_freq = (0..rot_dim / 2)
            .map(|i| (1.0 / theta.powf((2 * i) as f64 / rot_dim as f64)) as f32)
            .collect();
        Rope { inv_freq, rot_dim }
    }

    /// Rotates one head vector in place at position `pos` (rotate-half pairing, as the text
    /// positions of Qwen's interleaved multimodal rope reduce to).
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
}

/// One sequence's causal depthwise conv1d over `s` new time steps, followed by SiLU.
///
/// `state`: `[k - 1, c]`, the previous inputs (updated in place to the last `k - 1` rows of
/// `[state; x]`, see [`conv_window_push`]). `x`: `[s, c]`. `w`: `[c, k]`. Returns `[s, c]`.
pub fn causal_conv_silu(state: &mut [f32], x: &[f32], w: &[f32], c: usize, k: usize) -> Vec<f32> {
    let s = x.len() / c;
    // full input [k - 1 + s, c]
    let mut full = Vec::with_capacity((k - 1 + s) * c);
    full.extend_from_slice(state);
    full.extend_from_slice(x);
    let mut out = vec![0f32; s * c];
    for t in 0..s {
        let o = &mut out[t * c..(t + 1) * c];
        for (ch, ov) in o.iter_mut().enumerate() {
            let wr = &w[ch * k..(ch + 1) * k];
            let mut acc = 0f32;
            for (j, wj) in wr.iter().enumerate() {
                acc += full[(t + j) * c + ch] * wj;
            }
            *ov = silu(acc);
        }
    }
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
