//! Contract tests: each adapter against a local server that replays the real response shapes
//! of llama-server, LM Studio, vLLM and Ollama (fixtures under `tests/fixtures`, sources in
//! the README there), plus every transport fault.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{collect, fixture, raw_server, refused_base, Fault, Mock, Reply};
use futures::StreamExt;
use mtp_contract::{
    FinishReason, GenerateRequest, Provider, ProviderError, ProviderOptions, Reason,
    ResponseFormat, Speculation, StreamEvent,
};

fn opts(base: &str) -> ProviderOptions {
    ProviderOptions::default()
        .base_url(base)
        .speculation(Speculation::native_mtp())
        .extra("idle_timeout_ms", "300")
        .extra("request_timeout_ms", "2000")
        .extra("connect_timeout_ms", "500")
}

fn provider(kind: &str, model: &str, o: &ProviderOptions) -> Arc<dyn Provider> {
    mtp_runtimes::create(kind, model, o).expect("create")
}

fn req() -> GenerateRequest {
    GenerateRequest::new("Write fib in Python.").max_output_tokens(64)
}

/// Mock routes: `"GET /path"` and the replies served there in order.
type Routes<'a> = Vec<(&'a str, Vec<Reply>)>;

fn strict() -> Speculation {
    Speculation::native_mtp().with_require_acceleration(true)
}

// ---------------------------------------------------------------- llama-server

/// Transcribed fixtures (not recorded from a server, see tests/fixtures/README.md):
/// llama_server/props_mtp.json and chat.json: shapes from llama.cpp's source, numbers made up.
#[tokio::test]
async fn llama_server_chat_reports_draft_counts_from_timings() {
    let m = Mock::start(vec![
        (
            "GET /props",
            vec![Reply::json("llama_server/props_mtp.json")],
        ),
        (
            "POST /v1/chat/completions",
            vec![Reply::json("llama_server/chat.json")],
        ),
    ])
    .await;
    let p = provider(
        "llama-server",
        "qwen35-mtp",
        &opts(&m.base).api_key("sk-test-123"),
    );
    let r = p
        .generate(req().speculation(Speculation::depth(5).unwrap()))
        .await
        .unwrap();
    assert!(r.content.starts_with("def fib(n):"));
    assert_eq!(r.finish_reason, FinishReason::Stop);
    assert_eq!(
        (
            r.usage.input_tokens,
            r.usage.output_tokens,
            r.usage.cached_input_tokens
        ),
        (24, 31, 4)
    );
    assert!(!r.partial);
    let s = &r.metadata.speculation;
    assert!(s.used && s.requested);
    assert_eq!((s.drafted, s.accepted), (Some(36), Some(27)));
    assert_eq!(s.acceptance_rate, Some(0.75));
    assert_eq!(s.num_draft_tokens, Some(5));
    assert_eq!(s.reason, None);
    assert_eq!(s.runtime, "llama-server b11434-6f1c2a9");
    assert_eq!(r.metadata.timings.prefill_ms, Some(88.2));
    assert!(r.metadata.timings.decode_tokens_per_s.is_some());
    // what was sent
    let post = &m.posts()[0];
    assert_eq!(post.path, "/v1/chat/completions");
    assert_eq!(post.auth.as_deref(), Some("Bearer sk-test-123"));
    assert_eq!(post.body["speculative.n_max"], 5);
    assert_eq!(post.body["temperature"], 0.0);
    assert_eq!(post.body["model"], "qwen35-mtp");
    assert_eq!(post.body["messages"][0]["content"], "Write fib in Python.");
    // the report's JSON has every key
    let v = serde_json::to_value(s).unwrap();
    for key in [
        "requested",
        "mode",
        "used",
        "drafter",
        "num_draft_tokens",
        "runtime",
        "draft_kind",
        "drafted",
        "accepted",
        "rounds",
        "acceptance_rate",
        "accepted_per_position",
        "output_preserving",
        "reason",
        "message",
    ] {
        assert!(v.get(key).is_some(), "missing {key}");
    }
    assert!(p.speculation_status().lane_loaded);
}

/// Transcribed fixtures (not recorded from a server, see tests/fixtures/README.md):
/// llama_server/props_none.json and chat_no_draft.json: shapes from llama.cpp's source, numbers
/// made up.
#[tokio::test]
async fn llama_server_without_lane_says_server_side_with_launch_flag() {
    let m = Mock::start(vec![
        (
            "GET /props",
            vec![Reply::json("llama_server/props_none.json")],
        ),
        (
            "POST /v1/chat/completions",
            vec![Reply::json("llama_server/chat_no_draft.json")],
        ),
    ])
    .await;
    let p = provider("llama-server", "qwen35.gguf", &opts(&m.base));
    let r = p.generate(req()).await.unwrap();
    assert_eq!(r.finish_reason, FinishReason::Length);
    let s = &r.metadata.speculation;
    assert!(!s.used);
    assert_eq!(s.reason, Some(Reason::ServerSide));
    assert_eq!((s.drafted, s.accepted), (None, None));
    let msg = s.message.as_deref().unwrap();
    assert!(
        msg.contains("llama-server -m qwen35.gguf --spec-type draft-mtp --spec-draft-n-max 3"),
        "{msg}"
    );
    assert!(msg.contains("speculative.types = none"), "{msg}");
    let st = p.speculation_status();
    assert!(!st.lane_loaded);
    assert_eq!(st.reason, Some(Reason::ServerSide));
}

