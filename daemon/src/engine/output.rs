//! Task output: chunks a lease's holder appends (`emit`) and anyone may read from any
//! number on, live as they are stored (`follow`).
//!
//! Each emit's chunks are one page of the `output` keyspace, written in the request's
//! batch: they ride the round's group commit (no fsync of their own) and, on a
//! cluster, the round's log entry, so a follower is sent a chunk only once it is as
//! durable as any acknowledged change. Chunks are numbered from 0 with no gap; an emit
//! names the number its first chunk is to get (`at`), so a repeat after a lost reply
//! stores nothing twice. A task keeps at most [`MAX_OUTPUT_BYTES`] in at most
//! [`MAX_OUTPUT_EMITS`] pages: an emit past either drops the oldest pages (a follower
//! asking for them is told how many it missed). A task's emits draw on a bucket of
//! [`OUTPUT_BURST_BYTES`] refilled at [`OUTPUT_RATE_BYTES`] per second (kept in
//! memory: a restart or failover fills it again).
//!
//! [`Output::metas`] holds every stored task's output meta (loaded at start); a task
//! removed leaves its pages to [`Engine::sweep_output`], [`OUTPUT_SWEEP_BATCH`] pages per
//! round, its meta last, so a crash part way through leaves a meta whose task is gone,
//! which the next start sweeps again.

use std::collections::{HashMap, HashSet, VecDeque};

use ulid::Ulid;

use muster_protocol::limits::{
    MAX_CHUNK_BYTES, MAX_EMIT_BYTES, MAX_EMIT_CHUNKS, MAX_FOLLOW_BYTES, MAX_OUTPUT_BYTES,
    MAX_OUTPUT_EMITS, MAX_WAIT, OUTPUT_BURST_BYTES, OUTPUT_RATE_BYTES,
};
use muster_protocol::model::{Chunk, OutputChunk, OutputSummary};
use muster_protocol::ops::{Emit, EmitReply, Follow, FollowReply};
use muster_protocol::{ErrorBody, ErrorCode};

use super::listing::json_len;
use super::ops::{bad, parse_id};
use super::sharded::IdMap;
use super::{Engine, Failure, Now, OpResult, Waiter, client, telemetry};
use crate::store::{OutputMeta, OutputPage, StoreError};

/// Most pages of removed tasks' output deleted per round; the rest in the next rounds.
pub(super) const OUTPUT_SWEEP_BATCH: usize = 4096;

/// Most pages a watched task screen's output tail is read from.
const TAIL_PAGES: usize = 64;

/// How often the rate buckets of tasks that stopped emitting are forgotten.
const BUCKET_PRUNE_MS: u64 = 1_000;

/// Output state: every task's output meta, the emitters' rate buckets, parked follows
/// and removed tasks' output still to delete. Invariant: `metas` names only stored
/// tasks ([`Engine::check_output`]).
pub(super) struct Output<W> {
    metas: IdMap<OutputMeta>,
    /// Each recent emitter's bucket: its tokens (bytes; below zero while it owes) and
    /// when they were counted (monotonic ms).
    buckets: HashMap<Ulid, (i64, u64)>,
    /// When the buckets are next pruned.
    prune_at: u64,
    follows: Vec<FollowWait<W>>,
    /// Tasks whose output grew since follows were last served.
    changed: HashSet<Ulid>,
    /// Removed tasks whose pages are still stored.
    sweep: VecDeque<Ulid>,
}

/// A follow waiting for output.
struct FollowWait<W> {
    waiter: W,
    task: Ulid,
    from: u64,
    deadline: u64,
}

impl<W> Output<W> {
    pub(super) fn new() -> Output<W> {
        Output {
            metas: IdMap::default(),
            buckets: HashMap::new(),
            prune_at: 0,
            follows: Vec::new(),
            changed: HashSet::new(),
            sweep: VecDeque::new(),
        }
    }

    /// Sizes of the output state, for the engine's digest (debug builds check that a
    /// refused request changes nothing).
    #[cfg(debug_assertions)]
    pub(super) fn digest(&self) -> [usize; 5] {
        [
            self.metas.len(),
            self.buckets.len(),
            self.follows.len(),
            self.changed.len(),
            self.sweep.len(),
        ]
    }

