//! The command line, as clap parses it.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use muster_protocol::model::{CatchUp, LimitUse, Rate};

use crate::ClaimString;

/// muster: enqueue, claim, settle and repair tasks on a musterd daemon.
#[derive(Debug, Parser)]
#[command(name = "muster", version = crate::VERSION, about)]
pub struct Cli {
    /// Connection and output options.
    #[command(flatten)]
    pub global: Global,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Options every subcommand takes, shown apart from each command's own.
#[derive(Debug, Args)]
#[command(next_help_heading = "Global options")]
pub struct Global {
    /// The named context to use (`muster context list`) instead of the current one.
    #[arg(long, global = true, env = "MUSTER_CONTEXT")]
    pub context: Option<String>,
    /// Daemon address, HOST:PORT [default: the context's, else 127.0.0.1:7420]; for a
    /// cluster, its nodes' addresses separated by commas (HOST:PORT,HOST:PORT,..., at
    /// most 16): commands go to the leader.
    #[arg(long, global = true, env = "MUSTER_ADDR")]
    pub addr: Option<String>,
    /// The daemon's data directory, where its certificate is found.
    #[arg(long, global = true, env = "MUSTER_DATA")]
    pub data: Option<PathBuf>,
    /// A PEM CA file (or the daemon's certificate) to trust.
    #[arg(long, global = true, env = "MUSTER_CA")]
    pub ca: Option<PathBuf>,
    /// The SHA-256 fingerprint of the daemon's certificate to trust (as musterd logs it).
    #[arg(long, global = true, env = "MUSTER_PIN")]
    pub pin: Option<String>,
    /// A token, for daemons that require one. Every local user can read a process's
    /// arguments: prefer --token-file.
    #[arg(long, global = true, env = "MUSTER_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// A file holding the token (read at each connect, by `muster work` once at start;
    /// --token beats it). Without
    /// either, a daemon trusted through its data directory is sent the token it wrote
    /// there for its own user, if it wrote one.
    #[arg(long, global = true, env = "MUSTER_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// Print JSON lines instead of text, and a failure as a JSON object on stderr.
    #[arg(long, global = true)]
    pub json: bool,
    /// Print lists without their header line.
    #[arg(long, global = true)]
    pub no_headers: bool,
}

/// A duration such as `30s`, `5m`, `1h30m` or `0s`.
pub fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("invalid duration {s:?}: {e}"))
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create, inspect, change and remove queues.
    #[command(subcommand)]
    Queue(QueueCommand),
    /// Create, inspect, change and remove limits: rate and concurrency budgets that
    /// tasks of any queue draw on.
    #[command(subcommand)]
    Limit(LimitCommand),
    /// Create, inspect, pause and remove schedules: each time a schedule's cron pattern
    /// names (in its time zone), one task is enqueued into its queue.
    #[command(subcommand)]
    Schedule(ScheduleCommand),
    /// Enqueue a task; with PAYLOAD `-`, one JSON payload per stdin line.
    Enqueue(EnqueueArgs),
    /// Lease ready tasks; prints CLAIM<TAB>ATTEMPT<TAB>PAYLOAD per task.
    Claim(ClaimArgs),
    /// Settle a leased task as done.
    Ack {
        /// The claim, as `muster claim` printed it.
        claim: ClaimString,
        /// A JSON result to store with the task.
        #[arg(long)]
        result: Option<String>,
    },
    /// Hand a leased task back as failed, to be retried.
    Nack {
        /// The claim.
        claim: ClaimString,
        /// Retry after this delay instead of the queue's backoff.
        #[arg(long, value_parser = duration)]
        delay: Option<Duration>,
        /// What went wrong.
        #[arg(long)]
        error: Option<String>,
    },
    /// Extend a lease, optionally storing a progress checkpoint.
    Renew {
        /// The claim.
        claim: ClaimString,
        /// New lease from now (default: the queue's lease).
        #[arg(long, value_parser = duration)]
        extend: Option<Duration>,
        /// A JSON progress checkpoint.
        #[arg(long)]
        progress: Option<String>,
    },
    /// Hand a leased task back without counting a failure.
    Release {
        /// The claim.
        claim: ClaimString,
    },
    /// Hand a leased task back because a provider throttled it: no failure counted,
    /// and its limit hands nothing out for a while.
    Throttled {
        /// The claim.
        claim: ClaimString,
        /// How long the limit (or the task, if it names none) waits [default: 1s].
        #[arg(long, value_parser = duration)]
        retry_after: Option<Duration>,
        /// The limit the provider throttled (default: every limit the task names).
        #[arg(long)]
        limit: Option<String>,
    },
    /// Suspend a leased task instead of settling it: its lease ends without a failure
    /// and it waits, as `suspended`, for a resume (prints the resume token) or its
    /// timeout.
    Suspend {
        /// The claim.
        claim: ClaimString,
        /// What it waits for, shown to whoever resumes it.
        #[arg(long)]
        reason: String,
        /// How long it may wait [default: 7d].
        #[arg(long, value_parser = duration)]
        timeout: Option<Duration>,
        /// What the timeout does.
        #[arg(long, value_enum, default_value_t = TimeoutAction::Fail)]
        on_timeout: TimeoutAction,
    },
    /// Spawn children of a leased task (each once per child key: a key spawned before
    /// answers that child), keeping the lease; with `--wait` the lease ends and the task
    /// waits until every child has finished (ready at once if they all have), and its
    /// next holder sees each child's outcome. Prints a line per child (key, id, state,
    /// new or duplicate), then the task's state and, while it waits, its resume token.
    /// At most 1,000 children per task and 8 spawns deep.
    Spawn {
        /// The claim.
        claim: ClaimString,
        /// A child: its key among the task's children, its queue and its payload (repeat
        /// for more children).
        #[arg(
            long = "child",
            num_args = 3,
            value_names = ["KEY", "QUEUE", "JSON"],
            action = clap::ArgAction::Append
        )]
        children: Vec<String>,
        /// Suspend the task until every child has finished.
        #[arg(long)]
        wait: bool,
        /// With --wait: what it waits for, shown to people [default: waiting for its
        /// children].
        #[arg(long, requires = "wait")]
        reason: Option<String>,
        /// With --wait: how long it may wait [default: 7d].
        #[arg(long, value_parser = duration, requires = "wait")]
        timeout: Option<Duration>,
        /// With --wait: what the timeout does.
        #[arg(long, value_enum, default_value_t = TimeoutAction::Fail)]
        on_timeout: TimeoutAction,
    },
    /// Resume a suspended task: by the token its suspend printed, or (approve and admin
    /// tokens) by its id with `--task`. It is ready again at its place, and its next
    /// holder sees `--with`'s JSON as the resume's data.
    Resume {
        /// The resume token.
        #[arg(
            value_name = "TOKEN",
            required_unless_present = "task",
            conflicts_with = "task"
        )]
        resume_token: Option<String>,
        /// Resume this suspended task by its id instead of a token.
        #[arg(long)]
        task: Option<String>,
        /// JSON its next holder sees as the resume's data (an approval, an answer).
        #[arg(long, value_name = "JSON")]
        with: Option<String>,
    },
    /// Send a leased task to dead.
    DeadLetter {
        /// The claim.
        claim: ClaimString,
        /// Why.
        #[arg(long)]
        error: String,
    },
    /// Read and list tasks.
    #[command(subcommand)]
    Task(TaskCommand),
    /// Wait until tasks finish (done, dead or cancelled); exits 1 if some did not in time.
    Wait {
        /// Task ids.
        #[arg(required = true)]
        ids: Vec<String>,
        /// Longest wait.
        #[arg(long, value_parser = duration, default_value = "60s")]
        timeout: Duration,
    },
    /// Print a task's output: text chunks as they were emitted, JSON chunks one per
    /// line (`--json`: every chunk as a JSON line with its number and time). With
    /// `-f`, keep following: new chunks as they are stored, until the task finishes;
    /// across a lost connection, a restart or a failover it goes on from its last
    /// chunk, with no gap and no duplicate (it gives up after 60 s without the daemon).
    /// Chunks dropped to keep the task within its output limit are reported on stderr.
    /// Exits 1 if the task is removed (retention, purge) before its end was read.
    Tail {
        /// Task id.
        id: String,
        /// Follow until the task finishes.
        #[arg(short = 'f', long)]
        follow: bool,
        /// The first chunk to print (0 is the task's first).
        #[arg(long, default_value_t = 0)]
        from: u64,
    },
    /// Cancel a task: at once if waiting, at its settle if leased.
    Cancel {
        /// Task id.
        id: String,
    },
    /// List a queue's dead tasks.
    Dead {
        /// The queue.
        queue: String,
    },
    /// Make dead tasks ready again, with failures reset.
    Redrive(DeadArgs),
    /// Remove dead tasks; `--all` asks for confirmation (or `--yes`).
    Discard {
        /// Which dead tasks.
        #[command(flatten)]
        selection: DeadArgs,
        /// Do not ask: remove every dead task even without a terminal to confirm on.
        #[arg(long)]
        yes: bool,
    },
    /// Counts per queue and state, what happened since the daemon started, and the
    /// daemon's group commit. With --json, one object per line, each with a `kind`:
    /// `queue` (the fields of `queue describe --json`), then `daemon`.
    Stats {
        /// Only this queue.
        queue: Option<String>,
    },
    /// List members: name, connected, leases/capacity, draining, labels.
    Members,
    /// Inspect or drain one member.
    #[command(subcommand)]
    Member(MemberCommand),
    /// Act on one lease.
    #[command(subcommand)]
    Lease(LeaseCommand),
    /// Maintenance of the daemon (snapshot), and tokens for its config file.
    #[command(subcommand)]
    Admin(AdminCommand),
    /// A high-availability cluster of musterd nodes: its status, adding and removing
    /// nodes (admin).
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Run any program as an agent: one process per task, payload on stdin.
    Work(WorkArgs),
    /// The benchmark of BENCHMARKS.md against a daemon it starts: a table, and JSON.
    Bench(BenchArgs),
    /// A live swarm on the daemon to watch: a producer and four agents on queue `demo`.
    Demo {
        /// Tasks enqueued per second.
        #[arg(long, default_value_t = 2.0)]
        rate: f64,
    },
    /// The operator's console: watch queues, tasks, members, dead letters and schedules
    /// live, and repair them (redrive, discard, cancel, revoke, pause, drain).
    Tui {
        /// Look only: every verb is removed.
        #[arg(long)]
        readonly: bool,
    },
    /// Serve muster as tools to an MCP client (an LLM agent, a coding assistant): over
    /// stdio, or streamable HTTP with `--http`. It acts with this command's token and
    /// connection settings, and lists only the tools the token may use (as the daemon's
    /// reply to its hello says). Tools: enqueue, get_task, wait_tasks, find_tasks, list_queues,
    /// list_members, cancel_task, redrive, discard, list_suspended, resume_task,
    /// reject_task, tail_output; cancel, reject and discard need `"confirm": true`.
    Mcp(McpArgs),
    /// Keep several daemons by name: `context add prod --addr HOST:PORT --pin SHA256`,
    /// then `--context prod`, `MUSTER_CONTEXT=prod` or `context use prod`.
    #[command(subcommand)]
    Context(ContextCommand),
    /// Print a shell's completion script for muster: `muster completions bash >
    /// /etc/bash_completion.d/muster`, `muster completions zsh > "${fpath[1]}/_muster"`,
    /// `muster completions fish > ~/.config/fish/completions/muster.fish`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print muster's man page (roff), or a subcommand's (`muster man queue create`):
    /// `muster man > ~/.local/share/man/man1/muster.1`; `--dir` writes them all.
    Man {
        /// The subcommand whose page to print, e.g. `queue create`; muster's own page
        /// without one.
        subcommand: Vec<String>,
        /// Write every page into DIR instead (muster.1, muster-enqueue.1,
        /// muster-queue-create.1, …), printing the path of each file written:
        /// `muster man --dir ~/.local/share/man/man1`.
        #[arg(long, conflicts_with = "subcommand")]
        dir: Option<std::path::PathBuf>,
    },
    /// The guardian `muster work` starts for itself: kills the process groups named on
    /// stdin (`+PGID` holds, `-PGID` lets go) when stdin ends, then removes DIR. Refuses
    /// at once a DIR that is not the runner's private directory (a directory of this
    /// user named muster-work-*, mode 0700 or 0711, not a symbolic link).
    #[command(hide = true)]
    Guard {
        /// The runner's private directory, removed at the end.
        #[arg(long)]
        dir: std::path::PathBuf,
    },
}

