//! One connection's streams: reading request frames (each bounded by the connection's
//! in-flight limit, buffered bytes and reply budget), answering what the edge answers
//! ([`crate::edge`]) or handing the rest to the dispatcher, and writing reply and push
//! frames, gathered into one write per batch.

use std::ops::ControlFlow::{self, Break, Continue};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, warn};

use muster_protocol::batch::WriteBatch;
use muster_protocol::frame::{self, FrameError, FrameReader};
use muster_protocol::limits::{
    MAX_FOLLOW_REPLY_BYTES, MAX_FRAME_BYTES, MAX_PAYLOAD_BYTES, MAX_PROGRESS_BYTES,
    MAX_RESUMED_BYTES,
};
use muster_protocol::ops::{EdgeRequest, EngineRequest, ErrFrame, OkFrame, Route, decode_request};
use muster_protocol::{ErrorBody, ErrorCode, Push, Request};

use crate::admission::{Admission, ConnectionSlot};
use crate::auth::{Principal, Role, Tokens};
use crate::dispatcher::{Command, Outgoing, Responder, Slot};
use crate::edge::{self, Answer};
use crate::engine::Reply;

/// Requests one connection may have in flight (sent, not yet answered), over all its streams.
pub const MAX_IN_FLIGHT_PER_CONNECTION: usize = 4096;

/// Bytes of unfinished request frames a connection may hold buffered over all its
/// streams (each stream's buffer counted by its allocation). A stream that would pass
/// it is answered `too_large` and stopped.
pub const MAX_BUFFERED_REQUEST_BYTES: usize = 2 * MAX_FRAME_BYTES + 4 * READ_CHUNK;

/// The same before the connection presented its token (tokens configured).
pub const MAX_BUFFERED_BEFORE_HELLO: usize = 256 * 1024;

/// Bytes of replies a connection may have in preparation or waiting to be written.
/// Each request reserves the most its reply can take ([`reply_bound`]) until its reply
/// is written to the stream; past the budget the daemon stops reading the connection's
/// requests, except that a claim or wait that may wait is refused with `limit` rather
/// than holding up the connection's other requests.
pub const MAX_REPLY_BYTES_PER_CONNECTION: usize = 8 * MAX_FRAME_BYTES;

/// What a reply that lists nothing large can take: ids, states, options, one queue.
const SMALL_REPLY_BYTES: usize = 128 * 1024;

/// What a refusal takes of the reply budget: nothing. An error reply is a code and a
/// one-line message, bounded by the in-flight limit; a refusal must never wait for the
/// budget that the requests it refuses would have needed.
const REFUSAL_BYTES: usize = 0;

/// Application error code on a connection closed because `--max-connections`
/// connections are served already.
pub const CLOSE_LIMIT: u32 = 5;

/// Bytes read from a stream at a time.
const READ_CHUNK: usize = 64 * 1024;

/// Room a stream's writer keeps between writes; more is given back.
const KEEP_WRITE_BUFFER: usize = 16 * 1024;

/// Application error code on a stream reset for an unreadable frame header.
const RESET_BAD_FRAME: u32 = 1;

/// Application error code on a connection whose member session was taken over.
const CLOSE_REPLACED: u32 = 3;

/// Application error code on a connection closed for a wrong or missing token.
pub const CLOSE_UNAUTHORIZED: u32 = 4;

/// How long a stream gets to deliver its last frames before its connection is closed.
const CLOSE_LINGER: std::time::Duration = std::time::Duration::from_secs(1);

/// What every connection of the server shares.
pub struct ServerContext {
    /// Where requests go.
    pub commands: flume::Sender<Command>,
    /// Most connections served at once.
    pub max_connections: usize,
    /// Most connections one configured token holds at once.
    pub max_connections_per_token: usize,
    /// Most bytes of unfinished request frames one configured token's connections hold.
    pub max_buffered_per_token: usize,
    /// The configured tokens; empty serves everyone.
    pub tokens: Arc<Tokens>,
    /// How long a connection has to present its token.
    pub hello_timeout: std::time::Duration,
    /// The dispatcher's group-commit counters, for `server_stats`.
    pub stats: Arc<crate::dispatcher::CommitStats>,
    /// The durability mode's name, for `server_stats`.
    pub durability: &'static str,
    /// On a cluster node: the node, and the dispatcher's leadership generation, which
    /// changes when the node starts or stops leading (its connections are closed then).
    pub cluster: Option<(
        crate::cluster::node::Node,
        tokio::sync::watch::Receiver<u64>,
    )>,
}

