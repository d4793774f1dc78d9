//! The one Hugging Face Hub client: configuration from the environment (as `huggingface_hub`
//! reads it) and — with the `hub` feature — the HTTP client that probes, lists and downloads
//! into the cache [`crate::cache`] lays out.
//!
//! The pieces:
//! - [`HubConfig`]: endpoint (`HF_ENDPOINT`, else the public Hub), token (`HF_TOKEN`, else the
//!   token file `huggingface_hub` writes at login), `HF_HUB_OFFLINE`, timeouts. Always built,
//!   so the engine can name the Hub without pulling in an HTTP stack.
//! - [`HubError`] (defined with the crate's other errors in `error`, below the cache that
//!   also returns it): what a Hub or cache operation reports.
//! - `HubClient` (feature `hub`): the Hub's API as `huggingface_hub` uses it — revision to
//!   commit, the paginated tree listing, `HEAD` for ETag/size/commit, `resolve` downloads with
//!   redirects, ranged reads for probes.
//! - `download_snapshot` (feature `hub`): a whole repository into the cache, resumable,
//!   retried, sha256-checked.
//! - `HubReader` (feature `hub`): the probe's [`crate::Reader`] over the same client.
//!
//! Why not the `hf-hub` crate: see docs/detection.md ("One Hub client").

use std::fmt;
use std::time::Duration;

use crate::cache::{expand_home, hf_home};
use crate::error::DetectError;
pub use crate::error::HubError;
use crate::repo::{validate_revision, RepoId};

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

/// Validates a repository id with [`RepoId::parse`]'s rules, as a [`HubError`].
pub fn parse_repo(id: &str) -> Result<RepoId, HubError> {
    RepoId::parse(id).map_err(|e| match e {
        DetectError::InvalidRepoId { id, why } => HubError::InvalidRepo { id, why },
        other => HubError::InvalidRepo {
            id: id.chars().take(200).collect(),
            why: other.to_string(),
        },
    })
}

/// Validates a revision with [`validate_revision`]'s rules, as a [`HubError`].
pub fn check_revision(rev: &str) -> Result<(), HubError> {
    validate_revision(rev).map_err(|_| HubError::InvalidRepo {
        id: rev.chars().take(200).collect(),
        why: "a revision may hold only ASCII letters, digits, `-`, `_` and `.`".into(),
    })
}
