//! The chat-template renderer: minijinja set up to render a model's Jinja chat template exactly
//! as Hugging Face transformers' `apply_chat_template` does with jinja2.
//!
//! What transformers sets up, and how it is reproduced here:
//!
//! | transformers (jinja2) | here |
//! | --- | --- |
//! | `ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)` | the same syntax options; minijinja has no mutating methods (`list.append` fails in both) |
//! | `jinja2.ext.loopcontrols` | minijinja's `loop_controls` (`break`, `continue`) |
//! | the `{% generation %}` block (assistant-mask tracking) | rewritten to an always-true `if` block: it renders its body unchanged |
//! | `tojson` = `json.dumps(x, ensure_ascii=False, indent, separators, sort_keys)` | [`pyfmt::json_dumps`], same spacing, escapes and float spelling |
//! | `raise_exception(msg)`, `strftime_now(fmt)`, `namespace`, `dict` | the same functions |
//! | Python string/dict methods (`startswith`, `split`, `items`, `get`, …) | minijinja-contrib's `pycompat` |
//! | `{{ x }}` prints `str(x)`: `None`, `True`, `{'a': 1}` | a formatter with Python's spellings ([`pyfmt::py_str`]) |
//! | tests `sequence`/`iterable` are true for strings and dicts, `number` for booleans | the same tests |

use std::sync::Arc;

use minijinja::value::{Kwargs, Rest, Value, ValueKind, ValueOrKwargs};
use minijinja::{Environment, Error, ErrorKind};

use crate::pyfmt::{self, JsonOptions};

/// Name under which templates are registered (and shown in minijinja's own messages).
const NAME: &str = "chat_template";

/// The budget of one render (minijinja's fuel: about one unit per instruction, and one per 64
/// bytes of data made), so that a hostile template (`range` loops inside loops) ends with an
/// error instead of running for ever or exhausting memory: a base, plus an allowance per
/// message and tool and per byte of input. Every published template in `tests/templates/`
/// renders each of its test conversations (up to 7 messages and 2 tools) in under 20,000.
fn fuel_budget(input: &RenderInput, input_bytes: usize) -> u64 {
    let items = input.messages.len() + input.tools.as_ref().map_or(0, Vec::len);
    1_000_000 + 100_000 * items as u64 + 4 * input_bytes as u64
}

/// The most one render may write: a million-token context is about 4 MiB of text, so a
/// template that writes more is broken or hostile (a loop of `"x" * 99999999`). Together with
/// the fuel budget this bounds a render's output; a single value is bounded by minijinja itself
/// (a repeated string at 100 MB).
pub const MAX_RENDERED_BYTES: usize = 32 << 20;

/// The render's output, refusing to grow past `cap`.
struct Capped {
    out: Vec<u8>,
    cap: usize,
    over: bool,
}

impl std::io::Write for Capped {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.out.len().saturating_add(buf.len()) > self.cap {
            self.over = true;
            return Err(std::io::Error::other("the rendered prompt is over the cap"));
        }
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// What `strftime_now` reads: the local clock, or a fixed instant (tests and goldens).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Clock {
    /// `datetime.now()`: local time.
    #[default]
    Local,
    /// Always this local date and time.
    Fixed(chrono::NaiveDateTime),
}

impl Clock {
    fn now(self) -> chrono::NaiveDateTime {
        match self {
            Clock::Local => chrono::Local::now().naive_local(),
            Clock::Fixed(t) => t,
        }
    }
}

/// A chat template could not be compiled or rendered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// The template source is not valid Jinja (or uses syntax this renderer lacks).
    #[error("chat template `{name}` does not compile: {message}{}", at(*line, construct))]
    Syntax {
        /// Where the template came from (a file path or `tokenizer.chat_template`).
        name: String,
        /// 1-based line of the template source, when known.
        line: Option<usize>,
        /// The source text of the construct at fault, when known.
        construct: Option<String>,
        /// What is wrong.
        message: String,
    },
    /// The template called `raise_exception(message)`: it refuses this conversation (for
    /// example a role it does not support).
    #[error("chat template `{name}` refused the conversation: {message}{}", at(*line, &None))]
    Raised {
        /// Where the template came from.
        name: String,
        /// 1-based line of the `raise_exception` call.
        line: Option<usize>,
        /// The template's own message.
        message: String,
    },
    /// Rendering failed (an unknown method, a type error, an exhausted budget, …).
    #[error("chat template `{name}` failed: {message}{}", at(*line, construct))]
    Render {
        /// Where the template came from.
        name: String,
        /// 1-based line of the template source, when known.
        line: Option<usize>,
        /// The source text of the construct at fault, when known.
        construct: Option<String>,
        /// What went wrong.
        message: String,
    },
}

