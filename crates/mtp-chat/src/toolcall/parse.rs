//! Reading a whole reply, and the typing of XML parameter values by the tools' schemas
//! (vLLM's `coerce_to_schema_type`).

use serde_json::{Map, Value};

use super::{CallIds, ParsedReply, StreamEvent, ToolCall, ToolCallFormat, ToolCallStream};
use crate::pyfmt::{self, JsonOptions};

/// Reads a whole reply: content and tool calls, with random ids. A malformed call is kept as
/// content, with a warning; nothing here fails.
///
/// The rules are vLLM's: for [`ToolCallFormat::QwenXml`] (its `qwen3_coder` parser) each
/// `<function=NAME>` (inside `<tool_call>` or bare) is a call, each `<parameter=KEY>` value
/// loses one leading and one trailing newline and is typed by the tool's schema for `KEY`
/// (vLLM's `coerce_to_schema_type`: integers, numbers, booleans, `null`, objects and arrays
/// where the schema declares them, the text itself where it does not fit); for
/// [`ToolCallFormat::HermesJson`] each `<tool_call>` holds a JSON object whose `arguments`
/// (or `parameters`) become the arguments. Text outside the calls is the content, without
/// the whitespace that separates it from them (vLLM keeps the text before the first call
/// and drops the rest; text after a call is kept here).
///
/// Where this is stricter than vLLM: markup that never opens a call (a `<tool_call>`
/// holding no `<function=NAME>`, a name that is missing or runs on, Hermes JSON that does not
/// parse or has no `name`, a `<tool_call>` left open in Hermes) stays text, with a warning.
/// Once `<function=NAME>` is read the call stands, so a reply cut short inside it still
/// yields the call with the parameters it has, as vLLM reads it (a stream has already sent
/// the call's first pieces by then).
pub fn parse(format: ToolCallFormat, text: &str, tools: &[Value]) -> ParsedReply {
    parse_with_ids(format, text, tools, CallIds::random())
}

/// [`parse`] with ids from `ids` (a seeded [`CallIds`] makes them reproducible).
pub fn parse_with_ids(
    format: ToolCallFormat,
    text: &str,
    tools: &[Value],
    ids: CallIds,
) -> ParsedReply {
    let mut s = ToolCallStream::with_ids(format, tools, ids);
    let mut events = s.push(text);
    events.extend(s.finish());
    let mut reply = ParsedReply::default();
    for e in events {
        match e {
            StreamEvent::Content(t) => reply.content.push_str(&t),
            StreamEvent::ToolCallDelta {
                index,
                id,
                name,
                arguments,
            } => {
                if index == reply.calls.len() {
                    reply.calls.push(ToolCall {
                        id: id.unwrap_or_default(),
                        name: name.unwrap_or_default(),
                        arguments,
                    });
                } else if let Some(c) = reply.calls.get_mut(index) {
                    c.arguments.push_str(&arguments);
                }
            }
        }
    }
    reply.warnings = s.take_warnings();
    reply
}

/// A request's function tools, by name: OpenAI's `{"type": "function", "function": {...}}`
/// or the flat `{"name", "parameters"}` of the Responses API.
pub(crate) fn functions(tools: &[Value]) -> Vec<(String, Value)> {
    tools
        .iter()
        .filter(|t| t.get("type").is_none_or(|k| k == "function"))
        .filter_map(|t| {
            let f = t.get("function").unwrap_or(t);
            let name = f.get("name")?.as_str()?.to_string();
            Some((name, f.get("parameters").cloned().unwrap_or(Value::Null)))
        })
        .collect()
}

/// `json.dumps(value, ensure_ascii=False)`: Python's spacing and float spelling, as vLLM
/// writes arguments.
pub(crate) fn py_json(v: &Value) -> String {
    pyfmt::json_dumps(
        &minijinja::Value::from(minijinja::value::Serde(v)),
        &JsonOptions::default(),
    )
    .unwrap_or_else(|_| v.to_string())
}