/// Transcribed fixtures (not recorded from a server, see tests/fixtures/README.md):
/// llama_server/props_*.json and chat.json (numbers made up); vllm/metrics_no_spec.txt (the
/// example `/metrics` output in vLLM's docs/design/metrics.md: 8 running, 27453 generation
/// tokens); ollama/chat.json (the example reply and counts of Ollama's docs/api/usage.mdx);
/// lmstudio/chat_plain.json (LM Studio's documented `/api/v0/chat/completions` example). Only
/// the refusal is checked, so none of their numbers is asserted here.
#[tokio::test]
async fn require_acceleration_fails_before_generating_when_no_lane_is_shown() {
    // (provider, routes, reason)
    let cases: Vec<(&str, Routes, Reason)> = vec![
        (
            "llama-server",
            vec![(
                "GET /props",
                vec![Reply::json("llama_server/props_none.json")],
            )],
            Reason::ServerSide,
        ),
        ("llama-server", vec![], Reason::ServerSide), // no /props at all
        ("openai-compatible", vec![], Reason::ServerSide),
        ("lmstudio", vec![], Reason::ServerSide),
        (
            "vllm",
            vec![(
                "GET /metrics",
                vec![Reply::text("vllm/metrics_no_spec.txt")],
            )],
            Reason::ServerSide,
        ),
        ("vllm", vec![], Reason::ServerSide),
        ("ollama", vec![], Reason::RuntimeUnsupported),
    ];
    for (kind, mut routes, reason) in cases {
        routes.push((
            "POST /v1/chat/completions",
            vec![Reply::json("ollama/chat.json")],
        ));
        routes.push((
            "POST /api/v0/chat/completions",
            vec![Reply::json("lmstudio/chat_plain.json")],
        ));
        let m = Mock::start(routes).await;
        let p = provider(kind, "m", &opts(&m.base).speculation(strict()));
        match p.generate(req()).await {
            Err(ProviderError::SpeculationUnavailable {
                reason: got,
                message,
            }) => {
                assert_eq!(got, reason, "{kind}");
                assert!(!message.is_empty());
            }
            other => panic!("{kind}: expected SpeculationUnavailable, got {other:?}"),
        }
        assert!(
            m.posts().is_empty(),
            "{kind}: generated despite require_acceleration"
        );
        // the stream refuses the same way, before any event
        assert!(matches!(
            p.generate_stream(req()).await,
            Err(ProviderError::SpeculationUnavailable { .. })
        ));
    }
    // with a lane shown, the strict call runs
    let m = Mock::start(vec![
        (
            "GET /props",
            vec![Reply::json("llama_server/props_mtp.json")],
        ),
        (
            "POST /v1/chat/completions",
            vec![Reply::json("llama_server/chat.json")],
        ),
    ])
    .await;
    let p = provider("llama-server", "m", &opts(&m.base).speculation(strict()));
    assert!(p.generate(req()).await.unwrap().metadata.speculation.used);
}

/// Transcribed fixtures (not recorded from a server, see tests/fixtures/README.md):
/// llama_server/props_mtp.json, and chat_stream.sse, whose last two chunks are a published b9251
/// capture and whose deltas are made up.
#[tokio::test]
async fn llama_server_stream_split_anywhere_yields_deltas_then_report() {
    for piece in [1, 7, 64, 100_000] {
        let m = Mock::start(vec![
            (
                "GET /props",
                vec![Reply::json("llama_server/props_mtp.json")],
            ),
            (
                "POST /v1/chat/completions",
                vec![Reply::sse("llama_server/chat_stream.sse", piece)],
            ),
        ])
        .await;
        let p = provider("llama-server", "m", &opts(&m.base));
        let (text, done, err) = collect(&p, req()).await;
        assert!(err.is_none(), "{err:?}");
        let done = done.expect("Done");
        assert_eq!(text, "def fib(n):\n    a, b = 0, 1 — “π”");
        assert_eq!(done.content, text);
        assert_eq!(done.finish_reason, FinishReason::Stop);
        assert_eq!(
            (
                done.usage.input_tokens,
                done.usage.output_tokens,
                done.usage.cached_input_tokens
            ),
            (808, 665, 804)
        );
        let s = &done.metadata.speculation;
        assert!(s.used);
        assert_eq!((s.drafted, s.accepted), (Some(604), Some(515)));
        assert!(done.metadata.timings.time_to_first_token_ms.is_some());
        assert_eq!(m.posts()[0].body["stream"], true);
        assert_eq!(m.posts()[0].body["stream_options"]["include_usage"], true);
    }
}

