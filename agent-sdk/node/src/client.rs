//! `Client`: a connection to `musterd` and a method for every op but the member
//! session's (`Worker` holds those) and the console's `watch`.
//!
//! Each method writes its op's fields as the wire names them (PROTOCOL.md §5) and
//! sends them with `muster_sdk::Client::call_raw`, which decodes the request as the
//! daemon would before anything is sent (a bad one is `invalid_input` and sends
//! nothing); the reply's JSON is read into the records of [`crate::records`].

use muster_protocol::limits::MAX_PAGE;
use muster_protocol::model::OnTimeout;
use muster_sdk::{ConnectArgs, ConnectOptions as SdkOptions};
use napi::Result;
use napi::bindgen_prelude::Either;
use napi_derive::napi;
use serde::de::{DeserializeOwned, IgnoredAny};
use serde_json::{Map, Value, json};

use crate::errors::{PROTOCOL_ERROR, coded, invalid, to_js};
use crate::records::{
    CancelResult, Chunk, Claim, ClaimOptions, ClaimRef, ClusterAddOptions, ClusterStatus,
    ConnectOptions, CountResult, DeadSelection, EmitResult, EnqueueOptions, EnqueuedTask,
    FindOptions, FindResult, FollowResult, LimitInfo, LimitSpec, MemberDescription, MemberInfo,
    NackOptions, NewChild, NewTask, PageOptions, QueueInfo, QueuePatch, RenewOptions, RenewResult,
    ResumeResult, ServerStats, SettleResult, SnapshotResult, SpawnOptions, Spawned, Suspended,
    TaskInfo, TaskPage, TaskSummary, TaskUpdate, ThrottleOptions, WaitReply,
};
use crate::worker::SuspendOptions;

/// The options settled as the CLI settles them (`muster_sdk::ConnectArgs::resolve`):
/// what was given, else the `MUSTER_*` variables, else the context in use, else the
/// local daemon. Reads the contexts file: a bad one is a `connect_error`.
pub fn settle(options: Option<ConnectOptions>) -> Result<SdkOptions> {
    // Every client, worker and follower comes through here: the SDK's logs are on from
    // the first.
    crate::logging::install();
    let given = options.unwrap_or_default();
    let given = ConnectArgs {
        context: given.context,
        addr: given.addr,
        data: given.data.map(Into::into),
        ca: given.ca.map(Into::into),
        pin: given.pin,
        token: given.token,
        token_file: given.token_file.map(Into::into),
        server_name: given.server_name,
    };
    given.or(ConnectArgs::from_env()).resolve().map_err(to_js)
}

/// A connection to `musterd`, shared by every call made through it; calls made
/// without awaiting each other are pipelined on it.
#[napi]
pub struct Client {
    pub(crate) client: muster_sdk::Client,
}

/// Connects: to the daemon the options name, or to the leader among a cluster's nodes
/// (asking again while no node leads, up to 10 s). Also `Client.connect(options)`.
#[napi]
pub async fn connect(options: Option<ConnectOptions>) -> Result<Client> {
    let options = settle(options)?;
    let client = muster_sdk::Client::connect(options).await.map_err(to_js)?;
    Ok(Client { client })
}

/// Connects to exactly the one address given, leader or not (to read a cluster node's
/// own view, as `muster --addr NODE cluster status` does). Also
/// `Client.connectNode(options)`.
#[napi]
pub async fn connect_node(options: Option<ConnectOptions>) -> Result<Client> {
    let options = settle(options)?;
    let client = muster_sdk::Client::connect_node(options)
        .await
        .map_err(to_js)?;
    Ok(Client { client })
}

#[napi]
impl Client {
    /// The daemon's name and version, as its hello said.
    #[napi(getter)]
    pub fn server(&self) -> String {
        self.client.server().to_owned()
    }

    /// Closes the connection once every request already sent has its reply (at most
    /// 1 s), and waits (at most 1 s) until the daemon was told.
    #[napi]
    pub async fn close(&self) -> Result<()> {
        self.client.close().await;
        Ok(())
    }

