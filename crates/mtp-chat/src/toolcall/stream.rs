//! The reply read for tool calls piece by piece, as OpenAI streams `delta.tool_calls`.
//!
//! One state machine serves both ways of reading: [`super::parse`] pushes the whole text at
//! once, so a stream and a whole parse cannot disagree. Every decision depends on the text
//! only, never on where the pieces were cut: text that could still be the start of a marker
//! is held until the next piece settles it.

use serde_json::{json, Value};

use super::{coerce, functions, properties, py_json, schema_types, CallIds, ToolCallFormat};

const TOOL_CALL: &str = "<tool_call>";
const TOOL_CALL_END: &str = "</tool_call>";
const FUNCTION: &str = "<function=";
const FUNCTION_END: &str = "</function>";
const PARAMETER: &str = "<parameter=";
const PARAMETER_END: &str = "</parameter>";
/// The longest function or parameter name read; a `<function=` with no `>` within this many
/// bytes is text, not a call (OpenAI caps names at 64 characters).
const MAX_NAME: usize = 256;

/// What a piece of the reply adds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamEvent {
    /// Text of the reply that is not a call (`delta.content`).
    Content(String),
    /// A piece of call `index` (`delta.tool_calls[0]`): its first piece carries the id and
    /// the name and empty arguments, the later ones only arguments, whose concatenation is
    /// the call's whole `arguments`.
    ToolCallDelta {
        /// The call's place among the reply's calls, from 0.
        index: usize,
        /// The call's id, in its first piece only.
        id: Option<String>,
        /// The function's name, in the call's first piece only.
        name: Option<String>,
        /// The next piece of the arguments' JSON text.
        arguments: String,
    },
}

impl StreamEvent {
    /// The event as the `delta` object of an OpenAI `chat.completion.chunk`.
    pub fn to_openai(&self) -> Value {
        match self {
            StreamEvent::Content(t) => json!({ "content": t }),
            StreamEvent::ToolCallDelta {
                index,
                id,
                name,
                arguments,
            } => {
                let mut call = json!({"index": index, "function": {"arguments": arguments}});
                if let Some(id) = id {
                    call["id"] = json!(id);
                    call["type"] = json!("function");
                }
                if let Some(name) = name {
                    call["function"]["name"] = json!(name);
                }
                json!({ "tool_calls": [call] })
            }
        }
    }
}

#[derive(Debug, Clone)]
enum State {
    /// Content, between calls.
    Text,
    /// Hermes: inside `<tool_call>`; `raw` is everything since the tag, for a call that turns
    /// out malformed and goes back to text.
    Hermes { raw: String },
    /// XML: after `<tool_call>`, before its first `<function=`.
    XmlOpen { raw: String },
    /// XML: reading the name after `<function=`; `raw` is the markup so far while no call
    /// is open yet (a bad name makes it text), `None` inside a wrapper that already held one.
    XmlName { raw: Option<String>, wrapped: bool },
    /// XML: in an open call, between parameters.
    XmlBody { wrapped: bool },
    /// XML: reading the key after `<parameter=`.
    XmlKey { wrapped: bool },
    /// XML: reading a parameter's value.
    XmlValue {
        wrapped: bool,
        key: String,
        value: String,
    },
    /// XML: after `</function>`, inside `<tool_call>`: another function or its close.
    XmlAfter,
}

/// The call being read.
#[derive(Debug, Clone)]
struct Open {
    index: usize,
    name: String,
    keys: Vec<String>,
}

