//! Request bodies and response parsing for the OpenAI-style endpoints and llama-server's
//! native `/completion`. One [`Accum`] absorbs either a full response or stream chunks, so the
//! streaming and non-streaming paths read the same fields.

use mtp_contract::{
    tool_name, FinishReason, GenerateRequest, Message, ProviderError, ResolvedSpeculation,
    ResponseFormat, ToolCallDelta, ToolChoice,
};
use mtp_openai::{self as oa, Field, OpenAiToolChoice};
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::options::ServerKind;
use crate::tool_calls::ToolCalls;

/// Which endpoint a request goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Endpoint {
    /// `…/chat/completions`.
    Chat,
    /// `…/completions` (OpenAI-style text completion).
    Completion,
    /// llama-server's native `/completion`.
    Native,
}

impl Endpoint {
    pub(crate) fn for_request(kind: ServerKind, req: &GenerateRequest) -> Endpoint {
        match (req.raw_prompt, kind) {
            (false, _) => Endpoint::Chat,
            (true, ServerKind::LlamaServer) => Endpoint::Native,
            (true, _) => Endpoint::Completion,
        }
    }

    pub(crate) fn path(self, kind: ServerKind) -> &'static str {
        match self {
            Endpoint::Chat => kind.chat_path(),
            Endpoint::Completion | Endpoint::Native => kind.completion_path(),
        }
    }
}

/// The model ids of an OpenAI `GET /v1/models` answer (`{"data": [{"id": …}, …]}`), in the
/// server's order; what is not such a list is an error saying what it is.
pub(crate) fn model_ids(body: &[u8]) -> Result<Vec<String>, String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("not JSON ({e})"))?;
    let list = oa::ModelList::deserialize(&v).unwrap_or_default();
    if list.data.is_none() {
        return Err("no `data` list".into());
    }
    list.ids()
        .enumerate()
        .map(|(i, id)| {
            id.filter(|id| !id.trim().is_empty())
                .map(str::to_string)
                .ok_or_else(|| format!("`data[{i}]` has no `id` string"))
        })
        .collect()
}

/// Checks what the HTTP adapters cannot carry before anything is sent.
pub(crate) fn check_request(kind: ServerKind, req: &GenerateRequest) -> Result<(), ProviderError> {
    req.validate()?;
    if req.has_images() {
        if req.raw_prompt {
            return Err(ProviderError::Unsupported {
                provider: kind.name().into(),
                what: "image input with a raw prompt (the completion endpoints take text only)"
                    .into(),
            });
        }
        // sent as OpenAI `image_url` parts: inline, or a URL the server fetches itself; a local
        // path means nothing to a server (the `mtp` command inlines the files it is given)
        if let Some(p) = req.all_images().into_iter().find(|u| !is_sendable_image(u)) {
            return Err(ProviderError::InvalidRequest {
                field: "images",
                message: format!(
                    "`{}` is not a data: or http(s) URL; an HTTP runtime sends images inline \
                     (`data:image/png;base64,...`), it does not read local files",
                    p.chars().take(80).collect::<String>()
                ),
            });
        }
    }
    if let Some(f) = req.constraint() {
        if !can_enforce(kind, f) {
            if !req.prompted_fallback {
                return Err(ProviderError::Unsupported {
                    provider: kind.name().into(),
                    what: format!(
                        "response_format `{}` (this server's API has no field for it, and it is \
                         never dropped silently; vLLM and the native provider enforce it; \
                         prompted_fallback asks for it in the prompt and checks the reply)",
                        f.kind()
                    ),
                });
            }
            if req.raw_prompt {
                return Err(ProviderError::InvalidRequest {
                    field: "prompted_fallback",
                    message: format!(
                        "response_format `{}` would be asked for in the system message, and a \
                         raw prompt is sent verbatim; send a chat request",
                        f.kind()
                    ),
                });
            }
        }
    }
    check_tools(kind, req)?;
    if req.raw_prompt
        && (req.system_prompt.is_some() || req.messages.as_ref().is_some_and(|m| !m.is_empty()))
    {
        return Err(ProviderError::InvalidRequest {
            field: "raw_prompt",
            message: "a raw prompt is sent verbatim to the completion endpoint; put the system prompt and history into the prompt text".into(),
        });
    }
    if !req.raw_prompt && req.prompt.is_empty() && req.messages.as_ref().is_none_or(Vec::is_empty) {
        return Err(ProviderError::InvalidRequest {
            field: "prompt",
            message: "is empty and there is no history to answer".into(),
        });
    }
    Ok(())
}

/// Refuses the tool choices a server's API cannot carry (never dropped silently). Tools are
/// shown to the model by the chat template, so a raw prompt (sent verbatim to a completion
/// endpoint) cannot be forced to call one; Ollama's OpenAI endpoint has no `tool_choice`
/// field at all (its request type drops it), so a forced call cannot be asked of it.
fn check_tools(kind: ServerKind, req: &GenerateRequest) -> Result<(), ProviderError> {
    if !req.tool_choice.forces_a_call() {
        return Ok(());
    }
    if req.raw_prompt {
        return Err(ProviderError::InvalidRequest {
            field: "tool_choice",
            message: "a raw prompt is sent verbatim to the completion endpoint, which has no \
                      tools; a forced tool call needs a chat request"
                .into(),
        });
    }
    if kind == ServerKind::Ollama {
        return Err(ProviderError::InvalidRequest {
            field: "tool_choice",
            message: format!(
                "Ollama's OpenAI endpoint has no `tool_choice` field (it would drop {}), so it \
                 cannot be made to call a tool; send \"auto\" or \"none\", or use llama-server, \
                 vLLM or LM Studio",
                req.tool_choice.to_openai()
            ),
        });
    }
    Ok(())
}

/// The tool fields of a chat body: the tools the model is shown, the `tool_choice` to send
/// (none for `auto`, every server's default when tools are given) and `parallel_tool_calls`.
///
/// llama-server and LM Studio read `tool_choice` as a string only (llama-server replaces an
/// object by `auto`): a named function is sent to them as `required` over that one tool,
/// which forces the same call. llama-server's own default for `parallel_tool_calls` is
/// `false`, the contract's (as OpenAI's) is `true`, so it is always sent there.
fn tool_fields(
    kind: ServerKind,
    req: &GenerateRequest,
) -> Option<(Vec<Value>, Option<ToolChoice>, Option<bool>)> {
    let offered = req.offered_tools();
    if offered.is_empty() {
        return None;
    }
    let string_only = matches!(kind, ServerKind::LlamaServer | ServerKind::LmStudio);
    let (tools, choice) = match &req.tool_choice {
        ToolChoice::Function(n) if string_only => (
            offered
                .iter()
                .filter(|t| tool_name(t) == Some(n.as_str()))
                .cloned()
                .collect(),
            Some(ToolChoice::Required),
        ),
        ToolChoice::Auto => (offered.to_vec(), None),
        c => (offered.to_vec(), Some(c.clone())),
    };
    let parallel = match kind {
        ServerKind::LlamaServer => Some(req.parallel_tool_calls != Some(false)),
        _ => req.parallel_tool_calls,
    };
    Some((tools, choice, parallel))
}

