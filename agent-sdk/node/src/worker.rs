//! `Worker` and `Task`: `muster_sdk::Worker` handing its tasks to JavaScript.
//!
//! The Rust worker owns everything about leases: the member session, pushes, renewals
//! with progress, local deadlines, reconnects with resume, reclaim and drain. None of
//! it waits for JavaScript, so a busy event loop cannot delay a renewal.
//!
//! The worker's handler for a task ([`run_handler`]) sends a [`Task`] to the worker's
//! channel, which `Worker#nextTasks()` reads (`index.js` builds `run(handler)` and
//! `for await (const task of worker)` on it), and waits for the outcome JavaScript
//! gives through the task's settle methods (`ack`, `nack`, `deadLetter`, `throttled`,
//! `release`, or a successful `suspend` / `spawnAndWait`). A task JavaScript drops
//! without settling (garbage-collected) is released; one the worker gives up (its lease
//! lost, the grace period over) is released by the worker whatever JavaScript does
//! later. `Task#cancelled()` resolves `true` when the task must stop, `false` once the
//! task has ended without that, so nothing waits on a task forever.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use muster_protocol::limits::{MAX_DELAY, MAX_ERROR_BYTES, MAX_PROGRESS_BYTES, MAX_RESULT_BYTES};
use muster_sdk::{OnTimeout, Outcome, RawJson, WorkerConfig, WorkerHandle};
use napi::Result;
use napi_derive::napi;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot, watch};

use crate::client::settle;
use crate::errors::{invalid, to_js};
use crate::records::{
    ChildOutcome, Chunk, ConnectOptions, NewChild, Resumed, Spawned, SpawnedChild, Suspended,
    record,
};

/// What a worker is, and where its daemon is.
#[napi(object)]
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// The stable member name (e.g. `gpu-3/agent-7`): a restarted agent under the same
    /// name gets its in-flight tasks back at once.
    pub member: String,
    /// The queues to take tasks from.
    pub queues: Vec<String>,
    /// The most tasks run at once (1 to 1,000; 1 if left out).
    pub capacity: Option<u32>,
    /// Labels matched against tasks' `requires`.
    pub labels: Option<Vec<String>>,
    /// How long handlers get to finish on shutdown before their tasks are released
    /// (25,000 ms if left out).
    pub grace_ms: Option<u32>,
    /// Reclaim the member's leases on start (true if left out).
    pub reclaim_on_start: Option<bool>,
    /// How long the daemon may not hear from this agent before it counts it
    /// unreachable (1,000 to 60,000 ms; 5,000 if left out).
    pub liveness_ms: Option<u32>,
    /// Where the daemon is and how to trust it, as `Client.connect` takes them.
    pub connect: Option<ConnectOptions>,
}

/// An agent: one member session handing the tasks pushed to it to JavaScript. Run it
/// with `await worker.run(handler)` or `for await (const task of worker)`; a worker runs
/// once.
#[napi]
pub struct Worker {
    /// Taken when the worker starts.
    worker: Mutex<Option<muster_sdk::Worker>>,
    handle: WorkerHandle,
    /// The tasks handed over, read by `nextTasks`.
    tasks: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<Task>>>,
    /// The sending end, taken by the handler when the worker starts.
    sender: Mutex<Option<mpsc::UnboundedSender<Task>>>,
    /// How the run ended, once it has.
    ended: Arc<Mutex<Option<std::result::Result<(), muster_sdk::Error>>>>,
}

#[napi]
impl Worker {
    /// A worker; nothing connects before it runs, but the connection options are
    /// settled now (the contexts file is read): a bad context throws `ConnectError`.
    #[napi(constructor)]
    pub fn new(options: WorkerOptions) -> Result<Worker> {
        // Names the daemon could never accept are refused here, not waited for.
        muster_protocol::names::check_member(&options.member).map_err(invalid)?;
        if options.queues.is_empty() {
            return Err(invalid("a worker takes tasks from at least one queue"));
        }
        for queue in &options.queues {
            muster_protocol::names::check_queue(queue).map_err(invalid)?;
        }
        let mut config = WorkerConfig::new(options.member, options.queues);
        if let Some(capacity) = options.capacity {
            if capacity == 0 {
                return Err(invalid("capacity is at least 1"));
            }
            config.capacity = capacity;
        }
        config.labels = options.labels.unwrap_or_default();
        if let Some(grace) = options.grace_ms {
            config.grace = Duration::from_millis(grace.into());
        }
        if let Some(reclaim) = options.reclaim_on_start {
            config.reclaim_on_start = reclaim;
        }
        if let Some(liveness) = options.liveness_ms {
            config.liveness = Duration::from_millis(liveness.into());
        }
        let worker = muster_sdk::Worker::new(settle(options.connect)?, config);
        let handle = worker.handle();
        let (sender, tasks) = mpsc::unbounded_channel();
        Ok(Worker {
            worker: Mutex::new(Some(worker)),
            handle,
            tasks: Arc::new(tokio::sync::Mutex::new(tasks)),
            sender: Mutex::new(Some(sender)),
            ended: Arc::default(),
        })
    }

