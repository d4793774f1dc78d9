//! # mtp-runtimes
//!
//! HTTP adapters that implement the contract's [`Provider`] trait for servers that run
//! multi-token-prediction drafting themselves: `llama-server` (also usable as
//! `openai-compatible`), `lmstudio`, `vllm`, and `ollama`.
//!
//! A request's `speculation` block cannot switch a server's drafter: MTP is a launch setting
//! of each server. The adapters therefore report what the server *did*, from evidence:
//! `used` is true only when the server reported proposals for the call; otherwise the report
//! names `server_side` (the server showed no MTP lane or drafted nothing) with the exact launch
//! flag, `not_reported` when the server said nothing either way, or `runtime_unsupported`
//! (Ollama). See `docs/runtimes.md` for what each server reports.
//!
//! ```no_run
//! use mtp_contract::{GenerateRequest, ProviderOptions, Speculation};
//!
//! # async fn demo() -> Result<(), mtp_contract::ProviderError> {
//! let opts = ProviderOptions::default()
//!     .base_url("http://127.0.0.1:8080")
//!     .speculation(Speculation::native_mtp());
//! let llm = mtp_runtimes::create("llama-server", "qwen3.5-9b-mtp", &opts)?;
//! let resp = llm.generate(GenerateRequest::new("Write an LRU cache in Rust.").max_output_tokens(256)).await?;
//! let s = &resp.metadata.speculation;
//! println!("used={} drafted={:?} accepted={:?} reason={:?}", s.used, s.drafted, s.accepted, s.reason);
//! # Ok(()) }
//! ```
#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod evidence;
mod gguf_options;
mod http;
mod options;
mod provider;
mod tool_calls;
mod wire;

#[cfg(feature = "gguf")]
pub mod gguf;
pub mod prometheus;
pub mod sse;

use std::sync::Arc;

use mtp_contract::{Provider, ProviderError, ProviderKind, ProviderOptions};

pub use evidence::{Evidence, ServerSpec, LLAMA_MTP_TYPE};
pub use gguf_options::GgufOptions;
pub use options::{
    ApiKey, HttpOptions, MetricsMode, ServerKind, DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_SSE_EVENT_BYTES, EXTRA_KEYS,
};
pub use provider::HttpProvider;
pub use tool_calls::DEFAULT_MAX_TOOL_CALLS;

/// The providers this crate registers, in order: the contract's HTTP kinds.
pub const PROVIDERS: [ProviderKind; 5] = ProviderKind::HTTP;

/// Creates the adapter registered under `provider_name` for `model`. No I/O happens here.
///
/// An unknown name is an `InvalidRequest` that lists [`PROVIDERS`].
///
/// ```
/// use mtp_contract::ProviderOptions;
/// let p = mtp_runtimes::create("ollama", "qwen3:8b", &ProviderOptions::default()).unwrap();
/// assert_eq!(p.name(), "ollama");
/// let err = mtp_runtimes::create("tgi", "m", &ProviderOptions::default()).err().unwrap();
/// assert!(err.to_string().contains("llama-server"));
/// ```
pub fn create(
    provider_name: &str,
    model: &str,
    opts: &ProviderOptions,
) -> Result<Arc<dyn Provider>, ProviderError> {
    let kind = kind_named(provider_name)?;
    Ok(Arc::new(HttpProvider::new(kind, model, opts)?))
}

/// [`create`] with the adapter's settings typed ([`HttpOptions`], checked by the ranges the
/// `extra` strings are read with); `opts` carries only what every provider shares (the
/// speculation block): an `extra` key, `base_url` or `api_key` there is refused, since `http`
/// holds them.
///
/// ```
/// use std::time::Duration;
/// use mtp_contract::ProviderOptions;
/// use mtp_runtimes::{HttpOptions, ServerKind};
/// let mut http = HttpOptions::new(ServerKind::Vllm);
/// http.idle_timeout = Duration::from_secs(30);
/// let p = mtp_runtimes::create_with("vllm", "m", &ProviderOptions::default(), http.clone()).unwrap();
/// assert_eq!(p.name(), "vllm");
/// // a string option beside the typed ones would be ignored: refused
/// let beside = ProviderOptions::default().extra("idle_timeout_ms", "5");
/// assert!(mtp_runtimes::create_with("vllm", "m", &beside, http.clone()).is_err());
/// // the typed path's ranges are the strings' ranges
/// http.connect_retries = 11;
/// let e = mtp_runtimes::create_with("vllm", "m", &ProviderOptions::default(), http).err().unwrap();
/// assert!(e.to_string().contains("`connect_retries` must be an integer from 0 to 10"));
/// ```
pub fn create_with(
    provider_name: &str,
    model: &str,
    opts: &ProviderOptions,
    http: HttpOptions,
) -> Result<Arc<dyn Provider>, ProviderError> {
    let kind = kind_named(provider_name)?;
    Ok(Arc::new(HttpProvider::with_options(
        kind, model, opts, http,
    )?))
}

/// The model a single-model server serves, for callers that name none (`mtp --provider
/// llama-server` without `--model`): the one id of its OpenAI `GET /v1/models`. A server that
/// lists several is an `InvalidRequest` naming them (pick one with `--model`); one that lists
/// none, or answers with something that is not a model list, is an `Api` error saying so.
pub async fn served_model(
    provider_name: &str,
    opts: &ProviderOptions,
) -> Result<String, ProviderError> {
    let kind = kind_named(provider_name)?;
    let http = HttpOptions::from_provider_options(kind, opts)?;
    let t = http::Transport::new(kind, "(the served model)".into(), http)?;
    let body = t.get_required("/v1/models").await?;
    let ids = wire::model_ids(&body).map_err(|why| {
        t.api_error(
            None,
            format!(
                "{}/v1/models is not an OpenAI model list: {why}",
                t.server()
            ),
        )
    })?;
    match ids.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(t.api_error(
            None,
            format!(
                "{}/v1/models lists no model: the server has none loaded",
                t.server()
            ),
        )),
        many => Err(ProviderError::InvalidRequest {
            field: "model",
            message: format!(
                "the {kind} server at {} serves {} models ({}); name one with --model",
                t.server(),
                many.len(),
                many.join(", ")
            ),
        }),
    }
}

/// The server kind a provider name stands for; an unknown name lists [`PROVIDERS`].
fn kind_named(provider_name: &str) -> Result<ServerKind, ProviderError> {
    ServerKind::from_name(provider_name).ok_or_else(|| ProviderError::InvalidRequest {
        field: "provider",
        message: format!(
            "unknown HTTP provider `{provider_name}`; known: {}",
            PROVIDERS.map(ProviderKind::name).join(", ")
        ),
    })
}

/// Compiles the README's examples as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn providers_match_kinds() {
        let kinds: Vec<ProviderKind> = ServerKind::ALL.iter().map(|k| k.kind()).collect();
        assert_eq!(kinds, PROVIDERS);
        for kind in PROVIDERS {
            let p = create(kind.name(), "m", &ProviderOptions::default()).unwrap();
            assert_eq!(p.name(), kind.name());
            assert_eq!(p.model(), "m");
        }
        assert!(create("llama-server", " ", &ProviderOptions::default()).is_err());
    }
}
