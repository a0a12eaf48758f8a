//! Elections behind a pre-vote, so that a node cut off from the others cannot depose a
//! healthy leader when it comes back.
//!
//! openraft 0.9 has no pre-vote: a follower that hears no leader raises its term and
//! asks for votes, and one that is partitioned away keeps doing so alone. When it
//! rejoins, its higher term makes the leader step down, and the cluster serves nothing
//! until a new election ends. So openraft's own election timer is off
//! (`Config::enable_elect` false) and this timer decides instead (Raft's PreVote,
//! Ongaro's thesis §9.6): a voter whose leader has been silent past the leader lease and
//! a random part of half an election timeout ([`Timing`]) asks every other voter whether it *would* vote for it
//! ([`PreVoteRequest`], term unchanged), and only if a majority, itself included, would
//! does it start a real election (`Trigger::elect`). A voter would if it has not heard
//! from a leader within the leader lease (openraft's own rule for real votes) and the
//! candidate's log is at least as up to date as its own. A node cut off hears no yes,
//! so its term stays where it was, and it rejoins as a follower without an election.
//!
//! The same timer gives the leader check-quorum, which openraft 0.9 lacks too: a leader
//! that has not heard from a majority for an election timeout stops its heartbeats, so
//! the others elect a new leader instead of following one that cannot commit.

use std::collections::BTreeSet;
use std::ops::ControlFlow;
use std::time::Duration;

use openraft::storage::RaftLogStorage;
use openraft::{LogId, Raft, RaftNetworkFactory, ServerState, Vote};
use rand::Rng;
use tokio::time::Instant;

use super::net::{Network, Peer, PreVoteRequest, PreVoteResponse};
use super::storage::LogStore;
use super::timing::Timing;
use super::{Muster, NodeAddr};

