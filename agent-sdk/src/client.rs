//! `Client`: one QUIC connection, one stream, many requests in flight.
//!
//! A writer task gathers encoded request frames from every caller into as few stream
//! writes as it can; a reader task matches each reply frame to its caller by id. When
//! the connection ends, every call in flight fails with [`Error::Closed`].

use std::collections::HashMap;
use std::marker::PhantomData;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot};

use muster_protocol::batch::{WRITE_CHUNK, WriteBatch};
use muster_protocol::frame;
use muster_protocol::model::{
    Delivery, EnqueuedTask, LimitInfo, LimitSpec, MemberInfo, NewTask, QueueInfo, QueuePatch,
    ScheduleInfo, TaskInfo, TaskState, TaskSummary,
};
use muster_protocol::ops::{
    self, Ack, Cancel, CancelReply, Claim, CountReply, DeadLetter, DeadSelection, Enqueue, Hello,
    LeaseRevoke, MemberDescribeReply, MemberName, Nack, Op, QueueCreate, QueueName, QueueUpdate,
    Release, Renew, RenewReply, RequestFrame, ServerEnvelope, SessionOpen, SessionOpenReply,
    SessionUpdate, SettleReply, Subscribe, TaskFind, TaskFindReply, TaskGet, TaskList,
    TaskListReply, Unsubscribe, Unwatch, View, Wait, WaitReply, Watch, WatchReply,
};
use muster_protocol::{PROTOCOL_VERSION, Push, RawJson};

use crate::Error;
use crate::connect::{self, ConnectOptions};

/// Encoded requests queued for the writer before callers wait.
const WRITE_QUEUE: usize = 1024;

/// Longest [`Client::close`] waits for the daemon to be told the connection closed.
pub const CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Longest [`Client::close`] waits for the replies to requests already sent.
pub const FLUSH_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The application close code a client gives a connection its daemon fell silent on
/// (see [`connect::SERVER_SILENCE`]).
pub const SILENT_SERVER_CODE: u32 = 7;

/// Where the reader puts the body of one reply frame.
type ReplySlot = oneshot::Sender<Result<Vec<u8>, Error>>;

/// A request waiting for its reply.
struct Call {
    slot: ReplySlot,
    /// The daemon may hold the reply back (a claim or wait with time to wait).
    waits: bool,
}

/// Calls waiting for replies, and whether the reply stream has ended.
#[derive(Default)]
struct Pending {
    calls: Mutex<HashMap<u64, Call>>,
    /// Set (before the map is drained) once no more replies can arrive.
    ended: AtomicBool,
    /// Woken whenever calls were answered or failed.
    answered: tokio::sync::Notify,
    /// Where pushes to this connection's member session go, once one is open.
    pushes: Mutex<Option<mpsc::UnboundedSender<Push>>>,
    /// Where this connection's watch pushes go, once a watch is open.
    watch: Mutex<Option<mpsc::UnboundedSender<WatchReply>>>,
    /// Set (before closing) when the client gave the connection up because the daemon
    /// fell silent: the reason every call in flight fails with.
    silent: Mutex<Option<String>>,
}

impl Pending {
    /// Why the connection ended, as calls in flight fail with it: the daemon's close
    /// reason, or that it fell silent, else `fallback`.
    fn lost_reason(&self, conn: &quinn::Connection, fallback: impl FnOnce() -> String) -> String {
        if let Some(why) = lock(&self.silent).clone() {
            return why;
        }
        conn.close_reason().map_or_else(fallback, |r| r.to_string())
    }
}

/// A connection to `musterd`. Clones share it.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    conn: quinn::Connection,
    /// The endpoint this client opened for itself (not a shared one), so closing can
    /// wait until the daemon was told.
    endpoint: Option<quinn::Endpoint>,
    frames: mpsc::Sender<Vec<u8>>,
    pending: Arc<Pending>,
    next_id: AtomicU64,
    /// The daemon's name and version from its `hello` reply.
    server: std::sync::OnceLock<String>,
    /// The cluster as the node saw it at `hello`; unset for a single daemon.
    cluster: std::sync::OnceLock<ops::ClusterHello>,
    /// Whom the daemon's `hello` reply said the token names; unset under `--open`.
    principal: std::sync::OnceLock<ops::PrincipalInfo>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.conn.close(0u32.into(), b"client closed");
    }
}

impl Client {
    /// Connects, opens the request stream and says hello.
    ///
    /// With one address and a single daemon there (not a cluster node) this is one
    /// connection, and its error is the connect's error. Otherwise the client goes to
    /// the cluster's leader: it connects to every address at once (and to a leader
    /// address a node names that is not among them), keeps the first connection to a
    /// single daemon or the leader and closes the others. While no node leads (an
    /// election) it asks again every [`connect::FIND_LEADER_RETRY`], up to
    /// [`connect::FIND_LEADER_TIMEOUT`], then fails with [`Error::Connect`] naming
    /// what each address said last. Trust, token and server name apply to every
    /// address; without a server name, each address's host is verified.
    pub async fn connect(options: ConnectOptions) -> Result<Client, Error> {
        crate::leader::find(&options, None).await
    }

    /// Connects on a shared endpoint (see [`connect::endpoint_for`]), to the leader
    /// when the options list several addresses, as [`Client::connect`] does.
    pub async fn connect_on(
        endpoint: &quinn::Endpoint,
        options: ConnectOptions,
    ) -> Result<Client, Error> {
        crate::leader::find(&options, Some(endpoint)).await
    }

    /// Connects to exactly the one address the options name, leader or not, e.g. to
    /// read one node's own view of the cluster ([`Client::cluster_status`]). Several
    /// addresses are refused with [`Error::InvalidInput`].
    pub async fn connect_node(options: ConnectOptions) -> Result<Client, Error> {
        let addrs = connect::addresses(&options.addr)?;
        if addrs.len() != 1 {
            return Err(Error::InvalidInput(format!(
                "one address is needed to connect to one node, not {} ({})",
                addrs.len(),
                options.addr
            )));
        }
        let options = ConnectOptions {
            addr: addrs[0].clone(),
            ..options
        };
        let (endpoint, conn) = connect::open_own(&options).await?;
        Client::start(conn, Some(endpoint), &options).await
    }

