//! Quotas on what producers make the daemon store: tasks per queue, and bytes per
//! principal (each task it enqueued: its payload, result and progress checkpoint, and
//! [`TASK_RECORD_BYTES`] for the rest of its record). Both are checked against the whole batch before anything of it is
//! written (an idempotent duplicate counts as new for the check), and both counts are
//! kept as tasks come and go, never by a scan: tasks per queue are the queue's state
//! indexes, bytes per principal are summed as tasks are enqueued and removed and
//! rebuilt from the records at start.

use muster_protocol::ErrorCode;
use muster_protocol::ops::Enqueue;

use super::{Budget, Engine, OpResult, Quotas, Waiter, client};
use crate::store::{TASK_RECORD_BYTES, TaskRecord};

impl<W: Waiter> Engine<W> {
    /// Sets the quotas (from the daemon's flags).
    pub fn set_quotas(&mut self, quotas: Quotas) {
        self.budget.quotas = quotas;
    }

    /// `limit` if the batch would take its queue past its task quota, or `owner` past
    /// its stored-bytes quota.
    pub(super) fn check_quotas(
        &self,
        r: &Enqueue,
        owner: Option<&str>,
        earlier: u64,
    ) -> OpResult<()> {
        let queue = self.index.queue(&r.queue)?;
        let held: u64 = queue.by_state.iter().map(|s| s.len() as u64).sum();
        let max_tasks = self.budget.quotas.max_tasks_per_queue;
        if held + r.tasks.len() as u64 > max_tasks {
            return Err(client(
                ErrorCode::Limit,
                format!(
                    "queue {:?} holds {held} tasks; {} more would pass its quota of {max_tasks} \
                     (--max-tasks-per-queue): settle, discard or purge some first",
                    r.queue,
                    r.tasks.len()
                ),
            ));
        }
        let Some(owner) = owner else {
            return Ok(());
        };
        let stored = self.budget.stored_bytes.get(owner).copied().unwrap_or(0) + earlier;
        let adding: u64 = r
            .tasks
            .iter()
            .map(|t| t.payload.get().len() as u64 + TASK_RECORD_BYTES)
            .sum();
        let max_bytes = self.budget.quotas.max_bytes_per_principal;
        if stored + adding > max_bytes {
            return Err(client(
                ErrorCode::Limit,
                format!(
                    "token {owner:?} has {stored} bytes stored (its tasks' records, payloads, \
                     results and progress); {adding} more would pass its quota of {max_bytes} \
                     (--max-bytes-per-token)"
                ),
            ));
        }
        Ok(())
    }
}

impl Budget {
    /// A task `principal` enqueued is stored: its payload counts (the name is copied
    /// only the first time: start-up counts every stored task).
    pub(super) fn count(&mut self, principal: &str, bytes: u64) {
        match self.stored_bytes.get_mut(principal) {
            Some(stored) => *stored += bytes,
            None => {
                self.stored_bytes.insert(principal.to_owned(), bytes);
            }
        }
        debug_assert!(
            self.stored_bytes.get(principal).is_some_and(|b| *b > 0),
            "stored bytes of {principal:?}: no zero entry"
        );
    }

    /// A field of `rec` that counts against its enqueuer's quota (its result, its
    /// progress checkpoint) goes from `from` bytes to `to`.
    pub(super) fn recount(&mut self, rec: &mut TaskRecord, from: u64, to: u64) {
        assert!(
            rec.stored_bytes >= from,
            "a task's stored bytes hold its parts"
        );
        rec.stored_bytes = rec.stored_bytes - from + to;
        if let Some(principal) = &rec.enqueued_by {
            self.count(principal, to);
            self.uncount(principal, from);
        }
    }

    /// A task `principal` enqueued was removed: what it stored no longer counts.
    pub(super) fn uncount(&mut self, principal: &str, bytes: u64) {
        let stored = self
            .stored_bytes
            .get_mut(principal)
            .expect("a stored task's principal has its bytes counted");
        assert!(
            *stored >= bytes,
            "stored bytes of {principal:?} never underflow"
        );
        *stored -= bytes;
        if *stored == 0 {
            self.stored_bytes.remove(principal);
        }
    }
}
