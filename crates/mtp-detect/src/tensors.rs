//! The tensor-name rules: which tensor names belong to an MTP head. They live here once; the
//! engine calls these functions to split a checkpoint into target and head.
//!
//! ```
//! use mtp_detect::{classify_tensor, is_mtp_tensor, mtp_layer_index, MtpStyle};
//!
//! assert!(is_mtp_tensor("mtp.fc.weight"));
//! assert!(is_mtp_tensor("blk.64.nextn.eh_proj.weight"));
//! assert!(!is_mtp_tensor("model.language_model.layers.0.mlp.up_proj.weight"));
//! // DeepSeek/GLM NextN layers sit after the base layers; with the base depth known, every
//! // tensor of those layers counts, not only the markers.
//! let t = classify_tensor("model.layers.61.self_attn.q_proj.weight", Some(61)).unwrap();
//! assert_eq!(t.style, MtpStyle::NextN);
//! assert_eq!(mtp_layer_index("model.layers.61.enorm.weight", Some(61)), Some(0));
//! assert_eq!(mtp_layer_index("mtp.layers.0.mlp.gate_proj.weight", None), Some(0));
//! ```

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// The naming convention an MTP tensor follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MtpStyle {
    /// An `mtp.` namespace: `mtp.fc`, `mtp.pre_fc_norm_embedding`, `mtp.pre_fc_norm_hidden`,
    /// `mtp.layers.N.*`, `mtp.norm` (Qwen3.5, Qwen3-Next, Nemotron-H, DeepSeek-V4 HF layouts),
    /// possibly under `model.` / `language_model.`, or `model.mtp_layers.N.*` (Hunyuan).
    MtpPrefix,
    /// DeepSeek/GLM NextN: extra decoder layers `model.layers.{num_hidden_layers + i}.*`
    /// carrying `eh_proj`, `enorm`, `hnorm` (and `shared_head`).
    NextN,
    /// GGUF: `blk.N.nextn.*`, plus every `blk.N.*` of a NextN block when the base depth is known.
    GgufNextN,
    /// A companion drafter's own weights, without the `mtp.` prefix (`fc.weight`,
    /// `layers.N.*`, `norm.weight`, `pre_fc_norm_*`), as MLX drafters store them.
    Drafter,
    /// ERNIE-4.5: per MTP layer `N`, `model.mtp_linear_proj.N`, `model.mtp_emb_norm.N`,
    /// `model.mtp_hidden_norm.N` and the decoder layer `model.mtp_block.N.*`.
    Ernie,
}

/// One tensor name classified as part of an MTP head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MtpTensor<'a> {
    /// The convention.
    pub style: MtpStyle,
    /// The layer number in the name (`mtp.layers.N` → N, `model.layers.M` → M,
    /// `blk.M` → M); `None` for tensors outside a layer (`mtp.fc`, `mtp.norm`).
    pub layer: Option<u64>,
    /// The name after the MTP namespace or layer prefix, e.g. `fc.weight`, `eh_proj.weight`.
    pub component: &'a str,
}

/// Namespaces of the `mtp.` convention, longest first.
pub const MTP_PREFIXES: [&str; 5] = [
    "model.language_model.mtp.",
    "language_model.model.mtp.",
    "language_model.mtp.",
    "model.mtp.",
    "mtp.",
];

/// Decoder-layer prefixes under which DeepSeek/GLM NextN layers appear.
pub const LAYER_PREFIXES: [&str; 4] = [
    "model.language_model.layers.",
    "language_model.model.layers.",
    "model.layers.",
    "layers.",
];

/// ERNIE-4.5's MTP modules, each numbered by MTP layer: `model.mtp_{module}.N.…`, the names
/// llama.cpp b11434's converter matches in ERNIE-4.5 MoE checkpoints, and drops
/// (`conversion/ernie.py`, `Ernie4_5MoeModel.filter_tensors`).
pub const ERNIE_MTP_MODULES: [&str; 4] = ["linear_proj", "emb_norm", "hidden_norm", "block"];

/// Components that only a NextN layer has.
pub const NEXTN_MARKERS: [&str; 4] = ["eh_proj.", "enorm.", "hnorm.", "shared_head."];

