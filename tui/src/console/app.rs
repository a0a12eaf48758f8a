//! The console's state and its key handling, without a terminal or a network.
//!
//! [`App::on_key`] is the only way keys change anything: the real loop and the tests
//! call it alike. It returns [`Effect`]s (watch a screen, run a verb) for the loop to
//! carry out; their results come back through [`App::on_watch`] and [`App::on_done`].

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use muster_protocol::limits::MAX_PRIORITY;
use muster_protocol::model::{
    MemberInfo, QueueInfo, QueueOptions, QueuePatch, QueueTotals, TaskState, TaskSummary,
};
use muster_protocol::ops::{
    ClusterHello, ClusterStatusReply, FieldMatch, FindCursor, ServerStatsReply, TaskFind,
    TaskFindReply, View, WatchReply, WatchUpdate,
};

/// Rows asked for per page of a list screen.
pub const PAGE_ROWS: u32 = 100;

/// The states of the queue screen's tabs, in tab order.
pub const TABS: [TaskState; 6] = [
    TaskState::Ready,
    TaskState::Scheduled,
    TaskState::Leased,
    TaskState::Dead,
    TaskState::Done,
    TaskState::Cancelled,
];

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
}

/// A screen on the navigation stack, with where the operator is on it.
#[derive(Debug, Clone)]
pub struct Page {
    /// The screen.
    pub screen: Screen,
    /// The `after` cursors of the pages visited; the last is the current page's.
    cursors: Vec<Option<String>>,
    /// The selected row (of the filtered rows), or the scroll offset of a task.
    pub selected: usize,
    /// Rows marked with space, by id, for verbs on several tasks.
    pub marked: BTreeSet<String>,
    /// The quick filter typed with `f`, applied to this page's rows.
    pub filter: String,
    /// The column (of [`Row::sort_columns`]) the page's rows are sorted by, and whether
    /// descending; the daemon's order (by id or name) if `None`.
    pub sort: Option<(usize, bool)>,
    /// A search's pages: where each started; the last is the current page's.
    found_cursors: Vec<Option<FindCursor>>,
    /// A dead list's rows are grouped by error (`E`).
    pub grouped: bool,
}

impl Page {
    fn new(screen: Screen) -> Page {
        Page {
            screen,
            cursors: vec![None],
            selected: 0,
            marked: BTreeSet::new(),
            filter: String::new(),
            sort: None,
            found_cursors: vec![None],
            grouped: false,
        }
    }

    /// The watch view of this page; `None` for a search and the cluster, which are not
    /// watched (they are asked).
    pub fn view(&self) -> Option<View> {
        let after = self.cursors.last().cloned().flatten();
        let limit = Some(PAGE_ROWS);
        Some(match &self.screen {
            Screen::Queues => View::Queues { after, limit },
            Screen::Queue { name, state } => View::Tasks {
                queue: name.clone(),
                state: *state,
                after,
                limit,
            },
            Screen::Task { id } => View::Task { task: id.clone() },
            Screen::Members => View::Members { after, limit },
            Screen::Member { name } => View::Member {
                member: name.clone(),
            },
            Screen::Dead => View::Dead { after, limit },
            Screen::Found { .. } | Screen::Cluster => return None,
        })
    }

    /// The page number, from 1.
    pub fn number(&self) -> usize {
        self.cursors.len().max(self.found_cursors.len())
    }
}

/// What the operator is typing or looking at over the screen.
#[derive(Debug, Clone, PartialEq)]
pub enum Mode {
    /// Keys act on the screen.
    Normal,
    /// Typing a quick filter of the page's rows after `f`.
    Filter(String),
    /// Typing a search of the whole queue after `/`.
    Search(String),
    /// Typing a command after `:`.
    Command(String),
    /// A verb waits for `y`.
    Confirm(Verb),
    /// The help of the current screen is shown.
    Help,
}

/// What to do with dead tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadAction {
    /// Make them ready again.
    Redrive,
    /// Remove them for good.
    Discard,
}

/// Dead tasks of one queue a verb names: some ids, or all of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadTasks {
    /// The queue.
    pub queue: String,
    /// The tasks; empty with `all`.
    pub ids: Vec<String>,
    /// Every dead task of the queue.
    pub all: bool,
    /// How many tasks, as shown in the confirm dialog.
    pub count: u64,
}

/// A change the operator asked for.
#[derive(Debug, Clone, PartialEq)]
pub enum Verb {
    /// Redrive or discard dead tasks.
    Dead(DeadAction, DeadTasks),
    /// Cancel a task.
    Cancel(String),
    /// Revoke a task's lease.
    Revoke(String),
    /// Pause a queue.
    Pause(String),
    /// Resume a queue.
    Resume(String),
    /// Drain a member.
    Drain(String),
    /// Remove a queue's ready and scheduled tasks (this many, as last shown).
    Purge(String, u64),
    /// Delete a queue and its tasks (this many, as last shown).
    DeleteQueue(String, u64),
    /// Enqueue an edited copy of a dead task, then discard the dead one.
    Requeue(Requeue),
    /// Enqueue a new task with a payload written in the editor.
    Enqueue {
        /// The queue.
        queue: String,
        /// The payload (checked to be JSON).
        payload: String,
    },
    /// Give a ready or scheduled task another priority.
    Priority {
        /// The task.
        id: String,
        /// Its priority, as last shown.
        from: u8,
        /// The new one.
        to: u8,
    },
    /// Make a scheduled task ready now.
    RunNow(String),
    /// End a member's drain.
    Undrain(String),
    /// Change a queue's options as edited.
    UpdateQueue(QueueChange),
}

/// A queue's options as the operator edited them: only what differs from the options
/// shown when the editor opened.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueChange {
    /// The queue.
    pub queue: String,
    /// The options that change.
    pub patch: QueuePatch,
    /// Each change as `name old → new`, for the confirm dialog and the footer.
    pub changes: Vec<String>,
}

/// Text the operator writes in `$EDITOR`, and what it becomes.
#[derive(Debug, Clone, PartialEq)]
pub enum Draft {
    /// An edited copy of a dead task, enqueued in its place.
    Requeue(Requeue),
    /// The payload of a new task for this queue.
    Enqueue {
        /// The queue.
        queue: String,
    },
    /// A queue's options, as shown when the editor opened.
    Options {
        /// The queue.
        queue: String,
        /// Its options then.
        options: QueueOptions,
    },
}

/// What the editor starts with for a new task's payload.
pub const NEW_PAYLOAD: &str = "{}\n";

impl Draft {
    /// The text the editor opens with.
    pub fn text(&self) -> String {
        match self {
            Draft::Requeue(r) => r.payload.clone(),
            Draft::Enqueue { .. } => NEW_PAYLOAD.to_owned(),
            Draft::Options { options, .. } => {
                let mut text =
                    serde_json::to_string_pretty(options).expect("queue options serialize to JSON");
                text.push('\n');
                text
            }
        }
    }
}

/// A dead task to enqueue again with an edited payload: what the new task keeps of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requeue {
    /// The dead task, discarded once the copy is enqueued.
    pub id: String,
    /// Its queue, where the copy goes.
    pub queue: String,
    /// The edited payload (checked to be JSON).
    pub payload: String,
    /// Its priority, key and required labels, which the copy keeps.
    pub priority: u8,
    /// Its key.
    pub key: Option<String>,
    /// Its required labels.
    pub requires: Vec<String>,
}

impl Verb {
    /// The question of the confirm dialog.
    pub fn question(&self) -> String {
        fn tasks(n: u64) -> String {
            if n == 1 {
                "1 dead task".into()
            } else {
                format!("{n} dead tasks")
            }
        }
        match self {
            Verb::Dead(action, t) => {
                let what = match t.ids.as_slice() {
                    [one] if !t.all => format!("dead task {one}"),
                    _ => tasks(t.count),
                };
                match action {
                    DeadAction::Redrive => format!("Redrive {what} of {}?", t.queue),
                    DeadAction::Discard => format!("Discard {what} of {} for good?", t.queue),
                }
            }
            Verb::Cancel(id) => format!("Cancel task {id}?"),
            Verb::Revoke(id) => format!("Revoke the lease of task {id}?"),
            Verb::Pause(q) => format!("Pause queue {q}?"),
            Verb::Resume(q) => format!("Resume queue {q}?"),
            Verb::Drain(m) => {
                format!("Drain member {m}? It finishes what it holds, gets nothing new.")
            }
            Verb::Purge(q, n) => {
                format!("Purge queue {q}: remove its {n} ready and scheduled tasks for good?")
            }
            Verb::DeleteQueue(q, n) => {
                format!("Delete queue {q} and its {n} tasks for good?")
            }
            Verb::Requeue(r) => format!(
                "Enqueue the edited payload on queue {} and discard dead task {}?",
                r.queue, r.id
            ),
            Verb::Enqueue { queue, payload } => format!(
                "Enqueue the edited payload ({} bytes) on queue {queue}?",
                payload.len()
            ),
            Verb::Priority { id, from, to } => format!("Task {id}: priority {from} → {to}?"),
            Verb::RunNow(id) => format!("Run scheduled task {id} now?"),
            Verb::Undrain(m) => format!("Undrain member {m}? It gets work again."),
            Verb::UpdateQueue(c) => {
                format!("Update queue {}: {}?", c.queue, c.changes.join(", "))
            }
        }
    }
}

/// Something for the loop to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Watch a screen (replacing the previous watch).
    Watch {
        /// The screen.
        view: View,
        /// Pushes carry it; others are stale.
        tag: u64,
    },
    /// Ask the daemon to do something.
    Run(Verb),
    /// Let the operator write a payload or options in `$EDITOR`; the result comes back
    /// through [`App::on_edited`].
    Edit(Draft),
    /// Put text on the terminal's clipboard (OSC 52).
    Copy {
        /// What is copied.
        text: String,
        /// What the footer says was copied.
        what: String,
    },
    /// Search tasks (one bounded request; [`App::on_found`] asks for more).
    Find {
        /// The request (boxed: it is large next to the other effects).
        search: Box<TaskFind>,
        /// Replies carry it; others are stale.
        tag: u64,
    },
}

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

