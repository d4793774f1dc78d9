//! The native provider end to end on a tiny trained Qwen3.5 + MTP checkpoint
//! (`tests/fixtures/tiny-trained`), and its companion-drafter lane on the MLX-layout pair
//! (`tests/fixtures/tiny-mlx` + `tiny-mlx-mtp`).

use std::path::PathBuf;
use std::sync::OnceLock;

use futures::StreamExt;
use mtp::{
    create_llm, GenerateRequest, Message, ProviderError, ProviderOptions, Reason, Sampling,
    Speculation, StreamEvent,
};
use serde_json::json;

fn fixture(name: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name);
    p.canonicalize().unwrap().display().to_string()
}

/// Every test sees the same empty Hugging Face cache, so companion lookups are offline and
/// deterministic.
fn empty_hub_cache() {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    let d = DIR.get_or_init(|| tempfile::tempdir().unwrap());
    // Same value from every thread; set before any provider reads it.
    std::env::set_var("HF_HUB_CACHE", d.path());
}

fn on(depth: u32) -> ProviderOptions {
    ProviderOptions::default().speculation(
        Speculation::native_mtp()
            .with_num_draft_tokens(depth)
            .unwrap(),
    )
}

const PROMPT: &str = "the quick brown fox ";

fn req(n: u32) -> GenerateRequest {
    GenerateRequest::new(PROMPT).max_output_tokens(n).raw()
}

#[tokio::test]
async fn mtp_on_and_off_on_one_loaded_model_give_the_same_text() {
    empty_hub_cache();
    let llm = create_llm("native", &fixture("tiny-trained"), on(3)).unwrap();
    let st = llm.speculation_status();
    assert!(st.lane_loaded);
    assert_eq!(st.drafter.as_deref(), Some("embedded"));
    assert_eq!(st.num_draft_tokens, Some(3));

    let with = llm.generate(req(48)).await.unwrap();
    let s = &with.metadata.speculation;
    assert!(s.used, "{s:?}");
    assert_eq!(s.runtime, "mtp-engine-cpu");
    assert_eq!(s.num_draft_tokens, Some(3));
    let (drafted, accepted, rounds) = (s.drafted.unwrap(), s.accepted.unwrap(), s.rounds.unwrap());
    assert!(
        rounds > 0 && drafted <= 3 * rounds && accepted <= drafted,
        "{s:?}"
    );
    assert_eq!(s.accepted_per_position.as_ref().unwrap().len(), 3);
    assert_eq!(s.reason, None);
    let v = serde_json::to_value(s).unwrap();
    assert_eq!(v["draft_kind"], "mtp");
    assert_eq!(v["mode"], "native_mtp");

    let five = llm
        .generate(req(48).speculation(Speculation::depth(5).unwrap()))
        .await
        .unwrap();
    assert_eq!(five.metadata.speculation.num_draft_tokens, Some(5));
    let without = llm.generate(req(48).speculation(false)).await.unwrap();
    assert_eq!(
        serde_json::to_value(&without.metadata.speculation).unwrap(),
        json!({
            "requested": false, "mode": "off", "used": false, "drafter": null,
            "num_draft_tokens": 3, "depth_source": "provider", "auto_depth": false, "rounds_per_depth": null,
            "runtime": "mtp-engine-cpu", "draft_kind": null,
            "drafted": null, "accepted": null, "rounds": null, "acceptance_rate": null,
            "accepted_per_position": null, "output_preserving": null,
            "reason": "disabled_by_request",
            "message": Reason::DisabledByRequest.default_message()
        })
    );
    // Greedy output is unchanged by drafting, at every depth.
    assert_eq!(with.token_ids, without.token_ids);
    assert_eq!(five.token_ids, without.token_ids);
    assert_eq!(with.content, without.content);
    // The next call is back at the provider default.
    let again = llm.generate(req(8)).await.unwrap();
    assert_eq!(again.metadata.speculation.num_draft_tokens, Some(3));
}

