//! Limits: named budgets that tasks of any queue draw on, and the lines where ready
//! tasks wait for their room.
//!
//! A limit is a token bucket (a rate and a burst), a cap on leases held at once (a
//! concurrency), or both; shared by every task that names it, or per key (each key its
//! own bucket and count, with the limit's settings). A task names the limits it draws
//! on at enqueue, with a key and a cost each ([`Use`]). It is leased only while every
//! limit it names has room for it: tokens ≥ its cost and held leases < concurrency.
//! Leasing takes the tokens ([`Limits::take`]); the held count follows the leased
//! tasks themselves ([`Limits::hold`], [`Limits::release`]), so a slot comes back with
//! whatever ends a lease. Tokens never come back.
//!
//! **Buckets start empty**: at start-up (a restart, or a cluster node taking the lead)
//! and when a limit is created, every bucket of it holds no token and fills at its
//! rate. So no restart or failover lets a burst through that was already spent: over
//! any interval T the cost granted on a bucket is at most `burst + rate × T`. A bucket
//! is kept in memory only while it is below full (and up to [`IDLE_SWEEP_MS`] after it
//! filled), or has tasks waiting or admitted; a bucket not kept is full (or, before it
//! could have filled since the start, holds what it gathered since). A key's count of
//! leases held is kept beside its bucket ([`Slots`]) while leases hold it.
//!
//! **Lines.** A ready task whose limits lack room does not sit among the dispatchable
//! tasks (where it would block those behind it): it waits in its queue's line of the
//! bucket that lacks room, in dispatch order. When the bucket's room grows (tokens
//! refill, a lease ends, the limit changes), the line's first tasks are admitted while
//! they fit: they become dispatchable, and their cost is charged to the line, so a line
//! admits no more than the room it sees. Admission does not reserve: a task admitted
//! by one queue's line may find its room taken by another queue's lease by the time it
//! is picked; the pick then checks exactly ([`Limits::grantable`]) and sends it back to
//! its line. A queue with no claimers keeps only its own line's admitted tasks, never
//! the room of other queues' lines. A bucket with waiting tasks has a timer at the time
//! its first waiting task will fit, so a task is handed out in the dispatcher's round
//! its bucket refills.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use smallvec::SmallVec;
use ulid::Ulid;

use muster_protocol::model::{LimitInfo, LimitKeyInfo, LimitSpec, Rate};

use super::dispatch::Entry;
use crate::store::LimitRecord;
use lines::{Line, Lines};

mod lines;

/// Most tasks one line keeps admitted (dispatchable, not yet leased): what a pick may
/// find spent and send back to its line at most, per line.
pub const MAX_ADMITTED_PER_LINE: usize = 1024;

/// A bucket with nothing waiting is let go once full, at the next multiple of this
/// many milliseconds after it fills: its timer only frees memory, and buckets filling
/// within the same tenth of a second share one dispatcher round instead of waking it
/// each millisecond (a per-key limit leasing 50,000 keys a second would).
const IDLE_SWEEP_MS: u64 = 100;

/// A bucket: a limit's name and the key (`""` for the keyless one, and for every task
/// of a limit that is not per key).
pub type BucketId = (Arc<str>, Arc<str>);

/// A limit a task draws on, as the engine keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Use {
    /// The limit's name.
    pub limit: Arc<str>,
    /// The task's key for it (`""` if none).
    pub key: Arc<str>,
    /// Tokens its lease takes.
    pub cost: u64,
}

/// The limits a task draws on.
pub type Uses = Arc<[Use]>;

/// A limit's definition and what it granted.
#[derive(Debug)]
struct Def {
    rec: LimitRecord,
    /// Leases granted that drew on it since the engine started.
    granted: u64,
    /// Throttles its holders reported since the engine started.
    throttled: u64,
    /// When its buckets last started empty (monotonic ms): the engine's start, its
    /// creation, or a change of `per_key`.
    epoch: u64,
}

impl Def {
    /// The bucket that key `key` of limit `limit` draws on under this definition;
    /// `no_key` is the shared `""`.
    fn bucket(&self, limit: &Arc<str>, key: &Arc<str>, no_key: &Arc<str>) -> BucketId {
        let key = if self.rec.spec.per_key { key } else { no_key };
        (Arc::clone(limit), Arc::clone(key))
    }

    /// Tokens in units at `now` of a bucket of this limit: `bucket` if kept, else one
    /// that gathered since the limit's epoch.
    fn level(&self, bucket: Option<&Bucket>, now: u64) -> u128 {
        let Some(rate) = self.rec.spec.rate else {
            return 0;
        };
        let (level, at) = bucket.map_or((0, self.epoch), |b| (b.level, b.at));
        let gathered = u128::from(now.saturating_sub(at)) * u128::from(rate.count);
        (level + gathered).min(self.cap(rate))
    }

    /// Units of a full bucket (1 token = `per_ms` units; the rate adds `count` a ms).
    fn cap(&self, rate: Rate) -> u128 {
        u128::from(self.rec.spec.burst.unwrap_or(rate.count)) * u128::from(rate.per_ms)
    }
}

/// A bucket in use.
#[derive(Debug)]
struct Bucket {
    /// Tokens in units (see [`Def::cap`]) at `at`; unused for a limit without a rate.
    level: u128,
    /// When `level` was last brought up to date (monotonic ms).
    at: u64,
    /// The lines of the queues with tasks waiting or admitted.
    lines: Lines,
    /// Its entry in [`Limits::timers`].
    timer: Option<u64>,
    /// Until when it hands nothing out (monotonic ms): a holder reported the provider
    /// throttled it; 0 if never.
    throttled_until: u64,
}