/// How often the timer looks whether an election is due.
pub const ELECTION_TICK: Duration = Duration::from_millis(50);

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

    /// Whether a leader's lease ([`Timing::leader_lease`]) still holds here: on a
    /// follower, a leader was established and heard from within it; on the leader, a
    /// majority acknowledged it within it (its vote's clock is not refreshed by those
    /// acknowledgements: `quorum_acked_ms` is).
    fn leader_lease_holds(&self, now: Instant, lease: Duration) -> bool {
        match self.state {
            ServerState::Leader => self
                .quorum_acked_ms
                .is_some_and(|age| age <= lease.as_millis() as u64),
            _ => self.vote.is_committed() && self.heard.is_some_and(|at| now <= at + lease),
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
    let lease = Timing::of(raft.config()).leader_lease();
    let granted = !me.leader_lease_holds(Instant::now(), lease)
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

/// Runs the election timer of node `id` until its raft stops; on the leader, steps it
/// back when its majority falls silent ([`CheckQuorum`]).
pub async fn run(id: u64, raft: Raft<Muster>, log: LogStore, mut network: Network) {
    let timing = Timing::of(raft.config());
    let mut timer = Timer::new(id, timing);
    let mut check_quorum = CheckQuorum::default();
    // When to look next: every ELECTION_TICK, or sooner when an election falls due, so
    // that each voter stands at the moment its own wait says (its slot, below).
    let mut next = Instant::now();
    loop {
        tokio::time::sleep_until(next).await;
        next = Instant::now() + ELECTION_TICK;
        let Some(me) = Standing::read(&raft).await else {
            return; // openraft stopped.
        };
        check_quorum.look(&raft, &network, &me, timing, Instant::now());
        let now = Instant::now();
        let Some(due) = timer.due(&me) else {
            continue;
        };
        if now < due {
            next = next.min(due);
            continue;
        }
        if timer
            .stand(&raft, &log, &mut network, &me, now)
            .await
            .is_break()
        {
            return; // openraft stopped.
        }
    }
}

/// A follower's election timer between its ticks: when it last tried, and the waits
/// drawn for its next try.
struct Timer {
    /// The node's id.
    id: u64,
    /// The cluster's heartbeat and election timeout.
    timing: Timing,
    /// The waits of the next try, drawn once per try.
    wait: Option<Waits>,
    /// When the timer started: a node that never heard a leader counts quiet from it.
    started: Instant,
    /// When this node last tried (asked for a pre-vote), until a leader is heard after.
    last_try: Option<Instant>,
    /// Whether the last try went past its pre-vote into an election.
    stood: bool,
}

impl Timer {
    /// A timer that has not tried yet.
    fn new(id: u64, timing: Timing) -> Timer {
        Timer {
            id,
            timing,
            wait: None,
            started: Instant::now(),
            last_try: None,
            stood: false,
        }
    }

    /// When this node is due to try, or `None` while it leads or does not vote.
    fn due(&mut self, me: &Standing) -> Option<Instant> {
        if me.state == ServerState::Leader || !me.voters.contains(&self.id) {
            self.last_try = None;
            return None;
        }
        // A leader heard from since this node's last try: a follower again, it waits
        // out the leader's lease before trying.
        if me.vote.is_committed() && me.heard.zip(self.last_try).is_some_and(|(h, t)| h > t) {
            self.last_try = None;
        }
        // Quiet since the leader (or a candidate this node voted for) was last heard
        // from, its own last try, or its start.
        let quiet_since = [me.heard, self.last_try, Some(self.started)]
            .into_iter()
            .flatten()
            .max()
            .unwrap_or(self.started);
        // After a leader, or a vote for another node (which may be about to lead and
        // send its first heartbeat), its lease and a random part of half a timeout:
        // the other voters' leases end at about the same moment, so they would grant
        // the pre-vote; after a lost pre-vote (a voter's lease may have ended a moment
        // later than this node's), a heartbeat or two; after an election of its own
        // that made no leader, a whole random timeout.
        debug_assert!(
            self.last_try.is_none_or(|t| t >= self.started),
            "a timer tries only after it started"
        );
        let followed = me.vote.is_committed() || me.vote.leader_id().voted_for() != Some(self.id);
        let (timing, id) = (self.timing, self.id);
        let waits = *self
            .wait
            .get_or_insert_with(|| Waits::draw(timing, id, &me.voters));
        let due = match self.last_try {
            None if followed => waits.after_leader,
            Some(_) if !self.stood => waits.after_pre_vote,
            _ => waits.after_try,
        };
        Some(quiet_since + due)
    }

    /// Tries at `now`: a pre-vote, and if a majority grants it and nothing moved
    /// meanwhile, a real election. Breaks when openraft stopped.
    async fn stand(
        &mut self,
        raft: &Raft<Muster>,
        log: &LogStore,
        network: &mut Network,
        me: &Standing,
        now: Instant,
    ) -> ControlFlow<()> {
        debug_assert!(
            me.state != ServerState::Leader && me.voters.contains(&self.id),
            "only a voter that does not lead stands (its timer said it was due)"
        );
        self.last_try = Some(now);
        self.stood = false;
        self.wait = None;
        let term = me.vote.leader_id().term + 1;
        let Some(granted) = self.pre_vote(raft, log, network, me, term).await else {
            return ControlFlow::Continue(());
        };
        // While it asked, another node may have won an election this node voted in (or
        // a leader may have been heard): then it follows, and stands in no election.
        let Some(now_standing) = Standing::read(raft).await else {
            return ControlFlow::Break(());
        };
        assert!(
            now_standing.vote.leader_id().term >= me.vote.leader_id().term,
            "a node's term never goes back"
        );
        if now_standing.vote != me.vote || now_standing.state == ServerState::Leader {
            tracing::debug!(term, "pre-vote won, but the vote moved on: no election");
            return ControlFlow::Continue(());
        }
        tracing::info!(term, granted, "pre-vote won: starting an election");
        self.stood = true;
        match raft.trigger().elect().await {
            Ok(()) => ControlFlow::Continue(()),
            Err(_) => ControlFlow::Break(()),
        }
    }

    /// Asks the other voters whether they would vote for this node in `term`: the
    /// yeses, itself included, if they are a majority.
    async fn pre_vote(
        &self,
        raft: &Raft<Muster>,
        log: &LogStore,
        network: &mut Network,
        me: &Standing,
        term: u64,
    ) -> Option<usize> {
        let req = PreVoteRequest {
            candidate: self.id,
            term,
            last_log_id: last_log_id(log).await,
        };
        let others: Vec<u64> = me
            .voters
            .iter()
            .copied()
            .filter(|&v| v != self.id)
            .collect();
        let majority = me.voters.len() / 2 + 1;
        debug_assert_eq!(
            others.len() + 1,
            me.voters.len(),
            "a node asks every voter but itself"
        );
        let timeout = self.timing.election_timeout();
        let granted = 1 + ask(raft, network, &others, &req, majority - 1, timeout).await;
        assert!(
            granted <= me.voters.len(),
            "at most one yes from each voter"
        );
        if granted < majority {
            tracing::debug!(
                term = req.term,
                granted,
                majority,
                "pre-vote lost: no election"
            );
            return None;
        }
        Some(granted)
    }
}

/// Asks `others` at once and counts the yeses that arrive within `timeout`,
/// returning as soon as `enough` said yes: a dead voter's silence does not hold up the
/// election the others agree to. The asks not answered by then run on to their own
/// deadline (the same `timeout`) instead of being dropped: a call that reaches it
/// forgets its connection, so a connection to a process that is gone (a restarted
/// node's new process does not know it) is not asked again at the next try.
async fn ask(
    raft: &Raft<Muster>,
    network: &mut Network,
    others: &[u64],
    req: &PreVoteRequest,
    enough: usize,
    timeout: Duration,
) -> usize {
    debug_assert!(
        enough <= others.len(),
        "the yeses wanted ({enough}) can come from the others ({})",
        others.len()
    );
    let membership = raft.metrics().borrow().membership_config.clone();
    let mut asks = tokio::task::JoinSet::new();
    for &target in others {
        let node: NodeAddr = match membership.membership().get_node(&target) {
            Some(node) => node.clone(),
            None => continue,
        };
        let mut peer: Peer = network.new_client(target, &node).await;
        let req = req.clone();
        asks.spawn(async move { peer.pre_vote(&req, timeout).await });
    }
    let mut granted = 0;
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            joined = asks.join_next() => match joined {
                Some(Ok(Ok(answer))) => {
                    granted += usize::from(answer.granted);
                    if granted >= enough {
                        break;
                    }
                }
                Some(Ok(Err(e))) => tracing::debug!(error = %e, "pre-vote not answered"),
                Some(Err(e)) => tracing::debug!(error = %e, "pre-vote task failed"),
                None => break,
            },
            () = &mut deadline => break,
        }
    }
    // Each ask ends by its own deadline: none outlives `timeout` by more than a moment.
    asks.detach_all();
    debug_assert!(
        granted <= others.len(),
        "at most one yes from each voter asked"
    );
    granted
}

