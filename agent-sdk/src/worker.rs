//! `Worker`: the agent loop.
//!
//! A worker opens a member session, subscribes to its queues and runs a handler per
//! pushed task. It renews every lease at a third of its length, carrying the handler's
//! latest progress, and fires the task's cancellation when a cancel is asked, the lease
//! is lost or revoked. The handler's [`Outcome`] becomes an ack, a nack or a dead-letter.
//!
//! A queue that does not exist yet (an agent started before its queue was created) is
//! waited for: logged once, subscribed to again with the worker's backoff until it
//! exists, the worker's other queues served meanwhile.
//!
//! Connections fail; work goes on. After a lost connection or a daemon restart the
//! worker reconnects with backoff and jitter, opens its session with `resume` (its
//! leases are kept, nothing is reclaimed, no failure is counted) and goes on renewing
//! and settling with the claims it holds. Only a fresh process start reclaims: the
//! daemon re-delivers what the member held before, with the last progress checkpoint.
//! On a cluster, a reply `not_leader` (the node no longer leads) or `outcome_unknown`
//! (its leadership ended before the request was agreed on) is taken as a lost
//! connection: the worker connects to the new leader ([`Client::connect`] finds it)
//! and resumes its session there, and settles whose outcome is unknown are sent again.
//!
//! Shutting down ([`WorkerHandle::shutdown`], a signal with
//! [`WorkerHandle::shutdown_on_signals`], or an operator's drain) stops taking work,
//! keeps renewing, tells handlers ([`Task::draining`]) and lets them finish within the
//! grace period. Then it cancels those still running, gives them [`STOP_LINGER`] to
//! return, releases what is left (no attempt spent, the latest checkpoint stored
//! first), closes the connection so the daemon sees the member gone at once, and
//! returns.
//!
//! **Leases by the agent's own clock.** Each lease has a local deadline: the instant
//! the renewal that granted it was sent plus the lease's length, less a safety margin
//! ([`lease_margin`]: 1 % of the lease for clock rates plus 100 ms). When no renewal
//! has been confirmed by the deadline less the stop window (the grace period, at most a
//! third of the lease), the handler is cancelled; at the deadline it is aborted and the
//! task forgotten. An agent cut off from the daemon therefore stops its work before
//! the daemon can lapse the lease and hand the task to anyone else. A pushed task's
//! first deadline comes from the daemon's wall-clock expiry (clocks assumed in sync
//! within the margin), bounded by the lease's length from its arrival.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::ops::ControlFlow;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::{mpsc, oneshot};
use tokio::task::{AbortHandle, JoinSet};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, warn};

use muster_protocol::limits::MAX_RESUME_HELD;
use muster_protocol::model::ChildOutcome;
use muster_protocol::model::{Chunk, Delivery, OnTimeout, Resumed};
use muster_protocol::ops::{
    LeaseRef, NewChild, SessionOpen, SettleReply, Spawn, SpawnReply, SpawnWait, SpawnedChild,
    SuspendReply, Unsubscribe,
};
use muster_protocol::{ErrorCode, Push, RawJson};

use crate::{Client, ConnectOptions, Error};

/// First delay before reconnecting; doubles per failed attempt.
const RECONNECT_BASE: Duration = Duration::from_millis(100);

/// Longest delay between reconnect attempts.
const RECONNECT_CAP: Duration = Duration::from_secs(5);

/// How often the worker checks for due renewals.
const TICK: Duration = Duration::from_millis(100);

/// Shortest time between two renewals of one lease.
const MIN_RENEW_INTERVAL: Duration = Duration::from_millis(100);

/// A new progress checkpoint is stored this soon (with an early renewal), so a reclaim
/// after a crash resumes from recent work.
const PROGRESS_INTERVAL: Duration = Duration::from_secs(1);

/// How long after the grace period a stopping worker waits for its last settles.
const SETTLE_LINGER: Duration = Duration::from_secs(5);

/// How long a handler cancelled by the worker (grace over) has to return its own
/// outcome before it is aborted and its task released.
pub const STOP_LINGER: Duration = Duration::from_secs(1);

/// Fraction of a lease kept back from the local deadline for clock-rate differences.
const CLOCK_RATE_MARGIN: f64 = 0.01;

/// Fixed part of the safety margin of a local lease deadline.
const LEASE_SLACK: Duration = Duration::from_millis(100);

/// How long before its local deadline a lease whose renewal is not confirmed is given
/// up (its handler cancelled): the grace period, at most a third of the lease.
fn stop_window(lease: Duration, grace: Duration) -> Duration {
    grace.min(lease / 3)
}

/// The safety margin of a local lease deadline: [`CLOCK_RATE_MARGIN`] of the lease plus
/// [`LEASE_SLACK`].
pub fn lease_margin(lease: Duration) -> Duration {
    lease.mul_f64(CLOCK_RATE_MARGIN) + LEASE_SLACK
}

/// What a worker is.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// The stable member name (e.g. `gpu-3/agent-7`); it survives restarts.
    pub member: String,
    /// Queues to take tasks from.
    pub queues: Vec<String>,
    /// Most tasks run at once.
    pub capacity: u32,
    /// Labels matched against tasks' `requires`.
    pub labels: Vec<String>,
    /// How long handlers get to finish on shutdown before their tasks are released.
    pub grace: Duration,
    /// Reclaim the member's leases on start (a restarted agent gets its work back).
    pub reclaim_on_start: bool,
    /// How long the daemon may not hear from this agent before it counts it
    /// unreachable and gives it nothing new (2 s to 60 s; the client pings every second).
    pub liveness: Duration,
}

impl WorkerConfig {
    /// A worker of capacity 1 with a 25 s grace period that reclaims on start.
    pub fn new<S: Into<String>>(
        member: impl Into<String>,
        queues: impl IntoIterator<Item = S>,
    ) -> WorkerConfig {
        WorkerConfig {
            member: member.into(),
            queues: queues.into_iter().map(Into::into).collect(),
            capacity: 1,
            labels: Vec::new(),
            grace: Duration::from_secs(25),
            reclaim_on_start: true,
            liveness: muster_protocol::limits::DEFAULT_LIVENESS,
        }
    }
}

/// What a handler decided about its task.
#[derive(Debug)]
pub enum Outcome {
    /// Done, with an optional result.
    Ack(Option<RawJson>),
    /// Failed; retry after `delay` (or the queue's backoff).
    Nack {
        /// Delay before the retry; the queue's backoff if absent.
        delay: Option<Duration>,
        /// What went wrong.
        error: String,
    },
    /// Failed for good: send it to dead.
    DeadLetter(String),
    /// Not done because a provider it calls throttled it (an HTTP 429): hand it back
    /// without counting a failure, and hold `limit` (every limit the task draws on if
    /// `None`) for `retry_after` (1 s if `None`) for the task's key.
    Throttled {
        /// How long the limit waits.
        retry_after: Option<Duration>,
        /// The limit the provider throttled.
        limit: Option<String>,
    },
    /// Not done, not failed: hand it back for another holder without counting a
    /// failure (the handler was stopped by a drain or a cancel). A cancelled task
    /// released ends `cancelled`.
    Release,
    /// Suspended by [`Task::suspend`]: nothing left to settle. Returned without a
    /// successful suspend, the task is released instead.
    Suspended,
}

/// What [`Task::suspend`] asks for: why (shown to people), how long it may wait, and
/// what its timeout does.
#[derive(Debug, Clone)]
pub struct Suspension {
    /// What the task waits for, shown to people.
    pub reason: String,
    /// How long it may wait; the daemon's default (7 days) if `None`.
    pub timeout: Option<Duration>,
    /// What the timeout does; `fail` if `None`.
    pub on_timeout: Option<OnTimeout>,
}

impl Suspension {
    /// A suspension for `reason`, with the daemon's default timeout and `fail`.
    pub fn new(reason: impl Into<String>) -> Suspension {
        Suspension {
            reason: reason.into(),
            timeout: None,
            on_timeout: None,
        }
    }

    /// Waits at most `timeout`, then does `on_timeout`.
    pub fn timeout(mut self, timeout: Duration, on_timeout: OnTimeout) -> Suspension {
        self.timeout = Some(timeout);
        self.on_timeout = Some(on_timeout);
        self
    }
}

/// A task in a handler's hands.
pub struct Task {
    delivery: Delivery,
    cancel: CancellationToken,
    draining: CancellationToken,
    progress: Arc<Progress>,
    deadline: Arc<Mutex<Instant>>,
    /// The worker's loop, which sends a suspend for the task.
    events: mpsc::UnboundedSender<Event>,
    /// Its live output.
    output: crate::output::Output,
}

