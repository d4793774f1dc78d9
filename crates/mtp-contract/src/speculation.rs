//! The `speculation` request block: parsing, validation and the one function that resolves a
//! provider default against a per-request override.
//!
//! Accepted JSON forms:
//!
//! | input | meaning |
//! | --- | --- |
//! | `true` | `{"mode": "native_mtp"}` |
//! | `false` | `{"mode": "off"}` |
//! | `{"mode": "native_mtp", "drafter": "...", "num_draft_tokens": 3, "require_acceleration": true}` | any subset of the fields |
//! | `{"num_draft_tokens": "auto"}` | the depth is chosen round by round (see [`DraftDepth::Auto`]) |
//!
//! Anything else (unknown key, unknown mode, a depth of 0, negative, fractional or beyond
//! `u32`, a string other than `"auto"`) is a [`SpeculationError`] naming the key or value and
//! listing what is valid. Any positive depth is a valid block: depths above
//! [`TESTED_MAX_DRAFT_TOKENS`] are accepted (the report warns), and a runtime refuses only a
//! depth it cannot hold, naming its limit.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::reason::Reason;

/// The top of the measured range of `num_draft_tokens` (1–8: tested for output and speed).
/// Larger depths are accepted but can cost more memory and run slower; a report of a call
/// drafting deeper says so in its `message`.
pub const TESTED_MAX_DRAFT_TOKENS: u32 = 8;

/// The most proposals per round a runtime that chooses the depth itself
/// ([`DraftDepth::Auto`]) may draft: the top of the tested range.
pub const AUTO_MAX_DRAFT_TOKENS: u32 = TESTED_MAX_DRAFT_TOKENS;

/// `num_draft_tokens`: a fixed number of proposals per round, or `"auto"`.
///
/// ```
/// use mtp_contract::DraftDepth;
/// assert_eq!(DraftDepth::parse("auto").unwrap(), DraftDepth::Auto);
/// assert_eq!(DraftDepth::parse("3").unwrap(), DraftDepth::Fixed(3));
/// assert!(DraftDepth::parse("0").is_err());
/// assert_eq!(DraftDepth::Auto.to_string(), "auto");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DraftDepth {
    /// Exactly this many proposals per round (fewer only where the token budget ends first).
    Fixed(u32),
    /// The runtime picks each round's depth, from 0 (a plain target step) to
    /// [`AUTO_MAX_DRAFT_TOKENS`], from the acceptance it measures and what a round costs
    /// (in a batch, from how full the step already is). Output is the same as at any fixed
    /// depth; only speed changes. A runtime that cannot choose drafts at its fixed default and
    /// says so in the report's `message`.
    Auto,
}

impl DraftDepth {
    /// Parses `auto` or a positive depth.
    pub fn parse(s: &str) -> Result<Self, SpeculationError> {
        let t = s.trim();
        if t == "auto" {
            return Ok(DraftDepth::Auto);
        }
        let n: i128 = t.parse().map_err(|_| SpeculationError::InvalidDepth {
            value: t.to_string(),
        })?;
        validate_depth(n, t)?;
        Ok(DraftDepth::Fixed(n as u32))
    }

    /// The fixed depth, `None` for `auto`.
    pub fn fixed(self) -> Option<u32> {
        match self {
            DraftDepth::Fixed(n) => Some(n),
            DraftDepth::Auto => None,
        }
    }

    /// The block's JSON value: a number or `"auto"`.
    pub fn to_json(self) -> serde_json::Value {
        match self {
            DraftDepth::Fixed(n) => n.into(),
            DraftDepth::Auto => "auto".into(),
        }
    }
}

impl From<u32> for DraftDepth {
    fn from(n: u32) -> Self {
        DraftDepth::Fixed(n)
    }
}

impl fmt::Display for DraftDepth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DraftDepth::Fixed(n) => write!(f, "{n}"),
            DraftDepth::Auto => f.write_str("auto"),
        }
    }
}

/// The keys a speculation block may contain.
pub const VALID_KEYS: [&str; 4] = [
    "mode",
    "drafter",
    "num_draft_tokens",
    "require_acceleration",
];

/// How a request wants its tokens produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum SpeculationMode {
    /// Draft with the model's own MTP head, verify with the target (the default mode of a block).
    #[default]
    NativeMtp,
    /// Target-only decoding.
    Off,
}

impl SpeculationMode {
    /// Every accepted spelling, for error messages.
    pub const VALID: [&'static str; 2] = ["native_mtp", "off"];

    /// The wire spelling of this mode.
    pub fn as_str(self) -> &'static str {
        match self {
            SpeculationMode::NativeMtp => "native_mtp",
            SpeculationMode::Off => "off",
        }
    }

