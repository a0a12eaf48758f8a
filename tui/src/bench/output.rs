//! The output phase of `muster bench`: `emitters` tasks, each held by an SDK worker
//! whose handler emits `chunk_rate` text chunks a second for `seconds` (in bursts every
//! [`BURST`], through [`muster_sdk::Task::emit_text`], so the SDK's flusher batches
//! what gathers), each followed by a follower (`follow` from its next number, as `muster
//! tail -f` does). Each chunk carries the wall time it was emitted at: the follower
//! delay is from that to the follower holding it. Also the chunks stored per second,
//! and the daemon's CPU and the bytes it wrote to disk (`/proc/PID/io` `write_bytes`:
//! journal and tables) per chunk.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use muster_protocol::model::{NewTask, QueuePatch, TaskState};
use muster_sdk::{Client, ConnectOptions, Outcome, Worker, WorkerConfig};

use super::{Run, cpu_seconds, now_us, payload, percentile};
use crate::cli::BenchArgs;

const QUEUE: &str = "output";

/// How often an emitter emits what is due.
const BURST: Duration = Duration::from_millis(10);

/// Longest a follower waits on one `follow`.
const FOLLOW_WAIT: Duration = Duration::from_secs(5);

/// Bytes the daemon's process has written to storage (`/proc/PID/io`), if readable.
fn written_bytes(pid: u32) -> Option<u64> {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?;
    io.lines()
        .find_map(|l| l.strip_prefix("write_bytes:"))
        .and_then(|v| v.trim().parse().ok())
}

pub(super) async fn output(
    args: &BenchArgs,
    options: &ConnectOptions,
    pid: u32,
    run: &mut Run,
) -> anyhow::Result<()> {
    let producer = Client::connect(options.clone()).await?;
    producer.queue_create(QUEUE, QueuePatch::default()).await?;
    let mut ids = Vec::new();
    for _ in 0..args.emitters {
        ids.push(producer.enqueue(QUEUE, NewTask::new(payload(0)?)).await?.id);
    }
    // Followers first, as people watching would be: a follower per task, spread over
    // `workers` connections.
    let delays: Arc<Mutex<Vec<f64>>> = Arc::default();
    let mut followers = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..args.workers {
        clients.push(Arc::new(Client::connect(options.clone()).await?));
    }
    for (i, id) in ids.iter().enumerate() {
        let client = Arc::clone(&clients[i % clients.len()]);
        let (id, delays) = (id.clone(), Arc::clone(&delays));
        followers.push(tokio::spawn(async move {
            let mut next = 0;
            let mut mine = Vec::new();
            loop {
                let r = client.follow(&id, next, FOLLOW_WAIT).await?;
                let now = now_us();
                for c in &r.chunks {
                    let sent: u64 = c
                        .text
                        .as_deref()
                        .and_then(|t| t.split(' ').next())
                        .and_then(|t| t.parse().ok())
                        .context("a chunk without its time")?;
                    mine.push(now.saturating_sub(sent) as f64 / 1000.0);
                }
                if r.dropped > 0 {
                    bail!("task {id}: {} chunks dropped", r.dropped);
                }
                next = r.next;
                if r.end {
                    break;
                }
            }
            delays.lock().expect("lock").extend(mine);
            anyhow::Ok(next)
        }));
    }
    let cpu = cpu_seconds(pid);
    let written = written_bytes(pid);
    let started = Instant::now();
    let (rate, seconds) = (args.chunk_rate, args.seconds);
    let per_worker = args.emitters.div_ceil(args.workers) as u32;
    let emitted = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for w in 0..args.workers {
        let emitted = Arc::clone(&emitted);
        let mut config = WorkerConfig::new(format!("bench/emitter-{w}"), [QUEUE]);
        config.capacity = per_worker;
        let worker = Worker::new(options.clone(), config);
        let handle = worker.handle();
        let run = tokio::spawn(worker.run(move |task| {
            let emitted = Arc::clone(&emitted);
            async move {
                let begun = Instant::now();
                let mut sent = 0u64;
                let mut tick = tokio::time::interval(BURST);
                while begun.elapsed().as_secs_f64() < seconds {
                    tick.tick().await;
                    let due = (begun.elapsed().as_secs_f64() * rate) as u64;
                    while sent < due {
                        let chunk = format!("{} token{sent}\n", now_us());
                        if task.emit_text(chunk).await.is_err() {
                            return Outcome::Release;
                        }
                        sent += 1;
                    }
                }
                emitted.fetch_add(sent, Ordering::Relaxed);
                Outcome::Ack(None)
            }
        }));
        workers.push((handle, run));
    }
    let mut chunks = 0;
    for f in followers {
        chunks += f.await??;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds(pid) - cpu;
    let written = written_bytes(pid)
        .zip(written)
        .map(|(a, b)| a.saturating_sub(b));
    for (handle, run) in workers {
        handle.shutdown();
        run.await??;
    }
    for id in &ids {
        let t = producer.task_get(id).await?;
        if t.state != TaskState::Done {
            bail!("task {id} is {} after its emitter", t.state);
        }
    }
    let want = emitted.load(Ordering::Relaxed);
    if chunks != want {
        bail!("{chunks} chunks followed, {want} emitted");
    }
    let mut delays = std::mem::take(&mut *delays.lock().expect("lock"));
    delays.sort_by(f64::total_cmp);
    run.output_chunks_per_s = Some(chunks as f64 / elapsed);
    run.output_delay_p50_ms = Some(percentile(&delays, 0.5));
    run.output_delay_p99_ms = Some(percentile(&delays, 0.99));
    run.output_cpu_us_per_chunk = Some(cpu * 1e6 / chunks as f64);
    run.output_disk_bytes_per_chunk = written.map(|w| w as f64 / chunks as f64);
    Ok(())
}
