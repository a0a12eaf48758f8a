//! What the engine reports to Prometheus: the one place that names its series.
//!
//! Counters and histograms move where the engine changes a task; every series of a
//! queue is registered at zero when the queue is created or restored, so `rate()` and
//! `absent()` work from the start. Gauges are set by [`publish`], once a second, from
//! counts the engine keeps anyway. The table of series is in `crate::metrics`.

use metrics::{counter, gauge, histogram};
use ulid::Ulid;

use crate::store::{LeaseRecord, TaskRecord};

use muster_protocol::QueueInfo;
use muster_protocol::model::{LimitInfo, MemberInfo, TaskState};

/// How a lease ended: the `outcome` of `muster_run_seconds`, and the counter it moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseEnd {
    /// Acked by its holder.
    Acked,
    /// Nacked by its holder.
    Nacked,
    /// Released by its holder, or at a fresh session of its member.
    Released,
    /// Given back by its holder because a provider throttled it.
    Throttled,
    /// Dead-lettered by its holder.
    DeadLettered,
    /// Not renewed in time.
    Lapsed,
    /// Revoked by an operator.
    Revoked,
    /// Handed back to its member's restarted agent under a new epoch.
    Reclaimed,
    /// Handed again, under a new epoch, to a resuming agent that never heard of it.
    Redelivered,
    /// Ended because its cancel was pending when its member's agent restarted.
    Cancelled,
    /// Suspended by its holder until a resume or its timeout.
    Suspended,
}

impl LeaseEnd {
    /// Every outcome, for registering the series at zero.
    pub const ALL: [LeaseEnd; 11] = [
        LeaseEnd::Acked,
        LeaseEnd::Nacked,
        LeaseEnd::Released,
        LeaseEnd::Throttled,
        LeaseEnd::DeadLettered,
        LeaseEnd::Lapsed,
        LeaseEnd::Revoked,
        LeaseEnd::Reclaimed,
        LeaseEnd::Redelivered,
        LeaseEnd::Cancelled,
        LeaseEnd::Suspended,
    ];

    /// The `outcome` label.
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseEnd::Acked => "acked",
            LeaseEnd::Nacked => "nacked",
            LeaseEnd::Released => "released",
            LeaseEnd::Throttled => "throttled",
            LeaseEnd::DeadLettered => "dead_lettered",
            LeaseEnd::Lapsed => "lapsed",
            LeaseEnd::Revoked => "revoked",
            LeaseEnd::Reclaimed => "reclaimed",
            LeaseEnd::Redelivered => "redelivered",
            LeaseEnd::Cancelled => "cancelled",
            LeaseEnd::Suspended => "suspended",
        }
    }

    /// The counter this outcome moves besides the histogram, if it has one of its own
    /// (a dead letter counts in `muster_dead_lettered_total` by reason, a pending cancel
    /// in `muster_cancelled_total`, where the task's state changes).
    fn counter(self) -> Option<&'static str> {
        match self {
            LeaseEnd::Acked => Some("muster_acked_total"),
            LeaseEnd::Nacked => Some("muster_nacked_total"),
            LeaseEnd::Released => Some("muster_released_total"),
            LeaseEnd::Throttled => Some("muster_throttled_total"),
            LeaseEnd::Lapsed => Some("muster_lapsed_total"),
            LeaseEnd::Revoked => Some("muster_revoked_total"),
            LeaseEnd::Reclaimed => Some("muster_reclaimed_total"),
            LeaseEnd::Redelivered => Some("muster_redelivered_total"),
            LeaseEnd::Suspended => Some("muster_suspended_total"),
            LeaseEnd::DeadLettered | LeaseEnd::Cancelled => None,
        }
    }
}

/// Why a task went dead: the `reason` label of `muster_dead_lettered_total`, as the
/// task's `dead_reason` spells it.
pub const DEAD_REASONS: [&str; 3] = [DEAD_MAX_ATTEMPTS, DEAD_BY_AGENT, DEAD_SUSPEND_TIMED_OUT];
/// Out of attempts.
pub const DEAD_MAX_ATTEMPTS: &str = "max_attempts";
/// Dead-lettered by its holder.
pub const DEAD_BY_AGENT: &str = "dead_lettered";
/// Suspended past its timeout, whose `on_timeout` was `fail`.
pub const DEAD_SUSPEND_TIMED_OUT: &str = "suspend_timed_out";

