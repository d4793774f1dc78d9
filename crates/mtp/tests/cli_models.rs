//! `mtp models download|list|verify` and `mtp probe`, against the fake Hub of the tests
//! (`mtp-fakehub`: the real Hub's API on loopback, never the internet) and temporary Hugging
//! Face caches.

#[path = "cli_fake_provider.rs"]
mod fake;

use std::path::Path;
use std::process::ExitCode;

use assert_cmd::Command;
use mtp_fakehub::{FakeFile, FakeHub, FakeRepo, Fault};
use predicates::prelude::*;
use serde_json::{json, Value};

/// A safetensors file holding only the named tensors (2 bytes each).
fn safetensors(names: &[&str]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    for (i, n) in names.iter().enumerate() {
        header.insert(
            n.to_string(),
            json!({"dtype": "BF16", "shape": [1], "data_offsets": [2 * i, 2 * i + 2]}),
        );
    }
    let h = serde_json::to_vec(&header).unwrap();
    let mut f = (h.len() as u64).to_le_bytes().to_vec();
    f.extend_from_slice(&h);
    f.extend(std::iter::repeat_n(0u8, 2 * names.len()));
    f
}

fn fake_repo(id: &str, commit: &str, files: Vec<(&str, Vec<u8>)>) -> FakeRepo {
    let mut r = FakeRepo::new(
        id,
        files
            .into_iter()
            .map(|(p, b)| FakeFile::new(p, b))
            .collect(),
    );
    r.commit = commit.to_string();
    r
}

/// The repositories of these tests' Hub: a target without a head, its companion, a gated copy,
/// one whose files fail, a registry-listed pair, and repos whose listings name hostile paths.
fn repos() -> Vec<FakeRepo> {
    let target_cfg = br#"{"model_type":"qwen3_5","text_config":{"hidden_size":64,"num_hidden_layers":2,"vocab_size":32}}"#;
    let drafter_cfg = br#"{"model_type":"qwen3_5_mtp","text_config":{"hidden_size":64,"num_hidden_layers":1,"vocab_size":32}}"#;
    let target = |id: &str, commit: &str| {
        fake_repo(
            id,
            commit,
            vec![
                ("config.json", target_cfg.to_vec()),
                (
                    "model.safetensors",
                    safetensors(&[
                        "model.embed_tokens.weight",
                        "model.layers.0.mlp.up_proj.weight",
                    ]),
                ),
                ("tokenizer/vocab.txt", b"a\nb\n".to_vec()),
            ],
        )
    };
    let mut repos = vec![
        target("org/model", "0123456789abcdef0123456789abcdef01234567"),
        target("org/broken", "0123456789abcdef0123456789abcdef01234567"),
        target(
            "mlx-community/Qwen3.8-27B-4bit",
            "1111111111111111111111111111111111111111",
        ),
        fake_repo(
            "org/model-MTP",
            "89abcdef0123456789abcdef0123456789abcdef",
            vec![
                ("config.json", drafter_cfg.to_vec()),
                (
                    "model.safetensors",
                    safetensors(&[
                        "mtp.fc.weight",
                        "mtp.layers.0.mlp.up_proj.weight",
                        "mtp.norm.weight",
                    ]),
                ),
            ],
        ),
        fake_repo(
            "mlx-community/Qwen3.8-27B-MTP-4bit",
            "2222222222222222222222222222222222222222",
            vec![
                ("config.json", drafter_cfg.to_vec()),
                (
                    "model.safetensors",
                    safetensors(&["mtp.fc.weight", "mtp.layers.0.mlp.up_proj.weight"]),
                ),
            ],
        ),
    ];
    let mut gated = target("org/gated", "0123456789abcdef0123456789abcdef01234567");
    gated.gated_token = Some("hf_secret".into());
    repos.push(gated);
    for (i, name) in hostile_names().into_iter().enumerate() {
        let id = if i == 0 {
            "org/evil".to_string()
        } else {
            format!("org/evil{i}")
        };
        repos.push(fake_repo(
            &id,
            "fedcba9876543210fedcba9876543210fedcba98",
            vec![
                ("config.json", b"{}".to_vec()),
                (name.as_str(), b"x".to_vec()),
            ],
        ));
    }
    repos
}

