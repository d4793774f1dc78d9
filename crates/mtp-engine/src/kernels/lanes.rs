//! 8-lane f32 vectors, the primitive every vector kernel is written over once: [`Lanes`], with
//! a portable implementation ([`Portable`], plain arrays) and the x86 ones ([`Avx`]: AVX2, FMA
//! and F16C; [`Avx512`]: the same lanes, with chunk pairs in one 512-bit register). A kernel
//! generic over `L: Lanes` is compiled once per implementation, the x86 ones inside a
//! `#[target_feature]` function, and called on the instruction set [`super::cpu`] names.

/// 8-lane f32 vectors.
pub(super) trait Lanes {
    type V: Copy;
    /// Whether `mul_add` (and [`madd`]) round once.
    const FUSED: bool;
    /// # Safety
    /// The CPU supports the implementation's instruction set.
    unsafe fn zero() -> Self::V;
    /// # Safety
    /// `p` points at 8 readable floats and the CPU supports the instruction set.
    unsafe fn load(p: *const f32) -> Self::V;
    /// 8 bfloat16 values (their bits) widened to f32, exactly.
    ///
    /// # Safety
    /// `p` points at 8 readable values and the CPU supports the instruction set.
    unsafe fn load_bf16(p: *const u16) -> Self::V;
    /// 8 IEEE half-precision values (their bits) widened to f32, exactly.
    ///
    /// # Safety
    /// As [`Lanes::load_bf16`].
    unsafe fn load_f16(p: *const u16) -> Self::V;
    /// `acc + a * b`, fused when [`Lanes::FUSED`].
    ///
    /// # Safety
    /// The CPU supports the instruction set.
    unsafe fn mul_add(acc: Self::V, a: Self::V, b: Self::V) -> Self::V;
    /// `((a0 + a4) + (a1 + a5)) + ((a2 + a6) + (a3 + a7))`.
    ///
    /// # Safety
    /// The CPU supports the instruction set.
    unsafe fn reduce(acc: Self::V) -> f32;
    /// [`Lanes::reduce`] of eight vectors at once: lane `j` of the result is `reduce(v[j])`,
    /// summed in the same order (so the same bits), in a few shuffles for all eight.
    ///
    /// # Safety
    /// The CPU supports the instruction set.
    unsafe fn reduce8(v: [Self::V; 8]) -> Self::V;
    /// All lanes `x`.
    ///
    /// # Safety
    /// The CPU supports the instruction set.
    unsafe fn splat(x: f32) -> Self::V;
    /// `a + b` per lane.
    ///
    /// # Safety
    /// The CPU supports the instruction set.
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
    /// `a * b` per lane.
    ///
    /// # Safety
    /// The CPU supports the instruction set.
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V;
    /// # Safety
    /// `p` points at 8 writable floats and the CPU supports the instruction set.
    unsafe fn store(p: *mut f32, v: Self::V);
    /// Asks for the cache line at `p` ahead of its use (a hint: any address is allowed).
    #[inline(always)]
    fn prefetch(_p: *const u8) {}
    /// Whether `W` is one register out of 32, so that `matmul_block` can run 4 weight rows
    /// by 3 to 6 inputs in one pass.
    const WIDE: bool = false;
    /// Two consecutive 8-float chunks, `[even | odd]`: one 16-lane vector where the CPU has
    /// them (one instruction does both chunks' lanes, each lane as in [`Lanes::mul_add`]), a
    /// pair of `V` elsewhere.
    type W: Copy;
    /// # Safety
    /// The CPU supports the instruction set.
    unsafe fn zero2() -> Self::W;
    /// # Safety
    /// `p` points at 16 readable floats and the CPU supports the instruction set.
    unsafe fn load2(p: *const f32) -> Self::W;
    /// 16 bfloat16 values as in [`Lanes::load_bf16`].
    ///
    /// # Safety
    /// `p` points at 16 readable values and the CPU supports the instruction set.
    unsafe fn load2_bf16(p: *const u16) -> Self::W;
    /// 16 half-precision values as in [`Lanes::load_f16`].
    ///
    /// # Safety
    /// As [`Lanes::load2_bf16`].
    unsafe fn load2_f16(p: *const u16) -> Self::W;
    /// [`Lanes::mul_add`] on both chunks.
    ///
    /// # Safety
    /// The CPU supports the instruction set.
    unsafe fn mul_add2(acc: Self::W, a: Self::W, b: Self::W) -> Self::W;
    /// `(even, odd)`.
    ///
    /// # Safety
    /// The CPU supports the instruction set.
    unsafe fn halves(w: Self::W) -> (Self::V, Self::V);
    /// All 16 lanes `x`.
    ///
    /// # Safety
    /// The CPU supports the instruction set.
    unsafe fn splat2(x: f32) -> Self::W;
}

