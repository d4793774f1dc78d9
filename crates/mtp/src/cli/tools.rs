//! `--tools FILE`, `--tool-choice` and `--no-parallel-tool-calls`: the tools a request offers,
//! read and checked before the model loads, so that a bad file is a usage error naming it.
//!
//! The file is exactly what OpenAI's `tools` field holds: a JSON list of
//! `{"type": "function", "function": {"name": ..., "description": ..., "parameters": {...}}}`.

use std::io::Read;
use std::path::Path;

use serde_json::Value;

use crate::cli::args::ToolArgs;
use crate::cli::error::CliError;
use crate::{GenerateRequest, ToolChoice};

/// The largest tools file read (a few hundred tool schemas are well under a megabyte).
const MAX_BYTES: u64 = 16 << 20;

/// What the list must look like, for the errors.
const EXPECTED: &str = "a JSON list of OpenAI tool objects, [{\"type\": \"function\", \
                        \"function\": {\"name\": ..., \"description\": ..., \"parameters\": {...}}}]";

/// The tools of every request of a command, as the flags give them.
#[derive(Debug, Clone)]
pub(crate) struct Tools {
    /// The OpenAI tool objects, as the file holds them.
    pub list: Vec<Value>,
    /// `--tool-choice` (`auto` without it).
    pub choice: ToolChoice,
    /// `--no-parallel-tool-calls`: `Some(false)`; else unset.
    pub parallel: Option<bool>,
}

impl Tools {
    /// The flags' tools; `None` without `--tools` (and then the other two flags are errors).
    pub fn from_args(a: &ToolArgs) -> Result<Option<Tools>, CliError> {
        let Some(path) = &a.tools else {
            if a.tool_choice.is_some() {
                return Err(CliError::InvalidFlag {
                    flag: "--tool-choice",
                    message: "goes with --tools FILE (the tools to choose among)".into(),
                });
            }
            if a.no_parallel_tool_calls {
                return Err(CliError::InvalidFlag {
                    flag: "--no-parallel-tool-calls",
                    message: "goes with --tools FILE".into(),
                });
            }
            return Ok(None);
        };
        let bad = |message: String| CliError::InvalidFlag {
            flag: "--tools",
            message,
        };
        let shown = path.display().to_string();
        let text = read(path).map_err(bad)?;
        let v: Value =
            serde_json::from_str(&text).map_err(|e| bad(format!("{shown} is not JSON: {e}")))?;
        let list = parse(v).map_err(|m| bad(format!("{shown}: {m}")))?;
        let choice = match &a.tool_choice {
            None => ToolChoice::Auto,
            Some(c) => choice(c, &list, &format!("{shown}'s tools")).map_err(|message| {
                CliError::InvalidFlag {
                    flag: "--tool-choice",
                    message,
                }
            })?,
        };
        Ok(Some(Tools {
            list,
            choice,
            parallel: a.no_parallel_tool_calls.then_some(false),
        }))
    }

    /// `req` offering these tools.
    pub fn apply(&self, req: GenerateRequest) -> GenerateRequest {
        let req = req
            .tools(self.list.clone())
            .tool_choice(self.choice.clone());
        match self.parallel {
            Some(p) => req.parallel_tool_calls(p),
            None => req,
        }
    }

    /// The tools' names, in the file's order.
    pub fn names(&self) -> Vec<&str> {
        self.list.iter().filter_map(crate::tool_name).collect()
    }
}

/// How a tool choice reads: `auto`, `none`, `required`, or `NAME` (OpenAI's named function).
pub(crate) fn choice_phrase(c: &ToolChoice) -> String {
    match c {
        ToolChoice::Auto => "auto (the model decides)".into(),
        ToolChoice::None => "none (the tools are not shown)".into(),
        ToolChoice::Required => "required (every reply is tool calls)".into(),
        ToolChoice::Function(n) => format!("{n} (every reply is one call of it)"),
    }
}

/// `auto`, `none`, `required`, or the name of one of `list`'s tools; the error names them
/// (`whose`: how it calls the list, e.g. `the tools`).
pub(crate) fn choice(s: &str, list: &[Value], whose: &str) -> Result<ToolChoice, String> {
    match s {
        "auto" => return Ok(ToolChoice::Auto),
        "none" => return Ok(ToolChoice::None),
        "required" => return Ok(ToolChoice::Required),
        _ => {}
    }
    let names: Vec<&str> = list.iter().filter_map(crate::tool_name).collect();
    if names.contains(&s) {
        Ok(ToolChoice::Function(s.to_string()))
    } else {
        Err(format!(
            "`{s}` is not auto, none, required, nor one of {whose} ({})",
            names.join(", ")
        ))
    }
}

