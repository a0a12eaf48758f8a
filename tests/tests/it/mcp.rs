//! `muster mcp` end to end: the official Python MCP client (the `mcp` package from
//! PyPI, 2.x; `tests/fixtures/mcp_client.py`) against `muster mcp` over stdio and
//! streamable HTTP, against a real daemon with admin, producer, approver, consumer and
//! queue-scoped admin tokens.
//!
//! Then, spoken to as JSON-RPC lines, a server whose daemon is killed and restarted.
//!
//! The client's Python is named by `MUSTER_TEST_MCP_PYTHON` (`.ci/run` makes a venv
//! with `mcp` installed and sets it); without it the test fails saying how to make one.

use std::io::Read as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use muster_sdk::protocol::ops::Claim;
use muster_sdk::{Chunk, NewTask, QueuePatch};
use muster_tests::Daemon;

const ADMIN: &str = "mcp-admin-token-0123456789abcdef";
const PRODUCER: &str = "mcp-producer-token-0123456789ab";
const APPROVER: &str = "mcp-approver-token-0123456789ab";
const CONSUMER: &str = "mcp-consumer-token-0123456789ab";
const QUEUE_ADMIN: &str = "mcp-queue-admin-token-012345678";
/// The bearer token HTTP clients of `muster mcp --http` present.
const BEARER: &str = "mcp-http-bearer-0123456789abcdef";

/// Longest the Python client may take for every check.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(300);

/// The variable naming a Python that has the `mcp` package.
const PYTHON_VAR: &str = "MUSTER_TEST_MCP_PYTHON";

fn python() -> PathBuf {
    let Some(python) = std::env::var_os(PYTHON_VAR) else {
        panic!(
            "{PYTHON_VAR} is not set: it names a Python with the MCP client package, e.g. \
             `python3 -m venv /tmp/mcpvenv && /tmp/mcpvenv/bin/pip install 'mcp>=2.3,<3'` \
             then {PYTHON_VAR}=/tmp/mcpvenv/bin/python (.ci/run does this)"
        )
    };
    PathBuf::from(python)
}

/// Writes `text` to `dir/name`, readable by its owner only; returns the path.
fn private_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("writing a token file");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
        .expect("making a token file private");
    path
}

fn secured() -> (Daemon, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("config dir");
    let config = format!(
        "[[tokens]]\nname = \"admin\"\ntoken = \"{ADMIN}\"\nroles = [\"admin\"]\n\n\
         [[tokens]]\nname = \"producer\"\ntoken = \"{PRODUCER}\"\nroles = [\"produce\"]\n\
         queues = [\"jobs\", \"jobs.*\"]\n\n\
         [[tokens]]\nname = \"approver\"\ntoken = \"{APPROVER}\"\nroles = [\"approve\"]\n\n\
         [[tokens]]\nname = \"consumer\"\ntoken = \"{CONSUMER}\"\nroles = [\"consume\"]\n\n\
         [[tokens]]\nname = \"queue-admin\"\ntoken = \"{QUEUE_ADMIN}\"\nroles = [\"admin\"]\n\
         queues = [\"jobs\", \"jobs.*\"]\n"
    );
    let path = private_file(dir.path(), "muster.toml", &config);
    let d = Daemon::start_with(&["--config", path.to_str().expect("utf-8 path")]);
    (d, dir)
}

/// A finished task of queue `talk` with three chunks of output: `alpha\n`, `beta\n`
/// and `{"n":3}`, emitted by member `mcp-test/writer`.
async fn task_with_output(d: &Daemon) -> String {
    let admin = d.client_as(ADMIN).await;
    admin
        .queue_create("jobs", QueuePatch::default())
        .await
        .expect("creating jobs");
    admin
        .queue_create("talk", QueuePatch::default())
        .await
        .expect("creating talk");
    let id = admin
        .enqueue(
            "talk",
            NewTask::new(muster_sdk::json(&"why is the sky blue?").expect("json")),
        )
        .await
        .expect("enqueue")
        .id;
    let delivery = admin
        .claim(&Claim::new(["talk"]).member("mcp-test/writer"))
        .await
        .expect("claim")
        .pop()
        .expect("the task is claimed");
    assert_eq!(delivery.id, id);
    let chunks = vec![
        Chunk::text("alpha\n"),
        Chunk::text("beta\n"),
        Chunk::json(muster_sdk::json(&serde_json::json!({"n": 3})).expect("json")),
    ];
    admin
        .emit(&id, delivery.epoch, 0, chunks)
        .await
        .expect("emit");
    admin.ack(&id, delivery.epoch, None).await.expect("ack");
    admin.close().await;
    id
}

