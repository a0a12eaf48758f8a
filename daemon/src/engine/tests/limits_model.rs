//! Limits against a reference model, by property-based testing.
//!
//! Two queues share three limits: a token bucket (2 tokens a second, a burst of 3), a
//! concurrency of 1 to 3 (changed by the test), and a per-key concurrency of 1. Random
//! enqueues (any of the limits, costs 1 and 2), claims, acks, nacks, lapses, limit
//! changes, throttles reported by holders, restarts and time jumps. The model keeps the bucket as plainly as possible
//! and checks, at every step:
//! - over any interval, the cost granted is at most `burst + rate × interval`;
//! - no grant while a concurrency's leases are at its cap (per key for the per-key one);
//! - a claim hands out exactly the task the model picks: the first ready task of the
//!   queue, in enqueue order, whose limits all have room, never passing one over.

use proptest::prelude::*;

use muster_protocol::model::{LimitSpec, LimitUse, NewTask, QueuePatch, Rate};
use muster_protocol::ops::{Ack, Claim, EngineRequest, Enqueue, LimitSet, Nack, Throttled};

use super::{Harness, raw};
use crate::engine::Reply;

const LEASE_MS: u64 = 1000;
/// Token units: one token is `PER_MS` units, and the bucket gains `COUNT` a ms.
const COUNT: u64 = 2;
const PER_MS: u64 = 1000;
const BURST: u64 = 3;
const QUEUES: [&str; 2] = ["q0", "q1"];
const KEYS: [&str; 2] = ["a", "b"];

#[derive(Debug, Clone)]
enum Step {
    Enqueue {
        queue: usize,
        /// Bits: 1 the bucket, 2 the shared concurrency, 4 the per-key one.
        uses: u8,
        cost: u64,
        key: usize,
    },
    Claim {
        queue: usize,
        max: u32,
    },
    Ack {
        pick: usize,
    },
    Nack {
        pick: usize,
    },
    Throttle {
        pick: usize,
        ms: u64,
    },
    Advance {
        ms: u64,
    },
    Slots {
        cap: u32,
    },
    Restart,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        5 => (0usize..2, 0u8..8, 1u64..=2, 0usize..2)
            .prop_map(|(queue, uses, cost, key)| Step::Enqueue { queue, uses, cost, key }),
        5 => (0usize..2, 1u32..4).prop_map(|(queue, max)| Step::Claim { queue, max }),
        2 => any::<usize>().prop_map(|pick| Step::Ack { pick }),
        1 => any::<usize>().prop_map(|pick| Step::Nack { pick }),
        1 => (any::<usize>(), 1u64..600).prop_map(|(pick, ms)| Step::Throttle { pick, ms }),
        3 => (1u64..800).prop_map(|ms| Step::Advance { ms }),
        1 => (1u32..4).prop_map(|cap| Step::Slots { cap }),
        1 => Just(Step::Restart),
    ]
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum M {
    /// Waiting for this wall time (a throttled task that names no limit).
    Scheduled(u64),
    Ready,
    /// Leased until this wall time, at this epoch.
    Leased(u64, u64),
    Done,
}

#[derive(Debug)]
struct Task {
    id: String,
    queue: usize,
    uses: u8,
    cost: u64,
    key: usize,
    state: M,
    deliveries: u64,
}

struct Model {
    now: u64,
    tasks: Vec<Task>,
    /// The bucket's units at `at`.
    level: u64,
    at: u64,
    slots: u32,
    /// Every grant on the bucket: when, and its cost.
    grants: Vec<(u64, u64)>,
    /// Throttled buckets (a limit's bit, and the key for the per-key one) and until when.
    throttled: std::collections::HashMap<(u8, usize), u64>,
}

impl Model {
    fn level(&self) -> u64 {
        (self.level + (self.now - self.at) * COUNT).min(BURST * PER_MS)
    }

    fn held(&self, pred: impl Fn(&Task) -> bool) -> usize {
        self.tasks
            .iter()
            .filter(|t| matches!(t.state, M::Leased(..)) && pred(t))
            .count()
    }

    fn throttled(&self, bit: u8, key: usize) -> bool {
        let key = if bit == 4 { key } else { 0 };
        self.throttled
            .get(&(bit, key))
            .is_some_and(|until| *until > self.now)
    }

    /// Whether every limit `t` names has room for it now.
    fn room(&self, t: &Task) -> bool {
        [1, 2, 4]
            .iter()
            .all(|bit| t.uses & bit == 0 || !self.throttled(*bit, t.key))
            && (t.uses & 1 == 0 || self.level() >= t.cost * PER_MS)
            && (t.uses & 2 == 0 || self.held(|o| o.uses & 2 != 0) < self.slots as usize)
            && (t.uses & 4 == 0 || self.held(|o| o.uses & 4 != 0 && o.key == t.key) < 1)
    }

