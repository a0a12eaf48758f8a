//! Drawing the console: a pure function of the [`App`].

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style, Stylize};
use ratatui::text::{Line, Span, Text};
use ratatui::widgets::{
    Block, Borders, Cell, Clear, HighlightSpacing, Paragraph, RenderDirection, Row as TableRow,
    Sparkline, Table, TableState, Tabs, Wrap,
};

use muster_protocol::model::{
    LimitInfo, MemberInfo, MemberState, QueueInfo, ScheduleInfo, TaskInfo, TaskState, TaskSummary,
};
use muster_protocol::ops::WatchUpdate;

use super::app::{App, Level, Mode, Screen, TABS};
use super::detail::{
    ago, holder, list_or_dash, one_line, schedule_facts, short, task_lines, until,
};
use super::meters::{self, Gauge, Measure};
use super::rows::{ClusterNodes, NodeRow, Row, TaskColumn, task_columns};
use super::trends::TrendSeries;

/// Draws the whole console.
pub fn render(app: &App, frame: &mut Frame) {
    let [title, main, message, keys] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Min(3),
        Constraint::Length(1),
        Constraint::Length(1),
    ])
    .areas(frame.area());
    render_title(app, frame, title);
    match app.page().screen {
        Screen::Found { .. } => render_found(app, frame, main),
        Screen::Cluster => render_cluster(app, frame, main),
        _ => render_data(app, frame, main),
    }
    render_message(app, frame, message);
    render_keys(app, frame, keys);
    match &app.mode {
        Mode::Help => render_help(app, frame),
        Mode::Confirm(verb) => render_confirm(&verb.question(), frame),
        _ => {}
    }
}

/// A search's results: newest first, with how far the search got.
fn render_found(app: &App, frame: &mut Frame, area: Rect) {
    let block = Block::bordered().title(screen_title(app));
    let Some(found) = &app.found else {
        frame.render_widget(Paragraph::new("searching…").block(block), area);
        return;
    };
    let progress = match (&found.next, found.more) {
        (None, _) => format!(
            " {} found · {} examined, all ",
            found.tasks.len(),
            found.scanned
        ),
        (Some(_), true) => format!(
            " {} found · {} examined · ] for more ",
            found.tasks.len(),
            found.scanned
        ),
        (Some(_), false) => format!(
            " {} found · {} examined · searching… ",
            found.tasks.len(),
            found.scanned
        ),
    };
    let block = block.title_bottom(progress);
    if app.rows().is_empty() {
        let what = if found.next.is_none() {
            "no task matches"
        } else {
            "no match yet"
        };
        frame.render_widget(Paragraph::new(nothing(app, what)).block(block), area);
        return;
    }
    task_table(app, &screen_columns(app), block, frame, area);
}

/// The cluster: a row per node, each as it last answered the console, with what the
/// connected node's answer says of the cluster above; on a single daemon, that it is
/// not clustered.
fn render_cluster(app: &App, frame: &mut Frame, area: Rect) {
    let block = Block::bordered().title(screen_title(app));
    let Some(nodes) = app.nodes.as_ref().filter(|_| app.cluster.is_some()) else {
        let text = Paragraph::new(cluster_placeholder(app))
            .wrap(Wrap { trim: true })
            .block(block);
        return frame.render_widget(text, area);
    };
    let all = nodes.rows();
    let answered = all.iter().filter(|n| n.error.is_none()).count();
    let block = block.title_bottom(format!(
        " {answered} of {} nodes answered · asked every second ",
        all.len()
    ));
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let failed: Vec<&NodeRow> = all.iter().filter(|n| n.error.is_some()).collect();
    let facts = cluster_facts(nodes);
    let [info, list, errors] = Layout::vertical([
        Constraint::Length(u16::try_from(facts.len()).unwrap_or(2)),
        Constraint::Min(1),
        Constraint::Length(u16::try_from(failed.len().min(4)).unwrap_or(4)),
    ])
    .areas(inner);
    frame.render_widget(Paragraph::new(facts), info);
    render_nodes(app, frame, list);
    frame.render_widget(Paragraph::new(node_errors(&failed, errors.width)), errors);
}

/// What the cluster screen says without nodes to show: that the daemon is not
/// clustered, why the screen cannot be shown, or that the nodes are being asked.
fn cluster_placeholder(app: &App) -> Line<'static> {
    if app.cluster.is_none() {
        return Line::raw(format!(
            "not clustered: musterd at {} runs as a single daemon, not as a node of a cluster (musterd --cluster-id …: README, \"Running a cluster\")",
            app.addr
        ));
    }
    match &app.load_error {
        Some(e) => Line::from(Span::styled(
            format!("cannot show this screen: {e}"),
            Style::new().fg(Color::Red),
        )),
        None => Line::raw("asking every node…"),
    }
}

/// The table of the cluster's nodes, a row each, in `area`.
fn render_nodes(app: &App, frame: &mut Frame, area: Rect) {
    // Packed on the left: a wide terminal leaves the room at the right.
    let widths = [
        Constraint::Length(4),
        Constraint::Max(24),
        Constraint::Length(9),
        Constraint::Length(5),
        Constraint::Length(7),
        Constraint::Length(7),
        Constraint::Length(5),
        Constraint::Length(7),
        Constraint::Length(8),
    ];
    let addr_width = column_widths(area, &widths)[1];
    let rows = app
        .rows()
        .into_iter()
        .filter_map(|r| match r {
            Row::Node(n) => Some(n),
            _ => None,
        })
        .map(|n| node_row(&n, app.now_ms, addr_width))
        .collect::<Vec<_>>();
    if rows.is_empty() {
        frame.render_widget(Paragraph::new(nothing(app, "no nodes")), area);
    } else {
        let head = header(&[
            "NODE", "ADDRESS", "ROLE", "TERM", "LOG", "APPLIED", "LAG", "CONTACT", "SNAPSHOT",
        ]);
        table(app, rows, &widths, head, Block::new(), frame, area);
    }
}

/// A node's row of the cluster table, its role coloured; a node that did not answer
/// shows what it said last, in red.
fn node_row(n: &NodeRow, now: u64, addr_width: u16) -> TableRow<'static> {
    let or_dash = |v: Option<u64>| v.map_or("-".to_owned(), index);
    let role = Cell::from(n.role.clone());
    let role = match n.role.as_str() {
        "leader" => role.fg(Color::Green).bold(),
        "candidate" => role.fg(Color::Yellow),
        "shutdown" => role.fg(Color::Red),
        _ => role,
    };
    let contact = Cell::from(n.heard_ms.map_or("never".into(), |at| ago(now, at)));
    let row = TableRow::new(vec![
        Cell::from(n.id.clone()),
        Cell::from(fit(&n.addr, addr_width)),
        role,
        Cell::from(or_dash(n.term)),
        Cell::from(or_dash(n.last_log)),
        Cell::from(or_dash(n.applied)),
        Cell::from(or_dash(n.lag)),
        contact,
        Cell::from(or_dash(n.snapshot)),
    ]);
    if n.error.is_some() {
        row.fg(Color::Red)
    } else {
        row
    }
}

