//! The rows of the list screens: queues, tasks, members, dead tasks grouped by error,
//! the cluster's nodes, the limits and the schedules; the columns they sort by, and
//! what a quick filter (`f`) matches in them.

use std::collections::BTreeMap;

use muster_protocol::model::{
    LimitInfo, MemberInfo, QueueInfo, ScheduleInfo, TaskState, TaskSummary,
};
use muster_protocol::ops::ClusterStatusReply;

use super::meters;
use super::screen::Screen;
use super::search::search_words;

/// One row of a list screen, borrowed from the current update.
pub enum Row<'a> {
    /// A queue.
    Queue(&'a QueueInfo),
    /// A task.
    Task(&'a TaskSummary),
    /// A member.
    Member(&'a MemberInfo),
    /// Dead tasks of the page that died with one error (`E`).
    Group(ErrorGroup),
    /// A node of the cluster.
    Node(NodeRow),
    /// A limit.
    Limit(&'a LimitInfo),
    /// A schedule.
    Schedule(&'a ScheduleInfo),
}

/// Dead tasks of a page that died with the same error: the first line of their last
/// error (or their dead reason, if they have no error).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorGroup {
    /// The error's first line.
    pub error: String,
    /// The queues of its tasks, by name.
    pub queues: Vec<String>,
    /// Its tasks, in page order.
    pub ids: Vec<String>,
    /// When the last of them died.
    pub last_died_ms: u64,
}

/// The page's dead tasks grouped by error: the largest group first, then by error.
pub fn error_groups(tasks: &[TaskSummary]) -> Vec<ErrorGroup> {
    let mut groups: Vec<ErrorGroup> = Vec::new();
    for t in tasks {
        let error = t
            .last_error
            .as_deref()
            .or(t.dead_reason.as_deref())
            .unwrap_or("(no error)")
            .lines()
            .next()
            .unwrap_or_default()
            .to_owned();
        let at = match groups.iter().position(|g| g.error == error) {
            Some(at) => at,
            None => {
                groups.push(ErrorGroup {
                    error,
                    queues: Vec::new(),
                    ids: Vec::new(),
                    last_died_ms: 0,
                });
                groups.len() - 1
            }
        };
        let g = &mut groups[at];
        g.ids.push(t.id.clone());
        g.last_died_ms = g.last_died_ms.max(t.updated_ms);
        if let Err(i) = g.queues.binary_search(&t.queue) {
            g.queues.insert(i, t.queue.clone());
        }
    }
    groups.sort_by(|a, b| {
        b.ids
            .len()
            .cmp(&a.ids.len())
            .then_with(|| a.error.cmp(&b.error))
    });
    groups
}

/// A value rows are sorted by: numbers as numbers, text as text.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum SortValue {
    /// A count, a priority, a time.
    Number(u64),
    /// A name, a key, an error.
    Text(String),
}

/// A column of a task table (after the id, which every one starts with).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskColumn {
    /// The task's id (always the first column).
    Id,
    /// Its queue.
    Queue,
    /// Its state.
    State,
    /// Its priority.
    Priority,
    /// Its key.
    Key,
    /// Its deliveries.
    Attempts,
    /// Its failures.
    Failures,
    /// Since it last changed.
    Age,
    /// When a scheduled task becomes ready.
    Due,
    /// The member holding its lease.
    Holder,
    /// How long its lease has run.
    Running,
    /// When its lease expires.
    Expires,
    /// Its last progress checkpoint.
    Progress,
    /// When it died.
    Died,
    /// Why it died.
    Reason,
    /// Its last error.
    Error,
    /// What a suspended task waits for, in its holder's words.
    Asks,
    /// When a suspended task's timeout acts.
    TimesOut,
}

impl TaskColumn {
    /// The column's name, as `s` shows it in the title (`by holder ↑`).
    pub fn name(self) -> &'static str {
        match self {
            TaskColumn::Id => "id",
            TaskColumn::Queue => "queue",
            TaskColumn::State => "state",
            TaskColumn::Priority => "priority",
            TaskColumn::Key => "key",
            TaskColumn::Attempts => "attempts",
            TaskColumn::Failures => "failures",
            TaskColumn::Age => "age",
            TaskColumn::Due => "due",
            TaskColumn::Holder => "holder",
            TaskColumn::Running => "running",
            TaskColumn::Expires => "expires",
            TaskColumn::Progress => "progress",
            TaskColumn::Died => "died",
            TaskColumn::Reason => "reason",
            TaskColumn::Error => "error",
            TaskColumn::Asks => "asks",
            TaskColumn::TimesOut => "times out",
        }
    }

    /// What a task's row is sorted by in this column. Times sort as times, earliest
    /// first: the oldest (age, died), the longest running, the soonest due or expiring.
    fn value(self, t: &TaskSummary) -> SortValue {
        use SortValue::{Number, Text};
        let text = |s: Option<&str>| Text(s.unwrap_or_default().to_owned());
        match self {
            TaskColumn::Id => Text(t.id.clone()),
            TaskColumn::Queue => Text(t.queue.clone()),
            TaskColumn::State => Text(t.state.as_str().to_owned()),
            TaskColumn::Priority => Number(u64::from(t.priority)),
            TaskColumn::Key => text(t.key.as_deref()),
            TaskColumn::Attempts => Number(t.deliveries),
            TaskColumn::Failures => Number(t.failures),
            TaskColumn::Age | TaskColumn::Running | TaskColumn::Died => Number(t.updated_ms),
            TaskColumn::Due => Number(t.not_before_ms.unwrap_or(u64::MAX)),
            TaskColumn::Holder => text(t.lease.as_ref().map(|l| l.member.as_str())),
            TaskColumn::Expires => Number(t.lease.as_ref().map_or(u64::MAX, |l| l.expires_ms)),
            TaskColumn::Progress => text(t.progress.as_deref()),
            TaskColumn::Reason => text(t.dead_reason.as_deref()),
            TaskColumn::Error => text(t.last_error.as_deref()),
            TaskColumn::Asks => text(t.suspension.as_ref().map(|s| s.reason.as_str())),
            TaskColumn::TimesOut => {
                Number(t.suspension.as_ref().map_or(u64::MAX, |s| s.timeout_at_ms))
            }
        }
    }
}

