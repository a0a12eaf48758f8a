//! Members: agent sessions, liveness, push delivery, reclaim, drain and revoke.
//!
//! Leases belong to a member's name, not to a connection. A session binds a member to
//! one connection (and the stream it was opened on, where pushes go); a newer session
//! under the same name takes over and the old one is told `replaced`. Pushes follow
//! credit: a subscribed member is handed tasks while it holds fewer leases than its
//! capacity, members taking turns.
//!
//! **Liveness** is apart from leases: a session is `connected` while the daemon hears
//! from its connection (any packet, reported by the connection layer as [`Engine::heard`],
//! and every request), `unreachable` once it was silent for longer than its liveness
//! timeout, and `gone` when its connection ended. Only a connected member gets pushes.
//! A task whose lease lapsed (or was revoked) is not handed back to the member that
//! held it while another member could take it, nor before that member was heard from
//! again after the lapse: a dead agent costs each of its tasks at most one failure.
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::ops::Bound;
use std::sync::Arc;

use ulid::Ulid;

use muster_protocol::limits::{
    MAX_CAPACITY, MAX_CLAIM_REPLY_BYTES, MAX_LIVENESS, MAX_PAGE, MAX_RESUME_HELD, MIN_LIVENESS,
};
use muster_protocol::model::{Delivery, MemberInfo, MemberState, TaskState};
use muster_protocol::names;
use muster_protocol::ops::{
    Empty, LeaseRef, LeaseRevoke, MemberDescribeReply, MemberList, MemberListReply, MemberName,
    MemberReply, SessionOpen, SessionOpenReply, SessionUpdate, SettleReply, Subscribe, Unsubscribe,
};
use muster_protocol::{ErrorBody, ErrorCode, Push};

use super::listing::fill;
use super::ops::{ClaimSpec, Grant, bad, parse_id, summary};
use super::telemetry::{self, LeaseEnd};
use super::{Engine, Failure, Members, Now, OpResult, Sink, Waiter, client, push_event};
use crate::auth::Principal;
use crate::store::StoreError;

/// What the engine knows of one member.
pub(super) struct Member<S> {
    /// Tasks leased to it.
    pub(super) leased: BTreeSet<Ulid>,
    session: Option<Session<S>>,
    labels: Vec<String>,
    capacity: u32,
    draining: bool,
    subscribed: Vec<String>,
    last_seen_ms: Option<u64>,
    /// The event number of its latest lease that lapsed or was revoked, until it is
    /// heard from after it: the tasks it let go may come back to it then.
    lapsed_at: Option<u64>,
}

/// What a member adds to the engine's counts of connected members: the label set it
/// carries, and the queues it consumes from (subscribed and not draining), while its
/// session is open and reachable.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(super) struct Counted {
    pub(super) labels: Option<Vec<String>>,
    pub(super) consumes: Vec<String>,
}

struct Session<S> {
    connection: u64,
    sink: S,
    /// Silence after which the member is unreachable.
    liveness_ms: u64,
    /// False once the liveness sweep found it silent; true again when heard from.
    reachable: bool,
}

impl<S: Sink> Member<S> {
    /// The queues its session subscribes to.
    pub(super) fn subscribed(&self) -> &[String] {
        &self.subscribed
    }

    pub(super) fn new() -> Member<S> {
        Member {
            leased: BTreeSet::new(),
            session: None,
            labels: Vec::new(),
            capacity: 0,
            draining: false,
            subscribed: Vec::new(),
            last_seen_ms: None,
            lapsed_at: None,
        }
    }

    /// Neither leases nor a session nor a drain: nothing to remember it by.
    pub(super) fn is_idle(&self) -> bool {
        self.leased.is_empty() && self.session.is_none() && !self.draining
    }

    /// Its labels while its session is open and reachable: what it adds to the label
    /// sets connected members carry. (A connection that just closed counts until the
    /// engine is told, a moment later, by [`Engine::disconnected`].)
    pub(super) fn carrying(&self) -> Option<&[String]> {
        self.session
            .as_ref()
            .filter(|s| s.reachable)
            .map(|_| self.labels.as_slice())
    }

    /// What it adds to the counts of connected members.
    pub(super) fn counted(&self) -> Counted {
        let labels = self.carrying().map(<[String]>::to_vec);
        let consumes = if labels.is_some() && !self.draining {
            self.subscribed.clone()
        } else {
            Vec::new()
        };
        Counted { labels, consumes }
    }

    /// Connected, unreachable or gone, as of the last liveness sweep.
    pub(super) fn state(&self) -> MemberState {
        match &self.session {
            Some(s) if !s.sink.is_closed() && s.reachable => MemberState::Connected,
            Some(s) if !s.sink.is_closed() => MemberState::Unreachable,
            _ => MemberState::Gone,
        }
    }

