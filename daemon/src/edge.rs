//! The ops a connection answers itself, never the engine: `hello` (its version
//! check and, on a cluster node, whom the node believes to lead), `server_stats` (the
//! node's own counters) and the cluster ops (`cluster_status`, `cluster_add`,
//! `cluster_remove`, answered by the node). Nothing here knows connections or streams:
//! each answer is built from what it is given.

use muster_protocol::ops::{ClusterStatusReply, HelloReply};
use muster_protocol::{ErrorBody, ErrorCode, PROTOCOL_VERSION, Request};

use crate::cluster::node::Node;
use crate::dispatcher::CommitStats;
use crate::engine::Reply;

/// An op's answer from the edge.
pub enum Answer {
    /// Answered at once.
    Now(Box<Reply>),
    /// A cluster op's answer, to be awaited off the stream's loop (a membership change
    /// waits for a new node to catch up).
    Later(ClusterAnswer),
}

/// The edge's answer to `req` (allowed for its principal, who is named in the audit
/// trail), or `None` when the engine answers it. `node` is this daemon's cluster node.
pub fn answer(
    req: &Request,
    stats: &CommitStats,
    durability: &'static str,
    node: Option<&Node>,
    principal: Option<&str>,
) -> Option<Answer> {
    match req {
        Request::ServerStats(_) => Some(Answer::Now(Box::new(server_stats(stats, durability)))),
        _ => cluster_op(node?, req, principal).map(Answer::Later),
    }
}

/// The node's own counters.
fn server_stats(stats: &CommitStats, durability: &'static str) -> Reply {
    use std::sync::atomic::Ordering::Relaxed;
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    Reply::ServerStats(muster_protocol::ops::ServerStatsReply {
        syncs: stats.syncs.load(Relaxed),
        synced_requests: stats.synced_requests.load(Relaxed),
        durability: durability.into(),
        disk_alarm: stats.disk_alarm.load(Relaxed),
        uptime_ms: now_ms.saturating_sub(stats.started_ms.load(Relaxed)),
        members_connected: stats.members_connected.load(Relaxed),
        fsync_last_us: stats.fsync_last_us.load(Relaxed),
        fsync_total_us: stats.fsync_total_us.load(Relaxed),
    })
}

/// The reply to `hello` of `version`, naming on a cluster node whom it believes to lead.
pub fn hello_reply(version: u32, node: Option<&Node>) -> Result<Reply, ErrorBody> {
    if version == PROTOCOL_VERSION {
        Ok(Reply::Hello(HelloReply {
            version: PROTOCOL_VERSION,
            server: concat!("musterd ", env!("CARGO_PKG_VERSION")).into(),
            cluster: node.map(Node::hello),
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

/// A cluster op's answer in the making.
pub type ClusterAnswer =
    std::pin::Pin<Box<dyn Future<Output = Result<ClusterStatusReply, ErrorBody>> + Send>>;

/// A cluster node's answer to a cluster op, answered by the node rather than the engine.
/// A membership change that took effect is audited as the `principal`'s.
fn cluster_op(node: &Node, req: &Request, principal: Option<&str>) -> Option<ClusterAnswer> {
    use crate::engine::audit;
    // Every request passes here: nothing is cloned before it is known to be a cluster op.
    let (op, target) = (req.name(), cluster_target(req)?);
    let (watched, node) = (node.clone(), node.clone());
    let principal = principal.map(str::to_owned);
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
    let is_member = |node: &Node, id: u64| node.status().members.iter().any(|m| m.node == id);
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
