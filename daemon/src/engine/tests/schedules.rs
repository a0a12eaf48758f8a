//! Cron schedules: fires at the times their patterns name (in their time zones), one
//! task each under its key, across restarts with the catch-up policies, pause, resume,
//! runs, failures, bounds and authorization, with time driven by the test.

use muster_protocol::ErrorCode;
use muster_protocol::limits::{MAX_FIRES_PER_ROUND, MAX_SCHEDULES, SCHEDULE_GRACE};
use muster_protocol::model::{CatchUp, NewTask, QueuePatch, ScheduleInfo, TaskState};
use muster_protocol::ops::{
    EngineRequest, ScheduleGet, ScheduleList, ScheduleName, SchedulePause, ScheduleResume,
    ScheduleRun, ScheduleSet, TaskList, View, Watch, WatchUpdate,
};

use super::{Harness, principal, raw};
use crate::engine::Reply;

const MINUTE: u64 = 60_000;
const HOUR: u64 = 60 * MINUTE;
const DAY: u64 = 24 * HOUR;

/// The harness starts at 2027-01-15 08:00:00 UTC, on the minute and the hour.
const START: u64 = 1_800_000_000_000;

fn every(name: &str, cron: &str, queue: &str) -> ScheduleSet {
    ScheduleSet {
        name: name.into(),
        cron: cron.into(),
        tz: None,
        queue: queue.into(),
        task: NewTask::new(raw(r#"{"report":"daily"}"#)),
        catch_up: None,
        paused: None,
    }
}

fn set(h: &mut Harness, req: ScheduleSet) -> ScheduleInfo {
    let name = req.name.clone();
    match h.call(EngineRequest::ScheduleSet(Box::new(req))) {
        Ok(Reply::Schedule(r)) => r.schedule,
        other => panic!("schedule_set {name}: {other:?}"),
    }
}

fn get(h: &mut Harness, name: &str) -> ScheduleInfo {
    match h.call(EngineRequest::ScheduleGet(ScheduleGet(named(name)))) {
        Ok(Reply::Schedule(r)) => r.schedule,
        other => panic!("schedule_get {name}: {other:?}"),
    }
}

fn named(name: &str) -> ScheduleName {
    ScheduleName { name: name.into() }
}

/// The idempotency keys of a queue's tasks in a state, oldest first.
fn keys(h: &mut Harness, queue: &str, state: TaskState) -> Vec<String> {
    let ids = match h.call(EngineRequest::TaskList(TaskList {
        queue: queue.into(),
        state,
        after: None,
        limit: Some(1000),
    })) {
        Ok(Reply::TaskList(r)) => r.tasks.into_iter().map(|t| t.id).collect::<Vec<_>>(),
        other => panic!("task_list: {other:?}"),
    };
    ids.iter()
        .map(|id| {
            h.task(id)
                .idempotency_key
                .expect("a schedule's task has a key")
        })
        .collect()
}

/// Milliseconds until the engine's next timer.
fn timer(h: &mut Harness) -> Option<u64> {
    let now = h.now;
    h.engine().next_timer(now)
}

fn key(name: &str, at: u64) -> String {
    format!("schedule:{name}:{at}")
}

#[test]
fn a_schedule_fires_once_at_each_time_its_pattern_names_with_the_times_key() {
    let mut h = Harness::new();
    h.create("reports", QueuePatch::default());
    let s = set(&mut h, every("minutely", "* * * * *", "reports"));
    assert_eq!(s.tz, "UTC");
    assert_eq!(s.catch_up, CatchUp::Skip);
    assert!(!s.paused);
    assert_eq!(
        s.next_fire_ms,
        Some(START + MINUTE),
        "the first time after now"
    );
    assert_eq!((s.fires, s.runs, s.missed, s.failures), (0, 0, 0, 0));
    assert_eq!(timer(&mut h), Some(MINUTE));

    h.advance(MINUTE - 1);
    assert_eq!(h.counts("reports")[1], 0, "nothing before its time");
    h.advance(1);
    assert_eq!(
        keys(&mut h, "reports", TaskState::Ready),
        [key("minutely", START + MINUTE)]
    );
    let s = get(&mut h, "minutely");
    assert_eq!(s.fires, 1);
    assert_eq!(s.last_fire_ms, Some(START + MINUTE));
    assert_eq!(s.next_fire_ms, Some(START + 2 * MINUTE));
    let task = h.task(s.last_task.as_deref().unwrap());
    assert_eq!(task.payload.get(), r#"{"report":"daily"}"#);

    // More rounds at the same time fire nothing more.
    h.advance(0);
    h.advance(MINUTE / 2);
    assert_eq!(h.counts("reports")[1], 1);
    h.advance(MINUTE / 2);
    assert_eq!(
        keys(&mut h, "reports", TaskState::Ready),
        [
            key("minutely", START + MINUTE),
            key("minutely", START + 2 * MINUTE)
        ]
    );
    assert_eq!(get(&mut h, "minutely").fires, 2);
}

#[test]
fn six_fields_fire_by_the_second_and_a_late_round_fires_each_time_within_the_grace() {
    let mut h = Harness::new();
    h.create("ticks", QueuePatch::default());
    set(&mut h, every("ten", "*/10 * * * * *", "ticks"));
    h.advance(10_000);
    assert_eq!(h.counts("ticks")[1], 1);
    // The dispatcher was held up for 35 s: the three times it passed fire, in order.
    h.advance(35_000);
    assert_eq!(
        keys(&mut h, "ticks", TaskState::Ready),
        [10, 20, 30, 40].map(|s| key("ten", START + s * 1000))
    );
    let s = get(&mut h, "ten");
    assert_eq!((s.fires, s.missed), (4, 0));
    assert_eq!(s.next_fire_ms, Some(START + 50_000));
}

#[test]
fn a_pattern_is_read_in_its_time_zone() {
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    // 08:00 UTC is 09:00 in Berlin in January (CET): 9 o'clock Berlin is tomorrow's.
    let berlin = set(
        &mut h,
        ScheduleSet {
            tz: Some("Europe/Berlin".into()),
            ..every("berlin", "0 9 * * *", "q")
        },
    );
    assert_eq!(berlin.tz, "Europe/Berlin");
    assert_eq!(berlin.next_fire_ms, Some(START + DAY));
    // 9 o'clock in New York (EST, UTC-5) is 14:00 UTC.
    let ny = set(
        &mut h,
        ScheduleSet {
            tz: Some("America/New_York".into()),
            ..every("ny", "0 9 * * *", "q")
        },
    );
    assert_eq!(ny.next_fire_ms, Some(START + 6 * HOUR));
    let utc = set(&mut h, every("utc", "0 9 * * *", "q"));
    assert_eq!(utc.next_fire_ms, Some(START + HOUR));
    // Aliases, and croner's last-day-of-month.
    assert_eq!(
        set(&mut h, every("hourly", "@hourly", "q")).next_fire_ms,
        Some(START + HOUR)
    );
    // 2027-01-31 00:00 UTC.
    assert_eq!(
        set(&mut h, every("month-end", "0 0 L * *", "q")).next_fire_ms,
        Some(1_801_353_600_000)
    );
}

#[test]
fn across_daylight_saving_a_fixed_time_fires_once_a_day() {
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    let berlin = |name: &str| ScheduleSet {
        tz: Some("Europe/Berlin".into()),
        ..every(name, "30 2 * * *", "q")
    };
    // 2027-03-28: 02:00 CET jumps to 03:00 CEST, so 02:30 does not exist: it fires at
    // the first moment after the gap, 03:00 CEST (01:00 UTC).
    h.now.wall_ms = 1_806_148_800_000; // 2027-03-27 12:00 UTC
    assert_eq!(
        set(&mut h, berlin("spring")).next_fire_ms,
        Some(1_806_195_600_000)
    );
    // 2027-10-31: 03:00 CEST falls back to 02:00 CET, so 02:30 comes twice: it fires at
    // the first (00:30 UTC), and next on 2027-11-01 at 02:30 CET (01:30 UTC).
    h.now.wall_ms = 1_824_897_600_000; // 2027-10-30 12:00 UTC
    h.round();
    assert_eq!(
        set(&mut h, berlin("autumn")).next_fire_ms,
        Some(1_824_942_600_000)
    );
    h.call(EngineRequest::ScheduleDelete(
        muster_protocol::ops::ScheduleDelete(named("spring")),
    ))
    .unwrap();
    h.advance(1_824_942_600_000 - h.now.wall_ms);
    let s = get(&mut h, "autumn");
    assert_eq!(s.fires, 1);
    assert_eq!(s.next_fire_ms, Some(1_825_032_600_000));
    h.advance(HOUR);
    assert_eq!(
        get(&mut h, "autumn").fires,
        1,
        "not again in the repeated hour"
    );
}

#[test]
fn a_restart_neither_repeats_a_fire_nor_loses_one_within_the_grace() {
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    set(&mut h, every("m", "* * * * *", "q"));
    h.advance(MINUTE);
    // Down for 110 s across the next time: it fires, 50 s late, at the start.
    h.restart(110_000);
    h.round();
    assert_eq!(
        keys(&mut h, "q", TaskState::Ready),
        [key("m", START + MINUTE), key("m", START + 2 * MINUTE)]
    );
    let s = get(&mut h, "m");
    assert_eq!((s.fires, s.missed), (2, 0));
    assert_eq!(s.next_fire_ms, Some(START + 3 * MINUTE));
    // A restart with nothing due fires nothing.
    h.restart(0);
    h.round();
    assert_eq!(h.counts("q")[1], 2);
}

#[test]
fn times_missed_past_the_grace_are_skipped_and_counted_or_run_once() {
    for (policy, expected_missed) in [(CatchUp::Skip, 179), (CatchUp::Once, 178)] {
        let mut h = Harness::new();
        h.create("q", QueuePatch::default());
        set(
            &mut h,
            ScheduleSet {
                catch_up: Some(policy),
                ..every("m", "* * * * *", "q")
            },
        );
        // Down three hours and half a minute: 180 times passed, all but the last (30 s
        // ago, within the grace) missed.
        h.restart(3 * HOUR + 30_000);
        h.round();
        let now = START + 3 * HOUR + 30_000;
        let grace = SCHEDULE_GRACE.as_millis() as u64;
        let last_missed = START + 3 * HOUR - MINUTE;
        assert!(last_missed < now - grace && START + 3 * HOUR >= now - grace);
        let mut expected = Vec::new();
        if policy == CatchUp::Once {
            expected.push(key("m", last_missed));
        }
        expected.push(key("m", START + 3 * HOUR));
        assert_eq!(keys(&mut h, "q", TaskState::Ready), expected, "{policy:?}");
        let s = get(&mut h, "m");
        assert_eq!(s.missed, expected_missed, "{policy:?}");
        assert_eq!(s.fires, expected.len() as u64);
        assert_eq!(s.last_fire_ms, Some(START + 3 * HOUR));
        assert_eq!(s.next_fire_ms, Some(START + 3 * HOUR + MINUTE));
    }
}

#[test]
fn a_paused_schedule_does_not_fire_and_resumes_from_its_next_time_after_now() {
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    set(&mut h, every("m", "* * * * *", "q"));
    let paused = match h.call(EngineRequest::SchedulePause(SchedulePause(named("m")))) {
        Ok(Reply::Schedule(r)) => r.schedule,
        other => panic!("pause: {other:?}"),
    };
    assert!(paused.paused);
    assert_eq!(paused.next_fire_ms, None);
    assert_eq!(timer(&mut h), None, "no timer for a paused schedule");
    h.advance(5 * MINUTE + 1);
    assert_eq!(h.counts("q")[1], 0);
    let resumed = match h.call(EngineRequest::ScheduleResume(ScheduleResume(named("m")))) {
        Ok(Reply::Schedule(r)) => r.schedule,
        other => panic!("resume: {other:?}"),
    };
    assert!(!resumed.paused);
    assert_eq!(resumed.next_fire_ms, Some(START + 6 * MINUTE));
    assert_eq!(
        resumed.missed, 0,
        "times passed while paused are not missed"
    );
    h.advance(MINUTE);
    assert_eq!(
        keys(&mut h, "q", TaskState::Ready),
        [key("m", START + 6 * MINUTE)]
    );
    // Created paused, and a replaced schedule keeps its state when the request is silent.
    set(
        &mut h,
        ScheduleSet {
            paused: Some(true),
            ..every("p", "* * * * *", "q")
        },
    );
    let again = set(&mut h, every("p", "*/2 * * * *", "q"));
    assert!(again.paused);
    assert_eq!(again.cron, "*/2 * * * *");
}

#[test]
fn a_replaced_task_goes_with_the_next_fire_and_a_new_pattern_starts_after_now() {
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    set(&mut h, every("m", "* * * * *", "q"));
    h.advance(MINUTE);
    // A new task, same times: due times keep their place (a fire due but not yet run
    // in this round would still run, with the new task).
    let same = set(
        &mut h,
        ScheduleSet {
            task: NewTask::new(raw(r#"{"report":"weekly"}"#)),
            ..every("m", "* * * * *", "q")
        },
    );
    assert_eq!(same.next_fire_ms, Some(START + 2 * MINUTE));
    assert_eq!(
        (same.fires, same.created_ms),
        (1, START),
        "counts carry over"
    );
    h.advance(MINUTE);
    let s = get(&mut h, "m");
    let task = h.task(s.last_task.as_deref().unwrap());
    assert_eq!(task.payload.get(), r#"{"report":"weekly"}"#);
    // A new pattern fires from its next time after now.
    h.advance(30_000);
    let changed = set(&mut h, every("m", "*/5 * * * *", "q"));
    assert_eq!(changed.next_fire_ms, Some(START + 5 * MINUTE));
    assert_eq!(changed.updated_ms, START + 2 * MINUTE + 30_000);
}

#[test]
fn a_run_enqueues_now_once_under_its_own_key_and_leaves_the_fires_alone() {
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    set(
        &mut h,
        ScheduleSet {
            paused: Some(true),
            ..every("m", "* * * * *", "q")
        },
    );
    let run = |h: &mut Harness| match h.call(EngineRequest::ScheduleRun(ScheduleRun(named("m")))) {
        Ok(Reply::ScheduleRun(r)) => r.task,
        other => panic!("run: {other:?}"),
    };
    let first = run(&mut h);
    assert!(!first.duplicate);
    assert_eq!(first.state, TaskState::Ready);
    // The same millisecond: the same key, the same task.
    let again = run(&mut h);
    assert!(again.duplicate);
    assert_eq!(again.id, first.id);
    assert_eq!(
        keys(&mut h, "q", TaskState::Ready),
        [format!("schedule:m:run:{START}")]
    );
    let s = get(&mut h, "m");
    assert_eq!((s.fires, s.runs), (0, 2));
    assert_eq!(s.last_task, Some(first.id));
    assert_eq!(s.last_fire_ms, None);
    assert!(s.paused);
}

#[test]
fn a_fire_that_cannot_enqueue_is_counted_with_its_reason_and_the_next_one_goes_on() {
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    set(&mut h, every("m", "* * * * *", "q"));
    h.engine().set_disk_alarm(true);
    h.advance(MINUTE);
    let s = get(&mut h, "m");
    assert_eq!((s.fires, s.failures), (0, 1));
    assert!(
        s.last_error
            .as_deref()
            .unwrap()
            .starts_with("disk_full: the disk alarm is on"),
        "{:?}",
        s.last_error
    );
    assert_eq!(s.next_fire_ms, Some(START + 2 * MINUTE), "not retried");
    // A run is refused like the enqueue it is.
    assert_eq!(
        h.code(EngineRequest::ScheduleRun(ScheduleRun(named("m")))),
        ErrorCode::DiskFull
    );
    h.engine().set_disk_alarm(false);
    h.advance(MINUTE);
    assert_eq!(
        keys(&mut h, "q", TaskState::Ready),
        [key("m", START + 2 * MINUTE)]
    );
    let s = get(&mut h, "m");
    assert_eq!((s.fires, s.failures), (1, 1));
    assert_eq!(s.last_error.as_deref().map(|e| &e[..9]), Some("disk_full"));
}

#[test]
fn bad_schedules_are_refused_and_change_nothing() {
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    let refused = |h: &mut Harness, req: ScheduleSet| match h
        .call(EngineRequest::ScheduleSet(Box::new(req)))
    {
        Err(e) => (e.code, e.message),
        Ok(r) => panic!("expected a refusal, got {r:?}"),
    };
    let cases: Vec<(ScheduleSet, ErrorCode, &str)> = vec![
        (
            every("m", "61 * * * *", "q"),
            ErrorCode::BadRequest,
            "invalid cron pattern \"61 * * * *\"",
        ),
        (
            every("m", "every day", "q"),
            ErrorCode::BadRequest,
            "invalid cron pattern",
        ),
        (
            ScheduleSet {
                tz: Some("Mars/Olympus".into()),
                ..every("m", "* * * * *", "q")
            },
            ErrorCode::BadRequest,
            "unknown time zone \"Mars/Olympus\"",
        ),
        (
            every("M", "* * * * *", "q"),
            ErrorCode::BadRequest,
            "invalid schedule name \"M\"",
        ),
        (
            every(&"a".repeat(101), "* * * * *", "q"),
            ErrorCode::BadRequest,
            "invalid schedule name",
        ),
        (
            every("m", "* * * * *", "nope"),
            ErrorCode::NotFound,
            "no queue \"nope\"",
        ),
        (
            every("m", "0 0 30 2 *", "q"),
            ErrorCode::BadRequest,
            "cron pattern \"0 0 30 2 *\" names no time after now in UTC",
        ),
        (
            ScheduleSet {
                task: NewTask {
                    idempotency_key: Some("k".into()),
                    ..NewTask::new(raw("1"))
                },
                ..every("m", "* * * * *", "q")
            },
            ErrorCode::BadRequest,
            "a schedule's task has no idempotency_key",
        ),
        (
            ScheduleSet {
                task: NewTask {
                    not_before_ms: Some(START + 1),
                    ..NewTask::new(raw("1"))
                },
                ..every("m", "* * * * *", "q")
            },
            ErrorCode::BadRequest,
            "a schedule's task has no not_before_ms",
        ),
        (
            ScheduleSet {
                task: NewTask {
                    priority: Some(10),
                    ..NewTask::new(raw("1"))
                },
                ..every("m", "* * * * *", "q")
            },
            ErrorCode::BadRequest,
            "the schedule's task: priority is 0..=9",
        ),
        (
            every("m", &"*".repeat(257), "q"),
            ErrorCode::BadRequest,
            "a cron pattern is at most 256 bytes",
        ),
    ];
    for (req, code, message) in cases {
        let what = format!("{} {:?}", req.name, req.cron);
        let (got, text) = refused(&mut h, req);
        assert_eq!(got, code, "{what}: {text}");
        assert!(text.starts_with(message), "{what}: {text}");
    }
    for missing in ["get", "pause", "resume", "delete", "run"] {
        let n = named("ghost");
        let req = match missing {
            "get" => EngineRequest::ScheduleGet(ScheduleGet(n)),
            "pause" => EngineRequest::SchedulePause(SchedulePause(n)),
            "resume" => EngineRequest::ScheduleResume(ScheduleResume(n)),
            "delete" => EngineRequest::ScheduleDelete(muster_protocol::ops::ScheduleDelete(n)),
            _ => EngineRequest::ScheduleRun(ScheduleRun(n)),
        };
        assert_eq!(h.code(req), ErrorCode::NotFound, "{missing}");
    }
    assert_eq!(list(&mut h, None).0.len(), 0);
    assert_eq!(timer(&mut h), None);
}

fn list(h: &mut Harness, after: Option<&str>) -> (Vec<String>, Option<String>) {
    match h.call(EngineRequest::ScheduleList(ScheduleList {
        after: after.map(str::to_owned),
        limit: Some(2),
    })) {
        Ok(Reply::ScheduleList(r)) => (r.schedules.into_iter().map(|s| s.name).collect(), r.next),
        other => panic!("schedule_list: {other:?}"),
    }
}

#[test]
fn schedules_list_by_name_a_page_at_a_time_and_delete_leaves_their_tasks() {
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    for name in ["c", "a", "b"] {
        set(&mut h, every(name, "* * * * *", "q"));
    }
    assert_eq!(
        list(&mut h, None),
        (vec!["a".into(), "b".into()], Some("b".into()))
    );
    assert_eq!(list(&mut h, Some("b")), (vec!["c".into()], None));
    h.advance(MINUTE);
    assert_eq!(h.counts("q")[1], 3);
    for name in ["a", "b"] {
        assert!(matches!(
            h.call(EngineRequest::ScheduleDelete(
                muster_protocol::ops::ScheduleDelete(named(name))
            )),
            Ok(Reply::Empty(_))
        ));
    }
    h.advance(MINUTE);
    assert_eq!(
        h.counts("q")[1],
        4,
        "only c fired again; the tasks of a and b stay"
    );
    assert_eq!(list(&mut h, None), (vec!["c".into()], None));
    // A restart reads the schedules back.
    h.restart(0);
    assert_eq!(list(&mut h, None), (vec!["c".into()], None));
    assert_eq!(get(&mut h, "c").fires, 2);
}

#[test]
fn one_timer_run_fires_at_most_its_bound_and_the_rest_fire_at_once_after() {
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    let n = MAX_FIRES_PER_ROUND + 200;
    for i in 0..n {
        set(&mut h, every(&format!("s{i:05}"), "* * * * *", "q"));
    }
    h.now.wall_ms += MINUTE;
    h.now.mono_ms += MINUTE;
    let now = h.now;
    h.engine().tick(now).unwrap();
    let ready = |h: &mut Harness| h.engine().index.queues["q"].ids(TaskState::Ready).len();
    assert_eq!(ready(&mut h), MAX_FIRES_PER_ROUND);
    assert_eq!(timer(&mut h), Some(0), "the rest are due at once");
    h.round();
    assert_eq!(h.counts("q")[1], n as u64);
    assert_eq!(timer(&mut h), Some(MINUTE));
}

#[test]
fn a_daemon_holds_at_most_its_schedules() {
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    for i in 0..MAX_SCHEDULES {
        set(
            &mut h,
            ScheduleSet {
                paused: Some(true),
                ..every(&format!("s{i}"), "* * * * *", "q")
            },
        );
    }
    assert_eq!(
        h.code(EngineRequest::ScheduleSet(Box::new(every(
            "one-more",
            "* * * * *",
            "q"
        )))),
        ErrorCode::Limit
    );
    // Replacing one is not a new one.
    set(&mut h, every("s0", "*/5 * * * *", "q"));
}

const TOKENS: &str = r#"
[[tokens]]
name = "ops-a"
token = "ops-a-token-0123456789ab"
roles = ["admin"]
queues = ["a-*"]

[[tokens]]
name = "feeder"
token = "feeder-token-0123456789ab"
roles = ["produce"]
queues = ["a-*"]
"#;

#[test]
fn a_schedule_is_its_queues_to_set_steer_and_see() {
    let ops_a = principal(TOKENS, "ops-a-token-0123456789ab");
    let feeder = principal(TOKENS, "feeder-token-0123456789ab");
    let mut h = Harness::new();
    h.create("a-jobs", QueuePatch::default());
    h.create("b-jobs", QueuePatch::default());
    set(&mut h, every("b-nightly", "0 0 * * *", "b-jobs"));
    h.principal = Some(ops_a);
    set(&mut h, every("a-hourly", "0 * * * *", "a-jobs"));
    let forbidden = [
        EngineRequest::ScheduleSet(Box::new(every("x", "* * * * *", "b-jobs"))),
        // Moving another queue's schedule into one's own.
        EngineRequest::ScheduleSet(Box::new(every("b-nightly", "* * * * *", "a-jobs"))),
        EngineRequest::SchedulePause(SchedulePause(named("b-nightly"))),
        EngineRequest::ScheduleRun(ScheduleRun(named("b-nightly"))),
        EngineRequest::ScheduleGet(ScheduleGet(named("b-nightly"))),
    ];
    for req in forbidden {
        let op = req.name();
        assert_eq!(h.code(req), ErrorCode::Forbidden, "{op}");
    }
    assert_eq!(list(&mut h, None), (vec!["a-hourly".into()], None));
    h.principal = Some(feeder);
    assert_eq!(
        h.code(EngineRequest::SchedulePause(SchedulePause(named(
            "a-hourly"
        )))),
        ErrorCode::Forbidden
    );
    assert_eq!(
        h.code(EngineRequest::ScheduleSet(Box::new(every(
            "y",
            "* * * * *",
            "a-jobs"
        )))),
        ErrorCode::Forbidden
    );
    assert!(matches!(
        h.call(EngineRequest::ScheduleRun(ScheduleRun(named("a-hourly")))),
        Ok(Reply::ScheduleRun(_))
    ));
    assert_eq!(get(&mut h, "a-hourly").runs, 1);
    // A run counts against the quota of who asked for it, each fire against the
    // principal that set the schedule.
    let stored = |h: &mut Harness, who: &str| h.engine().budget.stored_bytes.get(who).copied();
    let run = stored(&mut h, "feeder").expect("the run's task counts for the feeder");
    assert_eq!(stored(&mut h, "ops-a"), None);
    h.principal = None;
    h.advance(HOUR);
    let fire = stored(&mut h, "ops-a").expect("the fire's task counts for its setter");
    assert!(fire > r#"{"report":"daily"}"#.len() as u64);
    assert_eq!(stored(&mut h, "feeder"), Some(run));
}

#[test]
fn the_schedules_screen_shows_each_schedule_with_its_next_fire() {
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    set(&mut h, every("m", "* * * * *", "q"));
    let update = match h.call(EngineRequest::Watch(Watch {
        view: View::Schedules {
            after: None,
            limit: None,
        },
        tag: 3,
    })) {
        Ok(Reply::Watch(r)) => r.update,
        other => panic!("watch: {other:?}"),
    };
    let WatchUpdate::Schedules { schedules, next } = update else {
        panic!("a schedules screen");
    };
    assert_eq!(next, None);
    assert_eq!(schedules.len(), 1);
    assert_eq!(schedules[0].next_fire_ms, Some(START + MINUTE));
    // A fire moves the screen along.
    h.advance(MINUTE);
    let pushed = h.pushed(0);
    let Some(muster_protocol::Push::Watch(w)) = pushed.last() else {
        panic!("a watch push: {pushed:?}");
    };
    let WatchUpdate::Schedules { schedules, .. } = &w.update else {
        panic!("a schedules screen: {:?}", w.update);
    };
    assert_eq!(
        (schedules[0].fires, schedules[0].next_fire_ms),
        (1, Some(START + 2 * MINUTE))
    );
}
