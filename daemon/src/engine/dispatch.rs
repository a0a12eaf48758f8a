//! The dispatch index of one queue: which ready task goes next, without scanning.
//!
//! Ready tasks that may be handed out now ("dispatchable") sit in one ordered set per
//! **label class** (the sorted set of labels they require), ordered by priority, then
//! id (enqueue order; a retry keeps its id, so it keeps its place). Picking for a
//! claimer looks at the first task of each class whose labels the claimer carries and
//! takes the best; classes are found by their first label, so a claimer never looks at
//! a class it cannot take: the cost grows with the classes it carries, never with the
//! backlog or with other claimers' classes.
//!
//! Which classes no connected member can take (**unclaimable**) is kept as tasks and
//! members come and go, never recomputed for a listing: each class remembers whether a
//! connected member carries it ([`Carried`]), decided when the class first appears and
//! revised only when a label set appears among connected members or leaves them.
//!
//! Tasks with a **key** are handed out in enqueue order, at most `key_concurrency` at a
//! time: every unfinished task of a key (scheduled, ready or leased) waits in the key's
//! line, and only a ready task among the first `key_concurrency` of the line is
//! dispatchable, and only while fewer than `key_concurrency` of the line are leased. A key whose head is leased or scheduled for a retry holds back the
//! rest of its line; other keys are not affected.
//!
//! In a queue with **fair** dispatch, each class orders its tasks by priority, then by
//! the turns of their groups, then by id ([`super::fair`]).
//!
//! Tasks that draw on **limits** pass a gate on their way into their class
//! ([`Gate`], [`super::limits`]): admitted, they are dispatchable like any other;
//! otherwise they wait in the line of the limit's bucket that lacks room, out of every
//! class, until it has room again.

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use ulid::Ulid;

use muster_protocol::model::TaskState;

use super::fair::{Classes, Group, Ready};
use super::limits::{BucketId, Gated, Limits, Uses};
use super::sharded::{IdMap, ShardedMap};

/// The labels a task requires, sorted and without duplicates; shared by its class.
pub type Class = Arc<[String]>;

/// A label set as its class holds it: sorted, without duplicates.
pub fn sorted(requires: &[String]) -> Vec<String> {
    let mut labels = requires.to_vec();
    labels.sort();
    labels.dedup();
    labels
}

/// The label sets of connected members, each with how many members carry it: what
/// tells whether some connected member can take a label class.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Carried {
    sets: HashMap<Vec<String>, u32>,
}

impl Carried {
    /// Whether a connected member carries every label of `class` (the empty class
    /// needs none).
    pub fn covers(&self, class: &[String]) -> bool {
        class.is_empty() || self.sets.keys().any(|set| covers(set, class))
    }

    /// Counts one more member carrying `labels`; true if no other member carried them.
    pub fn add(&mut self, labels: &[String]) -> bool {
        let count = self.sets.entry(sorted(labels)).or_default();
        *count += 1;
        *count == 1
    }

    /// Counts one member fewer carrying `labels`; true if no member carries them now.
    pub fn remove(&mut self, labels: &[String]) -> bool {
        let set = sorted(labels);
        let count = self
            .sets
            .get_mut(&set)
            .unwrap_or_else(|| panic!("label set {set:?} is not carried"));
        assert!(
            *count > 0,
            "label set {set:?}: its carriers never underflow"
        );
        *count -= 1;
        if *count == 0 {
            self.sets.remove(&set);
            return true;
        }
        false
    }
}

/// Whether a sorted label set holds every label of a sorted class.
fn covers(set: &[String], class: &[String]) -> bool {
    class.iter().all(|l| set.binary_search(l).is_ok())
}

/// How many indexed tasks require a class, and whether a connected member carries it.
#[derive(Debug)]
struct ClassRefs {
    tasks: u32,
    claimable: bool,
}

/// A task as the index sees it.
#[derive(Debug, Clone, Copy)]
pub struct TaskRef<'a> {
    /// The task's id.
    pub id: Ulid,
    /// Its state; only scheduled, ready and leased tasks are indexed.
    pub state: TaskState,
    /// Its priority.
    pub priority: u8,
    /// Its key.
    pub key: Option<&'a Arc<str>>,
    /// Its label class.
    pub class: &'a Class,
    /// The limits it draws on, if any.
    pub uses: Option<&'a Uses>,
    /// Its group, if any.
    pub group: Option<&'a Group>,
}

