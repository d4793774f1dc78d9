//! Python's own spellings of values, which chat templates were written against: `str()` of a
//! value as jinja2 prints it (`None`, `True`, `{'a': 1}`), `repr()` of strings and floats, and
//! `json.dumps` as Hugging Face's `tojson` filter calls it.
//!
//! Hand-written because nothing in minijinja spells values the Python way, and a chat template's
//! output must match transformers' byte for byte (the model was trained on those bytes).

use std::fmt::Write;

use minijinja::value::{Value, ValueKind};
use minijinja::{Error, ErrorKind};

/// Deepest nesting printed or serialized; deeper values are an error, not a stack overflow.
const MAX_DEPTH: usize = 128;

fn too_deep() -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!("value nested deeper than {MAX_DEPTH} levels"),
    )
}

/// Python `repr(float)`: the shortest digits that round-trip, positional for exponents in
/// `-4..16`, else scientific with at least two exponent digits (`1e-05`, `1.5e+16`).
pub fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if f == 0.0 {
        return if f.is_sign_negative() {
            "-0.0".into()
        } else {
            "0.0".into()
        };
    }
    // Rust's `{:e}` prints the shortest round-trip digits: "1.2345e3", "-5e-7".
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if (-4..16).contains(&exp) {
        let point = exp + 1; // digits before the decimal point
        let mut s = String::from(sign);
        if point <= 0 {
            s.push_str("0.");
            for _ in 0..(-point) {
                s.push('0');
            }
            s.push_str(&digits);
        } else {
            let point = point as usize;
            if digits.len() <= point {
                s.push_str(&digits);
                for _ in digits.len()..point {
                    s.push('0');
                }
                s.push_str(".0");
            } else {
                s.push_str(&digits[..point]);
                s.push('.');
                s.push_str(&digits[point..]);
            }
        }
        s
    } else {
        let mut s = String::from(sign);
        s.push_str(&digits[..1]);
        if digits.len() > 1 {
            s.push('.');
            s.push_str(&digits[1..]);
        }
        let _ = write!(s, "e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
        s
    }
}

/// Characters Python's `str.isprintable()` rejects besides ASCII controls: separators other
/// than the ASCII space, format characters, and unassigned/private/surrogate code points that
/// Rust strings can hold (private use and noncharacters).
fn py_unprintable(c: char) -> bool {
    let u = c as u32;
    c.is_control()
        || matches!(
            u,
            0xA0 | 0xAD
                | 0x1680
                | 0x2000..=0x200F
                | 0x2028..=0x202F
                | 0x205F..=0x2064
                | 0x2066..=0x206F
                | 0x3000
                | 0xFEFF
                | 0xFFF9..=0xFFFB
                | 0xE000..=0xF8FF
                | 0xF0000..=0x10FFFF
        )
}

/// Python `repr(str)`.
pub fn str_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if py_unprintable(c) => {
                let u = c as u32;
                let _ = if u < 0x100 {
                    write!(out, "\\x{u:02x}")
                } else if u < 0x10000 {
                    write!(out, "\\u{u:04x}")
                } else {
                    write!(out, "\\U{u:08x}")
                };
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// Python `str()` of a template value, as jinja2 prints `{{ value }}`: strings as they are,
/// `None`/`True`/`False`, floats by `repr`, containers by `repr` of their items.
pub fn py_str(v: &Value) -> Result<String, Error> {
    match v.kind() {
        ValueKind::String => Ok(v.as_str().unwrap_or_default().to_string()),
        _ => {
            let mut out = String::new();
            py_repr_into(&mut out, v, 0)?;
            Ok(out)
        }
    }
}

fn py_repr_into(out: &mut String, v: &Value, depth: usize) -> Result<(), Error> {
    if depth > MAX_DEPTH {
        return Err(too_deep());
    }
    match v.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if v.is_true() { "True" } else { "False" }),
        ValueKind::Number => out.push_str(&number_str(v)),
        ValueKind::String => out.push_str(&str_repr(v.as_str().unwrap_or_default())),
        ValueKind::Seq | ValueKind::Iterable => {
            out.push('[');
            for (i, item) in v.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                py_repr_into(out, &item, depth + 1)?;
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            for (i, key) in v.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                py_repr_into(out, &key, depth + 1)?;
                out.push_str(": ");
                py_repr_into(out, &v.get_item(&key)?, depth + 1)?;
            }
            out.push('}');
        }
        // functions, macros, bytes, other objects: minijinja's own spelling
        _ => {
            let _ = write!(out, "{v}");
        }
    }
    Ok(())
}

/// A number as Python prints it: integers in decimal, floats by `repr`.
fn number_str(v: &Value) -> String {
    if v.is_integer() {
        v.to_string()
    } else {
        f64::try_from(v.clone()).map_or_else(|_| v.to_string(), float_repr)
    }
}