/// A red line per node that did not answer, saying why, fitted to `width`.
fn node_errors(failed: &[&NodeRow], width: u16) -> Vec<Line<'static>> {
    failed
        .iter()
        .map(|n| {
            let why = format!(
                "node {} ({}) did not answer: {}",
                n.node,
                n.addr,
                one_line(n.error.as_deref().unwrap_or_default())
            );
            Line::from(Span::styled(fit(&why, width), Style::new().fg(Color::Red)))
        })
        .collect()
}

/// The cluster as the connected node's answer has it: its id, the leader and the term,
/// the voters and learners; and on a line of its own, whose view it is when that node
/// does not lead.
fn cluster_facts(nodes: &ClusterNodes) -> Vec<Line<'static>> {
    let c = &nodes.local;
    let voters = c.members.iter().filter(|m| m.voter).count();
    let learners = c.members.len() - voters;
    let plural = |n: usize, one: &str| {
        if n == 1 {
            format!("1 {one}")
        } else {
            format!("{n} {one}s")
        }
    };
    let leader = match c.leader {
        Some(node) => Span::raw(format!("leader node {node}")),
        None => Span::styled("no leader (an election)", Style::new().fg(Color::Red)),
    };
    let mut lines = vec![Line::from(vec![
        Span::raw(format!("cluster {} · ", c.cluster_id)),
        leader,
        Span::raw(format!(
            " · term {} · {}, {}",
            c.term,
            plural(voters, "voter"),
            plural(learners, "learner")
        )),
    ])];
    if c.role != "leader" {
        lines.push(Line::from(Span::styled(
            format!(
                "as node {} ({}) sees it: the lag is the leader's to know",
                c.node, c.role
            ),
            Style::new().fg(Color::Yellow),
        )));
    }
    lines
}

/// A log position in a column of 7: exact up to 9,999,999, abbreviated beyond.
fn index(n: u64) -> String {
    if n < 10_000_000 {
        n.to_string()
    } else {
        count(n)
    }
}

fn render_data(app: &App, frame: &mut Frame, main: Rect) {
    match &app.data {
        None => {
            let text = match &app.load_error {
                Some(e) => Line::from(Span::styled(
                    format!("cannot show this screen: {e}"),
                    Style::new().fg(Color::Red),
                )),
                None => Line::raw("loading…"),
            };
            frame.render_widget(
                Paragraph::new(text)
                    .wrap(Wrap { trim: true })
                    .block(Block::bordered().title(screen_title(app))),
                main,
            )
        }
        Some(data) => render_screen(app, data, frame, main),
    }
}

fn render_title(app: &App, frame: &mut Frame, area: Rect) {
    let mut spans = vec![
        Span::styled(" muster ", Style::new().bold().reversed()),
        Span::raw(format!(" {} ", app.addr)),
    ];
    if !app.server.is_empty() {
        spans.push(Span::styled(
            format!(" {} ", app.server),
            Style::new().fg(Color::DarkGray),
        ));
    }
    if let Some(c) = &app.cluster {
        let leader = match c.leader {
            Some(node) => format!(" leader: node {node}, term {} ", c.term),
            None => format!(" no leader, term {} ", c.term),
        };
        spans.push(Span::styled(leader, Style::new().fg(Color::DarkGray)));
    }
    if let Some(f) = &app.facts {
        spans.push(Span::styled(
            format!(
                " up {} · {} members · fsync {} ",
                short(f.uptime_ms),
                f.members,
                micros(f.fsync_us)
            ),
            Style::new().fg(Color::DarkGray),
        ));
    }
    if app.readonly {
        spans.push(Span::styled(" read-only ", Style::new().fg(Color::Yellow)));
    }
    if app.disk_alarm {
        let style = Style::new().fg(Color::Red).bold().reversed();
        spans.push(Span::styled(" disk alarm: enqueues refused ", style));
    }
    if !app.connected {
        let style = Style::new().fg(Color::Red).bold().reversed();
        spans.push(Span::styled(
            " disconnected: what is shown may be stale ",
            style,
        ));
    }
    frame.render_widget(Line::from(spans), area);
}

fn screen_title(app: &App) -> String {
    let page = app.page();
    let mut title = match &page.screen {
        Screen::Queues => " Queues ".to_owned(),
        Screen::Queue { name, .. } => format!(" Queue {name} "),
        Screen::Task { id } => format!(" Task {id} "),
        Screen::Members => " Members ".to_owned(),
        Screen::Member { name } => format!(" Member {name} "),
        Screen::Dead => " Dead letters ".to_owned(),
        Screen::Found { queue, query } => format!(
            " Search {} for {} ",
            queue.as_deref().unwrap_or("every queue"),
            one_line(query)
        ),
        Screen::Cluster => " Cluster ".to_owned(),
        Screen::Limits => " Limits ".to_owned(),
        Screen::Schedules => " Schedules ".to_owned(),
    };
    if page.number() > 1 {
        title.push_str(&format!("· page {} ", page.number()));
    }
    if page.grouped {
        title.push_str("· by error ");
    }
    if !page.filter.is_empty() {
        title.push_str(&format!("· filter {} ", page.filter));
    }
    if let Some((column, descending)) = app.sorted_by() {
        let arrow = if descending { "↓" } else { "↑" };
        title.push_str(&format!("· by {column} {arrow} "));
    }
    if !page.marked.is_empty() {
        title.push_str(&format!("· {} marked ", page.marked.len()));
    }
    title
}

fn render_screen(app: &App, data: &WatchUpdate, frame: &mut Frame, area: Rect) {
    let block = Block::bordered().title(screen_title(app));
    match data {
        WatchUpdate::Queues { .. } => render_queues(app, block, frame, area),
        WatchUpdate::Tasks { queue, state, .. } => {
            render_queue(app, queue, *state, block, frame, area)
        }
        WatchUpdate::Dead { total, .. } => render_dead(app, *total, block, frame, area),
        WatchUpdate::Task {
            task,
            output,
            tree,
            tree_truncated,
        } => {
            let extras = super::detail::TaskExtras {
                output,
                tree,
                truncated: *tree_truncated,
            };
            render_task(app, task, extras, block, frame, area)
        }
        WatchUpdate::Member { member, .. } => render_member(app, member, block, frame, area),
        WatchUpdate::Members { connected, .. } => {
            render_members(app, *connected, block, frame, area)
        }
        WatchUpdate::Limits { .. } => render_limits(app, block, frame, area),
        WatchUpdate::Schedules { .. } => render_schedules(app, block, frame, area),
        WatchUpdate::Gone { error } => {
            frame.render_widget(Paragraph::new(error.message.clone()).block(block), area)
        }
    }
}

