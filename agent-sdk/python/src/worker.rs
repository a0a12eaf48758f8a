//! The native `Worker` and `Task`: `muster_sdk::Worker` running Python handlers.
//!
//! The Rust worker owns everything about leases: the member session, pushes, renewals
//! with progress, local deadlines, reconnects, reclaim and drain. None of that needs
//! the GIL, and no thread of the runtime ever waits for it (see `bridge`), so a slow or
//! blocking Python handler cannot delay another task's renewal.
//!
//! The worker's handler future for a task ([`run_handler`]) talks to the event loop
//! through an [`Inbox`] of its own: it posts `Start` (run the Python handler) and, when the task's
//! `cancelled()` fires (a cancel, a lost or revoked lease, a lease that may lapse, the
//! grace period over) or the worker drops it (its lease's deadline passed), `Cancel`.
//! Posting writes a byte to a socket the event loop watches (`loop.add_reader`) when
//! the inbox was empty; the loop then calls [`Worker::pump`], which, holding the GIL
//! as any loop callback does, creates the handlers' asyncio tasks and cancels them.
//! The Python side reports the outcome through the native [`Task`]'s settle methods; a
//! handler that ends without one (cancelled before it started, or ended by a
//! `BaseException`) releases its task through `ended`, the done-callback of its
//! asyncio task.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use muster_protocol::limits::{MAX_DELAY, MAX_ERROR_BYTES, MAX_PROGRESS_BYTES, MAX_RESULT_BYTES};
use muster_sdk::{Chunk, NewChild, OnTimeout, Outcome, WorkerConfig, WorkerHandle};
use pyo3::prelude::*;
use tokio::sync::oneshot;
use tracing::warn;

use crate::bridge::{Inbox, Loop, Reply};
use crate::client::{options, raw};
use crate::errors::invalid;

/// A worker: one member session running a Python handler per task.
#[pyclass(frozen, module = "muster._native")]
pub struct Worker {
    /// Taken by `run`: a worker runs once.
    worker: Mutex<Option<muster_sdk::Worker>>,
    handle: WorkerHandle,
    inbox: Arc<Inbox<Message>>,
    /// Set by `run`, cleared when it ends (so the handler it holds can be collected):
    /// what `pump` starts handlers with.
    bridge: Arc<Mutex<Option<Bridge>>>,
}

