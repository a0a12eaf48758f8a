//! `Follower`: a task's output followed to its end (`muster_sdk::Follower`): one
//! `follow` after another from the last chunk's number, on a connection of its own made
//! again (to the leader, on a cluster) whenever one is lost, so a reconnect, a daemon
//! restart or a failover costs no chunk and repeats none. `index.js` makes it an async
//! iterator of chunks.

use std::sync::atomic::{AtomicU64, Ordering};

use napi::Result;
use napi_derive::napi;

use crate::client::settle;
use crate::errors::to_js;
use crate::records::{ConnectOptions, FollowResult};

/// Where to follow from, and the daemon.
#[napi(object)]
#[derive(Debug, Clone, Default)]
pub struct FollowOptions {
    /// The number of the first chunk wanted (0, all that is kept, if left out).
    pub from: Option<i64>,
    /// Where the daemon is and how to trust it, as `Client.connect` takes them.
    pub connect: Option<ConnectOptions>,
}

/// A task's output from a chunk number to the task's end: each `next()` is the next
/// batch, in order, with no gap and no duplicate, across lost connections, restarts and
/// failovers (it tries to connect again for up to 60 s). `for await (const chunk of
/// follower)` reads it chunk by chunk.
#[napi]
pub struct Follower {
    follower: tokio::sync::Mutex<Option<muster_sdk::Follower>>,
    /// Set by `close`: a `next` waiting on the daemon's long poll ends at once.
    closed: tokio::sync::watch::Sender<bool>,
    /// The number of the next chunk it hands out.
    position: AtomicU64,
}

#[napi]
impl Follower {
    /// A follower of `task`'s output; it connects at its first `next()`.
    #[napi(constructor)]
    pub fn new(task: String, options: Option<FollowOptions>) -> Result<Follower> {
        let options = options.unwrap_or_default();
        let from = options.from.unwrap_or(0);
        let from = u64::try_from(from)
            .map_err(|_| crate::errors::invalid(format!("from is {from}, below 0")))?;
        let follower = muster_sdk::Follower::new(settle(options.connect)?, task, from);
        Ok(Follower {
            follower: tokio::sync::Mutex::new(Some(follower)),
            closed: tokio::sync::watch::Sender::new(false),
            position: AtomicU64::new(from),
        })
    }

    /// The next batch (waiting for chunks while the task runs), or `null` once the
    /// task's end was handed out (or the follower closed). Any error but a lost
    /// connection (the task removed, say) rejects and ends it.
    #[napi]
    pub async fn next(&self) -> Result<Option<FollowResult>> {
        let mut closed = self.closed.subscribe();
        if *closed.borrow_and_update() {
            return Ok(None);
        }
        let mut guard = self.follower.lock().await;
        let Some(follower) = guard.as_mut() else {
            return Ok(None);
        };
        let next = tokio::select! {
            next = follower.next() => next,
            // Closed meanwhile: the follow in flight is given up with the connection.
            _ = closed.changed() => return Ok(None),
        };
        let Some(reply) = next.map_err(to_js)? else {
            return Ok(None);
        };
        self.position.store(follower.position(), Ordering::Relaxed);
        crate::records::record(&reply).map(Some)
    }

    /// The number of the next chunk it will hand out.
    #[napi(getter)]
    pub fn position(&self) -> i64 {
        i64::try_from(self.position.load(Ordering::Relaxed)).unwrap_or(i64::MAX)
    }

    /// Closes its connection; a `next()` waiting for chunks and every later one resolve
    /// `null`.
    #[napi]
    pub async fn close(&self) -> Result<()> {
        self.closed.send_replace(true);
        let follower = self.follower.lock().await.take();
        if let Some(follower) = follower {
            follower.close().await;
        }
        Ok(())
    }
}
