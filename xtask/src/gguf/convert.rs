//! Hugging Face Qwen3.5 checkpoint (with its MTP head) to a GGUF file that llama.cpp b11434
//! loads as `qwen35` (dense) or `qwen35moe` (Qwen3.5-MoE) with `<arch>.nextn_predict_layers` and
//! `blk.{n_layer + i}.nextn.*` tensors.
//!
//! This is a Rust transcription of what llama.cpp's `convert_hf_to_gguf.py` does for
//! `Qwen3_5ForConditionalGeneration` / `Qwen3_5ForCausalLM` (classes `Qwen3_5TextModel`,
//! `_LinearAttentionVReorderBase`, `Qwen3NextModel`, `_QwenMtpMixin`, `TextModel` in
//! `conversion/qwen.py` and `conversion/base.py` of that release) and for
//! `Qwen3_5MoeForConditionalGeneration` / `Qwen3_5MoeForCausalLM` (`Qwen3_5MoeTextModel`, the
//! same classes over `Qwen2MoeModel`), without torch:
//!
//! - names: `model.language_model.*` → `model.*`; `mtp.layers.{i}.*` → layer `n_layer + i`;
//!   `mtp.fc` → `nextn.eh_proj`, `mtp.pre_fc_norm_embedding` → `nextn.enorm`,
//!   `mtp.pre_fc_norm_hidden` → `nextn.hnorm`, `mtp.norm` → `nextn.shared_head_norm`; then the
//!   `gguf-py` tensor map (`linear_attn.in_proj_qkv` → `attn_qkv`, `in_proj_z` → `attn_gate`,
//!   `in_proj_a`/`in_proj_b` → `ssm_alpha`/`ssm_beta`, `A_log` → `ssm_a`, `dt_bias` →
//!   `ssm_dt.bias`, `conv1d` → `ssm_conv1d`, `linear_attn.norm` → `ssm_norm`, `out_proj` →
//!   `ssm_out`, …);
//! - values: `A_log` → `-exp(A_log)`; every `*norm.weight` except `linear_attn.norm.weight`
//!   gets `+1` (Qwen3.5's zero-centred RMSNorm); `conv1d` is squeezed to `[channels, kernel]`;
//!   when `linear_num_key_heads < linear_num_value_heads` the V heads of the linear-attention
//!   tensors are reordered from grouped to tiled order (ggml broadcasts tiled);
//! - the full-attention `q_proj` keeps its interleaved query/gate rows (llama.cpp loads it as
//!   `n_head * head_dim * 2` rows and splits it itself);
//! - MoE (`Qwen2MoeModel.modify_tensors`): the fused `mlp.experts.gate_up_proj` `[E, 2I, D]` is
//!   split on its middle axis into `ffn_gate_exps` (first `I` rows of each expert) and
//!   `ffn_up_exps`, `mlp.experts.down_proj` `[E, D, I]` becomes `ffn_down_exps`, the router
//!   `mlp.gate` `ffn_gate_inp`, the shared expert `ffn_{gate,up,down}_shexp` and its gate
//!   `mlp.shared_expert_gate` `ffn_gate_inp_shexp` (kept `[1, D]`); the routers stay F32 at
//!   every out type, as `ModelBase.prepare_tensors` keeps them; metadata adds
//!   `expert_count`, `expert_used_count`, `expert_feed_forward_length` and
//!   `expert_shared_feed_forward_length` (and no `feed_forward_length`: the config has no
//!   `intermediate_size`).
//!
//! Vision tensors are skipped (llama.cpp puts them in a separate mmproj file). The tokenizer is
//! written as `gpt2` BPE from `tokenizer.json` (tokens, token types, merges), with the special
//! ids from `tokenizer_config.json`/`config.json` and the chat template.
//!
//! Memory: the converter streams. It reads every shard's header first, writes the GGUF header
//! from the planned tensors, then reads, transforms and writes one tensor at a time (its bytes,
//! their f32 widening, and the encoded output at most), so a real checkpoint converts in memory
//! close to a few times its largest tensor, never the whole checkpoint.
//!
//! The file (with `convert/vocab.rs`, the tokenizer's metadata) depends only on `std`,
//! `serde_json`, `half` and `thiserror` so that tests in other crates can include it with
//! `#[path]` and convert a checkpoint at test time.

use std::collections::HashMap;
use std::fs;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde_json::Value;

// a path relative to this file, so that the tests that include this file by path find it too
#[path = "convert/vocab.rs"]
mod vocab;
use vocab::tokenizer_kvs;

/// The GGUF architecture name written for a dense checkpoint.
pub const ARCH: &str = "qwen35";
/// The GGUF architecture name written for a Qwen3.5-MoE checkpoint.
pub const ARCH_MOE: &str = "qwen35moe";

/// What can go wrong converting a checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A JSON file could not be parsed.
    #[error("{path}: invalid JSON: {source}")]
    Json {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: serde_json::Error,
    },
    /// The checkpoint is not what this converter handles, or is internally inconsistent.
    #[error("{0}")]
    Unsupported(String),
}

/// Output tensor type for matrices (norms, 1-D tensors and `ssm_conv1d` are always F32).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutType {
    /// 32-bit floats everywhere (`general.file_type` 0).
    F32,
    /// 16-bit floats for 2-D weights (`general.file_type` 1).
    F16,
}

/// Conversion options.
#[derive(Debug, Clone)]
pub struct ConvertOptions {
    /// Tensor type of the matrices.
    pub out_type: OutType,
    /// `tokenizer.ggml.pre`; when `None` it is chosen from `tokenizer.json`'s pre-tokenizer
    /// (`gpt-2` for a plain byte-level one, `qwen35` otherwise).
    pub pre: Option<String>,
    /// Drop the MTP head (writes no `nextn_predict_layers`).
    pub no_mtp: bool,
}

impl Default for ConvertOptions {
    fn default() -> Self {
        ConvertOptions {
            out_type: OutType::F32,
            pre: None,
            no_mtp: false,
        }
    }
}

/// What was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConvertSummary {
    /// Tensors written.
    pub tensors: usize,
    /// Main (trunk) layers.
    pub n_layer: usize,
    /// NextN (MTP) layers written.
    pub nextn_layers: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// Bytes written.
    pub bytes: u64,
}

// ---------------------------------------------------------------------------------------------
// GGUF writer
// ---------------------------------------------------------------------------------------------

const GGUF_MAGIC: &[u8; 4] = b"GGUF";
const GGUF_VERSION: u32 = 3;
const ALIGNMENT: usize = 32;