fn header(cells: &[&'static str]) -> TableRow<'static> {
    TableRow::new(cells.iter().copied()).style(Style::new().add_modifier(Modifier::BOLD))
}

fn table<'a>(
    app: &App,
    rows: Vec<TableRow<'a>>,
    widths: &[Constraint],
    head: TableRow<'a>,
    block: Block<'a>,
    frame: &mut Frame,
    area: Rect,
) {
    let empty = rows.is_empty();
    let table = Table::new(rows, widths.to_vec())
        .header(head)
        .block(block)
        .row_highlight_style(Style::new().reversed())
        .highlight_symbol("›")
        .highlight_spacing(HighlightSpacing::Always);
    let mut state = TableState::default().with_selected((!empty).then_some(app.page().selected));
    frame.render_stateful_widget(table, area, &mut state);
}

/// The columns of the queues screen.
const QUEUES_WIDTHS: [Constraint; 11] = [
    Constraint::Min(8),
    Constraint::Length(6),
    Constraint::Length(6),
    Constraint::Length(6),
    Constraint::Length(6),
    Constraint::Length(6),
    Constraint::Length(4),
    Constraint::Length(6),
    Constraint::Length(5),
    Constraint::Length(5),
    Constraint::Length(6),
];

/// Width of a trend column of the queues screen: 120 s in 15 bars of 8 s.
const TREND_WIDTH: u16 = 15;

/// The trends the queues screen has room for in a terminal this wide (borders
/// included, as README counts): the ready count's from 120 columns, enqueues' and acks'
/// too from 160; none narrower.
fn queue_trends(width: u16) -> &'static [Trend] {
    match width {
        160.. => &[Trend::In, Trend::Out, Trend::Ready],
        120..160 => &[Trend::Ready],
        _ => &[],
    }
}

/// A trend graph of a queue.
#[derive(Debug, Clone, Copy)]
enum Trend {
    /// Tasks enqueued a second.
    In,
    /// Tasks acked a second.
    Out,
    /// Ready tasks.
    Ready,
}

impl Trend {
    fn title(self) -> &'static str {
        match self {
            Trend::In => "IN 2m",
            Trend::Out => "OUT 2m",
            Trend::Ready => "READY 2m",
        }
    }

    fn values(self, series: &TrendSeries) -> &[Option<u64>] {
        match self {
            Trend::In => &series.enqueued,
            Trend::Out => &series.acked,
            Trend::Ready => &series.ready,
        }
    }
}

fn render_queues(app: &App, block: Block<'_>, frame: &mut Frame, area: Rect) {
    let trends = queue_trends(area.width);
    let mut widths = QUEUES_WIDTHS.to_vec();
    widths.extend(trends.iter().map(|_| Constraint::Length(TREND_WIDTH)));
    let name_width = column_widths(block.inner(area), &widths)[0];
    let rows =
        app.rows()
            .into_iter()
            .filter_map(|r| match r {
                Row::Queue(q) => Some(q),
                _ => None,
            })
            .map(|q| {
                let (rate_in, rate_out) = app.rate(&q.name);
                let dead = Cell::from(count(q.counts.dead));
                let mut cells = vec![
                    Cell::from(fit(&q.name, name_width)),
                    Cell::from(count(q.counts.ready)),
                    Cell::from(count(q.counts.scheduled)),
                    Cell::from(count(q.counts.leased)),
                    if q.counts.dead > 0 {
                        dead.fg(Color::Red)
                    } else {
                        dead
                    },
                    Cell::from(count(q.counts.done)),
                    Cell::from(count(q.consumers)),
                    Cell::from(
                        q.oldest_ready_ms
                            .map_or("-".into(), |at| ago(app.now_ms, at)),
                    ),
                    Cell::from(format!("{rate_in:.1}")),
                    Cell::from(format!("{rate_out:.1}")),
                    queue_state(q),
                ];
                if !trends.is_empty() {
                    let series = app.trend(&q.name);
                    cells.extend(trends.iter().map(|t| {
                        Cell::from(spark(t.values(&series), TREND_WIDTH)).fg(Color::Cyan)
                    }));
                }
                TableRow::new(cells)
            })
            .collect();
    let mut titles = vec![
        "QUEUE", "READY", "SCHED", "LEASED", "DEAD", "DONE", "CONS", "OLDEST", "IN/s", "OUT/s",
        "STATE",
    ];
    titles.extend(trends.iter().map(|t| t.title()));
    table(app, rows, &widths, header(&titles), block, frame, area);
}

/// A queue's state at a glance: paused, stuck (ready tasks no connected member can
/// take), or active.
fn queue_state(q: &QueueInfo) -> Cell<'static> {
    if q.options.paused {
        Cell::from("paused").fg(Color::Yellow)
    } else if q.unclaimable > 0 || stuck_for_want_of_consumers(q) {
        Cell::from("stuck").fg(Color::Red)
    } else {
        Cell::from("active")
    }
}

/// Ready work (not held back by its key) and nobody to take it: no subscribed session
/// that is connected and not draining, no claim waiting.
fn stuck_for_want_of_consumers(q: &QueueInfo) -> bool {
    q.counts.ready > q.held_back && q.consumers == 0
}

/// A count in at most 5 characters: `2002`, `51.2k`, `100k`, `1.3M`, never cut.
pub fn count(n: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1_000_000_000, "G"), (1_000_000, "M"), (1_000, "k")];
    if n < 10_000 {
        return n.to_string();
    }
    let (size, unit) = UNITS
        .into_iter()
        .find(|(size, _)| n >= *size)
        .expect("n >= 10,000 has a unit");
    let value = n as f64 / size as f64;
    if value < 99.95 {
        format!("{value:.1}{unit}")
    } else {
        format!("{value:.0}{unit}")
    }
}

/// `text` cut to `width` columns with an ellipsis where it was cut.
pub fn fit(text: &str, width: u16) -> String {
    use unicode_width::UnicodeWidthStr;
    let width = usize::from(width);
    if text.width() <= width {
        return text.to_owned();
    }
    let mut out = String::new();
    let mut used = 0;
    for c in text.chars() {
        let w = unicode_width::UnicodeWidthChar::width(c).unwrap_or(0);
        if used + w + 1 > width {
            break;
        }
        used += w;
        out.push(c);
    }
    out.push('…');
    out
}

