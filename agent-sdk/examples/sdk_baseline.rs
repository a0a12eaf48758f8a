//! The Rust side of the Python and Node SDKs' benchmarks (`agent-sdk/python/bench/bench.py`,
//! `agent-sdk/node/bench/bench.mjs`): the same producer and worker shapes on `muster-sdk`
//! directly, so their figures have a baseline from the same machine and the same run.
//!
//! ```sh
//! cargo build --release -p muster-sdk --example sdk_baseline
//! sdk_baseline PHASE ADDR DATA_DIR TASKS
//! ```
//! Phases (queue `bench`, which must exist):
//! - `enqueue`: one client, one task per request, [`WINDOW`] requests in flight;
//! - `enqueue-batched`: one client, [`muster_sdk::protocol::limits::MAX_BATCH`] tasks
//!   per request, every request sent before the first reply is awaited;
//! - `drain`: one `Worker` of capacity [`CAPACITY`] with a handler that acks at once,
//!   until TASKS tasks are done.
//!
//! Prints the rate in tasks per second.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use muster_sdk::protocol::limits::MAX_BATCH;
use muster_sdk::{Client, ConnectOptions, NewTask, Outcome, RawJson, Trust, Worker, WorkerConfig};

/// Unconfirmed single-task enqueues in flight (as `muster bench`'s producers).
const WINDOW: usize = 256;

/// Tasks the draining worker holds at once (as `muster bench`'s workers' prefetch).
const CAPACITY: u32 = 32;

/// Bytes of each task's JSON payload (as `muster bench`'s).
const PAYLOAD_BYTES: usize = 256;

/// How often the drain phase looks at the queue's done count.
const POLL: Duration = Duration::from_millis(5);

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [phase, addr, data, tasks] = args.as_slice() else {
        return Err("usage: sdk_baseline PHASE ADDR DATA_DIR TASKS".into());
    };
    let tasks: usize = tasks.parse()?;
    let options = ConnectOptions {
        addr: addr.clone(),
        trust: Trust::DataDir(data.into()),
        ..ConnectOptions::default()
    };
    let elapsed = match phase.as_str() {
        "enqueue" => enqueue(options, tasks).await?,
        "enqueue-batched" => enqueue_batched(options, tasks).await?,
        "drain" => drain(options, tasks).await?,
        other => return Err(format!("unknown phase {other:?}").into()),
    };
    println!("{:.1}", tasks as f64 / elapsed.as_secs_f64());
    Ok(())
}

/// `{"t":0,"pad":"xxx…"}`, [`PAYLOAD_BYTES`] long.
fn payload() -> Result<RawJson, muster_sdk::Error> {
    let head = "{\"t\":0,\"pad\":\"";
    let pad = "x".repeat(PAYLOAD_BYTES - head.len() - 2);
    muster_sdk::raw_json(&format!("{head}{pad}\"}}"))
}

async fn enqueue(options: ConnectOptions, tasks: usize) -> Result<Duration, muster_sdk::Error> {
    let client = Client::connect(options).await?;
    let payload = payload()?;
    let started = Instant::now();
    let mut in_flight = VecDeque::with_capacity(WINDOW);
    for _ in 0..tasks {
        if in_flight.len() >= WINDOW
            && let Some(oldest) = in_flight.pop_front()
        {
            let oldest: muster_sdk::PendingReply<_> = oldest;
            oldest.reply().await?;
        }
        in_flight.push_back(
            client
                .send_enqueue("bench", vec![NewTask::new(payload.clone())])
                .await?,
        );
    }
    for pending in in_flight {
        pending.reply().await?;
    }
    let elapsed = started.elapsed();
    client.close().await;
    Ok(elapsed)
}

async fn enqueue_batched(
    options: ConnectOptions,
    tasks: usize,
) -> Result<Duration, muster_sdk::Error> {
    let client = Client::connect(options).await?;
    let payload = payload()?;
    let started = Instant::now();
    let mut pending = Vec::new();
    let mut left = tasks;
    while left > 0 {
        let n = left.min(MAX_BATCH);
        let batch = (0..n).map(|_| NewTask::new(payload.clone())).collect();
        pending.push(client.send_enqueue("bench", batch).await?);
        left -= n;
    }
    for reply in pending {
        reply.reply().await?;
    }
    let elapsed = started.elapsed();
    client.close().await;
    Ok(elapsed)
}

async fn drain(options: ConnectOptions, tasks: usize) -> Result<Duration, muster_sdk::Error> {
    let monitor = Client::connect(options.clone()).await?;
    let mut config = WorkerConfig::new("bench/rust", ["bench"]);
    config.capacity = CAPACITY;
    let worker = Worker::new(options, config);
    let handle = worker.handle();
    let started = Instant::now();
    let running = tokio::spawn(worker.run(|_task| async { Outcome::Ack(None) }));
    while (monitor.queue_describe("bench").await?.counts.done as usize) < tasks {
        tokio::time::sleep(POLL).await;
    }
    let elapsed = started.elapsed();
    handle.shutdown();
    running
        .await
        .map_err(|e| muster_sdk::Error::Protocol(e.to_string()))??;
    monitor.close().await;
    Ok(elapsed)
}
