//! Stable error codes. Clients branch on the code; the message is for humans.

use serde::{Deserialize, Serialize};

/// The `code` of an error reply. Codes are stable: new ones may be added, none renamed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorCode {
    /// The request is malformed: bad JSON, a missing field, a wrong type, an invalid value.
    BadRequest,
    /// The `op` is not one this daemon knows.
    UnknownOp,
    /// The named queue or task does not exist.
    NotFound,
    /// The queue to create exists already.
    AlreadyExists,
    /// The claim's epoch is not the task's current lease: it lapsed, was revoked or settled.
    LeaseLost,
    /// The task is not in a state the request applies to (e.g. redrive of a task that is not dead).
    InvalidState,
    /// A size limit was exceeded (frame, payload, result, progress, batch).
    TooLarge,
    /// A count limit of the daemon was reached (e.g. the number of queues).
    Limit,
    /// The connection has not presented a valid token (`hello`) yet, or presented a wrong one.
    Unauthorized,
    /// The token's roles or queue patterns do not allow this request, or the member name
    /// belongs to another principal.
    Forbidden,
    /// The session was taken over by a newer session under the same member name.
    Replaced,
    /// The daemon is shutting down and takes no new work.
    ShuttingDown,
    /// The disk alarm is on: the data directory's free space is below its threshold, and
    /// enqueues are refused until space comes back (everything else is served).
    DiskFull,
    /// This node is not the cluster's leader: send the request to the leader, which the
    /// error's `leader` field names when known.
    NotLeader,
    /// The leader lost its leadership before the request's round was agreed on: it may or
    /// may not have taken effect; retry idempotently.
    OutcomeUnknown,
    /// The resume token does not name the task's current suspension: it was spent, it is
    /// an earlier suspension's, or the task is no longer suspended.
    StaleToken,
}

impl ErrorCode {
    /// The snake_case wire name.
    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::UnknownOp => "unknown_op",
            ErrorCode::NotFound => "not_found",
            ErrorCode::AlreadyExists => "already_exists",
            ErrorCode::LeaseLost => "lease_lost",
            ErrorCode::InvalidState => "invalid_state",
            ErrorCode::TooLarge => "too_large",
            ErrorCode::Limit => "limit",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::Replaced => "replaced",
            ErrorCode::ShuttingDown => "shutting_down",
            ErrorCode::DiskFull => "disk_full",
            ErrorCode::NotLeader => "not_leader",
            ErrorCode::OutcomeUnknown => "outcome_unknown",
            ErrorCode::StaleToken => "stale_token",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The `error` object of a failed reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ErrorBody {
    /// The stable code.
    pub code: ErrorCode,
    /// A one-line explanation.
    pub message: String,
    /// On `not_leader` errors, the leader's client address `HOST:PORT`, when the node
    /// knows it; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<String>,
}

impl ErrorBody {
    /// Builds an error body.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ErrorBody {
            code,
            message: message.into(),
            leader: None,
        }
    }

    /// Builds a `not_leader` error naming the leader's client address `HOST:PORT`, if known.
    pub fn not_leader(message: impl Into<String>, leader: Option<String>) -> Self {
        ErrorBody {
            code: ErrorCode::NotLeader,
            message: message.into(),
            leader,
        }
    }
}