#[tokio::test]
async fn sampling_that_needs_target_only_is_reported_or_refused() {
    empty_hub_cache();
    let llm = create_llm("native", &fixture("tiny-trained"), on(2)).unwrap();
    let pen = Sampling {
        repetition_penalty: Some(1.3),
        ..Default::default()
    };
    let r = llm.generate(req(8).sampling(pen.clone())).await.unwrap();
    let s = &r.metadata.speculation;
    assert!(!s.used);
    assert_eq!(s.reason, Some(Reason::SamplingRequiresTargetOnly));
    assert!(s.message.as_deref().unwrap().contains("repetition_penalty"));
    let strict = req(8)
        .sampling(pen)
        .speculation(Speculation::native_mtp().with_require_acceleration(true));
    match llm.generate(strict).await {
        Err(ProviderError::SpeculationUnavailable {
            reason: Reason::SamplingRequiresTargetOnly,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    // Seeded sampling is compatible and gives the same text with and without MTP.
    let seeded = Sampling {
        temperature: Some(0.8),
        top_p: Some(0.95),
        seed: Some(7),
        ..Default::default()
    };
    let a = llm
        .generate(req(32).sampling(seeded.clone()))
        .await
        .unwrap();
    let b = llm
        .generate(req(32).sampling(seeded).speculation(false))
        .await
        .unwrap();
    assert!(a.metadata.speculation.used);
    assert_eq!(a.token_ids, b.token_ids);
}

#[tokio::test]
async fn companion_drafter_lane_missing_and_present() {
    empty_hub_cache();
    // A companion that is not in the (empty) cache: the model loads and answers without MTP.
    let missing = "mlx-community/Qwen3.5-4B-MTP-4bit";
    let opts = ProviderOptions::default()
        .speculation(Speculation::native_mtp().with_drafter(missing).unwrap());
    let llm = create_llm("mlx", &fixture("tiny-mlx"), opts).unwrap();
    assert!(!llm.speculation_status().lane_loaded);
    let r = llm.generate(req(8)).await.unwrap();
    let s = &r.metadata.speculation;
    assert!(!s.used);
    assert_eq!(s.reason, Some(Reason::MtpHeadNotCached));
    let msg = s.message.as_deref().unwrap();
    assert!(
        msg.contains(&format!("mtp models download {missing}")),
        "{msg}"
    );
    assert!(!r.content.is_empty() || r.usage.output_tokens > 0);
    let strict = req(8).speculation(Speculation::native_mtp().with_require_acceleration(true));
    match llm.generate(strict).await {
        Err(ProviderError::SpeculationUnavailable {
            reason: Reason::MtpHeadNotCached,
            message,
        }) => {
            assert!(message.contains("mtp models download"))
        }
        other => panic!("{other:?}"),
    }

    // The same target with its companion on disk: drafting runs, output is unchanged.
    let opts = ProviderOptions::default().speculation(
        Speculation::native_mtp()
            .with_drafter(fixture("tiny-mlx-mtp"))
            .unwrap()
            .with_num_draft_tokens(2)
            .unwrap(),
    );
    let llm = create_llm("mlx", &fixture("tiny-mlx"), opts).unwrap();
    let with = llm.generate(req(24)).await.unwrap();
    assert!(
        with.metadata.speculation.used,
        "{:?}",
        with.metadata.speculation
    );
    assert_eq!(with.metadata.speculation.runtime, "mtp-engine-cpu");
    let without = llm.generate(req(24).speculation(false)).await.unwrap();
    assert_eq!(with.token_ids, without.token_ids);

    // A drafter that does not fit the target (hidden size 32 vs 64): drafter_mismatch, naming
    // the field.
    let bad = tempfile::tempdir().unwrap();
    let src = PathBuf::from(fixture("tiny-mlx-mtp"));
    for e in std::fs::read_dir(&src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), bad.path().join(e.file_name())).unwrap();
    }
    let cfg_path = bad.path().join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    cfg["text_config"]["hidden_size"] = json!(32);
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let opts = ProviderOptions::default().speculation(
        Speculation::native_mtp()
            .with_drafter(bad.path().display().to_string())
            .unwrap(),
    );
    let llm = create_llm("mlx", &fixture("tiny-mlx"), opts).unwrap();
    let st = llm.speculation_status();
    assert!(!st.lane_loaded);
    assert_eq!(st.reason, Some(Reason::DrafterMismatch), "{st:?}");
    assert!(st.message.as_deref().unwrap().contains("hidden"), "{st:?}");
}

#[tokio::test]
async fn prefix_cache_reuse_gives_the_same_text() {
    empty_hub_cache();
    for spec in [true, false] {
        let llm = create_llm("native", &fixture("tiny-trained"), on(3)).unwrap();
        let key = format!("session-{spec}");
        let first = GenerateRequest::new("the quick brown fox ")
            .messages(vec![])
            .prompt_cache_key(key.clone())
            .max_output_tokens(16)
            .speculation(spec);
        let r1 = llm.generate(first).await.unwrap();
        assert_eq!(r1.usage.cached_input_tokens, 0);
        let history = vec![
            Message::user("the quick brown fox "),
            Message::assistant(r1.content.clone()),
        ];
        let second = GenerateRequest::new("jumps over ")
            .messages(history.clone())
            .prompt_cache_key(key.clone())
            .max_output_tokens(16)
            .speculation(spec);
        let warm = llm.generate(second.clone()).await.unwrap();
        // The state at the end of the first reply is reused, not only the first prompt.
        assert!(
            warm.usage.cached_input_tokens > r1.usage.input_tokens,
            "spec={spec}: {:?} after {:?}",
            warm.usage,
            r1.usage
        );
        llm.prompt_cache_clear(None).unwrap();
        let cold = llm.generate(second).await.unwrap();
        assert_eq!(cold.usage.cached_input_tokens, 0);
        assert_eq!(warm.token_ids, cold.token_ids, "spec={spec}");
    }
}

#[tokio::test]
async fn weights_are_shared_and_unload_frees_them() {
    empty_hub_cache();
    let path = fixture("tiny-hf");
    let a = create_llm("native", &path, on(2)).unwrap();
    let b = create_llm("native", &path, on(4)).unwrap();
    assert_eq!(
        mtp::native::loaded_copies(std::path::Path::new(&path)),
        1,
        "one copy for two providers"
    );
    a.unload().await.unwrap();
    assert!(matches!(
        a.generate(req(2)).await,
        Err(ProviderError::Unloaded { .. })
    ));
    assert!(b.generate(req(2)).await.is_ok());
    b.unload().await.unwrap();
    assert_eq!(mtp::native::loaded_copies(std::path::Path::new(&path)), 0);
}

#[tokio::test]
async fn streaming_gives_several_tokens_per_round_then_the_report() {
    empty_hub_cache();
    let llm = create_llm("native", &fixture("tiny-trained"), on(3)).unwrap();
    let mut s = llm.generate_stream(req(40)).await.unwrap();
    let mut chunks = Vec::new();
    let mut progress = Vec::new();
    let mut done = None;
    while let Some(ev) = s.next().await {
        match ev.unwrap() {
            StreamEvent::Delta { token_ids, .. } => chunks.push(token_ids.len()),
            StreamEvent::ToolCall(d) => panic!("no tools were offered: {d:?}"),
            StreamEvent::PromptProgress(p) => {
                assert!(
                    chunks.is_empty(),
                    "prompt progress after the reply began: {p:?}"
                );
                progress.push(p);
            }
            StreamEvent::Done(r) => done = Some(r),
        }
    }
    let done = done.expect("final report");
    // the prompt's progress: from nothing computed to the whole prompt, in order
    let total = done.usage.input_tokens as usize;
    assert!(progress.len() >= 2, "{progress:?}");
    assert!(progress.iter().all(|p| p.total == total && p.cache == 0));
    assert_eq!(progress[0].processed, 0);
    assert_eq!(progress.last().map(|p| p.processed), Some(total));
    assert!(progress
        .windows(2)
        .all(|w| w[0].processed <= w[1].processed));
    assert!(
        chunks.iter().any(|&n| n > 1),
        "no multi-token chunk in {chunks:?}"
    );
    assert_eq!(
        chunks.iter().sum::<usize>() as u64,
        done.usage.output_tokens
    );
    // A concurrent call while streaming is refused, not queued.
    let mut s = llm.generate_stream(req(400)).await.unwrap();
    let _ = s.next().await;
    assert!(matches!(
        llm.generate(req(2)).await,
        Err(ProviderError::Busy { .. })
    ));
    drop(s);
}

#[tokio::test]
async fn bad_inputs_are_typed_errors() {
    empty_hub_cache();
    let Err(e) = create_llm("native", "/definitely/not/here", ProviderOptions::default()) else {
        panic!()
    };
    assert!(e.to_string().contains("/definitely/not/here"), "{e}");
    let Err(e) = create_llm("native", "org/not-downloaded", ProviderOptions::default()) else {
        panic!()
    };
    assert!(
        e.to_string()
            .contains("mtp models download org/not-downloaded"),
        "{e}"
    );
    let llm = create_llm("native", &fixture("tiny-trained"), on(2)).unwrap();
    let mut m = Message::user("what is this?");
    m.images.push("cat.png".into());
    let err = llm
        .generate(GenerateRequest::new("x").messages(vec![m]))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("not supported"), "{err}");
}

