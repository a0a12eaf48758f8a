//! The dispatch rules against a reference model, by property-based testing.
//!
//! Random enqueues (priorities, keys, required labels, delays), claims by members with
//! random labels, acks, nacks, lapses, operators' updates (a new priority, run now),
//! suspends (some with a timeout that resumes), resumes with any token ever issued
//! (stale ones included), spawns of children (some waiting for them, some spawning keys
//! spawned before) and cancels of any task (cascading to its unfinished descendants),
//! emits of output (some repeating chunks sent before, some by a holder whose lease
//! moved on) and follows from any number, with time driven by the test. The model is the rules of PROTOCOL.md §4.12 and §4.17
//! written as plainly as possible (a scan of every task); the engine must hand out
//! exactly the task the model picks, and agree on every count. No resume applies twice
//! or to a later suspension, no waiting parent is ready while a child is unfinished,
//! and no suspend, spawn or emit spends an attempt (failures and deliveries are compared
//! per task); each task's output is exactly the chunks its holders emitted, each once, in
//! order, and a follow ends exactly when the task has finished.

use proptest::prelude::*;

use muster_protocol::ErrorCode;
use muster_protocol::limits::MAX_DEPTH;
use muster_protocol::model::{Chunk, NewTask, OnTimeout, QueuePatch, TaskState};
use muster_protocol::ops::EngineRequest;
use muster_protocol::ops::{
    Ack, Cancel, Claim, Emit, Enqueue, Follow, Nack, NewChild, Resume, Spawn, SpawnWait, Suspend,
    TaskUpdate,
};

use super::{Harness, raw};
use crate::engine::Reply;

const LEASE_MS: u64 = 1000;
const MAX_ATTEMPTS: u64 = 3;
const LABELS: [&str; 2] = ["a", "b"];

#[derive(Debug, Clone)]
enum Step {
    Enqueue {
        priority: u8,
        key: Option<u8>,
        requires: u8,
        delay: bool,
    },
    Claim {
        labels: u8,
    },
    Ack {
        pick: usize,
    },
    Nack {
        pick: usize,
        delay: bool,
    },
    Advance {
        ms: u64,
    },
    Update {
        pick: usize,
        priority: Option<u8>,
        run_now: bool,
    },
    Suspend {
        pick: usize,
        timeout: bool,
    },
    Resume {
        pick: usize,
    },
    Cancel {
        pick: usize,
    },
    Spawn {
        pick: usize,
        count: usize,
        wait: bool,
        timeout: bool,
        fresh: bool,
    },
    /// An emit of `count` chunks to any task: its holder's (repeating the last `back`
    /// chunks it sent, as after a lost reply), or a stale one's (under its last epoch).
    Emit {
        pick: usize,
        count: usize,
        back: usize,
    },
    Follow {
        pick: usize,
        from: usize,
    },
}

/// Children's priority: the highest enqueues use.
const CHILD_PRIORITY: u8 = 2;

/// How long a suspension with a timeout waits in the model; its timeout resumes.
const SUSPEND_MS: u64 = 900;
/// The timeout of the others: past any run.
const SUSPEND_LONG_MS: u64 = 3_600_000;

