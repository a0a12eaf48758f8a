//! A Jepsen-style total-queue checker: producers and agents run against a real
//! `musterd` while a nemesis kill -9s it (and, for power loss, tears its journal) and
//! restarts it; then agents drain the queue and [`Report`] says what was lost,
//! invented, held twice or settled twice.
//!
//! Every client logs what it attempted, what was acknowledged and what it received.
//! Randomness (what producers and agents do, how long the nemesis waits, how it tears
//! the journal) comes from one seed, printed as `seed=N` and replayed with
//! `MUSTER_CHECKER_SEED`; the interleaving with the daemon is still up to the OS.
//!
//! It does not check dispatch order, priorities or keys: only the queue's promises
//! (nothing acknowledged is lost, nothing is handed to two holders at once, every task
//! ends done). Some holdings end in a suspend, which the agent then resumes with its
//! token (across restarts and failovers: a suspend asked again gets a new token, a
//! resume whose reply was lost may find its token spent): a suspended task whose token
//! was lost would never be done, and the drain would find it lost. Some spawn two
//! children and wait for them (across the same faults: a spawn asked again spawns
//! nothing twice); each child is logged as an attempt of its own, acknowledged with the
//! spawn's reply, so a child lost, spawned twice or never run, or a parent never woken,
//! shows as lost, duplicated or not done.
//!
//! [`run`] is the single daemon under kill -9 and power loss; [`run_against`] runs the
//! same clients and scoring against any daemon or cluster with any nemesis (see
//! `crate::cluster::check`). Against a cluster, every acknowledged write is recorded
//! with the node and term that served its connection, and [`Report::split_brain`]
//! counts the terms in which two nodes acknowledged writes.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use muster_sdk::protocol::ops::Claim;
use muster_sdk::{Client, ConnectOptions, Error, ErrorCode, NewTask, QueuePatch, TaskState};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::Daemon;
use crate::cluster::{Served, connect_leader};

/// The queue the checker uses.
const QUEUE: &str = "checker";

/// The producer number of children: a spawned task's payload names `CHILD_BASE` plus its
/// parent's producer, and twice its parent's number (plus 0 or 1).
const CHILD_BASE: u64 = 1 << 20;

/// The queue's lease (and every claim's). Long enough that agents, which settle within
/// a few hundred milliseconds, only lose a lease when they abandon a task on purpose.
pub const LEASE_MS: u64 = 6_000;

/// Longest any one call may take before the client gives up on its connection.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest one connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Longest creating the queue may take (on a cluster, a leader must be found first).
const SETUP_TIMEOUT: Duration = Duration::from_secs(30);

/// Pause between connection attempts while the daemon is down.
const RECONNECT_PAUSE: Duration = Duration::from_millis(100);

/// Longest an agent keeps retrying one settle across restarts.
const SETTLE_DEADLINE: Duration = Duration::from_secs(30);

/// Longest the drain may take after the nemesis stops: abandoned leases must lapse
/// (one lease period, longer if a restart renewed them) and the backlog be worked off.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(90);

/// Tolerance between the daemon's wall-clock lease deadlines and ours: the daemon
/// derives them from its monotonic clock, the same host's wall clock may drift a few ms.
const CLOCK_SLACK_MS: u64 = 50;

/// What the nemesis does to the daemon at each fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nemesis {
    /// kill -9, then restart.
    Kill9,
    /// kill -9, tear the tail of the newest journal file as a power loss would (see
    /// [`tear_journal`]), then restart.
    PowerLoss,
}

/// One run's settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// Seed of every random choice.
    pub seed: u64,
    /// Faults to inject (when `run_for` is not set).
    pub faults: usize,
    /// Run faults for this long instead of counting them (the long run).
    pub run_for: Option<Duration>,
    /// What a fault is.
    pub nemesis: Nemesis,
    /// Concurrent producers.
    pub producers: usize,
    /// Concurrent agents.
    pub agents: usize,
}

impl Config {
    /// The CI run (10 faults), or a long one when `MUSTER_CHECKER_SECONDS` is set; the
    /// seed from `MUSTER_CHECKER_SEED`, else a random one.
    pub fn from_env(nemesis: Nemesis) -> Config {
        Config {
            seed: seed_from_env(),
            faults: 10,
            run_for: run_for_from_env(),
            nemesis,
            producers: 3,
            agents: 3,
        }
    }

    /// The clients of the run.
    pub fn workload(&self) -> Workload {
        Workload {
            seed: self.seed,
            producers: self.producers,
            agents: self.agents,
        }
    }
}

/// The seed from `MUSTER_CHECKER_SEED`, else a random one.
pub fn seed_from_env() -> u64 {
    match std::env::var("MUSTER_CHECKER_SEED") {
        Ok(s) => s.parse().expect("MUSTER_CHECKER_SEED is a u64"),
        Err(_) => rand::random(),
    }
}

/// How long a long run lasts, from `MUSTER_CHECKER_SECONDS`; `None` for a run that
/// counts its faults.
pub fn run_for_from_env() -> Option<Duration> {
    std::env::var("MUSTER_CHECKER_SECONDS")
        .ok()
        .map(|s| Duration::from_secs(s.parse().expect("MUSTER_CHECKER_SECONDS is a number")))
}

/// The clients [`run_against`] runs, and the seed of all their choices and the nemesis's.
#[derive(Debug, Clone, Copy)]
pub struct Workload {
    /// Seed of every random choice.
    pub seed: u64,
    /// Concurrent producers.
    pub producers: usize,
    /// Concurrent agents.
    pub agents: usize,
}

