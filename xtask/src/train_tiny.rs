//! `cargo xtask train-tiny`: trains the bundled demo model — a tiny Qwen3.5 (`qwen3_5`, byte
//! vocabulary) with its MTP head — on this repository's own Rust source (MIT OR Apache-2.0, frozen
//! in `xtask/data`), with candle's autograd and Adam, fixed seed. Writes a Hugging Face-layout
//! checkpoint the engine (and mlx-vlm) load.
//!
//! The decoder is a configurable stack of `--layers` layers: layer `i` (0-based) is gated full
//! attention when `(i + 1) % interval == 0` and Gated DeltaNet (linear attention) otherwise — the
//! Qwen3.5 `layer_types` convention. The MTP head is always one gated full-attention layer. The
//! defaults (8 layers, interval 4: three Gated DeltaNet layers then one full-attention layer,
//! twice, as in Qwen3.5; hidden 128, MLP 384) reproduce the bundled `models/tiny-code` bit for
//! bit. The depth matters: the MTP head is one layer, and against a one- or two-layer target it
//! costs most of a target step, so that no speculation can pay; against eight it costs a fifth.
//!
//! ```text
//! cargo xtask train-tiny [--out models/tiny-code] [--steps 3000] [--seed 0]
//!                        [--layers 8] [--interval 4] [--hidden 128] [--intermediate 384]
//!                        [--batch 8] [--context 128] [--lr 0.004] [--decay cosine|constant]
//!                        [--mtp-depth 3]
//! ```
//! Loss: next-token cross-entropy of the model plus the MTP head's cross-entropy at each of
//! `--mtp-depth` chained passes: the first predicts the token after next from `(embed(t+1),
//! hidden(t))` with the target hidden detached (what mlx-vlm's drafter consumes: the final-normed
//! hidden state); each later one from the head's own output before it, as the engine drafts a
//! round's second and third tokens (see `losses`).
//!
//! The result does not depend on the build profile or the machine's core count (the batch is
//! split in a fixed number of parts, see `HALVES`); `cargo run --release -p xtask -- train-tiny`
//! writes the same bits as `cargo xtask train-tiny` about fifteen times faster (0.65 s a step
//! against 10 s on 2 cores: the dev profile's debug assertions and overflow checks stay on in the
//! optimised dependencies).

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::{Context, Result};
use candle_core::{DType, Device, Tensor, Var, D};
use mtp_engine::seeded::int_range;
use rand::{Rng, SeedableRng};

/// The training text: this repository's Rust sources (MIT OR Apache-2.0) as they were when the
/// bundled model was trained, frozen so that later edits do not change what `train-tiny`
/// reproduces (see `xtask/data/README.md`).
const CORPUS: &str = include_str!("../data/tiny-code-corpus.txt");

const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HD: usize = 64;
const LK: usize = 2; // linear key heads
const LV: usize = 4; // linear value heads
const LD: usize = 64; // linear head dim
const CONV: usize = 4;
const VOCAB: usize = 256;
const ROT: usize = HD / 2; // partial_rotary_factor 0.5
const EPS: f64 = 1e-6;

/// The configurable part of the architecture; everything else is the constants above.
#[derive(Clone, Copy, Debug)]
struct Arch {
    /// `num_hidden_layers`.
    layers: usize,
    /// `full_attention_interval`: layer `i` is full attention iff `(i + 1) % interval == 0`.
    interval: usize,
    /// `hidden_size`.
    hidden: usize,
    /// `intermediate_size` of the SwiGLU MLPs.
    inter: usize,
    /// Chained MTP-head passes trained per position (see [`losses`]); not part of the
    /// checkpoint's shape.
    mtp_depth: usize,
}

impl Default for Arch {
    /// The bundled `models/tiny-code`.
    fn default() -> Self {
        Arch {
            layers: 8,
            interval: 4,
            hidden: 128,
            inter: 384,
            mtp_depth: 3,
        }
    }
}

impl Arch {
    fn validate(&self) -> Result<()> {
        anyhow::ensure!(self.layers >= 1, "--layers must be at least 1");
        anyhow::ensure!(self.interval >= 1, "--interval must be at least 1");
        anyhow::ensure!(
            self.interval <= self.layers,
            "--interval {} exceeds --layers {}: no layer would be full attention",
            self.interval,
            self.layers
        );
        anyhow::ensure!(
            self.hidden >= 8 && self.hidden.is_multiple_of(8),
            "--hidden must be a positive multiple of 8 (got {})",
            self.hidden
        );
        anyhow::ensure!(self.inter >= 1, "--intermediate must be at least 1");
        anyhow::ensure!(self.mtp_depth >= 1, "--mtp-depth must be at least 1");
        Ok(())
    }

    /// True when layer `i` is gated full attention (else Gated DeltaNet).
    fn is_full(&self, i: usize) -> bool {
        (i + 1).is_multiple_of(self.interval)
    }

    /// The `layer_types` entry of layer `i`.
    fn layer_type(&self, i: usize) -> &'static str {
        if self.is_full(i) {
            "full_attention"
        } else {
            "linear_attention"
        }
    }
}

struct Params {
    vars: Vec<(String, Var)>,
}

impl Params {
    fn get(&self, name: &str) -> Result<&Tensor> {
        self.vars
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_tensor())
            .with_context(|| format!("no parameter {name}"))
    }
}

