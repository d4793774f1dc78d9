//! Helpers shared by the kernel modules' tests: expected panics (the length checks of the safe
//! entry points), seeded random data and plain scalar references.

use std::panic::{catch_unwind, AssertUnwindSafe};

/// Cases per property test: the kernels are checked against their references on every path this
/// CPU runs, and the suite has a small time budget.
pub(crate) const CASES: u32 = 64;

/// Runs `f`, which must panic with a message containing `want`: a length check at a safe entry
/// point, never a read past a slice's end.
#[track_caller]
pub(crate) fn expect_panic(want: &str, f: impl FnOnce()) {
    let Err(payload) = catch_unwind(AssertUnwindSafe(f)) else {
        panic!("no panic; expected one saying `{want}`");
    };
    let message = payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .unwrap_or("");
    assert!(
        message.contains(want),
        "panicked with `{message}`, expected `{want}`"
    );
}

/// Values in `[-0.5, 0.5)` from `seed`.
pub(crate) fn rng(seed: u64) -> impl FnMut() -> f32 {
    let mut s = seed;
    move || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5
    }
}

/// `a · b` in f64, and the sum of `|a_i b_i|` (the scale of its rounding error in f32).
pub(crate) fn dot64(a: &[f32], b: &[f32]) -> (f64, f64) {
    a.iter().zip(b).fold((0.0, 0.0), |(s, m), (x, y)| {
        let p = *x as f64 * *y as f64;
        (s + p, m + p.abs())
    })
}

/// Whether `got` is within `rel` of `want` relative to `scale` (and 1).
pub(crate) fn close(got: f32, want: f64, scale: f64, rel: f64) -> bool {
    (got as f64 - want).abs() <= rel * (1.0 + scale)
}

/// Bits of `values`, to compare results exactly.
pub(crate) fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}