/// Counters per queue without a further label.
const QUEUE_COUNTERS: [&str; 19] = [
    "muster_enqueued_total",
    "muster_leased_total",
    "muster_acked_total",
    "muster_nacked_total",
    "muster_released_total",
    "muster_throttled_total",
    "muster_lapsed_total",
    "muster_revoked_total",
    "muster_reclaimed_total",
    "muster_redelivered_total",
    "muster_cancelled_total",
    "muster_redriven_total",
    "muster_discarded_total",
    "muster_suspended_total",
    "muster_resumed_total",
    "muster_spawned_total",
    "muster_output_chunks_total",
    "muster_output_bytes_total",
    "muster_output_dropped_total",
];

/// Most members with series of their own (`muster_member_leases`,
/// `muster_member_capacity`): the first by name. The others are summed under
/// `member="_other"`, so totals stay right while the cardinality stays bounded.
pub const MAX_MEMBER_SERIES: usize = 100;

/// The `member` label of the members past [`MAX_MEMBER_SERIES`].
pub const OTHER_MEMBERS: &str = "_other";

/// Registers every series of a queue at zero.
pub fn queue_created(queue: &str) {
    for name in QUEUE_COUNTERS {
        counter!(name, "queue" => queue.to_owned()).increment(0);
    }
    counter!("muster_purged_total", "queue" => queue.to_owned()).increment(0);
    for reason in DEAD_REASONS {
        counter!("muster_dead_lettered_total", "queue" => queue.to_owned(), "reason" => reason)
            .increment(0);
    }
    for outcome in LeaseEnd::ALL {
        // Registering a histogram makes it rendered with zero counts.
        let _ = histogram!("muster_run_seconds", "queue" => queue.to_owned(), "outcome" => outcome.as_str());
    }
    let _ = histogram!("muster_queue_wait_seconds", "queue" => queue.to_owned());
}

/// Tasks enqueued.
pub fn enqueued(queue: &str) {
    counter!("muster_enqueued_total", "queue" => queue.to_owned()).increment(1);
}

/// A task leased (not a reclaim); `first_wait_ms` is how long it waited to be ready
/// and leased, on its first lease only.
pub fn leased(queue: &str, first_wait_ms: Option<u64>) {
    counter!("muster_leased_total", "queue" => queue.to_owned()).increment(1);
    if let Some(ms) = first_wait_ms {
        histogram!("muster_queue_wait_seconds", "queue" => queue.to_owned())
            .record(ms as f64 / 1000.0);
    }
}

/// Lease `lease` of task `id` (its record `rec`) ended at `now_ms` as `how`: its
/// counter and run time, and, when spans are exported and the task is in a trace, the
/// spans of the lease and of the task's wait in its queue before it.
pub fn lease_ended(id: Ulid, rec: &TaskRecord, lease: &LeaseRecord, how: LeaseEnd, now_ms: u64) {
    let queue = &rec.queue;
    if let Some(name) = how.counter() {
        counter!(name, "queue" => queue.to_owned()).increment(1);
    }
    histogram!("muster_run_seconds", "queue" => queue.to_owned(), "outcome" => how.as_str())
        .record(now_ms.saturating_sub(lease.granted_ms) as f64 / 1000.0);
    if crate::otlp::enabled() {
        lease_spans(id, rec, lease, how, now_ms);
    }
}

/// The spans of a lease that ended and of the wait before it, in the task's trace
/// (none for a task that carries no trace context).
fn lease_spans(id: Ulid, rec: &TaskRecord, lease: &LeaseRecord, how: LeaseEnd, now_ms: u64) {
    use crate::otlp::{LEASE_SPAN, QUEUED_SPAN, SpanRecord, record, span_id};
    use opentelemetry::KeyValue;
    let Some((trace_id, parent_id, flags)) =
        rec.traceparent.as_deref().and_then(crate::otlp::parse)
    else {
        return;
    };
    let mut attributes = vec![
        KeyValue::new("muster.task", id.to_string()),
        KeyValue::new("muster.queue", rec.queue.clone()),
        KeyValue::new("muster.epoch", lease.epoch as i64),
    ];
    if let Some(parent) = &rec.parent {
        attributes.push(KeyValue::new("muster.parent", parent.id.to_string()));
    }
    // It became ready at the event before this lease's `leased` (its enqueue, the
    // previous lease's end, a resume), or when its delay ran out if later.
    let leased_at = rec
        .history
        .iter()
        .rposition(|e| e.event == "leased" && e.epoch == Some(lease.epoch));
    let ready_ms = leased_at
        .and_then(|i| i.checked_sub(1))
        .map_or(rec.created_ms, |i| rec.history[i].at_ms)
        .max(rec.not_before_ms.unwrap_or(0))
        .min(lease.granted_ms);
    record(SpanRecord {
        name: QUEUED_SPAN,
        trace_id,
        parent_id,
        span_id: span_id(id, lease.epoch, true),
        flags,
        tracestate: rec.tracestate.clone(),
        start_ms: ready_ms,
        end_ms: lease.granted_ms,
        attributes: attributes.clone(),
    });
    attributes.extend([
        KeyValue::new("muster.member", lease.member.clone()),
        KeyValue::new("muster.attempt", lease.epoch as i64),
        KeyValue::new("muster.failures", rec.failures as i64),
        KeyValue::new("muster.outcome", how.as_str()),
    ]);
    record(SpanRecord {
        name: LEASE_SPAN,
        trace_id,
        parent_id,
        span_id: span_id(id, lease.epoch, false),
        flags,
        tracestate: rec.tracestate.clone(),
        start_ms: lease.granted_ms,
        end_ms: now_ms,
        attributes,
    });
}