/// Creates the parameters in a fixed order (the RNG is drawn in that order, and Adam walks
/// `vars` in it): embed; the Gated DeltaNet parameters of each linear layer; the attention
/// parameters of each full layer, then the MTP layer; norms and MLP of every layer, then the MTP
/// layer; final norm, lm_head and the rest of the MTP head.
fn init(arch: &Arch, seed: u64) -> Result<Params> {
    let (d_model, inter) = (arch.hidden, arch.inter);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut vars = Vec::new();
    let dev = Device::Cpu;
    let mut normal = |n: usize, std: f32| -> Vec<f32> {
        (0..n)
            .map(|_| {
                let u1: f32 = rng.random_range(1e-7f32..1.0);
                let u2: f32 = rng.random();
                std * (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
            })
            .collect()
    };
    let add = |vars: &mut Vec<(String, Var)>,
               name: &str,
               data: Vec<f32>,
               shape: &[usize]|
     -> Result<()> {
        vars.push((
            name.to_string(),
            Var::from_tensor(&Tensor::from_vec(data, shape, &dev)?)?,
        ));
        Ok(())
    };
    let lin = |out: usize, inp: usize, normal: &mut dyn FnMut(usize, f32) -> Vec<f32>| {
        normal(out * inp, 1.0 / (inp as f32).sqrt())
    };
    add(
        &mut vars,
        "embed",
        normal(VOCAB * d_model, 0.5),
        &[VOCAB, d_model],
    )?;
    // Gated DeltaNet layers
    let kd = LK * LD;
    let vd = LV * LD;
    let cd = 2 * kd + vd;
    for i in (0..arch.layers).filter(|&i| !arch.is_full(i)) {
        let p = format!("l{i}");
        add(
            &mut vars,
            &format!("{p}.qkv"),
            lin(cd, d_model, &mut normal),
            &[cd, d_model],
        )?;
        add(
            &mut vars,
            &format!("{p}.z"),
            lin(vd, d_model, &mut normal),
            &[vd, d_model],
        )?;
        add(
            &mut vars,
            &format!("{p}.b"),
            lin(LV, d_model, &mut normal),
            &[LV, d_model],
        )?;
        add(
            &mut vars,
            &format!("{p}.a"),
            lin(LV, d_model, &mut normal),
            &[LV, d_model],
        )?;
        add(
            &mut vars,
            &format!("{p}.conv"),
            normal(cd * CONV, 0.5),
            &[cd, CONV],
        )?;
        let a_log: Vec<f32> = (0..LV).map(|h| (1.0 + 3.0 * h as f32).ln()).collect();
        add(&mut vars, &format!("{p}.A_log"), a_log, &[LV])?;
        add(&mut vars, &format!("{p}.dt_bias"), vec![1.0; LV], &[LV])?;
        add(&mut vars, &format!("{p}.gnorm"), vec![1.0; LD], &[LD])?;
        add(
            &mut vars,
            &format!("{p}.out"),
            lin(d_model, vd, &mut normal),
            &[d_model, vd],
        )?;
    }
    // full-attention layers, then the MTP layer: gated full attention
    let full: Vec<String> = (0..arch.layers)
        .filter(|&i| arch.is_full(i))
        .map(|i| format!("l{i}"))
        .chain(["mtp.l0".to_string()])
        .collect();
    for p in &full {
        add(
            &mut vars,
            &format!("{p}.q"),
            lin(HEADS * HD * 2, d_model, &mut normal),
            &[HEADS * HD * 2, d_model],
        )?;
        add(
            &mut vars,
            &format!("{p}.k"),
            lin(KV_HEADS * HD, d_model, &mut normal),
            &[KV_HEADS * HD, d_model],
        )?;
        add(
            &mut vars,
            &format!("{p}.v"),
            lin(KV_HEADS * HD, d_model, &mut normal),
            &[KV_HEADS * HD, d_model],
        )?;
        add(
            &mut vars,
            &format!("{p}.o"),
            lin(d_model, HEADS * HD, &mut normal),
            &[d_model, HEADS * HD],
        )?;
        add(&mut vars, &format!("{p}.qn"), vec![1.0; HD], &[HD])?;
        add(&mut vars, &format!("{p}.kn"), vec![1.0; HD], &[HD])?;
    }
    // norms and MLP of every layer, then the MTP layer
    let all: Vec<String> = (0..arch.layers)
        .map(|i| format!("l{i}"))
        .chain(["mtp.l0".to_string()])
        .collect();
    for p in &all {
        add(
            &mut vars,
            &format!("{p}.in_norm"),
            vec![1.0; d_model],
            &[d_model],
        )?;
        add(
            &mut vars,
            &format!("{p}.post_norm"),
            vec![1.0; d_model],
            &[d_model],
        )?;
        add(
            &mut vars,
            &format!("{p}.gate"),
            lin(inter, d_model, &mut normal),
            &[inter, d_model],
        )?;
        add(
            &mut vars,
            &format!("{p}.up"),
            lin(inter, d_model, &mut normal),
            &[inter, d_model],
        )?;
        add(
            &mut vars,
            &format!("{p}.down"),
            lin(d_model, inter, &mut normal),
            &[d_model, inter],
        )?;
    }
    add(&mut vars, "norm", vec![1.0; d_model], &[d_model])?;
    add(
        &mut vars,
        "lm_head",
        lin(VOCAB, d_model, &mut normal),
        &[VOCAB, d_model],
    )?;
    add(
        &mut vars,
        "mtp.fc",
        lin(d_model, 2 * d_model, &mut normal),
        &[d_model, 2 * d_model],
    )?;
    for n in ["mtp.pre_emb", "mtp.pre_hidden", "mtp.norm"] {
        add(&mut vars, n, vec![1.0; d_model], &[d_model])?;
    }
    Ok(Params { vars })
}

fn rms(x: &Tensor, w: Option<&Tensor>, eps: f64) -> Result<Tensor> {
    let r = (x.sqr()?.mean_keepdim(D::Minus1)? + eps)?.sqrt()?.recip()?;
    let y = x.broadcast_mul(&r)?;
    Ok(match w {
        Some(w) => y.broadcast_mul(w)?,
        None => y,
    })
}

fn lin(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    Ok(x.broadcast_matmul(&w.t()?)?)
}

fn sigmoid(x: &Tensor) -> Result<Tensor> {
    Ok((x.neg()?.exp()? + 1.0)?.recip()?)
}

fn mlp(p: &Params, pre: &str, x: &Tensor) -> Result<Tensor> {
    let g = lin(x, p.get(&format!("{pre}.gate"))?)?.silu()?;
    let u = lin(x, p.get(&format!("{pre}.up"))?)?;
    lin(&(g * u)?, p.get(&format!("{pre}.down"))?)
}

/// The Gated DeltaNet mixer of the layer whose parameters are named `{pre}.*`.
fn deltanet(p: &Params, pre: &str, x: &Tensor) -> Result<Tensor> {
    let (b, t, _) = x.dims3()?;
    let (kd, vd) = (LK * LD, LV * LD);
    let qkv = lin(x, p.get(&format!("{pre}.qkv"))?)?; // [b, t, C]
    let z = lin(x, p.get(&format!("{pre}.z"))?)?;
    let bb = lin(x, p.get(&format!("{pre}.b"))?)?;
    let aa = lin(x, p.get(&format!("{pre}.a"))?)?;
    // causal depthwise conv: out[t] = sum_j in[t + j] w[:, j] over [zeros(K-1); qkv]
    let c = 2 * kd + vd;
    let padded = Tensor::cat(
        &[
            &Tensor::zeros((b, CONV - 1, c), DType::F32, x.device())?,
            &qkv,
        ],
        1,
    )?;
    let w = p.get(&format!("{pre}.conv"))?;
    let mut conv = padded
        .narrow(1, 0, t)?
        .broadcast_mul(&w.narrow(1, 0, 1)?.squeeze(1)?)?;
    for j in 1..CONV {
        conv = (conv
            + padded
                .narrow(1, j, t)?
                .broadcast_mul(&w.narrow(1, j, 1)?.squeeze(1)?)?)?;
    }
    let conv = conv.silu()?;
    let q = conv.narrow(2, 0, kd)?.reshape((b, t, LK, LD))?;
    let k = conv.narrow(2, kd, kd)?.reshape((b, t, LK, LD))?;
    let v = conv.narrow(2, 2 * kd, vd)?.reshape((b, t, LV, LD))?;
    let inv = 1.0 / (LD as f64).sqrt();
    let q = (rms(&q, None, 1e-6 / LD as f64)? * (inv * inv))?;
    let k = (rms(&k, None, 1e-6 / LD as f64)? * inv)?;
    let rep = LV / LK;
    let expand = |x: &Tensor| -> Result<Tensor> {
        Ok(x.unsqueeze(3)?
            .broadcast_as((b, t, LK, rep, LD))?
            .reshape((b, t, LV, LD))?)
    };
    let (q, k) = (expand(&q)?, expand(&k)?);
    let sp = {
        let u = aa.broadcast_add(p.get(&format!("{pre}.dt_bias"))?)?;
        (u.exp()? + 1.0)?.log()?
    };
    let g = sp
        .broadcast_mul(&p.get(&format!("{pre}.A_log"))?.exp()?)?
        .neg()?
        .exp()?; // [b, t, LV]
    let beta = sigmoid(&bb)?;
    let qkv = Tensor::stack(&[&q, &k, &v], 3)?; // [b, t, LV, 3, LD]
    let gb = Tensor::stack(&[&g, &beta], 3)?; // [b, t, LV, 2]
    let y = crate::delta_rule::delta_rule(&qkv, &gb)?; // [b, t, LV, LD]
    let y = rms(&y, Some(p.get(&format!("{pre}.gnorm"))?), EPS)?;
    let y = (y * z.reshape((b, t, LV, LD))?.silu()?)?.reshape((b, t, vd))?;
    lin(&y, p.get(&format!("{pre}.out"))?)
}

fn rope_tables(t: usize) -> Result<(Tensor, Tensor)> {
    let half = ROT / 2;
    let mut c = Vec::with_capacity(t * half);
    let mut s = Vec::with_capacity(t * half);
    for pos in 0..t {
        for i in 0..half {
            let f = 1.0 / 10_000f64.powf((2 * i) as f64 / ROT as f64);
            let a = pos as f64 * f;
            c.push(a.cos() as f32);
            s.push(a.sin() as f32);
        }
    }
    Ok((
        Tensor::from_vec(c, (t, half), &Device::Cpu)?,
        Tensor::from_vec(s, (t, half), &Device::Cpu)?,
    ))
}

/// `x: [b, t, h, HD]` rotated over its first ROT features (rotate-half pairing).
fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let (b, t, h, _) = x.dims4()?;
    let half = ROT / 2;
    let cos = cos
        .reshape((1, t, 1, half))?
        .broadcast_as((b, t, h, half))?;
    let sin = sin
        .reshape((1, t, 1, half))?
        .broadcast_as((b, t, h, half))?;
    let x1 = x.narrow(3, 0, half)?;
    let x2 = x.narrow(3, half, half)?;
    let pass = x.narrow(3, ROT, HD - ROT)?;
    let r1 = ((&x1 * &cos)? - (&x2 * &sin)?)?;
    let r2 = ((&x2 * &cos)? + (&x1 * &sin)?)?;
    Ok(Tensor::cat(&[r1, r2, pass], 3)?)
}