/// The `dtype` option: `auto` (the default: weights as stored) and `f32` give the same text on
/// an f32 checkpoint; `bf16` rounds the matrices and stays exact under speculation; anything
/// else is refused, naming the value.
#[tokio::test]
async fn weight_dtype_option() {
    empty_hub_cache();
    let text = |dtype: &str| {
        let llm = create_llm(
            "native",
            &fixture("tiny-trained"),
            on(2).extra("dtype", dtype),
        )
        .unwrap();
        async move {
            let with = llm.generate(req(24)).await.unwrap();
            let without = llm.generate(req(24).speculation(false)).await.unwrap();
            assert_eq!(with.content, without.content);
            with.content
        }
    };
    assert_eq!(text("auto").await, text("f32").await);
    text("bf16").await;
    let Err(e) = create_llm(
        "native",
        &fixture("tiny-trained"),
        on(2).extra("dtype", "int3"),
    ) else {
        panic!("int3 accepted")
    };
    assert!(
        matches!(
            &e,
            mtp::Error::Provider(ProviderError::InvalidOption(o)) if o.key() == "dtype"
        ),
        "{e}"
    );
    assert!(e.to_string().contains("int3"), "{e}");
}

/// The `cache_type` option: `f16` and `bf16` KV caches generate, and speculation keeps the
/// target-only text with them (verify rows round their keys and values as single steps do);
/// `f32` is the default's text; anything else is refused, naming the key and the value.
#[tokio::test]
async fn kv_cache_type_option() {
    empty_hub_cache();
    let text = |kv: Option<&'static str>| {
        let opts = match kv {
            Some(kv) => on(2).extra("cache_type", kv),
            None => on(2),
        };
        let llm = create_llm("native", &fixture("tiny-trained"), opts).unwrap();
        async move {
            let with = llm.generate(req(24)).await.unwrap();
            let without = llm.generate(req(24).speculation(false)).await.unwrap();
            assert_eq!(with.content, without.content, "{kv:?}");
            assert!(with.metadata.speculation.used, "{kv:?}");
            with.content
        }
    };
    assert_eq!(text(None).await, text(Some("f32")).await);
    assert!(!text(Some("f16")).await.is_empty());
    assert!(!text(Some("bf16")).await.is_empty());
    let Err(e) = create_llm(
        "native",
        &fixture("tiny-trained"),
        on(2).extra("cache_type", "q8_0"),
    ) else {
        panic!("q8_0 accepted")
    };
    assert!(
        matches!(
            &e,
            mtp::Error::Provider(ProviderError::InvalidOption(o)) if o.key() == "cache_type"
        ),
        "{e}"
    );
    assert!(
        e.to_string().contains("cache_type") && e.to_string().contains("q8_0"),
        "{e}"
    );
}