/// Top-level components of a companion drafter (after stripping any `mtp.` namespace).
pub const DRAFTER_COMPONENTS: [&str; 6] = [
    "fc.",
    "pre_fc_norm_embedding.",
    "pre_fc_norm_hidden.",
    "norm.",
    "layers.",
    "eh_proj.",
];

/// Tensors a `qwen3_5_mtp` drafter must carry (canonical names, without `mtp.`).
pub const QWEN_DRAFTER_REQUIRED: [&str; 4] = [
    "fc.weight",
    "pre_fc_norm_embedding.weight",
    "pre_fc_norm_hidden.weight",
    "norm.weight",
];

/// Splits `layers.N.rest` into `(N, rest)`.
fn split_layer(s: &str) -> Option<(u64, &str)> {
    let (num, rest) = s.split_once('.')?;
    if num.is_empty() || num.len() > 9 || !num.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((num.parse().ok()?, rest))
}

/// Classifies one tensor name. `base_layers` is the number of ordinary decoder layers
/// (`num_hidden_layers` of a safetensors config; `block_count - nextn_predict_layers` of a
/// GGUF); with it, every tensor of a NextN layer counts, without it only the NextN markers.
/// Drafter-layout names (no `mtp.` prefix) are not classified here: see
/// [`drafter_tensor_key`].
pub fn classify_tensor(name: &str, base_layers: Option<u64>) -> Option<MtpTensor<'_>> {
    if let Some(rest) = name.strip_prefix("blk.") {
        let (m, comp) = split_layer(rest)?;
        if let Some(c) = comp.strip_prefix("nextn.") {
            return Some(MtpTensor {
                style: MtpStyle::GgufNextN,
                layer: Some(m),
                component: c,
            });
        }
        return match base_layers {
            Some(base) if m >= base => Some(MtpTensor {
                style: MtpStyle::GgufNextN,
                layer: Some(m),
                component: comp,
            }),
            _ => None,
        };
    }
    if let Some(t) = classify_ernie(name) {
        return Some(t);
    }
    if let Some(rest) = name.strip_prefix("model.mtp_layers.") {
        let (n, comp) = split_layer(rest)?;
        return Some(MtpTensor {
            style: MtpStyle::MtpPrefix,
            layer: Some(n),
            component: comp,
        });
    }
    for p in MTP_PREFIXES {
        if let Some(rest) = name.strip_prefix(p) {
            let (layer, component) = match rest.strip_prefix("layers.").and_then(split_layer) {
                Some((n, comp)) => (Some(n), comp),
                None => (None, rest),
            };
            if component.is_empty() {
                return None;
            }
            return Some(MtpTensor {
                style: MtpStyle::MtpPrefix,
                layer,
                component,
            });
        }
    }
    for p in LAYER_PREFIXES {
        if let Some(rest) = name.strip_prefix(p) {
            let (m, comp) = split_layer(rest)?;
            let marker = NEXTN_MARKERS.iter().any(|k| comp.starts_with(k));
            let beyond = base_layers.is_some_and(|base| m >= base);
            if marker || beyond {
                return Some(MtpTensor {
                    style: MtpStyle::NextN,
                    layer: Some(m),
                    component: comp,
                });
            }
            return None;
        }
    }
    None
}

/// ERNIE-4.5's `model.mtp_{module}.N.…`: the layer is `N`, the component what follows
/// `model.mtp_` (`linear_proj.0.weight`, `block.0.self_attn.q_proj.weight`).
fn classify_ernie(name: &str) -> Option<MtpTensor<'_>> {
    let component = name.strip_prefix("model.mtp_")?;
    let (module, rest) = component.split_once('.')?;
    if !ERNIE_MTP_MODULES.contains(&module) {
        return None;
    }
    let (n, tail) = split_layer(rest)?;
    if tail.is_empty() {
        return None;
    }
    Some(MtpTensor {
        style: MtpStyle::Ernie,
        layer: Some(n),
        component,
    })
}