    /// The number task `id`'s next chunk gets.
    pub(super) fn next(&self, id: Ulid) -> u64 {
        self.metas.get(&id).map_or(0, |m| m.next)
    }

    /// What task `id`'s output holds, if it emitted any.
    pub(super) fn summary(&self, id: Ulid) -> Option<OutputSummary> {
        self.metas.get(&id).map(|m| OutputSummary {
            first: m.first,
            next: m.next,
            bytes: m.bytes,
        })
    }

    /// Task `id` was removed: its output goes with it, a slice per round.
    pub(super) fn removed(&mut self, id: Ulid) {
        self.buckets.remove(&id);
        if self.metas.remove(&id).is_some() {
            self.sweep.push_back(id);
        }
    }

    /// The earliest deadline of a parked follow, and whether pages wait to be swept.
    pub(super) fn next_timer(&self) -> (Option<u64>, bool) {
        (
            self.follows.iter().map(|f| f.deadline).min(),
            !self.sweep.is_empty(),
        )
    }
}

/// Checks an emit's chunks: their count, that each is text or JSON, and each one's
/// size. Returns their page as stored (which [`MAX_EMIT_BYTES`] bounds).
fn check_chunks(chunks: &[Chunk], at_ms: u64) -> OpResult<Vec<u8>> {
    if chunks.is_empty() || chunks.len() > MAX_EMIT_CHUNKS {
        return Err(bad(format!(
            "an emit carries 1 to {MAX_EMIT_CHUNKS} chunks, not {}",
            chunks.len()
        )));
    }
    for (i, c) in chunks.iter().enumerate() {
        if c.text.is_some() == c.json.is_some() {
            return Err(bad(format!(
                "chunk {i} must hold exactly one of text and json"
            )));
        }
        let bytes = c.bytes();
        if bytes > MAX_CHUNK_BYTES {
            return Err(client(
                ErrorCode::TooLarge,
                format!("chunk {i} holds {bytes} bytes, more than {MAX_CHUNK_BYTES}"),
            ));
        }
    }
    let page = OutputPage::encode(chunks, at_ms);
    if page.len() > MAX_EMIT_BYTES {
        return Err(client(
            ErrorCode::TooLarge,
            format!(
                "an emit of {} bytes as stored exceeds {MAX_EMIT_BYTES}",
                page.len()
            ),
        ));
    }
    Ok(page)
}

/// Milliseconds until a bucket at `tokens` is no longer in debt.
fn debt_ms(tokens: i64) -> u64 {
    if tokens >= 0 {
        return 0;
    }
    (tokens.unsigned_abs() * 1000).div_ceil(OUTPUT_RATE_BYTES)
}

impl<W: Waiter> Engine<W> {
    /// Loads every task's output meta; output of tasks no longer stored is swept.
    pub(super) fn load_output(&mut self) -> Result<(), StoreError> {
        for (id, meta) in self.store.load_output_metas()? {
            if self.index.tasks.contains_key(&id) {
                self.output.metas.insert(id, meta);
            } else {
                self.output.sweep.push_back(id);
            }
        }
        Ok(())
    }