fn demo_model() -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny-code");
    p.canonicalize().unwrap().display().to_string()
}

/// The report's exact JSON on the bundled demo model, for every case a user meets: used,
/// disabled per call, sampling that forces target-only, require_acceleration refusals, a missing
/// companion, and cache reuse. Counts are checked against each other, not against constants.
#[tokio::test]
async fn report_json_on_the_bundled_demo_model() {
    empty_hub_cache();
    let llm = create_llm("native", &demo_model(), on(1)).unwrap();
    let code = |n: u32| {
        GenerateRequest::new("fn main() {\n    let mut total = 0;\n")
            .raw()
            .max_output_tokens(n)
    };

    // Used: every field, with the counts consistent with each other.
    let r = llm.generate(code(96)).await.unwrap();
    let s = &r.metadata.speculation;
    let (d, a, n) = (s.drafted.unwrap(), s.accepted.unwrap(), s.rounds.unwrap());
    assert_eq!(d, n, "one proposal per round at depth 1");
    assert_eq!(
        serde_json::to_value(s).unwrap(),
        json!({
            "requested": true, "mode": "native_mtp", "used": true, "drafter": "embedded",
            "num_draft_tokens": 1, "depth_source": "provider", "auto_depth": false, "rounds_per_depth": [0, n],
            "runtime": "mtp-engine-cpu", "draft_kind": "mtp",
            "drafted": d, "accepted": a, "rounds": n, "acceptance_rate": a as f64 / d as f64,
            "accepted_per_position": [a], "output_preserving": true,
            "reason": null, "message": null
        })
    );
    // The demo model was trained on code: most proposals are right (models/README.md: 94% at
    // depth 1 on the bench's code prompt).
    assert!(a as f64 >= 0.7 * d as f64, "acceptance {a}/{d}");
    assert_eq!(r.usage.output_tokens, 96);

    // Sampling that needs target-only decoding.
    let pen = code(8).sampling(Sampling {
        presence_penalty: Some(0.5),
        ..Default::default()
    });
    let r = llm.generate(pen.clone()).await.unwrap();
    let msg = r.metadata.speculation.message.clone().unwrap();
    assert!(msg.contains("presence_penalty"), "{msg}");
    assert_eq!(
        serde_json::to_value(&r.metadata.speculation).unwrap(),
        json!({
            "requested": true, "mode": "native_mtp", "used": false, "drafter": null,
            "num_draft_tokens": 1, "depth_source": "provider", "auto_depth": false, "rounds_per_depth": null,
            "runtime": "mtp-engine-cpu", "draft_kind": null,
            "drafted": null, "accepted": null, "rounds": null, "acceptance_rate": null,
            "accepted_per_position": null, "output_preserving": null,
            "reason": "sampling_requires_target_only", "message": msg
        })
    );
    // ... and refused before generation with require_acceleration.
    let strict = pen.speculation(Speculation::native_mtp().with_require_acceleration(true));
    match llm.generate(strict).await {
        Err(ProviderError::SpeculationUnavailable {
            reason: Reason::SamplingRequiresTargetOnly,
            message,
        }) => assert!(message.contains("presence_penalty"), "{message}"),
        other => panic!("{other:?}"),
    }

    // Cache reuse: the second call reuses the first prompt and reply, same text as cold.
    let key = "demo-session";
    let first = GenerateRequest::new("fn add(a: i32, b: i32) -> i32 {")
        .messages(vec![])
        .prompt_cache_key(key)
        .max_output_tokens(24);
    let r1 = llm.generate(first).await.unwrap();
    let second = GenerateRequest::new("fn sub(a: i32, b: i32) -> i32 {")
        .messages(vec![
            Message::user("fn add(a: i32, b: i32) -> i32 {"),
            Message::assistant(r1.content.clone()),
        ])
        .prompt_cache_key(key)
        .max_output_tokens(24);
    let warm = llm.generate(second.clone()).await.unwrap();
    assert!(
        warm.usage.cached_input_tokens > r1.usage.input_tokens,
        "{:?}",
        warm.usage
    );
    assert!(warm.metadata.speculation.used);
    let cold = llm
        .generate(second.prompt_cache_key("another-session"))
        .await
        .unwrap();
    assert_eq!(cold.usage.cached_input_tokens, 0);
    assert_eq!(warm.content, cold.content);

    // A named companion that is not cached: the model answers without MTP, and the message
    // carries the command that fetches it.
    let missing = "mlx-community/Qwen3.5-0.8B-MTP";
    let llm = create_llm(
        "native",
        &demo_model(),
        ProviderOptions::default()
            .speculation(Speculation::native_mtp().with_drafter(missing).unwrap()),
    )
    .unwrap();
    let r = llm.generate(code(4)).await.unwrap();
    let msg = r.metadata.speculation.message.clone().unwrap();
    assert!(
        msg.contains(&format!("mtp models download {missing}")),
        "{msg}"
    );
    assert_eq!(
        serde_json::to_value(&r.metadata.speculation).unwrap(),
        json!({
            "requested": true, "mode": "native_mtp", "used": false, "drafter": missing,
            "num_draft_tokens": null, "depth_source": null, "auto_depth": false, "rounds_per_depth": null,
            "runtime": "mtp-engine-cpu", "draft_kind": null,
            "drafted": null, "accepted": null, "rounds": null, "acceptance_rate": null,
            "accepted_per_position": null, "output_preserving": null,
            "reason": "mtp_head_not_cached", "message": msg
        })
    );
}

