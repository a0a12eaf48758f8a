//! The cluster figures of BENCHMARKS.md: `cluster_bench [FAILOVERS]`.
//!
//! Build it in release (`cargo build --release -p muster-tests --bin cluster_bench`)
//! so that it starts release daemons. It starts a three-node cluster on loopback and:
//!
//! 1. **Failover**, `FAILOVERS` times (20 if absent): kill -9 the leader, then measure
//!    the time to the first acknowledged enqueue through all three addresses, and to
//!    the first renewal of a lease taken before the kill; restart the killed node and
//!    wait until it has caught up before the next kill.
//! 2. **Latency and throughput** against the cluster and, in the same run, a single
//!    daemon: [`LATENCY_ENQUEUES`] enqueues one after another (p50, p99, max), and
//!    [`PRODUCERS`] producers enqueuing batches of [`BATCH`] for [`THROUGHPUT_FOR`].
//!
//! Every loop is bounded ([`GIVE_UP`]); it prints one line per failover and a summary.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use muster_protocol::model::{NewTask, QueuePatch};
use muster_protocol::ops::Claim;
use muster_sdk::{Client, ConnectOptions};
use muster_tests::Daemon;
use muster_tests::cluster::Cluster;

/// Enqueues timed one at a time.
const LATENCY_ENQUEUES: usize = 2_000;
/// Concurrent producers in the throughput phase.
const PRODUCERS: usize = 8;
/// Tasks per enqueue in the throughput phase.
const BATCH: usize = 100;
/// How long the throughput phase runs.
const THROUGHPUT_FOR: Duration = Duration::from_secs(10);
/// A failover not over by then fails the run.
const GIVE_UP: Duration = Duration::from_secs(30);
/// Pause between attempts while the cluster has no leader.
const RETRY_PAUSE: Duration = Duration::from_millis(10);

