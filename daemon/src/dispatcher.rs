//! The dispatcher thread: the engine's only caller, and where group commit happens.
//!
//! Connection tasks send [`Command`]s over a bounded channel. The thread takes every
//! command waiting (up to [`MAX_ROUND`]), applies each to the engine (each commits its
//! own atomic fjall batch, unsynced), runs the timers, then persists the journal once
//! and only then releases the round's replies. Concurrent requests therefore share one
//! fsync, and a reply never leaves before its change is durable. A lone request still
//! gets its fsync at once: the thread never waits for company. A plain renewal changes
//! nothing the store needs (a restart gives every lease a full period), so a round of
//! them alone has nothing to persist.
//!
//! fjall blocks (fsync, write stalls), which is why this is an OS thread and not a tokio task.
//!
//! How a round becomes durable is a [`Commit`], which also hands on the round's output
//! once it is: a single daemon persists its journal ([`Persisting`]); on a cluster node
//! the cluster agrees on the round instead (several rounds in flight at once, told in
//! order), and the thread serves only while its node leads (its life cycle, follow → lead → deposed,
//! is `cluster::lead::start`). This module knows nothing of clusters.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use tokio::sync::{OwnedSemaphorePermit, mpsc};
use tracing::{debug, debug_span, info};

use muster_protocol::ops::SnapshotReply;
use muster_protocol::{ErrorBody, ErrorCode, Push, ops::EngineRequest};

use crate::auth::Principal;
use crate::disk::DiskAlarm;
use crate::engine::audit;
use crate::engine::{Engine, Now, Reply, Sink, Waiter};
use crate::store::StoreView;
use crate::store::{Persist, Store, StoreError};

/// Most commands applied in one round. Bounds the latency a round adds to its first
/// request and the replies held back at once.
pub const MAX_ROUND: usize = 4096;

/// Commands the channel holds before senders wait: backpressure on the connections.
pub const CHANNEL_CAPACITY: usize = 16 * 1024;

/// A round taking longer than this (requests applied, timers run, journal persisted,
/// replies handed on) is logged with where its time went.
pub const SLOW_ROUND: Duration = Duration::from_millis(20);

/// Longest the thread sleeps with no timer due, so it notices a dropped channel.
const IDLE_WAKE: Duration = Duration::from_secs(1);

/// Whether replies wait for fsync.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Durability {
    /// fsync (fdatasync) every round before its replies leave: nothing acknowledged is lost.
    Sync,
    /// Hand the journal to the OS every round without fsync: survives a daemon crash,
    /// but a power loss or kernel crash loses the last moments of acknowledged work.
    Buffered,
}

impl Durability {
    /// How far a round is persisted in this mode.
    pub fn persist(self) -> Persist {
        match self {
            Durability::Sync => Persist::Data,
            Durability::Buffered => Persist::Os,
        }
    }

    /// The mode's name, as the command line and `server_stats` spell it.
    pub fn name(self) -> &'static str {
        match self {
            Durability::Sync => "sync",
            Durability::Buffered => "buffered",
        }
    }
}

/// A message from a connection to the dispatcher thread.
pub enum Command {
    /// A decoded request (boxed: a command moves through a channel, and the largest
    /// requests are several times the others) and where its reply goes.
    Request(Box<EngineRequest>, Responder),
    /// Packets arrived on these connections since they were last reported: they are
    /// alive.
    Heard(Vec<u64>),
    /// A connection ended (its member session, if any, ends too).
    Disconnected(u64),
    /// Persist, then stop.
    Shutdown,
    /// Nothing to apply: a round made earlier became durable (on a cluster, was agreed
    /// on), so its replies may leave now ([`Commit::serving`] hands them on).
    Wake,
}

