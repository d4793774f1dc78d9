//! Whole repositories into the standard cache: resumable, retried, verified.
//!
//! Per file, as `huggingface_hub` does it: `HEAD` for the ETag, the per-blob lock
//! (`.locks/models--org--name/<etag>.lock`, the same `flock` that `filelock` takes), the bytes
//! into `blobs/<etag>.incomplete`, then a rename to `blobs/<etag>` and a relative symlink
//! from `snapshots/<commit>/<file>`. Beyond it:
//! - a download that broke off (a dropped connection, a stall of `download_timeout`, a killed
//!   process) resumes from the `.incomplete` file's length with `Range`, in this run (up to
//!   `attempts` tries with backoff) or the next;
//! - every blob is checked before it is installed: its size, the sha256 of an LFS file (the
//!   listing's `lfs.oid` / `X-Linked-Etag`) and the git blob id of a small file. A mismatch
//!   discards the bytes and names the file and both values; nothing is linked;
//! - `refs/<revision>` is written last, once every file of the snapshot is in place, so a
//!   broken-off download never looks installed.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sha2::Digest;
use tokio::io::AsyncWriteExt;

use crate::cache::{snapshot_files, tag_cache, RepoFolder};
use crate::hub::client::{transport_message, Subject};
use crate::hub::{HubClient, HubError};
use crate::repo::RepoId;

/// What a download reports as it goes. Every method has an empty default.
pub trait DownloadProgress: Send + Sync {
    /// The files about to be fetched, with their sizes.
    fn plan(&self, _repo: &RepoId, _files: &[(String, u64)]) {}
    /// A file starts; `done` bytes of it are already here (a resumed download or a cached blob).
    fn start(&self, _file: &str, _size: Option<u64>, _done: u64) {}
    /// `bytes` more bytes of `file` arrived.
    fn advance(&self, _file: &str, _bytes: u64) {}
    /// A try failed and another follows after `wait`.
    fn retry(&self, _file: &str, _attempt: u32, _error: &HubError, _wait: Duration) {}
    /// `file` is in place.
    fn finish(&self, _file: &str) {}
}

/// Reports nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoProgress;
impl DownloadProgress for NoProgress {}

/// A snapshot in the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The repository.
    pub repo: RepoId,
    /// The revision asked for.
    pub revision: String,
    /// The commit it named.
    pub commit: String,
    /// `snapshots/<commit>`.
    pub dir: PathBuf,
    /// Its files.
    pub files: Vec<String>,
    /// Bytes that came over the network in this call.
    pub downloaded: u64,
}

/// Downloads `repo` at `revision` into `cache` (or, offline, finds it there).
pub async fn download_snapshot(
    client: &HubClient,
    cache: &Path,
    repo: &RepoId,
    revision: &str,
    progress: &dyn DownloadProgress,
) -> Result<Snapshot, HubError> {
    crate::hub::check_revision(revision)?;
    let folder = RepoFolder::new(cache, repo);
    if client.config().offline {
        return offline_snapshot(&folder, revision);
    }
    let rev = client.revision(repo, revision).await?;
    let files = client.tree(repo, &rev.commit).await?;
    if files.is_empty() {
        return Err(HubError::BadAnswer {
            url: format!(
                "{}/api/models/{repo}/tree/{}",
                client.config().endpoint,
                rev.commit
            ),
            message: "the repository lists no files".into(),
        });
    }
    std::fs::create_dir_all(cache).map_err(HubError::io(cache))?;
    tag_cache(cache);
    let sizes: Vec<(String, u64)> = files.iter().map(|f| (f.path.clone(), f.size)).collect();
    progress.plan(repo, &sizes);
    let mut downloaded = 0;
    for f in &files {
        let meta = client.head(repo, &rev.commit, &f.path).await?;
        let expect = Expected {
            size: meta.size.or(Some(f.size)),
            sha256: f.lfs_sha256.clone().or_else(|| {
                (meta.linked && is_hex(&meta.etag, 64)).then(|| meta.etag.to_ascii_lowercase())
            }),
            git_oid: (f.lfs_sha256.is_none() && !meta.linked && is_hex(&f.oid, 40))
                .then(|| f.oid.to_ascii_lowercase()),
        };
        downloaded += fetch_blob(
            client,
            &folder,
            &f.path,
            &meta.etag,
            &meta.location,
            &expect,
            progress,
        )
        .await?;
        folder.link(&rev.commit, &f.path, &meta.etag)?;
        progress.finish(&f.path);
    }
    folder.write_ref(revision, &rev.commit)?;
    Ok(Snapshot {
        repo: repo.clone(),
        revision: revision.to_string(),
        dir: folder.snapshot(&rev.commit),
        commit: rev.commit,
        files: files.into_iter().map(|f| f.path).collect(),
        downloaded,
    })
}

