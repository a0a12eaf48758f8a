//! The words of the console's screens: the task screen's lines (which the state also
//! counts, to move over them) and the ways durations, times, lists and JSON are shown.
//! Shared by the state ([`super::app`]) and the renderer ([`super::ui`]), and knowing
//! neither.

use ratatui::style::{Color, Style, Stylize};
use ratatui::text::{Line, Span};

use muster_protocol::model::{
    ChildSummary, LimitKey, LimitUse, OutputChunk, ScheduleInfo, TaskInfo, TaskState, TreeNode,
};

/// Items joined by commas, or `-` for none.
pub fn list_or_dash(items: &[String]) -> String {
    if items.is_empty() {
        "-".into()
    } else {
        items.join(",")
    }
}

/// Lines of a task's output the task screen shows at most: its last ones.
pub const OUTPUT_LINES: usize = 12;

/// What the watched task screen shows besides the task: its output's last chunks and
/// its family tree (depth first; `truncated` when the daemon left some out).
#[derive(Debug, Clone, Copy, Default)]
pub struct TaskExtras<'a> {
    /// The last chunks of its output.
    pub output: &'a [OutputChunk],
    /// Its descendants.
    pub tree: &'a [TreeNode],
    /// Descendants were left out of `tree`.
    pub truncated: bool,
}

/// The lines of the task screen, at `now`: its fields, its last error in full, its
/// children (its whole family tree when the daemon sent it), its output's last lines,
/// its timeline (times of day if `absolute`, else ages), then its progress, payload and
/// result.
pub fn task_lines(
    t: &TaskInfo,
    extras: TaskExtras<'_>,
    now: u64,
    absolute: bool,
) -> Vec<Line<'static>> {
    let TaskExtras {
        output,
        tree,
        truncated,
    } = extras;
    let mut lines = field_lines(t, now);
    if let Some(e) = &t.last_error {
        // The whole error: its first line beside the name, the rest (a traceback) below.
        let mut error = e.lines();
        let first = error.next().unwrap_or_default().to_owned();
        lines.push(field("last error", first).fg(Color::Red));
        lines.extend(error.map(|l| Line::raw(format!("  {l}")).fg(Color::Red)));
    }
    if !t.children.is_empty() {
        lines.push(Line::from(Span::styled(
            format!("children ({})", children_counts(t)),
            Style::new().bold(),
        )));
        let child_line = |depth: u8, c: &ChildSummary, below: bool| {
            // Its own children are listed below it in a tree, else counted.
            let grandchildren = match c.children {
                0 => String::new(),
                _ if below => String::new(),
                n => format!("  +{n} children"),
            };
            let indent = "  ".repeat(usize::from(depth));
            Line::raw(format!(
                "{indent}{:<16} {:<10} {}  {}{grandchildren}",
                crate::output::safe(&c.child_key),
                c.state.as_str(),
                c.id,
                c.queue
            ))
        };
        if tree.is_empty() {
            lines.extend(t.children.iter().map(|c| child_line(1, c, false)));
        } else {
            // A node's children follow it unless the tree was cut before them.
            lines.extend(tree.iter().enumerate().map(|(i, n)| {
                let below = tree.get(i + 1).is_some_and(|next| next.depth > n.depth);
                child_line(n.depth, &n.child, below)
            }));
            if truncated {
                lines.push(Line::raw(format!(
                    "  … more descendants than the {} shown",
                    tree.len()
                )));
            }
        }
    }
    if let Some(o) = t.output {
        lines.push(Line::from(Span::styled(
            format!(
                "output ({} chunks, {} dropped; muster tail -f {} follows it)",
                o.next, o.first, t.id
            ),
            Style::new().bold(),
        )));
        lines.extend(
            output_text(output)
                .into_iter()
                .map(|l| Line::raw(format!("  {l}"))),
        );
    }
    lines.push(Line::from(Span::styled("timeline", Style::new().bold())));
    lines.extend((0..t.history.len()).map(|i| Line::raw(timeline_text(t, i, now, absolute))));
    for (name, json) in [
        ("progress", t.progress.as_ref()),
        ("payload", Some(&t.payload)),
        ("result", t.result.as_ref()),
    ] {
        if let Some(json) = json {
            lines.push(Line::from(Span::styled(name, Style::new().bold())));
            lines.extend(
                pretty(json.get())
                    .lines()
                    .map(|l| Line::raw(format!("  {l}"))),
            );
        }
    }
    lines
}

