//! How a field is read when the JSON in it may be of the wrong type: kept for a message that
//! names it ([`Field`]), or read as absent ([`lenient`] and its relatives, for what a client
//! ignores in a server's answer).
//!
//! serde's derived `Deserialize` refuses a whole object when one field has the wrong type,
//! and its error does not say which field in words a client can act on. The server answers a
//! bad request field with a 400 naming that field, and a client of llama-server, vLLM, LM
//! Studio or Ollama must read an answer whose extra or odd fields it does not need; both start
//! from a value that always deserializes.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

/// A field's value as sent: the type it should have, or the JSON it held instead. A field
/// absent or `null` is `None` around it (`Option<Field<T>>`), as OpenAI's API treats both.
///
/// Deserializing never fails: the server's validation turns [`Field::Invalid`] into a 400
/// naming the field, and a client reading an answer decides for itself whether a wrong value
/// is an error or is ignored. Serializing writes the value as it is.
///
/// ```
/// use mtp_openai::Field;
/// let ok: Field<u64> = serde_json::from_str("7").unwrap();
/// assert_eq!(ok.ok(), Some(&7));
/// let bad: Field<u64> = serde_json::from_str("\"seven\"").unwrap();
/// assert_eq!(bad.invalid(), Some(&serde_json::json!("seven")));
/// assert_eq!(serde_json::to_string(&bad).unwrap(), "\"seven\"");
/// ```
#[derive(Debug, Clone, PartialEq)]
pub enum Field<T> {
    /// A value of the expected type.
    Ok(T),
    /// What was sent instead, and why it is not a `T` (the deserializer's message: for a type
    /// read by one of the contract's parsers, that parser's own message).
    Invalid {
        /// The JSON as sent.
        value: Value,
        /// Why it is not a `T`.
        error: String,
    },
}

impl<T> Field<T> {
    /// The value, when it has the expected type.
    pub fn ok(&self) -> Option<&T> {
        match self {
            Field::Ok(t) => Some(t),
            Field::Invalid { .. } => None,
        }
    }

    /// The value, when it has the expected type.
    pub fn into_ok(self) -> Option<T> {
        match self {
            Field::Ok(t) => Some(t),
            Field::Invalid { .. } => None,
        }
    }

    /// The JSON sent instead of a `T`.
    pub fn invalid(&self) -> Option<&Value> {
        match self {
            Field::Ok(_) => None,
            Field::Invalid { value, .. } => Some(value),
        }
    }

    /// `Ok(value)`, or `Err(json sent instead)`.
    pub fn as_result(&self) -> Result<&T, &Value> {
        match self {
            Field::Ok(t) => Ok(t),
            Field::Invalid { value, .. } => Err(value),
        }
    }
}

impl<T: DeserializeOwned> Field<T> {
    /// Reads `value` as a `T`, keeping it when it is not one.
    pub fn from_value(value: Value) -> Field<T> {
        match T::deserialize(&value) {
            Ok(t) => Field::Ok(t),
            Err(e) => Field::Invalid {
                value,
                error: e.to_string(),
            },
        }
    }
}

impl<T> From<T> for Field<T> {
    fn from(t: T) -> Self {
        Field::Ok(t)
    }
}

impl<T: Serialize> Serialize for Field<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Field::Ok(t) => t.serialize(s),
            Field::Invalid { value, .. } => value.serialize(s),
        }
    }
}

impl<'de, T: DeserializeOwned> Deserialize<'de> for Field<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Value::deserialize(d).map(Field::from_value)
    }
}

/// An `Option<T>` field (with `#[serde(default, deserialize_with = "lenient")]`) whose value,
/// when it is not a `T`, reads as absent: what a client does with a field of a server's
/// answer it cannot use.
pub fn lenient<'de, D: Deserializer<'de>, T: DeserializeOwned>(
    d: D,
) -> Result<Option<T>, D::Error> {
    let v = Value::deserialize(d)?;
    Ok(T::deserialize(&v).ok())
}

/// An `Option<Option<T>>` field that tells `null` (`Some(None)`) from absent (`None`), for
/// the fields OpenAI's answers send as an explicit `null` (a chunk's `usage` under
/// `include_usage`, a text choice's `logprobs`). A value that is not a `T` reads as absent.
pub fn nullable<'de, D: Deserializer<'de>, T: DeserializeOwned>(
    d: D,
) -> Result<Option<Option<T>>, D::Error> {
    let v = Value::deserialize(d)?;
    if v.is_null() {
        return Ok(Some(None));
    }
    Ok(T::deserialize(&v).ok().map(Some))
}

