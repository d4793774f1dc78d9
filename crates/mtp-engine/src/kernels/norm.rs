//! RMS norm over rows.

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