/// Offline: the snapshot the cache holds for `revision`, when it is whole.
fn offline_snapshot(folder: &RepoFolder, revision: &str) -> Result<Snapshot, HubError> {
    let offline = || HubError::Offline {
        what: format!("{}@{revision}", folder.repo),
        cache: Some(folder.cache.clone()),
    };
    let (commit, dir) = folder.resolve(revision).ok_or_else(offline)?;
    let listed = snapshot_files(&dir);
    if listed.is_empty() || listed.iter().any(|(_, ok)| !ok) {
        return Err(offline());
    }
    let files = listed.into_iter().map(|(f, _)| f).collect();
    Ok(Snapshot {
        repo: folder.repo.clone(),
        revision: revision.to_string(),
        commit,
        dir,
        files,
        downloaded: 0,
    })
}

fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// What a blob's bytes must be.
struct Expected {
    size: Option<u64>,
    sha256: Option<String>,
    git_oid: Option<String>,
}

/// The per-blob lock, held until dropped. `flock` on the same file `huggingface_hub` locks,
/// so the two never write one blob at once.
struct BlobLock(std::fs::File);

impl Drop for BlobLock {
    fn drop(&mut self) {
        let _ = self.0.unlock();
    }
}

async fn lock_blob(path: &Path) -> Result<BlobLock, HubError> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(HubError::io(parent))?;
    }
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(HubError::io(path))?;
    let started = Instant::now();
    let mut told = Duration::ZERO;
    loop {
        match f.try_lock() {
            Ok(()) => return Ok(BlobLock(f)),
            Err(std::fs::TryLockError::WouldBlock) => {
                if started.elapsed() >= told + Duration::from_secs(10) {
                    told = started.elapsed();
                    tracing::info!(lock = %path.display(), "another process is downloading this file; waiting");
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(HubError::io(path)(e)),
        }
    }
}

/// Puts `blobs/<etag>` in place (unless it already is), verified. Returns the bytes fetched.
async fn fetch_blob(
    client: &HubClient,
    folder: &RepoFolder,
    file: &str,
    etag: &str,
    url: &str,
    expect: &Expected,
    progress: &dyn DownloadProgress,
) -> Result<u64, HubError> {
    let blob = folder.blob(etag);
    let have_blob = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && expect.size.is_none_or(|s| m.len() == s))
    };
    if have_blob(&blob) {
        progress.start(file, expect.size, expect.size.unwrap_or(0));
        return Ok(0);
    }
    let _lock = lock_blob(&folder.lock(etag)).await?;
    if have_blob(&blob) {
        progress.start(file, expect.size, expect.size.unwrap_or(0));
        return Ok(0);
    }
    let part = folder.incomplete(etag);
    if let Some(parent) = part.parent() {
        std::fs::create_dir_all(parent).map_err(HubError::io(parent))?;
    }
    let done = std::fs::metadata(&part).map(|m| m.len()).unwrap_or(0);
    progress.start(file, expect.size, done.min(expect.size.unwrap_or(u64::MAX)));
    let cfg = client.config();
    let subject = Subject {
        repo: folder.repo.as_str(),
        revision: None,
        file: Some(file),
    };
    let mut fetched = 0;
    let mut attempt = 1;
    loop {
        match fetch_once(client, url, &part, expect.size, subject, file, progress).await {
            Ok(n) => {
                fetched += n;
                break;
            }
            Err((n, e)) => {
                fetched += n;
                if attempt >= cfg.attempts.max(1) || !retryable(&e) {
                    return Err(e);
                }
                let wait = cfg
                    .backoff
                    .saturating_mul(1 << (attempt - 1).min(4))
                    .min(Duration::from_secs(8));
                tracing::warn!(file, attempt, error = %e, "download try failed; resuming");
                progress.retry(file, attempt, &e, wait);
                tokio::time::sleep(wait).await;
                attempt += 1;
            }
        }
    }
    verify(&folder.repo, file, &part, expect).await?;
    std::fs::rename(&part, &blob).map_err(HubError::io(&blob))?;
    Ok(fetched)
}

