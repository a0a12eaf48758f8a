//! A cluster node: openraft started over the node's store, and what the rest of the
//! daemon asks of it (its role, the leader's address, membership changes, status).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context;
use openraft::{ChangeMembers, Config, Raft, RaftMetrics, ServerState, SnapshotPolicy};

use muster_protocol::ops::{ClusterHello, ClusterMember, ClusterStatusReply};
use muster_protocol::{ErrorBody, ErrorCode};

use super::storage::{Counted, LogStore, StateMachine};
use super::timing::Timing;
use super::{Fate, Muster, NodeAddr, Round, elect, identity, net};
use crate::store::{Persist, Store};

/// How often a leader waiting for its majority looks whether it still leads.
const LEADERSHIP_CHECK: Duration = Duration::from_millis(25);

/// Most log entries sent in one append RPC.
pub const MAX_PAYLOAD_ENTRIES: u64 = 16;

/// Bytes of a snapshot sent in one RPC.
pub const SNAPSHOT_CHUNK_BYTES: u64 = 4 << 20;

/// Log entries kept after a snapshot, for followers a little behind.
pub const LOG_KEPT_AFTER_SNAPSHOT: u64 = 2_000;

/// Entries applied since the last snapshot after which a node builds a new one (and
/// compacts its log), unless `--cluster-snapshot-every` says otherwise.
pub const SNAPSHOT_EVERY_ENTRIES: u64 = 20_000;

/// How a node is started.
pub struct NodeConfig {
    /// The cluster's id: nodes of another cluster id cannot talk to this one.
    pub cluster_id: String,
    /// This node's id.
    pub node_id: u64,
    /// The cluster secret.
    pub secret: Vec<u8>,
    /// Where node-to-node traffic is received.
    pub listen: SocketAddr,
    /// The client address this node gives out (`None`: the bound one).
    pub advertise: Option<String>,
    /// The node-to-node address this node gives out (`None`: the bound one).
    pub cluster_advertise: Option<String>,
    /// Form a one-node cluster if the store has none yet.
    pub bootstrap: bool,
    /// Make this node the only voter of its cluster, from its store
    /// ([`LogStore::force_single_node`]).
    pub force_single_node: bool,
    /// Where to reach nodes instead of their advertised node-to-node addresses.
    pub routes: HashMap<u64, String>,
    /// Entries between snapshots.
    pub snapshot_every: u64,
    /// Heartbeats and election timeouts.
    pub timing: Timing,
}

/// A running node. Clones share it.
#[derive(Clone)]
pub struct Node {
    raft: Raft<Muster>,
    id: u64,
    cluster_id: Arc<str>,
    runtime: tokio::runtime::Handle,
    /// The term whose engine the dispatcher serves with; 0 while it follows.
    serving: Arc<AtomicU64>,
    /// Sends its RPCs, and keeps what each peer last answered (the leader's gauges).
    network: net::Network,
    /// What its state machine applied, counted (the task and voter gauges).
    census: Counted,
    /// The node-to-node endpoint, closed when the node stops.
    endpoint: quinn::Endpoint,
    /// The node's own tasks (serving its peers, the election timer), waited for when
    /// it stops.
    tasks: tokio_util::task::TaskTracker,
    /// Where this node's node-to-node endpoint is bound.
    pub cluster_addr: SocketAddr,
}

/// Longest [`Node::shutdown`] waits for the node's tasks once raft has stopped and its
/// endpoint is closed.
const STOP_WAIT: Duration = Duration::from_secs(5);

/// openraft's settings for a node started with `config`.
fn raft_config(config: &NodeConfig) -> anyhow::Result<Config> {
    let raft_config = Config {
        cluster_name: config.cluster_id.clone(),
        heartbeat_interval: config.timing.heartbeat().as_millis() as u64,
        election_timeout_min: config.timing.election_timeout().as_millis() as u64,
        election_timeout_max: config.timing.leader_lease().as_millis() as u64,
        // Elections start behind a pre-vote, from `elect::run`.
        enable_elect: false,
        max_payload_entries: MAX_PAYLOAD_ENTRIES,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(config.snapshot_every),
        snapshot_max_chunk_size: SNAPSHOT_CHUNK_BYTES,
        max_in_snapshot_log_to_keep: LOG_KEPT_AFTER_SNAPSHOT.min(config.snapshot_every),
        ..Config::default()
    }
    .validate()
    .context("the cluster's raft settings")?;
    Ok(raft_config)
}

