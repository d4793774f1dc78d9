//! `cargo xtask fuzz [--seconds N] [--inputs N] [--target NAME] [--seed S] [--out DIR]`: builds
//! the `mtp-fuzz` runner in release and runs every parser target (see `crates/mtp-fuzz`). The
//! documented run is `cargo xtask fuzz --seconds 120` (over a million inputs per target); the
//! exit status is non-zero when anything was found, with the inputs under `--out`.

use std::process::Command;

use anyhow::{bail, Result};

const HELP: &str =
    "cargo xtask fuzz [--seconds N per target (default 10)] [--inputs N per target] \
[--target NAME] [--seed S] [--out DIR (default target/fuzz-findings)]
targets: gguf, safetensors-header, safetensors-index, speculation, chat-template, \
chat-messages, reasoning-stream, sse, messages, prometheus
";

pub fn run(args: &[String]) -> Result<()> {
    if crate::print_help_if_asked(args, HELP) {
        return Ok(());
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args(["run", "--release", "--quiet", "-p", "mtp-fuzz", "--"])
        .args(args)
        .status()?;
    if !status.success() {
        bail!("mtp-fuzz found problems or could not run ({status})");
    }
    Ok(())
}
