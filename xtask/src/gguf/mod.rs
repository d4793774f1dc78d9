//! `cargo xtask gguf <hf-checkpoint-dir> <out.gguf> [--outtype f32|f16] [--pre NAME] [--no-mtp]`:
//! converts a Qwen3.5 (dense or MoE) checkpoint with its MTP head to a `qwen35` / `qwen35moe`
//! GGUF that llama.cpp b11434 loads with `--spec-type draft-mtp` (see [`mod@convert`] for what is
//! transcribed from llama.cpp's `convert_hf_to_gguf.py`).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};

pub mod convert;

pub use convert::{convert, ConvertOptions, OutType};

const USAGE: &str =
    "usage: cargo xtask gguf <hf-checkpoint-dir> <out.gguf> [--outtype f32|f16] [--pre NAME] [--no-mtp]";

/// Runs the command.
pub fn run(args: &[String]) -> Result<()> {
    let mut pos: Vec<PathBuf> = Vec::new();
    let mut opts = ConvertOptions::default();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--outtype" => {
                opts.out_type = match it.next().map(String::as_str) {
                    Some("f32") => OutType::F32,
                    Some("f16") => OutType::F16,
                    other => bail!("--outtype takes f32 or f16, not {other:?}\n{USAGE}"),
                }
            }
            "--pre" => opts.pre = Some(it.next().context("--pre needs a value")?.clone()),
            "--no-mtp" => opts.no_mtp = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            s if s.starts_with("--") => bail!("unknown option `{s}`\n{USAGE}"),
            s => pos.push(PathBuf::from(s)),
        }
    }
    let [dir, out] = pos.as_slice() else {
        bail!("{USAGE}");
    };
    let summary =
        convert(dir, out, &opts).with_context(|| format!("converting {}", dir.display()))?;
    println!(
        "wrote {} ({} tensors, {} layers + {} NextN, vocab {}, {} bytes)",
        out.display(),
        summary.tensors,
        summary.n_layer,
        summary.nextn_layers,
        summary.vocab,
        summary.bytes
    );
    Ok(())
}
