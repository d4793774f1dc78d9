//! The fake Hub over HTTP, read with reqwest: the listing's pages, metadata, `resolve` and its
//! redirect, ranges, the Hub's error headers, and what each injected fault does to a client.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use mtp_fakehub::{FakeFile, FakeHub, FakeRepo, Fault};
use reqwest::header::HeaderMap;
use reqwest::{redirect, Client, StatusCode};

const REPO: &str = "org/model";

fn big(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 % 251) as u8).collect()
}

fn files() -> Vec<FakeFile> {
    vec![
        FakeFile::new("config.json", br#"{"model_type":"qwen3"}"#.to_vec()),
        FakeFile::new("a b+c.txt", b"spaces and plus".to_vec()),
        FakeFile::new("sub/dir/x.json", b"[1,2,3]".to_vec()),
        FakeFile::new("sub/y.txt", b"y".to_vec()),
        FakeFile::new("model.safetensors", big(300_000)),
        FakeFile::new("README.md", b"# card".to_vec()),
    ]
}

fn hub() -> (FakeHub, FakeRepo) {
    let repo = FakeRepo::new(REPO, files());
    (FakeHub::start(vec![repo.clone()]), repo)
}

/// A client that does not follow redirects (the tests look at them).
fn client() -> Client {
    Client::builder()
        .redirect(redirect::Policy::none())
        .build()
        .unwrap()
}

fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).map(|v| v.to_str().unwrap())
}

/// The target of a `Link: <url>; rel="next"` header.
fn next_link(h: &HeaderMap) -> Option<String> {
    let link = header(h, "link")?;
    assert!(link.ends_with("; rel=\"next\""), "{link}");
    Some(link[1..link.find('>').unwrap()].to_string())
}

/// Every entry of a listing, following the pages; and how many pages there were.
async fn list_all(hub: &FakeHub, first: &str) -> (Vec<serde_json::Value>, usize) {
    let c = client();
    let mut url = format!("{}{first}", hub.base);
    let mut entries = Vec::new();
    let mut pages = 0;
    loop {
        let r = c.get(&url).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{url}");
        let next = next_link(r.headers());
        let page: Vec<serde_json::Value> = r.json().await.unwrap();
        pages += 1;
        entries.extend(page);
        match next {
            Some(n) => {
                assert!(
                    n.starts_with(&hub.base),
                    "the Hub's next links are absolute: {n}"
                );
                url = n;
            }
            None => break,
        }
    }
    (entries, pages)
}

fn paths(entries: &[serde_json::Value], kind: &str) -> Vec<String> {
    let mut p: Vec<String> = entries
        .iter()
        .filter(|e| e["type"] == kind)
        .map(|e| e["path"].as_str().unwrap().to_string())
        .collect();
    p.sort();
    p
}

#[tokio::test]
async fn the_recursive_listing_is_paged_and_following_next_gets_every_file_once() {
    let (hub, repo) = hub();
    let (entries, pages) = list_all(&hub, "/api/models/org/model/tree/main?recursive=true").await;
    let mut want: Vec<String> = repo.files.iter().map(|f| f.path.clone()).collect();
    want.sort();
    assert_eq!(paths(&entries, "file"), want);
    assert_eq!(paths(&entries, "directory"), ["sub", "sub/dir"]);
    assert_eq!(
        pages,
        entries.len().div_ceil(2),
        "two entries a page by default"
    );

    let by_path: BTreeMap<&str, &serde_json::Value> = entries
        .iter()
        .map(|e| (e["path"].as_str().unwrap(), e))
        .collect();
    for f in &repo.files {
        let e = by_path[f.path.as_str()];
        assert_eq!(e["size"], f.bytes.len());
        assert_eq!(e["oid"], f.blob_id());
        if f.lfs {
            assert_eq!(e["lfs"]["oid"], f.sha256_hex());
            assert_eq!(e["lfs"]["size"], f.bytes.len());
            let pointer = f.lfs_pointer().unwrap();
            assert_eq!(e["lfs"]["pointerSize"], pointer.len());
            assert_eq!(pointer.len(), 125 + f.bytes.len().to_string().len());
        } else {
            assert!(e.get("lfs").is_none());
            assert_eq!(f.blob_id(), f.git_oid());
        }
    }
    let dir_oid = by_path["sub"]["oid"].as_str().unwrap();
    assert_eq!(dir_oid.len(), 40);
    assert_eq!(by_path["sub"]["size"], 0);

    // `True` as Python's requests spells it, by commit, with one page for everything
    let hub = hub.with_page_size(100);
    let (all, pages) = list_all(
        &hub,
        &format!(
            "/api/models/org/model/tree/{}?recursive=True&expand=False",
            repo.commit
        ),
    )
    .await;
    assert_eq!((all.len(), pages), (entries.len(), 1));
}

