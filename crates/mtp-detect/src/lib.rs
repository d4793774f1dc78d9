//! # mtp-detect
//!
//! Proves from the artifact whether a model carries a multi-token-prediction (MTP) head,
//! and says which runtime can run it and how to start it. Evidence comes from tensor names
//! (a safetensors index or header, a GGUF tensor table) and GGUF header keys, never from
//! file names or `config.json` claims; claims are reported beside the evidence, and a claim
//! the weights contradict becomes a warning.
//!
//! What it reads: `config.json`, `model.safetensors.index.json`, the 8-byte length and JSON
//! header of a safetensors file, and a prefix of a GGUF file (3 MiB, growing to 64 MiB when
//! the metadata is longer). Never tensor data. Sources: a local path, the Hugging Face cache,
//! or (feature `hub`) the Hub over HTTP, configured as `huggingface_hub` is (`HF_ENDPOINT`,
//! `HF_TOKEN` or the login token file, `HF_HUB_OFFLINE`); see [`hub`].
//!
//! ```
//! use mtp_detect::{probe_local, Runtime};
//! # let dir = tempfile::tempdir().unwrap();
//! # let json = br#"{"mtp.fc.weight":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]},"mtp.layers.0.mlp.up_proj.weight":{"dtype":"BF16","shape":[1],"data_offsets":[2,4]}}"#;
//! # let mut f = (json.len() as u64).to_le_bytes().to_vec(); f.extend_from_slice(json); f.extend_from_slice(&[0; 4]);
//! # std::fs::write(dir.path().join("model.safetensors"), f).unwrap();
//! # std::fs::write(dir.path().join("config.json"), r#"{"model_type":"qwen3_5","text_config":{"hidden_size":64,"num_hidden_layers":4,"mtp_num_hidden_layers":1}}"#).unwrap();
//! let report = probe_local(dir.path()).unwrap();
//! assert!(report.mtp_head);
//! assert_eq!(report.mtp_layers, 1);
//! assert!(report.runtime(Runtime::Native).unwrap().can_run_mtp);
//! println!("{}", report.to_json());
//! ```
#![warn(missing_docs)]
#![forbid(unsafe_code)]

// From the bottom up: each module imports only modules above it in this list (no import
// cycle; `cargo xtask deps` checks it, see docs/ARCHITECTURE.md).
pub mod cache;
pub mod config;
pub mod drafter;
mod error;
pub mod gguf;
pub mod hub;
pub mod names;
pub mod probe;
pub mod registry;
pub mod repo;
pub mod runtimes;
pub mod source;
pub mod st;
pub mod tensors;
pub mod weights;

pub use cache::{resolve_model, CacheConfig, ResolvedArtifact};
pub use drafter::{check_drafter, DrafterError, DrafterInfo, Mismatch, MismatchField};
pub use error::{DetectError, HubError};
pub use gguf::is_gguf_model_file;
pub use hub::HubConfig;
#[cfg(feature = "hub")]
pub use hub::{HubClient, HubReader};
pub use names::{is_safe_relative, shown_name};
#[cfg(feature = "hub")]
pub use probe::probe_async;
pub use probe::{
    default_depth, probe, probe_local, probe_reader, CompanionStatus, Format, ProbeOptions,
    ProbeReport, RegistryView, Role,
};
pub use registry::{registry, Entry, Registry};
pub use repo::RepoId;
pub use runtimes::{
    convert_command, launch_command, launch_command_in, CommandStyle, Runtime, RuntimeSupport,
    Verdict,
};
pub use source::{LocalReader, Reader};
pub use tensors::{
    classify_tensor, drafter_tensor_key, is_mlx_quant_tensor, is_mtp_tensor, mtp_layer_index,
    mtp_namespace_key, mtp_tensor_names, vision_tensor_key, MtpStyle, MtpTensor, MtpTensorSummary,
    MTP_PREFIXES, VISION_PREFIXES,
};

/// The README's example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// Kept for callers that name the contract's reason type through this crate.
pub use mtp_contract::Reason;
