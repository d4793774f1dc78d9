//! Just enough of the Prometheus text exposition format to read speculative-decoding counters
//! from `/metrics` (llama-server with `--metrics`, vLLM).
//!
//! ```
//! use mtp_runtimes::prometheus::Metrics;
//! let m = Metrics::parse("# TYPE vllm:spec_decode_num_drafts counter\n\
//!     vllm:spec_decode_num_drafts_total{engine=\"0\",model_name=\"m\"} 12.0\n\
//!     vllm:spec_decode_num_accepted_tokens_per_pos_total{engine=\"0\",position=\"1\"} 3\n\
//!     vllm:spec_decode_num_accepted_tokens_per_pos_total{engine=\"0\",position=\"0\"} 9\n");
//! assert_eq!(m.counter("vllm:spec_decode_num_drafts"), Some(12.0));
//! assert_eq!(m.per_position("vllm:spec_decode_num_accepted_tokens_per_pos"), vec![9.0, 3.0]);
//! ```

use std::collections::BTreeMap;

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Metric name, e.g. `vllm:spec_decode_num_drafts_total`.
    pub name: String,
    /// Label pairs.
    pub labels: BTreeMap<String, String>,
    /// The value.
    pub value: f64,
}

/// A parsed `/metrics` page.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metrics {
    /// Every sample, in page order. Malformed lines are skipped.
    pub samples: Vec<Sample>,
}

impl Metrics {
    /// Parses a page; lines that do not parse are skipped (a scrape is best effort).
    pub fn parse(text: &str) -> Metrics {
        let samples = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .filter_map(parse_line)
            .collect();
        Metrics { samples }
    }

    /// Sum of a counter over all label sets. `name` may omit the `_total` suffix that client
    /// libraries append to counters; both spellings are looked up. `None` when absent.
    pub fn counter(&self, name: &str) -> Option<f64> {
        let total = format!("{name}_total");
        let mut found = false;
        let mut sum = 0.0;
        for s in &self.samples {
            if s.name == name || s.name == total {
                found = true;
                sum += s.value;
            }
        }
        found.then_some(sum)
    }

    /// A counter split by its `position` label (0-based), summed over other labels; missing
    /// positions below the largest one are 0. Empty when the counter is absent.
    pub fn per_position(&self, name: &str) -> Vec<f64> {
        let total = format!("{name}_total");
        let mut by_pos: BTreeMap<usize, f64> = BTreeMap::new();
        for s in &self.samples {
            if s.name != name && s.name != total {
                continue;
            }
            if let Some(p) = s
                .labels
                .get("position")
                .and_then(|p| p.parse::<usize>().ok())
            {
                *by_pos.entry(p).or_insert(0.0) += s.value;
            }
        }
        let n = by_pos.keys().next_back().map_or(0, |k| k + 1);
        (0..n)
            .map(|i| by_pos.get(&i).copied().unwrap_or(0.0))
            .collect()
    }

    /// True when any sample's name starts with `prefix`.
    pub fn has_prefix(&self, prefix: &str) -> bool {
        self.samples.iter().any(|s| s.name.starts_with(prefix))
    }
}

fn parse_line(line: &str) -> Option<Sample> {
    let (name, rest) = match line.find(['{', ' ', '\t']) {
        Some(i) => (&line[..i], &line[i..]),
        None => return None,
    };
    let mut labels = BTreeMap::new();
    let rest = if let Some(body) = rest.strip_prefix('{') {
        let end = find_label_end(body)?;
        parse_labels(&body[..end], &mut labels)?;
        &body[end + 1..]
    } else {
        rest
    };
    let value_text = rest.split_whitespace().next()?;
    let value = match value_text {
        "+Inf" | "Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse::<f64>().ok()?,
    };
    if name.is_empty() {
        return None;
    }
    Some(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// Index of the closing `}` of a label set, honouring quoted values with escapes.
fn find_label_end(body: &str) -> Option<usize> {
    let mut in_quotes = false;
    let mut escaped = false;
    for (i, c) in body.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if in_quotes => escaped = true,
            '"' => in_quotes = !in_quotes,
            '}' if !in_quotes => return Some(i),
            _ => {}
        }
    }
    None
}

fn parse_labels(body: &str, out: &mut BTreeMap<String, String>) -> Option<()> {
    let mut rest = body.trim();
    while !rest.is_empty() {
        let eq = rest.find('=')?;
        let key = rest[..eq].trim().to_string();
        let after = rest[eq + 1..].trim_start().strip_prefix('"')?;
        let mut value = String::new();
        let mut escaped = false;
        let mut end = None;
        for (i, c) in after.char_indices() {
            if escaped {
                value.push(match c {
                    'n' => '\n',
                    other => other,
                });
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                end = Some(i);
                break;
            } else {
                value.push(c);
            }
        }
        let end = end?;
        out.insert(key, value);
        rest = after[end + 1..].trim_start();
        rest = rest.strip_prefix(',').unwrap_or(rest).trim_start();
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_llama_server_and_vllm_shapes() {
        let text = "# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.\n\
            # TYPE llamacpp:prompt_tokens_total counter\n\
            llamacpp:prompt_tokens_total 6886\n\
            llamacpp:spec_decode_num_draft_tokens_total 79\n\
            vllm:spec_decode_num_draft_tokens_total{engine=\"0\",model_name=\"a,b}\\\"c\"} 30.0\n\
            vllm:spec_decode_num_draft_tokens_total{engine=\"1\",model_name=\"x\"} 12.0 1700000000\n\
            garbage line here\n\
            vllm:x{broken 1\n";
        let m = Metrics::parse(text);
        assert_eq!(m.counter("llamacpp:prompt_tokens"), Some(6886.0));
        assert_eq!(
            m.counter("llamacpp:spec_decode_num_draft_tokens_total"),
            Some(79.0)
        );
        assert_eq!(m.counter("vllm:spec_decode_num_draft_tokens"), Some(42.0));
        assert_eq!(m.counter("vllm:absent"), None);
        assert_eq!(m.samples[2].labels["model_name"], "a,b}\"c");
        assert!(m.has_prefix("vllm:spec_decode"));
        assert!(m
            .per_position("vllm:spec_decode_num_draft_tokens")
            .is_empty());
    }

    #[test]
    fn per_position_fills_gaps() {
        let m = Metrics::parse(
            "p_total{position=\"2\"} 1\np_total{position=\"0\"} 5\np_total{position=\"0\",engine=\"1\"} 2\n",
        );
        assert_eq!(m.per_position("p"), vec![7.0, 0.0, 1.0]);
    }
}
