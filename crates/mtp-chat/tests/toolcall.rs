//! Tool calls out of model text (`mtp_chat::toolcall`), checked against the documented rules:
//! vLLM's `qwen3_coder` tool parser (and its `coerce_to_schema_type`) for Qwen3.5 /
//! Qwen3-Coder XML, its `hermes` parser for Hermes JSON, and OpenAI's `tool_calls` shape —
//! not against whatever the code happens to print.
//!
//! - the format each published template in `tests/templates/` asks for;
//! - golden whole-text parses (tables below);
//! - streaming equals the whole parse for every split of the goldens and of random markup;
//! - the forced-call grammars compile, accept the template's own rendering of calls and
//!   refuse calls that break the schema.

use mtp_chat::toolcall::{
    call_grammar, parse_with_ids, CallIds, Forced, ParsedReply, StreamEvent, ToolCallError,
    ToolCallFormat, ToolCallStream,
};
use mtp_contract::ResponseFormat;
use mtp_grammar::{check_text, Check};
use serde_json::{json, Value};

use ToolCallFormat::{HermesJson, QwenXml};

// ---------------------------------------------------------------------------------------
// Format detection
// ---------------------------------------------------------------------------------------

/// What each published template asks for. Every template in `tests/templates/` not listed
/// here writes neither format (Llama 3.x bare JSON, Mistral `[TOOL_CALLS]`, GLM and Laguna
/// `<arg_key>`, Seed-OSS `<seed:tool_call>`, MiniMax `<invoke>`, functionary's bare
/// `<function=...>{json}`, Apriel's `<tool_calls>[...]`, …).
const DETECTED: &[(&str, ToolCallFormat)] = &[
    ("Qwen3.5-4B.jinja", QwenXml),
    ("Qwen3-Coder.jinja", QwenXml),
    // took the Qwen3-Coder template; vLLM serves them with `qwen3_coder`
    ("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja", QwenXml),
    ("StepFun3.5-Flash.jinja", QwenXml),
    ("Qwen-Qwen2.5-7B-Instruct.jinja", HermesJson),
    ("Qwen-Qwen3-0.6B.jinja", HermesJson),
    ("Qwen-QwQ-32B.jinja", HermesJson),
    (
        "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja",
        HermesJson,
    ),
    (
        "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
        HermesJson,
    ),
    ("MiMo-VL.jinja", HermesJson),
    ("Bielik-11B-v3.0-Instruct.jinja", HermesJson),
    ("ibm-granite-granite-4.0.jinja", HermesJson),
    ("ibm-granite-granite-4.1.jinja", HermesJson),
    ("Reka-Edge.jinja", HermesJson),
];

fn templates() -> Vec<(String, String)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/templates");
    let mut out: Vec<(String, String)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "jinja"))
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read_to_string(&p).unwrap())
        })
        .collect();
    out.sort();
    out
}

#[test]
fn the_published_templates_ask_for_the_format_they_render() {
    let all = templates();
    assert_eq!(
        all.len(),
        71,
        "the templates of llama.cpp b11434's models/templates/"
    );
    for (name, source) in &all {
        let expected = DETECTED.iter().find(|(n, _)| n == name).map(|(_, f)| *f);
        assert_eq!(ToolCallFormat::from_template(source), expected, "{name}");
    }
    // spot checks that name the families
    let get = |n: &str| &all.iter().find(|(name, _)| name == n).unwrap().1;
    for none in [
        "meta-llama-Llama-3.1-8B-Instruct.jinja",
        "meta-llama-Llama-3.3-70B-Instruct.jinja",
        "ByteDance-Seed-OSS.jinja",
        "meetkai-functionary-medium-v3.1.jinja",
        "GLM-4.6.jinja",
        "MiniMax-M3.jinja",
        "unsloth-Apriel-1.5.jinja",
        "mistralai-Mistral-Nemo-Instruct-2407.jinja",
    ] {
        assert_eq!(ToolCallFormat::from_template(get(none)), None, "{none}");
    }
}

#[test]
fn detection_reads_the_markup_however_the_template_spells_it() {
    let cases: &[(&str, Option<ToolCallFormat>)] = &[
        // Hermes JSON right after the tag, after a real newline, an escaped one inside a
        // double-quoted Jinja string, a CRLF, or a Jinja block between
        (
            r#"{{ '<tool_call>{"name": "' + t.name }}"#,
            Some(HermesJson),
        ),
        ("{{ '<tool_call>\n{\"name\": ' }}", Some(HermesJson)),
        (
            r#"{{ "<tool_call>\n{\"name\": \"" ~ t.name }}"#,
            Some(HermesJson),
        ),
        (
            "<tool_call>\r\n{\"name\": <function-name>}",
            Some(HermesJson),
        ),
        (
            "{{- '<tool_call>\\n' }}{%- if t.function is defined %}{% set t = t.function %}\
             {% endif %}{{- '{' }}{{- '\"name\": \"' }}",
            Some(HermesJson),
        ),
        // Qwen XML: the three markers, wherever they are written
        (
            "{{- '<tool_call>' }}{{ '\\n<function=' ~ n ~ '>' }}{{ \"<parameter=\" ~ k }}",
            Some(QwenXml),
        ),
        // not these formats
        ("<tool_call>{function-name}<arg_key>{k}</arg_key>", None),
        (
            "<tool_call></tool_call> tags: <tool_calls>[{\"name\": 1}]</tool_calls>",
            None,
        ),
        ("<seed:tool_call>\n<function=f>\n<parameter=k>", None),
        ("]<]minimax[>[<tool_call>\n{\"name\": 1}", None),
        ("<function=f>{\"a\": 1}</function>", None),
        ("{{ messages }}", None),
    ];
    for (source, expected) in cases {
        assert_eq!(ToolCallFormat::from_template(source), *expected, "{source}");
    }
}

// ---------------------------------------------------------------------------------------
// Whole-text parses
// ---------------------------------------------------------------------------------------

fn tool(name: &str, parameters: Value) -> Value {
    json!({"type": "function", "function": {"name": name, "parameters": parameters}})
}