/// A frame for a stream's writer.
pub enum Outgoing {
    /// A reply. It holds its request's [`Slot`]: a client that sends but never reads
    /// cannot make the daemon queue replies without bound.
    Reply {
        /// The request id; `None` for a frame whose id could not be read.
        id: Option<u64>,
        /// The reply.
        result: Box<Result<Reply, ErrorBody>>,
        /// The request's slot.
        slot: Slot,
    },
    /// A push to a member session (bounded by the member's leases) or of a watch (with
    /// the watch's flag, cleared once the push is encoded: one queued push per watch).
    Push(Box<Push>, Option<Arc<AtomicBool>>),
    /// Deliver what came before, then close the connection with this code and reason.
    Close(u32, &'static [u8]),
}

impl Outgoing {
    /// A reply holding its request's slot.
    pub fn reply(id: Option<u64>, result: Result<Reply, ErrorBody>, slot: Slot) -> Self {
        Outgoing::Reply {
            id,
            result: Box::new(result),
            slot,
        }
    }
}

/// What a request holds of its connection's budgets until its reply is out: a place of
/// the in-flight limit (until the reply is encoded) and the most bytes its reply can
/// take (until the reply is written to the stream).
pub struct Slot {
    /// A place of the connection's in-flight limit.
    pub in_flight: OwnedSemaphorePermit,
    /// The reply's bytes, in KiB, of the connection's reply budget.
    pub reply_bytes: OwnedSemaphorePermit,
}

/// Where a request's reply goes: its stream's writer, with the request's slot.
pub struct Responder {
    out: mpsc::UnboundedSender<Outgoing>,
    connection: u64,
    principal: Option<Arc<Principal>>,
    id: u64,
    slot: Slot,
}

impl Responder {
    /// A responder for request `id` of `connection` (authenticated as `principal`),
    /// writing to `out`.
    pub fn new(
        out: mpsc::UnboundedSender<Outgoing>,
        connection: u64,
        principal: Option<Arc<Principal>>,
        id: u64,
        slot: Slot,
    ) -> Self {
        Responder {
            out,
            connection,
            principal,
            id,
            slot,
        }
    }

    /// Answers with an error without the request reaching the engine.
    pub fn refuse(self, error: ErrorBody) {
        self.send(Err(error));
    }

    fn send(self, result: Result<Reply, ErrorBody>) {
        // The stream may be gone; its client then never sees the reply, as after a crash.
        let _ = self
            .out
            .send(Outgoing::reply(Some(self.id), result, self.slot));
    }
}

impl Waiter for Responder {
    type Sink = PushSink;

    fn is_closed(&self) -> bool {
        self.out.is_closed()
    }

    fn connection(&self) -> u64 {
        self.connection
    }

    fn sink(&self) -> PushSink {
        PushSink {
            out: self.out.clone(),
        }
    }