    /// Starts a graceful shutdown: take nothing new, let handlers finish within the
    /// grace period, cancel the rest (their `signal` aborts), release what is left with
    /// its latest checkpoint, and close the session. `nextTasks` then resolves `null`.
    #[napi]
    pub fn shutdown(&self) {
        self.handle.shutdown();
    }

    /// The next tasks to handle (every one handed over since the last call, at least
    /// one), starting the worker on the first call; `null` once the worker has stopped
    /// and every task it took was handed over. Rejects with why the worker stopped when
    /// it failed: `Replaced` (another process took the member name over) or the
    /// daemon's refusal of the session (`BadRequest` for a bad name, `Forbidden` for a
    /// queue the token may not consume). A queue that does not exist yet is waited for
    /// (logged once), not a failure. `run` and `for await` are built on it.
    #[napi]
    pub async fn next_tasks(&self) -> Result<Option<Vec<Task>>> {
        self.start();
        let mut tasks = self.tasks.lock().await;
        let Some(first) = tasks.recv().await else {
            return match lock(&self.ended).take() {
                Some(Err(e)) => Err(to_js(e)),
                Some(Ok(())) | None => Ok(None),
            };
        };
        // The rest already handed over go with it: one promise for a burst of tasks.
        let mut batch = vec![first];
        while let Ok(task) = tasks.try_recv() {
            batch.push(task);
        }
        Ok(Some(batch))
    }
}

impl Worker {
    /// Runs the Rust worker on the runtime, once.
    fn start(&self) {
        let Some(worker) = lock(&self.worker).take() else {
            return;
        };
        let sender = lock(&self.sender)
            .take()
            .expect("the sender is taken with the worker");
        let ended = Arc::clone(&self.ended);
        // Held until the run's end is recorded: the channel ends only after that, so a
        // `nextTasks` that sees it end always finds how the run ended.
        let last = sender.clone();
        napi::bindgen_prelude::spawn(async move {
            let result = worker
                .run(move |task| run_handler(sender.clone(), task))
                .await;
            *lock(&ended) = Some(result);
            drop(last);
        });
    }
}

/// A task in JavaScript's hands: what the delivery said, and how to settle it.
#[napi]
pub struct Task {
    task: Arc<muster_sdk::Task>,
    /// Where the outcome goes; the first settle takes it.
    outcome: Mutex<Option<oneshot::Sender<Outcome>>>,
    /// Closed when the worker stops waiting for the task (settled, or given up).
    ended: watch::Receiver<()>,
}

#[napi]
impl Task {
    /// The task's id.
    #[napi(getter)]
    pub fn id(&self) -> String {
        self.task.id().to_owned()
    }

    /// Its queue.
    #[napi(getter)]
    pub fn queue(&self) -> String {
        self.task.delivery().queue.clone()
    }

    /// The lease epoch of this delivery.
    #[napi(getter)]
    pub fn epoch(&self) -> i64 {
        number(self.task.delivery().epoch)
    }

    /// The delivery number, 1 on the first.
    #[napi(getter)]
    pub fn attempt(&self) -> i64 {
        number(self.task.attempt())
    }

    /// Failures so far (nacks, lapses, revokes and reclaims).
    #[napi(getter)]
    pub fn failures(&self) -> i64 {
        number(self.task.delivery().failures)
    }

    /// Its priority, 0 to 9.
    #[napi(getter)]
    pub fn priority(&self) -> u8 {
        self.task.delivery().priority
    }

    /// Its key, if any.
    #[napi(getter)]
    pub fn key(&self) -> Option<String> {
        self.task.delivery().key.clone()
    }

    /// True if the task was reclaimed after this member restarted: it was in flight
    /// here before.
    #[napi(getter)]
    pub fn reclaimed(&self) -> bool {
        self.task.reclaimed()
    }

