//! Families: the children a leased task spawns (`spawn`), its wait for them to finish
//! (fan-in), and a cancel that reaches every unfinished descendant (cascade).
//!
//! A child's record names its parent and its key among the parent's children; the
//! index here is rebuilt from those at start-up, and kept by [`Engine::save`] and
//! [`Engine::remove`] like every other index: [`Families::indexed`] and
//! [`Families::unindexed`] count each parent's unfinished children as its children
//! come and go from unfinished states.
//!
//! A parent waiting for its children is suspended (no lease, no slot: a full swarm of
//! waiting parents cannot starve the children of holders) with a suspension that
//! `waits` for them. Whenever a parent's unfinished count may have reached zero it is
//! noted in `fan_in`, and at the end of the request or timer that did it (in the same
//! atomic change) a waiting parent with none left wakes with each child's outcome. A
//! task cancelled, or asked to cancel while leased, is noted in `cascade`: its
//! unfinished children are cancelled (asked to, when leased) at the end of the request,
//! at most [`CASCADE_BATCH`] per round, the rest in the next rounds; a child with
//! children of its own carries the cascade on. Both sets are rebuilt at start-up from
//! the records, so a crash between rounds of a long cascade loses none of it.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use ulid::Ulid;

use muster_protocol::ErrorCode;
use muster_protocol::limits::{
    MAX_CHILD_OUTCOME_BYTES, MAX_CHILD_OUTCOMES_BYTES, MAX_CHILDREN, MAX_DEPTH, MAX_SPAWN,
    MAX_TREE_NODES,
};
use muster_protocol::model::{ChildOutcome, ChildSummary, NewTask, TaskState, TreeNode};
use muster_protocol::names;
use muster_protocol::ops::{Enqueue, Spawn, SpawnReply, SpawnedChild};

use super::ops::bad;
use super::sharded::IdMap;
use super::suspend::{Waker, check_suspension};
use super::{Engine, Now, OpResult, Waiter, client, push_event, store_only};
use crate::auth::Principal;
use crate::store::{ParentLink, StoreError};

/// Most tasks a cascade cancels (or asks to cancel) per request or timer; the rest
/// follow in the next rounds.
pub(super) const CASCADE_BATCH: usize = 1000;

/// The family index: every stored child's parent, every parent's stored children and
/// how many are unfinished, and the parents to look at again.
#[derive(Default)]
pub(super) struct Families {
    /// Each stored child's parent and its key among the parent's children.
    parent_of: IdMap<(Ulid, Box<str>)>,
    /// Each parent's stored children (a parent removed keeps its entry while any
    /// child of it is stored).
    children: IdMap<Children>,
    /// Parents whose unfinished children may have reached none since they were last
    /// looked at.
    fan_in: BTreeSet<Ulid>,
    /// Tasks cancelled, or asked to cancel, whose unfinished children are still to be.
    cascade: BTreeSet<Ulid>,
}

/// One parent's stored children.
#[derive(Default)]
struct Children {
    /// By their keys.
    by_key: HashMap<Box<str>, Ulid>,
    /// How many are unfinished.
    unfinished: u32,
}

impl Families {
    /// Task `id`, a child of `parent` when it names one, was indexed in `state`.
    pub(super) fn indexed(&mut self, id: Ulid, parent: Option<(Ulid, &str)>, state: TaskState) {
        if let Some((parent, key)) = parent {
            let children = match self.children.get_mut(&parent) {
                Some(children) => children,
                None => {
                    self.children.insert(parent, Children::default());
                    self.children.get_mut(&parent).expect("inserted above")
                }
            };
            if !self.parent_of.contains_key(&id) {
                self.parent_of.insert(id, (parent, key.into()));
                let other = children.by_key.insert(key.into(), id);
                assert!(
                    other.is_none(),
                    "task {parent}: child key {key:?} names {id} and {other:?}"
                );
            }
            debug_assert_eq!(
                self.parent_of.get(&id).map(|(p, _)| *p),
                Some(parent),
                "task {id}: one parent"
            );
            if !state.is_finished() {
                children.unfinished += 1;
            }
        }
        if state == TaskState::Cancelled && self.unfinished(id) > 0 {
            self.cascade.insert(id);
        }
    }

