//! The `mtp` command; all of it lives in [`mtp::cli`].

fn main() -> std::process::ExitCode {
    mtp::cli::run()
}
