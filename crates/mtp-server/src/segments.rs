//! A streamed reply cut into its segments, in the order the provider sends them: reasoning,
//! text, and each tool call, each opened, added to and closed. The protocols whose streams are
//! made of such segments render these steps in their own events: Anthropic's content blocks
//! ([`crate::anthropic`]) and the Responses API's output items ([`crate::responses`]).
//!
//! A segment stays open while the provider adds to it; a piece of another kind closes it and
//! opens the next. A tool call opens with its first piece (the one with its name); a piece of
//! a call that is not the open one opens it again, as a segment of its own.

use mtp_contract::StreamEvent;

/// What a segment holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// The model's reasoning.
    Reasoning,
    /// The answer's text.
    Text,
    /// Tool call `index` of the reply (0, 1, ...).
    Call(usize),
}

/// One change to the reply's segments.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Step {
    /// Segment `index` (the reply's segments counted from 0) opens. A call's carries the
    /// runtime's id for it and its name, when its first piece had them.
    Open {
        index: usize,
        kind: Kind,
        id: Option<String>,
        name: Option<String>,
    },
    /// Text (reasoning, answer, or a call's argument JSON) added to the open segment.
    Add {
        index: usize,
        kind: Kind,
        text: String,
    },
    /// The segment is complete.
    Close { index: usize, kind: Kind },
}

/// The open segment, between provider events.
#[derive(Debug, Default)]
pub(crate) struct Segments {
    open: Option<(Kind, usize)>,
    next: usize,
}

impl Segments {
    /// The steps of one provider event: a `Delta`'s reasoning then its text, or a piece of a
    /// tool call. Other events (progress, the end) change no segment.
    pub(crate) fn on(&mut self, ev: StreamEvent) -> Vec<Step> {
        let mut out = Vec::new();
        match ev {
            StreamEvent::Delta {
                text, reasoning, ..
            } => {
                for (kind, text) in [(Kind::Reasoning, reasoning), (Kind::Text, text)] {
                    if !text.is_empty() {
                        let index = self.ensure(kind, None, None, &mut out);
                        out.push(Step::Add { index, kind, text });
                    }
                }
            }
            StreamEvent::ToolCall(d) => {
                let kind = Kind::Call(d.index);
                let open_call = matches!(self.open, Some((k, _)) if k == kind);
                let index = if d.name.is_some() || !open_call {
                    self.close_into(&mut out);
                    self.ensure(kind, d.id, d.name, &mut out)
                } else {
                    self.open.map(|(_, i)| i).unwrap_or_default()
                };
                if !d.arguments.is_empty() {
                    out.push(Step::Add {
                        index,
                        kind,
                        text: d.arguments,
                    });
                }
            }
            StreamEvent::PromptProgress(_) | StreamEvent::Done(_) => {}
        }
        out
    }

    /// Closes the open segment (the reply ended): its `Close`, if one was open.
    pub(crate) fn close(&mut self) -> Option<Step> {
        let (kind, index) = self.open.take()?;
        Some(Step::Close { index, kind })
    }

    fn close_into(&mut self, out: &mut Vec<Step>) {
        out.extend(self.close());
    }

    /// The index of the open segment of `kind`, opened (after closing another) when it is not
    /// open.
    fn ensure(
        &mut self,
        kind: Kind,
        id: Option<String>,
        name: Option<String>,
        out: &mut Vec<Step>,
    ) -> usize {
        if let Some((k, i)) = self.open {
            if k == kind {
                return i;
            }
        }
        self.close_into(out);
        let index = self.next;
        self.next += 1;
        self.open = Some((kind, index));
        out.push(Step::Open {
            index,
            kind,
            id,
            name,
        });
        index
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mtp_contract::ToolCallDelta;

    fn delta(reasoning: &str, text: &str) -> StreamEvent {
        StreamEvent::Delta {
            text: text.into(),
            token_ids: vec![],
            reasoning: reasoning.into(),
            logprobs: Vec::new(),
        }
    }

    fn call(index: usize, name: Option<&str>, arguments: &str) -> StreamEvent {
        StreamEvent::ToolCall(ToolCallDelta {
            index,
            id: name.map(|_| format!("call_{index}")),
            name: name.map(str::to_string),
            arguments: arguments.into(),
        })
    }

    #[test]
    fn reasoning_text_and_calls_open_and_close_in_turn() {
        let mut s = Segments::default();
        let mut steps = Vec::new();
        for ev in [
            delta("hm", ""),
            delta("m", "A"),
            delta("", "B"),
            call(0, Some("f"), "{\"a\""),
            call(0, None, ": 1}"),
            call(1, Some("g"), ""),
            call(1, None, "{}"),
        ] {
            steps.extend(s.on(ev));
        }
        steps.extend(s.close());
        assert_eq!(s.close(), None);
        let add = |index, kind, text: &str| Step::Add {
            index,
            kind,
            text: text.into(),
        };
        let open = |index, kind, name: Option<&str>| Step::Open {
            index,
            kind,
            id: name.map(|_| match kind {
                Kind::Call(i) => format!("call_{i}"),
                _ => unreachable!(),
            }),
            name: name.map(str::to_string),
        };
        assert_eq!(
            steps,
            [
                open(0, Kind::Reasoning, None),
                add(0, Kind::Reasoning, "hm"),
                add(0, Kind::Reasoning, "m"),
                Step::Close {
                    index: 0,
                    kind: Kind::Reasoning
                },
                open(1, Kind::Text, None),
                add(1, Kind::Text, "A"),
                add(1, Kind::Text, "B"),
                Step::Close {
                    index: 1,
                    kind: Kind::Text
                },
                open(2, Kind::Call(0), Some("f")),
                add(2, Kind::Call(0), "{\"a\""),
                add(2, Kind::Call(0), ": 1}"),
                Step::Close {
                    index: 2,
                    kind: Kind::Call(0)
                },
                open(3, Kind::Call(1), Some("g")),
                add(3, Kind::Call(1), "{}"),
                Step::Close {
                    index: 3,
                    kind: Kind::Call(1)
                },
            ]
        );
    }
}
