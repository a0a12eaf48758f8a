//! The command line, as clap parses it.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

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

/// Options every subcommand takes.
#[derive(Debug, Args)]
pub struct Global {
    /// Daemon address, HOST:PORT.
    #[arg(long, global = true, env = "MUSTER_ADDR", default_value_t = format!("127.0.0.1:{}", muster_protocol::DEFAULT_PORT))]
    pub addr: String,
    /// The daemon's data directory, where its certificate is found.
    #[arg(long, global = true, env = "MUSTER_DATA")]
    pub data: Option<PathBuf>,
    /// A PEM CA file (or the daemon's certificate) to trust.
    #[arg(long, global = true, env = "MUSTER_CA")]
    pub ca: Option<PathBuf>,
    /// The SHA-256 fingerprint of the daemon's certificate to trust (as musterd logs it).
    #[arg(long, global = true, env = "MUSTER_PIN")]
    pub pin: Option<String>,
    /// A token, for daemons that require one.
    #[arg(long, global = true, env = "MUSTER_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Print JSON lines instead of text.
    #[arg(long, global = true)]
    pub json: bool,
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
    /// Remove dead tasks.
    Discard(DeadArgs),
    /// Counts per queue and state, what happened since the daemon started, and the
    /// daemon's group commit.
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
    /// Maintenance of the daemon.
    #[command(subcommand)]
    Admin(AdminCommand),
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
    /// The operator's console: watch queues, tasks, members and dead letters live, and
    /// repair them (redrive, discard, cancel, revoke, pause, drain).
    Tui {
        /// Look only: every verb is removed.
        #[arg(long)]
        readonly: bool,
    },
    /// The guardian `muster work` starts for itself: kills the process groups named on
    /// stdin (`+PGID` holds, `-PGID` lets go) when stdin ends, then removes DIR.
    #[command(hide = true)]
    Guard {
        /// The runner's private directory, removed at the end.
        #[arg(long)]
        dir: std::path::PathBuf,
    },
}

/// Arguments of `bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Phases, comma-separated: all, enqueue, drain, latency, roundtrip, startup, members.
    #[arg(long, default_value = "all")]
    pub phase: String,
    /// Runs (each on a fresh daemon); the table shows medians and spread.
    #[arg(long, default_value_t = 1)]
    pub runs: usize,
    /// Tasks enqueued and drained.
    #[arg(long, default_value_t = 100_000)]
    pub tasks: usize,
    /// Producers in the enqueue phase.
    #[arg(long, default_value_t = 4)]
    pub producers: usize,
    /// Unconfirmed enqueues each producer keeps in flight.
    #[arg(long, default_value_t = 256)]
    pub window: usize,
    /// Workers in the drain and latency phases.
    #[arg(long, default_value_t = 8)]
    pub workers: usize,
    /// Tasks each worker holds at once.
    #[arg(long, default_value_t = 32)]
    pub prefetch: u32,
    /// Enqueues per second in the latency phase.
    #[arg(long, default_value_t = 2000.0)]
    pub rate: f64,
    /// Length of the latency and members phases, in seconds.
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// Sequential round trips.
    #[arg(long, default_value_t = 5000)]
    pub roundtrips: usize,
    /// Tasks stored for the startup phase.
    #[arg(long, default_value_t = 1_000_000)]
    pub stored: usize,
    /// Members renewing a lease every second.
    #[arg(long, default_value_t = 1000)]
    pub members: usize,
    /// The musterd binary (default: next to this muster binary).
    #[arg(long)]
    pub musterd: Option<PathBuf>,
    /// The daemon's durability: sync or buffered.
    #[arg(long, default_value = "sync")]
    pub durability: String,
    /// Where every figure of every run is written (JSON).
    #[arg(long, default_value = "bench.json")]
    pub out: PathBuf,
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
    /// Write a consistent copy of the live store into DIR on the daemon's host (absolute,
    /// not existing yet): a backup, opened by a daemon as its data directory's `store`.
    /// Prints DIR, then the tasks and queues it holds.
    Snapshot {
        /// Where, on the daemon's host.
        dir: String,
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
    /// Remove every ready and scheduled task.
    Purge {
        /// The queue.
        name: String,
    },
    /// Delete a queue and all its tasks.
    Delete {
        /// The queue.
        name: String,
    },
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
}

/// Arguments of `enqueue`.
#[derive(Debug, Args)]
pub struct EnqueueArgs {
    /// The queue.
    pub queue: String,
    /// The JSON payload, or `-` for one payload per stdin line.
    pub payload: String,
    /// Tasks sharing a key run in order, `key_concurrency` at a time.
    #[arg(long)]
    pub key: Option<String>,
    /// 0 to 9, higher first.
    #[arg(long)]
    pub priority: Option<u8>,
    /// Not before this long from now.
    #[arg(long, value_parser = duration)]
    pub delay: Option<Duration>,
    /// Not before this time (RFC 3339, e.g. 2026-12-01T08:00:00Z).
    #[arg(long, value_parser = humantime::parse_rfc3339_weak)]
    pub at: Option<std::time::SystemTime>,
    /// Labels a member must carry, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub requires: Vec<String>,
    /// Enqueue at most once under this key (single payload only).
    #[arg(long)]
    pub idempotency_key: Option<String>,
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
        /// scheduled, ready, leased, done, dead or cancelled.
        #[arg(long, default_value = "ready")]
        state: String,
        /// Most tasks to list.
        #[arg(long, default_value_t = 100)]
        limit: u32,
        /// Start after this task id.
        #[arg(long)]
        after: Option<String>,
    },
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
}
