//! `mtp models download|list|verify` and `mtp probe`, against a local server in the Hub's URL
//! layout (never the internet) and temporary Hugging Face caches.

#[path = "cli_fake_provider.rs"]
mod fake;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use assert_cmd::Command;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
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

struct Repo {
    sha: &'static str,
    files: BTreeMap<String, Vec<u8>>,
    /// Serve the listing but fail every file with 500.
    broken: bool,
    /// Require `Authorization: Bearer <token>`.
    token: Option<&'static str>,
}

#[derive(Clone)]
struct Hub {
    repos: Arc<BTreeMap<String, Repo>>,
    /// Whole-file downloads.
    file_requests: Arc<AtomicUsize>,
    /// `Range` reads (the probe's).
    range_requests: Arc<AtomicUsize>,
}

fn hub() -> Hub {
    let target_cfg = br#"{"model_type":"qwen3_5","text_config":{"hidden_size":64,"num_hidden_layers":2,"vocab_size":32}}"#;
    let drafter_cfg = br#"{"model_type":"qwen3_5_mtp","text_config":{"hidden_size":64,"num_hidden_layers":1,"vocab_size":32}}"#;
    let mut repos = BTreeMap::new();
    let target = |broken, token| Repo {
        sha: "0123456789abcdef0123456789abcdef01234567",
        files: BTreeMap::from([
            ("config.json".to_string(), target_cfg.to_vec()),
            (
                "model.safetensors".to_string(),
                safetensors(&[
                    "model.embed_tokens.weight",
                    "model.layers.0.mlp.up_proj.weight",
                ]),
            ),
            ("tokenizer/vocab.txt".to_string(), b"a\nb\n".to_vec()),
        ]),
        broken,
        token,
    };
    repos.insert("org/model".to_string(), target(false, None));
    repos.insert("org/broken".to_string(), target(true, None));
    repos.insert("org/gated".to_string(), target(false, Some("hf_secret")));
    repos.insert(
        "org/model-MTP".to_string(),
        Repo {
            sha: "89abcdef0123456789abcdef0123456789abcdef",
            files: BTreeMap::from([
                ("config.json".to_string(), drafter_cfg.to_vec()),
                (
                    "model.safetensors".to_string(),
                    safetensors(&[
                        "mtp.fc.weight",
                        "mtp.layers.0.mlp.up_proj.weight",
                        "mtp.norm.weight",
                    ]),
                ),
            ]),
            broken: false,
            token: None,
        },
    );
    // A target the embedded registry lists, whose head ships as a companion.
    let mut listed = target(false, None);
    listed.sha = "1111111111111111111111111111111111111111";
    repos.insert("mlx-community/Qwen3.8-27B-4bit".to_string(), listed);
    repos.insert(
        "mlx-community/Qwen3.8-27B-MTP-4bit".to_string(),
        Repo {
            sha: "2222222222222222222222222222222222222222",
            files: BTreeMap::from([
                ("config.json".to_string(), drafter_cfg.to_vec()),
                (
                    "model.safetensors".to_string(),
                    safetensors(&["mtp.fc.weight", "mtp.layers.0.mlp.up_proj.weight"]),
                ),
            ]),
            broken: false,
            token: None,
        },
    );
    for (i, name) in hostile_names().into_iter().enumerate() {
        let id = if i == 0 {
            "org/evil".to_string()
        } else {
            format!("org/evil{i}")
        };
        repos.insert(
            id,
            Repo {
                sha: "fedcba9876543210fedcba9876543210fedcba98",
                files: BTreeMap::from([
                    ("config.json".to_string(), b"{}".to_vec()),
                    (name, b"x".to_vec()),
                ]),
                broken: false,
                token: None,
            },
        );
    }
    Hub {
        repos: Arc::new(repos),
        file_requests: Arc::new(AtomicUsize::new(0)),
        range_requests: Arc::new(AtomicUsize::new(0)),
    }
}

fn authorized(repo: &Repo, headers: &HeaderMap) -> bool {
    match repo.token {
        None => true,
        Some(t) => headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v == format!("Bearer {t}")),
    }
}

