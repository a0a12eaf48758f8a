//! The CLI session of the core issue, typed as a new user would, with exact output.

use muster_tests::Daemon;

fn field<'a>(text: &'a str, key: &str) -> &'a str {
    text.lines()
        .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix('\t')))
        .unwrap_or_else(|| panic!("no {key} line in:\n{text}"))
}

#[test]
fn a_new_users_session_enqueue_claim_nack_claim_ack() {
    let d = Daemon::start();
    let created = d.ok(&["queue", "create", "jobs"]);
    assert_eq!(field(&created, "name"), "jobs");
    assert_eq!(field(&created, "lease"), "30s");

    let payload = r#"{"order":42,"task":"send-receipt"}"#;
    let id = d.ok(&["enqueue", "jobs", payload]).trim().to_owned();
    assert_eq!(id.len(), 26, "a ULID: {id:?}");

    let first = d.ok(&["claim", "jobs", "--max", "1", "--wait", "5s"]);
    assert_eq!(first, format!("{id}.1\t1\t{payload}\n"));
    let claim = format!("{id}.1");

    assert_eq!(d.ok(&["nack", &claim, "--delay", "0s"]), "ready\n");

    let second = d.ok(&["claim", "jobs", "--max", "1", "--wait", "5s"]);
    assert_eq!(second, format!("{id}.2\t2\t{payload}\n"));
    let claim2 = format!("{id}.2");

    assert_eq!(
        d.ok(&["ack", &claim2, "--result", r#"{"sent":true}"#]),
        "done\n"
    );

    let described = d.ok(&["queue", "describe", "jobs"]);
    for (state, n) in [
        ("ready", "0"),
        ("leased", "0"),
        ("dead", "0"),
        ("done", "1"),
        ("scheduled", "0"),
    ] {
        assert_eq!(field(&described, state), n, "{state} in:\n{described}");
    }
    let json: serde_json::Value =
        serde_json::from_str(&d.ok(&["queue", "describe", "jobs", "--json"])).unwrap();
    assert_eq!(
        (
            json["ready"].as_u64(),
            json["leased"].as_u64(),
            json["dead"].as_u64(),
            json["done"].as_u64()
        ),
        (Some(0), Some(0), Some(0), Some(1))
    );

    let task: serde_json::Value =
        serde_json::from_str(&d.ok(&["task", "get", &id, "--json"])).unwrap();
    assert_eq!(task["state"], "done");
    assert_eq!(task["deliveries"], 2);
    assert_eq!(task["failures"], 1);
    assert_eq!(task["result"], serde_json::json!({"sent": true}));
    assert_eq!(
        task["payload"],
        serde_json::json!({"order": 42, "task": "send-receipt"})
    );

    // The first claim is stale now: one line on stderr, exit status 1, nothing changed.
    let stale = d.cli(&["ack", &claim]);
    assert_eq!(stale.status.code(), Some(1));
    let err = String::from_utf8(stale.stderr).unwrap();
    assert!(err.starts_with("muster: lease_lost: "), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert_eq!(field(&d.ok(&["queue", "describe", "jobs"]), "done"), "1");
}

#[test]
fn enqueue_from_stdin_prints_ids_in_order_and_claim_json_lines() {
    let d = Daemon::start();
    d.ok(&["queue", "create", "bulk"]);
    let lines: String = (0..300).map(|i| format!("{{\"n\":{i}}}\n")).collect();
    let out = d.cli_stdin(&["enqueue", "bulk", "-"], Some(&lines));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ids: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(ids.len(), 300);
    let claimed = d.ok(&["claim", "bulk", "--max", "300", "--json"]);
    let payloads: Vec<(String, u64)> = claimed
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["id"].as_str().unwrap().to_owned(),
                v["payload"]["n"].as_u64().unwrap(),
            )
        })
        .collect();
    // Same priority: handed out in enqueue order, which is stdin order.
    let expected: Vec<(String, u64)> = ids.into_iter().zip(0..).collect();
    assert_eq!(payloads, expected);
}

