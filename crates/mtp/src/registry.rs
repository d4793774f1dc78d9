//! The provider registry: built-in factories plus any a third-party crate registers.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock, RwLock};

use mtp_contract::{Provider, ProviderError, ProviderOptions};

pub use crate::builtin::Factory;

/// An error of the facade.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No provider is registered under this name.
    #[error("unknown provider `{name}`; known providers: {}", known.join(", "))]
    UnknownProvider {
        /// The name as given.
        name: String,
        /// The registered names.
        known: Vec<String>,
    },
    /// The provider failed to start.
    #[error(transparent)]
    Provider(#[from] ProviderError),
}

fn table() -> &'static RwLock<BTreeMap<String, Factory>> {
    static TABLE: OnceLock<RwLock<BTreeMap<String, Factory>>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut map = BTreeMap::new();
        crate::builtin::register_builtins(&mut map);
        RwLock::new(map)
    })
}

/// Registers (or replaces) a provider factory under `name`.
///
/// ```
/// use std::sync::Arc;
/// use mtp::{register_provider, providers};
/// use mtp_contract::ProviderError;
/// register_provider("my-runtime", Arc::new(|model: &str, _opts: &mtp_contract::ProviderOptions| {
///     Err(ProviderError::ModelLoad { model: model.into(), message: "example".into() })
/// }));
/// assert!(providers().contains(&"my-runtime".to_string()));
/// ```
pub fn register_provider(name: impl Into<String>, factory: Factory) {
    let mut t = table().write().unwrap_or_else(|p| p.into_inner());
    t.insert(name.into(), factory);
}

/// The registered provider names, sorted.
pub fn providers() -> Vec<String> {
    let t = table().read().unwrap_or_else(|p| p.into_inner());
    t.keys().cloned().collect()
}

/// Creates a provider by name for a model (repo id or path) with construction options.
///
/// ```
/// let Err(err) = mtp::create_llm("no-such-runtime", "m", Default::default()) else { panic!() };
/// assert!(err.to_string().contains("unknown provider `no-such-runtime`"));
/// ```
pub fn create_llm(
    provider: &str,
    model: &str,
    options: ProviderOptions,
) -> Result<Arc<dyn Provider>, Error> {
    let factory = {
        let t = table().read().unwrap_or_else(|p| p.into_inner());
        t.get(provider).cloned()
    };
    match factory {
        Some(f) => Ok(f(model, &options)?),
        None => Err(Error::UnknownProvider {
            name: provider.to_string(),
            known: providers(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_http_providers_are_registered_and_unknown_lists_them() {
        let names = providers();
        for n in [
            "native",
            "mlx",
            "llama-server",
            "openai-compatible",
            "lmstudio",
            "vllm",
            "ollama",
        ] {
            assert!(names.contains(&n.to_string()), "{n} missing from {names:?}");
        }
        let Err(err) = create_llm("nope", "m", ProviderOptions::default()) else {
            panic!("unknown provider accepted")
        };
        let msg = err.to_string();
        assert!(
            msg.contains("unknown provider `nope`") && msg.contains("llama-server"),
            "{msg}"
        );
    }
}
