//! From a request to the prompt text: the conversation as chat templates read it, the template
//! variables, and how the reply is to be read back (reasoning tags, stop strings).

use mtp_contract::{GenerateRequest, Message, ProviderError};

use crate::checkpoint::ChatTemplates;
use crate::stream::{ReasoningParser, Split, StopScanner, ThinkTags};
use crate::template::{Clock, RenderInput, TemplateError};

/// Turning a request into a prompt failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChatError {
    /// The model has no chat template, so only raw prompts can be sent.
    #[error(
        "the model has no chat template; send the prompt verbatim (`raw_prompt`, `--raw` on the \
         command line) or use a checkpoint that ships one"
    )]
    NoTemplate,
    /// A message is malformed (e.g. tool-call arguments that are not JSON).
    #[error("message {index}: {message}")]
    InvalidMessage {
        /// Its position in the rendered conversation (system prompt first).
        index: usize,
        /// What is wrong.
        message: String,
    },
    /// The template failed or refused the conversation.
    #[error(transparent)]
    Template(#[from] TemplateError),
    /// The request's text holds the string of a special token, which is kept as plain text,
    /// and the chat template changes the text it is given (escapes it, or acts on the token in
    /// it), so the string cannot come through as text
    /// ([`ChatTemplates::render_guarded`](crate::ChatTemplates::render_guarded)).
    #[error(
        "the request's text holds `{token}`, a special token of the model's vocabulary, which is \
         read as plain text; this chat template changes the text it is given, so it cannot be \
         kept as text: leave it out, or start the provider with special tokens parsed in \
         client text (`parse_special`)"
    )]
    SpecialText {
        /// The special token's string.
        token: String,
    },
}

impl ChatError {
    /// The contract's error for this failure: a template that refuses the conversation or a
    /// malformed message is the request's fault (`InvalidRequest`); a template that cannot run
    /// is the model's (`ModelLoad`).
    pub fn into_provider_error(self, model: &str) -> ProviderError {
        match self {
            ChatError::NoTemplate => ProviderError::InvalidRequest {
                field: "raw_prompt",
                message: self.to_string(),
            },
            ChatError::InvalidMessage { .. }
            | ChatError::SpecialText { .. }
            | ChatError::Template(TemplateError::Raised { .. }) => ProviderError::InvalidRequest {
                field: "messages",
                message: self.to_string(),
            },
            ChatError::Template(e) => ProviderError::ModelLoad {
                model: model.to_string(),
                message: e.to_string(),
            },
        }
    }
}

/// One message as chat templates read it (transformers' and vLLM's conventions): `role`,
/// `content`, then `reasoning_content`, `tool_calls` (arguments as a JSON object, parsed from a
/// string when the caller sent one, as vLLM does), `tool_call_id` and `name` when set.
pub fn template_message(m: &Message, index: usize) -> Result<serde_json::Value, ChatError> {
    let mut obj = serde_json::Map::new();
    obj.insert("role".into(), m.role.as_str().into());
    if m.images.is_empty() {
        obj.insert("content".into(), m.content.clone().into());
    } else {
        // transformers' multimodal content parts, the images before the text (as mlx-vlm and
        // OpenAI clients send them); templates render each as their image placeholder
        let mut parts: Vec<serde_json::Value> = m
            .images
            .iter()
            .map(|_| serde_json::json!({"type": "image"}))
            .collect();
        if !m.content.is_empty() {
            parts.push(serde_json::json!({"type": "text", "text": m.content}));
        }
        obj.insert("content".into(), parts.into());
    }
    if let Some(r) = &m.reasoning_content {
        obj.insert("reasoning_content".into(), r.clone().into());
    }
    if !m.tool_calls.is_empty() {
        let mut calls = Vec::with_capacity(m.tool_calls.len());
        for c in &m.tool_calls {
            let arguments = match &c.function.arguments {
                serde_json::Value::Null => serde_json::Value::Object(Default::default()),
                serde_json::Value::String(s) if s.trim().is_empty() => {
                    serde_json::Value::Object(Default::default())
                }
                serde_json::Value::String(s) => {
                    serde_json::from_str(s).map_err(|e| ChatError::InvalidMessage {
                        index,
                        message: format!(
                            "the arguments of the call to `{}` are not JSON: {e}",
                            c.function.name
                        ),
                    })?
                }
                v => v.clone(),
            };
            let mut call = serde_json::Map::new();
            if let Some(id) = &c.id {
                call.insert("id".into(), id.clone().into());
            }
            call.insert("type".into(), c.kind.clone().into());
            call.insert(
                "function".into(),
                serde_json::json!({"name": c.function.name, "arguments": arguments}),
            );
            calls.push(serde_json::Value::Object(call));
        }
        obj.insert("tool_calls".into(), calls.into());
    }
    if let Some(id) = &m.tool_call_id {
        obj.insert("tool_call_id".into(), id.clone().into());
    }
    if let Some(n) = &m.name {
        obj.insert("name".into(), n.clone().into());
    }
    Ok(serde_json::Value::Object(obj))
}

