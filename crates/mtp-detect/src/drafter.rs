//! Companion drafters: is this drafter valid for this target?
//!
//! A drafter is valid only if its `model_type` is an MTP drafter type, its
//! `text_config.hidden_size` (and vocabulary, when both say) equal the target's, and its
//! weights carry the MTP tensors. Anything else is a [`Mismatch`] naming the field.

use std::fmt;
use std::path::Path;

use mtp_contract::Reason;
use serde::Serialize;

use crate::config::{parse_config, ConfigInfo, MAX_CONFIG_LEN};
use crate::error::DetectError;
use crate::registry::Registry;
use crate::source::{LocalReader, Reader};
use crate::tensors::{MtpTensorSummary, QWEN_DRAFTER_REQUIRED};
use crate::weights::read_weight_names;

/// What a valid drafter looks like.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DrafterInfo {
    /// Its `model_type` (`qwen3_5_mtp`, …).
    pub model_type: String,
    /// Its `text_config.hidden_size` (equal to the target's).
    pub hidden_size: u64,
    /// Its vocabulary size, when the config gives it.
    pub vocab_size: Option<u64>,
    /// MTP layers in its weights.
    pub mtp_layers: u64,
    /// Its `block_size` (seed included), when declared.
    pub block_size: Option<u64>,
    /// The depth its config implies (`block_size - 1` proposals), when declared.
    pub config_depth: Option<u32>,
    /// Number of head tensors.
    pub tensor_count: usize,
    /// Data types of the head tensors.
    pub dtypes: Vec<String>,
    /// Whether the head is MLX affine-quantized.
    pub mlx_affine_quantized: bool,
}

/// The field on which a drafter and its target disagree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MismatchField {
    /// The drafter's `config.json` is missing or unreadable.
    Config,
    /// `model_type` is not a drafter type.
    ModelType,
    /// `text_config.hidden_size` differs (or is missing).
    HiddenSize,
    /// `vocab_size` differs.
    VocabSize,
    /// The weights lack the MTP tensors.
    Tensors,
}

impl MismatchField {
    /// The field's name as written in a config, or `weights`.
    pub fn as_str(self) -> &'static str {
        match self {
            MismatchField::Config => "config.json",
            MismatchField::ModelType => "model_type",
            MismatchField::HiddenSize => "text_config.hidden_size",
            MismatchField::VocabSize => "vocab_size",
            MismatchField::Tensors => "weights",
        }
    }
}

/// A drafter that does not fit its target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Mismatch {
    /// The field at fault.
    pub field: MismatchField,
    /// What the target requires.
    pub expected: String,
    /// What the drafter has.
    pub found: String,
    /// The drafter (path or repo).
    pub drafter: String,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "drafter {} does not match the target: `{}` is {}, expected {}",
            self.drafter,
            self.field.as_str(),
            self.found,
            self.expected
        )
    }
}

impl std::error::Error for Mismatch {}

impl Mismatch {
    /// Always [`Reason::DrafterMismatch`].
    pub fn reason(&self) -> Reason {
        Reason::DrafterMismatch
    }
}