impl Bucket {
    /// Whether tasks wait in any of its lines: only then can its room growing admit
    /// anything.
    fn has_waiting(&self) -> bool {
        self.lines.values().any(|l| !l.waiting.is_empty())
    }
}

/// What is kept of each limit and key in use: the leases held by tasks naming it and
/// its bucket. One map for both: a lease of a per-key limit finds its count and its
/// bucket with one lookup.
#[derive(Debug, Default)]
struct Slots(HashMap<BucketId, Slot>);

#[derive(Debug, Default)]
struct Slot {
    /// Leases held by tasks that name this limit with this key, counted from the
    /// leased tasks whatever the definitions say (so a limit set again, or made per
    /// key, sees them at once). A limit that is not per key counts its own per limit.
    held: u32,
    /// The bucket, while in use.
    bucket: Option<Bucket>,
}

impl Slots {
    fn bucket(&self, id: &BucketId) -> Option<&Bucket> {
        self.0.get(id)?.bucket.as_ref()
    }

    fn bucket_mut(&mut self, id: &BucketId) -> Option<&mut Bucket> {
        self.0.get_mut(id)?.bucket.as_mut()
    }

    fn bucket_or_insert_with(
        &mut self,
        id: &BucketId,
        make: impl FnOnce() -> Bucket,
    ) -> &mut Bucket {
        self.0
            .entry(id.clone())
            .or_default()
            .bucket
            .get_or_insert_with(make)
    }

    /// Takes bucket `id` out of use; the slot goes too unless leases hold it.
    fn remove_bucket(&mut self, id: &BucketId) -> Option<Bucket> {
        let slot = self.0.get_mut(id)?;
        let bucket = slot.bucket.take();
        if slot.held == 0 {
            self.0.remove(id);
        }
        bucket
    }

    /// The buckets in use.
    fn buckets(&self) -> impl Iterator<Item = (&BucketId, &Bucket)> {
        self.0
            .iter()
            .filter_map(|(id, slot)| Some((id, slot.bucket.as_ref()?)))
    }

    fn held(&self, id: &BucketId) -> u32 {
        self.0.get(id).map_or(0, |slot| slot.held)
    }

    fn hold(&mut self, id: BucketId) {
        self.0.entry(id).or_default().held += 1;
    }

    /// A lease held on `id` ended; whether tasks wait in its bucket's lines.
    fn release(&mut self, id: &BucketId) -> bool {
        let slot = self
            .0
            .get_mut(id)
            .unwrap_or_else(|| panic!("{id:?}: a held lease is counted"));
        slot.held = slot
            .held
            .checked_sub(1)
            .unwrap_or_else(|| panic!("{id:?}: a held lease is counted"));
        match &slot.bucket {
            Some(bucket) => bucket.has_waiting(),
            None => {
                if slot.held == 0 {
                    self.0.remove(id);
                }
                false
            }
        }
    }
}

/// A limit's keys in use, each with the sort key of the busiest (most held, then most
/// waiting, then by name), and the tasks waiting on it.
#[derive(Debug, Default)]
struct InUse<'a> {
    keys: Vec<(Reverse<u32>, Reverse<u64>, &'a Arc<str>)>,
    waiting: u64,
}

/// The buckets a task was charged to: inline for a task naming one limit (most), so
/// its place costs no allocation of its own.
pub type Charged = SmallVec<[BucketId; 1]>;

/// What a gate decided for a task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gated {
    /// Dispatchable, charged to `queue`'s line of each of these buckets.
    Admitted(Charged),
    /// Waiting in the line of this bucket.
    Waiting(BucketId),
}

/// Every limit, the buckets in use and their lines, and the leases held on each.
#[derive(Debug)]
pub struct Limits {
    defs: BTreeMap<Arc<str>, Def>,
    /// Per limit and key: the leases held and the bucket in use.
    slots: Slots,
    /// Leases held per limit.
    held_by_limit: HashMap<Arc<str>, u32>,
    /// Buckets' timers: when a waiting task fits, or when an idle bucket is full.
    timers: BTreeSet<(u64, BucketId)>,
    /// Buckets whose room may have grown since their lines last admitted.
    grown: BTreeSet<BucketId>,
    /// Buckets whose throttle ended, their stored throttles to remove.
    unthrottled: Vec<BucketId>,
    /// When the engine started (monotonic ms): every bucket was empty then.
    started: u64,
    /// The key of every limit's shared bucket, `""`, allocated once.
    no_key: Arc<str>,
    /// The time of the engine's current call (monotonic ms), which every decision here
    /// is taken at ([`Self::set_now`]).
    now: u64,
}

impl Limits {
    /// No limit yet, every bucket empty at `now` (monotonic ms).
    pub fn new(now: u64) -> Limits {
        Limits {
            defs: BTreeMap::new(),
            slots: Slots::default(),
            held_by_limit: HashMap::new(),
            timers: BTreeSet::new(),
            grown: BTreeSet::new(),
            unthrottled: Vec::new(),
            started: now,
            no_key: Arc::from(""),
            now,
        }
    }