/// Follows a local `$ref` (`#/$defs/X`, `#/definitions/X`) against `root`, a few levels deep.
pub(crate) fn resolve<'a>(root: &'a Value, mut schema: &'a Value) -> &'a Value {
    for _ in 0..8 {
        let Some(r) = schema.get("$ref").and_then(Value::as_str) else {
            break;
        };
        let Some(target) = r
            .strip_prefix('#')
            .and_then(|ptr| root.pointer(ptr))
            .filter(|t| t.is_object())
        else {
            break;
        };
        schema = target;
    }
    schema
}

/// The most schema nodes one parameter's type walk visits (the walk that types a tool call's
/// parameter values by their schema): far more than any real schema's `anyOf` / `oneOf` /
/// `allOf` / `$ref` nesting holds.
pub const MAX_SCHEMA_WALK_NODES: usize = 4096;

/// The JSON types a parameter's schema allows, as vLLM's `extract_types_from_schema` reads
/// them: `type` (a name or a list), the types of `enum` values, and the union over `anyOf`,
/// `oneOf` and `allOf`; local `$ref`s are followed (vLLM does not, and keeps such values as
/// strings). A schema that says nothing is `["string"]`. Names are lower-cased and vLLM's
/// aliases (`int`, `float`, `bool`, `dict`, `list`, …) mapped to JSON Schema's.
///
/// Each schema node is visited once (a `$ref` cycle or a subschema shared by many branches
/// costs its size, not the number of paths to it), and at most [`MAX_SCHEMA_WALK_NODES`] of
/// them: past that the walk stops with the types found so far (a request whose schemas go
/// past it is refused up front by [`check_tool_schemas`](super::check_tool_schemas)).
pub(crate) fn schema_types(root: &Value, schema: &Value) -> Vec<&'static str> {
    let mut out = walk_types(root, schema).0;
    if out.is_empty() {
        out.push("string");
    }
    out
}

/// The types found, and the nodes visited (more than [`MAX_SCHEMA_WALK_NODES`] when the walk
/// was cut short).
pub(crate) fn walk_types(root: &Value, schema: &Value) -> (Vec<&'static str>, usize) {
    let mut walk = TypeWalk {
        root,
        out: Vec::new(),
        seen: std::collections::HashSet::new(),
        visited: 0,
    };
    walk.visit(schema, 0);
    (walk.out, walk.visited)
}

/// One parameter's type walk: what it found, the nodes it has seen (by address: a node of
/// the request's JSON is visited once however many paths lead to it) and its count.
struct TypeWalk<'a> {
    root: &'a Value,
    out: Vec<&'static str>,
    seen: std::collections::HashSet<*const Value>,
    visited: usize,
}

impl<'a> TypeWalk<'a> {
    fn visit(&mut self, schema: &'a Value, depth: usize) {
        if depth > 64 || self.visited > MAX_SCHEMA_WALK_NODES {
            return;
        }
        let schema = resolve(self.root, schema);
        if !self.seen.insert(schema as *const Value) {
            return;
        }
        self.visited += 1;
        let mut add = |t: &'static str| {
            if !self.out.contains(&t) {
                self.out.push(t);
            }
        };
        match schema.get("type") {
            Some(Value::String(t)) => add(type_alias(t)),
            Some(Value::Array(ts)) => ts
                .iter()
                .filter_map(Value::as_str)
                .for_each(|t| add(type_alias(t))),
            _ => {}
        }
        if let Some(Value::Array(values)) = schema.get("enum") {
            for v in values {
                add(match v {
                    Value::Null => "null",
                    Value::Bool(_) => "boolean",
                    Value::Number(n) if n.is_f64() => "number",
                    Value::Number(_) => "integer",
                    Value::String(_) => "string",
                    Value::Array(_) => "array",
                    Value::Object(_) => "object",
                });
            }
        }
        for key in ["anyOf", "oneOf", "allOf"] {
            if let Some(Value::Array(choices)) = schema.get(key) {
                for c in choices {
                    self.visit(c, depth + 1);
                }
            }
        }
    }
}

