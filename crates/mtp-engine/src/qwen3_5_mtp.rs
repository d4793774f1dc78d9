//! The Qwen3.5 MTP head (`qwen3_5_mtp`): `fc` over
//! `[pre_fc_norm_embedding(embed(token)); pre_fc_norm_hidden(hidden)]`, full-attention decoder
//! layer(s) with their own KV cache, a final `norm`, and the target's embeddings and LM head.
//!
//! The hidden state it consumes is the target's *final-normed* hidden state at position `p`,
//! paired with the token at `p + 1` (mlx-vlm 0.7.10 `speculative/drafters/qwen3_5_mtp`).

use std::collections::HashMap;
use std::path::Path;

use candle_core::Device;

use crate::cache::{KvCache, KvType, LayerCache};
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::kernels;
use crate::loader::WeightDtype;
use crate::loader::{Checkpoint, Param};
use crate::nn::{Linear, Store};
use crate::qwen3_5::DecoderLayer;
use crate::qwen3_5::{is_mtp_norm, merge_experts, Qwen35Model};

/// The MTP drafter's cache: one KV cache per head layer and the next draft position.
#[derive(Debug, Clone)]
pub struct MtpCache {
    layers: Vec<LayerCache>,
    pos: usize,
}

impl MtpCache {
    /// Entries cached (= position of the next entry).
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Makes room for `positions` in all in its KV caches ([`crate::SeqCache::reserve`]).
    pub fn reserve(&mut self, positions: usize) {
        crate::cache::layers_reserve(&mut self.layers, positions);
    }

    /// A copy with room for `positions` in all in its KV caches.
    pub fn clone_with_room(&self, positions: usize) -> MtpCache {
        MtpCache {
            layers: crate::cache::layers_clone_with_room(&self.layers, positions),
            pos: self.pos,
        }
    }

    /// Bytes held by the drafter's KV caches.
    pub fn bytes(&self) -> usize {
        crate::cache::layers_bytes(&self.layers)
    }

    /// The layers' caches.
    pub(crate) fn layers(&self) -> &[LayerCache] {
        &self.layers
    }

    /// Puts back layers read from a saved state, holding `pos` entries each.
    pub(crate) fn restore(&mut self, layers: Vec<LayerCache>, pos: usize) {
        self.layers = layers;
        self.pos = pos;
    }

    /// Drops the newest `n` entries.
    pub fn trim(&mut self, n: usize) {
        self.pos = self.pos.saturating_sub(n);
        for l in &mut self.layers {
            if let LayerCache::Attention(kv) = l {
                kv.trim_to(self.pos);
            }
        }
    }
}

/// A loaded MTP head.
#[derive(Debug)]
pub struct MtpHead {
    fc: Linear,
    pre_emb: Vec<f32>,
    pre_hidden: Vec<f32>,
    layers: Vec<DecoderLayer>,
    norm: Vec<f32>,
    eps: f32,
    hidden: usize,
    /// Draft tokens per round declared by a companion config (`block_size - 1`).
    pub default_depth: Option<usize>,
    /// The element type of its KV caches.
    kv_type: KvType,
    /// The arithmetic of its quantized products.
    arith: crate::arith::Arith,
}

/// Every checkpoint rule of a companion drafter directory (`model_type: qwen3_5_mtp`, written by
/// `mlx_vlm.convert --mtp`, e.g. mlx-community `*-MTP-4bit`): tensors carry no prefix and are in
/// MLX conventions (norms already shifted); `mtp.`-prefixed names (an HF export of the head
/// alone) are shifted like embedded heads; quantized modules stay packed; MoE experts are
/// stacked.
pub fn sanitize(ckpt: &Checkpoint, cfg: &ModelConfig) -> Result<HashMap<String, Param>> {
    let shapes = ckpt.shapes();
    let mut out = HashMap::new();
    for name in shapes.keys() {
        let module = name.rsplit_once('.').map(|(m, _)| m).unwrap_or("");
        let quantized = shapes.contains_key(&format!("{module}.scales"));
        if quantized && (name.ends_with(".scales") || name.ends_with(".biases")) {
            continue;
        }
        let (hf, canonical) = match mtp_detect::mtp_namespace_key(name) {
            Some(rest) => (true, rest.to_string()),
            None => (false, name.clone()),
        };
        if quantized && name.ends_with(".weight") {
            let canonical_module = canonical.trim_end_matches(".weight");
            out.extend(
                crate::loader::load_quantized(ckpt, cfg, name, module, canonical_module, true)?
                    .into_iter()
                    .map(|(k, t)| (k, Param::Tensor(t))),
            );
            continue;
        }
        let mut t = ckpt.load_float(name)?;
        if hf && t.rank() == 1 && is_mtp_norm(&canonical) {
            t = crate::qwen3_5::shift_norm(&t.tensor()?)?.into();
        }
        out.insert(canonical, t);
    }
    if cfg.text.num_experts > 0 {
        merge_experts(&mut out, cfg.text.num_experts)?;
    }
    Ok(out)
}