/// What every connection task holds: the server's context and its admission budgets.
pub struct Shared {
    /// What the daemon configured.
    pub server: ServerContext,
    /// The budgets connections are admitted through.
    pub admission: Admission,
}

/// One connection's state, shared by its streams.
pub struct ConnState {
    pub conn: quinn::Connection,
    pub id: u64,
    /// Set by the first `hello` with a valid token.
    pub principal: OnceLock<Arc<Principal>>,
    /// Its place of `--max-connections` (and of its token's share): at the handshake
    /// without tokens, at the first valid `hello` with them.
    pub slot: OnceLock<ConnectionSlot>,
    /// Slots of [`MAX_IN_FLIGHT_PER_CONNECTION`].
    pub in_flight: Arc<Semaphore>,
    /// The reply budget, in KiB ([`MAX_REPLY_BYTES_PER_CONNECTION`]).
    pub reply_bytes: Arc<Semaphore>,
    /// Bytes buffered by its streams' frame readers.
    pub buffered: AtomicUsize,
    /// Cancelled once a token was accepted: ends the wait for one.
    pub authenticated: CancellationToken,
    /// Its streams' tasks and the edge's answers in the making, waited for before
    /// the connection is forgotten.
    pub tasks: TaskTracker,
    pub context: Arc<Shared>,
}

impl ConnState {
    /// Takes a place of `--max-connections` for the connection (once), and opens its
    /// streams and receive window fully. A configured token gets at most
    /// `--max-connections-per-token` places; the last [`ADMIN_RESERVED_CONNECTIONS`]
    /// places are kept for admins of every queue, so the operator always gets in.
    pub fn take_slot(&self, principal: Option<&Principal>) -> Result<(), ErrorBody> {
        if self.slot.get().is_some() {
            return Ok(());
        }
        let admission = &self.context.admission;
        let server = &self.context.server;
        let tenant = match principal {
            Some(p) if !server.tokens.is_local() => Some(
                admission
                    .tenants
                    .enter(&p.name, server.max_connections_per_token)
                    .map_err(|held| {
                        warn!(principal = %p.name, held, "connection refused: the token's limit reached");
                        ErrorBody::new(
                            ErrorCode::Limit,
                            format!(
                                "token {:?} holds {held} connections already (--max-connections-per-token)",
                                p.name
                            ),
                        )
                    })?,
            ),
            _ => None,
        };
        let operator = principal.is_none_or(|p| p.has(Role::Admin) && p.covers_all());
        let permit = Arc::clone(&admission.slots)
            .try_acquire_owned()
            .or_else(|e| match operator {
                true => Arc::clone(&admission.reserved).try_acquire_owned(),
                false => Err(e),
            })
            .map_err(|_| {
                warn!(
                    max_connections = server.max_connections,
                    "connection refused: limit reached"
                );
                ErrorBody::new(
                    ErrorCode::Limit,
                    format!(
                        "the daemon serves {} connections already (--max-connections)",
                        server.max_connections
                    ),
                )
            })?;
        let permit = ConnectionSlot { permit, tenant };
        let _ = self.slot.set(permit);
        self.conn
            .set_max_concurrent_bi_streams(crate::tls::MAX_STREAMS_PER_CONNECTION.into());
        self.conn
            .set_receive_window(crate::tls::CONNECTION_WINDOW.into());
        Ok(())
    }

    /// Its token's buffered-bytes total, once it holds a configured token's place.
    fn token_buffered(&self) -> Option<&Arc<AtomicUsize>> {
        self.slot.get()?.tenant.as_ref().map(|t| &t.buffered)
    }

