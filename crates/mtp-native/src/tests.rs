//! Provider logic over a deterministic fake backend (the engine-backed integration tests
//! live in `crates/mtp/tests/native_*.rs`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use mtp_contract::{
    DraftStats, FinishReason, GenerateRequest, Lane, Message, Provider, ProviderError, Reason,
    Sampling, Speculation, StreamEvent, Timings,
};

use super::*;

/// Bytes as tokens; "generates" the alphabet after the last prompt byte, `depth + 1` tokens
/// per round, accepting every draft.
struct Fake {
    delay: Duration,
    runs: AtomicUsize,
    /// When set, the bytes "generated" (then end of sequence), and a prompt starting with
    /// `think:` ends inside a reasoning block as a thinking template's does.
    script: Option<&'static str>,
}

struct St(Vec<u32>);
impl CacheState for St {
    fn bytes(&self) -> usize {
        self.0.len() * 4
    }
    fn tokens(&self) -> usize {
        self.0.len()
    }
}

impl Backend for Fake {
    type State = St;
    fn runtime(&self) -> String {
        "fake-cpu".into()
    }
    fn drafter(&self) -> Option<DrafterLane> {
        Some(DrafterLane {
            name: "embedded".into(),
            default_depth: 2,
            output_preserving: Some(true),
        })
    }
    fn render(&self, r: &GenerateRequest) -> Result<RenderedPrompt, ProviderError> {
        let mut s = String::new();
        for m in r.messages.iter().flatten() {
            s.push_str(&m.content);
        }
        s.push_str(&r.prompt);
        let reasoning = (self.script.is_some() && r.prompt.starts_with("think:")).then(|| {
            mtp_chat::ReasoningStart {
                tags: mtp_chat::ThinkTags::default(),
                opened: true,
            }
        });
        Ok(RenderedPrompt {
            ids: s.bytes().map(u32::from).collect(),
            reasoning,
            history_len: None,
            images: Vec::new(),
            cache_ids: None,
        })
    }
    fn decoder(&self) -> Result<Box<dyn TextDecoder + '_>, ProviderError> {
        struct Bytes;
        impl TextDecoder for Bytes {
            fn step(&mut self, id: u32) -> Result<Option<String>, ProviderError> {
                Ok(Some(char::from(id as u8).to_string()))
            }
            fn finish(&mut self) -> Result<String, ProviderError> {
                Ok(String::new())
            }
        }
        Ok(Box::new(Bytes))
    }
    fn run(&self, job: Job<'_, St>) -> Result<RunOutput<St>, ProviderError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        let computed = job.prompt.len() - job.resume.as_ref().map_or(0, |(n, _)| *n);
        let mut next = b'a' as u32;
        let mut out = Vec::new();
        let mut stats = DraftStats::default();
        let step = job.depth.map_or(1, |d| d as usize + 1);
        let mut finish = FinishReason::Length;
        while out.len() < job.max_tokens {
            std::thread::sleep(self.delay);
            let n = step.min(job.max_tokens - out.len());
            let chunk: Vec<u32> = match self.script {
                Some(text) => {
                    let rest = &text.as_bytes()[out.len().min(text.len())..];
                    if rest.is_empty() {
                        finish = FinishReason::Stop;
                        break;
                    }
                    rest[..n.min(rest.len())]
                        .iter()
                        .map(|b| *b as u32)
                        .collect()
                }
                None => (0..n)
                    .map(|i| b'a' as u32 + (next - b'a' as u32 + i as u32) % 26)
                    .collect(),
            };
            let n = chunk.len();
            next = b'a' as u32 + (next - b'a' as u32 + n as u32) % 26;
            if let Some(d) = job.depth {
                stats.record_round(d as usize, n - 1);
            }
            out.extend_from_slice(&chunk);
            if !(job.on_tokens)(&chunk, Vec::new()) {
                finish = FinishReason::Cancelled;
                break;
            }
        }
        let mut all = job.prompt.to_vec();
        all.extend_from_slice(&out);
        Ok(RunOutput {
            tokens: out,
            finish,
            stats,
            timings: Timings::default(),
            computed_prompt_tokens: computed,
            prompt_state: job.checkpoint.then(|| Arc::new(St(job.prompt.to_vec()))),
            final_state: job.checkpoint.then(|| Arc::new(St(all))),
            history_state: None,
        })
    }
    fn weight_bytes(&self) -> usize {
        0
    }
}

fn provider(default: Option<Speculation>, delay_ms: u64) -> NativeProvider<Fake> {
    scripted(default, delay_ms, None)
}

fn scripted(
    default: Option<Speculation>,
    delay_ms: u64,
    script: Option<&'static str>,
) -> NativeProvider<Fake> {
    let fake = Fake {
        delay: Duration::from_millis(delay_ms),
        runs: AtomicUsize::new(0),
        script,
    };
    let lane = Lane::Ready {
        drafter: "embedded".into(),
        default_depth: 2,
        depth_source: mtp_contract::DepthSource::Registry,
        output_preserving: Some(true),
    };
    NativeProvider::new(
        "native",
        "fake",
        Arc::new(Loaded::new(fake, 1 << 20, 2)),
        default,
        lane,
    )
}

