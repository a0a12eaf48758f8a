//! `Worker`: the agent loop.
//!
//! A worker opens a member session, subscribes to its queues and runs a handler per
//! pushed task. It renews every lease at a third of its length, carrying the handler's
//! latest progress, and fires the task's cancellation when a cancel is asked, the lease
//! is lost or revoked. The handler's [`Outcome`] becomes an ack, a nack or a dead-letter.
//!
//! Connections fail; work goes on. After a lost connection or a daemon restart the
//! worker reconnects with backoff and jitter, opens its session with `resume` (its
//! leases are kept, nothing is reclaimed, no failure is counted) and goes on renewing
//! and settling with the claims it holds. Only a fresh process start reclaims: the
//! daemon re-delivers what the member held before, with the last progress checkpoint.
//!
//! Shutting down ([`WorkerHandle::shutdown`], a signal with
//! [`WorkerHandle::shutdown_on_signals`], or an operator's drain) stops taking work,
//! keeps renewing, lets handlers finish within the grace period, releases the rest
//! (no attempt spent) and returns.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::mpsc;
use tokio::task::AbortHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use muster_protocol::model::Delivery;
use muster_protocol::ops::{SessionOpen, SettleReply};
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
}

/// A task in a handler's hands.
pub struct Task {
    delivery: Delivery,
    cancel: CancellationToken,
    progress: Arc<Progress>,
}

/// A task's latest checkpoint and whether the daemon has it yet.
#[derive(Default)]
struct Progress {
    latest: Mutex<Option<RawJson>>,
    unsent: std::sync::atomic::AtomicBool,
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
        self.progress
            .unsent
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Resolves when the task should stop: a cancel was asked, or its lease was lost.
    pub async fn cancelled(&self) {
        self.cancel.cancelled().await;
    }

