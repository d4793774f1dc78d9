//! Table-driven tests of the speculation block: parsing, validation, resolution and the plan.
#![allow(clippy::type_complexity)]

use mtp_contract::{
    plan, resolve, DepthSource, DraftDepth, DraftStats, Lane, Plan, ProviderError, Reason,
    Sampling, Speculation, SpeculationError, SpeculationMode, SpeculationReport,
    TESTED_MAX_DRAFT_TOKENS,
};
use serde_json::{json, Value};

#[test]
fn parse_table() {
    // (input, expected mode, expected depth, expected require_acceleration)
    let ok: &[(
        &str,
        Option<SpeculationMode>,
        Option<DraftDepth>,
        Option<bool>,
    )] = &[
        ("true", Some(SpeculationMode::NativeMtp), None, None),
        ("false", Some(SpeculationMode::Off), None, None),
        (
            r#"{"mode":"native_mtp"}"#,
            Some(SpeculationMode::NativeMtp),
            None,
            None,
        ),
        (r#"{"mode":"off"}"#, Some(SpeculationMode::Off), None, None),
        (r#"{"num_draft_tokens":5}"#, None, Some(5.into()), None),
        (r#"{"num_draft_tokens":1}"#, None, Some(1.into()), None),
        (r#"{"num_draft_tokens":16}"#, None, Some(16.into()), None),
        // larger depths are accepted (specified: they can cost more memory and run slower)
        (r#"{"num_draft_tokens":17}"#, None, Some(17.into()), None),
        (
            r#"{"num_draft_tokens":4294967295}"#,
            None,
            Some(4294967295u32.into()),
            None,
        ),
        (r#"{"require_acceleration":true}"#, None, None, Some(true)),
        (r#"{}"#, None, None, None),
        (
            r#"{"num_draft_tokens":"auto"}"#,
            None,
            Some(DraftDepth::Auto),
            None,
        ),
        (
            r#"{"mode":"native_mtp","drafter":"org/x-MTP","num_draft_tokens":3,"require_acceleration":false}"#,
            Some(SpeculationMode::NativeMtp),
            Some(3.into()),
            Some(false),
        ),
    ];
    for (input, mode, depth, req) in ok {
        let s: Speculation = serde_json::from_str(input).unwrap_or_else(|e| panic!("{input}: {e}"));
        assert_eq!(s.mode, *mode, "{input}");
        assert_eq!(s.num_draft_tokens, *depth, "{input}");
        assert_eq!(s.require_acceleration, *req, "{input}");
    }
}

#[test]
fn parse_errors_name_key_or_value() {
    // (input, substring the error must contain)
    let bad: &[(serde_json::Value, &str)] = &[
        (json!({"depth": 3}), "unknown speculation key `depth`"),
        (json!({"mode": "eagle"}), "unknown speculation mode `eagle`"),
        (json!({"mode": "eagle"}), "\"native_mtp\" and \"off\""),
        (json!({"num_draft_tokens": 0}), "invalid num_draft_tokens 0"),
        (
            json!({"num_draft_tokens": -2}),
            "invalid num_draft_tokens -2",
        ),
        (
            json!({"num_draft_tokens": 2.5}),
            "invalid num_draft_tokens 2.5",
        ),
        (
            json!({"num_draft_tokens": 3.0}),
            "invalid num_draft_tokens 3.0",
        ),
        (
            json!({"num_draft_tokens": 4294967296u64}),
            "must be a positive integer",
        ),
        (
            json!({"num_draft_tokens": "3"}),
            "invalid num_draft_tokens \"3\"",
        ),
        (
            json!({"num_draft_tokens": 1e30}),
            "invalid num_draft_tokens",
        ),
        (
            json!({"num_draft_tokens": "Auto"}),
            "invalid num_draft_tokens \"Auto\"",
        ),
        (json!({"num_draft_tokens": "auto "}), "or \"auto\""),
        (json!({"require_acceleration": "yes"}), "must be a boolean"),
        (json!({"mode": 1}), "key `mode` must be"),
        (json!({"drafter": ""}), "`drafter` must name"),
        (json!({"drafter": 3}), "key `drafter` must be"),
        (json!("native_mtp"), "must be true, false or an object"),
        (json!(3), "must be true, false or an object"),
        (json!(null), "must be true, false or an object"),
    ];
    for (input, needle) in bad {
        let err = Speculation::from_json(input).expect_err(&input.to_string());
        let msg = err.to_string();
        assert!(msg.contains(needle), "{input}: `{msg}` lacks `{needle}`");
        // The same error through serde.
        let via_serde = serde_json::from_value::<Speculation>(input.clone()).unwrap_err();
        assert!(
            via_serde.to_string().contains(needle),
            "{input}: {via_serde}"
        );
    }
    assert!(matches!(
        Speculation::from_json(&json!({"depth": 1})),
        Err(SpeculationError::UnknownKey { key }) if key == "depth"
    ));
    assert_eq!(TESTED_MAX_DRAFT_TOKENS, 8);
}

#[test]
fn from_str_accepts_cli_spellings() {
    for (s, mode) in [
        ("native_mtp", SpeculationMode::NativeMtp),
        ("off", SpeculationMode::Off),
        ("true", SpeculationMode::NativeMtp),
        ("false", SpeculationMode::Off),
    ] {
        assert_eq!(s.parse::<Speculation>().unwrap().mode, Some(mode));
    }
    assert!("medusa".parse::<Speculation>().is_err());
    let j: Speculation = r#"{"num_draft_tokens":4}"#.parse().unwrap();
    assert_eq!(j.num_draft_tokens, Some(4.into()));
}

#[test]
fn json_round_trip() {
    for input in [
        json!({"mode":"native_mtp"}),
        json!({"mode":"off"}),
        json!({"num_draft_tokens":5}),
        json!({"mode":"native_mtp","drafter":"a/b","num_draft_tokens":2,"require_acceleration":true}),
    ] {
        let s = Speculation::from_json(&input).unwrap();
        assert_eq!(serde_json::to_value(&s).unwrap(), input);
    }
    assert_eq!(
        serde_json::to_value(Speculation::from(true)).unwrap(),
        json!({"mode":"native_mtp"})
    );
}

/// (provider default, request, requested, depth, require_acceleration, disabled reason)
#[test]
fn resolution_precedence_table() {
    let on3 = Speculation::native_mtp().with_num_draft_tokens(3).unwrap();
    let off = Speculation::off();
    let d5 = Speculation::depth(5).unwrap();
    let strict = Speculation::default().with_require_acceleration(true);
    let on = Speculation::native_mtp();
    type Row<'a> = (
        Option<&'a Speculation>,
        Option<&'a Speculation>,
        bool,
        Option<u32>,
        bool,
        Option<Reason>,
    );
    let rows: Vec<Row> = vec![
        (
            None,
            None,
            false,
            None,
            false,
            Some(Reason::DisabledByDefault),
        ),
        (Some(&on3), None, true, Some(3), false, None),
        (Some(&on3), Some(&d5), true, Some(5), false, None),
        (
            Some(&on3),
            Some(&off),
            false,
            Some(3),
            false,
            Some(Reason::DisabledByRequest),
        ),
        // the provider's own explicit "off" is a choice, not the absence of one
        (
            Some(&off),
            None,
            false,
            None,
            false,
            Some(Reason::DisabledByRequest),
        ),
        (
            Some(&off),
            Some(&d5),
            false,
            Some(5),
            false,
            Some(Reason::DisabledByRequest),
        ),
        (Some(&off), Some(&on), true, None, false, None),
        (None, Some(&d5), true, Some(5), false, None),
        (None, Some(&on), true, None, false, None),
        (Some(&on3), Some(&strict), true, Some(3), true, None),
        (
            Some(&strict),
            Some(&off),
            false,
            None,
            true,
            Some(Reason::DisabledByRequest),
        ),
    ];
    for (i, (def, req, requested, depth, strict, reason)) in rows.into_iter().enumerate() {
        let r = resolve(def, req);
        assert_eq!(r.requested, requested, "row {i}");
        assert_eq!(r.num_draft_tokens, depth, "row {i}");
        assert_eq!(r.require_acceleration, strict, "row {i}");
        assert_eq!(r.disabled_reason(), reason, "row {i}");
    }
}

#[test]
fn override_lives_for_one_request_only() {
    let default = Speculation::native_mtp().with_num_draft_tokens(3).unwrap();
    let first = resolve(Some(&default), Some(&Speculation::depth(5).unwrap()));
    let second = resolve(Some(&default), None);
    assert_eq!(first.depth_or(2), 5);
    assert_eq!(second.depth_or(2), 3);
}

fn ready() -> Lane {
    Lane::Ready {
        drafter: "embedded".into(),
        default_depth: 2,
        depth_source: DepthSource::Registry,
        output_preserving: Some(true),
    }
}

fn not_cached() -> Lane {
    Lane::Unavailable {
        reason: Reason::MtpHeadNotCached,
        message: "download it with `mtp models download org/x-MTP`".into(),
    }
}

enum Expect {
    Speculate(u32),
    TargetOnly(Reason),
    Unavailable(Reason),
}

#[test]
fn plan_table() {
    let on = Speculation::native_mtp();
    let strict = Speculation::native_mtp().with_require_acceleration(true);
    let pen = Sampling {
        repetition_penalty: Some(1.2),
        ..Default::default()
    };
    let neutral_pen = Sampling {
        repetition_penalty: Some(1.0),
        presence_penalty: Some(0.0),
        temperature: Some(0.8),
        top_p: Some(0.9),
        top_k: Some(40),
        min_p: Some(0.05),
        seed: Some(1),
        ..Default::default()
    };
    let mut bias = Sampling::default();
    bias.logit_bias.insert(7, -100.0);
    let greedy = Sampling::default();
    let rows: Vec<(
        Option<&Speculation>,
        Option<Speculation>,
        &Sampling,
        Lane,
        Expect,
    )> = vec![
        (Some(&on), None, &greedy, ready(), Expect::Speculate(2)),
        (
            Some(&on),
            Some(Speculation::depth(5).unwrap()),
            &greedy,
            ready(),
            Expect::Speculate(5),
        ),
        (
            Some(&on),
            Some(false.into()),
            &greedy,
            ready(),
            Expect::TargetOnly(Reason::DisabledByRequest),
        ),
        (
            None,
            None,
            &greedy,
            ready(),
            Expect::TargetOnly(Reason::DisabledByDefault),
        ),
        (
            Some(&on),
            None,
            &greedy,
            not_cached(),
            Expect::TargetOnly(Reason::MtpHeadNotCached),
        ),
        (
            Some(&strict),
            None,
            &greedy,
            not_cached(),
            Expect::Unavailable(Reason::MtpHeadNotCached),
        ),
        (
            Some(&on),
            None,
            &pen,
            ready(),
            Expect::TargetOnly(Reason::SamplingRequiresTargetOnly),
        ),
        (
            Some(&strict),
            None,
            &pen,
            ready(),
            Expect::Unavailable(Reason::SamplingRequiresTargetOnly),
        ),
        (
            Some(&on),
            None,
            &bias,
            ready(),
            Expect::TargetOnly(Reason::SamplingRequiresTargetOnly),
        ),
        (Some(&on), None, &neutral_pen, ready(), Expect::Speculate(2)),
        // Pinned off beats require_acceleration: nothing was asked to accelerate.
        (
            Some(&strict),
            Some(false.into()),
            &pen,
            not_cached(),
            Expect::TargetOnly(Reason::DisabledByRequest),
        ),
    ];
    for (i, (def, req, sampling, lane, expect)) in rows.into_iter().enumerate() {
        let got = plan(def, req.as_ref(), sampling, &lane);
        match (got, expect) {
            (Ok(Plan::Speculate { depth, .. }), Expect::Speculate(d)) => {
                assert_eq!(depth, d, "row {i}")
            }
            (
                Ok(Plan::TargetOnly {
                    reason, message, ..
                }),
                Expect::TargetOnly(r),
            ) => {
                assert_eq!(reason, r, "row {i}");
                assert!(!message.is_empty());
            }
            (
                Err(ProviderError::SpeculationUnavailable { reason, message }),
                Expect::Unavailable(r),
            ) => {
                assert_eq!(reason, r, "row {i}");
                assert!(!message.is_empty());
            }
            (other, _) => panic!("row {i}: unexpected {other:?}"),
        }
    }
}

#[test]
fn sampling_message_names_the_controls() {
    let s = Sampling {
        presence_penalty: Some(0.3),
        frequency_penalty: Some(0.1),
        ..Default::default()
    };
    let p = plan(Some(&Speculation::native_mtp()), None, &s, &ready()).unwrap();
    let Plan::TargetOnly { message, .. } = p else {
        panic!()
    };
    assert!(
        message.contains("presence_penalty, frequency_penalty"),
        "{message}"
    );
}

#[test]
fn report_serializes_every_key() {
    let resolved = resolve(Some(&Speculation::native_mtp()), None);
    let mut stats = DraftStats::default();
    stats.record_round(3, 3);
    stats.record_round(3, 1);
    let rep = SpeculationReport::used(
        &resolved,
        "mtp-engine-cpu",
        "embedded",
        3,
        &stats,
        Some(true),
    );
    let v = serde_json::to_value(&rep).unwrap();
    let keys = [
        "requested",
        "mode",
        "used",
        "drafter",
        "num_draft_tokens",
        "depth_source",
        "auto_depth",
        "rounds_per_depth",
        "runtime",
        "draft_kind",
        "drafted",
        "accepted",
        "rounds",
        "acceptance_rate",
        "accepted_per_position",
        "output_preserving",
        "reason",
        "message",
    ];
    let obj = v.as_object().unwrap();
    for k in keys {
        assert!(obj.contains_key(k), "missing {k}");
    }
    assert_eq!(obj.len(), keys.len());
    assert_eq!(
        v,
        json!({
            "requested": true, "mode": "native_mtp", "used": true, "drafter": "embedded",
            "num_draft_tokens": 3, "depth_source": null, "auto_depth": false,
            "rounds_per_depth": [0, 0, 0, 2],
            "runtime": "mtp-engine-cpu", "draft_kind": "mtp",
            "drafted": 6, "accepted": 4, "rounds": 2, "acceptance_rate": 4.0 / 6.0,
            "accepted_per_position": [2, 1, 1], "output_preserving": true,
            "reason": null, "message": null
        })
    );
    let back: SpeculationReport = serde_json::from_value(v).unwrap();
    assert_eq!(back, rep);
}

#[test]
fn reasons_round_trip() {
    for r in Reason::ALL {
        let s = serde_json::to_string(&r).unwrap();
        assert_eq!(s, format!("\"{}\"", r.as_str()));
        assert_eq!(serde_json::from_str::<Reason>(&s).unwrap(), r);
        assert_eq!(Reason::parse(r.as_str()), Some(r));
        assert!(!r.default_message().is_empty());
    }
    for code in [
        "disabled_by_request",
        "disabled_by_default",
        "no_mtp_head",
        "mtp_head_not_cached",
        "drafter_mismatch",
        "runtime_unsupported",
        "server_side",
        "sampling_requires_target_only",
    ] {
        assert!(Reason::parse(code).is_some(), "{code}");
    }
}

#[test]
fn auto_depth_resolves_reports_and_round_trips() {
    let fixed3 = Speculation::native_mtp().with_num_draft_tokens(3).unwrap();
    let auto = Speculation::native_mtp()
        .with_num_draft_tokens(DraftDepth::Auto)
        .unwrap();
    // the request's choice wins either way, field by field
    let r = resolve(Some(&fixed3), Some(&Speculation::auto_depth()));
    assert!(r.auto_depth && r.requested && r.num_draft_tokens.is_none());
    let r = resolve(Some(&auto), Some(&Speculation::depth(2).unwrap()));
    assert!(!r.auto_depth);
    assert_eq!(r.num_draft_tokens, Some(2));
    let r = resolve(Some(&auto), None);
    assert!(r.auto_depth);
    // off stays off
    let r = resolve(Some(&auto), Some(&false.into()));
    assert!(!r.requested);
    // a runtime that cannot choose drafts at its default and says so
    let lane = Lane::Ready {
        drafter: "embedded".into(),
        default_depth: 3,
        depth_source: DepthSource::BuiltIn,
        output_preserving: Some(true),
    };
    let p = plan(Some(&auto), None, &Sampling::default(), &lane).unwrap();
    let Plan::Speculate {
        depth, resolved, ..
    } = &p
    else {
        panic!("{p:?}")
    };
    assert_eq!(*depth, 3);
    assert!(resolved.auto_depth);
    let mut stats = DraftStats::default();
    stats.record_round(3, 2);
    let rep = p.report("llama.cpp", &stats);
    assert!(!rep.auto_depth);
    let msg = rep.message.clone().unwrap();
    assert!(
        msg.contains("\"auto\"") && msg.contains("3 per round"),
        "{msg}"
    );
    // one that chose says so, and the depths it used are counted
    stats.record_round(0, 0);
    stats.record_round(1, 1);
    let chosen = p.report("mtp-engine-cpu", &stats).chosen_per_round();
    assert!(chosen.auto_depth && chosen.message.is_none());
    assert_eq!(chosen.rounds_per_depth, Some(vec![1, 1, 0, 1]));
    let v = serde_json::to_value(&chosen).unwrap();
    assert_eq!(v["auto_depth"], true);
    assert_eq!(v["rounds_per_depth"], json!([1, 1, 0, 1]));
    assert_eq!(
        serde_json::from_value::<SpeculationReport>(v).unwrap(),
        chosen
    );
    // a not-used report is never marked
    let off = SpeculationReport::not_used(&resolved.clone(), "x", Reason::NoMtpHead, None);
    assert!(!off.chosen_per_round().auto_depth);
    // the block round-trips as the string
    assert_eq!(auto.to_json()["num_draft_tokens"], "auto");
    let back: Speculation = serde_json::from_value(auto.to_json()).unwrap();
    assert_eq!(back, auto);
    assert_eq!(
        r#"{"num_draft_tokens":"auto"}"#.parse::<Speculation>().unwrap(),
        Speculation::auto_depth()
    );
}

/// Specified order of the default depth: the request, the provider's block, the drafter's
/// config, the registry, then 3; the report says which decided.
#[test]
fn the_report_names_the_level_that_decided_the_depth() {
    let lane = |depth, depth_source| Lane::Ready {
        drafter: "org/x-MTP".into(),
        default_depth: depth,
        depth_source,
        output_preserving: None,
    };
    let provider = Speculation::native_mtp().with_num_draft_tokens(4).unwrap();
    let request = Speculation::depth(6).unwrap();
    let cases = [
        (
            Some(&provider),
            Some(&request),
            lane(2, DepthSource::DrafterConfig),
            6,
            DepthSource::Request,
        ),
        (
            Some(&provider),
            None,
            lane(2, DepthSource::DrafterConfig),
            4,
            DepthSource::Provider,
        ),
        (
            None,
            Some(&Speculation::native_mtp()),
            lane(2, DepthSource::DrafterConfig),
            2,
            DepthSource::DrafterConfig,
        ),
        (
            None,
            Some(&Speculation::native_mtp()),
            lane(5, DepthSource::Registry),
            5,
            DepthSource::Registry,
        ),
        (
            None,
            Some(&Speculation::native_mtp()),
            lane(3, DepthSource::BuiltIn),
            3,
            DepthSource::BuiltIn,
        ),
        (
            Some(&Speculation::auto_depth()),
            None,
            lane(2, DepthSource::DrafterConfig),
            2,
            DepthSource::Provider,
        ),
    ];
    for (i, (p, r, lane, depth, source)) in cases.into_iter().enumerate() {
        let pl = plan(p, r, &Sampling::default(), &lane).unwrap();
        let Plan::Speculate {
            depth: d,
            depth_source,
            ..
        } = &pl
        else {
            panic!("{i}: {pl:?}")
        };
        assert_eq!((*d, *depth_source), (depth, source), "case {i}");
        let mut stats = DraftStats::default();
        stats.record_round(depth as usize, 1);
        let v = serde_json::to_value(pl.report("x", &stats)).unwrap();
        let want = serde_json::to_value(source).unwrap();
        assert_eq!(v["depth_source"], want, "case {i}");
    }
    // a report that did not speculate names the level only when a block set the depth
    let r = resolve(None, Some(&Speculation::depth(5).unwrap()));
    let rep = SpeculationReport::not_used(&r, "x", Reason::NoMtpHead, None);
    assert_eq!(rep.depth_source, Some(DepthSource::Request));
    let r = resolve(None, Some(&Speculation::native_mtp()));
    let rep = SpeculationReport::not_used(&r, "x", Reason::NoMtpHead, None);
    assert_eq!(
        serde_json::to_value(&rep).unwrap()["depth_source"],
        Value::Null
    );
}

/// Depths above the measured range run, and the report warns; within it, no warning.
#[test]
fn depths_above_the_measured_range_are_accepted_with_a_warning() {
    for (depth, warns) in [(8u32, false), (9, true), (40, true)] {
        let p = plan(
            None,
            Some(&Speculation::depth(depth).unwrap()),
            &Sampling::default(),
            &ready(),
        )
        .unwrap();
        let mut stats = DraftStats::default();
        stats.record_round(depth as usize, 0);
        let rep = p.report("x", &stats);
        assert!(rep.used);
        assert_eq!(rep.num_draft_tokens, Some(depth));
        let msg = rep.message.clone().unwrap_or_default();
        assert_eq!(
            msg.contains("above the measured range"),
            warns,
            "{depth}: {msg}"
        );
    }
}

/// A request naming a drafter other than the loaded one is never run silently with the
/// loaded head: target-only with `drafter_not_loaded`, or refused under
/// `require_acceleration`; naming the loaded one (any case, a trailing slash) speculates.
#[test]
fn a_request_naming_another_drafter_is_not_silently_ignored() {
    let lane = Lane::Ready {
        drafter: "org/x-MTP".into(),
        default_depth: 2,
        depth_source: DepthSource::DrafterConfig,
        output_preserving: Some(true),
    };
    let other = Speculation::from_json(&json!({"drafter": "org/y-MTP"})).unwrap();
    let p = plan(None, Some(&other), &Sampling::default(), &lane).unwrap();
    let rep = p.report("x", &DraftStats::default());
    assert!(!rep.used);
    assert_eq!(rep.reason, Some(Reason::DrafterNotLoaded));
    let msg = rep.message.unwrap();
    assert!(
        msg.contains("org/y-MTP") && msg.contains("org/x-MTP"),
        "{msg}"
    );
    let strict =
        Speculation::from_json(&json!({"drafter": "org/y-MTP", "require_acceleration": true}))
            .unwrap();
    match plan(None, Some(&strict), &Sampling::default(), &lane) {
        Err(ProviderError::SpeculationUnavailable { reason, .. }) => {
            assert_eq!(reason, Reason::DrafterNotLoaded)
        }
        other => panic!("{other:?}"),
    }
    for same in ["org/x-MTP", "ORG/x-mtp", "org/x-MTP/"] {
        let s = Speculation::from_json(&json!({ "drafter": same })).unwrap();
        let p = plan(None, Some(&s), &Sampling::default(), &lane).unwrap();
        assert!(matches!(p, Plan::Speculate { .. }), "{same}: {p:?}");
    }
    // an embedded head is not a companion a request names
    let s = Speculation::from_json(&json!({"drafter": "org/x-MTP"})).unwrap();
    let p = plan(None, Some(&s), &Sampling::default(), &ready()).unwrap();
    assert!(
        matches!(
            p,
            Plan::TargetOnly {
                reason: Reason::DrafterNotLoaded,
                ..
            }
        ),
        "{p:?}"
    );
}