fn tools() -> Vec<Value> {
    vec![
        tool(
            "get_weather",
            json!({"type": "object", "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}
            }, "required": ["city"]}),
        ),
        tool("get_time", json!({"type": "object", "properties": {}})),
        tool(
            "write_file",
            json!({"type": "object", "properties": {
                "path": {"type": "string"}, "content": {"type": "string"}
            }, "required": ["path", "content"]}),
        ),
        tool(
            "search",
            json!({"type": "object", "properties": {
                "query": {"type": "string"},
                "filters": {"type": "object", "properties": {
                    "tags": {"type": "array", "items": {"type": "string"}}
                }},
                "limit": {"type": "integer", "minimum": 1}
            }, "required": ["query"]}),
        ),
        tool(
            "typed",
            json!({"type": "object", "$defs": {"Point": {"type": "object", "properties": {
                "x": {"type": "number"}, "y": {"type": "number"}}}},
            "properties": {
                "i": {"type": "integer"},
                "n": {"type": "number"},
                "f": {"type": "number"},
                "big": {"type": "number"},
                "inf": {"type": "number"},
                "b": {"type": "boolean"},
                "b2": {"type": "boolean"},
                "s": {"type": "string"},
                "sn": {"type": ["string", "null"]},
                "nn": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
                "arr": {"type": "array"},
                "obj": {"type": "object"},
                "e": {"enum": [1, 2, 3]},
                "u": {"type": "integer"},
                "bad": {"type": "integer"},
                "flag": {"type": "boolean"},
                "alias": {"type": "int"},
                "ref": {"$ref": "#/$defs/Point"}
            }}),
        ),
    ]
}

/// One golden: the text, the content and calls (name, arguments) the rules give, and
/// whether the parse must warn.
struct Golden {
    what: &'static str,
    format: ToolCallFormat,
    text: &'static str,
    content: &'static str,
    calls: &'static [(&'static str, &'static str)],
    warns: bool,
}

