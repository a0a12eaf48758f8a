//! The QUIC side: endpoint, accept loop, connections, streams and frames.
//!
//! accept loop → [`handle_connection`] → [`handle_stream`]. A stream carries frames both
//! ways: requests in, replies out, matched by `id`, so a client pipelines as many
//! requests as it likes (up to the in-flight limit) and replies come back as they are
//! ready, not in order. Decoding happens here, on the tokio workers; the engine only sees
//! typed requests.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use anyhow::Context;
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, debug, info, info_span, warn};

use muster_protocol::frame::{self, FrameError, FrameReader};
use muster_protocol::ops::{ErrFrame, HelloReply, OkFrame, decode_request};
use muster_protocol::{ErrorBody, ErrorCode, PROTOCOL_VERSION, Push, Request};

use crate::auth::{Principal, Tokens};
use crate::dispatcher::{Command, Outgoing, Responder};
use crate::engine::Reply;

/// Requests one connection may have in flight (sent, not yet answered), over all its streams.
pub const MAX_IN_FLIGHT_PER_CONNECTION: usize = 4096;

/// Bytes read from a stream at a time.
const READ_CHUNK: usize = 64 * 1024;

/// Bytes of replies gathered into one stream write.
const WRITE_CHUNK: usize = 256 * 1024;

/// Application error code on a stream reset for an unreadable frame header.
const RESET_BAD_FRAME: u32 = 1;

/// Application error code on connections closed because the daemon stops.
const CLOSE_SHUTDOWN: u32 = 2;

/// Application error code on a connection whose member session was taken over.
const CLOSE_REPLACED: u32 = 3;

/// Application error code on a connection closed for a wrong or missing token.
const CLOSE_UNAUTHORIZED: u32 = 4;

/// How long a stream gets to deliver its last frames before its connection is closed.
const CLOSE_LINGER: std::time::Duration = std::time::Duration::from_secs(1);

/// How often each connection's packet count is read: a connection that received any
/// packet (keep-alive PINGs included) since is reported to the engine as heard from.
/// Member liveness is therefore known to within this much.
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
pub async fn serve(endpoint: quinn::Endpoint, context: ServerContext, shutdown: CancellationToken) {
    let max_connections = context.max_connections;
    let context = Arc::new(context);
    let tracker = TaskTracker::new();
    let slots = Arc::new(Semaphore::new(max_connections));
    // Connection ids, so the engine can tell which connection holds a member session.
    let mut connections: u64 = 0;
    loop {
        let incoming = tokio::select! {
            incoming = endpoint.accept() => incoming,
            () = shutdown.cancelled() => break,
        };
        let Some(incoming) = incoming else { break };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            warn!(remote = %incoming.remote_address(), max_connections, "connection refused: limit reached");
            incoming.refuse();
            continue;
        };
        connections += 1;
        let connection = connections;
        let span = info_span!("connection", id = connection, remote = %incoming.remote_address());
        let context = Arc::clone(&context);
        let shutdown = shutdown.clone();
        tracker.spawn(
            async move {
                if let Err(e) = handle_connection(incoming, connection, context, shutdown).await {
                    debug!("connection ended: {e:#}");
                }
                drop(slot);
            }
            .instrument(span),
        );
    }
    endpoint.close(CLOSE_SHUTDOWN.into(), b"shutting down");
    tracker.close();
    tracker.wait().await;
    endpoint.wait_idle().await;
}

