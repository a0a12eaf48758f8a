//! Cron schedules: the `schedule_*` ops and the timer that fires them.
//!
//! A schedule names a cron pattern (read by `croner`, in an IANA time zone from
//! `chrono-tz`'s compiled-in database, so every node of a cluster reads a pattern the
//! same way), a queue and a task. Each time the pattern names enqueues one task whose
//! idempotency key is `schedule:NAME:FIRE_MS`, in the same batch that moves the
//! schedule's cursor past that time: a fire and the record of it are one atomic change
//! (one round, one log entry on a cluster), so a restart or a failover neither repeats
//! a fire nor loses one that was acknowledged, and the key stops a repeat that would
//! come any other way (a schedule deleted and set again).
//!
//! Times late by less than [`SCHEDULE_GRACE`] fire as if on time, whatever the
//! schedule's catch-up policy: a restart or an election does not lose a fire. Times
//! later than that were missed: `skip` counts them, `once` enqueues one task for the
//! latest of them. Work per timer run is bounded: at most [`MAX_FIRES_PER_ROUND`]
//! fires, each catch-up counting at most [`MAX_COUNTED_MISSES`] missed times.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::str::FromStr;

use chrono::TimeZone;
use chrono_tz::Tz;
use croner::Cron;

use muster_protocol::limits::{
    MAX_COUNTED_MISSES, MAX_CRON_BYTES, MAX_FIRES_PER_ROUND, MAX_PAGE, MAX_SCHEDULES, MAX_TZ_BYTES,
    SCHEDULE_GRACE,
};
use muster_protocol::model::{CatchUp, EnqueuedTask, NewTask, ScheduleInfo};
use muster_protocol::ops::{
    Empty, Enqueue, ScheduleList, ScheduleListReply, ScheduleName, ScheduleReply, ScheduleRunReply,
    ScheduleSet,
};
use muster_protocol::{ErrorBody, ErrorCode, names};

use super::listing::fill;
use super::ops::{bad, check_new_tasks};
use super::{Engine, Failure, Now, OpResult, Waiter, client, telemetry};
use crate::auth::Principal;
use crate::store::{ScheduleRecord, StoreError};

/// The time zone of a schedule that names none.
pub const DEFAULT_TZ: &str = "UTC";

/// Every schedule, and the unpaused ones by their next fire. Invariant: `due` holds
/// exactly `(next, name)` of each schedule with a `next` ([`Schedules::check`]).
#[derive(Default)]
pub(super) struct Schedules {
    by_name: BTreeMap<String, Schedule>,
    /// Unpaused schedules by their next fire (wall ms).
    due: BTreeSet<(u64, String)>,
}

struct Schedule {
    rec: ScheduleRecord,
    pattern: Pattern,
    /// Its next fire: the pattern's first time after the cursor; `None` while paused
    /// (or if the pattern names no time after it, before the year 5000).
    next: Option<u64>,
}

/// A cron pattern read in its time zone.
struct Pattern {
    cron: Cron,
    tz: Tz,
}

impl Pattern {
    /// Reads a pattern and a time zone, each checked: a one-line reason if either is
    /// not one.
    fn parse(cron: &str, tz: &str) -> Result<Pattern, String> {
        if cron.len() > MAX_CRON_BYTES {
            return Err(format!(
                "a cron pattern is at most {MAX_CRON_BYTES} bytes, not {}",
                cron.len()
            ));
        }
        if tz.len() > MAX_TZ_BYTES {
            return Err(format!(
                "a time zone name is at most {MAX_TZ_BYTES} bytes, not {}",
                tz.len()
            ));
        }
        let parsed =
            Cron::from_str(cron).map_err(|e| format!("invalid cron pattern {cron:?}: {e}"))?;
        let zone = Tz::from_str(tz).map_err(|_| {
            format!("unknown time zone {tz:?}: want an IANA name such as Europe/Berlin or UTC")
        })?;
        Ok(Pattern {
            cron: parsed,
            tz: zone,
        })
    }

    /// The pattern's first time strictly after `after_ms`, if there is one.
    fn next_after(&self, after_ms: u64) -> Option<u64> {
        let at = self.tz.timestamp_millis_opt(after_ms as i64).single()?;
        let next = self.cron.find_next_occurrence(&at, false).ok()?;
        let ms = u64::try_from(next.timestamp_millis()).ok()?;
        debug_assert!(ms > after_ms, "a next time is after the time it follows");
        Some(ms)
    }