    /// Opens the request stream on a new connection and says hello.
    pub(crate) async fn start(
        conn: quinn::Connection,
        endpoint: Option<quinn::Endpoint>,
        options: &ConnectOptions,
    ) -> Result<Client, Error> {
        let (send, recv) = conn
            .open_bi()
            .await
            .map_err(|e| Error::Connect(format!("opening a stream: {e}")))?;
        let pending: Arc<Pending> = Arc::default();
        let (frames, queued) = mpsc::channel(WRITE_QUEUE);
        tokio::spawn(write_frames(send, queued));
        tokio::spawn(read_replies(recv, Arc::clone(&pending), conn.clone()));
        tokio::spawn(watch_silence(conn.clone(), Arc::clone(&pending)));
        let client = Client {
            inner: Arc::new(Inner {
                conn,
                endpoint,
                frames,
                pending,
                next_id: AtomicU64::new(1),
                server: std::sync::OnceLock::new(),
                cluster: std::sync::OnceLock::new(),
                principal: std::sync::OnceLock::new(),
            }),
        };
        let hello = client
            .call(&Hello {
                version: PROTOCOL_VERSION,
                token: options.hello_token()?,
                client: Some(concat!("muster-sdk ", env!("CARGO_PKG_VERSION")).into()),
            })
            .await?;
        let _ = client.inner.server.set(hello.server);
        if let Some(cluster) = hello.cluster {
            let _ = client.inner.cluster.set(cluster);
        }
        if let Some(principal) = hello.principal {
            let _ = client.inner.principal.set(principal);
        }
        Ok(client)
    }

    /// What the token may do, as the daemon's `hello` reply said: the principal's
    /// name, roles, queue patterns (empty: every queue) and member-name patterns. A
    /// local-only daemon's own token is `local`, an admin of every queue; `None` from
    /// a daemon that runs `--open`, where every request is allowed.
    pub fn principal(&self) -> Option<&ops::PrincipalInfo> {
        self.inner.principal.get()
    }

    /// The daemon's name and version as its `hello` reply gave them (`musterd 0.1.0`).
    pub fn server(&self) -> &str {
        self.inner.server.get().map_or("", String::as_str)
    }

    /// The cluster as the node this client is connected to saw it when it said hello
    /// (its id, the node's id and term, whom it believed to lead); `None` for a single
    /// daemon.
    pub fn cluster(&self) -> Option<ops::ClusterHello> {
        self.inner.cluster.get().cloned()
    }

    /// Sends any request and waits for its reply.
    pub async fn call<T: Op>(&self, req: &T) -> Result<T::Reply, Error> {
        self.send(req).await?.reply().await
    }

    /// Sends a request without waiting for its reply: requests sent one after another
    /// reach the daemon in that order, while their replies are awaited later.
    pub async fn send<T: Op>(&self, req: &T) -> Result<PendingReply<T>, Error> {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let framed = frame::encode_json(&RequestFrame::new(id, req))
            .map_err(|e| Error::InvalidInput(e.to_string()))?;
        Ok(PendingReply {
            rx: self.send_frame(id, framed, req.may_wait()).await?,
            client: self.clone(),
            op: PhantomData,
        })
    }

    /// Sends op `op` with `fields`, the JSON text of an object holding its fields as
    /// the protocol writes them (PROTOCOL.md §5), and waits for its reply: the call
    /// behind a binding that speaks the wire's records itself (the Python SDK). The
    /// reply is the reply frame's JSON object, its `id` and `ok` with the op's fields.
    ///
    /// The request is decoded here as the daemon decodes it before anything is sent, so
    /// an unknown op, fields that are not one JSON object, a field missing or of the
    /// wrong type, and a request over the frame limit fail with [`Error::InvalidInput`] and send
    /// nothing.
    pub async fn call_raw(&self, op: &str, fields: &str) -> Result<String, Error> {
        self.send_raw(op, fields).await?.reply().await
    }

    /// [`Client::call_raw`] without waiting for the reply: requests sent one after
    /// another reach the daemon in that order.
    pub async fn send_raw(&self, op: &str, fields: &str) -> Result<RawReply, Error> {
        let request = self.prepare_raw(op, fields)?;
        self.send_prepared(request).await
    }

    /// Builds request `op` from its fields' JSON text and checks it as the daemon
    /// decodes it, sending nothing: a caller with several requests to send prepares
    /// them all first, so that a bad one leaves none sent.
    pub fn prepare_raw(&self, op: &str, fields: &str) -> Result<PreparedRaw, Error> {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let body = raw_request(id, op, fields)?;
        let waits = match ops::decode_request(&body) {
            Ok((decoded, req)) => {
                assert_eq!(decoded, id, "a raw request keeps the id it was given");
                req.may_wait()
            }
            Err(e) => {
                let message = without_position(&e.error.message);
                return Err(Error::InvalidInput(format!("{op}: {message}")));
            }
        };
        let mut framed = Vec::with_capacity(frame::HEADER_LEN + body.len());
        frame::push_frame(&mut framed, &body);
        Ok(PreparedRaw { id, framed, waits })
    }

    /// Sends a request [`Client::prepare_raw`] built.
    pub async fn send_prepared(&self, request: PreparedRaw) -> Result<RawReply, Error> {
        let PreparedRaw { id, framed, waits } = request;
        Ok(RawReply {
            rx: self.send_frame(id, framed, waits).await?,
            client: self.clone(),
        })
    }

    /// Queues the frame of request `id` for the writer, its reply to come on the
    /// receiver returned.
    async fn send_frame(
        &self,
        id: u64,
        framed: Vec<u8>,
        waits: bool,
    ) -> Result<oneshot::Receiver<Result<Vec<u8>, Error>>, Error> {
        let (tx, rx) = oneshot::channel();
        let call = Call { slot: tx, waits };
        let previous = lock(&self.inner.pending.calls).insert(id, call);
        assert!(previous.is_none(), "request id {id} is in flight once");
        // IMPORTANT: check `ended` after inserting; the reader sets it before draining.
        if self.inner.pending.ended.load(Ordering::SeqCst)
            || self.inner.frames.send(framed).await.is_err()
        {
            lock(&self.inner.pending.calls).remove(&id);
            return Err(self.closed());
        }
        Ok(rx)
    }

    fn closed(&self) -> Error {
        Error::Closed(
            self.inner
                .pending
                .lost_reason(&self.inner.conn, || "the request stream ended".into()),
        )
    }