/// The Hub of these tests, serving [`repos`].
fn serve() -> FakeHub {
    let hub = FakeHub::start(repos());
    // Every file of org/broken fails (a 403, which no retry can mend).
    for f in ["config.json", "model.safetensors", "tokenizer/vocab.txt"] {
        hub.fault("org/broken", f, Fault::Status(403), 100);
    }
    hub
}

/// Whole-file content downloads the Hub served.
fn content_gets(hub: &FakeHub) -> usize {
    hub.requests()
        .iter()
        .filter(|r| r.method == "GET" && r.range.is_none())
        .filter(|r| r.path.contains("/resolve/") || r.path.starts_with("/cdn/"))
        .count()
}

/// `Range` reads (the probe's).
fn range_gets(hub: &FakeHub) -> usize {
    hub.requests().iter().filter(|r| r.range.is_some()).count()
}

/// mtp's own folder (the companion record) for the cache `c`: beside it, never inside it.
fn mtp_home(c: &str) -> String {
    format!("{c}.mtp-home")
}

/// The binary, with the Hub at `endpoint` (or offline: no request at all) and mtp's folder
/// beside the cache `c`.
fn bin(endpoint: Option<&str>, c: &str) -> Command {
    let mut cmd = Command::cargo_bin("mtp").unwrap();
    cmd.env_remove("HF_TOKEN")
        .env_remove("HF_HUB_CACHE")
        .env_remove("HF_HOME")
        .env_remove("HF_HUB_OFFLINE")
        .env("HF_TOKEN_PATH", format!("{c}.no-token"))
        .env("MTP_HOME", mtp_home(c));
    match endpoint {
        Some(e) => cmd.env("HF_ENDPOINT", e),
        None => cmd.env("HF_HUB_OFFLINE", "1").env_remove("HF_ENDPOINT"),
    };
    cmd
}

fn dir_arg(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

#[test]
fn download_offline_sends_nothing_and_says_so() {
    let cache = tempfile::tempdir().unwrap();
    let c = dir_arg(cache.path());
    bin(None, &c)
        .args(["models", "download", "org/model", "--cache-dir", &c])
        .assert()
        .code(1)
        .stderr(
            predicate::str::contains("cannot find org/model").and(predicate::str::contains(
                "outgoing traffic has been disabled (HF_HUB_OFFLINE is set)",
            )),
        );
}

#[test]
fn download_fetches_model_and_companion_into_the_hf_cache_layout_then_list_shows_them() {
    let h = serve();
    let endpoint = h.base.clone();
    let cache = tempfile::tempdir().unwrap();
    let c = dir_arg(cache.path());
    bin(Some(&endpoint), &c)
        .args([
            "models",
            "download",
            "org/model",
            "--drafter",
            "org/model-MTP",
            "--cache-dir",
            &c,
        ])
        .assert()
        .success()
        .stdout(predicate::str::contains(
            "installed org/model with its MTP companion org/model-MTP",
        ));
    let root = cache.path().join("models--org--model");
    let sha = std::fs::read_to_string(root.join("refs/main")).unwrap();
    assert_eq!(sha, "0123456789abcdef0123456789abcdef01234567");
    let snap = root.join("snapshots").join(&sha);
    assert_eq!(
        std::fs::read(snap.join("tokenizer/vocab.txt")).unwrap(),
        b"a\nb\n"
    );
    assert!(snap.join("config.json").is_file());
    assert!(!snap.join("model.safetensors.part").exists());
    let d = cache.path().join("models--org--model-MTP");
    assert_eq!(
        std::fs::read_to_string(d.join("refs/main")).unwrap(),
        "89abcdef0123456789abcdef0123456789abcdef"
    );
    assert_eq!(content_gets(&h), 5);

    // Downloading again fetches nothing new.
    bin(Some(&endpoint), &c)
        .args([
            "models",
            "download",
            "org/model",
            "--drafter",
            "org/model-MTP",
            "--cache-dir",
            &c,
        ])
        .assert()
        .success();
    assert_eq!(content_gets(&h), 5);

    let out = bin(None, &c)
        .args(["models", "list", "--cache-dir", &c])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let text = String::from_utf8(out).unwrap();
    let line = |repo: &str| {
        text.lines()
            .find(|l| l.trim_start().starts_with(&format!("{repo} ")))
            .unwrap_or_else(|| panic!("{repo} not in {text}"))
            .to_string()
    };
    assert!(line("org/model").contains("installed"), "{text}");
    assert!(
        line("org/model").contains("MTP head: companion org/model-MTP"),
        "{text}"
    );
    assert!(
        line("org/model-MTP")
            .contains("MTP head: this is a companion drafter for org/model (1 layer, 3 tensors)"),
        "{text}"
    );

    let out = bin(None, &c)
        .args(["models", "list", "--json", "--cache-dir", &c])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let v: Value = serde_json::from_slice(&out).unwrap();
    let rows = v.as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["repo"], "org/model");
    assert_eq!(rows[0]["installed"], true);
    assert_eq!(rows[0]["companion"], "org/model-MTP");
    assert_eq!(rows[0]["companion_installed"], true);
    assert_eq!(rows[1]["drafter_for"], json!(["org/model"]));
}

