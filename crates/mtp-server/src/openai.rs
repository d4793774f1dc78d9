//! OpenAI request bodies into the contract's [`GenerateRequest`], and responses back.
//!
//! Fields are read one by one from the JSON object so that every refusal names the field at
//! fault. Fields no local runtime acts on and that change nothing when ignored (`user`,
//! `metadata`, `store`, `service_tier`) are accepted and ignored, as vLLM and llama-server do;
//! `tools`, `tool_choice` (`auto`, `none`, `required`, a named function: the last two enforced
//! by the runtime's grammar) and `parallel_tool_calls` go to the runtime, and its tool calls
//! come back as `message.tool_calls` / `delta.tool_calls`; fields that would change the answer
//! and that this server cannot honour (`n` > 1, `logprobs`, a GBNF `grammar`) are refused with 400,
//! and a `response_format` the runtime cannot enforce is refused by the runtime,
//! never dropped silently.

use mtp_contract::{
    FinishReason, GenerateRequest, GenerateResponse, Message, ResponseFormat, Role, Sampling,
    Speculation, SpeculationReport, ToolCall, ToolCallDelta, ToolChoice,
};
use serde_json::{json, Map, Value};

use crate::error::ApiError;

/// What a request asked for besides the generation itself.
#[derive(Debug, Clone, PartialEq)]
pub struct Parsed {
    /// The contract's request.
    pub request: GenerateRequest,
    /// `stream: true`.
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// llama-server's `return_tokens`: token ids in its native answers.
    pub return_tokens: bool,
}

/// Caps on what one request may hold. Each bounds work a client could otherwise make the
/// server do for free (30,000 stop strings searched after every token, a million messages
/// rendered); a request over one is a 400 naming the cap and the `mtp serve` flag that raises
/// it. The defaults are far above what OpenAI's own API accepts (4 stop strings, 128 tools).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Stop strings (`--max-stop`).
    pub max_stop: usize,
    /// Bytes of one stop string (`--max-stop-bytes`).
    pub max_stop_bytes: usize,
    /// Messages of a chat (`--max-messages`).
    pub max_messages: usize,
    /// Content parts of one message (`--max-content-parts`).
    pub max_content_parts: usize,
    /// Tools (`--max-tools`).
    pub max_tools: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_stop: 64,
            max_stop_bytes: 1024,
            max_messages: 4096,
            max_content_parts: 256,
            max_tools: 512,
        }
    }
}

/// The two endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completion,
    /// llama-server's native `/completion` (`content`, `stop`, `n_predict`), for its clients.
    Native,
}

impl Endpoint {
    /// The response `object`.
    pub fn object(self, chunk: bool) -> &'static str {
        match (self, chunk) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Completion, _) => "text_completion",
            (Endpoint::Native, _) => "completion",
        }
    }

    /// The id prefix.
    pub fn id_prefix(self) -> &'static str {
        match self {
            Endpoint::Chat => "chatcmpl-",
            Endpoint::Completion | Endpoint::Native => "cmpl-",
        }
    }
}

fn opt<'a>(o: &'a Map<String, Value>, k: &str) -> Option<&'a Value> {
    o.get(k).filter(|v| !v.is_null())
}

fn f32_field(o: &Map<String, Value>, k: &str) -> Result<Option<f32>, ApiError> {
    match opt(o, k) {
        None => Ok(None),
        Some(v) => v
            .as_f64()
            .filter(|x| x.is_finite())
            .map(|x| Some(x as f32))
            .ok_or_else(|| ApiError::invalid(k, format!("`{k}` must be a number, got {v}"))),
    }
}

fn u64_field(o: &Map<String, Value>, k: &str) -> Result<Option<u64>, ApiError> {
    match opt(o, k) {
        None => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| {
            ApiError::invalid(k, format!("`{k}` must be a non-negative integer, got {v}"))
        }),
    }
}

fn u32_field(o: &Map<String, Value>, k: &str) -> Result<Option<u32>, ApiError> {
    u64_field(o, k)?
        .map(|x| {
            u32::try_from(x).map_err(|_| ApiError::invalid(k, format!("`{k}` is too large: {x}")))
        })
        .transpose()
}

fn bool_field(o: &Map<String, Value>, k: &str) -> Result<Option<bool>, ApiError> {
    match opt(o, k) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(ApiError::invalid(
            k,
            format!("`{k}` must be true or false, got {v}"),
        )),
    }
}

