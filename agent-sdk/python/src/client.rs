//! The native `Client`: the ops of `muster_sdk::Client` as methods returning asyncio
//! futures: all but the member session's (`session_open`, `session_update`,
//! `subscribe`, `unsubscribe`: the native `Worker` holds the session) and `watch` /
//! `unwatch` (a stream of pushes, for consoles).
//!
//! Each method takes the running loop's bridge (`done`, a [`Loop`]) first: the call
//! runs on the extension's runtime and the loop resolves its future (see `bridge`), so
//! no method holds the GIL while it waits. Every op goes through one code path,
//! [`Client::run`] ([`Client::json`] for those answering a record): a method only
//! checks its arguments and names the SDK call. Arguments arrive as plain values the Python
//! layer prepared (durations in milliseconds, options and tasks as JSON text); records
//! go back as JSON text for the Python layer to turn into dataclasses, so the wire
//! types are decoded in one place (serde, here) and never re-implemented in Python.

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use muster_protocol::limits::MAX_BATCH;
use muster_protocol::model::{NewTask, QueuePatch, TaskState};
use muster_protocol::ops::{Claim, DeadSelection, TaskFind, TaskUpdate};
use muster_sdk::{ConnectArgs, ConnectOptions};
use pyo3::IntoPyObjectExt;
use pyo3::prelude::*;
use serde::Serialize;

use crate::bridge::{Loop, Reply};
use crate::errors::invalid;

/// A connection to `musterd`, shared by every call made through it.
#[pyclass(frozen, module = "muster._native")]
pub struct Client {
    client: muster_sdk::Client,
}

/// Where to connect and how to trust the daemon, exactly as the CLI settles it
/// (`muster_sdk::ConnectArgs::resolve`): what the caller gave, else the `MUSTER_*`
/// variables (each argument over its variable, as a flag over its variable in the
/// CLI), else the context in use (`context`, `MUSTER_CONTEXT`, the current one in
/// `contexts.toml`), else the local daemon. Reads the contexts file.
#[expect(
    clippy::too_many_arguments,
    reason = "the connection options, as Python passes them"
)]
pub fn options(
    addr: Option<String>,
    data: Option<String>,
    ca: Option<String>,
    pin: Option<String>,
    token: Option<String>,
    server_name: Option<String>,
    token_file: Option<String>,
    context: Option<String>,
) -> PyResult<ConnectOptions> {
    let given = ConnectArgs {
        context,
        addr,
        data: data.map(PathBuf::from),
        ca: ca.map(PathBuf::from),
        pin,
        token,
        token_file: token_file.map(PathBuf::from),
        server_name,
    };
    given
        .or(ConnectArgs::from_env())
        .resolve()
        .map_err(crate::errors::to_py)
}

/// Connects; resolves to a [`Client`]. With `node`, to exactly the one address given,
/// leader or not (`muster_sdk::Client::connect_node`), else to the leader among them.
#[pyfunction]
#[pyo3(signature = (done, addr=None, data=None, ca=None, pin=None, token=None, server_name=None, token_file=None, context=None, node=false))]
#[expect(
    clippy::too_many_arguments,
    reason = "the connection options, as Python passes them"
)]
pub fn connect<'py>(
    py: Python<'py>,
    done: &Bound<'py, Loop>,
    addr: Option<String>,
    data: Option<String>,
    ca: Option<String>,
    pin: Option<String>,
    token: Option<String>,
    server_name: Option<String>,
    token_file: Option<String>,
    context: Option<String>,
    node: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let options = options(addr, data, ca, pin, token, server_name, token_file, context)?;
    done.get().spawn(py, async move {
        let client = if node {
            muster_sdk::Client::connect_node(options).await?
        } else {
            muster_sdk::Client::connect(options).await?
        };
        Ok(Client { client })
    })
}

impl From<Client> for Reply {
    fn from(client: Client) -> Reply {
        Reply::Object(Box::new(move |py| client.into_bound_py_any(py)))
    }
}