/// A task went dead (logged at INFO).
pub fn dead(id: ulid::Ulid, queue: &str, reason: &'static str) {
    tracing::info!(task = %id, queue, reason, "task dead-lettered");
    debug_assert!(
        DEAD_REASONS.contains(&reason),
        "unknown dead reason {reason}"
    );
    counter!("muster_dead_lettered_total", "queue" => queue.to_owned(), "reason" => reason)
        .increment(1);
}

/// A task ended cancelled.
pub fn cancelled(queue: &str) {
    counter!("muster_cancelled_total", "queue" => queue.to_owned()).increment(1);
}

/// A suspended task made ready again (by a resume, or its timeout).
pub fn resumed(queue: &str) {
    counter!("muster_resumed_total", "queue" => queue.to_owned()).increment(1);
}

/// Children spawned into `queue` (not those a spawn found spawned before).
pub fn spawned(queue: &str) {
    counter!("muster_spawned_total", "queue" => queue.to_owned()).increment(1);
}

/// An emit stored `chunks` chunks of `bytes` bytes in `queue`, dropping `dropped`
/// older chunks to keep within its task's output limit.
pub fn emitted(queue: &str, chunks: u64, bytes: u64, dropped: u64) {
    counter!("muster_output_chunks_total", "queue" => queue.to_owned()).increment(chunks);
    counter!("muster_output_bytes_total", "queue" => queue.to_owned()).increment(bytes);
    if dropped > 0 {
        counter!("muster_output_dropped_total", "queue" => queue.to_owned()).increment(dropped);
    }
}

/// Tasks an operator redrove, discarded or purged (`what` is one of the counters).
pub fn repaired(queue: &str, what: Repair, count: usize) {
    let name = match what {
        Repair::Redriven => "muster_redriven_total",
        Repair::Discarded => "muster_discarded_total",
        Repair::Purged => "muster_purged_total",
    };
    counter!(name, "queue" => queue.to_owned()).increment(count as u64);
}

/// An operator's repair of many tasks.
#[derive(Debug, Clone, Copy)]
pub enum Repair {
    /// Dead tasks made ready again.
    Redriven,
    /// Dead tasks removed.
    Discarded,
    /// Ready and scheduled tasks removed by a purge.
    Purged,
}

/// Most schedules with series of their own: the first by name. The counters of the
/// others are summed under `schedule="_other"` (their next fires are not shown), so the
/// cardinality stays bounded however many schedules there are.
pub const MAX_SCHEDULE_SERIES: usize = 1000;

/// The `schedule` label of the schedules past [`MAX_SCHEDULE_SERIES`].
pub const OTHER_SCHEDULES: &str = "_other";

/// One schedule's counts, as its series show them.
pub struct ScheduleCounts {
    /// Its name.
    pub name: String,
    /// Fires that enqueued a task.
    pub fires: u64,
    /// Tasks `schedule_run` enqueued.
    pub runs: u64,
    /// Fires missed and skipped.
    pub missed: u64,
    /// Fires that enqueued nothing.
    pub failures: u64,
    /// Its next fire (wall ms), if it has one.
    pub next_fire_ms: Option<u64>,
}

/// What [`publish`] needs of the engine, read without a task scan.
pub struct Snapshot<'a> {
    /// Every queue with its counts.
    pub queues: Vec<QueueInfo>,
    /// Every known member.
    pub members: &'a [MemberInfo],
    /// Members connected and heard from.
    pub connected: usize,
    /// Members connected but silent past their liveness timeout.
    pub unreachable: usize,
    /// Every limit, with its busiest keys.
    pub limits: Vec<LimitInfo>,
    /// Every schedule's counts, by name.
    pub schedules: Vec<ScheduleCounts>,
    /// The wall clock, for ages.
    pub now_ms: u64,
}