/// The widths a table with these constraints gives its columns inside `inner` (as
/// ratatui lays them out: one column of spacing, and the highlight symbol's column).
fn column_widths(inner: Rect, constraints: &[Constraint]) -> Vec<u16> {
    let area = Rect {
        width: inner.width.saturating_sub(1),
        ..inner
    };
    Layout::horizontal(constraints.iter().copied())
        .spacing(1)
        .split(area)
        .iter()
        .map(|r| r.width)
        .collect()
}

/// What an empty list says: nothing there, or nothing that passes the filter.
fn nothing(app: &App, what: &str) -> String {
    let filter = &app.page().filter;
    if filter.is_empty() || app.all_rows().is_empty() {
        what.to_owned()
    } else {
        format!("no row of this page matches /{filter}")
    }
}

/// A queue's screen: its tabs (a state each, with its count), a line of facts, its
/// trends when there is room, and the tasks of the tab's state.
fn render_queue(
    app: &App,
    q: &QueueInfo,
    state: TaskState,
    block: Block<'_>,
    frame: &mut Frame,
    area: Rect,
) {
    let inner = block.inner(area);
    frame.render_widget(block, area);
    // Trends take three rows where the list keeps at least 20.
    let trend_rows = if inner.height >= 26 { 3 } else { 0 };
    let [tabs, info, trends, list] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(1),
        Constraint::Length(trend_rows),
        Constraint::Min(1),
    ])
    .areas(inner);
    if trend_rows > 0 {
        render_trends(app, &q.name, frame, trends);
    }
    frame.render_widget(queue_tabs(q, state, tabs.width), tabs);
    frame.render_widget(queue_facts(app, q), info);
    if app.rows().is_empty() {
        let what = format!("no {} tasks", state.as_str());
        frame.render_widget(Paragraph::new(nothing(app, &what)), list);
        return;
    }
    if app.page().grouped {
        return group_table(app, Block::new(), frame, list);
    }
    task_table(app, &screen_columns(app), Block::new(), frame, list);
}

/// A queue's tabs, a state each with its count, the tab of `state` selected; the
/// dividers narrow to one column when `width` is too small for spaced ones.
fn queue_tabs(q: &QueueInfo, state: TaskState, width: u16) -> Tabs<'static> {
    let titles: Vec<String> = TABS
        .iter()
        .map(|s| format!("{} {}", s.as_str(), count(q.counts.get(*s))))
        .collect();
    let text: usize = titles.iter().map(|t| t.chars().count()).sum();
    let divider = if text + 3 * (titles.len() - 1) <= usize::from(width) {
        " │ "
    } else {
        "│"
    };
    let selected = TABS.iter().position(|s| *s == state).unwrap_or(0);
    Tabs::new(titles)
        .select(selected)
        .highlight_style(Style::new().reversed())
        .padding("", "")
        .divider(divider)
}

/// A queue's line of facts: paused or active, its rates and consumers, and (when
/// there is something to say) why its work is stuck, its oldest ready task, the tasks
/// held back and those no member can claim.
fn queue_facts(app: &App, q: &QueueInfo) -> Line<'static> {
    let (rate_in, rate_out) = app.rate(&q.name);
    let mut facts = vec![if q.options.paused {
        Span::styled("paused", Style::new().fg(Color::Yellow).bold())
    } else {
        Span::raw("active")
    }];
    facts.push(Span::raw(format!(
        " · in {rate_in:.1}/s out {rate_out:.1}/s · {} consumers",
        q.consumers
    )));
    if !q.options.paused && stuck_for_want_of_consumers(q) {
        facts.push(Span::styled(
            " · stuck: ready work and no consumer (no subscribed session, no waiting claim)",
            Style::new().fg(Color::Red),
        ));
    }
    if let Some(at) = q.oldest_ready_ms {
        facts.push(Span::raw(format!(
            " · oldest ready {}",
            ago(app.now_ms, at)
        )));
    }
    if q.held_back > 0 {
        facts.push(Span::raw(format!(" · held back {}", q.held_back)));
    }
    if q.waiting_on_limits > 0 {
        facts.push(Span::raw(format!(
            " · waiting on limits {}",
            q.waiting_on_limits
        )));
    }
    if q.unclaimable > 0 {
        let sets: Vec<String> = q.unclaimable_requires.iter().map(|s| s.join("+")).collect();
        facts.push(Span::styled(
            format!(" · unclaimable {} ({})", q.unclaimable, sets.join(", ")),
            Style::new().fg(Color::Red),
        ));
    }
    Line::from(facts)
}

/// A dead list grouped by error: how many died of each, in which queues, the last when.
fn group_table(app: &App, block: Block<'_>, frame: &mut Frame, area: Rect) {
    let widths = [
        Constraint::Length(6),
        Constraint::Length(16),
        Constraint::Length(6),
        Constraint::Min(10),
    ];
    let fitted = column_widths(block.inner(area), &widths);
    let rows = app
        .rows()
        .into_iter()
        .filter_map(|r| match r {
            Row::Group(g) => Some(g),
            _ => None,
        })
        .map(|g| {
            TableRow::new(vec![
                Cell::from(count(g.ids.len() as u64)),
                Cell::from(fit(&g.queues.join(","), fitted[1])),
                Cell::from(ago(app.now_ms, g.last_died_ms)),
                Cell::from(fit(&g.error, fitted[3])).fg(Color::Red),
            ])
        })
        .collect();
    let head = header(&["COUNT", "QUEUES", "LAST", "ERROR"]);
    table(app, rows, &widths, head, block, frame, area);
}

/// A queue's last two minutes, one bar a second, newest at the right: enqueued and acked
/// a second and the ready count, each scaled to its own highest (named on its left).
fn render_trends(app: &App, queue: &str, frame: &mut Frame, area: Rect) {
    let series = app.trend(queue);
    let rows = Layout::vertical([Constraint::Length(1); 3]).split(area);
    for (row, (name, values, color)) in rows.iter().zip([
        ("in/s", &series.enqueued, Color::Green),
        ("out/s", &series.acked, Color::Cyan),
        ("ready", &series.ready, Color::Yellow),
    ]) {
        let [label, graph] =
            Layout::horizontal([Constraint::Length(16), Constraint::Min(1)]).areas(*row);
        let top = values.iter().flatten().copied().max().unwrap_or(0);
        frame.render_widget(Line::raw(format!("{name:<6} max {:>5}", count(top))), label);
        // Newest first from the right edge: the oldest seconds are what a narrow
        // terminal leaves out.
        frame.render_widget(
            Sparkline::default()
                .data(values.iter().rev())
                .direction(RenderDirection::RightToLeft)
                .max(top.max(1))
                .absent_value_symbol(" ")
                .style(Style::new().fg(color)),
            graph,
        );
    }
}

