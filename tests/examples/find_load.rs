//! `task_find` at scale: what one search request costs on a queue of 1,000,000 tasks,
//! and what a search does to lease renewals served meanwhile.
//!
//! ```sh
//! cargo build --release -p muster-daemon -p muster-tui -p muster-tests --bins --examples
//! target/release/examples/find_load [TASKS]
//! ```
//! (default 1,000,000). One release `musterd` (fsync on) holds queue `big` with TASKS
//! ready tasks (payloads of about 100 bytes). A second client holds a lease on queue
//! `lease` and renews it back to back the whole time. Reported:
//!
//! 1. The search that reads the most per request (payload text that matches nothing):
//!    `MAX_FIND_READS` records and payloads per request, paged through the whole queue.
//! 2. The in-memory worst case (a key nobody has): `MAX_FIND_SCAN` index entries per
//!    request.
//! 3. Typical first pages: the newest 100 tasks, a field match among the newest, an
//!    id prefix.
//! 4. Renewal latency with no search running and while searches run back to back.

use std::time::{Duration, Instant};

use muster_sdk::protocol::limits::{MAX_FIND_READS, MAX_FIND_SCAN};
use muster_sdk::protocol::ops::{Claim, FieldMatch, TaskFind, TaskFindReply};
use muster_sdk::{Client, NewTask, QueuePatch};
use muster_tests::{Daemon, fill};

fn payload(i: usize) -> NewTask {
    let body = format!(
        r#"{{"order":{{"id":{i},"customer":"c-{}"}},"pad":"{}"}}"#,
        i % 977,
        "x".repeat(48)
    );
    NewTask::new(muster_sdk::raw_json(&body).expect("json"))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Median, p99 and max of durations, in ms.
fn spread(mut v: Vec<Duration>) -> String {
    v.sort();
    let at = |q: f64| ms(v[((v.len() as f64 - 1.0) * q).round() as usize]);
    format!(
        "n={} median {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        v.len(),
        at(0.5),
        at(0.99),
        at(1.0)
    )
}

async fn timed(client: &Client, search: &TaskFind) -> (Duration, TaskFindReply) {
    let started = Instant::now();
    let reply = client.task_find(search).await.expect("task_find");
    (started.elapsed(), reply)
}

/// Renews one lease back to back until told to stop; returns each renewal's latency.
async fn renew_loop(
    client: Client,
    id: String,
    epoch: u64,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Vec<Duration> {
    let mut took = Vec::new();
    while !*stop.borrow() {
        let started = Instant::now();
        client
            .renew(&id, epoch, Some(60_000), None)
            .await
            .expect("renew");
        took.push(started.elapsed());
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    took
}

async fn renewals_during<F: std::future::Future>(
    d: &Daemon,
    lease: &(String, u64),
    work: F,
) -> (F::Output, Vec<Duration>) {
    let (tx, rx) = tokio::sync::watch::channel(false);
    let renewer = tokio::spawn(renew_loop(d.client().await, lease.0.clone(), lease.1, rx));
    let out = work.await;
    tx.send(true).expect("stop");
    (out, renewer.await.expect("renewer"))
}

#[tokio::main]
async fn main() {
    let tasks: usize = std::env::args()
        .nth(1)
        .map_or(1_000_000, |a| a.parse().expect("TASKS"));
    let d = Daemon::start();
    let client = d.client().await;
    client
        .queue_create("big", QueuePatch::default())
        .await
        .expect("queue");
    client
        .queue_create("lease", QueuePatch::default())
        .await
        .expect("queue");
    let started = Instant::now();
    fill(&client, "big", tasks, payload).await;
    println!(
        "filled {tasks} tasks in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    client.enqueue("lease", payload(0)).await.expect("enqueue");
    let held = client
        .claim(&Claim::new(["lease"]).lease_ms(60_000))
        .await
        .expect("claim");
    let lease = (held[0].id.clone(), held[0].epoch);

    let ((), idle) = renewals_during(&d, &lease, tokio::time::sleep(Duration::from_secs(3))).await;
    println!("renewals, no search: {}", spread(idle));

    // 1. The most reading per request, through the whole queue.
    let mut search = TaskFind {
        queue: Some("big".into()),
        payload: Some("no such text".into()),
        ..TaskFind::default()
    };
    let whole = async {
        let mut per_request = Vec::new();
        let mut scanned = 0;
        let started = Instant::now();
        loop {
            let (took, reply) = timed(&client, &search).await;
            per_request.push(took);
            scanned += reply.scanned;
            assert!(reply.tasks.is_empty());
            match reply.next {
                Some(next) => search.after = Some(next),
                None => break,
            }
        }
        (per_request, scanned, started.elapsed())
    };
    let ((per_request, scanned, total), during) = renewals_during(&d, &lease, whole).await;
    println!(
        "payload text over {tasks} tasks ({MAX_FIND_READS} reads a request): {}; {scanned} examined in {:.1} s",
        spread(per_request),
        total.as_secs_f64()
    );
    println!("renewals during it: {}", spread(during));

    // 2. The in-memory worst case.
    let mut search = TaskFind {
        queue: Some("big".into()),
        key: Some("nobody".into()),
        ..TaskFind::default()
    };
    let scan = async {
        let mut per_request = Vec::new();
        for _ in 0..(tasks as u64).div_ceil(MAX_FIND_SCAN) {
            let (took, reply) = timed(&client, &search).await;
            per_request.push(took);
            match reply.next {
                Some(next) => search.after = Some(next),
                None => break,
            }
        }
        per_request
    };
    let (per_request, during) = renewals_during(&d, &lease, scan).await;
    println!(
        "key nobody has ({MAX_FIND_SCAN} entries a request): {}",
        spread(per_request)
    );
    println!("renewals during it: {}", spread(during));

    // 3. Typical first pages.
    let newest = TaskFind {
        queue: Some("big".into()),
        newest_first: true,
        ..TaskFind::default()
    };
    let (took, reply) = timed(&client, &newest).await;
    println!(
        "newest 100: {:.2} ms ({} tasks)",
        ms(took),
        reply.tasks.len()
    );
    let last = reply.tasks[0].id.clone();
    let field = TaskFind {
        queue: Some("big".into()),
        newest_first: true,
        field: Some(FieldMatch {
            path: "order.customer".into(),
            value: serde_json::json!("c-5"),
        }),
        limit: Some(10),
        ..TaskFind::default()
    };
    let (took, reply) = timed(&client, &field).await;
    println!(
        "field match, newest 10 of 1 in 977: {:.2} ms ({} found, {} examined)",
        ms(took),
        reply.tasks.len(),
        reply.scanned
    );
    let prefix = TaskFind {
        id_prefix: Some(last[..20].to_owned()),
        ..TaskFind::default()
    };
    let (took, reply) = timed(&client, &prefix).await;
    println!(
        "id prefix over every queue: {:.2} ms ({} found)",
        ms(took),
        reply.tasks.len()
    );
}