/// The pair implementation of [`Lanes::W`] and its operations, for 8-lane-only instruction sets.
macro_rules! paired_w {
    () => {
        type W = (Self::V, Self::V);
        #[inline(always)]
        unsafe fn zero2() -> Self::W {
            // SAFETY: forwarded from the caller.
            unsafe { (Self::zero(), Self::zero()) }
        }
        #[inline(always)]
        unsafe fn load2(p: *const f32) -> Self::W {
            // SAFETY: forwarded from the caller (16 floats).
            unsafe { (Self::load(p), Self::load(p.add(8))) }
        }
        #[inline(always)]
        unsafe fn load2_bf16(p: *const u16) -> Self::W {
            // SAFETY: forwarded from the caller (16 values).
            unsafe { (Self::load_bf16(p), Self::load_bf16(p.add(8))) }
        }
        #[inline(always)]
        unsafe fn load2_f16(p: *const u16) -> Self::W {
            // SAFETY: forwarded from the caller (16 values).
            unsafe { (Self::load_f16(p), Self::load_f16(p.add(8))) }
        }
        #[inline(always)]
        unsafe fn mul_add2(acc: Self::W, a: Self::W, b: Self::W) -> Self::W {
            // SAFETY: forwarded from the caller.
            unsafe {
                (
                    Self::mul_add(acc.0, a.0, b.0),
                    Self::mul_add(acc.1, a.1, b.1),
                )
            }
        }
        #[inline(always)]
        unsafe fn halves(w: Self::W) -> (Self::V, Self::V) {
            w
        }
        #[inline(always)]
        unsafe fn splat2(x: f32) -> Self::W {
            // SAFETY: forwarded from the caller.
            unsafe { (Self::splat(x), Self::splat(x)) }
        }
    };
}

pub(super) struct Portable;

impl Lanes for Portable {
    type V = [f32; 8];
    const FUSED: bool = cfg!(any(target_arch = "aarch64", target_feature = "fma"));
    #[inline(always)]
    unsafe fn zero() -> Self::V {
        [0.0; 8]
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self::V {
        // SAFETY: the caller guarantees 8 readable floats.
        unsafe { std::ptr::read_unaligned(p as *const [f32; 8]) }
    }
    #[inline(always)]
    unsafe fn load_bf16(p: *const u16) -> Self::V {
        // SAFETY: the caller guarantees 8 readable values.
        let h = unsafe { std::ptr::read_unaligned(p as *const [u16; 8]) };
        h.map(|b| f32::from_bits(u32::from(b) << 16))
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const u16) -> Self::V {
        // SAFETY: the caller guarantees 8 readable values.
        let h = unsafe { std::ptr::read_unaligned(p as *const [u16; 8]) };
        h.map(|b| half::f16::from_bits(b).to_f32())
    }
    #[inline(always)]
    unsafe fn mul_add(mut acc: Self::V, a: Self::V, b: Self::V) -> Self::V {
        for j in 0..8 {
            acc[j] = madd::<Self>(a[j], b[j], acc[j]);
        }
        acc
    }
    #[inline(always)]
    unsafe fn reduce(a: Self::V) -> f32 {
        ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]))
    }
    #[inline(always)]
    unsafe fn reduce8(v: [Self::V; 8]) -> Self::V {
        // SAFETY: no particular instruction set needed.
        v.map(|a| unsafe { Self::reduce(a) })
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self::V {
        [x; 8]
    }
    #[inline(always)]
    unsafe fn add(mut a: Self::V, b: Self::V) -> Self::V {
        for j in 0..8 {
            a[j] += b[j];
        }
        a
    }
    #[inline(always)]
    unsafe fn mul(mut a: Self::V, b: Self::V) -> Self::V {
        for j in 0..8 {
            a[j] *= b[j];
        }
        a
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: Self::V) {
        // SAFETY: the caller guarantees 8 writable floats.
        unsafe { std::ptr::write_unaligned(p as *mut [f32; 8], v) }
    }
    paired_w!();
}

