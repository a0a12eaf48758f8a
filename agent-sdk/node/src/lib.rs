//! The native addon under the Node package `@muster/sdk` (`index.js` loads it through
//! napi-rs's generated `binding.js`).
//!
//! A thin layer over `muster-sdk`, as the Python SDK is: Node agents get the Rust
//! `Worker`'s lease logic (member session, renewals, local deadlines, reconnects,
//! reclaim, drain, fencing) rather than a second implementation of it. Every call runs
//! on napi-rs's tokio runtime and comes back as a promise; nothing here blocks the
//! event loop on the network, and no runtime thread waits for JavaScript.
//!
//! The types of `binding.d.ts` are generated from this crate (`napi build`): each record
//! is a `#[napi(object)]` struct whose fields are the wire's (snake_case here, camelCase
//! in JavaScript), read from a reply and written into a request with serde, so the
//! daemon's own decoding checks every request (`muster_sdk::Client::prepare_raw`)
//! before anything is sent.
//!
//! # Layout
//! - [`client`]: `connect`, and `Client` with a method for every producer, operator and
//!   pull-mode op.
//! - [`records`]: the records requests take and replies give.
//! - [`worker`]: `Worker` (a member session handing tasks to JavaScript) and `Task`.
//! - [`follow`]: `Follower`, a task's output to its end across reconnects.
//! - [`pipeline`]: `enqueueEach`, the enqueues of one turn of the event loop in one call.
//! - [`errors`]: how a failure reaches JavaScript (`index.js` makes it a typed error).
//! - [`logging`]: the SDK's warnings on stderr (`MUSTER_LOG`).

pub mod client;
pub mod errors;
pub mod follow;
pub mod logging;
pub mod pipeline;
pub mod records;
pub mod worker;

/// The most tasks one `enqueueMany` or `enqueue` batch request may carry.
#[napi_derive::napi]
pub const MAX_BATCH: u32 = muster_protocol::limits::MAX_BATCH as u32;

/// The most items one page of a listing holds.
#[napi_derive::napi]
pub const MAX_PAGE: u32 = muster_protocol::limits::MAX_PAGE;
