//! The probe's report for a person ([`ProbeReport::render_human`]).

use super::*;

impl ProbeReport {
    /// A short human summary (what `probe` prints without `--json`).
    pub fn render_human(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let fmt = match self.format {
            Format::Safetensors => "safetensors",
            Format::Gguf => "gguf",
        };
        let _ = writeln!(
            s,
            "{}  ({fmt}{}{})",
            self.source,
            self.arch
                .as_ref()
                .map(|a| format!(", arch {a}"))
                .unwrap_or_default(),
            match (self.role, self.mlx_quantized_weights) {
                (Role::Drafter, true) => ", MLX-quantized companion drafter",
                (Role::Drafter, false) => ", companion drafter",
                (Role::Target, true) => ", MLX-quantized",
                (Role::Target, false) => "",
            }
        );
        if let Some(f) = &self.file {
            let _ = writeln!(s, "file: {f}");
        }
        if self.mtp_head {
            let _ = writeln!(
                s,
                "MTP head: yes, {} layer(s), {} tensor(s){}{}{}",
                self.mtp_layers,
                self.mtp_tensor_count,
                self.mtp_style
                    .map(|st| format!(", {}", style_name(st)))
                    .unwrap_or_default(),
                if self.mtp_dtypes.is_empty() {
                    String::new()
                } else {
                    format!(", {}", self.mtp_dtypes.join("/"))
                },
                if self.mlx_affine_quantized {
                    ", MLX affine-quantized"
                } else {
                    ""
                }
            );
        } else {
            let _ = writeln!(s, "MTP head: no");
        }
        if !self.evidence.is_empty() {
            let _ = writeln!(s, "evidence: {}", self.evidence.join(", "));
        }
        match &self.vision_evidence {
            Some(e) if self.vision => {
                let _ = writeln!(s, "vision tower: yes ({e})");
            }
            _ => {
                let _ = writeln!(s, "vision tower: no");
            }
        }
        if let Some(c) = &self.config_claim {
            let _ = writeln!(s, "config claims: {c} (a claim, not evidence)");
        }
        if let Some(r) = &self.registry {
            let _ = writeln!(
                s,
                "registry: {} ({:?}, depth {}){}",
                r.id,
                r.status,
                r.default_depth,
                r.drafter
                    .as_ref()
                    .map(|d| format!(", drafter {d}"))
                    .unwrap_or_default()
            );
        }
        if let Some(c) = &self.companion {
            let _ = writeln!(s, "companion: {}", c.message);
        }
        for w in &self.warnings {
            let _ = writeln!(s, "warning: {w}");
        }
        let _ = writeln!(s, "runtimes:");
        for r in &self.runtimes {
            let _ = writeln!(
                s,
                "  {:<13}{}  {}\n  {:<13}     {}",
                r.runtime.as_str(),
                if r.can_run_mtp { "MTP" } else { " - " },
                r.command,
                "",
                r.note
            );
        }
        let _ = writeln!(s, "bytes read: {}", self.bytes_read);
        s
    }
}

fn style_name(s: MtpStyle) -> &'static str {
    match s {
        MtpStyle::MtpPrefix => "mtp.* tensors",
        MtpStyle::NextN => "NextN layers",
        MtpStyle::GgufNextN => "GGUF nextn blocks",
        MtpStyle::Drafter => "drafter layout",
        MtpStyle::Ernie => "ERNIE mtp_* modules",
    }
}
