//! What a server shows about speculation, and the report built from it.
//!
//! Two kinds of evidence exist:
//! - [`ServerSpec`]: the launch settings (llama-server `/props`, the presence of vLLM's
//!   speculative counters on `/metrics`), which tell whether an MTP lane exists;
//! - [`Evidence`]: the draft counts of one call, per request where the server reports them,
//!   else deltas of `/metrics` counters around the call (marked approximate).
//!
//! `used` is true only when the evidence shows proposals for this call.

use mtp_contract::{DraftKind, ResolvedSpeculation, SpeculationReport, Timings};
use mtp_openai as oa;
use serde::Deserialize;
use serde_json::Value;

use crate::options::ServerKind;
use crate::prometheus::Metrics;
use crate::wire::Accum;

/// The MTP speculative type name in llama-server (`--spec-type draft-mtp`).
pub const LLAMA_MTP_TYPE: &str = "draft-mtp";

/// Launch-time speculation settings a server showed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServerSpec {
    /// llama-server's speculative types (`none`, `draft-mtp`, …), when `/props` lists them.
    pub types: Option<Vec<String>>,
    /// Maximum proposals per round, when the server shows it.
    pub n_max: Option<u32>,
    /// `Some(true)`: an MTP lane is configured; `Some(false)`: the server shows none;
    /// `None`: the server does not say.
    pub lane: Option<bool>,
    /// The server's build, e.g. `b11434-abc1234`.
    pub build: Option<String>,
    /// Where the settings were read (for messages), e.g. `/props speculative.types = none`.
    pub detail: Option<String>,
    /// The model file the server loaded (llama-server `/props` `model_path`), which a launch
    /// hint names.
    pub model_path: Option<String>,
}

impl ServerSpec {
    /// Reads llama-server's `/props` JSON: `default_generation_settings.params` holds
    /// `speculative.types` (a comma-separated list in current builds) or the older
    /// `speculative.type`, and older builds also `speculative.n_max`.
    ///
    /// ```
    /// use mtp_runtimes::ServerSpec;
    /// let props = serde_json::json!({"build_info": "b11434-abc",
    ///     "default_generation_settings": {"params": {"speculative.types": "draft-mtp"}}});
    /// let s = ServerSpec::from_llama_props(&props);
    /// assert_eq!(s.lane, Some(true));
    /// assert_eq!(s.build.as_deref(), Some("b11434-abc"));
    /// ```
    pub fn from_llama_props(props: &Value) -> ServerSpec {
        let props = oa::Props::deserialize(props).unwrap_or_default();
        let params = props.speculative_params();
        let (key, types) = match params.and_then(oa::SpeculativeParams::types) {
            Some((key, t)) => (key, Some(t)),
            None => ("", None),
        };
        let n_max = params
            .and_then(|p| p.n_max.flatten())
            .and_then(|n| u32::try_from(n).ok());
        let lane = types
            .as_ref()
            .map(|t| t.iter().any(|x| x == LLAMA_MTP_TYPE));
        let detail = types
            .as_ref()
            .map(|t| format!("/props {key} = {}", t.join(",")));
        ServerSpec {
            types,
            n_max,
            lane,
            build: props.build_info,
            detail,
            model_path: props.model_path.filter(|p| !p.is_empty()),
        }
    }

    /// Reads llama-server's `/slots` JSON: each slot says `"speculative": true` when the server
    /// built a speculative context for it (a drafter was loaded at launch). b11434 exposes
    /// this where `/props` cannot (its `default_generation_settings` come from the sampling
    /// defaults only, so they say `speculative.types = none` on every server). `None` when the
    /// body has no slots with that key (an older build, or `--no-slots`).
    ///
    /// ```
    /// use mtp_runtimes::ServerSpec;
    /// let slots = serde_json::json!([{"id": 0, "n_ctx": 1024, "speculative": true}]);
    /// assert_eq!(ServerSpec::lane_from_llama_slots(&slots), Some(true));
    /// assert_eq!(ServerSpec::lane_from_llama_slots(&serde_json::json!([{"id": 0}])), None);
    /// ```
    pub fn lane_from_llama_slots(slots: &Value) -> Option<bool> {
        let slots = Vec::<oa::Field<oa::Slot>>::deserialize(slots).ok()?;
        let flags: Vec<bool> = slots.iter().filter_map(|s| s.ok()?.speculative).collect();
        (!flags.is_empty()).then(|| flags.iter().any(|f| *f))
    }