    /// Task `id`, indexed in `state`, is being unindexed.
    pub(super) fn unindexed(&mut self, id: Ulid, state: TaskState) {
        if state.is_finished() {
            return;
        }
        let Some((parent, _)) = self.parent_of.get(&id) else {
            return;
        };
        let parent = *parent;
        let children = self
            .children
            .get_mut(&parent)
            .unwrap_or_else(|| panic!("task {id}: its parent {parent} has no children"));
        children.unfinished = children
            .unfinished
            .checked_sub(1)
            .unwrap_or_else(|| panic!("task {parent}: more children finished than it had"));
        if children.unfinished == 0 {
            self.fan_in.insert(parent);
        }
    }

    /// Task `id` was removed (it was unindexed first).
    pub(super) fn removed(&mut self, id: Ulid) {
        self.cascade.remove(&id);
        let Some((parent, key)) = self.parent_of.remove(&id) else {
            return;
        };
        let children = self
            .children
            .get_mut(&parent)
            .unwrap_or_else(|| panic!("task {id}: its parent {parent} has no children"));
        assert_eq!(
            children.by_key.remove(&key),
            Some(id),
            "task {parent}: child key {key:?} names {id}"
        );
        if children.by_key.is_empty() {
            assert_eq!(
                children.unfinished, 0,
                "task {parent}: unfinished children but none stored"
            );
            self.children.remove(&parent);
        }
    }

    /// Unfinished children of `parent`.
    pub(super) fn unfinished(&self, parent: Ulid) -> u32 {
        self.children.get(&parent).map_or(0, |c| c.unfinished)
    }

    /// The stored child of `parent` with key `key`.
    fn child(&self, parent: Ulid, key: &str) -> Option<Ulid> {
        self.children.get(&parent)?.by_key.get(key).copied()
    }

    /// The stored children of `parent`, in the order they were spawned (their ids grow).
    pub(super) fn children_of(&self, parent: Ulid) -> Vec<Ulid> {
        let mut ids: Vec<Ulid> = self
            .children
            .get(&parent)
            .map(|c| c.by_key.values().copied().collect())
            .unwrap_or_default();
        ids.sort_unstable();
        ids
    }

    /// How many children `parent` has stored.
    pub(super) fn count(&self, parent: Ulid) -> usize {
        self.children.get(&parent).map_or(0, |c| c.by_key.len())
    }

    /// Whether a cascade or a fan-in is left to do.
    pub(super) fn pending(&self) -> bool {
        !self.cascade.is_empty() || !self.fan_in.is_empty()
    }

    /// Every parent, to look at again (at start-up).
    pub(super) fn parents(&self) -> Vec<Ulid> {
        self.children.keys().copied().collect()
    }

    /// Asks for `id`'s unfinished children to be cancelled.
    pub(super) fn cascade_from(&mut self, id: Ulid) {
        if self.unfinished(id) > 0 {
            self.cascade.insert(id);
        }
    }

    /// How many entries the index holds: for the refused-request digest (debug builds).
    #[cfg(debug_assertions)]
    pub(super) fn len(&self) -> (usize, usize) {
        (self.parent_of.len(), self.children.len())
    }
}

