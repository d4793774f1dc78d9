//! Structured output through the facade: the native provider enforces `response_format`
//! with MTP on (the report says MTP ran), the typed helper parses into a Rust type, a schema
//! that does not compile is a typed `response_format` error, and the HTTP adapters refuse a
//! constraint they cannot pass on (a regex, except to vLLM) instead of dropping it.

use std::path::PathBuf;

use mtp::structured::{generate_json, StructuredError};
use mtp::{
    create_llm, GenerateRequest, ProviderError, ProviderOptions, ResponseFormat, Speculation,
};
use serde_json::json;

fn demo() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/tiny-code")
        .canonicalize()
        .unwrap()
        .display()
        .to_string()
}

fn on(depth: u32) -> ProviderOptions {
    ProviderOptions::default().speculation(
        Speculation::native_mtp()
            .with_num_draft_tokens(depth)
            .unwrap(),
    )
}

#[derive(Debug, serde::Deserialize, schemars::JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
enum Kind {
    Fn,
    Struct,
}

#[derive(Debug, serde::Deserialize, schemars::JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
struct Item {
    kind: Kind,
    #[schemars(range(min = 0, max = 99))]
    line: u8,
    public: bool,
}

#[tokio::test]
async fn typed_helper_parses_with_mtp_on_and_off_alike() {
    let mut got = Vec::new();
    for depth in [0u32, 3] {
        let opts = if depth == 0 {
            ProviderOptions::default().speculation(Speculation::off())
        } else {
            on(depth)
        };
        let llm = create_llm("native", &demo(), opts).unwrap();
        let req = GenerateRequest::new("let item = ")
            .raw()
            .max_output_tokens(96)
            .sampling(mtp::Sampling::greedy());
        let (item, resp) = generate_json::<Item>(llm.as_ref(), req)
            .await
            .expect("a typed reply");
        assert_eq!(resp.metadata.speculation.used, depth > 0, "{resp:?}");
        got.push((item, resp.content));
    }
    assert_eq!(got[0], got[1], "MTP changed the constrained reply");
}

#[tokio::test]
async fn bad_schema_is_a_response_format_error() {
    let llm = create_llm("native", &demo(), on(2)).unwrap();
    let req = GenerateRequest::new("x")
        .raw()
        .max_output_tokens(8)
        .response_format(ResponseFormat::json_schema(json!({"type": "no-such-type"})));
    match llm.generate(req).await {
        Err(ProviderError::InvalidRequest { field, message }) => {
            assert_eq!(field, "response_format", "{message}");
        }
        other => panic!("expected a response_format error, got {other:?}"),
    }
    let req = GenerateRequest::new("x")
        .raw()
        .max_output_tokens(8)
        .response_format(ResponseFormat::regex(" "));
    assert!(matches!(
        llm.generate(req).await,
        Err(ProviderError::InvalidRequest {
            field: "response_format",
            ..
        })
    ));
}

#[tokio::test]
async fn budget_cut_is_incomplete_not_a_parse_error() {
    let llm = create_llm("native", &demo(), on(2)).unwrap();
    let req = GenerateRequest::new("let item = ")
        .raw()
        .max_output_tokens(3);
    match generate_json::<Item>(llm.as_ref(), req).await {
        Err(StructuredError::Incomplete { finish, content }) => {
            assert_eq!(finish, mtp::FinishReason::Length);
            assert!(content.starts_with('{'), "{content}");
        }
        other => panic!("expected Incomplete, got {other:?}"),
    }
}

#[tokio::test]
async fn http_adapters_refuse_a_constraint_they_cannot_pass_on() {
    // nothing listens there: the refusal must come before any request is sent
    let mut checked = 0;
    for provider in mtp::providers() {
        if ["native", "mlx", "gguf"].contains(&provider.as_str()) {
            continue;
        }
        let llm = create_llm(
            &provider,
            "m",
            ProviderOptions::default().base_url("http://127.0.0.1:9"),
        )
        .unwrap_or_else(|e| panic!("{provider}: {e}"));
        checked += 1;
        // JSON constraints are passed on (tests/llama_server_e2e.rs); a regex has a field
        // only in vLLM's API (`structured_outputs`, mtp-runtimes' tests/contract.rs): vLLM
        // tries the server, every other adapter refuses before sending anything
        let req = GenerateRequest::new("x").response_format(ResponseFormat::regex("[a-z]+"));
        match (provider.as_str(), llm.generate(req.clone()).await) {
            ("vllm", Err(e)) => assert!(
                !matches!(e, ProviderError::Unsupported { .. }),
                "vllm: {e:?}"
            ),
            (_, Err(ProviderError::Unsupported { what, .. })) => {
                assert!(what.contains("response_format"), "{provider}: {what}")
            }
            (_, other) => panic!("{provider}: expected Unsupported, got {other:?}"),
        }
        // allowed to ask for it in the prompt instead, every adapter goes to the server (and
        // finds nothing there); with a raw prompt there is no system message to ask in
        let asked = req.clone().prompted_fallback(true);
        match llm.generate(asked).await {
            Err(ProviderError::Unsupported { what, .. }) => panic!("{provider}: {what}"),
            Err(_) => {}
            Ok(r) => panic!("{provider}: nothing listens, got {r:?}"),
        }
        if provider != "vllm" {
            match llm.generate(req.raw().prompted_fallback(true)).await {
                Err(ProviderError::InvalidRequest { field, .. }) => {
                    assert_eq!(field, "prompted_fallback", "{provider}")
                }
                other => panic!("{provider}: expected InvalidRequest, got {other:?}"),
            }
        }
    }
    assert!(checked >= 4, "{checked} HTTP adapters checked");
}
