//! The total-queue checker against a relayed three-node cluster: while producers and
//! agents run, a nemesis kills, isolates, deafens (one-way loss) and cuts off the leader
//! or a follower, kills an isolated leader, or kills the leader under a flood of
//! half-open handshakes at every cluster port, one fault at a time; then everything is
//! healed, the queue drained, and the report must be clean, with no term in which two
//! nodes acknowledged writes.
//!
//! Each fault that costs the leadership is held long enough for a new leader to serve,
//! and its *failover* is measured as the producers live it: from the fault to the first
//! enqueue acknowledged by a leader of a later term ([`failovers`]), reported per fault
//! type at the end of the run.
//!
//! Every fault is undone before the next: a majority is always back within one hold,
//! so the cluster must elect a leader again within
//! [`LEADER_TIMEOUT`](super::LEADER_TIMEOUT) (the nemesis waits for one before each
//! fault, and fails the run if none comes).

use std::ops::RangeInclusive;
use std::time::{Duration, Instant};

use rand::Rng;
use rand::rngs::StdRng;

use super::{Cluster, NodeId};
use crate::checker::{self, Report, Target, Workload};

/// Nodes in the checked cluster.
pub const NODES: usize = 3;

/// Faults of the CI run, unless `MUSTER_CHECKER_FAULTS` says otherwise.
const DEFAULT_FAULTS: usize = 20;

/// Milliseconds between one fault's end and the next fault.
const PAUSE_MS: RangeInclusive<u64> = 200..=1_000;

/// Milliseconds a fault lasts before it is undone (a killed node restarted, a
/// partition healed, clients let back in).
const HOLD_MS: RangeInclusive<u64> = 300..=1_800;

/// One fault of the nemesis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// kill -9 of the leader, restarted after the hold.
    KillLeader,
    /// kill -9 of a follower, restarted after the hold.
    KillFollower,
    /// The leader's node-to-node paths blackholed, healed after the hold.
    IsolateLeader,
    /// One-way loss: nothing the others send reaches the leader, while what it sends
    /// reaches them (they hear its heartbeats, it hears no answer). Healed after the
    /// hold.
    DeafenLeader,
    /// The leader's node-to-node paths blackholed, then, a moment later, the isolated
    /// leader kill -9ed; healed and restarted after the hold.
    KillIsolatedLeader,
    /// A follower's node-to-node paths blackholed, healed after the hold.
    IsolateFollower,
    /// The leader's client relay blackholed (the cluster still sees it), restored after
    /// the hold.
    CutClientsFromLeader,
    /// A flood of half-open handshakes (QUIC Initials from ever new source ports, as
    /// spoofed ones are) at every node's cluster port while the leader is kill -9ed: a
    /// new leader must still be elected within [`FLOOD_FAILOVER`]. The flood stops and
    /// the node is restarted after the hold.
    FloodAndKillLeader,
    /// Every node stopped as a service manager stops it (SIGTERM) and started again,
    /// one at a time, followers first and the leader last, each caught up with the
    /// leader before the next: a rolling restart. With
    /// [`UPGRADE_FROM_VAR`](super::UPGRADE_FROM_VAR) set, the nodes start on that
    /// (previous) build, the first fault is this one, and each node comes back on this
    /// build: a rolling upgrade. The leader's stop is a measured failover.
    RollingRestart,
    /// An admin confined to some queues tries to remove a follower and to add a node
    /// that does not exist: both refused (`forbidden`), the voters unchanged, and the
    /// cluster serving on. Nothing to undo.
    ScopedAdminChangesMembership,
}

/// Every fault, equally likely.
const FAULTS: [Fault; 10] = [
    Fault::RollingRestart,
    Fault::KillLeader,
    Fault::KillFollower,
    Fault::IsolateLeader,
    Fault::DeafenLeader,
    Fault::KillIsolatedLeader,
    Fault::IsolateFollower,
    Fault::CutClientsFromLeader,
    Fault::FloodAndKillLeader,
    Fault::ScopedAdminChangesMembership,
];