/// Arguments of `mcp`.
#[derive(Debug, Args)]
pub struct McpArgs {
    /// Serve streamable HTTP on IP:PORT (at path /mcp; port 0 picks one, and the URL is
    /// printed on stdout) instead of stdio, until SIGINT or SIGTERM. Only a loopback
    /// address unless --http-allow-remote: whoever reaches the port acts with this
    /// server's token.
    #[arg(long, value_name = "IP:PORT")]
    pub http: Option<String>,
    /// With --http: serve a non-loopback address too. Anyone who can reach it and
    /// holds the bearer token acts with this server's muster token, over plain HTTP.
    #[arg(long, requires = "http")]
    pub http_allow_remote: bool,
    /// With --http (required there): a file holding the bearer token clients must send
    /// (`Authorization: Bearer TOKEN`), since every local user can reach a loopback
    /// port. Refused if users other than its owner may write it.
    #[arg(long, value_name = "FILE", requires = "http")]
    pub http_token_file: Option<PathBuf>,
}

/// Context subcommands.
#[derive(Debug, Subcommand)]
pub enum ContextCommand {
    /// Add (or replace) a context from the connection options given with it (`--addr`,
    /// and `--pin`, `--ca` or `--data`, and `--token-file`: its path is kept, never a
    /// token); the first one added becomes current.
    Add {
        /// The context's name: [A-Za-z0-9._-]{1,64}.
        name: String,
    },
    /// List contexts: name, current, address, trust (and token file).
    List,
    /// Make a context current.
    Use {
        /// The context.
        name: String,
    },
    /// Remove a context.
    Remove {
        /// The context.
        name: String,
    },
}