/// One metadata value (only the kinds this converter writes).
#[derive(Debug, Clone, PartialEq)]
pub enum Kv {
    /// `GGUF_TYPE_UINT32`
    U32(u32),
    /// `GGUF_TYPE_FLOAT32`
    F32(f32),
    /// `GGUF_TYPE_BOOL`
    Bool(bool),
    /// `GGUF_TYPE_STRING`
    Str(String),
    /// array of `GGUF_TYPE_INT32`
    ArrI32(Vec<i32>),
    /// array of `GGUF_TYPE_BOOL`
    ArrBool(Vec<bool>),
    /// array of `GGUF_TYPE_STRING`
    ArrStr(Vec<String>),
}

fn put_str(w: &mut Vec<u8>, s: &str) {
    w.extend_from_slice(&(s.len() as u64).to_le_bytes());
    w.extend_from_slice(s.as_bytes());
}

fn put_kv(w: &mut Vec<u8>, key: &str, v: &Kv) {
    put_str(w, key);
    match v {
        Kv::U32(x) => {
            w.extend_from_slice(&4u32.to_le_bytes());
            w.extend_from_slice(&x.to_le_bytes());
        }
        Kv::F32(x) => {
            w.extend_from_slice(&6u32.to_le_bytes());
            w.extend_from_slice(&x.to_le_bytes());
        }
        Kv::Bool(x) => {
            w.extend_from_slice(&7u32.to_le_bytes());
            w.push(u8::from(*x));
        }
        Kv::Str(s) => {
            w.extend_from_slice(&8u32.to_le_bytes());
            put_str(w, s);
        }
        Kv::ArrI32(xs) => {
            w.extend_from_slice(&9u32.to_le_bytes());
            w.extend_from_slice(&5u32.to_le_bytes());
            w.extend_from_slice(&(xs.len() as u64).to_le_bytes());
            for x in xs {
                w.extend_from_slice(&x.to_le_bytes());
            }
        }
        Kv::ArrBool(xs) => {
            w.extend_from_slice(&9u32.to_le_bytes());
            w.extend_from_slice(&7u32.to_le_bytes());
            w.extend_from_slice(&(xs.len() as u64).to_le_bytes());
            for x in xs {
                w.push(u8::from(*x));
            }
        }
        Kv::ArrStr(xs) => {
            w.extend_from_slice(&9u32.to_le_bytes());
            w.extend_from_slice(&8u32.to_le_bytes());
            w.extend_from_slice(&(xs.len() as u64).to_le_bytes());
            for x in xs {
                put_str(w, x);
            }
        }
    }
}

fn pad_to(len: usize) -> usize {
    len.div_ceil(ALIGNMENT) * ALIGNMENT - len
}

/// A tensor's entry in the GGUF header: its data is written later, by [`write_gguf_streamed`]'s
/// `fill`, and must be exactly `bytes` long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorEntry {
    /// GGUF tensor name.
    pub name: String,
    /// ggml dimensions (`ne[0]` first).
    pub dims: Vec<u64>,
    /// ggml type tag: 0 = F32, 1 = F16.
    pub ggml_type: u32,
    /// Encoded length in bytes.
    pub bytes: u64,
}

/// Writes a GGUF v3 file (little-endian, 32-byte alignment): the header from `entries`, then
/// each tensor's data, which `fill(i, writer)` writes for entry `i` (checked against its
/// `bytes`). Returns the bytes written.
pub fn write_gguf_streamed(
    path: &Path,
    kvs: &[(String, Kv)],
    entries: &[TensorEntry],
    mut fill: impl FnMut(usize, &mut dyn Write) -> Result<(), ConvertError>,
) -> Result<u64, ConvertError> {
    let io = |source| ConvertError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut head = Vec::new();
    head.extend_from_slice(GGUF_MAGIC);
    head.extend_from_slice(&GGUF_VERSION.to_le_bytes());
    head.extend_from_slice(&(entries.len() as u64).to_le_bytes());
    head.extend_from_slice(&(kvs.len() as u64).to_le_bytes());
    for (k, v) in kvs {
        put_kv(&mut head, k, v);
    }
    let mut offset = 0u64;
    for t in entries {
        put_str(&mut head, &t.name);
        head.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
        for d in &t.dims {
            head.extend_from_slice(&d.to_le_bytes());
        }
        head.extend_from_slice(&t.ggml_type.to_le_bytes());
        head.extend_from_slice(&offset.to_le_bytes());
        offset += t.bytes + pad_to(t.bytes as usize) as u64;
    }
    head.resize(head.len() + pad_to(head.len()), 0);

    let file = fs::File::create(path).map_err(io)?;
    let mut w = BufWriter::new(file);
    w.write_all(&head).map_err(io)?;
    let mut written = head.len() as u64;
    for (i, t) in entries.iter().enumerate() {
        let mut counted = Counted { w: &mut w, n: 0 };
        fill(i, &mut counted)?;
        if counted.n != t.bytes {
            return Err(unsupported(format!(
                "{}: wrote {} bytes of data, the header says {}",
                t.name, counted.n, t.bytes
            )));
        }
        let pad = pad_to(t.bytes as usize);
        w.write_all(&[0u8; ALIGNMENT][..pad]).map_err(io)?;
        written += t.bytes + pad as u64;
    }
    w.flush().map_err(io)?;
    Ok(written)
}

/// A writer that counts what goes through it.
struct Counted<'a, W: Write> {
    w: &'a mut W,
    n: u64,
}

impl<W: Write> Write for Counted<'_, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.w.write(buf)?;
        self.n += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.w.flush()
    }
}

// ---------------------------------------------------------------------------------------------
// Reading the checkpoint
// ---------------------------------------------------------------------------------------------

/// A tensor as f32, row-major.
#[derive(Debug, Clone)]
struct Tensor {
    shape: Vec<usize>,
    data: Vec<f32>,
}

fn read_json(path: &Path) -> Result<Value, ConvertError> {
    let text = fs::read_to_string(path).map_err(|source| ConvertError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|source| ConvertError::Json {
        path: path.to_path_buf(),
        source,
    })
}

fn unsupported(msg: impl Into<String>) -> ConvertError {
    ConvertError::Unsupported(msg.into())
}

/// The largest safetensors JSON header read (the format's own limit is 100 MB).
const MAX_HEADER_BYTES: u64 = 100_000_000;