async fn revision(
    State(h): State<Hub>,
    UrlPath((org, name, _rev)): UrlPath<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    let Some(repo) = h.repos.get(&format!("{org}/{name}")) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    if !authorized(repo, &headers) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let siblings: Vec<Value> = repo.files.keys().map(|f| json!({"rfilename": f})).collect();
    axum::Json(json!({"id": format!("{org}/{name}"), "sha": repo.sha, "siblings": siblings}))
        .into_response()
}

async fn tree(
    State(h): State<Hub>,
    UrlPath((org, name, _rev)): UrlPath<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    let Some(repo) = h.repos.get(&format!("{org}/{name}")) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    if !authorized(repo, &headers) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let entries: Vec<Value> = repo
        .files
        .iter()
        .map(|(f, b)| json!({"type": "file", "path": f, "size": b.len()}))
        .collect();
    axum::Json(Value::Array(entries)).into_response()
}

/// `bytes=a-b` → (a, b).
fn range(headers: &HeaderMap) -> Option<(usize, usize)> {
    let v = headers
        .get("range")?
        .to_str()
        .ok()?
        .strip_prefix("bytes=")?;
    let (a, b) = v.split_once('-')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

async fn resolve(
    State(h): State<Hub>,
    UrlPath((org, name, rev, path)): UrlPath<(String, String, String, String)>,
    headers: HeaderMap,
) -> Response {
    let Some(repo) = h.repos.get(&format!("{org}/{name}")) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    if !authorized(repo, &headers) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    if repo.broken {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    }
    if rev != repo.sha && rev != "main" {
        return StatusCode::NOT_FOUND.into_response();
    }
    let Some(bytes) = repo.files.get(&path) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    match range(&headers) {
        Some((a, b)) if a < bytes.len() => {
            let b = b.min(bytes.len() - 1);
            h.range_requests.fetch_add(1, Ordering::SeqCst);
            (
                StatusCode::PARTIAL_CONTENT,
                [("content-range", format!("bytes {a}-{b}/{}", bytes.len()))],
                bytes[a..=b].to_vec(),
            )
                .into_response()
        }
        Some(_) => StatusCode::RANGE_NOT_SATISFIABLE.into_response(),
        None => {
            h.file_requests.fetch_add(1, Ordering::SeqCst);
            bytes.clone().into_response()
        }
    }
}

/// Starts the Hub on a loopback port in a background thread.
fn serve() -> (String, Hub) {
    let h = hub();
    let app = Router::new()
        .route("/api/models/{org}/{name}/revision/{rev}", get(revision))
        .route("/api/models/{org}/{name}/tree/{rev}", get(tree))
        .route("/{org}/{name}/resolve/{rev}/{*path}", get(resolve))
        .with_state(h.clone());
    let (tx, rx) = std::sync::mpsc::channel::<SocketAddr>();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(l.local_addr().unwrap()).unwrap();
            axum::serve(l, app).await.unwrap();
        });
    });
    let addr = rx.recv().unwrap();
    (format!("http://{addr}"), h)
}

fn bin(endpoint: Option<&str>) -> Command {
    let mut c = Command::cargo_bin("mtp").unwrap();
    c.env_remove("HF_TOKEN")
        .env_remove("HF_HUB_CACHE")
        .env_remove("HF_HOME");
    match endpoint {
        Some(e) => c.env("HF_ENDPOINT", e),
        None => c.env_remove("HF_ENDPOINT"),
    };
    c
}

