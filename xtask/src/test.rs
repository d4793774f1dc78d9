//! `cargo xtask test`: the project's one test command (README and `.ci/run` call it).
//!
//! It prepares what the tests need, then runs the whole workspace's tests. Preparation steps
//! are cached outside the clone so a second run does not repeat them.

use std::process::Command;

use anyhow::{anyhow, bail, Context, Result};

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
    // The tokenizer converter's checks against Hugging Face's tokenizations read llama.cpp's
    // test vocabularies, so a plain `cargo test` (no llama.cpp source) ignores them; they run
    // here, on the already built test binaries, with the source tree `llama::prepare` unpacked.
    let llama_src = crate::llama::source_dir()?;
    let cargo_args = args.iter().take_while(|a| *a != "--");
    let status = Command::new(&cargo)
        .args(test_args)
        .args(cargo_args)
        .args(["--", "--ignored", crate::tokenizer::LLAMA_CPP_VOCAB_TESTS])
        .env(crate::llama::ENV_SOURCE, &llama_src)
        .status()
        .with_context(|| format!("running {cargo} test -- --ignored (tokenizer)"))?;
    if !status.success() {
        bail!("the tokenizer tests against llama.cpp's vocabularies failed ({status})");
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
