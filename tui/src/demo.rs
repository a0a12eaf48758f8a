//! `muster demo`: a small live swarm against the daemon, to watch in the TUI or with
//! `muster queue describe demo` and `muster members`.
//!
//! A producer enqueues fake jobs on queue `demo` at a steady rate; four agents
//! (`demo/agent-1` to `demo/agent-4`, capacity 2, the last two labelled `gpu`) work on
//! them step by step with progress checkpoints. Some jobs need a GPU, some fail once
//! and are retried, a few are poison and end in dead. A daemon restart costs nothing:
//! the agents and the producer reconnect (each job is sent under an idempotency key,
//! so one cut off mid-enqueue lands once). Ctrl-C or SIGTERM drains the agents (what
//! they hold is released, no attempt spent) and stops it; every connection is closed
//! before the process exits, so the daemon sees the agents gone.

use std::time::Duration;

use anyhow::Context;
use muster_protocol::model::{NewTask, QueuePatch};
use muster_sdk::{
    Client, ConnectOptions, ErrorCode, Outcome, Task, Worker, WorkerConfig, WorkerHandle,
};

/// The queue the demo uses.
const QUEUE: &str = "demo";

/// Agents in the swarm.
const AGENTS: u32 = 4;

/// Runs the demo until Ctrl-C.
pub async fn run(options: ConnectOptions, rate: f64) -> anyhow::Result<()> {
    anyhow::ensure!(rate > 0.0 && rate <= 1000.0, "--rate must be in (0, 1000]");
    let client = Client::connect(options.clone()).await?;
    create_queue(&client).await?;
    let (agents, handles) = start_agents(&options);
    println!("demo: {AGENTS} agents on queue {QUEUE:?}, {rate} tasks/s; Ctrl-C to stop");
    let mut producer = Producer {
        options,
        client: Some(client),
        run: format!("{}-{}", std::process::id(), crate::output::now_ms()),
    };
    producer.produce(rate).await?;
    println!("demo: draining agents");
    for h in &handles {
        h.shutdown();
    }
    for a in agents {
        a.await.context("joining an agent")??;
    }
    if let Some(client) = producer.client {
        client.close().await;
    }
    Ok(())
}

/// Creates queue `demo` (its tasks retried twice, leased for 10 s), unless it exists.
async fn create_queue(client: &Client) -> anyhow::Result<()> {
    match client
        .queue_create(
            QUEUE,
            QueuePatch {
                lease_ms: Some(10_000),
                max_attempts: Some(3),
                ..QueuePatch::default()
            },
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if e.code() == Some(ErrorCode::AlreadyExists) => Ok(()),
        Err(e) => Err(e).context("creating queue demo"),
    }
}

/// Starts the [`AGENTS`] agents, capacity 2 each, the last two labelled `gpu`: their
/// tasks, and the handles that drain them.
fn start_agents(
    options: &ConnectOptions,
) -> (
    Vec<tokio::task::JoinHandle<Result<(), muster_sdk::Error>>>,
    Vec<WorkerHandle>,
) {
    let mut agents = Vec::new();
    let mut handles = Vec::new();
    for n in 1..=AGENTS {
        let mut config = WorkerConfig::new(format!("demo/agent-{n}"), [QUEUE]);
        config.capacity = 2;
        config.grace = Duration::from_secs(5);
        if n > 2 {
            config.labels = vec!["gpu".into()];
        }
        let worker = Worker::new(options.clone(), config);
        handles.push(worker.handle());
        agents.push(tokio::spawn(worker.run(work)));
    }
    (agents, handles)
}

/// First wait before the producer reconnects; doubled up to [`RECONNECT_MAX`].
const RECONNECT_MIN: Duration = Duration::from_millis(100);

/// Longest wait between two reconnects of the producer.
const RECONNECT_MAX: Duration = Duration::from_secs(2);

/// The demo's producer: reconnects like the agents do when the daemon restarts, and
/// sends each job under an idempotency key, so a job whose enqueue was cut off is
/// enqueued once however often it is sent again.
struct Producer {
    options: ConnectOptions,
    client: Option<Client>,
    /// Tells this run's idempotency keys apart from an earlier run's.
    run: String,
}

