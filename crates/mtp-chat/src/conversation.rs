//! From a request to the prompt text: the conversation as chat templates read it, the template
//! variables, and how the reply is to be read back (reasoning tags, stop strings).

use mtp_contract::{
    FunctionCall, GenerateRequest, Message, ProviderError, ResponseFormat, ToolCall, ToolCallDelta,
    ToolChoice,
};

use crate::checkpoint::ChatTemplates;
use crate::stream::{ReasoningParser, Split, StopScanner, ThinkTags};
use crate::template::{Clock, RenderInput, TemplateError};
use crate::toolcall::{self, call_grammar, Forced, ToolCallFormat, ToolCallStream};

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
    /// `tool_choice` forces a call, but the chat template writes no tool-call markup this
    /// crate can force (see [`ToolCallFormat::from_template`]).
    #[error(
        "tool_choice forces a tool call, but this model's chat template writes no tool-call \
         format that can be enforced (Qwen3.5's <function=...> XML or <tool_call> JSON); use \
         tool_choice \"auto\""
    )]
    NoToolCallFormat,
    /// The forced call cannot be written as a grammar (a name the markup cannot carry).
    #[error("{0}")]
    ToolCall(String),
}

impl ChatError {
    /// The contract's error for this failure: a template that refuses the conversation, fails
    /// while rendering it (it compiled when the model loaded, so what differs is the request's
    /// data: a value of a type it does not expect, a budget exhausted) or a malformed message
    /// is the request's fault (`InvalidRequest`); a template that does not compile is the
    /// model's (`ModelLoad`).
    pub fn into_provider_error(self, model: &str) -> ProviderError {
        match self {
            ChatError::NoTemplate => ProviderError::InvalidRequest {
                field: "raw_prompt",
                message: self.to_string(),
            },
            ChatError::InvalidMessage { .. }
            | ChatError::SpecialText { .. }
            | ChatError::Template(TemplateError::Raised { .. } | TemplateError::Render { .. }) => {
                ProviderError::InvalidRequest {
                    field: "messages",
                    message: self.to_string(),
                }
            }
            ChatError::NoToolCallFormat | ChatError::ToolCall(_) => ProviderError::InvalidRequest {
                field: "tool_choice",
                message: self.to_string(),
            },
            ChatError::Template(e) => ProviderError::ModelLoad {
                model: model.to_string(),
                message: e.to_string(),
            },
        }
    }
}

/// A JSON value's kind and a short sample, for messages.
fn json_kind_of(v: &serde_json::Value) -> String {
    let text = v.to_string();
    let sample: String = text.chars().take(40).collect();
    let more = if sample.len() < text.len() { "…" } else { "" };
    format!("{} `{sample}{more}`", mtp_contract::json_kind(v))
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
            // templates iterate the arguments as a mapping (`arguments|items`); OpenAI's are
            // always a JSON object
            if !arguments.is_object() {
                return Err(ChatError::InvalidMessage {
                    index,
                    message: format!(
                        "the arguments of the call to `{}` must be a JSON object, got {}",
                        c.function.name,
                        json_kind_of(&arguments)
                    ),
                });
            }
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

impl Prompt {
    /// A raw request's prompt: its text verbatim, no reasoning split.
    pub fn raw(request: &GenerateRequest) -> Prompt {
        Prompt {
            text: request.prompt.clone(),
            reasoning: None,
        }
    }
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
            return Ok(Prompt::raw(request));
        }
        let (template, input) = self.input_for(request, clock)?;
        let text = template.render(&input)?;
        let reasoning = ThinkTags::from_template(template.source()).map(|tags| ReasoningStart {
            opened: tags.prompt_opens_reasoning(&text),
            tags,
        });
        Ok(Prompt { text, reasoning })
    }

    /// The tool-call markup the template a request renders with teaches its model (see
    /// [`ToolCallFormat::from_template`]); `None` for a raw request, one that offers no tools,
    /// or a template with no markup this crate reads.
    pub fn tool_call_format(&self, request: &GenerateRequest) -> Option<ToolCallFormat> {
        if request.raw_prompt || request.offered_tools().is_empty() {
            return None;
        }
        ToolCallFormat::from_template(self.select(true)?.source())
    }

    /// The constraint a request that forces a tool call (`tool_choice` `required` or a named
    /// function) decodes under: an llguidance Lark grammar of the template's tool-call markup
    /// ([`crate::toolcall::call_grammar`]), after the reasoning block when the rendered prompt
    /// opens the reply inside one (`reasoning`, the prompt's [`Prompt::reasoning`]: the
    /// reasoning is free text up to the closing tag). `None` when the request forces nothing;
    /// an error when the template has no tool-call markup this crate can write, or the tools
    /// cannot be written as it.
    pub fn tool_call_constraint(
        &self,
        request: &GenerateRequest,
        reasoning: Option<&ReasoningStart>,
    ) -> Result<Option<ResponseFormat>, ChatError> {
        let forced = match &request.tool_choice {
            ToolChoice::Required => Forced::Required,
            ToolChoice::Function(n) => Forced::Named(n.clone()),
            ToolChoice::Auto | ToolChoice::None => return Ok(None),
        };
        let format = self
            .tool_call_format(request)
            .ok_or(ChatError::NoToolCallFormat)?;
        let parallel = request.parallel_tool_calls != Some(false);
        let calls = call_grammar(format, &request.tools, forced, parallel)
            .map_err(|e| ChatError::ToolCall(e.to_string()))?;
        let grammar = match reasoning {
            Some(r) if r.opened => after_reasoning(&calls, &r.tags.close),
            _ => calls,
        };
        Ok(Some(ResponseFormat::Grammar { grammar }))
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
            .select(!request.offered_tools().is_empty())
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
            tools: (!request.offered_tools().is_empty()).then(|| request.offered_tools().to_vec()),
            documents: None,
            add_generation_prompt: true,
            variables,
            clock,
        };
        Ok((template, input))
    }
}

