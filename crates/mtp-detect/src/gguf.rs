//! A GGUF header reader that works on a byte prefix of the file.
//!
//! It reads GGUF v2 and v3 (little- and big-endian), every metadata value type and nested
//! arrays, then the tensor-info table. It never reads tensor data. When the prefix ends before
//! the header does, it says how many bytes it needs ([`GgufParse::NeedMore`]) and hands back
//! what it has read so far, so a caller can fetch a longer prefix.
//!
//! Every length read from the file is checked before it is used: against a fixed cap, and
//! against the bytes the file can still hold. Nothing is allocated in proportion to an
//! untrusted length; long arrays keep only their first [`KEPT_ARRAY_ITEMS`] items, unless
//! [`parse_gguf_with`] is asked for more ([`ParseOptions::keep_array_items`], e.g. a whole
//! vocabulary). Kept items are stored as they are read, so memory grows with the bytes actually
//! present in the prefix, never with a length the file merely declares.
//!
//! ```
//! use mtp_detect::gguf::{parse_gguf, GgufParse};
//! // magic, version 3, 0 tensors, 0 metadata entries
//! let mut b = b"GGUF".to_vec();
//! b.extend(3u32.to_le_bytes());
//! b.extend(0u64.to_le_bytes());
//! b.extend(0u64.to_le_bytes());
//! let GgufParse::Complete(h) = parse_gguf(&b, b.len() as u64).unwrap() else { panic!() };
//! assert_eq!(h.version, 3);
//! ```

use serde::Serialize;

/// The default prefix fetched first: 3 MiB.
pub const DEFAULT_PREFIX: u64 = 3 * 1024 * 1024;
/// The largest prefix a probe grows to when the metadata is longer: 64 MiB.
pub const MAX_PREFIX: u64 = 64 * 1024 * 1024;
/// The longest metadata key accepted (the GGUF spec's limit).
pub const MAX_KEY_LEN: u64 = 65_535;
/// The longest string value accepted.
pub const MAX_STRING_LEN: u64 = 16 * 1024 * 1024;
/// The deepest nesting of arrays accepted.
pub const MAX_DEPTH: usize = 8;
/// The most metadata entries accepted.
pub const MAX_KV_COUNT: u64 = 1 << 20;
/// The most tensors accepted.
pub const MAX_TENSOR_COUNT: u64 = 1 << 22;
/// The most dimensions per tensor accepted (ggml uses 4).
pub const MAX_DIMS: u32 = 8;
/// How many items of an array are kept by default; the length is always kept.
pub const KEPT_ARRAY_ITEMS: usize = 64;

/// What [`parse_gguf_with`] keeps of the metadata.
///
/// ```
/// use mtp_detect::gguf::{ParseOptions, KEPT_ARRAY_ITEMS};
/// assert_eq!(ParseOptions::default().keep_array_items, KEPT_ARRAY_ITEMS);
/// let whole = ParseOptions::whole_arrays(); // e.g. to read a vocabulary
/// assert_eq!(whole.keep_array_items, usize::MAX);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParseOptions {
    /// How many items of each array are kept (the rest are checked and skipped); the array's
    /// length is always kept. [`KEPT_ARRAY_ITEMS`] by default; `usize::MAX` keeps every item.
    pub keep_array_items: usize,
}

impl Default for ParseOptions {
    fn default() -> Self {
        ParseOptions {
            keep_array_items: KEPT_ARRAY_ITEMS,
        }
    }
}

impl ParseOptions {
    /// Options that keep every item of every array (`tokenizer.ggml.tokens`, `merges`, …).
    pub fn whole_arrays() -> Self {
        ParseOptions {
            keep_array_items: usize::MAX,
        }
    }
}

/// The type tags of GGUF metadata values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GgufType {
    /// 0
    U8,
    /// 1
    I8,
    /// 2
    U16,
    /// 3
    I16,
    /// 4
    U32,
    /// 5
    I32,
    /// 6
    F32,
    /// 7
    Bool,
    /// 8
    String,
    /// 9
    Array,
    /// 10
    U64,
    /// 11
    I64,
    /// 12
    F64,
}