    fn principal(&self) -> Option<&Principal> {
        self.principal.as_deref()
    }
}

/// The stream a member session's pushes go to.
#[derive(Clone)]
pub struct PushSink {
    out: mpsc::UnboundedSender<Outgoing>,
}

impl PushSink {
    fn send(&self, push: Push, queued: Option<Arc<AtomicBool>>) {
        // A session whose stream is gone misses the push; its leases stay its own.
        let _ = self.out.send(Outgoing::Push(Box::new(push), queued));
    }
}

impl Sink for PushSink {
    fn is_closed(&self) -> bool {
        self.out.is_closed()
    }
}

/// Counters of the group commit, read by logs and stats.
#[derive(Debug, Default)]
pub struct CommitStats {
    /// Rounds that persisted.
    pub syncs: AtomicU64,
    /// Requests applied in rounds that persisted.
    pub synced_requests: AtomicU64,
    /// The disk alarm is on (see [`crate::disk`]).
    pub disk_alarm: AtomicBool,
    /// Wall-clock milliseconds when the dispatcher started, for the uptime.
    pub started_ms: AtomicU64,
    /// Connected member sessions, as of the last gauge refresh.
    pub members_connected: AtomicU64,
    /// Microseconds the latest persist took.
    pub fsync_last_us: AtomicU64,
    /// Microseconds of every persist added up.
    pub fsync_total_us: AtomicU64,
}

impl CommitStats {
    /// Counts a round that made `requests` requests' changes durable.
    pub(crate) fn counted(&self, requests: u64) {
        metrics::histogram!("muster_fsync_batch_requests").record(requests as f64);
        self.syncs.fetch_add(1, Ordering::Relaxed);
        self.synced_requests.fetch_add(requests, Ordering::Relaxed);
    }
}

/// The running dispatcher: a channel in, a thread behind it.
pub struct Dispatcher {
    /// Where connections send commands.
    pub tx: flume::Sender<Command>,
    /// The group-commit counters.
    pub stats: Arc<CommitStats>,
    thread: JoinHandle<Result<(), StoreError>>,
}

/// What an engine is opened with.
pub struct EngineSettings {
    /// How long an unused member name stays reserved for its principal.
    pub member_name_expiry: Duration,
    /// The quotas.
    pub quotas: crate::engine::Quotas,
    /// The only directory admin snapshots are written in.
    pub snapshot_root: PathBuf,
}

/// Opens the engine over `store`: its state rebuilt from the store.
pub(crate) fn open_engine(
    store: Store,
    clock: &Clock,
    settings: &EngineSettings,
    disk: &mut DiskAlarm,
    stats: &CommitStats,
) -> Result<Engine<Responder>, StoreError> {
    let started = Instant::now();
    let mut engine = Engine::open(store, clock.now(), rand::random())?;
    engine.set_member_name_expiry(settings.member_name_expiry);
    engine.set_quotas(settings.quotas);
    // Before the first request: a daemon started on a full disk refuses enqueues at once.
    watch_disk(disk, &mut engine, stats);
    info!(
        elapsed_ms = started.elapsed().as_millis() as u64,
        "engine state rebuilt from the store"
    );
    Ok(engine)
}

impl Dispatcher {
    /// Opens the engine over the store (rebuilding its state) and starts the thread.
    pub fn start(
        store: Store,
        durability: Durability,
        settings: EngineSettings,
        mut disk: DiskAlarm,
    ) -> anyhow::Result<Dispatcher> {
        let clock = Clock::new();
        let stats = CommitStats::default();
        let mut engine = open_engine(store, &clock, &settings, &mut disk, &stats)?;
        Dispatcher::spawn(stats, move |rx, _, stats| {
            let mut commit = Persisting(durability.persist());
            let ended = run(
                &mut engine,
                &rx,
                &mut commit,
                &clock,
                &mut disk,
                stats,
                &settings.snapshot_root,
            )?;
            assert!(
                matches!(ended, Ended::Stopped),
                "a single daemon's dispatcher is never deposed"
            );
            Ok(())
        })
    }

    /// Starts the dispatcher thread: `body` takes the commands sent to the
    /// dispatcher until it returns (on shutdown, or with a store failure). It is also
    /// handed a weak sender of the same channel, to send itself [`Command::Wake`] (weak:
    /// the channel still closes when every connection and the [`Dispatcher`] are gone).
    pub(crate) fn spawn<F>(stats: CommitStats, body: F) -> anyhow::Result<Dispatcher>
    where
        F: FnOnce(
                flume::Receiver<Command>,
                flume::WeakSender<Command>,
                &CommitStats,
            ) -> Result<(), StoreError>
            + Send
            + 'static,
    {
        stats
            .started_ms
            .store(Clock::new().now().wall_ms, Ordering::Relaxed);
        let stats = Arc::new(stats);
        let (tx, rx) = flume::bounded(CHANNEL_CAPACITY);
        let (wake, thread_stats) = (tx.downgrade(), Arc::clone(&stats));
        let thread = std::thread::Builder::new()
            .name("muster-dispatch".into())
            .spawn(move || body(rx, wake, &thread_stats))
            .context("starting the dispatcher thread")?;
        Ok(Dispatcher { tx, stats, thread })
    }

    /// Asks the thread to persist and stop, and waits for it.
    pub fn stop(self) -> Result<(), StoreError> {
        // If the thread already ended, its result below says why.
        let _ = self.tx.send(Command::Shutdown);
        drop(self.tx);
        self.thread.join().unwrap_or_else(|_| {
            Err(StoreError::Corrupt {
                what: "dispatcher".into(),
                detail: "thread panicked".into(),
            })
        })
    }