    /// Enqueues one task on `queue`.
    #[napi]
    pub async fn enqueue(
        &self,
        queue: String,
        payload: Value,
        options: Option<EnqueueOptions>,
    ) -> Result<EnqueuedTask> {
        // The one way an enqueue is written and read, `enqueueEach`'s.
        let call = crate::pipeline::EnqueueCall {
            queue,
            payload: Some(payload),
            payload_json: None,
            options,
        };
        let reply = self.send_enqueue(call).await?;
        crate::pipeline::read(&reply.reply().await.map_err(to_js)?)
    }

    /// Enqueues up to `MAX_BATCH` tasks on `queue` in one atomic request: all are
    /// stored or none is. The reply lists them in the order given.
    #[napi]
    pub async fn enqueue_many(
        &self,
        queue: String,
        tasks: Vec<NewTask>,
    ) -> Result<Vec<EnqueuedTask>> {
        if tasks.is_empty() {
            return Err(invalid("enqueue_many: no task to enqueue"));
        }
        let reply: EnqueueReply = self
            .call("enqueue", json!({"queue": queue, "tasks": tasks}))
            .await?;
        if reply.tasks.len() != tasks.len() {
            return Err(coded(
                PROTOCOL_ERROR,
                format!(
                    "enqueue: {} tasks sent, {} answered",
                    tasks.len(),
                    reply.tasks.len()
                ),
            ));
        }
        Ok(reply.tasks)
    }

    /// Everything about one task.
    #[napi]
    pub async fn get(&self, task: String) -> Result<TaskInfo> {
        let reply: TaskReply = self.call("task_get", json!({"task": task})).await?;
        Ok(reply.task)
    }

    /// Waits until every one of `tasks` (ids, at most 1,000) has finished, or
    /// `timeoutMs` (at most 300,000) has passed; says which finished (whole), which
    /// are pending and which do not exist.
    #[napi]
    pub async fn wait(&self, tasks: Vec<String>, timeout_ms: i64) -> Result<WaitReply> {
        self.call("wait", json!({"tasks": tasks, "timeout_ms": timeout_ms}))
            .await
    }

    // ---- queues ---------------------------------------------------------------------

    /// Creates queue `queue` (`[a-z0-9][a-z0-9._-]{0,127}`) with the options given, the
    /// others at their defaults. Rejects with `AlreadyExists` if it exists, `BadRequest`
    /// for a bad name or option.
    #[napi]
    pub async fn queue_create(
        &self,
        queue: String,
        options: Option<QueuePatch>,
    ) -> Result<QueueInfo> {
        let options = fields(&options.unwrap_or_default())?;
        let reply: QueueReply = self
            .call("queue_create", json!({"queue": queue, "options": options}))
            .await?;
        Ok(reply.queue)
    }

    /// Every queue (the token covers) with its counts, by name, page after page.
    #[napi]
    pub async fn queue_list(&self) -> Result<Vec<QueueInfo>> {
        self.pages("queue_list", "queues").await
    }

    /// One queue with its counts.
    #[napi]
    pub async fn queue_describe(&self, queue: String) -> Result<QueueInfo> {
        let reply: QueueReply = self.call("queue_describe", json!({"queue": queue})).await?;
        Ok(reply.queue)
    }

    /// Changes the options given; the others keep their values (`groupWeights` are
    /// merged into the queue's: a weight of 1 takes a group's entry out). With none,
    /// nothing changes.
    #[napi]
    pub async fn queue_update(
        &self,
        queue: String,
        options: Option<QueuePatch>,
    ) -> Result<QueueInfo> {
        let options = fields(&options.unwrap_or_default())?;
        let reply: QueueReply = self
            .call("queue_update", json!({"queue": queue, "options": options}))
            .await?;
        Ok(reply.queue)
    }