    /// Flushes and closes: waits (at most [`FLUSH_WAIT`]) until every request already
    /// sent has its reply, even those whose [`PendingReply`] was dropped unawaited,
    /// except claims and waits the daemon may hold back; then closes the connection and
    /// waits (at most [`CLOSE_WAIT`]) until the daemon has been told, so a process that
    /// exits next is seen gone at once rather than after the idle timeout. Calls still
    /// in flight then fail with [`Error::Closed`]. Clones of this client are closed
    /// too. Dropping the last clone instead closes at once, without flushing.
    pub async fn close(&self) {
        let _ = tokio::time::timeout(FLUSH_WAIT, self.answered()).await;
        self.inner.conn.close(0u32.into(), b"client closed");
        if let Some(endpoint) = &self.inner.endpoint {
            // Idle once the CONNECTION_CLOSE went out and its drain period passed.
            let _ = tokio::time::timeout(CLOSE_WAIT, endpoint.wait_idle()).await;
        }
    }

    /// Resolves once no request is waiting for a reply the daemon answers at once, or
    /// the connection has ended.
    async fn answered(&self) {
        let pending = &self.inner.pending;
        loop {
            let answered = pending.answered.notified();
            tokio::pin!(answered);
            // Registered before looking, so an answer in between still wakes us.
            answered.as_mut().enable();
            if pending.ended.load(Ordering::SeqCst)
                || lock(&pending.calls).values().all(|c| c.waits)
            {
                return;
            }
            answered.await;
        }
    }

    /// Resolves when the connection is closed, with the reason.
    pub async fn closed_reason(&self) -> String {
        let error = self.inner.conn.closed().await.to_string();
        self.inner.pending.lost_reason(&self.inner.conn, || error)
    }

    /// Creates a queue; options not given take their defaults.
    pub async fn queue_create(&self, queue: &str, options: QueuePatch) -> Result<QueueInfo, Error> {
        let req = QueueCreate {
            queue: queue.into(),
            options,
        };
        Ok(self.call(&req).await?.queue)
    }

    /// Every queue with its counts, by name (page after page).
    pub async fn queue_list(&self) -> Result<Vec<QueueInfo>, Error> {
        let mut queues = Vec::new();
        let mut after = None;
        loop {
            let page = self
                .call(&ops::QueueList {
                    after,
                    limit: Some(muster_protocol::limits::MAX_PAGE),
                })
                .await?;
            queues.extend(page.queues);
            match page.next {
                Some(next) => after = Some(next),
                None => return Ok(queues),
            }
        }
    }

    /// One queue with its counts.
    pub async fn queue_describe(&self, queue: &str) -> Result<QueueInfo, Error> {
        Ok(self.call(&ops::QueueDescribe(name(queue))).await?.queue)
    }

    /// Changes a queue's options.
    pub async fn queue_update(&self, queue: &str, options: QueuePatch) -> Result<QueueInfo, Error> {
        let req = QueueUpdate {
            queue: queue.into(),
            options,
        };
        Ok(self.call(&req).await?.queue)
    }

    /// Pauses a queue: it accepts enqueues but hands nothing out.
    pub async fn queue_pause(&self, queue: &str) -> Result<QueueInfo, Error> {
        Ok(self.call(&ops::QueuePause(name(queue))).await?.queue)
    }

    /// Resumes a paused queue.
    pub async fn queue_resume(&self, queue: &str) -> Result<QueueInfo, Error> {
        Ok(self.call(&ops::QueueResume(name(queue))).await?.queue)
    }

    /// Removes every ready and scheduled task of a queue; returns how many.
    pub async fn queue_purge(&self, queue: &str) -> Result<u64, Error> {
        Ok(self.call(&ops::QueuePurge(name(queue))).await?.count)
    }

    /// Deletes a queue and all its tasks; returns how many tasks went with it.
    pub async fn queue_delete(&self, queue: &str) -> Result<u64, Error> {
        Ok(self.call(&ops::QueueDelete(name(queue))).await?.count)
    }

    /// Enqueues one task. A fresh idempotency key is attached if the task has none, so
    /// a retry of this call after a lost reply cannot enqueue twice.
    pub async fn enqueue(&self, queue: &str, task: NewTask) -> Result<EnqueuedTask, Error> {
        let mut out = self.enqueue_batch(queue, vec![task]).await?;
        out.pop()
            .ok_or_else(|| Error::Protocol("enqueue reply without its task".into()))
    }

    /// Enqueues up to 1,000 tasks atomically, in order; idempotency keys as [`Client::enqueue`].
    pub async fn enqueue_batch(
        &self,
        queue: &str,
        tasks: Vec<NewTask>,
    ) -> Result<Vec<EnqueuedTask>, Error> {
        Ok(self.send_enqueue(queue, tasks).await?.reply().await?.tasks)
    }

    /// Sends an enqueue (with idempotency keys as [`Client::enqueue`]) without waiting
    /// for its reply, so a stream of enqueues keeps its order and its pipelining.
    pub async fn send_enqueue(
        &self,
        queue: &str,
        mut tasks: Vec<NewTask>,
    ) -> Result<PendingReply<Enqueue>, Error> {
        for task in &mut tasks {
            if task.idempotency_key.is_none() {
                task.idempotency_key = Some(ulid::Ulid::new().to_string());
            }
        }
        crate::trace::fill(&mut tasks);
        self.send(&Enqueue {
            queue: queue.into(),
            tasks,
        })
        .await
    }

    /// Leases ready tasks, waiting up to the claim's `wait_ms` for the first.
    pub async fn claim(&self, claim: &Claim) -> Result<Vec<Delivery>, Error> {
        Ok(self.call(claim).await?.tasks)
    }

    /// Settles a leased task as done, with an optional result.
    pub async fn ack(
        &self,
        task: &str,
        epoch: u64,
        result: Option<RawJson>,
    ) -> Result<SettleReply, Error> {
        self.call(&Ack {
            task: task.into(),
            epoch,
            result,
        })
        .await
    }

    /// Hands a leased task back as failed; it is retried after `delay_ms` or the queue's backoff.
    pub async fn nack(
        &self,
        task: &str,
        epoch: u64,
        delay_ms: Option<u64>,
        error: Option<String>,
    ) -> Result<SettleReply, Error> {
        self.call(&Nack {
            task: task.into(),
            epoch,
            delay_ms,
            error,
        })
        .await
    }