/// The context is enforced: the reply stops where prompt and reply fill it (`finish_reason:
/// length` and a warning saying why), a prompt that fills it alone is refused naming both
/// sizes, and `ctx_size` lowers it below the model's `max_position_embeddings`.
#[tokio::test]
async fn context_length_is_enforced() {
    empty_hub_cache();
    let opts = on(2).extra("ctx_size", "48");
    let llm = create_llm("native", &fixture("tiny-trained"), opts).unwrap();
    let prompt = "the quick brown fox "; // 20 byte tokens
    let r = llm
        .generate(
            GenerateRequest::new(prompt)
                .raw()
                .max_output_tokens(4_000_000_000),
        )
        .await
        .unwrap();
    assert_eq!(r.usage.input_tokens, 20);
    assert_eq!(r.usage.output_tokens, 28, "48 - 20");
    assert_eq!(r.finish_reason, mtp::FinishReason::Length);
    assert!(
        r.warnings
            .iter()
            .any(|w| w.contains("context length") && w.contains("48-token")),
        "{:?}",
        r.warnings
    );
    // a bound inside the context: no warning
    let r = llm
        .generate(GenerateRequest::new(prompt).raw().max_output_tokens(8))
        .await
        .unwrap();
    assert_eq!(r.usage.output_tokens, 8);
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
    // a prompt as long as the context
    let long = "x".repeat(48);
    let err = llm
        .generate(GenerateRequest::new(long).raw().max_output_tokens(4))
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(
            err,
            ProviderError::ContextLengthExceeded { context: 48, .. }
        ) && msg.contains("is 48 tokens")
            && msg.contains("maximum context length is 48 tokens"),
        "{msg}"
    );
    // a ctx_size that is not a positive integer
    let err = create_llm(
        "native",
        &fixture("tiny-trained"),
        on(2).extra("ctx_size", "0"),
    )
    .err()
    .expect("ctx_size 0 is refused");
    assert!(err.to_string().contains("ctx_size"), "{err}");
}

/// A drafter named as a path that does not exist is an error naming it, not a target-only run
/// whose message suggests downloading the path.
#[tokio::test]
async fn a_missing_drafter_path_is_an_error_naming_it() {
    empty_hub_cache();
    for d in ["./no/such/drafter", "/no/such/drafter", "../nope-mtp"] {
        let opts = ProviderOptions::default()
            .speculation(Speculation::native_mtp().with_drafter(d).unwrap());
        let err = create_llm("native", &fixture("tiny-trained"), opts)
            .err()
            .unwrap_or_else(|| panic!("{d}: loaded"));
        let msg = err.to_string();
        assert!(msg.contains(d) && msg.contains("does not exist"), "{msg}");
        assert!(!msg.contains("mtp models download"), "{msg}");
    }
}

