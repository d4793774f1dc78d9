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
//! ```
//! use mtp_runtimes::sse::SseParser;
//! let mut p = SseParser::new();
//! let mut events = p.feed(b": keep-alive\ndata: {\"a\":\ndata: 1}\n\nda");
//! events.extend(p.feed(b"ta: [DONE]\r\n\r\n"));
//! assert_eq!(events.len(), 2);
//! assert_eq!(events[0].data, "{\"a\":\n1}");
//! assert!(events[1].is_done());
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

/// Incremental SSE parser; see the module documentation for the rules.
#[derive(Debug, Default)]
pub struct SseParser {
    /// Bytes of the current, unfinished line.
    line: Vec<u8>,
    /// The previous chunk ended with `\r`; a leading `\n` in the next chunk belongs to it.
    after_cr: bool,
    /// `data` lines of the event being assembled.
    data: Vec<String>,
    /// `event` field of the event being assembled.
    event: Option<String>,
    /// Any field was seen since the last dispatch.
    pending: bool,
}

impl SseParser {
    /// A parser at the start of a stream.
    pub fn new() -> Self {
        SseParser::default()
    }

    /// Feeds bytes and returns the events they completed, in order.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        let mut out = Vec::new();
        for &b in bytes {
            if self.after_cr {
                self.after_cr = false;
                if b == b'\n' {
                    continue;
                }
            }
            match b {
                b'\n' => self.end_line(&mut out),
                b'\r' => {
                    self.end_line(&mut out);
                    self.after_cr = true;
                }
                _ => self.line.push(b),
            }
        }
        out
    }

    /// True when bytes or fields were received that no blank line has dispatched yet: the
    /// stream ended in the middle of an event.
    pub fn has_pending(&self) -> bool {
        self.pending || !self.line.is_empty()
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
}