/// Projections of a gated attention layer: `q`, `k`, `v` (RMS-normed, rotated, the KV heads
/// repeated; `[b, HEADS, t, HD]`) and the output gate `[b, t, HEADS * HD]`.
fn qkv(
    p: &Params,
    pre: &str,
    x: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
) -> Result<(Tensor, Tensor, Tensor, Tensor)> {
    let (b, t, _) = x.dims3()?;
    let qf = lin(x, p.get(&format!("{pre}.q"))?)?.reshape((b, t, HEADS, 2 * HD))?;
    let q = qf.narrow(3, 0, HD)?;
    let gate = qf.narrow(3, HD, HD)?.reshape((b, t, HEADS * HD))?;
    let k = lin(x, p.get(&format!("{pre}.k"))?)?.reshape((b, t, KV_HEADS, HD))?;
    let v = lin(x, p.get(&format!("{pre}.v"))?)?.reshape((b, t, KV_HEADS, HD))?;
    let q = rope(&rms(&q, Some(p.get(&format!("{pre}.qn"))?), EPS)?, cos, sin)?;
    let k = rope(&rms(&k, Some(p.get(&format!("{pre}.kn"))?), EPS)?, cos, sin)?;
    let rep = HEADS / KV_HEADS;
    let expand = |x: &Tensor| -> Result<Tensor> {
        Ok(x.unsqueeze(3)?
            .broadcast_as((b, t, KV_HEADS, rep, HD))?
            .reshape((b, t, HEADS, HD))?)
    };
    let q = q.transpose(1, 2)?.contiguous()?;
    let k = expand(&k)?.transpose(1, 2)?.contiguous()?;
    let v = expand(&v)?.transpose(1, 2)?.contiguous()?;
    Ok((q, k, v, gate))
}