    /// Sets the time of the engine's current call: monotonic, it never goes back.
    pub fn set_now(&mut self, now: u64) {
        assert!(
            now >= self.now,
            "monotonic time never goes back: {now} < {}",
            self.now
        );
        self.now = now;
    }

    /// Loads a stored limit at start-up: its buckets start empty.
    pub fn load(&mut self, name: &str, rec: LimitRecord) {
        let previous = self.defs.insert(
            Arc::from(name),
            Def {
                rec,
                granted: 0,
                throttled: 0,
                epoch: self.started,
            },
        );
        assert!(previous.is_none(), "limit {name} is loaded once");
    }

    /// How many limits exist.
    pub fn count(&self) -> usize {
        self.defs.len()
    }

    /// The stored record of limit `name`.
    pub fn record(&self, name: &str) -> Option<&LimitRecord> {
        self.defs.get(name).map(|d| &d.rec)
    }

    /// The shared name of limit `name`, if it exists.
    pub fn name(&self, name: &str) -> Option<&Arc<str>> {
        self.defs.get_key_value(name).map(|(k, _)| k)
    }

    /// Creates limit `name` or replaces its settings, at `now`. A new limit's buckets,
    /// and those of one whose `per_key` changed, start empty; otherwise each keeps its
    /// tokens (at most the new burst). Returns the buckets whose tasks must pass their
    /// gates again: those of the old definition, when its buckets changed.
    pub fn set(&mut self, name: &str, rec: LimitRecord) -> Vec<BucketId> {
        let now = self.now;
        let Some((key, def)) = self.defs.get_key_value(name) else {
            self.defs.insert(
                Arc::from(name),
                Def {
                    rec,
                    granted: 0,
                    throttled: 0,
                    epoch: now,
                },
            );
            return Vec::new();
        };
        let key = Arc::clone(key);
        let old_per_key = def.rec.spec.per_key;
        let old_rate = def.rec.spec.rate;
        let affected: Vec<BucketId> = self.buckets_of(&key);
        if old_per_key != rec.spec.per_key {
            // Other buckets: the old ones go, with their lines, once their tasks moved.
            let def = self.defs.get_mut(&key).expect("looked up above");
            def.rec = rec;
            def.epoch = now;
            return affected;
        }
        for id in &affected {
            // Bring each bucket up to date under the old rate, then express its tokens
            // under the new one (whole tokens: a fraction is dropped, never made up).
            let bucket = self.refresh(id, now);
            bucket.level = match (old_rate, rec.spec.rate) {
                (Some(old), Some(new)) => {
                    let tokens = bucket.level / u128::from(old.per_ms);
                    let cap =
                        u128::from(rec.spec.burst.unwrap_or(new.count)) * u128::from(new.per_ms);
                    (tokens * u128::from(new.per_ms)).min(cap)
                }
                // A bucket that gains a rate starts empty.
                _ => 0,
            };
        }
        let def = self.defs.get_mut(&key).expect("looked up above");
        if old_rate.is_none() && rec.spec.rate.is_some() {
            def.epoch = now;
        }
        def.rec = rec;
        self.grown.extend(affected);
        Vec::new()
    }

    /// Deletes limit `name`; returns its buckets, whose tasks must pass their gates
    /// again (they no longer wait on it). `None` if there is no such limit.
    pub fn delete(&mut self, name: &str) -> Option<Vec<BucketId>> {
        let (key, _) = self.defs.remove_entry(name)?;
        Some(self.buckets_of(&key))
    }

    /// The buckets in use of `limit`.
    fn buckets_of(&self, limit: &str) -> Vec<BucketId> {
        let mut ids: Vec<BucketId> = self
            .slots
            .buckets()
            .filter(|((l, _), _)| &**l == limit)
            .map(|(id, _)| id.clone())
            .collect();
        ids.sort();
        ids
    }

    /// The tasks in the lines of bucket `id` (waiting or admitted), per queue, and the
    /// bucket gone: each must pass its gate again. Their charges and places are given
    /// back here; the caller's dispatch index forgets where they were.
    pub fn drain_bucket(&mut self, id: &BucketId) -> Vec<(Arc<str>, Ulid)> {
        let Some(bucket) = self.slots.remove_bucket(id) else {
            return Vec::new();
        };
        if let Some(at) = bucket.timer {
            assert!(
                self.timers.remove(&(at, id.clone())),
                "a bucket's timer is listed"
            );
        }
        let mut out = Vec::new();
        for (queue, line) in bucket.lines {
            for entry in line.waiting.keys() {
                out.push((Arc::clone(&queue), Ulid::from_bytes(entry.1)));
            }
            for (entry, _) in line.admitted.iter() {
                out.push((Arc::clone(&queue), Ulid::from_bytes(entry.1)));
            }
        }
        out
    }

