//! Which server an adapter talks to, and the connection settings read from
//! [`ProviderOptions`].

use std::fmt;
use std::time::Duration;

use mtp_contract::{Extra, IntRange, OptionError, ProviderError, ProviderKind, ProviderOptions};

/// The HTTP servers this crate speaks to (the contract's HTTP [`ProviderKind`]s). Each has its
/// own endpoints and its own evidence of speculation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ServerKind {
    /// llama.cpp's `llama-server`: `timings.draft_n`, `/props`, optional `/metrics`.
    LlamaServer,
    /// Any OpenAI-style server; read like llama-server where it answers the same way, but no
    /// llama-specific request fields are sent.
    OpenAiCompatible,
    /// LM Studio's native REST API (`/api/v0`), whose `stats`/`usage` carry draft counters.
    LmStudio,
    /// vLLM's OpenAI server: per-request `metrics.speculative_decoding`, else `/metrics` deltas.
    Vllm,
    /// Ollama's OpenAI-compatible endpoints; it exposes no speculative decoding.
    Ollama,
}

impl ServerKind {
    /// Every kind, in registry order.
    pub const ALL: [ServerKind; 5] = [
        ServerKind::LlamaServer,
        ServerKind::OpenAiCompatible,
        ServerKind::LmStudio,
        ServerKind::Vllm,
        ServerKind::Ollama,
    ];

    /// The provider it is.
    pub fn kind(self) -> ProviderKind {
        match self {
            ServerKind::LlamaServer => ProviderKind::LlamaServer,
            ServerKind::OpenAiCompatible => ProviderKind::OpenAiCompatible,
            ServerKind::LmStudio => ProviderKind::LmStudio,
            ServerKind::Vllm => ProviderKind::Vllm,
            ServerKind::Ollama => ProviderKind::Ollama,
        }
    }

    /// The provider name used with `create` (the contract's [`ProviderKind`] name).
    pub fn name(self) -> &'static str {
        self.kind().name()
    }

    /// The server kind of an HTTP provider; `None` for an in-process one.
    pub fn of(kind: ProviderKind) -> Option<ServerKind> {
        ServerKind::ALL.into_iter().find(|k| k.kind() == kind)
    }

    /// Looks a provider name up.
    pub fn from_name(name: &str) -> Option<ServerKind> {
        ProviderKind::from_name(name).and_then(ServerKind::of)
    }

    /// The server's usual local address.
    pub fn default_base_url(self) -> &'static str {
        match self {
            ServerKind::LlamaServer | ServerKind::OpenAiCompatible => "http://127.0.0.1:8080",
            ServerKind::LmStudio => "http://127.0.0.1:1234",
            ServerKind::Vllm => "http://127.0.0.1:8000",
            ServerKind::Ollama => "http://127.0.0.1:11434",
        }
    }

    /// Path of the chat endpoint.
    pub fn chat_path(self) -> &'static str {
        match self {
            ServerKind::LmStudio => "/api/v0/chat/completions",
            _ => "/v1/chat/completions",
        }
    }

    /// Path of the raw-prompt completion endpoint.
    pub fn completion_path(self) -> &'static str {
        match self {
            ServerKind::LlamaServer => "/completion",
            ServerKind::LmStudio => "/api/v0/completions",
            _ => "/v1/completions",
        }
    }

    /// The exact launch command that enables MTP on this server, for report messages.
    ///
    /// ```
    /// use mtp_runtimes::ServerKind;
    /// let hint = ServerKind::LlamaServer.launch_hint("qwen.gguf", 3);
    /// assert!(hint.contains("--spec-type draft-mtp --spec-draft-n-max 3"));
    /// // a checkpoint folder is not something llama-server loads: the hint converts it first
    /// let dir = std::env::temp_dir();
    /// let hint = ServerKind::LlamaServer.launch_hint(dir.to_str().unwrap(), 2);
    /// assert!(hint.contains("convert_hf_to_gguf.py") && hint.contains(".gguf --spec-type draft-mtp"));
    /// ```
    pub fn launch_hint(self, model: &str, depth: u32) -> String {
        use mtp_detect::{convert_command, launch_command, Runtime};
        let cmd = |rt: Runtime| launch_command(rt, model, None, true, depth);
        let cmd_at = |gguf: &str| launch_command(Runtime::LlamaServer, gguf, None, true, depth);
        // llama-server runs a GGUF: a model named as a checkpoint folder must be converted first
        let folder = std::path::Path::new(model).is_dir();
        let gguf_hint = |what: &str| {
            let out = format!("{}.gguf", model.trim_end_matches('/'));
            format!(
                "{what} a GGUF with the MTP head (`{}`, in a llama.cpp checkout), then `{}`",
                convert_command(model, &out),
                cmd_at(&out)
            )
        };
        match self {
            ServerKind::LlamaServer if folder => {
                gguf_hint("llama-server runs GGUF files: convert the checkpoint to")
            }
            ServerKind::LlamaServer => format!(
                "restart it as `{}` (the GGUF must carry the MTP head)",
                cmd(Runtime::LlamaServer)
            ),
            ServerKind::OpenAiCompatible => format!(
                "speculation is a launch setting of the server; for llama-server use `{}`",
                cmd(Runtime::LlamaServer)
            ),
            ServerKind::LmStudio => format!(
                "load the model with MTP drafting on: `{}`",
                cmd(Runtime::LmStudio)
            ),
            ServerKind::Vllm => format!("restart it as `{}`", cmd(Runtime::Vllm)),
            ServerKind::Ollama => format!(
                "Ollama does not expose MTP drafting; serve the same GGUF with `{}` or LM Studio (`{}`) and use that provider",
                cmd(Runtime::LlamaServer),
                cmd(Runtime::LmStudio)
            ),
        }
    }
}

