//! The command's errors: each says what failed, why, and what to do next.

use std::path::PathBuf;

use crate::{ProviderError, Reason, SpeculationError};

/// Everything the `mtp` command can fail with.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The provider could not be created (unknown name, model failed to load).
    #[error("cannot start provider `{provider}` for model {model}: {source}")]
    Start {
        /// Provider name.
        provider: String,
        /// Model as given.
        model: String,
        /// The facade's error.
        source: crate::Error,
    },
    /// No model was named and the bundled demo model is not there.
    #[error("no --model given and the bundled demo model is missing at {}", path.display())]
    DefaultModelMissing {
        /// Where it was looked for.
        path: PathBuf,
    },
    /// A request or runtime failure.
    #[error("{context}: {source}")]
    Provider {
        /// What was being done.
        context: String,
        /// The provider's typed error.
        source: ProviderError,
    },
    /// `--require-acceleration` and the loaded provider shows no MTP lane.
    #[error("refusing to start: --require-acceleration was given but {provider} loaded no MTP lane for {model}{}: {message}", reason.map(|r| format!(" ({r})")).unwrap_or_default())]
    NoLane {
        /// Provider name.
        provider: String,
        /// Model.
        model: String,
        /// The provider's reason.
        reason: Option<Reason>,
        /// The provider's sentence.
        message: String,
    },
    /// A speculation flag is invalid.
    #[error("invalid speculation flag: {0}")]
    Speculation(#[from] SpeculationError),
    /// A flag value is invalid.
    #[error("invalid {flag}: {message}")]
    InvalidFlag {
        /// The flag.
        flag: &'static str,
        /// What is wrong.
        message: String,
    },
    /// The detection report could not be produced.
    #[error("cannot probe {target}: {message}")]
    Probe {
        /// Repo id or path.
        target: String,
        /// What went wrong.
        message: String,
    },
    /// A Hub download or cache operation failed.
    #[error("{0}")]
    Hub(#[from] mtp_detect::hub::HubError),
    /// `models verify` found output that a healthy checkpoint would not produce.
    #[error("model {model} failed verification: {message}")]
    Verify {
        /// The model.
        model: String,
        /// Which check failed, on which prompt.
        message: String,
    },
    /// `mtp serve` could not listen, or stopped on an error.
    #[error(transparent)]
    Serve(#[from] mtp_server::ServerError),
    /// The benchmark has nothing to compare.
    #[error("cannot benchmark {model} on {provider}: {message}")]
    Bench {
        /// Provider.
        provider: String,
        /// Model.
        model: String,
        /// Why.
        message: String,
    },
    /// The request the flags make is invalid (a value out of range, a bad combination).
    #[error("invalid request: {source}")]
    BadRequest {
        /// The contract's error, naming the field.
        source: ProviderError,
    },
    /// The user pressed Ctrl-C; what was generated was printed.
    #[error("interrupted")]
    Interrupted,
    /// Writing output or reading input failed.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// The line editor failed.
    #[error("line editor: {0}")]
    Readline(String),
}

impl CliError {
    /// The process exit code: 2 for usage errors (flags and their values), 130 after Ctrl-C,
    /// 1 for everything that failed at run time.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::InvalidFlag { .. }
            | CliError::Speculation(_)
            | CliError::BadRequest { .. } => 2,
            CliError::Interrupted => 130,
            _ => 1,
        }
    }

    /// What the person can do next, when there is something useful to say.
    pub fn hint(&self) -> Option<String> {
        match self {
            CliError::Start {
                source: crate::Error::UnknownProvider { known, .. },
                ..
            } if known.is_empty() => Some(
                "this build registers no providers yet; a runtime crate must call mtp::register_provider"
                    .into(),
            ),
            CliError::Start {
                source: crate::Error::UnknownProvider { .. },
                ..
            } => Some("pass one of the known names with --provider".into()),
            CliError::Start { .. } => Some("-v shows detail".into()),
            CliError::DefaultModelMissing { .. } => Some(
                "build it with `cargo xtask train-tiny`, set MTP_DEFAULT_MODEL, or pass --model".into(),
            ),
            CliError::NoLane { .. } => Some(
                "fetch the drafter it names, pass --drafter, or drop --require-acceleration".into(),
            ),
            CliError::Provider {
                source: ProviderError::SpeculationUnavailable { .. },
                ..
            } => Some("drop --require-acceleration to run unaccelerated".into()),
            CliError::Provider {
                source: ProviderError::Connection { .. },
                ..
            } => Some("start the server or fix --base-url".into()),
            CliError::Provider {
                source:
                    ProviderError::Api {
                        status: Some(401 | 403),
                        ..
                    },
                ..
            } => Some("pass the server's key with --api-key (or set MTP_API_KEY)".into()),
            CliError::Verify { .. } => Some(
                "the checkpoint may be mis-converted: re-download it or probe it with `mtp probe`".into(),
            ),
            _ => None,
        }
    }
}
