//! `cargo xtask deps`: dependency hygiene (issue 49), the step CI runs before the tests.
//!
//! * `cargo deny --locked check -D warnings bans licenses sources` against `deny.toml`: one
//!   version of each crate (the duplicates third-party crates pin are listed there, each with
//!   who pulls it), the licences the tree may use, the crates registry only. The advisories
//!   check is not run: it would fetch the advisory database.
//! * `cargo machete --with-metadata`: dependencies no code of their crate names (dev- and
//!   build-dependencies included); false positives are listed, with why, in the crate's
//!   `[package.metadata.cargo-machete]`.
//!
//! * the module graph of each crate in [`crate::modgraph::ACYCLIC_CRATES`] has no import
//!   cycle (first, as it needs no tool).
//!
//! Both tools are installed with `cargo install --locked --debug` at the pinned versions below
//! when missing or at another version (about 3 minutes on a 2-core machine, both together);
//! otherwise this step takes seconds.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};

/// The tools and the versions CI runs (the newest releases that build with rustc 1.95).
const TOOLS: [Tool; 2] = [
    Tool {
        krate: "cargo-deny",
        subcommand: "deny",
        version: "0.20.2",
    },
    Tool {
        krate: "cargo-machete",
        subcommand: "machete",
        version: "0.9.2",
    },
];

struct Tool {
    /// The crate `cargo install` builds.
    krate: &'static str,
    /// `cargo <subcommand>` runs it.
    subcommand: &'static str,
    version: &'static str,
}

/// `cargo`, without the package variables `cargo run` gave xtask: cargo-machete takes
/// `CARGO_PKG_NAME` for a sign that it runs as `cargo run -- ARGS` and then reads its own name
/// (`machete`) as a path to analyse.
fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        if key.starts_with("CARGO_PKG_")
            || key.starts_with("CARGO_MANIFEST_")
            || key == "CARGO_CRATE_NAME"
            || key == "CARGO_BIN_NAME"
            || key == "CARGO_PRIMARY_PACKAGE"
        {
            cmd.env_remove(&*key);
        }
    }
    cmd
}

/// The version `cargo <subcommand> --version` reports (`cargo-deny 0.20.2`, `0.9.2`), if the
/// tool runs at all.
fn installed_version(tool: &Tool) -> Option<String> {
    let out = cargo().args([tool.subcommand, "--version"]).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace().last().map(str::to_string)
}

/// Installs each tool that is missing or at another version than pinned; a no-op otherwise.
pub fn ensure_tools() -> Result<()> {
    for tool in &TOOLS {
        let found = installed_version(tool);
        if found.as_deref() == Some(tool.version) {
            continue;
        }
        match &found {
            Some(v) => println!(
                "xtask: {} {v} found, installing {} (pinned)",
                tool.krate, tool.version
            ),
            None => println!("xtask: installing {} {}", tool.krate, tool.version),
        }
        let t0 = Instant::now();
        let status = cargo()
            // unoptimised: on a 2-core machine cargo-deny builds in 2 minutes instead of 6 and
            // cargo-machete in 1 instead of 2.5, and the checks still take seconds (4 s and 17 s
            // here, against 1 s and 6 s optimised)
            .args(["install", "--locked", "--debug", "--version", tool.version])
            .arg(tool.krate)
            .status()
            .with_context(|| format!("running cargo install {}", tool.krate))?;
        if !status.success() {
            bail!(
                "cargo install {} {} failed ({status})",
                tool.krate,
                tool.version
            );
        }
        println!(
            "xtask: installed {} {} in {:.0} s",
            tool.krate,
            tool.version,
            t0.elapsed().as_secs_f64()
        );
        let now = installed_version(tool);
        if now.as_deref() != Some(tool.version) {
            bail!(
                "`cargo {}` reports version {:?} after installing {} (another one earlier on \
                 PATH?)",
                tool.subcommand,
                now,
                tool.version
            );
        }
    }
    Ok(())
}

/// Runs `cargo ARGS` at the workspace root (where `deny.toml` is), from wherever xtask runs.
fn run_step(what: &str, args: &[&str]) -> Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("the workspace root")?;
    println!("xtask: cargo {}", args.join(" "));
    let status = cargo()
        .args(args)
        .current_dir(root)
        .status()
        .with_context(|| format!("running cargo {}", args.join(" ")))?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    Ok(())
}

pub fn run(args: &[String]) -> Result<()> {
    if let Some(a) = args.first() {
        bail!("`cargo xtask deps` takes no arguments (got `{a}`)");
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("the workspace root")?;
    crate::modgraph::run(root)?;
    ensure_tools()?;
    // bans, licenses and sources need only the crates' manifests (no advisory database)
    run_step(
        "cargo deny (deny.toml)",
        &[
            "deny", "--locked", "check", "-D", "warnings", "bans", "licenses", "sources",
        ],
    )?;
    run_step(
        "cargo machete (unused dependencies)",
        &["machete", "--with-metadata"],
    )?;
    Ok(())
}