/// Softmax attention of `q` over the keys `(k, v)` under `mask` (`[t, t]`) and, at each query's
/// own position, over every `(k, v)` of `diagonal` too (one more key per entry).
fn attend(
    q: &Tensor,
    (k, v): (&Tensor, &Tensor),
    mask: &Tensor,
    diagonal: &[(Tensor, Tensor)],
) -> Result<Tensor> {
    let (b, _, t, _) = q.dims4()?;
    let scale = 1.0 / (HD as f64).sqrt();
    let mut s = vec![(q.matmul(&k.t()?)? * scale)?.broadcast_add(mask)?];
    for (dk, _) in diagonal {
        s.push(((q * dk)?.sum_keepdim(3)? * scale)?);
    }
    let s = Tensor::cat(&s, 3)?;
    let m = s.max_keepdim(D::Minus1)?.detach();
    let e = s.broadcast_sub(&m)?.exp()?;
    let pr = e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?;
    let mut o = pr.narrow(3, 0, t)?.matmul(v)?;
    for (j, (_, dv)) in diagonal.iter().enumerate() {
        o = (o + pr.narrow(3, t + j, 1)?.broadcast_mul(dv)?)?;
    }
    Ok(o.transpose(1, 2)?.reshape((b, t, HEADS * HD))?)
}

fn attention(
    p: &Params,
    pre: &str,
    x: &Tensor,
    mask: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
) -> Result<Tensor> {
    let (q, k, v, gate) = qkv(p, pre, x, cos, sin)?;
    let o = attend(&q, (&k, &v), mask, &[])?;
    lin(&(o * sigmoid(&gate)?)?, p.get(&format!("{pre}.o"))?)
}

fn block(
    p: &Params,
    pre: &str,
    x: &Tensor,
    mixer: impl FnOnce(&Tensor) -> Result<Tensor>,
) -> Result<Tensor> {
    let h = (x + mixer(&rms(x, Some(p.get(&format!("{pre}.in_norm"))?), EPS)?)?)?;
    let m = mlp(
        p,
        pre,
        &rms(&h, Some(p.get(&format!("{pre}.post_norm"))?), EPS)?,
    )?;
    Ok((h + m)?)
}

fn cross_entropy(logits: &Tensor, targets: &[u32]) -> Result<Tensor> {
    let n = targets.len();
    let l = logits.reshape((n, VOCAB))?;
    let m = l.max_keepdim(1)?.detach();
    let lse = (l.broadcast_sub(&m)?.exp()?.sum_keepdim(1)?.log()? + &m)?;
    let mut onehot = vec![0f32; n * VOCAB];
    for (i, t) in targets.iter().enumerate() {
        onehot[i * VOCAB + *t as usize] = 1.0;
    }
    let oh = Tensor::from_vec(onehot, (n, VOCAB), &Device::Cpu)?;
    let picked = (l * oh)?.sum_keepdim(1)?;
    Ok((lse - picked)?.mean_all()?)
}

/// The model's next-token loss and the MTP head's loss at each of `arch.mtp_depth` chained
/// passes, over `batch` rows of `t + mtp_depth + 1` tokens.
///
/// Pass 1 is the head's first draft: `(embed(x[t + 1]), hidden(t))` predicts `x[t + 2]`, with
/// the target's final-normed hidden state detached. Pass `k > 1` is the `k`-th draft of a round
/// exactly as the engine (and mlx-vlm) chain them: the head's own normed output of pass `k - 1`
/// paired with the next token (teacher-forced) predicts `x[t + k + 1]`, at position `t + k - 1`,
/// attending to pass 1's entries at positions up to `t` (what the head's cache holds when a round
/// starts) and to the entries passes `2..=k` appended at this round's later positions. Trained at
/// one pass only, the head sees its own output for the first time when it drafts a second token.
fn losses(p: &Params, arch: &Arch, batch: &[Vec<u32>]) -> Result<(Tensor, Vec<Tensor>)> {
    let t = batch[0].len() - arch.mtp_depth - 1;
    let targets = |off: usize| -> Vec<u32> {
        batch
            .iter()
            .flat_map(|r| r[off..off + t].to_vec())
            .collect()
    };
    let (lm, heads) = logits(p, arch, batch)?;
    let heads = heads
        .iter()
        .enumerate()
        .map(|(k, l)| cross_entropy(l, &targets(k + 2)))
        .collect::<Result<_>>()?;
    Ok((cross_entropy(&lm, &targets(1))?, heads))
}