    /// True once the thread has ended (it only ends on shutdown or a store failure).
    pub fn is_finished(&self) -> bool {
        self.thread.is_finished()
    }
}

/// Starts writing a snapshot of `view` into `dir` (inside `root`) on a thread of its
/// own (a copy of a large store takes a while: the dispatcher goes on meanwhile); the
/// thread answers.
fn start_snapshot(
    view: StoreView,
    root: PathBuf,
    dir: PathBuf,
    responder: Responder,
) -> JoinHandle<()> {
    let writer = move || {
        let principal = responder.principal.as_ref().map(|p| p.name.clone());
        let result = resolve_snapshot_dir(&root, &dir).and_then(|dir| write_snapshot(&view, &dir));
        if let Ok(reply) = &result {
            audit::record(
                principal.as_deref(),
                "admin_snapshot",
                &reply.dir,
                reply.tasks,
            );
        }
        responder.send(result.map(Reply::Snapshot));
    };
    std::thread::Builder::new()
        .name("muster-snapshot".into())
        .spawn(writer)
        .expect("starting the snapshot thread")
}

/// Waits for a finished (or still running) snapshot thread.
fn join_snapshot(snapshot: &mut Option<JoinHandle<()>>) {
    if let Some(thread) = snapshot.take() {
        // The thread answers its own request, errors included; a panic there has
        // already been reported by the panic hook and loses only that reply.
        let _ = thread.join();
    }
}

/// Where a snapshot asked for as `requested` goes: inside `root` (made if missing),
/// relative to it unless absolute. The directory's parent must exist and be inside the
/// root as it is, with no symbolic link or `..` on the way: an admin token may write a
/// copy of the store there and nowhere else the daemon's user can write.
fn resolve_snapshot_dir(root: &Path, requested: &Path) -> Result<PathBuf, ErrorBody> {
    let bad = |message: String| ErrorBody::new(ErrorCode::BadRequest, message);
    std::fs::create_dir_all(root).map_err(|e| {
        bad(format!(
            "creating the snapshot root {}: {e}",
            root.display()
        ))
    })?;
    let root = root.canonicalize().map_err(|e| {
        bad(format!(
            "resolving the snapshot root {}: {e}",
            root.display()
        ))
    })?;
    let wanted = root.join(requested);
    let (Some(parent), Some(name)) = (wanted.parent(), wanted.file_name()) else {
        return Err(bad(format!("{} names no new directory", wanted.display())));
    };
    let outside = || {
        bad(format!(
            "snapshot directory {} is not inside the snapshot root {} (symbolic links and .. are not followed; musterd --snapshot-root sets the root)",
            wanted.display(),
            root.display()
        ))
    };
    let real = match parent.canonicalize() {
        Ok(real) => real,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && parent.starts_with(&root) => {
            return Err(bad(format!(
                "creating {}: its parent does not exist",
                wanted.display()
            )));
        }
        Err(_) => return Err(outside()),
    };
    if real != parent || !real.starts_with(&root) {
        return Err(outside());
    }
    Ok(real.join(name))
}

/// Creates `dir` (its parent must exist, it must not) and writes the view into it. A
/// failed copy leaves no directory behind.
fn write_snapshot(view: &StoreView, dir: &Path) -> Result<SnapshotReply, ErrorBody> {
    let shown = dir.display().to_string();
    if let Err(e) = std::fs::create_dir(dir) {
        let code = if e.kind() == std::io::ErrorKind::AlreadyExists {
            ErrorCode::AlreadyExists
        } else {
            ErrorCode::BadRequest
        };
        return Err(ErrorBody::new(code, format!("creating {shown}: {e}")));
    }
    match view.write_to(dir) {
        Ok(counts) => Ok(SnapshotReply {
            dir: shown,
            tasks: counts.tasks,
            queues: counts.queues,
        }),
        Err(e) => {
            let _ = std::fs::remove_dir_all(dir);
            Err(ErrorBody::new(
                ErrorCode::BadRequest,
                format!("writing the snapshot to {shown}: {e}"),
            ))
        }
    }
}

/// Reads free space and hands the alarm to the engine. A failed reading (logged) leaves
/// the alarm as it was: it never stops the daemon.
fn watch_disk<W: Waiter>(disk: &mut DiskAlarm, engine: &mut Engine<W>, stats: &CommitStats) {
    match disk.check() {
        Ok((_, on)) => {
            engine.set_disk_alarm(on);
            stats.disk_alarm.store(on, Ordering::Relaxed);
        }
        Err(e) => tracing::warn!("reading the data directory's free space: {e}"),
    }
}

/// The real clock: wall time for users, a monotonic clock for leases.
pub(crate) struct Clock {
    origin: Instant,
    /// Wall time never reads earlier than this: a cluster leader's clock is floored at
    /// the last agreed round's time.
    floor_ms: u64,
}

impl Clock {
    pub(crate) fn new() -> Clock {
        Clock::floored(0)
    }