/// Whether the server's API takes `f` (JSON everywhere; a regex and a Lark grammar only in
/// vLLM's `structured_outputs`, no other server's API has a field for them).
fn can_enforce(kind: ServerKind, f: &ResponseFormat) -> bool {
    matches!(
        f,
        ResponseFormat::JsonSchema { .. } | ResponseFormat::JsonObject { .. }
    ) || kind == ServerKind::Vllm
}

/// The constraint a request asks for in its prompt instead of sending it: set when the server
/// cannot take it and the request allows that (`prompted_fallback`; `check_request` refuses
/// the other cases).
pub(crate) fn prompted(kind: ServerKind, req: &GenerateRequest) -> Option<&ResponseFormat> {
    req.constraint()
        .filter(|f| req.prompted_fallback && !can_enforce(kind, f))
}

/// Builds the request body. `depth` is the per-request depth to ask llama-server for (0 pins
/// drafting off), `None` to leave the server's setting alone.
pub(crate) fn build_body(
    kind: ServerKind,
    endpoint: Endpoint,
    model: &str,
    req: &GenerateRequest,
    stream: bool,
    depth: Option<u32>,
) -> oa::ChatCompletionRequest {
    // numbers go out as the JSON of their f64 value (an f32 0.7 is 0.699999988079071), as
    // they always have
    fn num(x: f32) -> Option<Field<f64>> {
        Some(f64::from(x).into())
    }
    let mut b = oa::ChatCompletionRequest::default();
    let s = &req.sampling;
    match endpoint {
        Endpoint::Chat => {
            b.model = Some(model.to_string().into());
            let mut msgs = Vec::new();
            if let Some(sys) = &req.system_prompt {
                msgs.push(oa::ChatMessage::text("system", sys.clone()));
            }
            for m in req.messages.iter().flatten() {
                msgs.push(openai_message(m));
            }
            // a constraint the server cannot take, asked for in the system message (added to
            // the one there is: many templates refuse a second or a late system message)
            if let Some(ask) = prompted(kind, req).and_then(ResponseFormat::instruction) {
                match msgs.first_mut() {
                    Some(m) if m.role_str() == Some("system") => {
                        let text = match m.content_text() {
                            Some(t) if !t.is_empty() => format!("{t}\n\n{ask}"),
                            _ => ask,
                        };
                        m.content = Some(oa::Content::Text(text).into());
                    }
                    _ => msgs.insert(0, oa::ChatMessage::text("system", ask)),
                }
            }
            if !req.prompt.is_empty() || !req.images.is_empty() {
                msgs.push(oa::ChatMessage {
                    role: Some("user".to_string().into()),
                    content: Some(content(&req.prompt, &req.images).into()),
                    ..Default::default()
                });
            }
            b.messages = Some(msgs.into_iter().map(Field::Ok).collect::<Vec<_>>().into());
            if let Some((tools, choice, parallel)) = tool_fields(kind, req) {
                b.tools = Some(tools.into());
                b.tool_choice = choice.map(|c| OpenAiToolChoice(c).into());
                b.parallel_tool_calls = parallel.map(Field::Ok);
            }
        }
        Endpoint::Completion => {
            b.model = Some(model.to_string().into());
            b.prompt = Some(oa::Prompt::Text(req.prompt.clone()).into());
        }
        Endpoint::Native => {
            b.prompt = Some(oa::Prompt::Text(req.prompt.clone()).into());
            b.return_tokens = Some(true.into());
        }
    }
    b.stream = Some(stream.into());
    // llama-server streams the prompt's progress when asked (its `prompt_progress` chunks),
    // which the stream passes on; other servers are sent no llama-specific field
    if stream && kind == ServerKind::LlamaServer {
        b.return_progress = Some(true.into());
    }
    if stream && endpoint != Endpoint::Native {
        b.stream_options = Some(
            oa::StreamOptions {
                include_usage: Some(true.into()),
                ..Default::default()
            }
            .into(),
        );
    }
    if let Some(n) = req.max_output_tokens {
        if endpoint == Endpoint::Native {
            b.n_predict = Some(serde_json::Number::from(n).into());
        } else {
            b.max_tokens = Some(u64::from(n).into());
        }
    }
    // The contract's unset temperature means greedy; servers default to sampling otherwise.
    b.temperature = num(s.temperature.unwrap_or(0.0));
    b.top_p = s.top_p.and_then(num);
    b.top_k = s.top_k.map(|k| u64::from(k).into());
    b.min_p = s.min_p.and_then(num);
    b.seed = s.seed.map(Field::Ok);
    b.presence_penalty = s.presence_penalty.and_then(num);
    b.frequency_penalty = s.frequency_penalty.and_then(num);
    let repetition = s.repetition_penalty.and_then(num);
    match kind {
        ServerKind::LlamaServer | ServerKind::LmStudio => b.repeat_penalty = repetition,
        _ => b.repetition_penalty = repetition,
    }
    if !s.logit_bias.is_empty() {
        let bias = s
            .logit_bias
            .iter()
            .map(|(t, v)| (t.to_string(), Field::Ok(f64::from(*v))))
            .collect();
        b.logit_bias = Some(oa::LogitBias(bias).into());
    }
    if !req.stop.is_empty() {
        b.stop = Some(oa::Stop::Many(req.stop.clone()).into());
    }
    if endpoint == Endpoint::Chat
        && (req.thinking.is_some() || !req.chat_template_kwargs.is_empty())
    {
        match kind {
            ServerKind::LlamaServer | ServerKind::Vllm => {
                let mut kw = req.chat_template_kwargs.clone();
                if let Some(on) = req.thinking {
                    kw.insert("enable_thinking".into(), on.into());
                }
                b.chat_template_kwargs = Some(kw.into());
            }
            other => {
                tracing::warn!(provider = %other, "`thinking` and chat_template_kwargs have no portable request field on this server; they are not sent");
            }
        }
    }
    // Constraints travel as each API spells them: llama-server's native `json_schema`,
    // OpenAI's `response_format` for JSON everywhere else (llama-server, vLLM, LM Studio and
    // Ollama all read it), vLLM's `structured_outputs` for a regex or a Lark grammar (the
    // field since vLLM 0.10.2; 0.12 removed the older `guided_regex`/`guided_grammar`). The
    // servers choose their own whitespace. A server that takes the field and does not
    // enforce it is caught afterwards (`constraint_warning`).
    let sent = req.constraint().filter(|_| prompted(kind, req).is_none());
    match (sent, endpoint) {
        (Some(ResponseFormat::Regex { regex }), _) => {
            b.structured_outputs = Some(
                oa::StructuredOutputs {
                    regex: Some(regex.clone().into()),
                    ..Default::default()
                }
                .into(),
            )
        }
        (Some(ResponseFormat::Grammar { grammar }), _) => {
            b.structured_outputs = Some(
                oa::StructuredOutputs {
                    grammar: Some(grammar.clone().into()),
                    ..Default::default()
                }
                .into(),
            )
        }
        (Some(f), Endpoint::Native) => b.json_schema = Some(json_schema_of(f)),
        (Some(ResponseFormat::JsonObject { .. }), _) => {
            b.response_format = Some(ResponseFormat::json_object().into())
        }
        (Some(ResponseFormat::JsonSchema { json_schema, .. }), _) => {
            b.response_format = Some(
                ResponseFormat::JsonSchema {
                    json_schema: mtp_contract::JsonSchemaFormat {
                        name: Some(
                            json_schema
                                .name
                                .clone()
                                .unwrap_or_else(|| "response".into()),
                        ),
                        schema: json_schema.schema.clone(),
                        strict: Some(true),
                    },
                    // the servers choose their own whitespace; nothing of ours is sent
                    flexible_whitespace: false,
                }
                .into(),
            )
        }
        _ => {}
    }
    if kind == ServerKind::LlamaServer {
        b.speculative_n_max = depth.map(|d| u64::from(d).into());
    }
    b
}

