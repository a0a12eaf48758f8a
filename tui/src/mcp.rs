//! `muster mcp`: muster's tasks as tools for an MCP client (an LLM agent, a coding
//! assistant), over stdio or, when asked, streamable HTTP on a local port.
//!
//! The server connects to musterd as every other command does (context, `--addr`,
//! token, trust, `MUSTER_*`) and acts with that token and nothing more: the daemon's
//! reply to `hello` names the token's principal, its roles and queue patterns
//! (PROTOCOL.md §1.7), and the server offers only the tools those roles may use, saying
//! in its instructions and tool descriptions which queues a queue-scoped token covers;
//! every call still goes through the daemon's own authorization. A daemon that runs
//! `--open` names no principal and allows everything: every tool is offered. A
//! refusal is a tool result with `isError` whose text begins with the daemon's stable
//! code (`not_found: …`, `forbidden: …`), with `{"error":{"code","message"}}` as its
//! structured content. Tools that destroy something (cancel, reject, discard) do
//! nothing without `confirm: true`.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use muster_protocol::model::{LimitUse, NewTask, TaskState};
use muster_protocol::ops::{DeadSelection, FieldMatch, FindCursor, PrincipalInfo, Role, TaskFind};
use muster_sdk::{Client, ConnectOptions, Error, ErrorCode};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt, tool, tool_router};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::cli::McpArgs;

/// Most tasks one `enqueue` call takes (they are enqueued atomically, in order).
pub const MAX_ENQUEUE_TASKS: usize = 100;

/// Most tasks one `wait_tasks` call waits for.
pub const MAX_WAIT_TASKS: usize = 100;

/// Longest `wait_tasks` waits: short enough for an MCP client's request timeout (often
/// 60 s); a longer wait is another call.
pub const MAX_WAIT: Duration = Duration::from_secs(30);

/// How long `wait_tasks` waits when not told.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(10);

/// Most items a listing or search returns in one call (`find_tasks`, `list_suspended`,
/// `list_queues`, `list_members`).
pub const MAX_RESULTS: u32 = 500;

/// Items a listing or search returns when not told.
pub const DEFAULT_RESULTS: u32 = 50;

/// Most requests one search makes of the daemon, each a bounded amount of work
/// (PROTOCOL.md §5.35): past it the reply's `next` continues the search.
pub const MAX_FIND_PAGES: usize = 16;

/// Most bytes of output (chunks' text or JSON text) `tail_output` returns in one call,
/// and its default: a chunk is at most this long, so one always fits.
pub const MAX_TAIL_BYTES: usize = muster_protocol::limits::MAX_CHUNK_BYTES;

/// The path streamable HTTP is served on.
pub const HTTP_PATH: &str = "/mcp";

/// Most HTTP connections served at once; past it, new ones wait to be accepted.
pub const MAX_HTTP_CONNECTIONS: usize = 64;

/// Longest an HTTP client may take to send a request's headers: a connection that
/// sends nothing gives its place up.
pub const HTTP_HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether a token of `principal` may use tool `name` (one of [`TOOLS`]): it holds
/// one of the tool's roles. Under `--open` (no principal) every tool may be used.
fn may_use(principal: Option<&PrincipalInfo>, name: &str) -> bool {
    TOOLS
        .iter()
        .find(|(tool, _)| *tool == name)
        .is_some_and(|(_, roles)| principal.is_none_or(|p| roles.iter().any(|r| p.holds(*r))))
}

/// Who this server acts as, in a sentence for its instructions: the token's name,
/// roles and queues.
fn acting_as(principal: Option<&PrincipalInfo>) -> String {
    let Some(p) = principal else {
        return "The daemon runs open (no tokens): every request is allowed.".into();
    };
    let roles: Vec<&str> = p.roles.iter().map(|r| role_name(*r)).collect();
    let queues = match covered(p) {
        Some(queues) => format!("on queues matching {queues} only"),
        None => "on every queue".into(),
    };
    format!(
        "This server acts as token {:?} (roles: {}) {queues}.",
        p.name,
        roles.join(", ")
    )
}

/// The queue patterns of a queue-scoped token, listed (`jobs, ml.*`); `None` for a
/// token of every queue.
fn covered(p: &PrincipalInfo) -> Option<String> {
    (!p.covers_all()).then(|| p.queues.join(", "))
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::Produce => "produce",
        Role::Consume => "consume",
        Role::Approve => "approve",
        Role::Admin => "admin",
    }
}

/// Every tool, with the roles one of which it needs (the daemon's rules of PROTOCOL.md
/// §1.7 for the ops it calls).
const TOOLS: &[(&str, &[Role])] = &[
    ("enqueue", &[Role::Produce]),
    ("get_task", &[Role::Produce, Role::Consume, Role::Approve]),
    ("wait_tasks", &[Role::Produce]),
    ("find_tasks", &[Role::Admin]),
    (
        "list_queues",
        &[Role::Produce, Role::Consume, Role::Approve, Role::Admin],
    ),
    ("list_members", &[Role::Admin]),
    ("cancel_task", &[Role::Produce]),
    ("redrive", &[Role::Admin]),
    ("discard", &[Role::Admin]),
    ("list_suspended", &[Role::Approve]),
    ("resume_task", &[Role::Approve, Role::Consume]),
    ("reject_task", &[Role::Approve, Role::Produce]),
    (
        "tail_output",
        &[Role::Produce, Role::Consume, Role::Approve],
    ),
];

/// The connection to musterd, shared by every MCP session of this process.
struct Shared {
    options: ConnectOptions,
    /// The open connection; dropped when it is lost, and made again by the next call.
    client: tokio::sync::Mutex<Option<Client>>,
    /// What the token may do, from the daemon's `hello`; `None` under `--open`.
    principal: Option<PrincipalInfo>,
}