    /// The payload (a new copy on every read).
    #[napi(getter)]
    pub fn payload(&self) -> Result<Value> {
        json_value(self.task.payload())
    }

    /// The payload as the JSON text it was enqueued as (key order, spacing and number
    /// spelling kept).
    #[napi(getter)]
    pub fn payload_json(&self) -> String {
        self.task.payload().get().to_owned()
    }

    /// The latest checkpoint (`setProgress`, or an earlier holder's), if any.
    #[napi(getter)]
    pub fn progress(&self) -> Result<Option<Value>> {
        self.task.progress().map(|p| json_value(&p)).transpose()
    }

    /// How its last suspension ended, when this run follows one.
    #[napi(getter)]
    pub fn resumed(&self) -> Result<Option<Resumed>> {
        self.task.resumed().map(record).transpose()
    }

    /// The outcome of each child the task waited for (`spawnAndWait`), on the run
    /// after the wait.
    #[napi(getter)]
    pub fn children(&self) -> Result<Vec<ChildOutcome>> {
        self.task.children().iter().map(record).collect()
    }

    /// The task that spawned this one, if it is a child.
    #[napi(getter)]
    pub fn parent(&self) -> Option<String> {
        self.task.parent().map(str::to_owned)
    }

    /// The number this run's first output chunk gets.
    #[napi(getter)]
    pub fn output_start(&self) -> i64 {
        number(self.task.delivery().output)
    }

    /// True once the task should stop (see `cancelled`).
    #[napi(getter)]
    pub fn is_cancelled(&self) -> bool {
        self.task.is_cancelled()
    }

    /// True once the worker is draining (shutting down).
    #[napi(getter)]
    pub fn is_draining(&self) -> bool {
        self.task.is_draining()
    }

    /// Milliseconds until the lease's local deadline (renewals move it on).
    #[napi(getter)]
    pub fn lease_remaining_ms(&self) -> i64 {
        let left = self
            .task
            .lease_deadline()
            .saturating_duration_since(Instant::now());
        i64::try_from(left.as_millis()).unwrap_or(i64::MAX)
    }

    /// True once an outcome was given (or the task suspended): later settles do
    /// nothing.
    #[napi(getter)]
    pub fn settled(&self) -> bool {
        lock(&self.outcome).is_none()
    }

    /// Resolves `true` when the task must stop: a cancel was asked, its lease was lost
    /// or revoked or may lapse, or the worker's grace period ended; `false` once the
    /// task has ended without that (settled, or released). `signal` is built on it.
    #[napi]
    pub async fn cancelled(&self) -> bool {
        let task = Arc::clone(&self.task);
        let mut ended = self.ended.clone();
        tokio::select! {
            () = task.cancelled() => true,
            _ = ended.changed() => task.is_cancelled(),
        }
    }

    /// Resolves `true` when the worker starts draining, `false` once the task has ended
    /// before that.
    #[napi]
    pub async fn draining(&self) -> bool {
        let task = Arc::clone(&self.task);
        let mut ended = self.ended.clone();
        tokio::select! {
            () = task.draining() => true,
            _ = ended.changed() => task.is_draining(),
        }
    }

    /// Sets a checkpoint (any JSON value, at most 64 KiB as JSON): sent with the next
    /// renewal, and what the next holder's `progress` is if this run does not finish.
    #[napi]
    pub fn set_progress(&self, progress: Value) -> Result<()> {
        let raw = raw_json(&progress, "progress", MAX_PROGRESS_BYTES)?;
        self.task.set_progress(raw);
        Ok(())
    }

    /// Acks: the task is done, with `result` (any JSON value, at most 1 MiB as JSON) if
    /// given.
    #[napi]
    pub fn ack(&self, result: Option<Value>) -> Result<()> {
        let result = result
            .map(|r| raw_json(&r, "the result", MAX_RESULT_BYTES))
            .transpose()?;
        self.settle(Outcome::Ack(result));
        Ok(())
    }

    /// Nacks: the task failed with `error`; it is retried after `delayMs` (the queue's
    /// backoff if left out) until its attempts run out.
    #[napi]
    pub fn nack(&self, error: String, delay_ms: Option<u32>) {
        self.settle(Outcome::Nack {
            delay: delay_ms.map(|ms| Duration::from_millis(ms.into())),
            error: clip(&error, MAX_ERROR_BYTES),
        });
    }

