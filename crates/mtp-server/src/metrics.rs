//! `GET /metrics`: Prometheus text exposition (format 0.0.4), written by hand because it is a
//! dozen lines of a stable text format and every figure here is a plain atomic counter.
//!
//! Speculative counters are named as vLLM names them (`vllm:spec_decode_num_drafts_total`, ...)
//! with the `mtp:` prefix, so dashboards built for vLLM read them by changing the prefix.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use mtp_contract::GenerateResponse;

/// Upper bounds (seconds) of the latency histograms' buckets (vLLM's for TTFT and e2e latency,
/// trimmed).
const LATENCY_BUCKETS: [f64; 14] = [
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0,
];

#[derive(Default)]
struct Histogram {
    buckets: [u64; LATENCY_BUCKETS.len()],
    count: u64,
    sum: f64,
}

impl Histogram {
    fn observe(&mut self, x: f64) {
        for (b, le) in self.buckets.iter_mut().zip(LATENCY_BUCKETS) {
            if x <= le {
                *b += 1;
            }
        }
        self.count += 1;
        self.sum += x;
    }

    fn write(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (b, le) in self.buckets.iter().zip(LATENCY_BUCKETS) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {b}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum {}", self.sum);
        let _ = writeln!(out, "{name}_count {}", self.count);
    }
}

/// The server's counters.
#[derive(Default)]
pub struct Metrics {
    ok: AtomicU64,
    failed: AtomicU64,
    rejected: AtomicU64,
    cancelled: AtomicU64,
    prompt_tokens: AtomicU64,
    generation_tokens: AtomicU64,
    cached_tokens: AtomicU64,
    running: AtomicU64,
    waiting: AtomicU64,
    cancelling: AtomicU64,
    connections: AtomicU64,
    connections_refused: AtomicU64,
    connections_evicted: AtomicU64,
    drafts: AtomicU64,
    draft_tokens: AtomicU64,
    accepted_tokens: AtomicU64,
    speculated_requests: AtomicU64,
    per_pos: Mutex<Vec<u64>>,
    ttft: Mutex<Histogram>,
    e2e: Mutex<Histogram>,
}

/// Ends an open connection's count when dropped.
pub struct OwnedGauge(std::sync::Arc<Metrics>);

impl Drop for OwnedGauge {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Ends a waiting request's count when dropped.
pub struct Gauge<'a>(&'a AtomicU64);

impl Drop for Gauge<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Metrics {
    /// A request starts generating (paired with [`Metrics::stop_running`]).
    pub fn start_running(&self) {
        self.running.fetch_add(1, Ordering::Relaxed);
    }

    /// A request stops generating.
    pub fn stop_running(&self) {
        self.running.fetch_sub(1, Ordering::Relaxed);
    }

