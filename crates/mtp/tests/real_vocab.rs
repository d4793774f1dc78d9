//! The facade on the real-vocabulary checkpoint (`cargo xtask fixtures --real-vocab`: a real
//! Qwen vocabulary, the Qwen3.5-4B chat template, an embedded MTP head): multi-turn chat through
//! the native provider with the prefix cache resuming each turn, the reasoning split, the CLI,
//! and the in-process llama.cpp provider on the same checkpoint converted to GGUF, against the
//! reference ids of `tests/fixtures/real-vocab/golden.json` (transformers + mlx-vlm).
//!
//! Ignored by a plain `cargo test` (the checkpoint is built from the llama.cpp source);
//! `cargo xtask test` builds it and runs them (`MTP_REAL_VOCAB_MODEL`).

#[cfg(feature = "gguf")]
#[path = "../../../xtask/src/gguf/convert.rs"]
#[allow(dead_code)]
mod convert;

mod llama_cpp_src {
    use std::path::{Path, PathBuf};

    use mtp::{create_llm, GenerateRequest, Message, ProviderOptions, Sampling, Speculation};
    use serde_json::Value;

    pub(crate) fn checkpoint() -> PathBuf {
        let dir = std::env::var_os("MTP_REAL_VOCAB_MODEL")
            .map(PathBuf::from)
            .expect("MTP_REAL_VOCAB_MODEL: cargo xtask test builds the checkpoint");
        assert!(dir.join("config.json").is_file(), "{}", dir.display());
        dir
    }

    pub(crate) fn golden() -> Value {
        let p = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/real-vocab/golden.json");
        serde_json::from_str(&std::fs::read_to_string(p).expect("golden")).expect("json")
    }

    pub(crate) fn greedy() -> Sampling {
        Sampling {
            temperature: Some(0.0),
            ..Default::default()
        }
    }

    /// The tokens `<|im_start|>assistant\n<think>\n`: the generation prompt of the Qwen3.5
    /// template with thinking on, as transformers tokenizes it (the last five ids of a golden
    /// prompt).
    fn generation_prompt_len(g: &Value) -> usize {
        let ids = g["cases"][0]["prompt_ids"].as_array().unwrap();
        let gen: Vec<u64> = ids[ids.len() - 5..]
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        assert_eq!(gen, vec![151_644, 77_091, 198, 151_667, 198]);
        gen.len()
    }

    /// A chat through the real template: the first turn's reply starts inside `<think>` (the
    /// template opened it) so what it wrote is reasoning; the second turn re-renders the
    /// conversation and resumes from the state kept before the first turn's generation prompt
    /// (everything but those five tokens comes from the prefix cache); MTP on and off give the
    /// same text.
    #[tokio::test]
    #[ignore = "needs the real-vocabulary checkpoint (MTP_REAL_VOCAB_MODEL); cargo xtask test builds it"]
    async fn real_vocab_chat_resumes_each_turn_from_the_prefix_cache() {
        let g = golden();
        let gen_len = generation_prompt_len(&g);
        let dir = checkpoint();
        let opts = ProviderOptions::default().speculation(Speculation::native_mtp());
        let llm = create_llm("native", dir.to_str().unwrap(), opts).unwrap();
        let turn1 = GenerateRequest::new("Hello! Who are you?")
            .messages(vec![])
            .prompt_cache_key("real-vocab-chat")
            .max_output_tokens(12)
            .sampling(greedy());
        let r1 = llm.generate(turn1.clone()).await.unwrap();
        let want: Vec<u32> = serde_json::from_value(g["cases"][0]["off"].clone()).unwrap();
        assert_eq!(
            r1.token_ids.as_deref(),
            Some(&want[..12]),
            "greedy = mlx-vlm"
        );
        assert_eq!(r1.usage.input_tokens, 16);
        assert_eq!(r1.usage.cached_input_tokens, 0);
        assert!(r1.metadata.speculation.used);
        assert!(r1.reasoning_content.is_some(), "{r1:?}");
        assert_eq!(
            r1.content, "",
            "no </think> in 12 random tokens: all reasoning"
        );
        let off = llm
            .generate(turn1.prompt_cache_key("other").speculation(false))
            .await
            .unwrap();
        assert_eq!(off.reasoning_content, r1.reasoning_content);

        let mut answer = Message::assistant(r1.content.clone());
        answer.reasoning_content = r1.reasoning_content.clone();
        let turn2 = GenerateRequest::new("And what can you do?")
            .messages(vec![Message::user("Hello! Who are you?"), answer])
            .prompt_cache_key("real-vocab-chat")
            .max_output_tokens(8)
            .sampling(greedy());
        let r2 = llm.generate(turn2).await.unwrap();
        assert_eq!(
            r2.usage.cached_input_tokens as usize,
            16 - gen_len,
            "turn 2 resumes after turn 1's conversation ({r2:?})"
        );
        assert!(r2.usage.input_tokens > 16);
    }

