//! The `llama-server` adapter against bodies recorded from a real llama-server b11434 with
//! `--spec-type draft-mtp --spec-draft-n-max 3` (`tests/fixtures/llama_server/recorded_b11434/`,
//! see the fixtures README), replayed by the local mock: the shapes the real server sends are
//! parsed into the same report the live end-to-end test sees.

mod common;

use common::{Mock, Reply};
use futures::StreamExt;
use mtp_contract::{FinishReason, GenerateRequest, ProviderOptions, Speculation, StreamEvent};

const DIR: &str = "llama_server/recorded_b11434";

async fn mock() -> Mock {
    Mock::start(vec![
        (
            "GET /props",
            vec![Reply::json(&format!("{DIR}/props_mtp.json"))],
        ),
        (
            "POST /completion",
            vec![
                Reply::json(&format!("{DIR}/completion_native.json")),
                Reply::sse(&format!("{DIR}/completion_native_stream.sse"), 7),
            ],
        ),
        (
            "POST /v1/chat/completions",
            vec![
                Reply::json(&format!("{DIR}/chat.json")),
                Reply::sse(&format!("{DIR}/chat_stream.sse"), 7),
            ],
        ),
    ])
    .await
}

#[tokio::test]
async fn recorded_b11434_bodies_give_the_servers_counts() {
    let m = mock().await;
    let opts = ProviderOptions::default()
        .base_url(&m.base)
        .speculation(Speculation::native_mtp());
    let p = mtp_runtimes::create("llama-server", "tiny-mtp", &opts).expect("create");
    let want = "vro ydqdpm vro y";

    for raw in [true, false] {
        let req = GenerateRequest::new("the quick brown fox ").max_output_tokens(16);
        let req = if raw { req.raw() } else { req };
        // Non-streaming.
        let r = p.generate(req.clone()).await.expect("generate");
        assert_eq!(r.content, want);
        assert_eq!(r.finish_reason, FinishReason::Length);
        assert_eq!(r.usage.output_tokens, 16);
        // the recorded call: 20 prompt tokens, 16 of them from the slot's cache (timings
        // prompt_n 4 + cache_n 16); the native body's `tokens_cached` (35: prompt and reply in
        // the cache) is not the cached prompt
        assert_eq!(
            (r.usage.input_tokens, r.usage.cached_input_tokens),
            (20, 16),
            "raw {raw}: {:?}",
            r.usage
        );
        let s = &r.metadata.speculation;
        assert!(s.used, "{s:?}");
        assert_eq!((s.drafted, s.accepted), (Some(16), Some(9)), "{s:?}");
        // Streaming: the counts come with the final chunk.
        let mut st = p.generate_stream(req).await.expect("stream");
        let (mut text, mut done) = (String::new(), None);
        while let Some(ev) = st.next().await {
            match ev.expect("event") {
                StreamEvent::Delta { text: t, .. } => text.push_str(&t),
                StreamEvent::ToolCall(d) => panic!("no tools were offered: {d:?}"),
                StreamEvent::PromptProgress(_) => {}
                StreamEvent::Done(r) => done = Some(*r),
            }
        }
        let done = done.expect("done");
        assert_eq!(text, want);
        assert_eq!(done.content, want);
        let s = &done.metadata.speculation;
        assert!(s.used, "{s:?}");
        assert_eq!((s.drafted, s.accepted), (Some(16), Some(9)), "{s:?}");
    }
}
