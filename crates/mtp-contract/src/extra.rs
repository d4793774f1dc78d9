//! [`ProviderOptions::extra`](crate::ProviderOptions::extra) read as typed values: the one
//! parser every lane (native, gguf, the HTTP adapters) uses, so that one string means one
//! thing whichever provider it is given to.
//!
//! One rule per kind of value:
//!
//! | kind | accepted | method |
//! | --- | --- | --- |
//! | flag | `true`/`false`, `1`/`0`, `yes`/`no`, `on`/`off`, in any ASCII case (Python writes `True`) | [`Extra::flag`] |
//! | integer | decimal digits within the key's [`IntRange`] (e.g. positive); no sign, no unit, no fraction | [`Extra::int`], [`Extra::count`], [`Extra::bytes`] |
//! | duration | a positive integer of milliseconds (keys end in `_ms`) | [`Extra::millis`] |
//! | name | one of the key's names, exactly (lowercase) | [`Extra::choice`] |
//! | path | any non-empty string, taken as given | [`Extra::path`] |
//!
//! Flags, integers and names ignore surrounding whitespace; paths keep it. Two options that
//! every in-process lane shares have one meaning everywhere: `ctx_size` is an integer of at
//! least [`MIN_CTX_SIZE`] ([`IntRange::CTX_SIZE`]) and `threads` a positive integer
//! ([`IntRange::THREADS`]); left out, each lane uses its default, and nothing else stands for
//! the default (no `0`, no negative number, no small context silently replaced).
//!
//! Each lane declares its keys once and opens the map with [`Extra::new`], which refuses any
//! other key; every refusal is an [`OptionError`] naming the key and the value.
//!
//! ```
//! use mtp_contract::{Extra, IntRange, OptionError, ProviderOptions};
//! let opts = ProviderOptions::default()
//!     .extra("threads", "4")
//!     .extra("parse_special", "yes")
//!     .extra("ctx_size", "8");
//! let x = Extra::new("native", &["threads", "parse_special", "ctx_size"], &opts.extra).unwrap();
//! assert_eq!(x.threads("threads").unwrap(), Some(4));
//! assert_eq!(x.flag("parse_special").unwrap(), Some(true));
//! let e = x.ctx_size("ctx_size").unwrap_err();
//! assert_eq!(e.key(), "ctx_size");
//! assert_eq!(
//!     e.to_string(),
//!     "`ctx_size` must be an integer of at least 16 (at most 4294967295), got `8`"
//! );
//! // a key the lane does not declare
//! let e = Extra::new("gguf", &["threads"], &opts.extra).unwrap_err();
//! assert!(matches!(e, OptionError::Unknown { .. }));
//! ```

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// The smallest context an in-process lane takes (`ctx_size`, gguf's `n_ctx`, `mtp
/// --ctx-size`): below it not even a chat template's markup fits, so a smaller value is a
/// mistake, refused rather than replaced.
pub const MIN_CTX_SIZE: u32 = 16;

/// The spellings of a flag, as the errors list them.
pub const FLAG_SPELLINGS: &str = "true or false (also 1/0, yes/no, on/off)";

/// Why an option of [`ProviderOptions::extra`](crate::ProviderOptions::extra) was refused.
/// Every variant names the key at fault (and the value, where one was given).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionError {
    /// The lane does not read this key.
    #[error("unknown option `{key}` for the {lane} provider; known: {}", known.join(", "))]
    Unknown {
        /// The provider (lane) that was given it.
        lane: String,
        /// The key.
        key: String,
        /// The keys the lane reads.
        known: Vec<String>,
    },
    /// The value is not of the key's kind, or outside its range.
    #[error("`{key}` must be {expected}, got `{value}`")]
    Invalid {
        /// The key.
        key: String,
        /// The value as given.
        value: String,
        /// What the key takes, in words (`a positive integer`, `one of auto, on, off`).
        expected: String,
    },
    /// The value is well formed but this lane cannot honour it.
    #[error("`{key}` = `{value}` cannot be used: {why}")]
    Unusable {
        /// The key.
        key: String,
        /// The value as given.
        value: String,
        /// Why, and what to do instead.
        why: String,
    },
    /// Options that contradict each other, or one that needs another.
    #[error("`{key}` {message}")]
    Conflict {
        /// The key reported at fault (the message names the other).
        key: String,
        /// What contradicts what, and what to give instead.
        message: String,
    },
    /// A string option given beside the provider's typed options, which would ignore it.
    #[error(
        "`{key}` is given as a string option beside typed {typed}, which would ignore it; \
         set it in {typed}"
    )]
    BesideTyped {
        /// The key.
        key: String,
        /// The typed options' type (`NativeOptions`, `GgufOptions`, `HttpOptions`).
        typed: String,
    },
}