/// How a reply's tool calls are read (the format its template teaches) and the constraint of
/// a forced call: what [`tool_decoding`] gives a provider.
pub type ToolDecoding = (Option<ToolCallFormat>, Option<ResponseFormat>);

/// [`ChatTemplates::tool_call_format`] and [`ChatTemplates::tool_call_constraint`] for an
/// in-process provider whose templates may have failed to load (`templates`' error, shown
/// when a forced call needs them): a request that forces nothing reads no calls then (it can
/// only be raw); one that forces a call is an `InvalidRequest` naming `tool_choice`.
pub fn tool_decoding<E: std::fmt::Display>(
    templates: Result<&ChatTemplates, E>,
    request: &GenerateRequest,
    reasoning: Option<&ReasoningStart>,
    model: &str,
) -> Result<ToolDecoding, ProviderError> {
    let templates = match templates {
        Ok(t) => t,
        Err(_) if !request.tool_choice.forces_a_call() => return Ok((None, None)),
        Err(e) => {
            return Err(ProviderError::InvalidRequest {
                field: "tool_choice",
                message: format!("a forced tool call needs the model's chat template: {e}"),
            })
        }
    };
    let forced = templates
        .tool_call_constraint(request, reasoning)
        .map_err(|e| e.into_provider_error(model))?;
    Ok((templates.tool_call_format(request), forced))
}

/// `calls` (a Lark grammar whose first rule is `start`) behind a reasoning block the prompt
/// opened: free text up to `close`, optional blank space, then the calls.
fn after_reasoning(calls: &str, close: &str) -> String {
    let body = calls.replacen("start:", "tool_calls_body:", 1);
    let close = serde_json::to_string(close).unwrap_or_default();
    // a lazy rule: the reasoning ends at the first closing tag (a greedy terminal would take
    // the tag's first bytes as reasoning and never see it)
    format!(
        "start: reasoning BLANK? tool_calls_body\n\
         reasoning[suffix={close}]: /(?s:.*)/\n\
         BLANK: /[ \\t\\r\\n]+/\n{body}"
    )
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
    tools: Option<ReplyTools>,
}

/// The tool calls of a reply, read from its answer as it streams.
#[derive(Debug, Clone)]
struct ReplyTools {
    stream: ToolCallStream,
    /// `parallel_tool_calls: false`: calls after the first are dropped (with a warning).
    parallel: bool,
    calls: Vec<ToolCall>,
    warnings: Vec<String>,
}

impl ReplyText {
    /// A reply cut at `stops`, split as `reasoning` says (no split when `None`).
    pub fn new(stops: Vec<String>, reasoning: Option<ReasoningStart>) -> Self {
        ReplyText {
            stop: StopScanner::new(stops),
            parser: reasoning.map(|r| ReasoningParser::new(r.tags, r.opened)),
            content: String::new(),
            reasoning: String::new(),
            tools: None,
        }
    }

    /// Reads the answer's tool calls in `format` (the request's template's, from
    /// [`ChatTemplates::tool_call_format`]; `None` reads none): calls become
    /// [`Split::tool_calls`] pieces and [`ReplyText::tool_calls`], never answer text.
    /// `parallel_tool_calls: false` keeps the first call.
    pub fn with_tool_calls(
        mut self,
        format: Option<ToolCallFormat>,
        request: &GenerateRequest,
    ) -> Self {
        self.tools = format
            .filter(|_| !request.offered_tools().is_empty())
            .map(|f| ReplyTools {
                stream: ToolCallStream::new(f, request.offered_tools()),
                parallel: request.parallel_tool_calls != Some(false),
                calls: Vec::new(),
                warnings: Vec::new(),
            });
        self
    }

