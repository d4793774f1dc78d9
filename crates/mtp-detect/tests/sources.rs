//! Where artifacts come from: the Hugging Face cache layout, the Hub over HTTP (the project's
//! fake Hub, `mtp-fakehub`: paged listings, LFS redirects, `Range`, the Hub's error codes,
//! every request recorded and the content bytes counted per file), repo-id validation, the
//! registry and companion drafters.

mod common;

use common::*;
use mtp_detect::{
    check_drafter, probe, registry, resolve_model, CacheConfig, DetectError, DrafterError,
    HubConfig, HubError, MismatchField, ProbeOptions, Reason, Registry, ResolvedArtifact, Runtime,
    Verdict,
};
use mtp_fakehub::FakeHub;
use safetensors::Dtype;

const TOKEN: &str = "hf_secret_token";

fn hub_opts(cache: &std::path::Path, hub: &FakeHub) -> ProbeOptions {
    let mut o = ProbeOptions::offline(CacheConfig::new(cache));
    o.hub = Some(HubConfig::new(hub.base.clone()).with_token(Some(TOKEN.into())));
    o
}

/// Every request `hub` received carried the token as a bearer header.
fn all_requests_bear_the_token(hub: &FakeHub) {
    let requests = hub.requests();
    assert!(!requests.is_empty());
    let bearer = format!("Bearer {TOKEN}");
    for r in &requests {
        assert_eq!(
            r.authorization.as_deref(),
            Some(bearer.as_str()),
            "{} {}",
            r.method,
            r.path
        );
    }
}

#[test]
fn cache_dir_precedence() {
    let table: Vec<(Vec<(&str, &str)>, &str)> = vec![
        (
            vec![("HF_HUB_CACHE", "/a"), ("HF_HOME", "/b"), ("HOME", "/h")],
            "/a",
        ),
        (vec![("HF_HOME", "/b"), ("HOME", "/h")], "/b/hub"),
        (vec![("HOME", "/h")], "/h/.cache/huggingface/hub"),
        (
            vec![("HF_HUB_CACHE", ""), ("HOME", "/h")],
            "/h/.cache/huggingface/hub",
        ),
    ];
    for (vars, want) in table {
        let c = CacheConfig::from_vars(|k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        });
        assert_eq!(c.hub_cache, std::path::PathBuf::from(want), "{vars:?}");
    }
    // As huggingface_hub: the public Hub unless HF_ENDPOINT says otherwise, online.
    let d = HubConfig::from_vars(|k| (k == "HOME").then(|| "/nonexistent-home".to_string()));
    assert_eq!(d.endpoint, mtp_detect::hub::DEFAULT_ENDPOINT);
    assert!(d.token.is_none() && !d.offline);
    let h = HubConfig::from_vars(|k| match k {
        "HF_ENDPOINT" => Some("http://hub.test/".into()),
        "HF_TOKEN" => Some("secret".into()),
        _ => None,
    });
    assert_eq!(h.endpoint, "http://hub.test");
    assert!(
        !format!("{h:?}").contains("secret"),
        "the token is never printed"
    );
}

#[test]
fn repo_ids_are_validated_before_touching_the_filesystem() {
    let cache = tempfile::tempdir().unwrap();
    let c = CacheConfig::new(cache.path());
    let bad = [
        "org/../../etc",
        "org/name/extra",
        "org//name",
        "-org/name",
        "org/name.",
        "org/na me",
        "org/name@../x",
        "org/name@",
        "org\u{0}/x",
        "",
    ];
    for id in bad {
        let e = resolve_model(id, &c).unwrap_err();
        assert!(
            matches!(
                e,
                DetectError::InvalidRepoId { .. } | DetectError::NotFound { .. }
            ),
            "{id:?}: {e:?}"
        );
    }
    // `../x` and `/abs` are paths, and missing ones are NotFound, never a cache lookup.
    for p in ["../definitely-not-here", "/definitely/not/here"] {
        assert!(
            matches!(resolve_model(p, &c), Err(DetectError::NotFound { .. })),
            "{p}"
        );
    }
    for good in [
        "org/name",
        "Qwen/Qwen3.5-9B",
        "mlx-community/Qwen3.8-27B-MTP-4bit@main",
        "gpt2",
    ] {
        assert!(
            matches!(resolve_model(good, &c), Ok(ResolvedArtifact::Remote { .. })),
            "{good}"
        );
    }
}