/// Reads the body of either endpoint, within `limits`.
pub fn parse(endpoint: Endpoint, body: &Value, limits: &Limits) -> Result<Parsed, ApiError> {
    let Some(o) = body.as_object() else {
        return Err(ApiError::invalid(
            "body",
            "the request body must be a JSON object",
        ));
    };
    let mut request = match endpoint {
        Endpoint::Chat => chat_request(o, limits)?,
        Endpoint::Completion | Endpoint::Native => completion_request(o)?,
    };
    request.max_output_tokens = match (
        u32_field(o, "max_completion_tokens")?,
        u32_field(o, "max_tokens")?,
    ) {
        (Some(n), _) | (None, Some(n)) => Some(n),
        (None, None) => None,
    };
    if endpoint == Endpoint::Native {
        // llama-server: n_predict -1 is "until the context is full"
        match opt(o, "n_predict") {
            None => {}
            Some(v) if v.as_i64() == Some(-1) => request.max_output_tokens = None,
            Some(_) => request.max_output_tokens = u32_field(o, "n_predict")?,
        }
    }
    request.sampling = sampling(o)?;
    request.stop = match opt(o, "stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) if a.len() > limits.max_stop => {
            return Err(ApiError::over_limit(
                "stop",
                "stop strings",
                a.len(),
                limits.max_stop,
                "--max-stop",
            ))
        }
        Some(Value::Array(a)) => a
            .iter()
            .map(|s| {
                s.as_str().map(str::to_string).ok_or_else(|| {
                    ApiError::invalid("stop", format!("stop sequences must be strings, got {s}"))
                })
            })
            .collect::<Result<_, _>>()?,
        Some(v) => {
            return Err(ApiError::invalid(
                "stop",
                format!("`stop` must be a string or a list of strings, got {v}"),
            ))
        }
    };
    if let Some(long) = request
        .stop
        .iter()
        .find(|s| s.len() > limits.max_stop_bytes)
    {
        return Err(ApiError::over_limit(
            "stop",
            "bytes in one stop string",
            long.len(),
            limits.max_stop_bytes,
            "--max-stop-bytes",
        ));
    }
    request.speculation = speculation(o)?;
    if let Some(n) = u64_field(o, "n")? {
        if n != 1 {
            return Err(ApiError::unsupported(
                "n",
                format!("this server returns one choice per request (`n` = 1), not {n}"),
            ));
        }
    }
    if bool_field(o, "logprobs")? == Some(true) || opt(o, "top_logprobs").is_some() {
        return Err(ApiError::unsupported(
            "logprobs",
            "log probabilities are not returned by this server",
        ));
    }
    if bool_field(o, "echo")? == Some(true) {
        return Err(ApiError::unsupported(
            "echo",
            "`echo` is not supported; the prompt is not repeated in the answer",
        ));
    }
    request.response_format = response_format(o)?;
    // the contract's extension: a runtime behind the server that cannot enforce the
    // constraint asks for it in the prompt instead of refusing (its warnings say so)
    request.prompted_fallback = match opt(o, "prompted_fallback") {
        None => false,
        Some(v) => v.as_bool().ok_or_else(|| {
            ApiError::invalid(
                "prompted_fallback",
                format!("`prompted_fallback` must be true or false, got {v}"),
            )
        })?,
    };
    let stream = bool_field(o, "stream")?.unwrap_or(false);
    let include_usage = match opt(o, "stream_options") {
        None => false,
        Some(Value::Object(so)) => bool_field(so, "include_usage")
            .map_err(|e| ApiError {
                param: Some("stream_options.include_usage".into()),
                ..e
            })?
            .unwrap_or(false),
        Some(v) => {
            return Err(ApiError::invalid(
                "stream_options",
                format!("`stream_options` must be an object, got {v}"),
            ))
        }
    };
    let return_tokens = bool_field(o, "return_tokens")?.unwrap_or(false);
    request
        .validate()
        .map_err(|e| ApiError::from_provider(&e))?;
    Ok(Parsed {
        request,
        stream,
        include_usage,
        return_tokens,
    })
}

