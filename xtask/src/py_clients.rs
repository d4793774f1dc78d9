//! The official Python clients the server must satisfy (the developers' guide: "test against
//! them, not only against our own"): a virtual environment outside the clone, in the cache
//! folder, with the `openai` package at a pinned version, made once and reused. The tests that
//! drive `mtp serve` with it are `#[ignore]`d without it and run by `cargo xtask test`
//! (`MTP_OPENAI_PYTHON`, the environment's interpreter).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// The name filter of the tests that need the official `openai` client.
pub const NEEDS_OPENAI_SDK: &str = "openai_sdk";

/// The environment variable naming the interpreter that has the `openai` package.
pub const ENV_OPENAI_PYTHON: &str = "MTP_OPENAI_PYTHON";

/// The `openai` release the tests are written against.
const OPENAI: &str = "openai==3.63.0";

/// The interpreter that has the client: a virtual environment's (`python3 -m venv`), or where
/// the system's Python has no `venv` module (Debian without `python3-venv`), a wrapper that
/// runs it with the package installed beside it (`pip install --target`). Made once, when
/// missing or holding another release.
pub fn prepare() -> Result<PathBuf> {
    let dir = crate::llama::cache_root()?.join("py-openai");
    let marker = dir.join("READY");
    if let Ok(m) = std::fs::read_to_string(&marker) {
        if let Some((release, python)) = m.trim().split_once('\n') {
            if release == OPENAI && Path::new(python).is_file() {
                return Ok(PathBuf::from(python));
            }
        }
    }
    let system = crate::llama::find_python()?;
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    let venv = dir.join("venv");
    let python = if succeeds(Command::new(&system).args(["-m", "venv"]).arg(&venv)) {
        let python = venv.join("bin").join("python");
        let ok = succeeds(Command::new(&python).args(["-m", "pip", "install", "--quiet", OPENAI]));
        if !ok {
            bail!("pip install {OPENAI} into {} failed", venv.display());
        }
        python
    } else {
        let site = dir.join("site");
        let install = |extra: &[&str]| {
            succeeds(
                Command::new(&system)
                    .args(["-m", "pip", "install", "--quiet", "--target"])
                    .arg(&site)
                    .args(extra)
                    .arg(OPENAI),
            )
        };
        // (`--target` leaves the system's packages alone; pip 23+ still wants to be told so
        // on an externally managed Python, older pip does not know the flag)
        if !install(&["--break-system-packages"]) && !install(&[]) {
            bail!(
                "{system} has no venv module and pip install --target {} failed",
                site.display()
            );
        }
        let wrapper = dir.join("python");
        std::fs::write(
            &wrapper,
            format!(
                "#!/bin/sh\nPYTHONPATH=\"{}${{PYTHONPATH:+:$PYTHONPATH}}\" exec {system} \"$@\"\n",
                site.display()
            ),
        )?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))?;
        wrapper
    };
    std::fs::write(&marker, format!("{OPENAI}\n{}", python.display()))?;
    Ok(python)
}

/// Runs `cmd` (its output shown); true when it succeeded.
fn succeeds(cmd: &mut Command) -> bool {
    cmd.status().is_ok_and(|s| s.success())
}