/// A task's latest checkpoint and whether the daemon has it yet.
#[derive(Default)]
struct Progress {
    latest: Mutex<Option<RawJson>>,
    unsent: AtomicBool,
}

impl Task {
    /// The task's id.
    pub fn id(&self) -> &str {
        &self.delivery.id
    }

    /// The whole delivery: payload, attempt, failures, queue, key, lease.
    pub fn delivery(&self) -> &Delivery {
        &self.delivery
    }

    /// The payload.
    pub fn payload(&self) -> &RawJson {
        &self.delivery.payload
    }

    /// How the task's last suspension ended, if it was suspended and resumed: the
    /// resume's data and who sent it, or `timed_out`.
    pub fn resumed(&self) -> Option<&Resumed> {
        self.delivery.resumed.as_deref()
    }

    /// Suspends the task instead of settling it: its lease ends (the worker's slot is
    /// free, no attempt is spent, the checkpoint is kept) and it waits until someone
    /// resumes it with the reply's `resume_token` (or an approver by its id), or its
    /// timeout acts. Hand the token to whoever decides, then return
    /// [`Outcome::Suspended`]. Fails, leaving the lease held, when the worker is not
    /// connected or the daemon refuses (e.g. `lease_lost`).
    pub async fn suspend(&self, suspension: Suspension) -> Result<SuspendReply, Error> {
        let reply = self.ask_suspend(suspension, None).await?;
        Ok(SuspendReply {
            state: reply.state,
            resume_token: reply.resume_token,
            timeout_at_ms: reply.timeout_at_ms,
        })
    }

    /// Spawns children of the task and suspends it until every child (of this and
    /// earlier spawns) has finished, in one change: its lease ends as with
    /// [`Task::suspend`] (`suspension.reason` is shown to people; its timeout bounds
    /// the wait), and its next holder finds each child's outcome in
    /// [`Task::children`]. Return [`Outcome::Suspended`] once it answers. A child key
    /// spawned before (by an earlier holder, say) is not spawned again. A suspend lost
    /// with its connection is asked again on the next.
    pub async fn spawn_and_wait(
        &self,
        mut children: Vec<NewChild>,
        suspension: Suspension,
    ) -> Result<SpawnReply, Error> {
        // The children are in the trace of the span spawning them (the handler's).
        crate::trace::fill(children.iter_mut().map(|c| &mut c.task));
        self.ask_suspend(suspension, Some(children)).await
    }

    /// Spawns children of the task, keeping its lease: each is a task of its own (in
    /// any queue) that names this one as its parent, enqueued once per child key (a
    /// key spawned before answers that child, `duplicate`). Cancelling this task
    /// cancels them. Fails when the worker is not connected (spawn again: keys make it
    /// safe) or the daemon refuses (e.g. `lease_lost`, `limit`).
    pub async fn spawn(&self, mut children: Vec<NewChild>) -> Result<Vec<SpawnedChild>, Error> {
        // The children are in the trace of the span spawning them (the handler's).
        crate::trace::fill(children.iter_mut().map(|c| &mut c.task));
        let (reply, answer) = oneshot::channel();
        let ask = Event::Spawn(SpawnAsk {
            id: self.delivery.id.clone(),
            epoch: self.delivery.epoch,
            children,
            answer: reply,
        });
        if self.events.send(ask).is_err() {
            return Err(Error::Closed("the worker has stopped".into()));
        }
        let reply = answer
            .await
            .unwrap_or_else(|_| Err(Error::Closed("the worker has stopped".into())))?;
        Ok(reply.children)
    }

    /// The outcome of each child the task waited for ([`Task::spawn_and_wait`]), as
    /// its wait ended: empty if it did not wait for children.
    pub fn children(&self) -> &[ChildOutcome] {
        self.resumed().map_or(&[], |r| &r.children)
    }

    /// The task that spawned this one, if it is a child.
    pub fn parent(&self) -> Option<&str> {
        self.delivery.parent.as_deref()
    }

    /// Appends a chunk to the task's live output, which anyone may follow
    /// ([`crate::Client::follow`], `muster tail -f`): buffered here and sent in
    /// batches, numbered in order, each stored once whatever the connection does. Waits
    /// while [`crate::output::OUTPUT_BUFFER_BYTES`] are buffered (the daemon holds a
    /// task to [`muster_protocol::limits::OUTPUT_RATE_BYTES`] per second). The worker
    /// sends what is buffered before it settles the task. Fails for a malformed chunk
    /// (more than [`muster_protocol::limits::MAX_CHUNK_BYTES`]), or once the lease is
    /// lost.
    pub async fn emit(&self, chunk: Chunk) -> Result<(), Error> {
        self.output.emit(chunk).await
    }

    /// [`Task::emit`] of a text chunk.
    pub async fn emit_text(&self, text: impl Into<String>) -> Result<(), Error> {
        self.output.emit(Chunk::text(text)).await
    }

    /// Waits until the daemon has every chunk emitted so far.
    pub async fn flush_output(&self) -> Result<(), Error> {
        self.output.flush().await
    }

    /// A handle on the task's output that can be moved elsewhere (a reader of a child
    /// process's stdout): [`Task::emit`] from it.
    pub fn output(&self) -> TaskOutput {
        TaskOutput(self.output.clone())
    }

    async fn ask_suspend(
        &self,
        suspension: Suspension,
        children: Option<Vec<NewChild>>,
    ) -> Result<SpawnReply, Error> {
        // Its output first: once suspended, the lease that may emit is gone.
        if let Err(e) = self.output.flush().await {
            warn!(task = %self.delivery.id, error = %e, "the task's output was not all sent");
        }
        let (reply, answer) = oneshot::channel();
        let ask = Event::Suspend(SuspendAsk {
            id: self.delivery.id.clone(),
            epoch: self.delivery.epoch,
            suspension,
            children,
            answer: reply,
        });
        if self.events.send(ask).is_err() {
            return Err(Error::Closed("the worker has stopped".into()));
        }
        answer
            .await
            .unwrap_or_else(|_| Err(Error::Closed("the worker has stopped".into())))
    }

    /// The delivery number, 1 on the first.
    pub fn attempt(&self) -> u64 {
        self.delivery.attempt
    }

    /// True if this task was reclaimed after the agent restarted.
    pub fn reclaimed(&self) -> bool {
        self.delivery.reclaimed
    }

    /// The latest progress checkpoint: the one set by this handler, else the one
    /// delivered (from a previous holder).
    pub fn progress(&self) -> Option<RawJson> {
        lock(&self.progress.latest).clone()
    }

    /// Sets a progress checkpoint; a renewal stores it within about a second.
    pub fn set_progress(&self, progress: RawJson) {
        *lock(&self.progress.latest) = Some(progress);
        self.progress.unsent.store(true, SeqCst);
    }

    /// Resolves when the task should stop: a cancel was asked, its lease was lost,
    /// revoked or may lapse before a renewal gets through, or the worker's grace period
    /// is over.
    pub async fn cancelled(&self) {
        self.cancel.cancelled().await;
    }

    /// True once the task should stop.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// Resolves when the worker begins to shut down: finish within the grace period,
    /// or checkpoint ([`Task::set_progress`]) and return [`Outcome::Release`].
    pub async fn draining(&self) {
        self.draining.cancelled().await;
    }

    /// True once the worker is shutting down.
    pub fn is_draining(&self) -> bool {
        self.draining.is_cancelled()
    }

    /// The latest instant this agent knows its lease to be held, by its own clock: the
    /// handler is aborted then unless a renewal moved it. Work that must not outlive
    /// the lease (a child process) should be stopped by it.
    pub fn lease_deadline(&self) -> std::time::Instant {
        lock(&self.deadline).into_std()
    }
}

/// A task's live output, apart from the task ([`Task::output`]).
#[derive(Clone)]
pub struct TaskOutput(crate::output::Output);

impl TaskOutput {
    /// [`Task::emit`].
    pub async fn emit(&self, chunk: Chunk) -> Result<(), Error> {
        self.0.emit(chunk).await
    }

    /// [`Task::emit_text`].
    pub async fn emit_text(&self, text: impl Into<String>) -> Result<(), Error> {
        self.0.emit(Chunk::text(text)).await
    }
}

/// Controls a running worker from elsewhere.
#[derive(Clone)]
pub struct WorkerHandle {
    shutdown: CancellationToken,
}

impl WorkerHandle {
    /// Starts a graceful shutdown.
    pub fn shutdown(&self) {
        self.shutdown.cancel();
    }