    /// The pattern's last time at or before `at_ms`, if there is one.
    fn last_at_or_before(&self, at_ms: u64) -> Option<u64> {
        let at = self.tz.timestamp_millis_opt(at_ms as i64).single()?;
        let last = self.cron.find_previous_occurrence(&at, true).ok()?;
        let ms = u64::try_from(last.timestamp_millis()).ok()?;
        debug_assert!(ms <= at_ms, "a last time is not after the time it precedes");
        Some(ms)
    }

    /// How many of the pattern's times lie in `from..=to` (`from` one of them),
    /// counting at most [`MAX_COUNTED_MISSES`].
    fn count(&self, from: u64, to: u64) -> u64 {
        let mut n = 0;
        let mut at = Some(from);
        while let Some(t) = at
            && t <= to
            && n < MAX_COUNTED_MISSES
        {
            n += 1;
            at = self.next_after(t);
        }
        n
    }
}

impl Schedules {
    fn insert(&mut self, name: &str, schedule: Schedule) {
        if let Some(old) = self.by_name.remove(name)
            && let Some(next) = old.next
        {
            let was_due = self.due.remove(&(next, name.to_owned()));
            assert!(was_due, "schedule {name}: its next fire was indexed");
        }
        if let Some(next) = schedule.next {
            self.due.insert((next, name.to_owned()));
        }
        self.by_name.insert(name.to_owned(), schedule);
    }

    fn remove(&mut self, name: &str) -> Option<Schedule> {
        let old = self.by_name.remove(name)?;
        if let Some(next) = old.next {
            let was_due = self.due.remove(&(next, name.to_owned()));
            assert!(was_due, "schedule {name}: its next fire was indexed");
        }
        Some(old)
    }

    /// The queue of schedule `name`, if there is one (for authorization).
    pub(super) fn queue_of(&self, name: &str) -> Option<&str> {
        self.by_name.get(name).map(|s| s.rec.queue.as_str())
    }

    /// The wall time of the next fire of any schedule.
    pub(super) fn next_fire(&self) -> Option<u64> {
        self.due.first().map(|(at, _)| *at)
    }

    /// Checks schedule `name`'s place in `due` (after each change of it).
    fn check_one(&self, name: &str) {
        let next = self.by_name.get(name).and_then(|s| s.next);
        assert!(
            next.is_none_or(|at| self.due.contains(&(at, name.to_owned()))),
            "schedule {name}: its next fire is indexed"
        );
        debug_assert!(
            self.due.len() <= self.by_name.len(),
            "at most one indexed fire per schedule"
        );
    }

    /// Checks `due` against every schedule (at start).
    fn check(&self) {
        debug_assert_eq!(
            self.due.len(),
            self.by_name.values().filter(|s| s.next.is_some()).count(),
            "every schedule with a next fire is indexed once"
        );
        debug_assert!(
            self.due
                .iter()
                .all(|(at, name)| self.by_name.get(name).and_then(|s| s.next) == Some(*at)),
            "each indexed fire is its schedule's next"
        );
    }

    /// How many schedules and fires due there are: what a refused request must leave
    /// as it was (debug builds).
    #[cfg(debug_assertions)]
    pub(super) fn digest(&self) -> usize {
        self.by_name.len() * 2 + self.due.len()
    }

    /// The counts the gauges show, by name.
    pub(super) fn counts(&self) -> Vec<telemetry::ScheduleCounts> {
        self.by_name
            .iter()
            .map(|(name, s)| telemetry::ScheduleCounts {
                name: name.clone(),
                fires: s.rec.fires,
                runs: s.rec.runs,
                missed: s.rec.missed,
                failures: s.rec.failures,
                next_fire_ms: s.next,
            })
            .collect()
    }

    /// A page of the schedules `principal` sees, after `cursor`, as shown.
    pub(super) fn page(
        &self,
        cursor: Option<&str>,
        limit: usize,
        principal: Option<&Principal>,
    ) -> (Vec<ScheduleInfo>, Option<String>) {
        let start = cursor.map_or(Bound::Unbounded, Bound::Excluded);
        let page = fill(
            self.by_name
                .range::<str, _>((start, Bound::Unbounded))
                .filter(|(_, s)| principal.is_none_or(|p| p.covers(&s.rec.queue)))
                .map(|(name, s)| Ok::<_, std::convert::Infallible>(info(name, s))),
            limit,
            |s| s.name.clone(),
        );
        let Ok(page) = page;
        (page.items, page.next)
    }
}