impl GgufType {
    /// Maps a type tag.
    pub fn from_tag(tag: u32) -> Option<GgufType> {
        use GgufType::*;
        Some(match tag {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The tag written in the file.
    pub fn tag(self) -> u32 {
        self as u32
    }

    /// The fewest bytes one value of this type occupies.
    fn min_size(self) -> u64 {
        use GgufType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }
}

/// One metadata value.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum GgufValue {
    /// u8
    U8(u8),
    /// i8
    I8(i8),
    /// u16
    U16(u16),
    /// i16
    I16(i16),
    /// u32
    U32(u32),
    /// i32
    I32(i32),
    /// f32
    F32(f32),
    /// bool
    Bool(bool),
    /// string (invalid UTF-8 in values is replaced; keys must be valid)
    String(String),
    /// array
    Array(GgufArray),
    /// u64
    U64(u64),
    /// i64
    I64(i64),
    /// f64
    F64(f64),
}

/// An array value: its element type, its full length, and its first items.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GgufArray {
    /// The element type.
    pub elem_type: GgufType,
    /// The number of elements in the file.
    pub len: u64,
    /// The first [`ParseOptions::keep_array_items`] elements ([`KEPT_ARRAY_ITEMS`] by default).
    pub items: Vec<GgufValue>,
}

impl GgufArray {
    /// True when every element was kept (`items.len() == len`).
    pub fn is_complete(&self) -> bool {
        self.items.len() as u64 == self.len
    }
}

impl GgufValue {
    /// The value as an unsigned integer, when it is a non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U8(v) => Some(v.into()),
            GgufValue::U16(v) => Some(v.into()),
            GgufValue::U32(v) => Some(v.into()),
            GgufValue::U64(v) => Some(v),
            GgufValue::I8(v) => u64::try_from(v).ok(),
            GgufValue::I16(v) => u64::try_from(v).ok(),
            GgufValue::I32(v) => u64::try_from(v).ok(),
            GgufValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// The value as an array.
    pub fn as_array(&self) -> Option<&GgufArray> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The value as a bool.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(b) => Some(b),
            _ => None,
        }
    }
}

/// One entry of the tensor-info table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GgufTensorInfo {
    /// The tensor name, e.g. `blk.64.nextn.eh_proj.weight`.
    pub name: String,
    /// Its dimensions.
    pub dims: Vec<u64>,
    /// The ggml type tag.
    pub ggml_type: u32,
    /// Offset of its data within the data section.
    pub offset: u64,
}

impl GgufTensorInfo {
    /// The ggml type's name (`F32`, `Q4_K`, …), or `type N` for unknown tags.
    pub fn type_name(&self) -> String {
        ggml_type_name(self.ggml_type)
    }
}

/// The name of a ggml tensor type tag.
pub fn ggml_type_name(tag: u32) -> String {
    const NAMES: [&str; 42] = [
        "F32", "F16", "Q4_0", "Q4_1", "type 4", "type 5", "Q5_0", "Q5_1", "Q8_0", "Q8_1", "Q2_K",
        "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL",
        "IQ3_S", "IQ2_S", "IQ4_XS", "I8", "I16", "I32", "I64", "F64", "IQ1_M", "BF16", "type 31",
        "type 32", "type 33", "TQ1_0", "TQ2_0", "type 36", "type 37", "type 38", "MXFP4",
        "type 40", "type 41",
    ];
    NAMES
        .get(tag as usize)
        .map(|s| s.to_string())
        .unwrap_or_else(|| format!("type {tag}"))
}

/// A parsed (possibly partial) GGUF header.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct GgufHeader {
    /// Format version (2 or 3).
    pub version: u32,
    /// Whether the file is big-endian.
    pub big_endian: bool,
    /// Tensor count declared in the header.
    pub tensor_count: u64,
    /// Metadata entry count declared in the header.
    pub metadata_count: u64,
    /// The metadata entries read, in file order.
    pub metadata: Vec<(String, GgufValue)>,
    /// The tensor infos read, in file order.
    pub tensors: Vec<GgufTensorInfo>,
    /// Bytes of the file the header occupies (through the end of the tensor-info table), or
    /// the bytes consumed so far for a partial header.
    pub header_len: u64,
}

