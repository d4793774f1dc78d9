//! Fuzzing of every parser in the workspace that reads input from outside: GGUF prefixes,
//! safetensors headers and indexes, the `speculation` block, chat templates and the messages
//! rendered through them, the reasoning and stop-string stream scanners, and the SSE and
//! Prometheus text a server sends.
//!
//! Stable Rust, no libFuzzer: each target has seeds (valid inputs built here or read from the
//! repository's fixtures) and a mutator (`mutate`) that stacks the edits coverage fuzzers apply.
//! Every input runs under `catch_unwind`; a finding is
//! - a panic (the parsers must answer bad input with their typed errors),
//! - an allocation peak above the target's cap for the input's size (a hostile length field
//!   must not reserve what the input does not hold), measured with a counting global allocator
//!   that the binary installs ([`peak_alloc::PeakAlloc`]),
//! - an input slower than the time cap (a hang or a quadratic blow-up).
//!
//! `cargo xtask fuzz --seconds N` runs every target (release build); `cargo test -p mtp-fuzz`
//! runs a short slice of each.

#![forbid(unsafe_code)]

pub mod mutate;
pub mod targets;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use peak_alloc::PeakAlloc;
use rand::rngs::StdRng;
use rand::SeedableRng;

/// One parser under test.
pub struct Target {
    /// Its name on the command line.
    pub name: &'static str,
    /// What it drives.
    pub about: &'static str,
    /// Valid (or nearly valid) inputs to mutate.
    pub seeds: fn() -> Vec<Vec<u8>>,
    /// Tokens the mutator inserts (the format's syntax).
    pub dictionary: &'static [&'static [u8]],
    /// Runs one input through the parser; the result is dropped (errors are fine).
    pub run: fn(&[u8]),
    /// Bytes the parser may allocate at its peak for an input of `n` bytes.
    pub alloc_cap: fn(usize) -> usize,
    /// The longest input the mutator produces.
    pub max_len: usize,
}

/// How long to fuzz one target.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    /// Stop after this many inputs…
    pub inputs: u64,
    /// …or after this long, whichever comes first.
    pub time: Duration,
    /// An input slower than this is a finding.
    pub slow: Duration,
}

/// Something wrong with one input.
#[derive(Debug, Clone)]
pub struct Finding {
    /// What went wrong.
    pub what: String,
    /// The input.
    pub input: Vec<u8>,
}

/// What a run of one target found.
#[derive(Debug, Clone)]
pub struct Report {
    /// The target.
    pub target: &'static str,
    /// Inputs run.
    pub inputs: u64,
    /// Wall time.
    pub elapsed: Duration,
    /// The slowest input's time.
    pub slowest: Duration,
    /// The largest allocation peak over its cap, as a fraction of the cap (≤ 1 when none
    /// exceeded it).
    pub worst_alloc_ratio: f64,
    /// The largest allocation peak seen, bytes.
    pub peak_alloc: usize,
    /// Panics, over-allocations and slow inputs (the first few of each kind are kept).
    pub findings: Vec<Finding>,
    /// How many findings there were in all.
    pub finding_count: u64,
}

static LAST_PANIC: Mutex<Option<String>> = Mutex::new(None);

/// Whether the binary installed the counting allocator: allocating must move its counter.
pub fn allocator_installed() -> bool {
    let before = PeakAlloc.current_usage();
    let v: Vec<u8> = Vec::with_capacity(1 << 20);
    let during = PeakAlloc.current_usage();
    drop(std::hint::black_box(v));
    during >= before + (1 << 20)
}

/// Fuzzes `target` within `budget` from `seed` (a run is reproducible from its seed).
///
/// # Panics
/// When the counting allocator is not the global allocator of this binary (the allocation cap
/// could not be checked).
pub fn run(target: &Target, budget: Budget, seed: u64) -> Report {
    assert!(
        allocator_installed(),
        "install peak_alloc::PeakAlloc as the #[global_allocator] of the binary that fuzzes"
    );
    let seeds = (target.seeds)();
    let mut rng = StdRng::seed_from_u64(seed);
    // a panic's message goes to the report, not to stderr once per input
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(|info| {
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        if let Ok(mut last) = LAST_PANIC.lock() {
            *last = Some(format!("{msg}{at}"));
        }
    }));
    let mut report = Report {
        target: target.name,
        inputs: 0,
        elapsed: Duration::ZERO,
        slowest: Duration::ZERO,
        worst_alloc_ratio: 0.0,
        peak_alloc: 0,
        findings: Vec::new(),
        finding_count: 0,
    };
    let started = Instant::now();
    let mut kept = [0u32; 3];
    let mut keep = |report: &mut Report, kind: usize, what: String, input: &[u8]| {
        report.finding_count += 1;
        if kept[kind] < 5 {
            kept[kind] += 1;
            report.findings.push(Finding {
                what,
                input: input.to_vec(),
            });
        }
    };
    // every seed once, then mutations
    let mut i = 0usize;
    while report.inputs < budget.inputs && started.elapsed() < budget.time {
        let input = if i < seeds.len() {
            seeds[i].clone()
        } else {
            mutate::mutate(&mut rng, &seeds, target.dictionary, target.max_len)
        };
        i += 1;
        let base = PeakAlloc.current_usage();
        PeakAlloc.reset_peak_usage();
        let t = Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(|| (target.run)(&input)));
        let took = t.elapsed();
        let peak = PeakAlloc.peak_usage().saturating_sub(base);
        report.inputs += 1;
        report.slowest = report.slowest.max(took);
        report.peak_alloc = report.peak_alloc.max(peak);
        let cap = (target.alloc_cap)(input.len());
        report.worst_alloc_ratio = report.worst_alloc_ratio.max(peak as f64 / cap as f64);
        if outcome.is_err() {
            let msg = LAST_PANIC
                .lock()
                .ok()
                .and_then(|mut l| l.take())
                .unwrap_or_default();
            keep(&mut report, 0, format!("panic: {msg}"), &input);
        }
        if peak > cap {
            keep(
                &mut report,
                1,
                format!(
                    "allocated {peak} bytes at peak for a {}-byte input (cap {cap})",
                    input.len()
                ),
                &input,
            );
        }
        if took > budget.slow {
            keep(
                &mut report,
                2,
                format!("took {took:?} for a {}-byte input", input.len()),
                &input,
            );
        }
    }
    report.elapsed = started.elapsed();
    std::panic::set_hook(previous);
    report
}

/// Every target, in the order they are run.
pub fn all() -> Vec<Target> {
    targets::all()
}
