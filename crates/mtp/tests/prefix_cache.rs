//! The native prefix cache with continuous batching and on disk: a chat's second turn resumes
//! the first turn's checkpoint when it is batched with other requests, and after the provider
//! that kept it is gone (from `prompt_cache_dir`); the answer is a cold run's either way.

use std::path::PathBuf;

use mtp::{create_llm, GenerateRequest, Message, ProviderOptions, Speculation};

fn fixture(name: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name);
    p.canonicalize().unwrap().display().to_string()
}

fn opts(depth: u32) -> ProviderOptions {
    ProviderOptions::default().speculation(
        Speculation::native_mtp()
            .with_num_draft_tokens(depth)
            .unwrap(),
    )
}

fn turn(history: Vec<Message>, prompt: &str, key: &str, spec: bool) -> GenerateRequest {
    GenerateRequest::new(prompt)
        .messages(history)
        .prompt_cache_key(key)
        .max_output_tokens(16)
        .speculation(spec)
}

#[tokio::test]
async fn batched_calls_resume_and_keep_checkpoints() {
    let llm = create_llm(
        "native",
        &fixture("tiny-trained"),
        opts(2).extra("max_batch", "4"),
    )
    .unwrap();
    for spec in [true, false] {
        let key = format!("batched-{spec}");
        let first = "the quick brown fox ";
        let r1 = llm.generate(turn(vec![], first, &key, spec)).await.unwrap();
        let history = vec![Message::user(first), Message::assistant(r1.content.clone())];
        let second = turn(history, "jumps over ", &key, spec);
        // the second turn decodes next to two other requests
        let [oa, ob] = ["a b c ", "hello "]
            .map(|p| llm.generate(GenerateRequest::new(p).raw().max_output_tokens(24)));
        let (warm, a, b) = tokio::join!(llm.generate(second.clone()), oa, ob);
        let warm = warm.unwrap();
        assert!(a.is_ok() && b.is_ok());
        assert!(
            warm.usage.cached_input_tokens > r1.usage.input_tokens,
            "spec={spec}: {:?} after {:?}",
            warm.usage,
            r1.usage
        );
        let cold = llm
            .generate(second.prompt_cache_key("a cold key"))
            .await
            .unwrap();
        assert_eq!(cold.usage.cached_input_tokens, 0);
        assert_eq!(warm.token_ids, cold.token_ids, "spec={spec}");
        assert_eq!(warm.metadata.speculation.used, spec);
    }
}

#[tokio::test]
async fn checkpoints_on_disk_outlive_the_provider() {
    let dir = tempfile::tempdir().unwrap();
    let with_disk = || {
        opts(3)
            .extra("prompt_cache_dir", dir.path().display().to_string())
            .extra("prompt_cache_disk_bytes", (64u64 << 20).to_string())
    };
    let model = fixture("tiny-moe");
    let first = "the quick brown fox ";
    let llm = create_llm("native", &model, with_disk()).unwrap();
    let r1 = llm.generate(turn(vec![], first, "s", true)).await.unwrap();
    let history = vec![Message::user(first), Message::assistant(r1.content.clone())];
    let second = turn(history, "jumps over ", "s", true);
    let warm = llm.generate(second.clone()).await.unwrap();
    assert!(warm.usage.cached_input_tokens > 0, "{:?}", warm.usage);
    // unloading frees the weights and the cache, whose queued writes finish first
    llm.unload().await.unwrap();
    drop(llm);
    assert_eq!(mtp::native::loaded_copies(std::path::Path::new(&model)), 0);

    // a new load: the second turn resumes from the disk as far as it did from memory
    let llm = create_llm("native", &model, with_disk()).unwrap();
    let again = llm.generate(second.clone()).await.unwrap();
    assert_eq!(
        again.usage.cached_input_tokens, warm.usage.cached_input_tokens,
        "{:?}",
        again.usage
    );
    let cold = llm
        .generate(second.clone().prompt_cache_key("cold"))
        .await
        .unwrap();
    assert_eq!(cold.usage.cached_input_tokens, 0);
    assert_eq!(again.token_ids, cold.token_ids);
    assert_eq!(warm.token_ids, cold.token_ids);
    // clearing the cache empties the disk too
    llm.prompt_cache_clear(None).unwrap();
    llm.unload().await.unwrap();
    drop(llm);
    let llm = create_llm("native", &model, with_disk()).unwrap();
    let after = llm.generate(second).await.unwrap();
    assert_eq!(after.usage.cached_input_tokens, 0);
    assert_eq!(after.token_ids, cold.token_ids);
}