    /// Starts a graceful shutdown on SIGTERM or SIGINT.
    pub fn shutdown_on_signals(&self) {
        let token = self.shutdown.clone();
        tokio::spawn(async move {
            #[cfg(unix)]
            {
                use tokio::signal::unix::{SignalKind, signal};
                let Ok(mut term) = signal(SignalKind::terminate()) else {
                    return;
                };
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                    () = token.cancelled() => return,
                }
            }
            #[cfg(not(unix))]
            {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    () = token.cancelled() => return,
                }
            }
            info!("signal received: draining");
            token.cancel();
        });
    }
}

/// The agent loop. See the module documentation.
pub struct Worker {
    options: ConnectOptions,
    config: WorkerConfig,
    shutdown: CancellationToken,
}

/// A settle to send: the outcome, and a checkpoint to store first (with a renewal) when
/// the task goes back to its queue.
struct Settle {
    id: String,
    epoch: u64,
    outcome: Outcome,
    progress: Option<RawJson>,
}

/// A task in hand.
struct Held {
    epoch: u64,
    cancel: CancellationToken,
    progress: Arc<Progress>,
    renew_at: Instant,
    renewed: Instant,
    renewing: bool,
    handler: AbortHandle,
    /// Set when the worker itself cancelled the handler (grace over): when it is
    /// aborted and its task released if it has not returned by then.
    stop_by: Option<Instant>,
    /// The local lease deadline, shared with the handler's [`Task`] and its watchdog.
    deadline: Arc<Mutex<Instant>>,
    /// Set by the watchdog when it cancelled the handler (no renewal confirmed in time).
    timed_out: Arc<AtomicBool>,
    /// Cancelled once the handler's future has ended.
    done: CancellationToken,
    /// A suspend of it is in flight (or waits for a connection): no renewal goes out
    /// meanwhile (one sent after the suspend would be refused and stop the handler that
    /// is about to get its token), and nothing settles or releases it until it is
    /// answered.
    suspending: bool,
    /// What its handler returned while its suspend was in flight: settled if the
    /// suspend fails, dropped if it succeeds.
    deferred: Option<Outcome>,
}

/// A handler whose lease is gone, told to stop and not yet ended.
struct Stopping {
    handler: AbortHandle,
    done: CancellationToken,
    /// When it is aborted if it has not ended.
    abort_at: Instant,
}

/// What one step of serving a connection leads to: go on, or end the connection with
/// what [`Worker::serve`] returns (`Ok(true)`: the worker is done).
type Served = ControlFlow<Result<bool, Error>>;

/// Results of the worker's background calls, back to its loop.
enum Event {
    Done(String, u64, Outcome),
    /// A renewal's result, with the instant it was sent.
    Renewed(
        String,
        u64,
        Instant,
        Result<muster_protocol::ops::RenewReply, Error>,
    ),
    Settled(Settle, Result<SettleReply, Error>),
    /// The local deadline of a lease passed with no renewal confirmed.
    Expired(String, u64),
    /// A handler asks to suspend its task ([`Task::suspend`], [`Task::spawn_and_wait`]).
    Suspend(SuspendAsk),
    /// A suspend's result, for the loop and then the handler.
    Suspended(SuspendAsk, Result<SpawnReply, Error>),
    /// A handler spawns children, keeping its lease ([`Task::spawn`]).
    Spawn(SpawnAsk),
    /// A task's output flusher sends an emit ([`Task::emit`]).
    Emit(crate::output::EmitAsk),
}

/// How far past its abort time a suspended task's deadline is moved: its watchdog
/// sleeps through the grace period the handler has to hand its token on.
const SUSPENDED_WATCH: Duration = Duration::from_secs(3600);

/// Where a suspend's or a spawn's result goes: the handler that asked.
type SuspendAnswer = oneshot::Sender<Result<SpawnReply, Error>>;

/// A suspend to send: the task, its epoch, what it asks (with the children it spawns
/// when it waits for them), and who waits for the answer.
struct SuspendAsk {
    id: String,
    epoch: u64,
    suspension: Suspension,
    children: Option<Vec<NewChild>>,
    answer: SuspendAnswer,
}

/// A spawn to send, the lease kept.
struct SpawnAsk {
    id: String,
    epoch: u64,
    children: Vec<NewChild>,
    answer: SuspendAnswer,
}

impl Worker {
    /// A worker that will connect with `options`.
    pub fn new(options: ConnectOptions, config: WorkerConfig) -> Worker {
        Worker {
            options,
            config,
            shutdown: CancellationToken::new(),
        }
    }

    /// A handle to stop the worker.
    pub fn handle(&self) -> WorkerHandle {
        WorkerHandle {
            shutdown: self.shutdown.clone(),
        }
    }

    /// Runs until shut down (or drained) and every task is settled or released.
    ///
    /// Fails only when the session was taken over by another process under the same
    /// member name (`replaced`) or the daemon refuses the session or the subscription
    /// (e.g. a bad name, a queue the token may not consume). A queue that does not exist
    /// is not a failure: the worker waits for it (logged once), serving its other
    /// queues meanwhile.
    pub async fn run<H, F>(self, handler: H) -> Result<(), Error>
    where
        H: Fn(Task) -> F + Send + Sync + 'static,
        F: Future<Output = Outcome> + Send + 'static,
    {
        let mut run = Run {
            config: self.config,
            options: self.options,
            shutdown: self.shutdown,
            handler: Arc::new(handler),
            held: HashMap::new(),
            unsettled: Vec::new(),
            unsuspended: Vec::new(),
            settling: HashSet::new(),
            draining: None,
            opened: false,
            leader_moved: false,
            stopping: HashMap::new(),
            waiting_for: HashSet::new(),
            subscribe_again: None,
            subscribe_failures: 0,
            events: mpsc::unbounded_channel(),
            tasks: JoinSet::new(),
        };
        run.run().await
    }
}

struct Run<H> {
    config: WorkerConfig,
    options: ConnectOptions,
    shutdown: CancellationToken,
    handler: Arc<H>,
    held: HashMap<String, Held>,
    /// Settles that failed for want of a connection, to retry after reconnecting.
    unsettled: Vec<Settle>,
    /// Suspends asked while disconnected, or lost with their connection: sent again
    /// (a repeat is answered with a new token) on the next connection.
    unsuspended: Vec<SuspendAsk>,
    /// Settles in flight: the task and epoch of each.
    settling: HashSet<(String, u64)>,
    /// Set once stopping: when the grace period ends.
    draining: Option<Instant>,
    /// A session was opened once: later sessions resume instead of reclaiming.
    opened: bool,
    /// A reply on the current connection said the node no longer leads (or lost its
    /// leadership mid-request): the connection is given up as if lost.
    leader_moved: bool,
    /// Handlers of leases lost or revoked, told to stop and not yet ended.
    stopping: HashMap<String, Stopping>,
    /// Queues of the worker's that did not exist at its last subscription, each logged
    /// once when first missed.
    waiting_for: HashSet<String>,
    /// When to subscribe again, while a queue is waited for.
    subscribe_again: Option<Instant>,
    /// Subscriptions in a row that missed a queue, for the backoff.
    subscribe_failures: u32,
    events: (mpsc::UnboundedSender<Event>, mpsc::UnboundedReceiver<Event>),
    /// Every task the worker spawned but its handlers' own: renewals, settles, and each
    /// handler's watchers. Dropped with the run, which aborts what is left.
    tasks: JoinSet<()>,
}