    /// The speculative types include something other than `none` but not MTP.
    pub(crate) fn non_mtp_drafter(&self) -> bool {
        self.types.as_ref().is_some_and(|t| {
            !t.iter().any(|x| x == LLAMA_MTP_TYPE) && t.iter().any(|x| x != "none")
        })
    }
}

/// Draft counts of one call.
#[derive(Debug, Clone, PartialEq)]
pub struct Evidence {
    /// Proposals made.
    pub drafted: u64,
    /// Proposals accepted.
    pub accepted: u64,
    /// Draft/verify rounds, when known.
    pub rounds: Option<u64>,
    /// Accepted count per draft position 1..k, when known.
    pub accepted_per_position: Option<Vec<u64>>,
    /// Proposals per round, when known.
    pub depth: Option<u32>,
    /// Deltas of server-wide counters: other traffic in the window is counted too.
    pub approximate: bool,
    /// Where the figures came from, for messages.
    pub source: &'static str,
}

/// Per-request evidence in a response, in order of precision: vLLM's
/// `metrics.speculative_decoding`, LM Studio's draft counters, llama-server's `timings`.
pub(crate) fn per_request(kind: ServerKind, acc: &Accum, spec: &ServerSpec) -> Option<Evidence> {
    if let Some(m) = &acc.vllm_spec {
        return vllm_request_metrics(m);
    }
    let stats = acc.stats.as_ref();
    let usage = acc.usage_drafts.as_ref();
    if let Some(e) = lmstudio_counters(
        stats.and_then(|s| s.total_draft_tokens_count),
        stats.and_then(|s| s.accepted_draft_tokens_count),
    )
    .or_else(|| {
        lmstudio_counters(
            usage.and_then(|u| u.total_draft_tokens_count),
            usage.and_then(|u| u.accepted_draft_tokens_count),
        )
    }) {
        return Some(e);
    }
    let t = acc.timings.as_ref()?;
    match (t.draft_n, t.draft_n_accepted) {
        (Some(drafted), accepted) => Some(Evidence {
            drafted,
            accepted: accepted.unwrap_or(0),
            rounds: None,
            accepted_per_position: None,
            depth: None,
            approximate: false,
            source: "timings.draft_n",
        }),
        // llama-server writes draft_n only when it is above zero; a build whose /props names
        // its speculative types is one of those, so silence there means no proposals.
        (None, _)
            if matches!(kind, ServerKind::LlamaServer | ServerKind::OpenAiCompatible)
                && spec.types.is_some() =>
        {
            Some(Evidence {
                drafted: 0,
                accepted: 0,
                rounds: None,
                accepted_per_position: None,
                depth: None,
                approximate: false,
                source: "timings (no draft_n)",
            })
        }
        _ => None,
    }
}

/// vLLM `--per-request-spec-decode-metrics`: `num_draft_tokens`, `num_accepted_draft_tokens`,
/// `num_spec_steps`, `num_spec_tokens`, `acceptance_histogram[j]` = steps that accepted
/// exactly `j` proposals.
fn vllm_request_metrics(m: &oa::SpecDecodeMetrics) -> Option<Evidence> {
    let drafted = m.num_draft_tokens?;
    let accepted = m.num_accepted_draft_tokens.unwrap_or(0);
    let per_pos = m.acceptance_histogram.as_ref().map(|h| {
        // position p (0-based) was accepted in every step that accepted more than p.
        (0..h.len().saturating_sub(1))
            .map(|p| h[p + 1..].iter().sum())
            .collect::<Vec<u64>>()
    });
    Some(Evidence {
        drafted,
        accepted,
        rounds: m.num_spec_steps,
        accepted_per_position: per_pos,
        depth: m.num_spec_tokens.and_then(|n| u32::try_from(n).ok()),
        approximate: false,
        source: "metrics.speculative_decoding",
    })
}

