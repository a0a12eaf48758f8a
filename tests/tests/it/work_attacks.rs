//! `muster work` against its own programs: a program gets none of the runner's
//! `MUSTER_*` client settings (its token above all), and a program that abuses its
//! progress file (a FIFO, a file far over the limit, a link to a file elsewhere) neither
//! stalls the runner, nor grows its memory, nor gets a checkpoint stored that it did not
//! write. The progress directory is private to the runner, so the program plays the
//! attacker that another local user could have been with a shared one.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use muster_sdk::{Client, NewTask, QueuePatch, TaskInfo, TaskState};
use muster_tests::{Daemon, Proc, muster_bin};

/// What `muster work` deliberately gives its program (README, "the program gets").
const PROGRAM_VARS: [&str; 8] = [
    "MUSTER_ATTEMPT",
    "MUSTER_CLAIM",
    "MUSTER_FAILURES",
    "MUSTER_PROGRESS",
    "MUSTER_PROGRESS_FILE",
    "MUSTER_QUEUE",
    "MUSTER_RECLAIMED",
    "MUSTER_TASK_ID",
];

/// `MAX_PROGRESS_BYTES` is 64 KiB: the attacking checkpoint is a thousand times that.
const HUGE_BYTES: usize = 64 << 20;

/// Growth of the runner's peak memory that reading the huge checkpoint whole would
/// exceed several times over.
const GROWTH_LIMIT_KIB: u64 = 16 << 10;

async fn queue(client: &Client, name: &str) {
    // One attempt: a failed run is dead at once, its last checkpoint stored with it.
    let patch = QueuePatch {
        lease_ms: Some(30_000),
        max_attempts: Some(1),
        ..QueuePatch::default()
    };
    client
        .queue_create(name, patch)
        .await
        .expect("queue_create");
}

async fn enqueue(client: &Client, queue: &str, what: &str) -> String {
    let payload = muster_sdk::json(&serde_json::json!({ "do": what })).expect("json");
    client
        .enqueue(queue, NewTask::new(payload))
        .await
        .expect("enqueue")
        .id
}

/// Waits (bounded) for the task to end and returns it.
async fn finished(client: &Client, id: &str) -> TaskInfo {
    let reply = client
        .wait(vec![id.to_owned()], 15_000)
        .await
        .expect("wait");
    assert_eq!(
        reply.pending,
        Vec::<String>::new(),
        "{id} did not end in 15 s"
    );
    client.task_get(id).await.expect("task_get")
}

/// The task's progress as `muster task get --json` prints it.
fn cli_progress(d: &Daemon, id: &str) -> serde_json::Value {
    let out = d.ok(&["task", "get", id, "--json"]);
    let task: serde_json::Value = serde_json::from_str(out.trim()).expect("task get --json");
    assert_eq!(task["id"], id, "{out}");
    task["progress"].clone()
}

/// A shell script in `dir`, executable.
fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).expect("writing a script");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

/// A program that does what its payload says: `small` checkpoints `{"step":1}` and
/// fails (the control: a checkpoint is stored with a failure), `fifo` puts a FIFO where
/// its progress file goes and succeeds, `huge` checkpoints 64 MiB of valid JSON and
/// fails, `link` makes its progress file a link to `target` and fails; anything else
/// prints "plain".
fn attacker(dir: &Path, target: &Path) -> PathBuf {
    let body = format!(
        r#"F="$MUSTER_PROGRESS_FILE"
case "$(cat)" in
*small*) echo '{{"step":1}}' > "$F"; exit 3 ;;
*fifo*) rm -f "$F" && mkfifo "$F" || exit 9; sleep 0.6; echo '"fifo planted"' ;;
*huge*) {{ printf '{{"pad":"'; head -c {HUGE_BYTES} /dev/zero | tr '\0' x; printf '"}}'; }} > "$F.tmp" || exit 9
        mv "$F.tmp" "$F"; sleep 0.6; exit 3 ;;
