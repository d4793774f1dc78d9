//! `config.json`: the fields the probe needs, and the MTP *claims* it makes. A claim is
//! reported, and contrasted with the weights, but never taken as evidence.

use serde::Serialize;

use crate::error::DetectError;

/// The largest `config.json` accepted.
pub const MAX_CONFIG_LEN: u64 = 4 * 1024 * 1024;

/// Config keys that claim an MTP head, looked up at the top level and in `text_config`.
pub const CLAIM_KEYS: [&str; 6] = [
    "mtp_num_hidden_layers",
    "num_nextn_predict_layers",
    "nextn_predict_layers",
    "num_mtp_layers",
    "mtp_num_layers",
    "n_mtp_layers",
];

/// What the probe reads from `config.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ConfigInfo {
    /// Top-level `model_type`.
    pub model_type: Option<String>,
    /// `text_config.model_type`.
    pub text_model_type: Option<String>,
    /// `hidden_size` (from `text_config` when present).
    pub hidden_size: Option<u64>,
    /// `vocab_size` (from `text_config` when present, else top level).
    pub vocab_size: Option<u64>,
    /// `num_hidden_layers`: the base depth, after which NextN layers are numbered.
    pub num_hidden_layers: Option<u64>,
    /// The claim key found (`text_config.mtp_num_hidden_layers`, …) and its value.
    pub mtp_claim: Option<(String, u64)>,
    /// A drafter's `block_size` (seed included).
    pub block_size: Option<u64>,
    /// MLX `quantization.bits`, when the config declares MLX quantization.
    pub quant_bits: Option<u64>,
}

impl ConfigInfo {
    /// Whether the config claims a head with at least one layer.
    pub fn claims_mtp(&self) -> bool {
        self.mtp_claim.as_ref().is_some_and(|(_, n)| *n > 0)
    }
}

/// Parses `config.json` bytes.
pub fn parse_config(bytes: &[u8], file: &str) -> Result<ConfigInfo, DetectError> {
    let text = std::str::from_utf8(bytes)
        .map_err(|e| DetectError::json(file, format!("config is not valid UTF-8 ({e})")))?;
    let v: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| DetectError::json(file, format!("config is not valid JSON ({e})")))?;
    if !v.is_object() {
        return Err(DetectError::json(file, "config is not a JSON object"));
    }
    let tc = v.get("text_config").filter(|t| t.is_object());
    let s = |o: &serde_json::Value, k: &str| o.get(k).and_then(|x| x.as_str()).map(String::from);
    let n = |k: &str| {
        tc.and_then(|t| t.get(k))
            .and_then(|x| x.as_u64())
            .or_else(|| v.get(k).and_then(|x| x.as_u64()))
    };
    let mut claim = None;
    'outer: for (scope, obj) in [("text_config.", tc), ("", Some(&v))] {
        let Some(obj) = obj else { continue };
        for k in CLAIM_KEYS {
            if let Some(x) = obj.get(k).and_then(|x| x.as_u64()) {
                claim = Some((format!("{scope}{k}"), x));
                break 'outer;
            }
        }
    }
    Ok(ConfigInfo {
        model_type: s(&v, "model_type"),
        text_model_type: tc.and_then(|t| s(t, "model_type")),
        hidden_size: n("hidden_size"),
        vocab_size: n("vocab_size"),
        num_hidden_layers: n("num_hidden_layers"),
        mtp_claim: claim,
        block_size: v.get("block_size").and_then(|x| x.as_u64()),
        quant_bits: v
            .get("quantization")
            .and_then(|q| q.get("bits"))
            .and_then(|b| b.as_u64()),
    })
}
