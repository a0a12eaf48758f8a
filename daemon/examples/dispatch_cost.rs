//! What choosing the next task costs, with a small and a huge backlog.
//!
//! ```sh
//! cargo run --release -p muster-daemon --example dispatch_cost -- 1000 1000000
//! ```
//! For each backlog size it fills a fresh engine (on a temporary fjall store) with that
//! many ready tasks of mixed priorities (0–9), keys (one task in ten keyed, 1,000 keys)
//! and required labels (a quarter need `gpu`, a tenth `gpu`+`big`), then times 2,000
//! claims by a member labelled `gpu` straight on the engine (no network, no fsync: the
//! cost of the dispatch decision and its bookkeeping), acking each task and enqueueing
//! a new one so the backlog keeps its size. It prints the median and p99 of one claim,
//! and the ratio of the medians.

use std::time::Instant;

use muster_daemon::engine::{Engine, Now, Reply, Sink, Waiter};
use muster_daemon::store::Store;
use muster_protocol::model::{NewTask, QueuePatch};
use muster_protocol::ops::EngineRequest;
use muster_protocol::ops::{self, Ack, Claim, Enqueue, QueueCreate};

// The same allocator as musterd.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Clone)]
struct Nobody;

impl Sink for Nobody {
    fn is_closed(&self) -> bool {
        false
    }
}

impl Waiter for Nobody {
    type Sink = Nobody;
    fn is_closed(&self) -> bool {
        false
    }
    fn connection(&self) -> u64 {
        0
    }
    fn sink(&self) -> Nobody {
        Nobody
    }
    fn principal(&self) -> Option<&muster_daemon::auth::Principal> {
        None
    }
}

/// Claims timed per backlog size (`MUSTER_CLAIMS` overrides, e.g. to profile).
fn claims() -> usize {
    std::env::var("MUSTER_CLAIMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000)
}

fn call(engine: &mut Engine<Nobody>, req: EngineRequest, now: Now) -> Reply {
    engine.handle(req, Nobody, now).expect("store");
    engine.tick(now).expect("store");
    engine.take_dirty();
    match engine.take_outbox().next_back() {
        Some((_, Ok(reply))) => reply,
        other => panic!("{:?}", other.map(|(_, r)| r.err())),
    }
}

/// The i-th task: priority 0–9, one in ten keyed over 1,000 keys, a quarter needing
/// `gpu`, a tenth `gpu` and `big`; a 256-byte payload.
fn task(i: usize) -> NewTask {
    let payload = format!("\"{}\"", "x".repeat(254));
    let mut t = NewTask::new(ops::raw(&payload).expect("json"));
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

fn measure(backlog: usize) -> (f64, f64) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut now = Now {
        wall_ms: 1_800_000_000_000,
        mono_ms: 1,
    };
    let mut engine: Engine<Nobody> = Engine::open(
        Store::open(dir.path(), muster_daemon::config::DEFAULT_CACHE_MIB << 20).expect("store"),
        now,
        1,
    )
    .expect("engine");
    call(
        &mut engine,
        EngineRequest::QueueCreate(QueueCreate {
            queue: "q".into(),
            options: QueuePatch::default(),
        }),
        now,
    );
    let mut n = 0usize;
    while n < backlog {
        let batch = (backlog - n).min(1000);
        let tasks = (n..n + batch).map(task).collect();
        call(
            &mut engine,
            EngineRequest::Enqueue(Enqueue {
                queue: "q".into(),
                tasks,
            }),
            now,
        );
        engine
            .store()
            .persist(muster_daemon::store::Persist::Os)
            .expect("persist");
        n += batch;
    }
    let count = claims();
    let mut times = Vec::with_capacity(count);
    for _ in 0..count {
        now.mono_ms += 1;
        now.wall_ms += 1;
        let claim = Claim::new(["q"]).member("bench").labels(["gpu"]);
        let started = Instant::now();
        let reply = call(&mut engine, EngineRequest::Claim(claim), now);
        times.push(started.elapsed().as_secs_f64() * 1e6);
        let Reply::Claim(c) = reply else {
            panic!("not a claim reply")
        };
        let d = &c.tasks[0];
        call(
            &mut engine,
            EngineRequest::Ack(Ack {
                task: d.id.clone(),
                epoch: d.epoch,
                result: None,
            }),
            now,
        );
        // Keep the backlog at its size.
        call(
            &mut engine,
            EngineRequest::Enqueue(Enqueue {
                queue: "q".into(),
                tasks: vec![task(n)],
            }),
            now,
        );
        n += 1;
    }
    times.sort_by(f64::total_cmp);
    (times[count / 2], times[count * 99 / 100])
}

fn main() {
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
        let (p50, p99) = measure(size);
        println!(
            "backlog {size:>9}: claim p50 {p50:8.1} µs  p99 {p99:8.1} µs  (run {:.1} s)",
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
