//! `config.json` of the Qwen3.5 family, read with serde, and the settings it resolves to.
//!
//! Published checkpoints spell the same setting in several places (a VL wrapper's root and its
//! `text_config`, `rope_parameters` or an older `rope_scaling` or flat `rope_theta` keys, an
//! MLX `quantization` next to an HF `quantization_config`). [`ModelConfig::from_value`]
//! resolves each one once, the way transformers 5.24 (the format's owner) reads it, and refuses
//! with an [`Error::Config`] naming the key any value this engine does not implement, so that a
//! config it cannot run is never run as a different model. `crates/mtp-engine/tests/configs/`
//! holds configs with the key sets of the published ones; `tests/published_configs.rs` runs
//! them.

use std::path::Path;

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// Rotary settings as the full-attention layers use them, resolved from `rope_parameters`,
/// `rope_scaling` (older exports) or the flat `rope_theta` / `partial_rotary_factor` keys
/// (Qwen3-Next), in transformers' order of precedence. The multimodal sections
/// (`mrope_section`) only matter around images: all three position ids of a text token are
/// equal, which makes the interleaved multimodal rope the plain one.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeParameters {
    /// `rope_type` (or its older spelling `type`); `default` (or `mrope`) is all this engine
    /// implements.
    pub rope_type: String,
    /// Base frequency (default 10000, transformers' `default_theta`).
    pub rope_theta: f64,
    /// Fraction of each head that is rotated (default 0.25, as transformers sets it for this
    /// family).
    pub partial_rotary_factor: f64,
    /// Rotary frequencies given to the temporal, height and width position ids of multimodal
    /// rows (`mrope_section`; mlx-vlm's default `[11, 11, 10]`), laid out interleaved as Qwen3.5
    /// does: frequency `i` follows height when `i % 3 == 1 && i < 3 * section[1]`, width when
    /// `i % 3 == 2 && i < 3 * section[2]`, else the temporal id.
    pub mrope_section: [usize; 3],
}

impl Default for RopeParameters {
    fn default() -> Self {
        RopeParameters {
            rope_type: "default".into(),
            rope_theta: DEFAULT_THETA,
            partial_rotary_factor: DEFAULT_PARTIAL,
            mrope_section: DEFAULT_MROPE_SECTION,
        }
    }
}

/// mlx-vlm's `TextConfig.rope_parameters["mrope_section"]` default for Qwen3.5.
const DEFAULT_MROPE_SECTION: [usize; 3] = [11, 11, 10];

/// transformers' `RotaryEmbeddingConfigMixin.default_theta`.
const DEFAULT_THETA: f64 = 10_000.0;
/// transformers' `kwargs.setdefault("partial_rotary_factor", 0.25)` for Qwen3.5 / Qwen3-Next.
const DEFAULT_PARTIAL: f64 = 0.25;
/// transformers' `head_dim` default for Qwen3.5, Qwen3.5-MoE and Qwen3-Next text configs.
const DEFAULT_HEAD_DIM: usize = 256;

/// transformers' `rms_norm_eps` default.
const DEFAULT_EPS: f64 = 1e-6;
/// transformers' `full_attention_interval` default.
const DEFAULT_INTERVAL: usize = 4;

/// The language model's configuration (`text_config`, or the root for text-only checkpoints),
/// as written in the file; [`ModelConfig`] holds what it resolves to.
#[derive(Debug, Clone)]
pub struct TextConfig {
    /// `qwen3_5_text`, `qwen3_5_moe_text`, `qwen3_next`, ...
    pub model_type: String,
    /// Residual width.
    pub hidden_size: usize,
    /// Dense MLP width (absent in MoE configs).
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads of full-attention layers.
    pub num_attention_heads: usize,
    /// KV heads of full-attention layers.
    pub num_key_value_heads: usize,
    /// Head width of full-attention layers (transformers' default, 256, when absent).
    pub head_dim: Option<usize>,
    /// Value heads of linear-attention layers.
    pub linear_num_value_heads: usize,
    /// Key heads of linear-attention layers.
    pub linear_num_key_heads: usize,
    /// Key head width of linear-attention layers.
    pub linear_key_head_dim: usize,
    /// Value head width of linear-attention layers.
    pub linear_value_head_dim: usize,
    /// Causal conv kernel width.
    pub linear_conv_kernel_dim: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// LM head shares the embedding matrix. After [`ModelConfig::from_value`] this is the
    /// resolved value: a VL wrapper's root `tie_word_embeddings` wins over its `text_config`'s,
    /// as in transformers (the LM head belongs to the wrapper's model class).
    pub tie_word_embeddings: bool,
    /// Biases on q/k/v/o projections (not implemented: `true` is refused).
    pub attention_bias: bool,
    /// Sigmoid output gate on full attention (`q_proj` twice as wide). Every Qwen3.5 / Qwen3-Next
    /// has it; `false` is refused.
    pub attn_output_gate: Option<bool>,
    /// Activation of the linear-attention output gate (`swish`/`silu`, what Qwen3.5 computes;
    /// anything else is refused).
    pub output_gate_type: Option<String>,
    /// MLP activation (`silu`; anything else is refused).
    pub hidden_act: Option<String>,
    /// Every `full_attention_interval`-th layer is full attention (when `layer_types` is absent).
    pub full_attention_interval: usize,
    /// Explicit per-layer types (`linear_attention` / `full_attention`), one per layer.
    pub layer_types: Option<Vec<String>>,
    /// Rotary settings as written (Qwen3.5); see [`ModelConfig::rope`] for what they resolve to.
    pub rope_parameters: Option<Value>,
    /// Older spelling of `rope_parameters` (transformers reads it first when it is set).
    pub rope_scaling: Option<Value>,
    /// Flat rotary type (some exports flatten `rope_parameters` into the text config).
    pub rope_type: Option<String>,
    /// Flat rotary base (Qwen3-Next, flattened exports).
    pub rope_theta: Option<f64>,
    /// Flat rotated fraction (Qwen3-Next, flattened exports).
    pub partial_rotary_factor: Option<f64>,
    /// Routed experts (0 = dense).
    pub num_experts: usize,
    /// Experts per token.
    pub num_experts_per_tok: usize,
    /// Width of one routed expert.
    pub moe_intermediate_size: usize,
    /// Width of the shared expert.
    pub shared_expert_intermediate_size: usize,
    /// Renormalise the top-k routing weights.
    pub norm_topk_prob: Option<bool>,
    /// Qwen3-Next: every `decoder_sparse_step`-th layer is MoE (ignored by Qwen3.5-MoE, whose
    /// every layer is, in transformers and mlx-vlm alike).
    pub decoder_sparse_step: usize,
    /// Qwen3-Next: layers forced dense (`null` = none; ignored by Qwen3.5-MoE).
    pub mlp_only_layers: Option<Vec<usize>>,
    /// Layers of the MTP head (0 = none declared; Qwen3-Next ships a head without declaring it).
    pub mtp_num_hidden_layers: usize,
    /// The longest sequence (prompt and reply) the model was trained for, when the config says.
    pub max_position_embeddings: Option<usize>,
    /// The MTP head has embeddings of its own (not implemented: `true` is refused).
    pub mtp_use_dedicated_embeddings: bool,
    /// Precision of the recurrent state in other runtimes (`float32` in every published
    /// config); this engine keeps it in f32 whatever it says.
    pub mamba_ssm_dtype: Option<String>,
    /// End-of-sequence id(s).
    pub eos_token_id: Option<Value>,
}

