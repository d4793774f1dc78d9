//! The command's only printing module: where text, notes, errors and live displays go, and
//! how reports are worded.

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use mtp_detect::hub::{DownloadProgress, HubError};
use mtp_detect::RepoId;

use crate::cli::error::CliError;
use crate::{DraftDepth, GenerateResponse, SpeculationReport, SpeculationStatus};

/// Where the command writes, and where the chat reads its lines from.
///
/// [`Io::terminal`] is the real process; [`Io::captured`] collects everything in memory (for
/// tests and embedding) and can be given scripted chat input.
pub struct Io {
    pub(crate) stdout: Box<dyn Write + Send>,
    pub(crate) stderr: Box<dyn Write + Send>,
    pub(crate) input: Option<Vec<String>>,
    pub(crate) live: bool,
}

impl Io {
    /// The process's stdout and stderr; live displays when both are terminals.
    pub fn terminal() -> Self {
        Io {
            live: std::io::stdout().is_terminal() && std::io::stderr().is_terminal(),
            stdout: Box::new(std::io::stdout()),
            stderr: Box::new(std::io::stderr()),
            input: None,
        }
    }

    /// In-memory stdout and stderr, read back through the returned [`Captured`].
    ///
    /// ```
    /// let (io, captured) = mtp::cli::Io::captured();
    /// let code = mtp::cli::run_with(["mtp", "--version"], io);
    /// assert_eq!(code, std::process::ExitCode::SUCCESS);
    /// assert!(captured.stdout().starts_with("mtp "));
    /// ```
    pub fn captured() -> (Self, Captured) {
        let c = Captured::default();
        let io = Io {
            stdout: Box::new(SharedBuf(c.out.clone())),
            stderr: Box::new(SharedBuf(c.err.clone())),
            input: None,
            live: false,
        };
        (io, c)
    }

    /// Gives the chat these lines instead of a line editor (end of input quits).
    pub fn with_input<I: IntoIterator<Item = S>, S: Into<String>>(mut self, lines: I) -> Self {
        self.input = Some(lines.into_iter().map(Into::into).collect());
        self
    }
}

/// What an [`Io::captured`] run wrote.
#[derive(Clone, Default)]
pub struct Captured {
    out: Arc<Mutex<Vec<u8>>>,
    err: Arc<Mutex<Vec<u8>>>,
}

impl Captured {
    /// Everything written to stdout so far.
    pub fn stdout(&self) -> String {
        let b = self.out.lock().unwrap_or_else(|p| p.into_inner());
        String::from_utf8_lossy(&b).into_owned()
    }
    /// Everything written to stderr so far.
    pub fn stderr(&self) -> String {
        let b = self.err.lock().unwrap_or_else(|p| p.into_inner());
        String::from_utf8_lossy(&b).into_owned()
    }
}

struct SharedBuf(Arc<Mutex<Vec<u8>>>);

impl Write for SharedBuf {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut b = self.0.lock().unwrap_or_else(|p| p.into_inner());
        b.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The output handle every command writes through.
pub struct Out {
    stdout: Box<dyn Write + Send>,
    stderr: Box<dyn Write + Send>,
    live: bool,
}

impl Out {
    pub(crate) fn new(
        stdout: Box<dyn Write + Send>,
        stderr: Box<dyn Write + Send>,
        live: bool,
    ) -> Self {
        Out {
            stdout,
            stderr,
            live,
        }
    }

    /// Writes text to stdout as is, and flushes (streamed answers).
    pub fn text(&mut self, s: &str) -> std::io::Result<()> {
        self.stdout.write_all(s.as_bytes())?;
        self.stdout.flush()
    }

    /// Writes a line to stdout.
    pub fn line(&mut self, s: &str) -> std::io::Result<()> {
        writeln!(self.stdout, "{s}")?;
        self.stdout.flush()
    }

    /// Writes raw text to stderr and flushes (the live status line).
    pub fn status(&mut self, s: &str) -> std::io::Result<()> {
        self.stderr.write_all(s.as_bytes())?;
        self.stderr.flush()
    }