/// The 8-lane AVX2 + FMA operations of [`Lanes`], shared by [`Avx`] and [`Avx512`].
#[cfg(target_arch = "x86_64")]
macro_rules! avx_v {
    () => {
        type V = std::arch::x86_64::__m256;
        const FUSED: bool = true;
        #[inline(always)]
        unsafe fn zero() -> Self::V {
            // SAFETY: the caller guarantees AVX.
            unsafe { std::arch::x86_64::_mm256_setzero_ps() }
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self::V {
            // SAFETY: the caller guarantees AVX and 8 readable floats.
            unsafe { std::arch::x86_64::_mm256_loadu_ps(p) }
        }
        #[inline(always)]
        unsafe fn load_bf16(p: *const u16) -> Self::V {
            use std::arch::x86_64::*;
            // SAFETY: the caller guarantees AVX2 and 8 readable values.
            unsafe {
                let h = _mm_loadu_si128(p as *const __m128i);
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
            }
        }
        #[inline(always)]
        unsafe fn load_f16(p: *const u16) -> Self::V {
            use std::arch::x86_64::*;
            // SAFETY: the caller guarantees F16C and 8 readable values.
            unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
        }
        #[inline(always)]
        unsafe fn mul_add(acc: Self::V, a: Self::V, b: Self::V) -> Self::V {
            use std::arch::x86_64::*;
            // SAFETY: the caller guarantees AVX.
            unsafe { _mm256_fmadd_ps(a, b, acc) }
        }
        #[inline(always)]
        unsafe fn reduce(acc: Self::V) -> f32 {
            use std::arch::x86_64::*;
            // SAFETY: the caller guarantees AVX.
            unsafe {
                // [a0 + a4, a1 + a5, a2 + a6, a3 + a7]
                let s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
                // [(a0 + a4) + (a1 + a5), (a2 + a6) + (a3 + a7), ..]
                let h = _mm_hadd_ps(s, s);
                _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)))
            }
        }
        #[inline(always)]
        unsafe fn reduce8(v: [Self::V; 8]) -> Self::V {
            use std::arch::x86_64::*;
            // SAFETY: the caller guarantees AVX.
            unsafe {
                // [s_j | s_{j+4}] with s_j = [a0 + a4, a1 + a5, a2 + a6, a3 + a7] of v[j]
                let s = |j: usize| {
                    _mm256_add_ps(
                        _mm256_permute2f128_ps::<0x20>(v[j], v[j + 4]),
                        _mm256_permute2f128_ps::<0x31>(v[j], v[j + 4]),
                    )
                };
                let (s0, s1, s2, s3) = (s(0), s(1), s(2), s(3));
                // per 128-bit half: [p_j, q_j, p_{j+1}, q_{j+1}] with p = s0 + s1, q = s2 + s3
                let u = _mm256_hadd_ps(s0, s1);
                let w = _mm256_hadd_ps(s2, s3);
                // [p_0 + q_0, p_1 + q_1, p_2 + q_2, p_3 + q_3 | the same for 4..8]
                _mm256_hadd_ps(u, w)
            }
        }
        #[inline(always)]
        unsafe fn splat(x: f32) -> Self::V {
            // SAFETY: the caller guarantees AVX.
            unsafe { std::arch::x86_64::_mm256_set1_ps(x) }
        }
        #[inline(always)]
        unsafe fn add(a: Self::V, b: Self::V) -> Self::V {
            // SAFETY: the caller guarantees AVX.
            unsafe { std::arch::x86_64::_mm256_add_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn mul(a: Self::V, b: Self::V) -> Self::V {
            // SAFETY: the caller guarantees AVX.
            unsafe { std::arch::x86_64::_mm256_mul_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: Self::V) {
            // SAFETY: the caller guarantees AVX and 8 writable floats.
            unsafe { std::arch::x86_64::_mm256_storeu_ps(p, v) }
        }
        #[inline(always)]
        fn prefetch(p: *const u8) {
            use std::arch::x86_64::*;
            // SAFETY: a prefetch is a hint that never faults, whatever the address; SSE is part
            // of x86_64.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p as *const i8) }
        }
    };
}

#[cfg(target_arch = "x86_64")]
pub(super) struct Avx;

#[cfg(target_arch = "x86_64")]
impl Lanes for Avx {
    avx_v!();
    paired_w!();
}

/// AVX2 lanes, with the chunk pairs of `dots` in one 512-bit vector (AVX-512F): half the
/// multiply-add instructions for the same lane-by-lane arithmetic, so the same bits.
#[cfg(target_arch = "x86_64")]
pub(super) struct Avx512;

#[cfg(target_arch = "x86_64")]
impl Lanes for Avx512 {
    avx_v!();
    const WIDE: bool = true;
    type W = std::arch::x86_64::__m512;
    #[inline(always)]
    unsafe fn zero2() -> Self::W {
        // SAFETY: the caller guarantees AVX-512F.
        unsafe { std::arch::x86_64::_mm512_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn load2(p: *const f32) -> Self::W {
        // SAFETY: the caller guarantees AVX-512F and 16 readable floats.
        unsafe { std::arch::x86_64::_mm512_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn load2_bf16(p: *const u16) -> Self::W {
        use std::arch::x86_64::*;
        // SAFETY: the caller guarantees AVX-512F and 16 readable values.
        unsafe {
            let h = _mm256_loadu_si256(p as *const __m256i);
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
        }
    }
    #[inline(always)]
    unsafe fn load2_f16(p: *const u16) -> Self::W {
        use std::arch::x86_64::*;
        // SAFETY: the caller guarantees AVX-512F and 16 readable values.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)) }
    }
    #[inline(always)]
    unsafe fn mul_add2(acc: Self::W, a: Self::W, b: Self::W) -> Self::W {
        // SAFETY: the caller guarantees AVX-512F.
        unsafe { std::arch::x86_64::_mm512_fmadd_ps(a, b, acc) }
    }
    #[inline(always)]
    unsafe fn halves(w: Self::W) -> (Self::V, Self::V) {
        use std::arch::x86_64::*;
        // SAFETY: the caller guarantees AVX-512F.
        unsafe {
            let hi = _mm512_extractf64x4_pd::<1>(_mm512_castps_pd(w));
            (_mm512_castps512_ps256(w), _mm256_castpd_ps(hi))
        }
    }
    #[inline(always)]
    unsafe fn splat2(x: f32) -> Self::W {
        // SAFETY: the caller guarantees AVX-512F.
        unsafe { std::arch::x86_64::_mm512_set1_ps(x) }
    }
}

/// `a * b + c` with the rounding of `L`'s lanes.
#[inline(always)]
pub(super) fn madd<L: Lanes>(a: f32, b: f32, c: f32) -> f32 {
    if L::FUSED {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// Whether the path `matmul_rows` and friends take here fuses its multiply-adds.
#[cfg(test)]
pub(super) fn detected_fused() -> bool {
    super::cpu::has_avx() || Portable::FUSED
}

/// Whether `isa`'s multiply-adds are fused.
#[cfg(test)]
pub(super) fn fused(isa: super::cpu::Isa) -> bool {
    isa != super::cpu::Isa::Portable || Portable::FUSED
}