    /// Pauses a queue: it accepts enqueues and hands nothing out.
    #[napi]
    pub async fn queue_pause(&self, queue: String) -> Result<QueueInfo> {
        let reply: QueueReply = self.call("queue_pause", json!({"queue": queue})).await?;
        Ok(reply.queue)
    }

    /// Resumes a paused queue.
    #[napi]
    pub async fn queue_resume(&self, queue: String) -> Result<QueueInfo> {
        let reply: QueueReply = self.call("queue_resume", json!({"queue": queue})).await?;
        Ok(reply.queue)
    }

    /// Removes every `ready` and `scheduled` task of a queue; resolves to how many.
    #[napi]
    pub async fn queue_purge(&self, queue: String) -> Result<i64> {
        let reply: CountReply = self.call("queue_purge", json!({"queue": queue})).await?;
        Ok(reply.count)
    }

    /// Deletes a queue and every task in it, leased ones too; resolves to how many
    /// tasks went with it.
    #[napi]
    pub async fn queue_delete(&self, queue: String) -> Result<i64> {
        let reply: CountReply = self.call("queue_delete", json!({"queue": queue})).await?;
        Ok(reply.count)
    }

    // ---- tasks ----------------------------------------------------------------------

    /// One page of a queue's tasks in `state` (`scheduled`, `ready`, `leased`,
    /// `suspended`, `done`, `dead` or `cancelled`), oldest first: pass the page's
    /// `next` as `after` for the next one.
    #[napi]
    pub async fn list(
        &self,
        queue: String,
        state: String,
        options: Option<PageOptions>,
    ) -> Result<TaskPage> {
        let mut request = fields(&options.unwrap_or_default())?;
        request.insert("queue".into(), queue.into());
        request.insert("state".into(), state.into());
        self.call("task_list", request.into()).await
    }

    /// One step of a search of the tasks by what they hold (PROTOCOL.md §5.35): every
    /// filter given must match. A step does a bounded amount of work; pass the
    /// result's `next` as `after` until it is absent to search everything.
    #[napi]
    pub async fn find(&self, options: Option<FindOptions>) -> Result<FindResult> {
        let search = fields(&options.unwrap_or_default())?;
        self.call("task_find", search.into()).await
    }

    /// Changes a task that waits (`ready` or `scheduled`): its priority, or with
    /// `runNow` a scheduled task becomes ready now (at least one: `BadRequest`
    /// otherwise). Resolves to the task afterwards; rejects with `InvalidState` for a
    /// task that is leased, suspended or finished.
    #[napi]
    pub async fn update(&self, task: String, change: Option<TaskUpdate>) -> Result<TaskSummary> {
        let mut request = fields(&change.unwrap_or_default())?;
        request.insert("task".into(), task.into());
        let reply: TaskSummaryReply = self.call("task_update", request.into()).await?;
        Ok(reply.task)
    }

    /// Cancels a task: at once if it waits (`ready`, `scheduled`, `suspended`); a
    /// leased task's holder is asked to stop and its settle ends it `cancelled`.
    /// Rejects with `InvalidState` for a task that is `done` or `dead`.
    #[napi]
    pub async fn cancel(&self, task: String) -> Result<CancelResult> {
        self.call("cancel", json!({"task": task})).await
    }

    /// Makes dead tasks of `queue` (the selection's `ids`, or `all`; neither is a
    /// `BadRequest`) ready again with their failures reset; a `dryRun` only counts and
    /// lists them. The selection is
    /// checked whole: a task named that is not dead (`InvalidState`) or not in the queue
    /// (`NotFound`) changes nothing.
    #[napi]
    pub async fn redrive(
        &self,
        queue: String,
        selection: Option<DeadSelection>,
    ) -> Result<CountResult> {
        self.dead("redrive", queue, selection).await
    }

    /// Removes dead tasks of `queue` (the selection's `ids`, or `all`), as `redrive`
    /// selects them.
    #[napi]
    pub async fn discard(
        &self,
        queue: String,
        selection: Option<DeadSelection>,
    ) -> Result<CountResult> {
        self.dead("discard", queue, selection).await
    }