/// Milliseconds a fault that costs the leadership lasts: always long enough for the
/// others to elect a new leader and serve, so that its failover is measured, not cut
/// short by the heal.
const LEADER_HOLD_MS: RangeInclusive<u64> = 2_500..=3_500;

/// Milliseconds between isolating the leader and killing it ([`Fault::KillIsolatedLeader`]).
const KILL_AFTER_ISOLATION_MS: RangeInclusive<u64> = 100..=600;

impl Fault {
    /// Whether the fault costs the leader its leadership (its failover is measured).
    pub fn deposes_leader(self) -> bool {
        matches!(
            self,
            Fault::KillLeader
                | Fault::IsolateLeader
                | Fault::DeafenLeader
                | Fault::KillIsolatedLeader
                | Fault::FloodAndKillLeader
        )
    }
}

/// A fault that cost the leadership, as the nemesis made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deposed {
    /// The fault.
    pub fault: Fault,
    /// When it began (wall ms).
    pub at_ms: u64,
    /// The deposed leader's term.
    pub term: u64,
    /// The deposed leader.
    pub node: NodeId,
    /// When the deposed leader was started again, if the fault restarts it at once (a
    /// rolling restart): a restarted leader whose followers had not elected another yet
    /// leads again in its term, which ends the failover too.
    pub back_ms: Option<u64>,
}

/// One measured failover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failover {
    /// The fault.
    pub fault: Fault,
    /// From the fault to the first enqueue acknowledged in a later term, in ms; `None`
    /// if no such enqueue came before the run ended.
    pub ms: Option<u64>,
}

/// The failover of each fault in `deposed`: from the fault to the first acknowledged
/// enqueue of `acks` (sorted by time) served in a later term than the deposed leader's,
/// or by the deposed leader again once it was started again.
pub fn failovers(deposed: &[Deposed], acks: &[checker::AckMark]) -> Vec<Failover> {
    deposed
        .iter()
        .map(|d| Failover {
            fault: d.fault,
            ms: acks
                .iter()
                .find(|a| {
                    a.at_ms >= d.at_ms
                        && (a.by.term > d.term
                            || d.back_ms
                                .is_some_and(|b| a.at_ms >= b && a.by.node == d.node))
                })
                .map(|a| a.at_ms - d.at_ms),
        })
        .collect()
}

/// One line per fault type: how many, and the median and largest failover (`-` for
/// one that never recovered within the run).
pub fn failover_table(failovers: &[Failover]) -> String {
    let mut out = String::new();
    let mut kinds: Vec<Fault> = failovers.iter().map(|f| f.fault).collect();
    kinds.sort_by_key(|k| format!("{k:?}"));
    kinds.dedup();
    for kind in kinds {
        let of_kind: Vec<Option<u64>> = failovers
            .iter()
            .filter(|f| f.fault == kind)
            .map(|f| f.ms)
            .collect();
        let mut ms: Vec<u64> = of_kind.iter().flatten().copied().collect();
        ms.sort_unstable();
        let unrecovered = of_kind.len() - ms.len();
        let (median, min, max) = match ms.as_slice() {
            [] => ("-".to_owned(), "-".to_owned(), "-".to_owned()),
            ms => (
                format!("{:.2}", ms[ms.len() / 2] as f64 / 1000.0),
                format!("{:.2}", ms[0] as f64 / 1000.0),
                format!("{:.2}", ms[ms.len() - 1] as f64 / 1000.0),
            ),
        };
        out += &format!(
            "{kind:?}: n={} median={median} s min={min} s max={max} s unrecovered={unrecovered}\n",
            of_kind.len()
        );
    }
    out
}

/// Longest a flooded cluster may take to elect a new leader after its leader's kill:
/// as long as a quiet one may.
pub const FLOOD_FAILOVER: Duration = super::LEADER_TIMEOUT;