/// What the clients of [`run_against`] connect to.
#[derive(Debug, Clone)]
pub struct Target {
    /// A daemon's options, or a cluster's (its client addresses, comma-separated).
    pub options: ConnectOptions,
    /// True for a cluster: each connection goes to the leader and is attributed to the
    /// node and term that serve it, and the report counts split brains.
    pub clustered: bool,
}

/// What the checker found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    /// The seed of the run.
    pub seed: u64,
    /// Faults injected (kill -9 and restart, with a torn journal for power loss).
    pub faults: usize,
    /// Enqueues attempted.
    pub attempted: usize,
    /// Enqueues acknowledged by the daemon (children's spawns included).
    pub acknowledged: usize,
    /// Of those, children acknowledged by a spawn.
    pub children: usize,
    /// Enqueues whose reply never came (the connection was lost or timed out).
    pub indeterminate: usize,
    /// Distinct tasks agents received.
    pub delivered: usize,
    /// Deliveries in all (a task can be delivered again after a lapse, nack or release).
    pub deliveries: usize,
    /// Settles (ack, nack, release) acknowledged.
    pub settles_acknowledged: usize,
    /// Acknowledged enqueues whose task is not done after the drain.
    pub lost: usize,
    /// Tasks delivered or done that no producer attempted.
    pub unexpected: usize,
    /// Deliveries granted while an earlier delivery of the same task still held a valid
    /// lease that had not been settled.
    pub concurrent_holders: usize,
    /// Unacknowledged enqueues whose task exists after all (they landed, the reply was lost).
    pub recovered: usize,
    /// Tasks acknowledged as done more than once.
    pub done_more_than_once: usize,
    /// Deliveries of a task after one of its acks was acknowledged.
    pub delivered_after_ack: usize,
    /// Attempts that produced more than one task.
    pub duplicated: usize,
    /// Tasks not done after the drain (scheduled, ready, leased, dead or cancelled).
    pub remaining: u64,
    /// Tasks done after the drain.
    pub done: u64,
    /// True if the run was against a cluster (the two counts below apply).
    pub clustered: bool,
    /// Terms in which acknowledged writes (enqueues, claims, settles) came from two or
    /// more different nodes.
    pub split_brain: usize,
    /// Acknowledged writes not attributed to a node and term (a cluster run must have
    /// none: the split-brain check would not see them).
    pub unattributed: usize,
    /// Every acknowledged enqueue of a cluster run, in the order the replies came: when,
    /// and who served it. What failover times are measured from.
    pub acks: Vec<AckMark>,
}

/// One acknowledged enqueue of a cluster run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckMark {
    /// When the reply arrived (wall ms).
    pub at_ms: u64,
    /// The node and term that served it.
    pub by: Served,
}

impl Report {
    /// True if the run kept every promise.
    pub fn is_clean(&self) -> bool {
        self.lost == 0
            && self.unexpected == 0
            && self.concurrent_holders == 0
            && self.done_more_than_once == 0
            && self.delivered_after_ack == 0
            && self.duplicated == 0
            && self.remaining == 0
            && self.split_brain == 0
            && (!self.clustered || self.unattributed == 0)
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "seed={} faults={} attempted={} acknowledged={} children={} indeterminate={} delivered={} \
             deliveries={} settles_acknowledged={} lost={} unexpected={} concurrent_holders={} \
             recovered={} done_more_than_once={} delivered_after_ack={} duplicated={} \
             remaining={} done={}",
            self.seed,
            self.faults,
            self.attempted,
            self.acknowledged,
            self.children,
            self.indeterminate,
            self.delivered,
            self.deliveries,
            self.settles_acknowledged,
            self.lost,
            self.unexpected,
            self.concurrent_holders,
            self.recovered,
            self.done_more_than_once,
            self.delivered_after_ack,
            self.duplicated,
            self.remaining,
            self.done
        )?;
        if self.clustered {
            write!(
                f,
                " split_brain={} unattributed={}",
                self.split_brain, self.unattributed
            )?;
        }
        Ok(())
    }
}

/// An enqueue as a producer saw it: `(producer, n)` is its identity and its payload.
#[derive(Debug, Default)]
struct Attempt {
    /// The task id, if the enqueue was acknowledged.
    acked_id: Option<String>,
    /// True once the call ended without an answer.
    indeterminate: bool,
    /// Who acknowledged it (cluster runs).
    acked_by: Option<Served>,
    /// When the acknowledgement arrived (wall ms).
    acked_ms: u64,
}

/// How an agent ended its holding of one delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Settle {
    Ack,
    Nack,
    Release,
    /// Suspended (the lease ends there), then resumed by the same agent.
    Suspend,
    /// Two children spawned, and the task waits for them (the lease ends there).
    Spawn,
    /// Dropped on purpose: the lease must lapse before anyone else gets the task.
    Abandon,
}

/// One delivery as an agent saw it.
#[derive(Debug, Clone)]
struct Holding {
    task: String,
    epoch: u64,
    /// `(producer, n)` from the payload, or `None` if the payload is not one of ours.
    key: Option<(u64, u64)>,
    /// When the daemon granted it (its deadline minus the lease), daemon wall ms.
    granted_ms: u64,
    /// The latest deadline the daemon told the holder (grant or renewal).
    deadline_ms: u64,
    /// What the agent did with it.
    settle: Settle,
    /// When the agent first sent its settle (wall ms); the holding ends no later.
    settle_sent_ms: Option<u64>,
    /// Whether the daemon acknowledged the settle (false: lease_lost or never answered).
    settle_acknowledged: bool,
    /// Who granted it (cluster runs).
    granted_by: Option<Served>,
    /// Who acknowledged the settle (cluster runs).
    settled_by: Option<Served>,
}