/// What the dispatch index needs to pass tasks with limits through their gates: the
/// limits (which know the time) and its queue's name (its lines' name).
pub struct Gate<'a> {
    /// Every limit, with its buckets and lines.
    pub limits: &'a mut Limits,
    /// The queue whose index this is.
    pub queue: &'a Arc<str>,
}

/// A dispatchable task with limits: where its gate put it.
#[derive(Debug)]
struct GatedTask {
    class: Class,
    priority: u8,
    group: Option<Group>,
    uses: Uses,
    /// `None` only between being taken out of its place and put back.
    gated: Option<Gated>,
}

/// One task in a key's line.
#[derive(Debug)]
struct Slot {
    priority: u8,
    class: Class,
    group: Option<Group>,
    uses: Option<Uses>,
    ready: bool,
    leased: bool,
    dispatchable: bool,
}

/// A key's line and how many of its tasks are leased.
#[derive(Debug, Default)]
struct Line {
    slots: BTreeMap<Ulid, Slot>,
    leased: u32,
}

/// A dispatchable task in its class, in dispatch order: higher priority first, then
/// older. The id is kept as its big-endian bytes, which sort as the ULID does: 17 bytes
/// an entry instead of the 32 of a 16-byte-aligned `Ulid`, for every ready task.
pub type Entry = (Reverse<u8>, [u8; 16]);

/// The dispatch index of one queue.
#[derive(Debug, Default)]
pub struct DispatchIndex {
    /// How many indexed tasks (scheduled, ready or leased) require each label class:
    /// the classes the queue knows, capped at `MAX_LABEL_CLASSES` for new tasks.
    refs: HashMap<Class, ClassRefs>,
    /// Dispatchable ready tasks per label class, plain or fair.
    classes: Classes,
    /// The non-empty classes of `classes` by their first (smallest) label: a claimer
    /// looks only at the classes whose first label it carries, each once.
    by_first_label: HashMap<String, Vec<Class>>,
    /// Each key's line of unfinished tasks, in enqueue order.
    keys: ShardedMap<Arc<str>, Line>,
    /// Ready tasks with a key that are held back by their key's line.
    held_back: u64,
    /// The classes of `classes` (so each with a dispatchable task) that no connected
    /// member carries.
    unclaimable: HashSet<Class>,
    /// Dispatchable tasks in the classes of `unclaimable`.
    unclaimable_ready: u64,
    /// Dispatchable tasks with limits, admitted (in `classes`) or waiting in a line.
    gated: IdMap<GatedTask>,
    /// How many of them wait in a line.
    waiting_on_limits: u64,
}

impl DispatchIndex {
    /// The shared class of a label set (sorted, without duplicates).
    pub fn class(&self, requires: &[String]) -> Class {
        let labels = sorted(requires);
        match self.refs.get_key_value(labels.as_slice()) {
            Some((class, _)) => Arc::clone(class),
            None => Arc::from(labels),
        }
    }

    /// Whether tasks of the queue already require this label set.
    pub fn knows(&self, requires: &[String]) -> bool {
        self.refs.contains_key(sorted(requires).as_slice())
    }

    /// The label classes of the queue's scheduled, ready and leased tasks.
    pub fn class_count(&self) -> usize {
        self.refs.len()
    }

    /// Adds a task that entered an unfinished state (scheduled, ready, leased, suspended); `carried` tells
    /// whether a class new to the queue is claimable.
    pub fn add(
        &mut self,
        t: TaskRef<'_>,
        key_concurrency: u32,
        carried: &Carried,
        gate: &mut Gate<'_>,
    ) {
        assert!(
            !t.state.is_finished(),
            "task {}: only unfinished tasks are dispatch-indexed, not {}",
            t.id,
            t.state
        );
        self.refs
            .entry(Arc::clone(t.class))
            .or_insert_with(|| ClassRefs {
                tasks: 0,
                claimable: carried.covers(t.class),
            })
            .tasks += 1;
        let ready = t.state == TaskState::Ready;
        match t.key {
            None => {
                if ready {
                    self.dispatchable(t.class, t.priority, t.id, t.group, t.uses, gate);
                }
            }
            Some(key) => {
                let leased = t.state == TaskState::Leased;
                let slot = Slot {
                    priority: t.priority,
                    class: Arc::clone(t.class),
                    group: t.group.cloned(),
                    uses: t.uses.cloned(),
                    ready,
                    leased,
                    dispatchable: false,
                };
                if ready {
                    self.held_back += 1;
                }
                let line = self.keys.get_or_insert_with(Arc::clone(key), Line::default);
                line.leased += u32::from(leased);
                let old = line.slots.insert(t.id, slot);
                assert!(old.is_none(), "task {} joins its key's line once", t.id);
                self.refresh(key, key_concurrency, gate);
            }
        }
    }