/// The model's logits `[b, t, VOCAB]` and the head's at each pass (see [`losses`]).
fn logits(p: &Params, arch: &Arch, batch: &[Vec<u32>]) -> Result<(Tensor, Vec<Tensor>)> {
    let b = batch.len();
    let depth = arch.mtp_depth;
    let t = batch[0].len() - depth - 1;
    let tokens = |off: usize| -> Result<Tensor> {
        let ids: Vec<u32> = batch
            .iter()
            .flat_map(|r| r[off..off + t].to_vec())
            .collect();
        Ok(Tensor::from_vec(ids, b * t, &Device::Cpu)?)
    };
    let emb = p.get("embed")?;
    let embed = |off: usize| -> Result<Tensor> {
        Ok(emb
            .index_select(&tokens(off)?, 0)?
            .reshape((b, t, arch.hidden))?)
    };
    let mask: Vec<f32> = (0..t * t)
        .map(|i| if i % t > i / t { -1e9 } else { 0.0 })
        .collect();
    let mask = Tensor::from_vec(mask, (t, t), &Device::Cpu)?;
    let (cos_all, sin_all) = rope_tables(t + depth - 1)?;
    let (cos, sin) = (cos_all.narrow(0, 0, t)?, sin_all.narrow(0, 0, t)?);
    let mut x = embed(0)?;
    for i in 0..arch.layers {
        let pre = format!("l{i}");
        x = if arch.is_full(i) {
            block(p, &pre, &x, |h| attention(p, &pre, h, &mask, &cos, &sin))?
        } else {
            block(p, &pre, &x, |h| deltanet(p, &pre, h))?
        };
    }
    let hidden = rms(&x, Some(p.get("norm")?), EPS)?;
    let lm = lin(&hidden, p.get("lm_head")?)?;
    let pre = "mtp.l0";
    let mut heads = Vec::with_capacity(depth);
    let mut prev = hidden.detach();
    // pass 1's keys and values, then those of passes 2..=k at each query's own position
    let mut base: Option<(Tensor, Tensor)> = None;
    let mut diagonal: Vec<(Tensor, Tensor)> = Vec::new();
    for k in 1..=depth {
        let cat = Tensor::cat(
            &[
                rms(&embed(k)?, Some(p.get("mtp.pre_emb")?), EPS)?,
                rms(&prev, Some(p.get("mtp.pre_hidden")?), EPS)?,
            ],
            2,
        )?;
        let h = lin(&cat, p.get("mtp.fc")?)?;
        let (cos_k, sin_k) = (cos_all.narrow(0, k - 1, t)?, sin_all.narrow(0, k - 1, t)?);
        let h = block(p, pre, &h, |normed| {
            let (q, kk, vv, gate) = qkv(p, pre, normed, &cos_k, &sin_k)?;
            let o = match &base {
                None => {
                    let o = attend(&q, (&kk, &vv), &mask, &[])?;
                    base = Some((kk, vv));
                    o
                }
                Some((k1, v1)) => {
                    diagonal.push((kk, vv));
                    attend(&q, (k1, v1), &mask, &diagonal)?
                }
            };
            lin(&(o * sigmoid(&gate)?)?, p.get(&format!("{pre}.o"))?)
        })?;
        let h = rms(&h, Some(p.get("mtp.norm")?), EPS)?;
        heads.push(lin(&h, p.get("lm_head")?)?);
        prev = h;
    }
    Ok((lm, heads))
}

fn export(p: &Params, arch: &Arch, out: &std::path::Path) -> Result<()> {
    let mut m: HashMap<String, Tensor> = HashMap::new();
    let lm = "model.language_model";
    let get = |n: &str| -> Result<Tensor> { Ok(p.get(n)?.clone()) };
    // HF layout: zero-centred RMSNorm weights (w - 1), torch conv layout [C, 1, K].
    let shifted = |n: &str| -> Result<Tensor> { Ok((p.get(n)? - 1.0)?) };
    m.insert(format!("{lm}.embed_tokens.weight"), get("embed")?);
    // (internal prefix, HF prefix, full attention?) of every decoder layer, then the MTP layer
    let layers: Vec<(String, String, bool)> = (0..arch.layers)
        .map(|i| (format!("l{i}"), format!("{lm}.layers.{i}"), arch.is_full(i)))
        .chain([("mtp.l0".to_string(), "mtp.layers.0".to_string(), true)])
        .collect();
    for (src, dst, _) in layers.iter().filter(|l| !l.2) {
        let a = format!("{dst}.linear_attn");
        for (s, d) in [
            ("qkv", "in_proj_qkv"),
            ("z", "in_proj_z"),
            ("b", "in_proj_b"),
            ("a", "in_proj_a"),
            ("out", "out_proj"),
        ] {
            m.insert(format!("{a}.{d}.weight"), get(&format!("{src}.{s}"))?);
        }
        let conv = get(&format!("{src}.conv"))?;
        let (c, k) = conv.dims2()?;
        m.insert(format!("{a}.conv1d.weight"), conv.reshape((c, 1, k))?);
        m.insert(format!("{a}.A_log"), get(&format!("{src}.A_log"))?);
        m.insert(format!("{a}.dt_bias"), get(&format!("{src}.dt_bias"))?);
        m.insert(format!("{a}.norm.weight"), get(&format!("{src}.gnorm"))?);
    }
    for (src, dst, _) in layers.iter().filter(|l| l.2) {
        for (s, d) in [
            ("q", "q_proj"),
            ("k", "k_proj"),
            ("v", "v_proj"),
            ("o", "o_proj"),
        ] {
            m.insert(
                format!("{dst}.self_attn.{d}.weight"),
                get(&format!("{src}.{s}"))?,
            );
        }
        m.insert(
            format!("{dst}.self_attn.q_norm.weight"),
            shifted(&format!("{src}.qn"))?,
        );
        m.insert(
            format!("{dst}.self_attn.k_norm.weight"),
            shifted(&format!("{src}.kn"))?,
        );
    }
    for (src, dst, _) in &layers {
        m.insert(
            format!("{dst}.input_layernorm.weight"),
            shifted(&format!("{src}.in_norm"))?,
        );
        m.insert(
            format!("{dst}.post_attention_layernorm.weight"),
            shifted(&format!("{src}.post_norm"))?,
        );
        for (s, d) in [
            ("gate", "gate_proj"),
            ("up", "up_proj"),
            ("down", "down_proj"),
        ] {
            m.insert(format!("{dst}.mlp.{d}.weight"), get(&format!("{src}.{s}"))?);
        }
    }
    m.insert(format!("{lm}.norm.weight"), shifted("norm")?);
    m.insert("lm_head.weight".into(), get("lm_head")?);
    m.insert("mtp.fc.weight".into(), get("mtp.fc")?);
    m.insert(
        "mtp.pre_fc_norm_embedding.weight".into(),
        shifted("mtp.pre_emb")?,
    );
    m.insert(
        "mtp.pre_fc_norm_hidden.weight".into(),
        shifted("mtp.pre_hidden")?,
    );
    m.insert("mtp.norm.weight".into(), shifted("mtp.norm")?);
    std::fs::create_dir_all(out)?;
    candle_core::safetensors::save(&m, out.join("model.safetensors"))?;
    let layer_types: Vec<&str> = (0..arch.layers).map(|i| arch.layer_type(i)).collect();
    let text = serde_json::json!({
        "model_type": "qwen3_5_text", "hidden_size": arch.hidden, "intermediate_size": arch.inter,
        "num_hidden_layers": arch.layers, "full_attention_interval": arch.interval,
        "layer_types": layer_types,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HD,
        "linear_num_value_heads": LV, "linear_num_key_heads": LK, "linear_key_head_dim": LD,
        "linear_value_head_dim": LD, "linear_conv_kernel_dim": CONV, "rms_norm_eps": EPS,
        "vocab_size": VOCAB, "max_position_embeddings": 4096, "tie_word_embeddings": false,
        "attention_bias": false, "hidden_act": "silu",
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
            "mrope_section": [ROT / 4, ROT / 8, ROT / 8], "mrope_interleaved": true},
        "mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": false,
        "eos_token_id": 0, "bos_token_id": 1, "dtype": "float32",
    });
    let cfg = serde_json::json!({
        "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
        "text_config": text,
        "vision_config": {"model_type": "qwen3_5", "depth": 1, "hidden_size": 32, "intermediate_size": 64,
            "out_hidden_size": arch.hidden, "num_heads": 2, "patch_size": 16, "spatial_merge_size": 2,
            "temporal_patch_size": 2, "num_position_embeddings": 64, "in_channels": 3,
            "deepstack_visual_indexes": []},
        "image_token_id": 250, "video_token_id": 251, "vision_start_token_id": 252,
        "vision_end_token_id": 253, "tie_word_embeddings": false, "eos_token_id": 0, "vocab_size": VOCAB,
    });
    std::fs::write(out.join("config.json"), serde_json::to_string_pretty(&cfg)?)?;
    std::fs::write(
        out.join("generation_config.json"),
        r#"{"do_sample": false, "eos_token_id": 0}"#,
    )?;
    // byte-level tokenizer: id b = byte b, id 0 = <|endoftext|> (same files as the test fixtures)
    std::fs::write(
        out.join("tokenizer.json"),
        include_str!("../../tests/fixtures/tiny-hf/tokenizer.json"),
    )?;
    std::fs::write(
        out.join("tokenizer_config.json"),
        include_str!("../../tests/fixtures/tiny-hf/tokenizer_config.json"),
    )?;
    Ok(())
}

