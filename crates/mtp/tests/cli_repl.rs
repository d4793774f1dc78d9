//! The `mtp chat` REPL driven through a pseudo-terminal (expectrl): `/speculation` report, off,
//! on (with and without a lane), Ctrl-C at the prompt and Ctrl-C during an answer.
//!
//! The fake provider has to be registered inside the process under test, so this test binary
//! re-executes itself as the REPL: with `MTP_REPL_CHILD_ARGS` set, the `child` test registers
//! the fake and runs `mtp::cli::run` on the terminal it was given. Without the variable, `child`
//! does nothing.

#[path = "cli_fake_provider.rs"]
mod fake;

use std::process::Command;
use std::time::{Duration, Instant};

use expectrl::{Eof, Session};

const CHILD_VAR: &str = "MTP_REPL_CHILD_ARGS";
const SEP: char = '\u{1f}';
/// The byte a terminal sends for Ctrl-C (ETX).
const CTRL_C: &str = "\u{3}";

#[test]
fn child() {
    let Ok(args) = std::env::var(CHILD_VAR) else {
        return;
    };
    fake::register();
    let mut argv = vec!["mtp".to_string()];
    argv.extend(args.split(SEP).map(str::to_string));
    let code = mtp::cli::run_with(argv, mtp::cli::Io::terminal());
    std::process::exit(if code == std::process::ExitCode::SUCCESS {
        0
    } else {
        1
    });
}

fn spawn(args: &[&str]) -> Session {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new(exe);
    cmd.args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env(CHILD_VAR, args.join(&SEP.to_string()))
        .env("TERM", "xterm")
        .env_remove("MTP_LOG");
    let mut s = Session::spawn(cmd).expect("spawn the REPL in a pseudo-terminal");
    s.set_expect_timeout(Some(Duration::from_secs(20)));
    s
}

fn expect(s: &mut Session, needle: &str) {
    if let Err(e) = s.expect(needle) {
        panic!("did not see {needle:?}: {e}");
    }
}

fn quit(mut s: Session) {
    s.send_line("/quit").unwrap();
    s.expect(Eof).expect("the REPL exits on /quit");
    let status = s.wait().unwrap();
    assert!(
        matches!(status, expectrl::WaitStatus::Exited(_, 0)),
        "exit status {status:?}"
    );
}

#[test]
fn speculation_report_off_and_on_in_a_terminal() {
    let mut s = spawn(&[
        "chat",
        "--provider",
        "fake",
        "--model",
        "m",
        "--max-tokens",
        "6",
    ]);
    expect(
        &mut s,
        "mtp chat · fake · m · MTP lane loaded (drafter embedded, depth 3)",
    );
    expect(&mut s, "> ");
    s.send_line("/speculation").unwrap();
    expect(&mut s, "⚡ speculation: native MTP lane LOADED");
    expect(&mut s, "drafter        : embedded");
    expect(&mut s, "draft tokens   : 3");
    expect(&mut s, "per-call state : auto (on)");

    s.send_line("/speculation off").unwrap();
    expect(&mut s, "the drafter is skipped");
    s.send_line("/speculation").unwrap();
    expect(
        &mut s,
        "per-call state : off (lane stays loaded; the drafter is skipped)",
    );
    s.send_line("first question").unwrap();
    expect(&mut s, "MTP not used (disabled_by_request)");

    s.send_line("/speculation on").unwrap();
    expect(&mut s, "the drafter runs again");
    s.send_line("second question").unwrap();
    expect(&mut s, "MTP on (depth 3): acceptance");
    quit(s);
}

#[test]
fn speculation_on_without_a_lane_says_so_in_a_terminal() {
    let mut s = spawn(&["chat", "--provider", "fake", "--model", "nolane"]);
    expect(&mut s, "no MTP lane (mtp_head_not_cached)");
    s.send_line("/speculation").unwrap();
    expect(&mut s, "no MTP lane loaded (mtp_head_not_cached)");
    s.send_line("/speculation on").unwrap();
    expect(
        &mut s,
        "cannot turn speculation on: no MTP lane was loaded at startup",
    );
    quit(s);
}

#[test]
fn ctrl_c_stops_the_answer_not_the_session() {
    let mut s = spawn(&[
        "chat",
        "--provider",
        "fake",
        "--model",
        "slow",
        "--max-tokens",
        "400",
    ]);
    expect(&mut s, "> ");
    // At the prompt, Ctrl-C is not a way out (give the line editor a moment to take the
    // terminal into raw mode).
    std::thread::sleep(Duration::from_millis(300));
    s.send(CTRL_C).unwrap();
    expect(&mut s, "nothing to stop");
    let started = Instant::now();
    s.send_line("a long answer please").unwrap();
    // 100 rounds at 150 ms each would take 15 s; stop it once text is flowing.
    expect(&mut s, "println!");
    s.send(CTRL_C).unwrap();
    expect(&mut s, "[stopped after");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "stopped promptly"
    );
    s.send_line("/stats").unwrap();
    expect(&mut s, "(1 stopped)");
    // it ran with the drafter: counted, and said to be missing from the draft figures
    expect(&mut s, "speculated turns 1 (1 stopped before reporting;");
    quit(s);
}

#[test]
fn tool_calls_are_shown_and_answered_in_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let tools = dir.path().join("tools.json");
    std::fs::write(
        &tools,
        r#"[{"type": "function", "function": {"name": "now", "description": "The time."}}]"#,
    )
    .unwrap();
    let mut s = spawn(&[
        "chat",
        "--provider",
        "fake",
        "--model",
        "m",
        "--max-tokens",
        "3",
        "--tools",
        tools.to_str().unwrap(),
    ]);
    expect(&mut s, "tools: now · tool choice auto");
    expect(&mut s, "> ");
    s.send_line("what time is it? call now").unwrap();
    expect(&mut s, "tool call: now({\"i\": 0}) · id call_0");
    expect(&mut s, "1 tool call");
    s.send_line("/tool 12:00").unwrap();
    // the model answers the result in text
    expect(&mut s, "fn main ()");
    expect(&mut s, "MTP on (depth 3)");
    quit(s);
}
