//! `muster work`: any program as an agent.
//!
//! For each task the worker runs COMMAND with the payload on stdin and the task in
//! environment variables, renews the lease while it runs, and turns its exit into a
//! settle:
//!
//! | exit | settle |
//! |------|--------|
//! | 0 | ack; stdout is the result (JSON if it parses, else a JSON string); with `--output stream` no result (stdout was the task's live output) |
//! | [`EXIT_DEAD_LETTER`] (65, `EX_DATAERR`) | dead-letter with the stderr tail |
//! | [`EXIT_THROTTLED`] (75, `EX_TEMPFAIL`) | throttled: handed back with no failure, its limits held; stdout may say `{"retry_after_ms": N, "limit": "NAME"}` |
//! | anything else, or killed by a signal | nack with the exit status and the stderr tail |
//! | anything but 0 or 65 after the runner stopped it | release: no failure counted |
//! | 0 with a suspend request in `MUSTER_SUSPEND_FILE` | suspend (below) |
//!
//! **Streaming.** With `--output stream` the program's stdout is the task's live output
//! ([`stream_output`]): each read a text chunk (a character cut by a read waits for the
//! next), emitted as it comes, followed with `muster tail -f` and the console.
//!
//! **Suspending.** A program that must wait (for a person, a webhook, a long external
//! job) writes `{"reason": "…", "timeout_ms": N, "on_timeout": "resume"|"fail"|"cancel"}`
//! (only `reason` is required) into the file named by `MUSTER_SUSPEND_FILE`, beside its
//! progress file and read under the same rules, and exits 0. The runner suspends the
//! task instead of acking it (its lease and slot are free, no attempt is spent) and
//! logs the resume token (`outcome=suspended`, `resume_token`); an approver can resume
//! by task id too (`muster resume --task ID`, the console). The run after the resume
//! gets how it ended in `MUSTER_RESUMED` (`{"data": …, "by": "…", "at_ms": N,
//! "timed_out": false}`, on every run until the next suspension; empty when the task was
//! never resumed). A suspend file that cannot be read or does not parse, or a request
//! the daemon refuses for what it asks, nacks the task with the reason; a suspend the
//! daemon does not take otherwise (the lease was lost, the daemon is stopping) releases
//! it, so the program runs again and asks again. A lost connection does neither: the
//! worker asks again on the next one. A program that asks and exits 0 while the runner
//! stops it (a drain) is suspended all the same.
//!
//! **Children.** A program that fans out adds `"children": [{"child_key": "…",
//! "queue": "…", "task": {"payload": …}}, …]` to its suspend request: the runner
//! spawns them and suspends the task until every one has finished (one change; a child
//! key spawned by an earlier run is not spawned again). The run after they finish gets
//! each child's id, state and result or error in `MUSTER_RESUMED`'s `children`, and
//! always whole in the file `MUSTER_RESUMED_FILE` names (an environment string is
//! limited by the kernel: past [`MAX_RESUMED_ENV_BYTES`], `MUSTER_RESUMED` leaves the
//! children out). A child's own run finds its parent's id in `MUSTER_PARENT`.
//!
//! **Supervision.** Each program runs in a process group of its own. Stopping it (a
//! cancel, a lost or revoked lease, a lease that may lapse, a drain, shutdown) is
//! always SIGTERM to the group, then SIGKILL after `--grace` (sooner if the lease
//! would otherwise outlive it); when the program ends, what is left of its group is
//! killed. A guardian process (`muster guard`, started by the runner in a process group
//! of its own) holds the groups of the running programs and kills them with SIGKILL the
//! moment the runner dies, whatever killed it (`kill -9` included): it notices because
//! its stdin, a pipe only the runner writes, reaches end of file.
//!
//! **Progress.** The program reports progress by writing a JSON checkpoint into the
//! file named by `MUSTER_PROGRESS_FILE`, in a directory private to the program's user
//! (mode 0700, removed when the runner exits or dies); the latest one is stored with
//! the next renewal, and before a stopped task is released, and handed to the next
//! attempt in `MUSTER_PROGRESS`. Only a regular file owned by the program's user is
//! read, without following links or blocking, and at most [`MAX_PROGRESS_BYTES`] of it.
//!
//! **The runner's token is not the program's.** The program gets none of the runner's
//! `MUSTER_*` variables. The runner reads a token file once, at start, and keeps the
//! token in memory only; on Linux it makes itself (and the guardian) non-dumpable, so
//! that no process of its user but root can read its environment (`/proc/PID/environ`)
//! or memory, nor trace it. A program that runs as the runner's user can still read
//! every file that user can, a token file included: `--user` runs it as another user
//! (its primary group, no supplementary groups), whose progress directory is then its
//! own, inside one that only the runner can list.
//!
//! **The program's output is untrusted text.** What it writes to stderr goes into the
//! runner's log only escaped as the CLI escapes text for a terminal
//! ([`crate::output::safe`]): no escape sequence, line break or bidi control of its
//! own. The error stored with the task keeps the text as it was; every display of it
//! escapes it.
//!
//! **A broken runner is not the task's fault.** COMMAND must exist and be executable
//! when `muster work` starts. A program that cannot be started later is a runner
//! failure: its task is held for a backoff (1 s doubling to [`SPAWN_BACKOFF_CAP`]) and
//! released without a failure, so a broken runner never burns a backlog.

