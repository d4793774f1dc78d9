//! Qwen3.5 / Qwen3.6 / Qwen3-Next hybrid language models (`qwen3_5`, `qwen3_5_text`,
//! `qwen3_5_moe`, `qwen3_5_moe_text`, `qwen3_next`): full attention every
//! `full_attention_interval` layers, Gated DeltaNet elsewhere, SwiGLU or sparse-MoE MLPs. The
//! model and its checkpoint rules are here; its decoder layer and the layer's parts are in
//! `layers` ([`DecoderLayer`]).
//!
//! Numerics follow mlx-vlm 0.7.10 `models/qwen3_5`, `qwen3_5_moe` and `qwen3_next`.

use std::collections::{BTreeSet, HashMap};

use candle_core::{DType, Device, Tensor};

use crate::arith::{with_arith, Arith};
use crate::cache::{KvType, SeqCache, VerifyMode};
use crate::config::{Family, ModelConfig};
use crate::error::{Error, Result};
use crate::kernels;
use crate::loader::WeightDtype;
use crate::loader::{load_quantized, Checkpoint, Param};
use crate::nn::{Linear, Positions, Store};

mod layers;

pub use layers::{Attention, DecoderLayer, DeltaNet, Mixer, Mlp, Moe};

/// Most tokens of one sequence a forward computes at once: a longer prompt runs in parts (see
/// `Qwen35Model::forward_chunks`; the same bits in dense models), so its transient buffers
/// stay the size of a part's, whatever the prompt's length, as llama.cpp's `n_ubatch` and
/// mlx's prefill steps keep them. On the 8-layer benchmark shape (hidden 1024, MLP 3072), a
/// 4000-token 4-bit prefill peaked at 645 MB resident in one part and 332 MB in four, at the
/// same speed (`/usr/bin/time` of `cargo xtask bench --target-only --prompt-len 4000`, old and
/// new binaries alternated twice); one part had the kernel zero fresh 49 MB mappings for every
/// product's `[4000, 3072]` result (18% of the samples in `perf record`).
pub(crate) const FORWARD_PART: usize = 1024;

/// Which positions of a forward get LM-head logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitsAt {
    /// Only the last position of each row.
    Last,
    /// Every position.
    All,
    /// None (hidden states only).
    None,
}

/// The result of a forward pass.
#[derive(Debug, Clone)]
pub struct ForwardOutput {
    /// Final-normed hidden states `[b, l, hidden]` (what the MTP head consumes).
    pub hidden: Vec<f32>,
    /// Logits `[b, 1 or l, vocab]` per [`LogitsAt`] (empty for `None`).
    pub logits: Vec<f32>,
}

/// Tensors of a checkpoint after [`sanitize`]: the language model's and the MTP head's, with
/// canonical names (`layers.N.…`, `embed_tokens.weight`, `norm.weight`, `lm_head.weight`; MTP
/// names without the `mtp.` prefix).
pub struct Sanitized {
    /// Language-model tensors.
    pub target: HashMap<String, Param>,
    /// MTP-head tensors embedded in the checkpoint (`mtp.*`), already in MLX conventions.
    pub mtp: HashMap<String, Param>,
    /// Vision-tower tensors (`model.visual.*`, MLX `vision_tower.*`) without their prefix.
    pub vision: HashMap<String, Param>,
}

/// RMSNorm weights stored zero-centred in Hugging Face checkpoints (used as `1 + w`).
const SHIFTED_NORMS: [&str; 4] = [
    ".input_layernorm.weight",
    ".post_attention_layernorm.weight",
    ".q_norm.weight",
    ".k_norm.weight",
];

/// Where a checkpoint tensor goes.
enum Dest {
    Target(String),
    Mtp(String),
    Vision(String),
    Skip,
}

fn route(name: &str) -> Dest {
    // the vision tower's namespaces are detection's rule, once
    if let Some(rest) = mtp_detect::vision_tensor_key(name) {
        // mlx-vlm's vision sanitize drops these buffers
        if rest.contains("position_ids") {
            return Dest::Skip;
        }
        return Dest::Vision(rest.to_string());
    }
    if name.contains("visual.") || name.contains(".vision_tower.") {
        return Dest::Skip;
    }
    // Embedded head (Qwen3.5/3.6 HF, mlx-works *-mtp, and every other namespace detection
    // reports as a head: the rule lives in mtp-detect, once).
    if let Some(rest) = mtp_detect::mtp_namespace_key(name) {
        return Dest::Mtp(rest.to_string());
    }
    for (prefix, repl) in [
        // HF Qwen3.5 multimodal layout.
        ("model.language_model.", ""),
        // MLX (mlx-vlm convert) layout.
        ("language_model.model.", ""),
        ("language_model.lm_head.", "lm_head."),
        ("language_model.", ""),
        // HF text-only layouts (qwen3_5_text, qwen3_next).
        ("model.", ""),
    ] {
        if let Some(rest) = name.strip_prefix(prefix) {
            return Dest::Target(format!("{repl}{rest}"));
        }
    }
    Dest::Target(name.to_string())
}

