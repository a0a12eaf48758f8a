//! Every limit of the protocol, by name. The daemon enforces each before doing the work.

use std::time::Duration;

/// Largest frame body in either direction. Big enough for a batch of small tasks or one
/// maximal payload with its envelope, small enough that a peer cannot make us buffer much.
pub const MAX_FRAME_BYTES: usize = 4 * 1024 * 1024;

/// Largest task payload (its JSON text).
pub const MAX_PAYLOAD_BYTES: usize = 1024 * 1024;

/// Largest result stored with an ack.
pub const MAX_RESULT_BYTES: usize = 1024 * 1024;

/// Largest progress checkpoint stored with a renewal.
pub const MAX_PROGRESS_BYTES: usize = 64 * 1024;

/// Largest error text stored with a nack or a dead-letter; longer texts are refused.
pub const MAX_ERROR_BYTES: usize = 8 * 1024;

/// Most tasks in one enqueue.
pub const MAX_BATCH: usize = 1000;

/// Most tasks one claim may ask for.
pub const MAX_CLAIM: u32 = 1000;

/// Payload bytes after which a claim stops adding tasks to its reply (it always
/// returns at least one): keeps a claim's reply well inside [`MAX_FRAME_BYTES`].
pub const MAX_CLAIM_REPLY_BYTES: usize = 2 * 1024 * 1024;

/// Most queues one claim may name.
pub const MAX_CLAIM_QUEUES: usize = 64;

/// Longest long-poll wait of a claim or a task wait.
pub const MAX_WAIT: Duration = Duration::from_secs(300);

/// Longest lease a claim or renewal may ask for.
pub const MAX_LEASE: Duration = Duration::from_secs(24 * 3600);

/// Shortest lease a claim, renewal or queue may ask for.
pub const MIN_LEASE: Duration = Duration::from_millis(100);

/// Longest delay of a nack or a delayed enqueue, and the furthest a task may be scheduled.
pub const MAX_DELAY: Duration = Duration::from_secs(365 * 24 * 3600);

/// Longest retention of finished tasks a queue may set.
pub const MAX_RETENTION: Duration = Duration::from_secs(365 * 24 * 3600);

/// Longest queue, member or idempotency-key name, and longest task key, in bytes.
pub const MAX_NAME_BYTES: usize = 128;

/// Most labels a member may carry or a task may require.
pub const MAX_LABELS: usize = 32;

/// Longest label, in bytes.
pub const MAX_LABEL_BYTES: usize = 64;

/// Most ids in one wait, redrive or discard request.
pub const MAX_IDS: usize = 1000;

/// Most tasks one page of `task_list` returns.
pub const MAX_PAGE: u32 = 1000;

/// Most tasks one `task_find` request examines by their in-memory index (state, key,
/// id): a search never holds the daemon's one dispatcher thread for long, whatever the
/// queue's size (about 10 ms on the machine of BENCHMARKS.md, so renewals served
/// meanwhile stay well under 50 ms); its cursor continues where it stopped.
pub const MAX_FIND_SCAN: u64 = 20_000;

/// Most task records one `task_find` request reads from the store (to match error text
/// or idempotency keys, and to build each match's summary): about 6 ms with payloads.
pub const MAX_FIND_READS: u64 = 1_000;

/// Longest text a `task_find` matches (error or payload text, a field's path).
pub const MAX_FIND_TEXT_BYTES: usize = 1024;

/// Most payload bytes one `task_find` request reads to match payload text or fields.
pub const MAX_FIND_PAYLOAD_BYTES: u64 = 4 * 1024 * 1024;

/// Most rows one page of a `watch` view holds (queues, tasks or members).
pub const MAX_WATCH_ROWS: u32 = 500;

/// Most watches open at once in the daemon (one per connection): each costs up to a
/// page of records read a second.
pub const MAX_WATCHES: usize = 64;

/// Shortest time between two pushes of one watch.
pub const WATCH_INTERVAL: Duration = Duration::from_secs(1);

/// Most events kept in a task's timeline; older ones are dropped, first excepted.
pub const MAX_HISTORY: usize = 32;

/// Most queues the daemon holds.
pub const MAX_QUEUES: usize = 10_000;

/// How long a `throttled` settle holds its limit back when it names no time.
pub const DEFAULT_THROTTLE: Duration = Duration::from_secs(1);

