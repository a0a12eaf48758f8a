//! The one place the harness reads what the cluster branches add to the wire and to the
//! CLI: the `cluster` object of a `hello` reply, the `leader` of a `not_leader` error,
//! the JSON of `muster cluster status`, and which node and term served a connection.
//!
//! It talks to one node at a time over a raw connection (frames of JSON, as
//! `protocol/PROTOCOL.md` describes them), so it compiles against the SDK as it is on
//! `main` and needs no type that is not merged yet. When the client branch lands,
//! [`Probe`] can become a wrapper over `Client::connect_node` and `Client::cluster()`,
//! and [`connect_leader`] over `Client::connect` with the address list; the parsing
//! functions below are where a field the daemon names differently is adapted.
//!
//! Assumed shapes (field names as the brief gives the SDK's `ClusterHello`):
//! - hello reply: `{"id", "ok": true, "version", "server", "cluster": {"cluster_id",
//!   "node", "term", "leader", "leader_addr"}}`, `cluster` absent on a single daemon;
//! - error reply: `{"id", "ok": false, "error": {"code": "not_leader", "message",
//!   "leader": "HOST:PORT"}}`;
//! - `muster cluster status --json`: one object with `node`, `term`, `leader`, the
//!   voters (`voters`: ids, or objects with `node`/`id`) and the node's applied log
//!   index (`last_applied`, or a log id object with an `index`).

use std::time::Duration;

use muster_sdk::protocol::frame::{self, FrameReader};
use muster_sdk::protocol::ops::{Hello, Op, RequestFrame};
use muster_sdk::{Client, ConnectOptions, Error};
use serde_json::Value;

/// Longest a probe's connection, hello or one call may take.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Pause before a node that does not lead is probed again by [`connect_leader`].
const LEADER_PROBE_RETRY: Duration = Duration::from_millis(50);

/// Longest the SDK connection to the leader may take once a probe found it.
const LEADER_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Bytes read from a probe's reply stream at a time.
const READ_CHUNK: usize = 64 * 1024;

/// Most frames a probe reads while waiting for one reply (pushes are skipped): bounds a
/// daemon that pushes forever.
const MAX_FRAMES_PER_REPLY: usize = 1_000;

/// What a node's `hello` says about its cluster (the SDK's `ClusterHello`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterHello {
    /// The cluster's id (`--cluster-id`).
    pub cluster_id: String,
    /// The node that answered (`--node-id`).
    pub node: u64,
    /// Its current Raft term.
    pub term: u64,
    /// The leader it knows of, if any.
    pub leader: Option<u64>,
    /// The leader's client address, if it knows one.
    pub leader_addr: Option<String>,
}

impl ClusterHello {
    /// True if the node that answered says it is the leader.
    pub fn leads(&self) -> bool {
        self.leader == Some(self.node)
    }
}

/// The node and term that served a connection: every write acknowledged on it was
/// acknowledged by that node as the leader of that term.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Served {
    /// The node.
    pub node: u64,
    /// The term.
    pub term: u64,
}

/// A raw connection to exactly one node, after its `hello`.
pub struct Probe {
    /// Kept so the connection lives as long as the probe.
    _conn: quinn::Connection,
    send: quinn::SendStream,
    recv: quinn::RecvStream,
    frames: FrameReader,
    next_id: u64,
    hello: Value,
}

impl Probe {
    /// Connects to the one address in `options.addr` and says hello, all within
    /// [`PROBE_TIMEOUT`].
    pub async fn open(options: &ConnectOptions) -> Result<Probe, String> {
        tokio::time::timeout(PROBE_TIMEOUT, Probe::open_unbounded(options))
            .await
            .map_err(|_| format!("{}: no hello within {PROBE_TIMEOUT:?}", options.addr))?
    }