#[test]
fn hf_cache_layout_resolves_snapshots_and_reports_the_repo() {
    let cache = tempfile::tempdir().unwrap();
    let c = CacheConfig::new(cache.path());
    let snap = cache_snapshot(cache.path(), "org/model", "0123abcd");
    let mut names = qwen_base_names(2);
    names.extend(qwen_mtp_names());
    write_checkpoint(
        &snap,
        &qwen_config(64, 256, 2, Some(1)),
        &names,
        Dtype::BF16,
        false,
    );
    match resolve_model("org/model", &c).unwrap() {
        ResolvedArtifact::Cached {
            repo,
            revision,
            snapshot,
        } => {
            assert_eq!(repo.as_str(), "org/model");
            assert_eq!(revision, "0123abcd");
            assert_eq!(snapshot, snap);
        }
        other => panic!("{other:?}"),
    }
    let r = probe("org/model", &ProbeOptions::offline(c.clone())).unwrap();
    assert!(r.mtp_head);
    assert_eq!(r.repo.as_deref(), Some("org/model"));
    // vLLM is launched by repo id: the cache serves it.
    assert!(r
        .runtime(Runtime::Vllm)
        .unwrap()
        .command
        .starts_with("vllm serve org/model "));
    // A path inside the cache knows its repo too.
    let r = mtp_detect::probe_local(&snap).unwrap();
    assert_eq!(r.repo.as_deref(), Some("org/model"));
}

#[test]
fn not_cached_and_offline_is_a_clear_error() {
    let cache = tempfile::tempdir().unwrap();
    let e = probe(
        "org/missing",
        &ProbeOptions::offline(CacheConfig::new(cache.path())),
    )
    .unwrap_err();
    assert!(
        matches!(e, DetectError::Hub(HubError::Offline { .. })),
        "{e:?}"
    );
    assert!(e.to_string().contains("HF_HUB_OFFLINE"), "{e}");
    // HF_HUB_OFFLINE=1 is the same: no request goes out.
    let mut opts = ProbeOptions::offline(CacheConfig::new(cache.path()));
    let mut hub = HubConfig::new("http://127.0.0.1:9");
    hub.offline = true;
    opts.hub = Some(hub);
    let e = probe("org/missing", &opts).unwrap_err();
    assert!(
        matches!(e, DetectError::Hub(HubError::Offline { .. })),
        "{e:?}"
    );
}