/// Longest reason a `suspend` gives people, in bytes.
pub const MAX_SUSPEND_REASON_BYTES: usize = 1024;

/// Longest a task may stay suspended before its timeout acts.
pub const MAX_SUSPEND_TIMEOUT: Duration = Duration::from_secs(365 * 24 * 3600);

/// How long a task stays suspended when its `suspend` names no timeout.
pub const DEFAULT_SUSPEND_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);

/// Largest data a `resume` hands the task's next holder (its JSON text).
pub const MAX_RESUME_DATA_BYTES: usize = 64 * 1024;

/// Longest resume token, in bytes (a longer one cannot be the daemon's).
pub const MAX_RESUME_TOKEN_BYTES: usize = 128;

/// Most children one task may spawn, over all its `spawn`s (the children still stored).
pub const MAX_CHILDREN: usize = 1000;

/// Most children one `spawn` carries.
pub const MAX_SPAWN: usize = MAX_CHILDREN;

/// Deepest a family goes: a task this many spawns below a task that is no child may
/// not spawn.
pub const MAX_DEPTH: u8 = 8;

/// Most bytes of a child's result and error that its waiting parent's next holder gets
/// with the child's outcome; a larger one is left out (`omitted`) and fetched by id.
pub const MAX_CHILD_OUTCOME_BYTES: usize = 4 * 1024;

/// Most bytes of results and errors all of a parent's child outcomes carry; past it,
/// the rest are left out (`omitted`).
pub const MAX_CHILD_OUTCOMES_BYTES: usize = 64 * 1024;

/// Bytes counted for the fields around a child outcome's strings (its id, key, queue,
/// result and error are counted as they are): what [`crate::model::Resumed::bytes`] adds
/// per child.
pub const CHILD_OUTCOME_OVERHEAD_BYTES: usize = 96;

/// The most bytes a `resumed` can count ([`crate::model::Resumed::bytes`]): its data,
/// and every child outcome's strings and overhead with the results and errors they
/// carry. A delivery's reply budget counts this for each delivery.
pub const MAX_RESUMED_BYTES: usize = MAX_RESUME_DATA_BYTES
    + MAX_CHILD_OUTCOMES_BYTES
    + MAX_CHILDREN * (26 + 2 * MAX_NAME_BYTES + CHILD_OUTCOME_OVERHEAD_BYTES);

/// Most limits the daemon holds.
pub const MAX_LIMITS: usize = 1_000;

/// Most limits one task may draw on.
pub const MAX_TASK_LIMITS: usize = 4;

/// Highest cost a task may take from a limit's bucket at its lease.
pub const MAX_LIMIT_COST: u64 = 1_000_000;

/// Most tokens a limit's rate may add per period, and the largest burst.
pub const MAX_LIMIT_TOKENS: u64 = 1_000_000_000;

/// Longest period of a limit's rate (one day).
pub const MAX_RATE_PERIOD: Duration = Duration::from_secs(24 * 3600);

/// Highest concurrency (leases held at once) a limit may set.
pub const MAX_LIMIT_CONCURRENCY: u32 = 1_000_000;

/// Most keys of a per-key limit that `limit_get` lists, the busiest first.
pub const MAX_LISTED_LIMIT_KEYS: usize = 10;

/// Most groups a queue names a weight for.
pub const MAX_GROUP_WEIGHTS: usize = 1_000;

/// Highest weight of a group in fair dispatch.
pub const MAX_GROUP_WEIGHT: u32 = 1_000;

/// Highest priority.
pub const MAX_PRIORITY: u8 = 9;

/// Highest key concurrency a queue may set.
pub const MAX_KEY_CONCURRENCY: u32 = 1000;

/// Highest capacity (most leases held at once) a member session may declare.
pub const MAX_CAPACITY: u32 = 1000;

/// Most leases a resuming agent may name in `session_open`'s `held`: its capacity's
/// worth running and as many finished but not settled yet.
pub const MAX_RESUME_HELD: usize = 2 * MAX_CAPACITY as usize;

/// How long a member session may be silent (no packet at all, keep-alive PINGs
/// included) before the daemon marks it unreachable, unless its `session_open` says
/// otherwise. Also the silence after which a parked claim is no longer served.
pub const DEFAULT_LIVENESS: Duration = Duration::from_secs(5);

/// Shortest liveness timeout a session may ask for.
pub const MIN_LIVENESS: Duration = Duration::from_secs(1);