/// Every tool through a real MCP client, with exact results: the tool lists of an
/// admin, a producer, an approver, a consumer and a queue-scoped admin token (chosen
/// by the principal the daemon's `hello` names), the queues a scoped token covers in
/// the instructions and the tool descriptions, annotations and schemas, enqueue (many,
/// idempotency keys, keys, groups, labels), get, wait, find (paged), queues with counts,
/// members, cancel, redrive, discard, suspended tasks resumed and rejected (a reject of
/// a task no longer suspended refused by the daemon: `invalid_state`), output read
/// in bounded parts; refusals mapped to tool errors with their codes (`not_found`,
/// `forbidden` from the daemon and for a tool the token may not use,
/// `confirmation_required`, `bad_arguments`, `invalid_state`, `stale_token`); and the
/// same server over streamable HTTP behind its bearer token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_client_uses_every_tool_within_its_tokens_roles() {
    let python = python();
    let (d, dir) = secured();
    let tail_task = task_with_output(&d).await;
    // A connected agent for `list_members`, subscribed to nothing.
    let agent = d.client_as(ADMIN).await;
    agent
        .open_session(&muster_sdk::protocol::ops::SessionOpen {
            member: "mcp-test/gpu-agent".into(),
            labels: vec!["gpu".into()],
            capacity: 2,
            reclaim: false,
            resume: false,
            held: None,
            liveness_ms: None,
        })
        .await
        .expect("session");
    let admin = private_file(dir.path(), "admin.token", ADMIN);
    let producer = private_file(dir.path(), "producer.token", PRODUCER);
    let approver = private_file(dir.path(), "approver.token", APPROVER);
    let consumer = private_file(dir.path(), "consumer.token", CONSUMER);
    let queue_admin = private_file(dir.path(), "queue-admin.token", QUEUE_ADMIN);
    let bearer = private_file(dir.path(), "bearer.token", BEARER);
    let script = muster_tests::fixtures_dir().join("mcp_client.py");
    let mut child = Command::new(&python)
        .arg(&script)
        .env("MUSTER_BIN", muster_tests::muster_bin())
        .env("MUSTER_ADDR", &d.addr)
        .env("MUSTER_DATA", d.data())
        .env_remove("MUSTER_TOKEN")
        .env_remove("MUSTER_CONTEXT")
        .env_remove("MUSTER_PIN")
        .env_remove("MUSTER_CA")
        .env("ADMIN_TOKEN_FILE", &admin)
        .env("PRODUCER_TOKEN_FILE", &producer)
        .env("APPROVER_TOKEN_FILE", &approver)
        .env("CONSUMER_TOKEN_FILE", &consumer)
        .env("QUEUE_ADMIN_TOKEN_FILE", &queue_admin)
        .env("BEARER_FILE", &bearer)
        .env("BEARER", BEARER)
        .env("TAIL_TASK", &tail_task)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {} {}: {e}", python.display(), script.display()));
    // Both pipes are read to their end by threads, so the client never blocks on them.
    let read = |mut pipe: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            text
        })
    };
    let stdout = read(Box::new(child.stdout.take().expect("stdout")));
    let stderr = read(Box::new(child.stderr.take().expect("stderr")));
    let deadline = Instant::now() + CLIENT_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for the client") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the MCP client did not finish within {CLIENT_TIMEOUT:?}; stderr:\n{}",
                stderr.join().unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let stdout = stdout.join().expect("stdout reader");
    let stderr = stderr.join().expect("stderr reader");
    assert!(
        status.success(),
        "the MCP client failed ({status}):\n{stderr}\nstdout:\n{stdout}"
    );
    let last = stdout.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("mcp client: ") && last.ends_with(" checks passed"),
        "the client's last line: {last:?}\nstderr:\n{stderr}"
    );
    let checks: u32 = last
        .trim_start_matches("mcp client: ")
        .trim_end_matches(" checks passed")
        .parse()
        .expect("a count of checks");
    assert!(checks >= 150, "only {checks} checks ran:\n{stdout}");
    println!("{last}");
    agent.close().await;
}

