//! The named reasons a request ran without speculation. Each code lives here once.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Why `used` is false in a [`SpeculationReport`](crate::SpeculationReport). Stable snake_case
/// on the wire.
///
/// ```
/// use mtp_contract::Reason;
/// assert_eq!(serde_json::to_string(&Reason::MtpHeadNotCached).unwrap(), "\"mtp_head_not_cached\"");
/// assert_eq!(Reason::parse("server_side"), Some(Reason::ServerSide));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// Speculation was turned off explicitly: by the request (`false` or `{"mode":"off"}`), or
    /// by the provider's own setting (created with `{"mode":"off"}`, `--speculation off`).
    DisabledByRequest,
    /// Nobody asked for speculation: neither the request nor the provider gave a block.
    DisabledByDefault,
    /// The request asked for speculation, but the provider was started with it off, so no MTP
    /// lane was loaded; a request cannot load one.
    LaneNotLoaded,
    /// The artifact carries no MTP head and no companion drafter is known.
    NoMtpHead,
    /// The companion drafter exists but is not in the local cache.
    MtpHeadNotCached,
    /// The named drafter does not fit the target (type, hidden size, vocabulary or tensors).
    DrafterMismatch,
    /// The request names a drafter other than the one this provider loaded; a request cannot
    /// switch drafters (start the provider with that drafter instead).
    DrafterNotLoaded,
    /// The runtime cannot execute this head (architecture or build without an MTP graph).
    RuntimeUnsupported,
    /// Speculation is configured on the server, not per request, and the server showed none.
    ServerSide,
    /// Penalties or logit bias need target-only decoding.
    SamplingRequiresTargetOnly,
    /// The runtime returned no evidence either way (a server that reports no draft counters).
    NotReported,
}

impl Reason {
    /// Every reason, in declaration order.
    pub const ALL: [Reason; 11] = [
        Reason::DisabledByRequest,
        Reason::DisabledByDefault,
        Reason::LaneNotLoaded,
        Reason::NoMtpHead,
        Reason::MtpHeadNotCached,
        Reason::DrafterMismatch,
        Reason::DrafterNotLoaded,
        Reason::RuntimeUnsupported,
        Reason::ServerSide,
        Reason::SamplingRequiresTargetOnly,
        Reason::NotReported,
    ];

    /// The wire code.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::DisabledByRequest => "disabled_by_request",
            Reason::DisabledByDefault => "disabled_by_default",
            Reason::LaneNotLoaded => "lane_not_loaded",
            Reason::NoMtpHead => "no_mtp_head",
            Reason::MtpHeadNotCached => "mtp_head_not_cached",
            Reason::DrafterMismatch => "drafter_mismatch",
            Reason::DrafterNotLoaded => "drafter_not_loaded",
            Reason::RuntimeUnsupported => "runtime_unsupported",
            Reason::ServerSide => "server_side",
            Reason::SamplingRequiresTargetOnly => "sampling_requires_target_only",
            Reason::NotReported => "not_reported",
        }
    }

    /// Parses a wire code.
    pub fn parse(code: &str) -> Option<Reason> {
        Reason::ALL.into_iter().find(|r| r.as_str() == code)
    }

    /// A default sentence for this reason, used when the runtime has nothing more specific.
    pub fn default_message(self) -> &'static str {
        match self {
            Reason::DisabledByRequest => {
                "MTP acceleration off: speculation was turned off (this request's `speculation`, or the provider's own setting, e.g. `--speculation off`)."
            }
            Reason::DisabledByDefault => {
                "MTP acceleration off: speculation was not requested; pass speculation={\"mode\":\"native_mtp\"} (or --speculation native_mtp)."
            }
            Reason::LaneNotLoaded => {
                "MTP acceleration off: this provider was started with speculation off, so no MTP lane was loaded; start it with speculation on (--speculation native_mtp) to use MTP."
            }
            Reason::NoMtpHead => {
                "MTP acceleration off: the model's weights carry no MTP head and no companion drafter is known; name one with `drafter`."
            }
            Reason::MtpHeadNotCached => {
                "MTP acceleration off: the companion MTP drafter is not downloaded."
            }
            Reason::DrafterMismatch => {
                "MTP acceleration off: the drafter does not match the target model."
            }
            Reason::DrafterNotLoaded => {
                "MTP acceleration off: the request names a drafter other than the one this provider loaded; a request cannot switch drafters: start the provider with that drafter (--drafter), or leave `drafter` out of the request."
            }
            Reason::RuntimeUnsupported => {
                "MTP acceleration off: this runtime cannot execute the model's MTP head."
            }
            Reason::ServerSide => {
                "MTP is configured when the server starts, not per request, and this server showed no drafting."
            }
            Reason::SamplingRequiresTargetOnly => {
                "MTP acceleration off: presence/frequency/repetition penalties and logit bias need target-only decoding."
            }
            Reason::NotReported => {
                "The runtime reported no draft statistics, so whether speculation ran is unknown."
            }
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