/// LM Studio's `total_draft_tokens_count` / `accepted_draft_tokens_count` (in `stats` or in
/// `usage`).
fn lmstudio_counters(total: Option<u64>, accepted: Option<u64>) -> Option<Evidence> {
    let drafted = total?;
    let accepted = accepted.unwrap_or(0);
    Some(Evidence {
        drafted,
        accepted,
        rounds: None,
        accepted_per_position: None,
        depth: None,
        approximate: false,
        source: "draft token counters",
    })
}

/// The counter names a server exposes on `/metrics`: (drafts, draft tokens, accepted tokens,
/// accepted per position).
pub(crate) fn metric_names(kind: ServerKind) -> [&'static str; 4] {
    match kind {
        ServerKind::Vllm => [
            "vllm:spec_decode_num_drafts",
            "vllm:spec_decode_num_draft_tokens",
            "vllm:spec_decode_num_accepted_tokens",
            "vllm:spec_decode_num_accepted_tokens_per_pos",
        ],
        _ => [
            "llamacpp:spec_decode_num_drafts",
            "llamacpp:spec_decode_num_draft_tokens",
            "llamacpp:spec_decode_num_accepted_tokens",
            "llamacpp:spec_decode_num_accepted_tokens_per_pos",
        ],
    }
}

/// Whether `/metrics` shows a speculative lane: vLLM registers its `spec_decode` counters only
/// when a `speculative_config` is set; llama-server's counters count any drafter.
pub(crate) fn lane_from_metrics(kind: ServerKind, m: &Metrics) -> Option<bool> {
    match kind {
        ServerKind::Vllm => Some(m.has_prefix("vllm:spec_decode")),
        _ => {
            let drafted = m.counter(metric_names(kind)[1])?;
            (drafted > 0.0).then_some(true)
        }
    }
}

/// Evidence from two scrapes around a call.
pub(crate) fn metrics_delta(
    kind: ServerKind,
    before: &Metrics,
    after: &Metrics,
) -> Option<Evidence> {
    let [drafts, tokens, accepted, per_pos] = metric_names(kind);
    let d = |name: &str| -> Option<u64> {
        let a = after.counter(name)?;
        let b = before.counter(name).unwrap_or(0.0);
        Some((a - b).max(0.0).round() as u64)
    };
    let drafted = d(tokens)?;
    let rounds = d(drafts);
    let pa = after.per_position(per_pos);
    let pb = before.per_position(per_pos);
    let per = (!pa.is_empty()).then(|| {
        pa.iter()
            .enumerate()
            .map(|(i, a)| (a - pb.get(i).copied().unwrap_or(0.0)).max(0.0).round() as u64)
            .collect::<Vec<u64>>()
    });
    let depth = match rounds {
        Some(r) if r > 0 => u32::try_from(drafted / r).ok(),
        _ => None,
    };
    Some(Evidence {
        drafted,
        accepted: d(accepted).unwrap_or(0),
        rounds,
        accepted_per_position: per,
        depth,
        approximate: true,
        source: "/metrics counter deltas",
    })
}

/// The runtime name for reports: the provider name and, when known, the server build.
pub(crate) fn runtime_name(kind: ServerKind, spec: &ServerSpec) -> String {
    match &spec.build {
        Some(b) => format!("{} {b}", kind.name()),
        None => kind.name().to_string(),
    }
}