/// Transport failures, 5xx and 429 are worth another try; the Hub's refusals are not.
fn retryable(e: &HubError) -> bool {
    match e {
        HubError::Http { status: None, .. } => true,
        HubError::Http {
            status: Some(s), ..
        } => *s >= 500 || *s == 429 || *s == 408,
        _ => false,
    }
}

/// One try: appends to `part` from its current length. Returns the bytes received, also on
/// failure (with the error), so the caller can count them.
async fn fetch_once(
    client: &HubClient,
    url: &str,
    part: &Path,
    size: Option<u64>,
    subject: Subject<'_>,
    file: &str,
    progress: &dyn DownloadProgress,
) -> Result<u64, (u64, HubError)> {
    let fail = |e| (0, e);
    // The part file exists from here on (an empty file is whole at once).
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(part)
        .map_err(|e| fail(HubError::io(part)(e)))?;
    let mut have = std::fs::metadata(part).map(|m| m.len()).unwrap_or(0);
    if let Some(s) = size {
        if have > s {
            // Longer than the file: not a prefix of it.
            std::fs::write(part, b"").map_err(|e| fail(HubError::io(part)(e)))?;
            have = 0;
        }
        if have == s {
            return Ok(0);
        }
    }
    let range = (have > 0).then_some((have, None));
    let mut resp = client.get_bytes(url, range, subject).await.map_err(fail)?;
    let status = resp.status().as_u16();
    let mut f = tokio::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(part)
        .await
        .map_err(|e| fail(HubError::io(part)(e)))?;
    match status {
        206 => {
            let start = resp
                .headers()
                .get(reqwest::header::CONTENT_RANGE)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().strip_prefix("bytes "))
                .and_then(|v| v.split('-').next())
                .and_then(|v| v.trim().parse::<u64>().ok());
            if start != Some(have) {
                f.set_len(0)
                    .await
                    .map_err(|e| fail(HubError::io(part)(e)))?;
                return Err(fail(HubError::Http {
                    url: url.to_string(),
                    status: None,
                    message: format!(
                        "asked for bytes from {have}, the answer starts elsewhere; starting again"
                    ),
                }));
            }
        }
        416 => {
            // What we hold is not a prefix the server recognises: start again.
            f.set_len(0)
                .await
                .map_err(|e| fail(HubError::io(part)(e)))?;
            return Err(fail(HubError::Http {
                url: url.to_string(),
                status: None,
                message: "the server refused the resume range (HTTP 416); starting again".into(),
            }));
        }
        200 if have > 0 => {
            // The server ignored `Range`: the body is the whole file.
            f.set_len(0)
                .await
                .map_err(|e| fail(HubError::io(part)(e)))?;
            have = 0;
            progress.start(file, size, 0);
        }
        200 => {}
        s => {
            return Err(fail(HubError::Http {
                url: url.to_string(),
                status: Some(s),
                message: format!("unexpected HTTP {s} for file bytes"),
            }))
        }
    }
    let timeout = client.config().download_timeout;
    let mut got = 0u64;
    loop {
        let chunk = match tokio::time::timeout(timeout, resp.chunk()).await {
            Err(_) => {
                let _ = f.flush().await;
                return Err((
                    got,
                    HubError::Http {
                        url: url.to_string(),
                        status: None,
                        message: format!(
                            "no data for {:.0} s after {} bytes (HF_HUB_DOWNLOAD_TIMEOUT); the connection stalled",
                            timeout.as_secs_f64(),
                            have + got
                        ),
                    },
                ));
            }
            Ok(Err(e)) => {
                let _ = f.flush().await;
                return Err((
                    got,
                    HubError::Http {
                        url: url.to_string(),
                        status: None,
                        message: format!("after {} bytes: {}", have + got, transport_message(&e)),
                    },
                ));
            }
            Ok(Ok(None)) => break,
            Ok(Ok(Some(c))) => c,
        };
        if size.is_some_and(|s| have + got + chunk.len() as u64 > s) {
            let _ = f.flush().await;
            f.set_len(0)
                .await
                .map_err(|e| (got, HubError::io(part)(e)))?;
            return Err((
                got,
                HubError::Mismatch {
                    repo: subject.repo.to_string(),
                    file: file.to_string(),
                    what: "size",
                    expected: size.unwrap_or(0).to_string(),
                    actual: format!("more than {}", have + got),
                },
            ));
        }
        f.write_all(&chunk)
            .await
            .map_err(|e| (got, HubError::io(part)(e)))?;
        got += chunk.len() as u64;
        progress.advance(file, chunk.len() as u64);
    }
    f.flush().await.map_err(|e| (got, HubError::io(part)(e)))?;
    f.sync_data()
        .await
        .map_err(|e| (got, HubError::io(part)(e)))?;
    if let Some(s) = size {
        if have + got < s {
            return Err((
                got,
                HubError::Http {
                    url: url.to_string(),
                    status: None,
                    message: format!("the connection closed after {} of {s} bytes", have + got),
                },
            ));
        }
    }
    Ok(got)
}