/// The file's text: at most 16 MiB of UTF-8; the error names the file.
fn read(path: &Path) -> Result<String, String> {
    let shown = path.display();
    let too_big = || format!("{shown} is larger than 16 MiB, the limit for a tools file");
    let mut f = std::fs::File::open(path).map_err(|e| format!("cannot read {shown}: {e}"))?;
    if f.metadata().is_ok_and(|m| m.len() > MAX_BYTES) {
        return Err(too_big());
    }
    let mut bytes = Vec::new();
    (&mut f)
        .take(MAX_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read {shown}: {e}"))?;
    if bytes.len() as u64 > MAX_BYTES {
        return Err(too_big());
    }
    String::from_utf8(bytes).map_err(|e| format!("{shown} is not UTF-8 text: {e}"))
}

/// Checks that `v` is a non-empty list of OpenAI function tools with distinct names.
pub(crate) fn parse(v: Value) -> Result<Vec<Value>, String> {
    let kind = |v: &Value| match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    };
    let Value::Array(list) = v else {
        return Err(format!("expected {EXPECTED}, got {}", kind(&v)));
    };
    if list.is_empty() {
        return Err(format!("the list is empty; expected {EXPECTED}"));
    }
    let mut names: Vec<&str> = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let at = |m: String| format!("tool {i}: {m}");
        let o = t
            .as_object()
            .ok_or_else(|| at(format!("expected an OpenAI tool object, got {}", kind(t))))?;
        match o.get("type") {
            Some(Value::String(s)) if s == "function" => {}
            Some(other) => {
                return Err(at(format!(
                    "`type` is {other}; only \"function\" tools are known"
                )))
            }
            None => return Err(at("no `type` (it must be \"function\")".into())),
        }
        let f = o
            .get("function")
            .and_then(Value::as_object)
            .ok_or_else(|| at("no `function` object".into()))?;
        let name = f
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| at("`function.name` must be a non-empty string".into()))?;
        if let Some(j) = names.iter().position(|n| *n == name) {
            return Err(at(format!("the name `{name}` is tool {j}'s too")));
        }
        names.push(name);
        if f.get("description").is_some_and(|d| !d.is_string()) {
            return Err(at(format!(
                "`function.description` of `{name}` must be a string"
            )));
        }
        if f.get("parameters").is_some_and(|p| !p.is_object()) {
            return Err(at(format!(
                "`function.parameters` of `{name}` must be a JSON Schema object"
            )));
        }
    }
    Ok(list)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn weather() -> Value {
        json!({"type": "function", "function": {"name": "get_weather", "description": "d",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}})
    }

    #[test]
    fn takes_a_list_of_function_tools() {
        let list =
            parse(json!([weather(), {"type": "function", "function": {"name": "now"}}])).unwrap();
        assert_eq!(list.len(), 2);
        assert_eq!(
            choice("required", &list, "the tools").unwrap(),
            ToolChoice::Required
        );
        assert_eq!(
            choice("auto", &list, "the tools").unwrap(),
            ToolChoice::Auto
        );
        assert_eq!(
            choice("none", &list, "the tools").unwrap(),
            ToolChoice::None
        );
        assert_eq!(
            choice("now", &list, "the tools").unwrap(),
            ToolChoice::Function("now".into())
        );
        let e = choice("later", &list, "the tools").unwrap_err();
        assert!(
            e.contains("`later`") && e.contains("get_weather, now"),
            "{e}"
        );
    }

    #[test]
    fn refuses_what_is_not_a_list_of_tools() {
        for (v, says) in [
            (weather(), "expected a JSON list of OpenAI tool objects"),
            (json!({"tools": [weather()]}), "got an object"),
            (json!([]), "the list is empty"),
            (
                json!([weather(), 3]),
                "tool 1: expected an OpenAI tool object, got a number",
            ),
            (json!([{"function": {"name": "f"}}]), "tool 0: no `type`"),
            (
                json!([{"type": "retrieval", "function": {"name": "f"}}]),
                "only \"function\" tools",
            ),
            (
                json!([{"type": "function"}]),
                "tool 0: no `function` object",
            ),
            (
                json!([{"type": "function", "function": {"name": ""}}]),
                "`function.name` must be a non-empty string",
            ),
            (
                json!([weather(), weather()]),
                "tool 1: the name `get_weather` is tool 0's too",
            ),
            (
                json!([{"type": "function", "function": {"name": "f", "parameters": "x"}}]),
                "must be a JSON Schema object",
            ),
        ] {
            let e = parse(v).unwrap_err();
            assert!(e.contains(says), "{e}");
        }
    }
}