/// What a search found so far, newest first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Found {
    /// The matches, in search order.
    pub tasks: Vec<TaskSummary>,
    /// Where the search goes on; `None` once every task was examined.
    pub next: Option<FindCursor>,
    /// Tasks examined so far.
    pub scanned: u64,
    /// The search stopped with a full page although more may match (`]` goes on).
    pub more: bool,
}

/// The words a search may hold, each `NAME:TEXT`.
const SEARCH_WORDS: [&str; 8] = [
    "id", "key", "idem", "label", "state", "error", "payload", "field",
];

/// Splits what was typed after `/` into its words: `(NAME, TEXT)`, NAME `""` for bare
/// text before the first word. A word's TEXT runs to the next `NAME:` of a search word,
/// spaces and all (`error:timed out`), trimmed at both ends; so does bare text (one
/// phrase, not a word each). A word is named once. An unknown `NAME:` (letters only)
/// at the start is refused as a likely typo; after a word it is part of its text
/// (`error:refused by host:443`).
pub fn search_words(text: &str) -> Result<Vec<(&str, &str)>, String> {
    // (name, where its text starts, where it ends so far)
    let mut words: Vec<(&str, usize, usize)> = Vec::new();
    let mut at = 0;
    for piece in text.split_whitespace() {
        let start = at + text[at..].find(piece).expect("a piece of the text");
        at = start + piece.len();
        let named = piece
            .split_once(':')
            .filter(|(name, _)| SEARCH_WORDS.contains(name));
        match (named, words.last_mut()) {
            (Some((name, _)), _) => {
                if words.iter().any(|(n, _, _)| *n == name) {
                    return Err(format!("{name}: is given twice"));
                }
                words.push((name, start + name.len() + 1, at));
            }
            (None, Some(last)) => last.2 = at,
            (None, None) => {
                if let Some((name, _)) = piece.split_once(':')
                    && !name.is_empty()
                    && name.chars().all(|c| c.is_ascii_alphabetic())
                {
                    return Err(format!("unknown search word {name}: (? lists them)"));
                }
                words.push(("", start, at));
            }
        }
    }
    words
        .into_iter()
        .map(|(name, start, end)| {
            let value = text[start..end.max(start)].trim();
            if value.is_empty() {
                Err(format!("nothing after {name}:"))
            } else {
                Ok((name, value))
            }
        })
        .collect()
}

/// Turns what was typed after `/` into a search (the words of [`search_words`]):
/// `id:PREFIX`, `key:K`, `idem:K`, `label:L`, `error:TEXT`, `payload:TEXT`,
/// `state:STATE`, `field:PATH=VALUE`; bare text is an id prefix if it can be one
/// (one word of Crockford base32), else payload text.
pub fn search_query(queue: Option<String>, text: &str) -> Result<TaskFind, String> {
    let mut search = TaskFind {
        queue,
        newest_first: true,
        limit: Some(PAGE_ROWS),
        ..TaskFind::default()
    };
    if text.trim().is_empty() {
        return Err(
            "type what to search for: an id prefix, key:K, error:TEXT, … (? for all)".into(),
        );
    }
    for (name, value) in search_words(text)? {
        let one_word = |what: &str| {
            if value.contains(char::is_whitespace) {
                Err(format!("{what} has no spaces: {value:?}"))
            } else {
                Ok(value.to_owned())
            }
        };
        let set = |slot: &mut Option<String>| {
            if slot.is_some() {
                return Err("payload text is given twice (bare text is payload text)".to_owned());
            }
            *slot = Some(value.to_owned());
            Ok(())
        };
        match name {
            "id" => search.id_prefix = Some(one_word("an id prefix")?),
            "key" => search.key = Some(value.to_owned()),
            "idem" => search.idempotency_key = Some(value.to_owned()),
            "label" => search.label = Some(one_word("a label")?),
            "error" => search.error = Some(value.to_owned()),
            "payload" => set(&mut search.payload)?,
            "state" => {
                search.state = Some(
                    TaskState::parse(value).ok_or_else(|| format!("unknown state {value:?}"))?,
                )
            }
            "field" => {
                let (path, v) = value
                    .split_once('=')
                    .ok_or_else(|| format!("want field:PATH=VALUE, not {value:?}"))?;
                search.field = Some(FieldMatch {
                    path: path.trim().to_owned(),
                    value: serde_json::from_str(v.trim()).unwrap_or_else(|_| v.trim().into()),
                });
            }
            _ if is_id_prefix(value) => search.id_prefix = Some(value.to_owned()),
            _ => set(&mut search.payload)?,
        }
    }
    Ok(search)
}

/// JSON laid out for editing; text that is not JSON stays as it is.
fn pretty_json(text: &str) -> String {
    serde_json::from_str::<serde_json::Value>(text)
        .and_then(|v| serde_json::to_string_pretty(&v))
        .unwrap_or_else(|_| text.to_owned())
}

/// What an edited set of queue options changes: the patch of the options that differ
/// from `shown`, and each change as `name old → new`. An option left out keeps its
/// value, but for `max_runtime_ms`: the editor shows it (null when there is none), and
/// null, 0 or left out means no bound.
pub fn queue_changes(shown: &QueueOptions, edited: &QueuePatch) -> (QueuePatch, Vec<String>) {
    fn ms(v: Option<u64>) -> String {
        v.map_or("none".into(), |v| v.to_string())
    }
    let mut patch = QueuePatch::default();
    let mut changes = Vec::new();
    if let Some(v) = edited.lease_ms.filter(|v| *v != shown.lease_ms) {
        changes.push(format!("lease_ms {} → {v}", shown.lease_ms));
        patch.lease_ms = Some(v);
    }
    if let Some(v) = edited.max_attempts.filter(|v| *v != shown.max_attempts) {
        changes.push(format!("max_attempts {} → {v}", shown.max_attempts));
        patch.max_attempts = Some(v);
    }
    if let Some(v) = edited.retry_backoff.filter(|v| *v != shown.retry_backoff) {
        let b = |b: &muster_protocol::model::Backoff| {
            format!("{}ms×{}≤{}ms±{}", b.base_ms, b.factor, b.cap_ms, b.jitter)
        };
        changes.push(format!(
            "retry_backoff {} → {}",
            b(&shown.retry_backoff),
            b(&v)
        ));
        patch.retry_backoff = Some(v);
    }
    if let Some(v) = edited
        .key_concurrency
        .filter(|v| *v != shown.key_concurrency)
    {
        changes.push(format!("key_concurrency {} → {v}", shown.key_concurrency));
        patch.key_concurrency = Some(v);
    }
    if let Some(v) = edited.retention_ms.filter(|v| *v != shown.retention_ms) {
        changes.push(format!("retention_ms {} → {v}", shown.retention_ms));
        patch.retention_ms = Some(v);
    }
    let runtime = edited.max_runtime_ms.filter(|v| *v > 0);
    if runtime != shown.max_runtime_ms {
        changes.push(format!(
            "max_runtime_ms {} → {}",
            ms(shown.max_runtime_ms),
            ms(runtime)
        ));
        patch.max_runtime_ms = Some(runtime.unwrap_or(0));
    }
    if let Some(v) = edited.paused.filter(|v| *v != shown.paused) {
        changes.push(format!("paused {} → {v}", shown.paused));
        patch.paused = Some(v);
    }
    (patch, changes)
}

/// Whether `text` can begin a task id (two or more characters of Crockford base32).
fn is_id_prefix(text: &str) -> bool {
    text.len() >= 2
        && text.len() <= 26
        && text
            .to_ascii_uppercase()
            .chars()
            .all(|c| "0123456789ABCDEFGHJKMNPQRSTVWXYZ".contains(c))
}

/// Whether the footer's message is good news or bad.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// It worked.
    Info,
    /// It did not.
    Error,
}

/// The totals of a queue as seen over the last [`RATE_WINDOW_MS`]: rates are the change
/// from the oldest to the newest, so bursts of acks do not make the numbers jump.
#[derive(Debug, Clone, Default)]
struct Rate {
    samples: VecDeque<(u64, QueueTotals)>,
}

/// The span rates are averaged over.
const RATE_WINDOW_MS: u64 = 10_000;

impl Rate {
    fn note(&mut self, at_ms: u64, totals: QueueTotals) {
        if self.samples.back().is_some_and(|(last, _)| *last >= at_ms) {
            return;
        }
        self.samples.push_back((at_ms, totals));
        // Keep the newest sample at or before the window's start, and all after it.
        let start = at_ms.saturating_sub(RATE_WINDOW_MS);
        while self.samples.get(1).is_some_and(|(t, _)| *t <= start) {
            self.samples.pop_front();
        }
    }

    /// Enqueued and acked per second over the window ending `now`. A watched screen is
    /// pushed whenever anything changed, so no sample since the last means no change.
    fn per_second(&self, now: u64) -> (f64, f64) {
        let Some((_, last)) = self.samples.back() else {
            return (0.0, 0.0);
        };
        let start = now.saturating_sub(RATE_WINDOW_MS);
        let base = self
            .samples
            .iter()
            .rev()
            .find(|(t, _)| *t <= start)
            .or(self.samples.front());
        let Some((t0, first)) = base else {
            return (0.0, 0.0);
        };
        let span = now.saturating_sub(*t0);
        if span < 1000 {
            return (0.0, 0.0);
        }
        let span = span as f64 / 1000.0;
        let per_s = |a: u64, b: u64| a.saturating_sub(b) as f64 / span;
        (
            per_s(last.enqueued, first.enqueued),
            per_s(last.acked, first.acked),
        )
    }
}

/// Seconds of history kept per queue for its trend graphs: the last two minutes, one
/// sample a second (a few KiB per queue).
pub const TREND_SECONDS: usize = 120;

