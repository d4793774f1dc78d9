//! The `mtp` command; all of it lives in [`mtp::cli`].

#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    mtp::cli::run()
}