#[test]
fn download_takes_the_registry_companion_when_the_weights_carry_no_head() {
    let h = serve();
    let endpoint = h.base.clone();
    let cache = tempfile::tempdir().unwrap();
    let c = dir_arg(cache.path());
    bin(Some(&endpoint), &c)
        .args(["models", "download", "mlx-community/Qwen3.8-27B-4bit", "--cache-dir", &c])
        .assert()
        .success()
        .stderr(predicate::str::contains(
            "no MTP head in the weights; fetching the registry's companion mlx-community/Qwen3.8-27B-MTP-4bit",
        ))
        .stdout(predicate::str::contains(
            "installed mlx-community/Qwen3.8-27B-4bit with its MTP companion mlx-community/Qwen3.8-27B-MTP-4bit",
        ));
    assert!(range_gets(&h) > 0, "the probe read headers by Range");
    for (folder, sha) in [
        (
            "models--mlx-community--Qwen3.8-27B-4bit",
            "1111111111111111111111111111111111111111",
        ),
        (
            "models--mlx-community--Qwen3.8-27B-MTP-4bit",
            "2222222222222222222222222222222222222222",
        ),
    ] {
        assert_eq!(
            std::fs::read_to_string(cache.path().join(folder).join("refs/main")).unwrap(),
            sha
        );
    }
    // A model whose weights carry the head needs no companion.
    bin(Some(&endpoint), &c)
        .args(["models", "download", "org/model-MTP", "--cache-dir", &c])
        .assert()
        .success()
        .stdout(predicate::str::contains("installed org/model-MTP in"));
}

#[test]
fn a_failed_companion_leaves_the_model_not_installed() {
    let h = serve();
    let endpoint = h.base.clone();
    let cache = tempfile::tempdir().unwrap();
    let c = dir_arg(cache.path());
    bin(Some(&endpoint), &c)
        .args([
            "models",
            "download",
            "org/model",
            "--drafter",
            "org/broken",
            "--cache-dir",
            &c,
        ])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("Hub request").and(predicate::str::contains("403")));
    assert!(
        !cache.path().join("models--org--model/refs/main").exists(),
        "model must not count as installed"
    );
    bin(None, &c)
        .args(["models", "list", "--cache-dir", &c])
        .assert()
        .success()
        .stdout(
            predicate::str::contains("org/broken  incomplete (download interrupted)")
                .and(predicate::str::contains("org/model ").not()),
        );
}