/// Longest liveness timeout a session may ask for.
pub const MAX_LIVENESS: Duration = Duration::from_secs(60);

/// Most claims one connection may have parked (waiting for tasks) at once: a claim
/// with a wait sent while its connection has this many parked is refused with `limit`.
pub const MAX_PARKED_CLAIMS_PER_CONNECTION: usize = 64;

/// Most claims one principal (token name) may have parked at once over all its
/// connections, when tokens are configured: past it, `limit`.
pub const MAX_PARKED_CLAIMS_PER_PRINCIPAL: usize = 1024;

/// Most label classes (distinct `requires` sets) among one queue's scheduled, ready and
/// leased tasks: an enqueue that would add another is refused with `limit`. A pick
/// visits every class a claimer carries, so this bounds the work of a claim or push.
pub const MAX_LABEL_CLASSES: usize = 256;

/// Most of a queue's [`MAX_LABEL_CLASSES`] one token may bring (by enqueuing the first
/// unfinished task of a label set), so that one tenant cannot use them all up. A task
/// that requires nothing never counts.
pub const MAX_LABEL_CLASSES_PER_TOKEN: usize = 64;

/// Most label sets listed in a queue's `unclaimable_requires` (those holding the most
/// tasks); `unclaimable_sets` counts them all.
pub const MAX_LISTED_LABEL_SETS: usize = 16;

/// Bytes of listed items (tasks, queues, members) after which a page, a `wait` reply's
/// `finished` or a member's leases stop growing; at least one item is always listed
/// (a single task always fits a frame). What is left out is reachable by the page's
/// cursor (or, for `wait`, by `task_get`).
pub const MAX_LISTING_BYTES: usize = MAX_FRAME_BYTES - 256 * 1024;

/// Bytes of a task's progress checkpoint a summary carries (`task_get` has it whole):
/// enough for the counters a console shows (`{"step":3,"of":10}`), little next to the
/// 8 KiB an error may add to a summary.
pub const MAX_SUMMARY_PROGRESS_BYTES: usize = 256;

/// Deepest nesting of JSON arrays and objects in a frame. Deeper frames are refused
/// before they are parsed, so no parser recursion depends on what a peer sends.
pub const MAX_JSON_DEPTH: usize = 64;

/// Longest a `cluster_add` waits for the new node to catch up with the leader's log
/// before it gives up (the node stays a learner).
pub const CLUSTER_CATCH_UP: Duration = Duration::from_secs(60);

/// Longest a `cluster_add` may be asked to wait for the new node to catch up.
pub const MAX_CLUSTER_CATCH_UP: Duration = Duration::from_secs(3600);

/// Cuts `text` to at most `max_bytes` bytes, on a character boundary. Returns whether
/// anything was cut.
pub fn cut_to(text: &mut String, max_bytes: usize) -> bool {
    if text.len() <= max_bytes {
        return false;
    }
    let mut cut = max_bytes;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text.truncate(cut);
    true
}

/// Largest chunk of task output (`emit`): its text, or its JSON's bytes.
pub const MAX_CHUNK_BYTES: usize = 64 * 1024;

/// Most chunks one `emit` carries.
pub const MAX_EMIT_CHUNKS: usize = 1000;

/// Most bytes one `emit` stores: its chunks as JSON (`{"text":"…"}` with its escapes,
/// `{"json":…}`, a comma between them) and [`OUTPUT_PAGE_HEADER_BYTES`]. Any one chunk
/// of at most [`MAX_CHUNK_BYTES`] fits (escaped, a text is at most six times its bytes).
pub const MAX_EMIT_BYTES: usize = 512 * 1024;

/// Bytes an emit's chunks are stored with besides their JSON (the page's header).
pub const OUTPUT_PAGE_HEADER_BYTES: usize = 16;

/// Most bytes of output a task keeps, as stored (the emits' [`MAX_EMIT_BYTES`]
/// measure): an `emit` past it drops the task's oldest emits (whole) to make room, and
/// a follower is told how many chunks it missed.
pub const MAX_OUTPUT_BYTES: usize = 1024 * 1024;

/// Most emits a task keeps (each emit's chunks are stored together): past it the
/// oldest emit is dropped as past [`MAX_OUTPUT_BYTES`].
pub const MAX_OUTPUT_EMITS: usize = 1024;

