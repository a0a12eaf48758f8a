//! The whole task life cycle against a reference model, with crash-restarts, by
//! property-based testing.
//!
//! Random sequences of enqueue, claim, renew, ack, nack, release, dead-letter, lapse
//! (time driven by the test), cancel, redrive, restart and changes of the queue's
//! `max_runtime_ms` under running leases (a delivery's runtime cap holds across
//! restarts and queue updates; a renewal refused at the cap means the lease ended). Settles name any claim ever
//! handed out, so stale and future epochs come in every order: the model says whether
//! the claim is current, and a refused settle must be `lease_lost` and change nothing.
//! After every step: every task's state, counters, epoch and lease deadline equal the
//! model's; the queue's counts equal the model's (each task in exactly one state);
//! failures never decrease except on redrive; an acked task is never delivered again;
//! and a restart changes nothing but lease deadlines (each gets a full period).
//!
//! A second model follows one member across sessions opened, replaced and ended, and
//! leases claimed, renewed, cancelled, acked and lapsed: its record (labels, capacity,
//! leases, last seen) is listed exactly while it has a session or a lease, and no
//! renewal or cancel of a session-less member's last lease wipes it (dropping the
//! member at once when a renewal frees its slot for an instant fails this model).

use std::collections::HashSet;

use proptest::prelude::*;

use muster_protocol::model::{MemberState, QueuePatch, TaskState};
use muster_protocol::ops::{Cancel, Claim, DeadSelection, QueueUpdate, Redrive};
use muster_protocol::{ErrorCode, ops::EngineRequest};

use super::{Harness, ack, dead_letter, nack, release, renew};
use crate::engine::Reply;

const LEASE_MS: u64 = 1000;
const MAX_ATTEMPTS: u64 = 3;
const NACK_DELAY_MS: u64 = 700;

#[derive(Debug, Clone)]
enum Step {
    Enqueue {
        delay: bool,
    },
    Claim {
        max: u32,
    },
    Renew {
        pick: usize,
    },
    Ack {
        pick: usize,
    },
    Nack {
        pick: usize,
        delay: bool,
    },
    Release {
        pick: usize,
    },
    DeadLetter {
        pick: usize,
    },
    Advance {
        ms: u64,
    },
    Cancel {
        pick: usize,
    },
    Redrive {
        pick: usize,
    },
    Restart {
        gap_ms: u64,
    },
    /// Sets the queue's max_runtime_ms (`None` clears it).
    MaxRuntime {
        ms: Option<u64>,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => any::<bool>().prop_map(|delay| Step::Enqueue { delay }),
        4 => (1u32..3).prop_map(|max| Step::Claim { max }),
        2 => any::<usize>().prop_map(|pick| Step::Renew { pick }),
        3 => any::<usize>().prop_map(|pick| Step::Ack { pick }),
        2 => (any::<usize>(), any::<bool>()).prop_map(|(pick, delay)| Step::Nack { pick, delay }),
        1 => any::<usize>().prop_map(|pick| Step::Release { pick }),
        1 => any::<usize>().prop_map(|pick| Step::DeadLetter { pick }),
        3 => (1u64..1500).prop_map(|ms| Step::Advance { ms }),
        1 => any::<usize>().prop_map(|pick| Step::Cancel { pick }),
        1 => any::<usize>().prop_map(|pick| Step::Redrive { pick }),
        1 => (0u64..3000).prop_map(|gap_ms| Step::Restart { gap_ms }),
        1 => prop_oneof![Just(None), (500u64..4000).prop_map(Some)]
            .prop_map(|ms| Step::MaxRuntime { ms }),
    ]
}

/// A task's state in the model; times are wall-clock ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum M {
    Scheduled {
        at: u64,
    },
    Ready,
    Leased {
        epoch: u64,
        expires: u64,
        /// When the delivery was granted (its runtime cap counts from here).
        granted: u64,
    },
    Done,
    Dead,
    Cancelled,
}

impl Model {
    /// The latest deadline the queue's runtime cap allows a delivery granted at `granted`.
    fn cap(&self, granted: u64) -> u64 {
        self.max_runtime.map_or(u64::MAX, |max| granted + max)
    }
}