/// Transcribed fixtures (not recorded from a server, see tests/fixtures/README.md):
/// llama_server/props_mtp.json and completion_native.{json,sse}: shapes from the server README,
/// numbers made up.
#[tokio::test]
async fn llama_server_native_completion_returns_token_ids() {
    let m = Mock::start(vec![
        (
            "GET /props",
            vec![Reply::json("llama_server/props_mtp.json")],
        ),
        (
            "POST /completion",
            vec![
                Reply::json("llama_server/completion_native.json"),
                Reply::sse("llama_server/completion_native_stream.sse", 5),
            ],
        ),
    ])
    .await;
    let p = provider("llama-server", "m", &opts(&m.base));
    let raw = GenerateRequest::new("Q: what is it?")
        .raw()
        .max_output_tokens(5);
    let r = p.generate(raw.clone()).await.unwrap();
    assert_eq!(r.content, " the answer is 42");
    assert_eq!(r.token_ids, Some(vec![279, 4226, 374, 220, 2983]));
    assert_eq!(r.finish_reason, FinishReason::Length);
    // `tokens_cached` (10) counts the prompt and the reply in the slot's cache; the prompt
    // tokens reused from the cache are `timings.cache_n` (0 here)
    assert_eq!(
        (
            r.usage.input_tokens,
            r.usage.output_tokens,
            r.usage.cached_input_tokens
        ),
        (6, 5, 0)
    );
    assert_eq!(
        (
            r.metadata.speculation.drafted,
            r.metadata.speculation.accepted
        ),
        (Some(6), Some(4))
    );
    assert_eq!(m.posts()[0].body["n_predict"], 5);

    let mut s = p.generate_stream(raw).await.unwrap();
    let mut ids = Vec::new();
    let mut done = None;
    while let Some(ev) = s.next().await {
        match ev.unwrap() {
            StreamEvent::Delta { token_ids, .. } => ids.extend(token_ids),
            StreamEvent::ToolCall(d) => panic!("no tools were offered: {d:?}"),
            StreamEvent::PromptProgress(_) => {}
            StreamEvent::Done(r) => done = Some(r),
        }
    }
    let done = done.expect("Done after stop:true without [DONE]");
    assert_eq!(ids, vec![279, 4226, 374, 220, 2983]);
    assert_eq!(done.token_ids, Some(ids));
    assert_eq!(done.finish_reason, FinishReason::Length);
    assert!(done.metadata.speculation.used);
}

/// Transcribed fixtures (not recorded from a server, see tests/fixtures/README.md):
/// llama_server/metrics_*.txt (names from llama.cpp's source, numbers made up: 36 / 27 / 12 are
/// ours) and vllm/chat.json (a reply without draft counts; its usage and timing figures are the
/// example of vLLM's docs/features/per_request_metrics.md and are not asserted here).
#[tokio::test]
async fn llama_server_metrics_deltas_when_the_response_has_no_counts() {
    let m = Mock::start(vec![
        (
            "GET /metrics",
            vec![
                Reply::text("llama_server/metrics_before.txt"),
                Reply::text("llama_server/metrics_after.txt"),
            ],
        ),
        (
            "POST /v1/chat/completions",
            vec![Reply::json("vllm/chat.json")],
        ),
    ])
    .await;
    let p = provider("llama-server", "m", &opts(&m.base).extra("metrics", "on"));
    let r = p.generate(req()).await.unwrap();
    let s = &r.metadata.speculation;
    assert!(s.used);
    assert_eq!(
        (s.drafted, s.accepted, s.rounds),
        (Some(36), Some(27), Some(12))
    );
    assert_eq!(s.num_draft_tokens, Some(3));
    assert!(s.message.as_deref().unwrap().contains("approximate"));
}

/// Transcribed fixtures (not recorded from a server, see tests/fixtures/README.md):
/// llama_server/props_mtp.json, chat.json and chat_no_draft.json: numbers made up.
#[tokio::test]
async fn request_pinned_off_asks_llama_server_for_depth_zero() {
    let m = Mock::start(vec![
        (
            "GET /props",
            vec![Reply::json("llama_server/props_mtp.json")],
        ),
        (
            "POST /v1/chat/completions",
            vec![
                Reply::json("llama_server/chat_no_draft.json"),
                Reply::json("llama_server/chat.json"),
            ],
        ),
    ])
    .await;
    let p = provider("llama-server", "m", &opts(&m.base));
    let r = p.generate(req().speculation(false)).await.unwrap();
    let s = &r.metadata.speculation;
    assert!(!s.used && !s.requested);
    assert_eq!(s.reason, Some(Reason::DisabledByRequest));
    assert_eq!(m.posts()[0].body["speculative.n_max"], 0);
    assert!(
        m.log().iter().all(|s| s.path != "/props"),
        "no probe needed when off"
    );
    // a server that ignores the depth and drafts anyway is reported as it is
    let r = p.generate(req().speculation(false)).await.unwrap();
    let s = &r.metadata.speculation;
    assert!(s.used && !s.requested);
    assert!(s
        .message
        .as_deref()
        .unwrap()
        .contains("drafts for every request"));
    // the next request is back at the provider default: no n_max sent
    let _ = p.generate(req()).await.unwrap();
    assert!(m.posts()[2].body.get("speculative.n_max").is_none());
}