/// A queue's totals and ready count, second by second, for the last [`TREND_SECONDS`].
/// A second with no sample had no change (a watched screen is pushed on every change).
#[derive(Debug, Clone, Default)]
struct Trend {
    /// (second, enqueued total, acked total, ready), oldest first, one per second.
    samples: VecDeque<(u64, u64, u64, u64)>,
}

/// A queue's recent history, one value a second, oldest first, ending at the current
/// second: enqueued and acked in each second, and the ready count at its end. `None`
/// where the console did not know yet (before its first sample of the queue; for the
/// rates, also that sample's second, which has nothing to count from).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrendSeries {
    /// Tasks enqueued in each second.
    pub enqueued: Vec<Option<u64>>,
    /// Tasks acked in each second.
    pub acked: Vec<Option<u64>>,
    /// Ready tasks at the end of each second.
    pub ready: Vec<Option<u64>>,
}

impl Trend {
    fn note(&mut self, at_ms: u64, totals: QueueTotals, ready: u64) {
        let second = at_ms / 1000;
        let sample = (second, totals.enqueued, totals.acked, ready);
        match self.samples.back_mut() {
            // The latest of a second stands for it.
            Some(last) if last.0 == second => *last = sample,
            Some(last) if last.0 > second => return,
            _ => self.samples.push_back(sample),
        }
        let oldest = second.saturating_sub(TREND_SECONDS as u64);
        // Keep one sample at or before the window: the base of its first second.
        while self.samples.get(1).is_some_and(|s| s.0 <= oldest) {
            self.samples.pop_front();
        }
    }

    fn series(&self, now_ms: u64) -> TrendSeries {
        let now = now_ms / 1000;
        let mut out = TrendSeries::default();
        let mut at = 0;
        let mut last: Option<(u64, u64, u64, u64)> = None;
        let start = (now + 1).saturating_sub(TREND_SECONDS as u64);
        // The samples before the window are the base of its first second.
        while let Some(s) = self.samples.get(at).filter(|s| s.0 < start) {
            last = Some(*s);
            at += 1;
        }
        for second in start..=now {
            let before = last;
            while let Some(s) = self.samples.get(at).filter(|s| s.0 <= second) {
                last = Some(*s);
                at += 1;
            }
            let (enqueued, acked) = match (before, last) {
                (Some(b), Some(l)) => {
                    (Some(l.1.saturating_sub(b.1)), Some(l.2.saturating_sub(b.2)))
                }
                _ => (None, None),
            };
            out.enqueued.push(enqueued);
            out.acked.push(acked);
            out.ready.push(last.map(|l| l.3));
        }
        out
    }
}

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
            TaskState::Ready | TaskState::Done | TaskState::Cancelled => {
                &[Priority, Key, Attempts, Failures, Age]
            }
        },
        Screen::Member { .. } => &[Queue, Attempts, Expires],
        Screen::Dead => &[Queue, Attempts, Died, Reason, Error],
        Screen::Found { .. } => &[Queue, State, Attempts, Age, Error],
        Screen::Queues | Screen::Task { .. } | Screen::Members | Screen::Cluster => &[],
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
        }
    }

    fn sort_value(&self, screen: &Screen, column: usize) -> SortValue {
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
        }
    }

    fn id(&self) -> &str {
        match self {
            Row::Queue(q) => &q.name,
            Row::Task(t) => &t.id,
            Row::Member(m) => &m.name,
            Row::Group(g) => &g.error,
            Row::Node(n) => &n.id,
        }
    }

    /// Whether the row passes a quick filter (`f`, lowercased): the whole text as one
    /// phrase in any of its columns, or the search's words the rows carry (`id:`,
    /// `key:`, `error:`, `state:`, `label:`), each text to the next word as a phrase
    /// (`error:timed out`), all of which must match.
    fn matches(&self, filter: &str) -> bool {
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
            _ => false,
        }
    }
}

/// The search words a quick filter applies to the rows on screen.
const ROW_WORDS: [&str; 6] = ["", "id", "key", "error", "state", "label"];

/// The console.
pub struct App {
    /// The daemon's address, for the title.
    pub addr: String,
    /// The daemon's name and version from its `hello` (`musterd 0.1.0`), for the title;
    /// empty until connected.
    pub server: String,
    /// The cluster as the connected node saw it at `hello` (the title names the leader
    /// and the term); `None` for a single daemon.
    pub cluster: Option<ClusterHello>,
    /// No verbs: keys only look.
    pub readonly: bool,
    /// The navigation stack; the last page is shown.
    pub stack: Vec<Page>,
    /// The tag of the current watch.
    tag: u64,
    /// The current screen's data, once it arrived.
    pub data: Option<WatchUpdate>,
    /// What the keys do now.
    pub mode: Mode,
    /// The footer's message.
    pub message: Option<(Level, String)>,
    /// Wall-clock milliseconds, for ages; the loop sets it before each draw.
    pub now_ms: u64,
    rates: HashMap<String, Rate>,
    /// Set by `q`: the loop ends.
    pub quit: bool,
    /// Why the first screen could not be shown (e.g. the token may not watch it).
    pub load_error: Option<String>,
    /// Whether the loop has a connection; without, the screen may be stale.
    pub connected: bool,
    /// The current search's results (on a [`Screen::Found`]).
    pub found: Option<Found>,
    /// The current search's request, continued by [`App::on_found`].
    search: Option<TaskFind>,
    /// The tag of a `G` in flight: the search for where the last page starts.
    end_lookup: Option<u64>,
    /// The task timeline shows times of day (UTC) instead of ages (`t`).
    pub absolute_times: bool,
    /// The daemon's disk alarm is on (enqueues refused), as its last screen said.
    pub disk_alarm: bool,
    /// The daemon's facts for the title, from its last `server_stats`; `None` until read
    /// (or when the token may not read them).
    pub facts: Option<DaemonFacts>,
    /// The last `server_stats` reply: the next one's fsync mean is over the span since.
    last_stats: Option<ServerStatsReply>,
    /// Each queue's recent history, for the trend graphs.
    trends: HashMap<String, Trend>,
    /// The cluster screen's nodes, once the first answers came.
    pub nodes: Option<ClusterNodes>,
    /// The tag of the cluster screen's round of questions in flight: one at a time.
    cluster_poll: Option<u64>,
    /// The cluster screen wants a round of questions (it opened, or a second passed).
    cluster_due: bool,
}

/// What the title says of the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DaemonFacts {
    /// Milliseconds since it started.
    pub uptime_ms: u64,
    /// Member sessions connected.
    pub members: u64,
    /// Mean fsync latency in microseconds since the previous reading (the latest
    /// persist's when nothing was persisted in between).
    pub fsync_us: u64,
}

impl App {
    /// A console showing the queues; the effect watches them.
    pub fn new(addr: String, readonly: bool, now_ms: u64) -> (App, Effect) {
        let mut app = App {
            addr,
            server: String::new(),
            cluster: None,
            readonly,
            stack: vec![Page::new(Screen::Queues)],
            tag: 0,
            data: None,
            mode: Mode::Normal,
            message: None,
            now_ms,
            rates: HashMap::new(),
            quit: false,
            load_error: None,
            connected: true,
            found: None,
            search: None,
            end_lookup: None,
            absolute_times: false,
            disk_alarm: false,
            facts: None,
            last_stats: None,
            trends: HashMap::new(),
            nodes: None,
            cluster_poll: None,
            cluster_due: false,
        };
        let effect = app.rewatch().expect("the queues screen is watched");
        (app, effect)
    }

    /// The page shown.
    pub fn page(&self) -> &Page {
        self.stack
            .last()
            .expect("the stack always holds the queues page")
    }

    fn page_mut(&mut self) -> &mut Page {
        self.stack
            .last_mut()
            .expect("the stack always holds the queues page")
    }

    /// Watches the current page again under a new tag (after navigation or a verb); a
    /// search's page is searched again from the cursor it started at. The cluster
    /// screen is not watched but asked: `None`, and [`App::cluster_request`] has a
    /// round of questions to send.
    pub fn rewatch(&mut self) -> Option<Effect> {
        self.tag += 1;
        let page = self.page();
        if let Screen::Found { queue, query } = &page.screen {
            let mut search = search_query(queue.clone(), query)
                .expect("a search's query was checked when the search was opened");
            search.after = page.found_cursors.last().cloned().flatten();
            self.search = Some(search.clone());
            self.found = None;
            return Some(Effect::Find {
                search: Box::new(search),
                tag: self.tag,
            });
        }
        if page.screen == Screen::Cluster {
            // A round still out is of the old tag: its answers are dropped.
            self.cluster_poll = None;
            self.cluster_due = true;
            return None;
        }
        Some(Effect::Watch {
            view: page
                .view()
                .expect("every screen but a search and the cluster is watched"),
            tag: self.tag,
        })
    }

    /// A second passed: the cluster screen wants its nodes asked again (not on a single
    /// daemon, which is asked once, to say so).
    pub fn on_tick(&mut self) {
        if self.page().screen == Screen::Cluster && self.cluster.is_some() {
            self.cluster_due = true;
        }
    }

    /// The tag of a round of questions the cluster screen wants sent now: when it
    /// opens (or is shown again after a reconnect), then at the first tick after each
    /// round came back; never while a round is out, nor disconnected. The loop asks
    /// the connected node and every other member for its own `cluster_status`, and
    /// hands the answers to [`App::on_cluster`] with this tag.
    pub fn cluster_request(&mut self) -> Option<u64> {
        if self.page().screen != Screen::Cluster
            || !self.cluster_due
            || self.cluster_poll.is_some()
            || !self.connected
        {
            return None;
        }
        self.cluster_due = false;
        self.cluster_poll = Some(self.tag);
        Some(self.tag)
    }

