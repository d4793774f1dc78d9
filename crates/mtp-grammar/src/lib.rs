//! The reply's constraint ([`ResponseFormat`]) as an llguidance grammar, written once.
//!
//! Three users read it: the engine and the in-process llama.cpp lane compile [`grammar`]
//! against their vocabulary ([`Compiler`]) and mask every token they draw ([`Constraint`]),
//! and the HTTP runtimes, which hand the constraint
//! to a server, check a server's finished regex or Lark reply against the same grammar with
//! [`check_text`] (a server may take a field and not enforce it: an older vLLM drops
//! `structured_outputs`). JSON replies are validated with a schema validator there instead:
//! this grammar fixes the schema's key order, which a server need not keep. The check runs
//! the grammar over the reply's bytes (a single-byte vocabulary), so it needs no tokenizer and
//! judges exactly what the engine would have allowed.

use std::sync::{Arc, OnceLock};

mod constraint;
pub mod guard;

pub use constraint::{beside, Compiler, Constraint, AHEAD_MIN_MS};
/// The vocabulary as llguidance sees it (each token's bytes, end ids), what [`Compiler::new`]
/// takes.
pub use llguidance::toktrie::TokEnv;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, TokenId};
use llguidance::{Matcher, ParserFactory};
use mtp_contract::ResponseFormat;
use serde_json::{json, Value};

/// What can go wrong turning a constraint into a grammar.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The schema, pattern or grammar does not compile (a schema keyword llguidance does not
    /// know, a bad regex, a Lark error, an unsatisfiable schema).
    #[error("response_format `{kind}` does not compile: {message}")]
    Compile {
        /// [`ResponseFormat::kind`] of the constraint.
        kind: &'static str,
        /// llguidance's message.
        message: String,
    },
    /// The grammar state failed while a reply was generated (a token it refused was fed, a
    /// mask could not be computed, no allowed token was left in the model's output).
    #[error("response_format `{kind}`: {message}")]
    Reply {
        /// [`ResponseFormat::kind`] of the constraint.
        kind: &'static str,
        /// What went wrong.
        message: String,
    },
    /// llguidance cannot use the vocabulary (its trie or slicer failed, no end id).
    #[error("constrained decoding cannot use this vocabulary: {0}")]
    Vocabulary(String),
    /// llguidance could not build or run the byte-level checker (its own limits).
    #[error("the reply could not be checked against response_format `{kind}`: {message}")]
    Check {
        /// [`ResponseFormat::kind`] of the constraint.
        kind: &'static str,
        /// llguidance's message.
        message: String,
    },
}

/// The grammar for `format` (`None` for free text). JSON is compiled with fixed separators
/// (`", "`, `": "`) and no free whitespace unless the format allows it, as mlx-vlm does: with
/// free whitespace a small model fills its budget with blanks.
pub fn grammar(format: &ResponseFormat) -> Option<TopLevelGrammar> {
    let with_opts = |schema: &Value, flexible: bool| {
        let mut s = match schema {
            Value::Object(m) => Value::Object(m.clone()),
            // `true` (anything): an empty schema says the same
            _ => json!({}),
        };
        if let Some(m) = s.as_object_mut() {
            // llguidance puts its free whitespace around the separators, so free whitespace
            // takes the bare ones (`{"a":1}` and `{ "a" : 1 }` alike)
            let (item, key) = if flexible { (",", ":") } else { (", ", ": ") };
            m.entry("x-guidance").or_insert_with(|| {
                json!({
                    "item_separator": item,
                    "key_separator": key,
                    "whitespace_flexible": flexible,
                })
            });
        }
        s
    };
    match format {
        ResponseFormat::Text => None,
        ResponseFormat::JsonObject {
            flexible_whitespace,
        } => Some(TopLevelGrammar::from_json_schema(with_opts(
            &json!({"type": "object"}),
            *flexible_whitespace,
        ))),
        ResponseFormat::JsonSchema {
            json_schema,
            flexible_whitespace,
        } => Some(TopLevelGrammar::from_json_schema(with_opts(
            &json_schema.schema,
            *flexible_whitespace,
        ))),
        ResponseFormat::Regex { regex } => Some(TopLevelGrammar::from_regex(regex)),
        ResponseFormat::Grammar { grammar } => Some(TopLevelGrammar::from_lark(grammar.clone())),
    }
}

/// How a finished text stands against a constraint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// The text is a whole reply the constraint allows.
    Follows,
    /// The text leaves the constraint at byte `at`: the bytes before it are a prefix some
    /// allowed reply starts with, the byte at `at` is not allowed there.
    Leaves {
        /// Offset of the first byte the constraint does not allow.
        at: usize,
    },
    /// Every byte is allowed, but the reply stops before the constraint is complete (a JSON
    /// object left open, a pattern not yet matched).
    Unfinished,
}