impl<W: Waiter> Engine<W> {
    pub(super) fn spawn(
        &mut self,
        r: Spawn,
        principal: Option<&Principal>,
        now: Now,
    ) -> OpResult<SpawnReply> {
        check_children(&r)?;
        let wait = match &r.wait {
            Some(w) => {
                let reason = w
                    .reason
                    .clone()
                    .unwrap_or_else(|| "waiting for its children".to_owned());
                Some(check_suspension(reason, w.timeout_ms, w.on_timeout)?)
            }
            None => None,
        };
        let parent = super::ops::parse_id(&r.task)?;
        if let Some(reply) = self.spawned_again(&r, parent, principal)? {
            return Ok(reply);
        }
        let (id, mut rec) = self.held(&r.task, r.epoch)?;
        let mut out: Vec<Option<SpawnedChild>> = r
            .children
            .iter()
            .map(|c| {
                self.index
                    .family
                    .child(id, &c.child_key)
                    .map(|cid| SpawnedChild {
                        child_key: c.child_key.clone(),
                        id: cid.to_string(),
                        duplicate: true,
                        state: self.index.tasks[&cid].state,
                    })
            })
            .collect();
        let new = out.iter().filter(|o| o.is_none()).count();
        let depth = rec.parent.as_ref().map_or(0, |p| p.depth) + 1;
        if new > 0 {
            if depth > MAX_DEPTH {
                return Err(client(
                    ErrorCode::Limit,
                    format!(
                        "task {id} is {} spawns deep; its children would pass the limit of {MAX_DEPTH}",
                        depth - 1
                    ),
                ));
            }
            let stored = self.index.family.count(id);
            if stored + new > MAX_CHILDREN {
                return Err(client(
                    ErrorCode::Limit,
                    format!(
                        "task {id} has {stored} children; {new} more would pass the limit of {MAX_CHILDREN}"
                    ),
                ));
            }
        }
        // Every queue's new children pass what an enqueue of them would, before any
        // is stored.
        let owner = principal.map(|p| p.name.as_str());
        let mut by_queue: BTreeMap<&str, Vec<NewTask>> = BTreeMap::new();
        for (c, o) in r.children.iter().zip(&out) {
            if o.is_none() {
                by_queue.entry(&c.queue).or_default().push(c.task.clone());
            }
        }
        let mut adding = 0;
        for (queue, tasks) in by_queue {
            let enqueue = Enqueue {
                queue: queue.to_owned(),
                tasks,
            };
            self.check_enqueue(&enqueue, principal, owner, adding, now)?;
            adding += enqueue
                .tasks
                .iter()
                .map(|t| t.payload.get().len() as u64 + crate::store::TASK_RECORD_BYTES)
                .sum::<u64>();
        }
        for (c, o) in r.children.iter().zip(out.iter_mut()) {
            if o.is_some() {
                continue;
            }
            let link = ParentLink {
                id,
                child_key: c.child_key.clone(),
                depth,
            };
            // A child named no trace of its own is in its parent's.
            let inherited;
            let task = match (&c.task.traceparent, &rec.traceparent) {
                (None, Some(_)) => {
                    inherited = NewTask {
                        traceparent: rec.traceparent.clone(),
                        tracestate: rec.tracestate.clone(),
                        ..c.task.clone()
                    };
                    &inherited
                }
                _ => &c.task,
            };
            let (cid, state) = self.store_new(&c.queue, task, owner, Some(link), now);
            super::telemetry::spawned(&c.queue);
            *o = Some(SpawnedChild {
                child_key: c.child_key.clone(),
                id: cid.to_string(),
                duplicate: false,
                state,
            });
        }
        let children: Vec<SpawnedChild> = out
            .into_iter()
            .map(|o| o.expect("every child answered"))
            .collect();
        let member = rec.lease.as_ref().map(|l| l.member.clone());
        if new > 0 {
            push_event(
                &mut rec,
                now,
                "spawned",
                member.as_deref().filter(|m| !m.is_empty()),
                Some(r.epoch),
                None,
            );
        }
        let Some(wait) = wait else {
            let clock = self.index.tasks[&id].clock();
            self.save(id, &rec, clock);
            if rec.cancel_requested {
                // Spawned under a cancel: they follow their parent.
                self.index.family.cascade_from(id);
            }
            return Ok(SpawnReply {
                children,
                state: TaskState::Leased,
                resume_token: None,
                timeout_at_ms: None,
            });
        };
        let suspended = self.suspend_held(id, rec, r.epoch, wait, true, now);
        let mut reply = SpawnReply {
            children,
            state: suspended.state,
            resume_token: suspended.resume_token,
            timeout_at_ms: suspended.timeout_at_ms,
        };
        if suspended.state == TaskState::Suspended && self.index.family.unfinished(id) == 0 {
            // Every child has finished already: the wait ends as it begins (once what
            // it read is committed; a crash in between leaves a task waiting for no
            // unfinished child, which the start-up wakes: `restore_families`).
            self.commit()?;
            let mut rec = self.record(id)?;
            self.wake(id, &mut rec, now, Waker::Children)?;
            reply.state = rec.state;
            reply.resume_token = None;
            reply.timeout_at_ms = None;
        }
        Ok(reply)
    }

