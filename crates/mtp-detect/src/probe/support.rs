//! Which runtime can run the artifact, and the command or code that starts it: one
//! [`RuntimeSupport`] line per [`Runtime`]. The commands themselves are written by
//! [`crate::runtimes`]; here is only which one, with which verdict and note.

use super::*;

/// The model as the commands name it: a repository id or a path, and the GGUF file inside a
/// remote repository (llama-server's `--hf-file`).
pub(super) struct ModelRef<'a> {
    pub(super) model: &'a str,
    pub(super) file: Option<&'a str>,
}

/// Every runtime's line for `r`, at `depth`; `companion_ok` says the registered companion
/// drafter is cached and fits.
pub(super) fn runtime_support(
    r: &ProbeReport,
    reg: &Registry,
    target: &ModelRef<'_>,
    depth: u32,
    companion_ok: bool,
    style: CommandStyle,
) -> Vec<RuntimeSupport> {
    let lines = Lines {
        r,
        reg,
        target,
        depth,
        companion_ok,
        style,
    };
    Runtime::ALL
        .into_iter()
        .map(|rt| match r.role {
            Role::Drafter => lines.drafter(rt),
            Role::Target => lines.target(rt),
        })
        .collect()
}

/// What one report's lines are decided from.
struct Lines<'a> {
    r: &'a ProbeReport,
    reg: &'a Registry,
    target: &'a ModelRef<'a>,
    depth: u32,
    companion_ok: bool,
    style: CommandStyle,
}

/// One line; a runtime that can run MTP carries no reason.
fn line(
    runtime: Runtime,
    can: bool,
    verdict: Verdict,
    reason: Option<Reason>,
    command: String,
    note: String,
) -> RuntimeSupport {
    RuntimeSupport {
        runtime,
        can_run_mtp: can,
        verdict,
        reason: if can { None } else { reason },
        command,
        note,
    }
}