impl Producer {
    /// Enqueues a job every `1 / rate` seconds until Ctrl-C or SIGTERM.
    async fn produce(&mut self, rate: f64) -> anyhow::Result<()> {
        let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
        // After an outage the producer goes on at its rate, without a burst of catch-up.
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .context("listening for SIGTERM")?;
        let stop = async {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        };
        tokio::pin!(stop);
        let mut n: u64 = 0;
        loop {
            tokio::select! {
                () = &mut stop => return Ok(()),
                _ = tick.tick() => {
                    n += 1;
                    tokio::select! {
                        () = &mut stop => return Ok(()),
                        sent = self.enqueue(n) => sent?,
                    }
                }
            }
        }
    }

    /// Enqueues job `n`, reconnecting until the daemon takes it; fails only if the
    /// daemon refuses it.
    async fn enqueue(&mut self, n: u64) -> anyhow::Result<()> {
        let mut wait = RECONNECT_MIN;
        let mut lost_since: Option<std::time::Instant> = None;
        loop {
            let client = match &self.client {
                Some(c) => c,
                None => match Client::connect(self.options.clone()).await {
                    Ok(c) => {
                        if let Some(since) = lost_since {
                            let after = since.elapsed().as_secs_f64();
                            println!("demo: producer reconnected after {after:.1}s");
                        }
                        self.client.insert(c)
                    }
                    Err(e) => {
                        tracing::debug!("demo producer: reconnecting: {e}");
                        lost_since.get_or_insert_with(std::time::Instant::now);
                        tokio::time::sleep(wait).await;
                        wait = (wait * 2).min(RECONNECT_MAX);
                        continue;
                    }
                },
            };
            match client.enqueue(QUEUE, job(n, &self.run)?).await {
                Ok(_) => return Ok(()),
                // The daemon refused it: a real error, not an outage.
                Err(e) if e.code().is_some() => return Err(e).context("enqueueing"),
                Err(e) => {
                    tracing::warn!("demo producer: {e}; reconnecting");
                    lost_since.get_or_insert_with(std::time::Instant::now);
                    self.client = None;
                }
            }
        }
    }
}

/// Job `n` of a run: its steps, whether it fails once or is poison, its priority and
/// whether it needs a GPU all follow from `n`.
fn job(n: u64, run: &str) -> anyhow::Result<NewTask> {
    let mut task = NewTask::new(muster_sdk::json(&serde_json::json!({
        "job": n,
        "steps": 5 + n % 20,
        "fail_once": n.is_multiple_of(7),
        "poison": n.is_multiple_of(31),
    }))?);
    task.priority = Some((n % 3) as u8);
    if n.is_multiple_of(5) {
        task.requires = vec!["gpu".into()];
    }
    task.idempotency_key = Some(format!("demo-{run}-{n}"));
    Ok(task)
}

/// Fake work: a step every 200 ms with a progress checkpoint, resuming from the last one.
async fn work(task: Task) -> Outcome {
    let job: serde_json::Value = serde_json::from_str(task.payload().get()).unwrap_or_default();
    if job["poison"].as_bool() == Some(true) {
        return Outcome::DeadLetter("poison job: cannot be processed".into());
    }
    let steps = job["steps"].as_u64().unwrap_or(5);
    let start = task
        .progress()
        .and_then(|p| serde_json::from_str::<serde_json::Value>(p.get()).ok())
        .and_then(|p| p["step"].as_u64())
        .unwrap_or(0);
    for step in start..steps {
        tokio::select! {
            // Stopped (a cancel, a drain): back to the queue with its checkpoint.
            () = task.cancelled() => return Outcome::Release,
            () = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
        if let Ok(p) = muster_sdk::json(&serde_json::json!({ "step": step + 1 })) {
            task.set_progress(p);
        }
    }
    if job["fail_once"].as_bool() == Some(true) && task.attempt() == 1 {
        return Outcome::Nack {
            delay: Some(Duration::from_secs(1)),
            error: "flaky upstream".into(),
        };
    }
    Outcome::Ack(muster_sdk::json(&serde_json::json!({ "steps": steps })).ok())
}