/// Opens the raft log and the state machine over `store` (fjall blocks: not on a
/// runtime worker).
async fn open_storage(
    store: &Store,
    data: &Path,
    persist: Persist,
) -> anyhow::Result<(LogStore, StateMachine)> {
    let (store, data) = (store.clone(), data.to_path_buf());
    tokio::task::spawn_blocking(move || {
        anyhow::Ok((
            LogStore::open(&store, persist)?,
            StateMachine::open(&store, &data)?,
        ))
    })
    .await
    .context("opening the raft log")?
}

/// The addresses this node gives out: the advertised ones, else the bound ones.
fn advertised(config: &NodeConfig, client_addr: SocketAddr, cluster_addr: SocketAddr) -> NodeAddr {
    NodeAddr {
        addr: config
            .advertise
            .clone()
            .unwrap_or_else(|| client_addr.to_string()),
        cluster_addr: config
            .cluster_advertise
            .clone()
            .unwrap_or_else(|| cluster_addr.to_string()),
    }
}

/// Makes node `id` the only voter of its cluster before openraft starts
/// ([`LogStore::force_single_node`]).
async fn force_single_node(
    log: &LogStore,
    store: &Store,
    id: u64,
    me: NodeAddr,
) -> anyhow::Result<()> {
    let (log, store) = (log.clone(), store.clone());
    tokio::task::spawn_blocking(move || log.force_single_node(&store, id, me))
        .await
        .context("forcing a one-node cluster")?
        .context("forcing a one-node cluster")?;
    Ok(())
}

impl Node {
    /// Starts the node over `store` (whose data directory is `data`), serving
    /// node-to-node RPCs; `client_addr` is where the daemon's clients connect.
    pub async fn start(
        config: NodeConfig,
        store: &Store,
        data: &Path,
        persist: Persist,
        client_addr: SocketAddr,
    ) -> anyhow::Result<Node> {
        let raft_config = raft_config(&config)?;
        let identity = identity::identity(&config.secret, &config.cluster_id)?;
        let endpoint = identity::endpoint(config.listen, &identity)?;
        let cluster_addr = endpoint
            .local_addr()
            .context("reading the cluster address")?;
        let (log, machine) = open_storage(store, data, persist).await?;
        let me = advertised(&config, client_addr, cluster_addr);
        if config.force_single_node {
            force_single_node(&log, store, config.node_id, me.clone()).await?;
        }
        let network = net::Network::new(endpoint.clone(), config.routes);
        let census = machine.census();
        let log_reader = log.clone();
        let raft = Raft::new(
            config.node_id,
            Arc::new(raft_config),
            network.clone(),
            log,
            machine,
        )
        .await
        .context("starting raft")?;
        let served = Served {
            raft: raft.clone(),
            log: log_reader.clone(),
        };
        let tasks = tokio_util::task::TaskTracker::new();
        tasks.spawn(net::serve(endpoint.clone(), Arc::new(served)));
        tasks.spawn(elect::run(
            config.node_id,
            raft.clone(),
            log_reader,
            network.clone(),
        ));
        let node = Node {
            raft,
            id: config.node_id,
            cluster_id: config.cluster_id.into(),
            runtime: tokio::runtime::Handle::current(),
            serving: Arc::default(),
            network,
            census,
            endpoint,
            tasks,
            cluster_addr,
        };
        if config.bootstrap {
            node.bootstrap(me).await?;
        }
        Ok(node)
    }