    /// Extends a lease, storing a progress checkpoint; the reply says if a cancel is pending.
    pub async fn renew(
        &self,
        task: &str,
        epoch: u64,
        extend_ms: Option<u64>,
        progress: Option<RawJson>,
    ) -> Result<RenewReply, Error> {
        self.call(&Renew {
            task: task.into(),
            epoch,
            extend_ms,
            progress,
        })
        .await
    }

    /// Hands a leased task back without counting a failure.
    pub async fn release(&self, task: &str, epoch: u64) -> Result<SettleReply, Error> {
        self.call(&Release {
            task: task.into(),
            epoch,
        })
        .await
    }

    /// Gives a leased task back because a provider it calls throttled it (an HTTP
    /// 429): ready again at its place with no failure counted, and `limit` (one the
    /// task draws on; every one it draws on if `None`) hands nothing out for
    /// `retry_after_ms` (1 s if `None`) for the task's key. A task that names no limit
    /// is not handed out again before then.
    pub async fn throttled(
        &self,
        task: &str,
        epoch: u64,
        retry_after_ms: Option<u64>,
        limit: Option<String>,
    ) -> Result<SettleReply, Error> {
        self.call(&ops::Throttled {
            task: task.into(),
            epoch,
            retry_after_ms,
            limit,
            error: None,
        })
        .await
    }

    /// Suspends a leased task instead of settling it (see [`crate::worker::Task::suspend`]
    /// for an agent's way): the lease ends without a failure and the task waits, as
    /// `suspended`, for a resume with the reply's `resume_token` or its timeout.
    pub async fn suspend(
        &self,
        task: &str,
        epoch: u64,
        suspension: crate::worker::Suspension,
    ) -> Result<ops::SuspendReply, Error> {
        self.call(&ops::Suspend {
            task: task.into(),
            epoch,
            reason: suspension.reason,
            timeout_ms: suspension.timeout.map(|t| t.as_millis() as u64),
            on_timeout: suspension.on_timeout,
        })
        .await
    }

    /// Spawns children of a leased task (see [`crate::worker::Task::spawn`] and
    /// [`crate::worker::Task::spawn_and_wait`] for an agent's way), with `wait`
    /// suspending it until they have all finished.
    pub async fn spawn(
        &self,
        task: &str,
        epoch: u64,
        mut children: Vec<ops::NewChild>,
        wait: Option<ops::SpawnWait>,
    ) -> Result<ops::SpawnReply, Error> {
        crate::trace::fill(children.iter_mut().map(|c| &mut c.task));
        self.call(&ops::Spawn {
            task: task.into(),
            epoch,
            children,
            wait,
        })
        .await
    }

    /// Appends chunks to a leased task's output, the first numbered `at` (the
    /// delivery's `output`, then each reply's `next`): a repeat of chunks stored before
    /// stores nothing twice. [`crate::worker::Task::emit`] is an agent's way.
    pub async fn emit(
        &self,
        task: &str,
        epoch: u64,
        at: u64,
        chunks: Vec<muster_protocol::model::Chunk>,
    ) -> Result<ops::EmitReply, Error> {
        self.call(&ops::Emit {
            task: task.into(),
            epoch,
            at,
            chunks,
        })
        .await
    }

    /// Reads a task's output from chunk `from`: what is kept there at once, else
    /// waits up to `timeout` for the next chunks or the task's end. Ask again from the
    /// reply's `next` until its `end`, on this connection or a new one: no chunk is
    /// missed or sent twice.
    pub async fn follow(
        &self,
        task: &str,
        from: u64,
        timeout: std::time::Duration,
    ) -> Result<ops::FollowReply, Error> {
        self.call(&ops::Follow {
            task: task.into(),
            from,
            timeout_ms: Some(timeout.as_millis() as u64),
        })
        .await
    }

    /// Resumes the suspension a `resume_token` names, handing `data` to the task's next
    /// holder. A token resumes once: a spent one, an earlier suspension's, or one of a
    /// task no longer suspended gets `stale_token`.
    pub async fn resume(
        &self,
        token: &str,
        data: Option<RawJson>,
    ) -> Result<ops::ResumeReply, Error> {
        self.call(&ops::Resume {
            token: Some(token.into()),
            task: None,
            data,
        })
        .await
    }

    /// Resumes suspended task `task` by its id (an approver's or an admin's way).
    pub async fn resume_task(
        &self,
        task: &str,
        data: Option<RawJson>,
    ) -> Result<ops::ResumeReply, Error> {
        self.call(&ops::Resume {
            token: None,
            task: Some(task.into()),
            data,
        })
        .await
    }

    /// Creates limit `name` or replaces its settings.
    pub async fn limit_set(&self, name: &str, spec: LimitSpec) -> Result<LimitInfo, Error> {
        let req = ops::LimitSet {
            name: name.into(),
            spec,
        };
        Ok(self.call(&req).await?.limit)
    }

    /// One limit with its state now: tokens, leases held, tasks waiting, busiest keys.
    pub async fn limit_get(&self, name: &str) -> Result<LimitInfo, Error> {
        let req = ops::LimitGet(ops::LimitName { name: name.into() });
        Ok(self.call(&req).await?.limit)
    }

    /// Every limit, by name (page after page).
    pub async fn limit_list(&self) -> Result<Vec<LimitInfo>, Error> {
        let mut limits = Vec::new();
        let mut after = None;
        loop {
            let page = self
                .call(&ops::LimitList {
                    after,
                    limit: Some(muster_protocol::limits::MAX_PAGE),
                })
                .await?;
            limits.extend(page.limits);
            match page.next {
                Some(next) => after = Some(next),
                None => return Ok(limits),
            }
        }
    }

    /// Deletes a limit; returns how many tasks were waiting on it (they no longer do).
    pub async fn limit_delete(&self, name: &str) -> Result<u64, Error> {
        let req = ops::LimitDelete(ops::LimitName { name: name.into() });
        Ok(self.call(&req).await?.count)
    }

    /// Creates schedule `req.name` or replaces its settings: each time its cron
    /// pattern names, one task is enqueued into its queue.
    pub async fn schedule_set(&self, req: &ops::ScheduleSet) -> Result<ScheduleInfo, Error> {
        Ok(self.call(req).await?.schedule)
    }

    /// One schedule with its next fire and what its fires did.
    pub async fn schedule_get(&self, name: &str) -> Result<ScheduleInfo, Error> {
        let req = ops::ScheduleGet(ops::ScheduleName { name: name.into() });
        Ok(self.call(&req).await?.schedule)
    }