/// The columns of a screen's task table after the id, as shown and as `s` sorts them.
pub fn task_columns(screen: &Screen) -> &'static [TaskColumn] {
    use TaskColumn::*;
    match screen {
        Screen::Queue { state, .. } => match state {
            TaskState::Leased => &[Holder, Attempts, Running, Expires, Progress],
            TaskState::Dead => &[Attempts, Died, Reason, Error],
            TaskState::Scheduled => &[Priority, Key, Failures, Due],
            TaskState::Suspended => &[Age, Asks, TimesOut],
            TaskState::Ready | TaskState::Done | TaskState::Cancelled => {
                &[Priority, Key, Attempts, Failures, Age]
            }
        },
        Screen::Member { .. } => &[Queue, Attempts, Expires],
        Screen::Dead => &[Queue, Attempts, Died, Reason, Error],
        Screen::Found { .. } => &[Queue, State, Attempts, Age, Error],
        Screen::Queues
        | Screen::Task { .. }
        | Screen::Members
        | Screen::Cluster
        | Screen::Limits
        | Screen::Schedules => &[],
    }
}

impl Row<'_> {
    /// The columns `s` sorts by on `screen`, in the order it steps through them: the
    /// columns shown, left to right.
    pub fn sort_columns(&self, screen: &Screen) -> Vec<&'static str> {
        match self {
            Row::Queue(_) => vec![
                "name",
                "ready",
                "scheduled",
                "leased",
                "dead",
                "done",
                "consumers",
                "oldest",
            ],
            Row::Task(_) => std::iter::once(TaskColumn::Id)
                .chain(task_columns(screen).iter().copied())
                .map(TaskColumn::name)
                .collect(),
            Row::Member(_) => vec!["name", "leases", "capacity", "last seen"],
            Row::Group(_) => vec!["count", "error", "died"],
            Row::Node(_) => vec![
                "node", "address", "role", "term", "log", "applied", "lag", "contact", "snapshot",
            ],
            Row::Limit(_) => vec![
                "name",
                "rate",
                "per key",
                "held",
                "waiting",
                "keys",
                "granted",
                "throttled",
                "tokens",
                "in use",
            ],
            Row::Schedule(_) => vec![
                "name", "queue", "cron", "next", "last", "fires", "missed", "failures",
            ],
        }
    }

    pub(super) fn sort_value(&self, screen: &Screen, column: usize) -> SortValue {
        use SortValue::{Number, Text};
        match self {
            Row::Queue(q) => match column {
                0 => Text(q.name.clone()),
                1 => Number(q.counts.ready),
                2 => Number(q.counts.scheduled),
                3 => Number(q.counts.leased),
                4 => Number(q.counts.dead),
                5 => Number(q.counts.done),
                6 => Number(q.consumers),
                // Oldest first: the smallest time.
                _ => Number(q.oldest_ready_ms.unwrap_or(u64::MAX)),
            },
            Row::Task(t) => match column.checked_sub(1) {
                None => TaskColumn::Id.value(t),
                Some(c) => task_columns(screen)
                    .get(c)
                    .map_or(Number(0), |c| c.value(t)),
            },
            Row::Member(m) => match column {
                0 => Text(m.name.clone()),
                1 => Number(m.leased),
                2 => Number(u64::from(m.capacity)),
                _ => Number(m.last_seen_ms.unwrap_or(0)),
            },
            Row::Group(g) => match column {
                0 => Number(g.ids.len() as u64),
                1 => Text(g.error.clone()),
                _ => Number(g.last_died_ms),
            },
            Row::Node(n) => {
                let number = |v: Option<u64>| Number(v.unwrap_or(0));
                match column {
                    0 => Number(n.node),
                    1 => Text(n.addr.clone()),
                    2 => Text(n.role.clone()),
                    3 => number(n.term),
                    4 => number(n.last_log),
                    5 => number(n.applied),
                    6 => number(n.lag),
                    // The longest silent first: the earliest answer (never, 0, first of all).
                    7 => number(n.heard_ms),
                    _ => number(n.snapshot),
                }
            }
            Row::Limit(l) => match column {
                0 => Text(l.name.clone()),
                // Tokens an hour, so that rates of different periods compare.
                1 => Number(l.spec.rate.map_or(0, |r| {
                    u64::try_from(u128::from(r.count) * 3_600_000 / u128::from(r.per_ms.max(1)))
                        .unwrap_or(u64::MAX)
                })),
                2 => Number(u64::from(l.spec.per_key)),
                3 => Number(l.held),
                4 => Number(l.waiting),
                5 => Number(l.keys_in_use),
                6 => Number(l.granted),
                7 => Number(l.throttled),
                // How full the bars are: the emptiest bucket first; without a rate, last.
                8 => Number(meters::tokens(l).map_or(u64::MAX, |g| g.permille())),
                _ => Number(meters::in_use(l).map_or(0, |g| g.permille())),
            },
            Row::Schedule(s) => match column {
                0 => Text(s.name.clone()),
                1 => Text(s.queue.clone()),
                2 => Text(s.cron.clone()),
                // The soonest first; a paused one (no next fire) last.
                3 => Number(s.next_fire_ms.unwrap_or(u64::MAX)),
                // The longest silent first: never fired (0) first of all.
                4 => Number(s.last_fire_ms.unwrap_or(0)),
                5 => Number(s.fires),
                6 => Number(s.missed),
                _ => Number(s.failures),
            },
        }
    }

    pub(super) fn id(&self) -> &str {
        match self {
            Row::Queue(q) => &q.name,
            Row::Task(t) => &t.id,
            Row::Member(m) => &m.name,
            Row::Group(g) => &g.error,
            Row::Node(n) => &n.id,
            Row::Limit(l) => &l.name,
            Row::Schedule(s) => &s.name,
        }
    }

    /// Whether the row passes a quick filter (`f`, lowercased): the whole text as one
    /// phrase in any of its columns, or the search's words the rows carry (`id:`,
    /// `key:`, `error:`, `state:`, `label:`), each text to the next word as a phrase
    /// (`error:timed out`), all of which must match. A schedule's state is `paused`
    /// or `active`.
    pub(super) fn matches(&self, filter: &str) -> bool {
        if filter.is_empty() {
            return true;
        }
        match search_words(filter) {
            Ok(words) if words.iter().all(|(name, _)| ROW_WORDS.contains(name)) => words
                .iter()
                .all(|(name, text)| self.matches_word(name, text)),
            _ => self.matches_word("", filter),
        }
    }

    /// Whether the row's column named by a search word (any column for `""`) holds
    /// `text` (lowercased; an id starts with it, a state is it).
    fn matches_word(&self, name: &str, text: &str) -> bool {
        let hit = |s: &str| s.to_lowercase().contains(text);
        let task_error = |t: &TaskSummary| {
            t.last_error.as_deref().is_some_and(hit) || t.dead_reason.as_deref().is_some_and(hit)
        };
        match (name, self) {
            ("id", row) => row.id().to_lowercase().starts_with(text),
            ("key", Row::Task(t)) => t.key.as_deref().is_some_and(hit),
            ("error", Row::Task(t)) => task_error(t),
            ("error", Row::Group(g)) => hit(&g.error),
            ("state", Row::Task(t)) => t.state.as_str() == text,
            ("state", Row::Member(m)) => m.state.as_str() == text,
            ("label", Row::Member(m)) => m.labels.iter().any(|l| hit(l)),
            ("", Row::Queue(q)) => hit(&q.name),
            ("", Row::Task(t)) => {
                hit(&t.id)
                    || hit(&t.queue)
                    || t.key.as_deref().is_some_and(hit)
                    || task_error(t)
                    || t.lease.as_ref().is_some_and(|l| hit(&l.member))
            }
            ("", Row::Member(m)) => hit(&m.name) || m.labels.iter().any(|l| hit(l)),
            ("", Row::Group(g)) => hit(&g.error) || g.queues.iter().any(|q| hit(q)),
            ("", Row::Node(n)) => hit(&n.id) || hit(&n.addr) || hit(&n.role),
            ("", Row::Limit(l)) => hit(&l.name) || l.keys.iter().any(|k| hit(&k.key)),
            ("key", Row::Limit(l)) => l.keys.iter().any(|k| hit(&k.key)),
            ("error", Row::Schedule(s)) => s.last_error.as_deref().is_some_and(hit),
            ("state", Row::Schedule(s)) => schedule_state(s) == text,
            ("", Row::Schedule(s)) => {
                hit(&s.name)
                    || hit(&s.queue)
                    || hit(&s.cron)
                    || hit(&s.tz)
                    || s.last_error.as_deref().is_some_and(hit)
            }
            _ => false,
        }
    }
}

