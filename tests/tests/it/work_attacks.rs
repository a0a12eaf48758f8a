//! `muster work` against its own programs: a program gets none of the runner's
//! `MUSTER_*` client settings (its token above all), cannot read the token from the
//! runner's (or the guardian's) `/proc/PID/environ` or memory, and with `--user` runs
//! as that user, unable to read the runner's token file; what it writes to stderr
//! reaches the runner's log escaped; and a program that abuses its progress file (a
//! FIFO, a file far over the limit, a link to a file elsewhere) neither stalls the
//! runner, nor grows its memory, nor gets a checkpoint stored that it did not write.
//! The progress directory is private to the runner, so the program plays the attacker
//! that another local user could have been with a shared one.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use muster_sdk::{Client, NewTask, QueuePatch, TaskInfo, TaskState};
use muster_tests::{Daemon, Proc, muster_bin, until};

/// What `muster work` deliberately gives its program (README, "the program gets").
const PROGRAM_VARS: [&str; 12] = [
    "MUSTER_ATTEMPT",
    "MUSTER_CLAIM",
    "MUSTER_FAILURES",
    "MUSTER_PARENT",
    "MUSTER_PROGRESS",
    "MUSTER_PROGRESS_FILE",
    "MUSTER_QUEUE",
    "MUSTER_RECLAIMED",
    "MUSTER_RESUMED",
    "MUSTER_RESUMED_FILE",
    "MUSTER_SUSPEND_FILE",
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

/// The uid (and gid) a test running as root starts the runner as: nobody's, as in the
/// unprivileged run of `.ci/run`.
const NOBODY: u32 = 65534;

/// User `nobody`'s uid, primary gid and home directory, from `/etc/passwd`.
fn nobody() -> (u32, u32, String) {
    let passwd = std::fs::read_to_string("/etc/passwd").expect("/etc/passwd");
    let fields: Vec<&str> = passwd
        .lines()
        .find(|l| l.starts_with("nobody:"))
        .expect("user nobody in /etc/passwd")
        .split(':')
        .collect();
    let id = |i: usize| fields[i].parse().expect("a numeric id");
    (id(2), id(3), fields[5].to_owned())
}

/// How long a runner refused at start may take to exit.
const START_REFUSAL: Duration = Duration::from_secs(15);

/// The effective uid of this test process.
fn euid() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .expect("Uid: in /proc/self/status")
}

/// The owner of `/proc/PID/environ`: the process's user, or root (0) once it is
/// non-dumpable, whatever its user.
fn environ_owner(pid: u32) -> u32 {
    std::fs::metadata(format!("/proc/{pid}/environ"))
        .expect("/proc/PID/environ")
        .uid()
}

/// The parent of process `pid`, if it is still there.
fn ppid_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: the fields follow its last ')'.
    let (_, rest) = stat.rsplit_once(") ")?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// The runner's guardian (`muster guard`, its child), once it is there.
async fn guardian_of(runner: u32) -> u32 {
    let find = || {
        std::fs::read_dir("/proc")
            .expect("/proc")
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .find(|&pid| {
                ppid_of(pid) == Some(runner)
                    && std::fs::read(format!("/proc/{pid}/cmdline"))
                        .is_ok_and(|c| c.split(|&b| b == 0).any(|arg| arg == b"guard"))
            })
    };
    until(
        Duration::from_secs(15),
        "the runner started its guardian",
        || {
            let found = find().is_some();
            async move { found }
        },
    )
    .await;
    find().expect("the guardian")
}

/// Whether users other than root can run `path`: it and every directory above it are
/// executable by others.
fn others_can_run(path: &Path) -> bool {
    path.ancestors().all(|p| {
        std::fs::metadata(p).is_ok_and(|m| p.as_os_str().is_empty() || m.mode() & 0o001 != 0)
    })
}

/// The `muster` binary where user `nobody` can run it: where it is if it can, else a
/// link (or a copy) of it in `dir`, which must be open to others.
fn muster_for_nobody(dir: &Path) -> PathBuf {
    let bin = muster_bin();
    if others_can_run(&bin) {
        return bin;
    }
    let there = dir.join("muster");
    if std::fs::hard_link(&bin, &there).is_err() {
        std::fs::copy(&bin, &there).expect("copying muster where nobody can run it");
    }
    there
}