impl GgufHeader {
    /// The value of a metadata key.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata
            .iter()
            .find_map(|(k, v)| (k == key).then_some(v))
    }

    /// `general.architecture`.
    pub fn architecture(&self) -> Option<&str> {
        self.get("general.architecture").and_then(GgufValue::as_str)
    }

    /// `<arch>.nextn_predict_layers`, the header key that declares an embedded MTP head.
    pub fn nextn_predict_layers(&self) -> Option<u64> {
        let arch = self.architecture()?;
        self.get(&format!("{arch}.nextn_predict_layers"))
            .and_then(GgufValue::as_u64)
    }

    /// `<arch>.block_count` (in llama.cpp it counts the NextN blocks too).
    pub fn block_count(&self) -> Option<u64> {
        let arch = self.architecture()?;
        self.get(&format!("{arch}.block_count"))
            .and_then(GgufValue::as_u64)
    }
}

/// What is wrong with a GGUF header.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GgufErrorKind {
    /// The first four bytes are not `GGUF`.
    #[error("wrong magic {found:02x?}: not a GGUF file")]
    BadMagic {
        /// The bytes found.
        found: Vec<u8>,
    },
    /// A version this reader does not handle.
    #[error("unsupported GGUF version {0} (this reader handles versions 2 and 3)")]
    UnsupportedVersion(u32),
    /// The header runs past the end of the file.
    #[error("{what} at byte {at} needs {needed} bytes but the file ends at {file_len}")]
    Truncated {
        /// What was being read.
        what: String,
        /// Where.
        at: u64,
        /// How many bytes it needed.
        needed: u64,
        /// The file's length.
        file_len: u64,
    },
    /// A length beyond a fixed cap.
    #[error("{what} has length {len}, above the limit of {limit}")]
    TooLong {
        /// What was being read.
        what: String,
        /// The length found.
        len: u64,
        /// The cap.
        limit: u64,
    },
    /// A count that cannot fit in the bytes that remain.
    #[error(
        "{what} declares {count} items, which cannot fit in the {remaining} bytes that remain"
    )]
    AbsurdCount {
        /// What was being read.
        what: String,
        /// The count found.
        count: u64,
        /// Bytes left in the file.
        remaining: u64,
    },
    /// Arrays nested too deep.
    #[error("metadata `{key}` nests arrays deeper than {limit}")]
    TooDeep {
        /// The key.
        key: String,
        /// The cap.
        limit: usize,
    },
    /// A key or tensor name that is not UTF-8.
    #[error("{what} is not valid UTF-8")]
    InvalidUtf8 {
        /// What was being read.
        what: String,
    },
    /// An unknown value type tag.
    #[error("metadata `{key}` has unknown value type {tag}")]
    UnknownType {
        /// The key.
        key: String,
        /// The tag.
        tag: u32,
    },
    /// A tensor with too many dimensions.
    #[error("tensor `{name}` declares {n_dims} dimensions (at most {limit})")]
    TooManyDims {
        /// The tensor.
        name: String,
        /// The count found.
        n_dims: u32,
        /// The cap.
        limit: u32,
    },
}

/// The outcome of parsing a prefix.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufParse {
    /// The whole header was inside the prefix.
    Complete(GgufHeader),
    /// The prefix ended inside the header: at least `needed` bytes are needed. `partial`
    /// holds the metadata and tensors read so far.
    NeedMore {
        /// The prefix length needed to make progress.
        needed: u64,
        /// What was read.
        partial: GgufHeader,
    },
}

enum Stop {
    More(u64),
    Bad(GgufErrorKind),
}