const HELP: &str = "\
cargo xtask train-tiny [options]   train the bundled demo model (defaults: models/tiny-code)

  --out DIR                where it goes (models/tiny-code)
  --steps N                training steps (3000)
  --seed S                 seed (0)
  --layers N               decoder layers (8)
  --interval K             every K-th layer is full attention, the others linear (4)
  --hidden H               hidden size, a multiple of 8 (128)
  --intermediate I         MLP width (384)
  --mtp-depth N            chained MTP passes trained (3)
  --batch N                rows per step (8)
  --context N              bytes per row (128)
  --lr X                   Adam's learning rate (0.004)
  --decay cosine|constant  cosine decay to a tenth over the run, or none (cosine)
";

/// `cargo xtask train-tiny [--out DIR] [--steps N] [--seed S] [--layers N] [--interval K]
/// [--hidden H] [--intermediate I]`.
///
/// `--batch` rows of `--context` bytes per step (defaults below), Adam at `--lr` with cosine
/// decay to a tenth of it over the run (`--decay constant` keeps it).
///
/// `--layers` is `num_hidden_layers` (default 8), `--interval` is `full_attention_interval`
/// (default 4: layer `i` is full attention iff `(i + 1) % K == 0`, Gated DeltaNet otherwise),
/// `--hidden` is `hidden_size` (default 128, a multiple of 8) and `--intermediate` the MLP width
/// (default 384). Head counts and widths are fixed. The defaults reproduce `models/tiny-code`.
pub fn run(args: &[String]) -> Result<()> {
    if crate::print_help_if_asked(args, HELP) {
        return Ok(());
    }
    if std::env::var_os(CHILD).is_none() {
        return rerun_tuned(args);
    }
    let mut out = PathBuf::from("models/tiny-code");
    let mut steps = 3000usize;
    let mut seed = 0u64;
    let mut arch = Arch::default();
    let (mut batch, mut len, mut lr) = (8usize, 128usize, 4e-3f64);
    let mut decay = true;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let v = it.next().with_context(|| format!("{a} needs a value"))?;
        match a.as_str() {
            "--out" => out = PathBuf::from(v),
            "--steps" => steps = v.parse()?,
            "--seed" => seed = v.parse()?,
            "--layers" => arch.layers = parse(a, v)?,
            "--interval" => arch.interval = parse(a, v)?,
            "--hidden" => arch.hidden = parse(a, v)?,
            "--intermediate" => arch.inter = parse(a, v)?,
            "--mtp-depth" => arch.mtp_depth = parse(a, v)?,
            "--batch" => batch = parse(a, v)?,
            "--context" => len = parse(a, v)?,
            "--lr" => lr = v.parse().with_context(|| format!("--lr: `{v}`"))?,
            "--decay" => {
                decay = match v.as_str() {
                    "cosine" => true,
                    "constant" => false,
                    other => anyhow::bail!("--decay is cosine or constant, got `{other}`"),
                }
            }
            other => anyhow::bail!("unknown train-tiny flag `{other}`\n\n{HELP}"),
        }
    }
    arch.validate()?;
    let corpus: Vec<u8> = CORPUS.bytes().filter(|b| *b != 0).collect();
    println!(
        "corpus: {} bytes of this repository's Rust source",
        corpus.len()
    );
    let types: Vec<&str> = (0..arch.layers)
        .map(|i| if arch.is_full(i) { "full" } else { "linear" })
        .collect();
    println!(
        "model: {} layers [{}], hidden {}, intermediate {}",
        arch.layers,
        types.join(", "),
        arch.hidden,
        arch.inter
    );
    let p = init(&arch, seed)?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0xDA7A);
    let (b1, b2, eps) = (0.9f64, 0.999f64, 1e-8f64);
    let mut mom: Vec<(Tensor, Tensor)> = p
        .vars
        .iter()
        .map(|(_, v)| Ok((v.as_tensor().zeros_like()?, v.as_tensor().zeros_like()?)))
        .collect::<Result<_>>()?;
    let pools = (0..HALVES)
        .map(|_| rayon::ThreadPoolBuilder::new().num_threads(1).build())
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let t0 = std::time::Instant::now();
    // each row: the context plus the tokens the head's passes predict past it
    let row = len + arch.mtp_depth + 1;
    anyhow::ensure!(
        row < corpus.len(),
        "--context {len} is longer than the corpus"
    );
    for step in 1..=steps {
        let rows: Vec<Vec<u32>> = row_starts(&mut rng, corpus.len(), row, batch)
            .into_iter()
            .map(|s| corpus[s..s + row].iter().map(|b| *b as u32).collect())
            .collect();
        let (l1, heads, grads) = halves_step(&p, &arch, &rows, &pools)?;
        // cosine decay to a tenth of `lr` over the run, when asked
        let lr_s = if decay {
            let f = (step - 1) as f64 / steps.max(1) as f64;
            lr * (0.1 + 0.45 * (1.0 + (std::f64::consts::PI * f).cos()))
        } else {
            lr
        };
        let lr_t = lr_s * (1.0 - b2.powi(step as i32)).sqrt() / (1.0 - b1.powi(step as i32));
        for ((_, var), (m, v)) in p.vars.iter().zip(mom.iter_mut()) {
            let Some(g) = grads.get(&var.as_tensor().id()) else {
                continue;
            };
            *m = ((&*m * b1)? + (g * (1.0 - b1))?)?;
            *v = ((&*v * b2)? + (g.sqr()? * (1.0 - b2))?)?;
            let upd = (m.broadcast_div(&(v.sqrt()? + eps)?)? * lr_t)?;
            var.set(&(var.as_tensor() - upd)?)?;
        }
        if step % 50 == 0 || step == 1 {
            let passes: Vec<String> = heads.iter().map(|l| format!("{l:.3}")).collect();
            println!(
                "step {step:4} loss {:.3} (lm {l1:.3}, mtp {})  {:.0}s",
                l1 + heads.iter().sum::<f32>(),
                passes.join(" "),
                t0.elapsed().as_secs_f64()
            );
        }
    }
    export(&p, &arch, &out)?;
    println!("wrote {}", out.display());
    Ok(())
}