/// A schedule as shown.
fn info(name: &str, s: &Schedule) -> ScheduleInfo {
    let r = &s.rec;
    ScheduleInfo {
        name: name.to_owned(),
        cron: r.cron.clone(),
        tz: r.tz.clone(),
        queue: r.queue.clone(),
        task: r.task.clone(),
        catch_up: r.catch_up,
        paused: r.paused,
        next_fire_ms: s.next,
        last_fire_ms: r.last_fire_ms,
        last_task: r.last_task.clone(),
        fires: r.fires,
        runs: r.runs,
        missed: r.missed,
        failures: r.failures,
        last_error: r.last_error.clone(),
        created_ms: r.created_ms,
        updated_ms: r.updated_ms,
    }
}

/// A schedule built from its record: its pattern read, its next fire found.
fn schedule(rec: ScheduleRecord) -> Result<Schedule, String> {
    let pattern = Pattern::parse(&rec.cron, &rec.tz)?;
    Ok(with_pattern(rec, pattern))
}

/// A schedule of its record and its pattern (read from the record): its next fire found.
fn with_pattern(rec: ScheduleRecord, pattern: Pattern) -> Schedule {
    let next = if rec.paused {
        None
    } else {
        pattern.next_after(rec.cursor_ms)
    };
    Schedule { rec, pattern, next }
}

/// The idempotency key of the task a schedule's fire at `at_ms` enqueues.
fn fire_key(name: &str, at_ms: u64) -> String {
    format!("schedule:{name}:{at_ms}")
}

/// The idempotency key of the task `schedule_run` enqueues at `now_ms`.
fn run_key(name: &str, now_ms: u64) -> String {
    format!("schedule:{name}:run:{now_ms}")
}

/// Checks a schedule's task: an enqueue's task without what each fire sets.
fn check_template(task: &NewTask) -> OpResult<()> {
    if task.idempotency_key.is_some() {
        return Err(bad(
            "a schedule's task has no idempotency_key: each fire sets schedule:NAME:FIRE_MS",
        ));
    }
    if task.not_before_ms.is_some() {
        return Err(bad(
            "a schedule's task has no not_before_ms (delay_ms delays each fire's task)",
        ));
    }
    Ok(())
}

impl<W: Waiter> Engine<W> {
    /// Loads every stored schedule; its next fire is the pattern's first time after
    /// its cursor (the first timer run catches up on what the downtime passed).
    pub(super) fn load_schedules(&mut self) -> Result<(), StoreError> {
        for (name, rec) in self.store.load_schedules()? {
            let s = schedule(rec).map_err(|detail| StoreError::Corrupt {
                what: format!("schedule {name}"),
                detail,
            })?;
            self.schedules.insert(&name, s);
        }
        self.schedules.check();
        Ok(())
    }

    pub(super) fn schedule_set(
        &mut self,
        r: ScheduleSet,
        principal: Option<&Principal>,
        now: Now,
    ) -> OpResult<ScheduleReply> {
        names::check_schedule(&r.name).map_err(bad)?;
        let tz = r.tz.unwrap_or_else(|| DEFAULT_TZ.to_owned());
        let pattern = Pattern::parse(&r.cron, &tz).map_err(bad)?;
        check_template(&r.task)?;
        // The task must be one an enqueue would take (its fields and the limits it
        // names); label sets, quotas and the disk alarm are each fire's to meet.
        self.index.queue(&r.queue)?;
        let task = std::slice::from_ref(&r.task);
        let name = |_| "the schedule's task".to_owned();
        check_new_tasks(task, now, name)?;
        self.check_task_limits(task, name)?;
        let existing = self.schedules.by_name.get(&r.name);
        if existing.is_none() && self.schedules.by_name.len() >= MAX_SCHEDULES {
            return Err(client(
                ErrorCode::Limit,
                format!("the daemon holds {MAX_SCHEDULES} schedules, its most"),
            ));
        }
        let paused = r
            .paused
            .unwrap_or_else(|| existing.is_some_and(|s| s.rec.paused));
        // A new schedule, a changed pattern or time zone, or a resume fires from the
        // next time after now; a schedule whose times stay as they were keeps its place
        // (a time due in this round still fires, with the new task).
        let cursor_ms = match existing {
            Some(old) if old.rec.cron == r.cron && old.rec.tz == tz && old.rec.paused == paused => {
                old.rec.cursor_ms
            }
            Some(old) => old.rec.cursor_ms.max(now.wall_ms),
            None => now.wall_ms,
        };
        if !paused && pattern.next_after(cursor_ms).is_none() {
            return Err(bad(format!(
                "cron pattern {:?} names no time after now in {tz}",
                r.cron
            )));
        }
        let rec = match existing {
            Some(old) => ScheduleRecord {
                cron: r.cron,
                tz,
                queue: r.queue,
                task: r.task,
                catch_up: r.catch_up.unwrap_or(old.rec.catch_up),
                paused,
                cursor_ms,
                updated_ms: now.wall_ms,
                owner: principal.map(|p| p.name.clone()),
                ..old.rec.clone()
            },
            None => ScheduleRecord {
                cron: r.cron,
                tz,
                queue: r.queue,
                task: r.task,
                catch_up: r.catch_up.unwrap_or_default(),
                paused,
                cursor_ms,
                last_fire_ms: None,
                last_task: None,
                fires: 0,
                runs: 0,
                missed: 0,
                failures: 0,
                last_error: None,
                owner: principal.map(|p| p.name.clone()),
                created_ms: now.wall_ms,
                updated_ms: now.wall_ms,
            },
        };
        self.store_schedule(&r.name, rec);
        Ok(ScheduleReply {
            schedule: self.schedule_info(&r.name)?,
        })
    }