    /// Every schedule this client may see, by name (page after page).
    pub async fn schedule_list(&self) -> Result<Vec<ScheduleInfo>, Error> {
        let mut schedules = Vec::new();
        let mut after = None;
        loop {
            let page = self
                .call(&ops::ScheduleList {
                    after,
                    limit: Some(muster_protocol::limits::MAX_PAGE),
                })
                .await?;
            schedules.extend(page.schedules);
            match page.next {
                Some(next) => after = Some(next),
                None => return Ok(schedules),
            }
        }
    }

    /// Pauses a schedule: it does not fire until resumed.
    pub async fn schedule_pause(&self, name: &str) -> Result<ScheduleInfo, Error> {
        let req = ops::SchedulePause(ops::ScheduleName { name: name.into() });
        Ok(self.call(&req).await?.schedule)
    }

    /// Resumes a schedule: it fires from its pattern's next time after now.
    pub async fn schedule_resume(&self, name: &str) -> Result<ScheduleInfo, Error> {
        let req = ops::ScheduleResume(ops::ScheduleName { name: name.into() });
        Ok(self.call(&req).await?.schedule)
    }

    /// Deletes a schedule (the tasks it enqueued stay).
    pub async fn schedule_delete(&self, name: &str) -> Result<(), Error> {
        let req = ops::ScheduleDelete(ops::ScheduleName { name: name.into() });
        self.call(&req).await?;
        Ok(())
    }

    /// Enqueues a schedule's task now, once; its fires go on as before.
    pub async fn schedule_run(&self, name: &str) -> Result<EnqueuedTask, Error> {
        let req = ops::ScheduleRun(ops::ScheduleName { name: name.into() });
        Ok(self.call(&req).await?.task)
    }

    /// Sends a leased task to dead with an error.
    pub async fn dead_letter(
        &self,
        task: &str,
        epoch: u64,
        error: &str,
    ) -> Result<SettleReply, Error> {
        self.call(&DeadLetter {
            task: task.into(),
            epoch,
            error: error.into(),
        })
        .await
    }

    /// Reads a whole task.
    pub async fn task_get(&self, task: &str) -> Result<TaskInfo, Error> {
        Ok(self.call(&TaskGet { task: task.into() }).await?.task)
    }

    /// One page of a queue's tasks in a state; pass the reply's `next` as `after` for the next page.
    pub async fn task_list(
        &self,
        queue: &str,
        state: TaskState,
        after: Option<String>,
        limit: Option<u32>,
    ) -> Result<TaskListReply, Error> {
        self.call(&TaskList {
            queue: queue.into(),
            state,
            after,
            limit,
        })
        .await
    }

    /// Searches tasks (a bounded amount of work per call); pass the reply's `next` as
    /// `search.after` to continue.
    pub async fn task_find(&self, search: &TaskFind) -> Result<TaskFindReply, Error> {
        self.call(search).await
    }

    /// Waits up to `timeout_ms` for tasks to finish.
    pub async fn wait(&self, tasks: Vec<String>, timeout_ms: u64) -> Result<WaitReply, Error> {
        self.call(&Wait {
            tasks,
            timeout_ms: Some(timeout_ms),
        })
        .await
    }

    /// Cancels a task.
    pub async fn cancel(&self, task: &str) -> Result<CancelReply, Error> {
        self.call(&Cancel {
            task: task.into(),
            if_state: None,
        })
        .await
    }

    /// Cancels a task only if it is in `state`, in one step: a task in another state
    /// is refused with `invalid_state` and left as it is. `TaskState::Suspended`
    /// rejects a task that waits for a person (an approve token may), never one that
    /// was resumed meanwhile.
    pub async fn cancel_if(&self, task: &str, state: TaskState) -> Result<CancelReply, Error> {
        self.call(&Cancel {
            task: task.into(),
            if_state: Some(state),
        })
        .await
    }

    /// Changes a ready or scheduled task: its priority, or (`run_now`) a scheduled task
    /// becomes ready now. The task as it is after the change.
    pub async fn task_update(&self, update: &ops::TaskUpdate) -> Result<TaskSummary, Error> {
        Ok(self.call(update).await?.task)
    }

    /// Opens a member session on this connection. Pushes for the session (deliveries,
    /// cancels, drain, replacement) arrive on the returned receiver, which ends when the
    /// connection does. One session per connection: a second call replaces the first.
    pub async fn open_session(
        &self,
        open: &SessionOpen,
    ) -> Result<(SessionOpenReply, mpsc::UnboundedReceiver<Push>), Error> {
        let (tx, rx) = mpsc::unbounded_channel();
        // Registered before the request leaves, so no push after the reply is missed.
        *lock(&self.inner.pending.pushes) = Some(tx);
        let reply = self.call(open).await?;
        Ok((reply, rx))
    }

    /// Watches one operator screen: the reply carries it now; later versions (each
    /// carrying `tag`) arrive on the receiver returned by [`Client::watch_pushes`].
    /// One watch per connection: this replaces the previous one.
    pub async fn watch(&self, view: View, tag: u64) -> Result<WatchReply, Error> {
        self.call(&Watch { view, tag }).await
    }

    /// The pushes of this connection's watches, in the order they arrive. Pushes of a
    /// replaced watch may still arrive after the new watch's reply: compare tags. A
    /// second call takes the stream over from the first; it ends with the connection.
    pub fn watch_pushes(&self) -> mpsc::UnboundedReceiver<WatchReply> {
        let (tx, rx) = mpsc::unbounded_channel();
        *lock(&self.inner.pending.watch) = Some(tx);
        // IMPORTANT: check `ended` after installing; the reader sets it before dropping
        // the senders. On a connection already gone, the stream ends at once.
        if self.inner.pending.ended.load(Ordering::SeqCst) {
            lock(&self.inner.pending.watch).take();
        }
        rx
    }

    /// Ends this connection's watch.
    pub async fn unwatch(&self) -> Result<(), Error> {
        self.call(&Unwatch {}).await?;
        Ok(())
    }

    /// Changes the session's labels or capacity.
    pub async fn session_update(&self, update: &SessionUpdate) -> Result<MemberInfo, Error> {
        Ok(self.call(update).await?.member)
    }

    /// Asks for tasks of these queues to be pushed while the member has room.
    pub async fn subscribe(&self, member: &str, queues: &[String]) -> Result<(), Error> {
        self.call(&Subscribe {
            member: member.into(),
            queues: queues.to_vec(),
        })
        .await?;
        Ok(())
    }