impl Shared {
    async fn client(&self) -> Result<Client, Error> {
        let mut held = self.client.lock().await;
        if let Some(client) = held.as_ref() {
            return Ok(client.clone());
        }
        let client = Client::connect(self.options.clone()).await?;
        *held = Some(client.clone());
        Ok(client)
    }

    async fn forget(&self) {
        self.client.lock().await.take();
    }
}

/// The MCP server: muster's tools, those the token may use.
#[derive(Clone)]
pub struct Muster {
    shared: Arc<Shared>,
    tool_router: ToolRouter<Muster>,
}

/// A tool's failure: a muster refusal, a bad argument, a lost connection.
struct Failure {
    code: &'static str,
    message: String,
}

impl Failure {
    fn bad(message: impl Into<String>) -> Failure {
        Failure {
            code: "bad_arguments",
            message: message.into(),
        }
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Failure {
        let (code, message) = match e {
            Error::Server(body) => (body.code.as_str(), body.message),
            Error::Connect(m) => ("connect", m),
            Error::Closed(m) => ("connection_lost", m),
            Error::Protocol(m) => ("protocol", m),
            Error::InvalidInput(m) => ("invalid_input", m),
            other => ("failed", other.to_string()),
        };
        Failure { code, message }
    }
}

/// A tool's outcome: a JSON value as structured content (and as text), or a failure.
type Outcome = Result<Value, Failure>;

/// The MCP result of an outcome. A failure's text begins with its code.
fn result(outcome: Outcome) -> CallToolResult {
    match outcome {
        Ok(value) => CallToolResult::structured(value),
        Err(Failure { code, message }) => error_result(code, &message),
    }
}

fn error_result(code: &str, message: &str) -> CallToolResult {
    let mut r = CallToolResult::error(vec![ContentBlock::text(format!("{code}: {message}"))]);
    r.structured_content = Some(json!({"error": {"code": code, "message": message}}));
    r
}

fn to_json<T: serde::Serialize>(value: &T) -> Outcome {
    serde_json::to_value(value).map_err(|e| Failure {
        code: "failed",
        message: format!("encoding the reply: {e}"),
    })
}

/// `confirmation_required` unless `confirm` is true.
fn confirmed(confirm: bool, what: &str) -> Result<(), Failure> {
    if confirm {
        return Ok(());
    }
    Err(Failure {
        code: "confirmation_required",
        message: format!("{what}: call again with \"confirm\": true to do it; nothing was done"),
    })
}

/// `limit` within 1..=[`MAX_RESULTS`], [`DEFAULT_RESULTS`] if absent.
fn results_limit(limit: Option<u32>) -> Result<u32, Failure> {
    match limit.unwrap_or(DEFAULT_RESULTS) {
        n @ 1..=MAX_RESULTS => Ok(n),
        n => Err(Failure::bad(format!(
            "limit {n} is out of range: 1 to {MAX_RESULTS}"
        ))),
    }
}

/// A task's state, as the tools take it.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Waiting for its time or its retry backoff.
    Scheduled,
    /// Waiting to be handed out.
    Ready,
    /// Held by an agent under a lease.
    Leased,
    /// Waiting for a person (or its children) to resume it.
    Suspended,
    /// Acknowledged.
    Done,
    /// Out of attempts or dead-lettered.
    Dead,
    /// Cancelled.
    Cancelled,
}

impl From<State> for TaskState {
    fn from(s: State) -> TaskState {
        match s {
            State::Scheduled => TaskState::Scheduled,
            State::Ready => TaskState::Ready,
            State::Leased => TaskState::Leased,
            State::Suspended => TaskState::Suspended,
            State::Done => TaskState::Done,
            State::Dead => TaskState::Dead,
            State::Cancelled => TaskState::Cancelled,
        }
    }
}

/// Arguments of `enqueue`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EnqueueArgs {
    /// The queue.
    pub queue: String,
    /// The tasks, 1 to 100, enqueued atomically in this order.
    pub tasks: Vec<TaskArgs>,
}

/// One task to enqueue.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskArgs {
    /// Any JSON value (at most 1 MiB as JSON text).
    pub payload: Value,
    /// 0 to 9, higher first [default: 0].
    #[serde(default)]
    pub priority: Option<u8>,
    /// Tasks sharing a key are handed out in order, as the queue's key concurrency allows.
    #[serde(default)]
    pub key: Option<String>,
    /// Labels an agent must carry to be handed this task.
    #[serde(default)]
    pub requires: Vec<String>,
    /// Not handed out before this many milliseconds from now.
    #[serde(default)]
    pub delay_ms: Option<u64>,
    /// A repeated enqueue with the same key answers with the first task (`duplicate`)
    /// instead of storing another: give one to make a retry safe.
    #[serde(default)]
    pub idempotency_key: Option<String>,
    /// Limits (named rate or concurrency budgets) it draws on, at most 4.
    #[serde(default)]
    pub limits: Vec<LimitArgs>,
    /// Its group (a tenant, a customer) for fair dispatch in a queue that has it.
    #[serde(default)]
    pub group: Option<String>,
}

/// A limit a task draws on.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitArgs {
    /// The limit's name.
    pub limit: String,
    /// The key whose bucket it draws on, for a per-key limit.
    #[serde(default)]
    pub key: Option<String>,
    /// Tokens its lease takes [default: 1].
    #[serde(default)]
    pub cost: Option<u64>,
}

/// Names one task.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskId {
    /// The task's id.
    pub id: String,
}

/// Names one task to act on destructively.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConfirmedTask {
    /// The task's id.
    pub id: String,
    /// Must be true: without it nothing is done.
    #[serde(default)]
    pub confirm: bool,
}