use std::collections::HashSet;
use std::io::{BufRead, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use nix::sys::signal::{Signal, kill};
use nix::unistd::{Pid, Uid, User};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;
use tracing::{info, warn};

use muster_protocol::limits::{MAX_ERROR_BYTES, MAX_PROGRESS_BYTES, MAX_RESULT_BYTES};
use muster_sdk::{ConnectOptions, Outcome, Task, Worker, WorkerConfig};

use crate::ClaimString;
use crate::output::safe;

/// The exit status with which a program dead-letters its task (sysexits' `EX_DATAERR`:
/// the input was bad, retrying cannot help).
pub const EXIT_DEAD_LETTER: i32 = 65;

/// The exit status with which a program says a provider throttled it (sysexits'
/// `EX_TEMPFAIL`): the task goes back with no failure counted and its limits wait.
pub const EXIT_THROTTLED: i32 = 75;

/// What a throttled program may print on stdout.
#[derive(serde::Deserialize)]
struct ThrottledBy {
    retry_after_ms: Option<u64>,
    limit: Option<String>,
}

/// What a program writes into `MUSTER_SUSPEND_FILE` to suspend its task (and, with
/// `children`, to spawn them and wait for them).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SuspendFile {
    reason: String,
    timeout_ms: Option<u64>,
    on_timeout: Option<muster_sdk::OnTimeout>,
    children: Option<Vec<muster_sdk::NewChild>>,
}

/// Largest suspend file read: a reason, two small fields, and the children a program
/// may spawn (the payloads of a full spawn of small children).
const MAX_SUSPEND_FILE_BYTES: u64 = 1 << 20;

/// Longest `MUSTER_RESUMED` handed over whole (Linux refuses a single environment
/// string over 128 KiB); a longer resume leaves its children's outcomes out of it, and
/// `MUSTER_RESUMED_FILE` has it whole.
const MAX_RESUMED_ENV_BYTES: usize = 96 * 1024;

/// How often the progress file is checked.
const PROGRESS_POLL: Duration = Duration::from_millis(250);

/// Bytes of stderr kept for the error of a failed run.
const STDERR_TAIL: usize = MAX_ERROR_BYTES / 2;

/// First hold of a task whose program could not be started; doubles per failure.
const SPAWN_BACKOFF_BASE: Duration = Duration::from_secs(1);

/// Longest hold of a task whose program could not be started.
pub const SPAWN_BACKOFF_CAP: Duration = Duration::from_secs(30);

/// What `muster work` runs.
#[derive(Debug, Clone)]
pub struct WorkSpec {
    /// The program and its arguments.
    pub command: Vec<String>,
    /// How long a stopped program gets between SIGTERM and SIGKILL.
    pub grace: Duration,
    /// The user the program runs as (`--user`: a name or a numeric uid); the runner's
    /// own if absent.
    pub user: Option<String>,
    /// What its stdout is: the result, or the task's live output.
    pub output: crate::cli::StdoutUse,
}

/// The user `--user` names, as the program runs.
#[derive(Debug)]
struct ProgramUser {
    name: String,
    uid: u32,
    /// Its primary group: the program's only group.
    gid: u32,
    home: PathBuf,
}

/// What every task's handler shares.
struct Runner {
    spec: WorkSpec,
    /// COMMAND resolved to a file when the runner started.
    program: PathBuf,
    /// `--user`: who the program runs as.
    user: Option<ProgramUser>,
    /// The directory of progress files, private to the program's user.
    progress_dir: PathBuf,
    /// The uid a progress file must be owned by: the program's.
    progress_owner: u32,
    guardian: Guardian,
    /// Programs that could not be started in a row: the backoff of the next one.
    spawn_failures: AtomicU32,
}

/// Runs the worker until SIGTERM/SIGINT (then drains) or until its session is taken over.
pub async fn run(
    mut options: ConnectOptions,
    config: WorkerConfig,
    spec: WorkSpec,
) -> anyhow::Result<()> {
    // First of all: from here on no other process of this user (a program above all)
    // can read this one's environment, where MUSTER_TOKEN may be, or its memory.
    non_dumpable().context("making muster work non-dumpable")?;
    // MUSTER_TOKEN stays in this process's own environment: removing it would not
    // help, since /proc/PID/environ shows the block the process was started with,
    // which unsetenv leaves as it was, and std::env::remove_var is unsound now that
    // the runtime's threads run. Being non-dumpable is what keeps that block from the
    // programs; they are started without any MUSTER_* variable (see `program_command`).
    //
    // A token file is read once, now, and the token kept in memory: no reconnect opens
    // the file again (a program of this user could have replaced it meanwhile). The
    // daemon's own token in a data directory the runner trusts is still read at each
    // connect, as the daemon may write a new one; a program that can read the data
    // directory can read it anyway.
    if options.token.is_none() && options.token_file.is_some() {
        options.token = options.hello_token().context("reading the token file")?;
        options.token_file = None;
    }
    anyhow::ensure!(!spec.command.is_empty(), "no COMMAND given after --");
    let program = resolve_program(&spec.command[0])?;
    let user = spec.user.as_deref().map(program_user).transpose()?;
    let dir = tempfile::Builder::new()
        .prefix("muster-work-")
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir()
        .context("creating the private progress directory")?;
    let (progress_dir, progress_owner) = match &user {
        None => (dir.path().to_owned(), Uid::effective().as_raw()),
        Some(user) => (program_progress_dir(dir.path(), user)?, user.uid),
    };
    let guardian = Guardian::start(dir.path())?;
    let runner = Arc::new(Runner {
        spec,
        program,
        user,
        progress_dir,
        progress_owner,
        guardian,
        spawn_failures: AtomicU32::new(0),
    });
    let worker = Worker::new(options, config);
    worker.handle().shutdown_on_signals();
    let result = worker
        .run(move |task| {
            let runner = Arc::clone(&runner);
            async move { run_task(&runner, &task).await }
        })
        .await
        .context("worker stopped");
    // Every handler has ended: the guardian sees its stdin close and exits; the private
    // directory goes with the TempDir.
    drop(dir);
    result
}

/// Makes this process non-dumpable (`prctl(PR_SET_DUMPABLE, 0)`): its `/proc/PID`
/// files (`environ`, `mem`, `fd`, ...) are then root's, and only a process with
/// CAP_SYS_PTRACE may read or trace it. Also no core dumps, which would hold the token.
/// Linux only: elsewhere nothing is done.
fn non_dumpable() -> anyhow::Result<()> {
    #[cfg(target_os = "linux")]
    nix::sys::prctl::set_dumpable(false).context("prctl(PR_SET_DUMPABLE, 0)")?;
    Ok(())
}

