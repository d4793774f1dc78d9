//! The strings a parameter's JSON Schema accepts, as an llguidance Lark token expression: what
//! a forced call in the XML format may write as a value read back as a string.
//!
//! An XML value is raw text: [`super::parse`] takes the text between `<parameter=KEY>` and
//! `</parameter>`, strips one newline on each side (the template writes the value between
//! them) and, for a schema that allows only strings, keeps the rest verbatim, as vLLM's
//! `qwen3_coder` parser and llama.cpp's (`common/parsers/qwen3-coder.cpp`: the text up to
//! `\n</parameter>\n`) do. Neither of them constrains such text by the schema; here every
//! string keyword is honoured: `enum` / `const`, `minLength` / `maxLength` (in characters),
//! `pattern` (ECMA-262, unanchored as JSON Schema reads it; `\d` and `\w` ASCII), `format`
//! (llguidance's table, see [`super::formats`]), through `$ref`, `anyOf` / `oneOf` (a union;
//! `oneOf`'s exclusivity is not checked, as llguidance's `coerce_one_of`) and `allOf` (an
//! intersection, Lark's `&`). What cannot be honoured is an [`Unsupported`] error, never
//! ignored.

use regex_syntax::ast::{AssertionKind, Ast};
use serde_json::{Map, Value};

use super::{resolve, type_alias, MAX_SCHEMA_WALK_NODES};

/// Why a parameter's schema cannot be written as a forced XML value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unsupported {
    /// A `pattern` that is not a regular expression this reads.
    #[error("its pattern {pattern:?} is not a regular expression this server reads ({why})")]
    Pattern {
        /// The pattern.
        pattern: String,
        /// What the regex parser said.
        why: String,
    },
    /// A `pattern` with anchors (`^`, `$`) or word boundaries anywhere but at the start or end
    /// of the pattern or of one of its top-level alternatives.
    #[error("its pattern {0:?} has anchors or word boundaries inside it (only `^` at the start and `$` at the end of the pattern or of a top-level alternative are read)")]
    PatternAnchor(String),
    /// A `format` without a known regular expression.
    #[error("its format {0:?} is not one of date-time, date, time, duration, email, hostname, ipv4, ipv6, uuid, uri")]
    Format(String),
    /// A keyword whose value is not what JSON Schema allows (`minLength: "3"`), or one the
    /// XML grammar cannot honour (`not`, `if`).
    #[error("its keyword `{0}` cannot be honoured in a forced XML tool call (or its value is malformed)")]
    Keyword(String),
    /// A `$ref` that does not resolve to a local definition.
    #[error("its $ref {0:?} does not resolve to a definition of the tool's schema")]
    Ref(String),
    /// A string schema that refers back to itself.
    #[error("its string schema refers to itself through $ref")]
    Recursive,
    /// No value satisfies the schema as the XML format writes values.
    #[error("no value satisfies its schema")]
    Unsatisfiable,
    /// The walk went past [`MAX_SCHEMA_WALK_NODES`].
    #[error("it is too complex to read")]
    TooComplex,
}

/// A set of strings as a Lark token expression.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Strings {
    /// No string.
    Never,
    /// Every string.
    Any,
    /// Those a token expression matches (parenthesised where it combines others).
    Expr(String),
}

impl Strings {
    fn and(self, other: Strings) -> Strings {
        match (self, other) {
            (Strings::Never, _) | (_, Strings::Never) => Strings::Never,
            (Strings::Any, x) | (x, Strings::Any) => x,
            (Strings::Expr(a), Strings::Expr(b)) => Strings::Expr(format!("({a} & {b})")),
        }
    }

    fn or(self, other: Strings) -> Strings {
        match (self, other) {
            (Strings::Any, _) | (_, Strings::Any) => Strings::Any,
            (Strings::Never, x) | (x, Strings::Never) => x,
            (Strings::Expr(a), Strings::Expr(b)) => Strings::Expr(format!("({a} | {b})")),
        }
    }

    fn regex(rx: &str) -> Strings {
        Strings::Expr(format!("/{}/", lark_regex(rx)))
    }

    /// All but the strings `rx` matches.
    pub(crate) fn without(self, rx: &str) -> Strings {
        self.and(Strings::Expr(format!("~/{}/", lark_regex(rx))))
    }
}

/// The strings `schema` (a parameter's schema, `root` its tool's `parameters` for `$ref`s)
/// accepts.
pub(crate) fn strings(root: &Value, schema: &Value) -> Result<Strings, Unsupported> {
    let mut walk = Walk {
        root,
        stack: Vec::new(),
        visited: 0,
    };
    walk.visit(schema, 0)
}

