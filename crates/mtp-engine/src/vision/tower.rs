//! The Qwen3-VL / Qwen3.5 vision tower: patch embedding, learned position embeddings
//! interpolated to the image's grid, 2D rotary ViT blocks with full (bidirectional) attention
//! within each frame, and the patch merger that turns each `merge × merge` square of patches
//! into one language-model token.
//!
//! Numerics follow mlx-vlm 0.7.10 `models/qwen3_vl/vision.py` in f32 (the MLP's
//! `gelu_pytorch_tanh`, the merger's exact GELU, layer norms with eps 1e-6). Products go through
//! the engine's [`Linear`] (so bf16 and MLX-quantized towers are read as the text model's
//! matrices are); the attention's two products per head run on candle's GEMM.

use candle_core::{Device, Tensor};

use crate::config::VisionConfig;
use crate::error::{Error, Result};
use crate::kernels::Rope;
use crate::nn::{Linear, Store};

/// Layer-norm epsilon of every norm of the tower (mlx-vlm's, fixed).
const LN_EPS: f32 = 1e-6;

/// One ViT block.
#[derive(Debug)]
struct Block {
    norm1: (Vec<f32>, Vec<f32>),
    norm2: (Vec<f32>, Vec<f32>),
    qkv: Biased,
    proj: Biased,
    fc1: Biased,
    fc2: Biased,
}

/// A linear layer with a bias.
#[derive(Debug)]
struct Biased {
    w: Linear,
    b: Vec<f32>,
}

impl Biased {
    fn load(st: &mut Store, name: &str, out: usize, inp: usize) -> Result<Self> {
        Ok(Biased {
            w: st.linear(name, out, inp)?,
            b: st.vec(&format!("{name}.bias"), out)?,
        })
    }

    fn forward(&self, x: &[f32], n: usize) -> Result<Vec<f32>> {
        let mut y = self.w.forward(x, n)?;
        for row in y.chunks_exact_mut(self.b.len()) {
            row.iter_mut().zip(&self.b).for_each(|(a, b)| *a += b);
        }
        Ok(y)
    }
}

/// The loaded vision tower.
#[derive(Debug)]
pub struct VisionTower {
    cfg: VisionConfig,
    /// The Conv3d patch embedding as a `[hidden, C·T·P·P]` product over patches flattened in
    /// the processor's `(C, T, P, P)` order.
    patch: Biased,
    /// `[num_position_embeddings, hidden]`.
    pos_embed: Vec<f32>,
    blocks: Vec<Block>,
    merger_norm: (Vec<f32>, Vec<f32>),
    merger_fc1: Biased,
    merger_fc2: Biased,
    rope: Rope,
}