    /// Writes a line to stderr (summaries, notes, warnings).
    pub fn note(&mut self, s: &str) -> std::io::Result<()> {
        writeln!(self.stderr, "{s}")?;
        self.stderr.flush()
    }

    /// The prompt's progress as a status line on stderr (`prompt 12288/32000 tokens (38%)
    /// 24.1 s`), redrawn in place and cleared once the prompt is in; nothing unless live.
    pub fn prompt_progress(&mut self, p: &crate::PromptProgress) -> std::io::Result<()> {
        if !self.live {
            return Ok(());
        }
        if p.processed >= p.total {
            return self.status(CLEAR_LINE);
        }
        let cached = if p.cache > 0 {
            format!(", {} from cache", p.cache)
        } else {
            String::new()
        };
        self.status(&format!(
            "{CLEAR_LINE}\x1b[2mprompt {}/{} tokens ({:.0}%{cached}) {:.1} s\x1b[0m",
            p.processed,
            p.total,
            p.fraction() * 100.0,
            p.time_ms as f64 / 1e3
        ))
    }

    /// Prints an error as one line (what, why), plus the hint (what to do) on the same line.
    pub fn error(&mut self, e: &CliError) {
        let line = match e.hint() {
            Some(h) => format!("mtp: error: {e} — {h}"),
            None => format!("mtp: error: {e}"),
        };
        let _ = writeln!(self.stderr, "{line}");
        let _ = self.stderr.flush();
    }

    /// A spinner saying `what` on stderr while something without a known length runs (a model
    /// loading), ticking on its own thread; hidden unless live. Clear it with
    /// `finish_and_clear`.
    pub fn spinner(&self, what: &str) -> ProgressBar {
        if !self.live {
            return ProgressBar::hidden();
        }
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        let style = ProgressStyle::with_template("{spinner} {msg} {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner());
        bar.set_style(style);
        bar.set_message(what.to_string());
        bar.enable_steady_tick(std::time::Duration::from_millis(100));
        bar
    }

    /// Download progress: a bar per file and one in total on a terminal, hidden otherwise.
    pub fn download_bars(&self) -> DownloadBars {
        DownloadBars::new(self.live)
    }
}

/// Progress bars for a download: one per file while it runs, and one for the whole job.
pub struct DownloadBars {
    multi: MultiProgress,
    total: ProgressBar,
    files: Mutex<HashMap<String, ProgressBar>>,
    live: bool,
    /// Notes kept for [`Out::note`] when no bars are drawn.
    notes: Mutex<Vec<String>>,
}

impl DownloadBars {
    /// Bars on stderr when `live` (a terminal), else hidden.
    fn new(live: bool) -> Self {
        let multi = MultiProgress::with_draw_target(if live {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        });
        let total = multi.add(ProgressBar::new(0));
        total.set_style(style(
            "{prefix:30!} {bar:30} {bytes:>10}/{total_bytes:10} {bytes_per_sec:>12} {eta}",
        ));
        total.set_prefix("total");
        DownloadBars {
            multi,
            total,
            files: Mutex::new(HashMap::new()),
            live,
            notes: Mutex::new(Vec::new()),
        }
    }

    /// Clears the bars; returns the notes not yet shown.
    pub fn finish(&self) -> Vec<String> {
        self.total.finish_and_clear();
        self.notes
            .lock()
            .map(|mut n| std::mem::take(&mut *n))
            .unwrap_or_default()
    }

    fn bar(&self, file: &str) -> Option<ProgressBar> {
        self.files.lock().ok()?.get(file).cloned()
    }
}

fn style(t: &str) -> ProgressStyle {
    ProgressStyle::with_template(t).unwrap_or_else(|_| ProgressStyle::default_bar())
}

impl DownloadProgress for DownloadBars {
    fn plan(&self, _repo: &RepoId, files: &[(String, u64)]) {
        self.total.inc_length(files.iter().map(|(_, s)| s).sum());
    }