/// A directory for scripts (and a `muster` binary) that user `nobody` can run.
fn open_dir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod 755");
    dir
}

/// A `muster work` the test starts itself, its log (stderr) going into a file, in a
/// process group of its own (killed when this is dropped); started as `uid` (and that
/// uid as its only group) if given. Its log is written without colours (`NO_COLOR`):
/// what is checked is that no escape comes from its program.
struct LoggedWork {
    child: std::process::Child,
    log: PathBuf,
}

impl LoggedWork {
    fn start(
        d: &Daemon,
        bin: &Path,
        args: &[&str],
        env: &[(&str, &str)],
        log: PathBuf,
        uid: Option<u32>,
    ) -> LoggedWork {
        use std::os::unix::process::CommandExt;
        let file = std::fs::File::create(&log).expect("creating the runner's log");
        let mut cmd = Command::new(bin);
        cmd.args(args)
            .env("MUSTER_ADDR", &d.addr)
            .env("MUSTER_DATA", d.data())
            .env("NO_COLOR", "1")
            .envs(env.iter().copied())
            .current_dir("/")
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file);
        if let Some(uid) = uid {
            cmd.uid(uid).gid(uid);
        }
        let child = cmd.spawn().expect("starting muster work");
        LoggedWork { child, log }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its log so far.
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).expect("the runner's log")
    }

    /// Waits up to `timeout` for it to exit; its exit code.
    fn exited(&mut self, timeout: Duration) -> Option<i32> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status.code();
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for LoggedWork {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", self.child.id())])
                .status();
            let _ = self.child.wait();
        }
    }
}

