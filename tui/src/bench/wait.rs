//! The waiting phase of `muster bench`.
//!
//! - `suspend`: one worker (a member session of capacity 1) and one approver, strictly
//!   sequential, `roundtrips` times: the worker gets a pushed task and suspends it; the
//!   approver resumes it with the token; the worker gets it pushed again (with the
//!   resume's data) and acks it. The suspend's latency (its reply, the token in hand)
//!   and the resume's (from sending it to the task's next delivery at the worker): each
//!   is one or more durable rounds of the daemon.

use std::time::Instant;

use anyhow::{Context, bail};
use muster_protocol::model::{NewTask, QueuePatch};
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
