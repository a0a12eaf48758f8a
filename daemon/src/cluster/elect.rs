//! Elections behind a pre-vote, so that a node cut off from the others cannot depose a
//! healthy leader when it comes back.
//!
//! openraft 0.9 has no pre-vote: a follower that hears no leader raises its term and
//! asks for votes, and one that is partitioned away keeps doing so alone. When it
//! rejoins, its higher term makes the leader step down, and the cluster serves nothing
//! until a new election ends. So openraft's own election timer is off
//! (`Config::enable_elect` false) and this timer decides instead (Raft's PreVote,
//! Ongaro's thesis §9.6): a voter whose leader has been silent past the leader lease and
//! an election timeout asks every other voter whether it *would* vote for it
//! ([`PreVoteRequest`], term unchanged), and only if a majority, itself included, would
//! does it start a real election (`Trigger::elect`). A voter would if it has not heard
//! from a leader within the leader lease (openraft's own rule for real votes) and the
//! candidate's log is at least as up to date as its own. A node cut off hears no yes,
//! so its term stays where it was, and it rejoins as a follower without an election.

use std::collections::BTreeSet;
use std::time::Duration;

use openraft::storage::RaftLogStorage;
use openraft::{LogId, Raft, RaftNetworkFactory, ServerState, Vote};
use rand::Rng;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::net::{Network, Peer};
use super::node::ELECTION_TIMEOUT_MS;
use super::storage::LogStore;
use super::{Muster, NodeAddr};

/// How often the timer looks whether an election is due.
pub const ELECTION_TICK: Duration = Duration::from_millis(50);

/// How long a leader's heartbeat keeps a voter from granting another node a vote:
/// openraft's leader lease, which is the longest election timeout.
pub const LEADER_LEASE: Duration = Duration::from_millis(ELECTION_TIMEOUT_MS.1);

/// Longest a candidate waits for the pre-vote answers: the shortest election timeout.
pub const PRE_VOTE_TIMEOUT: Duration = Duration::from_millis(ELECTION_TIMEOUT_MS.0);

/// A would-you-vote-for-me question, sent before a real election.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreVoteRequest {
    /// The node that would stand.
    pub candidate: u64,
    /// The term it would stand in: its current term plus one (its term is not raised).
    pub term: u64,
    /// The last entry of its log.
    pub last_log_id: Option<LogId<u64>>,
}

/// The answer to a [`PreVoteRequest`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreVoteResponse {
    /// Whether this node would vote for the candidate now.
    pub granted: bool,
}

/// What a node knows of itself when it answers or asks: read from openraft's state and
/// the node's log.
#[derive(Debug, Clone)]
struct Standing {
    state: ServerState,
    vote: Vote<u64>,
    /// When the vote was last refreshed (by the leader's heartbeats on a follower, by a
    /// majority's acknowledgements on the leader).
    heard: Option<Instant>,
    voters: BTreeSet<u64>,
    /// On the leader: how long ago a majority last acknowledged it.
    quorum_acked_ms: Option<u64>,
}

impl Standing {
    async fn read(raft: &Raft<Muster>) -> Option<Standing> {
        let quorum_acked_ms = raft.metrics().borrow().millis_since_quorum_ack;
        raft.with_raft_state(move |st| Standing {
            state: st.server_state,
            vote: *st.vote_ref(),
            heard: st.vote_last_modified(),
            voters: st.membership_state.effective().voter_ids().collect(),
            quorum_acked_ms,
        })
        .await
        .ok()
    }

    /// Whether a leader's lease still holds here: on a follower, a leader was
    /// established and heard from within [`LEADER_LEASE`]; on the leader, a majority
    /// acknowledged it within [`LEADER_LEASE`] (its vote's clock is not refreshed by
    /// those acknowledgements: `quorum_acked_ms` is).
    fn leader_lease_holds(&self, now: Instant) -> bool {
        match self.state {
            ServerState::Leader => self
                .quorum_acked_ms
                .is_some_and(|age| age <= LEADER_LEASE.as_millis() as u64),
            _ => self.vote.is_committed() && self.heard.is_some_and(|at| now <= at + LEADER_LEASE),
        }
    }
}

/// This node's answer to a pre-vote: yes only if no leader's lease holds here, the
/// candidate would stand in a term no lower than this node's, and its log is at least
/// as up to date as this node's.
pub async fn answer(raft: &Raft<Muster>, log: &LogStore, req: &PreVoteRequest) -> PreVoteResponse {
    let Some(me) = Standing::read(raft).await else {
        return PreVoteResponse { granted: false };
    };
    let mine = last_log_id(log).await;
    let granted = !me.leader_lease_holds(Instant::now())
        && req.term >= me.vote.leader_id().term
        && (mine.is_none() || req.last_log_id >= mine);
    tracing::debug!(
        candidate = req.candidate,
        term = req.term,
        granted,
        "pre-vote answered"
    );
    PreVoteResponse { granted }
}

