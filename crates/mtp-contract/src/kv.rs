//! The KV cache's element type ([`KvType`]), an option of the in-process runtimes.

/// The element type an in-process runtime keeps its KV cache in (llama.cpp's `--cache-type-k`
/// / `--cache-type-v`, both at once): the native engine's `KvCache` and the `gguf`
/// provider's llama.cpp context. The native engine widens half-precision keys and values to
/// f32 as attention reads them (exact), so the only change is the rounding of each value as it
/// is stored.
///
/// ```
/// use mtp_contract::KvType;
/// assert_eq!("f16".parse::<KvType>(), Ok(KvType::F16));
/// assert_eq!(KvType::Bf16.to_string(), "bf16");
/// assert_eq!((KvType::default(), KvType::F16.bytes()), (KvType::F32, 2));
/// assert!("q8_0".parse::<KvType>().unwrap_err().contains("`q8_0`"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum KvType {
    /// f32, the forward's own values: the native engine's output is that of the reference
    /// (mlx-vlm on f32 activations). The native engine's default.
    #[default]
    F32,
    /// IEEE half precision (llama.cpp's default): half the memory, and half the bytes a step
    /// reads from a long context, where attention is most of a step. Keys and values are
    /// rounded to the nearest f16 (values beyond ±65,504 become infinite, as in llama.cpp).
    F16,
    /// bfloat16: as f16 in size, with f32's range and 8 bits of precision (the cache mlx
    /// keeps for a bf16 model).
    Bf16,
}

impl KvType {
    /// Its name on the command line and in options: `f32`, `f16`, `bf16`.
    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
            KvType::Bf16 => "bf16",
        }
    }

    /// Bytes per cached value.
    pub fn bytes(self) -> usize {
        match self {
            KvType::F32 => 4,
            KvType::F16 | KvType::Bf16 => 2,
        }
    }
}

impl std::fmt::Display for KvType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for KvType {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "f32" => Ok(KvType::F32),
            "f16" => Ok(KvType::F16),
            "bf16" => Ok(KvType::Bf16),
            other => Err(format!(
                "KV cache type `{other}` is not known; use f32, f16 or bf16"
            )),
        }
    }
}
