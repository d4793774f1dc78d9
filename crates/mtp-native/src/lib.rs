//! The native in-process provider (`native`, alias `mlx`): the engine behind the contract's
//! `Provider` trait, with per-call speculation, shared weights, a busy guard, streaming with
//! cancellation and the prefix caches (in memory and on disk).
//!
//! Registered by the facade (`mtp::create_llm("native", …)`); usable alone through [`create`].
#![warn(missing_docs)]

mod backend;
mod disk_cache;
mod engine_backend;
mod factory;
mod prefix_cache;
mod provider;
mod shared;

pub use backend::{Backend, DrafterLane, Job, RenderedPrompt, RunOutput, TextDecoder};
#[doc(hidden)]
pub use disk_cache::read_checkpoint_bytes;
pub use disk_cache::{DiskCache, DiskCacheError, DEFAULT_DISK_BUDGET_BYTES};
pub use engine_backend::{EngineBackend, EngineState};
pub use factory::{
    create, create_with, loaded_checkpoints, loaded_copies, NativeDevice, NativeDtype,
    NativeOptions, EXTRA_KEYS, SEED_ALIASES, SEED_BATCHING_MAX_BATCH,
};
pub use prefix_cache::{
    CacheState, Hit, PrefixCache, DEFAULT_BUDGET_BYTES, DEFAULT_CHECKPOINTS_PER_KEY,
};
pub use provider::{Loaded, NativeProvider};
pub use shared::SharedModels;

#[cfg(test)]
mod tests;