    /// Removes a task that leaves its unfinished state.
    pub fn remove(&mut self, t: TaskRef<'_>, key_concurrency: u32, gate: &mut Gate<'_>) {
        let refs = self
            .refs
            .get_mut(t.class)
            .unwrap_or_else(|| panic!("task {}: its label class is not counted", t.id));
        assert!(
            refs.tasks > 0,
            "task {}: its label class counts its tasks",
            t.id
        );
        refs.tasks -= 1;
        if refs.tasks == 0 {
            self.refs.remove(t.class);
        }
        match t.key {
            None => {
                if t.state == TaskState::Ready {
                    self.unclass(t.class, t.priority, t.id, t.group, gate);
                }
            }
            Some(key) => {
                let line = self
                    .keys
                    .get_mut(key)
                    .unwrap_or_else(|| panic!("task {}: key {key:?} has no line", t.id));
                let slot = line
                    .slots
                    .remove(&t.id)
                    .unwrap_or_else(|| panic!("task {} is not in its key's line", t.id));
                assert_eq!(
                    (slot.ready, slot.leased),
                    (t.state == TaskState::Ready, t.state == TaskState::Leased),
                    "task {}: its place in its key's line is of its state",
                    t.id
                );
                line.leased = line
                    .leased
                    .checked_sub(u32::from(slot.leased))
                    .expect("a line counts its leased tasks");
                if line.slots.is_empty() {
                    self.keys.remove(key);
                }
                if slot.dispatchable {
                    self.unclass(&slot.class, slot.priority, t.id, slot.group.as_ref(), gate);
                } else if slot.ready {
                    self.held_back = self
                        .held_back
                        .checked_sub(1)
                        .expect("held_back counts the held-back tasks");
                }
                self.refresh(key, key_concurrency, gate);
            }
        }
    }

    /// The best dispatchable task for a claimer carrying `labels` that `allowed`
    /// accepts. Each class is searched past at most `max_skip` refused tasks (its first
    /// task alone when `max_skip` is 0), so a pick costs at most
    /// classes × (`max_skip` + 1) steps, never a scan of the backlog.
    pub fn pick(
        &self,
        labels: &[String],
        allowed: impl Fn(Ulid) -> bool,
        max_skip: usize,
    ) -> Option<Ulid> {
        let first = |set: &Ready| set.first(&allowed, max_skip);
        // The classes the claimer can satisfy: the empty one, and those whose first
        // label it carries and whose other labels it carries too.
        let none: &[String] = &[];
        let candidates = labels
            .iter()
            .filter_map(|l| self.by_first_label.get(l.as_str()))
            .flatten()
            .filter(|class| class.iter().all(|l| labels.contains(l)))
            .filter_map(|class| self.classes.get(class));
        self.classes
            .get(none)
            .into_iter()
            .chain(candidates)
            .filter_map(first)
            .min()
            .map(|(_, _, id)| Ulid::from_bytes(id))
    }

    /// Whether the queue dispatches fairly between groups.
    pub fn is_fair(&self) -> bool {
        self.classes.fair()
    }

    /// A task of `group`, about to be leased, was picked: the group (in a fair queue)
    /// has had its turn.
    pub fn served(&mut self, group: Option<&Group>) {
        self.classes.served(group);
    }

    /// Turns fair dispatch on or off and takes the group weights; `group_of` gives a
    /// dispatchable task's group.
    pub fn set_fair(
        &mut self,
        fair: bool,
        weights: impl IntoIterator<Item = (String, u32)>,
        group_of: impl Fn(Ulid) -> Option<Group>,
    ) {
        self.classes.set_fair(fair, weights, group_of);
    }

    /// Groups with dispatchable tasks, in a fair queue.
    pub fn active_groups(&self) -> usize {
        self.classes.active_groups()
    }

    /// Recomputes every key's dispatchable tasks, after `key_concurrency` changed.
    pub fn rebuild(&mut self, key_concurrency: u32, gate: &mut Gate<'_>) {
        let keys: Vec<Arc<str>> = self.keys.keys().cloned().collect();
        for key in keys {
            self.refresh_all(&key, key_concurrency, gate);
        }
        debug_assert!(
            self.keys.iter().all(|(_, line)| line
                .slots
                .values()
                .filter(|s| s.dispatchable)
                .count()
                <= key_concurrency as usize),
            "at most key_concurrency tasks of a key are dispatchable"
        );
    }

