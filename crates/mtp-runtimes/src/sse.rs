//! A byte-level Server-Sent Events parser (the WHATWG `text/event-stream` rules that matter
//! for LLM servers).
//!
//! Bytes may arrive split anywhere: in the middle of a line, between `\r` and `\n`, or inside
//! a multi-byte UTF-8 character. The parser buffers until a line is complete, so callers can
//! feed whatever the socket delivered.
//!
//! Rules implemented:
//! - lines end with `\n`, `\r\n` or a lone `\r`;
//! - a line starting with `:` is a comment and is skipped;
//! - `field: value` (one optional space after the colon is removed), `field` alone means an
//!   empty value;
//! - several `data:` lines in one event are joined with `\n`;
//! - a blank line dispatches the event; an event with no `data` line is dropped;
//! - at end of input, an event that was not terminated by a blank line is discarded (the
//!   stream was cut); [`SseParser::has_pending`] tells whether that happened.
//!
//! Memory is bounded: one line, or one event's lines together, may hold at most the parser's
//! limit ([`DEFAULT_MAX_EVENT_BYTES`], or [`SseParser::with_max_event_bytes`]). Going over it
//! stops the parser for good: what it buffered is freed, [`SseParser::overflow`] names the
//! limit, and `feed` returns nothing more. A server can therefore send a line that never ends
//! without the client holding more than the limit.
//!
//! ```
//! use mtp_runtimes::sse::SseParser;
//! let mut p = SseParser::new();
//! let mut events = p.feed(b": keep-alive\ndata: {\"a\":\ndata: 1}\n\nda");
//! events.extend(p.feed(b"ta: [DONE]\r\n\r\n"));
//! assert_eq!(events.len(), 2);
//! assert_eq!(events[0].data, "{\"a\":\n1}");
//! assert!(events[1].is_done());
//!
//! let mut small = SseParser::with_max_event_bytes(16);
//! assert_eq!(small.feed(b"data: ok\n\ndata: a line longer than sixteen bytes").len(), 1);
//! assert_eq!(small.overflow(), Some(16));
//! ```

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field, when the server named one.
    pub event: Option<String>,
    /// The joined `data:` lines.
    pub data: String,
}

impl SseEvent {
    /// True for the OpenAI end-of-stream sentinel `data: [DONE]`.
    pub fn is_done(&self) -> bool {
        self.data.trim() == "[DONE]"
    }
}

/// The default limit of one line or event: 16 MiB, far above any chunk an LLM server streams.
pub const DEFAULT_MAX_EVENT_BYTES: usize = 16 << 20;

/// Incremental SSE parser; see the module documentation for the rules.
#[derive(Debug)]
pub struct SseParser {
    /// Bytes of the current, unfinished line.
    line: Vec<u8>,
    /// Bytes of the `data` lines gathered for the event being assembled.
    event_bytes: usize,
    /// Most bytes one line, or one event's data lines with the current line, may hold.
    max_event_bytes: usize,
    /// The limit was exceeded: the parser takes no more input.
    overflowed: bool,
    /// The previous chunk ended with `\r`; a leading `\n` in the next chunk belongs to it.
    after_cr: bool,
    /// `data` lines of the event being assembled.
    data: Vec<String>,
    /// `event` field of the event being assembled.
    event: Option<String>,
    /// Any field was seen since the last dispatch.
    pending: bool,
}

impl Default for SseParser {
    fn default() -> Self {
        SseParser::with_max_event_bytes(DEFAULT_MAX_EVENT_BYTES)
    }
}

impl SseParser {
    /// A parser at the start of a stream, with the default limit
    /// ([`DEFAULT_MAX_EVENT_BYTES`]).
    pub fn new() -> Self {
        SseParser::default()
    }

    /// A parser whose lines, and events (their `data` lines together), may hold at most
    /// `max_event_bytes` bytes (line terminators not counted; at least 1).
    pub fn with_max_event_bytes(max_event_bytes: usize) -> Self {
        SseParser {
            line: Vec::new(),
            event_bytes: 0,
            max_event_bytes: max_event_bytes.max(1),
            overflowed: false,
            after_cr: false,
            data: Vec::new(),
            event: None,
            pending: false,
        }
    }

