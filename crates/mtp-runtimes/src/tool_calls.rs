//! Tool calls a server parsed itself (llama-server `--jinja`, vLLM `--tool-call-parser`,
//! LM Studio, Ollama), read from OpenAI's `choices[0].message.tool_calls` (a whole answer) or
//! gathered from `choices[0].delta.tool_calls` pieces (a stream).
//!
//! A streamed call is named by its `index`: its first piece carries `id`, `type` and
//! `function.name`, later pieces carry `function.arguments` fragments, which joined are the
//! call's arguments (OpenAI's `chat.completion.chunk`; llama-server's
//! `common_chat_msg_diff_to_json_oaicompat` and vLLM's `DeltaToolCall` write the same shape).
//! The calls are numbered 0, 1, … in the order they first appear, whatever indexes the server
//! uses, so a server's index never sizes anything here.
//!
//! What is held is bounded: at most `max_tool_calls` calls (an option, see
//! [`crate::HttpOptions`]), and their text counts toward the reply's `max_body_bytes` (the
//! caller adds [`ToolCalls::bytes`]). A piece that cannot be placed (no index, a first piece
//! without a name, arguments that are not text) is an error naming the field.

use mtp_contract::{FunctionCall, ToolCall, ToolCallDelta};
use mtp_openai::{self as oa, Field};
use serde_json::Value;

/// A `tool_calls` list as an answer holds it: each entry kept as sent when it is not a call.
pub(crate) type WireCalls = Field<Vec<Field<oa::ToolCall>>>;

/// Default of `max_tool_calls`: far above what a model writes in one reply.
pub const DEFAULT_MAX_TOOL_CALLS: usize = 128;

/// How many dropped calls a warning names.
const NAMED_DROPS: usize = 8;

/// One call as gathered so far.
#[derive(Debug, Clone)]
struct Call {
    id: Option<String>,
    kind: String,
    name: String,
    arguments: String,
}

/// What became of a server index.
#[derive(Debug, Clone, Copy)]
enum Slot {
    /// Kept as call `n` of the reply.
    Kept(usize),
    /// Dropped under `parallel_tool_calls: false`.
    Dropped,
}

/// The tool calls of one reply.
#[derive(Debug, Clone)]
pub(crate) struct ToolCalls {
    cap: usize,
    /// `parallel_tool_calls: false`: keep the first call only.
    single: bool,
    calls: Vec<Call>,
    /// Server index → what became of it (at most `cap` entries).
    seen: Vec<(u64, Slot)>,
    dropped: usize,
    dropped_names: Vec<String>,
    bytes: usize,
}

impl Default for ToolCalls {
    fn default() -> Self {
        ToolCalls::new(DEFAULT_MAX_TOOL_CALLS, false)
    }
}

impl ToolCalls {
    /// At most `cap` calls; `single` keeps only the first (`parallel_tool_calls: false`, which
    /// not every server honours: the calls it sends beyond the first are dropped here, and the
    /// final warnings say so).
    pub(crate) fn new(cap: usize, single: bool) -> Self {
        ToolCalls {
            cap: cap.max(1),
            single,
            calls: Vec::new(),
            seen: Vec::new(),
            dropped: 0,
            dropped_names: Vec::new(),
            bytes: 0,
        }
    }

    /// Bytes of names, ids and arguments held.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Reads `choices[0].message.tool_calls` of a whole answer. Each entry is one call;
    /// `function.arguments` is kept as the server's string, an object is written as JSON
    /// text, `null` or none is empty. Returns each kept call as one piece, for a caller that
    /// streams them.
    pub(crate) fn read_message(&mut self, calls: &WireCalls) -> Result<Vec<ToolCallDelta>, String> {
        const AT: &str = "choices[0].message.tool_calls";
        let list = list_of(calls, AT)?;
        let mut out = Vec::new();
        for (i, call) in list.iter().enumerate() {
            let at = format!("{AT}[{i}]");
            let call = object(call, &at, "a tool call object")?;
            let function = match &call.function {
                Some(Field::Ok(f)) => f,
                _ => return Err(format!("`{at}.function` is missing or not an object")),
            };
            let name = name_of(function, &at)?.ok_or_else(|| {
                format!("`{at}.function.name` is missing: a tool call names its function")
            })?;
            let arguments = match &function.arguments {
                None => String::new(),
                Some(Value::String(s)) => s.clone(),
                Some(v @ Value::Object(_)) => v.to_string(),
                Some(v) => {
                    return Err(format!(
                        "`{at}.function.arguments` is {}: arguments are a JSON object, or a \
                         string holding one",
                        kind_of(v)
                    ))
                }
            };
            // a whole answer's calls are its entries in order (an `index` there, as Ollama
            // writes it, says the same)
            let piece = self.open(i as u64, call, name, arguments, &at)?;
            out.extend(piece);
        }
        Ok(out)
    }