/// The user `--user` names (a name, or a numeric uid with a passwd entry), checked to be
/// one the runner can switch to and not the runner's own.
fn program_user(spec: &str) -> anyhow::Result<ProgramUser> {
    anyhow::ensure!(
        can_switch_users(),
        "--user {spec}: muster work cannot switch users: it needs root (or CAP_SETUID, CAP_SETGID, CAP_KILL, CAP_CHOWN and CAP_DAC_OVERRIDE)"
    );
    let found = if !spec.is_empty() && spec.bytes().all(|b| b.is_ascii_digit()) {
        let uid: u32 = spec
            .parse()
            .with_context(|| format!("--user {spec}: not a uid"))?;
        User::from_uid(Uid::from_raw(uid))
    } else {
        User::from_name(spec)
    };
    let user = found
        .with_context(|| format!("--user {spec}: looking the user up"))?
        .with_context(|| format!("--user {spec}: no such user"))?;
    anyhow::ensure!(
        user.uid != Uid::effective(),
        "--user {spec}: that is the runner's own user: its programs could read the runner's token and files"
    );
    Ok(ProgramUser {
        name: user.name,
        uid: user.uid.as_raw(),
        gid: user.gid.as_raw(),
        home: user.dir,
    })
}

/// Whether this process can run programs as another user and still supervise them:
/// switch user and group (and drop supplementary groups), signal their processes, hand
/// them their progress directory and read and remove what they write there. On Linux
/// the effective capabilities say so (root has them all, unless a container took some
/// away); elsewhere only root can.
fn can_switch_users() -> bool {
    #[cfg(target_os = "linux")]
    {
        // CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_KILL, CAP_SETGID, CAP_SETUID.
        const NEEDED: [u32; 5] = [0, 1, 5, 6, 7];
        let effective = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|status| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix("CapEff:"))
                    .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            });
        effective.is_some_and(|caps| NEEDED.iter().all(|bit| caps & (1 << bit) != 0))
    }
    #[cfg(not(target_os = "linux"))]
    {
        Uid::effective().is_root()
    }
}

/// With `--user`: the progress directory of the program's user inside the runner's
/// private directory `dir`. `dir` stays the runner's, searchable but not listable by
/// others (0711), so the program cannot rename or replace what the runner reads and
/// removes; inside it `progress`, 0700 and the program's user's, is private to that user.
fn program_progress_dir(dir: &Path, user: &ProgramUser) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let progress = dir.join("progress");
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&progress)
        .with_context(|| format!("creating {}", progress.display()))?;
    std::os::unix::fs::chown(&progress, Some(user.uid), Some(user.gid)).with_context(|| {
        format!(
            "handing the progress directory {} to user {}",
            progress.display(),
            user.name
        )
    })?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))
        .with_context(|| format!("chmod 711 {}", dir.display()))?;
    Ok(progress)
}

/// COMMAND as a file that exists and is executable: a path if it names one, else the
/// first match on `PATH`.
fn resolve_program(command: &str) -> anyhow::Result<PathBuf> {
    let executable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if command.contains('/') {
        let path = PathBuf::from(command);
        anyhow::ensure!(
            executable(&path),
            "COMMAND {command:?} is not an executable file"
        );
        return Ok(path);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(command))
        .find(|p| executable(p))
        .with_context(|| format!("COMMAND {command:?} is not found on PATH or not executable"))
}

/// Why a running program was stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// Cancelled, lease lost or revoked, lease may lapse, or the grace period is over.
    Cancelled,
    /// The worker is draining.
    Draining,
}

async fn run_task(runner: &Runner, task: &Task) -> Outcome {
    let d = task.delivery();
    let claim = ClaimString {
        id: d.id.clone(),
        epoch: d.epoch,
    };
    let started = Instant::now();
    let (outcome, status) = match execute(runner, task, &claim).await {
        Ok(done) => done,
        Err(e) => (
            Outcome::Nack {
                delay: None,
                error: format!("muster work: {e:#}"),
            },
            "-".into(),
        ),
    };
    let duration_ms = started.elapsed().as_millis() as u64;
    match &outcome {
        Outcome::Ack(_) => {
            info!(task = %claim.id, epoch = claim.epoch, %status, duration_ms, outcome = "ack", "task ended")
        }
        Outcome::Release => {
            info!(task = %claim.id, epoch = claim.epoch, %status, duration_ms, outcome = "release", "task ended")
        }
        Outcome::Nack { error, .. } => {
            // The error holds the program's stderr: escaped, it cannot drive a terminal
            // or forge log lines.
            warn!(task = %claim.id, epoch = claim.epoch, %status, duration_ms, outcome = "nack", error = %safe(error), "task ended")
        }
        Outcome::DeadLetter(error) => {
            warn!(task = %claim.id, epoch = claim.epoch, %status, duration_ms, outcome = "dead_letter", error = %safe(error), "task ended")
        }
        Outcome::Throttled { retry_after, limit } => {
            info!(task = %claim.id, epoch = claim.epoch, %status, duration_ms, outcome = "throttled", retry_after_ms = retry_after.map(|d| d.as_millis() as u64), limit = %safe(limit.as_deref().unwrap_or("-")), "task ended")
        }
        // Logged where it was suspended, with its token.
        Outcome::Suspended => {}
    }
    outcome
}

