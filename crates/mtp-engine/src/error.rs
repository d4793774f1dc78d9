//! The engine's error type.

use std::path::PathBuf;

/// Everything that can go wrong while loading or running a model.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file at fault.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// `config.json` (or another JSON file) is malformed.
    #[error("invalid {path}: {message}")]
    Config {
        /// The file at fault.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// The checkpoint's `model_type` is not one this engine runs.
    #[error("unsupported model_type `{model_type}`; this engine runs qwen3_5, qwen3_5_text, qwen3_5_moe, qwen3_5_moe_text, qwen3_next (and qwen3_5_mtp drafters)")]
    UnknownModelType {
        /// The value found in config.json.
        model_type: String,
    },
    /// A tensor the architecture needs is not in the checkpoint.
    #[error("missing tensor `{name}` in the checkpoint (after renaming); is this a complete {model_type} checkpoint?")]
    MissingTensor {
        /// Canonical tensor name.
        name: String,
        /// The model type being loaded.
        model_type: String,
    },
    /// A tensor has a shape other than the config implies.
    #[error("tensor `{name}` has shape {actual:?}, expected {expected:?}")]
    ShapeMismatch {
        /// Canonical tensor name.
        name: String,
        /// Shape the config implies.
        expected: Vec<usize>,
        /// Shape found in the checkpoint.
        actual: Vec<usize>,
    },
    /// A safetensors file is malformed or holds an unsupported dtype.
    #[error("bad tensor data in {path}: {message}")]
    Safetensors {
        /// The file at fault.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A quantized tensor cannot be decoded.
    #[error("cannot dequantize `{name}`: {message}")]
    Quantization {
        /// Canonical tensor name.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// The request asks for something this runtime does not do.
    #[error("{0} is not supported by this runtime")]
    Unsupported(String),
    /// A request parameter is out of range.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// A `response_format` could not be compiled, or the reply's grammar state failed.
    #[error("response_format ({kind}): {message}")]
    Constraint {
        /// `json_schema`, `json_object`, `regex` or `grammar`.
        kind: &'static str,
        /// What llguidance said.
        message: String,
    },
    /// An image could not be decoded or prepared (the error names it).
    #[error(transparent)]
    Image(#[from] crate::vision::preprocess::ImageError),
    /// An image source (a data URL, a path that is no file) cannot be read; the message names
    /// it.
    #[error("{0}")]
    ImageSource(String),
    /// The tokenizer failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The chat template failed to render.
    #[error("chat template: {0}")]
    Template(String),
    /// No MTP head is available for speculative decoding.
    #[error("no MTP head: {0}")]
    NoDrafter(String),
    /// A forward shared by several sequences of a batch failed; each of them gets this error.
    #[error("a batched forward failed: {0}")]
    Batch(String),
    /// A saved decoding state (a prefix-cache file) does not fit this model, or is damaged.
    #[error("saved state: {0}")]
    State(String),
    /// The request was cancelled ([`crate::GenerateOptions::cancel`]) before the work ended.
    #[error("cancelled")]
    Cancelled,
    /// A tensor operation failed.
    #[error("tensor op: {0}")]
    Candle(#[from] candle_core::Error),
}

/// The engine's result type.
pub type Result<T> = std::result::Result<T, Error>;