    /// A round of the cluster screen's questions came back (at `now_ms`): each node
    /// that answered is shown as it said, with when; one that did not keeps what it
    /// last said, marked with why. Nodes no longer members are forgotten.
    pub fn on_cluster(&mut self, tag: u64, poll: Result<ClusterPoll, String>) {
        if self.cluster_poll == Some(tag) {
            self.cluster_poll = None;
        }
        if tag != self.tag || self.page().screen != Screen::Cluster {
            return;
        }
        let poll = match poll {
            Ok(poll) => poll,
            // What was shown stays, the footer says why it is not refreshed.
            Err(e) if self.nodes.is_some() => {
                self.message = Some((Level::Error, format!("cluster status: {e}")));
                return;
            }
            Err(e) => {
                self.load_error = Some(e);
                return;
            }
        };
        self.load_error = None;
        let selected = self.selected_row().map(|r| r.id().to_owned());
        let mut heard = self.nodes.take().map(|n| n.heard).unwrap_or_default();
        let mut failed = BTreeMap::new();
        heard.insert(poll.local.node, (self.now_ms, poll.local.clone()));
        for (node, answer) in poll.others {
            match answer {
                Ok(reply) => {
                    heard.insert(node, (self.now_ms, reply));
                }
                Err(e) => {
                    failed.insert(node, e);
                }
            }
        }
        heard.retain(|node, _| poll.local.members.iter().any(|m| m.node == *node));
        self.nodes = Some(ClusterNodes {
            local: poll.local,
            heard,
            failed,
        });
        self.follow(selected);
    }

    /// A search's reply arrived: its matches join the page, and while the page is not
    /// full and tasks are left the search goes on (each request is bounded by the daemon).
    pub fn on_found(&mut self, tag: u64, reply: Result<TaskFindReply, String>) -> Option<Effect> {
        if tag != self.tag {
            return None;
        }
        if self.end_lookup.take() == Some(tag) {
            return self.on_end(reply);
        }
        let reply = match reply {
            Ok(reply) => reply,
            Err(e) => {
                self.message = Some((Level::Error, format!("search: {e}")));
                self.found.get_or_insert_with(Found::default);
                return None;
            }
        };
        let found = self.found.get_or_insert_with(Found::default);
        found.tasks.extend(reply.tasks);
        found.scanned += reply.scanned;
        found.next = reply.next;
        let full = found.tasks.len() >= PAGE_ROWS as usize;
        found.more = full && found.next.is_some();
        let search = self.search.as_mut()?;
        match (&found.next, full) {
            (Some(next), false) => {
                search.after = Some(next.clone());
                search.limit = Some(PAGE_ROWS - found.tasks.len() as u32);
                Some(Effect::Find {
                    search: Box::new(search.clone()),
                    tag: self.tag,
                })
            }
            _ => {
                let selected = self.page().selected;
                self.page_mut().selected = selected.min(self.rows().len().saturating_sub(1));
                None
            }
        }
    }

    fn open(&mut self, screen: Screen) -> Option<Effect> {
        self.stack.push(Page::new(screen));
        self.leave();
        self.rewatch()
    }

    /// Forgets what the screen being left showed. (Rates stay: totals only grow, so a
    /// span spent on other screens still averages right.)
    fn leave(&mut self) {
        self.data = None;
        self.found = None;
        self.nodes = None;
    }

    /// Replaces everything above the queues page with `screen` (`:` commands).
    fn jump(&mut self, screen: Screen) -> Option<Effect> {
        self.stack.truncate(1);
        if screen == Screen::Queues {
            self.leave();
            return self.rewatch();
        }
        self.open(screen)
    }

    fn back(&mut self) -> Option<Effect> {
        if self.stack.len() == 1 {
            return None;
        }
        self.stack.pop();
        self.leave();
        // Never to the cluster screen: nothing opens from it.
        self.rewatch()
    }

    /// A watch reply or push arrived. Stale tags are dropped.
    pub fn on_watch(&mut self, reply: WatchReply) -> Option<Effect> {
        if reply.tag != self.tag {
            return None;
        }
        self.disk_alarm = reply.disk_alarm;
        match reply.update {
            WatchUpdate::Gone { error } => {
                self.message = Some((Level::Error, format!("gone: {}", error.message)));
                self.back()
            }
            update => {
                self.load_error = None;
                self.note_rates(&update);
                let selected = self.selected_row().map(|r| r.id().to_owned());
                self.data = Some(update);
                self.follow(selected);
                None
            }
        }
    }

    /// A watch failed (e.g. the task does not exist): say so and go back.
    pub fn on_watch_failed(&mut self, tag: u64, error: String) -> Option<Effect> {
        if tag != self.tag {
            return None;
        }
        self.message = Some((Level::Error, error.clone()));
        let back = self.back();
        if back.is_none() {
            // Nowhere to go back to: say it where the screen would be.
            self.load_error = Some(error);
        }
        back
    }

    /// The editor closed with `edited` (or failed): what was written asks for the
    /// confirm of its verb; what is unchanged, empty or invalid does nothing and the
    /// footer says why.
    pub fn on_edited(&mut self, draft: Draft, edited: Result<String, String>) {
        let text = match edited {
            Ok(text) => text,
            Err(e) => return self.say(Err(format!("editing: {e}"))),
        };
        match draft {
            Draft::Requeue(requeue) => self.edited_requeue(requeue, &text),
            Draft::Enqueue { queue } => {
                let payload = text.trim();
                if payload.is_empty() {
                    return self.say(Err("the payload is empty: nothing done".into()));
                }
                if let Err(e) = serde_json::from_str::<serde_json::Value>(payload) {
                    return self.say(Err(format!("the payload is not JSON ({e}): nothing done")));
                }
                self.mode = Mode::Confirm(Verb::Enqueue {
                    queue,
                    payload: payload.to_owned(),
                });
            }
            Draft::Options { queue, options } => {
                let edited = match serde_json::from_str::<QueuePatch>(&text) {
                    Ok(edited) => edited,
                    Err(e) => {
                        return self.say(Err(format!(
                            "the edited options are not valid ({e}): nothing done"
                        )));
                    }
                };
                let (patch, changes) = queue_changes(&options, &edited);
                if changes.is_empty() {
                    return self.say(Ok("options unchanged: nothing done".into()));
                }
                self.mode = Mode::Confirm(Verb::UpdateQueue(QueueChange {
                    queue,
                    patch,
                    changes,
                }));
            }
        }
    }

    fn edited_requeue(&mut self, mut requeue: Requeue, text: &str) {
        let text = text.trim();
        if text == requeue.payload.trim() {
            return self.say(Ok("payload unchanged: nothing done".into()));
        }
        if let Err(e) = serde_json::from_str::<serde_json::Value>(text) {
            return self.say(Err(format!(
                "the edited payload is not JSON ({e}): nothing done"
            )));
        }
        requeue.payload = text.to_owned();
        self.mode = Mode::Confirm(Verb::Requeue(requeue));
    }

    /// The daemon's counters arrived: the title's facts follow. A failure (a token that
    /// may not read them, a lost connection) leaves the title without them.
    pub fn on_stats(&mut self, reply: Result<ServerStatsReply, String>) {
        let Ok(reply) = reply else {
            self.facts = None;
            return;
        };
        let fsync_us = match &self.last_stats {
            Some(last) if reply.syncs > last.syncs => {
                reply.fsync_total_us.saturating_sub(last.fsync_total_us)
                    / (reply.syncs - last.syncs)
            }
            _ => reply.fsync_last_us,
        };
        self.facts = Some(DaemonFacts {
            uptime_ms: reply.uptime_ms,
            members: reply.members_connected,
            fsync_us,
        });
        self.last_stats = Some(reply);
    }

    /// The loop holds a connection to this daemon: its name and version, and the
    /// cluster its `hello` named, for the title.
    pub fn on_connection(&mut self, server: String, cluster: Option<ClusterHello>) {
        self.server = server;
        self.cluster = cluster;
    }

    /// The loop lost its connection (or its node no longer leads), for the reason the
    /// footer says: the screen may be stale until [`App::on_reconnected`].
    pub fn on_disconnected(&mut self, why: &str) {
        assert!(self.connected, "a connection is lost once");
        self.connected = false;
        self.message = Some((Level::Error, why.to_owned()));
    }

    /// An attempt to reconnect failed, for this reason; the loop tries again.
    pub fn on_reconnecting(&mut self, why: &str) {
        self.message = Some((
            Level::Error,
            format!("connection to musterd lost ({why}); reconnecting…"),
        ));
    }

    /// The loop has a new connection, perhaps to another version (a restart) or node:
    /// the title follows it, the footer says so, and the screen is watched again.
    pub fn on_reconnected(
        &mut self,
        server: String,
        cluster: Option<ClusterHello>,
    ) -> Option<Effect> {
        assert!(!self.connected, "only a lost connection is made again");
        self.on_connection(server, cluster);
        self.connected = true;
        self.message = Some((Level::Info, "reconnected".into()));
        self.rewatch()
    }

    /// Says in the footer how something that changed nothing went (a copy).
    pub fn say(&mut self, result: Result<String, String>) {
        self.message = Some(match result {
            Ok(text) => (Level::Info, text),
            Err(text) => (Level::Error, text),
        });
    }

    /// A verb finished: say how, and refresh the screen at once.
    ///
    /// `removed` says the verb removed what it named (a discard): on the task screen
    /// there is then nothing left to show, so the console goes back.
    pub fn on_done(&mut self, result: Result<String, String>, removed: bool) -> Option<Effect> {
        let ok = result.is_ok();
        self.message = Some(match result {
            Ok(text) => {
                self.page_mut().marked.clear();
                (Level::Info, text)
            }
            Err(text) => (Level::Error, text),
        });
        if ok && removed && matches!(self.page().screen, Screen::Task { .. }) {
            return self.back().or_else(|| self.rewatch());
        }
        self.rewatch()
    }

