//! A bucket's lines: per queue, the tasks waiting for the bucket's room and the tasks
//! it admitted.
//!
//! Most buckets in use have one line holding a task or two (a per-key limit's key, a
//! task enqueued and soon leased), and a busy deployment has hundreds of thousands of
//! them: so the lines are a small vector sorted by queue, and a line's admitted tasks
//! a sorted deque, where tasks arrive and leave mostly at the two ends (they are
//! admitted and leased in dispatch order). A bucket costs two small allocations, not
//! the B-tree nodes of a few hundred bytes each that sorted maps would take.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use crate::engine::dispatch::Entry;

/// One queue's line of a bucket.
#[derive(Debug, Default)]
pub(super) struct Line {
    /// Tasks waiting for the bucket's room, in dispatch order, each with its cost.
    pub(super) waiting: BTreeMap<Entry, u64>,
    /// The same tasks by cost: the first that fits is found without a scan.
    pub(super) by_cost: BTreeMap<u64, BTreeSet<Entry>>,
    /// Tasks admitted from the line (dispatchable, not yet leased).
    pub(super) admitted: Admitted,
}

impl Line {
    pub(super) fn is_empty(&self) -> bool {
        self.waiting.is_empty() && self.admitted.is_empty()
    }

    pub(super) fn wait(&mut self, entry: Entry, cost: u64) {
        assert!(
            self.waiting.insert(entry, cost).is_none(),
            "a task waits in a line once"
        );
        self.by_cost.entry(cost).or_default().insert(entry);
    }

    pub(super) fn unwait(&mut self, entry: &Entry) -> Option<u64> {
        let cost = self.waiting.remove(entry)?;
        let same = self
            .by_cost
            .get_mut(&cost)
            .expect("a waiting task is listed by its cost");
        assert!(same.remove(entry), "a waiting task is listed by its cost");
        if same.is_empty() {
            self.by_cost.remove(&cost);
        }
        Some(cost)
    }

    /// The first waiting task (in dispatch order) among those costing less than
    /// `below`, with its cost.
    pub(super) fn first_below(&self, below: u64) -> Option<(Entry, u64)> {
        self.by_cost
            .range(..below)
            .filter_map(|(cost, entries)| Some((*entries.first()?, *cost)))
            .min()
    }
}

/// A line's admitted tasks in dispatch order, each with its cost, and their costs
/// summed.
#[derive(Debug, Default)]
pub(super) struct Admitted {
    tasks: VecDeque<(Entry, u64)>,
    cost: u64,
}

impl Admitted {
    pub(super) fn len(&self) -> usize {
        self.tasks.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Their costs, summed.
    pub(super) fn cost(&self) -> u64 {
        self.cost
    }

    /// Where `entry` is, or would be, in dispatch order.
    fn position(&self, entry: &Entry) -> usize {
        self.tasks.partition_point(|(e, _)| e < entry)
    }

    /// Admits `entry` at `cost`; false if it already is.
    pub(super) fn insert(&mut self, entry: Entry, cost: u64) -> bool {
        let at = self.position(&entry);
        if self.tasks.get(at).is_some_and(|(e, _)| *e == entry) {
            return false;
        }
        self.tasks.insert(at, (entry, cost));
        self.cost += cost;
        true
    }

    /// Takes `entry` out; its cost, if it was admitted.
    pub(super) fn remove(&mut self, entry: &Entry) -> Option<u64> {
        let at = self.position(entry);
        if self.tasks.get(at).is_none_or(|(e, _)| e != entry) {
            return None;
        }
        let (_, cost) = self.tasks.remove(at).expect("found above");
        self.cost = self
            .cost
            .checked_sub(cost)
            .expect("a line's admitted cost sums its tasks' costs");
        Some(cost)
    }

    /// How many tasks are admitted ahead of `entry`, and their cost.
    pub(super) fn ahead(&self, entry: &Entry) -> (usize, u64) {
        let at = self.position(entry);
        (at, self.tasks.range(..at).map(|(_, c)| c).sum())
    }

    /// The tasks admitted at `entry` and behind it, in dispatch order.
    pub(super) fn from(&self, entry: &Entry) -> impl DoubleEndedIterator<Item = &(Entry, u64)> {
        self.tasks.range(self.position(entry)..)
    }

    /// Every admitted task, in dispatch order.
    pub(super) fn iter(&self) -> impl Iterator<Item = &(Entry, u64)> {
        self.tasks.iter()
    }
}

/// A bucket's lines, one per queue with tasks waiting or admitted, sorted by queue.
#[derive(Debug, Default)]
pub(super) struct Lines(Vec<(Arc<str>, Line)>);

impl Lines {
    fn position(&self, queue: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(q, _)| (**q).cmp(queue))
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(super) fn get(&self, queue: &str) -> Option<&Line> {
        self.position(queue).ok().map(|at| &self.0[at].1)
    }