    /// `emit`: appends chunks to a held task's output.
    pub(super) fn emit(&mut self, r: Emit, now: Now) -> OpResult<EmitReply> {
        let whole = check_chunks(&r.chunks, now.wall_ms)?;
        let (id, rec) = self.held(&r.task, r.epoch)?;
        let mut meta = self.output.metas.get(&id).copied().unwrap_or_default();
        if r.at > meta.next {
            return Err(bad(format!(
                "emit at chunk {}: task {id}'s next chunk is numbered {}",
                r.at, meta.next
            )));
        }
        // Chunks numbered before the next one were stored by an earlier try.
        let repeated = usize::try_from(meta.next - r.at)
            .unwrap_or(usize::MAX)
            .min(r.chunks.len());
        let new = &r.chunks[repeated..];
        let (tokens, at_ms) = self
            .output
            .buckets
            .get(&id)
            .copied()
            .unwrap_or((OUTPUT_BURST_BYTES as i64, now.mono_ms));
        let refill = now.mono_ms.saturating_sub(at_ms) * OUTPUT_RATE_BYTES / 1000;
        let tokens = tokens
            .saturating_add(i64::try_from(refill).unwrap_or(i64::MAX))
            .min(OUTPUT_BURST_BYTES as i64);
        if new.is_empty() {
            return Ok(EmitReply {
                next: meta.next,
                repeated: repeated as u64,
                wait_ms: debt_ms(tokens),
                cancel_requested: rec.cancel_requested,
            });
        }
        if tokens < 0 {
            return Err(client(
                ErrorCode::Limit,
                format!(
                    "task {id} emitted faster than {OUTPUT_RATE_BYTES} bytes/s: wait {} ms",
                    debt_ms(tokens)
                ),
            ));
        }
        if self.budget.disk_alarm {
            return Err(client(
                ErrorCode::DiskFull,
                "the disk alarm is on: output is not stored until space comes back",
            ));
        }
        // Its page as stored: what the limits and the rate count.
        let page = if repeated == 0 {
            whole
        } else {
            OutputPage::encode(new, now.wall_ms)
        };
        let bytes = page.len();
        // Room: the oldest pages go, whole.
        let mut dropped = 0;
        while meta.pages > 0
            && (meta.pages as usize >= MAX_OUTPUT_EMITS
                || meta.bytes as usize + bytes > MAX_OUTPUT_BYTES)
        {
            let mut oldest = None;
            self.store.output_pages(id, meta.first, |first, page| {
                oldest = Some((first, page.count, page.bytes));
                true
            })?;
            let (first, count, page_bytes) = oldest.unwrap_or_else(|| {
                panic!(
                    "task {id}: output meta {meta:?} names a page at {}",
                    meta.first
                )
            });
            assert_eq!(
                first, meta.first,
                "task {id}: the oldest page starts the output"
            );
            self.pending.remove_output_page(id, first);
            meta.first += u64::from(count);
            meta.bytes -= u64::from(page_bytes);
            meta.pages -= 1;
            dropped += u64::from(count);
        }
        assert!(
            (meta.pages == 0) == (meta.first == meta.next) && meta.first <= meta.next,
            "task {id}: output meta {meta:?} is a run of pages"
        );
        self.pending.put_output_page(id, meta.next, page);
        meta.next += new.len() as u64;
        meta.bytes += bytes as u64;
        meta.pages += 1;
        assert!(
            meta.bytes as usize <= MAX_OUTPUT_BYTES && meta.pages as usize <= MAX_OUTPUT_EMITS,
            "task {id}: output {meta:?} within its limits"
        );
        self.pending.put_output_meta(id, &meta);
        self.output.metas.insert(id, meta);
        self.output.changed.insert(id);
        let tokens = tokens - bytes as i64;
        self.output.buckets.insert(id, (tokens, now.mono_ms));
        telemetry::emitted(&rec.queue, new.len() as u64, bytes as u64, dropped);
        debug_assert_eq!(
            new.iter().map(Chunk::stored_bytes).sum::<usize>()
                + muster_protocol::limits::OUTPUT_PAGE_HEADER_BYTES
                + 1,
            bytes,
            "task {id}: an emit's page is the size the SDKs count"
        );
        Ok(EmitReply {
            next: meta.next,
            repeated: repeated as u64,
            wait_ms: debt_ms(tokens),
            cancel_requested: rec.cancel_requested,
        })
    }