/// Reads a streamed reply for tool calls; see the [module](super) for the rules.
///
/// ```
/// use mtp_chat::toolcall::{CallIds, StreamEvent, ToolCallFormat, ToolCallStream};
///
/// let mut s = ToolCallStream::with_ids(ToolCallFormat::QwenXml, &[], CallIds::seeded(1));
/// let mut events = Vec::new();
/// for piece in ["Sure.\n<tool", "_call>\n<function=ls>\n<parameter=path>\n/tmp\n</param",
///               "eter>\n</function>\n</tool_call>"] {
///     events.extend(s.push(piece));
/// }
/// events.extend(s.finish());
/// assert_eq!(events[0], StreamEvent::Content("Sure.".into()));
/// let StreamEvent::ToolCallDelta { index: 0, name: Some(name), .. } = &events[1] else {
///     panic!()
/// };
/// assert_eq!(name, "ls");
/// let args: String = events[2..]
///     .iter()
///     .map(|e| match e {
///         StreamEvent::ToolCallDelta { arguments, .. } => arguments.as_str(),
///         _ => "",
///     })
///     .collect();
/// assert_eq!(args, r#"{"path": "/tmp"}"#);
/// ```
#[derive(Debug, Clone)]
pub struct ToolCallStream {
    format: ToolCallFormat,
    tools: Vec<(String, Value)>,
    ids: CallIds,
    state: State,
    /// Input not yet decided on.
    buf: String,
    /// Whitespace at the end of the content so far: content if text follows, dropped if a
    /// call does.
    pending_ws: String,
    /// A call was read (so whitespace alone after it is not content).
    after_call: bool,
    /// The text since the last call has more than whitespace.
    seg_has_text: bool,
    /// Some content was emitted.
    content_started: bool,
    calls: usize,
    open: Option<Open>,
    junk_warned: bool,
    out: Vec<StreamEvent>,
    warnings: Vec<String>,
    finished: bool,
    /// The input is inside an XML call block (what is consumed is kept in `block_text`).
    in_block: bool,
    /// The markup of the XML call block being read, from its `<tool_call>` (or bare
    /// `<function=`) on.
    block_text: String,
    /// The first call of that block.
    block_first: usize,
    /// The calls the token limit cut, once [`ToolCallStream::finish_cut`] found some.
    cut: Option<CutCalls>,
    /// The closing piece of a wrapped call's arguments, held until its `</tool_call>`: a
    /// call is complete with its block.
    held: Option<(usize, String)>,
}

/// The calls of a reply the token limit cut inside an XML call block (see
/// [`ToolCallStream::finish_cut`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CutCalls {
    /// The index of the block's first call: it and every later call are incomplete.
    pub first: usize,
    /// The block's markup as the reply wrote it, from its `<tool_call>` (or `<function=`).
    pub text: String,
}

impl ToolCallStream {
    /// A reader for a reply in `format`, typing parameters by `tools` (the request's
    /// OpenAI `tools`), with random call ids.
    pub fn new(format: ToolCallFormat, tools: &[Value]) -> Self {
        Self::with_ids(format, tools, CallIds::random())
    }

    /// The same, with call ids from `ids`.
    pub fn with_ids(format: ToolCallFormat, tools: &[Value], ids: CallIds) -> Self {
        ToolCallStream {
            format,
            tools: functions(tools),
            ids,
            state: State::Text,
            buf: String::new(),
            pending_ws: String::new(),
            after_call: false,
            seg_has_text: false,
            content_started: false,
            calls: 0,
            open: None,
            junk_warned: false,
            out: Vec::new(),
            warnings: Vec::new(),
            finished: false,
            in_block: false,
            block_text: String::new(),
            block_first: 0,
            cut: None,
            held: None,
        }
    }

    /// Adds a piece of the reply; returns what it settles. Text that may still be markup is
    /// held back, so raw `<tool_call>` never reaches content unless it turns out not to be a
    /// call.
    pub fn push(&mut self, piece: &str) -> Vec<StreamEvent> {
        if self.finished {
            return Vec::new();
        }
        self.buf.push_str(piece);
        while self.step(false) {}
        std::mem::take(&mut self.out)
    }

