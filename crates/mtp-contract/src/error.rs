//! The typed errors of every provider.

use crate::extra::OptionError;
use crate::reason::Reason;
use crate::speculation::SpeculationError;

/// What can go wrong when calling a provider. Messages name the input or server at fault and
/// what to do next.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    /// A request field is invalid.
    #[error("invalid request: `{field}` {message}")]
    InvalidRequest {
        /// The field at fault.
        field: &'static str,
        /// What is wrong.
        message: String,
    },
    /// The prompt does not fit the context the model is served with (OpenAI's and vLLM's
    /// `context_length_exceeded`).
    #[error("the prompt does not fit the context: {message}")]
    ContextLengthExceeded {
        /// The context length (prompt and reply), in tokens.
        context: usize,
        /// What does not fit and what to do.
        message: String,
    },
    /// A provider option (`ProviderOptions::extra`, or a typed lane option) is unknown, malformed,
    /// out of range or contradicted: the error names the key and the value.
    #[error("invalid option: {0}")]
    InvalidOption(#[from] OptionError),
    /// The speculation block is malformed.
    #[error("invalid speculation block: {0}")]
    InvalidSpeculation(#[from] SpeculationError),
    /// `require_acceleration` was set and acceleration is impossible. Raised before generating.
    #[error("speculation unavailable ({reason}): {message}")]
    SpeculationUnavailable {
        /// The named reason.
        reason: Reason,
        /// What to do next.
        message: String,
    },
    /// The provider is already generating and does not queue silently.
    #[error("provider busy: {model} is already generating; wait for the current call or create another provider")]
    Busy {
        /// The model.
        model: String,
    },
    /// The runtime or server failed.
    #[error("{provider} error for model {model}: {message}")]
    Api {
        /// The provider name.
        provider: String,
        /// The model.
        model: String,
        /// HTTP status, when there was one.
        status: Option<u16>,
        /// The cause, including the server's own message.
        message: String,
    },
    /// The server could not be reached.
    #[error("cannot connect to {server}: {message}")]
    Connection {
        /// Base URL.
        server: String,
        /// The cause.
        message: String,
    },
    /// The server stopped answering.
    #[error("timed out waiting for {server}: {message}")]
    Timeout {
        /// Base URL.
        server: String,
        /// What was being waited for.
        message: String,
    },
    /// The model could not be loaded.
    #[error("cannot load model {model}: {message}")]
    ModelLoad {
        /// The model.
        model: String,
        /// The reason.
        message: String,
    },
    /// The runtime does not support this feature.
    #[error("{what} is not supported by the {provider} runtime")]
    Unsupported {
        /// The provider name.
        provider: String,
        /// The feature.
        what: String,
    },
    /// The call was cancelled.
    #[error("generation cancelled")]
    Cancelled,
    /// The provider was unloaded.
    #[error("model {model} has been unloaded")]
    Unloaded {
        /// The model.
        model: String,
    },
}

impl ProviderError {
    /// Whether the request itself is at fault (a bad field or block, a feature or lane it asks
    /// for that is not there), as opposed to the provider or the runtime behind it: a server
    /// answers the first with a 4xx and counts it as refused, not failed.
    pub fn is_client_error(&self) -> bool {
        matches!(
            self,
            ProviderError::InvalidRequest { .. }
                | ProviderError::InvalidOption(_)
                | ProviderError::ContextLengthExceeded { .. }
                | ProviderError::InvalidSpeculation(_)
                | ProviderError::SpeculationUnavailable { .. }
                | ProviderError::Unsupported { .. }
        )
    }
}
