//! The SDK's error type.

use muster_protocol::{ErrorBody, ErrorCode};

/// Anything a call can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The daemon answered with an error.
    #[error("{0}")]
    Server(ErrorBody),
    /// The connection could not be made (address, TLS trust, handshake).
    #[error("connect: {0}")]
    Connect(String),
    /// The connection was lost before the reply arrived; the request may or may not have
    /// taken effect.
    #[error("connection lost: {0}")]
    Closed(String),
    /// The daemon sent something this client does not understand.
    #[error("protocol: {0}")]
    Protocol(String),
    /// The request was refused before sending (too large, invalid JSON).
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// The connection options could not be settled: the contexts file is unreadable or
    /// malformed, or names no such context (see [`crate::context`]).
    #[error("{0}")]
    Config(String),
}

impl Error {
    /// The daemon's error code, if the daemon refused the request.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            Error::Server(body) => Some(body.code),
            _ => None,
        }
    }
}
