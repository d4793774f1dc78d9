//! The short slice CI runs: every target for twenty thousand inputs (or 20 s) (the documented run is
//! `cargo xtask fuzz --seconds 60`, over a million inputs per target; see the crate README).
//! One test runs the targets in turn: the allocation peak is process-wide, so targets must not
//! run side by side.

use std::time::Duration;

#[global_allocator]
static ALLOC: peak_alloc::PeakAlloc = peak_alloc::PeakAlloc;

#[test]
fn every_target_survives_a_short_slice() {
    let budget = mtp_fuzz::Budget {
        inputs: 20_000,
        time: Duration::from_secs(20),
        // unoptimised build, a shared 2-core machine
        slow: Duration::from_secs(5),
    };
    let mut failures = Vec::new();
    for t in mtp_fuzz::all() {
        let seeds = (t.seeds)();
        assert!(!seeds.is_empty(), "{}: no seeds", t.name);
        let r = mtp_fuzz::run(&t, budget, 7);
        assert!(
            r.inputs >= seeds.len() as u64,
            "{}: ran {}",
            t.name,
            r.inputs
        );
        for f in &r.findings {
            failures.push(format!(
                "{}: {} (input: {:?})",
                t.name,
                f.what,
                String::from_utf8_lossy(&f.input[..f.input.len().min(200)])
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