/// Arguments of `wait_tasks`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WaitArgs {
    /// The tasks' ids, 1 to 100.
    pub ids: Vec<String>,
    /// Longest wait in seconds, 0 to 30 [default: 10]; 0 checks once.
    #[serde(default)]
    pub timeout_seconds: Option<u64>,
}

/// A payload field a search compares.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FieldArgs {
    /// Object keys and array indexes separated by dots (`order.lines.0.sku`).
    pub path: String,
    /// The JSON value it must equal.
    pub value: Value,
}

/// Where a search goes on: the `next` of the previous reply.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CursorArgs {
    /// The queue the search was in.
    pub queue: String,
    /// The last id examined there.
    pub id: String,
}

/// Arguments of `find_tasks`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FindArgs {
    /// The queue to search [default: every queue the token covers].
    #[serde(default)]
    pub queue: Option<String>,
    /// Only tasks in this state.
    #[serde(default)]
    pub state: Option<State>,
    /// Only tasks whose id starts with this.
    #[serde(default)]
    pub id_prefix: Option<String>,
    /// Only tasks with this key.
    #[serde(default)]
    pub key: Option<String>,
    /// Only the task with this idempotency key.
    #[serde(default)]
    pub idempotency_key: Option<String>,
    /// Only tasks that require this label.
    #[serde(default)]
    pub label: Option<String>,
    /// Only tasks whose last error contains this text (ASCII case-insensitive).
    #[serde(default)]
    pub error: Option<String>,
    /// Only tasks whose payload's JSON text contains this text.
    #[serde(default)]
    pub payload_contains: Option<String>,
    /// Only tasks whose payload has this value at this path.
    #[serde(default)]
    pub field: Option<FieldArgs>,
    /// Newest first instead of oldest first.
    #[serde(default)]
    pub newest_first: bool,
    /// Most tasks to return, 1 to 500 [default: 50].
    #[serde(default)]
    pub limit: Option<u32>,
    /// Continue a search: the previous reply's `next`.
    #[serde(default)]
    pub after: Option<CursorArgs>,
}

/// Arguments of `list_suspended`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SuspendedArgs {
    /// The queue [default: every queue the token covers].
    #[serde(default)]
    pub queue: Option<String>,
    /// Most tasks to return, 1 to 500 [default: 50].
    #[serde(default)]
    pub limit: Option<u32>,
    /// Continue a listing: the previous reply's `next`.
    #[serde(default)]
    pub after: Option<CursorArgs>,
}

/// Arguments of a listing.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListArgs {
    /// Most items to return, 1 to 500 [default: 50].
    #[serde(default)]
    pub limit: Option<u32>,
}

/// Dead tasks of a queue, for `redrive`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RedriveArgs {
    /// The queue.
    pub queue: String,
    /// The dead tasks' ids (or `all`).
    #[serde(default)]
    pub ids: Vec<String>,
    /// Every dead task of the queue.
    #[serde(default)]
    pub all: bool,
    /// Only count (and list) what would be affected.
    #[serde(default)]
    pub dry_run: bool,
}

/// Dead tasks of a queue, for `discard`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DiscardArgs {
    /// The queue.
    pub queue: String,
    /// The dead tasks' ids (or `all`).
    #[serde(default)]
    pub ids: Vec<String>,
    /// Every dead task of the queue.
    #[serde(default)]
    pub all: bool,
    /// Only count (and list) what would be removed; needs no confirmation.
    #[serde(default)]
    pub dry_run: bool,
    /// Must be true to remove anything: without it nothing is done.
    #[serde(default)]
    pub confirm: bool,
}

/// Arguments of `resume_task`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResumeArgs {
    /// The suspended task's id (approve or admin tokens).
    #[serde(default)]
    pub id: Option<String>,
    /// Or the resume token its suspend returned (consume tokens too).
    #[serde(default)]
    pub resume_token: Option<String>,
    /// JSON its next holder sees as the resume's data (an approval, an answer).
    #[serde(default)]
    pub data: Option<Value>,
}

/// Arguments of `tail_output`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TailArgs {
    /// The task's id.
    pub id: String,
    /// The first chunk to return (0 is the task's first; a reply's `next` goes on).
    #[serde(default)]
    pub from: u64,
    /// Most bytes of chunk text to return, 1 to 65536 [default: 65536]; at least one
    /// chunk is returned when there is one.
    #[serde(default)]
    pub max_bytes: Option<usize>,
}

fn selection(
    queue: &str,
    ids: &[String],
    all: bool,
    dry_run: bool,
) -> Result<DeadSelection, Failure> {
    match (ids.is_empty(), all) {
        (true, false) => Err(Failure::bad(
            "name the dead tasks: \"ids\", or \"all\": true",
        )),
        (false, true) => Err(Failure::bad("give \"ids\" or \"all\": true, not both")),
        _ if ids.len() > muster_protocol::limits::MAX_IDS => Err(Failure::bad(format!(
            "{} ids: at most {} a call",
            ids.len(),
            muster_protocol::limits::MAX_IDS
        ))),
        _ => Ok(DeadSelection {
            queue: queue.into(),
            ids: ids.to_vec(),
            all,
            dry_run,
        }),
    }
}

fn cursor(after: Option<CursorArgs>) -> Option<FindCursor> {
    after.map(|c| FindCursor {
        queue: c.queue,
        id: c.id,
    })
}