// ---------------------------------------------------------------- LM Studio

/// Transcribed fixtures (not recorded from a server, see tests/fixtures/README.md):
/// - chat_plain.json is the response example of LM Studio's REST API docs (`POST
///   /api/v0/chat/completions`), byte for byte: the 0.111 s to first token checked below is the
///   docs' figure.
/// - chat_stats.json is that same example with four draft counters added to `stats`: 35 total /
///   31 accepted / 0 rejected / 4 ignored, the counts a live LM Studio `qwen3.5-9b-mtp` call (not
///   the docs' request) returned, as quoted in dbrito1231/simulation `scripts/lms_load.py`. LM
///   Studio's docs give the counter names (0.3.10 changelog) but no values.
/// - chat_usage.json's counts (492 drafted / 176 accepted, in `usage`) are from a published LM
///   Studio 0.4.24 server log.
/// - chat_stream.sse is the docs' example reply cut into chunks by us (the split is ours), with the
///   docs' usage (24 / 53 / 77) and the same observed counters (35 / 31) in the last chunk; where
///   LM Studio puts draft counters in a stream is not documented.
#[tokio::test]
async fn lmstudio_reads_draft_counters_from_stats_or_usage() {
    // (fixture, drafted, accepted)
    let cases = [
        ("lmstudio/chat_stats.json", 35, 31),
        ("lmstudio/chat_usage.json", 492, 176),
    ];
    for (fx, drafted, accepted) in cases {
        let m = Mock::start(vec![(
            "POST /api/v0/chat/completions",
            vec![Reply::json(fx)],
        )])
        .await;
        let p = provider("lmstudio", "qwen3.5-9b-mtp", &opts(&m.base));
        let r = p.generate(req()).await.unwrap();
        let s = &r.metadata.speculation;
        assert!(s.used, "{fx}");
        assert_eq!(
            (s.drafted, s.accepted),
            (Some(drafted), Some(accepted)),
            "{fx}"
        );
        assert!(r.metadata.timings.time_to_first_token_ms.is_some());
        assert!(r.metadata.timings.decode_tokens_per_s.is_some());
    }
    let m = Mock::start(vec![(
        "POST /api/v0/chat/completions",
        vec![
            Reply::json("lmstudio/chat_plain.json"),
            Reply::sse("lmstudio/chat_stream.sse", 3),
        ],
    )])
    .await;
    let p = provider("lmstudio", "granite", &opts(&m.base));
    let r = p.generate(req()).await.unwrap();
    let s = &r.metadata.speculation;
    assert!(!s.used);
    assert_eq!(s.reason, Some(Reason::NotReported));
    assert!(s
        .message
        .as_deref()
        .unwrap()
        .contains("lms load granite --speculative-draft-mtp"));
    assert!((r.metadata.timings.time_to_first_token_ms.unwrap() - 111.0).abs() < 1e-6);
    assert_eq!(r.finish_reason, FinishReason::Stop);
    assert!(m.posts()[0].body.get("draft_model").is_none());
    let drafted = Speculation::native_mtp()
        .with_drafter("qwen3.5-0.8b")
        .unwrap();
    let (text, done, err) = collect(&p, req().speculation(drafted)).await;
    assert_eq!(m.posts()[1].body["draft_model"], "qwen3.5-0.8b");
    assert!(err.is_none());
    assert_eq!(
        text,
        "Greetings, I'm a helpful AI, here to assist,\nIn providing answers, with no distress.\n\
         I'll keep it short and sweet, in rhyme you'll find,\nA friendly companion, all day long \
         you'll bind."
    );
    let done = done.unwrap();
    assert_eq!(
        (
            done.metadata.speculation.drafted,
            done.metadata.speculation.accepted
        ),
        (Some(35), Some(31))
    );
    assert_eq!(
        done.metadata.speculation.drafter.as_deref(),
        Some("qwen3.5-0.8b")
    );
}

// ---------------------------------------------------------------- vLLM

