//! The fake Hub is faithful where it matters: the official `huggingface_hub` client (2.4.0)
//! downloads, lists, caches and fails against it as it does against the real Hub. The client is
//! a Python package, so these tests are ignored without it; `cargo xtask test` makes a virtual
//! environment with it and names its interpreter in `MTP_HF_PYTHON`.

use std::path::Path;
use std::process::Command;

use mtp_fakehub::{FakeFile, FakeHub, FakeRepo, Fault, Request};
use serde_json::json;

fn files() -> Vec<FakeFile> {
    let weights: Vec<u8> = (0..200_000u32).map(|i| (i * 31 % 253) as u8).collect();
    vec![
        FakeFile::new("config.json", br#"{"model_type": "qwen3_5"}"#.to_vec()),
        FakeFile::new("sub/dir/x.json", b"{\"x\": 1}\n".to_vec()),
        FakeFile::new(
            "a b+c.txt",
            b"a name that needs percent-encoding\n".to_vec(),
        ),
        FakeFile::new("model.safetensors", weights),
        FakeFile::new("tokenizer.json", b"{}".to_vec()),
    ]
}

fn expectations(repo: &FakeRepo) -> serde_json::Value {
    let digests: serde_json::Map<String, serde_json::Value> = repo
        .files
        .iter()
        .map(|f| (f.path.clone(), json!(f.sha256_hex())))
        .collect();
    let sizes: serde_json::Map<String, serde_json::Value> = repo
        .files
        .iter()
        .map(|f| (f.path.clone(), json!(f.bytes.len())))
        .collect();
    let lfs: Vec<&str> = repo
        .files
        .iter()
        .filter(|f| f.lfs)
        .map(|f| f.path.as_str())
        .collect();
    json!({
        "repo": repo.id,
        "commit": repo.commit,
        "files": digests,
        "sizes": sizes,
        "lfs": lfs,
    })
}

/// Runs the client script on a scenario, with a fresh cache; panics with its output on failure.
fn run_client(hub: &FakeHub, scenario: serde_json::Value) {
    let python = std::env::var_os("MTP_HF_PYTHON")
        .expect("MTP_HF_PYTHON: cargo xtask test prepares the huggingface_hub client");
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("scenario.json");
    std::fs::write(&config, scenario.to_string()).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hf_hub_client.py");
    let out = Command::new(python)
        .arg(&script)
        .arg(&config)
        .env("HF_ENDPOINT", &hub.base)
        .env("HF_HUB_CACHE", dir.path().join("cache"))
        .env("HF_HOME", dir.path().join("home"))
        .env("HF_HUB_DISABLE_TELEMETRY", "1")
        .env("HF_HUB_DISABLE_XET", "1")
        .env("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        .env_remove("HF_TOKEN")
        .env_remove("HUGGING_FACE_HUB_TOKEN")
        .env_remove("HF_HUB_OFFLINE")
        .env_remove("HF_HUB_ENABLE_HF_TRANSFER")
        .output()
        .expect("running MTP_HF_PYTHON");
    assert!(
        out.status.success() && out.stdout.ends_with(b"ok\n"),
        "huggingface_hub against the fake Hub failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn gets<'a>(seen: &'a [Request], method: &'a str, part: &'a str) -> Vec<&'a Request> {
    seen.iter()
        .filter(|r| r.method == method && r.path.contains(part))
        .collect()
}

#[test]
#[ignore = "needs huggingface_hub (MTP_HF_PYTHON); cargo xtask test prepares it"]
fn hf_hub_downloads_lists_caches_and_fails_against_the_fake_as_against_the_hub() {
    let repo = FakeRepo::new("org/model", files());
    let mut gated = FakeRepo::new("org/gated", files());
    gated.gated_token = Some("hf_granted".into());
    let hub = FakeHub::start(vec![repo.clone(), gated.clone()]);

    let mut scenario = expectations(&repo);
    scenario["scenario"] = json!("download");
    scenario["nested"] = json!("sub/dir/x.json");
    scenario["folders"] = json!(["sub", "sub/dir"]);
    scenario["top"] = json!([
        "a b+c.txt",
        "config.json",
        "model.safetensors",
        "sub",
        "tokenizer.json"
    ]);
    scenario["unknown"] = json!("org/no-such-model");
    scenario["gated"] = json!(gated.id);
    scenario["gated_token"] = json!("hf_granted");
    scenario["gated_commit"] = json!(gated.commit);
    run_client(&hub, scenario);

    // what the client did: paged listings, the percent-encoded name, the LFS redirect followed
    // to the CDN route (HEAD for metadata, then GET)
    let seen = hub.requests();
    assert!(
        seen.iter().all(|r| r
            .user_agent
            .as_deref()
            .is_some_and(|ua| ua.contains("hf_hub/2.4.0"))),
        "{seen:#?}"
    );
    assert!(
        gets(&seen, "GET", "/tree/").len() > 2,
        "the listing was paged"
    );
    assert!(gets(&seen, "GET", "cursor=").len() >= 2, "{seen:#?}");
    assert!(
        gets(&seen, "GET", "/org/model/resolve/")
            .iter()
            .any(|r| r.path.ends_with("/a b+c.txt")),
        "{seen:#?}"
    );
    assert!(!gets(&seen, "HEAD", "/cdn/").is_empty(), "{seen:#?}");
    assert!(!gets(&seen, "GET", "/cdn/").is_empty(), "{seen:#?}");
    // the gated repository's files went out once, to the request with the granted token
    for f in &gated.files {
        assert_eq!(
            hub.body_bytes(&gated.id, &f.path),
            f.bytes.len() as u64,
            "{}",
            f.path
        );
    }
}

#[test]
#[ignore = "needs huggingface_hub (MTP_HF_PYTHON); cargo xtask test prepares it"]
fn hf_hub_retries_and_resumes_downloads_the_fake_cut_mid_body() {
    // huggingface_hub writes what it receives in 10 MiB chunks, and resumes from what it wrote:
    // a cut at 11 MB in a 12 MiB file resumes at 10 MiB, a cut in a small file starts it again
    const MIB: usize = 1024 * 1024;
    let weights: Vec<u8> = (0..12 * MIB).map(|i| (i % 251) as u8).collect();
    let repo = FakeRepo::new(
        "org/flaky",
        vec![
            FakeFile::new("config.json", br#"{"model_type": "qwen3_5"}"#.to_vec()),
            FakeFile::new("model.safetensors", weights),
        ],
    );
    let hub = FakeHub::start(vec![repo.clone()]);
    let (small, st) = (&repo.files[0], &repo.files[1]);
    hub.fault(&repo.id, &st.path, Fault::DropAfter(11_000_000), 1);
    hub.fault(&repo.id, &small.path, Fault::DropAfter(10), 1);
    let mut scenario = expectations(&repo);
    scenario["scenario"] = json!("retry");
    run_client(&hub, scenario);

    let seen = hub.requests();
    let ranges = |part: &str| -> Vec<Option<String>> {
        gets(&seen, "GET", part)
            .iter()
            .map(|r| r.range.clone())
            .collect()
    };
    assert_eq!(
        ranges("/cdn/"),
        [None, Some(format!("bytes={}-", 10 * MIB))],
        "{seen:#?}"
    );
    assert_eq!(ranges("/config.json"), [None, None], "{seen:#?}");
    assert_eq!(
        hub.body_bytes(&repo.id, &st.path),
        11_000_000 + (st.bytes.len() - 10 * MIB) as u64
    );
    assert_eq!(
        hub.body_bytes(&repo.id, &small.path),
        10 + small.bytes.len() as u64
    );
}
