//! Suspended tasks: `suspend` ends a lease without settling its task, `resume` (by the
//! token the suspend replied with, or by task id) makes it ready again, and the
//! suspension's timeout acts when no resume came first.
//!
//! A resume token is `TASK.EPOCH.SECRET`: the task, the epoch of the lease it was
//! suspended under (which names the suspension: a later one is under a later lease),
//! and 128 random bits in hex. The record keeps the secret's SHA-256 only, so neither
//! the store nor a snapshot nor a replica holds a token. A token resumes its suspension
//! once: the resume ends the suspension, and any later use finds none that it names.
//!
//! A `suspend` repeated by its holder (the same task and epoch, the task suspended under
//! that epoch: a reply lost with its connection) is answered again with a new token,
//! which replaces the one the lost reply carried: so a suspend can be retried like a
//! settle, and the token that works is the one the holder has.

use ring::rand::SecureRandom;
use ulid::Ulid;

use muster_protocol::ErrorCode;
use muster_protocol::limits::{
    DEFAULT_SUSPEND_TIMEOUT, MAX_RESUME_DATA_BYTES, MAX_RESUME_TOKEN_BYTES,
    MAX_SUSPEND_REASON_BYTES, MAX_SUSPEND_TIMEOUT,
};
use muster_protocol::model::{OnTimeout, Resumed, SuspensionInfo, TaskState};
use muster_protocol::ops::{Resume, ResumeReply, Suspend, SuspendReply};

use super::ops::{MAX_RESULT_BYTES_UNDER_ALARM, bad, parse_id, truncated_result};
use super::telemetry::{self, LeaseEnd};
use super::{Engine, Now, OpResult, Waiter, client, push_event};
use crate::auth::{Principal, digest};
use crate::store::{StoreError, SuspensionRecord, TaskRecord};

/// Random bytes in a resume token's secret.
const SECRET_BYTES: usize = 16;

/// A resume token taken apart.
struct Token<'a> {
    task: Ulid,
    epoch: u64,
    secret: &'a str,
}

impl<'a> Token<'a> {
    /// Reads `TASK.EPOCH.SECRET`; anything else is not a token of this daemon.
    fn parse(text: &'a str) -> OpResult<Token<'a>> {
        let malformed = || bad("resume token is malformed: expected TASK.EPOCH.SECRET");
        if text.len() > MAX_RESUME_TOKEN_BYTES {
            return Err(malformed());
        }
        let mut parts = text.splitn(3, '.');
        let (Some(task), Some(epoch), Some(secret)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(malformed());
        };
        let task = Ulid::from_string(task).map_err(|_| malformed())?;
        let epoch = epoch.parse().map_err(|_| malformed())?;
        if secret.len() != 2 * SECRET_BYTES || !secret.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(malformed());
        }
        Ok(Token {
            task,
            epoch,
            secret,
        })
    }
}

/// The task a `resume` names, by its token or its id: what authorization checks.
pub(super) fn resume_target(r: &Resume) -> Option<&str> {
    match (&r.token, &r.task) {
        (Some(token), None) => token.split('.').next(),
        (None, Some(task)) => Some(task),
        _ => None,
    }
}

/// A new token for task `id`'s suspension under `epoch`, and its secret's digest.
fn new_token(id: Ulid, epoch: u64) -> (String, [u8; 32]) {
    let mut secret = [0u8; SECRET_BYTES];
    ring::rand::SystemRandom::new()
        .fill(&mut secret)
        .expect("the system's random source fills 16 bytes");
    let secret = hex::encode(secret);
    let digest = digest(&secret);
    (format!("{id}.{epoch}.{secret}"), digest)
}

/// A suspension asked for, checked.
pub(super) struct Asked {
    reason: String,
    timeout_ms: u64,
    on_timeout: OnTimeout,
}