    /// Sends the task to dead at once with `error`: no retry (an operator can redrive).
    #[napi]
    pub fn dead_letter(&self, error: String) {
        self.settle(Outcome::DeadLetter(clip(&error, MAX_ERROR_BYTES)));
    }

    /// Gives the task back throttled (a provider said to slow down): no failure is
    /// counted, and `limit` (every limit the task draws on if left out) hands nothing
    /// out for the task's key for `retryAfterMs` (1 s if left out; 1 ms to 365 days).
    #[napi]
    pub fn throttled(&self, retry_after_ms: Option<i64>, limit: Option<String>) -> Result<()> {
        let longest = MAX_DELAY.as_millis();
        if let Some(ms) = retry_after_ms
            && !(ms >= 1 && (ms as u128) <= longest)
        {
            return Err(invalid(format!(
                "retryAfterMs is {ms}, out of range (1 to {longest}, 365 days)"
            )));
        }
        if let Some(limit) = &limit {
            muster_protocol::names::check_limit(limit).map_err(invalid)?;
        }
        self.settle(Outcome::Throttled {
            retry_after: retry_after_ms.map(|ms| Duration::from_millis(ms.unsigned_abs())),
            limit,
        });
        Ok(())
    }

    /// Releases the task without a failure, for another holder (a cancelled task
    /// released ends `cancelled`).
    #[napi]
    pub fn release(&self) {
        self.settle(Outcome::Release);
    }

    /// Suspends the task until someone resumes it with the reply's `resumeToken` (or
    /// by id with an approve token), or its timeout (`timeoutMs`, the daemon's 7 days if
    /// left out) does `onTimeout` (`resume`, `fail` or `cancel`; `fail` if left out).
    /// The lease, the worker's slot and the limits' slots are free meanwhile; once it
    /// resolves the task is settled (a handler's later outcome is ignored). Rejects,
    /// the lease still held, when the worker is not connected or the daemon refuses.
    #[napi]
    pub async fn suspend(
        &self,
        reason: String,
        options: Option<SuspendOptions>,
    ) -> Result<Suspended> {
        let suspension = suspension(reason, options)?;
        let reply = self.task.suspend(suspension).await.map_err(to_js)?;
        self.settle(Outcome::Suspended);
        record(&reply)
    }

    /// Spawns children of the task, keeping its lease: each a task of its own (in any
    /// queue) naming this one its parent, enqueued once per child key (a key spawned
    /// before answers that child, `duplicate`). Cancelling this task cancels them.
    #[napi]
    pub async fn spawn(&self, children: Vec<NewChild>) -> Result<Vec<SpawnedChild>> {
        let children = new_children(&children)?;
        let spawned = self.task.spawn(children).await.map_err(to_js)?;
        spawned.iter().map(record).collect()
    }

    /// Spawns children and suspends the task until every child has finished (done,
    /// dead or cancelled), freeing its slot meanwhile as `suspend` does; the next run
    /// finds each child's outcome in `children`. Once it resolves the task is settled.
    #[napi]
    pub async fn spawn_and_wait(
        &self,
        children: Vec<NewChild>,
        reason: String,
        options: Option<SuspendOptions>,
    ) -> Result<Spawned> {
        let children = new_children(&children)?;
        let suspension = suspension(reason, options)?;
        let reply = self
            .task
            .spawn_and_wait(children, suspension)
            .await
            .map_err(to_js)?;
        self.settle(Outcome::Suspended);
        record(&reply)
    }

    /// Appends a text chunk (at most 64 KiB) to the task's live output; resolves once
    /// it is buffered (waiting only while 1 MiB is). The worker sends what has gathered
    /// in each emit, stored once whatever the connection does, and everything buffered
    /// before it settles the task. Rejects with `ConnectionLost` ("output stopped: ...")
    /// once the task's output has stopped (its lease lost, say).
    #[napi]
    pub async fn emit(&self, text: String) -> Result<()> {
        self.task
            .emit(muster_sdk::Chunk::text(text))
            .await
            .map_err(to_js)
    }

    /// Appends a JSON chunk (any JSON value but `null`, at most 64 KiB as JSON), as
    /// `emit` appends text.
    #[napi]
    pub async fn emit_json(&self, value: Value) -> Result<()> {
        let chunk = json_chunk(Chunk {
            text: None,
            json: Some(value),
        })?;
        self.task.emit(chunk).await.map_err(to_js)
    }

    /// Resolves once the daemon has every chunk emitted so far.
    #[napi]
    pub async fn flush_output(&self) -> Result<()> {
        self.task.flush_output().await.map_err(to_js)
    }
}