    pub(super) fn info(&self, name: &str) -> MemberInfo {
        MemberInfo {
            name: name.to_owned(),
            labels: self.labels.clone(),
            capacity: self.capacity,
            leased: self.leased.len() as u64,
            connected: self.state() == MemberState::Connected,
            state: self.state(),
            liveness_ms: self.session.as_ref().map_or(0, |s| s.liveness_ms),
            draining: self.draining,
            subscribed: self.subscribed.clone(),
            last_seen_ms: self.last_seen_ms,
        }
    }

    /// Room for pushes at `now`: subscribed, heard from within its liveness timeout
    /// (`heard` is when its connection was last heard from) and since its last lapse,
    /// not draining, under capacity. A member that let a lease lapse and has been silent
    /// since is in trouble (frozen, cut off, dying): it gets nothing until heard from.
    fn free(&self, heard: Option<super::Heard>, now: Now) -> usize {
        if self.lapsed_at.is_some() {
            return 0;
        }
        let alive = self.session.as_ref().is_some_and(|s| {
            !s.sink.is_closed()
                && heard.is_some_and(|h| now.mono_ms.saturating_sub(h.at_ms) <= s.liveness_ms)
        });
        if self.subscribed.is_empty() || self.draining || !alive {
            return 0;
        }
        (self.capacity as usize).saturating_sub(self.leased.len())
    }
}

impl<S: Sink> Members<S> {
    /// The shared name of a member, reusing the members map's copy.
    pub(super) fn name(&self, name: &str) -> Arc<str> {
        match self.by_name.get_key_value(name) {
            Some((k, _)) => Arc::clone(k),
            None => Arc::from(name),
        }
    }

    /// Forgets a lease of a member; a member left with neither leases nor a session
    /// (nor a drain to remember) is dropped at the end of the request or timer.
    pub(super) fn release_slot(&mut self, member: &Arc<str>, id: Ulid) {
        let m = self
            .by_name
            .get_mut(member)
            .unwrap_or_else(|| panic!("task {id} is leased to unknown member {member:?}"));
        assert!(m.leased.remove(&id), "task {id} was not held by {member:?}");
        // A freed slot may take a pushed task.
        self.push_members.insert(Arc::clone(member));
        if m.is_idle() {
            self.idle.push(Arc::clone(member));
        }
    }

    /// Keeps the counts of connected members (their label sets, and with them every
    /// queue's unclaimable classes; the queues they consume from) up to date after a
    /// member counted as `before` now counts as `after`. Queues' classes are revisited
    /// only when a label set appears among connected members or leaves them.
    pub(super) fn recount(
        &mut self,
        before: Counted,
        after: Counted,
        queues: &mut BTreeMap<String, super::Queue>,
    ) {
        debug_assert!(
            (before.labels.is_some() || before.consumes.is_empty())
                && (after.labels.is_some() || after.consumes.is_empty()),
            "only a connected member consumes"
        );
        if before == after {
            return;
        }
        for q in &before.consumes {
            let n = self
                .consumers
                .get_mut(q.as_str())
                .unwrap_or_else(|| panic!("queue {q:?}: its consumers are not counted"));
            assert!(*n > 0, "queue {q:?}: its consumer count never underflows");
            *n -= 1;
            if *n == 0 {
                self.consumers.remove(q.as_str());
            }
        }
        for q in after.consumes {
            *self.consumers.entry(q).or_default() += 1;
        }
        if before.labels == after.labels {
            return;
        }
        if let Some(set) = before.labels
            && self.carried.remove(&set)
        {
            for q in queues.values_mut() {
                q.dispatch.carried_changed(&set, false, &self.carried);
            }
        }
        if let Some(set) = after.labels
            && self.carried.add(&set)
        {
            for q in queues.values_mut() {
                q.dispatch.carried_changed(&set, true, &self.carried);
            }
        }
    }

    /// Room for pushes a member has at `now`.
    fn room(&self, m: &Member<S>, now: Now) -> usize {
        let heard = m
            .session
            .as_ref()
            .and_then(|s| self.heard.get(&s.connection).copied());
        m.free(heard, now)
    }

    /// The event number of the last time the connection of `m`'s session was heard from.
    fn heard_event(&self, m: &Member<S>) -> u64 {
        m.session
            .as_ref()
            .and_then(|s| self.heard.get(&s.connection))
            .map_or(0, |h| h.event)
    }

    /// Remembers that `member` let task `id` go (a lapse or a revoke).
    pub(super) fn let_go(&mut self, id: Ulid, member: &str) {
        if member.is_empty() {
            return;
        }
        self.events += 1;
        let name = self.name(member);
        if let Some(m) = self.by_name.get_mut(&name) {
            assert!(
                !m.leased.contains(&id),
                "task {id}: let go by member {member:?}, which still holds it"
            );
            m.lapsed_at = Some(self.events);
        }
        self.avoid.insert(id, (name, self.events));
    }
}