/// Whether `name` is an MTP tensor by name alone (no config needed): an `mtp.` namespace,
/// a GGUF `blk.N.nextn.*` tensor, ERNIE-4.5's `model.mtp_{linear_proj,emb_norm,hidden_norm,
/// block}.N.*`, or a NextN marker (`eh_proj`, `enorm`, `hnorm`, `shared_head`) inside a decoder
/// layer.
pub fn is_mtp_tensor(name: &str) -> bool {
    classify_tensor(name, None).is_some()
}

/// The MTP layer a tensor belongs to, counted from 0 within the head: `mtp.layers.N` and
/// ERNIE's `model.mtp_*.N` → N; NextN layer `M` → `M - base_layers`. `None` for tensors outside a layer, tensors that are
/// not MTP tensors, or NextN tensors when `base_layers` is unknown.
pub fn mtp_layer_index(name: &str, base_layers: Option<u64>) -> Option<u64> {
    let t = classify_tensor(name, base_layers)?;
    match t.style {
        MtpStyle::MtpPrefix | MtpStyle::Drafter | MtpStyle::Ernie => t.layer,
        MtpStyle::NextN | MtpStyle::GgufNextN => t.layer?.checked_sub(base_layers?),
    }
}

/// The MTP tensors among `names`, in input order: what the engine splits off as the head.
///
/// ```
/// use mtp_detect::mtp_tensor_names;
/// let names = ["lm_head.weight", "mtp.fc.weight", "model.layers.3.enorm.weight", "model.layers.3.mlp.up_proj.weight"];
/// assert_eq!(mtp_tensor_names(names, None), vec!["mtp.fc.weight", "model.layers.3.enorm.weight"]);
/// assert_eq!(mtp_tensor_names(names, Some(3)).len(), 3);
/// ```
pub fn mtp_tensor_names<'a, I>(names: I, base_layers: Option<u64>) -> Vec<&'a str>
where
    I: IntoIterator<Item = &'a str>,
{
    names
        .into_iter()
        .filter(|n| classify_tensor(n, base_layers).is_some())
        .collect()
}

/// The name of an embedded head's tensor inside its `mtp.` namespace, for every namespace
/// detection accepts (`mtp.`, `model.mtp.`, `language_model.mtp.`, `model.language_model.mtp.`,
/// `language_model.model.mtp.`): what the engine loads the head from. `None` for names outside
/// those namespaces.
///
/// ```
/// use mtp_detect::mtp_namespace_key;
/// assert_eq!(mtp_namespace_key("mtp.fc.weight"), Some("fc.weight"));
/// assert_eq!(mtp_namespace_key("model.language_model.mtp.layers.0.mlp.up_proj.weight"),
///            Some("layers.0.mlp.up_proj.weight"));
/// assert_eq!(mtp_namespace_key("model.language_model.layers.0.mlp.up_proj.weight"), None);
/// ```
pub fn mtp_namespace_key(name: &str) -> Option<&str> {
    MTP_PREFIXES
        .iter()
        .find_map(|p| name.strip_prefix(p))
        .filter(|rest| !rest.is_empty())
}

/// Namespaces of a vision tower's tensors: Hugging Face's `model.visual.` (Qwen2/3-VL, Qwen3.5),
/// the same nested in the language model (which mlx-vlm's loader accepts), a bare `visual.`,
/// and MLX's `vision_tower.`.
pub const VISION_PREFIXES: [&str; 4] = [
    "model.visual.",
    "model.language_model.visual.",
    "visual.",
    "vision_tower.",
];

/// The name of a vision-tower tensor without its namespace (`None` for other tensors).
///
/// ```
/// use mtp_detect::vision_tensor_key;
/// assert_eq!(vision_tensor_key("model.visual.blocks.0.attn.qkv.weight"), Some("blocks.0.attn.qkv.weight"));
/// assert_eq!(vision_tensor_key("vision_tower.merger.linear_fc1.weight"), Some("merger.linear_fc1.weight"));
/// assert_eq!(vision_tensor_key("model.language_model.layers.0.mlp.up_proj.weight"), None);
/// ```
pub fn vision_tensor_key(name: &str) -> Option<&str> {
    VISION_PREFIXES
        .iter()
        .find_map(|p| name.strip_prefix(p))
        .filter(|rest| !rest.is_empty())
}