fn task(n: u64) -> NewTask {
    NewTask::new(serde_json::value::RawValue::from_string(format!("{{\"n\":{n}}}")).expect("JSON"))
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

/// Connects through `options` once a leader answers (bounded by [`GIVE_UP`]).
async fn connect(options: &ConnectOptions, since: Instant) -> Client {
    loop {
        if let Ok(client) = Client::connect(options.clone()).await {
            return client;
        }
        assert!(since.elapsed() < GIVE_UP, "no leader within {GIVE_UP:?}");
        tokio::time::sleep(RETRY_PAUSE).await;
    }
}

/// Retries `op` on fresh connections until it succeeds; the time since `since`.
async fn first_success<F, Fut, T>(options: &ConnectOptions, since: Instant, op: F) -> Duration
where
    F: Fn(Client) -> Fut,
    Fut: std::future::Future<Output = Result<T, muster_sdk::Error>>,
{
    loop {
        let client = connect(options, since).await;
        if op(client).await.is_ok() {
            return since.elapsed();
        }
        assert!(since.elapsed() < GIVE_UP, "no success within {GIVE_UP:?}");
        tokio::time::sleep(RETRY_PAUSE).await;
    }
}

async fn failovers(cluster: &mut Cluster, count: usize) -> (Vec<Duration>, Vec<Duration>) {
    let options = cluster.options();
    let client = connect(&options, Instant::now()).await;
    client
        .queue_create("failover", QueuePatch::default())
        .await
        .expect("queue_create");
    let (mut enqueued, mut renewed) = (Vec::new(), Vec::new());
    for round in 0..count {
        let client = connect(&options, Instant::now()).await;
        client
            .enqueue("failover", task(round as u64))
            .await
            .expect("enqueue before the kill");
        let mut claim = Claim::new(["failover"]);
        claim.max = Some(1);
        claim.lease_ms = Some(60_000);
        let held = client.claim(&claim).await.expect("claim");
        let held = held.first().expect("a task to hold").clone();
        drop(client);
        let leader = cluster.leader().await;
        let killed = Instant::now();
        cluster.kill9(leader.node);
        let (id, epoch) = (held.id.clone(), held.epoch);
        let (enqueue, renew) = tokio::join!(
            first_success(&options, killed, |c| async move {
                c.enqueue("failover", task(u64::MAX)).await
            }),
            first_success(&options, killed, |c| {
                let id = id.clone();
                async move { c.renew(&id, epoch, None, None).await }
            }),
        );
        println!(
            "failover {:2}: node {} killed; first enqueue after {}, lease renewed after {}",
            round + 1,
            leader.node,
            ms(enqueue),
            ms(renew)
        );
        enqueued.push(enqueue);
        renewed.push(renew);
        let client = connect(&options, Instant::now()).await;
        client
            .ack(&held.id, epoch, None)
            .await
            .expect("ack the held task");
        cluster.restart(leader.node).await;
        cluster.wait_caught_up(leader.node).await;
    }
    (enqueued, renewed)
}

/// p50, p99 and max of [`LATENCY_ENQUEUES`] enqueues one after another.
async fn latency(client: &Client) -> (Duration, Duration, Duration) {
    client
        .queue_create("latency", QueuePatch::default())
        .await
        .expect("queue_create");
    let mut took = Vec::with_capacity(LATENCY_ENQUEUES);
    for n in 0..LATENCY_ENQUEUES {
        let started = Instant::now();
        client
            .enqueue("latency", task(n as u64))
            .await
            .expect("enqueue");
        took.push(started.elapsed());
    }
    took.sort_unstable();
    (
        percentile(&took, 0.5),
        percentile(&took, 0.99),
        *took.last().expect("some enqueues"),
    )
}

/// Tasks per second enqueued by [`PRODUCERS`] producers in batches of [`BATCH`].
async fn throughput(options: &ConnectOptions) -> f64 {
    let client = Client::connect(options.clone()).await.expect("connect");
    client
        .queue_create("throughput", QueuePatch::default())
        .await
        .expect("queue_create");
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut producers = tokio::task::JoinSet::new();
    for _ in 0..PRODUCERS {
        let (options, done) = (options.clone(), Arc::clone(&done));
        producers.spawn(async move {
            let client = Client::connect(options).await.expect("connect");
            while started.elapsed() < THROUGHPUT_FOR {
                let tasks = (0..BATCH as u64).map(task).collect();
                client
                    .enqueue_batch("throughput", tasks)
                    .await
                    .expect("enqueue_batch");
                done.fetch_add(BATCH as u64, Ordering::Relaxed);
            }
        });
    }
    while let Some(joined) = producers.join_next().await {
        joined.expect("a producer");
    }
    done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

fn summary(name: &str, times: &mut [Duration]) {
    times.sort_unstable();
    println!(
        "{name}: median {}, max {} over {}",
        ms(percentile(times, 0.5)),
        ms(*times.last().expect("some failovers")),
        times.len()
    );
}

#[tokio::main]
async fn main() {
    let count = std::env::args()
        .nth(1)
        .map_or(20, |n| n.parse().expect("FAILOVERS is a number"));
    let mut cluster = Cluster::start(3).await;
    let (mut enqueued, mut renewed) = failovers(&mut cluster, count).await;
    summary("first enqueue after a leader's kill -9", &mut enqueued);
    summary("first renewal after a leader's kill -9", &mut renewed);

    let client = Client::connect(cluster.options()).await.expect("connect");
    let (p50, p99, max) = latency(&client).await;
    let cluster_rate = throughput(&cluster.options()).await;
    drop(cluster);

    let single = Daemon::start();
    let client = single.client().await;
    let (s50, s99, smax) = latency(&client).await;
    let single_rate = throughput(&single.options()).await;
    println!(
        "enqueue latency, one at a time: cluster p50 {} p99 {} max {}; single daemon p50 {} p99 {} max {}",
        ms(p50),
        ms(p99),
        ms(max),
        ms(s50),
        ms(s99),
        ms(smax)
    );
    println!(
        "enqueue throughput, {PRODUCERS} producers, batches of {BATCH}: cluster {cluster_rate:.0} tasks/s, single daemon {single_rate:.0} tasks/s ({:.2}x)",
        cluster_rate / single_rate
    );
}
