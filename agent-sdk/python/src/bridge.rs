//! How Rust work reaches asyncio without a runtime thread ever taking the GIL.
//!
//! The extension owns one multi-threaded tokio runtime ([`runtime`]). A call from
//! Python creates an asyncio future on the running loop and spawns its Rust future on
//! the runtime; when that ends, its result is posted to the loop's [`Loop`] inbox,
//! which wakes the loop through a socket it watches (`loop.add_reader`). The loop then
//! calls [`Loop::pump`], on its own thread and holding the GIL as any callback does,
//! which converts the results to Python objects and resolves the futures, as many as
//! arrived, in one go. Posting never blocks and needs no GIL, so a busy interpreter
//! (a handler spinning in pure Python, or many replies at once) never stalls the
//! runtime's threads, where the worker's renewals run; and replies coalesce into one
//! wake-up of the loop instead of one GIL hand-off each.
//!
//! A future cancelled in Python does not stop its Rust call: the request has been
//! sent, and its reply is dropped when it comes (the same on the wire as dropping the
//! call).

use std::future::Future;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, OnceLock};

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyList;
use tracing::warn;

use crate::errors::to_py;

/// The runtime every call and worker of this process runs on, built on first use.
pub fn runtime() -> PyResult<&'static tokio::runtime::Runtime> {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    if let Some(runtime) = RUNTIME.get() {
        return Ok(runtime);
    }
    let built = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("muster-runtime")
        .build()?;
    // Two threads may race to build it: the loser's runtime is dropped unused.
    Ok(RUNTIME.get_or_init(|| built))
}

/// Messages to an event loop, and the socket that wakes it. The number of messages is
/// bounded by what is in flight: calls awaiting their reply, handlers held by a worker.
pub struct Inbox<M> {
    messages: Mutex<Vec<M>>,
    /// Written (one byte) when a message arrives in an empty inbox.
    wake: UnixStream,
    /// Watched by the event loop; read empty before the messages are taken.
    wakeup: UnixStream,
}

impl<M> Inbox<M> {
    /// An empty inbox with its socket pair.
    pub fn new() -> std::io::Result<Inbox<M>> {
        let (wake, wakeup) = UnixStream::pair()?;
        wake.set_nonblocking(true)?;
        wakeup.set_nonblocking(true)?;
        Ok(Inbox {
            messages: Mutex::new(Vec::new()),
            wake,
            wakeup,
        })
    }

    /// The descriptor the event loop watches.
    pub fn wakeup_fd(&self) -> i32 {
        self.wakeup.as_raw_fd()
    }

    /// Queues a message and wakes the event loop; never blocks and needs no GIL.
    pub fn post(&self, message: M) {
        let mut messages = lock(&self.messages);
        let first = messages.is_empty();
        messages.push(message);
        drop(messages);
        if first {
            // A full socket buffer already holds a wake-up: nothing is lost.
            let _ = (&self.wake).write(&[1]);
        }
    }

    /// Every message so far. The wake-up bytes are read first, so that a message
    /// posted meanwhile leaves a byte for the next call.
    pub fn take(&self) -> Vec<M> {
        let mut buf = [0u8; 256];
        loop {
            match (&self.wakeup).read(&mut buf) {
                Ok(n) if n == buf.len() => continue,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                _ => break,
            }
        }
        std::mem::take(&mut *lock(&self.messages))
    }
}

/// What a Rust call resolves its future with.
pub enum Reply {
    /// `None`.
    Unit,
    /// A `list` of `dict`s: reply frames' JSON objects, read as `json.loads` reads them.
    Json(Vec<String>),
    /// A Python object made from a Rust value (a new native client, say), built once
    /// the GIL is held.
    Object(MakeObject),
}

/// Builds a Python object, given the GIL.
pub type MakeObject = Box<dyn for<'py> FnOnce(Python<'py>) -> PyResult<Bound<'py, PyAny>> + Send>;

impl From<()> for Reply {
    fn from((): ()) -> Reply {
        Reply::Unit
    }
}

impl Reply {
    fn into_py(self, py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
        match self {
            Reply::Unit => Ok(py.None().into_bound(py)),
            Reply::Json(replies) => {
                let list = PyList::empty(py);
                for reply in &replies {
                    list.append(crate::json::reply(py, reply)?)?;
                }
                Ok(list.into_any())
            }
            Reply::Object(make) => make(py),
        }
    }
}

/// A finished call: its asyncio future and what to resolve it with.
struct Done {
    future: Py<PyAny>,
    result: Result<Reply, muster_sdk::Error>,
}

/// One asyncio event loop's end of the bridge; the Python layer makes one per loop
/// and has the loop call `pump` when `wakeup_fd` is readable.
#[pyclass(frozen, module = "muster._native")]
pub struct Loop {
    inbox: Arc<Inbox<Done>>,
}

#[pymethods]
impl Loop {
    /// A bridge for the running loop (register `pump` on `wakeup_fd` with it).
    #[new]
    fn new() -> PyResult<Loop> {
        Ok(Loop {
            inbox: Arc::new(Inbox::new()?),
        })
    }

    /// The descriptor the loop watches.
    #[getter]
    fn wakeup_fd(&self) -> i32 {
        self.inbox.wakeup_fd()
    }

    /// Resolves the futures of every call that finished; called by the loop.
    fn pump(&self, py: Python<'_>) {
        for done in self.inbox.take() {
            let future = done.future.bind(py);
            if let Err(e) = resolve(py, future, done.result) {
                warn!(error = %e, "resolving an asyncio future");
            }
        }
    }
}

impl Loop {
    /// Runs `call` on the runtime; returns an asyncio future of the running loop that
    /// the loop's pump resolves with its result, or the matching exception.
    pub fn spawn<'py, F, T>(&self, py: Python<'py>, call: F) -> PyResult<Bound<'py, PyAny>>
    where
        F: Future<Output = Result<T, muster_sdk::Error>> + Send + 'static,
        T: Into<Reply>,
    {
        static GET_RUNNING_LOOP: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
        let future = GET_RUNNING_LOOP
            .import(py, "asyncio", "get_running_loop")?
            .call0()?
            .call_method0("create_future")?;
        let handle = future.clone().unbind();
        let inbox = Arc::clone(&self.inbox);
        runtime()?.spawn(async move {
            let result = call.await.map(Into::into);
            inbox.post(Done {
                future: handle,
                result,
            });
        });
        Ok(future)
    }
}

/// Sets a future's result or exception, unless it was cancelled meanwhile.
fn resolve(
    py: Python<'_>,
    future: &Bound<'_, PyAny>,
    result: Result<Reply, muster_sdk::Error>,
) -> PyResult<()> {
    if future.call_method0("cancelled")?.is_truthy()? {
        return Ok(());
    }
    match result.map_err(to_py).and_then(|reply| reply.into_py(py)) {
        Ok(value) => future.call_method1("set_result", (value,))?,
        Err(e) => future.call_method1("set_exception", (e.into_value(py),))?,
    };
    Ok(())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Only queued messages are behind this lock: keep going.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