impl<H, F> Run<H>
where
    H: Fn(Task) -> F + Send + Sync + 'static,
    F: Future<Output = Outcome> + Send + 'static,
{
    async fn run(&mut self) -> Result<(), Error> {
        let mut failures: u32 = 0;
        loop {
            if self.finished() {
                self.abandon();
                return Ok(());
            }
            let (client, pushes) = match self.open().await {
                Ok(session) => session,
                Err(e) if is_refusal(&e) => {
                    self.abandon();
                    return Err(e);
                }
                Err(e) => {
                    failures += 1;
                    let delay = backoff(failures);
                    warn!(error = %e, delay_ms = delay.as_millis() as u64, "cannot reach musterd; retrying");
                    self.pause(delay).await;
                    continue;
                }
            };
            failures = 0;
            let served = self.serve(&client, pushes).await;
            match served {
                Ok(true) => {
                    self.abandon();
                    // Tell the daemon before the process may exit: the member is gone now,
                    // not at the idle timeout.
                    client.close().await;
                    return Ok(());
                }
                Ok(false) if self.leader_moved => {
                    warn!("the musterd node is no longer the cluster's leader; reconnecting");
                    self.pause(backoff(1)).await;
                }
                Ok(false) => {
                    warn!("connection to musterd lost; reconnecting");
                    self.pause(backoff(1)).await;
                }
                Err(e) => {
                    self.abandon();
                    client.close().await;
                    return Err(e);
                }
            }
        }
    }

    /// True once stopping and nothing is left to settle, or the linger ran out.
    fn finished(&self) -> bool {
        match self.draining {
            Some(deadline) => {
                // A suspended task's handler may still be handing its token on.
                (self.held.is_empty()
                    && self.unsettled.is_empty()
                    && self.settling.is_empty()
                    && self.stopping.is_empty())
                    || Instant::now() >= deadline + STOP_LINGER + SETTLE_LINGER
            }
            None => false,
        }
    }

    /// Waits out a reconnect delay while still taking handler results and shutdown.
    async fn pause(&mut self, delay: Duration) {
        let until = Instant::now() + delay;
        let mut tick = tokio::time::interval(TICK);
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(until) => return,
                () = self.shutdown.cancelled(), if self.draining.is_none() => self.begin_drain(),
                Some(event) = self.events.1.recv() => self.offline(event),
                _ = tick.tick() => {
                    self.reap();
                    self.stop_overdue(None);
                }
            }
        }
    }

    fn begin_drain(&mut self) {
        if self.draining.is_none() {
            info!(member = %self.config.member, grace_ms = self.config.grace.as_millis() as u64, "draining");
            self.draining = Some(Instant::now() + self.config.grace);
        }
    }

    /// Once a stop is asked, begins the drain on a connection: stops subscriptions
    /// first. Sent before any release of the drain (requests on a connection arrive in
    /// order), so a released task is not pushed straight back. Called wherever a
    /// release may follow: the handler of a stopped task can return before this loop
    /// sees the stop.
    async fn drain_on(&mut self, client: &Client) {
        if self.draining.is_some() || !self.shutdown.is_cancelled() {
            return;
        }
        self.begin_drain();
        let unsubscribe = Unsubscribe {
            member: self.config.member.clone(),
        };
        match client.send(&unsubscribe).await {
            Ok(pending) => {
                self.tasks.spawn(async move {
                    if let Err(e) = pending.reply().await {
                        debug!(error = %e, "unsubscribe on drain");
                    }
                });
            }
            Err(e) => debug!(error = %e, "unsubscribe on drain"),
        }
    }

    /// Takes an event while disconnected: outcomes wait for the next connection.
    fn offline(&mut self, event: Event) {
        match event {
            Event::Done(id, epoch, outcome) => {
                if let Some(settle) = self.finish(id, epoch, outcome) {
                    self.unsettled.push(settle);
                }
            }
            Event::Renewed(id, epoch, sent, result) => self.renewed(id, epoch, sent, result),
            Event::Settled(settle, result) => self.settled(settle, result),
            Event::Expired(id, epoch) => self.expired(&id, epoch),
            // Sent once connected again (the lease is still held meanwhile).
            Event::Suspend(ask) => self.ask_suspend(None, ask),
            Event::Suspended(ask, result) => self.suspended(ask, result),
            Event::Spawn(ask) => self.send_spawn(None, ask),
            // The flusher sends it again once connected.
            Event::Emit(ask) => {
                let _ = ask
                    .answer
                    .send(Err(Error::Closed("the worker is not connected".into())));
            }
        }
    }

    async fn open(&mut self) -> Result<(Client, mpsc::UnboundedReceiver<Push>), Error> {
        let client = Client::connect(self.options.clone()).await?;
        let open = SessionOpen {
            member: self.config.member.clone(),
            labels: self.config.labels.clone(),
            capacity: self.config.capacity,
            reclaim: !self.opened && self.config.reclaim_on_start,
            resume: self.opened,
            held: self.opened.then(|| self.known_leases()).flatten(),
            liveness_ms: Some(self.config.liveness.as_millis() as u64),
        };
        let sent = Instant::now();
        let (reply, pushes) = client.open_session(&open).await?;
        // From now on this process holds the member's leases: never reclaim them again.
        self.opened = true;
        if !reply.reclaimed.is_empty() || reply.released > 0 || reply.dead > 0 {
            info!(
                reclaimed = reply.reclaimed.len(),
                released = reply.released,
                dead = reply.dead,
                "session opened"
            );
        }
        for delivery in reply.reclaimed {
            self.start(delivery, Some(sent));
        }
        // Asked to stop while disconnected: the new session takes no subscription, so
        // the releases the drain sends are not pushed straight back.
        if self.shutdown.is_cancelled() {
            self.begin_drain();
        }
        if self.draining.is_none() {
            self.subscribe(&client).await?;
        }
        Ok((client, pushes))
    }

    /// Every lease this worker knows it holds: running, stopping by its own clock, or
    /// finished with its settle in flight or waiting for a connection. A resumed session
    /// names them so that the daemon hands over any other lease of the member's (one
    /// granted in a round whose reply or push was lost with the old connection). `None`
    /// (the daemon keeps every lease) past [`MAX_RESUME_HELD`].
    fn known_leases(&self) -> Option<Vec<LeaseRef>> {
        let lease = |task: &String, epoch: u64| LeaseRef {
            task: task.clone(),
            epoch,
        };
        let known: Vec<LeaseRef> = (self.held.iter().map(|(id, h)| lease(id, h.epoch)))
            .chain(self.unsettled.iter().map(|s| lease(&s.id, s.epoch)))
            .chain(self.settling.iter().map(|(id, epoch)| lease(id, *epoch)))
            .collect();
        (known.len() <= MAX_RESUME_HELD).then_some(known)
    }

    /// Subscribes to the worker's queues that exist. A queue that does not exist (yet:
    /// an agent started before its queue was created) is waited for, not a failure: it
    /// is logged once (WARN, naming it), the others are served meanwhile, and the
    /// subscription is sent again with the worker's backoff until every queue exists.
    /// Any other refusal (`forbidden`, …) fails the worker.
    async fn subscribe(&mut self, client: &Client) -> Result<(), Error> {
        let member = &self.config.member;
        let mut missing = Vec::new();
        let subscribed = match client.subscribe(member, &self.config.queues).await {
            Err(e) if is_not_found(&e) => {
                let mut present = Vec::new();
                for queue in &self.config.queues {
                    match client.queue_describe(queue).await {
                        Ok(_) => present.push(queue.clone()),
                        Err(e) if is_not_found(&e) => missing.push(queue.clone()),
                        Err(e) => return Err(e),
                    }
                }
                if present.is_empty() {
                    Ok(())
                } else {
                    client.subscribe(member, &present).await
                }
            }
            other => other,
        };
        let raced = match subscribed {
            Ok(()) => false,
            // A queue deleted between the look and the subscription: the next try sees it.
            Err(e) if is_not_found(&e) => true,
            Err(e) => return Err(e),
        };
        for queue in &missing {
            if self.waiting_for.insert(queue.clone()) {
                warn!(queue = %queue, "the queue does not exist; waiting for it to be created");
            }
        }
        self.waiting_for.retain(|queue| {
            let found = !missing.contains(queue);
            if found {
                info!(queue = %queue, "the queue exists now; serving it");
            }
            !found
        });
        if missing.is_empty() && !raced {
            self.subscribe_failures = 0;
            self.subscribe_again = None;
        } else {
            self.subscribe_failures += 1;
            self.subscribe_again = Some(Instant::now() + backoff(self.subscribe_failures));
        }
        Ok(())
    }

    /// Serves one connection. Returns `Ok(true)` when the worker is done, `Ok(false)`
    /// when the connection was lost.
    async fn serve(
        &mut self,
        client: &Client,
        mut pushes: mpsc::UnboundedReceiver<Push>,
    ) -> Result<bool, Error> {
        // Settle what finished while disconnected, and renew everything at once: the
        // leases may be close to their end. A stop asked meanwhile unsubscribes first.
        self.leader_moved = false;
        self.drain_on(client).await;
        for settle in std::mem::take(&mut self.unsettled) {
            self.settle(client, settle);
        }
        let now = Instant::now();
        for held in self.held.values_mut() {
            held.renew_at = now;
            held.renewing = false;
        }
        let mut tick = tokio::time::interval(TICK);
        loop {
            let step = tokio::select! {
                () = self.shutdown.cancelled(), if self.draining.is_none() => {
                    self.drain_on(client).await;
                    ControlFlow::Continue(())
                }
                push = pushes.recv() => self.on_push(client, push).await,
                Some(event) = self.events.1.recv() => self.on_event(client, event).await,
                _ = tick.tick() => self.on_tick(client).await,
            };
            if let ControlFlow::Break(end) = step {
                return end;
            }
        }
    }

    /// What a push from the daemon does (`None`: the connection's pushes ended). Breaks
    /// with what [`Worker::serve`] returns when it ends the connection.
    async fn on_push(&mut self, client: &Client, push: Option<Push>) -> Served {
        match push {
            // Pushed before the unsubscribe landed: hand it back untouched.
            Some(Push::Deliver(delivery)) if self.shutdown.is_cancelled() => {
                self.drain_on(client).await;
                let settle = Settle {
                    id: delivery.id,
                    epoch: delivery.epoch,
                    outcome: Outcome::Release,
                    progress: None,
                };
                self.settle(client, settle);
            }
            Some(Push::Deliver(delivery)) => self.start(delivery, None),
            Some(Push::Cancel(lease)) => {
                if let Some(h) = self
                    .held
                    .get(&lease.task)
                    .filter(|h| h.epoch == lease.epoch)
                {
                    info!(task = %lease.task, "cancel requested");
                    h.cancel.cancel();
                }
            }
            Some(Push::Revoked(lease)) => {
                self.lost(&lease.task, lease.epoch, "revoked by an operator");
            }
            Some(Push::Drain) => {
                info!("drained by an operator");
                self.shutdown.cancel();
            }
            // The node stopped leading and ended the session: resume on the leader.
            Some(Push::Closed(error)) if leader_moved(&error.code) => {
                warn!(%error, "session closed by musterd");
                self.leader_moved = true;
                return ControlFlow::Break(Ok(false));
            }
            Some(Push::Closed(error)) => {
                warn!(%error, "session closed by musterd");
                return ControlFlow::Break(Err(Error::Server(error)));
            }
            // The client routes watch pushes to `watch_pushes`, never to a session.
            Some(Push::Watch(_)) => {}
            None => return ControlFlow::Break(Ok(false)),
        }
        ControlFlow::Continue(())
    }

    /// What an event of the worker's own tasks does (a handler ended, a renewal or
    /// settle answered, a lease's local deadline passed).
    async fn on_event(&mut self, client: &Client, event: Event) -> Served {
        match event {
            Event::Done(id, epoch, outcome) => {
                self.drain_on(client).await;
                if let Some(settle) = self.finish(id, epoch, outcome) {
                    self.settle(client, settle);
                }
            }
            Event::Renewed(id, epoch, sent, result) => self.renewed(id, epoch, sent, result),
            Event::Settled(settle, result) => self.settled(settle, result),
            Event::Expired(id, epoch) => self.expired(&id, epoch),
            Event::Suspend(ask) => self.ask_suspend(Some(client), ask),
            Event::Suspended(ask, result) => self.suspended(ask, result),
            Event::Spawn(ask) => self.send_spawn(Some(client), ask),
            Event::Emit(ask) => {
                let client = client.clone();
                self.tasks.spawn(async move {
                    let _ = ask.answer.send(client.call(&ask.req).await);
                });
            }
        }
        if self.leader_moved {
            return ControlFlow::Break(Ok(false));
        }
        ControlFlow::Continue(())
    }

    /// The periodic step: reap ended handlers, send settles and renewals due, subscribe
    /// again, end a drain whose time is up, and stop once everything is done.
    async fn on_tick(&mut self, client: &Client) -> Served {
        self.reap();
        self.drain_on(client).await;
        // Settles and suspends that failed on an earlier connection go out on this one.
        for settle in std::mem::take(&mut self.unsettled) {
            self.settle(client, settle);
        }
        for ask in std::mem::take(&mut self.unsuspended) {
            self.send_suspend(client, ask);
        }
        self.renew_due(client);
        // A queue waited for: subscribe again (never while draining).
        if self.draining.is_none() && self.subscribe_again.is_some_and(|at| Instant::now() >= at) {
            match self.subscribe(client).await {
                Ok(()) => {}
                Err(e) if is_refusal(&e) => return ControlFlow::Break(Err(e)),
                Err(Error::Server(e)) if leader_moved(&e.code) => {
                    self.leader_moved = true;
                    return ControlFlow::Break(Ok(false));
                }
                Err(_) => return ControlFlow::Break(Ok(false)),
            }
        }
        if let Some(deadline) = self.draining
            && Instant::now() >= deadline
        {
            self.stop_all();
        }
        self.stop_overdue(Some(client));
        if self.finished() {
            return ControlFlow::Break(Ok(true));
        }
        ControlFlow::Continue(())
    }

    /// A handler returned: the settle to send, unless its lease is no longer ours.
    fn finish(&mut self, id: String, epoch: u64, outcome: Outcome) -> Option<Settle> {
        if self.held.get(&id).is_none_or(|h| h.epoch != epoch) {
            self.stopping.remove(&id);
            return None;
        }
        if let Some(held) = self.held.get_mut(&id).filter(|h| h.suspending) {
            held.deferred = Some(outcome);
            return None;
        }
        let held = self.held.remove(&id)?;
        let outcome = match outcome {
            // A handler the worker stopped itself (grace over, or its lease unconfirmed
            // near its deadline) cannot fail its task.
            Outcome::Nack { .. } if held.stop_by.is_some() || held.timed_out.load(SeqCst) => {
                Outcome::Release
            }
            // Still held: its suspend failed or was never asked.
            Outcome::Suspended => {
                warn!(task = %id, epoch, "handler returned Suspended but the task is not suspended; releasing it");
                Outcome::Release
            }
            other => other,
        };
        Some(Settle {
            id,
            epoch,
            outcome,
            progress: unsent_progress(&held.progress),
        })
    }

    /// Starts a handler for a delivery. `sent` is when the request that brought it was
    /// sent (a claim or session open), if it came as a reply rather than a push.
    fn start(&mut self, delivery: Delivery, sent: Option<Instant>) {
        let (id, epoch) = (delivery.id.clone(), delivery.epoch);
        let cancel = CancellationToken::new();
        let done = CancellationToken::new();
        let progress = Arc::new(Progress {
            latest: Mutex::new(delivery.progress.clone()),
            unsent: AtomicBool::new(false),
        });
        let lease = Duration::from_millis(delivery.lease_ms);
        let first = first_deadline(&delivery, sent);
        if first <= Instant::now() {
            // It arrived too late (a push held up by a partition, say): the lease may
            // already be someone else's. Running it could only run it twice.
            warn!(task = %id, epoch, "delivery arrived after its lease may have lapsed; not run");
            return;
        }
        let deadline = Arc::new(Mutex::new(first));
        let timed_out = Arc::new(AtomicBool::new(false));
        let renew_at = renew_at(delivery.lease_expires_ms);
        info!(task = %id, epoch, attempt = delivery.attempt, reclaimed = delivery.reclaimed, "task started");
        let events = self.events.0.clone();
        let output = crate::output::Output::start(id.clone(), epoch, delivery.output, move |ask| {
            events.send(Event::Emit(ask)).is_ok()
        });
        let task = Task {
            delivery,
            cancel: cancel.clone(),
            draining: self.shutdown.clone(),
            progress: Arc::clone(&progress),
            deadline: Arc::clone(&deadline),
            events: self.events.0.clone(),
            output,
        };
        // The same task again (a new epoch): its old handler is void; the new one starts
        // once the old one has ended, so one agent never runs a task twice at once.
        if let Some(old) = self.held.get(&id) {
            assert!(
                epoch > old.epoch,
                "task {id} delivered at epoch {epoch} while epoch {} is held",
                old.epoch
            );
        }
        let handler = self.spawn_handler(task, done.clone());
        self.tasks.spawn(watch_deadline(
            (id.clone(), epoch),
            (Arc::clone(&deadline), Arc::clone(&timed_out)),
            stop_window(lease, self.config.grace),
            (cancel.clone(), handler.clone()),
            done.clone(),
            self.events.0.clone(),
        ));
        self.held.insert(
            id,
            Held {
                epoch,
                cancel,
                progress,
                renew_at,
                renewed: Instant::now(),
                renewing: false,
                handler,
                stop_by: None,
                deadline,
                timed_out,
                done,
                suspending: false,
                deferred: None,
            },
        );
    }

    /// Spawns the handler of `task` (after the previous handler of the same task, if
    /// one is still stopping, has ended) and its watcher, which sends its outcome as
    /// [`Event::Done`] and cancels `done` when it ends. Returns the handler's abort handle.
    fn spawn_handler(&mut self, task: Task, done: CancellationToken) -> AbortHandle {
        let (id, epoch) = (task.delivery.id.clone(), task.delivery.epoch);
        let previous = match self.stopping.remove(&id) {
            Some(s) => Some((s.handler, s.done)),
            None => self.held.remove(&id).map(|h| {
                h.cancel.cancel();
                (h.handler, h.done)
            }),
        };
        let before = previous.map(|(handler, old_done)| {
            // Bounded: the old handler is aborted at the end of its stop window.
            let abort_at = Instant::now() + self.config.grace + STOP_LINGER;
            async move {
                tokio::select! {
                    () = old_done.cancelled() => {}
                    () = tokio::time::sleep_until(abort_at) => handler.abort(),
                }
            }
        });
        let output = task.output.clone();
        let after_panic = task.output.clone();
        let span = crate::trace::handler_span(&task.delivery);
        let handler_fut = span.in_scope(|| (self.handler)(task)).instrument(span);
        // The handler's own task (its handle is the watcher's, its abort handle kept
        // in `held`): a panic in it becomes a nack rather than the worker's end.
        let work = tokio::spawn(async move {
            if let Some(before) = before {
                before.await;
            }
            let outcome = handler_fut.await;
            // Its output before its settle: a follower sees it all, then the end.
            if let Err(e) = output.flush().await {
                warn!(error = %e, "the task's output was not all sent");
            }
            outcome
        });
        let handler = work.abort_handle();
        let events = self.events.0.clone();
        self.tasks.spawn(async move {
            let result = work.await;
            done.cancel();
            let outcome = match result {
                Ok(outcome) => outcome,
                Err(e) if e.is_cancelled() => return,
                Err(e) => {
                    // What it emitted before it panicked says why: sent before the nack.
                    if let Err(e) = after_panic.flush().await {
                        warn!(error = %e, "the task's output was not all sent");
                    }
                    Outcome::Nack {
                        delay: None,
                        error: format!("handler panicked: {e}"),
                    }
                }
            };
            let _ = events.send(Event::Done(id, epoch, outcome));
        });
        handler
    }

    /// A lease is gone (lost or revoked): stop the handler's work, forget the task.
    fn lost(&mut self, id: &str, epoch: u64, why: &str) {
        if self.held.get(id).is_some_and(|h| h.epoch == epoch)
            && let Some(h) = self.held.remove(id)
        {
            warn!(task = %id, epoch, "lease {why}; stopping its handler");
            h.cancel.cancel();
            // Kept until the handler ends, so a new delivery of the same task can wait
            // for it rather than run beside it; aborted if it does not stop in time.
            self.stopping.insert(
                id.to_owned(),
                Stopping {
                    handler: h.handler,
                    done: h.done,
                    abort_at: Instant::now() + self.config.grace + STOP_LINGER,
                },
            );
        }
    }

    /// A lease's local deadline passed with no renewal confirmed: it may have lapsed at
    /// the daemon, so its handler must not run on.
    fn expired(&mut self, id: &str, epoch: u64) {
        // A suspend in flight decides: it ends the lease, or it fails and the held
        // entry is dealt with then.
        if self
            .held
            .get(id)
            .is_some_and(|h| h.epoch == epoch && !h.suspending)
            && let Some(h) = self.held.remove(id)
        {
            warn!(task = %id, epoch, "lease may have lapsed (no renewal confirmed in time); handler aborted");
            h.cancel.cancel();
            h.handler.abort();
        }
    }

    fn renew_due(&mut self, client: &Client) {
        let now = Instant::now();
        for (id, held) in &mut self.held {
            let progress_due =
                held.progress.unsent.load(SeqCst) && now >= held.renewed + PROGRESS_INTERVAL;
            if held.renewing || held.suspending || (held.renew_at > now && !progress_due) {
                continue;
            }
            held.renewing = true;
            held.renewed = now;
            held.progress.unsent.store(false, SeqCst);
            let progress = lock(&held.progress.latest).clone();
            let (client, events, id, epoch) = (
                client.clone(),
                self.events.0.clone(),
                id.clone(),
                held.epoch,
            );
            self.tasks.spawn(async move {
                let sent = Instant::now();
                let result = client.renew(&id, epoch, None, progress).await;
                let _ = events.send(Event::Renewed(id, epoch, sent, result));
            });
        }
    }

    fn renewed(
        &mut self,
        id: String,
        epoch: u64,
        sent: Instant,
        result: Result<muster_protocol::ops::RenewReply, Error>,
    ) {
        let Some(held) = self.held.get_mut(&id).filter(|h| h.epoch == epoch) else {
            return;
        };
        held.renewing = false;
        match result {
            Ok(reply) => {
                held.renew_at = renew_at(reply.lease_expires_ms);
                let lease = Duration::from_millis(reply.lease_ms);
                // The daemon renewed after we sent: from `sent`, the lease is surely ours
                // for its length (less the margin).
                let deadline = sent + lease.saturating_sub(lease_margin(lease));
                assert!(deadline >= sent, "a renewal's deadline lies after its send");
                let mut current = lock(&held.deadline);
                let before = *current;
                *current = before.max(deadline);
                assert!(
                    *current >= before,
                    "a lease's local deadline never moves back"
                );
                drop(current);
                assert!(
                    held.renew_at >= sent,
                    "the next renewal of task {id} is due after this one was sent"
                );
                if reply.cancel_requested && !held.cancel.is_cancelled() {
                    info!(task = %id, "cancel requested");
                    held.cancel.cancel();
                }
            }
            Err(Error::Server(e))
                if matches!(e.code, ErrorCode::LeaseLost | ErrorCode::NotFound) =>
            {
                self.lost(&id, epoch, &format!("lost ({})", e.message));
            }
            // The node no longer leads: as for a lost connection, the next connection
            // (to the leader) renews at once, progress too.
            Err(Error::Server(e)) if leader_moved(&e.code) => {
                debug!(task = %id, error = %e, "renewal on a node that no longer leads");
                self.leader_moved = true;
                held.renew_at = Instant::now() + MIN_RENEW_INTERVAL;
                held.progress.unsent.store(true, SeqCst);
            }
            // Refused for what it carried (e.g. progress over its limit): drop the
            // checkpoint and keep the lease alive.
            Err(Error::Server(e)) => {
                warn!(task = %id, error = %e, "renewal refused; dropping its progress");
                *lock(&held.progress.latest) = None;
                held.renew_at = Instant::now() + MIN_RENEW_INTERVAL;
            }
            // The connection is down: the next connection renews at once, progress too.
            Err(_) => {
                held.renew_at = Instant::now() + MIN_RENEW_INTERVAL;
                held.progress.unsent.store(true, SeqCst);
            }
        }
    }

    fn settle(&mut self, client: &Client, settle: Settle) {
        let fresh = self.settling.insert((settle.id.clone(), settle.epoch));
        assert!(
            fresh,
            "a second settle of {} epoch {} in flight",
            settle.id, settle.epoch
        );
        let (client, events) = (client.clone(), self.events.0.clone());
        self.tasks.spawn(async move {
            let (id, epoch) = (settle.id.as_str(), settle.epoch);
            // A checkpoint taken while stopping is stored before the task goes back, so
            // the next holder resumes from it.
            if !matches!(settle.outcome, Outcome::Ack(_)) {
                store_checkpoint(&client, id, epoch, settle.progress.clone()).await;
            }
            let result = match &settle.outcome {
                Outcome::Ack(result) => client.ack(id, epoch, result.clone()).await,
                Outcome::Nack { delay, error } => {
                    let delay_ms = delay.map(|d| d.as_millis() as u64);
                    client.nack(id, epoch, delay_ms, Some(error.clone())).await
                }
                Outcome::DeadLetter(error) => client.dead_letter(id, epoch, error).await,
                Outcome::Release => client.release(id, epoch).await,
                Outcome::Throttled { retry_after, limit } => {
                    let retry_after_ms = retry_after.map(|d| d.as_millis() as u64);
                    client
                        .throttled(id, epoch, retry_after_ms, limit.clone())
                        .await
                }
                Outcome::Suspended => unreachable!("a suspended task is not settled"),
            };
            let _ = events.send(Event::Settled(settle, result));
        });
    }

    /// Takes a handler's suspend of its task: sent now when connected, else on the next
    /// connection. Refused (`lease_lost`) when the task is not held under that epoch or
    /// is being suspended already.
    fn ask_suspend(&mut self, client: Option<&Client>, ask: SuspendAsk) {
        let Some(held) = self
            .held
            .get_mut(&ask.id)
            .filter(|h| h.epoch == ask.epoch && !h.suspending)
        else {
            let lost = muster_protocol::ErrorBody::new(
                ErrorCode::LeaseLost,
                format!(
                    "task {} epoch {} is not held by this worker, or is being suspended",
                    ask.id, ask.epoch
                ),
            );
            let _ = ask.answer.send(Err(Error::Server(lost)));
            return;
        };
        held.suspending = true;
        match client {
            Some(client) => self.send_suspend(client, ask),
            None => self.unsuspended.push(ask),
        }
    }

    /// Sends a suspend (its task's last checkpoint first: the task resumes from it).
    fn send_suspend(&mut self, client: &Client, ask: SuspendAsk) {
        let progress = self
            .held
            .get(&ask.id)
            .and_then(|h| unsent_progress(&h.progress));
        let (client, events) = (client.clone(), self.events.0.clone());
        self.tasks.spawn(async move {
            let (id, epoch) = (ask.id.as_str(), ask.epoch);
            store_checkpoint(&client, id, epoch, progress).await;
            let timeout_ms = ask.suspension.timeout.map(|t| t.as_millis() as u64);
            let result = match &ask.children {
                None => {
                    let req = muster_protocol::ops::Suspend {
                        task: id.to_owned(),
                        epoch,
                        reason: ask.suspension.reason.clone(),
                        timeout_ms,
                        on_timeout: ask.suspension.on_timeout,
                    };
                    client.call(&req).await.map(|r| SpawnReply {
                        children: Vec::new(),
                        state: r.state,
                        resume_token: r.resume_token,
                        timeout_at_ms: r.timeout_at_ms,
                    })
                }
                Some(children) => {
                    let req = Spawn {
                        task: id.to_owned(),
                        epoch,
                        children: children.clone(),
                        wait: Some(SpawnWait {
                            reason: Some(ask.suspension.reason.clone()),
                            timeout_ms,
                            on_timeout: ask.suspension.on_timeout,
                        }),
                    };
                    client.call(&req).await
                }
            };
            let _ = events.send(Event::Suspended(ask, result));
        });
    }

    /// Sends a spawn that keeps the lease, answering its handler directly: refused
    /// (`lease_lost`) when the task is not held under that epoch or is being
    /// suspended, and `closed` while disconnected (a spawn is safe to ask again).
    fn send_spawn(&mut self, client: Option<&Client>, ask: SpawnAsk) {
        let held = self
            .held
            .get(&ask.id)
            .is_some_and(|h| h.epoch == ask.epoch && !h.suspending);
        let refusal = match client {
            _ if !held => Some(Error::Server(muster_protocol::ErrorBody::new(
                ErrorCode::LeaseLost,
                format!(
                    "task {} epoch {} is not held by this worker, or is being suspended",
                    ask.id, ask.epoch
                ),
            ))),
            None => Some(Error::Closed(
                "the worker is not connected; spawn again".into(),
            )),
            Some(_) => None,
        };
        if let Some(e) = refusal {
            let _ = ask.answer.send(Err(e));
            return;
        }
        let client = client.expect("connected").clone();
        self.tasks.spawn(async move {
            let req = Spawn {
                task: ask.id,
                epoch: ask.epoch,
                children: ask.children,
                wait: None,
            };
            let _ = ask.answer.send(client.call(&req).await);
        });
    }

    /// A suspend answered. Suspended: the task is no longer held, its handler gets the
    /// grace period to hand its token on and return. Lost with the connection (or the
    /// leader): asked again on the next connection, where a repeat gets a new token.
    /// Refused: the task is held as before, or settled as its handler said meanwhile.
    fn suspended(&mut self, ask: SuspendAsk, result: Result<SpawnReply, Error>) {
        let (id, epoch) = (ask.id.clone(), ask.epoch);
        let lost = match &result {
            Err(Error::Closed(_) | Error::Connect(_)) => true,
            Err(Error::Server(e)) if leader_moved(&e.code) => {
                self.leader_moved = true;
                true
            }
            _ => false,
        };
        if lost && self.held.get(&id).is_some_and(|h| h.epoch == epoch) {
            debug!(task = %id, epoch, "suspend lost with its connection; asking again");
            self.unsuspended.push(ask);
            return;
        }
        if let Some(held) = self.held.get_mut(&id).filter(|h| h.epoch == epoch) {
            held.suspending = false;
            match &result {
                Ok(reply) => {
                    info!(task = %id, epoch, state = %reply.state, "suspended");
                    let held = self.held.remove(&id).expect("held above");
                    if held.deferred.is_none() {
                        self.stop_later(&id, held);
                    }
                }
                Err(e) => {
                    warn!(task = %id, epoch, error = %e, "suspend failed; the task stays held");
                    if let Some(outcome) = held.deferred.take()
                        && let Some(settle) = self.finish(id.clone(), epoch, outcome)
                    {
                        self.unsettled.push(settle);
                    }
                }
            }
        }
        if let Err(Ok(reply)) = ask.answer.send(result) {
            // The handler is gone (aborted): say where the task is, for an approver.
            warn!(task = %id, epoch, state = %reply.state, "suspended, but its handler is gone with the resume token: resume it by its id");
        }
    }

    /// A suspended task's handler: its lease is gone, so the deadline watchdog must not
    /// stop it; it gets the grace period to hand its token on, then is aborted.
    fn stop_later(&mut self, id: &str, held: Held) {
        let abort_at = Instant::now() + self.config.grace + STOP_LINGER;
        *lock(&held.deadline) = abort_at + SUSPENDED_WATCH;
        self.stopping.insert(
            id.to_owned(),
            Stopping {
                handler: held.handler,
                done: held.done,
                abort_at,
            },
        );
    }

    fn settled(&mut self, settle: Settle, result: Result<SettleReply, Error>) {
        let id = settle.id.clone();
        let was = self.settling.remove(&(id.clone(), settle.epoch));
        assert!(
            was,
            "a settle of {id} epoch {} ended that was not in flight",
            settle.epoch
        );
        // A throttle naming a limit the task does not draw on is refused and changes
        // nothing: throttle every limit it draws on instead (at the next tick), rather
        // than let the lease lapse into a failure.
        if let (Err(Error::Server(e)), Outcome::Throttled { retry_after, limit }) =
            (&result, &settle.outcome)
            && e.code == ErrorCode::BadRequest
            && limit.is_some()
        {
            warn!(task = %id, error = %e, "throttle refused; throttling the task's own limits");
            let outcome = Outcome::Throttled {
                retry_after: *retry_after,
                limit: None,
            };
            self.unsettled.push(Settle { outcome, ..settle });
            return;
        }
        match result {
            Ok(reply) => info!(task = %id, state = %reply.state, "settled"),
            // The node no longer leads, or lost its leadership before the settle was
            // agreed on: settle again on the leader, as after a lost connection.
            Err(Error::Server(e)) if leader_moved(&e.code) => {
                debug!(task = %id, error = %e, "settle on a node that no longer leads");
                self.leader_moved = true;
                self.unsettled.push(settle);
            }
            // The daemon refused it (the lease was lost meanwhile): nothing to retry.
            Err(Error::Server(e)) => warn!(task = %id, error = %e, "settle refused"),
            // Unknown whether it landed: settle again on the next connection. A repeat
            // of a settle that did land is refused with lease_lost, which is harmless.
            Err(Error::Closed(_) | Error::Connect(_)) => self.unsettled.push(settle),
            // It could not even be sent (e.g. a result over the frame limit): fail the
            // task instead, once, so it is retried rather than left to lapse.
            Err(e) => {
                warn!(task = %id, error = %e, "settle could not be sent");
                if let Outcome::Ack(_) = settle.outcome {
                    let error = format!("the handler's result could not be sent: {e}");
                    self.unsettled.push(Settle {
                        outcome: Outcome::Nack { delay: None, error },
                        ..settle
                    });
                }
            }
        }
    }

    /// Forgets the worker's tasks that have ended (a panic in one is logged).
    fn reap(&mut self) {
        while let Some(ended) = self.tasks.try_join_next() {
            if let Err(e) = ended
                && e.is_panic()
            {
                warn!(error = %e, "a worker task panicked");
            }
        }
    }

    /// The grace period is over: cancel every handler still running; each gets
    /// [`STOP_LINGER`] to return its own outcome before it is aborted.
    fn stop_all(&mut self) {
        let by = Instant::now() + STOP_LINGER;
        for (id, held) in &mut self.held {
            if held.stop_by.is_none() {
                info!(task = %id, "grace period over; stopping its handler");
                held.cancel.cancel();
                held.stop_by = Some(by);
            }
        }
    }

    /// Aborts handlers past their stop time: those the worker stopped are released
    /// (when connected), those whose lease is gone are forgotten.
    fn stop_overdue(&mut self, client: Option<&Client>) {
        let now = Instant::now();
        self.stopping.retain(|_, s| {
            if now >= s.abort_at {
                s.handler.abort();
            }
            now < s.abort_at && !s.done.is_cancelled()
        });
        let overdue: Vec<String> = self
            .held
            .iter()
            .filter(|(_, h)| !h.suspending && h.stop_by.is_some_and(|by| now >= by))
            .map(|(id, _)| id.clone())
            .collect();
        for id in overdue {
            let Some(held) = self.held.remove(&id) else {
                continue;
            };
            info!(task = %id, "handler did not stop in time; releasing");
            held.handler.abort();
            let settle = Settle {
                id,
                epoch: held.epoch,
                outcome: Outcome::Release,
                progress: unsent_progress(&held.progress),
            };
            match client {
                Some(client) => self.settle(client, settle),
                None => self.unsettled.push(settle),
            }
        }
    }

    /// The worker stops: no handler may run on without its lease.
    fn abandon(&mut self) {
        for (_, held) in self.held.drain() {
            held.cancel.cancel();
            held.handler.abort();
        }
        for (_, s) in self.stopping.drain() {
            s.handler.abort();
        }
    }
}

