//! The in-process `gguf` provider (feature `gguf`, issue 8) on real GGUF files converted at
//! test time from the tiny checkpoints (by the converter behind `cargo xtask gguf`, included
//! by path): MTP greedy output equals target-only greedy output and the reference greedy
//! tokens, the report carries llama.cpp's real counts, and the lane rules hold.
#![cfg(feature = "gguf")]

#[path = "../../../xtask/src/gguf/convert.rs"]
#[allow(dead_code)]
mod convert;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::StreamExt;
use mtp_contract::{
    FinishReason, GenerateRequest, Provider, ProviderError, ProviderOptions, Reason, Sampling,
    Speculation, StreamEvent,
};
use serde_json::Value;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn to_gguf(dir: &Path, out_dir: &Path, no_mtp: bool) -> PathBuf {
    let name = dir
        .file_name()
        .expect("dir name")
        .to_string_lossy()
        .into_owned();
    let out = out_dir.join(format!("{name}{}.gguf", if no_mtp { "-nomtp" } else { "" }));
    let opts = convert::ConvertOptions {
        no_mtp,
        ..Default::default()
    };
    convert::convert(dir, &out, &opts).unwrap_or_else(|e| panic!("convert {}: {e}", dir.display()));
    out
}

fn greedy() -> Sampling {
    Sampling {
        temperature: Some(0.0),
        ..Default::default()
    }
}

fn provider(path: &Path, spec: Speculation) -> Arc<dyn Provider> {
    let opts = ProviderOptions::default()
        .speculation(spec)
        .extra("n_ctx", "512")
        .extra("threads", "2");
    mtp_runtimes::gguf::create(path.to_str().expect("utf-8 path"), &opts)
        .expect("create gguf provider")
}

