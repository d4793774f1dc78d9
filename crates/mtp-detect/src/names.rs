//! Names that come from outside (a Hub listing, a safetensors index, a split GGUF's shards):
//! whether one is a safe relative path, and how to show one in a message. Leaf of the crate:
//! the errors, the readers and the Hub client all use it.

/// Whether `p` is a plain relative path: no `..`, `.` or empty components, no leading `/`,
/// no backslashes, drive letters or control characters.
pub fn is_safe_relative(p: &str) -> bool {
    !p.is_empty()
        && p.len() <= 1024
        && !p.starts_with('/')
        && !p.contains('\\')
        && !p.contains(':')
        && !p.chars().any(char::is_control)
        && p.split('/').all(|c| !c.is_empty() && c != "." && c != "..")
}

/// A file name from outside (a listing, an index) fit for a message or a log line: control
/// characters escaped, at most 120 characters (a longer one says how many bytes it had).
pub fn shown_name(name: &str) -> String {
    let escaped: String = name.escape_debug().collect();
    if escaped.chars().count() > 120 {
        let cut: String = escaped.chars().take(117).collect();
        format!("{cut}... ({} bytes)", name.len())
    } else {
        escaped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one path rule: plain relative paths pass; everything a hostile listing or index may
    /// send to escape the folder, or to confuse a terminal or a file system, does not.
    #[test]
    fn only_plain_relative_paths_are_safe() {
        for ok in [
            "model.safetensors",
            "sub/dir/model-Q4_K_M.gguf",
            "a b.json",
            "模型.gguf",
        ] {
            assert!(is_safe_relative(ok), "{ok}");
        }
        let long = "a".repeat(2000);
        for bad in [
            "",
            "../x",
            "a/../../b",
            "./x",
            "a//b",
            "a/",
            "/etc/passwd",
            "C:x",
            "c:\\x",
            "a\\..\\b",
            "nul\0byte",
            "new\nline",
            "esc\u{1b}[2J",
            long.as_str(),
        ] {
            assert!(!is_safe_relative(bad), "{bad:?}");
        }
    }

    #[test]
    fn names_are_shown_escaped_and_short() {
        assert_eq!(shown_name("a\0b\nc"), "a\\0b\\nc");
        let long = shown_name(&"a".repeat(2000));
        assert!(
            long.ends_with("... (2000 bytes)") && long.len() < 140,
            "{long}"
        );
    }
}
