//! The ops a connection answers itself, never the engine ([`EdgeRequest`]):
//! `server_stats` (the node's own counters) and the cluster ops (`cluster_status`,
//! `cluster_add`, `cluster_remove`, answered by the node), with the reply to `hello`.
//! Nothing here knows connections or streams: each answer is built from what it is
//! given.

use muster_protocol::ops::{ClusterAdd, ClusterStatusReply, EdgeRequest, HelloReply};
use muster_protocol::{ErrorBody, ErrorCode, PROTOCOL_VERSION};

use crate::auth::Principal;
use crate::cluster::node::Node;
use crate::dispatcher::CommitStats;
use crate::engine::Reply;

/// The `invalid_state` message of the cluster ops on a daemon that runs alone.
const NOT_A_CLUSTER_NODE: &str =
    "this daemon is not a cluster node (start it with --cluster-id to run a cluster)";

/// An op's answer from the edge.
pub enum Answer {
    /// Answered at once.
    Now(Result<Box<Reply>, ErrorBody>),
    /// A cluster op's answer, to be awaited off the stream's loop (a membership change
    /// waits for a new node to catch up).
    Later(ClusterAnswer),
}

/// The edge's answer to `req` (allowed for its principal, who is named in the audit
/// trail). `node` is this daemon's cluster node; a daemon that runs alone refuses the
/// cluster ops.
pub fn answer(
    req: &EdgeRequest,
    stats: &CommitStats,
    durability: &'static str,
    node: Option<&Node>,
    principal: Option<&str>,
) -> Answer {
    match req {
        EdgeRequest::ServerStats(_) => Answer::Now(Ok(Box::new(server_stats(stats, durability)))),
        EdgeRequest::ClusterStatus(_) => on_node(node, |node| {
            let node = node.clone();
            Box::pin(async move { Ok(node.status()) })
        }),
        EdgeRequest::ClusterAdd(add) => on_node(node, |node| cluster_add(node, add, principal)),
        EdgeRequest::ClusterRemove(remove) => on_node(node, |node| {
            let (id, changed) = (remove.node, node.clone());
            let change = Box::pin(async move { changed.remove(id).await });
            audited(node, change, "cluster_remove", id, None, principal)
        }),
    }
}

/// A cluster op's answer from `node`, or its refusal on a daemon that runs alone.
fn on_node(node: Option<&Node>, answer: impl FnOnce(&Node) -> ClusterAnswer) -> Answer {
    match node {
        Some(node) => Answer::Later(answer(node)),
        None => Answer::Now(Err(ErrorBody::new(
            ErrorCode::InvalidState,
            NOT_A_CLUSTER_NODE,
        ))),
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

/// The reply to `hello` of `version`, naming on a cluster node whom it believes to lead,
/// and the `principal` the connection authenticated as (none under `--open`).
pub fn hello_reply(
    version: u32,
    node: Option<&Node>,
    principal: Option<&Principal>,
) -> Result<Reply, ErrorBody> {
    if version == PROTOCOL_VERSION {
        Ok(Reply::Hello(HelloReply {
            version: PROTOCOL_VERSION,
            server: concat!("musterd ", env!("CARGO_PKG_VERSION")).into(),
            cluster: node.map(Node::hello),
            principal: principal.map(Principal::info),
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

/// A cluster node's answer to `cluster_add`.
fn cluster_add(node: &Node, add: &ClusterAdd, principal: Option<&str>) -> ClusterAnswer {
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
            return Box::pin(async move { Err(error) });
        }
    };
    let addr = crate::cluster::NodeAddr {
        addr: add.addr.clone(),
        cluster_addr: add.cluster_addr.clone(),
    };
    // A node that joins as a learner and is refused promotion changed the membership.
    let joins = (!is_member(node, id)).then_some(id);
    let changed = node.clone();
    let change = Box::pin(async move { changed.add(id, addr, learner, catch_up).await });
    audited(node, change, "cluster_add", id, joins, principal)
}

fn is_member(node: &Node, id: u64) -> bool {
    node.status().members.iter().any(|m| m.node == id)
}

/// A membership `change` (`op` of node `id`) audited as the `principal`'s once it
/// took effect: when it succeeded, or when the node that `joins` became a member
/// though the change was refused (a learner that did not catch up).
fn audited(
    node: &Node,
    change: ClusterAnswer,
    op: &'static str,
    id: u64,
    joins: Option<u64>,
    principal: Option<&str>,
) -> ClusterAnswer {
    use crate::engine::audit;
    let (watched, principal) = (node.clone(), principal.map(str::to_owned));
    let target = format!("node {id}");
    Box::pin(async move {
        let reply = change.await;
        match (&reply, joins) {
            (Ok(_), _) => audit::record(principal.as_deref(), op, &target, 0),
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
    })
}

#[cfg(test)]
mod tests {
    use muster_protocol::ops::{ClusterAdd, ClusterRemove, ClusterStatus, ServerStats};

    use super::*;

    #[test]
    fn a_daemon_alone_refuses_the_cluster_ops_with_invalid_state() {
        let stats = CommitStats::default();
        let requests = [
            EdgeRequest::ClusterStatus(ClusterStatus {}),
            EdgeRequest::ClusterAdd(ClusterAdd {
                node: 2,
                addr: "10.0.0.2:7420".into(),
                cluster_addr: "10.0.0.2:7421".into(),
                learner: false,
                catch_up_ms: None,
            }),
            EdgeRequest::ClusterRemove(ClusterRemove { node: 2 }),
        ];
        for req in requests {
            match answer(&req, &stats, "sync", None, Some("ops")) {
                Answer::Now(Err(e)) => assert_eq!(
                    e,
                    ErrorBody::new(ErrorCode::InvalidState, NOT_A_CLUSTER_NODE),
                    "{}",
                    req.name()
                ),
                Answer::Now(Ok(reply)) => panic!("{}: answered {reply:?}", req.name()),
                Answer::Later(_) => panic!("{}: handed to a node it has not", req.name()),
            }
        }
    }

    #[test]
    fn server_stats_are_the_commit_counters() {
        let stats = CommitStats::default();
        stats.syncs.store(7, std::sync::atomic::Ordering::Relaxed);
        stats
            .synced_requests
            .store(40, std::sync::atomic::Ordering::Relaxed);
        let req = EdgeRequest::ServerStats(ServerStats {});
        let Answer::Now(Ok(reply)) = answer(&req, &stats, "sync", None, None) else {
            panic!("server_stats is answered at once");
        };
        let Reply::ServerStats(reply) = *reply else {
            panic!("server_stats answered {reply:?}");
        };
        assert_eq!(
            (
                reply.syncs,
                reply.synced_requests,
                reply.durability.as_str()
            ),
            (7, 40, "sync")
        );
    }
}