impl MtpHead {
    /// Builds the head from sanitized tensors (names without `mtp.`), using the target's text
    /// config for shapes.
    pub fn load(
        tensors: HashMap<String, Param>,
        cfg: &ModelConfig,
        dtype: WeightDtype,
        device: &Device,
    ) -> Result<Self> {
        let t = &cfg.text;
        let d = t.hidden_size;
        let n_layers = (0..)
            .take_while(|i| tensors.contains_key(&format!("layers.{i}.input_layernorm.weight")))
            .count();
        if n_layers == 0 {
            return Err(Error::NoDrafter(
                "the MTP tensors have no decoder layer".into(),
            ));
        }
        let mut st = Store::new(tensors, "qwen3_5_mtp", dtype, device);
        let mut layers = Vec::with_capacity(n_layers);
        for i in 0..n_layers {
            // Every MTP layer is full attention; MoE when the target is.
            layers.push(DecoderLayer::load(
                &mut st,
                cfg,
                &format!("layers.{i}"),
                true,
                t.num_experts > 0,
            )?);
        }
        Ok(MtpHead {
            fc: st.linear("fc", d, 2 * d)?,
            pre_emb: st.vec("pre_fc_norm_embedding.weight", d)?,
            pre_hidden: st.vec("pre_fc_norm_hidden.weight", d)?,
            layers,
            norm: st.vec("norm.weight", d)?,
            eps: t.rms_norm_eps as f32,
            hidden: d,
            default_depth: cfg.block_size.map(|b| b.saturating_sub(1).max(1)),
            kv_type: KvType::F32,
            arith: crate::arith::Arith::Exact,
        })
    }

    /// Loads a companion drafter directory (`model_type: qwen3_5_mtp`), checking that its hidden
    /// size matches the target's.
    pub fn load_dir(
        dir: &Path,
        target: &ModelConfig,
        dtype: WeightDtype,
        device: &Device,
    ) -> Result<Self> {
        let cfg = ModelConfig::load(dir)?;
        if cfg.model_type != "qwen3_5_mtp" {
            return Err(Error::NoDrafter(format!(
                "{} has model_type `{}`, expected qwen3_5_mtp",
                dir.display(),
                cfg.model_type
            )));
        }
        if cfg.text.hidden_size != target.text.hidden_size
            || cfg.text.vocab_size != target.text.vocab_size
        {
            return Err(Error::NoDrafter(format!(
                "{}: hidden_size {} / vocab {} do not match the target's {} / {}",
                dir.display(),
                cfg.text.hidden_size,
                cfg.text.vocab_size,
                target.text.hidden_size,
                target.text.vocab_size
            )));
        }
        let ckpt = Checkpoint::open(dir)?;
        let tensors = sanitize(&ckpt, &cfg)?;
        let mut head = Self::load(tensors, &cfg, dtype, device)?;
        head.default_depth = cfg.block_size.map(|b| b.saturating_sub(1).max(1));
        Ok(head)
    }

    /// Bytes of the head's own matrices held, per kind (see
    /// [`crate::Qwen35Model::weights_held`]; the embeddings and LM head are the target's).
    pub fn weights_held(&self) -> std::collections::BTreeMap<String, usize> {
        let mut held = std::collections::BTreeMap::new();
        crate::nn::tally(&mut held, self.fc.held());
        for l in &self.layers {
            l.weights_held(&mut held);
        }
        held
    }

    /// The [`KvType`] of the drafter caches made from now on (the default is f32).
    pub fn set_kv_type(&mut self, kv: KvType) {
        self.kv_type = kv;
    }

    /// The arithmetic of its quantized products from now on (see [`crate::Arith`]).
    pub fn set_arith(&mut self, arith: crate::arith::Arith) {
        self.arith = arith;
    }

    /// A fresh drafter cache.
    pub fn new_cache(&self) -> MtpCache {
        MtpCache {
            layers: self
                .layers
                .iter()
                .map(|l| match l.new_cache(self.kv_type) {
                    LayerCache::Attention(kv) => LayerCache::Attention(kv),
                    LayerCache::Linear(_) => LayerCache::Attention(KvCache::default()),
                })
                .collect(),
            pos: 0,
        }
    }