/// The reply's constraint: OpenAI's `response_format` (with our `regex` and `grammar` types),
/// llama-server's `json_schema`, vLLM's `structured_outputs` (`json`, `regex`, `choice`, Lark
/// `grammar`) or its older `guided_json` / `guided_regex` / `guided_choice`. A request naming
/// two of them is refused, as are GBNF grammars (llama-server's `grammar`, `guided_grammar`:
/// a Lark grammar goes in `response_format` or `structured_outputs.grammar`) and the
/// `structured_outputs` keys that would change the answer and are not taken; nothing is
/// dropped.
fn response_format(o: &Map<String, Value>) -> Result<Option<ResponseFormat>, ApiError> {
    const FIELDS: [&str; 6] = [
        "response_format",
        "json_schema",
        "structured_outputs",
        "guided_json",
        "guided_regex",
        "guided_choice",
    ];
    let given: Vec<&str> = FIELDS
        .into_iter()
        .filter(|k| {
            // `response_format: {"type": "text"}` asks for no constraint
            opt(o, k)
                .is_some_and(|v| *k != "response_format" || v.get("type") != Some(&json!("text")))
        })
        .collect();
    if given.len() > 1 {
        return Err(ApiError::invalid(
            given[1],
            format!(
                "a request takes one constraint; this one names `{}`",
                given.join("`, `")
            ),
        ));
    }
    for field in ["grammar", "guided_grammar"] {
        if opt(o, field).is_some() {
            return Err(ApiError::unsupported(
                field,
                "GBNF/EBNF grammars are not taken; send a Lark grammar as \
                 `response_format: {\"type\": \"grammar\", \"grammar\": ...}` or \
                 `structured_outputs: {\"grammar\": ...}`",
            ));
        }
    }
    let checked = |f: ResponseFormat| -> Result<Option<ResponseFormat>, ApiError> {
        f.validate()
            .map_err(|e| ApiError::from_provider(&e))
            .map(|()| Some(f))
    };
    let text = |field: &str, v: &Value| -> Result<String, ApiError> {
        v.as_str()
            .map(str::to_string)
            .ok_or_else(|| ApiError::invalid(field, format!("`{field}` must be a string, got {v}")))
    };
    let Some(&field) = given.first() else {
        return Ok(None);
    };
    let v = &o[field];
    match field {
        "response_format" => ResponseFormat::from_json(v)
            .map(Some)
            .map_err(|e| ApiError::from_provider(&e)),
        "json_schema" | "guided_json" => checked(ResponseFormat::json_schema(v.clone())),
        "guided_regex" => checked(ResponseFormat::regex(text(field, v)?)),
        "guided_choice" => checked(choice_regex(field, v)?),
        _ => {
            let Some(so) = v.as_object() else {
                return Err(ApiError::invalid(
                    field,
                    format!("`structured_outputs` must be an object, got {v}"),
                ));
            };
            let set: Vec<(&String, &Value)> = so.iter().filter(|(_, v)| !v.is_null()).collect();
            let [(key, v)] = set.as_slice() else {
                return Err(ApiError::invalid(
                    field,
                    format!(
                        "`structured_outputs` takes exactly one of `json`, `regex`, `choice`, \
                         `grammar`; got {}",
                        if set.is_empty() {
                            "none".to_string()
                        } else {
                            set.iter()
                                .map(|(k, _)| format!("`{k}`"))
                                .collect::<Vec<_>>()
                                .join(", ")
                        }
                    ),
                ));
            };
            let at = format!("structured_outputs.{key}");
            match key.as_str() {
                "json" => checked(ResponseFormat::json_schema(match v {
                    // vLLM also takes the schema as a JSON string
                    Value::String(s) => serde_json::from_str(s).map_err(|e| {
                        ApiError::invalid(&at, format!("`{at}` is not a JSON schema: {e}"))
                    })?,
                    other => (*other).clone(),
                })),
                "json_object" if **v == json!(true) => checked(ResponseFormat::json_object()),
                "regex" => checked(ResponseFormat::regex(text(&at, v)?)),
                "grammar" => checked(ResponseFormat::grammar(text(&at, v)?)),
                "choice" => checked(choice_regex(&at, v)?),
                _ => Err(ApiError::unsupported(
                    &at,
                    format!(
                        "`{at}` is not taken (the constraints taken are `json`, `regex`, \
                         `choice` and Lark `grammar`)"
                    ),
                )),
            }
        }
    }
}

/// vLLM's `choice` (a list of strings) as the regex matching exactly one of them.
fn choice_regex(field: &str, v: &Value) -> Result<ResponseFormat, ApiError> {
    let bad = || {
        ApiError::invalid(
            field,
            format!("`{field}` must be a non-empty list of strings, got {v}"),
        )
    };
    let items = v.as_array().filter(|a| !a.is_empty()).ok_or_else(bad)?;
    let mut alts = Vec::with_capacity(items.len());
    for item in items {
        let s = item.as_str().ok_or_else(bad)?;
        let mut escaped = String::with_capacity(s.len());
        for c in s.chars() {
            if "\\.+*?()|[]{}^$#&-~".contains(c) {
                escaped.push('\\');
            }
            escaped.push(c);
        }
        alts.push(escaped);
    }
    Ok(ResponseFormat::regex(format!("({})", alts.join("|"))))
}

/// The per-request speculation: our `speculation` block (the contract's, same validation), or
/// llama-server's `speculative.n_max` (0: off; n: depth n) so llama-server clients keep working.
fn speculation(o: &Map<String, Value>) -> Result<Option<Speculation>, ApiError> {
    if let Some(v) = opt(o, "speculation") {
        return Speculation::from_json(v).map(Some).map_err(|e| ApiError {
            code: Some("invalid_speculation".into()),
            ..ApiError::invalid("speculation", format!("invalid speculation block: {e}"))
        });
    }
    match u32_field(o, "speculative.n_max")? {
        None => Ok(None),
        Some(0) => Ok(Some(Speculation::off())),
        Some(n) => Speculation::depth(n).map(Some).map_err(|e| {
            ApiError::invalid(
                "speculative.n_max",
                format!("invalid speculation block: {e}"),
            )
        }),
    }
}