/// The JSON Schema a JSON constraint stands for (`json_object`: any object).
fn json_schema_of(f: &ResponseFormat) -> Value {
    match f {
        ResponseFormat::JsonSchema { json_schema, .. } => json_schema.schema.clone(),
        _ => any_object(),
    }
}

/// The JSON Schema of any object.
fn any_object() -> Value {
    Value::Object(Map::from_iter([("type".to_string(), "object".into())]))
}

/// A warning when a constrained reply that finished does not follow its constraint: the
/// server took the request but did not enforce its `response_format` (a field it does not know
/// is dropped by most servers). JSON is validated against the schema with `jsonschema` (an
/// object's keys may come in any order and with any whitespace, as servers write them); a
/// regex or a Lark grammar is checked with the grammar the native engine enforces
/// ([`mtp_grammar::check_text`]).
///
/// A constraint that was asked for in the prompt (`prompted`) always gets a warning: it was
/// not enforced, and the warning says whether the reply follows it.
pub(crate) fn constraint_warning(
    format: Option<&ResponseFormat>,
    prompted: bool,
    content: &str,
    finish: FinishReason,
) -> Option<String> {
    let f = format?;
    if !f.is_constrained() {
        return None;
    }
    let kind = f.kind();
    let asked = || {
        format!(
            "response_format `{kind}` was asked for in the prompt, not enforced (this server's \
             API has no field for it; prompted_fallback)"
        )
    };
    if finish != FinishReason::Stop {
        return prompted.then(|| {
            format!(
                "{}: the reply did not finish, so it was not checked",
                asked()
            )
        });
    }
    let broken = |what: String| {
        Some(if prompted {
            format!("{}: the finished reply {what}", asked())
        } else {
            format!(
                "the server did not enforce response_format `{kind}`: the finished reply {what}"
            )
        })
    };
    let follows = || prompted.then(|| format!("{}: the finished reply follows it", asked()));
    let schema = match f {
        ResponseFormat::JsonSchema { json_schema, .. } => Some(json_schema.schema.clone()),
        ResponseFormat::JsonObject { .. } => Some(any_object()),
        _ => None,
    };
    if let Some(schema) = schema {
        let Ok(reply) = serde_json::from_str::<Value>(content) else {
            return broken("is not JSON".into());
        };
        return match jsonschema::validator_for(&schema) {
            Ok(v) => match v.validate(&reply) {
                Ok(()) => follows(),
                Err(e) => broken(format!("breaks the schema at `{}`: {e}", e.instance_path())),
            },
            Err(e) => Some(format!(
                "the finished reply is JSON but was not checked against the schema: {e}"
            )),
        };
    }
    match mtp_grammar::check_text(f, content) {
        Ok(mtp_grammar::Check::Follows) => follows(),
        Ok(mtp_grammar::Check::Leaves { at }) => broken(format!(
            "leaves it at byte {at} of {} ({:?})",
            content.len(),
            excerpt(content, at)
        )),
        Ok(mtp_grammar::Check::Unfinished) => broken("stops before it is complete".into()),
        Err(e) => Some(format!("the finished reply was not checked: {e}")),
    }
}

/// Up to 24 characters of `s` from byte `at` on (moved back to a character boundary).
fn excerpt(s: &str, mut at: usize) -> String {
    at = at.min(s.len());
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    s[at..].chars().take(24).collect()
}

/// An image reference a server can take as an `image_url`: a `data:` URL, or an `http(s)` one
/// (which the server fetches).
fn is_sendable_image(u: &str) -> bool {
    matches!(
        mtp_contract::ImageRef::of(u),
        mtp_contract::ImageRef::Inline | mtp_contract::ImageRef::Remote
    )
}

/// A message's `content`: the text, or with images OpenAI's parts (the images first, as the
/// native lane renders them).
fn content(text: &str, images: &[String]) -> oa::Content {
    if images.is_empty() {
        return oa::Content::Text(text.to_string());
    }
    let mut parts: Vec<Field<oa::ContentPart>> = images
        .iter()
        .map(|u| oa::ContentPart::image(u.clone()).into())
        .collect();
    if !text.is_empty() {
        parts.push(oa::ContentPart::text(text).into());
    }
    oa::Content::Parts(parts)
}

/// One history message in the OpenAI chat shape: tool-call arguments as the JSON string the
/// API specifies, reasoning as `reasoning_content` (llama-server and vLLM read it back into
/// their templates).
fn openai_message(m: &Message) -> oa::ChatMessage {
    oa::ChatMessage {
        role: Some(m.role.as_str().to_string().into()),
        content: Some(content(&m.content, &m.images).into()),
        reasoning_content: m.reasoning_content.clone().map(Field::Ok),
        tool_calls: (!m.tool_calls.is_empty()).then(|| {
            m.tool_calls
                .iter()
                .map(|c| oa::ToolCall::from_contract(c).into())
                .collect::<Vec<_>>()
                .into()
        }),
        tool_call_id: m.tool_call_id.clone().map(Field::Ok),
        name: m.name.clone().map(Field::Ok),
        ..Default::default()
    }
}

/// The depth to ask llama-server for: the request's explicit depth, 0 when speculation is
/// pinned off for this call, else nothing (the server's launch setting stands).
pub(crate) fn requested_depth(kind: ServerKind, resolved: &ResolvedSpeculation) -> Option<u32> {
    if kind != ServerKind::LlamaServer {
        return None;
    }
    if !resolved.requested {
        return Some(0);
    }
    resolved.num_draft_tokens
}

