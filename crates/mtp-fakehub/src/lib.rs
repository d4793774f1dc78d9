//! A fake Hugging Face Hub on loopback, for tests of code that downloads from the Hub.
//!
//! It answers the requests `huggingface_hub` 2.4.0 makes, with the same URLs, headers, redirects
//! and error codes as the real Hub (`tests/hf_hub.rs` drives it with that client):
//!
//! - `GET /api/models/{repo_id}[/revision/{revision}]`: the repository's metadata (`sha`,
//!   `siblings`, with `?blobs=true` their sizes and LFS data) and `X-Repo-Commit`;
//! - `GET /api/models/{repo_id}/tree/{revision}[/{path}]`: the file listing, paged
//!   ([`FakeHub::with_page_size`], two entries a page by default) with an absolute `Link: <…>;
//!   rel="next"` header, as the Hub pages it;
//! - `HEAD`/`GET /{repo_id}/resolve/{revision}/{path}`: a small file's content (`ETag` its git blob
//!   id), or for an LFS file a `302` to `/cdn/{sha256}` on the same server with `X-Linked-Etag`
//!   (the sha256) and `X-Linked-Size`; `Range` requests answered `206`/`416`;
//! - errors with the Hub's `X-Error-Code`/`X-Error-Message` headers and `{"error": …}` bodies:
//!   `RepoNotFound`, `GatedRepo`, `RevisionNotFound`, `EntryNotFound`.
//!
//! Network faults can be injected into the content of a file ([`FakeHub::fault`]), and every
//! request is recorded ([`FakeHub::requests`]).
//!
//! Gated repositories behave as on the Hub: their metadata and file listing are public, their
//! files (but the top-level `README.md`, the model card) need the token.

mod server;
mod util;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use axum::body::Bytes;
use tokio::sync::oneshot;

/// Files larger than this are stored with Git LFS by [`FakeFile::new`] whatever their name
/// (10 MiB, the Hub's limit for files pushed without LFS).
pub const LFS_THRESHOLD: usize = 10 * 1024 * 1024;

/// A file of a [`FakeRepo`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FakeFile {
    /// The path in the repository, `/`-separated (`sub/dir/x.json`).
    pub path: String,
    /// The content.
    pub bytes: Vec<u8>,
    /// Stored with Git LFS: served through a redirect to the CDN route, `lfs` in the listing.
    pub lfs: bool,
}

impl FakeFile {
    /// A file; LFS when its name ends with `.safetensors`, `.gguf` or `.bin`, or when it is
    /// larger than 10 MiB.
    pub fn new(path: &str, bytes: impl Into<Vec<u8>>) -> Self {
        let bytes = bytes.into();
        let lfs = [".safetensors", ".gguf", ".bin"]
            .iter()
            .any(|ext| path.ends_with(ext))
            || bytes.len() > LFS_THRESHOLD;
        FakeFile {
            path: path.to_string(),
            bytes,
            lfs,
        }
    }

    /// The same file, stored with LFS or not.
    pub fn lfs(mut self, yes: bool) -> Self {
        self.lfs = yes;
        self
    }

    /// The sha256 of the content, lowercase hex (an LFS file's `oid`).
    pub fn sha256_hex(&self) -> String {
        util::sha256_hex(&self.bytes)
    }

    /// The git blob id of the content: sha1 of `blob {len}\0` followed by the bytes.
    pub fn git_oid(&self) -> String {
        util::git_blob_oid(&self.bytes)
    }

    /// The LFS pointer file git stores for an LFS file, `None` for another.
    pub fn lfs_pointer(&self) -> Option<String> {
        self.lfs
            .then(|| util::lfs_pointer(&self.sha256_hex(), self.bytes.len()))
    }

    /// The id of the blob git stores for the file, the `oid` of the tree listing and the `ETag`
    /// of `resolve`: the git blob id of the LFS pointer for an LFS file, of the content otherwise.
    pub fn blob_id(&self) -> String {
        match self.lfs_pointer() {
            Some(pointer) => util::git_blob_oid(pointer.as_bytes()),
            None => self.git_oid(),
        }
    }

    /// The entity tag clients key their cache by (unquoted): the sha256 of an LFS file, the git
    /// blob id of another.
    pub fn etag(&self) -> String {
        if self.lfs {
            self.sha256_hex()
        } else {
            self.git_oid()
        }
    }
}