    /// Reads `choices[0].delta.tool_calls` of one stream chunk: the pieces to pass on,
    /// numbered by the reply's call order.
    pub(crate) fn read_delta(&mut self, calls: &WireCalls) -> Result<Vec<ToolCallDelta>, String> {
        const AT: &str = "choices[0].delta.tool_calls";
        let list = list_of(calls, AT)?;
        let mut out = Vec::new();
        for (k, piece) in list.iter().enumerate() {
            let at = format!("{AT}[{k}]");
            let piece = object(piece, &at, "a tool call piece")?;
            let index = match &piece.index {
                None => {
                    return Err(format!(
                        "`{at}.index` is missing: every streamed tool-call piece names the call \
                         it belongs to"
                    ))
                }
                Some(Field::Ok(i)) => *i,
                Some(Field::Invalid { value, .. }) => {
                    return Err(format!(
                        "`{at}.index` is {value}, not a non-negative integer"
                    ))
                }
            };
            let function = match &piece.function {
                None => None,
                Some(Field::Ok(f)) => Some(f),
                Some(Field::Invalid { value, .. }) => {
                    return Err(format!(
                        "`{at}.function` is {}, not an object",
                        kind_of(value)
                    ))
                }
            };
            let fragment = match function.and_then(|f| f.arguments.as_ref()) {
                None => String::new(),
                Some(Value::String(s)) => s.clone(),
                Some(v) => {
                    return Err(format!(
                        "`{at}.function.arguments` is {}: a streamed call's arguments come as \
                         text fragments",
                        kind_of(v)
                    ))
                }
            };
            match self.slot(index) {
                Some(Slot::Kept(n)) => {
                    // later pieces: argument text only (a repeated or empty name, or an id,
                    // on them changes nothing)
                    if !fragment.is_empty() {
                        self.bytes += fragment.len();
                        self.calls[n].arguments.push_str(&fragment);
                        out.push(ToolCallDelta {
                            index: n,
                            id: None,
                            name: None,
                            arguments: fragment,
                        });
                    }
                }
                Some(Slot::Dropped) => {}
                None => {
                    let name = match function {
                        Some(f) => name_of(f, &at)?,
                        None => None,
                    }
                    .ok_or_else(|| {
                        format!(
                            "`{at}.function.name` is missing on the first piece of call {index}: \
                             a streamed call's first piece names its function"
                        )
                    })?;
                    out.extend(self.open(index, piece, name, fragment, &at)?);
                }
            }
        }
        Ok(out)
    }

    /// [`ToolCalls::read_message`] of a `tool_calls` value as JSON (`null` is none).
    #[cfg(test)]
    pub(crate) fn absorb_message(&mut self, calls: &Value) -> Result<Vec<ToolCallDelta>, String> {
        if calls.is_null() {
            return Ok(Vec::new());
        }
        self.read_message(&Field::from_value(calls.clone()))
    }

    /// [`ToolCalls::read_delta`] of a `tool_calls` value as JSON (`null` is none).
    #[cfg(test)]
    pub(crate) fn absorb_delta(&mut self, calls: &Value) -> Result<Vec<ToolCallDelta>, String> {
        if calls.is_null() {
            return Ok(Vec::new());
        }
        self.read_delta(&Field::from_value(calls.clone()))
    }