    /// The limits of dispatchable task `id`, if it draws on any.
    pub fn uses(&self, id: Ulid) -> Option<&Uses> {
        // Most queues have no task with limits: no hashing for them.
        if self.gated.is_empty() {
            return None;
        }
        self.gated.get(&id).map(|g| &g.uses)
    }

    /// The bucket in whose line ready task `id` waits, if it waits in one.
    pub fn waiting_on(&self, id: Ulid) -> Option<&BucketId> {
        match self.gated.get(&id)?.gated.as_ref()? {
            Gated::Waiting(bucket) => Some(bucket),
            Gated::Admitted(_) => None,
        }
    }

    /// Ready tasks waiting in a limit's line.
    pub fn waiting_on_limits(&self) -> u64 {
        self.waiting_on_limits
    }

    /// Passes task `id` through its gate again: one that was admitted (a pick found its
    /// room spent since), one its line admitted, or one whose bucket was drained.
    pub fn regate(&mut self, id: Ulid, gate: &mut Gate<'_>) {
        self.unplace(id, gate);
        self.place(id, gate);
    }

    /// Takes task `id`, admitted by its line ([`Limits::admit_next`], which took it out
    /// of the line), through the rest of its gate.
    pub fn admitted(&mut self, id: Ulid, gate: &mut Gate<'_>) {
        let task = self
            .gated
            .get_mut(&id)
            .unwrap_or_else(|| panic!("task {id}: an admitted task is gated"));
        assert!(
            matches!(task.gated, Some(Gated::Waiting(_))),
            "task {id}: a line admits only a task waiting in it"
        );
        task.gated = None;
        self.waiting_on_limits = self
            .waiting_on_limits
            .checked_sub(1)
            .expect("waiting_on_limits counts the waiting tasks");
        self.place(id, gate);
    }

    /// Takes gated task `id` out of its place (its line, or its class and its lines'
    /// charges), leaving it gated but placed nowhere: the first of two steps of
    /// [`Self::regate`], apart so that the tasks of drained buckets all leave their
    /// places before any takes a new one.
    pub fn unplace(&mut self, id: Ulid, gate: &mut Gate<'_>) {
        let task = self
            .gated
            .get_mut(&id)
            .unwrap_or_else(|| panic!("task {id} is gated"));
        let gated = task
            .gated
            .take()
            .unwrap_or_else(|| panic!("task {id} is placed"));
        let entry = (Reverse(task.priority), id.to_bytes());
        let class = Arc::clone(&task.class);
        let group = task.group.clone();
        gate.limits.ungate(gate.queue, entry, &gated);
        match gated {
            Gated::Admitted(_) => self.unclass_entry(&class, entry, id, group.as_ref()),
            Gated::Waiting(_) => {
                self.waiting_on_limits = self
                    .waiting_on_limits
                    .checked_sub(1)
                    .expect("waiting_on_limits counts the waiting tasks");
            }
        }
    }

    /// Puts gated task `id`, placed nowhere, where its gate says now. Tasks admitted
    /// behind it that hold the room it needs give their places up to it first, and
    /// are placed again after it (behind it, so this ends).
    pub fn place(&mut self, id: Ulid, gate: &mut Gate<'_>) {
        let task = self
            .gated
            .get(&id)
            .unwrap_or_else(|| panic!("task {id} is gated"));
        assert!(task.gated.is_none(), "task {id} is placed once");
        let entry = (Reverse(task.priority), id.to_bytes());
        let gated = match gate.limits.gate(gate.queue, entry, &task.uses) {
            Ok(gated) => gated,
            Err(displaced) => {
                for later in &displaced {
                    let behind = self
                        .gated
                        .get(later)
                        .map(|t| (Reverse(t.priority), later.to_bytes()));
                    assert!(
                        behind.is_some_and(|b| b > entry),
                        "task {id} displaces only tasks behind it"
                    );
                    self.unplace(*later, gate);
                }
                self.place(id, gate);
                for later in displaced {
                    self.place(later, gate);
                }
                return;
            }
        };
        let task = self.gated.get_mut(&id).expect("looked up above");
        let class = Arc::clone(&task.class);
        let group = task.group.clone();
        let admitted = matches!(gated, Gated::Admitted(_));
        task.gated = Some(gated);
        if admitted {
            self.class_entry(&class, entry, id, group.as_ref());
        } else {
            self.waiting_on_limits += 1;
        }
    }