    /// Parses the wire spelling.
    ///
    /// ```
    /// use mtp_contract::SpeculationMode;
    /// assert_eq!(SpeculationMode::parse("off").unwrap(), SpeculationMode::Off);
    /// assert!(SpeculationMode::parse("eagle").is_err());
    /// ```
    pub fn parse(s: &str) -> Result<Self, SpeculationError> {
        match s {
            "native_mtp" => Ok(SpeculationMode::NativeMtp),
            "off" => Ok(SpeculationMode::Off),
            other => Err(SpeculationError::UnknownMode {
                value: other.to_string(),
            }),
        }
    }
}

impl fmt::Display for SpeculationMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A malformed speculation block. Raised immediately, before any model work.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SpeculationError {
    /// A key that is not one of [`VALID_KEYS`].
    #[error("unknown speculation key `{key}`; valid keys are mode, drafter, num_draft_tokens, require_acceleration")]
    UnknownKey {
        /// The key as given.
        key: String,
    },
    /// A mode other than `native_mtp` / `off`.
    #[error("unknown speculation mode `{value}`; valid modes are \"native_mtp\" and \"off\"")]
    UnknownMode {
        /// The mode as given.
        value: String,
    },
    /// `num_draft_tokens` not a positive integer (up to `u32::MAX`) and not `"auto"`.
    #[error("invalid num_draft_tokens {value}: it must be a positive integer (proposals per round, excluding the target's seed token; 1 to 8 are the measured range) or \"auto\"")]
    InvalidDepth {
        /// The value as given (its JSON text).
        value: String,
    },
    /// A key with a value of the wrong JSON type.
    #[error("speculation key `{key}` must be {expected}, got {got}")]
    WrongType {
        /// The key at fault.
        key: &'static str,
        /// What the key accepts.
        expected: &'static str,
        /// The JSON text that was given.
        got: String,
    },
    /// The block is neither a boolean nor an object.
    #[error("speculation must be true, false or an object with keys mode, drafter, num_draft_tokens, require_acceleration; got {got}")]
    NotABlock {
        /// The JSON text that was given.
        got: String,
    },
    /// `drafter` is an empty string.
    #[error("speculation key `drafter` must name a repo id or a path; got an empty string")]
    EmptyDrafter,
}

/// One `speculation` block, at provider or request level. Unset fields inherit from the level
/// below (request → provider default → built-in default); see [`resolve`].
///
/// ```
/// use mtp_contract::{Speculation, SpeculationMode};
/// let s: Speculation = serde_json::from_str(r#"{"num_draft_tokens": 5}"#).unwrap();
/// assert_eq!(s.num_draft_tokens, Some(5.into()));
/// assert_eq!(s.mode, None);
/// let auto: Speculation = serde_json::from_str(r#"{"num_draft_tokens": "auto"}"#).unwrap();
/// assert_eq!(auto.num_draft_tokens, Some(mtp_contract::DraftDepth::Auto));
/// let on: Speculation = serde_json::from_str("true").unwrap();
/// assert_eq!(on.mode, Some(SpeculationMode::NativeMtp));
/// assert!(serde_json::from_str::<Speculation>(r#"{"depth": 3}"#).is_err());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Speculation {
    /// `native_mtp` or `off`; `None` inherits.
    pub mode: Option<SpeculationMode>,
    /// Repo id or local path of a companion MTP drafter; `None` inherits (registry / embedded head).
    pub drafter: Option<String>,
    /// Proposals per round, excluding the target's seed token, or `auto`; `None` inherits.
    pub num_draft_tokens: Option<DraftDepth>,
    /// Fail with `SpeculationUnavailable` rather than run unaccelerated; `None` inherits.
    pub require_acceleration: Option<bool>,
}

impl Speculation {
    /// `{"mode": "native_mtp"}` (the `true` shorthand).
    pub fn native_mtp() -> Self {
        Speculation {
            mode: Some(SpeculationMode::NativeMtp),
            ..Default::default()
        }
    }

    /// `{"mode": "off"}` (the `false` shorthand).
    pub fn off() -> Self {
        Speculation {
            mode: Some(SpeculationMode::Off),
            ..Default::default()
        }
    }

    /// A block that only overrides the depth.
    ///
    /// ```
    /// let s = mtp_contract::Speculation::depth(5).unwrap();
    /// assert_eq!(s.num_draft_tokens, Some(5.into()));
    /// assert!(mtp_contract::Speculation::depth(0).is_err());
    /// ```
    pub fn depth(n: u32) -> Result<Self, SpeculationError> {
        Speculation::default().with_num_draft_tokens(n)
    }