    /// Starts the call the server numbers `index`: kept (its first piece returned), or
    /// dropped under `parallel_tool_calls: false`.
    fn open(
        &mut self,
        index: u64,
        call: &oa::ToolCall,
        name: String,
        arguments: String,
        at: &str,
    ) -> Result<Option<ToolCallDelta>, String> {
        if self.seen.len() >= self.cap {
            return Err(format!(
                "the reply has more than {} tool calls (at `{at}`); raise the provider option \
                 `max_tool_calls` (a `ProviderOptions` extra key) if the server really sends \
                 that many",
                self.cap
            ));
        }
        if self.single && !self.calls.is_empty() {
            self.seen.push((index, Slot::Dropped));
            self.dropped += 1;
            if self.dropped_names.len() < NAMED_DROPS {
                self.dropped_names.push(name);
            }
            return Ok(None);
        }
        let id = match &call.id {
            Some(Field::Ok(s)) if !s.is_empty() => Some(s.clone()),
            None | Some(Field::Ok(_)) => None,
            Some(Field::Invalid { value, .. }) => {
                return Err(format!("`{at}.id` is {}, not a string", kind_of(value)))
            }
        };
        let kind = match &call.kind {
            Some(Field::Ok(s)) if !s.is_empty() => s.clone(),
            _ => "function".to_string(),
        };
        let n = self.calls.len();
        self.bytes += name.len() + id.as_ref().map_or(0, String::len) + arguments.len();
        self.seen.push((index, Slot::Kept(n)));
        self.calls.push(Call {
            id: id.clone(),
            kind,
            name: name.clone(),
            arguments: arguments.clone(),
        });
        Ok(Some(ToolCallDelta {
            index: n,
            id,
            name: Some(name),
            arguments,
        }))
    }

    fn slot(&self, index: u64) -> Option<Slot> {
        self.seen
            .iter()
            .find(|(i, _)| *i == index)
            .map(|(_, slot)| *slot)
    }

    /// The calls, OpenAI's shape: `function.arguments` the JSON text as a string.
    pub(crate) fn calls(&self) -> Vec<ToolCall> {
        self.calls
            .iter()
            .map(|c| ToolCall {
                id: c.id.clone(),
                kind: c.kind.clone(),
                function: FunctionCall {
                    name: c.name.clone(),
                    arguments: Value::String(c.arguments.clone()),
                },
            })
            .collect()
    }

    /// What the caller should know: calls dropped under `parallel_tool_calls: false`, and
    /// (for a reply that finished) arguments that are not a JSON object.
    pub(crate) fn warnings(&self, finished: bool) -> Vec<String> {
        let mut w = Vec::new();
        if self.dropped > 0 {
            let mut names = self
                .dropped_names
                .iter()
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(", ");
            if self.dropped > self.dropped_names.len() {
                names.push_str(", …");
            }
            w.push(format!(
                "parallel_tool_calls is false, and the server answered with {} more tool \
                 call(s) after the first ({names}); only the first is kept",
                self.dropped
            ));
        }
        if finished {
            for (i, c) in self.calls.iter().enumerate() {
                let problem = match serde_json::from_str::<Value>(&c.arguments) {
                    Ok(Value::Object(_)) => continue,
                    Ok(v) => format!("are {}, not a JSON object", kind_of(&v)),
                    Err(e) => format!("are not JSON ({e})"),
                };
                w.push(format!(
                    "the server's tool call {i} (`{}`) has arguments that {problem}: {:?}",
                    c.name,
                    c.arguments.chars().take(80).collect::<String>()
                ));
            }
        }
        w
    }
}

/// The entries of a `tool_calls` value; an error for what is not a list.
fn list_of<'a>(v: &'a WireCalls, at: &str) -> Result<&'a [Field<oa::ToolCall>], String> {
    match v {
        Field::Ok(a) => Ok(a),
        Field::Invalid { value, .. } => Err(format!("`{at}` is {}, not a list", kind_of(value))),
    }
}