/// Runs the program for one delivery; returns the outcome and the exit status as text.
async fn execute(
    runner: &Runner,
    task: &Task,
    claim: &ClaimString,
) -> anyhow::Result<(Outcome, String)> {
    let progress_file = runner
        .progress_dir
        .join(format!("{}-{}.json", claim.id, claim.epoch));
    let suspend_file = runner
        .progress_dir
        .join(format!("{}-{}.suspend.json", claim.id, claim.epoch));
    let resumed_file = runner
        .progress_dir
        .join(format!("{}-{}.resumed.json", claim.id, claim.epoch));
    let resumed = task
        .resumed()
        .map(|r| serde_json::to_string(r).expect("a resume serializes"));
    if let Some(json) = &resumed {
        // Readable by the program's user (its directory is private to that user).
        std::fs::write(&resumed_file, json)
            .and_then(|()| {
                std::fs::set_permissions(&resumed_file, std::fs::Permissions::from_mode(0o644))
            })
            .with_context(|| format!("writing {}", resumed_file.display()))?;
    }
    let files = ProgramFiles {
        progress: &progress_file,
        suspend: &suspend_file,
        resumed: resumed
            .as_ref()
            .map(|json| (json.as_str(), resumed_file.as_path())),
    };
    let spawned = program_command(runner, task, claim, &files).spawn();
    let child = match spawned {
        Ok(child) => child,
        Err(e) => return Ok((runner_failure(runner, task, &e).await, "-".into())),
    };
    runner.spawn_failures.store(0, Ordering::Relaxed);
    let mut program = Program::new(child, &runner.guardian)?;
    let mut stdin = program.child.stdin.take().context("child stdin")?;
    let payload = task.delivery().payload.get().as_bytes().to_vec();
    let feed = tokio::spawn(async move {
        // A program that does not read its stdin is not an error.
        let _ = stdin.write_all(&payload).await;
    });
    let child_stdout = program.child.stdout.take().context("child stdout")?;
    let (ended, ended_rx) = tokio::sync::watch::channel(false);
    let streaming = runner.spec.output == crate::cli::StdoutUse::Stream;
    let stdout = if streaming {
        tokio::spawn(stream_output(child_stdout, task.output(), ended_rx))
    } else {
        tokio::spawn(read_bounded(child_stdout, MAX_RESULT_BYTES + 1, Keep::Head))
    };
    let stderr = tokio::spawn(read_bounded(
        program.child.stderr.take().context("child stderr")?,
        STDERR_TAIL,
        Keep::Tail,
    ));
    let mut seen = None;
    let (status, stopped) =
        supervise(runner, task, claim, &mut program, &progress_file, &mut seen).await?;
    // Whatever the program left running in its group goes with it.
    program.kill_group();
    report_progress(task, &progress_file, runner.progress_owner, &mut seen);
    let _ = std::fs::remove_file(&progress_file);
    let _ = std::fs::remove_file(&resumed_file);
    // A file there that cannot be read (not the program's regular file, or too long)
    // is a suspend asked for and refused, not an ack.
    let suspend = std::fs::symlink_metadata(&suspend_file).is_ok().then(|| {
        read_program_file(&suspend_file, runner.progress_owner, MAX_SUSPEND_FILE_BYTES)
            .ok_or_else(|| {
                format!(
                    "muster work: the suspend file is not a regular file of the program's user of at most {MAX_SUSPEND_FILE_BYTES} bytes"
                )
            })
    });
    let _ = std::fs::remove_file(&suspend_file);
    // A background process of the program may hold the pipes open: read what is there
    // for a moment, then give up on the rest rather than hang the task.
    feed.abort();
    let _ = ended.send(true);
    let out = if streaming {
        // Bounded: its reads stop a moment after the pipe goes quiet, and its emits
        // wait for room at most until the lease's end (then the handler is aborted).
        let _ = stdout.await;
        Vec::new()
    } else {
        finish_reader(stdout).await
    };
    let err_tail = String::from_utf8_lossy(&finish_reader(stderr).await).into_owned();
    // A program that asked to suspend and exited 0 is suspended even when the runner
    // was stopping it (a drain): its lease is still held, and an ack would skip what
    // it waits for.
    let outcome = match (status.code(), suspend) {
        (Some(0), Some(Ok(request))) => suspend_task(task, claim, &request).await,
        (Some(0), Some(Err(error))) => {
            warn!(task = %claim.id, epoch = claim.epoch, outcome = "nack", error = %error, "task ended");
            Outcome::Nack { delay: None, error }
        }
        _ => match exit_outcome(&status, stopped.is_some(), &out, &err_tail)? {
            // Its stdout was its output, not its result.
            Outcome::Ack(_) if runner.spec.output == crate::cli::StdoutUse::Stream => {
                Outcome::Ack(None)
            }
            outcome => outcome,
        },
    };
    Ok((outcome, status.to_string()))
}

/// Suspends the task as the program's suspend file asks; logs the resume token.
async fn suspend_task(task: &Task, claim: &ClaimString, request: &str) -> Outcome {
    let file: SuspendFile = match serde_json::from_str(request) {
        Ok(file) => file,
        Err(e) => {
            let error = format!("muster work: the suspend file is not a suspend request: {e}");
            warn!(task = %claim.id, epoch = claim.epoch, outcome = "nack", error = %safe(&error), "task ended");
            return Outcome::Nack { delay: None, error };
        }
    };
    let suspension = muster_sdk::Suspension {
        reason: file.reason,
        timeout: file.timeout_ms.map(Duration::from_millis),
        on_timeout: file.on_timeout,
    };
    let reply = match file.children {
        Some(children) => task.spawn_and_wait(children, suspension).await.map(|r| {
            info!(task = %claim.id, epoch = claim.epoch, children = r.children.len(), "spawned");
            muster_sdk::protocol::ops::SuspendReply {
                state: r.state,
                resume_token: r.resume_token,
                timeout_at_ms: r.timeout_at_ms,
            }
        }),
        None => task.suspend(suspension).await,
    };
    match reply {
        Ok(reply) => {
            let token = reply.resume_token.as_deref().unwrap_or("-");
            info!(task = %claim.id, epoch = claim.epoch, outcome = "suspended", state = %reply.state, resume_token = %token, timeout_at_ms = reply.timeout_at_ms, "task ended");
            Outcome::Suspended
        }
        // Refused for what it asked (a bad reason or timeout): the program's fault.
        Err(muster_sdk::Error::Server(e))
            if matches!(
                e.code,
                muster_sdk::ErrorCode::BadRequest
                    | muster_sdk::ErrorCode::TooLarge
                    | muster_sdk::ErrorCode::NotFound
                    | muster_sdk::ErrorCode::Limit
                    | muster_sdk::ErrorCode::Forbidden
            ) =>
        {
            let error = format!("muster work: suspend refused: {e}");
            warn!(task = %claim.id, epoch = claim.epoch, outcome = "nack", error = %safe(&error), "task ended");
            Outcome::Nack { delay: None, error }
        }
        Err(e) => {
            warn!(task = %claim.id, epoch = claim.epoch, outcome = "release", error = %e, "suspend not taken; releasing the task");
            Outcome::Release
        }
    }
}