impl fmt::Display for ServerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An API key. Its `Debug` and `Display` print `<redacted>`; the only way to the secret is
/// [`ApiKey::expose`], used when building the `Authorization` header.
///
/// ```
/// use mtp_runtimes::ApiKey;
/// let k = ApiKey::new("sk-secret");
/// assert_eq!(format!("{k:?}"), "ApiKey(<redacted>)");
/// assert_eq!(k.expose(), "sk-secret");
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// Wraps a key.
    pub fn new(key: impl Into<String>) -> Self {
        ApiKey(key.into())
    }
    /// The secret itself.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

impl fmt::Display for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Whether to read `/metrics` around each call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricsMode {
    /// Try; stop trying once the server answers that it has no metrics endpoint.
    Auto,
    /// Always read (an unreachable endpoint only means no figures).
    On,
    /// Never read.
    Off,
}

/// Connection settings of one adapter.
///
/// Read from [`ProviderOptions`]: `base_url`, `api_key`, and these `extra` keys (all optional):
///
/// | key | default | meaning |
/// | --- | --- | --- |
/// | `connect_timeout_ms` | 5000 | TCP/TLS connect limit per attempt |
/// | `idle_timeout_ms` | 120000 | longest silence between two received chunks (per token when streaming) |
/// | `request_timeout_ms` | 600000 | longest wait for the response headers (prompt processing included) |
/// | `connect_retries` | 2 | extra attempts after a connect error (never after the request was sent) |
/// | `metrics` | `auto` for vLLM, `off` otherwise | `auto` or a flag (`on`/`off`, `true`/`false`, …): read `/metrics` around each call |
/// | `max_body_bytes` | 67108864 (64 MiB) | largest response body read whole (replies, `/props`, `/slots`, `/metrics`), and the most reply text one streamed call may gather |
/// | `max_sse_event_bytes` | 16777216 (16 MiB) | largest line, or event (its lines together), of a streamed response |
/// | `max_tool_calls` | 128 | most tool calls one reply may carry (their names and arguments count toward `max_body_bytes`) |
///
/// The strings are read by the contract's [`Extra`], the rules every lane shares; a bad one
/// is a [`ProviderError::InvalidOption`] naming the key and the value. Going over any cap is
/// a [`ProviderError::Api`] that names the URL, the cap and the option; nothing a server
/// sends is buffered beyond them.
///
/// Built typed (the fields set directly), they go to [`crate::create_with`], which checks
/// them by the same ranges ([`HttpOptions::checked`]).
///
/// ```
/// use mtp_contract::ProviderOptions;
/// use mtp_runtimes::{HttpOptions, ServerKind};
/// let o = ProviderOptions::default().base_url("http://gpu:8080/v1/").extra("idle_timeout_ms", "300");
/// let h = HttpOptions::from_provider_options(ServerKind::LlamaServer, &o).unwrap();
/// assert_eq!(h.base_url, "http://gpu:8080");
/// assert_eq!(h.idle_timeout.as_millis(), 300);
/// assert!(HttpOptions::from_provider_options(ServerKind::Vllm, &ProviderOptions::default().extra("idle", "1")).is_err());
/// ```
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// Server root, without a trailing `/` or `/v1`.
    pub base_url: String,
    /// Sent as `Authorization: Bearer …`.
    pub api_key: Option<ApiKey>,
    /// Connect limit per attempt.
    pub connect_timeout: Duration,
    /// Longest silence between received chunks.
    pub idle_timeout: Duration,
    /// Longest wait for response headers.
    pub request_timeout: Duration,
    /// Extra attempts after a connect error.
    pub connect_retries: u32,
    /// `/metrics` policy.
    pub metrics: MetricsMode,
    /// Largest response body read whole, and the most reply text one streamed call gathers.
    pub max_body_bytes: usize,
    /// Largest line, or event, of a streamed response.
    pub max_sse_event_bytes: usize,
    /// Most tool calls one reply may carry.
    pub max_tool_calls: usize,
}

