//! # mtp-engine
//!
//! A native [candle](https://github.com/huggingface/candle) engine for the Qwen3.5 family of
//! hybrid models (Gated DeltaNet + gated full attention, dense or MoE), loaded from Hugging Face
//! or MLX checkpoints (including MLX affine 4/8-bit), with exact MTP speculative decoding.
//!
//! See the crate README for the API tour.
#![warn(missing_docs)]

pub mod cache;
pub mod config;
pub mod engine;
pub mod error;
pub mod kernels;
pub mod loader;
pub mod nn;
pub mod quant;
pub mod qwen3_5;
pub mod qwen3_5_mtp;
pub mod resume;
pub mod sampling;
pub mod simd;
pub mod speculative;
pub mod team;
pub mod tokenizer;

pub use cache::{CacheSnapshot, SeqCache};
pub use config::{GenerationConfig, ModelConfig};
pub use engine::{Engine, GenerateOptions, GenerationOutput, SpeculationOutcome};
pub use error::{Error, Result};
pub use loader::WeightDtype;
pub use mtp_contract::{DraftStats, FinishReason, Sampling, Timings};
pub use qwen3_5::{ForwardOutput, LogitsAt, Qwen35Model};
pub use qwen3_5_mtp::MtpHead;
pub use resume::{PromptState, ResumableOutput};
pub use tokenizer::{TextTokenizer, TokenDecoder};

/// The README's example, compiled as a doctest so that it cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