    pub(crate) fn floored(floor_ms: u64) -> Clock {
        Clock {
            origin: Instant::now(),
            floor_ms,
        }
    }

    pub(crate) fn now(&self) -> Now {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        Now {
            wall_ms: wall.max(self.floor_ms),
            mono_ms: self.origin.elapsed().as_millis() as u64,
        }
    }
}

/// How a round's changes become durable before its replies leave, and whether the
/// engine may go on serving.
pub(crate) trait Commit {
    /// Whether the round may take another request.
    fn has_room(&self) -> bool;

    /// Makes the round's changes durable (`requests` of them applied), or starts to,
    /// and owns its output from then on: the round's replies and pushes (taken from the
    /// engine) leave once its changes are durable, and after every earlier round's.
    /// When they were not made durable, nothing of the round may be told and the engine
    /// serves no more: the error is then the answer to the requests it will not see.
    fn finish(
        &mut self,
        engine: &mut Engine<Responder>,
        now: Now,
        requests: u64,
        stats: &CommitStats,
    ) -> Result<Result<(), ErrorBody>, StoreError>;

    /// Hands on the output of the rounds made durable since the last call, and says
    /// whether the engine may serve another round; if not, the answer to the requests
    /// it will not see (the output of rounds whose fate is unknown got
    /// `outcome_unknown`).
    fn serving(&mut self, stats: &CommitStats) -> Result<(), ErrorBody>;

    /// Waits for every round started to be made durable (or not) and hands on their
    /// output: the dispatcher is stopping.
    fn settle(&mut self, stats: &CommitStats);

    /// Longest the thread sleeps between two looks at [`Commit::serving`].
    fn check_every(&self) -> Duration;

    /// Publishes the gauges of what makes rounds durable (beside the engine's own).
    fn publish_gauges(&self);
}

/// A round's output, taken from the engine: what leaves once the round is durable.
pub(crate) struct Output {
    replies: Vec<(Responder, Result<Reply, ErrorBody>)>,
    pushes: Vec<(PushSink, Push)>,
    watch_pushes: Vec<(PushSink, Push, Arc<AtomicBool>)>,
}

impl Output {
    /// Takes the round's replies and pushes from the engine.
    pub(crate) fn take(engine: &mut Engine<Responder>) -> Output {
        Output {
            replies: engine.take_outbox().collect(),
            pushes: engine.take_pushes().collect(),
            watch_pushes: engine.take_watch_pushes().collect(),
        }
    }

    /// Whether there is nothing to tell.
    pub(crate) fn is_empty(&self) -> bool {
        self.replies.is_empty() && self.pushes.is_empty() && self.watch_pushes.is_empty()
    }

    /// Hands on a durable round's replies and pushes.
    pub(crate) fn send(self) {
        for (responder, result) in self.replies {
            responder.send(result);
        }
        for (sink, push) in self.pushes {
            sink.send(push, None);
        }
        for (sink, push, queued) in self.watch_pushes {
            sink.send(push, Some(queued));
        }
    }