/// The checkpoint a handler set that the daemon has not stored yet.
fn unsent_progress(progress: &Progress) -> Option<RawJson> {
    progress
        .unsent
        .load(SeqCst)
        .then(|| lock(&progress.latest).clone())
        .flatten()
}

/// The local deadline of a new delivery: from the daemon's wall-clock expiry, bounded
/// by the lease's length from when its request was sent (or, for a push, from now).
fn first_deadline(delivery: &Delivery, sent: Option<Instant>) -> Instant {
    let now = Instant::now();
    let lease = Duration::from_millis(delivery.lease_ms);
    let wall_now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let by_wall = now + Duration::from_millis(delivery.lease_expires_ms.saturating_sub(wall_now));
    let by_length = sent.unwrap_or(now) + lease;
    let end = by_wall.min(by_length);
    end.checked_sub(lease_margin(lease)).unwrap_or(end)
}

/// Cancels a handler when its lease's local deadline (which renewals move) is near,
/// aborts it when the deadline passes and reports the lease expired. Ends with the
/// handler. It acts on its own, whatever the worker's loop is doing (reconnecting, say).
/// Stores a task's last checkpoint (with a renewal) before its lease ends, so that its
/// next holder resumes from it; a failure is only logged (the settle that follows says
/// what became of the lease).
async fn store_checkpoint(client: &Client, id: &str, epoch: u64, progress: Option<RawJson>) {
    if let Some(progress) = progress
        && let Err(e) = client.renew(id, epoch, None, Some(progress)).await
    {
        debug!(task = %id, error = %e, "storing the last checkpoint");
    }
}