/// A program that looks for the runner's token everywhere it might be and returns what
/// it could read as its result, after a first line saying who it runs as: the token file
/// the test names (if any), the runner's `/proc/PID/environ` and memory map, the
/// environment of each of its ancestors, of its parent's other children (the guardian)
/// and its own (the control: reading works where it is allowed). With the payload
/// `progress` it checkpoints `{"step":1}` and fails instead.
fn seeker(dir: &Path, token_file: Option<&Path>) -> PathBuf {
    let body = r#"TOKEN_FILE='@TOKEN_FILE@'
F="$MUSTER_PROGRESS_FILE"
case "$(cat)" in
*progress*) echo '{"step":1}' > "$F"; exit 3 ;;
esac
# PP: the parent of process $1 (empty if it is gone), with builtins only: the walk
# below looks at every process.
ppid_of() {
  PP=
  read -r line 2>/dev/null < "/proc/$1/stat" || return 0
  set -- ${line##*) }
  PP=$2
}
show() {
  if c=$(tr '\0' '\n' 2>/dev/null < "$1"); then printf -- '--- %s\n%s\n' "$1" "$c"
  else printf -- '--- %s: unreadable\n' "$1"; fi
}
D=$(dirname "$F")
if ls "$(dirname "$D")" >/dev/null 2>&1; then OUTER=listable; else OUTER=unlistable; fi
echo "uid=$(id -u) groups=$(id -G) progress_dir=$(stat -c %u:%a "$D") outer=$OUTER"
if [ -n "$TOKEN_FILE" ]; then show "$TOKEN_FILE"; fi
show "/proc/$PPID/environ"
show "/proc/$PPID/maps"
ppid_of "$PPID"
while [ -n "$PP" ] && [ "$PP" -gt 1 ]; do p=$PP; show "/proc/$p/environ"; ppid_of "$p"; done
for s in /proc/[0-9]*; do
  q=${s#/proc/}
  [ "$q" = "$$" ] && continue
  ppid_of "$q"
  if [ "$PP" = "$PPID" ]; then show "/proc/$q/environ"; fi
done
show "/proc/$$/environ""#;
    let token_file = token_file.map_or(String::new(), |p| p.display().to_string());
    script(dir, "seeker.sh", &body.replace("@TOKEN_FILE@", &token_file))
}

/// The result of a task as the text it is (a JSON string).
fn text_result(t: &TaskInfo) -> String {
    let raw = t.result.as_ref().expect("a result");
    serde_json::from_str(raw.get()).expect("the result is a JSON string")
}

/// The daemon's local token, which the tests hand the runner themselves.
fn local_token(d: &Daemon) -> String {
    let token = std::fs::read_to_string(d.data().join(muster_protocol::LOCAL_TOKEN_FILE))
        .expect("the daemon's local token")
        .trim()
        .to_owned();
    assert!(token.len() >= 16, "{token:?}");
    token
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_reads_no_token_from_the_runners_environment_or_memory() {
    let d = Daemon::start();
    let client = d.client().await;
    queue(&client, "leakq").await;
    let token = local_token(&d);
    let dir = open_dir();
    let program = seeker(dir.path(), None);
    // Root reads any process's environment, dumpable or not: run as root, the test
    // starts the runner as nobody, so that the program is a same-user, non-root reader
    // as it is in the unprivileged run. The daemon is trusted by its pin (nobody cannot
    // read its data directory); the token comes in MUSTER_TOKEN.
    let as_nobody = euid() == 0;
    let bin = if as_nobody {
        muster_for_nobody(dir.path())
    } else {
        muster_bin()
    };
    let config = dir.path().join("config");
    let mut runner = LoggedWork::start(
        &d,
        &bin,
        &[
            "work",
            "leakq",
            "--member",
            "leak-1",
            "--",
            program.to_str().expect("utf-8 path"),
        ],
        &[
            ("MUSTER_TOKEN", &token),
            ("MUSTER_PIN", &d.fingerprint),
            ("HOME", dir.path().to_str().expect("utf-8 path")),
            ("XDG_CONFIG_HOME", config.to_str().expect("utf-8 path")),
        ],
        dir.path().join("runner.log"),
        as_nobody.then_some(NOBODY),
    );
    let pid = runner.pid();
    let guardian = guardian_of(pid).await;
    // The guardian makes itself non-dumpable once it runs: only then is it its steady
    // state (it holds no token either way).
    until(
        Duration::from_secs(15),
        "the guardian is non-dumpable",
        || {
            let owner = environ_owner(guardian);
            async move { owner == 0 }
        },
    )
    .await;
    let id = enqueue(&client, "leakq", "seek").await;
    let t = finished(&client, &id).await;
    assert_eq!(t.state, TaskState::Done, "{t:?}\n{}", runner.log());
    let found = text_result(&t);
    assert!(
        !found.contains(&token),
        "the program read the runner's token:\n{found}"
    );
    for line in [
        format!("--- /proc/{pid}/environ: unreadable"),
        format!("--- /proc/{pid}/maps: unreadable"),
        format!("--- /proc/{guardian}/environ: unreadable"),
        // The control: the program reads what it may, its own environment.
        format!("MUSTER_TASK_ID={id}"),
    ] {
        assert!(found.lines().any(|l| l == line), "no {line:?} in:\n{found}");
    }
    // Non-dumpable: the runner's /proc files are root's, whatever user it runs as.
    assert_eq!(environ_owner(pid), 0);
    // Nor did the guardian get the token in its environment (readable here as root).
    if let Ok(env) = std::fs::read(format!("/proc/{guardian}/environ")) {
        let env = String::from_utf8_lossy(&env);
        assert!(
            !env.contains(&token) && !env.contains("MUSTER_TOKEN"),
            "the guardian's environment holds the token: {env}"
        );
    }
    assert_eq!(runner.exited(Duration::ZERO), None, "the runner exited");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_user_runs_the_program_as_that_user_away_from_the_token_or_is_refused() {
    let d = Daemon::start();
    let client = d.client().await;
    queue(&client, "userq").await;
    let token = local_token(&d);
    let dir = open_dir();
    // The runner's token file: 0600, the test's user's (root's when this test can
    // switch users).
    let token_file = dir.path().join("runner.token");
    {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&token_file)
            .expect("creating the token file");
        writeln!(f, "{token}").expect("writing the token file");
    }
    let program = seeker(dir.path(), Some(&token_file));
    let mut runner = LoggedWork::start(
        &d,
        &muster_bin(),
        &[
            "work",
            "userq",
            "--member",
            "user-1",
            "--user",
            "nobody",
            "--",
            program.to_str().expect("utf-8 path"),
        ],
        &[(
            "MUSTER_TOKEN_FILE",
            token_file.to_str().expect("utf-8 path"),
        )],
        dir.path().join("runner.log"),
        None,
    );
    if euid() != 0 {
        // Unprivileged: it cannot switch users, and says so at once.
        assert_eq!(runner.exited(START_REFUSAL), Some(1), "{}", runner.log());
        assert_eq!(
            runner.log(),
            "muster: --user nobody: muster work cannot switch users: it needs root (or CAP_SETUID, CAP_SETGID, CAP_KILL, CAP_CHOWN and CAP_DAC_OVERRIDE)\n"
        );
        return;
    }
    let id = enqueue(&client, "userq", "seek").await;
    let t = finished(&client, &id).await;
    assert_eq!(t.state, TaskState::Done, "{t:?}\n{}", runner.log());
    let found = text_result(&t);
    let pid = runner.pid();
    // Nobody, in nobody's group only, with a progress directory of its own inside one
    // it cannot list.
    let (uid, gid, home) = nobody();
    let who = format!("uid={uid} groups={gid} progress_dir={uid}:700 outer=unlistable");
    assert_eq!(found.lines().next(), Some(who.as_str()), "{found}");
    assert!(
        !found.contains(&token),
        "the program read the runner's token:\n{found}"
    );
    for line in [
        format!("--- {}: unreadable", token_file.display()),
        format!("--- /proc/{pid}/environ: unreadable"),
        format!("--- /proc/{pid}/maps: unreadable"),
        format!("MUSTER_TASK_ID={id}"),
        format!("HOME={home}"),
        "USER=nobody".to_owned(),
    ] {
        assert!(found.lines().any(|l| l == line), "no {line:?} in:\n{found}");
    }
    // Its checkpoints still reach the daemon.
    let id = enqueue(&client, "userq", "progress").await;
    let t = finished(&client, &id).await;
    assert_eq!((t.state, t.failures), (TaskState::Dead, 1), "{t:?}");
    assert_eq!(cli_progress(&d, &id), serde_json::json!({ "step": 1 }));
    assert_eq!(runner.exited(Duration::ZERO), None, "the runner exited");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_programs_stderr_reaches_the_runners_log_escaped() {
    let d = Daemon::start();
    let client = d.client().await;
    queue(&client, "stderrq").await;
    let dir = tempfile::tempdir().expect("tempdir");
    // Colours, a bidi override and a line of its own that would pass for the runner's.
    let program = script(
        dir.path(),
        "noisy.sh",
        r"printf '\033[31mred\033[0m and \342\200\256bidi\n WARN muster_tui::work: forged\n' >&2; exit 3",
    );
    let mut runner = LoggedWork::start(
        &d,
        &muster_bin(),
        &[
            "work",
            "stderrq",
            "--member",
            "stderr-1",
            "--",
            program.to_str().expect("utf-8 path"),
        ],
        &[],
        dir.path().join("runner.log"),
        None,
    );
    let id = enqueue(&client, "stderrq", "fail").await;
    let t = finished(&client, &id).await;
    // The daemon keeps the error as the program wrote it (every display escapes it).
    assert_eq!(
        (t.state, t.last_error.as_deref()),
        (
            TaskState::Dead,
            Some(
                "exit status: 3: \x1b[31mred\x1b[0m and \u{202e}bidi\n WARN muster_tui::work: forged"
            )
        )
    );
    // The runner logged the task's end before settling it: the line is in the log.
    let log = runner.log();
    assert!(
        !log.contains('\x1b') && !log.contains('\u{202e}'),
        "raw escapes in the runner's log:\n{log}"
    );
    assert!(
        log.contains(
            r"error=exit status: 3: \u{1b}[31mred\u{1b}[0m and \u{202e}bidi\n WARN muster_tui::work: forged"
        ),
        "no escaped stderr in the runner's log:\n{log}"
    );
    assert!(
        !log.lines()
            .any(|l| l.starts_with(" WARN muster_tui::work: forged")),
        "the program forged a log line:\n{log}"
    );
    assert_eq!(runner.exited(Duration::ZERO), None, "the runner exited");
}