fn render_dead(app: &App, total: u64, block: Block<'_>, frame: &mut Frame, area: Rect) {
    let block = block.title_bottom(format!(" {total} dead "));
    if app.rows().is_empty() {
        frame.render_widget(
            Paragraph::new(nothing(app, "no dead tasks")).block(block),
            area,
        );
        return;
    }
    if app.page().grouped {
        return group_table(app, block, frame, area);
    }
    task_table(app, &screen_columns(app), block, frame, area);
}

/// A column of a task table: its title, its width and what a task shows in it.
struct Column {
    title: &'static str,
    width: Constraint,
    cell: fn(&TaskSummary, u64) -> String,
}

const PRIORITY: Column = Column {
    title: "PRI",
    width: Constraint::Length(4),
    cell: |t, _| t.priority.to_string(),
};
const KEY: Column = Column {
    title: "KEY",
    width: Constraint::Min(6),
    cell: |t, _| t.key.clone().unwrap_or_else(|| "-".into()),
};
const ATTEMPTS: Column = Column {
    title: "ATT",
    width: Constraint::Length(4),
    cell: |t, _| t.deliveries.to_string(),
};
const FAILURES: Column = Column {
    title: "FAIL",
    width: Constraint::Length(5),
    cell: |t, _| t.failures.to_string(),
};
const AGE: Column = Column {
    title: "AGE",
    width: Constraint::Length(6),
    cell: |t, now| ago(now, t.updated_ms),
};
const DUE: Column = Column {
    title: "DUE",
    width: Constraint::Length(8),
    cell: |t, now| t.not_before_ms.map_or("-".into(), |at| until(now, at)),
};
const HOLDER: Column = Column {
    title: "HOLDER",
    width: Constraint::Min(10),
    cell: |t, _| t.lease.as_ref().map_or("-".into(), |l| holder(&l.member)),
};
const EXPIRES: Column = Column {
    title: "EXPIRES",
    width: Constraint::Length(8),
    cell: |t, now| {
        t.lease
            .as_ref()
            .map_or("-".into(), |l| until(now, l.expires_ms))
    },
};
const REASON: Column = Column {
    title: "REASON",
    width: Constraint::Length(13),
    cell: |t, _| t.dead_reason.clone().unwrap_or_default(),
};
const ERROR: Column = Column {
    title: "ERROR",
    width: Constraint::Min(8),
    cell: |t, _| one_line(t.last_error.as_deref().unwrap_or("")),
};
const STATE: Column = Column {
    title: "STATE",
    width: Constraint::Length(9),
    cell: |t, _| t.state.as_str().to_owned(),
};
const DIED: Column = Column {
    title: "DIED",
    width: Constraint::Length(6),
    cell: |t, now| ago(now, t.updated_ms),
};
const RUNNING: Column = Column {
    title: "RUNNING",
    width: Constraint::Length(8),
    cell: |t, now| ago(now, t.updated_ms),
};
const PROGRESS: Column = Column {
    title: "PROGRESS",
    width: Constraint::Min(8),
    cell: |t, _| t.progress.clone().unwrap_or_else(|| "-".into()),
};
const ASKS: Column = Column {
    title: "ASKS",
    width: Constraint::Min(12),
    cell: |t, _| {
        t.suspension
            .as_ref()
            .map_or("-".into(), |s| s.reason.clone())
    },
};
const TIMES_OUT: Column = Column {
    title: "TIMES OUT",
    width: Constraint::Length(9),
    cell: |t, now| {
        t.suspension
            .as_ref()
            .map_or("-".into(), |s| until(now, s.timeout_at_ms))
    },
};
const QUEUE: Column = Column {
    title: "QUEUE",
    width: Constraint::Length(10),
    cell: |t, _| t.queue.clone(),
};

/// The columns of the current screen's task table, after the id: those `s` sorts by.
fn screen_columns(app: &App) -> Vec<Column> {
    task_columns(&app.page().screen)
        .iter()
        .map(|c| match c {
            TaskColumn::Id => unreachable!("the id is every task table's first column"),
            TaskColumn::Queue => QUEUE,
            TaskColumn::State => STATE,
            TaskColumn::Priority => PRIORITY,
            TaskColumn::Key => KEY,
            TaskColumn::Attempts => ATTEMPTS,
            TaskColumn::Failures => FAILURES,
            TaskColumn::Age => AGE,
            TaskColumn::Due => DUE,
            TaskColumn::Holder => HOLDER,
            TaskColumn::Running => RUNNING,
            TaskColumn::Expires => EXPIRES,
            TaskColumn::Progress => PROGRESS,
            TaskColumn::Died => DIED,
            TaskColumn::Reason => REASON,
            TaskColumn::Error => ERROR,
            TaskColumn::Asks => ASKS,
            TaskColumn::TimesOut => TIMES_OUT,
        })
        .collect()
}

/// The tasks of the current screen: the id (marked with `*`), then `columns`.
fn task_table(app: &App, columns: &[Column], block: Block<'_>, frame: &mut Frame, area: Rect) {
    let marked = &app.page().marked;
    let now = app.now_ms;
    let mut widths = vec![Constraint::Length(27)];
    widths.extend(columns.iter().map(|c| c.width));
    let fitted = column_widths(block.inner(area), &widths);
    let rows = app
        .rows()
        .into_iter()
        .filter_map(|r| match r {
            Row::Task(t) => Some(t),
            _ => None,
        })
        .map(|t| {
            let mark = if marked.contains(&t.id) { "*" } else { " " };
            let mut cells = vec![Cell::from(format!("{mark}{}", t.id))];
            cells.extend(
                columns
                    .iter()
                    .zip(&fitted[1..])
                    .map(|(c, w)| Cell::from(fit(&(c.cell)(t, now), *w))),
            );
            TableRow::new(cells)
        })
        .collect();
    let mut titles = vec![" ID"];
    titles.extend(columns.iter().map(|c| c.title));
    table(app, rows, &widths, header(&titles), block, frame, area);
}

fn render_member(app: &App, m: &MemberInfo, block: Block<'_>, frame: &mut Frame, area: Rect) {
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let [info, list] = Layout::vertical([Constraint::Length(2), Constraint::Min(1)]).areas(inner);
    let (state, color) = member_state(m);
    let mut first = vec![
        Span::styled(state, Style::new().fg(color)),
        Span::raw(format!(
            " · holds {} of capacity {} · seen {}",
            m.leased,
            m.capacity,
            m.last_seen_ms
                .map_or("never".into(), |at| format!("{} ago", ago(app.now_ms, at)))
        )),
    ];
    if m.leased > app.rows().len() as u64 && app.page().filter.is_empty() {
        first.push(Span::raw(format!(" · first {} shown", app.rows().len())));
    }
    let second = format!(
        "labels {} · subscribed {}",
        list_or_dash(&m.labels),
        list_or_dash(&m.subscribed)
    );
    frame.render_widget(
        Paragraph::new(vec![Line::from(first), Line::raw(second)]),
        info,
    );
    if app.rows().is_empty() {
        frame.render_widget(Paragraph::new(nothing(app, "holds no tasks")), list);
        return;
    }
    task_table(app, &screen_columns(app), Block::new(), frame, list);
}

