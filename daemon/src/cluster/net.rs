//! Node-to-node RPCs: openraft's append-entries, vote and install-snapshot over QUIC,
//! between endpoints that authenticate each other by the cluster secret
//! ([`super::identity`]).
//!
//! One bidirectional stream carries one RPC: the request ([`Rpc`]) one way and the
//! `Result` that openraft's [`openraft::Raft`] method returned the other, each a frame:
//! a `u32` big-endian length, then that many bytes of postcard, read through the
//! protocol's `FrameReader` ([`rpc_frames`]). The client side is
//! [`Network`] (a [`RaftNetworkFactory`]) and its [`Peer`]s; the server side is
//! [`serve`].
//!
//! The client side also keeps what each peer last answered ([`Contacts`]): a peer whose
//! RPCs have failed for [`UNREACHABLE_AFTER`] without an answer is logged unreachable,
//! once, at WARN, and reachable again, once, at INFO, when it next answers (openraft's
//! own line per failed RPC and retry is filtered out, see `crate::logging`). A serving
//! leader exports the same as gauges ([`Network::publish_gauges`]).

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow};
use muster_protocol::frame::{FrameReader, Wants};
use openraft::AnyError;
use openraft::error::{
    InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError,
    Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use super::identity::SERVER_NAME;
use super::{Muster, NodeAddr};
use crate::admission::{Place, Pool};

/// Largest frame, request or response, in bytes. An append-entries request past it is
/// split by openraft (see [`Peer`]); a frame announcing more is refused before anything
/// is read or allocated for it.
pub const MAX_RPC_BYTES: usize = 256 * 1024 * 1024;

/// Longest a connect (name resolution and handshake) may take, on either side. It runs
/// on past an RPC's own deadline, so a slow handshake still serves the next RPC.
pub const RPC_TIMEOUT: Duration = Duration::from_secs(3);

/// Bytes of requests (read, or being read, and not yet answered) one connection may
/// hold in a node's memory: past it, the node reads no more of that connection until
/// an answer frees some, so a peer sending many large frames at once is slowed, not
/// buffered.
pub const MAX_BUFFERED_PER_CONNECTION: usize = MAX_RPC_BYTES;

/// Bytes of requests all connections together may hold in a node's memory.
pub const MAX_BUFFERED_BYTES: usize = 2 * MAX_RPC_BYTES;

/// Connections a node serves at once, counted once a peer's key was verified; past it
/// a newcomer is closed ([`CLOSE_LIMIT`]). A healthy cluster holds one per other node
/// (and a few while nodes restart).
pub const MAX_CONNECTIONS: usize = 64;

/// Handshakes a node lets run at once (each for at most [`RPC_TIMEOUT`]), of which
/// [`MAX_HANDSHAKES_PER_ADDRESS`] from one source address. A newcomer is never refused
/// for lack of room: the oldest handshake of its own address (when that address holds
/// its share) or else the oldest of all is dropped. Every handshake comes after a QUIC
/// Retry, so spoofed sources hold none.
pub const MAX_HANDSHAKES: usize = 64;

/// Handshakes from one source address a node lets run at once.
pub const MAX_HANDSHAKES_PER_ADDRESS: usize = 16;

/// A peer whose RPCs have all failed (or been given up by openraft's timeouts) for this
/// long, with no answer in between, is logged unreachable. Longer than a few missed
/// heartbeats (100 ms apart) and openraft's backoff after an unreachable peer (500 ms),
/// so a single lost RPC or a peer's quick restart is not worth a warning; as long as a
/// leader goes without a majority before it stops serving.
pub const UNREACHABLE_AFTER: Duration = Duration::from_secs(1);

/// A failed RPC this long after the previous failure starts a new streak of failures
/// rather than continuing the old one: a peer last tried long ago (a follower asks the
/// others only in elections) is not unreachable for all that time.
const STREAK_GAP: Duration = Duration::from_secs(2);

/// Application close code of a connection refused for [`MAX_CONNECTIONS`].
const CLOSE_LIMIT: u32 = 5;

/// Bytes a frame's buffer grows by ahead of the data: a frame's memory follows what
/// actually arrived, not what its header announces.
const READ_CHUNK: usize = 64 * 1024;

// A request is read a chunk at a time, each taken from the budgets first: a chunk must
// fit in both, or its read would wait for ever.
const _: () = assert!(READ_CHUNK <= MAX_BUFFERED_PER_CONNECTION);
const _: () = assert!(MAX_BUFFERED_PER_CONNECTION <= MAX_BUFFERED_BYTES);
// A frame of the limit fits in a connection's budget, so it can always be read whole.
const _: () = assert!(MAX_RPC_BYTES <= MAX_BUFFERED_PER_CONNECTION);

/// Application error code on a stream stopped or reset for an unreadable request.
const RESET_BAD_FRAME: u32 = 1;

/// Application error code on a stream reset because the answer could not be sent.
const RESET_NO_ANSWER: u32 = 2;

// ---------------------------------------------------------------------------------------
// Wire format

/// One request, the first and only frame a stream carries from the connecting node.
/// The answer frame is the `Result` of the matching [`openraft::Raft`] method.
#[derive(Debug, Serialize, Deserialize)]
pub enum Rpc {
    /// Answered by `Result<AppendEntriesResponse<u64>, RaftError<u64>>`.
    AppendEntries(AppendEntriesRequest<Muster>),
    /// Answered by `Result<VoteResponse<u64>, RaftError<u64>>`.
    Vote(VoteRequest<u64>),
    /// Answered by `Result<InstallSnapshotResponse<u64>, RaftError<u64, InstallSnapshotError>>`.
    InstallSnapshot(InstallSnapshotRequest<Muster>),
    /// Answered by [`PreVoteResponse`] (not an openraft RPC: see `cluster::elect`).
    PreVote(PreVoteRequest),
}

/// A would-you-vote-for-me question, sent before a real election.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreVoteRequest {
    /// The node that would stand.
    pub candidate: u64,
    /// The term it would stand in: its current term plus one (its term is not raised).
    pub term: u64,
    /// The last entry of its log.
    pub last_log_id: Option<openraft::LogId<u64>>,
}

/// The answer to a [`PreVoteRequest`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreVoteResponse {
    /// Whether this node would vote for the candidate now.
    pub granted: bool,
}

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
enum FrameError {
    #[error("frame of {0} bytes is over the limit of {MAX_RPC_BYTES}")]
    TooLarge(u64),
    #[error("frame of {expected} bytes ended after {got}")]
    Truncated { expected: usize, got: usize },
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// The reader of one RPC frame: the protocol's [`FrameReader`] with this limit. A
/// postcard body is never empty, but an empty one is left to postcard to refuse, as an
/// undecodable request or answer. Its buffer grows with the bytes read, never with
/// what a header announces.
fn rpc_frames() -> FrameReader {
    FrameReader::with_limit(MAX_RPC_BYTES)
        .allowing_empty()
        .growing_with_arrivals()
}

/// Reads one frame. The announced length is checked before anything else is read, and
/// the buffer grows with the bytes that arrive rather than with the announcement.
async fn read_frame<R: AsyncRead + Unpin>(reader: &mut R) -> Result<Vec<u8>, FrameError> {
    Ok(read_frame_within(reader, None).await?.0)
}

/// What requests may hold in memory: the node's budget and one connection's.
#[derive(Clone)]
struct Budget {
    node: Arc<Semaphore>,
    connection: Arc<Semaphore>,
}

impl Budget {
    fn new(node: &Arc<Semaphore>, connection_bytes: usize) -> Budget {
        Budget {
            node: Arc::clone(node),
            connection: Arc::new(Semaphore::new(connection_bytes)),
        }
    }