    /// Detection at the real vocabulary (`mtp probe --json`): the embedded head found from the
    /// weights, tied embeddings and all; and the provider recommends the checkpoint's
    /// generation_config.json sampling (do_sample with temperature 0.6, top-p 0.95, top-k 20).
    #[test]
    #[ignore = "needs the real-vocabulary checkpoint (MTP_REAL_VOCAB_MODEL); cargo xtask test builds it"]
    fn real_vocab_probe_and_recommended_sampling() {
        let dir = checkpoint();
        let model = dir.to_str().unwrap();
        let (io, c) = mtp::cli::Io::captured();
        let code = mtp::cli::run_with(["mtp", "probe", model, "--json"], io);
        assert_eq!(code, std::process::ExitCode::SUCCESS, "{}", c.stderr());
        let v: Value = serde_json::from_str(&c.stdout()).expect("probe JSON");
        let text = v.to_string();
        assert!(
            text.contains("mtp.fc.weight"),
            "the head's tensors are the evidence: {text}"
        );
        let llm = create_llm("native", model, ProviderOptions::default()).unwrap();
        let s = llm.recommended_sampling().expect("generation_config.json");
        assert_eq!(
            (s.temperature, s.top_p, s.top_k),
            (Some(0.6), Some(0.95), Some(20))
        );
    }

    /// `mtp generate` on the real checkpoint: the reasoning goes to stderr, the summary says what
    /// MTP did; `--thinking off` renders the closed empty block, so the reply is all answer.
    #[test]
    #[ignore = "needs the real-vocabulary checkpoint (MTP_REAL_VOCAB_MODEL); cargo xtask test builds it"]
    fn real_vocab_cli_generate() {
        let dir = checkpoint();
        let generate = |extra: &[&str]| {
            let mut args = vec!["mtp", "generate", "--model", dir.to_str().unwrap()];
            args.extend(["--max-tokens", "6", "--temperature", "0"]);
            args.extend_from_slice(extra);
            args.push("Hi");
            let (io, c) = mtp::cli::Io::captured();
            let code = mtp::cli::run_with(args, io);
            assert_eq!(code, std::process::ExitCode::SUCCESS, "{}", c.stderr());
            (c.stdout(), c.stderr())
        };
        let (out, err) = generate(&[]);
        assert_eq!(out, "", "all reasoning: nothing on stdout");
        assert!(err.contains("6 tokens"), "{err}");
        assert!(err.contains("MTP on"), "{err}");
        let (out, _) = generate(&["--thinking", "off", "--json"]);
        let v: Value = serde_json::from_str(&out).unwrap();
        assert!(v.get("reasoning_content").is_none(), "{v}");
        assert_eq!(v["usage"]["output_tokens"], 6);
    }

    /// The same checkpoint converted to GGUF (tokenizer and chat template included) and run by
    /// llama.cpp in-process: the GGUF's template renders through the same renderer, and greedy
    /// output with and without MTP is the reference's on the same prompt (llama.cpp does not
    /// NFC-normalize, so the one case with decomposed accents is left out).
    #[cfg(feature = "gguf")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "needs the real-vocabulary checkpoint (MTP_REAL_VOCAB_MODEL); cargo xtask test builds it"]
    async fn real_vocab_gguf_provider_matches_the_reference() {
        let g = golden();
        let dir = checkpoint();
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("real-vocab.gguf");
        crate::convert::convert(&dir, &path, &crate::convert::ConvertOptions::default())
            .expect("convert");
        let opts = ProviderOptions::default()
            .speculation(Speculation::native_mtp().with_num_draft_tokens(2).unwrap())
            .extra("n_ctx", "1024")
            .extra("threads", "2");
        let llm = create_llm("gguf", path.to_str().unwrap(), opts).unwrap();
        let n = 12;
        for case in g["cases"].as_array().unwrap() {
            let name = case["name"].as_str().unwrap();
            if name == "unicode_nfd" {
                continue;
            }
            let messages: Vec<Message> = serde_json::from_value(case["messages"].clone()).unwrap();
            let mut req = GenerateRequest::new("")
                .messages(messages)
                .max_output_tokens(n)
                .sampling(greedy());
            if let Some(t) = case["enable_thinking"].as_bool() {
                req = req.thinking(t);
            }
            if let Some(tools) = case["tools"].as_array() {
                req = req.tools(tools.clone());
            }
            let want: Vec<u32> = serde_json::from_value(case["off"].clone()).unwrap();
            let want = &want[..n as usize];
            let on = llm.generate(req.clone()).await.unwrap();
            assert_eq!(
                on.usage.input_tokens,
                case["prompt_ids"].as_array().unwrap().len() as u64,
                "{name}"
            );
            assert!(on.metadata.speculation.used, "{name}");
            let off = llm.generate(req.speculation(false)).await.unwrap();
            assert_eq!(
                off.token_ids.as_deref(),
                Some(want),
                "{name}: llama.cpp, MTP off"
            );
            assert_eq!(
                on.token_ids.as_deref(),
                Some(want),
                "{name}: llama.cpp, MTP on"
            );
            assert_eq!(on.reasoning_content, off.reasoning_content, "{name}");
        }
    }
}