/// How a member's state reads, and its color.
fn member_state(m: &MemberInfo) -> (&'static str, Color) {
    match (m.state, m.draining) {
        (MemberState::Connected, false) => ("connected", Color::Reset),
        (MemberState::Connected, true) => ("draining", Color::Yellow),
        (MemberState::Unreachable, false) => ("unreachable", Color::Red),
        (MemberState::Unreachable, true) => ("unreach·drain", Color::Red),
        (MemberState::Gone, false) => ("gone", Color::Red),
        (MemberState::Gone, true) => ("gone·drain", Color::Red),
    }
}

fn render_members(app: &App, connected: u64, block: Block<'_>, frame: &mut Frame, area: Rect) {
    let now = app.now_ms;
    let rows: Vec<TableRow<'_>> = app
        .rows()
        .into_iter()
        .filter_map(|r| match r {
            Row::Member(m) => Some(m),
            _ => None,
        })
        .map(|m| {
            let (state, color) = member_state(m);
            TableRow::new(vec![
                Cell::from(m.name.clone()),
                Cell::from(list_or_dash(&m.labels)),
                Cell::from(m.capacity.to_string()),
                Cell::from(m.leased.to_string()),
                Cell::from(m.last_seen_ms.map_or("-".into(), |at| ago(now, at))),
                Cell::from(state).fg(color),
            ])
        })
        .collect();
    let block = block.title_bottom(format!(" {connected} connected "));
    if rows.is_empty() {
        frame.render_widget(
            Paragraph::new(nothing(app, "no members")).block(block),
            area,
        );
        return;
    }
    let widths = [
        Constraint::Min(12),
        Constraint::Min(8),
        Constraint::Length(4),
        Constraint::Length(5),
        Constraint::Length(6),
        Constraint::Length(13),
    ];
    let head = header(&["MEMBER", "LABELS", "CAP", "HELD", "SEEN", "STATE"]);
    table(app, rows, &widths, head, block, frame, area);
}

/// The columns of the limits screen after the name: rate, per key, held, waiting, keys
/// in use, granted, throttled, then the bars of tokens and of leases held, which take
/// the room left.
const LIMITS_WIDTHS: [Constraint; 9] = [
    Constraint::Length(7),
    Constraint::Length(5),
    Constraint::Length(5),
    Constraint::Length(5),
    Constraint::Length(5),
    Constraint::Length(5),
    Constraint::Length(5),
    Constraint::Fill(1),
    Constraint::Fill(1),
];

/// The columns of the selected limit's keys after the key: the two bars, waiting, and
/// the notes (`throttled 12s · full in 10s`).
const LIMIT_KEYS_WIDTHS: [Constraint; 4] = [
    Constraint::Fill(1),
    Constraint::Fill(1),
    Constraint::Length(5),
    Constraint::Length(27),
];

/// A column of names as wide as its widest (from 8 to 24 columns: a longer name is
/// cut), the bars taking the rest.
fn names_width<'a>(names: impl Iterator<Item = &'a str>) -> Constraint {
    use unicode_width::UnicodeWidthStr;
    let widest = names.map(UnicodeWidthStr::width).max().unwrap_or(0);
    Constraint::Length(u16::try_from(widest.clamp(8, 24)).unwrap_or(24))
}

/// The limits: a row each with live bars (refreshed every second: buckets refill with
/// time), and under them the busiest keys of the selected one.
fn render_limits(app: &App, block: Block<'_>, frame: &mut Frame, area: Rect) {
    let limits: Vec<&LimitInfo> = app
        .rows()
        .into_iter()
        .filter_map(|r| match r {
            Row::Limit(l) => Some(l),
            _ => None,
        })
        .collect();
    if limits.is_empty() {
        let none = nothing(app, "no limits (muster limit set NAME …)");
        frame.render_widget(Paragraph::new(none).block(block), area);
        return;
    }
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let selected = limits.get(app.page().selected).copied();
    // A line of facts, the keys' header and a row a key (one saying there is none),
    // under a rule.
    let pane_rows = selected.map_or(0, |l| l.keys.len().max(1) + 3);
    let [list, pane] = Layout::vertical([
        Constraint::Min(3),
        Constraint::Length(u16::try_from(pane_rows).unwrap_or(u16::MAX)),
    ])
    .areas(inner);
    limit_table(app, &limits, frame, list);
    if let Some(l) = selected {
        render_limit_keys(app, l, frame, pane);
    }
}

/// The widest label of a column of meters: each is right-aligned to it, so that the
/// bars line up.
fn label_width(gauges: impl Iterator<Item = Option<Gauge>>) -> usize {
    gauges
        .flatten()
        .map(|g| g.label().chars().count())
        .max()
        .unwrap_or(0)
}

/// A meter's cell, `-` for none: tokens cyan and leases green, red when nothing is
/// left to hand out.
fn meter_cell(gauge: Option<Gauge>, width: u16, label_width: usize) -> Cell<'static> {
    let Some(g) = gauge else {
        return Cell::from("-");
    };
    let color = match (g.exhausted(), g.measure) {
        (true, _) => Color::Red,
        (false, Measure::Tokens) => Color::Cyan,
        (false, Measure::Leases) => Color::Green,
    };
    Cell::from(g.meter(width, label_width)).fg(color)
}

/// The table of limits, a row each, in `area`.
fn limit_table(app: &App, limits: &[&LimitInfo], frame: &mut Frame, area: Rect) {
    let mut widths = vec![names_width(limits.iter().map(|l| l.name.as_str()))];
    widths.extend(LIMITS_WIDTHS);
    let fitted = column_widths(area, &widths);
    let tokens_label = label_width(limits.iter().map(|l| meters::tokens(l)));
    let held_label = label_width(limits.iter().map(|l| meters::in_use(l)));
    let rows = limits
        .iter()
        .map(|l| {
            let waiting = Cell::from(count(l.waiting));
            TableRow::new(vec![
                Cell::from(fit(&l.name, fitted[0])),
                Cell::from(fit(&meters::rate_text(l.spec.rate), fitted[1])),
                Cell::from(if l.spec.per_key { "yes" } else { "no" }),
                Cell::from(count(l.held)),
                if l.waiting > 0 {
                    waiting.fg(Color::Yellow)
                } else {
                    waiting
                },
                Cell::from(count(l.keys_in_use)),
                Cell::from(count(l.granted)),
                Cell::from(count(l.throttled)),
                meter_cell(meters::tokens(l), fitted[8], tokens_label),
                meter_cell(meters::in_use(l), fitted[9], held_label),
            ])
        })
        .collect();
    let head = header(&[
        "LIMIT", "RATE", "KEYED", "HELD", "WAIT", "KEYS", "GRANT", "THROT", "TOKENS", "IN USE",
    ]);
    table(app, rows, &widths, head, Block::new(), frame, area);
}