/// The single-byte vocabulary's parser factory, built once per process.
fn byte_factory() -> Result<&'static ParserFactory, String> {
    static FACTORY: OnceLock<Result<ParserFactory, String>> = OnceLock::new();
    FACTORY
        .get_or_init(|| {
            let env: TokEnv = Arc::new(ApproximateTokEnv::single_byte());
            let mut f = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
            // library code never prints: llguidance logs to stderr unless told not to
            f.quiet();
            Ok(f)
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// Whether `text` is a reply `format` allows, byte by byte (free text always is). A
/// constraint that does not compile is an [`Error::Compile`].
///
/// ```
/// use mtp_contract::ResponseFormat;
/// use mtp_grammar::{check_text, Check};
/// let f = ResponseFormat::regex("[0-9]{3}-[0-9]{4}");
/// assert_eq!(check_text(&f, "555-0199").unwrap(), Check::Follows);
/// assert_eq!(check_text(&f, "555-01x9").unwrap(), Check::Leaves { at: 6 });
/// assert_eq!(check_text(&f, "555-01").unwrap(), Check::Unfinished);
/// ```
pub fn check_text(format: &ResponseFormat, text: &str) -> Result<Check, Error> {
    let Some(g) = grammar(format) else {
        return Ok(Check::Follows);
    };
    let kind = format.kind();
    let compile = |message: String| Error::Compile { kind, message };
    let check = |message: String| Error::Check { kind, message };
    guard::check(format)?;
    let factory = byte_factory().map_err(check)?;
    let mut m = guard::run(kind, || {
        let parser = factory
            .create_parser(g)
            .map_err(|e| compile(e.to_string()))?;
        let m = Matcher::new(Ok(parser));
        match m.get_error() {
            Some(e) => Err(compile(e)),
            None => Ok(m),
        }
    })?;
    let bytes: Vec<TokenId> = text.bytes().map(TokenId::from).collect();
    let taken = m
        .try_consume_tokens(&bytes)
        .map_err(|e| check(e.to_string()))?;
    if taken < bytes.len() {
        return Ok(Check::Leaves { at: taken });
    }
    if m.is_accepting().map_err(|e| check(e.to_string()))? {
        Ok(Check::Follows)
    } else {
        Ok(Check::Unfinished)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema(v: Value) -> ResponseFormat {
        ResponseFormat::json_schema(v)
    }

    #[test]
    fn json_schema_replies_are_judged_by_the_schema() {
        let f = schema(json!({
            "type": "object",
            "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
            "required": ["name", "age"],
            "additionalProperties": false
        }));
        assert_eq!(
            check_text(&f, r#"{"name": "Ada", "age": 36}"#).unwrap(),
            Check::Follows
        );
        // compact separators by default: the engine's own output shape
        assert!(matches!(
            check_text(&f, r#"{"name":"Ada","age":36}"#).unwrap(),
            Check::Leaves { .. }
        ));
        // a server's own whitespace, with the whitespace left free
        let loose = f.clone().with_flexible_whitespace();
        assert_eq!(
            check_text(&loose, "{\n  \"name\":\"Ada\",\n  \"age\": 36\n}").unwrap(),
            Check::Follows
        );
        // valid JSON that breaks the schema: the minus sign is where it leaves
        let bad = r#"{"name": "Ada", "age": -1}"#;
        assert_eq!(
            check_text(&loose, bad).unwrap(),
            Check::Leaves {
                at: bad.find('-').unwrap()
            }
        );
        assert_eq!(
            check_text(&loose, r#"{"name": "Ada""#).unwrap(),
            Check::Unfinished
        );
        assert!(matches!(
            check_text(&loose, "Sure! Here is the JSON").unwrap(),
            Check::Leaves { at: 0 }
        ));
    }

    #[test]
    fn regex_and_lark_are_whole_matches() {
        let rx = ResponseFormat::regex("(yes|no)");
        assert_eq!(check_text(&rx, "yes").unwrap(), Check::Follows);
        assert_eq!(check_text(&rx, "yes!").unwrap(), Check::Leaves { at: 3 });
        assert_eq!(check_text(&rx, "").unwrap(), Check::Unfinished);
        let g = ResponseFormat::grammar("start: \"(\" num (\",\" num)* \")\"\nnum: /[0-9]+/");
        assert_eq!(check_text(&g, "(1,22,333)").unwrap(), Check::Follows);
        assert_eq!(check_text(&g, "(1,,2)").unwrap(), Check::Leaves { at: 3 });
        assert_eq!(check_text(&g, "(1,2").unwrap(), Check::Unfinished);
        // multi-byte characters are checked as their UTF-8 bytes
        let cjk = ResponseFormat::regex("名前: [a-z]+");
        assert_eq!(check_text(&cjk, "名前: ada").unwrap(), Check::Follows);
        assert_eq!(
            // 前 and 字 share their first byte
            check_text(&cjk, "名字: ada").unwrap(),
            Check::Leaves { at: 4 }
        );
    }

    #[test]
    fn free_text_follows_and_bad_constraints_are_typed_errors() {
        assert_eq!(
            check_text(&ResponseFormat::Text, "anything").unwrap(),
            Check::Follows
        );
        for (f, kind) in [
            (ResponseFormat::regex("(unclosed"), "regex"),
            (ResponseFormat::grammar("start: undefined_rule"), "grammar"),
            (schema(json!({"type": "no-such-type"})), "json_schema"),
        ] {
            match check_text(&f, "x") {
                Err(Error::Compile { kind: k, message }) => {
                    assert_eq!(k, kind);
                    assert!(!message.is_empty());
                }
                other => panic!("{f:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn json_object_and_true_schemas() {
        let obj = ResponseFormat::JsonObject {
            flexible_whitespace: true,
        };
        assert_eq!(
            check_text(&obj, r#"{"a": [1, 2, {"b": null}]}"#).unwrap(),
            Check::Follows
        );
        assert!(matches!(
            check_text(&obj, "[1, 2]").unwrap(),
            Check::Leaves { at: 0 }
        ));
        let any = schema(json!(true)).with_flexible_whitespace();
        assert_eq!(check_text(&any, "[1, 2]").unwrap(), Check::Follows);
    }
}