impl M {
    fn state(self) -> TaskState {
        match self {
            M::Scheduled { .. } => TaskState::Scheduled,
            M::Ready => TaskState::Ready,
            M::Leased { .. } => TaskState::Leased,
            M::Done => TaskState::Done,
            M::Dead => TaskState::Dead,
            M::Cancelled => TaskState::Cancelled,
        }
    }
}

#[derive(Debug, Clone)]
struct ModelTask {
    id: String,
    state: M,
    deliveries: u64,
    failures: u64,
    cancel_requested: bool,
}

struct Model {
    now: u64,
    /// The queue's max_runtime_ms.
    max_runtime: Option<u64>,
    tasks: Vec<ModelTask>,
    /// Every claim ever handed out: (task index, epoch).
    claims: Vec<(usize, u64)>,
    /// Tasks whose ack was accepted.
    acked: HashSet<String>,
}

impl Model {
    /// The epoch of task `i`'s current lease, if it is leased.
    fn current(&self, i: usize) -> Option<u64> {
        match self.tasks[i].state {
            M::Leased { epoch, .. } => Some(epoch),
            _ => None,
        }
    }

    /// A leased task ends: cancelled if a cancel is pending, else `to`.
    fn end(&mut self, i: usize, to: M) {
        let t = &mut self.tasks[i];
        t.state = if t.cancel_requested { M::Cancelled } else { to };
    }

    /// A nack or a lapse: cancelled if a cancel is pending (no failure counted), else
    /// one more failure, then dead or retried.
    fn fail(&mut self, i: usize, delay: u64) {
        let now = self.now;
        let t = &mut self.tasks[i];
        if t.cancel_requested {
            t.state = M::Cancelled;
            return;
        }
        t.failures += 1;
        t.state = if t.failures >= MAX_ATTEMPTS {
            M::Dead
        } else if delay == 0 {
            M::Ready
        } else {
            M::Scheduled { at: now + delay }
        };
    }

    /// What the engine's timers do at `now`: due tasks become ready, leases lapse.
    fn tick(&mut self) {
        for i in 0..self.tasks.len() {
            match self.tasks[i].state {
                M::Scheduled { at } if at <= self.now => self.tasks[i].state = M::Ready,
                M::Leased { expires, .. } if expires <= self.now => self.fail(i, 0),
                _ => {}
            }
        }
    }

    fn counts(&self) -> [u64; 7] {
        let mut c = [0u64; 7];
        for t in &self.tasks {
            let slot = match t.state {
                M::Scheduled { .. } => 0,
                M::Ready => 1,
                M::Leased { .. } => 2,
                M::Done => 3,
                M::Dead => 4,
                M::Cancelled => 5,
            };
            c[slot] += 1;
        }
        c
    }
}

/// What a task looks like apart from its lease deadline (which a restart may move).
fn durable_view(h: &mut Harness, id: &str) -> String {
    let mut t = h.task(id);
    if let Some(lease) = t.lease.as_mut() {
        lease.expires_ms = 0;
    }
    format!("{t:?}")
}

/// A settle step: sends `req` for claim `(i, epoch)`; a current claim must be
/// accepted (and `apply` updates the model), any other refused with `lease_lost`.
fn settle(
    h: &mut Harness,
    m: &mut Model,
    claim: (usize, u64),
    req: EngineRequest,
) -> Option<Reply> {
    let (i, epoch) = claim;
    if m.current(i) == Some(epoch) {
        Some(
            h.call(req)
                .unwrap_or_else(|e| panic!("current claim refused: {e}")),
        )
    } else {
        let before = durable_view(h, &m.tasks[i].id);
        assert_eq!(h.code(req), ErrorCode::LeaseLost, "stale claim {claim:?}");
        assert_eq!(
            durable_view(h, &m.tasks[i].id),
            before,
            "a refused settle changed the task"
        );
        None
    }
}

