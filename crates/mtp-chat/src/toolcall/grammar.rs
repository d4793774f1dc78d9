//! Forced tool calls (`tool_choice: "required"` or a named function) as an llguidance Lark
//! grammar: the reply is a call (or several) in the template's own markup, each call's
//! arguments valid against its tool's `parameters` schema.
//!
//! The markup is written exactly as the templates render past calls, so the model is held to
//! the bytes it was trained on: Qwen3.5 / Qwen3-Coder write
//! `<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n</function>\n</tool_call>`,
//! Qwen2.5 / Qwen3 write `<tool_call>\n{"name": "NAME", "arguments": {...}}\n</tool_call>` with
//! `tojson`'s spacing; parallel calls are joined by a newline.

use serde_json::{json, Value};

use super::{functions, resolve, schema_types, type_alias, ToolCallFormat};

/// Which calls a request forces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Forced {
    /// `tool_choice: "required"`: any of the tools.
    Required,
    /// `tool_choice: {"type": "function", "function": {"name": ...}}`: this one.
    Named(String),
}

/// Why a forced call cannot be written as a grammar.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolCallError {
    /// `tool_choice` forces a call, but the request has no function tools.
    #[error("tool_choice forces a tool call, but the request has no function tools; send `tools` or use tool_choice \"auto\"")]
    NoTools,
    /// `tool_choice` names a function the request does not define.
    #[error("tool_choice names the function `{0}`, which is not among the request's tools")]
    UnknownTool(String),
    /// A parameter's schema nests `anyOf` / `oneOf` / `allOf` / `$ref` past what is read (see
    /// [`super::check_tool_schemas`]).
    #[error("the schema of parameter `{parameter}` of tool `{tool}` is too complex to read: its anyOf/oneOf/allOf/$ref nesting reaches more than {} schema nodes (or the request's tools more than {} in all); simplify it", super::MAX_SCHEMA_WALK_NODES, super::MAX_TOOL_SCHEMA_NODES)]
    SchemaTooComplex {
        /// The tool.
        tool: String,
        /// Its parameter.
        parameter: String,
    },
    /// The grammar of the forced call grows past the constraint limit.
    #[error("the tools' schemas make a call grammar of more than {} bytes (each parameter's schema is embedded with the definitions it refers to); send fewer or smaller tools", mtp_contract::MAX_CONSTRAINT_BYTES)]
    TooLarge,
    /// A function or parameter name the format cannot carry.
    #[error("the name `{0}` cannot be written as <function=...> or <parameter=...> markup (no `<`, `>`, line breaks or surrounding blanks, at most 256 bytes); rename it")]
    Unwritable(String),
}