#[tool_router]
impl Muster {
    fn new(shared: Arc<Shared>) -> Muster {
        let mut tool_router = Self::tool_router();
        let principal = shared.principal.as_ref();
        for (name, _) in TOOLS {
            if !may_use(principal, name) {
                tool_router.remove_route(name);
            }
        }
        // A queue-scoped token's tools say which queues they reach.
        if let Some(queues) = principal.and_then(covered) {
            for route in tool_router.map.values_mut() {
                let description = route.attr.description.as_deref().unwrap_or_default();
                route.attr.description = Some(
                    format!(
                        "{description}\n\nThis server's token covers queues matching {queues} \
                         only: other queues are refused (forbidden)."
                    )
                    .into(),
                );
            }
        }
        Muster {
            shared,
            tool_router,
        }
    }

    /// Runs `op` on the connection, connecting first if there is none. A lost
    /// connection is forgotten (the next call connects again); a call that changes
    /// nothing (`read_only`) is then tried once more on a new connection.
    async fn with_client<T, F, Fut>(&self, read_only: bool, op: F) -> Result<T, Failure>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, Error>>,
    {
        let client = self.shared.client().await?;
        match op(client).await {
            Err(Error::Closed(why)) => {
                self.shared.forget().await;
                if !read_only {
                    return Err(Error::Closed(why).into());
                }
                let client = self.shared.client().await?;
                let reply = op(client).await;
                if let Err(Error::Closed(_)) = &reply {
                    self.shared.forget().await;
                }
                Ok(reply?)
            }
            reply => Ok(reply?),
        }
    }

    /// Enqueue 1 to 100 tasks on a queue, atomically and in order. Each may carry an
    /// idempotency key (a repeat answers with the first task, `duplicate: true`),
    /// a priority, a key, a delay, required labels, limits and a group. Returns each
    /// task's id, state and whether it was a duplicate.
    #[tool(annotations(
        title = "Enqueue tasks",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = false,
        open_world_hint = false
    ))]
    async fn enqueue(&self, Parameters(args): Parameters<EnqueueArgs>) -> CallToolResult {
        result(self.enqueue_tasks(args).await)
    }

    /// Read one task: its state, payload, result, last error, lease, suspension,
    /// output summary and timeline.
    #[tool(annotations(title = "Get a task", read_only_hint = true, open_world_hint = false))]
    async fn get_task(&self, Parameters(args): Parameters<TaskId>) -> CallToolResult {
        let id = &args.id;
        result(
            match self
                .with_client(true, |c| async move { c.task_get(id).await })
                .await
            {
                Ok(task) => to_json(&task),
                Err(e) => Err(e),
            },
        )
    }

    /// Wait until tasks finish (done, dead or cancelled), at most 30 s (default 10 s;
    /// call again to wait longer). Returns the finished tasks whole, and the ids still
    /// `pending`, `removed` meanwhile, or `omitted` (finished, but too large to list:
    /// read them with get_task).
    #[tool(annotations(
        title = "Wait for tasks",
        read_only_hint = true,
        open_world_hint = false
    ))]
    async fn wait_tasks(&self, Parameters(args): Parameters<WaitArgs>) -> CallToolResult {
        result(self.wait(args).await)
    }

    /// Search tasks by queue, state, id prefix, key, idempotency key, label, error
    /// text, payload text or a payload field (all given must match), oldest or newest
    /// first. Returns at most `limit` (default 50, at most 500) task summaries and
    /// `next`, to pass as `after` to go on (null once everything was searched).
    #[tool(annotations(title = "Find tasks", read_only_hint = true, open_world_hint = false))]
    async fn find_tasks(&self, Parameters(args): Parameters<FindArgs>) -> CallToolResult {
        result(self.find(args).await)
    }

    /// List the queues the token covers, each with its settings and its counts of
    /// tasks by state (scheduled, ready, leased, suspended, done, dead, cancelled).
    #[tool(annotations(title = "List queues", read_only_hint = true, open_world_hint = false))]
    async fn list_queues(&self, Parameters(args): Parameters<ListArgs>) -> CallToolResult {
        result(self.queues(args).await)
    }

    /// List the agents (members): name, connection and liveness, leases held and
    /// capacity, draining, labels.
    #[tool(annotations(title = "List members", read_only_hint = true, open_world_hint = false))]
    async fn list_members(&self, Parameters(args): Parameters<ListArgs>) -> CallToolResult {
        result(self.members(args).await)
    }

    /// Cancel a task: at once if it waits, at its holder's settle if it is leased (the
    /// holder is asked to stop). Needs "confirm": true.
    #[tool(annotations(
        title = "Cancel a task",
        read_only_hint = false,
        destructive_hint = true,
        idempotent_hint = true,
        open_world_hint = false
    ))]
    async fn cancel_task(&self, Parameters(args): Parameters<ConfirmedTask>) -> CallToolResult {
        result(self.cancel(args).await)
    }

    /// Make dead tasks of a queue ready again with their failures reset: by ids, or
    /// "all": true. "dry_run": true only counts and lists them. Returns the count.
    #[tool(annotations(
        title = "Redrive dead tasks",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    ))]
    async fn redrive(&self, Parameters(args): Parameters<RedriveArgs>) -> CallToolResult {
        result(self.redrive_dead(args).await)
    }

    /// Remove dead tasks of a queue for good: by ids, or "all": true. Needs
    /// "confirm": true, except a "dry_run" that only counts and lists them.
    #[tool(annotations(
        title = "Discard dead tasks",
        read_only_hint = false,
        destructive_hint = true,
        idempotent_hint = true,
        open_world_hint = false
    ))]
    async fn discard(&self, Parameters(args): Parameters<DiscardArgs>) -> CallToolResult {
        result(self.discard_dead(args).await)
    }

    /// List tasks waiting for a person (suspended): what each asks (`suspension.reason`),
    /// since when and when it times out. At most `limit` (default 50, at most 500),
    /// and `next` to pass as `after` to go on.
    #[tool(annotations(
        title = "List tasks waiting for a person",
        read_only_hint = true,
        open_world_hint = false
    ))]
    async fn list_suspended(&self, Parameters(args): Parameters<SuspendedArgs>) -> CallToolResult {
        let search = FindArgs {
            queue: args.queue,
            state: Some(State::Suspended),
            limit: args.limit,
            after: args.after,
            ..FindArgs::default()
        };
        result(self.find(search).await)
    }

    /// Resume a suspended task, by its id or by the resume token its suspend returned,
    /// with optional JSON data its next holder sees (an approval, an answer). It is
    /// ready again at its place. A task resumes once: a second resume is refused.
    #[tool(annotations(
        title = "Resume a suspended task",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    ))]
    async fn resume_task(&self, Parameters(args): Parameters<ResumeArgs>) -> CallToolResult {
        result(self.resume(args).await)
    }

    /// Reject a task that waits for a person: cancel it if it is still suspended, in
    /// one step (one resumed, timed out or cancelled meanwhile is refused with
    /// invalid_state and left as it is). Needs "confirm": true.
    #[tool(annotations(
        title = "Reject a suspended task",
        read_only_hint = false,
        destructive_hint = true,
        idempotent_hint = true,
        open_world_hint = false
    ))]
    async fn reject_task(&self, Parameters(args): Parameters<ConfirmedTask>) -> CallToolResult {
        result(self.reject(args).await)
    }

    /// Read a task's output (text or JSON chunks its agent emitted) from chunk `from`:
    /// what is stored now, at most `max_bytes` (default and most 65536) of it. Returns
    /// the chunks, `next` (the `from` of the next call), `dropped` (chunks no longer
    /// kept), the task's state and `end` (finished, and every chunk returned).
    #[tool(annotations(
        title = "Read a task's output",
        read_only_hint = true,
        open_world_hint = false
    ))]
    async fn tail_output(&self, Parameters(args): Parameters<TailArgs>) -> CallToolResult {
        result(self.tail(args).await)
    }
}