    /// A block that only asks for the depth to be chosen round by round
    /// (`{"num_draft_tokens": "auto"}`).
    pub fn auto_depth() -> Self {
        Speculation {
            num_draft_tokens: Some(DraftDepth::Auto),
            ..Default::default()
        }
    }

    /// Sets `num_draft_tokens`, validating it: a depth (`3`, `DraftDepth::Fixed(3)`) or
    /// `DraftDepth::Auto`.
    pub fn with_num_draft_tokens(
        mut self,
        n: impl Into<DraftDepth>,
    ) -> Result<Self, SpeculationError> {
        let d = n.into();
        if let DraftDepth::Fixed(n) = d {
            validate_depth(n as i128, &n.to_string())?;
        }
        self.num_draft_tokens = Some(d);
        Ok(self)
    }

    /// Sets the drafter repo id or path.
    pub fn with_drafter(mut self, drafter: impl Into<String>) -> Result<Self, SpeculationError> {
        let d = drafter.into();
        if d.trim().is_empty() {
            return Err(SpeculationError::EmptyDrafter);
        }
        self.drafter = Some(d);
        Ok(self)
    }

    /// Sets `require_acceleration`.
    pub fn with_require_acceleration(mut self, yes: bool) -> Self {
        self.require_acceleration = Some(yes);
        self
    }

    /// Parses a block from a JSON value, with the typed errors described in the module docs.
    pub fn from_json(value: &serde_json::Value) -> Result<Self, SpeculationError> {
        use serde_json::Value;
        match value {
            Value::Bool(true) => Ok(Speculation::native_mtp()),
            Value::Bool(false) => Ok(Speculation::off()),
            Value::Object(map) => {
                let mut out = Speculation::default();
                for (key, v) in map {
                    match key.as_str() {
                        "mode" => match v {
                            Value::String(s) => out.mode = Some(SpeculationMode::parse(s)?),
                            Value::Null => {}
                            other => {
                                return Err(SpeculationError::WrongType {
                                    key: "mode",
                                    expected: "the string \"native_mtp\" or \"off\"",
                                    got: other.to_string(),
                                })
                            }
                        },
                        "drafter" => match v {
                            Value::String(s) if s.trim().is_empty() => {
                                return Err(SpeculationError::EmptyDrafter)
                            }
                            Value::String(s) => out.drafter = Some(s.clone()),
                            Value::Null => {}
                            other => {
                                return Err(SpeculationError::WrongType {
                                    key: "drafter",
                                    expected: "a repo id or path string",
                                    got: other.to_string(),
                                })
                            }
                        },
                        "num_draft_tokens" => match v {
                            Value::Number(n) => {
                                let text = n.to_string();
                                let int = n
                                    .as_i64()
                                    .map(i128::from)
                                    .or_else(|| n.as_u64().map(i128::from))
                                    .ok_or(SpeculationError::InvalidDepth {
                                        value: text.clone(),
                                    })?;
                                validate_depth(int, &text)?;
                                out.num_draft_tokens = Some(DraftDepth::Fixed(int as u32));
                            }
                            Value::String(s) if s == "auto" => {
                                out.num_draft_tokens = Some(DraftDepth::Auto)
                            }
                            Value::Null => {}
                            other => {
                                return Err(SpeculationError::InvalidDepth {
                                    value: other.to_string(),
                                })
                            }
                        },
                        "require_acceleration" => match v {
                            Value::Bool(b) => out.require_acceleration = Some(*b),
                            Value::Null => {}
                            other => {
                                return Err(SpeculationError::WrongType {
                                    key: "require_acceleration",
                                    expected: "a boolean",
                                    got: other.to_string(),
                                })
                            }
                        },
                        other => {
                            return Err(SpeculationError::UnknownKey {
                                key: other.to_string(),
                            })
                        }
                    }
                }
                Ok(out)
            }
            other => Err(SpeculationError::NotABlock {
                got: other.to_string(),
            }),
        }
    }

    /// The block as JSON, with only the fields that are set.
    pub fn to_json(&self) -> serde_json::Value {
        let mut map = serde_json::Map::new();
        if let Some(m) = self.mode {
            map.insert("mode".into(), m.as_str().into());
        }
        if let Some(d) = &self.drafter {
            map.insert("drafter".into(), d.clone().into());
        }
        if let Some(n) = self.num_draft_tokens {
            map.insert("num_draft_tokens".into(), n.to_json());
        }
        if let Some(r) = self.require_acceleration {
            map.insert("require_acceleration".into(), r.into());
        }
        serde_json::Value::Object(map)
    }
}