fn sampling(o: &Map<String, Value>) -> Result<Sampling, ApiError> {
    let logit_bias = match opt(o, "logit_bias") {
        None => Default::default(),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| {
                let id = k.parse::<u32>().map_err(|_| {
                    ApiError::invalid("logit_bias", format!("`{k}` is not a token id"))
                })?;
                let b = v.as_f64().filter(|x| x.is_finite()).ok_or_else(|| {
                    ApiError::invalid("logit_bias", format!("the bias of {k} is not a number"))
                })?;
                Ok((id, b as f32))
            })
            .collect::<Result<_, ApiError>>()?,
        Some(v) => {
            return Err(ApiError::invalid(
                "logit_bias",
                format!("`logit_bias` must be an object of token id to bias, got {v}"),
            ))
        }
    };
    Ok(Sampling {
        temperature: f32_field(o, "temperature")?,
        top_p: f32_field(o, "top_p")?,
        top_k: u32_field(o, "top_k")?,
        min_p: f32_field(o, "min_p")?,
        seed: u64_field(o, "seed")?,
        repetition_penalty: match f32_field(o, "repetition_penalty")? {
            Some(x) => Some(x),
            None => f32_field(o, "repeat_penalty")?,
        },
        presence_penalty: f32_field(o, "presence_penalty")?,
        frequency_penalty: f32_field(o, "frequency_penalty")?,
        logit_bias,
    })
}

fn completion_request(o: &Map<String, Value>) -> Result<GenerateRequest, ApiError> {
    let prompt = match opt(o, "prompt") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
            a[0].as_str().unwrap_or_default().to_string()
        }
        Some(Value::Array(_)) => {
            return Err(ApiError::unsupported(
                "prompt",
                "one prompt per request: a string, or a list holding one string (token-id \
                 prompts and batches of prompts are not accepted)",
            ))
        }
        None => return Err(ApiError::invalid("prompt", "`prompt` is required")),
        Some(v) => {
            return Err(ApiError::invalid(
                "prompt",
                format!("`prompt` must be a string, got {v}"),
            ))
        }
    };
    if opt(o, "suffix").is_some() {
        return Err(ApiError::unsupported(
            "suffix",
            "fill-in-the-middle (`suffix`) is not supported",
        ));
    }
    Ok(GenerateRequest::new(prompt).raw())
}

fn chat_request(o: &Map<String, Value>, limits: &Limits) -> Result<GenerateRequest, ApiError> {
    let Some(Value::Array(raw)) = opt(o, "messages") else {
        return Err(ApiError::invalid(
            "messages",
            "`messages` is required: a list of {\"role\", \"content\"} objects",
        ));
    };
    if raw.is_empty() {
        return Err(ApiError::invalid("messages", "`messages` is empty"));
    }
    if raw.len() > limits.max_messages {
        return Err(ApiError::over_limit(
            "messages",
            "messages",
            raw.len(),
            limits.max_messages,
            "--max-messages",
        ));
    }
    let messages = raw
        .iter()
        .enumerate()
        .map(|(i, m)| message(i, m, limits))
        .collect::<Result<Vec<_>, _>>()?;
    // the whole conversation is the history; the contract renders system, history, then a
    // non-empty prompt, so an empty prompt leaves the conversation exactly as sent
    let mut r = GenerateRequest::new("").messages(messages);
    if let Some(v) = opt(o, "tool_choice") {
        r.tool_choice =
            ToolChoice::from_openai(v).map_err(|m| ApiError::invalid("tool_choice", m))?;
    }
    match opt(o, "parallel_tool_calls") {
        None => {}
        Some(Value::Bool(b)) => r.parallel_tool_calls = Some(*b),
        Some(v) => {
            return Err(ApiError::invalid(
                "parallel_tool_calls",
                format!("`parallel_tool_calls` must be a boolean, got {v}"),
            ))
        }
    }
    match opt(o, "tools") {
        None => {}
        Some(Value::Array(t)) if t.len() > limits.max_tools => {
            return Err(ApiError::over_limit(
                "tools",
                "tools",
                t.len(),
                limits.max_tools,
                "--max-tools",
            ))
        }
        Some(Value::Array(t)) => r.tools = t.clone(),
        Some(v) => {
            return Err(ApiError::invalid(
                "tools",
                format!("`tools` must be a list, got {v}"),
            ))
        }
    }
    match opt(o, "chat_template_kwargs") {
        None => {}
        Some(Value::Object(kw)) => {
            for (k, v) in kw {
                if k == "enable_thinking" {
                    r.thinking = Some(v.as_bool().ok_or_else(|| {
                        ApiError::invalid(
                            "chat_template_kwargs",
                            format!("`enable_thinking` must be true or false, got {v}"),
                        )
                    })?);
                } else {
                    r.chat_template_kwargs.insert(k.clone(), v.clone());
                }
            }
        }
        Some(v) => {
            return Err(ApiError::invalid(
                "chat_template_kwargs",
                format!("`chat_template_kwargs` must be an object, got {v}"),
            ))
        }
    }
    if let Some(k) = opt(o, "prompt_cache_key") {
        r.prompt_cache_key = Some(
            k.as_str()
                .ok_or_else(|| ApiError::invalid("prompt_cache_key", "must be a string"))?
                .to_string(),
        );
    }
    Ok(r)
}

