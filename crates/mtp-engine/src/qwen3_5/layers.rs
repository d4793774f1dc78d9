//! Qwen3.5's decoder layer and its parts: full attention with an output gate (`Attention`),
//! Gated DeltaNet linear attention (`DeltaNet`), the dense SwiGLU or sparse-MoE MLP, and
//! `DecoderLayer`, which the target model and the MTP head both stack. Numerics follow
//! mlx-vlm 0.7.10 `models/qwen3_5`, `qwen3_5_moe` and `qwen3_next`.

use crate::cache::{LayerCache, LinearState, PendingSteps};
use crate::config::{Family, ModelConfig};
use crate::error::{Error, Result};
use crate::kernels::{self, AttentionShape, DeltaDims, DeltaIn, Rope};
use crate::nn::{tally, Linear, Positions, Store};
use crate::scratch;

/// Full attention with an output gate, q/k RMSNorm, GQA and partial rotary embedding.
#[derive(Debug)]
pub struct Attention {
    qkv: Linear,
    o: Linear,
    q_norm: Vec<f32>,
    k_norm: Vec<f32>,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    rope: Rope,
    eps: f32,
}

/// Gated DeltaNet linear attention.
#[derive(Debug)]
pub struct DeltaNet {
    /// `[qkv | z | b | a]` projections fused: `[2 key_dim + 2 value_dim + 2 hv, hidden]`.
    proj: Linear,
    /// `[kernel, conv_dim]`, tap-major (see [`kernels::causal_conv_silu`]).
    conv_w: Vec<f32>,
    a_exp: Vec<f32>,
    dt_bias: Vec<f32>,
    norm_w: Vec<f32>,
    out: Linear,
    dims: DeltaDims,
    kernel: usize,
    qk_eps: f32,
    eps: f32,
}

/// A token mixer.
#[derive(Debug)]
pub enum Mixer {
    /// Full attention.
    Attention(Attention),
    /// Linear attention.
    Linear(DeltaNet),
}

/// Sparse mixture of experts with a gated shared expert.
#[derive(Debug)]
pub struct Moe {
    router: Linear,
    /// Per expert `[2 I, D]`: gate rows then up rows.
    gate_up: Vec<Linear>,
    /// Per expert `[D, I]`.
    down: Vec<Linear>,
    inter: usize,
    top_k: usize,
    norm_topk: bool,
    shared_gate_up: Option<Linear>,
    shared_down: Option<Linear>,
    shared_gate: Option<Linear>,
}

/// The MLP of a decoder layer.
#[derive(Debug)]
pub enum Mlp {
    /// SwiGLU with fused gate/up.
    Dense {
        /// `[2 I, D]`.
        gate_up: Linear,
        /// `[D, I]`.
        down: Linear,
    },
    /// Sparse MoE.
    Moe(Moe),
}

/// One decoder layer: `h = x + mixer(norm(x)); out = h + mlp(norm(h))`.
#[derive(Debug)]
pub struct DecoderLayer {
    in_norm: Vec<f32>,
    post_norm: Vec<f32>,
    /// The token mixer.
    pub mixer: Mixer,
    mlp: Mlp,
    eps: f32,
    hidden: usize,
}

impl DecoderLayer {
    /// Adds this layer's matrices to a per-kind tally of bytes (see [`Linear::held`]).
    pub fn weights_held(&self, into: &mut std::collections::BTreeMap<String, usize>) {
        let mut linears: Vec<&Linear> = Vec::new();
        match &self.mixer {
            Mixer::Attention(a) => linears.extend([&a.qkv, &a.o]),
            Mixer::Linear(d) => linears.extend([&d.proj, &d.out]),
        }
        match &self.mlp {
            Mlp::Dense { gate_up, down } => linears.extend([gate_up, down]),
            Mlp::Moe(m) => {
                linears.push(&m.router);
                linears.extend(m.shared_gate_up.iter());
                linears.extend(m.shared_down.iter());
                linears.extend(m.shared_gate.iter());
                linears.extend(m.gate_up.iter().chain(&m.down));
            }
        }
        for l in linears {
            tally(into, l.held());
        }
    }

    /// Builds layer `prefix` (e.g. `layers.3`) of type `full`/linear and MoE or dense.
    pub fn load(
        st: &mut Store,
        cfg: &ModelConfig,
        prefix: &str,
        full: bool,
        moe: bool,
    ) -> Result<Self> {
        let d = cfg.text.hidden_size;
        let eps = cfg.text.rms_norm_eps as f32;
        let mixer = if full {
            Mixer::Attention(Attention::load(st, cfg, prefix, eps)?)
        } else {
            Mixer::Linear(DeltaNet::load(st, cfg, prefix, eps)?)
        };
        let mlp = Mlp::load(st, cfg, &format!("{prefix}.mlp"), moe)?;
        Ok(DecoderLayer {
            in_norm: st.vec(&format!("{prefix}.input_layernorm.weight"), d)?,
            post_norm: st.vec(&format!("{prefix}.post_attention_layernorm.weight"), d)?,
            mixer,
            mlp,
            eps,
            hidden: d,
        })
    }

