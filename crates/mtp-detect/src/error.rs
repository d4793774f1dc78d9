//! The crate's errors, in two layers: [`HubError`] (the Hub and the cache) and [`DetectError`]
//! (probing an artifact), which wraps it. Both live here, below every module that returns
//! them, so that no low module needs a higher one for its error type. Every variant names the
//! file, repository or key at fault.

use std::path::{Path, PathBuf};

use crate::gguf::GgufErrorKind;
use crate::names::shown_name;

/// What can go wrong while probing an artifact.
///
/// Messages name the input at fault (a file path, `repo:file` for remote reads) and what is
/// wrong with it, so a CLI can print the message as its one error line.
#[derive(Debug, thiserror::Error)]
pub enum DetectError {
    /// A file could not be read.
    #[error("cannot read {file}: {source}")]
    Io {
        /// The file (path or `repo:file`).
        file: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A local path does not exist.
    #[error("{path}: no such file or directory")]
    NotFound {
        /// The path as given.
        path: String,
    },
    /// The GGUF header is malformed, truncated or hostile.
    #[error("{file}: bad GGUF header: {kind}")]
    Gguf {
        /// The file.
        file: String,
        /// What is wrong.
        kind: GgufErrorKind,
    },
    /// The safetensors header is malformed, truncated or hostile.
    #[error("{file}: bad safetensors header: {message}")]
    Safetensors {
        /// The file.
        file: String,
        /// What is wrong.
        message: String,
    },
    /// A JSON file (config, index, registry, API listing) is malformed.
    #[error("{file}: {message}")]
    Json {
        /// The file.
        file: String,
        /// What is wrong.
        message: String,
    },
    /// A file is larger than the cap for its kind; nothing of that size is read.
    #[error("{file}: {size} bytes is more than the {limit}-byte limit for this kind of file")]
    TooLarge {
        /// The file.
        file: String,
        /// Its size (or declared size).
        size: u64,
        /// The cap.
        limit: u64,
    },
    /// A repository id or revision is not acceptable.
    #[error("invalid repository id `{id}`: {why}")]
    InvalidRepoId {
        /// The id as given.
        id: String,
        /// What is wrong.
        why: String,
    },
    /// The directory or repository holds no weights this crate can read.
    #[error("{place}: no .safetensors or .gguf weights found")]
    NoWeights {
        /// The directory or repository.
        place: String,
    },
    /// The Hub (or, offline, the cache in its place) could not answer.
    #[error(transparent)]
    Hub(#[from] HubError),
    /// The capability registry could not be read.
    #[error("model registry {file}: {message}")]
    Registry {
        /// The registry file (`<embedded>` for the built-in one).
        file: String,
        /// What is wrong.
        message: String,
    },
}

impl DetectError {
    pub(crate) fn io(file: impl Into<String>, source: std::io::Error) -> Self {
        DetectError::Io {
            file: file.into(),
            source,
        }
    }

    pub(crate) fn json(file: impl Into<String>, message: impl Into<String>) -> Self {
        DetectError::Json {
            file: file.into(),
            message: message.into(),
        }
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
    #[error("{repo}/{}: the downloaded bytes do not match: expected {what} {expected}, got {actual}; the file was discarded and nothing was installed", shown_name(file))]
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
        shown_name(file)
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
