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

use super::strings::{self, Strings, Unsupported};
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
    /// A parameter's schema that a forced call in the XML format cannot honour exactly.
    #[error("parameter `{parameter}` of tool `{tool}` cannot be forced in the model's XML tool-call format: {why}")]
    Unsupported {
        /// The tool.
        tool: String,
        /// Its parameter.
        parameter: String,
        /// What is wrong with its schema.
        why: Unsupported,
    },
    /// A keyword of a tool's `parameters` (the arguments object) that the XML format, which
    /// writes the parameters one by one, cannot honour.
    #[error("the parameters schema of tool `{tool}` uses `{keyword}`, which a forced call in the model's XML tool-call format cannot honour (it writes the schema's properties one by one); describe the arguments with `properties` and `required`")]
    ArgumentsKeyword {
        /// The tool.
        tool: String,
        /// The keyword.
        keyword: String,
    },
}

/// The Lark grammar (llguidance's dialect, `start` first) that makes the whole reply one
/// tool call, or with `parallel` one or more separated by a newline, in `format`'s markup,
/// chosen among `tools` (OpenAI's `tools`) by `choice`.
///
/// Arguments are constrained by each tool's `parameters` schema: for
/// [`ToolCallFormat::HermesJson`] the schema is embedded whole (`%json {...}`, with
/// `tojson`'s `", "` and `": "`); for [`ToolCallFormat::QwenXml`] each property is a
/// `<parameter=KEY>` item, in the schema's property order, required ones required and the
/// others optional (no other property is ever written), where a value whose schema allows a
/// string is raw text constrained by every string keyword of the schema (`enum`, `const`,
/// `minLength`, `maxLength`, `pattern`, `format`; see `xml_value`) and any other value is
/// JSON valid against the property's schema, as [`super::parse`] reads it back. Raw values
/// may not contain the markup that ends a value (`</parameter>`, `<parameter=`,
/// `</function>`, `</tool_call>`); JSON strings are not so restricted, so a JSON value holding
/// that markup would be cut short when read (a model has no reason to write it). A tool with
/// `"strict": true` gets `"additionalProperties": false` on every object schema that does not
/// say.
///
/// A schema the XML format cannot honour exactly is an error, never loosened:
/// [`ToolCallError::Unsupported`] for a parameter (an unknown `format`, a `pattern` that is
/// not a regular expression of the `regex` crate's syntax or has anchors inside it, `not`,
/// `if`, a `$ref` cycle, no value possible), [`ToolCallError::ArgumentsKeyword`] for the
/// arguments object (`anyOf`, `patternProperties`, `minProperties` beyond the required, …).
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
        let strict = is_strict(tools, name);
        match format {
            ToolCallFormat::HermesJson => {
                let head = format!(
                    "<tool_call>\n{{\"name\": {}, \"arguments\": ",
                    serde_json::to_string(name).unwrap_or_default()
                );
                g.push_str(&format!(
                    "c{i}: {} %json {} {}\n",
                    lark_str(&head),
                    json_text(&arguments_schema(params, strict)),
                    lark_str("}\n</tool_call>")
                ));
            }
            ToolCallFormat::QwenXml => xml_call(&mut g, i, name, params, strict)?,
        }
        if g.len() > mtp_contract::MAX_CONSTRAINT_BYTES {
            return Err(ToolCallError::TooLarge);
        }
    }
    if format == ToolCallFormat::QwenXml {
        // a plain-text value: anything without the markup that would end it early when read
        // back, then its closing line
        g.push_str("XML_VALUE: XML_TEXT \"\\n</parameter>\\n\"\n");
        g.push_str(&format!("XML_TEXT: /(?s:.*)/ & ~/{MARKUP}/\n"));
    }
    Ok(g)
}

/// Text holding the markup that ends a value when [`super::parse`] reads it (a Lark regex).
const MARKUP: &str = "(?s:.*)(<\\/parameter>|<parameter=|<\\/function>|<\\/tool_call>)(?s:.*)";

/// Keywords of a tool's `parameters` that constrain the arguments object as a whole, which
/// the XML format (the properties written one by one, each as its own schema says) cannot
/// honour. (`additionalProperties` needs nothing: only the schema's properties are written.)
const WHOLE_OBJECT_KEYWORDS: &[&str] = &[
    "anyOf",
    "oneOf",
    "allOf",
    "not",
    "if",
    "patternProperties",
    "propertyNames",
    "dependentRequired",
    "dependentSchemas",
    "dependencies",
];

