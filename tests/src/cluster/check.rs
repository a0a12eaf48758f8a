//! The total-queue checker against a relayed three-node cluster: while producers and
//! agents run, a nemesis kills, isolates and cuts off the leader or a follower, or
//! kills the leader under a flood of half-open handshakes at every cluster port, one
//! fault at a time; then everything is healed, the queue drained, and the report must
//! be clean, with no term in which two nodes acknowledged writes.
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
    /// An admin confined to some queues tries to remove a follower and to add a node
    /// that does not exist: both refused (`forbidden`), the voters unchanged, and the
    /// cluster serving on. Nothing to undo.
    ScopedAdminChangesMembership,
}

/// Every fault, equally likely.
const FAULTS: [Fault; 7] = [
    Fault::KillLeader,
    Fault::KillFollower,
    Fault::IsolateLeader,
    Fault::IsolateFollower,
    Fault::CutClientsFromLeader,
    Fault::FloodAndKillLeader,
    Fault::ScopedAdminChangesMembership,
];

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
    checker::run_against(target, config.workload(), |rng| {
        inject(&mut cluster, rng, faults, run_for)
    })
    .await
}

/// The nemesis: `faults` faults (or faults for `run_for`), each after a pause and undone
/// after its hold; then everything healed and a leader elected. Returns how many faults
/// it made.
async fn inject(
    cluster: &mut Cluster,
    mut rng: StdRng,
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
            break;
        }
        // The nemesis's schedule, not a synchronisation: faults land at random moments.
        tokio::time::sleep(Duration::from_millis(rng.random_range(PAUSE_MS))).await;
        let fault = FAULTS[rng.random_range(0..FAULTS.len())];
        let hold = Duration::from_millis(rng.random_range(HOLD_MS));
        let leader = cluster.leader().await;
        let node: NodeId = match fault {
            Fault::KillLeader
            | Fault::IsolateLeader
            | Fault::CutClientsFromLeader
            | Fault::FloodAndKillLeader => leader.node,
            Fault::KillFollower | Fault::IsolateFollower | Fault::ScopedAdminChangesMembership => {
                cluster.follower(leader.node, rng.random_range(0..NODES))
            }
        };
        made += 1;
        println!(
            "checker: fault {made}: {fault:?} of node {node} (leader {} in term {}) for {hold:?}",
            leader.node, leader.term
        );
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