async fn watch_deadline(
    (id, epoch): (String, u64),
    (deadline, timed_out): (Arc<Mutex<Instant>>, Arc<AtomicBool>),
    window: Duration,
    (cancel, handler): (CancellationToken, AbortHandle),
    done: CancellationToken,
    events: mpsc::UnboundedSender<Event>,
) {
    loop {
        let at = *lock(&deadline);
        let now = Instant::now();
        if now >= at {
            // The lease may be someone else's from now on: no more of this handler.
            cancel.cancel();
            handler.abort();
            let _ = events.send(Event::Expired(id, epoch));
            return;
        }
        let wake = if cancel.is_cancelled() || now + window >= at {
            if !cancel.is_cancelled() {
                warn!(task = %id, epoch, "no renewal confirmed and the lease may lapse soon: stopping its handler");
                timed_out.store(true, SeqCst);
                cancel.cancel();
            }
            at
        } else {
            at - window
        };
        tokio::select! {
            () = done.cancelled() => return,
            () = tokio::time::sleep_until(wake) => {}
        }
    }
}

/// Refusals that retrying cannot fix: the daemon answered, and said no.
fn is_refusal(e: &Error) -> bool {
    match e {
        Error::Server(body) => body.code != ErrorCode::ShuttingDown && !leader_moved(&body.code),
        Error::InvalidInput(_) => true,
        _ => false,
    }
}

