//! The tokenizer's GGUF metadata (`tokenizer.ggml.*`, the chat template), as llama.cpp's
//! converter writes it for a Qwen3.5 checkpoint: the token list with each token's type, the
//! BPE merges, the pre-tokenizer name, the special ids.

use super::*;

const TOKEN_NORMAL: i32 = 1;
const TOKEN_CONTROL: i32 = 3;
const TOKEN_USER_DEFINED: i32 = 4;
const TOKEN_UNUSED: i32 = 5;

fn looks_special(t: &str) -> bool {
    (t.starts_with("<|") && t.ends_with("|>"))
        || (t.starts_with("<\u{ff5c}") && t.ends_with("\u{ff5c}>"))
        || (t.starts_with("<unused") && t.ends_with('>'))
        || matches!(t, "<pad>" | "<mask>" | "<2mass>" | "[@BOS@]")
}

fn token_text(v: &Value) -> Option<&str> {
    match v {
        Value::String(s) => Some(s),
        Value::Object(o) => o.get("content").and_then(Value::as_str),
        _ => None,
    }
}

/// Picks `tokenizer.ggml.pre` from the HF pre-tokenizer: a bare byte-level pre-tokenizer with
/// the GPT-2 regex is `gpt-2`; anything else (Qwen's `Split` + byte-level) is `qwen35`.
fn choose_pre(tok: &Value) -> &'static str {
    let pre = &tok["pre_tokenizer"];
    if pre["type"] == "ByteLevel" && pre["use_regex"] != false {
        "gpt-2"
    } else {
        "qwen35"
    }
}

pub(super) fn tokenizer_kvs(
    dir: &Path,
    hp: &Hparams,
    opts: &ConvertOptions,
) -> Result<(Vec<(String, Kv)>, usize), ConvertError> {
    let tok = read_json(&dir.join("tokenizer.json"))?;
    if tok["model"]["type"] != "BPE" {
        return Err(unsupported(
            "tokenizer.json: only BPE (byte-level) tokenizers are converted",
        ));
    }
    let vocab = tok["model"]["vocab"]
        .as_object()
        .ok_or_else(|| unsupported("tokenizer.json: model.vocab missing"))?;
    let mut by_id: HashMap<usize, String> = HashMap::new();
    for (text, id) in vocab {
        if let Some(id) = id.as_u64().and_then(|i| usize::try_from(i).ok()) {
            by_id.insert(id, text.clone());
        }
    }
    let mut added: HashMap<usize, (String, bool)> = HashMap::new();
    for a in tok["added_tokens"].as_array().into_iter().flatten() {
        let (Some(id), Some(content)) = (a["id"].as_u64(), a["content"].as_str()) else {
            continue;
        };
        let id = id as usize;
        added.insert(
            id,
            (content.to_string(), a["special"].as_bool().unwrap_or(false)),
        );
        by_id.insert(id, content.to_string());
    }
    let max_id = by_id.keys().copied().max().unwrap_or(0);
    let vocab_size = hp.opt_usize("vocab_size").unwrap_or(max_id + 1);
    if max_id >= vocab_size {
        return Err(unsupported(format!(
            "tokenizer has id {max_id} but vocab_size is {vocab_size}"
        )));
    }
    let mut tokens = Vec::with_capacity(vocab_size);
    let mut types = Vec::with_capacity(vocab_size);
    for i in 0..vocab_size {
        match (by_id.get(&i), added.get(&i)) {
            (None, _) => {
                tokens.push(format!("[PAD{i}]"));
                types.push(TOKEN_UNUSED);
            }
            (Some(t), Some((_, special))) => {
                tokens.push(t.clone());
                types.push(if *special || looks_special(t) {
                    TOKEN_CONTROL
                } else {
                    TOKEN_USER_DEFINED
                });
            }
            (Some(t), None) => {
                tokens.push(t.clone());
                types.push(TOKEN_NORMAL);
            }
        }
    }
    let merges: Vec<String> = tok["model"]["merges"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| match m {
            Value::String(s) => Some(s.clone()),
            Value::Array(pair) if pair.len() == 2 => {
                Some(format!("{} {}", pair[0].as_str()?, pair[1].as_str()?))
            }
            _ => None,
        })
        .collect();

    let pre = opts
        .pre
        .clone()
        .unwrap_or_else(|| choose_pre(&tok).to_string());
    let mut kvs = vec![
        ("tokenizer.ggml.model".to_string(), Kv::Str("gpt2".into())),
        ("tokenizer.ggml.pre".to_string(), Kv::Str(pre)),
        (
            "tokenizer.ggml.tokens".to_string(),
            Kv::ArrStr(tokens.clone()),
        ),
        ("tokenizer.ggml.token_type".to_string(), Kv::ArrI32(types)),
        // llama.cpp refuses a gpt2 vocabulary without the merges key, even an empty one.
        ("tokenizer.ggml.merges".to_string(), Kv::ArrStr(merges)),
    ];

    // gguf-py SpecialVocab: `<typ>_token` from tokenizer_config.json, else `<typ>_token_id`
    // from config.json; `add_<typ>_token` flags; the chat template.
    let tcfg_path = dir.join("tokenizer_config.json");
    let tcfg = if tcfg_path.is_file() {
        read_json(&tcfg_path)?
    } else {
        Value::Null
    };
    let cfg = read_json(&dir.join("config.json"))?;
    let id_of = |text: &str| tokens.iter().position(|t| t == text);
    for typ in ["bos", "eos", "unk", "sep", "pad", "cls", "mask"] {
        let from_tok = token_text(&tcfg[format!("{typ}_token")]).and_then(id_of);
        let from_cfg = cfg[format!("{typ}_token_id")]
            .as_u64()
            .and_then(|i| usize::try_from(i).ok())
            .filter(|&i| i < vocab_size);
        let key = match typ {
            "unk" => "tokenizer.ggml.unknown_token_id".to_string(),
            "sep" => "tokenizer.ggml.seperator_token_id".to_string(),
            "pad" => "tokenizer.ggml.padding_token_id".to_string(),
            other => format!("tokenizer.ggml.{other}_token_id"),
        };
        if let Some(id) = from_tok.or(from_cfg) {
            kvs.push((key, Kv::U32(u32_of(id, typ)?)));
        }
    }
    for typ in ["bos", "eos"] {
        if let Some(b) = tcfg[format!("add_{typ}_token")].as_bool() {
            kvs.push((format!("tokenizer.ggml.add_{typ}_token"), Kv::Bool(b)));
        }
    }
    let template = match tcfg["chat_template"].as_str() {
        Some(t) => Some(t.to_string()),
        None => {
            let p = dir.join("chat_template.jinja");
            if p.is_file() {
                Some(
                    fs::read_to_string(&p)
                        .map_err(|source| ConvertError::Io { path: p, source })?,
                )
            } else {
                None
            }
        }
    };
    if let Some(t) = template {
        kvs.push(("tokenizer.chat_template".to_string(), Kv::Str(t)));
    }
    Ok((kvs, vocab_size))
}
