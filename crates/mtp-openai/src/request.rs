//! The request body of the completion endpoints: OpenAI's chat and text completions, with the
//! fields vLLM, llama-server and LM Studio add, and mtp's own extensions.

use mtp_contract::{ResponseFormat, Speculation};
use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Number, Value};

use crate::field::Field;
use crate::ToolCall;

/// The body of `POST /v1/chat/completions`, `/v1/completions` and llama-server's native
/// `/completion`: the three share every field but `messages` (chat) and `prompt` (the text
/// endpoints), so one type reads and writes them all.
///
/// Every field is `Option<Field<T>>`: absent or `null` is `None`, a value of the wrong type
/// is kept as [`Field::Invalid`] for the server's 400 naming the field. Fields it does not
/// know land in `extra` (the server accepts and ignores them, as vLLM and llama-server do:
/// `user`, `metadata`, `store`, `service_tier`, ...). Fields are written in the order they are
/// declared, which is the order the HTTP runtimes have always sent them in.
///
/// ```
/// use mtp_openai::{ChatCompletionRequest, ChatMessage};
/// let body: ChatCompletionRequest = serde_json::from_value(serde_json::json!({
///     "model": "m", "messages": [{"role": "user", "content": "hi"}],
///     "temperature": "hot", "user": "me"}))
/// .unwrap();
/// assert_eq!(body.temperature.as_ref().unwrap().invalid(), Some(&"hot".into()));
/// assert!(body.extra.contains_key("user"));
///
/// let sent = ChatCompletionRequest {
///     model: Some("m".to_string().into()),
///     messages: Some(vec![ChatMessage::text("user", "hi").into()].into()),
///     temperature: Some(0.0.into()),
///     ..Default::default()
/// };
/// assert_eq!(
///     serde_json::to_string(&sent).unwrap(),
///     r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":0.0}"#
/// );
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletionRequest {
    /// The model id (the server serves one model and ignores it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<Field<String>>,
    /// The conversation (chat endpoint).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages: Option<Field<Vec<Field<ChatMessage>>>>,
    /// OpenAI tool schemas (`{"type": "function", "function": {...}}`), passed on as sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Field<Vec<Value>>>,
    /// `auto`, `none`, `required` or a named function.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<Field<OpenAiToolChoice>>,
    /// `false`: at most one tool call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_tool_calls: Option<Field<bool>>,
    /// The prompt (text endpoints).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<Field<Prompt>>,
    /// llama-server's native endpoint: token ids in the answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub return_tokens: Option<Field<bool>>,
    /// llama-server's `return_progress`: with `stream`, chunks with the prompt's progress
    /// (`prompt_progress`) before the reply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub return_progress: Option<Field<bool>>,
    /// Answer as server-sent events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<Field<bool>>,
    /// `include_usage`: a last chunk with the token counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<Field<StreamOptions>>,
    /// OpenAI's current name for the token limit (wins over `max_tokens`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_completion_tokens: Option<Field<u64>>,
    /// The token limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<Field<u64>>,
    /// llama-server's native token limit; -1 is "until the context is full".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n_predict: Option<Field<Number>>,
    /// Sampling temperature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<Field<f64>>,
    /// Nucleus sampling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<Field<f64>>,
    /// Top-k sampling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<Field<u64>>,
    /// Min-p sampling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_p: Option<Field<f64>>,
    /// Sampling seed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<Field<u64>>,
    /// OpenAI's presence penalty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub presence_penalty: Option<Field<f64>>,
    /// OpenAI's frequency penalty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frequency_penalty: Option<Field<f64>>,
    /// llama-server's and LM Studio's repetition penalty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repeat_penalty: Option<Field<f64>>,
    /// vLLM's repetition penalty (wins over `repeat_penalty`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repetition_penalty: Option<Field<f64>>,
    /// Token id (as a string) to bias.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logit_bias: Option<Field<LogitBias>>,
    /// Stop strings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<Field<Stop>>,
    /// Variables for the chat template (vLLM's and llama-server's), free-form.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template_kwargs: Option<Field<Map<String, Value>>>,
    /// vLLM's constraint field (`json`, `regex`, `choice`, `grammar`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub structured_outputs: Option<Field<StructuredOutputs>>,
    /// llama-server's JSON Schema constraint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json_schema: Option<Value>,
    /// OpenAI's `response_format` (with mtp's `regex` and `grammar` types), read by the
    /// contract's [`ResponseFormat`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<Field<ResponseFormat>>,
    /// llama-server's per-request drafting depth (0: off).
    #[serde(
        rename = "speculative.n_max",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub speculative_n_max: Option<Field<u64>>,
    /// LM Studio's per-request draft model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft_model: Option<Field<String>>,
    /// mtp's `speculation` block, read by the contract's [`Speculation`] (its messages on a
    /// bad block).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speculation: Option<Field<Speculation>>,
    /// mtp's extension: a constraint a runtime cannot enforce is asked for in the prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompted_fallback: Option<Field<bool>>,
    /// A key under which the runtime may reuse the conversation's prefix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_cache_key: Option<Field<String>>,
    /// Choices per request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<Field<u64>>,
    /// Text completions: candidates generated server-side to return the best `n` of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best_of: Option<Field<u64>>,
    /// Log probabilities of the chosen tokens: chat's `true`, or a text completion's number
    /// of alternatives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Field<crate::LogprobsParam>>,
    /// Log probabilities of the most likely tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_logprobs: Option<Field<u64>>,
    /// Text completions: repeat the prompt in the answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub echo: Option<Field<bool>>,
    /// Text completions: fill-in-the-middle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suffix: Option<Field<String>>,
    /// llama-server's GBNF grammar.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grammar: Option<Field<String>>,
    /// vLLM's older JSON Schema constraint, free-form.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guided_json: Option<Value>,
    /// vLLM's older regex constraint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guided_regex: Option<Field<String>>,
    /// vLLM's older choice constraint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guided_choice: Option<Field<Vec<String>>>,
    /// vLLM's older grammar constraint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guided_grammar: Option<Field<String>>,
    /// Every other field, as sent.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// One chat message: in a request's history, and as the assistant's whole answer
/// (`choices[i].message`).
///
/// `content` is always written (`null` when `None`: OpenAI's answer with only tool calls);
/// the other fields only when set.
///
/// ```
/// use mtp_openai::{ChatMessage, Content};
/// let m: ChatMessage = serde_json::from_str(
///     r#"{"role": "user", "content": [{"type": "text", "text": "hi"}], "x": 1}"#).unwrap();
/// assert_eq!(m.role_str(), Some("user"));
/// assert!(matches!(m.content.as_ref().and_then(|c| c.ok()), Some(Content::Parts(p)) if p.len() == 1));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `developer`, `user`, `assistant` or `tool`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<Field<String>>,
    /// The text, or parts (text and images).
    #[serde(default)]
    pub content: Option<Field<Content>>,
    /// A thinking model's reasoning (llama-server, vLLM, LM Studio).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<Field<String>>,
    /// A thinking model's reasoning as Ollama's OpenAI endpoint names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<Field<String>>,
    /// The calls an assistant turn made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Field<Vec<Field<ToolCall>>>>,
    /// The call a `tool` message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<Field<String>>,
    /// A participant's or tool's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<Field<String>>,
    /// Every other field, as sent.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl ChatMessage {
    /// A message of `role` whose content is `text`.
    pub fn text(role: &str, text: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: Some(role.to_string().into()),
            content: Some(Content::Text(text.into()).into()),
            ..Default::default()
        }
    }

    /// The role, when it is a string.
    pub fn role_str(&self) -> Option<&str> {
        self.role.as_ref()?.ok().map(String::as_str)
    }

    /// The content, when it is a string.
    pub fn content_text(&self) -> Option<&str> {
        match self.content.as_ref()?.ok()? {
            Content::Text(s) => Some(s),
            Content::Parts(_) => None,
        }
    }
}

