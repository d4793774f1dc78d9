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

use serde_json::Value;

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
    /// Every token's bytes ([`TextTokenizer::token_bytes`]), made when first needed.
    bytes: OnceLock<Option<Vec<Vec<u8>>>>,
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
            bytes: OnceLock::new(),
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
        let enc = self
            .plain()
            .encode(text, false)
            .map_err(|e| Error::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// The tokenizer that reads special-token strings as plain text.
    fn plain(&self) -> &tokenizers::Tokenizer {
        self.plain.get_or_init(|| {
            let mut t = self.tok.clone();
            t.set_encode_special_tokens(true);
            t
        })
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

    /// The exact bytes of token `id` (an added token's: its text), `None` outside the
    /// vocabulary or where the vocabulary's spelling is unknown. The table is built on the
    /// first call.
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        let table = self.bytes.get_or_init(|| match token_bytes(&self.tok) {
            Ok(t) => Some(t.words),
            Err(e) => {
                tracing::warn!("token bytes unknown: {e}");
                None
            }
        });
        table.as_ref()?.get(id as usize).map(Vec::as_slice)
    }

    /// Token ids of `text` as a client's tokenizer call asks: with `add_special`, the tokens
    /// the tokenizer adds around a text (its post-processor's BOS); with `parse_special`,
    /// special-token strings written in the text are those tokens, else plain text.
    pub fn encode_with(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>> {
        let tok = if parse_special {
            &self.tok
        } else {
            self.plain()
        };
        let enc = tok
            .encode(text, add_special)
            .map_err(|e| Error::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Text of `ids`, special tokens included as their text (`/detokenize`).
    pub fn decode_all(&self, ids: &[u32]) -> Result<String> {
        self.tok
            .decode(ids, false)
            .map_err(|e| Error::Tokenizer(e.to_string()))
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

/// Every token's exact bytes, and which tokens are special.
pub(crate) struct TokenBytes {
    /// By id: the bytes the token stands for (an added token's: its text; a token that is not
    /// spelled in the vocabulary's byte alphabet: none).
    pub(crate) words: Vec<Vec<u8>>,
    /// By id: an added token marked `special`.
    pub(crate) special: Vec<bool>,
    /// By id: an added token.
    pub(crate) added: Vec<bool>,
}

/// GPT-2's byte-to-character table of byte-level BPE vocabularies, inverted.
fn byte_level_table() -> std::collections::HashMap<char, u8> {
    let mut map = std::collections::HashMap::new();
    let mut next = 256u32;
    for b in 0..=255u8 {
        let c = b as char;
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        if printable {
            map.insert(c, b);
        } else if let Some(c) = char::from_u32(next) {
            map.insert(c, b);
            next += 1;
        }
    }
    map
}

/// How a vocabulary spells bytes in its token strings.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Spelling {
    /// GPT-2 byte-level BPE (Qwen, Llama 3, ...).
    ByteLevel,
    /// SentencePiece: `▁` for a space, `<0xNN>` byte tokens.
    SentencePiece,
}

fn spelling(tok: &tokenizers::Tokenizer) -> Option<Spelling> {
    fn walk(v: &Value, found: &mut Option<Spelling>) {
        match v.get("type").and_then(Value::as_str) {
            Some("ByteLevel") => *found = Some(Spelling::ByteLevel),
            Some("ByteFallback") | Some("Metaspace") if found.is_none() => {
                *found = Some(Spelling::SentencePiece)
            }
            Some("Sequence") => {
                for d in v
                    .get("decoders")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    walk(d, found);
                }
            }
            _ => {}
        }
    }
    let v = serde_json::to_value(tok.get_decoder()?).ok()?;
    let mut found = None;
    walk(&v, &mut found);
    found
}

/// Each token's bytes from a `tokenizer.json`, as llguidance's own
/// `token_bytes_from_tokenizer_json` reads them: byte-level BPE through GPT-2's byte table,
/// SentencePiece with `▁` as a space and `<0xNN>` byte tokens, added tokens as their text.
///
/// Written here rather than taken from `toktrie_hf_tokenizers` or llguidance's
/// `token_bytes_from_tokenizer_json`: the first pins `tokenizers` 0.21 (the engine is on
/// 0.23, and two copies would not share types), and both panic on vocabularies they do not
/// expect (a `<0xZZ>` token, an unknown decoder); a checkpoint's tokenizer.json is outside
/// input, so this returns a typed error instead.
pub(crate) fn token_bytes(tok: &tokenizers::Tokenizer) -> Result<TokenBytes> {
    let spelling = spelling(tok).ok_or_else(|| {
        Error::Tokenizer(
            "the tokenizer's decoder is neither byte-level BPE nor SentencePiece, so token \
             bytes are unknown"
                .into(),
        )
    })?;
    let n = tok.get_vocab_size(true);
    let added = tok.get_added_tokens_decoder();
    let table = byte_level_table();
    let mut words: Vec<Vec<u8>> = vec![Vec::new(); n];
    let mut special = vec![false; n];
    let mut added_ids = vec![false; n];
    for (id, word) in words.iter_mut().enumerate() {
        let id32 = id as u32;
        if let Some(a) = added.get(&id32) {
            special[id] = a.special;
            added_ids[id] = true;
            *word = a.content.as_bytes().to_vec();
            continue;
        }
        let Some(s) = tok.id_to_token(id32) else {
            continue;
        };
        *word = match spelling {
            Spelling::ByteLevel => match s.chars().map(|c| table.get(&c).copied()).collect() {
                Some(b) => b,
                // not byte-level spelled: the token can never be produced as text
                None => continue,
            },
            Spelling::SentencePiece => {
                let hex = s
                    .strip_prefix("<0x")
                    .and_then(|h| h.strip_suffix('>'))
                    .filter(|h| h.len() == 2)
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(b) => vec![b],
                    None => s.replace('\u{2581}', " ").into_bytes(),
                }
            }
        };
    }
    Ok(TokenBytes {
        words,
        special,
        added: added_ids,
    })
}