/// The longest run of one byte in `text` for which `which` holds.
fn longest_run(text: &[u8], which: impl Fn(u8) -> bool) -> usize {
    let (mut best, mut run, mut prev) = (0, 0, None);
    for &b in text {
        run = if which(b) && prev == Some(b) {
            run + 1
        } else {
            1
        };
        if which(b) {
            best = best.max(run);
        }
        prev = Some(b);
    }
    best
}

/// The README's first command on the bundled demo model (`mtp generate --max-tokens 64
/// "fn main() {"`, greedy from its `generation_config.json`) prints something that reads as
/// code, not a screen of blanks: at least 20 distinct bytes, no run of more than 8 identical
/// non-space bytes, no more than 24 spaces in a row. And on code it has not seen verbatim
/// (prompts absent from its training text), MTP at depth 3 is accepted at least 60% of the time.
#[tokio::test]
async fn the_demo_models_first_screen_reads_as_code() {
    empty_hub_cache();
    let llm = create_llm("native", &demo_model(), on(3)).unwrap();
    let r = llm
        .generate(GenerateRequest::new("fn main() {").max_output_tokens(64))
        .await
        .unwrap();
    let text = r.content.as_bytes();
    let distinct = text.iter().collect::<std::collections::BTreeSet<_>>().len();
    assert!(distinct >= 20, "{distinct} distinct bytes: {:?}", r.content);
    assert!(
        longest_run(text, |b| b != b' ') <= 8,
        "a long run: {:?}",
        r.content
    );
    assert!(
        longest_run(text, |b| b == b' ') <= 24,
        "a screen of blanks: {:?}",
        r.content
    );

    let corpus = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../xtask/data/tiny-code-corpus.txt"),
    )
    .unwrap();
    let (mut drafted, mut accepted) = (0u64, 0u64);
    for prompt in [
        "fn fibonacci(n: u64) -> u64 {\n",
        "struct Point {\n    x: f32,\n    y: f32,\n}\n\nimpl Point {\n",
        "pub fn parse_header(bytes: &[u8]) -> Result<Header, Error> {\n",
        "    for (row, cell) in cells.iter().enumerate() {\n",
    ] {
        assert!(!corpus.contains(prompt), "seen verbatim: {prompt:?}");
        let r = llm
            .generate(GenerateRequest::new(prompt).raw().max_output_tokens(96))
            .await
            .unwrap();
        let s = &r.metadata.speculation;
        assert!(s.used, "{s:?}");
        drafted += s.drafted.unwrap();
        accepted += s.accepted.unwrap();
    }
    let rate = accepted as f64 / drafted as f64;
    assert!(rate >= 0.6, "acceptance {accepted}/{drafted} = {rate:.2}");
}

/// A provider started with speculation off has no lane: a request asking for MTP is told so
/// (`lane_not_loaded`, and how to start it), not that the request disabled it.
#[tokio::test]
async fn a_request_for_mtp_on_a_provider_started_off_says_the_lane_was_not_loaded() {
    empty_hub_cache();
    let opts = ProviderOptions::default().speculation(Speculation::off());
    let llm = create_llm("native", &fixture("tiny-trained"), opts).unwrap();
    let st = llm.speculation_status();
    assert!(!st.lane_loaded);
    assert_eq!(st.reason, Some(Reason::LaneNotLoaded));
    let r = llm
        .generate(req(8).speculation(Speculation::native_mtp()))
        .await
        .unwrap();
    let s = &r.metadata.speculation;
    assert!(!s.used);
    assert_eq!(s.reason, Some(Reason::LaneNotLoaded));
    let m = s.message.as_deref().unwrap();
    assert!(
        m.contains("started with speculation off") && m.contains("--speculation native_mtp"),
        "{m}"
    );
    // a request that does not ask is told the provider's own setting turned it off
    let plain = llm.generate(req(8)).await.unwrap();
    assert_eq!(
        plain.metadata.speculation.reason,
        Some(Reason::DisabledByRequest)
    );
    // and one that requires it is refused with the same reason
    let err = llm
        .generate(req(8).speculation(Speculation::native_mtp().with_require_acceleration(true)))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            ProviderError::SpeculationUnavailable {
                reason: Reason::LaneNotLoaded,
                ..
            }
        ),
        "{err:?}"
    );
}

