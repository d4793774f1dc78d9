//! What the tests that start the `mtp serve` binary share.

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Command, Stdio};

/// A started `mtp serve`: the process, the line it printed first, the rest of its stdout,
/// and its base URL (`http://127.0.0.1:PORT`).
pub struct Spawned {
    pub child: Child,
    pub banner: String,
    pub out: BufReader<ChildStdout>,
    pub base: String,
}

/// Starts `mtp serve --port 0 --model MODEL ARGS` and reads the address from its first line.
pub fn spawn_serve(model: &str, args: &[&str], stderr: Stdio) -> Spawned {
    let mut child = Command::new(assert_cmd::cargo::cargo_bin("mtp"))
        .args(["serve", "--port", "0", "--model", model])
        .args(args)
        .env_remove("MTP_API_KEY")
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut banner = String::new();
    out.read_line(&mut banner).unwrap();
    let start = banner
        .find("http://")
        .unwrap_or_else(|| panic!("no address in {banner:?}"));
    let url = banner[start..].split_whitespace().next().unwrap();
    let base = url.trim_end_matches("/v1").to_string();
    Spawned {
        child,
        banner,
        out,
        base,
    }
}