fn at(line: Option<usize>, construct: &Option<String>) -> String {
    match (line, construct) {
        (Some(l), Some(c)) => format!(" (line {l}, at `{c}`)"),
        (Some(l), None) => format!(" (line {l})"),
        (None, Some(c)) => format!(" (at `{c}`)"),
        (None, None) => String::new(),
    }
}

/// Marks an error as `raise_exception`'s, so that it is reported as the template's refusal.
#[derive(Debug)]
struct Raised(String);
impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for Raised {}

/// Rewrites transformers' `{% generation %}` / `{% endgeneration %}` tags (which only mark the
/// assistant's tokens for training masks and render their body unchanged) into an `if` block
/// that is always true, keeping the whitespace-control markers.
fn rewrite_generation_tags(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        // the closing `%}` comes after the opening `{%` (in `{%}` they overlap)
        let Some(end) = tag[2..].find("%}").map(|e| e + 2) else {
            out.push_str(tag);
            return out;
        };
        let inner = &tag[2..end];
        let (lead, body) = match inner.strip_prefix(['-', '+']) {
            Some(b) => (&inner[..1], b),
            None => ("", inner),
        };
        let (body, trail) = match body.strip_suffix('-') {
            Some(b) => (b, "-"),
            None => (body, ""),
        };
        match body.trim() {
            "generation" => out.push_str(&format!("{{%{lead} if true {trail}%}}")),
            "endgeneration" => out.push_str(&format!("{{%{lead} endif {trail}%}}")),
            _ => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

/// A compiled chat template.
///
/// ```
/// use mtp_chat::{ChatTemplate, RenderInput};
/// let t = ChatTemplate::new(
///     "{% for m in messages %}<|{{ m.role }}|>{{ m.content | trim }}\n{% endfor %}\
///      {% if add_generation_prompt %}<|assistant|>{% endif %}",
///     "example",
/// )
/// .unwrap();
/// let input = RenderInput::new(vec![serde_json::json!({"role": "user", "content": " Hi "})]);
/// assert_eq!(t.render(&input).unwrap(), "<|user|>Hi\n<|assistant|>");
/// ```
pub struct ChatTemplate {
    /// Behind a lock because each render sets its own fuel budget.
    env: std::sync::Mutex<Environment<'static>>,
    name: String,
    source: Arc<str>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("name", &self.name)
            .field("bytes", &self.source.len())
            .finish()
    }
}

/// What one render sees: the variables transformers passes to a chat template.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RenderInput {
    /// The conversation, each message a JSON object (`role`, `content`, and whatever else the
    /// caller has: `reasoning_content`, `tool_calls`, `tool_call_id`, `name`, content parts).
    pub messages: Vec<serde_json::Value>,
    /// Tool schemas (OpenAI shape), or `None` (the template sees `tools = None`).
    pub tools: Option<Vec<serde_json::Value>>,
    /// Documents for retrieval templates, or `None`.
    pub documents: Option<Vec<serde_json::Value>>,
    /// Append the header that opens the assistant's turn.
    pub add_generation_prompt: bool,
    /// Everything else the template may read: the tokenizer's special tokens (`bos_token`,
    /// `eos_token`, …) and the caller's keyword arguments (`enable_thinking`, …), the latter
    /// overriding the former as in transformers.
    pub variables: serde_json::Map<String, serde_json::Value>,
    /// What `strftime_now` reads.
    pub clock: Clock,
}

impl RenderInput {
    /// A conversation with the generation prompt on and no other variables.
    pub fn new(messages: Vec<serde_json::Value>) -> Self {
        RenderInput {
            messages,
            add_generation_prompt: true,
            ..Default::default()
        }
    }
}