/// Whether a request was refused with `not_found` (a queue that does not exist).
fn is_not_found(e: &Error) -> bool {
    matches!(e, Error::Server(body) if body.code == ErrorCode::NotFound)
}

/// Whether an error code says the request went to a node that does not lead (any
/// more): `not_leader`, or `outcome_unknown` after a leadership change. The worker
/// reconnects (to the leader) and resumes, as after a lost connection.
fn leader_moved(code: &ErrorCode) -> bool {
    matches!(code, ErrorCode::NotLeader | ErrorCode::OutcomeUnknown)
}

/// Exponential backoff with ±20 % jitter.
fn backoff(attempt: u32) -> Duration {
    let exp = RECONNECT_BASE.saturating_mul(1u32 << attempt.saturating_sub(1).min(16));
    let base = exp.min(RECONNECT_CAP).as_secs_f64();
    Duration::from_secs_f64(base * rand::random_range(0.8..1.2))
}

/// When to renew a lease that lapses at `expires_ms`: a third of the way there.
fn renew_at(expires_ms: u64) -> Instant {
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let left = Duration::from_millis(expires_ms.saturating_sub(now_ms));
    let now = Instant::now();
    let at = now + (left / 3).max(MIN_RENEW_INTERVAL);
    assert!(at > now, "a renewal is never due at once again");
    at
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lease watched from `now` with a 3 s deadline and a 1 s stop window: the
    /// deadline, the watchdog's flag, the handler's cancel token, the handler (pending
    /// until aborted), its done token and the worker's event stream.
    struct Watched {
        deadline: Arc<Mutex<Instant>>,
        timed_out: Arc<AtomicBool>,
        cancel: CancellationToken,
        handler: tokio::task::JoinHandle<()>,
        done: CancellationToken,
        events: mpsc::UnboundedReceiver<Event>,
        watchdog: tokio::task::JoinHandle<()>,
    }

    fn watched() -> Watched {
        let deadline = Arc::new(Mutex::new(Instant::now() + Duration::from_secs(3)));
        let timed_out = Arc::new(AtomicBool::new(false));
        let (cancel, done) = (CancellationToken::new(), CancellationToken::new());
        let handler = tokio::spawn(std::future::pending::<()>());
        let (tx, events) = mpsc::unbounded_channel();
        let watchdog = tokio::spawn(watch_deadline(
            ("t".into(), 1),
            (Arc::clone(&deadline), Arc::clone(&timed_out)),
            Duration::from_secs(1),
            (cancel.clone(), handler.abort_handle()),
            done.clone(),
            tx,
        ));
        Watched {
            deadline,
            timed_out,
            cancel,
            handler,
            done,
            events,
            watchdog,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_unconfirmed_lease_is_stopped_a_window_before_its_deadline_and_aborted_at_it() {
        let start = Instant::now();
        let mut w = watched();
        w.cancel.cancelled().await;
        assert_eq!(start.elapsed(), Duration::from_secs(2));
        assert!(
            w.timed_out.load(SeqCst),
            "the watchdog says it stopped the handler"
        );
        let Some(Event::Expired(id, epoch)) = w.events.recv().await else {
            panic!("the lease must be reported expired");
        };
        assert_eq!((id.as_str(), epoch), ("t", 1));
        assert_eq!(start.elapsed(), Duration::from_secs(3));
        assert!(
            w.handler.await.unwrap_err().is_cancelled(),
            "aborted at the deadline"
        );
        w.watchdog.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewal_moves_the_stop_and_a_handler_that_ends_first_is_left_alone() {
        let start = Instant::now();
        let mut w = watched();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        // Confirmed at 1.5 s: the lease is ours until 6 s.
        *lock(&w.deadline) = start + Duration::from_secs(6);
        w.cancel.cancelled().await;
        assert_eq!(start.elapsed(), Duration::from_secs(5));
        // The handler returns within the window: nothing is aborted or expired.
        w.done.cancel();
        w.watchdog.await.unwrap();
        assert!(
            w.events.try_recv().is_err(),
            "no expiry once the handler ended"
        );
        assert!(!w.handler.is_finished(), "not aborted");
        w.handler.abort();
    }

    #[test]
    fn a_leadership_change_is_retried_like_a_lost_connection() {
        use muster_protocol::ErrorBody;
        let server = |code| Error::Server(ErrorBody::new(code, "m"));
        assert!(!is_refusal(&server(ErrorCode::NotLeader)));
        assert!(!is_refusal(&Error::Server(ErrorBody::not_leader(
            "node 2 leads",
            Some("b:1".into())
        ))));
        assert!(!is_refusal(&server(ErrorCode::OutcomeUnknown)));
        assert!(!is_refusal(&server(ErrorCode::ShuttingDown)));
        assert!(is_refusal(&server(ErrorCode::Forbidden)));
        assert!(leader_moved(&ErrorCode::NotLeader));
        assert!(leader_moved(&ErrorCode::OutcomeUnknown));
        assert!(!leader_moved(&ErrorCode::LeaseLost));
    }

    #[test]
    fn backoff_grows_to_its_cap_with_jitter() {
        for (attempt, base) in [(1, 0.1), (2, 0.2), (3, 0.4), (7, 5.0), (30, 5.0)] {
            let d = backoff(attempt).as_secs_f64();
            assert!(
                d >= base * 0.8 - 1e-9 && d <= base * 1.2 + 1e-9,
                "attempt {attempt}: {d}"
            );
        }
    }
}