    /// `follow`: answers with what is stored from `from`, or parks until more is.
    pub(super) fn follow(&mut self, r: Follow, waiter: W, now: Now) -> Result<(), (W, Failure)> {
        let parsed = (|| {
            let id = parse_id(&r.task)?;
            if !self.index.tasks.contains_key(&id) {
                return Err(client(ErrorCode::NotFound, format!("no task {id}")));
            }
            let timeout = r.timeout_ms.unwrap_or(0);
            if timeout > MAX_WAIT.as_millis() as u64 {
                return Err(bad(format!(
                    "timeout of {timeout} ms exceeds {} ms",
                    MAX_WAIT.as_millis()
                )));
            }
            let next = self.output.next(id);
            if r.from > next {
                return Err(bad(format!(
                    "follow from chunk {}: task {id} has emitted {next} chunks",
                    r.from
                )));
            }
            Ok((id, timeout))
        })();
        let (id, timeout) = match parsed {
            Ok(v) => v,
            Err(e) => return Err((waiter, e)),
        };
        let finished = self.index.tasks[&id].state.is_finished();
        if timeout == 0 || finished || r.from < self.output.next(id) {
            match self.answer_follow(id, r.from) {
                Ok(reply) => self
                    .outbox
                    .replies
                    .push((waiter, Ok(super::Reply::Follow(reply)))),
                Err(e) => return Err((waiter, Failure::Store(e))),
            }
        } else {
            self.output.follows.push(FollowWait {
                waiter,
                task: id,
                from: r.from,
                deadline: now.mono_ms + timeout,
            });
        }
        Ok(())
    }

    /// What task `id` holds from chunk `from` (at most [`MAX_FOLLOW_BYTES`] of JSON as
    /// sent, at least one chunk when any is kept there).
    fn answer_follow(&self, id: Ulid, from: u64) -> Result<FollowReply, StoreError> {
        let meta = self.output.metas.get(&id).copied().unwrap_or_default();
        let state = self.index.tasks[&id].state;
        assert!(
            from <= meta.next,
            "task {id}: followed from within its output"
        );
        let dropped = meta.first.saturating_sub(from);
        let start = from.max(meta.first);
        let mut chunks: Vec<OutputChunk> = Vec::new();
        if start < meta.next {
            // As sent: escapes and the number count; at least one chunk.
            let mut bytes = 0;
            chunks = self.read_output(id, start, |chunk| {
                let len = json_len(chunk);
                let fits = bytes == 0 || bytes + len <= MAX_FOLLOW_BYTES;
                if fits {
                    bytes += len;
                }
                fits
            })?;
            assert!(
                chunks.first().is_some_and(|c| c.n == start)
                    && chunks.windows(2).all(|w| w[1].n == w[0].n + 1),
                "task {id}: a follow from {start} is sent chunks in order with no gap"
            );
        }
        let next = start + chunks.len() as u64;
        assert!(
            next <= meta.next,
            "task {id}: no chunk past its output's end"
        );
        let reply = FollowReply {
            chunks,
            dropped,
            next,
            state,
            end: state.is_finished() && next == meta.next,
        };
        debug_assert!(
            json_len(&reply) < muster_protocol::limits::MAX_FOLLOW_REPLY_BYTES,
            "task {id}: a follow's reply within what it reserved"
        );
        Ok(reply)
    }

    /// The last chunks of task `id`'s output, oldest first: at most `max_bytes` as
    /// JSON (at least the last chunk), from at most [`TAIL_PAGES`] pages.
    pub(super) fn output_tail(
        &self,
        id: Ulid,
        max_bytes: usize,
    ) -> Result<Vec<OutputChunk>, StoreError> {
        let Some(meta) = self.output.metas.get(&id).copied() else {
            return Ok(Vec::new());
        };
        if meta.first == meta.next {
            return Ok(Vec::new());
        }
        let page_of = |n: u64| -> Result<u64, StoreError> {
            Ok(self.store.output_page_of(id, n)?.unwrap_or_else(|| {
                panic!("task {id}: output {meta:?} has no page holding chunk {n}")
            }))
        };
        let page_bytes = |first: u64| -> Result<u64, StoreError> {
            let mut bytes = 0;
            self.store.output_pages(id, first, |_, page| {
                bytes = u64::from(page.bytes);
                true
            })?;
            Ok(bytes)
        };
        // Back from the last page until the pages hold enough.
        let mut start = page_of(meta.next - 1)?;
        let mut bytes = page_bytes(start)?;
        let mut pages = 1;
        while (bytes as usize) < max_bytes && start > meta.first && pages < TAIL_PAGES {
            start = page_of(start - 1)?;
            bytes += page_bytes(start)?;
            pages += 1;
        }
        let mut chunks = self.read_output(id, start, |_| true)?;
        let mut kept = 0;
        let mut from = chunks.len();
        while from > 0 {
            let len = json_len(&chunks[from - 1]);
            if from < chunks.len() && kept + len > max_bytes {
                break;
            }
            kept += len;
            from -= 1;
        }
        Ok(chunks.split_off(from))
    }

