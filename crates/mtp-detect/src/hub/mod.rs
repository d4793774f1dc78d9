//! The one Hugging Face Hub client: configuration from the environment (as `huggingface_hub`
//! reads it), the cache layout every other tool reads, and — with the `hub` feature — the
//! HTTP client that probes, lists and downloads.
//!
//! The pieces:
//! - [`HubConfig`]: endpoint (`HF_ENDPOINT`, else the public Hub), token (`HF_TOKEN`, else the
//!   token file `huggingface_hub` writes at login), `HF_HUB_OFFLINE`, timeouts. Always built,
//!   so the engine can name the Hub without pulling in an HTTP stack.
//! - [`cache`]: the standard cache layout (`models--org--name/{blobs,snapshots,refs}`), read
//!   and written the way `huggingface_hub` does. Always built.
//! - `HubClient` (feature `hub`): the Hub's API as `huggingface_hub` uses it — revision to
//!   commit, the paginated tree listing, `HEAD` for ETag/size/commit, `resolve` downloads with
//!   redirects, ranged reads for probes.
//! - `download_snapshot` (feature `hub`): a whole repository into the cache, resumable,
//!   retried, sha256-checked.
//! - `HubReader` (feature `hub`): the probe's [`crate::Reader`] over the same client.
//!
//! Why not the `hf-hub` crate: see docs/detection.md ("One Hub client").

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub mod cache;
#[cfg(feature = "hub")]
mod client;
#[cfg(feature = "hub")]
mod download;
#[cfg(feature = "hub")]
mod reader;

#[cfg(feature = "hub")]
pub use client::{FileMeta, HubClient, RepoRevision, TreeFile};
#[cfg(feature = "hub")]
pub use download::{download_snapshot, DownloadProgress, NoProgress, Snapshot};
#[cfg(feature = "hub")]
pub use reader::HubReader;

/// The Hub's address when `HF_ENDPOINT` is unset: what `huggingface_hub`, transformers,
/// mlx-lm and llama.cpp use. Written here once.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// `huggingface_hub`'s default for metadata requests (`HF_HUB_ETAG_TIMEOUT`), in seconds.
pub const DEFAULT_ETAG_TIMEOUT_S: u64 = 10;
/// `huggingface_hub`'s default read timeout for downloads (`HF_HUB_DOWNLOAD_TIMEOUT`): a
/// connection that sends nothing for this long is dropped and the download resumed.
pub const DEFAULT_DOWNLOAD_TIMEOUT_S: u64 = 10;
/// How many times one file's download is tried before the error is returned.
pub const DEFAULT_ATTEMPTS: u32 = 5;

/// Whether an environment value means "on", as `huggingface_hub` reads it.
pub fn env_true(v: &str) -> bool {
    matches!(
        v.trim().to_ascii_uppercase().as_str(),
        "1" | "ON" | "YES" | "TRUE"
    )
}

/// `~` and `~/…` expanded with `HOME`, as `os.path.expanduser` does.
pub(crate) fn expand_home(p: &str, get: &dyn Fn(&str) -> Option<String>) -> PathBuf {
    let home = || get("HOME").filter(|h| !h.is_empty());
    if p == "~" {
        if let Some(h) = home() {
            return PathBuf::from(h);
        }
    }
    if let Some(rest) = p.strip_prefix("~/") {
        if let Some(h) = home() {
            return Path::new(&h).join(rest);
        }
    }
    PathBuf::from(p)
}

/// `HF_HOME`, else `$XDG_CACHE_HOME/huggingface`, else `~/.cache/huggingface`.
pub fn hf_home(get: &dyn Fn(&str) -> Option<String>) -> PathBuf {
    let nonempty = |k: &str| get(k).filter(|v| !v.is_empty());
    if let Some(h) = nonempty("HF_HOME") {
        return expand_home(&h, get);
    }
    let base = match nonempty("XDG_CACHE_HOME") {
        Some(x) => expand_home(&x, get),
        None => expand_home("~/.cache", get),
    };
    base.join("huggingface")
}

/// Hub endpoint, credentials and manners.
#[derive(Clone, PartialEq, Eq)]
pub struct HubConfig {
    /// Base URL without a trailing `/`: `HF_ENDPOINT`, else [`DEFAULT_ENDPOINT`].
    pub endpoint: String,
    /// Bearer token. Never logged or printed.
    pub token: Option<String>,
    /// `HF_HUB_OFFLINE`: no request at all; answers come from the cache or fail clearly.
    pub offline: bool,
    /// Timeout of metadata requests (listing, `HEAD`, revision).
    pub etag_timeout: Duration,
    /// Longest silence tolerated while a file's bytes stream in.
    pub download_timeout: Duration,
    /// Tries per file before a download fails.
    pub attempts: u32,
    /// The wait before the second try; it doubles per try, up to 8 s.
    pub backoff: Duration,
}