#[pymethods]
impl Worker {
    /// A worker for `member` on `queues`; durations in milliseconds, connection options
    /// as `connect` takes them.
    #[new]
    #[pyo3(signature = (
        member, queues, capacity, labels, grace_ms, reclaim_on_start, liveness_ms,
        addr=None, data=None, ca=None, pin=None, token=None, server_name=None, token_file=None,
        context=None,
    ))]
    #[expect(
        clippy::too_many_arguments,
        reason = "the WorkerConfig fields and the connection options, as Python passes them"
    )]
    fn new(
        member: String,
        queues: Vec<String>,
        capacity: u32,
        labels: Vec<String>,
        grace_ms: u64,
        reclaim_on_start: bool,
        liveness_ms: u64,
        addr: Option<String>,
        data: Option<String>,
        ca: Option<String>,
        pin: Option<String>,
        token: Option<String>,
        server_name: Option<String>,
        token_file: Option<String>,
        context: Option<String>,
    ) -> PyResult<Worker> {
        let mut config = WorkerConfig::new(member, queues);
        config.capacity = capacity;
        config.labels = labels;
        config.grace = Duration::from_millis(grace_ms);
        config.reclaim_on_start = reclaim_on_start;
        config.liveness = Duration::from_millis(liveness_ms);
        let options = options(addr, data, ca, pin, token, server_name, token_file, context)?;
        let worker = muster_sdk::Worker::new(options, config);
        let handle = worker.handle();
        Ok(Worker {
            worker: Mutex::new(Some(worker)),
            handle,
            inbox: Arc::new(Inbox::new()?),
            bridge: Arc::default(),
        })
    }

    /// The file descriptor the event loop watches (`loop.add_reader(fd, pump)`) while
    /// the worker runs.
    #[getter]
    fn wakeup_fd(&self) -> i32 {
        self.inbox.wakeup_fd()
    }

    /// Takes the inbox's messages: starts handlers (`runner(task)` as asyncio tasks of
    /// the loop) and cancels them. Called by the event loop, on its thread.
    fn pump(&self, py: Python<'_>) {
        let bridge = lock(&self.bridge);
        for message in self.inbox.take() {
            match message {
                Message::Start(running, task) => match bridge.as_ref() {
                    Some(bridge) => bridge.start(py, &running, task),
                    None => task.settle(Outcome::Release),
                },
                Message::Cancel(running) => running.cancel(py),
            }
        }
    }

    /// Starts a graceful shutdown (a drain); callable from any thread.
    fn shutdown(&self) {
        self.handle.shutdown();
    }

    /// Runs the worker until it is shut down and every task is settled or released.
    /// `runner(task)` makes the coroutine that runs one task on `event_loop`, which must
    /// watch [`Worker::wakeup_fd`] for the whole run.
    fn run<'py>(
        &self,
        py: Python<'py>,
        done: &Bound<'py, Loop>,
        runner: Py<PyAny>,
        event_loop: Py<PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let worker = lock(&self.worker)
            .take()
            .ok_or_else(|| invalid("this worker has run already: make a new one"))?;
        *lock(&self.bridge) = Some(Bridge { runner, event_loop });
        let (inbox, bridge) = (Arc::clone(&self.inbox), Arc::clone(&self.bridge));
        done.get().spawn(py, async move {
            let result = worker
                .run(move |task| run_handler(Arc::clone(&inbox), task))
                .await;
            lock(&bridge).take();
            result
        })
    }
}

/// A task in a Python handler's hands.
#[pyclass(frozen, module = "muster._native")]
pub struct Task {
    task: Arc<muster_sdk::Task>,
    /// Where the outcome goes; the first settle takes it.
    outcome: Mutex<Option<oneshot::Sender<Outcome>>>,
}

#[pymethods]
impl Task {
    /// The task's id.
    #[getter]
    fn id(&self) -> String {
        self.task.id().to_owned()
    }

    /// The task's queue.
    #[getter]
    fn queue(&self) -> String {
        self.task.delivery().queue.clone()
    }

    /// The lease epoch of this delivery.
    #[getter]
    fn epoch(&self) -> u64 {
        self.task.delivery().epoch
    }

    /// The delivery number, 1 on the first.
    #[getter]
    fn attempt(&self) -> u64 {
        self.task.attempt()
    }

    /// Failures so far.
    #[getter]
    fn failures(&self) -> u64 {
        self.task.delivery().failures
    }

    /// The task's priority.
    #[getter]
    fn priority(&self) -> u8 {
        self.task.delivery().priority
    }

    /// The task's key, if any.
    #[getter]
    fn key(&self) -> Option<String> {
        self.task.delivery().key.clone()
    }

    /// True if the task was reclaimed after this member restarted.
    #[getter]
    fn reclaimed(&self) -> bool {
        self.task.reclaimed()
    }

    /// The payload as JSON text.
    #[getter]
    fn payload(&self) -> String {
        self.task.payload().get().to_owned()
    }

    /// The latest checkpoint as JSON text: this handler's, else the delivered one.
    #[getter]
    fn progress(&self) -> Option<String> {
        self.task.progress().map(|p| p.get().to_owned())
    }

    /// How the task's last suspension ended, as JSON text (`data`, `by`, `at_ms`,
    /// `timed_out`, and `children` for a wait for its children), if it was resumed.
    #[getter]
    fn resumed(&self) -> Option<String> {
        self.task
            .resumed()
            .map(|r| serde_json::to_string(r).expect("a resume serializes"))
    }