/// Special-token strings written in a chat message are the client's text: `<|endoftext|>` in a
/// message costs its bytes' tokens, not one special token, unless the provider is started with
/// `parse_special`; a raw prompt (`/v1/completions`) is the client's markup and is parsed.
#[tokio::test]
async fn special_token_strings_in_messages_are_text_unless_parse_special() {
    empty_hub_cache();
    async fn tokens(llm: &std::sync::Arc<dyn mtp::Provider>, req: GenerateRequest) -> u64 {
        llm.generate(req.max_output_tokens(1))
            .await
            .unwrap()
            .usage
            .input_tokens
    }
    let with = "say <|endoftext|> twice";
    let without = "say  twice";
    let chat = |t: &str| GenerateRequest::new("").messages(vec![Message::user(t)]);

    let llm = create_llm("native", &fixture("tiny-trained"), on(2)).unwrap();
    let diff = tokens(&llm, chat(with)).await - tokens(&llm, chat(without)).await;
    assert!(
        diff > 1,
        "`<|endoftext|>` is {diff} token(s): it was read as a special token"
    );
    let raw = tokens(&llm, GenerateRequest::new(with).raw()).await
        - tokens(&llm, GenerateRequest::new(without).raw()).await;
    assert_eq!(raw, 1, "a raw prompt's special tokens are parsed");

    let parsing = create_llm(
        "native",
        &fixture("tiny-trained"),
        on(2).extra("parse_special", "true"),
    )
    .unwrap();
    let diff = tokens(&parsing, chat(with)).await - tokens(&parsing, chat(without)).await;
    assert_eq!(diff, 1, "parse_special: the special token");

    // a flag, spelled as in every lane: `yes` is `true`
    let yes = create_llm(
        "native",
        &fixture("tiny-trained"),
        on(2).extra("parse_special", "yes"),
    )
    .unwrap();
    let diff = tokens(&yes, chat(with)).await - tokens(&yes, chat(without)).await;
    assert_eq!(diff, 1, "parse_special=yes: the special token");

    let Err(e) = create_llm(
        "native",
        &fixture("tiny-trained"),
        on(2).extra("parse_special", "maybe"),
    ) else {
        panic!("a bad parse_special value is refused")
    };
    assert!(
        matches!(&e, mtp::Error::Provider(ProviderError::InvalidOption(o)) if o.key() == "parse_special"),
        "{e}"
    );
}