    /// Ends the reply: held text is content, a call left open is closed with what it has
    /// (a warning says so), markup that never became a call is content.
    pub fn finish(&mut self) -> Vec<StreamEvent> {
        if self.finished {
            return Vec::new();
        }
        self.finished = true;
        while self.step(true) {}
        std::mem::take(&mut self.out)
    }

    /// Ends a reply the token limit cut (`finish_reason: "length"`). As [`Self::finish`],
    /// except inside an XML call block (after `<tool_call>` and a `<function=NAME>`, before
    /// `</tool_call>`; or inside a bare `<function=NAME>`): the block's calls are incomplete,
    /// so nothing closes them (no final `}` of their arguments goes out: in a stream their
    /// pieces sent so far stay unterminated JSON, as OpenAI leaves a call `max_tokens` cut),
    /// and [`Self::cut`] names them and gives the block's text, which a whole answer returns
    /// as content in their place (as vLLM returns text it cannot read as a call). A Hermes
    /// `<tool_call>` left open is text either way.
    pub fn finish_cut(&mut self) -> Vec<StreamEvent> {
        if self.finished {
            return Vec::new();
        }
        let open_block = match &self.state {
            State::XmlBody { .. } | State::XmlKey { .. } | State::XmlValue { .. } => true,
            State::XmlAfter | State::XmlName { raw: None, .. } => true,
            State::Text | State::Hermes { .. } | State::XmlOpen { .. } => false,
            State::XmlName { raw: Some(_), .. } => false,
        };
        if !open_block || self.calls <= self.block_first {
            return self.finish();
        }
        self.finished = true;
        let mut text = std::mem::take(&mut self.block_text);
        text.push_str(&std::mem::take(&mut self.buf));
        self.warn(format!(
            "the token limit cut tool call {} inside its markup; it is incomplete",
            self.block_first + 1
        ));
        self.cut = Some(CutCalls {
            first: self.block_first,
            text,
        });
        self.state = State::Text;
        self.open = None;
        self.held = None;
        self.in_block = false;
        std::mem::take(&mut self.out)
    }

    /// The calls the token limit cut, after [`Self::finish_cut`].
    pub fn cut(&self) -> Option<&CutCalls> {
        self.cut.as_ref()
    }

    /// How many calls have started so far (a reply with any ends with
    /// `finish_reason: "tool_calls"`).
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// The warnings so far (see [`super::ParsedReply::warnings`]), taken.
    pub fn take_warnings(&mut self) -> Vec<String> {
        std::mem::take(&mut self.warnings)
    }

    fn warn(&mut self, w: String) {
        self.warnings.push(w);
    }

    /// Consumes `n` bytes of the held input.
    fn take(&mut self, n: usize) -> String {
        let t: String = self.buf.drain(..n).collect();
        if self.in_block {
            self.block_text.push_str(&t);
        }
        t
    }

    /// Consumes `n` bytes of the held input (markup, not kept).
    fn skip(&mut self, n: usize) {
        self.take(n);
    }

    /// One step of the machine; false when it needs more input (or, at the end, is done).
    fn step(&mut self, eof: bool) -> bool {
        let in_block = !matches!(self.state, State::Text | State::Hermes { .. });
        if in_block != self.in_block {
            self.in_block = in_block;
        }
        match std::mem::replace(&mut self.state, State::Text) {
            State::Text => self.step_text(eof),
            State::Hermes { raw } => self.step_hermes(raw, eof),
            State::XmlOpen { raw } => self.step_open(raw, eof),
            State::XmlName { raw, wrapped } => self.step_name(raw, wrapped, eof),
            State::XmlBody { wrapped } => self.step_body(wrapped, eof),
            State::XmlKey { wrapped } => self.step_key(wrapped, eof),
            State::XmlValue {
                wrapped,
                key,
                value,
            } => self.step_value(wrapped, key, value, eof),
            State::XmlAfter => self.step_after(eof),
        }
    }