impl OptionError {
    /// The key at fault.
    pub fn key(&self) -> &str {
        match self {
            OptionError::Unknown { key, .. }
            | OptionError::Invalid { key, .. }
            | OptionError::Unusable { key, .. }
            | OptionError::Conflict { key, .. }
            | OptionError::BesideTyped { key, .. } => key,
        }
    }

    /// An [`OptionError::Invalid`].
    pub fn invalid(key: &str, value: impl Into<String>, expected: impl Into<String>) -> Self {
        OptionError::Invalid {
            key: key.to_string(),
            value: value.into(),
            expected: expected.into(),
        }
    }

    /// An [`OptionError::Unusable`].
    pub fn unusable(key: &str, value: impl Into<String>, why: impl Into<String>) -> Self {
        OptionError::Unusable {
            key: key.to_string(),
            value: value.into(),
            why: why.into(),
        }
    }

    /// An [`OptionError::Conflict`].
    pub fn conflict(key: &str, message: impl Into<String>) -> Self {
        OptionError::Conflict {
            key: key.to_string(),
            message: message.into(),
        }
    }
}

/// The range an integer option must fall in (both ends included). The same range checks a
/// value given as a string ([`Extra::int`]) and one given typed ([`IntRange::check`]), so the
/// command line's typed options and `extra` strings are held to one rule.
///
/// ```
/// use mtp_contract::IntRange;
/// assert_eq!(IntRange::POSITIVE.phrase(), "a positive integer");
/// assert_eq!(IntRange::new(0, 10).phrase(), "an integer from 0 to 10");
/// assert!(IntRange::THREADS.check("threads", 0).is_err());
/// assert_eq!(IntRange::CTX_SIZE.check("ctx_size", 16), Ok(16));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IntRange {
    /// The smallest value taken.
    pub min: u64,
    /// The largest value taken.
    pub max: u64,
}

impl IntRange {
    /// Any non-negative integer (e.g. a byte budget where 0 means "keep nothing").
    pub const ANY: IntRange = IntRange::new(0, u64::MAX);
    /// 1 and up: a count, a size, a limit where 0 would mean nothing useful.
    pub const POSITIVE: IntRange = IntRange::new(1, u64::MAX);
    /// `ctx_size` (gguf's `n_ctx`): from [`MIN_CTX_SIZE`] tokens to what llama.cpp's `u32`
    /// context holds.
    pub const CTX_SIZE: IntRange = IntRange::new(MIN_CTX_SIZE as u64, u32::MAX as u64);
    /// `threads`: positive, and at most what llama.cpp's `i32` thread count holds. To run on
    /// every core, leave it out.
    pub const THREADS: IntRange = IntRange::new(1, i32::MAX as u64);

    /// A range from `min` to `max`, both included.
    pub const fn new(min: u64, max: u64) -> Self {
        IntRange { min, max }
    }

    /// The range in words, for error messages.
    pub fn phrase(&self) -> String {
        match (self.min, self.max) {
            (0, u64::MAX) => "a non-negative integer".into(),
            (1, u64::MAX) => "a positive integer".into(),
            (min, u64::MAX) => format!("an integer of at least {min}"),
            // the largest u32 / i32 are the runtimes' representation limits, not advice
            (min, max) if max == u32::MAX as u64 || max == i32::MAX as u64 => {
                let base = IntRange::new(min, u64::MAX).phrase();
                format!("{base} (at most {max})")
            }
            (min, max) => format!("an integer from {min} to {max}"),
        }
    }

    /// `n` when it is in the range, else an [`OptionError::Invalid`] naming `key`: the check of
    /// a typed option.
    pub fn check(&self, key: &str, n: u64) -> Result<u64, OptionError> {
        if (self.min..=self.max).contains(&n) {
            Ok(n)
        } else {
            Err(OptionError::invalid(key, n.to_string(), self.phrase()))
        }
    }
}