impl From<bool> for Speculation {
    fn from(on: bool) -> Self {
        if on {
            Speculation::native_mtp()
        } else {
            Speculation::off()
        }
    }
}

impl std::str::FromStr for Speculation {
    type Err = SpeculationError;

    /// Parses `true`, `false`, a mode name, or a JSON object.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        match t {
            "true" | "on" => return Ok(Speculation::native_mtp()),
            "false" => return Ok(Speculation::off()),
            _ => {}
        }
        if t.starts_with('{') {
            let v: serde_json::Value =
                serde_json::from_str(t).map_err(|e| SpeculationError::NotABlock {
                    got: format!("{t} ({e})"),
                })?;
            return Speculation::from_json(&v);
        }
        Ok(Speculation {
            mode: Some(SpeculationMode::parse(t)?),
            ..Default::default()
        })
    }
}

fn validate_depth(n: i128, text: &str) -> Result<(), SpeculationError> {
    if n < 1 || n > u32::MAX as i128 {
        return Err(SpeculationError::InvalidDepth {
            value: text.to_string(),
        });
    }
    Ok(())
}

impl Serialize for Speculation {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.to_json().serialize(s)
    }
}

impl<'de> Deserialize<'de> for Speculation {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = serde_json::Value::deserialize(d)?;
        Speculation::from_json(&v).map_err(serde::de::Error::custom)
    }
}

/// Where the effective value of a setting came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// The request's own block.
    Request,
    /// The provider's construction-time block.
    ProviderDefault,
    /// Neither said anything: the built-in default.
    BuiltIn,
}

/// Which level decided the depth a call drafts at (`depth_source` in the report). The
/// resolution order is the order of the variants: the request's block, the provider's block,
/// the drafter's own config (a companion's `block_size` counts the seed token, so it proposes
/// `block_size - 1`), the registry's `default_depth`, then the built-in 3.
///
/// ```
/// use mtp_contract::DepthSource;
/// assert_eq!(serde_json::to_value(DepthSource::DrafterConfig).unwrap(), "drafter_config");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DepthSource {
    /// The request's `num_draft_tokens`.
    Request,
    /// The provider's construction-time block (`--speculation`, provider options).
    Provider,
    /// The drafter's config (`block_size - 1`).
    DrafterConfig,
    /// The model registry's `default_depth` for the pairing.
    Registry,
    /// None of the above: [`BUILTIN_DEPTH`].
    BuiltIn,
}

/// The depth when neither the request, the provider, the drafter's config nor the registry
/// names one.
pub const BUILTIN_DEPTH: u32 = 3;

/// The effective speculation settings for one request, produced by [`resolve`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedSpeculation {
    /// Whether acceleration is asked for (mode `native_mtp`).
    pub requested: bool,
    /// The effective mode.
    pub mode: SpeculationMode,
    /// Where `mode` came from.
    pub mode_source: Source,
    /// The drafter named explicitly (request or provider); `None` means "embedded head or registry".
    pub drafter: Option<String>,
    /// The fixed depth named explicitly; `None` means "the drafter's or registry's default"
    /// (and, with `auto_depth`, the depth a runtime that cannot choose falls back to).
    pub num_draft_tokens: Option<u32>,
    /// `num_draft_tokens: "auto"` won: the runtime picks each round's depth, up to
    /// [`AUTO_MAX_DRAFT_TOKENS`].
    pub auto_depth: bool,
    /// Which block set `num_draft_tokens` (or `"auto"`): [`DepthSource::Request`] or
    /// [`DepthSource::Provider`]; `None` when neither did and the drafter's default applies.
    pub depth_source: Option<DepthSource>,
    /// Refuse to run unaccelerated.
    pub require_acceleration: bool,
}

impl ResolvedSpeculation {
    /// The reason to report when speculation is off by choice, `None` when it was requested:
    /// `disabled_by_request` when someone turned it off (the request, or the provider's own
    /// setting, e.g. `--speculation off`), `disabled_by_default` when nobody asked for it.
    pub fn disabled_reason(&self) -> Option<Reason> {
        match (self.requested, self.mode_source) {
            (true, _) => None,
            (false, Source::Request | Source::ProviderDefault) => Some(Reason::DisabledByRequest),
            (false, Source::BuiltIn) => Some(Reason::DisabledByDefault),
        }
    }

