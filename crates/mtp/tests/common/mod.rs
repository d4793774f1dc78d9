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

/// A started server, killed when the test ends or fails.
#[allow(dead_code)]
pub struct Killed(pub Spawned);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.child.kill();
        let _ = self.0.child.wait();
    }
}

/// POSTs `body` with `"stream": true` to `base` + `path` and reads the server-sent events as
/// `(event, data)` pairs, checking that each event names its data's `type` (Anthropic's and
/// the Responses API's streams).
#[allow(dead_code)]
pub async fn post_events(
    base: &str,
    path: &str,
    body: &serde_json::Value,
) -> Vec<(String, serde_json::Value)> {
    let mut body = body.clone();
    body["stream"] = serde_json::json!(true);
    let text = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let mut out = Vec::new();
    let mut name = String::new();
    for l in text.lines() {
        if let Some(n) = l.strip_prefix("event:") {
            name = n.trim().to_string();
        } else if let Some(d) = l.strip_prefix("data:") {
            let v: serde_json::Value = serde_json::from_str(d.trim()).unwrap();
            assert_eq!(v["type"], name.as_str(), "{text}");
            out.push((std::mem::take(&mut name), v));
        }
    }
    out
}

/// The bundled demo model's folder.
#[allow(dead_code)]
pub fn demo_model() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/tiny-code")
        .canonicalize()
        .unwrap()
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

/// The demo model's files (linked) with the published Qwen3.5 chat template beside them, in a
/// temporary folder that lives as long as the returned guard. (Not every test binary that
/// includes this module uses it.)
#[allow(dead_code)]
pub fn qwen35_checkpoint() -> (tempfile::TempDir, std::path::PathBuf) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("tiny-code-qwen35-template");
    std::fs::create_dir(&ck).unwrap();
    for e in std::fs::read_dir(root.join("models/tiny-code")).unwrap() {
        let e = e.unwrap();
        std::os::unix::fs::symlink(e.path().canonicalize().unwrap(), ck.join(e.file_name()))
            .unwrap();
    }
    std::fs::copy(
        root.join("crates/mtp-chat/tests/templates/Qwen3.5-4B.jinja"),
        ck.join("chat_template.jinja"),
    )
    .unwrap();
    (dir, ck)
}
