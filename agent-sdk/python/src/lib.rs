//! `muster._native`: the extension module under the Python package `muster`.
//!
//! It is a thin layer over `muster-sdk`, so Python agents get the Rust `Worker`'s
//! lease logic (renewals, cancellation, progress, reclaim, drain, fencing) rather than
//! a second implementation of it. Calls run on a multi-threaded tokio runtime owned by
//! this module (one worker thread per core) and come back to Python as asyncio
//! futures; nothing waits on the network while holding the GIL, and no runtime thread
//! ever waits for the GIL (`bridge`). The Python package (`python/muster/`) holds the public API: argument
//! checks and conversions, records as dataclasses, the handler runner, signals and the
//! synchronous facade.
//!
//! Limits: the runtime does not survive `fork()` (use multiprocessing's `spawn` or
//! `forkserver` start methods after importing muster); one Python process may run any
//! number of clients and workers, which share the runtime.
//!
//! # Layout
//! - [`bridge`]: the runtime, and how results reach asyncio (an inbox per event loop,
//!   woken through a socket the loop watches).
//! - [`client`]: the native `Client` (one call for every op) and `connect`.
//! - [`json`]: a request's JSON written from Python objects, a reply's read into them.
//! - [`worker`]: the native `Worker` and the `Task` a Python handler gets.
//! - [`errors`]: the exception hierarchy and the mapping of SDK errors to it.
//! - [`logging`]: the SDK's `tracing` events, handed to Python's `logging`.

use pyo3::prelude::*;

pub mod bridge;
pub mod client;
pub mod errors;
pub mod json;
pub mod logging;
pub mod worker;

/// The module: classes, functions and exceptions; each code's exception class gets
/// its protocol code as the attribute `code` (`None` on the classes above them).
#[pymodule]
#[pyo3(name = "_native")]
fn muster_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<bridge::Loop>()?;
    m.add_class::<client::Client>()?;
    m.add_class::<json::Json>()?;
    m.add_class::<worker::Worker>()?;
    m.add_class::<worker::Task>()?;
    m.add_function(wrap_pyfunction!(client::connect, m)?)?;
    m.add_function(wrap_pyfunction!(logging::next_log, m)?)?;
    m.add_function(wrap_pyfunction!(logging::stop_logs, m)?)?;
    for class in errors::others(py) {
        class.setattr("code", py.None())?;
        m.add(class.name()?, class)?;
    }
    for (code, class) in errors::by_code(py) {
        class.setattr("code", code.as_str())?;
        m.add(class.name()?, class)?;
    }
    m.add("MAX_BATCH", muster_protocol::limits::MAX_BATCH)?;
    m.add("MAX_PAGE", muster_protocol::limits::MAX_PAGE)?;
    logging::install();
    Ok(())
}