/// File names a hostile Hub listing may send: each must be refused before anything is written
/// (`org/evil` lists the first, `org/evil{i}` the others).
fn hostile_names() -> Vec<String> {
    [
        "../escape.txt",
        "/etc/passwd",
        "C:x",
        "a/../../b",
        "a\\..\\b",
        "nul\0byte",
        "new\nline",
        "./config.json",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain(["a".repeat(2000)])
    .collect()
}

/// Every hostile listing is refused with a message naming the file (escaped, shortened), and
/// nothing of the repo is written.
#[test]
fn hostile_listings_write_nothing() {
    let h = serve();
    let endpoint = h.base.clone();
    let cache = tempfile::tempdir().unwrap();
    let c = dir_arg(cache.path());
    for (i, name) in hostile_names().iter().enumerate() {
        let repo = if i == 0 {
            "org/evil".to_string()
        } else {
            format!("org/evil{i}")
        };
        let shown: String = name.escape_debug().take(60).collect();
        let out = bin(Some(&endpoint), &c)
            .args(["models", "download", &repo, "--cache-dir", &c])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{repo}: {err}");
        assert!(
            err.contains("unsafe file name") && err.contains(&shown),
            "{repo} ({shown}): {err}"
        );
        assert!(!err.contains('\0') && err.len() < 1000, "{repo}: {err}");
        let dir = format!("models--org--{}", repo.trim_start_matches("org/"));
        assert!(!cache.path().join(dir).exists(), "{repo} wrote something");
    }
    assert!(!cache.path().join("etc").exists() && !cache.path().join("b").exists());
}

#[test]
fn download_errors_are_clear() {
    let h = serve();
    let endpoint = h.base.clone();
    let cache = tempfile::tempdir().unwrap();
    let c = dir_arg(cache.path());
    bin(Some(&endpoint), &c)
        .args(["models", "download", "org/evil", "--cache-dir", &c])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("unsafe file name `../escape.txt`"));
    assert!(!cache.path().join("models--org--evil").exists());
    bin(Some(&endpoint), &c)
        .args(["models", "download", "org/../x", "--cache-dir", &c])
        .assert()
        .code(1)
        .stderr(predicate::str::contains(
            "invalid repository id or revision `org/../x`",
        ));
    bin(Some(&endpoint), &c)
        .args(["models", "download", "org/missing", "--cache-dir", &c])
        .assert()
        .code(1)
        .stderr(
            predicate::str::contains("Repository Not Found for url")
                .and(predicate::str::contains("correct repo id (`org/missing`)")),
        );
    bin(Some(&endpoint), &c)
        .args(["models", "download", "org/gated", "--cache-dir", &c])
        .assert()
        .code(1)
        .stderr(
            predicate::str::contains("Cannot access gated repo for url")
                .and(predicate::str::contains(
                    "Access to model org/gated is restricted",
                ))
                .and(predicate::str::contains("set HF_TOKEN")),
        );
    // The login token file is read as huggingface_hub reads it.
    std::fs::write(format!("{c}.no-token"), "hf_secret\n").unwrap();
    bin(Some(&endpoint), &c)
        .args(["models", "download", "org/gated", "--cache-dir", &c])
        .assert()
        .success();
    std::fs::remove_file(format!("{c}.no-token")).unwrap();
    std::fs::remove_dir_all(cache.path().join("models--org--gated")).unwrap();
    bin(Some(&endpoint), &c)
        .env("HF_TOKEN", "hf_secret")
        .args(["models", "download", "org/gated", "--cache-dir", &c])
        .assert()
        .success()
        .stdout(
            predicate::str::contains("installed org/gated")
                .and(predicate::str::contains("hf_secret").not()),
        )
        .stderr(predicate::str::contains("hf_secret").not());
}

#[test]
fn list_of_an_empty_cache() {
    let cache = tempfile::tempdir().unwrap();
    let c = dir_arg(cache.path());
    bin(None, &c)
        .args(["models", "list", "--cache-dir", &c])
        .assert()
        .success()
        .stdout(predicate::str::starts_with("no models in"));
}

