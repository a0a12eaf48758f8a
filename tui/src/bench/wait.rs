//! The waiting phase of `muster bench`.
//!
//! - `suspend`: one worker (a member session of capacity 1) and one approver, strictly
//!   sequential, `roundtrips` times: the worker gets a pushed task and suspends it; the
//!   approver resumes it with the token; the worker gets it pushed again (with the
//!   resume's data) and acks it. The suspend's latency (its reply, the token in hand)
//!   and the resume's (from sending it to the task's next delivery at the worker): each
//!   is one or more durable rounds of the daemon.
//! - `fanout`: one parent (pushed to a worker of capacity 1) spawns `children` children
//!   into another queue and waits; `workers` clients claim and ack them (32 at a time);
//!   the parent is pushed again with every child's outcome. The spawn's reply (the
//!   children durable), the children run per second, the whole (spawn sent to the
//!   parent's next delivery), and the fan-in (the last child's ack answered to the
//!   parent's next delivery).

use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{Context, bail};
use muster_protocol::model::{NewTask, QueuePatch, TaskState};
use muster_protocol::ops::{Claim, NewChild, SpawnWait};
use muster_sdk::{Client, ConnectOptions, Suspension};

use super::{Run, next_delivery, one_at_a_time, payload, percentile};
use crate::cli::BenchArgs;

const QUEUE: &str = "suspend";

pub(super) async fn suspend(
    args: &BenchArgs,
    options: &ConnectOptions,
    run: &mut Run,
) -> anyhow::Result<()> {
    let approver = Client::connect(options.clone()).await?;
    approver.queue_create(QUEUE, QueuePatch::default()).await?;
    let (worker, mut pushes) = one_at_a_time(options, "bench/suspend", QUEUE).await?;
    let data = muster_sdk::raw_json(r#"{"approved":true}"#)?;
    let (mut suspends, mut resumes) = (Vec::new(), Vec::new());
    for _ in 0..args.roundtrips {
        approver.enqueue(QUEUE, NewTask::new(payload(0)?)).await?;
        let first = next_delivery(&mut pushes).await?;
        let asked = Instant::now();
        let reply = worker
            .suspend(&first.id, first.epoch, Suspension::new("bench"))
            .await?;
        suspends.push(asked.elapsed().as_secs_f64() * 1000.0);
        let token = reply.resume_token.context("a suspend's token")?;
        let resumed = Instant::now();
        approver.resume(&token, Some(data.clone())).await?;
        let again = next_delivery(&mut pushes).await?;
        resumes.push(resumed.elapsed().as_secs_f64() * 1000.0);
        if again.id != first.id || again.resumed.is_none() {
            bail!("task {} came back without its resume", first.id);
        }
        worker.ack(&again.id, again.epoch, None).await?;
    }
    suspends.sort_by(f64::total_cmp);
    resumes.sort_by(f64::total_cmp);
    run.suspend_p50_ms = Some(percentile(&suspends, 0.5));
    run.suspend_p99_ms = Some(percentile(&suspends, 0.99));
    run.resume_to_lease_p50_ms = Some(percentile(&resumes, 0.5));
    run.resume_to_lease_p99_ms = Some(percentile(&resumes, 0.99));
    Ok(())
}

const PARENTS: &str = "fanout-parents";
const CHILDREN: &str = "fanout-children";

pub(super) async fn fanout(
    args: &BenchArgs,
    options: &ConnectOptions,
    run: &mut Run,
) -> anyhow::Result<()> {
    let producer = Client::connect(options.clone()).await?;
    for q in [PARENTS, CHILDREN] {
        producer.queue_create(q, QueuePatch::default()).await?;
    }
    let (planner, mut pushes) = one_at_a_time(options, "bench/planner", PARENTS).await?;
    producer.enqueue(PARENTS, NewTask::new(payload(0)?)).await?;
    let parent = next_delivery(&mut pushes).await?;
    let children = (0..args.children)
        .map(|i| {
            Ok(NewChild::new(
                format!("c{i}"),
                CHILDREN,
                payload(u64::from(i))?,
            ))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    // The workers wait for children from the start, as a swarm would.
    let last_ack: Arc<Mutex<Option<Instant>>> = Arc::default();
    let mut workers = Vec::new();
    for _ in 0..args.workers {
        let client = Client::connect(options.clone()).await?;
        let last_ack = Arc::clone(&last_ack);
        workers.push(tokio::spawn(async move {
            let claim = Claim::new([CHILDREN]).max(32).wait_ms(200);
            let mut idle = 0;
            // Until the children stop coming (five empty claims in a row).
            while idle < 5 {
                let got = client.claim(&claim).await?;
                if got.is_empty() {
                    idle += 1;
                    continue;
                }
                idle = 0;
                for d in got {
                    client.ack(&d.id, d.epoch, None).await?;
                    *last_ack.lock().expect("lock") = Some(Instant::now());
                }
            }
            anyhow::Ok(())
        }));
    }
    let started = Instant::now();
    let wait = SpawnWait {
        reason: Some("bench".into()),
        ..SpawnWait::default()
    };
    let reply = planner
        .spawn(&parent.id, parent.epoch, children, Some(wait))
        .await?;
    let spawned = started.elapsed();
    if reply.state != TaskState::Suspended {
        bail!("the parent is {} after its spawn", reply.state);
    }
    let again = next_delivery(&mut pushes).await?;
    let woke = Instant::now();
    let outcomes = again.resumed.as_ref().map_or(0, |r| r.children.len());
    if again.id != parent.id || outcomes != args.children as usize {
        bail!(
            "task {} came back with {outcomes} children's outcomes, not {}",
            again.id,
            args.children
        );
    }
    planner.ack(&again.id, again.epoch, None).await?;
    for w in workers {
        w.await??;
    }
    let last = last_ack
        .lock()
        .expect("lock")
        .context("no child was acked")?;
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1000.0;
    run.fanout_spawn_ms = Some(ms(spawned));
    run.fanout_total_ms = Some(ms(woke - started));
    run.fanout_children_per_s =
        Some(f64::from(args.children) / (last - started).as_secs_f64().max(1e-9));
    run.fanin_ms = Some(ms(woke.saturating_duration_since(last)));
    Ok(())
}