/// The whole conversation of a request: its system prompt, its history, then its prompt as the
/// last user turn (when not empty).
pub fn conversation(request: &GenerateRequest) -> Result<Vec<serde_json::Value>, ChatError> {
    let mut msgs: Vec<Message> = Vec::new();
    if let Some(s) = &request.system_prompt {
        msgs.push(Message::system(s.clone()));
    }
    msgs.extend(request.messages.iter().flatten().cloned());
    if !request.prompt.is_empty() || !request.images.is_empty() {
        let mut m = Message::user(request.prompt.clone());
        m.images = request.images.clone();
        msgs.push(m);
    }
    msgs.iter()
        .enumerate()
        .map(|(i, m)| template_message(m, i))
        .collect()
}

/// How a reply to a rendered prompt is read: whether it opens with reasoning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReasoningStart {
    /// The tags the template uses.
    pub tags: ThinkTags,
    /// The prompt ended inside an open block (the reply starts with reasoning).
    pub opened: bool,
}

/// A request rendered into prompt text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prompt {
    /// The text to tokenize (special tokens written as text, as transformers does).
    pub text: String,
    /// Set when the template writes reasoning blocks: how to split the reply.
    pub reasoning: Option<ReasoningStart>,
}

impl ChatTemplates {
    /// Renders `request` with the checkpoint's template, as `apply_chat_template(messages,
    /// tools=..., add_generation_prompt=True, **special_tokens, **chat_template_kwargs,
    /// enable_thinking=...)` would; a raw request is its prompt verbatim.
    pub fn render_request(&self, request: &GenerateRequest) -> Result<Prompt, ChatError> {
        self.render_request_at(request, Clock::Local)
    }

    /// [`ChatTemplates::render_request`] with `strftime_now` reading `clock`.
    pub fn render_request_at(
        &self,
        request: &GenerateRequest,
        clock: Clock,
    ) -> Result<Prompt, ChatError> {
        if request.raw_prompt {
            return Ok(Prompt {
                text: request.prompt.clone(),
                reasoning: None,
            });
        }
        let (template, input) = self.input_for(request, clock)?;
        let text = template.render(&input)?;
        let reasoning = ThinkTags::from_template(template.source()).map(|tags| ReasoningStart {
            opened: tags.prompt_opens_reasoning(&text),
            tags,
        });
        Ok(Prompt { text, reasoning })
    }

    /// The conversation of `request` rendered without the generation prompt (the header that
    /// opens the assistant's turn), when that is a proper prefix of `prompt`: the next turn of a
    /// chat renders the same text before its new messages, so a decoding state kept after it
    /// can be resumed then. `None` for raw requests, templates that render history differently
    /// once a turn follows, or templates that refuse a conversation ending with a user turn
    /// without the prompt.
    pub fn history_prefix(&self, request: &GenerateRequest, prompt: &Prompt) -> Option<String> {
        if request.raw_prompt {
            return None;
        }
        let (template, mut input) = self.input_for(request, Clock::Local).ok()?;
        input.add_generation_prompt = false;
        let history = template.render(&input).ok()?;
        (history.len() < prompt.text.len() && prompt.text.starts_with(&history)).then_some(history)
    }