    pub(super) fn schedule_get(&self, r: &ScheduleName) -> OpResult<ScheduleReply> {
        Ok(ScheduleReply {
            schedule: self.schedule_info(&r.name)?,
        })
    }

    pub(super) fn schedule_list(
        &self,
        r: &ScheduleList,
        principal: Option<&Principal>,
    ) -> OpResult<ScheduleListReply> {
        let n = r.limit.unwrap_or(100);
        if !(1..=MAX_PAGE).contains(&n) {
            return Err(bad(format!("limit is 1 to {MAX_PAGE}")));
        }
        let (schedules, next) = self
            .schedules
            .page(r.after.as_deref(), n as usize, principal);
        Ok(ScheduleListReply { schedules, next })
    }

    /// Pauses (`pause`) or resumes a schedule. A resumed schedule fires from its
    /// pattern's next time after now.
    pub(super) fn schedule_pause(
        &mut self,
        r: &ScheduleName,
        pause: bool,
        now: Now,
    ) -> OpResult<ScheduleReply> {
        let s = self.schedule(&r.name)?;
        if s.rec.paused != pause {
            let mut rec = s.rec.clone();
            rec.paused = pause;
            rec.updated_ms = now.wall_ms;
            if !pause {
                rec.cursor_ms = rec.cursor_ms.max(now.wall_ms);
            }
            self.store_schedule(&r.name, rec);
        }
        self.schedule_get(r)
    }

    pub(super) fn schedule_delete(&mut self, r: &ScheduleName) -> OpResult<Empty> {
        self.schedule(&r.name)?;
        self.pending.remove_schedule(&r.name);
        self.schedules.remove(&r.name);
        self.schedules.check_one(&r.name);
        Ok(Empty {})
    }

    /// Enqueues a schedule's task now, once, as `principal`'s (its quota counts it):
    /// its fires go on as before.
    pub(super) fn schedule_run(
        &mut self,
        r: &ScheduleName,
        principal: Option<&Principal>,
        now: Now,
    ) -> OpResult<ScheduleRunReply> {
        let s = self.schedule(&r.name)?;
        let mut rec = s.rec.clone();
        let owner = principal.map(|p| p.name.as_str());
        let task = self
            .enqueue_for(&r.name, &rec, owner, run_key(&r.name, now.wall_ms), now)?
            .map_err(Failure::Client)?;
        rec.runs += 1;
        rec.last_task = Some(task.id.clone());
        self.store_schedule(&r.name, rec);
        Ok(ScheduleRunReply { task })
    }

