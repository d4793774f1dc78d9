//! # mtp-engine
//!
//! A native [candle](https://github.com/huggingface/candle) engine for the Qwen3.5 family of
//! hybrid models (Gated DeltaNet + gated full attention, dense or MoE), loaded from Hugging Face
//! or MLX checkpoints (including MLX affine 4/8-bit), with exact MTP speculative decoding.
//!
//! See the crate README for the API tour.
//!
//! `unsafe` code lives in `kernels` (every SIMD kernel, on the one instruction-set dispatch of
//! `kernels::cpu`), in `team` (disjoint chunks of one slice) and in the loader's memory maps;
//! `kernels` is private to the crate, and every safe function that reaches `unsafe` code checks
//! the lengths it relies on once per call (a typed error where it returns `Result`, else a panic
//! that names the length at fault).
#![warn(missing_docs)]
#![deny(unsafe_code)]

pub mod arith;
pub mod batch;
pub mod cache;
pub mod config;
pub mod constraint;
pub(crate) mod depth;
pub mod engine;
pub mod error;
#[allow(unsafe_code)] // the vector kernels and their CPU dispatch (see `kernels::cpu`)
pub(crate) mod kernels;
#[allow(unsafe_code)] // checkpoint files are memory-mapped
pub mod loader;
pub mod logprobs;
pub mod nn;
pub mod persist;
pub(crate) mod prefill;
pub mod qwen3_5;
pub mod qwen3_5_mtp;
pub mod request;
pub mod resume;
pub mod sampling;
pub mod scheduler;
pub(crate) mod scratch;
pub mod seeded;
pub(crate) mod sequence;
pub(crate) mod spec;
pub mod speculative;
#[allow(unsafe_code)] // a loop borrowed by the workers, disjoint chunks of one slice
pub mod team;
#[cfg(test)]
mod testing;
pub mod tokenizer;
pub mod vision;

pub use arith::Arith;
pub use cache::{CacheSnapshot, KvType, SeqCache};
pub use config::{GenerationConfig, ModelConfig};
pub use engine::Engine;
pub use error::{Error, Result};
pub use loader::WeightDtype;
pub use logprobs::{LogprobSink, TokenLogprob, MAX_TOP_LOGPROBS};
pub use mtp_contract::{
    DraftStats, FinishReason, PromptProgress, ResponseFormat, Sampling, Timings,
};
pub use qwen3_5::{ForwardOutput, LogitsAt, Qwen35Model};
pub use qwen3_5_mtp::MtpHead;
pub use request::{
    GenerateOptions, GenerationOutput, ProgressSink, SpeculationOutcome, MAX_VERIFY_DEPTH,
};
pub use resume::{KeptStates, PromptState};
pub use tokenizer::{TextTokenizer, TokenDecoder};

/// The README's example, compiled as a doctest so that it cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
