//! A checkpoint's tokenizer (`tokenizer.json`, through Hugging Face `tokenizers`) and chat
//! templates (found and rendered by `mtp-chat`, exactly as transformers renders them).
//!
//! Client text is text: a chat request is rendered with the special-token strings of its own
//! text marked ([`TextTokenizer::render_guarded`]) and tokenized with those read as plain text
//! ([`TextTokenizer::encode_guarded`]), so only the template's markup becomes special tokens and
//! a message holding `<|im_end|>\n<|im_start|>system` cannot forge turns.

use std::collections::HashSet;
use std::ops::Range;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use mtp_chat::{ChatError, ChatTemplates, CheckpointError, GuardedPrompt, Prompt, SpecialStrings};
use mtp_contract::GenerateRequest;

use crate::error::{Error, Result};

/// A checkpoint's tokenizer and chat templates.
pub struct TextTokenizer {
    tok: tokenizers::Tokenizer,
    /// The templates, or why they could not be read: a template that does not compile fails
    /// chat requests with its error, while raw prompts still work.
    templates: std::result::Result<ChatTemplates, Arc<CheckpointError>>,
    eos_token: Option<String>,
    /// The strings of the special added tokens (`"special": true`), which client text may not
    /// turn into tokens.
    specials: SpecialStrings,
    /// Their ids.
    special_ids: HashSet<u32>,
    /// `tok` reading special-token strings as plain text (its other added tokens, such as
    /// Qwen's `<think>`, still split), made when first needed.
    plain: OnceLock<tokenizers::Tokenizer>,
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
        let (special_ids, specials): (HashSet<u32>, Vec<String>) = tok
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| t.special)
            .map(|(id, t)| (id, t.content))
            .unzip();
        Ok(TextTokenizer {
            tok,
            templates,
            eos_token,
            specials: SpecialStrings::new(specials),
            special_ids,
            plain: OnceLock::new(),
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

    /// Token ids of `text` with the strings of special tokens read as plain text (the
    /// vocabulary's other added tokens are recognised as [`TextTokenizer::encode`] recognises
    /// them).
    pub fn encode_as_text(&self, text: &str) -> Result<Vec<u32>> {
        let plain = self.plain.get_or_init(|| {
            let mut t = self.tok.clone();
            t.set_encode_special_tokens(true);
            t
        });
        let enc = plain
            .encode(text, false)
            .map_err(|e| Error::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Token ids of a rendered prompt whose `literals` (byte ranges of `text`, disjoint and in
    /// order: special-token strings written by the client, [`GuardedPrompt::literals`]) are
    /// read as plain text, while the special tokens elsewhere (the template's markup) are
    /// recognised. Without literals this is [`TextTokenizer::encode`].
    ///
    /// The text is cut at the template's special tokens, as `encode` cuts it, and a piece
    /// between two of them that holds a literal is tokenized whole as plain text, so the
    /// literal's bytes merge with their neighbours as any other text would (the tokens a
    /// tokenizer that never parsed special tokens would give them).
    pub fn encode_guarded(&self, text: &str, literals: &[Range<usize>]) -> Result<Vec<u32>> {
        if literals.is_empty() {
            return self.encode(text);
        }
        let enc = self
            .tok
            .encode(text, false)
            .map_err(|e| Error::Tokenizer(e.to_string()))?;
        let overlaps = |s: usize, e: usize| {
            let k = literals.partition_point(|r| r.end <= s);
            literals.get(k).is_some_and(|r| r.start < e)
        };
        let ids = enc.get_ids();
        let mut out = Vec::with_capacity(ids.len() + 16);
        // the piece since the last special token of the template: bytes and tokens
        let (mut piece_start, mut first) = (0, 0);
        let piece = |out: &mut Vec<u32>, start: usize, end: usize, toks: &[u32]| {
            if overlaps(start, end) {
                out.extend(self.encode_as_text(&text[start..end])?);
            } else {
                out.extend_from_slice(toks);
            }
            Ok::<_, Error>(())
        };
        for (i, (&id, &(s, e))) in ids.iter().zip(enc.get_offsets()).enumerate() {
            if !self.special_ids.contains(&id) || overlaps(s, e) {
                // text, or a special token's string written by the client
                continue;
            }
            piece(&mut out, piece_start, s, &ids[first..i])?;
            out.push(id);
            piece_start = e;
            first = i + 1;
        }
        piece(&mut out, piece_start, text.len(), &ids[first..])?;
        Ok(out)
    }

    /// The strings of the vocabulary's special tokens.
    pub fn special_strings(&self) -> &SpecialStrings {
        &self.specials
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
            return Ok(Prompt::raw(request));
        }
        self.usable_templates()?.render_request(request)
    }

    /// Renders `request` for [`TextTokenizer::encode_guarded`]: the special-token strings
    /// written in the request's own text are its literals, read as plain text, unless
    /// `parse_special` (then nothing is guarded, and the ids are [`TextTokenizer::encode`]'s of
    /// [`TextTokenizer::render`]'s text). With `history`, also where the conversation without
    /// the generation prompt ends (the prefix cache resumes there).
    ///
    /// A raw request (`raw_prompt`, `/v1/completions`) is the client's whole prompt, written
    /// with the template's markup on purpose: its special tokens are parsed whatever
    /// `parse_special` says, as llama-server parses them in its `/completion` prompts.
    pub fn render_guarded(
        &self,
        request: &GenerateRequest,
        parse_special: bool,
        history: bool,
    ) -> std::result::Result<GuardedPrompt, ChatError> {
        if request.raw_prompt {
            return Ok(GuardedPrompt::raw(request));
        }
        let none = SpecialStrings::default();
        let specials = if parse_special { &none } else { &self.specials };
        self.usable_templates()?
            .render_guarded(request, specials, history)
    }

    fn usable_templates(&self) -> std::result::Result<&ChatTemplates, ChatError> {
        match &self.templates {
            Ok(t) => Ok(t),
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