/// `--http` serves loopback only unless told, and only behind a bearer token: a
/// refused start is one line and status 1, before connecting to anything.
#[test]
fn mcp_over_http_needs_loopback_or_consent_and_a_bearer_token() {
    let d = Daemon::start();
    let dir = tempfile::tempdir().expect("temporary directory");
    let bearer = private_file(dir.path(), "bearer.token", BEARER);
    let bearer = bearer.to_str().expect("utf-8 path");
    let refused = |args: &[&str]| {
        let out = d.cli(args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}");
        String::from_utf8(out.stderr).expect("utf-8")
    };
    assert_eq!(
        refused(&["mcp", "--http", "0.0.0.0:0", "--http-token-file", bearer]),
        "muster: --http 0.0.0.0:0: not a loopback address; whoever reaches it acts with \
         this server's token: add --http-allow-remote if that is what you want\n"
    );
    assert_eq!(
        refused(&["mcp", "--http", "127.0.0.1:0"]),
        "muster: --http needs --http-token-file FILE: the bearer token MCP clients must \
         send (`Authorization: Bearer TOKEN`), since any local user can reach a loopback \
         port\n"
    );
    std::fs::set_permissions(
        dir.path().join("bearer.token"),
        std::fs::Permissions::from_mode(0o666),
    )
    .expect("chmod");
    let loose = refused(&["mcp", "--http", "127.0.0.1:0", "--http-token-file", bearer]);
    assert!(
        loose.contains("is writable by other users (mode 666): chmod go-w it"),
        "{loose}"
    );
}

/// `muster mcp` over stdio, spoken to as JSON-RPC lines (the initialize handshake of
/// protocol 2025-06-18), for what the Python client cannot arrange: the daemon killed
/// and restarted under it.
struct McpStdio {
    child: std::process::Child,
    /// Taken (closed) to end the session.
    stdin: Option<std::process::ChildStdin>,
    lines: std::sync::mpsc::Receiver<String>,
    next_id: u64,
}

/// Longest one JSON-RPC answer may take.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

impl McpStdio {
    fn start(d: &Daemon) -> McpStdio {
        let mut command = Command::new(muster_tests::muster_bin());
        command
            .arg("mcp")
            .env("MUSTER_ADDR", &d.addr)
            .env("MUSTER_DATA", d.data())
            .env_remove("MUSTER_TOKEN")
            .env_remove("MUSTER_TOKEN_FILE")
            .env_remove("MUSTER_CONTEXT");
        McpStdio::start_command(command)
    }

    /// Starts the server `command` runs and makes the initialize handshake.
    fn start_command(mut command: Command) -> McpStdio {
        use std::io::BufRead as _;
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting muster mcp");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = std::sync::mpsc::channel();
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
        let mut server = McpStdio {
            child,
            stdin: Some(stdin),
            lines,
            next_id: 1,
        };
        let init = server.request(
            "initialize",
            serde_json::json!({
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "muster-it", "version": "0"}
            }),
        );
        assert_eq!(init["serverInfo"]["name"], "muster", "{init}");
        server.send(&serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        server
    }

    fn send(&mut self, message: &serde_json::Value) {
        use std::io::Write as _;
        let stdin = self.stdin.as_mut().expect("the session is open");
        writeln!(stdin, "{message}").expect("writing to muster mcp");
        stdin.flush().expect("flushing to muster mcp");
    }

    /// Sends a request; returns its result, failing on an error or no answer in time.
    fn request(&mut self, method: &str, params: serde_json::Value) -> serde_json::Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send(
            &serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
        );
        let deadline = Instant::now() + ANSWER_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self
                .lines
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no answer to {method} within {ANSWER_TIMEOUT:?}"));
            let message: serde_json::Value = serde_json::from_str(&line).expect("a JSON-RPC line");
            if message["id"] == id {
                assert!(message.get("error").is_none(), "{method}: {message}");
                return message["result"].clone();
            }
        }
    }

    /// Calls a tool; returns its structured content and whether it is an error.
    fn call(&mut self, tool: &str, arguments: serde_json::Value) -> (serde_json::Value, bool) {
        let result = self.request(
            "tools/call",
            serde_json::json!({"name": tool, "arguments": arguments}),
        );
        (
            result["structuredContent"].clone(),
            result["isError"] == true,
        )
    }
}