/// Limit `l`'s busiest keys (at most ten, as the daemon lists them), each with its
/// bars and what is worth saying of it, under a line of the limit's settings.
fn render_limit_keys(app: &App, l: &LimitInfo, frame: &mut Frame, area: Rect) {
    let what = if l.spec.per_key {
        "busiest keys"
    } else {
        "its bucket"
    };
    let block = Block::new()
        .borders(Borders::TOP)
        .title(format!(" {} · {what} ", l.name));
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let [facts, keys] = Layout::vertical([Constraint::Length(1), Constraint::Min(1)]).areas(inner);
    // Indented as the rows below are.
    frame.render_widget(
        Line::raw(format!(
            " {}",
            fit(&meters::limit_facts(l), facts.width.saturating_sub(1))
        )),
        facts,
    );
    if l.keys.is_empty() {
        frame.render_widget(
            Paragraph::new("no bucket in use: full, nothing held, nothing waiting"),
            keys,
        );
        return;
    }
    let mut widths = vec![names_width(l.keys.iter().map(meters::key_name))];
    widths.extend(LIMIT_KEYS_WIDTHS);
    let fitted = column_widths(keys, &widths);
    let gauges = |k| (meters::key_tokens(l, k), meters::key_in_use(l, k));
    let tokens_label = label_width(l.keys.iter().map(|k| gauges(k).0));
    let held_label = label_width(l.keys.iter().map(|k| gauges(k).1));
    let rows: Vec<TableRow<'_>> = l
        .keys
        .iter()
        .map(|k| {
            let (tokens, held) = gauges(k);
            TableRow::new(vec![
                Cell::from(fit(meters::key_name(k), fitted[0])),
                meter_cell(tokens, fitted[1], tokens_label),
                meter_cell(held, fitted[2], held_label),
                Cell::from(count(k.waiting)),
                Cell::from(fit(&meters::key_notes(k, app.now_ms), fitted[4])),
            ])
        })
        .collect();
    // Not selectable, but indented as the list above is.
    let table = Table::new(rows, widths)
        .header(header(&["KEY", "TOKENS", "HELD", "WAIT", "NOTE"]))
        .highlight_symbol(" ")
        .highlight_spacing(HighlightSpacing::Always);
    frame.render_widget(table, keys);
}

/// The columns of the schedules screen after the name and the queue: the pattern (with
/// its time zone), the next fire, the last, and the fires, missed and failures.
const SCHEDULES_WIDTHS: [Constraint; 6] = [
    Constraint::Fill(1),
    Constraint::Length(8),
    Constraint::Length(8),
    Constraint::Length(5),
    Constraint::Length(6),
    Constraint::Length(5),
];

/// The schedules: a row each with when it fires next and what its fires did, and
/// under them the task the selected one enqueues, its last task and its last error.
fn render_schedules(app: &App, block: Block<'_>, frame: &mut Frame, area: Rect) {
    let schedules: Vec<&ScheduleInfo> = app
        .rows()
        .into_iter()
        .filter_map(|r| match r {
            Row::Schedule(s) => Some(s),
            _ => None,
        })
        .collect();
    if schedules.is_empty() {
        let none = nothing(
            app,
            "no schedules (muster schedule set NAME --cron … --queue …)",
        );
        frame.render_widget(Paragraph::new(none).block(block), area);
        return;
    }
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let selected = schedules.get(app.page().selected).copied();
    // Its facts and its last error, if any, under a rule.
    let pane_rows = selected.map_or(0, |s| {
        schedule_facts(s).len() + usize::from(s.last_error.is_some()) + 1
    });
    let [list, pane] = Layout::vertical([
        Constraint::Min(3),
        Constraint::Length(u16::try_from(pane_rows).unwrap_or(u16::MAX)),
    ])
    .areas(inner);
    schedule_table(app, &schedules, frame, list);
    if let Some(s) = selected {
        render_schedule_task(s, frame, pane);
    }
}

/// The table of schedules, a row each, in `area`: a paused one's next fire in yellow,
/// missed fires in yellow and failed ones in red.
fn schedule_table(app: &App, schedules: &[&ScheduleInfo], frame: &mut Frame, area: Rect) {
    let now = app.now_ms;
    let mut widths = vec![
        names_width(schedules.iter().map(|s| s.name.as_str())),
        names_width(schedules.iter().map(|s| s.queue.as_str())),
    ];
    widths.extend(SCHEDULES_WIDTHS);
    let fitted = column_widths(area, &widths);
    let rows = schedules
        .iter()
        .map(|s| {
            let next = match s.next_fire_ms {
                _ if s.paused => Cell::from("paused").fg(Color::Yellow),
                Some(at) => Cell::from(until(now, at)),
                None => Cell::from("-"),
            };
            let last = s
                .last_fire_ms
                .map_or("never".into(), |at| format!("{} ago", ago(now, at)));
            let (missed, failures) = (Cell::from(count(s.missed)), Cell::from(count(s.failures)));
            TableRow::new(vec![
                Cell::from(fit(&s.name, fitted[0])),
                Cell::from(fit(&s.queue, fitted[1])),
                Cell::from(fit(&cron_text(s), fitted[2])),
                next,
                Cell::from(last),
                Cell::from(count(s.fires)),
                if s.missed > 0 {
                    missed.fg(Color::Yellow)
                } else {
                    missed
                },
                if s.failures > 0 {
                    failures.fg(Color::Red)
                } else {
                    failures
                },
            ])
        })
        .collect();
    let head = header(&[
        "SCHEDULE", "QUEUE", "CRON", "NEXT", "LAST", "FIRES", "MISSED", "FAIL",
    ]);
    table(app, rows, &widths, head, Block::new(), frame, area);
}

/// A schedule's pattern, with its time zone unless that is UTC.
fn cron_text(s: &ScheduleInfo) -> String {
    let cron = crate::output::safe(&s.cron);
    if s.tz == "UTC" {
        cron.into_owned()
    } else {
        format!("{cron} {}", crate::output::safe(&s.tz))
    }
}

/// Schedule `s`'s settings, the task each fire enqueues and its last one, and its last
/// error in red, each line fitted to the pane.
fn render_schedule_task(s: &ScheduleInfo, frame: &mut Frame, area: Rect) {
    let block = Block::new()
        .borders(Borders::TOP)
        .title(format!(" {} · enqueues on {} ", s.name, s.queue));
    let inner = block.inner(area);
    frame.render_widget(block, area);
    // Indented as the rows above are.
    let width = inner.width.saturating_sub(1);
    let mut lines: Vec<Line<'_>> = schedule_facts(s)
        .iter()
        .map(|fact| Line::raw(format!(" {}", fit(fact, width))))
        .collect();
    if let Some(e) = &s.last_error {
        let error = format!("last error {}", crate::output::safe(&one_line(e)));
        lines.push(Line::from(Span::styled(
            format!(" {}", fit(&error, width)),
            Style::new().fg(Color::Red),
        )));
    }
    frame.render_widget(Paragraph::new(lines), inner);
}