impl<W: Waiter> Engine<W> {
    /// The connection layer heard from `connection` (a packet of any kind arrived): its
    /// member session, if any, is alive.
    pub fn heard(&mut self, connection: u64, now: Now) {
        self.heard_from(connection, now);
    }

    /// Records that `connection` was heard from at `now` (a request or any packet): the
    /// heartbeat of its member session and of its parked claims.
    pub(super) fn heard_from(&mut self, connection: u64, now: Now) {
        self.members.events += 1;
        let event = self.members.events;
        let previous = self.members.heard.insert(
            connection,
            super::Heard {
                at_ms: now.mono_ms,
                event,
            },
        );
        assert!(
            previous.is_none_or(|h| h.event < event),
            "connection {connection}: heard-from events only grow"
        );
        let liveness = muster_protocol::limits::DEFAULT_LIVENESS.as_millis() as u64;
        if previous.is_some_and(|h| now.mono_ms.saturating_sub(h.at_ms) > liveness) {
            // Claims it parked while silent were passed over: serve them again.
            self.waiting.ready_changed.everywhere();
        }
        let Some(name) = self.members.sessions.get(&connection) else {
            return;
        };
        let Some(m) = self.members.by_name.get_mut(name) else {
            return;
        };
        debug_assert!(
            m.session
                .as_ref()
                .is_some_and(|s| s.connection == connection),
            "member {name:?}: the sessions map names its session's connection"
        );
        m.last_seen_ms = Some(now.wall_ms);
        let mut recount = None;
        if m.session.as_ref().is_some_and(|s| !s.reachable) {
            let before = m.counted();
            if let Some(s) = m.session.as_mut() {
                s.reachable = true;
            }
            recount = Some((before, m.counted()));
            self.generation += 1;
            self.members.push_members.insert(Arc::clone(name));
            tracing::info!(member = %name, "member reachable again");
        }
        if m.lapsed_at.is_some_and(|at| event > at) {
            // Tasks it let lapse may go back to it now that it is alive.
            m.lapsed_at = None;
            self.members.push_members.insert(Arc::clone(name));
            self.waiting.ready_changed.everywhere();
        }
        if let Some((before, after)) = recount {
            self.members.recount(before, after, &mut self.index.queues);
        }
    }

    /// Marks members silent past their liveness timeout unreachable. Runs at most every
    /// [`LIVENESS_SWEEP`](super::LIVENESS_SWEEP); pushes check liveness exactly.
    pub(super) fn sweep_liveness(&mut self, now: Now) {
        if now.mono_ms < self.members.liveness_sweep_at {
            return;
        }
        self.members.liveness_sweep_at = now.mono_ms + super::LIVENESS_SWEEP.as_millis() as u64;
        let mut silenced = Vec::new();
        for (name, m) in &mut self.members.by_name {
            let Some(s) = m.session.as_ref() else {
                continue;
            };
            debug_assert!(
                self.members.sessions.get(&s.connection) == Some(name),
                "member {name:?}: its session's connection names it"
            );
            let heard = self.members.heard.get(&s.connection).map_or(0, |h| h.at_ms);
            let silent = now.mono_ms.saturating_sub(heard);
            if s.reachable && !s.sink.is_closed() && silent > s.liveness_ms {
                let before = m.counted();
                if let Some(s) = m.session.as_mut() {
                    s.reachable = false;
                }
                silenced.push((before, m.counted()));
                self.generation += 1;
                tracing::info!(member = %name, silent_ms = silent, leases = m.leased.len(), "member unreachable");
            }
        }
        for (before, after) in silenced {
            self.members.recount(before, after, &mut self.index.queues);
        }
    }

    /// Members with a connected, reachable session.
    pub fn connected_members(&self) -> usize {
        self.members
            .by_name
            .values()
            .filter(|m| m.state() == MemberState::Connected)
            .count()
    }

    /// Members whose session is open but silent past its liveness timeout.
    pub(super) fn unreachable_members(&self) -> usize {
        self.members
            .by_name
            .values()
            .filter(|m| m.state() == MemberState::Unreachable)
            .count()
    }

    /// Who can take a queue's tasks now: connected, not draining member sessions
    /// subscribed to it, and claims parked on it (both counted as they come and go).
    pub(super) fn consumers(&self, queue: &str) -> u64 {
        let subscribed = self.members.consumers.get(queue).copied().unwrap_or(0);
        u64::from(subscribed) + self.waiting.parked.on_queue(queue) as u64
    }