    /// Task `id`'s chunks from `start` (a number within its output) on, in order, as
    /// long as `take` takes them (it sees each and says whether it is wanted).
    fn read_output(
        &self,
        id: Ulid,
        start: u64,
        mut take: impl FnMut(&OutputChunk) -> bool,
    ) -> Result<Vec<OutputChunk>, StoreError> {
        let page = self
            .store
            .output_page_of(id, start)?
            .unwrap_or_else(|| panic!("task {id}: its output has no page holding chunk {start}"));
        let mut chunks = Vec::new();
        let mut failed = None;
        self.store.output_pages(id, page, |first, page| {
            let decoded = match page.chunks(id, first) {
                Ok(c) => c,
                Err(e) => {
                    failed = Some(e);
                    return true;
                }
            };
            for (n, c) in (first..).zip(decoded) {
                if n < start {
                    continue;
                }
                let chunk = OutputChunk {
                    n,
                    at_ms: page.at_ms,
                    text: c.text,
                    json: c.json,
                };
                if !take(&chunk) {
                    return true;
                }
                chunks.push(chunk);
            }
            false
        })?;
        failed.map_or(Ok(chunks), Err)
    }

    /// Answers parked follows whose task's output grew, whose task finished or was
    /// removed, or whose timeout passed.
    pub(super) fn serve_follows(&mut self, now: Now) -> Result<(), StoreError> {
        let changed = std::mem::take(&mut self.output.changed);
        if self.output.follows.is_empty() {
            return Ok(());
        }
        let follows = std::mem::take(&mut self.output.follows);
        for f in follows {
            if f.waiter.is_closed() {
                continue;
            }
            let Some(m) = self.index.tasks.get(&f.task) else {
                let e = ErrorBody::new(ErrorCode::NotFound, format!("task {} was removed", f.task));
                self.outbox.replies.push((f.waiter, Err(e)));
                continue;
            };
            if changed.contains(&f.task) || m.state.is_finished() || f.deadline <= now.mono_ms {
                let reply = self.answer_follow(f.task, f.from)?;
                self.outbox
                    .replies
                    .push((f.waiter, Ok(super::Reply::Follow(reply))));
            } else {
                self.output.follows.push(f);
            }
        }
        Ok(())
    }

    /// Deletes up to [`OUTPUT_SWEEP_BATCH`] pages of removed tasks' output, and the
    /// meta of each task whose pages are all gone; forgets idle rate buckets.
    pub(super) fn sweep_output(&mut self, now: Now) -> Result<(), StoreError> {
        if now.mono_ms >= self.output.prune_at {
            self.output.prune_at = now.mono_ms + BUCKET_PRUNE_MS;
            // A bucket refilled to the brim is the same as none.
            self.output.buckets.retain(|_, (tokens, at)| {
                let refill = now.mono_ms.saturating_sub(*at) * OUTPUT_RATE_BYTES / 1000;
                tokens.saturating_add(i64::try_from(refill).unwrap_or(i64::MAX))
                    < OUTPUT_BURST_BYTES as i64
            });
        }
        let mut budget = OUTPUT_SWEEP_BATCH;
        while budget > 0
            && let Some(&id) = self.output.sweep.front()
        {
            debug_assert!(
                !self.index.tasks.contains_key(&id),
                "task {id}: output swept only once the task is removed"
            );
            let mut pages = self.store.output_page_firsts(id, budget + 1)?;
            let done = pages.len() <= budget;
            pages.truncate(budget);
            budget -= pages.len();
            for first in pages {
                self.pending.remove_output_page(id, first);
            }
            if done {
                self.pending.remove_output_meta(id);
                self.output.sweep.pop_front();
            }
        }
        Ok(())
    }

    /// Every output meta names a stored task (debug builds, with the other checks).
    #[cfg(debug_assertions)]
    pub(super) fn check_output(&self) {
        for (id, meta) in self.output.metas.iter() {
            assert!(
                self.index.tasks.contains_key(id),
                "task {id}: output meta {meta:?} of a task not stored"
            );
        }
    }
}