    /// Waits until `bytes` more may be held; held until the permits are dropped.
    async fn take(&self, bytes: usize) -> [tokio::sync::OwnedSemaphorePermit; 2] {
        assert!(
            (1..=READ_CHUNK).contains(&bytes),
            "a budget is taken a chunk at a time, not {bytes} bytes"
        );
        let n = u32::try_from(bytes).expect("a read chunk fits in u32");
        let closed = "a budget's semaphore is never closed";
        let connection = Arc::clone(&self.connection)
            .acquire_many_owned(n)
            .await
            .expect(closed);
        let node = Arc::clone(&self.node)
            .acquire_many_owned(n)
            .await
            .expect(closed);
        [connection, node]
    }
}

/// Reads one request frame as [`read_frame`] does, taking each chunk's bytes from
/// `budget` before reading it; the permits returned hold them until dropped (once the
/// request is answered).
async fn read_request<R: AsyncRead + Unpin>(
    reader: &mut R,
    budget: &Budget,
) -> Result<(Vec<u8>, Vec<tokio::sync::OwnedSemaphorePermit>), FrameError> {
    read_frame_within(reader, Some(budget)).await
}

/// Reads one frame through [`rpc_frames`], no further than its end: its header, checked
/// before a byte of the body is read, then its body in chunks of at most [`READ_CHUNK`],
/// each chunk's bytes taken from `budget` (if any) before it is read. The permits hold
/// exactly the body's bytes.
async fn read_frame_within<R: AsyncRead + Unpin>(
    reader: &mut R,
    budget: Option<&Budget>,
) -> Result<(Vec<u8>, Vec<tokio::sync::OwnedSemaphorePermit>), FrameError> {
    let mut frames = rpc_frames();
    let mut held = Vec::new();
    let mut chunk = Vec::new();
    loop {
        match frames.next_frame() {
            Ok(Some(body)) => {
                debug_assert!(body.len() <= MAX_RPC_BYTES, "a frame within the limit");
                debug_assert_eq!(
                    held.len(),
                    if budget.is_some() {
                        2 * body.len().div_ceil(READ_CHUNK)
                    } else {
                        0
                    },
                    "two permits (the connection's, the node's) per chunk read"
                );
                return Ok((body, held));
            }
            Ok(None) => {}
            Err(muster_protocol::frame::FrameError::TooLarge { len, .. }) => {
                return Err(FrameError::TooLarge(len as u64));
            }
            Err(e @ muster_protocol::frame::FrameError::Empty) => {
                unreachable!("an RPC frame reader takes empty bodies: {e}")
            }
        }
        let want = match frames.wants() {
            Wants::Header(n) => n,
            Wants::Body { missing, .. } => {
                let want = missing.min(READ_CHUNK);
                if let Some(budget) = budget {
                    held.extend(budget.take(want).await);
                }
                want
            }
            Wants::Nothing => unreachable!("next_frame returned neither a frame nor an error"),
        };
        chunk.resize(want, 0);
        let got = read_full(reader, &mut chunk).await?;
        frames.push(&chunk[..got]);
        if got < want {
            return Err(match frames.wants() {
                // As a `read_u32` cut short says it.
                Wants::Header(_) => std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into(),
                Wants::Body { len, missing } => FrameError::Truncated {
                    expected: len,
                    got: len - missing,
                },
                Wants::Nothing => unreachable!("a read cut short completes nothing"),
            });
        }
    }
}

/// Reads until `buf` is full or the stream ends; returns the bytes read.
async fn read_full<R: AsyncRead + Unpin>(reader: &mut R, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match reader.read(&mut buf[got..]).await? {
            0 => break,
            n => got += n,
        }
    }
    Ok(got)
}

/// Writes one frame; one over [`MAX_RPC_BYTES`] is refused before a byte is written.
async fn write_frame<W: AsyncWrite + Unpin>(writer: &mut W, body: &[u8]) -> Result<(), FrameError> {
    let len = u32::try_from(body.len())
        .ok()
        .filter(|&len| len as usize <= MAX_RPC_BYTES)
        .ok_or(FrameError::TooLarge(body.len() as u64))?;
    writer.write_all(&len.to_be_bytes()).await?;
    writer.write_all(body).await?;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Client side

/// Sends a node's RPCs to its peers: openraft's network factory. Connections are shared
/// by every [`Peer`] of the same target, so openraft's short-lived clients (elections,
/// leadership checks) do not each pay a handshake.
#[derive(Clone)]
pub struct Network {
    endpoint: quinn::Endpoint,
    /// Addresses used instead of a node's `cluster_addr` (tests put relays between nodes).
    routes: Arc<HashMap<u64, String>>,
    connections: Arc<Connections>,
    contacts: Arc<Contacts>,
    /// Set while a leader has stepped back (see `elect`'s check-quorum): it sends no
    /// append-entries or snapshots, so the followers stop hearing from it and elect.
    quiet: Arc<AtomicBool>,
}

/// What each peer last answered, by node id: shared by a node's [`Network`] and every
/// [`Peer`] it made, so that each outage of a peer is logged once however many clients
/// openraft makes for it.
#[derive(Default)]
struct Contacts(Mutex<HashMap<u64, Contact>>);

/// One peer's answers, as this node saw them.
#[derive(Debug)]
struct Contact {
    /// When it last answered an RPC (an error of its Raft is an answer); `None`: never
    /// since this process started.
    heard: Option<Instant>,
    /// When this process first sent it an RPC.
    first_tried: Instant,
    /// The current streak of failed RPCs, with no answer in between: when the first of
    /// them was sent, and when the last one failed.
    failing: Option<(Instant, Instant)>,
    /// Since when it is logged unreachable (until it answers again).
    unreachable: Option<Instant>,
}

impl Contact {
    /// How long it has not answered: since its last answer, or since it was first tried.
    fn silent(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.heard.unwrap_or(self.first_tried))
    }
}

impl Contacts {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Contact>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// An RPC to `target` is being sent.
    fn tried(&self, target: u64, now: Instant) {
        self.lock().entry(target).or_insert(Contact {
            heard: None,
            first_tried: now,
            failing: None,
            unreachable: None,
        });
    }

    /// `target` answered: a peer logged unreachable is logged reachable again, once.
    fn answered(&self, target: u64, addr: &str, now: Instant) {
        let mut map = self.lock();
        debug_assert!(map.contains_key(&target), "node {target} answered untried");
        let Some(c) = map.get_mut(&target) else {
            return;
        };
        c.heard = Some(now);
        c.failing = None;
        if let Some(since) = c.unreachable.take() {
            info!(
                node = target,
                addr,
                unreachable_ms = now.saturating_duration_since(since).as_millis() as u64,
                "cluster node reachable again"
            );
        }
    }

    /// An RPC to `target` sent at `sent` failed (or was given up) with `error`. Once
    /// the streak of failures is [`UNREACHABLE_AFTER`] long, the peer is logged
    /// unreachable, once until it answers again.
    fn failed(&self, target: u64, addr: &str, sent: Instant, now: Instant, error: &str) {
        debug_assert!(sent <= now, "an RPC fails after it was sent");
        let mut map = self.lock();
        debug_assert!(
            map.contains_key(&target),
            "an RPC to node {target} failed untried"
        );
        let Some(c) = map.get_mut(&target) else {
            return;
        };
        let first = match c.failing {
            Some((first, last)) if now.saturating_duration_since(last) < STREAK_GAP => {
                first.min(sent)
            }
            _ => sent,
        };
        c.failing = Some((first, now));
        debug_assert!(
            first <= now,
            "a streak of failures starts before its last one"
        );
        if c.unreachable.is_none() && now.saturating_duration_since(first) >= UNREACHABLE_AFTER {
            c.unreachable = Some(now);
            warn!(
                node = target,
                addr,
                silent_ms = c.silent(now).as_millis() as u64,
                error,
                "cluster node unreachable: its RPCs are retried without further lines until it answers"
            );
        }
    }
}

/// Publishes a serving leader's view of `members` (the applied membership's nodes, true
/// for voters) from its `contacts`, once a second: for each,
/// `muster_cluster_node_last_contact_seconds{node}` (since it last answered an RPC,
/// or since it was first tried), and `muster_cluster_voters_reachable`: the voters not
/// logged unreachable, the leader included. Only a leader sends RPCs to every member
/// all the time, so only its view is current; a node that stops leading stops
/// publishing them, and they go after `crate::metrics::GAUGE_IDLE_TIMEOUT`.
fn publish_gauges(contacts: &Contacts, members: &BTreeMap<u64, bool>) {
    let now = Instant::now();
    let map = contacts.lock();
    let mut reachable = 0u64;
    for (&id, &voter) in members {
        let unreachable = match map.get(&id) {
            Some(c) => {
                metrics::gauge!("muster_cluster_node_last_contact_seconds", "node" => id.to_string())
                    .set(c.silent(now).as_secs_f64());
                c.unreachable.is_some()
            }
            // The leader itself, or a member it has not sent anything yet.
            None => false,
        };
        reachable += u64::from(voter && !unreachable);
    }
    metrics::gauge!("muster_cluster_voters_reachable").set(reachable as f64);
}