    fn step_text(&mut self, eof: bool) -> bool {
        let markers: &[&str] = match self.format {
            ToolCallFormat::QwenXml => &[TOOL_CALL, FUNCTION],
            ToolCallFormat::HermesJson => &[TOOL_CALL],
        };
        match scan(&self.buf, markers) {
            Scan::At(p, m) => {
                let before = self.take(p);
                self.text(&before);
                let raw = self.take(markers[m].len());
                // an XML block starts: its text is kept from its marker on (with the blank
                // that separates it from content before it, which it would be if cut)
                self.block_text = if self.content_started {
                    format!("{}{raw}", self.pending_ws)
                } else {
                    raw.clone()
                };
                self.block_first = self.calls;
                self.state = match (self.format, m) {
                    (ToolCallFormat::HermesJson, _) => State::Hermes { raw },
                    (ToolCallFormat::QwenXml, 0) => State::XmlOpen { raw },
                    (ToolCallFormat::QwenXml, _) => State::XmlName {
                        raw: Some(raw),
                        wrapped: false,
                    },
                };
                true
            }
            Scan::Safe(n) => {
                let t = self.take(if eof { self.buf.len() } else { n });
                self.text(&t);
                if eof {
                    let ws = std::mem::take(&mut self.pending_ws);
                    if self.seg_has_text || !self.after_call {
                        self.content(ws);
                    }
                }
                false
            }
        }
    }

    fn step_hermes(&mut self, mut raw: String, eof: bool) -> bool {
        match scan(&self.buf, &[TOOL_CALL_END]) {
            Scan::At(p, _) => {
                raw.push_str(&self.take(p));
                match hermes_call(&raw[TOOL_CALL.len()..]) {
                    Ok((name, arguments)) => {
                        self.skip(TOOL_CALL_END.len());
                        self.open_call(name);
                        self.fragment(arguments);
                        self.open = None;
                        self.closed();
                    }
                    Err(why) => {
                        self.warn(format!("a <tool_call> kept as text: {why}"));
                        raw.push_str(&self.take(TOOL_CALL_END.len()));
                        self.text(&raw);
                    }
                }
                true
            }
            Scan::Safe(n) if !eof => {
                raw.push_str(&self.take(n));
                self.state = State::Hermes { raw };
                false
            }
            Scan::Safe(_) => {
                raw.push_str(&self.take(self.buf.len()));
                self.warn("a <tool_call> the reply did not close, kept as text".into());
                self.text(&raw);
                true
            }
        }
    }

    fn step_open(&mut self, mut raw: String, eof: bool) -> bool {
        match scan(&self.buf, &[FUNCTION, TOOL_CALL_END]) {
            Scan::At(p, 0) => {
                raw.push_str(&self.take(p + FUNCTION.len()));
                self.state = State::XmlName {
                    raw: Some(raw),
                    wrapped: true,
                };
            }
            Scan::At(p, _) => {
                raw.push_str(&self.take(p + TOOL_CALL_END.len()));
                self.warn("a <tool_call> without a <function=...>, kept as text".into());
                self.text(&raw);
            }
            Scan::Safe(n) if !eof => {
                raw.push_str(&self.take(n));
                self.state = State::XmlOpen { raw };
                return false;
            }
            Scan::Safe(_) => {
                raw.push_str(&self.take(self.buf.len()));
                self.warn("a <tool_call> the reply did not close, kept as text".into());
                self.text(&raw);
            }
        }
        true
    }

    fn step_name(&mut self, raw: Option<String>, wrapped: bool, eof: bool) -> bool {
        match read_name(&self.buf, eof) {
            Name::Wait => {
                self.state = State::XmlName { raw, wrapped };
                false
            }
            Name::Good(name, len) => {
                self.skip(len);
                self.open_call(name);
                self.state = State::XmlBody { wrapped };
                true
            }
            Name::Bad => {
                match raw {
                    // the markup so far is text; reading goes on after `<function=`
                    Some(raw) => {
                        self.warn("a <function=...> without a name, kept as text".into());
                        self.text(&raw);
                    }
                    None => {
                        self.warn("a <function=...> without a name, dropped".into());
                        self.state = State::XmlAfter;
                    }
                }
                true
            }
        }
    }