    /// Answers a round that was not made durable: each reply becomes
    /// `outcome_unknown` (its change may or may not have been agreed on), and no push
    /// leaves.
    pub(crate) fn unknown(self) {
        for (responder, _) in self.replies {
            responder.send(Err(ErrorBody::new(
                ErrorCode::OutcomeUnknown,
                "the leader lost its leadership before this request's round was agreed on: it may or may not have taken effect",
            )));
        }
    }
}

/// A single daemon's commit: the journal persisted as far as this says.
pub struct Persisting(pub Persist);

impl Commit for Persisting {
    fn has_room(&self) -> bool {
        true
    }

    fn finish(
        &mut self,
        engine: &mut Engine<Responder>,
        _: Now,
        requests: u64,
        stats: &CommitStats,
    ) -> Result<Result<(), ErrorBody>, StoreError> {
        if engine.take_dirty() {
            // IMPORTANT: persist before any reply of this round leaves.
            let started = Instant::now();
            engine.store().persist(self.0)?;
            let took = started.elapsed();
            metrics::histogram!("muster_fsync_seconds").record(took.as_secs_f64());
            let took_us = took.as_micros() as u64;
            stats.fsync_last_us.store(took_us, Ordering::Relaxed);
            stats.fsync_total_us.fetch_add(took_us, Ordering::Relaxed);
            stats.counted(requests);
            debug!(requests, "round persisted");
        }
        Output::take(engine).send();
        Ok(Ok(()))
    }

    fn serving(&mut self, _: &CommitStats) -> Result<(), ErrorBody> {
        Ok(())
    }

    fn settle(&mut self, _: &CommitStats) {}

    fn check_every(&self) -> Duration {
        IDLE_WAKE
    }

