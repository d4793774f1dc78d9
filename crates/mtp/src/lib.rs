//! # mtp
//!
//! The facade of the `mtp` workspace: [`create_llm`] builds a [`Provider`] by name from a
//! registry that third-party crates can extend with [`register_provider`].
//!
//! ```no_run
//! use mtp::{create_llm, GenerateRequest, ProviderOptions, Speculation};
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let llm = create_llm("native", "models/tiny-code", ProviderOptions::default()
//!     .speculation(Speculation::native_mtp()))?;
//! let r = llm.generate(GenerateRequest::new("fn main() {").max_output_tokens(64)).await?;
//! println!("{}", r.content);
//! println!("{}", serde_json::to_string(&r.metadata.speculation)?);
//! # Ok(()) }
//! ```
#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod builtin;
#[cfg(feature = "cli")]
pub mod cli;
/// The native in-process provider (`native`, alias `mlx`), its own crate.
pub use mtp_native as native;
mod registry;
pub mod structured;

pub use mtp_contract::*;
pub use registry::{create_llm, providers, register_provider, Error, Factory};
