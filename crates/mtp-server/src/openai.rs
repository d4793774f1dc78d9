//! OpenAI request bodies into the contract's [`GenerateRequest`], and responses back, through
//! the typed wire protocol of `mtp-openai`.
//!
//! The body is read into [`oa::ChatCompletionRequest`], which keeps a field of the wrong type
//! as sent ([`Field::Invalid`]); this module is the validation layer that refuses it with a 400
//! naming the field. Fields no local runtime acts on and that change nothing when ignored
//! (`user`, `metadata`, `store`, `service_tier`, and whatever else lands in the request's
//! `extra`) are accepted and ignored, as vLLM and llama-server do; `tools`, `tool_choice`
//! (`auto`, `none`, `required`, a named function: the last two enforced by the runtime's
//! grammar) and `parallel_tool_calls` go to the runtime, and its tool calls come back as
//! `message.tool_calls` / `delta.tool_calls`; fields that would change the answer and that
//! this server cannot honour (`n` > 1, `logprobs`, a GBNF `grammar`) are refused with 400, and
//! a `response_format` the runtime cannot enforce is refused by the runtime, never dropped
//! silently.

use mtp_contract::{
    GenerateRequest, GenerateResponse, Message, ResponseFormat, Role, Sampling, Speculation,
    ToolCall, ToolCallDelta,
};
use mtp_openai::{self as oa, Field};
use serde::Deserialize;
use serde_json::Value;

use crate::error::ApiError;

pub use mtp_openai::{finish_reason, stop_type};

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
    /// llama-server's `return_progress`: streamed chunks with the prompt's progress.
    pub return_progress: bool,
    /// `n`: choices per prompt.
    pub n: usize,
    /// A text completion's prompts after the first (`request` holds the first): a batch.
    pub more_prompts: Vec<PromptInput>,
}

/// One prompt of a text completion: text, or token ids.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptInput {
    /// Text.
    Text(String),
    /// Token ids.
    Ids(Vec<u32>),
}

impl PromptInput {
    /// `request` with this prompt.
    fn into_request(self, request: &GenerateRequest) -> GenerateRequest {
        let mut r = request.clone();
        match self {
            PromptInput::Text(t) => {
                r.prompt = t;
                r.prompt_token_ids = None;
            }
            PromptInput::Ids(ids) => {
                r.prompt = String::new();
                r.prompt_token_ids = Some(ids);
            }
        }
        r
    }
}

impl Parsed {
    /// The requests of every choice, in OpenAI's order (prompt by prompt, `n` choices each):
    /// choice `j` of a prompt samples with the request's seed plus `j`, so a seeded request's
    /// choices differ and are each reproducible.
    pub fn choice_requests(&self) -> Vec<GenerateRequest> {
        let first = std::iter::once(self.request.clone());
        let more = self
            .more_prompts
            .iter()
            .map(|p| p.clone().into_request(&self.request));
        first
            .chain(more)
            .flat_map(|r| {
                (0..self.n).map(move |j| {
                    let mut c = r.clone();
                    if let Some(seed) = c.sampling.seed {
                        c.sampling.seed = Some(seed.wrapping_add(j as u64));
                    }
                    c
                })
            })
            .collect()
    }

    /// Choices in all.
    pub fn choices(&self) -> usize {
        (1 + self.more_prompts.len()) * self.n
    }
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
    /// Bytes of text in one request: messages, prompt, tools, template arguments
    /// (`--max-prompt-bytes`). Checked before the request waits for a slot, so a prompt no
    /// context could hold is refused before it is rendered or tokenized; far below the body
    /// cap, far above what fits a 262,144-token context (about 1 MiB of text).
    pub max_prompt_bytes: usize,
    /// Choices of one request: prompts of a batch times `n` (`--max-choices`).
    pub max_choices: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_stop: 64,
            max_stop_bytes: 1024,
            max_messages: 4096,
            max_content_parts: 256,
            max_tools: 512,
            max_prompt_bytes: DEFAULT_MAX_PROMPT_BYTES,
            max_choices: DEFAULT_MAX_CHOICES,
        }
    }
}

/// Default [`Limits::max_choices`] (vLLM's own cap on `n` is far higher; each choice is a
/// sequence of the batch).
pub const DEFAULT_MAX_CHOICES: usize = 128;

