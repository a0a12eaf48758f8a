//! The Rust client for muster.
//!
//! [`Client`] speaks every op of the protocol over one QUIC connection; [`Worker`]
//! turns an async handler into an agent. It is cheap to
//! clone and safe to share across tasks: clones share the connection, and concurrent
//! calls are pipelined over one stream, their replies matched by request id.
//!
//! ```no_run
//! # async fn demo() -> Result<(), muster_sdk::Error> {
//! use muster_sdk::{Client, ConnectOptions, NewTask};
//! let client = Client::connect(ConnectOptions::default()).await?;
//! let task = client.enqueue("jobs", NewTask::new(muster_sdk::json(&serde_json::json!({"n": 1}))?)).await?;
//! println!("enqueued {}", task.id);
//! # Ok(()) }
//! ```
//!
//! # Layout
//! - [`client`]: `Client` and its per-op methods.
//! - [`connect`]: addresses (one daemon, or a cluster's nodes), trust (CA file, pinned
//!   fingerprint, the daemon's own certificate) and the QUIC connection.
//! - `leader` (private): finding a cluster's leader among the addresses.
//! - [`context`]: named contexts (`contexts.toml`) and [`ConnectArgs`], the CLI's
//!   resolution of connection options (flags and `MUSTER_*` variables, else the context
//!   in use, else the local daemon), which the Python SDK uses too.
//! - [`error`]: the `Error` type.
//! - [`worker`]: `Worker`, the agent loop: a member session, pushed tasks run by a
//!   handler, renewals with progress, cancellation, reconnects and graceful drain.

pub mod client;
pub mod connect;
pub mod context;
pub mod error;
pub mod follow;
mod leader;
pub mod output;
pub mod trace;
pub mod worker;

pub use client::{Client, PendingReply, PreparedRaw, RawReply};
pub use connect::{ConnectOptions, Trust};
pub use context::ConnectArgs;
pub use error::Error;
pub use follow::Follower;
pub use muster_protocol as protocol;
pub use muster_protocol::model::{
    Backoff, ChildOutcome, Chunk, Delivery, EnqueuedTask, NewTask, OnTimeout, OutputChunk,
    QueueInfo, QueueOptions, QueuePatch, Resumed, TaskInfo, TaskState, TaskSummary,
};
pub use muster_protocol::ops::{EmitReply, FollowReply, NewChild, SpawnReply, SpawnedChild};
pub use muster_protocol::{ErrorCode, Push, RawJson};
pub use worker::{Outcome, Suspension, Task, TaskOutput, Worker, WorkerConfig, WorkerHandle};

/// Serializes a value into raw JSON for a payload, result or progress.
pub fn json<T: serde::Serialize + ?Sized>(value: &T) -> Result<RawJson, Error> {
    serde_json::value::to_raw_value(value).map_err(|e| Error::InvalidInput(e.to_string()))
}

/// Parses JSON text into raw JSON, checking that it is JSON.
pub fn raw_json(text: &str) -> Result<RawJson, Error> {
    serde_json::value::RawValue::from_string(text.to_owned())
        .map_err(|e| Error::InvalidInput(format!("not valid JSON: {e}")))
}