#[tokio::test]
async fn per_call_override_then_back_to_default() {
    let p = provider(Some(Speculation::native_mtp()), 0);
    let r = p
        .generate(
            GenerateRequest::new("x")
                .max_output_tokens(12)
                .speculation(Speculation::depth(5).unwrap()),
        )
        .await
        .unwrap();
    let s = &r.metadata.speculation;
    assert!(s.used);
    assert_eq!(s.num_draft_tokens, Some(5));
    assert_eq!(s.rounds, Some(2));
    let r2 = p
        .generate(GenerateRequest::new("x").max_output_tokens(12))
        .await
        .unwrap();
    assert_eq!(r2.metadata.speculation.num_draft_tokens, Some(2));
    let off = p
        .generate(
            GenerateRequest::new("x")
                .max_output_tokens(12)
                .speculation(false),
        )
        .await
        .unwrap();
    assert!(!off.metadata.speculation.used);
    assert_eq!(
        off.metadata.speculation.reason,
        Some(Reason::DisabledByRequest)
    );
    assert_eq!(off.content, r2.content);
    assert_eq!(r.content, "abcdefghijkl");
    assert_eq!(r.finish_reason, FinishReason::Length);
}

#[tokio::test]
async fn overlapping_call_is_busy_and_stream_drop_cancels() {
    let p = provider(Some(Speculation::native_mtp()), 20);
    let mut s = p
        .generate_stream(GenerateRequest::new("x").max_output_tokens(1000))
        .await
        .unwrap();
    let first = s.next().await.unwrap().unwrap();
    assert!(matches!(first, StreamEvent::Delta { ref token_ids, .. } if token_ids.len() == 3));
    let err = p.generate(GenerateRequest::new("y")).await.unwrap_err();
    assert!(matches!(err, ProviderError::Busy { .. }), "{err}");
    drop(s);
    // The run stops within a round and releases the guard.
    let mut ok = false;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        if p.generate(GenerateRequest::new("y").max_output_tokens(1))
            .await
            .is_ok()
        {
            ok = true;
            break;
        }
    }
    assert!(ok, "provider stayed busy after the stream was dropped");
}

#[tokio::test]
async fn stop_sequences_truncate_stream_and_content() {
    let p = provider(Some(Speculation::native_mtp()), 0);
    let mut s = p
        .generate_stream(GenerateRequest::new("x").max_output_tokens(50).stop("efg"))
        .await
        .unwrap();
    let mut streamed = String::new();
    let mut done = None;
    while let Some(ev) = s.next().await {
        match ev.unwrap() {
            StreamEvent::Delta { text, .. } => streamed.push_str(&text),
            StreamEvent::ToolCall(d) => panic!("no tools were offered: {d:?}"),
            StreamEvent::PromptProgress(_) => {}
            StreamEvent::Done(r) => done = Some(r),
        }
    }
    let done = done.unwrap();
    assert_eq!(streamed, "abcd");
    assert_eq!(done.content, "abcd");
    assert_eq!(done.finish_reason, FinishReason::Stop);
}

/// Collects a stream: (reasoning deltas, answer deltas, final response).
async fn collect(
    p: &NativeProvider<Fake>,
    req: GenerateRequest,
) -> (String, String, mtp_contract::GenerateResponse) {
    let mut s = p.generate_stream(req).await.unwrap();
    let (mut reasoning, mut content, mut done) = (String::new(), String::new(), None);
    while let Some(ev) = s.next().await {
        match ev.unwrap() {
            StreamEvent::Delta {
                text, reasoning: r, ..
            } => {
                reasoning.push_str(&r);
                content.push_str(&text);
            }
            StreamEvent::ToolCall(d) => panic!("no tools were offered: {d:?}"),
            StreamEvent::PromptProgress(_) => {}
            StreamEvent::Done(r) => done = Some(*r),
        }
    }
    (reasoning, content, done.expect("a final response"))
}