/// Default [`Limits::max_prompt_bytes`]: 4 MiB.
pub const DEFAULT_MAX_PROMPT_BYTES: usize = 4 << 20;

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

/// A field's value, or the 400 `bad` words for the JSON sent instead.
fn field<T>(
    f: &Option<Field<T>>,
    bad: impl FnOnce(&Value) -> ApiError,
) -> Result<Option<&T>, ApiError> {
    match f {
        None => Ok(None),
        Some(Field::Ok(t)) => Ok(Some(t)),
        Some(Field::Invalid { value, .. }) => Err(bad(value)),
    }
}

fn f32_field(f: &Option<Field<f64>>, k: &str) -> Result<Option<f32>, ApiError> {
    Ok(field(f, |v| {
        ApiError::invalid(k, format!("`{k}` must be a number, got {v}"))
    })?
    .map(|x| *x as f32))
}

fn u64_field(f: &Option<Field<u64>>, k: &str) -> Result<Option<u64>, ApiError> {
    Ok(field(f, |v| {
        ApiError::invalid(k, format!("`{k}` must be a non-negative integer, got {v}"))
    })?
    .copied())
}

fn u32_of(x: u64, k: &str) -> Result<u32, ApiError> {
    u32::try_from(x).map_err(|_| ApiError::invalid(k, format!("`{k}` is too large: {x}")))
}

fn u32_field(f: &Option<Field<u64>>, k: &str) -> Result<Option<u32>, ApiError> {
    u64_field(f, k)?.map(|x| u32_of(x, k)).transpose()
}

fn bool_field(f: &Option<Field<bool>>, k: &str) -> Result<Option<bool>, ApiError> {
    Ok(field(f, |v| {
        ApiError::invalid(k, format!("`{k}` must be true or false, got {v}"))
    })?
    .copied())
}

/// Reads the body of either endpoint, within `limits`.
pub fn parse(endpoint: Endpoint, body: &Value, limits: &Limits) -> Result<Parsed, ApiError> {
    if !body.is_object() {
        return Err(ApiError::invalid(
            "body",
            "the request body must be a JSON object",
        ));
    }
    // every field of the wire type reads any JSON, so an object always deserializes
    let b = oa::ChatCompletionRequest::deserialize(body)
        .map_err(|e| ApiError::invalid("body", format!("the request body cannot be read: {e}")))?;
    parse_request(endpoint, &b, limits)
}

