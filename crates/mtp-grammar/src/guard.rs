//! A client's constraint is compiled where it cannot take the process down.
//!
//! llguidance compiles JSON Schemas and Lark grammars by recursion: each `$ref` followed and
//! each rule referenced is a few stack frames deeper (about 8 KiB per `$ref` link of a chain of
//! objects, 3 KiB per Lark rule of a chain, measured on llguidance 1.9). A 22 KB schema whose
//! `$defs` chain 300 links overflows a 2 MiB thread stack, and a stack overflow aborts the
//! whole process, not the request: every sequence in flight dies with it. No size limit alone
//! prevents that (200 links fit, 300 do not), so two things together do:
//!
//! 1. [`check`] bounds what drives the recursion before llguidance sees the constraint: the
//!    number of schema objects and of `$ref`s (a chain is never longer than that), and of Lark
//!    rules (llguidance itself bounds regex and Lark expression nesting, with an error);
//! 2. [`run`] compiles on a thread of its own whose stack holds the deepest recursion those
//!    bounds allow several times over ([`COMPILE_STACK_BYTES`]; only the pages touched are
//!    committed), and turns a panic inside llguidance into an error.
//!
//! The bounds are far above real tool and response schemas (the largest published function
//! schemas have a few hundred objects) and are named in the error, so a refusal says which one
//! a constraint went over.

use std::panic::AssertUnwindSafe;

use mtp_contract::ResponseFormat;
use serde_json::Value;

use crate::Error;

/// The most JSON objects a schema may hold (nested schemas, property maps, `$defs` entries;
/// a `%json` block of a Lark grammar counts its `{`s).
pub const MAX_SCHEMA_OBJECTS: usize = 10_000;
/// The most `$ref`s a schema (or a Lark grammar's `%json` blocks) may hold.
pub const MAX_SCHEMA_REFS: usize = 2_000;
/// The most rules a Lark grammar may define.
pub const MAX_LARK_RULES: usize = 5_000;
/// The stack of the thread that compiles a constraint: the deepest compilation the bounds
/// above allow takes about 16 MiB on llguidance 1.9 (2,000 chained object `$ref`s and 5,000
/// chained rules each compile on a 64 MiB stack), so this leaves a wide margin for other
/// shapes and other builds. It is reserved, not committed: only touched pages take memory.
pub const COMPILE_STACK_BYTES: usize = 256 << 20;

/// Refuses a constraint past the bounds above, naming the bound, before any compilation.
pub fn check(format: &ResponseFormat) -> Result<(), Error> {
    let kind = format.kind();
    let over = |what: &str, n: usize, max: usize| Error::Compile {
        kind,
        message: format!(
            "the constraint holds {n} {what}, over the limit of {max}: a schema or grammar \
             that large is refused before it is compiled (its compilation recurses that deep)"
        ),
    };
    match format {
        ResponseFormat::JsonSchema { json_schema, .. } => {
            let (objects, refs) = count_schema(&json_schema.schema);
            if objects > MAX_SCHEMA_OBJECTS {
                return Err(over("JSON objects", objects, MAX_SCHEMA_OBJECTS));
            }
            if refs > MAX_SCHEMA_REFS {
                return Err(over("`$ref`s", refs, MAX_SCHEMA_REFS));
            }
        }
        ResponseFormat::Grammar { grammar } => {
            let rules = lark_rules(grammar);
            if rules > MAX_LARK_RULES {
                return Err(over("Lark rules", rules, MAX_LARK_RULES));
            }
            // `%json { ... }` embeds a schema in the grammar: bounded as schemas are, by a
            // count over the text (an upper bound of what the blocks hold)
            if grammar.contains("%json") {
                let objects = grammar.matches('{').count();
                if objects > MAX_SCHEMA_OBJECTS {
                    return Err(over("`{` (JSON objects)", objects, MAX_SCHEMA_OBJECTS));
                }
                let refs = grammar.matches("$ref").count();
                if refs > MAX_SCHEMA_REFS {
                    return Err(over("`$ref`s", refs, MAX_SCHEMA_REFS));
                }
            }
        }
        // llguidance bounds a regex's nesting itself, with an error
        ResponseFormat::Regex { .. } | ResponseFormat::JsonObject { .. } | ResponseFormat::Text => {
        }
    }
    Ok(())
}

/// JSON objects and `$ref` keys in a schema, counted without recursion (a value built in
/// code may be nested deeper than any parser would read).
fn count_schema(schema: &Value) -> (usize, usize) {
    let (mut objects, mut refs) = (0usize, 0usize);
    let mut todo = vec![schema];
    while let Some(v) = todo.pop() {
        match v {
            Value::Object(m) => {
                objects += 1;
                refs += usize::from(m.contains_key("$ref"));
                todo.extend(m.values());
            }
            Value::Array(a) => todo.extend(a.iter()),
            _ => {}
        }
    }
    (objects, refs)
}

/// Rule and terminal definitions of a Lark grammar: lines `name:`, `?name:`, `!name:`,
/// `name.2:` (alternatives on following lines start with `|` and are not definitions).
fn lark_rules(grammar: &str) -> usize {
    grammar
        .lines()
        .filter(|line| {
            let s = line.trim_start().trim_start_matches(['?', '!']);
            let name = s
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(s.len());
            if name == 0 || s.as_bytes()[0].is_ascii_digit() {
                return false;
            }
            let rest = s[name..].trim_start_matches(|c: char| c == '.' || c.is_ascii_digit());
            rest.trim_start().starts_with(':')
        })
        .count()
}

/// Runs `compile` (llguidance's work on one constraint) on a thread with
/// [`COMPILE_STACK_BYTES`] of stack; a panic inside becomes an [`Error::Compile`].
pub fn run<T: Send>(
    kind: &'static str,
    compile: impl FnOnce() -> Result<T, Error> + Send,
) -> Result<T, Error> {
    let failed = |message: String| Error::Compile { kind, message };
    std::thread::scope(|s| {
        let worker = std::thread::Builder::new()
            .name("mtp-grammar".into())
            .stack_size(COMPILE_STACK_BYTES)
            .spawn_scoped(s, move || {
                std::panic::catch_unwind(AssertUnwindSafe(compile))
            })
            .map_err(|e| failed(format!("the compiler thread could not start: {e}")))?;
        match worker.join() {
            Ok(Ok(done)) => done,
            Ok(Err(panic)) | Err(panic) => {
                let why = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "no message".into());
                tracing::warn!(kind, "llguidance panicked compiling a constraint: {why}");
                Err(failed(format!("the grammar engine failed on it ({why})")))
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn lark_definitions_are_counted_and_alternatives_are_not() {
        let g =
            "start: a b\n?a: \"x\"\n     | \"y\"\n!b.2 : /[0-9]+/\nNUM: /[0-9]/\n%ignore \" \"\n";
        assert_eq!(lark_rules(g), 4);
    }

    #[test]
    fn schema_objects_and_refs_are_counted_without_recursion() {
        let mut deep = json!({"type": "string"});
        for _ in 0..100_000 {
            // by hand: `json!` would serialize the value it wraps, recursively
            let mut m = serde_json::Map::new();
            m.insert("items".into(), deep);
            deep = Value::Object(m);
        }
        let (objects, refs) = count_schema(&deep);
        assert_eq!((objects, refs), (100_001, 0));
        // serde_json drops nested values recursively: take it apart by hand
        let mut v = deep;
        while let Value::Object(mut m) = v {
            v = m.remove("items").unwrap_or(Value::Null);
        }
    }
}