    /// True if task `id` must not go to `claimer` now: the claimer let it lapse (or had
    /// it revoked) and either was not heard from since (`heard` is the event number of
    /// when it last was), or another connected member with room could take it.
    pub(super) fn avoided(&self, id: Ulid, claimer: &str, heard: u64, now: Now) -> bool {
        debug_assert!(!claimer.is_empty(), "only a named claimer avoids tasks");
        let Some((member, at)) = self.members.avoid.get(&id) else {
            return false;
        };
        if **member != *claimer {
            return false;
        }
        if heard <= *at {
            return true;
        }
        let Some(meta) = self.index.tasks.get(&id) else {
            return false;
        };
        self.members.by_name.iter().any(|(name, m)| {
            **name != *claimer
                && self.members.room(m, now) > 0
                && m.subscribed.iter().any(|q| **q == *meta.queue)
                && meta.class.iter().all(|l| m.labels.contains(l))
        })
    }

    /// True if the member is drained: claims in its name get nothing.
    pub(super) fn is_draining(&self, member: &str) -> bool {
        self.members.by_name.get(member).is_some_and(|m| m.draining)
    }

    /// Sends a push to the session of a member, if it has one.
    pub(super) fn push_to(&mut self, member: &str, push: Push) {
        if let Some(s) = self
            .members
            .by_name
            .get(member)
            .and_then(|m| m.session.as_ref())
            && !s.sink.is_closed()
        {
            self.outbox.pushes.push((s.sink.clone(), push));
        }
    }

    /// The member whose session is on the waiter's connection, or `bad_request`.
    fn own_session(&self, member: &str, waiter: &W) -> OpResult<()> {
        match self
            .members
            .by_name
            .get(member)
            .and_then(|m| m.session.as_ref())
        {
            Some(s) if s.connection == waiter.connection() => Ok(()),
            _ => Err(bad(format!(
                "member {member:?} has no session on this connection: send session_open first"
            ))),
        }
    }

    pub(super) fn session_open(
        &mut self,
        r: SessionOpen,
        waiter: &W,
        now: Now,
    ) -> OpResult<SessionOpenReply> {
        let (liveness_ms, policy) = self.check_open(&r, waiter)?;
        let member = r.member.clone();
        let held = self.bind_session(r, liveness_ms, waiter, now);
        let mut reply = SessionOpenReply {
            reclaimed: Vec::new(),
            released: 0,
            kept: 0,
            dead: 0,
        };
        let mut reply_bytes = 0;
        let (holding, mut delivered) = (held.len(), 0);
        for id in held {
            match self.hand_back(id, &member, &policy, now)? {
                Handed::Kept => reply.kept += 1,
                Handed::Released => reply.released += 1,
                Handed::Dead => reply.dead += 1,
                Handed::Delivered(delivery) => {
                    delivered += 1;
                    // The reply carries what fits; the rest follows as pushes on the
                    // session's stream, so a reply never outgrows its frame.
                    reply_bytes += delivery.bytes();
                    if reply_bytes <= MAX_CLAIM_REPLY_BYTES || reply.reclaimed.is_empty() {
                        reply.reclaimed.push(*delivery);
                    } else {
                        self.outbox
                            .pushes
                            .push((waiter.sink(), Push::Deliver(*delivery)));
                    }
                }
            }
        }
        assert_eq!(
            reply.kept + reply.released + reply.dead + delivered,
            holding as u64,
            "member {member:?}: every lease it held handed back once"
        );
        debug_assert_eq!(
            self.members.by_name[member.as_str()].leased.len() as u64,
            reply.kept + delivered,
            "member {member:?}: it holds what it kept and what was handed back to it"
        );
        debug_assert_eq!(
            self.members
                .sessions
                .get(&waiter.connection())
                .map(|n| &**n),
            Some(member.as_str()),
            "member {member:?}: its session is on this connection"
        );
        tracing::info!(
            member = %member,
            liveness_ms,
            reclaimed = reply.reclaimed.len(),
            kept = reply.kept,
            released = reply.released,
            dead = reply.dead,
            "member connected"
        );
        Ok(reply)
    }

    /// Checks a `session_open` before anything changes: its liveness timeout and what
    /// is to become of the leases the member holds.
    fn check_open(&self, r: &SessionOpen, waiter: &W) -> OpResult<(u64, HandBack)> {
        names::check_member(&r.member).map_err(bad)?;
        names::check_labels(&r.labels).map_err(bad)?;
        if r.capacity == 0 || r.capacity > MAX_CAPACITY {
            return Err(bad(format!(
                "capacity {} is outside 1..={MAX_CAPACITY}",
                r.capacity
            )));
        }
        let policy = match (r.reclaim, r.resume, r.held.as_deref()) {
            (true, true, _) => return Err(bad("reclaim and resume exclude each other")),
            (_, false, Some(_)) => return Err(bad("held is given only with resume")),
            (true, false, None) => HandBack::Reclaim,
            (false, false, None) => HandBack::Release,
            (false, true, None) => HandBack::KeepAll,
            (false, true, Some(held)) => HandBack::KeepKnown(known_leases(held)?),
        };
        let liveness_ms = r
            .liveness_ms
            .unwrap_or(muster_protocol::limits::DEFAULT_LIVENESS.as_millis() as u64);
        let (min, max) = (
            MIN_LIVENESS.as_millis() as u64,
            MAX_LIVENESS.as_millis() as u64,
        );
        if !(min..=max).contains(&liveness_ms) {
            return Err(bad(format!(
                "liveness of {liveness_ms} ms is outside {min}..={max} ms"
            )));
        }
        if let Some(other) = self.members.sessions.get(&waiter.connection())
            && **other != *r.member
        {
            return Err(bad(format!(
                "this connection holds the session of member {other:?}; open one connection per member"
            )));
        }
        Ok((liveness_ms, policy))
    }