/// A model repository of the fake Hub. Every branch points at `commit`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FakeRepo {
    /// `org/name` or `name`.
    pub id: String,
    /// The commit every branch points at, 40 lowercase hex digits.
    pub commit: String,
    /// The files at that commit.
    pub files: Vec<FakeFile>,
    /// The branch names; the first is the default one (`main`).
    pub branches: Vec<String>,
    /// `Some(token)`: a gated repository whose files need `Authorization: Bearer {token}`.
    pub gated_token: Option<String>,
}

impl FakeRepo {
    /// A public repository with one branch, `main`, at a commit derived from the id and the
    /// files (so changing a file changes the commit).
    pub fn new(id: &str, files: Vec<FakeFile>) -> Self {
        let mut seed = format!("{id}\n").into_bytes();
        for f in &files {
            seed.extend_from_slice(f.path.as_bytes());
            seed.push(0);
            seed.extend_from_slice(f.git_oid().as_bytes());
            seed.push(if f.lfs { b'L' } else { b'-' });
            seed.push(b'\n');
        }
        FakeRepo {
            id: id.to_string(),
            commit: util::sha1_hex(&seed),
            files,
            branches: vec!["main".to_string()],
            gated_token: None,
        }
    }
}

/// A network fault injected into the content of a file ([`FakeHub::fault`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Send the headers (with the full `Content-Length`) and this many body bytes, then cut the
    /// connection: the client sees an incomplete body. When the body is not longer than this,
    /// it is sent whole.
    DropAfter(u64),
    /// Send the headers and this many body bytes, then nothing for the duration with the
    /// connection open, then cut it.
    StallAfter(u64, Duration),
    /// Send the content with one byte flipped (the middle byte of what is sent), under headers
    /// that announce the true size and hashes.
    Corrupt,
    /// Answer `200` with the whole file even when `Range` asks for a part.
    IgnoreRange,
    /// Answer this status, with a `{"error": …}` body and no content.
    Status(u16),
}

/// One request the fake Hub received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// `GET`, `HEAD`, …
    pub method: String,
    /// The percent-decoded path, then `?` and the query as received when there is one.
    pub path: String,
    /// The `Range` header.
    pub range: Option<String>,
    /// The `Authorization` header.
    pub authorization: Option<String>,
    /// The `User-Agent` header.
    pub user_agent: Option<String>,
}

/// The fake Hub: an HTTP server on `127.0.0.1`, on a thread of its own, stopped when dropped.
pub struct FakeHub {
    /// `http://127.0.0.1:{port}`, without a trailing slash: the `HF_ENDPOINT` of its clients.
    pub base: String,
    shared: Arc<Shared>,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl FakeHub {
    /// Starts a server with these repositories on a free loopback port.
    ///
    /// # Panics
    /// When no loopback port can be bound or no runtime can be made (a test set-up failure).
    pub fn start(repos: Vec<FakeRepo>) -> FakeHub {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")
            .expect("mtp-fakehub: binding a loopback port");
        listener
            .set_nonblocking(true)
            .expect("mtp-fakehub: a non-blocking listener");
        let port = listener
            .local_addr()
            .expect("mtp-fakehub: the listener's address")
            .port();
        let base = format!("http://127.0.0.1:{port}");
        let shared = Arc::new(Shared {
            base: base.clone(),
            page_size: AtomicUsize::new(2),
            state: Mutex::new(State {
                repos: repos.into_iter().map(|r| Arc::new(Repo::new(r))).collect(),
                ..State::default()
            }),
        });
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("mtp-fakehub: a tokio runtime");
        let (tx, rx) = oneshot::channel();
        let served = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name(format!("mtp-fakehub:{port}"))
            .spawn(move || runtime.block_on(server::serve(listener, served, rx)))
            .expect("mtp-fakehub: spawning the server thread");
        FakeHub {
            base,
            shared,
            shutdown: Some(tx),
            thread: Some(thread),
        }
    }

    /// The same hub with `n` entries per page of the tree listing (at least 1; 2 by default, so
    /// that clients always have to follow the pages).
    pub fn with_page_size(self, n: usize) -> Self {
        self.shared.page_size.store(n.max(1), Ordering::SeqCst);
        self
    }

    /// The next `times` GETs of the content of `path` in `repo` (the `resolve` URL of a small
    /// file, the CDN URL of an LFS one, with or without `Range`) suffer `fault`. Faults queue:
    /// a second call's fault comes after the first one's GETs.
    pub fn fault(&self, repo: &str, path: &str, fault: Fault, times: usize) {
        if times == 0 {
            return;
        }
        self.shared
            .lock()
            .faults
            .entry((repo.to_string(), path.to_string()))
            .or_default()
            .push_back((fault, times));
    }

    /// Every request received since the start or the last [`FakeHub::reset_counters`], in order.
    pub fn requests(&self) -> Vec<Request> {
        self.shared.lock().requests.clone()
    }

    /// How many bytes of the content of `path` in `repo` were sent, over all GETs.
    pub fn body_bytes(&self, repo: &str, path: &str) -> u64 {
        self.shared
            .lock()
            .body_bytes
            .get(&(repo.to_string(), path.to_string()))
            .copied()
            .unwrap_or(0)
    }

    /// Forgets the requests and the body byte counts (the queued faults stay).
    pub fn reset_counters(&self) {
        let mut state = self.shared.lock();
        state.requests.clear();
        state.body_bytes.clear();
    }

    /// Adds a repository, or replaces the one with the same id (a new commit of it).
    pub fn add_repo(&self, repo: FakeRepo) {
        let repo = Arc::new(Repo::new(repo));
        let mut state = self.shared.lock();
        match state.repos.iter_mut().find(|r| r.id == repo.id) {
            Some(slot) => *slot = repo,
            None => state.repos.push(repo),
        }
    }
}

impl Drop for FakeHub {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// What the server and the [`FakeHub`] handle share.
pub(crate) struct Shared {
    pub(crate) base: String,
    pub(crate) page_size: AtomicUsize,
    state: Mutex<State>,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn repo(&self, id: &str) -> Option<Arc<Repo>> {
        self.lock().repos.iter().find(|r| r.id == id).cloned()
    }

