//! The QUIC side: endpoint, accept loop, connections, streams and frames.
//!
//! accept loop → [`handle_connection`] → [`handle_stream`]. A stream carries frames both
//! ways: requests in, replies out, matched by `id`, so a client pipelines as many
//! requests as it likes (up to the in-flight limit) and replies come back as they are
//! ready, not in order. Decoding happens here, on the tokio workers; the engine only sees
//! typed requests.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::Context;
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, debug, info, info_span, warn};

use muster_protocol::frame::{self, FrameError, FrameReader};
use muster_protocol::limits::{MAX_FRAME_BYTES, MAX_PAYLOAD_BYTES, MAX_PROGRESS_BYTES};
use muster_protocol::ops::{ClusterStatusReply, ErrFrame, HelloReply, OkFrame, decode_request};
use muster_protocol::{ErrorBody, ErrorCode, PROTOCOL_VERSION, Push, Request};

use crate::admission::{Place, Pool};
use crate::auth::{Principal, Role, Tokens};
use crate::dispatcher::{Command, Outgoing, Responder, Slot};
use crate::engine::Reply;

/// Requests one connection may have in flight (sent, not yet answered), over all its streams.
pub const MAX_IN_FLIGHT_PER_CONNECTION: usize = 4096;

/// Handshakes in progress at once; past it the oldest is dropped for a newcomer.
pub const MAX_HANDSHAKES: usize = 256;

/// Handshakes in progress from one source address; past it that address's oldest is
/// dropped for its newcomer.
pub const MAX_HANDSHAKES_PER_ADDRESS: usize = 32;

/// Handshakes in progress past which a client must prove it receives at its address
/// (a QUIC Retry, one round trip) before it gets a place: spoofed Initials then hold
/// nothing. Clients off loopback always get a Retry.
pub const RETRY_ABOVE_HANDSHAKES: usize = 16;

/// Longest a QUIC handshake may take.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(3);

/// With tokens configured: connections that finished their handshake but have not
/// presented a valid token yet. Past it the oldest of them is closed for a newcomer.
pub const MAX_UNAUTHENTICATED: usize = 128;

/// The same from one source address.
pub const MAX_UNAUTHENTICATED_PER_ADDRESS: usize = 32;

/// Streams a connection may open before it presented its token (tokens configured);
/// raised to the full limit by its `hello`.
pub const STREAMS_BEFORE_HELLO: u32 = 2;

/// Connection receive window before the token is presented (tokens configured).
pub const WINDOW_BEFORE_HELLO: u32 = 64 * 1024;

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
const CLOSE_LIMIT: u32 = 5;

/// Bytes read from a stream at a time.
const READ_CHUNK: usize = 64 * 1024;

/// Bytes of replies gathered into one stream write.
const WRITE_CHUNK: usize = 256 * 1024;

/// Room a stream's writer keeps between writes; more is given back.
const KEEP_WRITE_BUFFER: usize = 16 * 1024;

/// Application error code on a stream reset for an unreadable frame header.
const RESET_BAD_FRAME: u32 = 1;

/// Application error code on connections closed because the daemon stops.
const CLOSE_SHUTDOWN: u32 = 2;

/// Application error code on a connection whose member session was taken over.
const CLOSE_REPLACED: u32 = 3;

/// Application error code on a connection closed for a wrong or missing token.
const CLOSE_UNAUTHORIZED: u32 = 4;

/// Application error code on the connections a cluster node closes when it starts or
/// stops leading: the client looks for the leader again and resumes its session there.
const CLOSE_LEADERSHIP: u32 = 6;

/// How long a stream gets to deliver its last frames before its connection is closed.
const CLOSE_LINGER: std::time::Duration = std::time::Duration::from_secs(1);

/// How often each connection's packet count is read: a connection that received any
/// packet (keep-alive PINGs included) since is reported to the engine as heard from.
/// Member liveness is therefore known to within this much. One task reads every
/// connection's count and tells the engine in one command ([`Heartbeats`]).
pub const HEARD_POLL: std::time::Duration = std::time::Duration::from_millis(250);