/// One OpenAI message: `content` as a string, `null` or a list of parts (`text`, `image_url`).
fn message(i: usize, m: &Value, limits: &Limits) -> Result<Message, ApiError> {
    let param = format!("messages[{i}]");
    let bad = |what: String| ApiError::invalid(&param, format!("message {i}: {what}"));
    let Some(o) = m.as_object() else {
        return Err(bad(format!("must be an object, got {m}")));
    };
    let role = match o.get("role").and_then(Value::as_str) {
        Some("system") | Some("developer") => Role::System,
        Some("user") => Role::User,
        Some("assistant") => Role::Assistant,
        Some("tool") => Role::Tool,
        Some(r) => return Err(bad(format!("unknown role `{r}`"))),
        None => return Err(bad("`role` is missing".into())),
    };
    let mut images = Vec::new();
    let content = match opt(o, "content") {
        None => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) if parts.len() > limits.max_content_parts => {
            return Err(ApiError::over_limit(
                &param,
                "content parts in one message",
                parts.len(),
                limits.max_content_parts,
                "--max-content-parts",
            ))
        }
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for p in parts {
                match p.get("type").and_then(Value::as_str) {
                    Some("text") => text.push_str(
                        p.get("text")
                            .and_then(Value::as_str)
                            .ok_or_else(|| bad("a text part has no `text`".into()))?,
                    ),
                    Some("image_url") => {
                        let url = p
                            .pointer("/image_url/url")
                            .or_else(|| p.get("image_url"))
                            .and_then(Value::as_str)
                            .ok_or_else(|| bad("an image part has no `image_url.url`".into()))?;
                        // a path or file:// URL would read the server's own files, and an
                        // http(s) URL would make it fetch for the client: only inline images
                        if mtp_contract::ImageRef::of(url) != mtp_contract::ImageRef::Inline {
                            return Err(bad(format!(
                                "image_url `{}` is not a data: URL; the server takes images \
                                 inline only (`data:image/png;base64,...`), never from its \
                                 own files or the network",
                                url.chars().take(64).collect::<String>()
                            )));
                        }
                        images.push(url.to_string());
                    }
                    other => {
                        return Err(bad(format!(
                            "content part type {} is not supported (text, image_url)",
                            other.map(|s| format!("`{s}`")).unwrap_or("(none)".into())
                        )))
                    }
                }
            }
            text
        }
        Some(v) => return Err(bad(format!("`content` must be a string or parts, got {v}"))),
    };
    let mut msg = Message::new(role, content);
    msg.images = images;
    if let Some(r) = opt(o, "reasoning_content").or_else(|| opt(o, "reasoning")) {
        msg.reasoning_content = Some(
            r.as_str()
                .ok_or_else(|| bad("`reasoning_content` must be a string".into()))?
                .to_string(),
        );
    }
    if let Some(calls) = opt(o, "tool_calls") {
        let calls: Vec<ToolCall> = serde_json::from_value(calls.clone())
            .map_err(|e| bad(format!("`tool_calls` is malformed: {e}")))?;
        msg.tool_calls = calls;
    }
    for (k, slot) in [
        ("tool_call_id", &mut msg.tool_call_id),
        ("name", &mut msg.name),
    ] {
        if let Some(v) = opt(o, k) {
            *slot = Some(
                v.as_str()
                    .ok_or_else(|| bad(format!("`{k}` must be a string")))?
                    .to_string(),
            );
        }
    }
    Ok(msg)
}

/// OpenAI's `finish_reason`.
pub fn finish_reason(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::ToolCalls => "tool_calls",
        // a stream that broke off or was cancelled: OpenAI has no code; vLLM says "abort"
        FinishReason::Cancelled | FinishReason::Error => "abort",
    }
}

/// A reply's tool calls as OpenAI's `message.tool_calls`: `id`, `type: "function"`, and
/// `function.arguments` a JSON object as a string.
pub fn tool_calls(calls: &[ToolCall]) -> Value {
    Value::Array(
        calls
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let args = match &c.function.arguments {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                // clients answer a call by its id: one a runtime did not give gets one
                let id = c.id.clone().unwrap_or_else(|| format!("call_{i}"));
                json!({"id": id, "type": "function",
                       "function": {"name": c.function.name, "arguments": args}})
            })
            .collect(),
    )
}

/// A piece of a streamed tool call as OpenAI's `delta.tool_calls[i]`: the first piece of a
/// call carries `id`, `type` and `function.name`; every piece its `index` and argument text.
pub fn tool_call_delta(d: &ToolCallDelta) -> Value {
    let mut f = json!({"arguments": d.arguments});
    if let Some(n) = &d.name {
        f["name"] = n.clone().into();
    }
    let mut v = json!({"index": d.index, "function": f});
    // a call's first piece (its name) carries its id; one a runtime did not give gets the one
    // the whole answer gives it (`tool_calls`)
    let id =
        d.id.clone()
            .or_else(|| d.name.as_ref().map(|_| format!("call_{}", d.index)));
    if let Some(id) = id {
        v["id"] = id.into();
        v["type"] = "function".into();
    }
    v
}