/// [`parse`] of a body already read into the wire type.
pub fn parse_request(
    endpoint: Endpoint,
    b: &oa::ChatCompletionRequest,
    limits: &Limits,
) -> Result<Parsed, ApiError> {
    let (mut request, more_prompts) = match endpoint {
        Endpoint::Chat => (chat_request(b, limits)?, Vec::new()),
        Endpoint::Completion | Endpoint::Native => completion_request(endpoint, b)?,
    };
    // `echo` (text completions): the prompt's tokens come back with the answer
    let echo = match endpoint {
        Endpoint::Completion => bool_field(&b.echo, "echo")?.unwrap_or(false),
        Endpoint::Chat | Endpoint::Native => {
            if bool_field(&b.echo, "echo")? == Some(true) {
                return Err(ApiError::unsupported(
                    "echo",
                    "`echo` repeats a text completion's prompt; it is taken by \
                     /v1/completions only",
                ));
            }
            false
        }
    };
    request.echo = echo;
    request.max_output_tokens = match (
        u32_field(&b.max_completion_tokens, "max_completion_tokens")?,
        u32_field(&b.max_tokens, "max_tokens")?,
    ) {
        (Some(0), _) => return Err(at_least_one("max_completion_tokens")),
        // (with `echo`, 0 asks for the prompt's log probabilities alone)
        (None, Some(0)) if !echo => return Err(at_least_one("max_tokens")),
        (Some(n), _) | (None, Some(n)) => Some(n),
        (None, None) => None,
    };
    if endpoint == Endpoint::Native {
        // llama-server: n_predict -1 is "until the context is full"
        let bad = |v: &dyn std::fmt::Display| {
            ApiError::invalid(
                "n_predict",
                format!("`n_predict` must be a non-negative integer, got {v}"),
            )
        };
        match field(&b.n_predict, |v| bad(v))? {
            None => {}
            Some(n) if n.as_i64() == Some(-1) => request.max_output_tokens = None,
            Some(n) => {
                let x = n.as_u64().ok_or_else(|| bad(n))?;
                if x == 0 {
                    return Err(at_least_one("n_predict"));
                }
                request.max_output_tokens = Some(u32_of(x, "n_predict")?);
            }
        }
    }
    request.sampling = sampling(b)?;
    request.stop = stop(b, limits)?;
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
    request.speculation = speculation(b)?;
    let n = match u64_field(&b.n, "n")? {
        None => 1,
        Some(0) => return Err(at_least_one("n")),
        Some(n) if n > 1 && endpoint == Endpoint::Native => {
            return Err(ApiError::unsupported(
                "n",
                format!("llama-server's /completion returns one answer, not {n}"),
            ))
        }
        Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
    };
    let choices = n.saturating_mul(1 + more_prompts.len());
    if choices > limits.max_choices {
        return Err(ApiError::over_limit(
            "n",
            "choices (prompts times `n`)",
            choices,
            limits.max_choices,
            "--max-choices",
        ));
    }
    if let Some(n) = u64_field(&b.best_of, "best_of")? {
        if n != 1 {
            return Err(ApiError::unsupported(
                "best_of",
                format!("this server generates one candidate per choice (`best_of` = 1), not {n}"),
            ));
        }
    }
    request.logprobs = logprobs(endpoint, b)?;
    request.response_format = response_format(b)?;
    // the contract's extension: a runtime behind the server that cannot enforce the
    // constraint asks for it in the prompt instead of refusing (its warnings say so)
    request.prompted_fallback =
        bool_field(&b.prompted_fallback, "prompted_fallback")?.unwrap_or(false);
    let stream = bool_field(&b.stream, "stream")?.unwrap_or(false);
    let include_usage = match field(&b.stream_options, |v| {
        ApiError::invalid(
            "stream_options",
            format!("`stream_options` must be an object, got {v}"),
        )
    })? {
        None => false,
        Some(so) => bool_field(&so.include_usage, "include_usage")
            .map_err(|e| ApiError {
                param: Some("stream_options.include_usage".into()),
                ..e
            })?
            .unwrap_or(false),
    };
    let return_tokens = bool_field(&b.return_tokens, "return_tokens")?.unwrap_or(false);
    let return_progress = bool_field(&b.return_progress, "return_progress")?.unwrap_or(false);
    request
        .validate()
        .map_err(|e| ApiError::from_provider(&e))?;
    let bytes = request.text_bytes();
    if bytes > limits.max_prompt_bytes {
        return Err(ApiError {
            status: axum::http::StatusCode::PAYLOAD_TOO_LARGE,
            ..ApiError::over_limit(
                match endpoint {
                    Endpoint::Chat => "messages",
                    Endpoint::Completion | Endpoint::Native => "prompt",
                },
                "bytes of text",
                bytes,
                limits.max_prompt_bytes,
                "--max-prompt-bytes",
            )
        });
    }
    Ok(Parsed {
        request,
        stream,
        include_usage,
        return_tokens,
        return_progress,
        n,
        more_prompts,
    })
}