impl TextConfig {
    /// Reads the text config object `o`; a key of the wrong type is an error naming it, and
    /// `null` counts as absent.
    fn parse(o: &Map<String, Value>, bad: &dyn Fn(String) -> Error) -> Result<Self> {
        Ok(TextConfig {
            model_type: get(o, "model_type", bad)?.unwrap_or_default(),
            hidden_size: need(o, "hidden_size", bad)?,
            intermediate_size: get(o, "intermediate_size", bad)?.unwrap_or(0),
            num_hidden_layers: need(o, "num_hidden_layers", bad)?,
            num_attention_heads: need(o, "num_attention_heads", bad)?,
            num_key_value_heads: need(o, "num_key_value_heads", bad)?,
            head_dim: get(o, "head_dim", bad)?,
            linear_num_value_heads: need(o, "linear_num_value_heads", bad)?,
            linear_num_key_heads: need(o, "linear_num_key_heads", bad)?,
            linear_key_head_dim: need(o, "linear_key_head_dim", bad)?,
            linear_value_head_dim: need(o, "linear_value_head_dim", bad)?,
            linear_conv_kernel_dim: need(o, "linear_conv_kernel_dim", bad)?,
            rms_norm_eps: get(o, "rms_norm_eps", bad)?.unwrap_or(DEFAULT_EPS),
            vocab_size: need(o, "vocab_size", bad)?,
            tie_word_embeddings: get(o, "tie_word_embeddings", bad)?.unwrap_or(false),
            attention_bias: get(o, "attention_bias", bad)?.unwrap_or(false),
            attn_output_gate: get(o, "attn_output_gate", bad)?,
            output_gate_type: get(o, "output_gate_type", bad)?,
            hidden_act: get(o, "hidden_act", bad)?,
            full_attention_interval: get(o, "full_attention_interval", bad)?
                .unwrap_or(DEFAULT_INTERVAL),
            layer_types: get(o, "layer_types", bad)?,
            rope_parameters: get(o, "rope_parameters", bad)?,
            rope_scaling: get(o, "rope_scaling", bad)?,
            rope_type: get(o, "rope_type", bad)?,
            rope_theta: get(o, "rope_theta", bad)?,
            partial_rotary_factor: get(o, "partial_rotary_factor", bad)?,
            num_experts: get(o, "num_experts", bad)?.unwrap_or(0),
            num_experts_per_tok: get(o, "num_experts_per_tok", bad)?.unwrap_or(0),
            moe_intermediate_size: get(o, "moe_intermediate_size", bad)?.unwrap_or(0),
            shared_expert_intermediate_size: get(o, "shared_expert_intermediate_size", bad)?
                .unwrap_or(0),
            norm_topk_prob: get(o, "norm_topk_prob", bad)?,
            decoder_sparse_step: get(o, "decoder_sparse_step", bad)?.unwrap_or(1),
            mlp_only_layers: get(o, "mlp_only_layers", bad)?,
            mtp_num_hidden_layers: get(o, "mtp_num_hidden_layers", bad)?.unwrap_or(0),
            max_position_embeddings: get(o, "max_position_embeddings", bad)?,
            mtp_use_dedicated_embeddings: get(o, "mtp_use_dedicated_embeddings", bad)?
                .unwrap_or(false),
            mamba_ssm_dtype: get(o, "mamba_ssm_dtype", bad)?,
            eos_token_id: get(o, "eos_token_id", bad)?,
        })
    }
}