    /// Stops pushes of new tasks to the member.
    pub async fn unsubscribe(&self, member: &str) -> Result<(), Error> {
        self.call(&Unsubscribe {
            member: member.into(),
        })
        .await?;
        Ok(())
    }

    /// Every member with a session or leases.
    pub async fn member_list(&self) -> Result<Vec<MemberInfo>, Error> {
        let mut members = Vec::new();
        let mut after = None;
        loop {
            let page = self.call(&ops::MemberList { after, limit: None }).await?;
            members.extend(page.members);
            match page.next {
                Some(next) => after = Some(next),
                None => return Ok(members),
            }
        }
    }

    /// One member and the tasks it holds.
    pub async fn member_describe(&self, member: &str) -> Result<MemberDescribeReply, Error> {
        self.call(&ops::MemberDescribe(MemberName {
            member: member.into(),
        }))
        .await
    }

    /// Drains a member: it keeps its leases and gets nothing new.
    pub async fn member_drain(&self, member: &str) -> Result<MemberInfo, Error> {
        Ok(self
            .call(&ops::MemberDrain(MemberName {
                member: member.into(),
            }))
            .await?
            .member)
    }

    /// Ends a member's drain: it gets work again.
    pub async fn member_undrain(&self, member: &str) -> Result<MemberInfo, Error> {
        Ok(self
            .call(&ops::MemberUndrain(MemberName {
                member: member.into(),
            }))
            .await?
            .member)
    }

    /// Frees a member name from the principal that first used it, so that another
    /// token may use it (`invalid_state` while the member has a session or leases).
    pub async fn member_release(&self, member: &str) -> Result<(), Error> {
        self.call(&ops::MemberRelease(MemberName {
            member: member.into(),
        }))
        .await?;
        Ok(())
    }

    /// Revokes a lease: it lapses now and its holder is told.
    pub async fn lease_revoke(&self, task: &str) -> Result<SettleReply, Error> {
        self.call(&LeaseRevoke { task: task.into() }).await
    }

    /// Writes a consistent copy of the store into `dir` on the daemon's host, a new
    /// directory inside its snapshot root (a name there, or an absolute path inside it):
    /// a backup. Replies once the copy is durable, with the absolute path written.
    pub async fn admin_snapshot(&self, dir: &str) -> Result<ops::SnapshotReply, Error> {
        self.call(&ops::AdminSnapshot { dir: dir.into() }).await
    }

    /// The daemon's own counters (group commit).
    pub async fn server_stats(&self) -> Result<ops::ServerStatsReply, Error> {
        self.call(&ops::ServerStats {}).await
    }

    /// The cluster as the connected node sees it: its role, term, log and the members.
    /// A single daemon refuses with `invalid_state`.
    pub async fn cluster_status(&self) -> Result<ops::ClusterStatusReply, Error> {
        self.call(&ops::ClusterStatus {}).await
    }

    /// Adds node `node` to the cluster (on the leader): reachable by clients at `addr`
    /// and by the other nodes at `cluster_addr`, both `HOST:PORT`. It joins as a
    /// learner and, once it has caught up (the daemon waits up to `catch_up`, by
    /// default [`muster_protocol::limits::CLUSTER_CATCH_UP`]), becomes a voter unless
    /// `learner`; adding a node that is a learner already promotes it. A node that
    /// did not catch up in time stays a learner and the call fails with
    /// `invalid_state`. Returns the cluster afterwards.
    pub async fn cluster_add(
        &self,
        node: u64,
        addr: &str,
        cluster_addr: &str,
        learner: bool,
        catch_up: Option<std::time::Duration>,
    ) -> Result<ops::ClusterStatusReply, Error> {
        self.call(&ops::ClusterAdd {
            node,
            addr: addr.into(),
            cluster_addr: cluster_addr.into(),
            learner,
            catch_up_ms: catch_up.map(|d| d.as_millis() as u64),
        })
        .await
    }

    /// Removes node `node` from the cluster (on the leader); returns the cluster
    /// afterwards.
    pub async fn cluster_remove(&self, node: u64) -> Result<ops::ClusterStatusReply, Error> {
        self.call(&ops::ClusterRemove { node }).await
    }

    /// Makes dead tasks ready again with failures reset.
    pub async fn redrive(&self, selection: DeadSelection) -> Result<CountReply, Error> {
        self.call(&ops::Redrive(selection)).await
    }

    /// Removes dead tasks.
    pub async fn discard(&self, selection: DeadSelection) -> Result<CountReply, Error> {
        self.call(&ops::Discard(selection)).await
    }
}

/// The reply of a request sent with [`Client::send`], still to come.
pub struct PendingReply<T: Op> {
    rx: oneshot::Receiver<Result<Vec<u8>, Error>>,
    client: Client,
    op: PhantomData<T>,
}

impl<T: Op> PendingReply<T> {
    /// Waits for the reply.
    pub async fn reply(self) -> Result<T::Reply, Error> {
        let body = succeeded(self.rx.await.map_err(|_| self.client.closed())??)?;
        serde_json::from_slice(&body)
            .map_err(|e| Error::Protocol(format!("unreadable {} reply: {e}", T::NAME)))
    }
}

/// A request built and checked by [`Client::prepare_raw`], not sent yet.
#[derive(Debug)]
pub struct PreparedRaw {
    id: u64,
    framed: Vec<u8>,
    waits: bool,
}

/// The reply of a request sent with [`Client::send_raw`], still to come.
pub struct RawReply {
    rx: oneshot::Receiver<Result<Vec<u8>, Error>>,
    client: Client,
}

impl RawReply {
    /// Waits for the reply: the reply frame's JSON object.
    pub async fn reply(self) -> Result<String, Error> {
        let body = succeeded(self.rx.await.map_err(|_| self.client.closed())??)?;
        String::from_utf8(body).map_err(|e| Error::Protocol(format!("reply is not UTF-8: {e}")))
    }
}

/// A reply frame's body if it says `ok`; the daemon's refusal if it carries an error.
fn succeeded(body: Vec<u8>) -> Result<Vec<u8>, Error> {
    let envelope: ServerEnvelope = serde_json::from_slice(&body)
        .map_err(|e| Error::Protocol(format!("unreadable reply: {e}")))?;
    if envelope.ok == Some(true) {
        return Ok(body);
    }
    Err(match envelope.error {
        Some(error) => Error::Server(error),
        None => Error::Protocol("reply is neither ok nor an error".into()),
    })
}