/// Set in the environment of the process that trains (see `rerun_tuned`).
const CHILD: &str = "MTP_TRAIN_TINY_TUNED";

/// Runs `train-tiny` again as a child process whose environment makes training about twice as
/// fast, and waits for it. Both settings are read only at start-up, hence the second process:
/// - `RAYON_NUM_THREADS=1`: candle's ops, each too small to gain from a second thread, run on
///   one; the batch's halves run side by side instead (`halves_step`), one pool each.
/// - glibc's allocator keeps freed memory (`MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_`,
///   `MALLOC_TOP_PAD_`): by default every large tensor is a fresh mapping, and unmapping it from
///   a process with two busy threads costs page faults and TLB shootdowns, ~15% of a step here.
///
/// Neither changes a bit of the result: the work each thread does is fixed by `HALVES`, not by
/// the machine, and the allocator only decides where tensors live.
fn rerun_tuned(args: &[String]) -> Result<()> {
    let exe = std::env::current_exe().context("locating the xtask binary to re-run")?;
    let status = std::process::Command::new(&exe)
        .arg("train-tiny")
        .args(args)
        .env(CHILD, "1")
        .env("RAYON_NUM_THREADS", "1")
        .env("MALLOC_MMAP_THRESHOLD_", "2147483647")
        .env("MALLOC_TRIM_THRESHOLD_", "4294967295")
        .env("MALLOC_TOP_PAD_", "1073741824")
        .status()
        .with_context(|| format!("running {}", exe.display()))?;
    anyhow::ensure!(status.success(), "train-tiny failed ({status})");
    Ok(())
}

/// How many parts a batch is split into, each computed on its own thread.
///
/// candle's CPU ops on tensors this small gain nothing from a second thread (a step took as long
/// with `RAYON_NUM_THREADS=1`), so the batch is split instead: each part's forward and backward
/// runs on a single-thread pool of its own, and the gradients are averaged in a fixed order.
/// The count is fixed, not the machine's, so the bits do not depend on how many cores run it.
const HALVES: usize = 2;

