//! The `burndown` phase of `muster bench`: the method River and Oban publish their
//! throughput with. `burn_tasks` no-op tasks (payload `{}`) are enqueued first, in
//! atomic batches of [`MAX_BATCH`] from [`PRODUCERS`] producers; then `workers` member
//! sessions (each holding up to `prefetch` pushed tasks) ack every one of them. The
//! figure is the tasks worked per second, from the first worker's start to the last
//! ack, with the daemon's CPU per 1,000 tasks and its resident memory at the end; the
//! enqueue's rate is reported beside it.

use std::time::Instant;

use muster_protocol::limits::MAX_BATCH;
use muster_protocol::model::{NewTask, QueuePatch};
use muster_sdk::{Client, ConnectOptions};

use super::{Run, drain_queue, rss_mib};
use crate::cli::BenchArgs;

const QUEUE: &str = "burndown";

/// Producers putting the tasks on the queue before the burn-down starts.
const PRODUCERS: usize = 4;

pub(super) async fn burndown(
    args: &BenchArgs,
    options: &ConnectOptions,
    pid: u32,
    run: &mut Run,
) -> anyhow::Result<()> {
    let admin = Client::connect(options.clone()).await?;
    admin.queue_create(QUEUE, QueuePatch::default()).await?;
    let started = Instant::now();
    let mut producers = Vec::new();
    for p in 0..PRODUCERS {
        // Producer p puts batches p, p + PRODUCERS, … of the whole.
        let batches: Vec<usize> = (0..args.burn_tasks.div_ceil(MAX_BATCH))
            .skip(p)
            .step_by(PRODUCERS)
            .map(|b| MAX_BATCH.min(args.burn_tasks - b * MAX_BATCH))
            .collect();
        let client = Client::connect(options.clone()).await?;
        producers.push(tokio::spawn(async move {
            let noop = NewTask::new(muster_sdk::raw_json("{}")?);
            for size in batches {
                client
                    .enqueue_batch(QUEUE, vec![noop.clone(); size])
                    .await?;
            }
            anyhow::Ok(())
        }));
    }
    for p in producers {
        p.await??;
    }
    run.burndown_enqueue_per_s = Some(args.burn_tasks as f64 / started.elapsed().as_secs_f64());
    let (secs, cpu) = drain_queue(args, options, pid, QUEUE, args.burn_tasks).await?;
    run.burndown_per_s = Some(args.burn_tasks as f64 / secs);
    run.burndown_cpu_s_per_1000 = Some(cpu / (args.burn_tasks as f64 / 1000.0));
    run.burndown_rss_mib = Some(rss_mib(pid));
    Ok(())
}