/// Writes an installed repo into a cache by hand.
fn install(cache: &Path, repo: &str, companion: Option<&str>) {
    let root = cache.join(format!("models--{}", repo.replace('/', "--")));
    let snap = root.join("snapshots/abc123");
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::write(
        snap.join("model.safetensors"),
        safetensors(&["model.embed_tokens.weight"]),
    )
    .unwrap();
    std::fs::create_dir_all(root.join("refs")).unwrap();
    std::fs::write(root.join("refs/main"), "abc123").unwrap();
    if let Some(c) = companion {
        // mtp's own record, outside the Hugging Face cache.
        let home = std::path::PathBuf::from(in_process_mtp_home());
        std::fs::create_dir_all(&home).unwrap();
        let file = home.join("companions.json");
        let _guard = COMPANIONS.lock().unwrap();
        let mut map: serde_json::Map<String, Value> = std::fs::read(&file)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        map.insert(repo.to_string(), json!(c));
        std::fs::write(&file, serde_json::to_vec(&map).unwrap()).unwrap();
    }
}

static COMPANIONS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The `MTP_HOME` of the in-process runs (`verify`), set once for this test binary.
fn in_process_mtp_home() -> String {
    static HOME: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HOME.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap().keep();
        let home = dir.join("mtp-home").to_string_lossy().into_owned();
        std::env::set_var("MTP_HOME", &home);
        home
    })
    .clone()
}

fn verify(args: &[&str]) -> (ExitCode, String, String) {
    fake::register();
    in_process_mtp_home();
    let (io, c) = mtp::cli::Io::captured();
    let mut full = vec!["mtp", "models", "verify", "--provider", "fake"];
    full.extend_from_slice(args);
    let code = mtp::cli::run_with(full, io);
    (code, c.stdout(), c.stderr())
}

#[test]
fn verify_loads_an_installed_model_and_checks_greedy_output() {
    let cache = tempfile::tempdir().unwrap();
    let c = dir_arg(cache.path());
    install(cache.path(), "org/knows-good", None);
    let (code, out, err) = verify(&["org/knows-good", "--cache-dir", &c]);
    assert_eq!(code, ExitCode::SUCCESS, "{err}");
    assert_eq!(
        out.lines().filter(|l| l.starts_with("ok ")).count(),
        3,
        "{out}"
    );
    assert!(
        out.contains(
            "org/knows-good passed: 3 known-answer prompts answered, greedy output well-formed \
             and identical with MTP on and off"
        ),
        "{out}"
    );
    let opened = fake::OPTIONS.lock().unwrap();
    assert!(opened
        .iter()
        .any(|(m, _)| m.ends_with("models--org--knows-good/snapshots/abc123")));
    drop(opened);
    // plain continuations (no chat template: a thinking model would spend the budget
    // reasoning), greedy, each once with MTP and once without
    let reqs = fake::REQUESTS.lock().unwrap();
    let france: Vec<_> = reqs
        .iter()
        .filter(|r| r.prompt == "The capital of France is")
        .collect();
    assert!(france.len() >= 2, "{}", france.len());
    assert!(france.iter().all(|r| r.raw_prompt));
    assert!(france
        .iter()
        .any(|r| r.speculation.as_ref().and_then(|s| s.mode) == Some(mtp::SpeculationMode::Off)));
}

#[test]
fn verify_fails_fluent_text_that_does_not_answer() {
    // well-formed, varied text that is not a continuation of the prompt: what a garbled or
    // mis-converted checkpoint produces, and what must not be called sensible
    let cache = tempfile::tempdir().unwrap();
    let c = dir_arg(cache.path());
    install(cache.path(), "org/babble", None);
    let (code, out, err) = verify(&["org/babble", "--cache-dir", &c]);
    assert_eq!(code, ExitCode::FAILURE, "{out}");
    assert!(
        err.contains(
            "3 of 3 prompts failed; first: the greedy continuation does not contain `Paris`"
        ),
        "{err}"
    );
    assert!(!out.contains("passed"), "{out}");
}

#[test]
fn verify_fails_when_mtp_changes_greedy_output() {
    let cache = tempfile::tempdir().unwrap();
    let c = dir_arg(cache.path());
    install(cache.path(), "org/knows-diverge", None);
    let (code, out, err) = verify(&["org/knows-diverge", "--cache-dir", &c]);
    assert_eq!(code, ExitCode::FAILURE, "{out}");
    assert!(
        err.contains("MTP changed the greedy output (it differs from the target-only output after"),
        "{err}"
    );
}