    /// Where task `id` of `queue` (at `entry` in dispatch order) goes: admitted if
    /// every limit it names has room for it in `queue`'s lines, counting only the
    /// tasks admitted ahead of it; else into the line of the first bucket that lacks
    /// room. A waiting task ahead of it that needs more does not hold it back. A line's
    /// admitted tasks go first in its room: when the room a task needs is held by
    /// tasks admitted behind it, `Err` names those to take out of their places first
    /// (the latest first), after which the task is gated again.
    pub fn gate(
        &mut self,
        queue: &Arc<str>,
        entry: Entry,
        uses: &[Use],
    ) -> Result<Gated, Vec<Ulid>> {
        let now = self.now;
        for u in uses {
            let Some(bucket) = self.bucket_of(u) else {
                continue;
            };
            if !self.room_at(&bucket, queue, entry, u.cost, now) {
                self.line(&bucket, queue, now).wait(entry, u.cost);
                // Its timer is set for the line's new first task at the next admission.
                self.grown.insert(bucket.clone());
                return Ok(Gated::Waiting(bucket));
            }
            if !self.line_room(&bucket, queue, u.cost, now, 0, 0) {
                let behind = self.displaced(&bucket, queue, entry, u.cost, now);
                assert!(
                    !behind.is_empty(),
                    "room ahead of a task is made by the tasks admitted behind it"
                );
                return Err(behind);
            }
        }
        let id = Ulid::from_bytes(entry.1);
        let mut charged = Charged::with_capacity(uses.len());
        for u in uses {
            let Some(bucket) = self.bucket_of(u) else {
                continue;
            };
            let line = self.line(&bucket, queue, now);
            assert!(
                line.admitted.insert(entry, u.cost),
                "task {id} admitted twice by one line"
            );
            charged.push(bucket);
        }
        Ok(Gated::Admitted(charged))
    }

    /// The tasks admitted behind `entry` in `queue`'s line of `bucket` whose places,
    /// given back, make room for a task of `cost` at `entry`: the fewest, the latest
    /// first. None when even all of them would not make room.
    fn displaced(
        &self,
        bucket: &BucketId,
        queue: &Arc<str>,
        entry: Entry,
        cost: u64,
        now: u64,
    ) -> Vec<Ulid> {
        let Some(line) = self.slots.bucket(bucket).and_then(|b| b.lines.get(queue)) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let (mut freed_n, mut freed_cost) = (0, 0);
        for (later, c) in line.admitted.from(&entry).rev() {
            out.push(Ulid::from_bytes(later.1));
            freed_n += 1;
            freed_cost += c;
            if self.line_room(bucket, queue, cost, now, freed_n, freed_cost) {
                return out;
            }
        }
        Vec::new()
    }

    /// Takes task `id` of `queue` out of where its gate put it: its line's waiting
    /// tasks, or the charges of its admission. The room it leaves may admit others. A
    /// bucket drained since ([`Self::drain_bucket`]) already gave its place back.
    pub fn ungate(&mut self, queue: &Arc<str>, entry: Entry, gated: &Gated) {
        let id = Ulid::from_bytes(entry.1);
        let charged = match gated {
            Gated::Waiting(bucket) => std::slice::from_ref(bucket),
            Gated::Admitted(charged) => charged.as_slice(),
        };
        for bucket in charged {
            let Some(b) = self.slots.bucket_mut(bucket) else {
                continue;
            };
            let line = b
                .lines
                .get_mut(queue)
                .unwrap_or_else(|| panic!("bucket {bucket:?} has a line of queue {queue}"));
            if let Gated::Waiting(_) = gated {
                assert!(line.unwait(&entry).is_some(), "task {id} waits in its line");
            } else {
                assert!(
                    line.admitted.remove(&entry).is_some(),
                    "task {id} is charged to its line"
                );
            }
            b.lines.tidy(queue);
            // The room it leaves may admit a waiting task; a bucket left without lines
            // may go (or wait to be full) at once.
            if b.has_waiting() {
                self.grown.insert(bucket.clone());
            } else if b.lines.is_empty() {
                self.retime(bucket);
            }
        }
    }

    /// Whether every limit of `uses` has room for a lease now: `Err` names the first
    /// bucket that has none.
    pub fn grantable(&self, uses: &[Use]) -> Result<(), BucketId> {
        let now = self.now;
        for u in uses {
            let Some((def, id)) = self.def_and_bucket(u) else {
                continue;
            };
            let slot = self.slots.0.get(&id);
            let bucket = slot.and_then(|s| s.bucket.as_ref());
            let held_ok = def.rec.spec.concurrency.is_none_or(|c| {
                let by_key = slot.map_or(0, |s| s.held);
                held_on(def, by_key, &self.held_by_limit, &id.0) < c
            });
            let tokens_ok = def.rec.spec.rate.is_none_or(|rate| {
                def.level(bucket, now) >= u128::from(u.cost) * u128::from(rate.per_ms)
            });
            let throttled = bucket.is_some_and(|b| b.throttled_until > now);
            if !(held_ok && tokens_ok) || throttled {
                return Err(id);
            }
        }
        Ok(())
    }

    /// A lease drawing on `uses` is granted now: takes each bucket's tokens.
    pub fn take(&mut self, uses: &[Use]) {
        let now = self.now;
        for u in uses {
            let Some(def) = self.defs.get_mut(&u.limit) else {
                continue;
            };
            def.granted += 1;
            let Some(rate) = def.rec.spec.rate else {
                continue;
            };
            let id = def.bucket(&u.limit, &u.key, &self.no_key);
            let b = self.refresh(&id, now);
            let cost = u128::from(u.cost) * u128::from(rate.per_ms);
            b.level = b
                .level
                .checked_sub(cost)
                .unwrap_or_else(|| panic!("bucket {id:?}: a lease takes only tokens it has"));
            // Below full now: the bucket is kept, with a timer to let it go once full.
            self.retime(&id);
        }
    }