    fn start(&self, file: &str, size: Option<u64>, done: u64) {
        if !self.live {
            self.total.inc(done);
            return;
        }
        let bar = self
            .multi
            .insert_before(&self.total, ProgressBar::new(size.unwrap_or(0)));
        bar.set_style(style(
            "{prefix:30!} {bar:30} {bytes:>10}/{total_bytes:10} {bytes_per_sec:>12} {eta}",
        ));
        bar.set_prefix(file.to_string());
        bar.set_position(done);
        self.total.inc(done);
        if let Ok(mut m) = self.files.lock() {
            if let Some(old) = m.insert(file.to_string(), bar) {
                // A restart from byte 0 (the server ignored the resume range).
                self.total
                    .set_position(self.total.position().saturating_sub(old.position()));
                old.finish_and_clear();
            }
        }
    }

    fn advance(&self, file: &str, bytes: u64) {
        self.total.inc(bytes);
        if let Some(b) = self.bar(file) {
            b.inc(bytes);
        }
    }

    fn retry(&self, file: &str, attempt: u32, error: &HubError, wait: Duration) {
        let line = format!(
            "note: {file}: try {attempt} failed ({error}); resuming in {:.1} s",
            wait.as_secs_f64()
        );
        if self.live {
            let _ = self.multi.println(line);
        } else if let Ok(mut n) = self.notes.lock() {
            n.push(line);
        }
    }

    fn finish(&self, file: &str) {
        if let Ok(mut m) = self.files.lock() {
            if let Some(b) = m.remove(file) {
                b.finish_and_clear();
            }
        }
    }
}

/// Dim text on a terminal (ANSI faint), as is elsewhere.
fn dim(live: bool, s: &str) -> String {
    if live && !s.is_empty() {
        format!("\x1b[2m{s}\x1b[0m")
    } else {
        s.to_string()
    }
}

/// A thinking model's streamed reasoning on stderr (dimmed on a terminal), ended by a newline
/// before the answer starts; or nothing, when hidden.
pub struct Reasoning {
    show: bool,
    live: bool,
    wrote: bool,
    ended_newline: bool,
}

impl Reasoning {
    /// Starts; `show` false drops every piece.
    pub fn new(out: &Out, show: bool) -> Self {
        Reasoning {
            show,
            live: out.live,
            wrote: false,
            ended_newline: true,
        }
    }

    /// Prints a piece of reasoning.
    pub fn push(&mut self, out: &mut Out, text: &str) -> std::io::Result<()> {
        if !self.show || text.is_empty() {
            return Ok(());
        }
        self.wrote = true;
        self.ended_newline = text.ends_with('\n');
        out.status(&dim(self.live, text))
    }

    /// Ends the reasoning (once): a newline and a blank line on stderr, if any was printed.
    pub fn end(&mut self, out: &mut Out) -> std::io::Result<()> {
        if std::mem::take(&mut self.wrote) {
            out.status(if self.ended_newline { "\n" } else { "\n\n" })?;
        }
        Ok(())
    }
}

/// A streamed answer with a live tok/s. When the output is live, complete lines are printed as
/// they arrive and a status line below them shows the tok/s and the line in progress; otherwise
/// text goes straight to stdout as it arrives.
///
/// The status line is drawn by hand, always shorter than the terminal, so that the `^C` a
/// terminal echoes on Ctrl-C stays on that line and is cleared with it (a full-width bar
/// would wrap and leave a stale copy behind).
pub struct LiveAnswer {
    live: bool,
    width: usize,
    partial: String,
    /// Reasoning shown (dimmed) before the answer, or not at all.
    show_reasoning: bool,
    reasoning_partial: String,
    reasoning_open: bool,
    /// The whole reasoning received.
    pub reasoning: String,
    first: Option<Instant>,
    drawn: Option<Instant>,
    first_tokens: u64,
    tokens: u64,
    /// The whole text received.
    pub text: String,
}

/// Clears the current terminal line.
const CLEAR_LINE: &str = "\r\x1b[2K";

impl LiveAnswer {
    /// Starts a live answer on `out`; `show_reasoning` prints a thinking model's reasoning
    /// (dimmed, on stderr) before the answer.
    pub fn start(out: &Out, show_reasoning: bool) -> Self {
        let width = if out.live {
            console::Term::stderr().size().1 as usize
        } else {
            0
        };
        LiveAnswer {
            live: out.live && width >= 20,
            width,
            partial: String::new(),
            show_reasoning,
            reasoning_partial: String::new(),
            reasoning_open: false,
            reasoning: String::new(),
            first: None,
            drawn: None,
            first_tokens: 0,
            tokens: 0,
            text: String::new(),
        }
    }

