//! A checkpoint's chat templates and special tokens, found where transformers finds them.
//!
//! Precedence, as `PreTrainedTokenizerBase.from_pretrained` (transformers 5) resolves it:
//! 1. `chat_template.jinja`, plus any `additional_chat_templates/NAME.jinja` (named templates);
//! 2. `tokenizer_config.json` `chat_template`: a string, or a list of `{name, template}`;
//! 3. `chat_template.json` `chat_template` (what older multimodal processors saved).
//!
//! With several named templates, [`ChatTemplates::select`] picks `tool_use` when tools are
//! given and that template exists, else `default`, as `get_chat_template` does.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::template::{ChatTemplate, TemplateError};

/// The special-token attributes transformers passes to every chat template (its
/// `SPECIAL_TOKENS_ATTRIBUTES`), when the tokenizer sets them.
pub const SPECIAL_TOKEN_KEYS: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

/// Files bigger than this are refused (a tokenizer_config.json with an inline template is a few
/// hundred KB at most).
const MAX_FILE_BYTES: u64 = 16 << 20;

/// Reading a checkpoint's chat template failed.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// A file could not be read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file is not what it should be.
    #[error("{}: {message}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A template does not compile.
    #[error(transparent)]
    Template(#[from] TemplateError),
}

/// A checkpoint's chat templates (by name; a single template is `default`) and the special
/// tokens its templates see.
#[derive(Debug, Default)]
pub struct ChatTemplates {
    templates: BTreeMap<String, ChatTemplate>,
    special_tokens: serde_json::Map<String, serde_json::Value>,
}

fn read_small(path: &Path) -> Result<Option<String>, CheckpointError> {
    let io = |source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    };
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(e)),
    };
    if !meta.is_file() {
        return Ok(None);
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(CheckpointError::Invalid {
            path: path.to_path_buf(),
            message: format!(
                "{} bytes is more than a chat template file may hold ({MAX_FILE_BYTES})",
                meta.len()
            ),
        });
    }
    std::fs::read_to_string(path).map(Some).map_err(io)
}

fn read_json(path: &Path) -> Result<Option<serde_json::Value>, CheckpointError> {
    let Some(text) = read_small(path)? else {
        return Ok(None);
    };
    parse_json(text.as_bytes(), path).map(Some)
}

fn parse_json(bytes: &[u8], path: &Path) -> Result<serde_json::Value, CheckpointError> {
    serde_json::from_slice(bytes).map_err(|e| CheckpointError::Invalid {
        path: path.to_path_buf(),
        message: format!("not valid JSON: {e}"),
    })
}

/// The special tokens a `tokenizer_config.json` sets ([`SPECIAL_TOKEN_KEYS`]).
fn special_tokens_of(config: &serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
    let mut special_tokens = serde_json::Map::new();
    for key in SPECIAL_TOKEN_KEYS {
        if let Some(s) = config.get(key).and_then(token_string) {
            special_tokens.insert(key.into(), s.into());
        }
    }
    special_tokens
}

/// Compiles `(name, origin, source)` templates.
fn compile(
    sources: Vec<(String, String, String)>,
) -> Result<BTreeMap<String, ChatTemplate>, CheckpointError> {
    let mut templates = BTreeMap::new();
    for (name, origin, src) in sources {
        templates.insert(name, ChatTemplate::new(src, origin)?);
    }
    Ok(templates)
}

