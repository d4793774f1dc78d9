//! Tool calls out of the model's text, in the format its chat template taught it.
//!
//! `mtp serve` renders a request's `tools` into the chat template; the model then answers in
//! that template's own tool-call markup, and this module turns the markup back into OpenAI
//! `tool_calls`:
//!
//! - [`ToolCallFormat::from_template`]: which markup, read from the template's source (never
//!   from the model's name): Qwen3-Coder / Qwen3.5's XML ([`ToolCallFormat::QwenXml`]) or the
//!   Hermes JSON of Qwen2.5 / Qwen3 / Hermes ([`ToolCallFormat::HermesJson`]).
//! - [`parse`]: a whole reply to content and calls, following vLLM's `qwen3_coder` and
//!   `hermes` tool parsers (parameters typed by each tool's JSON schema).
//! - [`ToolCallStream`]: the same, piece by piece as the reply streams, as OpenAI's
//!   `delta.tool_calls`; streaming and [`parse`] agree on every split of the text.
//! - [`call_grammar`]: an llguidance Lark grammar that forces the reply to be tool calls in
//!   the template's format (`tool_choice: "required"` or a named function).
//!
//! ```
//! use mtp_chat::toolcall::{parse, CallIds, ToolCallFormat};
//! use serde_json::json;
//!
//! let tools = [json!({"type": "function", "function": {"name": "get_weather",
//!     "parameters": {"type": "object", "properties": {"city": {"type": "string"},
//!     "days": {"type": "integer"}}}}})];
//! let text = "Let me check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n\
//!             </parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
//! let reply = parse(ToolCallFormat::QwenXml, text, &tools);
//! assert_eq!(reply.content, "Let me check.");
//! assert_eq!(reply.calls[0].name, "get_weather");
//! assert_eq!(reply.calls[0].arguments, r#"{"city": "Paris", "days": 3}"#);
//! assert!(reply.calls[0].id.starts_with("call_"));
//! ```

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

use serde_json::{json, Value};

mod formats;
mod grammar;
mod parse;
mod stream;
mod strings;

pub use grammar::{call_grammar, Forced, ToolCallError};
pub(crate) use parse::{coerce, functions, properties, py_json, resolve, schema_types, type_alias};
pub use parse::{parse, parse_with_ids, MAX_SCHEMA_WALK_NODES};
pub use strings::Unsupported;

/// The most schema nodes the type walks of one request's tools visit in all (each
/// parameter's at most [`MAX_SCHEMA_WALK_NODES`]).
pub const MAX_TOOL_SCHEMA_NODES: usize = 1 << 16;

/// Checks that every tool parameter's schema can be read within the walks' budgets
/// ([`MAX_SCHEMA_WALK_NODES`] nodes for one parameter, [`MAX_TOOL_SCHEMA_NODES`] for the whole
/// request), before anything is rendered or compiled: a schema whose `anyOf` / `$ref` nesting
/// goes past them is the request's fault, named here, and costs the server no more than the
/// budget. The walks visit each node once, so cycles and shared subschemas are cheap.
///
/// ```
/// use mtp_chat::toolcall::{check_tool_schemas, ToolCallError};
/// use serde_json::json;
///
/// let ok = [json!({"type": "function", "function": {"name": "f", "parameters": {
///     "type": "object", "properties": {"x": {"anyOf": [{"type": "string"}, {"type": "null"}]}}}}})];
/// assert!(check_tool_schemas(&ok).is_ok());
/// // 5,000 branches under one parameter
/// let wide: Vec<_> = (0..5000).map(|i| json!({"const": i})).collect();
/// let bad = [json!({"type": "function", "function": {"name": "f", "parameters": {
///     "type": "object", "properties": {"x": {"anyOf": wide}}}}})];
/// assert!(matches!(check_tool_schemas(&bad), Err(ToolCallError::SchemaTooComplex { .. })));
/// ```
pub fn check_tool_schemas(tools: &[Value]) -> Result<(), ToolCallError> {
    let mut total = 0usize;
    for (name, params) in functions(tools) {
        let props = params.get("properties").and_then(Value::as_object);
        for (key, schema) in props.into_iter().flatten() {
            let (_, visited) = parse::walk_types(&params, schema);
            total = total.saturating_add(visited);
            if visited > MAX_SCHEMA_WALK_NODES || total > MAX_TOOL_SCHEMA_NODES {
                return Err(ToolCallError::SchemaTooComplex {
                    tool: name,
                    parameter: key.clone(),
                });
            }
        }
    }
    Ok(())
}
pub use stream::{CutCalls, StreamEvent, ToolCallStream};

/// The tool-call markup a chat template teaches its model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ToolCallFormat {
    /// Qwen3-Coder, Qwen3.5 (and Nemotron 3, Step 3.5, which took their template):
    /// `<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n</function>\n</tool_call>`,
    /// each value as plain text, typed afterwards by the tool's schema.
    QwenXml,
    /// Hermes-style JSON (Qwen2.5, Qwen3, QwQ, Hermes 2/3, Granite 4, MiMo):
    /// `<tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call>`.
    HermesJson,
}