    /// The task a claim on `queue` gets: the first ready one whose limits have room.
    fn pick(&self, queue: usize) -> Option<usize> {
        (0..self.tasks.len()).find(|&i| {
            let t = &self.tasks[i];
            t.queue == queue && t.state == M::Ready && self.room(t)
        })
    }

    fn grant(&mut self, i: usize, epoch: u64) {
        let (uses, cost) = (self.tasks[i].uses, self.tasks[i].cost);
        if uses & 1 != 0 {
            self.level = self.level() - cost * PER_MS;
            self.at = self.now;
            self.grants.push((self.now, cost));
        }
        let t = &mut self.tasks[i];
        t.deliveries += 1;
        assert_eq!(
            epoch, t.deliveries,
            "task {}: the epoch counts deliveries",
            t.id
        );
        t.state = M::Leased(self.now + LEASE_MS, epoch);
    }

    fn advance(&mut self, ms: u64) {
        self.now += ms;
        for t in &mut self.tasks {
            match t.state {
                M::Leased(deadline, _) | M::Scheduled(deadline) if deadline <= self.now => {
                    t.state = M::Ready;
                }
                _ => {}
            }
        }
    }

    /// The bucket's bound: over every interval between two grants, what was granted
    /// is at most a burst and what the rate added.
    fn check_bucket(&self) {
        for i in 0..self.grants.len() {
            let mut cost = 0;
            for j in i..self.grants.len() {
                cost += self.grants[j].1;
                let span = self.grants[j].0 - self.grants[i].0;
                assert!(
                    cost * PER_MS <= BURST * PER_MS + COUNT * span,
                    "{cost} tokens granted in {span} ms: {:?}",
                    &self.grants[i..=j]
                );
            }
        }
    }
}