    /// How many request bytes the connection's streams may hold buffered now.
    fn buffer_limit(&self) -> usize {
        if self.context.server.tokens.is_empty() || self.principal.get().is_some() {
            MAX_BUFFERED_REQUEST_BYTES
        } else {
            MAX_BUFFERED_BEFORE_HELLO
        }
    }

    /// Adds `bytes` of the reply budget to an in-flight slot, waiting for them (the
    /// daemon reads nothing more of this stream meanwhile). `None` if the connection
    /// is gone.
    async fn reserve(
        &self,
        in_flight: tokio::sync::OwnedSemaphorePermit,
        bytes: usize,
    ) -> Option<Slot> {
        let reply_bytes = Arc::clone(&self.reply_bytes)
            .acquire_many_owned(kib(bytes) as u32)
            .await
            .ok()?;
        Some(Slot {
            in_flight,
            reply_bytes,
        })
    }

    /// A slot for the reply to a frame that cannot be read.
    async fn slot_for_refusal(&self) -> Option<Slot> {
        let in_flight = Arc::clone(&self.in_flight).acquire_owned().await.ok()?;
        self.reserve(in_flight, REFUSAL_BYTES).await
    }

    /// Answers `hello`: checks the version and, with tokens configured, the token.
    fn hello(&self, hello: &muster_protocol::ops::Hello) -> Result<Reply, ErrorBody> {
        if !self.context.server.tokens.is_empty() {
            let presented = hello.token.as_deref().unwrap_or_default();
            match self.context.server.tokens.authenticate(presented) {
                Some(p) => {
                    if self.principal.get().is_none() {
                        // The connection's place of --max-connections comes with its
                        // first valid token; without one, the token gains nothing.
                        self.take_slot(Some(&p))?;
                        self.authenticated.cancel();
                    }
                    let current = self.principal.get_or_init(|| Arc::clone(&p));
                    if current.name != p.name {
                        return Err(ErrorBody::new(
                            ErrorCode::Forbidden,
                            format!("this connection is authenticated as {:?}", current.name),
                        ));
                    }
                    debug!(principal = %p.name, "authenticated");
                }
                None => {
                    return Err(ErrorBody::new(
                        ErrorCode::Unauthorized,
                        "invalid or missing token",
                    ));
                }
            }
        }
        let node = self.context.server.cluster.as_ref().map(|(node, _)| node);
        edge::hello_reply(hello.version, node, self.principal.get().map(Arc::as_ref))
    }
}

/// Reads request frames and writes reply frames on one stream until either side ends it.
pub async fn handle_stream(
    state: Arc<ConnState>,
    (send, recv): (quinn::SendStream, quinn::RecvStream),
) {
    let (out, replies) = mpsc::unbounded_channel();
    // The writer ends when every sender is gone: the reader's, those held by requests
    // still in the engine and a member session's push sink, so every reply in flight
    // is written first.
    let writer = write_replies(state.conn.clone(), send, replies);
    let reader = read_requests(recv, state, out);
    let ((), ()) = tokio::join!(reader, writer);
}

/// Reads one stream's request frames and hands each to [`handle_frame`], within the
/// connection's and its token's buffered-bytes limits.
async fn read_requests(
    mut recv: quinn::RecvStream,
    state: Arc<ConnState>,
    out: mpsc::UnboundedSender<Outgoing>,
) {
    let mut frames = FrameReader::new();
    // This stream's share of the connection's buffered request bytes.
    let mut buffered = Buffered {
        total: &state.buffered,
        mine: 0,
        token: None,
    };
    loop {
        if handle_frames(&mut frames, &mut buffered, &mut recv, &state, &out)
            .await
            .is_break()
        {
            return;
        }
        buffered.set(frames.capacity(), state.token_buffered());
        if frames.in_frame()
            && let Err(error) = check_buffered(&state, &buffered)
        {
            refuse_stream(&state, &out, &mut recv, error).await;
            return;
        }
        // The buffer grows with the bytes that actually arrive (bounded by QUIC flow
        // control), not with what a header announces.
        // quinn hands over the bytes it holds: no read buffer of our own per stream.
        match recv.read_chunk(READ_CHUNK, true).await {
            Ok(Some(chunk)) => frames.push(&chunk.bytes),
            // End of stream (a frame cut short is dropped), or the stream was reset.
            Ok(None) | Err(_) => return,
        }
    }
}