    /// A task drawing on `uses` became leased (or was found leased at start-up).
    pub fn hold(&mut self, uses: &[Use]) {
        for u in uses {
            self.slots.hold((Arc::clone(&u.limit), Arc::clone(&u.key)));
            *self.held_by_limit.entry(Arc::clone(&u.limit)).or_default() += 1;
        }
    }

    /// A task drawing on `uses` is no longer leased: its slots come back.
    pub fn release(&mut self, uses: &[Use]) {
        for u in uses {
            let by_key = (Arc::clone(&u.limit), Arc::clone(&u.key));
            let waiting_by_key = self.slots.release(&by_key);
            decrement(&mut self.held_by_limit, &u.limit);
            // A slot came back: a bucket with tasks waiting may admit one. A per-key
            // limit's bucket is the slot just released.
            let Some(bucket) = self.bucket_of(u) else {
                continue;
            };
            let waiting = if bucket == by_key {
                waiting_by_key
            } else {
                self.slots.bucket(&bucket).is_some_and(Bucket::has_waiting)
            };
            if waiting {
                self.grown.insert(bucket);
            }
        }
    }

    /// Marks the buckets whose timers are due now as grown.
    pub fn due(&mut self) {
        let now = self.now;
        while let Some((at, _)) = self.timers.first()
            && *at <= now
        {
            let (_, id) = self.timers.pop_first().expect("looked at above");
            let b = self
                .slots
                .bucket_mut(&id)
                .unwrap_or_else(|| panic!("timer of {id:?} belongs to a kept bucket"));
            b.timer = None;
            if b.has_waiting() {
                self.grown.insert(id);
            } else {
                // Nothing to admit: it is full now (and goes), or its throttle ended.
                self.retime(&id);
            }
        }
    }

    /// Takes the buckets whose throttle ended since the last call.
    pub fn take_unthrottled(&mut self) -> Vec<BucketId> {
        std::mem::take(&mut self.unthrottled)
    }

    /// Takes the buckets whose room may have grown.
    pub fn take_grown(&mut self) -> BTreeSet<BucketId> {
        std::mem::take(&mut self.grown)
    }

    /// The queues with tasks waiting in a line of bucket `id`.
    pub fn waiting_queues(&self, id: &BucketId) -> Vec<Arc<str>> {
        self.slots.bucket(id).map_or_else(Vec::new, |b| {
            b.lines
                .iter()
                .filter(|(_, l)| !l.waiting.is_empty())
                .map(|(q, _)| Arc::clone(q))
                .collect()
        })
    }

    /// Takes the first task waiting in `queue`'s line of bucket `id` that fits the
    /// room its line leaves it (the tasks admitted ahead of it counted). A task that
    /// does not fit rules out every task behind it of at least its cost, and with a
    /// concurrency spent every task behind it: so the search looks at one task per
    /// cost at most.
    pub fn admit_next(&mut self, id: &BucketId, queue: &Arc<str>) -> Option<Entry> {
        let now = self.now;
        let def = self.defs.get(&id.0)?;
        let mut below = u64::MAX;
        let entry = loop {
            let line = self.slots.bucket(id)?.lines.get(queue)?;
            let (entry, cost) = line.first_below(below)?;
            if self.room_at(id, queue, entry, cost, now) {
                break entry;
            }
            let (ahead, _) = line.admitted.ahead(&entry);
            let slots_spent = def
                .rec
                .spec
                .concurrency
                .is_some_and(|c| self.held(id, def) as usize + ahead >= c as usize);
            if slots_spent || ahead >= MAX_ADMITTED_PER_LINE {
                return None;
            }
            below = cost;
        };
        let bucket = self.slots.bucket_mut(id).expect("found waiting above");
        let line = bucket.lines.get_mut(queue).expect("found waiting above");
        line.unwait(&entry).expect("found waiting above");
        bucket.lines.tidy(queue);
        Some(entry)
    }