    /// Suspends the task (its lease ends, no attempt spent): resolves with the reply
    /// (`state`, `resume_token`, `timeout_at_ms`) as a one-element list of JSON objects,
    /// and makes `Outcome::Suspended` the handler's outcome. Refused before sending
    /// when `on_timeout` is not `resume`, `fail` or `cancel`.
    #[pyo3(signature = (done, reason, timeout_ms, on_timeout))]
    fn suspend<'py>(
        slf: &Bound<'py, Self>,
        py: Python<'py>,
        done: &Bound<'py, Loop>,
        reason: String,
        timeout_ms: Option<u64>,
        on_timeout: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let suspension = suspension(reason, timeout_ms, on_timeout)?;
        let this = slf.clone().unbind();
        let task = Arc::clone(&slf.get().task);
        done.get().spawn(py, async move {
            let reply = task.suspend(suspension).await?;
            // Suspended: nothing is left to settle, whatever the handler does next.
            this.get().settle(Outcome::Suspended);
            let text = serde_json::to_string(&reply).expect("a reply serializes");
            Ok(Reply::Json(vec![text]))
        })
    }

    /// Spawns children of the task, keeping its lease: resolves with each child's
    /// reply (`child_key`, `id`, `duplicate`, `state`) as a list of JSON objects, in
    /// the order given. `children` are `dict`s of a spawn's child fields (`child_key`,
    /// `queue`, `task`), written as `crate::json` writes a request's fields; one that
    /// is not a child is refused before anything is sent.
    fn spawn<'py>(
        &self,
        py: Python<'py>,
        done: &Bound<'py, Loop>,
        children: Vec<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let children = new_children(&children)?;
        let task = Arc::clone(&self.task);
        done.get().spawn(py, async move {
            let spawned = task.spawn(children).await?;
            let texts = spawned
                .iter()
                .map(|c| serde_json::to_string(c).expect("a spawned child serializes"))
                .collect();
            Ok(Reply::Json(texts))
        })
    }

    /// Spawns children (as [`Task::spawn`] takes them) and suspends the task until
    /// every child has finished: resolves with the reply (`children`, `state`,
    /// `resume_token`, `timeout_at_ms`) as a one-element list of JSON objects, and
    /// makes `Outcome::Suspended` the handler's outcome, as [`Task::suspend`] does.
    #[pyo3(signature = (done, children, reason, timeout_ms, on_timeout))]
    fn spawn_and_wait<'py>(
        slf: &Bound<'py, Self>,
        py: Python<'py>,
        done: &Bound<'py, Loop>,
        children: Vec<Bound<'py, PyAny>>,
        reason: String,
        timeout_ms: Option<u64>,
        on_timeout: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let children = new_children(&children)?;
        let suspension = suspension(reason, timeout_ms, on_timeout)?;
        let this = slf.clone().unbind();
        let task = Arc::clone(&slf.get().task);
        done.get().spawn(py, async move {
            let reply = task.spawn_and_wait(children, suspension).await?;
            // Waiting (or woken, or cancelled): nothing is left to settle.
            this.get().settle(Outcome::Suspended);
            let text = serde_json::to_string(&reply).expect("a reply serializes");
            Ok(Reply::Json(vec![text]))
        })
    }

    /// The number this run's first output chunk gets: the delivery's `output` (how
    /// many chunks earlier runs of the task emitted).
    #[getter]
    fn output(&self) -> u64 {
        self.task.delivery().output
    }

    /// Appends one chunk to the task's output (`muster_sdk::Task::emit`): `text`, or
    /// `json` (JSON text), exactly one. Resolves once the chunk is buffered (it waits
    /// while the task's buffer is full). Refused with `InvalidInput` for a chunk that is
    /// neither or both, JSON text that is not JSON or is `null`, or one over
    /// `MAX_CHUNK_BYTES`; `ConnectionLost` once the task's output has stopped (its
    /// lease lost, an emit refused for good, the worker stopped).
    #[pyo3(signature = (done, text, json))]
    fn emit<'py>(
        &self,
        py: Python<'py>,
        done: &Bound<'py, Loop>,
        text: Option<String>,
        json: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let chunk = chunk(text, json)?;
        let task = Arc::clone(&self.task);
        done.get().spawn(py, async move { task.emit(chunk).await })
    }

    /// [`Task::emit`] for a thread that is not an event loop's (a synchronous
    /// handler's): blocks until the chunk is buffered, without the GIL.
    #[pyo3(signature = (text, json))]
    fn emit_blocking(
        &self,
        py: Python<'_>,
        text: Option<String>,
        json: Option<String>,
    ) -> PyResult<()> {
        let chunk = chunk(text, json)?;
        let runtime = crate::bridge::runtime()?;
        let task = Arc::clone(&self.task);
        py.detach(|| runtime.block_on(task.emit(chunk)))
            .map_err(crate::errors::to_py)
    }

    /// Resolves once the daemon has every chunk emitted so far; `ConnectionLost` if the
    /// task's output stopped before.
    fn flush_output<'py>(
        &self,
        py: Python<'py>,
        done: &Bound<'py, Loop>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let task = Arc::clone(&self.task);
        done.get()
            .spawn(py, async move { task.flush_output().await })
    }

    /// The task that spawned this one, if it is a child.
    #[getter]
    fn parent(&self) -> Option<String> {
        self.task.parent().map(str::to_owned)
    }

    /// The W3C `traceparent` the delivery carries: the producer's trace context, or,
    /// when the daemon exports spans, this lease's span in that trace.
    #[getter]
    fn traceparent(&self) -> Option<String> {
        self.task.delivery().traceparent.clone()
    }

    /// The W3C `tracestate` that goes with [`Task::traceparent`], if any.
    #[getter]
    fn tracestate(&self) -> Option<String> {
        self.task.delivery().tracestate.clone()
    }

    /// True once the task should stop.
    #[getter]
    fn is_cancelled(&self) -> bool {
        self.task.is_cancelled()
    }

    /// True once the worker is draining.
    #[getter]
    fn is_draining(&self) -> bool {
        self.task.is_draining()
    }

    /// Seconds until the lease's local deadline, when the handler is stopped unless a
    /// renewal moves it (0 once passed).
    #[getter]
    fn lease_remaining(&self) -> f64 {
        self.task
            .lease_deadline()
            .saturating_duration_since(Instant::now())
            .as_secs_f64()
    }

    /// Sets a checkpoint (JSON text); the worker stores it with a renewal within about
    /// a second, and before the task is released.
    fn set_progress(&self, progress: String) -> PyResult<()> {
        if progress.len() > MAX_PROGRESS_BYTES {
            return Err(invalid(format!(
                "progress is {} bytes, over the limit of {MAX_PROGRESS_BYTES}",
                progress.len()
            )));
        }
        self.task.set_progress(raw(progress)?);
        Ok(())
    }

    /// Resolves when the worker starts draining.
    fn draining<'py>(
        &self,
        py: Python<'py>,
        done: &Bound<'py, Loop>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let task = Arc::clone(&self.task);
        done.get().spawn(py, async move {
            task.draining().await;
            Ok(())
        })
    }

    /// The handler succeeded: ack with a result (JSON text). Refused (so that the
    /// caller can fail the task instead) when the result is not JSON or over its limit.
    #[pyo3(signature = (result=None))]
    fn ack(&self, result: Option<String>) -> PyResult<()> {
        if let Some(result) = &result
            && result.len() > MAX_RESULT_BYTES
        {
            return Err(invalid(format!(
                "the result is {} bytes, over the limit of {MAX_RESULT_BYTES}",
                result.len()
            )));
        }
        let result = result.map(raw).transpose()?;
        self.settle(Outcome::Ack(result));
        Ok(())
    }

    /// The handler failed: retry after `delay_ms` (the queue's backoff if absent).
    #[pyo3(signature = (delay_ms, error))]
    fn nack(&self, delay_ms: Option<u64>, error: &str) {
        self.settle(Outcome::Nack {
            delay: delay_ms.map(Duration::from_millis),
            error: clip(error, MAX_ERROR_BYTES),
        });
    }

    /// The handler failed for good: send the task to dead.
    fn dead_letter(&self, error: &str) {
        self.settle(Outcome::DeadLetter(clip(error, MAX_ERROR_BYTES)));
    }

    /// A provider the handler calls throttled it: hand the task back without a failure,
    /// and hold `limit` (every limit the task draws on if absent) for `retry_after_ms`
    /// (the daemon's default, 1 s, if absent) for the task's key. Refused (so that the
    /// caller hears of it, where the daemon's refusal would only be logged) when
    /// `retry_after_ms` is out of range or `limit` is no limit's name.
    #[pyo3(signature = (retry_after_ms, limit))]
    fn throttled(&self, retry_after_ms: Option<u64>, limit: Option<String>) -> PyResult<()> {
        let longest = MAX_DELAY.as_millis();
        if let Some(ms) = retry_after_ms
            && !(1..=longest).contains(&u128::from(ms))
        {
            return Err(invalid(format!(
                "retry_after is {ms} ms, out of range (1 ms to {longest} ms, 365 days)"
            )));
        }
        if let Some(limit) = &limit {
            muster_protocol::names::check_limit(limit).map_err(invalid)?;
        }
        self.settle(Outcome::Throttled {
            retry_after: retry_after_ms.map(Duration::from_millis),
            limit,
        });
        Ok(())
    }

    /// The handler stopped (cancelled): hand the task back without a failure.
    fn release(&self) {
        self.settle(Outcome::Release);
    }

    /// The done-callback of the handler's future: releases the task if the handler
    /// ended without an outcome.
    fn ended(&self, _future: &Bound<'_, PyAny>) {
        self.settle(Outcome::Release);
    }
}