/// Everything the clients logged.
#[derive(Default)]
struct History {
    attempts: BTreeMap<(u64, u64), Attempt>,
    holdings: Vec<Holding>,
}

type Shared = Arc<Mutex<History>>;

/// Now, in ms since the Unix epoch.
pub fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as u64
}

/// Wire names of the errors a cluster answers when a request's outcome is unknown to
/// the client: a follower's `not_leader` (the request went nowhere, but the client
/// cannot tell it from a leader that lost the lead mid-request) and a leader's
/// `outcome_unknown` (its round was not agreed, yet may still be committed by the next
/// leader). Named by string so this compiles before the protocol branch adds the codes.
const INDETERMINATE_CODES: [&str; 2] = ["not_leader", "outcome_unknown"];

/// True if the error means the connection is gone, or the cluster cannot say whether
/// the request took effect (retry on a new connection), false if the daemon answered.
fn connection_lost(e: &Error) -> bool {
    e.code()
        .is_none_or(|code| INDETERMINATE_CODES.contains(&code.as_str()))
}

/// A connection that is made again, with a bounded wait, whenever it is lost.
struct Conn {
    target: Target,
    client: Option<Client>,
    /// Who serves `client` (cluster runs).
    served: Option<Served>,
}

impl Conn {
    fn new(target: Target) -> Conn {
        Conn {
            target,
            client: None,
            served: None,
        }
    }

    /// The client, connecting if needed (to the leader, on a cluster); `None` (after a
    /// short pause) if the daemon is not reachable right now.
    async fn get(&mut self) -> Option<Client> {
        if self.client.is_none() {
            let connected = if self.target.clustered {
                // Bounded by its own probe and connect timeouts.
                connect_leader(&self.target.options)
                    .await
                    .map(|(c, served)| (c, Some(served)))
            } else {
                tokio::time::timeout(
                    CONNECT_TIMEOUT,
                    Client::connect(self.target.options.clone()),
                )
                .await
                .ok()
                .and_then(Result::ok)
                .map(|c| (c, None))
            };
            match connected {
                Some((c, served)) => {
                    self.client = Some(c);
                    self.served = served;
                }
                None => {
                    tokio::time::sleep(RECONNECT_PAUSE).await;
                    return None;
                }
            }
        }
        self.client.clone()
    }

    /// Who serves the current connection.
    fn served(&self) -> Option<Served> {
        self.served
    }

    fn reset(&mut self) {
        self.client = None;
        self.served = None;
    }

    /// Runs `call` on a connection until the daemon answers it, reconnecting as often as
    /// needed within `within`; panics with `what` on a refusal or when time runs out.
    async fn answered<T, F, Fut>(&mut self, within: Duration, what: &str, mut call: F) -> T
    where
        F: FnMut(Client) -> Fut,
        Fut: std::future::Future<Output = Result<T, Error>>,
    {
        let deadline = Instant::now() + within;
        loop {
            assert!(
                Instant::now() < deadline,
                "{what}: no answer within {within:?}"
            );
            let Some(client) = self.get().await else {
                continue;
            };
            match bounded(self, call(client)).await {
                Some(Ok(answer)) => return answer,
                Some(Err(e)) => panic!("{what}: {e}"),
                None => continue,
            }
        }
    }
}

/// Runs one call with [`CALL_TIMEOUT`]; a timeout or a lost connection is `None` and
/// resets the connection, the daemon's answer is `Some`.
async fn bounded<T>(
    conn: &mut Conn,
    call: impl std::future::Future<Output = Result<T, Error>>,
) -> Option<Result<T, Error>> {
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(Err(e)) if connection_lost(&e) => {
            conn.reset();
            None
        }
        Ok(r) => Some(r),
        Err(_) => {
            conn.reset();
            None
        }
    }
}

async fn produce(id: u64, mut rng: StdRng, target: Target, stop: Arc<AtomicBool>, log: Shared) {
    let mut conn = Conn::new(target);
    let mut n = 0;
    while !stop.load(Ordering::SeqCst) {
        let Some(client) = conn.get().await else {
            continue;
        };
        n += 1;
        let key = (id, n);
        lock(&log).attempts.insert(key, Attempt::default());
        let payload =
            muster_sdk::json(&serde_json::json!({"p": id, "n": n})).expect("payload is JSON");
        let outcome = bounded(&mut conn, client.enqueue(QUEUE, NewTask::new(payload))).await;
        {
            let mut log = lock(&log);
            let attempt = log.attempts.get_mut(&key).expect("attempt logged");
            match outcome {
                Some(Ok(task)) => {
                    attempt.acked_id = Some(task.id);
                    attempt.acked_by = conn.served();
                    attempt.acked_ms = wall_ms();
                }
                Some(Err(e)) => panic!("the daemon refused enqueue {key:?}: {e}"),
                None => attempt.indeterminate = true,
            }
        }
        // Producers are paced so agents keep up and the drain stays short.
        tokio::time::sleep(Duration::from_millis(rng.random_range(10..40))).await;
    }
}

fn key_of(payload: &str) -> Option<(u64, u64)> {
    let v: serde_json::Value = serde_json::from_str(payload).ok()?;
    Some((v["p"].as_u64()?, v["n"].as_u64()?))
}