/// Everything read from a response or from the chunks of a stream.
#[derive(Debug, Default, Clone)]
pub(crate) struct Accum {
    pub content: String,
    /// `reasoning_content` (llama-server, vLLM, LM Studio) or `reasoning` (Ollama's OpenAI
    /// endpoint), concatenated.
    pub reasoning: String,
    pub token_ids: Vec<u32>,
    pub saw_token_ids: bool,
    pub finish: Option<FinishReason>,
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
    /// llama-server's `timings` (the latest one seen).
    pub timings: Option<oa::Timings>,
    /// LM Studio's `stats`.
    pub stats: Option<oa::LmStudioStats>,
    /// A `usage` holding LM Studio's draft counters.
    pub usage_drafts: Option<oa::Usage>,
    /// vLLM's `metrics.speculative_decoding`.
    pub vllm_spec: Option<oa::SpecDecodeMetrics>,
    /// llama-server native stream: the final chunk (`"stop": true`) arrived.
    pub native_stop: bool,
    /// The tool calls the server parsed (`message.tool_calls`, `delta.tool_calls`).
    pub tools: ToolCalls,
}

/// A delta produced by one absorbed object.
#[derive(Debug)]
pub(crate) struct Piece {
    pub text: String,
    pub reasoning: String,
    pub token_ids: Vec<u32>,
    /// Tool-call pieces, numbered by the reply's call order.
    pub tool_calls: Vec<ToolCallDelta>,
    /// llama-server's `prompt_progress`, when the chunk carries one.
    pub progress: Option<mtp_contract::PromptProgress>,
}

/// Why an object could not be absorbed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Absorb {
    /// The server answered with an `error` object: its message.
    Server(String),
    /// The answer breaks the shape it claims (a malformed tool call): what and where.
    Malformed(String),
}

impl Accum {
    /// An empty accumulator whose tool calls are bounded by `max_tool_calls`; `single` keeps
    /// only the first call (`parallel_tool_calls: false`).
    pub(crate) fn new(max_tool_calls: usize, single: bool) -> Self {
        Accum {
            tools: ToolCalls::new(max_tool_calls, single),
            ..Accum::default()
        }
    }

    /// Reads one JSON object (a full response or one stream chunk). An `error` object is
    /// returned as the server's message, a tool call that cannot be read as what is wrong;
    /// any other field that is not what it should be is ignored (what is not an object at
    /// all is read as empty).
    pub(crate) fn absorb(&mut self, v: &Value) -> Result<Piece, Absorb> {
        let c = oa::Completion::deserialize(v).unwrap_or_default();
        if let Some(msg) = c.error_message() {
            return Err(Absorb::Server(msg));
        }
        let mut text = String::new();
        let mut reasoning = String::new();
        let mut ids = Vec::new();
        let mut tool_calls = Vec::new();
        if let Some(choice) = c.first_choice() {
            let delta = choice.delta.as_ref();
            let message = choice.message.as_ref();
            if let Some(calls) = delta.and_then(|d| d.tool_calls.as_ref()) {
                tool_calls = self.tools.read_delta(calls).map_err(Absorb::Malformed)?;
            } else if let Some(calls) = message.and_then(|m| m.tool_calls.as_ref()) {
                tool_calls = self.tools.read_message(calls).map_err(Absorb::Malformed)?;
            }
            let t = delta
                .and_then(|d| d.content.as_deref())
                .or_else(|| message.and_then(oa::ChatMessage::content_text))
                .or(choice.text.as_deref());
            if let Some(t) = t {
                text.push_str(t);
            }
            let r = delta
                .and_then(|d| d.reasoning_content.as_deref())
                .or_else(|| message.and_then(|m| text_of(&m.reasoning_content)))
                .or_else(|| delta.and_then(|d| d.reasoning.as_deref()))
                .or_else(|| message.and_then(|m| text_of(&m.reasoning)));
            if let Some(r) = r {
                reasoning.push_str(r);
            }
            if let Some(fr) = &choice.finish_reason {
                self.finish = Some(map_finish(fr));
            }
        } else if let Some(t) = &c.content {
            // llama-server native /completion
            text.push_str(t);
            if let Some(toks) = &c.tokens {
                self.saw_token_ids = true;
                ids.extend(toks.iter().map(|&t| t as u32));
            }
            if c.stop == Some(true) {
                self.native_stop = true;
                let st = c.stop_type.as_deref().unwrap_or("eos");
                self.finish = Some(map_finish(st));
            }
            // `tokens_evaluated` is the whole prompt; `tokens_cached` is NOT the prompt tokens
            // reused from the cache but every position in the slot's cache at the end (prompt
            // and reply: 35 for a 20-token prompt and 16 tokens), so the cached count comes
            // from `timings.cache_n` below
            self.input_tokens = c.tokens_evaluated.or(self.input_tokens);
            self.output_tokens = c.tokens_predicted.or(self.output_tokens);
        }
        if let Some(u) = c.usage.flatten() {
            self.input_tokens = u.prompt_tokens.or(self.input_tokens);
            self.output_tokens = u.completion_tokens.or(self.output_tokens);
            self.cached_tokens = u.cached_tokens().or(self.cached_tokens);
            if u.total_draft_tokens_count.is_some() {
                self.usage_drafts = Some(u);
            }
        }
        if let Some(t) = c.timings {
            // llama-server: `prompt_n` prompt tokens computed, `cache_n` reused from the
            // cache, `predicted_n` generated
            if self.cached_tokens.is_none() {
                self.cached_tokens = t.cache_n;
            }
            if self.input_tokens.is_none() {
                self.input_tokens = t.prompt_n.map(|p| p + t.cache_n.unwrap_or(0));
            }
            if self.output_tokens.is_none() {
                self.output_tokens = t.predicted_n;
            }
            self.timings = Some(t);
        }
        if let Some(s) = c.stats {
            if let Some(reason) = &s.stop_reason {
                if self.finish.is_none() {
                    self.finish = Some(map_finish(reason));
                }
            }
            self.stats = Some(s);
        }
        if let Some(m) = c.metrics.and_then(|m| m.speculative_decoding) {
            self.vllm_spec = Some(m);
        }
        self.content.push_str(&text);
        self.reasoning.push_str(&reasoning);
        self.token_ids.extend_from_slice(&ids);
        Ok(Piece {
            text,
            reasoning,
            token_ids: ids,
            tool_calls,
            progress: c.prompt_progress,
        })
    }
}

/// The text of a string field, when it is one.
fn text_of(f: &Option<Field<String>>) -> Option<&str> {
    f.as_ref()?.ok().map(String::as_str)
}

