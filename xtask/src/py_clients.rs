//! The official Python clients the project must satisfy (the developers' guide: "test against
//! them, not only against our own"): one virtual environment outside the clone, in the cache
//! folder, with the `openai`, `anthropic`, `huggingface_hub`, `openai-agents` and `lm-eval`
//! packages at pinned versions, made once and reused. The tests that drive `mtp serve` with
//! `openai` (`openai_sdk` in their names), with `anthropic` (`anthropic_sdk`), with
//! `openai-agents` (`openai_agents`) and with lm-evaluation-harness (`lm_eval`), and the fake
//! Hub (`mtp-fakehub`) with `huggingface_hub` (`hf_hub`), are `#[ignore]`d without it and run
//! by `cargo xtask test` (`MTP_OPENAI_PYTHON`, `MTP_ANTHROPIC_PYTHON`, `MTP_AGENTS_PYTHON`,
//! `MTP_LM_EVAL_PYTHON` and `MTP_HF_PYTHON`, all the environment's
//! interpreter).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// The name filter of the tests that need the official `openai` client.
pub const NEEDS_OPENAI_SDK: &str = "openai_sdk";

/// The environment variable naming the interpreter that has the `openai` package.
pub const ENV_OPENAI_PYTHON: &str = "MTP_OPENAI_PYTHON";

/// The name filter of the tests that need the official `anthropic` client.
pub const NEEDS_ANTHROPIC_SDK: &str = "anthropic_sdk";

/// The environment variable naming the interpreter that has the `anthropic` package.
pub const ENV_ANTHROPIC_PYTHON: &str = "MTP_ANTHROPIC_PYTHON";

/// The name filter of the tests that need the official `huggingface_hub` client.
pub const NEEDS_HF_HUB: &str = "hf_hub";

/// The environment variable naming the interpreter that has the `huggingface_hub` package.
pub const ENV_HF_PYTHON: &str = "MTP_HF_PYTHON";

/// The name filter of the tests that need the `openai-agents` SDK.
pub const NEEDS_AGENTS_SDK: &str = "openai_agents";

/// The environment variable naming the interpreter that has the `openai-agents` package.
pub const ENV_AGENTS_PYTHON: &str = "MTP_AGENTS_PYTHON";

/// The name filter of the tests that need lm-evaluation-harness.
pub const NEEDS_LM_EVAL: &str = "lm_eval";

/// The environment variable naming the interpreter that has `lm_eval`.
pub const ENV_LM_EVAL_PYTHON: &str = "MTP_LM_EVAL_PYTHON";

/// The releases the tests are written against, installed together (`pip check` finds no
/// conflict among them; lm-evaluation-harness with its `api` extra only: its
/// `local-completions` model needs no torch).
const PACKAGES: [&str; 5] = [
    "openai==3.63.0",
    "anthropic==2.17.0",
    "huggingface_hub==2.4.0",
    "openai-agents==0.25.0",
    "lm-eval[api]==0.4.13",
];

/// The folder the environment of an earlier layout (`openai` alone) was made in.
const OLD_DIR: &str = "py-openai";

/// The interpreter that has the clients: a virtual environment's (`python3 -m venv`), or where
/// the system's Python has no `venv` module (Debian without `python3-venv`), a wrapper that
/// runs it with the packages installed beside it (`pip install --target`). Made once, when
/// missing or holding other releases (its `READY` marker lists them).
pub fn prepare() -> Result<PathBuf> {
    let root = crate::llama::cache_root()?;
    let dir = root.join("py-clients");
    let marker = dir.join("READY");
    let releases = PACKAGES.join(" ");
    if let Ok(m) = std::fs::read_to_string(&marker) {
        if let Some((listed, python)) = m.trim().split_once('\n') {
            if listed == releases && Path::new(python).is_file() {
                return Ok(PathBuf::from(python));
            }
        }
    }
    let system = crate::llama::find_python()?;
    for old in [dir.clone(), root.join(OLD_DIR)] {
        if old.exists() {
            std::fs::remove_dir_all(&old).with_context(|| format!("removing {}", old.display()))?;
        }
    }
    let venv = dir.join("venv");
    let python = if succeeds(Command::new(&system).args(["-m", "venv"]).arg(&venv)) {
        let python = venv.join("bin").join("python");
        let ok = succeeds(
            Command::new(&python)
                .args(["-m", "pip", "install", "--quiet"])
                .args(PACKAGES),
        );
        if !ok {
            bail!("pip install {releases} into {} failed", venv.display());
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
                    .args(PACKAGES),
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
    std::fs::write(&marker, format!("{releases}\n{}", python.display()))?;
    Ok(python)
}

/// Runs `cmd` (its output shown); true when it succeeded.
fn succeeds(cmd: &mut Command) -> bool {
    cmd.status().is_ok_and(|s| s.success())
}
