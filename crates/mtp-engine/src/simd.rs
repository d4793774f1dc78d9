//! The engine's hot kernels, `matmul_rows` (few rows times a weight matrix), cached `attention`
//! and the gated delta rule, written once over 8-lane vectors and compiled twice: with AVX2 and
//! FMA when the CPU has them (detected once per call) and portably otherwise.
//!
//! Every dot product here has one fixed arithmetic: two sets of 8 lanes (even and odd 8-float
//! chunks), each `acc[j] = fma(x[j], y[j], acc[j])`, added lane by lane, reduced as
//! `((a0 + a4) + (a1 + a5)) + ((a2 + a6) + (a3 + a7))`, plus the scalar tail. The multiply-add
//! is fused (rounded once) on the AVX2 path, and on the portable path where the target has FMA
//! (aarch64, or x86 built with it); elsewhere the portable path multiplies then adds, since a
//! software fused multiply-add would cost many times the work. A row's result therefore never
//! depends on which other rows are computed with it: a verify forward of `k + 1` tokens yields
//! the bits of `k + 1` single-token forwards, which is what keeps greedy speculation identical
//! to plain decoding. Several rows share each weight (or key) load, which gives the independent
//! dependency chains that a lone dot product lacks.

use crate::quant::QuantMatrix;