*link*) ln -s '{target}' "$F" || exit 9; sleep 0.6; exit 3 ;;
*) echo '"plain"' ;;
esac"#,
        target = target.display()
    );
    script(dir, "attacker.sh", &body)
}

fn work(d: &Daemon, queue: &str, member: &str, program: &Path) -> Proc {
    d.spawn_cli(&[
        "work",
        queue,
        "--member",
        member,
        "--",
        program.to_str().expect("utf-8 path"),
    ])
}

/// The peak resident memory of a process, in KiB.
fn peak_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
        .expect("VmHWM in /proc/PID/status")
}

/// The runner still serves: a plain task is acked with the program's output.
async fn serves(client: &Client, queue: &str, runner: &mut Proc) {
    let id = enqueue(client, queue, "plain").await;
    let t = finished(client, &id).await;
    assert_eq!(
        (t.state, t.result.map(|r| r.get().to_owned())),
        (TaskState::Done, Some("\"plain\"".to_owned()))
    );
    assert_eq!(
        tokio::task::block_in_place(|| runner.wait(Duration::ZERO)),
        None,
        "the runner exited"
    );
}

/// The control: a checkpoint the program writes is stored with its failure.
async fn control(d: &Daemon, client: &Client, queue: &str) {
    let id = enqueue(client, queue, "small").await;
    let t = finished(client, &id).await;
    assert_eq!((t.state, t.failures), (TaskState::Dead, 1));
    assert_eq!(cli_progress(d, &id), serde_json::json!({ "step": 1 }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_hands_its_program_no_muster_client_setting_and_never_the_token() {
    let d = Daemon::start();
    let client = d.client().await;
    queue(&client, "envq").await;
    let dir = tempfile::tempdir().expect("tempdir");
    let token = std::fs::read_to_string(d.data().join(muster_protocol::LOCAL_TOKEN_FILE))
        .expect("the daemon's local token")
        .trim()
        .to_owned();
    assert!(token.len() >= 16, "{token:?}");
    let token_file = dir.path().join("runner.token");
    std::fs::write(&token_file, format!("{token}\n")).expect("writing the token file");
    // A context for MUSTER_CONTEXT to name, in a configuration directory of our own.
    let config = dir.path().join("config");
    let added = Command::new(muster_bin())
        .args(["context", "add", "t", "--addr", &d.addr, "--data"])
        .arg(d.data())
        .env("XDG_CONFIG_HOME", &config)
        .output()
        .expect("muster context add");
    assert!(
        added.status.success(),
        "{}",
        String::from_utf8_lossy(&added.stderr)
    );
    let env_out = dir.path().join("env.txt");
    let program = script(
        dir.path(),
        "env.sh",
        &format!("env > '{}'\necho '\"seen\"'", env_out.display()),
    );
    // Every client setting the runner itself uses (the token twice over), one that
    // means nothing, and a variable that is not muster's.
    let mut runner = d.spawn_cli_env(
        &[
            "work",
            "envq",
            "--member",
            "env-1",
            "--",
            program.to_str().expect("utf-8 path"),
        ],
        &[
            ("MUSTER_TOKEN", &token),
            (
                "MUSTER_TOKEN_FILE",
                token_file.to_str().expect("utf-8 path"),
            ),
            ("MUSTER_CONTEXT", "t"),
            ("XDG_CONFIG_HOME", config.to_str().expect("utf-8 path")),
            ("MUSTER_PIN", &d.fingerprint),
            ("MUSTER_LOG", "warn"),
            ("MUSTER_SOMETHING", "x"),
            ("KEEP_ME", "kept"),
        ],
    );
    let id = enqueue(&client, "envq", "env").await;
    let t = finished(&client, &id).await;
    assert_eq!(
        (t.state, t.result.map(|r| r.get().to_owned())),
        (TaskState::Done, Some("\"seen\"".to_owned()))
    );
    let env = std::fs::read_to_string(&env_out).expect("the program's environment");
    let mut names: Vec<&str> = env
        .lines()
        .filter(|l| l.starts_with("MUSTER_"))
        .map(|l| l.split('=').next().unwrap_or(l))
        .collect();
    names.sort_unstable();
    assert_eq!(names, PROGRAM_VARS, "{env}");
    assert!(
        !env.contains(&token),
        "the token reached the program:\n{env}"
    );
    for line in [
        format!("MUSTER_TASK_ID={id}"),
        "MUSTER_QUEUE=envq".to_owned(),
        "MUSTER_ATTEMPT=1".to_owned(),
        "MUSTER_PROGRESS=".to_owned(),
        "KEEP_ME=kept".to_owned(),
    ] {
        assert!(env.lines().any(|l| l == line), "no {line:?} in:\n{env}");
    }
    assert_eq!(
        tokio::task::block_in_place(|| runner.wait(Duration::ZERO)),
        None,
        "the runner exited"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_for_a_progress_file_does_not_stall_the_runner() {
    let d = Daemon::start();
    let client = d.client().await;
    queue(&client, "fifoq").await;
    let dir = tempfile::tempdir().expect("tempdir");
    let program = attacker(dir.path(), &dir.path().join("unused"));
    let mut runner = work(&d, "fifoq", "fifo-1", &program);
    // Opened blocking, the FIFO (no writer) would hold the runner forever: the task
    // would stay leased and the wait below end with it pending.
    let id = enqueue(&client, "fifoq", "fifo").await;
    let t = finished(&client, &id).await;
    assert_eq!(
        (t.state, t.failures, t.result.map(|r| r.get().to_owned())),
        (TaskState::Done, 0, Some("\"fifo planted\"".to_owned()))
    );
    assert_eq!(cli_progress(&d, &id), serde_json::Value::Null);
    serves(&client, "fifoq", &mut runner).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_progress_file_is_neither_read_whole_nor_stored() {
    let d = Daemon::start();
    let client = d.client().await;
    queue(&client, "hugeq").await;
    let dir = tempfile::tempdir().expect("tempdir");
    let program = attacker(dir.path(), &dir.path().join("unused"));
    let mut runner = work(&d, "hugeq", "huge-1", &program);
    control(&d, &client, "hugeq").await;
    let before = peak_kib(runner.pid());
    let id = enqueue(&client, "hugeq", "huge").await;
    let t = finished(&client, &id).await;
    assert_eq!((t.state, t.failures), (TaskState::Dead, 1));
    assert_eq!(cli_progress(&d, &id), serde_json::Value::Null);
    let after = peak_kib(runner.pid());
    eprintln!("runner peak memory {before} KiB before the 64 MiB checkpoint, {after} KiB after");
    assert!(
        after < before + GROWTH_LIMIT_KIB,
        "the runner's peak memory grew from {before} KiB to {after} KiB"
    );
    serves(&client, "hugeq", &mut runner).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_progress_file_linked_elsewhere_is_not_followed() {
    let d = Daemon::start();
    let client = d.client().await;
    queue(&client, "linkq").await;
    let dir = tempfile::tempdir().expect("tempdir");
    // A valid checkpoint outside the private directory, owned by the runner's user: only
    // not following the link keeps it out.
    let target = dir.path().join("elsewhere.json");
    let planted = "{\"injected\":true}\n";
    std::fs::write(&target, planted).expect("writing the target");
    let program = attacker(dir.path(), &target);
    let mut runner = work(&d, "linkq", "link-1", &program);
    control(&d, &client, "linkq").await;
    let id = enqueue(&client, "linkq", "link").await;
    let t = finished(&client, &id).await;
    assert_eq!((t.state, t.failures), (TaskState::Dead, 1));
    assert_eq!(cli_progress(&d, &id), serde_json::Value::Null);
    // The runner removed the link, not what it points to.
    let meta = std::fs::symlink_metadata(&target).expect("the target is still there");
    assert!(meta.is_file());
    assert_eq!(std::fs::read_to_string(&target).unwrap(), planted);
    serves(&client, "linkq", &mut runner).await;
}
