//! Tokenizer (`tokenizer.json`) and chat template (`tokenizer_config.json` `chat_template` or
//! `chat_template.jinja`, rendered with minijinja).

use std::path::Path;

use serde::Serialize;

use crate::error::{Error, Result};

/// One chat message for the template.
#[derive(Debug, Clone, Serialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The text.
    pub content: String,
}

impl ChatMessage {
    /// A message with `role` and `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A checkpoint's tokenizer and chat template.
pub struct TextTokenizer {
    tok: tokenizers::Tokenizer,
    template: Option<String>,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTokenizer")
            .field("vocab", &self.tok.get_vocab_size(true))
            .field("chat_template", &self.template.is_some())
            .finish()
    }
}

fn token_string(v: Option<&serde_json::Value>) -> Option<String> {
    match v? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o
            .get("content")
            .and_then(|c| c.as_str())
            .map(str::to_string),
        _ => None,
    }
}

impl TextTokenizer {
    /// Reads `dir/tokenizer.json` (required) and the chat template, if any.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("tokenizer.json");
        let tok = tokenizers::Tokenizer::from_file(&path)
            .map_err(|e| Error::Tokenizer(format!("{}: {e}", path.display())))?;
        let mut template = None;
        let mut bos_token = None;
        let mut eos_token = None;
        let cfg_path = dir.join("tokenizer_config.json");
        if let Ok(text) = std::fs::read_to_string(&cfg_path) {
            let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| Error::Config {
                path: cfg_path.clone(),
                message: e.to_string(),
            })?;
            template = match v.get("chat_template") {
                Some(serde_json::Value::String(s)) => Some(s.clone()),
                // A list of named templates: take "default".
                Some(serde_json::Value::Array(a)) => a
                    .iter()
                    .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                    .or(a.first())
                    .and_then(|t| t.get("template"))
                    .and_then(|t| t.as_str())
                    .map(str::to_string),
                _ => None,
            };
            bos_token = token_string(v.get("bos_token"));
            eos_token = token_string(v.get("eos_token"));
        }
        if template.is_none() {
            template = std::fs::read_to_string(dir.join("chat_template.jinja")).ok();
        }
        Ok(TextTokenizer {
            tok,
            template,
            bos_token,
            eos_token,
        })
    }

    /// Token ids of `text` (no special tokens added).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .tok
            .encode(text, false)
            .map_err(|e| Error::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Text of `ids`, skipping special tokens.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.tok
            .decode(ids, true)
            .map_err(|e| Error::Tokenizer(e.to_string()))
    }

    /// The id of a token string, if it is in the vocabulary.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.tok.token_to_id(token)
    }

    /// The configured end-of-sequence token string.
    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    /// True when the checkpoint ships a chat template.
    pub fn has_chat_template(&self) -> bool {
        self.template.is_some()
    }

    /// Renders the chat template with `add_generation_prompt = true`; `thinking` becomes the
    /// template's `enable_thinking` variable when given. Without a template the user contents
    /// are joined by newlines.
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        thinking: Option<bool>,
    ) -> Result<String> {
        let Some(src) = &self.template else {
            return Ok(messages
                .iter()
                .map(|m| m.content.as_str())
                .collect::<Vec<_>>()
                .join("\n"));
        };
        let mut env = minijinja::Environment::new();
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<String, minijinja::Error> {
                Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    msg,
                ))
            },
        );
        env.add_template("chat", src)
            .map_err(|e| Error::Template(e.to_string()))?;
        let tmpl = env
            .get_template("chat")
            .map_err(|e| Error::Template(e.to_string()))?;
        let mut ctx = std::collections::BTreeMap::<&str, minijinja::Value>::new();
        ctx.insert("messages", minijinja::Value::from_serialize(messages));
        ctx.insert("add_generation_prompt", true.into());
        ctx.insert(
            "bos_token",
            self.bos_token.clone().unwrap_or_default().into(),
        );
        ctx.insert(
            "eos_token",
            self.eos_token.clone().unwrap_or_default().into(),
        );
        if let Some(t) = thinking {
            ctx.insert("enable_thinking", t.into());
        }
        tmpl.render(ctx).map_err(|e| Error::Template(e.to_string()))
    }
}