    /// Forms a one-node cluster of this node, unless the store already holds a cluster
    /// (`--bootstrap` only matters once).
    async fn bootstrap(&self, me: NodeAddr) -> anyhow::Result<()> {
        match self.raft.initialize(BTreeMap::from([(self.id, me)])).await {
            Ok(()) => tracing::info!(node = self.id, "formed a one-node cluster"),
            Err(openraft::error::RaftError::APIError(
                openraft::error::InitializeError::NotAllowed(_),
            )) => {}
            Err(e) => return Err(anyhow::anyhow!("forming the cluster: {e}")),
        }
        Ok(())
    }

    /// The first step of a node's shutdown: a leader steps back (no more heartbeats or
    /// log entries), so that the others elect a new leader as soon as its lease runs
    /// out, instead of once this node has closed its client connections and stopped
    /// raft. Its rounds stop being agreed on within the election timeout.
    pub fn step_back(&self) {
        if self.metrics().state == ServerState::Leader {
            tracing::info!("stepping back before shutting down: the others elect a new leader");
        }
        elect::step_back(&self.raft, &self.network, true);
    }

    /// Resolves when raft stopped on its own: a storage error (a failed append, apply or
    /// snapshot write), a panic in its core. Says why. The node can neither lead nor
    /// follow after that, so the daemon stops as it does for a store error.
    pub async fn failed(&self) -> String {
        raft_failed(self.raft.metrics()).await
    }

