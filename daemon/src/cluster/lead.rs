//! The leader's side of a round: getting the cluster to agree on it.

use std::time::Duration;

use super::Round;
use super::node::Node;
use crate::store::Store;

/// A round stops taking requests once its changes reach this many bytes; the rest wait
/// for the next round. Bounds a log entry (and so every node's memory for it).
pub const MAX_ROUND_BYTES: usize = 8 << 20;

/// How often a node checks its role when no request comes: a follower, whether it
/// may lead now; a leader, whether it still does.
pub const CHECK_EVERY: Duration = Duration::from_millis(50);

/// Longest a leader waits for a round to be agreed on while it still hears from a
/// majority (a slow disk on the others). Past it, or as soon as the leader has not heard
/// from a majority for the election timeout (see `node::Timing`), the round's requests
/// get `outcome_unknown` and the node stops serving until its log is settled again.
pub const AGREEMENT_TIMEOUT: Duration = Duration::from_secs(2);

/// A node leading in one term, with the engine built for that term.
pub struct Leading {
    node: Node,
    term: u64,
}

impl Leading {
    /// The leadership of `node` in `term`.
    pub fn new(node: Node, term: u64) -> Leading {
        Leading { node, term }
    }

    /// The node.
    pub fn node(&self) -> &Node {
        &self.node
    }

    /// Whether the node still leads in the engine's term, with a majority heard lately.
    pub fn is_leading(&self) -> bool {
        self.node.leads_in(self.term)
    }

    /// Gets the cluster to agree on the round held in `store` (made at `wall_ms`):
    /// true once it is committed on a majority and applied here. A round without
    /// changes but with `replies` to send needs only the leadership confirmed.
    pub fn agree(&mut self, store: &Store, wall_ms: u64, replies: bool) -> bool {
        let changes = store.take_round();
        if changes.is_empty() {
            return !replies || self.node.confirm_leadership(self.term, AGREEMENT_TIMEOUT);
        }
        let round = Round {
            term: self.term,
            wall_ms,
            changes,
        };
        let agreed = self.node.propose(self.term, round, AGREEMENT_TIMEOUT);
        if agreed {
            store.round_applied();
        }
        agreed
    }
}