impl Task {
    /// Hands the outcome to the worker; only the first counts.
    fn settle(&self, outcome: Outcome) {
        if let Some(tx) = lock(&self.outcome).take() {
            // The worker stopped waiting (it dropped the handler): the outcome is moot.
            let _ = tx.send(outcome);
        }
    }
}

/// Messages from the handler futures to the event loop, taken by [`Worker::pump`].
/// Their number is bounded by the tasks the worker holds: one `Start` and at most two
/// `Cancel`s (asked, then dropped) each.
enum Message {
    /// Run the Python handler on this task.
    Start(Arc<Running>, Task),
    /// Cancel the handler's asyncio task.
    Cancel(Arc<Running>),
}

/// What a running worker starts Python handlers with.
struct Bridge {
    /// `runner(task)` returns the coroutine that runs the user's handler on one task.
    runner: Py<PyAny>,
    /// The event loop `Worker.run` was awaited on.
    event_loop: Py<PyAny>,
}

impl Bridge {
    /// Starts the handler's asyncio task; a handler that cannot start releases its task.
    fn start(&self, py: Python<'_>, running: &Running, task: Task) {
        let id = task.task.id().to_owned();
        // Dropped on failure, its outcome sender with it: the task is released.
        let task = match Bound::new(py, task) {
            Ok(task) => task,
            Err(e) => {
                return warn!(task = %id, error = %e, "the Python task could not be made; releasing");
            }
        };
        match self.spawn(py, &task) {
            Ok(asyncio_task) => *lock(&running.task) = Some(asyncio_task.unbind()),
            Err(e) => {
                warn!(task = %id, error = %e, "the Python handler could not be started; releasing");
                task.get().settle(Outcome::Release);
            }
        }
    }