    /// Stops raft (before the store closes), then the node's own tasks: the election
    /// timer ends with raft, serving its peers with the endpoint, closed here (its
    /// peers hear at once rather than after their idle timeout). Waits at most
    /// [`STOP_WAIT`] for them.
    pub async fn shutdown(&self) {
        if let Err(e) = self.raft.shutdown().await {
            tracing::warn!("stopping raft: {e}");
        }
        self.endpoint.close(0u32.into(), b"node stopping");
        self.tasks.close();
        if tokio::time::timeout(STOP_WAIT, self.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                tasks = self.tasks.len(),
                "the node's tasks did not end within {STOP_WAIT:?} of its stop"
            );
        }
    }

    fn metrics(&self) -> RaftMetrics<u64, NodeAddr> {
        self.raft.metrics().borrow().clone()
    }

    /// Whether this node leads in `term` and heard from a majority lately.
    pub fn leads_in(&self, term: u64) -> bool {
        debug_assert!(term > 0, "a node leads only in a term above 0");
        let m = self.raft.metrics();
        let m = m.borrow();
        // openraft forgets the quorum's last acknowledgement when the membership
        // changes: unknown is not stale, a leader cut off sees it grow.
        m.state == ServerState::Leader
            && m.current_term == term
            && m.current_leader == Some(self.id)
            && m.millis_since_quorum_ack
                .is_none_or(|_| quorum_is_fresh(&m, self.timing()))
    }

    /// The term this node may start serving in: it leads, heard from a majority lately,
    /// and has applied every entry of its log, one of them of its own term (so the store
    /// holds everything any earlier leader got agreed). `None` otherwise.
    pub fn ready_to_lead(&self) -> Option<u64> {
        let m = self.raft.metrics();
        let m = m.borrow();
        let applied = m.last_applied?;
        (m.state == ServerState::Leader
            && m.current_leader == Some(self.id)
            && quorum_is_fresh(&m, self.timing())
            && applied.leader_id.term == m.current_term
            && m.last_log_index == Some(applied.index))
        .then_some(m.current_term)
    }

    /// Proposes `round` of `term` without waiting: the receiver gets true once it is
    /// committed and applied here, false if it was not (refused by the term fence, or
    /// not agreed on before the node stopped leading in `term` or `timeout` passed);
    /// `then` runs after that is sent (the dispatcher's wake-up). Rounds proposed one
    /// after the other are agreed on in that order: a later one is committed only with
    /// every earlier one.
    pub fn propose(
        &self,
        term: u64,
        round: Round,
        timeout: Duration,
        then: impl FnOnce() + Send + 'static,
    ) -> std::sync::mpsc::Receiver<bool> {
        // IMPORTANT: the term fence: a round names the term its engine was built in.
        assert_eq!(round.term, term, "a round is proposed in its own term");
        // Room for the one answer: sending it never waits.
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        // IMPORTANT: handed to raft here, on the caller's thread, so that the log holds
        // the rounds in the order they were made (a task per round submitting its own
        // would race, and a later round could be appended, and applied, before an
        // earlier one). Only the wait for the answer runs in a task.
        let submitted = self.runtime.block_on(self.raft.client_write_ff(round));
        let node = self.clone();
        self.runtime.spawn(async move {
            let agreed = async {
                let answer = submitted.map_err(|fatal| fatal.to_string())?;
                match node.while_leading(term, timeout, answer).await? {
                    Ok(Ok(response)) => Ok(response.data == Fate::Written),
                    Ok(Err(refused)) => Err(refused.to_string()),
                    Err(_) => Err("raft dropped its answer".to_owned()),
                }
            };
            let agreed = agreed.await.unwrap_or_else(|why| {
                tracing::info!("a round was not agreed on: {why}");
                false
            });
            // The dispatcher may have stopped waiting (it stopped leading).
            let _ = tx.send(agreed);
            then();
        });
        rx
    }

    /// Confirms with a majority that this node still leads in `term`.
    pub fn confirm_leadership(&self, term: u64, timeout: Duration) -> bool {
        if self.leads_in(term) && self.quorum_age() < self.timing().heartbeat().as_millis() as u64 {
            // A majority acknowledged this leader within the last heartbeat: no other
            // leader can have been elected since (that takes an election timeout).
            return true;
        }
        let raft = self.raft.clone();
        let confirmed =
            self.runtime
                .block_on(self.while_leading(term, timeout, raft.ensure_linearizable()));
        matches!(confirmed, Ok(Ok(_))) && self.leads_in(term)
    }

    /// Runs `wait` (the leader's wait for a majority) until it ends, the node stops
    /// leading in `term` (its majority silent for the election timeout: nothing it waits
    /// for can be agreed on now, and its clients should look for the new leader at
    /// once), or `timeout` passes. `Err` says which of the last two happened.
    async fn while_leading<T>(
        &self,
        term: u64,
        timeout: Duration,
        wait: impl std::future::Future<Output = T>,
    ) -> Result<T, String> {
        let lapsed = async {
            let mut check = tokio::time::interval(LEADERSHIP_CHECK);
            loop {
                check.tick().await;
                if !self.leads_in(term) {
                    return;
                }
            }
        };
        tokio::select! {
            done = wait => Ok(done),
            () = lapsed => Err(format!("the node stopped leading in term {term}")),
            () = tokio::time::sleep(timeout) => {
                Err(format!("no majority within {} ms", timeout.as_millis()))
            }
        }
    }

    /// The heartbeat and election timeout this node runs with.
    fn timing(&self) -> Timing {
        Timing::of(self.raft.config())
    }

    fn quorum_age(&self) -> u64 {
        self.raft
            .metrics()
            .borrow()
            .millis_since_quorum_ack
            .unwrap_or(u64::MAX)
    }

    /// The leader's client address, as far as this node knows.
    fn leader_addr(m: &RaftMetrics<u64, NodeAddr>) -> Option<String> {
        let leader = m.current_leader?;
        m.membership_config
            .membership()
            .get_node(&leader)
            .map(|n| n.addr.clone())
    }

    /// The `not_leader` error this node answers with, naming the leader if it knows it.
    pub fn not_leader(&self) -> ErrorBody {
        let m = self.metrics();
        let leader = m.current_leader.filter(|&l| l != self.id);
        match (leader, Node::leader_addr(&m).filter(|_| leader.is_some())) {
            (Some(id), Some(addr)) => ErrorBody::not_leader(
                format!("node {} is not the leader; node {id} at {addr} is", self.id),
                Some(addr),
            ),
            _ => ErrorBody::not_leader(
                format!(
                    "node {} is not serving: the cluster has no leader it knows of (an election, or this node is cut off)",
                    self.id
                ),
                None,
            ),
        }
    }

    /// The dispatcher serves with an engine of `term` (`None`: it follows).
    pub fn set_serving(&self, term: Option<u64>) {
        assert_ne!(
            term,
            Some(0),
            "0 means following: no engine serves in term 0"
        );
        let before = self.serving.swap(term.unwrap_or(0), Ordering::AcqRel);
        assert!(
            term.is_none() || before == 0,
            "the dispatcher serves in term {term:?} only after following (it served {before})"
        );
        assert!(
            term.is_some() || before != 0,
            "the dispatcher follows again only after it served"
        );
    }

    /// What `hello` tells a client of the cluster. A node names itself the leader only
    /// once its dispatcher serves: until then a client keeps looking.
    pub fn hello(&self) -> ClusterHello {
        let m = self.metrics();
        let serving = self.serving.load(Ordering::Acquire);
        let leader = m
            .current_leader
            .filter(|&l| l != self.id || serving == m.current_term);
        ClusterHello {
            cluster_id: self.cluster_id.to_string(),
            node: self.id,
            term: m.current_term,
            leader,
            leader_addr: leader.and(Node::leader_addr(&m)),
        }
    }

    /// This node's view of the cluster.
    pub fn status(&self) -> ClusterStatusReply {
        let m = self.metrics();
        let membership = m.membership_config.membership();
        let voters: BTreeSet<u64> = membership.voter_ids().collect();
        let members = membership
            .nodes()
            .map(|(&id, node)| ClusterMember {
                node: id,
                addr: node.addr.clone(),
                cluster_addr: node.cluster_addr.clone(),
                voter: voters.contains(&id),
                matched: match &m.replication {
                    Some(replication) => replication.get(&id).copied().flatten().map(|l| l.index),
                    None => None,
                },
            })
            .collect();
        ClusterStatusReply {
            cluster_id: self.cluster_id.to_string(),
            node: self.id,
            role: match m.state {
                ServerState::Leader => "leader",
                ServerState::Follower => "follower",
                ServerState::Candidate => "candidate",
                ServerState::Learner => "learner",
                ServerState::Shutdown => "shutdown",
            }
            .into(),
            term: m.current_term,
            leader: m.current_leader,
            last_log_index: m.last_log_index,
            last_applied: m.last_applied.map(|l| l.index),
            snapshot_index: m.snapshot.map(|l| l.index),
            members,
        }
    }

    /// Adds node `id` as a learner and, unless `learner`, waits up to `catch_up` until
    /// it has caught up with the log, then makes it a voter. Adding a node that is
    /// already a learner promotes it after the same wait. A node that does not catch up
    /// in time (down, unreachable, another cluster's secret) stays a learner and the
    /// answer is `invalid_state`: a voter that cannot vote would only weaken the quorum.
    pub async fn add(
        &self,
        id: u64,
        addr: NodeAddr,
        learner: bool,
        catch_up: Duration,
    ) -> Result<ClusterStatusReply, ErrorBody> {
        let m = self.metrics();
        if m.membership_config
            .membership()
            .voter_ids()
            .any(|v| v == id)
        {
            return Err(ErrorBody::new(
                ErrorCode::AlreadyExists,
                format!("node {id} is a voter of the cluster already"),
            ));
        }
        if m.membership_config.membership().get_node(&id).is_none() {
            self.raft
                .add_learner(id, addr, false)
                .await
                .map_err(|e| self.refusal(e))?;
        }
        if learner {
            return Ok(self.status());
        }
        self.wait_caught_up(id, catch_up).await?;
        self.raft
            .change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), false)
            .await
            .map_err(|e| self.refusal(e))?;
        Ok(self.status())
    }

    /// Waits up to `catch_up` until the leader knows learner `id` to hold its whole log
    /// as it stood when the wait began.
    async fn wait_caught_up(&self, id: u64, catch_up: Duration) -> Result<(), ErrorBody> {
        let target = self.metrics().last_log_index.unwrap_or(0);
        let matched = |m: &RaftMetrics<u64, NodeAddr>| {
            m.replication
                .as_ref()
                .and_then(|r| r.get(&id).copied().flatten())
                .map(|l| l.index)
        };
        let waited = self
            .raft
            .wait(Some(catch_up))
            .metrics(
                |m| m.state != ServerState::Leader || matched(m).is_some_and(|i| i >= target),
                "the new node to catch up",
            )
            .await;
        let m = self.metrics();
        if m.state != ServerState::Leader {
            return Err(self.not_leader());
        }
        if waited.is_ok() && matched(&m).is_some_and(|i| i >= target) {
            return Ok(());
        }
        let progress = match matched(&m) {
            None => "it has not answered the leader at all".to_owned(),
            Some(i) => format!("it holds the log up to {i} of {target}"),
        };
        Err(ErrorBody::new(
            ErrorCode::InvalidState,
            format!(
                "node {id} did not catch up within {:.1} s ({progress}): it stays a learner and the cluster's voters are unchanged; is it running, reachable at its cluster address, and started with this cluster's id and secret? (`muster cluster remove {id}` takes it out)",
                catch_up.as_secs_f64()
            ),
        ))
    }

    /// Removes node `id` from the cluster.
    pub async fn remove(&self, id: u64) -> Result<ClusterStatusReply, ErrorBody> {
        let m = self.metrics();
        let membership = m.membership_config.membership();
        let change = if membership.voter_ids().any(|v| v == id) {
            ChangeMembers::RemoveVoters(BTreeSet::from([id]))
        } else if membership.get_node(&id).is_some() {
            ChangeMembers::RemoveNodes(BTreeSet::from([id]))
        } else {
            return Err(ErrorBody::new(
                ErrorCode::NotFound,
                format!("node {id} is not a member of the cluster"),
            ));
        };
        self.raft
            .change_membership(change, false)
            .await
            .map_err(|e| self.refusal(e))?;
        Ok(self.status())
    }

    /// A membership change's failure, as a reply.
    fn refusal(
        &self,
        e: openraft::error::RaftError<u64, openraft::error::ClientWriteError<u64, NodeAddr>>,
    ) -> ErrorBody {
        match e {
            openraft::error::RaftError::APIError(
                openraft::error::ClientWriteError::ForwardToLeader(_),
            ) => self.not_leader(),
            other => ErrorBody::new(
                ErrorCode::InvalidState,
                format!("membership change: {other}"),
            ),
        }
    }

    /// Publishes the node's gauges, once a second: its raft positions; what its state
    /// machine applied ([`Counted::publish_gauges`]: the task gauges only unless the node
    /// is `serving`, whose engine sets them); and while `serving`, its view of the other
    /// members ([`net::Network::publish_gauges`]).
    pub fn publish_gauges(&self, serving: bool) {
        let m = self.metrics();
        metrics::gauge!("muster_cluster_leader")
            .set(f64::from(u8::from(m.state == ServerState::Leader)));
        metrics::gauge!("muster_cluster_term").set(m.current_term as f64);
        metrics::gauge!("muster_cluster_last_log_index").set(m.last_log_index.unwrap_or(0) as f64);
        metrics::gauge!("muster_cluster_last_applied_index")
            .set(m.last_applied.map_or(0, |l| l.index) as f64);
        metrics::gauge!("muster_cluster_snapshot_index")
            .set(m.snapshot.map_or(0, |l| l.index) as f64);
        if let (Some(replication), Some(last)) = (&m.replication, m.last_log_index) {
            for (id, matched) in replication {
                let lag = last.saturating_sub(matched.map_or(0, |l| l.index));
                metrics::gauge!("muster_cluster_node_lag", "node" => id.to_string())
                    .set(lag as f64);
            }
        }
        self.census.publish_gauges(serving);
        if serving {
            self.network.publish_gauges(&self.census.members());
        }
    }
}