impl Client {
    /// The one code path of every op: `op` runs on the extension's runtime with a
    /// clone of the SDK client, and what it returns resolves the loop's future.
    fn run<'py, T, F>(
        &self,
        py: Python<'py>,
        done: &Bound<'py, Loop>,
        op: impl FnOnce(muster_sdk::Client) -> F,
    ) -> PyResult<Bound<'py, PyAny>>
    where
        T: Into<Reply>,
        F: Future<Output = Result<T, muster_sdk::Error>> + Send + 'static,
    {
        done.get().spawn(py, op(self.client.clone()))
    }

    /// [`Client::run`] for an op that answers a record: it resolves to the record as
    /// JSON text, for the Python layer's dataclasses.
    fn json<'py, T, F>(
        &self,
        py: Python<'py>,
        done: &Bound<'py, Loop>,
        op: impl FnOnce(muster_sdk::Client) -> F,
    ) -> PyResult<Bound<'py, PyAny>>
    where
        T: Serialize,
        F: Future<Output = Result<T, muster_sdk::Error>> + Send + 'static,
    {
        let call = op(self.client.clone());
        done.get().spawn(py, async move { text(&call.await?) })
    }
}

#[pymethods]
impl Client {
    /// Closes the connection, waiting (at most a second) until the daemon was told.
    fn close<'py>(&self, py: Python<'py>, done: &Bound<'py, Loop>) -> PyResult<Bound<'py, PyAny>> {
        self.run(py, done, |client| async move {
            client.close().await;
            Ok(())
        })
    }