fn spec(slots: u32) -> [(&'static str, LimitSpec); 3] {
    [
        (
            "bucket",
            LimitSpec {
                rate: Some(Rate {
                    count: COUNT,
                    per_ms: PER_MS,
                }),
                burst: Some(BURST),
                ..LimitSpec::default()
            },
        ),
        (
            "slots",
            LimitSpec {
                concurrency: Some(slots),
                ..LimitSpec::default()
            },
        ),
        (
            "tenant",
            LimitSpec {
                concurrency: Some(1),
                per_key: true,
                ..LimitSpec::default()
            },
        ),
    ]
}

fn set_limit(h: &mut Harness, name: &str, spec: LimitSpec) {
    h.call(EngineRequest::LimitSet(LimitSet {
        name: name.into(),
        spec,
    }))
    .unwrap();
}

fn run(steps: &[Step]) {
    let mut h = Harness::new();
    for q in QUEUES {
        h.create(
            q,
            QueuePatch {
                lease_ms: Some(LEASE_MS),
                max_attempts: Some(1000),
                ..QueuePatch::default()
            },
        );
    }
    let mut m = Model {
        now: h.now.wall_ms,
        tasks: Vec::new(),
        level: 0,
        at: h.now.wall_ms,
        slots: 2,
        grants: Vec::new(),
        throttled: std::collections::HashMap::new(),
    };
    for (name, s) in spec(m.slots) {
        set_limit(&mut h, name, s);
    }
    for (n, s) in steps.iter().enumerate() {
        match *s {
            Step::Enqueue {
                queue,
                uses,
                cost,
                key,
            } => {
                let names = ["bucket", "slots", "tenant"];
                let limits = (0..3)
                    .filter(|b| uses & (1 << b) != 0)
                    .map(|b| LimitUse {
                        limit: names[b].into(),
                        key: (b == 2).then(|| KEYS[key].to_owned()),
                        cost: (b == 0).then_some(cost),
                    })
                    .collect();
                let task = NewTask {
                    limits,
                    ..NewTask::new(raw(&n.to_string()))
                };
                let id = match h.call(EngineRequest::Enqueue(Enqueue {
                    queue: QUEUES[queue].into(),
                    tasks: vec![task],
                })) {
                    Ok(Reply::Enqueue(r)) => r.tasks[0].id.clone(),
                    other => panic!("step {n}: enqueue: {other:?}"),
                };
                m.tasks.push(Task {
                    id,
                    queue,
                    uses,
                    cost: if uses & 1 != 0 { cost } else { 1 },
                    key,
                    state: M::Ready,
                    deliveries: 0,
                });
            }
            Step::Claim { queue, max } => {
                let claim = Claim::new([QUEUES[queue]]).max(max).member("m");
                let got: Vec<(String, u64)> = match h.call(EngineRequest::Claim(claim)) {
                    Ok(Reply::Claim(c)) => c.tasks.into_iter().map(|d| (d.id, d.epoch)).collect(),
                    other => panic!("step {n}: claim: {other:?}"),
                };
                let mut want = Vec::new();
                for (id, epoch) in &got {
                    let i = m.pick(queue);
                    assert_eq!(
                        i.map(|i| &m.tasks[i].id),
                        Some(id),
                        "step {n}: claim on {} got {got:?}",
                        QUEUES[queue]
                    );
                    let i = i.expect("compared above");
                    m.grant(i, *epoch);
                    want.push(i);
                }
                if got.len() < max as usize {
                    assert_eq!(
                        m.pick(queue).map(|i| &m.tasks[i].id),
                        None,
                        "step {n}: a task with room was withheld from a claim for {max}"
                    );
                }
            }
            Step::Ack { pick } | Step::Nack { pick } => {
                let held: Vec<usize> = (0..m.tasks.len())
                    .filter(|&i| matches!(m.tasks[i].state, M::Leased(..)))
                    .collect();
                if held.is_empty() {
                    continue;
                }
                let i = held[pick % held.len()];
                let M::Leased(_, epoch) = m.tasks[i].state else {
                    unreachable!("picked among leased tasks")
                };
                let task = m.tasks[i].id.clone();
                let (req, next) = match s {
                    Step::Ack { .. } => (
                        EngineRequest::Ack(Ack {
                            task,
                            epoch,
                            result: None,
                        }),
                        M::Done,
                    ),
                    _ => (
                        EngineRequest::Nack(Nack {
                            task,
                            epoch,
                            delay_ms: Some(0),
                            error: None,
                        }),
                        M::Ready,
                    ),
                };
                h.call(req).unwrap();
                m.tasks[i].state = next;
            }
            Step::Throttle { pick, ms } => {
                let held: Vec<usize> = (0..m.tasks.len())
                    .filter(|&i| matches!(m.tasks[i].state, M::Leased(..)))
                    .collect();
                if held.is_empty() {
                    continue;
                }
                let i = held[pick % held.len()];
                let M::Leased(_, epoch) = m.tasks[i].state else {
                    unreachable!("picked among leased tasks")
                };
                let reply = h.call(EngineRequest::Throttled(Throttled {
                    task: m.tasks[i].id.clone(),
                    epoch,
                    retry_after_ms: Some(ms),
                    limit: None,
                    error: None,
                }));
                let until = m.now + ms;
                let (uses, key) = (m.tasks[i].uses, m.tasks[i].key);
                for bit in [1u8, 2, 4] {
                    if uses & bit != 0 {
                        let k = if bit == 4 { key } else { 0 };
                        let slot = m.throttled.entry((bit, k)).or_default();
                        *slot = (*slot).max(until);
                    }
                }
                m.tasks[i].state = if uses == 0 {
                    M::Scheduled(until)
                } else {
                    M::Ready
                };
                match reply {
                    Ok(Reply::Settle(s)) => assert_eq!(
                        s.state,
                        if uses == 0 {
                            muster_protocol::model::TaskState::Scheduled
                        } else {
                            muster_protocol::model::TaskState::Ready
                        },
                        "step {n}"
                    ),
                    other => panic!("step {n}: throttled: {other:?}"),
                }
            }
            Step::Advance { ms } => {
                h.advance(ms);
                m.advance(ms);
            }
            Step::Slots { cap } => {
                let [_, (name, s), _] = spec(cap);
                set_limit(&mut h, name, s);
                m.slots = cap;
            }
            Step::Restart => {
                h.restart(0);
                h.round();
                // Every bucket starts empty; every held lease gets a full period again.
                m.level = 0;
                m.at = m.now;
                for t in &mut m.tasks {
                    if let M::Leased(_, epoch) = t.state {
                        t.state = M::Leased(m.now + LEASE_MS, epoch);
                    }
                }
            }
        }
        m.check_bucket();
        let held_slots = m.held(|t| t.uses & 2 != 0);
        assert!(
            held_slots <= 3,
            "step {n}: {held_slots} leases on a concurrency of at most 3"
        );
        for (key, name) in KEYS.iter().enumerate() {
            let held = m.held(|t| t.uses & 4 != 0 && t.key == key);
            assert!(held <= 1, "step {n}: key {name}: {held} leases");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn limits_grant_exactly_what_the_model_allows(steps in proptest::collection::vec(step(), 1..100)) {
        run(&steps);
    }
}