async fn work(mut rng: StdRng, target: Target, stop: Arc<AtomicBool>, log: Shared) {
    let mut conn = Conn::new(target);
    let claim = Claim::new([QUEUE]).max(3).wait_ms(300).lease_ms(LEASE_MS);
    while !stop.load(Ordering::SeqCst) {
        let Some(client) = conn.get().await else {
            continue;
        };
        let Some(got) = bounded(&mut conn, client.claim(&claim)).await else {
            continue;
        };
        let deliveries = got.expect("claim refused");
        let granted_by = conn.served();
        for d in deliveries {
            let mut h = Holding {
                task: d.id.clone(),
                epoch: d.epoch,
                key: key_of(d.payload.get()),
                granted_ms: d.lease_expires_ms - LEASE_MS,
                deadline_ms: d.lease_expires_ms,
                settle: match rng.random_range(0..100) {
                    0..85 => Settle::Ack,
                    85..90 => Settle::Nack,
                    90..92 => Settle::Suspend,
                    // Children of children would nest without end: only producers'
                    // tasks spawn.
                    92..94 if key_of(d.payload.get()).is_some_and(|(p, _)| p < CHILD_BASE) => {
                        Settle::Spawn
                    }
                    92..94 => Settle::Suspend,
                    94..97 => Settle::Release,
                    _ => Settle::Abandon,
                },
                settle_sent_ms: None,
                settle_acknowledged: false,
                granted_by,
                settled_by: None,
            };
            // Simulated work, sometimes with a renewal in the middle.
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..10))).await;
            if rng.random_bool(0.2)
                && let Some(Ok(r)) = bounded(
                    &mut conn,
                    client.renew(&d.id, d.epoch, Some(LEASE_MS), None),
                )
                .await
            {
                h.deadline_ms = h.deadline_ms.max(r.lease_expires_ms);
            }
            settle(&mut conn, &mut h, &log).await;
            lock(&log).holdings.push(h);
        }
    }
}

/// Sends the holding's settle until the daemon answers it (across restarts, on new
/// connections), for at most [`SETTLE_DEADLINE`].
async fn settle(conn: &mut Conn, h: &mut Holding, log: &Shared) {
    if h.settle == Settle::Abandon {
        return;
    }
    let deadline = Instant::now() + SETTLE_DEADLINE;
    while Instant::now() < deadline {
        let Some(client) = conn.get().await else {
            continue;
        };
        h.settle_sent_ms.get_or_insert_with(wall_ms);
        let settled = |r: Option<Result<muster_sdk::protocol::ops::SettleReply, Error>>| {
            r.map(|r| r.map(|_| None))
        };
        let answer = match h.settle {
            Settle::Ack => settled(bounded(conn, client.ack(&h.task, h.epoch, None)).await),
            Settle::Nack => settled(
                bounded(
                    conn,
                    client.nack(&h.task, h.epoch, Some(0), Some("checker".into())),
                )
                .await,
            ),
            Settle::Release => settled(bounded(conn, client.release(&h.task, h.epoch)).await),
            // A repeat of a suspend whose reply was lost gets a new token.
            Settle::Suspend => bounded(
                conn,
                client.suspend(&h.task, h.epoch, muster_sdk::Suspension::new("checker")),
            )
            .await
            .map(|r| r.map(|s| s.resume_token)),
            // A repeat of a spawn whose reply was lost finds its children spawned.
            Settle::Spawn => {
                let (p, n) = h.key.expect("only producers' tasks spawn");
                let keys = [(CHILD_BASE + p, 2 * n), (CHILD_BASE + p, 2 * n + 1)];
                let children = keys
                    .iter()
                    .enumerate()
                    .map(|(i, (p, n))| {
                        let payload = muster_sdk::json(&serde_json::json!({"p": p, "n": n}))
                            .expect("payload is JSON");
                        muster_sdk::NewChild::new(format!("c{i}"), QUEUE, payload)
                    })
                    .collect();
                {
                    let mut log = lock(log);
                    for k in keys {
                        log.attempts.entry(k).or_default();
                    }
                }
                let wait = Some(muster_sdk::protocol::ops::SpawnWait::default());
                let reply = bounded(conn, client.spawn(&h.task, h.epoch, children, wait)).await;
                let mut log = lock(log);
                for k in keys {
                    let attempt = log.attempts.get_mut(&k).expect("logged above");
                    attempt.indeterminate |= reply.is_none();
                }
                if let Some(Ok(spawned)) = &reply {
                    assert_eq!(spawned.children.len(), 2, "{spawned:?}");
                    for (k, child) in keys.iter().zip(&spawned.children) {
                        let attempt = log.attempts.get_mut(k).expect("logged above");
                        assert!(
                            attempt.acked_id.as_ref().is_none_or(|id| *id == child.id),
                            "child {k:?} of {} spawned as {:?} and {}",
                            h.task,
                            attempt.acked_id,
                            child.id
                        );
                        if attempt.acked_id.is_none() {
                            attempt.acked_id = Some(child.id.clone());
                            attempt.acked_by = conn.served();
                            attempt.acked_ms = wall_ms();
                        }
                    }
                }
                reply.map(|r| r.map(|_| None))
            }
            Settle::Abandon => unreachable!("abandoned holdings are not settled"),
        };
        match answer {
            None => continue,
            Some(Ok(token)) => {
                h.settle_acknowledged = true;
                h.settled_by = conn.served();
                if let Some(token) = token {
                    resume(conn, &h.task, &token).await;
                }
                return;
            }
            Some(Err(e)) if e.code() == Some(ErrorCode::LeaseLost) => return,
            Some(Err(e)) => panic!("settle of {}.{} refused: {e}", h.task, h.epoch),
        }
    }
    panic!(
        "settle of {}.{} not answered within {SETTLE_DEADLINE:?}",
        h.task, h.epoch
    );
}

