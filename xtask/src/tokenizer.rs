//! `cargo xtask tokenizer <vocab.gguf> <out-dir> [--nfc|--no-nfc] [--qwen3-special-tokens]`:
//! a Hugging Face `tokenizer.json` (and a minimal `tokenizer_config.json`) from the byte-level
//! BPE vocabulary of a llama.cpp GGUF file (`tokenizer.ggml.model = gpt2`).
//!
//! What goes where:
//! - `tokenizer.ggml.tokens` / `token_type` become the BPE vocabulary (ids are the GGUF
//!   indices); control tokens and other user-defined tokens are also `added_tokens` (control
//!   ones `special`). The `[PAD<id>]` placeholders llama.cpp's converter writes for ids the
//!   Hugging Face tokenizer does not have are left out entirely, so those ids do not exist.
//! - `tokenizer.ggml.merges` (`"a b"` strings) become the BPE merges, in rank order.
//! - `tokenizer.ggml.pre` picks the pre-tokenizer from [`PRE_TOKENIZERS`]: the original Hugging
//!   Face one (regexes as in the models' own `tokenizer.json`, not llama.cpp's rewrites). An
//!   unknown name is an error that names it.
//! - The normalizer is NFC or none: llama.cpp never normalizes, transformers' `Qwen2Tokenizer`
//!   and `Qwen3_5Tokenizer` (and Qwen's own `tokenizer.json`) use NFC. The default is the
//!   pre-tokenizer's ([`PreTokenizer::default_nfc`]); [`Options::nfc`] overrides it. The two
//!   differ only on text NFC changes: llama.cpp's qwen35 reference ids were written without
//!   NFC (`e` + U+0301 is two tokens there), so on its three decomposed-accent strings the NFC
//!   tokenizer gives the ids of the composed text instead (tests below).
//!
//! Every supported pre-tokenizer is checked against Hugging Face's own tokenizations of
//! llama.cpp's test strings (`models/ggml-vocab-<pre>.gguf.{inp,out}` in the llama.cpp source,
//! tests below; `cargo xtask test` runs them).

use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use anyhow::{anyhow, bail, Context, Result};
use mtp_detect::gguf::{
    parse_gguf_with, GgufArray, GgufHeader, GgufParse, GgufType, GgufValue, ParseOptions,
    DEFAULT_PREFIX,
};
use serde_json::{json, Map, Value};

const USAGE: &str = "usage: cargo xtask tokenizer <vocab.gguf> <out-dir> [--nfc|--no-nfc] \
                     [--qwen3-special-tokens]";

/// The most header bytes read: a 256k-token vocabulary with 500k merges takes ~20 MiB.
const MAX_HEADER: u64 = 256 << 20;

/// How [`tokenizer_json_from_gguf`] reads a vocabulary. The default: the pre-tokenizer's
/// normalizer, llama.cpp's placeholders left out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Options {
    /// The NFC normalizer: `Some(true)` on, `Some(false)` off, `None` the pre-tokenizer's
    /// default ([`PreTokenizer::default_nfc`]).
    pub nfc: Option<bool>,
    /// Names Qwen3's added tokens ([`QWEN3_ADDED_TOKENS`]: `<think>`, `<tool_call>`, …) at the
    /// ids where llama.cpp's Qwen vocabularies hold `[PAD<id>]` placeholders. Ordinary text
    /// encodes as before; these strings become one token each.
    pub qwen3_special_tokens: bool,
}