fn golden_text(ids: &Value) -> String {
    let bytes: Vec<u8> = ids
        .as_array()
        .expect("ids")
        .iter()
        .filter_map(|v| v.as_u64().and_then(|v| u8::try_from(v).ok()))
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The first index where two strings differ, with a little context, for the report.
fn first_divergence(a: &str, b: &str) -> Option<(usize, String, String)> {
    let (ab, bb) = (a.as_bytes(), b.as_bytes());
    let i = ab
        .iter()
        .zip(bb)
        .position(|(x, y)| x != y)
        .or_else(|| (ab.len() != bb.len()).then(|| ab.len().min(bb.len())))?;
    let ctx = |s: &[u8]| {
        String::from_utf8_lossy(&s[i.saturating_sub(8)..(i + 8).min(s.len())]).into_owned()
    };
    Some((i, ctx(ab), ctx(bb)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtp_in_process_matches_target_only_and_the_reference() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = workspace().join("tests/fixtures/tiny-trained");
    let gguf = to_gguf(&dir, tmp.path(), false);
    let gold: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("golden.json")).expect("golden"))
            .expect("json");
    let p = provider(&gguf, Speculation::native_mtp());
    assert_eq!(p.name(), "gguf");
    assert_eq!(p.capabilities().runtime, "llama.cpp b11434");
    let st = p.speculation_status();
    assert!(st.lane_loaded, "{st:?}");
    assert_eq!(st.num_draft_tokens, Some(3));

    let prompts = gold["prompts"].as_array().expect("prompts");
    for (i, prompt) in prompts.iter().enumerate() {
        let prompt = prompt.as_str().expect("prompt");
        let base = GenerateRequest::new(prompt)
            .raw()
            .max_output_tokens(64)
            .sampling(greedy());
        let off = p
            .generate(base.clone().speculation(false))
            .await
            .expect("target-only");
        assert!(!off.metadata.speculation.used);
        assert_eq!(
            off.metadata.speculation.reason,
            Some(Reason::DisabledByRequest)
        );
        for depth in [1u32, 3, 5] {
            let on = p
                .generate(
                    base.clone()
                        .speculation(Speculation::depth(depth).expect("depth")),
                )
                .await
                .expect("mtp");
            let s = &on.metadata.speculation;
            assert!(s.used, "{s:?}");
            assert_eq!(s.runtime, "llama.cpp b11434");
            assert_eq!(s.num_draft_tokens, Some(depth));
            let (drafted, accepted, rounds) =
                (s.drafted.unwrap(), s.accepted.unwrap(), s.rounds.unwrap());
            assert!(drafted > 0 && rounds > 0 && accepted <= drafted, "{s:?}");
            assert!(drafted <= rounds * u64::from(depth), "{s:?}");
            assert_eq!(
                on.content, off.content,
                "prompt {i}, depth {depth}: MTP changed greedy output"
            );
            assert_eq!(on.token_ids, off.token_ids);
            assert_eq!(on.finish_reason, FinishReason::Length);
            eprintln!(
                "prompt {i} depth {depth}: drafted {drafted} accepted {accepted} rounds {rounds} (rate {:.3})",
                s.acceptance_rate.unwrap_or(0.0)
            );
            if depth == 1 {
                // The head was trained: most single proposals are right (mlx-vlm: ~0.85).
                assert!(accepted * 2 > drafted, "{s:?}");
            }
        }
        // The reference (mlx-vlm, which the native engine matches token for token).
        let want = golden_text(&gold["off"][i]);
        match first_divergence(&off.content, &want) {
            None => {}
            Some((at, ours, theirs)) => panic!(
                "prompt {i}: llama.cpp greedy diverges from the reference at byte {at}: {ours:?} vs {theirs:?}"
            ),
        }
    }

    // Streaming: the deltas add up to the final content, and the report arrives with it.
    let mut s = p
        .generate_stream(
            GenerateRequest::new("the quick brown fox ")
                .raw()
                .max_output_tokens(24)
                .sampling(greedy()),
        )
        .await
        .expect("stream");
    let (mut text, mut done, mut progress) = (String::new(), None, Vec::new());
    while let Some(ev) = s.next().await {
        match ev.expect("event") {
            StreamEvent::Delta { text: t, .. } => text.push_str(&t),
            StreamEvent::ToolCall(d) => panic!("no tools were offered: {d:?}"),
            StreamEvent::PromptProgress(p) => {
                assert!(
                    text.is_empty(),
                    "prompt progress after the reply began: {p:?}"
                );
                progress.push(p);
            }
            StreamEvent::Done(r) => done = Some(*r),
        }
    }
    let done = done.expect("done");
    assert_eq!(text, done.content);
    assert!(done.metadata.speculation.used);
    // the prompt's progress: its start, then all but the last token (which the first MTP
    // round computes) in
    let total = done.usage.input_tokens as usize;
    let seen: Vec<(usize, usize)> = progress.iter().map(|p| (p.total, p.processed)).collect();
    assert_eq!(seen, [(total, 0), (total, total - 1)]);

    // Penalties need target-only decoding; with require_acceleration they are refused.
    let pen = Sampling {
        repetition_penalty: Some(1.3),
        ..greedy()
    };
    let r = p
        .generate(
            GenerateRequest::new("the quick brown fox ")
                .raw()
                .max_output_tokens(8)
                .sampling(pen.clone()),
        )
        .await
        .expect("penalised");
    assert_eq!(
        r.metadata.speculation.reason,
        Some(Reason::SamplingRequiresTargetOnly)
    );
    let e = p
        .generate(
            GenerateRequest::new("x ")
                .raw()
                .max_output_tokens(8)
                .sampling(pen)
                .speculation(Speculation::native_mtp().with_require_acceleration(true)),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(e, ProviderError::SpeculationUnavailable { .. }),
        "{e}"
    );

    // Stop sequences cut the text.
    let r = p
        .generate(
            GenerateRequest::new(prompts[0].as_str().unwrap())
                .raw()
                .max_output_tokens(64)
                .sampling(greedy())
                .stop("dpm"),
        )
        .await
        .expect("stop");
    assert_eq!(r.finish_reason, FinishReason::Stop);
    assert!(!r.content.contains("dpm"), "{:?}", r.content);

    p.unload().await.expect("unload");
    let e = p
        .generate(GenerateRequest::new("x").raw())
        .await
        .unwrap_err();
    assert!(matches!(e, ProviderError::Unloaded { .. }), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gguf_without_a_head_runs_target_only() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let gguf = to_gguf(
        &workspace().join("tests/fixtures/tiny-trained"),
        tmp.path(),
        true,
    );
    let p = provider(&gguf, Speculation::native_mtp());
    let st = p.speculation_status();
    assert!(!st.lane_loaded);
    assert_eq!(st.reason, Some(Reason::NoMtpHead));
    let r = p
        .generate(
            GenerateRequest::new("the quick brown fox ")
                .raw()
                .max_output_tokens(16)
                .sampling(greedy()),
        )
        .await
        .expect("target-only");
    assert!(!r.metadata.speculation.used);
    assert_eq!(r.metadata.speculation.reason, Some(Reason::NoMtpHead));
    assert_eq!(r.usage.output_tokens, 16);
    let e = p
        .generate(
            GenerateRequest::new("x ")
                .raw()
                .speculation(Speculation::native_mtp().with_require_acceleration(true)),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            ProviderError::SpeculationUnavailable {
                reason: Reason::NoMtpHead,
                ..
            }
        ),
        "{e}"
    );
}

/// `create` must fail; the error it gives.
fn create_err(path: &str, opts: &ProviderOptions) -> ProviderError {
    match mtp_runtimes::gguf::create(path, opts) {
        Ok(p) => panic!(
            "{path}: expected an error, got a provider for {}",
            p.model()
        ),
        Err(e) => e,
    }
}

#[test]
fn bad_inputs_are_typed_errors() {
    let e = create_err("/nonexistent/model.gguf", &ProviderOptions::default());
    assert!(matches!(e, ProviderError::ModelLoad { .. }), "{e}");
    let tmp = tempfile::tempdir().expect("tempdir");
    let junk = tmp.path().join("junk.gguf");
    std::fs::write(&junk, b"GGUF but not really").expect("write");
    let e = create_err(junk.to_str().unwrap(), &ProviderOptions::default());
    assert!(matches!(e, ProviderError::ModelLoad { .. }), "{e}");
    let e = create_err(
        junk.to_str().unwrap(),
        &ProviderOptions::default().extra("device", "cuda"),
    );
    assert!(e.to_string().contains("n_ctx"), "{e}");
}

/// A constrained reply on the in-process lane: JSON valid against its schema (checked with
/// `jsonschema`), a regex and a Lark grammar whole matches (checked with the `regex` crate,
/// the grammar's language written as a regex), greedy output the same at every MTP depth as
/// target-only, the reply ending when the grammar is complete, the mask cost reported. A
/// format that does not compile is the request's fault, before anything is generated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn constrained_replies_follow_the_constraint_with_and_without_mtp() {
    use mtp_contract::ResponseFormat;
    let tmp = tempfile::tempdir().expect("tempdir");
    let gguf = to_gguf(
        &workspace().join("tests/fixtures/tiny-trained"),
        tmp.path(),
        false,
    );
    let p = provider(&gguf, Speculation::native_mtp());
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "word": {"type": "string", "pattern": "^[a-z]{1,6}$"},
            "n": {"type": "integer", "minimum": 0, "maximum": 99},
            "tags": {"type": "array", "items": {"enum": ["fox", "dog", "cat"]},
                     "minItems": 1, "maxItems": 3}
        },
        "required": ["word", "n", "tags"],
        "additionalProperties": false
    });
    let lark = "start: \"(\" num (\",\" num)* \")\"\nnum: /[0-9]{1,3}/";
    // (format, what checks a reply independently)
    type Check = Box<dyn Fn(&str) -> Result<(), String>>;
    let cases: Vec<(ResponseFormat, Check)> = vec![
        (ResponseFormat::json_schema(schema.clone()), {
            let v = jsonschema::validator_for(&schema).expect("schema");
            Box::new(move |s: &str| {
                let j: Value = serde_json::from_str(s).map_err(|e| format!("not JSON: {e}"))?;
                v.validate(&j).map_err(|e| e.to_string())
            })
        }),
        (
            ResponseFormat::regex("the (quick|lazy) [a-z]{2,5} (fox|dog)"),
            {
                let r = regex::Regex::new("^the (quick|lazy) [a-z]{2,5} (fox|dog)$").unwrap();
                Box::new(move |s: &str| r.is_match(s).then_some(()).ok_or("no match".into()))
            },
        ),
        (ResponseFormat::grammar(lark), {
            let r = regex::Regex::new(r"^\([0-9]{1,3}(,[0-9]{1,3})*\)$").unwrap();
            Box::new(move |s: &str| r.is_match(s).then_some(()).ok_or("no match".into()))
        }),
    ];
    for (format, check) in &cases {
        let base = GenerateRequest::new("the quick brown fox ")
            .raw()
            .max_output_tokens(160)
            .sampling(greedy())
            .response_format(format.clone());
        let off = p
            .generate(base.clone().speculation(false))
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", format.kind()));
        check(&off.content).unwrap_or_else(|e| panic!("{}: {:?}: {e}", format.kind(), off.content));
        assert_eq!(off.finish_reason, FinishReason::Stop, "{:?}", off.content);
        assert!(off.metadata.timings.constraint_ms.is_some());
        for depth in [1u32, 3] {
            let on = p
                .generate(
                    base.clone()
                        .speculation(Speculation::depth(depth).expect("depth")),
                )
                .await
                .unwrap_or_else(|e| panic!("{} depth {depth}: {e}", format.kind()));
            let s = &on.metadata.speculation;
            assert!(s.used, "{s:?}");
            assert_eq!(
                (on.content.as_str(), on.token_ids.as_ref()),
                (off.content.as_str(), off.token_ids.as_ref()),
                "{} depth {depth}: MTP changed constrained greedy output",
                format.kind()
            );
            assert_eq!(on.finish_reason, FinishReason::Stop);
            assert!(s.accepted.unwrap() <= s.drafted.unwrap(), "{s:?}");
        }
    }
    // seeded sampling under a constraint stays inside it, MTP on
    let seeded = Sampling {
        temperature: Some(0.9),
        seed: Some(7),
        ..Default::default()
    };
    let prefix = regex::Regex::new(r"^\(([0-9]{1,3},)*[0-9]{0,3}$").unwrap();
    for (format, check) in &cases {
        let r = p
            .generate(
                GenerateRequest::new("dyl aaza utpto ")
                    .raw()
                    .max_output_tokens(160)
                    .sampling(seeded.clone())
                    .response_format(format.clone()),
            )
            .await
            .unwrap_or_else(|e| panic!("{} seeded: {e}", format.kind()));
        // the JSON and the regex are bounded, so they end inside the budget; the Lark list
        // is not, and may run to it
        if format.kind() != "grammar" || r.finish_reason == FinishReason::Stop {
            assert_eq!(r.finish_reason, FinishReason::Stop, "{:?}", r.content);
            check(&r.content)
                .unwrap_or_else(|e| panic!("{} seeded: {:?}: {e}", format.kind(), r.content));
        } else {
            // cut by the budget: still a prefix of the grammar's language
            assert!(
                prefix.is_match(&r.content),
                "seeded grammar: {:?}",
                r.content
            );
        }
    }
    let e = p
        .generate(
            GenerateRequest::new("x")
                .raw()
                .response_format(ResponseFormat::regex("(unclosed")),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            ProviderError::InvalidRequest {
                field: "response_format",
                ..
            }
        ),
        "{e}"
    );
}