    fn spawn<'py>(&self, py: Python<'py>, task: &Bound<'py, Task>) -> PyResult<Bound<'py, PyAny>> {
        let coroutine = self.runner.bind(py).call1((task,))?;
        let asyncio_task = match self
            .event_loop
            .bind(py)
            .call_method1("create_task", (&coroutine,))
        {
            Ok(asyncio_task) => asyncio_task,
            Err(e) => {
                // Never to be awaited: close it so Python does not warn.
                coroutine.call_method0("close")?;
                return Err(e);
            }
        };
        asyncio_task.call_method1("add_done_callback", (task.getattr("ended")?,))?;
        Ok(asyncio_task)
    }
}

/// A handler's asyncio task, once the event loop started it.
#[derive(Default)]
struct Running {
    task: Mutex<Option<Py<PyAny>>>,
}

impl Running {
    fn cancel(&self, py: Python<'_>) {
        if let Some(task) = lock(&self.task).as_ref()
            && let Err(e) = task.bind(py).call_method0("cancel")
        {
            warn!(error = %e, "cancelling a Python handler");
        }
    }
}

/// Runs one task's Python handler; see the module documentation.
async fn run_handler(inbox: Arc<Inbox<Message>>, task: muster_sdk::Task) -> Outcome {
    let task = Arc::new(task);
    let (tx, mut outcome) = oneshot::channel();
    let running = Arc::new(Running::default());
    let native = Task {
        task: Arc::clone(&task),
        outcome: Mutex::new(Some(tx)),
    };
    inbox.post(Message::Start(Arc::clone(&running), native));
    let mut guard = CancelOnDrop {
        inbox,
        running,
        armed: true,
    };
    tokio::select! {
        result = &mut outcome => {
            guard.armed = false;
            return result.unwrap_or(Outcome::Release);
        }
        () = task.cancelled() => guard.cancel(),
    }
    let result = outcome.await.unwrap_or(Outcome::Release);
    guard.armed = false;
    result
}