impl Muster {
    async fn enqueue_tasks(&self, args: EnqueueArgs) -> Outcome {
        let count = args.tasks.len();
        if !(1..=MAX_ENQUEUE_TASKS).contains(&count) {
            return Err(Failure::bad(format!(
                "{count} tasks: give 1 to {MAX_ENQUEUE_TASKS} a call"
            )));
        }
        let tasks = args
            .tasks
            .into_iter()
            .map(|t| {
                Ok(NewTask {
                    payload: muster_sdk::json(&t.payload)?,
                    priority: t.priority,
                    key: t.key,
                    requires: t.requires,
                    delay_ms: t.delay_ms,
                    not_before_ms: None,
                    // The SDK gives a task without one a key of its own, so that a
                    // retry of this very request is stored once.
                    idempotency_key: t.idempotency_key,
                    limits: t
                        .limits
                        .into_iter()
                        .map(|l| LimitUse {
                            limit: l.limit,
                            key: l.key,
                            cost: l.cost,
                        })
                        .collect(),
                    group: t.group,
                    traceparent: None,
                    tracestate: None,
                })
            })
            .collect::<Result<Vec<_>, Error>>()?;
        let queue = &args.queue;
        let tasks = &tasks;
        let enqueued = self
            .with_client(false, |c| async move {
                c.enqueue_batch(queue, tasks.clone()).await
            })
            .await?;
        Ok(json!({ "tasks": to_json(&enqueued)? }))
    }

    async fn wait(&self, args: WaitArgs) -> Outcome {
        if !(1..=MAX_WAIT_TASKS).contains(&args.ids.len()) {
            return Err(Failure::bad(format!(
                "{} ids: give 1 to {MAX_WAIT_TASKS} a call",
                args.ids.len()
            )));
        }
        let timeout = args
            .timeout_seconds
            .map_or(DEFAULT_WAIT, Duration::from_secs);
        if timeout > MAX_WAIT {
            return Err(Failure::bad(format!(
                "timeout_seconds {}: at most {} (call again to wait longer)",
                timeout.as_secs(),
                MAX_WAIT.as_secs()
            )));
        }
        let ids = &args.ids;
        let reply = self
            .with_client(true, |c| async move {
                c.wait(ids.clone(), timeout.as_millis() as u64).await
            })
            .await?;
        to_json(&reply)
    }

    async fn find(&self, args: FindArgs) -> Outcome {
        let limit = results_limit(args.limit)?;
        let mut search = TaskFind {
            queue: args.queue,
            state: args.state.map(TaskState::from),
            id_prefix: args.id_prefix,
            key: args.key,
            idempotency_key: args.idempotency_key,
            label: args.label,
            error: args.error,
            payload: args.payload_contains,
            field: args.field.map(|f| FieldMatch {
                path: f.path,
                value: f.value,
            }),
            newest_first: args.newest_first,
            after: cursor(args.after),
            limit: None,
        };
        let mut tasks = Vec::new();
        for _ in 0..MAX_FIND_PAGES {
            search.limit = Some(limit - tasks.len() as u32);
            let page = {
                let search = &search;
                self.with_client(true, |c| async move { c.task_find(search).await })
                    .await?
            };
            tasks.extend(page.tasks);
            search.after = page.next;
            if search.after.is_none() || tasks.len() as u32 >= limit {
                break;
            }
        }
        Ok(json!({ "tasks": to_json(&tasks)?, "next": to_json(&search.after)? }))
    }

    async fn queues(&self, args: ListArgs) -> Outcome {
        let limit = results_limit(args.limit)? as usize;
        let mut queues = self
            .with_client(true, |c| async move { c.queue_list().await })
            .await?;
        let more = queues.len() > limit;
        queues.truncate(limit);
        Ok(json!({ "queues": to_json(&queues)?, "more": more }))
    }