    /// Label classes with dispatchable tasks (what [`Self::check_unclaimable`] walks).
    #[cfg(debug_assertions)]
    pub fn classes(&self) -> usize {
        self.classes.len()
    }

    /// Ready tasks held back by their key's line.
    pub fn held_back(&self) -> u64 {
        self.held_back
    }

    /// Dispatchable tasks that no connected member can take.
    pub fn unclaimable(&self) -> u64 {
        self.unclaimable_ready
    }

    /// The classes holding those tasks, each with how many it holds.
    pub fn unclaimable_classes(&self) -> impl Iterator<Item = (&Class, usize)> {
        self.unclaimable
            .iter()
            .map(|c| (c, self.classes.get(c).map_or(0, Ready::len)))
    }

    /// A label set appeared among connected members (`appeared`) or left them:
    /// revises the classes it covers, and only those. `carried` is already up to date.
    pub fn carried_changed(&mut self, set: &[String], appeared: bool, carried: &Carried) {
        let set = sorted(set);
        for (class, refs) in &mut self.refs {
            if class.is_empty() || refs.claimable == appeared || !covers(&set, class) {
                continue;
            }
            // A set that left may leave the class carried by another.
            refs.claimable = appeared || carried.covers(class);
            if refs.claimable == appeared
                && let Some(tasks) = self.classes.get(class)
            {
                if appeared {
                    assert!(
                        self.unclaimable.remove(class),
                        "class {class:?}: unclaimable until a set covering it appeared"
                    );
                    assert!(
                        self.unclaimable_ready >= tasks.len() as u64,
                        "class {class:?}: unclaimable tasks never underflow"
                    );
                    self.unclaimable_ready -= tasks.len() as u64;
                } else {
                    assert!(
                        self.unclaimable.insert(Arc::clone(class)),
                        "class {class:?}: claimable until the last set covering it left"
                    );
                    self.unclaimable_ready += tasks.len() as u64;
                }
            }
        }
    }

    /// Asserts that the unclaimable classes and their count match the classes' flags,
    /// and (given the members' label sets) that each flag is right.
    pub fn check_unclaimable(&self, carried: Option<&Carried>) {
        let mut ready = 0;
        self.classes.check();
        for (class, tasks) in self.classes.iter() {
            let refs = &self.refs[class];
            assert_eq!(
                self.unclaimable.contains(class),
                !refs.claimable,
                "class {class:?}: listed as unclaimable exactly when no member carries it"
            );
            if !refs.claimable {
                ready += tasks.len() as u64;
            }
        }
        assert!(
            self.unclaimable
                .iter()
                .all(|c| self.classes.contains_key(c)),
            "an unclaimable class without dispatchable tasks is listed"
        );
        assert_eq!(
            ready, self.unclaimable_ready,
            "unclaimable tasks miscounted"
        );
        if let Some(carried) = carried {
            for (class, refs) in &self.refs {
                assert_eq!(
                    refs.claimable,
                    carried.covers(class),
                    "class {class:?}: stale claimability"
                );
            }
        }
    }

    /// Makes a ready task dispatchable: into its class, or for a task with limits
    /// through its gate first.
    fn dispatchable(
        &mut self,
        class: &Class,
        priority: u8,
        id: Ulid,
        group: Option<&Group>,
        uses: Option<&Uses>,
        gate: &mut Gate<'_>,
    ) {
        debug_assert!(
            self.refs.get(class).is_some_and(|r| r.tasks > 0),
            "task {id}: a dispatchable task's class counts it"
        );
        let Some(uses) = uses else {
            self.class_entry(class, (Reverse(priority), id.to_bytes()), id, group);
            return;
        };
        let fresh = self.gated.insert(
            id,
            GatedTask {
                class: Arc::clone(class),
                priority,
                group: group.cloned(),
                uses: Arc::clone(uses),
                gated: None,
            },
        );
        assert!(fresh.is_none(), "task {id} dispatchable twice");
        self.place(id, gate);
    }

    /// Takes a task that is no longer dispatchable out of its class, or out of its
    /// gate's place.
    fn unclass(
        &mut self,
        class: &Class,
        priority: u8,
        id: Ulid,
        group: Option<&Group>,
        gate: &mut Gate<'_>,
    ) {
        if !self.gated.is_empty() && self.gated.contains_key(&id) {
            self.unplace(id, gate);
            self.gated.remove(&id);
            return;
        }
        self.unclass_entry(class, (Reverse(priority), id.to_bytes()), id, group);
    }