/// Handles every whole frame the reader holds, each with a slot of the connection's
/// in-flight limit. Breaks when the stream must stop.
async fn handle_frames(
    frames: &mut FrameReader,
    buffered: &mut Buffered<'_>,
    recv: &mut quinn::RecvStream,
    state: &ConnState,
    out: &mpsc::UnboundedSender<Outgoing>,
) -> ControlFlow<()> {
    loop {
        let body = match frames.next_frame() {
            Ok(Some(body)) => body,
            Ok(None) => return Continue(()),
            Err(e) => {
                let code = match e {
                    FrameError::TooLarge { .. } => ErrorCode::TooLarge,
                    FrameError::Empty => ErrorCode::BadRequest,
                };
                refuse_stream(state, out, recv, ErrorBody::new(code, e.to_string())).await;
                return Break(());
            }
        };
        buffered.set(frames.capacity(), state.token_buffered());
        // Every frame takes a slot of the connection's in-flight limit until its
        // reply is encoded: past the limit the daemon stops reading (QUIC flow
        // control then holds the client back).
        let Ok(slot) = Arc::clone(&state.in_flight).acquire_owned().await else {
            return Break(());
        };
        if handle_frame(&body, slot, state, out).await.is_break() {
            return Break(());
        }
    }
}

/// The refusal of a stream in the middle of a frame whose unfinished request bytes
/// passed its token's limit (`--max-buffered-mib-per-token`) or its connection's.
fn check_buffered(state: &ConnState, buffered: &Buffered<'_>) -> Result<(), ErrorBody> {
    let limit = state.buffer_limit();
    let token_limit = state.context.server.max_buffered_per_token;
    if let Some(token) = state.token_buffered()
        && token.load(Ordering::Relaxed) > token_limit
    {
        return Err(ErrorBody::new(
            ErrorCode::TooLarge,
            format!(
                "this token's connections hold {} bytes of unfinished request frames; at most {token_limit} are buffered (--max-buffered-mib-per-token)",
                token.load(Ordering::Relaxed),
            ),
        ));
    }
    if buffered.total.load(Ordering::Relaxed) > limit {
        return Err(ErrorBody::new(
            ErrorCode::TooLarge,
            format!(
                "this connection holds {} bytes of unfinished request frames; at most {limit} are buffered{}",
                buffered.total.load(Ordering::Relaxed),
                if limit == MAX_BUFFERED_BEFORE_HELLO {
                    " before hello"
                } else {
                    ""
                },
            ),
        ));
    }
    Ok(())
}

/// Decodes one request frame and answers it here (`hello`, the edge's ops, refusals
/// before `hello`) or forwards it to the dispatcher. Breaks when the stream must stop.
async fn handle_frame(
    body: &[u8],
    slot: tokio::sync::OwnedSemaphorePermit,
    state: &ConnState,
    out: &mpsc::UnboundedSender<Outgoing>,
) -> ControlFlow<()> {
    let (id, req) = match decode_request(body) {
        Ok(decoded) => decoded,
        Err(e) => {
            if let Some(slot) = state.reserve(slot, REFUSAL_BYTES).await {
                let _ = out.send(Outgoing::reply(e.id, Err(e.error), slot));
            }
            return Continue(());
        }
    };
    let slot = match reply_slot(&req, id, slot, state, out).await {
        Continue(Some(slot)) => slot,
        Continue(None) => return Continue(()),
        Break(()) => return Break(()),
    };
    let principal = state.principal.get().cloned();
    let req = match req.route() {
        Route::Engine(req) => req,
        Route::Hello(hello) => return answer_hello(&hello, id, slot, state, out),
        Route::Edge(req) => {
            answer_at_edge(&req, id, slot, principal.as_deref(), state, out);
            return Continue(());
        }
    };
    if let Err(error) = authenticated(principal.as_deref(), state) {
        let _ = out.send(Outgoing::reply(Some(id), Err(error), slot));
        return Continue(());
    }
    forward(req, id, slot, principal, state, out).await
}