    async fn members(&self, args: ListArgs) -> Outcome {
        let limit = results_limit(args.limit)? as usize;
        let mut members = self
            .with_client(true, |c| async move { c.member_list().await })
            .await?;
        let more = members.len() > limit;
        members.truncate(limit);
        Ok(json!({ "members": to_json(&members)?, "more": more }))
    }

    async fn cancel(&self, args: ConfirmedTask) -> Outcome {
        confirmed(args.confirm, &format!("cancelling task {}", args.id))?;
        let id = &args.id;
        let reply = self
            .with_client(false, |c| async move { c.cancel(id).await })
            .await?;
        Ok(
            json!({ "id": id, "state": to_json(&reply.state)?, "cancel_requested": reply.cancel_requested }),
        )
    }

    async fn redrive_dead(&self, args: RedriveArgs) -> Outcome {
        let selection = &selection(&args.queue, &args.ids, args.all, args.dry_run)?;
        let reply = self
            .with_client(args.dry_run, |c| async move {
                c.redrive(selection.clone()).await
            })
            .await?;
        to_json(&reply)
    }

    async fn discard_dead(&self, args: DiscardArgs) -> Outcome {
        let selection = &selection(&args.queue, &args.ids, args.all, args.dry_run)?;
        if !args.dry_run {
            let what = match args.all {
                true => format!("removing every dead task of queue {:?}", args.queue),
                false => format!(
                    "removing {} dead tasks of queue {:?}",
                    args.ids.len(),
                    args.queue
                ),
            };
            confirmed(args.confirm, &what)?;
        }
        let reply = self
            .with_client(args.dry_run, |c| async move {
                c.discard(selection.clone()).await
            })
            .await?;
        to_json(&reply)
    }

    async fn resume(&self, args: ResumeArgs) -> Outcome {
        let data = args.data.as_ref().map(muster_sdk::json).transpose()?;
        let data = &data;
        let reply = match (&args.id, &args.resume_token) {
            (Some(id), None) => {
                self.with_client(
                    false,
                    |c| async move { c.resume_task(id, data.clone()).await },
                )
                .await?
            }
            (None, Some(token)) => {
                self.with_client(
                    false,
                    |c| async move { c.resume(token, data.clone()).await },
                )
                .await?
            }
            _ => {
                return Err(Failure::bad(
                    "give the task's \"id\" or its \"resume_token\", one of them",
                ));
            }
        };
        to_json(&reply)
    }

    async fn reject(&self, args: ConfirmedTask) -> Outcome {
        confirmed(args.confirm, &format!("rejecting task {}", args.id))?;
        let id = &args.id;
        let reply = self
            .with_client(false, |c| async move {
                c.cancel_if(id, TaskState::Suspended).await
            })
            .await?;
        Ok(
            json!({ "id": id, "state": to_json(&reply.state)?, "cancel_requested": reply.cancel_requested }),
        )
    }

    async fn tail(&self, args: TailArgs) -> Outcome {
        let budget = args.max_bytes.unwrap_or(MAX_TAIL_BYTES);
        if !(1..=MAX_TAIL_BYTES).contains(&budget) {
            return Err(Failure::bad(format!(
                "max_bytes {budget} is out of range: 1 to {MAX_TAIL_BYTES}"
            )));
        }
        let id = &args.id;
        let from = args.from;
        let reply = self
            .with_client(
                true,
                |c| async move { c.follow(id, from, Duration::ZERO).await },
            )
            .await?;
        let mut used = 0;
        let mut chunks = Vec::new();
        for chunk in &reply.chunks {
            let size = chunk.text.as_ref().map_or(0, String::len)
                + chunk.json.as_ref().map_or(0, |j| j.get().len());
            if !chunks.is_empty() && used + size > budget {
                break;
            }
            used += size;
            chunks.push(chunk);
        }
        let all = chunks.len() == reply.chunks.len();
        let next = match all {
            true => reply.next,
            false => reply.chunks[chunks.len()].n,
        };
        Ok(json!({
            "id": id,
            "chunks": to_json(&chunks)?,
            "dropped": reply.dropped,
            "next": next,
            "state": to_json(&reply.state)?,
            "end": reply.end && all,
        }))
    }
}

impl ServerHandler for Muster {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("muster", crate::VERSION))
            .with_instructions(format!(
                "muster is a durable task dispatcher: producers enqueue tasks on named queues \
                 and agents take them. These tools enqueue tasks, read and wait for them, \
                 search them, list queues and agents, cancel, redrive and discard, answer \
                 tasks that wait for a person, and read a task's output. Only the tools this \
                 server's token may use are listed. {} A failure's text begins with its code \
                 (not_found, forbidden, invalid_state, confirmation_required, bad_arguments, \
                 ...). Tools that destroy something need \"confirm\": true.",
                acting_as(self.shared.principal.as_ref())
            ))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.tool_router.list_all()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tool_router.get(name).cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        // A tool of muster's that this token may not use: the daemon would refuse it.
        if TOOLS.iter().any(|(tool, _)| *tool == request.name)
            && !self.tool_router.has_route(&request.name)
        {
            return Ok(error_result(
                ErrorCode::Forbidden.as_str(),
                &format!(
                    "this server's token may not use tool {:?} (it is not among the tools listed)",
                    request.name
                ),
            )
            .into());
        }
        let response = self
            .tool_router
            .call(ToolCallContext::new(self, request, context))
            .await?;
        // Arguments that do not fit the tool's schema: rmcp's message, with our code.
        Ok(match response {
            CallToolResponse::Complete(r)
                if r.is_error == Some(true) && r.structured_content.is_none() =>
            {
                let text = r
                    .content
                    .iter()
                    .filter_map(|c| c.as_text().map(|t| t.text.clone()))
                    .collect::<Vec<_>>()
                    .join(" ");
                error_result("bad_arguments", &text).into()
            }
            other => other,
        })
    }
}