    fn step_body(&mut self, wrapped: bool, eof: bool) -> bool {
        match scan(&self.buf, &[PARAMETER, FUNCTION_END, TOOL_CALL_END]) {
            Scan::At(p, m) => {
                let junk = self.take(p);
                self.junk(&junk);
                self.state = match m {
                    0 => {
                        self.skip(PARAMETER.len());
                        State::XmlKey { wrapped }
                    }
                    1 => {
                        self.skip(FUNCTION_END.len());
                        self.close_xml(wrapped);
                        if wrapped {
                            State::XmlAfter
                        } else {
                            State::Text
                        }
                    }
                    _ => {
                        self.skip(TOOL_CALL_END.len());
                        self.warn("a <function=...> closed by </tool_call> alone".into());
                        self.close_xml(false);
                        State::Text
                    }
                };
                true
            }
            Scan::Safe(n) if !eof => {
                let junk = self.take(n);
                self.junk(&junk);
                self.state = State::XmlBody { wrapped };
                false
            }
            Scan::Safe(_) => {
                let junk = self.take(self.buf.len());
                self.junk(&junk);
                self.warn("the reply ended inside a <function=...>; closed".into());
                self.close_xml(false);
                true
            }
        }
    }

    fn step_key(&mut self, wrapped: bool, eof: bool) -> bool {
        match read_name(&self.buf, eof) {
            Name::Wait => {
                self.state = State::XmlKey { wrapped };
                false
            }
            Name::Good(key, len) => {
                self.skip(len);
                self.state = State::XmlValue {
                    wrapped,
                    key,
                    value: String::new(),
                };
                true
            }
            Name::Bad => {
                self.warn("a <parameter=...> without a name, dropped".into());
                self.state = State::XmlBody { wrapped };
                true
            }
        }
    }

    fn step_value(&mut self, wrapped: bool, key: String, mut value: String, eof: bool) -> bool {
        // vLLM's value ends at `</parameter>`, or where the next parameter or the function
        // starts or ends when the model left it open
        match scan(
            &self.buf,
            &[PARAMETER_END, PARAMETER, FUNCTION_END, TOOL_CALL_END],
        ) {
            Scan::At(p, m) => {
                value.push_str(&self.take(p));
                if m == 0 {
                    self.skip(PARAMETER_END.len());
                } else {
                    self.warn(format!("parameter `{key}` not closed by </parameter>"));
                }
                self.param(&key, &value);
                self.state = State::XmlBody { wrapped };
                true
            }
            Scan::Safe(n) if !eof => {
                value.push_str(&self.take(n));
                self.state = State::XmlValue {
                    wrapped,
                    key,
                    value,
                };
                false
            }
            Scan::Safe(_) => {
                value.push_str(&self.take(self.buf.len()));
                self.param(&key, &value);
                self.state = State::XmlBody { wrapped };
                true
            }
        }
    }

    fn step_after(&mut self, eof: bool) -> bool {
        match scan(&self.buf, &[FUNCTION, TOOL_CALL_END]) {
            Scan::At(p, m) => {
                let junk = self.take(p);
                self.junk(&junk);
                self.release();
                if m == 0 {
                    self.skip(FUNCTION.len());
                    self.state = State::XmlName {
                        raw: None,
                        wrapped: true,
                    };
                } else {
                    self.skip(TOOL_CALL_END.len());
                }
                true
            }
            Scan::Safe(n) if !eof => {
                let junk = self.take(n);
                self.junk(&junk);
                self.state = State::XmlAfter;
                false
            }
            Scan::Safe(_) => {
                let junk = self.take(self.buf.len());
                self.junk(&junk);
                self.release();
                self.warn("the reply ended inside a <tool_call>".into());
                true
            }
        }
    }

