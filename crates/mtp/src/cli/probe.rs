//! `mtp probe`: the detection report of `mtp-detect` (the same as `cargo xtask probe`).

use crate::cli::args::ProbeArgs;
use crate::cli::error::CliError;
use crate::cli::output::Out;

pub(crate) fn run(a: ProbeArgs, _out: &mut Out) -> Result<(), CliError> {
    Err(CliError::Probe {
        target: a.target,
        message: "detection is not built into this version of mtp yet (crate mtp-detect)".into(),
    })
}