/// Builds `metadata.speculation` from what the server showed.
pub(crate) fn build_report(
    kind: ServerKind,
    model: &str,
    resolved: &ResolvedSpeculation,
    spec: &ServerSpec,
    evidence: Option<&Evidence>,
) -> SpeculationReport {
    let runtime = runtime_name(kind, spec);
    let depth_hint = resolved.num_draft_tokens.or(spec.n_max).unwrap_or(3);
    let hint = kind.launch_hint(model, depth_hint);
    let off_reason = resolved.disabled_reason();

    if kind == ServerKind::Ollama {
        return match off_reason {
            Some(r) => SpeculationReport::not_used(resolved, runtime, r, None),
            None => SpeculationReport::not_used(
                resolved,
                runtime,
                mtp_contract::Reason::RuntimeUnsupported,
                Some(format!("MTP acceleration off: {hint}.")),
            ),
        };
    }

    match evidence {
        Some(e) if e.drafted > 0 => {
            let drafter = if kind == ServerKind::Vllm {
                "server speculative_config".to_string()
            } else if let (ServerKind::LmStudio, Some(d)) = (kind, resolved.drafter.as_ref()) {
                d.clone() // sent as `draft_model`
            } else if spec.lane == Some(true) {
                "embedded (server draft-mtp)".to_string()
            } else {
                "server-configured".to_string()
            };
            let mut r = SpeculationReport::not_used(
                resolved,
                runtime,
                mtp_contract::Reason::NotReported,
                None,
            );
            r.used = true;
            r.drafter = Some(drafter);
            let server_depth = e.depth.or(spec.n_max);
            r.num_draft_tokens = server_depth.or(resolved.num_draft_tokens);
            if server_depth.is_some() {
                // the server's own launch depth: no level of ours decided it
                r.depth_source = None;
            }
            r.draft_kind = (!spec.non_mtp_drafter()).then_some(DraftKind::Mtp);
            // what the registry knows of this model with its MTP head (`false` where a
            // divergence was seen); a server drafting with another kind of drafter is not that
            // pairing
            r.output_preserving = r
                .draft_kind
                .and_then(|_| mtp_detect::RegistryView::lookup(model))
                .and_then(|v| v.output_preserving);
            r.drafted = Some(e.drafted);
            r.accepted = Some(e.accepted);
            r.rounds = e.rounds;
            r.acceptance_rate = Some(e.accepted as f64 / e.drafted as f64);
            r.accepted_per_position = e.accepted_per_position.clone();
            r.reason = None;
            let mut notes = Vec::new();
            if e.approximate {
                notes.push(format!(
                    "figures are {} around this call: approximate when other requests ran on the server at the same time",
                    e.source
                ));
            }
            if spec.non_mtp_drafter() {
                notes.push(format!(
                    "the server drafts with {} rather than an MTP head",
                    spec.types.as_deref().unwrap_or_default().join(",")
                ));
            }
            if resolved.auto_depth {
                notes.push(SpeculationReport::auto_depth_not_chosen(r.num_draft_tokens));
            }
            if off_reason.is_some() {
                notes.push(format!(
                    "speculation was off for this call, but the {kind} server drafts for every request: its drafter is a launch setting; to measure without MTP, restart it without its speculative setting"
                ));
            }
            r.message = (!notes.is_empty()).then(|| capitalize(&notes.join("; ")) + ".");
            r
        }
        _ if off_reason.is_some() => {
            let reason = off_reason.unwrap_or(mtp_contract::Reason::DisabledByDefault);
            let mut r = SpeculationReport::not_used(resolved, runtime, reason, None);
            if evidence.is_none() && spec.lane != Some(false) && kind != ServerKind::LlamaServer {
                r.message = Some(format!(
                    "{} Note: the {kind} server's drafter is a launch setting this request cannot switch off, and it reported no draft figures for this call.",
                    reason.default_message()
                ));
            }
            r
        }
        Some(e) => {
            let message = if spec.lane == Some(true) {
                format!(
                    "MTP acceleration off for this call: the {kind} server has an MTP lane but made no proposals ({}); short outputs or a per-request depth of 0 do this.",
                    e.source
                )
            } else {
                format!(
                    "MTP acceleration off: the {kind} server made no proposals for this call{}. MTP is set when the server starts, not per request: {hint}.",
                    spec.detail.as_ref().map(|d| format!(" ({d})")).unwrap_or_default()
                )
            };
            SpeculationReport::not_used(
                resolved,
                runtime,
                mtp_contract::Reason::ServerSide,
                Some(message),
            )
        }
        None if spec.lane == Some(false) => SpeculationReport::not_used(
            resolved,
            runtime,
            mtp_contract::Reason::ServerSide,
            Some(format!(
                "MTP acceleration off: the {kind} server shows no MTP lane{}. MTP is set when the server starts, not per request: {hint}.",
                spec.detail.as_ref().map(|d| format!(" ({d})")).unwrap_or_default()
            )),
        ),
        None if spec.lane == Some(true) => SpeculationReport::not_used(
            resolved,
            runtime,
            mtp_contract::Reason::NotReported,
            Some(format!(
                "The {kind} server has an MTP lane but reported no draft statistics for this call, so whether it drafted is unknown."
            )),
        ),
        None => SpeculationReport::not_used(
            resolved,
            runtime,
            mtp_contract::Reason::NotReported,
            Some(format!(
                "The {kind} server reported no draft statistics for this call, so whether MTP ran is unknown. If it was not launched with MTP, {hint}."
            )),
        ),
    }
}

