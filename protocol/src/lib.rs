//! The muster wire protocol: frames, typed requests and replies, error codes and limits.
//!
//! Everything a client in any language needs to speak to `musterd` is defined here and
//! specified in prose in `PROTOCOL.md`. This crate does no I/O and does not know about
//! tokio or QUIC: it turns bytes into typed messages and back.
//!
//! # Layout
//! - [`frame`]: the 4-byte big-endian length prefix and its limit.
//! - [`batch`]: frames gathered into stream writes.
//! - [`limits`]: every size, count and wait limit, by name.
//! - [`error`]: the stable error codes carried in replies.
//! - [`model`]: queue options, task states and the task views sent to clients.
//! - [`ops`]: one struct per request with its reply type, and the decoder for request frames.
//! - [`names`]: validation of queue names, member names and labels.
//! - [`nulls`]: what `null` means in a request field.
//! - [`fuzzing`]: the entry points of the fuzz targets in `protocol/fuzz`.

pub mod batch;
pub mod error;
pub mod frame;
pub mod fuzzing;
pub mod limits;
pub mod model;
pub mod names;
pub mod nulls;
pub mod ops;

pub use error::{ErrorBody, ErrorCode};
pub use model::{
    Delivery, EnqueuedTask, MemberInfo, NewTask, QueueInfo, QueueOptions, QueuePatch, StateCounts,
    TaskInfo, TaskState, TaskSummary, TimelineEvent,
};
pub use ops::{Op, Push, Request};

/// The ALPN protocol id both ends must offer.
pub const ALPN: &[u8] = b"muster/1";

/// The protocol version carried in `hello`.
pub const PROTOCOL_VERSION: u32 = 1;

/// The default UDP port of `musterd`.
pub const DEFAULT_PORT: u16 = 7420;

/// The file name of the daemon's certificate (PEM) inside its data directory.
pub const CERT_FILE: &str = "cert.pem";

/// The file name of the daemon's private key (PEM) inside its data directory.
pub const KEY_FILE: &str = "key.pem";

/// The file name of the daemon's own admin token inside its data directory (mode
/// 0600), written when no tokens are configured: local clients of the daemon's user
/// present it when they trust the daemon through that directory and were given no token.
pub const LOCAL_TOKEN_FILE: &str = "local.token";

/// The server name clients verify in the daemon's self-signed certificate.
pub const SERVER_NAME: &str = "localhost";

/// Raw JSON text, kept as bytes from the wire to the store and back without re-parsing.
pub type RawJson = Box<serde_json::value::RawValue>;

/// The name of the per-user data directory (under the platform's data directory, e.g.
/// `~/.local/share/muster`) that `musterd` and `muster` both use when `MUSTER_DATA` is unset.
pub const DATA_DIR_NAME: &str = "muster";