/// Reads a flag: `true`, `1`, `yes`, `on` or `false`, `0`, `no`, `off`, in any ASCII case,
/// surrounding whitespace ignored. `None` for anything else.
///
/// ```
/// assert_eq!(mtp_contract::parse_flag(" True "), Some(true));
/// assert_eq!(mtp_contract::parse_flag("OFF"), Some(false));
/// assert_eq!(mtp_contract::parse_flag("maybe"), None);
/// ```
pub fn parse_flag(value: &str) -> Option<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Some(true),
        "false" | "0" | "no" | "off" => Some(false),
        _ => None,
    }
}

/// A lane's view of [`ProviderOptions::extra`](crate::ProviderOptions::extra): the keys were
/// checked against the lane's list when it was made, and each accessor reads one key by the
/// rule of its kind (the rules of the `extra` module's documentation). A key that is absent reads as
/// `None`: the lane's default applies.
#[derive(Debug, Clone, Copy)]
pub struct Extra<'a> {
    map: &'a BTreeMap<String, String>,
}

impl<'a> Extra<'a> {
    /// Opens `map` for the lane named `lane` (the provider name, for messages), which reads
    /// the keys in `known`; any other key is an [`OptionError::Unknown`] listing them.
    pub fn new(
        lane: &str,
        known: &[&str],
        map: &'a BTreeMap<String, String>,
    ) -> Result<Self, OptionError> {
        if let Some(k) = map.keys().find(|k| !known.contains(&k.as_str())) {
            return Err(OptionError::Unknown {
                lane: lane.to_string(),
                key: k.clone(),
                known: known.iter().map(|k| k.to_string()).collect(),
            });
        }
        Ok(Extra { map })
    }

