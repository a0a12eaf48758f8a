//! Operations on many tasks at once (`queue_purge`, `queue_delete`, `redrive`,
//! `discard`), done in slices of at most [`BULK_SLICE`] tasks per dispatcher round, so
//! that a purge of 100 000 tasks never holds a round long enough to delay anyone's
//! renewal; the reply (how many tasks were touched) leaves with the last slice.
//!
//! The tasks a job will touch are chosen when it starts; each is checked again when its
//! turn comes, and skipped if it left the states the job applies to meanwhile (a ready
//! task leased during a purge stays, a dead task redriven twice is redriven once).
//! A queue being deleted is gone at once for every request that names it (`not_found`;
//! nothing more is leased from it; holders may still settle what they hold until its
//! slice comes), and removed with its last task.

use std::collections::VecDeque;

use ulid::Ulid;

use muster_protocol::model::TaskState;
use muster_protocol::ops::CountReply;

use super::telemetry::{self, Repair};
use super::{Engine, Failure, Now, Reply, Waiter, audit, push_event};
use crate::store::StoreError;

/// Most tasks a bulk job touches in one dispatcher round. At about 9 µs a task (a
/// record read and an index update, release build), a slice takes about 2 ms: what a
/// renewal may wait for besides its own round.
pub const BULK_SLICE: usize = 250;

/// What a bulk job does to each of its tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum BulkKind {
    /// Removes it if still ready or scheduled.
    Purge,
    /// Removes it whatever its state, then the queue.
    Delete,
    /// Makes it ready again if still dead.
    Redrive,
    /// Removes it if still dead.
    Discard,
}

impl BulkKind {
    fn op(self) -> &'static str {
        match self {
            BulkKind::Purge => "queue_purge",
            BulkKind::Delete => "queue_delete",
            BulkKind::Redrive => "redrive",
            BulkKind::Discard => "discard",
        }
    }

    fn applies_to(self, state: TaskState) -> bool {
        match self {
            BulkKind::Purge => matches!(state, TaskState::Ready | TaskState::Scheduled),
            BulkKind::Delete => true,
            BulkKind::Redrive | BulkKind::Discard => state == TaskState::Dead,
        }
    }
}

/// A bulk operation under way.
pub(super) struct BulkJob<W> {
    waiter: W,
    kind: BulkKind,
    queue: String,
    /// The tasks chosen at the start, in id order; those before `next` are done.
    ids: Vec<Ulid>,
    next: usize,
    touched: u64,
}

impl<W> BulkJob<W> {
    /// A job of `kind` over `ids` of `queue`, answering `waiter` when done.
    pub(super) fn new(waiter: W, kind: BulkKind, queue: String, ids: Vec<Ulid>) -> BulkJob<W> {
        BulkJob {
            waiter,
            kind,
            queue,
            ids,
            next: 0,
            touched: 0,
        }
    }
}

/// The jobs under way, oldest first: one advances per round.
pub(super) type BulkJobs<W> = VecDeque<BulkJob<W>>;

impl<W: Waiter> Engine<W> {
    /// Starts a bulk job; its first slice runs with this round's timers.
    pub(super) fn start_bulk(&mut self, job: BulkJob<W>) {
        if job.kind == BulkKind::Delete {
            let q = self
                .index
                .queues
                .get_mut(&job.queue)
                .expect("a queue to delete exists");
            assert!(!q.deleting, "queue {}: deleted once", job.queue);
            q.deleting = true;
        }
        self.bulk.push_back(job);
    }

    /// Whether a bulk job waits for its next slice.
    pub(super) fn bulk_pending(&self) -> bool {
        !self.bulk.is_empty()
    }

    /// Runs one slice of the oldest job, answering it if that was its last.
    pub(super) fn bulk_slice(&mut self, now: Now) -> Result<(), StoreError> {
        let Some(mut job) = self.bulk.pop_front() else {
            return Ok(());
        };
        let end = (job.next + BULK_SLICE).min(job.ids.len());
        let mut touched = 0;
        for i in job.next..end {
            if self.bulk_one(job.kind, &job.queue, job.ids[i], now)? {
                touched += 1;
            }
        }
        job.next = end;
        job.touched += touched;
        assert!(
            job.touched <= job.next as u64,
            "a bulk job touches each of its tasks at most once"
        );
        let repair = match job.kind {
            BulkKind::Purge => Some(Repair::Purged),
            BulkKind::Redrive => Some(Repair::Redriven),
            BulkKind::Discard => Some(Repair::Discarded),
            BulkKind::Delete => None,
        };
        if let Some(repair) = repair {
            telemetry::repaired(&job.queue, repair, touched as usize);
        }
        if job.next < job.ids.len() {
            self.bulk.push_front(job);
            return self.commit();
        }
        if job.kind == BulkKind::Delete {
            let q = self
                .index
                .queues
                .remove(&job.queue)
                .expect("a deleting queue exists");
            assert!(
                q.by_state.iter().all(|ids| ids.is_empty()),
                "queue {} deleted with tasks left",
                job.queue
            );
            self.pending.remove_queue(&job.queue);
        }
        self.commit()?;
        audit::record(
            job.waiter.principal().map(|p| p.name.as_str()),
            job.kind.op(),
            &job.queue,
            job.touched,
        );
        let reply = Reply::Count(CountReply {
            count: job.touched,
            ids: Vec::new(),
        });
        self.outbox.replies.push((job.waiter, Ok(reply)));
        Ok(())
    }

    /// Applies a job to one task if it still applies; returns whether it did.
    fn bulk_one(
        &mut self,
        kind: BulkKind,
        queue: &str,
        id: Ulid,
        now: Now,
    ) -> Result<bool, StoreError> {
        let Some(meta) = self.index.tasks.get(&id) else {
            return Ok(false);
        };
        if *meta.queue != *queue || !kind.applies_to(meta.state) {
            return Ok(false);
        }
        let mut rec = self.record(id).map_err(|f| match f {
            Failure::Store(e) => e,
            Failure::Client(e) => unreachable!("an indexed task has a record: {e}"),
        })?;
        match kind {
            BulkKind::Redrive => {
                debug_assert!(
                    rec.lease.is_none() && !rec.cancel_requested,
                    "task {id}: a dead task holds no lease and no pending cancel"
                );
                rec.state = TaskState::Ready;
                rec.failures = 0;
                rec.dead_reason = None;
                rec.updated_ms = now.wall_ms;
                push_event(&mut rec, now, "redriven", None, None, None);
                self.save(id, &rec, None);
            }
            // A leased task's member slot is freed with its index entry; its holder's
            // settles get not_found from now on.
            BulkKind::Purge | BulkKind::Delete | BulkKind::Discard => self.remove(id, &rec),
        }
        Ok(true)
    }
}
