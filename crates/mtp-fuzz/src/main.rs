//! `mtp-fuzz [--seconds N] [--inputs N] [--target NAME] [--seed S] [--out DIR]`: fuzzes every
//! target (or one) and prints a line per target; exit status 1 when anything was found, with
//! each finding's input written under `--out` (default `target/fuzz-findings`).
//! `cargo xtask fuzz` builds it in release and runs it.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use mtp_fuzz::{Budget, Report};

#[global_allocator]
static ALLOC: peak_alloc::PeakAlloc = peak_alloc::PeakAlloc;

struct Args {
    seconds: f64,
    inputs: u64,
    target: Option<String>,
    seed: u64,
    out: PathBuf,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        seconds: 10.0,
        inputs: u64::MAX,
        target: None,
        seed: 1,
        out: PathBuf::from("target/fuzz-findings"),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--seconds" => a.seconds = value()?.parse().map_err(|e| format!("--seconds: {e}"))?,
            "--inputs" => a.inputs = value()?.parse().map_err(|e| format!("--inputs: {e}"))?,
            "--target" => a.target = Some(value()?),
            "--seed" => a.seed = value()?.parse().map_err(|e| format!("--seed: {e}"))?,
            "--out" => a.out = PathBuf::from(value()?),
            "-h" | "--help" => {
                return Err(
                    "usage: mtp-fuzz [--seconds N per target] [--inputs N per target] \
                            [--target NAME] [--seed S] [--out DIR]"
                        .into(),
                )
            }
            other => return Err(format!("unknown argument `{other}` (--help lists them)")),
        }
    }
    if !(a.seconds > 0.0 && a.seconds.is_finite()) {
        return Err("--seconds must be a positive number".into());
    }
    Ok(a)
}

fn save(out: &std::path::Path, r: &Report) -> std::io::Result<Vec<PathBuf>> {
    let dir = out.join(r.target);
    std::fs::create_dir_all(&dir)?;
    let mut paths = Vec::new();
    for (i, f) in r.findings.iter().enumerate() {
        let p = dir.join(format!("finding-{i}.bin"));
        std::fs::write(&p, &f.input)?;
        std::fs::write(dir.join(format!("finding-{i}.txt")), &f.what)?;
        paths.push(p);
    }
    Ok(paths)
}

fn main() -> ExitCode {
    let a = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("mtp-fuzz: {e}");
            return ExitCode::from(2);
        }
    };
    let targets = mtp_fuzz::all();
    let chosen: Vec<_> = targets
        .iter()
        .filter(|t| a.target.as_deref().is_none_or(|n| n == t.name))
        .collect();
    if chosen.is_empty() {
        let names: Vec<_> = targets.iter().map(|t| t.name).collect();
        eprintln!(
            "mtp-fuzz: no target `{}`; targets: {}",
            a.target.unwrap_or_default(),
            names.join(", ")
        );
        return ExitCode::from(2);
    }
    let budget = Budget {
        inputs: a.inputs,
        time: Duration::from_secs_f64(a.seconds),
        slow: Duration::from_secs(1),
    };
    println!(
        "| target | inputs | inputs/s | slowest | peak alloc | worst alloc / cap | findings |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    let mut found = 0;
    for t in chosen {
        let r = mtp_fuzz::run(t, budget, a.seed);
        println!(
            "| {} | {} | {:.0} | {:.1} ms | {} KiB | {:.2} | {} |",
            r.target,
            r.inputs,
            r.inputs as f64 / r.elapsed.as_secs_f64().max(1e-9),
            r.slowest.as_secs_f64() * 1e3,
            r.peak_alloc / 1024,
            r.worst_alloc_ratio,
            r.finding_count
        );
        if r.finding_count > 0 {
            found += r.finding_count;
            for f in &r.findings {
                eprintln!("  {}: {}", r.target, f.what);
            }
            match save(&a.out, &r) {
                Ok(paths) => {
                    for p in paths {
                        eprintln!("  input: {}", p.display());
                    }
                }
                Err(e) => eprintln!("  cannot save the inputs under {}: {e}", a.out.display()),
            }
        }
    }
    if found > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