/// `muster mcp`: connects (its `hello` says what the token may do), then serves MCP over stdio until
/// the client closes it, or over streamable HTTP until SIGINT or SIGTERM.
pub async fn run(options: ConnectOptions, args: McpArgs) -> anyhow::Result<()> {
    // Checked before anything else, so a refused address changes nothing.
    let http = match &args.http {
        Some(addr) => Some(http_setup(
            addr,
            args.http_allow_remote,
            args.http_token_file.as_deref(),
        )?),
        None => None,
    };
    let client = Client::connect(options.clone()).await?;
    let principal = client.principal().cloned();
    let shared = Arc::new(Shared {
        options,
        client: tokio::sync::Mutex::new(Some(client)),
        principal,
    });
    let server = Muster::new(Arc::clone(&shared));
    let served = match http {
        None => serve_stdio(server).await,
        Some((addr, secret)) => serve_http(server, addr, secret).await,
    };
    // The daemon learns at once that this client is gone (not at the idle timeout).
    let client = shared.client.lock().await.take();
    if let Some(client) = client {
        client.close().await;
    }
    served
}

/// Serves one MCP session on stdin and stdout until the client closes it.
async fn serve_stdio(server: Muster) -> anyhow::Result<()> {
    let running = server
        .serve(rmcp::transport::stdio())
        .await
        .context("starting the MCP session on stdio")?;
    running.waiting().await.context("serving MCP on stdio")?;
    Ok(())
}

/// The address to serve HTTP on, refused if it is not loopback unless allowed, and the
/// bearer token clients must present.
fn http_setup(
    addr: &str,
    allow_remote: bool,
    token_file: Option<&std::path::Path>,
) -> anyhow::Result<(SocketAddr, String)> {
    let addr: SocketAddr = addr
        .parse()
        .with_context(|| format!("--http {addr:?}: want IP:PORT, e.g. 127.0.0.1:8700"))?;
    if !addr.ip().is_loopback() && !allow_remote {
        bail!(
            "--http {addr}: not a loopback address; whoever reaches it acts with this \
             server's token: add --http-allow-remote if that is what you want"
        );
    }
    let Some(path) = token_file else {
        bail!(
            "--http needs --http-token-file FILE: the bearer token MCP clients must send \
             (`Authorization: Bearer TOKEN`), since any local user can reach a loopback port"
        );
    };
    let secret = muster_sdk::connect::read_token_file(path)?;
    Ok((addr, secret))
}

/// Serves streamable HTTP on `addr` at [`HTTP_PATH`] to clients that present `secret`
/// as a bearer token; prints the URL on stdout once listening.
async fn serve_http(server: Muster, addr: SocketAddr, secret: String) -> anyhow::Result<()> {
    use http_body_util::BodyExt as _;
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
    };
    use tokio_util::sync::CancellationToken;

    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("listening on {addr}"))?;
    let local = listener.local_addr().context("the address listened on")?;
    let stop = CancellationToken::new();
    // The Host header a client sends: the address as given, and loopback names.
    let hosts = [
        "localhost".to_owned(),
        "127.0.0.1".into(),
        "::1".into(),
        local.ip().to_string(),
    ];
    let config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(hosts)
        .with_cancellation_token(stop.child_token());
    let service = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    let expected = Arc::new(format!("Bearer {secret}").into_bytes());
    println!("http://{local}{HTTP_PATH}");
    std::io::Write::flush(&mut std::io::stdout()).context("printing the URL")?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("handling SIGTERM")?;
    let places = Arc::new(tokio::sync::Semaphore::new(MAX_HTTP_CONNECTIONS));
    loop {
        let place = tokio::select! {
            place = Arc::clone(&places).acquire_owned() => place.context("the connection places")?,
            _ = tokio::signal::ctrl_c() => break,
            _ = term.recv() => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!("accepting an HTTP connection: {e}");
                    continue;
                }
            },
            _ = tokio::signal::ctrl_c() => break,
            _ = term.recv() => break,
        };
        let service = service.clone();
        let expected = Arc::clone(&expected);
        tokio::spawn(async move {
            let _place = place;
            let handle = hyper::service::service_fn(
                move |req: hyper::Request<hyper::body::Incoming>| {
                    let service = service.clone();
                    let expected = Arc::clone(&expected);
                    async move {
                        let refuse = |status: hyper::StatusCode, text: &'static str| {
                            let mut response = hyper::Response::new(
                                http_body_util::Full::new(bytes::Bytes::from_static(
                                    text.as_bytes(),
                                ))
                                .boxed(),
                            );
                            *response.status_mut() = status;
                            response
                        };
                        let response = if req.uri().path() != HTTP_PATH {
                            refuse(
                                hyper::StatusCode::NOT_FOUND,
                                "not found: MCP is served at /mcp\n",
                            )
                        } else if !bearer_matches(&req, &expected) {
                            let mut r = refuse(
                                hyper::StatusCode::UNAUTHORIZED,
                                "unauthorized: send Authorization: Bearer TOKEN (--http-token-file)\n",
                            );
                            r.headers_mut().insert(
                                hyper::header::WWW_AUTHENTICATE,
                                hyper::header::HeaderValue::from_static("Bearer"),
                            );
                            r
                        } else {
                            service.handle(req).await
                        };
                        Ok::<_, std::convert::Infallible>(response)
                    }
                },
            );
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HTTP_HEADER_TIMEOUT)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), handle);
            if let Err(e) = conn.await {
                tracing::debug!("an HTTP connection ended: {e}");
            }
        });
    }
    stop.cancel();
    Ok(())
}

