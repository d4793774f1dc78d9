//! The one Hub client against a fake Hub that behaves as the real one does (`mtp-fakehub`:
//! paginated listings, LFS redirects, `Range`, dropped and stalled connections, corrupt
//! bytes, gated and missing repos), and the cache it writes checked file by file against the
//! layout `huggingface_hub` writes and reads.

use std::path::Path;
use std::time::Duration;

use mtp_detect::cache::{cached_repo, scan, RepoFolder};
use mtp_detect::hub::{download_snapshot, HubClient, HubConfig, HubError, NoProgress};
use mtp_detect::{CacheConfig, RepoId};
use mtp_fakehub::{FakeFile, FakeHub, FakeRepo, Fault};

const WEIGHTS: usize = 300_000;

fn weights() -> Vec<u8> {
    (0..WEIGHTS).map(|i| (i * 31 % 251) as u8).collect()
}

fn repo() -> FakeRepo {
    FakeRepo::new(
        "org/model",
        vec![
            FakeFile::new("config.json", br#"{"model_type":"qwen3_5"}"#.to_vec()),
            FakeFile::new("model.safetensors", weights()),
            FakeFile::new("tokenizer.json", b"{}".to_vec()),
            FakeFile::new("sub/dir/extra.json", b"[1,2,3]".to_vec()),
            FakeFile::new("a b+c.txt", b"spaces and plus".to_vec()),
            FakeFile::new("empty.txt", Vec::new()),
        ],
    )
}

fn gated() -> FakeRepo {
    let mut r = FakeRepo::new(
        "org/gated",
        vec![FakeFile::new("config.json", b"{}".to_vec())],
    );
    r.gated_token = Some("hf_granted".into());
    r
}

fn config(hub: &FakeHub) -> HubConfig {
    let mut c = HubConfig::new(hub.base.clone());
    c.backoff = Duration::from_millis(20);
    c.download_timeout = Duration::from_millis(700);
    c
}

fn id(s: &str) -> RepoId {
    RepoId::parse(s).unwrap()
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn get(cfg: &HubConfig, cache: &Path, repo: &str) -> Result<mtp_detect::hub::Snapshot, HubError> {
    let client = HubClient::new(cfg.clone()).unwrap();
    rt().block_on(download_snapshot(
        &client,
        cache,
        &id(repo),
        "main",
        &NoProgress,
    ))
}

#[test]
fn a_download_lands_in_the_standard_cache_layout() {
    let fake = repo();
    let hub = FakeHub::start(vec![fake.clone()]).with_page_size(2);
    let cache = tempfile::tempdir().unwrap();
    let snap = get(&config(&hub), cache.path(), "org/model").unwrap();
    assert_eq!(snap.commit, fake.commit);
    // Every page of the listing was followed: six files over three pages.
    assert_eq!(snap.files.len(), 6, "{:?}", snap.files);
    let folder = RepoFolder::new(cache.path(), &id("org/model"));
    for f in &fake.files {
        let pointer = folder.pointer(&fake.commit, &f.path);
        // A relative symlink into blobs/, named by the ETag (the sha256 for LFS files).
        let target = std::fs::read_link(&pointer).unwrap();
        assert!(target.is_relative(), "{target:?}");
        let depth = 2 + f.path.matches('/').count();
        let mut want = std::path::PathBuf::new();
        for _ in 0..depth {
            want.push("..");
        }
        want.push("blobs");
        want.push(f.etag());
        assert_eq!(target, want, "{}", f.path);
        assert_eq!(std::fs::read(&pointer).unwrap(), f.bytes, "{}", f.path);
    }
    let big = fake
        .files
        .iter()
        .find(|f| f.path == "model.safetensors")
        .unwrap();
    assert_eq!(
        big.etag(),
        big.sha256_hex(),
        "an LFS blob is named by its sha256"
    );
    assert_eq!(
        std::fs::read_to_string(folder.root().join("refs/main")).unwrap(),
        fake.commit,
        "refs/main holds the commit, with no newline"
    );
    assert!(std::fs::read_to_string(cache.path().join("CACHEDIR.TAG"))
        .unwrap()
        .starts_with("Signature: 8a477f597d28d172789f06886806bc55"));
    assert!(cache
        .path()
        .join(".locks/models--org--model")
        .join(format!("{}.lock", big.etag()))
        .exists());
    assert!(folder.incomplete_blobs().is_empty());
    // Read back as the cache and the resolver see it.
    let c = cached_repo(cache.path(), &id("org/model")).unwrap();
    assert!(c.is_complete(), "{c:?}");
    assert_eq!(scan(cache.path()).unwrap().len(), 1);
    let (dir, commit) = CacheConfig::new(cache.path())
        .snapshot(&id("org/model"), "main")
        .unwrap();
    assert_eq!((dir, commit), (snap.dir.clone(), fake.commit.clone()));
    // A second download reads nothing but metadata.
    hub.reset_counters();
    let again = get(&config(&hub), cache.path(), "org/model").unwrap();
    assert_eq!(again.downloaded, 0);
    assert_eq!(hub.body_bytes("org/model", "model.safetensors"), 0);
}

#[test]
fn a_dropped_connection_is_resumed_with_range_not_restarted() {
    let hub = FakeHub::start(vec![repo()]);
    hub.fault(
        "org/model",
        "model.safetensors",
        Fault::DropAfter(100_000),
        2,
    );
    let cache = tempfile::tempdir().unwrap();
    let snap = get(&config(&hub), cache.path(), "org/model").unwrap();
    let bytes = std::fs::read(snap.dir.join("model.safetensors")).unwrap();
    assert_eq!(bytes, weights());
    let ranges: Vec<String> = hub
        .requests()
        .into_iter()
        .filter(|r| r.method == "GET")
        .filter_map(|r| r.range)
        .collect();
    assert_eq!(
        ranges,
        vec!["bytes=100000-", "bytes=200000-"],
        "resumed where each try stopped"
    );
    assert_eq!(
        hub.body_bytes("org/model", "model.safetensors"),
        WEIGHTS as u64,
        "no byte fetched twice"
    );
}

#[test]
fn a_download_killed_half_way_resumes_in_the_next_run() {
    let hub = FakeHub::start(vec![repo()]);
    hub.fault(
        "org/model",
        "model.safetensors",
        Fault::DropAfter(120_000),
        1,
    );
    let cache = tempfile::tempdir().unwrap();
    let mut once = config(&hub);
    once.attempts = 1;
    let e = get(&once, cache.path(), "org/model").unwrap_err();
    assert!(matches!(e, HubError::Http { status: None, .. }), "{e:?}");
    // Not installed, and the part is kept for the next run.
    let folder = RepoFolder::new(cache.path(), &id("org/model"));
    assert!(!folder.root().join("refs/main").exists());
    let parts = folder.incomplete_blobs();
    assert_eq!(parts.len(), 1);
    assert_eq!(std::fs::metadata(&parts[0]).unwrap().len(), 120_000);
    let c = cached_repo(cache.path(), &id("org/model")).unwrap();
    assert!(!c.is_complete());
    hub.reset_counters();
    let snap = get(&config(&hub), cache.path(), "org/model").unwrap();
    assert_eq!(
        std::fs::read(snap.dir.join("model.safetensors")).unwrap(),
        weights()
    );
    let range = hub
        .requests()
        .into_iter()
        .filter(|r| r.method == "GET" && r.range.is_some())
        .map(|r| r.range.unwrap())
        .collect::<Vec<_>>();
    assert_eq!(range, vec!["bytes=120000-"]);
    assert_eq!(
        hub.body_bytes("org/model", "model.safetensors"),
        (WEIGHTS - 120_000) as u64
    );
    assert!(folder.incomplete_blobs().is_empty());
}

#[test]
fn a_stalled_connection_is_dropped_and_resumed() {
    let hub = FakeHub::start(vec![repo()]);
    hub.fault(
        "org/model",
        "model.safetensors",
        Fault::StallAfter(50_000, Duration::from_secs(30)),
        1,
    );
    let cache = tempfile::tempdir().unwrap();
    let t = std::time::Instant::now();
    let snap = get(&config(&hub), cache.path(), "org/model").unwrap();
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    assert_eq!(
        std::fs::read(snap.dir.join("model.safetensors")).unwrap(),
        weights()
    );
}

#[test]
fn a_server_that_ignores_range_restarts_the_file_cleanly() {
    let hub = FakeHub::start(vec![repo()]);
    hub.fault(
        "org/model",
        "model.safetensors",
        Fault::DropAfter(80_000),
        1,
    );
    hub.fault("org/model", "model.safetensors", Fault::IgnoreRange, 1);
    let cache = tempfile::tempdir().unwrap();
    let snap = get(&config(&hub), cache.path(), "org/model").unwrap();
    assert_eq!(
        std::fs::read(snap.dir.join("model.safetensors")).unwrap(),
        weights()
    );
}

#[test]
fn corrupt_bytes_are_refused_and_nothing_is_installed() {
    let fake = repo();
    let big = fake
        .files
        .iter()
        .find(|f| f.path == "model.safetensors")
        .unwrap()
        .clone();
    let hub = FakeHub::start(vec![fake]);
    hub.fault("org/model", "model.safetensors", Fault::Corrupt, 10);
    let cache = tempfile::tempdir().unwrap();
    let e = get(&config(&hub), cache.path(), "org/model").unwrap_err();
    match &e {
        HubError::Mismatch {
            file,
            what,
            expected,
            actual,
            ..
        } => {
            assert_eq!(file, "model.safetensors");
            assert_eq!(*what, "sha256");
            assert_eq!(expected, &big.sha256_hex());
            assert_ne!(actual, expected);
        }
        other => panic!("{other:?}"),
    }
    let msg = e.to_string();
    assert!(
        msg.contains("model.safetensors") && msg.contains(&big.sha256_hex()),
        "{msg}"
    );
    let folder = RepoFolder::new(cache.path(), &id("org/model"));
    assert!(!folder.blob(&big.etag()).exists());
    assert!(
        folder.incomplete_blobs().is_empty(),
        "the bad bytes are discarded"
    );
    assert!(!folder.pointer(&repo().commit, "model.safetensors").exists());
    assert!(!folder.root().join("refs/main").exists());
}

#[test]
fn the_hubs_refusals_are_typed_in_its_words() {
    let hub = FakeHub::start(vec![repo(), gated()]);
    let cache = tempfile::tempdir().unwrap();
    let e = get(&config(&hub), cache.path(), "org/gated").unwrap_err();
    assert!(matches!(e, HubError::GatedRepo { .. }), "{e:?}");
    assert!(e.to_string().contains("Cannot access gated repo"), "{e}");
    let granted = config(&hub).with_token(Some("hf_granted".into()));
    get(&granted, cache.path(), "org/gated").unwrap();
    // The token went out as a bearer header.
    assert!(hub
        .requests()
        .iter()
        .any(|r| r.authorization.as_deref() == Some("Bearer hf_granted")));
    let e = get(&config(&hub), cache.path(), "org/absent").unwrap_err();
    assert!(matches!(e, HubError::RepoNotFound { .. }), "{e:?}");
    assert!(e.to_string().contains("Repository Not Found"), "{e}");
    let client = HubClient::new(config(&hub)).unwrap();
    let e = rt()
        .block_on(download_snapshot(
            &client,
            cache.path(),
            &id("org/model"),
            "nope",
            &NoProgress,
        ))
        .unwrap_err();
    assert!(matches!(e, HubError::RevisionNotFound { .. }), "{e:?}");
    let e = rt()
        .block_on(client.head(&id("org/model"), "main", "absent.json"))
        .unwrap_err();
    assert!(matches!(e, HubError::EntryNotFound { .. }), "{e:?}");
    // A dead endpoint is a transport error naming the URL.
    let dead = HubConfig::new("http://127.0.0.1:9");
    let e = get(&dead, cache.path(), "org/model").unwrap_err();
    assert!(matches!(e, HubError::Http { status: None, .. }), "{e:?}");
    assert!(e.to_string().contains("127.0.0.1:9"), "{e}");
}

#[test]
fn offline_answers_from_the_cache_and_sends_nothing() {
    let hub = FakeHub::start(vec![repo()]);
    let cache = tempfile::tempdir().unwrap();
    let mut offline = config(&hub);
    offline.offline = true;
    let e = get(&offline, cache.path(), "org/model").unwrap_err();
    assert!(matches!(e, HubError::Offline { .. }), "{e:?}");
    assert!(e.to_string().contains("HF_HUB_OFFLINE"), "{e}");
    assert!(hub.requests().is_empty(), "no request goes out offline");
    let online = get(&config(&hub), cache.path(), "org/model").unwrap();
    hub.reset_counters();
    let snap = get(&offline, cache.path(), "org/model").unwrap();
    assert_eq!(snap.dir, online.dir);
    assert_eq!(snap.files.len(), 6);
    assert!(hub.requests().is_empty());
}

#[test]
fn the_environment_is_read_as_huggingface_hub_reads_it() {
    let home = tempfile::tempdir().unwrap();
    let hf_home = home.path().join(".cache/huggingface");
    std::fs::create_dir_all(&hf_home).unwrap();
    std::fs::write(hf_home.join("token"), "hf_from_file\n").unwrap();
    let h = home.path().to_string_lossy().into_owned();
    let vars = |pairs: Vec<(&'static str, String)>| {
        move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone())
    };
    // The login token file under HF_HOME's default.
    let c = HubConfig::from_vars(vars(vec![("HOME", h.clone())]));
    assert_eq!(c.token.as_deref(), Some("hf_from_file"));
    assert_eq!(c.endpoint, mtp_detect::hub::DEFAULT_ENDPOINT);
    // HF_TOKEN wins over the file; HF_TOKEN_PATH moves the file.
    let c = HubConfig::from_vars(vars(vec![
        ("HOME", h.clone()),
        ("HF_TOKEN", "hf_env".into()),
    ]));
    assert_eq!(c.token.as_deref(), Some("hf_env"));
    let other = home.path().join("elsewhere");
    std::fs::write(&other, "hf_path").unwrap();
    let c = HubConfig::from_vars(vars(vec![
        ("HOME", h.clone()),
        ("HF_TOKEN_PATH", other.to_string_lossy().into_owned()),
    ]));
    assert_eq!(c.token.as_deref(), Some("hf_path"));
    for (v, want) in [
        ("1", true),
        ("ON", true),
        ("yes", true),
        ("True", true),
        ("0", false),
        ("no", false),
    ] {
        let c = HubConfig::from_vars(vars(vec![
            ("HOME", h.clone()),
            ("HF_HUB_OFFLINE", v.into()),
        ]));
        assert_eq!(c.offline, want, "HF_HUB_OFFLINE={v}");
    }
    let c = HubConfig::from_vars(vars(vec![
        ("HOME", h.clone()),
        ("HF_HUB_DOWNLOAD_TIMEOUT", "2.5".into()),
    ]));
    assert_eq!(c.download_timeout, Duration::from_millis(2500));
    // The cache: HF_HUB_CACHE, HUGGINGFACE_HUB_CACHE, HF_HOME/hub, XDG_CACHE_HOME, ~/.cache.
    let table: Vec<(Vec<(&'static str, String)>, String)> = vec![
        (
            vec![
                ("HF_HUB_CACHE", "/a".into()),
                ("HUGGINGFACE_HUB_CACHE", "/b".into()),
            ],
            "/a".into(),
        ),
        (
            vec![
                ("HUGGINGFACE_HUB_CACHE", "/b".into()),
                ("HF_HOME", "/c".into()),
            ],
            "/b".into(),
        ),
        (
            vec![("HF_HOME", "/c".into()), ("XDG_CACHE_HOME", "/x".into())],
            "/c/hub".into(),
        ),
        (
            vec![("XDG_CACHE_HOME", "/x".into()), ("HOME", "/h".into())],
            "/x/huggingface/hub".into(),
        ),
        (
            vec![("HOME", "/h".into())],
            "/h/.cache/huggingface/hub".into(),
        ),
        (
            vec![("HF_HUB_CACHE", "~/hfc".into()), ("HOME", "/h".into())],
            "/h/hfc".into(),
        ),
    ];
    for (pairs, want) in table {
        let shown = format!("{pairs:?}");
        let c = CacheConfig::from_vars(vars(pairs));
        assert_eq!(c.hub_cache, std::path::PathBuf::from(want), "{shown}");
    }
}

#[test]
fn a_held_blob_lock_is_waited_for() {
    let fake = repo();
    let big = fake
        .files
        .iter()
        .find(|f| f.path == "model.safetensors")
        .unwrap()
        .clone();
    let hub = FakeHub::start(vec![fake]);
    let cache = tempfile::tempdir().unwrap();
    let folder = RepoFolder::new(cache.path(), &id("org/model"));
    let lock = folder.lock(&big.etag());
    std::fs::create_dir_all(lock.parent().unwrap()).unwrap();
    let f = std::fs::File::create(&lock).unwrap();
    f.lock().unwrap();
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(600));
        f.unlock().unwrap();
    });
    let t = std::time::Instant::now();
    let snap = get(&config(&hub), cache.path(), "org/model").unwrap();
    assert!(
        t.elapsed() >= Duration::from_millis(500),
        "{:?}",
        t.elapsed()
    );
    releaser.join().unwrap();
    assert_eq!(
        std::fs::read(snap.dir.join("model.safetensors")).unwrap(),
        weights()
    );
}