/// Arguments of `bench` (written into its JSON file as they were given).
#[derive(Debug, Args, serde::Serialize)]
pub struct BenchArgs {
    /// Phases, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "all")]
    pub phase: Vec<BenchPhase>,
    /// Runs (each on a fresh daemon); the table shows medians and spread.
    #[arg(long, default_value_t = 1, value_parser = at_least_one)]
    pub runs: usize,
    /// Tasks enqueued and drained.
    #[arg(long, default_value_t = 100_000, value_parser = at_least_one)]
    pub tasks: usize,
    /// Producers in the enqueue phase.
    #[arg(long, default_value_t = 4, value_parser = at_least_one)]
    pub producers: usize,
    /// Unconfirmed enqueues each producer keeps in flight.
    #[arg(long, default_value_t = 256, value_parser = at_least_one)]
    pub window: usize,
    /// Workers in the drain and latency phases.
    #[arg(long, default_value_t = 8, value_parser = at_least_one)]
    pub workers: usize,
    /// Tasks each worker holds at once.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..))]
    pub prefetch: u32,
    /// Enqueues per second in the latency phase (1 to 1,000,000).
    #[arg(long, default_value_t = 2000.0, value_parser = bench_rate)]
    pub rate: f64,
    /// Length of the latency and members phases, in seconds (1 to 86,400).
    #[arg(long, default_value_t = 10.0, value_parser = bench_seconds)]
    pub seconds: f64,
    /// Sequential round trips.
    #[arg(long, default_value_t = 5000, value_parser = at_least_one)]
    pub roundtrips: usize,
    /// Children the `fanout` phase's parent spawns (1 to 1,000: a parent's most).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub children: u32,
    /// Tasks emitting output in the `output` phase (each followed live).
    #[arg(long, default_value_t = 100, value_parser = at_least_one)]
    pub emitters: usize,
    /// Chunks each emitter emits a second in the `output` phase.
    #[arg(long, default_value_t = 1000.0, value_parser = bench_rate)]
    pub chunk_rate: f64,
    /// Tasks stored for the startup phase.
    #[arg(long, default_value_t = 1_000_000, value_parser = at_least_one)]
    pub stored: usize,
    /// Members renewing a lease every second (the daemon the benchmark starts admits
    /// that many connections and a few hundred more).
    #[arg(long, default_value_t = 1000, value_parser = at_least_one)]
    pub members: usize,
    /// Tokens a second of the `limited` phase's limit.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub limit_rate: u64,
    /// The burst of the `limited` phase's limit: the most tokens its bucket holds (10:
    /// 20 ms of tokens at 500 a second, what a dispatcher round may take to hand them out).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub limit_burst: u64,
    /// Agents of the `limited` phase.
    #[arg(long, default_value_t = 20, value_parser = at_least_one)]
    pub limit_agents: usize,
    /// Groups of the `fair` phase's second queue.
    #[arg(long, default_value_t = 10_000, value_parser = at_least_one)]
    pub fair_groups: usize,
    /// Keys of the `limit-cost` phase's per-key limit.
    #[arg(long, default_value_t = 100_000, value_parser = at_least_one)]
    pub limit_keys: usize,
    /// No-op tasks of the `burndown` phase: enqueued first, then worked by `--workers`.
    #[arg(long, default_value_t = 1_000_000, value_parser = at_least_one)]
    pub burn_tasks: usize,
    /// The musterd binary (default: next to this muster binary).
    #[arg(long)]
    pub musterd: Option<PathBuf>,
    /// The daemon's durability.
    #[arg(long, value_enum, default_value_t = BenchDurability::Sync)]
    pub durability: BenchDurability,
    /// Where every figure of every run is written (JSON).
    #[arg(long, default_value = "bench.json")]
    pub out: PathBuf,
    /// Append every started daemon's log (JSON lines) to this file: slow rounds and
    /// what else the daemon said during the runs.
    #[arg(long)]
    pub daemon_log: Option<PathBuf>,
}