/// The Lark grammar (llguidance's dialect, `start` first) that makes the whole reply one
/// tool call, or with `parallel` one or more separated by a newline, in `format`'s markup,
/// chosen among `tools` (OpenAI's `tools`) by `choice`.
///
/// Arguments are constrained by each tool's `parameters` schema: for
/// [`ToolCallFormat::HermesJson`] the schema is embedded whole (`%json {...}`, with
/// `tojson`'s `", "` and `": "`); for [`ToolCallFormat::QwenXml`] each property is a
/// `<parameter=KEY>` item, in the schema's property order, required ones required and the
/// others optional, where a value whose schema allows a string is plain text (an enum or
/// `const` of strings is its literal choices) and any other value is JSON valid against the
/// property's schema, as [`super::parse`] reads it back. Plain-text values may not contain
/// the markup that ends a value (`</parameter>`, `<parameter=`, `</function>`,
/// `</tool_call>`); JSON strings are not so restricted, so a JSON value holding that markup
/// would be cut short when read (a model has no reason to write it).
///
/// The grammar covers the reply proper: where the template opens the reply inside a
/// reasoning block (`<think>`), the caller lets the reasoning run and applies the grammar
/// after `</think>`, or puts the block in front of it.
///
/// ```
/// use mtp_chat::toolcall::{call_grammar, Forced, ToolCallFormat};
/// use serde_json::json;
///
/// let tools = [json!({"type": "function", "function": {"name": "get_weather",
///     "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
///                    "required": ["city"]}}})];
/// let g = call_grammar(ToolCallFormat::QwenXml, &tools, Forced::Required, false).unwrap();
/// assert!(g.starts_with("start: call\n"));
/// assert!(g.contains(r#""<tool_call>\n<function=get_weather>\n""#));
/// ```
pub fn call_grammar(
    format: ToolCallFormat,
    tools: &[Value],
    choice: Forced,
    parallel: bool,
) -> Result<String, ToolCallError> {
    super::check_tool_schemas(tools)?;
    let fns = functions(tools);
    let chosen: Vec<&(String, Value)> = match &choice {
        Forced::Required => fns.iter().collect(),
        Forced::Named(n) => fns.iter().filter(|(name, _)| name == n).take(1).collect(),
    };
    if chosen.is_empty() {
        return Err(match choice {
            Forced::Required => ToolCallError::NoTools,
            Forced::Named(n) => ToolCallError::UnknownTool(n),
        });
    }
    let mut g = String::from(if parallel {
        "start: call (\"\\n\" call)*\n"
    } else {
        "start: call\n"
    });
    let alternatives: Vec<String> = (0..chosen.len()).map(|i| format!("c{i}")).collect();
    g.push_str(&format!("call: {}\n", alternatives.join(" | ")));
    for (i, (name, params)) in chosen.iter().enumerate() {
        match format {
            ToolCallFormat::HermesJson => {
                let head = format!(
                    "<tool_call>\n{{\"name\": {}, \"arguments\": ",
                    serde_json::to_string(name).unwrap_or_default()
                );
                g.push_str(&format!(
                    "c{i}: {} %json {} {}\n",
                    lark_str(&head),
                    json_text(&arguments_schema(params)),
                    lark_str("}\n</tool_call>")
                ));
            }
            ToolCallFormat::QwenXml => xml_call(&mut g, i, name, params)?,
        }
        if g.len() > mtp_contract::MAX_CONSTRAINT_BYTES {
            return Err(ToolCallError::TooLarge);
        }
    }
    if format == ToolCallFormat::QwenXml {
        // a plain-text value: anything without the markup that would end it early when read
        // back, then its closing line
        g.push_str("XML_VALUE: XML_TEXT \"\\n</parameter>\\n\"\n");
        g.push_str(
            "XML_TEXT: /(?s:.*)/ & ~/(?s:.*)(<\\/parameter>|<parameter=|<\\/function>|<\\/tool_call>)(?s:.*)/\n",
        );
    }
    Ok(g)
}

/// The rules of call `c{i}` in the XML format.
fn xml_call(g: &mut String, i: usize, name: &str, params: &Value) -> Result<(), ToolCallError> {
    writable(name)?;
    let required: Vec<&str> = params
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let props = params.get("properties").and_then(Value::as_object);
    let mut items = Vec::new();
    let mut item = |g: &mut String, key: &str, value: String| -> Result<(), ToolCallError> {
        writable(key)?;
        let rule = format!("c{i}_{}", items.len());
        let open = lark_str(&format!("<parameter={key}>\n"));
        g.push_str(&format!("{rule}: {open} {value}\n"));
        items.push(if required.contains(&key) {
            rule
        } else {
            format!("{rule}?")
        });
        Ok(())
    };
    for (key, schema) in props.into_iter().flatten() {
        item(g, key, xml_value(params, schema))?;
        if g.len() > mtp_contract::MAX_CONSTRAINT_BYTES {
            return Err(ToolCallError::TooLarge);
        }
    }
    // required yet undescribed: anything the schema allows, and text is
    for key in &required {
        if !props.is_some_and(|p| p.contains_key(*key)) {
            item(g, key, "XML_VALUE".into())?;
        }
    }
    let head = lark_str(&format!("<tool_call>\n<function={name}>\n"));
    let tail = lark_str("</function>\n</tool_call>");
    g.push_str(&format!("c{i}: {head} {} {tail}\n", items.join(" ")));
    Ok(())
}

/// A parameter value's rule: text where the parser would keep text, JSON otherwise.
fn xml_value(root: &Value, schema: &Value) -> String {
    let close = lark_str("\n</parameter>\n");
    let types = schema_types(root, schema);
    if types == ["string"] {
        if let Some(choices) = string_choices(resolve(root, schema)) {
            return format!("({}) {close}", choices.join(" | "));
        }
    }
    if types.contains(&"string") || types.contains(&"unknown") {
        return "XML_VALUE".into();
    }
    format!("%json {} {close}", json_text(&embedded(root, schema)))
}