/// UDP receive buffer asked of the kernel (capped by `net.core.rmem_max`): bursts of
/// pipelined requests must not be dropped before quinn reads them.
const UDP_RECV_BUFFER: usize = 4 * 1024 * 1024;

/// Binds the QUIC endpoint with a large receive buffer and the persistent reset secrets.
pub fn bind(
    addr: SocketAddr,
    config: quinn::ServerConfig,
    secrets: crate::tls::ResetSecrets,
) -> anyhow::Result<quinn::Endpoint> {
    let socket = std::net::UdpSocket::bind(addr).with_context(|| format!("binding {addr}"))?;
    let state =
        quinn::udp::UdpSocketState::new((&socket).into()).context("probing the UDP socket")?;
    if let Err(e) = state.set_recv_buffer_size((&socket).into(), UDP_RECV_BUFFER) {
        warn!(error = %e, "could not raise the UDP receive buffer");
    }
    let runtime = Arc::new(quinn::TokioRuntime);
    let mut endpoint_config = quinn::EndpointConfig::new(Arc::new(secrets.reset_key));
    let cid_key = secrets.cid_key;
    endpoint_config.cid_generator(move || {
        Box::new(quinn_proto::HashedConnectionIdGenerator::from_key(cid_key))
    });
    quinn::Endpoint::new(endpoint_config, Some(config), socket, runtime)
        .context("starting the QUIC endpoint")
}

/// Accepts connections until `shutdown`, then closes them all and waits for their tasks.
///
/// A connection goes through three budgets: a handshake place ([`MAX_HANDSHAKES`]),
/// then with tokens configured a place among the unauthenticated
/// ([`MAX_UNAUTHENTICATED`]), and only then one of `--max-connections`: connections
/// that never finish a handshake or never present a token cannot keep a client with
/// a valid token out.
pub async fn serve(endpoint: quinn::Endpoint, context: ServerContext, shutdown: CancellationToken) {
    let reserved = ADMIN_RESERVED_CONNECTIONS.min(context.max_connections / 2);
    let admission = Admission {
        slots: Arc::new(Semaphore::new(context.max_connections - reserved)),
        reserved: Arc::new(Semaphore::new(reserved)),
        tenants: Arc::default(),
        handshakes: Pool::new(MAX_HANDSHAKES, MAX_HANDSHAKES_PER_ADDRESS),
        unauthenticated: Pool::new(MAX_UNAUTHENTICATED, MAX_UNAUTHENTICATED_PER_ADDRESS),
    };
    let heartbeats = Arc::new(Heartbeats {
        connections: std::sync::Mutex::new(HashMap::new()),
        commands: context.commands.clone(),
    });
    let context = Arc::new(Shared {
        server: context,
        admission,
        heartbeats,
    });
    let tracker = TaskTracker::new();
    tracker.spawn(Arc::clone(&context.heartbeats).report(shutdown.clone()));
    // Connection ids, so the engine can tell which connection holds a member session.
    let mut connections: u64 = 0;
    loop {
        let incoming = tokio::select! {
            incoming = endpoint.accept() => incoming,
            () = shutdown.cancelled() => break,
        };
        let Some(incoming) = incoming else { break };
        let remote = incoming.remote_address();
        if !incoming.remote_address_validated() {
            let busy = context.admission.handshakes.held() >= RETRY_ABOVE_HANDSHAKES;
            if incoming.may_retry() && (busy || !remote.ip().is_loopback()) {
                // Stateless: the client comes back with a token proving its address.
                let _ = incoming.retry();
                continue;
            }
            if busy {
                // A token that does not validate, while busy: nothing to spend on it.
                incoming.ignore();
                continue;
            }
        }
        let handshake = context.admission.handshakes.admit(remote.ip());
        connections += 1;
        let connection = connections;
        let span = info_span!("connection", id = connection, remote = %remote);
        let context = Arc::clone(&context);
        let shutdown = shutdown.clone();
        tracker.spawn(
            async move {
                if let Err(e) =
                    handle_connection(incoming, handshake, connection, context, shutdown).await
                {
                    debug!("connection ended: {e:#}");
                }
            }
            .instrument(span),
        );
    }
    endpoint.close(CLOSE_SHUTDOWN.into(), b"shutting down");
    tracker.close();
    tracker.wait().await;
    endpoint.wait_idle().await;
}

