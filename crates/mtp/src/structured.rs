//! Typed structured output: the reply constrained to a Rust type's JSON Schema while it is
//! decoded (on the runtimes that enforce `response_format`), then parsed into the type.
//!
//! ```no_run
//! use mtp::{create_llm, GenerateRequest, ProviderOptions};
//! #[derive(serde::Deserialize, schemars::JsonSchema)]
//! struct Point { x: i32, y: i32 }
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let llm = create_llm("native", "models/tiny-code", ProviderOptions::default())?;
//! let (p, _response) = mtp::structured::generate_json::<Point>(
//!     llm.as_ref(),
//!     GenerateRequest::new("A point as JSON:").max_output_tokens(64),
//! ).await?;
//! println!("{} {}", p.x, p.y);
//! # Ok(()) }
//! ```

use serde::de::DeserializeOwned;

use crate::{FinishReason, GenerateRequest, GenerateResponse, Provider, ProviderError};
use crate::{JsonSchemaFormat, ResponseFormat};

/// Why a typed reply could not be had.
#[derive(Debug, thiserror::Error)]
pub enum StructuredError {
    /// The provider refused or failed the request (a runtime that cannot enforce the schema
    /// refuses it: the schema is never dropped).
    #[error("{0}")]
    Provider(#[from] ProviderError),
    /// The reply ended before the JSON was complete (the token budget, or a cancel).
    #[error("the reply ended ({finish:?}) before its JSON was complete: {content:?}")]
    Incomplete {
        /// Why the reply ended.
        finish: FinishReason,
        /// What it held.
        content: String,
    },
    /// The reply is complete but does not parse into the type (the schema a type derives can
    /// say less than its `Deserialize` wants, e.g. a custom deserializer).
    #[error("the reply does not parse into {type_name}: {message} (reply: {content:?})")]
    Parse {
        /// The Rust type.
        type_name: &'static str,
        /// serde's message.
        message: String,
        /// The reply.
        content: String,
    },
}

/// The `response_format` for `T`: its JSON Schema (schemars), compact JSON.
pub fn format_for<T: schemars::JsonSchema>() -> ResponseFormat {
    let schema = schemars::schema_for!(T);
    ResponseFormat::JsonSchema {
        json_schema: JsonSchemaFormat {
            name: Some(T::schema_name().into_owned()),
            schema: schema.to_value(),
            strict: Some(true),
        },
        flexible_whitespace: false,
    }
}

/// Generates a reply constrained to `T`'s JSON Schema and parses it into `T`. Returns the
/// value and the whole response (report, usage, timings).
pub async fn generate_json<T>(
    llm: &dyn Provider,
    request: GenerateRequest,
) -> Result<(T, GenerateResponse), StructuredError>
where
    T: schemars::JsonSchema + DeserializeOwned,
{
    let response = llm
        .generate(request.response_format(format_for::<T>()))
        .await?;
    parse_reply(response)
}

fn parse_reply<T: DeserializeOwned>(
    response: GenerateResponse,
) -> Result<(T, GenerateResponse), StructuredError> {
    match serde_json::from_str::<T>(&response.content) {
        Ok(v) => Ok((v, response)),
        Err(e) if response.finish_reason != FinishReason::Stop || response.partial => {
            let _ = e;
            Err(StructuredError::Incomplete {
                finish: response.finish_reason,
                content: response.content,
            })
        }
        Err(e) => Err(StructuredError::Parse {
            type_name: std::any::type_name::<T>(),
            message: e.to_string(),
            content: response.content,
        }),
    }
}