/// One tensor of a checkpoint, located in its shard; nothing of its data read yet.
#[derive(Debug, Clone)]
struct Stored {
    /// Checkpoint name.
    name: String,
    /// The shard holding it.
    path: PathBuf,
    /// Bytes per value and the widening to f32.
    width: usize,
    conv: fn(&[u8]) -> f32,
    /// Row-major shape.
    shape: Vec<usize>,
    /// Absolute offset of its data in the shard.
    start: u64,
    /// Length of its data.
    len: usize,
}

/// The tensors of one `.safetensors` file, from its header only (every offset checked against
/// the file's length).
fn read_header(path: &Path) -> Result<Vec<Stored>, ConvertError> {
    let io = |source| ConvertError::Io {
        path: path.to_path_buf(),
        source,
    };
    let bad = |m: &str| unsupported(format!("{}: {m}", path.display()));
    let mut file = fs::File::open(path).map_err(io)?;
    let file_len = file.metadata().map_err(io)?.len();
    let mut len8 = [0u8; 8];
    file.read_exact(&mut len8)
        .map_err(|_| bad("shorter than a safetensors header"))?;
    let n = u64::from_le_bytes(len8);
    if n > MAX_HEADER_BYTES || n > file_len - 8 {
        return Err(bad(&format!(
            "a header of {n} bytes in a file of {file_len} bytes"
        )));
    }
    let mut header = vec![0u8; n as usize];
    file.read_exact(&mut header).map_err(io)?;
    let header: serde_json::Map<String, Value> =
        serde_json::from_slice(&header).map_err(|source| ConvertError::Json {
            path: path.to_path_buf(),
            source,
        })?;
    let data_start = 8 + n;
    let data_len = file_len - data_start;
    let mut out = Vec::new();
    for (name, info) in header {
        if name == "__metadata__" {
            continue;
        }
        let dtype = info["dtype"]
            .as_str()
            .ok_or_else(|| bad(&format!("{name}: no dtype")))?;
        let shape: Vec<usize> = info["shape"]
            .as_array()
            .ok_or_else(|| bad(&format!("{name}: no shape")))?
            .iter()
            .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
            .collect::<Option<_>>()
            .ok_or_else(|| bad(&format!("{name}: bad shape")))?;
        let (a, b) = info["data_offsets"]
            .as_array()
            .filter(|a| a.len() == 2)
            .and_then(|a| Some((a[0].as_u64()?, a[1].as_u64()?)))
            .filter(|(a, b)| a <= b && *b <= data_len)
            .ok_or_else(|| bad(&format!("{name}: data_offsets outside the file")))?;
        let (width, conv): (usize, fn(&[u8]) -> f32) = match dtype {
            "F32" => (4, |b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            "F16" => (2, |b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()),
            "BF16" => (2, |b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()),
            other => return Err(bad(&format!("{name}: dtype {other} is not supported"))),
        };
        let want = shape
            .iter()
            .try_fold(width, |acc, &d| acc.checked_mul(d))
            .filter(|&w| w as u64 == b - a);
        let Some(len) = want else {
            return Err(bad(&format!(
                "{name}: {} bytes for {dtype} shape {shape:?}",
                b - a
            )));
        };
        out.push(Stored {
            name,
            path: path.to_path_buf(),
            width,
            conv,
            shape,
            start: data_start + a,
            len,
        });
    }
    Ok(out)
}

/// Reads one tensor's data as f32 (through `files`, the shards opened so far).
fn load(st: &Stored, files: &mut HashMap<PathBuf, fs::File>) -> Result<Tensor, ConvertError> {
    let io = |source| ConvertError::Io {
        path: st.path.clone(),
        source,
    };
    if !files.contains_key(&st.path) {
        files.insert(st.path.clone(), fs::File::open(&st.path).map_err(io)?);
    }
    let file = files.get_mut(&st.path).expect("inserted above");
    file.seek(SeekFrom::Start(st.start)).map_err(io)?;
    let mut raw = vec![0u8; st.len];
    file.read_exact(&mut raw).map_err(io)?;
    let data = raw.chunks_exact(st.width).map(st.conv).collect();
    Ok(Tensor {
        shape: st.shape.clone(),
        data,
    })
}

/// Every tensor of the checkpoint (one file, or the shards its index names), by name.
fn read_checkpoint(dir: &Path) -> Result<Vec<Stored>, ConvertError> {
    let index = dir.join("model.safetensors.index.json");
    let mut files: Vec<PathBuf> = Vec::new();
    if index.is_file() {
        let idx = read_json(&index)?;
        let map = idx["weight_map"]
            .as_object()
            .ok_or_else(|| unsupported(format!("{}: no weight_map", index.display())))?;
        for f in map.values().filter_map(Value::as_str) {
            let p = dir.join(f);
            if !files.contains(&p) {
                files.push(p);
            }
        }
    } else {
        files.push(dir.join("model.safetensors"));
    }
    let mut out = Vec::new();
    for f in &files {
        out.extend(read_header(f)?);
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Hyper-parameters
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct Hparams {
    raw: serde_json::Map<String, Value>,
}

impl Hparams {
    fn load(dir: &Path) -> Result<Hparams, ConvertError> {
        let cfg = read_json(&dir.join("config.json"))?;
        let mut raw = cfg
            .as_object()
            .cloned()
            .ok_or_else(|| unsupported("config.json is not an object"))?;
        // TextModel: move text_config to the root level.
        if let Some(Value::Object(text)) = raw.get("text_config").cloned() {
            for (k, v) in text {
                raw.insert(k, v);
            }
        }
        Ok(Hparams { raw })
    }

    fn get(&self, key: &str) -> Option<&Value> {
        self.raw.get(key)
    }

    fn usize(&self, key: &str) -> Result<usize, ConvertError> {
        self.get(key)
            .and_then(Value::as_u64)
            .and_then(|v| usize::try_from(v).ok())
            .ok_or_else(|| unsupported(format!("config.json: `{key}` missing or not an integer")))
    }

    fn opt_usize(&self, key: &str) -> Option<usize> {
        self.get(key)
            .and_then(Value::as_u64)
            .and_then(|v| usize::try_from(v).ok())
    }

    fn rope(&self) -> serde_json::Map<String, Value> {
        self.get("rope_parameters")
            .or_else(|| self.get("rope_scaling"))
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default()
    }
}

fn u32_of(v: usize, what: &str) -> Result<u32, ConvertError> {
    u32::try_from(v).map_err(|_| unsupported(format!("{what} = {v} does not fit in u32")))
}

// ---------------------------------------------------------------------------------------------
// Tensor transforms
// ---------------------------------------------------------------------------------------------

/// Reorders `num_k * per_k` heads of `head_dim` rows (starting at `row0`, rows of `row_len`
/// values) from grouped order `[k][v][h]` to tiled order `[v][k][h]`.
fn reorder_rows(t: &mut Tensor, row0: usize, num_k: usize, per_k: usize, head_dim: usize) {
    let row_len: usize = t.shape.iter().skip(1).product();
    let n_rows = num_k * per_k * head_dim;
    let src = t.data[row0 * row_len..(row0 + n_rows) * row_len].to_vec();
    for k in 0..num_k {
        for v in 0..per_k {
            for h in 0..head_dim {
                let from = (k * per_k + v) * head_dim + h;
                let to = (v * num_k + k) * head_dim + h;
                t.data[(row0 + to) * row_len..(row0 + to + 1) * row_len]
                    .copy_from_slice(&src[from * row_len..(from + 1) * row_len]);
            }
        }
    }
}

/// The same reorder on the columns of a 2-D tensor.
fn reorder_cols(t: &mut Tensor, num_k: usize, per_k: usize, head_dim: usize) {
    let rows = t.shape[0];
    let cols = t.shape[1];
    let src = t.data.clone();
    for r in 0..rows {
        for k in 0..num_k {
            for v in 0..per_k {
                for h in 0..head_dim {
                    let from = (k * per_k + v) * head_dim + h;
                    let to = (v * num_k + k) * head_dim + h;
                    t.data[r * cols + to] = src[r * cols + from];
                }
            }
        }
    }
}

/// `_QwenMtpMixin.filter_tensors` + `TextModel.filter_tensors`: the HF name after renaming, or
/// `None` for a skipped tensor.
fn filter_name(
    name: &str,
    n_layer: usize,
    no_mtp: bool,
) -> Result<Option<(String, Option<usize>)>, ConvertError> {
    const SKIP_PREFIX: &[&str] = &["mlp", "vit.", "vpm.", "merger.", "resampler."];
    const SKIP_INFIX: &[&str] = &[
        "visual.",
        "vision.",
        "audio.",
        "vision_",
        "audio_",
        "projector.",
        "patch_embed",
    ];
    if SKIP_PREFIX.iter().any(|p| name.starts_with(p))
        || SKIP_INFIX.iter().any(|p| name.contains(p))
    {
        return Ok(None);
    }
    let mut name = name.replace("language_model.", "");
    if let Some(rest) = name.strip_prefix("model.mtp.") {
        name = format!("mtp.{rest}");
    }
    let mut mtp_idx = None;
    if let Some(rest) = name.strip_prefix("mtp.") {
        if no_mtp {
            return Ok(None);
        }
        let parts: Vec<&str> = rest.splitn(3, '.').collect();
        if parts.len() == 3 && parts[0] == "layers" && parts[1].bytes().all(|b| b.is_ascii_digit())
        {
            let i: usize = parts[1]
                .parse()
                .map_err(|_| unsupported(format!("bad MTP layer index in `{name}`")))?;
            mtp_idx = Some(i);
            name = format!("model.layers.{}.{}", n_layer + i, parts[2]);
        } else if parts.len() == 2 {
            let mapped = match parts[0] {
                "fc" => "eh_proj",
                "pre_fc_norm_embedding" => "enorm",
                "pre_fc_norm_hidden" => "hnorm",
                "norm" => "shared_head.norm",
                _ => return Err(unsupported(format!("cannot map MTP tensor `{name}`"))),
            };
            name = format!("model.layers.{n_layer}.{mapped}.{}", parts[1]);
            mtp_idx = Some(0);
        } else {
            return Err(unsupported(format!("cannot map MTP tensor `{name}`")));
        }
    }
    Ok(Some((name, mtp_idx)))
}

/// The `gguf-py` tensor map for the `qwen35` / `qwen35moe` architectures (the entries a Qwen3.5
/// dense or MoE checkpoint uses).
fn map_name(name: &str) -> Option<String> {
    match name {
        "model.embed_tokens.weight" => return Some("token_embd.weight".into()),
        "lm_head.weight" => return Some("output.weight".into()),
        "model.norm.weight" => return Some("output_norm.weight".into()),
        _ => {}
    }
    let rest = name.strip_prefix("model.layers.")?;
    let (bid, tail) = rest.split_once('.')?;
    let bid: usize = bid.parse().ok()?;
    let mapped = match tail {
        "input_layernorm.weight" => "attn_norm.weight",
        "post_attention_layernorm.weight" => "post_attention_norm.weight",
        "linear_attn.A_log" => "ssm_a",
        "linear_attn.conv1d.weight" => "ssm_conv1d.weight",
        "linear_attn.dt_proj.bias" => "ssm_dt.bias",
        "linear_attn.in_proj_a.weight" => "ssm_alpha.weight",
        "linear_attn.in_proj_b.weight" => "ssm_beta.weight",
        "linear_attn.in_proj_qkv.weight" => "attn_qkv.weight",
        "linear_attn.in_proj_z.weight" => "attn_gate.weight",
        "linear_attn.norm.weight" => "ssm_norm.weight",
        "linear_attn.out_proj.weight" => "ssm_out.weight",
        "mlp.down_proj.weight" => "ffn_down.weight",
        "mlp.gate_proj.weight" => "ffn_gate.weight",
        "mlp.up_proj.weight" => "ffn_up.weight",
        "mlp.gate.weight" => "ffn_gate_inp.weight",
        "mlp.experts.gate_proj.weight" => "ffn_gate_exps.weight",
        "mlp.experts.up_proj.weight" => "ffn_up_exps.weight",
        "mlp.experts.down_proj.weight" => "ffn_down_exps.weight",
        "mlp.shared_expert.gate_proj.weight" => "ffn_gate_shexp.weight",
        "mlp.shared_expert.up_proj.weight" => "ffn_up_shexp.weight",
        "mlp.shared_expert.down_proj.weight" => "ffn_down_shexp.weight",
        "mlp.shared_expert_gate.weight" => "ffn_gate_inp_shexp.weight",
        "self_attn.q_proj.weight" => "attn_q.weight",
        "self_attn.k_proj.weight" => "attn_k.weight",
        "self_attn.v_proj.weight" => "attn_v.weight",
        "self_attn.o_proj.weight" => "attn_output.weight",
        "self_attn.q_norm.weight" => "attn_q_norm.weight",
        "self_attn.k_norm.weight" => "attn_k_norm.weight",
        "eh_proj.weight" => "nextn.eh_proj.weight",
        "enorm.weight" => "nextn.enorm.weight",
        "hnorm.weight" => "nextn.hnorm.weight",
        "shared_head.norm.weight" => "nextn.shared_head_norm.weight",
        "shared_head.head.weight" => "nextn.shared_head_head.weight",
        "embed_tokens.weight" => "nextn.embed_tokens.weight",
        _ => return None,
    };
    Some(format!("blk.{bid}.{mapped}"))
}

/// Which part of a stored tensor a GGUF tensor is: all of it, or one half of a fused
/// `experts.gate_up_proj`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Whole,
    Gate,
    Up,
}

/// `gate_up[..., :I, :]` (gate) or `gate_up[..., I:, :]` (up) of an `[E, 2I, D]` tensor.
fn split_gate_up(t: &Tensor, part: Part) -> Tensor {
    let (e, two_i, d) = (t.shape[0], t.shape[1], t.shape[2]);
    let i = two_i / 2;
    let skip = if part == Part::Up { i * d } else { 0 };
    let mut data = Vec::with_capacity(e * i * d);
    for x in 0..e {
        let start = x * two_i * d + skip;
        data.extend_from_slice(&t.data[start..start + i * d]);
    }
    Tensor {
        shape: vec![e, i, d],
        data,
    }
}

struct LinearDims {
    num_k: usize,
    num_v: usize,
    head_k: usize,
    head_v: usize,
}

/// `_LinearAttentionVReorderBase.modify_tensors` then `Qwen3NextModel.modify_tensors`: returns
/// the (possibly renamed) HF name.
fn transform(name: &str, t: &mut Tensor, lin: &LinearDims) -> Result<String, ConvertError> {
    let mut name = name.to_string();
    if lin.num_k > 0 && lin.num_v > 0 && lin.num_k != lin.num_v && name.contains("linear_attn.") {
        let per_k = lin.num_v / lin.num_k;
        let check_rows = |t: &Tensor, want: usize| {
            if t.shape.first().copied() != Some(want) {
                Err(unsupported(format!(
                    "{name}: shape {:?}, expected {want} rows",
                    t.shape
                )))
            } else {
                Ok(())
            }
        };
        if name.contains(".in_proj_qkv.") {
            let qk = lin.head_k * lin.num_k * 2;
            check_rows(t, qk + lin.num_v * lin.head_v)?;
            reorder_rows(t, qk, lin.num_k, per_k, lin.head_v);
        } else if name.contains(".in_proj_z.") {
            check_rows(t, lin.num_v * lin.head_v)?;
            reorder_rows(t, 0, lin.num_k, per_k, lin.head_v);
        } else if name.contains(".in_proj_b.") || name.contains(".in_proj_a.") {
            check_rows(t, lin.num_v)?;
            reorder_rows(t, 0, lin.num_k, per_k, 1);
        } else if name.contains(".A_log") || name.contains(".dt_bias") || name.contains(".dt_proj")
        {
            if t.shape.len() != 1 || t.shape[0] != lin.num_v {
                return Err(unsupported(format!(
                    "{name}: shape {:?}, expected [{}]",
                    t.shape, lin.num_v
                )));
            }
            reorder_rows(t, 0, lin.num_k, per_k, 1);
        } else if name.contains(".conv1d") {
            t.shape.retain(|&d| d != 1);
            let qk = lin.head_k * lin.num_k * 2;
            check_rows(t, qk + lin.num_v * lin.head_v)?;
            reorder_rows(t, qk, lin.num_k, per_k, lin.head_v);
        } else if name.contains(".out_proj.") {
            if t.shape.len() != 2 || t.shape[1] != lin.num_v * lin.head_v {
                return Err(unsupported(format!("{name}: shape {:?}", t.shape)));
            }
            reorder_cols(t, lin.num_k, per_k, lin.head_v);
        }
    }
    if name.ends_with(".mlp.experts.down_proj") {
        // `Qwen2MoeModel.modify_tensors`: the fused expert tensor gets a `.weight` suffix
        name.push_str(".weight");
    } else if name.ends_with(".A_log") {
        for x in &mut t.data {
            *x = -x.exp();
        }
    } else if let Some(base) = name.strip_suffix(".dt_bias") {
        name = format!("{base}.dt_proj.bias");
    } else if name.contains("conv1d") {
        t.shape.retain(|&d| d != 1);
    } else if name.ends_with("norm.weight") && !name.ends_with("linear_attn.norm.weight") {
        for x in &mut t.data {
            *x += 1.0;
        }
    }
    Ok(name)
}

/// The ggml type a tensor is written as, and its bytes per value: F16 for matrices when asked,
/// F32 for norms, 1-D tensors, `ssm_conv1d` and non-weights.
fn ggml_type(name: &str, shape: &[usize], out: OutType) -> (u32, usize) {
    let keep_f32 = shape.len() <= 1
        || name.ends_with("_norm.weight")
        || name.contains("ffn_gate_inp")
        || name.contains("ssm_conv1d")
        || !name.ends_with(".weight");
    if out == OutType::F16 && !keep_f32 {
        (1, 2)
    } else {
        (0, 4)
    }
}

/// Writes `t` encoded as `ggml_type` (0 = F32, 1 = F16), a block at a time.
fn encode_into(t: &Tensor, ggml_type: u32, w: &mut dyn Write) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1 << 16);
    for block in t.data.chunks(1 << 14) {
        buf.clear();
        if ggml_type == 1 {
            buf.extend(
                block
                    .iter()
                    .flat_map(|&x| half::f16::from_f32(x).to_le_bytes()),
            );
        } else {
            buf.extend(block.iter().flat_map(|x| x.to_le_bytes()));
        }
        w.write_all(&buf)?;
    }
    Ok(())
}