/// Default of `max_body_bytes`: 64 MiB, far above any reply, `/props` or `/metrics` page.
pub const DEFAULT_MAX_BODY_BYTES: usize = 64 << 20;

/// Default of `max_sse_event_bytes`: 16 MiB, far above any one streamed chunk.
pub const DEFAULT_MAX_SSE_EVENT_BYTES: usize = crate::sse::DEFAULT_MAX_EVENT_BYTES;

/// The `extra` keys [`HttpOptions`] understands.
pub const EXTRA_KEYS: [&str; 8] = [
    "connect_timeout_ms",
    "idle_timeout_ms",
    "request_timeout_ms",
    "connect_retries",
    "metrics",
    "max_body_bytes",
    "max_sse_event_bytes",
    "max_tool_calls",
];

impl HttpOptions {
    /// Defaults for a server kind at its usual local address.
    pub fn new(kind: ServerKind) -> Self {
        HttpOptions {
            base_url: kind.default_base_url().to_string(),
            api_key: None,
            connect_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(120),
            request_timeout: Duration::from_secs(600),
            connect_retries: 2,
            metrics: if kind == ServerKind::Vllm {
                MetricsMode::Auto
            } else {
                MetricsMode::Off
            },
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_sse_event_bytes: DEFAULT_MAX_SSE_EVENT_BYTES,
            max_tool_calls: crate::tool_calls::DEFAULT_MAX_TOOL_CALLS,
        }
    }

    /// Reads the settings: `base_url` and `api_key` from their fields, the `extra` keys
    /// ([`EXTRA_KEYS`]) with the contract's [`Extra`], whose rules every lane shares (durations
    /// and caps are positive integers; `metrics` is `auto` or a flag). An unknown key or a bad
    /// value is an [`OptionError`] naming it.
    pub fn from_provider_options(
        kind: ServerKind,
        opts: &ProviderOptions,
    ) -> Result<Self, ProviderError> {
        let d = HttpOptions::new(kind);
        let x = Extra::new(kind.name(), &EXTRA_KEYS, &opts.extra)?;
        let cap = |key: &str, default: usize| -> Result<usize, OptionError> {
            Ok(match x.bytes(key, IntRange::POSITIVE)? {
                Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
                None => default,
            })
        };
        let o = HttpOptions {
            base_url: match &opts.base_url {
                Some(url) => normalize_base_url(url)?,
                None => d.base_url,
            },
            api_key: opts
                .api_key
                .as_ref()
                .filter(|k| !k.is_empty())
                .map(ApiKey::new),
            connect_timeout: x.millis("connect_timeout_ms")?.unwrap_or(d.connect_timeout),
            idle_timeout: x.millis("idle_timeout_ms")?.unwrap_or(d.idle_timeout),
            request_timeout: x.millis("request_timeout_ms")?.unwrap_or(d.request_timeout),
            connect_retries: match x.int("connect_retries", CONNECT_RETRIES)? {
                Some(n) => u32::try_from(n).unwrap_or(u32::MAX),
                None => d.connect_retries,
            },
            metrics: match x.auto_flag("metrics")? {
                None => d.metrics,
                Some(None) => MetricsMode::Auto,
                Some(Some(true)) => MetricsMode::On,
                Some(Some(false)) => MetricsMode::Off,
            },
            max_body_bytes: cap("max_body_bytes", d.max_body_bytes)?,
            max_sse_event_bytes: cap("max_sse_event_bytes", d.max_sse_event_bytes)?,
            max_tool_calls: match x.count("max_tool_calls")? {
                Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
                None => d.max_tool_calls,
            },
        };
        Ok(o)
    }