    // ---- limits ---------------------------------------------------------------------

    /// Creates limit `name` or replaces all its settings (PROTOCOL.md §4.14): a budget
    /// tasks of any queue draw on (`limits` of `enqueue`). Needs an admin token over
    /// every queue (`Forbidden`); a value out of range is a `BadRequest`.
    #[napi]
    pub async fn limit_set(&self, name: String, spec: Option<LimitSpec>) -> Result<LimitInfo> {
        let mut request = fields(&spec.unwrap_or_default())?;
        request.insert("name".into(), name.into());
        let reply: LimitReply = self.call("limit_set", request.into()).await?;
        Ok(reply.limit)
    }

    /// One limit with its state now: leases held, tasks waiting, its busiest keys.
    #[napi]
    pub async fn limit_get(&self, name: String) -> Result<LimitInfo> {
        let reply: LimitReply = self.call("limit_get", json!({"name": name})).await?;
        Ok(reply.limit)
    }

    /// Every limit, by name, page after page.
    #[napi]
    pub async fn limit_list(&self) -> Result<Vec<LimitInfo>> {
        self.pages("limit_list", "limits").await
    }

    /// Deletes a limit; resolves to how many tasks were waiting on it (they no longer
    /// wait on it, and draw on it again if a limit of that name is set anew).
    #[napi]
    pub async fn limit_delete(&self, name: String) -> Result<i64> {
        let reply: CountReply = self.call("limit_delete", json!({"name": name})).await?;
        Ok(reply.count)
    }

    // ---- consuming by pull ----------------------------------------------------------

    /// Leases up to `max` ready tasks of the queues (one name or a list), waiting up to
    /// `waitMs` for the first; resolves to none when none came. Renew and settle each
    /// with its `Claim`. (An agent's way is `Worker`, which renews and settles itself.)
    #[napi]
    pub async fn claim(
        &self,
        queues: Either<String, Vec<String>>,
        options: Option<ClaimOptions>,
    ) -> Result<Vec<Claim>> {
        let queues = match queues {
            Either::A(queue) => vec![queue],
            Either::B(queues) => queues,
        };
        let mut request = fields(&options.unwrap_or_default())?;
        request.insert("queues".into(), queues.into());
        let reply: ClaimReply = self.call("claim", request.into()).await?;
        Ok(reply.tasks)
    }

    /// Extends a lease (by the queue's lease if `extendMs` is left out), storing a
    /// progress checkpoint if given. Rejects with `LeaseLost` once the claim is no
    /// longer the task's lease.
    #[napi]
    pub async fn renew(
        &self,
        claim: Either<String, ClaimRef>,
        options: Option<RenewOptions>,
    ) -> Result<RenewResult> {
        let request = leased(claim, fields(&options.unwrap_or_default())?)?;
        self.call("renew", request).await
    }

    /// Settles a leased task as done, with a result if given (any JSON value, at most
    /// 1 MiB as JSON; `null` is none).
    #[napi]
    pub async fn ack(
        &self,
        claim: Either<String, ClaimRef>,
        result: Option<Value>,
    ) -> Result<SettleResult> {
        let mut request = Map::new();
        request.insert("result".into(), result.unwrap_or(Value::Null));
        self.call("ack", leased(claim, request)?).await
    }

    /// Hands a leased task back as failed: retried after `delayMs` (the queue's backoff
    /// if left out), or `dead` once out of attempts.
    #[napi]
    pub async fn nack(
        &self,
        claim: Either<String, ClaimRef>,
        options: Option<NackOptions>,
    ) -> Result<SettleResult> {
        let request = leased(claim, fields(&options.unwrap_or_default())?)?;
        self.call("nack", request).await
    }

    /// Hands a leased task back without counting a failure: `ready` again at its place.
    #[napi]
    pub async fn release(&self, claim: Either<String, ClaimRef>) -> Result<SettleResult> {
        self.call("release", leased(claim, Map::new())?).await
    }

