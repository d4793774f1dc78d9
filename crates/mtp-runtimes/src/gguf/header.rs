//! What a GGUF file's header says about its MTP head, read with `mtp-detect` before llama.cpp
//! ever sees the file (llama.cpp aborts the process, rather than failing, when an MTP context is
//! driven on a model loaded without its head).

use std::fs::File;
use std::io::Read;
use std::path::Path;

use mtp_contract::{Lane, Reason};
use mtp_detect::gguf::{parse_gguf, GgufHeader, GgufParse};
use mtp_detect::RegistryView;

/// The default draft depth (llama.cpp's own default for `MtpSpeculativeParams::n_max`, the
/// contract's built-in depth).
pub const DEFAULT_DEPTH: u32 = mtp_contract::BUILTIN_DEPTH;

/// Largest header prefix read (GGUF headers hold the whole vocabulary; 64 MiB is ample).
const MAX_PREFIX: u64 = 64 << 20;

/// The facts the provider needs from a header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeadInfo {
    /// `general.architecture`.
    pub arch: String,
    /// `<arch>.nextn_predict_layers` (0 when absent).
    pub nextn_layers: u64,
}

impl HeadInfo {
    /// Whether the linked llama.cpp can run this file's MTP head.
    pub fn mtp_runnable(&self) -> bool {
        self.nextn_layers > 0
            && mtp_detect::registry()
                .runtimes
                .llama_cpp_supports(&self.arch)
    }

    /// The lane this file gives the provider: the registry's entry for the model (when it has
    /// one) gives the default depth and whether the pairing is known to preserve greedy output
    /// (`false` where a divergence was seen); without one, llama.cpp's own depth and unknown.
    pub fn lane(&self, runtime: &str, registry: Option<&RegistryView>) -> Lane {
        if self.mtp_runnable() {
            let (default_depth, depth_source) = mtp_detect::default_depth(None, registry);
            Lane::Ready {
                drafter: "embedded".into(),
                default_depth,
                depth_source,
                output_preserving: registry.and_then(|r| r.output_preserving),
            }
        } else if self.nextn_layers > 0 {
            Lane::Unavailable {
                reason: Reason::RuntimeUnsupported,
                message: format!(
                    "the model has an MTP head ({} NextN layer(s)) but architecture `{}` has no MTP graph in {runtime}; \
                     it runs target-only here. A newer llama-server (`--spec-type draft-mtp`) or LM Studio may run it.",
                    self.nextn_layers, self.arch
                ),
            }
        } else {
            Lane::Unavailable {
                reason: Reason::NoMtpHead,
                message: format!(
                    "the GGUF file has no MTP head (`{}.nextn_predict_layers` is absent or 0); convert a checkpoint \
                     that ships one (e.g. `cargo xtask gguf <hf-dir> <out.gguf>`) to speculate",
                    self.arch
                ),
            }
        }
    }
}

/// Reads `path`'s header. Errors are sentences for `ProviderError::ModelLoad`.
pub fn read_head(path: &Path) -> Result<HeadInfo, String> {
    let mut file = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let len = file
        .metadata()
        .map_err(|e| format!("{}: {e}", path.display()))?
        .len();
    let mut buf: Vec<u8> = Vec::new();
    let mut want: u64 = 1 << 20;
    loop {
        let target = want.min(len).min(MAX_PREFIX);
        if (buf.len() as u64) < target {
            let mut more = Vec::new();
            (&mut file)
                .take(target - buf.len() as u64)
                .read_to_end(&mut more)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            buf.extend_from_slice(&more);
        }
        match parse_gguf(&buf, len) {
            Ok(GgufParse::Complete(h)) => return info(&h, path),
            Ok(GgufParse::NeedMore { needed, .. }) => {
                if needed <= buf.len() as u64 || buf.len() as u64 >= len.min(MAX_PREFIX) {
                    return Err(format!(
                        "{}: the GGUF header is larger than {} bytes or truncated",
                        path.display(),
                        buf.len()
                    ));
                }
                want = needed.max(want * 2);
            }
            Err(e) => return Err(format!("{}: not a readable GGUF file: {e}", path.display())),
        }
    }
}

fn info(h: &GgufHeader, path: &Path) -> Result<HeadInfo, String> {
    let arch = h.architecture().ok_or_else(|| {
        format!(
            "{}: no general.architecture in the GGUF header",
            path.display()
        )
    })?;
    Ok(HeadInfo {
        arch: arch.to_string(),
        nextn_layers: h.nextn_predict_layers().unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lanes_follow_the_header() {
        let run = HeadInfo {
            arch: "qwen35".into(),
            nextn_layers: 1,
        };
        assert!(matches!(
            run.lane("llama.cpp b11434", None),
            Lane::Ready {
                default_depth: 3,
                ..
            }
        ));
        let new_arch = HeadInfo {
            arch: "qwen9".into(),
            nextn_layers: 1,
        };
        match new_arch.lane("llama.cpp b11434", None) {
            Lane::Unavailable { reason, message } => {
                assert_eq!(reason, Reason::RuntimeUnsupported);
                assert!(message.contains("llama-server") && message.contains("LM Studio"));
            }
            other => panic!("{other:?}"),
        }
        let none = HeadInfo {
            arch: "qwen35".into(),
            nextn_layers: 0,
        };
        assert!(matches!(
            none.lane("x", None),
            Lane::Unavailable {
                reason: Reason::NoMtpHead,
                ..
            }
        ));
    }

    #[test]
    fn non_gguf_files_are_refused_with_the_path() {
        let dir = std::env::temp_dir().join(format!("mtp-gguf-head-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("x.gguf");
        std::fs::write(&p, b"not a gguf file at all").unwrap();
        let e = read_head(&p).unwrap_err();
        assert!(e.contains("x.gguf"), "{e}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