    /// The tool calls read so far (OpenAI's shape: `arguments` a JSON object as a string).
    pub fn tool_calls(&self) -> &[ToolCall] {
        self.tools.as_ref().map_or(&[], |t| t.calls.as_slice())
    }

    /// What reading the tool calls noticed (a malformed call returned as text, a value that
    /// did not fit its schema's type, a call dropped under `parallel_tool_calls: false`).
    pub fn tool_call_warnings(&self) -> &[String] {
        self.tools.as_ref().map_or(&[], |t| t.warnings.as_slice())
    }

    /// Splits the answer part of `s` into text and tool-call pieces.
    /// At the end (`last`) of a reply the token limit `cut`, the calls it cut are left out:
    /// their markup is returned, to become the whole answer's content (not the piece's: a
    /// stream has sent their pieces already).
    fn read_tool_calls(&mut self, s: &mut Split, last: bool, cut: bool) -> Option<String> {
        let t = self.tools.as_mut()?;
        let mut events = t.stream.push(&s.content);
        if last && cut {
            events.extend(t.stream.finish_cut());
        } else if last {
            events.extend(t.stream.finish());
        }
        t.warnings.extend(t.stream.take_warnings());
        let mut text = String::new();
        for ev in events {
            match ev {
                toolcall::StreamEvent::Content(c) => text.push_str(&c),
                toolcall::StreamEvent::ToolCallDelta {
                    index,
                    id,
                    name,
                    arguments,
                } => {
                    if index > 0 && !t.parallel {
                        if id.is_some() {
                            t.warnings.push(format!(
                                "parallel_tool_calls is false: call {} ({}) was dropped",
                                index + 1,
                                name.as_deref().unwrap_or("?")
                            ));
                        }
                        continue;
                    }
                    if let (Some(id), Some(name)) = (&id, &name) {
                        t.calls.push(ToolCall {
                            id: Some(id.clone()),
                            kind: "function".into(),
                            function: FunctionCall {
                                name: name.clone(),
                                arguments: serde_json::Value::String(String::new()),
                            },
                        });
                    }
                    if let Some(serde_json::Value::String(a)) =
                        t.calls.get_mut(index).map(|c| &mut c.function.arguments)
                    {
                        a.push_str(&arguments);
                    }
                    s.tool_calls.push(ToolCallDelta {
                        index,
                        id,
                        name,
                        arguments,
                    });
                }
            }
        }
        s.content = text;
        let c = t.stream.cut()?;
        // under `parallel_tool_calls: false` a later call was dropped already
        let kept = c.first < t.calls.len();
        t.calls.truncate(c.first);
        kept.then(|| c.text.clone())
    }

    fn split(&mut self, raw: String, last: bool, cut: bool) -> Split {
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
                content: raw,
                ..Split::default()
            },
        };
        let mut s = s;
        let cut_text = self.read_tool_calls(&mut s, last, cut);
        self.content.push_str(&s.content);
        if let Some(c) = cut_text {
            self.content.push_str(&c);
        }
        self.reasoning.push_str(&s.reasoning);
        s
    }

    /// Adds a piece of decoded text; returns what can be shown now.
    pub fn push(&mut self, piece: &str) -> Split {
        let raw = self.stop.push(piece);
        let last = self.stop.stopped();
        self.split(raw, last, false)
    }

    /// Ends the reply; returns what was held back.
    pub fn finish(&mut self) -> Split {
        let raw = self.stop.finish();
        self.split(raw, true, false)
    }

    /// Ends a reply the token limit cut (`finish_reason: "length"`); returns what was held
    /// back. A tool call the limit cut inside its markup is incomplete: it leaves
    /// [`ReplyText::tool_calls`], its markup becomes part of [`ReplyText::content`] (not of
    /// the returned piece: a stream has sent the call's pieces already), and no piece closes
    /// its arguments (see [`ToolCallStream::finish_cut`]). A reply a stop string ended
    /// earlier is not cut: this is [`ReplyText::finish`] then.
    pub fn finish_cut(&mut self) -> Split {
        let raw = self.stop.finish();
        self.split(raw, true, true)
    }

    /// True once a stop string was seen (the rest of the reply is dropped).
    pub fn stopped(&self) -> bool {
        self.stop.stopped()
    }

    /// The stop string that ended the reply, once one was seen.
    pub fn stop_sequence(&self) -> Option<&str> {
        self.stop.matched()
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