/// Loads every tensor of `ckpt` with canonical names; MLX affine-quantized modules (`X.weight`
/// u32 + `X.scales` + `X.biases`) stay packed (see [`crate::loader::load_quantized`]), except
/// Qwen3-Next's, which are dequantized to f32. The second map says which names came in through
/// the `mtp.` prefix.
fn load_renamed(ckpt: &Checkpoint, cfg: &ModelConfig) -> Result<Sanitized> {
    let shapes = ckpt.shapes();
    let quantized: BTreeSet<String> = shapes
        .keys()
        .filter_map(|k| k.strip_suffix(".scales"))
        .filter(|m| shapes.contains_key(&format!("{m}.weight")))
        .map(str::to_string)
        .collect();
    let mut out = Sanitized {
        target: HashMap::new(),
        mtp: HashMap::new(),
        vision: HashMap::new(),
    };
    for name in shapes.keys() {
        let module = name.rsplit_once('.').map(|(m, _)| m).unwrap_or("");
        if quantized.contains(module) && (name.ends_with(".scales") || name.ends_with(".biases")) {
            continue;
        }
        let dest = route(name);
        let canonical = match &dest {
            Dest::Target(c) | Dest::Mtp(c) | Dest::Vision(c) => c.clone(),
            Dest::Skip => continue,
        };
        let tensors = if quantized.contains(module) && name.ends_with(".weight") {
            // Qwen3-Next's fused projections are split below, on f32 rows
            let packed = cfg.family != Family::Qwen3Next;
            let canonical_module = canonical.trim_end_matches(".weight");
            load_quantized(ckpt, cfg, name, module, canonical_module, packed)?
                .into_iter()
                .map(|(k, t)| (k, Param::Tensor(t)))
                .collect()
        } else {
            vec![(canonical, ckpt.load_float(name)?)]
        };
        for (c, t) in tensors {
            match dest {
                Dest::Target(_) => out.target.insert(c, t),
                Dest::Mtp(_) => out.mtp.insert(c, t),
                Dest::Vision(_) => out.vision.insert(c, t),
                Dest::Skip => None,
            };
        }
    }
    Ok(out)
}

/// Joins per-expert or fused expert tensors into `switch_mlp.{gate,up,down}_proj.weight`
/// stacks `[E, out, in]`.
pub(crate) fn merge_experts(map: &mut HashMap<String, Param>, num_experts: usize) -> Result<()> {
    // HF Qwen3.5-MoE (transformers 5): fused `experts.gate_up_proj` [E, 2I, D] and
    // `experts.down_proj` [E, D, I].
    let fused: Vec<String> = map
        .keys()
        .filter(|k| {
            k.ends_with(".experts.gate_up_proj") || k.ends_with(".experts.gate_up_proj.weight")
        })
        .cloned()
        .collect();
    for key in fused {
        let base = key
            .trim_end_matches(".weight")
            .trim_end_matches(".experts.gate_up_proj")
            .to_string();
        let gu = map
            .remove(&key)
            .ok_or_else(|| Error::MissingTensor {
                name: key.clone(),
                model_type: "qwen3_5_moe".into(),
            })?
            .into_tensor()?;
        let dims = gu.dims().to_vec();
        if dims.len() != 3 || dims[1] % 2 != 0 {
            return Err(Error::ShapeMismatch {
                name: key,
                expected: vec![num_experts, 0, 0],
                actual: dims,
            });
        }
        let i = dims[1] / 2;
        map.insert(
            format!("{base}.switch_mlp.gate_proj.weight"),
            gu.narrow(1, 0, i)?.contiguous()?.into(),
        );
        map.insert(
            format!("{base}.switch_mlp.up_proj.weight"),
            gu.narrow(1, i, i)?.contiguous()?.into(),
        );
        for down in [
            format!("{base}.experts.down_proj"),
            format!("{base}.experts.down_proj.weight"),
        ] {
            if let Some(t) = map.remove(&down) {
                map.insert(format!("{base}.switch_mlp.down_proj.weight"), t);
            }
        }
    }
    // HF Qwen3-Next / older Qwen3.5-MoE: one tensor per expert `experts.{e}.{proj}.weight`.
    let per_expert: BTreeSet<String> = map
        .keys()
        .filter_map(|k| k.split_once(".experts.0.").map(|(b, _)| b.to_string()))
        .collect();
    for base in per_expert {
        for proj in ["gate_proj", "up_proj", "down_proj"] {
            let mut parts = Vec::with_capacity(num_experts);
            for e in 0..num_experts {
                let k = format!("{base}.experts.{e}.{proj}.weight");
                parts.push(
                    map.remove(&k)
                        .ok_or_else(|| Error::MissingTensor {
                            name: k,
                            model_type: "moe".into(),
                        })?
                        .into_tensor()?,
                );
            }
            map.insert(
                format!("{base}.switch_mlp.{proj}.weight"),
                Tensor::stack(&parts, 0)?.into(),
            );
        }
    }
    Ok(())
}