/// The alternatives per token's log probability asked for, if any: chat's `logprobs: true`
/// with `top_logprobs` (0 to 20, which needs `logprobs`), or a text completion's integer
/// `logprobs` (0 to 20; as OpenAI, the sampled token's own comes besides).
fn logprobs(endpoint: Endpoint, b: &oa::ChatCompletionRequest) -> Result<Option<u32>, ApiError> {
    let most = mtp_contract::MAX_TOP_LOGPROBS;
    let top = u32_field(&b.top_logprobs, "top_logprobs")?;
    let asked = field(&b.logprobs, |v| {
        ApiError::invalid(
            "logprobs",
            match endpoint {
                Endpoint::Chat => format!("`logprobs` must be true or false, got {v}"),
                _ => format!("`logprobs` must be an integer from 0 to {most}, got {v}"),
            },
        )
    })?;
    let n = match (endpoint, asked) {
        (Endpoint::Native, Some(_)) => {
            return Err(ApiError::unsupported(
                "logprobs",
                "llama-server's /completion takes `n_probs`, which this server does not; \
                 use /v1/completions with `logprobs`",
            ))
        }
        (Endpoint::Chat, Some(oa::LogprobsParam::Flag(true))) => Some(top.unwrap_or(0)),
        (Endpoint::Chat, None | Some(oa::LogprobsParam::Flag(false))) => {
            if top.is_some_and(|t| t > 0) {
                return Err(ApiError::invalid(
                    "top_logprobs",
                    "`top_logprobs` needs `logprobs: true`",
                ));
            }
            None
        }
        (Endpoint::Chat, Some(oa::LogprobsParam::Count(c))) => {
            return Err(ApiError::invalid(
                "logprobs",
                format!(
                    "`logprobs` must be true or false in a chat request (got {c}); the number \
                     of alternatives is `top_logprobs`"
                ),
            ))
        }
        (_, Some(oa::LogprobsParam::Count(c))) => Some(u32_of(*c, "logprobs")?),
        (_, Some(oa::LogprobsParam::Flag(f))) => {
            return Err(ApiError::invalid(
                "logprobs",
                format!("`logprobs` must be an integer from 0 to {most}, got {f}"),
            ))
        }
        (_, None) => None,
    };
    match n {
        Some(n) if n > most => Err(ApiError::invalid(
            if endpoint == Endpoint::Chat {
                "top_logprobs"
            } else {
                "logprobs"
            },
            format!("at most {most} alternatives per token, {n} asked for"),
        )),
        n => Ok(n),
    }
}

/// The 400 of a token budget of zero, naming the field that was sent.
fn at_least_one(k: &str) -> ApiError {
    ApiError::invalid(k, format!("`{k}` must be at least 1"))
}

/// `stop`: a string or a list of strings, within the cap on their number.
fn stop(b: &oa::ChatCompletionRequest, limits: &Limits) -> Result<Vec<String>, ApiError> {
    let over =
        |n: usize| ApiError::over_limit("stop", "stop strings", n, limits.max_stop, "--max-stop");
    match &b.stop {
        None => Ok(Vec::new()),
        Some(Field::Ok(oa::Stop::One(s))) => Ok(vec![s.clone()]),
        Some(Field::Ok(oa::Stop::Many(a))) if a.len() > limits.max_stop => Err(over(a.len())),
        Some(Field::Ok(oa::Stop::Many(a))) => Ok(a.clone()),
        Some(Field::Invalid {
            value: Value::Array(a),
            ..
        }) => {
            if a.len() > limits.max_stop {
                return Err(over(a.len()));
            }
            let s = a.iter().find(|s| !s.is_string()).unwrap_or(&Value::Null);
            Err(ApiError::invalid(
                "stop",
                format!("stop sequences must be strings, got {s}"),
            ))
        }
        Some(Field::Invalid { value, .. }) => Err(ApiError::invalid(
            "stop",
            format!("`stop` must be a string or a list of strings, got {value}"),
        )),
    }
}