    /// Hands a leased task back because a provider it calls said to slow down (an HTTP
    /// 429, a quota error), spending no attempt: it is ready again at its place, and
    /// `limit` (every limit it draws on if left out) hands nothing out for its key for
    /// `retryAfterMs`; a task that draws on no limit is scheduled that far instead.
    /// Rejects with `BadRequest` for a limit the task does not draw on.
    #[napi]
    pub async fn throttled(
        &self,
        claim: Either<String, ClaimRef>,
        options: Option<ThrottleOptions>,
    ) -> Result<SettleResult> {
        let request = leased(claim, fields(&options.unwrap_or_default())?)?;
        self.call("throttled", request).await
    }

    /// Sends a leased task to `dead` at once (no failure counted), with `error` (at
    /// most 8 KiB, may be empty) as its last error.
    #[napi]
    pub async fn dead_letter(
        &self,
        claim: Either<String, ClaimRef>,
        error: String,
    ) -> Result<SettleResult> {
        let mut request = Map::new();
        request.insert("error".into(), error.into());
        self.call("dead_letter", leased(claim, request)?).await
    }

    /// Suspends a leased task instead of settling it (PROTOCOL.md §4.16): its lease
    /// ends with no failure counted and it waits, `suspended`, until a `resume` with
    /// the `resumeToken` answered (valid once), a `resumeTask`, or its timeout (7 days
    /// if left out), which does `onTimeout` (`fail` if left out). Rejects with
    /// `InvalidInput` for an `onTimeout` that is not `resume`, `fail` or `cancel`.
    #[napi]
    pub async fn suspend(
        &self,
        claim: Either<String, ClaimRef>,
        reason: String,
        options: Option<SuspendOptions>,
    ) -> Result<Suspended> {
        let options = options.unwrap_or_default();
        let mut request = Map::new();
        request.insert("reason".into(), reason.into());
        request.insert("timeout_ms".into(), options.timeout_ms.into());
        request.insert("on_timeout".into(), on_timeout(options.on_timeout)?.into());
        self.call("suspend", leased(claim, request)?).await
    }

    /// Spawns children of a leased task in one atomic change (PROTOCOL.md §4.17): each
    /// a task of its own naming the claimed one its `parent`, enqueued once per
    /// `childKey` (a key spawned before answers that child, `duplicate`). Without
    /// `wait` the lease is kept (`state` `leased`); with it the task is suspended until
    /// every child it spawned has finished (`reason`, `timeoutMs` and `onTimeout` as
    /// `suspend`'s), and its next holder finds their outcomes in `resumed.children`.
    /// Children may be none only with `wait`. A refused spawn stores nothing.
    #[napi]
    pub async fn spawn(
        &self,
        claim: Either<String, ClaimRef>,
        children: Vec<NewChild>,
        options: Option<SpawnOptions>,
    ) -> Result<Spawned> {
        let options = options.unwrap_or_default();
        let children = children
            .iter()
            .map(NewChild::to_wire)
            .collect::<Result<Vec<_>>>()?;
        let mut request = Map::new();
        request.insert("children".into(), children.into());
        if options.wait == Some(true) {
            let wait = json!({
                "reason": options.reason,
                "timeout_ms": options.timeout_ms,
                "on_timeout": on_timeout(options.on_timeout)?,
            });
            request.insert("wait".into(), without_nulls(wait));
        } else if options.reason.is_some()
            || options.timeout_ms.is_some()
            || options.on_timeout.is_some()
        {
            return Err(invalid(
                "reason, timeoutMs and onTimeout are a wait's: give them with wait: true",
            ));
        }
        self.call("spawn", leased(claim, request)?).await
    }

