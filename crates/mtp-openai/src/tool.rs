//! OpenAI's tool calls: a whole call (`message.tool_calls[i]`: `id`, `type`,
//! `function.{name, arguments}` with the arguments a JSON object as a string) and a streamed
//! piece of one (`delta.tool_calls[i]`: its `index`, the first piece with `id`, `type` and
//! `function.name`, later pieces with argument text).
//!
//! Every field is a [`Field`], since a server may send a malformed call and a client reports
//! it naming where it is; the argument JSON is free-form.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::field::Field;

/// A whole tool call or a streamed piece of one.
///
/// ```
/// use mtp_openai::ToolCall;
/// let whole = ToolCall::whole("call_0", "function", "f", "{\"a\": 1}");
/// assert_eq!(serde_json::to_string(&whole).unwrap(),
///     r#"{"id":"call_0","type":"function","function":{"name":"f","arguments":"{\"a\": 1}"}}"#);
/// let piece = ToolCall::piece(1, None, None, "{\"a\"");
/// assert_eq!(serde_json::to_string(&piece).unwrap(),
///     r#"{"index":1,"function":{"arguments":"{\"a\""}}"#);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Which call of the reply a streamed piece belongs to (Ollama also numbers whole calls).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<Field<u64>>,
    /// The call's id, which the `tool` message answering it repeats.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<Field<String>>,
    /// `function`.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<Field<String>>,
    /// The function called.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<Field<FunctionCall>>,
    /// Every other field, as sent.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A tool call's `function`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    /// The function's name (a streamed call's first piece only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<Field<String>>,
    /// The arguments: a JSON object as a string (OpenAI; a streamed piece's fragment of it),
    /// or the object itself (as some servers and clients send it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<Value>,
    /// Every other field, as sent.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl ToolCall {
    /// A whole call: `id`, `type`, `function.name` and the arguments' JSON text.
    pub fn whole(
        id: impl Into<String>,
        kind: impl Into<String>,
        name: impl Into<String>,
        arguments: impl Into<String>,
    ) -> ToolCall {
        ToolCall {
            index: None,
            id: Some(id.into().into()),
            kind: Some(kind.into().into()),
            function: Some(
                FunctionCall {
                    name: Some(name.into().into()),
                    arguments: Some(Value::String(arguments.into())),
                    extra: Map::new(),
                }
                .into(),
            ),
            extra: Map::new(),
        }
    }

    /// A streamed piece of call `index`: a first piece carries its `id` (and with it `type:
    /// function`) and `name`; every piece its argument text.
    pub fn piece(
        index: u64,
        id: Option<String>,
        name: Option<String>,
        arguments: impl Into<String>,
    ) -> ToolCall {
        ToolCall {
            index: Some(index.into()),
            kind: id.as_ref().map(|_| "function".to_string().into()),
            id: id.map(Field::Ok),
            function: Some(
                FunctionCall {
                    name: name.map(Field::Ok),
                    arguments: Some(Value::String(arguments.into())),
                    extra: Map::new(),
                }
                .into(),
            ),
            extra: Map::new(),
        }
    }

    /// A history call of the contract as OpenAI's request sends it: the arguments as their
    /// JSON text (an object written out, `null` as `{}`), the id when there is one.
    ///
    /// ```
    /// let c = mtp_contract::ToolCall::function("c1", "f", serde_json::json!({"x": 1}));
    /// assert_eq!(serde_json::to_string(&mtp_openai::ToolCall::from_contract(&c)).unwrap(),
    ///     r#"{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"x\":1}"}}"#);
    /// ```
    pub fn from_contract(c: &mtp_contract::ToolCall) -> ToolCall {
        let arguments = match &c.function.arguments {
            Value::String(s) => s.clone(),
            Value::Null => "{}".to_string(),
            v => v.to_string(),
        };
        let mut call = ToolCall::whole("", c.kind.clone(), c.function.name.clone(), arguments);
        call.id = c.id.clone().map(Field::Ok);
        call
    }

    /// The contract's call, for a request's history: `function` an object with a string
    /// `name`; `id` and `type`, when sent, strings (`type` defaults to `function`); the
    /// arguments as sent. The error says which field is wrong.
    ///
    /// ```
    /// let call: mtp_openai::ToolCall = serde_json::from_str(
    ///     r#"{"id": "c1", "function": {"name": "f", "arguments": "{}"}}"#).unwrap();
    /// assert_eq!(call.to_contract().unwrap().kind, "function");
    /// let bad: mtp_openai::ToolCall = serde_json::from_str(r#"{"function": {"name": 3}}"#).unwrap();
    /// assert!(bad.to_contract().unwrap_err().contains("`function.name`"));
    /// ```
    pub fn to_contract(&self) -> Result<mtp_contract::ToolCall, String> {
        let string = |f: &Option<Field<String>>, at: &str| -> Result<Option<String>, String> {
            match f {
                None => Ok(None),
                Some(Field::Ok(s)) => Ok(Some(s.clone())),
                Some(Field::Invalid { value, .. }) => {
                    Err(format!("`{at}` must be a string, got {value}"))
                }
            }
        };
        let function = match &self.function {
            Some(Field::Ok(f)) => f,
            Some(Field::Invalid { value, .. }) => {
                return Err(format!("`function` must be an object, got {value}"))
            }
            None => return Err("`function` is missing".into()),
        };
        let name = string(&function.name, "function.name")?
            .ok_or_else(|| "`function.name` is missing".to_string())?;
        Ok(mtp_contract::ToolCall {
            id: string(&self.id, "id")?,
            kind: string(&self.kind, "type")?.unwrap_or_else(|| "function".into()),
            function: mtp_contract::FunctionCall {
                name,
                arguments: function.arguments.clone().unwrap_or(Value::Null),
            },
        })
    }
}
