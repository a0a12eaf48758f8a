//! Safe maintenance: one daemon per data directory, versions with their commit, and a
//! configuration check that starts nothing.

use std::process::Command;

use muster_tests::{Daemon, muster_bin, musterd_bin};

fn run(cmd: &mut Command) -> (i32, String, String) {
    let out = cmd.output().expect("running a binary");
    (
        out.status.code().expect("exit status"),
        String::from_utf8(out.stdout).expect("utf-8 stdout"),
        String::from_utf8(out.stderr).expect("utf-8 stderr"),
    )
}

#[test]
fn a_second_daemon_on_the_same_data_directory_is_refused_naming_the_first() {
    let d = Daemon::start();
    let (code, stdout, stderr) = run(Command::new(musterd_bin())
        .arg("--data")
        .arg(d.data())
        .args(["--listen", "127.0.0.1:0"])
        .env("MUSTER_LOG", "off"));
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(stdout, "");
    assert_eq!(
        stderr,
        format!(
            "musterd: data directory {} is in use by another musterd (process {} holds musterd.lock)\n",
            d.data().display(),
            d.pid()
        )
    );
    // The first one still serves.
    assert_eq!(d.ok(&["queue", "list"]), "");
}

#[test]
fn both_binaries_print_their_version_and_the_same_commit() {
    let (code, daemon, _) = run(Command::new(musterd_bin()).arg("--version"));
    assert_eq!(code, 0);
    let (code, cli, _) = run(Command::new(muster_bin()).arg("--version"));
    assert_eq!(code, 0);
    let commit = |line: &str, name: &str| {
        let rest = line
            .strip_prefix(&format!("{name} {} (commit ", env!("CARGO_PKG_VERSION")))
            .and_then(|r| r.strip_suffix(")\n"))
            .unwrap_or_else(|| panic!("{name} --version printed {line:?}"))
            .to_owned();
        assert!(
            rest == "unknown" || (rest.len() == 12 && rest.bytes().all(|b| b.is_ascii_hexdigit())),
            "{name} --version printed {line:?}"
        );
        rest
    };
    assert_eq!(commit(&daemon, "musterd"), commit(&cli, "muster"));
}

#[test]
fn check_config_validates_flags_and_tokens_without_starting() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let good = dir.path().join("good.toml");
    std::fs::write(
        &good,
        "[[tokens]]\nname = \"ops\"\ntoken = \"a-long-enough-operator-token\"\nroles = [\"admin\"]\n",
    )
    .unwrap();
    let check = |args: &[&str]| {
        run(Command::new(musterd_bin())
            .arg("--check-config")
            .arg("--data")
            .arg(&data)
            .args(args))
    };
    let (code, stdout, stderr) = check(&[
        "--config",
        good.to_str().unwrap(),
        "--listen",
        "0.0.0.0:7420",
    ]);
    assert_eq!((code, stderr.as_str()), (0, ""));
    assert_eq!(
        stdout,
        format!(
            "musterd: configuration is valid: 1 token(s), data directory {}, listening on 0.0.0.0:7420\n",
            data.display()
        )
    );
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[[tokens]]\nname = \"ops\"\ntoken = \"short\"\nroles = [\"admin\"]\n",
    )
    .unwrap();
    let (code, stdout, stderr) = check(&["--config", bad.to_str().unwrap()]);
    assert_eq!((code, stdout.as_str()), (1, ""));
    assert_eq!(
        stderr,
        format!(
            "musterd: in config {}: token \"ops\" is shorter than 16 bytes\n",
            bad.display()
        )
    );
    let (code, _, stderr) = check(&["--listen", "0.0.0.0:7420"]);
    assert_eq!(code, 1);
    assert!(
        stderr.starts_with("musterd: refusing to listen on 0.0.0.0:7420: "),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    let (code, _, stderr) = check(&["--cert", good.to_str().unwrap()]);
    assert_eq!(
        (code, stderr.as_str()),
        (1, "musterd: --cert and --key must be given together\n")
    );
    assert!(!data.exists(), "--check-config created the data directory");
}