#[test]
fn verify_catches_degenerate_and_empty_output() {
    let cache = tempfile::tempdir().unwrap();
    let c = dir_arg(cache.path());
    install(cache.path(), "org/garbage", None);
    let (code, out, err) = verify(&["org/garbage", "--cache-dir", &c]);
    assert_eq!(code, ExitCode::FAILURE);
    assert!(out.contains("FAIL"), "{out}");
    assert!(
        err.contains("model org/garbage failed verification: 3 of 3 prompts failed"),
        "{err}"
    );
    assert!(err.contains("repeats 1 character(s) only"), "{err}");
    assert!(err.contains("mis-converted"), "{err}");
    install(cache.path(), "org/empty", None);
    let (code, _, err) = verify(&["org/empty", "--cache-dir", &c]);
    assert_eq!(code, ExitCode::FAILURE);
    assert!(err.contains("the output is empty"), "{err}");
}

#[test]
fn verify_refuses_what_is_not_installed() {
    let cache = tempfile::tempdir().unwrap();
    let c = dir_arg(cache.path());
    let (code, _, err) = verify(&["org/absent", "--cache-dir", &c]);
    assert_eq!(code, ExitCode::FAILURE);
    assert!(err.contains("org/absent is not installed"), "{err}");
    assert!(
        err.contains("run `mtp models download org/absent`"),
        "{err}"
    );
    install(cache.path(), "org/half", Some("org/half-MTP"));
    let (code, _, err) = verify(&["org/half", "--cache-dir", &c]);
    assert_eq!(code, ExitCode::FAILURE);
    assert!(
        err.contains("its MTP companion org/half-MTP is missing"),
        "{err}"
    );
}

#[test]
fn probe_reports_the_head_from_tensor_names() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("model.safetensors"),
        safetensors(&[
            "model.embed_tokens.weight",
            "mtp.fc.weight",
            "mtp.layers.0.mlp.up_proj.weight",
        ]),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        r#"{"model_type":"qwen3_5","text_config":{"hidden_size":64,"num_hidden_layers":2,"mtp_num_hidden_layers":1}}"#,
    )
    .unwrap();
    let p = dir_arg(dir.path());
    let c = dir_arg(&dir.path().join("cache"));
    bin(None, &c).args(["probe", &p]).assert().success().stdout(
        predicate::str::contains("MTP head: yes").and(predicate::str::contains("mtp.fc.weight")),
    );
    let out = bin(None, &c)
        .args(["probe", &p, "--json"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let v: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["mtp_head"], true);
    assert_eq!(v["mtp_layers"], 1);
    assert_eq!(v["format"], "safetensors");
    assert!(v["runtimes"].as_array().is_some_and(|r| !r.is_empty()));
}

#[test]
fn probe_bad_input_is_exit_code_1_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("x.gguf");
    std::fs::write(&bad, b"XXXX\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0").unwrap();
    let c = dir_arg(&dir.path().join("cache"));
    let out = bin(None, &c)
        .args(["probe", &dir_arg(&bad)])
        .assert()
        .code(1)
        .get_output()
        .stderr
        .clone();
    let err = String::from_utf8(out).unwrap();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("bad GGUF header"), "{err}");
    bin(None, &c)
        .args(["probe", "/nonexistent/model"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("cannot probe /nonexistent/model"));
    let cache = tempfile::tempdir().unwrap();
    bin(None, &c)
        .env("HF_HUB_CACHE", cache.path())
        .args(["probe", "org/not-cached"])
        .assert()
        .code(1)
        .stderr(
            predicate::str::contains("cannot find org/not-cached@main in the disk cache")
                .and(predicate::str::contains("HF_HUB_OFFLINE")),
        );
}

/// A GGUF v3 header with one key (`general.architecture`) and no tensors.
fn tiny_gguf() -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend(0u64.to_le_bytes()); // tensors
    b.extend(1u64.to_le_bytes()); // key-value pairs
    let key = b"general.architecture";
    b.extend((key.len() as u64).to_le_bytes());
    b.extend(key);
    b.extend(8u32.to_le_bytes()); // string
    let v = b"qwen35";
    b.extend((v.len() as u64).to_le_bytes());
    b.extend(v);
    b
}

