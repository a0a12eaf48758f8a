//! A Jepsen-style checker of agents under faults: producers, `muster work` runners and
//! SDK workers share one queue on one real `musterd`, while a nemesis kill -9s, drains,
//! freezes and partitions the agents (never the daemon); then the queue drains and
//! [`Report`] says what was lost, done twice, run twice at once, killed, or counted as a
//! failure without a fault to excuse it.
//!
//! Every agent reaches the daemon through a [`Relay`] of its own, so any of them can be
//! cut off. Every execution of a task appends to one log file: `start TASK EPOCH MS EXEC
//! MEMBER`, a `tick` every 100 ms while it works, and `end` (done), `term` (stopped by
//! SIGTERM), `cancelled` or `dropped` (an SDK handler told to stop, or dropped). A hard
//! kill leaves the last tick as the bound of its end. The nemesis records every fault
//! with its member and wall-clock interval, and every agent process's life. After the
//! drain the checker reads each task's timeline from the daemon (`task_get`: who held
//! which epoch, from when to when, and how it ended) and judges each execution against
//! it. Randomness (payloads, the nemesis's choices and pauses) comes from one seed,
//! printed as `seed=N` and replayed with `MUSTER_AGENT_CHAOS_SEED`; the interleaving with
//! the processes is still up to the OS. A failed run (or any, with
//! `MUSTER_AGENT_CHAOS_KEEP` set) keeps its directory: the executions' log, the
//! timelines, the faults, every agent's stderr and the daemon's log.
//!
//! The faults, on a random agent that has been up for [`MIN_UPTIME`], at random 0.4–1.6 s
//! intervals (later when no agent may take one), leaving at least [`MIN_HEALTHY`] agents
//! up (not down, frozen, cut off or draining):
//! - kill -9 of the agent's process group (the agent and its programs);
//! - kill -9 of the `muster work` process alone, as the OOM killer does: its programs
//!   must not outlive it and run beside their next attempt;
//! - SIGTERM to the agent process (a clean drain, on an agent past every fault window);
//! - SIGSTOP of the process group, SIGCONT after 0.5 s to twice the lease (a GC pause,
//!   a frozen VM);
//! - a partition of its relay for longer than the lease, then healed.
//!
//! After a kill or a drain the member comes back under its name, or under a new name,
//! or its name is never used again (the slot stays empty for 5–10 s).
//!
//! A fault excuses what it causes within its *window*: from its start to its end plus a
//! lease (what it held runs out) plus the daemon's liveness timeout (what it was handed
//! before the daemon noticed runs out too) plus [`WINDOW_SLACK_MS`].
//!
//! The checker fails on:
//! 1. `lost`: an acknowledged enqueue whose task is not `done` at the end;
//! 2. `done_twice`: a task with two `done` events, or run to its end under two live
//!    leases where the one that was not acked ended without a fault of its holder to
//!    excuse it (a partitioned agent finishing work whose ack cannot arrive is the
//!    at-least-once promise, not a violation; it is reported as `completed_twice`);
//! 3. `overlaps`: two executions of one task running at once while both epochs were
//!    live; and `zombies_unexcused`: an execution running on after its epoch ended
//!    (lapsed, reclaimed, …) when its agent was neither frozen nor partitioned then,
//!    e.g. the orphaned program of a killed `muster work`; and `zombies_cut_off`: an
//!    execution of a partitioned agent running on after its epoch ended (an agent cut
//!    off must stop by its own clock before its lease can lapse). Zombies of frozen
//!    agents (a frozen process cannot stop itself) are counted (`zombies_frozen`,
//!    `zombie_overlaps`), not failed;
//! 4. `dead`: a dead task (handlers never fail their tasks);
//! 5. `failures_unexplained` and `failures_in_drain`: a failure (`lapsed`, `revoked`,
//!    `nacked`, or the `reclaimed` that ends the previous epoch) of a member not inside
//!    the window of a kill -9, freeze or partition of that member; within a SIGTERM
//!    drain's window only, it is a failure caused by a clean drain. A failure a window
//!    excuses although its lease was granted after the fault was over (the agent back
//!    and reachable) is counted as `failures_after_recovery`, not failed;
//!
//! and, as direct checks of the same promises:
//! - `drain_killed`: a program running when its `muster work` was told to drain, that
//!   ended neither by itself nor by SIGTERM (it was SIGKILLed);
//! - `drains_stuck`: a drained agent still running [`DRAIN_EXIT_TIMEOUT`] after SIGTERM;
//! - `crashes`: an agent process that exited without being told to;
//! - `grants_to_silent`: a lease granted to a member that had been dead, frozen or cut
//!   off for longer than the liveness timeout (plus slack);
//! - `settled_after_end`: a second ending of one epoch (a settle accepted after the
//!   lease had ended), or an ending after a later epoch was granted;
//! - `granted_while_held`: an epoch granted while the previous one was still live;
//! - `done_without_end`: a `done` epoch none of whose executions ran to its end;
//! - `failures_untracked`: a task whose failure count is not the number of failures
//!   its (whole) timeline shows, so that some failure escaped the attribution above.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use muster_sdk::{Backoff, Client, ErrorCode, NewTask, QueuePatch, TaskInfo, TaskState};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::cluster::{Cluster, NodeId};
use crate::relay::Relay;
use crate::{Daemon, Proc, signal_pid};

/// The queue the checker uses.
const QUEUE: &str = "chaos";

/// The queue's lease: short, so that faults matter.
pub const LEASE_MS: u64 = 3_000;

/// The daemon's liveness timeout (its default): a member silent this long is handed
/// nothing more.
pub const LIVENESS_MS: u64 = 5_000;

/// Added to the end of a fault's window: timers, scheduling and fsyncs on a loaded
/// machine.
pub const WINDOW_SLACK_MS: u64 = 1_000;

/// Tolerance between the timestamps of different processes on this host (the shell's
/// `date`, the daemon's clock read at the start of its round, our own).
pub const CLOCK_SLACK_MS: u64 = 100;

/// A program killed hard logged its last tick at most this long before the kill.
const KILL_GAP_MS: u64 = 1_000;

/// How long programs get on SIGTERM (`muster work --grace`, the SDK agent's grace).
const GRACE: &str = "2s";

/// Work of one task, chosen by the producer: some of it outlasts the grace period and
/// the lease (so it lives on renewals).
const WORK_MS: RangeInclusive<u64> = 200..=4_000;

/// Pause between a producer's enqueues.
const PRODUCE_PAUSE_MS: RangeInclusive<u64> = 400..=900;

/// Pause between two faults.
const FAULT_PAUSE_MS: RangeInclusive<u64> = 400..=1_600;

/// How long an agent stays frozen: sometimes shorter, sometimes longer than the lease.
const FREEZE_MS: RangeInclusive<u64> = 500..=2 * LEASE_MS;

/// How long a partition lasts: always longer than the lease.
const PARTITION_MS: RangeInclusive<u64> = LEASE_MS + 500..=LEASE_MS * 5 / 2;

/// Delay before a killed or drained agent comes back.
const RESTART_MS: RangeInclusive<u64> = 200..=4_000;

/// How long a slot stays empty after its member's name was retired.
const RETIRED_MS: RangeInclusive<u64> = 5_000..=10_000;

/// How often the nemesis looks at its agents (heals, wakes, restarts, reaps).
const NEMESIS_TICK: Duration = Duration::from_millis(50);

/// An agent is a target only once it has been up this long (its signal handlers and
/// session are in place): the nemesis's schedule, not a synchronisation.
pub const MIN_UPTIME: Duration = Duration::from_secs(1);

/// Agents a fault leaves up (not down, frozen, cut off or draining), so the queue keeps
/// moving.
pub const MIN_HEALTHY: usize = 2;

/// Longest a drained agent may take to exit (grace, release, the SDK's settle linger).
pub const DRAIN_EXIT_TIMEOUT: Duration = Duration::from_secs(20);

/// Longest a killed process may take to be reaped.
const REAP_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest the drain may take once the nemesis stopped.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(120);

/// Pause between two looks at the queue during the drain.
const DRAIN_POLL: Duration = Duration::from_millis(200);

/// Pause before a producer connects again after a failed connect.
const RECONNECT_PAUSE: Duration = Duration::from_millis(100);

/// Longest one call to the daemon may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Violations of each kind described in detail (all are counted).
const MAX_DETAILS: usize = 8;

/// The program `muster work` runs for each task: `sh PROGRAM LOG MEMBER`.
const PROGRAM: &str = r#"# The agent chaos checker's task: works for the payload's "ms", logging as it goes.
log=$1
member=$2
payload=$(cat)
ms=${payload##*\"ms\":}
ms=${ms%%[!0-9]*}
[ -n "$ms" ] || ms=500
task=$MUSTER_TASK_ID
epoch=${MUSTER_CLAIM##*.}
now() { date +%s%3N; }
t=$(now)
run=$$.$t
trap 'echo "term $task $epoch $(now) $run" >>"$log"; exit 143' TERM
echo "start $task $epoch $t $run $member" >>"$log"
stop=$((t + ms))
while t=$(now); [ "$t" -lt "$stop" ]; do
    echo "tick $task $epoch $t $run" >>"$log"
    sleep 0.1
done
echo "end $task $epoch $(now) $run" >>"$log"
"#;

/// One run's settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// Seed of every random choice.
    pub seed: u64,
    /// Faults to inject (when `run_for` is not set).
    pub faults: usize,
    /// Inject faults for this long instead of counting them (the long run).
    pub run_for: Option<Duration>,
    /// Concurrent producers.
    pub producers: usize,
    /// `muster work` agents.
    pub work_agents: usize,
    /// SDK agents (`chaos_agent`).
    pub sdk_agents: usize,
    /// Tasks each agent runs at once.
    pub capacity: u32,
    /// Against a relayed three-node cluster whose leader a second nemesis kills,
    /// isolates and deafens meanwhile ([`LeaderFault`]), instead of one daemon.
    pub cluster: bool,
}

impl Config {
    /// The CI run (24 faults), or a long one when `MUSTER_AGENT_CHAOS_SECONDS` is set;
    /// the seed from `MUSTER_AGENT_CHAOS_SEED`, else a random one.
    pub fn from_env() -> Config {
        let seed = match std::env::var("MUSTER_AGENT_CHAOS_SEED") {
            Ok(s) => s.parse().expect("MUSTER_AGENT_CHAOS_SEED is a u64"),
            Err(_) => rand::random(),
        };
        let run_for = std::env::var("MUSTER_AGENT_CHAOS_SECONDS").ok().map(|s| {
            Duration::from_secs(
                s.parse()
                    .expect("MUSTER_AGENT_CHAOS_SECONDS is a number of seconds"),
            )
        });
        Config {
            seed,
            faults: 24,
            run_for,
            producers: 2,
            work_agents: 4,
            sdk_agents: 4,
            capacity: 2,
            cluster: false,
        }
    }

    /// [`Config::from_env`] against a cluster whose leader changes under the agents.
    pub fn cluster_from_env() -> Config {
        Config {
            cluster: true,
            ..Config::from_env()
        }
    }
}

/// Nodes of the cluster of a [`Config::cluster`] run.
const CLUSTER_NODES: usize = 3;

/// Pause between two leader faults, in ms.
const LEADER_FAULT_PAUSE_MS: RangeInclusive<u64> = 1_000..=3_000;

/// How long a leader fault lasts, in ms: long enough for a new leader to serve.
const LEADER_FAULT_HOLD_MS: RangeInclusive<u64> = 2_500..=3_500;

/// What the cluster's nemesis does to the leader, while the agents' nemesis works on
/// the agents: every leader fault makes the agents follow a new leader, renewing and
/// settling their leases there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaderKind {
    /// kill -9, restarted after the hold.
    Kill9,
    /// Its node-to-node paths blackholed (its clients still reach it), healed after
    /// the hold.
    Isolate,
    /// Nothing the other nodes send reaches it (one-way loss), healed after the hold.
    Deafen,
}

