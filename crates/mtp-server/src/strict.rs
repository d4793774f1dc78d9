//! Request bodies read strictly: a JSON object that names one key twice is refused.
//!
//! `serde_json` keeps the last of two equal keys, and another reader (a proxy, a logging
//! layer, a policy check in front of this server) may keep the first: the same bytes would
//! then mean two different requests. RFC 8259 leaves duplicate names undefined; a server
//! refuses them so that what it runs is what every reader of the body saw.

use serde::de::{DeserializeSeed, Deserializer, Error as _, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// `bytes` as JSON, refusing an object with a repeated key (the error names it and where).
pub(crate) fn from_slice(bytes: &[u8]) -> Result<Value, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let v = Strict.deserialize(&mut de)?;
    de.end()?;
    Ok(v)
}

/// A JSON value, built as `serde_json::Value` is but checking object keys.
struct Strict;

impl<'de> DeserializeSeed<'de> for Strict {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(StrictVisitor)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        Strict.deserialize(d)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(Strict)? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if out.contains_key(&key) {
                let shown: String = key.chars().take(64).collect();
                return Err(A::Error::custom(format!(
                    "the key `{shown}` appears twice in one object"
                )));
            }
            let v = map.next_value_seed(Strict)?;
            out.insert(key, v);
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_serde_json_reads() {
        for text in [
            r#"{"a": [1, -2, 3.5, "x", null, true, {"b": {}}], "c": "é\u00e9"}"#,
            "[]",
            "12345678901234567890",
            r#""s""#,
        ] {
            let want: Value = serde_json::from_str(text).unwrap();
            assert_eq!(from_slice(text.as_bytes()).unwrap(), want, "{text}");
        }
    }

    #[test]
    fn repeated_keys_are_refused_at_any_depth() {
        for text in [
            r#"{"model": "a", "model": "b"}"#,
            r#"{"messages": [{"role": "user", "role": "system", "content": "x"}]}"#,
            r#"{"a": {"b": 1, "b": 1}}"#,
        ] {
            let e = from_slice(text.as_bytes()).unwrap_err().to_string();
            assert!(e.contains("appears twice"), "{text}: {e}");
        }
        // the same key in two objects is fine
        assert!(from_slice(br#"[{"a": 1}, {"a": 2}]"#).is_ok());
        // trailing bytes and deep nesting keep serde_json's errors
        assert!(from_slice(b"{} x").is_err());
        let deep = "[".repeat(10_000) + &"]".repeat(10_000);
        assert!(from_slice(deep.as_bytes()).is_err());
    }
}