    /// Binds the member's session to this connection (telling a session it replaces),
    /// with its labels, capacity and liveness timeout. Returns the leases it holds.
    fn bind_session(
        &mut self,
        r: SessionOpen,
        liveness_ms: u64,
        waiter: &W,
        now: Now,
    ) -> Vec<Ulid> {
        self.take_member(&r.member, waiter.principal(), now);
        let name = self.members.name(&r.member);
        let member = self
            .members
            .by_name
            .entry(Arc::clone(&name))
            .or_insert_with(Member::new);
        let before = member.counted();
        if let Some(old) = member.session.take() {
            self.members.sessions.remove(&old.connection);
            if old.connection != waiter.connection() && !old.sink.is_closed() {
                tracing::info!(member = %r.member, "member replaced by a newer session");
                let error = ErrorBody::new(
                    ErrorCode::Replaced,
                    format!("a newer session of member {:?} took over", r.member),
                );
                self.outbox.pushes.push((old.sink, Push::Closed(error)));
            }
        }
        member.session = Some(Session {
            connection: waiter.connection(),
            sink: waiter.sink(),
            liveness_ms,
            reachable: true,
        });
        member.labels = r.labels;
        member.capacity = r.capacity;
        // A reconnecting agent stays drained; a freshly started one begins anew.
        if !r.resume {
            member.draining = false;
        }
        member.subscribed.clear();
        member.last_seen_ms = Some(now.wall_ms);
        member.lapsed_at = None;
        let held: Vec<Ulid> = member.leased.iter().copied().collect();
        debug_assert!(
            held.iter().all(|id| self
                .index
                .tasks
                .get(id)
                .and_then(super::Meta::member)
                .is_some_and(|m| *m == name)),
            "member {name:?}: every task it holds is leased to it"
        );
        let after = member.counted();
        let previous = self
            .members
            .sessions
            .insert(waiter.connection(), Arc::clone(&name));
        assert!(
            previous.is_none_or(|p| p == name),
            "connection {}: one member's session at most",
            waiter.connection()
        );
        self.members.recount(before, after, &mut self.index.queues);
        self.members.push_members.insert(name);
        held
    }

    /// What a session open does with one lease its member holds, per `policy`. A
    /// pending cancel ends the task instead of handing it back (its work was to stop
    /// anyway), unless the lease is kept; a lease that would be handed back in a queue
    /// being deleted is released instead.
    fn hand_back(
        &mut self,
        id: Ulid,
        member: &str,
        policy: &HandBack,
        now: Now,
    ) -> OpResult<Handed> {
        if let HandBack::KeepAll = policy {
            return Ok(Handed::Kept);
        }
        let mut rec = self.record(id)?;
        let lease = rec
            .lease
            .take()
            .expect("a member's leased task has a lease");
        assert_eq!(lease.member, member, "{id}: a lease of another member");
        if let HandBack::KeepKnown(known) = policy
            && known.contains(&(id, lease.epoch))
        {
            return Ok(Handed::Kept);
        }
        let grant = self.regrant(id, member, policy, lease.epoch, &rec.queue);
        let epoch = Some(lease.epoch);
        let how = match grant {
            _ if rec.cancel_requested => LeaseEnd::Cancelled,
            Some(Grant::Reclaimed) => LeaseEnd::Reclaimed,
            Some(_) => LeaseEnd::Redelivered,
            None => LeaseEnd::Released,
        };
        telemetry::lease_ended(id, &rec, &lease, how, now.wall_ms);
        if self.cancel_if_requested(&mut rec, now, Some(member), epoch) {
            self.save(id, &rec, None);
            return Ok(Handed::Released);
        }
        let Some(grant) = grant else {
            push_event(&mut rec, now, "released", Some(member), epoch, None);
            rec.state = TaskState::Ready;
            rec.updated_ms = now.wall_ms;
            self.save(id, &rec, None);
            return Ok(Handed::Released);
        };
        if grant == Grant::Reclaimed {
            // The agent restarted and lost its work in progress: a failure, like a
            // lapse, but handed straight back instead of waiting for the lease to run
            // out. (A lease the agent never heard of cost it nothing: no failure.)
            let error = format!("member {member:?} restarted");
            if self.count_failure(id, &mut rec, now, error, Some(member)) {
                self.save(id, &rec, None);
                return Ok(Handed::Dead);
            }
        }
        let delivery = self.lease_to(id, rec, member, None, now, grant)?;
        assert!(
            delivery.epoch > lease.epoch,
            "{id}: handed back under epoch {} after {}",
            delivery.epoch,
            lease.epoch
        );
        Ok(Handed::Delivered(Box::new(delivery)))
    }