    /// Appends chunks to a leased task's live output (PROTOCOL.md §4.18): each a
    /// string (a text chunk) or a `Chunk`; 1 to 1,000 of them, each at most 64 KiB,
    /// together at most 512 KiB as stored. `at` is the number the first chunk is to
    /// get: the claim's `output`, then each result's `next`. Chunks numbered before the
    /// task's next number were stored by an earlier try of this emit and are not stored
    /// again (`repeated`), so an emit may be sent again as it was. Wait the result's
    /// `waitMs` before the next emit. An emit does not renew the lease.
    #[napi]
    pub async fn emit(
        &self,
        claim: Either<String, ClaimRef>,
        at: i64,
        chunks: Vec<Either<String, Chunk>>,
    ) -> Result<EmitResult> {
        let chunks = chunks
            .into_iter()
            .enumerate()
            .map(|(i, chunk)| wire_chunk(chunk).map_err(|e| invalid(format!("chunk {i}: {e}"))))
            .collect::<Result<Vec<_>>>()?;
        let mut request = Map::new();
        request.insert("at".into(), at.into());
        request.insert("chunks".into(), chunks.into());
        self.call("emit", leased(claim, request)?).await
    }

    /// Reads one batch of a task's live output from chunk `from` (0 if left out): what
    /// is kept from there at once (at most 256 KiB; at least one chunk when any is
    /// kept), else, while the task is not finished, waits up to `timeoutMs` (at most
    /// 300,000; not at all if left out) for the next chunks or the task's end. Ask
    /// again from the result's `next` until its `end`.
    #[napi]
    pub async fn follow(
        &self,
        task: String,
        from: Option<i64>,
        timeout_ms: Option<i64>,
    ) -> Result<FollowResult> {
        self.call(
            "follow",
            json!({"task": task, "from": from, "timeout_ms": timeout_ms}),
        )
        .await
    }

    /// Resumes the suspension `token` names: the task is ready again at its place and
    /// its next holder sees `data` (any JSON value, at most 64 KiB as JSON). Rejects
    /// with `StaleToken` for a token that was spent, is an earlier suspension's, or names
    /// a task no longer suspended.
    #[napi]
    pub async fn resume(&self, token: String, data: Option<Value>) -> Result<ResumeResult> {
        self.call("resume", json!({"token": token, "data": data}))
            .await
    }

    /// Resumes suspended task `task` by its id (approve and admin tokens), as `resume`
    /// does. Rejects with `InvalidState` if it is not suspended.
    #[napi]
    pub async fn resume_task(&self, task: String, data: Option<Value>) -> Result<ResumeResult> {
        self.call("resume", json!({"task": task, "data": data}))
            .await
    }

    // ---- members and the daemon -----------------------------------------------------

    /// Every member the daemon knows (a session, leases or a drain), by name, page
    /// after page.
    #[napi]
    pub async fn member_list(&self) -> Result<Vec<MemberInfo>> {
        self.pages("member_list", "members").await
    }

    /// One member and the tasks it holds.
    #[napi]
    pub async fn member_describe(&self, member: String) -> Result<MemberDescription> {
        self.call("member_describe", json!({"member": member}))
            .await
    }

    /// Drains a member: it keeps its leases, gets nothing new, and its worker drains.
    #[napi]
    pub async fn member_drain(&self, member: String) -> Result<MemberInfo> {
        let reply: MemberReply = self.call("member_drain", json!({"member": member})).await?;
        Ok(reply.member)
    }

    /// Ends a member's drain: it gets work again.
    #[napi]
    pub async fn member_undrain(&self, member: String) -> Result<MemberInfo> {
        let reply: MemberReply = self
            .call("member_undrain", json!({"member": member}))
            .await?;
        Ok(reply.member)
    }

    /// Frees a member name from the token that first used it, so another token may use
    /// it. Rejects with `InvalidState` while the member holds leases, `NotFound` if no
    /// token holds the name (always without tokens).
    #[napi]
    pub async fn member_release(&self, member: String) -> Result<()> {
        let _: IgnoredAny = self
            .call("member_release", json!({"member": member}))
            .await?;
        Ok(())
    }

    /// Revokes a task's lease: it lapses now (one failure) and its holder is told to
    /// stop. Rejects with `InvalidState` for a task that is not leased.
    #[napi]
    pub async fn lease_revoke(&self, task: String) -> Result<SettleResult> {
        self.call("lease_revoke", json!({"task": task})).await
    }