/// The message for `SpeculationUnavailable` when `require_acceleration` meets a server that
/// shows no MTP lane.
pub(crate) fn unavailable_message(
    kind: ServerKind,
    server: &str,
    model: &str,
    resolved: &ResolvedSpeculation,
    spec: &ServerSpec,
) -> String {
    // the file the server runs, when it says; never a safetensors folder for llama-server
    let model = match (kind, &spec.model_path) {
        (ServerKind::LlamaServer | ServerKind::OpenAiCompatible, Some(p)) => p.as_str(),
        _ => model,
    };
    let hint = kind.launch_hint(model, resolved.num_draft_tokens.or(spec.n_max).unwrap_or(3));
    let shown = match (spec.lane, &spec.detail) {
        (Some(false), Some(d)) => format!("shows no MTP lane ({d})"),
        (Some(false), None) => "shows no MTP lane".to_string(),
        _ => match kind {
            ServerKind::LmStudio => {
                "does not show its speculative settings over HTTP, so an MTP lane cannot be confirmed before generating".to_string()
            }
            ServerKind::Vllm => {
                "could not be checked for an MTP lane (its /metrics page was unavailable; keep metrics on)".to_string()
            }
            _ => "does not show its speculative settings (neither /props speculative.types nor /slots speculative)".to_string(),
        },
    };
    match kind {
        ServerKind::Ollama => format!("MTP acceleration is impossible: {hint}."),
        _ => format!("the {kind} server at {server} {shown}; {hint}."),
    }
}

/// Timing figures from llama-server `timings` and LM Studio `stats`.
pub(crate) fn timings(acc: &Accum) -> Timings {
    let mut t = Timings::default();
    if let Some(v) = &acc.timings {
        t.prefill_ms = v.prompt_ms;
        t.prefill_tokens_per_s = v.prompt_per_second;
        t.decode_ms = v.predicted_ms;
        t.decode_tokens_per_s = v.predicted_per_second;
    }
    if let Some(s) = &acc.stats {
        t.time_to_first_token_ms = s.time_to_first_token.map(|x| x * 1000.0);
        t.decode_ms = t
            .decode_ms
            .or_else(|| s.generation_time.map(|x| x * 1000.0));
        t.decode_tokens_per_s = t.decode_tokens_per_s.or(s.tokens_per_second);
    }
    t
}

