//! The console's state, without a terminal or a network: the [`App`], its screens on a
//! navigation stack, what arrives from the loop, and the selection that the keys and
//! the renderer read.
//!
//! [`App::on_key`] is the only way keys change anything: the real loop and the tests
//! call it alike. It returns [`Effect`]s (watch a screen, run a verb) for the loop to
//! carry out; their results come back through [`App::on_watch`] and [`App::on_done`].
//!
//! The rest of `impl App` lives by job in sibling modules: `keys.rs` (what each key
//! does, `on_key` among them) and `verbs.rs` (the verb a key names, and the editor's
//! drafts). The rows of the list screens are `rows.rs`'s, the search language
//! `search.rs`'s, the rates and trends `trends.rs`'s.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use muster_protocol::model::{QueueInfo, TaskState, TaskSummary};
use muster_protocol::ops::{
    ClusterHello, FindCursor, ServerStatsReply, TaskFind, TaskFindReply, View, WatchReply,
    WatchUpdate,
};

use super::changes::{Draft, Verb};
use super::rows::{ClusterNodes, ClusterPoll, Row, error_groups};
pub use super::screen::{PAGE_ROWS, Screen};
use super::search::{Found, search_query};
use super::trends::{Rate, Trend, TrendSeries};

/// The states of the queue screen's tabs, in tab order.
pub const TABS: [TaskState; 7] = [
    TaskState::Ready,
    TaskState::Scheduled,
    TaskState::Leased,
    TaskState::Suspended,
    TaskState::Dead,
    TaskState::Done,
    TaskState::Cancelled,
];

/// A screen on the navigation stack, with where the operator is on it.
#[derive(Debug, Clone)]
pub struct Page {
    /// The screen.
    pub screen: Screen,
    /// The `after` cursors of the pages visited; the last is the current page's.
    pub(super) cursors: Vec<Option<String>>,
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
    pub(super) found_cursors: Vec<Option<FindCursor>>,
    /// A dead list's rows are grouped by error (`E`).
    pub grouped: bool,
}

impl Page {
    pub(super) fn new(screen: Screen) -> Page {
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
            Screen::Limits => View::Limits { after, limit },
            Screen::Schedules => View::Schedules { after, limit },
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

/// Whether the footer's message is good news or bad.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// It worked.
    Info,
    /// It did not.
    Error,
}

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
    pub(super) tag: u64,
    /// The current screen's data, once it arrived.
    pub data: Option<WatchUpdate>,
    /// What the keys do now.
    pub mode: Mode,
    /// The footer's message.
    pub message: Option<(Level, String)>,
    /// Wall-clock milliseconds, for ages; the loop sets it before each draw.
    pub now_ms: u64,
    pub(super) rates: HashMap<String, Rate>,
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
    pub(super) end_lookup: Option<u64>,
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

    pub(super) fn page_mut(&mut self) -> &mut Page {
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

    pub(super) fn open(&mut self, screen: Screen) -> Option<Effect> {
        self.stack.push(Page::new(screen));
        self.leave();
        self.rewatch()
    }

    /// Forgets what the screen being left showed. (Rates stay: totals only grow, so a
    /// span spent on other screens still averages right.)
    pub(super) fn leave(&mut self) {
        self.data = None;
        self.found = None;
        self.nodes = None;
    }

    /// Replaces everything above the queues page with `screen` (`:` commands).
    pub(super) fn jump(&mut self, screen: Screen) -> Option<Effect> {
        self.stack.truncate(1);
        if screen == Screen::Queues {
            self.leave();
            return self.rewatch();
        }
        self.open(screen)
    }

    pub(super) fn back(&mut self) -> Option<Effect> {
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

    /// A queue's last [`TREND_SECONDS`](super::trends::TREND_SECONDS) seconds, ending now.
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
    pub(super) fn sort(&mut self, reverse: bool) {
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
            Some(WatchUpdate::Limits { limits, .. }) => limits.iter().map(Row::Limit).collect(),
            Some(WatchUpdate::Schedules { schedules, .. }) => {
                schedules.iter().map(Row::Schedule).collect()
            }
            _ => Vec::new(),
        }
    }

    /// Whether the screen lists dead tasks (the dead letters, a queue's dead tab).
    pub(super) fn is_dead_list(&self) -> bool {
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
    pub(super) fn group(&mut self) {
        if !self.is_dead_list() {
            return;
        }
        let page = self.page_mut();
        page.grouped = !page.grouped;
        page.selected = 0;
        page.sort = None;
    }

    pub(super) fn next_cursor(&self) -> Option<String> {
        match &self.data {
            Some(
                WatchUpdate::Queues { next, .. }
                | WatchUpdate::Tasks { next, .. }
                | WatchUpdate::Dead { next, .. }
                | WatchUpdate::Members { next, .. }
                | WatchUpdate::Limits { next, .. }
                | WatchUpdate::Schedules { next, .. },
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
    pub(super) fn selection_on_a_row(&self) -> bool {
        let arrived = match self.page().screen {
            Screen::Task { .. } | Screen::Found { .. } => return true,
            Screen::Cluster => self.nodes.is_some(),
            _ => self.data.is_some(),
        };
        !arrived || self.page().selected < self.rows().len().max(1)
    }

    pub(super) fn selected_row(&self) -> Option<Row<'_>> {
        let i = self.page().selected;
        self.rows().into_iter().nth(i)
    }

    pub(super) fn selected_task(&self) -> Option<TaskSummary> {
        match self.selected_row() {
            Some(Row::Task(t)) => Some(t.clone()),
            _ => None,
        }
    }

    pub(super) fn selected_queue(&self) -> Option<QueueInfo> {
        match (&self.page().screen, &self.data, self.selected_row()) {
            (Screen::Queues, _, Some(Row::Queue(q))) => Some(q.clone()),
            (Screen::Queue { .. }, Some(WatchUpdate::Tasks { queue, .. }), _) => {
                Some(queue.clone())
            }
            _ => None,
        }
    }
}