    /// A holder's repeat of the spawn that made its task wait under `r.epoch` (its reply
    /// lost): the same children, answered as spawned, and a new resume token. `None`
    /// when the task is not waiting under that epoch (then it is a spawn to make).
    fn spawned_again(
        &mut self,
        r: &Spawn,
        parent: Ulid,
        principal: Option<&Principal>,
    ) -> OpResult<Option<SpawnReply>> {
        if r.wait.is_none() {
            return Ok(None);
        }
        let suspended = self
            .index
            .tasks
            .get(&parent)
            .is_some_and(|m| m.state == TaskState::Suspended && m.epoch == r.epoch);
        // Suspended under that epoch by a spawn with `wait`, not by a plain suspend.
        if !suspended
            || !self
                .record(parent)?
                .suspension
                .is_some_and(|s| s.info.children)
        {
            return Ok(None);
        }
        let children = r
            .children
            .iter()
            .map(|c| {
                let cid = self.index.family.child(parent, &c.child_key).ok_or_else(|| {
                    client(
                        ErrorCode::InvalidState,
                        format!(
                            "task {parent} waits for its children already; it never spawned {:?}",
                            c.child_key
                        ),
                    )
                })?;
                Ok(SpawnedChild {
                    child_key: c.child_key.clone(),
                    id: cid.to_string(),
                    duplicate: true,
                    state: self.index.tasks[&cid].state,
                })
            })
            .collect::<OpResult<Vec<_>>>()?;
        let Some(suspended) = self.suspended_again(&r.task, r.epoch, principal)? else {
            return Ok(None);
        };
        Ok(Some(SpawnReply {
            children,
            state: suspended.state,
            resume_token: suspended.resume_token,
            timeout_at_ms: suspended.timeout_at_ms,
        }))
    }

    /// Cascades and fan-ins left to do: at the end of every request and timer, after
    /// its changes are committed (the records read here are the stored ones), in the
    /// same round: a child's end and its parent's wake are made durable together, and
    /// a crash between the two commits leaves what [`Self::restore_families`] finishes.
    pub(super) fn settle_families(&mut self, now: Now) -> Result<(), StoreError> {
        assert!(
            self.pending.is_empty(),
            "families settle on committed records"
        );
        let mut budget = CASCADE_BATCH;
        while budget > 0
            && let Some(id) = self.index.family.cascade.pop_first()
        {
            for child in self.index.family.children_of(id) {
                if budget == 0 {
                    // The rest in the next round.
                    self.index.family.cascade.insert(id);
                    break;
                }
                let state = self.index.tasks[&child].state;
                if state.is_finished() {
                    continue;
                }
                let rec = self.record(child).map_err(store_only)?;
                if state == TaskState::Leased && rec.cancel_requested {
                    continue;
                }
                budget -= 1;
                self.cancel_task(child, rec, now, Some("its parent was cancelled"));
            }
        }
        // The cascade's records are read as committed, as the fan-in's.
        self.commit()?;
        while let Some(id) = self.index.family.fan_in.pop_first() {
            let waiting = self.index.tasks.get(&id).is_some_and(|m| {
                m.state == TaskState::Suspended && self.index.family.unfinished(id) == 0
            });
            if !waiting {
                continue;
            }
            let mut rec = self.record(id).map_err(store_only)?;
            if rec.suspension.as_ref().is_some_and(|s| s.info.children) {
                self.wake(id, &mut rec, now, Waker::Children)?;
                self.commit()?;
            }
        }
        self.commit()
    }

    /// Each child of `parent` as its next holder sees it, results and errors within
    /// [`MAX_CHILD_OUTCOME_BYTES`] each and [`MAX_CHILD_OUTCOMES_BYTES`] in all.
    pub(super) fn child_outcomes(&self, parent: Ulid) -> Result<Vec<ChildOutcome>, StoreError> {
        let mut room = MAX_CHILD_OUTCOMES_BYTES;
        let mut out = Vec::new();
        for id in self.index.family.children_of(parent) {
            let rec = self.record(id).map_err(store_only)?;
            let key = rec
                .parent
                .as_ref()
                .map(|p| p.child_key.clone())
                .unwrap_or_else(|| panic!("task {id}: a child without its parent link"));
            let result = rec.result.filter(|_| rec.state == TaskState::Done);
            let error = rec.last_error.filter(|_| rec.state != TaskState::Done);
            let bytes = result.as_ref().map_or(0, |r| r.get().len())
                + error.as_ref().map_or(0, String::len);
            let fits = bytes <= MAX_CHILD_OUTCOME_BYTES && bytes <= room;
            if fits {
                room -= bytes;
            }
            out.push(ChildOutcome {
                id: id.to_string(),
                child_key: key,
                queue: rec.queue,
                state: rec.state,
                result: result.filter(|_| fits),
                error: error.filter(|_| fits),
                omitted: !fits,
            });
        }
        Ok(out)
    }

