//! The real `mtp` binary through `assert_cmd`, for what needs no model or only the bundled
//! fixtures: help, version, usage errors, unknown providers, missing models, `--compare`,
//! `--verbose`, and the in-process runs that check the binary's wording.

#[path = "cli_fake_provider.rs"]
mod fake;
#[path = "support/cli.rs"]
mod support;

use predicates::prelude::*;
use support::*;

// ---------------------------------------------------------------- the real binary

#[test]
fn binary_help_lists_every_command() {
    bin().arg("--help").assert().success().stdout(
        predicate::str::contains("generate")
            .and(predicate::str::contains("chat"))
            .and(predicate::str::contains("probe"))
            .and(predicate::str::contains("bench"))
            .and(predicate::str::contains("models")),
    );
}

#[test]
fn binary_subcommand_help_lists_the_flags() {
    let gen_flags = [
        "--provider",
        "--model",
        "--speculation",
        "--num-draft-tokens",
        "--drafter",
        "--require-acceleration",
        "--temperature",
        "--top-p",
        "--top-k",
        "--min-p",
        "--seed",
        "--repetition-penalty",
        "--presence-penalty",
        "--frequency-penalty",
        "--max-tokens",
        "--json",
        "--base-url",
        "--api-key",
        "--tools",
        "--tool-choice",
        "--no-parallel-tool-calls",
    ];
    let out = bin()
        .args(["generate", "--help"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let text = String::from_utf8(out).unwrap();
    for f in gen_flags {
        assert!(text.contains(f), "generate --help lacks {f}");
    }
    for (cmd, flags) in [
        (
            vec!["chat"],
            vec![
                "--speculation",
                "--require-acceleration",
                "--num-draft-tokens",
                "--drafter",
                "--system",
                "--tools",
                "--tool-choice",
                "--no-parallel-tool-calls",
            ],
        ),
        (
            vec!["bench"],
            vec!["--depths", "--reps", "--prompt", "--json"],
        ),
        (vec!["probe"], vec!["--json"]),
        (
            vec!["models", "download"],
            vec!["--drafter", "--revision", "--cache-dir"],
        ),
        (vec!["models", "list"], vec!["--cache-dir", "--json"]),
        (vec!["models", "verify"], vec!["--provider", "--max-tokens"]),
    ] {
        let mut args = cmd.clone();
        args.push("--help");
        let out = bin()
            .args(&args)
            .assert()
            .success()
            .get_output()
            .stdout
            .clone();
        let text = String::from_utf8(out).unwrap();
        for f in flags {
            assert!(text.contains(f), "{cmd:?} --help lacks {f}");
        }
    }
}

#[test]
fn binary_version_and_usage_errors() {
    bin()
        .arg("--version")
        .assert()
        .success()
        .stdout(predicate::str::starts_with("mtp "));
    bin()
        .assert()
        .code(2)
        .stderr(predicate::str::contains("Usage"));
    bin()
        .args(["generate"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("<PROMPT>"));
    bin()
        .args(["generate", "--top-k", "many", "x"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--top-k"));
    bin().args(["frobnicate"]).assert().code(2);
}

#[test]
fn binary_unknown_provider_is_checked_before_the_model() {
    bin()
        .env("MTP_DEFAULT_MODEL", "/nonexistent/tiny-mtp")
        .args(["generate", "--provider", "nope", "hi"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("unknown provider `nope`"))
        .stderr(predicate::str::contains("tiny-mtp").not());
}

#[test]
fn binary_lists_the_shipped_http_runtimes_and_reports_an_unreachable_server() {
    bin()
        .args(["generate", "--provider", "nope", "--model", "m", "hi"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("llama-server").and(predicate::str::contains("ollama")));
    // Port 9 (discard) on loopback: nothing listens there.
    bin()
        .args([
            "generate",
            "--provider",
            "llama-server",
            "--model",
            "m",
            "--base-url",
            "http://127.0.0.1:9",
            "--max-tokens",
            "4",
            "hi",
        ])
        .assert()
        .code(1)
        .stdout(predicate::str::is_empty())
        .stderr(predicate::str::contains(
            "cannot connect to http://127.0.0.1:9",
        ))
        .stderr(predicate::str::contains(
            "start the server or fix --base-url",
        ));
}

#[test]
fn binary_unknown_provider_is_one_clear_line() {
    bin()
        .args(["generate", "--provider", "nope", "--model", "m", "hi"])
        .assert()
        .code(1)
        .stdout(predicate::str::is_empty())
        .stderr(predicate::str::contains("mtp: error: cannot start provider `nope` for model m: unknown provider `nope`; known providers:"));
}

#[test]
fn binary_missing_demo_model_says_how_to_get_it() {
    bin()
        .env("MTP_DEFAULT_MODEL", "/nonexistent/tiny-mtp")
        .args(["generate", "hi"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains(
            "no --model given and the bundled demo model is missing at /nonexistent/tiny-mtp",
        ))
        .stderr(predicate::str::contains("cargo xtask train-tiny"));
    // an HTTP server's model comes from the server (tests/cli_runtimes.rs), never the demo
    // model
}

/// `--compare` on the bundled demo model: the answer with MTP, its summary with tokens per
/// round, then the same request with speculation off on the same loaded model: the rate, the
/// speed-up and that the text is the same (greedy decoding is exact with MTP).
#[test]
fn binary_compare_runs_speculation_off_on_the_same_model() {
    let demo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny-code");
    let out = bin()
        .args([
            "generate",
            "--model",
            demo.to_str().unwrap(),
            "-n",
            "32",
            "--raw",
            "--compare",
        ])
        .arg("fn add(a: i32, b: i32) -> i32 {")
        .output()
        .unwrap();
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(0), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 2, "{err}");
    assert!(
        lines[0].contains("MTP on (depth 3)") && lines[0].contains("tokens per round"),
        "{err}"
    );
    assert!(
        lines[1].starts_with("[speculation off: 32 tokens")
            && lines[1].contains("MTP decoded")
            && lines[1].ends_with("same text]"),
        "{err}"
    );
    // `--json` prints one object: the comparison has no place in it
    bin()
        .args([
            "generate",
            "--model",
            demo.to_str().unwrap(),
            "--json",
            "--compare",
            "x",
        ])
        .assert()
        .code(2);
}

/// A model that is not there says how it was read: a path that does not exist, or a repo id
/// that is not in the cache (with the download command, revision included), in one line.
#[test]
fn binary_missing_model_says_how_it_was_read() {
    let cache = tempfile::tempdir().unwrap();
    let run = |model: &str| {
        let out = bin()
            .env("HF_HUB_CACHE", cache.path())
            .args(["generate", "--model", model, "hi"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1));
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(err.lines().count(), 1, "{err}");
        err
    };
    let err = run("./no/such/dir");
    assert!(
        err.contains("read as a path, `./no/such/dir` does not exist"),
        "{err}"
    );
    let err = run("org/not-here");
    assert!(
        err.contains("there is no folder `org/not-here` here, so it was read as a Hub repo id")
            && err.contains("`mtp models download org/not-here`"),
        "{err}"
    );
    let err = run("org/not-here@v2");
    assert!(
        err.contains("`mtp models download org/not-here --revision v2`"),
        "{err}"
    );
}

#[test]
fn binary_verbose_shows_detail() {
    let out = bin()
        .args([
            "-v",
            "generate",
            "--provider",
            "llama-server",
            "--model",
            "m",
            "--base-url",
            "http://127.0.0.1:9",
            "hi",
        ])
        .assert()
        .code(1)
        .get_output()
        .stderr
        .clone();
    let text = String::from_utf8(out).unwrap();
    assert!(text.contains("creating provider"), "{text}");
    assert!(text.contains("command failed"), "{text}");
    // Without -v, only the one error line.
    let out = bin()
        .args([
            "generate",
            "--provider",
            "llama-server",
            "--model",
            "m",
            "--base-url",
            "http://127.0.0.1:9",
            "hi",
        ])
        .assert()
        .code(1)
        .get_output()
        .stderr
        .clone();
    assert_eq!(String::from_utf8(out).unwrap().lines().count(), 1);
}

/// `mtp probe` at the terminal writes the in-process ways to run a model as `mtp generate`
/// lines and names flags; `--json` (for programs) and `-v` keep the library calls.
#[test]
fn probe_speaks_the_command_line() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
    let target = dir.join("tiny-trained");
    let (code, out, err) = mtp(&["probe", target.to_str().unwrap()]);
    assert_eq!(code, OK, "{err}");
    assert!(
        out.contains("mtp generate --model ") && out.contains("--num-draft-tokens 3"),
        "{out}"
    );
    assert!(!out.contains("create_llm"), "{out}");
    let drafter = dir.join("tiny-mlx-mtp");
    let (_, out, _) = mtp(&["probe", drafter.to_str().unwrap()]);
    assert!(out.contains("pass this as --drafter"), "{out}");
    let (_, out, _) = mtp(&["probe", target.to_str().unwrap(), "--json"]);
    assert!(out.contains("mtp::create_llm"), "{out}");
    let (_, out, _) = mtp(&["-v", "probe", target.to_str().unwrap()]);
    assert!(out.contains("mtp::create_llm"), "{out}");
}

/// `mtp chat --json-object` (and the other constraint flags, shared with `generate`) puts
/// the constraint on every answer's request; a bad constraint flag stops the session before
/// the model loads, naming the flag.
/// `--image FILE` reaches an HTTP-style provider inline, as a data URL holding the file's bytes
/// (a server cannot read this machine's files); a URL goes as it is; a missing file is a usage
/// error naming it.
#[test]
fn generate_sends_image_files_inline_to_other_providers() {
    use base64::Engine as _;
    let png = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/tiny-vl/images/a.png");
    let p = png.display().to_string();
    let (code, _, err) = mtp(&[
        "generate",
        "--provider",
        "fake",
        "--model",
        "m",
        "--image",
        &p,
        "--image",
        "https://example.invalid/b.png",
        "img-inline-prompt",
    ]);
    assert_eq!(code, OK, "{err}");
    let reqs = requests_for("img-inline-prompt");
    assert_eq!(reqs.len(), 1);
    let sent = &reqs[0].images;
    let b64 = sent[0]
        .strip_prefix("data:image/png;base64,")
        .expect("a PNG data URL");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .unwrap();
    assert_eq!(bytes, std::fs::read(&png).unwrap());
    assert_eq!(sent[1], "https://example.invalid/b.png");
    let (code, _, err) = mtp(&[
        "generate",
        "--provider",
        "fake",
        "--model",
        "m",
        "--image",
        "/no/such.png",
        "x",
    ]);
    assert_ne!(code, OK);
    assert!(err.contains("/no/such.png"), "{err}");
}

/// `/image PATH` attaches a picture to the next message (then the list is empty again); a
/// model without a vision tower says so and attaches nothing.
#[test]
fn chat_attaches_images_to_the_next_message() {
    let vl = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/tiny-vl")
        .canonicalize()
        .unwrap();
    let img = vl.join("images/a.png").display().to_string();
    let attach = format!("/image {img}");
    let (code, out, err) = chat(
        &[
            "--model",
            &vl.display().to_string(),
            "--max-tokens",
            "4",
            "--thinking",
            "off",
        ],
        &[
            &attach,
            "/image",
            "Describe the image.",
            "/image",
            "again",
            "/quit",
        ],
    );
    assert_eq!(code, OK, "{err}");
    assert!(
        out.contains(&format!("image 1 attached to the next message: {img}")),
        "{out}"
    );
    assert!(
        out.contains(&format!("attached to the next message: {img}")),
        "{out}"
    );
    assert!(
        out.contains("no image attached to the next message"),
        "{out}"
    );
    assert_eq!(err.matches("4 tokens").count(), 2, "two answers: {err}");
    let (code, out, _) = chat(
        &["--provider", "fake", "--model", "m"],
        &[&attach, "/image", "/quit"],
    );
    assert_eq!(code, OK);
    assert!(out.contains("takes no images"), "{out}");
    assert!(out.contains("no image attached"), "{out}");
    let (_, out, _) = chat(
        &["--model", &vl.display().to_string()],
        &["/image /no/such/file.png", "/quit"],
    );
    assert!(
        out.contains("no such image file: /no/such/file.png"),
        "{out}"
    );
}

#[test]
fn chat_constrains_every_answer() {
    let (code, _out, err) = chat(
        &[
            "--provider",
            "fake",
            "--model",
            "m",
            "--max-tokens",
            "8",
            "--json-object",
        ],
        &["chat-json-one", "chat-json-two", "/quit"],
    );
    assert_eq!(code, OK, "{err}");
    for prompt in ["chat-json-one", "chat-json-two"] {
        let reqs = requests_for(prompt);
        assert_eq!(reqs.len(), 1, "{prompt}");
        assert_eq!(
            reqs[0].response_format,
            Some(mtp::ResponseFormat::JsonObject {
                flexible_whitespace: false
            }),
            "{prompt}"
        );
    }
    let (code, out, err) = chat(
        &[
            "--provider",
            "fake",
            "--model",
            "m",
            "--json-schema",
            "/nonexistent/schema.json",
        ],
        &["chat-json-never", "/quit"],
    );
    assert_ne!(code, OK);
    assert!(err.contains("--json-schema"), "{err}");
    assert!(!out.contains("mtp chat ·"), "no session started: {out}");
    assert!(requests_for("chat-json-never").is_empty());
}

/// `--num-draft-tokens auto` on the bundled demo model: the same text as speculation off, a
/// report that says the depth was chosen and counts the depths used, and a summary line that
/// names the range; a bad value is a usage error naming it.
#[test]
fn binary_auto_depth_is_chosen_and_reported() {
    let demo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny-code");
    let run = |extra: &[&str]| {
        let out = bin()
            .args([
                "generate",
                "--model",
                demo.to_str().unwrap(),
                "-n",
                "40",
                "--raw",
            ])
            .args(extra)
            .arg("fn add(a: i32, b: i32) -> i32 {")
            .output()
            .unwrap();
        let err = String::from_utf8(out.stderr).unwrap();
        (
            out.status.code(),
            String::from_utf8(out.stdout).unwrap(),
            err,
        )
    };
    let (code, auto, err) = run(&["--num-draft-tokens", "auto", "--json"]);
    assert_eq!(code, Some(0), "{err}");
    let (_, off, _) = run(&["--speculation", "off", "--json"]);
    let (auto, off) = (json(&auto), json(&off));
    assert_eq!(auto["content"], off["content"]);
    let rep = &auto["metadata"]["speculation"];
    assert_eq!(rep["used"], true, "{rep}");
    assert_eq!(rep["auto_depth"], true, "{rep}");
    assert_eq!(rep["num_draft_tokens"], 8, "{rep}");
    let per: Vec<u64> = serde_json::from_value(rep["rounds_per_depth"].clone()).unwrap();
    assert_eq!(
        Some(per.iter().sum::<u64>()),
        rep["rounds"].as_u64(),
        "{rep}"
    );
    let (code, _, err) = run(&["--num-draft-tokens", "auto"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("MTP on (auto depth"), "{err}");
    let (code, _, err) = run(&["--num-draft-tokens", "deep"]);
    assert_ne!(code, Some(0));
    assert!(err.contains("invalid num_draft_tokens deep"), "{err}");
}
