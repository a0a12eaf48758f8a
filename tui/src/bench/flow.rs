//! The flow-control phases of `muster bench`.
//!
//! - `limited`: `limit_agents` agents on three queues whose tasks all draw on one limit
//!   of `limit_rate` tokens a second (burst a tenth of that): the rate they are handed
//!   out at, and the most handed out in any one second (sliding, by when the agents
//!   receive them).
//! - `fair`: a queue with fair dispatch, group `a` holding a backlog of `tasks`, and
//!   group `b` enqueuing 50 tasks a second while the workers drain it: how long `b`'s
//!   tasks wait from enqueue to delivery. Then `tasks` tasks spread over `fair_groups`
//!   groups of another fair queue, drained: tasks a second and the daemon's CPU per
//!   1,000, to hold against the `drain` phase (the cost of the groups' turns).
//! - `limit-cost`: `tasks` tasks, each drawing on a per-key limit (never short of room)
//!   with `limit_keys` keys, drained by the workers: tasks a second and the daemon's
//!   CPU per 1,000, to hold against the `drain` phase of the same run (tasks without
//!   limits).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::bail;
use muster_protocol::model::{LimitSpec, LimitUse, NewTask, QueuePatch, Rate};
use muster_sdk::{Client, ConnectOptions};

use super::{Run, cpu_seconds, latency_recorder, now_us, payload, percentile, start_workers};
use crate::cli::BenchArgs;

/// The `limited` phase's queues.
const LIMITED_QUEUES: [&str; 3] = ["limited-a", "limited-b", "limited-c"];

/// Tasks a second group `b` enqueues in the `fair` phase, and how many.
const FAIR_B_RATE: f64 = 50.0;
const FAIR_B_TASKS: usize = 100;

/// Longest any of these phases waits for its tasks.
const PHASE_DEADLINE: Duration = Duration::from_secs(600);

/// Enqueues `tasks` on `queue` in batches of 1,000, eight batches in flight.
async fn enqueue_all(client: &Client, queue: &str, tasks: Vec<NewTask>) -> anyhow::Result<()> {
    let mut pending = VecDeque::new();
    let mut tasks = tasks.into_iter().peekable();
    while tasks.peek().is_some() {
        let batch: Vec<NewTask> = tasks.by_ref().take(1000).collect();
        pending.push_back(client.send_enqueue(queue, batch).await?);
        if pending.len() >= 8
            && let Some(p) = pending.pop_front()
        {
            p.reply().await?;
        }
    }
    for p in pending {
        p.reply().await?;
    }
    Ok(())
}

/// A task stamped for the latency recorder, drawing on `limits`, in `group`.
fn task(limits: Vec<LimitUse>, group: Option<&str>) -> anyhow::Result<NewTask> {
    Ok(NewTask {
        limits,
        group: group.map(str::to_owned),
        ..NewTask::new(payload(now_us())?)
    })
}

