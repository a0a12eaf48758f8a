//! Claim latency as a client sees it, with a small and a huge backlog.
//!
//! ```sh
//! cargo run --release -p muster-tests --example claim_latency -- 1000 1000000
//! ```
//! For each backlog size it starts a fresh `musterd` (fsync on), fills a queue with
//! that many ready tasks of mixed priorities, keys and required labels (as the
//! `dispatch_cost` example of the daemon), then times 2,000 sequential claims by a
//! member labelled `gpu` over QUIC, acking each task and enqueueing a new one so the
//! backlog keeps its size. It prints the median and p99 of one claim round trip.

use std::time::Instant;

use muster_sdk::protocol::ops::Claim;
use muster_sdk::{NewTask, QueuePatch};
use muster_tests::Daemon;

const CLAIMS: usize = 2000;

fn task(i: usize) -> NewTask {
    let payload = format!("\"{}\"", "x".repeat(254));
    let mut t = NewTask::new(muster_sdk::raw_json(&payload).expect("json"));
    t.priority = Some((i % 10) as u8);
    if i.is_multiple_of(10) {
        t.key = Some(format!("k{}", (i / 10) % 1000));
    }
    t.requires = match i % 20 {
        0..=1 => vec!["gpu".into(), "big".into()],
        2..=6 => vec!["gpu".into()],
        _ => Vec::new(),
    };
    t
}

async fn measure(backlog: usize) -> (f64, f64) {
    let d = Daemon::start();
    let client = d.client().await;
    client
        .queue_create("q", QueuePatch::default())
        .await
        .expect("queue");
    muster_tests::fill(&client, "q", backlog, task).await;
    let mut times = Vec::with_capacity(CLAIMS);
    // Each claimed task is replaced by a new one, so the backlog keeps its size.
    for n in backlog..backlog + CLAIMS {
        let claim = Claim::new(["q"]).member("bench").labels(["gpu"]);
        let started = Instant::now();
        let got = client.claim(&claim).await.expect("claim");
        times.push(started.elapsed().as_secs_f64() * 1e6);
        client
            .ack(&got[0].id, got[0].epoch, None)
            .await
            .expect("ack");
        client.enqueue("q", task(n)).await.expect("enqueue");
    }
    times.sort_by(f64::total_cmp);
    (times[CLAIMS / 2], times[CLAIMS * 99 / 100])
}

#[tokio::main]
async fn main() {
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("a backlog size"))
        .collect();
    let sizes = if sizes.is_empty() {
        vec![1000, 1_000_000]
    } else {
        sizes
    };
    let mut medians = Vec::new();
    for size in sizes {
        let started = Instant::now();
        let (p50, p99) = measure(size).await;
        println!(
            "backlog {size:>9}: claim round trip p50 {p50:8.1} µs  p99 {p99:8.1} µs  (run {:.1} s)",
            started.elapsed().as_secs_f64()
        );
        medians.push(p50);
    }
    if let (Some(first), Some(last)) = (medians.first(), medians.last()) {
        println!(
            "ratio of medians, largest / smallest backlog: {:.2}",
            last / first
        );
    }
}
