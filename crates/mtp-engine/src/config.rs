//! `config.json` of the Qwen3.5 family, read with serde.

use std::path::Path;

use serde::Deserialize;

use crate::error::{Error, Result};

/// Rotary settings (`rope_parameters`); the multimodal sections do not matter for text.
#[derive(Debug, Clone, Deserialize)]
pub struct RopeParameters {
    /// Base frequency.
    #[serde(default = "default_theta")]
    pub rope_theta: f64,
    /// Fraction of each head that is rotated.
    #[serde(default = "default_partial")]
    pub partial_rotary_factor: f64,
}

fn default_theta() -> f64 {
    10_000.0
}
fn default_partial() -> f64 {
    0.25
}
fn default_eps() -> f64 {
    1e-6
}
fn default_interval() -> usize {
    4
}
fn default_one() -> usize {
    1
}

/// The language model's configuration (`text_config`, or the root for text-only checkpoints).
#[derive(Debug, Clone, Deserialize)]
pub struct TextConfig {
    /// `qwen3_5_text`, `qwen3_5_moe_text`, `qwen3_next`, ...
    #[serde(default)]
    pub model_type: String,
    /// Residual width.
    pub hidden_size: usize,
    /// Dense MLP width (absent in MoE configs).
    #[serde(default)]
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads of full-attention layers.
    pub num_attention_heads: usize,
    /// KV heads of full-attention layers.
    pub num_key_value_heads: usize,
    /// Head width of full-attention layers (default `hidden_size / num_attention_heads`).
    #[serde(default)]
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
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// LM head shares the embedding matrix.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Biases on q/k/v/o projections.
    #[serde(default)]
    pub attention_bias: bool,
    /// Every `full_attention_interval`-th layer is full attention.
    #[serde(default = "default_interval")]
    pub full_attention_interval: usize,
    /// Explicit per-layer types (`linear_attention` / `full_attention`).
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    /// Rotary settings (Qwen3.5).
    #[serde(default)]
    pub rope_parameters: Option<RopeParameters>,
    /// Rotary base (Qwen3-Next).
    #[serde(default)]
    pub rope_theta: Option<f64>,
    /// Rotated fraction (Qwen3-Next).
    #[serde(default)]
    pub partial_rotary_factor: Option<f64>,
    /// Routed experts (0 = dense).
    #[serde(default)]
    pub num_experts: usize,
    /// Experts per token.
    #[serde(default)]
    pub num_experts_per_tok: usize,
    /// Width of one routed expert.
    #[serde(default)]
    pub moe_intermediate_size: usize,
    /// Width of the shared expert.
    #[serde(default)]
    pub shared_expert_intermediate_size: usize,
    /// Renormalise the top-k routing weights.
    #[serde(default)]
    pub norm_topk_prob: Option<bool>,
    /// Qwen3-Next: every `decoder_sparse_step`-th layer is MoE.
    #[serde(default = "default_one")]
    pub decoder_sparse_step: usize,
    /// Qwen3-Next: layers forced dense.
    #[serde(default)]
    pub mlp_only_layers: Vec<usize>,
    /// Layers of the MTP head (0 = none declared).
    #[serde(default)]
    pub mtp_num_hidden_layers: usize,
    /// End-of-sequence id(s).
    #[serde(default)]
    pub eos_token_id: Option<serde_json::Value>,
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
    /// The language model's settings.
    pub text: TextConfig,
    /// `quantization` / `quantization_config` (MLX), if any.
    pub quantization: Option<serde_json::Value>,
    /// Root-level end-of-sequence ids merged with the text config's.
    pub eos_token_ids: Vec<u32>,
    /// Drafter configs: `block_size` (seed included), when this is a `qwen3_5_mtp` companion.
    pub block_size: Option<usize>,
}

fn eos_list(v: Option<&serde_json::Value>) -> Vec<u32> {
    match v {
        Some(serde_json::Value::Number(n)) => {
            n.as_u64().map(|x| vec![x as u32]).unwrap_or_default()
        }
        Some(serde_json::Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_u64())
            .map(|x| x as u32)
            .collect(),
        _ => Vec::new(),
    }
}