impl From<GgufErrorKind> for Stop {
    fn from(e: GgufErrorKind) -> Self {
        Stop::Bad(e)
    }
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    file_len: u64,
    be: bool,
    /// Items kept per array ([`ParseOptions::keep_array_items`]).
    kept: u64,
}

impl<'a> Cursor<'a> {
    fn remaining_in_file(&self) -> u64 {
        self.file_len.saturating_sub(self.pos as u64)
    }

    /// Bytes of the prefix not read yet: what is known to exist, unlike `remaining_in_file`.
    fn remaining_in_buf(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<&'a [u8], Stop> {
        let end = (self.pos as u64).saturating_add(n);
        if end > self.file_len {
            return Err(Stop::Bad(GgufErrorKind::Truncated {
                what: what(),
                at: self.pos as u64,
                needed: n,
                file_len: self.file_len,
            }));
        }
        if end > self.buf.len() as u64 {
            return Err(Stop::More(end));
        }
        // end <= buf.len() so it fits in usize.
        let end = end as usize;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N], Stop> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        if self.be {
            a.reverse();
        }
        Ok(a)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, Stop> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, Stop> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A length-prefixed byte string, capped at `limit`.
    fn bytes(&mut self, limit: u64, what: &dyn Fn() -> String) -> Result<&'a [u8], Stop> {
        let len = self.u64(what)?;
        if len > limit {
            return Err(Stop::Bad(GgufErrorKind::TooLong {
                what: what(),
                len,
                limit,
            }));
        }
        self.take(len, what)
    }

    fn strict_string(&mut self, limit: u64, what: &dyn Fn() -> String) -> Result<String, Stop> {
        let b = self.bytes(limit, what)?;
        std::str::from_utf8(b)
            .map(str::to_owned)
            .map_err(|_| Stop::Bad(GgufErrorKind::InvalidUtf8 { what: what() }))
    }

    fn check_count(
        &self,
        count: u64,
        min_size: u64,
        limit: u64,
        what: &dyn Fn() -> String,
    ) -> Result<(), Stop> {
        let remaining = self.remaining_in_file();
        if count > limit || count.saturating_mul(min_size) > remaining {
            return Err(Stop::Bad(GgufErrorKind::AbsurdCount {
                what: what(),
                count,
                remaining,
            }));
        }
        Ok(())
    }

    /// Reads one value; when `keep` is false the value is checked and skipped without
    /// allocating (the tail of a long array).
    fn value(
        &mut self,
        ty: GgufType,
        key: &str,
        depth: usize,
        keep: bool,
    ) -> Result<Option<GgufValue>, Stop> {
        let what = || format!("metadata `{key}`");
        if !keep && !matches!(ty, GgufType::String | GgufType::Array) {
            self.take(ty.min_size(), &what)?;
            return Ok(None);
        }
        Ok(Some(match ty {
            GgufType::U8 => GgufValue::U8(u8::from_le_bytes(self.array(&what)?)),
            GgufType::I8 => GgufValue::I8(i8::from_le_bytes(self.array(&what)?)),
            GgufType::U16 => GgufValue::U16(u16::from_le_bytes(self.array(&what)?)),
            GgufType::I16 => GgufValue::I16(i16::from_le_bytes(self.array(&what)?)),
            GgufType::U32 => GgufValue::U32(u32::from_le_bytes(self.array(&what)?)),
            GgufType::I32 => GgufValue::I32(i32::from_le_bytes(self.array(&what)?)),
            GgufType::F32 => GgufValue::F32(f32::from_le_bytes(self.array(&what)?)),
            GgufType::Bool => GgufValue::Bool(self.array::<1>(&what)?[0] != 0),
            GgufType::U64 => GgufValue::U64(u64::from_le_bytes(self.array(&what)?)),
            GgufType::I64 => GgufValue::I64(i64::from_le_bytes(self.array(&what)?)),
            GgufType::F64 => GgufValue::F64(f64::from_le_bytes(self.array(&what)?)),
            GgufType::String => {
                let b = self.bytes(MAX_STRING_LEN, &what)?;
                if !keep {
                    return Ok(None);
                }
                GgufValue::String(String::from_utf8_lossy(b).into_owned())
            }
            GgufType::Array => {
                if depth >= MAX_DEPTH {
                    return Err(Stop::Bad(GgufErrorKind::TooDeep {
                        key: key.to_string(),
                        limit: MAX_DEPTH,
                    }));
                }
                let tag = self.u32(&what)?;
                let elem_type =
                    GgufType::from_tag(tag).ok_or_else(|| GgufErrorKind::UnknownType {
                        key: key.to_string(),
                        tag,
                    })?;
                let len = self.u64(&what)?;
                let arr_what = || format!("array `{key}`");
                self.check_count(len, elem_type.min_size(), u64::MAX, &arr_what)?;
                let kept = if keep { self.kept } else { 0 };
                // Reserve only for items whose bytes are in the prefix: `len` is checked
                // against the file's length, which a caller may state far beyond the prefix.
                let present = self.remaining_in_buf() / elem_type.min_size();
                let mut items = Vec::with_capacity(len.min(kept).min(present) as usize);
                let fixed = !matches!(elem_type, GgufType::String | GgufType::Array);
                let mut i = 0u64;
                while i < len {
                    if fixed && i >= kept {
                        // Skip the rest of a fixed-size array in one step.
                        self.take((len - i) * elem_type.min_size(), &arr_what)?;
                        break;
                    }
                    if let Some(v) = self.value(elem_type, key, depth + 1, i < kept)? {
                        items.push(v);
                    }
                    i += 1;
                }
                if !keep {
                    return Ok(None);
                }
                GgufValue::Array(GgufArray {
                    elem_type,
                    len,
                    items,
                })
            }
        }))
    }
}