/// The files a program's run is handed: where it writes progress and a suspend
/// request, and how its last suspension ended (as JSON, and the file holding it).
struct ProgramFiles<'a> {
    progress: &'a Path,
    suspend: &'a Path,
    resumed: Option<(&'a str, &'a Path)>,
}

/// `MUSTER_RESUMED`: the resume whole, or without its children's outcomes when that
/// would pass [`MAX_RESUMED_ENV_BYTES`].
fn resumed_env(resumed: &muster_sdk::Resumed, json: &str) -> String {
    if json.len() <= MAX_RESUMED_ENV_BYTES {
        return json.to_owned();
    }
    let brief = muster_sdk::Resumed {
        children: Vec::new(),
        ..resumed.clone()
    };
    let brief = serde_json::to_string(&brief).expect("a resume serializes");
    assert!(
        brief.len() <= MAX_RESUMED_ENV_BYTES,
        "a resume without its children fits the environment (its data is at most 64 KiB)"
    );
    brief
}

/// The program's command for one delivery: COMMAND's arguments, the task in
/// `MUSTER_*` variables (and none of the runner's own), a process group of its own,
/// piped stdin, stdout and stderr, and `--user`'s identity if given.
fn program_command(
    runner: &Runner,
    task: &Task,
    claim: &ClaimString,
    files: &ProgramFiles<'_>,
) -> Command {
    let d = task.delivery();
    let last_progress = task
        .progress()
        .map(|p| p.get().to_owned())
        .unwrap_or_default();
    let (resumed, resumed_file) = match (task.resumed(), files.resumed) {
        (Some(r), Some((json, file))) => (resumed_env(r, json), file.as_os_str()),
        _ => (String::new(), std::ffi::OsStr::new("")),
    };
    let mut command = Command::new(&runner.program);
    command.args(&runner.spec.command[1..]);
    // The runner's own client settings (a token above all) are not the program's.
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("MUSTER_") {
            command.env_remove(name);
        }
    }
    command
        .env("MUSTER_TASK_ID", &d.id)
        .env("MUSTER_CLAIM", claim.to_string())
        .env("MUSTER_QUEUE", &d.queue)
        .env("MUSTER_ATTEMPT", d.attempt.to_string())
        .env("MUSTER_FAILURES", d.failures.to_string())
        .env("MUSTER_RECLAIMED", d.reclaimed.to_string())
        .env("MUSTER_PROGRESS", &last_progress)
        .env("MUSTER_PROGRESS_FILE", files.progress)
        .env("MUSTER_SUSPEND_FILE", files.suspend)
        .env("MUSTER_RESUMED", resumed)
        .env("MUSTER_RESUMED_FILE", resumed_file)
        .env("MUSTER_PARENT", d.parent.as_deref().unwrap_or(""))
        .process_group(0)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // The trace the task is in (OpenTelemetry's environment carrier): the program's
    // spans, and `muster enqueue` run by it, continue it. Not the runner's own.
    command.env_remove("TRACEPARENT").env_remove("TRACESTATE");
    if let Some(traceparent) = &d.traceparent {
        command.env("TRACEPARENT", traceparent);
        if let Some(tracestate) = &d.tracestate {
            command.env("TRACESTATE", tracestate);
        }
    }
    if let Some(user) = &runner.user {
        // setgid, then (std does it whenever a uid is set) setgroups(0) and setuid.
        command
            .gid(user.gid)
            .uid(user.uid)
            .env("HOME", &user.home)
            .env("USER", &user.name)
            .env("LOGNAME", &user.name);
    }
    command
}

/// Waits for the program to exit, reporting its progress meanwhile; a cancel, a lost
/// lease or a drain stops it (SIGTERM, then SIGKILL after the grace period or before
/// the lease ends). Its exit status, and why it was stopped if it was.
async fn supervise(
    runner: &Runner,
    task: &Task,
    claim: &ClaimString,
    program: &mut Program<'_>,
    progress_file: &Path,
    seen: &mut Option<(std::time::SystemTime, u64)>,
) -> anyhow::Result<(std::process::ExitStatus, Option<Stop>)> {
    let mut poll = tokio::time::interval(PROGRESS_POLL);
    let mut stopped = None;
    let status = loop {
        tokio::select! {
            status = program.child.wait() => break status.context("waiting for the program")?,
            () = task.cancelled(), if stopped.is_none() => stopped = Some(Stop::Cancelled),
            () = task.draining(), if stopped.is_none() => stopped = Some(Stop::Draining),
            _ = poll.tick() => report_progress(task, progress_file, runner.progress_owner, seen),
        }
        if let Some(why) = stopped {
            info!(task = %claim.id, epoch = claim.epoch, reason = ?why, "stopping the program (SIGTERM, SIGKILL after the grace period)");
            let kill_at = (Instant::now() + runner.spec.grace).min(task.lease_deadline());
            break program
                .stop(kill_at, task, progress_file, runner.progress_owner, seen)
                .await?;
        }
    };
    Ok((status, stopped))
}

