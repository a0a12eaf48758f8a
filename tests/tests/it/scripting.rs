//! The CLI as scripts use it: `task find`, header lines, JSON errors, closed pipes,
//! confirmations, contexts, completions and the man page.

use muster_tests::Daemon;

fn json_lines(text: &str) -> Vec<serde_json::Value> {
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect()
}

fn ids_of(text: &str) -> Vec<String> {
    json_lines(text)
        .iter()
        .map(|t| t["id"].as_str().expect("an id").to_owned())
        .collect()
}

#[test]
fn task_find_searches_whole_queues_by_what_tasks_hold() {
    let d = Daemon::start();
    d.ok(&["queue", "create", "jobs"]);
    d.ok(&["queue", "create", "mail"]);
    let payloads = (0..250).map(|i| format!(r#"{{"order":{{"id":{i}}},"n":"item-{i}"}}"#));
    let stdin: String = payloads.map(|p| p + "\n").collect();
    let out = d.cli_stdin(&["enqueue", "jobs", "-"], Some(&stdin));
    assert!(out.status.success());
    let jobs: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(jobs.len(), 250);
    let keyed = d
        .ok(&[
            "enqueue",
            "mail",
            r#"{"to":"x"}"#,
            "--key",
            "cust-7",
            "--idempotency-key",
            "m-1",
        ])
        .trim()
        .to_owned();
    let claimed = d.ok(&["claim", "jobs", "--max", "1"]);
    let claim = claimed.split('\t').next().unwrap().to_owned();
    d.ok(&[
        "nack",
        &claim,
        "--error",
        "Upstream TIMED OUT",
        "--delay",
        "1h",
    ]);

    let find = |args: &[&str]| ids_of(&d.ok(&[&["task", "find", "--json"], args].concat()));
    assert_eq!(
        find(&["jobs", "--field", "order.id=200"]),
        vec![jobs[200].clone()]
    );
    assert_eq!(find(&["--payload", "item-249\""]), vec![jobs[249].clone()]);
    assert_eq!(find(&["--error", "timed out"]), vec![jobs[0].clone()]);
    assert_eq!(find(&["--state", "scheduled"]), vec![jobs[0].clone()]);
    assert_eq!(find(&["--key", "cust-7"]), vec![keyed.clone()]);
    assert_eq!(find(&["--idempotency-key", "m-1"]), vec![keyed.clone()]);
    assert_eq!(
        find(&["--id", &keyed[..22].to_lowercase()]),
        vec![keyed.clone()]
    );
    // Newest first, across queues, and on past the daemon's page of 100.
    let all = find(&["--newest", "--limit", "1000"]);
    let mut want: Vec<String> = jobs.iter().rev().cloned().collect();
    want.insert(0, keyed.clone());
    assert_eq!(all, want);
    assert_eq!(find(&["jobs", "--limit", "120"]), jobs[..120].to_vec());
    // Text output: one row per task, the same columns as `task list`.
    let text = d.ok(&["task", "find", "mail", "--no-headers"]);
    assert_eq!(text, format!("{keyed}\tmail\tready\t0\t0\t0\t-\n"));

    let bad = d.cli(&["task", "find", "--id", "01I"]);
    assert_eq!(bad.status.code(), Some(1));
    let err = String::from_utf8(bad.stderr).unwrap();
    assert!(
        err.starts_with("muster: bad_request: id prefix \"01I\""),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1);
}

/// The CLI with no connection settings from the environment, and its own config dir.
fn bare_cli(config: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = std::process::Command::new(muster_tests::muster_bin());
    cmd.args(args)
        .env_clear()
        .env("HOME", config)
        .env("XDG_CONFIG_HOME", config)
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .stdin(std::process::Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("running muster")
}

fn stdout(out: &std::process::Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).expect("utf-8 output")
}

#[test]
fn lists_have_a_header_line_unless_turned_off_and_json_has_none() {
    let d = Daemon::start();
    d.ok(&["queue", "create", "jobs"]);
    let id = d.ok(&["enqueue", "jobs", "1"]).trim().to_owned();
    assert_eq!(
        d.ok(&["queue", "list"]),
        "NAME\tREADY\tSCHEDULED\tLEASED\tSUSPENDED\tDONE\tDEAD\tCANCELLED\tPAUSED\njobs\t1\t0\t0\t0\t0\t0\t0\tfalse\n"
    );
    assert_eq!(
        d.ok(&["task", "list", "jobs"]),
        format!(
            "ID\tQUEUE\tSTATE\tPRIORITY\tDELIVERIES\tFAILURES\tLAST_ERROR\n{id}\tjobs\tready\t0\t0\t0\t-\n"
        )
    );
    assert_eq!(
        d.ok(&["task", "list", "jobs", "--no-headers"]),
        format!("{id}\tjobs\tready\t0\t0\t0\t-\n")
    );
    assert_eq!(
        d.ok(&["members"]),
        "NAME\tSTATE\tLEASES\tDRAINING\tLABELS\tLAST_SEEN\n"
    );
    let json = d.ok(&["task", "list", "jobs", "--json"]);
    assert_eq!(ids_of(&json), vec![id.clone()]);
    // A claim's JSON carries the claim string that ack takes.
    let claimed = json_lines(&d.ok(&["claim", "jobs", "--json"]));
    assert_eq!(claimed.len(), 1);
    let claim = claimed[0]["claim"].as_str().expect("a claim string");
    assert_eq!(claim, format!("{id}.1"));
    assert_eq!(d.ok(&["ack", claim]), "done\n");
}

#[test]
fn json_errors_are_one_object_on_stderr_with_code_and_message() {
    let d = Daemon::start();
    let cases: &[(&[&str], serde_json::Value)] = &[
        (
            &["task", "get", "01JDQ8Z9M4X6K2V7N3B5C8D1EF", "--json"],
            serde_json::json!({"error": {"code": "not_found", "message": "no task 01JDQ8Z9M4X6K2V7N3B5C8D1EF"}}),
        ),
        (
            &["enqueue", "jobs", "{", "--json"],
            serde_json::json!({"error": {"code": "invalid_input", "message": "PAYLOAD is not JSON: not valid JSON: EOF while parsing an object at line 1 column 1"}}),
        ),
        (
            &["--json", "queue", "frobnicate"],
            serde_json::json!({"error": {"code": "usage", "message": "unrecognized subcommand 'frobnicate' (see `muster queue --help`)"}}),
        ),
    ];
    for (args, want) in cases {
        let out = d.cli(args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}");
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        let got: serde_json::Value =
            serde_json::from_str(&err).unwrap_or_else(|e| panic!("{err}: {e}"));
        assert_eq!(&got, want, "{args:?}");
    }
}

#[test]
fn a_closed_stdout_ends_quietly_with_status_zero() {
    let d = Daemon::start();
    d.ok(&["queue", "create", "jobs"]);
    // More than a pipe holds (64 KiB), so the writer meets the closed pipe for certain.
    let stdin: String = (0..2000).map(|i| format!("{i}\n")).collect();
    assert!(
        d.cli_stdin(&["enqueue", "jobs", "-"], Some(&stdin))
            .status
            .success()
    );
    let mut child = std::process::Command::new(muster_tests::muster_bin())
        .args(["task", "list", "jobs", "--limit", "2000"])
        .env("MUSTER_ADDR", &d.addr)
        .env("MUSTER_DATA", d.data())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("starting muster");
    // The reader goes away before anything is written, as `| head -0` would.
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("running muster");
    assert_eq!(
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned()
        ),
        (Some(0), String::new())
    );
}

#[test]
fn destructive_commands_on_a_queue_with_tasks_need_yes_without_a_terminal() {
    let d = Daemon::start();
    d.ok(&["queue", "create", "jobs", "--max-attempts", "1"]);
    d.ok(&["queue", "create", "empty"]);
    for n in 0..3 {
        d.ok(&["enqueue", "jobs", &n.to_string()]);
    }
    let claim = d.ok(&["claim", "jobs"]);
    d.ok(&[
        "dead-letter",
        claim.split('\t').next().unwrap(),
        "--error",
        "bad",
    ]);
    let refused: &[(&[&str], &str)] = &[
        (
            &["queue", "purge", "jobs"],
            "muster: refusing to purge 2 ready and scheduled tasks of queue \"jobs\" without confirmation: pass --yes\n",
        ),
        (
            &["queue", "delete", "jobs"],
            "muster: refusing to delete queue \"jobs\" and its 3 tasks without confirmation: pass --yes\n",
        ),
        (
            &["discard", "jobs", "--all"],
            "muster: refusing to discard all 1 dead tasks of queue \"jobs\" without confirmation: pass --yes\n",
        ),
    ];
    for (args, message) in refused {
        let out = d.cli(args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert_eq!(String::from_utf8(out.stderr).unwrap(), *message);
    }
    let counts = |d: &Daemon| {
        let v: serde_json::Value =
            serde_json::from_str(&d.ok(&["queue", "describe", "jobs", "--json"])).unwrap();
        (v["ready"].as_u64(), v["dead"].as_u64())
    };
    assert_eq!(counts(&d), (Some(2), Some(1)), "nothing changed");
    // A dry run and an empty queue need no confirmation.
    d.ok(&["discard", "jobs", "--all", "--dry-run"]);
    assert_eq!(
        d.ok(&["queue", "delete", "empty"]),
        "deleted empty with 0 tasks\n"
    );
    assert_eq!(d.ok(&["queue", "purge", "jobs", "--yes"]), "purged 2\n");
    assert_eq!(
        d.ok(&["discard", "jobs", "--all", "--yes"]),
        "discarded 1\n"
    );
    assert_eq!(counts(&d), (Some(0), Some(0)));
}

#[test]
fn contexts_name_daemons_and_flags_and_environment_win_over_them() {
    // Open: a context trusting by pin reaches it without the local token.
    let d = Daemon::start_with(&["--open"]);
    d.ok(&["queue", "create", "ctx-jobs"]);
    let config = tempfile::tempdir().unwrap();
    let home = config.path();
    let data = d.data().to_str().unwrap().to_owned();
    let run = |args: &[&str], env: &[(&str, &str)]| bare_cli(home, args, env);
    assert_eq!(
        stdout(&run(
            &[
                "context", "add", "local", "--addr", &d.addr, "--data", &data
            ],
            &[]
        )),
        ""
    );
    let nowhere = "127.0.0.1:9";
    stdout(&run(
        &[
            "context",
            "add",
            "away",
            "--addr",
            nowhere,
            "--pin",
            &d.fingerprint,
        ],
        &[],
    ));
    // The first context added is current.
    assert!(stdout(&run(&["queue", "list", "--no-headers"], &[])).starts_with("ctx-jobs\t"));
    assert_eq!(
        stdout(&run(&["context", "list"], &[])),
        format!(
            "NAME\tCURRENT\tADDR\tTRUST\naway\tfalse\t{nowhere}\tpin {}\nlocal\ttrue\t{}\tdata {data}\n",
            d.fingerprint, d.addr
        )
    );
    stdout(&run(&["context", "use", "away"], &[]));
    let failed = run(&["queue", "list"], &[]);
    assert_eq!(failed.status.code(), Some(1));
    // --context and MUSTER_CONTEXT pick another; --addr wins over the context's.
    assert!(stdout(&run(&["--context", "local", "queue", "list"], &[])).contains("ctx-jobs"));
    assert!(stdout(&run(&["queue", "list"], &[("MUSTER_CONTEXT", "local")])).contains("ctx-jobs"));
    let addr = d.addr.clone();
    assert!(stdout(&run(&["queue", "list", "--addr", &addr], &[])).contains("ctx-jobs"));
    let unknown = run(&["--context", "nope", "queue", "list"], &[]);
    assert_eq!(
        String::from_utf8(unknown.stderr).unwrap(),
        "muster: no context \"nope\" (see `muster context list`)\n"
    );
    stdout(&run(&["context", "remove", "away"], &[]));
    assert_eq!(
        stdout(&run(&["context", "list", "--no-headers"], &[])),
        format!("local\tfalse\t{}\tdata {data}\n", d.addr)
    );
    let file = home.join("muster").join("contexts.toml");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );
}

#[test]
fn completions_and_the_man_page_come_from_the_command_line_definition() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| stdout(&bare_cli(dir.path(), args, &[]));
    let bash = run(&["completions", "bash"]);
    assert!(
        bash.contains("_muster()") && bash.contains("complete -F _muster"),
        "{bash}"
    );
    assert!(bash.contains("find"), "task find is completed");
    assert!(run(&["completions", "zsh"]).starts_with("#compdef muster"));
    let fish = run(&["completions", "fish"]);
    assert!(
        fish.contains("complete -c muster") && fish.contains("no-headers"),
        "{fish}"
    );
    let man = run(&["man"]);
    assert!(
        man.contains(".TH muster 1") && man.contains(".SH SUBCOMMANDS"),
        "{man}"
    );
    let bad = bare_cli(dir.path(), &["completions", "cmd.exe"], &[]);
    assert_eq!(bad.status.code(), Some(1));
}

#[test]
fn nothing_listening_is_reported_within_a_second() {
    // A port nobody listens on: taken from the OS, then let go.
    let port = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{port}");
    let pin = "ab".repeat(32);
    let started = std::time::Instant::now();
    let out = bare_cli(
        dir.path(),
        &["--addr", &addr, "--pin", &pin, "queue", "list"],
        &[],
    );
    let took = started.elapsed();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8(out.stderr).unwrap(),
        format!(
            "muster: connect: {addr}: nothing listens there (the host answered \"port unreachable\"): is musterd running?\n"
        )
    );
    assert!(took < std::time::Duration::from_secs(1), "took {took:?}");
}