/// One leader fault, as the cluster's nemesis made it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderFault {
    /// What it was.
    pub kind: LeaderKind,
    /// The node.
    pub node: NodeId,
    /// Wall ms it began.
    pub start_ms: u64,
    /// Wall ms it was undone.
    pub end_ms: u64,
}

/// What the agents run against: one daemon, or a cluster.
enum Backend {
    Daemon(Daemon),
    Cluster(Cluster),
}

impl Backend {
    /// A client of the daemon, or of the cluster's leader.
    async fn client(&self) -> Client {
        match self {
            Backend::Daemon(d) => d.client().await,
            Backend::Cluster(c) => c.client_with(c.direct_options()).await,
        }
    }

    /// Connect options of the daemon, or of the whole cluster.
    fn options(&self) -> muster_sdk::ConnectOptions {
        match self {
            Backend::Daemon(d) => d.options(),
            Backend::Cluster(c) => c.direct_options(),
        }
    }

    /// Where agents connect: the daemon, or every node.
    fn upstreams(&self) -> Vec<SocketAddr> {
        let addrs = match self {
            Backend::Daemon(d) => vec![d.addr.clone()],
            Backend::Cluster(c) => c
                .node_ids()
                .into_iter()
                .map(|id| c.listen_addr(id))
                .collect(),
        };
        addrs
            .iter()
            .map(|a| a.parse().expect("a client address"))
            .collect()
    }

    /// The directory agents find the daemon's identity in (`MUSTER_DATA`).
    fn trust_dir(&self) -> PathBuf {
        match self {
            Backend::Daemon(d) => d.data().to_path_buf(),
            Backend::Cluster(c) => c.client_dir(),
        }
    }

    /// Every log, for a run that keeps its directory: `(file name, text)`.
    fn logs(&self) -> Vec<(String, String)> {
        match self {
            Backend::Daemon(d) => vec![("musterd.log".to_owned(), d.log())],
            Backend::Cluster(c) => c
                .node_ids()
                .into_iter()
                .map(|id| (format!("musterd-{id}.log"), c.log(id)))
                .collect(),
        }
    }
}

/// The cluster's nemesis: leader faults at random intervals until `stop`, each undone
/// after its hold; then everything healed and a leader serving. Returns the cluster and
/// what it did.
async fn fault_leaders(
    mut cluster: Cluster,
    mut rng: StdRng,
    stop: Arc<AtomicBool>,
) -> (Cluster, Vec<LeaderFault>) {
    let mut faults = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        // The nemesis's schedule, not a synchronisation.
        tokio::time::sleep(Duration::from_millis(
            rng.random_range(LEADER_FAULT_PAUSE_MS),
        ))
        .await;
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let kind = match rng.random_range(0..3) {
            0 => LeaderKind::Kill9,
            1 => LeaderKind::Isolate,
            _ => LeaderKind::Deafen,
        };
        let hold = Duration::from_millis(rng.random_range(LEADER_FAULT_HOLD_MS));
        let leader = cluster.leader().await;
        let start_ms = wall_ms();
        println!(
            "agent_chaos: leader fault at {start_ms}: {kind:?} of node {} (term {}) for {hold:?}",
            leader.node, leader.term
        );
        match kind {
            LeaderKind::Kill9 => cluster.kill9(leader.node),
            LeaderKind::Isolate => cluster.partition_node(leader.node),
            LeaderKind::Deafen => cluster.deafen_node(leader.node),
        }
        tokio::time::sleep(hold).await;
        match kind {
            LeaderKind::Kill9 => cluster.restart(leader.node).await,
            LeaderKind::Isolate | LeaderKind::Deafen => cluster.heal_node(leader.node),
        }
        faults.push(LeaderFault {
            kind,
            node: leader.node,
            start_ms,
            end_ms: wall_ms(),
        });
    }
    for node in cluster.node_ids() {
        cluster.heal_node(node);
    }
    let leader = cluster.leader().await;
    println!(
        "agent_chaos: cluster healed; node {} leads in term {}",
        leader.node, leader.term
    );
    (cluster, faults)
}

/// What the nemesis does to one agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultKind {
    /// kill -9 of the agent's process group.
    Kill9,
    /// kill -9 of the agent process alone (its programs, if any, live on).
    Kill9Main,
    /// SIGTERM to the agent process: a clean drain.
    Term,
    /// SIGSTOP of the process group, then SIGCONT.
    Freeze,
    /// Its relay blackholed, then healed.
    Partition,
    /// Not injected: the agent exited on its own (a violation).
    Crash,
}

impl FaultKind {
    /// True if failures inside its window are explained by it.
    fn excuses_failures(self) -> bool {
        !matches!(self, FaultKind::Term)
    }

    fn is_kill(self) -> bool {
        matches!(
            self,
            FaultKind::Kill9 | FaultKind::Kill9Main | FaultKind::Crash
        )
    }
}

/// One fault, as the nemesis made it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Fault {
    kind: FaultKind,
    member: String,
    /// Wall-clock ms it began (the signal, the cut).
    start_ms: u64,
    /// Wall-clock ms it ended (SIGCONT, heal, the drained agent's exit; = start for a kill).
    end_ms: u64,
}

/// One agent process's life.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Life {
    member: String,
    start_ms: u64,
    /// When it died or exited, if it did.
    end_ms: Option<u64>,
}

/// A task as the daemon described it at the end.
#[derive(Debug, Clone)]
struct TaskRecord {
    state: TaskState,
    deliveries: u64,
    failures: u64,
    history: Vec<Event>,
}

/// One timeline event.
#[derive(Debug, Clone)]
struct Event {
    at_ms: u64,
    event: String,
    member: Option<String>,
    epoch: Option<u64>,
}

impl From<TaskInfo> for TaskRecord {
    fn from(t: TaskInfo) -> TaskRecord {
        TaskRecord {
            state: t.state,
            deliveries: t.deliveries,
            failures: t.failures,
            history: t
                .history
                .into_iter()
                .map(|e| Event {
                    at_ms: e.at_ms,
                    event: e.event,
                    member: e.member,
                    epoch: e.epoch,
                })
                .collect(),
        }
    }
}

/// Everything a run recorded, for [`analyse`].
#[derive(Debug, Default)]
struct History {
    lease_ms: u64,
    liveness_ms: u64,
    /// Ids of acknowledged enqueues.
    acked: Vec<String>,
    /// Every task acknowledged or executed, by id; absent if the daemon has none.
    tasks: HashMap<String, TaskRecord>,
    /// The executions' log.
    log: String,
    faults: Vec<Fault>,
    /// The cluster's leader faults (start and end, wall ms), by start.
    leader_faults: Vec<(u64, u64)>,
    lives: Vec<Life>,
}

/// What the checker found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    /// The seed of the run.
    pub seed: u64,
    /// kill -9 of an agent's process group.
    pub kill9: usize,
    /// kill -9 of a `muster work` process alone.
    pub kill9_main: usize,
    /// SIGTERM drains.
    pub term: usize,
    /// SIGSTOP/SIGCONT pauses.
    pub freeze: usize,
    /// Partitions.
    pub partition: usize,
    /// Leader faults (cluster runs): kill -9, isolation and one-way loss of the leader.
    pub leader_faults: usize,
    /// Members restarted under their name after a kill or drain.
    pub restarted_same_name: usize,
    /// Slots restarted under a new member name.
    pub restarted_new_name: usize,
    /// Member names never used again (the slot stayed empty for a while).
    pub retired: usize,
    /// Enqueues acknowledged.
    pub acknowledged: usize,
    /// Enqueues whose reply never came.
    pub indeterminate: usize,
    /// Tasks judged (acknowledged or executed).
    pub tasks: usize,
    /// Executions logged.
    pub executions: usize,
    /// Executions that ran to their end.
    pub completions: usize,
    /// Failures counted by the daemon, in all.
    pub failures: u64,
    /// Most failures of one task.
    pub max_failures: u64,
    /// Executions running on after their epoch ended, excused by a freeze of their agent.
    pub zombies_frozen: usize,
    /// Executions running on after their epoch ended, excused by a partition of their
    /// agent (an agent that stops its work by its own lease clock has none).
    pub zombies_cut_off: usize,
    /// Overlaps of such a zombie with another execution of its task.
    pub zombie_overlaps: usize,
    /// Failures excused by a fault's window whose lease was granted after the fault was
    /// over and the agent reachable again (counted, not failed: suspicious).
    pub failures_after_recovery: usize,
    /// Tasks run to their end under two live leases, excused by a fault.
    pub completed_twice: usize,
    /// Executions stopped hard (no end, term, cancel or drop line) outside any drain.
    pub hard_stops: usize,
    /// Executions whose epoch the (truncated) timeline no longer shows.
    pub unverifiable: usize,
    /// Tasks whose timeline was truncated.
    pub truncated: usize,
    /// Log lines that did not parse.
    pub garbled_lines: usize,
    /// Milliseconds from the end of the nemesis to an empty queue.
    pub drain_ms: u64,
    /// Acknowledged enqueues not done at the end.
    pub lost: usize,
    /// Tasks done twice.
    pub done_twice: usize,
    /// Two executions of a task running at once, both under live leases.
    pub overlaps: usize,
    /// Executions that ran on after their epoch ended with no freeze or partition to
    /// excuse it.
    pub zombies_unexcused: usize,
    /// Dead tasks.
    pub dead: usize,
    /// Failures no fault explains.
    pub failures_unexplained: usize,
    /// Failures only a clean drain explains.
    pub failures_in_drain: usize,
    /// Programs SIGKILLed by a clean drain.
    pub drain_killed: usize,
    /// Drained agents that did not exit in time.
    pub drains_stuck: usize,
    /// Agents that exited on their own.
    pub crashes: usize,
    /// Leases granted to members silent past the liveness timeout.
    pub grants_to_silent: usize,
    /// Epochs ended twice, or ended after a later epoch was granted.
    pub settled_after_end: usize,
    /// Epochs granted while the previous one was live.
    pub granted_while_held: usize,
    /// Epochs acked although none of their executions ran to its end.
    pub done_without_end: usize,
    /// Tasks whose failure count differs from the failures their timeline shows.
    pub failures_untracked: usize,
    /// The first violations of each kind, described.
    pub details: Vec<String>,
    /// The first excused zombies, failures after recovery and hard stops outside drains,
    /// described (counted, not failed).
    pub notes: Vec<String>,
}