/// Steps of families only: enqueues, claims, acks and nacks, lapses, spawns, cancels.
fn family_step() -> impl Strategy<Value = Step> {
    prop_oneof![
        2 => Just(Step::Enqueue { priority: 0, key: None, requires: 0, delay: false }),
        5 => Just(Step::Claim { labels: 0 }),
        4 => any::<usize>().prop_map(|pick| Step::Ack { pick }),
        1 => (any::<usize>(), any::<bool>()).prop_map(|(pick, delay)| Step::Nack { pick, delay }),
        1 => (1u64..1500).prop_map(|ms| Step::Advance { ms }),
        1 => any::<usize>().prop_map(|pick| Step::Cancel { pick }),
        1 => any::<usize>().prop_map(|pick| Step::Resume { pick }),
        4 => (any::<usize>(), 0usize..3, any::<bool>(), proptest::bool::weighted(0.1), any::<bool>())
            .prop_map(|(pick, count, wait, timeout, fresh)| Step::Spawn {
                pick,
                count,
                wait: wait || count == 0,
                timeout,
                fresh,
            }),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0u8..3, proptest::option::of(0u8..3), 0u8..4, any::<bool>())
            .prop_map(|(priority, key, requires, delay)| Step::Enqueue { priority, key, requires, delay }),
        4 => (0u8..4).prop_map(|labels| Step::Claim { labels }),
        2 => any::<usize>().prop_map(|pick| Step::Ack { pick }),
        2 => (any::<usize>(), any::<bool>()).prop_map(|(pick, delay)| Step::Nack { pick, delay }),
        2 => (1u64..1500).prop_map(|ms| Step::Advance { ms }),
        2 => (any::<usize>(), proptest::option::of(0u8..3), any::<bool>())
            .prop_map(|(pick, priority, run_now)| Step::Update {
                pick,
                // At least one change.
                run_now: run_now || priority.is_none(),
                priority,
            }),
        2 => (any::<usize>(), any::<bool>()).prop_map(|(pick, timeout)| Step::Suspend { pick, timeout }),
        2 => any::<usize>().prop_map(|pick| Step::Resume { pick }),
        1 => any::<usize>().prop_map(|pick| Step::Cancel { pick }),
        2 => (any::<usize>(), 1usize..4, 0usize..3)
            .prop_map(|(pick, count, back)| Step::Emit { pick, count, back }),
        1 => (any::<usize>(), any::<usize>()).prop_map(|(pick, from)| Step::Follow { pick, from }),
        3 => (any::<usize>(), 0usize..3, any::<bool>(), proptest::bool::weighted(0.2), any::<bool>())
            .prop_map(|(pick, count, wait, timeout, fresh)| Step::Spawn {
                pick,
                count,
                // A spawn names children, or waits, or both.
                wait: wait || count == 0,
                timeout,
                fresh,
            }),
    ]
}