fn capitalize(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().collect::<String>() + c.as_str(),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mtp_contract::{resolve, Reason, Speculation};
    use serde_json::json;

    /// vLLM's `metrics.speculative_decoding` as the answer holds it.
    fn metrics(v: Value) -> oa::SpecDecodeMetrics {
        serde_json::from_value(v).unwrap()
    }

    fn acc_with(v: Value) -> Accum {
        let mut a = Accum::default();
        a.absorb(&v).unwrap();
        a
    }

    #[test]
    fn props_shapes() {
        let cases = [
            (
                json!({"default_generation_settings":{"params":{"speculative.types":"none"}}}),
                Some(false),
                None,
            ),
            (
                json!({"default_generation_settings":{"params":{"speculative.types":"ngram-simple,draft-mtp"}}}),
                Some(true),
                None,
            ),
            (
                json!({"default_generation_settings":{"params":{"speculative.type":"draft-mtp","speculative.n_max":4}}}),
                Some(true),
                Some(4),
            ),
            (
                json!({"default_generation_settings":{"n_ctx":4096}}),
                None,
                None,
            ),
            (json!({}), None, None),
        ];
        for (props, lane, n_max) in cases {
            let s = ServerSpec::from_llama_props(&props);
            assert_eq!((s.lane, s.n_max), (lane, n_max), "{props}");
        }
        let s = ServerSpec::from_llama_props(
            &json!({"default_generation_settings":{"params":{"speculative.types":"draft-simple"}}}),
        );
        assert!(s.non_mtp_drafter());
    }

    #[test]
    fn vllm_histogram_to_positions() {
        let e = vllm_request_metrics(&metrics(json!({
            "mean_acceptance_length": 1.23, "draft_acceptance_rate": 0.0775,
            "acceptance_histogram": [39, 1, 0, 3], "num_spec_steps": 43,
            "num_accepted_draft_tokens": 10, "num_draft_tokens": 129, "num_spec_tokens": 3
        })))
        .unwrap();
        assert_eq!(e.accepted_per_position, Some(vec![4, 3, 3]));
        assert_eq!(
            e.accepted_per_position
                .as_ref()
                .map(|v| v.iter().sum::<u64>()),
            Some(10)
        );
        assert_eq!(
            (e.drafted, e.accepted, e.rounds, e.depth),
            (129, 10, Some(43), Some(3))
        );
    }

    /// (kind, request, server spec, response, used, reason, message must contain)
    type Case<'a> = (
        ServerKind,
        &'a Speculation,
        &'a ServerSpec,
        &'a Accum,
        bool,
        Option<Reason>,
        &'a str,
    );

    #[test]
    fn report_table() {
        let on = Speculation::native_mtp();
        let off = Speculation::off();
        let mtp = ServerSpec {
            types: Some(vec!["draft-mtp".into()]),
            lane: Some(true),
            ..Default::default()
        };
        let none = ServerSpec {
            types: Some(vec!["none".into()]),
            lane: Some(false),
            detail: Some("/props speculative.types = none".into()),
            ..Default::default()
        };
        let unknown = ServerSpec::default();
        let drafted =
            acc_with(json!({"content":"x","timings":{"draft_n":12,"draft_n_accepted":9}}));
        let silent = acc_with(json!({"content":"x","timings":{"predicted_n":5}}));
        let bare = acc_with(json!({"content":"x"}));
        // (kind, request, server spec, response, used, reason, message must contain)
        let cases: Vec<Case> = vec![
            (ServerKind::LlamaServer, &on, &mtp, &drafted, true, None, ""),
            (
                ServerKind::LlamaServer,
                &on,
                &none,
                &silent,
                false,
                Some(Reason::ServerSide),
                "--spec-type draft-mtp --spec-draft-n-max 3",
            ),
            (
                ServerKind::LlamaServer,
                &on,
                &mtp,
                &silent,
                false,
                Some(Reason::ServerSide),
                "has an MTP lane",
            ),
            (
                ServerKind::LlamaServer,
                &on,
                &unknown,
                &silent,
                false,
                Some(Reason::NotReported),
                "--spec-type draft-mtp",
            ),
            (
                ServerKind::LlamaServer,
                &on,
                &unknown,
                &bare,
                false,
                Some(Reason::NotReported),
                "unknown",
            ),
            (
                ServerKind::OpenAiCompatible,
                &on,
                &mtp,
                &bare,
                false,
                Some(Reason::NotReported),
                "has an MTP lane but reported no draft statistics",
            ),
            (
                ServerKind::LlamaServer,
                &off,
                &mtp,
                &silent,
                false,
                Some(Reason::DisabledByRequest),
                "speculation was turned off",
            ),
            (
                ServerKind::LlamaServer,
                &off,
                &mtp,
                &drafted,
                true,
                None,
                "drafts for every request",
            ),
            (
                ServerKind::Vllm,
                &on,
                &unknown,
                &bare,
                false,
                Some(Reason::NotReported),
                "--speculative-config '{\"method\":\"mtp\",\"num_speculative_tokens\":3}'",
            ),
            (
                ServerKind::LmStudio,
                &on,
                &unknown,
                &bare,
                false,
                Some(Reason::NotReported),
                "lms load m --speculative-draft-mtp",
            ),
            (
                ServerKind::Ollama,
                &on,
                &unknown,
                &drafted,
                false,
                Some(Reason::RuntimeUnsupported),
                "Ollama does not expose",
            ),
            (
                ServerKind::Vllm,
                &off,
                &unknown,
                &bare,
                false,
                Some(Reason::DisabledByRequest),
                "cannot switch off",
            ),
        ];
        for (kind, req, spec, acc, used, reason, needle) in cases {
            let r = resolve(None, Some(req));
            let ev = per_request(kind, acc, spec);
            let rep = build_report(kind, "m", &r, spec, ev.as_ref());
            assert_eq!(rep.used, used, "{kind} {req:?} {spec:?}");
            assert_eq!(rep.reason, reason, "{kind} {req:?} {spec:?}");
            let msg = rep.message.clone().unwrap_or_default();
            assert!(msg.contains(needle), "{kind}: {msg:?} lacks {needle:?}");
            if !used {
                assert_eq!((rep.drafted, rep.accepted), (None, None));
            }
            // "m" is in no registry entry: whether the pairing preserves output is unknown
            assert_eq!(rep.output_preserving, None);
        }
        // a served model the registry knows reports the registry's word on it, `false`
        // (a divergence was seen) included, when the server drafted with the MTP head
        let r = resolve(None, Some(&on));
        let kind = ServerKind::LlamaServer;
        let ev = per_request(kind, &drafted, &mtp);
        let rep = build_report(kind, "google/gemma-4-26b-a4b-it", &r, &mtp, ev.as_ref());
        assert!(rep.used, "{rep:?}");
        assert_eq!(rep.output_preserving, Some(false));
    }

    #[test]
    fn deltas() {
        let before = Metrics::parse("vllm:spec_decode_num_drafts_total 10\nvllm:spec_decode_num_draft_tokens_total 30\nvllm:spec_decode_num_accepted_tokens_total 20\nvllm:spec_decode_num_accepted_tokens_per_pos_total{position=\"0\"} 9\n");
        let after = Metrics::parse("vllm:spec_decode_num_drafts_total 14\nvllm:spec_decode_num_draft_tokens_total 42\nvllm:spec_decode_num_accepted_tokens_total 27\nvllm:spec_decode_num_accepted_tokens_per_pos_total{position=\"0\"} 13\nvllm:spec_decode_num_accepted_tokens_per_pos_total{position=\"1\"} 3\n");
        let e = metrics_delta(ServerKind::Vllm, &before, &after).unwrap();
        assert_eq!(
            (e.drafted, e.accepted, e.rounds, e.depth),
            (12, 7, Some(4), Some(3))
        );
        assert_eq!(e.accepted_per_position, Some(vec![4, 3]));
        assert!(e.approximate);
        assert_eq!(lane_from_metrics(ServerKind::Vllm, &after), Some(true));
        assert_eq!(
            lane_from_metrics(
                ServerKind::Vllm,
                &Metrics::parse("vllm:num_requests_running 0\n")
            ),
            Some(false)
        );
        assert!(
            metrics_delta(ServerKind::Vllm, &Metrics::default(), &Metrics::default()).is_none()
        );
    }
}