impl Report {
    /// Faults injected (leader faults included).
    pub fn faults(&self) -> usize {
        self.kill9 + self.kill9_main + self.term + self.freeze + self.partition + self.leader_faults
    }

    /// True if the run kept every promise.
    pub fn is_clean(&self) -> bool {
        self.lost == 0
            && self.done_twice == 0
            && self.overlaps == 0
            && self.zombies_unexcused == 0
            && self.zombies_cut_off == 0
            && self.dead == 0
            && self.failures_unexplained == 0
            && self.failures_in_drain == 0
            && self.drain_killed == 0
            && self.drains_stuck == 0
            && self.crashes == 0
            && self.grants_to_silent == 0
            && self.settled_after_end == 0
            && self.granted_while_held == 0
            && self.done_without_end == 0
            && self.failures_untracked == 0
    }

    fn violation(&mut self, kind: &str, text: String) {
        push_capped(&mut self.details, kind, text);
    }

    fn note(&mut self, kind: &str, text: String) {
        push_capped(&mut self.notes, kind, text);
    }
}

/// Adds `kind: text` unless `MAX_DETAILS` lines of that kind are there.
fn push_capped(lines: &mut Vec<String>, kind: &str, text: String) {
    let prefix = format!("{kind}: ");
    if lines.iter().filter(|d| d.starts_with(&prefix)).count() < MAX_DETAILS {
        lines.push(prefix + &text);
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "seed={} faults={} (kill9={} kill9_main={} term={} freeze={} partition={} leader={}) \
             restarts (same_name={} new_name={} retired={}) acknowledged={} indeterminate={} \
             tasks={} executions={} completions={} failures={} max_failures={} failures_after_recovery={} zombies_frozen={} \
             zombies_cut_off={} zombie_overlaps={} completed_twice={} hard_stops={} unverifiable={} truncated={} \
             garbled_lines={} drain_ms={} | lost={} done_twice={} overlaps={} \
             zombies_unexcused={} dead={} failures_unexplained={} failures_in_drain={} \
             drain_killed={} drains_stuck={} crashes={} grants_to_silent={} \
             settled_after_end={} granted_while_held={} done_without_end={} \
             failures_untracked={}",
            self.seed,
            self.faults(),
            self.kill9,
            self.kill9_main,
            self.term,
            self.freeze,
            self.partition,
            self.leader_faults,
            self.restarted_same_name,
            self.restarted_new_name,
            self.retired,
            self.acknowledged,
            self.indeterminate,
            self.tasks,
            self.executions,
            self.completions,
            self.failures,
            self.max_failures,
            self.failures_after_recovery,
            self.zombies_frozen,
            self.zombies_cut_off,
            self.zombie_overlaps,
            self.completed_twice,
            self.hard_stops,
            self.unverifiable,
            self.truncated,
            self.garbled_lines,
            self.drain_ms,
            self.lost,
            self.done_twice,
            self.overlaps,
            self.zombies_unexcused,
            self.dead,
            self.failures_unexplained,
            self.failures_in_drain,
            self.drain_killed,
            self.drains_stuck,
            self.crashes,
            self.grants_to_silent,
            self.settled_after_end,
            self.granted_while_held,
            self.done_without_end,
            self.failures_untracked
        )
    }
}

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as u64
}

/// Which program an agent is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AgentKind {
    /// `muster work` running [`PROGRAM`] per task.
    Work,
    /// The SDK's `Worker` in `chaos_agent`.
    Sdk,
}

/// What happens to a member after a kill or a drain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Comeback {
    SameName,
    NewName,
    /// The name is never used again; the slot stays empty for a while.
    Retired,
}

/// Where a slot's agent is.
#[derive(Debug, Clone, Copy)]
enum Phase {
    Up { since: Instant },
    Frozen { until: Instant, fault: usize },
    Partitioned { until: Instant, fault: usize },
    Draining { deadline: Instant, fault: usize },
    Down { at: Instant, comeback: Comeback },
}

/// One agent place: its relay, its current member name and process.
struct Slot {
    kind: AgentKind,
    index: usize,
    /// One relay per node (one for a single daemon).
    relays: Vec<Relay>,
    member: String,
    generation: u32,
    proc: Option<Proc>,
    /// Index of the running process's [`Life`].
    life: Option<usize>,
    phase: Phase,
    /// Wall ms after which the member is past every fault window (a drain then is clean).
    quiet_after_ms: u64,
}

/// Paths and settings every agent process shares.
struct AgentEnv {
    dir: PathBuf,
    log: PathBuf,
    program: PathBuf,
    daemon_data: PathBuf,
    capacity: u32,
}

/// The nemesis and the agents it owns.
struct Nemesis {
    rng: StdRng,
    env: AgentEnv,
    slots: Vec<Slot>,
    faults: Vec<Fault>,
    lives: Vec<Life>,
    report: Report,
    /// Set when the nemesis stops: everything is healed and restarted at once.
    healing: bool,
}

/// The exit status of the process if it has exited (reaping it), whether by a code or
/// by a signal (which `Proc::wait` does not tell apart from still running).
fn exit_status(p: &mut Proc) -> Option<std::process::ExitStatus> {
    p.child.try_wait().expect("try_wait on an agent")
}

fn window_end(f: &Fault, lease_ms: u64, liveness_ms: u64) -> u64 {
    f.end_ms + lease_ms + liveness_ms + WINDOW_SLACK_MS
}

/// The end of the window in which member fault `f` explains what its member's leases
/// suffered: [`window_end`], pushed out by each leader fault that overlaps it. A new
/// leader starts every held lease afresh (a full period from its own start, before
/// the leader fault ends), so a lease the member fault cost lapses up to a lease after.
fn excuse_end(f: &Fault, h: &History) -> u64 {
    let mut end = window_end(f, h.lease_ms, h.liveness_ms);
    for &(start, stop) in &h.leader_faults {
        if start <= end && stop + CLOCK_SLACK_MS >= f.start_ms {
            end = end.max(stop + h.lease_ms + WINDOW_SLACK_MS);
        }
    }
    end
}

impl Nemesis {
    fn spawn(&mut self, i: usize) {
        let slot = &self.slots[i];
        let env = &self.env;
        let capacity = env.capacity.to_string();
        let stderr = env
            .dir
            .join(format!("{}.stderr", slot.member.replace('/', "_")));
        // `exec` keeps the pid, so the agent leads the process group Proc made.
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg("exec \"$@\" 2>>\"$0\"").arg(&stderr);
        match slot.kind {
            AgentKind::Work => {
                cmd.arg(crate::muster_bin())
                    .args(["work", QUEUE, "--member", &slot.member])
                    .args(["--capacity", &capacity, "--grace", GRACE, "--", "sh"])
                    .arg(&env.program)
                    .arg(&env.log)
                    .arg(&slot.member);
            }
            AgentKind::Sdk => {
                cmd.arg(crate::chaos_agent_bin())
                    .args([&slot.member, QUEUE, &capacity])
                    .arg(&env.log);
            }
        }
        let addrs: Vec<String> = slot.relays.iter().map(|r| r.addr().to_string()).collect();
        cmd.env("MUSTER_ADDR", addrs.join(","))
            .env("MUSTER_DATA", &env.daemon_data)
            .env("MUSTER_LOG", "info")
            .env("RUST_LOG", "info")
            .env_remove("MUSTER_PIN")
            .env_remove("MUSTER_CA")
            .env_remove("MUSTER_TOKEN");
        let proc = Proc::spawn(cmd);
        self.lives.push(Life {
            member: slot.member.clone(),
            start_ms: wall_ms(),
            end_ms: None,
        });
        let life = self.lives.len() - 1;
        let slot = &mut self.slots[i];
        slot.proc = Some(proc);
        slot.life = Some(life);
        slot.phase = Phase::Up {
            since: Instant::now(),
        };
    }

    /// The slot's process is gone (at `at_ms`): end its life, plan its comeback.
    fn gone(&mut self, i: usize, at_ms: u64) {
        let comeback = match self.rng.random_range(0..100) {
            0..45 => Comeback::SameName,
            45..80 => Comeback::NewName,
            _ => Comeback::Retired,
        };
        let delay = match comeback {
            Comeback::Retired => RETIRED_MS,
            _ => RESTART_MS,
        };
        let at = Instant::now() + Duration::from_millis(self.rng.random_range(delay));
        let slot = &mut self.slots[i];
        if let Some(life) = slot.life.take() {
            self.lives[life].end_ms = Some(at_ms);
        }
        slot.proc = None;
        slot.phase = Phase::Down { at, comeback };
    }