    /// Text that is content unless a call follows it: its trailing whitespace waits.
    fn text(&mut self, s: &str) {
        let kept = s.trim_end();
        if kept.is_empty() {
            self.pending_ws.push_str(s);
            return;
        }
        let mut c = std::mem::take(&mut self.pending_ws);
        c.push_str(kept);
        if self.after_call && !self.content_started {
            // text after calls with none before them: the blank that separates it from the
            // calls is not content either
            c = c.trim_start().to_string();
        }
        self.pending_ws = s[kept.len()..].to_string();
        self.seg_has_text = true;
        self.content(c);
    }

    fn content(&mut self, c: String) {
        if c.is_empty() {
            return;
        }
        self.content_started = true;
        match self.out.last_mut() {
            Some(StreamEvent::Content(last)) => last.push_str(&c),
            _ => self.out.push(StreamEvent::Content(c)),
        }
    }

    /// Text inside a call but outside its parts: dropped, as vLLM drops it.
    fn junk(&mut self, s: &str) {
        if !self.junk_warned && !s.trim().is_empty() {
            self.junk_warned = true;
            self.warn("text inside a <tool_call> outside its parts was dropped".into());
        }
    }

    fn open_call(&mut self, name: String) {
        // the whitespace between the content and the call is not content
        self.pending_ws.clear();
        self.junk_warned = false;
        if !self.tools.iter().any(|(n, _)| *n == name) {
            self.warn(format!("call of `{name}`, which is not among the tools"));
        }
        let index = self.calls;
        self.calls += 1;
        self.out.push(StreamEvent::ToolCallDelta {
            index,
            id: Some(self.ids.next_id()),
            name: Some(name.clone()),
            arguments: String::new(),
        });
        self.open = Some(Open {
            index,
            name,
            keys: Vec::new(),
        });
    }

    fn fragment(&mut self, s: String) {
        let Some(open) = &self.open else { return };
        match self.out.last_mut() {
            Some(StreamEvent::ToolCallDelta {
                index,
                id: None,
                arguments,
                ..
            }) if *index == open.index => arguments.push_str(&s),
            _ => self.out.push(StreamEvent::ToolCallDelta {
                index: open.index,
                id: None,
                name: None,
                arguments: s,
            }),
        }
    }

    /// A parameter read: typed by the tool's schema and written as the next member of the
    /// arguments object.
    fn param(&mut self, key: &str, value: &str) {
        let Some(open) = &mut self.open else { return };
        // vLLM strips one newline on each side (the template writes the value between them)
        let value = value.strip_prefix('\n').unwrap_or(value);
        let value = value.strip_suffix('\n').unwrap_or(value);
        let mut warnings = Vec::new();
        let types = match properties(&self.tools, &open.name) {
            Some((root, Some(props))) => match props.get(key) {
                Some(schema) => schema_types(root, schema),
                None => {
                    warnings.push(format!(
                        "parameter `{key}` of `{}` is not in its schema; kept as a string",
                        open.name
                    ));
                    vec!["string"]
                }
            },
            _ => vec!["string"],
        };
        let (json, fits) = coerce(value, &types);
        if !fits {
            warnings.push(format!(
                "parameter `{key}` of `{}` is not {}; kept as written",
                open.name,
                types.join(" or ")
            ));
        }
        if open.keys.iter().any(|k| k == key) {
            warnings.push(format!("parameter `{key}` of `{}` given twice", open.name));
        }
        let sep = if open.keys.is_empty() { "{" } else { ", " };
        open.keys.push(key.to_string());
        let member = format!("{sep}{}: {json}", py_json(&Value::String(key.into())));
        self.warnings.extend(warnings);
        self.fragment(member);
    }

