//! A replicated musterd: several nodes keep one store in step through openraft.
//!
//! The leader's engine runs exactly as a single daemon's does, except that its store
//! holds each round's changes back instead of writing them ([`crate::store::Store`] in
//! clustered mode). The dispatcher proposes the round's changes as one log entry (a
//! [`Round`]); every node, the leader included, writes its store only by applying
//! committed entries ([`storage::StateMachine`]). A round's replies and pushes leave the
//! leader only after its entry is committed on a majority and applied on the leader.
//!
//! - [`storage`]: openraft's log and state machine over the node's fjall store, and
//!   snapshots as files.
//! - [`identity`]: the node's key, certificate and endpoint, derived from the cluster
//!   secret, and the verifiers that accept only peers holding the same secret.
//! - [`net`]: node-to-node RPCs over QUIC between those endpoints.
//! - [`elect`]: elections behind a pre-vote, so a node back from a partition does not
//!   depose a healthy leader.
//! - [`node`]: starting a node, membership changes and its status.
//! - [`lead`]: the node's dispatcher life cycle, and a leader's rounds: agreeing on each
//!   with the others.
//! - [`timing`]: the heartbeat and election timeout every wait derives from.

pub mod elect;
pub mod identity;
pub mod lead;
pub mod net;
pub mod node;
pub mod storage;
pub mod timing;

use serde::{Deserialize, Serialize};

use crate::store::Change;

openraft::declare_raft_types!(
    /// The openraft type configuration of a muster cluster.
    pub Muster:
        D = Round,
        R = Fate,
        NodeId = u64,
        Node = NodeAddr,
        SnapshotData = tokio::fs::File,
);

/// What one log entry carries: the store changes of one leader round.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Round {
    /// The term the leader's engine was built in. A round is applied only if its entry
    /// was appended in that same term: an engine that outlived its leadership cannot
    /// write (the fence against a leader that lost and regained the lead unnoticed).
    pub term: u64,
    /// The round's wall-clock time on the leader, in ms since the Unix epoch. A new
    /// leader's wall clock is floored at the last applied round's.
    pub wall_ms: u64,
    /// The store changes, in the order the engine made them.
    pub changes: Vec<Change>,
}

/// What became of a committed [`Round`] when it was applied: the response of a
/// proposal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Fate {
    /// Its changes were written to the store (or it carried none: a blank or a
    /// membership entry).
    Written,
    /// Refused by the term fence: made by an engine of another term than its entry's.
    Fenced,
}

/// Where a node is reached.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeAddr {
    /// Its client address (`HOST:PORT`), which `not_leader` errors and `hello` name.
    pub addr: String,
    /// Its node-to-node address (`HOST:PORT`).
    pub cluster_addr: String,
}
