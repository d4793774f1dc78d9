//! Streamed text: stop strings found in what is new, and reasoning (`<think>…</think>`) split
//! from the reply as it arrives.
//!
//! Both work on text pieces as a detokenizer emits them, and each push costs time in the size
//! of the new piece plus the longest stop string or tag, never in the text so far.

/// Finds stop strings in streamed text.
///
/// Text that could still be the start of a stop string is held back until it cannot; text
/// from a stop string on is never emitted.
///
/// ```
/// use mtp_chat::StopScanner;
/// let mut s = StopScanner::new(vec!["\n\n".into(), "END".into()]);
/// assert_eq!(s.push("Hello\n"), "Hello"); // "\n" may start "\n\n"
/// assert_eq!(s.push("world EN"), "\nworld "); // "EN" may start "END"
/// assert_eq!(s.push("D and more"), ""); // stop found: nothing after it
/// assert!(s.stopped());
/// assert_eq!(s.matched(), Some("END"));
/// ```
#[derive(Debug, Clone, Default)]
pub struct StopScanner {
    stops: Vec<String>,
    held: String,
    /// The index in `stops` of the stop string seen.
    matched: Option<usize>,
}

impl StopScanner {
    /// A scanner for these stop strings (empty ones are ignored).
    pub fn new(stops: Vec<String>) -> Self {
        StopScanner {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
            matched: None,
        }
    }

    /// True once a stop string was seen.
    pub fn stopped(&self) -> bool {
        self.matched.is_some()
    }

    /// The stop string seen (the one that starts first; of those, the first given).
    pub fn matched(&self) -> Option<&str> {
        self.matched.map(|i| self.stops[i].as_str())
    }

    /// Adds a piece of text; returns what can be emitted now.
    pub fn push(&mut self, piece: &str) -> String {
        if self.stopped() {
            return String::new();
        }
        if self.stops.is_empty() {
            return piece.to_string();
        }
        let mut buf = std::mem::take(&mut self.held);
        buf.push_str(piece);
        // Every match ends in the new piece or lies in `held`, and `held` never holds a whole
        // stop string (it would have been found), so searching `held + piece` is enough.
        let first = (self.stops.iter().enumerate())
            .filter_map(|(i, s)| buf.find(s.as_str()).map(|pos| (pos, i)))
            .min();
        if let Some((pos, i)) = first {
            self.matched = Some(i);
            buf.truncate(pos);
            return buf;
        }
        let hold = self
            .stops
            .iter()
            .flat_map(|s| {
                s.char_indices()
                    .skip(1)
                    .map(|(n, _)| &s[..n])
                    .filter(|p| buf.ends_with(p))
                    .map(str::len)
            })
            .max()
            .unwrap_or(0);
        self.held = buf.split_off(buf.len() - hold);
        buf
    }

    /// Ends the stream: the held text, unless a stop string was seen.
    pub fn finish(&mut self) -> String {
        if self.stopped() {
            String::new()
        } else {
            std::mem::take(&mut self.held)
        }
    }
}

/// The tags a model writes its reasoning between.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThinkTags {
    /// `<think>`.
    pub open: String,
    /// `</think>`.
    pub close: String,
}

impl Default for ThinkTags {
    fn default() -> Self {
        ThinkTags {
            open: "<think>".into(),
            close: "</think>".into(),
        }
    }
}

impl ThinkTags {
    /// The tags, when a chat template writes both (Qwen3, Qwen3.5, QwQ, DeepSeek-R1 and their
    /// kin); `None` for templates without reasoning blocks.
    pub fn from_template(source: &str) -> Option<ThinkTags> {
        let t = ThinkTags::default();
        (source.contains(&t.open) && source.contains(&t.close)).then_some(t)
    }

    /// True when `prompt` ends inside an open reasoning block: the template opened it for the
    /// model (Qwen3.5 with thinking on, DeepSeek-R1), so the reply starts with reasoning.
    pub fn prompt_opens_reasoning(&self, prompt: &str) -> bool {
        match (prompt.rfind(&self.open), prompt.rfind(&self.close)) {
            (Some(o), Some(c)) => o > c,
            (Some(_), None) => true,
            _ => false,
        }
    }
}