/// The settle an exit asks for (the module's table): 0 acks with stdout as the result
/// (a nack if that is too large), [`EXIT_DEAD_LETTER`] dead-letters, a program the
/// runner `stopped` is released, anything else nacks; `err_tail` is stderr's end.
fn exit_outcome(
    status: &std::process::ExitStatus,
    stopped: bool,
    out: &[u8],
    err_tail: &str,
) -> anyhow::Result<Outcome> {
    Ok(match status.code() {
        Some(0) => {
            let result = result_json(out)?;
            if out.len() > MAX_RESULT_BYTES || result.get().len() > MAX_RESULT_BYTES {
                Outcome::Nack {
                    delay: None,
                    error: format!("result (stdout) exceeds {MAX_RESULT_BYTES} bytes"),
                }
            } else {
                Outcome::Ack(Some(result))
            }
        }
        Some(EXIT_DEAD_LETTER) => Outcome::DeadLetter(failure_text(status, err_tail)),
        Some(EXIT_THROTTLED) if !stopped => {
            // Stdout may say how long, and which limit; anything else is the defaults.
            let by = serde_json::from_slice::<ThrottledBy>(out).ok();
            Outcome::Throttled {
                retry_after: by
                    .as_ref()
                    .and_then(|b| b.retry_after_ms)
                    .map(Duration::from_millis),
                limit: by.and_then(|b| b.limit),
            }
        }
        // Stopped by the runner: not the task's failure.
        _ if stopped => Outcome::Release,
        _ => Outcome::Nack {
            delay: None,
            error: failure_text(status, err_tail),
        },
    })
}

/// A program that could not be started: the runner is broken, not the task. Holds the
/// task for a backoff (so a broken runner does not spin through the backlog), then
/// releases it without a failure.
async fn runner_failure(runner: &Runner, task: &Task, error: &std::io::Error) -> Outcome {
    let n = runner.spawn_failures.fetch_add(1, Ordering::Relaxed);
    let hold = SPAWN_BACKOFF_BASE
        .saturating_mul(1u32 << n.min(16))
        .min(SPAWN_BACKOFF_CAP);
    warn!(
        task = %task.id(),
        program = %runner.program.display(),
        %error,
        hold_ms = hold.as_millis() as u64,
        "cannot start the program: a runner failure; the task is released without a failure after the hold"
    );
    tokio::select! {
        () = tokio::time::sleep(hold) => {}
        () = task.cancelled() => {}
        () = task.draining() => {}
    }
    Outcome::Release
}

/// A running program: its process group is killed when this is dropped (the handler
/// was aborted, or the task ended), and the guardian holds it while it runs.
struct Program<'a> {
    child: tokio::process::Child,
    pgid: i32,
    guardian: &'a Guardian,
}

impl<'a> Program<'a> {
    fn new(child: tokio::process::Child, guardian: &'a Guardian) -> anyhow::Result<Program<'a>> {
        let pgid = child
            .id()
            .and_then(|p| i32::try_from(p).ok())
            .context("the program has no process id")?;
        guardian.hold(pgid);
        Ok(Program {
            child,
            pgid,
            guardian,
        })
    }

    fn signal_group(&self, signal: Signal) {
        // The group may be gone already.
        let _ = kill(Pid::from_raw(-self.pgid), signal);
    }

    fn kill_group(&self) {
        self.signal_group(Signal::SIGKILL);
    }

    /// SIGTERM to the group, then SIGKILL at `kill_at` if the program is still there.
    /// Checkpoints written meanwhile are still reported.
    async fn stop(
        &mut self,
        kill_at: Instant,
        task: &Task,
        progress_file: &Path,
        owner: u32,
        seen: &mut Option<(std::time::SystemTime, u64)>,
    ) -> anyhow::Result<std::process::ExitStatus> {
        self.signal_group(Signal::SIGTERM);
        let mut poll = tokio::time::interval(PROGRESS_POLL);
        let deadline = tokio::time::Instant::from_std(kill_at);
        loop {
            tokio::select! {
                status = self.child.wait() => return status.context("waiting for the program"),
                () = tokio::time::sleep_until(deadline) => break,
                _ = poll.tick() => report_progress(task, progress_file, owner, seen),
            }
        }
        self.kill_group();
        self.child.wait().await.context("waiting for the program")
    }
}

impl Drop for Program<'_> {
    fn drop(&mut self) {
        self.kill_group();
        self.guardian.release(self.pgid);
    }
}

/// The guardian process: kills the process groups it holds when the runner dies.
struct Guardian {
    /// The pipe to its stdin; `None` once closed.
    stdin: Mutex<Option<std::process::ChildStdin>>,
    child: std::process::Child,
}

impl Guardian {
    /// Starts `muster guard` in a process group of its own (so a signal to the runner's
    /// group does not reach it), its stdin a pipe from this process.
    fn start(dir: &Path) -> anyhow::Result<Guardian> {
        use std::os::unix::process::CommandExt;
        let exe = std::env::current_exe().context("locating the muster binary")?;
        let mut command = std::process::Command::new(exe);
        // Not the runner's client settings (its token) either: the guardian needs none.
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("MUSTER_") {
                command.env_remove(name);
            }
        }
        let mut child = command
            .arg("guard")
            .arg("--dir")
            .arg(dir)
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting the guardian process")?;
        let stdin = child.stdin.take();
        Ok(Guardian {
            stdin: Mutex::new(stdin),
            child,
        })
    }

    fn tell(&self, line: &str) {
        let mut stdin = self
            .stdin
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(pipe) = stdin.as_mut()
            && let Err(e) = writeln!(pipe, "{line}")
        {
            warn!(error = %e, "the guardian process is gone: programs would outlive a killed runner");
        }
    }

    fn hold(&self, pgid: i32) {
        self.tell(&format!("+{pgid}"));
    }

    fn release(&self, pgid: i32) {
        self.tell(&format!("-{pgid}"));
    }
}

impl Drop for Guardian {
    fn drop(&mut self) {
        // Its stdin closes with nothing held: it removes the directory and exits.
        drop(
            self.stdin
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take(),
        );
        let _ = self.child.wait();
    }
}

