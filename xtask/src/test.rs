//! `cargo xtask test`: the project's one test command (README and `.ci/run` call it).
//!
//! It prepares what the tests need, then runs the whole workspace's tests. Preparation steps
//! are cached outside the clone so a second run does not repeat them.

use std::process::Command;

use anyhow::{anyhow, bail, Context, Result};

/// The name filter of the tests that need the llama.cpp source (`#[ignore]`d without it).
pub const NEEDS_LLAMA_CPP_SRC: &str = "llama_cpp_src";

/// Runs the full test suite. Extra arguments are passed to `cargo test`.
pub fn run(args: &[String]) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // cmake and libclang for llama-server and the `gguf` provider's llama.cpp.
    crate::setup::ensure()?;
    // llama-server b11434 for the adapter's end-to-end tests (built once, cached), built at low
    // priority while the test binaries compile: on a fresh machine each leaves the other's idle
    // moments (linking, single-crate stretches) to fill.
    let server = std::thread::spawn(crate::llama::prepare);
    // Every provider is tested, the in-process `gguf` one included.
    let test_args = [
        "test",
        "--workspace",
        "--all-targets",
        "--features",
        crate::setup::TEST_FEATURES,
    ];
    let compiled = Command::new(&cargo)
        .args(test_args)
        .arg("--no-run")
        .args(args)
        .status()
        .with_context(|| format!("running {cargo} test --no-run"));
    let llama_server = server
        .join()
        .map_err(|_| anyhow!("preparing llama-server panicked"))?
        .context("preparing llama-server")?;
    if !compiled?.success() {
        bail!("compiling the tests failed");
    }
    let mut cmd = Command::new(&cargo);
    cmd.env(crate::llama::ENV_SERVER, &llama_server);
    cmd.args(test_args);
    cmd.args(args);
    let status = cmd
        .status()
        .with_context(|| format!("running {cargo} test"))?;
    if !status.success() {
        bail!("cargo test failed ({status})");
    }
    // Tests on llama.cpp's real vocabularies (the tokenizer converter against Hugging Face's
    // tokenizations; the engine, the providers and the CLI on the real-vocabulary checkpoint)
    // need the llama.cpp source, so a plain `cargo test` ignores them (their path contains
    // `llama_cpp_src`). They run here, on the test binaries already built, with the source
    // tree `llama::prepare` unpacked and the checkpoint `real_vocab::prepare` writes from it.
    let llama_src = crate::llama::source_dir()?;
    let real_vocab = crate::real_vocab::prepare(&llama_src)?;
    // The official Python clients (a venv outside the clone, cached), in the same run of the
    // ignored tests: `openai`, `anthropic` and `openai-agents` driving `mtp serve`,
    // `huggingface_hub` against the fake Hub.
    let python = crate::py_clients::prepare()?;
    let filters = [
        NEEDS_LLAMA_CPP_SRC,
        crate::py_clients::NEEDS_OPENAI_SDK,
        crate::py_clients::NEEDS_ANTHROPIC_SDK,
        crate::py_clients::NEEDS_HF_HUB,
        crate::py_clients::NEEDS_AGENTS_SDK,
        crate::py_clients::NEEDS_LM_EVAL,
    ];
    let cargo_args = args.iter().take_while(|a| *a != "--");
    let status = Command::new(&cargo)
        .args(test_args)
        .args(cargo_args)
        .args(["--", "--ignored"])
        .args(filters)
        .env(crate::llama::ENV_SOURCE, &llama_src)
        .env(crate::real_vocab::ENV_MODEL, &real_vocab)
        .env(crate::llama::ENV_SERVER, &llama_server)
        .env(crate::py_clients::ENV_OPENAI_PYTHON, &python)
        .env(crate::py_clients::ENV_ANTHROPIC_PYTHON, &python)
        .env(crate::py_clients::ENV_HF_PYTHON, &python)
        .env(crate::py_clients::ENV_AGENTS_PYTHON, &python)
        .env(crate::py_clients::ENV_LM_EVAL_PYTHON, &python)
        .status()
        .with_context(|| format!("running {cargo} test -- --ignored {}", filters.join(" ")))?;
    if !status.success() {
        bail!(
            "the tests on llama.cpp's real vocabularies and with the openai, anthropic, \
             openai-agents and huggingface_hub clients failed ({status})"
        );
    }
    // Doc tests are not part of --all-targets.
    let status = Command::new(&cargo)
        .args([
            "test",
            "--workspace",
            "--doc",
            "--features",
            crate::setup::TEST_FEATURES,
        ])
        .env(crate::llama::ENV_SERVER, &llama_server)
        .status()
        .with_context(|| format!("running {cargo} test --doc"))?;
    if !status.success() {
        bail!("cargo test --doc failed ({status})");
    }
    Ok(())
}