    /// Refuses typed settings outside the ranges [`HttpOptions::from_provider_options`] reads
    /// strings with (a zero timeout or cap, more than 10 retries, a base URL that is not an
    /// http(s) URL), and returns them with the base URL normalized: the typed path's checks.
    pub fn checked(mut self) -> Result<Self, ProviderError> {
        for (key, t) in [
            ("connect_timeout_ms", self.connect_timeout),
            ("idle_timeout_ms", self.idle_timeout),
            ("request_timeout_ms", self.request_timeout),
        ] {
            if t.is_zero() {
                return Err(OptionError::invalid(
                    key,
                    t.as_millis().to_string(),
                    "a positive integer of milliseconds",
                )
                .into());
            }
        }
        CONNECT_RETRIES.check("connect_retries", self.connect_retries.into())?;
        for (key, n) in [
            ("max_body_bytes", self.max_body_bytes),
            ("max_sse_event_bytes", self.max_sse_event_bytes),
            ("max_tool_calls", self.max_tool_calls),
        ] {
            IntRange::POSITIVE.check(key, n as u64)?;
        }
        self.base_url = normalize_base_url(&self.base_url)?;
        Ok(self)
    }
}

/// `connect_retries`: at most 10 extra attempts (a server that refuses ten connections in a
/// row is down).
const CONNECT_RETRIES: IntRange = IntRange::new(0, 10);