impl McpStdio {
    /// Closes stdin, as a client ends the session; waits for the server to exit.
    fn end(&mut self) -> std::process::ExitStatus {
        self.stdin.take();
        let deadline = Instant::now() + ANSWER_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().expect("waiting for muster mcp") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "muster mcp did not end with its stdin"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for McpStdio {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The daemon killed with -9 and restarted under a running `muster mcp`: its next
/// calls connect again, a read at once (tried again on a new connection after the
/// lost one), a write after it; and the server ends when its client closes stdin.
#[test]
fn the_server_connects_again_after_the_daemon_restarts() {
    let mut d = Daemon::start();
    d.ok(&["queue", "create", "jobs"]);
    let mut server = McpStdio::start(&d);
    let (enqueued, failed) = server.call(
        "enqueue",
        serde_json::json!({"queue": "jobs", "tasks": [{"payload": {"n": 1}}]}),
    );
    assert!(!failed, "{enqueued}");
    let id = enqueued["tasks"][0]["id"]
        .as_str()
        .expect("an id")
        .to_owned();

    d.kill9();
    d.restart();
    let (task, failed) = server.call("get_task", serde_json::json!({"id": id}));
    assert!(!failed, "{task}");
    assert_eq!(
        (task["id"].as_str(), task["state"].as_str()),
        (Some(&*id), Some("ready"))
    );
    let (enqueued, failed) = server.call(
        "enqueue",
        serde_json::json!({"queue": "jobs", "tasks": [{"payload": {"n": 2}}]}),
    );
    assert!(!failed, "{enqueued}");
    assert_eq!(enqueued["tasks"][0]["state"], "ready");
    let (queues, _) = server.call("list_queues", serde_json::json!({}));
    assert_eq!(queues["queues"][0]["ready"], 2, "{queues}");

    // The client closes stdin: the server ends, with success.
    let status = server.end();
    assert!(status.success(), "{status}");
}

/// The configuration README.md tells a user to paste into an MCP client, run as a
/// client runs it: its command and arguments, its environment (each variable one
/// `muster` reads, here naming this test's daemon, its certificate's pin and an admin
/// token file), nothing else from the test's; the server answers the initialize
/// handshake and lists the admin's tools.
#[test]
fn the_readmes_mcp_configuration_starts_a_server_with_its_tokens_tools() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("README.md");
    let block = readme
        .split("```json\n")
        .find(|b| b.contains("\"mcpServers\"") && b.contains("\"command\""))
        .and_then(|b| b.split("\n```").next())
        .expect("the README's mcpServers block");
    let config: serde_json::Value = serde_json::from_str(block).expect("the block is JSON");
    let server = &config["mcpServers"]["muster"];
    assert_eq!(server["command"], "muster");
    assert_eq!(server["args"], serde_json::json!(["mcp"]));
    let env = server["env"].as_object().expect("an env object");
    let mut keys: Vec<&str> = env.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["MUSTER_ADDR", "MUSTER_PIN", "MUSTER_TOKEN_FILE"]);
    let (d, dir) = secured();
    let admin = private_file(dir.path(), "readme-admin.token", ADMIN);
    let mut command = Command::new(muster_tests::muster_bin());
    command.args(["mcp"]).env_clear().env("HOME", dir.path());
    for key in keys {
        let value = match key {
            "MUSTER_ADDR" => d.addr.clone(),
            "MUSTER_PIN" => d.fingerprint.clone(),
            _ => admin.display().to_string(),
        };
        command.env(key, value);
    }
    let mut server = McpStdio::start_command(command);
    let tools = server.request("tools/list", serde_json::json!({}));
    let names: Vec<&str> = tools["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .map(|t| t["name"].as_str().expect("a name"))
        .collect();
    assert!(
        names.contains(&"enqueue") && names.contains(&"discard"),
        "{names:?}"
    );
}
