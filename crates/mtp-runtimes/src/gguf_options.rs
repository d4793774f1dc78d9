//! The in-process `gguf` provider's own options ([`GgufOptions`]), typed. Built once at the
//! edge (the command line, `mtp serve`) and handed to `gguf::create_with`; the generic registry
//! path, which carries options as strings, parses them once here ([`GgufOptions::from_extra`])
//! with the contract's [`Extra`], whose rules every lane shares.

use mtp_contract::{Extra, IntRange, KvType, OptionError, ProviderError, ProviderOptions};

/// The names `cache_type` takes.
const KV_TYPES: [(&str, KvType); 3] = [
    ("f32", KvType::F32),
    ("f16", KvType::F16),
    ("bf16", KvType::Bf16),
];

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
/// // as in every lane: no value stands for the default, a small context is refused
/// for (k, v) in [("threads", "0"), ("n_ctx", "8")] {
///     let o = ProviderOptions::default().extra(k, v);
///     assert!(GgufOptions::from_extra(&o).is_err());
/// }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GgufOptions {
    /// The context in tokens (prompt and reply), at least [`mtp_contract::MIN_CTX_SIZE`];
    /// default 4096.
    pub n_ctx: Option<u32>,
    /// CPU threads (positive); default: the available cores.
    pub threads: Option<u32>,
    /// The KV cache's element type (keys and values, llama.cpp's `type_k` / `type_v`);
    /// default: llama.cpp's (f16).
    pub cache_type: Option<KvType>,
}

impl GgufOptions {
    /// The `ProviderOptions.extra` keys [`GgufOptions::from_extra`] reads (`ctx_size` is the
    /// name the native provider and `mtp --ctx-size` use for `n_ctx`).
    pub const EXTRA_KEYS: [&'static str; 4] = ["n_ctx", "ctx_size", "threads", "cache_type"];

    /// Reads the options from `opts.extra` strings, once, by the contract's rules ([`Extra`]):
    /// `n_ctx` or `ctx_size` (the same option, an integer of at least 16; both given and
    /// different is an error), `threads` (a positive integer) and `cache_type` (`f32`, `f16` or
    /// `bf16`). A bad value is an [`OptionError`] naming its key; any other key is one listing
    /// [`GgufOptions::EXTRA_KEYS`].
    pub fn from_extra(opts: &ProviderOptions) -> Result<GgufOptions, ProviderError> {
        let x = Extra::new(
            mtp_contract::ProviderKind::Gguf.name(),
            &Self::EXTRA_KEYS,
            &opts.extra,
        )?;
        let n_ctx = match (x.ctx_size("n_ctx")?, x.ctx_size("ctx_size")?) {
            (Some(a), Some(b)) if a != b => {
                return Err(OptionError::conflict(
                    "n_ctx",
                    format!("({a}) and `ctx_size` ({b}) are the same option; give one"),
                )
                .into())
            }
            (a, b) => a.or(b),
        };
        Ok(GgufOptions {
            n_ctx,
            threads: x.threads("threads")?,
            cache_type: x.choice("cache_type", &KV_TYPES)?,
        })
    }

    /// Refuses typed values outside the ranges [`GgufOptions::from_extra`] reads strings with
    /// (`n_ctx` under 16, `threads` 0): the typed path's checks, so no value silently stands
    /// for the default.
    pub fn check(&self) -> Result<(), OptionError> {
        if let Some(n) = self.n_ctx {
            IntRange::CTX_SIZE.check("n_ctx", n.into())?;
        }
        if let Some(n) = self.threads {
            IntRange::THREADS.check("threads", n.into())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same strings mean what they mean in every lane (the native lane's
    /// `shared_rules_hold_in_the_native_lane` holds it to the same table).
    #[test]
    fn shared_rules_hold_in_the_gguf_lane() {
        let read =
            |k: &str, v: &str| GgufOptions::from_extra(&ProviderOptions::default().extra(k, v));
        assert_eq!(read("threads", "2").unwrap().threads, Some(2));
        for v in ["0", "-1", "two"] {
            let e = read("threads", v).unwrap_err().to_string();
            assert!(
                e.contains("`threads` must be a positive integer") && e.contains(v),
                "{e}"
            );
        }
        for k in ["ctx_size", "n_ctx"] {
            assert_eq!(read(k, "16").unwrap().n_ctx, Some(16));
            for v in ["8", "0", "15"] {
                let e = read(k, v).unwrap_err().to_string();
                assert!(
                    e.contains(&format!("`{k}` must be an integer of at least 16")),
                    "{e}"
                );
            }
        }
        let e = read("flash_attn", "on").unwrap_err().to_string();
        assert!(
            e.contains("unknown option `flash_attn` for the gguf provider"),
            "{e}"
        );
        let both = ProviderOptions::default()
            .extra("n_ctx", "512")
            .extra("ctx_size", "1024");
        assert!(GgufOptions::from_extra(&both).is_err());
        let same = ProviderOptions::default()
            .extra("n_ctx", "512")
            .extra("ctx_size", "512");
        assert_eq!(GgufOptions::from_extra(&same).unwrap().n_ctx, Some(512));
        // the typed path: the same ranges
        let typed = |n_ctx, threads| {
            GgufOptions {
                n_ctx,
                threads,
                cache_type: None,
            }
            .check()
        };
        assert_eq!(typed(Some(8), None).unwrap_err().key(), "n_ctx");
        assert_eq!(typed(None, Some(0)).unwrap_err().key(), "threads");
        assert!(typed(Some(16), Some(1)).is_ok());
    }
}
