//! The console's screens ([`Screen`]) and how many rows a page of one holds: what
//! every other part of the console names, so it depends on none of them.

use muster_protocol::model::TaskState;

/// Rows asked for per page of a list screen.
pub const PAGE_ROWS: u32 = 100;

/// A screen of the console.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Screen {
    /// Every queue.
    Queues,
    /// One queue's tasks in one state.
    Queue {
        /// The queue.
        name: String,
        /// The tab shown.
        state: TaskState,
    },
    /// One task.
    Task {
        /// Its id.
        id: String,
    },
    /// Every member.
    Members,
    /// One member and the tasks it holds.
    Member {
        /// Its name.
        name: String,
    },
    /// Dead tasks of every queue.
    Dead,
    /// A search over a whole queue (or every queue), newest first.
    Found {
        /// The queue searched; every queue if `None`.
        queue: Option<String>,
        /// What the operator typed after `/`.
        query: String,
    },
    /// Every node of the cluster, each as it answers `cluster_status` itself.
    Cluster,
    /// Every limit with its buckets, and the busiest keys of the one selected.
    Limits,
    /// Every schedule with its next fire, and the task of the one selected.
    Schedules,
}