/// Waits until `counter` reaches `n`.
async fn wait_for(counter: &AtomicUsize, n: usize, what: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + PHASE_DEADLINE;
    while counter.load(Ordering::Relaxed) < n {
        if Instant::now() > deadline {
            bail!(
                "{what}: {} of {n} within {} s",
                counter.load(Ordering::Relaxed),
                PHASE_DEADLINE.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

/// The most of `sorted` (instants) that fall in any window of `width`.
fn most_in_window(sorted: &[Instant], width: Duration) -> usize {
    let mut most = 0;
    let mut from = 0;
    for (to, t) in sorted.iter().enumerate() {
        while *t - sorted[from] >= width {
            from += 1;
        }
        most = most.max(to - from + 1);
    }
    most
}

pub(super) async fn limited(
    args: &BenchArgs,
    options: &ConnectOptions,
    run: &mut Run,
) -> anyhow::Result<()> {
    let admin = Client::connect(options.clone()).await?;
    let rate = args.limit_rate;
    let spec = LimitSpec {
        rate: Some(Rate {
            count: rate,
            per_ms: 1000,
        }),
        burst: Some((rate / 10).max(1)),
        ..LimitSpec::default()
    };
    admin.limit_set("bench-budget", spec).await?;
    // Enough for the whole phase and a second more, so the agents never run dry.
    let wanted = (rate as f64 * args.seconds) as usize;
    let per_queue = (wanted + rate as usize).div_ceil(LIMITED_QUEUES.len());
    for q in LIMITED_QUEUES {
        admin.queue_create(q, QueuePatch::default()).await?;
        let tasks = (0..per_queue)
            .map(|_| {
                let uses = LimitUse {
                    limit: "bench-budget".into(),
                    key: None,
                    cost: None,
                };
                task(vec![uses], None)
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        enqueue_all(&admin, q, tasks).await?;
    }
    let received: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let on_task = {
        let received = Arc::clone(&received);
        Arc::new(move |_: &muster_sdk::Delivery| {
            received
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(Instant::now());
        })
    };
    let acked = Arc::new(AtomicUsize::new(0));
    let agents = start_workers(
        options,
        &LIMITED_QUEUES,
        args.limit_agents,
        args.prefetch,
        on_task,
        Arc::clone(&acked),
    )
    .await?;
    wait_for(&acked, wanted, "limited: tasks acked").await?;
    for a in agents {
        a.abort();
    }
    let mut times = received
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    times.sort_unstable();
    if let (Some(first), Some(last)) = (times.first(), times.last())
        && last > first
    {
        run.limited_per_s = Some((times.len() - 1) as f64 / (*last - *first).as_secs_f64());
    }
    run.limited_most_in_1s = Some(most_in_window(&times, Duration::from_secs(1)) as f64);
    for q in LIMITED_QUEUES {
        admin.queue_purge(q).await?;
    }
    Ok(())
}

pub(super) async fn fair(
    args: &BenchArgs,
    options: &ConnectOptions,
    pid: u32,
    run: &mut Run,
) -> anyhow::Result<()> {
    let admin = Client::connect(options.clone()).await?;
    let patch = QueuePatch {
        fair: Some(true),
        ..QueuePatch::default()
    };
    admin.queue_create("fair", patch).await?;
    let backlog = (0..args.tasks)
        .map(|_| task(Vec::new(), Some("a")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    enqueue_all(&admin, "fair", backlog).await?;
    // Only b's tasks are stamped for the recorder: a's stamp is their enqueue, long
    // before the workers start.
    let samples: Arc<Mutex<Vec<f64>>> = Arc::default();
    let record = latency_recorder(&samples);
    let on_task = Arc::new(move |d: &muster_sdk::Delivery| {
        if d.payload.get().contains("\"g\":\"b\"") {
            record(d);
        }
    });
    let acked = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let workers = start_workers(
        options,
        &["fair"],
        args.workers,
        args.prefetch,
        on_task,
        Arc::clone(&acked),
    )
    .await?;
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / FAIR_B_RATE));
    for _ in 0..FAIR_B_TASKS {
        tick.tick().await;
        let stamp = muster_sdk::raw_json(&format!("{{\"t\":{},\"g\":\"b\"}}", now_us()))?;
        let task = NewTask {
            group: Some("b".into()),
            ..NewTask::new(stamp)
        };
        admin.enqueue("fair", task).await?;
    }
    wait_for(&acked, args.tasks + FAIR_B_TASKS, "fair: tasks acked").await?;
    run.fair_drain_per_s = Some(args.tasks as f64 / started.elapsed().as_secs_f64());
    for w in workers {
        w.abort();
    }
    let mut s = samples
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    s.sort_by(f64::total_cmp);
    run.fair_b_wait_p50_ms = Some(percentile(&s, 0.5));
    run.fair_b_wait_p99_ms = Some(percentile(&s, 0.99));
    run.fair_b_wait_max_ms = s.last().copied();
    fair_groups(args, options, &admin, pid, run).await
}

/// The second part of the `fair` phase: `tasks` tasks over `fair_groups` groups.
async fn fair_groups(
    args: &BenchArgs,
    options: &ConnectOptions,
    admin: &Client,
    pid: u32,
    run: &mut Run,
) -> anyhow::Result<()> {
    let patch = QueuePatch {
        fair: Some(true),
        ..QueuePatch::default()
    };
    admin.queue_create("fair-groups", patch).await?;
    let tasks = (0..args.tasks)
        .map(|i| task(Vec::new(), Some(&format!("g{}", i % args.fair_groups))))
        .collect::<anyhow::Result<Vec<_>>>()?;
    enqueue_all(admin, "fair-groups", tasks).await?;
    let cpu = cpu_seconds(pid);
    let acked = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let workers = start_workers(
        options,
        &["fair-groups"],
        args.workers,
        args.prefetch,
        Arc::new(|_| {}),
        Arc::clone(&acked),
    )
    .await?;
    wait_for(&acked, args.tasks, "fair: groups' tasks acked").await?;
    run.fair_groups_drain_per_s = Some(args.tasks as f64 / started.elapsed().as_secs_f64());
    run.fair_groups_cpu_s_per_1000 = Some((cpu_seconds(pid) - cpu) / (args.tasks as f64 / 1000.0));
    for w in workers {
        w.abort();
    }
    Ok(())
}

pub(super) async fn limit_cost(
    args: &BenchArgs,
    options: &ConnectOptions,
    pid: u32,
    run: &mut Run,
) -> anyhow::Result<()> {
    let admin = Client::connect(options.clone()).await?;
    // Never short of room: a billion tokens a millisecond, a million leases a key.
    let spec = LimitSpec {
        rate: Some(Rate {
            count: muster_protocol::limits::MAX_LIMIT_TOKENS,
            per_ms: 1,
        }),
        concurrency: Some(muster_protocol::limits::MAX_LIMIT_CONCURRENCY),
        per_key: true,
        ..LimitSpec::default()
    };
    admin.limit_set("bench-keys", spec).await?;
    admin.queue_create("keyed", QueuePatch::default()).await?;
    let tasks = (0..args.tasks)
        .map(|i| {
            let uses = LimitUse {
                limit: "bench-keys".into(),
                key: Some(format!("k{}", i % args.limit_keys)),
                cost: None,
            };
            task(vec![uses], None)
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    enqueue_all(&admin, "keyed", tasks).await?;
    let cpu = cpu_seconds(pid);
    let acked = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let workers = start_workers(
        options,
        &["keyed"],
        args.workers,
        args.prefetch,
        Arc::new(|_| {}),
        Arc::clone(&acked),
    )
    .await?;
    wait_for(&acked, args.tasks, "limit-cost: tasks acked").await?;
    run.limit_cost_drain_per_s = Some(args.tasks as f64 / started.elapsed().as_secs_f64());
    run.limit_cost_cpu_s_per_1000 = Some((cpu_seconds(pid) - cpu) / (args.tasks as f64 / 1000.0));
    for w in workers {
        w.abort();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_most_in_a_window_counts_a_sliding_window_half_open() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let times = [
            at(0),
            at(100),
            at(999),
            at(1000),
            at(1500),
            at(1999),
            at(2000),
        ];
        // [999, 1999) holds 999, 1000, 1500: three; [0, 1000) holds 0, 100, 999.
        assert_eq!(most_in_window(&times, Duration::from_secs(1)), 3);
        assert_eq!(most_in_window(&times, Duration::from_millis(1001)), 4);
        assert_eq!(most_in_window(&[], Duration::from_secs(1)), 0);
    }
}