    /// The value as given, or `None`.
    pub fn value(&self, key: &str) -> Option<&'a str> {
        self.map.get(key).map(String::as_str)
    }

    /// Whether the key is given.
    pub fn has(&self, key: &str) -> bool {
        self.map.contains_key(key)
    }

    /// A flag ([`parse_flag`]'s spellings).
    pub fn flag(&self, key: &str) -> Result<Option<bool>, OptionError> {
        self.value(key)
            .map(|v| parse_flag(v).ok_or_else(|| OptionError::invalid(key, v, FLAG_SPELLINGS)))
            .transpose()
    }

    /// A flag that may also be `auto`: `Some(None)` for `auto`, `Some(Some(b))` for a flag.
    pub fn auto_flag(&self, key: &str) -> Result<Option<Option<bool>>, OptionError> {
        self.value(key)
            .map(|v| {
                if v.trim() == "auto" {
                    return Ok(None);
                }
                parse_flag(v).map(Some).ok_or_else(|| {
                    OptionError::invalid(key, v, format!("auto or {FLAG_SPELLINGS}"))
                })
            })
            .transpose()
    }

    /// An integer in `range`.
    pub fn int(&self, key: &str, range: IntRange) -> Result<Option<u64>, OptionError> {
        self.int_as(key, range, range.phrase())
    }

    fn int_as(
        &self,
        key: &str,
        range: IntRange,
        expected: String,
    ) -> Result<Option<u64>, OptionError> {
        self.value(key)
            .map(|v| {
                let t = v.trim();
                // digits only: Rust's parser would also take a leading `+`
                match t.parse::<u64>() {
                    Ok(n)
                        if t.bytes().all(|b| b.is_ascii_digit()) && range.check(key, n).is_ok() =>
                    {
                        Ok(n)
                    }
                    _ => Err(OptionError::invalid(key, v, expected.clone())),
                }
            })
            .transpose()
    }

    /// A positive integer.
    pub fn count(&self, key: &str) -> Result<Option<u64>, OptionError> {
        self.int(key, IntRange::POSITIVE)
    }

    /// A number of bytes in `range` (an integer: no `KiB`/`MB` suffix).
    pub fn bytes(&self, key: &str, range: IntRange) -> Result<Option<u64>, OptionError> {
        self.int_as(key, range, format!("{} of bytes", range.phrase()))
    }

    /// A duration: a positive integer of milliseconds.
    pub fn millis(&self, key: &str) -> Result<Option<Duration>, OptionError> {
        Ok(self
            .int_as(
                key,
                IntRange::POSITIVE,
                "a positive integer of milliseconds".into(),
            )?
            .map(Duration::from_millis))
    }

    /// `ctx_size` (or a lane's name for it): [`IntRange::CTX_SIZE`].
    pub fn ctx_size(&self, key: &str) -> Result<Option<u32>, OptionError> {
        Ok(self
            .int(key, IntRange::CTX_SIZE)?
            .map(|n| u32::try_from(n).unwrap_or(u32::MAX)))
    }

    /// `threads`: [`IntRange::THREADS`].
    pub fn threads(&self, key: &str) -> Result<Option<u32>, OptionError> {
        Ok(self
            .int(key, IntRange::THREADS)?
            .map(|n| u32::try_from(n).unwrap_or(u32::MAX)))
    }

    /// One of `names` (exactly as listed, surrounding whitespace ignored).
    pub fn choice<T: Copy>(
        &self,
        key: &str,
        names: &[(&str, T)],
    ) -> Result<Option<T>, OptionError> {
        self.value(key)
            .map(|v| {
                names
                    .iter()
                    .find(|(n, _)| *n == v.trim())
                    .map(|(_, t)| *t)
                    .ok_or_else(|| {
                        let list: Vec<&str> = names.iter().map(|(n, _)| *n).collect();
                        OptionError::invalid(key, v, format!("one of {}", list.join(", ")))
                    })
            })
            .transpose()
    }

    /// A path: any non-empty string, as given.
    pub fn path(&self, key: &str) -> Result<Option<PathBuf>, OptionError> {
        self.value(key)
            .map(|v| {
                if v.is_empty() {
                    Err(OptionError::invalid(key, v, "a path (it is empty)"))
                } else {
                    Ok(PathBuf::from(v))
                }
            })
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn unknown_keys_are_refused_naming_the_key_and_the_known_ones() {
        let m = map(&[("thread", "2")]);
        let e = Extra::new("gguf", &["threads", "ctx_size"], &m).unwrap_err();
        assert_eq!(e.key(), "thread");
        assert_eq!(
            e.to_string(),
            "unknown option `thread` for the gguf provider; known: threads, ctx_size"
        );
        assert!(Extra::new("gguf", &["thread"], &m).is_ok());
        assert!(Extra::new("gguf", &[], &BTreeMap::new()).is_ok());
    }

    #[test]
    fn flags_have_one_set_of_spellings() {
        let yes = [
            "true", "TRUE", "True", "1", "yes", "Yes", "on", "ON", " on ",
        ];
        let no = ["false", "False", "0", "no", "NO", "off", "Off"];
        let bad = ["", "y", "n", "2", "-1", "t", "enabled", "maybe", "truee"];
        for (vals, want) in [(&yes[..], Some(true)), (&no[..], Some(false))] {
            for v in vals {
                let m = map(&[("f", v)]);
                let x = Extra::new("l", &["f"], &m).unwrap();
                assert_eq!(x.flag("f").unwrap(), want, "{v:?}");
                assert_eq!(x.auto_flag("f").unwrap(), Some(want), "{v:?}");
            }
        }
        for v in bad {
            let m = map(&[("f", v)]);
            let x = Extra::new("l", &["f"], &m).unwrap();
            let e = x.flag("f").unwrap_err();
            assert_eq!(
                e,
                OptionError::invalid("f", v, FLAG_SPELLINGS),
                "{v:?} was accepted"
            );
            assert!(e.to_string().contains(&format!("got `{v}`")), "{e}");
        }
        let m = map(&[("metrics", "auto")]);
        let x = Extra::new("l", &["metrics", "absent"], &m).unwrap();
        assert_eq!(x.auto_flag("metrics").unwrap(), Some(None));
        assert_eq!(x.auto_flag("absent").unwrap(), None);
        assert_eq!(x.flag("absent").unwrap(), None);
        let m = map(&[("metrics", "sometimes")]);
        let e = Extra::new("l", &["metrics"], &m)
            .unwrap()
            .auto_flag("metrics")
            .unwrap_err();
        assert!(
            e.to_string().starts_with("`metrics` must be auto or true"),
            "{e}"
        );
    }

    #[test]
    fn integers_are_digits_within_the_keys_range() {
        // (value, range, accepted as)
        let cases: &[(&str, IntRange, Option<u64>)] = &[
            ("5", IntRange::POSITIVE, Some(5)),
            (" 65536 ", IntRange::POSITIVE, Some(65536)),
            ("0", IntRange::POSITIVE, None),
            ("0", IntRange::ANY, Some(0)),
            ("-1", IntRange::ANY, None),
            ("+5", IntRange::POSITIVE, None),
            ("5.0", IntRange::POSITIVE, None),
            ("1e3", IntRange::POSITIVE, None),
            ("64MiB", IntRange::POSITIVE, None),
            ("", IntRange::ANY, None),
            ("18446744073709551616", IntRange::ANY, None),
            ("10", IntRange::new(0, 10), Some(10)),
            ("11", IntRange::new(0, 10), None),
            ("16", IntRange::CTX_SIZE, Some(16)),
            ("15", IntRange::CTX_SIZE, None),
            ("4294967296", IntRange::CTX_SIZE, None),
            ("2147483647", IntRange::THREADS, Some(2147483647)),
            ("2147483648", IntRange::THREADS, None),
        ];
        for &(v, range, want) in cases {
            let m = map(&[("n", v)]);
            let x = Extra::new("l", &["n"], &m).unwrap();
            match (x.int("n", range), want) {
                (Ok(Some(got)), Some(want)) => assert_eq!(got, want, "{v:?}"),
                (Err(e), None) => {
                    assert_eq!(e, OptionError::invalid("n", v, range.phrase()), "{v:?}")
                }
                (got, want) => panic!("{v:?} in {range:?}: {got:?}, wanted {want:?}"),
            }
        }
    }

    #[test]
    fn ctx_size_and_threads_have_one_meaning() {
        for (v, ctx, threads) in [
            ("0", None, None),
            ("-4", None, None),
            ("8", None, Some(8)),
            ("16", Some(16), Some(16)),
            ("4096", Some(4096), Some(4096)),
        ] {
            let m = map(&[("ctx_size", v), ("threads", v)]);
            let x = Extra::new("l", &["ctx_size", "threads"], &m).unwrap();
            assert_eq!(x.ctx_size("ctx_size").ok().flatten(), ctx, "ctx_size={v}");
            assert_eq!(x.threads("threads").ok().flatten(), threads, "threads={v}");
        }
        let m = map(&[("ctx_size", "8"), ("threads", "0")]);
        let x = Extra::new("l", &["ctx_size", "threads"], &m).unwrap();
        assert_eq!(
            x.ctx_size("ctx_size").unwrap_err().to_string(),
            "`ctx_size` must be an integer of at least 16 (at most 4294967295), got `8`"
        );
        assert_eq!(
            x.threads("threads").unwrap_err().to_string(),
            "`threads` must be a positive integer (at most 2147483647), got `0`"
        );
        // the typed path is held to the same ranges
        assert!(IntRange::CTX_SIZE.check("ctx_size", 8).is_err());
        assert!(IntRange::THREADS.check("threads", 0).is_err());
    }

    #[test]
    fn bytes_durations_names_and_paths() {
        let m = map(&[
            ("max_body_bytes", "4096"),
            ("zero_bytes", "0"),
            ("idle_timeout_ms", "300"),
            ("bad_ms", "0"),
            ("metrics", " on "),
            ("dtype", "F32"),
            ("dir", "/tmp/a b "),
            ("empty", ""),
        ]);
        let keys: Vec<&str> = m.keys().map(String::as_str).collect();
        let x = Extra::new("l", &keys, &m).unwrap();
        assert_eq!(
            x.bytes("max_body_bytes", IntRange::POSITIVE).unwrap(),
            Some(4096)
        );
        assert_eq!(x.bytes("zero_bytes", IntRange::ANY).unwrap(), Some(0));
        assert_eq!(
            x.bytes("zero_bytes", IntRange::POSITIVE)
                .unwrap_err()
                .to_string(),
            "`zero_bytes` must be a positive integer of bytes, got `0`"
        );
        assert_eq!(
            x.millis("idle_timeout_ms").unwrap(),
            Some(Duration::from_millis(300))
        );
        assert!(x
            .millis("bad_ms")
            .unwrap_err()
            .to_string()
            .contains("milliseconds"));
        let names = [("on", 1), ("off", 0)];
        assert_eq!(x.choice("metrics", &names).unwrap(), Some(1));
        let e = x.choice("dtype", &[("f32", 0), ("bf16", 1)]).unwrap_err();
        assert_eq!(e.to_string(), "`dtype` must be one of f32, bf16, got `F32`");
        assert_eq!(x.path("dir").unwrap(), Some(PathBuf::from("/tmp/a b ")));
        assert_eq!(x.path("empty").unwrap_err().key(), "empty");
        assert_eq!(x.path("absent").unwrap(), None);
        assert_eq!(x.value("dir"), Some("/tmp/a b "));
        assert!(x.has("dir") && !x.has("absent"));
    }
}
