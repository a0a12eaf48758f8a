//! A handler's live output ([`crate::worker::Task::emit`]): chunks buffered in the
//! agent and sent by one flusher per task, as many as are waiting in each `emit`
//! (so a fast emitter sends few large emits, a slow one each chunk at once).
//!
//! Each emit names the number its first chunk is to get, so an emit lost with its
//! connection is sent again on the next and stored once. The buffer holds at most
//! [`OUTPUT_BUFFER_BYTES`]: past it [`Output::emit`] waits for room, which is how the
//! daemon's rate per task ([`muster_protocol::limits::OUTPUT_RATE_BYTES`]) holds a fast
//! emitter back. The worker flushes what is buffered before it settles the task.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc, oneshot, watch};
use tracing::{debug, warn};

use muster_protocol::ErrorCode;
use muster_protocol::limits::{
    MAX_CHUNK_BYTES, MAX_EMIT_BYTES, MAX_EMIT_CHUNKS, OUTPUT_PAGE_HEADER_BYTES,
};
use muster_protocol::model::Chunk;
use muster_protocol::ops::{Emit, EmitReply};

use crate::error::Error;

/// Most bytes of chunks a task's buffer holds before [`Output::emit`] waits.
pub const OUTPUT_BUFFER_BYTES: usize = 1024 * 1024;

/// Pause before an emit the connection lost (or the rate refused) is sent again.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// Pause before an emit the disk alarm refused is sent again.
const DISK_PAUSE: Duration = Duration::from_secs(1);

/// What one emit's chunks may take as stored ([`Chunk::stored_bytes`] each), past the
/// page's header and its opening bracket.
const BATCH_BYTES: usize = MAX_EMIT_BYTES - OUTPUT_PAGE_HEADER_BYTES - 1;

/// An emit for the worker's loop to send on its connection, and who waits for the
/// answer.
pub(crate) struct EmitAsk {
    pub(crate) req: Emit,
    pub(crate) answer: oneshot::Sender<Result<EmitReply, Error>>,
}

/// One task's output on the handler's side: what it emitted, what the daemon has.
#[derive(Clone)]
pub(crate) struct Output {
    chunks: mpsc::UnboundedSender<Chunk>,
    room: Arc<Semaphore>,
    /// Chunks emitted so far.
    emitted: Arc<AtomicU64>,
    /// Chunks the daemon has (or dropped for good: `stopped`), as the flusher saw.
    stored: watch::Receiver<(u64, Option<String>)>,
}

impl Output {
    /// Starts the flusher of task `task` at `epoch`, whose next chunk is numbered `at`;
    /// `send` hands each emit to the worker's loop.
    pub(crate) fn start(
        task: String,
        epoch: u64,
        at: u64,
        send: impl Fn(EmitAsk) -> bool + Send + Sync + 'static,
    ) -> Output {
        let (chunks, rx) = mpsc::unbounded_channel();
        let room = Arc::new(Semaphore::new(OUTPUT_BUFFER_BYTES));
        let (stored_tx, stored) = watch::channel((0, None));
        tokio::spawn(flush(
            Flusher {
                task,
                epoch,
                at,
                room: Arc::clone(&room),
                stored: stored_tx,
            },
            rx,
            send,
        ));
        Output {
            chunks,
            room,
            emitted: Arc::new(AtomicU64::new(0)),
            stored,
        }
    }

    /// Buffers `chunk`, waiting while the buffer is full.
    pub(crate) async fn emit(&self, chunk: Chunk) -> Result<(), Error> {
        if chunk.text.is_some() == chunk.json.is_some() {
            return Err(Error::InvalidInput(
                "a chunk holds exactly one of text and json".into(),
            ));
        }
        // On the wire `"json": null` is no JSON at all: the daemon would refuse it.
        if chunk
            .json
            .as_ref()
            .is_some_and(|j| j.get().trim() == "null")
        {
            return Err(Error::InvalidInput("a JSON chunk cannot be null".into()));
        }
        let bytes = chunk.bytes();
        if bytes > MAX_CHUNK_BYTES {
            return Err(Error::InvalidInput(format!(
                "a chunk of {bytes} bytes exceeds {MAX_CHUNK_BYTES}"
            )));
        }
        if let Some(why) = &self.stored.borrow().1 {
            return Err(Error::Closed(format!("output stopped: {why}")));
        }
        let permits = self
            .room
            .acquire_many(bytes as u32)
            .await
            .map_err(|_| Error::Closed("output stopped".into()))?;
        permits.forget();
        self.emitted.fetch_add(1, SeqCst);
        self.chunks
            .send(chunk)
            .map_err(|_| Error::Closed("output stopped".into()))
    }