/// One RPC's outcome for [`Contacts`]: answered, failed, or dropped unsettled. An
/// openraft RPC is dropped past openraft's own timeout (100 ms for an append): that
/// counts as failed. (Pre-votes are never dropped: `elect` lets each run to its
/// deadline.)
struct Attempt {
    contacts: Arc<Contacts>,
    target: u64,
    addr: String,
    sent: Instant,
    /// Settled: answered, failed or forgotten.
    settled: bool,
}

impl Attempt {
    fn start(contacts: &Arc<Contacts>, target: u64, addr: &str) -> Attempt {
        let sent = Instant::now();
        contacts.tried(target, sent);
        Attempt {
            contacts: Arc::clone(contacts),
            target,
            addr: addr.to_owned(),
            sent,
            settled: false,
        }
    }

    fn answered(mut self) {
        self.settled = true;
        self.contacts
            .answered(self.target, &self.addr, Instant::now());
    }

    fn failed(mut self, error: &str) {
        self.settled = true;
        self.contacts
            .failed(self.target, &self.addr, self.sent, Instant::now(), error);
    }

    /// Neither: the request was never sent (it is too large).
    fn forget(mut self) {
        self.settled = true;
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        if !self.settled {
            self.contacts.failed(
                self.target,
                &self.addr,
                self.sent,
                Instant::now(),
                "no answer before the RPC was given up",
            );
        }
    }
}

/// Established connections by target node, with the address each was made to.
#[derive(Default)]
struct Connections(Mutex<HashMap<u64, (String, quinn::Connection)>>);

impl Connections {
    fn get(&self, target: u64, addr: &str) -> Option<quinn::Connection> {
        let map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        map.get(&target)
            .filter(|(a, c)| a == addr && c.close_reason().is_none())
            .map(|(_, c)| c.clone())
    }

    fn put(&self, target: u64, addr: &str, conn: &quinn::Connection) {
        let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        map.insert(target, (addr.to_owned(), conn.clone()));
    }

    /// Forgets `conn` if it is still the one kept for `target`.
    fn forget(&self, target: u64, conn: &quinn::Connection) {
        let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if map
            .get(&target)
            .is_some_and(|(_, c)| c.stable_id() == conn.stable_id())
        {
            map.remove(&target);
        }
    }
}

impl Network {
    /// A factory sending from `endpoint` (made by [`endpoint`]) to each node's
    /// `cluster_addr`, or to its entry in `routes` where there is one.
    pub fn new(endpoint: quinn::Endpoint, routes: HashMap<u64, String>) -> Network {
        Network {
            endpoint,
            routes: Arc::new(routes),
            connections: Arc::default(),
            contacts: Arc::default(),
            quiet: Arc::default(),
        }
    }

    /// Publishes what this network's peers last answered, as a serving leader sees
    /// them, for the nodes of `members` (true for voters): see [`publish_gauges`].
    pub fn publish_gauges(&self, members: &BTreeMap<u64, bool>) {
        publish_gauges(&self.contacts, members);
    }

    /// Stops (`true`) or resumes sending append-entries and snapshots: a leader that
    /// stepped back must not keep its followers' leases alive with retries of what it
    /// could not get acknowledged.
    pub fn set_quiet(&self, quiet: bool) {
        self.quiet.store(quiet, Ordering::Relaxed);
    }
}

impl RaftNetworkFactory<Muster> for Network {
    type Network = Peer;

    /// A client for `target`; it connects at its first RPC, not here.
    async fn new_client(&mut self, target: u64, node: &NodeAddr) -> Peer {
        let addr = self
            .routes
            .get(&target)
            .cloned()
            .unwrap_or_else(|| node.cluster_addr.clone());
        Peer {
            target,
            node: node.clone(),
            addr,
            endpoint: self.endpoint.clone(),
            connections: Arc::clone(&self.connections),
            contacts: Arc::clone(&self.contacts),
            quiet: Arc::clone(&self.quiet),
            connecting: None,
        }
    }
}

/// Sends RPCs to one node: connects at its first RPC, reuses the connection, and
/// reconnects after the connection is lost.
///
/// Failures map to openraft's [`RPCError`] so that openraft backs off where retrying at
/// once is pointless:
/// - no connection (the name does not resolve, no handshake within [`RPC_TIMEOUT`] or
///   before the RPC's hard TTL ends, the peer refused our identity or we refused its),
///   or a request or answer one side cannot read (a node of another version):
///   [`RPCError::Unreachable`], after which openraft waits for [`RaftNetwork::backoff`]
///   before the next try. A connect cut short by the TTL goes on for the next RPC;
/// - the connection or stream broke during the RPC, or no answer within the RPC's hard
///   TTL: [`RPCError::Network`], retried without backoff (on a new connection if the old
///   one is gone; if that connect fails, the next error is `Unreachable`);
/// - an append-entries request that encodes to more than [`MAX_RPC_BYTES`]:
///   [`RPCError::PayloadTooLarge`] with half its entries as the hint, so openraft
///   splits it (a single entry too large is `Unreachable`: it can never be sent);
/// - the remote [`openraft::Raft`] answered with an error: [`RPCError::RemoteError`].
pub struct Peer {
    target: u64,
    node: NodeAddr,
    addr: String,
    endpoint: quinn::Endpoint,
    connections: Arc<Connections>,
    contacts: Arc<Contacts>,
    /// The [`Network`]'s switch: set while the node has stepped back.
    quiet: Arc<AtomicBool>,
    /// A connect under way. It is a task of its own, so an RPC that gives up on its TTL
    /// leaves it running for the next RPC instead of starting the handshake over.
    connecting: Option<JoinHandle<anyhow::Result<quinn::Connection>>>,
}

/// Why an RPC failed before the remote Raft answered.
#[derive(Debug)]
enum Failure {
    /// Retry only after a backoff.
    Unreachable(anyhow::Error),
    /// Retry at once.
    Network(anyhow::Error),
    /// The request is over [`MAX_RPC_BYTES`].
    TooLarge(usize),
}

impl Failure {
    fn into_rpc_error<E: std::error::Error>(self) -> RPCError<u64, NodeAddr, E> {
        match self {
            Failure::Unreachable(e) => {
                RPCError::Unreachable(Unreachable::from(AnyError::error(format!("{e:#}"))))
            }
            Failure::Network(e) => {
                RPCError::Network(NetworkError::from(AnyError::error(format!("{e:#}"))))
            }
            Failure::TooLarge(len) => RPCError::Unreachable(Unreachable::from(AnyError::error(
                format!("request of {len} bytes is over the limit of {MAX_RPC_BYTES}"),
            ))),
        }
    }
}

impl Peer {
    /// The live connection to the target, connecting if there is none.
    async fn connection(&mut self) -> Result<quinn::Connection, Failure> {
        if let Some(conn) = self.connections.get(self.target, &self.addr) {
            return Ok(conn);
        }
        let task = self.connecting.get_or_insert_with(|| {
            let (endpoint, addr) = (self.endpoint.clone(), self.addr.clone());
            let (target, connections) = (self.target, Arc::clone(&self.connections));
            tokio::spawn(async move {
                let conn = tokio::time::timeout(RPC_TIMEOUT, connect(&endpoint, &addr))
                    .await
                    .map_err(|_| anyhow!("no handshake within {RPC_TIMEOUT:?}"))??;
                connections.put(target, &addr, &conn);
                Ok(conn)
            })
        });
        let joined = task.await;
        self.connecting = None;
        let conn = joined
            .map_err(|e| anyhow!("connect task failed: {e}"))
            .and_then(|r| r)
            .map_err(|e| {
                Failure::Unreachable(e.context(format!(
                    "connecting to node {} at {}",
                    self.target, self.addr
                )))
            })?;
        Ok(conn)
    }

