//! The native `Client`: a connection, and one call that sends any op given as its
//! fields (`muster_sdk::Client::send_raw`) and resolves an asyncio future to its
//! replies. The Python layer (`muster/_client.py`) gives each op's fields as a `dict`
//! and reads its reply into records; the request's JSON is written from those Python
//! objects and the reply's objects are made here (`json`), and the Rust SDK decodes
//! every request as the daemon would before sending it. The member session's ops
//! (`session_open`, `session_update`, `subscribe`, `unsubscribe`) are the native
//! `Worker`'s, and `watch` / `unwatch` (a stream of pushes, for consoles) are not
//! offered.
//!
//! Each method takes the running loop's bridge (`done`, a [`Loop`]) first: the call
//! runs on the extension's runtime and the loop resolves its future (see `bridge`), so
//! no method holds the GIL while it waits.

use std::path::PathBuf;

use muster_sdk::{ConnectArgs, ConnectOptions};
use pyo3::IntoPyObjectExt;
use pyo3::prelude::*;

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

#[pymethods]
impl Client {
    /// Closes the connection, waiting (at most a second) until the daemon was told.
    fn close<'py>(&self, py: Python<'py>, done: &Bound<'py, Loop>) -> PyResult<Bound<'py, PyAny>> {
        let client = self.client.clone();
        done.get().spawn(py, async move {
            client.close().await;
            Ok(())
        })
    }

    /// The one native call behind every op: sends op `op` once for each of `requests`
    /// (each a `dict` of the op's fields, written as `crate::json` says), in that order
    /// and pipelined, and resolves to their replies (each the reply frame's object as a
    /// `dict`) in the same order. Each request is decoded as the daemon decodes it
    /// before any is sent (`muster_sdk::Client::prepare_raw`): a bad one raises
    /// `InvalidInput`, and none is sent.
    fn call<'py>(
        &self,
        py: Python<'py>,
        done: &Bound<'py, Loop>,
        op: String,
        requests: Vec<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if requests.is_empty() {
            return Err(invalid(format!("{op}: no request to send")));
        }
        let requests = requests
            .iter()
            .map(crate::json::request)
            .collect::<PyResult<Vec<String>>>()?;
        let client = self.client.clone();
        let count = requests.len();
        done.get().spawn(py, async move {
            // All checked before any is sent: a bad one leaves none sent.
            let prepared = requests
                .iter()
                .map(|fields| client.prepare_raw(&op, fields))
                .collect::<Result<Vec<_>, _>>()?;
            let mut pending = Vec::with_capacity(prepared.len());
            for request in prepared {
                pending.push(client.send_prepared(request).await?);
            }
            let mut replies = Vec::with_capacity(pending.len());
            for reply in pending {
                replies.push(reply.reply().await?);
            }
            assert_eq!(replies.len(), count, "one reply per request");
            Ok(Reply::Json(replies))
        })
    }
}

/// JSON text checked to be JSON.
pub fn raw(text: String) -> PyResult<muster_sdk::RawJson> {
    serde_json::value::RawValue::from_string(text)
        .map_err(|e| invalid(format!("not valid JSON: {e}")))
}