/// The rules of call `c{i}` in the XML format.
fn xml_call(
    g: &mut String,
    i: usize,
    name: &str,
    params: &Value,
    strict: bool,
) -> Result<(), ToolCallError> {
    writable(name)?;
    // parameters given as a `$ref` to a definition are that definition
    let object = resolve(params, params);
    let keyword_error = |keyword: &str| ToolCallError::ArgumentsKeyword {
        tool: name.to_string(),
        keyword: keyword.to_string(),
    };
    if let Some(k) = WHOLE_OBJECT_KEYWORDS
        .iter()
        .chain(&["$ref"])
        .find(|k| object.get(**k).is_some())
    {
        return Err(keyword_error(k));
    }
    let required: Vec<&str> = object
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let props = object.get("properties").and_then(Value::as_object);
    // the count of properties written lies between the required ones and all of them: a
    // bound that lets every such count through needs nothing
    let undescribed = required
        .iter()
        .filter(|r| !props.is_some_and(|p| p.contains_key(**r)))
        .count();
    let most = props.map_or(0, |p| p.len()) + undescribed;
    if let Some(min) = object.get("minProperties") {
        if min.as_f64().is_none_or(|m| m > required.len() as f64) {
            return Err(keyword_error("minProperties"));
        }
    }
    if let Some(max) = object.get("maxProperties") {
        if max.as_f64().is_none_or(|m| m < most as f64) {
            return Err(keyword_error("maxProperties"));
        }
    }
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
    for (j, (key, schema)) in props.into_iter().flatten().enumerate() {
        let token = format!("V{i}_{j}");
        let value = xml_value(g, &token, params, schema, strict).map_err(|why| match why {
            Unsupported::TooComplex => ToolCallError::SchemaTooComplex {
                tool: name.to_string(),
                parameter: key.clone(),
            },
            why => ToolCallError::Unsupported {
                tool: name.to_string(),
                parameter: key.clone(),
                why,
            },
        })?;
        item(g, key, value)?;
        if g.len() > mtp_contract::MAX_CONSTRAINT_BYTES {
            return Err(ToolCallError::TooLarge);
        }
    }
    // required yet undescribed: anything the schema allows, and text is (unless `strict`
    // or `additionalProperties: false` says the object has no other properties)
    for key in &required {
        if !props.is_some_and(|p| p.contains_key(*key)) {
            if strict || object.get("additionalProperties") == Some(&Value::Bool(false)) {
                return Err(ToolCallError::Unsupported {
                    tool: name.to_string(),
                    parameter: key.to_string(),
                    why: Unsupported::Unsatisfiable,
                });
            }
            item(g, key, "XML_VALUE".into())?;
        }
    }
    let head = lark_str(&format!("<tool_call>\n<function={name}>\n"));
    let tail = lark_str("</function>\n</tool_call>");
    g.push_str(&format!("c{i}: {head} {} {tail}\n", items.join(" ")));
    Ok(())
}

/// A parameter value's rule (and the token it defines as `token`), with its closing line:
/// the text [`super::parse`] reads back as a value `schema` accepts.
///
/// Where the schema allows strings, the value is raw text, read back verbatim (one newline
/// on each side is the markup's), so the text is constrained to the strings the schema
/// accepts ([`strings::strings`]: `enum`, `const`, lengths, `pattern`, `format`), less any
/// text holding the markup that ends a value, less any text the parser would read as one of
/// the schema's other types (it tries null, integer, number, boolean, then object or array
/// before string: with `["string", "null"]`, `null` is null, so the string `"null"` cannot
/// be written). Where it allows other types too, those are JSON valid against the schema
/// with strings taken out (`allOf` with a `type` of the others). A type name JSON Schema
/// does not define keeps the value free text (the parser keeps whatever is written).
fn xml_value(
    g: &mut String,
    token: &str,
    root: &Value,
    schema: &Value,
    strict: bool,
) -> Result<String, Unsupported> {
    let close = lark_str("\n</parameter>\n");
    let types = schema_types(root, schema);
    if types.contains(&"unknown") {
        return Ok("XML_VALUE".into());
    }
    let others: Vec<&str> = types.iter().copied().filter(|t| *t != "string").collect();
    let mut alternatives = Vec::new();
    if types.contains(&"string") {
        let mut text = strings::strings(root, schema)?;
        for t in &others {
            text = text.without(read_as(t));
            if let Some(start) = json_start(t) {
                text = text.without(&format!("(?s:(?:{start})\\n.*)"));
            }
        }
        match text {
            Strings::Never => {}
            Strings::Any => alternatives.push("XML_VALUE".to_string()),
            Strings::Expr(e) => {
                g.push_str(&format!("{token}: ({e} & XML_TEXT) {close}\n"));
                alternatives.push(token.to_string());
            }
        }
    }
    if !others.is_empty() {
        let s = if types.contains(&"string") {
            // the same schema, strings taken out: they are written as text above
            embedded(root, &json!({"allOf": [schema, {"type": others}]}), strict)
        } else {
            embedded(root, schema, strict)
        };
        alternatives.push(format!("%json {} {close}", json_text(&s)));
    }
    match alternatives.len() {
        0 => Err(Unsupported::Unsatisfiable),
        1 => Ok(alternatives.remove(0)),
        _ => Ok(format!("({})", alternatives.join(" | "))),
    }
}