impl fmt::Debug for HubConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HubConfig")
            .field("endpoint", &self.endpoint)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("offline", &self.offline)
            .field("etag_timeout", &self.etag_timeout)
            .field("download_timeout", &self.download_timeout)
            .field("attempts", &self.attempts)
            .field("backoff", &self.backoff)
            .finish()
    }
}

impl Default for HubConfig {
    fn default() -> Self {
        HubConfig::new(DEFAULT_ENDPOINT)
    }
}

impl HubConfig {
    /// An endpoint with no token, online, with `huggingface_hub`'s timeouts.
    pub fn new(endpoint: impl Into<String>) -> Self {
        HubConfig {
            endpoint: endpoint.into().trim().trim_end_matches('/').to_string(),
            token: None,
            offline: false,
            etag_timeout: Duration::from_secs(DEFAULT_ETAG_TIMEOUT_S),
            download_timeout: Duration::from_secs(DEFAULT_DOWNLOAD_TIMEOUT_S),
            attempts: DEFAULT_ATTEMPTS,
            backoff: Duration::from_secs(1),
        }
    }

    /// The same with a token (an empty one is none).
    pub fn with_token(mut self, token: Option<String>) -> Self {
        self.token = token
            .filter(|t| !t.trim().is_empty())
            .map(|t| t.trim().to_string());
        self
    }

    /// From the environment, as `huggingface_hub` reads it.
    pub fn from_env() -> Self {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// The same rule over any variable lookup:
    /// - endpoint: `HF_ENDPOINT`, else [`DEFAULT_ENDPOINT`];
    /// - token: `HF_TOKEN` (or the older `HUGGING_FACE_HUB_TOKEN`), else the file at
    ///   `HF_TOKEN_PATH`, else `$HF_HOME/token` (what `hf auth login` writes);
    /// - offline: `HF_HUB_OFFLINE` (or `TRANSFORMERS_OFFLINE`) is 1/ON/YES/TRUE;
    /// - timeouts: `HF_HUB_ETAG_TIMEOUT`, `HF_HUB_DOWNLOAD_TIMEOUT` (seconds).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Self {
        let nonempty = |k: &str| get(k).filter(|v| !v.trim().is_empty());
        let endpoint = nonempty("HF_ENDPOINT").unwrap_or_else(|| DEFAULT_ENDPOINT.to_string());
        let token = nonempty("HF_TOKEN")
            .or_else(|| nonempty("HUGGING_FACE_HUB_TOKEN"))
            .or_else(|| {
                let path = match nonempty("HF_TOKEN_PATH") {
                    Some(p) => expand_home(&p, &get),
                    None => hf_home(&get).join("token"),
                };
                std::fs::read_to_string(path).ok()
            });
        let offline = nonempty("HF_HUB_OFFLINE")
            .or_else(|| nonempty("TRANSFORMERS_OFFLINE"))
            .is_some_and(|v| env_true(&v));
        let secs = |k: &str, d: u64| {
            nonempty(k)
                .and_then(|v| v.trim().parse::<f64>().ok())
                .filter(|s| s.is_finite() && *s > 0.0)
                .map(Duration::from_secs_f64)
                .unwrap_or(Duration::from_secs(d))
        };
        let mut c = HubConfig::new(endpoint).with_token(token);
        c.offline = offline;
        c.etag_timeout = secs("HF_HUB_ETAG_TIMEOUT", DEFAULT_ETAG_TIMEOUT_S);
        c.download_timeout = secs("HF_HUB_DOWNLOAD_TIMEOUT", DEFAULT_DOWNLOAD_TIMEOUT_S);
        c
    }
}

