//! `mtp probe`: the detection report of `mtp-detect` (the same as `cargo xtask probe`).
//! A path is read locally; a repo id from the Hugging Face cache, else the Hub (`HF_ENDPOINT`, else
//! the public Hub; none with `HF_HUB_OFFLINE=1`).
//! The in-process runtimes' rows are `mtp generate …` lines, or `mtp::create_llm(…)` code with
//! `--json` or `-v`.

use crate::cli::args::ProbeArgs;
use crate::cli::error::CliError;
use crate::cli::output::Out;

pub(crate) fn run(a: ProbeArgs, verbose: u8, out: &mut Out) -> Result<(), CliError> {
    // the registry from MTP_MODEL_CAPABILITIES when set (an unreadable file is an error)
    let mut opts = mtp_detect::ProbeOptions {
        file: a.file.clone(),
        ..mtp_detect::ProbeOptions::from_env().map_err(|e| CliError::Probe {
            target: a.target.clone(),
            message: e.to_string(),
        })?
    };
    // at the terminal the ways to run it are `mtp generate …` lines; the library calls with
    // --json (for programs) or -v
    if !a.json && verbose == 0 {
        opts.style = mtp_detect::CommandStyle::Cli;
    }
    tracing::debug!(target = %a.target, cache = %opts.cache.hub_cache.display(), hub = opts.hub.is_some(), "probing");
    let report = mtp_detect::probe(&a.target, &opts).map_err(|e| CliError::Probe {
        target: a.target.clone(),
        message: e.to_string(),
    })?;
    if a.json {
        let text =
            serde_json::to_string_pretty(&report.to_json()).map_err(|e| CliError::Probe {
                target: a.target.clone(),
                message: e.to_string(),
            })?;
        out.line(&text)?;
    } else {
        out.text(&report.render_human())?;
    }
    Ok(())
}