async fn handle_connection(
    incoming: quinn::Incoming,
    connection: u64,
    context: Arc<ServerContext>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let conn = incoming.await.context("handshake")?;
    debug!("connected");
    let state = Arc::new(ConnState {
        conn: conn.clone(),
        id: connection,
        principal: OnceLock::new(),
        in_flight: Arc::new(Semaphore::new(MAX_IN_FLIGHT_PER_CONNECTION)),
        context: Arc::clone(&context),
    });
    let streams = TaskTracker::new();
    if !context.tokens.is_empty() {
        // A connection must present its token in time; a silent one is closed.
        let (state, timeout) = (Arc::clone(&state), context.hello_timeout);
        streams.spawn(async move {
            tokio::select! {
                () = tokio::time::sleep(timeout) => {
                    if state.principal.get().is_none() {
                        debug!("no token within {timeout:?}: closing");
                        state.conn.close(CLOSE_UNAUTHORIZED.into(), b"no token presented in time");
                    }
                }
                _ = state.conn.closed() => {}
            }
        });
    }
    let commands = context.commands.clone();
    streams.spawn(report_heard(conn.clone(), connection, commands.clone()));
    let result = loop {
        let (send, recv) = tokio::select! {
            s = conn.accept_bi() => match s {
                Ok(s) => s,
                Err(e) => break Err(e),
            },
            () = shutdown.cancelled() => break Ok(()),
        };
        let span = info_span!("stream", id = %send.id());
        streams.spawn(handle_stream(Arc::clone(&state), (send, recv)).instrument(span));
    };
    streams.close();
    streams.wait().await;
    // The dispatcher may be gone when the daemon stops; then nothing needs telling.
    let _ = commands.send_async(Command::Disconnected(connection)).await;
    match result {
        Ok(()) | Err(quinn::ConnectionError::ApplicationClosed(_)) => Ok(()),
        Err(quinn::ConnectionError::LocallyClosed) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Tells the engine, at most every [`HEARD_POLL`], that packets arrived on the
/// connection: its member session's heartbeat. Ends with the connection, so the engine
/// hears nothing of it after `Disconnected`.
async fn report_heard(conn: quinn::Connection, connection: u64, commands: flume::Sender<Command>) {
    let mut seen = 0;
    let mut poll = tokio::time::interval(HEARD_POLL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = poll.tick() => {}
            _ = conn.closed() => return,
        }
        let datagrams = conn.stats().udp_rx.datagrams;
        if datagrams != seen {
            seen = datagrams;
            // A full channel means a busy dispatcher: the next poll tells it again.
            let _ = commands.try_send(Command::Heard(connection));
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
    let mut frames = FrameReader::with_capacity(2 * READ_CHUNK);
    let mut chunk = vec![0u8; READ_CHUNK];
    loop {
        loop {
            let body = match frames.next_frame() {
                Ok(Some(body)) => body,
                Ok(None) => break,
                Err(e) => {
                    let Ok(slot) = Arc::clone(&state.in_flight).acquire_owned().await else {
                        return;
                    };
                    let code = match e {
                        FrameError::TooLarge { .. } => ErrorCode::TooLarge,
                        FrameError::Empty => ErrorCode::BadRequest,
                    };
                    let error = ErrorBody::new(code, e.to_string());
                    let _ = out.send(Outgoing::reply(None, Err(error), slot));
                    // The frame boundary is lost: stop reading this stream, keep the connection.
                    let _ = recv.stop(RESET_BAD_FRAME.into());
                    return;
                }
            };
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
        // The buffer grows with the bytes that actually arrive (bounded by QUIC flow
        // control), not with what a header announces.
        match recv.read(&mut chunk).await {
            Ok(Some(n)) => frames.push(&chunk[..n]),
            // End of stream (a frame cut short is dropped), or the stream was reset.
            Ok(None) | Err(_) => return,
        }
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
            let _ = out.send(Outgoing::reply(e.id, Err(e.error), slot));
            return Continue(());
        }
    };
    if let Request::Hello(hello) = &req {
        let reply = state.hello(hello);
        let refused = reply.is_err() && !state.context.tokens.is_empty();
        let _ = out.send(Outgoing::reply(Some(id), reply, slot));
        if refused && state.principal.get().is_none() {
            // A wrong token costs the connection: guesses need a new handshake each.
            let _ = out.send(Outgoing::Close(CLOSE_UNAUTHORIZED, b"invalid token"));
            return Break(());
        }
        return Continue(());
    }
    let principal = state.principal.get().cloned();
    // Answered here when allowed; refusals go the engine's way below.
    let allowed = match &principal {
        Some(p) => crate::engine::authorize_stateless(&req, p).is_some_and(|r| r.is_ok()),
        None => state.context.tokens.is_empty(),
    };
    if let Request::ServerStats(_) = &req
        && allowed
    {
        let stats = &state.context.stats;
        let reply = Reply::ServerStats(muster_protocol::ops::ServerStatsReply {
            syncs: stats.syncs.load(std::sync::atomic::Ordering::Relaxed),
            synced_requests: stats
                .synced_requests
                .load(std::sync::atomic::Ordering::Relaxed),
            durability: state.context.durability.into(),
            disk_alarm: stats.disk_alarm.load(std::sync::atomic::Ordering::Relaxed),
        });
        let _ = out.send(Outgoing::reply(Some(id), Ok(reply), slot));
        return Continue(());
    }
    if principal.is_none() && !state.context.tokens.is_empty() {
        let error = ErrorBody::new(ErrorCode::Unauthorized, "present a token with hello first");
        let _ = out.send(Outgoing::reply(Some(id), Err(error), slot));
        return Continue(());
    }
    let responder = Responder::new(out.clone(), state.id, principal, id, slot);
    if let Err(flume::SendError(Command::Request(_, responder))) = state
        .context
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

/// What every connection of the server shares.
pub struct ServerContext {
    /// Where requests go.
    pub commands: flume::Sender<Command>,
    /// Most connections served at once.
    pub max_connections: usize,
    /// The configured tokens; empty serves everyone.
    pub tokens: Arc<Tokens>,
    /// How long a connection has to present its token.
    pub hello_timeout: std::time::Duration,
    /// The dispatcher's group-commit counters, for `server_stats`.
    pub stats: Arc<crate::dispatcher::CommitStats>,
    /// The durability mode's name, for `server_stats`.
    pub durability: &'static str,
}

/// One connection's state, shared by its streams.
struct ConnState {
    conn: quinn::Connection,
    id: u64,
    /// Set by the first `hello` with a valid token.
    principal: OnceLock<Arc<Principal>>,
    in_flight: Arc<Semaphore>,
    context: Arc<ServerContext>,
}

impl ConnState {
    /// Answers `hello`: checks the version and, with tokens configured, the token.
    fn hello(&self, hello: &muster_protocol::ops::Hello) -> Result<Reply, ErrorBody> {
        if !self.context.tokens.is_empty() {
            let presented = hello.token.as_deref().unwrap_or_default();
            match self.context.tokens.authenticate(presented) {
                Some(p) => {
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
        hello_reply(hello.version)
    }
}

fn hello_reply(version: u32) -> Result<Reply, ErrorBody> {
    if version == PROTOCOL_VERSION {
        Ok(Reply::Hello(HelloReply {
            version: PROTOCOL_VERSION,
            server: concat!("musterd ", env!("CARGO_PKG_VERSION")).into(),
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
    let mut buf = Vec::with_capacity(WRITE_CHUNK);
    loop {
        let first = tokio::select! {
            msg = replies.recv() => match msg {
                Some(m) => m,
                None => break,
            },
            _ = &mut stopped => return, // the peer stopped reading, or the connection is gone
        };
        buf.clear();
        let mut close = encode(&mut buf, first);
        while buf.len() < WRITE_CHUNK && close.is_none() {
            match replies.try_recv() {
                Ok(m) => close = encode(&mut buf, m),
                Err(_) => break,
            }
        }
        if send.write_all(&buf).await.is_err() {
            return;
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

/// Appends one frame; a reply over the frame limit becomes a `too_large` error.
/// Returns the code and reason to close the connection with once it is written: after
/// the push telling a session it was replaced, or on request.
fn encode(buf: &mut Vec<u8>, msg: Outgoing) -> Option<(u32, &'static [u8])> {
    let (id, result) = match msg {
        Outgoing::Reply { id, result, slot } => {
            drop(slot);
            (id, result)
        }
        Outgoing::Push(push, queued) => {
            let replaced = matches!(&*push, Push::Closed(e) if e.code == ErrorCode::Replaced);
            // A push holds at most one delivery (≤ 1 MiB payload, 64 KiB progress) or one
            // watched screen (one task whole, or one page of rows with cut errors): it
            // fits. Should a screen not fit, its watch is told so and ends.
            let frame = push.encode().or_else(|e| match &*push {
                Push::Watch(w) => Push::Watch(Box::new(muster_protocol::ops::WatchReply {
                    tag: w.tag,
                    disk_alarm: w.disk_alarm,
                    update: muster_protocol::ops::WatchUpdate::Gone {
                        error: ErrorBody::new(ErrorCode::TooLarge, e.to_string()),
                    },
                }))
                .encode(),
                _ => Err(e),
            });
            buf.extend_from_slice(
                &frame.expect("a push fits a frame: one delivery, one screen or its `gone`"),
            );
            if let Some(queued) = queued {
                queued.store(false, std::sync::atomic::Ordering::Release);
            }
            return replaced.then_some((CLOSE_REPLACED, b"replaced"));
        }
        Outgoing::Close(code, reason) => return Some((code, reason)),
    };
    let framed = match (&*result, id) {
        (Ok(reply), Some(id)) => frame::encode_json(&OkFrame {
            id,
            ok: true,
            body: reply,
        }),
        (Ok(_), None) => Ok(Vec::new()),
        (Err(error), id) => frame::encode_json(&ErrFrame {
            id,
            ok: false,
            error,
        }),
    };
    let framed = framed.unwrap_or_else(|e| {
        let error = ErrorBody::new(ErrorCode::TooLarge, format!("reply not sent: {e}"));
        frame::encode_json(&ErrFrame {
            id,
            ok: false,
            error: &error,
        })
        .unwrap_or_default()
    });
    buf.extend_from_slice(&framed);
    None
}

/// Logs where the daemon listens and how clients trust it.
pub fn log_listening(addr: SocketAddr, fingerprint: &str, cert: &std::path::Path) {
    info!(%addr, fingerprint, cert = %cert.display(), "musterd listening (QUIC, ALPN muster/1)");
}