/// Transcribed fixtures (not recorded from a server, see tests/fixtures/README.md):
/// vllm/chat_spec_metrics.json and chat_stream.sse: `metrics.speculative_decoding` is the example
/// of vLLM's docs/features/speculative_decoding/acceptance_metrics.md (also in PR #48915), so 129
/// drafted, 10 accepted, 43 steps, depth 3 and the histogram [39, 1, 0, 3] (hence 4 / 3 / 3 per
/// position) are the docs'; `usage` (11742 prompt tokens) is a user's capture of that build
/// (mostlygeek/llama-swap#1032). metrics_before.txt only shows the lane here.
#[tokio::test]
async fn vllm_per_request_metrics_give_exact_positions() {
    let m = Mock::start(vec![
        ("GET /metrics", vec![Reply::text("vllm/metrics_before.txt")]),
        (
            "POST /v1/chat/completions",
            vec![
                Reply::json("vllm/chat_spec_metrics.json"),
                Reply::sse("vllm/chat_stream.sse", 11),
            ],
        ),
    ])
    .await;
    let p = provider("vllm", "Qwen/Qwen3.5-9B", &opts(&m.base));
    for streamed in [false, true] {
        let r = if streamed {
            collect(&p, req()).await.1.unwrap()
        } else {
            p.generate(req()).await.unwrap()
        };
        let s = &r.metadata.speculation;
        assert!(s.used);
        assert_eq!(
            (s.drafted, s.accepted, s.rounds),
            (Some(129), Some(10), Some(43))
        );
        assert_eq!(s.accepted_per_position, Some(vec![4, 3, 3]));
        assert_eq!(s.num_draft_tokens, Some(3));
        assert_eq!(s.message, None, "exact figures need no caveat");
        assert_eq!(r.usage.input_tokens, 11742);
        if streamed {
            // vLLM reports no timings: measured on the client
            assert!(r.metadata.timings.time_to_first_token_ms.is_some());
            assert!(r.metadata.timings.decode_tokens_per_s.is_some());
        }
    }
}

/// Transcribed fixtures (not recorded from a server, see tests/fixtures/README.md):
/// vllm/metrics_before.txt, metrics_after.txt and chat.json. The counter names are vLLM's
/// (`vllm/v1/spec_decode/metrics.py`); no vLLM document shows their values, so the two scrapes
/// carry the documented per-request example (acceptance_metrics.md: 43 steps, 129 drafted, 10
/// accepted, histogram [39, 1, 0, 3]) turned into counters by the docs' own mapping: the server
/// has served that request once before the call and once more during it. The deltas checked
/// below are therefore the docs' numbers; that the two requests draft alike is our assumption.
#[tokio::test]
async fn vllm_metrics_deltas_are_marked_approximate() {
    let m = Mock::start(vec![
        (
            "GET /metrics",
            vec![
                Reply::text("vllm/metrics_before.txt"),
                Reply::text("vllm/metrics_after.txt"),
            ],
        ),
        (
            "POST /v1/chat/completions",
            vec![Reply::json("vllm/chat.json")],
        ),
    ])
    .await;
    let p = provider(
        "vllm",
        "Qwen/Qwen3.5-9B",
        &opts(&m.base).speculation(strict()),
    );
    let r = p.generate(req()).await.unwrap();
    let s = &r.metadata.speculation;
    assert!(s.used);
    assert_eq!(
        (s.drafted, s.accepted, s.rounds),
        (Some(129), Some(10), Some(43))
    );
    assert_eq!(s.accepted_per_position, Some(vec![4, 3, 3]));
    assert_eq!(s.num_draft_tokens, Some(3));
    let msg = s.message.as_deref().unwrap();
    assert!(
        msg.contains("approximate") && msg.contains("same time"),
        "{msg}"
    );
}