/// A JSON error `message` without its closing ` at line L column C`: a position in the
/// frame built around the caller's fields, which the caller never saw.
fn without_position(message: &str) -> &str {
    match message.rsplit_once(" at line ") {
        Some((before, at))
            if at
                .split_once(" column ")
                .is_some_and(|(l, c)| [l, c].iter().all(|n| n.parse::<u64>().is_ok())) =>
        {
            before
        }
        _ => message,
    }
}

/// The request frame body `{"id":ID,"op":"OP",FIELDS}` of op `op` (checked to be one
/// the protocol knows, so its name needs no escaping) with the fields of the JSON object
/// `fields`. Whether the result is one valid request is for the decode that follows.
fn raw_request(id: u64, op: &str, fields: &str) -> Result<Vec<u8>, Error> {
    if !ops::OP_NAMES.contains(&op) {
        return Err(Error::InvalidInput(format!("unknown op {op:?}")));
    }
    let inner = fields
        .trim()
        .strip_prefix('{')
        .and_then(|f| f.strip_suffix('}'))
        .ok_or_else(|| Error::InvalidInput(format!("{op}: the fields are not a JSON object")))?
        .trim();
    let head = format!("{{\"id\":{id},\"op\":\"{op}\"");
    let mut body = Vec::with_capacity(head.len() + inner.len() + 2);
    body.extend_from_slice(head.as_bytes());
    if !inner.is_empty() {
        body.push(b',');
        body.extend_from_slice(inner.as_bytes());
    }
    body.push(b'}');
    if body.len() > muster_protocol::limits::MAX_FRAME_BYTES {
        return Err(Error::InvalidInput(format!(
            "{op}: the request is {} bytes, over the frame limit of {}",
            body.len(),
            muster_protocol::limits::MAX_FRAME_BYTES
        )));
    }
    Ok(body)
}