/// A phase of `bench`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BenchPhase {
    /// Every phase.
    All,
    /// Producers enqueue `--tasks` tasks.
    Enqueue,
    /// Workers take and ack every task (enqueued first if `enqueue` is not asked for).
    Drain,
    /// Enqueue-to-delivery latency at `--rate` with the workers running.
    Latency,
    /// Strictly sequential enqueue, push, ack.
    Roundtrip,
    /// Strictly sequential push, suspend, resume, push again, ack (`--roundtrips`).
    Suspend,
    /// One parent spawns `--children` children and waits; `--workers` drain them; the
    /// parent is delivered again (`--runs` times).
    Fanout,
    /// `--emitters` tasks each emitting `--chunk-rate` chunks a second for `--seconds`,
    /// each followed live.
    Output,
    /// A restart with `--stored` tasks in the store.
    Startup,
    /// `--members` members renewing a lease every second.
    Members,
    /// `--limit-agents` agents on three queues sharing one limit of `--limit-rate` a
    /// second.
    Limited,
    /// A fair queue: one group's wait behind another's backlog of `--tasks`.
    Fair,
    /// `--tasks` tasks drawing on a per-key limit with `--limit-keys` keys, drained.
    LimitCost,
    /// `--burn-tasks` no-op tasks enqueued, then worked by `--workers` (River's and
    /// Oban's method).
    Burndown,
}

/// The durability `bench` starts its daemons with.
#[derive(Debug, Clone, Copy, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BenchDurability {
    /// Every reply after an fdatasync.
    Sync,
    /// Every reply after a write to the operating system.
    Buffered,
}

/// A count of at least one.
fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("{s:?} is not a count: {e}")),
    }
}

/// `bench --rate`: 1 to 1,000,000 a second (so the latency phase, of at least a
/// second, enqueues at least one task).
fn bench_rate(s: &str) -> Result<f64, String> {
    between(s, 1.0, 1_000_000.0)
}

/// `bench --seconds`: 1 s to a day.
/// `cluster add --catch-up`: 1 ms to [`muster_protocol::limits::MAX_CLUSTER_CATCH_UP`].
fn catch_up(s: &str) -> Result<Duration, String> {
    let d = duration(s)?;
    let max = muster_protocol::limits::MAX_CLUSTER_CATCH_UP;
    if d < Duration::from_millis(1) || d > max {
        return Err(format!("must be from 1ms to {}s", max.as_secs()));
    }
    Ok(d)
}

fn bench_seconds(s: &str) -> Result<f64, String> {
    between(s, 1.0, 86_400.0)
}

fn between(s: &str, min: f64, max: f64) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (min..=max).contains(&v) => Ok(v),
        Ok(_) => Err(format!("must be from {min} to {max}")),
        Err(e) => Err(format!("{s:?} is not a number: {e}")),
    }
}

/// `muster admin token`.
#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Print a new random token (256 bits, hex), its SHA-256 and a config entry that
    /// holds only the SHA-256.
    New {
        /// The principal's name in the config entry.
        #[arg(long, default_value = "new-token")]
        name: String,
        /// The roles in the config entry (produce, consume, approve, admin).
        #[arg(long, value_delimiter = ',', default_value = "consume")]
        roles: Vec<TokenRole>,
    },
}

/// A role in a generated config entry.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum TokenRole {
    /// Enqueue, read tasks, wait, cancel.
    Produce,
    /// Member sessions, claim, renew, settle.
    Consume,
    /// Resume (by token or task id) and cancel suspended tasks, read tasks.
    Approve,
    /// Everything.
    Admin,
}

/// What `muster work` makes of a program's stdout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StdoutUse {
    /// The task's result.
    Result,
    /// The task's live output.
    Stream,
}

/// What a suspension's timeout does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TimeoutAction {
    /// Ready again; its next holder sees `timed_out`.
    Resume,
    /// Dead (reason `suspend_timed_out`), for a redrive or discard.
    Fail,
    /// Cancelled.
    Cancel,
}

impl From<TimeoutAction> for muster_sdk::OnTimeout {
    fn from(a: TimeoutAction) -> Self {
        match a {
            TimeoutAction::Resume => muster_sdk::OnTimeout::Resume,
            TimeoutAction::Fail => muster_sdk::OnTimeout::Fail,
            TimeoutAction::Cancel => muster_sdk::OnTimeout::Cancel,
        }
    }
}

/// Member subcommands.
#[derive(Debug, Subcommand)]
pub enum MemberCommand {
    /// Show a member and the tasks it holds.
    Describe {
        /// The member.
        name: String,
    },
    /// Drain a member: it finishes what it holds and takes nothing new.
    Drain {
        /// The member.
        name: String,
    },
    /// End a member's drain: it gets work again (an agent that stopped at the drain
    /// stays stopped; one that kept its session, or resumes it, is served again).
    Undrain {
        /// The member.
        name: String,
    },
    /// Free a member name from the token that first used it, so another token may use
    /// it (the member must have no session and no lease).
    Release {
        /// The member.
        name: String,
    },
}

/// Lease subcommands.
#[derive(Debug, Subcommand)]
pub enum LeaseCommand {
    /// Revoke a task's lease: it lapses now (one failure) and its holder is told.
    Revoke {
        /// The leased task's id.
        id: String,
    },
}

/// `muster admin` subcommands.
#[derive(Debug, Subcommand)]
pub enum AdminCommand {
    /// Write a consistent copy of the live store into DIR on the daemon's host (a new
    /// directory inside its snapshot root, `musterd --snapshot-root`, by default
    /// `backups` in its data directory): a backup, opened by a daemon as its data
    /// directory's `store`. Prints DIR, then the tasks and queues it holds.
    Snapshot {
        /// Where, on the daemon's host: a name inside the snapshot root, or an absolute
        /// path inside it.
        dir: String,
    },
    /// Tokens for the daemon's config file (needs no daemon).
    #[command(subcommand)]
    Token(TokenCommand),
}

/// `muster cluster` subcommands.
#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// The cluster as a node sees it: its id, the node, its role, term and leader, then
    /// one line per member (node, client address, cluster address, voter or learner,
    /// the last log index the leader knows it holds). With one --addr, that node's own
    /// view; with several, the leader's.
    Status,
    /// Add node ID to the cluster (on the leader): it joins as a learner, catches up
    /// with the log (the leader waits up to 60 s), then votes unless --learner; adding a
    /// learner again promotes it. Prints the cluster's status afterwards.
    Add {
        /// The new node's id (its `musterd --node-id`).
        id: u64,
        /// The address clients reach the node at, HOST:PORT.
        #[arg(long, value_name = "HOST:PORT")]
        node_addr: String,
        /// The address the other nodes reach it at, HOST:PORT.
        #[arg(long, value_name = "HOST:PORT")]
        cluster_addr: String,
        /// Keep it a learner: it copies the log but does not vote.
        #[arg(long)]
        learner: bool,
        /// Longest to wait for the node to catch up before making it a voter (up to
        /// 1h); a node that has not caught up by then stays a learner and the command
        /// fails.
        #[arg(long, value_parser = catch_up, default_value = "60s")]
        catch_up: Duration,
    },
    /// Remove node ID from the cluster (on the leader). Prints the cluster's status
    /// afterwards.
    Remove {
        /// The node's id.
        id: u64,
    },
}

