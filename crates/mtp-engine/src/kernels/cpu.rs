//! The one CPU-feature dispatch point: the instruction sets there are ([`Isa`]), which one the
//! kernels run on ([`isa`], detected once per process; `MTP_NO_AVX2` and `MTP_NO_AVX512` narrow
//! it), the test cap that narrows it per thread ([`with_isa`]), and the [`multiversion!`]
//! wrapper that compiles a plain loop for AVX2 next to the baseline. Every kernel module
//! (`matmul`, `qdot`, `int8`, `fgemm`, `dequant`, `attention`, `delta`, the slice kernels) asks
//! here, never the CPU itself; the extensions some paths add on top (AVX-512BW, VNNI) are asked
//! for here too, on top of the [`Isa`] they narrow.

/// The instruction sets the kernels choose between, narrowest first: the portable lanes, AVX2
/// (with FMA and F16C), and AVX-512F next to AVX2.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
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

/// Runs `f` with this thread's kernel calls limited to `isa` (the portable lanes, or AVX2
/// without AVX-512), so that tests reach every path this CPU can run. A call decides its path on
/// the calling thread; work it hands to the team keeps that path, except dequantization inside
/// [`super::matmul_quant`] (each path gives the same bits).
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
        .filter(|&isa| with_isa(isa, self::isa) == isa)
        .collect()
}

/// The widest instruction set a kernel call on this thread uses: what the CPU has (see
/// [`has_avx`] and [`has_avx512`]), and in tests no wider than the cap that [`with_isa`] sets.
#[inline]
pub(crate) fn isa() -> Isa {
    #[cfg(test)]
    {
        cpu().min(ISA_CAP.get())
    }
    #[cfg(not(test))]
    {
        cpu()
    }
}

/// The widest instruction set of this CPU, detected once.
#[inline]
fn cpu() -> Isa {
    static CPU: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
    *CPU.get_or_init(|| {
        if !cpu_has_avx() {
            Isa::Portable
        } else if cpu_has_avx512() {
            Isa::Avx512
        } else {
            Isa::Avx2
        }
    })
}

/// Whether the CPU has what the AVX2 path needs (see [`has_avx`]) and `MTP_NO_AVX2` does not
/// turn it off (set, not empty nor `0`: every kernel takes the portable path, for comparisons).
fn cpu_has_avx() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::env::var_os("MTP_NO_AVX2").is_none_or(|v| v.is_empty() || v == "0")
            && std::arch::is_x86_feature_detected!("avx")
            && std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the CPU has AVX-512F and `MTP_NO_AVX512` does not turn it off (see [`has_avx512`]).
fn cpu_has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::env::var_os("MTP_NO_AVX512").is_none_or(|v| v.is_empty() || v == "0")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the CPU has AVX, AVX2 and FMA, whatever `MTP_NO_AVX2` says (the integer products
/// check their paths against the CPU with it; [`isa`] decides whether they run).
#[cfg(target_arch = "x86_64")]
pub(crate) fn cpu_has_avx2_fma() -> bool {
    std::arch::is_x86_feature_detected!("avx")
        && std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
}

/// Whether the CPU has AVX-VNNI (`vpdpbusd` on VEX-encoded 256-bit registers).
#[cfg(target_arch = "x86_64")]
pub(crate) fn cpu_has_avxvnni() -> bool {
    std::arch::is_x86_feature_detected!("avxvnni")
}

/// Whether the CPU has AVX512-VNNI on 256-bit registers (AVX-512F, VL and VNNI).
#[cfg(target_arch = "x86_64")]
pub(crate) fn cpu_has_avx512vnni() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512vl")
        && std::arch::is_x86_feature_detected!("avx512vnni")
}

/// The vector path needs AVX for the lanes, AVX2 for the integer half of `exp` and for widening
/// bfloat16 weights, and F16C for half-precision weights (every AVX2 CPU has it). True only
/// where the CPU has them all.
#[inline]
pub(crate) fn has_avx() -> bool {
    isa() >= Isa::Avx2
}

/// Whether the kernels may use 512-bit vectors: AVX-512F next to the AVX2 path. Set
/// `MTP_NO_AVX512=1` to keep them to 256 bits (same results; for comparisons).
#[cfg(test)]
#[inline]
pub(crate) fn has_avx512() -> bool {
    isa() >= Isa::Avx512
}

/// Whether `isa` (what [`isa`] chose) is the AVX-512 path and the CPU has AVX-512BW (byte
/// shuffles).
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx512bw(isa: Isa) -> bool {
    isa >= Isa::Avx512 && std::arch::is_x86_feature_detected!("avx512bw")
}

/// Defines a function over slices whose body is compiled twice: for AVX2 and FMA, used where
/// the CPU has them, so that the plain loops vectorize 8 wide, and for the baseline. Both give
/// the same bits, since Rust never fuses a multiply and an add on its own.
macro_rules! multiversion {
    ($(#[$m:meta])* pub fn $name:ident($($a:ident: $t:ty),* $(,)?) $body:block) => {
        $(#[$m])*
        pub fn $name($($a: $t),*) {
            #[inline(always)]
            fn imp($($a: $t),*) $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx,avx2,fma")]
                unsafe fn avx($($a: $t),*) {
                    imp($($a),*)
                }
                if crate::kernels::cpu::has_avx() {
                    // SAFETY: AVX2 and FMA were detected on this CPU.
                    return unsafe { avx($($a),*) };
                }
            }
            imp($($a),*)
        }
    };
}
pub(crate) use multiversion;