/// Half-open handshakes sent to each node per flood round, and the pause between
/// rounds: about 500 Initials a second in all, as the security review's flood.
const FLOOD_PER_ROUND: usize = 8;
const FLOOD_ROUND: Duration = Duration::from_millis(50);

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
    /// Concurrent agents.
    pub agents: usize,
}

impl Config {
    /// The CI run ([`DEFAULT_FAULTS`] faults, or `MUSTER_CHECKER_FAULTS`), or a long one
    /// when `MUSTER_CHECKER_SECONDS` is set; the seed from `MUSTER_CHECKER_SEED`, else a
    /// random one.
    pub fn from_env() -> Config {
        let faults = std::env::var("MUSTER_CHECKER_FAULTS").map_or(DEFAULT_FAULTS, |s| {
            s.parse().expect("MUSTER_CHECKER_FAULTS is a number")
        });
        Config {
            seed: checker::seed_from_env(),
            faults,
            run_for: checker::run_for_from_env(),
            producers: 3,
            agents: 3,
        }
    }

    fn workload(&self) -> Workload {
        Workload {
            seed: self.seed,
            producers: self.producers,
            agents: self.agents,
        }
    }
}

/// Runs the checker against a relayed cluster of [`NODES`] nodes under the nemesis.
pub async fn check(config: Config) -> Report {
    println!(
        "checker: seed={} nemesis=cluster faults={} run_for={:?}",
        config.seed, config.faults, config.run_for
    );
    // With tokens, so that an admin confined to some queues can try what only an admin
    // of every queue may.
    let mut cluster = Cluster::start_secured(NODES).await;
    let target = Target {
        options: cluster.options(),
        clustered: true,
    };
    let (faults, run_for) = (config.faults, config.run_for);
    let mut deposed = Vec::new();
    let report = checker::run_against(target, config.workload(), |rng| {
        inject(&mut cluster, rng, faults, run_for, &mut deposed)
    })
    .await;
    let failovers = failovers(&deposed, &report.acks);
    for f in &failovers {
        println!("checker: failover after {:?}: {:?} ms", f.fault, f.ms);
    }
    print!(
        "{}",
        failover_table(&failovers)
            .lines()
            .map(|l| format!("checker: failover {l}\n"))
            .collect::<String>()
    );
    report
}

