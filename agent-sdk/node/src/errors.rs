//! How a failure reaches JavaScript.
//!
//! napi-rs rejects a promise (or throws) with an `Error` whose `code` is a napi status,
//! so the muster code travels at the front of the message, `[code] message`; the
//! package's `index.js` turns every such error into an instance of its class
//! (`NotFound`, `LeaseLost`, ..., each with `code` the protocol's stable code, PROTOCOL.md
//! §2) before user code sees it. The client's own failures have codes of their own
//! ([`CONNECT_ERROR`], [`CONNECTION_LOST`], [`PROTOCOL_ERROR`], [`INVALID_INPUT`]).

use muster_protocol::ErrorCode;
use napi::{Error, Status};

/// The connection could not be made (address, TLS trust, handshake), or the contexts
/// file is unreadable or names no such context.
pub const CONNECT_ERROR: &str = "connect_error";
/// The connection was lost before the reply came: the request may or may not have
/// taken effect.
pub const CONNECTION_LOST: &str = "connection_lost";
/// The daemon sent something this client does not understand.
pub const PROTOCOL_ERROR: &str = "protocol_error";
/// The request was refused before it was sent.
pub const INVALID_INPUT: &str = "invalid_input";

/// Every code a muster error can have: the client's own, then the protocol's.
pub const CODES: [&str; 20] = [
    CONNECT_ERROR,
    CONNECTION_LOST,
    PROTOCOL_ERROR,
    INVALID_INPUT,
    ErrorCode::BadRequest.as_str(),
    ErrorCode::UnknownOp.as_str(),
    ErrorCode::NotFound.as_str(),
    ErrorCode::AlreadyExists.as_str(),
    ErrorCode::LeaseLost.as_str(),
    ErrorCode::InvalidState.as_str(),
    ErrorCode::TooLarge.as_str(),
    ErrorCode::Limit.as_str(),
    ErrorCode::Unauthorized.as_str(),
    ErrorCode::Forbidden.as_str(),
    ErrorCode::Replaced.as_str(),
    ErrorCode::ShuttingDown.as_str(),
    ErrorCode::DiskFull.as_str(),
    ErrorCode::NotLeader.as_str(),
    ErrorCode::OutcomeUnknown.as_str(),
    ErrorCode::StaleToken.as_str(),
];

/// An error with `code` as `index.js` reads it.
pub fn coded(code: &str, message: impl std::fmt::Display) -> Error {
    debug_assert!(CODES.contains(&code), "{code} is a code of CODES");
    Error::new(Status::GenericFailure, format!("[{code}] {message}"))
}

/// A request refused before it was sent.
pub fn invalid(message: impl std::fmt::Display) -> Error {
    coded(INVALID_INPUT, message)
}

/// An SDK error as JavaScript gets it.
pub fn to_js(error: muster_sdk::Error) -> Error {
    let code = match &error {
        muster_sdk::Error::Server(body) => body.code.as_str(),
        muster_sdk::Error::Connect(_) | muster_sdk::Error::Config(_) => CONNECT_ERROR,
        muster_sdk::Error::Closed(_) => CONNECTION_LOST,
        muster_sdk::Error::Protocol(_) => PROTOCOL_ERROR,
        muster_sdk::Error::InvalidInput(_) => INVALID_INPUT,
        // A variant this version does not know: the closest is a protocol error.
        _ => PROTOCOL_ERROR,
    };
    coded(code, error)
}

/// Every error code, in the order of [`CODES`]; `index.js` checks at load that it has a
/// class for each.
#[napi_derive::napi]
pub fn error_codes() -> Vec<&'static str> {
    CODES.to_vec()
}
