//! What each key does: [`App::on_key`] and the keys of each mode, the normal mode's
//! key table (`normal_key`), moving over rows, pages and tabs, and the keys the footer
//! and the help list for each screen.
//!
//! A key that names a verb gets it from `verbs.rs` (`App::verb`, which says whether it
//! applies to what is selected) and asks for its confirmation.

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use muster_protocol::model::TaskState;
use muster_protocol::ops::{TaskFind, TaskFindReply, WatchUpdate};

use super::app::{App, Effect, Level, Mode, PAGE_ROWS, Page, Screen, TABS};
use super::changes::Verb;
use super::rows::Row;
use super::search::search_query;
use super::verbs::is_live;

impl App {
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
            code => {
                if edit_line(&mut text, code) {
                    self.page_mut().filter = text.clone();
                }
                self.mode = Mode::Filter(text);
            }
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
            code => {
                edit_line(&mut text, code);
                self.mode = Mode::Search(text);
            }
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
            code => {
                edit_line(&mut text, code);
                self.mode = Mode::Command(text);
            }
        }
        Vec::new()
    }

    /// Completes the last word of a `:` command: the command, then a queue name (of
    /// the queues seen), then a state. Several candidates complete to what they share.
    fn complete(&self, text: &str) -> String {
        const COMMANDS: [&str; 9] = [
            "queues",
            "queue",
            "members",
            "dead",
            "limits",
            "schedules",
            "cluster",
            "task",
            "quit",
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
            (Some("limits"), None, None) => Screen::Limits,
            (Some("schedules"), None, None) => Screen::Schedules,
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
                        "unknown command {text:?}: try :queues, :members, :dead, :limits, :schedules, :cluster, :queue NAME [STATE], :task ID, :q"
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
            KeyCode::Char('A') if !self.readonly => return self.approve().into_iter().collect(),
            KeyCode::Char('a') if !self.readonly => {
                return self.draft_for_queue(false).into_iter().collect();
            }
            KeyCode::Char('o') if !self.readonly => {
                return self.draft_for_queue(true).into_iter().collect();
            }
            KeyCode::Char('Y') => return self.copy(true).into_iter().collect(),
            // Looking at the limits changes nothing: read-only consoles open them too.
            KeyCode::Char('L') if screen != Screen::Limits => self.open(Screen::Limits),
            // Nor does looking at the schedules (`C` for cron).
            KeyCode::Char('C') if screen != Screen::Schedules => self.open(Screen::Schedules),
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
    pub(super) fn on_end(&mut self, reply: Result<TaskFindReply, String>) -> Option<Effect> {
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

    /// `y` copies the selected task's id (or the queue's or member's name), `Y` the
    /// shown task's payload.
    fn copy(&mut self, payload: bool) -> Option<Effect> {
        let (text, what) = match (&self.data, payload) {
            (Some(WatchUpdate::Task { task, .. }), true) => (
                task.payload.get().to_owned(),
                format!("the payload of {}", task.id),
            ),
            (Some(WatchUpdate::Task { task, .. }), false) => (task.id.clone(), task.id.clone()),
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
            Screen::Task { .. }
            | Screen::Members
            | Screen::Member { .. }
            | Screen::Cluster
            | Screen::Limits
            | Screen::Schedules => None,
        }
    }

    fn step(&mut self, by: isize) -> Option<Effect> {
        if let Some(WatchUpdate::Task {
            task,
            output,
            tree,
            tree_truncated,
        }) = &self.data
        {
            let extras = super::detail::TaskExtras {
                output,
                tree,
                truncated: *tree_truncated,
            };
            let last = super::detail::task_lines(task, extras, self.now_ms, self.absolute_times)
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
            (Screen::Schedules, Row::Schedule(s)) => match &s.last_task {
                Some(id) => Screen::Task { id: id.clone() },
                None => {
                    let why = format!("schedule {} has enqueued no task yet", s.name);
                    self.message = Some((Level::Error, why));
                    return None;
                }
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
            // The selected limit's keys show below the list: nothing to open or search.
            Screen::Limits => keys.extend(
                list.into_iter()
                    .filter(|(k, _)| !matches!(*k, "enter" | "/")),
            ),
            // The selected schedule's task shows below the list; enter opens the last
            // task it enqueued.
            Screen::Schedules => {
                keys.push(("enter", "last task"));
                keys.extend(
                    list.into_iter()
                        .filter(|(k, _)| !matches!(*k, "enter" | "/")),
                );
            }
            _ => keys.extend(list),
        }
        match self.page().screen {
            Screen::Members | Screen::Member { .. } => {}
            Screen::Cluster => keys.push(("y", "copy address")),
            Screen::Limits | Screen::Schedules => keys.push(("y", "copy name")),
            _ => keys.push(("y", "copy id")),
        }
        if matches!(self.page().screen, Screen::Task { .. }) {
            keys.push(("Y", "copy payload"));
            keys.push(("t", "times of day / ages"));
        }
        if self.page().screen != Screen::Limits {
            keys.push(("L", "limits"));
        }
        if self.page().screen != Screen::Schedules {
            keys.push(("C", "schedules"));
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
            // Membership changes are the CLI's (`muster cluster add`, `remove`); so are
            // limits' (`muster limit set`, `delete`).
            Screen::Cluster | Screen::Limits => Vec::new(),
            // Creating and changing one is the CLI's (`muster schedule set`).
            Screen::Schedules => vec![
                ("p", "pause/resume"),
                ("N", "run now"),
                ("D", "delete schedule"),
            ],
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
            Some(WatchUpdate::Task { task, .. }) if task.state == TaskState::Dead => {
                vec![
                    ("r", "redrive"),
                    ("x", "discard"),
                    ("e", "edit and requeue"),
                ]
            }
            Some(WatchUpdate::Task { task, .. }) if task.state == TaskState::Leased => {
                vec![("c", "cancel"), ("v", "revoke lease")]
            }
            Some(WatchUpdate::Task { task, .. }) if task.state == TaskState::Scheduled => {
                vec![("c", "cancel"), ("+ -", "priority"), ("N", "run now")]
            }
            Some(WatchUpdate::Task { task, .. }) if task.state == TaskState::Suspended => {
                SUSPENDED_VERB_KEYS.to_vec()
            }
            Some(WatchUpdate::Task { task, .. }) if is_live(task.state) => {
                vec![("c", "cancel"), ("+ -", "priority")]
            }
            _ => Vec::new(),
        }
    }
}

/// The verb keys of suspended tasks: approve (resume with data) or reject (cancel).
const SUSPENDED_VERB_KEYS: [(&str, &str); 2] = [("A", "approve"), ("c", "reject")];

/// The verb keys of a list of dead tasks.
const DEAD_VERB_KEYS: [(&str, &str); 3] = [("r", "redrive"), ("x", "discard"), ("space", "mark")];

/// The verb keys of a queue's tab: those of its tasks' state, then the queue's.
fn queue_verb_keys(state: TaskState) -> Vec<(&'static str, &'static str)> {
    let mut keys = Vec::new();
    if state == TaskState::Dead {
        keys.extend(DEAD_VERB_KEYS);
    }
    if state == TaskState::Suspended {
        keys.extend(SUSPENDED_VERB_KEYS);
    } else if is_live(state) {
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

/// A key typed into a line of text (the filter, a search, a command): backspace drops
/// the last character, a character is added. Whether it was one of those two.
fn edit_line(text: &mut String, code: KeyCode) -> bool {
    match code {
        KeyCode::Backspace => {
            text.pop();
            true
        }
        KeyCode::Char(c) => {
            text.push(c);
            true
        }
        _ => false,
    }
}