    fn record(&mut self, kind: FaultKind, i: usize, start_ms: u64) -> usize {
        self.faults.push(Fault {
            kind,
            member: self.slots[i].member.clone(),
            start_ms,
            end_ms: start_ms,
        });
        self.faults.len() - 1
    }

    fn end_fault(&mut self, i: usize, fault: usize, end_ms: u64) {
        let f = &mut self.faults[fault];
        f.end_ms = end_ms;
        if f.kind.excuses_failures() {
            let quiet = window_end(f, LEASE_MS, LIVENESS_MS);
            let slot = &mut self.slots[i];
            slot.quiet_after_ms = slot.quiet_after_ms.max(quiet);
        }
    }

    /// Heals, wakes, reaps and restarts whatever is due.
    fn tick(&mut self) {
        for i in 0..self.slots.len() {
            let now = Instant::now();
            match self.slots[i].phase {
                Phase::Up { .. } => {
                    if let Some(status) = self.slots[i].proc.as_mut().and_then(exit_status) {
                        let at = wall_ms();
                        eprintln!(
                            "agent_chaos: {} exited on its own ({status})",
                            self.slots[i].member
                        );
                        self.report.crashes += 1;
                        let fault = self.record(FaultKind::Crash, i, at);
                        self.end_fault(i, fault, at);
                        self.gone(i, at);
                    }
                }
                Phase::Frozen { until, fault } if now >= until || self.healing => {
                    if let Some(p) = &self.slots[i].proc {
                        p.signal("-CONT");
                    }
                    self.end_fault(i, fault, wall_ms());
                    self.slots[i].phase = Phase::Up { since: now };
                }
                Phase::Partitioned { until, fault } if now >= until || self.healing => {
                    for relay in &self.slots[i].relays {
                        relay.heal();
                    }
                    self.end_fault(i, fault, wall_ms());
                    self.slots[i].phase = Phase::Up { since: now };
                }
                Phase::Draining { deadline, fault } => {
                    if self.slots[i].proc.as_mut().and_then(exit_status).is_some() {
                        let at = wall_ms();
                        self.end_fault(i, fault, at);
                        self.gone(i, at);
                    } else if now >= deadline {
                        eprintln!(
                            "agent_chaos: {} still running {DRAIN_EXIT_TIMEOUT:?} after SIGTERM; kill -9",
                            self.slots[i].member
                        );
                        self.report.drains_stuck += 1;
                        let at = wall_ms();
                        if let Some(p) = self.slots[i].proc.as_mut() {
                            p.kill9();
                        }
                        self.end_fault(i, fault, at);
                        let kill = self.record(FaultKind::Kill9, i, at);
                        self.end_fault(i, kill, at);
                        self.gone(i, at);
                    }
                }
                Phase::Down { at, comeback } if now >= at || self.healing => {
                    match comeback {
                        Comeback::SameName => self.report.restarted_same_name += 1,
                        Comeback::NewName => self.report.restarted_new_name += 1,
                        Comeback::Retired => self.report.retired += 1,
                    }
                    let slot = &mut self.slots[i];
                    if comeback != Comeback::SameName {
                        slot.generation += 1;
                        slot.member = member_name(slot.kind, slot.index, slot.generation);
                        slot.quiet_after_ms = 0;
                    }
                    self.spawn(i);
                }
                _ => {}
            }
        }
    }

    /// Injects one fault, if some agent may take one. Returns whether it did.
    fn inject(&mut self) -> bool {
        let kind = match self.rng.random_range(0..100) {
            0..20 => FaultKind::Kill9,
            20..30 => FaultKind::Kill9Main,
            30..55 => FaultKind::Term,
            55..75 => FaultKind::Freeze,
            _ => FaultKind::Partition,
        };
        let now_ms = wall_ms();
        let up: Vec<usize> = (0..self.slots.len())
            .filter(|&i| matches!(self.slots[i].phase, Phase::Up { .. }))
            .collect();
        if up.len() <= MIN_HEALTHY {
            return false;
        }
        let candidates: Vec<usize> = up
            .into_iter()
            .filter(|&i| {
                let s = &self.slots[i];
                matches!(s.phase, Phase::Up { since } if since.elapsed() >= MIN_UPTIME)
                    && (kind != FaultKind::Kill9Main || s.kind == AgentKind::Work)
                    && (kind != FaultKind::Term || now_ms > s.quiet_after_ms)
            })
            .collect();
        if candidates.is_empty() {
            return false;
        }
        let i = candidates[self.rng.random_range(0..candidates.len())];
        let start = wall_ms();
        let fault = self.record(kind, i, start);
        let slot = &mut self.slots[i];
        let proc = slot
            .proc
            .as_mut()
            .expect("an agent that is up has a process");
        let now = Instant::now();
        println!(
            "agent_chaos: fault {} at {start}: {kind:?} {}",
            self.faults.len(),
            slot.member
        );
        match kind {
            FaultKind::Kill9 => {
                proc.kill9();
                self.end_fault(i, fault, start);
                self.gone(i, start);
                self.report.kill9 += 1;
            }
            FaultKind::Kill9Main => {
                signal_pid(proc.pid(), "-KILL");
                let deadline = Instant::now() + REAP_TIMEOUT;
                while exit_status(proc).is_none() {
                    assert!(
                        Instant::now() < deadline,
                        "a process killed with -9 not reaped within {REAP_TIMEOUT:?}"
                    );
                    std::thread::sleep(NEMESIS_TICK);
                }
                self.end_fault(i, fault, start);
                self.gone(i, start);
                self.report.kill9_main += 1;
            }
            FaultKind::Term => {
                signal_pid(proc.pid(), "-TERM");
                slot.phase = Phase::Draining {
                    deadline: now + DRAIN_EXIT_TIMEOUT,
                    fault,
                };
                self.report.term += 1;
            }
            FaultKind::Freeze => {
                proc.signal("-STOP");
                let pause = Duration::from_millis(self.rng.random_range(FREEZE_MS));
                slot.phase = Phase::Frozen {
                    until: now + pause,
                    fault,
                };
                self.report.freeze += 1;
            }
            FaultKind::Partition => {
                for relay in &slot.relays {
                    relay.partition();
                }
                let pause = Duration::from_millis(self.rng.random_range(PARTITION_MS));
                slot.phase = Phase::Partitioned {
                    until: now + pause,
                    fault,
                };
                self.report.partition += 1;
            }
            FaultKind::Crash => unreachable!("crashes are not injected"),
        }
        true
    }

    /// Injects faults at random intervals, `faults` of them or for `run_for`.
    fn run(&mut self, faults: usize, run_for: Option<Duration>) {
        let started = Instant::now();
        let mut next = started + self.pause();
        loop {
            self.tick();
            let more = match run_for {
                Some(d) => started.elapsed() < d,
                None => self.report.faults() < faults,
            };
            if !more {
                break;
            }
            // When no agent may take a fault now, the next tick tries again.
            if Instant::now() >= next && self.inject() {
                next = Instant::now() + self.pause();
            }
            // The nemesis's clock: how precisely heals and restarts land.
            std::thread::sleep(NEMESIS_TICK);
        }
    }

    fn pause(&mut self) -> Duration {
        Duration::from_millis(self.rng.random_range(FAULT_PAUSE_MS))
    }

    /// Heals every partition, wakes every frozen agent, waits for drained agents to
    /// exit (bounded by their deadline) and starts every slot again: all agents run.
    fn heal_all(&mut self) {
        self.healing = true;
        let deadline = Instant::now() + DRAIN_EXIT_TIMEOUT + REAP_TIMEOUT;
        loop {
            self.tick();
            if self
                .slots
                .iter()
                .all(|s| matches!(s.phase, Phase::Up { .. }))
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "agents not all up again within {:?}",
                DRAIN_EXIT_TIMEOUT + REAP_TIMEOUT
            );
            std::thread::sleep(NEMESIS_TICK);
        }
    }
}

/// A relay in front of each of `upstreams`.
async fn relay_each(upstreams: &[SocketAddr]) -> Vec<Relay> {
    let mut relays = Vec::new();
    for &upstream in upstreams {
        relays.push(Relay::start(upstream).await.expect("starting a relay"));
    }
    relays
}

fn member_name(kind: AgentKind, index: usize, generation: u32) -> String {
    match kind {
        AgentKind::Work => format!("work-{index}-{generation}"),
        AgentKind::Sdk => format!("sdk-{index}-{generation}"),
    }
}

/// Enqueues paced tasks until `stop`, connecting again (to the new leader, on a
/// cluster) whenever the connection is lost: a reply that never came, `not_leader` and
/// `outcome_unknown` are indeterminate.
async fn produce(
    id: u64,
    mut rng: StdRng,
    options: muster_sdk::ConnectOptions,
    stop: Arc<AtomicBool>,
) -> Produced {
    let mut out = Produced::default();
    let mut client: Option<Client> = None;
    let mut n = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let Some(c) = client.clone() else {
            match tokio::time::timeout(CALL_TIMEOUT, Client::connect(options.clone())).await {
                Ok(Ok(c)) => client = Some(c),
                // Between leaders: the pause bounds the loop's pace.
                _ => tokio::time::sleep(RECONNECT_PAUSE).await,
            }
            continue;
        };
        n += 1;
        let ms = rng.random_range(WORK_MS);
        let payload = muster_sdk::json(&serde_json::json!({"p": id, "n": n, "ms": ms}))
            .expect("payload is JSON");
        match tokio::time::timeout(CALL_TIMEOUT, c.enqueue(QUEUE, NewTask::new(payload))).await {
            Ok(Ok(task)) => out.acked.push(task.id),
            Ok(Err(e))
                if e.code().is_some_and(|code| {
                    !matches!(code, ErrorCode::NotLeader | ErrorCode::OutcomeUnknown)
                }) =>
            {
                panic!("the daemon refused enqueue {id}/{n}: {e}")
            }
            Ok(Err(_)) | Err(_) => {
                out.indeterminate += 1;
                client = None;
            }
        }
        let pause = rng.random_range(PRODUCE_PAUSE_MS);
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
    out
}

/// What a producer did.
#[derive(Debug, Default)]
struct Produced {
    acked: Vec<String>,
    indeterminate: usize,
}