/// The request block as specified (issue 52): the default depth comes from the drafter's
/// config (`block_size: 3` counts the seed token: 2 proposals), the report says which level
/// decided; a request naming another drafter is not run with the loaded one; depths past the
/// measured range run with a warning, and one the engine cannot verify exactly is refused
/// naming the limit.
#[tokio::test]
async fn the_block_is_honoured_as_specified() {
    empty_hub_cache();
    let opts = ProviderOptions::default().speculation(
        Speculation::native_mtp()
            .with_drafter(fixture("tiny-mlx-mtp"))
            .unwrap(),
    );
    let llm = create_llm("mlx", &fixture("tiny-mlx"), opts).unwrap();
    assert_eq!(llm.speculation_status().num_draft_tokens, Some(2));
    let r = llm.generate(req(16)).await.unwrap();
    let s = &r.metadata.speculation;
    assert!(s.used, "{s:?}");
    assert_eq!(s.num_draft_tokens, Some(2));
    assert_eq!(s.depth_source, Some(mtp::DepthSource::DrafterConfig));
    assert_eq!(s.output_preserving, Some(true));
    let v = serde_json::to_value(s).unwrap();
    assert_eq!(v["depth_source"], "drafter_config");
    // the request's depth wins, and says so
    let r = llm
        .generate(req(16).speculation(Speculation::depth(3).unwrap()))
        .await
        .unwrap();
    let s = &r.metadata.speculation;
    assert_eq!(
        (s.num_draft_tokens, s.depth_source),
        (Some(3), Some(mtp::DepthSource::Request))
    );

    // another drafter named by the request: target-only with the reason, same text
    let other = Speculation::native_mtp()
        .with_drafter("mlx-community/Other-MTP")
        .unwrap();
    let r = llm
        .generate(req(16).speculation(other.clone()))
        .await
        .unwrap();
    let s = &r.metadata.speculation;
    assert!(!s.used);
    assert_eq!(s.reason, Some(Reason::DrafterNotLoaded));
    assert!(
        s.message
            .as_deref()
            .unwrap()
            .contains("mlx-community/Other-MTP"),
        "{s:?}"
    );
    let plain = llm.generate(req(16).speculation(false)).await.unwrap();
    assert_eq!(r.token_ids, plain.token_ids);
    match llm
        .generate(req(16).speculation(other.with_require_acceleration(true)))
        .await
    {
        Err(ProviderError::SpeculationUnavailable {
            reason: Reason::DrafterNotLoaded,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }

    // past the measured range: runs, output unchanged, and the report warns
    let r = llm
        .generate(req(24).speculation(Speculation::depth(12).unwrap()))
        .await
        .unwrap();
    let s = &r.metadata.speculation;
    assert!(s.used, "{s:?}");
    assert_eq!(s.num_draft_tokens, Some(12));
    assert!(
        s.message
            .as_deref()
            .unwrap_or_default()
            .contains("above the measured range"),
        "{s:?}"
    );
    let plain = llm.generate(req(24).speculation(false)).await.unwrap();
    assert_eq!(r.token_ids, plain.token_ids);
    // the deepest round one exact verify forward holds: 31 proposals, output unchanged
    let r = llm
        .generate(req(48).speculation(Speculation::depth(31).unwrap()))
        .await
        .unwrap();
    assert!(r.metadata.speculation.used);
    let plain = llm.generate(req(48).speculation(false)).await.unwrap();
    assert_eq!(r.token_ids, plain.token_ids);
    // what one exact verify forward cannot hold is refused, naming the limit
    match llm
        .generate(req(8).speculation(Speculation::depth(40).unwrap()))
        .await
    {
        Err(ProviderError::InvalidRequest { field, message }) => {
            assert_eq!(field, "speculation");
            assert!(
                message.contains("40") && message.contains("31"),
                "{message}"
            );
        }
        other => panic!("{other:?}"),
    }
}

/// The seed's option names: `mlx_batching` is `max_batch` (scheduled mode: overlapping calls
/// are queued, not refused), `mlx_ple_offload` is refused saying why; docs/speculation.md's
/// option tables list exactly the keys the provider reads.
#[tokio::test]
async fn seed_option_names_and_the_documented_option_table() {
    empty_hub_cache();
    let with = |pairs: &[(&str, &str)]| {
        let mut o = on(2);
        for (k, v) in pairs {
            o.extra.insert(k.to_string(), v.to_string());
        }
        o
    };
    // scheduled: two calls at once both answer (direct mode refuses the second with Busy)
    for opts in [
        with(&[("mlx_batching", "True")]),
        with(&[("max_batch", "2")]),
    ] {
        let llm = create_llm("mlx", &fixture("tiny-mlx"), opts).unwrap();
        let (a, b) = tokio::join!(llm.generate(req(24)), llm.generate(req(24)));
        assert_eq!(a.unwrap().token_ids, b.unwrap().token_ids);
    }
    match create_llm(
        "mlx",
        &fixture("tiny-mlx"),
        with(&[("mlx_batching", "false"), ("max_batch", "4")]),
    ) {
        Err(e) => assert!(e.to_string().contains("contradicts"), "{e}"),
        Ok(_) => panic!("a contradiction was accepted"),
    }
    for v in ["true", "false"] {
        match create_llm(
            "native",
            &fixture("tiny-trained"),
            with(&[("mlx_ple_offload", v)]),
        ) {
            Err(e) => assert!(e.to_string().contains("not applicable"), "{e}"),
            Ok(_) => panic!("mlx_ple_offload={v} was accepted"),
        }
    }
    let doc = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/speculation.md"),
    )
    .unwrap();
    let keys_of = |heading: &str| -> Vec<String> {
        let at = doc.find(heading).unwrap();
        doc[at..]
            .lines()
            .skip_while(|l| !l.starts_with('|'))
            .take_while(|l| l.starts_with('|'))
            .skip(2)
            .flat_map(|l| {
                let first = l.trim_matches('|').split(" | ").next().unwrap().to_string();
                first
                    .split(", ")
                    .map(|k| k.trim().trim_matches('`').to_string())
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let mut documented = keys_of("## Native provider options");
    let mut known: Vec<String> = mtp::native::EXTRA_KEYS.map(String::from).to_vec();
    documented.sort();
    known.sort();
    assert_eq!(documented, known);
    let seed = keys_of("The seed project's option names");
    assert_eq!(seed, mtp::native::SEED_ALIASES.map(String::from).to_vec());
    assert!(doc.contains(&format!(
        "{} when `max_batch` is not given",
        mtp::native::SEED_BATCHING_MAX_BATCH
    )));
}

/// `output_preserving` is the registry's word on the pairing, `false` included: a checkpoint
/// the registry knows as one whose greedy output diverged says so in every report (the
/// native engine says `true` only where the registry knows nothing).
#[tokio::test]
async fn the_registrys_output_preserving_reaches_the_report() {
    empty_hub_cache();
    // the tiny checkpoint under the name of a registry entry marked `output_preserving: false`
    let dir = tempfile::tempdir().unwrap();
    let named = dir.path().join("gemma-4-26b-a4b-it");
    std::fs::create_dir(&named).unwrap();
    for e in std::fs::read_dir(fixture("tiny-trained")).unwrap() {
        let e = e.unwrap();
        std::os::unix::fs::symlink(e.path(), named.join(e.file_name())).unwrap();
    }
    let entry = mtp_detect::RegistryView::lookup("gemma-4-26b-a4b-it").unwrap();
    assert_eq!(entry.output_preserving, Some(false));
    let llm = create_llm("native", named.to_str().unwrap(), on(2)).unwrap();
    assert_eq!(llm.speculation_status().output_preserving, Some(false));
    let r = llm.generate(req(8)).await.unwrap();
    assert!(r.metadata.speculation.used);
    assert_eq!(r.metadata.speculation.output_preserving, Some(false));
    // and the checkpoint under its own name: the registry knows nothing, the engine says true
    let llm = create_llm("native", &fixture("tiny-trained"), on(2)).unwrap();
    let r = llm.generate(req(8)).await.unwrap();
    assert_eq!(r.metadata.speculation.output_preserving, Some(true));
}