fn label_set(bits: u8) -> Vec<String> {
    LABELS
        .iter()
        .enumerate()
        .filter(|(i, _)| bits & (1 << i) != 0)
        .map(|(_, l)| (*l).to_owned())
        .collect()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum M {
    Scheduled(u64),
    Ready,
    Leased(u64, u64),
    Done,
    Dead,
    /// Until the wall time its timeout resumes it, under the epoch it was suspended at.
    Suspended(u64, u64),
    Cancelled,
}

#[derive(Debug)]
struct ModelTask {
    id: String,
    priority: u8,
    key: Option<u8>,
    requires: Vec<String>,
    state: M,
    failures: u64,
    deliveries: u64,
    /// A cancel is pending (while leased).
    cancel_requested: bool,
    /// Its parent, and its depth (0 for no child).
    parent: Option<usize>,
    depth: u8,
    /// Its children by key, in the order spawned.
    children: Vec<(String, usize)>,
    /// Its suspension waits for its children.
    waits: bool,
    /// Every chunk of output its holders emitted, in order.
    output: Vec<String>,
}

impl ModelTask {
    fn new(id: String, priority: u8, key: Option<u8>, requires: Vec<String>, state: M) -> Self {
        ModelTask {
            id,
            priority,
            key,
            requires,
            state,
            failures: 0,
            deliveries: 0,
            cancel_requested: false,
            parent: None,
            depth: 0,
            children: Vec::new(),
            waits: false,
            output: Vec::new(),
        }
    }
}

#[derive(Default)]
struct Model {
    now: u64,
    tasks: Vec<ModelTask>,
    /// Every resume token issued: the task, the epoch it names, the token.
    tokens: Vec<(usize, u64, String)>,
}

impl Model {
    fn in_line(s: M) -> bool {
        matches!(
            s,
            M::Scheduled(_) | M::Ready | M::Leased(..) | M::Suspended(..)
        )
    }

    /// The task a claimer with `labels` gets: the best ready task it may take.
    fn pick(&self, labels: &[String], key_concurrency: usize) -> Option<usize> {
        let eligible = |i: usize| {
            let t = &self.tasks[i];
            let key_ok = match t.key {
                None => true,
                Some(k) => {
                    let place = self.tasks[..i]
                        .iter()
                        .filter(|o| o.key == Some(k) && Self::in_line(o.state))
                        .count();
                    place < key_concurrency
                }
            };
            t.state == M::Ready && t.requires.iter().all(|r| labels.contains(r)) && key_ok
        };
        (0..self.tasks.len())
            .filter(|&i| eligible(i))
            .min_by_key(|&i| (std::cmp::Reverse(self.tasks[i].priority), i))
    }

    fn fail(&mut self, i: usize, delay: u64) {
        let t = &mut self.tasks[i];
        if t.cancel_requested {
            // A pending cancel ends it, no failure counted.
            t.state = M::Cancelled;
            return;
        }
        t.failures += 1;
        t.state = if t.failures >= MAX_ATTEMPTS {
            M::Dead
        } else if delay == 0 {
            M::Ready
        } else {
            M::Scheduled(self.now + delay)
        };
    }

    fn advance(&mut self, ms: u64) {
        self.now += ms;
        for i in 0..self.tasks.len() {
            match self.tasks[i].state {
                M::Scheduled(at) if at <= self.now => self.tasks[i].state = M::Ready,
                M::Leased(deadline, _) if deadline <= self.now => self.fail(i, 0),
                M::Suspended(at, _) if at <= self.now => {
                    self.tasks[i].state = M::Ready;
                    self.tasks[i].waits = false;
                }
                _ => {}
            }
        }
    }

    fn finished(s: M) -> bool {
        matches!(s, M::Done | M::Dead | M::Cancelled)
    }

    /// Every unfinished descendant of `i` is cancelled, or asked to be when leased.
    fn cascade(&mut self, i: usize) {
        for c in self.tasks[i]
            .children
            .iter()
            .map(|c| c.1)
            .collect::<Vec<_>>()
        {
            match self.tasks[c].state {
                M::Done | M::Dead | M::Cancelled => continue,
                M::Leased(..) => self.tasks[c].cancel_requested = true,
                _ => {
                    self.tasks[c].state = M::Cancelled;
                    self.tasks[c].waits = false;
                }
            }
            self.cascade(c);
        }
    }

    /// Wakes every parent waiting for children that have all finished.
    fn fan_in(&mut self) {
        for i in 0..self.tasks.len() {
            let t = &self.tasks[i];
            if matches!(t.state, M::Suspended(..))
                && t.waits
                && t.children
                    .iter()
                    .all(|c| Self::finished(self.tasks[c.1].state))
            {
                self.tasks[i].state = M::Ready;
                self.tasks[i].waits = false;
                eprintln!("FANIN");
            }
        }
    }

    /// No waiting parent is ready while a child is unfinished (it is suspended).
    fn check_families(&self) {
        for t in &self.tasks {
            if t.waits {
                assert!(
                    matches!(t.state, M::Suspended(..)),
                    "{}: waits, suspended",
                    t.id
                );
                assert!(
                    t.children
                        .iter()
                        .any(|c| !Self::finished(self.tasks[c.1].state)),
                    "{}: waits with every child finished",
                    t.id
                );
            }
        }
    }

    /// The `pick`-th leased task (modulo their number) and its lease's epoch, if any.
    fn pick_leased(&self, pick: usize) -> Option<(usize, u64)> {
        let held: Vec<usize> = (0..self.tasks.len())
            .filter(|&i| matches!(self.tasks[i].state, M::Leased(..)))
            .collect();
        let i = *held.get(pick % held.len().max(1))?;
        let M::Leased(_, epoch) = self.tasks[i].state else {
            unreachable!("task {i} was picked as leased")
        };
        Some((i, epoch))
    }

    fn counts(&self) -> [u64; 7] {
        let mut c = [0u64; 7];
        for t in &self.tasks {
            let slot = match t.state {
                M::Scheduled(_) => 0,
                M::Ready => 1,
                M::Leased(..) => 2,
                M::Done => 3,
                M::Dead => 4,
                M::Cancelled => 5,
                M::Suspended(..) => 6,
            };
            c[slot] += 1;
        }
        c
    }
}

fn run(steps: &[Step], key_concurrency: u32) {
    let mut h = Harness::new();
    let patch = QueuePatch {
        lease_ms: Some(LEASE_MS),
        max_attempts: Some(MAX_ATTEMPTS as u32),
        key_concurrency: Some(key_concurrency),
        ..QueuePatch::default()
    };
    h.create("q", patch);
    let mut m = Model::default();
    for (n, s) in steps.iter().enumerate() {
        // A step that changes nothing ends early; every step ends with the fan-in.
        'step: {
            match *s {
                Step::Enqueue {
                    priority,
                    key,
                    requires,
                    delay,
                } => {
                    let mut task = NewTask::new(raw(&n.to_string()));
                    task.priority = Some(priority);
                    task.key = key.map(|k| format!("k{k}"));
                    task.requires = label_set(requires);
                    task.delay_ms = delay.then_some(500);
                    let reply = h.call(EngineRequest::Enqueue(Enqueue {
                        queue: "q".into(),
                        tasks: vec![task],
                    }));
                    let id = match reply {
                        Ok(Reply::Enqueue(r)) => r.tasks[0].id.clone(),
                        other => panic!("enqueue: {other:?}"),
                    };
                    let state = if delay {
                        M::Scheduled(m.now + 500)
                    } else {
                        M::Ready
                    };
                    m.tasks.push(ModelTask::new(
                        id,
                        priority,
                        key,
                        label_set(requires),
                        state,
                    ));
                }
                Step::Claim { labels } => {
                    let want = m.pick(&label_set(labels), key_concurrency as usize);
                    let claim = Claim::new(["q"]).labels(label_set(labels));
                    let got = match h.call(EngineRequest::Claim(claim)) {
                        Ok(Reply::Claim(c)) => c.tasks.into_iter().map(|d| (d.id, d.epoch)).next(),
                        other => panic!("claim: {other:?}"),
                    };
                    assert_eq!(
                        got.as_ref().map(|g| g.0.clone()),
                        want.map(|i| m.tasks[i].id.clone()),
                        "step {n}: claim with labels {:?}",
                        label_set(labels)
                    );
                    if let (Some(i), Some((_, epoch))) = (want, got) {
                        m.tasks[i].deliveries += 1;
                        assert_eq!(epoch, m.tasks[i].deliveries);
                        m.tasks[i].state = M::Leased(m.now + LEASE_MS, epoch);
                    }
                }
                Step::Ack { pick } => {
                    let Some((i, epoch)) = m.pick_leased(pick) else {
                        break 'step;
                    };
                    h.call(EngineRequest::Ack(Ack {
                        task: m.tasks[i].id.clone(),
                        epoch,
                        result: None,
                    }))
                    .unwrap();
                    m.tasks[i].state = if m.tasks[i].cancel_requested {
                        M::Cancelled
                    } else {
                        M::Done
                    };
                }
                Step::Nack { pick, delay } => {
                    let Some((i, epoch)) = m.pick_leased(pick) else {
                        break 'step;
                    };
                    let delay_ms = if delay { 700 } else { 0 };
                    let req = Nack {
                        task: m.tasks[i].id.clone(),
                        epoch,
                        delay_ms: Some(delay_ms),
                        error: None,
                    };
                    h.call(EngineRequest::Nack(req)).unwrap();
                    m.fail(i, delay_ms);
                }
                Step::Advance { ms } => {
                    h.advance(ms);
                    m.advance(ms);
                }
                Step::Suspend { pick, timeout } => {
                    let Some((i, epoch)) = m.pick_leased(pick) else {
                        break 'step;
                    };
                    let wait = if timeout { SUSPEND_MS } else { SUSPEND_LONG_MS };
                    let reply = h.call(EngineRequest::Suspend(Suspend {
                        task: m.tasks[i].id.clone(),
                        epoch,
                        reason: format!("step {n}"),
                        timeout_ms: Some(wait),
                        on_timeout: Some(OnTimeout::Resume),
                    }));
                    let reply = match reply {
                        Ok(Reply::Suspend(r)) => r,
                        other => panic!("step {n}: suspend: {other:?}"),
                    };
                    if m.tasks[i].cancel_requested {
                        assert_eq!(reply.state, TaskState::Cancelled, "step {n}");
                        m.tasks[i].state = M::Cancelled;
                        break 'step;
                    }
                    m.tasks[i].state = M::Suspended(m.now + wait, epoch);
                    m.tokens
                        .push((i, epoch, reply.resume_token.expect("a token")));
                }
                Step::Resume { pick } => {
                    if m.tokens.is_empty() {
                        break 'step;
                    }
                    let (i, epoch, token) = m.tokens[pick % m.tokens.len()].clone();
                    let reply = h.call(EngineRequest::Resume(Resume {
                        token: Some(token),
                        task: None,
                        data: None,
                    }));
                    // A token resumes its own suspension, once; any other use is stale.
                    if matches!(m.tasks[i].state, M::Suspended(_, e) if e == epoch) {
                        match reply {
                            Ok(Reply::Resume(r)) => {
                                assert_eq!(r.state, TaskState::Ready, "step {n}")
                            }
                            other => panic!("step {n}: resume: {other:?}"),
                        }
                        m.tasks[i].state = M::Ready;
                        m.tasks[i].waits = false;
                    } else {
                        match reply {
                            Err(e) => assert_eq!(e.code, ErrorCode::StaleToken, "step {n}"),
                            other => panic!("step {n}: a stale resume: {other:?}"),
                        }
                    }
                }
                Step::Cancel { pick } => {
                    if m.tasks.is_empty() {
                        break 'step;
                    }
                    let i = pick % m.tasks.len();
                    let reply = h.call(EngineRequest::Cancel(Cancel {
                        task: m.tasks[i].id.clone(),
                        if_state: None,
                    }));
                    match m.tasks[i].state {
                        M::Done | M::Dead => {
                            assert_eq!(
                                reply.unwrap_err().code,
                                ErrorCode::InvalidState,
                                "step {n}"
                            );
                            break 'step;
                        }
                        M::Cancelled => {}
                        M::Leased(..) => m.tasks[i].cancel_requested = true,
                        _ => {
                            m.tasks[i].state = M::Cancelled;
                            m.tasks[i].waits = false;
                        }
                    }
                    reply.unwrap();
                    m.cascade(i);
                }
                Step::Spawn {
                    pick,
                    count,
                    wait,
                    timeout,
                    fresh,
                } => {
                    let Some((i, epoch)) = m.pick_leased(pick) else {
                        break 'step;
                    };
                    let first = if fresh { m.tasks[i].children.len() } else { 0 };
                    let keys: Vec<String> =
                        (first..first + count).map(|k| format!("c{k}")).collect();
                    let timeout_ms = if timeout { SUSPEND_MS } else { SUSPEND_LONG_MS };
                    let reply = h.call(EngineRequest::Spawn(Spawn {
                        task: m.tasks[i].id.clone(),
                        epoch,
                        children: keys
                            .iter()
                            .map(|k| NewChild {
                                child_key: k.clone(),
                                queue: "q".into(),
                                task: NewTask {
                                    // First in line, so that children run and parents wake.
                                    priority: Some(CHILD_PRIORITY),
                                    ..NewTask::new(raw(&format!("{n}")))
                                },
                            })
                            .collect(),
                        wait: wait.then_some(SpawnWait {
                            reason: None,
                            timeout_ms: Some(timeout_ms),
                            on_timeout: Some(OnTimeout::Resume),
                        }),
                    }));
                    let known: Vec<Option<usize>> = keys
                        .iter()
                        .map(|k| m.tasks[i].children.iter().find(|c| c.0 == *k).map(|c| c.1))
                        .collect();
                    let new = known.iter().filter(|k| k.is_none()).count();
                    if new > 0 && m.tasks[i].depth + 1 > MAX_DEPTH {
                        assert_eq!(reply.unwrap_err().code, ErrorCode::Limit, "step {n}");
                        break 'step;
                    }
                    let reply = match reply {
                        Ok(Reply::Spawn(r)) => r,
                        other => panic!("step {n}: spawn: {other:?}"),
                    };
                    for ((k, got), known) in keys.iter().zip(&reply.children).zip(known) {
                        match known {
                            Some(c) => {
                                assert!(got.duplicate, "step {n}: {k} spawned before");
                                assert_eq!(got.id, m.tasks[c].id, "step {n}: {k}");
                            }
                            None => {
                                assert!(!got.duplicate, "step {n}: {k} is new");
                                let mut child = ModelTask::new(
                                    got.id.clone(),
                                    CHILD_PRIORITY,
                                    None,
                                    Vec::new(),
                                    M::Ready,
                                );
                                child.parent = Some(i);
                                child.depth = m.tasks[i].depth + 1;
                                m.tasks.push(child);
                                let c = m.tasks.len() - 1;
                                m.tasks[i].children.push((k.clone(), c));
                            }
                        }
                    }
                    if m.tasks[i].cancel_requested {
                        // Children spawned under a cancel follow it; a wait ends it.
                        if wait {
                            assert_eq!(reply.state, TaskState::Cancelled, "step {n}");
                            m.tasks[i].state = M::Cancelled;
                        }
                        m.cascade(i);
                    } else if wait {
                        let all_done = m.tasks[i]
                            .children
                            .iter()
                            .all(|c| Model::finished(m.tasks[c.1].state));
                        if all_done {
                            assert_eq!(reply.state, TaskState::Ready, "step {n}");
                            m.tasks[i].state = M::Ready;
                        } else {
                            assert_eq!(reply.state, TaskState::Suspended, "step {n}");
                            m.tasks[i].state = M::Suspended(m.now + timeout_ms, epoch);
                            m.tasks[i].waits = true;
                            let token = reply.resume_token.expect("a token");
                            m.tokens.push((i, epoch, token));
                        }
                    } else {
                        assert_eq!(reply.state, TaskState::Leased, "step {n}");
                    }
                }
                Step::Emit { pick, count, back } => {
                    if m.tasks.is_empty() {
                        break 'step;
                    }
                    let i = pick % m.tasks.len();
                    let t = &m.tasks[i];
                    let held = match t.state {
                        M::Leased(_, epoch) => Some(epoch),
                        _ => None,
                    };
                    let before = t.output.len();
                    let at = before - back.min(before);
                    // A repeat sends the chunks it sent before, then new ones.
                    let chunks: Vec<String> = (at..at + count)
                        .map(|k| t.output.get(k).cloned().unwrap_or(format!("{n}.{k}")))
                        .collect();
                    let reply = h.call(EngineRequest::Emit(Emit {
                        task: t.id.clone(),
                        epoch: held.unwrap_or(t.deliveries),
                        at: at as u64,
                        chunks: chunks.iter().map(Chunk::text).collect(),
                    }));
                    if held.is_none() {
                        assert_eq!(reply.unwrap_err().code, ErrorCode::LeaseLost, "step {n}");
                        break 'step;
                    }
                    let r = match reply {
                        Ok(Reply::Emit(r)) => r,
                        other => panic!("step {n}: emit: {other:?}"),
                    };
                    let repeated = (before - at).min(count);
                    m.tasks[i].output.extend(chunks[repeated..].iter().cloned());
                    assert_eq!(
                        (r.next, r.repeated),
                        (m.tasks[i].output.len() as u64, repeated as u64),
                        "step {n}"
                    );
                }
                Step::Follow { pick, from } => {
                    if m.tasks.is_empty() {
                        break 'step;
                    }
                    let t = &m.tasks[pick % m.tasks.len()];
                    let from = from % (t.output.len() + 1);
                    let r = match h.call(EngineRequest::Follow(Follow {
                        task: t.id.clone(),
                        from: from as u64,
                        timeout_ms: None,
                    })) {
                        Ok(Reply::Follow(r)) => r,
                        other => panic!("step {n}: follow: {other:?}"),
                    };
                    let got: Vec<(u64, String)> = r
                        .chunks
                        .iter()
                        .map(|c| (c.n, c.text.clone().unwrap_or_default()))
                        .collect();
                    let want: Vec<(u64, String)> = (from..)
                        .zip(&t.output[from..])
                        .map(|(k, c)| (k as u64, c.clone()))
                        .collect();
                    assert_eq!(got, want, "step {n}: follow from {from}");
                    assert_eq!(
                        (r.next, r.dropped, r.end),
                        (t.output.len() as u64, 0, Model::finished(t.state)),
                        "step {n}"
                    );
                }
                Step::Update {
                    pick,
                    priority,
                    run_now,
                } => {
                    if m.tasks.is_empty() {
                        break 'step;
                    }
                    let i = pick % m.tasks.len();
                    let reply = h.call(EngineRequest::TaskUpdate(TaskUpdate {
                        task: m.tasks[i].id.clone(),
                        priority,
                        run_now,
                    }));
                    let t = &mut m.tasks[i];
                    if !matches!(t.state, M::Ready | M::Scheduled(_)) {
                        match reply {
                            Err(e) => assert_eq!(e.code, ErrorCode::InvalidState, "step {n}"),
                            other => panic!("step {n}: update of a {:?} task: {other:?}", t.state),
                        }
                        break 'step;
                    }
                    if let Some(p) = priority {
                        t.priority = p;
                    }
                    if run_now {
                        t.state = M::Ready;
                    }
                    match reply {
                        Ok(Reply::TaskUpdate(r)) => {
                            assert_eq!(r.task.priority, t.priority, "step {n}");
                        }
                        other => panic!("step {n}: update: {other:?}"),
                    }
                }
            }
        }
        m.fan_in();
        m.check_families();
        assert_eq!(h.counts("q"), m.counts(), "step {n}: {s:?}");
    }
    for t in &m.tasks {
        let got = h.task(&t.id);
        assert_eq!(
            (got.failures, got.deliveries),
            (t.failures, t.deliveries),
            "task {}",
            t.id
        );
        let state = match t.state {
            M::Scheduled(_) => TaskState::Scheduled,
            M::Ready => TaskState::Ready,
            M::Leased(..) => TaskState::Leased,
            M::Done => TaskState::Done,
            M::Dead => TaskState::Dead,
            M::Suspended(..) => TaskState::Suspended,
            M::Cancelled => TaskState::Cancelled,
        };
        assert_eq!(got.state, state, "task {}", t.id);
        assert_eq!(
            got.output.map_or(0, |o| o.next),
            t.output.len() as u64,
            "task {}: its output",
            t.id
        );
        if state == TaskState::Leased {
            assert_eq!(got.cancel_requested, t.cancel_requested, "task {}", t.id);
        }
        assert_eq!(
            got.parent,
            t.parent.map(|p| m.tasks[p].id.clone()),
            "task {}",
            t.id
        );
        assert_eq!(
            got.children
                .iter()
                .map(|c| c.id.clone())
                .collect::<Vec<_>>(),
            t.children
                .iter()
                .map(|c| m.tasks[c.1].id.clone())
                .collect::<Vec<_>>(),
            "task {}",
            t.id
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn dispatch_matches_the_model_with_one_task_per_key(steps in proptest::collection::vec(step(), 1..80)) {
        run(&steps, 1);
    }

    #[test]
    fn dispatch_matches_the_model_with_two_tasks_per_key(steps in proptest::collection::vec(step(), 1..80)) {
        run(&steps, 2);
    }

    #[test]
    fn families_match_the_model(steps in proptest::collection::vec(family_step(), 1..120)) {
        run(&steps, 1);
    }
}