const GOLDENS: &[Golden] = &[
    // --- Qwen3.5 / Qwen3-Coder XML ---------------------------------------------------
    Golden {
        what: "text before a call: content without the blank line that separates them",
        format: QwenXml,
        text: "Let me check the weather.\n\n<tool_call>\n<function=get_weather>\n\
               <parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n\
               </function>\n</tool_call>",
        content: "Let me check the weather.",
        calls: &[("get_weather", r#"{"city": "Paris", "days": 3}"#)],
        warns: false,
    },
    Golden {
        what: "multi-line value: one newline stripped on each side, the rest kept",
        format: QwenXml,
        text: "<tool_call>\n<function=write_file>\n<parameter=path>\nsrc/main.rs\n</parameter>\n\
               <parameter=content>\nfn main() {\n    println!(\"hi\\n\");\n}\n\n</parameter>\n\
               </function>\n</tool_call>",
        content: "",
        calls: &[(
            "write_file",
            r#"{"path": "src/main.rs", "content": "fn main() {\n    println!(\"hi\\n\");\n}\n"}"#,
        )],
        warns: false,
    },
    Golden {
        what: "nested JSON value re-written with json.dumps spacing; quotes in a string kept",
        format: QwenXml,
        text: "<tool_call>\n<function=search>\n<parameter=query>\nrust \"async\" book\n\
               </parameter>\n<parameter=filters>\n{\"tags\":[\"a\",\"b\"],\"range\":\
               {\"min\":1.5,\"max\":null}}\n</parameter>\n<parameter=limit>\n10\n</parameter>\n\
               </function>\n</tool_call>",
        content: "",
        calls: &[(
            "search",
            r#"{"query": "rust \"async\" book", "filters": {"tags": ["a", "b"], "range": {"min": 1.5, "max": null}}, "limit": 10}"#,
        )],
        warns: false,
    },
    Golden {
        what: "several calls; whitespace between and after them is not content",
        format: QwenXml,
        text: "I'll look up both.\n<tool_call>\n<function=get_weather>\n<parameter=city>\n\
               Paris\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n\
               <function=get_weather>\n<parameter=city>\nTokyo\n</parameter>\n</function>\n\
               </tool_call>\n",
        content: "I'll look up both.",
        calls: &[
            ("get_weather", r#"{"city": "Paris"}"#),
            ("get_weather", r#"{"city": "Tokyo"}"#),
        ],
        warns: false,
    },
    Golden {
        what: "two functions in one <tool_call>: two calls; no parameters: {}",
        format: QwenXml,
        text: "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n\
               </function>\n<function=get_time>\n</function>\n</tool_call>",
        content: "",
        calls: &[("get_weather", r#"{"city": "Paris"}"#), ("get_time", "{}")],
        warns: false,
    },
    Golden {
        what: "values typed by the schema (coerce_to_schema_type), falling back to the text",
        format: QwenXml,
        text: "<tool_call>\n<function=typed>\n\
               <parameter=i>\n-0042\n</parameter>\n\
               <parameter=n>\n2.50\n</parameter>\n\
               <parameter=f>\n3.0\n</parameter>\n\
               <parameter=big>\n1e3\n</parameter>\n\
               <parameter=inf>\ninf\n</parameter>\n\
               <parameter=b>\nTrue\n</parameter>\n\
               <parameter=b2>\nFALSE\n</parameter>\n\
               <parameter=s>\nnull\n</parameter>\n\
               <parameter=sn>\nnull\n</parameter>\n\
               <parameter=nn>\nNULL\n</parameter>\n\
               <parameter=arr>\n[1, \"two\", 3.5]\n</parameter>\n\
               <parameter=obj>\n{\"k\": true}\n</parameter>\n\
               <parameter=e>\n2\n</parameter>\n\
               <parameter=u>\n4.5\n</parameter>\n\
               <parameter=bad>\nabc\n</parameter>\n\
               <parameter=flag>\nyes\n</parameter>\n\
               <parameter=alias>\n7\n</parameter>\n\
               <parameter=ref>\n{\"x\": 1, \"y\": 2}\n</parameter>\n\
               <parameter=extra>\n5\n</parameter>\n\
               </function>\n</tool_call>",
        content: "",
        calls: &[(
            "typed",
            concat!(
                r#"{"i": -42, "n": 2.5, "f": 3, "big": 1000, "inf": "inf", "b": true, "#,
                r#""b2": false, "s": "null", "sn": null, "nn": null, "arr": [1, "two", 3.5], "#,
                r#""obj": {"k": true}, "e": 2, "u": 4.5, "bad": "abc", "flag": "yes", "#,
                r#""alias": 7, "ref": {"x": 1, "y": 2}, "extra": "5"}"#
            ),
        )],
        warns: true,
    },
    Golden {
        what: "a function the tools do not define: every value a string",
        format: QwenXml,
        text: "<tool_call>\n<function=launch>\n<parameter=count>\n3\n</parameter>\n\
               </function>\n</tool_call>",
        content: "",
        calls: &[("launch", r#"{"count": "3"}"#)],
        warns: true,
    },
    Golden {
        what: "bare <function=...> without <tool_call>, as vLLM accepts",
        format: QwenXml,
        text: "Calling now: <function=get_time>\n</function>",
        content: "Calling now:",
        calls: &[("get_time", "{}")],
        warns: false,
    },
    Golden {
        what: "no call: the text is content exactly, trailing blanks included",
        format: QwenXml,
        text: "Just text, a <tool> tag, x < y, <function and =.  \n",
        content: "Just text, a <tool> tag, x < y, <function and =.  \n",
        calls: &[],
        warns: false,
    },
    Golden {
        what: "malformed: <tool_call> holding no function is content",
        format: QwenXml,
        text: "Here:\n<tool_call>\n{\"name\": \"get_weather\"}\n</tool_call>",
        content: "Here:\n<tool_call>\n{\"name\": \"get_weather\"}\n</tool_call>",
        calls: &[],
        warns: true,
    },
    Golden {
        what: "malformed: a function without a name is content",
        format: QwenXml,
        text: "<tool_call>\n<function=>\n</function>\n</tool_call>",
        content: "<tool_call>\n<function=>\n</function>\n</tool_call>",
        calls: &[],
        warns: true,
    },
    Golden {
        what: "malformed: the reply ends inside the function's name: content",
        format: QwenXml,
        text: "Text <tool_call>\n<function=get_wea",
        content: "Text <tool_call>\n<function=get_wea",
        calls: &[],
        warns: true,
    },
    Golden {
        what: "reply cut after </function>: the call stands (vLLM's `<tool_call>(.*?)$`)",
        format: QwenXml,
        text: "<tool_call>\n<function=get_time>\n</function>\n",
        content: "",
        calls: &[("get_time", "{}")],
        warns: true,
    },
    Golden {
        what: "reply cut inside a value: the call stands with what it has (vLLM's `$`)",
        format: QwenXml,
        text: "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
        content: "",
        calls: &[("get_weather", r#"{"city": "Par"}"#)],
        warns: true,
    },
    Golden {
        what: "a value left open ends where the next parameter starts",
        format: QwenXml,
        text: "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n\
               <parameter=days>\n2\n</parameter>\n</function>\n</tool_call>",
        content: "",
        calls: &[("get_weather", r#"{"city": "Paris", "days": 2}"#)],
        warns: true,
    },
    Golden {
        what: "unicode: content, values (kept raw: ensure_ascii=False) and a wide blank",
        format: QwenXml,
        text: "天气如何？\u{3000}\n<tool_call>\n<function=get_weather>\n<parameter=city>\n\
               東京 🗼\n</parameter>\n</function>\n</tool_call>",
        content: "天气如何？",
        calls: &[("get_weather", r#"{"city": "東京 🗼"}"#)],
        warns: false,
    },
    Golden {
        what: "control characters escaped as json.dumps does",
        format: QwenXml,
        text: "<tool_call>\n<function=write_file>\n<parameter=path>\na\tb\\c\u{1}\n\
               </parameter>\n<parameter=content>\n\n</parameter>\n</function>\n</tool_call>",
        content: "",
        calls: &[("write_file", r#"{"path": "a\tb\\c\u0001", "content": ""}"#)],
        warns: false,
    },
    Golden {
        what: "text between and after calls is content",
        format: QwenXml,
        text: "First.\n<tool_call>\n<function=get_time>\n</function>\n</tool_call>\n\
               Then.\n<tool_call>\n<function=get_time>\n</function>\n</tool_call>\n\nDone.",
        content: "First.\nThen.\n\nDone.",
        calls: &[("get_time", "{}"), ("get_time", "{}")],
        warns: false,
    },
    Golden {
        what: "text only after calls starts at its first letter",
        format: QwenXml,
        text: "<tool_call>\n<function=get_time>\n</function>\n</tool_call>\n\nDone.\n",
        content: "Done.\n",
        calls: &[("get_time", "{}")],
        warns: false,
    },
    // --- Hermes JSON ---------------------------------------------------------------------
    Golden {
        what: "Hermes: one call; argument order kept",
        format: HermesJson,
        text: "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"unit\": \"celsius\", \
               \"city\": \"San Francisco, CA\"}}\n</tool_call>",
        content: "",
        calls: &[(
            "get_weather",
            r#"{"unit": "celsius", "city": "San Francisco, CA"}"#,
        )],
        warns: false,
    },
    Golden {
        what: "Hermes: content and two calls; compact JSON re-spaced",
        format: HermesJson,
        text: "Checking both.\n\n<tool_call>\n{\"name\":\"get_weather\",\"arguments\":\
               {\"city\":\"Paris\",\"days\":2}}\n</tool_call>\n<tool_call>\n\
               {\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>",
        content: "Checking both.",
        calls: &[
            ("get_weather", r#"{"city": "Paris", "days": 2}"#),
            ("get_time", "{}"),
        ],
        warns: false,
    },
    Golden {
        what: "Hermes: `parameters` for `arguments`; arguments as a JSON string; none at all",
        format: HermesJson,
        text: "<tool_call>\n{\"name\": \"search\", \"parameters\": {\"query\": \"x\", \
               \"limit\": 5}}\n</tool_call>\n<tool_call>\n{\"name\": \"search\", \
               \"arguments\": \"{\\\"query\\\": \\\"y\\\"}\"}\n</tool_call>\n<tool_call>\n\
               {\"name\": \"get_time\"}\n</tool_call>",
        content: "",
        calls: &[
            ("search", r#"{"query": "x", "limit": 5}"#),
            ("search", r#"{"query": "y"}"#),
            ("get_time", "{}"),
        ],
        warns: false,
    },
    Golden {
        what: "Hermes: Python's float spelling, unicode raw",
        format: HermesJson,
        text: "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1.0, \"y\": 1e-7, \
               \"s\": \"\\u00e9t\u{e9}\"}}\n</tool_call>",
        content: "",
        calls: &[("f", r#"{"x": 1.0, "y": 1e-07, "s": "été"}"#)],
        warns: true, // `f` is not among the tools
    },
    Golden {
        what: "Hermes: JSON that does not parse is content",
        format: HermesJson,
        text: "Sure <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }\n\
               </tool_call>",
        content: "Sure <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }\n\
                  </tool_call>",
        calls: &[],
        warns: true,
    },
    Golden {
        what: "Hermes: no name, and an unclosed call, are content",
        format: HermesJson,
        text: "<tool_call>\n{\"arguments\": {}}\n</tool_call>\n<tool_call>\n\
               {\"name\": \"get_time\", \"arguments\": {}}",
        content: "<tool_call>\n{\"arguments\": {}}\n</tool_call>\n<tool_call>\n\
                  {\"name\": \"get_time\", \"arguments\": {}}",
        calls: &[],
        warns: true,
    },
    Golden {
        what: "Hermes: a bad call between good ones stays text, the good ones are calls",
        format: HermesJson,
        text: "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>\n\
               <tool_call>\nnot json\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \
               \"arguments\": {}}\n</tool_call>",
        content: "<tool_call>\nnot json\n</tool_call>",
        calls: &[("get_time", "{}"), ("get_time", "{}")],
        warns: true,
    },
    Golden {
        what: "Hermes: XML markup is plain text in this format",
        format: HermesJson,
        text: "<function=get_time>\n</function>",
        content: "<function=get_time>\n</function>",
        calls: &[],
        warns: false,
    },
];

fn parse(format: ToolCallFormat, text: &str) -> ParsedReply {
    parse_with_ids(format, text, &tools(), CallIds::seeded(42))
}

#[test]
fn golden_parses_follow_the_rules() {
    for g in GOLDENS {
        let r = parse(g.format, g.text);
        assert_eq!(r.content, g.content, "{}: content", g.what);
        let calls: Vec<(&str, &str)> = r
            .calls
            .iter()
            .map(|c| (c.name.as_str(), c.arguments.as_str()))
            .collect();
        assert_eq!(calls, g.calls, "{}: calls", g.what);
        assert_eq!(
            !r.warnings.is_empty(),
            g.warns,
            "{}: {:?}",
            g.what,
            r.warnings
        );
        for c in &r.calls {
            // OpenAI's shape: call_ + 24 alphanumerics, arguments a JSON object
            let id = c.id.strip_prefix("call_").expect("call_ prefix");
            assert!(id.len() == 24 && id.bytes().all(|b| b.is_ascii_alphanumeric()));
            let args: Value = serde_json::from_str(&c.arguments).unwrap();
            assert!(args.is_object(), "{}", g.what);
            let o = c.to_openai();
            assert_eq!(o["type"], "function");
            assert_eq!(o["function"]["arguments"], c.arguments.as_str());
        }
        let mut ids: Vec<&str> = r.calls.iter().map(|c| c.id.as_str()).collect();
        ids.dedup();
        assert_eq!(ids.len(), r.calls.len(), "{}: ids differ", g.what);
    }
}

#[test]
fn typed_values_warn_where_they_fall_back() {
    let r = parse(QwenXml, GOLDENS[5].text);
    let w = r.warnings.join("\n");
    for key in ["`u`", "`bad`", "`flag`", "`extra`", "`inf`"] {
        assert!(w.contains(key), "{key} in {w}");
    }
    for key in ["`i`", "`sn`", "`ref`", "`alias`"] {
        assert!(!w.contains(key), "{key} in {w}");
    }
}

#[test]
fn ids_are_reproducible_by_seed_and_differ_by_default() {
    let text = GOLDENS[3].text;
    let a = parse_with_ids(QwenXml, text, &[], CallIds::seeded(1));
    let b = parse_with_ids(QwenXml, text, &[], CallIds::seeded(1));
    assert_eq!(a, b);
    let c = mtp_chat::toolcall::parse(QwenXml, text, &[]);
    let d = mtp_chat::toolcall::parse(QwenXml, text, &[]);
    assert_ne!(c.calls[0].id, d.calls[0].id);
}

// ---------------------------------------------------------------------------------------
// Streaming
// ---------------------------------------------------------------------------------------

/// Streams `pieces`; returns the reply the events add up to, checking on the way the shape
/// OpenAI streams: a call's first delta has its id and name and empty arguments, later
/// ones neither, and indexes come in order.
fn stream(format: ToolCallFormat, pieces: &[&str], seed: u64) -> ParsedReply {
    let mut s = ToolCallStream::with_ids(format, &tools(), CallIds::seeded(seed));
    let mut events = Vec::new();
    for p in pieces {
        events.extend(s.push(p));
    }
    events.extend(s.finish());
    assert!(s.push("more").is_empty() && s.finish().is_empty());
    let mut r = ParsedReply::default();
    for e in events {
        match e {
            StreamEvent::Content(t) => {
                assert!(!t.is_empty());
                r.content.push_str(&t);
            }
            StreamEvent::ToolCallDelta {
                index,
                id,
                name,
                arguments,
            } => {
                if index == r.calls.len() {
                    assert!(arguments.is_empty(), "first delta has empty arguments");
                    r.calls.push(mtp_chat::ToolCall {
                        id: id.expect("first delta has the id"),
                        name: name.expect("first delta has the name"),
                        arguments,
                    });
                } else {
                    assert_eq!(index + 1, r.calls.len(), "deltas of the latest call only");
                    assert!(id.is_none() && name.is_none());
                    r.calls[index].arguments.push_str(&arguments);
                }
            }
        }
    }
    r
}

/// Cuts `text` at `cuts` (byte offsets on char boundaries, ascending).
fn cut<'a>(text: &'a str, cuts: &[usize]) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut at = 0;
    for &c in cuts {
        out.push(&text[at..c]);
        at = c;
    }
    out.push(&text[at..]);
    out
}

/// A small deterministic generator for the random splits (no dependency for it).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn random_cuts(text: &str, rng: &mut Lcg) -> Vec<usize> {
    let bounds: Vec<usize> = (1..text.len())
        .filter(|&i| text.is_char_boundary(i))
        .collect();
    let mut cuts: Vec<usize> = bounds
        .iter()
        .copied()
        .filter(|_| rng.below(4) == 0)
        .collect();
    if rng.below(3) == 0 {
        cuts = bounds; // one character at a time
    }
    cuts
}

fn same(format: ToolCallFormat, text: &str, pieces: &[&str]) {
    let whole = parse_with_ids(format, text, &tools(), CallIds::seeded(7));
    let streamed = stream(format, pieces, 7);
    assert_eq!(
        streamed.content, whole.content,
        "content of {text:?} cut as {pieces:?}"
    );
    assert_eq!(
        streamed.calls, whole.calls,
        "calls of {text:?} cut as {pieces:?}"
    );
}

#[test]
fn streaming_equals_the_whole_parse_at_every_split() {
    let mut rng = Lcg(2024);
    for g in GOLDENS {
        let bounds: Vec<usize> = (1..g.text.len())
            .filter(|&i| g.text.is_char_boundary(i))
            .collect();
        for &b in &bounds {
            same(g.format, g.text, &cut(g.text, &[b]));
        }
        for _ in 0..40 {
            let cuts = random_cuts(g.text, &mut rng);
            same(g.format, g.text, &cut(g.text, &cuts));
        }
    }
}

#[test]
fn streaming_equals_the_whole_parse_on_random_markup() {
    // fragments that make every state of the reader meet every other
    const PARTS: &[&str] = &[
        "<tool_call>",
        "</tool_call>",
        "<function=get_weather>",
        "<function=",
        "get_time>",
        "</function>",
        "<parameter=city>",
        "<parameter=days>",
        "<parameter=",
        "</parameter>",
        "\n",
        "\n\n",
        " ",
        "Paris",
        "3",
        "東京",
        "{\"name\": \"get_time\", \"arguments\": {}}",
        "{\"name\": ",
        "<",
        ">",
        "=",
        "<tool_",
        "</",
        "x\u{3000}",
    ];
    let mut rng = Lcg(99);
    for round in 0..1500 {
        let n = 1 + rng.below(14);
        let text: String = (0..n).map(|_| PARTS[rng.below(PARTS.len())]).collect();
        let format = if round % 2 == 0 { QwenXml } else { HermesJson };
        let cuts = random_cuts(&text, &mut rng);
        same(format, &text, &cut(&text, &cuts));
        // every call's arguments are a JSON object, whatever the text
        for c in parse(format, &text).calls {
            let v: Value = serde_json::from_str(&c.arguments)
                .unwrap_or_else(|e| panic!("{text:?}: {} ({e})", c.arguments));
            assert!(v.is_object());
        }
    }
}

#[test]
fn a_stream_sends_the_call_before_it_ends_and_never_leaks_markup() {
    let text = GOLDENS[0].text;
    let mut s = ToolCallStream::with_ids(QwenXml, &tools(), CallIds::seeded(3));
    let mut seen_header_at = None;
    let mut first_param_at = None;
    let mut content = String::new();
    let mut at = 0;
    for ch in text.chars() {
        at += ch.len_utf8();
        for e in s.push(ch.encode_utf8(&mut [0; 4])) {
            match e {
                StreamEvent::Content(t) => content.push_str(&t),
                StreamEvent::ToolCallDelta { id: Some(_), .. } => seen_header_at = Some(at),
                StreamEvent::ToolCallDelta { arguments, .. } => {
                    if first_param_at.is_none() {
                        assert_eq!(arguments, r#"{"city": "Paris""#);
                        first_param_at = Some(at);
                    }
                }
            }
            assert!(!content.contains('<'), "markup leaked: {content:?}");
        }
    }
    // the header as soon as `<function=get_weather>` is read; a parameter when it closes
    let header = text.find("<function=get_weather>").unwrap() + "<function=get_weather>".len();
    assert_eq!(seen_header_at, Some(header));
    let first_close = text.find("</parameter>").unwrap() + "</parameter>".len();
    assert_eq!(first_param_at, Some(first_close));
    assert_eq!(content, "Let me check the weather.");
    assert_eq!(s.calls(), 1);
    let rest = s.finish();
    assert_eq!(
        rest,
        vec![],
        "everything was sent when </tool_call> arrived"
    );
}

#[test]
fn events_are_openai_deltas() {
    let mut s = ToolCallStream::with_ids(HermesJson, &tools(), CallIds::seeded(5));
    let events =
        s.push("Hi <tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>");
    assert_eq!(events[0].to_openai(), json!({"content": "Hi"}));
    let first = events[1].to_openai();
    let call = &first["tool_calls"][0];
    assert_eq!(call["index"], 0);
    assert_eq!(call["type"], "function");
    assert!(call["id"].as_str().unwrap().starts_with("call_"));
    assert_eq!(
        call["function"],
        json!({"name": "get_time", "arguments": ""})
    );
    assert_eq!(
        events[2].to_openai(),
        json!({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]})
    );
}

// ---------------------------------------------------------------------------------------
// Forced-call grammars
// ---------------------------------------------------------------------------------------

fn check(grammar: &str, text: &str) -> Check {
    check_text(&ResponseFormat::grammar(grammar), text).unwrap_or_else(|e| panic!("{e}\n{grammar}"))
}

fn follows(grammar: &str, text: &str) -> bool {
    check(grammar, text) == Check::Follows
}

/// Calls written as Qwen3.5's template writes them (`tojson` for objects and arrays, the
/// value as text otherwise).
const XML_ACCEPTED: &[(&str, &str, &str)] = &[
    (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n\
         </function>\n</tool_call>",
        "get_weather",
        r#"{"city": "Paris"}"#,
    ),
    (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nSão Paulo\nand a 2nd line\n\
         </parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=unit>\nfahrenheit\n\
         </parameter>\n</function>\n</tool_call>",
        "get_weather",
        r#"{"city": "São Paulo\nand a 2nd line", "days": 3, "unit": "fahrenheit"}"#,
    ),
    (
        "<tool_call>\n<function=search>\n<parameter=query>\na <b> tag & </param\n</parameter>\n\
         <parameter=filters>\n{\"tags\": [\"x\", \"y\"]}\n</parameter>\n<parameter=limit>\n\
         20\n</parameter>\n</function>\n</tool_call>",
        "search",
        r#"{"query": "a <b> tag & </param", "filters": {"tags": ["x", "y"]}, "limit": 20}"#,
    ),
    (
        "<tool_call>\n<function=get_time>\n</function>\n</tool_call>",
        "get_time",
        "{}",
    ),
    (
        "<tool_call>\n<function=write_file>\n<parameter=path>\na.txt\n</parameter>\n\
         <parameter=content>\n\n</parameter>\n</function>\n</tool_call>",
        "write_file",
        r#"{"path": "a.txt", "content": ""}"#,
    ),
];

const XML_REFUSED: &[(&str, &str)] = &[
    (
        "a required parameter missing",
        "<tool_call>\n<function=get_weather>\n<parameter=days>\n3\n</parameter>\n</function>\n\
         </tool_call>",
    ),
    (
        "parameters out of the schema's order",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n\
         <parameter=unit>\ncelsius\n</parameter>\n<parameter=days>\n3\n</parameter>\n\
         </function>\n</tool_call>",
    ),
    (
        "an integer that is not one",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n\
         <parameter=days>\nthree\n</parameter>\n</function>\n</tool_call>",
    ),
    (
        "a schema bound broken (minimum 1)",
        "<tool_call>\n<function=search>\n<parameter=query>\nq\n</parameter>\n\
         <parameter=limit>\n0\n</parameter>\n</function>\n</tool_call>",
    ),
    (
        "a value outside its enum",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n\
         <parameter=unit>\nkelvin\n</parameter>\n</function>\n</tool_call>",
    ),
    (
        "a text value holding markup that would end it",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis</function>\n\
         </parameter>\n</function>\n</tool_call>",
    ),
    (
        "a parameter the schema does not have",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n\
         <parameter=zip>\n75001\n</parameter>\n</function>\n</tool_call>",
    ),
    (
        "a function that is not a tool",
        "<tool_call>\n<function=launch>\n</function>\n</tool_call>",
    ),
    (
        "text before the call",
        "Sure! <tool_call>\n<function=get_time>\n</function>\n</tool_call>",
    ),
    (
        "JSON where the template writes XML",
        "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>",
    ),
];

#[test]
fn xml_grammar_accepts_the_templates_calls_and_refuses_bad_ones() {
    let tools = tools();
    let g = call_grammar(QwenXml, &tools, Forced::Required, false).unwrap();
    for (text, name, arguments) in XML_ACCEPTED {
        assert_eq!(check(&g, text), Check::Follows, "{text}\n{g}");
        // and the parser reads back what the grammar let through
        let r = parse(QwenXml, text);
        assert_eq!(r.content, "");
        assert_eq!(r.calls.len(), 1);
        assert_eq!(
            (r.calls[0].name.as_str(), r.calls[0].arguments.as_str()),
            (*name, *arguments)
        );
    }
    for (what, text) in XML_REFUSED {
        assert!(
            matches!(check(&g, text), Check::Leaves { .. }),
            "{what}: {:?}",
            check(&g, text)
        );
    }
    // a call is not finished until </tool_call>
    assert_eq!(
        check(&g, "<tool_call>\n<function=get_time>\n</function>\n"),
        Check::Unfinished
    );
}

#[test]
fn grammars_take_one_call_unless_parallel_and_the_named_one_only() {
    let tools = tools();
    let one = XML_ACCEPTED[0].0;
    let other = XML_ACCEPTED[3].0;
    let two = format!("{one}\n{other}");
    let single = call_grammar(QwenXml, &tools, Forced::Required, false).unwrap();
    assert!(matches!(check(&single, &two), Check::Leaves { .. }));
    let parallel = call_grammar(QwenXml, &tools, Forced::Required, true).unwrap();
    assert!(follows(&parallel, &two));
    assert!(follows(&parallel, one));
    assert_eq!(parse(QwenXml, &two).calls.len(), 2);
    let named = call_grammar(QwenXml, &tools, Forced::Named("get_time".into()), true).unwrap();
    assert!(follows(&named, other));
    assert!(follows(&named, &format!("{other}\n{other}")));
    assert!(matches!(check(&named, one), Check::Leaves { .. }));
}

#[test]
fn hermes_grammar_embeds_each_schema() {
    let tools = tools();
    let g = call_grammar(HermesJson, &tools, Forced::Required, true).unwrap();
    // as Qwen2.5's template writes calls: tojson spacing, calls joined by a newline
    let accepted = [
        (
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \
             \"days\": 3}}\n</tool_call>",
            r#"{"city": "Paris", "days": 3}"#,
        ),
        (
            "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"a </parameter>\", \
             \"filters\": {\"tags\": [\"x\"]}}}\n</tool_call>",
            r#"{"query": "a </parameter>", "filters": {"tags": ["x"]}}"#,
        ),
        (
            "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>",
            "{}",
        ),
    ];
    for (text, arguments) in accepted {
        assert!(follows(&g, text), "{text}\n{g}");
        let r = parse(HermesJson, text);
        assert_eq!(r.calls.len(), 1);
        assert_eq!(r.calls[0].arguments, arguments);
    }
    let both = format!("{}\n{}", accepted[0].0, accepted[2].0);
    assert!(follows(&g, &both));
    assert_eq!(parse(HermesJson, &both).calls.len(), 2);
    for (what, text) in [
        (
            "a required argument missing",
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"days\": 3}}\n</tool_call>",
        ),
        (
            "a wrong type",
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": 7}}\n</tool_call>",
        ),
        (
            "an unknown function",
            "<tool_call>\n{\"name\": \"launch\", \"arguments\": {}}\n</tool_call>",
        ),
        (
            "blanks other than tojson's",
            "<tool_call>\n{\"name\": \"get_time\", \"arguments\":{}}\n</tool_call>",
        ),
        (
            "text before the call",
            "ok <tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>",
        ),
    ] {
        assert!(matches!(check(&g, text), Check::Leaves { .. }), "{what}");
    }
}

#[test]
fn grammars_follow_refs_and_type_lists() {
    let tools = [tool(
        "plot",
        json!({"type": "object",
            "$defs": {"Point": {"type": "object", "properties": {"x": {"type": "number"}},
                                "required": ["x"]}},
            "properties": {
                "at": {"$ref": "#/$defs/Point"},
                "label": {"type": ["string", "null"]},
                "size": {"type": ["integer", "null"]}
            },
            "required": ["at", "label", "size"]}),
    )];
    let xml = call_grammar(QwenXml, &tools, Forced::Named("plot".into()), false).unwrap();
    let text = "<tool_call>\n<function=plot>\n<parameter=at>\n{\"x\": 1.5}\n</parameter>\n\
                <parameter=label>\nnull\n</parameter>\n<parameter=size>\nnull\n</parameter>\n\
                </function>\n</tool_call>";
    assert!(follows(&xml, text), "{xml}");
    let r = parse_with_ids(QwenXml, text, &tools, CallIds::seeded(0));
    assert_eq!(
        r.calls[0].arguments,
        r#"{"at": {"x": 1.5}, "label": null, "size": null}"#
    );
    assert!(matches!(
        check(&xml, &text.replace("{\"x\": 1.5}", "{\"y\": 1}")),
        Check::Leaves { .. }
    ));
    let hermes = call_grammar(HermesJson, &tools, Forced::Required, false).unwrap();
    assert!(follows(
        &hermes,
        "<tool_call>\n{\"name\": \"plot\", \"arguments\": {\"at\": {\"x\": 2}, \"label\": \"a\", \
         \"size\": 3}}\n</tool_call>"
    ));
}

#[test]
fn grammar_errors_are_typed() {
    let tools = tools();
    assert_eq!(
        call_grammar(QwenXml, &tools, Forced::Named("launch".into()), false),
        Err(ToolCallError::UnknownTool("launch".into()))
    );
    assert_eq!(
        call_grammar(HermesJson, &[], Forced::Required, false),
        Err(ToolCallError::NoTools)
    );
    let odd = [tool("a>b", json!({"type": "object"}))];
    assert_eq!(
        call_grammar(QwenXml, &odd, Forced::Required, false),
        Err(ToolCallError::Unwritable("a>b".into()))
    );
    // JSON carries any name
    let g = call_grammar(HermesJson, &odd, Forced::Required, false).unwrap();
    assert!(follows(
        &g,
        "<tool_call>\n{\"name\": \"a>b\", \"arguments\": {}}\n</tool_call>"
    ));
    let odd_key = [tool(
        "f",
        json!({"type": "object", "properties": {"new\nline": {"type": "string"}}}),
    )];
    assert!(matches!(
        call_grammar(QwenXml, &odd_key, Forced::Required, false),
        Err(ToolCallError::Unwritable(_))
    ));
}

#[test]
fn a_schema_that_branches_on_itself_is_read_in_its_size() {
    use std::time::{Duration, Instant};
    // issue 62: eight `$ref`s back to the same `anyOf` once cost k^17 paths
    let branches = vec![json!({"$ref": "#/$defs/a"}); 8];
    let tools = [
        json!({"type": "function", "function": {"name": "f", "parameters":
        {"type": "object", "$defs": {"a": {"anyOf": branches}},
         "properties": {"x": {"$ref": "#/$defs/a"}}}}}),
    ];
    let started = Instant::now();
    assert!(mtp_chat::toolcall::check_tool_schemas(&tools).is_ok());
    assert!(call_grammar(ToolCallFormat::HermesJson, &tools, Forced::Required, false).is_ok());
    // the XML format writes `x` as text, whose schema is nothing but a reference to itself:
    // refused, as quickly
    assert!(matches!(
        call_grammar(ToolCallFormat::QwenXml, &tools, Forced::Required, false),
        Err(ToolCallError::Unsupported {
            why: mtp_chat::toolcall::Unsupported::Recursive,
            ..
        })
    ));
    let text =
        "<tool_call>\n<function=f>\n<parameter=x>\nhello\n</parameter>\n</function>\n</tool_call>";
    let reply = mtp_chat::toolcall::parse(ToolCallFormat::QwenXml, text, &tools);
    assert_eq!(reply.calls.len(), 1);
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
}

// ---------------------------------------------------------------------------------------
// Forced XML values honour the whole schema (checked against the `jsonschema` crate)
// ---------------------------------------------------------------------------------------

/// The reference validator, with `format` asserted.
fn validator(schema: &Value) -> jsonschema::Validator {
    jsonschema::options()
        .should_validate_formats(true)
        .build(schema)
        .expect("the reference validator compiles")
}

fn string_tools() -> Vec<Value> {
    vec![tool(
        "pick",
        json!({"type": "object", "properties": {
            "code": {"type": "string", "maxLength": 5, "pattern": "^[a-z]+$"},
            "color": {"enum": ["red", "green", "blue"]},
            "day": {"type": "string", "format": "date"},
            "id": {"type": "string", "format": "uuid"},
            "tag": {"type": "string", "pattern": "a/b"},
            "word": {"type": "string", "minLength": 2},
            "opt": {"type": ["string", "null"], "maxLength": 3},
            "n": {"anyOf": [{"type": "string", "pattern": "^x"},
                            {"type": "integer", "minimum": 5}]},
            "both": {"allOf": [{"type": "string", "pattern": "^a"}, {"pattern": "z$"}]}
        }, "required": ["code", "color", "day", "id", "tag", "word"]}),
    )]
}

/// A `pick` call with `value` for `key` and valid values for the other required parameters.
fn pick_call(key: &str, value: &str) -> String {
    let base = [
        ("code", "abc"),
        ("color", "red"),
        ("day", "2024-02-29"),
        ("id", "123e4567-e89b-12d3-a456-426614174000"),
        ("tag", "xa/by"),
        ("word", "hi"),
        ("opt", ""),
        ("n", ""),
        ("both", ""),
    ];
    let mut text = String::from("<tool_call>\n<function=pick>\n");
    for (k, v) in base {
        let v = if k == key { value } else { v };
        if k == key || !["opt", "n", "both"].contains(&k) {
            text.push_str(&format!("<parameter={k}>\n{v}\n</parameter>\n"));
        }
    }
    text.push_str("</function>\n</tool_call>");
    text
}

#[test]
fn xml_values_follow_the_whole_string_schema() {
    let tools = string_tools();
    let g = call_grammar(QwenXml, &tools, Forced::Required, false).unwrap();
    let schema = tools[0]["function"]["parameters"].clone();
    let reference = validator(&schema);
    // (parameter, value, whether the schema accepts what the parser reads back)
    let cases: &[(&str, &str, bool)] = &[
        ("code", "abc", true),
        ("code", "abcde", true),
        ("code", "abcdef", false),
        ("code", "Abc", false),
        ("code", "", false),
        ("code", "ab1", false),
        ("code", "añb", false),
        ("code", "ab\nc", false),
        ("color", "green", true),
        ("color", "Red", false),
        ("color", "reds", false),
        ("color", "", false),
        ("day", "2024-02-29", true),
        ("day", "2024-13-01", false),
        ("day", "2024-1-01", false),
        ("day", " 2024-02-29", false),
        ("id", "123e4567e89b12d3a456426614174000", false),
        ("tag", "a/b", true),
        ("tag", "--a/b--", true),
        ("tag", "a b", false),
        ("word", "日本", true),
        ("word", "日", false),
        ("word", "h", false),
        ("opt", "null", true),
        ("opt", "abc", true),
        ("opt", "nul", true),
        ("opt", "nullable", false),
        ("opt", "abcd", false),
        ("n", "xyz", true),
        ("n", "7", true),
        ("n", "3", false),
        ("n", "y", false),
        ("both", "abcz", true),
        ("both", "az", true),
        ("both", "abc", false),
        ("both", "bz", false),
    ];
    for (key, value, valid) in cases {
        let text = pick_call(key, value);
        let r = parse_with_ids(QwenXml, &text, &tools, CallIds::seeded(0));
        assert_eq!(r.calls.len(), 1, "{text}");
        let args: Value = serde_json::from_str(&r.calls[0].arguments).unwrap();
        assert_eq!(
            reference.is_valid(&args),
            *valid,
            "{key} = {value:?}: the reference reads {args}"
        );
        assert_eq!(
            follows(&g, &text),
            *valid,
            "{key} = {value:?} ({args}): {:?}\n{g}",
            check(&g, &text)
        );
    }
}

#[test]
fn what_the_grammar_lets_through_the_reference_accepts() {
    // every value the grammar accepts reads back as arguments the schema accepts, including
    // the texts it refuses only because the parser would read them as another type
    let tools = string_tools();
    let g = call_grammar(QwenXml, &tools, Forced::Required, false).unwrap();
    let reference = validator(&tools[0]["function"]["parameters"]);
    let values = [
        "",
        "a",
        "abc",
        "null",
        "NULL",
        "Null",
        " null",
        "null\nx",
        "1",
        "7",
        "07",
        " 7 ",
        "-7",
        "5.0",
        "x1",
        "true",
        "{}",
        "[1]",
        "\"x\"",
        "a/b",
        "</parameter>",
        "abcz",
        "日本語",
    ];
    for key in ["code", "color", "tag", "word", "opt", "n", "both"] {
        for v in values {
            let text = pick_call(key, v);
            if follows(&g, &text) {
                let r = parse_with_ids(QwenXml, &text, &tools, CallIds::seeded(0));
                let args: Value = serde_json::from_str(&r.calls[0].arguments).unwrap();
                assert!(reference.is_valid(&args), "{key} = {v:?} read as {args}");
            }
        }
    }
}

#[test]
fn formats_mean_what_llguidance_json_means() {
    // the XML value of a `format` accepts exactly the strings llguidance's JSON compiler
    // accepts as that format (the table is a copy of llguidance's)
    let samples = [
        "2024-02-29",
        "2024-02-30",
        "2024-02-29T12:30:00Z",
        "2024-02-29T12:30:00.5+01:00",
        "12:30:00Z",
        "12:30",
        "P1Y2M",
        "PT5S",
        "a.b@example.com",
        "a@b@c",
        "example.com",
        "-bad.com",
        "192.168.0.1",
        "256.1.1.1",
        "::1",
        "2001:db8::8a2e:370:7334",
        "123e4567-e89b-12d3-a456-426614174000",
        "123e4567-e89b-12d3-a456",
        "https://example.com/a/b?c=d#e",
        "not a uri",
        "",
    ];
    for format in [
        "date-time",
        "date",
        "time",
        "duration",
        "email",
        "hostname",
        "ipv4",
        "ipv6",
        "uuid",
        "uri",
    ] {
        let tools = [tool(
            "f",
            json!({"type": "object", "properties": {"s": {"type": "string", "format": format}},
                   "required": ["s"]}),
        )];
        let xml = call_grammar(QwenXml, &tools, Forced::Required, false).unwrap();
        let hermes = call_grammar(HermesJson, &tools, Forced::Required, false).unwrap();
        for s in samples {
            let x = format!(
                "<tool_call>\n<function=f>\n<parameter=s>\n{s}\n</parameter>\n</function>\n</tool_call>"
            );
            let h = format!(
                "<tool_call>\n{{\"name\": \"f\", \"arguments\": {{\"s\": {}}}}}\n</tool_call>",
                serde_json::to_string(s).unwrap()
            );
            assert_eq!(follows(&xml, &x), follows(&hermes, &h), "{format}: {s:?}");
        }
    }
}

#[test]
fn strict_arguments_are_exact() {
    let loose = tool(
        "f",
        json!({"type": "object", "properties": {"a": {"type": "integer"},
               "o": {"type": "object", "properties": {"x": {"type": "integer"}}}},
               "required": ["a"]}),
    );
    let mut strict = loose.clone();
    strict["function"]["strict"] = json!(true);
    let extra = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>";
    let nested =
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1, \"o\": {\"x\": 1, \"y\": 2}}}\n</tool_call>";
    let exact = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1, \"o\": {\"x\": 1}}}\n</tool_call>";
    let g = call_grammar(
        HermesJson,
        std::slice::from_ref(&loose),
        Forced::Required,
        false,
    )
    .unwrap();
    assert!(follows(&g, extra) && follows(&g, nested) && follows(&g, exact));
    let g = call_grammar(
        HermesJson,
        std::slice::from_ref(&strict),
        Forced::Required,
        false,
    )
    .unwrap();
    assert!(!follows(&g, extra) && !follows(&g, nested) && follows(&g, exact));
    // XML writes only the schema's properties; nested objects are closed under strict too
    let x = |o: &str| {
        format!(
            "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n<parameter=o>\n{o}\n\
             </parameter>\n</function>\n</tool_call>"
        )
    };
    let g = call_grammar(QwenXml, &[loose], Forced::Required, false).unwrap();
    assert!(follows(&g, &x("{\"x\": 1, \"y\": 2}")));
    let g = call_grammar(
        QwenXml,
        std::slice::from_ref(&strict),
        Forced::Required,
        false,
    )
    .unwrap();
    assert!(!follows(&g, &x("{\"x\": 1, \"y\": 2}")));
    assert!(follows(&g, &x("{\"x\": 1}")));
    // a required parameter the strict schema does not describe cannot be written
    let mut undescribed = strict;
    undescribed["function"]["parameters"]["required"] = json!(["a", "zz"]);
    assert!(matches!(
        call_grammar(QwenXml, &[undescribed], Forced::Required, false),
        Err(ToolCallError::Unsupported { .. })
    ));
}

#[test]
fn schemas_the_xml_format_cannot_honour_are_typed_errors() {
    use mtp_chat::toolcall::Unsupported;
    let one = |s: Value| {
        call_grammar(
            QwenXml,
            &[tool("f", json!({"type": "object", "properties": {"s": s}}))],
            Forced::Required,
            false,
        )
    };
    let why = |r: Result<String, ToolCallError>| match r {
        Err(ToolCallError::Unsupported { why, .. }) => why,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        why(one(json!({"type": "string", "format": "password"}))),
        Unsupported::Format("password".into())
    );
    assert!(matches!(
        why(one(json!({"type": "string", "pattern": "(a"}))),
        Unsupported::Pattern { .. }
    ));
    assert!(matches!(
        why(one(json!({"type": "string", "pattern": "a(?=b)"}))),
        Unsupported::Pattern { .. }
    ));
    assert_eq!(
        why(one(json!({"type": "string", "pattern": "(^a|b)"}))),
        Unsupported::PatternAnchor("(^a|b)".into())
    );
    assert_eq!(
        why(one(json!({"type": "string", "not": {"const": "x"}}))),
        Unsupported::Keyword("not".into())
    );
    assert_eq!(
        why(one(json!({"type": "string", "maxLength": "5"}))),
        Unsupported::Keyword("maxLength".into())
    );
    assert_eq!(
        why(one(
            json!({"type": "string", "minLength": 3, "maxLength": 2})
        )),
        Unsupported::Unsatisfiable
    );
    assert_eq!(
        why(one(json!({"type": "string", "const": 5}))),
        Unsupported::Unsatisfiable
    );
    assert_eq!(
        why(one(json!({"$ref": "#/$defs/missing"}))),
        Unsupported::Ref("#/$defs/missing".into())
    );
    let root = call_grammar(
        QwenXml,
        &[tool(
            "f",
            json!({"anyOf": [{"type": "object"}, {"type": "null"}]}),
        )],
        Forced::Required,
        false,
    );
    assert!(matches!(
        root,
        Err(ToolCallError::ArgumentsKeyword { keyword, .. }) if keyword == "anyOf"
    ));
    // errors name the tool and the parameter, as a 400 shows them
    let msg = one(json!({"type": "string", "format": "password"}))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("parameter `s` of tool `f`") && msg.contains("password"),
        "{msg}"
    );
}
