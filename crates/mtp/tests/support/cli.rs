//! What the command-level tests share (included by path into each test file, beside the fake
//! provider, `cli_fake_provider.rs`).

#![allow(dead_code)]

use std::process::ExitCode;

use assert_cmd::Command;
use mtp::cli::{run_with, Io};
use serde_json::Value;

use crate::fake;

/// Runs the command in-process; returns (exit code, stdout, stderr).
pub fn mtp(args: &[&str]) -> (ExitCode, String, String) {
    fake::register();
    let (io, c) = Io::captured();
    let mut full = vec!["mtp"];
    full.extend_from_slice(args);
    let code = run_with(full, io);
    (code, c.stdout(), c.stderr())
}

pub fn chat(args: &[&str], lines: &[&str]) -> (ExitCode, String, String) {
    fake::register();
    let (io, c) = Io::captured();
    let mut full = vec!["mtp", "chat"];
    full.extend_from_slice(args);
    let code = run_with(full, io.with_input(lines.iter().copied()));
    (code, c.stdout(), c.stderr())
}

pub fn requests_for(prompt: &str) -> Vec<mtp::GenerateRequest> {
    fake::REQUESTS
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.prompt == prompt)
        .cloned()
        .collect()
}

pub fn json(stdout: &str) -> Value {
    serde_json::from_str(stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}

pub const OK: ExitCode = ExitCode::SUCCESS;

/// The real binary, offline and without the environment's keys.
pub fn bin() -> Command {
    let mut c = Command::cargo_bin("mtp").unwrap();
    // Offline: nothing here may reach a Hub (a repo id that is not cached is an error).
    c.env_remove("MTP_API_KEY")
        .env_remove("HF_ENDPOINT")
        .env_remove("HF_TOKEN")
        .env("HF_HUB_OFFLINE", "1");
    c
}