/// 8-lane f32 vectors.
trait Lanes {
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
    /// Whether `W` is one register out of 32, so that [`matmul_block`] can run 4 weight rows
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

struct Portable;

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
struct Avx;

#[cfg(target_arch = "x86_64")]
impl Lanes for Avx {
    avx_v!();
    paired_w!();
}

/// AVX2 lanes, with the chunk pairs of [`dots`] in one 512-bit vector (AVX-512F): half the
/// multiply-add instructions for the same lane-by-lane arithmetic, so the same bits.
#[cfg(target_arch = "x86_64")]
struct Avx512;

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
fn madd<L: Lanes>(a: f32, b: f32, c: f32) -> f32 {
    if L::FUSED {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// How a [`Weight`] element is stored (what [`matmul_rows`] widens it from).
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

/// The element types [`matmul_rows`] reads weights in: `f32`, and the half-precision formats
/// checkpoints are stored in (`bf16`, `f16`). Half-precision weights are widened to f32 as
/// they are loaded, which is exact: a product over them has the bits of the same product over
/// the weights converted to f32 beforehand, with half the memory and half the bytes read per
/// step. Sealed: the kernels read each kind with its own instructions.
pub trait Weight: Copy + Send + Sync + 'static + sealed::Sealed {
    #[doc(hidden)]
    const KIND: WeightKind;
    /// Whether one or two inputs take the 512-bit path with four weight rows per pass: weights
    /// that cost work per load (half precision widened, quantized rows unpacked into cache),
    /// unlike f32 streamed from memory (see [`block`]).
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

/// An f32 weight of a row just unpacked into a small buffer (see [`matmul_quant`]): read like
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
unsafe fn wload<L: Lanes, E: Weight>(p: *const E) -> L::V {
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
unsafe fn wload2<L: Lanes, E: Weight>(p: *const E) -> L::W {
    // SAFETY: as [`wload`].
    unsafe {
        match E::KIND {
            WeightKind::F32 => L::load2(p.cast()),
            WeightKind::Bf16 => L::load2_bf16(p.cast()),
            WeightKind::F16 => L::load2_f16(p.cast()),
        }
    }
}

/// The `N × M` dot products of the rows at `xs` with the weight rows at `ws`, all `len` long.
/// Even and odd 8-float chunks accumulate apart (two dependency chains per product) and are
/// added before the reduction, so each result has the arithmetic of its lone dot product
/// whatever `N` and `M` are. Each input chunk is loaded once for all `M` weight rows: with
/// `M = 2` a product whose weights sit in cache does twice the multiply-adds per load.
///
/// # Safety
/// Every pointer reads `len` floats; the CPU supports `L`.
#[inline(always)]
unsafe fn dots<L: Lanes, E: Weight, const N: usize, const M: usize>(
    xs: [*const f32; N],
    ws: [*const E; M],
    len: usize,
) -> [[f32; N]; M] {
    let chunks = len / 8;
    // a lone weight row prefetches 4 KiB ahead; several prefetch the same columns of the next
    // group of rows (or further), so that every stream runs ahead
    let lone = PREFETCH_AHEAD / std::mem::size_of::<E>();
    let ahead = if M == 1 { lone } else { (M * len).max(lone) };
    // SAFETY (all reads): `c * 8 + 8 <= len` and `i < len`.
    unsafe {
        // `acc` holds each product's even and odd chunks: [`Lanes::W`]
        let mut acc = [[L::zero2(); N]; M];
        let mut c = 0;
        while c + 2 <= chunks {
            let mut y = [L::zero2(); M];
            for m in 0..M {
                L::prefetch(ws[m].wrapping_add(c * 8 + ahead).cast());
                y[m] = wload2::<L, E>(ws[m].add(c * 8));
            }
            for r in 0..N {
                let x = L::load2(xs[r].add(c * 8));
                for m in 0..M {
                    acc[m][r] = L::mul_add2(acc[m][r], x, y[m]);
                }
            }
            c += 2;
        }
        let mut even = [[L::zero(); N]; M];
        let mut odd = [[L::zero(); N]; M];
        for m in 0..M {
            for r in 0..N {
                (even[m][r], odd[m][r]) = L::halves(acc[m][r]);
            }
        }
        if c < chunks {
            for r in 0..N {
                let x0 = L::load(xs[r].add(c * 8));
                for m in 0..M {
                    even[m][r] = L::mul_add(even[m][r], x0, wload::<L, E>(ws[m].add(c * 8)));
                }
            }
        }
        let mut out = [[0f32; N]; M];
        for m in 0..M {
            for r in 0..N {
                let mut tail = 0f32;
                for i in chunks * 8..len {
                    tail += *xs[r].add(i) * (*ws[m].add(i)).to_f32();
                }
                out[m][r] = L::reduce(L::add(even[m][r], odd[m][r])) + tail;
            }
        }
        out
    }
}

/// Dot products of `rows` (pointers to `len` floats) with `w`, in one pass over `w` for up to
/// six rows (twelve accumulators and two weight vectors fit in sixteen registers), four at a
/// time before that; `sink(i, value)` receives row `i`'s result.
///
/// # Safety
/// As [`dots`].
#[inline(always)]
unsafe fn dots_many<L: Lanes, E: Weight>(
    rows: &[*const f32],
    w: *const E,
    len: usize,
    mut sink: impl FnMut(usize, f32),
) {
    let n = rows.len();
    let mut r = 0;
    // SAFETY: forwarded from the caller.
    unsafe {
        while n - r > 6 {
            let [d] = dots::<L, E, 4, 1>(first(&rows[r..]), [w], len);
            for (j, v) in d.into_iter().enumerate() {
                sink(r + j, v);
            }
            r += 4;
        }
        let rest = &rows[r..];
        let mut put = |d: &[f32]| {
            for (j, v) in d.iter().enumerate() {
                sink(r + j, *v);
            }
        };
        match rest.len() {
            6 => put(&dots::<L, E, 6, 1>(first(rest), [w], len)[0]),
            5 => put(&dots::<L, E, 5, 1>(first(rest), [w], len)[0]),
            4 => put(&dots::<L, E, 4, 1>(first(rest), [w], len)[0]),
            3 => put(&dots::<L, E, 3, 1>(first(rest), [w], len)[0]),
            2 => put(&dots::<L, E, 2, 1>(first(rest), [w], len)[0]),
            1 => put(&dots::<L, E, 1, 1>(first(rest), [w], len)[0]),
            _ => {}
        }
    }
}

/// The first `N` row pointers.
#[inline(always)]
fn first<T, const N: usize>(rows: &[*const T]) -> [*const T; N] {
    std::array::from_fn(|i| rows[i])
}

/// How far ahead of its use a weight row is prefetched, in bytes (4 KiB). Decode streams the
/// weights from memory once per step; without the hint one core keeps too few cache lines in
/// flight once a few rows share each weight load, and a verify forward of 2–5 rows cost
/// 1.15–1.8 times one row on a matrix larger than the caches (`examples/matmul_rows`);
/// with it, 1.0–1.1. [`dots`] over two weight rows prefetches the same columns of the next
/// pair (7–12% faster for one and two inputs than 4 KiB, measured interleaved).
const PREFETCH_AHEAD: usize = 4096;

/// The instruction sets the kernels choose between, narrowest first: the portable lanes, AVX2
/// (with FMA and F16C), and AVX-512F next to AVX2.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[cfg_attr(not(test), allow(dead_code))] // `Portable` is named by tests only
pub(crate) enum Isa {
    /// No particular instruction set.
    Portable,
    /// AVX, AVX2, FMA and F16C.
    Avx2,
    /// AVX2 and AVX-512F.
    Avx512,
}

#[cfg(test)]
thread_local! {
    /// The widest instruction set this thread's kernel calls may choose (see [`with_isa`]).
    static ISA_CAP: std::cell::Cell<Isa> = const { std::cell::Cell::new(Isa::Avx512) };
}

/// Whether a kernel call on this thread may use `isa`: always, outside tests; in tests, up to
/// the cap that [`with_isa`] sets. Only ever narrows what the CPU has.
#[inline(always)]
fn allowed(isa: Isa) -> bool {
    #[cfg(test)]
    {
        ISA_CAP.get() >= isa
    }
    #[cfg(not(test))]
    {
        let _ = isa;
        true
    }
}

/// Runs `f` with this thread's kernel calls limited to `isa` (the portable lanes, or AVX2
/// without AVX-512), so that tests reach every path this CPU can run. A call decides its path on
/// the calling thread; work it hands to the team keeps that path, except dequantization inside
/// [`matmul_quant`] (each path gives the same bits).
#[cfg(test)]
pub(crate) fn with_isa<R>(isa: Isa, f: impl FnOnce() -> R) -> R {
    struct Restore(Isa);
    impl Drop for Restore {
        fn drop(&mut self) {
            ISA_CAP.set(self.0);
        }
    }
    let _restore = Restore(ISA_CAP.replace(isa));
    f()
}

/// The instruction sets this CPU runs, narrowest first.
#[cfg(test)]
pub(crate) fn isas() -> Vec<Isa> {
    [Isa::Portable, Isa::Avx2, Isa::Avx512]
        .into_iter()
        .filter(|&isa| with_isa(isa, detected) == isa)
        .collect()
}

/// The widest instruction set a kernel call on this thread uses.
#[cfg(test)]
pub(crate) fn detected() -> Isa {
    if has_avx512() {
        Isa::Avx512
    } else if has_avx() {
        Isa::Avx2
    } else {
        Isa::Portable
    }
}

/// Whether the CPU has what the AVX2 path needs (see [`has_avx`]).
fn cpu_has_avx() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx")
            && std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The vector path needs AVX for the lanes, AVX2 for the integer half of `exp` and for widening
/// bfloat16 weights, and F16C for half-precision weights (every AVX2 CPU has it). True only
/// where the CPU has them all.
pub(crate) fn has_avx() -> bool {
    allowed(Isa::Avx2) && cpu_has_avx()
}

/// Output features of `w` computed per task when a product is split across threads.
const BLOCK: usize = 64;

/// Where [`matmul_block`] writes: the result of input row `r` and output feature `o` goes to
/// `ptr + r * out + o` (the `[n, out]` result, written in place by every block).
#[derive(Clone, Copy)]
struct Dst {
    ptr: *mut f32,
    out: usize,
}

// SAFETY: blocks write disjoint output features (see `matmul_rows`).
unsafe impl Send for Dst {}
// SAFETY: as above.
unsafe impl Sync for Dst {}

impl Dst {
    /// The same result seen from output feature `o` on (feature `o + j` is its `j`).
    ///
    /// # Safety
    /// `o` is inside every row of the result.
    #[inline(always)]
    unsafe fn from(self, o: usize) -> Dst {
        Dst {
            // SAFETY: forwarded from the caller.
            ptr: unsafe { self.ptr.add(o) },
            out: self.out,
        }
    }

    /// # Safety
    /// `(r, o)` is inside the result and no other thread writes it.
    #[inline(always)]
    unsafe fn put(self, r: usize, o: usize, v: f32) {
        // SAFETY: forwarded from the caller.
        unsafe { *self.ptr.add(r * self.out + o) = v };
    }
}

/// Writes `x[r] · w[o]` for every input row `r < n` and the `outs` output features
/// `o0..o0 + outs` of one block.
///
/// # Safety
/// The CPU supports `L`; `w` holds the block's weight rows; `dst` has room for `n` rows of
/// its features and no other thread writes them.
#[inline(always)]
unsafe fn matmul_block<L: Lanes, E: Weight>(
    x: &[f32],
    n: usize,
    w: &[E],
    inp: usize,
    o0: usize,
    outs: usize,
    dst: Dst,
) {
    let mut rows = [std::ptr::null::<f32>(); 32];
    let rows = &mut rows[..n];
    for (r, p) in rows.iter_mut().enumerate() {
        *p = x[r * inp..(r + 1) * inp].as_ptr();
    }
    if L::WIDE {
        // SAFETY: forwarded from the caller; `rows` holds `n` rows of `inp` floats.
        unsafe {
            match n {
                // half-precision or unpacked weights: four weight rows in flight for one or two
                // inputs too (see `block`)
                1 if E::WIDE_FOR_FEW => {
                    return groups::<L, E, 1, 4>(first(rows), w, inp, o0, outs, dst)
                }
                2 if E::WIDE_FOR_FEW => {
                    return groups::<L, E, 2, 4>(first(rows), w, inp, o0, outs, dst)
                }
                3 => return groups::<L, E, 3, 4>(first(rows), w, inp, o0, outs, dst),
                4 => return groups::<L, E, 4, 4>(first(rows), w, inp, o0, outs, dst),
                5 => return groups::<L, E, 5, 4>(first(rows), w, inp, o0, outs, dst),
                6 => return groups::<L, E, 6, 4>(first(rows), w, inp, o0, outs, dst),
                _ => {}
            }
        }
    }
    let mut j = 0;
    // one or two inputs (decode, a depth-1 verify): two weight rows per pass
    if n <= 2 {
        while j + 2 <= outs {
            let (w0, w1) = (
                w[(o0 + j) * inp..].as_ptr(),
                w[(o0 + j + 1) * inp..].as_ptr(),
            );
            // SAFETY: every row holds `inp` floats, and so do the weight rows `o0 + j` and
            // `o0 + j + 1` (`j + 1 < outs`); the caller guarantees `L` and `dst`.
            unsafe {
                if n == 1 {
                    put_dots(dst, o0 + j, dots::<L, E, 1, 2>(first(rows), [w0, w1], inp));
                } else {
                    put_dots(dst, o0 + j, dots::<L, E, 2, 2>(first(rows), [w0, w1], inp));
                }
            }
            j += 2;
        }
    }
    for jj in j..outs {
        let wr = &w[(o0 + jj) * inp..(o0 + jj + 1) * inp];
        // SAFETY: every row and `wr` hold `inp` floats; the caller guarantees `L` and `dst`.
        unsafe { dots_many::<L, E>(rows, wr.as_ptr(), inp, |r, v| dst.put(r, o0 + jj, v)) };
    }
}

/// Writes the results of [`dots`] for output features `o..o + M`.
///
/// # Safety
/// As [`Dst::put`] for every row `r < N` and those features.
#[inline(always)]
unsafe fn put_dots<const N: usize, const M: usize>(dst: Dst, o: usize, d: [[f32; N]; M]) {
    for (m, dm) in d.iter().enumerate() {
        for (r, v) in dm.iter().enumerate() {
            // SAFETY: forwarded from the caller.
            unsafe { dst.put(r, o + m, *v) };
        }
    }
}

/// [`matmul_block`] for `N` inputs, `M` weight rows per pass (then one at a time): `N * M`
/// independent products, enough to keep the multiply-add units busy when the weights come from
/// cache, for lanes with registers to hold them ([`Lanes::WIDE`]).
///
/// # Safety
/// As [`dots`] and [`matmul_block`].
#[inline(always)]
unsafe fn groups<L: Lanes, E: Weight, const N: usize, const M: usize>(
    xs: [*const f32; N],
    w: &[E],
    inp: usize,
    o0: usize,
    outs: usize,
    dst: Dst,
) {
    let mut j = 0;
    // SAFETY: every weight row `o0 + j + m < o0 + outs` holds `inp` floats, as do the inputs;
    // the caller guarantees `dst`.
    unsafe {
        while j + M <= outs {
            let ws = std::array::from_fn(|m| w[(o0 + j + m) * inp..].as_ptr());
            put_dots(dst, o0 + j, dots::<L, E, N, M>(xs, ws, inp));
            j += M;
        }
        while j < outs {
            put_dots(
                dst,
                o0 + j,
                dots::<L, E, N, 1>(xs, [w[(o0 + j) * inp..].as_ptr()], inp),
            );
            j += 1;
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,avx2,fma,f16c")]
unsafe fn matmul_block_avx<E: Weight>(
    x: &[f32],
    n: usize,
    w: &[E],
    inp: usize,
    o0: usize,
    outs: usize,
    dst: Dst,
) {
    // SAFETY: this function is only called when AVX was detected; the caller guarantees `dst`.
    unsafe { matmul_block::<Avx, E>(x, n, w, inp, o0, outs, dst) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,avx2,fma,f16c,avx512f")]
unsafe fn matmul_block_avx512<E: Weight>(
    x: &[f32],
    n: usize,
    w: &[E],
    inp: usize,
    o0: usize,
    outs: usize,
    dst: Dst,
) {
    // SAFETY: this function is only called when AVX2, FMA and AVX-512F were detected; the
    // caller guarantees `dst`.
    unsafe { matmul_block::<Avx512, E>(x, n, w, inp, o0, outs, dst) }
}

/// Whether [`matmul_rows`] may use 512-bit vectors: AVX-512F next to the AVX2 path. Set
/// `MTP_NO_AVX512=1` to keep it to 256 bits (same results; for comparisons).
pub(crate) fn has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        allowed(Isa::Avx512)
            && *OK.get_or_init(|| {
                cpu_has_avx()
                    && std::arch::is_x86_feature_detected!("avx512f")
                    && std::env::var_os("MTP_NO_AVX512").is_none_or(|v| v.is_empty() || v == "0")
            })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Most rows [`matmul_rows`] takes.
pub const MAX_ROWS: usize = 32;

/// Sequences of `lens` rows in consecutive groups of at most [`MAX_ROWS`] rows together (a
/// longer sequence alone): the index ranges. A product over more rows takes `fgemm`, whose
/// bits differ from the few-row product's, so a forward over several sequences runs group by
/// group to give each the bits it gets alone.
pub(crate) fn row_groups(lens: &[usize]) -> Vec<std::ops::Range<usize>> {
    let mut groups = Vec::new();
    let mut start = 0;
    while start < lens.len() {
        let mut end = start + 1;
        let mut rows = lens[start];
        while end < lens.len() && rows + lens[end] <= MAX_ROWS {
            rows += lens[end];
            end += 1;
        }
        groups.push(start..end);
        start = end;
    }
    groups
}

/// [`matmul_block`] on the path this CPU runs (`avx`, `avx512`: what was detected).
///
/// # Safety
/// As [`matmul_block`]; `avx` and `avx512` are [`has_avx`] and [`has_avx512`].
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn block<E: Weight>(
    x: &[f32],
    n: usize,
    w: &[E],
    inp: usize,
    o0: usize,
    outs: usize,
    dst: Dst,
    avx: bool,
    avx512: bool,
) {
    // The 512-bit path takes f32 weights from three rows up: one or two (decode, a depth-1
    // verify) stream them at memory speed either way, and on a 615M-parameter shape the
    // paired 256-bit path was 3% faster for two (`verify_cost`: 1.07-1.08 steps against
    // 1.08-1.12). It takes half-precision weights for every row count: widening 16 values
    // per instruction with four weight rows per pass streamed bf16 at 19.4-21.4 GB/s for
    // one or two rows instead of 16.1-17.3 (`examples/matmul_rows`, 512 MiB, interleaved).
    // SAFETY (all three): forwarded from the caller.
    #[cfg(target_arch = "x86_64")]
    if avx512 && (n > 2 || E::WIDE_FOR_FEW) {
        // (and AVX2, FMA and AVX-512F were detected on this CPU)
        unsafe { matmul_block_avx512(x, n, w, inp, o0, outs, dst) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if avx {
        // (and AVX was detected on this CPU)
        unsafe { matmul_block_avx(x, n, w, inp, o0, outs, dst) };
        return;
    }
    let _ = (avx, avx512);
    // (and the portable lanes need no particular instruction set)
    unsafe { matmul_block::<Portable, E>(x, n, w, inp, o0, outs, dst) };
}

/// Values held from a 64-byte boundary on, for buffers that kernels read many times: the input
/// rows of the packed products ([`crate::qdot`]), the keys and values of the attention cache
/// ([`crate::cache::KvCache`]) and attention's queries. With rows of a multiple of 16 values,
/// every 64-byte vector load of them then sits in one cache line. From a buffer 16 bytes off a
/// line (where the allocator puts large ones) each such load was split in two, and on AVX-512,
/// where vector loads share two ports: a 4-bit product with 4 input rows ran 40% longer
/// (`examples/matmul_rows 0.5 201 q4` on one thread: 144 -> 103 µs; a C copy of the loop
/// alike); attention over 4096 cached positions for 512 queries 25-30% longer (`--example
/// attention -- 512 16 2 256 4096 3`: 202-206 ms aligned, 241-247 with the keys and values
/// off, 265-276 with the queries off too), one decode query 10-15% (`1 8 2 128 1500 400`:
/// 71-79 µs against 82-85). The f32 and bf16 few-row products, bound by the weights' stream,
/// did not change with it (`matmul_rows 256 7 f32`, `128 9 bf16`), and take their inputs where
/// they lie.
///
/// It grows like a `Vec` (to twice its length at least), moving its values to a new aligned
/// buffer; a clone is aligned too.
#[derive(Default)]
pub(crate) struct Aligned {
    buf: Vec<f32>,
    at: usize,
    len: usize,
}

impl Aligned {
    /// `len` values written by `fill` (given them zeroed).
    pub(crate) fn filled(len: usize, fill: impl FnOnce(&mut [f32])) -> Aligned {
        const LINE: usize = 64 / std::mem::size_of::<f32>();
        let mut buf = vec![0f32; len + LINE - 1];
        // `buf` is f32-aligned, so the first line boundary is a whole number of values on
        let at = (64 - buf.as_ptr() as usize % 64) % 64 / std::mem::size_of::<f32>();
        fill(&mut buf[at..at + len]);
        Aligned { buf, at, len }
    }

    /// A copy of `x`.
    pub(crate) fn copy(x: &[f32]) -> Aligned {
        Aligned::filled(x.len(), |out| out.copy_from_slice(x))
    }

    pub(crate) fn values(&self) -> &[f32] {
        &self.buf[self.at..self.at + self.len]
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends `x`.
    pub(crate) fn extend_from_slice(&mut self, x: &[f32]) {
        let need = self.len + x.len();
        if self.at + need > self.buf.len() {
            let old = std::mem::take(self);
            *self = Aligned::filled(need.max(2 * old.len), |out| {
                out[..old.len].copy_from_slice(old.values())
            });
            self.len = old.len;
        }
        self.buf[self.at + self.len..self.at + need].copy_from_slice(x);
        self.len = need;
    }

    /// Keeps the first `len` values (all when there are fewer).
    pub(crate) fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }
}

impl Clone for Aligned {
    fn clone(&self) -> Aligned {
        Aligned::copy(self.values())
    }
}

impl std::fmt::Debug for Aligned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.values()).finish()
    }
}

/// The product of `dims`, `None` when it overflows (then no slice has that many elements).
pub(crate) fn elements(dims: &[usize]) -> Option<usize> {
    dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d))
}

/// Panics unless `x` holds `n` rows of `inp > 0` floats and `1 <= n <=` [`MAX_ROWS`]: what the
/// few-row products read (the message starts with `what`).
fn check_rows(what: &str, x: &[f32], n: usize, inp: usize) {
    assert!(
        (1..=MAX_ROWS).contains(&n),
        "{what}: {n} input rows, expected 1 to {MAX_ROWS}"
    );
    assert!(inp > 0, "{what}: zero input features");
    assert!(
        n.checked_mul(inp) == Some(x.len()),
        "{what}: the input holds {} floats, expected {n} rows of {inp}",
        x.len()
    );
}

/// `x [n, inp] · w^T → [n, out]` for a quantized matrix kept packed, `1 <= n <=`
/// [`MAX_ROWS`]. 4- and 8-bit matrices in whole 32-value blocks go to [`crate::qdot`], which
/// dequantizes in registers. Other widths: each block of output features
/// dequantizes [`QUANT_ROWS`] weight rows at a time into a buffer kept per thread and multiplies
/// them as f32 rows, so row `r` of the result has the bits of [`matmul_rows`] over the matrix
/// dequantized at load, while a step reads the packed bytes (a quarter of bf16's at 4 bits).
///
/// # Panics
/// When `n` is out of range or `x` is not `n` rows of the matrix's input features.
pub fn matmul_quant(x: &[f32], n: usize, q: &QuantMatrix) -> Vec<f32> {
    let (inp, out) = (q.in_features(), q.out_features());
    check_rows("matmul_quant", x, n, inp);
    if crate::qdot::supports(q.bits(), q.group()) {
        return crate::qdot::matmul(x, n, q);
    }
    thread_local! {
        static ROWS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let (avx, avx512) = (has_avx(), has_avx512());
    let mut y = vec![0f32; n * out];
    let dst = Dst {
        ptr: y.as_mut_ptr(),
        out,
    };
    let work = |bi: usize| {
        let end = (bi * BLOCK + BLOCK).min(out);
        ROWS.with_borrow_mut(|rows| {
            let mut o = bi * BLOCK;
            while o < end {
                let m = QUANT_ROWS.min(end - o);
                rows.resize(m * inp, 0.0);
                q.dequantize_rows(o, rows);
                // SAFETY: `Unpacked` is a transparent f32.
                let unpacked = unsafe {
                    std::slice::from_raw_parts(rows.as_ptr().cast::<Unpacked>(), rows.len())
                };
                // SAFETY: block `bi` writes only its features `o..o + m` of the `n` rows of
                // `y` (through `dst` moved to feature `o`), which outlives the loop; `unpacked`
                // holds those `m` weight rows.
                unsafe { block(x, n, unpacked, inp, 0, m, dst.from(o), avx, avx512) };
                o += m;
            }
        });
    };
    let blocks = out.div_ceil(BLOCK);
    if out * inp >= 1 << 12 {
        crate::team::run(blocks, &work);
    } else {
        (0..blocks).for_each(work);
    }
    y
}

/// Weight rows [`matmul_quant`] dequantizes at a time: the four that the 512-bit path
/// multiplies per pass (a few KiB to tens of KiB, in L1 or L2).
const QUANT_ROWS: usize = 4;

/// `x [n, inp] · w[out, inp]^T → [n, out]` for `1 <= n <=` [`MAX_ROWS`]: each weight row is read
/// once for all `n` inputs (decode reads every weight once per step), parallel over blocks of
/// output features when the matrix is large. Row `r` of the result is bit-identical to
/// `matmul_rows(x[r], 1, w, inp)`, and, for half-precision weights, to the product over the
/// weights widened to f32 (see [`Weight`]).
///
/// # Panics
/// When `n` is out of range, `inp` is zero, `x` is not `n` rows of `inp` or `w` not whole rows.
pub fn matmul_rows<E: Weight>(x: &[f32], n: usize, w: &[E], inp: usize) -> Vec<f32> {
    check_rows("matmul_rows", x, n, inp);
    assert!(
        w.len().is_multiple_of(inp),
        "matmul_rows: {} weights are not whole rows of {inp}",
        w.len()
    );
    let out = w.len() / inp;
    let (avx, avx512) = (has_avx(), has_avx512());
    let mut y = vec![0f32; n * out];
    let dst = Dst {
        ptr: y.as_mut_ptr(),
        out,
    };
    let work = |bi: usize| {
        let o0 = bi * BLOCK;
        // SAFETY: block `bi` writes only its features `o0..o0 + outs` of the `n` rows of `y`,
        // which outlives the loop; `w` holds them.
        unsafe { block(x, n, w, inp, o0, BLOCK.min(out - o0), dst, avx, avx512) };
    };
    let blocks = out.div_ceil(BLOCK);
    // the worker team makes a split pay from a few microseconds of work (measured on the demo
    // model: 128-wide matrices, 1 << 16 kept most of them on one thread, 15% slower decode);
    // each block writes its own features of every row, in place
    if out * inp >= 1 << 12 {
        crate::team::run(blocks, &work);
    } else {
        (0..blocks).for_each(work);
    }
    y
}

/// [`matmul_rows`] over a matrix held in parts (`[sum of out_i, inp]` whose rows are the parts'
/// rows in turn, e.g. a fused q/k/v projection whose parts stay where they lie in a mapped
/// checkpoint): `[n, sum of out_i]`, one task per block of any part, each output feature
/// computed exactly as [`matmul_rows`] computes it on the whole matrix (a feature's arithmetic
/// does not depend on its neighbours; tested below).
///
/// # Panics
/// As [`matmul_rows`], for every part.
pub fn matmul_rows_parts<E: Weight>(x: &[f32], n: usize, parts: &[&[E]], inp: usize) -> Vec<f32> {
    check_rows("matmul_rows_parts", x, n, inp);
    assert!(
        parts.iter().all(|w| w.len().is_multiple_of(inp)),
        "matmul_rows_parts: a part's weights are not whole rows of {inp}"
    );
    let outs: Vec<usize> = parts.iter().map(|w| w.len() / inp).collect();
    let out: usize = outs.iter().sum();
    let (avx, avx512) = (has_avx(), has_avx512());
    let mut y = vec![0f32; n * out];
    // (part, first feature in the part, first feature in the result) of every block
    let mut blocks = Vec::new();
    let mut at = 0;
    for (p, &o) in outs.iter().enumerate() {
        for o0 in (0..o).step_by(BLOCK) {
            blocks.push((p, o0, at + o0));
        }
        at += o;
    }
    let dst = Dst {
        ptr: y.as_mut_ptr(),
        out,
    };
    let work = |bi: usize| {
        let (p, o0, at) = blocks[bi];
        // SAFETY: the block writes only features `at..at + outs` of the `n` rows of `y` (its
        // own, disjoint from every other block's), which outlives the loop; `parts[p]` holds
        // the block's weight rows.
        unsafe {
            let dst = dst.from(at - o0);
            block(
                x,
                n,
                parts[p],
                inp,
                o0,
                BLOCK.min(outs[p] - o0),
                dst,
                avx,
                avx512,
            )
        };
    };
    if out * inp >= 1 << 12 {
        crate::team::run(blocks.len(), &work);
    } else {
        (0..blocks.len()).for_each(work);
    }
    y
}

/// `src` widened to f32 (exact) into `out`, which holds as many values, in parallel over blocks:
/// what a product over half-precision weights that is too large for [`matmul_rows`] multiplies,
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

/// Causal attention of `l` new queries against a sequence's cached keys and values.
///
/// `q`: `[l, h, hd]`; `keys`, `values`: `[t, hkv, hd]` including the new positions, so query `i`
/// sees keys `0..=t - l + i`. Returns `[l, h, hd]`. The work is split into tasks, one per KV
/// head and tile of positions, run in parallel on the worker team when there is enough of it
/// (a decode step's KV heads run side by side). Within a task the queries that read the KV head
/// are scored against eight keys at a time, each key block brought into L1 once for all of them,
/// and the eight sums reduced together; the weighted values are summed a block of keys at a
/// time, every position of the task through each block while it is in L1 (see
/// [`VALUE_BLOCK`]). Each query's arithmetic is that of a lone query, whatever the tiling, so a
/// verify row has the bits of a single-token step. A task's scores
/// (its positions × queries per KV head × keys) stay within a budget (4 MiB), so a long prompt
/// does not hold a full score matrix.
///
/// # Panics
/// When `h`, `hkv` or `hd` is zero, `h` is not a multiple of `hkv`, `q` is not `[l, h, hd]`,
/// `keys` not whole `[hkv, hd]` positions, `values` not as long as `keys`, or fewer positions
/// are cached than there are queries.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    l: usize,
    h: usize,
    hkv: usize,
    hd: usize,
    scale: f32,
) -> Vec<f32> {
    // the queries on a cache line, like the cache's keys and values ([`Aligned`])
    let q = Aligned::copy(q);
    attention_impl(
        q.values(),
        keys,
        values,
        l,
        h,
        hkv,
        hd,
        scale,
        has_avx(),
        SCORE_BUDGET,
        VALUE_BLOCK,
    )
}

/// [`attention`] on AVX when `avx` (and detected) or the portable lanes, with tasks holding at
/// most `budget` scores and the value rows taken in blocks of `value_block` keys (even).
#[allow(clippy::too_many_arguments)]
fn attention_impl(
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    l: usize,
    h: usize,
    hkv: usize,
    hd: usize,
    scale: f32,
    avx: bool,
    budget: usize,
    value_block: usize,
) -> Vec<f32> {
    assert!(
        h > 0 && hkv > 0 && hd > 0 && h.is_multiple_of(hkv) && value_block >= 2,
        "attention: {h} heads over {hkv} KV heads of width {hd}"
    );
    let stride = elements(&[hkv, hd]).expect("attention: KV heads × width overflow");
    let t_total = keys.len() / stride;
    assert!(
        elements(&[l, h, hd]) == Some(q.len()),
        "attention: the queries hold {} floats, expected [{l}, {h}, {hd}]",
        q.len()
    );
    assert!(
        keys.len() == t_total * stride && values.len() == keys.len(),
        "attention: keys ({}) and values ({}) are not the same whole positions of [{hkv}, {hd}]",
        keys.len(),
        values.len()
    );
    assert!(
        t_total >= l,
        "attention: {t_total} cached positions for {l} queries"
    );
    let mut out = crate::scratch::zeroed(q.len());
    if l == 0 {
        return out;
    }
    let rep = h / hkv;
    let tile = (budget / rep.saturating_mul(t_total)).clamp(1, l);
    let tiles = l.div_ceil(tile);
    let job = AttentionJob {
        q,
        keys,
        values,
        l,
        h,
        hkv,
        hd,
        scale,
        tile,
        value_block: value_block & !1,
        out: out.as_mut_ptr(),
    };
    let avx = avx && has_avx();
    let wide = avx && has_avx512();
    let work = |task: usize| {
        let (kvh, ti) = (task / tiles, task % tiles);
        #[cfg(target_arch = "x86_64")]
        if wide {
            // SAFETY: AVX2, FMA and AVX-512F were detected on this CPU; as below.
            unsafe { attention_task_avx512(&job, kvh, ti) };
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if avx {
            // SAFETY: AVX was detected on this CPU; task `(kvh, ti)` writes only its own
            // heads and positions of `out`, which outlives the loop.
            unsafe { attention_task_avx(&job, kvh, ti) };
            return;
        }
        let _ = (avx, wide);
        // SAFETY: the portable lanes need no particular instruction set; as above.
        unsafe { attention_task::<Portable>(&job, kvh, ti) };
    };
    let tasks = hkv * tiles;
    // a few microseconds of work pay for a split (see `matmul_rows`)
    if tasks >= 2 && l * h * t_total * hd >= 1 << 14 {
        crate::team::run(tasks, &work);
    } else {
        (0..tasks).for_each(work);
    }
    out
}

/// Most scores one attention task holds (4 MiB of f32).
const SCORE_BUDGET: usize = 1 << 20;

/// One [`attention`] call, shared by its tasks.
struct AttentionJob<'a> {
    q: &'a [f32],
    keys: &'a [f32],
    values: &'a [f32],
    l: usize,
    h: usize,
    hkv: usize,
    hd: usize,
    scale: f32,
    /// Positions per task.
    tile: usize,
    /// Keys per block of value rows (even; see [`VALUE_BLOCK`]).
    value_block: usize,
    /// The `[l, h, hd]` result, written in place by the tasks.
    out: *mut f32,
}

// SAFETY: tasks write disjoint heads and positions of `out` (see `attention`).
unsafe impl Sync for AttentionJob<'_> {}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,avx2,fma")]
unsafe fn attention_task_avx(job: &AttentionJob<'_>, kvh: usize, tile: usize) {
    // SAFETY: this function is only called when AVX was detected; the rest is forwarded.
    unsafe { attention_task::<Avx>(job, kvh, tile) }
}

/// [`attention_task_avx`] with the score products' chunk pairs in 16-lane vectors (same bits).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,avx2,fma,avx512f")]
unsafe fn attention_task_avx512(job: &AttentionJob<'_>, kvh: usize, tile: usize) {
    // SAFETY: this function is only called when AVX-512F was detected; the rest is forwarded.
    unsafe { attention_task::<Avx512>(job, kvh, tile) }
}

/// The dot products of each of the `Q` rows `xs` with the eight rows `ks` (`len` floats each),
/// each summed exactly as [`dots`] sums one (even and odd 8-float chunks apart,
/// [`Lanes::reduce`], then the tail), one vector per row of `xs`. Two rows of `xs` share each
/// load of the keys (with [`Lanes::WIDE`]: eight pair accumulators of the 32 registers); every
/// product keeps its own chain, so the bits do not depend on `Q`. (Loops, not closures: a
/// closure is not compiled for the caller's instruction set.)
///
/// # Safety
/// Every row of `xs` and `ks` reads `len` floats; the CPU supports `L`.
#[inline(always)]
unsafe fn dots8<L: Lanes, const Q: usize>(
    xs: [*const f32; Q],
    ks: [*const f32; 8],
    len: usize,
) -> [L::V; Q] {
    let chunks = len / 8;
    // SAFETY (all reads): `c * 8 + 8 <= len` and `i < len`.
    unsafe {
        let mut v = [[L::zero(); 8]; Q];
        for half in 0..2 {
            let mut k = [ks[0]; 4];
            for m in 0..4 {
                k[m] = ks[half * 4 + m];
            }
            // `[even | odd]` chunk pairs: one 16-lane multiply-add for both where the CPU has
            // them (`Lanes::W`), each lane's chain as with two 8-lane ones
            let mut pair = [[L::zero2(); 4]; Q];
            let mut c = 0;
            while c + 2 <= chunks {
                let mut x = [L::zero2(); Q];
                for i in 0..Q {
                    x[i] = L::load2(xs[i].add(c * 8));
                }
                for m in 0..4 {
                    let km = L::load2(k[m].add(c * 8));
                    for i in 0..Q {
                        pair[i][m] = L::mul_add2(pair[i][m], x[i], km);
                    }
                }
                c += 2;
            }
            for i in 0..Q {
                for m in 0..4 {
                    let (mut even, odd) = L::halves(pair[i][m]);
                    if c < chunks {
                        even =
                            L::mul_add(even, L::load(xs[i].add(c * 8)), L::load(k[m].add(c * 8)));
                    }
                    v[i][half * 4 + m] = L::add(even, odd);
                }
            }
        }
        let mut out = [L::zero(); Q];
        for i in 0..Q {
            let mut tails = [0f32; 8];
            for (m, tail) in tails.iter_mut().enumerate() {
                for j in chunks * 8..len {
                    *tail += *xs[i].add(j) * *ks[m].add(j);
                }
            }
            out[i] = L::add(L::reduce8(v[i]), L::load(tails.as_ptr()));
        }
        out
    }
}

/// Turns scores into unnormalised softmax weights in place; returns `1 / sum`. Max and sum run
/// over 8 lanes in a fixed order, so the result depends only on the row; the exponentials are
/// one flat pass (vectorized where the caller's instruction set allows).
#[inline(always)]
fn softmax_weights(s: &mut [f32]) -> f32 {
    let mut m = [f32::NEG_INFINITY; 8];
    let mut chunks = s.chunks_exact(8);
    for c in &mut chunks {
        for j in 0..8 {
            m[j] = m[j].max(c[j]);
        }
    }
    let max = chunks.remainder().iter().fold(
        m.iter().copied().fold(f32::NEG_INFINITY, f32::max),
        |a, b| a.max(*b),
    );
    for v in s.iter_mut() {
        *v = crate::kernels::exp(*v - max);
    }
    let mut acc = [0f32; 8];
    let mut chunks = s.chunks_exact(8);
    for c in &mut chunks {
        for j in 0..8 {
            acc[j] += c[j];
        }
    }
    let tail = chunks.remainder().iter().fold(0f32, |a, v| a + v);
    let sum =
        ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail;
    1.0 / sum
}

/// `out[q][c] = inv[q] * Σ_t w_q[t] v[t][c]` for `N` queries reading the same `visible` value
/// rows (`v[t]` at `values + t * stride`, `hd` wide), the keys `span` of it: from zero when the
/// span starts at 0, else going on from the partial sums in `part`; written to `outs` when the
/// span ends at `visible`, else back to `part`. Even and odd `t` accumulate apart and are added
/// at the end: a fixed order per query and channel, whatever `N`, however the channels are
/// grouped into passes (eight accumulators each: four 8-channel chunks for one query, two for
/// two, one for four; sixteen with [`Lanes::WIDE`]: eight 16-channel chunks for one query, four
/// for two, two for four) and however the keys are split into spans (each starting on an even
/// key; see [`VALUE_BLOCK`]).
///
/// # Safety
/// `ws[q]` reads `visible` floats, `outs[q]` writes `hd`, `values` reads `visible` rows, `part`
/// holds `2 N hd` floats unless the span is all the keys; `span.start` is even and `span`
/// inside `0..visible`; the CPU supports `L`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn weighted_values<L: Lanes, const N: usize>(
    ws: [*const f32; N],
    inv: [f32; N],
    values: *const f32,
    stride: usize,
    span: std::ops::Range<usize>,
    visible: usize,
    hd: usize,
    part: *mut f32,
    outs: [*mut f32; N],
) {
    // SAFETY (all accesses): within the bounds the caller guarantees.
    unsafe {
        let mut c = 0;
        // passes of `G` chunks of `$chunk` while `G` of them are left
        macro_rules! passes {
            ($chunk:ty, $g:literal) => {
                while c + <$chunk as Chunk<L>>::WIDTH * $g <= hd {
                    values_pass::<L, $chunk, N, $g>(
                        ws,
                        inv,
                        values,
                        stride,
                        span.clone(),
                        visible,
                        c,
                        hd,
                        part,
                        outs,
                    );
                    c += <$chunk as Chunk<L>>::WIDTH * $g;
                }
            };
        }
        // sixteen accumulators: in 16-channel registers where the CPU has 32 of them, else
        // in 8-channel ones
        if L::WIDE {
            match N {
                1 => passes!(Wide, 8),
                2 => passes!(Wide, 4),
                _ => passes!(Wide, 2),
            }
            passes!(Wide, 1);
        } else {
            match N {
                1 => passes!(Narrow, 4),
                2 => passes!(Narrow, 2),
                _ => {}
            }
        }
        passes!(Narrow, 1);
        for q in 0..N {
            for cc in c..hd {
                // (only read and written when the span is not all the keys, and so `part` is
                // allocated)
                let (pe, po) = (
                    part.wrapping_add(q * hd + cc),
                    part.wrapping_add((N + q) * hd + cc),
                );
                let (mut even, mut odd) = if span.start > 0 {
                    (*pe, *po)
                } else {
                    (0f32, 0f32)
                };
                let mut t = span.start;
                while t + 2 <= span.end {
                    even += *ws[q].add(t) * *values.add(t * stride + cc);
                    odd += *ws[q].add(t + 1) * *values.add((t + 1) * stride + cc);
                    t += 2;
                }
                if t < span.end {
                    even += *ws[q].add(t) * *values.add(t * stride + cc);
                }
                if span.end == visible {
                    *outs[q].add(cc) = (even + odd) * inv[q];
                } else {
                    (*pe, *po) = (even, odd);
                }
            }
        }
    }
}

/// Value rows per block of [`attention`]'s weighted sums (even, so that each block starts on an
/// even key and the even and odd chains stay the same): a task takes the keys a block at a
/// time, and every position of its tile sums its weights of the block's rows while they are in
/// L1 (16 KiB at 128 channels), carrying its partial sums from block to block; position by
/// position, a long prompt's value rows came from L3 again for every position (each byte
/// used by four multiply-adds per head group).
const VALUE_BLOCK: usize = 32;

/// The vectors a [`values_pass`] accumulates in: 8 channels ([`Narrow`], `L::V`) or 16
/// ([`Wide`], `L::W`: one register where [`Lanes::WIDE`], twice the channels per multiply-add
/// and per broadcast weight). Each lane is one channel's chain either way, so the bits do not
/// depend on which.
trait Chunk<L: Lanes> {
    type T: Copy;
    /// Channels per vector.
    const WIDTH: usize;
    /// # Safety
    /// The CPU supports `L`.
    unsafe fn zero() -> Self::T;
    /// # Safety
    /// `p` reads [`Chunk::WIDTH`] floats; the CPU supports `L`.
    unsafe fn load(p: *const f32) -> Self::T;
    /// # Safety
    /// The CPU supports `L`.
    unsafe fn splat(x: f32) -> Self::T;
    /// `acc + a * b` per lane, as [`Lanes::mul_add`].
    ///
    /// # Safety
    /// The CPU supports `L`.
    unsafe fn mul_add(acc: Self::T, a: Self::T, b: Self::T) -> Self::T;
    /// # Safety
    /// `p` writes [`Chunk::WIDTH`] floats; the CPU supports `L`.
    unsafe fn store(p: *mut f32, v: Self::T);
    /// `p[j] = (even[j] + odd[j]) * s`.
    ///
    /// # Safety
    /// As [`Chunk::store`].
    unsafe fn store_sum_scaled(p: *mut f32, even: Self::T, odd: Self::T, s: f32);
}

/// 8-channel [`Chunk`]s.
struct Narrow;

impl<L: Lanes> Chunk<L> for Narrow {
    type T = L::V;
    const WIDTH: usize = 8;
    #[inline(always)]
    unsafe fn zero() -> L::V {
        // SAFETY (all five): forwarded from the caller.
        unsafe { L::zero() }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> L::V {
        unsafe { L::load(p) }
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> L::V {
        unsafe { L::splat(x) }
    }
    #[inline(always)]
    unsafe fn mul_add(acc: L::V, a: L::V, b: L::V) -> L::V {
        unsafe { L::mul_add(acc, a, b) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: L::V) {
        unsafe { L::store(p, v) }
    }
    #[inline(always)]
    unsafe fn store_sum_scaled(p: *mut f32, even: L::V, odd: L::V, s: f32) {
        // SAFETY: forwarded from the caller.
        unsafe { L::store(p, L::mul(L::add(even, odd), L::splat(s))) }
    }
}

/// 16-channel [`Chunk`]s (two 8-channel ones, `[low | high]`).
struct Wide;

impl<L: Lanes> Chunk<L> for Wide {
    type T = L::W;
    const WIDTH: usize = 16;
    #[inline(always)]
    unsafe fn zero() -> L::W {
        // SAFETY (all four): forwarded from the caller.
        unsafe { L::zero2() }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> L::W {
        unsafe { L::load2(p) }
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> L::W {
        unsafe { L::splat2(x) }
    }
    #[inline(always)]
    unsafe fn mul_add(acc: L::W, a: L::W, b: L::W) -> L::W {
        unsafe { L::mul_add2(acc, a, b) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: L::W) {
        // SAFETY: forwarded from the caller (16 floats).
        unsafe {
            let (lo, hi) = L::halves(v);
            L::store(p, lo);
            L::store(p.add(8), hi);
        }
    }
    #[inline(always)]
    unsafe fn store_sum_scaled(p: *mut f32, even: L::W, odd: L::W, s: f32) {
        // SAFETY: forwarded from the caller (16 floats).
        unsafe {
            let ((e0, e1), (o0, o1)) = (L::halves(even), L::halves(odd));
            <Narrow as Chunk<L>>::store_sum_scaled(p, e0, o0, s);
            <Narrow as Chunk<L>>::store_sum_scaled(p.add(8), e1, o1, s);
        }
    }
}

/// Channels `c..c + C::WIDTH * G` of [`weighted_values`] over keys `span`: from zero when the
/// span starts at 0, else going on from the partial sums in `part` (even chains at `q · hd`,
/// odd ones at `(N + q) · hd`); the results go to `outs` when the span ends at `visible`, else
/// the partial sums back to `part`.
///
/// # Safety
/// As [`weighted_values`], with `c + C::WIDTH * G <= hd`, `span` inside `0..visible`, and
/// `part` holding `2 N hd` floats unless the span is all the keys.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn values_pass<L: Lanes, C: Chunk<L>, const N: usize, const G: usize>(
    ws: [*const f32; N],
    inv: [f32; N],
    values: *const f32,
    stride: usize,
    span: std::ops::Range<usize>,
    visible: usize,
    c: usize,
    hd: usize,
    part: *mut f32,
    outs: [*mut f32; N],
) {
    let width = C::WIDTH;
    // SAFETY (all accesses): within the bounds the caller guarantees.
    unsafe {
        let mut even = [[C::zero(); G]; N];
        let mut odd = [[C::zero(); G]; N];
        if span.start > 0 {
            for q in 0..N {
                for g in 0..G {
                    even[q][g] = C::load(part.add(q * hd + c + g * width));
                    odd[q][g] = C::load(part.add((N + q) * hd + c + g * width));
                }
            }
        }
        let mut t = span.start;
        while t + 2 <= span.end {
            let (r0, r1) = (values.add(t * stride + c), values.add((t + 1) * stride + c));
            for q in 0..N {
                let (w0, w1) = (C::splat(*ws[q].add(t)), C::splat(*ws[q].add(t + 1)));
                for g in 0..G {
                    even[q][g] = C::mul_add(even[q][g], w0, C::load(r0.add(g * width)));
                    odd[q][g] = C::mul_add(odd[q][g], w1, C::load(r1.add(g * width)));
                }
            }
            t += 2;
        }
        if t < span.end {
            let r0 = values.add(t * stride + c);
            for q in 0..N {
                let w0 = C::splat(*ws[q].add(t));
                for (g, e) in even[q].iter_mut().enumerate() {
                    *e = C::mul_add(*e, w0, C::load(r0.add(g * width)));
                }
            }
        }
        for q in 0..N {
            for g in 0..G {
                let at = c + g * width;
                if span.end == visible {
                    C::store_sum_scaled(outs[q].add(at), even[q][g], odd[q][g], inv[q]);
                } else {
                    C::store(part.add(q * hd + at), even[q][g]);
                    C::store(part.add((N + q) * hd + at), odd[q][g]);
                }
            }
        }
    }
}

/// Task `(kvh, tile)` of [`attention`]: the heads of KV head `kvh` at the positions of `tile`.
///
/// # Safety
/// The CPU supports `L`; no other task writes the same heads and positions of `job.out`.
#[inline(always)]
unsafe fn attention_task<L: Lanes>(job: &AttentionJob<'_>, kvh: usize, tile: usize) {
    thread_local! {
        static SCORES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
        static PARTS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let (l, h, hkv, hd) = (job.l, job.h, job.hkv, job.hd);
    let t_total = job.keys.len() / (hkv * hd);
    let rep = h / hkv;
    // Keys before `shared` are visible to every query; key `shared + i` only to positions > i.
    let shared = t_total - l + 1;
    let stride = hkv * hd;
    let i0 = tile * job.tile;
    let i1 = (i0 + job.tile).min(l);
    // the keys the tile's last position sees (earlier positions' extra scores go unread)
    let seen = shared + i1 - 1;
    // query j = (position i0 + j / rep, head r = j % rep of the group)
    let nq = (i1 - i0) * rep;
    let qp = |j: usize| {
        let head = kvh * rep + j % rep;
        job.q[((i0 + j / rep) * h + head) * hd..].as_ptr()
    };
    let key = |t: usize| job.keys[(t * hkv + kvh) * hd..].as_ptr();
    // (taken out of the thread's buffer and put back: code in a closure would not be compiled
    // for `L`'s instruction set)
    let mut scores = SCORES.with_borrow_mut(std::mem::take);
    {
        // scores[j * seen + t]
        scores.resize(
            nq.checked_mul(seen)
                .expect("attention: too many scores for one task"),
            0.0,
        );
        let sp = scores.as_mut_ptr();
        // SAFETY: every query and key row holds `hd` floats and `t + 8 <= seen` (or `t <
        // seen`) keys exist; `sp` holds `nq * seen` floats; the caller guarantees `L`.
        unsafe {
            let mut t = 0;
            while t + 8 <= seen {
                let ks = std::array::from_fn(|m| key(t + m));
                let mut j = 0;
                // two queries share each key load where the registers allow it
                while L::WIDE && j + 2 <= nq {
                    let [s0, s1] = dots8::<L, 2>([qp(j), qp(j + 1)], ks, hd);
                    L::store(sp.add(j * seen + t), L::mul(s0, L::splat(job.scale)));
                    L::store(sp.add((j + 1) * seen + t), L::mul(s1, L::splat(job.scale)));
                    j += 2;
                }
                while j < nq {
                    let [s] = dots8::<L, 1>([qp(j)], ks, hd);
                    L::store(sp.add(j * seen + t), L::mul(s, L::splat(job.scale)));
                    j += 1;
                }
                t += 8;
            }
            while t < seen {
                for j in 0..nq {
                    let [[v]] = dots::<L, f32, 1, 1>([qp(j)], [key(t)], hd);
                    *sp.add(j * seen + t) = v * job.scale;
                }
                t += 1;
            }
        }
        let mut inv = vec![0f32; nq];
        for i in i0..i1 {
            let visible = shared + i;
            for r in 0..rep {
                let j = (i - i0) * rep + r;
                inv[j] = softmax_weights(&mut scores[j * seen..j * seen + visible]);
            }
        }
        // each query's partial sums between blocks: even chains, then odd ones, per head group
        let mut part = PARTS.with_borrow_mut(std::mem::take);
        let block = job.value_block;
        if seen > block {
            part.resize(nq * 2 * hd, 0.0);
        }
        let vals = job.values[kvh * hd..].as_ptr();
        let (sp, pp) = (scores.as_ptr(), part.as_mut_ptr());
        let mut t0 = 0;
        while t0 < seen {
            let t1 = t0.saturating_add(block).min(seen);
            for i in i0..i1 {
                let visible = shared + i;
                if visible <= t0 {
                    continue;
                }
                let span = t0..t1.min(visible);
                let row = (i - i0) * rep;
                // SAFETY (both): `(row + r) * seen + seen <= nq * seen`, the scores' length;
                // `(i * h + head) * hd + hd <= l * h * hd`, the result's.
                let w = |r: usize| unsafe { sp.add((row + r) * seen) };
                let o = |r: usize| unsafe { job.out.add((i * h + kvh * rep + r) * hd) };
                // inside the partial sums (`nq * 2 * hd`) when a span is not all the keys, and
                // not read otherwise
                let p = |r: usize| pp.wrapping_add((row + r) * 2 * hd);
                // the heads of this position, four, two or one at a time
                let mut r = 0;
                // SAFETY: each weight row holds `visible` floats, each output `hd`, each group's
                // partial sums `2 N hd` where used, and `values` `visible` rows of `stride`;
                // spans start on even keys (`block` is even); the caller guarantees `L` and
                // that no other task writes these outputs.
                unsafe {
                    while r + 4 <= rep {
                        weighted_values::<L, 4>(
                            [w(r), w(r + 1), w(r + 2), w(r + 3)],
                            [
                                inv[row + r],
                                inv[row + r + 1],
                                inv[row + r + 2],
                                inv[row + r + 3],
                            ],
                            vals,
                            stride,
                            span.clone(),
                            visible,
                            hd,
                            p(r),
                            [o(r), o(r + 1), o(r + 2), o(r + 3)],
                        );
                        r += 4;
                    }
                    if r + 2 <= rep {
                        weighted_values::<L, 2>(
                            [w(r), w(r + 1)],
                            [inv[row + r], inv[row + r + 1]],
                            vals,
                            stride,
                            span.clone(),
                            visible,
                            hd,
                            p(r),
                            [o(r), o(r + 1)],
                        );
                        r += 2;
                    }
                    if r < rep {
                        weighted_values::<L, 1>(
                            [w(r)],
                            [inv[row + r]],
                            vals,
                            stride,
                            span,
                            visible,
                            hd,
                            p(r),
                            [o(r)],
                        );
                    }
                }
            }
            t0 = t1;
        }
        PARTS.with_borrow_mut(|p| *p = part);
    }
    SCORES.with_borrow_mut(|s| *s = scores);
}

/// The gated delta rule, step form, for one sequence over `s` steps (Gated DeltaNet's
/// recurrence; see `kernels::DeltaDims` for the shapes): advances `state` by the steps and
/// returns their outputs `[s, hv, dv]`. See [`gated_delta`].
#[cfg(test)]
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_steps(
    d: crate::kernels::DeltaDims,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    state: &mut [f32],
) -> Vec<f32> {
    gated_delta(d, q, k, v, g, beta, state, 0, true, &mut [])
}

/// Runs `s` steps of the gated delta rule over `state`: the first `settle` are written into
/// the state and give no output (steps that an earlier verify forward kept), the others
/// return their outputs `[s - settle, hv, dv]` and are written into the state only when
/// `advance` (a verify forward leaves its own steps for the next call to settle, or advances
/// and keeps a copy). A non-empty `backup` (`state.len()` floats) receives the state as it is
/// after the settled steps, before the others.
///
/// `q`, `k`: `[s, hk, dk]` (already normalised and scaled); `v`: `[s, hv, dv]`; `g`, `beta`:
/// `[s, hv]`; `state`: `[hv, dv, dk]`. Per value head and state row `S_r`: `S_r = g S_r;
/// d = beta (v_r - S_r · k); S_r += d k; y_r = S_r · q`, the dot products over 8 lanes as
/// everywhere in this module.
///
/// Each state row (one value feature of one head, `dk` floats) evolves on its own, so the
/// steps run innermost over rows held in L1, in blocks of `DELTA_STEPS` steps (a block's `q`
/// and `k` stay in L1 across the head's rows): a call reads and writes the state once per
/// block (once for a decode step or a verify), and settling costs no pass of its own. A step's arithmetic does not
/// depend on how many steps run together, so outputs and state are bit-identical to one call
/// per step. Unless the call is tiny, the heads are split over the worker team.
///
/// # Panics
/// When a dimension is zero, `hv` is not a multiple of `hk`, an input or the state does not
/// have the shape above for `s = g.len() / hv` steps, `settle > s`, or a non-empty `backup` is
/// not as long as the state.
#[allow(clippy::too_many_arguments)]
pub fn gated_delta(
    d: crate::kernels::DeltaDims,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    state: &mut [f32],
    settle: usize,
    advance: bool,
    backup: &mut [f32],
) -> Vec<f32> {
    let crate::kernels::DeltaDims { hk, hv, dk, dv } = d;
    assert!(
        hk > 0 && hv > 0 && dk > 0 && dv > 0 && hv.is_multiple_of(hk),
        "gated_delta: {hk} key heads, {hv} value heads, widths {dk} and {dv}"
    );
    let s = g.len() / hv;
    let sized = |what: &str, len: usize, dims: &[usize]| {
        assert!(
            elements(dims) == Some(len),
            "gated_delta: {what} holds {len} floats, expected {dims:?}"
        )
    };
    sized("g", g.len(), &[s, hv]);
    sized("beta", beta.len(), &[s, hv]);
    sized("q", q.len(), &[s, hk, dk]);
    sized("k", k.len(), &[s, hk, dk]);
    sized("v", v.len(), &[s, hv, dv]);
    sized("the state", state.len(), &[hv, dv, dk]);
    assert!(settle <= s, "gated_delta: {settle} steps to settle of {s}");
    assert!(
        backup.is_empty() || backup.len() == state.len(),
        "gated_delta: a backup of {} floats for a state of {}",
        backup.len(),
        state.len()
    );
    let head = dv * dk;
    let inp = DeltaIn {
        d,
        q,
        k,
        v,
        g,
        beta,
        settle,
        advance,
    };
    let avx = has_avx();
    // one value head: its state rows `[dv, dk]`, its outputs `[s - settle, dv]` and its part
    // of the backup (`[dv, dk]` or empty)
    let run = |h: usize, st: &mut [f32], y: &mut [f32], b: &mut [f32]| {
        #[cfg(target_arch = "x86_64")]
        if avx {
            // SAFETY: AVX2 and FMA were detected on this CPU.
            unsafe { delta_head_avx(inp, h, st, y, b) };
            return;
        }
        let _ = avx;
        // SAFETY: the portable lanes need no particular instruction set.
        unsafe { delta_head::<Portable>(inp, h, st, y, b) };
    };
    let out = s - settle;
    // per head `[hv, out, dv]`, reordered to `[out, hv, dv]` at the end
    let mut yh = crate::scratch::zeroed(d.hv * out * d.dv);
    let per_y = out * d.dv;
    // split by head unless the whole call is a few microseconds of work (even the bundled
    // demo model's 64 KiB state gains from it, measured)
    let per_b = if backup.is_empty() { 0 } else { head };
    if d.hv > 1 && state.len() * s >= 1 << 13 {
        crate::team::chunks_mut3(d.hv, state, head, &mut yh, per_y, backup, per_b, run);
    } else {
        for (h, st) in state.chunks_mut(head).enumerate() {
            let b = &mut backup[h * per_b..(h + 1) * per_b];
            run(h, st, &mut yh[h * per_y..(h + 1) * per_y], b);
        }
    }
    // every element is copied in below
    let mut y = crate::scratch::overwritten(out * d.hv * d.dv);
    for h in 0..d.hv {
        for t in 0..out {
            y[(t * d.hv + h) * d.dv..(t * d.hv + h + 1) * d.dv]
                .copy_from_slice(&yh[(h * out + t) * d.dv..(h * out + t + 1) * d.dv]);
        }
    }
    crate::scratch::recycle(yh);
    y
}

/// The inputs of a delta-rule call, shared by its per-head tasks.
#[derive(Clone, Copy)]
struct DeltaIn<'a> {
    d: crate::kernels::DeltaDims,
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    g: &'a [f32],
    beta: &'a [f32],
    settle: usize,
    advance: bool,
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,avx2,fma")]
unsafe fn delta_head_avx(
    inp: DeltaIn<'_>,
    h: usize,
    st: &mut [f32],
    y: &mut [f32],
    backup: &mut [f32],
) {
    // SAFETY: this function is only called when the instruction sets were detected.
    unsafe { delta_head::<Avx>(inp, h, st, y, backup) }
}

/// State rows of one head that [`delta_head`] runs side by side: each row's steps are two
/// chains of dependent multiply-adds and a reduction, so one row at a time waits on latency;
/// four rows give the core four independent chains (measured on the demo model: the delta
/// rule ~3x faster). Every row keeps its own arithmetic, so the bits do not change.
const DELTA_ROWS: usize = 4;

/// Steps run together over each group of state rows before the next group takes them (a block
/// of steps). The steps' `q` and `k` (`2 · dk` floats per step, 4 KiB apart from one step to the
/// next in `[s, hk, dk]`) stay in L1 while every group of the head runs them; one group running
/// all of a long prompt's steps in turn read 1 MB of `q` and `k` per group from L3 (the delta
/// rule was ~9% of a 1006-token prefill, most of it waiting on those loads). A row's steps are
/// the same in any blocking, so are its bits.
const DELTA_STEPS: usize = 16;

/// Runs the steps of value head `h` over its state rows `st` (`[dv, dk]`), writing its
/// outputs `y` (`[s - settle, dv]`); steps after `settle` run on a copy of each row unless
/// `advance`. A non-empty `backup` (`[dv, dk]`) receives each row as it is before them.
///
/// # Safety
/// The CPU supports `L`.
#[inline(always)]
unsafe fn delta_head<L: Lanes>(
    inp: DeltaIn<'_>,
    h: usize,
    st: &mut [f32],
    y: &mut [f32],
    backup: &mut [f32],
) {
    let s = inp.g.len() / inp.d.hv;
    // the rows' copies for the steps after `settle` when they must not advance the state: one
    // group's, reused, when the steps are one block (decode, verify), else every row's
    let one_block = s <= DELTA_STEPS;
    let dk = inp.d.dk;
    let copies = if one_block { DELTA_ROWS * dk } else { st.len() };
    let mut scratch = vec![0f32; if inp.advance { 0 } else { copies }];
    // row `i`'s place in the backup, when there is one
    let backup = (!backup.is_empty()).then_some(backup.as_mut_ptr());
    let whole = st.len() / (DELTA_ROWS * dk) * DELTA_ROWS;
    let mut t0 = 0;
    loop {
        let t1 = (t0 + DELTA_STEPS).min(s);
        let mut i = 0;
        while i < st.len() / dk {
            let r = if i < whole { DELTA_ROWS } else { 1 };
            let rows = &mut st[i * dk..(i + r) * dk];
            let copy: &mut [f32] = if inp.advance {
                &mut []
            } else {
                let at = if one_block { 0 } else { i * dk };
                &mut scratch[at..at + r * dk]
            };
            let b = backup.map(|b| b.wrapping_add(i * dk));
            // SAFETY: forwarded from the caller; `b` has room for these rows.
            unsafe {
                if r == DELTA_ROWS {
                    delta_rows::<L, DELTA_ROWS>(inp, h, rows, i, y, copy, b, t0..t1);
                } else {
                    delta_rows::<L, 1>(inp, h, rows, i, y, copy, b, t0..t1);
                }
            }
            i += r;
        }
        if t1 == s {
            break;
        }
        t0 = t1;
    }
}

/// Steps `steps` of head `h` over its `R` state rows `rows` (`[R, dk]`, rows `i0..i0 + R` of
/// the head), interleaved row by row within each pass. `scratch` (`R * dk` floats, or empty
/// when `advance`) holds the rows' copies on which the steps from `settle` on run when they
/// must not advance the state: they are taken at step `settle`, and later blocks of steps
/// continue on them. `backup`, when given, receives the rows as they are before step `settle`
/// (or after the last step, when `settle` is the number of steps).
///
/// # Safety
/// The CPU supports `L`; `backup` points at `R * dk` writable floats apart from `rows`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn delta_rows<L: Lanes, const R: usize>(
    inp: DeltaIn<'_>,
    h: usize,
    rows: &mut [f32],
    i0: usize,
    y: &mut [f32],
    scratch: &mut [f32],
    backup: Option<*mut f32>,
    steps: std::ops::Range<usize>,
) {
    let DeltaIn {
        d,
        q,
        k,
        v,
        g,
        beta,
        settle,
        advance,
    } = inp;
    let s = g.len() / d.hv;
    let hk = h / (d.hv / d.hk);
    let dk = d.dk;
    let chunks = dk / 8;
    debug_assert!(rows.len() == R * dk);
    let base = rows.as_mut_ptr();
    // the rows the steps run on: the state's, or from `settle` on their copies
    let on_copy = !advance && steps.start > settle;
    debug_assert!(advance || scratch.len() == R * dk);
    let at = if on_copy { scratch.as_mut_ptr() } else { base };
    // SAFETY: row `r < R` starts `r * dk` floats into `rows` (and into `scratch`).
    let mut rp: [*mut f32; R] = std::array::from_fn(|r| unsafe { at.add(r * dk) });
    for t in steps.clone() {
        if let (true, Some(b)) = (t == settle, backup) {
            // SAFETY: the caller gives room for `R * dk` floats apart from `rows`.
            unsafe { std::ptr::copy_nonoverlapping(base, b, R * dk) };
        }
        if t == settle && !advance {
            // SAFETY: `rows` and `scratch` are distinct and hold `R * dk` floats.
            unsafe { std::ptr::copy_nonoverlapping(base, scratch.as_mut_ptr(), R * dk) };
            let copy = scratch.as_mut_ptr();
            // SAFETY: as above.
            rp = std::array::from_fn(|r| unsafe { copy.add(r * dk) });
        }
        let qh = &q[(t * d.hk + hk) * dk..(t * d.hk + hk + 1) * dk];
        let kh = &k[(t * d.hk + hk) * dk..(t * d.hk + hk + 1) * dk];
        let vs = &v[(t * d.hv + h) * d.dv + i0..(t * d.hv + h) * d.dv + i0 + R];
        let gt = g[t * d.hv + h];
        let bt = beta[t * d.hv + h];
        // Per row `S_r`: `S_r = g S_r; d = beta (v_r - S_r · k); S_r += d k; y_r = S_r · q`.
        // SAFETY: `c * 8 + 8 <= dk` for every chunk; each `rp[r]` (a row or its copy), `kh`
        // and `qh` hold `dk` floats; the caller guarantees `L`.
        unsafe {
            let gv = L::splat(gt);
            let mut acc = [L::zero(); R];
            for c in 0..chunks {
                let kc = L::load(kh.as_ptr().add(c * 8));
                for r in 0..R {
                    // `g S_r` is computed again (the same bits) by the second pass, which
                    // stores it: one store per chunk instead of two
                    let sv = L::mul(L::load(rp[r].add(c * 8)), gv);
                    acc[r] = L::mul_add(acc[r], sv, kc);
                }
            }
            let mut delta = [0f32; R];
            for r in 0..R {
                let mut kv = 0f32;
                for (j, kj) in kh.iter().enumerate().skip(chunks * 8) {
                    *rp[r].add(j) *= gt;
                    kv = madd::<L>(*rp[r].add(j), *kj, kv);
                }
                let kv = L::reduce(acc[r]) + kv;
                delta[r] = (vs[r] - kv) * bt;
            }
            let dv: [L::V; R] = std::array::from_fn(|r| L::splat(delta[r]));
            let mut acc = [L::zero(); R];
            for c in 0..chunks {
                let kc = L::load(kh.as_ptr().add(c * 8));
                let qc = L::load(qh.as_ptr().add(c * 8));
                for r in 0..R {
                    let sv = L::mul_add(L::mul(L::load(rp[r].add(c * 8)), gv), kc, dv[r]);
                    L::store(rp[r].add(c * 8), sv);
                    acc[r] = L::mul_add(acc[r], sv, qc);
                }
            }
            for r in 0..R {
                let mut yq = 0f32;
                for (j, (kj, qj)) in kh.iter().zip(qh).enumerate().skip(chunks * 8) {
                    *rp[r].add(j) = madd::<L>(*kj, delta[r], *rp[r].add(j));
                    yq = madd::<L>(*rp[r].add(j), *qj, yq);
                }
                if t >= settle {
                    y[(t - settle) * d.dv + i0 + r] = L::reduce(acc[r]) + yq;
                }
            }
        }
    }
    if let (true, true, Some(b)) = (settle == s, steps.end == s, backup) {
        // SAFETY: as above (no step came after the settled ones).
        unsafe { std::ptr::copy_nonoverlapping(base, b, R * dk) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testing::rng;

    /// An aligned copy starts on a line boundary and holds the values, for every length and
    /// every offset of the source.
    #[test]
    fn aligned_copies_start_on_a_line() {
        let src: Vec<f32> = (0..100).map(|i| i as f32 * 0.5 - 7.0).collect();
        for at in 0..17 {
            for len in [0, 1, 15, 16, 17, 64, 83 - at] {
                let x = &src[at..at + len];
                let a = Aligned::copy(x);
                assert_eq!(a.values().as_ptr() as usize % 64, 0, "{at} {len}");
                assert_eq!(a.values(), x, "{at} {len}");
                let r = Aligned::filled(len, |out| out.iter_mut().for_each(|v| *v += 2.0));
                assert_eq!(r.values().as_ptr() as usize % 64, 0, "{at} {len}");
                assert!(r.values().iter().all(|&v| v == 2.0), "{at} {len}");
            }
        }
    }

    /// A growing buffer stays aligned and holds what was appended, through truncations and
    /// clones (the attention cache's life: a prompt, steps, rolled-back verifies, snapshots).
    #[test]
    fn aligned_buffers_grow_like_vecs() {
        let mut a = Aligned::default();
        let mut want: Vec<f32> = Vec::new();
        assert!(a.is_empty() && a.values().is_empty());
        let mut next = rng(5);
        for round in 0..200usize {
            let add: Vec<f32> = (0..(round * 7) % 37).map(|_| next()).collect();
            a.extend_from_slice(&add);
            want.extend_from_slice(&add);
            if round % 5 == 4 {
                let keep = want.len() * 2 / 3;
                a.truncate(keep);
                want.truncate(keep);
            }
            assert_eq!(a.len(), want.len());
            assert_eq!(a.values(), &want[..], "round {round}");
            let c = a.clone();
            assert_eq!(c.values(), &want[..]);
            // (an empty buffer's address is never read)
            if !want.is_empty() {
                assert_eq!(a.values().as_ptr() as usize % 64, 0, "round {round}");
                assert_eq!(c.values().as_ptr() as usize % 64, 0);
            }
        }
        a.truncate(usize::MAX);
        assert_eq!(a.len(), want.len());
    }

    /// A matrix held in parts gives every feature the bits of the whole matrix, at every row
    /// count, for part sizes on and off the block and lane boundaries and odd widths.
    #[test]
    fn row_groups_hold_at_most_max_rows_and_a_long_sequence_alone() {
        assert_eq!(row_groups(&[]), Vec::<std::ops::Range<usize>>::new());
        assert_eq!(row_groups(&[4; 8]), vec![0..8]);
        assert_eq!(row_groups(&[4; 9]), vec![0..8, 8..9]);
        assert_eq!(row_groups(&[1, 40, 1, 31, 2]), vec![0..1, 1..2, 2..4, 4..5]);
        assert_eq!(row_groups(&[32, 1]), vec![0..1, 1..2]);
    }

    #[test]
    fn parts_match_the_whole_matrix() {
        let mut r = rng(11);
        for inp in [16usize, 67, 128] {
            for sizes in [
                vec![37usize, 53],
                vec![1, 8, 3],
                vec![64, 64],
                vec![7, 300, 5],
            ] {
                let total: usize = sizes.iter().sum();
                let w: Vec<half::bf16> = (0..total * inp)
                    .map(|_| half::bf16::from_f32(r()))
                    .collect();
                let mut parts = Vec::new();
                let mut at = 0;
                for s in &sizes {
                    parts.push(&w[at * inp..(at + s) * inp]);
                    at += s;
                }
                for n in 1..=MAX_ROWS {
                    let x: Vec<f32> = (0..n * inp).map(|_| r()).collect();
                    let whole = matmul_rows(&x, n, &w, inp);
                    let split = matmul_rows_parts(&x, n, &parts, inp);
                    let same = whole
                        .iter()
                        .zip(&split)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(
                        same && whole.len() == split.len(),
                        "inp {inp} {sizes:?} n {n}"
                    );
                }
            }
        }
    }

    /// Whether the path `matmul_rows` and friends take here fuses its multiply-adds.
    fn detected_fused() -> bool {
        has_avx() || Portable::FUSED
    }

    /// The reference arithmetic of one dot product, written out.
    fn lone(a: &[f32], b: &[f32], fused: bool) -> f32 {
        let chunks = a.len() / 8;
        let (mut even, mut odd) = ([0f32; 8], [0f32; 8]);
        for c in 0..chunks {
            let acc = if c % 2 == 0 { &mut even } else { &mut odd };
            for j in 0..8 {
                acc[j] = if fused {
                    a[c * 8 + j].mul_add(b[c * 8 + j], acc[j])
                } else {
                    a[c * 8 + j] * b[c * 8 + j] + acc[j]
                };
            }
        }
        let acc: Vec<f32> = even.iter().zip(&odd).map(|(e, o)| e + o).collect();
        let mut tail = 0f32;
        for i in chunks * 8..a.len() {
            tail += a[i] * b[i];
        }
        ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
    }

    /// Rows computed together give exactly the bits of lone dot products, for every row count
    /// and lengths with and without a tail, on the detected and the portable path (each with its
    /// own rounding of the multiply-add).
    #[test]
    fn rows_are_bit_identical_to_lone_dots() {
        let mut next = rng(1);
        for inp in [1usize, 7, 8, 9, 64, 100, 1027] {
            for n in 1..=9 {
                let x: Vec<f32> = (0..n * inp).map(|_| next()).collect();
                let w: Vec<f32> = (0..5 * inp).map(|_| next()).collect();
                let y = matmul_rows(&x, n, &w, inp);
                let mut portable = vec![0f32; 5 * n];
                let into = |v: &mut Vec<f32>| Dst {
                    ptr: v.as_mut_ptr(),
                    out: 5,
                };
                // SAFETY: no particular instruction set needed; `portable` is `[n, 5]`.
                unsafe { matmul_block::<Portable, f32>(&x, n, &w, inp, 0, 5, into(&mut portable)) };
                // both vector paths where the CPU has them, whichever `matmul_rows` picked
                #[cfg(target_arch = "x86_64")]
                for (wide, ok) in [(false, has_avx()), (true, has_avx512())] {
                    if !ok {
                        continue;
                    }
                    let mut v = vec![0f32; 5 * n];
                    // SAFETY: the instruction sets were detected just above; `v` is `[n, 5]`.
                    unsafe {
                        if wide {
                            matmul_block_avx512(&x, n, &w, inp, 0, 5, into(&mut v));
                        } else {
                            matmul_block_avx(&x, n, &w, inp, 0, 5, into(&mut v));
                        }
                    }
                    for r in 0..n {
                        for o in 0..5 {
                            let (xr, wo) = (&x[r * inp..(r + 1) * inp], &w[o * inp..(o + 1) * inp]);
                            let want = lone(xr, wo, true);
                            assert_eq!(v[r * 5 + o].to_bits(), want.to_bits(), "wide {wide}");
                        }
                    }
                }
                for r in 0..n {
                    for o in 0..5 {
                        let (xr, wo) = (&x[r * inp..(r + 1) * inp], &w[o * inp..(o + 1) * inp]);
                        let want = lone(xr, wo, detected_fused());
                        assert_eq!(y[r * 5 + o].to_bits(), want.to_bits(), "inp {inp} n {n}");
                        let want_portable = lone(xr, wo, Portable::FUSED);
                        assert_eq!(portable[r * 5 + o].to_bits(), want_portable.to_bits());
                        let single = matmul_rows(&x[r * inp..(r + 1) * inp], 1, &w, inp);
                        assert_eq!(single[o].to_bits(), want.to_bits());
                    }
                }
            }
        }
    }

    /// Half-precision weights give the bits of the same weights widened to f32 beforehand, on
    /// every path and row count, with and without a tail.
    #[test]
    fn half_weights_are_widened_exactly() {
        fn check<E: Weight>(from: fn(f32) -> E) {
            let mut next = rng(7);
            for inp in [1usize, 7, 8, 9, 16, 100, 1027] {
                for n in 1..=9 {
                    let x: Vec<f32> = (0..n * inp).map(|_| next()).collect();
                    let w: Vec<E> = (0..5 * inp).map(|_| from(next())).collect();
                    let wide: Vec<f32> = w.iter().map(|v| v.to_f32()).collect();
                    let want = matmul_rows(&x, n, &wide, inp);
                    let got = matmul_rows(&x, n, &w, inp);
                    assert!(want
                        .iter()
                        .zip(&got)
                        .all(|(a, b)| a.to_bits() == b.to_bits()));
                    let into = |v: &mut Vec<f32>| Dst {
                        ptr: v.as_mut_ptr(),
                        out: 5,
                    };
                    let (mut a, mut b) = (vec![0f32; 5 * n], vec![0f32; 5 * n]);
                    // SAFETY: no particular instruction set needed; both are `[n, 5]`.
                    unsafe {
                        matmul_block::<Portable, f32>(&x, n, &wide, inp, 0, 5, into(&mut a));
                        matmul_block::<Portable, E>(&x, n, &w, inp, 0, 5, into(&mut b));
                    }
                    assert_eq!(a, b, "portable, inp {inp} n {n}");
                    #[cfg(target_arch = "x86_64")]
                    for (wide512, ok) in [(false, has_avx()), (true, has_avx512())] {
                        if !ok {
                            continue;
                        }
                        let (mut a, mut b) = (vec![0f32; 5 * n], vec![0f32; 5 * n]);
                        // SAFETY: the instruction sets were detected just above.
                        unsafe {
                            if wide512 {
                                matmul_block_avx512(&x, n, &wide, inp, 0, 5, into(&mut a));
                                matmul_block_avx512(&x, n, &w, inp, 0, 5, into(&mut b));
                            } else {
                                matmul_block_avx(&x, n, &wide, inp, 0, 5, into(&mut a));
                                matmul_block_avx(&x, n, &w, inp, 0, 5, into(&mut b));
                            }
                        }
                        let same = a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits());
                        assert!(same, "wide {wide512}, inp {inp} n {n}");
                    }
                }
            }
        }
        check(half::bf16::from_f32);
        check(half::f16::from_f32);
    }

    /// Value rows in blocks of keys give the bits of one pass over all the keys, on both paths,
    /// for 1-4 heads per KV head, widths with and without a tail of 8-channel chunks or of
    /// channels, caches of one block, one and a key, and several blocks and some (every
    /// position of a task going through each block); a verify's rows still equal single
    /// queries there.
    #[test]
    fn value_blocks_keep_the_bits() {
        let mut next = rng(41);
        for (rep, hkv, hd) in [
            (1usize, 2usize, 16usize),
            (2, 1, 40),
            (3, 2, 24),
            (4, 2, 128),
            (3, 1, 13),
        ] {
            let h = rep * hkv;
            for t_total in [VALUE_BLOCK, VALUE_BLOCK + 1, 3 * VALUE_BLOCK + 7] {
                let l = 3;
                let keys: Vec<f32> = (0..t_total * hkv * hd).map(|_| next()).collect();
                let values: Vec<f32> = (0..t_total * hkv * hd).map(|_| next()).collect();
                let q: Vec<f32> = (0..l * h * hd).map(|_| next()).collect();
                let scale = 1.0 / (hd as f32).sqrt();
                for avx in [false, true] {
                    let run = |block: usize| {
                        attention_impl(
                            &q,
                            &keys,
                            &values,
                            l,
                            h,
                            hkv,
                            hd,
                            scale,
                            avx,
                            SCORE_BUDGET,
                            block,
                        )
                    };
                    let blocked = run(VALUE_BLOCK);
                    assert_eq!(
                        testing::bits(&blocked),
                        testing::bits(&run(usize::MAX)),
                        "{rep} x {hkv} heads of {hd}, {t_total} keys, avx {avx}"
                    );
                    assert_eq!(testing::bits(&blocked), testing::bits(&run(2)));
                    // every vector instruction set this CPU runs: the same bits (AVX-512 takes
                    // the score products' chunk pairs in 16-lane vectors)
                    if avx {
                        for isa in isas().into_iter().filter(|&isa| isa != Isa::Portable) {
                            let got = with_isa(isa, || run(VALUE_BLOCK));
                            assert_eq!(testing::bits(&blocked), testing::bits(&got), "{isa:?}");
                        }
                    }
                    for i in 0..l {
                        let seen = (t_total - l + i + 1) * hkv * hd;
                        let one = attention_impl(
                            &q[i * h * hd..(i + 1) * h * hd],
                            &keys[..seen],
                            &values[..seen],
                            1,
                            h,
                            hkv,
                            hd,
                            scale,
                            avx,
                            SCORE_BUDGET,
                            VALUE_BLOCK,
                        );
                        assert_eq!(
                            testing::bits(&blocked[i * h * hd..(i + 1) * h * hd]),
                            testing::bits(&one)
                        );
                    }
                }
            }
        }
    }

    /// A verify forward's attention rows equal the single-query results bit for bit, and agree
    /// with a plain softmax-attention written out.
    #[test]
    fn attention_rows_match_single_queries_and_the_definition() {
        let mut next = rng(7);
        for (h, hkv, hd) in [
            (4usize, 2usize, 16usize),
            (2, 2, 12),
            (8, 1, 32),
            (4, 2, 64),
        ] {
            for l in 1..=6 {
                let t_total = 9 + l;
                let keys: Vec<f32> = (0..t_total * hkv * hd).map(|_| next()).collect();
                let values: Vec<f32> = (0..t_total * hkv * hd).map(|_| next()).collect();
                let q: Vec<f32> = (0..l * h * hd).map(|_| next()).collect();
                let scale = 1.0 / (hd as f32).sqrt();
                let all = attention(&q, &keys, &values, l, h, hkv, hd, scale);
                // SAFETY: no particular instruction set needed.
                let portable = attention_impl(
                    &q,
                    &keys,
                    &values,
                    l,
                    h,
                    hkv,
                    hd,
                    scale,
                    false,
                    SCORE_BUDGET,
                    VALUE_BLOCK,
                );
                // one position per task: the same bits
                for budget in [1, 2 * (h / hkv) * t_total] {
                    let tiled = attention_impl(
                        &q,
                        &keys,
                        &values,
                        l,
                        h,
                        hkv,
                        hd,
                        scale,
                        true,
                        budget,
                        VALUE_BLOCK,
                    );
                    assert!(all
                        .iter()
                        .zip(&tiled)
                        .all(|(a, b)| a.to_bits() == b.to_bits()));
                }
                for i in 0..l {
                    let seen = t_total - l + i + 1;
                    let one = attention(
                        &q[i * h * hd..(i + 1) * h * hd],
                        &keys[..seen * hkv * hd],
                        &values[..seen * hkv * hd],
                        1,
                        h,
                        hkv,
                        hd,
                        scale,
                    );
                    let row = &all[i * h * hd..(i + 1) * h * hd];
                    assert!(row
                        .iter()
                        .zip(&one)
                        .all(|(a, b)| a.to_bits() == b.to_bits()));
                    let one_portable = attention_impl(
                        &q[i * h * hd..(i + 1) * h * hd],
                        &keys[..seen * hkv * hd],
                        &values[..seen * hkv * hd],
                        1,
                        h,
                        hkv,
                        hd,
                        scale,
                        false,
                        SCORE_BUDGET,
                        VALUE_BLOCK,
                    );
                    let same = |a: &[f32], b: &[f32]| {
                        a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
                    };
                    let prow = &portable[i * h * hd..(i + 1) * h * hd];
                    assert!(same(prow, &one_portable));
                    if Portable::FUSED == detected_fused() {
                        assert!(same(prow, &one));
                    }
                    for head in 0..h {
                        let kvh = head / (h / hkv);
                        let qv = &q[(i * h + head) * hd..(i * h + head + 1) * hd];
                        let s: Vec<f64> = (0..seen)
                            .map(|t| {
                                let k = &keys[(t * hkv + kvh) * hd..(t * hkv + kvh + 1) * hd];
                                qv.iter().zip(k).map(|(a, b)| (a * b) as f64).sum::<f64>()
                                    * scale as f64
                            })
                            .collect();
                        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                        let z: f64 = s.iter().map(|v| (v - m).exp()).sum();
                        for c in 0..hd {
                            let want: f64 = (0..seen)
                                .map(|t| {
                                    (s[t] - m).exp() / z * values[(t * hkv + kvh) * hd + c] as f64
                                })
                                .sum();
                            let got = row[head * hd + c] as f64;
                            assert!((got - want).abs() < 1e-5, "{got} vs {want}");
                        }
                    }
                }
            }
        }
    }

    /// Calls longer than a block of steps (`DELTA_STEPS`): outputs, state and backup have the
    /// bits of one step at a time, wherever `settle` falls (first block, a block boundary, a
    /// later block, the end), advancing or not, on groups of rows and on single rows.
    #[test]
    fn delta_blocks_of_steps_match_single_steps() {
        use crate::kernels::DeltaDims;
        let mut next = rng(23);
        let s = 2 * DELTA_STEPS + 5;
        for (hk, hv, dk, dv) in [(1usize, 2usize, 12usize, 5usize), (2, 4, 128, 128)] {
            let d = DeltaDims { hk, hv, dk, dv };
            let q: Vec<f32> = (0..s * hk * dk).map(|_| 0.2 * next()).collect();
            let k: Vec<f32> = (0..s * hk * dk).map(|_| 0.2 * next()).collect();
            let v: Vec<f32> = (0..s * hv * dv).map(|_| next()).collect();
            let g: Vec<f32> = (0..s * hv).map(|_| 0.9 + 0.05 * next()).collect();
            let beta: Vec<f32> = (0..s * hv).map(|_| 0.5 + 0.2 * next()).collect();
            let init: Vec<f32> = (0..hv * dv * dk).map(|_| next()).collect();
            // one step at a time: the outputs of every step and the state after each
            let mut states = vec![init.clone()];
            let mut ys = Vec::new();
            for t in 0..s {
                let mut st = states[t].clone();
                ys.push(gated_delta_steps(
                    d,
                    &q[t * hk * dk..(t + 1) * hk * dk],
                    &k[t * hk * dk..(t + 1) * hk * dk],
                    &v[t * hv * dv..(t + 1) * hv * dv],
                    &g[t * hv..(t + 1) * hv],
                    &beta[t * hv..(t + 1) * hv],
                    &mut st,
                ));
                states.push(st);
            }
            let bits = |a: &[f32], b: &[f32]| {
                a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
            };
            for settle in [0, 3, DELTA_STEPS, DELTA_STEPS + 3, s] {
                for advance in [true, false] {
                    for with_backup in [false, true] {
                        let mut state = init.clone();
                        let mut backup = vec![0f32; if with_backup { init.len() } else { 0 }];
                        let y = gated_delta(
                            d,
                            &q,
                            &k,
                            &v,
                            &g,
                            &beta,
                            &mut state,
                            settle,
                            advance,
                            &mut backup,
                        );
                        let case = format!("dims {dk}x{dv}, settle {settle}, advance {advance}");
                        assert!(bits(&y, &ys[settle..].concat()), "outputs, {case}");
                        let want = if advance { &states[s] } else { &states[settle] };
                        assert!(bits(&state, want), "state, {case}");
                        if with_backup {
                            assert!(bits(&backup, &states[settle]), "backup, {case}");
                        }
                    }
                }
            }
        }
    }

    /// Several delta-rule steps at once give the bits of one step at a time (with the state
    /// recorded after each), the portable path the same bits, and both follow the definition.
    #[test]
    fn delta_steps_match_single_steps_and_the_definition() {
        use crate::kernels::DeltaDims;
        let mut next = rng(11);
        for (hk, hv, dk, dv) in [
            (2usize, 4usize, 16usize, 16usize),
            (1, 2, 12, 5),
            (2, 2, 64, 8),
            // large enough to be split over the worker team
            (2, 4, 128, 128),
        ] {
            let d = DeltaDims { hk, hv, dk, dv };
            let s = 4;
            let q: Vec<f32> = (0..s * hk * dk).map(|_| next()).collect();
            let k: Vec<f32> = (0..s * hk * dk).map(|_| next()).collect();
            let v: Vec<f32> = (0..s * hv * dv).map(|_| next()).collect();
            let g: Vec<f32> = (0..s * hv).map(|_| 0.5 + next()).collect();
            let beta: Vec<f32> = (0..s * hv).map(|_| 0.5 + next()).collect();
            let init: Vec<f32> = (0..hv * dv * dk).map(|_| next()).collect();
            let mut untouched = init.clone();
            let peeked = gated_delta(d, &q, &k, &v, &g, &beta, &mut untouched, 0, false, &mut []);
            let mut all_state = init.clone();
            let all = gated_delta_steps(d, &q, &k, &v, &g, &beta, &mut all_state);
            let mut portable_state = init.clone();
            let mut portable = vec![0f32; s * hv * dv];
            let inp = DeltaIn {
                d,
                q: &q,
                k: &k,
                v: &v,
                g: &g,
                beta: &beta,
                settle: 0,
                advance: true,
            };
            for h in 0..hv {
                let mut yh = vec![0f32; s * dv];
                let st = &mut portable_state[h * dv * dk..(h + 1) * dv * dk];
                // SAFETY: no particular instruction set needed.
                unsafe { delta_head::<Portable>(inp, h, st, &mut yh, &mut []) };
                for t in 0..s {
                    portable[(t * hv + h) * dv..(t * hv + h + 1) * dv]
                        .copy_from_slice(&yh[t * dv..(t + 1) * dv]);
                }
            }
            let bits =
                |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(bits(&peeked, &all) && bits(&untouched, &init));
            // settling: the first two steps as a verify left them, then two more
            let mut settled = init.clone();
            let y = gated_delta(d, &q, &k, &v, &g, &beta, &mut settled, 2, true, &mut []);
            assert!(bits(&y, &all[2 * hv * dv..]) && bits(&settled, &all_state));
            let mut settled = init.clone();
            let y = gated_delta(d, &q, &k, &v, &g, &beta, &mut settled, s, false, &mut []);
            assert!(y.is_empty() && bits(&settled, &all_state));
            // advancing with a backup: the state after the settled steps is kept aside
            let (mut two, mut after_two) = (init.clone(), init.clone());
            gated_delta(
                d,
                &q[..2 * hk * dk],
                &k[..2 * hk * dk],
                &v[..2 * hv * dv],
                &g[..2 * hv],
                &beta[..2 * hv],
                &mut after_two,
                2,
                true,
                &mut [],
            );
            let mut backup = vec![0f32; init.len()];
            let y = gated_delta(d, &q, &k, &v, &g, &beta, &mut two, 2, true, &mut backup);
            assert!(bits(&y, &all[2 * hv * dv..]) && bits(&two, &all_state));
            assert!(bits(&backup, &after_two));
            let y = gated_delta(
                d,
                &q,
                &k,
                &v,
                &g,
                &beta,
                &mut init.clone(),
                s,
                true,
                &mut backup,
            );
            assert!(y.is_empty() && bits(&backup, &all_state));
            if Portable::FUSED == detected_fused() {
                assert!(bits(&all, &portable) && bits(&all_state, &portable_state));
            } else {
                assert!(all.iter().zip(&portable).all(|(a, b)| (a - b).abs() < 1e-4));
            }
            let mut one_state = init.clone();
            let mut want_state: Vec<f64> = init.iter().map(|x| *x as f64).collect();
            for t in 0..s {
                let y = gated_delta_steps(
                    d,
                    &q[t * hk * dk..(t + 1) * hk * dk],
                    &k[t * hk * dk..(t + 1) * hk * dk],
                    &v[t * hv * dv..(t + 1) * hv * dv],
                    &g[t * hv..(t + 1) * hv],
                    &beta[t * hv..(t + 1) * hv],
                    &mut one_state,
                );
                assert!(bits(&y, &all[t * hv * dv..(t + 1) * hv * dv]));
                for h in 0..hv {
                    let kh = h / (hv / hk);
                    let kk = &k[(t * hk + kh) * dk..(t * hk + kh + 1) * dk];
                    let qq = &q[(t * hk + kh) * dk..(t * hk + kh + 1) * dk];
                    for r in 0..dv {
                        let row = &mut want_state[(h * dv + r) * dk..(h * dv + r + 1) * dk];
                        row.iter_mut().for_each(|x| *x *= g[t * hv + h] as f64);
                        let kv: f64 = row.iter().zip(kk).map(|(a, b)| a * *b as f64).sum();
                        let delta =
                            (v[(t * hv + h) * dv + r] as f64 - kv) * beta[t * hv + h] as f64;
                        row.iter_mut()
                            .zip(kk)
                            .for_each(|(a, b)| *a += delta * *b as f64);
                        let want: f64 = row.iter().zip(qq).map(|(a, b)| a * *b as f64).sum();
                        let got = y[h * dv + r] as f64;
                        assert!((got - want).abs() < 1e-4, "{got} vs {want}");
                    }
                }
            }
            assert!(bits(&one_state, &all_state));
        }
    }

    use crate::testing::{self, close, dot64, expect_panic, CASES};
    use proptest::prelude::*;

    /// Whether `isa`'s multiply-adds are fused.
    fn fused(isa: Isa) -> bool {
        isa != Isa::Portable || Portable::FUSED
    }

    /// `matmul_rows` checks every length it reads: rows, input, weights (and sizes whose product
    /// wraps around).
    #[test]
    fn matmul_rows_checks_every_length() {
        let (w, x) = (vec![0f32; 4 * 8], vec![0f32; 33 * 8]);
        let wb = vec![half::bf16::ZERO; 4 * 8];
        expect_panic(
            "matmul_rows: the input holds 23 floats, expected 3 rows of 8",
            || {
                matmul_rows(&x[..23], 3, &w, 8);
            },
        );
        expect_panic(
            "matmul_rows: the input holds 24 floats, expected 2 rows of 8",
            || {
                matmul_rows(&x[..24], 2, &wb, 8);
            },
        );
        expect_panic("matmul_rows: 0 input rows", || {
            matmul_rows(&[], 0, &w, 8);
        });
        expect_panic("matmul_rows: 33 input rows", || {
            matmul_rows(&x, 33, &w, 8);
        });
        expect_panic("matmul_rows: zero input features", || {
            matmul_rows(&[], 1, &w, 0);
        });
        expect_panic("matmul_rows: 31 weights are not whole rows of 8", || {
            matmul_rows(&x[..8], 1, &w[..31], 8);
        });
        expect_panic("matmul_rows: the input holds 0 floats", || {
            matmul_rows::<f32>(&[], 2, &[], usize::MAX / 2 + 1);
        });
    }

    /// `matmul_rows_parts` checks the input and every part.
    #[test]
    fn matmul_rows_parts_checks_every_length() {
        let (w, x) = (vec![half::f16::ZERO; 4 * 8], vec![0f32; 3 * 8]);
        expect_panic("matmul_rows_parts: the input holds 23 floats", || {
            matmul_rows_parts(&x[..23], 3, &[&w, &w], 8);
        });
        expect_panic("matmul_rows_parts: 0 input rows", || {
            matmul_rows_parts(&[], 0, &[&w], 8);
        });
        expect_panic(
            "matmul_rows_parts: a part's weights are not whole rows of 8",
            || {
                matmul_rows_parts(&x, 3, &[&w, &w[..12]], 8);
            },
        );
        expect_panic("matmul_rows_parts: zero input features", || {
            matmul_rows_parts(&[], 1, &[&w], 0);
        });
    }

    /// `matmul_quant` checks the input against the matrix's width.
    #[test]
    fn matmul_quant_checks_the_input() {
        let (q, _) = crate::quant::random_matrix(4, 32, 2, 3, candle_core::DType::BF16, 2);
        let x = vec![0f32; 33 * 64];
        expect_panic(
            "matmul_quant: the input holds 63 floats, expected 1 rows of 64",
            || {
                matmul_quant(&x[..63], 1, &q);
            },
        );
        expect_panic(
            "matmul_quant: the input holds 128 floats, expected 1 rows",
            || {
                matmul_quant(&x[..128], 1, &q);
            },
        );
        expect_panic("matmul_quant: 33 input rows", || {
            matmul_quant(&x, 33, &q);
        });
        expect_panic("matmul_quant: 0 input rows", || {
            matmul_quant(&[], 0, &q);
        });
    }

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

    /// `attention` checks the shapes and every slice against them.
    #[test]
    fn attention_checks_every_length() {
        let (h, hkv, hd, l, t) = (4usize, 2usize, 8usize, 2usize, 5usize);
        let q = vec![0f32; l * h * hd];
        let kv = vec![0f32; t * hkv * hd];
        let att = |q: &[f32], k: &[f32], v: &[f32], l, h, hkv, hd| {
            attention(q, k, v, l, h, hkv, hd, 1.0);
        };
        expect_panic(
            "attention: the queries hold 63 floats, expected [2, 4, 8]",
            || att(&q[..63], &kv, &kv, l, h, hkv, hd),
        );
        expect_panic(
            "attention: the queries hold 64 floats, expected [3, 4, 8]",
            || att(&q, &kv, &kv, 3, h, hkv, hd),
        );
        expect_panic("attention: keys (79) and values (80)", || {
            att(&q, &kv[..79], &kv, l, h, hkv, hd)
        });
        expect_panic("attention: keys (80) and values (64)", || {
            att(&q, &kv, &kv[..64], l, h, hkv, hd)
        });
        expect_panic("attention: 1 cached positions for 2 queries", || {
            att(&q, &kv[..16], &kv[..16], l, h, hkv, hd)
        });
        expect_panic("attention: 4 heads over 3 KV heads", || {
            att(&q, &kv, &kv, l, h, 3, hd)
        });
        expect_panic("attention: 4 heads over 0 KV heads", || {
            att(&q, &kv, &kv, l, h, 0, hd)
        });
        expect_panic("attention: 4 heads over 2 KV heads of width 0", || {
            att(&q, &kv, &kv, l, h, hkv, 0)
        });
        // `l * h * hd` wrapping to the queries' length
        expect_panic("attention: the queries hold 0 floats", || {
            att(&[], &kv[..16], &kv[..16], 2, usize::MAX / 2 + 1, 1, 1)
        });
    }

    /// `gated_delta` checks every input, the state and the backup against the dimensions.
    #[test]
    fn gated_delta_checks_every_length() {
        use crate::kernels::DeltaDims;
        let d = DeltaDims {
            hk: 1,
            hv: 2,
            dk: 8,
            dv: 4,
        };
        let s = 3;
        let (q, v) = (vec![0f32; s * 8], vec![0f32; s * 2 * 4]);
        let (g, state) = (vec![1f32; s * 2], vec![0f32; 2 * 4 * 8]);
        type Case<'a> = (&'a str, DeltaDims, [usize; 6], usize, usize);
        let cases: [Case; 11] = [
            (
                "q holds 23 floats, expected [3, 1, 8]",
                d,
                [23, 24, 24, 6, 6, 64],
                0,
                0,
            ),
            (
                "k holds 16 floats, expected [3, 1, 8]",
                d,
                [24, 16, 24, 6, 6, 64],
                0,
                0,
            ),
            (
                "v holds 23 floats, expected [3, 2, 4]",
                d,
                [24, 24, 23, 6, 6, 64],
                0,
                0,
            ),
            (
                "g holds 5 floats, expected [2, 2]",
                d,
                [24, 24, 24, 5, 5, 64],
                0,
                0,
            ),
            (
                "beta holds 4 floats, expected [3, 2]",
                d,
                [24, 24, 24, 6, 4, 64],
                0,
                0,
            ),
            (
                "the state holds 63 floats, expected [2, 4, 8]",
                d,
                [24, 24, 24, 6, 6, 63],
                0,
                0,
            ),
            ("4 steps to settle of 3", d, [24, 24, 24, 6, 6, 64], 4, 0),
            (
                "a backup of 8 floats for a state of 64",
                d,
                [24, 24, 24, 6, 6, 64],
                0,
                8,
            ),
            (
                "0 key heads, 2 value heads",
                DeltaDims { hk: 0, ..d },
                [24, 24, 24, 6, 6, 64],
                0,
                0,
            ),
            (
                "2 key heads, 3 value heads",
                DeltaDims { hk: 2, hv: 3, ..d },
                [24, 24, 24, 6, 6, 64],
                0,
                0,
            ),
            (
                "1 key heads, 2 value heads, widths 8 and 0",
                DeltaDims { dv: 0, ..d },
                [24, 24, 24, 6, 6, 64],
                0,
                0,
            ),
        ];
        for (want, d, [lq, lk, lv, lg, lb, ls], settle, lbackup) in cases {
            let mut st = state[..ls].to_vec();
            let mut backup = vec![0f32; lbackup];
            expect_panic(&format!("gated_delta: {want}"), || {
                gated_delta(
                    d,
                    &q[..lq],
                    &q[..lk],
                    &v[..lv],
                    &g[..lg],
                    &g[..lb],
                    &mut st,
                    settle,
                    true,
                    &mut backup,
                );
            });
        }
    }

    /// Weights `[out, inp]` of type `E` from `next`, and the same widened to f32.
    fn weights<E: Weight>(
        from: fn(f32) -> E,
        len: usize,
        next: &mut impl FnMut() -> f32,
    ) -> (Vec<E>, Vec<f32>) {
        let w: Vec<E> = (0..len).map(|_| from(next())).collect();
        let wide = w.iter().map(|v| v.to_f32()).collect();
        (w, wide)
    }

    /// The property of [`matmul_rows_follow_the_lone_dot`] for weights of type `E`.
    fn rows_follow_the_lone_dot<E: Weight>(
        from: fn(f32) -> E,
        (n, inp, out, cut, seed): (usize, usize, usize, usize, u64),
    ) {
        let mut next = testing::rng(seed);
        let x: Vec<f32> = (0..n * inp).map(|_| next()).collect();
        let (w, wide) = weights(from, out * inp, &mut next);
        let cut = cut.min(out) * inp;
        for isa in isas() {
            let (y, split) = with_isa(isa, || {
                let split = matmul_rows_parts(&x, n, &[&w[..cut], &w[cut..]], inp);
                (matmul_rows(&x, n, &w, inp), split)
            });
            assert_eq!(testing::bits(&y), testing::bits(&split), "{isa:?}, parts");
            for r in 0..n {
                for o in 0..out {
                    let xr = &x[r * inp..(r + 1) * inp];
                    let want = lone(xr, &wide[o * inp..(o + 1) * inp], fused(isa));
                    assert_eq!(
                        y[r * out + o].to_bits(),
                        want.to_bits(),
                        "{isa:?}, {n} rows of {inp}, feature {o} of {out}"
                    );
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(CASES))]

        /// Every result of `matmul_rows` (and of the same matrix in two parts) has the bits of
        /// the lone dot product, for f32, bf16 and f16 weights, every row count, odd widths,
        /// matrices on and off the block size, on every path this CPU runs.
        #[test]
        fn matmul_rows_follow_the_lone_dot(
            n in 1usize..=MAX_ROWS,
            inp in 1usize..=80,
            out in 1usize..=72,
            cut in 0usize..=72,
            kind in 0usize..3,
            seed in any::<u64>(),
        ) {
            let case = (n, inp, out, cut, seed);
            match kind {
                0 => rows_follow_the_lone_dot::<f32>(|v| v, case),
                1 => rows_follow_the_lone_dot(half::bf16::from_f32, case),
                _ => rows_follow_the_lone_dot(half::f16::from_f32, case),
            }
        }

        /// `matmul_quant` gives the bits of the lone dot product over the matrix dequantized
        /// by the definition, at every width it multiplies as dequantized rows and on every
        /// path this CPU runs (4 and 8 bits in whole blocks are `qdot`'s, tested there).
        #[test]
        fn matmul_quant_follows_the_definition(
            n in 1usize..=MAX_ROWS,
            bits in prop::sample::select(vec![2usize, 3, 4, 5, 6, 8]),
            group in prop::sample::select(vec![8usize, 12, 16, 32, 64]),
            groups in 1usize..=3,
            out in 1usize..=40,
            seed in any::<u64>(),
        ) {
            let (q, deq) = crate::quant::random_matrix(
                bits, group, groups, out, candle_core::DType::BF16, seed,
            );
            prop_assume!(!crate::qdot::supports(bits, q.group()));
            let inp = q.in_features();
            let mut next = testing::rng(!seed);
            let x: Vec<f32> = (0..n * inp).map(|_| next()).collect();
            for isa in isas() {
                let y = with_isa(isa, || matmul_quant(&x, n, &q));
                for r in 0..n {
                    for o in 0..out {
                        let xr = &x[r * inp..(r + 1) * inp];
                        let want = lone(xr, &deq[o * inp..(o + 1) * inp], fused(isa));
                        prop_assert_eq!(y[r * out + o].to_bits(), want.to_bits(), "{:?}", isa);
                    }
                }
            }
        }

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

        /// Attention follows the definition (softmax over the visible keys, in f64) for any
        /// head grouping, odd widths and cache lengths, on every path this CPU runs, and
        /// tiling the positions into tasks keeps the bits.
        #[test]
        fn attention_follows_the_definition(
            hkv in 1usize..=3,
            rep in 1usize..=4,
            hd in 1usize..=40,
            l in 1usize..=6,
            extra in 0usize..=12,
            seed in any::<u64>(),
        ) {
            let (h, t) = (hkv * rep, l + extra);
            let mut next = testing::rng(seed);
            let keys: Vec<f32> = (0..t * hkv * hd).map(|_| next()).collect();
            let values: Vec<f32> = (0..t * hkv * hd).map(|_| next()).collect();
            let q: Vec<f32> = (0..l * h * hd).map(|_| next()).collect();
            let scale = 1.0 / (hd as f32).sqrt();
            for isa in isas() {
                let (all, tiled) = with_isa(isa, || {
                    let all = attention(&q, &keys, &values, l, h, hkv, hd, scale);
                    let tiled =
                        attention_impl(&q, &keys, &values, l, h, hkv, hd, scale, true, 1, VALUE_BLOCK);
                    (all, tiled)
                });
                prop_assert_eq!(testing::bits(&all), testing::bits(&tiled));
                for i in 0..l {
                    let seen = t - l + i + 1;
                    for head in 0..h {
                        let kvh = head / rep;
                        let qv = &q[(i * h + head) * hd..(i * h + head + 1) * hd];
                        fn row(m: &[f32], t: usize, hkv: usize, kvh: usize, hd: usize) -> &[f32] {
                            &m[(t * hkv + kvh) * hd..(t * hkv + kvh + 1) * hd]
                        }
                        let s: Vec<f64> =
                            (0..seen).map(|t| dot64(qv, row(&keys, t, hkv, kvh, hd)).0 * scale as f64).collect();
                        let max = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                        let z: f64 = s.iter().map(|v| (v - max).exp()).sum();
                        for c in 0..hd {
                            let want: f64 = (0..seen)
                                .map(|t| (s[t] - max).exp() / z * row(&values, t, hkv, kvh, hd)[c] as f64)
                                .sum();
                            let got = all[(i * h + head) * hd + c];
                            prop_assert!(close(got, want, 1.0, 1e-5), "{:?}: {} vs {}", isa, got, want);
                        }
                    }
                }
            }
        }

        /// The delta rule follows its definition (in f64) for any head grouping, odd widths,
        /// step counts, settled steps, with and without advancing or a backup, on every path
        /// this CPU runs.
        #[test]
        fn delta_rule_follows_the_definition(
            hk in 1usize..=2,
            per in 1usize..=2,
            dk in 1usize..=40,
            dv in 1usize..=9,
            s in 0usize..=4,
            settle in 0usize..=4,
            advance in any::<bool>(),
            backup in any::<bool>(),
            seed in any::<u64>(),
        ) {
            use crate::kernels::DeltaDims;
            let (hv, settle) = (hk * per, settle.min(s));
            let d = DeltaDims { hk, hv, dk, dv };
            let mut next = testing::rng(seed);
            let mut take = |len: usize, base: f32| -> Vec<f32> {
                (0..len).map(|_| base + next()).collect()
            };
            let (q, k, v) = (take(s * hk * dk, 0.0), take(s * hk * dk, 0.0), take(s * hv * dv, 0.0));
            let (g, beta, init) = (take(s * hv, 0.7), take(s * hv, 0.5), take(hv * dv * dk, 0.0));
            // the definition, step by step: the state after each step and the outputs
            let mut st: Vec<f64> = init.iter().map(|v| *v as f64).collect();
            let mut states = vec![st.clone()];
            let mut ys = Vec::new();
            for t in 0..s {
                for h in 0..hv {
                    let kh = h / per;
                    let kk = &k[(t * hk + kh) * dk..(t * hk + kh + 1) * dk];
                    let qq = &q[(t * hk + kh) * dk..(t * hk + kh + 1) * dk];
                    for r in 0..dv {
                        let row = &mut st[(h * dv + r) * dk..(h * dv + r + 1) * dk];
                        row.iter_mut().for_each(|x| *x *= g[t * hv + h] as f64);
                        let kv: f64 = row.iter().zip(kk).map(|(a, b)| a * *b as f64).sum();
                        let delta = (v[(t * hv + h) * dv + r] as f64 - kv) * beta[t * hv + h] as f64;
                        row.iter_mut().zip(kk).for_each(|(a, b)| *a += delta * *b as f64);
                        ys.push(row.iter().zip(qq).map(|(a, b)| a * *b as f64).sum::<f64>());
                    }
                }
                states.push(st.clone());
            }
            for isa in isas() {
                let mut state = init.clone();
                let mut kept = vec![0f32; if backup { init.len() } else { 0 }];
                let y = with_isa(isa, || {
                    gated_delta(d, &q, &k, &v, &g, &beta, &mut state, settle, advance, &mut kept)
                });
                prop_assert_eq!(y.len(), (s - settle) * hv * dv);
                for (got, want) in y.iter().zip(&ys[settle * hv * dv..]) {
                    prop_assert!(close(*got, *want, want.abs(), 1e-4), "{:?}: {} vs {}", isa, got, want);
                }
                let after = &states[if advance { s } else { settle }];
                for (got, want) in state.iter().zip(after) {
                    prop_assert!(close(*got, *want, want.abs(), 1e-4), "{:?}: state {} vs {}", isa, got, want);
                }
                for (got, want) in kept.iter().zip(&states[settle]) {
                    prop_assert!(close(*got, *want, want.abs(), 1e-4), "{:?}: backup {} vs {}", isa, got, want);
                }
            }
        }
    }
}