/// An entry of the list, when it is an object.
fn object<'a>(
    entry: &'a Field<oa::ToolCall>,
    at: &str,
    what: &str,
) -> Result<&'a oa::ToolCall, String> {
    match entry {
        Field::Ok(c) => Ok(c),
        Field::Invalid { value, .. } => Err(format!("`{at}` is {}, not {what}", kind_of(value))),
    }
}

/// `function.name`: `None` when absent, null or empty; an error when not a string.
fn name_of(function: &oa::FunctionCall, at: &str) -> Result<Option<String>, String> {
    match &function.name {
        None => Ok(None),
        Some(Field::Ok(s)) if s.is_empty() => Ok(None),
        Some(Field::Ok(s)) => Ok(Some(s.clone())),
        Some(Field::Invalid { value, .. }) => Err(format!(
            "`{at}.function.name` is {}, not a string",
            kind_of(value)
        )),
    }
}

/// A JSON value's kind, for messages (`a number`, `an object`, …).
fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn args(calls: &[ToolCall]) -> Vec<(&str, &str)> {
        calls
            .iter()
            .map(|c| {
                (
                    c.function.name.as_str(),
                    c.function.arguments.as_str().unwrap_or("<not a string>"),
                )
            })
            .collect()
    }

    /// vLLM's pieces (a published capture): the first with id, type and name and no
    /// arguments, then fragments; llama-server's first piece carries `arguments: ""`.
    #[test]
    fn pieces_join_per_call_in_first_appearance_order() {
        let mut t = ToolCalls::default();
        let pieces = [
            json!([{"id": "chatcmpl-tool-a", "type": "function", "index": 0,
                    "function": {"name": "run_command"}}]),
            json!([{"index": 0, "function": {"arguments": "{\"command\": \""}}]),
            json!([{"index": 1, "id": "b", "type": "function",
                    "function": {"name": "get_time", "arguments": ""}}]),
            json!([{"index": 0, "function": {"arguments": "ls\"}"}},
                   {"index": 1, "function": {"name": "", "arguments": "{}"}}]),
            json!(null),
        ];
        let mut out = Vec::new();
        for p in &pieces {
            out.extend(t.absorb_delta(p).unwrap());
        }
        assert_eq!(
            args(&t.calls()),
            [("run_command", "{\"command\": \"ls\"}"), ("get_time", "{}")]
        );
        assert_eq!(t.calls()[0].id.as_deref(), Some("chatcmpl-tool-a"));
        // first pieces carry id and name; joined fragments are the arguments
        assert_eq!(out[0].name.as_deref(), Some("run_command"));
        assert_eq!(out[2].index, 1);
        assert_eq!(out[2].id.as_deref(), Some("b"));
        let joined: String = out
            .iter()
            .filter(|d| d.index == 0)
            .map(|d| d.arguments.as_str())
            .collect();
        assert_eq!(joined, "{\"command\": \"ls\"}");
        assert!(t.warnings(true).is_empty());
        // a server's index is a name, not a position: 7 then 3 are calls 0 and 1
        let mut t = ToolCalls::default();
        t.absorb_delta(&json!([{"index": 7, "function": {"name": "a", "arguments": "{}"}}]))
            .unwrap();
        let d = t
            .absorb_delta(&json!([{"index": 3, "function": {"name": "b", "arguments": "{}"}}]))
            .unwrap();
        assert_eq!(d[0].index, 1);
    }

    #[test]
    fn whole_messages_keep_the_servers_string_and_write_objects_as_json() {
        let mut t = ToolCalls::default();
        let d = t
            .absorb_message(&json!([
                {"id": "c1", "type": "function",
                 "function": {"name": "f", "arguments": "{\"a\": 1}"}},
                {"function": {"name": "g", "arguments": {"b": [2]}}},
                {"function": {"name": "h"}}
            ]))
            .unwrap();
        assert_eq!(d.len(), 3);
        assert_eq!(
            args(&t.calls()),
            [("f", "{\"a\": 1}"), ("g", "{\"b\":[2]}"), ("h", "")]
        );
        assert_eq!(t.calls()[1].kind, "function");
        // the empty arguments are said to be no JSON object
        let w = t.warnings(true);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("tool call 2 (`h`)"), "{w:?}");
        assert!(t.absorb_message(&json!(null)).unwrap().is_empty());
    }

    /// Each malformed shape is an error naming the field at fault.
    #[test]
    fn malformed_pieces_name_the_field() {
        let cases = [
            (
                json!([{"function": {"name": "f"}}]),
                "delta.tool_calls[0].index",
            ),
            (
                json!([{"index": -1, "function": {"name": "f"}}]),
                ".index` is -1",
            ),
            (
                json!([{"index": 1.5, "function": {"name": "f"}}]),
                ".index` is 1.5",
            ),
            (json!([{"index": "0", "function": {"name": "f"}}]), ".index"),
            (
                json!([{"index": 0, "function": {"arguments": "{}"}}]),
                "function.name",
            ),
            (
                json!([{"index": 0, "function": {"name": 3}}]),
                "function.name` is a number",
            ),
            (
                json!([{"index": 0, "function": {"name": "f", "arguments": {"a": 1}}}]),
                "function.arguments` is an object",
            ),
            (
                json!([{"index": 0, "function": "f"}]),
                ".function` is a string",
            ),
            (
                json!([{"index": 0, "id": 5, "function": {"name": "f"}}]),
                ".id` is a number",
            ),
            (json!(["f"]), "tool_calls[0]` is a string"),
            (json!({"index": 0}), "delta.tool_calls` is an object"),
        ];
        for (v, want) in cases {
            let e = ToolCalls::default().absorb_delta(&v).unwrap_err();
            assert!(e.contains(want), "{v}: {e}");
        }
        let mut t = ToolCalls::default();
        t.absorb_delta(&json!([{"index": 0, "function": {"name": "f"}}]))
            .unwrap();
        let e = t
            .absorb_delta(&json!([{"index": 0, "function": {"arguments": 7}}]))
            .unwrap_err();
        assert!(e.contains("arguments` is a number"), "{e}");
        let whole = [
            (
                json!([{"function": {"arguments": "{}"}}]),
                "message.tool_calls[0].function.name",
            ),
            (
                json!([{"name": "f"}]),
                "message.tool_calls[0].function` is missing",
            ),
            (
                json!([{"function": {"name": "f", "arguments": 3}}]),
                "arguments` is a number",
            ),
            (json!("calls"), "message.tool_calls` is a string"),
        ];
        for (v, want) in whole {
            let e = ToolCalls::default().absorb_message(&v).unwrap_err();
            assert!(e.contains(want), "{v}: {e}");
        }
    }

    #[test]
    fn calls_are_bounded_and_single_keeps_the_first() {
        let mut t = ToolCalls::new(2, false);
        for i in 0..2u64 {
            t.absorb_delta(&json!([{"index": i, "function": {"name": "f"}}]))
                .unwrap();
        }
        let e = t
            .absorb_delta(&json!([{"index": 1_000_000_000_000u64, "function": {"name": "f"}}]))
            .unwrap_err();
        assert!(
            e.contains("more than 2 tool calls") && e.contains("max_tool_calls"),
            "{e}"
        );
        // pieces of known calls still go on
        assert_eq!(
            t.absorb_delta(&json!([{"index": 1, "function": {"arguments": "{}"}}]))
                .unwrap()
                .len(),
            1
        );
        assert_eq!(t.bytes(), 4);

        let mut t = ToolCalls::new(8, true);
        let mut out = Vec::new();
        for p in [
            json!([{"index": 0, "id": "a", "function": {"name": "f", "arguments": "{"}}]),
            json!([{"index": 1, "id": "b", "function": {"name": "g", "arguments": "{}"}}]),
            json!([{"index": 0, "function": {"arguments": "}"}}]),
            json!([{"index": 1, "function": {"arguments": "more"}}]),
        ] {
            out.extend(t.absorb_delta(&p).unwrap());
        }
        assert!(out.iter().all(|d| d.index == 0), "{out:?}");
        assert_eq!(args(&t.calls()), [("f", "{}")]);
        let w = t.warnings(true);
        assert!(
            w.len() == 1 && w[0].contains("parallel_tool_calls") && w[0].contains("`g`"),
            "{w:?}"
        );
    }
}