#[test]
fn disk_options_are_checked() {
    let model = fixture("tiny-hf");
    let refused = |o: ProviderOptions| match create_llm("native", &model, o) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("accepted"),
    };
    let e = refused(opts(1).extra("prompt_cache_disk_bytes", "1000"));
    assert!(e.contains("needs `prompt_cache_dir`"), "{e}");
    let e = refused(
        opts(1)
            .extra("prompt_cache_dir", "/tmp/x")
            .extra("prompt_cache_disk_bytes", "lots"),
    );
    assert!(e.contains("`prompt_cache_disk_bytes` must be"), "{e}");
    // a folder that cannot be created: the error names it
    let file = tempfile::NamedTempFile::new().unwrap();
    let under_a_file = file.path().join("cache");
    let e = refused(opts(1).extra("prompt_cache_dir", under_a_file.display().to_string()));
    assert!(e.contains("prefix cache directory"), "{e}");
    assert!(e.contains(&under_a_file.display().to_string()), "{e}");
}

/// A batched call reports what the same call alone reports: with a cache key and MTP on, the
/// same draft counts (not zero, although the checkpoint after the reply is taken from the
/// speculating state); an answer ended by a stop string keeps its timings and its
/// checkpoints, so the next turn resumes as much of the conversation as it does alone.
#[tokio::test]
async fn batched_reports_and_stop_ended_checkpoints_equal_solo() {
    let model = fixture("tiny-trained");
    let solo = create_llm("native", &model, opts(2)).unwrap();
    let batched = create_llm("native", &model, opts(2).extra("max_batch", "4")).unwrap();
    let first = "the quick brown fox ";
    // a stop string from the middle of the reply
    let probe = solo
        .generate(turn(vec![], first, "probe", false))
        .await
        .unwrap();
    let stop: String = probe.content.chars().skip(6).take(2).collect();
    let at = probe.content.find(&stop).unwrap();
    assert!(at > 0 && stop.chars().count() == 2, "{:?}", probe.content);
    for spec in [true, false] {
        let mut got = Vec::new();
        for (name, llm) in [("solo", &solo), ("batched", &batched)] {
            let key = format!("{name}-{spec}");
            let whole = llm
                .generate(turn(vec![], first, &format!("{key}-whole"), spec))
                .await
                .unwrap();
            let stopped = llm
                .generate(turn(vec![], first, &key, spec).stop(stop.clone()))
                .await
                .unwrap();
            let history = vec![
                Message::user(first),
                Message::assistant(stopped.content.clone()),
            ];
            let next = llm
                .generate(turn(history, "jumps over ", &key, spec))
                .await
                .unwrap();
            got.push((whole, stopped, next));
        }
        let [(sw, ss, sn), (bw, bs, bn)] = [&got[0], &got[1]].map(|(w, s, n)| (w, s, n));
        let counts = |r: &mtp::GenerateResponse| {
            let s = &r.metadata.speculation;
            (s.used, s.drafted, s.accepted, s.rounds)
        };
        assert_eq!(bw.token_ids, sw.token_ids, "spec={spec}");
        assert_eq!(counts(bw), counts(sw), "spec={spec}: the report");
        if spec {
            let (used, drafted, _, rounds) = counts(bw);
            assert!(
                used && drafted > Some(0) && rounds > Some(0),
                "{:?}",
                counts(bw)
            );
        }
        // ended by the stop string, with its timings
        assert_eq!(ss.finish_reason, mtp::FinishReason::Stop, "spec={spec}");
        assert_eq!(bs.finish_reason, ss.finish_reason, "spec={spec}");
        assert_eq!((&bs.content, &bs.token_ids), (&ss.content, &ss.token_ids));
        assert!(bs.usage.output_tokens < 16, "spec={spec}: {:?}", bs.usage);
        assert_eq!(
            counts(bs),
            counts(ss),
            "spec={spec}: the stopped answer's report"
        );
        let t = &bs.metadata.timings;
        assert!(
            t.prefill_ms.is_some() && t.decode_ms.is_some(),
            "spec={spec}: {t:?}"
        );
        // the next turn resumes what the stopped one kept
        assert!(
            sn.usage.cached_input_tokens > 0,
            "spec={spec}: {:?}",
            sn.usage
        );
        assert_eq!(
            bn.usage.cached_input_tokens, sn.usage.cached_input_tokens,
            "spec={spec}"
        );
        assert_eq!(bn.token_ids, sn.token_ids, "spec={spec}");
    }
}