fn dir_arg(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

#[test]
fn download_needs_hf_endpoint() {
    let cache = tempfile::tempdir().unwrap();
    bin(None)
        .args([
            "models",
            "download",
            "org/model",
            "--cache-dir",
            &dir_arg(cache.path()),
        ])
        .assert()
        .code(1)
        .stderr(predicate::str::contains(
            "HF_ENDPOINT is not set — set HF_ENDPOINT",
        ));
}

#[test]
fn download_fetches_model_and_companion_into_the_hf_cache_layout_then_list_shows_them() {
    let (endpoint, h) = serve();
    let cache = tempfile::tempdir().unwrap();
    let c = dir_arg(cache.path());
    bin(Some(&endpoint))
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
    assert_eq!(h.file_requests.load(Ordering::SeqCst), 5);

    // Downloading again fetches nothing new.
    bin(Some(&endpoint))
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
    assert_eq!(h.file_requests.load(Ordering::SeqCst), 5);

    let out = bin(None)
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

    let out = bin(None)
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
    let (endpoint, h) = serve();
    let cache = tempfile::tempdir().unwrap();
    let c = dir_arg(cache.path());
    bin(Some(&endpoint))
        .args(["models", "download", "mlx-community/Qwen3.8-27B-4bit", "--cache-dir", &c])
        .assert()
        .success()
        .stderr(predicate::str::contains(
            "no MTP head in the weights; fetching the registry's companion mlx-community/Qwen3.8-27B-MTP-4bit",
        ))
        .stdout(predicate::str::contains(
            "installed mlx-community/Qwen3.8-27B-4bit with its MTP companion mlx-community/Qwen3.8-27B-MTP-4bit",
        ));
    assert!(
        h.range_requests.load(Ordering::SeqCst) > 0,
        "the probe read headers by Range"
    );
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
    bin(Some(&endpoint))
        .args(["models", "download", "org/model-MTP", "--cache-dir", &c])
        .assert()
        .success()
        .stdout(predicate::str::contains("installed org/model-MTP in"));
}

#[test]
fn a_failed_companion_leaves_the_model_not_installed() {
    let (endpoint, _h) = serve();
    let cache = tempfile::tempdir().unwrap();
    let c = dir_arg(cache.path());
    bin(Some(&endpoint))
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
        .stderr(predicate::str::contains("Hub request").and(predicate::str::contains("500")));
    assert!(
        !cache.path().join("models--org--model/refs/main").exists(),
        "model must not count as installed"
    );
    bin(None)
        .args(["models", "list", "--cache-dir", &c])
        .assert()
        .success()
        .stdout(
            predicate::str::contains("org/model").and(predicate::str::contains(
                "incomplete (download interrupted)",
            )),
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
    let (endpoint, _h) = serve();
    let cache = tempfile::tempdir().unwrap();
    let c = dir_arg(cache.path());
    for (i, name) in hostile_names().iter().enumerate() {
        let repo = if i == 0 {
            "org/evil".to_string()
        } else {
            format!("org/evil{i}")
        };
        let shown: String = name.escape_debug().take(60).collect();
        let out = bin(Some(&endpoint))
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
    let (endpoint, _h) = serve();
    let cache = tempfile::tempdir().unwrap();
    let c = dir_arg(cache.path());
    bin(Some(&endpoint))
        .args(["models", "download", "org/evil", "--cache-dir", &c])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("unsafe file name `../escape.txt`"));
    assert!(!cache.path().join("models--org--evil").exists());
    bin(Some(&endpoint))
        .args(["models", "download", "org/../x", "--cache-dir", &c])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("invalid repo id `org/../x`"));
    bin(Some(&endpoint))
        .args(["models", "download", "org/missing", "--cache-dir", &c])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("404").and(predicate::str::contains("check the repo id")));
    bin(Some(&endpoint))
        .args(["models", "download", "org/gated", "--cache-dir", &c])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("set HF_TOKEN"));
    bin(Some(&endpoint))
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
    bin(None)
        .args(["models", "list", "--cache-dir", &dir_arg(cache.path())])
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
        std::fs::write(root.join("mtp-companion"), c).unwrap();
    }
}

fn verify(args: &[&str]) -> (ExitCode, String, String) {
    fake::register();
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
    bin(None).args(["probe", &p]).assert().success().stdout(
        predicate::str::contains("MTP head: yes").and(predicate::str::contains("mtp.fc.weight")),
    );
    let out = bin(None)
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
    let out = bin(None)
        .args(["probe", &dir_arg(&bad)])
        .assert()
        .code(1)
        .get_output()
        .stderr
        .clone();
    let err = String::from_utf8(out).unwrap();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("bad GGUF header"), "{err}");
    bin(None)
        .args(["probe", "/nonexistent/model"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("cannot probe /nonexistent/model"));
    let cache = tempfile::tempdir().unwrap();
    bin(None)
        .env("HF_HUB_CACHE", cache.path())
        .args(["probe", "org/not-cached"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("HF_ENDPOINT is not set"));
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
    let json = |extra: &[&str]| -> Value {
        let out = bin(None)
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
    bin(None)
        .args(["probe", &dir])
        .assert()
        .success()
        .stdout(predicate::str::contains(
            "pass --file NAME to choose another",
        ));
}
