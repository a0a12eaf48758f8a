//! The SDK's log events, handed to Python's `logging` (logger `muster`).
//!
//! `muster_sdk` logs with `tracing` on the runtime's threads, which must never wait
//! for the GIL (a renewal could be late). So the subscriber installed here only
//! formats an event that passes the filter and puts it in a bounded queue, dropping it
//! when the queue is full; a Python daemon thread (`muster._logs`) takes records from
//! the queue with [`next_log`], which waits without the GIL, and logs them. At exit
//! (`atexit`, before the interpreter finalizes) [`stop_logs`] ends that thread, so no
//! thread of ours waits to take the GIL back while the interpreter goes away.
//!
//! The filter is `MUSTER_LOG` (`tracing` directives, as for the daemon and the CLI),
//! `warn` if unset: warnings (lease may lapse, reconnecting, settle refused) reach
//! Python without a per-task cost.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, mpsc};
use std::time::Duration;

use pyo3::prelude::*;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::{EnvFilter, Registry};

/// Log records queued for the Python thread; more are dropped (and counted) until it
/// catches up, so logging never blocks the runtime.
const LOG_QUEUE: usize = 1024;

/// How often a waiting [`next_log`] checks whether it should stop.
const STOP_POLL: Duration = Duration::from_millis(100);

/// One formatted event: a `logging` level number and the message.
type Record = (u8, String);

/// The receiving end of the queue, once the subscriber is installed.
static RECORDS: OnceLock<Mutex<mpsc::Receiver<Record>>> = OnceLock::new();

/// Set by [`stop_logs`]: `next_log` returns `None` from then on.
static STOPPED: AtomicBool = AtomicBool::new(false);

/// Records dropped because the queue was full, reported with the next record logged.
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Installs the subscriber, unless the process already has one (another extension or
/// an embedding program set it up first); then nothing reaches `next_log`.
pub fn install() {
    let filter = EnvFilter::try_from_env("MUSTER_LOG").unwrap_or_else(|_| EnvFilter::new("warn"));
    let (tx, rx) = mpsc::sync_channel(LOG_QUEUE);
    let subscriber = Registry::default()
        .with(filter)
        .with(QueueLayer { records: tx });
    if tracing::subscriber::set_global_default(subscriber).is_ok() {
        let _ = RECORDS.set(Mutex::new(rx));
    }
}

/// Waits, without the GIL, for the next log record: `(level, message)`; `None` once
/// [`stop_logs`] was called, or when no subscriber of this module's is installed.
#[pyfunction]
pub fn next_log(py: Python<'_>) -> Option<(u8, String)> {
    let records = RECORDS.get()?;
    py.detach(|| {
        let rx = records
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        while !STOPPED.load(Ordering::SeqCst) {
            match rx.recv_timeout(STOP_POLL) {
                Ok(record) => return Some(record),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return None,
            }
        }
        None
    })
    .map(|(level, mut message)| {
        let dropped = DROPPED.swap(0, Ordering::Relaxed);
        if dropped > 0 {
            let _ = write!(message, " ({dropped} earlier log records dropped)");
        }
        (level, message)
    })
}

/// Makes every waiting and later [`next_log`] return `None` (within [`STOP_POLL`]).
#[pyfunction]
pub fn stop_logs() {
    STOPPED.store(true, Ordering::SeqCst);
}

/// Formats each event into the queue.
struct QueueLayer {
    records: mpsc::SyncSender<Record>,
}

impl<S: Subscriber> Layer<S> for QueueLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let mut text = Text::default();
        event.record(&mut text);
        let level = match *event.metadata().level() {
            Level::ERROR => 40,
            Level::WARN => 30,
            Level::INFO => 20,
            Level::DEBUG => 10,
            Level::TRACE => 5,
        };
        if self.records.try_send((level, text.0)).is_err() {
            DROPPED.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// `message key=value key=value`.
#[derive(Default)]
struct Text(String);

impl Visit for Text {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let rest = std::mem::take(&mut self.0);
            let _ = write!(self.0, "{value:?}{rest}");
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.0.insert_str(0, value);
        } else {
            let _ = write!(self.0, " {}={value}", field.name());
        }
    }
}