/// A connection's place of `--max-connections`, and of its token's share of them.
struct ConnectionSlot {
    _permit: tokio::sync::OwnedSemaphorePermit,
    tenant: Option<TenantPlace>,
}

/// Places of `--max-connections` kept for admins of every queue.
pub const ADMIN_RESERVED_CONNECTIONS: usize = 16;

/// The connections and buffered request bytes of each configured token.
#[derive(Default)]
struct Tenants(std::sync::Mutex<HashMap<String, Tenant>>);

#[derive(Default)]
struct Tenant {
    connections: usize,
    /// Bytes of unfinished request frames over all its connections.
    buffered: Arc<AtomicUsize>,
}

/// A connection's place among its token's: dropping it gives it back.
struct TenantPlace {
    tenants: Arc<Tenants>,
    name: String,
    buffered: Arc<AtomicUsize>,
}

impl Tenants {
    /// A place among `name`'s connections, or how many it holds when that is `cap`.
    fn enter(self: &Arc<Tenants>, name: &str, cap: usize) -> Result<TenantPlace, usize> {
        let mut map = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let tenant = map.entry(name.to_owned()).or_default();
        if tenant.connections >= cap {
            return Err(tenant.connections);
        }
        tenant.connections += 1;
        Ok(TenantPlace {
            tenants: Arc::clone(self),
            name: name.to_owned(),
            buffered: Arc::clone(&tenant.buffered),
        })
    }
}

impl Drop for TenantPlace {
    fn drop(&mut self) {
        let mut map = self
            .tenants
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let tenant = map
            .get_mut(&self.name)
            .expect("a tenant with a place is in the map");
        assert!(tenant.connections > 0, "a tenant's places are counted");
        tenant.connections -= 1;
        if tenant.connections == 0 {
            map.remove(&self.name);
        }
    }
}

/// What every connection task holds: the server's context, its admission budgets and
/// the connections whose packets are counted.
struct Shared {
    server: ServerContext,
    admission: Admission,
    heartbeats: Arc<Heartbeats>,
}

/// The budgets connections are admitted through (see [`serve`]).
struct Admission {
    /// Places of `--max-connections` for everyone.
    slots: Arc<Semaphore>,
    /// The last [`ADMIN_RESERVED_CONNECTIONS`] places: for admins of every queue.
    reserved: Arc<Semaphore>,
    /// Each configured token's connections and buffered bytes.
    tenants: Arc<Tenants>,
    handshakes: Arc<Pool>,
    unauthenticated: Arc<Pool>,
}