/// Resumes a task the agent suspended, with its token, until the daemon answers (across
/// restarts, on new connections): a `stale_token` after a lost reply is the earlier
/// resume having taken effect.
async fn resume(conn: &mut Conn, task: &str, token: &str) {
    let deadline = Instant::now() + SETTLE_DEADLINE;
    let mut sent = false;
    while Instant::now() < deadline {
        let Some(client) = conn.get().await else {
            continue;
        };
        match bounded(conn, client.resume(token, None)).await {
            None => sent = true,
            Some(Ok(_)) => return,
            Some(Err(e)) if sent && e.code() == Some(ErrorCode::StaleToken) => return,
            Some(Err(e)) => panic!("resume of {task} refused: {e}"),
        }
    }
    panic!("resume of {task} not answered within {SETTLE_DEADLINE:?}");
}

fn lock(log: &Shared) -> std::sync::MutexGuard<'_, History> {
    log.lock().expect("history lock")
}

/// Runs the whole test against one daemon: queue, clients, nemesis, drain, analysis.
pub async fn run(config: Config) -> Report {
    println!(
        "checker: seed={} nemesis={:?} faults={} run_for={:?}",
        config.seed, config.nemesis, config.faults, config.run_for
    );
    let daemon = Daemon::start();
    let target = Target {
        options: daemon.options(),
        clustered: false,
    };
    // The nemesis runs on a blocking thread; the daemon outlives it, for the drain.
    let daemon = Arc::new(Mutex::new(daemon));
    let held = Arc::clone(&daemon);
    let (faults, run_for, nemesis) = (config.faults, config.run_for, config.nemesis);
    let report = run_against(target, config.workload(), move |rng| async move {
        tokio::task::spawn_blocking(move || {
            let mut daemon = held.lock().expect("daemon lock");
            inject(&mut daemon, rng, nemesis, faults, run_for)
        })
        .await
        .expect("nemesis thread")
    })
    .await;
    drop(daemon);
    report
}