/// Whether the request's `Authorization` header is `expected`, compared in constant
/// time.
fn bearer_matches<B>(req: &hyper::Request<B>, expected: &[u8]) -> bool {
    let Some(given) = req.headers().get(hyper::header::AUTHORIZATION) else {
        return false;
    };
    let given = given.as_bytes();
    given.len() == expected.len()
        && given
            .iter()
            .zip(expected)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn principal(roles: &[Role], queues: &[&str]) -> PrincipalInfo {
        PrincipalInfo {
            name: "t".into(),
            roles: roles.to_vec(),
            queues: queues.iter().map(|q| (*q).to_owned()).collect(),
            members: Vec::new(),
        }
    }

    fn server(principal: Option<PrincipalInfo>) -> Muster {
        Muster::new(Arc::new(Shared {
            options: ConnectOptions::default(),
            client: tokio::sync::Mutex::new(None),
            principal,
        }))
    }

    fn names(principal: Option<PrincipalInfo>) -> Vec<String> {
        server(principal)
            .tool_router
            .list_all()
            .into_iter()
            .map(|t| t.name.to_string())
            .collect()
    }

    #[test]
    fn every_tool_has_its_roles_and_the_roles_pick_the_tools() {
        let mut every: Vec<&str> = TOOLS.iter().map(|(name, _)| *name).collect();
        every.sort_unstable();
        assert_eq!(
            names(Some(principal(&[Role::Admin], &[]))),
            every,
            "the router has exactly the tools TOOLS names"
        );
        assert_eq!(names(None), every, "an --open daemon allows every tool");
        assert_eq!(
            names(Some(principal(&[Role::Produce], &[]))),
            [
                "cancel_task",
                "enqueue",
                "get_task",
                "list_queues",
                "reject_task",
                "tail_output",
                "wait_tasks"
            ]
        );
        assert_eq!(
            names(Some(principal(&[Role::Approve], &[]))),
            [
                "get_task",
                "list_queues",
                "list_suspended",
                "reject_task",
                "resume_task",
                "tail_output"
            ]
        );
        assert_eq!(
            names(Some(principal(&[Role::Consume], &[]))),
            ["get_task", "list_queues", "resume_task", "tail_output"]
        );
        assert_eq!(
            names(Some(principal(&[Role::Consume, Role::Approve], &[]))),
            [
                "get_task",
                "list_queues",
                "list_suspended",
                "reject_task",
                "resume_task",
                "tail_output"
            ]
        );
    }

    #[test]
    fn a_queue_scoped_token_says_which_queues_it_covers() {
        let scoped = server(Some(principal(&[Role::Produce], &["jobs", "ml.*"])));
        let enqueue = scoped.tool_router.get("enqueue").expect("enqueue");
        let description = enqueue.description.as_deref().unwrap_or_default();
        assert!(
            description.ends_with(
                "\n\nThis server's token covers queues matching jobs, ml.* only: other \
                 queues are refused (forbidden)."
            ),
            "{description}"
        );
        assert_eq!(
            acting_as(Some(&principal(&[Role::Produce, Role::Approve], &["jobs"]))),
            "This server acts as token \"t\" (roles: produce, approve) on queues matching jobs only."
        );
        let every = server(Some(principal(&[Role::Admin], &[])));
        let description = every
            .tool_router
            .get("enqueue")
            .expect("enqueue")
            .description
            .clone();
        assert_eq!(
            description,
            Muster::tool_router()
                .get("enqueue")
                .expect("enqueue")
                .description
                .clone(),
            "a token of every queue leaves the descriptions as they are"
        );
        assert_eq!(
            acting_as(Some(&principal(&[Role::Admin], &[]))),
            "This server acts as token \"t\" (roles: admin) on every queue."
        );
        assert_eq!(
            acting_as(None),
            "The daemon runs open (no tokens): every request is allowed."
        );
    }

    #[test]
    fn destructive_tools_say_so_and_readers_say_they_read() {
        let tools = Muster::tool_router().list_all();
        let hint = |name: &str| {
            let tool = tools.iter().find(|t| t.name == name).expect("a tool");
            let a = tool.annotations.clone().expect("annotations");
            (a.read_only_hint, a.destructive_hint)
        };
        for name in ["cancel_task", "discard", "reject_task"] {
            assert_eq!(hint(name), (Some(false), Some(true)), "{name}");
        }
        for name in ["enqueue", "redrive", "resume_task"] {
            assert_eq!(hint(name), (Some(false), Some(false)), "{name}");
        }
        for name in [
            "get_task",
            "wait_tasks",
            "find_tasks",
            "list_queues",
            "list_members",
            "list_suspended",
            "tail_output",
        ] {
            assert_eq!(hint(name).0, Some(true), "{name}");
        }
    }

    #[test]
    fn only_the_exact_bearer_token_passes() {
        let req = |value: Option<&str>| {
            let mut b = hyper::Request::builder();
            if let Some(v) = value {
                b = b.header("authorization", v);
            }
            b.body(()).expect("a request")
        };
        let expected = b"Bearer s3cret-token";
        assert!(bearer_matches(&req(Some("Bearer s3cret-token")), expected));
        assert!(!bearer_matches(&req(Some("Bearer s3cret-tokem")), expected));
        assert!(!bearer_matches(&req(Some("Bearer s3cret")), expected));
        assert!(!bearer_matches(&req(None), expected));
    }

    #[test]
    fn a_non_loopback_address_needs_allowing() {
        let e = http_setup("0.0.0.0:8700", false, None).expect_err("refused");
        assert!(e.to_string().contains("not a loopback address"), "{e}");
        let e = http_setup("127.0.0.1:8700", false, None).expect_err("no token file");
        assert!(e.to_string().contains("--http-token-file"), "{e}");
    }
}
