//! Which arithmetic the products of quantized matrices run in ([`Arith`]): `exact`, mlx's f32
//! arithmetic (bit-for-bit parity with mlx-vlm, the default), or `fast`, integer products with
//! activations quantized to int8 per block (llama.cpp's Q8_0 way; see `kernels::int8`).
//!
//! The engine sets it on the model ([`crate::Engine::set_arith`]); a forward runs inside
//! [`with_arith`], which holds the mode for the calling thread, and the worker team's loops
//! carry it to the threads that take part (`crate::team`), so every quantized product of that
//! forward, MoE experts included, reads it through [`current`].

use std::cell::Cell;

/// The arithmetic of products with MLX-quantized (4- and 8-bit) matrices.
///
/// ```
/// use mtp_engine::Arith;
/// assert_eq!("fast".parse::<Arith>(), Ok(Arith::Fast));
/// assert_eq!((Arith::default(), Arith::Fast.to_string()), (Arith::Exact, "fast".to_string()));
/// assert!("int4".parse::<Arith>().unwrap_err().contains("`int4`"));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Arith {
    /// mlx's arithmetic: weights dequantized in f32, f32 products (bit-for-bit mlx-vlm).
    #[default]
    Exact,
    /// Activations quantized to int8 per group (one f32 scale each, per row), integer products
    /// with the packed 4- and 8-bit weights, scales applied per group. Verify rows still give
    /// the bits of single steps. Other weights (f32, bf16, f16, other widths) keep their path.
    Fast,
}

impl Arith {
    /// `exact` or `fast`.
    pub fn as_str(self) -> &'static str {
        match self {
            Arith::Exact => "exact",
            Arith::Fast => "fast",
        }
    }
}

impl std::fmt::Display for Arith {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Arith {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "exact" => Ok(Arith::Exact),
            "fast" => Ok(Arith::Fast),
            other => Err(format!("unknown arithmetic `{other}`; use exact or fast")),
        }
    }
}

thread_local! {
    static CURRENT: Cell<Arith> = const { Cell::new(Arith::Exact) };
}

/// Runs `f` with this thread's quantized products in `arith` (restored afterwards, also on a
/// panic). The engine wraps its forwards in it; a caller of [`crate::nn::Linear::forward`]
/// may too.
pub fn with_arith<R>(arith: Arith, f: impl FnOnce() -> R) -> R {
    struct Restore(Arith);
    impl Drop for Restore {
        fn drop(&mut self) {
            CURRENT.set(self.0);
        }
    }
    let _restore = Restore(CURRENT.replace(arith));
    f()
}

/// The arithmetic of this thread's quantized products (see [`with_arith`]).
pub fn current() -> Arith {
    CURRENT.get()
}