    /// How a session open hands back a lease it does not keep: leased again under
    /// which grant, or released (`None`), as it always is in a queue being deleted.
    fn regrant(
        &self,
        id: Ulid,
        member: &str,
        policy: &HandBack,
        epoch: u64,
        queue: &str,
    ) -> Option<Grant> {
        let grant = match policy {
            // Resuming, and the agent never heard of this lease: its grant's reply or
            // push was lost with a connection (a leader's last round, agreed on by the
            // next leader). Handed over now rather than left to lapse unworked.
            HandBack::KeepKnown(_) => {
                tracing::info!(member, task = %id, epoch, "re-delivering a lease its agent never heard of");
                Some(Grant::Redelivered)
            }
            HandBack::Reclaim => Some(Grant::Reclaimed),
            HandBack::Release | HandBack::KeepAll => None,
        };
        // A task of a queue being deleted is not leased again (nothing more is leased
        // from it): its lease is released, without a failure, and the task goes with
        // its queue.
        let deleting = self.index.queues.get(queue).is_some_and(|q| q.deleting);
        grant.filter(|_| !deleting)
    }

    /// A connection ended: its member session (if any) ends with it. Leases stay.
    /// Ends member `name`'s session for an operator: its agent is told (`closed`,
    /// `replaced`: it must not come back under the name) and the member forgotten if it
    /// holds nothing else. Nothing happens to a member without a session.
    pub(super) fn end_session(&mut self, name: &str, why: &str) {
        let Some(m) = self.members.by_name.get_mut(name) else {
            return;
        };
        let before = m.counted();
        let Some(session) = m.session.take() else {
            return;
        };
        m.subscribed.clear();
        let idle = m.is_idle();
        let bound = self.members.sessions.remove(&session.connection);
        debug_assert!(
            bound.is_some_and(|n| *n == *name),
            "member {name:?}: the sessions map named its session's connection"
        );
        self.generation += 1;
        if !session.sink.is_closed() {
            let error = ErrorBody::new(ErrorCode::Replaced, why);
            self.outbox.pushes.push((session.sink, Push::Closed(error)));
        }
        tracing::info!(member = name, "member session ended by an operator");
        let after = match idle {
            true => {
                self.members.by_name.remove(name);
                Counted::default()
            }
            false => self.members.by_name[name].counted(),
        };
        self.members.recount(before, after, &mut self.index.queues);
    }

    pub fn disconnected(&mut self, connection: u64) {
        self.waiting.watches.remove(&connection);
        self.members.heard.remove(&connection);
        let Some(name) = self.members.sessions.remove(&connection) else {
            return;
        };
        self.generation += 1;
        let mut before = Counted::default();
        debug_assert!(
            self.members.by_name.get(&name).is_some_and(|m| m
                .session
                .as_ref()
                .is_some_and(|s| s.connection == connection)),
            "member {name:?}: the sessions map names its session's connection"
        );
        if let Some(m) = self.members.by_name.get_mut(&name) {
            if m.session
                .as_ref()
                .is_some_and(|s| s.connection == connection)
            {
                before = m.counted();
                m.session = None;
                m.subscribed.clear();
                tracing::info!(member = %name, leases = m.leased.len(), "member gone");
            }
            // A drained member is remembered until a fresh session clears the drain.
            if m.is_idle() {
                self.members.by_name.remove(&name);
            }
        }
        self.members
            .recount(before, Counted::default(), &mut self.index.queues);
    }

    pub(super) fn session_update(&mut self, r: SessionUpdate, waiter: &W) -> OpResult<MemberReply> {
        self.own_session(&r.member, waiter)?;
        if let Some(labels) = &r.labels {
            names::check_labels(labels).map_err(bad)?;
        }
        if let Some(c) = r.capacity
            && (c == 0 || c > MAX_CAPACITY)
        {
            return Err(bad(format!("capacity {c} is outside 1..={MAX_CAPACITY}")));
        }
        let member = self
            .members
            .by_name
            .get_mut(r.member.as_str())
            .ok_or_else(|| not_a_member(&r.member))?;
        let before = member.counted();
        if let Some(labels) = r.labels {
            member.labels = labels;
        }
        if let Some(c) = r.capacity {
            member.capacity = c;
        }
        let reply = MemberReply {
            member: member.info(&r.member),
        };
        let after = member.counted();
        self.members
            .push_members
            .insert(self.members.name(&r.member));
        self.members.recount(before, after, &mut self.index.queues);
        Ok(reply)
    }