#[test]
fn hub_safetensors_probe_reads_only_json_and_headers() {
    let root = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let repo_dir = root.path().join("org/sharded");
    let mut names = qwen_base_names(8);
    names.extend(qwen_mtp_names());
    write_checkpoint(
        &repo_dir,
        &qwen_config(64, 256, 8, Some(1)),
        &names,
        Dtype::F32,
        true,
    );
    // Gated with the probe's token: its files are served only when the bearer header goes out.
    let mut repo = fake_repo_from_dir("org/sharded", &repo_dir);
    repo.gated_token = Some(TOKEN.into());
    let files = repo.files.clone();
    let hub = FakeHub::start(vec![repo]);
    let r = probe("org/sharded", &hub_opts(cache.path(), &hub)).unwrap();
    assert!(r.mtp_head);
    assert_eq!(r.source, "org/sharded@main");
    assert_eq!(r.mtp_dtypes, vec!["F32".to_string()]);
    // The token went out as a bearer header on every request and is not in the report.
    all_requests_bear_the_token(&hub);
    assert!(!r.to_json().to_string().contains(TOKEN));
    let requests = hub.requests();

    // What each file gave: a JSON file whole or nothing; a shard its 8-byte length and JSON
    // header or nothing, never its weights.
    let mut content = 0;
    for f in &files {
        let served = hub.body_bytes("org/sharded", &f.path);
        let len = f.bytes.len() as u64;
        if f.path.ends_with(".json") {
            assert!(
                served == 0 || served == len,
                "{}: served {served} of {len}",
                f.path
            );
        } else {
            assert!(f.path.ends_with(".safetensors"), "{}", f.path);
            let n = u64::from_le_bytes(f.bytes[..8].try_into().unwrap());
            assert!(
                served == 0 || served == 8 + n,
                "{}: served {served}, header {}",
                f.path,
                8 + n
            );
            assert!(served < len, "{}: served {served} of {len}", f.path);
        }
        content += served;
    }
    for whole in ["config.json", "model.safetensors.index.json"] {
        let f = files.iter().find(|f| f.path == whole).unwrap();
        assert_eq!(
            hub.body_bytes("org/sharded", whole),
            f.bytes.len() as u64,
            "{whole}"
        );
    }
    assert!(
        hub.body_bytes("org/sharded", "model-00002-of-00002.safetensors") > 0,
        "the mtp shard header is read"
    );

    // `bytes_read` is the content above plus the file listing, exactly. FakeHub counts content
    // bytes only (`body_bytes`), not the listing's JSON, so the listing is fetched here the
    // way the client fetches it (every page) and its body lengths added; the pages fetched
    // must be the very pages the probe asked for, so the sum is what the probe received.
    let listing = listing_pages(&hub, "org/sharded", "main");
    let asked: Vec<&str> = requests
        .iter()
        .filter(|q| q.path.starts_with("/api/models/org/sharded/tree/"))
        .map(|q| q.path.as_str())
        .collect();
    let pages: Vec<&str> = listing.iter().map(|p| p.path.as_str()).collect();
    assert_eq!(asked, pages);
    assert!(pages.len() > 1, "the listing is paged: {pages:?}");
    let listing_bytes: u64 = listing.iter().map(|p| p.body_len).sum();
    assert_eq!(r.bytes_read, content + listing_bytes);
}

#[test]
fn hub_gguf_probe_reads_no_more_than_its_prefix() {
    let root = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let repo_dir = root.path().join("org/gguf");
    std::fs::create_dir_all(&repo_dir).unwrap();
    let mut w = qwen35_gguf("qwen35", 64, 1, true, true);
    w.data_len = 4 * 1024 * 1024; // 4 MiB of "weights" after the header
    w.write(&repo_dir.join("Model-Q4_K_M.gguf"));
    let hub = hub_from_dir("org/gguf", &repo_dir);
    let mut opts = hub_opts(cache.path(), &hub);
    opts.gguf_prefix = 64 * 1024;
    let r = probe("org/gguf", &opts).unwrap();
    assert!(r.mtp_head);
    assert!(r
        .evidence
        .contains(&"blk.64.nextn.eh_proj.weight".to_string()));
    let served = hub.body_bytes("org/gguf", "Model-Q4_K_M.gguf");
    assert!(served > 0 && served <= 64 * 1024, "served {served}");
    all_requests_bear_the_token(&hub);
    // The prefix and the listing are all the probe received.
    let listing: u64 = listing_pages(&hub, "org/gguf", "main")
        .iter()
        .map(|p| p.body_len)
        .sum();
    assert_eq!(r.bytes_read, served + listing);
    let llama = r.runtime(Runtime::LlamaServer).unwrap();
    assert_eq!(
        llama.command,
        "llama-server --hf-repo org/gguf --hf-file Model-Q4_K_M.gguf --spec-type draft-mtp --spec-draft-n-max 3"
    );
}