/// Two tools whose arguments are a city from a closed list (so a forced call is bounded).
fn city_tools() -> Vec<Value> {
    let city = serde_json::json!({"type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
        "required": ["city"]});
    vec![
        serde_json::json!({"type": "function", "function": {"name": "get_weather",
            "description": "Current weather in a city", "parameters": city}}),
        serde_json::json!({"type": "function", "function": {"name": "get_time",
            "description": "Local time in a city", "parameters": city}}),
    ]
}

/// The tiny checkpoint converted with `template` as its `chat_template`.
fn to_gguf_with_template(template: &str, work: &Path) -> PathBuf {
    let src = workspace().join("tests/fixtures/tiny-trained");
    let dir = work.join("tiny-tools");
    std::fs::create_dir_all(&dir).expect("mkdir");
    for f in [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
    ] {
        std::fs::copy(src.join(f), dir.join(f)).expect("copy checkpoint file");
    }
    let mut cfg: Value = serde_json::from_str(
        &std::fs::read_to_string(src.join("tokenizer_config.json")).expect("tokenizer_config"),
    )
    .expect("json");
    cfg["chat_template"] = Value::String(template.to_string());
    std::fs::write(
        dir.join("tokenizer_config.json"),
        serde_json::to_string(&cfg).expect("json"),
    )
    .expect("write tokenizer_config");
    to_gguf(&dir, work, false)
}