    fn publish_gauges(&self) {}
}

/// Why [`run`] returned.
pub(crate) enum Ended {
    /// Shut down (or the channel closed).
    Stopped,
    /// The node stopped leading: the engine is dropped and the node follows.
    Deposed,
}

/// Serves rounds until shutdown, or until `commit` no longer serves (its round's
/// requests, and the rest waiting, are refused then).
pub(crate) fn run(
    engine: &mut Engine<Responder>,
    rx: &flume::Receiver<Command>,
    commit: &mut impl Commit,
    clock: &Clock,
    disk: &mut DiskAlarm,
    stats: &CommitStats,
    snapshot_root: &Path,
) -> Result<Ended, StoreError> {
    let mut round = std::collections::VecDeque::with_capacity(MAX_ROUND);
    let mut stopping = false;
    let mut gauges_at = Instant::now();
    let mut disk_at = Instant::now();
    // The thread writing a snapshot, if one was started: at most one at a time.
    let mut snapshot: Option<JoinHandle<()>> = None;
    while !stopping {
        let wake = engine
            .next_timer(clock.now())
            .map_or(IDLE_WAKE, |ms| Duration::from_millis(ms).min(IDLE_WAKE));
        stopping |= gather(rx, &mut round, wake.min(commit.check_every()));
        if let Err(refusal) = commit.serving(stats) {
            refuse_all(&mut round, &refusal);
            join_snapshot(&mut snapshot);
            return Ok(Ended::Deposed);
        }
        if disk_at.elapsed() >= crate::disk::CHECK_INTERVAL {
            watch_disk(disk, engine, stats);
            disk_at = Instant::now();
        }
        let now = clock.now();
        let mut requests = 0u64;
        let round_started = Instant::now();
        while commit.has_room() {
            let Some(cmd) = round.pop_front() else { break };
            requests += 1;
            stopping |= apply(engine, cmd, now)?;
        }
        let applied = round_started.elapsed();
        engine.tick(now)?;
        let ticked = round_started.elapsed();
        if let Err(refusal) = commit.finish(engine, now, requests, stats)? {
            refuse_all(&mut round, &refusal);
            join_snapshot(&mut snapshot);
            return Ok(Ended::Deposed);
        }
        let persisted = round_started.elapsed();
        start_snapshots(engine, &mut snapshot, snapshot_root);
        timed(
            requests,
            [applied, ticked, persisted, round_started.elapsed()],
        );
        if gauges_at.elapsed() >= crate::metrics::GAUGE_INTERVAL {
            engine.publish_gauges(clock.now());
            stats
                .members_connected
                .store(engine.connected_members() as u64, Ordering::Relaxed);
            commit.publish_gauges();
            gauges_at = Instant::now();
        }
    }
    commit.settle(stats);
    join_snapshot(&mut snapshot);
    engine.store().persist(Persist::All)?;
    info!("store persisted; dispatcher stopped");
    Ok(Ended::Stopped)
}

/// Waits up to `wake` for a first command when `round` is empty, then takes what else
/// is waiting, up to [`MAX_ROUND`]. True if the channel closed (the daemon stops).
fn gather(
    rx: &flume::Receiver<Command>,
    round: &mut std::collections::VecDeque<Command>,
    wake: Duration,
) -> bool {
    let mut closed = false;
    if round.is_empty() {
        match rx.recv_timeout(wake) {
            Ok(cmd) => round.push_back(cmd),
            Err(flume::RecvTimeoutError::Timeout) => {}
            Err(flume::RecvTimeoutError::Disconnected) => closed = true,
        }
    }
    while round.len() < MAX_ROUND {
        match rx.try_recv() {
            Ok(cmd) => round.push_back(cmd),
            Err(_) => break,
        }
    }
    assert!(
        round.len() <= MAX_ROUND,
        "a round holds at most MAX_ROUND commands"
    );
    closed
}

/// Applies one command to the engine. True if it asks the dispatcher to stop.
fn apply(engine: &mut Engine<Responder>, cmd: Command, now: Now) -> Result<bool, StoreError> {
    match cmd {
        Command::Request(req, responder) => {
            let span = debug_span!(
                "request",
                connection = responder.connection,
                id = responder.id,
                op = req.name()
            );
            let _entered = span.enter();
            engine.handle(*req, responder, now)?;
        }
        Command::Heard(connections) => {
            for connection in connections {
                engine.heard(connection, now);
            }
        }
        Command::Disconnected(connection) => engine.disconnected(connection),
        Command::Wake => {}
        Command::Shutdown => return Ok(true),
    }
    Ok(false)
}

/// Records a round's time, and logs where it went when it was slow: the `requests`
/// applied, the timers run, the round made durable (or, on a cluster, proposed) with
/// its output handed on by the commit, the snapshots started, each by the time since
/// the round began.
fn timed(requests: u64, [applied, ticked, persisted, took]: [Duration; 4]) {
    assert!(
        applied <= ticked && ticked <= persisted && persisted <= took,
        "a round's steps follow each other"
    );
    metrics::histogram!("muster_round_seconds").record(took.as_secs_f64());
    if took >= SLOW_ROUND {
        info!(
            requests,
            apply_us = applied.as_micros() as u64,
            timers_us = (ticked - applied).as_micros() as u64,
            persist_us = (persisted - ticked).as_micros() as u64,
            send_us = (took - persisted).as_micros() as u64,
            "slow round: replies waited {} ms",
            took.as_millis()
        );
    }
}

/// Starts the snapshots the round asked for, one at a time: another asked while one
/// is being written gets `limit`.
fn start_snapshots(
    engine: &mut Engine<Responder>,
    snapshot: &mut Option<JoinHandle<()>>,
    snapshot_root: &Path,
) {
    for (responder, dir) in engine.take_snapshots() {
        if snapshot.as_ref().is_some_and(|t| !t.is_finished()) {
            responder.send(Err(ErrorBody::new(
                ErrorCode::Limit,
                "a snapshot is being written; ask again once it is done",
            )));
            continue;
        }
        join_snapshot(snapshot);
        // After this round's persist: the view holds exactly what is durable.
        let view = engine.store().view();
        *snapshot = Some(start_snapshot(
            view,
            snapshot_root.to_path_buf(),
            dir,
            responder,
        ));
    }
}

/// Answers every request of `round` with `refusal`; other commands concern an engine
/// that is gone.
pub(crate) fn refuse_all(round: &mut std::collections::VecDeque<Command>, refusal: &ErrorBody) {
    for cmd in round.drain(..) {
        if let Command::Request(_, responder) = cmd {
            responder.refuse(refusal.clone());
        }
    }
}