    pub(super) fn subscribe(&mut self, r: Subscribe, waiter: &W) -> OpResult<Empty> {
        self.own_session(&r.member, waiter)?;
        if r.queues.is_empty() || r.queues.len() > muster_protocol::limits::MAX_CLAIM_QUEUES {
            return Err(bad(format!(
                "a subscription names 1 to {} queues",
                muster_protocol::limits::MAX_CLAIM_QUEUES
            )));
        }
        for (i, q) in r.queues.iter().enumerate() {
            if r.queues[..i].contains(q) {
                return Err(bad(format!("queue {q:?} is named twice")));
            }
            if !self.index.queues.contains_key(q) {
                return Err(client(ErrorCode::NotFound, format!("no queue {q:?}")));
            }
        }
        let member = self
            .members
            .by_name
            .get_mut(r.member.as_str())
            .ok_or_else(|| not_a_member(&r.member))?;
        let before = member.counted();
        member.subscribed = r.queues;
        let after = member.counted();
        self.members
            .push_members
            .insert(self.members.name(&r.member));
        self.members.recount(before, after, &mut self.index.queues);
        Ok(Empty {})
    }

    pub(super) fn unsubscribe(&mut self, r: Unsubscribe, waiter: &W) -> OpResult<Empty> {
        self.own_session(&r.member, waiter)?;
        if let Some(m) = self.members.by_name.get_mut(r.member.as_str()) {
            let before = m.counted();
            m.subscribed.clear();
            let after = m.counted();
            self.members.recount(before, after, &mut self.index.queues);
        }
        Ok(Empty {})
    }

    /// A page of members, or for a queue-scoped admin of those working on its queues.
    pub(super) fn member_list(
        &self,
        r: &MemberList,
        p: Option<&Principal>,
    ) -> OpResult<MemberListReply> {
        let limit = r.limit.unwrap_or(MAX_PAGE);
        if limit == 0 || limit > MAX_PAGE {
            return Err(bad(format!("limit {limit} is outside 1..={MAX_PAGE}")));
        }
        let start = r.after.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
        let page = fill(
            self.members
                .by_name
                .range::<str, _>((start, Bound::Unbounded))
                .filter(|(name, _)| p.is_none_or(|p| self.member_visible(name, p)))
                .map(|(name, m)| Ok::<_, Failure>(m.info(name))),
            limit as usize,
            |m| m.name.clone(),
        )?;
        Ok(MemberListReply {
            members: page.items,
            next: page.next,
        })
    }

    pub(super) fn member_describe(&self, r: &MemberName) -> OpResult<MemberDescribeReply> {
        let m = self
            .members
            .by_name
            .get(r.member.as_str())
            .ok_or_else(|| not_a_member(&r.member))?;
        let leases = fill(
            m.leased
                .iter()
                .map(|&id| Ok::<_, Failure>(summary(id, &self.record(id)?))),
            m.leased.len().max(1),
            |t| t.id.clone(),
        )?;
        Ok(MemberDescribeReply {
            member: m.info(&r.member),
            leases: leases.items,
            leases_total: m.leased.len() as u64,
        })
    }

    pub(super) fn member_drain(&mut self, r: &MemberName) -> OpResult<MemberReply> {
        let m = self
            .members
            .by_name
            .get_mut(r.member.as_str())
            .ok_or_else(|| not_a_member(&r.member))?;
        let before = m.counted();
        m.draining = true;
        let (after, info) = (m.counted(), m.info(&r.member));
        debug_assert!(
            after.consumes.is_empty(),
            "member {:?}: a draining member consumes from no queue",
            r.member
        );
        self.members.recount(before, after, &mut self.index.queues);
        self.push_to(&r.member, Push::Drain);
        Ok(MemberReply { member: info })
    }

    /// Ends a member's drain. Its session (if any) and claims naming it are served again
    /// at the end of this request; a member that was not draining is left as it was.
    pub(super) fn member_undrain(&mut self, r: &MemberName) -> OpResult<MemberReply> {
        let m = self
            .members
            .by_name
            .get_mut(r.member.as_str())
            .ok_or_else(|| not_a_member(&r.member))?;
        if m.draining {
            let before = m.counted();
            m.draining = false;
            let after = m.counted();
            self.members.recount(before, after, &mut self.index.queues);
            self.members
                .push_members
                .insert(self.members.name(&r.member));
            // Claims naming it were parked without tasks: serve them again.
            self.waiting.ready_changed.everywhere();
            // A member remembered only for its drain is forgotten now.
            let name = self.members.name(&r.member);
            self.members.idle.push(name);
        }
        let info = self.members.by_name[r.member.as_str()].info(&r.member);
        Ok(MemberReply { member: info })
    }