/// llama-server's `stop_type` for a finish reason (`eos` also for a stop string: the answer
/// does not say which ended it).
pub fn stop_type(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Stop | FinishReason::ToolCalls => "eos",
        FinishReason::Length => "limit",
        FinishReason::Cancelled | FinishReason::Error => "none",
    }
}

/// The last object of llama-server's `/completion` (whole, or the last event of a stream,
/// with an empty `content`): `stop`, `stop_type`, token counts and `timings`.
pub fn native_final(r: &GenerateResponse, model: &str, content: &str, tokens: bool) -> Value {
    let mut v = json!({
        "content": content,
        "model": model,
        "stop": true,
        "stop_type": stop_type(r.finish_reason),
        "stopping_word": "",
        "tokens_predicted": r.usage.output_tokens,
        "tokens_evaluated": r.usage.input_tokens,
        "truncated": false,
        "timings": timings(r),
        "speculation": serde_json::to_value(&r.metadata.speculation).unwrap_or(Value::Null),
    });
    if tokens {
        v["tokens"] = json!(r.token_ids.clone().unwrap_or_default());
    }
    v
}

/// The `usage` object.
pub fn usage(r: &GenerateResponse) -> Value {
    json!({
        "prompt_tokens": r.usage.input_tokens,
        "completion_tokens": r.usage.output_tokens,
        "total_tokens": r.usage.input_tokens + r.usage.output_tokens,
        "prompt_tokens_details": {"cached_tokens": r.usage.cached_input_tokens},
    })
}