/// Qwen3's added tokens after `<|im_end|>` (151645), as its `tokenizer_config.json`
/// `added_tokens_decoder` and `tokenizer.json` `added_tokens` list them: id, content, and
/// whether the token is `special` (skipped when decoding with `skip_special_tokens`).
pub const QWEN3_ADDED_TOKENS: &[(u32, &str, bool)] = &[
    (151646, "<|object_ref_start|>", true),
    (151647, "<|object_ref_end|>", true),
    (151648, "<|box_start|>", true),
    (151649, "<|box_end|>", true),
    (151650, "<|quad_start|>", true),
    (151651, "<|quad_end|>", true),
    (151652, "<|vision_start|>", true),
    (151653, "<|vision_end|>", true),
    (151654, "<|vision_pad|>", true),
    (151655, "<|image_pad|>", true),
    (151656, "<|video_pad|>", true),
    (151657, "<tool_call>", false),
    (151658, "</tool_call>", false),
    (151659, "<|fim_prefix|>", false),
    (151660, "<|fim_middle|>", false),
    (151661, "<|fim_suffix|>", false),
    (151662, "<|fim_pad|>", false),
    (151663, "<|repo_name|>", false),
    (151664, "<|file_sep|>", false),
    (151665, "<tool_response>", false),
    (151666, "</tool_response>", false),
    (151667, "<think>", false),
    (151668, "</think>", false),
];

/// One step of a Hugging Face `Sequence` pre-tokenizer.
#[derive(Debug, Clone, Copy)]
enum Step {
    /// `Split` on a regex, matches isolated.
    Split(&'static str),
    /// `ByteLevel`; `use_regex` splits with its own GPT-2 regex first.
    ByteLevel { use_regex: bool },
    /// `Digits`.
    Digits { individual: bool },
    /// `Punctuation`, contiguous.
    Punctuation,
}

/// A `tokenizer.ggml.pre` this converter knows, and the Hugging Face tokenizer it stands for.
#[derive(Debug)]
pub struct PreTokenizer {
    /// The `tokenizer.ggml.pre` value (as llama.cpp's `convert_hf_to_gguf_update.py` names it).
    pub name: &'static str,
    steps: &'static [Step],
    /// `trim_offsets` of the byte-level steps (offsets only; ids do not depend on it).
    trim_offsets: bool,
    /// BPE `ignore_merges`: a pre-token that is itself in the vocabulary is one token.
    ignore_merges: bool,
    /// Whether the Hugging Face tokenizer normalizes to NFC.
    pub default_nfc: bool,
}

/// `tokenizer_class` in `tokenizer_config.json`: the class that loads `tokenizer.json` as it
/// is. (Qwen's own files say `Qwen2Tokenizer`, but transformers 5 then rebuilds the normalizer
/// from the class, NFC whatever the file says, so `--no-nfc` would be lost.)
const TOKENIZER_CLASS: &str = "PreTrainedTokenizerFast";

/// Qwen2 / Qwen2.5 / Qwen3 (`tokenizer.json` and transformers' `Qwen2Tokenizer`).
const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen3.5: Qwen2's with combining marks (`\p{M}`) kept inside words (`Qwen3_5Tokenizer`).
const QWEN35_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Llama 3 (`meta-llama/Meta-Llama-3-8B` `tokenizer.json`).
const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

const QWEN_STEPS: [Step; 2] = [
    Step::Split(QWEN2_REGEX),
    Step::ByteLevel { use_regex: false },
];
const GPT2_STEPS: [Step; 1] = [Step::ByteLevel { use_regex: true }];
const DIGITS_GPT2_STEPS: [Step; 2] = [
    Step::Digits { individual: true },
    Step::ByteLevel { use_regex: true },
];

/// The known pre-tokenizers. Each is tested against Hugging Face's tokenizations in llama.cpp's
/// `models/ggml-vocab-<name>.gguf.out`.
pub const PRE_TOKENIZERS: &[PreTokenizer] = &[
    PreTokenizer {
        name: "qwen35",
        steps: &[
            Step::Split(QWEN35_REGEX),
            Step::ByteLevel { use_regex: false },
        ],
        trim_offsets: false,
        ignore_merges: false,
        default_nfc: true,
    },
    PreTokenizer {
        name: "qwen2",
        steps: &QWEN_STEPS,
        trim_offsets: false,
        ignore_merges: false,
        default_nfc: true,
    },
    PreTokenizer {
        name: "llama-bpe",
        steps: &[
            Step::Split(LLAMA3_REGEX),
            Step::ByteLevel { use_regex: false },
        ],
        trim_offsets: true,
        ignore_merges: true,
        default_nfc: false,
    },
    PreTokenizer {
        name: "gpt-2",
        steps: &GPT2_STEPS,
        trim_offsets: true,
        ignore_merges: false,
        default_nfc: false,
    },
    // mosaicml/mpt-7b (EleutherAI/gpt-neox-20b's tokenizer).
    PreTokenizer {
        name: "mpt",
        steps: &GPT2_STEPS,
        trim_offsets: true,
        ignore_merges: false,
        default_nfc: false,
    },
    PreTokenizer {
        name: "starcoder",
        steps: &DIGITS_GPT2_STEPS,
        trim_offsets: true,
        ignore_merges: false,
        default_nfc: false,
    },
    PreTokenizer {
        name: "refact",
        steps: &DIGITS_GPT2_STEPS,
        trim_offsets: true,
        ignore_merges: false,
        default_nfc: false,
    },
    PreTokenizer {
        name: "command-r",
        steps: &DIGITS_GPT2_STEPS,
        trim_offsets: true,
        ignore_merges: false,
        default_nfc: false,
    },
    PreTokenizer {
        name: "falcon",
        steps: &[
            Step::Punctuation,
            Step::ByteLevel { use_regex: true },
            Step::Digits { individual: false },
            Step::Split("[0-9][0-9][0-9]"),
        ],
        trim_offsets: true,
        ignore_merges: false,
        default_nfc: false,
    },
];

/// The known pre-tokenizer named `name`.
pub fn pre_tokenizer(name: &str) -> Option<&'static PreTokenizer> {
    PRE_TOKENIZERS.iter().find(|p| p.name == name)
}