    /// Sets bucket `id`'s timer after its lines admitted what fits: when its first
    /// waiting task will fit, or, with nothing waiting, when it is full (and can go).
    /// A bucket with nothing to wait for and full goes now.
    pub fn retime(&mut self, id: &BucketId) {
        let now = self.now;
        let Some(def) = self.defs.get(&id.0) else {
            return;
        };
        let Some(slot) = self.slots.0.get_mut(id) else {
            return;
        };
        let held_by_key = slot.held;
        let Some(bucket) = slot.bucket.as_mut() else {
            return;
        };
        // Leases held count only for the lines' waiting tasks.
        let held = match bucket.has_waiting() {
            false => 0,
            true => held_on(def, held_by_key, &self.held_by_limit, &id.0) as usize,
        };
        // A throttled bucket is kept, and looked at again, until its throttle ends.
        let throttle_end = (bucket.throttled_until > now).then_some(bucket.throttled_until);
        if bucket.throttled_until != 0 && throttle_end.is_none() {
            self.unthrottled.push(id.clone());
            bucket.throttled_until = 0;
        }
        let at = match def.rec.spec.rate {
            _ if throttle_end.is_some() => throttle_end,
            None => None,
            Some(rate) => {
                let level = def.level(Some(bucket), now);
                let per_ms = u128::from(rate.per_ms);
                let count = u128::from(rate.count);
                let cap = def.cap(rate);
                let fit = |need: u128| {
                    (need <= cap).then(|| {
                        now + u64::try_from((need.saturating_sub(level)).div_ceil(count))
                            .unwrap_or(u64::MAX)
                    })
                };
                // For each line, the first waiting task of each cost: when the tokens
                // ahead of it and its own are there. A line whose concurrency is spent
                // gains room when a task leaves, not with time.
                let concurrency = def.rec.spec.concurrency;
                let fit = &fit;
                let waiting = bucket
                    .lines
                    .values()
                    .flat_map(|l| {
                        l.by_cost.iter().filter_map(move |(cost, entries)| {
                            let first = entries.first()?;
                            let (ahead, ahead_cost) = l.admitted.ahead(first);
                            let slots_ok = ahead < MAX_ADMITTED_PER_LINE
                                && concurrency.is_none_or(|c| held + ahead < c as usize);
                            slots_ok.then(|| {
                                fit((u128::from(ahead_cost) + u128::from(*cost)) * per_ms)
                            })?
                        })
                    })
                    .min();
                let idle = bucket.lines.is_empty();
                match (waiting, idle) {
                    (Some(at), _) => Some(at),
                    (None, true) if level < cap => {
                        fit(cap).map(|at| at.next_multiple_of(IDLE_SWEEP_MS))
                    }
                    (None, _) => None,
                }
            }
        };
        if let Some(old) = bucket.timer.take() {
            assert!(
                self.timers.remove(&(old, id.clone())),
                "a bucket's timer is listed"
            );
        }
        match at {
            Some(at) => {
                let at = at.max(now + 1);
                bucket.timer = Some(at);
                self.timers.insert((at, id.clone()));
            }
            None if bucket.lines.is_empty() => {
                // Full (or without a rate) and nothing waits: not kept.
                slot.bucket = None;
                if slot.held == 0 {
                    self.slots.0.remove(id);
                }
            }
            None => {}
        }
    }

    /// Milliseconds until the next bucket timer, if any.
    pub fn next_timer(&self) -> Option<u64> {
        self.timers.first().map(|(at, _)| *at)
    }

    /// Whether `uses` names limits that all exist (unknown ones named by the first).
    pub fn check_exist(&self, names: &[&str]) -> Result<(), String> {
        match names.iter().find(|n| !self.defs.contains_key(**n)) {
            Some(n) => Err(format!("no limit {n}")),
            None => Ok(()),
        }
    }

    /// Limit `name` as `limit_get` shows it; `now_wall` is the wall clock now.
    pub fn info(&self, name: &str, now_wall: u64) -> Option<LimitInfo> {
        let (limit, _) = self.defs.get_key_value(name)?;
        let mut used = self.in_use();
        Some(self.info_of(limit, used.remove(limit).unwrap_or_default(), now_wall))
    }