impl ToolCallFormat {
    /// The format a chat template's source asks for, read from the markup it writes (its
    /// instructions to the model and its rendering of past calls); `None` when it writes
    /// neither (Llama 3.x's bare JSON, Mistral's `[TOOL_CALLS]`, GLM's `<arg_key>`, …).
    ///
    /// ```
    /// use mtp_chat::toolcall::ToolCallFormat;
    /// let qwen35 = "{{- '<tool_call>\\n<function=' + tc.name + '>\\n' }}\
    ///               {{- '<parameter=' + k + '>\\n' }}";
    /// assert_eq!(ToolCallFormat::from_template(qwen35), Some(ToolCallFormat::QwenXml));
    /// let qwen25 = "{{- '\\n<tool_call>\\n{\"name\": \"' }}{{- tool_call.name }}";
    /// assert_eq!(ToolCallFormat::from_template(qwen25), Some(ToolCallFormat::HermesJson));
    /// assert_eq!(ToolCallFormat::from_template("{{ messages }}"), None);
    /// ```
    pub fn from_template(source: &str) -> Option<ToolCallFormat> {
        // `<tool_call>` exactly: namespaced wrappers (`<seed:tool_call>`) belong to other
        // parsers, and a prefix (`]<]minimax[>[<tool_call>`) is another format around it
        let wrapped = find_all(source, "<tool_call>").any(|at| !namespaced(source, at));
        if !wrapped {
            return None;
        }
        if source.contains("<function=") && source.contains("<parameter=") {
            return Some(ToolCallFormat::QwenXml);
        }
        hermes_markup(source).then_some(ToolCallFormat::HermesJson)
    }
}

/// Every byte offset of `needle` in `hay`.
fn find_all<'a>(hay: &'a str, needle: &'a str) -> impl Iterator<Item = usize> + 'a {
    hay.match_indices(needle).map(|(at, _)| at)
}

/// True when the `<tool_call>` at `at` is glued to a namespace or sentinel that precedes it
/// (`]<]minimax[>[<tool_call>`): a different format that happens to contain the tag.
fn namespaced(source: &str, at: usize) -> bool {
    source[..at].ends_with(['[', ']', ':'])
}

/// True when some `<tool_call>` of the template is followed, before its `</tool_call>`, by a
/// JSON object with a `"name"` key, however the template spells the gap: a real newline,
/// an escaped `\n` inside a Jinja string, a Jinja block in between, or nothing at all.
fn hermes_markup(source: &str) -> bool {
    const WINDOW: usize = 400;
    find_all(source, "<tool_call>").any(|at| {
        if namespaced(source, at) {
            return false;
        }
        let rest = &source[at + "<tool_call>".len()..];
        let mut end = rest.len().min(WINDOW);
        while !rest.is_char_boundary(end) {
            end -= 1;
        }
        let mut window = &rest[..end];
        for stop in ["</tool_call>", "<tool_call>"] {
            if let Some(p) = window.find(stop) {
                window = &window[..p];
            }
        }
        let Some(brace) = window.find('{') else {
            return false;
        };
        let body = &window[brace..];
        (body.contains("\"name\"") || body.contains("\\\"name\\\""))
            && !body.contains("<arg_key>")
            && !body.contains("<function=")
    })
}

/// One tool call, as OpenAI's `message.tool_calls[i]` carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// `call_` and 24 letters and digits, as OpenAI and vLLM write them.
    pub id: String,
    /// The function's name, as the model wrote it.
    pub name: String,
    /// The arguments: a JSON object, as text (Python's `json.dumps` spacing, as vLLM sends).
    pub arguments: String,
}

impl ToolCall {
    /// The call as an entry of OpenAI's `message.tool_calls`.
    pub fn to_openai(&self) -> Value {
        json!({
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        })
    }
}

/// A whole reply read for tool calls.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParsedReply {
    /// The text that is not a call (empty when there is none). Whitespace that separates
    /// text from a call is not content, nor is whitespace alone between or after calls; text
    /// with no call in it is content as it is.
    pub content: String,
    /// The calls, in the order written.
    pub calls: Vec<ToolCall>,
    /// What was repaired or kept as text, for logs: a malformed call returned as content, an
    /// unknown function or parameter, a value that did not fit its declared type.
    pub warnings: Vec<String>,
}
/// Tool-call ids: `call_` and 24 letters and digits, from a counter mixed by SplitMix64, so a
/// seed gives the same ids every time (tests, goldens) and [`CallIds::random`] gives ids that
/// do not repeat across requests.
#[derive(Debug, Clone)]
pub struct CallIds {
    state: u64,
}

impl CallIds {
    /// Ids that depend only on `seed`.
    ///
    /// ```
    /// use mtp_chat::toolcall::CallIds;
    /// let (mut a, mut b) = (CallIds::seeded(7), CallIds::seeded(7));
    /// let id = a.next_id();
    /// assert_eq!(id, b.next_id());
    /// assert_eq!(id.len(), "call_".len() + 24);
    /// assert_ne!(id, a.next_id());
    /// ```
    pub fn seeded(seed: u64) -> Self {
        CallIds { state: seed }
    }

    /// Ids seeded from the process's random hash keys and the clock.
    pub fn random() -> Self {
        let mut h = RandomState::new().build_hasher();
        if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
            h.write_u128(t.as_nanos());
        }
        CallIds::seeded(h.finish())
    }

    fn next_u64(&mut self) -> u64 {
        // SplitMix64 (Steele, Lea and Flood 2014): a counter through a bijective mixer
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// The next id.
    pub fn next_id(&mut self) -> String {
        const ALNUM: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
        let mut id = String::from("call_");
        for _ in 0..24 {
            id.push(ALNUM[(self.next_u64() % ALNUM.len() as u64) as usize] as char);
        }
        id
    }
}