/// How long a follower's timer waits before it asks for a pre-vote, drawn anew after
/// each try.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Waits {
    /// After its leader fell silent: the leader's lease and a part of half an election
    /// timeout (1.5–2 `T`). The half timeout is cut into one slot per voter, in the
    /// order of their ids, and the wait falls at random within this voter's slot: the
    /// voters, which all heard the dead leader last at about the same moment, stand one
    /// after another instead of splitting the vote (the first whose log is up to date
    /// wins, usually before the next slot begins).
    after_leader: Duration,
    /// After a pre-vote a majority did not grant: one or two heartbeats. A pre-vote
    /// changes no term, so asking again soon disturbs nothing.
    after_pre_vote: Duration,
    /// After an election of its own that did not end in a leader: a random timeout
    /// (1–1.5 `T`), so that two candidates that split the vote do not meet again.
    after_try: Duration,
}

impl Waits {
    fn draw(timing: Timing, id: u64, voters: &BTreeSet<u64>) -> Waits {
        debug_assert!(voters.contains(&id), "only a voter draws its waits");
        let t = timing.election_timeout().as_millis() as u64;
        let slots = voters.len().max(1) as u64;
        let slot = voters.iter().position(|&v| v == id).unwrap_or(0) as u64;
        let width = (t / 2 / slots).max(1);
        let mut rng = rand::rng();
        let waits = Waits {
            after_leader: timing.leader_lease()
                + Duration::from_millis(slot * width + rng.random_range(0..width)),
            after_pre_vote: timing.heartbeat()
                + Duration::from_millis(
                    rng.random_range(0..=timing.heartbeat().as_millis() as u64),
                ),
            after_try: Duration::from_millis(rng.random_range(t..=t * 3 / 2)),
        };
        // IMPORTANT: no voter stands while the leader's lease may hold at the others,
        // and each stands within its own slot.
        assert!(
            waits.after_leader >= timing.leader_lease()
                && waits.after_leader
                    < timing.leader_lease() + Duration::from_millis((slot + 1) * width),
            "a wait after a leader in the slot of voter {id}"
        );
        waits
    }
}