/// The value at `key` as a `T`; absent or `null` is `None`, another type an error naming the key.
fn get<T: DeserializeOwned>(
    o: &Map<String, Value>,
    key: &str,
    bad: &dyn Fn(String) -> Error,
) -> Result<Option<T>> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => T::deserialize(v)
            .map(Some)
            .map_err(|e| bad(format!("{key}: {e} (found {v})"))),
    }
}

/// [`get`] for a key the config must have.
fn need<T: DeserializeOwned>(
    o: &Map<String, Value>,
    key: &str,
    bad: &dyn Fn(String) -> Error,
) -> Result<T> {
    get(o, key, bad)?.ok_or_else(|| bad(format!("{key} is missing from the text config")))
}

/// The architecture family, from `model_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// `qwen3_5`, `qwen3_5_text`, `qwen3_5_moe`, `qwen3_5_moe_text`.
    Qwen35,
    /// `qwen3_next`.
    Qwen3Next,
}

/// A parsed checkpoint configuration.
#[derive(Debug, Clone)]
pub struct ModelConfig {
    /// Root `model_type`.
    pub model_type: String,
    /// Architecture family.
    pub family: Family,
    /// The language model's settings (with `head_dim` and `tie_word_embeddings` resolved).
    pub text: TextConfig,
    /// Resolved rotary settings.
    pub rope: RopeParameters,
    /// `quantization` / `quantization_config` (MLX affine), if any.
    pub quantization: Option<Value>,
    /// Root-level end-of-sequence ids merged with the text config's.
    pub eos_token_ids: Vec<u32>,
    /// Declared storage precision (`dtype`, or the older `torch_dtype`; the text config's
    /// first). Informational: weights are read as the safetensors store them.
    pub declared_dtype: Option<String>,
    /// Drafter configs: `block_size` (seed included), when this is a `qwen3_5_mtp` companion.
    pub block_size: Option<usize>,
    /// The vision tower's settings, when the config declares one (`vision_config`): `Err`
    /// says why it cannot be run (the language model still loads; images are then refused
    /// with that message).
    pub vision: Option<std::result::Result<VisionConfig, String>>,
}

/// The vision tower's configuration (`vision_config`, mlx-vlm 0.7.10's `qwen3_vl` /
/// `qwen3_5` `VisionConfig` with its defaults) and the ids of the tokens that stand for images
/// in the prompt (the root config's; mlx-vlm's Qwen3.5 defaults when absent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VisionConfig {
    /// ViT blocks.
    pub depth: usize,
    /// ViT width.
    pub hidden_size: usize,
    /// ViT MLP width.
    pub intermediate_size: usize,
    /// Width of the merged features: the language model's hidden size.
    pub out_hidden_size: usize,
    /// Attention heads of a ViT block.
    pub num_heads: usize,
    /// Side of a square patch, in pixels.
    pub patch_size: usize,
    /// Frames per patch (a still image is repeated to fill them).
    pub temporal_patch_size: usize,
    /// Side of the square of patches merged into one language-model token.
    pub spatial_merge_size: usize,
    /// Colour channels (3).
    pub in_channels: usize,
    /// Learned position embeddings (a square grid, interpolated to each image's grid).
    pub num_position_embeddings: usize,
    /// `<|image_pad|>`: one per image token in the expanded prompt.
    pub image_token_id: u32,
    /// `<|video_pad|>`.
    pub video_token_id: u32,
    /// `<|vision_start|>`.
    pub vision_start_token_id: u32,
    /// `<|vision_end|>`.
    pub vision_end_token_id: u32,
}