#[test]
fn verify_routes_a_gguf_repo_to_the_gguf_provider() {
    let cache = tempfile::tempdir().unwrap();
    let c = dir_arg(cache.path());
    let root = cache.path().join("models--org--model-GGUF");
    let snap = root.join("snapshots/abc123");
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::create_dir_all(root.join("refs")).unwrap();
    std::fs::write(root.join("refs/main"), "abc123").unwrap();
    std::fs::write(snap.join("Model-Q4_K_M.gguf"), tiny_gguf()).unwrap();
    std::fs::write(snap.join("mmproj-Model-F16.gguf"), tiny_gguf()).unwrap();
    let run = |extra: &[&str]| {
        let (io, cap) = mtp::cli::Io::captured();
        let mut args = vec![
            "mtp",
            "models",
            "verify",
            "org/model-GGUF",
            "--cache-dir",
            &c,
        ];
        args.extend_from_slice(extra);
        let code = mtp::cli::run_with(args, io);
        (code, cap.stderr())
    };
    // no --provider: the gguf route, whether or not this build links llama.cpp (the tiny file
    // has no weights, so loading fails either way), never the safetensors loader
    let (code, err) = run(&[]);
    assert_eq!(code, ExitCode::FAILURE, "{err}");
    assert!(err.contains("cannot start provider `gguf`"), "{err}");
    assert!(!err.contains("config.json"), "{err}");
    // --file names the GGUF; one that is not there is a usage error naming it
    let (code, err) = run(&["--file", "Model-Q8_0.gguf"]);
    assert_eq!(code, ExitCode::from(2), "{err}");
    assert!(err.contains("Model-Q8_0.gguf does not exist"), "{err}");
    // forcing the native engine on GGUF weights says what to do instead
    let (code, err) = run(&["--provider", "native"]);
    assert_eq!(code, ExitCode::FAILURE, "{err}");
    assert!(
        err.contains(
            "holds GGUF weights (Model-Q4_K_M.gguf), which the native engine does not read"
        ),
        "{err}"
    );
}

#[test]
fn probe_takes_the_gguf_named_by_file() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("Model-Q4_K_M.gguf"), tiny_gguf()).unwrap();
    std::fs::write(d.path().join("Model-Q8_0.gguf"), tiny_gguf()).unwrap();
    let dir = dir_arg(d.path());
    let c = dir_arg(&d.path().join("cache"));
    let json = |extra: &[&str]| -> Value {
        let out = bin(None, &c)
            .args(["probe", &dir, "--json"])
            .args(extra)
            .assert()
            .success()
            .get_output()
            .stdout
            .clone();
        serde_json::from_slice(&out).unwrap()
    };
    let v = json(&[]);
    assert_eq!(v["file"], "Model-Q4_K_M.gguf");
    assert!(v["warnings"][0]
        .as_str()
        .unwrap()
        .contains("2 GGUF files; probed Model-Q4_K_M.gguf"));
    let v = json(&["--file", "Model-Q8_0.gguf"]);
    assert_eq!(v["file"], "Model-Q8_0.gguf");
    // at the terminal the hint names the flag
    bin(None, &c)
        .args(["probe", &dir])
        .assert()
        .success()
        .stdout(predicate::str::contains(
            "pass --file NAME to choose another",
        ));
}

// ------------------------------------------------- the official client, both ways round

/// The interpreter with the official `huggingface_hub` (`cargo xtask test` prepares it).
fn hf_python() -> String {
    std::env::var("MTP_HF_PYTHON").expect(
        "MTP_HF_PYTHON names a Python with huggingface_hub; `cargo xtask test` prepares one",
    )
}