    /// Sends one request and returns the remote Raft's answer, within `ttl`, and
    /// notes the outcome in the peer's [`Contacts`] (see [`Attempt`] for a call
    /// dropped unfinished).
    async fn call<T: DeserializeOwned>(&mut self, rpc: &Rpc, ttl: Duration) -> Result<T, Failure> {
        let attempt = Attempt::start(&self.contacts, self.target, &self.addr);
        let outcome = self.send(rpc, ttl).await;
        match &outcome {
            Ok(_) => attempt.answered(),
            Err(Failure::Unreachable(e) | Failure::Network(e)) => attempt.failed(&format!("{e:#}")),
            Err(Failure::TooLarge(_)) => attempt.forget(),
        }
        outcome
    }

    /// [`Peer::call`]'s exchange.
    async fn send<T: DeserializeOwned>(&mut self, rpc: &Rpc, ttl: Duration) -> Result<T, Failure> {
        let body = postcard::to_stdvec(rpc)
            .map_err(|e| Failure::Unreachable(anyhow!("encoding the request: {e}")))?;
        if body.len() > MAX_RPC_BYTES {
            return Err(Failure::TooLarge(body.len()));
        }
        let (target, addr) = (self.target, self.addr.clone());
        let mut connected = None;
        let exchange = async {
            let conn = self.connection().await?;
            connected = Some(conn.clone());
            match exchange(&conn, &body).await {
                Ok(answer) => Ok(answer),
                Err(e) => {
                    let refused = e.is::<RequestRefused>();
                    let e = e.context(format!("RPC to node {target} at {addr}"));
                    if refused {
                        return Err(Failure::Unreachable(e));
                    }
                    match conn.close_reason() {
                        Some(reason) => {
                            self.connections.forget(target, &conn);
                            Err(connection_failure(reason, e))
                        }
                        None => Err(Failure::Network(e)),
                    }
                }
            }
        };
        let outcome = tokio::time::timeout(ttl, exchange).await;
        let answer = match outcome {
            Ok(answer) => answer?,
            // The connect goes on in its task, for the next RPC.
            Err(_) => {
                let Some(conn) = connected else {
                    return Err(Failure::Unreachable(anyhow!(
                        "node {target} at {addr}: no connection within {ttl:?}"
                    )));
                };
                // A connection silent for a whole RPC is likely to a process that is gone
                // (a restarted node's new one does not know it): the next RPC connects
                // afresh. RPCs still under way on it finish or fail on their own.
                self.connections.forget(target, &conn);
                return Err(Failure::Network(anyhow!(
                    "RPC to node {target} at {addr}: no answer within {ttl:?}"
                )));
            }
        };
        postcard::from_bytes(&answer).map_err(|e| {
            Failure::Unreachable(anyhow!(
                "RPC to node {target} at {addr}: unreadable answer ({e}): another version?"
            ))
        })
    }

    /// Asks the target whether it would vote for this node ([`super::elect`]).
    pub async fn pre_vote(
        &mut self,
        req: &PreVoteRequest,
        ttl: Duration,
    ) -> anyhow::Result<PreVoteResponse> {
        self.call(&Rpc::PreVote(req.clone()), ttl)
            .await
            .map_err(|failure| match failure {
                Failure::Unreachable(e) | Failure::Network(e) => e,
                Failure::TooLarge(len) => anyhow!("a pre-vote of {len} bytes"),
            })
    }

    /// Maps the outcome of [`Peer::call`] to openraft's errors.
    #[expect(
        clippy::result_large_err,
        reason = "openraft's own error type, which RaftNetwork returns"
    )]
    fn answer<T, E: std::error::Error>(
        &self,
        outcome: Result<Result<T, RaftError<u64, E>>, Failure>,
    ) -> Result<T, RPCError<u64, NodeAddr, RaftError<u64, E>>> {
        match outcome {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(remote)) => Err(RPCError::RemoteError(RemoteError::new_with_node(
                self.target,
                self.node.clone(),
                remote,
            ))),
            Err(failure) => Err(failure.into_rpc_error()),
        }
    }
}

/// How a lost connection is reported: refused by a peer (its TLS said no, a protocol
/// violation) or by us means backing off; a timeout, reset or close means reconnecting.
fn connection_failure(reason: quinn::ConnectionError, e: anyhow::Error) -> Failure {
    let e = e.context(reason.to_string());
    match reason {
        quinn::ConnectionError::ConnectionClosed(_)
        | quinn::ConnectionError::TransportError(_)
        | quinn::ConnectionError::VersionMismatch => Failure::Unreachable(e),
        quinn::ConnectionError::ApplicationClosed(_)
        | quinn::ConnectionError::Reset
        | quinn::ConnectionError::TimedOut
        | quinn::ConnectionError::LocallyClosed
        | quinn::ConnectionError::CidsExhausted => Failure::Network(e),
    }
}

/// Resolves `addr` (`HOST:PORT`) to an address `endpoint` can send to and connects.
async fn connect(endpoint: &quinn::Endpoint, addr: &str) -> anyhow::Result<quinn::Connection> {
    let local = endpoint
        .local_addr()
        .context("reading the cluster endpoint's address")?;
    let mut found: Vec<SocketAddr> = tokio::net::lookup_host(addr)
        .await
        .with_context(|| format!("resolving {addr:?}"))?
        .collect();
    // An IPv4 socket can reach only IPv4 addresses; an IPv6 one prefers IPv6.
    found.sort_by_key(|a| a.is_ipv4() != local.is_ipv4());
    let remote = found
        .into_iter()
        .find(|a| local.is_ipv6() || a.is_ipv4())
        .ok_or_else(|| anyhow!("{addr:?} resolves to no address of the endpoint's family"))?;
    let conn = endpoint
        .connect(remote, SERVER_NAME)
        .with_context(|| format!("connecting to {remote}"))?
        .await
        .with_context(|| format!("handshake with {remote}"))?;
    Ok(conn)
}

/// The peer stopped the stream because it could not read our request: a node of
/// another version, which an immediate retry will not change.
#[derive(Debug, thiserror::Error)]
#[error("the peer could not read the request (another version?)")]
struct RequestRefused;

/// Whether a frame failed because the peer stopped or reset the stream as unreadable.
fn refused_by_peer(e: &FrameError) -> bool {
    let FrameError::Io(io) = e else {
        return false;
    };
    let Some(inner) = io.get_ref() else {
        return false;
    };
    let code = match (
        inner.downcast_ref::<quinn::ReadError>(),
        inner.downcast_ref::<quinn::WriteError>(),
    ) {
        (Some(quinn::ReadError::Reset(code)), _) => *code,
        (_, Some(quinn::WriteError::Stopped(code))) => *code,
        _ => return false,
    };
    code == RESET_BAD_FRAME.into()
}

/// One RPC on its own stream: the request frame out, the answer frame back.
async fn exchange(conn: &quinn::Connection, request: &[u8]) -> anyhow::Result<Vec<u8>> {
    let (mut send, mut recv) = conn.open_bi().await.context("opening a stream")?;
    let sent = write_frame(&mut send, request).await;
    let answer = match sent {
        Ok(()) => {
            send.finish().context("finishing the request")?;
            read_frame(&mut recv).await
        }
        Err(e) => Err(e),
    };
    match answer {
        Ok(answer) => Ok(answer),
        Err(e) if refused_by_peer(&e) => Err(RequestRefused.into()),
        Err(e) => Err(anyhow::Error::new(e).context("sending the request or reading the answer")),
    }
}