/// A special token as tokenizer_config.json spells it: a string, or an `AddedToken` object
/// with `content`.
pub fn token_string(v: &serde_json::Value) -> Option<String> {
    match v {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

impl ChatTemplates {
    /// Reads the templates and special tokens of the checkpoint in `dir`. A checkpoint without
    /// any template gives an empty set (raw prompts still work); a template that does not
    /// compile is an error naming the file.
    pub fn from_dir(dir: &Path) -> Result<Self, CheckpointError> {
        let mut sources: Vec<(String, String, String)> = Vec::new(); // (name, origin, source)
        let jinja = dir.join("chat_template.jinja");
        if let Some(src) = read_small(&jinja)? {
            sources.push(("default".into(), jinja.display().to_string(), src));
        }
        let extra_dir = dir.join("additional_chat_templates");
        if extra_dir.is_dir() {
            let rd = std::fs::read_dir(&extra_dir).map_err(|source| CheckpointError::Io {
                path: extra_dir.clone(),
                source,
            })?;
            let mut extra: Vec<PathBuf> = rd
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "jinja"))
                .collect();
            extra.sort();
            for p in extra {
                let name = p
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default();
                if let Some(src) = read_small(&p)? {
                    sources.push((name, p.display().to_string(), src));
                }
            }
        }
        let config_path = dir.join("tokenizer_config.json");
        let config = read_json(&config_path)?;
        if sources.is_empty() {
            if let Some(t) = config.as_ref().and_then(|c| c.get("chat_template")) {
                let origin = format!("{} chat_template", config_path.display());
                sources = Self::config_templates(t, &origin, &config_path)?;
            }
        }
        if sources.is_empty() {
            let legacy = dir.join("chat_template.json");
            if let Some(v) = read_json(&legacy)? {
                if let Some(t) = v.get("chat_template") {
                    let origin = format!("{} chat_template", legacy.display());
                    sources = Self::config_templates(t, &origin, &legacy)?;
                }
            }
        }
        let special_tokens = config.as_ref().map(special_tokens_of).unwrap_or_default();
        Ok(ChatTemplates {
            templates: compile(sources)?,
            special_tokens,
        })
    }

    /// What [`ChatTemplates::from_dir`] reads from a checkpoint whose only template source is
    /// its `tokenizer_config.json`, from that file's bytes (`path` names it in errors): the
    /// `chat_template` (a string or a list of `{name, template}`), compiled, and the special
    /// tokens.
    ///
    /// ```
    /// use mtp_chat::ChatTemplates;
    /// let cfg = br#"{"chat_template": "{{ bos_token }}", "bos_token": {"content": "<s>"}}"#;
    /// let t = ChatTemplates::from_tokenizer_config(cfg, "tokenizer_config.json".as_ref())?;
    /// assert_eq!(t.names().collect::<Vec<_>>(), ["default"]);
    /// assert_eq!(t.special_tokens()["bos_token"], "<s>");
    /// # Ok::<(), mtp_chat::CheckpointError>(())
    /// ```
    pub fn from_tokenizer_config(bytes: &[u8], path: &Path) -> Result<Self, CheckpointError> {
        let config = parse_json(bytes, path)?;
        let sources = match config.get("chat_template") {
            Some(t) => {
                let origin = format!("{} chat_template", path.display());
                Self::config_templates(t, &origin, path)?
            }
            None => Vec::new(),
        };
        Ok(ChatTemplates {
            templates: compile(sources)?,
            special_tokens: special_tokens_of(&config),
        })
    }

    fn config_templates(
        v: &serde_json::Value,
        origin: &str,
        path: &Path,
    ) -> Result<Vec<(String, String, String)>, CheckpointError> {
        match v {
            serde_json::Value::Null => Ok(Vec::new()),
            serde_json::Value::String(s) => {
                Ok(vec![("default".into(), origin.to_string(), s.clone())])
            }
            serde_json::Value::Array(list) => list
                .iter()
                .map(|t| {
                    let name = t.get("name").and_then(|n| n.as_str());
                    let src = t.get("template").and_then(|n| n.as_str());
                    match (name, src) {
                        (Some(n), Some(s)) => {
                            Ok((n.to_string(), format!("{origin} `{n}`"), s.to_string()))
                        }
                        _ => Err(CheckpointError::Invalid {
                            path: path.to_path_buf(),
                            message:
                                "chat_template list entries need `name` and `template` strings"
                                    .into(),
                        }),
                    }
                })
                .collect(),
            _ => Err(CheckpointError::Invalid {
                path: path.to_path_buf(),
                message: "chat_template must be a string or a list of {name, template}".into(),
            }),
        }
    }

    /// A set of one template (e.g. a GGUF's `tokenizer.chat_template`) and the special tokens
    /// its templates see.
    pub fn single(
        template: ChatTemplate,
        special_tokens: serde_json::Map<String, serde_json::Value>,
    ) -> Self {
        let mut templates = BTreeMap::new();
        templates.insert("default".to_string(), template);
        ChatTemplates {
            templates,
            special_tokens,
        }
    }

    /// True when there is no template.
    pub fn is_empty(&self) -> bool {
        self.templates.is_empty()
    }

    /// Template names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.templates.keys().map(String::as_str)
    }

    /// The special tokens (`bos_token`, `eos_token`, …) that are set.
    pub fn special_tokens(&self) -> &serde_json::Map<String, serde_json::Value> {
        &self.special_tokens
    }

    /// The template for a conversation: the only one; `tool_use` when `with_tools` and it
    /// exists; else `default`. `None` when there is none to use.
    pub fn select(&self, with_tools: bool) -> Option<&ChatTemplate> {
        if self.templates.len() == 1 {
            return self.templates.values().next();
        }
        if with_tools {
            if let Some(t) = self.templates.get("tool_use") {
                return Some(t);
            }
        }
        self.templates.get("default")
    }
}