impl VisionConfig {
    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_heads.max(1)
    }

    /// Side of the learned position-embedding grid.
    pub fn grid_per_side(&self) -> usize {
        (self.num_position_embeddings as f64).sqrt() as usize
    }

    /// Reads `vision_config` and the root's token ids; a value the tower cannot run with is an
    /// error message naming the key.
    fn parse(root: &Value, text_hidden: usize) -> std::result::Result<Self, String> {
        let Some(o) = root.get("vision_config").and_then(Value::as_object) else {
            return Err("vision_config is not a JSON object".into());
        };
        let bad = |m: String| Error::Config {
            path: "config.json".into(),
            message: m,
        };
        let msg = |e: Error| match e {
            Error::Config { message, .. } => format!("vision_config.{message}"),
            other => other.to_string(),
        };
        let size = |key: &str, default: usize| -> std::result::Result<usize, String> {
            get::<usize>(o, key, &bad)
                .map_err(msg)
                .map(|v| v.unwrap_or(default))
        };
        let root_obj = root.as_object().cloned().unwrap_or_default();
        let id = |key: &str, default: u32| -> std::result::Result<u32, String> {
            get::<u32>(&root_obj, key, &bad)
                .map_err(|e| e.to_string())
                .map(|v| v.unwrap_or(default))
        };
        let c = VisionConfig {
            depth: size("depth", 32)?,
            hidden_size: size("hidden_size", 1280)?,
            intermediate_size: size("intermediate_size", 3420)?,
            out_hidden_size: size("out_hidden_size", 1536)?,
            num_heads: size("num_heads", 16)?,
            patch_size: size("patch_size", 14)?,
            temporal_patch_size: size("temporal_patch_size", 2)?,
            spatial_merge_size: size("spatial_merge_size", 2)?,
            in_channels: size("in_channels", 3)?,
            num_position_embeddings: size("num_position_embeddings", 2304)?,
            image_token_id: id("image_token_id", 248_056)?,
            video_token_id: id("video_token_id", 248_057)?,
            vision_start_token_id: id("vision_start_token_id", 248_045)?,
            vision_end_token_id: id("vision_end_token_id", 248_046)?,
        };
        let deepstack: Vec<usize> = get(o, "deepstack_visual_indexes", &bad)
            .map_err(msg)?
            .unwrap_or_default();
        if !deepstack.is_empty() {
            // mlx-vlm 0.7.10 refuses them for Qwen3.5 too (`qwen3_5/config.py`)
            return Err(format!(
                "vision_config.deepstack_visual_indexes = {deepstack:?}: deepstack features are                  not part of Qwen3.5's vision tower"
            ));
        }
        let act: Option<String> = get(o, "hidden_act", &bad).map_err(msg)?;
        if let Some(a) = act.filter(|a| a != "gelu_pytorch_tanh") {
            return Err(format!(
                "vision_config.hidden_act = `{a}`: the vision tower runs gelu_pytorch_tanh, as                  mlx-vlm's does"
            ));
        }
        for (key, v) in [
            ("depth", c.depth),
            ("hidden_size", c.hidden_size),
            ("intermediate_size", c.intermediate_size),
            ("num_heads", c.num_heads),
            ("patch_size", c.patch_size),
            ("temporal_patch_size", c.temporal_patch_size),
            ("spatial_merge_size", c.spatial_merge_size),
            ("num_position_embeddings", c.num_position_embeddings),
        ] {
            if v == 0 {
                return Err(format!("vision_config.{key} must be > 0"));
            }
        }
        if c.in_channels != 3 {
            return Err(format!(
                "vision_config.in_channels = {}: images are read as RGB (3 channels)",
                c.in_channels
            ));
        }
        if !c.hidden_size.is_multiple_of(c.num_heads) || !c.head_dim().is_multiple_of(4) {
            return Err(format!(
                "vision_config: hidden_size {} over num_heads {} must give heads of a multiple                  of 4 features (the 2D rotary embedding splits each head in four)",
                c.hidden_size, c.num_heads
            ));
        }
        let side = c.grid_per_side();
        if side * side != c.num_position_embeddings {
            return Err(format!(
                "vision_config.num_position_embeddings = {} is not a square grid",
                c.num_position_embeddings
            ));
        }
        if c.out_hidden_size != text_hidden {
            return Err(format!(
                "vision_config.out_hidden_size = {} differs from the language model's                  hidden_size {text_hidden}",
                c.out_hidden_size
            ));
        }
        // the sizes multiply into buffer lengths: keep them far from overflow
        let big = [c.depth, c.hidden_size, c.intermediate_size, c.patch_size]
            .iter()
            .any(|&v| v > 1 << 20);
        if big {
            return Err("vision_config: a size is implausibly large (over 2^20)".into());
        }
        Ok(c)
    }
}

/// Token ids of an `eos_token_id` value (a number or a list); other values and ids that do not
/// fit a `u32` are ignored, as transformers ignores them.
fn eos_list(v: Option<&Value>) -> Vec<u32> {
    let id = |x: &Value| x.as_u64().and_then(|x| u32::try_from(x).ok());
    match v {
        Some(Value::Number(_)) => v.and_then(id).into_iter().collect(),
        Some(Value::Array(a)) => a.iter().filter_map(id).collect(),
        _ => Vec::new(),
    }
}

/// Prefixes under which a checkpoint stores the language model (see `qwen3_5::route`).
const TARGET_PREFIXES: [&str; 4] = [
    "model.language_model.",
    "language_model.model.",
    "language_model.",
    "model.",
];

/// A quantization key or module path without its namespace: `(in the MTP namespace, rest)`.
fn module_key(key: &str) -> (bool, &str) {
    if let Some(rest) = mtp_detect::mtp_namespace_key(key) {
        return (true, rest);
    }
    let rest = TARGET_PREFIXES
        .iter()
        .find_map(|p| key.strip_prefix(p))
        .unwrap_or(key);
    (false, rest)
}

impl ModelConfig {
    /// Reads `dir/config.json` (through [`ModelConfig::from_json`]).
    pub fn load(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        let bytes = std::fs::read(&path).map_err(|source| Error::Io {
            path: path.clone(),
            source,
        })?;
        Self::from_json(&bytes, &path)
    }

