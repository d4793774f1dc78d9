//! Constraints built to overflow the compiler's recursion are refused or compiled, never an
//! abort: each is compiled from a thread with a 1 MiB stack, smaller than any thread that
//! serves a request (tokio's and the scheduler's are 2 MiB), where the unguarded compiler
//! aborted the process at 300 `$ref` links or 800 Lark rules.

use std::sync::Arc;

use mtp_contract::ResponseFormat;
use mtp_grammar::guard::{MAX_LARK_RULES, MAX_SCHEMA_OBJECTS, MAX_SCHEMA_REFS};
use mtp_grammar::{check_text, Compiler, Error, TokEnv};
use serde_json::{json, Map, Value};

/// `$defs` whose entries chain `n` links, each an object holding the next.
fn ref_chain(n: usize) -> ResponseFormat {
    let mut defs = Map::new();
    for i in 0..n {
        let v = if i + 1 < n {
            json!({"type": "object", "properties": {"x": {"$ref": format!("#/$defs/a{}", i + 1)}},
                   "required": ["x"]})
        } else {
            json!({"type": "string"})
        };
        defs.insert(format!("a{i}"), v);
    }
    ResponseFormat::json_schema(json!({"$defs": defs, "$ref": "#/$defs/a0"}))
}

/// `n` Lark rules, each the next one.
fn rule_chain(n: usize) -> ResponseFormat {
    let mut g = String::from("start: r0\n");
    for i in 0..n - 1 {
        g += &format!("r{i}: r{}\n", i + 1);
    }
    g += &format!("r{}: \"x\"\n", n - 1);
    ResponseFormat::grammar(g)
}

fn on_small_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::Builder::new()
        .stack_size(1 << 20)
        .spawn(f)
        .expect("thread")
        .join()
        .expect("no panic")
}

fn compiler() -> Compiler {
    let env: TokEnv = Arc::new(llguidance::toktrie::ApproximateTokEnv::single_byte());
    Compiler::new(&env).expect("compiler")
}

fn refused_naming(r: Result<impl std::fmt::Debug, Error>, what: &str, limit: usize) {
    match r {
        Err(Error::Compile { message, .. }) => {
            assert!(
                message.contains(what) && message.contains(&limit.to_string()),
                "{message}"
            );
        }
        other => panic!("expected a refusal naming {what}, got {other:?}"),
    }
}

#[test]
fn long_ref_chains_compile_within_the_limit_and_are_refused_past_it() {
    // 1,000 links: five times what aborted the process before
    let ok = on_small_stack(|| check_text(&ref_chain(1_000), "{\"x\": {\"x\": 1}}"));
    assert!(ok.is_ok(), "{ok:?}");
    let c = on_small_stack(|| compiler().compile(&ref_chain(1_000)).map(|c| c.is_some()));
    assert!(matches!(c, Ok(true)), "{c:?}");
    let over = on_small_stack(|| {
        compiler()
            .compile(&ref_chain(MAX_SCHEMA_REFS + 10))
            .map(|_| ())
    });
    refused_naming(over, "`$ref`s", MAX_SCHEMA_REFS);
}

#[test]
fn long_rule_chains_compile_within_the_limit_and_are_refused_past_it() {
    let ok = on_small_stack(|| check_text(&rule_chain(3_000), "x"));
    assert!(matches!(ok, Ok(mtp_grammar::Check::Follows)), "{ok:?}");
    let over = on_small_stack(|| check_text(&rule_chain(MAX_LARK_RULES + 1), "x"));
    refused_naming(over, "Lark rules", MAX_LARK_RULES);
}

#[test]
fn huge_schemas_are_refused_before_compiling() {
    let props: Map<String, Value> = (0..MAX_SCHEMA_OBJECTS)
        .map(|i| (format!("p{i}"), json!({"type": "integer"})))
        .collect();
    let f = ResponseFormat::json_schema(json!({"type": "object", "properties": props}));
    refused_naming(
        on_small_stack(move || check_text(&f, "{}")),
        "JSON objects",
        MAX_SCHEMA_OBJECTS,
    );
}

#[test]
fn deep_nesting_is_an_error_from_the_grammar_engine() {
    for f in [
        ResponseFormat::regex(format!("{}x{}", "(".repeat(5_000), ")".repeat(5_000))),
        ResponseFormat::grammar(format!(
            "start: {}\"x\"{}\n",
            "(".repeat(5_000),
            ")".repeat(5_000)
        )),
    ] {
        let r = on_small_stack(move || check_text(&f, "x"));
        assert!(matches!(r, Err(Error::Compile { .. })), "{r:?}");
    }
}