    pub(super) fn lease_revoke(&mut self, r: LeaseRevoke, now: Now) -> OpResult<SettleReply> {
        let id = parse_id(&r.task)?;
        let meta = self
            .index
            .tasks
            .get(&id)
            .ok_or_else(|| client(ErrorCode::NotFound, format!("no task {id}")))?;
        if meta.state != TaskState::Leased {
            return Err(client(
                ErrorCode::InvalidState,
                format!("task {id} is {}, not leased", meta.state),
            ));
        }
        let (mut rec, member) = (self.record(id)?, meta.member().cloned());
        let lease = rec.lease.take().expect("a leased task has a lease");
        telemetry::lease_ended(id, &rec, &lease, LeaseEnd::Revoked, now.wall_ms);
        let (holder, epoch) = (lease.member, lease.epoch);
        assert_eq!(
            member.as_deref().unwrap_or(""),
            holder,
            "task {id}: its index entry and its record name the same holder"
        );
        push_event(&mut rec, now, "revoked", Some(&holder), Some(epoch), None);
        let state = self.fail(
            id,
            &mut rec,
            now,
            format!("lease revoked by an operator (member {holder:?}, epoch {epoch})"),
            Some(0),
        );
        if state == TaskState::Ready {
            // It goes to another member if one can take it.
            self.members.let_go(id, &holder);
        }
        if let Some(member) = member {
            self.push_to(
                &member,
                Push::Revoked(LeaseRef {
                    task: id.to_string(),
                    epoch,
                }),
            );
        }
        Ok(SettleReply {
            state,
            not_before_ms: rec.not_before_ms,
        })
    }

    /// Pushes tasks to subscribed members with free capacity, one task per member per turn.
    pub(super) fn serve_pushes(
        &mut self,
        ready: &super::ReadyChanged,
        now: Now,
    ) -> Result<(), StoreError> {
        let changed = std::mem::take(&mut self.members.push_members);
        let has_room = |name: &Arc<str>| {
            self.members
                .by_name
                .get(name)
                .is_some_and(|m| self.members.room(m, now) > 0)
        };
        let mut order: Vec<Arc<str>> = if ready.any() {
            self.members
                .by_name
                .iter()
                .filter(|(name, m)| {
                    changed.contains(*name)
                        || ready.touches(m.subscribed.iter().map(String::as_str))
                })
                .map(|(name, _)| name)
                .filter(|name| has_room(name))
                .cloned()
                .collect()
        } else {
            changed.into_iter().filter(has_room).collect()
        };
        if order.is_empty() {
            return Ok(());
        }
        let start = self.members.rotation % order.len();
        order.rotate_left(start);
        self.members.rotation = self.members.rotation.wrapping_add(1);
        loop {
            let mut progressed = false;
            for name in &order {
                let Some(m) = self.members.by_name.get(name) else {
                    continue;
                };
                if self.members.room(m, now) == 0 {
                    continue;
                }
                let heard = self.members.heard_event(m);
                let spec = ClaimSpec {
                    queues: m.subscribed.clone(),
                    max: 1,
                    lease_ms: None,
                    member: name.to_string(),
                    labels: m.labels.clone(),
                    heard,
                };
                let tasks = self.take_ready(&spec, now).map_err(super::store_only)?;
                for task in tasks {
                    progressed = true;
                    self.push_to(name, Push::Deliver(task));
                }
            }
            if !progressed {
                break;
            }
        }
        // Granting leases above marked no slot as freed; nothing more can be served now.
        assert!(
            self.members.push_members.is_empty(),
            "granting pushes freed slots: {:?}",
            self.members.push_members
        );
        Ok(())
    }
}

pub(super) fn not_a_member(name: &str) -> Failure {
    client(ErrorCode::NotFound, format!("no member {name:?}"))
}

/// What `session_open` does with each lease its member already holds.
enum HandBack {
    /// `resume` without `held`: every lease is kept.
    KeepAll,
    /// `resume` with `held`: the leases named are kept, the others redelivered.
    KeepKnown(HashSet<(Ulid, u64)>),
    /// `reclaim`: each is leased again under a new epoch, a failure counted.
    Reclaim,
    /// Neither: each is released to its queue.
    Release,
}

/// What became of one lease a session open handed back.
enum Handed {
    Kept,
    Released,
    Dead,
    Delivered(Box<Delivery>),
}

/// The leases a resuming agent names as its own (`session_open`'s `held`), checked:
/// at most [`MAX_RESUME_HELD`], each a task id.
fn known_leases(held: &[LeaseRef]) -> OpResult<HashSet<(Ulid, u64)>> {
    if held.len() > MAX_RESUME_HELD {
        return Err(bad(format!(
            "held names {} leases; at most {MAX_RESUME_HELD}",
            held.len()
        )));
    }
    held.iter()
        .map(|l| Ok((parse_id(&l.task)?, l.epoch)))
        .collect()
}
