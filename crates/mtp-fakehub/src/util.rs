//! Hashes and percent-coding.

use sha1::Sha1;
use sha2::{Digest, Sha256};

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

pub(crate) fn sha1_hex(bytes: &[u8]) -> String {
    hex(&Sha1::digest(bytes))
}

/// Git's blob id: sha1 of `blob {len}\0` and the content.
pub(crate) fn git_blob_oid(bytes: &[u8]) -> String {
    let mut h = Sha1::new();
    h.update(format!("blob {}\0", bytes.len()).as_bytes());
    h.update(bytes);
    hex(&h.finalize())
}

/// The pointer file Git LFS stores in the repository in place of the content.
pub(crate) fn lfs_pointer(sha256: &str, size: usize) -> String {
    format!("version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n")
}

/// `%XX` sequences decoded (a `+` stays a `+`); invalid UTF-8 replaced.
pub(crate) fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex_val(b[i + 1]), hex_val(b[i + 2])) {
                out.push(h * 16 + l);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex_val(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// Every byte but the unreserved ones (`A-Z a-z 0-9 - . _ ~`) as `%XX`: a query value or one
/// path segment.
pub(crate) fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for &c in s.as_bytes() {
        if c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~') {
            out.push(c as char);
        } else {
            out.push_str(&format!("%{c:02X}"));
        }
    }
    out
}

/// The value of a query parameter (decoded), the first when repeated.
pub(crate) fn query_param(query: Option<&str>, name: &str) -> Option<String> {
    query?.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (percent_decode(k) == name).then(|| percent_decode(&v.replace('+', " ")))
    })
}

/// A query flag as clients write true: `true`, `True`, `1`.
pub(crate) fn query_flag(query: Option<&str>, name: &str) -> bool {
    query_param(query, name).is_some_and(|v| matches!(v.as_str(), "true" | "True" | "1"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn git_blob_ids_match_git() {
        // `printf 'hello\n' | git hash-object --stdin`
        assert_eq!(
            git_blob_oid(b"hello\n"),
            "ce013625030ba8dba906f756967f9e9ca394464a"
        );
        assert_eq!(
            git_blob_oid(b""),
            "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"
        );
    }

    #[test]
    fn percent_coding_round_trips() {
        let name = "sub dir/a b+c%.txt";
        assert_eq!(percent_decode(&percent_encode(name)), name);
        assert_eq!(percent_decode("a%20b+c%2Fd%zz%4"), "a b+c/d%zz%4");
        assert_eq!(
            query_param(Some("x=1&repo=a%2Fb&y"), "repo").as_deref(),
            Some("a/b")
        );
        assert!(query_flag(Some("recursive=True"), "recursive"));
        assert!(!query_flag(Some("recursive=false"), "recursive"));
    }
}
