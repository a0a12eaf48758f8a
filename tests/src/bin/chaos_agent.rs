//! The SDK agent of the agent chaos checker (`muster_tests::agent_chaos`).
//!
//! ```sh
//! chaos_agent MEMBER QUEUE CAPACITY LOG
//! ```
//! Connects with `ConnectOptions::from_env()` (`MUSTER_ADDR`, `MUSTER_DATA`, …) and runs
//! a `Worker`; SIGTERM drains it. Each task's payload names its work in milliseconds
//! (`{"ms": N}`); the handler appends to LOG, as the checker's shell program does:
//!
//! - `start TASK EPOCH UNIX_MS EXEC MEMBER` when it starts,
//! - `tick TASK EPOCH UNIX_MS EXEC` every 100 ms while it works,
//! - `end TASK EPOCH UNIX_MS EXEC` when the work is done (then it acks),
//! - `cancelled TASK EPOCH UNIX_MS EXEC` when `task.cancelled()` fired (then it stops),
//! - `dropped TASK EPOCH UNIX_MS EXEC` when the worker dropped the handler unfinished
//!   (released after the grace period, replaced by a new epoch, or the process ending).
//!
//! EXEC (`PID.N`) names one execution. Each line is one `write` to a file opened with
//! `O_APPEND`, so lines of concurrent writers never interleave.

use std::fs::File;
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use muster_sdk::{ConnectOptions, Outcome, Task, Worker, WorkerConfig};

/// How often a working handler logs a tick.
const TICK: Duration = Duration::from_millis(100);

/// How long handlers get to finish on SIGTERM before their tasks are released (as
/// `muster work --grace 2s` in the checker).
const GRACE: Duration = Duration::from_secs(2);

/// Work of a task whose payload names none.
const DEFAULT_WORK_MS: u64 = 500;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let mut args = std::env::args().skip(1);
    let usage = "usage: chaos_agent MEMBER QUEUE CAPACITY LOG";
    let member = args.next().ok_or(usage)?;
    let queue = args.next().ok_or(usage)?;
    let capacity: u32 = args.next().ok_or(usage)?.parse()?;
    let log_path = args.next().ok_or(usage)?;
    let log = Arc::new(Log {
        file: std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)?,
        member: member.clone(),
        next: AtomicU64::new(1),
    });
    let mut config = WorkerConfig::new(member, [queue]);
    config.capacity = capacity;
    config.grace = GRACE;
    let worker = Worker::new(ConnectOptions::from_env(), config);
    worker.handle().shutdown_on_signals();
    worker.run(move |task| work(Arc::clone(&log), task)).await?;
    Ok(())
}

/// The shared log file and what names this process's executions.
struct Log {
    file: File,
    member: String,
    next: AtomicU64,
}

impl Log {
    fn line(&self, text: &str) {
        // One write per line: O_APPEND makes it atomic among writers.
        let _ = (&self.file).write_all(format!("{text}\n").as_bytes());
    }
}

/// One execution: logs its start, and `dropped` if it is dropped before it logged how
/// it ended.
struct Execution {
    log: Arc<Log>,
    task: String,
    epoch: u64,
    exec: String,
    ended: bool,
}

impl Execution {
    fn start(log: Arc<Log>, task: &Task) -> Execution {
        let exec = format!(
            "{}.{}",
            std::process::id(),
            log.next.fetch_add(1, Ordering::SeqCst)
        );
        let e = Execution {
            task: task.id().to_owned(),
            epoch: task.delivery().epoch,
            exec,
            ended: false,
            log,
        };
        e.log.line(&format!(
            "start {} {} {} {} {}",
            e.task,
            e.epoch,
            now_ms(),
            e.exec,
            e.log.member
        ));
        e
    }

    fn event(&self, kind: &str) {
        self.log.line(&format!(
            "{kind} {} {} {} {}",
            self.task,
            self.epoch,
            now_ms(),
            self.exec
        ));
    }

    fn end(mut self, kind: &str) {
        self.event(kind);
        self.ended = true;
    }
}

impl Drop for Execution {
    fn drop(&mut self) {
        if !self.ended {
            self.event("dropped");
        }
    }
}

async fn work(log: Arc<Log>, task: Task) -> Outcome {
    let job: serde_json::Value = serde_json::from_str(task.payload().get()).unwrap_or_default();
    let ms = job["ms"].as_u64().unwrap_or(DEFAULT_WORK_MS);
    let exec = Execution::start(log, &task);
    let until = tokio::time::Instant::now() + Duration::from_millis(ms);
    loop {
        let left = until.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            break;
        }
        tokio::select! {
            () = task.cancelled() => {
                exec.end("cancelled");
                return Outcome::Nack { delay: None, error: "cancelled".into() };
            }
            () = tokio::time::sleep(left.min(TICK)) => exec.event("tick"),
        }
    }
    exec.end("end");
    Outcome::Ack(None)
}

fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}