/// Text split into reasoning and answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Split {
    /// Reasoning (between the tags).
    pub reasoning: String,
    /// The answer.
    pub content: String,
    /// Pieces of tool calls read from the answer (see [`crate::ReplyText::with_tool_calls`]);
    /// their markup is not in `content`.
    pub tool_calls: Vec<mtp_contract::ToolCallDelta>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Before any text: the reply may open a reasoning block (after optional whitespace).
    Start,
    /// Inside the reasoning block; `leading` until its first non-whitespace character.
    Reasoning { leading: bool },
    /// After the reasoning block (or without one); `leading` until the answer's first
    /// non-whitespace character when a block came before.
    Content { leading: bool },
}

/// Splits a streamed reply into reasoning and answer, as llama-server's and vLLM's reasoning
/// parsers do for `<think>` models: the reply's reasoning is what lies between the opening tag
/// (written by the model at the very start, or by the template at the end of the prompt) and
/// the closing tag; whitespace around the reasoning and before the answer is dropped. A reply
/// that starts inside a block and never closes it is all reasoning.
///
/// ```
/// use mtp_chat::{ReasoningParser, ThinkTags};
/// let mut p = ReasoningParser::new(ThinkTags::default(), true); // the prompt opened <think>
/// let a = p.push("\nLet me add.\n</th");
/// let b = p.push("ink>\n\n4");
/// let c = p.finish();
/// assert_eq!(a.reasoning + &b.reasoning + &c.reasoning, "Let me add.");
/// assert_eq!(a.content + &b.content + &c.content, "4");
/// ```
#[derive(Debug, Clone)]
pub struct ReasoningParser {
    tags: ThinkTags,
    phase: Phase,
    held: String,
}

impl ReasoningParser {
    /// A parser; `opened` when the prompt ended inside a reasoning block
    /// ([`ThinkTags::prompt_opens_reasoning`]).
    pub fn new(tags: ThinkTags, opened: bool) -> Self {
        ReasoningParser {
            tags,
            phase: if opened {
                Phase::Reasoning { leading: true }
            } else {
                Phase::Start
            },
            held: String::new(),
        }
    }

    /// Adds a piece of the reply.
    pub fn push(&mut self, piece: &str) -> Split {
        let mut out = Split::default();
        let mut buf = std::mem::take(&mut self.held);
        buf.push_str(piece);
        self.feed(buf, &mut out, false);
        out
    }

    /// Ends the reply: whatever was held back goes out.
    pub fn finish(&mut self) -> Split {
        let mut out = Split::default();
        let buf = std::mem::take(&mut self.held);
        self.feed(buf, &mut out, true);
        out
    }