    /// Puts a task into its class.
    fn class_entry(&mut self, class: &Class, entry: Entry, id: Ulid, group: Option<&Group>) {
        if !self.classes.contains_key(class) {
            if let Some(first) = class.first() {
                self.by_first_label
                    .entry(first.clone())
                    .or_default()
                    .push(Arc::clone(class));
            }
            let refs = self
                .refs
                .get(class)
                .unwrap_or_else(|| panic!("task {id}: its label class is not counted"));
            if !refs.claimable {
                self.unclaimable.insert(Arc::clone(class));
            }
        }
        assert!(
            self.classes.insert(class, entry, group),
            "task {id} dispatchable twice"
        );
        if self.unclaimable.contains(class) {
            self.unclaimable_ready += 1;
        }
    }

    /// Takes a task out of its class.
    fn unclass_entry(&mut self, class: &Class, entry: Entry, id: Ulid, group: Option<&Group>) {
        assert!(
            self.classes.remove(class, entry, group),
            "task {id} was not dispatchable in its class"
        );
        if self.unclaimable.contains(class) {
            assert!(
                self.unclaimable_ready > 0,
                "task {id}: unclaimable tasks never underflow"
            );
            self.unclaimable_ready -= 1;
        }
        if !self.classes.contains_key(class) {
            self.unclaimable.remove(class);
            if let Some(first) = class.first() {
                let siblings = self
                    .by_first_label
                    .get_mut(first)
                    .expect("a class is listed under its first label");
                let at = siblings
                    .iter()
                    .position(|c| c == class)
                    .expect("a class is listed under its first label");
                siblings.swap_remove(at);
                if siblings.is_empty() {
                    self.by_first_label.remove(first);
                }
            }
        }
    }

    /// Brings the front of a key's line up to date after one task joined or left it:
    /// a single change moves the boundary by at most one place, so the first
    /// `key_concurrency + 1` places are all that can change.
    fn refresh(&mut self, key: &Arc<str>, key_concurrency: u32, gate: &mut Gate<'_>) {
        self.refresh_front(key, key_concurrency, key_concurrency as usize + 1, gate);
    }

    fn refresh_all(&mut self, key: &Arc<str>, key_concurrency: u32, gate: &mut Gate<'_>) {
        self.refresh_front(key, key_concurrency, usize::MAX, gate);
    }

