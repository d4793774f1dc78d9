//! The causal depthwise conv of Gated DeltaNet, followed by SiLU, and its input window.

use super::act::silu;
use super::cpu::multiversion;

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

#[cfg(test)]
mod tests {
    use super::*;

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