/// Runs the whole test: daemon, queue, relays, agents, producers, nemesis, drain,
/// analysis.
pub async fn run(config: Config) -> Report {
    let length = match config.run_for {
        Some(d) => format!("run_for={d:?}"),
        None => format!("faults={}", config.faults),
    };
    println!(
        "agent_chaos: seed={} {length} lease_ms={LEASE_MS} liveness_ms={LIVENESS_MS} cluster={}",
        config.seed, config.cluster
    );
    let run_started = Instant::now();
    let backend = if config.cluster {
        let cluster = Cluster::start_relayed(CLUSTER_NODES).await;
        // A node names the leader by its advertised address, the relay in front of
        // the leader's client port; an agent cut off from its own relays could reach
        // the leader through that one, and a partition would not cut it off. Those
        // relays are blackholed for the whole run, so an agent reaches a node only
        // through its own relays (and a hint is a dead end it gives up on).
        for id in cluster.node_ids() {
            cluster.cut_clients(id);
        }
        Backend::Cluster(cluster)
    } else {
        Backend::Daemon(Daemon::start())
    };
    let client = backend.client().await;
    client
        .queue_create(
            QUEUE,
            QueuePatch {
                lease_ms: Some(LEASE_MS),
                max_attempts: Some(0),
                retry_backoff: Some(Backoff {
                    base_ms: 200,
                    factor: 1.0,
                    cap_ms: 200,
                    jitter: 0.0,
                }),
                ..QueuePatch::default()
            },
        )
        .await
        .expect("creating the queue");
    let dir = tempfile::tempdir().expect("a directory for the run");
    let log = dir.path().join("executions.log");
    let program = dir.path().join("task.sh");
    std::fs::write(&program, PROGRAM).expect("writing the task program");
    std::fs::write(&log, "").expect("creating the log");
    let upstreams = backend.upstreams();

    let mut seeds = StdRng::seed_from_u64(config.seed);
    let mut slots = Vec::new();
    let kinds = std::iter::repeat_n(AgentKind::Work, config.work_agents)
        .chain(std::iter::repeat_n(AgentKind::Sdk, config.sdk_agents));
    for (index, kind) in kinds.enumerate() {
        slots.push(Slot {
            kind,
            index,
            relays: relay_each(&upstreams).await,
            member: member_name(kind, index, 0),
            generation: 0,
            proc: None,
            life: None,
            phase: Phase::Up {
                since: Instant::now(),
            },
            quiet_after_ms: 0,
        });
    }
    let mut nemesis = Nemesis {
        rng: StdRng::seed_from_u64(seeds.random()),
        env: AgentEnv {
            dir: dir.path().to_path_buf(),
            log: log.clone(),
            program,
            daemon_data: backend.trust_dir(),
            capacity: config.capacity,
        },
        slots,
        faults: Vec::new(),
        lives: Vec::new(),
        report: Report {
            seed: config.seed,
            ..Report::default()
        },
        healing: false,
    };
    for i in 0..nemesis.slots.len() {
        nemesis.spawn(i);
    }

    let stop = Arc::new(AtomicBool::new(false));
    let mut producers = Vec::new();
    for p in 0..config.producers {
        producers.push(tokio::spawn(produce(
            p as u64,
            StdRng::seed_from_u64(seeds.random()),
            backend.options(),
            Arc::clone(&stop),
        )));
    }
    // On a cluster, the leader's nemesis owns the cluster while it runs.
    let stop_leaders = Arc::new(AtomicBool::new(false));
    let (backend, leaders) = match backend {
        Backend::Cluster(cluster) => (
            None,
            Some(tokio::spawn(fault_leaders(
                cluster,
                StdRng::seed_from_u64(seeds.random()),
                Arc::clone(&stop_leaders),
            ))),
        ),
        daemon => (Some(daemon), None),
    };

    let (faults, run_for) = (config.faults, config.run_for);
    let mut nemesis = tokio::task::spawn_blocking(move || {
        nemesis.run(faults, run_for);
        nemesis.heal_all();
        nemesis
    })
    .await
    .expect("nemesis thread");
    println!(
        "agent_chaos: nemesis done after {:?}; every agent healed and up",
        run_started.elapsed()
    );
    stop_leaders.store(true, Ordering::SeqCst);
    let (backend, leader_faults) = match (backend, leaders) {
        (_, Some(task)) => {
            let (cluster, faults) = task.await.expect("the leaders' nemesis");
            (Backend::Cluster(cluster), faults)
        }
        (Some(daemon), None) => (daemon, Vec::new()),
        (None, None) => unreachable!("a run has a daemon or a cluster"),
    };
    // The first client may have lost its leader.
    let client = backend.client().await;
    stop.store(true, Ordering::SeqCst);
    let mut acked = Vec::new();
    for p in producers {
        let produced = p.await.expect("producer");
        acked.extend(produced.acked);
        nemesis.report.indeterminate += produced.indeterminate;
    }

    let drain_started = Instant::now();
    loop {
        let c = client
            .queue_describe(QUEUE)
            .await
            .expect("describing the queue")
            .counts;
        if c.scheduled + c.ready + c.leased == 0 {
            break;
        }
        if drain_started.elapsed() >= DRAIN_TIMEOUT {
            eprintln!("agent_chaos: queue not drained within {DRAIN_TIMEOUT:?}: {c:?}");
            break;
        }
        tokio::time::sleep(DRAIN_POLL).await;
    }
    let drain_ms = drain_started.elapsed().as_millis() as u64;
    println!("agent_chaos: drained in {drain_ms} ms");

    // Stop every agent (kill -9 of each group: nothing is leased any more) and read
    // what the executions logged.
    let Nemesis {
        slots,
        faults,
        lives,
        report,
        ..
    } = nemesis;
    drop(slots);
    let log_text = std::fs::read_to_string(&log).expect("reading the executions log");

    let mut ids: Vec<String> = acked.clone();
    ids.extend(log_tasks(&log_text));
    ids.sort();
    ids.dedup();
    let mut tasks = HashMap::new();
    let mut timelines = String::new();
    for id in ids {
        match client.task_get(&id).await {
            Ok(t) => {
                timelines += &serde_json::to_string(&t).expect("a task as JSON");
                timelines.push('\n');
                tasks.insert(id, TaskRecord::from(t));
            }
            Err(e) if e.code() == Some(ErrorCode::NotFound) => {}
            Err(e) => panic!("task_get {id}: {e}"),
        }
    }
    let nemesis_record =
        format!("faults:\n{faults:#?}\nleader faults:\n{leader_faults:#?}\nlives:\n{lives:#?}\n");
    let history = History {
        lease_ms: LEASE_MS,
        liveness_ms: LIVENESS_MS,
        acked,
        tasks,
        log: log_text,
        faults,
        leader_faults: leader_faults
            .iter()
            .map(|f| (f.start_ms, f.end_ms))
            .collect(),
        lives,
    };
    let mut analysed = analyse(&history);
    analysed.seed = report.seed;
    analysed.kill9 = report.kill9;
    analysed.kill9_main = report.kill9_main;
    analysed.term = report.term;
    analysed.freeze = report.freeze;
    analysed.partition = report.partition;
    analysed.leader_faults = leader_faults.len();
    analysed.restarted_same_name = report.restarted_same_name;
    analysed.restarted_new_name = report.restarted_new_name;
    analysed.retired = report.retired;
    analysed.indeterminate = report.indeterminate;
    analysed.drains_stuck = report.drains_stuck;
    analysed.crashes = report.crashes;
    analysed.drain_ms = drain_ms;
    for n in &analysed.notes {
        println!("agent_chaos: counted: {n}");
    }
    for d in &analysed.details {
        eprintln!("agent_chaos: violation: {d}");
    }
    println!("agent_chaos: {analysed}");
    println!("agent_chaos: run took {:?}", run_started.elapsed());
    if !analysed.is_clean() || std::env::var_os("MUSTER_AGENT_CHAOS_KEEP").is_some() {
        for (name, text) in backend.logs() {
            let _ = std::fs::write(dir.path().join(name), text);
        }
        let _ = std::fs::write(dir.path().join("timelines.jsonl"), timelines);
        let _ = std::fs::write(dir.path().join("nemesis.txt"), nemesis_record);
        let kept = dir.keep();
        eprintln!(
            "agent_chaos: the executions' log, the timelines, the faults, the agents' stderr and the daemon's log are in {}",
            kept.display()
        );
    }
    analysed
}

/// Task ids named in the log.
fn log_tasks(log: &str) -> HashSet<String> {
    log.lines()
        .filter_map(|l| l.split_whitespace().nth(1).map(str::to_owned))
        .collect()
}

/// How an execution's log ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// Only ticks: killed hard (or still running when the agents were stopped).
    Hard,
    /// Ran to its end.
    End,
    /// Stopped by SIGTERM.
    Term,
    /// An SDK handler saw its cancellation.
    Cancelled,
    /// An SDK handler was dropped unfinished.
    Dropped,
}

/// One execution of one task's epoch, from the log.
#[derive(Debug, Clone)]
struct Execution {
    task: String,
    epoch: u64,
    member: String,
    start_ms: u64,
    /// Its last line: its end, or a lower bound of it.
    last_ms: u64,
    stop: Stop,
}

/// Parses the log; lines that do not parse are counted in `garbled`.
fn parse_log(log: &str, garbled: &mut usize) -> Vec<Execution> {
    let mut by_exec: HashMap<&str, usize> = HashMap::new();
    let mut out: Vec<Execution> = Vec::new();
    for line in log.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let parsed = match f.as_slice() {
            [kind, task, epoch, ms, exec, rest @ ..] => {
                match (epoch.parse::<u64>(), ms.parse::<u64>()) {
                    (Ok(epoch), Ok(ms)) => Some((*kind, *task, epoch, ms, *exec, rest)),
                    _ => None,
                }
            }
            _ => None,
        };
        let Some((kind, task, epoch, ms, exec, rest)) = parsed else {
            *garbled += 1;
            continue;
        };
        if kind == "start" {
            match (by_exec.get(exec), rest.first()) {
                (None, Some(member)) => {
                    by_exec.insert(exec, out.len());
                    out.push(Execution {
                        task: task.to_owned(),
                        epoch,
                        member: (*member).to_owned(),
                        start_ms: ms,
                        last_ms: ms,
                        stop: Stop::Hard,
                    });
                }
                _ => *garbled += 1,
            }
            continue;
        }
        let Some(e) = by_exec.get(exec).map(|&i| &mut out[i]) else {
            *garbled += 1;
            continue;
        };
        if e.task != task || e.epoch != epoch {
            *garbled += 1;
            continue;
        }
        e.last_ms = e.last_ms.max(ms);
        e.stop = match kind {
            "tick" => e.stop,
            "end" => Stop::End,
            "term" => Stop::Term,
            "cancelled" => Stop::Cancelled,
            "dropped" => Stop::Dropped,
            _ => {
                *garbled += 1;
                e.stop
            }
        };
    }
    out
}