    async fn open_unbounded(options: &ConnectOptions) -> Result<Probe, String> {
        let conn = muster_sdk::connect::open(options)
            .await
            .map_err(|e| format!("{}: {e}", options.addr))?;
        let (send, recv) = conn
            .open_bi()
            .await
            .map_err(|e| format!("{}: opening a stream: {e}", options.addr))?;
        let mut probe = Probe {
            _conn: conn,
            send,
            recv,
            frames: FrameReader::new(),
            next_id: 1,
            hello: Value::Null,
        };
        let hello = Hello {
            version: muster_sdk::protocol::PROTOCOL_VERSION,
            token: options.hello_token().map_err(|e| e.to_string())?,
            client: Some("muster-tests probe".into()),
        };
        let reply = probe.call_unbounded(&hello).await?;
        if reply["ok"] != Value::Bool(true) {
            return Err(format!("{}: hello refused: {reply}", options.addr));
        }
        probe.hello = reply;
        Ok(probe)
    }

    /// The whole `hello` reply.
    pub fn hello(&self) -> &Value {
        &self.hello
    }

    /// The `cluster` part of the hello, if the node runs in a cluster.
    pub fn cluster(&self) -> Option<ClusterHello> {
        cluster_hello(&self.hello)
    }

    /// Sends one request and returns its whole reply (`ok` true or false), within
    /// [`PROBE_TIMEOUT`].
    pub async fn call<T: Op>(&mut self, request: &T) -> Result<Value, String> {
        tokio::time::timeout(PROBE_TIMEOUT, self.call_unbounded(request))
            .await
            .map_err(|_| format!("no reply within {PROBE_TIMEOUT:?}"))?
    }

    async fn call_unbounded<T: Op>(&mut self, request: &T) -> Result<Value, String> {
        let id = self.next_id;
        self.next_id += 1;
        let framed =
            frame::encode_json(&RequestFrame::new(id, request)).map_err(|e| e.to_string())?;
        self.send
            .write_all(&framed)
            .await
            .map_err(|e| format!("sending: {e}"))?;
        let mut chunk = vec![0u8; READ_CHUNK];
        for _ in 0..MAX_FRAMES_PER_REPLY {
            let body = self.next_frame(&mut chunk).await?;
            let reply: Value =
                serde_json::from_slice(&body).map_err(|e| format!("unreadable reply: {e}"))?;
            if reply["id"].as_u64() == Some(id) {
                return Ok(reply);
            }
        }
        Err(format!(
            "no reply to request {id} among {MAX_FRAMES_PER_REPLY} frames"
        ))
    }

    async fn next_frame(&mut self, chunk: &mut [u8]) -> Result<Vec<u8>, String> {
        loop {
            if let Some(body) = self.frames.next_frame().map_err(|e| e.to_string())? {
                return Ok(body);
            }
            match self.recv.read(chunk).await {
                Ok(Some(n)) => self.frames.push(&chunk[..n]),
                Ok(None) => return Err("the reply stream ended".into()),
                Err(e) => return Err(format!("reading: {e}")),
            }
        }
    }
}

/// The `cluster` object of a hello reply.
pub fn cluster_hello(hello: &Value) -> Option<ClusterHello> {
    let c = hello.get("cluster")?;
    Some(ClusterHello {
        cluster_id: c["cluster_id"].as_str()?.to_owned(),
        node: c["node"].as_u64()?,
        term: c["term"].as_u64()?,
        leader: c["leader"].as_u64(),
        leader_addr: c["leader_addr"].as_str().map(str::to_owned),
    })
}

/// The error code of a failed reply, `None` if it succeeded.
pub fn reply_error_code(reply: &Value) -> Option<&str> {
    reply["error"]["code"].as_str()
}

/// The `leader` a `not_leader` error reply names.
pub fn reply_error_leader(reply: &Value) -> Option<&str> {
    reply["error"]["leader"].as_str()
}

/// The `leader` a `not_leader` error from the SDK names: read from the error body as
/// serialized, so this compiles before the protocol branch adds the field.
pub fn error_leader(e: &Error) -> Option<String> {
    match e {
        Error::Server(body) => serde_json::to_value(body).ok()?["leader"]
            .as_str()
            .map(str::to_owned),
        _ => None,
    }
}

