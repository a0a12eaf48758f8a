//! An agent doing slow fake work with progress checkpoints.
//!
//! ```sh
//! cargo run -p muster-sdk --example agent -- gpu-3/agent-7 jobs 3
//! ```
//! Arguments: member name, queue, capacity. Each job is `{"steps": N, "step_ms": M}`:
//! N steps of M milliseconds, a checkpoint after each. A restarted agent (same member
//! name) gets its tasks back at once and resumes from the last checkpoint. Ctrl-C or
//! SIGTERM drains: running jobs get 10 s, the rest is released for other agents.
//!
//! It prints one line per event, for people and for tests:
//! `start ID attempt=A reclaimed=R progress=P`, `done ID`, `cancelled ID`.

use std::io::Write;
use std::time::Duration;

use muster_sdk::{ConnectOptions, Outcome, Task, Worker, WorkerConfig};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let member = args.next().unwrap_or_else(|| "example/agent-1".into());
    let queue = args.next().unwrap_or_else(|| "jobs".into());
    let capacity: u32 = args.next().map_or(Ok(1), |n| n.parse())?;
    let mut config = WorkerConfig::new(member, [queue]);
    config.capacity = capacity;
    config.grace = Duration::from_secs(10);
    let worker = Worker::new(ConnectOptions::from_env(), config);
    worker.handle().shutdown_on_signals();
    worker.run(work).await?;
    Ok(())
}

fn say(line: String) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

async fn work(task: Task) -> Outcome {
    let job: serde_json::Value = serde_json::from_str(task.payload().get()).unwrap_or_default();
    let steps = job["steps"].as_u64().unwrap_or(10);
    let step_ms = job["step_ms"].as_u64().unwrap_or(100);
    let progress = task.progress();
    let start = progress
        .as_ref()
        .and_then(|p| serde_json::from_str::<serde_json::Value>(p.get()).ok())
        .and_then(|p| p["step"].as_u64())
        .unwrap_or(0);
    say(format!(
        "start {} attempt={} reclaimed={} progress={}",
        task.id(),
        task.attempt(),
        task.reclaimed(),
        progress.as_ref().map_or("-", |p| p.get())
    ));
    for step in start..steps {
        tokio::select! {
            () = task.cancelled() => {
                say(format!("cancelled {}", task.id()));
                // Not a failure: a cancelled task released ends cancelled, a task
                // stopped by a drain goes back with its last checkpoint.
                return Outcome::Release;
            }
            () = tokio::time::sleep(Duration::from_millis(step_ms)) => {}
        }
        if let Ok(p) = muster_sdk::json(&serde_json::json!({ "step": step + 1 })) {
            task.set_progress(p);
        }
    }
    say(format!("done {}", task.id()));
    Outcome::Ack(muster_sdk::json(&serde_json::json!({ "steps": steps })).ok())
}
