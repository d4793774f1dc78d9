//! `cargo xtask probe <repo-or-path> [--json] [--file NAME] [--registry FILE]`: the MTP
//! detection report for an artifact (a path, a cached repo, or the Hub: `HF_ENDPOINT`, else the public Hub).
//!
//! Bad input prints one `error: …` line and exits with code 1.

use anyhow::Result;
use mtp_detect::{probe, ProbeOptions, Registry};

const USAGE: &str =
    "usage: cargo xtask probe <repo-or-path> [--json] [--file NAME] [--registry FILE]";

struct Args {
    spec: String,
    json: bool,
    file: Option<String>,
    registry: Option<String>,
}

fn parse(args: &[String]) -> Result<Args, String> {
    let mut spec = None;
    let mut json = false;
    let mut file = None;
    let mut registry = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--json" => json = true,
            "--file" => file = Some(it.next().ok_or("--file needs a value")?.clone()),
            "--registry" => registry = Some(it.next().ok_or("--registry needs a value")?.clone()),
            "-h" | "--help" => return Err(USAGE.to_string()),
            s if s.starts_with("--") => return Err(format!("unknown option `{s}`; {USAGE}")),
            s if spec.is_none() => spec = Some(s.to_string()),
            s => return Err(format!("unexpected argument `{s}`; {USAGE}")),
        }
    }
    Ok(Args {
        spec: spec.ok_or_else(|| USAGE.to_string())?,
        json,
        file,
        registry,
    })
}

fn report(args: &Args) -> Result<String, String> {
    let mut opts = ProbeOptions::from_env().map_err(|e| e.to_string())?;
    opts.file = args.file.clone();
    if let Some(p) = &args.registry {
        opts.registry =
            Some(Registry::with_user_file(std::path::Path::new(p)).map_err(|e| e.to_string())?);
    }
    let r = probe(&args.spec, &opts).map_err(|e| e.to_string())?;
    Ok(if args.json {
        format!("{}\n", r.to_json())
    } else {
        r.render_human()
    })
}

/// Runs the command; exits with code 1 and one error line on bad input.
pub fn run(args: &[String]) -> Result<()> {
    match parse(args).and_then(|a| report(&a)) {
        Ok(out) => {
            print!("{out}");
            Ok(())
        }
        Err(e) => {
            eprintln!("error: {}", e.replace('\n', " "));
            std::process::exit(1);
        }
    }
}