/// One task's timeline, by epoch.
#[derive(Debug, Default)]
struct Timeline {
    /// Epoch → when it was granted, to whom.
    grants: BTreeMap<u64, (u64, String)>,
    /// Epoch → when it ended, how (the first ending; later ones are violations).
    ends: BTreeMap<u64, (u64, String)>,
    /// Failures: when, whose, which epoch, what.
    failures: Vec<(u64, String, u64, String)>,
    dones: usize,
    dead_lettered: usize,
}

/// Events that end the epoch they name.
const ENDINGS: [&str; 7] = [
    "done",
    "nacked",
    "released",
    "lapsed",
    "revoked",
    "dead_lettered",
    "cancelled",
];

impl Timeline {
    fn of(id: &str, t: &TaskRecord, r: &mut Report) -> Timeline {
        let mut tl = Timeline::default();
        for e in &t.history {
            let member = e.member.clone().unwrap_or_default();
            match (e.event.as_str(), e.epoch) {
                ("leased" | "reclaimed" | "redelivered", Some(epoch)) => {
                    if tl.grants.contains_key(&epoch) {
                        r.granted_while_held += 1;
                        r.violation(
                            "granted_while_held",
                            format!("{id}: epoch {epoch} granted twice"),
                        );
                    }
                    let previous = epoch.saturating_sub(1);
                    if tl.grants.contains_key(&previous) && !tl.ends.contains_key(&previous) {
                        if e.event == "reclaimed" {
                            // The restarted member's old epoch ends here, as a failure.
                            tl.ends.insert(previous, (e.at_ms, e.event.clone()));
                            tl.failures
                                .push((e.at_ms, member.clone(), previous, e.event.clone()));
                        } else if e.event == "redelivered" {
                            // Its agent never heard of the old epoch: it ends here, no
                            // failure counted.
                            tl.ends.insert(previous, (e.at_ms, e.event.clone()));
                        } else {
                            r.granted_while_held += 1;
                            r.violation("granted_while_held", format!(
                                "{id}: epoch {epoch} granted to {member} at {} while epoch {previous} was live",
                                e.at_ms
                            ));
                        }
                    } else if e.event == "reclaimed" && !tl.grants.contains_key(&previous) {
                        // The old epoch is before the visible timeline: still a failure.
                        tl.failures
                            .push((e.at_ms, member.clone(), previous, e.event.clone()));
                    }
                    tl.grants.insert(epoch, (e.at_ms, member));
                }
                (kind, Some(epoch)) if ENDINGS.contains(&kind) => {
                    let later = tl.grants.range(epoch + 1..).next().is_some();
                    if tl.ends.contains_key(&epoch) || later {
                        r.settled_after_end += 1;
                        r.violation(
                            "settled_after_end",
                            format!(
                                "{id}: epoch {epoch} {kind} at {} by {member} after it had ended",
                                e.at_ms
                            ),
                        );
                    }
                    // The daemon held the epoch live until its first ending, even if it
                    // granted a later one meanwhile.
                    tl.ends
                        .entry(epoch)
                        .or_insert_with(|| (e.at_ms, kind.to_owned()));
                    if matches!(kind, "lapsed" | "revoked" | "nacked") {
                        tl.failures
                            .push((e.at_ms, member.clone(), epoch, kind.to_owned()));
                    }
                    if kind == "done" {
                        tl.dones += 1;
                    }
                    if kind == "dead_lettered" {
                        tl.dead_lettered += 1;
                    }
                }
                ("dead_lettered", None) => tl.dead_lettered += 1,
                _ => {}
            }
        }
        tl
    }

    /// When `epoch` ended: its ending event, else the grant of a later epoch.
    fn end_of(&self, epoch: u64) -> Option<(u64, &str)> {
        if let Some((at, how)) = self.ends.get(&epoch) {
            return Some((*at, how.as_str()));
        }
        self.grants
            .range(epoch + 1..)
            .next()
            .map(|(_, (at, _))| (*at, "regranted"))
    }
}

/// Judges a run's history. Counts of faults, restarts and drains are the nemesis's and
/// are filled in by [`run`].
fn analyse(h: &History) -> Report {
    let liveness = h.liveness_ms;
    let mut r = Report::default();
    let executions = parse_log(&h.log, &mut r.garbled_lines);
    r.executions = executions.len();
    r.acknowledged = h.acked.len();
    r.tasks = h.tasks.len();

    // 1. Lost.
    for id in &h.acked {
        match h.tasks.get(id) {
            Some(t) if t.state == TaskState::Done => {}
            Some(t) => {
                r.lost += 1;
                r.violation(
                    "lost",
                    format!("{id}: acknowledged, {} at the end", t.state),
                );
            }
            None => {
                r.lost += 1;
                r.violation(
                    "lost",
                    format!("{id}: acknowledged, unknown to the daemon at the end"),
                );
            }
        }
    }

    let member_faults = |member: &str, at: u64, pred: fn(FaultKind) -> bool| {
        h.faults.iter().any(|f| {
            f.member == member
                && pred(f.kind)
                && f.start_ms <= at + CLOCK_SLACK_MS
                && at <= excuse_end(f, h)
        })
    };
    let excused = |member: &str, at: u64| member_faults(member, at, FaultKind::excuses_failures);

    let mut timelines = HashMap::new();
    let mut ids: Vec<&String> = h.tasks.keys().collect();
    ids.sort();
    for id in ids {
        let t = &h.tasks[id];
        let tl = Timeline::of(id, t, &mut r);
        r.failures += t.failures;
        r.max_failures = r.max_failures.max(t.failures);
        if (tl.grants.len() as u64) < t.deliveries {
            r.truncated += 1;
        } else if tl.failures.len() as u64 != t.failures {
            r.failures_untracked += 1;
            r.violation(
                "failures_untracked",
                format!(
                    "{id}: {} failures counted, {} in its timeline",
                    t.failures,
                    tl.failures.len()
                ),
            );
        }
        // 4. Dead.
        if t.state == TaskState::Dead || tl.dead_lettered > 0 {
            r.dead += 1;
            r.violation("dead", format!("{id}: dead ({} at the end)", t.state));
        }
        // 2. Two dones.
        if tl.dones > 1 {
            r.done_twice += 1;
            r.violation("done_twice", format!("{id}: done {} times", tl.dones));
        }
        // 5. Every failure explained by a fault of its member.
        for (at, member, epoch, how) in &tl.failures {
            if excused(member, *at) {
                // Excused; but was the lease granted while the fault could explain its
                // loss (before it ended, or before the daemon could tell a silent
                // member), or to an agent that was back and reachable?
                let granted = tl.grants.get(epoch).map(|(g, _)| *g);
                let explains = |f: &Fault| {
                    f.member == *member
                        && f.kind.excuses_failures()
                        && f.start_ms <= at + CLOCK_SLACK_MS
                        && *at <= excuse_end(f, h)
                        && granted.is_none_or(|g| {
                            g <= f.end_ms.max(f.start_ms + liveness) + WINDOW_SLACK_MS
                        })
                };
                if !h.faults.iter().any(explains) {
                    r.failures_after_recovery += 1;
                    r.note(
                        "failures_after_recovery",
                        format!(
                            "{id}: epoch {epoch} granted at {} {how} at {at} by {member}, back from its fault by then",
                            granted.unwrap_or_default()
                        ),
                    );
                }
                continue;
            }
            if member_faults(member, *at, |k| k == FaultKind::Term) {
                r.failures_in_drain += 1;
                r.violation(
                    "failures_in_drain",
                    format!(
                        "{id}: epoch {epoch} {how} at {at} by {member}, which was only drained"
                    ),
                );
            } else {
                r.failures_unexplained += 1;
                r.violation(
                    "failures_unexplained",
                    format!(
                        "{id}: epoch {epoch} {how} at {at} by {member:?}, which had no fault then"
                    ),
                );
            }
        }
        // Leases granted to silent members.
        for (epoch, (at, member)) in &tl.grants {
            if let Some(since) = silent_since(h, member, *at)
                && *at > since + liveness + WINDOW_SLACK_MS
            {
                r.grants_to_silent += 1;
                r.violation(
                    "grants_to_silent",
                    format!(
                        "{id}: epoch {epoch} granted at {at} to {member}, silent since {since}"
                    ),
                );
            }
        }
        timelines.insert(id.as_str(), tl);
    }

    // Executions against the timelines.
    let mut by_task: BTreeMap<&str, Vec<&Execution>> = BTreeMap::new();
    for e in &executions {
        by_task.entry(e.task.as_str()).or_default().push(e);
    }
    for (id, execs) in &by_task {
        let Some(tl) = timelines.get(id) else {
            r.unverifiable += execs.len();
            continue;
        };
        // Each execution with the end of its epoch, if the timeline shows it.
        let mut judged: Vec<(&Execution, u64, &str)> = Vec::new();
        for e in execs {
            if e.stop == Stop::End {
                r.completions += 1;
            }
            judge_stop(h, e, &mut r);
            match tl.end_of(e.epoch) {
                Some((end, how)) => judged.push((e, end, how)),
                None => r.unverifiable += 1,
            }
        }
        // 3. Zombies: running on after the epoch ended.
        for (e, end, how) in &judged {
            if e.last_ms <= end + CLOCK_SLACK_MS {
                continue;
            }
            // The excusing fault, and how long the execution ran once it was over.
            let excuse = |kind: FaultKind| {
                h.faults.iter().find(|f| {
                    f.member == e.member
                        && f.kind == kind
                        && f.start_ms <= end + CLOCK_SLACK_MS
                        && *end <= excuse_end(f, h)
                })
            };
            let text = |f: &Fault| {
                format!(
                    "{id}: epoch {} on {} ran until {} ms after it ended ({how} at {end}), {} ms after the {:?} ended",
                    e.epoch,
                    e.member,
                    e.last_ms - end,
                    e.last_ms as i64 - f.end_ms as i64,
                    f.kind
                )
            };
            if let Some(f) = excuse(FaultKind::Freeze) {
                r.zombies_frozen += 1;
                r.note("zombies_frozen", text(f));
            } else if let Some(f) = excuse(FaultKind::Partition) {
                // An agent cut off must stop its work by its own clock before the lease
                // can lapse: running on is a violation, not an excuse.
                r.zombies_cut_off += 1;
                r.violation("zombies_cut_off", text(f));
            } else {
                r.zombies_unexcused += 1;
                r.violation("zombies_unexcused", format!(
                    "{id}: epoch {} ran on {} ms on {} after it ended ({how} at {end}) with no freeze or partition",
                    e.epoch,
                    e.last_ms - end,
                    e.member
                ));
            }
        }
        // 3. Overlaps of live parts; zombie parts overlapping are counted apart.
        for (i, (a, a_end, _)) in judged.iter().enumerate() {
            for (b, b_end, _) in &judged[i + 1..] {
                let a_live = a.last_ms.min(*a_end);
                let b_live = b.last_ms.min(*b_end);
                if a.start_ms.max(b.start_ms) + CLOCK_SLACK_MS < a_live.min(b_live) {
                    r.overlaps += 1;
                    r.violation("overlaps", format!(
                        "{id}: epoch {} on {} [{}, {}] and epoch {} on {} [{}, {}] ran at once, both live",
                        a.epoch, a.member, a.start_ms, a_live, b.epoch, b.member, b.start_ms, b_live
                    ));
                } else if overlap(*a_end, a.last_ms, b.start_ms, b.last_ms)
                    || overlap(*b_end, b.last_ms, a.start_ms, a.last_ms)
                {
                    r.zombie_overlaps += 1;
                }
            }
        }
        // 2. Run to the end under two live leases.
        let completed: Vec<&(&Execution, u64, &str)> = judged
            .iter()
            .filter(|(e, end, _)| e.stop == Stop::End && e.last_ms <= end + CLOCK_SLACK_MS)
            .collect();
        if completed.len() > 1 {
            let unexcused = completed
                .iter()
                .find(|(e, end, how)| *how != "done" && !excused(&e.member, *end));
            match unexcused {
                Some((e, end, how)) => {
                    r.done_twice += 1;
                    r.violation("done_twice", format!(
                        "{id}: run to its end {} times under live leases; epoch {} on {} ended {how} at {end} with no fault",
                        completed.len(),
                        e.epoch,
                        e.member
                    ));
                }
                None => r.completed_twice += 1,
            }
        }
        // Acked epochs were run to their end.
        for (epoch, (at, how)) in &tl.ends {
            if how == "done"
                && !execs
                    .iter()
                    .any(|e| e.epoch == *epoch && e.stop == Stop::End)
            {
                r.done_without_end += 1;
                r.violation("done_without_end", format!(
                    "{id}: epoch {epoch} done at {at}, but none of its executions ran to its end"
                ));
            }
        }
    }
    for (id, tl) in &timelines {
        if by_task.contains_key(id) {
            continue;
        }
        for (epoch, (at, how)) in &tl.ends {
            if how == "done" {
                r.done_without_end += 1;
                r.violation(
                    "done_without_end",
                    format!("{id}: epoch {epoch} done at {at}, never executed"),
                );
            }
        }
    }
    r
}

