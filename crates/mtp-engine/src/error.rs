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
    Image(#[from] ImageError),
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

/// Errors of image decoding (`vision::preprocess`), configuration and preprocessing; each names the image or the file
/// at fault.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The bytes are not a PNG, JPEG or WebP file (or are one of a format this build does not
    /// decode).
    #[error(
        "{name}: unsupported image format{}; PNG, JPEG and WebP are supported",
        in_parens(detected)
    )]
    UnsupportedFormat {
        /// The image (a path, or e.g. "image 2").
        name: String,
        /// The format recognised from the file's signature, if any.
        detected: Option<String>,
    },
    /// The file is corrupt or truncated.
    #[error("{name}: cannot decode the image: {message}")]
    Decode {
        /// The image.
        name: String,
        /// What the decoder said.
        message: String,
    },
    /// The file, or the image its header describes, is over the [`ImageLimits`](crate::vision::preprocess::ImageLimits) (checked before
    /// any pixel is decoded), or the resized image would be unreasonably large.
    #[error("{name}: {detail}")]
    TooLarge {
        /// The image.
        name: String,
        /// What is over which limit.
        detail: String,
    },
    /// The image has no pixels.
    #[error("{name}: the image is empty ({width}x{height} pixels)")]
    Empty {
        /// The image.
        name: String,
        /// Its width in pixels.
        width: usize,
        /// Its height in pixels.
        height: usize,
    },
    /// One side is more than 200 times the other (mlx-vlm refuses those too).
    #[error("{name}: absolute aspect ratio must be smaller than 200, got {ratio} ({width}x{height} pixels)")]
    AspectRatio {
        /// The image.
        name: String,
        /// Its width in pixels.
        width: usize,
        /// Its height in pixels.
        height: usize,
        /// `max(width, height) / min(width, height)`.
        ratio: f64,
    },
    /// The smart resize gives a zero side (only possible with `min_pixels` 0), which Pillow
    /// refuses to resize to.
    #[error(
        "{name}: {width}x{height} pixels resize to {new_width}x{new_height} (min_pixels is 0?)"
    )]
    ResizeToZero {
        /// The image.
        name: String,
        /// Its width in pixels.
        width: usize,
        /// Its height in pixels.
        height: usize,
        /// The width smart resize computed.
        new_width: usize,
        /// The height smart resize computed.
        new_height: usize,
    },
    /// The [`RgbImage`](image::RgbImage)'s buffer does not hold `width * height * 3` bytes.
    #[error("{name}: {message}")]
    InvalidImage {
        /// The image.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// A checkpoint's `preprocessor_config.json` / `processor_config.json` is unreadable,
    /// malformed, or has a value of the wrong type.
    #[error("{}: {message}", path.display())]
    Config {
        /// The file at fault.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// An [`ImageProcessorConfig`](crate::vision::preprocess::ImageProcessorConfig) value that cannot work (a zero patch size, `max_pixels` 0).
    #[error("invalid image processor config: {message}")]
    InvalidConfig {
        /// What is wrong.
        message: String,
    },
}

/// `" (x)"` for `Some(x)`, nothing for `None`.
fn in_parens(detected: &Option<String>) -> String {
    detected
        .as_ref()
        .map(|f| format!(" ({f})"))
        .unwrap_or_default()
}