    /// Waits until the daemon has every chunk emitted so far, or output stopped (the
    /// lease was lost): then says why.
    pub(crate) async fn flush(&self) -> Result<(), Error> {
        let want = self.emitted.load(SeqCst);
        let mut stored = self.stored.clone();
        let seen = stored
            .wait_for(|(n, stopped)| *n >= want || stopped.is_some())
            .await
            .map_err(|_| Error::Closed("output stopped".into()))?;
        match &seen.1 {
            Some(why) if seen.0 < want => Err(Error::Closed(format!("output stopped: {why}"))),
            _ => Ok(()),
        }
    }
}

struct Flusher {
    task: String,
    epoch: u64,
    /// The number the next chunk gets.
    at: u64,
    room: Arc<Semaphore>,
    /// Chunks the daemon has, counted from this flusher's start, and why output
    /// stopped if it did.
    stored: watch::Sender<(u64, Option<String>)>,
}

/// Sends what is buffered, one emit at a time, until the handler's side is gone and
/// everything is sent, or the daemon refuses for good.
async fn flush(
    mut f: Flusher,
    mut rx: mpsc::UnboundedReceiver<Chunk>,
    send: impl Fn(EmitAsk) -> bool,
) {
    let mut sent = 0u64;
    while let Some(first) = rx.recv().await {
        // The buffer's room is counted in the chunks' own bytes, an emit's size in
        // what they take as stored.
        let (mut room, mut stored) = (first.bytes(), first.stored_bytes());
        let mut batch = vec![first];
        while batch.len() < MAX_EMIT_CHUNKS {
            let Ok(next) = rx.try_recv() else { break };
            let next_stored = next.stored_bytes();
            if stored + next_stored > BATCH_BYTES {
                // It starts the next emit.
                let reply = send_batch(&mut f, &send, std::mem::take(&mut batch)).await;
                if !settle(&mut f, &mut sent, room, reply).await {
                    return;
                }
                (room, stored) = (0, 0);
            }
            room += next.bytes();
            stored += next_stored;
            batch.push(next);
        }
        let reply = send_batch(&mut f, &send, batch).await;
        if !settle(&mut f, &mut sent, room, reply).await {
            return;
        }
    }
}

/// Sends one emit until it is answered for good: again after a lost connection (the
/// repeat is stored once), after the wait its reply asks for.
async fn send_batch(
    f: &mut Flusher,
    send: &impl Fn(EmitAsk) -> bool,
    chunks: Vec<Chunk>,
) -> Result<(u64, EmitReply), Error> {
    let count = chunks.len() as u64;
    loop {
        let (answer, reply) = oneshot::channel();
        let req = Emit {
            task: f.task.clone(),
            epoch: f.epoch,
            at: f.at,
            chunks: chunks.clone(),
        };
        if !send(EmitAsk { req, answer }) {
            return Err(Error::Closed("the worker has stopped".into()));
        }
        match reply.await {
            Ok(Ok(r)) => return Ok((count, r)),
            // Sent too soon for the rate, or lost with the connection or the leader (a
            // repeat is stored once): again.
            Ok(Err(Error::Server(e)))
                if matches!(
                    e.code,
                    ErrorCode::Limit
                        | ErrorCode::NotLeader
                        | ErrorCode::OutcomeUnknown
                        | ErrorCode::ShuttingDown
                ) =>
            {
                tokio::time::sleep(RETRY_PAUSE).await;
            }
            // The disk alarm passes: the chunks wait for it.
            Ok(Err(Error::Server(e))) if e.code == ErrorCode::DiskFull => {
                tokio::time::sleep(DISK_PAUSE).await;
            }
            Ok(Err(e @ (Error::Closed(_) | Error::Connect(_)))) => {
                debug!(error = %e, "an emit goes again");
                tokio::time::sleep(RETRY_PAUSE).await;
            }
            // Refused for what it is (`lease_lost`, a malformed chunk): output stops.
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(Error::Closed("the worker has stopped".into())),
        }
    }
}

/// Takes an emit's answer: room back in the buffer, the count stored moved on, the
/// rate's wait observed. False when output stops.
async fn settle(
    f: &mut Flusher,
    sent: &mut u64,
    bytes: usize,
    reply: Result<(u64, EmitReply), Error>,
) -> bool {
    match reply {
        Ok((count, r)) => {
            assert!(
                r.next >= f.at + count,
                "an emit's reply numbers past its chunks"
            );
            f.at = r.next;
            *sent += count;
            f.room.add_permits(bytes);
            f.stored.send_replace((*sent, None));
            if r.wait_ms > 0 {
                // The next emit goes after the wait: meanwhile the buffer fills, and
                // then the handler's emit waits for room.
                tokio::time::sleep(Duration::from_millis(r.wait_ms)).await;
            }
            true
        }
        Err(e) => {
            warn!(task = %f.task, epoch = f.epoch, error = %e, "output stopped");
            f.room.close();
            f.stored.send_replace((*sent, Some(e.to_string())));
            false
        }
    }
}