async fn handle_connection(
    incoming: quinn::Incoming,
    handshake: Place,
    connection: u64,
    context: Arc<Shared>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let connecting = incoming.accept().context("accepting")?;
    let conn = tokio::select! {
        conn = tokio::time::timeout(HANDSHAKE_TIMEOUT, connecting) => {
            conn.context("handshake timed out")?.context("handshake")?
        }
        () = handshake.evicted.cancelled() => anyhow::bail!("handshake dropped for a newer one"),
        () = shutdown.cancelled() => return Ok(()),
    };
    drop(handshake);
    debug!("connected");
    let state = Arc::new(ConnState {
        conn: conn.clone(),
        id: connection,
        principal: OnceLock::new(),
        slot: OnceLock::new(),
        in_flight: Arc::new(Semaphore::new(MAX_IN_FLIGHT_PER_CONNECTION)),
        reply_bytes: Arc::new(Semaphore::new(kib(MAX_REPLY_BYTES_PER_CONNECTION))),
        buffered: AtomicUsize::new(0),
        authenticated: CancellationToken::new(),
        context: Arc::clone(&context),
    });
    let streams = TaskTracker::new();
    if context.server.tokens.is_empty() {
        if let Err(e) = state.take_slot(None) {
            conn.close(CLOSE_LIMIT.into(), b"connection limit reached");
            return Err(anyhow::anyhow!(e.message));
        }
    } else {
        // A connection must present its token in time, and holds a place among the
        // unauthenticated until it does; a silent one is closed, and the oldest silent
        // one is closed for a newcomer when they are too many.
        let place = context
            .admission
            .unauthenticated
            .admit(conn.remote_address().ip());
        let (state, timeout) = (Arc::clone(&state), context.server.hello_timeout);
        streams.spawn(async move {
            let reason: &'static [u8] = tokio::select! {
                () = tokio::time::sleep(timeout) => b"no token presented in time",
                () = place.evicted.cancelled() => b"no token presented; dropped for newer connections",
                () = state.authenticated.cancelled() => return,
                _ = state.conn.closed() => return,
            };
            if state.principal.get().is_none() {
                debug!("closing: {}", String::from_utf8_lossy(reason));
                state.conn.close(CLOSE_UNAUTHORIZED.into(), reason);
            }
        });
    }
    let commands = context.server.commands.clone();
    context.heartbeats.watch(connection, conn.clone());
    let mut leadership = context.server.cluster.as_ref().map(|(_, g)| {
        let mut g = g.clone();
        g.mark_unchanged();
        g
    });
    let result = loop {
        let (send, recv) = tokio::select! {
            s = conn.accept_bi() => match s {
                Ok(s) => s,
                Err(e) => break Err(e),
            },
            () = shutdown.cancelled() => break Ok(()),
            Some(()) = leadership_changed(&mut leadership) => {
                debug!("closing: the node's leadership changed");
                conn.close(CLOSE_LEADERSHIP.into(), b"leadership changed");
                break Ok(());
            }
        };
        let span = info_span!("stream", id = %send.id());
        streams.spawn(handle_stream(Arc::clone(&state), (send, recv)).instrument(span));
    };
    streams.close();
    streams.wait().await;
    // IMPORTANT: before `Disconnected`, so the engine hears nothing of it after.
    context.heartbeats.forget(connection);
    // The dispatcher may be gone when the daemon stops; then nothing needs telling.
    let _ = commands.send_async(Command::Disconnected(connection)).await;
    match result {
        Ok(()) | Err(quinn::ConnectionError::ApplicationClosed(_)) => Ok(()),
        Err(quinn::ConnectionError::LocallyClosed) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Resolves when a cluster node starts or stops leading (never on a single daemon).
async fn leadership_changed(
    generation: &mut Option<tokio::sync::watch::Receiver<u64>>,
) -> Option<()> {
    match generation {
        Some(g) => g.changed().await.ok(),
        None => std::future::pending().await,
    }
}

/// The connections whose packets count as news of their client: one task reads every
/// one's packet count each [`HEARD_POLL`] and tells the engine, in one
/// [`Command::Heard`], which of them received any since. One timer for all connections
/// rather than one each: an idle swarm of thousands of members then wakes the daemon
/// four times a second, not four times a second per member.
struct Heartbeats {
    /// Each watched connection and the packet count last reported for it.
    connections: std::sync::Mutex<HashMap<u64, (quinn::Connection, u64)>>,
    commands: flume::Sender<Command>,
}

impl Heartbeats {
    fn watch(&self, connection: u64, conn: quinn::Connection) {
        let previous = self.lock().insert(connection, (conn, 0));
        assert!(previous.is_none(), "connection {connection} watched twice");
    }

    /// Stops counting `connection`'s packets. Once this returns no `Heard` naming it
    /// is sent: the report is sent under the same lock.
    fn forget(&self, connection: u64) {
        self.lock().remove(&connection);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, (quinn::Connection, u64)>> {
        // A panic while holding it (none is expected) leaves the counts usable.
        self.connections
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Reports, every [`HEARD_POLL`] until `shutdown`, the connections that received
    /// packets since their last report.
    async fn report(self: Arc<Self>, shutdown: CancellationToken) {
        let mut poll = tokio::time::interval(HEARD_POLL);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Each connection heard from since its last report, with its count now.
        let mut heard: Vec<(u64, u64)> = Vec::new();
        loop {
            tokio::select! {
                _ = poll.tick() => {}
                () = shutdown.cancelled() => return,
            }
            let mut connections = self.lock();
            heard.extend(connections.iter().filter_map(|(&id, (conn, seen))| {
                let count = conn.stats().udp_rx.datagrams;
                (count != *seen).then_some((id, count))
            }));
            if heard.is_empty() {
                continue;
            }
            let ids = heard.iter().map(|&(id, _)| id).collect();
            // A full channel means a busy dispatcher: the counts stay as they were, so
            // the next poll tells it again.
            if self.commands.try_send(Command::Heard(ids)).is_ok() {
                for &(id, count) in &heard {
                    if let Some((_, seen)) = connections.get_mut(&id) {
                        *seen = count;
                    }
                }
            }
            heard.clear();
        }
    }
}

/// Reads request frames and writes reply frames on one stream until either side ends it.
async fn handle_stream(
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
        loop {
            let body = match frames.next_frame() {
                Ok(Some(body)) => body,
                Ok(None) => break,
                Err(e) => {
                    let code = match e {
                        FrameError::TooLarge { .. } => ErrorCode::TooLarge,
                        FrameError::Empty => ErrorCode::BadRequest,
                    };
                    refuse_stream(&state, &out, &mut recv, ErrorBody::new(code, e.to_string()))
                        .await;
                    return;
                }
            };
            buffered.set(frames.capacity(), state.token_buffered());
            // Every frame takes a slot of the connection's in-flight limit until its
            // reply is encoded: past the limit the daemon stops reading (QUIC flow
            // control then holds the client back).
            let Ok(slot) = Arc::clone(&state.in_flight).acquire_owned().await else {
                return;
            };
            if handle_frame(&body, slot, &state, &out).await.is_break() {
                return;
            }
        }
        buffered.set(frames.capacity(), state.token_buffered());
        let limit = state.buffer_limit();
        let token_limit = state.context.server.max_buffered_per_token;
        if frames.in_frame()
            && let Some(token) = state.token_buffered()
            && token.load(Ordering::Relaxed) > token_limit
        {
            let error = ErrorBody::new(
                ErrorCode::TooLarge,
                format!(
                    "this token's connections hold {} bytes of unfinished request frames; at most {token_limit} are buffered (--max-buffered-mib-per-token)",
                    token.load(Ordering::Relaxed),
                ),
            );
            refuse_stream(&state, &out, &mut recv, error).await;
            return;
        }
        if frames.in_frame() && buffered.total.load(Ordering::Relaxed) > limit {
            let error = ErrorBody::new(
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
            );
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
fn kib(bytes: usize) -> usize {
    bytes.div_ceil(1024)
}

/// The most bytes the reply to `req` can take, reserved from its connection's reply
/// budget until the reply is written.
fn reply_bound(req: &Request) -> usize {
    match req {
        // One delivery: its payload, its progress checkpoint and the fields around them.
        Request::Claim(c) => (c.max.unwrap_or(1) as usize)
            .saturating_mul(MAX_PAYLOAD_BYTES + MAX_PROGRESS_BYTES + 4096)
            .min(MAX_FRAME_BYTES),
        Request::TaskGet(_)
        | Request::TaskList(_)
        | Request::Wait(_)
        | Request::QueueList(_)
        | Request::MemberList(_)
        | Request::MemberDescribe(_)
        | Request::SessionOpen(_)
        | Request::Watch(_) => MAX_FRAME_BYTES,
        _ => SMALL_REPLY_BYTES,
    }
}

/// True for requests that may park in the engine (a claim or wait that may wait):
/// refused when the reply budget is spent, rather than holding up the connection.
fn may_park(req: &Request) -> bool {
    match req {
        Request::Claim(c) => c.wait_ms.unwrap_or(0) > 0,
        Request::Wait(w) => w.timeout_ms.unwrap_or(0) > 0,
        _ => false,
    }
}

/// Decodes one request frame and answers it here (`hello`, `server_stats`, refusals
/// before `hello`) or forwards it to the dispatcher. Breaks when the stream must stop.
async fn handle_frame(
    body: &[u8],
    slot: tokio::sync::OwnedSemaphorePermit,
    state: &ConnState,
    out: &mpsc::UnboundedSender<Outgoing>,
) -> std::ops::ControlFlow<()> {
    use std::ops::ControlFlow::{Break, Continue};
    let (id, req) = match decode_request(body) {
        Ok(decoded) => decoded,
        Err(e) => {
            if let Some(slot) = state.reserve(slot, REFUSAL_BYTES).await {
                let _ = out.send(Outgoing::reply(e.id, Err(e.error), slot));
            }
            return Continue(());
        }
    };
    let bound = reply_bound(&req);
    let slot = if may_park(&req) {
        match Arc::clone(&state.reply_bytes).try_acquire_many_owned(kib(bound) as u32) {
            Ok(reply_bytes) => Slot {
                in_flight: slot,
                reply_bytes,
            },
            Err(_) => {
                let error = ErrorBody::new(
                    ErrorCode::Limit,
                    format!(
                        "this connection has {MAX_REPLY_BYTES_PER_CONNECTION} bytes of replies in preparation or unread; a claim or wait that may wait is refused until they are read"
                    ),
                );
                if let Some(slot) = state.reserve(slot, REFUSAL_BYTES).await {
                    let _ = out.send(Outgoing::reply(Some(id), Err(error), slot));
                }
                return Continue(());
            }
        }
    } else {
        match state.reserve(slot, bound).await {
            Some(slot) => slot,
            None => return Break(()),
        }
    };
    if let Request::Hello(hello) = &req {
        let reply = state.hello(hello);
        let refused = reply.is_err() && !state.context.server.tokens.is_empty();
        let limit_reached = matches!(&reply, Err(e) if e.code == ErrorCode::Limit);
        let _ = out.send(Outgoing::reply(Some(id), reply, slot));
        if refused && state.principal.get().is_none() {
            // A wrong token costs the connection: guesses need a new handshake each.
            let _ = out.send(if state.slot.get().is_none() && limit_reached {
                Outgoing::Close(CLOSE_LIMIT, b"connection limit reached")
            } else {
                Outgoing::Close(CLOSE_UNAUTHORIZED, b"invalid token")
            });
            return Break(());
        }
        return Continue(());
    }
    let principal = state.principal.get().cloned();
    // Answered here when allowed; refusals go the engine's way below.
    let allowed = match &principal {
        Some(p) => crate::engine::authorize_stateless(&req, p).is_some_and(|r| r.is_ok()),
        None => state.context.server.tokens.is_empty(),
    };
    if let Request::ServerStats(_) = &req
        && allowed
    {
        use std::sync::atomic::Ordering::Relaxed;
        let stats = &state.context.server.stats;
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let reply = Reply::ServerStats(muster_protocol::ops::ServerStatsReply {
            syncs: stats.syncs.load(Relaxed),
            synced_requests: stats.synced_requests.load(Relaxed),
            durability: state.context.server.durability.into(),
            disk_alarm: stats.disk_alarm.load(Relaxed),
            uptime_ms: now_ms.saturating_sub(stats.started_ms.load(Relaxed)),
            members_connected: stats.members_connected.load(Relaxed),
            fsync_last_us: stats.fsync_last_us.load(Relaxed),
            fsync_total_us: stats.fsync_total_us.load(Relaxed),
        });
        let _ = out.send(Outgoing::reply(Some(id), Ok(reply), slot));
        return Continue(());
    }
    if let Some((node, _)) = &state.context.server.cluster
        && allowed
        && let Some(answer) = cluster_op(node, &req, principal.as_ref().map(|p| p.name.clone()))
    {
        // A membership change waits for a new node to catch up: off this stream's loop.
        let out = out.clone();
        tokio::spawn(async move {
            let reply = answer.await.map(Reply::Cluster);
            let _ = out.send(Outgoing::reply(Some(id), reply, slot));
        });
        return Continue(());
    }
    if principal.is_none() && !state.context.server.tokens.is_empty() {
        let error = ErrorBody::new(ErrorCode::Unauthorized, "present a token with hello first");
        let _ = out.send(Outgoing::reply(Some(id), Err(error), slot));
        return Continue(());
    }
    let responder = Responder::new(out.clone(), state.id, principal, id, slot);
    if let Err(flume::SendError(Command::Request(_, responder))) = state
        .context
        .server
        .commands
        .send_async(Command::Request(req, responder))
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

/// A cluster op's answer in the making.
type ClusterAnswer =
    std::pin::Pin<Box<dyn Future<Output = Result<ClusterStatusReply, ErrorBody>> + Send>>;

/// A cluster node's answer to a cluster op, answered by the node rather than the engine.
/// A membership change that took effect is audited as the `principal`'s.
fn cluster_op(
    node: &crate::cluster::node::Node,
    req: &Request,
    principal: Option<String>,
) -> Option<ClusterAnswer> {
    use crate::engine::audit;
    let watched = node.clone();
    let node = node.clone();
    let (op, target) = (req.name(), cluster_target(req)?);
    let change: ClusterAnswer = match req {
        Request::ClusterStatus(_) => return Some(Box::pin(async move { Ok(node.status()) })),
        Request::ClusterAdd(add) => {
            let (id, learner) = (add.node, add.learner);
            let max = muster_protocol::limits::MAX_CLUSTER_CATCH_UP;
            let catch_up = match add.catch_up_ms.map(std::time::Duration::from_millis) {
                None => muster_protocol::limits::CLUSTER_CATCH_UP,
                Some(d) if !d.is_zero() && d <= max => d,
                Some(d) => {
                    let error = ErrorBody::new(
                        ErrorCode::BadRequest,
                        format!(
                            "catch_up_ms {} is out of range (1 to {})",
                            d.as_millis(),
                            max.as_millis()
                        ),
                    );
                    return Some(Box::pin(async move { Err(error) }));
                }
            };
            let addr = crate::cluster::NodeAddr {
                addr: add.addr.clone(),
                cluster_addr: add.cluster_addr.clone(),
            };
            Box::pin(async move { node.add(id, addr, learner, catch_up).await })
        }
        Request::ClusterRemove(remove) => {
            let id = remove.node;
            Box::pin(async move { node.remove(id).await })
        }
        _ => return None,
    };
    // A node that joins as a learner and is refused promotion changed the membership.
    let is_member = |node: &crate::cluster::node::Node, id: u64| {
        node.status().members.iter().any(|m| m.node == id)
    };
    let added = match req {
        Request::ClusterAdd(add) if !is_member(&watched, add.node) => Some(add.node),
        _ => None,
    };
    Some(Box::pin(async move {
        let reply = change.await;
        match (&reply, added) {
            (Ok(_), _) => audit::record(principal.as_deref(), op, &target, 0),
            // Refused after the node joined as a learner (it did not catch up): the
            // membership changed all the same.
            (Err(_), Some(id)) if is_member(&watched, id) => {
                audit::record(
                    principal.as_deref(),
                    op,
                    &format!("{target} (a learner)"),
                    0,
                );
            }
            (Err(_), _) => {}
        }
        reply
    }))
}

/// What a cluster op acts on, as the audit trail names it (`node 4`).
fn cluster_target(req: &Request) -> Option<String> {
    match req {
        Request::ClusterStatus(_) => Some(String::new()),
        Request::ClusterAdd(add) => Some(format!("node {}", add.node)),
        Request::ClusterRemove(remove) => Some(format!("node {}", remove.node)),
        _ => None,
    }
}

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

/// One connection's state, shared by its streams.
struct ConnState {
    conn: quinn::Connection,
    id: u64,
    /// Set by the first `hello` with a valid token.
    principal: OnceLock<Arc<Principal>>,
    /// Its place of `--max-connections` (and of its token's share): at the handshake
    /// without tokens, at the first valid `hello` with them.
    slot: OnceLock<ConnectionSlot>,
    in_flight: Arc<Semaphore>,
    /// The reply budget, in KiB ([`MAX_REPLY_BYTES_PER_CONNECTION`]).
    reply_bytes: Arc<Semaphore>,
    /// Bytes buffered by its streams' frame readers.
    buffered: AtomicUsize,
    /// Cancelled once a token was accepted: ends the wait for one.
    authenticated: CancellationToken,
    context: Arc<Shared>,
}

impl ConnState {
    /// Takes a place of `--max-connections` for the connection (once), and opens its
    /// streams and receive window fully. A configured token gets at most
    /// `--max-connections-per-token` places; the last [`ADMIN_RESERVED_CONNECTIONS`]
    /// places are kept for admins of every queue, so the operator always gets in.
    fn take_slot(&self, principal: Option<&Principal>) -> Result<(), ErrorBody> {
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
        let permit = ConnectionSlot {
            _permit: permit,
            tenant,
        };
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
        let mut reply = hello_reply(hello.version)?;
        if let (Reply::Hello(hello), Some((node, _))) = (&mut reply, &self.context.server.cluster) {
            hello.cluster = Some(node.hello());
        }
        Ok(reply)
    }
}

fn hello_reply(version: u32) -> Result<Reply, ErrorBody> {
    if version == PROTOCOL_VERSION {
        Ok(Reply::Hello(HelloReply {
            version: PROTOCOL_VERSION,
            server: concat!("musterd ", env!("CARGO_PKG_VERSION")).into(),
            cluster: None,
        }))
    } else {
        Err(ErrorBody::new(
            ErrorCode::BadRequest,
            format!(
                "protocol version {version} is not supported; this daemon speaks {PROTOCOL_VERSION}"
            ),
        ))
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
    let mut buf = Vec::new();
    // The reply budget of what `buf` holds: given back once it is written.
    let mut held = Vec::new();
    loop {
        let first = tokio::select! {
            msg = replies.recv() => match msg {
                Some(m) => m,
                None => break,
            },
            _ = &mut stopped => return, // the peer stopped reading, or the connection is gone
        };
        buf.clear();
        let mut close = encode(&mut buf, first, &mut held);
        while buf.len() < WRITE_CHUNK && close.is_none() {
            match replies.try_recv() {
                Ok(m) => close = encode(&mut buf, m, &mut held),
                Err(_) => break,
            }
        }
        if send.write_all(&buf).await.is_err() {
            return;
        }
        held.clear();
        if buf.capacity() > KEEP_WRITE_BUFFER {
            // A large batch went out: do not keep its room.
            buf = Vec::new();
        }
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

/// Logs where the daemon listens and how clients trust it.
pub fn log_listening(
    addr: SocketAddr,
    cluster_addr: Option<SocketAddr>,
    fingerprint: &str,
    cert: &std::path::Path,
) {
    match cluster_addr {
        None => {
            info!(%addr, fingerprint, cert = %cert.display(), "musterd listening (QUIC, ALPN muster/1)")
        }
        Some(cluster_addr) => info!(
            %addr,
            %cluster_addr,
            fingerprint,
            cert = %cert.display(),
            "musterd listening (QUIC, ALPN muster/1; cluster node-to-node traffic on cluster_addr, ALPN muster-raft/1)"
        ),
    }
}