/// True if the zombie part `(end, last]` of one execution meets `[start, stop]`.
fn overlap(end: u64, last: u64, start: u64, stop: u64) -> bool {
    last > end + CLOCK_SLACK_MS && end.max(start) + CLOCK_SLACK_MS < last.min(stop)
}

/// Counts a hard stop: a drain violation when its agent was draining, else a number.
fn judge_stop(h: &History, e: &Execution, r: &mut Report) {
    if e.stop != Stop::Hard {
        return;
    }
    let killed = h.faults.iter().any(|f| {
        f.member == e.member
            && f.kind.is_kill()
            && e.start_ms <= f.start_ms + CLOCK_SLACK_MS
            && f.start_ms <= e.last_ms + KILL_GAP_MS
    });
    if killed {
        return;
    }
    let drained = h.faults.iter().any(|f| {
        f.member == e.member
            && f.kind == FaultKind::Term
            && f.start_ms <= e.last_ms + CLOCK_SLACK_MS
            && e.start_ms <= f.end_ms + CLOCK_SLACK_MS
    });
    if drained {
        r.drain_killed += 1;
        r.violation(
            "drain_killed",
            format!(
                "{}: epoch {} on {} was killed hard during a drain (last tick {})",
                e.task, e.epoch, e.member, e.last_ms
            ),
        );
    } else {
        r.hard_stops += 1;
        r.note(
            "hard_stops",
            format!(
                "{}: epoch {} on {} stopped with no end, term, cancel or drop line (last tick {})",
                e.task, e.epoch, e.member, e.last_ms
            ),
        );
    }
}

/// When `member` went silent (died, froze or was cut off) if it was silent at `at`.
fn silent_since(h: &History, member: &str, at: u64) -> Option<u64> {
    let mut since: Option<u64> = None;
    let mut note = |from: u64| since = Some(since.map_or(from, |s: u64| s.min(from)));
    for life in h.lives.iter().filter(|l| l.member == member) {
        let Some(died) = life.end_ms else { continue };
        let back = h
            .lives
            .iter()
            .filter(|l| l.member == member && l.start_ms >= died)
            .map(|l| l.start_ms)
            .min();
        if died <= at && back.is_none_or(|b| at < b) {
            note(died);
        }
    }
    for f in &h.faults {
        if f.member == member
            && matches!(f.kind, FaultKind::Freeze | FaultKind::Partition)
            && f.start_ms <= at
            && at < f.end_ms
        {
            note(f.start_ms);
        }
    }
    since
}

#[cfg(test)]
mod tests {
    //! The checker can fail: hand-made histories with each violation.

    use super::*;

    const L: u64 = 3_000;
    const V: u64 = 5_000;

    fn ev(at_ms: u64, event: &str, member: Option<&str>, epoch: Option<u64>) -> Event {
        Event {
            at_ms,
            event: event.into(),
            member: member.map(str::to_owned),
            epoch,
        }
    }

    fn task(state: TaskState, failures: u64, history: Vec<Event>) -> TaskRecord {
        let deliveries = history
            .iter()
            .filter(|e| matches!(e.event.as_str(), "leased" | "reclaimed" | "redelivered"))
            .count() as u64;
        TaskRecord {
            state,
            deliveries,
            failures,
            history,
        }
    }

    fn run_lines(task: &str, epoch: u64, member: &str, from: u64, to: u64, stop: &str) -> String {
        let exec = format!("{from}.{member}");
        let mut s = format!("start {task} {epoch} {from} {exec} {member}\n");
        let mut t = from;
        while t + 100 <= to {
            t += 100;
            s.push_str(&format!("tick {task} {epoch} {t} {exec}\n"));
        }
        if !stop.is_empty() {
            s.push_str(&format!("{stop} {task} {epoch} {to} {exec}\n"));
        }
        s
    }

    fn fault(kind: FaultKind, member: &str, start_ms: u64, end_ms: u64) -> Fault {
        Fault {
            kind,
            member: member.into(),
            start_ms,
            end_ms,
        }
    }

    fn life(member: &str, start_ms: u64, end_ms: Option<u64>) -> Life {
        Life {
            member: member.into(),
            start_ms,
            end_ms,
        }
    }

    /// t1 done once by m1, on a history of agents m1 and m2 that lived throughout.
    fn clean() -> History {
        let mut h = History {
            lease_ms: L,
            liveness_ms: V,
            acked: vec!["t1".into()],
            lives: vec![life("m1", 0, None), life("m2", 0, None)],
            ..History::default()
        };
        h.tasks.insert(
            "t1".into(),
            task(
                TaskState::Done,
                0,
                vec![
                    ev(1_000, "enqueued", None, None),
                    ev(1_010, "leased", Some("m1"), Some(1)),
                    ev(2_520, "done", Some("m1"), Some(1)),
                ],
            ),
        );
        h.log = run_lines("t1", 1, "m1", 1_020, 2_500, "end");
        h
    }

    /// t1 lapsed on m1 at 5 000 while m1 ran it to its end at 2 500, then m2 did it again.
    fn lapsed_and_redone() -> History {
        let mut h = clean();
        h.tasks.insert(
            "t1".into(),
            task(
                TaskState::Done,
                1,
                vec![
                    ev(1_000, "enqueued", None, None),
                    ev(1_010, "leased", Some("m1"), Some(1)),
                    ev(5_000, "lapsed", Some("m1"), Some(1)),
                    ev(5_010, "leased", Some("m2"), Some(2)),
                    ev(6_520, "done", Some("m2"), Some(2)),
                ],
            ),
        );
        h.log = run_lines("t1", 1, "m1", 1_020, 2_500, "end");
        h.log += &run_lines("t1", 2, "m2", 5_020, 6_500, "end");
        h
    }

    #[test]
    fn a_clean_history_is_clean() {
        let r = analyse(&clean());
        assert!(r.is_clean(), "{r}");
        assert_eq!((r.tasks, r.executions, r.completions), (1, 1, 1));
    }

    #[test]
    fn a_partition_excuses_a_lapse_and_the_work_done_twice() {
        let mut h = lapsed_and_redone();
        h.faults = vec![fault(FaultKind::Partition, "m1", 2_000, 7_000)];
        let r = analyse(&h);
        assert!(r.is_clean(), "{r}");
        assert_eq!((r.completed_twice, r.failures), (1, 1));
    }

    #[test]
    fn a_lease_granted_after_a_partition_healed_and_lapsed_in_its_window_is_noted() {
        let mut h = lapsed_and_redone();
        h.faults = vec![fault(FaultKind::Partition, "m1", 2_000, 7_000)];
        assert_eq!(analyse(&h).failures_after_recovery, 0);
        // Healed at 7 000, granted at 9 000, lapsed at 12 000: inside the window.
        let t1 = h.tasks.get_mut("t1").unwrap();
        t1.history = vec![
            ev(1_000, "enqueued", None, None),
            ev(9_000, "leased", Some("m1"), Some(1)),
            ev(12_000, "lapsed", Some("m1"), Some(1)),
            ev(12_010, "leased", Some("m2"), Some(2)),
            ev(13_520, "done", Some("m2"), Some(2)),
        ];
        h.log = run_lines("t1", 2, "m2", 12_020, 13_500, "end");
        let r = analyse(&h);
        assert!(r.is_clean(), "{r}");
        assert_eq!(r.failures_after_recovery, 1, "{r}");
    }