/// Parses a GGUF header from `prefix`, the first bytes of a file of `file_len` bytes, keeping
/// the first [`KEPT_ARRAY_ITEMS`] items of each array.
///
/// Returns [`GgufParse::NeedMore`] when the prefix is shorter than the header, and an error
/// when the header is malformed or runs past `file_len`.
pub fn parse_gguf(prefix: &[u8], file_len: u64) -> Result<GgufParse, GgufErrorKind> {
    parse_gguf_with(prefix, file_len, &ParseOptions::default())
}

/// [`parse_gguf`] with options: how many items of each array to keep.
///
/// The checks are the same whatever is kept. Memory for kept items grows only as their bytes
/// are read from `prefix` (a value takes a few dozen bytes, so keeping every item of a `u8`
/// array costs up to ~50 times the array's bytes in the prefix).
///
/// ```
/// use mtp_detect::gguf::{parse_gguf_with, GgufParse, GgufValue, ParseOptions};
/// // magic, version 3, 0 tensors, 1 metadata entry: `k` = [u8; 100]
/// let mut b = b"GGUF".to_vec();
/// b.extend(3u32.to_le_bytes());
/// b.extend(0u64.to_le_bytes());
/// b.extend(1u64.to_le_bytes());
/// b.extend(1u64.to_le_bytes());
/// b.extend(b"k");
/// b.extend(9u32.to_le_bytes()); // array
/// b.extend(0u32.to_le_bytes()); // of u8
/// b.extend(100u64.to_le_bytes());
/// b.extend([7u8; 100]);
/// let GgufParse::Complete(h) = parse_gguf_with(&b, b.len() as u64, &ParseOptions::whole_arrays())
///     .unwrap() else { panic!() };
/// let a = h.get("k").and_then(GgufValue::as_array).unwrap();
/// assert!(a.is_complete());
/// assert_eq!(a.items.len(), 100);
/// ```
pub fn parse_gguf_with(
    prefix: &[u8],
    file_len: u64,
    opts: &ParseOptions,
) -> Result<GgufParse, GgufErrorKind> {
    let file_len = file_len.max(prefix.len() as u64);
    let mut h = GgufHeader::default();
    let mut c = Cursor {
        buf: prefix,
        pos: 0,
        file_len,
        be: false,
        kept: u64::try_from(opts.keep_array_items).unwrap_or(u64::MAX),
    };
    match parse_into(&mut c, &mut h) {
        Ok(()) => {
            h.header_len = c.pos as u64;
            Ok(GgufParse::Complete(h))
        }
        Err(Stop::More(needed)) => {
            h.header_len = c.pos as u64;
            Ok(GgufParse::NeedMore { needed, partial: h })
        }
        Err(Stop::Bad(e)) => Err(e),
    }
}