impl VisionTower {
    /// Builds the tower from tensors named as in a Hugging Face checkpoint with its
    /// `model.visual.` prefix removed (`patch_embed.proj.weight`, `blocks.0.attn.qkv.weight`,
    /// `merger.linear_fc1.weight`, ...). The patch embedding is read in PyTorch's Conv3d layout
    /// `[out, C, T, P, P]` or MLX's `[out, T, P, P, C]`.
    pub fn load(cfg: &VisionConfig, st: &mut Store, device: &Device) -> Result<Self> {
        let (h, c, t, p) = (
            cfg.hidden_size,
            cfg.in_channels,
            cfg.temporal_patch_size,
            cfg.patch_size,
        );
        let patch_in = c * t * p * p;
        let name = "patch_embed.proj.weight";
        let raw = st.tensor_any(name)?;
        let w = match raw.dims() {
            [o, cc, tt, ph, pw] if (*o, *cc, *tt, *ph, *pw) == (h, c, t, p, p) => raw,
            [o, tt, ph, pw, cc] if (*o, *tt, *ph, *pw, *cc) == (h, t, p, p, c) => {
                raw.permute((0, 4, 1, 2, 3))?.contiguous()?
            }
            dims => {
                return Err(Error::ShapeMismatch {
                    name: format!("visual.{name}"),
                    expected: vec![h, c, t, p, p],
                    actual: dims.to_vec(),
                })
            }
        };
        let w = w.reshape((h, patch_in))?.to_device(device)?;
        let patch = Biased {
            w: Linear::dense(w),
            b: st.vec("patch_embed.proj.bias", h)?,
        };
        // a quantized export may hold the embedding packed (mlx's QuantizedEmbedding)
        let pos_embed = st
            .tensor("pos_embed.weight", &[cfg.num_position_embeddings, h])?
            .to_dtype(candle_core::DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        let norm = |st: &mut Store, name: &str, len: usize| -> Result<(Vec<f32>, Vec<f32>)> {
            Ok((
                st.vec(&format!("{name}.weight"), len)?,
                st.vec(&format!("{name}.bias"), len)?,
            ))
        };
        let mut blocks = Vec::with_capacity(cfg.depth);
        for i in 0..cfg.depth {
            let b = format!("blocks.{i}");
            blocks.push(Block {
                norm1: norm(st, &format!("{b}.norm1"), h)?,
                norm2: norm(st, &format!("{b}.norm2"), h)?,
                qkv: Biased::load(st, &format!("{b}.attn.qkv"), 3 * h, h)?,
                proj: Biased::load(st, &format!("{b}.attn.proj"), h, h)?,
                fc1: Biased::load(st, &format!("{b}.mlp.linear_fc1"), cfg.intermediate_size, h)?,
                fc2: Biased::load(st, &format!("{b}.mlp.linear_fc2"), h, cfg.intermediate_size)?,
            });
        }
        let merged = h * cfg.spatial_merge_size * cfg.spatial_merge_size;
        let merger_norm = norm(st, "merger.norm", h)?;
        let merger_fc1 = Biased::load(st, "merger.linear_fc1", merged, merged)?;
        let merger_fc2 = Biased::load(st, "merger.linear_fc2", cfg.out_hidden_size, merged)?;
        // mlx-vlm's VisionRotaryEmbedding(head_dim / 2): inv_freq in f32 as mlx computes it,
        // the first half of the rotated frequencies turning with the patch row, the second
        // with its column.
        let dim = cfg.head_dim() / 2;
        let quarter: Vec<f32> = (0..dim / 2)
            .map(|i| 1.0 / 10000f32.powf((2 * i) as f32 / dim as f32))
            .collect();
        let inv_freq = [quarter.clone(), quarter].concat();
        let axis = (0..dim).map(|i| if i < dim / 2 { 1 } else { 2 }).collect();
        Ok(VisionTower {
            cfg: cfg.clone(),
            patch,
            pos_embed,
            blocks,
            merger_norm,
            merger_fc1,
            merger_fc2,
            rope: Rope::from_parts(inv_freq, axis),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &VisionConfig {
        &self.cfg
    }

    /// Features of one image or video: `pixels` holds `t·h·w` patches (the processor's
    /// `pixel_values` rows, `C·T·P·P` floats each) of a `grid_thw = [t, h, w]` patch grid;
    /// returns `[t·h·w / merge², out_hidden_size]`, the rows that replace the image's
    /// `<|image_pad|>` tokens.
    pub fn forward(&self, pixels: &[f32], grid_thw: [usize; 3]) -> Result<Vec<f32>> {
        let cfg = &self.cfg;
        let [t, gh, gw] = grid_thw;
        let m = cfg.spatial_merge_size;
        let row_len = cfg.in_channels * cfg.temporal_patch_size * cfg.patch_size.pow(2);
        let n = t
            .checked_mul(gh)
            .and_then(|x| x.checked_mul(gw))
            .filter(|&n| n > 0)
            .ok_or_else(|| Error::InvalidRequest(format!("empty image grid {grid_thw:?}")))?;
        if !gh.is_multiple_of(m) || !gw.is_multiple_of(m) {
            return Err(Error::InvalidRequest(format!(
                "image grid {grid_thw:?} is not a multiple of the merge size {m}"
            )));
        }
        if n.checked_mul(row_len) != Some(pixels.len()) {
            return Err(Error::ShapeMismatch {
                name: "the image's pixel values".into(),
                expected: vec![n, row_len],
                actual: vec![pixels.len()],
            });
        }
        let d = cfg.hidden_size;
        let mut x = self.patch.forward(pixels, n)?;
        let pos = self.position_embeddings(t, gh, gw);
        x.iter_mut().zip(&pos).for_each(|(a, b)| *a += b);
        let coords = patch_coords(t, gh, gw, m);
        let frame = gh * gw;
        for b in &self.blocks {
            let mut normed = x.clone();
            layer_norm(&mut normed, &b.norm1.0, &b.norm1.1, d);
            let attn = self.attention(b, &normed, n, frame, &coords)?;
            x.iter_mut().zip(&attn).for_each(|(a, b)| *a += b);
            let mut normed = x.clone();
            layer_norm(&mut normed, &b.norm2.0, &b.norm2.1, d);
            let mut hmid = b.fc1.forward(&normed, n)?;
            hmid.iter_mut().for_each(|v| *v = gelu_tanh(*v));
            let y = b.fc2.forward(&hmid, n)?;
            x.iter_mut().zip(&y).for_each(|(a, b)| *a += b);
        }
        // merger: norm per patch, then each merge² consecutive patches (one square, in the
        // processor's order) as one row
        layer_norm(&mut x, &self.merger_norm.0, &self.merger_norm.1, d);
        let rows = n / (m * m);
        let mut y = self.merger_fc1.forward(&x, rows)?;
        y.iter_mut().for_each(|v| *v = gelu_erf(*v));
        self.merger_fc2.forward(&y, rows)
    }

    /// mlx-vlm's `fast_pos_embed_interpolate`: the learned grid bilinearly sampled at
    /// `linspace(0, side - 1, h) × linspace(0, side - 1, w)`, in the patches' order.
    fn position_embeddings(&self, t: usize, gh: usize, gw: usize) -> Vec<f32> {
        let d = self.cfg.hidden_size;
        let side = self.cfg.grid_per_side();
        // mlx's linspace computes (i / (num - 1)) * (stop - start) in f32
        let lin = |num: usize| -> Vec<f32> {
            if num == 1 {
                return vec![0.0];
            }
            (0..num)
                .map(|i| (i as f32 / (num - 1) as f32) * (side - 1) as f32)
                .collect()
        };
        let (hs, ws) = (lin(gh), lin(gw));
        let mut raster = vec![0f32; gh * gw * d];
        for (r, &hv) in hs.iter().enumerate() {
            let h0 = hv as usize;
            let h1 = (h0 + 1).min(side - 1);
            let dh = hv - h0 as f32;
            for (c, &wv) in ws.iter().enumerate() {
                let w0 = wv as usize;
                let w1 = (w0 + 1).min(side - 1);
                let dw = wv - w0 as f32;
                let taps = [
                    (h0 * side + w0, (1.0 - dh) * (1.0 - dw)),
                    (h0 * side + w1, (1.0 - dh) * dw),
                    (h1 * side + w0, dh * (1.0 - dw)),
                    (h1 * side + w1, dh * dw),
                ];
                let out = &mut raster[(r * gw + c) * d..(r * gw + c + 1) * d];
                for (k, (idx, wt)) in taps.into_iter().enumerate() {
                    let e = &self.pos_embed[idx * d..(idx + 1) * d];
                    if k == 0 {
                        out.iter_mut().zip(e).for_each(|(o, v)| *o = v * wt);
                    } else {
                        out.iter_mut().zip(e).for_each(|(o, v)| *o += v * wt);
                    }
                }
            }
        }
        let m = self.cfg.spatial_merge_size;
        let mut out = Vec::with_capacity(t * gh * gw * d);
        for _ in 0..t {
            for [_, r, c] in patch_coords(1, gh, gw, m) {
                out.extend_from_slice(&raster[(r * gw + c) * d..(r * gw + c + 1) * d]);
            }
        }
        out
    }

    /// Full attention of every patch over the patches of its frame, with the 2D rope.
    fn attention(
        &self,
        b: &Block,
        x: &[f32],
        n: usize,
        frame: usize,
        coords: &[[usize; 3]],
    ) -> Result<Vec<f32>> {
        let d = self.cfg.hidden_size;
        let heads = self.cfg.num_heads;
        let hd = self.cfg.head_dim();
        let qkv = b.qkv.forward(x, n)?; // [n, 3, heads, hd]
                                        // per head, [n, hd] each
        let mut q = vec![0f32; heads * n * hd];
        let mut k = vec![0f32; heads * n * hd];
        let mut v = vec![0f32; heads * n * hd];
        for i in 0..n {
            let row = &qkv[i * 3 * d..(i + 1) * 3 * d];
            for h in 0..heads {
                let dst = (h * n + i) * hd..(h * n + i + 1) * hd;
                q[dst.clone()].copy_from_slice(&row[h * hd..(h + 1) * hd]);
                k[dst.clone()].copy_from_slice(&row[d + h * hd..d + (h + 1) * hd]);
                v[dst.clone()].copy_from_slice(&row[2 * d + h * hd..2 * d + (h + 1) * hd]);
                self.rope.apply_at(&mut q[dst.clone()], coords[i]);
                self.rope.apply_at(&mut k[dst], coords[i]);
            }
        }
        let scale = (hd as f64).powf(-0.5);
        let mut out = vec![0f32; n * d];
        let dev = Device::Cpu;
        for h in 0..heads {
            for f0 in (0..n).step_by(frame) {
                let len = frame.min(n - f0);
                let at = |buf: &[f32]| -> Result<Tensor> {
                    let s = &buf[(h * n + f0) * hd..(h * n + f0 + len) * hd];
                    Ok(Tensor::from_slice(s, (len, hd), &dev)?)
                };
                let (qt, kt, vt) = (at(&q)?, at(&k)?, at(&v)?);
                let scores = (qt.matmul(&kt.t()?)? * scale)?;
                let mut s = scores.flatten_all()?.to_vec1::<f32>()?;
                for row in s.chunks_exact_mut(len) {
                    softmax(row);
                }
                let p = Tensor::from_vec(s, (len, len), &dev)?;
                let o = p.matmul(&vt)?.flatten_all()?.to_vec1::<f32>()?;
                for i in 0..len {
                    out[(f0 + i) * d + h * hd..(f0 + i) * d + (h + 1) * hd]
                        .copy_from_slice(&o[i * hd..(i + 1) * hd]);
                }
            }
        }
        b.proj.forward(&out, n)
    }
}

/// `[t, row, col]` of every patch in the processor's order: frame, then each `m × m` square
/// of patches row by row, then the patches within the square row by row (mlx-vlm's
/// `rot_pos_emb` coordinates).
fn patch_coords(t: usize, gh: usize, gw: usize, m: usize) -> Vec<[usize; 3]> {
    let mut out = Vec::with_capacity(t * gh * gw);
    for f in 0..t {
        for bh in 0..gh / m {
            for bw in 0..gw / m {
                for ih in 0..m {
                    for iw in 0..m {
                        out.push([f, bh * m + ih, bw * m + iw]);
                    }
                }
            }
        }
    }
    out
}

/// Layer norm of each `d`-wide row in place: `(x - mean) / sqrt(var + eps) * w + b`.
fn layer_norm(x: &mut [f32], w: &[f32], b: &[f32], d: usize) {
    for row in x.chunks_exact_mut(d) {
        let mean = row.iter().sum::<f32>() / d as f32;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / d as f32;
        let inv = 1.0 / (var + LN_EPS).sqrt();
        for ((v, w), b) in row.iter_mut().zip(w).zip(b) {
            *v = (*v - mean) * inv * w + b;
        }
    }
}

/// `gelu_pytorch_tanh`: `0.5 x (1 + tanh(sqrt(2/π) (x + 0.044715 x³)))`.
fn gelu_tanh(x: f32) -> f32 {
    const K: f32 = 0.797_884_6; // sqrt(2 / pi)
    0.5 * x * (1.0 + (K * (x + 0.044_715 * x * x * x)).tanh())
}

/// Exact GELU: `x (1 + erf(x / √2)) / 2`.
fn gelu_erf(x: f32) -> f32 {
    x * (1.0 + candle_core::cpu::erf::erf_f32(x * std::f32::consts::FRAC_1_SQRT_2)) / 2.0
}

/// Softmax of one row in place (max subtracted first).
fn softmax(row: &mut [f32]) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f32;
    for v in row.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    row.iter_mut().for_each(|v| *v /= sum);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patch_coords_follow_the_processor_order() {
        // a 4 x 4 grid merged 2 x 2: the first square is (0,0) (0,1) (1,0) (1,1)
        let c = patch_coords(1, 4, 4, 2);
        assert_eq!(
            &c[..5],
            &[[0, 0, 0], [0, 0, 1], [0, 1, 0], [0, 1, 1], [0, 0, 2]]
        );
        assert_eq!(c[15], [0, 3, 3]);
        assert_eq!(patch_coords(2, 2, 2, 2)[4], [1, 0, 0]);
    }

    #[test]
    fn gelus_match_their_definitions() {
        for x in [-3.0f32, -0.5, 0.0, 0.7, 2.5] {
            let erf = 0.5 * x as f64 * (1.0 + libm_erf(x as f64 / 2f64.sqrt()));
            assert!((gelu_erf(x) as f64 - erf).abs() < 1e-6, "{x}");
            let k = (2.0 / std::f64::consts::PI).sqrt();
            let tanh =
                0.5 * x as f64 * (1.0 + (k * (x as f64 + 0.044715 * (x as f64).powi(3))).tanh());
            assert!((gelu_tanh(x) as f64 - tanh).abs() < 1e-6, "{x}");
        }
    }

    /// erf by its Taylor series (the test's independent reference).
    fn libm_erf(x: f64) -> f64 {
        let mut sum = 0.0;
        let mut term = x;
        for n in 0..60 {
            sum += term / (2 * n + 1) as f64;
            term *= -x * x / (n + 1) as f64;
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    }
}