/// A message's `content`: a string, or a list of parts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Text and image parts, in order.
    Parts(Vec<Field<ContentPart>>),
}

/// One part of a message's content: `{"type": "text", "text"}` or
/// `{"type": "image_url", "image_url": {"url"}}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ContentPart {
    /// `text` or `image_url`.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<Field<String>>,
    /// A text part's text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<Field<String>>,
    /// An image part's URL (`data:` or `http(s)`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_url: Option<Field<ImageUrl>>,
    /// Every other field, as sent.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl ContentPart {
    /// A text part.
    pub fn text(text: impl Into<String>) -> ContentPart {
        ContentPart {
            kind: Some("text".to_string().into()),
            text: Some(text.into().into()),
            ..Default::default()
        }
    }

    /// An image part.
    pub fn image(url: impl Into<String>) -> ContentPart {
        ContentPart {
            kind: Some("image_url".to_string().into()),
            image_url: Some(
                ImageUrl::Object {
                    url: url.into(),
                    extra: Map::new(),
                }
                .into(),
            ),
            ..Default::default()
        }
    }

    /// The part's `type`, when it is a string.
    pub fn kind_str(&self) -> Option<&str> {
        self.kind.as_ref()?.ok().map(String::as_str)
    }
}

/// An image part's `image_url`: OpenAI's `{"url", "detail"}`, or the URL alone (as some
/// clients send it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ImageUrl {
    /// `{"url": ...}`.
    Object {
        /// The image's URL.
        url: String,
        /// `detail` and anything else, as sent.
        #[serde(flatten)]
        extra: Map<String, Value>,
    },
    /// The URL as a string.
    Url(String),
}

