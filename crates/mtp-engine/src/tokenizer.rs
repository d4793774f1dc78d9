//! A checkpoint's tokenizer (`tokenizer.json`, through Hugging Face `tokenizers`) and chat
//! templates (found and rendered by `mtp-chat`, exactly as transformers renders them).

use std::path::Path;
use std::sync::Arc;

use mtp_chat::{ChatError, ChatTemplates, CheckpointError, Prompt};
use mtp_contract::GenerateRequest;

use crate::error::{Error, Result};

/// A checkpoint's tokenizer and chat templates.
pub struct TextTokenizer {
    tok: tokenizers::Tokenizer,
    /// The templates, or why they could not be read: a template that does not compile fails
    /// chat requests with its error, while raw prompts still work.
    templates: std::result::Result<ChatTemplates, Arc<CheckpointError>>,
    eos_token: Option<String>,
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTokenizer")
            .field("vocab", &self.tok.get_vocab_size(true))
            .field("chat_template", &self.has_chat_template())
            .finish()
    }
}

impl TextTokenizer {
    /// Reads `dir/tokenizer.json` (required) and the chat templates, if any.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("tokenizer.json");
        let tok = tokenizers::Tokenizer::from_file(&path)
            .map_err(|e| Error::Tokenizer(format!("{}: {e}", path.display())))?;
        let templates = ChatTemplates::from_dir(dir).map_err(|e| {
            tracing::warn!(dir = %dir.display(), "chat template unusable: {e}");
            Arc::new(e)
        });
        let eos_token = templates
            .as_ref()
            .ok()
            .and_then(|t| t.special_tokens().get("eos_token"))
            .and_then(|v| v.as_str())
            .map(str::to_string);
        Ok(TextTokenizer {
            tok,
            templates,
            eos_token,
        })
    }

    /// Token ids of `text` (no special tokens added; special tokens written in the text, such
    /// as a chat template's `<|im_start|>`, are recognised).
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

    /// An incremental decoder: text for each new token, without decoding the whole reply again.
    pub fn decoder(&self) -> TokenDecoder<'_> {
        TokenDecoder {
            tok: &self.tok,
            ids: Vec::new(),
            prefix: String::new(),
            prefix_index: 0,
        }
    }

    /// The Hugging Face tokenizer underneath.
    pub fn hf(&self) -> &tokenizers::Tokenizer {
        &self.tok
    }

    /// The id of a token string, if it is in the vocabulary.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.tok.token_to_id(token)
    }

    /// The number of token ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.tok.get_vocab_size(true)
    }

    /// The configured end-of-sequence token string.
    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    /// True when the checkpoint ships a usable chat template.
    pub fn has_chat_template(&self) -> bool {
        self.templates.as_ref().is_ok_and(|t| !t.is_empty())
    }

    /// The chat templates, or why the checkpoint's could not be read.
    pub fn templates(&self) -> std::result::Result<&ChatTemplates, &CheckpointError> {
        self.templates.as_ref().map_err(|e| e.as_ref())
    }

    /// Renders `request` into prompt text with the checkpoint's chat template (verbatim for a
    /// raw request).
    pub fn render(&self, request: &GenerateRequest) -> std::result::Result<Prompt, ChatError> {
        if request.raw_prompt {
            return Ok(Prompt {
                text: request.prompt.clone(),
                reasoning: None,
            });
        }
        match &self.templates {
            Ok(t) => t.render_request(request),
            Err(e) => match e.as_ref() {
                CheckpointError::Template(t) => Err(ChatError::Template(t.clone())),
                other => Err(ChatError::Template(mtp_chat::TemplateError::Syntax {
                    name: "chat template".into(),
                    line: None,
                    construct: None,
                    message: other.to_string(),
                })),
            },
        }
    }
}

/// Decodes a reply token by token (Hugging Face `tokenizers`' stream decoding): each step
/// decodes only the few tokens since the last complete piece, so a long reply costs time in its
/// length, and characters split across tokens (multi-byte UTF-8 in byte-level vocabularies) come
/// out whole.
pub struct TokenDecoder<'a> {
    tok: &'a tokenizers::Tokenizer,
    ids: Vec<u32>,
    prefix: String,
    prefix_index: usize,
}

impl TokenDecoder<'_> {
    /// Adds one token; returns the new text, if a complete piece is ready.
    pub fn step(&mut self, id: u32) -> Result<Option<String>> {
        let r = tokenizers::tokenizer::step_decode_stream(
            self.tok,
            vec![id],
            true,
            &mut self.ids,
            &mut self.prefix,
            &mut self.prefix_index,
        );
        match r {
            Ok(s) => Ok(s),
            Err(e) if e.is::<tokenizers::tokenizer::DecodeStreamError>() => {
                // A decoder whose output for the window does not extend its output for the
                // prefix (rare normalizing decoders): resynchronise on the window's text.
                tracing::debug!("stream decoding resynchronised: {e}");
                self.prefix = self.decode_window()?;
                self.prefix_index = self.ids.len();
                Ok(None)
            }
            Err(e) => Err(Error::Tokenizer(e.to_string())),
        }
    }

    fn decode_window(&self) -> Result<String> {
        self.tok
            .decode(&self.ids, true)
            .map_err(|e| Error::Tokenizer(e.to_string()))
    }

    /// Ends the reply: text still held back (an incomplete character at the very end comes out
    /// as U+FFFD, as a whole-reply decode would give it).
    pub fn finish(&mut self) -> Result<String> {
        let s = self.decode_window()?;
        let out = s
            .strip_prefix(self.prefix.as_str())
            .map(str::to_string)
            .unwrap_or_default();
        self.ids.clear();
        self.prefix.clear();
        self.prefix_index = 0;
        Ok(out)
    }
}
