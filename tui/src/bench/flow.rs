//! The flow-control phases of `muster bench`.
//!
//! - `limited`: `limit_agents` agents on three queues whose tasks all draw on one limit
//!   of `limit_rate` tokens a second and a burst of `limit_burst`: the rate they are
//!   handed out at (and past the first second, once the burst gathered before the
//!   first delivery is spent), and the most handed out in any one second (sliding, by
//!   when the agents receive them; at most the rate and the burst).
//! - `fair`: a queue with fair dispatch, group `a` holding a backlog of `tasks`, and
//!   group `b` enqueuing 50 tasks a second while the workers drain it: how long `b`'s
//!   tasks wait from enqueue to delivery. Then `tasks` tasks spread over `fair_groups`
//!   groups of fair queues, drained alongside as many plain tasks: tasks a second and
//!   the daemon's CPU per 1,000, and both against the plain tasks' (the cost of the
//!   groups' turns).
//! - `limit-cost`: `tasks` tasks, each drawing on a per-key limit (never short of room)
//!   with `limit_keys` keys, drained by the workers alongside as many tasks without
//!   limits: tasks a second and the daemon's CPU per 1,000, and both against the plain
//!   tasks'.

use std::collections::VecDeque;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use muster_protocol::model::{LimitSpec, LimitUse, NewTask, QueuePatch, Rate};
use muster_sdk::{Client, ConnectOptions};

use super::{
    PHASE_DEADLINE, Run, all_acked, drain_queue, latency_recorder, now_us, payload, percentile,
    start_workers,
};
use crate::cli::BenchArgs;

/// The `limited` phase's queues.
const LIMITED_QUEUES: [&str; 3] = ["limited-a", "limited-b", "limited-c"];

/// Tasks a second group `b` enqueues in the `fair` phase, and how many.
const FAIR_B_RATE: f64 = 50.0;
const FAIR_B_TASKS: usize = 100;

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
        burst: Some(args.limit_burst),
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
    all_acked(&acked, wanted, PHASE_DEADLINE, "limited: tasks acked").await?;
    for a in agents {
        a.abort();
    }
    let mut times = received
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    times.sort_unstable();
    // The bucket filled up to its burst before the first delivery; past the first
    // second, the rate is the refill's alone.
    if let (Some(first), Some(last)) = (times.first(), times.last())
        && last > first
    {
        run.limited_per_s = Some((times.len() - 1) as f64 / (*last - *first).as_secs_f64());
        let settled = *first + Duration::from_secs(1);
        let after = times.iter().filter(|t| **t >= settled).count();
        if *last > settled && after > 1 {
            run.limited_steady_per_s = Some((after - 1) as f64 / (*last - settled).as_secs_f64());
        }
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
    all_acked(
        &acked,
        args.tasks + FAIR_B_TASKS,
        PHASE_DEADLINE,
        "fair: tasks acked",
    )
    .await?;
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

/// The second part of the `fair` phase: `tasks` tasks over `fair_groups` groups of a
/// fair queue, against as many plain ones ([`against_plain`]).
async fn fair_groups(
    args: &BenchArgs,
    options: &ConnectOptions,
    admin: &Client,
    pid: u32,
    run: &mut Run,
) -> anyhow::Result<()> {
    let fair = QueuePatch {
        fair: Some(true),
        ..QueuePatch::default()
    };
    let groups = args.fair_groups;
    let cost = against_plain(args, options, admin, pid, "fair-groups", fair, |i| {
        task(Vec::new(), Some(&format!("g{}", i % groups)))
    })
    .await?;
    run.fair_groups_drain_per_s = Some(cost.per_s);
    run.fair_groups_vs_plain = Some(cost.per_s_vs_plain);
    run.fair_groups_cpu_s_per_1000 = Some(cost.cpu_s_per_1000);
    run.fair_groups_cpu_vs_plain = cost.cpu_vs_plain;
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
    let keys = args.limit_keys;
    let cost = against_plain(
        args,
        options,
        &admin,
        pid,
        "keyed",
        QueuePatch::default(),
        |i| {
            let uses = LimitUse {
                limit: "bench-keys".into(),
                key: Some(format!("k{}", i % keys)),
                cost: None,
            };
            task(vec![uses], None)
        },
    )
    .await?;
    run.limit_cost_drain_per_s = Some(cost.per_s);
    run.limit_cost_vs_plain = Some(cost.per_s_vs_plain);
    run.limit_cost_cpu_s_per_1000 = Some(cost.cpu_s_per_1000);
    run.limit_cost_cpu_vs_plain = cost.cpu_vs_plain;
    Ok(())
}

/// What draining some kind of tasks costs, and against plain tasks drained alongside.
struct Cost {
    per_s: f64,
    per_s_vs_plain: f64,
    cpu_s_per_1000: f64,
    /// `None` when the plain tasks' CPU rounded to no tick of the clock.
    cpu_vs_plain: Option<f64>,
}

/// Drains `tasks` tasks made by `make` (on queues `NAME-1`, `NAME-2` created with
/// `patch`) and as many plain tasks (`NAME-plain-1`, `-2`), a quarter at a time in the
/// order plain, made, made, plain, all enqueued first: each kind meets the store and
/// the machine as the other does.
async fn against_plain(
    args: &BenchArgs,
    options: &ConnectOptions,
    admin: &Client,
    pid: u32,
    name: &str,
    patch: QueuePatch,
    make: impl Fn(usize) -> anyhow::Result<NewTask>,
) -> anyhow::Result<Cost> {
    let quarter = (args.tasks / 4).max(1);
    let (plain, made) = (
        [format!("{name}-plain-1"), format!("{name}-plain-2")],
        [format!("{name}-1"), format!("{name}-2")],
    );
    for (n, q) in made.iter().enumerate() {
        admin.queue_create(q, patch.clone()).await?;
        let tasks = (n * quarter..(n + 1) * quarter)
            .map(&make)
            .collect::<anyhow::Result<Vec<_>>>()?;
        enqueue_all(admin, q, tasks).await?;
    }
    for q in &plain {
        admin.queue_create(q, QueuePatch::default()).await?;
        let tasks = (0..quarter)
            .map(|_| task(Vec::new(), None))
            .collect::<anyhow::Result<Vec<_>>>()?;
        enqueue_all(admin, q, tasks).await?;
    }
    let mut spent = [(0.0, 0.0); 2];
    for (kind, q) in [(0, &plain[0]), (1, &made[0]), (1, &made[1]), (0, &plain[1])] {
        let (secs, cpu) = drain_queue(args, options, pid, q, quarter).await?;
        spent[kind].0 += secs;
        spent[kind].1 += cpu;
    }
    let n = (2 * quarter) as f64;
    let [(plain_s, plain_cpu), (made_s, made_cpu)] = spent;
    Ok(Cost {
        per_s: n / made_s,
        per_s_vs_plain: plain_s / made_s,
        cpu_s_per_1000: made_cpu / (n / 1000.0),
        cpu_vs_plain: (plain_cpu > 0.0).then(|| made_cpu / plain_cpu),
    })
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