/// Arguments of `work`.
#[derive(Debug, Args)]
pub struct WorkArgs {
    /// The queue to take tasks from.
    pub queue: String,
    /// The stable member name; a restart under the same name reclaims its tasks.
    #[arg(long)]
    pub member: String,
    /// Most tasks run at once.
    #[arg(long, default_value_t = 1)]
    pub capacity: u32,
    /// The agent's labels, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub labels: Vec<String>,
    /// Time between SIGTERM and SIGKILL whenever a program is stopped: on a drain
    /// (SIGTERM to muster work, or an operator's drain), a cancel, a lost or revoked
    /// lease. A program that exits 0 within it acks its task; any other end releases it.
    #[arg(long, value_parser = duration, default_value = "25s")]
    pub grace: Duration,
    /// How long the daemon may not hear from this runner before it counts it
    /// unreachable and gives it nothing new (2s to 60s).
    #[arg(long, value_parser = duration, default_value = "5s")]
    pub liveness: Duration,
    /// Run the program as this user (a name or a numeric uid), with that user's primary
    /// group and no supplementary groups, so that it can read neither the runner's
    /// token nor its files. Needs root (or CAP_SETUID, CAP_SETGID, CAP_KILL, CAP_CHOWN
    /// and CAP_DAC_OVERRIDE).
    #[arg(long, value_name = "USER")]
    pub user: Option<String>,
    /// What the program's stdout is: the task's result (acked on exit 0), or the
    /// task's live output (`stream`: each read a text chunk, followed with `muster tail
    /// -f`; the ack carries no result).
    #[arg(long, value_enum, default_value_t = StdoutUse::Result)]
    pub output: StdoutUse,
    /// The program and its arguments.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

/// Queue subcommands.
#[derive(Debug, Subcommand)]
pub enum QueueCommand {
    /// Create a queue.
    Create {
        /// Queue name: [a-z0-9][a-z0-9._-]{0,127}.
        name: String,
        /// Options.
        #[command(flatten)]
        options: QueueOptionArgs,
    },
    /// List queues with their counts.
    List,
    /// Show a queue's options and counts.
    Describe {
        /// The queue.
        name: String,
    },
    /// Change a queue's options.
    Update {
        /// The queue.
        name: String,
        /// Options to change.
        #[command(flatten)]
        options: QueueOptionArgs,
    },
    /// Stop handing out a queue's tasks (enqueues still land).
    Pause {
        /// The queue.
        name: String,
    },
    /// Resume a paused queue.
    Resume {
        /// The queue.
        name: String,
    },
    /// Remove every ready and scheduled task; asks for confirmation if there are any.
    Purge {
        /// The queue.
        name: String,
        /// Do not ask (needed without a terminal when the queue holds such tasks).
        #[arg(long)]
        yes: bool,
    },
    /// Delete a queue and all its tasks; asks for confirmation if it holds any.
    Delete {
        /// The queue.
        name: String,
        /// Do not ask (needed without a terminal when the queue holds tasks).
        #[arg(long)]
        yes: bool,
    },
}

/// Limit subcommands.
#[derive(Debug, Subcommand)]
pub enum LimitCommand {
    /// Create a limit or replace its settings (at once for the tasks waiting on it).
    Set {
        /// Limit name: [a-z0-9][a-z0-9._-]{0,127}.
        name: String,
        /// Its settings: a rate, a concurrency, or both.
        #[command(flatten)]
        spec: LimitArgs,
    },
    /// Show a limit: its settings, leases held, tasks waiting and its busiest keys.
    Get {
        /// The limit.
        name: String,
    },
    /// List limits.
    List,
    /// Delete a limit: the tasks that name it no longer wait on it.
    Delete {
        /// The limit.
        name: String,
    },
}

/// A limit's settings.
#[derive(Debug, Args)]
pub struct LimitArgs {
    /// Tokens added over time, N per period: `500/min`, `10/s`, `1000/h`, `3/10s`.
    #[arg(long, value_parser = rate)]
    pub rate: Option<Rate>,
    /// Most tokens the bucket holds [default: the rate's N].
    #[arg(long)]
    pub burst: Option<u64>,
    /// Most leases held at once.
    #[arg(long)]
    pub concurrency: Option<u32>,
    /// Every key gets its own bucket and count with these settings.
    #[arg(long)]
    pub per_key: bool,
}

/// A rate `N/PERIOD`: `N` tokens every `PERIOD` (`s`, `min`, `h`, or a duration such
/// as `10s`).
pub fn rate(s: &str) -> Result<Rate, String> {
    let bad = || format!("invalid rate {s:?}: want N/PERIOD, e.g. 500/min, 10/s, 3/10s");
    let (count, period) = s.split_once('/').ok_or_else(bad)?;
    let count: u64 = count.trim().parse().map_err(|_| bad())?;
    let period = period.trim();
    let period = if period.starts_with(|c: char| c.is_ascii_digit()) {
        duration(period)?
    } else {
        duration(&format!("1{period}")).map_err(|_| bad())?
    };
    let per_ms = u64::try_from(period.as_millis()).map_err(|_| bad())?;
    Ok(Rate { count, per_ms })
}

/// A limit a task draws on: `NAME[:KEY[:COST]]` (a key holding `:` is written with its
/// cost).
pub fn limit_use(s: &str) -> Result<LimitUse, String> {
    let parts: Vec<&str> = s.split(':').collect();
    let bad = |why: &str| format!("invalid limit {s:?}: {why}; want NAME[:KEY[:COST]]");
    let (limit, key, cost) = match parts.as_slice() {
        [name] => (*name, None, None),
        [name, key] => (*name, Some((*key).to_owned()), None),
        [name, key @ .., cost] => {
            let cost: u64 = cost.parse().map_err(|_| bad("the cost is not a number"))?;
            (*name, Some(key.join(":")), Some(cost))
        }
        [] => return Err(bad("empty")),
    };
    if limit.is_empty() {
        return Err(bad("no name"));
    }
    Ok(LimitUse {
        limit: limit.to_owned(),
        key: key.filter(|k| !k.is_empty()),
        cost,
    })
}

/// Queue options for create and update.
#[derive(Debug, Args)]
pub struct QueueOptionArgs {
    /// Lease granted by a claim that asks for none.
    #[arg(long, value_parser = duration)]
    pub lease: Option<Duration>,
    /// Failures after which a task goes to dead (0: unlimited).
    #[arg(long)]
    pub max_attempts: Option<u32>,
    /// How long done and cancelled tasks are kept.
    #[arg(long, value_parser = duration)]
    pub retention: Option<Duration>,
    /// Most tasks of one key leased at once.
    #[arg(long)]
    pub key_concurrency: Option<u32>,
    /// Longest one delivery may be renewed for (0s: no bound).
    #[arg(long, value_parser = duration)]
    pub max_runtime: Option<Duration>,
    /// First retry delay of the backoff.
    #[arg(long, value_parser = duration)]
    pub backoff_base: Option<Duration>,
    /// Longest retry delay of the backoff.
    #[arg(long, value_parser = duration)]
    pub backoff_cap: Option<Duration>,
    /// Growth of the retry delay per failure.
    #[arg(long)]
    pub backoff_factor: Option<f64>,
    /// Random spread of the retry delay, 0 to 1.
    #[arg(long)]
    pub backoff_jitter: Option<f64>,
    /// Fair dispatch between task groups (`true`), or plain enqueue order (`false`).
    #[arg(long)]
    pub fair: Option<bool>,
    /// A group's weight in fair dispatch, `GROUP=WEIGHT` (1 to 1000; 1, the default,
    /// takes the group's entry out); repeat for several.
    #[arg(long = "group-weight", value_parser = group_weight)]
    pub group_weights: Vec<(String, u32)>,
}

/// Parses `GROUP=WEIGHT`.
fn group_weight(text: &str) -> Result<(String, u32), String> {
    let (group, weight) = text
        .rsplit_once('=')
        .ok_or_else(|| format!("{text:?} is not GROUP=WEIGHT"))?;
    let weight = weight
        .parse()
        .map_err(|_| format!("weight {weight:?} is not a whole number"))?;
    Ok((group.to_owned(), weight))
}

/// Arguments of `enqueue`.
#[derive(Debug, Args)]
pub struct EnqueueArgs {
    /// The queue.
    pub queue: String,
    /// The JSON payload, or `-` for one payload per stdin line.
    pub payload: String,
    /// The task's options.
    #[command(flatten)]
    pub task: TaskArgs,
    /// Not before this time (RFC 3339, e.g. 2026-12-01T08:00:00Z).
    #[arg(long, value_parser = humantime::parse_rfc3339_weak)]
    pub at: Option<std::time::SystemTime>,
    /// Enqueue at most once under this key. With PAYLOAD `-`, a template giving each
    /// line its own key from a field of its payload: `{/json/pointer}` stands for the
    /// string or number there, e.g. 'order-{/order_id}'.
    #[arg(long)]
    pub idempotency_key: Option<String>,
}

/// A task's options, as `enqueue` and `schedule set` take them.
#[derive(Debug, Args)]
pub struct TaskArgs {
    /// Tasks sharing a key run in order, `key_concurrency` at a time.
    #[arg(long)]
    pub key: Option<String>,
    /// 0 to 9, higher first.
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=i64::from(muster_protocol::limits::MAX_PRIORITY)))]
    pub priority: Option<u8>,
    /// Not before this long after it is enqueued.
    #[arg(long, value_parser = duration)]
    pub delay: Option<Duration>,
    /// Labels a member must carry, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub requires: Vec<String>,
    /// A limit the task draws on, `NAME[:KEY[:COST]]`; repeat for several (at most 4).
    #[arg(long = "limit", value_parser = limit_use)]
    pub limits: Vec<LimitUse>,
    /// The task's group (tenant, customer) for a queue with fair dispatch.
    #[arg(long)]
    pub group: Option<String>,
}