/// An enum or `const` of strings as Lark literals, when every one can be read back whole.
fn string_choices(schema: &Value) -> Option<Vec<String>> {
    let values: Vec<&Value> = match (schema.get("const"), schema.get("enum")) {
        (Some(c), _) => vec![c],
        (None, Some(Value::Array(e))) if !e.is_empty() => e.iter().collect(),
        _ => return None,
    };
    values
        .into_iter()
        .map(|v| {
            let s = v.as_str()?;
            let readable = !s.is_empty()
                && !["</parameter>", "<parameter=", "</function>", "</tool_call>"]
                    .iter()
                    .any(|m| s.contains(m));
            readable.then(|| lark_str(s))
        })
        .collect()
}

/// A property's schema on its own: the root's `$defs` / `definitions` carried along so its
/// `$ref`s still resolve, and the JSON spelling fixed.
fn embedded(root: &Value, schema: &Value) -> Value {
    let mut s = match schema {
        Value::Object(m) => Value::Object(m.clone()),
        _ => json!({}),
    };
    if json_text(&s).contains("\"$ref\"") {
        for defs in ["$defs", "definitions"] {
            if let (Some(d), Some(m)) = (root.get(defs), s.as_object_mut()) {
                m.entry(defs).or_insert_with(|| d.clone());
            }
        }
    }
    with_spelling(s)
}

/// A tool's `parameters` as the schema of its arguments object (an object when it says
/// nothing else, as OpenAI reads a missing schema).
fn arguments_schema(params: &Value) -> Value {
    let mut s = match params {
        Value::Object(m) => Value::Object(m.clone()),
        _ => json!({}),
    };
    if let Some(m) = s.as_object_mut() {
        if !["type", "$ref", "anyOf", "oneOf", "allOf"]
            .iter()
            .any(|k| m.contains_key(*k))
        {
            m.insert("type".into(), json!("object"));
        }
    }
    with_spelling(s)
}

/// JSON as the templates' `tojson` writes it: `", "` and `": "`, no other blanks (free
/// blanks let a small model fill its budget with them). Type names are JSON Schema's, where
/// the tool used one of the aliases the parser reads (`int`, `float`, `bool`, `dict`, …).
fn with_spelling(mut s: Value) -> Value {
    canonical_types(&mut s, 0);
    if let Some(m) = s.as_object_mut() {
        m.entry("x-guidance").or_insert_with(
            || json!({"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": false}),
        );
    }
    s
}

/// Rewrites `type` names through the parser's aliases, in every subschema (not inside
/// `enum`, `const`, `default` or `examples`, which are values).
fn canonical_types(s: &mut Value, depth: usize) {
    if depth > 64 {
        return;
    }
    let canonical = |t: &mut Value| {
        if let Value::String(name) = t {
            let c = type_alias(name);
            if c != "unknown" {
                *name = c.to_string();
            }
        }
    };
    match s {
        Value::Object(m) => {
            match m.get_mut("type") {
                Some(Value::Array(ts)) => ts.iter_mut().for_each(canonical),
                Some(t) => canonical(t),
                None => {}
            }
            for (k, v) in m.iter_mut() {
                if !["enum", "const", "default", "examples", "type"].contains(&k.as_str()) {
                    canonical_types(v, depth + 1);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| canonical_types(v, depth + 1)),
        _ => {}
    }
}

fn json_text(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| "{}".into())
}

/// A Lark string literal: llguidance reads them as JSON strings, except that DEL must be
/// escaped too.
fn lark_str(s: &str) -> String {
    serde_json::to_string(s)
        .unwrap_or_default()
        .replace('\u{7f}', "\\u007f")
}

/// A name the XML markup can carry and the parser reads back unchanged.
fn writable(name: &str) -> Result<(), ToolCallError> {
    let ok = !name.is_empty()
        && name.len() <= 256
        && name.trim() == name
        && !name.contains(['<', '>', '\n']);
    if ok {
        Ok(())
    } else {
        Err(ToolCallError::Unwritable(name.to_string()))
    }
}