#[test]
fn hub_errors_are_typed() {
    let cache = tempfile::tempdir().unwrap();
    let hub = FakeHub::start(Vec::new());
    // The Hub's `X-Error-Code: RepoNotFound`.
    let e = probe("org/absent", &hub_opts(cache.path(), &hub)).unwrap_err();
    match &e {
        DetectError::Hub(HubError::RepoNotFound { repo, .. }) => assert_eq!(repo, "org/absent"),
        other => panic!("{other:?}"),
    }
    assert!(!format!("{e:?} {e}").contains(TOKEN));
    // Nothing listening: a transport error, no status.
    let mut opts = ProbeOptions::offline(CacheConfig::new(cache.path()));
    opts.hub = Some(HubConfig::new("http://127.0.0.1:9"));
    let e = probe("org/absent", &opts).unwrap_err();
    assert!(
        matches!(e, DetectError::Hub(HubError::Http { status: None, .. })),
        "{e:?}"
    );
}

#[tokio::test]
async fn probe_async_works_inside_a_runtime() {
    let root = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let repo_dir = root.path().join("org/m");
    std::fs::create_dir_all(&repo_dir).unwrap();
    qwen35_gguf("qwen35", 4, 1, true, true).write(&repo_dir.join("m.gguf"));
    let hub = hub_from_dir("org/m", &repo_dir);
    let r = mtp_detect::probe_async("org/m".into(), hub_opts(cache.path(), &hub))
        .await
        .unwrap();
    assert!(r.mtp_head);
    // The blocking entry point is safe inside a runtime too.
    let r = probe("org/m", &hub_opts(cache.path(), &hub)).unwrap();
    assert!(r.mtp_head);
}

#[test]
fn registry_lookup_table() {
    let table = [
        ("mlx-community/Qwen3.8-27B-4bit", Some("qwen3.8-27b")),
        ("mlx-community/Qwen3.8-27B-MTP-4bit", Some("qwen3.8-27b")),
        (
            "Jundot/Qwen3.8-Flash-Next-oQ4e-mtp",
            Some("qwen3.8-flash-next"),
        ),
        ("mlx-works/Qwen3.5-9B-oQ4e-mtp", Some("qwen3.5-9b")),
        ("someone/Qwen3.5-4B-8bit", Some("qwen3.5-4b")),
        (
            "someone/Qwen3.6-35B-A3B-MTP-GGUF",
            Some("qwen3.6-35b-a3b-mtp-gguf"),
        ),
        ("someone/Qwen3.6-35B-A3B-4bit", Some("qwen3.6-35b-a3b")),
        ("unsloth/GLM-5.3-Flash-GGUF", Some("glm-5.3-flash")),
        ("someone/Qwen3.5-9Bx", None),
        ("someone/Llama-3-8B", None),
    ];
    for (repo, want) in table {
        assert_eq!(
            registry().lookup(repo).map(|e| e.id.as_str()),
            want,
            "{repo}"
        );
    }
    let e = registry().lookup("mlx-community/Qwen3.5-4B-4bit").unwrap();
    assert_eq!(
        e.speculation.drafter.as_deref(),
        Some("mlx-community/Qwen3.5-4B-MTP-4bit")
    );
    assert_eq!(e.speculation.default_depth, 2);
    let g = registry().lookup("gemma-4-26b-a4b-it").unwrap();
    assert_eq!(g.speculation.output_preserving, Some(false));
}

