//! Printing results: text lines for people and scripts, or JSON lines with `--json`.

use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use muster_protocol::model::{
    LimitInfo, MemberInfo, QueueInfo, Rate, ScheduleInfo, TaskInfo, TaskState, TaskSummary,
};

/// The columns of a task listing (`task list`, `task find`, `dead`, a member's leases).
pub const TASK_COLUMNS: &[&str] = &[
    "ID",
    "QUEUE",
    "STATE",
    "PRIORITY",
    "DELIVERIES",
    "FAILURES",
    "LAST_ERROR",
];

/// The columns of `queue list`.
pub const QUEUE_COLUMNS: &[&str] = &[
    "NAME",
    "READY",
    "SCHEDULED",
    "LEASED",
    "SUSPENDED",
    "DONE",
    "DEAD",
    "CANCELLED",
    "PAUSED",
];

/// The columns of `stats`, one row per queue.
pub const STATS_COLUMNS: &[&str] = &[
    "QUEUE",
    "READY",
    "SCHEDULED",
    "LEASED",
    "SUSPENDED",
    "DONE",
    "DEAD",
    "CANCELLED",
    "HELD_BACK",
    "UNCLAIMABLE",
    "OLDEST_READY_AGE",
    "ENQUEUED",
    "ACKED",
    "NACKED",
    "LAPSED",
    "PAUSED",
];

/// The columns of the daemon's row of `stats`.
pub const DAEMON_COLUMNS: &[&str] = &[
    "FSYNCS",
    "REQUESTS",
    "BATCH_FACTOR",
    "MEMBERS_CONNECTED",
    "DISK_ALARM",
];

/// The columns of `cluster status` (and `cluster add`, `cluster remove`): the node
/// that answered.
pub const CLUSTER_COLUMNS: &[&str] = &[
    "CLUSTER", "NODE", "ROLE", "TERM", "LEADER", "LAST_LOG", "APPLIED", "SNAPSHOT",
];

/// The columns of the members of `cluster status`.
pub const CLUSTER_MEMBER_COLUMNS: &[&str] = &["NODE", "ADDR", "CLUSTER_ADDR", "KIND", "MATCHED"];

/// The columns of `context list`.
pub const CONTEXT_COLUMNS: &[&str] = &["NAME", "CURRENT", "ADDR", "TRUST"];

/// The columns of `members`.
pub const MEMBER_COLUMNS: &[&str] = &["NAME", "STATE", "LEASES", "DRAINING", "LABELS", "LAST_SEEN"];

/// Where results go and in which form. Text has two shapes: a list is a table (a header
/// line, unless turned off, then one tab-separated row per item), one object is
/// `key<TAB>value` lines. JSON is one object per line, without headers.
pub struct Output {
    json: bool,
    headers: bool,
    out: std::io::Stdout,
}

impl Output {
    /// Text (tables with a header line if `headers`), or JSON lines if `json`.
    pub fn new(json: bool, headers: bool) -> Output {
        Output {
            json,
            headers,
            out: std::io::stdout(),
        }
    }

    /// Prints a table's header line: in text mode, unless headers are turned off.
    pub fn header(&self, columns: &[&str]) -> anyhow::Result<()> {
        if self.json || !self.headers {
            return Ok(());
        }
        let mut out = self.out.lock();
        writeln!(out, "{}", columns.join("\t"))?;
        out.flush()?;
        Ok(())
    }

    /// Whether JSON lines are printed.
    pub fn is_json(&self) -> bool {
        self.json
    }

    /// Prints a line in text mode only (the ids a dry run lists, a blank line between tables).
    pub fn text_line(&self, text: &str) -> anyhow::Result<()> {
        if self.json {
            return Ok(());
        }
        let mut out = self.out.lock();
        writeln!(out, "{text}")?;
        out.flush()?;
        Ok(())
    }

    /// Prints one line of text (in text mode) or one JSON value (in JSON mode).
    pub fn item<T: serde::Serialize>(
        &self,
        text: impl FnOnce() -> String,
        value: &T,
    ) -> anyhow::Result<()> {
        let mut out = self.out.lock();
        if self.json {
            serde_json::to_writer(&mut out, value)?;
            writeln!(out)?;
        } else {
            writeln!(out, "{}", text())?;
        }
        out.flush()?;
        Ok(())
    }