#[test]
fn bad_input_gets_one_line_and_a_non_zero_exit() {
    let d = Daemon::start();
    d.ok(&["queue", "create", "jobs"]);
    // A payload nested 62 deep makes a request 65 deep: refused, and the refusal names
    // the request (it once came back without its id, and the CLI waited for ever).
    let deep = format!("{}1{}", "[".repeat(62), "]".repeat(62));
    let cases: &[(&[&str], &str)] = &[
        (
            &["enqueue", "jobs", &deep],
            "muster: bad_request: JSON nested 65 deep exceeds the limit of 64\n",
        ),
        (
            &["queue", "create", "Bad Name"],
            "muster: bad_request: invalid queue name",
        ),
        (&["queue", "create", "jobs"], "muster: already_exists: "),
        (
            &["enqueue", "jobs", "{not json"],
            "muster: PAYLOAD is not JSON",
        ),
        (
            &["enqueue", "nope", "1"],
            "muster: not_found: no queue \"nope\"",
        ),
        (&["ack", "nonsense"], "muster: invalid value 'nonsense'"),
        (
            &["enqueue", "jobs", "1", "--priority", "12"],
            "muster: invalid value '12' for '--priority <PRIORITY>': 12 is not in 0..=9 (see `muster enqueue --help`)\n",
        ),
        (
            &["queue", "create"],
            "muster: the following required arguments were not provided: <NAME> (see `muster queue create --help`)\n",
        ),
        (
            &["claim", "jobs", "--max", "0"],
            "muster: bad_request: max 0 is outside 1..=1000",
        ),
        (
            &["task", "get", "01JDQ8Z9M4X6K2V7N3B5C8D1EF"],
            "muster: not_found: no task 01JDQ8Z9M4X6K2V7N3B5C8D1EF",
        ),
    ];
    for (args, prefix) in cases {
        let out = d.cli(args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = String::from_utf8(out.stderr).unwrap();
        assert!(err.starts_with(prefix), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
    }
    let described = d.ok(&["queue", "describe", "jobs"]);
    assert_eq!(field(&described, "ready"), "0");
}

#[test]
fn wait_returns_when_another_process_finishes_the_task() {
    let d = Daemon::start();
    d.ok(&["queue", "create", "jobs"]);
    let id = d.ok(&["enqueue", "jobs", "7"]).trim().to_owned();
    let data = d.data().to_path_buf();
    let addr = d.addr.clone();
    let waiter = std::thread::spawn({
        let id = id.clone();
        move || {
            std::process::Command::new(muster_tests::muster_bin())
                .args(["wait", &id, "--timeout", "30s"])
                .env("MUSTER_ADDR", addr)
                .env("MUSTER_DATA", data)
                .output()
                .unwrap()
        }
    });
    let line = d.ok(&["claim", "jobs", "--wait", "5s"]);
    let claim = line.split('\t').next().unwrap();
    d.ok(&["ack", claim, "--result", "\"ok\""]);
    let out = waiter.join().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        format!("{id}\tdone\t\"ok\"\n")
    );
    let timed_out = d.cli(&[
        "wait",
        d.ok(&["enqueue", "jobs", "8"]).trim(),
        "--timeout",
        "100ms",
    ]);
    assert_eq!(timed_out.status.code(), Some(1));
    assert!(
        String::from_utf8(timed_out.stderr)
            .unwrap()
            .starts_with("muster: timed out: 1 of the tasks did not finish")
    );
}

#[test]
fn stats_show_counts_totals_and_group_commit() {
    let d = Daemon::start();
    d.ok(&["queue", "create", "jobs"]);
    d.ok(&["enqueue", "jobs", "1"]);
    d.ok(&["enqueue", "jobs", "2"]);
    let claim = d.ok(&["claim", "jobs"]);
    d.ok(&["ack", claim.split('\t').next().unwrap()]);
    let one = d.ok(&["stats", "jobs"]);
    let lines: Vec<Vec<&str>> = one.lines().map(|l| l.split('\t').collect()).collect();
    assert_eq!(lines.len(), 2, "{one}");
    assert_eq!(
        lines[0],
        [
            "QUEUE",
            "READY",
            "SCHEDULED",
            "LEASED",
            "SUSPENDED",
            "DONE",
            "DEAD",
            "CANCELLED",
            "HELD_BACK",
            "UNCLAIMABLE",
            "OLDEST_READY_AGE",
            "ENQUEUED",
            "ACKED",
            "NACKED",
            "LAPSED",
            "PAUSED"
        ]
    );
    let row = &lines[1];
    assert_eq!(
        row[..10],
        ["jobs", "1", "0", "0", "0", "1", "0", "0", "0", "0"],
        "{one}"
    );
    assert_eq!(row[11..], ["2", "1", "0", "0", "false"], "{one}");
    let all = d.ok(&["stats", "--no-headers"]);
    let mut parts = all.split("\n\n");
    assert_eq!(parts.next().map(|t| t.lines().count()), Some(1), "{all}");
    let daemon: Vec<&str> = parts.next().unwrap().trim_end().split('\t').collect();
    assert_eq!(
        (daemon.len(), daemon[3], daemon[4]),
        (5, "0", "off"),
        "{all}"
    );
}

#[test]
fn text_from_other_clients_cannot_drive_the_operators_terminal() {
    let d = Daemon::start();
    d.ok(&["queue", "create", "jobs", "--max-attempts", "1"]);
    // A producer's payload and a consumer's error carrying a title change, a screen
    // clear, an OSC 52 clipboard write, a C1 CSI, a bidi override and a forged line.
    let evil =
        "\u{1b}]0;pwned\u{7}\u{1b}[2J\u{1b}]52;c;ZXZpbA==\u{7}\u{9b}31m\u{202e}\nstate\tdone";
    let payload = serde_json::json!({ "note": evil }).to_string();
    let id = d.ok(&["enqueue", "jobs", &payload]).trim().to_owned();
    let claimed = d.ok(&["claim", "jobs"]);
    let claim = claimed.split('\t').next().unwrap().to_owned();
    d.ok(&["nack", &claim, "--error", evil]);
    let dangerous = |c: char| {
        (c.is_control() && c != '\n' && c != '\t') || ('\u{202a}'..='\u{202e}').contains(&c)
    };
    for args in [
        vec!["task", "get", id.as_str()],
        vec!["dead", "jobs"],
        vec!["claim", "jobs"],
    ] {
        let out = d.ok(&args);
        assert!(
            !out.contains(dangerous),
            "{args:?} printed a control character: {out:?}"
        );
        assert!(
            !out.lines().any(|l| l == "state\tdone"),
            "{args:?} let a field forge a line: {out:?}"
        );
    }
    let got = d.ok(&["task", "get", &id]);
    assert_eq!(
        field(&got, "last_error"),
        "\\u{1b}]0;pwned\\u{7}\\u{1b}[2J\\u{1b}]52;c;ZXZpbA==\\u{7}\\u{9b}31m\\u{202e}\\nstate\\tdone"
    );
    // The JSON stays the same JSON.
    let shown: serde_json::Value = serde_json::from_str(field(&got, "payload")).unwrap();
    assert_eq!(shown["note"], evil);
}

#[test]
fn cluster_commands_on_a_single_daemon_say_it_is_not_a_cluster_node() {
    let d = Daemon::start();
    let alone = "muster: invalid_state: this daemon is not a cluster node (start it with --cluster-id to run a cluster)\n";
    let dead = std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("a UDP port")
        .port();
    let both = format!("127.0.0.1:{dead},{}", d.addr);
    let cases: &[&[&str]] = &[
        // One address: that node's own view.
        &["cluster", "status"],
        // Several: the leader's, here the single daemon among them.
        &["--addr", &both, "cluster", "status"],
        &[
            "cluster",
            "add",
            "2",
            "--node-addr",
            "127.0.0.1:7520",
            "--cluster-addr",
            "127.0.0.1:7521",
        ],
        &["--addr", &both, "cluster", "remove", "2"],
    ];
    for args in cases {
        let out = d.cli(args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert_eq!(String::from_utf8(out.stderr).unwrap(), alone, "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    let bad = d.cli(&["--addr", &format!("{},", d.addr), "cluster", "status"]);
    assert_eq!(bad.status.code(), Some(1));
    assert_eq!(
        String::from_utf8(bad.stderr).unwrap(),
        format!(
            "muster: invalid input: an empty address in \"{},\" (addresses are HOST:PORT separated by commas)\n",
            d.addr
        )
    );
}

/// `muster enqueue QUEUE -` fed by hand, its stdout read line by line.
pub(crate) struct Feeder {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    ids: std::sync::mpsc::Receiver<String>,
}

impl Feeder {
    fn start(d: &Daemon, args: &[&str]) -> Feeder {
        let mut cmd = std::process::Command::new(muster_tests::muster_bin());
        cmd.args(args)
            .env("MUSTER_ADDR", &d.addr)
            .env("MUSTER_DATA", d.data());
        Feeder::spawn(cmd)
    }

    /// Runs `cmd` (the CLI, its arguments and environment set) with piped stdio.
    pub(crate) fn spawn(mut cmd: std::process::Command) -> Feeder {
        use std::io::BufRead;
        use std::process::Stdio;
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting muster");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, ids) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let stdin = child.stdin.take();
        Feeder { child, stdin, ids }
    }

    pub(crate) fn send(&mut self, line: &str) {
        use std::io::Write;
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{line}").expect("writing a line");
        stdin.flush().expect("flushing stdin");
    }

    /// The next id printed, waiting up to 10 s.
    pub(crate) fn id(&self) -> String {
        self.ids
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("an id printed while stdin is still open")
    }

    /// Closes stdin and waits for the exit: status, the rest of stdout, stderr.
    pub(crate) fn finish(mut self) -> (std::process::ExitStatus, Vec<String>, String) {
        use std::io::Read;
        drop(self.stdin.take());
        let mut stderr = String::new();
        self.child
            .stderr
            .take()
            .expect("stderr")
            .read_to_string(&mut stderr)
            .expect("reading stderr");
        let status = self.child.wait().expect("muster's exit");
        let rest = self.ids.try_iter().collect();
        (status, rest, stderr)
    }
}

#[test]
fn enqueue_from_stdin_prints_each_id_as_it_is_acknowledged_and_names_the_unanswered_lines() {
    let mut d = Daemon::start();
    d.ok(&["queue", "create", "stream"]);
    let mut feeder = Feeder::start(&d, &["enqueue", "stream", "-"]);
    // Each id arrives while stdin is still open, long before 256 are in flight.
    let mut acknowledged = Vec::new();
    for n in 1..=3 {
        feeder.send(&format!("{{\"n\":{n}}}"));
        acknowledged.push(feeder.id());
    }
    // The daemon dies: the next two lines are sent and never answered.
    d.kill9();
    feeder.send(r#"{"n":4}"#);
    feeder.send(r#"{"n":5}"#);
    let (status, rest, stderr) = feeder.finish();
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(rest.is_empty(), "no more ids: {rest:?}");
    let stderr = stderr.trim_end();
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(
        stderr.starts_with(
            "muster: line 4: connection lost: the daemon acknowledged nothing sent to it for 500 ms"
        ),
        "{stderr}"
    );
    assert!(
        stderr.ends_with(
            "3 lines enqueued (their ids printed); 2 sent without an answer (outcome_unknown: they may be stored; enqueue them again with idempotency keys): lines 4-5; stdin was not read past line 5"
        ),
        "{stderr}"
    );
    // What was printed is exactly what is stored.
    d.restart();
    let stored: Vec<String> = d
        .ok(&["task", "list", "stream", "--state", "ready", "--no-headers"])
        .lines()
        .map(|l| l.split('\t').next().expect("an id column").to_owned())
        .collect();
    assert_eq!(stored, acknowledged);
}

#[test]
fn enqueue_from_stdin_keys_each_line_from_its_payload() {
    let d = Daemon::start();
    d.ok(&["queue", "create", "orders"]);
    let lines = "{\"order\":\"a-1\"}\n{\"order\":7}\n";
    let args = [
        "enqueue",
        "orders",
        "-",
        "--idempotency-key",
        "order-{/order}",
    ];
    let first = d.cli_stdin(&args, Some(lines));
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    assert!(
        first.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let ids = String::from_utf8(first.stdout).unwrap();
    assert_eq!(ids.lines().count(), 2, "{ids}");
    // Sent again, nothing new is stored: the same ids print, each said on stderr.
    let again = d.cli_stdin(&args, Some(lines));
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    assert_eq!(String::from_utf8(again.stdout).unwrap(), ids);
    let notes: Vec<String> = ids
        .lines()
        .map(|id| {
            format!(
                "muster: {id}: already enqueued under this idempotency key (nothing new stored)"
            )
        })
        .collect();
    assert_eq!(
        String::from_utf8(again.stderr).unwrap(),
        notes.join("\n") + "\n"
    );
    let keys: Vec<String> = ids
        .lines()
        .map(|id| {
            let task: serde_json::Value =
                serde_json::from_str(&d.ok(&["task", "get", id, "--json"])).unwrap();
            task["idempotency_key"]
                .as_str()
                .unwrap_or("none")
                .to_owned()
        })
        .collect();
    assert_eq!(keys, ["order-a-1", "order-7"]);

    // A template without a field, and a line without it, are refused with one line.
    let plain = d.cli_stdin(
        &["enqueue", "orders", "-", "--idempotency-key", "k"],
        Some(lines),
    );
    assert_eq!(plain.status.code(), Some(1));
    assert_eq!(
        String::from_utf8(plain.stderr).unwrap(),
        "muster: with PAYLOAD -, --idempotency-key is a template that gives each line its own key and must name a field of the payload, e.g. 'order-{/order_id}'\n"
    );
    let missing = d.cli_stdin(&args, Some("{\"order\":\"b\"}\n{\"other\":1}\n"));
    assert_eq!(missing.status.code(), Some(1));
    assert_eq!(
        String::from_utf8(missing.stdout).unwrap().lines().count(),
        1
    );
    assert_eq!(
        String::from_utf8(missing.stderr).unwrap(),
        "muster: line 2: the payload has no /order for the idempotency key; 1 line enqueued (their ids printed); stdin was not read past line 2\n"
    );
}

/// A member name bound to the token that first used it says, to the token refused it,
/// how it is freed: `muster member release NAME` by an admin, or the expiry.
#[test]
fn a_member_name_bound_to_another_token_says_how_to_free_it() {
    const ADMIN: &str = "admin-token-for-the-cli-test-0123";
    const FIRST: &str = "first-token-for-the-cli-test-0123";
    const SECOND: &str = "second-token-for-the-cli-test-012";
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("muster.toml");
    std::fs::write(
        &config,
        format!(
            "[[tokens]]\nname = \"admin\"\ntoken = \"{ADMIN}\"\nroles = [\"admin\"]\n\n\
             [[tokens]]\nname = \"first\"\ntoken = \"{FIRST}\"\nroles = [\"consume\"]\n\n\
             [[tokens]]\nname = \"second\"\ntoken = \"{SECOND}\"\nroles = [\"consume\"]\n"
        ),
    )
    .unwrap();
    let d = Daemon::start_with(&["--config", config.to_str().unwrap()]);
    let as_token = |token: &str, args: &[&str]| {
        let mut all = vec!["--token", token];
        all.extend_from_slice(args);
        d.cli(&all)
    };
    let ok = |token: &str, args: &[&str]| {
        let out = as_token(token, args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    ok(ADMIN, &["queue", "create", "jobs"]);
    ok(ADMIN, &["enqueue", "jobs", "1"]);
    // A claim that gets a task binds the name to the first token.
    let claimed = ok(FIRST, &["claim", "jobs", "--member", "agent-1"]);
    let claim = claimed.split('\t').next().unwrap().to_owned();
    assert_eq!(ok(FIRST, &["ack", &claim]), "done\n");

    let refused = as_token(SECOND, &["claim", "jobs", "--member", "agent-1"]);
    assert_eq!(refused.status.code(), Some(1));
    assert_eq!(
        String::from_utf8(refused.stderr).unwrap(),
        "muster: forbidden: member \"agent-1\" belongs to another principal; an admin of \
         every queue frees it with `muster member release agent-1`, or it frees itself \
         after --member-name-expiry (24 h by default) with no session and no lease\n"
    );
    // Doing what it says frees the name for the second token.
    ok(ADMIN, &["member", "release", "agent-1"]);
    ok(ADMIN, &["enqueue", "jobs", "2"]);
    let claimed = ok(SECOND, &["claim", "jobs", "--member", "agent-1"]);
    assert!(claimed.ends_with("\t1\t2\n"), "{claimed:?}");
}

/// `muster guard --dir DIR` removes DIR at the end, so it takes only the private
/// directory `muster work` makes for it; anything else is refused at once, in one line,
/// and left as it was.
#[test]
fn muster_guard_refuses_a_dir_that_is_not_a_runners_private_directory() {
    use std::os::unix::fs::PermissionsExt;
    let root = tempfile::tempdir().unwrap();
    let guard = |dir: &std::path::Path| {
        std::process::Command::new(muster_tests::muster_bin())
            .arg("guard")
            .arg("--dir")
            .arg(dir)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
    };
    let make = |name: &str, mode: u32| {
        let dir = root.path().join(name);
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("keep"), "precious").unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
        dir
    };
    let home = make("home", 0o700);
    let wide = make("muster-work-wide", 0o755);
    let file = root.path().join("muster-work-file");
    std::fs::write(&file, "precious").unwrap();
    let link = root.path().join("muster-work-link");
    std::os::unix::fs::symlink(&home, &link).unwrap();
    let missing = root.path().join("muster-work-missing");
    let mut refused = vec![
        (
            home.clone(),
            "its name does not start with muster-work-".to_owned(),
        ),
        (
            wide.clone(),
            "its mode is 0755, not 0700 or 0711".to_owned(),
        ),
        (file.clone(), "it is not a directory".to_owned()),
        (link.clone(), "it is a symbolic link".to_owned()),
        (missing, "No such file or directory (os error 2)".to_owned()),
    ];
    // Another user's directory (only root can make one to test with; chown to one's
    // own uid succeeds for anyone, so the other uid is never this process's).
    let theirs = make("muster-work-theirs", 0o700);
    let me = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(root.path().join("home")).unwrap().uid()
    };
    let other = if me == 65534 { 65533 } else { 65534 };
    if std::os::unix::fs::chown(&theirs, Some(other), None).is_ok() {
        refused.push((
            theirs,
            format!("it is owned by uid {other}, not this user (uid {me})"),
        ));
    }
    for (dir, why) in refused {
        let out = guard(&dir);
        assert_eq!(out.status.code(), Some(1), "{}", dir.display());
        assert_eq!(
            String::from_utf8(out.stderr).unwrap(),
            format!(
                "muster: refusing --dir {}: {why} (muster guard removes only the private \
                 directory muster work made for it: a directory of this user named \
                 muster-work-*, mode 0700 or 0711, not a symbolic link)\n",
                dir.display()
            )
        );
    }
    // Nothing refused was touched.
    assert_eq!(
        std::fs::read_to_string(home.join("keep")).unwrap(),
        "precious"
    );
    assert_eq!(
        std::fs::read_to_string(wide.join("keep")).unwrap(),
        "precious"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "precious");
    assert!(
        std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    // The real thing (0700, or 0711 with --user) is removed when stdin ends.
    for mode in [0o700, 0o711] {
        let private = make(&format!("muster-work-{mode:o}"), mode);
        let out = guard(&private);
        assert_eq!(
            (out.status.code(), String::from_utf8(out.stderr).unwrap()),
            (Some(0), String::new())
        );
        assert!(!private.exists(), "{}", private.display());
    }
}

/// `stats --json`: one object per line, each with its `kind`, the queues' as
/// `queue describe --json` has them, the daemon's last.
#[test]
fn stats_json_gives_every_line_a_kind() {
    let d = Daemon::start();
    d.ok(&["queue", "create", "jobs"]);
    d.ok(&["queue", "create", "mail"]);
    d.ok(&["enqueue", "jobs", "1"]);
    let lines = |args: &[&str]| -> Vec<serde_json::Value> {
        d.ok(args)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
            .collect()
    };
    let all = lines(&["stats", "--json"]);
    let kinds: Vec<&str> = all.iter().map(|l| l["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["queue", "queue", "daemon"]);
    // A queue's line is its `queue describe --json` object with `kind` first.
    let described: serde_json::Value =
        serde_json::from_str(&d.ok(&["queue", "describe", "jobs", "--json"])).unwrap();
    let mut jobs = all[0].as_object().unwrap().clone();
    assert_eq!(jobs.keys().next().map(String::as_str), Some("kind"));
    jobs.remove("kind");
    assert_eq!(serde_json::Value::Object(jobs), described);
    assert_eq!(all[1]["name"], "mail");
    let daemon = all[2].as_object().unwrap();
    assert_eq!(
        daemon.keys().map(String::as_str).collect::<Vec<_>>(),
        [
            "kind",
            "syncs",
            "synced_requests",
            "batch_factor",
            "members_connected",
            "disk_alarm"
        ]
    );
    assert_eq!(
        (&daemon["members_connected"], &daemon["disk_alarm"]),
        (&serde_json::json!(0), &serde_json::json!(false))
    );
    // One queue: its line alone.
    let one = lines(&["stats", "jobs", "--json"]);
    assert_eq!(one.len(), 1);
    assert_eq!(
        (&one[0]["kind"], &one[0]["name"]),
        (&"queue".into(), &"jobs".into())
    );
}

/// A context keeps a token file's path (never the token) and commands under it present
/// the token as `--token-file` would.
#[test]
fn a_context_with_a_token_file_presents_its_token() {
    use std::os::unix::fs::PermissionsExt;
    const ADMIN: &str = "admin-token-for-the-context-test-01";
    let config_dir = tempfile::tempdir().unwrap();
    let config = config_dir.path().join("muster.toml");
    std::fs::write(
        &config,
        format!("[[tokens]]\nname = \"ops\"\ntoken = \"{ADMIN}\"\nroles = [\"admin\"]\n"),
    )
    .unwrap();
    let d = Daemon::start_with(&["--config", config.to_str().unwrap()]);
    let home = tempfile::tempdir().unwrap();
    let secrets = home.path().join("secrets");
    std::fs::create_dir(&secrets).unwrap();
    let token_file = secrets.join("ops.token");
    std::fs::write(&token_file, format!("{ADMIN}\n")).unwrap();
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    // muster with nothing but HOME and the contexts file, run from `cwd`.
    let run = |cwd: &std::path::Path, args: &[&str]| {
        std::process::Command::new(muster_tests::muster_bin())
            .args(args)
            .current_dir(cwd)
            .env_clear()
            .env("HOME", home.path())
            .env("XDG_CONFIG_HOME", home.path())
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
    };
    let ok = |args: &[&str]| {
        let out = run(home.path(), args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    // Without a token the daemon refuses.
    ok(&[
        "context",
        "add",
        "bare",
        "--addr",
        &d.addr,
        "--pin",
        &d.fingerprint,
    ]);
    let refused = run(home.path(), &["queue", "list"]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        String::from_utf8(refused.stderr)
            .unwrap()
            .starts_with("muster: unauthorized: "),
    );
    // Added from another directory with a relative path: kept absolute.
    let added = run(
        &secrets,
        &[
            "context",
            "add",
            "ops",
            "--addr",
            &d.addr,
            "--pin",
            &d.fingerprint,
            "--token-file",
            "ops.token",
        ],
    );
    assert!(
        added.status.success(),
        "{}",
        String::from_utf8_lossy(&added.stderr)
    );
    let file = home.path().join("muster").join("contexts.toml");
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(
        text.contains(&format!(
            "[contexts.ops]\naddr = \"{}\"\npin = \"{}\"\ntoken_file = \"{}\"\n",
            d.addr,
            d.fingerprint,
            token_file.display()
        )),
        "{text}"
    );
    assert!(
        !text.contains(ADMIN),
        "the token itself is never kept: {text}"
    );
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert_eq!(
        ok(&["context", "list", "--no-headers"]),
        format!(
            "bare\ttrue\t{addr}\tpin {pin}\nops\tfalse\t{addr}\tpin {pin}, token file {}\n",
            token_file.display(),
            addr = d.addr,
            pin = d.fingerprint
        )
    );
    // Under the context, the token is presented: an admin's command succeeds.
    assert!(
        ok(&["--context", "ops", "queue", "create", "jobs", "--json"])
            .contains("\"name\":\"jobs\"")
    );
    ok(&["context", "use", "ops"]);
    assert!(ok(&["queue", "list", "--no-headers"]).starts_with("jobs\t"));
    // A literal token is refused: a context keeps none in plain text.
    let literal = run(
        home.path(),
        &[
            "context", "add", "leak", "--addr", &d.addr, "--token", ADMIN,
        ],
    );
    assert_eq!(literal.status.code(), Some(1));
    assert_eq!(
        String::from_utf8(literal.stderr).unwrap(),
        "muster: a context keeps no token: put it in a file only you can read and give \
         --token-file FILE instead of --token or MUSTER_TOKEN\n"
    );
    assert!(!std::fs::read_to_string(&file).unwrap().contains(ADMIN));
}

/// `muster man --dir DIR` writes a page per command, named after it, each naming every
/// option and argument of its command; `muster man SUBCOMMAND...` prints one of them.
#[test]
fn every_subcommand_has_a_man_page_naming_its_options() {
    let dir = tempfile::tempdir().unwrap();
    let pages = dir.path().join("man1");
    let muster = |args: &[&str]| {
        std::process::Command::new(muster_tests::muster_bin())
            .args(args)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
    };
    let written = muster(&["man", "--dir", pages.to_str().unwrap()]);
    assert!(
        written.status.success(),
        "{}",
        String::from_utf8_lossy(&written.stderr)
    );
    let listed: Vec<String> = String::from_utf8(written.stdout)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    // Every command of the definition, hidden ones (`guard`) aside, from the top (each
    // before its subcommands), with the names its page must give its options.
    let root = muster_tui::commands::man_command();
    let mut commands: Vec<(Vec<String>, Vec<String>)> = Vec::new();
    let mut stack = vec![(Vec::<String>::new(), &root)];
    while let Some((path, command)) = stack.pop() {
        let names = command
            .get_arguments()
            .filter(|a| !a.is_hide_set())
            .map(|a| match (a.get_long(), a.get_short()) {
                (Some(long), _) => format!("\\fB\\-\\-{}\\fR", long.replace('-', "\\-")),
                (None, Some(short)) => format!("\\fB\\-{short}\\fR"),
                (None, None) => format!(
                    "\\fI{}\\fR",
                    a.get_value_names().expect("a positional's value name")[0].replace('-', "\\-")
                ),
            })
            .collect();
        let subs: Vec<_> = command
            .get_subcommands()
            .filter(|s| !s.is_hide_set())
            .collect();
        for sub in subs.into_iter().rev() {
            let mut path = path.clone();
            path.push(sub.get_name().to_owned());
            stack.push((path, sub));
        }
        commands.push((path, names));
    }
    assert!(commands.len() > 50, "{}", commands.len());
    let files: Vec<String> = commands
        .iter()
        .map(|(path, _)| {
            let name = std::iter::once("muster")
                .chain(path.iter().map(String::as_str))
                .collect::<Vec<_>>()
                .join("-");
            pages.join(format!("{name}.1")).display().to_string()
        })
        .collect();
    assert_eq!(listed, files);
    for ((path, options), file) in commands.iter().zip(&files) {
        let page = std::fs::read_to_string(file).unwrap();
        let title = std::iter::once("muster")
            .chain(path.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join("-");
        assert!(page.contains(&format!(".TH {title} 1 ")), "{file}");
        for option in options {
            assert!(
                page.contains(option.as_str()),
                "{file} does not name {option}"
            );
        }
        // `muster man SUBCOMMAND...` prints the same page.
        let mut args = vec!["man"];
        args.extend(path.iter().map(String::as_str));
        let printed = muster(&args);
        assert_eq!(String::from_utf8(printed.stdout).unwrap(), page, "{args:?}");
    }
    // queue create's page names its own options and the global ones.
    let create = std::fs::read_to_string(pages.join("muster-queue-create.1")).unwrap();
    for option in [
        "\\-\\-max\\-attempts",
        "\\-\\-lease",
        "\\-\\-token\\-file",
        "<\\fINAME\\fR>",
    ] {
        assert!(create.contains(option), "{option}: {create}");
    }
    let unknown = muster(&["man", "queue", "nope"]);
    assert_eq!(unknown.status.code(), Some(1));
    assert_eq!(
        String::from_utf8(unknown.stderr).unwrap(),
        "muster: muster queue has no subcommand \"nope\" (see `muster queue --help`)\n"
    );
}