/// Options of Python's `json.dumps` that Hugging Face's `tojson` exposes.
#[derive(Debug, Clone, Default)]
pub struct JsonOptions {
    /// Escape non-ASCII characters as `\uXXXX`.
    pub ensure_ascii: bool,
    /// Pretty-print with this indent (a count of spaces or a string).
    pub indent: Option<String>,
    /// `(item_separator, key_separator)`.
    pub separators: Option<(String, String)>,
    /// Sort object keys.
    pub sort_keys: bool,
}

/// Python `json.dumps(value, **options)`.
pub fn json_dumps(v: &Value, opts: &JsonOptions) -> Result<String, Error> {
    let (item_sep, key_sep) = match &opts.separators {
        Some((i, k)) => (i.as_str(), k.as_str()),
        None if opts.indent.is_some() => (",", ": "),
        None => (", ", ": "),
    };
    let mut out = String::new();
    let w = JsonWriter {
        opts,
        item_sep,
        key_sep,
    };
    w.value(&mut out, v, 0)?;
    Ok(out)
}

struct JsonWriter<'a> {
    opts: &'a JsonOptions,
    item_sep: &'a str,
    key_sep: &'a str,
}

impl JsonWriter<'_> {
    fn newline(&self, out: &mut String, level: usize) {
        if let Some(ind) = &self.opts.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(ind);
            }
        }
    }

    fn string(&self, out: &mut String, s: &str) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 => {
                    let _ = write!(out, "\\u{:04x}", c as u32);
                }
                c if self.opts.ensure_ascii && !c.is_ascii() => {
                    let mut buf = [0u16; 2];
                    for unit in c.encode_utf16(&mut buf) {
                        let _ = write!(out, "\\u{unit:04x}");
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }

    /// A key as `json.dumps` coerces it: strings as they are, numbers, booleans and `None`
    /// spelled as JSON would; anything else is Python's `TypeError`.
    fn key(&self, out: &mut String, k: &Value) -> Result<(), Error> {
        let s = match k.kind() {
            ValueKind::String => k.as_str().unwrap_or_default().to_string(),
            ValueKind::Bool => (if k.is_true() { "true" } else { "false" }).to_string(),
            ValueKind::None => "null".to_string(),
            ValueKind::Number => number_str(k),
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("keys must be str, int, float, bool or None, not {other}"),
                ))
            }
        };
        self.string(out, &s);
        Ok(())
    }

    fn value(&self, out: &mut String, v: &Value, level: usize) -> Result<(), Error> {
        if level > MAX_DEPTH {
            return Err(too_deep());
        }
        match v.kind() {
            ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number => {
                if v.is_integer() {
                    let _ = write!(out, "{v}");
                } else {
                    let f = f64::try_from(v.clone())?;
                    out.push_str(&if f.is_nan() {
                        "NaN".into()
                    } else if f.is_infinite() {
                        if f > 0.0 { "Infinity" } else { "-Infinity" }.into()
                    } else {
                        float_repr(f)
                    });
                }
            }
            ValueKind::String => self.string(out, v.as_str().unwrap_or_default()),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = v.try_iter()?.collect();
                if items.is_empty() {
                    out.push_str("[]");
                    return Ok(());
                }
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(self.item_sep);
                    }
                    self.newline(out, level + 1);
                    self.value(out, item, level + 1)?;
                }
                self.newline(out, level);
                out.push(']');
            }
            ValueKind::Map => {
                let mut keys: Vec<Value> = v.try_iter()?.collect();
                if keys.is_empty() {
                    out.push_str("{}");
                    return Ok(());
                }
                if self.opts.sort_keys {
                    keys.sort_by_cached_key(|k| k.to_string());
                }
                out.push('{');
                for (i, k) in keys.iter().enumerate() {
                    if i > 0 {
                        out.push_str(self.item_sep);
                    }
                    self.newline(out, level + 1);
                    self.key(out, k)?;
                    out.push_str(self.key_sep);
                    self.value(out, &v.get_item(k)?, level + 1)?;
                }
                self.newline(out, level);
                out.push('}');
            }
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("Object of type {other} is not JSON serializable"),
                ))
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_as_python_repr() {
        for (f, want) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (1234.5, "1234.5"),
            (-2.5e-7, "-2.5e-07"),
            (123456789012345.0, "123456789012345.0"),
            (1.5e300, "1.5e+300"),
        ] {
            assert_eq!(float_repr(f), want, "{f}");
        }
    }

    #[test]
    fn strings_as_python_repr() {
        assert_eq!(str_repr("a"), "'a'");
        assert_eq!(str_repr("it's"), "\"it's\"");
        assert_eq!(str_repr("it's \"x\""), "'it\\'s \"x\"'");
        assert_eq!(str_repr("a\nb\\"), "'a\\nb\\\\'");
        assert_eq!(str_repr("é\u{7}"), "'é\\x07'");
    }
}
