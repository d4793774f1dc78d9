//! The `mtp` command; all of it lives in [`mtp::cli`].

#![forbid(unsafe_code)]

/// mimalloc keeps freed memory for reuse: the engine's per-product buffers (tens of MiB in a
/// long prompt) are then not handed back to the OS and faulted in, zeroed, again at the next
/// product, as glibc's allocator does with them (prefill ~14% faster on the benchmark shape).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    mtp::cli::run()
}
