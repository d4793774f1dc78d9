//! Seeded integer draws that stay what they were under rand 0.8.
//!
//! rand 0.9 changed how `gen_range` (now `random_range`) maps a generator's words to an integer
//! range, so the same seed gives other integers from the first draw. Committed artefacts were
//! made from rand 0.8's integer streams: `cargo xtask train-tiny --seed 0` picks the training rows
//! of the bundled `models/tiny-code` with them, and `mtp-fuzz` replays a reported `--seed`
//! through its mutator. [`int_range`] is rand 0.8's algorithm for those draws, written out here
//! so that every seeded integer stream in the workspace stays bit-identical across rand
//! versions (the generator's raw words, and the float draws, did not change between 0.8 and 0.9).
//!
//! The algorithm (rand 0.8.5 `UniformInt::sample_single_inclusive`, for 32- and 64-bit types):
//! with `range = high - low + 1` as an unsigned integer of the type's width (`u32` for `i32` and
//! `u32`, `u64` for `usize` on 64-bit targets), draw one word `v` of that width, form the
//! double-width product `v * range`, and accept its high half when its low half is at most
//! `zone = (range << range.leading_zeros()) - 1`, else draw again; the result is `low + high
//! half`. A `range` of 0 (the type's whole span) returns one word as is. rand 0.8 used a modulus
//! for `zone` with 8- and 16-bit types instead, which is why those are not offered.

use std::ops::{Range, RangeInclusive};

use rand::RngCore;

mod sealed {
    pub trait Sealed {}
    impl Sealed for i32 {}
    impl Sealed for u32 {}
    impl Sealed for usize {}
}

/// The integer types [`int_range`] draws, each at the width rand 0.8 drew it.
pub trait Int: Copy + PartialOrd + sealed::Sealed {
    /// One draw from `low..=high` (`low <= high`).
    #[doc(hidden)]
    fn between<R: RngCore + ?Sized>(rng: &mut R, low: Self, high: Self) -> Self;
    /// `self - 1` (the inclusive end of a half-open range).
    #[doc(hidden)]
    fn before(self) -> Self;
}

/// The ranges [`int_range`] takes: `low..high` and `low..=high`.
pub trait IntRange<T: Int> {
    /// The inclusive bounds; panics on an empty range, as rand 0.8's `gen_range` does.
    #[doc(hidden)]
    fn bounds(self) -> (T, T);
}

impl<T: Int> IntRange<T> for Range<T> {
    fn bounds(self) -> (T, T) {
        assert!(self.start < self.end, "cannot sample empty range");
        (self.start, self.end.before())
    }
}

impl<T: Int> IntRange<T> for RangeInclusive<T> {
    fn bounds(self) -> (T, T) {
        let (low, high) = self.into_inner();
        assert!(low <= high, "cannot sample empty range");
        (low, high)
    }
}

/// A uniform integer from `range`, the one rand 0.8's `rng.gen_range(range)` returned for the
/// same generator state and the same integer type (see the module's note). Use it for every
/// seeded integer draw whose stream something committed depends on.
pub fn int_range<T: Int, R: RngCore + ?Sized>(rng: &mut R, range: impl IntRange<T>) -> T {
    let (low, high) = range.bounds();
    T::between(rng, low, high)
}

/// rand 0.8's draw below `range` (not 0) with 32-bit words.
fn below_u32<R: RngCore + ?Sized>(rng: &mut R, range: u32) -> u32 {
    let zone = (range << range.leading_zeros()).wrapping_sub(1);
    loop {
        let m = u64::from(rng.next_u32()) * u64::from(range);
        if m as u32 <= zone {
            return (m >> 32) as u32;
        }
    }
}

/// rand 0.8's draw below `range` (not 0) with 64-bit words.
#[cfg(target_pointer_width = "64")]
fn below_u64<R: RngCore + ?Sized>(rng: &mut R, range: u64) -> u64 {
    let zone = (range << range.leading_zeros()).wrapping_sub(1);
    loop {
        let m = u128::from(rng.next_u64()) * u128::from(range);
        if m as u64 <= zone {
            return (m >> 64) as u64;
        }
    }
}