    /// Tokens received so far.
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    /// The live decode rate: tokens after the first delta, over the time since it arrived.
    pub fn tokens_per_s(&self) -> Option<f64> {
        let first = self.first?;
        let dt = first.elapsed().as_secs_f64();
        let after = self.tokens.saturating_sub(self.first_tokens);
        (after > 0 && dt > 0.0).then(|| after as f64 / dt)
    }

    fn status(&self) -> String {
        let rate = self
            .tokens_per_s()
            .map(|r| format!("[{r:6.1} tok/s]"))
            .unwrap_or_else(|| "[   …   tok/s]".into());
        // Keep the line strictly narrower than the terminal.
        let room = self.width.saturating_sub(rate.chars().count() + 2);
        let line = if self.reasoning_open {
            &self.reasoning_partial
        } else {
            &self.partial
        };
        let chars: Vec<char> = line.chars().filter(|c| !c.is_control()).collect();
        let tail: String = chars[chars.len().saturating_sub(room)..].iter().collect();
        if self.reasoning_open {
            format!("\x1b[2m{rate} {tail}\x1b[0m")
        } else {
            format!("\x1b[2m{rate}\x1b[0m {tail}")
        }
    }

    /// Adds a piece of reasoning (shown dimmed on stderr, line by line, unless hidden).
    pub fn push_reasoning(&mut self, out: &mut Out, delta: &str) -> std::io::Result<()> {
        if delta.is_empty() {
            return Ok(());
        }
        self.reasoning.push_str(delta);
        if !self.show_reasoning {
            return Ok(());
        }
        self.reasoning_open = true;
        if !self.live {
            return out.status(delta);
        }
        self.reasoning_partial.push_str(delta);
        let mut lines = String::new();
        while let Some(i) = self.reasoning_partial.find('\n') {
            lines.extend(self.reasoning_partial.drain(..=i));
        }
        out.status(CLEAR_LINE)?;
        out.status(&dim(true, &lines))?;
        self.drawn = Some(Instant::now());
        out.status(&self.status())
    }

    /// Closes the reasoning before the answer: its last line and a blank line.
    fn close_reasoning(&mut self, out: &mut Out) -> std::io::Result<()> {
        if !std::mem::take(&mut self.reasoning_open) {
            return Ok(());
        }
        if self.live {
            out.status(CLEAR_LINE)?;
            let rest = std::mem::take(&mut self.reasoning_partial);
            out.status(&dim(true, &rest))?;
            out.status(if rest.is_empty() { "\n" } else { "\n\n" })
        } else {
            out.status(if self.reasoning.ends_with('\n') {
                "\n"
            } else {
                "\n\n"
            })
        }
    }

