//! Command-level tests of `mtp`: in-process through `mtp::cli::run_with` with the fake
//! provider registered (generate, chat with scripted input, bench). The real binary's tests are
//! in cli_binary.rs, tool calling in cli_tools.rs.

#[path = "cli_fake_provider.rs"]
mod fake;
#[path = "support/cli.rs"]
mod support;

use std::process::ExitCode;

use support::*;

// ---------------------------------------------------------------- generate

#[test]
fn generate_streams_text_then_one_summary_line() {
    let (code, out, err) = mtp(&[
        "generate",
        "--provider",
        "fake",
        "--model",
        "m",
        "--max-tokens",
        "10",
        "gen-text",
    ]);
    assert_eq!(code, OK, "{err}");
    assert_eq!(out, format!("{}\n", fake::expected_text(10)));
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].contains("10 tokens"), "{err}");
    assert!(lines[0].contains("tok/s"), "{err}");
    assert!(lines[0].contains("MTP on (depth 3): acceptance"), "{err}");
}

#[test]
fn generate_json_prints_one_object_with_the_documented_keys() {
    let (code, out, err) = mtp(&[
        "generate",
        "--provider",
        "fake",
        "--model",
        "m",
        "--max-tokens",
        "8",
        "--json",
        "gen-json",
    ]);
    assert_eq!(code, OK, "{err}");
    let v = json(&out);
    assert_eq!(v["content"], fake::expected_text(8));
    assert_eq!(v["token_ids"].as_array().unwrap().len(), 8);
    assert_eq!(v["finish_reason"], "length");
    assert_eq!(v["usage"]["output_tokens"], 8);
    let spec = &v["metadata"]["speculation"];
    assert_eq!(spec["used"], true);
    assert_eq!(spec["mode"], "native_mtp");
    assert_eq!(spec["num_draft_tokens"], 3);
    assert_eq!(spec["drafter"], "embedded");
    assert!(
        v["metadata"]["timings"]["decode_tokens_per_s"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    assert!(err.is_empty(), "--json writes nothing else: {err}");
}

#[test]
fn generate_speculation_off_reports_the_reason() {
    let (code, _out, err) = mtp(&[
        "generate",
        "--provider",
        "fake",
        "--model",
        "m",
        "--speculation",
        "off",
        "--max-tokens",
        "4",
        "gen-off",
    ]);
    assert_eq!(code, OK, "{err}");
    // the user said off: that is a request, not the absence of one
    assert!(err.contains("MTP not used (disabled_by_request)"), "{err}");
    let (_, out, _) = mtp(&[
        "generate",
        "--provider",
        "fake",
        "--model",
        "m",
        "--speculation",
        "false",
        "--json",
        "gen-off-json",
    ]);
    assert_eq!(json(&out)["metadata"]["speculation"]["used"], false);
}

#[test]
fn generate_speculation_accepts_a_json_block() {
    let (code, out, err) = mtp(&[
        "generate",
        "--provider",
        "fake",
        "--model",
        "m",
        "--json",
        "--max-tokens",
        "6",
        "--speculation",
        r#"{"mode":"native_mtp","num_draft_tokens":2}"#,
        "gen-block",
    ]);
    assert_eq!(code, OK, "{err}");
    assert_eq!(json(&out)["metadata"]["speculation"]["num_draft_tokens"], 2);
}

#[test]
fn generate_num_draft_tokens_and_drafter_set_the_provider_default() {
    let (code, out, err) = mtp(&[
        "generate",
        "--provider",
        "fake",
        "--model",
        "m-depth",
        "--num-draft-tokens",
        "5",
        "--drafter",
        "org/drafter",
        "--json",
        "--max-tokens",
        "12",
        "gen-depth",
    ]);
    assert_eq!(code, OK, "{err}");
    let spec = &json(&out)["metadata"]["speculation"];
    assert_eq!(spec["num_draft_tokens"], 5);
    assert_eq!(spec["drafter"], "org/drafter");
    let opts = fake::OPTIONS.lock().unwrap();
    let (_, o) = opts.iter().find(|(m, _)| m == "m-depth").unwrap();
    let s = o.speculation.as_ref().unwrap();
    assert_eq!(s.num_draft_tokens, Some(5.into()));
    assert_eq!(s.drafter.as_deref(), Some("org/drafter"));
    assert_eq!(s.require_acceleration, None);
}

#[test]
fn generate_passes_every_sampling_flag() {
    let (code, _out, err) = mtp(&[
        "generate",
        "--provider",
        "fake",
        "--model",
        "m",
        "--temperature",
        "0.7",
        "--top-p",
        "0.9",
        "--top-k",
        "40",
        "--min-p",
        "0.05",
        "--seed",
        "7",
        "--max-tokens",
        "3",
        "gen-sampling",
    ]);
    assert_eq!(code, OK, "{err}");
    let r = requests_for("gen-sampling");
    assert_eq!(r.len(), 1);
    let s = &r[0].sampling;
    assert_eq!(s.temperature, Some(0.7));
    assert_eq!(s.top_p, Some(0.9));
    assert_eq!(s.top_k, Some(40));
    assert_eq!(s.min_p, Some(0.05));
    assert_eq!(s.seed, Some(7));
    assert_eq!(r[0].max_output_tokens, Some(3));
    assert!(
        err.contains("MTP on"),
        "compatible sampling keeps MTP: {err}"
    );
}

#[test]
fn generate_penalties_run_target_only_and_say_so() {
    for (flag, value, name) in [
        ("--repetition-penalty", "1.2", "repetition_penalty"),
        ("--presence-penalty", "0.5", "presence_penalty"),
        ("--frequency-penalty", "-0.5", "frequency_penalty"),
    ] {
        let prompt = format!("gen-penalty-{name}");
        let (code, _out, err) = mtp(&[
            "generate",
            "--provider",
            "fake",
            "--model",
            "m",
            flag,
            value,
            "--max-tokens",
            "3",
            &prompt,
        ]);
        assert_eq!(code, OK, "{err}");
        assert!(
            err.contains("MTP not used (sampling_requires_target_only)"),
            "{err}"
        );
        assert!(err.contains(name), "{err}");
    }
}

#[test]
fn generate_require_acceleration_refuses_penalties_before_generating() {
    let (code, out, err) = mtp(&[
        "generate",
        "--provider",
        "fake",
        "--model",
        "m",
        "--require-acceleration",
        "--repetition-penalty",
        "1.3",
        "gen-strict",
    ]);
    assert_ne!(code, OK);
    assert!(out.is_empty(), "nothing generated: {out}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("mtp: error:"), "{err}");
    assert!(
        err.contains("speculation unavailable (sampling_requires_target_only)"),
        "{err}"
    );
    assert!(err.contains("drop --require-acceleration"), "{err}");
}

#[test]
fn generate_require_acceleration_refuses_to_start_without_a_lane() {
    let (code, _out, err) = mtp(&[
        "generate",
        "--provider",
        "fake",
        "--model",
        "nolane",
        "--require-acceleration",
        "gen-nolane",
    ]);
    assert_ne!(code, OK);
    assert!(err.contains("refusing to start"), "{err}");
    assert!(err.contains("mtp_head_not_cached"), "{err}");
    assert!(err.contains("mtp models download fake/drafter"), "{err}");
    assert!(requests_for("gen-nolane").is_empty());
}

#[test]
fn generate_without_a_lane_runs_and_reports_why() {
    let (code, _out, err) = mtp(&[
        "generate",
        "--provider",
        "fake",
        "--model",
        "nolane",
        "--max-tokens",
        "4",
        "gen-nolane-ok",
    ]);
    assert_eq!(code, OK, "{err}");
    assert!(err.contains("MTP not used (mtp_head_not_cached)"), "{err}");
}

#[test]
fn generate_base_url_and_api_key_reach_the_provider() {
    let (code, _out, err) = mtp(&[
        "generate",
        "--provider",
        "fake",
        "--model",
        "m-http",
        "--base-url",
        "http://127.0.0.1:1234",
        "--api-key",
        "secret-key",
        "--max-tokens",
        "2",
        "gen-http",
    ]);
    assert_eq!(code, OK, "{err}");
    let opts = fake::OPTIONS.lock().unwrap();
    let (_, o) = opts.iter().find(|(m, _)| m == "m-http").unwrap();
    assert_eq!(o.base_url.as_deref(), Some("http://127.0.0.1:1234"));
    assert_eq!(o.api_key.as_deref(), Some("secret-key"));
    assert!(!err.contains("secret-key"));
}

#[test]
fn generate_raw_uses_the_prompt_verbatim() {
    let (code, _, err) = mtp(&[
        "generate",
        "--provider",
        "fake",
        "--model",
        "m",
        "--raw",
        "--max-tokens",
        "2",
        "gen-raw",
    ]);
    assert_eq!(code, OK, "{err}");
    assert!(requests_for("gen-raw")[0].raw_prompt);
}

#[test]
fn generate_thinking_modes() {
    // `mtp generate --model think [--thinking MODE] [extra…] PROMPT` with 4 tokens
    let think = |mode: Option<&str>, extra: &[&str], prompt: &str| {
        let mut args = vec!["generate", "--provider", "fake", "--model", "think"];
        if let Some(m) = mode {
            args.extend(["--thinking", m]);
        }
        args.extend(["--max-tokens", "4"]);
        args.extend_from_slice(extra);
        args.push(prompt);
        mtp(&args)
    };
    let answer = format!("{}\n", fake::expected_text(4));
    // default: the template decides; the reasoning goes to stderr, the answer alone to stdout
    let (code, out, err) = think(None, &[], "think-default");
    assert_eq!(code, OK, "{err}");
    assert_eq!(out, answer);
    assert!(err.starts_with(fake::REASONING), "{err}");
    assert_eq!(requests_for("think-default")[0].thinking, None);
    // on: enable_thinking true, shown
    let (code, _, err) = think(Some("on"), &[], "think-on");
    assert_eq!(code, OK, "{err}");
    assert!(err.contains(fake::REASONING), "{err}");
    assert_eq!(requests_for("think-on")[0].thinking, Some(true));
    // off: enable_thinking false (the fake then reasons not at all); hide: reasons, but only
    // the answer is printed
    for (mode, thinking) in [("off", false), ("hide", true)] {
        let prompt = format!("think-{mode}");
        let (code, out, err) = think(Some(mode), &[], &prompt);
        assert_eq!(code, OK, "{err}");
        assert_eq!(out, answer, "{mode}");
        assert!(!err.contains("The user wants"), "{mode}: {err}");
        assert_eq!(requests_for(&prompt)[0].thinking, Some(thinking), "{mode}");
    }
    // --json carries the reasoning, unless hidden
    let (_, out, _) = think(None, &["--json"], "think-json");
    assert_eq!(json(&out)["reasoning_content"], fake::REASONING);
    let (_, out, _) = think(Some("hide"), &["--json"], "think-json-hide");
    assert!(json(&out).get("reasoning_content").is_none(), "{out}");
    // a bad mode is a usage error naming the values
    let (code, _, err) = mtp(&["generate", "--provider", "fake", "--thinking", "maybe", "x"]);
    assert_eq!(code, ExitCode::from(2), "{err}");
    assert!(err.contains("on") && err.contains("hide"), "{err}");
}

/// Without sampling flags the model's recommended sampling (generation_config.json) is used and
/// the summary says so; a flag that chooses a decoding replaces it; seed and penalties add to it.
#[test]
fn generate_uses_the_models_recommended_sampling_unless_told() {
    // `mtp generate --model MODEL [flags…] PROMPT`: the request's sampling and stderr
    let run = |model: &str, flags: &[&str], prompt: &str| {
        let mut args = vec!["generate", "--provider", "fake", "--model", model];
        args.extend_from_slice(flags);
        args.push(prompt);
        let (code, _, err) = mtp(&args);
        assert_eq!(code, OK, "{err}");
        (requests_for(prompt)[0].sampling.clone(), err)
    };
    let (s, err) = run("sampler", &[], "samp-default");
    assert_eq!(s, fake::recommended());
    assert!(
        err.contains("sampled: temperature 0.6, top-p 0.95, top-k 20 (generation_config.json)"),
        "{err}"
    );
    let (s, err) = run("sampler", &["--temperature", "0"], "samp-greedy");
    assert!(
        s.is_greedy() && s.top_p.is_none() && s.top_k.is_none(),
        "{s:?}"
    );
    assert!(!err.contains("generation_config"), "{err}");
    let (s, _) = run("sampler", &["--seed", "5"], "samp-seed");
    assert_eq!(
        (s.temperature, s.top_k, s.seed),
        (Some(0.6), Some(20), Some(5))
    );
    // a model that recommends nothing: greedy, no note
    let (s, err) = run("m", &[], "samp-none");
    assert!(s.is_greedy());
    assert!(!err.contains("generation_config"), "{err}");
}

#[test]
fn generate_system_and_messages_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("conv.json");
    std::fs::write(
        &file,
        r#"[{"role": "system", "content": "Be terse."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": null, "reasoning_content": "Greet back.",
             "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "wave", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "waved"}]"#,
    )
    .unwrap();
    let path = file.to_str().unwrap();
    let (code, _, err) = mtp(&[
        "generate",
        "--provider",
        "fake",
        "--model",
        "m",
        "--messages",
        path,
        "--system",
        "Sys.",
        "msgs-then-prompt",
    ]);
    assert_eq!(code, OK, "{err}");
    let r = &requests_for("msgs-then-prompt")[0];
    assert_eq!(r.system_prompt.as_deref(), Some("Sys."));
    let h = r.messages.as_ref().expect("history");
    assert_eq!(h.len(), 4);
    assert_eq!(h[2].reasoning_content.as_deref(), Some("Greet back."));
    assert_eq!(h[2].tool_calls[0].function.name, "wave");
    assert_eq!(h[3].tool_call_id.as_deref(), Some("c1"));
    // without a prompt, the file's last turn is the prompt
    let (code, _, err) = mtp(&[
        "generate",
        "--provider",
        "fake",
        "--model",
        "m",
        "--messages",
        path,
    ]);
    assert_eq!(code, OK, "{err}");
    // neither a prompt nor --messages: usage error
    let (code, _, err) = mtp(&["generate", "--provider", "fake"]);
    assert_eq!(code, ExitCode::from(2), "{err}");
    // a broken file: one error line naming the file and the message at fault
    std::fs::write(
        &file,
        r#"[{"role": "user", "content": "ok"}, {"role": "robot"}]"#,
    )
    .unwrap();
    let (code, _, err) = mtp(&["generate", "--provider", "fake", "--messages", path, "x"]);
    assert_ne!(code, OK);
    assert!(
        err.contains("--messages") && err.contains("message 1: unknown role `robot`"),
        "{err}"
    );
    let (code, _, err) = mtp(&[
        "generate",
        "--provider",
        "fake",
        "--messages",
        "/no/such/file.json",
        "x",
    ]);
    assert_ne!(code, OK);
    assert!(err.contains("/no/such/file.json"), "{err}");
    // --raw sends the prompt verbatim: it cannot take a conversation
    let (code, _, err) = mtp(&[
        "generate",
        "--provider",
        "fake",
        "--raw",
        "--system",
        "s",
        "x",
    ]);
    assert_eq!(code, ExitCode::from(2), "{err}");
}

#[test]
/// One error line each; exit 1 for what failed at run time, 2 for a flag's value (clap's
/// checks and ours alike).
fn generate_errors_are_one_line_and_non_zero() {
    let usage = ExitCode::from(2);
    let cases: &[(&[&str], ExitCode, &str)] = &[
        (&["--model", "fail-load"], ExitCode::FAILURE, "cannot start provider `fake` for model fail-load: cannot load model fail-load: config.json is missing"),
        (&["--model", "m", "--num-draft-tokens", "0"], usage, "invalid num_draft_tokens 0"),
        (&["--model", "m", "--num-draft-tokens", "2.5"], usage, "it must be a positive integer"),
        (&["--model", "m", "--top-p", "1.5"], usage, "top_p"),
        // negative values reach the range check (not a "looks like a flag" error)
        (&["--model", "m", "--temperature", "-1"], usage, "temperature"),
        (&["--model", "m", "--ctx-size", "8"], usage, "--ctx-size"),
        (&["--model", "m", "--prompt-file", "/no/such/prompt.txt"], usage, "/no/such/prompt.txt"),
    ];
    for (extra, want_code, expected) in cases {
        let mut args = vec!["generate", "--provider", "fake"];
        args.extend_from_slice(extra);
        if !extra.contains(&"--prompt-file") {
            args.push("gen-errors");
        }
        let (code, out, err) = mtp(&args);
        assert_eq!(code, *want_code, "{extra:?}: {err}");
        assert!(out.is_empty(), "{extra:?}: {out}");
        assert!(err.contains(expected), "{extra:?}: {err}");
        if *want_code == ExitCode::FAILURE {
            assert_eq!(err.lines().count(), 1, "{extra:?}: {err}");
        }
    }
    // --max-tokens 0 and -n 0: clap's range check, exit 2
    for flag in ["--max-tokens", "-n"] {
        let (code, _, err) = mtp(&["generate", "--provider", "fake", flag, "0", "x"]);
        assert_eq!(code, usage, "{err}");
        assert!(err.contains("0 is not in 1..=4294967295"), "{err}");
    }
}

/// The ways to give a prompt and the other llama.cpp-style flags: `-p`, `--prompt-file`,
/// `-n`, repeatable `--stop`; runtime options only where they apply.
#[test]
fn generate_prompt_sources_and_runtime_flags() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("prompt.txt");
    std::fs::write(&file, "flag-file-prompt").unwrap();
    let (code, _, err) = mtp(&[
        "generate",
        "--provider",
        "fake",
        "--model",
        "m",
        "--prompt-file",
        file.to_str().unwrap(),
        "-n",
        "3",
        "--stop",
        "END",
        "--stop",
        "\n\n",
    ]);
    assert_eq!(code, OK, "{err}");
    let r = &requests_for("flag-file-prompt")[0];
    assert_eq!(r.max_output_tokens, Some(3));
    assert_eq!(r.stop, vec!["END".to_string(), "\n\n".to_string()]);
    let (code, _, err) = mtp(&[
        "generate",
        "--provider",
        "fake",
        "--model",
        "m",
        "-p",
        "flag-p-prompt",
    ]);
    assert_eq!(code, OK, "{err}");
    assert_eq!(requests_for("flag-p-prompt").len(), 1);
    // -p and a positional prompt together: usage error
    let (code, _, _) = mtp(&["generate", "--provider", "fake", "-p", "a", "b"]);
    assert_eq!(code, ExitCode::from(2));
    // --ctx-size / --threads / --dtype reach the provider as its options
    let (code, _, err) = mtp(&[
        "generate",
        "--provider",
        "fake",
        "--model",
        "opts-model",
        "--ctx-size",
        "2048",
        "--threads",
        "2",
        "--dtype",
        "bf16",
        "--cache-type",
        "f16",
        "opts-prompt",
    ]);
    assert_eq!(code, OK, "{err}");
    let extra = fake::OPTIONS
        .lock()
        .unwrap()
        .iter()
        .rev()
        .find(|(m, _)| m == "opts-model")
        .map(|(_, o)| o.extra.clone())
        .unwrap();
    assert_eq!(extra.get("ctx_size").map(String::as_str), Some("2048"));
    assert_eq!(extra.get("threads").map(String::as_str), Some("2"));
    assert_eq!(extra.get("dtype").map(String::as_str), Some("bf16"));
    assert_eq!(extra.get("cache_type").map(String::as_str), Some("f16"));
    // a type no in-process runtime keeps is a usage error naming the flag
    let (code, _, err) = mtp(&[
        "generate",
        "--provider",
        "fake",
        "--cache-type",
        "q4_0",
        "x",
    ]);
    assert_eq!(code, ExitCode::from(2), "{err}");
    assert!(err.contains("cache-type") && err.contains("q4_0"), "{err}");
    // ...and are usage errors for an HTTP server, whose launch sets them
    for (flag, value, says) in [
        ("--ctx-size", "2048", "when it starts"),
        ("--cache-type", "f16", "-ctk"),
    ] {
        let (code, _, err) = mtp(&[
            "generate",
            "--provider",
            "llama-server",
            "--model",
            "m",
            "--base-url",
            "http://127.0.0.1:9",
            flag,
            value,
            "x",
        ]);
        assert_eq!(code, ExitCode::from(2), "{err}");
        assert!(err.contains(flag) && err.contains(says), "{err}");
    }
}

/// llama.cpp's short and long spellings beside ours: `-m`, `--temp`, `-c`, `-t`,
/// `--repeat-penalty`.
#[test]
fn llama_cpp_spellings_are_taken() {
    let (code, _, err) = mtp(&[
        "generate",
        "--provider",
        "fake",
        "-m",
        "llama-style-model",
        "--temp",
        "0.25",
        "--repeat-penalty",
        "1.1",
        "-c",
        "1024",
        "-t",
        "3",
        "-n",
        "4",
        "llama-style-prompt",
    ]);
    assert_eq!(code, OK, "{err}");
    let r = &requests_for("llama-style-prompt")[0];
    assert_eq!(r.sampling.temperature, Some(0.25));
    assert_eq!(r.sampling.repetition_penalty, Some(1.1));
    assert_eq!(r.max_output_tokens, Some(4));
    let extra = fake::OPTIONS
        .lock()
        .unwrap()
        .iter()
        .rev()
        .find(|(m, _)| m == "llama-style-model")
        .map(|(_, o)| o.extra.clone())
        .unwrap();
    assert_eq!(extra.get("ctx_size").map(String::as_str), Some("1024"));
    assert_eq!(extra.get("threads").map(String::as_str), Some("3"));
}

#[test]
fn unknown_provider_lists_the_known_ones() {
    let (code, _, err) = mtp(&["generate", "--provider", "nope", "--model", "m", "hi"]);
    assert_eq!(code, ExitCode::FAILURE);
    assert!(
        err.contains("unknown provider `nope`; known providers:"),
        "{err}"
    );
    assert!(err.contains("fake"), "{err}");
    assert!(
        err.contains("pass one of the known names with --provider"),
        "{err}"
    );
}

#[test]
fn bad_speculation_flag_is_a_usage_error() {
    let (code, _, err) = mtp(&[
        "generate",
        "--provider",
        "fake",
        "--speculation",
        "eagle",
        "hi",
    ]);
    assert_eq!(code, ExitCode::from(2));
    assert!(err.contains("unknown speculation mode `eagle`"), "{err}");
}

// ---------------------------------------------------------------- chat (scripted input)

#[test]
fn chat_speculation_report_toggle_depth_and_history() {
    let (code, out, err) = chat(
        &["--provider", "fake", "--model", "m", "--max-tokens", "8"],
        &[
            "/speculation",
            "chat-one",
            "/speculation off",
            "chat-two",
            "/speculation on",
            "/depth 5",
            "chat-three",
            "/stats",
            "/quit",
            "never-sent",
        ],
    );
    assert_eq!(code, OK, "{err}");
    assert!(
        out.contains("⚡ speculation: native MTP lane LOADED"),
        "{out}"
    );
    assert!(out.contains("   drafter        : embedded"), "{out}");
    assert!(out.contains("   draft tokens   : 3"), "{out}");
    assert!(out.contains("   per-call state : auto (on)"), "{out}");
    assert!(
        out.contains("the lane stays loaded; the drafter is skipped"),
        "{out}"
    );
    assert!(
        out.contains("speculation on: the drafter runs again"),
        "{out}"
    );
    assert!(out.contains("draft tokens: 5 per round"), "{out}");
    assert!(out.contains("turns 3 (0 stopped) · 24 tokens"), "{out}");
    assert!(out.contains("speculated turns 2"), "{out}");
    // Depth 3 then 5; the fake rejects the last proposal every fourth round.
    assert!(
        out.contains("acceptance by draft position: 1: 100%, 2: 100%, 3: "),
        "{out}"
    );
    assert!(out.contains(", 5: "), "{out}");

    let one = &requests_for("chat-one")[0];
    let two = &requests_for("chat-two")[0];
    let three = &requests_for("chat-three")[0];
    assert_eq!(one.speculation, None, "auto: the provider default");
    assert_eq!(
        two.speculation,
        Some(mtp::Speculation::off()),
        "per-call override false"
    );
    assert_eq!(three.speculation, Some(mtp::Speculation::depth(5).unwrap()));
    // The full history and one cache key every turn.
    let key = one.prompt_cache_key.clone().expect("a prompt_cache_key");
    assert_eq!(two.prompt_cache_key.as_ref(), Some(&key));
    assert_eq!(three.prompt_cache_key.as_ref(), Some(&key));
    assert_eq!(one.messages.as_ref().map(Vec::len), Some(0));
    let h = two.messages.as_ref().unwrap();
    assert_eq!(h.len(), 2);
    assert_eq!(h[0].content, "chat-one");
    assert_eq!(h[1].content, fake::expected_text(8));
    assert_eq!(three.messages.as_ref().map(Vec::len), Some(4));
    assert!(
        requests_for("never-sent").is_empty(),
        "/quit ends the session"
    );

    // Summaries per turn: on, off (disabled_by_request), on at depth 5.
    assert!(err.contains("MTP not used (disabled_by_request)"), "{err}");
    assert!(err.contains("MTP on (depth 5)"), "{err}");
}

#[test]
fn chat_speculation_on_without_a_lane_says_so_plainly() {
    let (code, out, _) = chat(
        &[
            "--provider",
            "fake",
            "--model",
            "nolane",
            "--max-tokens",
            "2",
        ],
        &[
            "/speculation",
            "/speculation on",
            "/speculation off",
            "chat-nolane",
        ],
    );
    assert_eq!(code, OK);
    assert!(
        out.contains("⚡ speculation: no MTP lane loaded (mtp_head_not_cached)"),
        "{out}"
    );
    assert!(out.contains("mtp models download fake/drafter"), "{out}");
    assert!(
        out.contains("cannot turn speculation on: no MTP lane was loaded at startup"),
        "{out}"
    );
    assert!(
        out.contains("speculation is already off: no MTP lane is loaded."),
        "{out}"
    );
    assert_eq!(requests_for("chat-nolane")[0].speculation, None);
}

#[test]
fn chat_speculation_off_at_startup_loads_no_lane() {
    let (code, out, _) = chat(
        &["--provider", "fake", "--model", "m", "--speculation", "off"],
        &["/speculation", "/speculation on"],
    );
    assert_eq!(code, OK);
    assert!(
        out.contains("no MTP lane loaded (disabled_by_request)"),
        "{out}"
    );
    assert!(out.contains("cannot turn speculation on"), "{out}");
}

#[test]
fn chat_require_acceleration_refuses_to_start_without_a_lane() {
    let (code, out, err) = chat(
        &[
            "--provider",
            "fake",
            "--model",
            "m",
            "--speculation",
            "off",
            "--require-acceleration",
        ],
        &["chat-refused"],
    );
    assert_eq!(code, ExitCode::FAILURE);
    assert!(!out.contains("mtp chat ·"), "{out}");
    assert!(err.contains("refusing to start"), "{err}");
    assert!(requests_for("chat-refused").is_empty());
}

#[test]
fn chat_thinking_system_and_reasoning_history() {
    let (code, out, err) = chat(
        &[
            "--provider",
            "fake",
            "--model",
            "think",
            "--max-tokens",
            "3",
        ],
        &[
            "chat-think-1",
            "/thinking",
            "/thinking hide",
            "chat-think-2",
            "/thinking off",
            "/system Answer in French.",
            "/system",
            "chat-think-3",
            "/thinking maybe",
            "/system clear",
            "chat-think-4",
        ],
    );
    assert_eq!(code, OK, "{err}");
    assert!(
        out.contains("thinking: the chat template's default"),
        "{out}"
    );
    assert!(out.contains("thinking hide for the next turns"), "{out}");
    assert!(out.contains("system prompt: Answer in French."), "{out}");
    assert!(out.contains("unknown /thinking argument `maybe`"), "{out}");
    // the reasoning of turn 1 was shown (stderr), turn 2's was not
    assert_eq!(err.matches(fake::REASONING).count(), 1, "{err}");
    let r1 = &requests_for("chat-think-1")[0];
    assert_eq!(r1.thinking, None);
    let r2 = &requests_for("chat-think-2")[0];
    assert_eq!(r2.thinking, Some(true));
    // the history keeps each answer's reasoning for the template
    let h2 = r2.messages.as_ref().unwrap();
    assert_eq!(h2[1].reasoning_content.as_deref(), Some(fake::REASONING));
    let r3 = &requests_for("chat-think-3")[0];
    assert_eq!(r3.thinking, Some(false));
    assert_eq!(r3.system_prompt.as_deref(), Some("Answer in French."));
    assert_eq!(r3.messages.as_ref().unwrap().len(), 4);
    let r4 = &requests_for("chat-think-4")[0];
    assert_eq!(r4.system_prompt, None);
    // one cache key for the whole session
    assert_eq!(r1.prompt_cache_key, r4.prompt_cache_key);
}

#[test]
fn chat_clear_forgets_history_and_clears_the_prompt_cache() {
    let (code, out, _) = chat(
        &["--provider", "fake", "--model", "m", "--max-tokens", "2"],
        &["chat-clear-1", "/clear", "chat-clear-2"],
    );
    assert_eq!(code, OK);
    assert!(
        out.contains("history cleared; the prompt cache was cleared too."),
        "{out}"
    );
    let key = requests_for("chat-clear-1")[0]
        .prompt_cache_key
        .clone()
        .unwrap();
    assert!(fake::CLEARS.lock().unwrap().contains(&Some(key)));
    assert_eq!(
        requests_for("chat-clear-2")[0]
            .messages
            .as_ref()
            .map(Vec::len),
        Some(0)
    );
}

#[test]
fn chat_help_depth_errors_unknown_commands_and_sampling_flags() {
    let (code, out, _) = chat(
        &[
            "--provider",
            "fake",
            "--model",
            "m",
            "--temperature",
            "0.5",
            "--seed",
            "3",
            "--system",
            "be brief",
            "--max-tokens",
            "2",
        ],
        &[
            "/help",
            "/depth",
            "/depth 0",
            "/depth x",
            "/depth 2",
            "/depth default",
            "/frobnicate",
            "/speculation maybe",
            "chat-flags",
        ],
    );
    assert_eq!(code, OK);
    for needle in [
        "/speculation off",
        "/depth N",
        "/stats",
        "/clear",
        "/quit",
        "draft tokens: 3 (provider default)",
        "invalid /depth `0`",
        "invalid /depth `x`",
        "draft tokens: 2 per round",
        "draft tokens: back to the provider default.",
        "unknown command /frobnicate",
        "unknown /speculation argument `maybe`",
    ] {
        assert!(out.contains(needle), "missing {needle:?} in {out}");
    }
    let r = &requests_for("chat-flags")[0];
    assert_eq!(r.sampling.temperature, Some(0.5));
    assert_eq!(r.sampling.seed, Some(3));
    assert_eq!(r.system_prompt.as_deref(), Some("be brief"));
    assert_eq!(
        r.speculation, None,
        "/depth default went back to the provider default"
    );
}

#[test]
fn chat_failed_turn_is_reported_and_the_session_goes_on() {
    let (code, out, err) = chat(
        &[
            "--provider",
            "fake",
            "--model",
            "m",
            "--require-acceleration",
            "--repetition-penalty",
            "1.5",
            "--max-tokens",
            "2",
        ],
        &["chat-fails", "/speculation"],
    );
    assert_eq!(code, OK);
    assert!(
        err.contains("this answer failed: speculation unavailable (sampling_requires_target_only)"),
        "{err}"
    );
    assert!(out.contains("native MTP lane LOADED"), "{out}");
}

// ---------------------------------------------------------------- bench

#[test]
fn bench_prints_the_interleaved_ab_table() {
    let (code, out, err) = mtp(&[
        "bench",
        "--provider",
        "fake",
        "--model",
        "m",
        "--reps",
        "2",
        "--depths",
        "1,3",
        "--max-tokens",
        "24",
        "--prompt",
        "bench-a",
    ]);
    assert_eq!(code, OK, "{err}");
    assert!(
        out.starts_with("| prompt | depth | tok/s off | tok/s on | speedup | acceptance |"),
        "{out}"
    );
    let rows: Vec<&str> = out.lines().skip(2).collect();
    assert_eq!(rows.len(), 2, "{out}");
    assert!(rows[0].starts_with("| prompt 1 | 1 | 40.0 |"), "{out}");
    assert!(rows[1].starts_with("| prompt 1 | 3 | 40.0 |"), "{out}");
    assert!(rows.iter().all(|r| r.ends_with("| yes |")), "{out}");
    // 1 warm-up + 2 reps on each side, per depth; on and off interleaved.
    let reqs = requests_for("bench-a");
    assert_eq!(reqs.len(), 2 * (2 + 4));
    let offs = reqs
        .iter()
        .filter(|r| r.speculation == Some(mtp::Speculation::off()))
        .count();
    assert_eq!(offs, 6);
    assert!(err.contains("2 interleaved rep(s)"), "{err}");
}

#[test]
fn bench_json_rows_carry_speedup_acceptance_and_identity() {
    let (code, out, err) = mtp(&[
        "bench",
        "--provider",
        "fake",
        "--model",
        "m",
        "--reps",
        "1",
        "--max-tokens",
        "16",
        "--json",
    ]);
    assert_eq!(code, OK, "{err}");
    let v = json(&out);
    let rows = v.as_array().unwrap();
    assert_eq!(rows.len(), 3, "code, prose and table prompts");
    for r in rows {
        assert_eq!(r["depth"], 3);
        assert_eq!(r["used"], true);
        assert_eq!(r["identical"], true);
        assert!(r["speedup"].as_f64().unwrap() > 1.0);
        let acc = r["acceptance"].as_f64().unwrap();
        assert!(acc > 0.5 && acc <= 1.0);
        let eff = r["efficiency"].as_f64().unwrap();
        assert!(
            (eff - 0.9).abs() < 1e-9,
            "fake speedup is 0.9 × tokens/round: {eff}"
        );
    }
}

#[test]
fn bench_without_a_lane_has_nothing_to_compare() {
    let (code, _, err) = mtp(&["bench", "--provider", "fake", "--model", "nolane"]);
    assert_eq!(code, ExitCode::FAILURE);
    assert!(
        err.contains("no MTP lane is loaded (mtp_head_not_cached), so there is nothing to compare"),
        "{err}"
    );
    let (code, _, err) = mtp(&["bench", "--provider", "fake", "--model", "m", "--reps", "0"]);
    assert_eq!(code, ExitCode::from(2), "a flag's value: usage error");
    assert!(err.contains("invalid --reps"), "{err}");
    let (code, _, err) = mtp(&[
        "bench",
        "--provider",
        "fake",
        "--model",
        "m",
        "--depths",
        "0",
    ]);
    assert_eq!(code, ExitCode::from(2), "a flag's value: usage error");
    assert!(err.contains("invalid num_draft_tokens 0"), "{err}");
}

#[test]
fn markdown_table_says_when_speculation_was_not_used() {
    let row = mtp::cli::BenchRow {
        prompt: "p".into(),
        depth: None,
        tok_s_off: 10.0,
        tok_s_on: 10.0,
        speedup: 1.0,
        used: false,
        reason: Some(mtp::Reason::SamplingRequiresTargetOnly),
        acceptance: None,
        accepted_per_round: None,
        tokens_per_round: None,
        efficiency: None,
        identical: true,
        reps: 1,
    };
    let t = mtp::cli::markdown_table(&[row]);
    assert!(t.contains("| p | default | 10.0 | 10.0 | 1.00× | not used (sampling_requires_target_only) | – | – | yes |"), "{t}");
}
