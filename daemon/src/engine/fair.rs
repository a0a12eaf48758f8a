//! Fair dispatch between a queue's groups: stride scheduling over its label classes.
//!
//! A task may name a **group** (a tenant, a customer, a user). In a queue with `fair`
//! on, the groups with dispatchable tasks take turns, among tasks of equal priority,
//! in proportion to their weights. Each active group has a **pass**; the next task is
//! the first (by priority, then enqueue order) of the group whose best task has the
//! best priority and, among those, the smallest pass; each lease moves its group's
//! pass on by its **stride**, [`STRIDE`] / weight. A group that becomes active starts
//! at the queue's virtual time (the smallest pass among the active groups, which never
//! goes back), so an idle group banks no turns and a group with a backlog of 100,000
//! tasks is ahead of a newcomer by one turn at most. A group that runs out of tasks
//! ahead of the virtual time and comes back before the virtual time gets there resumes
//! at its own pass: a group whose tasks come one at a time (a key's line) gains no
//! turns by leaving. Tasks without a group take their turns as one group (the empty
//! name). Groups cost memory only while they have dispatchable tasks or are ahead of
//! the virtual time, and none once no group has any.
//!
//! Each label class keeps its dispatchable tasks per group and its groups ordered by
//! (their first task's priority, pass, name): a pick looks at the first group of each
//! class the claimer carries, and a lease re-sorts its own group only, in the classes
//! that group has tasks in. Each step is O(log n), whatever the number of groups and
//! tasks. Weights apply from the next turn on; turning `fair` on or off re-sorts the
//! queue's dispatchable tasks once.

use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use ulid::Ulid;

use super::dispatch::{Class, Entry};

/// The pass a weight-1 group moves on by per lease: a group of weight `w` moves on by
/// `STRIDE / w`, so weights up to [`muster_protocol::limits::MAX_GROUP_WEIGHT`] keep a
/// stride of a thousand and more.
pub const STRIDE: u64 = 1 << 20;

/// A group's name, shared by its tasks' index entries.
pub type Group = Arc<str>;

/// Where a dispatchable task stands in its queue's dispatch order: priority (higher
/// first), its group's pass (0 without fair dispatch), then id (older first).
pub type Key = (Reverse<u8>, u64, [u8; 16]);

/// A label class's dispatchable tasks, in dispatch order.
#[derive(Debug)]
pub enum Ready {
    /// By priority, then enqueue order.
    Plain(BTreeSet<Entry>),
    /// By priority, then the turns of the groups, then enqueue order within a group.
    Fair(FairClass),
}

/// A label class's dispatchable tasks under fair dispatch.
#[derive(Debug, Default)]
pub struct FairClass {
    /// Each group with tasks here, by (its first task's priority, its pass, its name).
    heads: BTreeSet<(Reverse<u8>, u64, Group)>,
    /// Each group's tasks here, in dispatch order.
    groups: HashMap<Group, BTreeSet<Entry>>,
    /// How many tasks are here.
    len: usize,
}

/// The turns of a fair queue's groups.
#[derive(Debug, Default)]
pub struct Turns {
    /// Every weight other than 1.
    weights: HashMap<Group, u32>,
    /// Each group with dispatchable tasks.
    active: HashMap<Group, Active>,
    /// The active groups by pass: the first is the virtual time.
    by_pass: BTreeSet<(u64, Group)>,
    /// Groups that left ahead of the virtual time, by pass: each resumes there if it
    /// comes back before the virtual time passes it.
    resting: BTreeSet<(u64, Group)>,
    /// The pass of each group in `resting`.
    rested: HashMap<Group, u64>,
    /// The virtual time: where a group that becomes active starts.
    now: u64,
}

/// An active group.
#[derive(Debug)]
struct Active {
    pass: u64,
    /// The classes it has dispatchable tasks in.
    classes: Vec<Class>,
}