#[tokio::test]
async fn a_listing_without_recursion_or_under_a_folder_holds_only_that_level() {
    let (hub, _) = hub();
    let hub = hub.with_page_size(1);
    let (top, pages) = list_all(&hub, "/api/models/org/model/tree/main").await;
    assert_eq!(pages, top.len());
    assert_eq!(
        paths(&top, "file"),
        ["README.md", "a b+c.txt", "config.json", "model.safetensors"]
    );
    assert_eq!(paths(&top, "directory"), ["sub"]);
    // huggingface_hub quotes the folder with safe="": `sub%2Fdir`
    let (sub, _) = list_all(
        &hub,
        "/api/models/org/model/tree/main/sub%2Fdir?recursive=false",
    )
    .await;
    assert_eq!(paths(&sub, "file"), ["sub/dir/x.json"]);
    let (sub, _) = list_all(&hub, "/api/models/org/model/tree/main/sub?recursive=1").await;
    assert_eq!(paths(&sub, "file"), ["sub/dir/x.json", "sub/y.txt"]);
    assert_eq!(paths(&sub, "directory"), ["sub/dir"]);
    let r = client()
        .get(format!("{}/api/models/org/model/tree/main/nope", hub.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert_eq!(header(r.headers(), "x-error-code"), Some("EntryNotFound"));
}

#[tokio::test]
async fn model_info_names_the_commit_and_the_files() {
    let mut repo = FakeRepo::new(REPO, files());
    repo.branches.push("refs/pr/1".into());
    let hub = FakeHub::start(vec![repo.clone(), FakeRepo::new("solo", files())]);
    let c = client();
    for rev in ["main", "refs%2Fpr%2F1", repo.commit.as_str()] {
        let url = format!(
            "{}/api/models/org/model/revision/{rev}?blobs=true",
            hub.base
        );
        let r = c.get(&url).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{rev}");
        assert_eq!(
            header(r.headers(), "x-repo-commit"),
            Some(repo.commit.as_str())
        );
        let info: serde_json::Value = r.json().await.unwrap();
        assert_eq!(info["id"], REPO);
        assert_eq!(info["modelId"], REPO);
        assert_eq!(info["sha"], repo.commit);
        assert_eq!(info["gated"], false);
        assert_eq!(info["private"], false);
        let siblings = info["siblings"].as_array().unwrap();
        assert_eq!(siblings.len(), repo.files.len());
        let st = siblings
            .iter()
            .find(|s| s["rfilename"] == "model.safetensors")
            .unwrap();
        assert_eq!(st["lfs"]["sha256"], repo.files[4].sha256_hex());
        assert_eq!(st["size"], 300_000);
        let total: usize = repo.files.iter().map(|f| f.bytes.len()).sum();
        assert_eq!(info["usedStorage"], total);
    }
    // without `blobs`, names only; without a revision, the default branch; a one-part id
    let r = c
        .get(format!("{}/api/models/solo?expand=sha", hub.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let info: serde_json::Value = r.json().await.unwrap();
    assert_eq!(info["id"], "solo");
    assert!(info["siblings"][0].get("size").is_none());
    let r = c
        .get(format!("{}/api/models/org/model/revision/nope", hub.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert_eq!(
        header(r.headers(), "x-error-code"),
        Some("RevisionNotFound")
    );
    assert_eq!(
        header(r.headers(), "x-error-message"),
        Some("Invalid rev id: nope")
    );
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["error"], "Invalid rev id: nope");
}

#[tokio::test]
async fn resolve_serves_small_files_and_redirects_lfs_ones_to_the_cdn() {
    let (hub, repo) = hub();
    let c = client();
    // a small file: 200 from resolve itself, the name percent-encoded by the client
    let small = &repo.files[1];
    let url = format!("{}/org/model/resolve/main/a%20b%2Bc.txt", hub.base);
    let r = c.head(&url).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let h = r.headers();
    assert_eq!(
        header(h, "etag"),
        Some(format!("\"{}\"", small.git_oid()).as_str())
    );
    assert_eq!(header(h, "x-repo-commit"), Some(repo.commit.as_str()));
    assert_eq!(header(h, "accept-ranges"), Some("bytes"));
    assert_eq!(header(h, "content-length"), Some("15"));
    assert_eq!(small.etag(), small.git_oid());
    let r = c.get(&url).send().await.unwrap();
    assert_eq!(r.bytes().await.unwrap(), small.bytes);
    let r = c
        .get(format!(
            "{}/org/model/resolve/main/sub/dir/x.json",
            hub.base
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.bytes().await.unwrap().as_ref(), b"[1,2,3]");

    // an LFS file: 302 to the CDN route, the content's hash and size in X-Linked-*
    let lfs = &repo.files[4];
    let url = format!(
        "{}/org/model/resolve/{}/model.safetensors",
        hub.base, repo.commit
    );
    for r in [
        c.head(&url).send().await.unwrap(),
        c.get(&url).send().await.unwrap(),
    ] {
        assert_eq!(r.status(), StatusCode::FOUND);
        let h = r.headers();
        let location = header(h, "location").unwrap();
        assert!(
            location.starts_with(&format!("{}/cdn/{}?repo=", hub.base, lfs.sha256_hex())),
            "{location}"
        );
        assert_eq!(
            header(h, "x-linked-etag"),
            Some(format!("\"{}\"", lfs.etag()).as_str())
        );
        assert_eq!(header(h, "x-linked-size"), Some("300000"));
        assert_eq!(header(h, "x-repo-commit"), Some(repo.commit.as_str()));
        assert_eq!(
            header(h, "etag"),
            Some(format!("\"{}\"", lfs.blob_id()).as_str())
        );
        assert_ne!(
            lfs.blob_id(),
            lfs.git_oid(),
            "the pointer's blob, not the content's"
        );
    }
    let location = c.head(&url).send().await.unwrap().headers()["location"]
        .to_str()
        .unwrap()
        .to_string();
    let r = c.head(&location).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(r.headers(), "content-length"), Some("300000"));
    assert_eq!(
        header(r.headers(), "etag"),
        Some(format!("\"{}\"", lfs.sha256_hex()).as_str())
    );
    assert_eq!(header(r.headers(), "accept-ranges"), Some("bytes"));
    // a client that follows redirects gets the content
    let r = reqwest::get(&url).await.unwrap();
    assert_eq!(r.bytes().await.unwrap(), lfs.bytes);
    assert_eq!(hub.body_bytes(REPO, "model.safetensors"), 300_000);
    assert_eq!(hub.body_bytes(REPO, "a b+c.txt"), 15);
    assert_eq!(hub.body_bytes(REPO, "config.json"), 0);
}

#[tokio::test]
async fn ranges_get_206_or_416_on_resolve_and_on_the_cdn() {
    let (hub, repo) = hub();
    let c = client();
    let small = format!("{}/org/model/resolve/main/config.json", hub.base);
    let lfs = reqwest::get(format!(
        "{}/org/model/resolve/main/model.safetensors",
        hub.base
    ))
    .await
    .unwrap()
    .url()
    .to_string();
    assert!(lfs.contains("/cdn/"), "{lfs}");
    for (url, file) in [(small, &repo.files[0]), (lfs, &repo.files[4])] {
        let total = file.bytes.len();
        let r = c
            .get(&url)
            .header("range", "bytes=2-9")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::PARTIAL_CONTENT);
        assert_eq!(
            header(r.headers(), "content-range"),
            Some(format!("bytes 2-9/{total}").as_str())
        );
        assert_eq!(header(r.headers(), "content-length"), Some("8"));
        assert_eq!(r.bytes().await.unwrap(), file.bytes[2..10]);
        let r = c
            .get(&url)
            .header("range", "bytes=5-")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::PARTIAL_CONTENT);
        assert_eq!(
            header(r.headers(), "content-range"),
            Some(format!("bytes 5-{}/{total}", total - 1).as_str())
        );
        assert_eq!(r.bytes().await.unwrap(), file.bytes[5..]);
        let r = c
            .get(&url)
            .header("range", format!("bytes={total}-"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::RANGE_NOT_SATISFIABLE);
        assert_eq!(
            header(r.headers(), "content-range"),
            Some(format!("bytes */{total}").as_str())
        );
    }
}

#[tokio::test]
async fn errors_carry_the_hubs_codes_and_gated_files_need_the_token() {
    let mut gated = FakeRepo::new("org/gated", files());
    gated.gated_token = Some("hf_secret".into());
    let hub = FakeHub::start(vec![gated]);
    let c = client();
    let get = |path: &str, token: Option<&str>| {
        let mut rq = c.get(format!("{}{path}", hub.base));
        if let Some(t) = token {
            rq = rq.bearer_auth(t);
        }
        rq.send()
    };
    let expect = |r: &reqwest::Response, status: u16, code: &str| {
        assert_eq!(r.status().as_u16(), status, "{}", r.url());
        assert_eq!(
            header(r.headers(), "x-error-code"),
            Some(code),
            "{}",
            r.url()
        );
    };

    // unknown repository: 401 to anonymous clients, 404 to authenticated ones
    for path in [
        "/api/models/org/nope/revision/main",
        "/api/models/org/nope/tree/main",
        "/org/nope/resolve/main/config.json",
        "/nope/resolve/main/config.json",
    ] {
        let r = get(path, None).await.unwrap();
        expect(&r, 401, "RepoNotFound");
        assert_eq!(
            header(r.headers(), "x-error-message"),
            Some("Repository not found")
        );
        let body: serde_json::Value = r.json().await.unwrap();
        assert_eq!(body["error"], "Repository not found");
        expect(
            &get(path, Some("hf_any")).await.unwrap(),
            404,
            "RepoNotFound",
        );
    }

    // a gated repository: metadata and listing are public, files need the token
    let r = get("/api/models/org/gated/revision/main", None)
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let info: serde_json::Value = r.json().await.unwrap();
    assert_eq!(info["gated"], "manual");
    let r = get("/api/models/org/gated/tree/main", None).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let file = "/org/gated/resolve/main/model.safetensors";
    let r = get(file, None).await.unwrap();
    expect(&r, 401, "GatedRepo");
    assert_eq!(
        header(r.headers(), "x-error-message"),
        Some(
            "Access to model org/gated is restricted. You must have access to it and be \
             authenticated to access it. Please log in."
        )
    );
    let r = get(file, Some("hf_wrong")).await.unwrap();
    expect(&r, 403, "GatedRepo");
    let r = get(file, Some("hf_secret")).await.unwrap();
    assert_eq!(r.status(), StatusCode::FOUND);
    let r = get("/org/gated/resolve/main/README.md", None)
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK, "the model card is public");

    // unknown revision, unknown file (with the commit, so clients can cache the absence)
    let r = get("/org/gated/resolve/v9/config.json", Some("hf_secret"))
        .await
        .unwrap();
    expect(&r, 404, "RevisionNotFound");
    assert_eq!(
        header(r.headers(), "x-error-message"),
        Some("Invalid rev id: v9")
    );
    let r = get("/org/gated/resolve/main/nope.json", Some("hf_secret"))
        .await
        .unwrap();
    expect(&r, 404, "EntryNotFound");
    assert_eq!(
        header(r.headers(), "x-error-message"),
        Some("Entry not found")
    );
    assert!(header(r.headers(), "x-repo-commit").is_some());
    // HEAD carries the same headers
    let r = c
        .head(format!("{}/org/gated/resolve/main/nope.json", hub.base))
        .bearer_auth("hf_secret")
        .send()
        .await
        .unwrap();
    expect(&r, 404, "EntryNotFound");
}

/// Reads a body chunk by chunk: the bytes that came and whether it ended in an error.
async fn read_body(mut r: reqwest::Response) -> (Vec<u8>, bool) {
    let mut got = Vec::new();
    loop {
        match r.chunk().await {
            Ok(Some(c)) => got.extend_from_slice(&c),
            Ok(None) => return (got, false),
            Err(_) => return (got, true),
        }
    }
}

#[tokio::test]
async fn drop_after_cuts_the_connection_mid_body() {
    let (hub, repo) = hub();
    let c = client();
    let content = &repo.files[4].bytes;
    let cdn = reqwest::get(format!(
        "{}/org/model/resolve/main/model.safetensors",
        hub.base
    ))
    .await
    .unwrap()
    .url()
    .to_string();
    hub.reset_counters();
    hub.fault(REPO, "model.safetensors", Fault::DropAfter(100_000), 2);
    for range in [None, Some("bytes=1000-")] {
        let mut rq = c.get(&cdn);
        if let Some(r) = range {
            rq = rq.header("range", r);
        }
        let r = rq.send().await.unwrap();
        let announced = r.content_length().unwrap();
        let (got, failed) = read_body(r).await;
        assert!(
            failed,
            "an incomplete body is an error, not a short success"
        );
        assert_eq!(got.len(), 100_000);
        let start = if range.is_some() { 1000 } else { 0 };
        assert_eq!(announced as usize, content.len() - start);
        assert_eq!(got, content[start..start + 100_000]);
    }
    assert_eq!(hub.body_bytes(REPO, "model.safetensors"), 200_000);
    // the fault is spent: the third GET is whole
    let (got, failed) = read_body(c.get(&cdn).send().await.unwrap()).await;
    assert!(!failed);
    assert_eq!(&got, content);

    // on a small file's resolve URL too
    hub.fault(REPO, "config.json", Fault::DropAfter(5), 1);
    let url = format!("{}/org/model/resolve/main/config.json", hub.base);
    let (got, failed) = read_body(c.get(&url).send().await.unwrap()).await;
    assert!(failed);
    assert_eq!(got, repo.files[0].bytes[..5]);
    // HEAD is not a content GET: it does not spend a fault
    hub.fault(REPO, "config.json", Fault::DropAfter(0), 1);
    assert_eq!(c.head(&url).send().await.unwrap().status(), StatusCode::OK);
    let (got, failed) = read_body(c.get(&url).send().await.unwrap()).await;
    assert!(failed && got.is_empty());
}

#[tokio::test]
async fn stall_after_sends_then_holds_the_connection_open_silently() {
    let (hub, repo) = hub();
    let stall = Duration::from_millis(1500);
    hub.fault(REPO, "config.json", Fault::StallAfter(4, stall), 1);
    let url = format!("{}/org/model/resolve/main/config.json", hub.base);
    let started = Instant::now();
    let mut r = client().get(&url).send().await.unwrap();
    let mut got = Vec::new();
    while got.len() < 4 {
        got.extend_from_slice(&r.chunk().await.unwrap().unwrap());
    }
    assert_eq!(got, repo.files[0].bytes[..4]);
    // nothing more for a while, and no error either: the connection is open
    let quiet = tokio::time::timeout(Duration::from_millis(700), r.chunk()).await;
    assert!(quiet.is_err(), "no byte and no close during the stall");
    // then the connection is cut
    assert!(r.chunk().await.is_err());
    assert!(started.elapsed() >= stall);
}

#[tokio::test]
async fn corrupt_flips_one_byte_under_true_headers_and_ignore_range_sends_everything() {
    let (hub, repo) = hub();
    let c = client();
    let file = &repo.files[4];
    let url = format!("{}/org/model/resolve/main/model.safetensors", hub.base);
    let cdn = c.head(&url).send().await.unwrap().headers()["location"]
        .to_str()
        .unwrap()
        .to_string();

    hub.fault(REPO, "model.safetensors", Fault::Corrupt, 1);
    hub.fault(REPO, "model.safetensors", Fault::IgnoreRange, 1);
    hub.fault(REPO, "model.safetensors", Fault::Status(503), 1);

    let r = c.get(&cdn).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        header(r.headers(), "etag"),
        Some(format!("\"{}\"", file.sha256_hex()).as_str())
    );
    assert_eq!(r.content_length(), Some(file.bytes.len() as u64));
    let got = r.bytes().await.unwrap();
    assert_eq!(got.len(), file.bytes.len());
    let differ = got.iter().zip(&file.bytes).filter(|(a, b)| a != b).count();
    assert_eq!(differ, 1);

    let r = c
        .get(&cdn)
        .header("range", "bytes=10-19")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK, "the range ignored");
    assert!(r.headers().get("content-range").is_none());
    assert_eq!(r.bytes().await.unwrap(), file.bytes);

    let r = c
        .get(&cdn)
        .header("range", "bytes=10-19")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);

    let r = c
        .get(&cdn)
        .header("range", "bytes=10-19")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::PARTIAL_CONTENT, "every fault spent");
    assert_eq!(r.bytes().await.unwrap(), file.bytes[10..20]);
}