    /// Of limits `names` that exist, what [`Self::info`] says, in one pass over the
    /// buckets for all of them.
    pub fn infos<'a>(
        &self,
        names: impl IntoIterator<Item = &'a str>,
        now_wall: u64,
    ) -> Vec<LimitInfo> {
        let mut used = self.in_use();
        names
            .into_iter()
            .filter_map(|name| self.defs.get_key_value(name))
            .map(|(limit, _)| self.info_of(limit, used.remove(limit).unwrap_or_default(), now_wall))
            .collect()
    }

    /// Each limit's keys in use (buckets below full, with lines or throttles, and keys
    /// holding leases), each once with its leases held and tasks waiting, in one pass
    /// over the slots.
    fn in_use(&self) -> HashMap<&Arc<str>, InUse<'_>> {
        let mut used: HashMap<&Arc<str>, InUse<'_>> = HashMap::new();
        for ((limit, key), slot) in &self.slots.0 {
            let Some(def) = self.defs.get(limit) else {
                continue;
            };
            // A bucket in use, or a key of a per-key limit holding leases (its bucket
            // full, or without a rate).
            if slot.bucket.is_none() && !def.rec.spec.per_key {
                continue;
            }
            let waiting = slot.bucket.as_ref().map_or(0, |b| {
                b.lines
                    .values()
                    .map(|l| l.waiting.len() as u64)
                    .sum::<u64>()
            });
            let held = held_on(def, slot.held, &self.held_by_limit, limit);
            let u = used.entry(limit).or_default();
            u.keys.push((Reverse(held), Reverse(waiting), key));
            u.waiting += waiting;
        }
        // A shared bucket not kept is in use while leases hold it, or while it still
        // fills since it started empty (though no task touched it yet).
        for (limit, def) in &self.defs {
            if def.rec.spec.per_key {
                continue;
            }
            let id = (Arc::clone(limit), Arc::clone(&self.no_key));
            if self.slots.bucket(&id).is_some() {
                continue;
            }
            let held = self.held_by_limit.get(limit).is_some_and(|n| *n > 0);
            let filling = def
                .rec
                .spec
                .rate
                .is_some_and(|rate| self.level(def, &id, self.now) < def.cap(rate));
            if held || filling {
                let held = self.held_by_limit.get(limit).copied().unwrap_or(0);
                let u = used.entry(limit).or_default();
                u.keys.push((Reverse(held), Reverse(0), &self.no_key));
            }
        }
        used
    }

    /// Limit `limit`'s info, given its keys in use and the tasks waiting on it.
    fn info_of(&self, limit: &Arc<str>, in_use: InUse<'_>, now_wall: u64) -> LimitInfo {
        let now = self.now;
        let def = &self.defs[limit];
        // Every key in use is counted, the busiest are described (most held, then most
        // waiting, then by name).
        let InUse {
            keys: mut busiest,
            waiting,
        } = in_use;
        let keys_in_use = busiest.len() as u64;
        let listed = muster_protocol::limits::MAX_LISTED_LIMIT_KEYS;
        if busiest.len() > listed {
            busiest.select_nth_unstable(listed - 1);
            busiest.truncate(listed);
        }
        busiest.sort_unstable();
        let keys = busiest
            .into_iter()
            .map(|(Reverse(held), Reverse(waiting), key)| {
                let id = (Arc::clone(limit), Arc::clone(key));
                let (tokens, full_ms) = match def.rec.spec.rate {
                    None => (None, None),
                    Some(rate) => {
                        let level = self.level(def, &id, now);
                        let cap = def.cap(rate);
                        let full = (level < cap).then(|| {
                            let ms = (cap - level).div_ceil(u128::from(rate.count));
                            now_wall.saturating_add(u64::try_from(ms).unwrap_or(u64::MAX))
                        });
                        let tokens = level / u128::from(rate.per_ms);
                        (Some(u64::try_from(tokens).unwrap_or(u64::MAX)), full)
                    }
                };
                let throttled_until_ms = self
                    .slots
                    .bucket(&id)
                    .filter(|b| b.throttled_until > now)
                    .map(|b| now_wall.saturating_add(b.throttled_until - now));
                LimitKeyInfo {
                    key: id.1.to_string(),
                    tokens,
                    held: u64::from(held),
                    waiting,
                    full_ms,
                    throttled_until_ms,
                }
            })
            .collect();
        LimitInfo {
            name: limit.to_string(),
            spec: spec_shown(&def.rec.spec),
            held: u64::from(self.held_by_limit.get(limit).copied().unwrap_or(0)),
            waiting,
            granted: def.granted,
            throttled: def.throttled,
            keys_in_use,
            keys,
            created_ms: def.rec.created_ms,
            updated_ms: def.rec.updated_ms,
        }
    }

    /// Limit names after `after`, at most `n`.
    pub fn names_after(&self, after: Option<&str>, n: usize) -> Vec<Arc<str>> {
        use std::ops::Bound;
        let start = after.map_or(Bound::Unbounded, Bound::Excluded);
        self.defs
            .range::<str, _>((start, Bound::Unbounded))
            .take(n)
            .map(|(k, _)| Arc::clone(k))
            .collect()
    }

    /// The bucket `u` draws on, if its limit exists.
    fn bucket_of(&self, u: &Use) -> Option<BucketId> {
        self.def_and_bucket(u).map(|(_, b)| b)
    }

    fn def_and_bucket(&self, u: &Use) -> Option<(&Def, BucketId)> {
        let (limit, def) = self.defs.get_key_value(&u.limit)?;
        Some((def, def.bucket(limit, &u.key, &self.no_key)))
    }

    /// Leases held on bucket `id` of `def`.
    fn held(&self, id: &BucketId, def: &Def) -> u32 {
        held_on(def, self.slots.held(id), &self.held_by_limit, &id.0)
    }

    /// Bucket `id`'s tokens in units at `now`; one not kept gathered since its epoch.
    fn level(&self, def: &Def, id: &BucketId, now: u64) -> u128 {
        def.level(self.slots.bucket(id), now)
    }

    /// Whether task `entry` of `cost` has room in `queue`'s line of bucket `id`,
    /// counting only the tasks the line admitted ahead of it.
    fn room_at(&self, id: &BucketId, queue: &Arc<str>, entry: Entry, cost: u64, now: u64) -> bool {
        let Some(line) = self.slots.bucket(id).and_then(|b| b.lines.get(queue)) else {
            return self.line_room(id, queue, cost, now, 0, 0);
        };
        let behind = line.admitted.from(&entry);
        let (freed_n, freed_cost) = behind.fold((0, 0), |(n, c), (_, cost)| (n + 1, c + cost));
        self.line_room(id, queue, cost, now, freed_n, freed_cost)
    }

    /// Whether `queue`'s line of bucket `id` sees room for one more task of `cost`:
    /// the bucket's room less what the line already admitted, but for `freed_n` tasks
    /// of `freed_cost` in all that would give their places back.
    fn line_room(
        &self,
        id: &BucketId,
        queue: &Arc<str>,
        cost: u64,
        now: u64,
        freed_n: usize,
        freed_cost: u64,
    ) -> bool {
        let Some(def) = self.defs.get(&id.0) else {
            return true;
        };
        let (admitted, admitted_cost) = self
            .slots
            .bucket(id)
            .and_then(|b| b.lines.get(queue))
            .map_or((0, 0), |l| (l.admitted.len(), l.admitted.cost()));
        debug_assert!(
            freed_n <= admitted && freed_cost <= admitted_cost,
            "only admitted tasks give places back"
        );
        let (admitted, admitted_cost) = (admitted - freed_n, admitted_cost - freed_cost);
        if admitted >= MAX_ADMITTED_PER_LINE || self.throttled(id, now) {
            return false;
        }
        let held_ok = def
            .rec
            .spec
            .concurrency
            .is_none_or(|c| (self.held(id, def) as usize + admitted) < c as usize);
        let tokens_ok = def.rec.spec.rate.is_none_or(|rate| {
            self.level(def, id, now)
                >= (u128::from(admitted_cost) + u128::from(cost)) * u128::from(rate.per_ms)
        });
        held_ok && tokens_ok
    }

    /// Whether bucket `id` is throttled at `now`.
    fn throttled(&self, id: &BucketId, now: u64) -> bool {
        self.slots
            .bucket(id)
            .is_some_and(|b| b.throttled_until > now)
    }

    /// A holder reported that the provider behind `u`'s limit throttled it: its bucket
    /// hands nothing out until `until` (monotonic ms), or later if already so. Returns
    /// the bucket, if the limit exists, and when its throttle ends now.
    pub fn throttle(&mut self, u: &Use, until: u64) -> Option<(BucketId, u64)> {
        let bucket = self.bucket_of(u)?;
        let now = self.now;
        let b = self.refresh(&bucket, now);
        b.throttled_until = b.throttled_until.max(until);
        let ends = b.throttled_until;
        self.defs
            .get_mut(&u.limit)
            .expect("bucket_of found it")
            .throttled += 1;
        self.retime(&bucket);
        Some((bucket, ends))
    }

    /// A throttle read from the store at start-up: bucket `key` of limit `name` hands
    /// nothing out until `until` (monotonic ms). A limit deleted since is skipped.
    pub fn load_throttle(&mut self, name: &str, key: &str, until: u64) {
        let Some(limit) = self.defs.get_key_value(name).map(|(k, _)| Arc::clone(k)) else {
            return;
        };
        let id = (limit, Arc::from(key));
        let now = self.now;
        self.refresh(&id, now).throttled_until = until;
        self.retime(&id);
    }

    /// Brings bucket `id` up to date at `now`, keeping it from now on.
    fn refresh(&mut self, id: &BucketId, now: u64) -> &mut Bucket {
        let def = &self.defs[&id.0];
        let bucket = self.slots.bucket_or_insert_with(id, || Bucket {
            // Not kept: it gathered since the limit's epoch.
            level: 0,
            at: def.epoch,
            lines: Lines::default(),
            timer: None,
            throttled_until: 0,
        });
        bucket.level = def.level(Some(bucket), now);
        bucket.at = now;
        bucket
    }

    /// `queue`'s line of bucket `id`, made if new.
    fn line(&mut self, id: &BucketId, queue: &Arc<str>, now: u64) -> &mut Line {
        self.refresh(id, now).lines.get_or_default(queue)
    }

    /// Asserts that every line's admitted cost sums its tasks' and that timers and
    /// buckets agree.
    #[cfg(debug_assertions)]
    pub fn check(&self) {
        for (id, b) in self.slots.buckets() {
            for (queue, line) in b.lines.iter() {
                assert!(
                    !line.is_empty(),
                    "bucket {id:?}: empty line of {queue} kept"
                );
                assert_eq!(
                    line.admitted.iter().map(|(_, c)| c).sum::<u64>(),
                    line.admitted.cost(),
                    "bucket {id:?}, queue {queue}: admitted cost"
                );
                let by_cost: usize = line.by_cost.values().map(BTreeSet::len).sum();
                assert_eq!(
                    by_cost,
                    line.waiting.len(),
                    "bucket {id:?}, queue {queue}: waiting tasks listed by cost"
                );
            }
            if let Some(at) = b.timer {
                assert!(
                    self.timers.contains(&(at, id.clone())),
                    "bucket {id:?}: timer listed"
                );
            }
            // One without lines goes when full: until then its timer is set.
            assert!(
                !b.lines.is_empty() || b.timer.is_some(),
                "bucket {id:?}: kept without lines or a timer"
            );
        }
        let mut held_by_limit: HashMap<&Arc<str>, u32> = HashMap::new();
        for ((limit, key), slot) in &self.slots.0 {
            assert!(
                slot.held > 0 || slot.bucket.is_some(),
                "slot ({limit}, {key}) kept without leases or a bucket"
            );
            if slot.held > 0 {
                *held_by_limit.entry(limit).or_default() += slot.held;
            }
        }
        let counted: HashMap<&Arc<str>, u32> =
            self.held_by_limit.iter().map(|(l, n)| (l, *n)).collect();
        assert_eq!(
            counted, held_by_limit,
            "leases held per limit and per key agree"
        );
        for (at, id) in &self.timers {
            assert_eq!(
                self.slots.bucket(id).and_then(|b| b.timer),
                Some(*at),
                "timer of {id:?} belongs to a kept bucket"
            );
        }
    }
}

/// Leases held on a bucket of limit `limit` (defined by `def`) whose key's slot counts
/// `by_key`: that count for a per-key limit, every lease on the limit otherwise.
fn held_on(def: &Def, by_key: u32, held_by_limit: &HashMap<Arc<str>, u32>, limit: &str) -> u32 {
    if def.rec.spec.per_key {
        by_key
    } else {
        held_by_limit.get(limit).copied().unwrap_or(0)
    }
}

fn decrement<K: std::hash::Hash + Eq + std::fmt::Debug>(map: &mut HashMap<K, u32>, key: &K) {
    let n = map
        .get_mut(key)
        .unwrap_or_else(|| panic!("{key:?}: a held lease is counted"));
    *n -= 1;
    if *n == 0 {
        map.remove(key);
    }
}

/// A limit's settings as shown: the burst filled in when it has a rate.
pub fn spec_shown(spec: &LimitSpec) -> LimitSpec {
    LimitSpec {
        burst: spec.rate.map(|r| spec.burst.unwrap_or(r.count)),
        ..spec.clone()
    }
}