fn settled_state(reply: Option<Reply>) -> Option<TaskState> {
    match reply? {
        Reply::Settle(s) => Some(s.state),
        other => panic!("settle reply: {other:?}"),
    }
}

fn run(steps: &[Step]) {
    let mut h = Harness::new();
    h.create(
        "q",
        QueuePatch {
            lease_ms: Some(LEASE_MS),
            max_attempts: Some(MAX_ATTEMPTS as u32),
            ..QueuePatch::default()
        },
    );
    let mut m = Model {
        now: h.now.wall_ms,
        max_runtime: None,
        tasks: Vec::new(),
        claims: Vec::new(),
        acked: HashSet::new(),
    };
    let mut failures_before: Vec<u64> = Vec::new();
    for (n, s) in steps.iter().enumerate() {
        let mut redriven = HashSet::new();
        // A step picking a claim or a task when there is none does nothing.
        let claim = |pick: usize| (!m.claims.is_empty()).then(|| m.claims[pick % m.claims.len()]);
        let task = |pick: usize| (!m.tasks.is_empty()).then(|| pick % m.tasks.len());
        match *s {
            Step::Enqueue { delay } => {
                let mut t = muster_protocol::model::NewTask::new(super::raw(&n.to_string()));
                t.delay_ms = delay.then_some(500);
                let id = h.enqueue_task("q", t);
                m.tasks.push(ModelTask {
                    id,
                    state: if delay {
                        M::Scheduled { at: m.now + 500 }
                    } else {
                        M::Ready
                    },
                    deliveries: 0,
                    failures: 0,
                    cancel_requested: false,
                });
            }
            Step::Claim { max } => {
                let got = match h.call(EngineRequest::Claim(
                    Claim::new(["q"]).max(max).member("m1"),
                )) {
                    Ok(Reply::Claim(r)) => r.tasks,
                    other => panic!("claim: {other:?}"),
                };
                // Without priorities or keys, the oldest ready tasks go first.
                let want: Vec<usize> = (0..m.tasks.len())
                    .filter(|&i| m.tasks[i].state == M::Ready)
                    .take(max as usize)
                    .collect();
                let got_ids: Vec<&str> = got.iter().map(|d| d.id.as_str()).collect();
                let want_ids: Vec<&str> = want.iter().map(|&i| m.tasks[i].id.as_str()).collect();
                assert_eq!(got_ids, want_ids, "step {n}: claim");
                for (d, i) in got.iter().zip(want) {
                    assert!(
                        !m.acked.contains(&d.id),
                        "acked task {} delivered again",
                        d.id
                    );
                    let t = &mut m.tasks[i];
                    t.deliveries += 1;
                    assert_eq!((d.epoch, d.attempt), (t.deliveries, t.deliveries));
                    assert_eq!(d.failures, t.failures);
                    let expires =
                        (m.now + LEASE_MS).min(m.max_runtime.map_or(u64::MAX, |max| m.now + max));
                    t.state = M::Leased {
                        epoch: d.epoch,
                        expires,
                        granted: m.now,
                    };
                    m.claims.push((i, d.epoch));
                }
            }
            Step::Renew { pick } => {
                let Some((i, epoch)) = claim(pick) else {
                    continue;
                };
                let id = m.tasks[i].id.clone();
                if let M::Leased { granted, .. } = m.tasks[i].state
                    && m.current(i) == Some(epoch)
                    && m.cap(granted) <= m.now
                {
                    // At its runtime cap the renewal is refused and the lease ends now.
                    assert_eq!(h.code(renew(&id, epoch)), ErrorCode::LeaseLost, "step {n}");
                    m.fail(i, 0);
                } else if let Some(reply) = settle(&mut h, &mut m, (i, epoch), renew(&id, epoch)) {
                    let Reply::Renew(r) = reply else {
                        panic!("renew reply: {reply:?}")
                    };
                    let M::Leased { granted, .. } = m.tasks[i].state else {
                        panic!("a renewed task is leased")
                    };
                    let expires = (m.now + LEASE_MS).min(m.cap(granted));
                    assert_eq!(r.lease_expires_ms, expires, "step {n}: renew");
                    assert_eq!(r.cancel_requested, m.tasks[i].cancel_requested);
                    m.tasks[i].state = M::Leased {
                        epoch,
                        expires,
                        granted,
                    };
                }
            }
            Step::Ack { pick } => {
                let Some((i, epoch)) = claim(pick) else {
                    continue;
                };
                let id = m.tasks[i].id.clone();
                let reply = settle(&mut h, &mut m, (i, epoch), ack(&id, epoch));
                if let Some(state) = settled_state(reply) {
                    m.end(i, M::Done);
                    assert_eq!(state, m.tasks[i].state.state());
                    m.acked.insert(id);
                }
            }
            Step::Nack { pick, delay } => {
                let Some((i, epoch)) = claim(pick) else {
                    continue;
                };
                let id = m.tasks[i].id.clone();
                let delay_ms = if delay { NACK_DELAY_MS } else { 0 };
                let reply = settle(&mut h, &mut m, (i, epoch), nack(&id, epoch, Some(delay_ms)));
                if let Some(state) = settled_state(reply) {
                    m.fail(i, delay_ms);
                    assert_eq!(state, m.tasks[i].state.state());
                }
            }
            Step::Release { pick } => {
                let Some((i, epoch)) = claim(pick) else {
                    continue;
                };
                let id = m.tasks[i].id.clone();
                let reply = settle(&mut h, &mut m, (i, epoch), release(&id, epoch));
                if let Some(state) = settled_state(reply) {
                    m.end(i, M::Ready);
                    assert_eq!(state, m.tasks[i].state.state());
                }
            }
            Step::DeadLetter { pick } => {
                let Some((i, epoch)) = claim(pick) else {
                    continue;
                };
                let id = m.tasks[i].id.clone();
                let reply = settle(&mut h, &mut m, (i, epoch), dead_letter(&id, epoch));
                if let Some(state) = settled_state(reply) {
                    m.end(i, M::Dead);
                    assert_eq!(state, m.tasks[i].state.state());
                }
            }
            Step::Advance { ms } => {
                h.advance(ms);
                m.now += ms;
                m.tick();
            }
            Step::Cancel { pick } => {
                let Some(i) = task(pick) else { continue };
                let req = EngineRequest::Cancel(Cancel {
                    task: m.tasks[i].id.clone(),
                    if_state: None,
                });
                match m.tasks[i].state {
                    M::Done | M::Dead => assert_eq!(h.code(req), ErrorCode::InvalidState),
                    state => {
                        let Ok(Reply::Cancel(r)) = h.call(req) else {
                            panic!("cancel refused")
                        };
                        let t = &mut m.tasks[i];
                        match state {
                            M::Leased { .. } => t.cancel_requested = true,
                            _ => t.state = M::Cancelled,
                        }
                        let pending = t.cancel_requested && t.state.state() == TaskState::Leased;
                        assert_eq!((r.state, r.cancel_requested), (t.state.state(), pending));
                    }
                }
            }
            Step::Redrive { pick } => {
                let Some(i) = task(pick) else { continue };
                let req = EngineRequest::Redrive(Redrive(DeadSelection {
                    queue: "q".into(),
                    ids: vec![m.tasks[i].id.clone()],
                    all: false,
                    dry_run: false,
                }));
                if m.tasks[i].state == M::Dead {
                    let Ok(Reply::Count(r)) = h.call(req) else {
                        panic!("redrive refused")
                    };
                    assert_eq!(r.count, 1);
                    let t = &mut m.tasks[i];
                    t.state = M::Ready;
                    t.failures = 0;
                    redriven.insert(i);
                } else {
                    assert_eq!(h.code(req), ErrorCode::InvalidState);
                }
            }
            Step::Restart { gap_ms } => {
                let before: Vec<String> = m
                    .tasks
                    .iter()
                    .map(|t| durable_view(&mut h, &t.id))
                    .collect();
                h.restart(gap_ms);
                m.now += gap_ms;
                // Every lease held gets at least a full period from the restart, within
                // its runtime cap (a cap passed while down ends it at once).
                let (now, max_runtime) = (m.now, m.max_runtime);
                for t in &mut m.tasks {
                    if let M::Leased {
                        epoch,
                        expires,
                        granted,
                    } = t.state
                    {
                        let left = expires.saturating_sub(now);
                        let cap = max_runtime.map_or(u64::MAX, |max| granted + max);
                        t.state = M::Leased {
                            epoch,
                            expires: (now + left.max(LEASE_MS)).min(cap.max(now)),
                            granted,
                        };
                    }
                }
                // The first round after the restart runs the timers: tasks due while
                // the daemon was down become ready. Nothing else may change.
                let states: Vec<M> = m.tasks.iter().map(|t| t.state).collect();
                h.round();
                m.tick();
                for (i, t) in m.tasks.iter().enumerate() {
                    if t.state == states[i] {
                        assert_eq!(
                            durable_view(&mut h, &t.id),
                            before[i],
                            "step {n}: a restart changed task {i}"
                        );
                    }
                }
            }
            Step::MaxRuntime { ms } => {
                h.call(EngineRequest::QueueUpdate(QueueUpdate {
                    queue: "q".into(),
                    options: QueuePatch {
                        max_runtime_ms: Some(ms.unwrap_or(0)),
                        ..QueuePatch::default()
                    },
                }))
                .unwrap_or_else(|e| panic!("step {n}: max_runtime update refused: {e}"));
                let lowered = ms.unwrap_or(u64::MAX) < m.max_runtime.unwrap_or(u64::MAX);
                m.max_runtime = ms;
                if lowered {
                    // Running leases end at their new cap; those past it lapse this round.
                    let max_runtime = m.max_runtime;
                    for t in &mut m.tasks {
                        if let M::Leased {
                            epoch,
                            expires,
                            granted,
                        } = t.state
                        {
                            let cap = max_runtime.map_or(u64::MAX, |max| granted + max);
                            t.state = M::Leased {
                                epoch,
                                expires: expires.min(cap),
                                granted,
                            };
                        }
                    }
                    m.tick();
                }
            }
        }
        assert_eq!(h.counts("q"), m.counts(), "step {n}: {s:?}");
        for (i, t) in m.tasks.iter().enumerate() {
            let got = h.task(&t.id);
            let lease = got.lease.as_ref().map(|l| (l.epoch, l.expires_ms));
            let want_lease = match t.state {
                M::Leased { epoch, expires, .. } => Some((epoch, expires)),
                _ => None,
            };
            assert_eq!(
                (
                    got.state,
                    got.deliveries,
                    got.failures,
                    got.cancel_requested,
                    lease
                ),
                (
                    t.state.state(),
                    t.deliveries,
                    t.failures,
                    t.cancel_requested,
                    want_lease
                ),
                "step {n} ({s:?}): task {i}"
            );
            match failures_before.get(i) {
                Some(&f) if !redriven.contains(&i) => {
                    assert!(t.failures >= f, "step {n}: failures of task {i} went down");
                }
                _ => {}
            }
        }
        failures_before = m.tasks.iter().map(|t| t.failures).collect();
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn the_task_life_cycle_matches_the_model_across_restarts(steps in proptest::collection::vec(step(), 1..50)) {
        run(&steps);
    }
}

/// A step of one member's life, for [`run_member`].
#[derive(Debug, Clone)]
enum MemberStep {
    /// A session opens on a new connection (resuming what the member holds) with
    /// these labels and capacity; a session still open is replaced. With `forget`, the
    /// agent names every lease it holds but one (its grant never reached it), which
    /// the daemon hands over again with a new epoch.
    Open {
        gpu: bool,
        capacity: u32,
        forget: Option<usize>,
    },
    /// The session's connection ends.
    Disconnect,
    /// A task is enqueued and the session claims one (when it has a session).
    Claim,
    /// A lease the member was handed is renewed, from another connection.
    Renew {
        pick: usize,
    },
    /// A task the member was handed is cancelled.
    Cancel {
        pick: usize,
    },
    /// A lease the member was handed is acked, from another connection.
    Ack {
        pick: usize,
    },
    Advance {
        ms: u64,
    },
}

fn member_step() -> impl Strategy<Value = MemberStep> {
    prop_oneof![
        2 => (any::<bool>(), 1u32..5, proptest::option::of(any::<usize>()))
            .prop_map(|(gpu, capacity, forget)| MemberStep::Open { gpu, capacity, forget }),
        2 => Just(MemberStep::Disconnect),
        4 => Just(MemberStep::Claim),
        3 => any::<usize>().prop_map(|pick| MemberStep::Renew { pick }),
        2 => any::<usize>().prop_map(|pick| MemberStep::Cancel { pick }),
        2 => any::<usize>().prop_map(|pick| MemberStep::Ack { pick }),
        2 => (1u64..1500).prop_map(|ms| MemberStep::Advance { ms }),
    ]
}

/// One member's record across its sessions and leases, against a model: after every
/// step the member is listed exactly while it has a session or holds a lease, with the
/// labels and capacity of its last session, the leases the model says it holds, and a
/// last-seen time once it ever had a session. A renewal, a cancel or an ack of a lease
/// of a member without a session must not wipe (or drop too early) its record.
fn run_member(steps: &[MemberStep]) {
    let mut h = Harness::new();
    h.create(
        "q",
        QueuePatch {
            lease_ms: Some(LEASE_MS),
            ..QueuePatch::default()
        },
    );
    // The session's connection, if one is open; connections are never reused.
    let mut session: Option<u64> = None;
    let mut next_connection = 1;
    // The last session's labels and capacity.
    let mut last: Option<(Vec<String>, u32)> = None;
    // Leases the member holds: task, epoch, monotonic deadline.
    let mut leases: Vec<(String, u64, u64)> = Vec::new();
    // Every lease ever handed out, for renewals and acks of stale ones.
    let mut handed: Vec<(String, u64)> = Vec::new();
    // Tasks whose cancel was asked while leased.
    let mut cancelled: Vec<String> = Vec::new();
    for (n, s) in steps.iter().enumerate() {
        let now = h.now.mono_ms;
        match *s {
            MemberStep::Open {
                gpu,
                capacity,
                forget,
            } => {
                let labels: Vec<String> = if gpu { vec!["gpu".into()] } else { Vec::new() };
                let connection = next_connection;
                next_connection += 1;
                let forgotten = forget
                    .filter(|_| !leases.is_empty())
                    .map(|pick| pick % leases.len());
                let held = forget.map(|_| {
                    (leases.iter().enumerate())
                        .filter(|(i, _)| Some(*i) != forgotten)
                        .map(|(_, l)| muster_protocol::ops::LeaseRef {
                            task: l.0.clone(),
                            epoch: l.1,
                        })
                        .collect()
                });
                // No failure is counted for a lease the agent never heard of.
                let failures = forgotten.map(|i| h.state(&leases[i].0).2);
                let reply = h.call_on(
                    connection,
                    EngineRequest::SessionOpen(muster_protocol::ops::SessionOpen {
                        member: "m1".into(),
                        labels: labels.clone(),
                        capacity,
                        reclaim: false,
                        resume: true,
                        held,
                        liveness_ms: None,
                    }),
                );
                let r = match reply {
                    Ok(Reply::SessionOpen(r)) => r,
                    other => panic!("step {n}: session_open: {other:?}"),
                };
                let kept = leases.len() - usize::from(forgotten.is_some());
                assert_eq!(r.kept as usize, kept, "step {n}: kept");
                let again: Vec<_> = r
                    .reclaimed
                    .iter()
                    .map(|d| (d.id.clone(), d.epoch, d.failures))
                    .collect();
                match forgotten {
                    // Cancel asked: the forgotten lease ends, and the task with it.
                    Some(i) if cancelled.contains(&leases[i].0) => {
                        assert_eq!((again.len(), r.released), (0, 1), "step {n}");
                        leases.remove(i);
                    }
                    Some(i) => {
                        let (id, epoch, _) = leases[i].clone();
                        let expected = vec![(id.clone(), epoch + 1, failures.unwrap_or_default())];
                        assert_eq!((again, r.released), (expected, 0), "step {n}");
                        leases[i] = (id.clone(), epoch + 1, now + LEASE_MS);
                        handed.push((id, epoch + 1));
                    }
                    None => assert_eq!((again.len(), r.released), (0, 0), "step {n}"),
                }
                if let Some(old) = session.replace(connection) {
                    // The replaced session's connection goes on; its end changes nothing.
                    h.engine().disconnected(old);
                }
                last = Some((labels, capacity));
            }
            MemberStep::Disconnect => {
                if let Some(connection) = session.take() {
                    h.engine().disconnected(connection);
                    h.round();
                }
            }
            MemberStep::Claim => {
                let Some(connection) = session else { continue };
                h.enqueue("q", &n.to_string());
                let got = match h.call_on(
                    connection,
                    EngineRequest::Claim(Claim::new(["q"]).max(1).member("m1")),
                ) {
                    Ok(Reply::Claim(r)) => r.tasks,
                    other => panic!("step {n}: claim: {other:?}"),
                };
                assert_eq!(got.len(), 1, "step {n}: a ready task is there to claim");
                let d = &got[0];
                leases.push((d.id.clone(), d.epoch, now + LEASE_MS));
                handed.push((d.id.clone(), d.epoch));
            }
            MemberStep::Renew { pick } => {
                if handed.is_empty() {
                    continue;
                }
                let (id, epoch) = handed[pick % handed.len()].clone();
                let held = leases.iter().position(|l| l.0 == id && l.1 == epoch);
                match held {
                    Some(i) => {
                        h.call(renew(&id, epoch))
                            .unwrap_or_else(|e| panic!("step {n}: renewal refused: {e}"));
                        leases[i].2 = now + LEASE_MS;
                    }
                    None => assert_eq!(h.code(renew(&id, epoch)), ErrorCode::LeaseLost),
                }
            }
            MemberStep::Cancel { pick } => {
                if leases.is_empty() {
                    continue;
                }
                let id = leases[pick % leases.len()].0.clone();
                // A leased task's cancel is a request to its holder: the lease stays.
                h.call(EngineRequest::Cancel(Cancel {
                    task: id.clone(),
                    if_state: None,
                }))
                .unwrap_or_else(|e| panic!("step {n}: cancel refused: {e}"));
                cancelled.push(id);
            }
            MemberStep::Ack { pick } => {
                if handed.is_empty() {
                    continue;
                }
                let (id, epoch) = handed[pick % handed.len()].clone();
                match leases.iter().position(|l| l.0 == id && l.1 == epoch) {
                    Some(i) => {
                        h.call(ack(&id, epoch))
                            .unwrap_or_else(|e| panic!("step {n}: ack refused: {e}"));
                        leases.remove(i);
                    }
                    None => assert_eq!(h.code(ack(&id, epoch)), ErrorCode::LeaseLost),
                }
            }
            MemberStep::Advance { ms } => {
                h.advance(ms);
                let now = h.now.mono_ms;
                leases.retain(|l| l.2 > now);
            }
        }
        let listed = session.is_some() || !leases.is_empty();
        let describe = EngineRequest::MemberDescribe(muster_protocol::ops::MemberDescribe(
            muster_protocol::ops::MemberName {
                member: "m1".into(),
            },
        ));
        if !listed {
            assert_eq!(h.code(describe), ErrorCode::NotFound, "step {n} ({s:?})");
            continue;
        }
        let info = super::member_info(&mut h, "m1");
        let (labels, capacity) = last.clone().expect("a listed member had a session");
        assert_eq!(
            (
                info.labels,
                info.capacity,
                info.leased,
                info.state == MemberState::Gone,
                info.last_seen_ms.is_some()
            ),
            (
                labels,
                capacity,
                leases.len() as u64,
                session.is_none(),
                true
            ),
            "step {n} ({s:?})"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn a_members_record_matches_the_model_across_its_sessions_and_last_lease(steps in proptest::collection::vec(member_step(), 1..40)) {
        run_member(&steps);
    }
}