#[test]
fn a_user_registry_file_overrides_and_extends() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("caps.json");
    std::fs::write(
        &p,
        r#"{"models":[
            {"id":"qwen3.5-4b","family":"Qwen3.5","speculation":{"drafter":"me/drafter","default_depth":1,"status":"tested","output_preserving":true,"speedup":null,"evidence":"mine"}},
            {"id":"my-model","family":"Mine","speculation":{"drafter":null,"default_depth":4,"status":"surveyed","output_preserving":null,"speedup":null,"evidence":"x"}}
        ]}"#,
    )
    .unwrap();
    let r = Registry::with_user_file(&p).unwrap();
    assert_eq!(
        r.lookup("a/Qwen3.5-4B-4bit")
            .unwrap()
            .speculation
            .drafter
            .as_deref(),
        Some("me/drafter")
    );
    assert_eq!(
        r.lookup("a/my-model-q4").unwrap().speculation.default_depth,
        4
    );
    assert!(r.lookup("mlx-community/Qwen3.8-27B-4bit").is_some());
    std::fs::write(&p, "{not json").unwrap();
    assert!(matches!(
        Registry::with_user_file(&p),
        Err(DetectError::Registry { .. })
    ));
}

/// The companion drafter of a registered target: missing → `mtp_head_not_cached` with the
/// command; cached and fitting → ready; cached and mismatched → `drafter_mismatch`.
#[test]
fn companion_drafter_states() {
    let cache = tempfile::tempdir().unwrap();
    let c = CacheConfig::new(cache.path());
    let target = "mlx-community/Qwen3.8-27B-4bit";
    let drafter = "mlx-community/Qwen3.8-27B-MTP-4bit";
    let snap = cache_snapshot(cache.path(), target, "aaaa");
    // The mlx-community case: config claims a head, weights have none.
    write_checkpoint(
        &snap,
        &qwen_config(64, 256, 2, Some(1)),
        &qwen_base_names(2),
        Dtype::BF16,
        false,
    );

    let r = probe(target, &ProbeOptions::offline(c.clone())).unwrap();
    assert!(!r.mtp_head);
    assert!(r.config_claims_mtp);
    let comp = r.companion.clone().unwrap();
    assert_eq!(comp.reason, Some(Reason::MtpHeadNotCached));
    assert!(
        comp.message
            .contains(&format!("`mtp models download {drafter}`")),
        "{}",
        comp.message
    );
    let native = r.runtime(Runtime::Native).unwrap();
    assert_eq!(native.verdict, Verdict::CompanionNotCached);
    assert_eq!(native.reason, Some(Reason::MtpHeadNotCached));
    match r.lane(Runtime::Native) {
        mtp_contract::Lane::Unavailable { reason, message } => {
            assert_eq!(reason, Reason::MtpHeadNotCached);
            assert!(message.contains("mtp models download"));
            // said once (the runtime's note carries the companion's message)
            assert_eq!(
                message.matches("MTP acceleration off").count(),
                1,
                "{message}"
            );
            assert!(message.starts_with("MTP acceleration off: "), "{message}");
        }
        other => panic!("{other:?}"),
    }

    // Cached and fitting.
    let dsnap = cache_snapshot(cache.path(), drafter, "bbbb");
    // block_size 3 counts the seed token: two proposals per round, whatever the registry's
    // default_depth (3) says
    let dcfg = serde_json::json!({"model_type":"qwen3_5_mtp","block_size":3,"text_config":{"hidden_size":64,"vocab_size":256,"mtp_num_hidden_layers":1}});
    let dnames: Vec<String> = qwen_mtp_names()
        .iter()
        .map(|n| n.trim_start_matches("mtp.").to_string())
        .collect();
    write_checkpoint(&dsnap, &dcfg, &dnames, Dtype::BF16, false);
    let r = probe(target, &ProbeOptions::offline(c.clone())).unwrap();
    let native = r.runtime(Runtime::Native).unwrap();
    assert!(native.can_run_mtp, "{native:?}");
    assert_eq!(native.verdict, Verdict::CompanionReady);
    assert!(native.command.contains(drafter));
    match r.lane(Runtime::Native) {
        mtp_contract::Lane::Ready {
            drafter: d,
            default_depth,
            depth_source,
            output_preserving,
        } => {
            assert_eq!(d, drafter);
            assert_eq!(r.registry.as_ref().map(|r| r.default_depth), Some(3));
            assert_eq!(
                (default_depth, depth_source),
                (2, mtp_contract::DepthSource::DrafterConfig)
            );
            assert_eq!(output_preserving, Some(true));
        }
        other => panic!("{other:?}"),
    }

    // Cached with the wrong hidden size.
    let bad = serde_json::json!({"model_type":"qwen3_5_mtp","text_config":{"hidden_size":32}});
    write_json(&dsnap.join("config.json"), &bad);
    let r = probe(target, &ProbeOptions::offline(c)).unwrap();
    let native = r.runtime(Runtime::Native).unwrap();
    assert_eq!(native.verdict, Verdict::CompanionMismatch);
    assert_eq!(native.reason, Some(Reason::DrafterMismatch));
    assert!(
        native.note.contains("text_config.hidden_size"),
        "{}",
        native.note
    );
}