/// One step's losses and gradients: the rows split into `HALVES` parts computed side by side,
/// each on its own single-thread pool; returns the model's loss, the head's loss at each pass,
/// and the gradients of the whole batch's mean loss (each part weighted by its rows).
fn halves_step(
    p: &Params,
    arch: &Arch,
    rows: &[Vec<u32>],
    pools: &[rayon::ThreadPool],
) -> Result<(f32, Vec<f32>, HashMap<candle_core::TensorId, Tensor>)> {
    let part = rows.len().div_ceil(pools.len()).max(1);
    let parts: Vec<&[Vec<u32>]> = rows.chunks(part).collect();
    type Part = (f32, Vec<f32>, candle_core::backprop::GradStore);
    let results: Vec<Result<Part>> = std::thread::scope(|s| {
        let handles: Vec<_> = parts
            .iter()
            .zip(pools)
            .map(|(rows, pool)| {
                s.spawn(move || {
                    pool.install(|| -> Result<_> {
                        let (lm, heads) = losses(p, arch, rows)?;
                        let mut total = lm.clone();
                        for h in &heads {
                            total = (total + h)?;
                        }
                        let grads = total.backward()?;
                        let heads = heads
                            .iter()
                            .map(|h| h.to_scalar::<f32>())
                            .collect::<candle_core::Result<Vec<_>>>()?;
                        Ok((lm.to_scalar::<f32>()?, heads, grads))
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a training thread panicked")))
            })
            .collect()
    });
    let n = rows.len() as f64;
    let (mut lm, mut head) = (0f32, vec![0f32; arch.mtp_depth]);
    let mut grads: HashMap<candle_core::TensorId, Tensor> = HashMap::new();
    for (r, rows) in results.into_iter().zip(&parts) {
        let (l1, heads, g) = r?;
        let w = rows.len() as f64 / n;
        lm += l1 * w as f32;
        for (acc, l) in head.iter_mut().zip(heads) {
            *acc += l * w as f32;
        }
        for (_, var) in &p.vars {
            let Some(gv) = g.get(var.as_tensor()) else {
                continue;
            };
            let gv = (gv * w)?;
            let id = var.as_tensor().id();
            let sum = match grads.remove(&id) {
                Some(acc) => (acc + gv)?,
                None => gv,
            };
            grads.insert(id, sum);
        }
    }
    Ok((lm, head, grads))
}

/// Parses the value of flag `flag` as a count.
/// Where each of a step's `batch` rows of `row` bytes starts in a corpus of `corpus` bytes: the
/// only draws from the training stream (seeded `seed ^ 0xDA7A`) after `init`.
fn row_starts(rng: &mut rand::rngs::StdRng, corpus: usize, row: usize, batch: usize) -> Vec<usize> {
    (0..batch)
        .map(|_| int_range(rng, 0..corpus - row))
        .collect()
}

fn parse(flag: &str, v: &str) -> Result<usize> {
    v.parse()
        .with_context(|| format!("{flag} needs a non-negative integer, got `{v}`"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// FNV-1a over 64-bit words: a digest of a long stream, to compare it with the one recorded.
    fn fnv(words: impl IntoIterator<Item = u64>) -> u64 {
        words.into_iter().fold(0xcbf2_9ce4_8422_2325, |h, w| {
            w.to_le_bytes()
                .iter()
                .fold(h, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3))
        })
    }

    /// The random streams `cargo xtask train-tiny --seed 0` draws are the ones that trained the
    /// bundled `models/tiny-code` (under rand 0.8): the initial weights (float draws) and the
    /// row starts of all 3000 default steps (integer draws, see `row_starts`), recorded as
    /// digests. The full run (~40 minutes) is what reproduces the checkpoint bit for bit; these
    /// are the only inputs to it that come from `rand`.
    #[test]
    fn the_bundled_models_random_streams_are_unchanged() {
        let arch = Arch::default();
        let p = init(&arch, 0).unwrap();
        let weights = fnv(p.vars.iter().flat_map(|(_, v)| {
            let x: Vec<f32> = v.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
            x.into_iter().map(|x| u64::from(x.to_bits()))
        }));
        let corpus = CORPUS.bytes().filter(|b| *b != 0).count();
        let row = 128 + arch.mtp_depth + 1;
        let mut rng = rand::rngs::StdRng::seed_from_u64(0xDA7A); // `--seed 0` ^ 0xDA7A
        let starts: Vec<usize> = (0..3000)
            .flat_map(|_| row_starts(&mut rng, corpus, row, 8))
            .collect();
        assert_eq!(corpus, 1_753_119);
        assert_eq!(weights, 0x332f_f4a1_07b7_acd2, "init's weights");
        assert_eq!(
            starts[..8],
            [1099591, 1299009, 1040516, 905063, 1042421, 214892, 1321844, 1451864]
        );
        assert_eq!(
            starts[starts.len() - 8..],
            [274592, 1639986, 348310, 579452, 551952, 268129, 705001, 1604053]
        );
        assert_eq!(
            fnv(starts.iter().map(|s| *s as u64)),
            0x0f25_0f31_4ab8_9eaa,
            "the row starts of 3000 steps"
        );
    }

    /// The head's chained passes in training are the drafts the engine makes: a random model
    /// exported and loaded by `mtp-engine` drafts, at every position of a sequence, three
    /// chained tokens (the first from the target's hidden state, each later one from the head's
    /// own output, then the two deeper entries trimmed, as after a rejected round), and each
    /// draft's logits are the training graph's logits at that pass and position.
    #[test]
    fn chained_passes_are_the_drafts_the_engine_makes() {
        let arch = Arch {
            layers: 4,
            interval: 4,
            hidden: 32,
            inter: 48,
            mtp_depth: 3,
        };
        let p = init(&arch, 7).unwrap();
        let t = 10;
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let row: Vec<u32> = (0..t + arch.mtp_depth + 1)
            .map(|_| int_range(&mut rng, 32..127))
            .collect();
        let (_, heads) = logits(&p, &arch, std::slice::from_ref(&row)).unwrap();
        let heads: Vec<Vec<f32>> = heads
            .iter()
            .map(|l| l.flatten_all().unwrap().to_vec1().unwrap())
            .collect();

        let dir = std::env::temp_dir().join(format!("mtp-train-tiny-test-{}", std::process::id()));
        export(&p, &arch, &dir).unwrap();
        let engine =
            mtp_engine::Engine::load(&dir, &Device::Cpu, mtp_engine::WeightDtype::Stored).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let model = engine.model();
        let head = engine
            .drafter()
            .expect("the exported model has its MTP head");
        let mut caches = [model.new_cache()];
        let hidden = model
            .forward(
                &[row[..t].to_vec()],
                &mut caches,
                mtp_engine::LogitsAt::None,
            )
            .unwrap()
            .hidden;
        let d = arch.hidden;
        let mut hc = head.new_cache();
        for pos in 0..t {
            let mut h = hidden[pos * d..(pos + 1) * d].to_vec();
            for (k, want) in heads.iter().enumerate() {
                h = head
                    .forward(model, &[row[pos + 1 + k]], &h, &mut hc)
                    .unwrap();
                let got = model.logits(&h, 1).unwrap();
                let want = &want[pos * VOCAB..(pos + 1) * VOCAB];
                let scale = want.iter().fold(1f32, |m, x| m.max(x.abs()));
                let err = got
                    .iter()
                    .zip(want)
                    .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
                assert!(
                    err <= 1e-4 * scale,
                    "pass {} at position {pos}: logits differ by {err} (largest {scale})",
                    k + 1
                );
            }
            hc.trim(arch.mtp_depth - 1);
        }
    }
}