/// A schedule's state as the filter's `state:` word names it: `paused` or `active`.
fn schedule_state(s: &ScheduleInfo) -> &'static str {
    if s.paused { "paused" } else { "active" }
}

/// The search words a quick filter applies to the rows on screen.
const ROW_WORDS: [&str; 6] = ["", "id", "key", "error", "state", "label"];

/// One round of the cluster screen's questions: the connected node's answer, and each
/// other member's own answer or why it did not come.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterPoll {
    /// The answer of the node the console is connected to (the leader, when one leads):
    /// the membership, and on the leader how far it knows each node to be.
    pub local: ClusterStatusReply,
    /// Each other member's own answer, by node id, or why there was none.
    pub others: Vec<(u64, Result<ClusterStatusReply, String>)>,
}

/// What the cluster screen knows of the nodes.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterNodes {
    /// The connected node's latest answer.
    pub local: ClusterStatusReply,
    /// Each member's latest own answer and when it came (wall-clock ms), by node id.
    pub heard: BTreeMap<u64, (u64, ClusterStatusReply)>,
    /// Why a member did not answer the latest round, by node id.
    pub failed: BTreeMap<u64, String>,
}

impl ClusterNodes {
    /// A row per member of the connected node's membership, by node id.
    pub fn rows(&self) -> Vec<NodeRow> {
        let leads = self.local.role == "leader";
        let last = self.local.last_log_index.unwrap_or(0);
        self.local
            .members
            .iter()
            .map(|m| {
                let heard = self.heard.get(&m.node);
                let own = heard.map(|(_, reply)| reply);
                // Never heard from: the role its membership gives it.
                let role = match own {
                    Some(reply) => reply.role.clone(),
                    None if self.local.leader == Some(m.node) => "leader".into(),
                    None if m.voter => "follower".into(),
                    None => "learner".into(),
                };
                NodeRow {
                    node: m.node,
                    id: m.node.to_string(),
                    addr: m.addr.clone(),
                    role,
                    term: own.map(|r| r.term),
                    last_log: own.and_then(|r| r.last_log_index),
                    applied: own.and_then(|r| r.last_applied),
                    lag: m
                        .matched
                        .filter(|_| leads)
                        .map(|matched| last.saturating_sub(matched)),
                    heard_ms: heard.map(|(at, _)| *at),
                    snapshot: own.and_then(|r| r.snapshot_index),
                    error: self.failed.get(&m.node).cloned(),
                }
            })
            .collect()
    }
}

/// One node as the cluster screen shows it: what it said of itself in its latest
/// answer, and its lag as the leader knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRow {
    /// Its id.
    pub node: u64,
    /// Its id as text: the row's id, for the selection and the filter.
    pub id: String,
    /// Its client address.
    pub addr: String,
    /// Its role as it last said (`leader`, `follower`, `candidate`, `learner`,
    /// `shutdown`), or, never heard from, as the membership gives it.
    pub role: String,
    /// Its term.
    pub term: Option<u64>,
    /// The last entry of its log.
    pub last_log: Option<u64>,
    /// The last entry it applied.
    pub applied: Option<u64>,
    /// Entries it is behind the leader's log, as the leader knows; only when the
    /// console is connected to the leader.
    pub lag: Option<u64>,
    /// When its latest answer came; `None` if it never answered.
    pub heard_ms: Option<u64>,
    /// The last entry its latest snapshot covers.
    pub snapshot: Option<u64>,
    /// Why it did not answer the latest round.
    pub error: Option<String>,
}