/// Tool calls on the in-process lane, read as the native provider reads them. The tiny
/// checkpoint's own template has no tool-call markup: a forced call is refused naming
/// `tool_choice`, and a request with tools under `auto` answers in text. Converted with a
/// Hermes template (Qwen2.5-7B-Instruct's, from mtp-chat's published templates), a forced call
/// decodes under the grammar of its markup: one call (`parallel_tool_calls: false`) to the
/// named or any offered tool, arguments valid against its schema, `finish_reason` `tool_calls`,
/// no markup in the content, the same tokens with MTP at depths 1 and 3 as target-only, and
/// streamed as `ToolCall` pieces that join to the final call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forced_tool_calls_decode_under_the_templates_markup() {
    use mtp_contract::ToolChoice;
    let tmp = tempfile::tempdir().expect("tempdir");

    // the plain template: no markup to force a call in
    let plain = provider(
        &to_gguf(
            &workspace().join("tests/fixtures/tiny-trained"),
            tmp.path(),
            false,
        ),
        Speculation::native_mtp(),
    );
    let ask = GenerateRequest::new("the quick brown fox ")
        .tools(city_tools())
        .max_output_tokens(12)
        .sampling(greedy());
    for choice in [
        ToolChoice::Required,
        ToolChoice::Function("get_time".into()),
    ] {
        match plain
            .generate(ask.clone().tool_choice(choice.clone()))
            .await
        {
            Err(ProviderError::InvalidRequest { field, .. }) => assert_eq!(field, "tool_choice"),
            other => panic!("{choice:?} on a template without markup: {other:?}"),
        }
        // a raw prompt has no template at all
        match plain
            .generate(ask.clone().tool_choice(choice.clone()).raw())
            .await
        {
            Err(ProviderError::InvalidRequest { field, .. }) => assert_eq!(field, "tool_choice"),
            other => panic!("raw {choice:?}: {other:?}"),
        }
    }
    let auto = plain.generate(ask.clone()).await.expect("auto with tools");
    assert!(auto.tool_calls.is_empty());
    assert!(!auto.content.is_empty());
    assert_eq!(auto.finish_reason, FinishReason::Length);
    drop(plain);

    // a Hermes template
    let template = std::fs::read_to_string(
        workspace().join("crates/mtp-chat/tests/templates/Qwen-Qwen2.5-7B-Instruct.jinja"),
    )
    .expect("template");
    let gguf = to_gguf_with_template(&template, tmp.path());
    let opts = ProviderOptions::default()
        .speculation(Speculation::native_mtp())
        .extra("n_ctx", "2048")
        .extra("threads", "2");
    let p = mtp_runtimes::gguf::create(gguf.to_str().expect("utf-8"), &opts).expect("create");
    let allowed = ["get_weather", "get_time"];
    for (choice, names) in [
        (ToolChoice::Required, &allowed[..]),
        (ToolChoice::Function("get_time".into()), &allowed[1..]),
    ] {
        let base = GenerateRequest::new("Weather in Paris?")
            .tools(city_tools())
            .tool_choice(choice.clone())
            .parallel_tool_calls(false)
            .max_output_tokens(160)
            .sampling(greedy());
        let off = p
            .generate(base.clone().speculation(false))
            .await
            .unwrap_or_else(|e| panic!("{choice:?}: {e}"));
        assert_eq!(off.tool_calls.len(), 1, "{choice:?}: {off:?}");
        let call = &off.tool_calls[0];
        assert!(names.contains(&call.function.name.as_str()), "{call:?}");
        let args: Value =
            serde_json::from_str(call.function.arguments.as_str().expect("string arguments"))
                .expect("arguments are JSON");
        assert!(
            matches!(args["city"].as_str(), Some("Paris" | "Rome")),
            "{args}"
        );
        assert!(call.id.is_some());
        assert_eq!(off.finish_reason, FinishReason::ToolCalls, "{off:?}");
        assert!(!off.content.contains("<tool_call>"), "{:?}", off.content);
        assert!(off.warnings.is_empty(), "{:?}", off.warnings);
        for depth in [1u32, 3] {
            let on = p
                .generate(
                    base.clone()
                        .speculation(Speculation::depth(depth).expect("depth")),
                )
                .await
                .unwrap_or_else(|e| panic!("{choice:?} depth {depth}: {e}"));
            assert!(on.metadata.speculation.used);
            assert_eq!(on.token_ids, off.token_ids, "{choice:?} depth {depth}");
            assert_eq!(
                on.tool_calls
                    .iter()
                    .map(|c| (&c.function.name, &c.function.arguments))
                    .collect::<Vec<_>>(),
                off.tool_calls
                    .iter()
                    .map(|c| (&c.function.name, &c.function.arguments))
                    .collect::<Vec<_>>()
            );
            assert_eq!(on.finish_reason, FinishReason::ToolCalls);
        }

        // streamed: the pieces join to the final call, and no markup goes out as text
        let mut s = p.generate_stream(base.clone()).await.expect("stream");
        let (mut text, mut pieces, mut done) = (String::new(), Vec::new(), None);
        while let Some(ev) = s.next().await {
            match ev.expect("event") {
                StreamEvent::Delta { text: t, .. } => text.push_str(&t),
                StreamEvent::ToolCall(d) => pieces.push(d),
                StreamEvent::PromptProgress(_) => {}
                StreamEvent::Done(r) => done = Some(*r),
            }
        }
        let done = done.expect("done");
        assert_eq!(text, done.content);
        assert_eq!(done.tool_calls.len(), 1);
        assert!(pieces.iter().all(|d| d.index == 0), "{pieces:?}");
        assert_eq!(
            pieces[0].name.as_deref(),
            Some(done.tool_calls[0].function.name.as_str())
        );
        assert_eq!(pieces[0].id, done.tool_calls[0].id);
        let joined: String = pieces.iter().map(|d| d.arguments.as_str()).collect();
        assert_eq!(
            Some(joined.as_str()),
            done.tool_calls[0].function.arguments.as_str()
        );
    }
}