    /// The daemon's own counters.
    #[napi]
    pub async fn server_stats(&self) -> Result<ServerStats> {
        self.call("server_stats", json!({})).await
    }

    /// Writes a consistent copy of the whole store into `dir`, a new directory **on the
    /// daemon's host** inside its snapshot root (a name there, or an absolute path
    /// inside it): a backup. Resolves once the copy is durable.
    #[napi]
    pub async fn admin_snapshot(&self, dir: String) -> Result<SnapshotResult> {
        self.call("admin_snapshot", json!({"dir": dir})).await
    }

    /// The cluster as the connected node sees it (`connectNode` for one node's own
    /// view). Rejects with `InvalidState` from a single daemon.
    #[napi]
    pub async fn cluster_status(&self) -> Result<ClusterStatus> {
        self.call("cluster_status", json!({})).await
    }

    /// Adds node `node` to the cluster, on the leader: clients reach it at `addr`, the
    /// other nodes at `clusterAddr`. It joins as a learner and is made a voter once it
    /// caught up (within `catchUpMs`), unless `learner`; adding a learner again
    /// promotes it. Resolves to the cluster afterwards. Rejects with `InvalidState`
    /// when it did not catch up in time (it stays a learner), `AlreadyExists` for a
    /// voter, `NotLeader` on a node that does not lead.
    #[napi]
    pub async fn cluster_add(
        &self,
        node: i64,
        addr: String,
        cluster_addr: String,
        options: Option<ClusterAddOptions>,
    ) -> Result<ClusterStatus> {
        let mut request = fields(&options.unwrap_or_default())?;
        request.insert("node".into(), node.into());
        request.insert("addr".into(), addr.into());
        request.insert("cluster_addr".into(), cluster_addr.into());
        self.call("cluster_add", request.into()).await
    }

    /// Removes node `node` from the cluster, on the leader (stop its process
    /// afterwards). Resolves to the cluster afterwards. Rejects with `NotFound` for a
    /// node that is no member, `NotLeader` on a node that does not lead.
    #[napi]
    pub async fn cluster_remove(&self, node: i64) -> Result<ClusterStatus> {
        self.call("cluster_remove", json!({"node": node})).await
    }
}

impl Client {
    /// `redrive` or `discard` (`op`) of `queue`'s dead tasks the selection names.
    async fn dead(
        &self,
        op: &str,
        queue: String,
        selection: Option<DeadSelection>,
    ) -> Result<CountResult> {
        let mut request = fields(&selection.unwrap_or_default())?;
        request.insert("queue".into(), queue.into());
        self.call(op, request.into()).await
    }

    /// Sends `op` with `fields` (those `null` left out: absent) and reads its reply.
    async fn call<R: DeserializeOwned>(&self, op: &str, fields: Value) -> Result<R> {
        let fields = without_nulls(fields);
        let reply = self
            .client
            .call_raw(op, &fields.to_string())
            .await
            .map_err(to_js)?;
        crate::records::read_js(&reply).map_err(|e| {
            coded(
                PROTOCOL_ERROR,
                format!("{op}: the reply does not read: {e}"),
            )
        })
    }

    /// Every item (under `items`) of a paged listing, page after page, each page's
    /// `next` the following one's `after`.
    async fn pages<T: DeserializeOwned>(&self, op: &str, items: &str) -> Result<Vec<T>> {
        let mut found = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let mut page: Map<String, Value> = self
                .call(op, json!({"after": after, "limit": MAX_PAGE}))
                .await?;
            let listed: Vec<T> = serde_json::from_value(page.remove(items).unwrap_or_default())
                .map_err(|e| {
                    coded(
                        PROTOCOL_ERROR,
                        format!("{op}: the {items} do not read: {e}"),
                    )
                })?;
            found.extend(listed);
            match page.remove("next") {
                Some(Value::String(next)) => after = Some(next),
                _ => return Ok(found),
            }
        }
    }
}