/// Checks a base URL and strips a trailing `/` and `/v1` (the adapters add the paths).
pub(crate) fn normalize_base_url(url: &str) -> Result<String, ProviderError> {
    let trimmed = url.trim();
    let parsed = reqwest::Url::parse(trimmed).map_err(|e| ProviderError::InvalidRequest {
        field: "base_url",
        message: format!("{trimmed:?} is not a URL ({e}); use e.g. http://127.0.0.1:8080"),
    })?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
        return Err(ProviderError::InvalidRequest {
            field: "base_url",
            message: format!("{trimmed:?} must be an http:// or https:// URL with a host"),
        });
    }
    let mut s = trimmed.trim_end_matches('/').to_string();
    if let Some(stripped) = s.strip_suffix("/v1") {
        s = stripped.trim_end_matches('/').to_string();
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls() {
        let cases = [
            ("http://h:1", Some("http://h:1")),
            ("http://h:1/", Some("http://h:1")),
            ("http://h:1/v1", Some("http://h:1")),
            ("https://h/api/v1/", Some("https://h/api")),
            ("  http://h:1  ", Some("http://h:1")),
            ("ftp://h", None),
            ("localhost:8080", None),
            ("", None),
        ];
        for (input, want) in cases {
            assert_eq!(normalize_base_url(input).ok().as_deref(), want, "{input:?}");
        }
    }

    #[test]
    fn extras() {
        let base = ProviderOptions::default();
        let ok = |k: &str, v: &str| {
            HttpOptions::from_provider_options(ServerKind::LlamaServer, &base.clone().extra(k, v))
        };
        assert_eq!(ok("connect_retries", "0").unwrap().connect_retries, 0);
        assert_eq!(ok("metrics", "on").unwrap().metrics, MetricsMode::On);
        assert_eq!(ok("max_body_bytes", "4096").unwrap().max_body_bytes, 4096);
        assert_eq!(ok("max_tool_calls", "3").unwrap().max_tool_calls, 3);
        assert_eq!(
            ok("max_sse_event_bytes", " 65536 ")
                .unwrap()
                .max_sse_event_bytes,
            65536
        );
        let d = HttpOptions::new(ServerKind::Ollama);
        assert_eq!(
            (d.max_body_bytes, d.max_sse_event_bytes, d.max_tool_calls),
            (64 << 20, 16 << 20, 128)
        );
        for (k, v) in [
            ("max_body_bytes", "0"),
            ("max_body_bytes", "-1"),
            ("max_body_bytes", "64MiB"),
            ("max_sse_event_bytes", ""),
            ("max_tool_calls", "0"),
            ("max_tool_calls", "many"),
            ("connect_retries", "99"),
            ("idle_timeout_ms", "0"),
            ("idle_timeout_ms", "soon"),
            ("metrics", "maybe"),
            ("device", "cuda"),
        ] {
            let err = ok(k, v).unwrap_err().to_string();
            assert!(err.contains(k), "{err}");
        }
        // every refusal is the contract's typed error, naming the key
        match ok("connect_retries", "-1") {
            Err(ProviderError::InvalidOption(e)) => assert_eq!(e.key(), "connect_retries"),
            other => panic!("{other:?}"),
        }
        let h = HttpOptions::from_provider_options(ServerKind::Vllm, &base.api_key("sk")).unwrap();
        assert_eq!(h.metrics, MetricsMode::Auto);
        assert!(!format!("{h:?}").contains("sk\""));
        assert!(format!("{h:?}").contains("<redacted>"));
    }

    /// The same strings mean what they mean in every lane (the native and gguf lanes' tests
    /// hold them to the same table): `metrics` takes any flag spelling besides `auto`, an
    /// in-process option is an unknown key here, and typed settings get the strings' ranges.
    #[test]
    fn shared_rules_hold_in_the_http_lane() {
        let read = |k: &str, v: &str| {
            HttpOptions::from_provider_options(
                ServerKind::LlamaServer,
                &ProviderOptions::default().extra(k, v),
            )
        };
        for v in ["true", "True", "1", "yes", "on"] {
            assert_eq!(read("metrics", v).unwrap().metrics, MetricsMode::On, "{v}");
        }
        for v in ["false", "0", "no", "off", "OFF"] {
            assert_eq!(read("metrics", v).unwrap().metrics, MetricsMode::Off, "{v}");
        }
        assert_eq!(read("metrics", "auto").unwrap().metrics, MetricsMode::Auto);
        for v in ["maybe", "", "2"] {
            let e = read("metrics", v).unwrap_err().to_string();
            assert!(e.contains("`metrics` must be auto or true or false"), "{e}");
        }
        for k in ["threads", "ctx_size", "flash_attn"] {
            let e = read(k, "1").unwrap_err().to_string();
            assert!(
                e.contains(&format!(
                    "unknown option `{k}` for the llama-server provider"
                )),
                "{e}"
            );
        }
        // durations and caps: positive integers, as every lane's counts
        for (k, v) in [
            ("idle_timeout_ms", "0"),
            ("max_body_bytes", "+5"),
            ("max_tool_calls", "1.0"),
        ] {
            assert!(read(k, v).is_err(), "{k}={v}");
        }
        let mut typed = HttpOptions::new(ServerKind::Vllm);
        typed.base_url = "http://h:1/v1/".into();
        assert_eq!(typed.clone().checked().unwrap().base_url, "http://h:1");
        typed.idle_timeout = Duration::ZERO;
        let Err(ProviderError::InvalidOption(e)) = typed.checked() else {
            panic!("a zero timeout was accepted")
        };
        assert_eq!(e.key(), "idle_timeout_ms");
        let mut typed = HttpOptions::new(ServerKind::Vllm);
        typed.max_body_bytes = 0;
        assert!(typed.checked().is_err());
    }
}