struct Walk<'a> {
    root: &'a Value,
    /// The nodes being read (a `$ref` back to one of them is a cycle).
    stack: Vec<*const Value>,
    visited: usize,
}

impl<'a> Walk<'a> {
    fn visit(&mut self, schema: &'a Value, depth: usize) -> Result<Strings, Unsupported> {
        self.visited += 1;
        if self.visited > MAX_SCHEMA_WALK_NODES || depth > 64 {
            return Err(Unsupported::TooComplex);
        }
        let node = resolve(self.root, schema);
        if let Some(r) = node.get("$ref") {
            return Err(Unsupported::Ref(r.as_str().unwrap_or_default().to_string()));
        }
        let m = match node {
            Value::Bool(false) => return Ok(Strings::Never),
            Value::Object(m) => m,
            _ => return Ok(Strings::Any),
        };
        let at = node as *const Value;
        if self.stack.contains(&at) {
            return Err(Unsupported::Recursive);
        }
        self.stack.push(at);
        let out = self.node(m, depth);
        self.stack.pop();
        out
    }

    fn node(&mut self, m: &'a Map<String, Value>, depth: usize) -> Result<Strings, Unsupported> {
        for k in ["not", "if"] {
            if m.contains_key(k) {
                return Err(Unsupported::Keyword(k.into()));
            }
        }
        let string_type = |t: &Value| t.as_str().is_some_and(|t| type_alias(t) == "string");
        match m.get("type") {
            Some(t @ Value::String(_)) if !string_type(t) => return Ok(Strings::Never),
            Some(Value::Array(ts)) if !ts.iter().any(string_type) => return Ok(Strings::Never),
            Some(Value::String(_) | Value::Array(_)) | None => {}
            Some(_) => return Err(Unsupported::Keyword("type".into())),
        }
        let mut out = Strings::Any;
        if let Some(c) = m.get("const") {
            out = out.and(literal(c));
        }
        match m.get("enum") {
            Some(Value::Array(values)) => {
                let choices = values.iter().map(literal).fold(Strings::Never, Strings::or);
                out = out.and(choices);
            }
            Some(_) => return Err(Unsupported::Keyword("enum".into())),
            None => {}
        }
        let min = count(m, "minLength")?.unwrap_or(0);
        let max = count(m, "maxLength")?;
        match max {
            Some(max) if min > max => return Ok(Strings::Never),
            Some(max) => out = out.and(Strings::regex(&format!("(?s:.{{{min},{max}}})"))),
            None if min > 0 => out = out.and(Strings::regex(&format!("(?s:.{{{min},}})"))),
            None => {}
        }
        match m.get("pattern") {
            Some(Value::String(p)) => out = out.and(Strings::regex(&pattern(p)?)),
            Some(_) => return Err(Unsupported::Keyword("pattern".into())),
            None => {}
        }
        match m.get("format") {
            Some(Value::String(f)) => match super::formats::lookup_format(f) {
                Some(rx) => out = out.and(Strings::regex(rx)),
                None => return Err(Unsupported::Format(f.clone())),
            },
            Some(_) => return Err(Unsupported::Keyword("format".into())),
            None => {}
        }
        for key in ["anyOf", "oneOf", "allOf"] {
            let Some(branches) = m.get(key) else { continue };
            let Value::Array(branches) = branches else {
                return Err(Unsupported::Keyword(key.into()));
            };
            let mut acc = if key == "allOf" {
                Strings::Any
            } else {
                Strings::Never
            };
            for b in branches {
                let s = self.visit(b, depth + 1)?;
                acc = if key == "allOf" {
                    acc.and(s)
                } else {
                    acc.or(s)
                };
            }
            out = out.and(acc);
        }
        Ok(out)
    }
}

/// A string `const` / `enum` value as a literal (any other value is no string).
fn literal(v: &Value) -> Strings {
    match v {
        Value::String(s) => Strings::Expr(super::grammar::lark_str(s)),
        _ => Strings::Never,
    }
}

/// A length bound: a non-negative integer (`5.0` included, as JSON Schema reads numbers).
fn count(m: &Map<String, Value>, key: &str) -> Result<Option<u64>, Unsupported> {
    match m.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .or_else(|| {
                v.as_f64()
                    .filter(|f| *f >= 0.0 && f.fract() == 0.0 && *f < 1e15)
                    .map(|f| f as u64)
            })
            .map(Some)
            .ok_or_else(|| Unsupported::Keyword(key.into())),
    }
}