/// Checks what a suspension asks: a reason within its limit, a timeout within range
/// ([`DEFAULT_SUSPEND_TIMEOUT`] when none).
pub(super) fn check_suspension(
    reason: String,
    timeout_ms: Option<u64>,
    on_timeout: Option<OnTimeout>,
) -> OpResult<Asked> {
    if reason.trim().is_empty() {
        return Err(bad(
            "a suspension needs a reason, for the people who resume it",
        ));
    }
    if reason.len() > MAX_SUSPEND_REASON_BYTES {
        return Err(client(
            ErrorCode::TooLarge,
            format!(
                "reason is {} bytes; the limit is {MAX_SUSPEND_REASON_BYTES}",
                reason.len()
            ),
        ));
    }
    let timeout_ms = timeout_ms.unwrap_or(DEFAULT_SUSPEND_TIMEOUT.as_millis() as u64);
    if timeout_ms == 0 || timeout_ms > MAX_SUSPEND_TIMEOUT.as_millis() as u64 {
        return Err(bad(format!(
            "timeout_ms {timeout_ms} is outside 1..={}",
            MAX_SUSPEND_TIMEOUT.as_millis()
        )));
    }
    Ok(Asked {
        reason,
        timeout_ms,
        on_timeout: on_timeout.unwrap_or_default(),
    })
}

/// What ends a suspension.
pub(super) enum Waker {
    /// A resume, by someone (the principal's name, or ""), with data.
    Resume(String, Option<muster_protocol::RawJson>),
    /// Its timeout, which resumes.
    TimedOut,
    /// Its children, every one finished.
    Children,
}

impl<W: Waiter> Engine<W> {
    pub(super) fn suspend(
        &mut self,
        r: Suspend,
        principal: Option<&Principal>,
        now: Now,
    ) -> OpResult<SuspendReply> {
        let asked = check_suspension(r.reason.clone(), r.timeout_ms, r.on_timeout)?;
        if let Some(reply) = self.suspended_again(&r.task, r.epoch, principal)? {
            return Ok(reply);
        }
        let (id, rec) = self.held(&r.task, r.epoch)?;
        Ok(self.suspend_held(id, rec, r.epoch, asked, false, now))
    }

    /// Suspends task `id`, held under `epoch` (its record `rec`), as `asked`; waiting
    /// for its `children` when that is what it waits for.
    pub(super) fn suspend_held(
        &mut self,
        id: Ulid,
        mut rec: TaskRecord,
        epoch: u64,
        asked: Asked,
        children: bool,
        now: Now,
    ) -> SuspendReply {
        let end = if rec.cancel_requested {
            LeaseEnd::Cancelled
        } else {
            LeaseEnd::Suspended
        };
        telemetry::lease_ended(
            id,
            &rec,
            rec.lease.as_ref().expect("a held task has a lease"),
            end,
            now.wall_ms,
        );
        let lease = rec.lease.take().expect("a held task has a lease");
        push_event(
            &mut rec,
            now,
            "suspended",
            Some(&lease.member),
            Some(epoch),
            None,
        );
        if self.cancel_if_requested(&mut rec, now, None, None) {
            self.save(id, &rec, None);
            return SuspendReply {
                state: TaskState::Cancelled,
                resume_token: None,
                timeout_at_ms: None,
            };
        }
        let (token, token_digest) = new_token(id, epoch);
        let timeout_at_ms = now.wall_ms.saturating_add(asked.timeout_ms);
        rec.state = TaskState::Suspended;
        rec.updated_ms = now.wall_ms;
        let was = resumed_bytes(&rec.resumed);
        self.budget.recount(&mut rec, was, 0);
        rec.resumed = None;
        rec.suspension = Some(SuspensionRecord {
            info: SuspensionInfo {
                reason: asked.reason,
                member: lease.member,
                epoch,
                since_ms: now.wall_ms,
                timeout_at_ms,
                on_timeout: asked.on_timeout,
                children,
            },
            token_digest,
        });
        self.save(id, &rec, None);
        assert!(
            self.index.tasks[&id].held.is_none(),
            "task {id}: a suspended task holds no lease"
        );
        SuspendReply {
            state: TaskState::Suspended,
            resume_token: Some(token),
            timeout_at_ms: Some(timeout_at_ms),
        }
    }