impl Int for u32 {
    fn between<R: RngCore + ?Sized>(rng: &mut R, low: u32, high: u32) -> u32 {
        match high.wrapping_sub(low).wrapping_add(1) {
            0 => rng.next_u32(),
            range => low.wrapping_add(below_u32(rng, range)),
        }
    }
    fn before(self) -> u32 {
        self - 1
    }
}

impl Int for i32 {
    fn between<R: RngCore + ?Sized>(rng: &mut R, low: i32, high: i32) -> i32 {
        match high.wrapping_sub(low).wrapping_add(1) as u32 {
            0 => rng.next_u32() as i32,
            range => low.wrapping_add(below_u32(rng, range) as i32),
        }
    }
    fn before(self) -> i32 {
        self - 1
    }
}

impl Int for usize {
    #[cfg(target_pointer_width = "64")]
    fn between<R: RngCore + ?Sized>(rng: &mut R, low: usize, high: usize) -> usize {
        match high.wrapping_sub(low).wrapping_add(1) as u64 {
            0 => rng.next_u64() as usize,
            range => low.wrapping_add(below_u64(rng, range) as usize),
        }
    }
    #[cfg(target_pointer_width = "32")]
    fn between<R: RngCore + ?Sized>(rng: &mut R, low: usize, high: usize) -> usize {
        match high.wrapping_sub(low).wrapping_add(1) as u32 {
            0 => rng.next_u32() as usize,
            range => low.wrapping_add(below_u32(rng, range) as usize),
        }
    }
    fn before(self) -> usize {
        self - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    const SEEDS: [u64; 5] = [0, 3, 0xDA7A, 42, 0xDEAD_BEEF];
    const DRAWS: usize = 1_000_000;

    /// Draws `DRAWS` times from `range` with `int_range` and with rand 0.8's `gen_range`, each
    /// from the generator seeded `seed`, and checks they agree draw for draw and leave the
    /// generators in the same state.
    fn agrees<T, G>(seed: u64, range: G)
    where
        T: Int + rand::distributions::uniform::SampleUniform + std::fmt::Debug,
        G: IntRange<T> + rand::distributions::uniform::SampleRange<T> + Clone,
    {
        let (mut ours, mut theirs) = (StdRng::seed_from_u64(seed), StdRng::seed_from_u64(seed));
        for i in 0..DRAWS {
            let (a, b) = (
                int_range(&mut ours, range.clone()),
                theirs.gen_range(range.clone()),
            );
            assert!(
                a == b,
                "seed {seed}, draw {i}: {a:?} against rand 0.8's {b:?}"
            );
        }
        assert_eq!(ours.next_u64(), theirs.next_u64(), "seed {seed}: the state");
    }

    /// rand 0.8's `gen_range`, draw for draw, over the ranges the workspace draws from (train-tiny's
    /// row starts, its test's printable bytes, the mutator's byte counts and indices) and the
    /// edges (one value, a span with many rejections, the type's whole span).
    #[test]
    fn int_range_is_rand_0_8s_gen_range() {
        for seed in SEEDS {
            agrees(seed, 0usize..1_752_987);
            agrees(seed, 0usize..1_750_000);
            agrees(seed, 0usize..=300);
            agrees(seed, 5usize..6);
            agrees(seed, 0usize..(1 << 63) + 1);
            agrees(seed, 0usize..=usize::MAX);
            agrees(seed, 32u32..127);
            agrees(seed, 0u32..(1 << 31) + 1);
            agrees(seed, 0i32..256);
            agrees(seed, 0i32..11);
            agrees(seed, 1i32..17);
            agrees(seed, -5i32..5);
            agrees(seed, i32::MIN..=i32::MAX);
        }
    }
}
