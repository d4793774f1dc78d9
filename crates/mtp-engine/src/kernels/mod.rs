//! The engine's CPU kernels, laid out as llama.cpp's ggml-cpu lays out its own: vector
//! primitives, one CPU-feature dispatch point, and one file per op. Every SIMD kernel of the
//! engine lives here and runs on the one [`cpu::Isa`] that [`cpu::isa`] detects (nothing outside
//! `kernels` asks the CPU or holds `unsafe` vector code); each is reached through a safe function
//! that checks every length it relies on.
//!
//! - `lanes`: 8-lane f32 vectors, each kernel written once over them and compiled portably and
//!   for AVX2 / AVX-512; `dot`: the dot products the few-row kernels share.
//! - `cpu`: the instruction set a kernel call runs on (detected once), the one place that asks
//!   the CPU and the one list of the instruction sets there are.
//! - `aligned`: buffers that start on a cache line; `weights`: the weight element types (f32,
//!   bf16, f16) and their exact widening.
//! - one file per op: `matmul` (few-row products), `qdot` (few-row products of packed 4- and
//!   8-bit matrices), `int8` (the same with int8 activations, `fast` arithmetic), `fgemm`
//!   (many-row products, prefill), `dequant` (MLX affine rows to f32), `attention` (cached
//!   attention), `delta` (the gated delta rule), `norm` (RMS norm), `rope` (rotary embedding),
//!   `act` (activations on an `exp` of our own) and `conv` (the causal depthwise conv).
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

mod act;
mod aligned;
mod attention;
mod conv;
pub(crate) mod cpu;
mod delta;
mod dequant;
mod dot;
pub(crate) mod fgemm;
pub(crate) mod int8;
mod lanes;
mod matmul;
mod norm;
mod qdot;
pub(crate) mod quant;
mod rope;
mod weights;

pub use act::{exp, sigmoid, sigmoid_mul, silu_mul, softplus};
pub(crate) use aligned::Aligned;
pub use attention::{attention, AttentionShape};
pub use conv::{causal_conv_silu, conv_window_push};
pub use delta::{gated_delta, DeltaDims, DeltaIn};
pub(crate) use dequant::dequantize_row;
pub(crate) use matmul::row_groups;
pub use matmul::{matmul_quant, matmul_rows, matmul_rows_parts, MAX_ROWS};
pub use norm::rms_norm_rows;
pub use rope::Rope;
pub use weights::{widen_to, Weight};

/// The product of `dims`, `None` when it overflows (then no slice has that many elements).
pub(crate) fn elements(dims: &[usize]) -> Option<usize> {
    dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d))
}