    #[test]
    fn without_a_fault_the_lapse_and_the_work_done_twice_are_violations() {
        let r = analyse(&lapsed_and_redone());
        assert_eq!((r.failures_unexplained, r.done_twice), (1, 1), "{r}");
        // A drain does not excuse them either.
        let mut h = lapsed_and_redone();
        h.faults = vec![fault(FaultKind::Term, "m1", 2_000, 3_000)];
        let r = analyse(&h);
        assert_eq!((r.failures_in_drain, r.done_twice), (1, 1), "{r}");
        // Nor a kill after it.
        let mut h = lapsed_and_redone();
        h.faults = vec![fault(FaultKind::Kill9, "m1", 6_000, 6_000)];
        assert_eq!(analyse(&h).failures_unexplained, 1);
    }

    #[test]
    fn a_leader_fault_in_a_kills_window_stretches_it_by_a_lease() {
        // m1 killed at 1 500; its lease lapses at 13 000, past the kill's window
        // (1 500 + lease + liveness + slack = 10 500).
        let mut h = lapsed_and_redone();
        let t1 = h.tasks.get_mut("t1").unwrap();
        t1.history = vec![
            ev(1_000, "enqueued", None, None),
            ev(1_010, "leased", Some("m1"), Some(1)),
            ev(13_000, "lapsed", Some("m1"), Some(1)),
            ev(13_010, "leased", Some("m2"), Some(2)),
            ev(14_520, "done", Some("m2"), Some(2)),
        ];
        h.log = run_lines("t1", 1, "m1", 1_020, 1_400, "end");
        h.log += &run_lines("t1", 2, "m2", 13_020, 14_500, "end");
        h.faults = vec![fault(FaultKind::Kill9, "m1", 1_500, 1_500)];
        assert_eq!(analyse(&h).failures_unexplained, 1);
        // A leader killed from 9 000 to 10 000: its successor gave the lease a full
        // period, to 13 000 at the latest; the kill explains the lapse.
        h.leader_faults = vec![(9_000, 10_000)];
        let r = analyse(&h);
        assert!(r.is_clean(), "{r}");
        // A leader fault after the kill's window stretches nothing.
        h.leader_faults = vec![(11_000, 12_000)];
        assert_eq!(analyse(&h).failures_unexplained, 1);
    }

    #[test]
    fn lost_dead_done_twice_and_untracked_failures_are_counted() {
        let mut h = clean();
        h.acked.push("t2".into());
        assert_eq!(analyse(&h).lost, 1);
        let t1 = h.tasks.get_mut("t1").unwrap();
        t1.state = TaskState::Dead;
        let r = analyse(&h);
        assert_eq!((r.lost, r.dead), (2, 1));
        let mut h = clean();
        let t1 = h.tasks.get_mut("t1").unwrap();
        t1.history.push(ev(2_600, "done", Some("m1"), Some(1)));
        let r = analyse(&h);
        assert_eq!((r.done_twice, r.settled_after_end), (1, 1), "{r}");
        // A failure counted that the timeline does not show.
        let mut h = clean();
        h.tasks.get_mut("t1").unwrap().failures = 1;
        assert_eq!(analyse(&h).failures_untracked, 1);
    }

    #[test]
    fn a_redelivered_lease_ends_the_unheard_epoch_without_a_failure() {
        let mut h = clean();
        let history = vec![
            ev(1_000, "enqueued", None, None),
            ev(1_010, "leased", Some("m1"), Some(1)),
            ev(1_900, "redelivered", Some("m1"), Some(2)),
            ev(3_020, "done", Some("m1"), Some(2)),
        ];
        h.tasks
            .insert("t1".into(), task(TaskState::Done, 0, history.clone()));
        h.log = run_lines("t1", 2, "m1", 1_910, 3_010, "end");
        let r = analyse(&h);
        assert!(r.is_clean(), "{r}");
        // Were it a reclaim, the old epoch would be a failure the count must show.
        let reclaimed = history
            .into_iter()
            .map(|e| match e.event.as_str() {
                "redelivered" => ev(e.at_ms, "reclaimed", Some("m1"), e.epoch),
                _ => e,
            })
            .collect();
        h.tasks
            .insert("t1".into(), task(TaskState::Done, 0, reclaimed));
        assert_eq!(analyse(&h).failures_untracked, 1);
    }

    #[test]
    fn an_orphan_running_beside_its_next_attempt_is_a_zombie_only_a_freeze_excuses() {
        let mut h = clean();
        h.tasks.insert(
            "t1".into(),
            task(
                TaskState::Done,
                1,
                vec![
                    ev(1_000, "enqueued", None, None),
                    ev(1_010, "leased", Some("m1"), Some(1)),
                    ev(1_500, "reclaimed", Some("m1"), Some(2)),
                    ev(3_020, "done", Some("m1"), Some(2)),
                ],
            ),
        );
        // The orphan of epoch 1 runs to 3 000, beside epoch 2 from 1 510.
        h.log = run_lines("t1", 1, "m1", 1_020, 3_000, "end");
        h.log += &run_lines("t1", 2, "m1", 1_510, 3_010, "end");
        h.lives = vec![life("m1", 0, Some(1_400)), life("m1", 1_450, None)];
        h.faults = vec![fault(FaultKind::Kill9Main, "m1", 1_400, 1_400)];
        let r = analyse(&h);
        assert_eq!((r.zombies_unexcused, r.zombie_overlaps), (1, 1), "{r}");
        assert_eq!((r.failures_unexplained, r.overlaps), (0, 0), "{r}");
        h.faults = vec![fault(FaultKind::Freeze, "m1", 1_100, 1_600)];
        h.lives = vec![life("m1", 0, None)];
        let r = analyse(&h);
        assert!(r.is_clean(), "{r}");
        assert_eq!(r.zombies_frozen, 1);
    }

    #[test]
    fn two_live_epochs_at_once_overlap() {
        let mut h = clean();
        h.tasks.insert(
            "t1".into(),
            task(
                TaskState::Done,
                0,
                vec![
                    ev(1_000, "enqueued", None, None),
                    ev(1_010, "leased", Some("m1"), Some(1)),
                    ev(1_200, "leased", Some("m2"), Some(2)),
                    ev(2_520, "done", Some("m1"), Some(1)),
                    ev(4_200, "lapsed", Some("m2"), Some(2)),
                ],
            ),
        );
        h.log = run_lines("t1", 1, "m1", 1_020, 2_500, "end");
        h.log += &run_lines("t1", 2, "m2", 1_210, 2_000, "");
        let r = analyse(&h);
        assert!(r.overlaps >= 1 && r.granted_while_held == 1, "{r}");
        assert_eq!(r.settled_after_end, 1, "{r}");
    }

    #[test]
    fn a_program_killed_by_a_drain_and_an_ack_without_an_end_are_violations() {
        let mut h = clean();
        h.log = run_lines("t1", 1, "m1", 1_020, 2_500, "");
        h.faults = vec![fault(FaultKind::Term, "m1", 2_000, 3_000)];
        let r = analyse(&h);
        assert_eq!((r.drain_killed, r.done_without_end), (1, 1), "{r}");
        // Killed by a kill -9 instead: only the ack without an end remains.
        h.faults = vec![fault(FaultKind::Kill9, "m1", 2_550, 2_550)];
        let r = analyse(&h);
        assert_eq!((r.drain_killed, r.done_without_end), (0, 1), "{r}");
        // Stopped by SIGTERM within the drain and released: clean.
        h.faults = vec![fault(FaultKind::Term, "m1", 2_000, 3_000)];
        h.log = run_lines("t1", 1, "m1", 1_020, 2_500, "term");
        let t1 = h.tasks.get_mut("t1").unwrap();
        t1.history[2] = ev(2_510, "released", Some("m1"), Some(1));
        t1.history.push(ev(2_600, "leased", Some("m2"), Some(2)));
        t1.history.push(ev(3_700, "done", Some("m2"), Some(2)));
        t1.deliveries = 2;
        h.log += &run_lines("t1", 2, "m2", 2_610, 3_600, "end");
        let r = analyse(&h);
        assert!(r.is_clean(), "{r}");
    }

    #[test]
    fn a_lease_granted_to_a_member_dead_past_the_liveness_timeout_is_a_violation() {
        let mut h = lapsed_and_redone();
        h.faults = vec![fault(FaultKind::Kill9, "m1", 2_500, 2_500)];
        h.lives = vec![life("m1", 0, Some(2_500)), life("m2", 0, None)];
        assert!(analyse(&h).is_clean());
        let t1 = h.tasks.get_mut("t1").unwrap();
        // Lapsed again after a grant to the dead m1, long after it died.
        let late = 2_500 + V + WINDOW_SLACK_MS + 500;
        t1.history = vec![
            ev(1_000, "enqueued", None, None),
            ev(1_010, "leased", Some("m1"), Some(1)),
            ev(5_000, "lapsed", Some("m1"), Some(1)),
            ev(late, "leased", Some("m1"), Some(2)),
            ev(late + L, "lapsed", Some("m1"), Some(2)),
            ev(late + L + 10, "leased", Some("m2"), Some(3)),
            ev(late + L + 1_600, "done", Some("m2"), Some(3)),
        ];
        t1.deliveries = 3;
        t1.failures = 2;
        h.log = run_lines("t1", 1, "m1", 1_020, 2_400, "");
        h.log += &run_lines("t1", 3, "m2", late + L + 20, late + L + 1_500, "end");
        let r = analyse(&h);
        assert_eq!((r.grants_to_silent, r.failures_unexplained), (1, 1), "{r}");
    }

    #[test]
    fn the_log_parses_and_garbage_is_counted() {
        let mut garbled = 0;
        let log = "start t1 1 10 x m1\ntick t1 1 110 x\nend t1 1 150 x\nnonsense\ntick t9 1 5 y\n";
        let e = parse_log(log, &mut garbled);
        assert_eq!(garbled, 2);
        assert_eq!(e.len(), 1);
        assert_eq!(
            (e[0].start_ms, e[0].last_ms, e[0].stop),
            (10, 150, Stop::End)
        );
    }
}