/// An `Option<Field<T>>` field that is present when it holds `null` too (`Some(Invalid)`),
/// for a field whose presence alone means something (an answer's `error`).
pub fn present<'de, D: Deserializer<'de>, T: DeserializeOwned>(
    d: D,
) -> Result<Option<Field<T>>, D::Error> {
    Value::deserialize(d).map(|v| Some(Field::from_value(v)))
}

/// A count: a non-negative integer, or a float with no fraction (`12.0`, as some servers
/// write counts); anything else reads as absent.
pub fn count_of(v: &Value) -> Option<u64> {
    v.as_u64().or_else(|| {
        v.as_f64()
            .filter(|f| f.is_finite() && *f >= 0.0 && f.fract() == 0.0)
            .map(|f| f as u64)
    })
}

/// An `Option<u64>` field read with [`count_of`].
pub fn count<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    Value::deserialize(d).map(|v| count_of(&v))
}

/// An `Option<f64>` field holding a finite, non-negative number (a duration, a rate);
/// anything else reads as absent.
pub fn amount<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    let v = Value::deserialize(d)?;
    Ok(v.as_f64().filter(|f| f.is_finite() && *f >= 0.0))
}

/// An `Option<Vec<u64>>` field: a list whose entries that are not non-negative integers read
/// as 0 (vLLM's `acceptance_histogram`); what is not a list reads as absent.
pub fn counts_or_zero<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u64>>, D::Error> {
    let v = Value::deserialize(d)?;
    Ok(v.as_array()
        .map(|a| a.iter().map(|x| x.as_u64().unwrap_or(0)).collect()))
}

/// An `Option<Vec<u64>>` field: a list of which only the non-negative integers are kept
/// (llama-server's `tokens`); what is not a list reads as absent.
pub fn integers<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u64>>, D::Error> {
    let v = Value::deserialize(d)?;
    Ok(v.as_array()
        .map(|a| a.iter().filter_map(Value::as_u64).collect()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[derive(Debug, Default, Deserialize)]
    struct Probe {
        #[serde(default, deserialize_with = "lenient")]
        n: Option<u32>,
        #[serde(default, deserialize_with = "nullable")]
        usage: Option<Option<u32>>,
        #[serde(default, deserialize_with = "present")]
        error: Option<Field<String>>,
        #[serde(default, deserialize_with = "count")]
        c: Option<u64>,
        #[serde(default, deserialize_with = "amount")]
        ms: Option<f64>,
        #[serde(default, deserialize_with = "counts_or_zero")]
        h: Option<Vec<u64>>,
        #[serde(default, deserialize_with = "integers")]
        ids: Option<Vec<u64>>,
        #[serde(default)]
        f: Option<Field<bool>>,
    }

    fn probe(v: Value) -> Probe {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn each_reading_as_a_table() {
        assert_eq!(probe(json!({"n": 3})).n, Some(3));
        assert_eq!(probe(json!({"n": "3"})).n, None);
        assert_eq!(probe(json!({"n": null})).n, None);
        assert_eq!(probe(json!({})).usage, None);
        assert_eq!(probe(json!({"usage": null})).usage, Some(None));
        assert_eq!(probe(json!({"usage": 2})).usage, Some(Some(2)));
        assert_eq!(probe(json!({"usage": "x"})).usage, None);
        assert_eq!(probe(json!({})).error, None);
        assert!(matches!(
            probe(json!({"error": null})).error,
            Some(Field::Invalid { .. })
        ));
        for (v, want) in [
            (json!(12), Some(12)),
            (json!(12.0), Some(12)),
            (json!(12.5), None),
            (json!(-1), None),
            (json!("12"), None),
        ] {
            assert_eq!(probe(json!({ "c": v })).c, want, "{v}");
        }
        assert_eq!(probe(json!({"ms": 1.5})).ms, Some(1.5));
        assert_eq!(probe(json!({"ms": -1.5})).ms, None);
        assert_eq!(
            probe(json!({"h": [1, "a", 2.5, 3]})).h,
            Some(vec![1, 0, 0, 3])
        );
        assert_eq!(probe(json!({"ids": [-1, 1.5, "a", 9]})).ids, Some(vec![9]));
        assert_eq!(probe(json!({"ids": "no"})).ids, None);
        assert_eq!(probe(json!({"f": true})).f, Some(Field::Ok(true)));
        let bad = probe(json!({"f": 1})).f.unwrap();
        assert_eq!(bad.invalid(), Some(&json!(1)));
        assert!(matches!(&bad, Field::Invalid { error, .. } if error.contains("boolean")));
        assert_eq!(probe(json!({"f": null})).f, None);
    }
}