    /// Each stored child of `parent`, for its task view.
    pub(super) fn child_summaries(&self, parent: Ulid) -> Vec<ChildSummary> {
        self.index
            .family
            .children_of(parent)
            .into_iter()
            .map(|id| self.child_summary(id))
            .collect()
    }

    /// A stored child as its parent's view lists it.
    fn child_summary(&self, id: Ulid) -> ChildSummary {
        let family = &self.index.family;
        let (_, key) = family
            .parent_of
            .get(&id)
            .unwrap_or_else(|| panic!("task {id}: a child without its parent link"));
        let meta = &self.index.tasks[&id];
        ChildSummary {
            id: id.to_string(),
            child_key: key.to_string(),
            queue: meta.queue.to_string(),
            state: meta.state,
            children: family.count(id) as u32,
        }
    }

    /// Task `id`'s stored descendants, depth first in the order spawned, at most
    /// [`MAX_TREE_NODES`], from the family index alone; and whether some were left out.
    pub(super) fn family_tree(&self, id: Ulid) -> (Vec<TreeNode>, bool) {
        let family = &self.index.family;
        let mut nodes = Vec::new();
        let mut stack: Vec<(Ulid, u8)> = family
            .children_of(id)
            .into_iter()
            .rev()
            .map(|c| (c, 1))
            .collect();
        while let Some((child, depth)) = stack.pop() {
            if nodes.len() == MAX_TREE_NODES {
                return (nodes, true);
            }
            nodes.push(TreeNode {
                depth,
                child: self.child_summary(child),
            });
            stack.extend(
                family
                    .children_of(child)
                    .into_iter()
                    .rev()
                    .map(|g| (g, depth + 1)),
            );
        }
        debug_assert!(
            nodes.iter().all(|n| n.depth >= 1 && n.depth <= MAX_DEPTH),
            "task {id}: its tree within the spawn depth"
        );
        (nodes, false)
    }

    /// At start-up: every parent, and every suspended task, is looked at again (a
    /// cascade or a wake a crash cut short goes on: also the wake of a parent whose
    /// children are all gone, or that waited for none).
    pub(super) fn restore_families(&mut self) -> Result<(), StoreError> {
        let suspended: Vec<Ulid> = self.index.suspended.iter().map(|(_, id)| *id).collect();
        for id in suspended {
            if self.index.family.unfinished(id) == 0 {
                self.index.family.fan_in.insert(id);
            }
        }
        for parent in self.index.family.parents() {
            let Some(meta) = self.index.tasks.get(&parent) else {
                continue;
            };
            let cancelling = match meta.state {
                TaskState::Cancelled => true,
                TaskState::Leased => self.record(parent).map_err(store_only)?.cancel_requested,
                _ => false,
            };
            if cancelling {
                self.index.family.cascade_from(parent);
            }
            if self.index.family.unfinished(parent) == 0 {
                self.index.family.fan_in.insert(parent);
            }
        }
        Ok(())
    }
}

/// Checks a spawn's shape: how many children, their keys (each once), and no
/// idempotency key of their own.
fn check_children(r: &Spawn) -> OpResult<()> {
    if r.children.len() > MAX_SPAWN {
        return Err(client(
            ErrorCode::TooLarge,
            format!(
                "a spawn carries 0 to {MAX_SPAWN} children, not {}",
                r.children.len()
            ),
        ));
    }
    if r.children.is_empty() && r.wait.is_none() {
        return Err(bad("a spawn names children, or waits for them, or both"));
    }
    let mut keys = BTreeSet::new();
    for (i, c) in r.children.iter().enumerate() {
        let at = |m: String| bad(format!("child {i}: {m}"));
        names::check_short("child key", &c.child_key).map_err(at)?;
        if !keys.insert(c.child_key.as_str()) {
            return Err(at(format!("child key {:?} is given twice", c.child_key)));
        }
        if c.task.idempotency_key.is_some() {
            return Err(at(
                "a child has no idempotency key: its child key is one".into()
            ));
        }
    }
    Ok(())
}