/// `unauthorized` for a connection that presented no token to a daemon that wants one.
fn authenticated(principal: Option<&Principal>, state: &ConnState) -> Result<(), ErrorBody> {
    match principal {
        None if !state.context.server.tokens.is_empty() => Err(ErrorBody::new(
            ErrorCode::Unauthorized,
            "present a token with hello first",
        )),
        _ => Ok(()),
    }
}

/// Answers what the edge answers ([`edge::answer`]), or refuses it when the principal
/// may not ask it.
fn answer_at_edge(
    req: &EdgeRequest,
    id: u64,
    slot: Slot,
    principal: Option<&Principal>,
    state: &ConnState,
    out: &mpsc::UnboundedSender<Outgoing>,
) {
    let allowed = authenticated(principal, state)
        .and_then(|()| principal.map_or(Ok(()), |p| crate::engine::authorize_edge(req, p)));
    if let Err(error) = allowed {
        let _ = out.send(Outgoing::reply(Some(id), Err(error), slot));
        return;
    }
    let server = &state.context.server;
    let answer = edge::answer(
        req,
        &server.stats,
        server.durability,
        server.cluster.as_ref().map(|(node, _)| node),
        principal.map(|p| p.name.as_str()),
    );
    match answer {
        Answer::Now(reply) => {
            let _ = out.send(Outgoing::reply(Some(id), reply.map(|r| *r), slot));
        }
        Answer::Later(answer) => {
            let out = out.clone();
            state.tasks.spawn(async move {
                let reply = answer.await.map(Reply::Cluster);
                let _ = out.send(Outgoing::reply(Some(id), reply, slot));
            });
        }
    }
}

/// Forwards a request to the dispatcher. Breaks when the daemon is shutting down.
async fn forward(
    req: EngineRequest,
    id: u64,
    slot: Slot,
    principal: Option<Arc<Principal>>,
    state: &ConnState,
    out: &mpsc::UnboundedSender<Outgoing>,
) -> ControlFlow<()> {
    let responder = Responder::new(out.clone(), state.id, principal, id, slot);
    if let Err(flume::SendError(Command::Request(_, responder))) = state
        .context
        .server
        .commands
        .send_async(Command::Request(Box::new(req), responder))
        .await
    {
        responder.refuse(ErrorBody::new(
            ErrorCode::ShuttingDown,
            "the daemon is shutting down",
        ));
        return Break(());
    }
    Continue(())
}

/// The in-flight slot of request `id` with its reply's bound of the reply budget,
/// waited for; a claim or wait that may park is refused (`limit`, answered here:
/// `Continue(None)`) rather than waiting. Breaks when the connection is gone.
async fn reply_slot(
    req: &Request,
    id: u64,
    in_flight: tokio::sync::OwnedSemaphorePermit,
    state: &ConnState,
    out: &mpsc::UnboundedSender<Outgoing>,
) -> ControlFlow<(), Option<Slot>> {
    let bound = reply_bound(req);
    if !may_park(req) {
        return match state.reserve(in_flight, bound).await {
            Some(slot) => Continue(Some(slot)),
            None => Break(()),
        };
    }
    match Arc::clone(&state.reply_bytes).try_acquire_many_owned(kib(bound) as u32) {
        Ok(reply_bytes) => Continue(Some(Slot {
            in_flight,
            reply_bytes,
        })),
        Err(_) => {
            let error = ErrorBody::new(
                ErrorCode::Limit,
                format!(
                    "this connection has {MAX_REPLY_BYTES_PER_CONNECTION} bytes of replies in preparation or unread; a claim or wait that may wait is refused until they are read"
                ),
            );
            if let Some(slot) = state.reserve(in_flight, REFUSAL_BYTES).await {
                let _ = out.send(Outgoing::reply(Some(id), Err(error), slot));
            }
            Continue(None)
        }
    }
}