/// Every checkpoint rule of this model family, in one place. Input: the raw checkpoint; output:
/// canonical tensors in MLX conventions (norm weights used as-is, conv weight `[C, K]`, experts
/// stacked, Gated DeltaNet projections split into `in_proj_qkv`/`in_proj_z`/`in_proj_b`/`in_proj_a`).
pub fn sanitize(ckpt: &Checkpoint, cfg: &ModelConfig) -> Result<Sanitized> {
    // Prefix renames (HF `model.language_model.` / MLX `language_model.model.` / text-only
    // `model.`), vision tower set apart, MLX affine-quantized modules left packed: see `route`
    // and `load_renamed`.
    let mut s = load_renamed(ckpt, cfg)?;
    let t = &cfg.text;

    // Tied embeddings: some exports still carry an lm_head copy; the embedding is authoritative.
    if t.tie_word_embeddings {
        for part in ["weight", "scales", "biases", "bits"] {
            s.target.remove(&format!("lm_head.{part}"));
        }
    }

    // Norm convention, decided from the conv1d weight layout only: Hugging Face checkpoints store
    // torch conv weights [C, 1, K] *and* zero-centred RMSNorm weights (used as 1 + w); MLX
    // conversions store [C, K, 1] with norms already shifted. The presence of `mtp.*` tensors
    // says nothing about this (the mlx-lm double-shift bug, ml-explore/mlx-lm#1623).
    let hf_layout = s
        .target
        .iter()
        .any(|(k, v)| k.ends_with("conv1d.weight") && v.dims().last().is_some_and(|d| *d != 1));

    let keys: Vec<String> = s.target.keys().cloned().collect();
    for k in keys {
        let Some(v) = s.target.remove(&k) else {
            continue;
        };
        let v = if k.ends_with("conv1d.weight") && v.rank() == 3 {
            // HF torch layout [C, 1, K] and MLX layout [C, K, 1] both become [C, K].
            let dims = v.dims().to_vec();
            let v = v.into_tensor()?;
            if dims[2] == 1 {
                v.reshape((dims[0], dims[1]))?.into()
            } else {
                v.reshape((dims[0], dims[2]))?.into()
            }
        } else if hf_layout
            && v.rank() == 1
            && (k == "norm.weight" || SHIFTED_NORMS.iter().any(|s| k.ends_with(s)))
        {
            // HF zero-centred RMSNorm weights (Qwen3.5/3.6/Next HF layout); the gated norm of
            // linear attention (`linear_attn.norm.weight`) is stored as-is.
            shift_norm(&v.tensor()?)?.into()
        } else {
            v
        };
        s.target.insert(k, v);
    }

    // Qwen3-Next HF layout fuses the DeltaNet input projections per key head:
    // in_proj_qkvz rows [q (dk), k (dk), v (r dv), z (r dv)] and in_proj_ba rows [b (r), a (r)]
    // for each of the nk key heads (r = value heads per key head).
    if cfg.family == Family::Qwen3Next {
        split_qwen3_next_projections(&mut s.target, cfg)?;
    }

    // MoE experts: fused or per-expert HF tensors become stacked switch_mlp tensors.
    if t.num_experts > 0 {
        merge_experts(&mut s.target, t.num_experts)?;
        merge_experts(&mut s.mtp, t.num_experts)?;
    }

    // Embedded MTP head (`mtp.*`, HF naming): mlx-vlm's drafter loader treats `mtp.`-prefixed
    // tensors as HF layout and shifts their RMSNorm weights (including the head's own
    // `pre_fc_norm_*` and final `norm`).
    let keys: Vec<String> = s.mtp.keys().cloned().collect();
    for k in keys {
        if let Some(v) = s.mtp.remove(&k) {
            let v = if v.rank() == 1 && is_mtp_norm(&k) {
                shift_norm(&v.tensor()?)?.into()
            } else {
                v
            };
            s.mtp.insert(k, v);
        }
    }
    Ok(s)
}