/// Maps every server's stop spelling to the contract's reason (`mtp_openai`'s one table).
pub(crate) fn map_finish(s: &str) -> FinishReason {
    oa::read_finish_reason(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mtp_contract::{resolve, Message, Sampling, Speculation};
    use serde_json::json;

    /// The body as the server receives it.
    fn build_body(
        kind: ServerKind,
        endpoint: Endpoint,
        model: &str,
        req: &GenerateRequest,
        stream: bool,
        depth: Option<u32>,
    ) -> Value {
        serde_json::to_value(super::build_body(kind, endpoint, model, req, stream, depth)).unwrap()
    }

    #[test]
    fn images_go_inline_as_image_url_parts() {
        let url = "data:image/png;base64,iVBORw0KGgo=";
        let mut seen = Message::user("what is this?");
        seen.images.push("https://example.invalid/cat.png".into());
        let req = GenerateRequest::new("and this?")
            .messages(vec![seen, Message::assistant("a cat")])
            .image(url);
        check_request(ServerKind::Vllm, &req).unwrap();
        let b = build_body(ServerKind::Vllm, Endpoint::Chat, "m", &req, false, None);
        assert_eq!(
            b["messages"][0]["content"],
            json!([{"type": "image_url", "image_url": {"url": "https://example.invalid/cat.png"}},
                   {"type": "text", "text": "what is this?"}])
        );
        assert_eq!(b["messages"][1]["content"], "a cat");
        assert_eq!(
            b["messages"][2]["content"],
            json!([{"type": "image_url", "image_url": {"url": url}},
                   {"type": "text", "text": "and this?"}])
        );
        // a local path is refused, naming it; so is a raw prompt with images
        let err = check_request(
            ServerKind::LlamaServer,
            &GenerateRequest::new("x").image("/tmp/a.png"),
        )
        .unwrap_err();
        assert!(
            matches!(&err, ProviderError::InvalidRequest { field: "images", message } if message.contains("/tmp/a.png")),
            "{err:?}"
        );
        let err = check_request(
            ServerKind::LlamaServer,
            &GenerateRequest::new("x").image(url).raw(),
        )
        .unwrap_err();
        assert!(matches!(err, ProviderError::Unsupported { .. }), "{err:?}");
    }

    #[test]
    fn chat_body_carries_history_sampling_and_llama_fields() {
        let req = GenerateRequest::new("next")
            .system_prompt("be brief")
            .messages(vec![Message::user("hi"), Message::assistant("hello")])
            .max_output_tokens(16)
            .thinking(false)
            .stop("\n\n")
            .sampling(Sampling {
                top_k: Some(20),
                repetition_penalty: Some(1.1),
                seed: Some(7),
                ..Default::default()
            });
        let b = build_body(
            ServerKind::LlamaServer,
            Endpoint::Chat,
            "m",
            &req,
            true,
            Some(4),
        );
        assert_eq!(b["messages"].as_array().map(Vec::len), Some(4));
        assert_eq!(b["messages"][0]["role"], "system");
        assert_eq!(b["messages"][3]["content"], "next");
        assert_eq!(b["max_tokens"], 16);
        assert_eq!(b["temperature"], 0.0);
        assert_eq!(b["top_k"], 20);
        assert_eq!(b["seed"], 7);
        assert!(b["repeat_penalty"].is_number());
        assert_eq!(b["stream_options"]["include_usage"], true);
        assert_eq!(b["return_progress"], true);
        assert_eq!(b["chat_template_kwargs"]["enable_thinking"], false);
        assert_eq!(b["speculative.n_max"], 4);
        assert_eq!(b["stop"][0], "\n\n");

        let v = build_body(ServerKind::Vllm, Endpoint::Chat, "m", &req, false, Some(4));
        assert!(v.get("speculative.n_max").is_none());
        // llama-server's progress field goes to llama-server only, and only when streaming
        for (kind, stream) in [
            (ServerKind::Vllm, true),
            (ServerKind::OpenAiCompatible, true),
            (ServerKind::LlamaServer, false),
        ] {
            let b = build_body(kind, Endpoint::Chat, "m", &req, stream, None);
            assert!(b.get("return_progress").is_none(), "{kind:?} {stream}");
        }
        assert!(v.get("stream_options").is_none());
        assert!(v["repetition_penalty"].is_number());
        let o = build_body(
            ServerKind::OpenAiCompatible,
            Endpoint::Chat,
            "m",
            &req,
            false,
            None,
        );
        assert!(o.get("chat_template_kwargs").is_none());
    }

    #[test]
    fn json_constraints_travel_as_each_api_spells_them() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let req =
            GenerateRequest::new("x").response_format(ResponseFormat::json_schema(schema.clone()));
        let chat = build_body(ServerKind::Vllm, Endpoint::Chat, "m", &req, false, None);
        assert_eq!(chat["response_format"]["type"], "json_schema");
        assert_eq!(chat["response_format"]["json_schema"]["schema"], schema);
        let native = build_body(
            ServerKind::LlamaServer,
            Endpoint::Native,
            "m",
            &req.clone().raw(),
            false,
            None,
        );
        assert_eq!(native["json_schema"], schema);
        assert!(native.get("response_format").is_none());
        let obj = GenerateRequest::new("x").response_format(ResponseFormat::json_object());
        let b = build_body(ServerKind::Ollama, Endpoint::Chat, "m", &obj, false, None);
        assert_eq!(b["response_format"], json!({"type": "json_object"}));
        let f = ResponseFormat::json_object();
        assert!(constraint_warning_enforced(Some(&f), "{\"a\": 1}", FinishReason::Stop).is_none());
        // the server's own whitespace is its choice
        assert!(
            constraint_warning_enforced(Some(&f), "{\n \"a\":1 }", FinishReason::Stop).is_none()
        );
        assert!(constraint_warning_enforced(Some(&f), "not json", FinishReason::Length).is_none());
        assert!(constraint_warning_enforced(Some(&f), "not json", FinishReason::Stop).is_some());
        assert!(constraint_warning_enforced(None, "not json", FinishReason::Stop).is_none());
        // valid JSON that breaks the schema is caught too, and the warning says where
        let s = ResponseFormat::json_schema(schema);
        assert!(constraint_warning_enforced(Some(&s), r#"{"a": 7}"#, FinishReason::Stop).is_none());
        let w =
            constraint_warning_enforced(Some(&s), r#"{"a": "seven"}"#, FinishReason::Stop).unwrap();
        assert!(w.contains("`json_schema`") && w.contains("`/a`"), "{w}");
        assert!(w.contains("seven"), "{w}");
        // keys in another order than the schema's are still the schema's object
        let two = ResponseFormat::json_schema(json!({"type": "object", "properties": {
            "a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}));
        assert!(
            constraint_warning_enforced(Some(&two), r#"{"b": 1,"a":2}"#, FinishReason::Stop)
                .is_none()
        );
        assert!(
            constraint_warning_enforced(Some(&two), r#"{"b": 1}"#, FinishReason::Stop).is_some()
        );
        // a schema the validator cannot read: the reply is said to be unchecked
        let odd = ResponseFormat::json_schema(json!({"type": "no-such-type"}));
        let w = constraint_warning_enforced(Some(&odd), "{}", FinishReason::Stop).unwrap();
        assert!(w.contains("not checked"), "{w}");
        assert!(
            constraint_warning_enforced(Some(&odd), "{", FinishReason::Stop)
                .unwrap()
                .contains("is not JSON")
        );
    }

    #[test]
    fn regex_and_lark_go_to_vllm_only_and_are_checked() {
        let rx = ResponseFormat::regex("[0-9]{3}-[0-9]{4}");
        let lark = ResponseFormat::grammar("start: \"a\"+");
        for (f, key, text) in [
            (&rx, "regex", "[0-9]{3}-[0-9]{4}"),
            (&lark, "grammar", "start: \"a\"+"),
        ] {
            let req = GenerateRequest::new("x").response_format(f.clone());
            assert!(check_request(ServerKind::Vllm, &req).is_ok());
            for (endpoint, r) in [
                (Endpoint::Chat, req.clone()),
                (Endpoint::Completion, req.clone().raw()),
            ] {
                let b = build_body(ServerKind::Vllm, endpoint, "m", &r, false, None);
                assert_eq!(b["structured_outputs"], json!({ key: text }), "{b}");
                assert!(b.get("response_format").is_none());
            }
            for kind in [
                ServerKind::LlamaServer,
                ServerKind::LmStudio,
                ServerKind::Ollama,
                ServerKind::OpenAiCompatible,
            ] {
                match check_request(kind, &req) {
                    Err(ProviderError::Unsupported { what, .. }) => {
                        assert!(what.contains(f.kind()), "{what}")
                    }
                    other => panic!("{kind:?}: {other:?}"),
                }
            }
        }
        assert!(constraint_warning_enforced(Some(&rx), "555-0199", FinishReason::Stop).is_none());
        let w =
            constraint_warning_enforced(Some(&rx), "call 555-0199", FinishReason::Stop).unwrap();
        assert!(w.contains("`regex`") && w.contains("byte 0"), "{w}");
        let w = constraint_warning_enforced(Some(&rx), "555-01", FinishReason::Stop).unwrap();
        assert!(w.contains("stops before it is complete"), "{w}");
        assert!(constraint_warning_enforced(Some(&lark), "aaaa", FinishReason::Stop).is_none());
        assert!(constraint_warning_enforced(Some(&lark), "aab", FinishReason::Stop).is_some());
        // a cut reply is reported by its finish reason, not as a broken constraint
        assert!(constraint_warning_enforced(Some(&rx), "555-01", FinishReason::Length).is_none());
    }

    /// What an enforcing server's reply gets (no prompted fallback).
    fn constraint_warning_enforced(
        f: Option<&ResponseFormat>,
        content: &str,
        finish: FinishReason,
    ) -> Option<String> {
        constraint_warning(f, false, content, finish)
    }

    #[test]
    fn prompted_fallback_asks_in_the_system_message_and_always_says_so() {
        let rx = ResponseFormat::regex("[0-9]{3}-[0-9]{4}");
        let req = GenerateRequest::new("a phone number")
            .response_format(rx.clone())
            .prompted_fallback(true);
        for kind in [
            ServerKind::LlamaServer,
            ServerKind::LmStudio,
            ServerKind::Ollama,
            ServerKind::OpenAiCompatible,
        ] {
            check_request(kind, &req).unwrap_or_else(|e| panic!("{kind:?}: {e}"));
            assert!(prompted(kind, &req).is_some());
            let b = build_body(kind, Endpoint::Chat, "m", &req, false, None);
            // the first message is the system one, asking for the pattern; nothing is sent
            // that the server would drop
            assert_eq!(b["messages"][0]["role"], "system", "{b}");
            let sys = b["messages"][0]["content"].as_str().unwrap();
            assert!(sys.contains("[0-9]{3}-[0-9]{4}"), "{sys}");
            assert_eq!(b["messages"][1]["content"], "a phone number");
            assert!(b.get("structured_outputs").is_none() && b.get("response_format").is_none());
        }
        // vLLM enforces it: no fallback there
        assert!(prompted(ServerKind::Vllm, &req).is_none());
        let v = build_body(ServerKind::Vllm, Endpoint::Chat, "m", &req, false, None);
        assert_eq!(v["structured_outputs"]["regex"], "[0-9]{3}-[0-9]{4}");
        assert_eq!(v["messages"][0]["role"], "user");
        // an existing system message (the request's, or the history's first) gets the
        // instruction appended: one system message, first
        for r in [
            req.clone().system_prompt("Be brief."),
            req.clone()
                .messages(vec![Message::system("Be brief."), Message::user("hi")]),
        ] {
            let b = build_body(
                ServerKind::LlamaServer,
                Endpoint::Chat,
                "m",
                &r,
                false,
                None,
            );
            let msgs = b["messages"].as_array().unwrap();
            assert_eq!(
                msgs.iter().filter(|m| m["role"] == "system").count(),
                1,
                "{b}"
            );
            let sys = msgs[0]["content"].as_str().unwrap();
            assert!(
                sys.starts_with("Be brief.\n\n") && sys.contains("[0-9]{3}"),
                "{sys}"
            );
        }
        // a raw prompt has no system message to ask in
        match check_request(ServerKind::LlamaServer, &req.clone().raw()) {
            Err(ProviderError::InvalidRequest { field, .. }) => {
                assert_eq!(field, "prompted_fallback")
            }
            other => panic!("{other:?}"),
        }
        // the warning is always there: asked for, not enforced, and how the reply stands
        let ok = constraint_warning(Some(&rx), true, "555-0199", FinishReason::Stop).unwrap();
        assert!(
            ok.contains("not enforced") && ok.contains("follows"),
            "{ok}"
        );
        let bad = constraint_warning(Some(&rx), true, "call 555", FinishReason::Stop).unwrap();
        assert!(
            bad.contains("not enforced") && bad.contains("byte 0"),
            "{bad}"
        );
        let cut = constraint_warning(Some(&rx), true, "555", FinishReason::Length).unwrap();
        assert!(cut.contains("not checked"), "{cut}");
    }

    #[test]
    fn native_body() {
        let req = GenerateRequest::new("raw text").raw().max_output_tokens(8);
        let b = build_body(
            ServerKind::LlamaServer,
            Endpoint::Native,
            "m",
            &req,
            false,
            Some(0),
        );
        assert_eq!(b["prompt"], "raw text");
        assert_eq!(b["n_predict"], 8);
        assert_eq!(b["return_tokens"], true);
        assert_eq!(b["speculative.n_max"], 0);
        assert!(b.get("model").is_none());
    }

    #[test]
    fn requested_depths() {
        let on = Speculation::native_mtp().with_num_draft_tokens(5).unwrap();
        let cases = [
            (ServerKind::LlamaServer, Some(on.clone()), Some(5)),
            (
                ServerKind::LlamaServer,
                Some(Speculation::native_mtp()),
                None,
            ),
            (ServerKind::LlamaServer, Some(Speculation::off()), Some(0)),
            (ServerKind::LlamaServer, None, Some(0)),
            (ServerKind::Vllm, Some(on), None),
        ];
        for (kind, spec, want) in cases {
            let r = resolve(None, spec.as_ref());
            assert_eq!(requested_depth(kind, &r), want, "{kind} {spec:?}");
        }
    }

    #[test]
    fn request_checks() {
        let bad = [
            GenerateRequest::new("x").raw().system_prompt("s"),
            GenerateRequest::new("x")
                .raw()
                .messages(vec![Message::user("a")]),
            GenerateRequest::new(""),
            GenerateRequest::new("x").messages(vec![Message {
                images: vec!["a.png".into()],
                ..Message::user("look")
            }]),
        ];
        for r in bad {
            assert!(check_request(ServerKind::LlamaServer, &r).is_err(), "{r:?}");
        }
        assert!(check_request(ServerKind::Vllm, &GenerateRequest::new("x").raw()).is_ok());
    }

    #[test]
    fn finish_reasons() {
        let cases = [
            ("stop", FinishReason::Stop),
            ("eos", FinishReason::Stop),
            ("word", FinishReason::Stop),
            ("eosFound", FinishReason::Stop),
            ("length", FinishReason::Length),
            ("limit", FinishReason::Length),
            ("maxPredictedTokensReached", FinishReason::Length),
            ("tool_calls", FinishReason::ToolCalls),
        ];
        for (s, want) in cases {
            assert_eq!(map_finish(s), want, "{s}");
        }
    }

    #[test]
    fn odd_shapes_are_ignored_not_fatal() {
        let odd = [
            json!(null),
            json!([1, 2, 3]),
            json!({"choices": null}),
            json!({"choices": []}),
            json!({"choices": [{"delta": {"content": 5}}]}),
            json!({"choices": [{"finish_reason": 3}]}),
            json!({"content": 7, "tokens": "no"}),
            json!({"content": "x", "tokens": [-1, 1.5, "a", 9]}),
            json!({"usage": "lots", "timings": [1], "stats": 2, "metrics": {"speculative_decoding": 1}}),
            json!({"usage": {"prompt_tokens": -4, "completion_tokens": 1e300}}),
        ];
        let mut a = Accum::default();
        for v in odd {
            assert!(a.absorb(&v).is_ok(), "{v}");
        }
        assert_eq!(a.content, "x");
        assert_eq!(a.token_ids, vec![9]);
        assert_eq!(a.input_tokens, None);
        assert!(a.timings.is_none() && a.stats.is_none() && a.vllm_spec.is_none());
    }

    /// llama-server (`--reasoning-format deepseek`, the default for thinking templates), vLLM
    /// (`--reasoning-parser`) and LM Studio stream reasoning as `reasoning_content`; Ollama's
    /// OpenAI endpoint as `reasoning`. Both land in the reasoning, never in the answer.
    #[test]
    fn reasoning_fields_are_read_apart_from_the_answer() {
        let mut a = Accum::default();
        let p = a
            .absorb(&json!({"choices":[{"delta":{"reasoning_content":"think "}}]}))
            .unwrap();
        assert_eq!((p.text.as_str(), p.reasoning.as_str()), ("", "think "));
        a.absorb(&json!({"choices":[{"delta":{"reasoning":"more"}}]}))
            .unwrap();
        a.absorb(&json!({"choices":[{"delta":{"content":"answer"}}]}))
            .unwrap();
        assert_eq!(a.reasoning, "think more");
        assert_eq!(a.content, "answer");
        let mut b = Accum::default();
        b.absorb(&json!({"choices":[{"message":{"content":"4","reasoning_content":"2+2"}}]}))
            .unwrap();
        assert_eq!((b.content.as_str(), b.reasoning.as_str()), ("4", "2+2"));
    }

    /// History with tool calls and reasoning goes out in the OpenAI shape: arguments as a JSON
    /// string, reasoning as `reasoning_content`; tools and template kwargs are passed on.
    #[test]
    fn chat_bodies_carry_tool_calls_tools_and_template_kwargs() {
        let call = mtp_contract::ToolCall::function("c1", "f", json!({"x": 1}));
        let req = GenerateRequest::new("next")
            .messages(vec![
                Message::user("q"),
                Message::assistant("")
                    .with_reasoning("r")
                    .with_tool_calls(vec![call]),
                Message::tool("c1", "1"),
            ])
            .tools(vec![json!({"type": "function", "function": {"name": "f"}})])
            .chat_template_kwarg("reasoning_effort", json!("low"))
            .thinking(false);
        let b = build_body(ServerKind::Vllm, Endpoint::Chat, "m", &req, false, None);
        let m = &b["messages"];
        assert_eq!(m[1]["tool_calls"][0]["function"]["arguments"], "{\"x\":1}");
        assert_eq!(m[1]["reasoning_content"], "r");
        assert_eq!(m[2]["tool_call_id"], "c1");
        assert_eq!(b["tools"][0]["function"]["name"], "f");
        assert_eq!(
            b["chat_template_kwargs"],
            json!({"reasoning_effort": "low", "enable_thinking": false})
        );
    }

    fn weather_tools() -> Vec<Value> {
        vec![
            json!({"type": "function", "function": {"name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}),
            json!({"type": "function", "function": {"name": "get_time", "parameters": {}}}),
        ]
    }

    /// What each server kind is sent for each tool choice: `auto` is left to the server's
    /// default; a named function goes to llama-server and LM Studio (string-only
    /// `tool_choice`) as `required` over that tool; llama-server always gets
    /// `parallel_tool_calls` (its default is false); `none` shows no tools.
    #[test]
    fn tool_fields_are_sent_as_each_server_reads_them() {
        use ServerKind::*;
        let base = GenerateRequest::new("weather in Paris?").tools(weather_tools());
        let named = ToolChoice::Function("get_time".into());
        // (kind, choice, parallel, tools sent, tool_choice sent, parallel_tool_calls sent)
        let cases: Vec<(ServerKind, ToolChoice, Option<bool>, usize, Value, Value)> = vec![
            (Vllm, ToolChoice::Auto, None, 2, Value::Null, Value::Null),
            (
                Vllm,
                ToolChoice::Required,
                Some(false),
                2,
                json!("required"),
                json!(false),
            ),
            (Vllm, named.clone(), None, 2, named.to_openai(), Value::Null),
            (
                OpenAiCompatible,
                named.clone(),
                Some(true),
                2,
                named.to_openai(),
                json!(true),
            ),
            (
                LlamaServer,
                ToolChoice::Auto,
                None,
                2,
                Value::Null,
                json!(true),
            ),
            (
                LlamaServer,
                ToolChoice::Required,
                Some(false),
                2,
                json!("required"),
                json!(false),
            ),
            (
                LlamaServer,
                named.clone(),
                None,
                1,
                json!("required"),
                json!(true),
            ),
            (
                LmStudio,
                named.clone(),
                None,
                1,
                json!("required"),
                Value::Null,
            ),
            (
                LmStudio,
                ToolChoice::Required,
                None,
                2,
                json!("required"),
                Value::Null,
            ),
            (
                Ollama,
                ToolChoice::Auto,
                Some(false),
                2,
                Value::Null,
                json!(false),
            ),
        ];
        for (kind, choice, parallel, n_tools, want_choice, want_parallel) in cases {
            let mut req = base.clone().tool_choice(choice.clone());
            req.parallel_tool_calls = parallel;
            check_request(kind, &req).unwrap_or_else(|e| panic!("{kind} {choice:?}: {e}"));
            let b = build_body(kind, Endpoint::Chat, "m", &req, false, None);
            let what = format!("{kind} {choice:?}: {b}");
            assert_eq!(b["tools"].as_array().map(Vec::len), Some(n_tools), "{what}");
            assert_eq!(
                b.get("tool_choice").cloned().unwrap_or(Value::Null),
                want_choice,
                "{what}"
            );
            assert_eq!(
                b.get("parallel_tool_calls").cloned().unwrap_or(Value::Null),
                want_parallel,
                "{what}"
            );
            if n_tools == 1 {
                assert_eq!(b["tools"][0]["function"]["name"], "get_time", "{what}");
            }
        }
        // `none`: the tools are not shown, and nothing about them is sent
        for kind in ServerKind::ALL {
            let req = base.clone().tool_choice(ToolChoice::None);
            check_request(kind, &req).unwrap();
            let b = build_body(kind, Endpoint::Chat, "m", &req, false, None);
            for key in ["tools", "tool_choice", "parallel_tool_calls"] {
                assert!(b.get(key).is_none(), "{kind}: {b}");
            }
        }
        // the completion endpoints take no tools
        let raw = base.clone().raw();
        for (kind, endpoint) in [
            (Vllm, Endpoint::Completion),
            (LlamaServer, Endpoint::Native),
        ] {
            let b = build_body(kind, endpoint, "m", &raw, false, None);
            assert!(b.get("tools").is_none(), "{b}");
        }
    }

    /// A forced call a server cannot be asked for is refused, naming `tool_choice`.
    #[test]
    fn forced_calls_a_server_cannot_take_are_refused() {
        let base = GenerateRequest::new("weather?").tools(weather_tools());
        for choice in [
            ToolChoice::Required,
            ToolChoice::Function("get_weather".into()),
        ] {
            let req = base.clone().tool_choice(choice.clone());
            match check_request(ServerKind::Ollama, &req) {
                Err(ProviderError::InvalidRequest { field, message }) => {
                    assert_eq!(field, "tool_choice");
                    assert!(message.contains("Ollama"), "{message}");
                }
                other => panic!("{choice:?}: {other:?}"),
            }
            for kind in ServerKind::ALL {
                match check_request(kind, &req.clone().raw()) {
                    Err(ProviderError::InvalidRequest { field, .. }) => {
                        assert_eq!(field, "tool_choice")
                    }
                    other => panic!("{kind} raw {choice:?}: {other:?}"),
                }
            }
        }
    }

    #[test]
    fn tool_calls_are_absorbed_whole_and_streamed() {
        let mut a = Accum::default();
        let p = a
            .absorb(&json!({"choices": [{"index": 0, "finish_reason": "tool_calls",
                "message": {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "c1", "type": "function",
                     "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]}}]}))
            .unwrap();
        assert_eq!((p.text.as_str(), p.tool_calls.len()), ("", 1));
        assert_eq!(a.finish, Some(FinishReason::ToolCalls));
        assert_eq!(
            a.tools.calls()[0].function.arguments,
            "{\"city\": \"Paris\"}"
        );
        let mut s = Accum::default();
        s.absorb(&json!({"choices": [{"index": 0, "delta": {"content": "Let me check."}}]}))
            .unwrap();
        let p = s
            .absorb(&json!({"choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": 0, "id": "c1", "type": "function",
                 "function": {"name": "get_weather", "arguments": ""}}]}}]}))
            .unwrap();
        assert_eq!(p.tool_calls[0].name.as_deref(), Some("get_weather"));
        let e = s
            .absorb(&json!({"choices": [{"index": 0, "delta": {"tool_calls": [
                {"function": {"arguments": "{"}}]}}]}))
            .unwrap_err();
        assert!(
            matches!(&e, Absorb::Malformed(m) if m.contains("delta.tool_calls[0].index")),
            "{e:?}"
        );
        assert_eq!(s.content, "Let me check.");
    }

    /// llama-server's `prompt_progress` chunks (no choices; the native endpoint's with empty
    /// content) are read as the prompt's progress and add no text; a malformed one is
    /// ignored like any other field that is not what it should be.
    #[test]
    fn absorbs_prompt_progress() {
        let mut a = Accum::default();
        let want = mtp_contract::PromptProgress {
            total: 237,
            cache: 230,
            processed: 237,
            time_ms: 30,
        };
        let progress = json!({"total": 237, "cache": 230, "processed": 237, "time_ms": 30});
        for chunk in [
            json!({"choices": [], "prompt_progress": progress.clone()}),
            json!({"content": "", "stop": false, "prompt_progress": progress.clone()}),
        ] {
            let p = a.absorb(&chunk).unwrap();
            assert_eq!(p.progress, Some(want));
            assert!(p.text.is_empty() && p.token_ids.is_empty());
        }
        let p = a
            .absorb(&json!({"choices": [], "prompt_progress": {"total": "many"}}))
            .unwrap();
        assert_eq!(p.progress, None);
        assert_eq!(a.content, "");
    }

    #[test]
    fn absorbs_errors_and_usage() {
        let mut a = Accum::default();
        assert_eq!(
            a.absorb(&json!({"error": {"message": "boom"}})).err(),
            Some(Absorb::Server("boom".into()))
        );
        let p = a
            .absorb(&json!({"choices":[{"delta":{"content":"hi"},"finish_reason":null}]}))
            .unwrap();
        assert_eq!(p.text, "hi");
        a.absorb(&json!({"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":1}}}))
            .unwrap();
        assert_eq!(
            (a.input_tokens, a.output_tokens, a.cached_tokens),
            (Some(3), Some(2), Some(1))
        );
    }
}