/// Transcribed fixtures (not recorded from a server, see tests/fixtures/README.md):
/// vllm/metrics_no_spec.txt (the example `/metrics` output of vLLM's docs/design/metrics.md, which
/// has no `spec_decode` counters) and chat.json (usage and timing from the example of
/// docs/features/per_request_metrics.md). No number of theirs is asserted: the test checks what
/// is missing.
#[tokio::test]
async fn vllm_without_spec_counters_names_speculative_config() {
    let m = Mock::start(vec![
        (
            "GET /metrics",
            vec![Reply::text("vllm/metrics_no_spec.txt")],
        ),
        (
            "POST /v1/chat/completions",
            vec![Reply::json("vllm/chat.json")],
        ),
    ])
    .await;
    let p = provider(
        "vllm",
        "Qwen/Qwen3.5-9B",
        &opts(&m.base).speculation(Speculation::depth(4).unwrap()),
    );
    let r = p.generate(req()).await.unwrap();
    let s = &r.metadata.speculation;
    assert!(!s.used);
    assert_eq!(s.reason, Some(Reason::ServerSide));
    assert!(s
        .message
        .as_deref()
        .unwrap()
        .contains(r#"vllm serve Qwen/Qwen3.5-9B --speculative-config '{"method":"mtp","num_speculative_tokens":4}'"#));
    // no metrics page at all: not reported, counts null, and auto mode stops asking
    let m = Mock::start(vec![(
        "POST /v1/chat/completions",
        vec![Reply::json("vllm/chat.json")],
    )])
    .await;
    let p = provider("vllm", "Qwen/Qwen3.5-9B", &opts(&m.base));
    for _ in 0..2 {
        let s = p.generate(req()).await.unwrap().metadata.speculation;
        assert_eq!(s.reason, Some(Reason::NotReported));
        assert_eq!((s.drafted, s.accepted), (None, None));
    }
    assert_eq!(m.log().iter().filter(|s| s.path == "/metrics").count(), 1);
}

// ---------------------------------------------------------------- Ollama

/// Transcribed fixtures (not recorded from a server, see tests/fixtures/README.md):
/// - ollama/chat.json: the reply "Hello! How can I help you today?" with 11 prompt and 18 output
///   tokens is the example response of Ollama's docs/api/usage.mdx (an `/api/generate` call), put
///   into the `/v1` shape the way `openai.ToChatCompletion` does; the id's number is ours.
/// - ollama/chat_stream.sse: the frames Ollama's own test
///   `TestChatWriter_StreamMetricsTrailerSkipsEmptyContentChunk` (middleware/openai_test.go)
///   expects: content "Hi", a finish chunk with an empty delta, then usage 3 / 1 / 4.
#[tokio::test]
async fn ollama_is_runtime_unsupported() {
    let m = Mock::start(vec![(
        "POST /v1/chat/completions",
        vec![
            Reply::json("ollama/chat.json"),
            Reply::sse("ollama/chat_stream.sse", 9),
        ],
    )])
    .await;
    let p = provider("ollama", "qwen3:8b", &opts(&m.base));
    let r = p.generate(req()).await.unwrap();
    assert_eq!(r.content, "Hello! How can I help you today?");
    let s = &r.metadata.speculation;
    assert!(!s.used);
    assert_eq!(s.reason, Some(Reason::RuntimeUnsupported));
    assert!(s
        .message
        .as_deref()
        .unwrap()
        .contains("--spec-type draft-mtp"));
    let (text, done, _) = collect(&p, req()).await;
    assert_eq!(text, "Hi");
    assert_eq!(done.unwrap().usage.output_tokens, 1);
    assert_eq!(
        p.speculation_status().reason,
        Some(Reason::RuntimeUnsupported)
    );
}

// ---------------------------------------------------------------- faults

/// Transcribed fixtures (not recorded from a server, see tests/fixtures/README.md):
/// llama_server/error_500.json (shape from llama.cpp's source, text made up); vllm/error_400.json
/// (a vLLM 400 body published in andrewcho-dev/opsconductor-ng
/// `vLLM_transition/TOKEN_LIMIT_FIX.md`: 4096-token context, 2778 input tokens, 8000 requested);
/// ollama/error_404.json (the 404 body quoted in netease-youdao/QAnything#555, model "ollama").
#[tokio::test]
async fn http_errors_carry_status_and_the_servers_message() {
    // (provider, path, status, body, message must contain)
    let cases: Vec<(&str, &str, u16, Vec<u8>, &str)> = vec![
        (
            "llama-server",
            "/v1/chat/completions",
            500,
            fixture("llama_server/error_500.json"),
            "KV cache is full",
        ),
        (
            "vllm",
            "/v1/chat/completions",
            400,
            fixture("vllm/error_400.json"),
            "maximum context length",
        ),
        (
            "ollama",
            "/v1/chat/completions",
            404,
            fixture("ollama/error_404.json"),
            "not found, try pulling",
        ),
        (
            "lmstudio",
            "/api/v0/chat/completions",
            401,
            b"Unauthorized".to_vec(),
            "api_key",
        ),
        (
            "openai-compatible",
            "/v1/chat/completions",
            503,
            b"".to_vec(),
            "(empty body)",
        ),
    ];
    for (kind, path, status, body, needle) in cases {
        let key = format!("POST {path}");
        let m = Mock::start(vec![(
            key.as_str(),
            vec![Reply::status(status, "application/json", &body)],
        )])
        .await;
        let p = provider(kind, "m", &opts(&m.base));
        for streamed in [false, true] {
            let err = if streamed {
                p.generate_stream(req()).await.err()
            } else {
                p.generate(req()).await.err()
            };
            match err {
                Some(ProviderError::Api {
                    provider,
                    status: Some(s),
                    message,
                    ..
                }) => {
                    assert_eq!(provider, kind);
                    assert_eq!(s, status);
                    assert!(message.contains(needle), "{kind}: {message}");
                    assert!(message.contains(&m.base), "names the server: {message}");
                }
                other => panic!("{kind}: {other:?}"),
            }
        }
    }
}

#[tokio::test]
async fn garbled_json_is_a_typed_error() {
    let m = Mock::start(vec![(
        "POST /v1/chat/completions",
        vec![
            Reply::status(200, "application/json", b"{\"choices\": [ {\"mess"),
            Reply::status(
                200,
                "text/event-stream",
                b"data: {\"choices\":[{\"delta\":{\"content\":\"ok\"}}]}\n\ndata: {not json}\n\ndata: [DONE]\n\n",
            ),
        ],
    )])
    .await;
    let p = provider("vllm", "m", &opts(&m.base).extra("metrics", "off"));
    match p.generate(req()).await {
        Err(ProviderError::Api { message, .. }) => {
            assert!(message.contains("malformed JSON"), "{message}")
        }
        other => panic!("{other:?}"),
    }
    let (text, done, err) = collect(&p, req()).await;
    assert_eq!(text, "ok");
    assert!(done.is_none());
    match err {
        Some(ProviderError::Api { message, .. }) => assert!(
            message.contains("malformed JSON in the stream event"),
            "{message}"
        ),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn mid_stream_error_event_is_a_typed_error() {
    let m = Mock::start(vec![(
        "POST /v1/chat/completions",
        vec![Reply::status(
            200,
            "text/event-stream",
            b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"error\":{\"code\":500,\"message\":\"slot crashed\",\"type\":\"server_error\"}}\n\n",
        )],
    )])
    .await;
    let p = provider("openai-compatible", "m", &opts(&m.base));
    let (text, _, err) = collect(&p, req()).await;
    assert_eq!(text, "a");
    assert!(
        matches!(err, Some(ProviderError::Api { message, .. }) if message.contains("slot crashed"))
    );
}

#[tokio::test]
async fn refused_port_is_a_connection_error_within_bounded_time() {
    let base = refused_base().await;
    let p = provider(
        "llama-server",
        "m",
        &opts(&base).extra("connect_retries", "2"),
    );
    let t = Instant::now();
    match p.generate(req()).await {
        Err(ProviderError::Connection { server, message }) => {
            assert_eq!(server, base);
            assert!(message.contains("3 attempts"), "{message}");
            assert!(message.contains("llama-server"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    assert!(matches!(
        p.generate_stream(req()).await,
        Err(ProviderError::Connection { .. })
    ));
}

#[tokio::test]
async fn silent_servers_time_out_within_bounds() {
    let sse_start = b"data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n".to_vec();
    // (fault, streamed)
    let cases = vec![
        (Fault::NoHeaders, false),
        (Fault::NoHeaders, true),
        (
            Fault::Stall("application/json", b"{\"choices\":".to_vec()),
            false,
        ),
        (Fault::Stall("text/event-stream", sse_start.clone()), true),
    ];
    for (fault, streamed) in cases {
        let (base, _rx) = raw_server(fault).await;
        let o = opts(&base).extra("request_timeout_ms", "400");
        let p = provider("vllm", "m", &o.extra("metrics", "off"));
        let t = Instant::now();
        let err = if streamed {
            match p.generate_stream(req()).await {
                Err(e) => Some(e),
                Ok(mut s) => {
                    let mut last = None;
                    while let Some(item) = s.next().await {
                        if let Err(e) = item {
                            last = Some(e);
                        }
                    }
                    last
                }
            }
        } else {
            p.generate(req()).await.err()
        };
        assert!(
            matches!(err, Some(ProviderError::Timeout { ref server, .. }) if *server == base),
            "{err:?}"
        );
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "took {:?}",
            t.elapsed()
        );
    }
}

#[tokio::test]
async fn stream_cut_midway_returns_partial_response() {
    let bytes = b"data: {\"choices\":[{\"delta\":{\"content\":\"def \"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"fib\"}}]}\n\ndata: {\"choices\":[{\"del".to_vec();
    for fault in [
        Fault::CloseAfter(bytes.clone()),
        Fault::ChunkedCut(bytes.clone()),
    ] {
        let (base, _rx) = raw_server(fault).await;
        let p = provider("llama-server", "m", &opts(&base));
        let t = Instant::now();
        let (text, done, err) = collect(&p, req()).await;
        assert!(err.is_none(), "{err:?}");
        let done = done.expect("partial Done");
        assert_eq!(text, "def fib");
        assert_eq!(done.content, "def fib");
        assert!(done.partial);
        assert_eq!(done.finish_reason, FinishReason::Error);
        assert_eq!(done.metadata.speculation.reason, Some(Reason::NotReported));
        assert!(t.elapsed() < Duration::from_secs(2));
    }
}

#[tokio::test]
async fn dropping_the_stream_closes_the_connection() {
    let first = b"data: {\"choices\":[{\"delta\":{\"content\":\"tick\"}}]}\n\n".to_vec();
    let (base, mut closed) = raw_server(Fault::WatchClose(first)).await;
    let p = provider(
        "vllm",
        "m",
        &opts(&base)
            .extra("metrics", "off")
            .extra("idle_timeout_ms", "60000"),
    );
    let mut s = p.generate_stream(req()).await.unwrap();
    match s.next().await {
        Some(Ok(StreamEvent::Delta { text, .. })) => assert_eq!(text, "tick"),
        other => panic!("{other:?}"),
    }
    drop(s);
    let seen = tokio::time::timeout(Duration::from_secs(2), closed.recv()).await;
    assert!(
        matches!(seen, Ok(Some(()))),
        "server did not see the client hang up"
    );
}

/// Transcribed fixtures (not recorded from a server, see tests/fixtures/README.md):
/// ollama/chat.json: the example reply of Ollama's docs/api/usage.mdx in the `/v1` shape.
#[tokio::test]
async fn json_answer_to_a_stream_request_is_delta_then_done() {
    let m = Mock::start(vec![(
        "POST /v1/chat/completions",
        vec![Reply::json("ollama/chat.json")],
    )])
    .await;
    let p = provider("ollama", "qwen3:8b", &opts(&m.base));
    let (text, done, err) = collect(&p, req()).await;
    assert!(err.is_none());
    assert_eq!(text, "Hello! How can I help you today?");
    assert_eq!(done.unwrap().content, text);
}

/// Transcribed fixtures (not recorded from a server, see tests/fixtures/README.md):
/// ollama/chat.json (Ollama's documented example reply); it is never served, as every call here
/// is refused before it is sent.
#[tokio::test]
async fn unload_and_bad_requests() {
    let m = Mock::start(vec![(
        "POST /v1/chat/completions",
        vec![Reply::json("ollama/chat.json")],
    )])
    .await;
    let p = provider(
        "ollama",
        "qwen3:8b",
        &opts(&m.base).api_key("sk-very-secret"),
    );
    assert!(matches!(
        p.generate(GenerateRequest::new("x").raw().system_prompt("s"))
            .await,
        Err(ProviderError::InvalidRequest {
            field: "raw_prompt",
            ..
        })
    ));
    assert!(matches!(
        p.generate(GenerateRequest::new("x").prompt_cache_key("k"))
            .await,
        Err(ProviderError::InvalidRequest {
            field: "messages",
            ..
        })
    ));
    assert!(m.posts().is_empty());
    p.unload().await.unwrap();
    assert!(matches!(
        p.generate(req()).await,
        Err(ProviderError::Unloaded { .. })
    ));
    assert!(matches!(
        p.generate_stream(req()).await,
        Err(ProviderError::Unloaded { .. })
    ));
    let concrete = mtp_runtimes::HttpProvider::new(
        mtp_runtimes::ServerKind::Ollama,
        "m",
        &ProviderOptions::default().api_key("sk-very-secret"),
    )
    .unwrap();
    assert!(!format!("{concrete:?}").contains("sk-very-secret"));
}

/// Transcribed fixtures (not recorded from a server, see tests/fixtures/README.md):
/// llama_server/props_mtp.json: shape from llama.cpp's source.
#[tokio::test]
async fn probe_reads_props() {
    let m = Mock::start(vec![(
        "GET /props",
        vec![Reply::json("llama_server/props_mtp.json")],
    )])
    .await;
    let p =
        mtp_runtimes::HttpProvider::new(mtp_runtimes::ServerKind::LlamaServer, "m", &opts(&m.base))
            .unwrap();
    assert_eq!(p.speculation_status().reason, Some(Reason::NotReported));
    let spec = p.probe().await.unwrap();
    assert_eq!(spec.lane, Some(true));
    assert!(p.speculation_status().lane_loaded);
    assert_eq!(p.capabilities().runtime, "llama-server b11434-6f1c2a9");
}

#[tokio::test]
async fn valid_json_of_the_wrong_shape_is_a_typed_error() {
    let m = Mock::start(vec![(
        "POST /v1/chat/completions",
        vec![Reply::status(
            200,
            "application/json",
            br#"{"detail":"proxy says hi"}"#,
        )],
    )])
    .await;
    let p = provider("openai-compatible", "m", &opts(&m.base));
    match p.generate(req()).await {
        Err(ProviderError::Api { message, .. }) => {
            assert!(
                message.contains("neither `choices` nor `content`"),
                "{message}"
            );
            assert!(message.contains("proxy says hi"), "{message}");
        }
        other => panic!("{other:?}"),
    }
}

/// Transcribed fixture (see tests/fixtures/README.md): vllm/chat.json. A regex goes to vLLM as
/// `structured_outputs.regex`, and the finished reply is checked against it: a reply that
/// follows it carries no warning, one that does not (the server took the field and did not
/// enforce it, as a vLLM older than 0.10.2 does) says so, naming where it left the pattern.
#[tokio::test]
async fn vllm_takes_a_regex_and_a_reply_that_breaks_it_is_flagged() {
    let m = Mock::start(vec![(
        "POST /v1/chat/completions",
        vec![Reply::json("vllm/chat.json")],
    )])
    .await;
    let p = provider("vllm", "m", &opts(&m.base));
    let follows = r"def fib\(n\):\n    return .+";
    let r = p
        .generate(req().response_format(ResponseFormat::regex(follows)))
        .await
        .unwrap();
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
    let sent = &m.posts()[0].body;
    assert_eq!(
        sent["structured_outputs"],
        serde_json::json!({"regex": follows})
    );
    assert!(sent.get("response_format").is_none(), "{sent}");

    let r = p
        .generate(req().response_format(ResponseFormat::regex("[0-9]+")))
        .await
        .unwrap();
    assert_eq!(r.warnings.len(), 1, "{:?}", r.warnings);
    let w = &r.warnings[0];
    assert!(
        w.contains("did not enforce response_format `regex`") && w.contains("byte 0"),
        "{w}"
    );
    // the same reply against a Lark grammar it follows
    let lark = "start: /def fib\\(n\\):\\n    return .+/";
    let r = p
        .generate(req().response_format(ResponseFormat::grammar(lark)))
        .await
        .unwrap();
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
    assert_eq!(m.posts()[2].body["structured_outputs"]["grammar"], lark);
}