    /// Fires every schedule due at `now`, at most [`MAX_FIRES_PER_ROUND`] fires (the
    /// rest at the next timer run, at once).
    pub(super) fn fire_schedules(&mut self, now: Now) -> Result<(), StoreError> {
        let grace = SCHEDULE_GRACE.as_millis() as u64;
        let mut fires = 0;
        while fires < MAX_FIRES_PER_ROUND
            && let Some((at, name)) = self.schedules.due.first().cloned()
            && at <= now.wall_ms
        {
            let s = &self.schedules.by_name[&name];
            let mut rec = s.rec.clone();
            assert!(!rec.paused, "schedule {name}: a paused schedule is not due");
            assert!(
                at > rec.cursor_ms,
                "schedule {name}: a fire is after the times dealt with"
            );
            let horizon = now.wall_ms.saturating_sub(grace);
            let fire_at = if at >= horizon {
                // On time, or late within the grace.
                Some(at)
            } else {
                // Missed: every time from `at` to the last one before the grace.
                let last = s
                    .pattern
                    .last_at_or_before(horizon)
                    .filter(|&t| t >= at)
                    .unwrap_or(at);
                let missed = s.pattern.count(at, last);
                rec.cursor_ms = last;
                match rec.catch_up {
                    CatchUp::Skip => {
                        rec.missed += missed;
                        None
                    }
                    CatchUp::Once => {
                        rec.missed += missed - 1;
                        Some(last)
                    }
                }
            };
            if let Some(fire_at) = fire_at {
                fires += 1;
                rec.cursor_ms = fire_at;
                let owner = rec.owner.clone();
                match self
                    .enqueue_for(&name, &rec, owner.as_deref(), fire_key(&name, fire_at), now)
                    .map_err(super::store_only)?
                {
                    Ok(task) => {
                        rec.fires += 1;
                        rec.last_fire_ms = Some(fire_at);
                        rec.last_task = Some(task.id);
                    }
                    Err(e) => {
                        let why = format!("{}: {}", e.code.as_str(), e.message);
                        tracing::warn!(schedule = %name, fire_ms = fire_at, error = %why, "a schedule's fire enqueued nothing");
                        rec.failures += 1;
                        rec.last_error = Some(why);
                    }
                }
            }
            self.store_schedule(&name, rec);
            self.commit()?;
        }
        Ok(())
    }

    /// Enqueues schedule `name`'s task as `owner`'s under idempotency key `key` (a
    /// duplicate when a task holds it already): the task, or why an enqueue of it would
    /// be refused (nothing changed). The outer error is the store's alone.
    fn enqueue_for(
        &mut self,
        name: &str,
        rec: &ScheduleRecord,
        owner: Option<&str>,
        key: String,
        now: Now,
    ) -> OpResult<Result<EnqueuedTask, ErrorBody>> {
        let mut task = rec.task.clone();
        task.idempotency_key = Some(key);
        let enqueue = Enqueue {
            queue: rec.queue.clone(),
            tasks: vec![task],
        };
        match self.check_enqueue(&enqueue, None, owner, 0, now) {
            Err(Failure::Client(e)) => return Ok(Err(e)),
            Err(f) => return Err(f),
            Ok(()) => {}
        }
        let t = &enqueue.tasks[0];
        if let Some(existing) = self.existing_by_key(&rec.queue, t, &[])? {
            return Ok(Ok(existing));
        }
        let (id, state) = self.store_new(&rec.queue, t, owner, None, now);
        tracing::debug!(schedule = name, task = %id, "schedule enqueued a task");
        Ok(Ok(EnqueuedTask {
            id: id.to_string(),
            duplicate: false,
            state,
        }))
    }

    /// Writes a schedule's record and indexes its next fire (its pattern read again only
    /// when its cron pattern or time zone changed: a fire keeps it).
    fn store_schedule(&mut self, name: &str, rec: ScheduleRecord) {
        self.pending.put_schedule(name, &rec);
        let kept = self
            .schedules
            .remove(name)
            .filter(|old| old.rec.cron == rec.cron && old.rec.tz == rec.tz)
            .map(|old| old.pattern);
        let s = match kept {
            Some(pattern) => Ok(with_pattern(rec, pattern)),
            None => schedule(rec),
        }
        .unwrap_or_else(|e| panic!("schedule {name}: a record the engine wrote reads back ({e})"));
        self.schedules.insert(name, s);
        self.schedules.check_one(name);
    }

    fn schedule(&self, name: &str) -> OpResult<&Schedule> {
        self.schedules
            .by_name
            .get(name)
            .ok_or_else(|| client(ErrorCode::NotFound, format!("no schedule {name}")))
    }

    fn schedule_info(&self, name: &str) -> OpResult<ScheduleInfo> {
        self.schedule(name).map(|s| info(name, s))
    }
}
