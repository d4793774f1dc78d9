//! `cargo xtask fixtures --real-vocab [--out DIR]`: a tiny Qwen3.5 checkpoint at a real Qwen
//! vocabulary, laid out as published checkpoints are, for the tests that must run at the real
//! vocabulary size with the real chat template.
//!
//! - `tokenizer.json` / `tokenizer_config.json`: llama.cpp b11434's `ggml-vocab-qwen35.gguf`
//!   (151,936 ids) through [`crate::tokenizer`], with Qwen3's named added tokens (`<think>`,
//!   `<tool_call>`, `<|vision_start|>`, …) at their ids, NFC as transformers loads Qwen
//!   tokenizers, and the chat template published with Qwen3.5-4B (the copy in
//!   `crates/mtp-chat/tests/templates/`).
//! - `config.json`: the `qwen3_5` VL wrapper (`text_config` + `vision_config`, the multimodal
//!   token ids), tied embeddings, an embedded MTP head (`mtp_num_hidden_layers: 1`), and
//!   `eos_token_id` set to `<|endoftext|>` as published configs do, while `<|im_end|>` comes
//!   from `generation_config.json`'s list (so a chat stops only if both are read).
//! - `generation_config.json`: the published Qwen3.5 sampling defaults.
//! - weights: f32, 4 layers (linear, full, linear, full), hidden 32, from integer arithmetic
//!   only ([`Shape::portable`]), so the checkpoint is the same bytes on every machine and
//!   `tests/fixtures/real-vocab/golden.json` (mlx-vlm's output on it, made by
//!   `make_golden.py`) holds everywhere.
//!
//! `cargo xtask test` writes it once under the cache and hands its path to the tests in
//! `MTP_REAL_VOCAB_MODEL`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use candle_core::DType;
use serde_json::{json, Value};

use crate::fixtures::{write_checkpoint, Shape};
use crate::tokenizer::{write_tokenizer_files, Options};

/// The environment variable that carries the checkpoint's path to the tests.
pub const ENV_MODEL: &str = "MTP_REAL_VOCAB_MODEL";

/// The chat template published with Qwen3.5-4B.
const QWEN35_TEMPLATE: &str =
    include_str!("../../crates/mtp-chat/tests/templates/Qwen3.5-4B.jinja");

/// Bumped whenever the checkpoint's bytes change (the cache directory is keyed by it, and the
/// golden must be regenerated).
pub const VERSION: u32 = 1;

/// The shape: real vocabulary, everything else tiny.
pub fn shape(vocab: usize) -> Shape {
    Shape {
        hidden: 32,
        layers: 4,
        interval: 2,
        heads: 2,
        kv_heads: 1,
        head_dim: 16,
        intermediate: 64,
        vocab,
        linear_k_heads: 1,
        linear_v_heads: 2,
        linear_dim: 16,
        mtp: true,
        oracle_head: false,
        seed: 35,
        dtype: DType::F32,
        tied: true,
        portable: true,
        shard_bytes: None,
    }
}

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{}", path.display()))
}

fn write_json(path: &Path, v: &Value) -> Result<()> {
    std::fs::write(path, serde_json::to_string_pretty(v)? + "\n")
        .with_context(|| format!("writing {}", path.display()))
}

/// Writes the checkpoint into `out` from the llama.cpp source tree `llama_src`.
pub fn write(out: &Path, llama_src: &Path) -> Result<()> {
    let gguf = llama_src.join("models").join("ggml-vocab-qwen35.gguf");
    let opts = Options {
        nfc: Some(true),
        qwen3_special_tokens: true,
    };
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let vocab = write_tokenizer_files(&gguf, out, &opts)?;
    let n_vocab = vocab.tokens.len();
    write_checkpoint(out, &shape(n_vocab))?;

    let tc_path = out.join("tokenizer_config.json");
    let mut tc = read_json(&tc_path)?;
    tc["chat_template"] = json!(QWEN35_TEMPLATE);
    tc["eos_token"] = json!("<|im_end|>");
    tc["pad_token"] = json!("<|endoftext|>");
    tc["model_max_length"] = json!(262144);
    write_json(&tc_path, &tc)?;

    let cfg_path = out.join("config.json");
    let mut cfg = read_json(&cfg_path)?;
    let text = &mut cfg["text_config"];
    text["rope_parameters"] = json!({
        "mrope_interleaved": true, "mrope_section": [2, 1, 1], "rope_type": "default",
        "rope_theta": 10000000, "partial_rotary_factor": 0.5
    });
    text["attn_output_gate"] = json!(true);
    text["bos_token_id"] = json!(151643);
    text["eos_token_id"] = json!(151643);
    text["dtype"] = json!("float32");
    text["max_position_embeddings"] = json!(262144);
    text["mamba_ssm_dtype"] = json!("float32");
    cfg["image_token_id"] = json!(151655);
    cfg["video_token_id"] = json!(151656);
    cfg["vision_start_token_id"] = json!(151652);
    cfg["vision_end_token_id"] = json!(151653);
    cfg["eos_token_id"] = json!(151643);
    cfg["language_model_only"] = json!(false);
    write_json(&cfg_path, &cfg)?;

    write_json(
        &out.join("generation_config.json"),
        &json!({
            "bos_token_id": 151643,
            "do_sample": true,
            "eos_token_id": [151645, 151643],
            "pad_token_id": 151643,
            "temperature": 0.6,
            "top_k": 20,
            "top_p": 0.95
        }),
    )
}

/// Writes the checkpoint once under the cache (keyed by [`VERSION`]) and returns its path.
pub fn prepare(llama_src: &Path) -> Result<PathBuf> {
    let dir = crate::llama::cache_root()?.join(format!("real-vocab-v{VERSION}"));
    let ready = dir.join("READY");
    if ready.is_file() {
        return Ok(dir);
    }
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    write(&dir, llama_src)?;
    std::fs::write(&ready, format!("{VERSION}\n"))?;
    Ok(dir)
}
