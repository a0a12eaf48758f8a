//! The QUIC endpoint: binding it, the accept loop and each connection's admission
//! (handshake places, the wait for a token, places of `--max-connections`), and the
//! one task that tells the engine which connections were heard from.
//!
//! accept loop → [`handle_connection`] → [`connection::handle_stream`] per stream. A
//! stream carries frames both ways: requests in, replies out, matched by `id`, so a
//! client pipelines as many requests as it likes (up to the in-flight limit) and
//! replies come back as they are ready, not in order. Decoding happens on the tokio
//! workers ([`crate::connection`]); the engine only sees typed requests.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::Context;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::admission::{ADMIN_RESERVED_CONNECTIONS, Admission, Place, Pool};
pub use crate::connection::ServerContext;
use crate::connection::{
    self, CLOSE_LIMIT, CLOSE_UNAUTHORIZED, ConnState, MAX_IN_FLIGHT_PER_CONNECTION,
    MAX_REPLY_BYTES_PER_CONNECTION, Shared, kib,
};
use crate::dispatcher::Command;

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

/// Application error code on connections closed because the daemon stops.
const CLOSE_SHUTDOWN: u32 = 2;

/// Application error code on the connections a cluster node closes when it starts or
/// stops leading: the client looks for the leader again and resumes its session there.
const CLOSE_LEADERSHIP: u32 = 6;

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
    });
    let tracker = TaskTracker::new();
    tracker.spawn(Arc::clone(&heartbeats).report(shutdown.clone()));
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
        let (context, heartbeats) = (Arc::clone(&context), Arc::clone(&heartbeats));
        let shutdown = shutdown.clone();
        tracker.spawn(
            async move {
                let place = (handshake, connection);
                if let Err(e) =
                    handle_connection(incoming, place, context, heartbeats, shutdown).await
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

/// Serves one connection: its handshake (within [`HANDSHAKE_TIMEOUT`], while its
/// handshake place holds), its place of `--max-connections` (at once, or with tokens
/// at its first valid `hello`, which must come within the hello timeout), then each
/// stream it opens, until it ends, the daemon stops or a cluster node's leadership
/// changes.
async fn handle_connection(
    incoming: quinn::Incoming,
    (handshake, connection): (Place, u64),
    context: Arc<Shared>,
    heartbeats: Arc<Heartbeats>,
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
        tasks: TaskTracker::new(),
        context: Arc::clone(&context),
    });
    let streams = state.tasks.clone();
    if context.server.tokens.is_empty() {
        if let Err(e) = state.take_slot(None) {
            conn.close(CLOSE_LIMIT.into(), b"connection limit reached");
            return Err(anyhow::anyhow!(e.message));
        }
    } else {
        // Its place among the unauthenticated is taken now, in the order connections come.
        let place = context
            .admission
            .unauthenticated
            .admit(conn.remote_address().ip());
        streams.spawn(await_token(Arc::clone(&state), place));
    }
    let commands = context.server.commands.clone();
    heartbeats.watch(connection, conn.clone());
    let result = accept_streams(&state, &shutdown).await;
    streams.close();
    streams.wait().await;
    // IMPORTANT: before `Disconnected`, so the engine hears nothing of it after.
    heartbeats.forget(connection);
    // The dispatcher may be gone when the daemon stops; then nothing needs telling.
    let _ = commands.send_async(Command::Disconnected(connection)).await;
    match result {
        Ok(()) | Err(quinn::ConnectionError::ApplicationClosed(_)) => Ok(()),
        Err(quinn::ConnectionError::LocallyClosed) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Serves each stream the connection opens, on its own task, until the connection
/// ends, the daemon stops or a cluster node's leadership changes (the connection is
/// closed then, so that its client looks for the leader).
async fn accept_streams(
    state: &Arc<ConnState>,
    shutdown: &CancellationToken,
) -> Result<(), quinn::ConnectionError> {
    let mut leadership = state.context.server.cluster.as_ref().map(|(_, g)| {
        let mut g = g.clone();
        g.mark_unchanged();
        g
    });
    loop {
        let (send, recv) = tokio::select! {
            s = state.conn.accept_bi() => s?,
            () = shutdown.cancelled() => return Ok(()),
            Some(()) = leadership_changed(&mut leadership) => {
                debug!("closing: the node's leadership changed");
                state.conn.close(CLOSE_LEADERSHIP.into(), b"leadership changed");
                return Ok(());
            }
        };
        let span = info_span!("stream", id = %send.id());
        let stream = connection::handle_stream(Arc::clone(state), (send, recv));
        state.tasks.spawn(stream.instrument(span));
    }
}

/// Closes a connection that has not presented a valid token within the hello timeout.
/// Until it does, it holds a place among the unauthenticated: the oldest of those is
/// closed for a newcomer when they are too many.
async fn await_token(state: Arc<ConnState>, place: Place) {
    let reason: &'static [u8] = tokio::select! {
        () = tokio::time::sleep(state.context.server.hello_timeout) => b"no token presented in time",
        () = place.evicted.cancelled() => b"no token presented; dropped for newer connections",
        () = state.authenticated.cancelled() => return,
        _ = state.conn.closed() => return,
    };
    if state.principal.get().is_none() {
        debug!("closing: {}", String::from_utf8_lossy(reason));
        state.conn.close(CLOSE_UNAUTHORIZED.into(), reason);
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