fn interop(args: &[&str], envs: &[(&str, &str)]) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hf_hub/interop.py");
    let mut cmd = std::process::Command::new(hf_python());
    cmd.arg(script)
        .args(args)
        .env_remove("HF_ENDPOINT")
        .env_remove("HF_TOKEN")
        .env_remove("HF_HOME")
        .env_remove("HF_HUB_CACHE")
        .env("HF_HUB_DISABLE_TELEMETRY", "1")
        .env("HF_HUB_DISABLE_XET", "1")
        .env("HF_HUB_DISABLE_PROGRESS_BARS", "1");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "interop.py {args:?}: {text}");
    assert!(text.contains("ok "), "{text}");
}

/// The bundled trained checkpoint (with its MTP head) as a Hub repository.
fn tiny_repo(id: &str) -> FakeRepo {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny-trained");
    let mut files = Vec::new();
    for e in std::fs::read_dir(&dir).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("golden") {
            continue;
        }
        files.push(FakeFile::new(&name, std::fs::read(e.path()).unwrap()));
    }
    FakeRepo::new(id, files)
}

#[test]
#[ignore = "needs huggingface_hub (MTP_HF_PYTHON); cargo xtask test prepares it"]
fn hf_hub_finds_offline_what_mtp_downloaded() {
    let h = serve();
    let endpoint = h.base.clone();
    let cache = tempfile::tempdir().unwrap();
    let c = dir_arg(cache.path());
    bin(Some(&endpoint), &c)
        .args([
            "models",
            "download",
            "org/model",
            "--drafter",
            "org/model-MTP",
            "--cache-dir",
            &c,
        ])
        .assert()
        .success();
    let model = served_files("org/model");
    let drafter = served_files("org/model-MTP");
    let expected = json!({
        "org/model": {
            "snapshot": cache.path().join("models--org--model/snapshots/0123456789abcdef0123456789abcdef01234567"),
            "files": model,
        },
        "org/model-MTP": {
            "snapshot": cache.path().join("models--org--model-MTP/snapshots/89abcdef0123456789abcdef0123456789abcdef"),
            "files": drafter,
        },
    });
    interop(
        &["read", &c, &expected.to_string()],
        &[("HF_HUB_OFFLINE", "1")],
    );
}

/// `name -> sha256` of a repo the test Hub serves.
fn served_files(id: &str) -> Value {
    let repo = repos()
        .into_iter()
        .find(|r| r.id == id)
        .expect("a served repo");
    Value::Object(
        repo.files
            .iter()
            .map(|f| (f.path.clone(), json!(f.sha256_hex())))
            .collect(),
    )
}

#[test]
#[ignore = "needs huggingface_hub (MTP_HF_PYTHON); cargo xtask test prepares it"]
fn hf_hub_downloads_are_found_listed_and_run_by_mtp() {
    let h = FakeHub::start(vec![tiny_repo("org/tiny")]);
    let cache = tempfile::tempdir().unwrap();
    let c = dir_arg(cache.path());
    interop(&["fetch", &c, "org/tiny"], &[("HF_ENDPOINT", &h.base)]);
    // Listed as installed, with the head found in the weights.
    let out = bin(None, &c)
        .args(["models", "list", "--json", "--cache-dir", &c])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let v: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v[0]["repo"], "org/tiny", "{v}");
    assert_eq!(v[0]["installed"], true, "{v}");
    assert!(
        v[0]["mtp_head"].as_str().unwrap().starts_with("embedded"),
        "{v}"
    );
    // Downloading it again with mtp reuses every blob huggingface_hub wrote (same names).
    h.reset_counters();
    bin(Some(&h.base), &c)
        .args(["models", "download", "org/tiny", "--cache-dir", &c])
        .assert()
        .success()
        .stdout(predicate::str::contains("(0 bytes in"));
    assert_eq!(content_gets(&h), 0);
    h.reset_counters();
    // Offline, by repo id: generation runs from the cache, with its MTP head.
    let out = bin(None, &c)
        .env("HF_HUB_CACHE", &c)
        .args([
            "generate",
            "--model",
            "org/tiny",
            "--max-tokens",
            "12",
            "--json",
            "fn main() {",
        ])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let v: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["metadata"]["speculation"]["used"], true, "{v}");
    assert!(h.requests().is_empty(), "offline: no request");
}