/// Why a drafter check failed.
#[derive(Debug, thiserror::Error)]
pub enum DrafterError {
    /// The drafter was read and does not fit.
    #[error(transparent)]
    Mismatch(#[from] Mismatch),
    /// The drafter or the target could not be read.
    #[error(transparent)]
    Unreadable(#[from] DetectError),
}

impl DrafterError {
    /// The contract reason: `mtp_head_not_cached` when the drafter is not on disk,
    /// `drafter_mismatch` otherwise.
    pub fn reason(&self) -> Reason {
        match self {
            DrafterError::Unreadable(DetectError::NotFound { .. }) => Reason::MtpHeadNotCached,
            _ => Reason::DrafterMismatch,
        }
    }
}

/// Checks that the drafter in `drafter_dir` is valid for the target in `target_dir` (both
/// local directories; only `config.json` and safetensors headers are read).
///
/// ```
/// # use mtp_detect::{check_drafter, MismatchField, DrafterError};
/// let t = tempfile::tempdir().unwrap();
/// let d = tempfile::tempdir().unwrap();
/// std::fs::write(t.path().join("config.json"), r#"{"model_type":"qwen3_5","text_config":{"hidden_size":64}}"#).unwrap();
/// std::fs::write(d.path().join("config.json"), r#"{"model_type":"qwen3_5_mtp","text_config":{"hidden_size":32}}"#).unwrap();
/// match check_drafter(t.path(), d.path()) {
///     Err(DrafterError::Mismatch(m)) => assert_eq!(m.field, MismatchField::HiddenSize),
///     other => panic!("{other:?}"),
/// }
/// ```
pub fn check_drafter(target_dir: &Path, drafter_dir: &Path) -> Result<DrafterInfo, DrafterError> {
    let target = LocalReader::new(target_dir)?;
    let tcfg = target
        .read_small("config.json", MAX_CONFIG_LEN)?
        .map(|b| parse_config(&b, &target.describe("config.json")))
        .transpose()?
        .ok_or_else(|| DetectError::NotFound {
            path: target.describe("config.json"),
        })?;
    let drafter = LocalReader::new(drafter_dir)?;
    check_drafter_with(&tcfg, &drafter, crate::registry::registry())
}

/// [`check_drafter`] against an already-parsed target config and any reader.
pub fn check_drafter_with(
    target: &ConfigInfo,
    drafter: &dyn Reader,
    reg: &Registry,
) -> Result<DrafterInfo, DrafterError> {
    let place = drafter.place();
    let mismatch = |field, expected: String, found: String| {
        DrafterError::Mismatch(Mismatch {
            field,
            expected,
            found,
            drafter: place.clone(),
        })
    };
    let dcfg = match drafter.read_small("config.json", MAX_CONFIG_LEN)? {
        Some(b) => parse_config(&b, &drafter.describe("config.json"))?,
        None => {
            return Err(mismatch(
                MismatchField::Config,
                "a config.json".into(),
                "missing".into(),
            ))
        }
    };
    let mt = dcfg.model_type.clone().unwrap_or_default();
    if !reg.runtimes.is_drafter_type(&mt) {
        return Err(mismatch(
            MismatchField::ModelType,
            format!("one of {}", reg.runtimes.drafter_model_types.join(", ")),
            if mt.is_empty() {
                "missing".into()
            } else {
                format!("`{mt}`")
            },
        ));
    }
    let (Some(dh), Some(th)) = (dcfg.hidden_size, target.hidden_size) else {
        return Err(mismatch(
            MismatchField::HiddenSize,
            target
                .hidden_size
                .map_or("a hidden_size in the target's config".into(), |h| {
                    h.to_string()
                }),
            dcfg.hidden_size.map_or("missing".into(), |h| h.to_string()),
        ));
    };
    if dh != th {
        return Err(mismatch(
            MismatchField::HiddenSize,
            th.to_string(),
            dh.to_string(),
        ));
    }
    if let (Some(dv), Some(tv)) = (dcfg.vocab_size, target.vocab_size) {
        if dv != tv {
            return Err(mismatch(
                MismatchField::VocabSize,
                tv.to_string(),
                dv.to_string(),
            ));
        }
    }
    let files = drafter.list()?;
    let (names, _) = read_weight_names(drafter, &files, None, &mut Vec::new())?;
    let summary =
        MtpTensorSummary::from_drafter_names(names.iter().map(|(n, d)| (n.as_str(), d.as_deref())));
    let keys: Vec<&str> = summary
        .tensors
        .iter()
        .filter_map(|n| crate::tensors::drafter_tensor_key(n))
        .collect();
    let mut missing: Vec<&str> = Vec::new();
    if mt == "qwen3_5_mtp" {
        missing.extend(QWEN_DRAFTER_REQUIRED.iter().filter(|r| !keys.contains(r)));
    }
    if summary.layers.is_empty() && !keys.iter().any(|k| k.starts_with("eh_proj.")) {
        missing.push("layers.N.*");
    }
    if !missing.is_empty() {
        return Err(mismatch(
            MismatchField::Tensors,
            format!(
                "MTP tensors {}",
                QWEN_DRAFTER_REQUIRED.join(", ") + ", layers.N.*"
            ),
            format!("no {}", missing.join(", ")),
        ));
    }
    Ok(DrafterInfo {
        model_type: mt,
        hidden_size: dh,
        vocab_size: dcfg.vocab_size,
        mtp_layers: summary.layer_count(),
        block_size: dcfg.block_size,
        config_depth: dcfg
            .block_size
            .and_then(|b| b.checked_sub(1))
            .and_then(|d| u32::try_from(d).ok()),
        tensor_count: summary.tensors.len(),
        dtypes: summary.dtypes.into_iter().collect(),
        mlx_affine_quantized: summary.mlx_affine_quantized,
    })
}