/// `muster guard`: holds process groups named on stdin (`+PGID`, `-PGID`) and, when
/// stdin ends (the runner exited or died), kills every group still held with SIGKILL
/// and removes `dir`.
///
/// `dir` must be the private directory `muster work` made for it ([`private_dir`]):
/// anything else is refused at once, before stdin is read, and left as it is.
pub fn guard(dir: &Path) -> anyhow::Result<()> {
    let made = private_dir(dir).map_err(|why| {
        anyhow::anyhow!(
            "refusing --dir {}: {why} (muster guard removes only the private directory \
             muster work made for it: a directory of this user named muster-work-*, mode \
             0700 or 0711, not a symbolic link)",
            dir.display()
        )
    })?;
    // It holds no secret, but a program of the runner's user has no business with it.
    non_dumpable().context("making muster guard non-dumpable")?;
    let mut held: HashSet<i32> = HashSet::new();
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        let (sign, pgid) = line.split_at(line.len().min(1));
        let Ok(pgid) = pgid.parse::<i32>() else {
            continue;
        };
        // Only real groups: never 0, 1 or a negative "all processes".
        if pgid <= 1 {
            continue;
        }
        match sign {
            "+" => {
                held.insert(pgid);
            }
            "-" => {
                held.remove(&pgid);
            }
            _ => {}
        }
    }
    for pgid in held {
        let _ = kill(Pid::from_raw(-pgid), Signal::SIGKILL);
    }
    // Still the directory it was given (not replaced meanwhile): removed.
    if private_dir(dir).is_ok_and(|now| (now.dev(), now.ino()) == (made.dev(), made.ino())) {
        std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    Ok(())
}

/// The metadata of `dir` if it is what `muster work` makes for its guardian: a real
/// directory (not a symbolic link) owned by this process's effective user, mode 0700
/// (0711 with `--user`), named `muster-work-…`; else why not.
fn private_dir(dir: &Path) -> Result<std::fs::Metadata, String> {
    let named = dir
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("muster-work-"));
    if !named {
        return Err("its name does not start with muster-work-".into());
    }
    let meta = std::fs::symlink_metadata(dir).map_err(|e| e.to_string())?;
    if meta.file_type().is_symlink() {
        return Err("it is a symbolic link".into());
    }
    if !meta.is_dir() {
        return Err("it is not a directory".into());
    }
    let me = Uid::effective().as_raw();
    if meta.uid() != me {
        return Err(format!(
            "it is owned by uid {}, not this user (uid {me})",
            meta.uid()
        ));
    }
    let mode = meta.mode() & 0o7777;
    if mode != 0o700 && mode != 0o711 {
        return Err(format!("its mode is {mode:04o}, not 0700 or 0711"));
    }
    Ok(meta)
}

/// stdout as the task's result: JSON if it is JSON, else a JSON string of the text.
fn result_json(out: &[u8]) -> anyhow::Result<muster_sdk::RawJson> {
    let text = String::from_utf8_lossy(out);
    let trimmed = text.trim();
    if !trimmed.is_empty()
        && let Ok(raw) = muster_sdk::raw_json(trimmed)
    {
        return Ok(raw);
    }
    Ok(muster_sdk::json(&text)?)
}

fn failure_text(status: &std::process::ExitStatus, stderr_tail: &str) -> String {
    let tail = stderr_tail.trim();
    let mut text = if tail.is_empty() {
        format!("{status}")
    } else {
        format!("{status}: {tail}")
    };
    // The daemon refuses longer errors.
    muster_protocol::limits::cut_to(&mut text, MAX_ERROR_BYTES);
    text
}

/// How long the output of a finished program is still read.
const OUTPUT_LINGER: Duration = Duration::from_secs(1);

/// What a pipe reader collected, waiting at most [`OUTPUT_LINGER`] for it to end.
async fn finish_reader(reader: tokio::task::JoinHandle<std::io::Result<Vec<u8>>>) -> Vec<u8> {
    let abort = reader.abort_handle();
    match tokio::time::timeout(OUTPUT_LINGER, reader).await {
        Ok(Ok(Ok(bytes))) => bytes,
        Ok(_) => Vec::new(),
        Err(_) => {
            abort.abort();
            Vec::new()
        }
    }
}

/// Reads the progress file if it changed and hands a valid checkpoint to the worker.
/// Only a regular file owned by `owner` (the program's user) is read, opened without
/// following a link and without blocking (a FIFO cannot stall the runner), and at most
/// [`MAX_PROGRESS_BYTES`] + 1 bytes of it: a longer one is ignored.
fn report_progress(
    task: &Task,
    path: &Path,
    owner: u32,
    seen: &mut Option<(std::time::SystemTime, u64)>,
) {
    let Some((mut file, meta)) = open_program_file(path, owner) else {
        return;
    };
    let stamp = (meta.modified().unwrap_or(std::time::UNIX_EPOCH), meta.len());
    if *seen == Some(stamp) {
        return;
    }
    *seen = Some(stamp);
    let Some(text) = read_limited(&mut file, MAX_PROGRESS_BYTES as u64) else {
        return;
    };
    if let Ok(raw) = muster_sdk::raw_json(text.trim()) {
        task.set_progress(raw);
    }
}

/// A file the program wrote, opened only if it is a regular file owned by `owner` (the
/// program's user), without following a link and without blocking (a FIFO cannot stall
/// the runner).
fn open_program_file(path: &Path, owner: u32) -> Option<(std::fs::File, std::fs::Metadata)> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    let meta = file.metadata().ok()?;
    (meta.is_file() && meta.uid() == owner).then_some((file, meta))
}

/// At most `limit` bytes of text from `file`; `None` if it holds more, or is not text.
fn read_limited(file: &mut std::fs::File, limit: u64) -> Option<String> {
    let mut text = String::new();
    let read = file.take(limit + 1).read_to_string(&mut text);
    (read.is_ok() && text.len() as u64 <= limit).then_some(text)
}