    /// Parses the bytes of a `config.json` (`path` is only used in errors): malformed JSON is
    /// an [`Error::Config`] naming the file, the value then goes through
    /// [`ModelConfig::from_value`].
    ///
    /// ```
    /// use mtp_engine::{Error, ModelConfig};
    /// let err = ModelConfig::from_json(b"{\"model_type\": ", "config.json".as_ref());
    /// assert!(matches!(err, Err(Error::Config { .. })));
    /// ```
    pub fn from_json(bytes: &[u8], path: &Path) -> Result<Self> {
        let v: Value = serde_json::from_slice(bytes).map_err(|e| Error::Config {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        Self::from_value(&v, path)
    }

    /// Parses a config.json value (`path` is only used in errors).
    ///
    /// ```
    /// use mtp_engine::ModelConfig;
    /// let v = serde_json::json!({
    ///     "model_type": "qwen3_next", "hidden_size": 64, "num_hidden_layers": 4,
    ///     "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    ///     "linear_num_value_heads": 4, "linear_num_key_heads": 2, "linear_key_head_dim": 16,
    ///     "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4, "vocab_size": 256,
    ///     "intermediate_size": 128, "rope_scaling": null, "rope_theta": 10000000,
    ///     "partial_rotary_factor": 0.25,
    /// });
    /// let cfg = ModelConfig::from_value(&v, "config.json".as_ref())?;
    /// assert_eq!(cfg.rope_theta(), 1e7);
    /// assert!(cfg.is_full_attention(3) && !cfg.is_full_attention(2));
    /// # Ok::<(), mtp_engine::Error>(())
    /// ```
    pub fn from_value(v: &Value, path: &Path) -> Result<Self> {
        let bad = |message: String| Error::Config {
            path: path.to_path_buf(),
            message,
        };
        let model_type = v
            .get("model_type")
            .and_then(|m| m.as_str())
            .unwrap_or_default()
            .to_string();
        let family = match model_type.as_str() {
            "qwen3_5" | "qwen3_5_text" | "qwen3_5_moe" | "qwen3_5_moe_text" | "qwen3_5_mtp" => {
                Family::Qwen35
            }
            "qwen3_next" => Family::Qwen3Next,
            _ => return Err(Error::UnknownModelType { model_type }),
        };
        let wrapper = v.get("text_config").filter(|t| !t.is_null());
        let text_value = wrapper.unwrap_or(v);
        let Some(text_object) = text_value.as_object() else {
            return Err(bad("text_config is not a JSON object".into()));
        };
        let mut text = TextConfig::parse(text_object, &bad)?;

        // The LM head belongs to the wrapper's model class in transformers
        // (`Qwen3_5ForConditionalGeneration._tied_weights_keys`, read against the root config), so
        // a wrapper's root `tie_word_embeddings` wins; its text config's is the fallback.
        if wrapper.is_some() {
            match v.get("tie_word_embeddings") {
                None | Some(Value::Null) => {}
                Some(Value::Bool(b)) => text.tie_word_embeddings = *b,
                Some(other) => {
                    return Err(bad(format!(
                        "tie_word_embeddings must be true or false, found {other}"
                    )))
                }
            }
        }
        if text.head_dim.is_none() {
            text.head_dim = Some(DEFAULT_HEAD_DIM);
        }
        if text.mlp_only_layers.is_none() {
            text.mlp_only_layers = Some(Vec::new());
        }

        check_unimplemented(&text, family, &model_type, &bad)?;
        check_sizes(&text, &bad)?;
        check_layer_types(&text, &bad)?;
        let rope = resolve_rope(&text, &bad)?;
        let quantization = resolve_quantization(v, &bad)?;

        let mut eos = eos_list(v.get("eos_token_id"));
        for e in eos_list(text.eos_token_id.as_ref()) {
            if !eos.contains(&e) {
                eos.push(e);
            }
        }
        let dtype_of = |o: &Value| {
            o.get("dtype")
                .or_else(|| o.get("torch_dtype"))
                .and_then(|d| d.as_str())
                .map(str::to_string)
        };
        let declared_dtype = dtype_of(text_value).or_else(|| dtype_of(v));
        let block_size = v
            .get("block_size")
            .and_then(|b| b.as_u64())
            .map(|b| b as usize);
        let vision = v
            .get("vision_config")
            .filter(|c| !c.is_null())
            .map(|_| VisionConfig::parse(v, text.hidden_size));
        Ok(ModelConfig {
            model_type,
            family,
            text,
            rope,
            quantization,
            eos_token_ids: eos,
            declared_dtype,
            block_size,
            vision,
        })
    }

    /// True when layer `i` is full attention.
    pub fn is_full_attention(&self, i: usize) -> bool {
        match &self.text.layer_types {
            Some(t) => t.get(i).is_some_and(|s| s == "full_attention"),
            None => (i + 1).is_multiple_of(self.text.full_attention_interval),
        }
    }

    /// True when layer `i` has a sparse MoE block: every layer of a Qwen3.5-MoE (transformers'
    /// and mlx-vlm's `Qwen3_5MoeDecoderLayer` read neither `mlp_only_layers` nor
    /// `decoder_sparse_step`), every `decoder_sparse_step`-th layer not in `mlp_only_layers` of a
    /// Qwen3-Next.
    pub fn is_moe_layer(&self, i: usize) -> bool {
        let t = &self.text;
        if t.num_experts == 0 {
            return false;
        }
        match self.family {
            Family::Qwen35 => true,
            Family::Qwen3Next => {
                !t.mlp_only_layers.as_ref().is_some_and(|l| l.contains(&i))
                    && (i + 1).is_multiple_of(t.decoder_sparse_step.max(1))
            }
        }
    }

    /// Head width of full attention.
    pub fn head_dim(&self) -> usize {
        self.text.head_dim.unwrap_or(DEFAULT_HEAD_DIM)
    }

    /// Rotary base.
    pub fn rope_theta(&self) -> f64 {
        self.rope.rope_theta
    }

    /// Rotated fraction of each head.
    pub fn partial_rotary_factor(&self) -> f64 {
        self.rope.partial_rotary_factor
    }

    /// Rotated features of each full-attention head (`int(head_dim * partial_rotary_factor)`,
    /// as transformers and mlx-vlm compute it).
    pub fn rotary_dim(&self) -> usize {
        (self.head_dim() as f64 * self.partial_rotary_factor()) as usize
    }

    /// Whether top-k routing weights are renormalised: `norm_topk_prob`, default true
    /// (transformers' Qwen3-Next default; Qwen3.5-MoE always renormalises there).
    pub fn norm_topk_prob(&self) -> bool {
        self.text.norm_topk_prob.unwrap_or(true)
    }

    /// Quantization bits for a module (`module`: its checkpoint path without `.weight`;
    /// `canonical_module`: the same without the checkpoint's prefix or the `mtp.` namespace),
    /// from a per-module override or the global setting. An override applies when its key is
    /// the module's path, or names the same module under another of the prefixes checkpoints
    /// use (`model.language_model.`, `language_model.model.`, `model.`, ...) in the same
    /// namespace: a target layer's setting never applies to the MTP head's layer of the same
    /// number, nor the other way round. Entries set to `false` (modules left unquantized) give
    /// no width.
    pub fn quant_bits(&self, module: &str, canonical_module: &str) -> Option<usize> {
        let obj = self.quantization.as_ref()?.as_object()?;
        let bits = |v: &Value| v.get("bits").and_then(|b| b.as_u64()).map(|b| b as usize);
        if let Some(b) = obj.get(module).and_then(bits) {
            return Some(b);
        }
        // a companion drafter's modules are all head modules, whatever prefix they carry
        let drafter = self.model_type == "qwen3_5_mtp";
        let (module_mtp, _) = module_key(module);
        for (k, v) in obj {
            let (key_mtp, rest) = module_key(k);
            if v.is_object() && rest == canonical_module && (drafter || key_mtp == module_mtp) {
                if let Some(b) = bits(v) {
                    return Some(b);
                }
            }
        }
        obj.get("bits").and_then(|b| b.as_u64()).map(|b| b as usize)
    }
}

/// Sizes every layer divides or indexes by: zero (or heads that do not group) would make a
/// product or a head lookup meaningless, so they are refused here, by name.
fn check_sizes(t: &TextConfig, bad: &dyn Fn(String) -> Error) -> Result<()> {
    for (field, value) in [
        ("hidden_size", t.hidden_size),
        ("vocab_size", t.vocab_size),
        ("num_attention_heads", t.num_attention_heads),
        ("num_key_value_heads", t.num_key_value_heads),
        ("head_dim", t.head_dim.unwrap_or(0)),
        ("linear_key_head_dim", t.linear_key_head_dim),
        ("linear_value_head_dim", t.linear_value_head_dim),
        ("linear_conv_kernel_dim", t.linear_conv_kernel_dim),
    ] {
        if value == 0 {
            return Err(bad(format!("{field} must be > 0")));
        }
    }
    if t.linear_num_key_heads == 0
        || !t
            .linear_num_value_heads
            .is_multiple_of(t.linear_num_key_heads)
    {
        return Err(bad(format!(
            "linear_num_value_heads ({}) must be a multiple of linear_num_key_heads ({})",
            t.linear_num_value_heads, t.linear_num_key_heads
        )));
    }
    if !t.num_attention_heads.is_multiple_of(t.num_key_value_heads) {
        return Err(bad(format!(
            "num_attention_heads ({}) must be a multiple of num_key_value_heads ({})",
            t.num_attention_heads, t.num_key_value_heads
        )));
    }
    if t.num_experts > 0 {
        if t.num_experts_per_tok == 0 || t.num_experts_per_tok > t.num_experts {
            return Err(bad(format!(
                "num_experts_per_tok ({}) must be between 1 and num_experts ({})",
                t.num_experts_per_tok, t.num_experts
            )));
        }
        if t.moe_intermediate_size == 0 {
            return Err(bad("moe_intermediate_size must be > 0".into()));
        }
    }
    Ok(())
}

/// `layer_types`, when present, names every layer with a type this engine builds;
/// `full_attention_interval` is used otherwise.
fn check_layer_types(t: &TextConfig, bad: &dyn Fn(String) -> Error) -> Result<()> {
    match &t.layer_types {
        Some(types) => {
            if types.len() != t.num_hidden_layers {
                return Err(bad(format!(
                    "layer_types has {} entries for num_hidden_layers = {}",
                    types.len(),
                    t.num_hidden_layers
                )));
            }
            if let Some((i, other)) = types
                .iter()
                .enumerate()
                .find(|(_, s)| *s != "linear_attention" && *s != "full_attention")
            {
                return Err(bad(format!(
                    "layer_types[{i}] = `{other}`: this engine builds `linear_attention` and \
                     `full_attention` layers only"
                )));
            }
        }
        None if t.full_attention_interval == 0 => {
            return Err(bad("full_attention_interval must be > 0".into()));
        }
        None => {}
    }
    Ok(())
}

/// Values that would make a different model than the one this engine builds.
fn check_unimplemented(
    t: &TextConfig,
    family: Family,
    model_type: &str,
    bad: &dyn Fn(String) -> Error,
) -> Result<()> {
    if t.attn_output_gate == Some(false) {
        return Err(bad(
            "attn_output_gate = false: this engine implements the gated attention of Qwen3.5 / \
             Qwen3-Next only (q_proj carrying the output gate)"
                .into(),
        ));
    }
    if let Some(g) = t.output_gate_type.as_deref() {
        if g != "swish" && g != "silu" {
            return Err(bad(format!(
                "output_gate_type = `{g}`: the linear-attention output gate is implemented as \
                 swish (silu) only"
            )));
        }
    }
    if let Some(a) = t.hidden_act.as_deref() {
        if a != "silu" && a != "swish" {
            return Err(bad(format!(
                "hidden_act = `{a}`: the MLPs are implemented with silu only"
            )));
        }
    }
    if t.attention_bias {
        return Err(bad(
            "attention_bias = true: attention projections with biases are not implemented".into(),
        ));
    }
    if t.mtp_use_dedicated_embeddings {
        return Err(bad(
            "mtp_use_dedicated_embeddings = true: this engine's MTP head uses the target's \
             embedding"
                .into(),
        ));
    }
    match model_type {
        "qwen3_5" | "qwen3_5_text" if t.num_experts > 0 => {
            return Err(bad(format!(
                "num_experts = {} in a dense `{model_type}` config (transformers builds it \
                 dense): a MoE checkpoint has model_type qwen3_5_moe",
                t.num_experts
            )));
        }
        "qwen3_5_moe" | "qwen3_5_moe_text" if t.num_experts == 0 => {
            return Err(bad(format!(
                "num_experts is missing or 0 in a `{model_type}` config"
            )));
        }
        _ => {}
    }
    if family == Family::Qwen35 && t.num_experts > 0 && t.norm_topk_prob == Some(false) {
        return Err(bad(
            "norm_topk_prob = false in a Qwen3.5-MoE config: transformers always renormalises \
             its routing weights and mlx-vlm does not here, so the model is ambiguous"
                .into(),
        ));
    }
    if family == Family::Qwen3Next && t.num_experts > 0 && t.decoder_sparse_step == 0 {
        return Err(bad("decoder_sparse_step must be > 0".into()));
    }
    Ok(())
}

/// A number at `key` of `o`; `null` or absent is `None`, another type an error naming `name`.
fn number(o: &Value, key: &str, name: &str, bad: &dyn Fn(String) -> Error) -> Result<Option<f64>> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x
            .as_f64()
            .map(Some)
            .ok_or_else(|| bad(format!("{name}.{key} must be a number, found {x}"))),
    }
}

