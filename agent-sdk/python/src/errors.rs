//! The exception hierarchy, and how a `muster_sdk::Error` becomes one of them.
//!
//! `MusterError` is the root. Failures of the client itself (`ConnectError`,
//! `ConnectionLost`, `ProtocolError`, `InvalidInput`) are its direct children; a refusal
//! by the daemon is a `ServerError`, and each stable error code of the protocol
//! (PROTOCOL.md §2) has its own subclass carrying the code as the class attribute
//! `code`. A code this version does not know becomes a plain `ServerError`.

use muster_protocol::ErrorCode;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::{PyTypeInfo, create_exception};

create_exception!(
    muster,
    MusterError,
    PyException,
    "The root of every error raised by muster."
);
create_exception!(
    muster,
    ConnectError,
    MusterError,
    "The connection could not be made: the address, the TLS trust or the handshake failed, or the contexts file is unreadable or names no such context."
);
create_exception!(
    muster,
    ConnectionLost,
    MusterError,
    "The connection was lost before the reply came: the request may or may not have taken effect."
);
create_exception!(
    muster,
    ProtocolError,
    MusterError,
    "The daemon sent something this client does not understand."
);
create_exception!(
    muster,
    InvalidInput,
    MusterError,
    "The request was refused before it was sent: not JSON-serialisable, over a size limit, or out of range."
);
create_exception!(
    muster,
    ServerError,
    MusterError,
    "The daemon refused the request; `code` is the protocol's error code."
);
create_exception!(
    muster,
    BadRequest,
    ServerError,
    "bad_request: the request is malformed or a value is invalid."
);
create_exception!(
    muster,
    UnknownOp,
    ServerError,
    "unknown_op: the daemon does not know the operation."
);
create_exception!(
    muster,
    NotFound,
    ServerError,
    "not_found: the named queue, task or member does not exist."
);
create_exception!(
    muster,
    AlreadyExists,
    ServerError,
    "already_exists: the queue to create exists already."
);
create_exception!(
    muster,
    LeaseLost,
    ServerError,
    "lease_lost: the claim's epoch is not the task's current lease (it lapsed, was revoked, re-leased or settled)."
);
create_exception!(
    muster,
    InvalidState,
    ServerError,
    "invalid_state: the task's state does not allow the request."
);
create_exception!(
    muster,
    TooLarge,
    ServerError,
    "too_large: a size limit was exceeded (payload, result, progress, error text, batch)."
);
create_exception!(
    muster,
    LimitExceeded,
    ServerError,
    "limit: a count limit of the daemon was reached (e.g. the number of queues)."
);
create_exception!(
    muster,
    Unauthorized,
    ServerError,
    "unauthorized: no valid token was presented."
);
create_exception!(
    muster,
    Forbidden,
    ServerError,
    "forbidden: the token's roles or queue patterns do not allow this, or the member name belongs to another principal."
);
create_exception!(
    muster,
    Replaced,
    ServerError,
    "replaced: a newer session under the same member name took over."
);
create_exception!(
    muster,
    ShuttingDown,
    ServerError,
    "shutting_down: the daemon is stopping and takes no new work."
);
create_exception!(
    muster,
    DiskFull,
    ServerError,
    "disk_full: the daemon's disk alarm is on; enqueues are refused until space comes back."
);
create_exception!(
    muster,
    NotLeader,
    ServerError,
    "not_leader: the cluster node is not the leader; the client connects to the leader itself when given every node's address (addr=\"HOST:PORT,HOST:PORT,...\")."
);
create_exception!(
    muster,
    OutcomeUnknown,
    ServerError,
    "outcome_unknown: the cluster's leader lost its leadership before the request was agreed on: it may or may not have taken effect; retry it idempotently."
);

create_exception!(
    muster,
    StaleToken,
    ServerError,
    "stale_token: the resume token does not name the task's current suspension: it was spent, it is an earlier suspension's, or the task is no longer suspended."
);