    /// Counts a request as waiting until the guard drops.
    pub fn waiting(&self) -> Gauge<'_> {
        self.waiting.fetch_add(1, Ordering::Relaxed);
        Gauge(&self.waiting)
    }

    /// Requests generating or waiting for a slot (a draining server waits for none).
    pub fn in_flight(&self) -> u64 {
        self.running.load(Ordering::Relaxed) + self.waiting.load(Ordering::Relaxed)
    }

    /// Counts an open connection until the guard drops.
    pub fn connection_opened(self: &std::sync::Arc<Self>) -> OwnedGauge {
        self.connections.fetch_add(1, Ordering::Relaxed);
        OwnedGauge(std::sync::Arc::clone(self))
    }

    /// A connection refused over `--max-connections`.
    pub fn connection_refused(&self) {
        self.connections_refused.fetch_add(1, Ordering::Relaxed);
    }

    /// An idle connection closed to make room for a new one at `--max-connections`.
    pub fn connection_evicted(&self) {
        self.connections_evicted.fetch_add(1, Ordering::Relaxed);
    }

    /// A request that ended on an error: refused when the request was at fault, else failed.
    pub fn errored(&self, e: &mtp_contract::ProviderError) {
        if e.is_client_error() {
            self.rejected();
        } else {
            self.failed();
        }
    }

    /// A request refused before it ran (queue full, bad request, no key).
    pub fn rejected(&self) {
        self.rejected.fetch_add(1, Ordering::Relaxed);
    }

    /// A request that failed while running.
    pub fn failed(&self) {
        self.failed.fetch_add(1, Ordering::Relaxed);
    }

    /// A request whose client went away.
    pub fn cancelled(&self) {
        self.cancelled.fetch_add(1, Ordering::Relaxed);
    }

    /// A cancelled request whose work has not stopped yet (paired with
    /// [`Metrics::stopped_cancelling`]).
    pub fn start_cancelling(&self) {
        self.cancelling.fetch_add(1, Ordering::Relaxed);
    }

    /// A cancelled request's work has stopped.
    pub fn stopped_cancelling(&self) {
        self.cancelling.fetch_sub(1, Ordering::Relaxed);
    }

    /// A finished request: its tokens, its speculation figures and its latencies.
    pub fn finished(&self, r: &GenerateResponse, e2e_s: f64) {
        self.ok.fetch_add(1, Ordering::Relaxed);
        self.prompt_tokens
            .fetch_add(r.usage.input_tokens, Ordering::Relaxed);
        self.generation_tokens
            .fetch_add(r.usage.output_tokens, Ordering::Relaxed);
        self.cached_tokens
            .fetch_add(r.usage.cached_input_tokens, Ordering::Relaxed);
        let s = &r.metadata.speculation;
        if s.used {
            self.speculated_requests.fetch_add(1, Ordering::Relaxed);
        }
        // rounds that drafted (an `auto` depth's plain target steps draft nothing)
        let plain = s
            .rounds_per_depth
            .as_ref()
            .and_then(|p| p.first().copied())
            .unwrap_or(0);
        self.drafts.fetch_add(
            s.rounds.unwrap_or(0).saturating_sub(plain),
            Ordering::Relaxed,
        );
        self.draft_tokens
            .fetch_add(s.drafted.unwrap_or(0), Ordering::Relaxed);
        self.accepted_tokens
            .fetch_add(s.accepted.unwrap_or(0), Ordering::Relaxed);
        if let (Some(per), Ok(mut all)) = (&s.accepted_per_position, self.per_pos.lock()) {
            if all.len() < per.len() {
                all.resize(per.len(), 0);
            }
            for (a, p) in all.iter_mut().zip(per) {
                *a += p;
            }
        }
        if let (Some(ms), Ok(mut h)) = (r.metadata.timings.time_to_first_token_ms, self.ttft.lock())
        {
            h.observe(ms / 1000.0);
        }
        if let Ok(mut h) = self.e2e.lock() {
            h.observe(e2e_s);
        }
    }

    /// The mean end-to-end latency so far (seconds), for `Retry-After`.
    pub fn mean_latency_s(&self) -> Option<f64> {
        let h = self.e2e.lock().ok()?;
        (h.count > 0).then(|| h.sum / h.count as f64)
    }

    /// The exposition text.
    pub fn render(&self, model: &str) -> String {
        let mut out = String::new();
        let model = escape_label(model);
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut counter = |name: &str, help: &str, labels: &str, v: u64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name}{{model_name=\"{model}\"{labels}}} {v}"
            );
        };
        counter(
            "mtp:request_success_total",
            "Requests that finished.",
            "",
            get(&self.ok),
        );
        counter(
            "mtp:request_failure_total",
            "Requests that failed while running.",
            "",
            get(&self.failed),
        );
        counter(
            "mtp:request_rejected_total",
            "Requests refused before running (bad request, no key, queue full).",
            "",
            get(&self.rejected),
        );
        counter(
            "mtp:connections_refused_total",
            "Connections answered 503 and closed over --max-connections (every open one busy).",
            "",
            get(&self.connections_refused),
        );
        counter(
            "mtp:connections_evicted_total",
            "Idle connections closed to admit a new one at --max-connections.",
            "",
            get(&self.connections_evicted),
        );
        counter(
            "mtp:request_cancelled_total",
            "Requests whose client went away before the end.",
            "",
            get(&self.cancelled),
        );
        counter(
            "mtp:prompt_tokens_total",
            "Prompt tokens processed (cached ones included).",
            "",
            get(&self.prompt_tokens),
        );
        counter(
            "mtp:prompt_tokens_cached_total",
            "Prompt tokens served from the prefix cache.",
            "",
            get(&self.cached_tokens),
        );
        counter(
            "mtp:generation_tokens_total",
            "Generated tokens.",
            "",
            get(&self.generation_tokens),
        );
        counter(
            "mtp:spec_decode_requests_total",
            "Requests where drafting really happened.",
            "",
            get(&self.speculated_requests),
        );
        counter(
            "mtp:spec_decode_num_drafts_total",
            "Draft/verify rounds (rounds that drafted nothing are not counted).",
            "",
            get(&self.drafts),
        );
        counter(
            "mtp:spec_decode_num_draft_tokens_total",
            "Draft tokens proposed.",
            "",
            get(&self.draft_tokens),
        );
        counter(
            "mtp:spec_decode_num_accepted_tokens_total",
            "Draft tokens accepted.",
            "",
            get(&self.accepted_tokens),
        );
        let per = self.per_pos.lock().map(|p| p.clone()).unwrap_or_default();
        let name = "mtp:spec_decode_num_accepted_tokens_per_pos_total";
        let _ = writeln!(
            out,
            "# HELP {name} Draft tokens accepted at each draft position (0-based).\n# TYPE {name} counter"
        );
        for (i, v) in per.iter().enumerate() {
            let _ = writeln!(out, "{name}{{model_name=\"{model}\",position=\"{i}\"}} {v}");
        }
        for (name, help, v) in [
            (
                "mtp:num_requests_running",
                "Requests holding a slot now: preparing their prompt, computing it or \
                 generating (a cancelled one until its work has stopped).",
                get(&self.running),
            ),
            (
                "mtp:num_requests_cancelling",
                "Cancelled requests whose work has not stopped yet.",
                get(&self.cancelling),
            ),
            (
                "mtp:num_requests_waiting",
                "Requests waiting in the queue.",
                get(&self.waiting),
            ),
            (
                "mtp:num_connections_open",
                "HTTP connections open.",
                get(&self.connections),
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{{model_name=\"{model}\"}} {v}"
            );
        }
        if let Ok(h) = self.ttft.lock() {
            h.write(
                &mut out,
                "mtp:time_to_first_token_seconds",
                "Time to first token.",
            );
        }
        if let Ok(h) = self.e2e.lock() {
            h.write(
                &mut out,
                "mtp:e2e_request_latency_seconds",
                "End-to-end request latency.",
            );
        }
        out
    }
}

/// A label value as the exposition format writes it: backslash, double quote and line feed
/// escaped.
fn escape_label(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape_label("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
        let text = Metrics::default().render("evil\"} 1\nmtp:fake 2");
        assert!(!text.contains("mtp:fake 2\n"), "{text}");
        assert!(text
            .lines()
            .all(|l| l.starts_with('#') || l.starts_with("mtp:")));
    }
}
