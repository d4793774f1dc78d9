//! `cargo xtask test`: the project's one test command (README and `.ci/run` call it).
//!
//! It prepares what the tests need, then runs the whole workspace's tests. Preparation steps
//! are cached outside the clone so a second run does not repeat them.

use std::process::Command;

use anyhow::{bail, Context, Result};

/// Runs the full test suite. Extra arguments are passed to `cargo test`.
pub fn run(args: &[String]) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // cmake and libclang for llama-server and the `gguf` provider's llama.cpp.
    crate::setup::ensure()?;
    // llama-server b11434 for the adapter's end-to-end tests (built once, cached).
    let llama_server = crate::llama::prepare().context("preparing llama-server")?;
    let mut cmd = Command::new(&cargo);
    cmd.env(crate::llama::ENV_SERVER, &llama_server);
    // Every provider is tested, the in-process `gguf` one included.
    cmd.args([
        "test",
        "--workspace",
        "--all-targets",
        "--features",
        crate::setup::TEST_FEATURES,
    ]);
    cmd.args(args);
    let status = cmd
        .status()
        .with_context(|| format!("running {cargo} test"))?;
    if !status.success() {
        bail!("cargo test failed ({status})");
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