    /// Runs `tokens[i]` paired with target hidden `hidden[i]` (`[n, hidden]`) through the head at
    /// the cache's next positions; returns the head's normed hidden state at the last one
    /// (`[hidden]`, empty when `n` is 0), the only one a draft reads. Earlier positions are
    /// cached; in the last layer only their keys and values are computed.
    pub fn forward(
        &self,
        target: &Qwen35Model,
        tokens: &[u32],
        hidden: &[f32],
        cache: &mut MtpCache,
    ) -> Result<Vec<f32>> {
        if tokens.is_empty() {
            return Ok(Vec::new());
        }
        Ok(self
            .forward_ragged(target, &[(tokens, hidden)], &mut [cache])?
            .pop()
            .unwrap_or_default())
    }

    /// [`MtpHead::forward`] for several sequences at once (`rows[i]`: sequence `i`'s tokens,
    /// at least one, and their target hidden states, with its cache): each one's last normed
    /// hidden state, the bits it gets alone. Sequences go through the head in groups of at
    /// most `kernels::MAX_ROWS` (32) rows (one longer sequence alone), so each group reads the
    /// weights once and every product takes the few-row arithmetic a single sequence takes.
    pub fn forward_ragged(
        &self,
        target: &Qwen35Model,
        rows: &[(&[u32], &[f32])],
        caches: &mut [&mut MtpCache],
    ) -> Result<Vec<Vec<f32>>> {
        let d = self.hidden;
        if caches.len() != rows.len()
            || rows
                .iter()
                .any(|(t, h)| t.is_empty() || Some(h.len()) != t.len().checked_mul(d))
        {
            return Err(Error::InvalidRequest(format!(
                "the MTP head over {} sequences needs a cache and at least one token with its \
                 {d}-wide hidden state per token for each, got {} caches",
                rows.len(),
                caches.len()
            )));
        }
        let lens: Vec<usize> = rows.iter().map(|r| r.0.len()).collect();
        let mut out = Vec::with_capacity(rows.len());
        crate::arith::with_arith(self.arith, || {
            for g in crate::kernels::row_groups(&lens) {
                out.extend(self.forward_group(target, &rows[g.clone()], &mut caches[g])?);
            }
            Ok(out)
        })
    }

    fn forward_group(
        &self,
        target: &Qwen35Model,
        rows: &[(&[u32], &[f32])],
        caches: &mut [&mut MtpCache],
    ) -> Result<Vec<Vec<f32>>> {
        let d = self.hidden;
        let lens: Vec<usize> = rows.iter().map(|r| r.0.len()).collect();
        let n: usize = lens.iter().sum();
        let flat: Vec<u32> = rows.iter().flat_map(|r| r.0.iter().copied()).collect();
        let mut e = target.embed(&flat)?;
        kernels::rms_norm_rows(&mut e, Some(&self.pre_emb), d, self.eps);
        let mut h: Vec<f32> = rows.iter().flat_map(|r| r.1.iter().copied()).collect();
        kernels::rms_norm_rows(&mut h, Some(&self.pre_hidden), d, self.eps);
        // [n, 2d] = [norm(embed) | norm(hidden)]
        let mut cat = Vec::with_capacity(n * 2 * d);
        for i in 0..n {
            cat.extend_from_slice(&e[i * d..(i + 1) * d]);
            cat.extend_from_slice(&h[i * d..(i + 1) * d]);
        }
        let mut x = self.fc.forward(&cat, n)?;
        let positions: Vec<crate::nn::Positions<'_>> = caches
            .iter()
            .map(|c| crate::nn::Positions::From(c.pos))
            .collect();
        let last = self.layers.len() - 1;
        for (i, layer) in self.layers.iter().enumerate() {
            let mut lc: Vec<&mut LayerCache> =
                caches.iter_mut().map(|c| &mut c.layers[i]).collect();
            x = if i == last {
                layer.forward_last_ragged(&x, &lens, &mut lc, &positions)?
            } else {
                layer.forward_ragged(&x, &lens, &mut lc, &positions)?
            };
        }
        for (c, &l) in caches.iter_mut().zip(&lens) {
            c.pos += l;
        }
        kernels::rms_norm_rows(&mut x, Some(&self.norm), d, self.eps);
        Ok(x.chunks_exact(d).map(<[f32]>::to_vec).collect())
    }
}
