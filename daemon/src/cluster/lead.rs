//! A cluster node's dispatcher: its life cycle (follow → lead in a term → deposed →
//! follow), and the leader's side of a round, getting the cluster to agree on it.
//!
//! The node's dispatcher thread follows, answering every request with `not_leader`,
//! until the node leads with every log entry applied; then it opens the engine over the
//! store, as a restart does, and serves rounds whose durability step is the cluster's
//! agreement ([`Leading`], a [`Commit`]); when the node stops leading it drops the
//! engine (and the round its store held back) and follows again. Each change bumps a
//! generation, on which the server closes every client connection. Following, the
//! thread still watches the disk and publishes the node's gauges (the disk, the store's
//! size, the tasks its state machine applied, its raft positions), so that every node
//! exports them, not only the leader.

use std::collections::VecDeque;
use std::sync::mpsc::TryRecvError;
use std::time::{Duration, Instant};

use muster_protocol::ErrorBody;
use tracing::info;

use super::Round;
use super::node::Node;
use crate::disk::DiskAlarm;
use crate::dispatcher::{
    self, Clock, Command, Commit, CommitStats, Dispatcher, Ended, EngineSettings, Output, Responder,
};
use crate::engine::{Engine, Now};
use crate::store::{HeldRound, Store, StoreError};

/// A round stops taking requests once its changes reach this many bytes; the rest wait
/// for the next round. Bounds a log entry (and so every node's memory for it).
pub const MAX_ROUND_BYTES: usize = 8 << 20;

/// Rounds a leader has proposed and not yet seen agreed on, at most: the next round
/// is made and proposed while these are being agreed on (pipelining), its replies
/// waiting for its own agreement and every earlier round's. Bounds the changes held in
/// memory (with [`MAX_ROUND_BYTES`]) and what a lost leadership leaves unknown.
pub const MAX_ROUNDS_IN_FLIGHT: usize = 8;

/// How often a node checks its role when no request comes: a follower, whether it
/// may lead now; a leader, whether it still does.
pub const CHECK_EVERY: Duration = Duration::from_millis(50);

/// Longest a leader waits for a round to be agreed on while it still hears from a
/// majority (a slow disk on the others). Past it, or as soon as the leader has not heard
/// from a majority for the election timeout (see `timing::Timing`), the round's requests
/// get `outcome_unknown` and the node stops serving until its log is settled again.
pub const AGREEMENT_TIMEOUT: Duration = Duration::from_secs(2);

/// Starts the dispatcher thread of a cluster node (see the module's doc).
pub fn start(
    (store, round): (Store, HeldRound),
    node: Node,
    settings: EngineSettings,
    mut disk: DiskAlarm,
    generation: tokio::sync::watch::Sender<u64>,
) -> anyhow::Result<Dispatcher> {
    Dispatcher::spawn(CommitStats::default(), move |rx, wake, stats| {
        // The term of the last engine built: 0 before the first.
        let mut last_term = 0;
        loop {
            let Some(term) = follow(&rx, &node, &store, &mut disk, stats) else {
                info!("dispatcher stopped while following");
                return Ok(());
            };
            assert!(
                term >= last_term,
                "terms never go back: leading in {term} after {last_term}"
            );
            last_term = term;
            let leading = Leading {
                node: node.clone(),
                term,
                round: round.clone(),
                in_flight: VecDeque::with_capacity(MAX_ROUNDS_IN_FLIGHT),
                wake: wake.clone(),
            };
            let ended = lead(
                &rx,
                leading,
                &store,
                &settings,
                &mut disk,
                stats,
                &generation,
            )?;
            // IMPORTANT: the engine is gone, and with it whatever its last round held.
            round.drop_all();
            match ended {
                Ended::Stopped => return Ok(()),
                Ended::Deposed => {
                    info!(term, "no longer leading: following");
                    node.set_serving(None);
                    generation.send_modify(|g| *g += 1);
                }
            }
        }
    })
}

