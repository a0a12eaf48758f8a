//! Renewals during a bulk operation: the worst renewal latency while the daemon purges
//! 100,000 tasks (PURGED, by default).
//!
//! ```sh
//! cargo run --release -p muster-tests --example bulk_latency -- [PURGED]
//! ```
//! One release `musterd` (fsync on). Queue `bulk` is filled with PURGED ready tasks
//! (batches of 1,000, pipelined); an agent holds 20 leases of queue `held` and renews
//! one after the other, back to back, on its own connection, timing each. Then an
//! operator purges `bulk`; the renewals that overlapped the purge are reported (count,
//! median, p99, max) with the purge's duration and count. Bulk operations proceed in
//! slices of 250 tasks per dispatcher round, so no renewal waits for the whole purge.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use muster_sdk::protocol::ops::Claim;
use muster_sdk::{Client, NewTask, QueuePatch};
use muster_tests::Daemon;

/// Leases the agent renews in turn.
const HELD: u32 = 20;

/// Renewal latencies (with when each started), until `stop` is set.
async fn renew_loop(
    agent: Client,
    leases: Vec<(String, u64)>,
    stop: Arc<AtomicBool>,
) -> Vec<(Instant, Duration)> {
    let mut out = Vec::new();
    let mut turn = 0;
    while !stop.load(Ordering::Relaxed) {
        let (id, epoch) = &leases[turn % leases.len()];
        let start = Instant::now();
        agent
            .renew(id, *epoch, Some(600_000), None)
            .await
            .expect("renew");
        out.push((start, start.elapsed()));
        turn += 1;
    }
    out
}

fn report(what: &str, took: Duration, count: u64, during: &mut [Duration]) {
    during.sort();
    let at = |q: f64| during[((during.len() - 1) as f64 * q) as usize];
    println!(
        "{what}: {count} tasks in {took:.2?}; {} renewals meanwhile: median {:.2?}, p99 {:.2?}, max {:.2?}",
        during.len(),
        at(0.5),
        at(0.99),
        during[during.len() - 1]
    );
}

async fn fill(client: &Client, queue: &str, total: usize) {
    let mut pending = Vec::new();
    for start in (0..total).step_by(1000) {
        let tasks: Vec<NewTask> = (start..(start + 1000).min(total))
            .map(|n| NewTask::new(muster_sdk::json(&n).expect("json")))
            .collect();
        pending.push(
            client
                .send(&muster_sdk::protocol::ops::Enqueue {
                    queue: queue.into(),
                    tasks,
                })
                .await
                .expect("enqueue"),
        );
        if pending.len() >= 16 {
            pending.remove(0).reply().await.expect("enqueued");
        }
    }
    for p in pending {
        p.reply().await.expect("enqueued");
    }
}

/// Runs `op` while renewing; reports the renewals that overlapped it.
async fn measure<F, Fut>(d: &Daemon, leases: &[(String, u64)], what: &str, op: F)
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = u64>,
{
    let stop = Arc::new(AtomicBool::new(false));
    let renewer = tokio::spawn(renew_loop(
        d.client().await,
        leases.to_vec(),
        Arc::clone(&stop),
    ));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = Instant::now();
    let count = op().await;
    let took = started.elapsed();
    let ended = Instant::now();
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::Relaxed);
    let all = renewer.await.expect("renewer");
    let mut during: Vec<Duration> = all
        .iter()
        .filter(|(at, lat)| *at + *lat >= started && *at <= ended)
        .map(|(_, lat)| *lat)
        .collect();
    report(what, took, count, &mut during);
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let total: usize = std::env::args()
        .nth(1)
        .map_or(100_000, |a| a.parse().expect("PURGED: a number"));
    let d = Daemon::start();
    let admin = d.client().await;
    for q in ["bulk", "held"] {
        admin
            .queue_create(q, QueuePatch::default())
            .await
            .expect("queue");
    }
    fill(&admin, "held", HELD as usize).await;
    let agent = d.client().await;
    let leases: Vec<(String, u64)> = agent
        .claim(&Claim::new(["held"]).max(HELD))
        .await
        .expect("claim")
        .into_iter()
        .map(|t| (t.id, t.epoch))
        .collect();
    assert_eq!(leases.len(), HELD as usize);

    fill(&admin, "bulk", total).await;
    measure(&d, &leases, "purge", || async {
        admin.queue_purge("bulk").await.expect("purge")
    })
    .await;
}
