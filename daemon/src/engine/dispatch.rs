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
//! Tasks with a **key** are handed out in enqueue order, at most `key_concurrency` at a
//! time: every unfinished task of a key (scheduled, ready or leased) waits in the key's
//! line, and only a ready task among the first `key_concurrency` of the line is
//! dispatchable, and only while fewer than `key_concurrency` of the line are leased. A key whose head is leased or scheduled for a retry holds back the
//! rest of its line; other keys are not affected.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use ulid::Ulid;

use muster_protocol::model::TaskState;

/// The labels a task requires, sorted and without duplicates; shared by its class.
pub type Class = Arc<[String]>;

/// A label set as its class holds it: sorted, without duplicates.
pub fn sorted(requires: &[String]) -> Vec<String> {
    let mut labels = requires.to_vec();
    labels.sort();
    labels.dedup();
    labels
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
}

/// One task in a key's line.
#[derive(Debug)]
struct Slot {
    priority: u8,
    class: Class,
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

/// The dispatch index of one queue.
#[derive(Debug, Default)]
pub struct DispatchIndex {
    /// How many indexed tasks (scheduled, ready or leased) require each label class:
    /// the classes the queue knows, capped at `MAX_LABEL_CLASSES` for new tasks.
    refs: HashMap<Class, u32>,
    /// Dispatchable ready tasks per label class.
    classes: HashMap<Class, BTreeSet<(Reverse<u8>, Ulid)>>,
    /// The non-empty classes of `classes` by their first (smallest) label: a claimer
    /// looks only at the classes whose first label it carries, each once.
    by_first_label: HashMap<String, Vec<Class>>,
    /// Each key's line of unfinished tasks, in enqueue order.
    keys: HashMap<Arc<str>, Line>,
    /// Ready tasks with a key that are held back by their key's line.
    held_back: u64,
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

    /// Adds a task that entered a scheduled, ready or leased state.
    pub fn add(&mut self, t: TaskRef<'_>, key_concurrency: u32) {
        *self.refs.entry(Arc::clone(t.class)).or_default() += 1;
        let ready = t.state == TaskState::Ready;
        match t.key {
            None => {
                if ready {
                    self.class_set(t.class).insert((Reverse(t.priority), t.id));
                }
            }
            Some(key) => {
                let leased = t.state == TaskState::Leased;
                let slot = Slot {
                    priority: t.priority,
                    class: Arc::clone(t.class),
                    ready,
                    leased,
                    dispatchable: false,
                };
                if ready {
                    self.held_back += 1;
                }
                let line = self.keys.entry(Arc::clone(key)).or_default();
                line.leased += u32::from(leased);
                line.slots.insert(t.id, slot);
                self.refresh(key, key_concurrency);
            }
        }
    }