async fn last_log_id(log: &LogStore) -> Option<LogId<u64>> {
    let mut log = log.clone();
    match log.get_log_state().await {
        Ok(state) => state.last_log_id,
        Err(e) => {
            tracing::warn!(error = %e, "reading the last log id for a pre-vote");
            None
        }
    }
}

/// Runs the election timer of node `id` until its raft stops.
pub async fn run(id: u64, raft: Raft<Muster>, log: LogStore, mut network: Network) {
    let mut due_after = random_timeout();
    let mut tick = tokio::time::interval(ELECTION_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let started = Instant::now();
    let mut last_try: Option<Instant> = None;
    loop {
        tick.tick().await;
        let Some(me) = Standing::read(&raft).await else {
            return; // openraft stopped.
        };
        let now = Instant::now();
        if me.state == ServerState::Leader || !me.voters.contains(&id) {
            last_try = None;
            continue;
        }
        // A leader heard from since this node's last try: a follower again, it waits
        // out the leader's lease before trying.
        if me.vote.is_committed() && me.heard.zip(last_try).is_some_and(|(h, t)| h > t) {
            last_try = None;
        }
        // Quiet since the leader (or a candidate this node voted for) was last heard
        // from, its own last try, or its start. openraft's rule: after a leader, wait
        // out its lease as well as a timeout.
        let quiet_since = [me.heard, last_try, Some(started)]
            .into_iter()
            .flatten()
            .max()
            .unwrap_or(started);
        // After a leader, or a vote for another node (which may be about to lead and
        // send its first heartbeat), the lease too; after a lost try of its own, only
        // a timeout.
        let followed = me.vote.is_committed() || me.vote.leader_id().voted_for() != Some(id);
        let wait = if followed && last_try.is_none() {
            LEADER_LEASE + due_after
        } else {
            due_after
        };
        if now < quiet_since + wait {
            continue;
        }
        last_try = Some(now);
        due_after = random_timeout();
        let req = PreVoteRequest {
            candidate: id,
            term: me.vote.leader_id().term + 1,
            last_log_id: last_log_id(&log).await,
        };
        let others: Vec<u64> = me.voters.iter().copied().filter(|&v| v != id).collect();
        let majority = me.voters.len() / 2 + 1;
        let granted = 1 + ask(&raft, &mut network, &others, &req, majority - 1).await;
        if granted < majority {
            tracing::debug!(
                term = req.term,
                granted,
                majority,
                "pre-vote lost: no election"
            );
            continue;
        }
        // While it asked, another node may have won an election this node voted in (or
        // a leader may have been heard): then it follows, and stands in no election.
        let Some(now_standing) = Standing::read(&raft).await else {
            return;
        };
        if now_standing.vote != me.vote || now_standing.state == ServerState::Leader {
            tracing::debug!(
                term = req.term,
                "pre-vote won, but the vote moved on: no election"
            );
            continue;
        }
        tracing::info!(
            term = req.term,
            granted,
            "pre-vote won: starting an election"
        );
        if raft.trigger().elect().await.is_err() {
            return;
        }
    }
}

/// Asks `others` at once and counts the yeses that arrive within [`PRE_VOTE_TIMEOUT`],
/// returning as soon as `enough` said yes: a dead voter's silence does not hold up the
/// election the others agree to.
async fn ask(
    raft: &Raft<Muster>,
    network: &mut Network,
    others: &[u64],
    req: &PreVoteRequest,
    enough: usize,
) -> usize {
    let membership = raft.metrics().borrow().membership_config.clone();
    let mut asks = tokio::task::JoinSet::new();
    for &target in others {
        let node: NodeAddr = match membership.membership().get_node(&target) {
            Some(node) => node.clone(),
            None => continue,
        };
        let mut peer: Peer = network.new_client(target, &node).await;
        let req = req.clone();
        asks.spawn(async move { peer.pre_vote(&req, PRE_VOTE_TIMEOUT).await });
    }
    let mut granted = 0;
    let deadline = tokio::time::sleep(PRE_VOTE_TIMEOUT);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            joined = asks.join_next() => match joined {
                Some(Ok(Ok(answer))) => {
                    granted += usize::from(answer.granted);
                    if granted >= enough {
                        return granted;
                    }
                }
                Some(Ok(Err(e))) => tracing::debug!(error = %e, "pre-vote not answered"),
                Some(Err(e)) => tracing::debug!(error = %e, "pre-vote task failed"),
                None => return granted,
            },
            () = &mut deadline => return granted,
        }
    }
}

/// A random election timeout in [`ELECTION_TIMEOUT_MS`].
fn random_timeout() -> Duration {
    let (min, max) = ELECTION_TIMEOUT_MS;
    Duration::from_millis(rand::rng().random_range(min..=max))
}