/// The name and shape [`transform`] gives a tensor, without its data: the header is written
/// before any tensor is read.
fn planned(name: &str, shape: &[usize]) -> (String, Vec<usize>) {
    if let Some(base) = name.strip_suffix(".mlp.experts.down_proj") {
        return (
            format!("{base}.mlp.experts.down_proj.weight"),
            shape.to_vec(),
        );
    }
    let mut shape = shape.to_vec();
    if name.contains("conv1d") {
        shape.retain(|&d| d != 1);
    }
    let name = match name.strip_suffix(".dt_bias") {
        Some(base) => format!("{base}.dt_proj.bias"),
        None => name.to_string(),
    };
    (name, shape)
}

// ---------------------------------------------------------------------------------------------
// The conversion
// ---------------------------------------------------------------------------------------------

/// Converts the checkpoint in `dir` to `out`.
pub fn convert(
    dir: &Path,
    out: &Path,
    opts: &ConvertOptions,
) -> Result<ConvertSummary, ConvertError> {
    let hp = Hparams::load(dir)?;
    let arch = hp
        .get("architectures")
        .and_then(Value::as_array)
        .and_then(|a| a.first())
        .and_then(Value::as_str)
        .unwrap_or("");
    let moe = match arch {
        "Qwen3_5ForConditionalGeneration" | "Qwen3_5ForCausalLM" => false,
        "Qwen3_5MoeForConditionalGeneration" | "Qwen3_5MoeForCausalLM" => true,
        _ => {
            return Err(unsupported(format!(
                "architecture `{arch}` is not converted (only Qwen3_5ForConditionalGeneration / Qwen3_5ForCausalLM and their Moe variants)"
            )))
        }
    };
    if moe != hp.get("num_experts").is_some() {
        return Err(unsupported(format!(
            "`{arch}` with{} `num_experts` in its config",
            if moe { "out" } else { "" }
        )));
    }
    let arch_name = if moe { ARCH_MOE } else { ARCH };
    let n_layer = hp.usize("num_hidden_layers")?;
    let lin = LinearDims {
        num_k: hp.usize("linear_num_key_heads")?,
        num_v: hp.usize("linear_num_value_heads")?,
        head_k: hp.usize("linear_key_head_dim")?,
        head_v: hp.usize("linear_value_head_dim")?,
    };
    if lin.num_v.checked_rem(lin.num_k) != Some(0) {
        return Err(unsupported(
            "linear_num_value_heads must be a multiple of linear_num_key_heads",
        ));
    }

    // the plan: every tensor's GGUF entry, from the headers alone
    let mut plan: Vec<(Stored, String, Part, TensorEntry)> = Vec::new();
    let mut n_mtp = 0usize;
    for stored in read_checkpoint(dir)? {
        let Some((name, mtp_idx)) = filter_name(&stored.name, n_layer, opts.no_mtp)? else {
            continue;
        };
        if let Some(i) = mtp_idx {
            n_mtp = n_mtp.max(i + 1);
        }
        let parts = match name.strip_suffix(".mlp.experts.gate_up_proj") {
            Some(base) => {
                let [e, two_i, d] = stored.shape[..] else {
                    return Err(unsupported(format!(
                        "{}: shape {:?}, expected [experts, 2 * intermediate, hidden]",
                        stored.name, stored.shape
                    )));
                };
                if two_i % 2 != 0 {
                    return Err(unsupported(format!(
                        "{}: odd fused gate/up width {two_i}",
                        stored.name
                    )));
                }
                let half = vec![e, two_i / 2, d];
                vec![
                    (
                        Part::Gate,
                        format!("{base}.mlp.experts.gate_proj.weight"),
                        half.clone(),
                    ),
                    (Part::Up, format!("{base}.mlp.experts.up_proj.weight"), half),
                ]
            }
            None => {
                let (renamed, shape) = planned(&name, &stored.shape);
                vec![(Part::Whole, renamed, shape)]
            }
        };
        for (part, renamed, shape) in parts {
            let gguf_name = map_name(&renamed).ok_or_else(|| {
                unsupported(format!(
                    "cannot map tensor `{}` (as `{renamed}`)",
                    stored.name
                ))
            })?;
            let (ty, width) = ggml_type(&gguf_name, &shape, opts.out_type);
            let count: usize = shape.iter().product();
            let entry = TensorEntry {
                dims: shape.iter().rev().map(|&d| d as u64).collect(),
                name: gguf_name,
                ggml_type: ty,
                bytes: (count * width) as u64,
            };
            plan.push((stored.clone(), name.clone(), part, entry));
        }
    }
    if let Some(declared) = hp.opt_usize("mtp_num_hidden_layers") {
        if !opts.no_mtp && declared != n_mtp {
            return Err(unsupported(format!(
                "config declares mtp_num_hidden_layers = {declared} but the checkpoint has {n_mtp} MTP layer(s)"
            )));
        }
    }
    let block_count = n_layer + n_mtp;

    let name = dir
        .canonicalize()
        .ok()
        .and_then(|p| p.file_name().map(|s| s.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "model".into());
    let k = |s: &str| format!("{arch_name}.{s}");
    let mut kvs: Vec<(String, Kv)> = vec![
        ("general.architecture".into(), Kv::Str(arch_name.into())),
        ("general.type".into(), Kv::Str("model".into())),
        ("general.name".into(), Kv::Str(name)),
        (
            k("block_count"),
            Kv::U32(u32_of(block_count, "block_count")?),
        ),
    ];
    if let Some(n_ctx) = hp.opt_usize("max_position_embeddings") {
        kvs.push((
            k("context_length"),
            Kv::U32(u32_of(n_ctx, "context_length")?),
        ));
    }
    kvs.push((
        k("embedding_length"),
        Kv::U32(u32_of(hp.usize("hidden_size")?, "hidden_size")?),
    ));
    // TextModel writes it when the config has it (a Qwen3.5-MoE config does not)
    if !moe || hp.get("intermediate_size").is_some() {
        kvs.push((
            k("feed_forward_length"),
            Kv::U32(u32_of(hp.usize("intermediate_size")?, "intermediate_size")?),
        ));
    }
    let n_head = hp.usize("num_attention_heads")?;
    kvs.push((
        k("attention.head_count"),
        Kv::U32(u32_of(n_head, "num_attention_heads")?),
    ));
    if let Some(kv) = hp.opt_usize("num_key_value_heads") {
        kvs.push((
            k("attention.head_count_kv"),
            Kv::U32(u32_of(kv, "num_key_value_heads")?),
        ));
    }
    let rope = hp.rope();
    let mut sections: Vec<i32> = rope
        .get("mrope_section")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_i64().and_then(|v| i32::try_from(v).ok()))
                .collect()
        })
        .unwrap_or_else(|| vec![11, 11, 10, 0]);
    sections.resize(4, 0);
    kvs.push((k("rope.dimension_sections"), Kv::ArrI32(sections)));
    let theta = rope
        .get("rope_theta")
        .or_else(|| hp.get("rope_theta"))
        .and_then(Value::as_f64);
    if let Some(theta) = theta {
        kvs.push((k("rope.freq_base"), Kv::F32(theta as f32)));
    }
    if let Some(eps) = hp.get("rms_norm_eps").and_then(Value::as_f64) {
        kvs.push((k("attention.layer_norm_rms_epsilon"), Kv::F32(eps as f32)));
    }
    if moe {
        // TextModel (expert counts), then Qwen2MoeModel (the experts' widths)
        for (key, hf) in [
            ("expert_count", "num_experts"),
            ("expert_used_count", "num_experts_per_tok"),
            ("expert_feed_forward_length", "moe_intermediate_size"),
            (
                "expert_shared_feed_forward_length",
                "shared_expert_intermediate_size",
            ),
        ] {
            kvs.push((k(key), Kv::U32(u32_of(hp.usize(hf)?, hf)?)));
        }
    }
    let head_dim = hp
        .opt_usize("head_dim")
        .unwrap_or(hp.usize("hidden_size")? / n_head.max(1));
    if hp.get("head_dim").is_some() {
        kvs.push((
            k("attention.key_length"),
            Kv::U32(u32_of(head_dim, "head_dim")?),
        ));
        kvs.push((
            k("attention.value_length"),
            Kv::U32(u32_of(head_dim, "head_dim")?),
        ));
    }
    kvs.push((
        "general.file_type".into(),
        Kv::U32(match opts.out_type {
            OutType::F32 => 0,
            OutType::F16 => 1,
        }),
    ));
    if n_mtp > 0 {
        kvs.push((
            k("nextn_predict_layers"),
            Kv::U32(u32_of(n_mtp, "nextn_predict_layers")?),
        ));
    }
    kvs.push((
        k("ssm.conv_kernel"),
        Kv::U32(u32_of(hp.usize("linear_conv_kernel_dim")?, "conv")?),
    ));
    kvs.push((
        k("ssm.state_size"),
        Kv::U32(u32_of(lin.head_k, "linear_key_head_dim")?),
    ));
    kvs.push((
        k("ssm.group_count"),
        Kv::U32(u32_of(lin.num_k, "linear_num_key_heads")?),
    ));
    kvs.push((
        k("ssm.time_step_rank"),
        Kv::U32(u32_of(lin.num_v, "linear_num_value_heads")?),
    ));
    kvs.push((
        k("ssm.inner_size"),
        Kv::U32(u32_of(lin.head_v * lin.num_v, "ssm inner")?),
    ));
    if let Some(types) = hp.get("layer_types").and_then(Value::as_array) {
        if types.len() != n_layer {
            return Err(unsupported(format!(
                "layer_types has {} entries, expected num_hidden_layers ({n_layer})",
                types.len()
            )));
        }
        let mut recurrent: Vec<bool> = types.iter().map(|t| t == "linear_attention").collect();
        recurrent.resize(block_count, false);
        kvs.push((k("attention.recurrent_layers"), Kv::ArrBool(recurrent)));
    }
    let interval = hp.opt_usize("full_attention_interval").unwrap_or(4);
    kvs.push((
        k("full_attention_interval"),
        Kv::U32(u32_of(interval, "full_attention_interval")?),
    ));
    let partial = rope
        .get("partial_rotary_factor")
        .or_else(|| hp.get("partial_rotary_factor"))
        .and_then(Value::as_f64)
        .unwrap_or(0.25);
    kvs.push((
        k("rope.dimension_count"),
        Kv::U32(u32_of((head_dim as f64 * partial) as usize, "rope dims")?),
    ));
    kvs.push(("general.quantization_version".into(), Kv::U32(2)));

    let (tok_kvs, vocab) = tokenizer_kvs(dir, &hp, opts)?;
    kvs.extend(tok_kvs);

    let entries: Vec<TensorEntry> = plan.iter().map(|(_, _, _, e)| e.clone()).collect();
    let mut shards = HashMap::new();
    let bytes = write_gguf_streamed(out, &kvs, &entries, |i, w| {
        let (stored, name, part, entry) = &plan[i];
        let mut t = load(stored, &mut shards)?;
        if *part != Part::Whole {
            let t = split_gate_up(&t, *part);
            return encode_into(&t, entry.ggml_type, w).map_err(|source| ConvertError::Io {
                path: out.to_path_buf(),
                source,
            });
        }
        let renamed = transform(name, &mut t, &lin)?;
        if (renamed.clone(), t.shape.clone()) != planned(name, &stored.shape) {
            return Err(unsupported(format!(
                "{}: transformed to `{renamed}` {:?}, not as planned",
                stored.name, t.shape
            )));
        }
        encode_into(&t, entry.ggml_type, w).map_err(|source| ConvertError::Io {
            path: out.to_path_buf(),
            source,
        })
    })?;
    Ok(ConvertSummary {
        tensors: entries.len(),
        n_layer,
        nextn_layers: n_mtp,
        vocab,
        bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shard's header is checked against the file before anything is read: offsets past the
    /// end, a length that does not fit the shape, or an absurd header length are errors that
    /// name the file and tensor; a good one reads back exactly.
    #[test]
    fn shard_headers_are_checked_against_the_file() {
        let dir = std::env::temp_dir().join(format!("mtp-convert-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let write = |name: &str, header: &str, data: &[u8], claimed: Option<u64>| {
            let mut b = claimed
                .unwrap_or(header.len() as u64)
                .to_le_bytes()
                .to_vec();
            b.extend(header.as_bytes());
            b.extend(data);
            let p = dir.join(name);
            fs::write(&p, b).unwrap();
            p
        };
        let data: Vec<u8> = [1.5f32, -2.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let good = write(
            "good.safetensors",
            r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#,
            &data,
            None,
        );
        let stored = read_header(&good).unwrap();
        let t = load(&stored[0], &mut HashMap::new()).unwrap();
        assert_eq!((t.shape, t.data), (vec![2], vec![1.5, -2.0]));
        for (name, header, claimed, want) in [
            (
                "past.safetensors",
                r#"{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#,
                None,
                "w: data_offsets outside the file",
            ),
            (
                "shape.safetensors",
                r#"{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#,
                None,
                "w: 8 bytes for F32 shape [3]",
            ),
            (
                "huge.safetensors",
                r#"{"w":{"dtype":"F32","shape":[18446744073709551615,2],"data_offsets":[0,8]}}"#,
                None,
                "w: 8 bytes",
            ),
            ("len.safetensors", "{}", Some(u64::MAX), "a header of"),
            (
                "dtype.safetensors",
                r#"{"w":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}}"#,
                None,
                "dtype I64",
            ),
        ] {
            let p = write(name, header, &data, claimed);
            let err = read_header(&p).unwrap_err().to_string();
            assert!(err.contains(name) && err.contains(want), "{name}: {err}");
        }
        fs::remove_dir_all(&dir).ok();
    }

    fn t(shape: &[usize]) -> Tensor {
        let n = shape.iter().product();
        Tensor {
            shape: shape.to_vec(),
            data: (0..n).map(|i| i as f32).collect(),
        }
    }

    #[test]
    fn v_heads_go_from_grouped_to_tiled() {
        // 2 key heads, 2 value heads per key head, head_dim 1: [k0v0, k0v1, k1v0, k1v1]
        // becomes [k0v0, k1v0, k0v1, k1v1].
        let mut x = t(&[4]);
        reorder_rows(&mut x, 0, 2, 2, 1);
        assert_eq!(x.data, vec![0.0, 2.0, 1.0, 3.0]);
        let mut m = t(&[1, 4]);
        reorder_cols(&mut m, 2, 2, 1);
        assert_eq!(m.data, vec![0.0, 2.0, 1.0, 3.0]);
        // Rows after an offset move whole rows.
        let mut q = t(&[6, 2]);
        reorder_rows(&mut q, 2, 2, 2, 1);
        // Rows 2..6 are [k0v0, k0v1, k1v0, k1v1] → [k0v0, k1v0, k0v1, k1v1].
        assert_eq!(
            q.data,
            vec![0., 1., 2., 3., 4., 5., 8., 9., 6., 7., 10., 11.]
        );
    }

    #[test]
    fn names_follow_llama_cpp() {
        let f = |n| filter_name(n, 4, false).unwrap().map(|(n, _)| n);
        assert_eq!(
            f("mtp.fc.weight").as_deref(),
            Some("model.layers.4.eh_proj.weight")
        );
        assert_eq!(
            f("mtp.layers.0.self_attn.q_proj.weight").as_deref(),
            Some("model.layers.4.self_attn.q_proj.weight")
        );
        assert_eq!(f("model.visual.blocks.0.attn.qkv.weight"), None);
        assert_eq!(
            map_name("model.layers.4.eh_proj.weight").as_deref(),
            Some("blk.4.nextn.eh_proj.weight")
        );
        assert_eq!(
            map_name("model.layers.4.shared_head.norm.weight").as_deref(),
            Some("blk.4.nextn.shared_head_norm.weight")
        );
        assert_eq!(
            map_name("model.layers.0.linear_attn.A_log").as_deref(),
            Some("blk.0.ssm_a")
        );
        assert_eq!(
            map_name("model.layers.0.linear_attn.dt_proj.bias").as_deref(),
            Some("blk.0.ssm_dt.bias")
        );
        assert_eq!(filter_name("mtp.fc.weight", 4, true).unwrap(), None);
    }

    /// Qwen3.5-MoE: the fused expert tensors split as `Qwen2MoeModel.modify_tensors` splits
    /// them, every MoE tensor named as gguf-py names it, the routers kept F32.
    #[test]
    fn moe_tensors_follow_llama_cpp() {
        // 2 experts, intermediate 2 (fused 4 rows), hidden 3: values are their flat index
        let x = t(&[2, 4, 3]);
        let gate = split_gate_up(&x, Part::Gate);
        let up = split_gate_up(&x, Part::Up);
        assert_eq!(gate.shape, vec![2, 2, 3]);
        assert_eq!(
            gate.data,
            vec![0., 1., 2., 3., 4., 5., 12., 13., 14., 15., 16., 17.]
        );
        assert_eq!(
            up.data,
            vec![6., 7., 8., 9., 10., 11., 18., 19., 20., 21., 22., 23.]
        );
        assert_eq!(
            planned("model.layers.1.mlp.experts.down_proj", &[2, 3, 2]),
            (
                "model.layers.1.mlp.experts.down_proj.weight".to_string(),
                vec![2, 3, 2]
            )
        );
        for (hf, gguf) in [
            ("mlp.gate.weight", "ffn_gate_inp.weight"),
            ("mlp.experts.gate_proj.weight", "ffn_gate_exps.weight"),
            ("mlp.experts.up_proj.weight", "ffn_up_exps.weight"),
            ("mlp.experts.down_proj.weight", "ffn_down_exps.weight"),
            (
                "mlp.shared_expert.gate_proj.weight",
                "ffn_gate_shexp.weight",
            ),
            ("mlp.shared_expert.up_proj.weight", "ffn_up_shexp.weight"),
            (
                "mlp.shared_expert.down_proj.weight",
                "ffn_down_shexp.weight",
            ),
            ("mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp.weight"),
        ] {
            assert_eq!(
                map_name(&format!("model.layers.4.{hf}")),
                Some(format!("blk.4.{gguf}"))
            );
        }
        assert_eq!(
            ggml_type("blk.0.ffn_gate_inp.weight", &[8, 64], OutType::F16),
            (0, 4)
        );
        assert_eq!(
            ggml_type("blk.0.ffn_gate_inp_shexp.weight", &[1, 64], OutType::F16),
            (0, 4)
        );
        assert_eq!(
            ggml_type("blk.0.ffn_gate_exps.weight", &[8, 32, 64], OutType::F16),
            (1, 2)
        );
    }

    #[test]
    fn values_are_shifted_like_the_python_converter() {
        let lin = LinearDims {
            num_k: 1,
            num_v: 1,
            head_k: 1,
            head_v: 1,
        };
        let mut a = Tensor {
            shape: vec![1],
            data: vec![0.0],
        };
        assert_eq!(
            transform("model.layers.0.linear_attn.A_log", &mut a, &lin).unwrap(),
            "model.layers.0.linear_attn.A_log"
        );
        assert_eq!(a.data, vec![-1.0]);
        let mut n = Tensor {
            shape: vec![2],
            data: vec![0.5, -0.5],
        };
        transform("model.layers.0.input_layernorm.weight", &mut n, &lin).unwrap();
        assert_eq!(n.data, vec![1.5, 0.5]);
        let mut g = Tensor {
            shape: vec![2],
            data: vec![0.5, -0.5],
        };
        transform("model.layers.0.linear_attn.norm.weight", &mut g, &lin).unwrap();
        assert_eq!(g.data, vec![0.5, -0.5]);
        let mut d = Tensor {
            shape: vec![1],
            data: vec![0.5],
        };
        assert_eq!(
            transform("model.layers.0.linear_attn.dt_bias", &mut d, &lin).unwrap(),
            "model.layers.0.linear_attn.dt_proj.bias"
        );
        let mut c = Tensor {
            shape: vec![3, 1, 4],
            data: vec![0.0; 12],
        };
        transform("model.layers.0.linear_attn.conv1d.weight", &mut c, &lin).unwrap();
        assert_eq!(c.shape, vec![3, 4]);
    }
}