/// transformers' `convert_rope_params_to_dict` + `standardize_rope_params`: `rope_scaling` when
/// set, else `rope_parameters` (per layer type when nested: the full-attention entry), with
/// the flat `rope_theta` / `partial_rotary_factor` filling what it lacks.
fn resolve_rope(t: &TextConfig, bad: &dyn Fn(String) -> Error) -> Result<RopeParameters> {
    let set = |x: &Option<Value>| {
        x.as_ref()
            .filter(|v| v.as_object().is_some_and(|o| !o.is_empty()))
            .cloned()
    };
    let (mut name, mut params) = match (set(&t.rope_scaling), set(&t.rope_parameters)) {
        (Some(s), _) => ("rope_scaling".to_string(), Some(s)),
        (None, Some(p)) => ("rope_parameters".to_string(), Some(p)),
        (None, None) => {
            for (key, value) in [
                ("rope_scaling", &t.rope_scaling),
                ("rope_parameters", &t.rope_parameters),
            ] {
                if let Some(v) = value.as_ref().filter(|v| !v.is_null() && !v.is_object()) {
                    return Err(bad(format!("{key} must be an object or null, found {v}")));
                }
            }
            (String::new(), None)
        }
    };
    // nested per layer type (`{"full_attention": {...}, ...}`): only full attention rotates
    if let Some(inner) = params
        .as_ref()
        .and_then(|p| p.get("full_attention"))
        .filter(|f| f.is_object())
        .cloned()
    {
        name = format!("{name}.full_attention");
        params = Some(inner);
    }
    let p = params.unwrap_or(Value::Null);
    // `rope_type`, or its older spelling `type`; the flat text-config key when neither is set
    let spelled = ["rope_type", "type"]
        .into_iter()
        .find(|k| p.get(k).is_some_and(|x| !x.is_null()));
    let (key, rope_type) = match spelled {
        Some(k) => match &p[k] {
            Value::String(s) => (format!("{name}.{k}"), s.clone()),
            other => return Err(bad(format!("{name}.{k} must be a string, found {other}"))),
        },
        None => (
            "rope_type".to_string(),
            t.rope_type.clone().unwrap_or_else(|| "default".into()),
        ),
    };
    if rope_type != "default" && rope_type != "mrope" {
        return Err(bad(format!(
            "{key} = `{rope_type}`: only the default rotary embedding is implemented (no \
             scaled or extended-context variants)"
        )));
    }
    let rope_theta = number(&p, "rope_theta", &name, bad)?
        .or(t.rope_theta)
        .unwrap_or(DEFAULT_THETA);
    let partial_rotary_factor = number(&p, "partial_rotary_factor", &name, bad)?
        .or(t.partial_rotary_factor)
        .unwrap_or(DEFAULT_PARTIAL);
    if !(rope_theta.is_finite() && rope_theta > 0.0) {
        return Err(bad(format!("rope_theta must be > 0, found {rope_theta}")));
    }
    if !(partial_rotary_factor > 0.0 && partial_rotary_factor <= 1.0) {
        return Err(bad(format!(
            "partial_rotary_factor must be in (0, 1], found {partial_rotary_factor}"
        )));
    }
    let head_dim = t.head_dim.unwrap_or(DEFAULT_HEAD_DIM);
    let rot = (head_dim as f64 * partial_rotary_factor) as usize;
    if rot == 0 || !rot.is_multiple_of(2) {
        return Err(bad(format!(
            "partial_rotary_factor = {partial_rotary_factor} rotates {rot} of head_dim = \
             {head_dim} features: the rotated width must be even and > 0"
        )));
    }
    let mrope_section = match p.get("mrope_section") {
        None | Some(Value::Null) => DEFAULT_MROPE_SECTION,
        Some(v) => serde_json::from_value::<[usize; 3]>(v.clone()).map_err(|_| {
            bad(format!(
                "{name}.mrope_section must be three non-negative integers, found {v}"
            ))
        })?,
    };
    Ok(RopeParameters {
        rope_type,
        rope_theta,
        partial_rotary_factor,
        mrope_section,
    })
}

