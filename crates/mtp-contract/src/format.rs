//! `response_format`: what shape the reply must take (OpenAI's shape, plus `regex` and Lark
//! `grammar` as vLLM and llama.cpp users know them).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::ProviderError;

/// The largest schema, pattern or grammar text a request may carry (a compiled constraint
/// grows with it; llguidance bounds its own work, this bounds what reaches it).
pub const MAX_CONSTRAINT_BYTES: usize = 1 << 20;

/// A constraint on the reply, applied while decoding (every token is drawn from the ones the
/// constraint allows), never by parsing afterwards.
///
/// ```
/// use mtp_contract::ResponseFormat;
/// let f: ResponseFormat = serde_json::from_value(serde_json::json!({
///     "type": "json_schema",
///     "json_schema": {"name": "point", "schema": {"type": "object",
///         "properties": {"x": {"type": "integer"}}, "required": ["x"]}}
/// })).unwrap();
/// assert!(f.validate().is_ok());
/// assert!(f.is_constrained());
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponseFormat {
    /// Free text (no constraint).
    Text,
    /// Any JSON object.
    JsonObject {
        /// Allow free whitespace between tokens (default: compact `", "` and `": "` only).
        #[serde(default, skip_serializing_if = "is_false")]
        flexible_whitespace: bool,
    },
    /// JSON valid against a JSON Schema.
    JsonSchema {
        /// The schema and its name (OpenAI's `json_schema` object).
        json_schema: JsonSchemaFormat,
        /// Allow free whitespace between tokens (default: compact `", "` and `": "` only).
        #[serde(default, skip_serializing_if = "is_false")]
        flexible_whitespace: bool,
    },
    /// Text matching a regular expression (Rust `regex` syntax), whole.
    Regex {
        /// The pattern.
        regex: String,
    },
    /// Text of a Lark grammar (llguidance's Lark dialect; `start` is the start rule).
    Grammar {
        /// The grammar text.
        grammar: String,
    },
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// OpenAI's `json_schema` object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JsonSchemaFormat {
    /// A name for the schema.
    #[serde(default)]
    pub name: Option<String>,
    /// The schema (a JSON object, or `true`).
    pub schema: Value,
    /// OpenAI's `strict`: kept for compatibility; the output always follows the schema.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

impl ResponseFormat {
    /// JSON valid against `schema`.
    pub fn json_schema(schema: Value) -> Self {
        ResponseFormat::JsonSchema {
            json_schema: JsonSchemaFormat {
                name: None,
                schema,
                strict: None,
            },
            flexible_whitespace: false,
        }
    }

    /// Any JSON object.
    pub fn json_object() -> Self {
        ResponseFormat::JsonObject {
            flexible_whitespace: false,
        }
    }

    /// Text matching `pattern`.
    pub fn regex(pattern: impl Into<String>) -> Self {
        ResponseFormat::Regex {
            regex: pattern.into(),
        }
    }

    /// Text of a Lark grammar.
    pub fn grammar(lark: impl Into<String>) -> Self {
        ResponseFormat::Grammar {
            grammar: lark.into(),
        }
    }

    /// The same constraint with free whitespace between JSON tokens (what a server's own JSON
    /// may hold); other kinds are returned as they are.
    pub fn with_flexible_whitespace(self) -> Self {
        match self {
            ResponseFormat::JsonObject { .. } => ResponseFormat::JsonObject {
                flexible_whitespace: true,
            },
            ResponseFormat::JsonSchema { json_schema, .. } => ResponseFormat::JsonSchema {
                json_schema,
                flexible_whitespace: true,
            },
            other => other,
        }
    }

    /// Reads OpenAI's `response_format` value; the error names the field at fault.
    pub fn from_json(v: &Value) -> Result<Self, ProviderError> {
        let f: ResponseFormat =
            serde_json::from_value(v.clone()).map_err(|e| ProviderError::InvalidRequest {
                field: "response_format",
                message: format!(
                    "{e} (expected {{\"type\": \"text\" | \"json_object\" | \"json_schema\" | \
                     \"regex\" | \"grammar\", ...}})"
                ),
            })?;
        f.validate()?;
        Ok(f)
    }

    /// True unless the format is free text.
    pub fn is_constrained(&self) -> bool {
        !matches!(self, ResponseFormat::Text)
    }

    /// A short name for reports and errors (`json_schema`, `regex`, ...).
    pub fn kind(&self) -> &'static str {
        match self {
            ResponseFormat::Text => "text",
            ResponseFormat::JsonObject { .. } => "json_object",
            ResponseFormat::JsonSchema { .. } => "json_schema",
            ResponseFormat::Regex { .. } => "regex",
            ResponseFormat::Grammar { .. } => "grammar",
        }
    }

    /// The instruction that asks a model for this shape in the prompt, for a runtime that
    /// cannot enforce it and a request that allows asking instead
    /// (`GenerateRequest::prompted_fallback`); `None` for free text.
    ///
    /// ```
    /// use mtp_contract::ResponseFormat;
    /// let f = ResponseFormat::regex("[0-9]{3}");
    /// assert!(f.instruction().unwrap().contains("[0-9]{3}"));
    /// assert!(ResponseFormat::Text.instruction().is_none());
    /// ```
    pub fn instruction(&self) -> Option<String> {
        let only = "Reply with that and nothing else: no explanation, no code fence.";
        Some(match self {
            ResponseFormat::Text => return None,
            ResponseFormat::JsonObject { .. } => format!("Your reply must be one JSON object. {only}"),
            ResponseFormat::JsonSchema { json_schema, .. } => format!(
                "Your reply must be one JSON value that is valid against this JSON Schema:\n{}\n{only}",
                json_schema.schema
            ),
            ResponseFormat::Regex { regex } => format!(
                "Your reply must match this regular expression as a whole:\n{regex}\n{only}"
            ),
            ResponseFormat::Grammar { grammar } => format!(
                "Your reply must be a sentence of this Lark grammar (start rule `start`):\n{grammar}\n{only}"
            ),
        })
    }

    /// Checks the shape (not whether a constraint compiles: that is the runtime's, before any
    /// generation).
    pub fn validate(&self) -> Result<(), ProviderError> {
        let bad = |message: String| ProviderError::InvalidRequest {
            field: "response_format",
            message,
        };
        match self {
            ResponseFormat::Text | ResponseFormat::JsonObject { .. } => Ok(()),
            ResponseFormat::JsonSchema { json_schema, .. } => {
                match &json_schema.schema {
                    Value::Object(_) | Value::Bool(true) => {}
                    other => {
                        return Err(bad(format!(
                            "json_schema.schema must be a JSON object (or true), not {}",
                            json_kind(other)
                        )))
                    }
                }
                let n = json_schema.schema.to_string().len();
                if n > MAX_CONSTRAINT_BYTES {
                    return Err(bad(format!(
                        "json_schema.schema is {n} bytes; at most {MAX_CONSTRAINT_BYTES} are taken"
                    )));
                }
                Ok(())
            }
            ResponseFormat::Regex { regex: text } | ResponseFormat::Grammar { grammar: text } => {
                let what = self.kind();
                if text.trim().is_empty() {
                    return Err(bad(format!("`{what}` must not be empty")));
                }
                if text.len() > MAX_CONSTRAINT_BYTES {
                    return Err(bad(format!(
                        "`{what}` is {} bytes; at most {MAX_CONSTRAINT_BYTES} are taken",
                        text.len()
                    )));
                }
                Ok(())
            }
        }
    }
}