    fn note_rates(&mut self, update: &WatchUpdate) {
        let queues: Vec<&QueueInfo> = match update {
            WatchUpdate::Queues { queues, .. } => queues.iter().collect(),
            WatchUpdate::Tasks { queue, .. } => vec![queue],
            _ => return,
        };
        for q in queues {
            self.rates
                .entry(q.name.clone())
                .or_default()
                .note(self.now_ms, q.totals);
            self.trends.entry(q.name.clone()).or_default().note(
                self.now_ms,
                q.totals,
                q.counts.ready,
            );
        }
    }

    /// A queue's last [`TREND_SECONDS`] seconds, ending now.
    pub fn trend(&self, queue: &str) -> TrendSeries {
        self.trends.get(queue).map_or_else(
            || Trend::default().series(self.now_ms),
            |t| t.series(self.now_ms),
        )
    }

    /// Enqueued and acked per second of a queue, as last measured.
    pub fn rate(&self, queue: &str) -> (f64, f64) {
        self.rates
            .get(queue)
            .map_or((0.0, 0.0), |r| r.per_second(self.now_ms))
    }

    /// The rows of the current list screen that pass its filter, in its sort order.
    pub fn rows(&self) -> Vec<Row<'_>> {
        let filter = self.page().filter.to_lowercase();
        let mut rows: Vec<Row<'_>> = self
            .all_rows()
            .into_iter()
            .filter(|r| r.matches(&filter))
            .collect();
        if let Some((column, descending)) = self.page().sort {
            let screen = &self.page().screen;
            rows.sort_by(|a, b| {
                let order = a
                    .sort_value(screen, column)
                    .cmp(&b.sort_value(screen, column));
                if descending { order.reverse() } else { order }
            });
        }
        rows
    }

    /// `s`: sort the page's rows by the next column (after the last, back to the
    /// daemon's order); `S`: the other way round.
    fn sort(&mut self, reverse: bool) {
        let columns = match self.all_rows().first() {
            Some(row) => row.sort_columns(&self.page().screen).len(),
            None => return,
        };
        let page = self.page_mut();
        page.sort = match (page.sort, reverse) {
            (Some((c, descending)), true) => Some((c, !descending)),
            (None, true) => None,
            (None, false) => Some((0, false)),
            (Some((c, _)), false) if c + 1 < columns => Some((c + 1, false)),
            (Some(_), false) => None,
        };
    }

    /// The name of the column the page is sorted by, and whether descending.
    pub fn sorted_by(&self) -> Option<(&'static str, bool)> {
        let (column, descending) = self.page().sort?;
        let row = self.all_rows().into_iter().next()?;
        let name = *row.sort_columns(&self.page().screen).get(column)?;
        Some((name, descending))
    }

    /// Every row of the current list screen's page, filter or not.
    pub fn all_rows(&self) -> Vec<Row<'_>> {
        if self.page().grouped {
            return match &self.data {
                Some(WatchUpdate::Tasks { tasks, .. } | WatchUpdate::Dead { tasks, .. }) => {
                    error_groups(tasks).into_iter().map(Row::Group).collect()
                }
                _ => Vec::new(),
            };
        }
        if matches!(self.page().screen, Screen::Found { .. }) {
            return self
                .found
                .iter()
                .flat_map(|f| f.tasks.iter().map(Row::Task))
                .collect();
        }
        if self.page().screen == Screen::Cluster {
            return self
                .nodes
                .iter()
                .flat_map(|n| n.rows().into_iter().map(Row::Node))
                .collect();
        }
        match &self.data {
            Some(WatchUpdate::Queues { queues, .. }) => queues.iter().map(Row::Queue).collect(),
            Some(
                WatchUpdate::Tasks { tasks, .. }
                | WatchUpdate::Dead { tasks, .. }
                | WatchUpdate::Member { leases: tasks, .. },
            ) => tasks.iter().map(Row::Task).collect(),
            Some(WatchUpdate::Members { members, .. }) => members.iter().map(Row::Member).collect(),
            _ => Vec::new(),
        }
    }

    /// Whether the screen lists dead tasks (the dead letters, a queue's dead tab).
    fn is_dead_list(&self) -> bool {
        matches!(
            self.page().screen,
            Screen::Dead
                | Screen::Queue {
                    state: TaskState::Dead,
                    ..
                }
        )
    }

    /// `E` on a dead list: group its rows by error, or list them again.
    fn group(&mut self) {
        if !self.is_dead_list() {
            return;
        }
        let page = self.page_mut();
        page.grouped = !page.grouped;
        page.selected = 0;
        page.sort = None;
    }

    fn next_cursor(&self) -> Option<String> {
        match &self.data {
            Some(
                WatchUpdate::Queues { next, .. }
                | WatchUpdate::Tasks { next, .. }
                | WatchUpdate::Dead { next, .. }
                | WatchUpdate::Members { next, .. },
            ) => next.clone(),
            _ => None,
        }
    }

    /// After an update: the selection stays on the row it was on (rows move as tasks
    /// come and go), marks of rows no longer shown are dropped, and the selection is
    /// clamped to the rows there are.
    fn follow(&mut self, selected: Option<String>) {
        if matches!(self.page().screen, Screen::Task { .. }) {
            return;
        }
        let all: Vec<String> = self.all_rows().iter().map(|r| r.id().to_owned()).collect();
        let ids: Vec<String> = self.rows().iter().map(|r| r.id().to_owned()).collect();
        let page = self.page_mut();
        // Marks stay while their rows are on the page, shown or filtered out.
        page.marked.retain(|id| all.contains(id));
        if let Some(at) = selected.and_then(|s| ids.iter().position(|id| *id == s)) {
            page.selected = at;
        }
        page.selected = page.selected.min(ids.len().saturating_sub(1));
        debug_assert!(
            self.selection_on_a_row(),
            "follow left the selection off the rows"
        );
    }

    /// Whether the selection is on one of the page's rows (0 when there are none), as
    /// it must be on a list whose rows have arrived. A page still on its way may hold a
    /// selection to clamp when it comes (`usize::MAX` for its last row), a search fills
    /// its page over several replies, and on the task screen `selected` is a scroll
    /// offset: those are not checked.
    fn selection_on_a_row(&self) -> bool {
        let arrived = match self.page().screen {
            Screen::Task { .. } | Screen::Found { .. } => return true,
            Screen::Cluster => self.nodes.is_some(),
            _ => self.data.is_some(),
        };
        !arrived || self.page().selected < self.rows().len().max(1)
    }

    fn selected_row(&self) -> Option<Row<'_>> {
        let i = self.page().selected;
        self.rows().into_iter().nth(i)
    }

    fn selected_task(&self) -> Option<TaskSummary> {
        match self.selected_row() {
            Some(Row::Task(t)) => Some(t.clone()),
            _ => None,
        }
    }

    fn selected_queue(&self) -> Option<QueueInfo> {
        match (&self.page().screen, &self.data, self.selected_row()) {
            (Screen::Queues, _, Some(Row::Queue(q))) => Some(q.clone()),
            (Screen::Queue { .. }, Some(WatchUpdate::Tasks { queue, .. }), _) => {
                Some(queue.clone())
            }
            _ => None,
        }
    }

    /// Handles one key press: Ctrl-C quits from any mode; every other key is the
    /// current mode's.
    pub fn on_key(&mut self, key: KeyEvent) -> Vec<Effect> {
        if key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c') {
            self.quit = true;
            return Vec::new();
        }
        let effects = match std::mem::replace(&mut self.mode, Mode::Normal) {
            Mode::Normal => self.normal_key(key),
            Mode::Help => Vec::new(),
            Mode::Confirm(verb) => self.confirm_key(key, verb),
            Mode::Filter(text) => {
                self.filter_key(key, text);
                Vec::new()
            }
            Mode::Search(text) => self.search_key(key, text),
            Mode::Command(text) => self.command_key(key, text),
        };
        debug_assert!(
            self.selection_on_a_row(),
            "a key left the selection off the rows"
        );
        effects
    }

    /// A key while a verb waits for its confirmation: `y` runs it, any other key
    /// drops it.
    fn confirm_key(&mut self, key: KeyEvent, verb: Verb) -> Vec<Effect> {
        assert!(!self.readonly, "a read-only console runs no verb");
        if key.code == KeyCode::Char('y') || key.code == KeyCode::Char('Y') {
            vec![Effect::Run(verb)]
        } else {
            self.message = Some((Level::Info, "nothing done".into()));
            Vec::new()
        }
    }

    /// A key while the page's filter is typed (`f`): the filter follows the text as it
    /// is typed, enter keeps it, esc clears it; the selection goes back to the top.
    fn filter_key(&mut self, key: KeyEvent, mut text: String) {
        match key.code {
            KeyCode::Enter => {}
            KeyCode::Esc => {
                self.page_mut().filter.clear();
            }
            KeyCode::Backspace => {
                text.pop();
                self.page_mut().filter = text.clone();
                self.mode = Mode::Filter(text);
            }
            KeyCode::Char(c) => {
                text.push(c);
                self.page_mut().filter = text.clone();
                self.mode = Mode::Filter(text);
            }
            _ => self.mode = Mode::Filter(text),
        }
        self.page_mut().selected = 0;
    }

    /// A key while a search is typed (`/`): enter opens its results (or says why the
    /// query is not one), esc drops it.
    fn search_key(&mut self, key: KeyEvent, mut text: String) -> Vec<Effect> {
        match key.code {
            KeyCode::Enter => {
                let queue = self.search_scope().flatten();
                match search_query(queue.clone(), &text) {
                    Ok(_) => {
                        self.message = None;
                        return self
                            .open(Screen::Found { queue, query: text })
                            .into_iter()
                            .collect();
                    }
                    Err(e) => self.message = Some((Level::Error, e)),
                }
            }
            KeyCode::Esc => {}
            KeyCode::Backspace => {
                text.pop();
                self.mode = Mode::Search(text);
            }
            KeyCode::Char(c) => {
                text.push(c);
                self.mode = Mode::Search(text);
            }
            _ => self.mode = Mode::Search(text),
        }
        Vec::new()
    }

    /// A key while a `:` command is typed: enter runs it, tab completes its last
    /// word, esc drops it.
    fn command_key(&mut self, key: KeyEvent, mut text: String) -> Vec<Effect> {
        match key.code {
            KeyCode::Enter => return self.command(text.trim()),
            KeyCode::Tab => self.mode = Mode::Command(self.complete(&text)),
            KeyCode::Esc => {}
            KeyCode::Backspace => {
                text.pop();
                self.mode = Mode::Command(text);
            }
            KeyCode::Char(c) => {
                text.push(c);
                self.mode = Mode::Command(text);
            }
            _ => self.mode = Mode::Command(text),
        }
        Vec::new()
    }

    /// Completes the last word of a `:` command: the command, then a queue name (of
    /// the queues seen), then a state. Several candidates complete to what they share.
    fn complete(&self, text: &str) -> String {
        const COMMANDS: [&str; 7] = [
            "queues", "queue", "members", "dead", "cluster", "task", "quit",
        ];
        let words: Vec<&str> = text.split(' ').collect();
        let (done, last) = words.split_at(words.len() - 1);
        let last = last[0];
        let mut queues: Vec<&str> = self.rates.keys().map(String::as_str).collect();
        queues.sort_unstable();
        let candidates: Vec<&str> = match done {
            [] => COMMANDS.to_vec(),
            ["queue"] => queues,
            ["queue", _] => TaskState::ALL.iter().map(|s| s.as_str()).collect(),
            _ => return text.to_owned(),
        };
        let matching: Vec<&str> = candidates
            .into_iter()
            .filter(|c| c.starts_with(last))
            .collect();
        let completed = match matching.as_slice() {
            [] => return text.to_owned(),
            [one] => format!("{one} "),
            [first, rest @ ..] => {
                let mut shared = first.to_string();
                for c in rest {
                    while !c.starts_with(&shared) {
                        shared.pop();
                    }
                }
                shared
            }
        };
        let mut out: Vec<String> = done.iter().map(|w| (*w).to_owned()).collect();
        out.push(completed);
        out.join(" ")
    }

    fn command(&mut self, text: &str) -> Vec<Effect> {
        let mut words = text.split_whitespace();
        let screen = match (words.next(), words.next(), words.next()) {
            (Some("q" | "quit"), None, None) => {
                self.quit = true;
                return Vec::new();
            }
            (Some("queues"), None, None) => Screen::Queues,
            (Some("members"), None, None) => Screen::Members,
            (Some("dead"), None, None) => Screen::Dead,
            (Some("cluster"), None, None) => Screen::Cluster,
            (Some("queue"), Some(name), state) => {
                let state = match state.map(TaskState::parse) {
                    None => TaskState::Ready,
                    Some(Some(state)) => state,
                    Some(None) => {
                        self.message = Some((
                            Level::Error,
                            format!(
                                "unknown state in {text:?}: ready, scheduled, leased, dead, done or cancelled"
                            ),
                        ));
                        return Vec::new();
                    }
                };
                Screen::Queue {
                    name: name.to_owned(),
                    state,
                }
            }
            (Some("task"), Some(id), None) => Screen::Task { id: id.to_owned() },
            _ => {
                self.message = Some((
                    Level::Error,
                    format!(
                        "unknown command {text:?}: try :queues, :members, :dead, :cluster, :queue NAME [STATE], :task ID, :q"
                    ),
                ));
                return Vec::new();
            }
        };
        self.message = None;
        self.jump(screen).into_iter().collect()
    }

    /// A key in the normal mode: one arm per key (a table, as the help lists them).
    fn normal_key(&mut self, key: KeyEvent) -> Vec<Effect> {
        let screen = self.page().screen.clone();
        let effect = match key.code {
            KeyCode::Char('q') => {
                self.quit = true;
                None
            }
            KeyCode::Char('?') => {
                self.mode = Mode::Help;
                None
            }
            KeyCode::Char(':') => {
                self.mode = Mode::Command(String::new());
                None
            }
            KeyCode::Char('f') if !matches!(screen, Screen::Task { .. }) => {
                self.mode = Mode::Filter(self.page().filter.clone());
                None
            }
            KeyCode::Char('/') if self.search_scope().is_some() => {
                self.mode = Mode::Search(String::new());
                None
            }
            KeyCode::Esc => self.escape(),
            KeyCode::Down | KeyCode::Char('j') => self.step(1),
            KeyCode::Up | KeyCode::Char('k') => self.step(-1),
            KeyCode::Home | KeyCode::Char('g') => {
                self.page_mut().selected = 0;
                None
            }
            KeyCode::End | KeyCode::Char('G') => self.end(),
            KeyCode::Char('n') => self.newest_first(),
            KeyCode::Char('E') => {
                self.group();
                None
            }
            KeyCode::PageDown | KeyCode::Char(']') => self.next_page(),
            KeyCode::PageUp | KeyCode::Char('[') => self.previous_page(0),
            KeyCode::Enter => self.enter(),
            KeyCode::Tab | KeyCode::Right | KeyCode::Char('l') => self.tab(1),
            KeyCode::BackTab | KeyCode::Left | KeyCode::Char('h') => self.tab(TABS.len() - 1),
            KeyCode::Char(' ') => {
                self.mark();
                None
            }
            // Copying changes nothing: read-only consoles copy too.
            KeyCode::Char('s') if !matches!(screen, Screen::Task { .. }) => {
                self.sort(false);
                None
            }
            KeyCode::Char('S') if !matches!(screen, Screen::Task { .. }) => {
                self.sort(true);
                None
            }
            KeyCode::Char('y') => return self.copy(false).into_iter().collect(),
            KeyCode::Char('t') if matches!(screen, Screen::Task { .. }) => {
                self.absolute_times = !self.absolute_times;
                None
            }
            KeyCode::Char('e') if !self.readonly => return self.edit().into_iter().collect(),
            KeyCode::Char('a') if !self.readonly => {
                return self.draft_for_queue(false).into_iter().collect();
            }
            KeyCode::Char('o') if !self.readonly => {
                return self.draft_for_queue(true).into_iter().collect();
            }
            KeyCode::Char('Y') => return self.copy(true).into_iter().collect(),
            KeyCode::Char(c) if !self.readonly => {
                if let Some(verb) = self.verb(c) {
                    self.mode = Mode::Confirm(verb);
                }
                None
            }
            _ => None,
        };
        effect.into_iter().collect()
    }

    /// Esc: clears the filter, else the marks, else the grouping by error; with none of
    /// them, goes back to the screen before.
    fn escape(&mut self) -> Option<Effect> {
        let page = self.page_mut();
        if !page.filter.is_empty() {
            page.filter.clear();
            None
        } else if !page.marked.is_empty() {
            page.marked.clear();
            None
        } else if page.grouped {
            page.grouped = false;
            page.selected = 0;
            None
        } else {
            self.back()
        }
    }

    /// `G`: the last row of the whole list. A queue's tab with more pages than this one
    /// asks the daemon for its newest `PAGE_ROWS + 1` tasks: the oldest of them is the
    /// cursor after which the last page starts.
    fn end(&mut self) -> Option<Effect> {
        let more = self.next_cursor().is_some();
        match self.page().screen.clone() {
            Screen::Queue { name, state } if more => {
                self.tag += 1;
                self.end_lookup = Some(self.tag);
                let search = TaskFind {
                    queue: Some(name),
                    state: Some(state),
                    newest_first: true,
                    limit: Some(PAGE_ROWS + 1),
                    ..TaskFind::default()
                };
                Some(Effect::Find {
                    search: Box::new(search),
                    tag: self.tag,
                })
            }
            _ => {
                let last = self.rows().len().saturating_sub(1);
                self.page_mut().selected = last;
                None
            }
        }
    }

    /// Where the last page starts arrived: watch that page, its last row selected.
    fn on_end(&mut self, reply: Result<TaskFindReply, String>) -> Option<Effect> {
        let reply = match reply {
            Ok(reply) => reply,
            Err(e) => {
                self.message = Some((Level::Error, format!("to the end: {e}")));
                return self.rewatch();
            }
        };
        let after = (reply.tasks.len() > PAGE_ROWS as usize)
            .then(|| reply.tasks.last().map(|t| t.id.clone()))
            .flatten();
        let page = self.page_mut();
        page.cursors = vec![None];
        if after.is_some() {
            page.cursors.push(after);
        }
        // Clamped to the last row when the page arrives.
        page.selected = usize::MAX;
        self.data = None;
        self.rewatch()
    }

    /// `n` on a queue's tab or the dead letters: the same list newest first (a search by
    /// state); `n` again, or esc, goes back to it. On the members: the most recently
    /// seen first.
    fn newest_first(&mut self) -> Option<Effect> {
        match self.page().screen.clone() {
            Screen::Dead => self.open(Screen::Found {
                queue: None,
                query: "state:dead".into(),
            }),
            Screen::Members => {
                // Members have no age: the most recently heard from first, or back.
                const LAST_SEEN: usize = 3;
                let page = self.page_mut();
                page.sort = match page.sort {
                    Some((LAST_SEEN, true)) => None,
                    _ => Some((LAST_SEEN, true)),
                };
                None
            }
            Screen::Queue { name, state } => self.open(Screen::Found {
                queue: Some(name),
                query: format!("state:{}", state.as_str()),
            }),
            Screen::Found { query, .. } if query.starts_with("state:") && self.stack.len() > 1 => {
                self.back()
            }
            _ => None,
        }
    }

    /// `a` on the queues or a queue's screen: write a new task's payload for the
    /// (selected) queue; `o`: edit its options.
    fn draft_for_queue(&mut self, options: bool) -> Option<Effect> {
        if !matches!(self.page().screen, Screen::Queues | Screen::Queue { .. }) {
            return None;
        }
        let q = self.selected_queue()?;
        Some(Effect::Edit(if options {
            Draft::Options {
                queue: q.name,
                options: q.options,
            }
        } else {
            Draft::Enqueue { queue: q.name }
        }))
    }

    /// `e` on a dead task's screen: edit its payload, to enqueue it again.
    fn edit(&mut self) -> Option<Effect> {
        let Some(WatchUpdate::Task { task }) = &self.data else {
            if matches!(self.page().screen, Screen::Task { .. }) {
                self.refuse("the task has not arrived yet; try again in a moment");
            }
            return None;
        };
        if task.state != TaskState::Dead {
            self.refuse("only a dead task is edited and enqueued again");
            return None;
        }
        Some(Effect::Edit(Draft::Requeue(Requeue {
            id: task.id.clone(),
            queue: task.queue.clone(),
            payload: pretty_json(task.payload.get()),
            priority: task.priority,
            key: task.key.clone(),
            requires: task.requires.clone(),
        })))
    }

    /// `y` copies the selected task's id (or the queue's or member's name), `Y` the
    /// shown task's payload.
    fn copy(&mut self, payload: bool) -> Option<Effect> {
        let (text, what) = match (&self.data, payload) {
            (Some(WatchUpdate::Task { task }), true) => (
                task.payload.get().to_owned(),
                format!("the payload of {}", task.id),
            ),
            (Some(WatchUpdate::Task { task }), false) => (task.id.clone(), task.id.clone()),
            (_, false) => match self.selected_row()? {
                Row::Node(n) => (n.addr.clone(), format!("the address of node {}", n.node)),
                row => {
                    let id = row.id().to_owned();
                    (id.clone(), id)
                }
            },
            (_, true) => return None,
        };
        Some(Effect::Copy { text, what })
    }

    /// What `/` searches from this screen: `Some(Some(queue))` a queue, `Some(None)`
    /// every queue, `None` nothing (a task or member screen).
    fn search_scope(&self) -> Option<Option<String>> {
        match &self.page().screen {
            Screen::Queue { name, .. } => Some(Some(name.clone())),
            Screen::Found { queue, .. } => Some(queue.clone()),
            Screen::Queues | Screen::Dead => Some(None),
            Screen::Task { .. } | Screen::Members | Screen::Member { .. } | Screen::Cluster => None,
        }
    }

    fn step(&mut self, by: isize) -> Option<Effect> {
        if let Some(WatchUpdate::Task { task }) = &self.data {
            let last = super::detail::task_lines(task, self.now_ms, self.absolute_times)
                .len()
                .saturating_sub(1);
            let page = self.page_mut();
            page.selected = page.selected.saturating_add_signed(by).min(last);
            return None;
        }
        // Nothing on screen yet (a page or screen is on its way): nothing to move over.
        if self.data.is_none() && self.found.is_none() && self.nodes.is_none() {
            return None;
        }
        let n = self.rows().len();
        let at = self.page().selected;
        if by > 0 && at.saturating_add(1) >= n {
            return self.next_page();
        }
        if by < 0 && at == 0 {
            return self.previous_page(usize::MAX);
        }
        self.page_mut().selected = at.saturating_add_signed(by);
        None
    }

    fn next_page(&mut self) -> Option<Effect> {
        if matches!(self.page().screen, Screen::Found { .. }) {
            let found = self.found.as_ref().filter(|f| f.more)?;
            let next = found.next.clone();
            let page = self.page_mut();
            page.found_cursors.push(next);
            page.selected = 0;
            return self.rewatch();
        }
        let next = self.next_cursor()?;
        let page = self.page_mut();
        page.cursors.push(Some(next));
        page.selected = 0;
        // Until the new page arrives there is no row to act on and no cursor to follow.
        self.data = None;
        self.rewatch()
    }

    /// Goes to the previous page, selecting `selected` there (clamped when it arrives).
    fn previous_page(&mut self, selected: usize) -> Option<Effect> {
        let page = self.page_mut();
        if page.found_cursors.len() > 1 {
            page.found_cursors.pop();
            page.selected = selected;
            return self.rewatch();
        }
        if page.cursors.len() < 2 {
            return None;
        }
        page.cursors.pop();
        page.selected = selected;
        self.data = None;
        self.rewatch()
    }

    fn enter(&mut self) -> Option<Effect> {
        if let Some(Row::Group(g)) = self.selected_row() {
            // Its tasks: the list filtered by its error.
            let page = self.page_mut();
            page.grouped = false;
            page.filter = g.error;
            page.selected = 0;
            return None;
        }
        let screen = match (&self.page().screen, self.selected_row()?) {
            (Screen::Queues, Row::Queue(q)) => Screen::Queue {
                name: q.name.clone(),
                state: TaskState::Ready,
            },
            (
                Screen::Queue { .. } | Screen::Dead | Screen::Member { .. } | Screen::Found { .. },
                Row::Task(t),
            ) => Screen::Task { id: t.id.clone() },
            (Screen::Members, Row::Member(m)) => Screen::Member {
                name: m.name.clone(),
            },
            _ => return None,
        };
        self.open(screen)
    }

    fn tab(&mut self, by: usize) -> Option<Effect> {
        let Screen::Queue { name, state } = &self.page().screen else {
            return None;
        };
        let at = TABS.iter().position(|s| s == state).unwrap_or(0);
        let screen = Screen::Queue {
            name: name.clone(),
            state: TABS[(at + by) % TABS.len()],
        };
        *self.page_mut() = Page::new(screen);
        self.leave();
        self.rewatch()
    }

    /// Marks or unmarks the selected dead task (marks are for redrive and discard).
    fn mark(&mut self) {
        let dead = matches!(
            self.page().screen,
            Screen::Dead
                | Screen::Queue {
                    state: TaskState::Dead,
                    ..
                }
        );
        let Some(task) = self.selected_task().filter(|_| dead) else {
            return;
        };
        let page = self.page_mut();
        if !page.marked.remove(&task.id) {
            page.marked.insert(task.id);
        }
    }

    /// The verb a key names on the current screen, if it applies to what is selected:
    /// one arm per key and screen (a table), each a step of its own.
    fn verb(&mut self, key: char) -> Option<Verb> {
        let screen = self.page().screen.clone();
        let verb = match (key, &screen) {
            ('p', Screen::Queues | Screen::Queue { .. }) => {
                let q = self.selected_queue()?;
                if q.options.paused {
                    Verb::Resume(q.name)
                } else {
                    Verb::Pause(q.name)
                }
            }
            ('R', Screen::Queues | Screen::Queue { .. }) => {
                let q = self.selected_queue()?;
                self.all_dead(q.name, q.counts.dead)?
            }
            (
                'r' | 'x',
                Screen::Queue {
                    state: TaskState::Dead,
                    ..
                }
                | Screen::Dead,
            ) => Verb::Dead(dead_action(key), self.marked_dead()?),
            ('r' | 'x', Screen::Task { .. }) => Verb::Dead(dead_action(key), self.shown_dead()?),
            ('c', Screen::Queue { .. } | Screen::Member { .. } | Screen::Found { .. }) => {
                let t = self.selected_task()?;
                self.cancel(t.state, t.id)?
            }
            ('c', Screen::Task { .. }) => {
                let (state, id) = self.shown_state()?;
                self.cancel(state, id)?
            }
            ('v', Screen::Queue { .. } | Screen::Member { .. } | Screen::Found { .. }) => {
                let t = self.selected_task()?;
                if t.state != TaskState::Leased {
                    return self.refuse("only a leased task has a lease to revoke");
                }
                Verb::Revoke(t.id)
            }
            ('v', Screen::Task { .. }) => Verb::Revoke(self.shown_task(TaskState::Leased)?.1),
            ('d', Screen::Members) => match self.selected_row()? {
                Row::Member(m) => Verb::Drain(m.name.clone()),
                _ => return None,
            },
            ('d', Screen::Member { name }) => Verb::Drain(name.clone()),
            ('u', Screen::Members | Screen::Member { .. }) => self.undrain()?,
            (
                '+' | '-' | 'N',
                Screen::Queue { .. } | Screen::Found { .. } | Screen::Task { .. },
            ) => self.reprioritize(key)?,
            ('P', Screen::Queues | Screen::Queue { .. }) => self.purge()?,
            ('D', Screen::Queues) => {
                let q = self.selected_queue()?;
                let n = TaskState::ALL.iter().map(|s| q.counts.get(*s)).sum();
                Verb::DeleteQueue(q.name, n)
            }
            _ => return None,
        };
        Some(verb)
    }

    /// Says in the footer why a key names no verb here.
    fn refuse(&mut self, why: &str) -> Option<Verb> {
        self.message = Some((Level::Error, why.to_owned()));
        None
    }

    /// The shown task, to redrive or discard, if it is dead.
    fn shown_dead(&mut self) -> Option<DeadTasks> {
        let (queue, id) = self.shown_task(TaskState::Dead)?;
        Some(DeadTasks {
            queue,
            ids: vec![id],
            all: false,
            count: 1,
        })
    }

    /// Cancel the task `id`, if it is in a `state` that can be cancelled.
    fn cancel(&mut self, state: TaskState, id: String) -> Option<Verb> {
        if !is_live(state) {
            return self.refuse("only ready, scheduled and leased tasks can be cancelled");
        }
        Some(Verb::Cancel(id))
    }

    /// Undrain the member shown or selected, if it is draining.
    fn undrain(&mut self) -> Option<Verb> {
        let (name, draining) = match (&self.data, self.selected_row()) {
            (Some(WatchUpdate::Member { member, .. }), _) => (member.name.clone(), member.draining),
            (_, Some(Row::Member(m))) => (m.name.clone(), m.draining),
            _ => return None,
        };
        if !draining {
            return self.refuse(&format!("member {name} is not draining"));
        }
        Some(Verb::Undrain(name))
    }

    /// `+`, `-` or `N` on a waiting task: a priority one higher or lower (within
    /// 0..=[`MAX_PRIORITY`]), or a scheduled task run now.
    fn reprioritize(&mut self, key: char) -> Option<Verb> {
        let (id, state, priority) = self.waiting_task()?;
        if !matches!(state, TaskState::Ready | TaskState::Scheduled) {
            return self.refuse("only a ready or scheduled task gets a new priority or runs now");
        }
        let verb = match key {
            'N' if state != TaskState::Scheduled => {
                return self.refuse("only a scheduled task waits to run");
            }
            'N' => Verb::RunNow(id),
            '+' if priority >= MAX_PRIORITY => {
                return self.refuse(&format!(
                    "task {id} has priority {MAX_PRIORITY}, the highest"
                ));
            }
            '-' if priority == 0 => {
                return self.refuse(&format!("task {id} has priority 0, the lowest"));
            }
            '+' => Verb::Priority {
                id,
                from: priority,
                to: priority + 1,
            },
            _ => Verb::Priority {
                id,
                from: priority,
                to: priority - 1,
            },
        };
        Some(verb)
    }

    /// Purge the selected queue's ready and scheduled tasks, if it has any.
    fn purge(&mut self) -> Option<Verb> {
        let q = self.selected_queue()?;
        let n = q.counts.ready + q.counts.scheduled;
        if n == 0 {
            return self.refuse(&format!("queue {} has no ready or scheduled tasks", q.name));
        }
        Some(Verb::Purge(q.name, n))
    }

    /// Redrive every dead task of a queue, `count` of them as its counts say.
    fn all_dead(&mut self, queue: String, count: u64) -> Option<Verb> {
        if count == 0 {
            return self.refuse(&format!("queue {queue} has no dead tasks"));
        }
        let tasks = DeadTasks {
            queue,
            ids: Vec::new(),
            all: true,
            count,
        };
        Some(Verb::Dead(DeadAction::Redrive, tasks))
    }

    /// The marked dead tasks (of one queue), or the selected one.
    fn marked_dead(&mut self) -> Option<DeadTasks> {
        if let Some(Row::Group(g)) = self.selected_row() {
            let [queue] = g.queues.as_slice() else {
                self.refuse(
                    "the error's tasks are in several queues: open it (enter) and mark one queue's",
                );
                return None;
            };
            return Some(DeadTasks {
                queue: queue.clone(),
                count: g.ids.len() as u64,
                ids: g.ids,
                all: false,
            });
        }
        let current = self.selected_task()?;
        let marked = &self.page().marked;
        let picked: Vec<TaskSummary> = if marked.is_empty() {
            vec![current]
        } else {
            self.rows()
                .into_iter()
                .filter_map(|r| match r {
                    Row::Task(t) if marked.contains(&t.id) => Some(t.clone()),
                    _ => None,
                })
                .collect()
        };
        let queue = picked.first()?.queue.clone();
        if picked.iter().any(|t| t.queue != queue) {
            self.refuse("marked tasks are in several queues: mark one queue's at a time");
            return None;
        }
        let ids: Vec<String> = picked.into_iter().map(|t| t.id).collect();
        Some(DeadTasks {
            queue,
            count: ids.len() as u64,
            ids,
            all: false,
        })
    }

    /// The task `+`, `-` and `N` act on: the one shown, or the selected row's; its id,
    /// state and priority.
    fn waiting_task(&self) -> Option<(String, TaskState, u8)> {
        match &self.data {
            Some(WatchUpdate::Task { task }) => Some((task.id.clone(), task.state, task.priority)),
            _ => self.selected_task().map(|t| (t.id, t.state, t.priority)),
        }
    }

    fn shown_state(&self) -> Option<(TaskState, String)> {
        match &self.data {
            Some(WatchUpdate::Task { task }) => Some((task.state, task.id.clone())),
            _ => None,
        }
    }

    /// The shown task's queue and id, if it is in `state`.
    fn shown_task(&mut self, state: TaskState) -> Option<(String, String)> {
        match &self.data {
            Some(WatchUpdate::Task { task }) if task.state == state => {
                Some((task.queue.clone(), task.id.clone()))
            }
            Some(WatchUpdate::Task { .. }) => {
                self.refuse(&format!("the task is not {}", state.as_str()));
                None
            }
            _ => None,
        }
    }

    /// The keys of the current screen: (key, what it does), its verbs first (unless
    /// read-only), then moving about, then what every screen has.
    pub fn keys(&self) -> Vec<(&'static str, &'static str)> {
        let mut keys: Vec<(&str, &str)> = Vec::new();
        // The way to the other tabs comes first: it is the only way to them.
        if matches!(self.page().screen, Screen::Queue { .. }) {
            keys.push(("tab ←→", "state"));
        }
        if !self.readonly {
            keys.extend(self.verb_keys());
        }
        match &self.page().screen {
            Screen::Queue { .. } | Screen::Dead => keys.push(("n", "newest first")),
            Screen::Members => keys.push(("n", "last seen first")),
            _ => {}
        }
        if self.is_dead_list() {
            keys.push(("E", "group by error"));
        }
        let list = [
            ("enter", "open"),
            ("↑↓ j/k", "move"),
            ("g G", "top, bottom"),
            ("[ ]", "page"),
            ("/", "search queue"),
            ("f", "filter page"),
            ("s S", "sort page, reverse"),
        ];
        match &self.page().screen {
            Screen::Task { .. } => keys.push(("↑↓ j/k", "scroll")),
            Screen::Member { .. } | Screen::Members => {
                keys.extend(list.into_iter().filter(|(k, _)| {
                    *k != "/" && (*k != "[ ]" || self.page().screen == Screen::Members)
                }))
            }
            // One page of nodes, nothing to open or search.
            Screen::Cluster => keys.extend(
                list.into_iter()
                    .filter(|(k, _)| !matches!(*k, "enter" | "[ ]" | "/")),
            ),
            _ => keys.extend(list),
        }
        match self.page().screen {
            Screen::Members | Screen::Member { .. } => {}
            Screen::Cluster => keys.push(("y", "copy address")),
            _ => keys.push(("y", "copy id")),
        }
        if matches!(self.page().screen, Screen::Task { .. }) {
            keys.push(("Y", "copy payload"));
            keys.push(("t", "times of day / ages"));
        }
        keys.extend([
            (":", "command"),
            ("esc", "back"),
            ("?", "help"),
            ("q", "quit"),
        ]);
        keys
    }

    /// The verb keys of the current screen, as the footer and the help list them.
    fn verb_keys(&self) -> Vec<(&'static str, &'static str)> {
        match &self.page().screen {
            Screen::Queues => vec![
                ("p", "pause/resume"),
                ("R", "redrive all dead"),
                ("P", "purge"),
                ("D", "delete queue"),
                ("a", "enqueue"),
                ("o", "options"),
            ],
            Screen::Queue { state, .. } => queue_verb_keys(*state),
            Screen::Task { .. } => self.task_verb_keys(),
            Screen::Members => vec![("d", "drain"), ("u", "undrain")],
            Screen::Member { .. } => vec![
                ("v", "revoke lease"),
                ("c", "cancel"),
                ("d", "drain"),
                ("u", "undrain"),
            ],
            Screen::Dead => DEAD_VERB_KEYS.to_vec(),
            // Membership changes are the CLI's (`muster cluster add`, `remove`).
            Screen::Cluster => Vec::new(),
            Screen::Found { .. } => vec![
                ("c", "cancel"),
                ("v", "revoke lease"),
                ("+ -", "priority"),
                ("N", "run now"),
            ],
        }
    }

    /// The verb keys of the task screen: those of the shown task's state.
    fn task_verb_keys(&self) -> Vec<(&'static str, &'static str)> {
        match &self.data {
            Some(WatchUpdate::Task { task }) if task.state == TaskState::Dead => {
                vec![
                    ("r", "redrive"),
                    ("x", "discard"),
                    ("e", "edit and requeue"),
                ]
            }
            Some(WatchUpdate::Task { task }) if task.state == TaskState::Leased => {
                vec![("c", "cancel"), ("v", "revoke lease")]
            }
            Some(WatchUpdate::Task { task }) if task.state == TaskState::Scheduled => {
                vec![("c", "cancel"), ("+ -", "priority"), ("N", "run now")]
            }
            Some(WatchUpdate::Task { task }) if is_live(task.state) => {
                vec![("c", "cancel"), ("+ -", "priority")]
            }
            _ => Vec::new(),
        }
    }
}

