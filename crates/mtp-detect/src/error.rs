//! The one error enum of the crate. Every variant names the file, repository or key at fault.

use crate::gguf::GgufErrorKind;

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
    Hub(#[from] crate::hub::HubError),
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
