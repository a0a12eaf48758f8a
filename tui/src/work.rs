//! `muster work`: any program as an agent.
//!
//! For each task the worker runs COMMAND with the payload on stdin and the task in
//! environment variables, renews the lease while it runs, and turns its exit into a
//! settle:
//!
//! | exit | settle |
//! |------|--------|
//! | 0 | ack; stdout is the result (JSON if it parses, else a JSON string) |
//! | [`EXIT_DEAD_LETTER`] (65, `EX_DATAERR`) | dead-letter with the stderr tail |
//! | anything else, or killed by a signal | nack with the exit status and the stderr tail |
//!
//! A cancel or a lost lease stops the program: SIGTERM, then SIGKILL after the grace
//! period. The program reports progress by writing a JSON checkpoint into the file
//! named by `MUSTER_PROGRESS_FILE`; the latest one is stored with the next renewal and
//! handed to the next attempt in `MUSTER_PROGRESS`.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

use muster_protocol::limits::{MAX_ERROR_BYTES, MAX_PROGRESS_BYTES, MAX_RESULT_BYTES};
use muster_sdk::{ConnectOptions, Outcome, Task, Worker, WorkerConfig};

use crate::ClaimString;

/// The exit status with which a program dead-letters its task (sysexits' `EX_DATAERR`:
/// the input was bad, retrying cannot help).
pub const EXIT_DEAD_LETTER: i32 = 65;

/// How often the progress file is checked.
const PROGRESS_POLL: Duration = Duration::from_millis(250);

/// Bytes of stderr kept for the error of a failed run.
const STDERR_TAIL: usize = MAX_ERROR_BYTES / 2;

/// What `muster work` runs.
#[derive(Debug, Clone)]
pub struct WorkSpec {
    /// The program and its arguments.
    pub command: Vec<String>,
    /// How long a stopped program gets between SIGTERM and SIGKILL; also the drain grace.
    pub grace: Duration,
}

/// Runs the worker until SIGTERM/SIGINT (then drains) or until its session is taken over.
pub async fn run(
    options: ConnectOptions,
    config: WorkerConfig,
    spec: WorkSpec,
) -> anyhow::Result<()> {
    anyhow::ensure!(!spec.command.is_empty(), "no COMMAND given after --");
    let worker = Worker::new(options, config);
    worker.handle().shutdown_on_signals();
    let spec = std::sync::Arc::new(spec);
    worker
        .run(move |task| {
            let spec = std::sync::Arc::clone(&spec);
            async move {
                match run_task(&spec, &task).await {
                    Ok(outcome) => outcome,
                    Err(e) => Outcome::Nack {
                        delay: None,
                        error: format!("muster work: {e:#}"),
                    },
                }
            }
        })
        .await
        .context("worker stopped")
}

async fn run_task(spec: &WorkSpec, task: &Task) -> anyhow::Result<Outcome> {
    let d = task.delivery();
    let claim = ClaimString {
        id: d.id.clone(),
        epoch: d.epoch,
    };
    let progress_file = progress_path(&claim);
    let last_progress = task
        .progress()
        .map(|p| p.get().to_owned())
        .unwrap_or_default();
    let mut child = Command::new(&spec.command[0])
        .args(&spec.command[1..])
        .env("MUSTER_TASK_ID", &d.id)
        .env("MUSTER_CLAIM", claim.to_string())
        .env("MUSTER_QUEUE", &d.queue)
        .env("MUSTER_ATTEMPT", d.attempt.to_string())
        .env("MUSTER_FAILURES", d.failures.to_string())
        .env("MUSTER_RECLAIMED", d.reclaimed.to_string())
        .env("MUSTER_PROGRESS", &last_progress)
        .env("MUSTER_PROGRESS_FILE", &progress_file)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {:?}", spec.command[0]))?;
    let mut stdin = child.stdin.take().context("child stdin")?;
    let payload = d.payload.get().as_bytes().to_vec();
    let feed = tokio::spawn(async move {
        // A program that does not read its stdin is not an error.
        let _ = stdin.write_all(&payload).await;
    });
    let stdout = tokio::spawn(read_bounded(
        child.stdout.take().context("child stdout")?,
        MAX_RESULT_BYTES + 1,
        Keep::Head,
    ));
    let stderr = tokio::spawn(read_bounded(
        child.stderr.take().context("child stderr")?,
        STDERR_TAIL,
        Keep::Tail,
    ));

    let mut poll = tokio::time::interval(PROGRESS_POLL);
    let mut seen: Option<std::time::SystemTime> = None;
    let status = loop {
        tokio::select! {
            status = child.wait() => break Some(status.context("waiting for the program")?),
            () = task.cancelled() => break None,
            _ = poll.tick() => report_progress(task, &progress_file, &mut seen).await,
        }
    };
    let status = match status {
        Some(status) => status,
        None => {
            stop(&mut child, spec.grace).await;
            feed.abort();
            stdout.abort();
            stderr.abort();
            let _ = tokio::fs::remove_file(&progress_file).await;
            return Ok(Outcome::Nack {
                delay: None,
                error: "stopped: the task was cancelled or its lease was lost".into(),
            });
        }
    };
    report_progress(task, &progress_file, &mut seen).await;
    let _ = tokio::fs::remove_file(&progress_file).await;
    // A background process of the program may hold the pipes open: read what is there
    // for a moment, then give up on the rest rather than hang the task.
    feed.abort();
    let out = finish_reader(stdout).await;
    let err_tail = String::from_utf8_lossy(&finish_reader(stderr).await).into_owned();
    Ok(match status.code() {
        Some(0) => {
            let result = result_json(&out)?;
            if out.len() > MAX_RESULT_BYTES || result.get().len() > MAX_RESULT_BYTES {
                Outcome::Nack {
                    delay: None,
                    error: format!("result (stdout) exceeds {MAX_RESULT_BYTES} bytes"),
                }
            } else {
                Outcome::Ack(Some(result))
            }
        }
        Some(EXIT_DEAD_LETTER) => Outcome::DeadLetter(failure_text(&status, &err_tail)),
        _ => Outcome::Nack {
            delay: None,
            error: failure_text(&status, &err_tail),
        },
    })
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

fn progress_path(claim: &ClaimString) -> PathBuf {
    std::env::temp_dir().join(format!("muster-progress-{}-{}.json", claim.id, claim.epoch))
}

/// Reads the progress file if it changed and hands a valid checkpoint to the worker.
async fn report_progress(task: &Task, path: &PathBuf, seen: &mut Option<std::time::SystemTime>) {
    let Ok(meta) = tokio::fs::metadata(path).await else {
        return;
    };
    let modified = meta.modified().ok();
    if modified == *seen || meta.len() > MAX_PROGRESS_BYTES as u64 {
        return;
    }
    *seen = modified;
    if let Ok(text) = tokio::fs::read_to_string(path).await
        && let Ok(raw) = muster_sdk::raw_json(text.trim())
    {
        task.set_progress(raw);
    }
}

/// SIGTERM, then SIGKILL if the program is still there after `grace`.
async fn stop(child: &mut tokio::process::Child, grace: Duration) {
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        let _ = child.start_kill();
        let _ = child.wait().await;
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