/// The MLX affine `quantization` object (or its copy `quantization_config`), checked to be one
/// this engine decodes. An HF `quantization_config` (one with a `quant_method`: fp8, gptq, awq,
/// compressed-tensors, ...) and MLX's non-affine modes are refused by name.
fn resolve_quantization(v: &Value, bad: &dyn Fn(String) -> Error) -> Result<Option<Value>> {
    for key in ["quantization", "quantization_config"] {
        match v.get(key) {
            None | Some(Value::Null) => {}
            Some(Value::Object(q)) => {
                if let Some(m) = q.get("quant_method") {
                    return Err(bad(format!(
                        "{key}.quant_method = {m}: only MLX affine quantization (a `quantization` \
                         with `bits` and `group_size`) is implemented"
                    )));
                }
            }
            Some(other) => return Err(bad(format!("{key} must be an object, found {other}"))),
        }
    }
    let q = v
        .get("quantization")
        .filter(|q| q.is_object())
        .or_else(|| v.get("quantization_config").filter(|q| q.is_object()));
    let Some(obj) = q.and_then(|q| q.as_object()) else {
        return Ok(None);
    };
    let key = if v.get("quantization").is_some_and(|q| q.is_object()) {
        "quantization"
    } else {
        "quantization_config"
    };
    let check_mode = |o: &serde_json::Map<String, Value>, at: &str| match o.get("mode") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(m)) if m == "affine" => Ok(()),
        Some(m) => Err(bad(format!(
            "{at}.mode = {m}: only MLX `affine` quantization is implemented"
        ))),
    };
    check_mode(obj, key)?;
    // per-module overrides are objects; `false` leaves a module unquantized (AutoRound's MLX
    // export), and such a module has no `scales` to be decoded with
    for (k, o) in obj {
        if let Value::Object(inner) = o {
            check_mode(inner, &format!("{key}.{k}"))?;
        }
    }
    Ok(q.cloned())
}