/// Each code's exception class, for the module to export and to label with its `code`.
pub fn by_code(py: Python<'_>) -> [(ErrorCode, Bound<'_, pyo3::types::PyType>); 16] {
    [
        (ErrorCode::BadRequest, BadRequest::type_object(py)),
        (ErrorCode::UnknownOp, UnknownOp::type_object(py)),
        (ErrorCode::NotFound, NotFound::type_object(py)),
        (ErrorCode::AlreadyExists, AlreadyExists::type_object(py)),
        (ErrorCode::LeaseLost, LeaseLost::type_object(py)),
        (ErrorCode::InvalidState, InvalidState::type_object(py)),
        (ErrorCode::TooLarge, TooLarge::type_object(py)),
        (ErrorCode::Limit, LimitExceeded::type_object(py)),
        (ErrorCode::Unauthorized, Unauthorized::type_object(py)),
        (ErrorCode::Forbidden, Forbidden::type_object(py)),
        (ErrorCode::Replaced, Replaced::type_object(py)),
        (ErrorCode::ShuttingDown, ShuttingDown::type_object(py)),
        (ErrorCode::DiskFull, DiskFull::type_object(py)),
        (ErrorCode::NotLeader, NotLeader::type_object(py)),
        (ErrorCode::OutcomeUnknown, OutcomeUnknown::type_object(py)),
        (ErrorCode::StaleToken, StaleToken::type_object(py)),
    ]
}

/// The client-side classes, exported beside those of [`by_code`].
pub fn others(py: Python<'_>) -> [Bound<'_, pyo3::types::PyType>; 6] {
    [
        MusterError::type_object(py),
        ConnectError::type_object(py),
        ConnectionLost::type_object(py),
        ProtocolError::type_object(py),
        InvalidInput::type_object(py),
        ServerError::type_object(py),
    ]
}

/// The Python exception for an SDK error. The message is the error's own text, which
/// for a refusal starts with its code (`not_found: no queue "jobs"`).
pub fn to_py(error: muster_sdk::Error) -> PyErr {
    let text = error.to_string();
    match error {
        muster_sdk::Error::Server(body) => match body.code {
            ErrorCode::BadRequest => BadRequest::new_err(text),
            ErrorCode::UnknownOp => UnknownOp::new_err(text),
            ErrorCode::NotFound => NotFound::new_err(text),
            ErrorCode::AlreadyExists => AlreadyExists::new_err(text),
            ErrorCode::LeaseLost => LeaseLost::new_err(text),
            ErrorCode::InvalidState => InvalidState::new_err(text),
            ErrorCode::TooLarge => TooLarge::new_err(text),
            ErrorCode::Limit => LimitExceeded::new_err(text),
            ErrorCode::Unauthorized => Unauthorized::new_err(text),
            ErrorCode::Forbidden => Forbidden::new_err(text),
            ErrorCode::Replaced => Replaced::new_err(text),
            ErrorCode::ShuttingDown => ShuttingDown::new_err(text),
            ErrorCode::DiskFull => DiskFull::new_err(text),
            ErrorCode::NotLeader => NotLeader::new_err(text),
            ErrorCode::OutcomeUnknown => OutcomeUnknown::new_err(text),
            ErrorCode::StaleToken => StaleToken::new_err(text),
            _ => ServerError::new_err(text),
        },
        muster_sdk::Error::Connect(_) | muster_sdk::Error::Config(_) => ConnectError::new_err(text),
        muster_sdk::Error::Closed(_) => ConnectionLost::new_err(text),
        muster_sdk::Error::Protocol(_) => ProtocolError::new_err(text),
        muster_sdk::Error::InvalidInput(_) => InvalidInput::new_err(text),
        _ => MusterError::new_err(text),
    }
}

/// An input refused before anything was sent.
pub fn invalid(message: impl Into<String>) -> PyErr {
    InvalidInput::new_err(message.into())
}