fn parse_into(c: &mut Cursor<'_>, h: &mut GgufHeader) -> Result<(), Stop> {
    let magic = c.take(4, &|| "magic".to_string())?;
    if magic != b"GGUF" {
        return Err(Stop::Bad(GgufErrorKind::BadMagic {
            found: magic.to_vec(),
        }));
    }
    let vb: [u8; 4] = c.array(&|| "version".to_string())?;
    let le = u32::from_le_bytes(vb);
    let be = u32::from_be_bytes(vb);
    if le == 2 || le == 3 {
        h.version = le;
    } else if be == 2 || be == 3 {
        h.version = be;
        h.big_endian = true;
        c.be = true;
    } else {
        return Err(Stop::Bad(GgufErrorKind::UnsupportedVersion(le)));
    }
    h.tensor_count = c.u64(&|| "tensor count".to_string())?;
    h.metadata_count = c.u64(&|| "metadata count".to_string())?;
    // Smallest entry: 8-byte key length, 4-byte type, 1-byte value.
    c.check_count(h.metadata_count, 13, MAX_KV_COUNT, &|| {
        "metadata table".to_string()
    })?;
    for i in 0..h.metadata_count {
        let key = c.strict_string(MAX_KEY_LEN, &|| format!("metadata key #{i}"))?;
        let tag = c.u32(&|| format!("metadata `{key}` type"))?;
        let ty = GgufType::from_tag(tag).ok_or_else(|| GgufErrorKind::UnknownType {
            key: key.clone(),
            tag,
        })?;
        if let Some(v) = c.value(ty, &key, 0, true)? {
            h.metadata.push((key, v));
        }
    }
    // Smallest tensor info: 8-byte name length, 4-byte n_dims, 4-byte type, 8-byte offset.
    c.check_count(h.tensor_count, 24, MAX_TENSOR_COUNT, &|| {
        "tensor table".to_string()
    })?;
    for i in 0..h.tensor_count {
        let name = c.strict_string(MAX_KEY_LEN, &|| format!("tensor name #{i}"))?;
        let what = || format!("tensor `{name}`");
        let n_dims = c.u32(&what)?;
        if n_dims > MAX_DIMS {
            return Err(Stop::Bad(GgufErrorKind::TooManyDims {
                name,
                n_dims,
                limit: MAX_DIMS,
            }));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(c.u64(&what)?);
        }
        let ggml_type = c.u32(&what)?;
        let offset = c.u64(&what)?;
        h.tensors.push(GgufTensorInfo {
            name,
            dims,
            ggml_type,
            offset,
        });
    }
    Ok(())
}

/// File names of GGUF artifacts: llama.cpp's split naming and which file is the model.
/// `(stem, index, count)` of a split GGUF name `…-00001-of-00003.gguf`.
pub fn split_parts(name: &str) -> Option<(&str, u32, u32)> {
    let base = name.strip_suffix(".gguf")?;
    let (rest, count) = base.rsplit_once("-of-")?;
    let (stem, idx) = rest.rsplit_once('-')?;
    if idx.len() != 5 || count.len() != 5 {
        return None;
    }
    Some((stem, idx.parse().ok()?, count.parse().ok()?))
}