    fn feed(&mut self, mut buf: String, out: &mut Split, last: bool) {
        loop {
            match self.phase {
                Phase::Start => {
                    let trimmed = buf.trim_start();
                    if trimmed.starts_with(self.tags.open.as_str()) {
                        buf = trimmed[self.tags.open.len()..].to_string();
                        self.phase = Phase::Reasoning { leading: true };
                        continue;
                    }
                    if !last && self.tags.open.starts_with(trimmed) {
                        // empty, whitespace, or a prefix of the tag: wait for more
                        self.held = buf;
                        return;
                    }
                    self.phase = Phase::Content { leading: false };
                }
                Phase::Reasoning { leading } => {
                    if leading {
                        let t = buf.trim_start();
                        if t.is_empty() {
                            return; // only whitespace so far: dropped
                        }
                        buf = t.to_string();
                        self.phase = Phase::Reasoning { leading: false };
                    }
                    if let Some(pos) = buf.find(self.tags.close.as_str()) {
                        out.reasoning.push_str(buf[..pos].trim_end());
                        buf = buf[pos + self.tags.close.len()..].to_string();
                        self.phase = Phase::Content { leading: true };
                        continue;
                    }
                    if last {
                        out.reasoning.push_str(buf.trim_end());
                        return;
                    }
                    // hold trailing whitespace (dropped if the tag follows) and any suffix that
                    // may start the closing tag
                    let tag_hold = self
                        .tags
                        .close
                        .char_indices()
                        .skip(1)
                        .map(|(n, _)| &self.tags.close[..n])
                        .filter(|p| buf.ends_with(p))
                        .map(str::len)
                        .max()
                        .unwrap_or(0);
                    let body = &buf[..buf.len() - tag_hold];
                    let keep = body.trim_end().len();
                    out.reasoning.push_str(&buf[..keep]);
                    self.held = buf[keep..].to_string();
                    return;
                }
                Phase::Content { leading } => {
                    if leading {
                        let t = buf.trim_start();
                        if t.is_empty() {
                            return;
                        }
                        buf = t.to_string();
                        self.phase = Phase::Content { leading: false };
                    }
                    out.content.push_str(&buf);
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `text` split at every char boundary position pair and checks the joined output.
    fn split_all_ways(opened: bool, text: &str) -> (String, String) {
        let whole = {
            let mut p = ReasoningParser::new(ThinkTags::default(), opened);
            let a = p.push(text);
            let b = p.finish();
            (a.reasoning + &b.reasoning, a.content + &b.content)
        };
        let bounds: Vec<usize> = (0..=text.len())
            .filter(|&i| text.is_char_boundary(i))
            .collect();
        for &i in &bounds {
            for &j in bounds.iter().filter(|&&j| j >= i) {
                let mut p = ReasoningParser::new(ThinkTags::default(), opened);
                let mut r = String::new();
                let mut c = String::new();
                for piece in [&text[..i], &text[i..j], &text[j..]] {
                    let s = p.push(piece);
                    r += &s.reasoning;
                    c += &s.content;
                }
                let s = p.finish();
                r += &s.reasoning;
                c += &s.content;
                assert_eq!((r, c), whole, "pieces at {i}, {j} of {text:?}");
            }
        }
        whole
    }

    #[test]
    fn reasoning_split_is_independent_of_piece_boundaries() {
        for (opened, text, reasoning, content) in [
            (true, "\nThink.\n</think>\n\nAnswer.", "Think.", "Answer."),
            (false, "<think>\nA\nB\n</think>\n\nC", "A\nB", "C"),
            (false, "  <think>x</think>y", "x", "y"),
            (false, "No reasoning here.", "", "No reasoning here."),
            (false, "<thin", "", "<thin"),
            (true, "never closed \n", "never closed", ""),
            (true, "a </thinking> b</think>c", "a </thinking> b", "c"),
            (
                false,
                "text then <think>late</think>",
                "",
                "text then <think>late</think>",
            ),
            (true, "é日本</think>\n\n🎉", "é日本", "🎉"),
            (true, "</think>\n\nOnly answer", "", "Only answer"),
        ] {
            assert_eq!(
                split_all_ways(opened, text),
                (reasoning.to_string(), content.to_string()),
                "{text:?}"
            );
        }
    }

    #[test]
    fn stop_scanner_is_independent_of_piece_boundaries() {
        let stops = vec!["</s>".to_string(), "ab".to_string(), "日本".to_string()];
        for (text, want, stopped) in [
            ("hello </s> world", "hello ", true),
            ("xxaxxab", "xxaxx", true),
            ("a", "a", false),
            ("こんにちは日本語", "こんにちは", true),
            ("no stop <", "no stop <", false),
        ] {
            let bounds: Vec<usize> = (0..=text.len())
                .filter(|&i| text.is_char_boundary(i))
                .collect();
            for &i in &bounds {
                let mut s = StopScanner::new(stops.clone());
                let mut got = s.push(&text[..i]);
                got += &s.push(&text[i..]);
                got += &s.finish();
                assert_eq!(got, want, "{text:?} split at {i}");
                assert_eq!(s.stopped(), stopped);
            }
        }
    }

    #[test]
    fn prompt_opening_reasoning() {
        let t = ThinkTags::default();
        assert!(t.prompt_opens_reasoning("<|im_start|>assistant\n<think>\n"));
        assert!(!t.prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
        assert!(!t.prompt_opens_reasoning("<|im_start|>assistant\n"));
        assert!(t.prompt_opens_reasoning("<think>old</think> more <think>\n"));
    }
}