    /// Removes a task that leaves its scheduled, ready or leased state.
    pub fn remove(&mut self, t: TaskRef<'_>, key_concurrency: u32) {
        let refs = self
            .refs
            .get_mut(t.class)
            .unwrap_or_else(|| panic!("task {}: its label class is not counted", t.id));
        *refs -= 1;
        if *refs == 0 {
            self.refs.remove(t.class);
        }
        match t.key {
            None => {
                if t.state == TaskState::Ready {
                    self.unclass(t.class, t.priority, t.id);
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
                line.leased = line
                    .leased
                    .checked_sub(u32::from(slot.leased))
                    .expect("a line counts its leased tasks");
                if line.slots.is_empty() {
                    self.keys.remove(key);
                }
                if slot.dispatchable {
                    self.unclass(&slot.class, slot.priority, t.id);
                } else if slot.ready {
                    self.held_back = self
                        .held_back
                        .checked_sub(1)
                        .expect("held_back counts the held-back tasks");
                }
                self.refresh(key, key_concurrency);
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
        let first = |set: &BTreeSet<(Reverse<u8>, Ulid)>| {
            set.iter()
                .take(max_skip + 1)
                .find(|(_, id)| allowed(*id))
                .copied()
        };
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
            .map(|(_, id)| id)
    }

    /// Recomputes every key's dispatchable tasks, after `key_concurrency` changed.
    pub fn rebuild(&mut self, key_concurrency: u32) {
        let keys: Vec<Arc<str>> = self.keys.keys().cloned().collect();
        for key in keys {
            self.refresh_all(&key, key_concurrency);
        }
    }

    /// Ready tasks held back by their key's line.
    pub fn held_back(&self) -> u64 {
        self.held_back
    }

    /// Dispatchable ready tasks per label class.
    pub fn classes(&self) -> impl Iterator<Item = (&Class, usize)> {
        self.classes.iter().map(|(c, s)| (c, s.len()))
    }

    fn class_set(&mut self, class: &Class) -> &mut BTreeSet<(Reverse<u8>, Ulid)> {
        if !self.classes.contains_key(class)
            && let Some(first) = class.first()
        {
            self.by_first_label
                .entry(first.clone())
                .or_default()
                .push(Arc::clone(class));
        }
        self.classes.entry(Arc::clone(class)).or_default()
    }

    fn unclass(&mut self, class: &Class, priority: u8, id: Ulid) {
        let set = self
            .classes
            .get_mut(class)
            .unwrap_or_else(|| panic!("task {id}: its label class is not indexed"));
        assert!(
            set.remove(&(Reverse(priority), id)),
            "task {id} was not dispatchable in its class"
        );
        if set.is_empty() {
            self.classes.remove(class);
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
    fn refresh(&mut self, key: &Arc<str>, key_concurrency: u32) {
        self.refresh_front(key, key_concurrency, key_concurrency as usize + 1);
    }

    fn refresh_all(&mut self, key: &Arc<str>, key_concurrency: u32) {
        self.refresh_front(key, key_concurrency, usize::MAX);
    }

    fn refresh_front(&mut self, key: &Arc<str>, key_concurrency: u32, places: usize) {
        let Some(line) = self.keys.get_mut(key) else {
            return;
        };
        // Leased tasks anywhere in the line use up places (a redriven task can join the
        // line ahead of one already leased).
        let free = line.leased < key_concurrency;
        let mut changes = Vec::new();
        for (place, (id, slot)) in line.slots.iter_mut().enumerate().take(places) {
            let should = slot.ready && free && place < key_concurrency as usize;
            if should != slot.dispatchable {
                slot.dispatchable = should;
                changes.push((should, Arc::clone(&slot.class), slot.priority, *id));
            }
        }
        for (on, class, priority, id) in changes {
            if on {
                assert!(
                    self.class_set(&class).insert((Reverse(priority), id)),
                    "task {id} dispatchable twice"
                );
                self.held_back = self
                    .held_back
                    .checked_sub(1)
                    .expect("held_back counts the held-back tasks");
            } else {
                self.unclass(&class, priority, id);
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
            }
        }
    }

    fn labels(l: &[&str]) -> Vec<String> {
        l.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn priority_then_enqueue_order_within_and_across_classes() {
        let mut ix = DispatchIndex::default();
        let a = T::new(1, 0, None, &[], &ix);
        let b = T::new(2, 5, None, &["gpu"], &ix);
        let c = T::new(3, 5, None, &[], &ix);
        for t in [&a, &b, &c] {
            ix.add(t.r(), 1);
        }
        assert_eq!(ix.pick(&labels(&["gpu"]), |_| true, 0), Some(b.id));
        assert_eq!(ix.pick(&[], |_| true, 0), Some(c.id));
        ix.remove(c.r(), 1);
        assert_eq!(ix.pick(&[], |_| true, 0), Some(a.id));
    }

    #[test]
    fn a_claimer_takes_exactly_the_classes_its_labels_cover_and_emptied_classes_leave_the_index() {
        let mut ix = DispatchIndex::default();
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
            ix.add(t.r(), 1);
        }
        let claimer = labels(&["b", "a", "b"]);
        let mut taken = Vec::new();
        while let Some(id) = ix.pick(&claimer, |_| true, 0) {
            let t = tasks.iter().find(|t| t.id == id).expect("a known task");
            ix.remove(t.r(), 1);
            taken.push(id.0);
        }
        assert_eq!(taken, [3, 4, 5, 6]);
        // Only the classes it cannot take are left, each listed under its first label.
        let listed: usize = ix.by_first_label.values().map(Vec::len).sum();
        assert_eq!((ix.classes.len(), listed), (2, 2));
        assert_eq!(ix.pick(&labels(&["c"]), |_| true, 0), Some(Ulid(2)));
        for t in &tasks[..2] {
            ix.remove(t.r(), 1);
        }
        assert!(ix.classes.is_empty() && ix.by_first_label.is_empty());
    }

    #[test]
    fn a_key_is_served_in_order_one_at_a_time_and_a_scheduled_head_holds_it_back() {
        let mut ix = DispatchIndex::default();
        let mut k1 = T::new(1, 0, Some("k"), &[], &ix);
        let k2 = T::new(2, 9, Some("k"), &[], &ix);
        let other = T::new(3, 0, Some("o"), &[], &ix);
        for t in [&k1, &k2, &other] {
            ix.add(t.r(), 1);
        }
        // k2 has a higher priority, but k1 is ahead of it in the key's line.
        assert_eq!(ix.pick(&[], |_| true, 0), Some(k1.id));
        assert_eq!(ix.held_back(), 1);
        // k1 leased: k2 still waits; the other key does not.
        ix.remove(k1.r(), 1);
        k1.state = TaskState::Leased;
        ix.add(k1.r(), 1);
        assert_eq!(ix.pick(&[], |_| true, 0), Some(other.id));
        ix.remove(other.r(), 1);
        assert_eq!(ix.pick(&[], |_| true, 0), None);
        // k1 fails and waits for its retry: it still heads the line.
        ix.remove(k1.r(), 1);
        k1.state = TaskState::Scheduled;
        ix.add(k1.r(), 1);
        assert_eq!(ix.pick(&[], |_| true, 0), None);
        // With a key concurrency of 2 the second place may go.
        ix.rebuild(2);
        assert_eq!(ix.pick(&[], |_| true, 0), Some(k2.id));
        ix.rebuild(1);
        assert_eq!(ix.pick(&[], |_| true, 0), None);
        // k1 done: k2 is head now.
        ix.remove(k1.r(), 1);
        assert_eq!(ix.pick(&[], |_| true, 0), Some(k2.id));
        assert_eq!(ix.held_back(), 0);
    }

    #[test]
    fn a_redriven_task_ahead_of_a_leased_one_waits_for_it() {
        let mut ix = DispatchIndex::default();
        let a = T::new(1, 0, Some("k"), &[], &ix);
        let mut b = T::new(2, 0, Some("k"), &[], &ix);
        // A died (it left the line); B is leased.
        b.state = TaskState::Leased;
        ix.add(b.r(), 1);
        // A is redriven: it rejoins the line ahead of B, but B holds the key's one place.
        ix.add(a.r(), 1);
        assert_eq!(ix.pick(&[], |_| true, 0), None);
        ix.remove(b.r(), 1);
        assert_eq!(ix.pick(&[], |_| true, 0), Some(a.id));
    }
}