/// Whether `name` (a file name or repo-relative path) is a GGUF one loads as a model: a
/// `.gguf` that is not a vision projector (`mmproj*`) and, of a split model, the first shard
/// (llama.cpp finds the others from it).
pub fn is_gguf_model_file(name: &str) -> bool {
    let l = name.to_ascii_lowercase();
    l.ends_with(".gguf")
        && !l.rsplit('/').next().unwrap_or(&l).starts_with("mmproj")
        && split_parts(name).is_none_or(|(_, i, _)| i == 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GGUF v3 file with no tensors and the given metadata entries: key, type tag, value bytes.
    fn file(kvs: &[(&str, u32, Vec<u8>)]) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        b.extend((kvs.len() as u64).to_le_bytes());
        for (k, tag, value) in kvs {
            b.extend((k.len() as u64).to_le_bytes());
            b.extend(k.as_bytes());
            b.extend(tag.to_le_bytes());
            b.extend(value);
        }
        b
    }

    fn string_array(n: usize) -> Vec<u8> {
        let mut b = 8u32.to_le_bytes().to_vec();
        b.extend((n as u64).to_le_bytes());
        for i in 0..n {
            let s = format!("tok{i}");
            b.extend((s.len() as u64).to_le_bytes());
            b.extend(s.as_bytes());
        }
        b
    }

    fn i32_array(n: usize) -> Vec<u8> {
        let mut b = 5u32.to_le_bytes().to_vec();
        b.extend((n as u64).to_le_bytes());
        for i in 0..n {
            b.extend((i as i32).to_le_bytes());
        }
        b
    }

    fn array<'h>(h: &'h GgufHeader, key: &str) -> &'h GgufArray {
        h.get(key).and_then(GgufValue::as_array).expect(key)
    }

    fn complete(b: &[u8], opts: &ParseOptions) -> GgufHeader {
        match parse_gguf_with(b, b.len() as u64, opts) {
            Ok(GgufParse::Complete(h)) => h,
            other => panic!("expected a complete header, got {other:?}"),
        }
    }

    #[test]
    fn whole_arrays_keep_every_item_and_the_default_keeps_the_first() {
        let b = file(&[
            ("tokens", 9, string_array(1000)),
            ("types", 9, i32_array(1000)),
            ("after", 4, 7u32.to_le_bytes().to_vec()),
        ]);
        let h = complete(&b, &ParseOptions::whole_arrays());
        let (tokens, types) = (array(&h, "tokens"), array(&h, "types"));
        assert!(tokens.is_complete() && types.is_complete());
        assert_eq!(tokens.items[999], GgufValue::String("tok999".into()));
        assert_eq!(types.items[999], GgufValue::I32(999));
        assert_eq!(h.get("after"), Some(&GgufValue::U32(7)));
        // The default (and `parse_gguf`) keep the first items, with the full length.
        let short = complete(&b, &ParseOptions::default());
        assert_eq!(
            parse_gguf(&b, b.len() as u64),
            Ok(GgufParse::Complete(short.clone()))
        );
        let tokens = array(&short, "tokens");
        assert_eq!((tokens.len, tokens.items.len()), (1000, KEPT_ARRAY_ITEMS));
        assert!(!tokens.is_complete());
        assert_eq!(short.get("after"), Some(&GgufValue::U32(7)));
        assert_eq!(short.header_len, h.header_len);
    }

    #[test]
    fn a_declared_length_beyond_the_prefix_reserves_nothing_for_it() {
        // 2^40 u8 items declared, in a file said to be big enough: keeping whole arrays must
        // not reserve for them before their bytes are read (that would abort the process).
        let len = 1u64 << 40;
        let mut value = 0u32.to_le_bytes().to_vec(); // u8 items
        value.extend(len.to_le_bytes());
        value.extend([1u8; 16]);
        let b = file(&[("huge", 9, value)]);
        let opts = ParseOptions::whole_arrays();
        match parse_gguf_with(&b, 2 * len, &opts) {
            Ok(GgufParse::NeedMore { needed, .. }) => assert_eq!(needed, b.len() as u64 + 1),
            other => panic!("expected NeedMore, got {other:?}"),
        }
        // Said as it is (the file ends there), it is an absurd count.
        assert!(matches!(
            parse_gguf_with(&b, b.len() as u64, &opts),
            Err(GgufErrorKind::AbsurdCount { count, .. }) if count == len
        ));
    }
}