/// The reply's constraint: OpenAI's `response_format` (with our `regex` and `grammar` types),
/// llama-server's `json_schema`, vLLM's `structured_outputs` (`json`, `regex`, `choice`, Lark
/// `grammar`) or its older `guided_json` / `guided_regex` / `guided_choice`. A request naming
/// two of them is refused, as are GBNF grammars (llama-server's `grammar`, `guided_grammar`:
/// a Lark grammar goes in `response_format` or `structured_outputs.grammar`) and the
/// `structured_outputs` keys that would change the answer and are not taken; nothing is
/// dropped.
fn response_format(b: &oa::ChatCompletionRequest) -> Result<Option<ResponseFormat>, ApiError> {
    let given: Vec<&str> = [
        // `response_format: {"type": "text"}` asks for no constraint
        (
            "response_format",
            b.response_format.is_some()
                && !matches!(b.response_format, Some(Field::Ok(ResponseFormat::Text))),
        ),
        ("json_schema", b.json_schema.is_some()),
        ("structured_outputs", b.structured_outputs.is_some()),
        ("guided_json", b.guided_json.is_some()),
        ("guided_regex", b.guided_regex.is_some()),
        ("guided_choice", b.guided_choice.is_some()),
    ]
    .into_iter()
    .filter(|(_, set)| *set)
    .map(|(k, _)| k)
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
    for (field, set) in [
        ("grammar", b.grammar.is_some()),
        ("guided_grammar", b.guided_grammar.is_some()),
    ] {
        if set {
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
    let text = |at: &str, f: &Option<Field<String>>| -> Result<String, ApiError> {
        Ok(field(f, |v| {
            ApiError::invalid(at, format!("`{at}` must be a string, got {v}"))
        })?
        .cloned()
        .unwrap_or_default())
    };
    let Some(&which) = given.first() else {
        return Ok(None);
    };
    match which {
        "response_format" => match &b.response_format {
            Some(Field::Ok(f)) => checked(f.clone()),
            // the contract's reading of it, for its message
            Some(Field::Invalid { value, .. }) => ResponseFormat::from_json(value)
                .map(Some)
                .map_err(|e| ApiError::from_provider(&e)),
            None => Ok(None),
        },
        "json_schema" => checked(ResponseFormat::json_schema(
            b.json_schema.clone().unwrap_or_default(),
        )),
        "guided_json" => checked(ResponseFormat::json_schema(
            b.guided_json.clone().unwrap_or_default(),
        )),
        "guided_regex" => checked(ResponseFormat::regex(text(which, &b.guided_regex)?)),
        "guided_choice" => checked(choice_regex(which, &b.guided_choice)?),
        _ => {
            let so = field(&b.structured_outputs, |v| {
                ApiError::invalid(
                    which,
                    format!("`structured_outputs` must be an object, got {v}"),
                )
            })?
            .cloned()
            .unwrap_or_default();
            structured_outputs(&so, checked, text)
        }
    }
}

/// vLLM's `structured_outputs`: exactly one of `json`, `regex`, `choice`, `grammar` (and
/// `json_object: true`); its other keys would change the answer and are refused by name.
fn structured_outputs(
    so: &oa::StructuredOutputs,
    checked: impl Fn(ResponseFormat) -> Result<Option<ResponseFormat>, ApiError>,
    text: impl Fn(&str, &Option<Field<String>>) -> Result<String, ApiError>,
) -> Result<Option<ResponseFormat>, ApiError> {
    const FIELD: &str = "structured_outputs";
    let set = so.keys_set();
    let [key] = set.as_slice() else {
        return Err(ApiError::invalid(
            FIELD,
            format!(
                "`structured_outputs` takes exactly one of `json`, `regex`, `choice`, \
                 `grammar`; got {}",
                if set.is_empty() {
                    "none".to_string()
                } else {
                    set.iter()
                        .map(|k| format!("`{k}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            ),
        ));
    };
    let at = format!("structured_outputs.{key}");
    match *key {
        "json" => checked(ResponseFormat::json_schema(match &so.json {
            // vLLM also takes the schema as a JSON string
            Some(Value::String(s)) => serde_json::from_str(s)
                .map_err(|e| ApiError::invalid(&at, format!("`{at}` is not a JSON schema: {e}")))?,
            other => other.clone().unwrap_or_default(),
        })),
        "json_object" if matches!(so.json_object, Some(Field::Ok(true))) => {
            checked(ResponseFormat::json_object())
        }
        "regex" => checked(ResponseFormat::regex(text(&at, &so.regex)?)),
        "grammar" => checked(ResponseFormat::grammar(text(&at, &so.grammar)?)),
        "choice" => checked(choice_regex(&at, &so.choice)?),
        _ => Err(ApiError::unsupported(
            &at,
            format!(
                "`{at}` is not taken (the constraints taken are `json`, `regex`, \
                 `choice` and Lark `grammar`)"
            ),
        )),
    }
}

/// vLLM's `choice` (a list of strings) as the regex matching exactly one of them.
fn choice_regex(field: &str, f: &Option<Field<Vec<String>>>) -> Result<ResponseFormat, ApiError> {
    let bad = |v: &dyn std::fmt::Display| {
        ApiError::invalid(
            field,
            format!("`{field}` must be a non-empty list of strings, got {v}"),
        )
    };
    let items = match f {
        Some(Field::Ok(items)) if !items.is_empty() => items,
        Some(Field::Invalid { value, .. }) => return Err(bad(value)),
        _ => return Err(bad(&"[]")),
    };
    let mut alts = Vec::with_capacity(items.len());
    for s in items {
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
fn speculation(b: &oa::ChatCompletionRequest) -> Result<Option<Speculation>, ApiError> {
    match &b.speculation {
        Some(Field::Ok(s)) => return Ok(Some(s.clone())),
        // the contract's own message (`Speculation::from_json`'s)
        Some(Field::Invalid { error, .. }) => {
            return Err(ApiError {
                code: Some("invalid_speculation".into()),
                ..ApiError::invalid("speculation", format!("invalid speculation block: {error}"))
            })
        }
        None => {}
    }
    match u32_field(&b.speculative_n_max, "speculative.n_max")? {
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

fn sampling(b: &oa::ChatCompletionRequest) -> Result<Sampling, ApiError> {
    let logit_bias = match field(&b.logit_bias, |v| {
        ApiError::invalid(
            "logit_bias",
            format!("`logit_bias` must be an object of token id to bias, got {v}"),
        )
    })? {
        None => Default::default(),
        Some(bias) => bias
            .0
            .iter()
            .map(|(k, v)| {
                let id = k.parse::<u32>().map_err(|_| {
                    ApiError::invalid("logit_bias", format!("`{k}` is not a token id"))
                })?;
                let b = v.ok().filter(|x| x.is_finite()).ok_or_else(|| {
                    ApiError::invalid("logit_bias", format!("the bias of {k} is not a number"))
                })?;
                Ok((id, *b as f32))
            })
            .collect::<Result<_, ApiError>>()?,
    };
    Ok(Sampling {
        temperature: f32_field(&b.temperature, "temperature")?,
        top_p: f32_field(&b.top_p, "top_p")?,
        top_k: u32_field(&b.top_k, "top_k")?,
        min_p: f32_field(&b.min_p, "min_p")?,
        seed: u64_field(&b.seed, "seed")?,
        repetition_penalty: match f32_field(&b.repetition_penalty, "repetition_penalty")? {
            Some(x) => Some(x),
            None => f32_field(&b.repeat_penalty, "repeat_penalty")?,
        },
        presence_penalty: f32_field(&b.presence_penalty, "presence_penalty")?,
        frequency_penalty: f32_field(&b.frequency_penalty, "frequency_penalty")?,
        logit_bias,
    })
}

/// A text completion's prompts: a string, a list of strings, token ids, or a list of lists of
/// token ids (the first in the request, the rest as a batch; llama-server's `/completion`
/// takes one).
fn completion_request(
    endpoint: Endpoint,
    b: &oa::ChatCompletionRequest,
) -> Result<(GenerateRequest, Vec<PromptInput>), ApiError> {
    let mut prompts = match &b.prompt {
        Some(Field::Ok(oa::Prompt::Text(s))) => vec![PromptInput::Text(s.clone())],
        Some(Field::Ok(oa::Prompt::Texts(a))) => {
            a.iter().map(|s| PromptInput::Text(s.clone())).collect()
        }
        Some(Field::Ok(oa::Prompt::List(a))) => token_prompts(a)?,
        None => return Err(ApiError::invalid("prompt", "`prompt` is required")),
        Some(Field::Invalid { value, .. }) => {
            return Err(ApiError::invalid(
                "prompt",
                format!(
                    "`prompt` must be a string, a list of strings, token ids or lists of token \
                     ids, got {value}"
                ),
            ))
        }
    };
    if prompts.is_empty() {
        return Err(ApiError::invalid("prompt", "`prompt` is an empty list"));
    }
    if prompts.len() > 1 && endpoint == Endpoint::Native {
        return Err(ApiError::unsupported(
            "prompt",
            "llama-server's /completion takes one prompt here; send a batch to /v1/completions",
        ));
    }
    if b.suffix.is_some() {
        return Err(ApiError::unsupported(
            "suffix",
            "fill-in-the-middle (`suffix`) is not supported",
        ));
    }
    let more = prompts.split_off(1);
    let first = prompts
        .remove(0)
        .into_request(&GenerateRequest::new("").raw());
    Ok((first, more))
}

/// A list that is not of strings: one prompt's token ids, or a list of them.
fn token_prompts(a: &[Value]) -> Result<Vec<PromptInput>, ApiError> {
    let ids = |v: &[Value], at: String| -> Result<Vec<u32>, ApiError> {
        v.iter()
            .map(|x| {
                x.as_u64()
                    .and_then(|t| u32::try_from(t).ok())
                    .ok_or_else(|| {
                        ApiError::invalid(
                            "prompt",
                            format!("{at} must hold token ids (integers from 0), got {x}"),
                        )
                    })
            })
            .collect()
    };
    if a.iter().all(Value::is_array) {
        a.iter()
            .enumerate()
            .map(|(i, p)| {
                let p = p.as_array().map(Vec::as_slice).unwrap_or_default();
                if p.is_empty() {
                    return Err(ApiError::invalid(
                        "prompt",
                        format!("prompt {i} has no tokens"),
                    ));
                }
                ids(p, format!("prompt {i}")).map(PromptInput::Ids)
            })
            .collect()
    } else {
        Ok(vec![PromptInput::Ids(ids(a, "`prompt`".into())?)])
    }
}

fn chat_request(
    b: &oa::ChatCompletionRequest,
    limits: &Limits,
) -> Result<GenerateRequest, ApiError> {
    let Some(Field::Ok(raw)) = &b.messages else {
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
    match &b.tool_choice {
        None => {}
        Some(Field::Ok(c)) => r.tool_choice = c.0.clone(),
        // the contract's message (`ToolChoice::from_openai`'s)
        Some(Field::Invalid { error, .. }) => {
            return Err(ApiError::invalid("tool_choice", error.clone()))
        }
    }
    r.parallel_tool_calls = field(&b.parallel_tool_calls, |v| {
        ApiError::invalid(
            "parallel_tool_calls",
            format!("`parallel_tool_calls` must be a boolean, got {v}"),
        )
    })?
    .copied();
    match field(&b.tools, |v| {
        ApiError::invalid("tools", format!("`tools` must be a list, got {v}"))
    })? {
        None => {}
        Some(t) if t.len() > limits.max_tools => {
            return Err(ApiError::over_limit(
                "tools",
                "tools",
                t.len(),
                limits.max_tools,
                "--max-tools",
            ))
        }
        Some(t) => {
            // the tool-call reader walks each parameter's schema: one past the walk's budget
            // is refused here, before the request waits for a slot
            mtp_chat::toolcall::check_tool_schemas(t)
                .map_err(|e| ApiError::invalid("tools", e.to_string()))?;
            r.tools = t.clone();
        }
    }
    let kwargs = field(&b.chat_template_kwargs, |v| {
        ApiError::invalid(
            "chat_template_kwargs",
            format!("`chat_template_kwargs` must be an object, got {v}"),
        )
    })?;
    for (k, v) in kwargs.into_iter().flatten() {
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
    r.prompt_cache_key = field(&b.prompt_cache_key, |_| {
        ApiError::invalid("prompt_cache_key", "must be a string")
    })?
    .cloned();
    Ok(r)
}

/// One OpenAI message: `content` as a string, `null` or a list of parts (`text`, `image_url`).
fn message(i: usize, m: &Field<oa::ChatMessage>, limits: &Limits) -> Result<Message, ApiError> {
    let param = format!("messages[{i}]");
    let bad = |what: String| ApiError::invalid(&param, format!("message {i}: {what}"));
    let o = match m {
        Field::Ok(o) => o,
        Field::Invalid { value, .. } => return Err(bad(format!("must be an object, got {value}"))),
    };
    let role = match o.role_str() {
        Some("system") | Some("developer") => Role::System,
        Some("user") => Role::User,
        Some("assistant") => Role::Assistant,
        Some("tool") => Role::Tool,
        Some(r) => return Err(bad(format!("unknown role `{r}`"))),
        None => return Err(bad("`role` is missing".into())),
    };
    let mut images = Vec::new();
    let content = match &o.content {
        None => String::new(),
        Some(Field::Ok(oa::Content::Text(s))) => s.clone(),
        Some(Field::Ok(oa::Content::Parts(parts))) if parts.len() > limits.max_content_parts => {
            return Err(ApiError::over_limit(
                &param,
                "content parts in one message",
                parts.len(),
                limits.max_content_parts,
                "--max-content-parts",
            ))
        }
        Some(Field::Ok(oa::Content::Parts(parts))) => {
            let mut text = String::new();
            for p in parts {
                let p = p.ok();
                match p.and_then(oa::ContentPart::kind_str) {
                    Some("text") => text.push_str(
                        p.and_then(|p| p.text.as_ref()?.ok())
                            .ok_or_else(|| bad("a text part has no `text`".into()))?,
                    ),
                    Some("image_url") => {
                        let url = p
                            .and_then(|p| p.image_url.as_ref()?.ok())
                            .map(oa::ImageUrl::url)
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
        Some(Field::Invalid { value, .. }) => {
            return Err(bad(format!(
                "`content` must be a string or parts, got {value}"
            )))
        }
    };
    let mut msg = Message::new(role, content);
    msg.images = images;
    let reasoning = o.reasoning_content.as_ref().or(o.reasoning.as_ref());
    if let Some(r) = reasoning {
        msg.reasoning_content = Some(
            r.ok()
                .ok_or_else(|| bad("`reasoning_content` must be a string".into()))?
                .clone(),
        );
    }
    if let Some(calls) = &o.tool_calls {
        let malformed = |e: String| bad(format!("`tool_calls` is malformed: {e}"));
        let calls = match calls {
            Field::Ok(calls) => calls,
            Field::Invalid { error, .. } => return Err(malformed(error.clone())),
        };
        msg.tool_calls = calls
            .iter()
            .enumerate()
            .map(|(k, c)| match c {
                Field::Ok(c) => c
                    .to_contract()
                    .map_err(|e| malformed(format!("entry {k}: {e}"))),
                Field::Invalid { error, .. } => Err(malformed(format!("entry {k}: {error}"))),
            })
            .collect::<Result<_, _>>()?;
    }
    for (k, f, slot) in [
        ("tool_call_id", &o.tool_call_id, &mut msg.tool_call_id),
        ("name", &o.name, &mut msg.name),
    ] {
        *slot = field(f, |_| bad(format!("`{k}` must be a string")))?.cloned();
    }
    Ok(msg)
}

/// A reply's tool calls as OpenAI's `message.tool_calls`: `id`, `type: "function"`, and
/// `function.arguments` a JSON object as a string.
pub fn tool_calls(calls: &[ToolCall]) -> Vec<oa::ToolCall> {
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
            oa::ToolCall::whole(id, "function", c.function.name.clone(), args)
        })
        .collect()
}

/// A piece of a streamed tool call as OpenAI's `delta.tool_calls[i]`: the first piece of a
/// call carries `id`, `type` and `function.name`; every piece its `index` and argument text.
pub fn tool_call_delta(d: &ToolCallDelta) -> oa::ToolCall {
    // a call's first piece (its name) carries its id; one a runtime did not give gets the one
    // the whole answer gives it (`tool_calls`)
    let id =
        d.id.clone()
            .or_else(|| d.name.as_ref().map(|_| format!("call_{}", d.index)));
    oa::ToolCall::piece(d.index as u64, id, d.name.clone(), d.arguments.clone())
}

/// The last object of llama-server's `/completion` (whole, or the last event of a stream,
/// with an empty `content`): `stop`, `stop_type`, token counts and `timings`.
pub fn native_final(
    r: &GenerateResponse,
    model: &str,
    content: &str,
    tokens: bool,
) -> oa::Completion {
    oa::Completion {
        content: Some(content.to_string()),
        model: Some(model.to_string()),
        stop: Some(true),
        stop_type: Some(stop_type(r.finish_reason).to_string()),
        stopping_word: Some(String::new()),
        tokens_predicted: Some(r.usage.output_tokens),
        tokens_evaluated: Some(r.usage.input_tokens),
        truncated: Some(false),
        timings: Some(timings(r)),
        speculation: Some(r.metadata.speculation.clone()),
        tokens: tokens.then(|| {
            r.token_ids
                .iter()
                .flatten()
                .map(|&t| u64::from(t))
                .collect()
        }),
        ..Default::default()
    }
}

/// The `usage` object.
pub fn usage(r: &GenerateResponse) -> oa::Usage {
    oa::Usage::of(&r.usage)
}

/// llama-server's `timings` (what its clients, and our own `llama-server` adapter, read):
/// prompt and predicted counts and rates, and `draft_n` / `draft_n_accepted` when drafting ran.
pub fn timings(r: &GenerateResponse) -> oa::Timings {
    oa::Timings::of(r)
}

#[cfg(test)]
mod tests;
