//! Following a task's output to its end ([`Follower`]): one `follow` after another from
//! the last chunk's number, on a connection made again (to the leader, on a cluster)
//! whenever one is lost, so that a reconnect, a daemon restart or a failover costs no
//! chunk and repeats none.

use std::time::{Duration, Instant};

use muster_protocol::ErrorCode;
use muster_protocol::ops::FollowReply;

use crate::{Client, ConnectOptions, Error};

/// How long a [`Follower`] tries to connect again before it gives up.
pub const FOLLOW_RECONNECT: Duration = Duration::from_secs(60);

/// How long one `follow` waits on the daemon for chunks before asking again.
pub const FOLLOW_POLL: Duration = Duration::from_secs(30);

/// Pause between two tries to connect.
const RETRY_PAUSE: Duration = Duration::from_millis(200);

/// A task's output, followed from a chunk number to the task's end across lost
/// connections, restarts and failovers: each [`Follower::next`] is the next batch, in
/// order, with no gap and no duplicate.
pub struct Follower {
    options: ConnectOptions,
    client: Option<Client>,
    task: String,
    next: u64,
    ended: bool,
}

impl Follower {
    /// A follower of `task`'s output from chunk `from` (0 for all of it); it connects
    /// at its first [`Follower::next`].
    pub fn new(options: ConnectOptions, task: impl Into<String>, from: u64) -> Follower {
        Follower {
            options,
            client: None,
            task: task.into(),
            next: from,
            ended: false,
        }
    }

    /// The number of the next chunk it will hand out.
    pub fn position(&self) -> u64 {
        self.next
    }

    /// The next batch of chunks (waiting for them while the task runs), or `None` once
    /// the task's end was handed out. A lost connection (or leader) is made again, for
    /// up to [`FOLLOW_RECONNECT`]; any other error (the task removed, say) ends it.
    pub async fn next(&mut self) -> Result<Option<FollowReply>, Error> {
        if self.ended {
            return Ok(None);
        }
        let mut lost_at: Option<Instant> = None;
        loop {
            let result = match &self.client {
                Some(client) => client.follow(&self.task, self.next, FOLLOW_POLL).await,
                None => match Client::connect(self.options.clone()).await {
                    Ok(client) => {
                        self.client = Some(client);
                        continue;
                    }
                    Err(e) => Err(e),
                },
            };
            match result {
                Ok(reply) => {
                    assert!(
                        reply.next >= self.next,
                        "a follow's reply goes on from where it was asked"
                    );
                    self.next = reply.next;
                    self.ended = reply.end;
                    return Ok(Some(reply));
                }
                Err(e) if is_lost(&e) => {
                    let since = *lost_at.get_or_insert_with(Instant::now);
                    if since.elapsed() >= FOLLOW_RECONNECT {
                        return Err(e);
                    }
                    self.client = None;
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Closes its connection.
    pub async fn close(self) {
        if let Some(client) = self.client {
            client.close().await;
        }
    }
}

/// Whether an error is the connection's (or the leader's), which connecting again may
/// mend.
fn is_lost(e: &Error) -> bool {
    match e {
        Error::Server(body) => matches!(
            body.code,
            ErrorCode::NotLeader | ErrorCode::OutcomeUnknown | ErrorCode::ShuttingDown
        ),
        Error::Closed(_) | Error::Connect(_) => true,
        _ => false,
    }
}