    /// Ends the open call's arguments; with `hold` (a call inside `<tool_call>`) the closing
    /// piece waits for the block's end ([`Self::release`]).
    fn close_xml(&mut self, hold: bool) {
        let last = match &self.open {
            Some(o) if o.keys.is_empty() => "{}",
            Some(_) => "}",
            None => "",
        };
        match self.open.as_ref().map(|o| o.index) {
            Some(index) if hold => {
                self.release();
                self.held = Some((index, last.to_string()));
            }
            _ => self.fragment(last.to_string()),
        }
        self.open = None;
        self.closed();
    }

    /// Sends the held closing piece of a call (its block ended, or the reply did).
    fn release(&mut self) {
        let Some((index, last)) = self.held.take() else {
            return;
        };
        match self.out.last_mut() {
            Some(StreamEvent::ToolCallDelta {
                index: i,
                id: None,
                arguments,
                ..
            }) if *i == index => arguments.push_str(&last),
            _ => self.out.push(StreamEvent::ToolCallDelta {
                index,
                id: None,
                name: None,
                arguments: last,
            }),
        }
    }

    fn closed(&mut self) {
        self.after_call = true;
        self.seg_has_text = false;
    }
}

enum Scan {
    /// Marker `.1` starts at byte `.0`.
    At(usize, usize),
    /// No marker; the first `.0` bytes cannot be part of one.
    Safe(usize),
}

/// The earliest marker in `buf`, or how much of `buf` is surely not one: all but its longest
/// tail that is the start of a marker (markers are ASCII, so the cut is a char boundary).
fn scan(buf: &str, markers: &[&str]) -> Scan {
    let hit = markers
        .iter()
        .enumerate()
        .filter_map(|(i, m)| buf.find(m).map(|p| (p, i)))
        .min();
    if let Some((p, i)) = hit {
        return Scan::At(p, i);
    }
    let b = buf.as_bytes();
    let hold = markers
        .iter()
        .map(|m| {
            (1..m.len().min(b.len() + 1))
                .rev()
                .find(|&k| b.ends_with(&m.as_bytes()[..k]))
                .unwrap_or(0)
        })
        .max()
        .unwrap_or(0);
    Scan::Safe(b.len() - hold)
}

enum Name {
    Wait,
    /// The name and the bytes it took with its `>`.
    Good(String, usize),
    Bad,
}

/// A name up to `>`: one line, no `<`, at most [`MAX_NAME`] bytes, not blank.
fn read_name(buf: &str, eof: bool) -> Name {
    match buf.bytes().position(|b| matches!(b, b'>' | b'\n' | b'<')) {
        Some(i) if i <= MAX_NAME && buf.as_bytes()[i] == b'>' => {
            let name = buf[..i].trim();
            if name.is_empty() {
                Name::Bad
            } else {
                Name::Good(name.to_string(), i + 1)
            }
        }
        Some(_) => Name::Bad,
        None if eof || buf.len() > MAX_NAME => Name::Bad,
        None => Name::Wait,
    }
}

/// A Hermes call's name and arguments (`arguments`, or `parameters` as some models write),
/// or why it is not one. Arguments given as a JSON string of an object are read as that
/// object; missing or `null` arguments are `{}`.
fn hermes_call(body: &str) -> Result<(String, String), String> {
    let v: Value = serde_json::from_str(body.trim()).map_err(|e| format!("not JSON ({e})"))?;
    let obj = v.as_object().ok_or("not a JSON object")?;
    let name = obj
        .get("name")
        .and_then(Value::as_str)
        .filter(|n| !n.trim().is_empty())
        .ok_or("no \"name\"")?;
    let args = match obj.get("arguments").or_else(|| obj.get("parameters")) {
        None | Some(Value::Null) => json!({}),
        Some(a @ Value::Object(_)) => a.clone(),
        Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
            Ok(a @ Value::Object(_)) => a,
            _ => return Err("\"arguments\" is a string that is not a JSON object".into()),
        },
        Some(_) => return Err("\"arguments\" is not an object".into()),
    };
    Ok((name.to_string(), py_json(&args)))
}
