//! The in-process `gguf` provider's own options ([`GgufOptions`]), typed. Built once at the
//! edge (the command line, `mtp serve`) and handed to `gguf::create_with`; the generic registry
//! path, which carries options as strings, parses them once here ([`GgufOptions::from_extra`]).

use mtp_contract::{KvType, ProviderError, ProviderOptions};

/// The context, threads and KV cache type of the in-process `gguf` provider (llama.cpp linked
/// in).
///
/// ```
/// use mtp_contract::ProviderOptions;
/// use mtp_runtimes::GgufOptions;
/// let opts = ProviderOptions::default().extra("ctx_size", "2048").extra("threads", "2");
/// let g = GgufOptions::from_extra(&opts).unwrap();
/// assert_eq!(g, GgufOptions { n_ctx: Some(2048), threads: Some(2), cache_type: None });
/// let q8 = ProviderOptions::default().extra("cache_type", "q8_0");
/// assert!(GgufOptions::from_extra(&q8).unwrap_err().to_string().contains("cache_type"));
/// let bad = ProviderOptions::default().extra("threads", "two");
/// assert!(GgufOptions::from_extra(&bad).unwrap_err().to_string().contains("threads"));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GgufOptions {
    /// The context in tokens (prompt and reply); default 4096, and so is anything under 16.
    pub n_ctx: Option<u32>,
    /// CPU threads; default: the available cores.
    pub threads: Option<u32>,
    /// The KV cache's element type (keys and values, llama.cpp's `type_k` / `type_v`);
    /// default: llama.cpp's (f16).
    pub cache_type: Option<KvType>,
}

impl GgufOptions {
    /// The `ProviderOptions.extra` keys [`GgufOptions::from_extra`] reads (`ctx_size` is the
    /// name the native provider and `mtp --ctx-size` use for `n_ctx`).
    pub const EXTRA_KEYS: [&'static str; 4] = ["n_ctx", "ctx_size", "threads", "cache_type"];

    /// Reads the options from `opts.extra` strings, once: `n_ctx` or `ctx_size` (the same
    /// option; both given and different is an error), `threads` (zero or negative: the
    /// default) and `cache_type` (`f32`, `f16` or `bf16`). A value that is not an integer is an `InvalidRequest` naming its key; any
    /// other key is one listing [`GgufOptions::EXTRA_KEYS`].
    pub fn from_extra(opts: &ProviderOptions) -> Result<GgufOptions, ProviderError> {
        if let Some(k) = opts
            .extra
            .keys()
            .find(|k| !Self::EXTRA_KEYS.contains(&k.as_str()))
        {
            return Err(ProviderError::InvalidRequest {
                field: "extra",
                message: format!(
                    "unknown option `{k}` for the gguf provider; known: {}",
                    Self::EXTRA_KEYS.join(", ")
                ),
            });
        }
        let n_ctx = match (
            parse_extra::<u32>(opts, "n_ctx")?,
            parse_extra::<u32>(opts, "ctx_size")?,
        ) {
            (Some(a), Some(b)) if a != b => {
                return Err(ProviderError::InvalidRequest {
                    field: "extra",
                    message: format!(
                        "n_ctx ({a}) and ctx_size ({b}) are the same option; give one"
                    ),
                })
            }
            (a, b) => a.or(b),
        };
        let threads = parse_extra::<i32>(opts, "threads")?.and_then(|n| u32::try_from(n).ok());
        let cache_type = opts
            .extra
            .get("cache_type")
            .map(|v| {
                v.parse::<KvType>()
                    .map_err(|message| ProviderError::InvalidRequest {
                        field: "cache_type",
                        message,
                    })
            })
            .transpose()?;
        Ok(GgufOptions {
            n_ctx,
            threads,
            cache_type,
        })
    }
}

fn parse_extra<T: std::str::FromStr>(
    opts: &ProviderOptions,
    key: &'static str,
) -> Result<Option<T>, ProviderError> {
    opts.extra
        .get(key)
        .map(|v| {
            v.parse::<T>().map_err(|_| ProviderError::InvalidRequest {
                field: key,
                message: format!("`{v}` is not a positive integer"),
            })
        })
        .transpose()
}