impl Lines<'_> {
    fn launch(&self, rt: Runtime, model: &str, file: Option<&str>, mtp: bool) -> String {
        launch_command_in(self.style, rt, model, file, mtp, self.depth)
    }

    fn native(&self, model: &str, drafter: Option<&str>, mtp: bool) -> String {
        native_in(self.style, model, drafter, mtp, self.depth)
    }

    /// The target's own launch command, with MTP flags or without.
    fn cmd(&self, rt: Runtime, mtp: bool) -> String {
        self.launch(rt, self.target.model, self.target.file, mtp)
    }

    /// The drafter option as the reader will write it.
    fn drafter_opt(&self) -> &'static str {
        match self.style {
            CommandStyle::Library => "`drafter`",
            CommandStyle::Cli => "--drafter",
        }
    }

    fn mlx_quant(&self) -> bool {
        self.r.mlx_affine_quantized || self.r.mlx_quantized_weights
    }

    fn arch(&self) -> &str {
        self.r.arch.as_deref().unwrap_or_default()
    }

    fn model_type(&self) -> &str {
        self.r.model_type.as_deref().unwrap_or_default()
    }

    /// A companion drafter's line: only the native engine loads one, next to its target.
    fn drafter(&self, rt: Runtime) -> RuntimeSupport {
        let (r, model, mt) = (self.r, self.target.model, self.model_type());
        if rt != Runtime::Native {
            return line(
                rt,
                false,
                Verdict::FormatUnsupported,
                Some(Reason::RuntimeUnsupported),
                self.launch(rt, model, None, false),
                "a companion drafter is loaded next to its target, not served on its own".into(),
            );
        }
        let target = r
            .registry
            .as_ref()
            .and_then(|e| self.reg.models.iter().find(|m| m.id == e.id))
            .and_then(|m| m.targets.first().cloned())
            .unwrap_or_else(|| "<target>".into());
        let ok = r.mtp_head && mt == "qwen3_5_mtp";
        line(
            rt,
            ok,
            if ok {
                Verdict::CompanionReady
            } else {
                Verdict::FormatUnsupported
            },
            Some(if r.mtp_head {
                Reason::RuntimeUnsupported
            } else {
                Reason::DrafterMismatch
            }),
            self.native(&target, Some(model), true),
            if ok {
                format!(
                    "a companion drafter: load the target and pass this as {}",
                    self.drafter_opt()
                )
            } else {
                format!("the native engine runs qwen3_5_mtp drafters with their core tensors; this is `{mt}`")
            },
        )
    }

    /// A target's line for `rt`.
    fn target(&self, rt: Runtime) -> RuntimeSupport {
        match (rt, self.r.format) {
            (Runtime::Ollama, _) => line(
                rt,
                false,
                Verdict::NotExposed,
                Some(Reason::RuntimeUnsupported),
                self.cmd(rt, false),
                "Ollama does not expose MTP; serve the GGUF from llama-server or LM Studio".into(),
            ),
            (Runtime::LlamaServer | Runtime::LmStudio | Runtime::Gguf, Format::Safetensors) => {
                self.convert_first(rt)
            }
            (Runtime::LlamaServer | Runtime::LmStudio | Runtime::Gguf, Format::Gguf) => {
                self.llama_cpp(rt)
            }
            (Runtime::Vllm, Format::Gguf) => line(
                rt,
                false,
                Verdict::FormatUnsupported,
                Some(Reason::RuntimeUnsupported),
                self.cmd(rt, false),
                "vLLM runs MTP from Hugging Face safetensors checkpoints, not GGUF".into(),
            ),
            (Runtime::Vllm, Format::Safetensors) => self.vllm(rt),
            (Runtime::Native, Format::Gguf) => line(
                rt,
                false,
                Verdict::FormatUnsupported,
                Some(Reason::RuntimeUnsupported),
                self.native(self.target.model, None, false),
                "the native engine reads safetensors; serve this GGUF from llama-server or LM Studio".into(),
            ),
            (Runtime::Native, Format::Safetensors) => self.native_engine(rt),
        }
    }

    /// A llama.cpp runtime and a safetensors checkpoint: convert it first. llama.cpp b11434's
    /// converter keeps a NextN or `mtp.*` head as `blk.N.nextn.*`, but drops ERNIE-4.5's
    /// `model.mtp_*` tensors (`conversion/ernie.py`, `Ernie4_5MoeModel.filter_tensors`: "skip
    /// all other MTP tensors for now"), so for ERNIE the converted file is served without MTP.
    fn convert_first(&self, rt: Runtime) -> RuntimeSupport {
        let r = self.r;
        let mlx_quant = self.mlx_quant();
        let dropped = r.mtp_style == Some(MtpStyle::Ernie);
        let source = if mlx_quant {
            "<original checkpoint>"
        } else {
            self.target.model
        };
        let command = format!(
            "{} {} {}",
            convert_command(source, "model.gguf"),
            if rt == Runtime::Gguf { "; then" } else { "&&" },
            self.launch(rt, "./model.gguf", None, r.mtp_head && !dropped)
        );
        let note = match (mlx_quant, dropped) {
            (true, _) => "llama.cpp serves GGUF, and its convert_hf_to_gguf.py does not read MLX-quantized weights: convert the original checkpoint (it keeps the nextn head) or use a GGUF repo",
            (false, true) => "llama.cpp serves GGUF, and its convert_hf_to_gguf.py drops ERNIE-4.5's MTP tensors: the converted model runs without MTP",
            (false, false) => "llama.cpp serves GGUF: convert with llama.cpp's convert_hf_to_gguf.py (it keeps the nextn head) or use a GGUF repo",
        };
        line(
            rt,
            false,
            Verdict::FormatUnsupported,
            Some(Reason::RuntimeUnsupported),
            command,
            note.into(),
        )
    }

    /// A llama.cpp runtime and a GGUF: the head in the file, and the MTP graph in the build.
    fn llama_cpp(&self, rt: Runtime) -> RuntimeSupport {
        let t = &self.reg.runtimes;
        let arch = self.arch();
        let build = &t.llama_cpp_build;
        let cmd = |mtp| self.cmd(rt, mtp);
        match (self.r.mtp_head, t.llama_cpp_supports(arch)) {
            (true, true) => line(
                rt,
                true,
                Verdict::HeadPresentRuntimeReady,
                None,
                cmd(true),
                format!("head present; llama.cpp {build} has the {arch} MTP graph"),
            ),
            (false, true) => line(
                rt,
                false,
                Verdict::RuntimeReadyNoHead,
                Some(Reason::NoMtpHead),
                cmd(false),
                format!("llama.cpp implements MTP for {arch}, but this file carries no nextn tensors; use a quantization that keeps the head"),
            ),
            (true, false) => line(
                rt,
                false,
                Verdict::HeadPresentNeedsNewerRuntime,
                Some(Reason::RuntimeUnsupported),
                cmd(false),
                format!("head present, but llama.cpp {build} has no MTP graph for `{arch}`; needs a newer build"),
            ),
            (false, false) => line(
                rt,
                false,
                Verdict::NoHeadRuntimeUnsupported,
                Some(Reason::NoMtpHead),
                cmd(false),
                format!("no head, and no llama.cpp MTP graph for `{arch}`"),
            ),
        }
    }

    /// vLLM and a safetensors checkpoint: the head, and the model type in vLLM's MTP table.
    fn vllm(&self, rt: Runtime) -> RuntimeSupport {
        let mt = self.model_type();
        let cmd = |mtp| self.cmd(rt, mtp);
        if self.mlx_quant() {
            return line(
                rt,
                false,
                Verdict::FormatUnsupported,
                Some(Reason::RuntimeUnsupported),
                cmd(false),
                "MLX affine-quantized weights do not load in vLLM; use the original checkpoint"
                    .into(),
            );
        }
        match (self.r.mtp_head, self.reg.runtimes.vllm_supports(mt)) {
            (true, true) => line(rt, true, Verdict::HeadPresentRuntimeReady, None, cmd(true),
                format!("head present; vLLM runs MTP for {mt}")),
            (false, true) => line(rt, false, Verdict::RuntimeReadyNoHead, Some(Reason::NoMtpHead), cmd(false),
                format!("vLLM runs MTP for {mt}, but these weights carry no head (vLLM cannot use a separate MLX drafter)")),
            (true, false) => line(rt, false, Verdict::HeadPresentNeedsNewerRuntime, Some(Reason::RuntimeUnsupported), cmd(false),
                format!("head present, but `{mt}` is not in the vLLM MTP table")),
            (false, false) => line(rt, false, Verdict::NoHeadRuntimeUnsupported, Some(Reason::NoMtpHead), cmd(false),
                format!("no head, and `{mt}` is not in the vLLM MTP table")),
        }
    }

    /// The native engine and a safetensors checkpoint: its model types, then the embedded
    /// head, then a companion drafter.
    fn native_engine(&self, rt: Runtime) -> RuntimeSupport {
        let (r, model, mt) = (self.r, self.target.model, self.model_type());
        let t = &self.reg.runtimes;
        if !t.native_supports(mt) {
            return line(
                rt,
                false,
                if r.mtp_head {
                    Verdict::HeadPresentNeedsNewerRuntime
                } else {
                    Verdict::NoHeadRuntimeUnsupported
                },
                Some(Reason::RuntimeUnsupported),
                self.native(model, None, false),
                format!(
                    "the native engine runs {}; this is `{mt}`",
                    t.native_model_types.join(", ")
                ),
            );
        }
        if r.mtp_head {
            return line(
                rt,
                true,
                Verdict::HeadPresentRuntimeReady,
                None,
                self.native(model, None, true),
                "head embedded in the weights".into(),
            );
        }
        let Some(c) = r.companion.as_ref() else {
            return line(rt, false, Verdict::RuntimeReadyNoHead, Some(Reason::NoMtpHead), self.native(model, None, false),
                format!("the weights carry no MTP head and no companion drafter is registered; name one with {}", self.drafter_opt()));
        };
        let code = self.native(model, Some(&c.repo), self.companion_ok);
        match (c.cached, self.companion_ok) {
            (true, true) => line(
                rt,
                true,
                Verdict::CompanionReady,
                None,
                code,
                c.message.clone(),
            ),
            (true, false) => line(
                rt,
                false,
                Verdict::CompanionMismatch,
                c.reason,
                code,
                c.message.clone(),
            ),
            _ => line(
                rt,
                false,
                Verdict::CompanionNotCached,
                Some(Reason::MtpHeadNotCached),
                code,
                c.message.clone(),
            ),
        }
    }
}