    /// Prints a queue's options and counts as `key<TAB>value` lines.
    pub fn queue(&self, q: &QueueInfo) -> anyhow::Result<()> {
        self.item(|| queue_text(q), q)
    }

    /// Prints a limit as `key<TAB>value` lines, then its busiest keys.
    pub fn limit(&self, l: &LimitInfo) -> anyhow::Result<()> {
        self.item(|| limit_text(l), l)
    }

    /// Prints a schedule as `key<TAB>value` lines: its settings, when it fires next and
    /// what its fires did, then the task each fire enqueues.
    pub fn schedule(&self, s: &ScheduleInfo) -> anyhow::Result<()> {
        self.item(|| schedule_text(s, now_ms()), s)
    }

    /// Prints a whole task as `key<TAB>value` lines, then its timeline.
    pub fn task(&self, t: &TaskInfo) -> anyhow::Result<()> {
        self.item(|| task_text(t), t)
    }

    /// Prints a member as one row of [`MEMBER_COLUMNS`]: name, state, leases/capacity,
    /// draining, labels, last seen.
    pub fn member(&self, m: &MemberInfo) -> anyhow::Result<()> {
        self.item(
            || {
                format!(
                    "{}\t{}\t{}/{}\t{}\t{}\t{}",
                    m.name,
                    m.state,
                    m.leased,
                    m.capacity,
                    if m.draining { "draining" } else { "active" },
                    if m.labels.is_empty() {
                        "-".into()
                    } else {
                        m.labels.join(",")
                    },
                    m.last_seen_ms.map_or("-".into(), time)
                )
            },
            m,
        )
    }

    /// Prints one task of a listing, a row of [`TASK_COLUMNS`].
    pub fn summary(&self, t: &TaskSummary) -> anyhow::Result<()> {
        self.item(
            || {
                format!(
                    "{}\t{}\t{}\t{}\t{}\t{}\t{}",
                    t.id,
                    t.queue,
                    t.state,
                    t.priority,
                    t.deliveries,
                    t.failures,
                    t.last_error.as_deref().map_or("-".into(), safe)
                )
            },
            t,
        )
    }
}

/// The row of [`CLUSTER_COLUMNS`] of a cluster status; `-` for what is unknown.
pub fn cluster_row(c: &muster_protocol::ops::ClusterStatusReply) -> String {
    let or_dash = |v: Option<u64>| v.map_or("-".to_owned(), |v| v.to_string());
    format!(
        "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
        safe(&c.cluster_id),
        c.node,
        safe(&c.role),
        c.term,
        or_dash(c.leader),
        or_dash(c.last_log_index),
        or_dash(c.last_applied),
        or_dash(c.snapshot_index)
    )
}

/// The row of [`CLUSTER_MEMBER_COLUMNS`] of one member: `voter` or `learner`, and `-`
/// for an unknown matched index.
pub fn cluster_member_row(m: &muster_protocol::ops::ClusterMember) -> String {
    format!(
        "{}\t{}\t{}\t{}\t{}",
        m.node,
        safe(&m.addr),
        safe(&m.cluster_addr),
        if m.voter { "voter" } else { "learner" },
        m.matched.map_or("-".to_owned(), |v| v.to_string())
    )
}

/// Text from others (an error a consumer wrote, a payload a producer sent, a task key)
/// made safe to print on an operator's terminal and to parse line by line: control
/// characters (C0, DEL, C1), line and paragraph separators and the bidi overrides and
/// isolates are written as escapes (`\n`, `\t`, `\r`, `\\`, else `\u{..}`), so no
/// field can move the cursor, set the title, write the clipboard (OSC 52) or forge a
/// line of its own.
pub fn safe(text: &str) -> std::borrow::Cow<'_, str> {
    let unsafe_char = |c: char| c == '\\' || dangerous(c);
    if !text.chars().any(unsafe_char) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\\' => out.push_str("\\\\"),
            c if unsafe_char(c) => out.push_str(&format!("\\u{{{:x}}}", u32::from(c))),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Raw JSON (a payload, result or checkpoint) made safe to print: the same JSON value,