/// Schedule subcommands.
#[derive(Debug, Subcommand)]
pub enum ScheduleCommand {
    /// Create a schedule or replace its settings: each time its cron pattern names, one
    /// task is enqueued into its queue (idempotency key `schedule:NAME:FIRE_MS`).
    Set(Box<ScheduleSetArgs>),
    /// Show a schedule: its settings, its task, when it fires next and what its fires
    /// did.
    Get {
        /// The schedule.
        name: String,
    },
    /// List schedules (those of the queues the token covers), by name.
    List,
    /// Pause a schedule: it does not fire until resumed.
    Pause {
        /// The schedule.
        name: String,
    },
    /// Resume a paused schedule: it fires from its next time after now (the times
    /// passed while paused do not fire).
    Resume {
        /// The schedule.
        name: String,
    },
    /// Delete a schedule; the tasks it enqueued stay.
    Delete {
        /// The schedule.
        name: String,
    },
    /// Enqueue the schedule's task now, once, paused or not (its fires go on as
    /// before); prints the task's id.
    RunNow {
        /// The schedule.
        name: String,
    },
}

/// Arguments of `schedule set`.
#[derive(Debug, Args)]
pub struct ScheduleSetArgs {
    /// Schedule name: [a-z0-9][a-z0-9._-]{0,99}.
    pub name: String,
    /// The cron pattern: five fields (minute, hour, day of month, month, day of week),
    /// or six with seconds first; `@hourly`, `@daily`, `@weekly`, `@monthly`,
    /// `@yearly`, and `L`, `#` and `W` are accepted, e.g. '*/5 * * * *', '0 9 * * MON-FRI'.
    #[arg(long)]
    pub cron: String,
    /// The IANA time zone the pattern is read in, e.g. Europe/Berlin [default: UTC].
    #[arg(long)]
    pub tz: Option<String>,
    /// The queue each fire enqueues into (it must exist).
    #[arg(long)]
    pub queue: String,
    /// The JSON payload of each task.
    #[arg(long)]
    pub payload: String,
    /// The options of each task.
    #[command(flatten)]
    pub task: TaskArgs,
    /// What fires missed by more than 60 s (the daemon was down) do; a fire late by
    /// less fires anyway [default: skip].
    #[arg(long, value_enum)]
    pub catch_up: Option<CatchUpPolicy>,
    /// Create it paused (a replaced schedule keeps its pause without it); `schedule
    /// resume` starts it.
    #[arg(long)]
    pub paused: bool,
}