#[tokio::test]
async fn requests_are_recorded_decoded_and_repos_can_be_added_while_running() {
    let (hub, _) = hub();
    let c = client();
    hub.reset_counters();
    c.get(format!(
        "{}/org/model/resolve/main/a%20b%2Bc.txt?x=1",
        hub.base
    ))
    .header("range", "bytes=0-1")
    .header("user-agent", "probe/1")
    .bearer_auth("hf_tok")
    .send()
    .await
    .unwrap();
    let seen = hub.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].method, "GET");
    assert_eq!(seen[0].path, "/org/model/resolve/main/a b+c.txt?x=1");
    assert_eq!(seen[0].range.as_deref(), Some("bytes=0-1"));
    assert_eq!(seen[0].authorization.as_deref(), Some("Bearer hf_tok"));
    assert_eq!(seen[0].user_agent.as_deref(), Some("probe/1"));
    hub.reset_counters();
    assert!(hub.requests().is_empty());
    assert_eq!(hub.body_bytes(REPO, "a b+c.txt"), 0);

    let url = format!("{}/api/models/org/late/revision/main", hub.base);
    assert_eq!(
        c.get(&url).send().await.unwrap().status(),
        StatusCode::UNAUTHORIZED
    );
    let late = FakeRepo::new("org/late", vec![FakeFile::new("x", b"1".to_vec())]);
    hub.add_repo(late.clone());
    let r = c.get(&url).send().await.unwrap();
    assert_eq!(
        header(r.headers(), "x-repo-commit"),
        Some(late.commit.as_str())
    );
    // a new commit of the same repository replaces it
    let newer = FakeRepo::new("org/late", vec![FakeFile::new("x", b"2".to_vec())]);
    assert_ne!(newer.commit, late.commit);
    hub.add_repo(newer.clone());
    let r = c.get(&url).send().await.unwrap();
    assert_eq!(
        header(r.headers(), "x-repo-commit"),
        Some(newer.commit.as_str())
    );
}