/// A thinking template opened `<think>` at the end of the prompt: the reply's reasoning is
/// streamed and returned apart from the answer, at every draft depth (several tokens per
/// delta), and the two streams add up to the response's fields.
#[tokio::test]
async fn reasoning_is_split_from_the_answer() {
    let script = "\nFirst, 2 + 2.\n</think>\n\nIt is 4.";
    for spec in [
        Speculation::off(),
        Speculation::depth(1).unwrap(),
        Speculation::depth(4).unwrap(),
    ] {
        let p = scripted(Some(Speculation::native_mtp()), 0, Some(script));
        let (reasoning, content, r) = collect(
            &p,
            GenerateRequest::new("think: 2+2?")
                .max_output_tokens(100)
                .speculation(spec.clone()),
        )
        .await;
        assert_eq!(reasoning, "First, 2 + 2.", "{spec:?}");
        assert_eq!(content, "It is 4.", "{spec:?}");
        assert_eq!(r.reasoning_content.as_deref(), Some("First, 2 + 2."));
        assert_eq!(r.content, "It is 4.");
        assert_eq!(r.finish_reason, FinishReason::Stop);
    }
    // Without a thinking template, the same bytes are all answer.
    let p = scripted(Some(Speculation::native_mtp()), 0, Some(script));
    let (reasoning, content, r) =
        collect(&p, GenerateRequest::new("plain").max_output_tokens(100)).await;
    assert_eq!(reasoning, "");
    assert_eq!(content, script);
    assert_eq!(r.reasoning_content, None);
    // A stop string ends the answer; the reasoning before it stays.
    let p = scripted(Some(Speculation::native_mtp()), 0, Some(script));
    let (_, content, r) = collect(
        &p,
        GenerateRequest::new("think: 2+2?")
            .max_output_tokens(100)
            .stop(" 4"),
    )
    .await;
    assert_eq!(content, "It is");
    assert_eq!(r.content, "It is");
    assert_eq!(r.reasoning_content.as_deref(), Some("First, 2 + 2."));
    assert_eq!(r.finish_reason, FinishReason::Stop);
}

#[tokio::test]
async fn prefix_cache_reuse_and_history_rules() {
    let p = provider(Some(Speculation::native_mtp()), 0);
    let err = p
        .generate(GenerateRequest::new("hello").prompt_cache_key("s"))
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        ProviderError::InvalidRequest {
            field: "messages",
            ..
        }
    ));
    let r1 = p
        .generate(
            GenerateRequest::new("hello")
                .messages(vec![])
                .prompt_cache_key("s")
                .max_output_tokens(4),
        )
        .await
        .unwrap();
    assert_eq!(r1.usage.cached_input_tokens, 0);
    let history = vec![
        Message::user("hello"),
        Message::assistant(r1.content.clone()),
    ];
    let r2 = p
        .generate(
            GenerateRequest::new("more")
                .messages(history)
                .prompt_cache_key("s")
                .max_output_tokens(4),
        )
        .await
        .unwrap();
    assert_eq!(r2.usage.cached_input_tokens, 9); // "hello" + "abcd"
    p.prompt_cache_clear(Some("s")).unwrap();
    let history = vec![Message::user("hello"), Message::assistant(r1.content)];
    let r3 = p
        .generate(
            GenerateRequest::new("more")
                .messages(history)
                .prompt_cache_key("s")
                .max_output_tokens(4),
        )
        .await
        .unwrap();
    assert_eq!(r3.usage.cached_input_tokens, 0);
    assert_eq!(r3.content, r2.content);
}

#[tokio::test]
async fn refusals_and_unavailable_lanes() {
    let fake = Fake {
        delay: Duration::ZERO,
        runs: AtomicUsize::new(0),
        script: None,
    };
    let lane = Lane::Unavailable {
        reason: Reason::MtpHeadNotCached,
        message: "download it with `mtp models download org/x-MTP`".into(),
    };
    let p = NativeProvider::new(
        "native",
        "fake",
        Arc::new(Loaded::new(fake, 1 << 20, 2)),
        Some(Speculation::native_mtp()),
        lane,
    );
    let r = p
        .generate(GenerateRequest::new("x").max_output_tokens(2))
        .await
        .unwrap();
    assert_eq!(
        r.metadata.speculation.reason,
        Some(Reason::MtpHeadNotCached)
    );
    assert!(r
        .metadata
        .speculation
        .message
        .as_deref()
        .unwrap()
        .contains("mtp models download"));
    let strict = GenerateRequest::new("x")
        .speculation(Speculation::native_mtp().with_require_acceleration(true));
    let err = p.generate(strict).await.unwrap_err();
    assert!(matches!(
        err,
        ProviderError::SpeculationUnavailable {
            reason: Reason::MtpHeadNotCached,
            ..
        }
    ));
    assert!(!p.speculation_status().lane_loaded);

    let p = provider(Some(Speculation::native_mtp()), 0);
    let pen = Sampling {
        frequency_penalty: Some(0.5),
        ..Default::default()
    };
    let r = p
        .generate(
            GenerateRequest::new("x")
                .max_output_tokens(2)
                .sampling(pen.clone()),
        )
        .await
        .unwrap();
    assert_eq!(
        r.metadata.speculation.reason,
        Some(Reason::SamplingRequiresTargetOnly)
    );
    let strict = GenerateRequest::new("x")
        .sampling(pen)
        .speculation(Speculation::native_mtp().with_require_acceleration(true));
    assert!(matches!(
        p.generate(strict).await.unwrap_err(),
        ProviderError::SpeculationUnavailable {
            reason: Reason::SamplingRequiresTargetOnly,
            ..
        }
    ));
    let mut img = Message::user("look");
    img.images.push("cat.png".into());
    let err = p
        .generate(GenerateRequest::new("x").messages(vec![img]))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("not supported"), "{err}");
    p.unload().await.unwrap();
    assert!(matches!(
        p.generate(GenerateRequest::new("x")).await.unwrap_err(),
        ProviderError::Unloaded { .. }
    ));
}