/// Sets the gauges. Series of deleted queues and departed members are no longer set,
/// and the exporter drops them after `crate::metrics::GAUGE_IDLE_TIMEOUT`.
pub fn publish(s: &Snapshot<'_>) {
    debug_assert!(
        s.connected + s.unreachable <= s.members.len(),
        "connected and unreachable members are some of the members"
    );
    for q in &s.queues {
        let name = &q.name;
        for state in TaskState::ALL {
            gauge!("muster_tasks", "queue" => name.clone(), "state" => state.as_str())
                .set(q.counts.get(state) as f64);
        }
        let age = q
            .oldest_ready_ms
            .map_or(0.0, |at| s.now_ms.saturating_sub(at) as f64 / 1000.0);
        gauge!("muster_oldest_ready_age_seconds", "queue" => name.clone()).set(age);
        gauge!("muster_held_back_tasks", "queue" => name.clone()).set(q.held_back as f64);
        gauge!("muster_unclaimable_tasks", "queue" => name.clone()).set(q.unclaimable as f64);
        gauge!("muster_leases_in_flight", "queue" => name.clone())
            .set(q.counts.get(TaskState::Leased) as f64);
    }
    for l in &s.limits {
        let name = &l.name;
        gauge!("muster_limit_held", "limit" => name.clone()).set(l.held as f64);
        gauge!("muster_limit_waiting", "limit" => name.clone()).set(l.waiting as f64);
        gauge!("muster_limit_keys_in_use", "limit" => name.clone()).set(l.keys_in_use as f64);
        counter!("muster_limit_granted_total", "limit" => name.clone()).absolute(l.granted);
        counter!("muster_limit_throttled_total", "limit" => name.clone()).absolute(l.throttled);
        // The busiest keys only (`MAX_LISTED_LIMIT_KEYS`): a key that leaves them is no
        // longer set, and the exporter drops its series once idle.
        for k in &l.keys {
            let labels = [("limit", name.clone()), ("key", k.key.clone())];
            gauge!("muster_limit_key_held", &labels).set(k.held as f64);
            gauge!("muster_limit_key_waiting", &labels).set(k.waiting as f64);
            if let Some(tokens) = k.tokens {
                gauge!("muster_limit_key_tokens", &labels).set(tokens as f64);
            }
        }
    }
    publish_schedules(&s.schedules);
    gauge!("muster_members_connected").set(s.connected as f64);
    gauge!("muster_members_unreachable").set(s.unreachable as f64);
    let (mut other_leases, mut other_capacity) = (0u64, 0u64);
    for (n, m) in s.members.iter().enumerate() {
        if n < MAX_MEMBER_SERIES {
            gauge!("muster_member_leases", "member" => m.name.clone()).set(m.leased as f64);
            gauge!("muster_member_capacity", "member" => m.name.clone()).set(f64::from(m.capacity));
        } else {
            other_leases += m.leased;
            other_capacity += u64::from(m.capacity);
        }
    }
    if s.members.len() > MAX_MEMBER_SERIES {
        gauge!("muster_member_leases", "member" => OTHER_MEMBERS).set(other_leases as f64);
        gauge!("muster_member_capacity", "member" => OTHER_MEMBERS).set(other_capacity as f64);
    }
}

/// Sets the schedules' series: counters from the counts their records keep (they
/// survive restarts and failovers), the next fire as a Unix time in seconds (0 while
/// paused).
fn publish_schedules(schedules: &[ScheduleCounts]) {
    let mut other = [0u64; 4];
    for (n, c) in schedules.iter().enumerate() {
        let counts = [c.fires, c.runs, c.missed, c.failures];
        if n >= MAX_SCHEDULE_SERIES {
            for (sum, count) in other.iter_mut().zip(counts) {
                *sum += count;
            }
            continue;
        }
        for (name, count) in SCHEDULE_COUNTERS.iter().zip(counts) {
            counter!(*name, "schedule" => c.name.clone()).absolute(count);
        }
        gauge!("muster_schedule_next_fire_timestamp_seconds", "schedule" => c.name.clone())
            .set(c.next_fire_ms.map_or(0.0, |ms| ms as f64 / 1000.0));
    }
    if schedules.len() > MAX_SCHEDULE_SERIES {
        for (name, count) in SCHEDULE_COUNTERS.iter().zip(other) {
            counter!(*name, "schedule" => OTHER_SCHEDULES).absolute(count);
        }
    }
    gauge!("muster_schedules").set(schedules.len() as f64);
}

/// The counters of each schedule, in the order of [`ScheduleCounts`]' counts.
const SCHEDULE_COUNTERS: [&str; 4] = [
    "muster_schedule_fires_total",
    "muster_schedule_runs_total",
    "muster_schedule_missed_total",
    "muster_schedule_failures_total",
];