#[test]
fn check_drafter_names_the_field() {
    let t = tempfile::tempdir().unwrap();
    write_json(
        &t.path().join("config.json"),
        &qwen_config(64, 256, 2, Some(1)),
    );
    let good_names: Vec<String> = qwen_mtp_names();
    let stripped: Vec<String> = good_names
        .iter()
        .map(|n| n.trim_start_matches("mtp.").to_string())
        .collect();
    let cfg = |mt: &str, hidden: u64, vocab: u64| serde_json::json!({"model_type": mt, "block_size": 4, "text_config": {"hidden_size": hidden, "vocab_size": vocab}});
    type Case = (
        &'static str,
        serde_json::Value,
        Vec<String>,
        Option<MismatchField>,
    );
    let cases: Vec<Case> = vec![
        (
            "valid, MLX layout",
            cfg("qwen3_5_mtp", 64, 256),
            stripped.clone(),
            None,
        ),
        (
            "valid, mtp.-prefixed",
            cfg("qwen3_5_mtp", 64, 256),
            good_names.clone(),
            None,
        ),
        (
            "not a drafter type",
            cfg("qwen3_5", 64, 256),
            stripped.clone(),
            Some(MismatchField::ModelType),
        ),
        (
            "hidden size",
            cfg("qwen3_5_mtp", 128, 256),
            stripped.clone(),
            Some(MismatchField::HiddenSize),
        ),
        (
            "vocab",
            cfg("qwen3_5_mtp", 64, 512),
            stripped.clone(),
            Some(MismatchField::VocabSize),
        ),
        (
            "no tensors",
            cfg("qwen3_5_mtp", 64, 256),
            vec!["lm_head.weight".into()],
            Some(MismatchField::Tensors),
        ),
        (
            "no fc",
            cfg("qwen3_5_mtp", 64, 256),
            stripped
                .iter()
                .filter(|n| !n.starts_with("fc."))
                .cloned()
                .collect(),
            Some(MismatchField::Tensors),
        ),
    ];
    for (name, config, names, want) in cases {
        let d = tempfile::tempdir().unwrap();
        write_checkpoint(d.path(), &config, &names, Dtype::BF16, false);
        match (check_drafter(t.path(), d.path()), want) {
            (Ok(info), None) => {
                assert_eq!(info.hidden_size, 64, "{name}");
                assert_eq!(info.mtp_layers, 1, "{name}");
                assert_eq!(info.config_depth, Some(3), "{name}");
            }
            (Err(DrafterError::Mismatch(m)), Some(f)) => {
                assert_eq!(m.field, f, "{name}");
                assert_eq!(m.reason(), Reason::DrafterMismatch);
                assert!(m.to_string().contains(f.as_str()), "{name}: {m}");
            }
            (other, want) => panic!("{name}: got {other:?}, want {want:?}"),
        }
    }
    // No config at all.
    let d = tempfile::tempdir().unwrap();
    match check_drafter(t.path(), d.path()) {
        Err(DrafterError::Mismatch(m)) => assert_eq!(m.field, MismatchField::Config),
        other => panic!("{other:?}"),
    }
}