    /// A holder's repeat of the suspend that suspended its task under `r.epoch`: a new
    /// token replaces the old one (whose reply was lost), nothing else changes. `None`
    /// when the task is not suspended under that epoch (then it is a suspend to make).
    pub(super) fn suspended_again(
        &mut self,
        task: &str,
        epoch: u64,
        principal: Option<&Principal>,
    ) -> OpResult<Option<SuspendReply>> {
        let id = parse_id(task)?;
        let suspended = self
            .index
            .tasks
            .get(&id)
            .is_some_and(|m| m.state == TaskState::Suspended && m.epoch == epoch);
        if !suspended {
            return Ok(None);
        }
        let mut rec = self.record(id)?;
        let suspension = rec
            .suspension
            .as_mut()
            .unwrap_or_else(|| panic!("task {id}: suspended without a suspension"));
        // A suspended task's epoch is its deliveries, and its last lease's: the one
        // it was suspended under.
        assert_eq!(
            suspension.info.epoch, epoch,
            "task {id}: suspended under the epoch its index entry holds"
        );
        // Only the holder's principal may replace the token (the member name it held
        // the lease under is bound to it).
        if let Some(p) = principal
            && !suspension.info.member.is_empty()
        {
            self.member_free_or_own(&suspension.info.member, p)?;
        }
        let (token, digest) = new_token(id, epoch);
        suspension.token_digest = digest;
        let timeout_at_ms = suspension.info.timeout_at_ms;
        self.write(id, &rec);
        Ok(Some(SuspendReply {
            state: TaskState::Suspended,
            resume_token: Some(token),
            timeout_at_ms: Some(timeout_at_ms),
        }))
    }

    pub(super) fn resume(
        &mut self,
        r: Resume,
        principal: Option<&Principal>,
        now: Now,
    ) -> OpResult<ResumeReply> {
        if let Some(data) = &r.data
            && data.get().len() > MAX_RESUME_DATA_BYTES
        {
            return Err(client(
                ErrorCode::TooLarge,
                format!(
                    "data is {} bytes; the limit is {MAX_RESUME_DATA_BYTES}",
                    data.get().len()
                ),
            ));
        }
        let (id, mut rec) = match (&r.token, &r.task) {
            (Some(token), None) => {
                let token = Token::parse(token)?;
                let rec = self.record(token.task)?;
                check_token(&token, &rec)?;
                (token.task, rec)
            }
            (None, Some(task)) => {
                let id = parse_id(task)?;
                let rec = self.record(id)?;
                if rec.state != TaskState::Suspended {
                    return Err(client(
                        ErrorCode::InvalidState,
                        format!("task {id} is {}, not suspended", rec.state),
                    ));
                }
                (id, rec)
            }
            _ => {
                return Err(bad(
                    "name the suspension by its token or the task by its id, not both",
                ));
            }
        };
        let by = principal.map_or_else(String::new, |p| p.name.clone());
        let data = match r.data {
            // A person's answer still gets through; the disk does not fill with it.
            Some(data)
                if self.budget.disk_alarm && data.get().len() > MAX_RESULT_BYTES_UNDER_ALARM =>
            {
                Some(truncated_result(data.get().len()))
            }
            data => data,
        };
        self.wake(id, &mut rec, now, Waker::Resume(by, data))?;
        Ok(ResumeReply {
            task: id.to_string(),
            state: rec.state,
        })
    }

    /// Ends a suspension with a resume, its timeout that resumes, or its children's
    /// end: the task is ready at its place, its next holder sees how (and, when it
    /// waited for its children, how each one ended or stands).
    pub(super) fn wake(
        &mut self,
        id: Ulid,
        rec: &mut TaskRecord,
        now: Now,
        waker: Waker,
    ) -> Result<(), StoreError> {
        let suspension = rec
            .suspension
            .take()
            .unwrap_or_else(|| panic!("task {id}: only a suspended task wakes"));
        let children = if suspension.info.children {
            // The children's records as stored: whatever this request or timer changed
            // before is committed first.
            self.commit()?;
            self.child_outcomes(id)?
        } else {
            Vec::new()
        };
        let timed_out = matches!(waker, Waker::TimedOut);
        let (event, by, data) = match waker {
            Waker::Resume(by, data) => ("resumed", by, data),
            Waker::TimedOut => ("suspend_timed_out", String::new(), None),
            Waker::Children => ("children_finished", String::new(), None),
        };
        let resumed = Some(Resumed {
            data,
            by,
            at_ms: now.wall_ms,
            timed_out,
            children,
        });
        // The resume's data and the children's outcomes are stored with the task: they
        // count against the quota of whoever enqueued it, as a result does.
        let was = resumed_bytes(&rec.resumed);
        self.budget.recount(rec, was, resumed_bytes(&resumed));
        rec.resumed = resumed;
        rec.state = TaskState::Ready;
        rec.updated_ms = now.wall_ms;
        push_event(rec, now, event, None, Some(suspension.info.epoch), None);
        telemetry::resumed(&rec.queue);
        self.save(id, rec, None);
        Ok(())
    }