/// Check-quorum on openraft 0.9, which has none: a leader that has not heard from a
/// majority for the election timeout *steps back*: it stops sending heartbeats and
/// append-entries (whose retries would keep the followers' leases alive), so that the
/// followers' leases run out and they elect a new leader (with its vote, if it can still
/// hear them), instead of following a leader that cannot commit. It steps forward again
/// once it no longer leads (it heard of a later term), for when it leads next.
///
/// Two rules keep a stepped-back leader from stalling the cluster. A fresh leadership is
/// judged only an election timeout after it began: openraft counts its majority's
/// silence from the votes that elected it, so a leader elected slowly would otherwise
/// step back at once, before its first entry reached anyone. And a leader stepped back
/// for [`STEPPED_BACK_RETRY`] election timeouts with no later term heard tries its
/// majority again: it may hold the longest log (an entry no follower has), which makes
/// every other voter refuse to elect a node behind it, while as a leader it never
/// stands itself; if its majority is still silent, it steps back again.
#[derive(Debug)]
struct CheckQuorum {
    /// Whether this node sends heartbeats and append-entries.
    heartbeats: bool,
    /// The term it last led, and when that leadership began or it last stepped back or
    /// forward.
    since: Option<(u64, Instant)>,
}

/// Election timeouts a stepped-back leader waits for a later term before it tries its
/// majority again (longer than a follower's wait to stand: the followers elect first
/// when they can).
const STEPPED_BACK_RETRY: u32 = 2;

impl Default for CheckQuorum {
    fn default() -> CheckQuorum {
        CheckQuorum {
            heartbeats: true,
            since: None,
        }
    }
}

impl CheckQuorum {
    fn look(
        &mut self,
        raft: &Raft<Muster>,
        network: &Network,
        me: &Standing,
        timing: Timing,
        now: Instant,
    ) {
        let timeout = timing.election_timeout();
        let term = me.vote.leader_id().term;
        let leading = me.state == ServerState::Leader;
        if leading && self.since.is_none_or(|(t, _)| t != term) {
            // A leadership of a new term: judged after a whole timeout.
            self.since = Some((term, now));
        }
        let age = self
            .since
            .map_or(Duration::ZERO, |(_, at)| now.saturating_duration_since(at));
        let silent_ms = me.quorum_acked_ms.filter(|_| leading);
        // Unknown (just elected, or the membership changed) is not silent.
        let lost = age >= timeout && silent_ms.is_some_and(|ms| ms >= timeout.as_millis() as u64);
        if lost && self.heartbeats {
            tracing::warn!(
                term,
                silent_ms,
                "no majority heard from: stepping back so that the others can elect a leader"
            );
            step_back(raft, network, true);
            self.heartbeats = false;
            self.since = Some((term, now));
        } else if !leading && !self.heartbeats {
            tracing::info!(
                term,
                "no longer leading: heartbeats back on for when this node leads again"
            );
            step_back(raft, network, false);
            self.heartbeats = true;
        } else if leading && !self.heartbeats && age >= timeout * STEPPED_BACK_RETRY {
            tracing::warn!(
                term,
                "stepped back and no later term came: trying the majority again"
            );
            step_back(raft, network, false);
            self.heartbeats = true;
            self.since = Some((term, now));
        }
        debug_assert!(
            self.heartbeats || leading,
            "only a leader is ever stepped back"
        );
    }
}

/// Steps a leader back (`true`: no more heartbeats, append-entries or snapshots, so its
/// followers' leases run out and they elect another), or forward again (`false`).
pub fn step_back(raft: &Raft<Muster>, network: &Network, back: bool) {
    raft.runtime_config().heartbeat(!back);
    network.set_quiet(back);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn voters_wait_in_slots_of_their_own_in_id_order() {
        let timing = Timing::default();
        let voters = BTreeSet::from([1, 4, 9]);
        let lease = timing.leader_lease();
        for _ in 0..100 {
            // Half of the 400 ms timeout, cut in three slots of 66 ms.
            let slot = |id| {
                let w = Waits::draw(timing, id, &voters);
                assert!(
                    (Duration::from_millis(400)..=Duration::from_millis(600))
                        .contains(&w.after_try)
                );
                assert!(
                    (Duration::from_millis(100)..=Duration::from_millis(200))
                        .contains(&w.after_pre_vote)
                );
                (w.after_leader - lease).as_millis()
            };
            assert!((0..66).contains(&slot(1)));
            assert!((66..132).contains(&slot(4)));
            assert!((132..198).contains(&slot(9)));
        }
    }
}