/// What a schedule does with the fires it missed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CatchUpPolicy {
    /// Missed fires enqueue nothing; the schedule goes on with its next fire.
    Skip,
    /// The latest missed fire enqueues one task, standing for every missed one.
    Once,
}

impl From<CatchUpPolicy> for CatchUp {
    fn from(p: CatchUpPolicy) -> Self {
        match p {
            CatchUpPolicy::Skip => CatchUp::Skip,
            CatchUpPolicy::Once => CatchUp::Once,
        }
    }
}

/// Arguments of `claim`.
#[derive(Debug, Args)]
pub struct ClaimArgs {
    /// Queues to take from, round robin.
    #[arg(required = true)]
    pub queues: Vec<String>,
    /// Most tasks to lease.
    #[arg(long, default_value_t = 1)]
    pub max: u32,
    /// How long to wait for a first task.
    #[arg(long, value_parser = duration, default_value = "0s")]
    pub wait: Duration,
    /// The member the leases belong to.
    #[arg(long)]
    pub member: Option<String>,
    /// The claimer's labels, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub labels: Vec<String>,
    /// Lease to ask for (default: the queue's).
    #[arg(long, value_parser = duration)]
    pub lease: Option<Duration>,
}

/// Task subcommands.
#[derive(Debug, Subcommand)]
pub enum TaskCommand {
    /// Show a whole task.
    Get {
        /// Task id.
        id: String,
    },
    /// List a queue's tasks in one state, oldest first.
    List {
        /// The queue.
        queue: String,
        /// scheduled, ready, leased, suspended, done, dead or cancelled.
        #[arg(long, default_value = "ready")]
        state: String,
        /// Most tasks to list.
        #[arg(long, default_value_t = 100)]
        limit: u32,
        /// Start after this task id.
        #[arg(long)]
        after: Option<String>,
    },
    /// Search tasks across a queue, or every queue, by what they hold. Every filter
    /// given must match; the daemon examines a bounded amount per request and the
    /// search goes on until LIMIT matches are printed or every task was examined.
    Find(Box<FindArgs>),
    /// Change the priority of a ready or scheduled task (its place in dispatch order).
    Update {
        /// Task id.
        id: String,
        /// The new priority, 0 to 9, higher first.
        #[arg(long, value_parser = clap::value_parser!(u8).range(0..=i64::from(muster_protocol::limits::MAX_PRIORITY)))]
        priority: u8,
    },
    /// Make a scheduled task ready now, without waiting for its time.
    RunNow {
        /// Task id.
        id: String,
    },
}

/// Arguments of `task find`.
#[derive(Debug, Args)]
pub struct FindArgs {
    /// The queue (default: every queue).
    pub queue: Option<String>,
    /// Only tasks in this state: scheduled, ready, leased, suspended, done, dead or
    /// cancelled.
    #[arg(long)]
    pub state: Option<String>,
    /// Only tasks whose id starts with this.
    #[arg(long = "id", value_name = "PREFIX")]
    pub id_prefix: Option<String>,
    /// Only tasks with this key.
    #[arg(long)]
    pub key: Option<String>,
    /// Only the task with this idempotency key.
    #[arg(long)]
    pub idempotency_key: Option<String>,
    /// Only tasks that require this label.
    #[arg(long)]
    pub label: Option<String>,
    /// Only tasks whose last error contains this text (ASCII case-insensitive).
    #[arg(long, value_name = "TEXT")]
    pub error: Option<String>,
    /// Only tasks whose payload's JSON text contains this text.
    #[arg(long, value_name = "TEXT")]
    pub payload: Option<String>,
    /// Only tasks whose payload has this value at this dotted path, e.g.
    /// `order.id=42` or `customer="acme"` (a value that is not JSON is a string).
    #[arg(long, value_name = "PATH=VALUE", value_parser = field_match)]
    pub field: Option<muster_protocol::ops::FieldMatch>,
    /// Newest first.
    #[arg(long)]
    pub newest: bool,
    /// Most tasks to print.
    #[arg(long, default_value_t = 100)]
    pub limit: u32,
}

/// `PATH=VALUE`, the value as JSON if it parses and as a string if not.
fn field_match(s: &str) -> Result<muster_protocol::ops::FieldMatch, String> {
    let (path, value) = s
        .split_once('=')
        .ok_or_else(|| format!("invalid field {s:?}: want PATH=VALUE"))?;
    let value = serde_json::from_str(value).unwrap_or_else(|_| value.into());
    Ok(muster_protocol::ops::FieldMatch {
        path: path.into(),
        value,
    })
}