pub(crate) fn type_alias(t: &str) -> &'static str {
    match t.trim().to_lowercase().as_str() {
        "string" | "str" | "text" | "varchar" | "char" | "enum" => "string",
        "integer" | "int" | "int32" | "int64" | "uint" | "uint32" | "uint64" | "long" | "short"
        | "unsigned" => "integer",
        "number" | "float" | "float32" | "float64" | "double" => "number",
        "boolean" | "bool" => "boolean",
        "object" | "dict" => "object",
        "array" | "arr" | "list" | "sequence" => "array",
        "null" => "null",
        _ => "unknown",
    }
}

/// A parameter's text as the JSON value its schema's `types` ask for, written as JSON text,
/// by vLLM's `coerce_to_schema_type`: the first of null, integer, number, boolean, object,
/// array, string (in that order) that the schema allows and the text reads as; failing all,
/// the text as JSON if it is JSON, else the text as a string. The flag is false when no
/// declared type fitted and the value fell back.
pub(crate) fn coerce(text: &str, types: &[&str]) -> (String, bool) {
    let has = |t: &str| types.contains(&t);
    if has("null") && text.eq_ignore_ascii_case("null") {
        return ("null".into(), true);
    }
    if has("integer") {
        if let Some(i) = py_int(text) {
            return (i, true);
        }
    }
    if has("number") {
        if let Some(n) = py_float(text) {
            return (n, true);
        }
    }
    if has("boolean") {
        match text.trim().to_lowercase().as_str() {
            "true" | "1" => return ("true".into(), true),
            "false" | "0" => return ("false".into(), true),
            _ => {}
        }
    }
    if has("object") || has("array") {
        if let Ok(v) = serde_json::from_str::<Value>(text) {
            return (py_json(&v), true);
        }
    }
    let string = py_json(&Value::String(text.to_string()));
    if has("string") {
        return (string, true);
    }
    match serde_json::from_str::<Value>(text) {
        Ok(v) => (py_json(&v), false),
        Err(_) => (string, false),
    }
}

/// Python's `int(text)`: surrounding whitespace, a sign, digits with single underscores
/// between them; written back without the sign `+`, leading zeros or underscores (any
/// length: Python's integers have no bound, and neither has JSON's text).
fn py_int(text: &str) -> Option<String> {
    let t = text.trim();
    let (neg, digits) = match t.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    if digits.is_empty()
        || digits.starts_with('_')
        || digits.ends_with('_')
        || digits.contains("__")
        || !digits.bytes().all(|b| b.is_ascii_digit() || b == b'_')
    {
        return None;
    }
    let clean: String = digits.chars().filter(|c| *c != '_').collect();
    let clean = clean.trim_start_matches('0');
    Some(match (clean.is_empty(), neg) {
        (true, _) => "0".into(),
        (false, true) => format!("-{clean}"),
        (false, false) => clean.to_string(),
    })
}

/// Python's `float(text)`, finite only, written as vLLM returns it: a whole value as an
/// integer (`int(val)`, exact digits), any other by Python's `repr`.
fn py_float(text: &str) -> Option<String> {
    let t = text.trim();
    // Python takes underscores between digits; Rust's parser takes none
    let clean: String = if t.contains('_') {
        let ok = t
            .as_bytes()
            .windows(3)
            .all(|w| w[1] != b'_' || (w[0].is_ascii_digit() && w[2].is_ascii_digit()))
            && !t.starts_with('_')
            && !t.ends_with('_');
        if !ok {
            return None;
        }
        t.chars().filter(|c| *c != '_').collect()
    } else {
        t.to_string()
    };
    let f: f64 = clean.parse().ok()?;
    if !f.is_finite() {
        return None;
    }
    if f.fract() == 0.0 {
        return Some(if f == 0.0 {
            "0".into()
        } else {
            format!("{f:.0}")
        });
    }
    Some(pyfmt::float_repr(f))
}

/// The `properties` of a function's parameter schema (vLLM's `find_tool_properties`) and
/// the schema itself (for `$ref`s), or `None` when the function is not among the tools.
pub(crate) fn properties<'a>(
    tools: &'a [(String, Value)],
    name: &str,
) -> Option<(&'a Value, Option<&'a Map<String, Value>>)> {
    tools
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, p)| (p, p.get("properties").and_then(Value::as_object)))
}