impl ImageUrl {
    /// The URL.
    pub fn url(&self) -> &str {
        match self {
            ImageUrl::Object { url, .. } | ImageUrl::Url(url) => url,
        }
    }
}

/// The text endpoints' `prompt`: OpenAI takes a string, strings, token ids or lists of them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    /// One prompt.
    Text(String),
    /// Prompts.
    Texts(Vec<String>),
    /// Any other list: token ids of one prompt or of several.
    List(Vec<Value>),
}

/// `stop`: one string or a list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    /// One stop string.
    One(String),
    /// Stop strings.
    Many(Vec<String>),
}

/// `stream_options`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StreamOptions {
    /// A last chunk with `usage` (and `"usage": null` on the others).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include_usage: Option<Field<bool>>,
    /// Every other field, as sent.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// `tool_choice` in OpenAI's spellings, read and written by the contract's
/// [`mtp_contract::ToolChoice::from_openai`] / [`to_openai`](mtp_contract::ToolChoice::to_openai)
/// (one parser of it in the workspace; its message when it refuses one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenAiToolChoice(pub mtp_contract::ToolChoice);

impl Serialize for OpenAiToolChoice {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.to_openai().serialize(s)
    }
}

impl<'de> Deserialize<'de> for OpenAiToolChoice {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        mtp_contract::ToolChoice::from_openai(&v)
            .map(OpenAiToolChoice)
            .map_err(serde::de::Error::custom)
    }
}

/// vLLM's `structured_outputs`: one of `json` (a JSON Schema, or a string holding one),
/// `regex`, `choice`, `grammar` (Lark), `json_object`; vLLM's other keys
/// (`whitespace_pattern`, `structural_tag`, ...) land in `extra`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StructuredOutputs {
    /// A JSON Schema (free-form), or a string holding one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json: Option<Value>,
    /// A regex the whole reply matches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regex: Option<Field<String>>,
    /// Strings the reply is exactly one of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub choice: Option<Field<Vec<String>>>,
    /// A Lark grammar.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grammar: Option<Field<String>>,
    /// `true`: any JSON object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json_object: Option<Field<bool>>,
    /// Every other field, as sent.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl StructuredOutputs {
    /// The keys that are set (not `null`), in declaration order, then `extra`'s in the order
    /// sent.
    pub fn keys_set(&self) -> Vec<&str> {
        let known = [
            ("json", self.json.is_some()),
            ("regex", self.regex.is_some()),
            ("choice", self.choice.is_some()),
            ("grammar", self.grammar.is_some()),
            ("json_object", self.json_object.is_some()),
        ];
        known
            .into_iter()
            .filter(|(_, set)| *set)
            .map(|(k, _)| k)
            .chain(
                self.extra
                    .iter()
                    .filter(|(_, v)| !v.is_null())
                    .map(|(k, _)| k.as_str()),
            )
            .collect()
    }
}

/// `logit_bias`: token ids (as strings, JSON keys) to a bias, in the order sent.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogitBias(pub Vec<(String, Field<f64>)>);

impl Serialize for LogitBias {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

impl<'de> Deserialize<'de> for LogitBias {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = LogitBias;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object of token id to bias")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<LogitBias, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = a.next_entry::<String, Field<f64>>()? {
                    out.push((k, v));
                }
                Ok(LogitBias(out))
            }
        }
        d.deserialize_map(V)
    }
}
