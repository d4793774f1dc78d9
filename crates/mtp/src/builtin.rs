//! The providers this workspace ships. `gguf` (llama.cpp linked in-process) is always
//! registered; without the `gguf` cargo feature it answers with an error saying how to build it.

use std::collections::BTreeMap;
use std::sync::Arc;

use mtp_contract::{Provider, ProviderError, ProviderKind, ProviderOptions};

/// Builds a provider for a model. Registered under one or more names (the registry's type,
/// defined here, below it: the registry starts from these built-in factories).
pub type Factory =
    Arc<dyn Fn(&str, &ProviderOptions) -> Result<Arc<dyn Provider>, ProviderError> + Send + Sync>;

pub(crate) fn register_builtins(map: &mut BTreeMap<String, Factory>) {
    for kind in ProviderKind::ALL {
        let factory: Factory = if kind.is_native() {
            // `mlx` accepts the same MLX-layout checkpoints (the report's `runtime` always names
            // what really ran, e.g. `mtp-engine-cpu`).
            Arc::new(move |model: &str, opts: &mtp_contract::ProviderOptions| {
                crate::native::create(kind.name(), model, opts)
            })
        } else if kind.is_http() {
            Arc::new(move |model: &str, opts: &mtp_contract::ProviderOptions| {
                mtp_runtimes::create(kind.name(), model, opts)
            })
        } else {
            Arc::new(gguf)
        };
        map.insert(kind.name().to_string(), factory);
    }
}

/// The registry's `gguf` factory: its options as strings, read once
/// ([`mtp_runtimes::GgufOptions::from_extra`]).
#[cfg(feature = "gguf")]
fn gguf(
    model: &str,
    opts: &mtp_contract::ProviderOptions,
) -> Result<Arc<dyn mtp_contract::Provider>, mtp_contract::ProviderError> {
    mtp_runtimes::gguf::create(model, opts)
}

#[cfg(not(feature = "gguf"))]
fn gguf(
    model: &str,
    opts: &mtp_contract::ProviderOptions,
) -> Result<Arc<dyn mtp_contract::Provider>, mtp_contract::ProviderError> {
    gguf_with(model, opts, mtp_runtimes::GgufOptions::default())
}

/// The in-process `gguf` provider with its options typed (`opts.extra` must be empty).
#[cfg(feature = "gguf")]
pub(crate) fn gguf_with(
    model: &str,
    opts: &mtp_contract::ProviderOptions,
    gguf: mtp_runtimes::GgufOptions,
) -> Result<Arc<dyn mtp_contract::Provider>, mtp_contract::ProviderError> {
    mtp_runtimes::gguf::create_with(model, opts, gguf)
}

/// Without the `gguf` cargo feature: an error saying how to build it.
#[cfg(not(feature = "gguf"))]
pub(crate) fn gguf_with(
    model: &str,
    _opts: &mtp_contract::ProviderOptions,
    _gguf: mtp_runtimes::GgufOptions,
) -> Result<Arc<dyn mtp_contract::Provider>, mtp_contract::ProviderError> {
    Err(mtp_contract::ProviderError::ModelLoad {
        model: model.to_string(),
        message: "the in-process gguf provider is not compiled into this build; rebuild with \
                  `--features gguf` (it links llama.cpp b11434 and needs cmake and libclang), or \
                  serve the file with llama-server and use the `llama-server` provider"
            .into(),
    })
}