/// `generation_config.json`: the end-of-sequence ids and the sampling settings the model's
/// authors recommend, which transformers and mlx-vlm use when a caller sets none.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerationConfig {
    /// `eos_token_id` (a number or a list).
    pub eos_token_ids: Vec<u32>,
    /// `do_sample`: `false` means greedy whatever the other settings say.
    pub do_sample: Option<bool>,
    /// `temperature`.
    pub temperature: Option<f32>,
    /// `top_p`.
    pub top_p: Option<f32>,
    /// `top_k`.
    pub top_k: Option<u32>,
    /// `min_p`.
    pub min_p: Option<f32>,
    /// `repetition_penalty`.
    pub repetition_penalty: Option<f32>,
}

impl GenerationConfig {
    /// Reads `dir/generation_config.json`; a checkpoint without one has the empty default. A
    /// file that is not a JSON object is an error naming it; fields of the wrong type are
    /// ignored (as transformers ignores them).
    pub fn load(dir: &Path) -> Result<Self> {
        let path = dir.join("generation_config.json");
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Self::default()),
            Err(source) => return Err(Error::Io { path, source }),
        };
        Self::from_json(&bytes, &path)
    }

    /// Parses the bytes of a `generation_config.json` (`path` is only used in errors), as
    /// [`GenerationConfig::load`] reads the file.
    ///
    /// ```
    /// use mtp_engine::GenerationConfig;
    /// let g = GenerationConfig::from_json(br#"{"eos_token_id": [1, 2], "top_k": "x"}"#,
    ///     "generation_config.json".as_ref())?;
    /// assert_eq!((g.eos_token_ids, g.top_k), (vec![1, 2], None));
    /// # Ok::<(), mtp_engine::Error>(())
    /// ```
    pub fn from_json(bytes: &[u8], path: &Path) -> Result<Self> {
        let v: Value = serde_json::from_slice(bytes).map_err(|e| Error::Config {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        if !v.is_object() {
            return Err(Error::Config {
                path: path.to_path_buf(),
                message: "not a JSON object".into(),
            });
        }
        let f32_of = |k: &str| v.get(k).and_then(|x| x.as_f64()).map(|x| x as f32);
        Ok(GenerationConfig {
            eos_token_ids: eos_list(v.get("eos_token_id")),
            do_sample: v.get("do_sample").and_then(|x| x.as_bool()),
            temperature: f32_of("temperature"),
            top_p: f32_of("top_p"),
            top_k: v
                .get("top_k")
                .and_then(|x| x.as_u64())
                .and_then(|x| u32::try_from(x).ok()),
            min_p: f32_of("min_p"),
            repetition_penalty: f32_of("repetition_penalty"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A zero size or heads that do not group are refused with an error naming the field,
    /// before any layer divides by them.
    #[test]
    fn degenerate_sizes_are_config_errors() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny-hf");
        let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
        let good: Value = serde_json::from_str(&text).unwrap();
        ModelConfig::from_value(&good, &dir).expect("the fixture loads");
        for (field, value, says) in [
            ("hidden_size", 0, "hidden_size must be > 0"),
            ("vocab_size", 0, "vocab_size must be > 0"),
            ("num_key_value_heads", 0, "num_key_value_heads must be > 0"),
            ("head_dim", 0, "head_dim must be > 0"),
            (
                "linear_conv_kernel_dim",
                0,
                "linear_conv_kernel_dim must be > 0",
            ),
            (
                "num_key_value_heads",
                3,
                "must be a multiple of num_key_value_heads",
            ),
        ] {
            let mut bad = good.clone();
            if bad.get("text_config").is_some() {
                bad["text_config"][field] = value.into();
            } else {
                bad[field] = value.into();
            }
            let err = ModelConfig::from_value(&bad, &dir)
                .expect_err(field)
                .to_string();
            assert!(err.contains(says), "{field} = {value}: {err}");
        }
    }
}
