//! `Client`: a connection to `musterd` and a method for every op but the member
//! session's (`Worker` holds those) and the console's `watch`.
//!
//! Each method writes its op's fields as the wire names them (PROTOCOL.md §5) and
//! sends them with `muster_sdk::Client::call_raw`, which decodes the request as the
//! daemon would before anything is sent (a bad one is `invalid_input` and sends
//! nothing); the reply's JSON is read into the records of [`crate::records`].

use muster_sdk::{ConnectArgs, ConnectOptions as SdkOptions};
use napi::Result;
use napi_derive::napi;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::errors::{PROTOCOL_ERROR, coded, invalid, to_js};
use crate::records::{ConnectOptions, EnqueueOptions, EnqueuedTask, NewTask, TaskInfo, WaitReply};

/// The options settled as the CLI settles them (`muster_sdk::ConnectArgs::resolve`):
/// what was given, else the `MUSTER_*` variables, else the context in use, else the
/// local daemon. Reads the contexts file: a bad one is a `connect_error`.
pub fn settle(options: Option<ConnectOptions>) -> Result<SdkOptions> {
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
    client: muster_sdk::Client,
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
        let mut task = fields(&options.unwrap_or_default())?;
        task.insert("payload".into(), payload);
        let reply: EnqueueReply = self
            .call("enqueue", json!({"queue": queue, "tasks": [task]}))
            .await?;
        one(reply.tasks, "enqueue")
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
}

impl Client {
    /// Sends `op` with `fields` and reads its reply.
    async fn call<R: DeserializeOwned>(&self, op: &str, fields: Value) -> Result<R> {
        let reply = self
            .client
            .call_raw(op, &fields.to_string())
            .await
            .map_err(to_js)?;
        serde_json::from_str(&reply)
            .map_err(|e| coded(PROTOCOL_ERROR, format!("{op}: the reply does not read: {e}")))
    }
}

/// A request record's fields as a JSON object.
fn fields(record: &impl serde::Serialize) -> Result<serde_json::Map<String, Value>> {
    match serde_json::to_value(record) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(other) => Err(invalid(format!("not an object of fields: {other}"))),
        Err(e) => Err(invalid(e)),
    }
}

/// The one item of a reply that answers one request.
fn one<T>(items: Vec<T>, op: &str) -> Result<T> {
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
struct EnqueueReply {
    tasks: Vec<EnqueuedTask>,
}

#[derive(serde::Deserialize)]
struct TaskReply {
    task: TaskInfo,
}