    /// True once the task should stop.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
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

/// How a held task is settled.
enum Settle {
    Outcome(Outcome),
    Release,
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
}

/// Results of the worker's background calls, back to its loop.
enum Event {
    Done(String, u64, Outcome),
    Renewed(String, u64, Result<muster_protocol::ops::RenewReply, Error>),
    Settled(String, u64, Settle, Result<SettleReply, Error>),
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
    /// member name (`replaced`) or the daemon refuses the session (e.g. a bad name).
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
            settling: 0,
            draining: None,
            opened: false,
            stopping: HashMap::new(),
            events: mpsc::unbounded_channel(),
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
    unsettled: Vec<(String, u64, Settle)>,
    /// Settles in flight.
    settling: usize,
    /// Set once stopping: when the grace period ends.
    draining: Option<Instant>,
    /// A session was opened once: later sessions resume instead of reclaiming.
    opened: bool,
    /// Handlers of leases lost or revoked, told to stop and not yet ended.
    stopping: HashMap<String, AbortHandle>,
    events: (mpsc::UnboundedSender<Event>, mpsc::UnboundedReceiver<Event>),
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
            match self.serve(&client, pushes).await {
                Ok(true) => {
                    self.abandon();
                    return Ok(());
                }
                Ok(false) => {
                    warn!("connection to musterd lost; reconnecting");
                    self.pause(backoff(1)).await;
                }
                Err(e) => {
                    self.abandon();
                    return Err(e);
                }
            }
        }
    }

    /// True once stopping and nothing is left to settle, or the linger ran out.
    fn finished(&self) -> bool {
        match self.draining {
            Some(deadline) => {
                (self.held.is_empty() && self.unsettled.is_empty() && self.settling == 0)
                    || Instant::now() >= deadline + SETTLE_LINGER
            }
            None => false,
        }
    }

    /// Waits out a reconnect delay while still taking handler results and shutdown.
    async fn pause(&mut self, delay: Duration) {
        let until = tokio::time::Instant::now() + delay;
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(until) => return,
                () = self.shutdown.cancelled(), if self.draining.is_none() => self.begin_drain(),
                Some(event) = self.events.1.recv() => self.offline(event),
            }
        }
    }

    fn begin_drain(&mut self) {
        if self.draining.is_none() {
            info!(member = %self.config.member, grace_ms = self.config.grace.as_millis() as u64, "draining");
            self.draining = Some(Instant::now() + self.config.grace);
        }
    }

    /// Takes an event while disconnected: outcomes wait for the next connection.
    fn offline(&mut self, event: Event) {
        match event {
            Event::Done(id, epoch, outcome) => {
                if self.held.get(&id).is_some_and(|h| h.epoch == epoch) {
                    self.held.remove(&id);
                    self.unsettled.push((id, epoch, Settle::Outcome(outcome)));
                } else {
                    self.stopping.remove(&id);
                }
            }
            Event::Renewed(id, epoch, result) => self.renewed(id, epoch, result),
            Event::Settled(id, epoch, settle, result) => self.settled(id, epoch, settle, result),
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
            liveness_ms: None,
        };
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
            self.start(delivery);
        }
        if self.draining.is_none() {
            client
                .subscribe(&self.config.member, &self.config.queues)
                .await?;
        }
        Ok((client, pushes))
    }

    /// Serves one connection. Returns `Ok(true)` when the worker is done, `Ok(false)`
    /// when the connection was lost.
    async fn serve(
        &mut self,
        client: &Client,
        mut pushes: mpsc::UnboundedReceiver<Push>,
    ) -> Result<bool, Error> {
        // Settle what finished while disconnected, and renew everything at once: the
        // leases may be close to their end.
        for (id, epoch, settle) in std::mem::take(&mut self.unsettled) {
            self.settle(client, id, epoch, settle);
        }
        let now = Instant::now();
        for held in self.held.values_mut() {
            held.renew_at = now;
            held.renewing = false;
        }
        let mut tick = tokio::time::interval(TICK);
        loop {
            tokio::select! {
                () = self.shutdown.cancelled(), if self.draining.is_none() => {
                    self.begin_drain();
                    let (client, member) = (client.clone(), self.config.member.clone());
                    tokio::spawn(async move {
                        if let Err(e) = client.unsubscribe(&member).await {
                            debug!(error = %e, "unsubscribe on drain");
                        }
                    });
                }
                push = pushes.recv() => match push {
                    Some(Push::Deliver(delivery)) => self.start(delivery),
                    Some(Push::Cancel(lease)) => {
                        if let Some(h) = self.held.get(&lease.task).filter(|h| h.epoch == lease.epoch) {
                            info!(task = %lease.task, "cancel requested");
                            h.cancel.cancel();
                        }
                    }
                    Some(Push::Revoked(lease)) => self.lost(&lease.task, lease.epoch, "revoked by an operator"),
                    Some(Push::Drain) => {
                        info!("drained by an operator");
                        self.shutdown.cancel();
                    }
                    Some(Push::Closed(error)) => {
                        warn!(%error, "session closed by musterd");
                        return Err(Error::Server(error));
                    }
                    // The client routes watch pushes to `watch_pushes`, never to a session.
                    Some(Push::Watch(_)) => {}
                    None => return Ok(false),
                },
                Some(event) = self.events.1.recv() => match event {
                    Event::Done(id, epoch, outcome) => {
                        if self.held.get(&id).is_some_and(|h| h.epoch == epoch) {
                            self.held.remove(&id);
                            self.settle(client, id, epoch, Settle::Outcome(outcome));
                        } else {
                            self.stopping.remove(&id);
                        }
                    }
                    Event::Renewed(id, epoch, result) => self.renewed(id, epoch, result),
                    Event::Settled(id, epoch, settle, result) => self.settled(id, epoch, settle, result),
                },
                _ = tick.tick() => {
                    // Settles that failed on an earlier connection go out on this one.
                    for (id, epoch, settle) in std::mem::take(&mut self.unsettled) {
                        self.settle(client, id, epoch, settle);
                    }
                    self.renew_due(client);
                    if let Some(deadline) = self.draining
                        && Instant::now() >= deadline
                    {
                        self.release_all(client);
                    }
                    if self.finished() {
                        return Ok(true);
                    }
                }
            }
        }
    }

    fn start(&mut self, delivery: Delivery) {
        let (id, epoch) = (delivery.id.clone(), delivery.epoch);
        let delivery_id = id.clone();
        let cancel = CancellationToken::new();
        let progress = Arc::new(Progress {
            latest: Mutex::new(delivery.progress.clone()),
            unsent: std::sync::atomic::AtomicBool::new(false),
        });
        let renew_at = renew_at(delivery.lease_expires_ms);
        info!(task = %id, epoch, attempt = delivery.attempt, reclaimed = delivery.reclaimed, "task started");
        let task = Task {
            delivery,
            cancel: cancel.clone(),
            progress: Arc::clone(&progress),
        };
        let work = tokio::spawn((self.handler)(task));
        let handler = work.abort_handle();
        let events = self.events.0.clone();
        let (done_id, done_epoch) = (id.clone(), epoch);
        tokio::spawn(async move {
            let outcome = match work.await {
                Ok(outcome) => outcome,
                Err(e) if e.is_cancelled() => return,
                Err(e) => Outcome::Nack {
                    delay: None,
                    error: format!("handler panicked: {e}"),
                },
            };
            let _ = events.send(Event::Done(done_id, done_epoch, outcome));
        });
        let previous = self.held.insert(
            id,
            Held {
                epoch,
                cancel,
                progress,
                renew_at,
                renewed: Instant::now(),
                renewing: false,
                handler,
            },
        );
        // The same task again (a new epoch): the old handler's work is void.
        if let Some(old) = previous {
            old.cancel.cancel();
            old.handler.abort();
        }
        if let Some(old) = self.stopping.remove(&delivery_id) {
            old.abort();
        }
    }

    /// A lease is gone (lost or revoked): stop the handler's work, forget the task.
    fn lost(&mut self, id: &str, epoch: u64, why: &str) {
        if self.held.get(id).is_some_and(|h| h.epoch == epoch)
            && let Some(h) = self.held.remove(id)
        {
            warn!(task = %id, epoch, "lease {why}; stopping its handler");
            h.cancel.cancel();
            // Kept until the handler ends, so a new delivery of the same task can stop it
            // for good rather than run beside it.
            self.stopping.insert(id.to_owned(), h.handler);
        }
    }

    fn renew_due(&mut self, client: &Client) {
        let now = Instant::now();
        for (id, held) in &mut self.held {
            let progress_due = held
                .progress
                .unsent
                .load(std::sync::atomic::Ordering::SeqCst)
                && now >= held.renewed + PROGRESS_INTERVAL;
            if held.renewing || (held.renew_at > now && !progress_due) {
                continue;
            }
            held.renewing = true;
            held.renewed = now;
            held.progress
                .unsent
                .store(false, std::sync::atomic::Ordering::SeqCst);
            let progress = lock(&held.progress.latest).clone();
            let (client, events, id, epoch) = (
                client.clone(),
                self.events.0.clone(),
                id.clone(),
                held.epoch,
            );
            tokio::spawn(async move {
                let result = client.renew(&id, epoch, None, progress).await;
                let _ = events.send(Event::Renewed(id, epoch, result));
            });
        }
    }

    fn renewed(
        &mut self,
        id: String,
        epoch: u64,
        result: Result<muster_protocol::ops::RenewReply, Error>,
    ) {
        let Some(held) = self.held.get_mut(&id).filter(|h| h.epoch == epoch) else {
            return;
        };
        held.renewing = false;
        match result {
            Ok(reply) => {
                held.renew_at = renew_at(reply.lease_expires_ms);
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
                held.progress
                    .unsent
                    .store(true, std::sync::atomic::Ordering::SeqCst);
            }
        }
    }

    fn settle(&mut self, client: &Client, id: String, epoch: u64, settle: Settle) {
        self.settling += 1;
        let (client, events) = (client.clone(), self.events.0.clone());
        tokio::spawn(async move {
            let result = match &settle {
                Settle::Outcome(Outcome::Ack(result)) => {
                    client.ack(&id, epoch, result.clone()).await
                }
                Settle::Outcome(Outcome::Nack { delay, error }) => {
                    let delay_ms = delay.map(|d| d.as_millis() as u64);
                    client.nack(&id, epoch, delay_ms, Some(error.clone())).await
                }
                Settle::Outcome(Outcome::DeadLetter(error)) => {
                    client.dead_letter(&id, epoch, error).await
                }
                Settle::Release => client.release(&id, epoch).await,
            };
            let _ = events.send(Event::Settled(id, epoch, settle, result));
        });
    }

    fn settled(
        &mut self,
        id: String,
        epoch: u64,
        settle: Settle,
        result: Result<SettleReply, Error>,
    ) {
        self.settling -= 1;
        match result {
            Ok(reply) => info!(task = %id, state = %reply.state, "settled"),
            // The daemon refused it (the lease was lost meanwhile): nothing to retry.
            Err(Error::Server(e)) => warn!(task = %id, error = %e, "settle refused"),
            // Unknown whether it landed: settle again on the next connection. A repeat
            // of a settle that did land is refused with lease_lost, which is harmless.
            Err(Error::Closed(_) | Error::Connect(_)) => self.unsettled.push((id, epoch, settle)),
            // It could not even be sent (e.g. a result over the frame limit): fail the
            // task instead, once, so it is retried rather than left to lapse.
            Err(e) => {
                warn!(task = %id, error = %e, "settle could not be sent");
                if let Settle::Outcome(Outcome::Ack(_)) = settle {
                    let error = format!("the handler's result could not be sent: {e}");
                    let nack = Outcome::Nack { delay: None, error };
                    self.unsettled.push((id, epoch, Settle::Outcome(nack)));
                }
            }
        }
    }

    /// The grace period is over: release every task still in hand and stop its handler.
    fn release_all(&mut self, client: &Client) {
        for (id, held) in std::mem::take(&mut self.held) {
            info!(task = %id, "grace period over; releasing");
            held.cancel.cancel();
            held.handler.abort();
            self.settle(client, id, held.epoch, Settle::Release);
        }
    }

    /// The worker stops: no handler may run on without its lease.
    fn abandon(&mut self) {
        for (_, held) in self.held.drain() {
            held.cancel.cancel();
            held.handler.abort();
        }
        for (_, handler) in self.stopping.drain() {
            handler.abort();
        }
    }
}

/// Refusals that retrying cannot fix: the daemon answered, and said no.
fn is_refusal(e: &Error) -> bool {
    match e {
        Error::Server(body) => body.code != ErrorCode::ShuttingDown,
        Error::InvalidInput(_) => true,
        _ => false,
    }
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
    Instant::now() + (left / 3).max(MIN_RENEW_INTERVAL)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

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