    pub(super) fn get_mut(&mut self, queue: &str) -> Option<&mut Line> {
        self.position(queue).ok().map(|at| &mut self.0[at].1)
    }

    /// `queue`'s line, made if new.
    pub(super) fn get_or_default(&mut self, queue: &Arc<str>) -> &mut Line {
        let at = match self.position(queue) {
            Ok(at) => at,
            Err(at) => {
                self.0.insert(at, (Arc::clone(queue), Line::default()));
                at
            }
        };
        &mut self.0[at].1
    }

    /// Drops `queue`'s line if it holds nothing.
    pub(super) fn tidy(&mut self, queue: &str) {
        if let Ok(at) = self.position(queue)
            && self.0[at].1.is_empty()
        {
            self.0.remove(at);
        }
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&Arc<str>, &Line)> {
        self.0.iter().map(|(q, l)| (q, l))
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &Line> {
        self.0.iter().map(|(_, l)| l)
    }
}

impl IntoIterator for Lines {
    type Item = (Arc<str>, Line);
    type IntoIter = std::vec::IntoIter<(Arc<str>, Line)>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

#[cfg(test)]
mod tests {
    use std::cmp::Reverse;

    use super::*;

    fn entry(priority: u8, n: u8) -> Entry {
        let mut id = [0; 16];
        id[15] = n;
        (Reverse(priority), id)
    }

    #[test]
    fn admitted_tasks_keep_dispatch_order_and_their_summed_cost() {
        let mut a = Admitted::default();
        assert!(a.insert(entry(0, 2), 5));
        assert!(a.insert(entry(0, 1), 3));
        assert!(a.insert(entry(9, 7), 1));
        assert!(!a.insert(entry(0, 1), 4), "admitted once");
        let order: Vec<Entry> = a.iter().map(|(e, _)| *e).collect();
        assert_eq!(order, [entry(9, 7), entry(0, 1), entry(0, 2)]);
        assert_eq!((a.len(), a.cost()), (3, 9));
        assert_eq!(a.ahead(&entry(0, 2)), (2, 4));
        assert_eq!(a.ahead(&entry(0, 0)), (1, 1));
        let behind: Vec<u64> = a.from(&entry(0, 1)).map(|(_, c)| *c).collect();
        assert_eq!(behind, [3, 5]);
        assert_eq!(a.remove(&entry(0, 1)), Some(3));
        assert_eq!(a.remove(&entry(0, 1)), None);
        assert_eq!((a.len(), a.cost()), (2, 6));
    }

    #[test]
    fn lines_are_found_by_queue_and_dropped_when_empty() {
        let mut lines = Lines::default();
        let (a, b): (Arc<str>, Arc<str>) = (Arc::from("a"), Arc::from("b"));
        lines.get_or_default(&b).wait(entry(0, 1), 1);
        lines.get_or_default(&a).admitted.insert(entry(0, 2), 1);
        let queues: Vec<&str> = lines.iter().map(|(q, _)| &**q).collect();
        assert_eq!(queues, ["a", "b"]);
        lines.tidy("b");
        assert!(lines.get("b").is_some(), "a line with a waiting task stays");
        lines.get_mut("b").unwrap().unwait(&entry(0, 1));
        lines.tidy("b");
        assert!(lines.get("b").is_none());
        assert!(!lines.is_empty());
    }
}