/// How messages name a JSON value's type ("a string", "an object", ...): one spelling for every
/// crate's errors about a JSON file or field.
pub fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn shapes_and_errors() {
        let table: Vec<(Value, Result<&str, &str>)> = vec![
            (json!({"type": "text"}), Ok("text")),
            (json!({"type": "json_object"}), Ok("json_object")),
            (
                json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}, "strict": true}}),
                Ok("json_schema"),
            ),
            (json!({"type": "regex", "regex": "[0-9]+"}), Ok("regex")),
            (
                json!({"type": "grammar", "grammar": "start: \"a\""}),
                Ok("grammar"),
            ),
            (json!({"type": "xml"}), Err("unknown variant")),
            (json!({"type": "json_schema"}), Err("json_schema")),
            (
                json!({"type": "json_schema", "json_schema": {"schema": 3}}),
                Err("not a number"),
            ),
            (
                json!({"type": "regex", "regex": " "}),
                Err("must not be empty"),
            ),
            (json!("json"), Err("expected")),
        ];
        for (v, want) in table {
            let got = ResponseFormat::from_json(&v);
            match (got, want) {
                (Ok(f), Ok(kind)) => assert_eq!(f.kind(), kind, "{v}"),
                (Err(e), Err(part)) => {
                    let s = e.to_string();
                    assert!(
                        s.contains("response_format") && s.contains(part),
                        "{v}: {s}"
                    )
                }
                (got, want) => panic!("{v}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn round_trips_openai_shape() {
        let f = ResponseFormat::json_schema(json!({"type": "integer"}));
        let v = serde_json::to_value(&f).unwrap();
        assert_eq!(
            v,
            json!({"type": "json_schema", "json_schema": {"name": null, "schema": {"type": "integer"}}})
        );
        assert_eq!(ResponseFormat::from_json(&v).unwrap(), f);
    }
}