impl ModelConfig {
    /// Reads `dir/config.json`.
    pub fn load(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|source| Error::Io {
            path: path.clone(),
            source,
        })?;
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| Error::Config {
            path: path.clone(),
            message: e.to_string(),
        })?;
        Self::from_value(&v, &path)
    }

    /// Parses a config.json value (`path` is only used in errors).
    pub fn from_value(v: &serde_json::Value, path: &Path) -> Result<Self> {
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
        let text_value = v.get("text_config").unwrap_or(v);
        let mut text: TextConfig =
            serde_json::from_value(text_value.clone()).map_err(|e| Error::Config {
                path: path.to_path_buf(),
                message: format!("text config: {e}"),
            })?;
        if text.layer_types.is_none() && text.full_attention_interval == 0 {
            return Err(Error::Config {
                path: path.to_path_buf(),
                message: "full_attention_interval must be > 0".into(),
            });
        }
        if text.head_dim.is_none() {
            text.head_dim = Some(text.hidden_size / text.num_attention_heads.max(1));
        }
        if text.linear_num_key_heads == 0
            || !text
                .linear_num_value_heads
                .is_multiple_of(text.linear_num_key_heads)
        {
            return Err(Error::Config {
                path: path.to_path_buf(),
                message: format!(
                    "linear_num_value_heads ({}) must be a multiple of linear_num_key_heads ({})",
                    text.linear_num_value_heads, text.linear_num_key_heads
                ),
            });
        }
        // sizes every layer divides or indexes by: zero (or heads that do not group) would
        // make a product or a head lookup meaningless, so they are refused here, by name
        let head_dim = text.head_dim.unwrap_or(0);
        for (field, value) in [
            ("hidden_size", text.hidden_size),
            ("vocab_size", text.vocab_size),
            ("num_attention_heads", text.num_attention_heads),
            ("num_key_value_heads", text.num_key_value_heads),
            ("head_dim", head_dim),
            ("linear_key_head_dim", text.linear_key_head_dim),
            ("linear_value_head_dim", text.linear_value_head_dim),
            ("linear_conv_kernel_dim", text.linear_conv_kernel_dim),
        ] {
            if value == 0 {
                return Err(Error::Config {
                    path: path.to_path_buf(),
                    message: format!("{field} must be > 0"),
                });
            }
        }
        if !text
            .num_attention_heads
            .is_multiple_of(text.num_key_value_heads)
        {
            return Err(Error::Config {
                path: path.to_path_buf(),
                message: format!(
                    "num_attention_heads ({}) must be a multiple of num_key_value_heads ({})",
                    text.num_attention_heads, text.num_key_value_heads
                ),
            });
        }
        let quantization = v
            .get("quantization")
            .or_else(|| v.get("quantization_config"))
            .filter(|q| q.is_object())
            .cloned();
        let mut eos = eos_list(v.get("eos_token_id"));
        for e in eos_list(text.eos_token_id.as_ref()) {
            if !eos.contains(&e) {
                eos.push(e);
            }
        }
        let block_size = v
            .get("block_size")
            .and_then(|b| b.as_u64())
            .map(|b| b as usize);
        Ok(ModelConfig {
            model_type,
            family,
            text,
            quantization,
            eos_token_ids: eos,
            block_size,
        })
    }

    /// True when layer `i` is full attention.
    pub fn is_full_attention(&self, i: usize) -> bool {
        match &self.text.layer_types {
            Some(t) => t.get(i).is_some_and(|s| s == "full_attention"),
            None => (i + 1).is_multiple_of(self.text.full_attention_interval),
        }
    }

    /// True when layer `i` has a sparse MoE block.
    pub fn is_moe_layer(&self, i: usize) -> bool {
        let t = &self.text;
        t.num_experts > 0
            && !t.mlp_only_layers.contains(&i)
            && (i + 1).is_multiple_of(t.decoder_sparse_step.max(1))
    }

    /// Head width of full attention.
    pub fn head_dim(&self) -> usize {
        self.text
            .head_dim
            .unwrap_or(self.text.hidden_size / self.text.num_attention_heads.max(1))
    }

    /// Rotary base.
    pub fn rope_theta(&self) -> f64 {
        self.text
            .rope_parameters
            .as_ref()
            .map(|r| r.rope_theta)
            .or(self.text.rope_theta)
            .unwrap_or(10_000.0)
    }

    /// Rotated fraction of each head.
    pub fn partial_rotary_factor(&self) -> f64 {
        self.text
            .rope_parameters
            .as_ref()
            .map(|r| r.partial_rotary_factor)
            .or(self.text.partial_rotary_factor)
            .unwrap_or(0.25)
    }

    /// Whether top-k routing weights are renormalised (Qwen3.5-MoE default true, Qwen3-Next
    /// default false).
    pub fn norm_topk_prob(&self) -> bool {
        self.text
            .norm_topk_prob
            .unwrap_or(self.family == Family::Qwen35)
    }

    /// Quantization bits for a module (its checkpoint path without `.weight`), from the global
    /// setting or a per-module override.
    pub fn quant_bits(&self, module: &str, canonical_module: &str) -> Option<usize> {
        let q = self.quantization.as_ref()?;
        let obj = q.as_object()?;
        for (k, v) in obj {
            if k == module
                || (!canonical_module.is_empty()
                    && k.ends_with(canonical_module)
                    && k.len() > canonical_module.len()
                    && k.as_bytes()[k.len() - canonical_module.len() - 1] == b'.')
                || k == canonical_module
            {
                if let Some(b) = v.get("bits").and_then(|b| b.as_u64()) {
                    return Some(b as usize);
                }
            }
        }
        obj.get("bits").and_then(|b| b.as_u64()).map(|b| b as usize)
    }
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
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Self::default()),
            Err(source) => return Err(Error::Io { path, source }),
        };
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| Error::Config {
            path: path.clone(),
            message: e.to_string(),
        })?;
        if !v.is_object() {
            return Err(Error::Config {
                path,
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
        let good: serde_json::Value = serde_json::from_str(&text).unwrap();
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