/// Transformers' message normalisation before rendering: keys whose value is `null` are
/// dropped, and a message's reasoning (`reasoning_content`, or the older `thinking` /
/// `reasoning`) is offered under both `thinking` (first, as gpt-oss templates read it) and
/// `reasoning_content` (where it was, or last).
pub fn normalize_messages(messages: &[serde_json::Value]) -> Vec<serde_json::Value> {
    messages
        .iter()
        .map(|m| {
            let Some(obj) = m.as_object() else {
                return m.clone();
            };
            let obj: serde_json::Map<String, serde_json::Value> = obj
                .iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let reasoning = ["reasoning_content", "thinking", "reasoning"]
                .iter()
                .find_map(|k| obj.get(*k))
                .cloned();
            let Some(r) = reasoning else {
                return serde_json::Value::Object(obj);
            };
            let mut out = serde_json::Map::new();
            out.insert("thinking".into(), r.clone());
            for (k, v) in obj {
                out.insert(k, v);
            }
            out.insert("reasoning_content".into(), r);
            serde_json::Value::Object(out)
        })
        .collect()
}

fn tojson(value: &Value, args: Rest<ValueOrKwargs>) -> Result<Value, Error> {
    // json.dumps's keyword order: ensure_ascii, indent, separators, sort_keys; positional
    // arguments fill them in that order, keyword arguments by name.
    let mut positional: Vec<Value> = args.into_values();
    let kwargs = match positional.last() {
        Some(v) if v.is_kwargs() => Some(Kwargs::try_from(positional.pop().unwrap_or_default())?),
        _ => None,
    };
    let mut slots: [Option<Value>; 4] = Default::default();
    if positional.len() > slots.len() {
        return Err(Error::new(
            ErrorKind::TooManyArguments,
            "tojson takes at most 4 arguments",
        ));
    }
    for (slot, v) in slots.iter_mut().zip(positional) {
        *slot = Some(v);
    }
    if let Some(kw) = &kwargs {
        for (i, key) in ["ensure_ascii", "indent", "separators", "sort_keys"]
            .iter()
            .enumerate()
        {
            if kw.has(key) {
                slots[i] = Some(kw.get::<Value>(key)?);
            }
        }
        kw.assert_all_used()?;
    }
    let [ensure_ascii, indent, separators, sort_keys] = slots;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => Some(match v.kind() {
            ValueKind::String => v.as_str().unwrap_or_default().to_string(),
            ValueKind::Number => " ".repeat(v.as_i64().unwrap_or(0).clamp(0, 64) as usize),
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson indent must be an integer or a string, not {other}"),
                ))
            }
        }),
    };
    let separators = match separators {
        Some(v) if !v.is_none() && !v.is_undefined() => {
            let parts: Vec<Value> = v.try_iter()?.collect();
            match parts.as_slice() {
                [a, b] => Some((pyfmt::py_str(a)?, pyfmt::py_str(b)?)),
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson separators must be a pair of strings",
                    ))
                }
            }
        }
        _ => None,
    };
    let opts = JsonOptions {
        ensure_ascii: ensure_ascii.is_some_and(|v| v.is_true()),
        indent,
        separators,
        sort_keys: sort_keys.is_some_and(|v| v.is_true()),
    };
    Ok(Value::from(pyfmt::json_dumps(value, &opts)?))
}

/// markupsafe's `escape`, which jinja2's `escape`/`e` filters use.
fn escape(value: &Value) -> Result<Value, Error> {
    if value.is_safe() {
        return Ok(value.clone());
    }
    let s = pyfmt::py_str(value)?;
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&#34;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    Ok(Value::from_safe_string(out))
}