impl RaftNetwork<Muster> for Peer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<Muster>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RPCError<u64, NodeAddr, RaftError<u64>>> {
        if self.quiet.load(Ordering::Relaxed) {
            return Err(stepped_back());
        }
        let entries = rpc.entries.len() as u64;
        match self.call(&Rpc::AppendEntries(rpc), option.hard_ttl()).await {
            Err(Failure::TooLarge(_)) if entries > 1 => Err(RPCError::PayloadTooLarge(
                PayloadTooLarge::new_entries_hint(entries / 2),
            )),
            outcome => self.answer(outcome),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        option: RPCOption,
    ) -> Result<VoteResponse<u64>, RPCError<u64, NodeAddr, RaftError<u64>>> {
        let outcome = self.call(&Rpc::Vote(rpc), option.hard_ttl()).await;
        self.answer(outcome)
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<Muster>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<u64>,
        RPCError<u64, NodeAddr, RaftError<u64, InstallSnapshotError>>,
    > {
        if self.quiet.load(Ordering::Relaxed) {
            return Err(stepped_back());
        }
        let outcome = self
            .call(&Rpc::InstallSnapshot(rpc), option.hard_ttl())
            .await;
        self.answer(outcome)
    }
}

/// The error of an RPC a stepped-back leader does not send: openraft backs off.
fn stepped_back<E: std::error::Error>() -> RPCError<u64, NodeAddr, E> {
    RPCError::Unreachable(Unreachable::from(AnyError::error(
        "not sent: this leader stepped back (no majority heard from)",
    )))
}

// ---------------------------------------------------------------------------------------
// Server side

/// What answers the RPCs: a node's openraft and its pre-vote (`node::Served`), or a
/// stand-in in tests.
pub trait Handler: Send + Sync + 'static {
    /// Runs `rpc` and returns the encoded answer frame.
    fn handle(&self, rpc: Rpc) -> impl Future<Output = Result<Vec<u8>, postcard::Error>> + Send;
}

/// Serves the peers' RPCs on `endpoint` with `handler` until the endpoint is closed, then
/// waits for the RPCs under way to be answered.
///
/// Only peers with the cluster identity complete a handshake, and only after a QUIC
/// Retry proved their address; at most [`MAX_HANDSHAKES`] run at once, the oldest
/// dropped for a newcomer. At most [`MAX_CONNECTIONS`] verified connections are served,
/// each with at most [`MAX_STREAMS_PER_CONNECTION`] RPCs at once and
/// [`MAX_BUFFERED_PER_CONNECTION`] bytes of requests held; a frame over [`MAX_RPC_BYTES`] is
/// refused by its header. A stream with an unreadable request is stopped, with a debug
/// log, and its connection goes on.
pub async fn serve<H: Handler>(endpoint: quinn::Endpoint, handler: Arc<H>) {
    let buffered = Arc::new(Semaphore::new(MAX_BUFFERED_BYTES));
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let handshakes = Pool::new(MAX_HANDSHAKES, MAX_HANDSHAKES_PER_ADDRESS);
    let tasks = TaskTracker::new();
    while let Some(incoming) = endpoint.accept().await {
        if !incoming.remote_address_validated() {
            // Always: a node proves its address (one round trip, stateless here) before
            // it costs a handshake, so spoofed packets hold nothing.
            if incoming.may_retry() {
                let _ = incoming.retry();
            } else {
                incoming.ignore();
            }
            continue;
        }
        let place = handshakes.admit(incoming.remote_address().ip());
        let (handler, slots) = (Arc::clone(&handler), Arc::clone(&slots));
        let budget = Budget::new(&buffered, MAX_BUFFERED_PER_CONNECTION);
        tasks.spawn(serve_connection(incoming, place, slots, handler, budget));
    }
    tasks.close();
    tasks.wait().await;
}

/// Serves one connection: its handshake within [`RPC_TIMEOUT`] on a place of the
/// handshake budget (given up if a newer handshake evicts it), then, its peer's key
/// verified, on one of [`MAX_CONNECTIONS`] slots.
async fn serve_connection<H: Handler>(
    incoming: quinn::Incoming,
    place: Place,
    slots: Arc<Semaphore>,
    handler: Arc<H>,
    budget: Budget,
) {
    let remote = incoming.remote_address();
    let handshake = async {
        let connecting = incoming.accept()?;
        connecting.await
    };
    let conn = tokio::select! {
        conn = tokio::time::timeout(RPC_TIMEOUT, handshake) => match conn {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) => {
                debug!(%remote, error = %e, "cluster handshake failed");
                return;
            }
            Err(_) => {
                debug!(%remote, "cluster handshake timed out");
                return;
            }
        },
        () = place.evicted.cancelled() => {
            debug!(%remote, "cluster handshake dropped for a newer one");
            return;
        }
    };
    drop(place);
    let Ok(_slot) = slots.try_acquire_owned() else {
        debug!(%remote, "cluster connection refused: {MAX_CONNECTIONS} served already");
        conn.close(CLOSE_LIMIT.into(), b"connection limit reached");
        return;
    };
    let streams = TaskTracker::new();
    loop {
        match conn.accept_bi().await {
            Ok((send, recv)) => {
                streams.spawn(serve_stream(
                    send,
                    recv,
                    Arc::clone(&handler),
                    budget.clone(),
                ));
            }
            Err(e) => {
                debug!(%remote, error = %e, "cluster connection ended");
                break;
            }
        }
    }
    streams.close();
    streams.wait().await;
}