/// `fields` without its `null` members (absent on the wire: some fields refuse `null`).
fn without_nulls(fields: Value) -> Value {
    match fields {
        Value::Object(mut map) => {
            map.retain(|_, value| !value.is_null());
            Value::Object(map)
        }
        other => other,
    }
}

/// The request of an op on a lease: `fields` with the claim's `task` and `epoch`. A
/// claim is a `ClaimRef` (a `Claim` is one) or a claim string `ID.EPOCH`.
fn leased(claim: Either<String, ClaimRef>, mut fields: Map<String, Value>) -> Result<Value> {
    let (task, epoch) = match claim {
        Either::A(text) => match text.rsplit_once('.') {
            Some((task, epoch))
                if !task.is_empty()
                    && !epoch.is_empty()
                    && epoch.bytes().all(|b| b.is_ascii_digit()) =>
            {
                let epoch = epoch
                    .parse::<i64>()
                    .map_err(|_| invalid(format!("{text:?} is not a claim string ID.EPOCH")))?;
                (task.to_owned(), epoch)
            }
            _ => return Err(invalid(format!("{text:?} is not a claim string ID.EPOCH"))),
        },
        Either::B(claim) => (claim.id, claim.epoch),
    };
    fields.insert("task".into(), task.into());
    fields.insert("epoch".into(), epoch.into());
    Ok(fields.into())
}

/// A chunk to emit as the wire writes it: a string is a text chunk; a `Chunk` holds
/// exactly one of `text` and `json` (a `json` of `null` is none, as on the wire).
fn wire_chunk(chunk: Either<String, Chunk>) -> std::result::Result<Value, &'static str> {
    let (text, json) = match chunk {
        Either::A(text) => (Some(text), None),
        Either::B(Chunk { text, json }) => (text, json.filter(|json| !json.is_null())),
    };
    match (text, json) {
        (Some(text), None) => Ok(json!({"text": text})),
        (None, Some(json)) => Ok(json!({"json": json})),
        _ => Err("a chunk holds exactly one of text and json (not null)"),
    }
}

/// A suspension's `onTimeout`, checked as the worker's `Task` checks it.
fn on_timeout(value: Option<String>) -> Result<Option<String>> {
    match value {
        Some(o) if OnTimeout::parse(&o).is_none() => Err(invalid(format!(
            "onTimeout {o:?} is not resume, fail or cancel"
        ))),
        other => Ok(other),
    }
}

/// A request record's fields as a JSON object.
pub(crate) fn fields(record: &impl serde::Serialize) -> Result<serde_json::Map<String, Value>> {
    match serde_json::to_value(record) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(other) => Err(invalid(format!("not an object of fields: {other}"))),
        Err(e) => Err(invalid(e)),
    }
}

/// The one item of a reply that answers one request.
pub(crate) fn one<T>(items: Vec<T>, op: &str) -> Result<T> {
    let count = items.len();
    let mut items = items.into_iter();
    match (items.next(), items.next()) {
        (Some(item), None) => Ok(item),
        _ => Err(coded(
            PROTOCOL_ERROR,
            format!("{op}: one item asked for, {count} answered"),
        )),
    }
}

#[derive(serde::Deserialize)]
pub(crate) struct EnqueueReply {
    pub(crate) tasks: Vec<EnqueuedTask>,
}

#[derive(serde::Deserialize)]
struct TaskReply {
    task: TaskInfo,
}

#[derive(serde::Deserialize)]
struct TaskSummaryReply {
    task: TaskSummary,
}

#[derive(serde::Deserialize)]
struct QueueReply {
    queue: QueueInfo,
}

#[derive(serde::Deserialize)]
struct CountReply {
    count: i64,
}

#[derive(serde::Deserialize)]
struct LimitReply {
    limit: LimitInfo,
}

#[derive(serde::Deserialize)]
struct ClaimReply {
    tasks: Vec<Claim>,
}

#[derive(serde::Deserialize)]
struct MemberReply {
    member: MemberInfo,
}