#[test]
fn fake_files_hash_and_classify_as_the_hub_does() {
    let f = FakeFile::new("w.safetensors", b"x".to_vec());
    assert!(f.lfs && FakeFile::new("m.gguf", vec![]).lfs && FakeFile::new("p.bin", vec![]).lfs);
    assert!(!FakeFile::new("config.json", vec![0; 1024]).lfs);
    assert!(FakeFile::new("huge.json", vec![0; 10 * 1024 * 1024 + 1]).lfs);
    assert!(!FakeFile::new("w.safetensors", vec![]).lfs(false).lfs);
    // `printf 'hello\n' | git hash-object --stdin`, `printf 'hello\n' | sha256sum`
    let h = FakeFile::new("h.txt", b"hello\n".to_vec());
    assert_eq!(h.git_oid(), "ce013625030ba8dba906f756967f9e9ca394464a");
    assert_eq!(
        h.sha256_hex(),
        "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"
    );
    assert_eq!(h.etag(), h.git_oid());
    let l = h.clone().lfs(true);
    assert_eq!(l.etag(), l.sha256_hex());
    assert_eq!(
        l.lfs_pointer().unwrap(),
        format!(
            "version https://git-lfs.github.com/spec/v1\noid sha256:{}\nsize 6\n",
            l.sha256_hex()
        )
    );
    let r = FakeRepo::new("a/b", vec![h.clone()]);
    assert_eq!(r.commit.len(), 40);
    assert!(r.commit.bytes().all(|c| c.is_ascii_hexdigit()));
    assert_eq!(r.commit, FakeRepo::new("a/b", vec![h.clone()]).commit);
    assert_ne!(r.commit, FakeRepo::new("a/c", vec![h]).commit);
    assert_eq!(r.branches, ["main"]);
}

#[test]
fn dropping_the_hub_stops_the_server() {
    let hub = FakeHub::start(vec![]);
    let addr = hub.base.trim_start_matches("http://").to_string();
    assert!(std::net::TcpStream::connect(&addr).is_ok());
    drop(hub);
    assert!(std::net::TcpStream::connect(&addr).is_err());
}

#[test]
fn the_hub_can_be_shared_between_threads() {
    fn shareable<T: Send + Sync>() {}
    shareable::<FakeHub>();
}