/// The last [`OUTPUT_LINES`] lines of output chunks: texts as written, JSON chunks a
/// line each, every line made safe to show (control characters escaped: the output is
/// the agent's, and must not drive the terminal).
pub fn output_text(chunks: &[OutputChunk]) -> Vec<String> {
    let mut text = String::new();
    for c in chunks {
        if let Some(t) = &c.text {
            text.push_str(t);
        } else if let Some(j) = &c.json {
            if !text.is_empty() && !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str(j.get());
            text.push('\n');
        }
    }
    let lines: Vec<&str> = text.lines().collect();
    let from = lines.len().saturating_sub(OUTPUT_LINES);
    lines[from..]
        .iter()
        .map(|l| crate::output::safe(l).into_owned())
        .collect()
}

/// How many of a task's children are in each state, e.g. `3 done, 1 leased`.
pub fn children_counts(t: &TaskInfo) -> String {
    TaskState::ALL
        .iter()
        .filter_map(|s| {
            let n = t.children.iter().filter(|c| c.state == *s).count();
            (n > 0).then(|| format!("{n} {}", s.as_str()))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// A line of the task screen's fields: the name in bold, in a column of its own.
fn field(name: &'static str, value: String) -> Line<'static> {
    Line::from(vec![
        Span::styled(format!("{name:<11}"), Style::new().bold()),
        Span::raw(value),
    ])
}

/// The task screen's fields, at `now`: queue, state, attempts, lease, priority, ages,
/// and when it is due if it waits for a time.
fn field_lines(t: &TaskInfo, now: u64) -> Vec<Line<'static>> {
    let mut state = t.state.as_str().to_owned();
    if let Some(reason) = &t.dead_reason {
        state.push_str(&format!(" ({reason})"));
    }
    if t.cancel_requested {
        state.push_str(", cancel requested");
    }
    let mut lines = vec![
        field("queue", t.queue.clone()),
        field("state", state),
        field(
            "attempts",
            format!("{} delivered, {} failed", t.deliveries, t.failures),
        ),
        field(
            "lease",
            t.lease.as_ref().map_or("none".into(), |l| {
                format!(
                    "{} epoch {}, expires {}",
                    holder(&l.member),
                    l.epoch,
                    until(now, l.expires_ms)
                )
            }),
        ),
        field(
            "priority",
            format!(
                "{}   key {}   requires {}",
                t.priority,
                t.key.as_deref().unwrap_or("-"),
                list_or_dash(&t.requires)
            ),
        ),
        field(
            "created",
            format!(
                "{} ago, changed {} ago",
                ago(now, t.created_ms),
                ago(now, t.updated_ms)
            ),
        ),
    ];
    if let Some(at) = t.not_before_ms {
        lines.push(field("due", until(now, at)));
    }
    if let Some(parent) = &t.parent {
        lines.push(field(
            "parent",
            format!(
                "{parent} (child key {})",
                t.child_key.as_deref().unwrap_or("-")
            ),
        ));
    }
    if let Some(s) = &t.suspension {
        lines.push(field("asks", s.reason.clone()).fg(Color::Yellow));
        lines.push(field(
            "waiting",
            format!(
                "{}, by {} (epoch {}); times out {} ({})",
                ago(now, s.since_ms),
                holder(&s.member),
                s.epoch,
                until(now, s.timeout_at_ms),
                s.on_timeout.as_str()
            ),
        ));
    }
    if let Some(r) = &t.resumed {
        let how = if r.timed_out {
            "timed out".to_owned()
        } else if !r.children.is_empty() && r.by.is_empty() {
            format!("its {} children finished", r.children.len())
        } else if r.by.is_empty() {
            "resumed".to_owned()
        } else {
            format!("resumed by {}", r.by)
        };
        let data = r
            .data
            .as_ref()
            .map_or(String::new(), |d| format!(": {}", d.get()));
        lines.push(field(
            "resumed",
            format!("{how} {} ago{data}", ago(now, r.at_ms)),
        ));
    }
    if !t.limits.is_empty() || t.group.is_some() {
        lines.push(field(
            "limits",
            format!(
                "{}   group {}",
                limits_text(&t.limits),
                t.group.as_deref().unwrap_or("-")
            ),
        ));
    }
    if let Some(w) = &t.waiting_on {
        lines.push(field("waiting", waiting_text(w)));
    }
    lines
}

/// The limits a task draws on: `NAME`, `NAME (KEY)`, then `×COST` above 1; `-` if none.
pub fn limits_text(limits: &[LimitUse]) -> String {
    if limits.is_empty() {
        return "-".into();
    }
    let one = |l: &LimitUse| {
        let mut text = l.limit.clone();
        if let Some(key) = &l.key {
            text.push_str(&format!(" ({key})"));
        }
        if let Some(cost) = l.cost.filter(|c| *c > 1) {
            text.push_str(&format!(" ×{cost}"));
        }
        text
    };
    limits.iter().map(one).collect::<Vec<_>>().join(", ")
}

/// What the schedules screen says of the selected schedule, a line each: its pattern,
/// time zone, catch-up and next fire (in UTC); the task each fire enqueues (its
/// payload on one line, and the options it has); its last task and how often it was
/// run now (its fires' counts are the table's). Text from others (the payload, a key)
/// is made safe to show.
pub fn schedule_facts(s: &ScheduleInfo) -> Vec<String> {
    use crate::output::{safe, safe_json, time};
    let next = match s.next_fire_ms {
        _ if s.paused => "paused".to_owned(),
        Some(at) => format!("next {}", time(at)),
        None => "no next fire".to_owned(),
    };
    let t = &s.task;
    let mut task = format!("task {}", safe_json(t.payload.get()));
    if let Some(p) = t.priority {
        task.push_str(&format!(" · priority {p}"));
    }
    if let Some(key) = &t.key {
        task.push_str(&format!(" · key {}", safe(key)));
    }
    if !t.requires.is_empty() {
        task.push_str(&format!(" · requires {}", safe(&t.requires.join(","))));
    }
    if !t.limits.is_empty() {
        task.push_str(&format!(" · limits {}", safe(&limits_text(&t.limits))));
    }
    if let Some(group) = &t.group {
        task.push_str(&format!(" · group {}", safe(group)));
    }
    if let Some(delay) = t.delay_ms {
        task.push_str(&format!(" · delay {}", short(delay)));
    }
    vec![
        format!(
            "{} in {} · catch-up {} · {next}",
            safe(&s.cron),
            safe(&s.tz),
            s.catch_up.as_str()
        ),
        task,
        format!(
            "last task {} · runs {}",
            s.last_task.as_deref().unwrap_or("none yet"),
            s.runs
        ),
    ]
}

/// `on limit NAME`, with ` (KEY)` for a key's bucket.
pub fn waiting_text(w: &LimitKey) -> String {
    if w.key.is_empty() {
        format!("on limit {}", w.limit)
    } else {
        format!("on limit {} ({})", w.limit, w.key)
    }
}

/// The timeline's line of event `i`: when, what, by whom, under which epoch, how long
/// the attempt it began ran, and its error's first line.
fn timeline_text(t: &TaskInfo, i: usize, now: u64, absolute: bool) -> String {
    let e = &t.history[i];
    let when = if absolute {
        crate::output::time(e.at_ms)
    } else {
        format!("{:>4} ago", ago(now, e.at_ms))
    };
    let mut text = format!("  {when}  {:<16}", e.event);
    if let Some(m) = e.member.as_deref().filter(|m| !m.is_empty()) {
        text.push_str(&format!(" {m}"));
    }
    if let Some(epoch) = e.epoch {
        text.push_str(&format!(" #{epoch}"));
    }
    if let Some(ran) = attempt_length(t, i, now) {
        text.push_str(&format!(" {ran}"));
    }
    if let Some(err) = &e.error {
        text.push_str(&format!(" {}", one_line(err)));
    }
    text
}

/// The first line of a text, with a mark if more followed.
pub fn one_line(text: &str) -> String {
    match text.split_once('\n') {
        Some((first, _)) => format!("{first} …"),
        None => text.to_owned(),
    }
}

/// JSON text pretty-printed (as it is, if it does not parse).
pub fn pretty(json: &str) -> String {
    serde_json::from_str::<serde_json::Value>(json)
        .and_then(|v| serde_json::to_string_pretty(&v))
        .unwrap_or_else(|_| json.to_owned())
}

/// How long the attempt that event `i` (a lease) began ran: to the next event of its
/// epoch (its settle, lapse, revoke or release), or, still leased, until now.
fn attempt_length(t: &TaskInfo, i: usize, now: u64) -> Option<String> {
    let e = &t.history[i];
    if e.event != "leased" {
        return None;
    }
    let end = t.history[i + 1..]
        .iter()
        .find(|later| later.epoch == e.epoch || later.event == "leased");
    match end {
        Some(end) => Some(format!("ran {}", short(end.at_ms.saturating_sub(e.at_ms)))),
        None if t.state == TaskState::Leased => {
            Some(format!("running {}", short(now.saturating_sub(e.at_ms))))
        }
        None => None,
    }
}

/// A span of milliseconds in its largest whole unit: `42s`, `7m`, `3h`, `2d`.
pub fn short(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86_400 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

/// How long ago `at` was.
pub fn ago(now: u64, at: u64) -> String {
    short(now.saturating_sub(at))
}

/// How long until `at` (`in 5s`), or since it passed (`3m ago`).
pub fn until(now: u64, at: u64) -> String {
    if at >= now {
        format!("in {}", short(at - now))
    } else {
        format!("{} ago", short(now - at))
    }
}

/// A member name as shown; anonymous claims have none.
pub fn holder(member: &str) -> String {
    if member.is_empty() {
        "(anonymous)".into()
    } else {
        member.to_owned()
    }
}