/// Bytes of output per second a task may emit, on average: each emit's bytes as stored
/// are taken from a bucket of [`OUTPUT_BURST_BYTES`] that refills at this rate. An emit
/// that empties the bucket is stored, and its reply asks the holder to wait
/// (`wait_ms`) until the bucket is full enough again; an emit sent while the bucket is
/// empty is refused with `limit`.
pub const OUTPUT_RATE_BYTES: u64 = 256 * 1024;

/// The burst an emitter may send at once before [`OUTPUT_RATE_BYTES`] holds it back.
pub const OUTPUT_BURST_BYTES: u64 = 1024 * 1024;

// Any chunk fits an emit (escaped to six times its bytes, with its field's name), and
// any emit fits a task's output once the oldest emits made room.
const _: () = assert!(
    OUTPUT_PAGE_HEADER_BYTES + 2 + 6 * MAX_CHUNK_BYTES + 16 <= MAX_EMIT_BYTES
        && MAX_EMIT_BYTES <= MAX_OUTPUT_BYTES
);

/// Most descendants a watched task screen lists in its family tree (depth first; the
/// rest are left out, and the screen says so).
pub const MAX_TREE_NODES: usize = 256;

/// Most bytes of a task's last output chunks a watched task screen carries (as JSON;
/// at least its last chunk).
pub const WATCH_OUTPUT_BYTES: usize = 8 * 1024;

/// Most bytes of chunks one `follow` reply carries, as JSON (at least one chunk,
/// whatever its size).
pub const MAX_FOLLOW_BYTES: usize = 256 * 1024;

/// The most bytes a `follow` reply can take, what it reserves of its connection's
/// reply budget: its chunks ([`MAX_FOLLOW_BYTES`], or one chunk alone past it, whose
/// text JSON escapes to at most six times its bytes) and the reply's other fields.
pub const MAX_FOLLOW_REPLY_BYTES: usize = {
    let one_chunk = 6 * MAX_CHUNK_BYTES + 256;
    let chunks = if one_chunk > MAX_FOLLOW_BYTES {
        one_chunk
    } else {
        MAX_FOLLOW_BYTES
    };
    chunks + 1024
};

/// Longest `tracestate` a task carries (W3C Trace Context's own limit).
pub const MAX_TRACESTATE_BYTES: usize = 512;

/// Most schedules a daemon keeps (`schedule_set` of a new one past them: `limit`).
pub const MAX_SCHEDULES: usize = 10_000;

/// Longest schedule name: each task a schedule enqueues carries the idempotency key
/// `schedule:NAME:FIRE_MS` (or `schedule:NAME:run:NOW_MS` for `schedule_run`), which
/// must fit [`MAX_NAME_BYTES`] with 13 digits of milliseconds.
pub const MAX_SCHEDULE_NAME_BYTES: usize = 100;

/// Longest cron pattern.
pub const MAX_CRON_BYTES: usize = 256;

/// Longest time zone name (an IANA name such as `America/Argentina/ComodRivadavia`).
pub const MAX_TZ_BYTES: usize = 64;

/// A schedule's fire late by less than this (the daemon was restarting, a cluster was
/// electing a leader, a round was long) fires as if on time, whatever the schedule's
/// catch-up policy; one later than this was missed, and the policy says what happens.
pub const SCHEDULE_GRACE: Duration = Duration::from_secs(60);

/// Most fires one timer run makes (over every schedule); the rest fire in the next
/// run, at once.
pub const MAX_FIRES_PER_ROUND: usize = 1000;

/// Most missed fires one catch-up counts exactly; a schedule that missed more counts
/// this many for that catch-up (its `missed` says "at least").
pub const MAX_COUNTED_MISSES: u64 = 1000;

// A schedule's idempotency keys fit a task's: `schedule:` + name + `:run:` + 13 digits.
const _: () = assert!(9 + MAX_SCHEDULE_NAME_BYTES + 5 + 13 <= MAX_NAME_BYTES);

#[cfg(test)]
mod tests {
    use super::cut_to;

    #[test]
    fn cuts_on_a_character_boundary() {
        let mut short = "abc".to_owned();
        assert!(!cut_to(&mut short, 3));
        assert_eq!(short, "abc");
        let mut text = "aé".to_owned(); // 3 bytes; byte 2 is inside the é
        assert!(cut_to(&mut text, 2));
        assert_eq!(text, "a");
    }
}