/// Runs the clients of `workload` against `target` while `nemesis` runs (it gets its
/// own seeded generator and returns how many faults it made, once everything it did is
/// undone); then drains the queue and analyses what the clients logged.
pub async fn run_against<N, F>(target: Target, workload: Workload, nemesis: N) -> Report
where
    N: FnOnce(StdRng) -> F,
    F: std::future::Future<Output = usize>,
{
    let mut conn = Conn::new(target.clone());
    let queue = QueuePatch {
        lease_ms: Some(LEASE_MS),
        max_attempts: Some(0),
        ..QueuePatch::default()
    };
    conn.answered(SETUP_TIMEOUT, "creating the queue", |c| {
        let queue = queue.clone();
        async move { c.queue_create(QUEUE, queue).await }
    })
    .await;

    let run_started = Instant::now();
    let mut seeds = StdRng::seed_from_u64(workload.seed);
    let log: Shared = Arc::default();
    let stop_producing = Arc::new(AtomicBool::new(false));
    let stop_working = Arc::new(AtomicBool::new(false));
    let mut producers = Vec::new();
    for p in 0..workload.producers {
        producers.push(tokio::spawn(produce(
            p as u64,
            StdRng::seed_from_u64(seeds.random()),
            target.clone(),
            Arc::clone(&stop_producing),
            Arc::clone(&log),
        )));
    }
    let mut agents = Vec::new();
    for _ in 0..workload.agents {
        agents.push(tokio::spawn(work(
            StdRng::seed_from_u64(seeds.random()),
            target.clone(),
            Arc::clone(&stop_working),
            Arc::clone(&log),
        )));
    }

    let faults = nemesis(StdRng::seed_from_u64(seeds.random())).await;

    println!("checker: nemesis done after {:?}", run_started.elapsed());
    stop_producing.store(true, Ordering::SeqCst);
    for p in producers {
        p.await.expect("producer");
    }
    let started = Instant::now();
    loop {
        let c = conn
            .answered(DRAIN_TIMEOUT, "describing the queue", |c| async move {
                c.queue_describe(QUEUE).await
            })
            .await
            .counts;
        if c.scheduled + c.ready + c.leased == 0 {
            break;
        }
        assert!(
            started.elapsed() < DRAIN_TIMEOUT,
            "queue not drained within {DRAIN_TIMEOUT:?}: {c:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!("checker: drained after {:?}", run_started.elapsed());
    stop_working.store(true, Ordering::SeqCst);
    for a in agents {
        a.await.expect("agent");
    }

    let mut done = HashSet::new();
    let mut cursor = None;
    loop {
        let page = conn
            .answered(DRAIN_TIMEOUT, "listing done tasks", |c| {
                let cursor = cursor.clone();
                async move {
                    c.task_list(QUEUE, TaskState::Done, cursor, Some(1000))
                        .await
                }
            })
            .await;
        done.extend(page.tasks.into_iter().map(|t| t.id));
        match page.next {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    let counts = conn
        .answered(DRAIN_TIMEOUT, "describing the queue", |c| async move {
            c.queue_describe(QUEUE).await
        })
        .await
        .counts;
    let history = std::mem::take(&mut *lock(&log));
    let mut report = analyse(&history, &done);
    report.seed = workload.seed;
    report.faults = faults;
    report.clustered = target.clustered;
    report.remaining =
        counts.scheduled + counts.ready + counts.leased + counts.dead + counts.cancelled;
    report.done = counts.done;
    println!("checker: {report}");
    report
}

/// The nemesis: waits 1–5 s, kill -9s the daemon (tearing its journal for power loss)
/// and restarts it, `faults` times or for `run_for`. Returns how many faults it made.
fn inject(
    daemon: &mut Daemon,
    mut rng: StdRng,
    nemesis: Nemesis,
    faults: usize,
    run_for: Option<Duration>,
) -> usize {
    let started = Instant::now();
    let mut made = 0;
    loop {
        let more = match run_for {
            Some(d) => started.elapsed() < d,
            None => made < faults,
        };
        if !more {
            return made;
        }
        // The nemesis's schedule, not a synchronisation: faults land at random moments.
        std::thread::sleep(Duration::from_millis(rng.random_range(1000..=5000)));
        daemon.kill9();
        if nemesis == Nemesis::PowerLoss {
            let torn = tear_journal(&daemon.data().join("store"), made, &mut rng);
            println!("checker: fault {} tore the journal: {torn}", made + 1);
        }
        let cuts_before = daemon.log().matches("its last batch was torn").count();
        daemon.restart();
        if nemesis == Nemesis::PowerLoss && made % 3 == 2 {
            // The daemon's log line about the cut comes before it reports listening.
            assert_eq!(
                daemon.log().matches("its last batch was torn").count(),
                cuts_before + 1,
                "the daemon did not cut the torn batch of fault {}",
                made + 1
            );
        }
        made += 1;
    }
}

/// Where batches lie in a journal file (fjall 3 format: batches framed by a Start entry
/// and an End entry carrying a checksum and the magic bytes; files are pre-allocated
/// with zeros, so the first zero tag after a batch is the logical end).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalEnd {
    /// Offset just past the last complete batch.
    pub end: u64,
    /// Offset of the last complete batch's Start entry, if there is one.
    pub last_batch: Option<u64>,
}

/// Parses a journal file's entries from the start up to the first zero tag or the
/// first entry that does not fit.
pub fn journal_end(bytes: &[u8]) -> JournalEnd {
    let mut pos = 0usize;
    let mut out = JournalEnd {
        end: 0,
        last_batch: None,
    };
    let mut batch_start = None;
    let u16_at = |p: usize| -> Option<usize> {
        Some(u16::from_le_bytes(bytes.get(p..p + 2)?.try_into().ok()?) as usize)
    };
    let u32_at = |p: usize| -> Option<usize> {
        Some(u32::from_le_bytes(bytes.get(p..p + 4)?.try_into().ok()?) as usize)
    };
    while let Some(&tag) = bytes.get(pos) {
        let len = match tag {
            // Start: tag, item count (u32), seqno (u64).
            1 => {
                batch_start = Some(pos);
                13
            }
            // Item: tag, value type, compression, keyspace (u64), key len (u16), value
            // len (u32), on-disk value len (u32), key, value.
            2 => {
                let (Some(key), Some(value)) = (u16_at(pos + 11), u32_at(pos + 17)) else {
                    break;
                };
                21 + key + value
            }
            // End: tag, checksum (u64), magic (4 bytes).
            3 => 13,
            // Clear: tag, keyspace (u64).
            4 => 9,
            _ => break,
        };
        if pos + len > bytes.len() {
            break;
        }
        pos += len;
        if tag == 3 {
            out.end = pos as u64;
            out.last_batch = batch_start.map(|s| s as u64);
        }
    }
    out
}

/// The newest journal file under a fjall database directory.
pub fn newest_journal(store: &Path) -> PathBuf {
    let mut found: Vec<(u64, PathBuf)> = Vec::new();
    let mut dirs = vec![store.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("reading the store directory") {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if let Some(id) = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".jnl"))
                .and_then(|n| n.parse().ok())
            {
                found.push((id, path));
            }
        }
    }
    found
        .into_iter()
        .max()
        .map(|(_, p)| p)
        .expect("a journal file in the store")
}

/// Simulates what a power loss leaves of the newest journal's unsynced tail, right after
/// the last complete batch (everything up to it may have been synced, so it is kept).
/// Fault `n` writes, by `n % 3`:
/// 0. a torn copy of that batch, cut short (the next batch's write stopped midway);
/// 1. a Start entry followed by garbage (a torn sector);
/// 2. a whole copy of that batch, End entry included, with a range of its first item's
///    value zeroed (a page in the middle never reached the disk): complete framing, bad
///    checksum, which fjall 3 alone refuses to open.
///
/// Returns what it did.
pub fn tear_journal(store: &Path, n: usize, rng: &mut StdRng) -> String {
    use std::io::{Seek, SeekFrom, Write};
    let path = newest_journal(store);
    let bytes = std::fs::read(&path).expect("reading the journal");
    let end = journal_end(&bytes);
    let last = end
        .last_batch
        .map(|start| &bytes[start as usize..end.end as usize]);
    let (how, tail): (&str, Vec<u8>) = match (n % 3, last) {
        (0, Some(batch)) => ("a cut-short copy of the last batch", {
            batch[..rng.random_range(1..batch.len())].to_vec()
        }),
        (2, Some(batch)) => {
            let mut copy = batch.to_vec();
            // Start (13 bytes), then the first item: 21 bytes of header, key, value.
            let key = u16::from_le_bytes([copy[24], copy[25]]) as usize;
            let value = u32::from_le_bytes([copy[30], copy[31], copy[32], copy[33]]) as usize;
            let from = 34 + key;
            let len = rng.random_range(1..=value.clamp(1, 64));
            copy[from..from + len.min(value)].fill(0);
            ("a whole copy of the last batch with a zeroed range", copy)
        }
        _ => ("a Start entry and garbage", {
            let mut t = vec![1u8];
            t.extend((0..rng.random_range(1..200)).map(|_| rng.random::<u8>()));
            t
        }),
    };
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("opening the journal");
    file.seek(SeekFrom::Start(end.end))
        .expect("seeking the journal");
    file.write_all(&tail).expect("tearing the journal");
    file.sync_all().expect("syncing the journal");
    format!(
        "{} valid to {}, then {} bytes of {how}",
        path.display(),
        end.end,
        tail.len()
    )
}

fn analyse(history: &History, done: &HashSet<String>) -> Report {
    let mut r = Report {
        attempted: history.attempts.len(),
        deliveries: history.holdings.len(),
        ..Report::default()
    };
    let acked_ids: HashMap<&str, (u64, u64)> = history
        .attempts
        .iter()
        .filter_map(|(k, a)| a.acked_id.as_deref().map(|id| (id, *k)))
        .collect();
    r.acknowledged = acked_ids.len();
    r.children = acked_ids.values().filter(|(p, _)| *p >= CHILD_BASE).count();
    r.indeterminate = history
        .attempts
        .values()
        .filter(|a| a.indeterminate)
        .count();
    r.lost = acked_ids.keys().filter(|id| !done.contains(**id)).count();

    // Every task seen, with the key its payload named.
    let mut task_key: HashMap<&str, Option<(u64, u64)>> = HashMap::new();
    let mut by_task: HashMap<&str, Vec<&Holding>> = HashMap::new();
    for h in &history.holdings {
        task_key.insert(&h.task, h.key);
        by_task.entry(&h.task).or_default().push(h);
    }
    r.delivered = by_task.len();
    r.settles_acknowledged = history
        .holdings
        .iter()
        .filter(|h| h.settle_acknowledged)
        .count();
    let mut ids_per_key: HashMap<(u64, u64), HashSet<&str>> = HashMap::new();
    for (id, key) in &task_key {
        match key.filter(|k| history.attempts.contains_key(k)) {
            Some(k) => {
                ids_per_key.entry(k).or_default().insert(id);
            }
            None => r.unexpected += 1,
        }
    }
    for (id, k) in &acked_ids {
        ids_per_key.entry(*k).or_default().insert(id);
    }
    r.unexpected += done
        .iter()
        .filter(|id| !task_key.contains_key(id.as_str()))
        .count();
    r.duplicated = ids_per_key.values().filter(|ids| ids.len() > 1).count();
    r.recovered = ids_per_key
        .keys()
        .filter(|k| history.attempts[*k].acked_id.is_none())
        .count();

    for holdings in by_task.values_mut() {
        holdings.sort_by_key(|h| h.epoch);
        let acks = holdings
            .iter()
            .filter(|h| h.settle == Settle::Ack && h.settle_acknowledged)
            .count();
        if acks > 1 {
            r.done_more_than_once += 1;
        }
        for (i, later) in holdings.iter().enumerate() {
            for earlier in &holdings[..i] {
                if earlier.settle == Settle::Ack && earlier.settle_acknowledged {
                    r.delivered_after_ack += 1;
                }
                // The earlier holding ended at its lease deadline, or when its settle
                // was first sent if that came sooner.
                let ended = earlier
                    .settle_sent_ms
                    .map_or(earlier.deadline_ms, |s| s.min(earlier.deadline_ms));
                if later.granted_ms + CLOCK_SLACK_MS < ended {
                    eprintln!(
                        "checker: concurrent holders of {}: epoch {} (granted {}, held until {}) and epoch {} (granted {})",
                        later.task,
                        earlier.epoch,
                        earlier.granted_ms,
                        ended,
                        later.epoch,
                        later.granted_ms
                    );
                    r.concurrent_holders += 1;
                }
            }
        }
    }
    (r.split_brain, r.unattributed) = split_brain(history);
    r.acks = history
        .attempts
        .values()
        .filter(|a| a.acked_id.is_some())
        .filter_map(|a| {
            a.acked_by.map(|by| AckMark {
                at_ms: a.acked_ms,
                by,
            })
        })
        .collect();
    r.acks.sort_by_key(|a| a.at_ms);
    r
}

/// The terms in which acknowledged writes came from two or more nodes, and the number
/// of acknowledged writes without a node and term.
fn split_brain(history: &History) -> (usize, usize) {
    let acked = history
        .attempts
        .values()
        .filter(|a| a.acked_id.is_some())
        .map(|a| a.acked_by);
    let granted = history.holdings.iter().map(|h| h.granted_by);
    let settled = history
        .holdings
        .iter()
        .filter(|h| h.settle_acknowledged)
        .map(|h| h.settled_by);
    let mut nodes_per_term: BTreeMap<u64, BTreeSet<u64>> = BTreeMap::new();
    let mut unattributed = 0;
    for served in acked.chain(granted).chain(settled) {
        match served {
            Some(s) => {
                nodes_per_term.entry(s.term).or_default().insert(s.node);
            }
            None => unattributed += 1,
        }
    }
    let mut split = 0;
    for (term, nodes) in &nodes_per_term {
        if nodes.len() > 1 {
            eprintln!(
                "checker: split brain in term {term}: writes acknowledged by nodes {nodes:?}"
            );
            split += 1;
        }
    }
    (split, unattributed)
}

#[cfg(test)]
mod tests {
    //! The checker can fail: hand-made histories with each violation.

    use super::*;

    fn holding(task: &str, epoch: u64, granted_ms: u64, settle: Settle) -> Holding {
        Holding {
            task: task.into(),
            epoch,
            key: Some((0, 1)),
            granted_ms,
            deadline_ms: granted_ms + LEASE_MS,
            settle,
            settle_sent_ms: (settle != Settle::Abandon).then_some(granted_ms + 10),
            settle_acknowledged: settle != Settle::Abandon,
            granted_by: None,
            settled_by: None,
        }
    }

    fn history(acked: bool, holdings: Vec<Holding>) -> History {
        let mut h = History::default();
        h.attempts.insert(
            (0, 1),
            Attempt {
                acked_id: acked.then(|| "t1".to_owned()),
                indeterminate: !acked,
                acked_by: None,
                acked_ms: 0,
            },
        );
        h.holdings = holdings;
        h
    }

    fn done(ids: &[&str]) -> HashSet<String> {
        ids.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_clean_history_after_a_lapse_is_clean() {
        let h = history(
            true,
            vec![
                holding("t1", 1, 1_000, Settle::Abandon),
                holding("t1", 2, 1_000 + LEASE_MS, Settle::Ack),
            ],
        );
        let r = analyse(&h, &done(&["t1"]));
        assert!(r.is_clean(), "{r}");
        assert_eq!((r.acknowledged, r.delivered, r.deliveries), (1, 1, 2));
    }

    #[test]
    fn each_violation_is_counted() {
        // Granted again while the first lease was valid and unsettled.
        let h = history(
            true,
            vec![
                holding("t1", 1, 1_000, Settle::Abandon),
                holding("t1", 2, 2_000, Settle::Ack),
            ],
        );
        assert_eq!(analyse(&h, &done(&["t1"])).concurrent_holders, 1);
        // Acknowledged but not done.
        let h = history(true, vec![]);
        assert_eq!(analyse(&h, &done(&[])).lost, 1);
        // Delivered again after an acknowledged ack, and acked twice.
        let h = history(
            true,
            vec![
                holding("t1", 1, 1_000, Settle::Ack),
                holding("t1", 2, 1_000 + LEASE_MS, Settle::Ack),
            ],
        );
        let r = analyse(&h, &done(&["t1"]));
        assert_eq!((r.delivered_after_ack, r.done_more_than_once), (1, 1));
        // Never attempted.
        let mut stray = holding("t9", 1, 1_000, Settle::Ack);
        stray.key = Some((7, 7));
        let h = history(true, vec![holding("t1", 1, 1_000, Settle::Ack), stray]);
        assert_eq!(analyse(&h, &done(&["t1", "t9"])).unexpected, 1);
        // One attempt, two tasks.
        let h = history(
            true,
            vec![
                holding("t1", 1, 1_000, Settle::Ack),
                holding("t2", 1, 1_000, Settle::Ack),
            ],
        );
        assert_eq!(analyse(&h, &done(&["t1", "t2"])).duplicated, 1);
        // Unacknowledged but present is recovered, not a violation.
        let h = history(false, vec![holding("t1", 1, 1_000, Settle::Ack)]);
        let r = analyse(&h, &done(&["t1"]));
        assert_eq!((r.recovered, r.is_clean()), (1, true));
    }

    #[test]
    fn writes_of_one_term_from_two_nodes_are_a_split_brain() {
        let served = |node, term| Some(Served { node, term });
        let mut first = holding("t1", 1, 1_000, Settle::Release);
        (first.granted_by, first.settled_by) = (served(1, 2), served(1, 2));
        let mut h = history(true, vec![first]);
        h.attempts.get_mut(&(0, 1)).expect("the attempt").acked_by = served(1, 2);
        let mut r = analyse(&h, &done(&["t1"]));
        r.clustered = true;
        assert!(r.is_clean(), "{r}");
        assert_eq!((r.split_brain, r.unattributed), (0, 0));

        // Node 2 acknowledged a settle in node 1's term 2; term 3 is another leader's.
        let mut second = holding("t1", 2, 1_000 + LEASE_MS, Settle::Ack);
        (second.granted_by, second.settled_by) = (served(2, 3), served(2, 2));
        h.holdings.push(second);
        let r = analyse(&h, &done(&["t1"]));
        assert_eq!(r.split_brain, 1);

        // A cluster run's writes must all be attributed; a single daemon's never are.
        h.holdings[1].settled_by = None;
        let mut r = analyse(&h, &done(&["t1"]));
        assert_eq!((r.split_brain, r.unattributed), (0, 1));
        assert!(r.is_clean(), "{r}");
        r.clustered = true;
        assert!(!r.is_clean(), "{r}");
    }

    #[test]
    fn the_journal_end_is_after_the_last_complete_batch() {
        let mut j = Vec::new();
        // Start (13 bytes), one item with a 2-byte key and 3-byte value, End (13 bytes).
        j.push(1);
        j.extend([0u8; 12]);
        j.extend([2, 0, 0]);
        j.extend([0u8; 8]);
        j.extend(2u16.to_le_bytes());
        j.extend(3u32.to_le_bytes());
        j.extend(3u32.to_le_bytes());
        j.extend(b"k1v11");
        j.push(3);
        j.extend([0u8; 8]);
        j.extend(b"FJL\x03");
        let end = j.len() as u64;
        // A torn next batch, then the pre-allocated zeros.
        j.push(1);
        j.extend([9u8; 5]);
        j.extend([0u8; 64]);
        assert_eq!(
            journal_end(&j),
            JournalEnd {
                end,
                last_batch: Some(0)
            }
        );
    }
}