/// A JSON Schema `pattern` as a regex that must match the whole string: JSON Schema's
/// patterns match anywhere (ECMA-262 `search`), so each top-level alternative gets `.*`
/// on the sides it does not anchor with `^` / `$`. `\d`, `\w` (and `\D`, `\W`) are ASCII, as
/// in ECMA-262 and llguidance's JSON compiler; `.` is the regex crate's (every character but
/// `\n`; ECMA-262's also leaves out `\r`, U+2028 and U+2029).
pub(crate) fn pattern(p: &str) -> Result<String, Unsupported> {
    let bad = |why: String| Unsupported::Pattern {
        pattern: p.to_string(),
        why,
    };
    let rx = ascii_classes(p);
    let ast = regex_syntax::ast::parse::Parser::new()
        .parse(&rx)
        .map_err(|e| bad(e.kind().to_string()))?;
    let branches: Vec<&Ast> = match &ast {
        Ast::Alternation(a) => a.asts.iter().collect(),
        other => vec![other],
    };
    let mut out = Vec::new();
    for b in branches {
        let items: Vec<&Ast> = match b {
            Ast::Concat(c) => c.asts.iter().collect(),
            other => vec![other],
        };
        let is = |a: &Ast, k: AssertionKind| matches!(a, Ast::Assertion(x) if x.kind == k);
        let mut lo = 0;
        while lo < items.len() && is(items[lo], AssertionKind::StartLine) {
            lo += 1;
        }
        let mut hi = items.len();
        while hi > lo && is(items[hi - 1], AssertionKind::EndLine) {
            hi -= 1;
        }
        let body = if lo < hi {
            &rx[items[lo].span().start.offset..items[hi - 1].span().end.offset]
        } else {
            ""
        };
        let hir = regex_syntax::ParserBuilder::new()
            .build()
            .parse(body)
            .map_err(|e| bad(e.to_string()))?;
        if !hir.properties().look_set().is_empty() {
            return Err(Unsupported::PatternAnchor(p.to_string()));
        }
        let head = if lo > 0 { "" } else { "(?s:.*)" };
        let tail = if hi < items.len() { "" } else { "(?s:.*)" };
        out.push(format!("{head}(?:{body}){tail}"));
    }
    Ok(format!("(?:{})", out.join("|")))
}

/// `\d`, `\w`, `\D`, `\W` as their ASCII classes (ECMA-262's meaning; the regex crate's
/// are Unicode).
fn ascii_classes(p: &str) -> String {
    let mut out = String::with_capacity(p.len());
    let mut escaped = false;
    for c in p.chars() {
        if escaped {
            escaped = false;
            match c {
                'd' => out.push_str("[0-9]"),
                'D' => out.push_str("[^0-9]"),
                'w' => out.push_str("[0-9a-zA-Z_]"),
                'W' => out.push_str("[^0-9a-zA-Z_]"),
                _ => {
                    out.push('\\');
                    out.push(c);
                }
            }
        } else if c == '\\' {
            escaped = true;
        } else {
            out.push(c);
        }
    }
    if escaped {
        out.push('\\');
    }
    out
}

/// A regex as the body of a Lark `/.../` literal: `/` escaped (unless it already is), line
/// breaks as escapes.
fn lark_regex(rx: &str) -> String {
    let mut out = String::with_capacity(rx.len() + 8);
    let mut escaped = false;
    for c in rx.chars() {
        match c {
            '/' if !escaped => out.push_str("\\/"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            _ => out.push(c),
        }
        escaped = c == '\\' && !escaped;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_are_anchored_per_alternative() {
        assert_eq!(pattern("^[a-z]+$").unwrap(), "(?:(?:[a-z]+))");
        assert_eq!(pattern("ab").unwrap(), "(?:(?s:.*)(?:ab)(?s:.*))");
        assert_eq!(pattern("^a|b$").unwrap(), "(?:(?:a)(?s:.*)|(?s:.*)(?:b))");
        assert_eq!(pattern(r"^\d{3}$").unwrap(), "(?:(?:[0-9]{3}))");
        assert_eq!(pattern("").unwrap(), "(?:(?s:.*)(?:)(?s:.*))");
        assert!(matches!(pattern("(a"), Err(Unsupported::Pattern { .. })));
        assert!(matches!(
            pattern("a(?=b)"),
            Err(Unsupported::Pattern { .. })
        ));
        assert_eq!(
            pattern("(^a)"),
            Err(Unsupported::PatternAnchor("(^a)".into()))
        );
        assert_eq!(
            pattern(r"\bx"),
            Err(Unsupported::PatternAnchor(r"\bx".into()))
        );
    }

    #[test]
    fn slashes_are_escaped_once() {
        assert_eq!(lark_regex("a/b"), "a\\/b");
        assert_eq!(lark_regex("a\\/b"), "a\\/b");
        assert_eq!(lark_regex("a\\\\/b"), "a\\\\\\/b");
    }
}