/// The nemesis: `faults` faults (or faults for `run_for`), each after a pause and undone
/// after its hold; then everything healed and a leader elected. Returns how many faults
/// it made.
async fn inject(
    cluster: &mut Cluster,
    mut rng: StdRng,
    faults: usize,
    run_for: Option<Duration>,
    deposed: &mut Vec<Deposed>,
) -> usize {
    let started = Instant::now();
    let mut made = 0;
    loop {
        let more = match run_for {
            Some(d) => started.elapsed() < d,
            None => made < faults,
        };
        if !more {
            break;
        }
        // The nemesis's schedule, not a synchronisation: faults land at random moments.
        tokio::time::sleep(Duration::from_millis(rng.random_range(PAUSE_MS))).await;
        let upgrading = made == 0 && std::env::var_os(super::UPGRADE_FROM_VAR).is_some();
        let fault = if upgrading {
            Fault::RollingRestart
        } else {
            FAULTS[rng.random_range(0..FAULTS.len())]
        };
        let hold = Duration::from_millis(rng.random_range(if fault.deposes_leader() {
            LEADER_HOLD_MS
        } else {
            HOLD_MS
        }));
        let leader = cluster.leader().await;
        let node: NodeId = match fault {
            Fault::KillLeader
            | Fault::IsolateLeader
            | Fault::DeafenLeader
            | Fault::KillIsolatedLeader
            | Fault::CutClientsFromLeader
            | Fault::FloodAndKillLeader
            | Fault::RollingRestart => leader.node,
            Fault::KillFollower | Fault::IsolateFollower | Fault::ScopedAdminChangesMembership => {
                cluster.follower(leader.node, rng.random_range(0..NODES))
            }
        };
        made += 1;
        println!(
            "checker: fault {made}: {fault:?} of node {node} (leader {} in term {}) for {hold:?}",
            leader.node, leader.term
        );
        if fault.deposes_leader() {
            deposed.push(Deposed {
                fault,
                at_ms: checker::wall_ms(),
                term: leader.term,
                node: leader.node,
                back_ms: None,
            });
        }
        match fault {
            Fault::KillLeader | Fault::KillFollower => {
                cluster.kill9(node);
                tokio::time::sleep(hold).await;
                cluster.restart(node).await;
            }
            Fault::IsolateLeader | Fault::IsolateFollower => {
                cluster.partition_node(node);
                tokio::time::sleep(hold).await;
                cluster.heal_node(node);
            }
            Fault::RollingRestart => {
                let mut order: Vec<NodeId> = cluster
                    .node_ids()
                    .into_iter()
                    .filter(|&id| id != leader.node)
                    .collect();
                order.push(leader.node);
                for id in order {
                    let now = cluster.leader().await;
                    let leading = now.node == id;
                    if leading {
                        deposed.push(Deposed {
                            fault,
                            at_ms: checker::wall_ms(),
                            term: now.term,
                            node: id,
                            back_ms: None,
                        });
                    }
                    let started = Instant::now();
                    assert_eq!(cluster.stop(id), Some(0), "node {id} stopped by SIGTERM");
                    let upgraded = cluster.runs_previous(id);
                    if upgraded {
                        cluster.upgrade(id);
                    }
                    let back_ms = checker::wall_ms();
                    cluster.restart(id).await;
                    if leading && let Some(d) = deposed.last_mut() {
                        d.back_ms = Some(back_ms);
                    }
                    cluster.wait_caught_up(id).await;
                    println!(
                        "checker: node {id} restarted{} and caught up in {:.2} s",
                        if upgraded { " on this build" } else { "" },
                        started.elapsed().as_secs_f64()
                    );
                }
                tokio::time::sleep(hold).await;
            }
            Fault::DeafenLeader => {
                cluster.deafen_node(node);
                tokio::time::sleep(hold).await;
                cluster.heal_node(node);
            }
            Fault::KillIsolatedLeader => {
                cluster.partition_node(node);
                let first = Duration::from_millis(rng.random_range(KILL_AFTER_ISOLATION_MS));
                tokio::time::sleep(first).await;
                cluster.kill9(node);
                tokio::time::sleep(hold.saturating_sub(first)).await;
                cluster.heal_node(node);
                cluster.restart(node).await;
            }
            Fault::CutClientsFromLeader => {
                cluster.cut_clients(node);
                tokio::time::sleep(hold).await;
                cluster.restore_clients(node);
            }
            Fault::ScopedAdminChangesMembership => {
                let before = cluster.status(leader.node).await.voters;
                let follower = node.to_string();
                for args in [
                    vec!["cluster", "remove", follower.as_str()],
                    vec![
                        "cluster",
                        "add",
                        "99",
                        "--node-addr",
                        "127.0.0.1:9",
                        "--cluster-addr",
                        "127.0.0.1:9",
                        "--catch-up",
                        "1s",
                    ],
                ] {
                    let out = cluster.cli_as(super::QUEUE_ADMIN, &args).await;
                    let stderr = String::from_utf8_lossy(&out.stderr);
                    assert_eq!(out.status.code(), Some(1), "muster {args:?}: {stderr}");
                    assert_eq!(
                        stderr,
                        "muster: forbidden: token \"jobs-admin\" is limited to some queues\n",
                        "muster {args:?}"
                    );
                }
                assert_eq!(cluster.status(leader.node).await.voters, before);
                tokio::time::sleep(hold).await;
            }
            Fault::FloodAndKillLeader => {
                let targets: Vec<std::net::SocketAddr> = cluster
                    .node_ids()
                    .into_iter()
                    .map(|id| cluster.cluster_addr(id).parse().expect("a cluster address"))
                    .collect();
                let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
                // Stops the flood however this fault ends (a panic included).
                let stopping = FloodHandle(std::sync::Arc::clone(&stop));
                let flood =
                    tokio::task::spawn_blocking(move || flood_cluster_ports(&targets, &stop));
                cluster.kill9(node);
                let killed = Instant::now();
                let next = tokio::time::timeout(FLOOD_FAILOVER, cluster.leader())
                    .await
                    .unwrap_or_else(|_| panic!("no leader within {FLOOD_FAILOVER:?} of the leader's kill under a handshake flood"));
                println!(
                    "checker: under the flood, node {} leads in term {} {:.2} s after the kill",
                    next.node,
                    next.term,
                    killed.elapsed().as_secs_f64()
                );
                tokio::time::sleep(hold).await;
                drop(stopping);
                flood.await.expect("the flood's thread");
                cluster.restart(node).await;
            }
        }
    }
    // Every fault was undone already; this is the end state the drain relies on.
    cluster.heal_all();
    for id in cluster.node_ids() {
        if !cluster.is_running(id) {
            cluster.restart(id).await;
        }
    }
    let leader = cluster.leader().await;
    println!(
        "checker: healed; node {} leads in term {}",
        leader.node, leader.term
    );
    made
}