/// `1 + w` for an RMSNorm weight stored zero-centred (HF layout), computed in f32 whatever the
/// stored precision.
pub(crate) fn shift_norm(w: &Tensor) -> Result<Tensor> {
    Ok((w.to_dtype(DType::F32)? + 1.0)?)
}

/// RMSNorm weights of an MTP head stored zero-centred in HF layout (mlx-vlm's
/// `_QWEN_MTP_NORM_SUFFIXES`): the decoder layers' norms, the final `norm` and both `pre_fc_norm_*`.
pub(crate) fn is_mtp_norm(k: &str) -> bool {
    !k.contains("linear_attn")
        && (k.ends_with("norm.weight")
            || k.ends_with("pre_fc_norm_embedding.weight")
            || k.ends_with("pre_fc_norm_hidden.weight"))
}

fn split_qwen3_next_projections(map: &mut HashMap<String, Param>, cfg: &ModelConfig) -> Result<()> {
    let t = &cfg.text;
    let (nk, dk, nv, dv) = (
        t.linear_num_key_heads,
        t.linear_key_head_dim,
        t.linear_num_value_heads,
        t.linear_value_head_dim,
    );
    let r = nv / nk;
    let keys: Vec<String> = map
        .keys()
        .filter(|k| k.ends_with("linear_attn.in_proj_qkvz.weight"))
        .cloned()
        .collect();
    for key in keys {
        let base = key.trim_end_matches(".in_proj_qkvz.weight").to_string();
        let Some(w) = map.remove(&key) else { continue };
        let w = w.into_tensor()?;
        let group = 2 * dk + 2 * r * dv;
        let d = w.dims()[1];
        let w = w.reshape((nk, group, d))?;
        let q = w.narrow(1, 0, dk)?.reshape((nk * dk, d))?;
        let k = w.narrow(1, dk, dk)?.reshape((nk * dk, d))?;
        let v = w.narrow(1, 2 * dk, r * dv)?.reshape((nk * r * dv, d))?;
        let z = w
            .narrow(1, 2 * dk + r * dv, r * dv)?
            .reshape((nk * r * dv, d))?;
        map.insert(
            format!("{base}.in_proj_qkv.weight"),
            Tensor::cat(&[q, k, v], 0)?.into(),
        );
        map.insert(format!("{base}.in_proj_z.weight"), z.into());
        let ba_key = format!("{base}.in_proj_ba.weight");
        let ba = map
            .remove(&ba_key)
            .ok_or(Error::MissingTensor {
                name: ba_key,
                model_type: "qwen3_next".into(),
            })?
            .into_tensor()?;
        let ba = ba.reshape((nk, 2 * r, d))?;
        map.insert(
            format!("{base}.in_proj_b.weight"),
            ba.narrow(1, 0, r)?.reshape((nk * r, d))?.into(),
        );
        map.insert(
            format!("{base}.in_proj_a.weight"),
            ba.narrow(1, r, r)?.reshape((nk * r, d))?.into(),
        );
    }
    Ok(())
}

/// A loaded Qwen3.5-family language model.
#[derive(Debug)]
pub struct Qwen35Model {
    cfg: ModelConfig,
    /// `[vocab, hidden]`, held like any matrix (kept packed when quantized).
    embed: Linear,
    layers: Vec<DecoderLayer>,
    norm: Vec<f32>,
    lm_head: Linear,
    verify_mode: VerifyMode,
    kv_type: KvType,
    /// The arithmetic of its quantized products (see [`Arith`]).
    arith: Arith,
}