/// Cancels a handler when asked, and when dropped still armed (the worker gave the
/// handler up before it returned).
struct CancelOnDrop {
    inbox: Arc<Inbox<Message>>,
    running: Arc<Running>,
    armed: bool,
}

impl CancelOnDrop {
    fn cancel(&self) {
        self.inbox.post(Message::Cancel(Arc::clone(&self.running)));
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if self.armed {
            self.cancel();
        }
    }
}

/// A suspension as the SDK takes it; refused when `on_timeout` is not `resume`, `fail`
/// or `cancel`.
fn suspension(
    reason: String,
    timeout_ms: Option<u64>,
    on_timeout: Option<String>,
) -> PyResult<muster_sdk::Suspension> {
    let on_timeout = on_timeout
        .map(|o| {
            OnTimeout::parse(&o)
                .ok_or_else(|| invalid(format!("on_timeout {o:?} is not resume, fail or cancel")))
        })
        .transpose()?;
    Ok(muster_sdk::Suspension {
        reason,
        timeout: timeout_ms.map(Duration::from_millis),
        on_timeout,
    })
}

/// An output chunk of `text` or `json` (JSON text), exactly one; refused when it is
/// neither or both, or its JSON is not JSON or is `null` (which the protocol reads as
/// absent: the emit would be refused, and the task's output stop).
fn chunk(text: Option<String>, json: Option<String>) -> PyResult<Chunk> {
    match (text, json) {
        (Some(text), None) => Ok(Chunk::text(text)),
        (None, Some(json)) => {
            let json = raw(json)?;
            if json.get().trim() == "null" {
                return Err(invalid(
                    "a JSON chunk is not null (the protocol reads null as no chunk)",
                ));
            }
            Ok(Chunk::json(json))
        }
        _ => Err(invalid("a chunk holds exactly one of text and json")),
    }
}

/// A spawn's children from the `dict`s of their fields, each read as the daemon reads
/// one; refused (nothing sent) when one is not a child.
fn new_children(children: &[Bound<'_, PyAny>]) -> PyResult<Vec<NewChild>> {
    children
        .iter()
        .enumerate()
        .map(|(i, fields)| {
            let text = crate::json::request(fields)?;
            serde_json::from_str(&text).map_err(|e| invalid(format!("child {i}: {e}")))
        })
        .collect()
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
    // Only an outcome sender or a worker not yet run is behind these locks: keep going.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
