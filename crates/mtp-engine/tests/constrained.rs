//! Constrained decoding (llguidance) on the bundled demo model, checked by an independent
//! validator (the `jsonschema` crate): every output of 24 schemas parses and validates, with
//! MTP off and on, greedy and seeded; greedy and seeded output is the same with MTP at every
//! depth; batched constrained sequences equal solo ones; bad constraints fail before generation.

use std::path::PathBuf;

use candle_core::{DType, Device};
use mtp_contract::{FinishReason, ResponseFormat, Sampling};
use mtp_engine::batch::Batch;
use mtp_engine::{Engine, Error, GenerateOptions};
use serde_json::{json, Value};

fn engine() -> Engine {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny-code");
    Engine::load(&dir, &Device::Cpu, DType::F32).expect("load the demo model")
}

/// Schemas of the kinds people send: nested objects, bounded arrays, enums, ranged numbers,
/// patterned strings, `anyOf`, `$ref`, nullable fields, `const`.
fn schemas() -> Vec<Value> {
    vec![
        json!({"type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 999}, "kind": {"enum": ["fn", "struct", "enum"]}}, "required": ["id", "kind"], "additionalProperties": false}),
        json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "inner": {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": -5, "maximum": 5}}, "required": ["ok", "n"], "additionalProperties": false}}, "required": ["name", "inner"], "additionalProperties": false}),
        json!({"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99}, "minItems": 1, "maxItems": 3}),
        json!({"type": "string", "pattern": "^[a-z]{3,8}$"}),
        json!({"anyOf": [{"type": "integer", "minimum": 1, "maximum": 9}, {"enum": ["none", "many"]}]}),
        json!({"type": "boolean"}),
        json!({"type": "number", "minimum": -10, "maximum": 10, "multipleOf": 0.5}),
        json!({"enum": ["red", "green", "blue", "u8", "i64"]}),
        json!({"const": {"version": 2}}),
        json!({"type": "array", "items": {"type": "object", "properties": {"k": {"type": "string", "maxLength": 6}, "v": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["k", "v"], "additionalProperties": false}, "maxItems": 2}),
        json!({"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}, "b": {"type": "string", "maxLength": 5}}, "required": ["a"], "additionalProperties": false}),
        json!({"type": "string", "maxLength": 12}),
        json!({"type": "integer", "exclusiveMinimum": 10, "maximum": 20}),
        json!({"type": ["string", "null"], "maxLength": 8}),
        json!({"type": "array", "items": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2}, "maxItems": 2}),
        json!({"type": "object", "properties": {"path": {"type": "string", "pattern": "^src/[a-z_]{1,10}\\.rs$"}, "line": {"type": "integer", "minimum": 1, "maximum": 9999}}, "required": ["path", "line"], "additionalProperties": false}),
        json!({"$defs": {"pos": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9}, "y": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["x", "y"], "additionalProperties": false}}, "type": "object", "properties": {"from": {"$ref": "#/$defs/pos"}, "to": {"$ref": "#/$defs/pos"}}, "required": ["from", "to"], "additionalProperties": false}),
        json!({"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}),
        json!({"type": "array", "items": {"enum": ["let", "mut", "fn"]}, "minItems": 2, "maxItems": 4}),
        json!({"type": "object", "properties": {"tag": {"const": "err"}, "code": {"type": "integer", "minimum": 400, "maximum": 599}}, "required": ["tag", "code"], "additionalProperties": false}),
        json!({"anyOf": [{"type": "object", "properties": {"ok": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["ok"], "additionalProperties": false}, {"type": "object", "properties": {"err": {"type": "string", "maxLength": 8}}, "required": ["err"], "additionalProperties": false}]}),
        json!({"type": "array", "items": {"type": "string", "pattern": "^[A-Z][a-z]{0,6}$"}, "minItems": 1, "maxItems": 3}),
        json!({"type": "object", "properties": {"ratio": {"type": "number", "minimum": 0, "maximum": 1, "multipleOf": 0.25}, "flag": {"type": "boolean"}}, "required": ["ratio", "flag"], "additionalProperties": false}),
        json!({"type": "null"}),
    ]
}

const PROMPTS: [&str; 2] = ["let config = ", "// the answer as JSON\n"];
const BUDGET: usize = 160;

fn run(e: &Engine, prompt: &str, opts: &GenerateOptions) -> (Vec<u32>, String, FinishReason) {
    let tok = e.tokenizer().expect("tokenizer");
    let ids = tok.encode(prompt).expect("encode");
    let out = e.generate(&ids, opts, |_| true).expect("generate");
    let text = tok.decode(&out.tokens).expect("decode");
    (out.tokens, text, out.finish_reason)
}

fn check_valid(schema: &Value, text: &str, what: &str) {
    let v: Value = serde_json::from_str(text)
        .unwrap_or_else(|e| panic!("{what}: output {text:?} is not JSON: {e}"));
    let validator = jsonschema::validator_for(schema).expect("the reference validator compiles");
    if let Err(err) = validator.validate(&v) {
        panic!("{what}: output {text:?} does not validate against {schema}: {err}");
    }
}

#[test]
fn every_schema_validates_and_mtp_changes_nothing() {
    let e = engine();
    assert!(e.drafter().is_some(), "the demo model carries an MTP head");
    let seeded = Sampling {
        temperature: Some(0.8),
        top_p: Some(0.95),
        seed: Some(11),
        ..Default::default()
    };
    let mut drafted = 0u64;
    let mut accepted = 0u64;
    for (si, schema) in schemas().iter().enumerate() {
        let format = ResponseFormat::json_schema(schema.clone());
        for prompt in PROMPTS {
            for sampling in [Sampling::greedy(), seeded.clone()] {
                let base_opts = GenerateOptions::greedy(BUDGET)
                    .sampling(sampling.clone())
                    .response_format(format.clone());
                let what = format!("schema {si} {schema}, prompt {prompt:?}, {sampling:?}");
                let (base, text, finish) = run(&e, prompt, &base_opts);
                assert_eq!(finish, FinishReason::Stop, "{what}: {text:?}");
                check_valid(schema, &text, &what);
                for depth in [1usize, 3] {
                    let opts = base_opts.clone().num_draft_tokens(depth);
                    let ids = e.tokenizer().unwrap().encode(prompt).unwrap();
                    let out = e.generate(&ids, &opts, |_| true).expect("generate");
                    assert_eq!(out.tokens, base, "{what}: depth {depth} changed the output");
                    let sp = out.speculation.expect("speculation requested");
                    assert!(sp.used, "{what}: MTP did not run");
                    drafted += sp.stats.drafted;
                    accepted += sp.stats.accepted;
                }
            }
        }
    }
    assert!(drafted > 0 && accepted > 0, "{accepted}/{drafted}");
}

#[test]
fn unseeded_sampling_stays_valid_with_mtp() {
    let e = engine();
    let sampling = Sampling {
        temperature: Some(1.0),
        ..Default::default()
    };
    for (si, schema) in schemas().iter().enumerate().step_by(3) {
        for depth in [0usize, 2] {
            let opts = GenerateOptions::greedy(BUDGET)
                .sampling(sampling.clone())
                .response_format(ResponseFormat::json_schema(schema.clone()))
                .num_draft_tokens(depth);
            let (_, text, finish) = run(&e, PROMPTS[0], &opts);
            let what = format!("schema {si}, depth {depth}, unseeded");
            assert_eq!(finish, FinishReason::Stop, "{what}: {text:?}");
            check_valid(schema, &text, &what);
        }
    }
}

#[test]
fn json_object_regex_and_grammar() {
    let e = engine();
    let obj = ResponseFormat::json_object();
    for depth in [0usize, 3] {
        let opts = GenerateOptions::greedy(BUDGET)
            .response_format(obj.clone())
            .num_draft_tokens(depth);
        let (_, text, finish) = run(&e, PROMPTS[1], &opts);
        // any object is allowed, so a small model may run out of budget inside one; what it
        // wrote is still a prefix the grammar allows, and it is an object when it finished
        if finish == FinishReason::Stop {
            let v: Value = serde_json::from_str(&text).expect("json_object output parses");
            assert!(v.is_object(), "{text}");
        } else {
            assert!(text.starts_with('{'), "{text}");
        }
        // compact separators: no whitespace outside strings right after `{`
        assert!(
            !text.starts_with("{ ") && !text.starts_with("{\n"),
            "{text:?}"
        );
    }
    let rx = regex::Regex::new(r"^(fn|let) [a-z_]{1,12}(: (u8|i32|String))?;$").unwrap();
    let grammar = r#"
start: items ";"
items: item | item "," item | item "," item "," item
item: NAME "=" NUMBER
NAME: /[a-z]{1,6}/
NUMBER: /[0-9]{1,3}/
"#;
    let lark = regex::Regex::new(r"^[a-z]{1,6}=[0-9]{1,3}(,[a-z]{1,6}=[0-9]{1,3})*;$").unwrap();
    for prompt in PROMPTS {
        let mut outs = Vec::new();
        for depth in [0usize, 1, 3] {
            let opts = GenerateOptions::greedy(BUDGET).num_draft_tokens(depth);
            let (a, ta, fa) = run(
                &e,
                prompt,
                &opts
                    .clone()
                    .response_format(ResponseFormat::regex(rx.as_str())),
            );
            assert_eq!(fa, FinishReason::Stop, "{ta:?}");
            assert!(rx.is_match(&ta), "regex output {ta:?}");
            let (b, tb, _) = run(
                &e,
                prompt,
                &opts.response_format(ResponseFormat::grammar(grammar)),
            );
            assert!(lark.is_match(&tb), "grammar output {tb:?}");
            outs.push((a, b));
        }
        assert!(outs.windows(2).all(|w| w[0] == w[1]), "MTP changed output");
    }
}

#[test]
fn batched_constrained_sequences_equal_solo() {
    let e = engine();
    let tok = e.tokenizer().unwrap();
    let list = schemas();
    let jobs: Vec<(Vec<u32>, GenerateOptions)> = (0..5)
        .map(|i| {
            let ids = tok.encode(PROMPTS[i % 2]).unwrap();
            let opts = GenerateOptions::greedy(BUDGET)
                .response_format(ResponseFormat::json_schema(list[i * 4].clone()))
                .num_draft_tokens([0, 1, 2, 3, 0][i]);
            (ids, opts)
        })
        .collect();
    let solo: Vec<Vec<u32>> = jobs
        .iter()
        .map(|(p, o)| e.generate(p, o, |_| true).unwrap().tokens)
        .collect();
    let mut batch = Batch::new(&e);
    for (i, (p, o)) in jobs.iter().enumerate() {
        batch.join(i as u64, p, o);
    }
    let mut got: Vec<Option<Vec<u32>>> = vec![None; jobs.len()];
    for _ in 0..10_000 {
        for (id, out) in batch.take_finished() {
            got[id as usize] = Some(out.expect("sequence").tokens);
        }
        if batch.active() == 0 {
            break;
        }
        batch.step(&mut |_, _| true);
    }
    for (id, out) in batch.take_finished() {
        got[id as usize] = Some(out.expect("sequence").tokens);
    }
    for (i, g) in got.into_iter().enumerate() {
        assert_eq!(g.as_ref(), Some(&solo[i]), "sequence {i}");
    }
}

#[test]
fn bad_constraints_fail_before_generation() {
    let e = engine();
    let ids = e.tokenizer().unwrap().encode("x").unwrap();
    let cases = [
        (ResponseFormat::regex("(unclosed"), "regex"),
        (ResponseFormat::grammar("start: undefined_rule"), "grammar"),
        (
            ResponseFormat::json_schema(json!({"type": "no-such-type"})),
            "json_schema",
        ),
        (
            ResponseFormat::json_schema(json!({"type": "integer", "minimum": 5, "maximum": 1})),
            "json_schema",
        ),
    ];
    for (format, kind) in cases {
        let mut called = false;
        let r = e.generate(
            &ids,
            &GenerateOptions::greedy(8).response_format(format.clone()),
            |_| {
                called = true;
                true
            },
        );
        match r {
            Err(Error::Constraint { kind: k, message }) => {
                assert_eq!(k, kind, "{format:?}: {message}");
                assert!(!message.is_empty());
            }
            other => panic!("{format:?}: expected a constraint error, got {other:?}"),
        }
        assert!(!called, "{format:?}: tokens were generated");
    }
}

#[test]
fn budget_cut_reports_length() {
    let e = engine();
    let schema = json!({"type": "array", "items": {"type": "integer"}, "minItems": 50});
    let opts =
        GenerateOptions::greedy(8).response_format(ResponseFormat::json_schema(schema.clone()));
    let (_, text, finish) = run(&e, PROMPTS[0], &opts);
    assert_eq!(finish, FinishReason::Length, "{text}");
    assert!(text.starts_with('['), "{text}");
}

/// A draft that completes the grammar ends the round: nothing is picked after it, as plain
/// decoding picks nothing after the grammar's last token (before the fix, depths of 2 and more
/// emitted the end id after it when `ignore_eos` kept it from stopping the reply).
#[test]
fn a_draft_that_completes_the_grammar_ends_the_reply() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny-trained");
    let e = Engine::load(&dir, &Device::Cpu, DType::F32).expect("load");
    let regex = ResponseFormat::Regex {
        regex: "[a-z ]{3,30}\\.".into(),
    };
    for prompt in ["the quick brown fox ", "vro tvc sbircuj "] {
        let ids: Vec<u32> = prompt.bytes().map(u32::from).collect();
        for eos in [true, false] {
            let o = GenerateOptions::greedy(40)
                .ignore_eos(eos)
                .response_format(regex.clone());
            let want = e.generate(&ids, &o, |_| true).unwrap();
            assert_eq!(want.tokens.last(), Some(&u32::from(b'.')), "{prompt}");
            for k in [1usize, 2, 3, 5, 8] {
                let got = e
                    .generate(&ids, &o.clone().num_draft_tokens(k), |_| true)
                    .unwrap();
                assert_eq!(
                    got.tokens, want.tokens,
                    "{prompt} depth {k} ignore_eos {eos}"
                );
                assert_eq!(got.finish_reason, want.finish_reason);
            }
            let got = e
                .generate(&ids, &o.clone().auto_depth(8), |_| true)
                .unwrap();
            assert_eq!(got.tokens, want.tokens, "{prompt} auto");
        }
    }
}