/// llama-server's `timings` (what its clients, and our own `llama-server` adapter, read):
/// prompt and predicted counts and rates, and `draft_n` / `draft_n_accepted` when drafting ran.
pub fn timings(r: &GenerateResponse) -> Value {
    let t = &r.metadata.timings;
    let mut o = Map::new();
    o.insert("cache_n".into(), json!(r.usage.cached_input_tokens));
    o.insert(
        "prompt_n".into(),
        json!(r
            .usage
            .input_tokens
            .saturating_sub(r.usage.cached_input_tokens)),
    );
    if let Some(ms) = t.prefill_ms {
        o.insert("prompt_ms".into(), json!(ms));
    }
    if let Some(x) = t.prefill_tokens_per_s {
        o.insert("prompt_per_second".into(), json!(x));
    }
    o.insert("predicted_n".into(), json!(r.usage.output_tokens));
    if let Some(ms) = t.decode_ms {
        o.insert("predicted_ms".into(), json!(ms));
    }
    if let Some(x) = t.decode_tokens_per_s {
        o.insert("predicted_per_second".into(), json!(x));
    }
    let s: &SpeculationReport = &r.metadata.speculation;
    if let Some(d) = s.drafted {
        o.insert("draft_n".into(), json!(d));
        o.insert("draft_n_accepted".into(), json!(s.accepted.unwrap_or(0)));
    }
    Value::Object(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(v: Value) -> Result<Parsed, ApiError> {
        parse(Endpoint::Chat, &v, &Limits::default())
    }

    #[test]
    fn images_come_inline_only() {
        let url = "data:image/png;base64,iVBORw0KGgo=";
        let p = chat(json!({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": "what is it?"}]}]}))
        .unwrap();
        let m = &p.request.messages.as_ref().unwrap()[0];
        assert_eq!(m.images, [url]);
        assert_eq!(m.content, "what is it?");
        for bad in [
            "/etc/passwd",
            "file:///etc/passwd",
            "https://example.invalid/a.png",
        ] {
            let e = chat(json!({"messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": bad}}]}]}))
            .unwrap_err();
            assert!(e.message.contains("not a data: URL"), "{bad}: {e:?}");
        }
    }

    #[test]
    fn a_conversation_is_the_history_as_sent() {
        let p = chat(json!({"model": "x", "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]},
        ], "max_tokens": 7, "temperature": 0, "stop": "\n", "stream": true,
           "stream_options": {"include_usage": true}}))
        .unwrap();
        let r = &p.request;
        assert_eq!(r.prompt, "");
        let m = r.messages.as_ref().unwrap();
        assert_eq!(m[0].role, Role::System);
        assert_eq!(m[1].content, "Hi there");
        assert_eq!(r.max_output_tokens, Some(7));
        assert_eq!(r.sampling.temperature, Some(0.0));
        assert_eq!(r.stop, vec!["\n".to_string()]);
        assert!(p.stream && p.include_usage);
        assert!(!r.raw_prompt);
    }

    #[test]
    fn speculation_per_request_uses_the_contracts_block() {
        let p = chat(json!({"messages": [{"role": "user", "content": "a"}],
            "speculation": {"mode": "native_mtp", "num_draft_tokens": 2}}))
        .unwrap();
        let block = json!({"mode": "native_mtp", "num_draft_tokens": 2});
        assert_eq!(
            p.request.speculation,
            Some(Speculation::from_json(&block).unwrap())
        );
        let off =
            chat(json!({"messages": [{"role": "user", "content": "a"}], "speculation": false}))
                .unwrap();
        assert_eq!(off.request.speculation, Some(Speculation::off()));
        // llama-server's field
        let n =
            chat(json!({"messages": [{"role": "user", "content": "a"}], "speculative.n_max": 0}))
                .unwrap();
        assert_eq!(n.request.speculation, Some(Speculation::off()));
        // the contract's own message for a bad block
        let e = chat(json!({"messages": [{"role": "user", "content": "a"}],
            "speculation": {"num_draft_tokens": 0}}))
        .unwrap_err();
        let contract = Speculation::from_json(&json!({"num_draft_tokens": 0})).unwrap_err();
        assert_eq!(e.status, 400);
        assert_eq!(e.param.as_deref(), Some("speculation"));
        assert!(e.message.contains(&contract.to_string()), "{}", e.message);
    }

    #[test]
    fn constraints_in_every_field_clients_send() {
        let with = |k: &str, v: Value| {
            let mut b = json!({"messages": [{"role": "user", "content": "a"}]});
            b[k] = v;
            chat(b).map(|p| p.request.response_format)
        };
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let want = Some(ResponseFormat::json_schema(schema.clone()));
        for (k, v) in [
            ("json_schema", schema.clone()),
            ("guided_json", schema.clone()),
            ("structured_outputs", json!({"json": schema.clone()})),
            ("structured_outputs", json!({"json": schema.to_string()})),
        ] {
            assert_eq!(with(k, v.clone()).unwrap(), want, "{k}: {v}");
        }
        assert_eq!(
            with(
                "structured_outputs",
                json!({"regex": "[a-z]+", "choice": null})
            )
            .unwrap(),
            Some(ResponseFormat::regex("[a-z]+"))
        );
        assert_eq!(
            with("guided_regex", json!("[a-z]+")).unwrap(),
            Some(ResponseFormat::regex("[a-z]+"))
        );
        assert_eq!(
            with("structured_outputs", json!({"grammar": "start: \"a\"+"})).unwrap(),
            Some(ResponseFormat::grammar("start: \"a\"+"))
        );
        // a choice is the regex of exactly one of its strings, metacharacters escaped
        let choice = ResponseFormat::regex(r"(yes|no|a\.b\*)");
        for (k, v) in [
            ("guided_choice", json!(["yes", "no", "a.b*"])),
            (
                "structured_outputs",
                json!({"choice": ["yes", "no", "a.b*"]}),
            ),
        ] {
            assert_eq!(with(k, v).unwrap(), Some(choice.clone()));
        }
        // `response_format: text` is no constraint, and leaves room for another field
        assert_eq!(
            with("response_format", json!({"type": "text"})).unwrap(),
            None
        );
        let mut b = json!({"messages": [{"role": "user", "content": "a"}],
            "response_format": {"type": "text"}, "guided_regex": "x"});
        assert_eq!(
            chat(b.clone()).unwrap().request.response_format,
            Some(ResponseFormat::regex("x"))
        );
        // two constraints at once are refused, naming both
        b["response_format"] = json!({"type": "json_object"});
        let e = chat(b).unwrap_err();
        assert_eq!(e.status, 400);
        assert_eq!(e.param.as_deref(), Some("guided_regex"));
        assert!(
            e.message.contains("`response_format`, `guided_regex`"),
            "{}",
            e.message
        );
        // the contract's prompted_fallback travels as an extension field
        let asked = json!({"messages": [{"role": "user", "content": "a"}],
            "guided_regex": "x", "prompted_fallback": true});
        assert!(chat(asked).unwrap().request.prompted_fallback);
        let plain = json!({"messages": [{"role": "user", "content": "a"}], "guided_regex": "x"});
        assert!(!chat(plain).unwrap().request.prompted_fallback);
        let e = chat(json!({"messages": [{"role": "user", "content": "a"}],
            "prompted_fallback": "yes"}))
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("prompted_fallback"));
        // what structured_outputs holds that is not taken, or is malformed, is named
        for (v, param) in [
            (
                json!({"structural_tag": "{}"}),
                "structured_outputs.structural_tag",
            ),
            (
                json!({"whitespace_pattern": " "}),
                "structured_outputs.whitespace_pattern",
            ),
            (json!({"regex": "a", "json": {}}), "structured_outputs"),
            (json!({}), "structured_outputs"),
            (json!("regex"), "structured_outputs"),
            (json!({"regex": 5}), "structured_outputs.regex"),
            (json!({"json": "{not json"}), "structured_outputs.json"),
            (json!({"choice": []}), "structured_outputs.choice"),
            (json!({"choice": ["a", 1]}), "structured_outputs.choice"),
        ] {
            let e = with("structured_outputs", v.clone()).unwrap_err();
            assert_eq!(e.status, 400, "{v}");
            assert_eq!(e.param.as_deref(), Some(param), "{v}: {}", e.message);
        }
        let e = with("guided_grammar", json!("root ::= \"a\"")).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("guided_grammar"));
    }

    #[test]
    fn tool_choice_and_tool_call_shapes() {
        let tools = json!([{"type": "function", "function": {"name": "f", "parameters": {}}}]);
        let with = |choice: Value| {
            chat(
                json!({"messages": [{"role": "user", "content": "a"}], "tools": tools,
                "tool_choice": choice, "parallel_tool_calls": false}),
            )
        };
        let named = with(json!({"type": "function", "function": {"name": "f"}})).unwrap();
        assert_eq!(named.request.tool_choice, ToolChoice::Function("f".into()));
        assert_eq!(named.request.parallel_tool_calls, Some(false));
        assert_eq!(
            with(json!("required")).unwrap().request.tool_choice,
            ToolChoice::Required
        );
        assert_eq!(
            with(json!("none")).unwrap().request.tool_choice,
            ToolChoice::None
        );
        for bad in [json!("always"), json!({"type": "function"}), json!(3)] {
            let e = with(bad.clone()).unwrap_err();
            assert_eq!(e.status, 400, "{bad}");
            assert_eq!(e.param.as_deref(), Some("tool_choice"), "{bad}");
        }
        // a function that is not a tool is the request's mistake, named
        let e = with(json!({"type": "function", "function": {"name": "g"}})).unwrap_err();
        assert!(e.message.contains("`g`"), "{}", e.message);
        // OpenAI's shapes, ids filled where a runtime gave none
        let call = ToolCall {
            id: None,
            kind: "function".into(),
            function: mtp_contract::FunctionCall {
                name: "f".into(),
                arguments: json!("{\"a\": 1}"),
            },
        };
        assert_eq!(
            tool_calls(&[call]),
            json!([{"id": "call_0", "type": "function",
                    "function": {"name": "f", "arguments": "{\"a\": 1}"}}])
        );
        let first = ToolCallDelta {
            index: 1,
            id: None,
            name: Some("f".into()),
            arguments: String::new(),
        };
        assert_eq!(
            tool_call_delta(&first),
            json!({"index": 1, "id": "call_1", "type": "function",
                   "function": {"name": "f", "arguments": ""}})
        );
        let more = ToolCallDelta {
            index: 1,
            arguments: "{\"a\"".into(),
            ..Default::default()
        };
        assert_eq!(
            tool_call_delta(&more),
            json!({"index": 1, "function": {"arguments": "{\"a\""}})
        );
        assert_eq!(finish_reason(FinishReason::ToolCalls), "tool_calls");
    }

    #[test]
    fn what_cannot_be_honoured_is_refused_by_name() {
        let base = |k: &str, v: Value| {
            let mut b = json!({"messages": [{"role": "user", "content": "a"}]});
            b[k] = v;
            chat(b).unwrap_err()
        };
        assert_eq!(base("n", json!(2)).param.as_deref(), Some("n"));
        assert_eq!(
            base("logprobs", json!(true)).param.as_deref(),
            Some("logprobs")
        );
        assert_eq!(
            base("response_format", json!({"type": "xml"}))
                .param
                .as_deref(),
            Some("response_format")
        );
        assert_eq!(
            base("grammar", json!("root ::= \"a\"")).param.as_deref(),
            Some("grammar")
        );
        assert_eq!(
            base("tool_choice", json!("required")).param.as_deref(),
            Some("tool_choice")
        );
        assert_eq!(
            base("temperature", json!("hot")).param.as_deref(),
            Some("temperature")
        );
        assert_eq!(
            base("max_tokens", json!(-1)).param.as_deref(),
            Some("max_tokens")
        );
        assert_eq!(
            base("max_tokens", json!(0)).param.as_deref(),
            Some("max_output_tokens")
        );
        assert_eq!(base("stop", json!([1])).param.as_deref(), Some("stop"));
        let e = chat(json!({"messages": [{"role": "robot", "content": "a"}]})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0]"));
        assert!(chat(json!({"messages": []})).is_err());
        assert!(chat(json!([1, 2])).is_err());
    }

    #[test]
    fn completions_are_raw_prompts() {
        let p = parse(
            Endpoint::Completion,
            &json!({"prompt": ["fn main() {"], "max_tokens": 3}),
            &Limits::default(),
        )
        .unwrap();
        assert!(p.request.raw_prompt);
        assert_eq!(p.request.prompt, "fn main() {");
        let l = Limits::default();
        assert!(parse(Endpoint::Completion, &json!({"prompt": [1, 2]}), &l).is_err());
        assert!(parse(Endpoint::Completion, &json!({}), &l).is_err());
    }
}