/// on one line, with no character a terminal acts on. Line breaks and tabs can only
/// stand between tokens (JSON strings escape them): they become spaces; the others
/// (DEL, C1, separators, bidi controls) can only stand inside strings: they become
/// `\uXXXX` escapes there.
pub fn safe_json(raw: &str) -> std::borrow::Cow<'_, str> {
    if !raw.chars().any(dangerous) {
        return std::borrow::Cow::Borrowed(raw);
    }
    let mut out = String::with_capacity(raw.len() + 8);
    for c in raw.chars() {
        match c {
            '\n' | '\t' | '\r' => out.push(' '),
            c if dangerous(c) => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Characters a terminal may act on, or that break a line apart.
fn dangerous(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{2028}' | '\u{2029}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}'
        )
}

/// An instant as RFC 3339 with milliseconds.
pub fn time(ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

/// A span such as `30s` or `1day`.
pub fn span(ms: u64) -> String {
    humantime::format_duration(Duration::from_millis(ms)).to_string()
}

/// An instant as [`time`] prints it, then how far from `now` it is:
/// `2026-12-07T20:05:00.000Z (in 3m)`, `2026-12-07T19:55:00.000Z (5m ago)`.
pub fn time_from(now: u64, ms: u64) -> String {
    format!("{} ({})", time(ms), crate::console::detail::until(now, ms))
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The columns of `limit list`.
pub const LIMIT_COLUMNS: &[&str] = &[
    "NAME",
    "RATE",
    "BURST",
    "CONCURRENCY",
    "PER_KEY",
    "HELD",
    "WAITING",
    "KEYS",
    "GRANTED",
    "THROTTLED",
];

/// A limit's rate as `N/PERIOD`, or `-`.
fn rate_text(rate: Option<Rate>) -> String {
    rate.map_or("-".into(), |r| format!("{}/{}", r.count, span(r.per_ms)))
}

/// One row of [`LIMIT_COLUMNS`].
pub fn limit_row(l: &LimitInfo) -> String {
    let s = &l.spec;
    format!(
        "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
        l.name,
        rate_text(s.rate),
        s.burst.map_or("-".into(), |b| b.to_string()),
        s.concurrency.map_or("-".into(), |c| c.to_string()),
        s.per_key,
        l.held,
        l.waiting,
        l.keys_in_use,
        l.granted,
        l.throttled
    )
}

/// A limit as `key<TAB>value` lines, then its busiest keys, one per line.
fn limit_text(l: &LimitInfo) -> String {
    let s = &l.spec;
    let mut lines = vec![
        format!("name\t{}", l.name),
        format!("rate\t{}", rate_text(s.rate)),
        format!("burst\t{}", s.burst.map_or("-".into(), |b| b.to_string())),
        format!(
            "concurrency\t{}",
            s.concurrency.map_or("-".into(), |c| c.to_string())
        ),
        format!("per_key\t{}", s.per_key),
        format!("held\t{}", l.held),
        format!("waiting\t{}", l.waiting),
        format!("granted\t{}", l.granted),
        format!("throttled\t{}", l.throttled),
        format!("keys_in_use\t{}", l.keys_in_use),
        format!("created\t{}", time(l.created_ms)),
        format!("updated\t{}", time(l.updated_ms)),
    ];
    for k in &l.keys {
        let key = if k.key.is_empty() { "(all)" } else { &k.key };
        lines.push(format!(
            "key {key}\ttokens {} held {} waiting {}{}{}",
            k.tokens.map_or("-".into(), |t| t.to_string()),
            k.held,
            k.waiting,
            k.full_ms
                .map_or(String::new(), |t| format!(" full at {}", time(t))),
            k.throttled_until_ms
                .map_or(String::new(), |t| format!(" throttled until {}", time(t))),
        ));
    }
    lines.join("\n")
}

/// The columns of `schedule list`.
pub const SCHEDULE_COLUMNS: &[&str] = &[
    "NAME",
    "QUEUE",
    "CRON",
    "TZ",
    "PAUSED",
    "NEXT_FIRE",
    "LAST_FIRE",
    "LAST_TASK",
    "FIRES",
    "RUNS",
    "MISSED",
    "FAILURES",
    "LAST_ERROR",
];

/// One row of [`SCHEDULE_COLUMNS`] at `now`: the fires as [`time_from`] prints them,
/// `-` for none.
pub fn schedule_row(s: &ScheduleInfo, now: u64) -> String {
    format!(
        "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
        s.name,
        s.queue,
        safe(&s.cron),
        safe(&s.tz),
        s.paused,
        s.next_fire_ms.map_or("-".into(), |t| time_from(now, t)),
        s.last_fire_ms.map_or("-".into(), |t| time_from(now, t)),
        s.last_task.as_deref().unwrap_or("-"),
        s.fires,
        s.runs,
        s.missed,
        s.failures,
        s.last_error.as_deref().map_or("-".into(), safe)
    )
}

/// A schedule at `now` as `key<TAB>value` lines: its settings, its fires, then the
/// task each fire enqueues (payload and options); `-` for what it has none of.
fn schedule_text(s: &ScheduleInfo, now: u64) -> String {
    let opt = |v: &Option<String>| v.as_deref().map_or("-".into(), |s| safe(s).into_owned());
    let at = |v: Option<u64>| v.map_or("-".into(), |t| time_from(now, t));
    let t = &s.task;
    [
        format!("name\t{}", s.name),
        format!("queue\t{}", s.queue),
        format!("cron\t{}", safe(&s.cron)),
        format!("tz\t{}", safe(&s.tz)),
        format!("catch_up\t{}", s.catch_up.as_str()),
        format!("paused\t{}", s.paused),
        format!("next_fire\t{}", at(s.next_fire_ms)),
        format!("last_fire\t{}", at(s.last_fire_ms)),
        format!("last_task\t{}", s.last_task.as_deref().unwrap_or("-")),
        format!("fires\t{}", s.fires),
        format!("runs\t{}", s.runs),
        format!("missed\t{}", s.missed),
        format!("failures\t{}", s.failures),
        format!("last_error\t{}", opt(&s.last_error)),
        format!("payload\t{}", safe_json(t.payload.get())),
        format!("priority\t{}", t.priority.unwrap_or(0)),
        format!("key\t{}", opt(&t.key)),
        format!(
            "requires\t{}",
            if t.requires.is_empty() {
                "-".into()
            } else {
                safe(&t.requires.join(",")).into_owned()
            }
        ),
        format!(
            "limits\t{}",
            safe(&crate::console::detail::limits_text(&t.limits))
        ),
        format!("group\t{}", opt(&t.group)),
        format!("delay\t{}", t.delay_ms.map_or("-".into(), span)),
        format!("created\t{}", time(s.created_ms)),
        format!("updated\t{}", time(s.updated_ms)),
    ]
    .join("\n")
}

fn queue_text(q: &QueueInfo) -> String {
    let o = &q.options;
    let b = &o.retry_backoff;
    let mut lines = vec![format!("name\t{}", q.name), format!("paused\t{}", o.paused)];
    for state in TaskState::ALL {
        lines.push(format!("{state}\t{}", q.counts.get(state)));
    }
    lines.push(format!("held_back\t{}", q.held_back));
    lines.push(format!("waiting_on_limits\t{}", q.waiting_on_limits));
    lines.push(format!("consumers\t{}", q.consumers));
    lines.push(format!(
        "unclaimable\t{}{}",
        q.unclaimable,
        if q.unclaimable_requires.is_empty() {
            String::new()
        } else {
            let sets: Vec<String> = q.unclaimable_requires.iter().map(|r| r.join(",")).collect();
            format!(" (requires {})", sets.join(" | "))
        }
    ));
    lines.extend([
        format!(
            "oldest_ready\t{}",
            q.oldest_ready_ms.map_or("-".into(), time)
        ),
        format!("lease\t{}", span(o.lease_ms)),
        format!("max_attempts\t{}", o.max_attempts),
        format!(
            "retry_backoff\t{} x{} cap {} jitter {}%",
            span(b.base_ms),
            b.factor,
            span(b.cap_ms),
            (b.jitter * 100.0).round()
        ),
        format!("key_concurrency\t{}", o.key_concurrency),
        format!(
            "fair\t{}{}",
            o.fair,
            o.group_weights
                .iter()
                .map(|(g, w)| format!(" {}={w}", safe(g)))
                .collect::<String>()
        ),
        format!("retention\t{}", span(o.retention_ms)),
        format!(
            "max_runtime\t{}",
            o.max_runtime_ms.map_or("none".into(), span)
        ),
        format!("created\t{}", time(q.created_ms)),
    ]);
    lines.join("\n")
}

fn task_text(t: &TaskInfo) -> String {
    let opt = |v: &Option<String>| v.as_deref().map_or("-".into(), |s| safe(s).into_owned());
    let raw = |v: &Option<muster_protocol::RawJson>| {
        v.as_ref()
            .map_or("-".into(), |r| safe_json(r.get()).into_owned())
    };
    let mut lines = vec![
        format!("id\t{}", t.id),
        format!("queue\t{}", t.queue),
        format!("state\t{}", t.state),
        format!("priority\t{}", t.priority),
        format!("key\t{}", opt(&t.key)),
        format!(
            "requires\t{}",
            if t.requires.is_empty() {
                "-".into()
            } else {
                t.requires.join(",")
            }
        ),
        format!(
            "limits\t{}",
            safe(&crate::console::detail::limits_text(&t.limits))
        ),
        format!("group\t{}", opt(&t.group)),
        format!(
            "waiting\t{}",
            t.waiting_on.as_ref().map_or("-".into(), |w| safe(
                &crate::console::detail::waiting_text(w)
            )
            .into_owned())
        ),
        format!("deliveries\t{}", t.deliveries),
        format!("failures\t{}", t.failures),
        format!("not_before\t{}", t.not_before_ms.map_or("-".into(), time)),
        format!(
            "lease\t{}",
            t.lease.as_ref().map_or("-".into(), |l| format!(
                "member={} epoch={} expires={}",
                if l.member.is_empty() { "-" } else { &l.member },
                l.epoch,
                time(l.expires_ms)
            ))
        ),
        format!("cancel_requested\t{}", t.cancel_requested),
        format!("last_error\t{}", opt(&t.last_error)),
        format!("dead_reason\t{}", opt(&t.dead_reason)),
        format!(
            "suspended\t{}",
            t.suspension.as_ref().map_or("-".into(), |s| format!(
                "reason=\"{}\" since={} times_out={} on_timeout={} member={} epoch={}",
                safe(&s.reason),
                time(s.since_ms),
                time(s.timeout_at_ms),
                s.on_timeout.as_str(),
                if s.member.is_empty() { "-" } else { &s.member },
                s.epoch
            ))
        ),
        format!(
            "resumed\t{}",
            t.resumed.as_ref().map_or("-".into(), |r| format!(
                "by={} at={} timed_out={} data={}",
                if r.by.is_empty() { "-" } else { &r.by },
                time(r.at_ms),
                r.timed_out,
                r.data
                    .as_ref()
                    .map_or("-".into(), |d| safe_json(d.get()).into_owned())
            ))
        ),
        format!("payload\t{}", safe_json(t.payload.get())),
        format!("progress\t{}", raw(&t.progress)),
        format!("result\t{}", raw(&t.result)),
        format!(
            "output\t{}",
            t.output.map_or("-".into(), |o| format!(
                "{} chunks ({} dropped), {} bytes kept",
                o.next, o.first, o.bytes
            ))
        ),
        format!("created\t{}", time(t.created_ms)),
        format!("updated\t{}", time(t.updated_ms)),
    ];
    lines.push(format!(
        "parent\t{}",
        t.parent.as_ref().map_or("-".into(), |p| format!(
            "{p} child_key={}",
            safe(t.child_key.as_deref().unwrap_or("-"))
        ))
    ));
    lines.push(format!(
        "children\t{}",
        match t.children.len() {
            0 => "-".into(),
            n => format!("{n} ({})", crate::console::detail::children_counts(t)),
        }
    ));
    for c in &t.children {
        lines.push(format!(
            "child\t{}\t{}\t{}\t{}\tchildren={}",
            safe(&c.child_key),
            c.state,
            c.id,
            c.queue,
            c.children
        ));
    }
    for c in t.resumed.iter().flat_map(|r| &r.children) {
        let mut line = format!("outcome\t{}\t{}\t{}", safe(&c.child_key), c.state, c.id);
        if let Some(r) = &c.result {
            line.push_str(&format!(" result={}", safe_json(r.get())));
        }
        if let Some(e) = &c.error {
            line.push_str(&format!(" error=\"{}\"", safe(e)));
        }
        if c.omitted {
            line.push_str(" omitted=true");
        }
        lines.push(line);
    }
    for e in &t.history {
        let mut line = format!("event\t{}\t{}", time(e.at_ms), e.event);
        if let Some(m) = &e.member {
            line.push_str(&format!(" member={}", if m.is_empty() { "-" } else { m }));
        }
        if let Some(ep) = e.epoch {
            line.push_str(&format!(" epoch={ep}"));
        }
        if let Some(err) = &e.error {
            line.push_str(&format!(" error=\"{}\"", safe(err)));
        }
        lines.push(line);
    }
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::{cluster_member_row, cluster_row, safe, safe_json, schedule_row, schedule_text};

    /// 2027-01-15T08:00:00Z.
    const NOW: u64 = 1_800_000_000_000;

    /// `nightly`: at 02:00 in Berlin, next in 3 minutes, last fired 5 minutes ago, with a
    /// task of priority 7 drawing on a limit, and a last error of two lines.
    fn nightly() -> muster_protocol::model::ScheduleInfo {
        let mut task = muster_protocol::model::NewTask::new(
            muster_protocol::ops::raw("{\"report\": \"daily\"}").unwrap(),
        );
        task.priority = Some(7);
        task.limits = vec![muster_protocol::model::LimitUse {
            limit: "openai".into(),
            key: None,
            cost: Some(3),
        }];
        task.delay_ms = Some(30_000);
        muster_protocol::model::ScheduleInfo {
            name: "nightly".into(),
            cron: "0 2 * * *".into(),
            tz: "Europe/Berlin".into(),
            queue: "reports".into(),
            task,
            catch_up: muster_protocol::model::CatchUp::Once,
            paused: false,
            next_fire_ms: Some(NOW + 180_000),
            last_fire_ms: Some(NOW - 300_000),
            last_task: Some("01KA0000000000000000000007".into()),
            fires: 12,
            runs: 1,
            missed: 3,
            failures: 2,
            last_error: Some("not_found: no queue\tnamed \"reports\"\nsecond line".into()),
            created_ms: NOW - 86_400_000,
            updated_ms: NOW - 3_600_000,
        }
    }

    #[test]
    fn a_schedule_prints_its_fires_as_times_and_from_now() {
        let s = nightly();
        assert_eq!(
            schedule_row(&s, NOW),
            "nightly\treports\t0 2 * * *\tEurope/Berlin\tfalse\t2027-01-15T08:03:00.000Z (in 3m)\t\
             2027-01-15T07:55:00.000Z (5m ago)\t01KA0000000000000000000007\t12\t1\t3\t2\t\
             not_found: no queue\\tnamed \"reports\"\\nsecond line"
        );
        assert_eq!(
            schedule_text(&s, NOW),
            "name\tnightly
queue\treports
cron\t0 2 * * *
tz\tEurope/Berlin
catch_up\tonce
paused\tfalse
next_fire\t2027-01-15T08:03:00.000Z (in 3m)
last_fire\t2027-01-15T07:55:00.000Z (5m ago)
last_task\t01KA0000000000000000000007
fires\t12
runs\t1
missed\t3
failures\t2
last_error\tnot_found: no queue\\tnamed \"reports\"\\nsecond line
payload\t{\"report\": \"daily\"}
priority\t7
key\t-
requires\t-
limits\topenai ×3
group\t-
delay\t30s
created\t2027-01-14T08:00:00.000Z
updated\t2027-01-15T07:00:00.000Z"
        );
        // Paused and never fired: no times, every count 0, the task's defaults.
        let paused = muster_protocol::model::ScheduleInfo {
            paused: true,
            next_fire_ms: None,
            last_fire_ms: None,
            last_task: None,
            last_error: None,
            task: muster_protocol::model::NewTask::new(muster_protocol::ops::raw("{}").unwrap()),
            ..nightly()
        };
        assert_eq!(
            schedule_row(&paused, NOW),
            "nightly\treports\t0 2 * * *\tEurope/Berlin\ttrue\t-\t-\t-\t12\t1\t3\t2\t-"
        );
        let text = schedule_text(&paused, NOW);
        for line in [
            "paused\ttrue",
            "next_fire\t-",
            "last_fire\t-",
            "last_task\t-",
            "last_error\t-",
            "payload\t{}",
            "priority\t0",
            "limits\t-",
            "delay\t-",
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} in {text}");
        }
    }

    #[test]
    fn a_cluster_status_prints_one_row_for_the_node_and_one_per_member() {
        use muster_protocol::ops::{ClusterMember, ClusterStatusReply};
        let reply = ClusterStatusReply {
            cluster_id: "prod".into(),
            node: 2,
            role: "follower".into(),
            term: 7,
            leader: Some(1),
            last_log_index: Some(120),
            last_applied: Some(119),
            snapshot_index: None,
            members: vec![
                ClusterMember {
                    node: 1,
                    addr: "10.0.0.1:7420".into(),
                    cluster_addr: "10.0.0.1:7421".into(),
                    voter: true,
                    matched: Some(120),
                },
                ClusterMember {
                    node: 4,
                    addr: "10.0.0.4:7420".into(),
                    cluster_addr: "10.0.0.4:7421".into(),
                    voter: false,
                    matched: None,
                },
            ],
        };
        assert_eq!(cluster_row(&reply), "prod\t2\tfollower\t7\t1\t120\t119\t-");
        assert_eq!(
            cluster_member_row(&reply.members[0]),
            "1\t10.0.0.1:7420\t10.0.0.1:7421\tvoter\t120"
        );
        assert_eq!(
            cluster_member_row(&reply.members[1]),
            "4\t10.0.0.4:7420\t10.0.0.4:7421\tlearner\t-"
        );
        let electing = ClusterStatusReply {
            leader: None,
            role: "candidate".into(),
            last_log_index: None,
            last_applied: None,
            ..reply
        };
        assert_eq!(cluster_row(&electing), "prod\t2\tcandidate\t7\t-\t-\t-\t-");
    }

    #[test]
    fn text_from_others_cannot_drive_the_terminal_or_forge_lines() {
        // A title change, a screen clear, an OSC 52 clipboard write, a forged line.
        let hostile =
            "x\u{1b}]0;pwned\u{7}\u{1b}[2J\u{1b}]52;c;ZXZpbA==\u{7}\nstate\tdone\u{9b}\u{202e}";
        assert_eq!(
            safe(hostile),
            "x\\u{1b}]0;pwned\\u{7}\\u{1b}[2J\\u{1b}]52;c;ZXZpbA==\\u{7}\\nstate\\tdone\\u{9b}\\u{202e}"
        );
        assert_eq!(
            safe("a\\nb"),
            "a\\\\nb",
            "a backslash is escaped too: escapes stay unambiguous"
        );
        assert!(matches!(
            safe("plain – ünïcode"),
            std::borrow::Cow::Borrowed(_)
        ));
    }

    #[test]
    fn json_stays_the_same_json_on_one_line() {
        let raw = "{\n  \"a\": \"\u{9b}31m\u{202e}\",\t\"b\": \"x\\ny\"\n}";
        let safe = safe_json(raw);
        assert_eq!(safe, "{   \"a\": \"\\u009b31m\\u202e\", \"b\": \"x\\ny\" }");
        let before: serde_json::Value = serde_json::from_str(raw).unwrap();
        let after: serde_json::Value = serde_json::from_str(&safe).unwrap();
        assert_eq!(before, after);
    }
}