/// The verb keys of a list of dead tasks.
const DEAD_VERB_KEYS: [(&str, &str); 3] = [("r", "redrive"), ("x", "discard"), ("space", "mark")];

/// Whether a task in `state` can still be cancelled: it waits or is leased.
fn is_live(state: TaskState) -> bool {
    matches!(
        state,
        TaskState::Ready | TaskState::Scheduled | TaskState::Leased
    )
}

/// The verb keys of a queue's tab: those of its tasks' state, then the queue's.
fn queue_verb_keys(state: TaskState) -> Vec<(&'static str, &'static str)> {
    let mut keys = Vec::new();
    if state == TaskState::Dead {
        keys.extend(DEAD_VERB_KEYS);
    }
    if is_live(state) {
        keys.push(("c", "cancel"));
    }
    if state == TaskState::Leased {
        keys.push(("v", "revoke lease"));
    }
    if matches!(state, TaskState::Ready | TaskState::Scheduled) {
        keys.push(("+ -", "priority"));
    }
    if state == TaskState::Scheduled {
        keys.push(("N", "run now"));
    }
    keys.extend([
        ("R", "redrive all dead"),
        ("p", "pause/resume"),
        ("P", "purge"),
        ("a", "enqueue"),
        ("o", "options"),
    ]);
    keys
}

/// The dead-task verb of a key: `r` redrives, `x` discards.
fn dead_action(key: char) -> DeadAction {
    if key == 'r' {
        DeadAction::Redrive
    } else {
        DeadAction::Discard
    }
}