/// Serves as the `leading` node's leader of its term, over an engine opened for it,
/// until the node no longer leads in that term or the daemon stops.
fn lead(
    rx: &flume::Receiver<Command>,
    mut leading: Leading,
    store: &Store,
    settings: &EngineSettings,
    disk: &mut DiskAlarm,
    stats: &CommitStats,
    generation: &tokio::sync::watch::Sender<u64>,
) -> Result<Ended, StoreError> {
    let (opening, term) = (Instant::now(), leading.term);
    assert!(term > 0, "a node leads in a term above 0");
    let applied = super::storage::Applied::of(store)?;
    let clock = Clock::floored(applied.wall_ms);
    let mut engine = dispatcher::open_engine(store.clone(), &clock, settings, disk, stats)?;
    info!(
        term,
        opened_ms = opening.elapsed().as_millis() as u64,
        "leading: serving clients"
    );
    leading.node.set_serving(Some(term));
    generation.send_modify(|g| *g += 1);
    dispatcher::run(
        &mut engine,
        rx,
        &mut leading,
        &clock,
        disk,
        stats,
        &settings.snapshot_root,
    )
}

/// Answers every request with `not_leader` until the node may lead; returns the term
/// it leads in, or `None` on shutdown. Meanwhile it watches the disk (the alarm and
/// its gauges, as a serving node does) and publishes the node's gauges, the store's
/// size and the tasks the node applied (`Node::publish_gauges`).
fn follow(
    rx: &flume::Receiver<Command>,
    node: &Node,
    store: &Store,
    disk: &mut DiskAlarm,
    stats: &CommitStats,
) -> Option<u64> {
    // Published at once: a node that stops leading goes on with every gauge.
    let mut gauges_at: Option<Instant> = None;
    let mut disk_at: Option<Instant> = None;
    loop {
        if let Some(term) = node.ready_to_lead() {
            return Some(term);
        }
        if disk_at.is_none_or(|at| at.elapsed() >= crate::disk::CHECK_INTERVAL) {
            match disk.check() {
                Ok((_, on)) => stats
                    .disk_alarm
                    .store(on, std::sync::atomic::Ordering::Relaxed),
                Err(e) => tracing::warn!("reading the data directory's free space: {e}"),
            }
            disk_at = Some(Instant::now());
        }
        if gauges_at.is_none_or(|at| at.elapsed() >= crate::metrics::GAUGE_INTERVAL) {
            node.publish_gauges(false);
            // A failure to read the sizes only leaves the gauge at its last value.
            if let Ok(bytes) = store.disk_space() {
                metrics::gauge!("muster_store_size_bytes").set(bytes as f64);
            }
            gauges_at = Some(Instant::now());
        }
        match rx.recv_timeout(CHECK_EVERY) {
            Ok(Command::Request(_, responder)) => responder.refuse(node.not_leader()),
            Ok(Command::Heard(_) | Command::Disconnected(_) | Command::Wake) => {}
            Ok(Command::Shutdown) | Err(flume::RecvTimeoutError::Disconnected) => return None,
            Err(flume::RecvTimeoutError::Timeout) => {}
        }
    }
}

/// A node leading in one term, with the engine built for that term.
pub struct Leading {
    node: Node,
    term: u64,
    /// The round the engine's store holds back.
    round: HeldRound,
    /// The rounds made and not yet told, oldest first: at most
    /// [`MAX_ROUNDS_IN_FLIGHT`].
    in_flight: VecDeque<InFlight>,
    /// The dispatcher's channel, to wake it when a round is agreed on.
    wake: flume::WeakSender<Command>,
}

/// A round made and not yet told.
struct InFlight {
    agreement: Agreement,
    /// Its replies and pushes.
    output: Output,
    /// Requests it applied.
    requests: u64,
}

/// What a round waits for before its output may leave (besides every earlier round).
enum Agreement {
    /// Its changes (round `number` of the held rounds) committed on a majority and
    /// applied here: true, or false if they were not.
    Proposed(u64, std::sync::mpsc::Receiver<bool>),
    /// No changes, only replies: the leadership confirmed once the earlier rounds
    /// are told (what it read may be theirs).
    Confirm,
}

impl Leading {
    /// Whether the node still leads in the engine's term, with a majority heard lately.
    pub fn is_leading(&self) -> bool {
        self.node.leads_in(self.term)
    }