fn render_task(
    app: &App,
    t: &TaskInfo,
    extras: super::detail::TaskExtras<'_>,
    block: Block<'_>,
    frame: &mut Frame,
    area: Rect,
) {
    let lines = task_lines(t, extras, app.now_ms, app.absolute_times);
    let scroll = app.page().selected.min(lines.len().saturating_sub(1));
    frame.render_widget(
        Paragraph::new(Text::from(lines))
            .block(block)
            .wrap(Wrap { trim: false })
            .scroll((u16::try_from(scroll).unwrap_or(u16::MAX), 0)),
        area,
    );
}

fn render_message(app: &App, frame: &mut Frame, area: Rect) {
    let line = match &app.mode {
        Mode::Filter(text) => Line::from(format!("filter page: {text}▏")),
        Mode::Search(text) => Line::from(format!("/{text}▏")),
        Mode::Command(text) => Line::from(format!(":{text}▏")),
        _ => match &app.message {
            Some((Level::Info, text)) => {
                Line::from(Span::styled(text.clone(), Style::new().fg(Color::Green)))
            }
            Some((Level::Error, text)) => Line::from(Span::styled(
                text.clone(),
                Style::new().fg(Color::Red).bold(),
            )),
            None => Line::default(),
        },
    };
    frame.render_widget(line, area);
}

/// The footer: the current screen's keys, as many as fit, always ending with help
/// and quit (help lists the rest).
fn render_keys(app: &App, frame: &mut Frame, area: Rect) {
    let keys = app.keys();
    let (always, rest): (Vec<_>, Vec<_>) = keys.iter().partition(|(k, _)| matches!(*k, "?" | "q"));
    let width = |(k, what): &&(&str, &str)| k.chars().count() + what.chars().count() + 3;
    let mut room = usize::from(area.width).saturating_sub(always.iter().map(width).sum());
    let mut shown: Vec<&(&str, &str)> = Vec::new();
    for key in &rest {
        let w = width(key);
        if w > room {
            break;
        }
        room -= w;
        shown.push(key);
    }
    shown.extend(always);
    let spans: Vec<Span<'_>> = shown
        .into_iter()
        .flat_map(|(key, what)| {
            [
                Span::styled(*key, Style::new().bold().fg(Color::Cyan)),
                Span::raw(format!(" {what}  ")),
            ]
        })
        .collect();
    frame.render_widget(Line::from(spans), area);
}

fn popup(frame: &mut Frame, width: u16, height: u16) -> Rect {
    let area = frame
        .area()
        .centered(Constraint::Length(width), Constraint::Length(height));
    frame.render_widget(Clear, area);
    area
}

/// What `?` adds under the keys: the `:` commands and the words of a `/` search.
const HELP_NOTES: [(&str, &str); 4] = [
    (":", "queues, members, dead, limits, schedules, cluster, q"),
    ("", "queue NAME [STATE], task ID (tab completes)"),
    (
        "/",
        "ID-PREFIX or text · key:K · idem:K · label:L · state:S",
    ),
    (
        "",
        "error:TEXT · payload:TEXT · field:PATH=VALUE (spaces ok)",
    ),
];

fn render_help(app: &App, frame: &mut Frame) {
    let keys = app.keys();
    let key_style = Style::new().bold().fg(Color::Cyan);
    let key = |(key, what): &(&str, &str), width: usize| {
        vec![
            Span::styled(format!("{key:>8}  "), key_style),
            Span::raw(format!("{what:<width$}")),
        ]
    };
    // One column where it fits the screen's height, else two side by side.
    let room = usize::from(frame.area().height).saturating_sub(HELP_NOTES.len() + 3);
    let mut lines: Vec<Line<'_>> = if keys.len() <= room {
        keys.iter().map(|k| Line::from(key(k, 0))).collect()
    } else {
        let half = keys.len().div_ceil(2);
        (0..half)
            .map(|i| {
                let mut spans = key(&keys[i], 26);
                if let Some(right) = keys.get(i + half) {
                    spans.extend(key(right, 0));
                }
                Line::from(spans)
            })
            .collect()
    };
    lines.push(Line::default());
    lines.extend(HELP_NOTES.iter().map(|(key, what)| {
        Line::from(vec![
            Span::styled(format!("{key:>8}  "), key_style),
            Span::raw(*what),
        ])
    }));
    let height = (u16::try_from(lines.len()).unwrap_or(20) + 2).min(frame.area().height);
    let area = popup(frame, 72.min(frame.area().width), height);
    frame.render_widget(
        Paragraph::new(lines).block(Block::bordered().title(" Keys · any key closes ")),
        area,
    );
}

fn render_confirm(question: &str, frame: &mut Frame) {
    let area = popup(frame, 60, 6);
    frame.render_widget(
        Paragraph::new(vec![
            Line::raw(question.to_owned()),
            Line::default(),
            Line::from(vec![
                Span::styled("y", Style::new().bold().fg(Color::Cyan)),
                Span::raw(" confirm   any other key cancels"),
            ]),
        ])
        .wrap(Wrap { trim: true })
        .block(Block::bordered().title(" Confirm ")),
        area,
    );
}

/// Microseconds as the title shows a latency: `840µs`, `2.4ms`.
fn micros(us: u64) -> String {
    if us < 1000 {
        format!("{us}µs")
    } else {
        format!("{:.1}ms", us as f64 / 1000.0)
    }
}

/// Bars from lowest to highest, as a text sparkline draws them.
const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];

/// `values` (oldest first) drawn as at most `width` bars of text, each the highest of
/// its share of the values, scaled to the highest of all; the newest at the right. A bar
/// with no known value is blank; zero is the lowest bar.
pub fn spark(values: &[Option<u64>], width: u16) -> String {
    let width = usize::from(width);
    if width == 0 || values.is_empty() {
        return String::new();
    }
    let per = values.len().div_ceil(width);
    let skip = values.len() % per;
    let columns: Vec<Option<u64>> = values[skip..]
        .chunks(per)
        .map(|c| c.iter().flatten().copied().max())
        .collect();
    let top = columns.iter().flatten().copied().max().unwrap_or(0).max(1);
    columns
        .iter()
        .map(|v| v.map_or(' ', |v| BARS[((v * 7).div_ceil(top)) as usize]))
        .collect()
}