/// Answers `hello`. A refused token ends the connection (guesses need a new handshake
/// each), as does a valid one refused for `--max-connections`.
fn answer_hello(
    hello: &muster_protocol::ops::Hello,
    id: u64,
    slot: Slot,
    state: &ConnState,
    out: &mpsc::UnboundedSender<Outgoing>,
) -> ControlFlow<()> {
    let reply = state.hello(hello);
    let refused = reply.is_err() && !state.context.server.tokens.is_empty();
    let limit_reached = matches!(&reply, Err(e) if e.code == ErrorCode::Limit);
    let _ = out.send(Outgoing::reply(Some(id), reply, slot));
    if !refused || state.principal.get().is_some() {
        return Continue(());
    }
    let _ = out.send(if state.slot.get().is_none() && limit_reached {
        Outgoing::Close(CLOSE_LIMIT, b"connection limit reached")
    } else {
        Outgoing::Close(CLOSE_UNAUTHORIZED, b"invalid token")
    });
    Break(())
}

/// Answers a stream whose frames cannot be read on with `error`, then stops reading
/// it: the frame boundary is lost. The connection and its other streams go on.
async fn refuse_stream(
    state: &ConnState,
    out: &mpsc::UnboundedSender<Outgoing>,
    recv: &mut quinn::RecvStream,
    error: ErrorBody,
) {
    if let Some(slot) = state.slot_for_refusal().await {
        let _ = out.send(Outgoing::reply(None, Err(error), slot));
    }
    let _ = recv.stop(RESET_BAD_FRAME.into());
}

/// One stream's part of its connection's buffered request bytes, and of its token's
/// once the connection has one.
struct Buffered<'a> {
    total: &'a AtomicUsize,
    mine: usize,
    /// The token's total and what this stream added to it.
    token: Option<(Arc<AtomicUsize>, usize)>,
}

impl Buffered<'_> {
    fn set(&mut self, bytes: usize, token: Option<&Arc<AtomicUsize>>) {
        move_to(self.total, self.mine, bytes);
        self.mine = bytes;
        if self.token.is_none()
            && let Some(token) = token
        {
            self.token = Some((Arc::clone(token), 0));
        }
        if let Some((total, counted)) = &mut self.token {
            move_to(total, *counted, bytes);
            *counted = bytes;
        }
    }
}

/// Moves this part of `total` from `from` bytes to `to`.
fn move_to(total: &AtomicUsize, from: usize, to: usize) {
    if to >= from {
        total.fetch_add(to - from, Ordering::Relaxed);
    } else {
        total.fetch_sub(from - to, Ordering::Relaxed);
    }
}

impl Drop for Buffered<'_> {
    fn drop(&mut self) {
        self.set(0, None);
    }
}

/// KiB, rounded up: reply budgets count in KiB so that a 4 MiB reply fits a permit count.
pub fn kib(bytes: usize) -> usize {
    bytes.div_ceil(1024)
}

/// The most bytes the reply to `req` can take, reserved from its connection's reply
/// budget until the reply is written.
fn reply_bound(req: &Request) -> usize {
    match req {
        // One delivery: its payload, its progress checkpoint, how its last suspension
        // ended (children's outcomes included) and the fields around them.
        Request::Claim(c) => (c.max.unwrap_or(1) as usize)
            .saturating_mul(MAX_PAYLOAD_BYTES + MAX_PROGRESS_BYTES + MAX_RESUMED_BYTES + 4096)
            .min(MAX_FRAME_BYTES),
        Request::TaskGet(_)
        | Request::Spawn(_)
        | Request::TaskList(_)
        | Request::Wait(_)
        | Request::QueueList(_)
        | Request::MemberList(_)
        | Request::MemberDescribe(_)
        | Request::SessionOpen(_)
        | Request::Watch(_) => MAX_FRAME_BYTES,
        // Bounded by what a follow may send, so that one connection can follow
        // dozens of tasks at once within its reply budget.
        Request::Follow(_) => MAX_FOLLOW_REPLY_BYTES,
        _ => SMALL_REPLY_BYTES,
    }
}

/// True for requests that may park in the engine (a claim, wait or follow that may wait):
/// refused when the reply budget is spent, rather than holding up the connection.
fn may_park(req: &Request) -> bool {
    match req {
        Request::Claim(c) => c.wait_ms.unwrap_or(0) > 0,
        Request::Wait(w) => w.timeout_ms.unwrap_or(0) > 0,
        Request::Follow(f) => f.timeout_ms.unwrap_or(0) > 0,
        _ => false,
    }
}