/// Selection of dead tasks for redrive and discard.
#[derive(Debug, Args)]
pub struct DeadArgs {
    /// The queue.
    pub queue: String,
    /// Dead task ids.
    #[arg(required_unless_present = "all", conflicts_with = "all")]
    pub ids: Vec<String>,
    /// Every dead task of the queue.
    #[arg(long)]
    pub all: bool,
    /// Only list what would be affected.
    #[arg(long)]
    pub dry_run: bool,
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        super::Cli::command().debug_assert();
    }

    #[test]
    fn cluster_commands_parse() {
        use super::{Cli, ClusterCommand, Command};
        use clap::Parser;
        let cli = Cli::try_parse_from([
            "muster",
            "--addr",
            "a:1,b:2",
            "cluster",
            "add",
            "3",
            "--node-addr",
            "c:7420",
            "--cluster-addr",
            "c:7421",
            "--learner",
        ])
        .unwrap();
        assert_eq!(cli.global.addr.as_deref(), Some("a:1,b:2"));
        match cli.command {
            Command::Cluster(ClusterCommand::Add {
                id,
                node_addr,
                cluster_addr,
                learner,
                catch_up,
            }) => assert_eq!(
                (
                    id,
                    node_addr.as_str(),
                    cluster_addr.as_str(),
                    learner,
                    catch_up
                ),
                (
                    3,
                    "c:7420",
                    "c:7421",
                    true,
                    std::time::Duration::from_secs(60)
                )
            ),
            other => panic!("{other:?}"),
        }
        for (given, error) in [
            ("0s", "must be from 1ms to 3600s"),
            ("2h", "must be from 1ms to 3600s"),
        ] {
            let refused = Cli::try_parse_from([
                "muster",
                "cluster",
                "add",
                "3",
                "--node-addr",
                "c:1",
                "--cluster-addr",
                "c:2",
                "--catch-up",
                given,
            ])
            .expect_err("out of range");
            assert!(refused.to_string().contains(error), "{refused}");
        }
        let remove = Cli::try_parse_from(["muster", "cluster", "remove", "2"]).unwrap();
        assert!(matches!(
            remove.command,
            Command::Cluster(ClusterCommand::Remove { id: 2 })
        ));
        let status = Cli::try_parse_from(["muster", "cluster", "status", "--json"]).unwrap();
        assert!(status.global.json);
        assert!(matches!(
            status.command,
            Command::Cluster(ClusterCommand::Status)
        ));
        // Both addresses are required to add a node.
        assert!(
            Cli::try_parse_from(["muster", "cluster", "add", "3", "--node-addr", "c:1"]).is_err()
        );
        assert!(Cli::try_parse_from(["muster", "cluster", "remove", "x"]).is_err());
    }

    #[test]
    fn schedule_commands_parse_with_the_task_options_of_enqueue() {
        use super::{CatchUpPolicy, Cli, Command, EnqueueArgs, ScheduleCommand};
        use clap::Parser;
        let parse = |args: &[&str]| {
            Cli::try_parse_from(["muster", "schedule"].iter().chain(args)).map(|cli| cli.command)
        };
        let set = parse(&[
            "set",
            "nightly",
            "--cron",
            "0 2 * * *",
            "--tz",
            "Europe/Berlin",
            "--queue",
            "reports",
            "--payload",
            r#"{"report":"daily"}"#,
            "--priority",
            "7",
            "--key",
            "nightly",
            "--requires",
            "gpu,big",
            "--limit",
            "openai::3",
            "--group",
            "acme",
            "--delay",
            "30s",
            "--catch-up",
            "once",
            "--paused",
        ])
        .unwrap();
        let Command::Schedule(ScheduleCommand::Set(args)) = set else {
            panic!("{set:?}")
        };
        assert_eq!(
            (args.name.as_str(), args.cron.as_str(), args.tz.as_deref()),
            ("nightly", "0 2 * * *", Some("Europe/Berlin"))
        );
        assert_eq!(
            (args.queue.as_str(), args.payload.as_str()),
            ("reports", r#"{"report":"daily"}"#)
        );
        assert_eq!(
            (args.catch_up, args.paused),
            (Some(CatchUpPolicy::Once), true)
        );
        let t = &args.task;
        assert_eq!((t.priority, t.key.as_deref()), (Some(7), Some("nightly")));
        assert_eq!(
            (t.requires.join(","), t.group.as_deref()),
            ("gpu,big".into(), Some("acme"))
        );
        assert_eq!(t.delay, Some(std::time::Duration::from_secs(30)));
        assert_eq!(
            (t.limits[0].limit.as_str(), t.limits[0].cost),
            ("openai", Some(3))
        );
        // Only what is needed: no zone, catch-up or pause unless given.
        let Command::Schedule(ScheduleCommand::Set(bare)) = parse(&[
            "set",
            "n",
            "--cron",
            "@hourly",
            "--queue",
            "q",
            "--payload",
            "{}",
        ])
        .unwrap() else {
            panic!("a schedule set")
        };
        assert_eq!((bare.tz, bare.catch_up, bare.paused), (None, None, false));
        // The other subcommands name a schedule.
        for (sub, check) in [
            (
                "get",
                (|c| matches!(c, ScheduleCommand::Get { name } if name == "n"))
                    as fn(ScheduleCommand) -> bool,
            ),
            (
                "pause",
                |c| matches!(c, ScheduleCommand::Pause { name } if name == "n"),
            ),
            (
                "resume",
                |c| matches!(c, ScheduleCommand::Resume { name } if name == "n"),
            ),
            (
                "delete",
                |c| matches!(c, ScheduleCommand::Delete { name } if name == "n"),
            ),
            (
                "run-now",
                |c| matches!(c, ScheduleCommand::RunNow { name } if name == "n"),
            ),
        ] {
            match parse(&[sub, "n"]).unwrap() {
                Command::Schedule(cmd) => assert!(check(cmd), "{sub}"),
                other => panic!("{sub}: {other:?}"),
            }
        }
        assert!(matches!(
            parse(&["list"]).unwrap(),
            Command::Schedule(ScheduleCommand::List)
        ));
        // Refused: no payload, a policy that is none, an enqueue's time or key (each fire
        // sets its own).
        let refused = |args: &[&str]| parse(args).expect_err("refused").to_string();
        let base = ["set", "n", "--cron", "@hourly", "--queue", "q"];
        assert!(refused(&base).contains("--payload <PAYLOAD>"));
        let with = |more: &[&'static str]| {
            let mut args = base.to_vec();
            args.extend(["--payload", "{}"]);
            args.extend(more);
            args
        };
        let e = refused(&with(&["--catch-up", "later"]));
        assert!(
            e.contains("invalid value 'later'") && e.contains("[possible values: skip, once]"),
            "{e}"
        );
        for flag in ["--at", "--idempotency-key"] {
            let e = refused(&with(&[flag, "x"]));
            assert!(e.contains(&format!("unexpected argument '{flag}'")), "{e}");
        }
        // `enqueue` takes the same task options, and its own time and key.
        let enqueue = Cli::try_parse_from([
            "muster",
            "enqueue",
            "q",
            "{}",
            "--priority",
            "3",
            "--delay",
            "5s",
            "--at",
            "2026-12-01T08:00:00Z",
            "--idempotency-key",
            "k",
        ])
        .unwrap();
        let Command::Enqueue(EnqueueArgs {
            task,
            at,
            idempotency_key,
            ..
        }) = enqueue.command
        else {
            panic!("an enqueue")
        };
        assert_eq!(
            (task.priority, task.delay),
            (Some(3), Some(std::time::Duration::from_secs(5)))
        );
        assert!(at.is_some());
        assert_eq!(idempotency_key.as_deref(), Some("k"));
    }
}
