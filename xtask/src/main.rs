//! Project automation (the cargo-xtask pattern): `cargo xtask <command>`.
//!
//! Each command lives in its own module; this file only dispatches.

#![forbid(unsafe_code)]

use anyhow::{bail, Result};

mod bench;
mod bench_llama;
mod bench_serve;
mod delta_rule;
mod deps;
mod fixtures;
mod fuzz;
mod gguf;
mod llama;
mod modgraph;
mod probe;
mod py_clients;
mod real_vocab;
mod setup;
mod soak;
mod test;
mod tokenizer;
mod train_tiny;

const HELP: &str = "\
cargo xtask <command> [args]

commands:
  probe <repo-or-path> [--json]   print the MTP detection report for an artifact
  fixtures [options]              write random-weight Qwen3.5 checkpoints (HF layout);
                                  --real-vocab: the tiny one at a real Qwen vocabulary
  fuzz [--seconds N] [--target NAME]
                                  fuzz every parser of outside input (release build)
  gguf <hf-dir> <out.gguf>        convert a Qwen3.5 checkpoint (with its MTP head) to GGUF
  tokenizer <vocab.gguf> <out-dir> [--nfc|--no-nfc] [--qwen3-special-tokens]
                                  write tokenizer.json (+ tokenizer_config.json) from a GGUF vocabulary
  bench [options]                 MTP on/off benchmark on one loaded model;
                                  --llama-server PATH: against llama.cpp on the same weights
  bench serve [options]           mtp serve under load at several concurrencies (and llama-server)
  soak [--minutes N] [options]    mtp serve under mixed normal, malformed and slow clients
  train-tiny [options]            train the bundled demo model
  setup                           install the system packages the tests need (cmake, libclang)
  deps                            dependency checks (no module import cycle in the crates
                                  listed in xtask/src/modgraph.rs; cargo deny: bans, licenses,
                                  sources; cargo machete), installing the pinned tools when missing
  test                            the project's full test command (what CI runs)
  prepare-llama-server            build (once, cached) the llama-server that `test` uses
";

/// The `mtp` command's allocator (see the workspace `Cargo.toml`), so that `bench` measures
/// the engine as users run it.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Whether `args` ask for a subcommand's help (`-h` or `--help` anywhere); prints `help` if so.
pub(crate) fn print_help_if_asked(args: &[String], help: &str) -> bool {
    let asked = args.iter().any(|a| a == "-h" || a == "--help");
    if asked {
        print!("{help}");
    }
    asked
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((cmd, rest)) = args.split_first() else {
        print!("{HELP}");
        return Ok(());
    };
    match cmd.as_str() {
        "-h" | "--help" | "help" => {
            print!("{HELP}");
            Ok(())
        }
        "bench" if rest.first().is_some_and(|a| a == "serve") => bench_serve::run(&rest[1..]),
        "bench" => bench::run(rest),
        "fixtures" => fixtures::run(rest),
        "fuzz" => fuzz::run(rest),
        "gguf" => gguf::run(rest),
        "probe" => probe::run(rest),
        "setup" => setup::run(rest),
        "deps" => deps::run(rest),
        // what `test` prepares first (llama-server b11434 for the adapter's tests, cached):
        // a fresh machine can build it ahead, e.g. while other work compiles
        "prepare-llama-server" => {
            println!("{}", llama::prepare()?.display());
            Ok(())
        }
        "soak" => soak::run(rest),
        "test" => test::run(rest),
        "tokenizer" => tokenizer::run(rest),
        "train-tiny" => train_tiny::run(rest),
        other => bail!("unknown xtask command `{other}`\n\n{HELP}"),
    }
}