impl ChatTemplate {
    /// Compiles `source`; `name` says where it came from in errors (a path, or
    /// `tokenizer.chat_template`).
    pub fn new(source: impl Into<String>, name: impl Into<String>) -> Result<Self, TemplateError> {
        let name = name.into();
        let source: Arc<str> = Arc::from(rewrite_generation_tags(&source.into()));
        let mut env = Environment::new();
        env.set_debug(false);
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| TemplateError::Syntax {
                name: name.clone(),
                line: None,
                construct: None,
                message: e.to_string(),
            })?;
        env.set_syntax(syntax);
        env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(|out, _state, value| {
            let s = pyfmt::py_str(value)?;
            out.write_str(&s)
                .map_err(|e| Error::new(ErrorKind::WriteFailure, e.to_string()))
        });
        env.add_filter("tojson", tojson);
        env.add_filter("string", |v: &Value| -> Result<Value, Error> {
            Ok(Value::from(pyfmt::py_str(v)?))
        });
        env.add_filter("escape", escape);
        env.add_filter("e", escape);
        // jinja2's tests: strings and dicts are sequences and iterable; booleans are numbers.
        env.add_test("sequence", |v: &Value| {
            matches!(
                v.kind(),
                ValueKind::Undefined | ValueKind::Seq | ValueKind::String | ValueKind::Map
            )
        });
        env.add_test("iterable", |v: &Value| {
            matches!(
                v.kind(),
                ValueKind::Undefined
                    | ValueKind::Seq
                    | ValueKind::String
                    | ValueKind::Map
                    | ValueKind::Iterable
            )
        });
        env.add_test("number", |v: &Value| {
            matches!(v.kind(), ValueKind::Number | ValueKind::Bool)
        });
        env.add_function("raise_exception", |msg: Value| -> Result<Value, Error> {
            let text = pyfmt::py_str(&msg)?;
            Err(Error::new(ErrorKind::InvalidOperation, text.clone()).with_source(Raised(text)))
        });
        let compiled = env.add_template_owned(NAME, source.to_string());
        if let Err(e) = compiled {
            return Err(Self::syntax_error(&name, &source, &e));
        }
        Ok(ChatTemplate {
            env: std::sync::Mutex::new(env),
            name,
            source,
        })
    }

    /// Where the template came from.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The template source as compiled (after the `generation` tag rewrite).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// True when the template's text mentions `var` (a cheap check, e.g. whether it reads
    /// `enable_thinking` or `tools`).
    pub fn mentions(&self, var: &str) -> bool {
        self.source.contains(var)
    }

    /// Renders `input` as transformers' `apply_chat_template(..., tokenize=False)` does.
    pub fn render(&self, input: &RenderInput) -> Result<String, TemplateError> {
        let mut ctx = serde_json::Map::new();
        for (k, v) in &input.variables {
            ctx.insert(k.clone(), v.clone());
        }
        let json_list = |v: &Option<Vec<serde_json::Value>>| match v {
            Some(list) => serde_json::Value::Array(list.clone()),
            None => serde_json::Value::Null,
        };
        ctx.insert(
            "messages".into(),
            serde_json::Value::Array(normalize_messages(&input.messages)),
        );
        ctx.insert("tools".into(), json_list(&input.tools));
        ctx.insert("documents".into(), json_list(&input.documents));
        ctx.insert(
            "add_generation_prompt".into(),
            input.add_generation_prompt.into(),
        );
        let input_bytes = serde_json::to_string(&ctx).map_or(0, |s| s.len());
        let mut ctx = Value::from(minijinja::value::Serde(&ctx));
        let clock = input.clock;
        let strftime_now = Value::from_function(move |fmt: &str| -> Result<Value, Error> {
            use chrono::format::{Item, StrftimeItems};
            let items: Vec<Item<'_>> = StrftimeItems::new(fmt).collect();
            if items.iter().any(|i| matches!(i, Item::Error)) {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("strftime_now: unsupported format `{fmt}`"),
                ));
            }
            Ok(Value::from(
                clock.now().format_with_items(items.into_iter()).to_string(),
            ))
        });
        ctx = minijinja::context! { strftime_now => strftime_now, ..ctx };
        // a poisoned lock only means another render panicked; the environment is unchanged
        let mut env = self.env.lock().unwrap_or_else(|p| p.into_inner());
        env.set_fuel(Some(fuel_budget(input, input_bytes)));
        let tmpl = env
            .get_template(NAME)
            .map_err(|e| Self::syntax_error(&self.name, &self.source, &e))?;
        let mut out = Capped {
            out: Vec::new(),
            cap: MAX_RENDERED_BYTES,
            over: false,
        };
        match tmpl.render_captured_to(ctx, &mut out) {
            Ok(_) => {}
            Err(_) if out.over => {
                return Err(TemplateError::Render {
                    name: self.name.clone(),
                    line: None,
                    construct: None,
                    message: format!(
                        "the rendered prompt went over {} MiB (far more than any model's \
                         context holds); the template is broken or hostile",
                        MAX_RENDERED_BYTES >> 20
                    ),
                });
            }
            Err(e) => return Err(Self::render_error(&self.name, &self.source, &e)),
        }
        String::from_utf8(out.out).map_err(|_| TemplateError::Render {
            name: self.name.clone(),
            line: None,
            construct: None,
            message: "the rendered prompt is not UTF-8".into(),
        })
    }

    fn located(source: &str, e: &Error) -> (Option<usize>, Option<String>) {
        let construct = e.range().and_then(|r| source.get(r)).map(|s| {
            let s = s.trim();
            if s.chars().count() > 120 {
                let cut: String = s.chars().take(117).collect();
                format!("{cut}...")
            } else {
                s.to_string()
            }
        });
        (e.line(), construct.filter(|c| !c.is_empty()))
    }

    fn message(e: &Error) -> String {
        match e.detail() {
            Some(d) => format!("{}: {d}", e.kind()),
            None => e.kind().to_string(),
        }
    }

    fn syntax_error(name: &str, source: &str, e: &Error) -> TemplateError {
        let (line, construct) = Self::located(source, e);
        TemplateError::Syntax {
            name: name.to_string(),
            line,
            construct,
            message: Self::message(e),
        }
    }

    fn render_error(name: &str, source: &str, e: &Error) -> TemplateError {
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
        while let Some(c) = cause {
            if let Some(r) = c.downcast_ref::<Raised>() {
                return TemplateError::Raised {
                    name: name.to_string(),
                    line: e.line(),
                    message: r.0.clone(),
                };
            }
            cause = c.source();
        }
        let (line, construct) = Self::located(source, e);
        TemplateError::Render {
            name: name.to_string(),
            line,
            construct,
            message: Self::message(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_tags_render_their_body() {
        assert_eq!(
            rewrite_generation_tags("a{%- generation -%}b{% endgeneration %}c{% if x %}"),
            "a{%- if true -%}b{% endif %}c{% if x %}"
        );
        // malformed tags pass through unchanged for the parser to report (found by
        // `cargo xtask fuzz`: `{%}` once sliced its own opening backwards)
        for src in [
            "{%}",
            "{%}%}",
            "{%-%}",
            "{%--%}",
            "{%",
            "x{%}{% generation %}",
        ] {
            let out = rewrite_generation_tags(src);
            assert!(out.starts_with(&src[..src.len().min(3)]), "{src} -> {out}");
        }
        assert!(ChatTemplate::new("{%}", "t").is_err());
    }

    /// A template that writes without end stops with a typed error: the fuel budget (charged
    /// per byte made) or, for a long conversation's larger budget, the output cap.
    #[test]
    fn output_is_capped() {
        let one = RenderInput::new(vec![serde_json::json!({"role": "user", "content": "hi"})]);
        let t = ChatTemplate::new("{{ 'x' * 99999999 }}", "t").unwrap();
        let err = t.render(&one).unwrap_err().to_string();
        assert!(err.contains("out of fuel"), "{err}");
        let many = RenderInput::new(vec![
            serde_json::json!({"role": "user", "content": "hi"});
            500
        ]);
        let t = ChatTemplate::new(
            "{% for i in range(40) %}{{ 'x' * 1048576 }}{% endfor %}",
            "t",
        )
        .unwrap();
        let err = t.render(&many).unwrap_err().to_string();
        assert!(err.contains("went over 32 MiB"), "{err}");
        // just under the cap renders
        let t = ChatTemplate::new(
            "{% for i in range(31) %}{{ 'x' * 1048576 }}{% endfor %}",
            "t",
        )
        .unwrap();
        assert_eq!(t.render(&many).unwrap().len(), 31 << 20);
    }
}