    /// Feeds bytes and returns the events they completed, in order. After an overflow (see
    /// [`SseParser::overflow`]) it returns the events completed before it, then nothing.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        let mut out = Vec::new();
        let mut rest = bytes;
        while !rest.is_empty() && !self.overflowed {
            if self.after_cr {
                self.after_cr = false;
                if rest[0] == b'\n' {
                    rest = &rest[1..];
                    continue;
                }
            }
            match rest.iter().position(|&b| b == b'\n' || b == b'\r') {
                Some(i) => {
                    if !self.take(&rest[..i]) {
                        break;
                    }
                    self.after_cr = rest[i] == b'\r';
                    self.end_line(&mut out);
                    rest = &rest[i + 1..];
                }
                None => {
                    self.take(rest);
                    break;
                }
            }
        }
        out
    }

    /// The limit, once a line or an event went over it; the parser then takes no more input.
    pub fn overflow(&self) -> Option<usize> {
        self.overflowed.then_some(self.max_event_bytes)
    }

    /// True when bytes or fields were received that no blank line has dispatched yet: the
    /// stream ended in the middle of an event (or went over the limit).
    pub fn has_pending(&self) -> bool {
        self.pending || !self.line.is_empty() || self.overflowed
    }

    /// Appends bytes of the current line, unless that would go over the limit: then frees
    /// everything buffered, marks the overflow and returns false.
    fn take(&mut self, bytes: &[u8]) -> bool {
        let held = self.event_bytes + self.line.len();
        if bytes.len() > self.max_event_bytes.saturating_sub(held) {
            self.overflowed = true;
            self.line = Vec::new();
            self.data = Vec::new();
            self.event = None;
            self.event_bytes = 0;
            return false;
        }
        self.line.extend_from_slice(bytes);
        true
    }

    fn end_line(&mut self, out: &mut Vec<SseEvent>) {
        let line = std::mem::take(&mut self.line);
        if line.is_empty() {
            self.dispatch(out);
            return;
        }
        if line[0] == b':' {
            return; // comment
        }
        let text = String::from_utf8_lossy(&line);
        let (field, value) = match text.find(':') {
            Some(i) => {
                let v = &text[i + 1..];
                (&text[..i], v.strip_prefix(' ').unwrap_or(v))
            }
            None => (text.as_ref(), ""),
        };
        match field {
            "data" => {
                self.data.push(value.to_string());
                self.event_bytes += line.len();
                self.pending = true;
            }
            "event" => {
                self.event = Some(value.to_string());
                self.pending = true;
            }
            // `id` and `retry` only matter to reconnecting browsers.
            _ => {}
        }
    }

    fn dispatch(&mut self, out: &mut Vec<SseEvent>) {
        self.pending = false;
        self.event_bytes = 0;
        let event = self.event.take();
        if self.data.is_empty() {
            return;
        }
        let data = std::mem::take(&mut self.data).join("\n");
        out.push(SseEvent { event, data });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_at_once(input: &[u8]) -> Vec<SseEvent> {
        SseParser::new().feed(input)
    }

    fn byte_by_byte(input: &[u8]) -> Vec<SseEvent> {
        let mut p = SseParser::new();
        input
            .iter()
            .flat_map(|b| p.feed(std::slice::from_ref(b)))
            .collect()
    }

    #[test]
    fn table() {
        // (input, expected data of each event)
        let cases: &[(&str, &[&str])] = &[
            ("data: a\n\n", &["a"]),
            ("data:a\n\n", &["a"]),
            ("data:  two spaces\n\n", &[" two spaces"]),
            ("data: a\ndata: b\n\n", &["a\nb"]),
            ("data: a\r\n\r\ndata: b\r\r", &["a", "b"]),
            (": comment\ndata: x\n: another\n\n", &["x"]),
            ("event: ping\n\n", &[]),
            ("data\n\n", &[""]),
            ("id: 7\nretry: 10\ndata: y\n\n", &["y"]),
            ("data: [DONE]\n\n", &["[DONE]"]),
            ("data: cut", &[]),
            ("data: é日本\n\n", &["é日本"]),
            ("\n\n\ndata: z\n\n", &["z"]),
        ];
        for (input, want) in cases {
            for got in [
                all_at_once(input.as_bytes()),
                byte_by_byte(input.as_bytes()),
            ] {
                let got: Vec<&str> = got.iter().map(|e| e.data.as_str()).collect();
                assert_eq!(&got, want, "input {input:?}");
            }
        }
    }

    #[test]
    fn every_split_point_gives_the_same_events() {
        let input = "data: {\"choices\":[{\"delta\":{\"content\":\"h€llo\"}}]}\r\n\r\n: ka\n\
                     event: x\ndata: l1\ndata: l2\n\ndata: [DONE]\n\n"
            .as_bytes();
        let want = all_at_once(input);
        assert_eq!(want.len(), 3);
        assert_eq!(want[1].event.as_deref(), Some("x"));
        for cut in 0..input.len() {
            let mut p = SseParser::new();
            let mut got = p.feed(&input[..cut]);
            got.extend(p.feed(&input[cut..]));
            assert_eq!(got, want, "split at {cut}");
            assert!(!p.has_pending());
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic_and_splitting_never_changes_events() {
        // A small deterministic generator over an alphabet rich in SSE syntax.
        let alphabet: &[u8] = b"data: \r\n:event[DONE]{}\"x\xc3\xa9\xff";
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (seed >> 33) as usize
        };
        for _ in 0..300 {
            let len = next() % 120;
            let input: Vec<u8> = (0..len)
                .map(|_| alphabet[next() % alphabet.len()])
                .collect();
            let whole = all_at_once(&input);
            let cut = if input.is_empty() {
                0
            } else {
                next() % input.len()
            };
            let mut p = SseParser::new();
            let mut split = p.feed(&input[..cut]);
            split.extend(p.feed(&input[cut..]));
            assert_eq!(
                split,
                whole,
                "input {:?} cut at {cut}",
                String::from_utf8_lossy(&input)
            );
        }
    }

    #[test]
    fn pending_reports_a_cut_event() {
        let mut p = SseParser::new();
        assert!(p.feed(b"data: {\"partial\"").is_empty());
        assert!(p.has_pending());
        let mut p = SseParser::new();
        assert!(p.feed(b"data: x\n").is_empty());
        assert!(p.has_pending());
    }

    #[test]
    fn lines_and_events_over_the_limit_stop_the_parser() {
        // (input, limit, events before the overflow, overflowed)
        let cases: &[(&str, usize, &[&str], bool)] = &[
            // a line of exactly the limit is fine, one byte more is not
            ("data: 1234\n\n", 10, &["1234"], false),
            ("data: 12345\n\n", 10, &[], true),
            // an unterminated line overflows without waiting for its end
            ("data: ok\n\ndata: 12345", 10, &["ok"], true),
            // comments count too: the line is buffered before it is known to be one
            (": a long comment\ndata: x\n\n", 10, &[], true),
            // an event's data lines count together
            ("data: a\ndata: b\n\n", 14, &["a\nb"], false),
            ("data: a\ndata: b\ndata: c\n\n", 14, &[], true),
            // a blank line starts the count again
            (
                "data: a\n\ndata: b\n\ndata: c\n\n",
                7,
                &["a", "b", "c"],
                false,
            ),
            // terminators are not counted
            ("data: 1234\r\n\r\n", 10, &["1234"], false),
        ];
        for &(input, limit, want, overflowed) in cases {
            let whole = SseParser::with_max_event_bytes(limit).feed(input.as_bytes());
            let mut p = SseParser::with_max_event_bytes(limit);
            let split: Vec<SseEvent> = input
                .as_bytes()
                .iter()
                .flat_map(|b| p.feed(std::slice::from_ref(b)))
                .collect();
            for got in [&whole, &split] {
                let got: Vec<&str> = got.iter().map(|e| e.data.as_str()).collect();
                assert_eq!(&got, want, "input {input:?} limit {limit}");
            }
            assert_eq!(p.overflow(), overflowed.then_some(limit), "{input:?}");
            if overflowed {
                assert!(p.has_pending());
                assert!(p.feed(b"\n\ndata: more\n\n").is_empty(), "stays stopped");
            }
        }
    }

    #[test]
    fn an_endless_line_holds_at_most_the_limit() {
        let mut p = SseParser::with_max_event_bytes(1 << 16);
        let chunk = vec![b'a'; 4096];
        assert!(p.feed(b"data: ").is_empty());
        let mut fed = 0usize;
        while p.overflow().is_none() {
            assert!(p.feed(&chunk).is_empty());
            fed += chunk.len();
            assert!(p.line.capacity() <= 2 << 16, "{}", p.line.capacity());
            assert!(fed <= 1 << 17, "never stopped");
        }
        assert_eq!(p.line.capacity(), 0, "the buffer is freed");
        assert_eq!(SseParser::new().max_event_bytes, DEFAULT_MAX_EVENT_BYTES);
    }
}