impl Task {
    fn settle(&self, outcome: Outcome) {
        if let Some(tx) = lock(&self.outcome).take() {
            // The worker stopped waiting (it gave the task up): the outcome is moot.
            let _ = tx.send(outcome);
        }
    }
}

/// How a suspension waits.
#[napi(object)]
#[derive(Debug, Clone, Default)]
pub struct SuspendOptions {
    /// How long it may wait (the daemon's 7 days if left out).
    pub timeout_ms: Option<i64>,
    /// What the timeout does: `resume`, `fail` (if left out) or `cancel`.
    pub on_timeout: Option<String>,
}

/// Hands one task to JavaScript and waits for its outcome; see the module documentation.
async fn run_handler(tasks: mpsc::UnboundedSender<Task>, task: muster_sdk::Task) -> Outcome {
    let (outcome_tx, outcome) = oneshot::channel();
    // Dropped with this future: when the outcome came, or the worker gave the task up.
    let (_ended, ended) = watch::channel(());
    let native = Task {
        task: Arc::new(task),
        outcome: Mutex::new(Some(outcome_tx)),
        ended,
    };
    if tasks.send(native).is_err() {
        return Outcome::Release;
    }
    // A task dropped unsettled (garbage-collected) drops its sender: released.
    outcome.await.unwrap_or(Outcome::Release)
}

fn suspension(reason: String, options: Option<SuspendOptions>) -> Result<muster_sdk::Suspension> {
    let options = options.unwrap_or_default();
    let on_timeout = options
        .on_timeout
        .map(|o| {
            OnTimeout::parse(&o)
                .ok_or_else(|| invalid(format!("onTimeout {o:?} is not resume, fail or cancel")))
        })
        .transpose()?;
    let timeout = options
        .timeout_ms
        .map(|ms| {
            u64::try_from(ms)
                .map(Duration::from_millis)
                .map_err(|_| invalid(format!("timeoutMs is {ms}, below 0")))
        })
        .transpose()?;
    Ok(muster_sdk::Suspension {
        reason,
        timeout,
        on_timeout,
    })
}

/// Children as the daemon reads them: refused (nothing sent) when one is not a child.
fn new_children(children: &[NewChild]) -> Result<Vec<muster_sdk::NewChild>> {
    children
        .iter()
        .enumerate()
        .map(|(i, child)| {
            serde_json::from_value(child.to_wire()?).map_err(|e| invalid(format!("child {i}: {e}")))
        })
        .collect()
}

/// A JSON chunk as the SDK sends it; refused when it is `null` (which the protocol
/// reads as no chunk) or not JSON.
pub fn json_chunk(chunk: Chunk) -> Result<muster_sdk::Chunk> {
    match (chunk.text, chunk.json) {
        (Some(text), None) => Ok(muster_sdk::Chunk::text(text)),
        (None, Some(Value::Null)) => Err(invalid(
            "a JSON chunk is not null (the protocol reads null as no chunk)",
        )),
        (None, Some(json)) => Ok(muster_sdk::Chunk::json(raw_json(
            &json,
            "a chunk",
            muster_protocol::limits::MAX_CHUNK_BYTES,
        )?)),
        _ => Err(invalid("a chunk holds exactly one of text and json")),
    }
}

/// `value` as JSON text, refused over `limit` bytes (naming `what`).
fn raw_json(value: &Value, what: &str, limit: usize) -> Result<RawJson> {
    let text = serde_json::to_string(value).map_err(invalid)?;
    if text.len() > limit {
        return Err(invalid(format!(
            "{what} is {} bytes as JSON, over the limit of {limit}",
            text.len()
        )));
    }
    serde_json::value::RawValue::from_string(text).map_err(invalid)
}

/// A JSON text the daemon sent, as a value (its numbers as JavaScript reads them).
fn json_value(raw: &RawJson) -> Result<Value> {
    let mut value = serde_json::from_str(raw.get()).map_err(invalid)?;
    crate::records::as_js_numbers(&mut value);
    Ok(value)
}

/// A count or epoch as JavaScript holds numbers (exact up to 2^53).
fn number(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// `text` cut to at most `limit` bytes on a character boundary.
fn clip(text: &str, limit: usize) -> String {
    if text.len() <= limit {
        return text.to_owned();
    }
    let mut end = limit;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Only an outcome sender, a worker not yet run or a run's end is behind these
    // locks: keep going.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