    /// Hands on the output of the oldest rounds once agreed on, in order: every one
    /// already agreed on, and with `wait` the oldest too, however long its agreement
    /// takes (bounded by [`AGREEMENT_TIMEOUT`]). A round not agreed on ends the
    /// leadership: it and every later round get `outcome_unknown`, and the error is the
    /// answer to the requests not yet applied.
    fn release(&mut self, stats: &CommitStats, mut wait: bool) -> Result<(), ErrorBody> {
        while let Some(oldest) = self.in_flight.front_mut() {
            // Whether it was agreed on, and whether it held changes.
            let (agreed, proposed) = match &mut oldest.agreement {
                Agreement::Proposed(number, agreed) => {
                    let agreed = match agreed.try_recv() {
                        Ok(agreed) => agreed,
                        Err(TryRecvError::Empty) if !wait => return Ok(()),
                        // The proposal's task ends within AGREEMENT_TIMEOUT.
                        Err(TryRecvError::Empty) => agreed.recv().unwrap_or(false),
                        Err(TryRecvError::Disconnected) => false,
                    };
                    if agreed {
                        self.round.applied(*number);
                    }
                    (agreed, true)
                }
                Agreement::Confirm => (
                    self.node.confirm_leadership(self.term, AGREEMENT_TIMEOUT),
                    false,
                ),
            };
            wait = false;
            let oldest = self.in_flight.pop_front().expect("the oldest round");
            if !agreed {
                oldest.output.unknown();
                self.abandon();
                return Err(self.node.not_leader());
            }
            if proposed {
                // A round of changes agreed on is a round made durable: counted as a
                // sync. Its fsync is the leader's append of its one log entry, which
                // the raft log times (`muster_fsync_seconds`, cluster::storage).
                stats.counted(oldest.requests);
            }
            oldest.output.send();
        }
        Ok(())
    }

    /// Answers every round in flight with `outcome_unknown`: the leadership ended
    /// before they were agreed on (they may still be, by the next leader).
    fn abandon(&mut self) {
        for round in self.in_flight.drain(..) {
            round.output.unknown();
        }
    }
}

impl Commit for Leading {
    /// A round stops at [`MAX_ROUND_BYTES`] of changes.
    fn has_room(&self) -> bool {
        self.round.bytes() < MAX_ROUND_BYTES
    }

    /// Proposes the round's changes and goes on: its output leaves once it and every
    /// earlier round are agreed on ([`Leading::release`]). Waits only when
    /// [`MAX_ROUNDS_IN_FLIGHT`] rounds are, or when the round asked for a snapshot
    /// (written once everything made so far is applied).
    fn finish(
        &mut self,
        engine: &mut Engine<Responder>,
        now: Now,
        requests: u64,
        stats: &CommitStats,
    ) -> Result<Result<(), ErrorBody>, StoreError> {
        // Whether the round changed the store is whether it holds changes.
        engine.take_dirty();
        let output = Output::take(engine);
        let (number, changes) = self.round.take();
        let agreement = if !changes.is_empty() {
            let round = Round {
                term: self.term,
                wall_ms: now.wall_ms,
                changes,
            };
            let wake = self.wake.clone();
            let agreed = self
                .node
                .propose(self.term, round, AGREEMENT_TIMEOUT, move || {
                    // A full channel wakes the dispatcher anyway.
                    if let Some(tx) = wake.upgrade() {
                        let _ = tx.try_send(Command::Wake);
                    }
                });
            let proposed = self.in_flight.len() + 1;
            metrics::histogram!("muster_cluster_rounds_in_flight").record(proposed as f64);
            Some(Agreement::Proposed(number, agreed))
        } else if !output.is_empty() {
            Some(Agreement::Confirm)
        } else {
            None
        };
        if let Some(agreement) = agreement {
            self.in_flight.push_back(InFlight {
                agreement,
                output,
                requests,
            });
        }
        // A snapshot is written from what is applied: everything made so far.
        let all = engine.wants_snapshot();
        while !self.in_flight.is_empty() && (all || self.in_flight.len() >= MAX_ROUNDS_IN_FLIGHT) {
            if let Err(refusal) = self.release(stats, true) {
                return Ok(Err(refusal));
            }
        }
        assert!(
            self.in_flight.len() < MAX_ROUNDS_IN_FLIGHT,
            "at most MAX_ROUNDS_IN_FLIGHT rounds are agreed on at once"
        );
        Ok(self.release(stats, false))
    }

    fn serving(&mut self, stats: &CommitStats) -> Result<(), ErrorBody> {
        self.release(stats, false)?;
        if self.is_leading() {
            return Ok(());
        }
        self.abandon();
        Err(self.node.not_leader())
    }

    fn settle(&mut self, stats: &CommitStats) {
        while !self.in_flight.is_empty() {
            if self.release(stats, true).is_err() {
                return;
            }
        }
    }

    fn check_every(&self) -> Duration {
        CHECK_EVERY
    }

    fn publish_gauges(&self) {
        self.node.publish_gauges(true);
    }
}