    /// Adds a delta of `tokens` tokens (answer text; its reasoning went to
    /// [`LiveAnswer::push_reasoning`]).
    pub fn push(&mut self, out: &mut Out, delta: &str, tokens: u64) -> std::io::Result<()> {
        if self.first.is_none() {
            self.first = Some(Instant::now());
            self.first_tokens = tokens;
        }
        self.tokens += tokens;
        if delta.is_empty() {
            if self.live && self.reasoning_open {
                out.status(CLEAR_LINE)?;
                out.status(&self.status())?;
            }
            return Ok(());
        }
        self.close_reasoning(out)?;
        self.text.push_str(delta);
        if !self.live {
            return out.text(delta);
        }
        self.partial.push_str(delta);
        let mut lines = String::new();
        while let Some(i) = self.partial.find('\n') {
            lines.extend(self.partial.drain(..=i));
        }
        let due = self
            .drawn
            .is_none_or(|t| t.elapsed() >= Duration::from_millis(50));
        if lines.is_empty() && !due {
            return Ok(());
        }
        out.status(CLEAR_LINE)?;
        out.text(&lines)?;
        self.drawn = Some(Instant::now());
        out.status(&self.status())
    }

    /// Ends the live display and prints what is left of the last line, and a newline.
    pub fn finish(mut self, out: &mut Out) -> std::io::Result<String> {
        self.close_reasoning(out)?;
        if self.live {
            out.status(CLEAR_LINE)?;
            out.text(&self.partial)?;
        }
        if !self.text.is_empty() && !self.text.ends_with('\n') {
            out.text("\n")?;
        }
        Ok(self.text)
    }
}

/// The one-line summary after an answer: tokens, tok/s, the tool calls it made (if any), and
/// what happened about speculation.
pub fn summary_line(r: &GenerateResponse, wall: Duration) -> String {
    let tokens = r.usage.output_tokens;
    let rate = r.metadata.timings.decode_tokens_per_s.or_else(|| {
        let s = wall.as_secs_f64();
        (s > 0.0 && tokens > 0).then(|| tokens as f64 / s)
    });
    let rate = rate
        .map(|v| format!("{v:.1} tok/s"))
        .unwrap_or_else(|| "tok/s unknown".into());
    let calls = match r.tool_calls.len() {
        0 => String::new(),
        1 => " · 1 tool call".into(),
        n => format!(" · {n} tool calls"),
    };
    let mut s = format!(
        "[{tokens} token{} in {:.2} s · {rate}{calls} · {}",
        if tokens == 1 { "" } else { "s" },
        wall.as_secs_f64(),
        speculation_phrase(&r.metadata.speculation)
    );
    if r.usage.cached_input_tokens > 0 {
        s.push_str(&format!(
            " · {} prompt tokens from cache",
            r.usage.cached_input_tokens
        ));
    }
    s.push(']');
    s
}

/// The line `--compare` prints: the same request with speculation off on the same loaded
/// model, its decode rate, and what MTP bought on this call.
pub fn compare_line(on: &GenerateResponse, off: &GenerateResponse) -> String {
    let rate = |r: &GenerateResponse| r.metadata.timings.decode_tokens_per_s;
    let mut s = format!(
        "[speculation off: {} token{}",
        off.usage.output_tokens,
        if off.usage.output_tokens == 1 {
            ""
        } else {
            "s"
        }
    );
    match (rate(on), rate(off)) {
        (Some(a), Some(b)) if b > 0.0 && on.metadata.speculation.used => s.push_str(&format!(
            " · {b:.1} tok/s · MTP decoded {:.2}x as fast ({a:.1} against {b:.1} tok/s)",
            a / b
        )),
        (_, Some(b)) => s.push_str(&format!(" · {b:.1} tok/s")),
        _ => s.push_str(" · decode rate not reported"),
    }
    if !on.metadata.speculation.used {
        s.push_str(" · the first answer did not speculate either, so there is no speed-up to show");
    }
    let same = on.content == off.content && on.token_ids == off.token_ids;
    s.push_str(if same {
        " · same text]"
    } else if on.content == off.content {
        " · same text, other token ids]"
    } else {
        " · the text differs (sampling, or a runtime that is not exact)]"
    });
    s
}

/// The depths an `auto` call used: `auto depth 0-5, mean 2.4` (from rounds per depth).
fn auto_depth_phrase(per_depth: &[u64]) -> String {
    let used: Vec<usize> = (0..per_depth.len()).filter(|&d| per_depth[d] > 0).collect();
    let rounds: u64 = per_depth.iter().sum();
    match (used.first(), used.last()) {
        (Some(lo), Some(hi)) if rounds > 0 => {
            let drafted: u64 = per_depth
                .iter()
                .enumerate()
                .map(|(d, n)| d as u64 * n)
                .sum();
            let mean = drafted as f64 / rounds as f64;
            if lo == hi {
                format!("auto depth {lo}")
            } else {
                format!("auto depth {lo}-{hi}, mean {mean:.1}")
            }
        }
        _ => "auto depth".into(),
    }
}

/// How one call's speculation report reads in a sentence.
pub fn speculation_phrase(rep: &SpeculationReport) -> String {
    if rep.used {
        let depth = match (rep.auto_depth, &rep.rounds_per_depth) {
            (true, Some(per)) => auto_depth_phrase(per),
            _ => rep
                .num_draft_tokens
                .map(|d| format!("depth {d}"))
                .unwrap_or_else(|| "depth unknown".into()),
        };
        match (rep.acceptance_rate, rep.accepted, rep.drafted) {
            (Some(rate), Some(a), Some(d)) => {
                // Servers report drafted/accepted but not always rounds.
                let per_round = match rep.rounds {
                    Some(rounds) if rounds > 0 => {
                        format!(
                            ", {:.2} tokens per round",
                            (a + rounds) as f64 / rounds as f64
                        )
                    }
                    _ => String::new(),
                };
                format!(
                    "MTP on ({depth}): acceptance {:.0}% ({a}/{d}){per_round}",
                    rate * 100.0
                )
            }
            // the runtime counted, and the answer ended before a round drafted anything
            (_, _, Some(0)) => {
                format!("MTP on ({depth}): nothing drafted (the answer ended first)")
            }
            _ => format!(
                "MTP on ({depth}): acceptance not reported by {}",
                rep.runtime
            ),
        }
    } else {
        let reason = rep
            .reason
            .map(|r| r.to_string())
            .unwrap_or_else(|| "unknown".into());
        match &rep.message {
            Some(m) => format!("MTP not used ({reason}): {m}"),
            None => format!("MTP not used ({reason})"),
        }
    }
}

/// The per-call state the chat is in, as `/speculation` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PerCall {
    /// `/speculation off`: the drafter is skipped for each call.
    pub off: bool,
    /// `/depth N` or `/depth auto`: the per-call depth override.
    pub depth: Option<DraftDepth>,
}

/// The `/speculation` report, in the reference's layout.
pub fn status_report(st: &SpeculationStatus, per_call: PerCall) -> String {
    let mut s = String::new();
    if st.lane_loaded {
        s.push_str("⚡ speculation: native MTP lane LOADED\n");
        s.push_str(&format!(
            "   drafter        : {}\n",
            st.drafter.as_deref().unwrap_or("(not reported)")
        ));
        let depth = match (per_call.depth, st.depth_phrase()) {
            (Some(d), Some(def)) => format!("{d} (this session; provider default {def})"),
            (Some(d), None) => format!("{d} (this session)"),
            (None, Some(def)) => def,
            (None, None) => "(not reported)".into(),
        };
        s.push_str(&format!("   draft tokens   : {depth}\n"));
        let state = if per_call.off {
            "off (lane stays loaded; the drafter is skipped)"
        } else if per_call.depth.is_some() {
            "on (depth overridden per call)"
        } else {
            "auto (on)"
        };
        s.push_str(&format!("   per-call state : {state}"));
    } else {
        let reason = st.reason.map(|r| format!(" ({r})")).unwrap_or_default();
        s.push_str(&format!("⚡ speculation: no MTP lane loaded{reason}\n"));
        if let Some(m) = &st.message {
            s.push_str(&format!("   why            : {m}\n"));
        }
        s.push_str(&format!("   startup mode   : {}\n", st.default_mode));
        s.push_str("   per-call state : off (nothing to draft with)");
    }
    s
}