/// Stops the flood it belongs to when dropped.
struct FloodHandle(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Drop for FloodHandle {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Sends half-open handshakes to every target until `stop`: each a QUIC Initial from a
/// socket of its own, never answered further.
fn flood_cluster_ports(targets: &[std::net::SocketAddr], stop: &std::sync::atomic::AtomicBool) {
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        for &target in targets {
            for _ in 0..FLOOD_PER_ROUND {
                drop(crate::half_open_initial(target));
            }
        }
        std::thread::sleep(FLOOD_ROUND);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checker::AckMark;
    use crate::cluster::Served;

    fn ack(at_ms: u64, node: u64, term: u64) -> AckMark {
        AckMark {
            at_ms,
            by: Served { node, term },
        }
    }

    #[test]
    fn a_failover_ends_at_the_first_ack_of_a_later_term() {
        let deposed = [
            Deposed {
                fault: Fault::KillLeader,
                at_ms: 1_000,
                term: 3,
                node: 1,
                back_ms: None,
            },
            Deposed {
                fault: Fault::DeafenLeader,
                at_ms: 5_000,
                term: 4,
                node: 1,
                back_ms: None,
            },
            Deposed {
                fault: Fault::KillLeader,
                at_ms: 9_000,
                term: 5,
                node: 1,
                back_ms: None,
            },
        ];
        // Acks of the deposed term after the fault (in flight when it struck) do not
        // end it; nor do acks of a later term from before the fault.
        let acks = [
            ack(900, 1, 3),
            ack(1_100, 1, 3),
            ack(1_740, 2, 4),
            ack(1_800, 2, 4),
            ack(6_210, 3, 5),
            ack(8_000, 3, 5),
        ];
        let got = failovers(&deposed, &acks);
        assert_eq!(
            got,
            [
                Failover {
                    fault: Fault::KillLeader,
                    ms: Some(740)
                },
                Failover {
                    fault: Fault::DeafenLeader,
                    ms: Some(1_210)
                },
                Failover {
                    fault: Fault::KillLeader,
                    ms: None
                },
            ]
        );
        assert_eq!(
            failover_table(&got),
            "DeafenLeader: n=1 median=1.21 s min=1.21 s max=1.21 s unrecovered=0\n\
             KillLeader: n=2 median=0.74 s min=0.74 s max=0.74 s unrecovered=1\n"
        );
    }
}