/// A Hub or cache failure. Messages follow `huggingface_hub`'s words where it has them, and
/// each says what to do next.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// `HF_HUB_OFFLINE` is set and the cache does not hold what was asked for.
    #[error("cannot find {what} in the disk cache{} and outgoing traffic has been disabled (HF_HUB_OFFLINE is set); to enable Hub look-ups and downloads, set HF_HUB_OFFLINE=0", cache.as_ref().map(|c| format!(" ({})", c.display())).unwrap_or_default())]
    Offline {
        /// What was looked for.
        what: String,
        /// The cache searched, when one was.
        cache: Option<PathBuf>,
    },
    /// The Hub does not know the repository, or it is private and no token grants it.
    #[error("Repository Not Found for url: {url}. Please make sure you specified the correct repo id (`{repo}`). If you are trying to access a private or gated repo, make sure you are authenticated (HF_TOKEN, or `hf auth login`) and your token has the required permissions.")]
    RepoNotFound {
        /// The repository.
        repo: String,
        /// The URL asked.
        url: String,
    },
    /// A gated repository the token does not open.
    #[error("Cannot access gated repo for url {url}. {message} (set HF_TOKEN, or `hf auth login`, with a token that has been granted access)")]
    GatedRepo {
        /// The repository.
        repo: String,
        /// The URL asked.
        url: String,
        /// The Hub's own words.
        message: String,
    },
    /// The revision (branch, tag or commit) does not exist.
    #[error(
        "Revision Not Found for url: {url}. `{revision}` is not a branch, tag or commit of {repo}."
    )]
    RevisionNotFound {
        /// The repository.
        repo: String,
        /// The revision.
        revision: String,
        /// The URL asked.
        url: String,
    },
    /// The file does not exist at that revision.
    #[error("Entry Not Found for url: {url}.")]
    EntryNotFound {
        /// The repository.
        repo: String,
        /// The file.
        file: String,
        /// The URL asked.
        url: String,
    },
    /// Any other failed request: an error status, a dead server, a dropped connection.
    #[error("Hub request {url} failed: {message}")]
    Http {
        /// The URL (never carries the token).
        url: String,
        /// The status, when there was an answer.
        status: Option<u16>,
        /// What went wrong.
        message: String,
    },
    /// An answer that is not what the Hub sends (bad JSON, a missing header, too large).
    #[error("unexpected answer from {url}: {message}")]
    BadAnswer {
        /// The URL.
        url: String,
        /// What is wrong with it.
        message: String,
    },
    /// A downloaded file whose bytes do not match what the Hub announced; nothing installed.
    #[error("{repo}/{}: the downloaded bytes do not match: expected {what} {expected}, got {actual}; the file was discarded and nothing was installed", crate::source::shown_name(file))]
    Mismatch {
        /// The repository.
        repo: String,
        /// The file.
        file: String,
        /// What was compared (`sha256`, `size`, `git blob sha1`).
        what: &'static str,
        /// The announced value.
        expected: String,
        /// The value of the bytes received.
        actual: String,
    },
    /// The Hub named a file that is not a safe relative path.
    #[error(
        "{repo} lists an unsafe file name `{}`; refusing to write it",
        crate::source::shown_name(file)
    )]
    UnsafePath {
        /// The repository.
        repo: String,
        /// The name.
        file: String,
    },
    /// A repository id or revision that is not acceptable.
    #[error("invalid repository id or revision `{id}`: {why}")]
    InvalidRepo {
        /// As given.
        id: String,
        /// What is wrong.
        why: String,
    },
    /// A cache file could not be read or written.
    #[error("cache error at {}: {source}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The repository is not (completely) in the cache.
    #[error("{repo} is not installed in {}: {why}; run `mtp models download {repo}`", cache.display())]
    NotInstalled {
        /// The repository.
        repo: String,
        /// The cache.
        cache: PathBuf,
        /// What is missing.
        why: String,
    },
}

impl HubError {
    /// An I/O error at `path`.
    pub fn io(path: &Path) -> impl FnOnce(std::io::Error) -> HubError + '_ {
        move |source| HubError::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    /// The HTTP status, when the Hub answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            HubError::Http { status, .. } => *status,
            HubError::RepoNotFound { .. } => Some(401),
            HubError::GatedRepo { .. } => Some(401),
            HubError::RevisionNotFound { .. } | HubError::EntryNotFound { .. } => Some(404),
            _ => None,
        }
    }
}

/// Validates a repository id with [`crate::RepoId::parse`]'s rules, as a [`HubError`].
pub fn parse_repo(id: &str) -> Result<crate::RepoId, HubError> {
    crate::RepoId::parse(id).map_err(|e| match e {
        crate::DetectError::InvalidRepoId { id, why } => HubError::InvalidRepo { id, why },
        other => HubError::InvalidRepo {
            id: id.chars().take(200).collect(),
            why: other.to_string(),
        },
    })
}

/// Validates a revision with [`crate::repo::validate_revision`]'s rules, as a [`HubError`].
pub fn check_revision(rev: &str) -> Result<(), HubError> {
    crate::repo::validate_revision(rev).map_err(|_| HubError::InvalidRepo {
        id: rev.chars().take(200).collect(),
        why: "a revision may hold only ASCII letters, digits, `-`, `_` and `.`".into(),
    })
}