    /// Ends every suspension whose timeout passed, as its `on_timeout` says.
    pub(super) fn time_out_suspensions(&mut self, now: Now) -> Result<(), StoreError> {
        while let Some(&(at, id)) = self.index.suspended.first() {
            if at > now.wall_ms {
                break;
            }
            let mut rec = self.record(id).map_err(super::store_only)?;
            let suspension = rec
                .suspension
                .as_ref()
                .unwrap_or_else(|| panic!("task {id}: suspended without a suspension"));
            assert_eq!(
                suspension.info.timeout_at_ms, at,
                "task {id}: its timeout is the one its record names"
            );
            let (epoch, on_timeout) = (suspension.info.epoch, suspension.info.on_timeout);
            let waited = now.wall_ms.saturating_sub(suspension.info.since_ms);
            match on_timeout {
                OnTimeout::Resume => self.wake(id, &mut rec, now, Waker::TimedOut)?,
                OnTimeout::Fail => {
                    let error = format!("suspension timed out after {waited} ms");
                    push_event(
                        &mut rec,
                        now,
                        "suspend_timed_out",
                        None,
                        Some(epoch),
                        Some(&error),
                    );
                    rec.suspension = None;
                    rec.state = TaskState::Dead;
                    rec.last_error = Some(error);
                    rec.dead_reason = Some(telemetry::DEAD_SUSPEND_TIMED_OUT.into());
                    rec.updated_ms = now.wall_ms;
                    telemetry::dead(id, &rec.queue, telemetry::DEAD_SUSPEND_TIMED_OUT);
                    self.save(id, &rec, None);
                }
                OnTimeout::Cancel => {
                    push_event(&mut rec, now, "suspend_timed_out", None, Some(epoch), None);
                    push_event(&mut rec, now, "cancelled", None, None, None);
                    self.finish(&mut rec, TaskState::Cancelled, now);
                    self.save(id, &rec, None);
                }
            }
            assert!(
                !self.index.suspended.contains(&(at, id)),
                "task {id}: timed out but still suspended"
            );
            self.commit()?;
        }
        Ok(())
    }
}

/// Bytes of how its last suspension ended kept with its task (a resume's data, the
/// children's outcomes), counted in its stored bytes.
fn resumed_bytes(resumed: &Option<Resumed>) -> u64 {
    resumed.as_ref().map_or(0, |r| r.bytes() as u64)
}

/// `stale_token` unless `token` names `rec`'s current suspension and holds its secret.
fn check_token(token: &Token<'_>, rec: &TaskRecord) -> OpResult<()> {
    let id = token.task;
    let Some(suspension) = rec.suspension.as_ref() else {
        return Err(client(
            ErrorCode::StaleToken,
            format!(
                "task {id} is {}: its suspension under epoch {} has ended",
                rec.state, token.epoch
            ),
        ));
    };
    if suspension.info.epoch != token.epoch {
        return Err(client(
            ErrorCode::StaleToken,
            format!(
                "the token is of task {id}'s suspension under epoch {}; it is suspended under epoch {} now",
                token.epoch, suspension.info.epoch
            ),
        ));
    }
    if digest(token.secret) != suspension.token_digest {
        return Err(client(
            ErrorCode::StaleToken,
            format!("the token is not task {id}'s current suspension's"),
        ));
    }
    Ok(())
}