impl Ready {
    /// An empty class's set, fair or plain.
    pub fn new(fair: bool) -> Ready {
        if fair {
            Ready::Fair(FairClass::default())
        } else {
            Ready::Plain(BTreeSet::new())
        }
    }

    /// How many tasks are dispatchable here.
    pub fn len(&self) -> usize {
        match self {
            Ready::Plain(set) => set.len(),
            Ready::Fair(f) => f.len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The first task that `allowed` accepts, looking past at most `max_skip` refused
    /// ones (in a fair class: at most `max_skip + 1` groups, each as far).
    pub fn first(&self, allowed: &impl Fn(Ulid) -> bool, max_skip: usize) -> Option<Key> {
        let take = |set: &BTreeSet<Entry>| {
            set.iter()
                .take(max_skip + 1)
                .find(|(_, id)| allowed(Ulid::from_bytes(*id)))
                .copied()
        };
        match self {
            Ready::Plain(set) => take(set).map(|(p, id)| (p, 0, id)),
            Ready::Fair(f) => f
                .heads
                .iter()
                .take(max_skip + 1)
                .find_map(|(_, pass, g)| take(&f.groups[g]).map(|(p, id)| (p, *pass, id))),
        }
    }

    /// Every task here with its group (`None` in a plain class): for a change of mode.
    fn drain(self) -> Vec<(Entry, Option<Group>)> {
        match self {
            Ready::Plain(set) => set.into_iter().map(|e| (e, None)).collect(),
            Ready::Fair(f) => f
                .groups
                .into_iter()
                .flat_map(|(g, set)| set.into_iter().map(move |e| (e, Some(Arc::clone(&g)))))
                .collect(),
        }
    }
}

impl FairClass {
    /// Adds a task of group `g`, whose pass is `pass`.
    fn insert(&mut self, g: &Group, entry: Entry, pass: u64) -> bool {
        let set = self.groups.entry(Arc::clone(g)).or_default();
        let before = set.first().map(|e| e.0);
        if !set.insert(entry) {
            return false;
        }
        let after = set.first().map(|e| e.0).expect("a task was just added");
        if before != Some(after) {
            if let Some(p) = before {
                assert!(
                    self.heads.remove(&(p, pass, Arc::clone(g))),
                    "group {g:?}: its head is sorted by its first task"
                );
            }
            self.heads.insert((after, pass, Arc::clone(g)));
        }
        self.len += 1;
        true
    }

    /// Takes out a task of group `g`, whose pass is `pass`; says whether the group has
    /// no task left here.
    fn remove(&mut self, g: &Group, entry: Entry, pass: u64) -> Option<bool> {
        let set = self.groups.get_mut(g)?;
        let before = set.first().map(|e| e.0).expect("a listed group has tasks");
        if !set.remove(&entry) {
            return None;
        }
        self.len -= 1;
        let after = set.first().map(|e| e.0);
        if after != Some(before) {
            assert!(
                self.heads.remove(&(before, pass, Arc::clone(g))),
                "group {g:?}: its head is sorted by its first task"
            );
            match after {
                Some(p) => {
                    self.heads.insert((p, pass, Arc::clone(g)));
                }
                None => {
                    self.groups.remove(g);
                }
            }
        }
        Some(after.is_none())
    }

    /// Moves group `g`'s head from pass `old` to `new`.
    fn repass(&mut self, g: &Group, old: u64, new: u64) {
        let p = self.groups[g]
            .first()
            .map(|e| e.0)
            .expect("a listed group has tasks");
        assert!(
            self.heads.remove(&(p, old, Arc::clone(g))),
            "group {g:?}: its head is at its pass"
        );
        self.heads.insert((p, new, Arc::clone(g)));
    }
}

impl Turns {
    /// Turns with these weights (each group's other than 1).
    pub fn new(weights: impl IntoIterator<Item = (String, u32)>) -> Turns {
        let mut turns = Turns::default();
        turns.set_weights(weights);
        turns
    }

    /// Takes the queue's weights; they apply from each group's next turn.
    pub fn set_weights(&mut self, weights: impl IntoIterator<Item = (String, u32)>) {
        self.weights = weights
            .into_iter()
            .filter(|(_, w)| *w != 1)
            .map(|(g, w)| {
                assert!(w >= 1, "group {g:?}: a weight is at least 1");
                (Group::from(g), w)
            })
            .collect();
    }

    /// The pass of active group `g`.
    fn pass(&self, g: &Group) -> u64 {
        self.active
            .get(g)
            .unwrap_or_else(|| panic!("group {g:?} has dispatchable tasks, so it is active"))
            .pass
    }

    /// Group `g` gets a task in `class`: it becomes active (at the virtual time) if it
    /// was not, and lists the class if it is new to it. Gives its pass.
    fn join(&mut self, g: &Group, class: &Class) -> u64 {
        if !self.active.contains_key(g) {
            let pass = match self.rested.remove(g) {
                Some(pass) => {
                    assert!(
                        self.resting.remove(&(pass, Arc::clone(g))),
                        "a resting group is sorted by its pass"
                    );
                    pass
                }
                None => self.now,
            };
            assert!(
                self.by_pass.insert((pass, Arc::clone(g))),
                "group {g:?} is sorted once"
            );
            self.active.insert(
                Arc::clone(g),
                Active {
                    pass,
                    classes: Vec::new(),
                },
            );
        }
        let active = self.active.get_mut(g).expect("active now");
        if !active.classes.contains(class) {
            active.classes.push(Arc::clone(class));
        }
        active.pass
    }

    /// Group `g` has no task left in `class`: it forgets the class, and when it has
    /// none left, the group becomes inactive.
    fn left(&mut self, g: &Group, class: &Class) {
        let active = self
            .active
            .get_mut(g)
            .unwrap_or_else(|| panic!("group {g:?} had tasks, so it is active"));
        let at = active
            .classes
            .iter()
            .position(|c| c == class)
            .unwrap_or_else(|| panic!("group {g:?} lists the classes it has tasks in"));
        active.classes.swap_remove(at);
        if active.classes.is_empty() {
            let pass = active.pass;
            self.active.remove(g);
            assert!(
                self.by_pass.remove(&(pass, Arc::clone(g))),
                "an active group is sorted by its pass"
            );
            self.advance();
            if pass > self.now && !self.active.is_empty() {
                self.resting.insert((pass, Arc::clone(g)));
                self.rested.insert(Arc::clone(g), pass);
            }
        }
    }

    /// Keeps the virtual time at the smallest active pass, never going back, and
    /// forgets the resting groups it reached. With no group active, every group starts
    /// even again.
    fn advance(&mut self) {
        let Some((first, _)) = self.by_pass.first() else {
            self.resting.clear();
            self.rested.clear();
            return;
        };
        self.now = self.now.max(*first);
        while let Some((pass, g)) = self.resting.first().cloned()
            && pass <= self.now
        {
            self.resting.pop_first();
            self.rested.remove(&g);
        }
    }

    /// How many groups are active.
    pub fn active(&self) -> usize {
        self.active.len()
    }
}

/// A queue's dispatchable tasks by label class, plain or fair: the sets and, in a
/// fair queue, the turns of its groups.
#[derive(Debug, Default)]
pub struct Classes {
    sets: HashMap<Class, Ready>,
    /// `Some` in a fair queue.
    turns: Option<Turns>,
}

impl Classes {
    /// The dispatchable tasks of `class`.
    pub fn get(&self, class: &[String]) -> Option<&Ready> {
        self.sets.get(class)
    }

    pub fn contains_key(&self, class: &[String]) -> bool {
        self.sets.contains_key(class)
    }

    /// How many classes have dispatchable tasks (for the debug checks).
    #[cfg(any(test, debug_assertions))]
    pub fn len(&self) -> usize {
        self.sets.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&Class, &Ready)> {
        self.sets.iter()
    }

    /// Whether the queue dispatches fairly.
    pub fn fair(&self) -> bool {
        self.turns.is_some()
    }

    /// Active groups, in a fair queue.
    pub fn active_groups(&self) -> usize {
        self.turns.as_ref().map_or(0, Turns::active)
    }

    /// Adds a dispatchable task of group `group` to `class`; false if it was there.
    pub fn insert(&mut self, class: &Class, entry: Entry, group: Option<&Group>) -> bool {
        let fair = self.turns.is_some();
        let set = self
            .sets
            .entry(Arc::clone(class))
            .or_insert_with(|| Ready::new(fair));
        match set {
            Ready::Plain(set) => set.insert(entry),
            Ready::Fair(f) => {
                let g = group.map_or_else(|| Group::from(""), Arc::clone);
                let turns = self
                    .turns
                    .as_mut()
                    .expect("a fair class is in a fair queue");
                let pass = turns.join(&g, class);
                f.insert(&g, entry, pass)
            }
        }
    }

    /// Takes a task of group `group` out of `class`; false if it was not there. A
    /// class left empty is dropped.
    pub fn remove(&mut self, class: &Class, entry: Entry, group: Option<&Group>) -> bool {
        let Some(set) = self.sets.get_mut(class) else {
            return false;
        };
        let removed = match set {
            Ready::Plain(set) => set.remove(&entry),
            Ready::Fair(f) => {
                let g = group.map_or_else(|| Group::from(""), Arc::clone);
                let turns = self
                    .turns
                    .as_mut()
                    .expect("a fair class is in a fair queue");
                match f.remove(&g, entry, turns.pass(&g)) {
                    None => false,
                    Some(emptied) => {
                        if emptied {
                            turns.left(&g, class);
                        }
                        true
                    }
                }
            }
        };
        if set.is_empty() {
            self.sets.remove(class);
        }
        removed
    }

    /// The next turn goes to `group`'s task (just leased): its pass moves on by its
    /// stride, in every class it has tasks in.
    pub fn served(&mut self, group: Option<&Group>) {
        let Some(turns) = self.turns.as_mut() else {
            return;
        };
        let g = group.map_or_else(|| Group::from(""), Arc::clone);
        let weight = turns.weights.get(&g).copied().unwrap_or(1);
        let stride = STRIDE / u64::from(weight);
        let active = turns
            .active
            .get_mut(&g)
            .unwrap_or_else(|| panic!("group {g:?} is served a task it has, so it is active"));
        let old = active.pass;
        let new = old + stride;
        active.pass = new;
        for class in &active.classes {
            match self.sets.get_mut(class) {
                Some(Ready::Fair(f)) => f.repass(&g, old, new),
                _ => panic!("group {g:?} lists a fair class {class:?} it has tasks in"),
            }
        }
        assert!(
            turns.by_pass.remove(&(old, Arc::clone(&g))),
            "an active group is sorted by its pass"
        );
        turns.by_pass.insert((new, g));
        turns.advance();
    }

    /// Turns fair dispatch on (with these weights) or off, re-sorting every
    /// dispatchable task once; `group_of` gives a task's group.
    pub fn set_fair(
        &mut self,
        fair: bool,
        weights: impl IntoIterator<Item = (String, u32)>,
        group_of: impl Fn(Ulid) -> Option<Group>,
    ) {
        if fair == self.fair() {
            if let Some(turns) = self.turns.as_mut() {
                turns.set_weights(weights);
            }
            return;
        }
        let sets = std::mem::take(&mut self.sets);
        self.turns = fair.then(|| Turns::new(weights));
        for (class, set) in sets {
            for (entry, _) in set.drain() {
                let group = group_of(Ulid::from_bytes(entry.1));
                assert!(
                    self.insert(&class, entry, group.as_ref()),
                    "a task is dispatchable once"
                );
            }
        }
    }

    /// Asserts that every fair class's heads and lengths match its groups, and that the
    /// turns list exactly the groups and classes that have tasks.
    pub fn check(&self) {
        let Some(turns) = &self.turns else {
            assert!(
                self.sets.values().all(|s| matches!(s, Ready::Plain(_))),
                "a plain queue has plain classes"
            );
            return;
        };
        let mut listed = 0;
        for (class, set) in &self.sets {
            let Ready::Fair(f) = set else {
                panic!("class {class:?} of a fair queue is plain");
            };
            assert_eq!(
                f.len,
                f.groups.values().map(BTreeSet::len).sum::<usize>(),
                "class {class:?}: its length counts its groups' tasks"
            );
            assert_eq!(f.heads.len(), f.groups.len(), "one head per group");
            for (p, pass, g) in &f.heads {
                assert_eq!(f.groups[g].first().map(|e| e.0), Some(*p), "{g:?}'s head");
                assert_eq!(turns.pass(g), *pass, "group {g:?}'s head is at its pass");
                assert!(
                    turns.active[g].classes.contains(class),
                    "{g:?} lists {class:?}"
                );
            }
            listed += f.groups.len();
        }
        let classes: usize = turns.active.values().map(|a| a.classes.len()).sum();
        assert_eq!(
            classes, listed,
            "the turns list exactly the classes groups are in"
        );
        assert_eq!(
            turns.by_pass.len(),
            turns.active.len(),
            "each group sorted once"
        );
        assert!(
            turns.by_pass.first().is_none_or(|(p, _)| *p >= turns.now),
            "no active group is behind the virtual time"
        );
        assert_eq!(
            turns.resting.len(),
            turns.rested.len(),
            "resting sorted once"
        );
        for (pass, g) in &turns.resting {
            assert!(
                *pass > turns.now,
                "group {g:?} rests ahead of the virtual time"
            );
            assert_eq!(
                turns.rested.get(g),
                Some(pass),
                "group {g:?} rests at its pass"
            );
            assert!(
                !turns.active.contains_key(g),
                "group {g:?} rests or is active"
            );
        }
        assert!(
            !turns.active.is_empty() || turns.resting.is_empty(),
            "with no group active, none rests"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fair queue of one class, and each task's group.
    struct Q {
        classes: Classes,
        groups: HashMap<Ulid, Option<Group>>,
        class: Class,
        next_id: u128,
    }

    impl Q {
        fn new(weights: &[(&str, u32)]) -> Q {
            let mut classes = Classes::default();
            classes.set_fair(
                true,
                weights.iter().map(|(g, w)| ((*g).to_owned(), *w)),
                |_| None,
            );
            Q {
                classes,
                groups: HashMap::new(),
                class: Arc::from(Vec::<String>::new()),
                next_id: 1,
            }
        }

        fn add(&mut self, group: Option<&str>, priority: u8, n: usize) {
            for _ in 0..n {
                let id = Ulid(self.next_id);
                self.next_id += 1;
                let g = group.map(Group::from);
                assert!(self.classes.insert(
                    &self.class,
                    (Reverse(priority), id.to_bytes()),
                    g.as_ref()
                ));
                self.groups.insert(id, g);
            }
            self.classes.check();
        }

        /// Leases the next task as the engine does: served, then out of its class.
        fn lease(&mut self) -> Option<String> {
            let (p, _, id) = self.classes.get(&self.class)?.first(&|_| true, 0)?;
            let id = Ulid::from_bytes(id);
            let g = self.groups.remove(&id).expect("a known task");
            self.classes.served(g.as_ref());
            assert!(
                self.classes
                    .remove(&self.class, (p, id.to_bytes()), g.as_ref())
            );
            self.classes.check();
            Some(g.map_or_else(|| "-".to_owned(), |g| g.to_string()))
        }

        fn leases(&mut self, n: usize) -> Vec<String> {
            (0..n).map_while(|_| self.lease()).collect()
        }
    }

    #[test]
    fn a_backlog_does_not_delay_a_newcomer_by_more_than_a_turn() {
        let mut q = Q::new(&[]);
        q.add(Some("a"), 0, 10_000);
        assert_eq!(q.leases(3), ["a", "a", "a"]);
        q.add(Some("b"), 0, 3);
        // b starts at the virtual time (a's pass, three turns on): they alternate.
        assert_eq!(q.leases(8), ["a", "b", "a", "b", "a", "b", "a", "a"]);
        assert_eq!(q.classes.active_groups(), 1);
    }

    #[test]
    fn groups_take_turns_in_proportion_to_their_weights_and_a_change_applies_at_once() {
        let mut q = Q::new(&[("gold", 4)]);
        q.add(Some("gold"), 0, 1_000);
        q.add(Some("tin"), 0, 1_000);
        q.add(None, 0, 1_000);
        let count = |v: &[String], g: &str| v.iter().filter(|x| *x == g).count();
        let first = q.leases(600);
        assert_eq!(
            (
                count(&first, "gold"),
                count(&first, "tin"),
                count(&first, "-")
            ),
            (400, 100, 100)
        );
        q.classes.set_fair(true, [("tin".to_owned(), 2)], |_| None);
        let next = q.leases(400);
        assert_eq!(
            (count(&next, "gold"), count(&next, "tin"), count(&next, "-")),
            (100, 200, 100)
        );
    }

    #[test]
    fn priority_goes_before_turns_and_order_within_a_group_is_kept() {
        let mut q = Q::new(&[]);
        q.add(Some("a"), 0, 2);
        q.add(Some("b"), 0, 2);
        assert_eq!(q.leases(1), ["a"]);
        // a has had a turn, but its urgent task goes before b's.
        q.add(Some("a"), 5, 1);
        let first = q
            .classes
            .get(&q.class)
            .unwrap()
            .first(&|_| true, 0)
            .unwrap();
        assert_eq!((first.0, Ulid::from_bytes(first.2)), (Reverse(5), Ulid(5)));
        // The urgent task was a's turn too: b, two turns behind, takes two in a row.
        assert_eq!(q.leases(4), ["a", "b", "b", "a"]);
        assert!(q.lease().is_none());
        assert_eq!(q.classes.len(), 0, "an emptied class is dropped");
        assert_eq!(q.classes.active_groups(), 0, "idle groups are forgotten");
    }

    #[test]
    fn an_idle_group_banks_no_turns() {
        let mut q = Q::new(&[]);
        q.add(Some("a"), 0, 100);
        q.add(Some("b"), 0, 1);
        assert_eq!(q.leases(2), ["a", "b"]);
        assert_eq!(q.leases(50), vec!["a"; 50]);
        // b was away for 50 of a's turns; it comes back at a's pass, not 50 behind.
        q.add(Some("b"), 0, 10);
        assert_eq!(q.leases(6), ["a", "b", "a", "b", "a", "b"]);
    }

    #[test]
    fn turning_fair_off_and_on_keeps_every_task_and_plain_order_is_enqueue_order() {
        let mut q = Q::new(&[]);
        q.add(Some("a"), 0, 3);
        q.add(Some("b"), 0, 3);
        let groups = q.groups.clone();
        q.classes.set_fair(false, [], |id| groups[&id].clone());
        q.classes.check();
        assert_eq!(q.classes.get(&q.class).map(Ready::len), Some(6));
        let first = q
            .classes
            .get(&q.class)
            .unwrap()
            .first(&|_| true, 0)
            .unwrap();
        assert_eq!(first, (Reverse(0), 0, Ulid(1).to_bytes()));
        q.classes.set_fair(true, [], |id| groups[&id].clone());
        assert_eq!(q.leases(6), ["a", "b", "a", "b", "a", "b"]);
    }
}
