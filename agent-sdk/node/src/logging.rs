//! The SDK's log events, on the process's stderr.
//!
//! `muster_sdk` logs with `tracing` on the runtime's threads, which must never wait on
//! a slow stderr (a renewal could be late). So events that pass the filter are
//! formatted and handed to `tracing-appender`'s writer thread through a queue of at most
//! [`LOG_QUEUE`] lines, dropped when it is full. The filter is `MUSTER_LOG` (`tracing`
//! directives, as for the daemon, the CLI and the Python SDK), `warn` if unset:
//! warnings (a queue waited for, reconnecting, a lease that may lapse, a settle
//! refused) reach the agent's log without a per-task cost.

use std::sync::OnceLock;

use tracing_appender::non_blocking::{NonBlockingBuilder, WorkerGuard};
use tracing_subscriber::EnvFilter;

/// Log lines queued for the writer thread; more are dropped until it catches up.
const LOG_QUEUE: usize = 1024;

/// The writer thread's guard, kept for the life of the process.
static WRITER: OnceLock<WorkerGuard> = OnceLock::new();

/// Installs the subscriber, once; a process that installed its own keeps it.
pub fn install() {
    WRITER.get_or_init(|| {
        let (writer, guard) = NonBlockingBuilder::default()
            .lossy(true)
            .buffered_lines_limit(LOG_QUEUE)
            .thread_name("muster-log")
            .finish(std::io::stderr());
        let filter =
            EnvFilter::try_from_env("MUSTER_LOG").unwrap_or_else(|_| EnvFilter::new("warn"));
        // Already set (another addon's, say): that one stays.
        let _ = tracing_subscriber::fmt()
            .with_writer(writer)
            .with_env_filter(filter)
            .with_ansi(false)
            .with_target(true)
            .try_init();
        guard
    });
}