/// A regex of the texts [`super::coerce`] reads as type `t` (a superset: a text it matches
/// is never written as a string where the schema also allows `t`).
fn read_as(t: &str) -> &'static str {
    match t {
        "null" => "(?i:null)",
        "integer" => r"\s*[+-]?[0-9][0-9_]*\s*",
        "number" => r"\s*[+-]?(?:[0-9_]+\.?[0-9_]*|\.[0-9_]+)(?:[eE][+-]?[0-9_]+)?\s*",
        "boolean" => r"\s*(?i:true|false|1|0)\s*",
        // objects and arrays are read as any JSON text
        _ => r#"(?s:\s*(?:[\[{"0-9-]|true|false|null).*)"#,
    }
}

/// A regex of the first token llguidance's JSON grammar writes for a value of scalar type
/// `t` (a superset). Where the text and the JSON alternatives meet, the lexer cannot go back:
/// after `null` and a newline it must already know the value was JSON, so a text value
/// cannot start with such a token and a newline either (`null` followed by a line break, say;
/// `nullable` is fine). Objects and arrays need nothing: [`read_as`] keeps text from
/// starting like JSON at all.
fn json_start(t: &str) -> Option<&'static str> {
    match t {
        "null" => Some("null"),
        "boolean" => Some("true|false"),
        "integer" | "number" => Some("-?[0-9][0-9.eE+-]*"),
        _ => None,
    }
}

/// Whether the tool named `name` asks for strict arguments (`"strict": true`).
fn is_strict(tools: &[Value], name: &str) -> bool {
    tools
        .iter()
        .map(|t| t.get("function").unwrap_or(t))
        .find(|f| f.get("name").and_then(Value::as_str) == Some(name))
        .is_some_and(|f| f.get("strict") == Some(&Value::Bool(true)))
}

/// A property's schema on its own: the root's `$defs` / `definitions` carried along so its
/// `$ref`s still resolve, and the JSON spelling fixed.
fn embedded(root: &Value, schema: &Value, strict: bool) -> Value {
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
    if strict {
        closed_objects(&mut s, 0);
    }
    with_spelling(s)
}

/// A tool's `parameters` as the schema of its arguments object (an object when it says
/// nothing else, as OpenAI reads a missing schema).
fn arguments_schema(params: &Value, strict: bool) -> Value {
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
    if strict {
        closed_objects(&mut s, 0);
    }
    with_spelling(s)
}

/// `strict: true`: every object schema without `additionalProperties` gets
/// `"additionalProperties": false`, so arguments hold exactly the properties described (as
/// OpenAI's strict mode, which requires it be written, reads them).
fn closed_objects(s: &mut Value, depth: usize) {
    if depth > 64 {
        return;
    }
    let Value::Object(m) = s else { return };
    let objectish = m.contains_key("properties")
        || match m.get("type") {
            Some(Value::String(t)) => type_alias(t) == "object",
            Some(Value::Array(ts)) => ts
                .iter()
                .any(|t| t.as_str().is_some_and(|t| type_alias(t) == "object")),
            _ => false,
        };
    if objectish && !m.contains_key("additionalProperties") {
        m.insert("additionalProperties".into(), Value::Bool(false));
    }
    for (k, v) in m.iter_mut() {
        match k.as_str() {
            // maps of subschemas
            "properties" | "patternProperties" | "$defs" | "definitions" | "dependentSchemas" => {
                if let Value::Object(subs) = v {
                    subs.values_mut().for_each(|v| closed_objects(v, depth + 1));
                }
            }
            // lists of subschemas
            "anyOf" | "oneOf" | "allOf" | "prefixItems" => {
                if let Value::Array(subs) = v {
                    subs.iter_mut().for_each(|v| closed_objects(v, depth + 1));
                }
            }
            // one subschema (or, for the old `items`, a list)
            "items"
            | "additionalItems"
            | "additionalProperties"
            | "contains"
            | "not"
            | "if"
            | "then"
            | "else"
            | "unevaluatedItems"
            | "unevaluatedProperties" => match v {
                Value::Array(subs) => subs.iter_mut().for_each(|v| closed_objects(v, depth + 1)),
                v => closed_objects(v, depth + 1),
            },
            _ => {}
        }
    }
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
pub(crate) fn lark_str(s: &str) -> String {
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