    /// A fresh cache for this layer, a full-attention layer's keys and values in `kv`.
    pub fn new_cache(&self, kv: crate::cache::KvType) -> LayerCache {
        match &self.mixer {
            Mixer::Attention(a) => {
                LayerCache::Attention(crate::cache::KvCache::with_type(a.kv_heads, a.head_dim, kv))
            }
            Mixer::Linear(n) => {
                let conv_dim = 2 * n.dims.hk * n.dims.dk + n.dims.hv * n.dims.dv;
                let mut st = crate::cache::LinearState {
                    conv: vec![0.0; (n.kernel - 1) * conv_dim],
                    state: vec![0.0; n.dims.hv * n.dims.dv * n.dims.dk],
                    ..Default::default()
                };
                // (the shapes of its pending steps, which a saved state is checked against)
                st.pending.dims = n.dims;
                LayerCache::Linear(st)
            }
        }
    }

    /// `x: [b, l, hidden]` → `[b, l, hidden]`; `caches[i]` and `positions[i]` (where the new
    /// tokens sit) belong to row `i`.
    pub fn forward(
        &self,
        x: &[f32],
        b: usize,
        l: usize,
        caches: &mut [&mut LayerCache],
        positions: &[Positions<'_>],
    ) -> Result<Vec<f32>> {
        self.forward_ragged(x, &vec![l; b], caches, positions)
    }

    /// Sequences of different lengths in one forward: `x` holds `lens[0]` rows of sequence 0,
    /// then `lens[1]` rows of sequence 1, ...; `caches[i]` and `positions[i]` belong to
    /// sequence `i`. Every row is computed as it would be alone.
    pub fn forward_ragged(
        &self,
        x: &[f32],
        lens: &[usize],
        caches: &mut [&mut LayerCache],
        positions: &[Positions<'_>],
    ) -> Result<Vec<f32>> {
        let (n, normed) = self.ragged_input(x, lens, caches.len(), positions.len())?;
        let r = match &self.mixer {
            Mixer::Attention(a) => a.forward(&normed, lens, caches, positions, false)?,
            Mixer::Linear(m) => m.forward(&normed, lens, caches)?,
        };
        scratch::recycle(normed);
        let h = self.finish(scratch::copy(x), &r, n);
        scratch::recycle(r);
        h
    }

    /// Caches all `l` positions of one sequence but returns only the last one's output
    /// `[hidden]` (the MTP head's last layer: earlier positions only need their keys and
    /// values). The result is bit-identical to the last row of [`DecoderLayer::forward`].
    pub fn forward_last(
        &self,
        x: &[f32],
        l: usize,
        cache: &mut LayerCache,
        position: usize,
    ) -> Result<Vec<f32>> {
        self.check_rows(x, &[l])?;
        if l == 0 {
            return Ok(Vec::new());
        }
        self.forward_last_ragged(x, &[l], &mut [cache], &[Positions::From(position)])
    }

    /// [`DecoderLayer::forward_last`] for several sequences of `lens` rows (at least one each)
    /// in one pass: `[b, hidden]`, each sequence's last row.
    pub fn forward_last_ragged(
        &self,
        x: &[f32],
        lens: &[usize],
        caches: &mut [&mut LayerCache],
        positions: &[Positions<'_>],
    ) -> Result<Vec<f32>> {
        let (d, b) = (self.hidden, lens.len());
        if lens.contains(&0) {
            return Err(Error::InvalidRequest(
                "the last rows of a sequence of no rows".into(),
            ));
        }
        let (_, normed) = self.ragged_input(x, lens, caches.len(), positions.len())?;
        // each sequence's last row
        let mut ends = Vec::with_capacity(b);
        let mut end = 0;
        for &l in lens {
            end += l;
            ends.push(end - 1);
        }
        let r = match &self.mixer {
            Mixer::Attention(a) => a.forward(&normed, lens, caches, positions, true)?,
            // a recurrence needs every position anyway
            Mixer::Linear(m) => {
                let all = m.forward(&normed, lens, caches)?;
                ends.iter()
                    .flat_map(|&e| all[e * d..(e + 1) * d].iter().copied())
                    .collect()
            }
        };
        let residual: Vec<f32> = ends
            .iter()
            .flat_map(|&e| x[e * d..(e + 1) * d].iter().copied())
            .collect();
        self.finish(residual, &r, b)
    }

    /// Checks a ragged forward's input (a cache and a position for each of the sequences of
    /// `lens` rows, `x` holding all their rows) and returns its row count and `x` through the
    /// input norm.
    fn ragged_input(
        &self,
        x: &[f32],
        lens: &[usize],
        caches: usize,
        positions: usize,
    ) -> Result<(usize, Vec<f32>)> {
        let b = lens.len();
        if caches != b || positions != b {
            return Err(Error::InvalidRequest(format!(
                "a decoder layer over {b} sequences was given {caches} caches and {positions} \
                 positions"
            )));
        }
        let total = lens.iter().try_fold(0usize, |a, &l| a.checked_add(l));
        let n = self.check_rows(x, &[total.unwrap_or(usize::MAX)])?;
        let mut normed = scratch::copy(x);
        kernels::rms_norm_rows(&mut normed, Some(&self.in_norm), self.hidden, self.eps);
        Ok((n, normed))
    }

    /// The row count `x` must hold (`lead` times the hidden size floats), or a
    /// [`Error::ShapeMismatch`] naming the input.
    fn check_rows(&self, x: &[f32], lead: &[usize]) -> Result<usize> {
        let mut dims = lead.to_vec();
        dims.push(self.hidden);
        match kernels::elements(lead) {
            Some(n) if kernels::elements(&dims) == Some(x.len()) => Ok(n),
            _ => Err(Error::ShapeMismatch {
                name: "the input of a decoder layer".into(),
                expected: dims,
                actual: vec![x.len()],
            }),
        }
    }

    /// Residual, post-norm and MLP over `n` rows of mixer output `r`.
    fn finish(&self, mut h: Vec<f32>, r: &[f32], n: usize) -> Result<Vec<f32>> {
        h.iter_mut().zip(r).for_each(|(a, b)| *a += b);
        let mut normed = scratch::copy(&h);
        kernels::rms_norm_rows(&mut normed, Some(&self.post_norm), self.hidden, self.eps);
        let m = self.mlp.forward(&normed, n)?;
        scratch::recycle(normed);
        h.iter_mut().zip(&m).for_each(|(a, b)| *a += b);
        scratch::recycle(m);
        Ok(h)
    }
}

impl Attention {
    /// Builds layer `prefix`'s full attention (`{prefix}.self_attn`).
    fn load(st: &mut Store, cfg: &ModelConfig, prefix: &str, eps: f32) -> Result<Self> {
        let t = &cfg.text;
        let d = t.hidden_size;
        let hd = cfg.head_dim();
        let (h, kvh) = (t.num_attention_heads, t.num_key_value_heads);
        let p = format!("{prefix}.self_attn");
        let qkv = st.fused_linear(
            &[
                (&format!("{p}.q_proj"), h * hd * 2),
                (&format!("{p}.k_proj"), kvh * hd),
                (&format!("{p}.v_proj"), kvh * hd),
            ],
            d,
        )?;
        let rot = (hd as f64 * cfg.partial_rotary_factor()) as usize;
        Ok(Attention {
            qkv,
            o: st.linear(&format!("{p}.o_proj"), d, h * hd)?,
            q_norm: st.vec(&format!("{p}.q_norm.weight"), hd)?,
            k_norm: st.vec(&format!("{p}.k_norm.weight"), hd)?,
            heads: h,
            kv_heads: kvh,
            head_dim: hd,
            rope: Rope::interleaved(rot, cfg.rope_theta(), cfg.rope.mrope_section),
            eps,
        })
    }

    /// With `last_only`, every position is cached but only the last one's output is computed
    /// (`[b, 1, hidden]`).
    fn forward(
        &self,
        x: &[f32],
        lens: &[usize],
        caches: &mut [&mut LayerCache],
        positions: &[Positions<'_>],
        last_only: bool,
    ) -> Result<Vec<f32>> {
        let (h, kvh, hd) = (self.heads, self.kv_heads, self.head_dim);
        for (p, &l) in positions.iter().zip(lens) {
            if let Positions::Each(ids) = p {
                if ids.len() != l {
                    return Err(Error::InvalidRequest(format!(
                        "{} position ids for {l} new tokens",
                        ids.len()
                    )));
                }
            }
        }
        let rows: usize = lens.iter().sum();
        let qkv = self.qkv.forward(x, rows)?; // [rows, h*2hd + 2*kvh*hd]
        let width = h * hd * 2 + 2 * kvh * hd;
        let scale = 1.0 / (hd as f32).sqrt();
        // queries whose outputs are computed, per sequence
        let lqs: Vec<usize> = lens
            .iter()
            .map(|&l| if last_only { l.min(1) } else { l })
            .collect();
        let out_rows: usize = lqs.iter().sum();
        let mut out = scratch::zeroed(out_rows * h * hd);
        let (mut in_off, mut out_off) = (0usize, 0usize);
        for (bi, (&l, &lq)) in lens.iter().zip(&lqs).enumerate() {
            let mut q = scratch::zeroed(l * h * hd);
            let mut gate = scratch::zeroed(l * h * hd);
            let mut k = scratch::zeroed(l * kvh * hd);
            let mut v = scratch::zeroed(l * kvh * hd);
            for t in 0..l {
                let row = &qkv[(in_off + t) * width..(in_off + t + 1) * width];
                // q_proj rows are [q_h, gate_h] per head
                for head in 0..h {
                    let src = &row[head * 2 * hd..(head + 1) * 2 * hd];
                    q[(t * h + head) * hd..(t * h + head + 1) * hd].copy_from_slice(&src[..hd]);
                    gate[(t * h + head) * hd..(t * h + head + 1) * hd].copy_from_slice(&src[hd..]);
                }
                k[t * kvh * hd..(t + 1) * kvh * hd]
                    .copy_from_slice(&row[h * 2 * hd..h * 2 * hd + kvh * hd]);
                v[t * kvh * hd..(t + 1) * kvh * hd].copy_from_slice(&row[h * 2 * hd + kvh * hd..]);
            }
            kernels::rms_norm_rows(&mut q, Some(&self.q_norm), hd, self.eps);
            kernels::rms_norm_rows(&mut k, Some(&self.k_norm), hd, self.eps);
            for t in 0..l {
                let rotate = |x: &mut [f32]| match positions[bi] {
                    Positions::From(start) => self.rope.apply(x, start + t),
                    Positions::Each(ids) => self.rope.apply_at(x, ids[t]),
                };
                for head in 0..h {
                    rotate(&mut q[(t * h + head) * hd..(t * h + head + 1) * hd]);
                }
                for head in 0..kvh {
                    rotate(&mut k[(t * kvh + head) * hd..(t * kvh + head + 1) * hd]);
                }
            }
            let LayerCache::Attention(kv) = &mut *caches[bi] else {
                return Err(Error::Unsupported(
                    "a linear-attention cache on a full-attention layer".into(),
                ));
            };
            kv.append(&k, &v);
            let first = (l - lq) * h * hd;
            let o = kv.attend(
                &q[first..],
                AttentionShape {
                    l: lq,
                    h,
                    hkv: kvh,
                    hd,
                    scale,
                },
            );
            let dst = &mut out[out_off * h * hd..(out_off + lq) * h * hd];
            kernels::sigmoid_mul(dst, &gate[first..], &o);
            [q, gate, k, v, o].into_iter().for_each(scratch::recycle);
            in_off += l;
            out_off += lq;
        }
        scratch::recycle(qkv);
        let y = self.o.forward(&out, out_rows);
        scratch::recycle(out);
        y
    }
}

/// The widths of a [`DeltaNet`]'s rows.
#[derive(Clone, Copy)]
struct DeltaWidths {
    /// `hk · dk`: a step's queries, or keys.
    key: usize,
    /// `hv · dv`: a step's values, or outputs.
    value: usize,
    /// `2 key + value`: the conv's channels, `[q | k | v]`.
    conv: usize,
    /// `conv + value + 2 hv`: a projected row, `[q | k | v | z | b | a]`.
    proj: usize,
}

impl DeltaNet {
    /// Builds layer `prefix`'s Gated DeltaNet (`{prefix}.linear_attn`).
    fn load(st: &mut Store, cfg: &ModelConfig, prefix: &str, eps: f32) -> Result<Self> {
        let t = &cfg.text;
        let d = t.hidden_size;
        let dims = DeltaDims {
            hk: t.linear_num_key_heads,
            hv: t.linear_num_value_heads,
            dk: t.linear_key_head_dim,
            dv: t.linear_value_head_dim,
        };
        let key_dim = dims.hk * dims.dk;
        let value_dim = dims.hv * dims.dv;
        let conv_dim = 2 * key_dim + value_dim;
        let k = t.linear_conv_kernel_dim;
        let p = format!("{prefix}.linear_attn");
        let proj = st.fused_linear(
            &[
                (&format!("{p}.in_proj_qkv"), conv_dim),
                (&format!("{p}.in_proj_z"), value_dim),
                (&format!("{p}.in_proj_b"), dims.hv),
                (&format!("{p}.in_proj_a"), dims.hv),
            ],
            d,
        )?;
        let a_log = st.vec(&format!("{p}.A_log"), dims.hv)?;
        Ok(DeltaNet {
            proj,
            conv_w: {
                // `[conv_dim, k]` to the kernel's tap-major `[k, conv_dim]`
                let w = st.mat_f32(&format!("{p}.conv1d.weight"), &[conv_dim, k])?;
                (0..k * conv_dim)
                    .map(|i| w[(i % conv_dim) * k + i / conv_dim])
                    .collect()
            },
            a_exp: a_log.iter().map(|a| a.exp()).collect(),
            dt_bias: st.vec(&format!("{p}.dt_bias"), dims.hv)?,
            norm_w: st.vec(&format!("{p}.norm.weight"), dims.dv)?,
            out: st.linear(&format!("{p}.out_proj"), d, value_dim)?,
            dims,
            kernel: k,
            // Qwen3.5 folds the l2norm epsilon into an RMSNorm as eps / dk; Qwen3-Next uses
            // 1e-6 directly.
            qk_eps: match cfg.family {
                Family::Qwen35 => 1e-6 / dims.dk as f32,
                Family::Qwen3Next => 1e-6,
            },
            eps,
        })
    }

    /// The widths of this mixer's rows.
    fn widths(&self) -> DeltaWidths {
        let dm = self.dims;
        let (key, value) = (dm.hk * dm.dk, dm.hv * dm.dv);
        let conv = 2 * key + value;
        DeltaWidths {
            key,
            value,
            conv,
            proj: conv + value + 2 * dm.hv,
        }
    }

    fn forward(
        &self,
        x: &[f32],
        lens: &[usize],
        caches: &mut [&mut LayerCache],
    ) -> Result<Vec<f32>> {
        let rows_total: usize = lens.iter().sum();
        let DeltaWidths {
            value: value_dim,
            proj: width,
            ..
        } = self.widths();
        let proj = self.proj.forward(x, rows_total)?; // [rows, width]
        let mut out = scratch::zeroed(rows_total * value_dim);
        let mut off = 0usize;
        for (bi, &l) in lens.iter().enumerate() {
            let LayerCache::Linear(st) = &mut *caches[bi] else {
                return Err(Error::Unsupported(
                    "a KV cache on a linear-attention layer".into(),
                ));
            };
            if st.verify_pending() {
                return Err(Error::Unsupported(
                    crate::cache::SECOND_VERIFY_FORWARD.into(),
                ));
            }
            let rows = &proj[off * width..(off + l) * width];
            let dst = &mut out[off * value_dim..(off + l) * value_dim];
            self.sequence(st, rows, l, dst);
            off += l;
        }
        scratch::recycle(proj);
        let y = self.out.forward(&out, rows_total);
        scratch::recycle(out);
        y
    }

    /// One sequence's `l` steps: its projected rows `rows` `[l, width]` through the conv and
    /// the delta rule (after the steps a verify kept, settled in this pass), gated into `dst`
    /// `[l, value_dim]`.
    fn sequence(&self, st: &mut LinearState, rows: &[f32], l: usize, dst: &mut [f32]) {
        let dm = self.dims;
        let deferring = st.deferring;
        let (mixed, z, g, beta) = self.split_gates(rows, l, &st.pending);
        // a verify forward works on a copy of the conv window (a few rows)
        let mut window_copy;
        let window = if deferring {
            window_copy = st.conv.clone();
            &mut window_copy
        } else {
            &mut st.conv
        };
        let conv_dim = self.widths().conv;
        let conv_out = kernels::causal_conv_silu(window, &mixed, &self.conv_w, conv_dim);
        let (q, k, v) = self.queries_keys_values(&conv_out, l, &st.pending);
        let mut y = self.delta_rule(st, [&q, &k, &v, &g, &beta], &mixed);
        // gated RMSNorm: rms_norm(y) * w * silu(z), per value head
        kernels::rms_norm_rows(&mut y, Some(&self.norm_w), dm.dv, self.eps);
        kernels::silu_mul(dst, &z, &y);
        [mixed, z, conv_out, q, k, v, y]
            .into_iter()
            .for_each(scratch::recycle);
    }

    /// Splits projected rows `[l, width]` into the conv's input `[l, conv_dim]`, the output
    /// gate `z` `[l, value_dim]`, and each head's decay `g` and write strength `beta`
    /// `[settle + l, hv]`, the `settle` steps a verify kept first.
    fn split_gates(
        &self,
        rows: &[f32],
        l: usize,
        pending: &PendingSteps,
    ) -> (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>) {
        let dm = self.dims;
        let settle = pending.settle;
        let DeltaWidths {
            value: value_dim,
            conv: conv_dim,
            proj: width,
            ..
        } = self.widths();
        let mut mixed = scratch::with_capacity(l * conv_dim);
        let mut z = scratch::with_capacity(l * value_dim);
        // the steps a verify kept come first, settled in this forward's pass
        let mut g = Vec::with_capacity((settle + l) * dm.hv);
        let mut beta = Vec::with_capacity((settle + l) * dm.hv);
        g.extend_from_slice(&pending.g[..settle * dm.hv]);
        beta.extend_from_slice(&pending.beta[..settle * dm.hv]);
        for t in 0..l {
            let r = &rows[t * width..(t + 1) * width];
            mixed.extend_from_slice(&r[..conv_dim]);
            z.extend_from_slice(&r[conv_dim..conv_dim + value_dim]);
            let bb = &r[conv_dim + value_dim..conv_dim + value_dim + dm.hv];
            let aa = &r[conv_dim + value_dim + dm.hv..];
            for h in 0..dm.hv {
                beta.push(kernels::sigmoid(bb[h]));
                // g = exp(-exp(A_log) * softplus(a + dt_bias))
                g.push(kernels::exp(
                    -self.a_exp[h] * kernels::softplus(aa[h] + self.dt_bias[h]),
                ));
            }
        }
        (mixed, z, g, beta)
    }

    /// The conv's output `[l, conv_dim]` split into `[q | k | v]` per step, q and k normalised
    /// per head: `[settle + l, key_dim]`, `[settle + l, key_dim]`, `[settle + l, value_dim]`,
    /// the `settle` steps a verify kept first.
    fn queries_keys_values(
        &self,
        conv_out: &[f32],
        l: usize,
        pending: &PendingSteps,
    ) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let dm = self.dims;
        let settle = pending.settle;
        let DeltaWidths {
            key: key_dim,
            value: value_dim,
            conv: conv_dim,
            ..
        } = self.widths();
        let mut q = scratch::with_capacity((settle + l) * key_dim);
        let mut k = scratch::with_capacity((settle + l) * key_dim);
        let mut v = scratch::with_capacity((settle + l) * value_dim);
        v.extend_from_slice(&pending.v[..settle * value_dim]);
        for t in 0..l {
            let r = &conv_out[t * conv_dim..(t + 1) * conv_dim];
            q.extend_from_slice(&r[..key_dim]);
            k.extend_from_slice(&r[key_dim..2 * key_dim]);
            v.extend_from_slice(&r[2 * key_dim..]);
        }
        let inv = 1.0 / (dm.dk as f32).sqrt();
        kernels::rms_norm_rows(&mut q, None, dm.dk, self.qk_eps);
        kernels::rms_norm_rows(&mut k, None, dm.dk, self.qk_eps);
        q.iter_mut().for_each(|x| *x *= inv * inv);
        k.iter_mut().for_each(|x| *x *= inv);
        if settle > 0 {
            q.splice(0..0, pending.q[..settle * key_dim].iter().copied());
            k.splice(0..0, pending.k[..settle * key_dim].iter().copied());
        }
        (q, k, v)
    }

    /// The delta rule over the steps `[q, k, v, g, beta]` (the kept ones first), `[settle + l,
    /// hv, dv]` out. A verify forward either leaves the state (its steps settle later) or
    /// advances it and keeps a copy from before its steps (see `cache`); its own steps (and
    /// their conv input `mixed`) then wait in `st.pending` for `commit_verify`.
    fn delta_rule(&self, st: &mut LinearState, steps: [&[f32]; 5], mixed: &[f32]) -> Vec<f32> {
        let [q, k, v, g, beta] = steps;
        let dm = self.dims;
        let (deferring, settle) = (st.deferring, st.pending.settle);
        let DeltaWidths {
            key: key_dim,
            value: value_dim,
            ..
        } = self.widths();
        let in_place = deferring && st.backs_up;
        if in_place {
            st.backup.resize(st.state.len(), 0.0);
        }
        let backup: &mut [f32] = if in_place { &mut st.backup } else { &mut [] };
        let y = kernels::gated_delta(
            DeltaIn {
                d: dm,
                q,
                k,
                v,
                g,
                beta,
                settle,
                advance: !deferring || in_place,
            },
            &mut st.state,
            backup,
        );
        let p = &mut st.pending;
        p.clear();
        if deferring {
            // this forward's steps wait for `commit_verify`
            p.dims = dm;
            p.conv_in.extend_from_slice(mixed);
            p.q.extend_from_slice(&q[settle * key_dim..]);
            p.k.extend_from_slice(&k[settle * key_dim..]);
            p.v.extend_from_slice(&v[settle * value_dim..]);
            p.g.extend_from_slice(&g[settle * dm.hv..]);
            p.beta.extend_from_slice(&beta[settle * dm.hv..]);
        }
        y
    }
}

impl Mlp {
    /// Builds the MLP `p` (`{prefix}.mlp`): sparse (see [`Moe::load`]) or dense SwiGLU.
    fn load(st: &mut Store, cfg: &ModelConfig, p: &str, moe: bool) -> Result<Self> {
        if moe {
            return Ok(Mlp::Moe(Moe::load(st, cfg, p)?));
        }
        let t = &cfg.text;
        let d = t.hidden_size;
        let i = t.intermediate_size;
        Ok(Mlp::Dense {
            gate_up: st.fused_linear(
                &[(&format!("{p}.gate_proj"), i), (&format!("{p}.up_proj"), i)],
                d,
            )?,
            down: st.linear(&format!("{p}.down_proj"), d, i)?,
        })
    }

    fn forward(&self, x: &[f32], n: usize) -> Result<Vec<f32>> {
        match self {
            Mlp::Dense { gate_up, down } => {
                let i = gate_up.out_features() / 2;
                let gu = gate_up.forward(x, n)?;
                let act = swiglu_rows(&gu, n, i);
                scratch::recycle(gu);
                let y = down.forward(&act, n);
                scratch::recycle(act);
                y
            }
            Mlp::Moe(m) => m.forward(x, n),
        }
    }
}

/// `silu(gate) * up` for rows laid out `[gate (i) | up (i)]`.
fn swiglu_rows(gu: &[f32], n: usize, i: usize) -> Vec<f32> {
    let mut act = scratch::zeroed(n * i);
    if i == 0 {
        return act;
    }
    for (a, row) in act.chunks_exact_mut(i).zip(gu.chunks_exact(2 * i)) {
        let (g, u) = row.split_at(i);
        kernels::silu_mul(a, g, u);
    }
    act
}

impl Moe {
    /// Builds the sparse MLP `p` (`{prefix}.mlp`): routed experts and an optional shared one.
    fn load(st: &mut Store, cfg: &ModelConfig, p: &str) -> Result<Self> {
        let t = &cfg.text;
        let d = t.hidden_size;
        let e = t.num_experts;
        let i = t.moe_intermediate_size;
        let gate_up = st.expert_linears(
            &[
                (&format!("{p}.switch_mlp.gate_proj"), i),
                (&format!("{p}.switch_mlp.up_proj"), i),
            ],
            e,
            d,
        )?;
        let down = st.expert_linears(&[(&format!("{p}.switch_mlp.down_proj"), d)], e, i)?;
        let si = t.shared_expert_intermediate_size;
        let (sgu, sd, sg) = if si > 0 {
            (
                Some(st.fused_linear(
                    &[
                        (&format!("{p}.shared_expert.gate_proj"), si),
                        (&format!("{p}.shared_expert.up_proj"), si),
                    ],
                    d,
                )?),
                Some(st.linear(&format!("{p}.shared_expert.down_proj"), d, si)?),
                Some(st.linear(&format!("{p}.shared_expert_gate"), 1, d)?),
            )
        } else {
            (None, None, None)
        };
        Ok(Moe {
            router: st.linear(&format!("{p}.gate"), e, d)?,
            gate_up,
            down,
            inter: i,
            top_k: t.num_experts_per_tok.max(1),
            norm_topk: cfg.norm_topk_prob(),
            shared_gate_up: sgu,
            shared_down: sd,
            shared_gate: sg,
        })
    }

    /// Routes every row to its `top_k` experts, then runs each chosen expert once over all of
    /// its rows (a verify's or a batch step's rows read each expert's weights once) and the
    /// shared expert, as one parallel loop whose tasks are whole experts: a decode step starts
    /// the team once for all its experts instead of twice per expert. Each expert's products
    /// run inside its task exactly as they would alone (a loop inside a loop runs in order on
    /// its thread, and no product's result depends on the thread that computes it), and the
    /// outputs are summed per row in ascending expert order, then the shared expert: the same
    /// bits as one expert after another.
    fn forward(&self, x: &[f32], n: usize) -> Result<Vec<f32>> {
        let d = x.len() / n.max(1);
        let e = self.router.out_features();
        let logits = self.router.forward(x, n)?;
        // per expert: (row, weight)
        let mut routes: Vec<Vec<(usize, f32)>> = vec![Vec::new(); e];
        let mut probs = vec![0f32; e];
        let mut taken = vec![false; e];
        let mut top = Vec::with_capacity(self.top_k.min(e));
        for t in 0..n {
            top_k(
                &logits[t * e..(t + 1) * e],
                self.top_k.min(e),
                &mut probs,
                &mut taken,
                &mut top,
            );
            let tot: f32 = top.iter().map(|i| probs[*i]).sum();
            for &ei in &top {
                let w = if self.norm_topk {
                    probs[ei] / tot
                } else {
                    probs[ei]
                };
                routes[ei].push((t, w));
            }
        }
        let active: Vec<usize> = (0..e).filter(|&ei| !routes[ei].is_empty()).collect();
        let shared = match (&self.shared_gate_up, &self.shared_down, &self.shared_gate) {
            (Some(gu), Some(down), Some(gate)) => Some((gu, down, gate)),
            _ => None,
        };
        // task 0 is the shared expert (the largest: every row), then the routed experts
        let first = usize::from(shared.is_some());
        let tasks = first + active.len();
        let slots: Vec<std::sync::Mutex<Option<Result<Vec<f32>>>>> =
            (0..tasks).map(|_| std::sync::Mutex::new(None)).collect();
        let work = |task: usize| {
            let r = match (task.checked_sub(first), shared) {
                (Some(j), _) => self.expert(active[j], &routes[active[j]], x, d),
                (None, Some((gu, down, gate))) => shared_expert(gu, down, gate, x, n),
                (None, None) => unreachable!("task 0 is the shared expert when there is one"),
            };
            *slots[task].lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
        };
        if tasks > 1 {
            crate::team::run(tasks, &work);
        } else {
            (0..tasks).for_each(work);
        }
        let mut ys = slots.into_iter().map(|s| {
            s.into_inner()
                .unwrap_or_else(|p| p.into_inner())
                .unwrap_or_else(|| Err(Error::Unsupported("an MoE task did not run".into())))
        });
        let shared_y = if shared.is_some() {
            ys.next().transpose()?
        } else {
            None
        };
        let mut out = vec![0f32; n * d];
        for (&ei, y) in active.iter().zip(ys) {
            let y = y?;
            for (j, (t, w)) in routes[ei].iter().enumerate() {
                out[t * d..(t + 1) * d]
                    .iter_mut()
                    .zip(&y[j * d..(j + 1) * d])
                    .for_each(|(o, v)| *o += w * v);
            }
            scratch::recycle(y);
        }
        if let Some(y) = shared_y {
            let (y, gs) = y.split_at(n * d);
            for t in 0..n {
                let s = kernels::sigmoid(gs[t]);
                out[t * d..(t + 1) * d]
                    .iter_mut()
                    .zip(&y[t * d..(t + 1) * d])
                    .for_each(|(o, v)| *o += s * v);
            }
        }
        Ok(out)
    }

    /// Expert `ei` over its rows `toks` of `x`: `[toks.len(), d]`.
    fn expert(&self, ei: usize, toks: &[(usize, f32)], x: &[f32], d: usize) -> Result<Vec<f32>> {
        let m = toks.len();
        let mut xs = scratch::zeroed(m * d);
        for (dst, (t, _)) in xs.chunks_exact_mut(d).zip(toks) {
            dst.copy_from_slice(&x[t * d..(t + 1) * d]);
        }
        let gu = self.gate_up[ei].forward(&xs, m)?;
        scratch::recycle(xs);
        let act = swiglu_rows(&gu, m, self.inter);
        scratch::recycle(gu);
        let y = self.down[ei].forward(&act, m);
        scratch::recycle(act);
        y
    }
}

/// The shared expert over all `n` rows, then its gate's `n` logits: `[n * d + n]`.
fn shared_expert(
    gu: &Linear,
    down: &Linear,
    gate: &Linear,
    x: &[f32],
    n: usize,
) -> Result<Vec<f32>> {
    let si = gu.out_features() / 2;
    let g = gu.forward(x, n)?;
    let act = swiglu_rows(&g, n, si);
    scratch::recycle(g);
    let mut y = down.forward(&act, n)?;
    scratch::recycle(act);
    y.extend_from_slice(&gate.forward(x, n)?);
    Ok(y)
}

/// The softmax of one row of router logits into `probs`, and in `top` the indices of its `k`
/// largest probabilities, largest first, ties to the lower index (a stable sort of the indices
/// by descending probability, without sorting or allocating): the arithmetic of mlx-vlm's
/// routing, reduced left to right.
fn top_k(row: &[f32], k: usize, probs: &mut [f32], taken: &mut [bool], top: &mut Vec<usize>) {
    let max = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    for (p, v) in probs.iter_mut().zip(row) {
        *p = (v - max).exp();
    }
    let sum: f32 = probs.iter().sum();
    for p in probs.iter_mut() {
        *p /= sum;
    }
    taken.fill(false);
    top.clear();
    for _ in 0..k {
        let mut best: Option<usize> = None;
        for (i, p) in probs.iter().enumerate() {
            if !taken[i] && best.is_none_or(|b| p.total_cmp(&probs[b]).is_gt()) {
                best = Some(i);
            }
        }
        if let Some(b) = best {
            taken[b] = true;
            top.push(b);
        }
    }
}
