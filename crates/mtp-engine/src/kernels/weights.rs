//! The element types the few-row products read weights in ([`Weight`]: f32, bf16 and f16, and
//! rows just unpacked from a quantized matrix), their loads into [`Lanes`] (widened exactly),
//! and [`widen_to`], which widens a matrix for the products too large for the few-row kernels.

use super::cpu::has_avx;
#[cfg(target_arch = "x86_64")]
use super::lanes::Avx;
use super::lanes::{Lanes, Portable};

/// How a [`Weight`] element is stored (what [`super::matmul_rows`] widens it from).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightKind {
    /// f32, used as is.
    F32,
    /// bfloat16: the upper half of an f32.
    Bf16,
    /// IEEE half precision.
    F16,
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::bf16 {}
    impl Sealed for half::f16 {}
    impl Sealed for super::Unpacked {}
}

/// The element types the few-row products (`matmul_rows`) read weights in, and cached attention
/// keys and values (a KV cache's type): `f32`, and the half-precision formats checkpoints are
/// stored in (`bf16`, `f16`). Half-precision values are widened to f32 as they are loaded,
/// which is exact: a product over them has the bits of the same product over the values
/// converted to f32 beforehand, with half the memory and half the bytes read per step. Sealed:
/// the kernels read each kind with its own instructions.
pub trait Weight: Copy + Send + Sync + 'static + sealed::Sealed {
    #[doc(hidden)]
    const KIND: WeightKind;
    /// Whether one or two inputs take the 512-bit path with four weight rows per pass: weights
    /// that cost work per load (half precision widened, quantized rows unpacked into cache),
    /// unlike f32 streamed from memory (see `matmul::block`).
    #[doc(hidden)]
    const WIDE_FOR_FEW: bool = true;
    /// The value as f32 (exact).
    fn to_f32(self) -> f32;
}

impl Weight for f32 {
    const KIND: WeightKind = WeightKind::F32;
    const WIDE_FOR_FEW: bool = false;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
}

impl Weight for half::bf16 {
    const KIND: WeightKind = WeightKind::Bf16;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        half::bf16::to_f32(self)
    }
}

impl Weight for half::f16 {
    const KIND: WeightKind = WeightKind::F16;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        half::f16::to_f32(self)
    }
}

/// An f32 weight of a row just unpacked into a small buffer (see `matmul_quant`): read like
/// f32, but from cache, so few inputs also take four rows per pass.
#[doc(hidden)]
#[derive(Clone, Copy, Debug)]
#[repr(transparent)]
pub struct Unpacked(pub f32);

impl Weight for Unpacked {
    const KIND: WeightKind = WeightKind::F32;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self.0
    }
}

/// 8 weights at `p`, as f32 lanes.
///
/// # Safety
/// `p` points at 8 readable values and the CPU supports `L`.
#[inline(always)]
pub(super) unsafe fn wload<L: Lanes, E: Weight>(p: *const E) -> L::V {
    // SAFETY: forwarded from the caller; `E::KIND` names `E`'s layout (the trait is sealed).
    unsafe {
        match E::KIND {
            WeightKind::F32 => L::load(p.cast()),
            WeightKind::Bf16 => L::load_bf16(p.cast()),
            WeightKind::F16 => L::load_f16(p.cast()),
        }
    }
}

/// 16 weights at `p`, as [`Lanes::W`].
///
/// # Safety
/// `p` points at 16 readable values and the CPU supports `L`.
#[inline(always)]
pub(super) unsafe fn wload2<L: Lanes, E: Weight>(p: *const E) -> L::W {
    // SAFETY: as [`wload`].
    unsafe {
        match E::KIND {
            WeightKind::F32 => L::load2(p.cast()),
            WeightKind::Bf16 => L::load2_bf16(p.cast()),
            WeightKind::F16 => L::load2_f16(p.cast()),
        }
    }
}

/// `src` widened to f32 (exact) into `out`, which holds as many values, in parallel over blocks:
/// what a product over half-precision weights that is too large for `matmul_rows` multiplies,
/// a block of weight rows at a time.
///
/// # Panics
/// When the lengths differ.
pub fn widen_to<E: Weight>(src: &[E], out: &mut [f32]) {
    assert_eq!(
        src.len(),
        out.len(),
        "widen_to: {} values into {} floats",
        src.len(),
        out.len()
    );
    let avx = has_avx();
    crate::team::chunks_mut(out, WIDEN_CHUNK, |i, dst| {
        let src = &src[i * WIDEN_CHUNK..i * WIDEN_CHUNK + dst.len()];
        #[cfg(target_arch = "x86_64")]
        if avx {
            // SAFETY: AVX2 and F16C were detected (`has_avx`); both slices hold `dst.len()`
            // values.
            unsafe { widen_avx(src, dst) };
            return;
        }
        let _ = avx;
        // SAFETY: no particular instruction set needed; as above.
        unsafe { widen_with::<Portable, E>(src, dst) };
    });
}

/// Values per parallel task of [`widen_to`].
const WIDEN_CHUNK: usize = 1 << 16;

/// # Safety
/// The CPU supports `L`; `dst` and `src` have the same length.
#[inline(always)]
unsafe fn widen_with<L: Lanes, E: Weight>(src: &[E], dst: &mut [f32]) {
    let n = dst.len() / 8 * 8;
    let mut i = 0;
    // SAFETY: `i + 8 <= n <= len` for both slices; the caller guarantees `L`.
    unsafe {
        while i < n {
            L::store(dst.as_mut_ptr().add(i), wload::<L, E>(src.as_ptr().add(i)));
            i += 8;
        }
    }
    for (d, v) in dst[n..].iter_mut().zip(&src[n..]) {
        *d = v.to_f32();
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,avx2,fma,f16c")]
unsafe fn widen_avx<E: Weight>(src: &[E], dst: &mut [f32]) {
    // SAFETY: this function is only called when AVX2 and F16C were detected.
    unsafe { widen_with::<Avx, E>(src, dst) }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::kernels::cpu::{isas, with_isa};
    use crate::testing::{self, expect_panic, CASES};
    use proptest::prelude::*;

    /// `widen_to` checks that both sides hold as many values.
    #[test]
    fn widen_to_checks_the_lengths() {
        let src = vec![half::bf16::ONE; 9];
        expect_panic("widen_to: 9 values into 8 floats", || {
            widen_to(&src, &mut [0f32; 8]);
        });
        expect_panic("widen_to: 8 values into 9 floats", || {
            widen_to(&src[..8], &mut [0f32; 9]);
        });
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(CASES))]

        /// Widening is exact for any length, on every path this CPU runs.
        #[test]
        fn widening_is_exact(len in 0usize..=300, f16 in any::<bool>(), seed in any::<u64>()) {
            let mut next = testing::rng(seed);
            let check = |src: Vec<f32>| {
                for isa in isas() {
                    let mut got = vec![f32::NAN; len];
                    if f16 {
                        let h: Vec<half::f16> = src.iter().map(|v| half::f16::from_f32(*v)).collect();
                        with_isa(isa, || widen_to(&h, &mut got));
                        assert!(h.iter().zip(&got).all(|(a, b)| a.to_f32().to_bits() == b.to_bits()));
                    } else {
                        let h: Vec<half::bf16> = src.iter().map(|v| half::bf16::from_f32(*v)).collect();
                        with_isa(isa, || widen_to(&h, &mut got));
                        assert!(h.iter().zip(&got).all(|(a, b)| a.to_f32().to_bits() == b.to_bits()));
                    }
                }
            };
            check((0..len).map(|_| next() * 1e3).collect());
        }
    }
}