/// The canonical key of a companion drafter's tensor: the name with any `mtp.` namespace
/// stripped, if what remains is a drafter component (`fc.weight`, `layers.0.*`, `norm.weight`,
/// `pre_fc_norm_*`, `eh_proj.*`). `None` for anything else.
///
/// ```
/// use mtp_detect::drafter_tensor_key;
/// assert_eq!(drafter_tensor_key("mtp.fc.weight"), Some("fc.weight"));
/// assert_eq!(drafter_tensor_key("layers.0.self_attn.q_proj.scales"), Some("layers.0.self_attn.q_proj.scales"));
/// assert_eq!(drafter_tensor_key("lm_head.weight"), None);
/// ```
pub fn drafter_tensor_key(name: &str) -> Option<&str> {
    let stripped = mtp_namespace_key(name).unwrap_or(name);
    DRAFTER_COMPONENTS
        .iter()
        .any(|c| stripped.starts_with(c))
        .then_some(stripped)
}

/// Whether `name` is an MLX affine-quantization companion (`.scales` / `.biases`).
pub fn is_mlx_quant_tensor(name: &str) -> bool {
    name.ends_with(".scales") || name.ends_with(".biases")
}

/// The head found in a list of tensor names: what the report's evidence is built from.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MtpTensorSummary {
    /// The conventions seen (usually one).
    pub styles: BTreeSet<MtpStyle>,
    /// The MTP layer numbers as they appear in the names.
    pub layers: BTreeSet<u64>,
    /// Every MTP tensor name, sorted.
    pub tensors: Vec<String>,
    /// Data types of the MTP tensors, when the header gave them (`BF16`, `U32`, `Q8_0`…).
    pub dtypes: BTreeSet<String>,
    /// Whether the head is MLX affine-quantized (`.scales` / `.biases` present).
    pub mlx_affine_quantized: bool,
}

impl MtpTensorSummary {
    /// Builds the summary from `(name, dtype)` pairs, keeping only MTP tensors.
    pub fn from_names<'a, I>(names: I, base_layers: Option<u64>) -> Self
    where
        I: IntoIterator<Item = (&'a str, Option<&'a str>)>,
    {
        let mut s = MtpTensorSummary::default();
        let mut seen = BTreeMap::new();
        for (name, dtype) in names {
            let Some(t) = classify_tensor(name, base_layers) else {
                continue;
            };
            s.styles.insert(t.style);
            if let Some(l) = t.layer {
                s.layers.insert(l);
            }
            if let Some(d) = dtype {
                s.dtypes.insert(d.to_string());
            }
            if is_mlx_quant_tensor(name) {
                s.mlx_affine_quantized = true;
            }
            seen.insert(name.to_string(), ());
        }
        s.tensors = seen.into_keys().collect();
        s
    }

    /// Builds the summary of a companion drafter's weights (names with or without `mtp.`).
    pub fn from_drafter_names<'a, I>(names: I) -> Self
    where
        I: IntoIterator<Item = (&'a str, Option<&'a str>)>,
    {
        let mut s = MtpTensorSummary::default();
        let mut seen = BTreeSet::new();
        for (name, dtype) in names {
            let Some(key) = drafter_tensor_key(name) else {
                continue;
            };
            s.styles.insert(MtpStyle::Drafter);
            if let Some((n, _)) = key.strip_prefix("layers.").and_then(split_layer) {
                s.layers.insert(n);
            }
            if let Some(d) = dtype {
                s.dtypes.insert(d.to_string());
            }
            if is_mlx_quant_tensor(name) {
                s.mlx_affine_quantized = true;
            }
            seen.insert(name.to_string());
        }
        s.tensors = seen.into_iter().collect();
        s
    }

    /// Whether any MTP tensor was found.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// The number of MTP layers (distinct layer numbers; 1 when the head has tensors but
    /// no numbered layer).
    pub fn layer_count(&self) -> u64 {
        if self.tensors.is_empty() {
            0
        } else {
            (self.layers.len() as u64).max(1)
        }
    }
}