/// Checks the finished `.incomplete` file; a mismatch deletes it.
async fn verify(repo: &RepoId, file: &str, part: &Path, expect: &Expected) -> Result<(), HubError> {
    let p = part.to_path_buf();
    let want_sha1 = expect.git_oid.is_some();
    let want_sha256 = expect.sha256.is_some();
    let sums = tokio::task::spawn_blocking(move || hash_file(&p, want_sha256, want_sha1))
        .await
        .map_err(|e| HubError::io(part)(std::io::Error::other(e.to_string())))?
        .map_err(HubError::io(part))?;
    let mismatch = |what, expected: String, actual: String| {
        let _ = std::fs::remove_file(part);
        Err(HubError::Mismatch {
            repo: repo.to_string(),
            file: file.to_string(),
            what,
            expected,
            actual,
        })
    };
    if let Some(s) = expect.size {
        if sums.len != s {
            return mismatch("size", s.to_string(), sums.len.to_string());
        }
    }
    if let (Some(want), Some(got)) = (&expect.sha256, &sums.sha256) {
        if !want.eq_ignore_ascii_case(got) {
            return mismatch("sha256", want.clone(), got.clone());
        }
    }
    if let (Some(want), Some(got)) = (&expect.git_oid, &sums.git_oid) {
        if !want.eq_ignore_ascii_case(got) {
            return mismatch("git blob sha1", want.clone(), got.clone());
        }
    }
    Ok(())
}

struct Sums {
    len: u64,
    sha256: Option<String>,
    git_oid: Option<String>,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn hash_file(p: &Path, sha256: bool, git: bool) -> std::io::Result<Sums> {
    use std::io::Read;
    let len = std::fs::metadata(p)?.len();
    let mut f = std::fs::File::open(p)?;
    let mut s256 = sha256.then(sha2::Sha256::new);
    let mut s1 = git.then(|| {
        let mut h = sha1::Sha1::new();
        h.update(format!("blob {len}\0").as_bytes());
        h
    });
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        if let Some(h) = s256.as_mut() {
            h.update(&buf[..n]);
        }
        if let Some(h) = s1.as_mut() {
            h.update(&buf[..n]);
        }
    }
    Ok(Sums {
        len,
        sha256: s256.map(|h| hex(&h.finalize())),
        git_oid: s1.map(|h| hex(&h.finalize())),
    })
}
