//! The one CPU-feature dispatch point: which instruction sets the kernels may run on
//! ([`has_avx`], [`has_avx512`]), the test cap that narrows them per thread ([`with_isa`]), and
//! the [`multiversion!`] wrapper that compiles a plain loop for AVX2 next to the baseline.

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

/// Whether [`super::matmul_rows`] may use 512-bit vectors: AVX-512F next to the AVX2 path. Set
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