async fn write_replies(
    conn: quinn::Connection,
    mut send: quinn::SendStream,
    mut replies: mpsc::UnboundedReceiver<Outgoing>,
) {
    let stopped = send.stopped();
    tokio::pin!(stopped);
    // Grows with what is written; an idle stream (most member sessions) holds nothing.
    let mut batch = WriteBatch::keeping(KEEP_WRITE_BUFFER);
    // The reply budget of what the batch holds: given back once it is written.
    let mut held = Vec::new();
    loop {
        let first = tokio::select! {
            msg = replies.recv() => match msg {
                Some(m) => m,
                None => break,
            },
            _ = &mut stopped => return, // the peer stopped reading, or the connection is gone
        };
        let (bytes, close) = batch.gather(
            first,
            || replies.try_recv().ok(),
            |buf, msg| match encode(buf, msg, &mut held) {
                Some(close) => Break(close),
                None => Continue(()),
            },
        );
        if send.write_all(bytes).await.is_err() {
            return;
        }
        batch.written();
        held.clear();
        if let Some((code, reason)) = close {
            // Let what was written arrive, then end the connection.
            let _ = send.finish();
            let _ = tokio::time::timeout(CLOSE_LINGER, &mut stopped).await;
            conn.close(code.into(), reason);
            return;
        }
    }
    let _ = send.finish();
}

/// Appends one frame; a reply over the frame limit becomes a `too_large` error. The
/// reply's budget goes to `held` until the frame is written.
/// Returns the code and reason to close the connection with once it is written: after
/// the push telling a session it was replaced, or on request.
fn encode(
    buf: &mut Vec<u8>,
    msg: Outgoing,
    held: &mut Vec<tokio::sync::OwnedSemaphorePermit>,
) -> Option<(u32, &'static [u8])> {
    let (id, result) = match msg {
        Outgoing::Reply { id, result, slot } => {
            drop(slot.in_flight);
            held.push(slot.reply_bytes);
            (id, result)
        }
        Outgoing::Push(push, queued) => {
            let replaced = matches!(&*push, Push::Closed(e) if e.code == ErrorCode::Replaced);
            // A push holds at most one delivery (≤ 1 MiB payload, 64 KiB progress) or one
            // watched screen (one task whole, or one page of rows with cut errors): it
            // fits. Should a screen not fit, its watch is told so and ends.
            let encoded = push.append_to(buf).or_else(|e| match &*push {
                Push::Watch(w) => Push::Watch(Box::new(muster_protocol::ops::WatchReply {
                    tag: w.tag,
                    disk_alarm: w.disk_alarm,
                    update: muster_protocol::ops::WatchUpdate::Gone {
                        error: ErrorBody::new(ErrorCode::TooLarge, e.to_string()),
                    },
                }))
                .append_to(buf),
                _ => Err(e),
            });
            encoded.expect("a push fits a frame: one delivery, one screen or its `gone`");
            if let Some(queued) = queued {
                queued.store(false, std::sync::atomic::Ordering::Release);
            }
            return replaced.then_some((CLOSE_REPLACED, b"replaced"));
        }
        Outgoing::Close(code, reason) => return Some((code, reason)),
    };
    let encoded = match (&*result, id) {
        (Ok(reply), Some(id)) => frame::append_json(
            buf,
            &OkFrame {
                id,
                ok: true,
                body: reply,
            },
        ),
        (Ok(_), None) => Ok(()),
        (Err(error), id) => frame::append_json(
            buf,
            &ErrFrame {
                id,
                ok: false,
                error,
            },
        ),
    };
    if let Err(e) = encoded {
        let error = ErrorBody::new(ErrorCode::TooLarge, format!("reply not sent: {e}"));
        // An error frame of a bounded message: it fits.
        let sent = frame::append_json(
            buf,
            &ErrFrame {
                id,
                ok: false,
                error: &error,
            },
        );
        debug_assert!(sent.is_ok(), "an error frame fits: {sent:?}");
    }
    None
}