    /// The effective fixed depth given the default the runtime would use (under `auto_depth`,
    /// that default: what a runtime that cannot choose drafts at).
    pub fn depth_or(&self, default_depth: u32) -> u32 {
        self.num_draft_tokens.unwrap_or(default_depth)
    }

    /// [`ResolvedSpeculation::depth_or`] with the level that decided it: the request's or the
    /// provider's block, else the drafter default's own source.
    pub fn depth_and_source(
        &self,
        default_depth: u32,
        default_source: DepthSource,
    ) -> (u32, DepthSource) {
        match (self.num_draft_tokens, self.depth_source) {
            (Some(n), Some(src)) => (n, src),
            (Some(n), None) => (n, DepthSource::Request),
            // (`"auto"`: the block that asked for it decided)
            (None, src) => (default_depth, src.unwrap_or(default_source)),
        }
    }
}

/// Resolves the provider default and a per-request override into effective settings.
///
/// Precedence, field by field (documented in `docs/speculation.md`):
///
/// | field | request sets it | else provider default sets it | else |
/// | --- | --- | --- | --- |
/// | `mode` | request | provider | `native_mtp` if either level gave a block, else `off` |
/// | `drafter` | request | provider | embedded head, then registry companion |
/// | `num_draft_tokens` (a number or `"auto"`) | request | provider | drafter config, then registry `default_depth`, then 3 ([`DepthSource`]) |
/// | `require_acceleration` | request | provider | `false` |
///
/// The override lives only for the request it came with: the next request resolves against
/// the unchanged provider default again.
///
/// ```
/// use mtp_contract::{resolve, Speculation, Reason};
/// let default = Speculation::native_mtp().with_num_draft_tokens(3).unwrap();
/// let r = resolve(Some(&default), Some(&Speculation::depth(5).unwrap()));
/// assert!(r.requested);
/// assert_eq!(r.num_draft_tokens, Some(5));
/// let r = resolve(Some(&default), Some(&Speculation::auto_depth()));
/// assert!(r.auto_depth && r.num_draft_tokens.is_none());
/// let r = resolve(Some(&default), Some(&false.into()));
/// assert_eq!(r.disabled_reason(), Some(Reason::DisabledByRequest));
/// let r = resolve(None, None);
/// assert_eq!(r.disabled_reason(), Some(Reason::DisabledByDefault));
/// ```
pub fn resolve(
    provider_default: Option<&Speculation>,
    request: Option<&Speculation>,
) -> ResolvedSpeculation {
    let pick = |f: &dyn Fn(&Speculation) -> bool| -> Source {
        if request.is_some_and(f) {
            Source::Request
        } else if provider_default.is_some_and(f) {
            Source::ProviderDefault
        } else {
            Source::BuiltIn
        }
    };
    let mode_source = pick(&|s| s.mode.is_some());
    let mode = match mode_source {
        Source::Request => request.and_then(|s| s.mode),
        Source::ProviderDefault => provider_default.and_then(|s| s.mode),
        Source::BuiltIn => None,
    }
    .unwrap_or(if provider_default.is_some() || request.is_some() {
        SpeculationMode::NativeMtp
    } else {
        SpeculationMode::Off
    });
    // A block with no mode but other fields counts as a block at its level.
    let mode_source = if mode_source == Source::BuiltIn {
        if request.is_some() {
            Source::Request
        } else if provider_default.is_some() {
            Source::ProviderDefault
        } else {
            Source::BuiltIn
        }
    } else {
        mode_source
    };
    let layered = |get: &dyn Fn(&Speculation) -> Option<String>| {
        request
            .and_then(get)
            .or_else(|| provider_default.and_then(get))
    };
    let (depth, depth_source) = match (
        request.and_then(|s| s.num_draft_tokens),
        provider_default.and_then(|s| s.num_draft_tokens),
    ) {
        (Some(d), _) => (Some(d), Some(DepthSource::Request)),
        (None, Some(d)) => (Some(d), Some(DepthSource::Provider)),
        (None, None) => (None, None),
    };
    ResolvedSpeculation {
        requested: mode == SpeculationMode::NativeMtp,
        mode,
        mode_source,
        drafter: layered(&|s| s.drafter.clone()),
        num_draft_tokens: depth.and_then(DraftDepth::fixed),
        auto_depth: depth == Some(DraftDepth::Auto),
        depth_source,
        require_acceleration: request
            .and_then(|s| s.require_acceleration)
            .or_else(|| provider_default.and_then(|s| s.require_acceleration))
            .unwrap_or(false),
    }
}