/// One node's view as `muster cluster status --json` prints it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStatus {
    /// The node that answered.
    pub node: u64,
    /// Its term.
    pub term: u64,
    /// The leader it knows of.
    pub leader: Option<u64>,
    /// The voters of the membership it knows, sorted.
    pub voters: Vec<u64>,
    /// The learners (members that copy the log but do not vote), sorted.
    pub learners: Vec<u64>,
    /// The index of the last log entry it applied.
    pub applied: u64,
}

/// Parses the output of `muster cluster status --json`.
pub fn node_status(stdout: &str) -> Result<NodeStatus, String> {
    let v: Value = serde_json::from_str(stdout.trim())
        .map_err(|e| format!("cluster status is not one JSON object ({e}): {stdout}"))?;
    let u64_at = |key: &str| v[key].as_u64();
    let members = v["members"]
        .as_array()
        .ok_or_else(|| format!("cluster status has no members array: {stdout}"))?;
    let ids = |voter: bool| {
        let mut ids = members
            .iter()
            .filter(|m| m["voter"].as_bool() == Some(voter))
            .map(|m| {
                m["node"]
                    .as_u64()
                    .ok_or_else(|| format!("a member without a node id: {m}"))
            })
            .collect::<Result<Vec<u64>, String>>()?;
        ids.sort_unstable();
        Ok::<_, String>(ids)
    };
    let (voters, learners) = (ids(true)?, ids(false)?);
    Ok(NodeStatus {
        node: u64_at("node").ok_or_else(|| format!("cluster status has no node: {stdout}"))?,
        term: u64_at("term").ok_or_else(|| format!("cluster status has no term: {stdout}"))?,
        leader: u64_at("leader"),
        voters,
        learners,
        applied: u64_at("last_applied")
            .ok_or_else(|| format!("cluster status has no last_applied index: {stdout}"))?,
    })
}

/// Connects the SDK to the leader among the comma-separated addresses in
/// `options.addr`, and says which node and term serve the connection: the leader is
/// the first address whose probe says it leads, confirmed by a second probe after the SDK's own
/// hello. A node's term only grows, so the same term before and after means the SDK's
/// hello saw that term too, from the leader of that term; and a node closes its client
/// connections when it gains or loses the leadership, so every reply on the connection
/// comes from that node as that term's leader. `None` if no reachable node leads now.
pub async fn connect_leader(options: &ConnectOptions) -> Option<(Client, Served)> {
    let mut probes = tokio::task::JoinSet::new();
    for addr in options.addr.split(',') {
        let single = ConnectOptions {
            addr: addr.to_owned(),
            ..options.clone()
        };
        // Asked again while the node does not lead (an election), within one
        // PROBE_TIMEOUT in all.
        probes.spawn(tokio::time::timeout(PROBE_TIMEOUT, async move {
            loop {
                if let Ok(probe) = Probe::open(&single).await
                    && let Some(hello) = probe.cluster()
                    && hello.leads()
                {
                    return (hello, single);
                }
                tokio::time::sleep(LEADER_PROBE_RETRY).await;
            }
        }));
    }
    // The first node that says it leads, as the SDK's own search takes it: a dead node's
    // probe, which only its timeout ends, holds up nothing (dropping the set aborts it).
    let mut first = None;
    while let Some(joined) = probes.join_next().await {
        if let Ok(Ok(found)) = joined {
            first = Some(found);
            break;
        }
    }
    drop(probes);
    let (before, single) = first?;
    let client = tokio::time::timeout(LEADER_CONNECT_TIMEOUT, Client::connect(single.clone()))
        .await
        .ok()?
        .ok()?;
    let after = Probe::open(&single).await.ok()?.cluster()?;
    (after.leads() && after.node == before.node && after.term == before.term).then_some((
        client,
        Served {
            node: before.node,
            term: before.term,
        },
    ))
}
