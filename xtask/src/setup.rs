//! `cargo xtask setup`: the system packages the test command needs, installed when missing.
//!
//! * `cmake`: builds llama-server (the HTTP adapter's end-to-end tests) and, through
//!   `llama-cpp-sys-2`, the llama.cpp linked by the `gguf` provider.
//! * libclang (`libclang-dev`) and the `clang` driver: `bindgen` reads llama.cpp's headers with
//!   them.
//!
//! On a Debian-family machine run as root they are installed with apt-get; elsewhere a missing
//! package is an error that names it.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};

/// The cargo feature set the test command and CI build: every provider, `gguf` included.
pub const TEST_FEATURES: &str = "mtp/gguf";

fn on_path(prog: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|d| d.join(prog).is_file()))
}

/// Whether `bindgen` (through clang-sys) will find a libclang shared library.
fn has_libclang() -> bool {
    if let Some(dir) = std::env::var_os("LIBCLANG_PATH") {
        if Path::new(&dir).is_dir() {
            return true;
        }
    }
    let mut dirs = vec![
        "/usr/lib/x86_64-linux-gnu".to_string(),
        "/usr/lib/aarch64-linux-gnu".to_string(),
        "/usr/lib64".to_string(),
        "/usr/lib".to_string(),
        "/usr/local/lib".to_string(),
    ];
    if let Ok(rd) = std::fs::read_dir("/usr/lib") {
        dirs.extend(
            rd.filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().starts_with("llvm-"))
                .map(|e| e.path().join("lib").display().to_string()),
        );
    }
    dirs.iter().any(|d| {
        std::fs::read_dir(d).is_ok_and(|rd| {
            rd.filter_map(|e| e.ok()).any(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                n.starts_with("libclang") && n.contains(".so") && !n.starts_with("libclang-cpp")
            })
        })
    })
}

/// Installs what is missing; a no-op when everything is there.
pub fn ensure() -> Result<()> {
    let mut missing = Vec::new();
    if !on_path("cmake") {
        missing.push("cmake");
    }
    if !has_libclang() {
        missing.push("libclang-dev");
    }
    // bindgen asks the clang driver for the system include paths.
    if !on_path("clang") {
        missing.push("clang");
    }
    if missing.is_empty() {
        return Ok(());
    }
    let is_root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    if !on_path("apt-get") || !is_root {
        bail!(
            "missing system packages: {} (install them with your package manager; with apt: \
             `sudo apt-get install -y {}`)",
            missing.join(", "),
            missing.join(" ")
        );
    }
    println!("xtask: installing {} with apt-get", missing.join(", "));
    let update = Command::new("apt-get")
        .arg("update")
        .status()
        .context("running apt-get update")?;
    if !update.success() {
        bail!("apt-get update failed ({update})");
    }
    let install = Command::new("apt-get")
        .args(["install", "-y", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status()
        .context("running apt-get install")?;
    if !install.success() {
        bail!("apt-get install {} failed ({install})", missing.join(" "));
    }
    Ok(())
}

pub fn run(args: &[String]) -> Result<()> {
    if let Some(a) = args.first() {
        bail!("`cargo xtask setup` takes no arguments (got `{a}`)");
    }
    ensure()?;
    println!("xtask: cmake and libclang are present; test features: {TEST_FEATURES}");
    Ok(())
}