/// What a token is, from `tokenizer.ggml.token_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    /// An ordinary BPE token (type 1).
    Normal,
    /// A control token (type 3): a `special` added token.
    Control,
    /// A user-defined token (type 4): a non-special added token.
    UserDefined,
    /// A user-defined `[PAD<id>]` placeholder: no token at all in Hugging Face's tokenizer.
    Placeholder,
}

/// One vocabulary entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    /// The token's text (byte-level encoded for normal tokens).
    pub text: String,
    /// Its kind.
    pub kind: TokenKind,
}

/// A GGUF file's byte-level BPE vocabulary, read and checked.
#[derive(Debug, Clone)]
pub struct GgufVocab {
    /// The file it came from (for messages).
    pub path: PathBuf,
    /// The pre-tokenizer (`tokenizer.ggml.pre`).
    pub pre: &'static PreTokenizer,
    /// Whether the tokenizer normalizes to NFC.
    pub nfc: bool,
    /// The tokens, by id.
    pub tokens: Vec<Token>,
    /// The merges, by rank.
    pub merges: Vec<(String, String)>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos: Option<u32>,
    /// `tokenizer.ggml.padding_token_id`.
    pub pad: Option<u32>,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`.
    pub add_bos: bool,
    /// `tokenizer.chat_template`.
    pub chat_template: Option<String>,
    /// `<arch>.context_length`.
    pub context_length: Option<u64>,
}

/// Reads the GGUF vocabulary at `path` and builds its `tokenizer.json`.
// For other xtask code; the command itself writes the files with `write_tokenizer_files`.
#[cfg_attr(not(test), allow(dead_code))]
pub fn tokenizer_json_from_gguf(path: &Path, opts: &Options) -> Result<Value> {
    GgufVocab::read(path, opts)?.tokenizer_json()
}

/// Writes `tokenizer.json` and `tokenizer_config.json` for the GGUF vocabulary at `path` into
/// `out_dir` (created when missing), after checking that the `tokenizer.json` loads with the
/// `tokenizers` crate and gives every token its GGUF id. Returns the vocabulary read.
pub fn write_tokenizer_files(path: &Path, out_dir: &Path, opts: &Options) -> Result<GgufVocab> {
    let vocab = GgufVocab::read(path, opts)?;
    let tokenizer = vocab.tokenizer_json()?;
    vocab.load(&tokenizer)?;
    std::fs::create_dir_all(out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    for (name, value) in [
        ("tokenizer.json", tokenizer),
        ("tokenizer_config.json", vocab.tokenizer_config()?),
    ] {
        let out = out_dir.join(name);
        let text = serde_json::to_string_pretty(&value)?;
        std::fs::write(&out, text).with_context(|| format!("writing {}", out.display()))?;
    }
    Ok(vocab)
}

/// Runs the command.
pub fn run(args: &[String]) -> Result<()> {
    let mut pos: Vec<PathBuf> = Vec::new();
    let mut opts = Options::default();
    for a in args {
        match a.as_str() {
            "--nfc" => opts.nfc = Some(true),
            "--no-nfc" => opts.nfc = Some(false),
            "--qwen3-special-tokens" => opts.qwen3_special_tokens = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            s if s.starts_with("--") => bail!("unknown option `{s}`\n{USAGE}"),
            s => pos.push(PathBuf::from(s)),
        }
    }
    let [gguf, out] = pos.as_slice() else {
        bail!("{USAGE}");
    };
    let vocab = write_tokenizer_files(gguf, out, &opts)?;
    let kept = vocab
        .tokens
        .iter()
        .filter(|t| t.kind != TokenKind::Placeholder);
    println!(
        "wrote {}/tokenizer.json and tokenizer_config.json: pre-tokenizer {}, {} tokens, {} merges, normalizer {}",
        out.display(),
        vocab.pre.name,
        kept.count(),
        vocab.merges.len(),
        if vocab.nfc { "NFC" } else { "none" },
    );
    Ok(())
}

/// Reads the GGUF header of `path` with every array item kept, growing the prefix read until
/// the header is complete (at most [`MAX_HEADER`] bytes).
fn read_header(path: &Path) -> Result<GgufHeader> {
    let mut file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let len = file
        .metadata()
        .with_context(|| format!("reading the size of {}", path.display()))?
        .len();
    let opts = ParseOptions::whole_arrays();
    let mut buf = Vec::new();
    let mut want = DEFAULT_PREFIX.min(len);
    loop {
        let before = buf.len() as u64;
        (&mut file)
            .take(want.saturating_sub(before))
            .read_to_end(&mut buf)
            .with_context(|| format!("reading {}", path.display()))?;
        let parsed = parse_gguf_with(&buf, len, &opts)
            .with_context(|| format!("{}: bad GGUF header", path.display()))?;
        let needed = match parsed {
            GgufParse::Complete(h) => return Ok(h),
            GgufParse::NeedMore { needed, .. } => needed,
        };
        if needed > MAX_HEADER {
            bail!(
                "{}: the GGUF header needs {needed} bytes, more than the {MAX_HEADER} read at most",
                path.display()
            );
        }
        if buf.len() as u64 == before {
            bail!(
                "{}: the file ended while reading its header",
                path.display()
            );
        }
        want = needed.max(want.saturating_mul(2)).min(MAX_HEADER).min(len);
    }
}

/// Typed access to a header's metadata, with errors that name the file and the key.
struct Meta<'a> {
    path: &'a Path,
    h: &'a GgufHeader,
}

impl Meta<'_> {
    fn err(&self, key: &str, what: impl std::fmt::Display) -> anyhow::Error {
        anyhow!("{}: metadata `{key}` {what}", self.path.display())
    }

    fn required(&self, key: &str) -> Result<&GgufValue> {
        self.h.get(key).ok_or_else(|| self.err(key, "is missing"))
    }

    fn str(&self, key: &str) -> Result<&str> {
        let v = self.required(key)?;
        v.as_str()
            .ok_or_else(|| self.err(key, format!("is not a string ({v:?})")))
    }

    fn opt_str(&self, key: &str) -> Result<Option<&str>> {
        self.h.get(key).map(|_| self.str(key)).transpose()
    }

    fn opt_u64(&self, key: &str) -> Result<Option<u64>> {
        let Some(v) = self.h.get(key) else {
            return Ok(None);
        };
        v.as_u64()
            .map(Some)
            .ok_or_else(|| self.err(key, format!("is not a non-negative integer ({v:?})")))
    }

    fn opt_u32(&self, key: &str) -> Result<Option<u32>> {
        self.opt_u64(key)?
            .map(|v| {
                u32::try_from(v).map_err(|_| self.err(key, format!("= {v} is not a token id")))
            })
            .transpose()
    }

    fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        let Some(v) = self.h.get(key) else {
            return Ok(None);
        };
        v.as_bool()
            .map(Some)
            .ok_or_else(|| self.err(key, format!("is not a bool ({v:?})")))
    }

    /// A whole array (every item kept).
    fn array(&self, key: &str) -> Result<&GgufArray> {
        let a = self
            .required(key)?
            .as_array()
            .ok_or_else(|| self.err(key, "is not an array"))?;
        if !a.is_complete() {
            let kept = a.items.len();
            return Err(self.err(
                key,
                format!("declares {} items but {kept} were read", a.len),
            ));
        }
        Ok(a)
    }

    fn strings(&self, key: &str) -> Result<Vec<&str>> {
        let a = self.array(key)?;
        if a.elem_type != GgufType::String {
            return Err(self.err(key, format!("holds {:?}, not strings", a.elem_type)));
        }
        Ok(a.items.iter().filter_map(GgufValue::as_str).collect())
    }

    fn integers(&self, key: &str) -> Result<Vec<u64>> {
        let a = self.array(key)?;
        a.items
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_u64()
                    .ok_or_else(|| self.err(key, format!("item {i} is not an integer ({v:?})")))
            })
            .collect()
    }
}

impl GgufVocab {
    /// Reads and checks the vocabulary of the GGUF file at `path`.
    pub fn read(path: &Path, opts: &Options) -> Result<GgufVocab> {
        let h = read_header(path)?;
        let meta = Meta { path, h: &h };
        let model = meta.str("tokenizer.ggml.model")?;
        if model != "gpt2" {
            bail!(
                "{}: `tokenizer.ggml.model` is `{model}`; only `gpt2` (byte-level BPE) \
                 vocabularies are converted",
                path.display()
            );
        }
        let pre_name = meta.str("tokenizer.ggml.pre")?;
        let pre = pre_tokenizer(pre_name).ok_or_else(|| {
            let known: Vec<&str> = PRE_TOKENIZERS.iter().map(|p| p.name).collect();
            anyhow!(
                "{}: unknown pre-tokenizer `tokenizer.ggml.pre = {pre_name}` (known: {})",
                path.display(),
                known.join(", ")
            )
        })?;
        let mut tokens = read_tokens(&meta)?;
        if opts.qwen3_special_tokens {
            name_qwen3_tokens(path, &mut tokens)?;
        }
        let merges = read_merges(&meta)?;
        let arch = meta.opt_str("general.architecture")?;
        let context_length = match arch {
            Some(arch) => meta.opt_u64(&format!("{arch}.context_length"))?,
            None => None,
        };
        let vocab = GgufVocab {
            path: path.to_path_buf(),
            pre,
            nfc: opts.nfc.unwrap_or(pre.default_nfc),
            tokens,
            merges,
            eos: meta.opt_u32("tokenizer.ggml.eos_token_id")?,
            pad: meta.opt_u32("tokenizer.ggml.padding_token_id")?,
            bos: meta.opt_u32("tokenizer.ggml.bos_token_id")?,
            add_bos: meta
                .opt_bool("tokenizer.ggml.add_bos_token")?
                .unwrap_or(false),
            chat_template: meta.opt_str("tokenizer.chat_template")?.map(str::to_string),
            context_length,
        };
        vocab.check_merges(&vocab.index()?)?;
        Ok(vocab)
    }

    /// The Hugging Face `tokenizer.json`.
    pub fn tokenizer_json(&self) -> Result<Value> {
        // `read` checked that no two tokens share a text.
        let vocab: Map<String, Value> = self
            .kept()
            .map(|(id, t)| (t.text.clone(), json!(id)))
            .collect();
        let merges: Vec<Value> = self.merges.iter().map(|(a, b)| json!([a, b])).collect();
        let byte_level = |use_regex: bool| {
            json!({
                "type": "ByteLevel",
                "add_prefix_space": false,
                "trim_offsets": self.pre.trim_offsets,
                "use_regex": use_regex,
            })
        };
        let steps: Vec<Value> = self
            .pre
            .steps
            .iter()
            .map(|s| match *s {
                Step::Split(regex) => json!({
                    "type": "Split",
                    "pattern": {"Regex": regex},
                    "behavior": "Isolated",
                    "invert": false,
                }),
                Step::ByteLevel { use_regex } => byte_level(use_regex),
                Step::Digits { individual } => {
                    json!({"type": "Digits", "individual_digits": individual})
                }
                Step::Punctuation => json!({"type": "Punctuation", "behavior": "Contiguous"}),
            })
            .collect();
        let added: Vec<Value> = self
            .added()
            .map(|(id, t)| {
                json!({
                    "id": id,
                    "content": t.text,
                    "single_word": false,
                    "lstrip": false,
                    "rstrip": false,
                    "normalized": false,
                    "special": t.kind == TokenKind::Control,
                })
            })
            .collect();
        Ok(json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added,
            "normalizer": if self.nfc { json!({"type": "NFC"}) } else { Value::Null },
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": steps},
            "post_processor": byte_level(false),
            "decoder": byte_level(false),
            "model": {
                "type": "BPE",
                "dropout": null,
                "unk_token": null,
                "continuing_subword_prefix": "",
                "end_of_word_suffix": "",
                "fuse_unk": false,
                "byte_fallback": false,
                "ignore_merges": self.pre.ignore_merges,
                "vocab": vocab,
                "merges": merges,
            },
        }))
    }

    /// A minimal `tokenizer_config.json` in the shape of Qwen's: special token names from the
    /// GGUF ids (`bos_token` only when `tokenizer.ggml.add_bos_token` is true), the added
    /// tokens, and the chat template when the file has one.
    pub fn tokenizer_config(&self) -> Result<Value> {
        let eos = self.token_name("tokenizer.ggml.eos_token_id", self.eos)?;
        let pad = self.token_name("tokenizer.ggml.padding_token_id", self.pad)?;
        let bos = match self.add_bos {
            true => self.token_name("tokenizer.ggml.bos_token_id", self.bos)?,
            false => None,
        };
        let named = [eos, pad, bos];
        let mut decoder = Map::new();
        let mut additional = Vec::new();
        for (id, t) in self.added() {
            let special = t.kind == TokenKind::Control;
            decoder.insert(
                id.to_string(),
                json!({
                    "content": t.text,
                    "lstrip": false,
                    "normalized": false,
                    "rstrip": false,
                    "single_word": false,
                    "special": special,
                }),
            );
            if special && !named.contains(&Some(t.text.as_str())) {
                additional.push(t.text.as_str());
            }
        }
        let mut cfg = Map::new();
        cfg.insert("add_bos_token".into(), json!(self.add_bos));
        cfg.insert("add_prefix_space".into(), json!(false));
        cfg.insert("added_tokens_decoder".into(), Value::Object(decoder));
        cfg.insert("additional_special_tokens".into(), json!(additional));
        cfg.insert("bos_token".into(), json!(bos));
        if let Some(t) = &self.chat_template {
            cfg.insert("chat_template".into(), json!(t));
        }
        cfg.insert("clean_up_tokenization_spaces".into(), json!(false));
        cfg.insert("eos_token".into(), json!(eos));
        cfg.insert("errors".into(), json!("replace"));
        if let Some(n) = self.context_length {
            cfg.insert("model_max_length".into(), json!(n));
        }
        cfg.insert("pad_token".into(), json!(pad));
        cfg.insert("split_special_tokens".into(), json!(false));
        cfg.insert("tokenizer_class".into(), json!(TOKENIZER_CLASS));
        cfg.insert("unk_token".into(), Value::Null);
        Ok(Value::Object(cfg))
    }

    /// Loads `tokenizer_json` (from [`GgufVocab::tokenizer_json`]) with the `tokenizers` crate
    /// and checks that every token has its GGUF id.
    pub fn load(&self, tokenizer_json: &Value) -> Result<tokenizers::Tokenizer> {
        let tok = tokenizers::Tokenizer::from_str(&tokenizer_json.to_string()).map_err(|e| {
            anyhow!(
                "{}: the tokenizer.json built does not load: {e}",
                self.path.display()
            )
        })?;
        for (id, t) in self.kept() {
            let got = tok.token_to_id(&t.text);
            if got != Some(id) {
                bail!(
                    "{}: token `{}` should be id {id} but the built tokenizer gives {got:?}",
                    self.path.display(),
                    t.text
                );
            }
        }
        Ok(tok)
    }

    /// The tokens Hugging Face's tokenizer has (all but placeholders), with their ids.
    fn kept(&self) -> impl Iterator<Item = (u32, &Token)> {
        // Ids fit in u32: `read_tokens` refuses longer vocabularies.
        (0u32..)
            .zip(&self.tokens)
            .filter(|(_, t)| t.kind != TokenKind::Placeholder)
    }

    /// The added tokens (control and user-defined), with their ids.
    fn added(&self) -> impl Iterator<Item = (u32, &Token)> {
        self.kept()
            .filter(|(_, t)| matches!(t.kind, TokenKind::Control | TokenKind::UserDefined))
    }

    /// The text of the token `id` named by metadata `key`, if the key is set.
    fn token_name(&self, key: &str, id: Option<u32>) -> Result<Option<&str>> {
        let Some(id) = id else {
            return Ok(None);
        };
        match self.tokens.get(id as usize) {
            Some(t) if t.kind != TokenKind::Placeholder => Ok(Some(&t.text)),
            Some(t) => bail!(
                "{}: metadata `{key}` = {id} names the placeholder `{}`",
                self.path.display(),
                t.text
            ),
            None => bail!(
                "{}: metadata `{key}` = {id} is past the last token ({})",
                self.path.display(),
                self.tokens.len()
            ),
        }
    }

    /// The ids of the tokens by text; two tokens with one text are an error (a
    /// `tokenizer.json` vocabulary maps each text to one id).
    fn index(&self) -> Result<HashMap<&str, u32>> {
        let mut ids = HashMap::new();
        for (id, t) in self.kept() {
            if let Some(prev) = ids.insert(t.text.as_str(), id) {
                bail!(
                    "{}: token `{}` is both id {prev} and id {id}",
                    self.path.display(),
                    t.text
                );
            }
        }
        Ok(ids)
    }

    /// Every merge joins two tokens into a third, all in the vocabulary (what `tokenizers`
    /// requires, said here with the file and the merge's rank).
    fn check_merges(&self, ids: &HashMap<&str, u32>) -> Result<()> {
        for (rank, (a, b)) in self.merges.iter().enumerate() {
            let joined = format!("{a}{b}");
            for part in [a.as_str(), b.as_str(), joined.as_str()] {
                if !ids.contains_key(part) {
                    bail!(
                        "{}: `tokenizer.ggml.merges` item {rank} (`{a} {b}`): `{part}` is not a \
                         token of the vocabulary",
                        self.path.display()
                    );
                }
            }
        }
        Ok(())
    }
}

/// `tokenizer.ggml.tokens` with their kinds from `tokenizer.ggml.token_type`.
fn read_tokens(meta: &Meta<'_>) -> Result<Vec<Token>> {
    let texts = meta.strings("tokenizer.ggml.tokens")?;
    let types = meta.integers("tokenizer.ggml.token_type")?;
    if types.len() != texts.len() {
        bail!(
            "{}: metadata `tokenizer.ggml.token_type` has {} items but `tokenizer.ggml.tokens` \
             has {}",
            meta.path.display(),
            types.len(),
            texts.len()
        );
    }
    if u32::try_from(texts.len()).is_err() {
        bail!(
            "{}: {} tokens are too many",
            meta.path.display(),
            texts.len()
        );
    }
    texts
        .iter()
        .zip(&types)
        .enumerate()
        .map(|(id, (text, &ty))| {
            let kind = token_kind(meta.path, id, text, ty)?;
            Ok(Token {
                text: text.to_string(),
                kind,
            })
        })
        .collect()
}

/// A token's kind from its llama.cpp token type.
fn token_kind(path: &Path, id: usize, text: &str, ty: u64) -> Result<TokenKind> {
    Ok(match ty {
        1 => TokenKind::Normal,
        3 => TokenKind::Control,
        4 if text == format!("[PAD{id}]") => TokenKind::Placeholder,
        4 => TokenKind::UserDefined,
        _ => bail!(
            "{}: token {id} `{text}` has type {ty} (`tokenizer.ggml.token_type`); a byte-level \
             BPE vocabulary holds only normal (1), control (3) and user-defined (4) tokens",
            path.display()
        ),
    })
}

/// `tokenizer.ggml.merges`: `"a b"` strings, split at the first space after the first
/// character, as llama.cpp does.
fn read_merges(meta: &Meta<'_>) -> Result<Vec<(String, String)>> {
    let key = "tokenizer.ggml.merges";
    meta.strings(key)?
        .iter()
        .enumerate()
        .map(|(rank, m)| {
            let at = m
                .char_indices()
                .skip(1)
                .find(|&(_, c)| c == ' ')
                .map(|(i, _)| i);
            match at {
                Some(i) if i + 1 < m.len() => Ok((m[..i].to_string(), m[i + 1..].to_string())),
                _ => Err(meta.err(key, format!("item {rank} `{m}` is not two tokens"))),
            }
        })
        .collect()
}

/// Puts [`QWEN3_ADDED_TOKENS`] in place of the placeholders at their ids.
fn name_qwen3_tokens(path: &Path, tokens: &mut [Token]) -> Result<()> {
    for &(id, name, special) in QWEN3_ADDED_TOKENS {
        let Some(t) = tokens.get_mut(id as usize) else {
            bail!(
                "{}: no id {id} for `{name}` (the vocabulary has {} tokens); Qwen3's token \
                 names fit only a Qwen vocabulary",
                path.display(),
                tokens.len()
            );
        };
        if t.kind != TokenKind::Placeholder {
            bail!(
                "{}: id {id} is `{}`, not a placeholder, so `{name}` cannot go there; Qwen3's \
                 token names fit only a Qwen vocabulary",
                path.display(),
                t.text
            );
        }
        *t = Token {
            text: name.to_string(),
            kind: if special {
                TokenKind::Control
            } else {
                TokenKind::UserDefined
            },
        };
    }
    Ok(())
}

#[cfg(test)]
mod tests;