fn name(queue: &str) -> QueueName {
    QueueName {
        queue: queue.into(),
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding this lock leaves only a map of senders behind: keep going.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

async fn write_frames(mut send: quinn::SendStream, mut queued: mpsc::Receiver<Vec<u8>>) {
    let mut batch = WriteBatch::keeping(WRITE_CHUNK);
    while let Some(first) = queued.recv().await {
        let (bytes, _) = batch.gather(
            first,
            || queued.try_recv().ok(),
            |buf, frame| -> ControlFlow<()> {
                buf.extend_from_slice(&frame);
                ControlFlow::Continue(())
            },
        );
        if send.write_all(bytes).await.is_err() {
            return;
        }
        batch.written();
    }
    let _ = send.finish();
}

/// Bytes read from the reply stream at a time.
const READ_CHUNK: usize = 64 * 1024;

/// The next reply frame body, or why the stream ended.
async fn next_frame(
    recv: &mut quinn::RecvStream,
    frames: &mut frame::FrameReader,
    chunk: &mut [u8],
) -> Result<Vec<u8>, String> {
    loop {
        match frames.next_frame() {
            Ok(Some(body)) => return Ok(body),
            Ok(None) => {}
            Err(e) => return Err(format!("bad reply frame: {e}")),
        }
        match recv.read(chunk).await {
            Ok(Some(n)) => frames.push(&chunk[..n]),
            Ok(None) => return Err("the reply stream ended".into()),
            Err(e) => return Err(format!("reading a reply: {e}")),
        }
    }
}

/// Closes the connection once the daemon has answered nothing for too long (its host
/// is dead or unreachable), so every call in flight fails with [`Error::Closed`] and the
/// owner reconnects. Ends with the reply stream.
///
/// Two limits: a request or keep-alive sent and not even acknowledged by the daemon's
/// QUIC stack within [`connect::unanswered_limit`] (a live daemon acknowledges within a
/// round trip and 25 ms, whatever its engine is doing), and no packet at all for
/// [`connect::SERVER_SILENCE`]. Checked every [`connect::SILENCE_CHECK`].
async fn watch_silence(conn: quinn::Connection, pending: Arc<Pending>) {
    let mut silence = Silence::new(&conn.stats(), tokio::time::Instant::now());
    let mut tick = tokio::time::interval(connect::SILENCE_CHECK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = conn.closed() => return,
        }
        if pending.ended.load(Ordering::SeqCst) {
            return;
        }
        let now = tokio::time::Instant::now();
        if let Some(why) = silence.look(&conn.stats(), conn.rtt(), now) {
            *lock(&pending.silent) = Some(why);
            conn.close(SILENT_SERVER_CODE.into(), b"the daemon fell silent");
            return;
        }
    }
}

/// What [`watch_silence`] remembers between two looks.
#[derive(Debug, Clone, Copy)]
struct Silence {
    /// Datagrams received, and when that count last grew.
    heard: u64,
    heard_at: tokio::time::Instant,
    /// Frames the daemon must acknowledge (stream data, pings) sent when it last did.
    asked_at_heard: u64,
    /// The first look that saw such frames sent since the daemon was last heard.
    asked_since: Option<tokio::time::Instant>,
}

impl Silence {
    fn new(stats: &quinn::ConnectionStats, now: tokio::time::Instant) -> Silence {
        Silence {
            heard: stats.udp_rx.datagrams,
            heard_at: now,
            asked_at_heard: asked(stats),
            asked_since: None,
        }
    }

    /// Why the daemon is given up now, if it is.
    fn look(
        &mut self,
        stats: &quinn::ConnectionStats,
        rtt: std::time::Duration,
        now: tokio::time::Instant,
    ) -> Option<String> {
        if stats.udp_rx.datagrams != self.heard {
            *self = Silence::new(stats, now);
            return None;
        }
        if asked(stats) != self.asked_at_heard {
            let since = *self.asked_since.get_or_insert(now);
            let limit = connect::unanswered_limit(rtt);
            if now.duration_since(since) >= limit {
                return Some(format!(
                    "the daemon acknowledged nothing sent to it for {} ms (its host is down or unreachable)",
                    limit.as_millis()
                ));
            }
        }
        (now.duration_since(self.heard_at) >= connect::SERVER_SILENCE).then(|| {
            format!(
                "no packet from the daemon for {} s (its host is down or unreachable)",
                connect::SERVER_SILENCE.as_secs()
            )
        })
    }
}

/// Frames sent that the daemon's QUIC stack must acknowledge: every ack-eliciting kind
/// (RFC 9002 §2: all but ACK, PADDING and CONNECTION_CLOSE). Requests are STREAM frames
/// and keep-alives PINGs, but once a request goes unacknowledged QUIC's probes are
/// IMMEDIATE_ACK frames, and each of them resets the keep-alive timer: counting only
/// requests and pings missed a dead daemon for 1.4 s more (seen: 1.8–2.0 s after a
/// `kill -9` instead of 0.6).
fn asked(stats: &quinn::ConnectionStats) -> u64 {
    let f = &stats.frame_tx;
    f.stream
        + f.ping
        + f.immediate_ack
        + f.ack_frequency
        + f.crypto
        + f.data_blocked
        + f.datagram
        + u64::from(f.handshake_done)
        + f.max_data
        + f.max_stream_data
        + f.max_streams_bidi
        + f.max_streams_uni
        + f.new_connection_id
        + f.new_token
        + f.path_challenge
        + f.path_response
        + f.reset_stream
        + f.retire_connection_id
        + f.stream_data_blocked
        + f.streams_blocked_bidi
        + f.streams_blocked_uni
        + f.stop_sending
}

async fn read_replies(mut recv: quinn::RecvStream, pending: Arc<Pending>, conn: quinn::Connection) {
    let mut frames = frame::FrameReader::new();
    let mut chunk = vec![0u8; READ_CHUNK];
    let reason = loop {
        let body = match next_frame(&mut recv, &mut frames, &mut chunk).await {
            Ok(body) => body,
            Err(reason) => break reason,
        };
        let envelope = match serde_json::from_slice::<ServerEnvelope>(&body) {
            Ok(env) => env,
            Err(e) => break format!("unreadable reply: {e}"),
        };
        if let Some(kind) = envelope.push {
            let push = match Push::decode(&kind, &body) {
                Ok(push) => push,
                // A newer daemon may push kinds this client does not know: skip them.
                Err(e) => {
                    tracing::warn!("ignoring push: {e}");
                    continue;
                }
            };
            match push {
                Push::Watch(update) => {
                    if let Some(tx) = lock(&pending.watch).as_ref() {
                        // The watcher may have stopped listening; the push is then moot.
                        let _ = tx.send(*update);
                    }
                }
                push => {
                    if let Some(tx) = lock(&pending.pushes).as_ref() {
                        // The session's owner may have stopped listening; the push is then moot.
                        let _ = tx.send(push);
                    }
                }
            }
            continue;
        }
        let id = envelope.id;
        // A reply without an id answers a frame the daemon could not read: the caller of
        // that frame cannot be known, so it fails when the connection ends.
        if let Some(id) = id
            && let Some(call) = lock(&pending.calls).remove(&id)
        {
            let _ = call.slot.send(Ok(body));
            pending.answered.notify_waiters();
        }
    };
    let reason = pending.lost_reason(&conn, || reason);
    pending.ended.store(true, Ordering::SeqCst);
    for (_, call) in lock(&pending.calls).drain() {
        let _ = call.slot.send(Err(Error::Closed(reason.clone())));
    }
    pending.answered.notify_waiters();
    // Dropping the push senders ends the push streams: the connection is gone.
    lock(&pending.pushes).take();
    lock(&pending.watch).take();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn stats(received: u64, streams: u64, pings: u64) -> quinn::ConnectionStats {
        let mut s = quinn::ConnectionStats::default();
        s.udp_rx.datagrams = received;
        s.frame_tx.stream = streams;
        s.frame_tx.ping = pings;
        s
    }

    const RTT: Duration = Duration::from_millis(1);

    #[test]
    fn a_request_the_daemon_never_acknowledges_gives_the_connection_up() {
        let t0 = tokio::time::Instant::now();
        let mut silence = Silence::new(&stats(10, 3, 0), t0);
        // A request goes out; nothing comes back.
        let ms = |n| t0 + Duration::from_millis(n);
        assert_eq!(silence.look(&stats(10, 4, 0), RTT, ms(100)), None);
        assert_eq!(silence.look(&stats(10, 4, 0), RTT, ms(500)), None);
        let why = silence.look(&stats(10, 4, 0), RTT, ms(600));
        assert_eq!(
            why.as_deref(),
            Some(
                "the daemon acknowledged nothing sent to it for 500 ms (its host is down or unreachable)"
            )
        );
    }

    #[test]
    fn quics_probes_count_as_asking() {
        let t0 = tokio::time::Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut silence = Silence::new(&stats(10, 3, 0), t0);
        // A request was acknowledged at t0 but its reply never comes; QUIC probes the
        // silent daemon with IMMEDIATE_ACK frames, which also keep its PINGs from
        // being sent: those probes alone must start the limit.
        let mut probed = stats(10, 3, 0);
        probed.frame_tx.immediate_ack = 2;
        assert_eq!(silence.look(&probed, RTT, ms(100)), None);
        assert_eq!(silence.look(&probed, RTT, ms(500)), None);
        assert!(silence.look(&probed, RTT, ms(600)).is_some());
    }

    #[test]
    fn an_answered_request_and_a_quiet_connection_are_not_silence() {
        let t0 = tokio::time::Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut silence = Silence::new(&stats(10, 3, 0), t0);
        // Sent, then acknowledged: the limit starts again from what is sent next.
        assert_eq!(silence.look(&stats(10, 4, 0), RTT, ms(100)), None);
        assert_eq!(silence.look(&stats(11, 4, 0), RTT, ms(400)), None);
        assert_eq!(silence.look(&stats(11, 4, 0), RTT, ms(1_000)), None);
        // Nothing sent and nothing heard: only the 2 s limit applies.
        assert_eq!(silence.look(&stats(11, 4, 0), RTT, ms(2_300)), None);
        let why = silence.look(&stats(11, 4, 0), RTT, ms(2_400));
        assert_eq!(
            why.as_deref(),
            Some("no packet from the daemon for 2 s (its host is down or unreachable)")
        );
        // A slow network gets 8 round trips.
        let mut slow = Silence::new(&stats(0, 0, 0), t0);
        let rtt = Duration::from_millis(100);
        assert_eq!(slow.look(&stats(0, 0, 1), rtt, ms(100)), None);
        assert_eq!(slow.look(&stats(0, 0, 1), rtt, ms(800)), None);
        assert!(slow.look(&stats(0, 0, 1), rtt, ms(900)).is_some());
    }
}