    /// Creates a queue; `options` is a QueuePatch as JSON text. Resolves to QueueInfo JSON.
    fn queue_create<'py>(
        &self,
        py: Python<'py>,
        done: &Bound<'py, Loop>,
        queue: String,
        options: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        let patch = patch(options)?;
        self.json(py, done, |client| async move {
            client.queue_create(&queue, patch).await
        })
    }

    /// Every queue; resolves to a JSON list of QueueInfo.
    fn queue_list<'py>(
        &self,
        py: Python<'py>,
        done: &Bound<'py, Loop>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.json(py, done, |client| async move { client.queue_list().await })
    }

    /// One queue; resolves to QueueInfo JSON.
    fn queue_describe<'py>(
        &self,
        py: Python<'py>,
        done: &Bound<'py, Loop>,
        queue: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.json(py, done, |client| async move {
            client.queue_describe(&queue).await
        })
    }

    /// Changes a queue's options (a QueuePatch as JSON text); resolves to QueueInfo JSON.
    fn queue_update<'py>(
        &self,
        py: Python<'py>,
        done: &Bound<'py, Loop>,
        queue: String,
        options: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        let patch = patch(options)?;
        self.json(py, done, |client| async move {
            client.queue_update(&queue, patch).await
        })
    }

    /// Pauses a queue; resolves to QueueInfo JSON.
    fn queue_pause<'py>(
        &self,
        py: Python<'py>,
        done: &Bound<'py, Loop>,
        queue: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.json(py, done, |client| async move {
            client.queue_pause(&queue).await
        })
    }

    /// Resumes a queue; resolves to QueueInfo JSON.
    fn queue_resume<'py>(
        &self,
        py: Python<'py>,
        done: &Bound<'py, Loop>,
        queue: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.json(py, done, |client| async move {
            client.queue_resume(&queue).await
        })
    }

    /// Removes a queue's ready and scheduled tasks; resolves to how many.
    fn queue_purge<'py>(
        &self,
        py: Python<'py>,
        done: &Bound<'py, Loop>,
        queue: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.run(py, done, |client| async move {
            client.queue_purge(&queue).await
        })
    }

    /// Deletes a queue and its tasks; resolves to how many tasks went with it.
    fn queue_delete<'py>(
        &self,
        py: Python<'py>,
        done: &Bound<'py, Loop>,
        queue: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.run(py, done, |client| async move {
            client.queue_delete(&queue).await
        })
    }

    /// Enqueues tasks given as a JSON list of NewTask, in batches of `MAX_BATCH` sent
    /// back to back (each batch atomic, the order kept); resolves to their ids.
    fn enqueue<'py>(
        &self,
        py: Python<'py>,
        done: &Bound<'py, Loop>,
        queue: String,
        tasks: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        let mut tasks: Vec<NewTask> =
            serde_json::from_str(tasks).map_err(|e| invalid(format!("tasks to enqueue: {e}")))?;
        if tasks.is_empty() {
            return Err(invalid("nothing to enqueue"));
        }
        self.run(py, done, |client| async move {
            let mut pending = Vec::with_capacity(tasks.len().div_ceil(MAX_BATCH));
            while !tasks.is_empty() {
                let rest = tasks.split_off(tasks.len().min(MAX_BATCH));
                let batch = std::mem::replace(&mut tasks, rest);
                pending.push(client.send_enqueue(&queue, batch).await?);
            }
            let mut ids = Vec::new();
            for reply in pending {
                ids.extend(reply.reply().await?.tasks.into_iter().map(|t| t.id));
            }
            Ok(ids)
        })
    }

    /// One whole task; resolves to TaskInfo JSON.
    fn task_get<'py>(
        &self,
        py: Python<'py>,
        done: &Bound<'py, Loop>,
        task: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.json(
            py,
            done,
            |client| async move { client.task_get(&task).await },
        )
    }

    /// One page of a queue's tasks in a state; resolves to `{"tasks": [...], "next": ...}`.
    #[pyo3(signature = (done, queue, state, after=None, limit=None))]
    fn task_list<'py>(
        &self,
        py: Python<'py>,
        done: &Bound<'py, Loop>,
        queue: String,
        state: &str,
        after: Option<String>,
        limit: Option<u32>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let state = TaskState::parse(state).ok_or_else(|| {
            invalid(format!(
                "{state:?} is not a task state (scheduled, ready, leased, done, dead, cancelled)"
            ))
        })?;
        self.json(py, done, |client| async move {
            client.task_list(&queue, state, after, limit).await
        })
    }

    /// Searches tasks; `search` is a TaskFind request as JSON text. Resolves to
    /// TaskFindReply JSON.
    fn task_find<'py>(
        &self,
        py: Python<'py>,
        done: &Bound<'py, Loop>,
        search: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        let search: TaskFind =
            serde_json::from_str(search).map_err(|e| invalid(format!("task search: {e}")))?;
        self.json(
            py,
            done,
            |client| async move { client.task_find(&search).await },
        )
    }

    /// Changes a ready or scheduled task's priority, or runs a scheduled one now;
    /// resolves to TaskSummary JSON.
    #[pyo3(signature = (done, task, priority=None, run_now=false))]
    fn task_update<'py>(
        &self,
        py: Python<'py>,
        done: &Bound<'py, Loop>,
        task: String,
        priority: Option<u8>,
        run_now: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let update = TaskUpdate {
            task,
            priority,
            run_now,
        };
        self.json(py, done, |client| async move {
            client.task_update(&update).await
        })
    }

    /// Waits up to `timeout_ms` for tasks to finish; resolves to WaitReply JSON.
    fn wait<'py>(
        &self,
        py: Python<'py>,
        done: &Bound<'py, Loop>,
        tasks: Vec<String>,
        timeout_ms: u64,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.json(py, done, |client| async move {
            client.wait(tasks, timeout_ms).await
        })
    }

    /// Cancels a task; resolves to CancelReply JSON.
    fn cancel<'py>(
        &self,
        py: Python<'py>,
        done: &Bound<'py, Loop>,
        task: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.json(py, done, |client| async move { client.cancel(&task).await })
    }

    /// Leases ready tasks; resolves to a JSON list of Delivery.
    #[pyo3(signature = (done, queues, max=None, wait_ms=None, lease_ms=None, member=None, labels=Vec::new()))]
    #[expect(
        clippy::too_many_arguments,
        reason = "one argument per field of the claim op, as Python passes them"
    )]
    fn claim<'py>(
        &self,
        py: Python<'py>,
        done: &Bound<'py, Loop>,
        queues: Vec<String>,
        max: Option<u32>,
        wait_ms: Option<u64>,
        lease_ms: Option<u64>,
        member: Option<String>,
        labels: Vec<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let claim = Claim {
            queues,
            max,
            wait_ms,
            lease_ms,
            member,
            labels,
        };
        self.json(py, done, |client| async move { client.claim(&claim).await })
    }

    /// Extends a lease, storing a checkpoint (JSON text); resolves to RenewReply JSON.
    #[pyo3(signature = (done, task, epoch, extend_ms=None, progress=None))]
    fn renew<'py>(
        &self,
        py: Python<'py>,
        done: &Bound<'py, Loop>,
        task: String,
        epoch: u64,
        extend_ms: Option<u64>,
        progress: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let progress = progress.map(raw).transpose()?;
        self.json(py, done, |client| async move {
            client.renew(&task, epoch, extend_ms, progress).await
        })
    }

    /// Settles a leased task as done, with a result (JSON text); resolves to SettleReply JSON.
    #[pyo3(signature = (done, task, epoch, result=None))]
    fn ack<'py>(
        &self,
        py: Python<'py>,
        done: &Bound<'py, Loop>,
        task: String,
        epoch: u64,
        result: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let result = result.map(raw).transpose()?;
        self.json(py, done, |client| async move {
            client.ack(&task, epoch, result).await
        })
    }

    /// Hands a leased task back as failed; resolves to SettleReply JSON.
    #[pyo3(signature = (done, task, epoch, delay_ms=None, error=None))]
    fn nack<'py>(
        &self,
        py: Python<'py>,
        done: &Bound<'py, Loop>,
        task: String,
        epoch: u64,
        delay_ms: Option<u64>,
        error: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.json(py, done, |client| async move {
            client.nack(&task, epoch, delay_ms, error).await
        })
    }

    /// Hands a leased task back without a failure; resolves to SettleReply JSON.
    fn release<'py>(
        &self,
        py: Python<'py>,
        done: &Bound<'py, Loop>,
        task: String,
        epoch: u64,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.json(py, done, |client| async move {
            client.release(&task, epoch).await
        })
    }

    /// Sends a leased task to dead; resolves to SettleReply JSON.
    fn dead_letter<'py>(
        &self,
        py: Python<'py>,
        done: &Bound<'py, Loop>,
        task: String,
        epoch: u64,
        error: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.json(py, done, |client| async move {
            client.dead_letter(&task, epoch, &error).await
        })
    }

    /// Makes dead tasks ready again; resolves to CountReply JSON.
    fn redrive<'py>(
        &self,
        py: Python<'py>,
        done: &Bound<'py, Loop>,
        queue: String,
        ids: Vec<String>,
        all: bool,
        dry_run: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let selection = DeadSelection {
            queue,
            ids,
            all,
            dry_run,
        };
        self.json(
            py,
            done,
            |client| async move { client.redrive(selection).await },
        )
    }

    /// Removes dead tasks; resolves to CountReply JSON.
    fn discard<'py>(
        &self,
        py: Python<'py>,
        done: &Bound<'py, Loop>,
        queue: String,
        ids: Vec<String>,
        all: bool,
        dry_run: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let selection = DeadSelection {
            queue,
            ids,
            all,
            dry_run,
        };
        self.json(
            py,
            done,
            |client| async move { client.discard(selection).await },
        )
    }

    /// Every member; resolves to a JSON list of MemberInfo.
    fn member_list<'py>(
        &self,
        py: Python<'py>,
        done: &Bound<'py, Loop>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.json(py, done, |client| async move { client.member_list().await })
    }

    /// One member and its leases; resolves to MemberDescribeReply JSON.
    fn member_describe<'py>(
        &self,
        py: Python<'py>,
        done: &Bound<'py, Loop>,
        member: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.json(py, done, |client| async move {
            client.member_describe(&member).await
        })
    }

    /// Drains a member; resolves to MemberInfo JSON.
    fn member_drain<'py>(
        &self,
        py: Python<'py>,
        done: &Bound<'py, Loop>,
        member: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.json(py, done, |client| async move {
            client.member_drain(&member).await
        })
    }

    /// Ends a member's drain; resolves to MemberInfo JSON.
    fn member_undrain<'py>(
        &self,
        py: Python<'py>,
        done: &Bound<'py, Loop>,
        member: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.json(py, done, |client| async move {
            client.member_undrain(&member).await
        })
    }

    /// Frees a member name from the principal that first used it; resolves to `None`.
    fn member_release<'py>(
        &self,
        py: Python<'py>,
        done: &Bound<'py, Loop>,
        member: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.run(py, done, |client| async move {
            client.member_release(&member).await
        })
    }

    /// Writes a copy of the store into `dir` on the daemon's host; resolves to
    /// SnapshotReply JSON.
    fn admin_snapshot<'py>(
        &self,
        py: Python<'py>,
        done: &Bound<'py, Loop>,
        dir: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.json(py, done, |client| async move {
            client.admin_snapshot(&dir).await
        })
    }

    /// The cluster as the connected node sees it; resolves to ClusterStatusReply JSON.
    fn cluster_status<'py>(
        &self,
        py: Python<'py>,
        done: &Bound<'py, Loop>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.json(
            py,
            done,
            |client| async move { client.cluster_status().await },
        )
    }

    /// Adds a node to the cluster (a learner, then a voter once it caught up, unless
    /// `learner`); resolves to ClusterStatusReply JSON.
    #[pyo3(signature = (done, node, addr, cluster_addr, learner=false, catch_up_ms=None))]
    #[expect(
        clippy::too_many_arguments,
        reason = "one argument per field of the cluster_add op, as Python passes them"
    )]
    fn cluster_add<'py>(
        &self,
        py: Python<'py>,
        done: &Bound<'py, Loop>,
        node: u64,
        addr: String,
        cluster_addr: String,
        learner: bool,
        catch_up_ms: Option<u64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let catch_up = catch_up_ms.map(Duration::from_millis);
        self.json(py, done, |client| async move {
            client
                .cluster_add(node, &addr, &cluster_addr, learner, catch_up)
                .await
        })
    }

    /// Removes a node from the cluster; resolves to ClusterStatusReply JSON.
    fn cluster_remove<'py>(
        &self,
        py: Python<'py>,
        done: &Bound<'py, Loop>,
        node: u64,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.json(py, done, |client| async move {
            client.cluster_remove(node).await
        })
    }

    /// Revokes a task's lease; resolves to SettleReply JSON.
    fn lease_revoke<'py>(
        &self,
        py: Python<'py>,
        done: &Bound<'py, Loop>,
        task: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.json(py, done, |client| async move {
            client.lease_revoke(&task).await
        })
    }

    /// The daemon's own counters; resolves to ServerStatsReply JSON.
    fn server_stats<'py>(
        &self,
        py: Python<'py>,
        done: &Bound<'py, Loop>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.json(
            py,
            done,
            |client| async move { client.server_stats().await },
        )
    }
}

/// A reply as JSON text, for the Python layer's records.
fn text<T: Serialize>(value: &T) -> Result<String, muster_sdk::Error> {
    serde_json::to_string(value).map_err(|e| muster_sdk::Error::Protocol(e.to_string()))
}

fn patch(options: &str) -> PyResult<QueuePatch> {
    serde_json::from_str(options).map_err(|e| invalid(format!("queue options: {e}")))
}

/// JSON text checked to be JSON.
pub fn raw(text: String) -> PyResult<muster_sdk::RawJson> {
    serde_json::value::RawValue::from_string(text)
        .map_err(|e| invalid(format!("not valid JSON: {e}")))
}