    fn refresh_front(
        &mut self,
        key: &Arc<str>,
        key_concurrency: u32,
        places: usize,
        gate: &mut Gate<'_>,
    ) {
        let Some(line) = self.keys.get_mut(key) else {
            return;
        };
        // Leased tasks anywhere in the line use up places (a redriven task can join the
        // line ahead of one already leased).
        let free = line.leased < key_concurrency;
        let mut changes = Vec::new();
        for (place, (id, slot)) in line.slots.iter_mut().enumerate().take(places) {
            debug_assert!(
                !(slot.ready && slot.leased),
                "task {id}: ready or leased in its key's line, not both"
            );
            let should = slot.ready && free && place < key_concurrency as usize;
            if should != slot.dispatchable {
                slot.dispatchable = should;
                changes.push((
                    should,
                    Arc::clone(&slot.class),
                    slot.priority,
                    *id,
                    slot.group.clone(),
                    slot.uses.clone(),
                ));
            }
        }
        for (on, class, priority, id, group, uses) in changes {
            if on {
                self.dispatchable(&class, priority, id, group.as_ref(), uses.as_ref(), gate);
                self.held_back = self
                    .held_back
                    .checked_sub(1)
                    .expect("held_back counts the held-back tasks");
            } else {
                self.unclass(&class, priority, id, group.as_ref(), gate);
                self.held_back += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct T {
        id: Ulid,
        state: TaskState,
        priority: u8,
        key: Option<Arc<str>>,
        class: Class,
    }

    impl T {
        fn new(
            n: u128,
            priority: u8,
            key: Option<&str>,
            labels: &[&str],
            index: &DispatchIndex,
        ) -> T {
            let labels: Vec<String> = labels.iter().map(|s| (*s).to_owned()).collect();
            T {
                id: Ulid(n),
                state: TaskState::Ready,
                priority,
                key: key.map(Arc::from),
                class: index.class(&labels),
            }
        }

        fn r(&self) -> TaskRef<'_> {
            TaskRef {
                id: self.id,
                state: self.state,
                priority: self.priority,
                key: self.key.as_ref(),
                class: &self.class,
                uses: None,
                group: None,
            }
        }
    }

    /// No limit: the tasks here name none, so they never reach a gate.
    struct NoLimits {
        limits: Limits,
        queue: Arc<str>,
    }

    impl NoLimits {
        fn new() -> NoLimits {
            NoLimits {
                limits: Limits::new(0),
                queue: Arc::from("q"),
            }
        }

        fn g(&mut self) -> Gate<'_> {
            Gate {
                limits: &mut self.limits,
                queue: &self.queue,
            }
        }
    }

    fn labels(l: &[&str]) -> Vec<String> {
        l.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn priority_then_enqueue_order_within_and_across_classes() {
        let mut ix = DispatchIndex::default();
        let mut nl = NoLimits::new();
        let a = T::new(1, 0, None, &[], &ix);
        let b = T::new(2, 5, None, &["gpu"], &ix);
        let c = T::new(3, 5, None, &[], &ix);
        for t in [&a, &b, &c] {
            ix.add(t.r(), 1, &Carried::default(), &mut nl.g());
        }
        assert_eq!(ix.pick(&labels(&["gpu"]), |_| true, 0), Some(b.id));
        assert_eq!(ix.pick(&[], |_| true, 0), Some(c.id));
        ix.remove(c.r(), 1, &mut nl.g());
        assert_eq!(ix.pick(&[], |_| true, 0), Some(a.id));
    }

    #[test]
    fn a_claimer_takes_exactly_the_classes_its_labels_cover_and_emptied_classes_leave_the_index() {
        let mut ix = DispatchIndex::default();
        let mut nl = NoLimits::new();
        // Later ids for the classes it covers, so a wrong pick would show.
        let tasks = [
            T::new(1, 0, None, &["a", "c"], &ix),
            T::new(2, 0, None, &["c"], &ix),
            T::new(3, 0, None, &["b", "a"], &ix),
            T::new(4, 0, None, &["b"], &ix),
            T::new(5, 0, None, &[], &ix),
            T::new(6, 0, None, &["a"], &ix),
        ];
        for t in &tasks {
            ix.add(t.r(), 1, &Carried::default(), &mut nl.g());
        }
        let claimer = labels(&["b", "a", "b"]);
        let mut taken = Vec::new();
        while let Some(id) = ix.pick(&claimer, |_| true, 0) {
            let t = tasks.iter().find(|t| t.id == id).expect("a known task");
            ix.remove(t.r(), 1, &mut nl.g());
            taken.push(id.0);
        }
        assert_eq!(taken, [3, 4, 5, 6]);
        // Only the classes it cannot take are left, each listed under its first label.
        let listed: usize = ix.by_first_label.values().map(Vec::len).sum();
        assert_eq!((ix.classes.len(), listed), (2, 2));
        assert_eq!(ix.pick(&labels(&["c"]), |_| true, 0), Some(Ulid(2)));
        for t in &tasks[..2] {
            ix.remove(t.r(), 1, &mut nl.g());
        }
        assert!(ix.classes.len() == 0 && ix.by_first_label.is_empty());
    }

    #[test]
    fn unclaimable_classes_follow_tasks_and_the_label_sets_connected_members_carry() {
        let mut ix = DispatchIndex::default();
        let mut nl = NoLimits::new();
        let mut carried = Carried::default();
        let unclaimable = |ix: &DispatchIndex| {
            let mut listed: Vec<(Vec<String>, usize)> = ix
                .unclaimable_classes()
                .map(|(c, n)| (c.to_vec(), n))
                .collect();
            listed.sort();
            (ix.unclaimable(), listed)
        };
        let gpu = T::new(1, 0, None, &["gpu"], &ix);
        let big_gpu = T::new(2, 0, None, &["gpu", "big"], &ix);
        let plain = T::new(3, 0, None, &[], &ix);
        for t in [&gpu, &big_gpu, &plain] {
            ix.add(t.r(), 1, &carried, &mut nl.g());
        }
        ix.check_unclaimable(Some(&carried));
        // The class that needs no label is never unclaimable.
        assert_eq!(
            unclaimable(&ix),
            (2, vec![(labels(&["big", "gpu"]), 1), (labels(&["gpu"]), 1)])
        );
        // A member carrying gpu connects: only the gpu class becomes claimable.
        assert!(carried.add(&labels(&["gpu"])));
        ix.carried_changed(&labels(&["gpu"]), true, &carried);
        ix.check_unclaimable(Some(&carried));
        assert_eq!(unclaimable(&ix), (1, vec![(labels(&["big", "gpu"]), 1)]));
        // One carrying both (in any order); then the first leaves: both stay covered.
        assert!(carried.add(&labels(&["gpu", "big"])));
        ix.carried_changed(&labels(&["gpu", "big"]), true, &carried);
        assert!(carried.remove(&labels(&["gpu"])));
        ix.carried_changed(&labels(&["gpu"]), false, &carried);
        ix.check_unclaimable(Some(&carried));
        assert_eq!(unclaimable(&ix), (0, vec![]));
        // A task joins a claimable class; a second member with the same set is no new set.
        let gpu2 = T::new(4, 0, None, &["gpu"], &ix);
        ix.add(gpu2.r(), 1, &carried, &mut nl.g());
        assert!(!carried.add(&labels(&["big", "gpu"])));
        assert!(!carried.remove(&labels(&["big", "gpu"])));
        ix.check_unclaimable(Some(&carried));
        assert_eq!(unclaimable(&ix), (0, vec![]));
        // The last carrier leaves: every labelled class is unclaimable again.
        assert!(carried.remove(&labels(&["big", "gpu"])));
        ix.carried_changed(&labels(&["big", "gpu"]), false, &carried);
        ix.check_unclaimable(Some(&carried));
        assert_eq!(
            unclaimable(&ix),
            (3, vec![(labels(&["big", "gpu"]), 1), (labels(&["gpu"]), 2)])
        );
        // Tasks leaving take their emptied class off the list.
        ix.remove(gpu.r(), 1, &mut nl.g());
        ix.remove(gpu2.r(), 1, &mut nl.g());
        ix.check_unclaimable(Some(&carried));
        assert_eq!(unclaimable(&ix), (1, vec![(labels(&["big", "gpu"]), 1)]));
    }

    #[test]
    fn a_key_is_served_in_order_one_at_a_time_and_a_scheduled_head_holds_it_back() {
        let mut ix = DispatchIndex::default();
        let mut nl = NoLimits::new();
        let mut k1 = T::new(1, 0, Some("k"), &[], &ix);
        let k2 = T::new(2, 9, Some("k"), &[], &ix);
        let other = T::new(3, 0, Some("o"), &[], &ix);
        for t in [&k1, &k2, &other] {
            ix.add(t.r(), 1, &Carried::default(), &mut nl.g());
        }
        // k2 has a higher priority, but k1 is ahead of it in the key's line.
        assert_eq!(ix.pick(&[], |_| true, 0), Some(k1.id));
        assert_eq!(ix.held_back(), 1);
        // k1 leased: k2 still waits; the other key does not.
        ix.remove(k1.r(), 1, &mut nl.g());
        k1.state = TaskState::Leased;
        ix.add(k1.r(), 1, &Carried::default(), &mut nl.g());
        assert_eq!(ix.pick(&[], |_| true, 0), Some(other.id));
        ix.remove(other.r(), 1, &mut nl.g());
        assert_eq!(ix.pick(&[], |_| true, 0), None);
        // k1 fails and waits for its retry: it still heads the line.
        ix.remove(k1.r(), 1, &mut nl.g());
        k1.state = TaskState::Scheduled;
        ix.add(k1.r(), 1, &Carried::default(), &mut nl.g());
        assert_eq!(ix.pick(&[], |_| true, 0), None);
        // With a key concurrency of 2 the second place may go.
        ix.rebuild(2, &mut nl.g());
        assert_eq!(ix.pick(&[], |_| true, 0), Some(k2.id));
        ix.rebuild(1, &mut nl.g());
        assert_eq!(ix.pick(&[], |_| true, 0), None);
        // k1 done: k2 is head now.
        ix.remove(k1.r(), 1, &mut nl.g());
        assert_eq!(ix.pick(&[], |_| true, 0), Some(k2.id));
        assert_eq!(ix.held_back(), 0);
    }

    #[test]
    fn a_redriven_task_ahead_of_a_leased_one_waits_for_it() {
        let mut ix = DispatchIndex::default();
        let mut nl = NoLimits::new();
        let a = T::new(1, 0, Some("k"), &[], &ix);
        let mut b = T::new(2, 0, Some("k"), &[], &ix);
        // A died (it left the line); B is leased.
        b.state = TaskState::Leased;
        ix.add(b.r(), 1, &Carried::default(), &mut nl.g());
        // A is redriven: it rejoins the line ahead of B, but B holds the key's one place.
        ix.add(a.r(), 1, &Carried::default(), &mut nl.g());
        assert_eq!(ix.pick(&[], |_| true, 0), None);
        ix.remove(b.r(), 1, &mut nl.g());
        assert_eq!(ix.pick(&[], |_| true, 0), Some(a.id));
    }
}