async fn serve_stream<H: Handler>(
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
    handler: Arc<H>,
    budget: Budget,
) {
    let refuse = |mut send: quinn::SendStream, mut recv: quinn::RecvStream, code: u32| {
        let _ = recv.stop(code.into());
        let _ = send.reset(code.into());
    };
    // The permits hold the request's bytes against the budgets until it is answered.
    let (request, _held) = match read_request(&mut recv, &budget).await {
        Ok(request) => request,
        Err(e) => {
            debug!(error = %e, "unreadable cluster RPC frame");
            return refuse(send, recv, RESET_BAD_FRAME);
        }
    };
    debug_assert!(request.len() <= MAX_RPC_BYTES, "a request within the limit");
    let rpc: Rpc = match postcard::from_bytes(&request) {
        Ok(rpc) => rpc,
        Err(e) => {
            debug!(error = %e, "undecodable cluster RPC");
            return refuse(send, recv, RESET_BAD_FRAME);
        }
    };
    drop(request);
    let answer = match handler.handle(rpc).await {
        Ok(answer) => answer,
        Err(e) => {
            debug!(error = %e, "cluster RPC answer not encodable");
            return refuse(send, recv, RESET_NO_ANSWER);
        }
    };
    if let Err(e) = write_frame(&mut send, &answer).await {
        debug!(error = %e, "cluster RPC answer not sent");
        return refuse(send, recv, RESET_NO_ANSWER);
    }
    let _ = send.finish();
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::net::Ipv4Addr;

    use openraft::error::{Fatal, SnapshotMismatch};
    use openraft::{
        CommittedLeaderId, Entry, EntryPayload, LogId, Membership, SnapshotMeta, SnapshotSegmentId,
        StorageError, StorageIOError, StoredMembership, Vote,
    };
    use quinn::{ConnectionError, TransportErrorCode};

    use super::*;
    use crate::cluster::Round;
    use crate::cluster::identity::{ClusterIdentity, client_config, endpoint, identity};

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";
    const OTHER_SECRET: &[u8] = b"0123456789abcdef0123456789abcdeF";
    const CLUSTER: &str = "prod";

    /// TLS alert `access_denied`, which rustls sends for a certificate the verifier refuses.
    const ACCESS_DENIED: u8 = 49;

    /// Answers votes (granted), append-entries (the remote Raft stopped), snapshot
    /// chunks (a mismatch naming the chunk's offset) and pre-votes (granted for odd
    /// terms).
    struct Fake;

    impl Handler for Fake {
        async fn handle(&self, rpc: Rpc) -> Result<Vec<u8>, postcard::Error> {
            match rpc {
                Rpc::Vote(r) => postcard::to_stdvec(&Ok::<_, RaftError<u64>>(VoteResponse::new(
                    r.vote,
                    r.last_log_id,
                    true,
                ))),
                Rpc::AppendEntries(_) => postcard::to_stdvec(
                    &Err::<AppendEntriesResponse<u64>, _>(RaftError::<u64>::Fatal(Fatal::Stopped)),
                ),
                Rpc::InstallSnapshot(r) => {
                    postcard::to_stdvec(&Err::<InstallSnapshotResponse<u64>, _>(mismatch(r.offset)))
                }
                Rpc::PreVote(r) => postcard::to_stdvec(&PreVoteResponse {
                    granted: r.term % 2 == 1,
                }),
            }
        }
    }

    /// Never answers.
    struct Silent;

    impl Handler for Silent {
        async fn handle(&self, _rpc: Rpc) -> Result<Vec<u8>, postcard::Error> {
            std::future::pending().await
        }
    }

    fn mismatch(offset: u64) -> RaftError<u64, InstallSnapshotError> {
        RaftError::APIError(InstallSnapshotError::SnapshotMismatch(SnapshotMismatch {
            expect: SnapshotSegmentId {
                id: "snap-1".into(),
                offset: 0,
            },
            got: SnapshotSegmentId {
                id: "snap-1".into(),
                offset,
            },
        }))
    }

    /// Whether `target` is held unreachable.
    fn unreachable(contacts: &Contacts, target: u64) -> bool {
        contacts.lock()[&target].unreachable.is_some()
    }

    #[test]
    fn a_peer_is_unreachable_once_its_rpcs_failed_for_a_while_and_reachable_at_its_answer() {
        let contacts = Contacts::default();
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        contacts.tried(3, at(0));
        contacts.answered(3, "n3", at(10));
        // Failures every 500 ms (openraft's backoff): a streak from the first one sent.
        contacts.failed(3, "n3", at(100), at(200), "no answer");
        contacts.failed(3, "n3", at(600), at(700), "no answer");
        assert!(!unreachable(&contacts, 3), "900 ms of failures");
        contacts.failed(3, "n3", at(1_100), at(1_200), "no answer");
        assert!(unreachable(&contacts, 3), "1.1 s of failures");
        assert_eq!(
            contacts.lock()[&3].silent(at(1_200)),
            Duration::from_millis(1_190)
        );
        // It stays so (logged once) until it answers.
        contacts.failed(3, "n3", at(1_600), at(1_700), "no answer");
        contacts.answered(3, "n3", at(1_800));
        assert!(!unreachable(&contacts, 3));
        assert_eq!(
            contacts.lock()[&3].silent(at(1_900)),
            Duration::from_millis(100)
        );

        // Failures far apart (a follower asks in elections only) are each a streak of
        // their own; one RPC given up after a long wait is a streak that long.
        contacts.tried(2, at(0));
        contacts.failed(2, "n2", at(0), at(100), "no answer");
        contacts.failed(2, "n2", at(5_000), at(5_100), "no answer");
        assert!(!unreachable(&contacts, 2));
        contacts.failed(2, "n2", at(9_000), at(10_500), "no answer");
        assert!(unreachable(&contacts, 2));
    }

    fn loopback() -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, 0))
    }

    fn node(addr: &str) -> NodeAddr {
        NodeAddr {
            addr: "127.0.0.1:7420".into(),
            cluster_addr: addr.into(),
        }
    }

    fn log_id(term: u64, index: u64) -> LogId<u64> {
        LogId::new(CommittedLeaderId::new(term, 1), index)
    }

    fn vote_request() -> VoteRequest<u64> {
        VoteRequest::new(Vote::new(7, 3), Some(log_id(6, 41)))
    }

    fn append_request() -> AppendEntriesRequest<Muster> {
        let membership = Membership::new(
            vec![BTreeSet::from([1, 2, 3])],
            BTreeMap::from([(1, node("10.0.0.1:7421")), (2, node("10.0.0.2:7421"))]),
        );
        AppendEntriesRequest {
            vote: Vote::new_committed(7, 1),
            prev_log_id: Some(log_id(6, 40)),
            leader_commit: Some(log_id(6, 39)),
            entries: vec![
                Entry {
                    log_id: log_id(7, 41),
                    payload: EntryPayload::Blank,
                },
                Entry {
                    log_id: log_id(7, 42),
                    payload: EntryPayload::Normal(Round {
                        term: 7,
                        wall_ms: 1_700_000_000_000,
                        changes: Default::default(),
                    }),
                },
                Entry {
                    log_id: log_id(7, 43),
                    payload: EntryPayload::Membership(membership),
                },
            ],
        }
    }

    fn snapshot_request() -> InstallSnapshotRequest<Muster> {
        InstallSnapshotRequest {
            vote: Vote::new_committed(7, 1),
            meta: SnapshotMeta {
                last_log_id: Some(log_id(7, 43)),
                last_membership: StoredMembership::new(
                    Some(log_id(7, 43)),
                    Membership::new(
                        vec![BTreeSet::from([1, 2])],
                        BTreeMap::from([(1, node("a:1")), (2, node("b:2"))]),
                    ),
                ),
                snapshot_id: "snap-1".into(),
            },
            offset: 3 << 20,
            data: vec![0xa5; 1000],
            done: false,
        }
    }

    /// A cluster endpoint on loopback serving `handler`, and its address.
    fn start<H: Handler>(
        identity: &ClusterIdentity,
        handler: H,
    ) -> (quinn::Endpoint, SocketAddr, JoinHandle<()>) {
        let endpoint = endpoint(loopback(), identity).unwrap();
        let addr = endpoint.local_addr().unwrap();
        let task = tokio::spawn(serve(endpoint.clone(), Arc::new(handler)));
        (endpoint, addr, task)
    }

    fn option() -> RPCOption {
        RPCOption::new(Duration::from_secs(5))
    }

    /// Starts a handshake with `server` that never finishes, as one spoofed Initial
    /// does: the client's packets reach the server and nothing comes back. Resolves once
    /// the server answered (a Retry, or its own Initial if it took the handshake on).
    async fn half_open_handshake(
        server: SocketAddr,
        identity: &ClusterIdentity,
    ) -> (quinn::Endpoint, JoinHandle<()>, JoinHandle<()>) {
        let upstream = tokio::net::UdpSocket::bind(loopback()).await.unwrap();
        let downstream = tokio::net::UdpSocket::bind(loopback()).await.unwrap();
        let front = downstream.local_addr().unwrap();
        let (answered, answer) = tokio::sync::oneshot::channel();
        let relay = tokio::spawn(async move {
            let mut answered = Some(answered);
            let (mut from_client, mut from_server) = ([0u8; 2048], [0u8; 2048]);
            loop {
                tokio::select! {
                    got = downstream.recv_from(&mut from_client) => {
                        let (n, _) = got.unwrap();
                        let _ = upstream.send_to(&from_client[..n], server).await;
                    }
                    got = upstream.recv_from(&mut from_server) => {
                        got.unwrap();
                        if let Some(answered) = answered.take() {
                            let _ = answered.send(());
                        }
                    }
                }
            }
        });
        let client = endpoint(loopback(), identity).unwrap();
        let connecting = client.connect(front, SERVER_NAME).unwrap();
        let stalled = tokio::spawn(async move {
            let _ = connecting.await;
        });
        tokio::time::timeout(Duration::from_secs(10), answer)
            .await
            .expect("the server answers the Initial")
            .expect("the relay runs");
        (client, relay, stalled)
    }

    /// A flood of half-open handshakes (more than the node serves connections) holds
    /// nothing: a peer that connects meanwhile is served at once. Every Initial gets a
    /// stateless Retry first, and only a verified peer takes a connection slot.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn half_open_handshakes_do_not_keep_a_peer_out() {
        let id = identity(SECRET, CLUSTER).unwrap();
        let (_server, server_addr, _serving) = start(&id, Fake);
        let mut flood = Vec::new();
        for _ in 0..2 * MAX_CONNECTIONS {
            flood.push(half_open_handshake(server_addr, &id).await);
        }
        let client = endpoint(loopback(), &id).unwrap();
        let mut p = peer(&client, 1, server_addr).await;
        let answer = tokio::time::timeout(RPC_TIMEOUT, p.vote(vote_request(), option()))
            .await
            .expect("answered during the flood")
            .expect("a vote answer");
        assert!(answer.vote_granted);
        for (_, relay, stalled) in flood {
            relay.abort();
            stalled.abort();
        }
    }

    async fn peer(from: &quinn::Endpoint, target: u64, to: SocketAddr) -> Peer {
        let mut network = Network::new(from.clone(), HashMap::new());
        network.new_client(target, &node(&to.to_string())).await
    }

    /// Connects and, if the handshake completes here, waits for the server's verdict:
    /// the client's handshake ends before the server has checked its certificate.
    async fn handshake_error(client: &quinn::Endpoint, server: SocketAddr) -> ConnectionError {
        match client.connect(server, SERVER_NAME).unwrap().await {
            Err(e) => e,
            Ok(conn) => conn.closed().await,
        }
    }

    fn assert_refused_here(e: &ConnectionError) {
        match e {
            ConnectionError::TransportError(t) => {
                assert_eq!(t.code, TransportErrorCode::crypto(ACCESS_DENIED), "{e}")
            }
            other => panic!("expected our own refusal, got {other:?}"),
        }
    }

    fn assert_refused_by_peer(e: &ConnectionError) {
        match e {
            ConnectionError::ConnectionClosed(c) => {
                assert_eq!(
                    c.error_code,
                    TransportErrorCode::crypto(ACCESS_DENIED),
                    "{e}"
                )
            }
            other => panic!("expected the peer's refusal, got {other:?}"),
        }
    }

    #[test]
    fn requests_and_answers_round_trip_through_postcard() {
        fn round_trip<T: Serialize + DeserializeOwned + std::fmt::Debug>(value: &T) {
            let bytes = postcard::to_stdvec(value).unwrap();
            let back: T = postcard::from_bytes(&bytes).unwrap();
            assert_eq!(format!("{back:?}"), format!("{value:?}"));
        }
        round_trip(&Rpc::AppendEntries(append_request()));
        round_trip(&Rpc::Vote(vote_request()));
        round_trip(&Rpc::InstallSnapshot(snapshot_request()));
        round_trip(&Rpc::PreVote(PreVoteRequest {
            candidate: 2,
            term: 9,
            last_log_id: Some(log_id(8, 120)),
        }));
        round_trip(&PreVoteResponse { granted: true });
        for answer in [
            AppendEntriesResponse::Success,
            AppendEntriesResponse::PartialSuccess(Some(log_id(7, 42))),
            AppendEntriesResponse::Conflict,
            AppendEntriesResponse::HigherVote(Vote::new(9, 2)),
        ] {
            round_trip(&Ok::<_, RaftError<u64>>(answer));
        }
        round_trip(&Ok::<_, RaftError<u64>>(VoteResponse::new(
            Vote::new(7, 3),
            None,
            false,
        )));
        round_trip(&Ok::<_, RaftError<u64, InstallSnapshotError>>(
            InstallSnapshotResponse {
                vote: Vote::new_committed(7, 1),
            },
        ));
        let io = std::io::Error::other("disk full");
        for fatal in [
            Fatal::Stopped,
            Fatal::Panicked,
            Fatal::StorageError(StorageError::from(StorageIOError::write_vote(&io))),
        ] {
            round_trip(&Err::<VoteResponse<u64>, _>(RaftError::<u64>::Fatal(fatal)));
        }
        round_trip(&Err::<InstallSnapshotResponse<u64>, _>(mismatch(7)));
    }

    /// Requests hold their bytes against the connection's and the node's budgets until
    /// answered: a request that would pass either waits, whatever its header says.
    /// Whether `f` cannot finish now: it waits for something (here, a budget).
    fn waits<F: Future>(f: F) -> bool {
        let mut f = std::pin::pin!(f);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        f.as_mut().poll(&mut cx).is_pending()
    }

    #[tokio::test]
    async fn requests_are_read_only_within_the_buffered_budgets() {
        let frame = |len: usize| {
            let mut wire = (len as u32).to_be_bytes().to_vec();
            wire.extend(std::iter::repeat_n(7u8, len));
            wire
        };
        let node = Arc::new(Semaphore::new(3 * READ_CHUNK));
        let (one, two) = (
            Budget::new(&node, 2 * READ_CHUNK),
            Budget::new(&node, 2 * READ_CHUNK),
        );

        // A connection's budget: its second request waits for the first's answer.
        let (first, held) = read_request(&mut frame(2 * READ_CHUNK).as_slice(), &one)
            .await
            .unwrap();
        assert_eq!(first.len(), 2 * READ_CHUNK);
        assert_eq!(held.len(), 4, "two chunks, each from both budgets");
        assert_eq!(one.connection.available_permits(), 0);
        assert_eq!(node.available_permits(), READ_CHUNK);
        let second = frame(1);
        assert!(
            waits(read_request(&mut second.as_slice(), &one)),
            "read past the connection's budget"
        );
        drop(held);
        let (body, held_one) = read_request(&mut second.as_slice(), &one).await.unwrap();
        assert_eq!(body, [7]);

        // The node's budget: another connection gets what is left of it, and no more.
        let (body, held_two) = read_request(&mut frame(READ_CHUNK).as_slice(), &two)
            .await
            .unwrap();
        assert_eq!(body.len(), READ_CHUNK);
        let big = frame(2 * READ_CHUNK);
        assert!(
            waits(read_request(&mut big.as_slice(), &two)),
            "read past the node's budget"
        );
        drop((held_one, held_two));
        assert_eq!(
            read_request(&mut big.as_slice(), &two)
                .await
                .unwrap()
                .0
                .len(),
            2 * READ_CHUNK
        );

        // A frame cut short is an error, and gives its bytes back.
        let mut cut = frame(READ_CHUNK + 10);
        cut.truncate(4 + READ_CHUNK + 3);
        match read_request(&mut cut.as_slice(), &one).await {
            Err(FrameError::Truncated { expected, got }) => {
                assert_eq!((expected, got), (READ_CHUNK + 10, READ_CHUNK + 3));
            }
            other => panic!("expected a truncated frame, got {other:?}"),
        }
        assert_eq!(node.available_permits(), 3 * READ_CHUNK);
    }

    #[tokio::test]
    async fn frames_round_trip_and_oversized_ones_are_refused_by_their_header() {
        let mut wire = Vec::new();
        write_frame(&mut wire, b"hello").await.unwrap();
        assert_eq!(wire, b"\0\0\0\x05hello");
        assert_eq!(read_frame(&mut wire.as_slice()).await.unwrap(), b"hello");

        // A frame is read no further than its end; an empty body is a frame (postcard
        // refuses it); a header cut short is an early end of the stream.
        write_frame(&mut wire, b"").await.unwrap();
        wire.extend_from_slice(&[0, 0]);
        let mut reader = wire.as_slice();
        assert_eq!(read_frame(&mut reader).await.unwrap(), b"hello");
        assert_eq!(reader, b"\0\0\0\0\0\0");
        assert_eq!(read_frame(&mut reader).await.unwrap(), b"");
        assert_eq!(reader, b"\0\0");
        match read_frame(&mut reader).await {
            Err(FrameError::Io(e)) => assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof),
            other => panic!("expected an early end, got {other:?}"),
        }

        // A header announcing one byte too many: refused before the body is read (the
        // reader still holds all of it) or any buffer is made for it.
        for announced in [MAX_RPC_BYTES as u32 + 1, u32::MAX] {
            let mut wire = announced.to_be_bytes().to_vec();
            wire.extend_from_slice(&[0; 10]);
            let mut reader = wire.as_slice();
            match read_frame(&mut reader).await {
                Err(FrameError::TooLarge(n)) => assert_eq!(n, u64::from(announced)),
                other => panic!("expected TooLarge, got {other:?}"),
            }
            assert_eq!(reader.len(), 10);
        }

        // A frame of exactly the limit is fine by its header; this one then ends early.
        let mut wire = (MAX_RPC_BYTES as u32).to_be_bytes().to_vec();
        wire.extend_from_slice(&[1; 3]);
        match read_frame(&mut wire.as_slice()).await {
            Err(FrameError::Truncated { expected, got }) => {
                assert_eq!((expected, got), (MAX_RPC_BYTES, 3))
            }
            other => panic!("expected Truncated, got {other:?}"),
        }

        // Writing one over the limit writes nothing (the zeroed pages are never touched).
        let body = vec![0u8; MAX_RPC_BYTES + 1];
        let mut wire = Vec::new();
        match write_frame(&mut wire, &body).await {
            Err(FrameError::TooLarge(n)) => assert_eq!(n, MAX_RPC_BYTES as u64 + 1),
            other => panic!("expected TooLarge, got {other:?}"),
        }
        assert!(wire.is_empty());
    }

    #[tokio::test]
    async fn peers_with_the_same_secret_and_cluster_exchange_rpcs() {
        let id = identity(SECRET, CLUSTER).unwrap();
        let (server, server_addr, serving) = start(&id, Fake);
        let client = endpoint(loopback(), &id).unwrap();

        // Target 1 is routed to the server; its own cluster_addr leads nowhere.
        let mut network = Network::new(
            client.clone(),
            HashMap::from([(1, server_addr.to_string())]),
        );
        let mut one = network.new_client(1, &node("127.0.0.1:9")).await;
        let answer = one.vote(vote_request(), option()).await.unwrap();
        assert_eq!(
            answer,
            VoteResponse::new(Vote::new(7, 3), Some(log_id(6, 41)), true)
        );

        match one.append_entries(append_request(), option()).await {
            Err(RPCError::RemoteError(e)) => {
                assert_eq!(e.target, 1);
                assert_eq!(e.target_node, Some(node("127.0.0.1:9")));
                assert_eq!(e.source, RaftError::Fatal(Fatal::Stopped));
            }
            other => panic!("expected a remote error, got {other:?}"),
        }
        match one.install_snapshot(snapshot_request(), option()).await {
            Err(RPCError::RemoteError(e)) => assert_eq!(e.source, mismatch(3 << 20)),
            other => panic!("expected a remote error, got {other:?}"),
        }
        for (term, granted) in [(9, true), (10, false)] {
            let req = PreVoteRequest {
                candidate: 2,
                term,
                last_log_id: None,
            };
            let answer = one.pre_vote(&req, RPC_TIMEOUT).await.unwrap();
            assert_eq!(answer, PreVoteResponse { granted });
        }
        assert_eq!(client.open_connections(), 1);

        // Another client for the same target shares the connection; target 2, without
        // a route, is reached at its cluster_addr on a connection of its own.
        let mut again = network.new_client(1, &node("127.0.0.1:9")).await;
        assert!(
            again
                .vote(vote_request(), option())
                .await
                .unwrap()
                .vote_granted
        );
        assert_eq!(client.open_connections(), 1);
        let mut two = network
            .new_client(2, &node(&format!("localhost:{}", server_addr.port())))
            .await;
        assert!(
            two.vote(vote_request(), option())
                .await
                .unwrap()
                .vote_granted
        );
        assert_eq!(client.open_connections(), 2);

        // A lost connection is replaced at the next RPC.
        let lost = network
            .connections
            .get(1, &server_addr.to_string())
            .unwrap();
        lost.close(0u32.into(), b"test");
        assert!(
            one.vote(vote_request(), option())
                .await
                .unwrap()
                .vote_granted
        );
        let replaced = network
            .connections
            .get(1, &server_addr.to_string())
            .unwrap();
        assert_ne!(replaced.stable_id(), lost.stable_id());

        // serve returns once its endpoint is closed.
        server.close(0u32.into(), b"done");
        tokio::time::timeout(Duration::from_secs(10), serving)
            .await
            .unwrap()
            .unwrap();
    }

    #[tokio::test]
    async fn another_secret_fails_the_handshake() {
        let (_server, server_addr, _serving) = start(&identity(SECRET, CLUSTER).unwrap(), Fake);
        let stranger = endpoint(loopback(), &identity(OTHER_SECRET, CLUSTER).unwrap()).unwrap();
        // The stranger refuses the server's certificate, ...
        assert_refused_here(&handshake_error(&stranger, server_addr).await);
        // ... which openraft hears as an unreachable node (and backs off).
        let mut p = peer(&stranger, 1, server_addr).await;
        match p.vote(vote_request(), option()).await {
            Err(RPCError::Unreachable(e)) => {
                assert!(e.to_string().contains("handshake with"), "{e}")
            }
            other => panic!("expected Unreachable, got {other:?}"),
        }
        // And the server refuses a stranger's certificate even when the stranger would
        // accept the server's.
        let ours = identity(SECRET, CLUSTER).unwrap();
        let theirs = identity(OTHER_SECRET, CLUSTER).unwrap();
        let mut sneaky = quinn::Endpoint::client(loopback()).unwrap();
        sneaky.set_default_client_config(client_config(&theirs, ours.spki()).unwrap());
        assert_refused_by_peer(&handshake_error(&sneaky, server_addr).await);
    }

    #[tokio::test]
    async fn another_cluster_id_fails_the_handshake() {
        let (_server, server_addr, _serving) = start(&identity(SECRET, CLUSTER).unwrap(), Fake);
        let other = endpoint(loopback(), &identity(SECRET, "staging").unwrap()).unwrap();
        assert_refused_here(&handshake_error(&other, server_addr).await);
        // A server of the other cluster refuses our client the same way.
        let (_s, other_addr, _t) = start(&identity(SECRET, "staging").unwrap(), Fake);
        let ours = endpoint(loopback(), &identity(SECRET, CLUSTER).unwrap()).unwrap();
        assert_refused_here(&handshake_error(&ours, other_addr).await);
    }

    #[tokio::test]
    async fn the_server_refuses_an_oversized_frame_and_keeps_the_connection() {
        let id = identity(SECRET, CLUSTER).unwrap();
        let (_server, server_addr, _serving) = start(&id, Fake);
        let client = endpoint(loopback(), &id).unwrap();
        let conn = client
            .connect(server_addr, SERVER_NAME)
            .unwrap()
            .await
            .unwrap();

        let (mut send, mut recv) = conn.open_bi().await.unwrap();
        send.write_all(&(MAX_RPC_BYTES as u32 + 1).to_be_bytes())
            .await
            .unwrap();
        let mut buf = [0u8; 1];
        match recv.read(&mut buf).await {
            Err(quinn::ReadError::Reset(code)) => assert_eq!(code, RESET_BAD_FRAME.into()),
            other => panic!("expected a reset, got {other:?}"),
        }
        // Garbage of a valid length is refused the same way, which the client tells
        // apart from a broken stream (openraft backs off from a node it cannot talk to).
        let refused = exchange(&conn, &[0xff; 8]).await.unwrap_err();
        assert!(refused.is::<RequestRefused>(), "{refused:#}");
        // The connection still serves.
        let request = postcard::to_stdvec(&Rpc::Vote(vote_request())).unwrap();
        let answer = exchange(&conn, &request).await.unwrap();
        let answer: Result<VoteResponse<u64>, RaftError<u64>> =
            postcard::from_bytes(&answer).unwrap();
        assert!(answer.unwrap().vote_granted);
    }

    #[tokio::test]
    async fn deadlines_map_to_network_and_unreachable() {
        let id = identity(SECRET, CLUSTER).unwrap();
        let (_server, server_addr, _serving) = start(&id, Silent);
        let client = endpoint(loopback(), &id).unwrap();
        let ttl = RPCOption::new(Duration::from_millis(200));
        // Connected (outside the TTL, so a slow handshake cannot decide the outcome),
        // but no answer within the TTL: try again at once.
        let mut p = peer(&client, 1, server_addr).await;
        p.connection().await.unwrap();
        match p.vote(vote_request(), ttl.clone()).await {
            Err(RPCError::Network(e)) => assert!(e.to_string().contains("no answer within")),
            other => panic!("expected NetworkError, got {other:?}"),
        }
        // Nobody there (a socket that drops everything): back off.
        let sink = std::net::UdpSocket::bind(loopback()).unwrap();
        let mut p = peer(&client, 2, sink.local_addr().unwrap()).await;
        match p.vote(vote_request(), ttl).await {
            Err(RPCError::Unreachable(e)) => {
                assert!(e.to_string().contains("no connection within"))
            }
            other => panic!("expected Unreachable, got {other:?}"),
        }
        // A name that does not resolve: back off.
        let mut p = network_peer(&client, "no-such-host.invalid:7421").await;
        match p.vote(vote_request(), option()).await {
            Err(RPCError::Unreachable(e)) => assert!(e.to_string().contains("resolving")),
            other => panic!("expected Unreachable, got {other:?}"),
        }
    }

    async fn network_peer(from: &quinn::Endpoint, addr: &str) -> Peer {
        Network::new(from.clone(), HashMap::new())
            .new_client(3, &node(addr))
            .await
    }
}