/// Whether a majority acknowledged this leader within the election timeout.
fn quorum_is_fresh(m: &RaftMetrics<u64, NodeAddr>, timing: Timing) -> bool {
    m.millis_since_quorum_ack
        .is_some_and(|age| age < timing.election_timeout().as_millis() as u64)
}

/// A node's openraft and its log (for the pre-vote's answers).
struct Served {
    raft: openraft::Raft<Muster>,
    log: LogStore,
}

impl net::Handler for Served {
    async fn handle(&self, rpc: net::Rpc) -> Result<Vec<u8>, postcard::Error> {
        let raft = &self.raft;
        match rpc {
            net::Rpc::AppendEntries(r) => postcard::to_stdvec(&raft.append_entries(r).await),
            net::Rpc::Vote(r) => postcard::to_stdvec(&raft.vote(r).await),
            net::Rpc::InstallSnapshot(r) => postcard::to_stdvec(&raft.install_snapshot(r).await),
            net::Rpc::PreVote(r) => postcard::to_stdvec(&elect::answer(raft, &self.log, &r).await),
        }
    }
}

/// Resolves with raft's fatal error once its metrics report one (or they end).
async fn raft_failed(
    mut metrics: tokio::sync::watch::Receiver<RaftMetrics<u64, NodeAddr>>,
) -> String {
    loop {
        if let Err(fatal) = &metrics.borrow_and_update().running_state {
            return fatal.to_string();
        }
        if metrics.changed().await.is_err() {
            return "raft stopped".into();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Change, Space};

    /// Rounds proposed one after the other, without waiting for each other's answers
    /// (as a pipelining leader does), are appended and applied in that order: each
    /// writes the same key, and the store keeps the last one's value.
    #[test]
    fn rounds_proposed_in_a_row_are_applied_in_that_order() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = Store::open_clustered(&dir.path().join("store"), 8 << 20).unwrap();
        let config = NodeConfig {
            cluster_id: "test".into(),
            node_id: 1,
            secret: vec![7; 32],
            listen: "127.0.0.1:0".parse().unwrap(),
            advertise: None,
            cluster_advertise: None,
            bootstrap: true,
            force_single_node: false,
            routes: HashMap::new(),
            snapshot_every: 10_000,
            timing: Timing::default(),
        };
        let client_addr = "127.0.0.1:1".parse().unwrap();
        let node = runtime
            .block_on(Node::start(
                config,
                &store,
                dir.path(),
                Persist::Os,
                client_addr,
            ))
            .unwrap();
        let since = std::time::Instant::now();
        let term = loop {
            if let Some(term) = node.ready_to_lead() {
                break term;
            }
            assert!(since.elapsed() < Duration::from_secs(10), "no leader");
            std::thread::sleep(Duration::from_millis(10));
        };
        // From this thread, outside the runtime, as the dispatcher proposes.
        let answers: Vec<_> = (0..300u32)
            .map(|n| {
                let round = Round {
                    term,
                    wall_ms: 1,
                    changes: vec![Change {
                        space: Space::Owners,
                        key: b"k".to_vec(),
                        value: Some(n.to_string().into_bytes()),
                    }],
                };
                node.propose(term, round, Duration::from_secs(10), || {})
            })
            .collect();
        for answer in answers {
            assert!(answer.recv().unwrap(), "every round agreed on");
        }
        assert_eq!(
            store.view().get(Space::Owners, b"k").unwrap(),
            Some(b"299".to_vec())
        );
        runtime.block_on(node.shutdown());
    }

    #[tokio::test]
    async fn a_fatal_error_in_raft_is_seen_and_said() {
        let initial = RaftMetrics::new_initial(1);
        let (tx, rx) = tokio::sync::watch::channel(initial.clone());
        let failed = tokio::spawn(raft_failed(rx));
        tx.send(initial.clone()).unwrap();
        tokio::task::yield_now().await;
        assert!(!failed.is_finished(), "running, not failed");
        let mut broken = initial;
        broken.running_state = Err(openraft::error::Fatal::Panicked);
        tx.send(broken).unwrap();
        assert_eq!(
            failed.await.unwrap(),
            openraft::error::Fatal::<u64>::Panicked.to_string()
        );
    }
}