/// A whole file the program wrote (see [`open_program_file`]), if it holds at most
/// `limit` bytes of text.
fn read_program_file(path: &Path, owner: u32, limit: u64) -> Option<String> {
    let (mut file, _) = open_program_file(path, owner)?;
    read_limited(&mut file, limit)
}

/// Emits a stream as the task's output, a text chunk per read (a character cut by a
/// read waits for the next; bytes that are not UTF-8 become U+FFFD), waiting for room
/// in the task's output buffer rather than dropping any. Returns nothing: a streaming
/// program's ack carries no result.
async fn stream_output(
    mut r: impl AsyncRead + Unpin,
    output: muster_sdk::TaskOutput,
    mut ended: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; 16 * 1024];
    let mut held = Vec::new();
    // The runner only ever says the program ended (or is gone: the same).
    let mut over = *ended.borrow();
    loop {
        // Once the program has ended, a background process of it may hold the pipe
        // open: what comes within [`OUTPUT_LINGER`] of each read is read, then no more.
        let n = if over {
            match tokio::time::timeout(OUTPUT_LINGER, r.read(&mut buf)).await {
                Ok(n) => n?,
                Err(_) => 0,
            }
        } else {
            tokio::select! {
                n = r.read(&mut buf) => n?,
                _ = ended.changed() => {
                    over = true;
                    continue;
                }
            }
        };
        if n == 0 {
            if !held.is_empty() {
                let _ = output
                    .emit_text(String::from_utf8_lossy(&held).into_owned())
                    .await;
            }
            return Ok(Vec::new());
        }
        held.extend_from_slice(&buf[..n]);
        let text = match std::str::from_utf8(&held) {
            Ok(text) => {
                let text = text.to_owned();
                held.clear();
                text
            }
            // A character cut at the end: the rest comes with the next read.
            Err(e) if e.error_len().is_none() => {
                let valid = e.valid_up_to();
                let text = String::from_utf8_lossy(&held[..valid]).into_owned();
                held.drain(..valid);
                text
            }
            Err(_) => {
                let text = String::from_utf8_lossy(&held).into_owned();
                held.clear();
                text
            }
        };
        if !text.is_empty() && output.emit_text(text).await.is_err() {
            // Output stopped (the lease is gone): the rest is not read, and the
            // program's next write fails, as the task is no longer its to run.
            return Ok(Vec::new());
        }
    }
}

/// Which end of a stream [`read_bounded`] keeps.
#[derive(Debug, Clone, Copy)]
enum Keep {
    /// The first bytes (stdout: the result, refused if too long).
    Head,
    /// The last bytes (stderr: the end of an error is what explains it).
    Tail,
}

/// Reads a stream to its end, keeping at most `limit` bytes from the chosen end.
async fn read_bounded(
    mut r: impl AsyncRead + Unpin,
    limit: usize,
    keep: Keep,
) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let n = r.read(&mut buf).await?;
        if n == 0 {
            return Ok(out);
        }
        match keep {
            Keep::Head => {
                let take = n.min(limit.saturating_sub(out.len()));
                out.extend_from_slice(&buf[..take]);
            }
            Keep::Tail => {
                out.extend_from_slice(&buf[..n]);
                if out.len() > limit {
                    let cut = out.len() - limit;
                    out.drain(..cut);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resume_too_long_for_the_environment_leaves_its_children_out_of_it() {
        let child = |i: usize| muster_sdk::ChildOutcome {
            id: format!("01KBX0Q7R3ZJ9W5V2M8N4P{i:04}"),
            child_key: format!("page-{i}"),
            queue: "ocr".into(),
            state: muster_sdk::TaskState::Done,
            result: Some(muster_sdk::raw_json(&format!("\"{}\"", "w".repeat(60))).unwrap()),
            error: None,
            omitted: false,
        };
        let resumed = |n: usize| muster_sdk::Resumed {
            data: None,
            by: String::new(),
            at_ms: 1,
            timed_out: false,
            children: (0..n).map(child).collect(),
        };
        let small = resumed(3);
        let json = serde_json::to_string(&small).unwrap();
        assert_eq!(resumed_env(&small, &json), json);
        let big = resumed(1000);
        let json = serde_json::to_string(&big).unwrap();
        assert!(json.len() > MAX_RESUMED_ENV_BYTES, "{}", json.len());
        assert_eq!(
            resumed_env(&big, &json),
            r#"{"by":"","at_ms":1,"timed_out":false}"#
        );
    }

    #[test]
    fn stdout_becomes_json_or_a_string() {
        assert_eq!(result_json(b"{\"a\":1}\n").unwrap().get(), r#"{"a":1}"#);
        assert_eq!(
            result_json(b"hello world\n").unwrap().get(),
            r#""hello world\n""#
        );
        assert_eq!(result_json(b"").unwrap().get(), r#""""#);
    }

    #[test]
    fn failure_texts_fit_the_error_limit_on_a_character_boundary() {
        use std::os::unix::process::ExitStatusExt;
        let status = std::process::ExitStatus::from_raw(1 << 8);
        let text = failure_text(&status, &"é".repeat(MAX_ERROR_BYTES));
        assert!(
            text.len() <= MAX_ERROR_BYTES && text.starts_with("exit status: 1: é"),
            "{}",
            text.len()
        );
        assert_eq!(failure_text(&status, "  \n"), "exit status: 1");
    }

    #[tokio::test]
    async fn readers_keep_their_limits() {
        let data = vec![b'x'; 20_000];
        assert_eq!(
            read_bounded(&data[..], 100, Keep::Head)
                .await
                .unwrap()
                .len(),
            100
        );
        let mut tail_src = vec![b'a'; 10_000];
        tail_src.extend_from_slice(b"END");
        let tail = read_bounded(&tail_src[..], 5, Keep::Tail).await.unwrap();
        assert_eq!(tail, b"aaEND");
    }
}