impl Qwen35Model {
    /// Builds the model from sanitized tensors, on the store's device (`st` keeps whatever is not
    /// used).
    pub fn load(cfg: &ModelConfig, st: &mut Store) -> Result<Self> {
        let t = &cfg.text;
        let embed = st.linear("embed_tokens", t.vocab_size, t.hidden_size)?;
        // grown layer by layer: a config claiming more layers than the weights hold stops at the
        // first missing tensor, never at an allocation sized by the claim
        let mut layers = Vec::new();
        for i in 0..t.num_hidden_layers {
            layers.push(DecoderLayer::load(
                st,
                cfg,
                &format!("layers.{i}"),
                cfg.is_full_attention(i),
                cfg.is_moe_layer(i),
            )?);
        }
        let norm = st.vec("norm.weight", t.hidden_size)?;
        let lm_head = if t.tie_word_embeddings {
            embed.clone()
        } else {
            st.linear("lm_head", t.vocab_size, t.hidden_size)?
        };
        Ok(Qwen35Model {
            cfg: cfg.clone(),
            embed,
            layers,
            norm,
            lm_head,
            verify_mode: VerifyMode::Auto,
            kv_type: KvType::F32,
            arith: Arith::Exact,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// Bytes of the matrices held, per kind (`f32`, `bf16`, `f16`; `q4` etc. for MLX-quantized
    /// matrices kept packed): what [`WeightDtype`] made of the checkpoint. A tied LM head is the
    /// embedding, counted once.
    pub fn weights_held(&self) -> std::collections::BTreeMap<String, usize> {
        let mut held = std::collections::BTreeMap::new();
        crate::nn::tally(&mut held, self.embed.held());
        if !self.cfg.text.tie_word_embeddings {
            crate::nn::tally(&mut held, self.lm_head.held());
        }
        for l in &self.layers {
            l.weights_held(&mut held);
        }
        held
    }

    /// Residual width.
    pub fn hidden_size(&self) -> usize {
        self.cfg.text.hidden_size
    }

    /// Vocabulary size.
    pub fn vocab_size(&self) -> usize {
        self.cfg.text.vocab_size
    }

    /// A fresh cache for one sequence.
    pub fn new_cache(&self) -> SeqCache {
        let mut c = SeqCache::new(
            self.layers
                .iter()
                .map(|l| l.new_cache(self.kv_type))
                .collect(),
        );
        c.set_verify_mode(self.verify_mode);
        c
    }

    /// The [`VerifyMode`] of caches made from now on (the default is [`VerifyMode::Auto`];
    /// every mode gives the same bits, see `cache`).
    pub fn set_verify_mode(&mut self, mode: VerifyMode) {
        self.verify_mode = mode;
    }

    /// The [`KvType`] of the KV caches made from now on (the default is f32).
    pub fn set_kv_type(&mut self, kv: KvType) {
        self.kv_type = kv;
    }

    /// The [`KvType`] of the KV caches it makes.
    pub fn kv_type(&self) -> KvType {
        self.kv_type
    }

    /// The arithmetic of its quantized products from now on (the default, [`Arith::Exact`],
    /// is mlx's).
    pub fn set_arith(&mut self, arith: Arith) {
        self.arith = arith;
    }

    /// The arithmetic of its quantized products.
    pub fn arith(&self) -> Arith {
        self.arith
    }

    /// Token embeddings `[n, hidden]`.
    pub fn embed(&self, ids: &[u32]) -> Result<Vec<f32>> {
        self.embed.rows(ids)
    }

    /// LM head over hidden rows `[n, hidden]` → `[n, vocab]`.
    pub fn logits(&self, hidden: &[f32], n: usize) -> Result<Vec<f32>> {
        with_arith(self.arith, || self.lm_head.forward(hidden, n))
    }

    /// Runs `tokens` (one row per sequence, of any lengths of at least one token) through the
    /// model, extending each row's cache. Rows may sit at different positions and have
    /// different lengths (a batch's target-only tokens next to its verify rounds); every row is
    /// computed as it would be alone. `hidden` and, with [`LogitsAt::All`], `logits` hold the
    /// rows of sequence 0, then of sequence 1, ...; with [`LogitsAt::Last`], one logits row per
    /// sequence.
    pub fn forward(
        &self,
        tokens: &[Vec<u32>],
        caches: &mut [SeqCache],
        at: LogitsAt,
    ) -> Result<ForwardOutput> {
        self.forward_each(tokens, caches, &vec![at; tokens.len()])
    }

    /// [`Qwen35Model::forward`] with each sequence's own [`LogitsAt`] (`at[i]` for
    /// `tokens[i]`): a batch step's decode and verify rows want every row's logits, a prompt
    /// chunk riding in the same forward its last row's or none. `logits` holds, in sequence
    /// order, every row of an [`LogitsAt::All`] sequence and the last row of a
    /// [`LogitsAt::Last`] one; `hidden` every row of every sequence.
    pub fn forward_each(
        &self,
        tokens: &[Vec<u32>],
        caches: &mut [SeqCache],
        at: &[LogitsAt],
    ) -> Result<ForwardOutput> {
        if at.len() != tokens.len() {
            return Err(Error::InvalidRequest(format!(
                "forward needs a logits choice per sequence: {} for {} sequences",
                at.len(),
                tokens.len()
            )));
        }
        with_arith(self.arith, || self.forward_in(tokens, caches, at))
    }

    /// [`Qwen35Model::forward_each`] in the model's arithmetic.
    fn forward_in(
        &self,
        tokens: &[Vec<u32>],
        caches: &mut [SeqCache],
        at: &[LogitsAt],
    ) -> Result<ForwardOutput> {
        let b = tokens.len();
        if b == 0 || tokens.iter().all(Vec::is_empty) {
            return Ok(ForwardOutput {
                hidden: Vec::new(),
                logits: Vec::new(),
            });
        }
        if caches.len() != b || tokens.iter().any(Vec::is_empty) {
            return Err(Error::InvalidRequest(format!(
                "forward needs {b} caches and a token in every row, got {} caches",
                caches.len()
            )));
        }
        if caches.iter().any(SeqCache::verify_pending) {
            return Err(Error::Unsupported(
                crate::cache::SECOND_VERIFY_FORWARD.into(),
            ));
        }
        // Products over more than `MAX_ROWS` rows take `fgemm`, whose bits differ from the
        // few-row product's: sequences are computed in groups of at most that many rows (a
        // longer sequence alone, as it would be anyway), so each gets the bits it gets alone.
        let total: usize = tokens.iter().map(Vec::len).sum();
        if b > 1 && total > kernels::MAX_ROWS {
            return self.forward_grouped(tokens, caches, at);
        }
        if b == 1 && total > FORWARD_PART {
            return self.forward_chunks(&tokens[0], &mut caches[0], at[0], FORWARD_PART);
        }
        let d = self.hidden_size();
        let lens: Vec<usize> = tokens.iter().map(Vec::len).collect();
        let rows: usize = lens.iter().sum();
        let flat: Vec<u32> = tokens.iter().flatten().copied().collect();
        let mut x = self.embed(&flat)?;
        // a sequence with images: their features over the pad embeddings, and multimodal
        // position ids (text-only sequences keep plain positions)
        let mut ids = Vec::with_capacity(b);
        let mut row = 0;
        for (c, &l) in caches.iter().zip(&lens) {
            ids.push(c.images().and_then(|m| {
                m.write_features(c.position(), l, &mut x[row * d..(row + l) * d]);
                m.position_ids(c.position(), l)
            }));
            row += l;
        }
        let positions: Vec<Positions<'_>> = caches
            .iter()
            .zip(&ids)
            .map(|(c, ids)| match ids {
                Some(v) => Positions::Each(v),
                None => Positions::From(c.position()),
            })
            .collect();
        for (i, layer) in self.layers.iter().enumerate() {
            let mut lc: Vec<&mut crate::cache::LayerCache> =
                caches.iter_mut().map(|c| &mut c.layers[i]).collect();
            let next = layer.forward_ragged(&x, &lens, &mut lc, &positions)?;
            crate::scratch::recycle(std::mem::replace(&mut x, next));
        }
        for (c, &l) in caches.iter_mut().zip(&lens) {
            c.advance(l);
        }
        kernels::rms_norm_rows(
            &mut x,
            Some(&self.norm),
            d,
            self.cfg.text.rms_norm_eps as f32,
        );
        let logits = if at.iter().all(|a| matches!(a, LogitsAt::All)) {
            self.logits(&x, rows)?
        } else {
            // the rows asked for, in order (each computed as it is alone: the LM head's
            // few-row product keeps every row's bits whatever rows come with it)
            let mut picked = Vec::new();
            let mut end = 0;
            for (&l, a) in lens.iter().zip(at) {
                let start = end;
                end += l;
                match a {
                    LogitsAt::None => {}
                    LogitsAt::All => picked.extend_from_slice(&x[start * d..end * d]),
                    LogitsAt::Last => picked.extend_from_slice(&x[(end - 1) * d..end * d]),
                }
            }
            match picked.len() / d {
                0 => Vec::new(),
                n => self.logits(&picked, n)?,
            }
        };
        Ok(ForwardOutput { hidden: x, logits })
    }

    /// [`Qwen35Model::forward`] of one sequence of more than `chunk` tokens, in consecutive
    /// parts of at most `chunk` (as even as possible, so each is over half of `chunk`), each a
    /// forward through every layer on the cache the previous part left: every row's products,
    /// its attention over the cache and its delta-rule step are computed as they would be in
    /// one forward (a row's bits do not depend on the rows computed with it, as long as
    /// products keep to `fgemm`: `chunk` is at least `2 · (MAX_ROWS + 1)`, so every part is
    /// over `MAX_ROWS`), so the output has the same bits. In MoE layers an expert's rows take
    /// the few-row or the panel product by how many the forward routes to it, so there a
    /// part's rows can differ in the last place.
    fn forward_chunks(
        &self,
        tokens: &[u32],
        cache: &mut SeqCache,
        at: LogitsAt,
        chunk: usize,
    ) -> Result<ForwardOutput> {
        assert!(
            chunk >= 2 * (kernels::MAX_ROWS + 1),
            "forward_chunks: parts of {chunk} tokens"
        );
        let n = tokens.len();
        let parts = n.div_ceil(chunk);
        let mut out = ForwardOutput {
            hidden: Vec::with_capacity(n * self.hidden_size()),
            logits: Vec::new(),
        };
        for p in 0..parts {
            let (start, end) = (p * n / parts, (p + 1) * n / parts);
            let at = match at {
                LogitsAt::All => LogitsAt::All,
                LogitsAt::Last if end == n => LogitsAt::Last,
                _ => LogitsAt::None,
            };
            let part = self.forward(
                &[tokens[start..end].to_vec()],
                std::slice::from_mut(cache),
                at,
            )?;
            out.hidden.extend_from_slice(&part.hidden);
            out.logits.extend_from_slice(&part.logits);
        }
        Ok(out)
    }

    /// [`Qwen35Model::forward`] in groups of consecutive sequences of at most
    /// [`kernels::MAX_ROWS`] rows together (one longer sequence alone), outputs in order.
    fn forward_grouped(
        &self,
        tokens: &[Vec<u32>],
        caches: &mut [SeqCache],
        at: &[LogitsAt],
    ) -> Result<ForwardOutput> {
        let mut out = ForwardOutput {
            hidden: Vec::new(),
            logits: Vec::new(),
        };
        let lens: Vec<usize> = tokens.iter().map(Vec::len).collect();
        for g in kernels::row_groups(&lens) {
            let part = self.forward_each(&tokens[g.clone()], &mut caches[g.clone()], &at[g])?;
            out.hidden.extend_from_slice(&part.hidden);
            out.logits.extend_from_slice(&part.logits);
        }
        Ok(out)
    }
}

/// What [`load_dir`] reads from a checkpoint directory.
pub struct Loaded {
    /// The language model.
    pub model: Qwen35Model,
    /// The embedded MTP head's tensors (empty when the checkpoint has none).
    pub mtp: HashMap<String, Param>,
    /// The vision tower: `None` when the checkpoint has none (no `vision_config` or no
    /// `model.visual.*` tensors), `Err` with the reason when it has one this engine cannot
    /// build (images are then refused with that message; text still runs).
    pub vision: Option<std::result::Result<crate::vision::VisionTower, String>>,
}

/// Loads a checkpoint directory: config, sanitize, build.
pub fn load_dir(dir: &std::path::Path, device: &Device, dtype: WeightDtype) -> Result<Loaded> {
    let cfg = ModelConfig::load(dir)?;
    if cfg.model_type == "qwen3_5_mtp" {
        return Err(Error::Unsupported(format!(
            "{} is a qwen3_5_mtp companion drafter, not a target model: load the target model it \
             was made for and give this folder as its drafter (`--drafter {}` on the command line, \
             `speculation.drafter` in code)",
            dir.display(),
            dir.display()
        )));
    }
    let ckpt = Checkpoint::open(dir)?;
    let s = sanitize(&ckpt, &cfg)?;
    check_mtp_layers(&cfg, &s.mtp, dir)?;
    let vision = if s.vision.is_empty() {
        None
    } else {
        Some(match &cfg.vision {
            None => Err("the checkpoint has vision-tower tensors but no vision_config".into()),
            Some(Err(m)) => Err(m.clone()),
            Some(Ok(vc)) => {
                let mut vst = Store::new(s.vision, &cfg.model_type, dtype, device);
                let tower = crate::vision::VisionTower::load(vc, &mut vst, device)
                    .map_err(|e| format!("the vision tower does not load: {e}"));
                let left: Vec<&String> = vst.names().collect();
                if tower.is_ok() && !left.is_empty() {
                    tracing::debug!(unused = ?left, "tensors not used by the vision tower");
                }
                tower
            }
        })
    };
    if let Some(Err(m)) = &vision {
        tracing::warn!(reason = %m, "images will be refused");
    }
    let mut st = Store::new(s.target, &cfg.model_type, dtype, device);
    let model = Qwen35Model::load(&cfg, &mut st)?;
    let left: Vec<&String> = st.names().collect();
    if !left.is_empty() {
        tracing::debug!(unused = ?left, "tensors not used by the language model");
    }
    Ok(Loaded {
        model,
        mtp: s.mtp,
        vision,
    })
}

/// An embedded head must have the decoder layers `mtp_num_hidden_layers` declares (the head is
/// built from the layers the checkpoint holds). A checkpoint without one is fine whatever the
/// config says (quantized exports strip the head; the engine then runs without it), and so is a
/// head the config does not declare (Qwen3-Next ships one without `mtp_num_hidden_layers`).
fn check_mtp_layers(
    cfg: &ModelConfig,
    mtp: &HashMap<String, Param>,
    dir: &std::path::Path,
) -> Result<()> {
    let declared = cfg.text.mtp_num_hidden_layers;
    if declared == 0 || mtp.is_empty() {
        return Ok(());
    }
    let found = (0..)
        .take_while(|i| mtp.contains_key(&format!("layers.{i}.input_layernorm.weight")))
        .count();
    if found != declared {
        return Err(Error::Config {
            path: dir.join("config.json"),
            message: format!(
                "mtp_num_hidden_layers = {declared}, but the checkpoint's MTP head has {found} \
                 decoder layer(s)"
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> std::path::PathBuf {
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures")
            .join(name)
    }

    /// A long prompt's forward in parts (as `forward` splits one past `FORWARD_PART`) gives
    /// the hidden rows, logits and cache of one forward, bit for bit, and so does any other
    /// split into parts of more than `MAX_ROWS` rows: dense f32 and packed 4-bit weights,
    /// logits at every position and at the last one, and the decode step after. In MoE layers
    /// an expert's rows take the few-row or the panel product by how many a part routes to
    /// it, so there the parts agree within rounding (1e-5 of the largest logit), not bit for
    /// bit.
    #[test]
    fn a_prompt_in_parts_has_the_bits_of_one_forward() {
        for name in ["tiny-hf", "tiny-mlx4", "tiny-moe-mlx4"] {
            let moe = name.contains("moe");
            let bits = |a: &[f32], b: &[f32]| {
                let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
                a.len() == b.len()
                    && a.iter().zip(b).all(|(x, y)| {
                        x.to_bits() == y.to_bits() || (moe && (x - y).abs() <= 1e-5 * scale)
                    })
            };
            let model = load_dir(&fixture(name), &Device::Cpu, WeightDtype::Stored)
                .expect("fixture")
                .model;
            let prompt: Vec<u32> = (0..301u32).map(|i| 2 + (i * 37 + 11) % 200).collect();
            let run = |chunk: Option<usize>, at: LogitsAt| {
                let mut cache = model.new_cache();
                let out = match chunk {
                    None => model.forward(
                        std::slice::from_ref(&prompt),
                        std::slice::from_mut(&mut cache),
                        at,
                    ),
                    Some(c) => model.forward_chunks(&prompt, &mut cache, at, c),
                }
                .expect("prefill");
                let step = model
                    .forward(&[vec![7]], std::slice::from_mut(&mut cache), LogitsAt::Last)
                    .expect("step");
                (out, step.logits)
            };
            for at in [LogitsAt::All, LogitsAt::Last, LogitsAt::None] {
                let (whole, after) = run(None, at);
                assert_eq!(whole.hidden.len(), prompt.len() * model.hidden_size());
                // 301 tokens in parts of up to 66 (five of 60-61), 100 (four of 75-76), 151
                // (two of 150-151)
                for chunk in [66, 100, 151] {
                    let (parts, step) = run(Some(chunk), at);
                    let case = format!("{name}, {at:?}, parts of up to {chunk}");
                    assert!(bits(&parts.hidden, &whole.hidden), "hidden rows, {case}");
                    assert!(bits(&parts.logits, &whole.logits), "logits, {case}");
                    assert!(bits(&step, &after), "the step after, {case}");
                }
            }
        }
    }
}