    pub(crate) fn repos(&self) -> Vec<Arc<Repo>> {
        self.lock().repos.clone()
    }

    /// The fault the next content GET of this file suffers, counted down.
    pub(crate) fn take_fault(&self, repo: &str, path: &str) -> Option<Fault> {
        let mut state = self.lock();
        let key = (repo.to_string(), path.to_string());
        let queue = state.faults.get_mut(&key)?;
        let (fault, times) = queue.front_mut()?;
        let fault = fault.clone();
        *times -= 1;
        if *times == 0 {
            queue.pop_front();
        }
        if queue.is_empty() {
            state.faults.remove(&key);
        }
        Some(fault)
    }

    pub(crate) fn count_body(&self, repo: &str, path: &str, n: u64) {
        *self
            .lock()
            .body_bytes
            .entry((repo.to_string(), path.to_string()))
            .or_default() += n;
    }

    pub(crate) fn record(&self, request: Request) {
        self.lock().requests.push(request);
    }
}

#[derive(Default)]
pub(crate) struct State {
    repos: Vec<Arc<Repo>>,
    faults: HashMap<(String, String), VecDeque<(Fault, usize)>>,
    requests: Vec<Request>,
    body_bytes: HashMap<(String, String), u64>,
}

/// A repository as served: hashes computed once, content shared with the response bodies.
pub(crate) struct Repo {
    pub(crate) id: String,
    pub(crate) commit: String,
    pub(crate) branches: Vec<String>,
    pub(crate) gated_token: Option<String>,
    pub(crate) files: Vec<File>,
}

pub(crate) struct File {
    pub(crate) path: String,
    pub(crate) bytes: Bytes,
    pub(crate) lfs: bool,
    pub(crate) sha256: String,
    pub(crate) blob_id: String,
    pub(crate) pointer_size: usize,
}

impl Repo {
    fn new(repo: FakeRepo) -> Repo {
        let files = repo
            .files
            .into_iter()
            .map(|f| File {
                sha256: f.sha256_hex(),
                blob_id: f.blob_id(),
                pointer_size: f.lfs_pointer().map_or(0, |p| p.len()),
                lfs: f.lfs,
                path: f.path,
                bytes: Bytes::from(f.bytes),
            })
            .collect();
        Repo {
            id: repo.id,
            commit: repo.commit,
            branches: repo.branches,
            gated_token: repo.gated_token,
            files,
        }
    }

    /// The commit a revision names: a branch or the commit itself.
    pub(crate) fn resolve(&self, revision: &str) -> Option<&str> {
        (revision == self.commit || self.branches.iter().any(|b| b == revision))
            .then_some(self.commit.as_str())
    }

    pub(crate) fn file(&self, path: &str) -> Option<&File> {
        self.files.iter().find(|f| f.path == path)
    }
}