    pub(crate) fn input_for(
        &self,
        request: &GenerateRequest,
        clock: Clock,
    ) -> Result<(&crate::ChatTemplate, RenderInput), ChatError> {
        let template = self
            .select(!request.tools.is_empty())
            .ok_or(ChatError::NoTemplate)?;
        let mut variables = self.special_tokens().clone();
        for (k, v) in &request.chat_template_kwargs {
            variables.insert(k.clone(), v.clone());
        }
        if let Some(t) = request.thinking {
            variables.insert("enable_thinking".into(), t.into());
        }
        let input = RenderInput {
            messages: conversation(request)?,
            tools: (!request.tools.is_empty()).then(|| request.tools.clone()),
            documents: None,
            add_generation_prompt: true,
            variables,
            clock,
        };
        Ok((template, input))
    }
}

/// A reply as it streams in: stop strings cut it, and a thinking model's reasoning is split
/// from its answer.
///
/// ```
/// use mtp_chat::{ReasoningStart, ReplyText, ThinkTags};
/// let start = ReasoningStart { tags: ThinkTags::default(), opened: true };
/// let mut r = ReplyText::new(vec!["<|im_end|>".into()], Some(start));
/// r.push("Two plus two.\n</think>\n\n4<|im_");
/// r.push("end|> ignored");
/// r.finish();
/// assert_eq!(r.content(), "4");
/// assert_eq!(r.reasoning(), Some("Two plus two."));
/// assert!(r.stopped());
/// ```
#[derive(Debug, Clone)]
pub struct ReplyText {
    stop: StopScanner,
    parser: Option<ReasoningParser>,
    content: String,
    reasoning: String,
}

impl ReplyText {
    /// A reply cut at `stops`, split as `reasoning` says (no split when `None`).
    pub fn new(stops: Vec<String>, reasoning: Option<ReasoningStart>) -> Self {
        ReplyText {
            stop: StopScanner::new(stops),
            parser: reasoning.map(|r| ReasoningParser::new(r.tags, r.opened)),
            content: String::new(),
            reasoning: String::new(),
        }
    }

    fn split(&mut self, raw: String, last: bool) -> Split {
        let s = match &mut self.parser {
            Some(p) => {
                let mut s = p.push(&raw);
                if last {
                    let t = p.finish();
                    s.reasoning.push_str(&t.reasoning);
                    s.content.push_str(&t.content);
                }
                s
            }
            None => Split {
                reasoning: String::new(),
                content: raw,
            },
        };
        self.content.push_str(&s.content);
        self.reasoning.push_str(&s.reasoning);
        s
    }

    /// Adds a piece of decoded text; returns what can be shown now.
    pub fn push(&mut self, piece: &str) -> Split {
        let raw = self.stop.push(piece);
        let last = self.stop.stopped();
        self.split(raw, last)
    }

    /// Ends the reply; returns what was held back.
    pub fn finish(&mut self) -> Split {
        let raw = self.stop.finish();
        self.split(raw, true)
    }

    /// True once a stop string was seen (the rest of the reply is dropped).
    pub fn stopped(&self) -> bool {
        self.stop.stopped()
    }

    /// The answer so far.
    pub fn content(&self) -> &str {
        &self.content
    }

    /// The reasoning so far, when the reply is split (and it is not empty).
    pub fn reasoning(&self) -> Option<&str> {
        (self.parser.is_some() && !self.reasoning.is_empty()).then_some(self.reasoning.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Images become transformers' content parts, before the text (the shape
    /// `tests/templates` renders through the 72 published templates, case `image_parts`).
    #[test]
    fn images_are_content_parts_before_the_text() {
        let mut seen = Message::user("What is in this picture?");
        seen.images.push("a.png".into());
        let req = GenerateRequest::new("And these two?")
            .messages(vec![seen, Message::assistant("A cat.")])
            .image("b.png")
            .image("c.png");
        let msgs = conversation(&req).unwrap();
        assert_eq!(
            msgs[0]["content"],
            serde_json::json!([{"type": "image"}, {"type": "text", "text": "What is in this picture?"}])
        );
        assert_eq!(msgs[1]["content"], "A cat.");
        assert_eq!(
            msgs[2]["content"],
            serde_json::json!([{"type": "image"}, {"type": "image"}, {"type": "text", "text": "And these two?"}])
        );
        // an image alone, no text
        let only = conversation(&GenerateRequest::new("").image("x.png")).unwrap();
        assert_eq!(only[0]["content"], serde_json::json!([{"type": "image"}]));
        assert_eq!(req.all_images(), ["a.png", "b.png", "c.png"]);
    }
}
