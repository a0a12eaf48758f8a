//! In-process tests of the engine: a real fjall store in a temporary directory, and a
//! clock the test moves by hand. Every row of PROTOCOL.md §4.12's state table, fencing, backoff,
//! max_attempts, redrive, retention, waiting and restarts.

use muster_protocol::limits::{MAX_PAYLOAD_BYTES, MAX_RESUME_HELD};
use muster_protocol::model::{Backoff, NewTask, QueuePatch, TaskState};
use muster_protocol::ops::{
    self, Ack, Cancel, Claim, DeadLetter, DeadSelection, Enqueue, Nack, QueueCreate, QueueName,
    Release, Renew, TaskGet, TaskList, Wait,
};
use muster_protocol::{ErrorBody, ErrorCode, ops::EngineRequest};

use super::{Engine, FRESH_BYTES, Now, Reply, Sink, Waiter};
use crate::store::Store;
use muster_protocol::Push;

/// A request's identity in tests: a sequence number and the connection it came on.
#[derive(Debug, Clone, Copy)]
struct Tag {
    seq: u64,
    conn: u64,
    /// Who sent it; `None` as on a daemon without tokens.
    principal: Option<&'static crate::auth::Principal>,
}

/// A request is known by its number and connection (its principal goes with them).
impl PartialEq for Tag {
    fn eq(&self, other: &Tag) -> bool {
        (self.seq, self.conn) == (other.seq, other.conn)
    }
}

impl Eq for Tag {}

/// Pushes in tests are collected per connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TestSink(u64);

impl Sink for TestSink {
    fn is_closed(&self) -> bool {
        false
    }
}

impl Waiter for Tag {
    type Sink = TestSink;

    fn is_closed(&self) -> bool {
        false
    }

    fn connection(&self) -> u64 {
        self.conn
    }

    fn sink(&self) -> TestSink {
        TestSink(self.conn)
    }

    fn principal(&self) -> Option<&crate::auth::Principal> {
        self.principal
    }
}

struct Harness {
    engine: Option<Engine<Tag>>,
    now: Now,
    dir: tempfile::TempDir,
    next_tag: u64,
    /// Replies that arrived for requests other than the one being called.
    parked: Vec<(Tag, Result<Reply, ErrorBody>)>,
    /// Pushes sent, by connection.
    pushes: Vec<(u64, Push)>,
    /// Whether watch pushes are taken off the (simulated) connection as they come.
    reading: bool,
    /// Flags of watch pushes sent while not reading.
    unread: Vec<std::sync::Arc<std::sync::atomic::AtomicBool>>,
    /// The principal requests are sent as from now on (`None`: no tokens).
    principal: Option<&'static crate::auth::Principal>,
    /// Whether the last round wrote the store.
    wrote: bool,
}

/// The principal of `token` in a config file's text, for the test's whole run.
fn principal(config: &str, token: &str) -> &'static crate::auth::Principal {
    let tokens = crate::auth::Tokens::parse(config).unwrap();
    let p = tokens.authenticate(token).unwrap();
    Box::leak(Box::new((*p).clone()))
}

fn raw(s: &str) -> muster_protocol::RawJson {
    ops::raw(s).unwrap()
}

impl Harness {
    fn new() -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let now = Now {
            wall_ms: 1_800_000_000_000,
            mono_ms: 1_000,
        };
        let engine = Engine::open(Store::open(dir.path(), 8 << 20).unwrap(), now, 7).unwrap();
        Harness {
            engine: Some(engine),
            now,
            dir,
            next_tag: 0,
            parked: Vec::new(),
            pushes: Vec::new(),
            reading: true,
            unread: Vec::new(),
            principal: None,
            wrote: false,
        }
    }

    fn engine(&mut self) -> &mut Engine<Tag> {
        self.engine.as_mut().unwrap()
    }

    /// Sends a request, runs the round and returns the replies the round produced.
    fn send(&mut self, req: EngineRequest) -> Tag {
        self.send_on(0, req)
    }

    fn send_on(&mut self, conn: u64, req: EngineRequest) -> Tag {
        self.next_tag += 1;
        let tag = Tag {
            seq: self.next_tag,
            conn,
            principal: self.principal,
        };
        let now = self.now;
        self.engine().handle(req, tag, now).unwrap();
        self.round();
        tag
    }

    fn round(&mut self) {
        let now = self.now;
        self.engine().tick(now).unwrap();
        self.wrote = self.engine().take_dirty();
        let out: Vec<_> = self.engine().take_outbox().collect();
        self.parked.extend(out);
        let pushes: Vec<_> = self.engine().take_pushes().collect();
        self.pushes
            .extend(pushes.into_iter().map(|(sink, p)| (sink.0, p)));
        let watch_pushes: Vec<_> = self.engine().take_watch_pushes().collect();
        for (sink, push, queued) in watch_pushes {
            self.pushes.push((sink.0, push));
            // The client reads (unless a test says it stopped): the writer clears the flag.
            if self.reading {
                queued.store(false, std::sync::atomic::Ordering::Release);
            } else {
                self.unread.push(queued);
            }
        }
    }

    fn call_on(&mut self, conn: u64, req: EngineRequest) -> Result<Reply, ErrorBody> {
        let tag = self.send_on(conn, req);
        self.reply_for(tag).expect("a reply in the same round")
    }

    /// Takes the pushes sent to a connection so far.
    fn pushed(&mut self, conn: u64) -> Vec<Push> {
        let (mine, rest) = std::mem::take(&mut self.pushes)
            .into_iter()
            .partition(|(c, _)| *c == conn);
        self.pushes = rest;
        mine.into_iter().map(|(_, p)| p).collect()
    }

    fn reply_for(&mut self, tag: Tag) -> Option<Result<Reply, ErrorBody>> {
        let pos = self.parked.iter().position(|(t, _)| *t == tag)?;
        Some(self.parked.remove(pos).1)
    }

    fn call(&mut self, req: EngineRequest) -> Result<Reply, ErrorBody> {
        let tag = self.send(req);
        self.reply_for(tag).expect("a reply in the same round")
    }

    fn advance(&mut self, ms: u64) {
        self.now.wall_ms += ms;
        self.now.mono_ms += ms;
        self.round();
    }

    /// Stops the engine and opens a new one over the same store, as a daemon restart
    /// does: the monotonic clock starts again and `wall_gap_ms` passed while down.
    fn restart(&mut self, wall_gap_ms: u64) {
        let engine = self.engine.take().unwrap();
        engine.store().persist(crate::store::Persist::All).unwrap();
        drop(engine);
        self.now = Now {
            wall_ms: self.now.wall_ms + wall_gap_ms,
            mono_ms: 5,
        };
        let store = Store::open(self.dir.path(), 8 << 20).unwrap();
        self.engine = Some(Engine::open(store, self.now, 8).unwrap());
    }

    fn create(&mut self, queue: &str, options: QueuePatch) {
        self.call(EngineRequest::QueueCreate(QueueCreate {
            queue: queue.into(),
            options,
        }))
        .unwrap();
    }

    fn enqueue_task(&mut self, queue: &str, task: NewTask) -> String {
        match self.call(EngineRequest::Enqueue(Enqueue {
            queue: queue.into(),
            tasks: vec![task],
        })) {
            Ok(Reply::Enqueue(r)) => r.tasks[0].id.clone(),
            other => panic!("enqueue: {other:?}"),
        }
    }

    fn enqueue(&mut self, queue: &str, payload: &str) -> String {
        self.enqueue_task(queue, NewTask::new(raw(payload)))
    }

    fn claim_as(&mut self, queue: &str, max: u32, member: &str) -> Vec<(String, u64, u64)> {
        let req = EngineRequest::Claim(Claim::new([queue]).max(max).member(member));
        match self.call(req) {
            Ok(Reply::Claim(r)) => r
                .tasks
                .into_iter()
                .map(|d| (d.id, d.epoch, d.attempt))
                .collect(),
            other => panic!("claim: {other:?}"),
        }
    }

    fn claim(&mut self, queue: &str) -> Vec<(String, u64, u64)> {
        self.claim_as(queue, 1, "m1")
    }

    fn claim_one(&mut self, queue: &str) -> (String, u64) {
        let got = self.claim(queue);
        assert_eq!(got.len(), 1, "expected one task, got {got:?}");
        (got[0].0.clone(), got[0].1)
    }

    fn state(&mut self, id: &str) -> (TaskState, u64, u64) {
        let t = self.task(id);
        (t.state, t.deliveries, t.failures)
    }

    fn task(&mut self, id: &str) -> muster_protocol::model::TaskInfo {
        match self.call(EngineRequest::TaskGet(TaskGet { task: id.into() })) {
            Ok(Reply::Task(r)) => r.task,
            other => panic!("task_get {id}: {other:?}"),
        }
    }

    fn code(&mut self, req: EngineRequest) -> ErrorCode {
        match self.call(req) {
            Err(e) => e.code,
            Ok(r) => panic!("expected an error, got {r:?}"),
        }
    }

    /// A queue's tasks per state: scheduled, ready, leased, done, dead, cancelled,
    /// suspended.
    fn counts(&mut self, queue: &str) -> [u64; 7] {
        match self.call(EngineRequest::QueueDescribe(ops::QueueDescribe(
            QueueName {
                queue: queue.into(),
            },
        ))) {
            Ok(Reply::Queue(r)) => {
                let c = r.queue.counts;
                [
                    c.scheduled,
                    c.ready,
                    c.leased,
                    c.done,
                    c.dead,
                    c.cancelled,
                    c.suspended,
                ]
            }
            other => panic!("describe: {other:?}"),
        }
    }

    fn options(&mut self, queue: &str) -> muster_protocol::model::QueueOptions {
        match self.call(EngineRequest::QueueDescribe(ops::QueueDescribe(
            QueueName {
                queue: queue.into(),
            },
        ))) {
            Ok(Reply::Queue(r)) => r.queue.options,
            other => panic!("describe: {other:?}"),
        }
    }
}

fn ack(id: &str, epoch: u64) -> EngineRequest {
    EngineRequest::Ack(Ack {
        task: id.into(),
        epoch,
        result: None,
    })
}

fn nack(id: &str, epoch: u64, delay_ms: Option<u64>) -> EngineRequest {
    EngineRequest::Nack(Nack {
        task: id.into(),
        epoch,
        delay_ms,
        error: Some("boom".into()),
    })
}

fn renew(id: &str, epoch: u64) -> EngineRequest {
    renew_with(id, epoch, None, None)
}

fn renew_with(
    id: &str,
    epoch: u64,
    extend_ms: Option<u64>,
    progress: Option<&str>,
) -> EngineRequest {
    EngineRequest::Renew(Renew {
        task: id.into(),
        epoch,
        extend_ms,
        progress: progress.map(raw),
    })
}

fn release(id: &str, epoch: u64) -> EngineRequest {
    EngineRequest::Release(Release {
        task: id.into(),
        epoch,
    })
}

fn dead_letter(id: &str, epoch: u64) -> EngineRequest {
    EngineRequest::DeadLetter(DeadLetter {
        task: id.into(),
        epoch,
        error: "poison".into(),
    })
}

fn no_jitter(max_attempts: u32) -> QueuePatch {
    QueuePatch {
        max_attempts: Some(max_attempts),
        retry_backoff: Some(Backoff {
            base_ms: 1000,
            factor: 2.0,
            cap_ms: 3000,
            jitter: 0.0,
        }),
        lease_ms: Some(30_000),
        ..QueuePatch::default()
    }
}

#[test]
fn enqueue_claim_ack_is_done_with_result_and_retention_removes_it() {
    let mut h = Harness::new();
    h.create(
        "jobs",
        QueuePatch {
            retention_ms: Some(60_000),
            ..QueuePatch::default()
        },
    );
    let id = h.enqueue("jobs", r#"{"order":42}"#);
    assert_eq!(h.state(&id), (TaskState::Ready, 0, 0));
    let (cid, epoch) = h.claim_one("jobs");
    assert_eq!((cid.as_str(), epoch), (id.as_str(), 1));
    assert_eq!(h.state(&id), (TaskState::Leased, 1, 0));
    let reply = h.call(EngineRequest::Ack(Ack {
        task: id.clone(),
        epoch,
        result: Some(raw(r#"{"sent":true}"#)),
    }));
    assert_eq!(
        reply.unwrap_or_else(|e| panic!("{e}")).state_of_settle(),
        TaskState::Done
    );
    let t = h.task(&id);
    assert_eq!(t.state, TaskState::Done);
    assert_eq!(t.result.unwrap().get(), r#"{"sent":true}"#);
    assert_eq!(t.payload.get(), r#"{"order":42}"#);
    let events: Vec<_> = t.history.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(events, ["enqueued", "leased", "done"]);
    assert_eq!(h.counts("jobs"), [0, 0, 0, 1, 0, 0, 0]);
    h.advance(59_999);
    assert_eq!(h.counts("jobs"), [0, 0, 0, 1, 0, 0, 0]);
    h.advance(1);
    assert_eq!(h.counts("jobs"), [0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(
        h.code(EngineRequest::TaskGet(TaskGet { task: id })),
        ErrorCode::NotFound
    );
}

impl Reply {
    fn state_of_settle(&self) -> TaskState {
        match self {
            Reply::Settle(s) => s.state,
            other => panic!("not a settle reply: {other:?}"),
        }
    }
}

#[test]
fn delayed_enqueue_is_scheduled_until_its_time() {
    let mut h = Harness::new();
    h.create("jobs", QueuePatch::default());
    let mut task = NewTask::new(raw("1"));
    task.delay_ms = Some(10_000);
    let id = h.enqueue_task("jobs", task);
    assert_eq!(h.state(&id).0, TaskState::Scheduled);
    assert!(h.claim("jobs").is_empty());
    h.advance(9_999);
    assert_eq!(h.state(&id).0, TaskState::Scheduled);
    h.advance(1);
    assert_eq!(h.state(&id).0, TaskState::Ready);
    assert_eq!(h.claim_one("jobs").0, id);
}

#[test]
fn nack_uses_backoff_then_max_attempts_sends_to_dead() {
    let mut h = Harness::new();
    h.create("jobs", no_jitter(3));
    let id = h.enqueue("jobs", "1");
    let (_, e1) = h.claim_one("jobs");
    let start = h.now.wall_ms;
    match h.call(nack(&id, e1, None)).unwrap() {
        Reply::Settle(s) => {
            assert_eq!(s.state, TaskState::Scheduled);
            assert_eq!(s.not_before_ms, Some(start + 1000));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(h.state(&id), (TaskState::Scheduled, 1, 1));
    h.advance(1000);
    let (_, e2) = h.claim_one("jobs");
    assert_eq!(e2, 2);
    let at = h.now.wall_ms;
    match h.call(nack(&id, e2, None)).unwrap() {
        Reply::Settle(s) => assert_eq!(s.not_before_ms, Some(at + 2000)),
        other => panic!("{other:?}"),
    }
    h.advance(2000);
    let (_, e3) = h.claim_one("jobs");
    assert_eq!(
        h.call(nack(&id, e3, Some(0))).unwrap().state_of_settle(),
        TaskState::Dead
    );
    let t = h.task(&id);
    assert_eq!((t.state, t.deliveries, t.failures), (TaskState::Dead, 3, 3));
    assert_eq!(t.dead_reason.as_deref(), Some("max_attempts"));
    assert_eq!(t.last_error.as_deref(), Some("boom"));
    assert_eq!(h.counts("jobs"), [0, 0, 0, 0, 1, 0, 0]);
}

#[test]
fn backoff_is_capped() {
    let mut h = Harness::new();
    h.create("jobs", no_jitter(0));
    let id = h.enqueue("jobs", "1");
    let mut delays = Vec::new();
    for _ in 0..4 {
        let (_, e) = h.claim_one("jobs");
        let at = h.now.wall_ms;
        match h.call(nack(&id, e, None)).unwrap() {
            Reply::Settle(s) => delays.push(s.not_before_ms.unwrap() - at),
            other => panic!("{other:?}"),
        }
        h.advance(*delays.last().unwrap());
    }
    assert_eq!(delays, [1000, 2000, 3000, 3000]);
}

#[test]
fn nack_with_explicit_delay_zero_is_ready_at_once() {
    let mut h = Harness::new();
    h.create("jobs", QueuePatch::default());
    let id = h.enqueue("jobs", "1");
    let (_, e) = h.claim_one("jobs");
    assert_eq!(
        h.call(nack(&id, e, Some(0))).unwrap().state_of_settle(),
        TaskState::Ready
    );
    let (again, e2) = h.claim_one("jobs");
    assert_eq!((again, e2), (id.clone(), 2));
    assert_eq!(h.state(&id), (TaskState::Leased, 2, 1));
}

#[test]
fn lapsed_lease_redelivers_with_a_failure_and_dies_at_max_attempts() {
    let mut h = Harness::new();
    h.create(
        "jobs",
        QueuePatch {
            lease_ms: Some(1000),
            max_attempts: Some(2),
            ..QueuePatch::default()
        },
    );
    let id = h.enqueue("jobs", "1");
    let (_, e1) = h.claim_one("jobs");
    h.advance(999);
    assert_eq!(h.state(&id), (TaskState::Leased, 1, 0));
    h.advance(1);
    assert_eq!(h.state(&id), (TaskState::Ready, 1, 1));
    let got = h.claim("jobs");
    assert_eq!(got, vec![(id.clone(), 2, 2)]);
    assert_eq!(h.code(ack(&id, e1)), ErrorCode::LeaseLost);
    h.advance(1000);
    let t = h.task(&id);
    assert_eq!((t.state, t.failures), (TaskState::Dead, 2));
    assert_eq!(t.dead_reason.as_deref(), Some("max_attempts"));
    assert_eq!(
        t.last_error.as_deref(),
        Some("lease lapsed (member \"m1\", epoch 2)")
    );
}

#[test]
fn renew_extends_the_lease_and_stores_progress() {
    let mut h = Harness::new();
    let (id, e) = claimed_with_lease(&mut h, 1000);
    h.advance(900);
    let reply = h.call(renew_with(&id, e, Some(5000), Some(r#"{"step":3}"#)));
    match reply.unwrap() {
        Reply::Renew(r) => {
            assert_eq!(r.lease_expires_ms, h.now.wall_ms + 5000);
            assert!(!r.cancel_requested);
        }
        other => panic!("{other:?}"),
    }
    h.advance(4999);
    assert_eq!(h.state(&id).0, TaskState::Leased);
    assert_eq!(h.task(&id).progress.unwrap().get(), r#"{"step":3}"#);
    h.advance(1);
    assert_eq!(h.state(&id), (TaskState::Ready, 1, 1));
    // The checkpoint survives the lapse and travels with the next delivery.
    let req = EngineRequest::Claim(Claim::new(["jobs"]));
    match h.call(req).unwrap() {
        Reply::Claim(c) => assert_eq!(c.tasks[0].progress.as_ref().unwrap().get(), r#"{"step":3}"#),
        other => panic!("{other:?}"),
    }
}

/// A queue `jobs` with the given options, and one task claimed from it.
fn claimed(h: &mut Harness, options: QueuePatch) -> (String, u64) {
    h.create("jobs", options);
    let id = h.enqueue("jobs", "1");
    let (_, epoch) = h.claim_one("jobs");
    (id, epoch)
}

/// A queue `jobs` with the given lease, and one task claimed from it.
fn claimed_with_lease(h: &mut Harness, lease_ms: u64) -> (String, u64) {
    let options = QueuePatch {
        lease_ms: Some(lease_ms),
        ..QueuePatch::default()
    };
    claimed(h, options)
}

/// A queue `jobs` with the given lease and runtime cap, and one task claimed from it.
fn claimed_under_runtime_cap(h: &mut Harness, lease_ms: u64, max_runtime_ms: u64) -> (String, u64) {
    let options = QueuePatch {
        lease_ms: Some(lease_ms),
        max_runtime_ms: Some(max_runtime_ms),
        ..QueuePatch::default()
    };
    claimed(h, options)
}

#[test]
fn max_runtime_bounds_renewals() {
    let mut h = Harness::new();
    let (id, e) = claimed_under_runtime_cap(&mut h, 1000, 2500);
    h.advance(900);
    h.call(renew(&id, e)).unwrap();
    h.advance(900);
    match h.call(renew(&id, e)).unwrap() {
        Reply::Renew(r) => assert_eq!(r.lease_expires_ms, h.now.wall_ms + 700),
        other => panic!("{other:?}"),
    }
    h.advance(699);
    assert_eq!(h.state(&id).0, TaskState::Leased);
    h.advance(1);
    assert_eq!(h.state(&id), (TaskState::Ready, 1, 1));
}

#[test]
fn release_returns_the_task_without_a_failure() {
    let mut h = Harness::new();
    h.create("jobs", QueuePatch::default());
    let id = h.enqueue("jobs", "1");
    let (_, e) = h.claim_one("jobs");
    assert_eq!(
        h.call(release(&id, e)).unwrap().state_of_settle(),
        TaskState::Ready
    );
    assert_eq!(h.state(&id), (TaskState::Ready, 1, 0));
}

#[test]
fn dead_letter_then_redrive_resets_failures_and_keeps_history() {
    let mut h = Harness::new();
    h.create("jobs", QueuePatch::default());
    let id = h.enqueue("jobs", "1");
    let (_, e1) = h.claim_one("jobs");
    h.call(nack(&id, e1, Some(0))).unwrap();
    let (_, e2) = h.claim_one("jobs");
    assert_eq!(
        h.call(dead_letter(&id, e2)).unwrap().state_of_settle(),
        TaskState::Dead
    );
    let t = h.task(&id);
    assert_eq!((t.state, t.failures), (TaskState::Dead, 1));
    assert_eq!(t.dead_reason.as_deref(), Some("dead_lettered"));
    assert_eq!(t.last_error.as_deref(), Some("poison"));
    let sel = |dry_run| DeadSelection {
        queue: "jobs".into(),
        ids: vec![],
        all: true,
        dry_run,
    };
    match h
        .call(EngineRequest::Redrive(ops::Redrive(sel(true))))
        .unwrap()
    {
        Reply::Count(c) => assert_eq!((c.count, c.ids), (1, vec![id.clone()])),
        other => panic!("{other:?}"),
    }
    assert_eq!(h.state(&id).0, TaskState::Dead);
    match h
        .call(EngineRequest::Redrive(ops::Redrive(sel(false))))
        .unwrap()
    {
        Reply::Count(c) => assert_eq!(c.count, 1),
        other => panic!("{other:?}"),
    }
    let t = h.task(&id);
    assert_eq!(
        (t.state, t.deliveries, t.failures),
        (TaskState::Ready, 2, 0)
    );
    assert_eq!(t.dead_reason, None);
    let events: Vec<_> = t.history.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(
        events,
        [
            "enqueued",
            "leased",
            "nacked",
            "leased",
            "dead_lettered",
            "redriven"
        ]
    );
}

#[test]
fn discard_removes_dead_tasks_and_refuses_live_ones_whole() {
    let mut h = Harness::new();
    h.create("jobs", QueuePatch::default());
    let dead = h.enqueue("jobs", "1");
    let live = h.enqueue("jobs", "2");
    let (_, e) = h.claim_one("jobs");
    h.call(dead_letter(&dead, e)).unwrap();
    let both = DeadSelection {
        queue: "jobs".into(),
        ids: vec![dead.clone(), live.clone()],
        all: false,
        dry_run: false,
    };
    assert_eq!(
        h.code(EngineRequest::Discard(ops::Discard(both))),
        ErrorCode::InvalidState
    );
    assert_eq!(h.state(&dead).0, TaskState::Dead);
    let one = DeadSelection {
        queue: "jobs".into(),
        ids: vec![dead.clone()],
        all: false,
        dry_run: false,
    };
    match h.call(EngineRequest::Discard(ops::Discard(one))).unwrap() {
        Reply::Count(c) => assert_eq!(c.count, 1),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        h.code(EngineRequest::TaskGet(TaskGet { task: dead })),
        ErrorCode::NotFound
    );
    assert_eq!(h.counts("jobs"), [0, 1, 0, 0, 0, 0, 0]);
}

#[test]
fn cancel_ready_scheduled_and_leased() {
    let mut h = Harness::new();
    h.create(
        "jobs",
        QueuePatch {
            lease_ms: Some(1000),
            ..QueuePatch::default()
        },
    );
    let ready = h.enqueue("jobs", "1");
    let mut t = NewTask::new(raw("2"));
    t.delay_ms = Some(5000);
    let scheduled = h.enqueue_task("jobs", t);
    let leased = h.enqueue("jobs", "3");
    let cancel = |id: &str| {
        EngineRequest::Cancel(Cancel {
            task: id.into(),
            if_state: None,
        })
    };
    match h.call(cancel(&ready)).unwrap() {
        Reply::Cancel(c) => {
            assert_eq!((c.state, c.cancel_requested), (TaskState::Cancelled, false))
        }
        other => panic!("{other:?}"),
    }
    h.call(cancel(&scheduled)).unwrap();
    assert_eq!(h.state(&scheduled).0, TaskState::Cancelled);
    let (got, e) = h.claim_one("jobs");
    assert_eq!(got, leased);
    match h.call(cancel(&leased)).unwrap() {
        Reply::Cancel(c) => assert_eq!((c.state, c.cancel_requested), (TaskState::Leased, true)),
        other => panic!("{other:?}"),
    }
    match h.call(renew(&leased, e)).unwrap() {
        Reply::Renew(r) => assert!(r.cancel_requested),
        other => panic!("{other:?}"),
    }
    // The holder's nack ends it as cancelled, and it is never handed out again.
    assert_eq!(
        h.call(nack(&leased, e, Some(0))).unwrap().state_of_settle(),
        TaskState::Cancelled
    );
    assert!(h.claim("jobs").is_empty());
    assert_eq!(h.counts("jobs"), [0, 0, 0, 0, 0, 3, 0]);
    // Done tasks cannot be cancelled.
    let done = h.enqueue("jobs", "4");
    let (_, e) = h.claim_one("jobs");
    h.call(ack(&done, e)).unwrap();
    assert_eq!(h.code(cancel(&done)), ErrorCode::InvalidState);
}

#[test]
fn a_cancel_requested_lease_that_lapses_is_cancelled() {
    let mut h = Harness::new();
    h.create(
        "jobs",
        QueuePatch {
            lease_ms: Some(1000),
            ..QueuePatch::default()
        },
    );
    let id = h.enqueue("jobs", "1");
    h.claim_one("jobs");
    h.call(EngineRequest::Cancel(Cancel {
        task: id.clone(),
        if_state: None,
    }))
    .unwrap();
    h.advance(1000);
    assert_eq!(h.state(&id).0, TaskState::Cancelled);
    assert!(h.claim("jobs").is_empty());
}

#[test]
fn stale_epochs_are_refused_in_every_order_and_change_nothing() {
    let mut h = Harness::new();
    let (id, e1) = claimed_with_lease(&mut h, 1000);
    h.advance(1000);
    let (_, e2) = h.claim_one("jobs");
    assert_eq!((e1, e2), (1, 2));
    let before = h.task(&id);
    for req in [
        ack(&id, e1),
        nack(&id, e1, Some(0)),
        renew(&id, e1),
        release(&id, e1),
        dead_letter(&id, e1),
    ] {
        let name = req.name();
        assert_eq!(h.code(req), ErrorCode::LeaseLost, "{name}");
    }
    let after = h.task(&id);
    assert_eq!(
        (
            after.state,
            after.deliveries,
            after.failures,
            after.lease.clone(),
            after.history.len()
        ),
        (
            before.state,
            before.deliveries,
            before.failures,
            before.lease.clone(),
            before.history.len()
        )
    );
    // An epoch from the future is as stale as one from the past.
    assert_eq!(h.code(ack(&id, 3)), ErrorCode::LeaseLost);
    h.call(ack(&id, e2)).unwrap();
    // Settling twice is refused too: the lease ended with the first.
    assert_eq!(h.code(ack(&id, e2)), ErrorCode::LeaseLost);
    assert_eq!(h.code(release(&id, e2)), ErrorCode::LeaseLost);
    assert_eq!(h.state(&id), (TaskState::Done, 2, 1));
}

#[test]
fn idempotency_keys_return_the_first_task() {
    let mut h = Harness::new();
    h.create("jobs", QueuePatch::default());
    let mut t = NewTask::new(raw("1"));
    t.idempotency_key = Some("order-42".into());
    let first = h.enqueue_task("jobs", t.clone());
    match h
        .call(EngineRequest::Enqueue(Enqueue {
            queue: "jobs".into(),
            tasks: vec![t.clone(), t],
        }))
        .unwrap()
    {
        Reply::Enqueue(r) => {
            assert_eq!(r.tasks.len(), 2);
            for e in r.tasks {
                assert_eq!((e.id, e.duplicate), (first.clone(), true));
            }
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(h.counts("jobs"), [0, 1, 0, 0, 0, 0, 0]);
}

#[test]
fn priority_first_then_enqueue_order_and_retries_keep_their_place() {
    let mut h = Harness::new();
    h.create("jobs", QueuePatch::default());
    let with = |p: u8, body: &str| {
        let mut t = NewTask::new(raw(body));
        t.priority = Some(p);
        t
    };
    let a = h.enqueue_task("jobs", with(0, "1"));
    let b = h.enqueue_task("jobs", with(5, "2"));
    let c = h.enqueue_task("jobs", with(0, "3"));
    let (first, e) = h.claim_one("jobs");
    assert_eq!(first, b);
    let (second, e2) = h.claim_one("jobs");
    assert_eq!(second, a);
    // a goes back; it keeps its place before c.
    h.call(nack(&a, e2, Some(0))).unwrap();
    let order: Vec<String> = h
        .claim_as("jobs", 10, "m1")
        .into_iter()
        .map(|t| t.0)
        .collect();
    assert_eq!(order, vec![a, c]);
    h.call(ack(&b, e)).unwrap();
}

#[test]
fn key_concurrency_holds_back_a_key_but_not_others() {
    let mut h = Harness::new();
    h.create("jobs", QueuePatch::default());
    let keyed = |k: &str, body: &str| {
        let mut t = NewTask::new(raw(body));
        t.key = Some(k.into());
        t
    };
    let a1 = h.enqueue_task("jobs", keyed("a", "1"));
    let a2 = h.enqueue_task("jobs", keyed("a", "2"));
    let b1 = h.enqueue_task("jobs", keyed("b", "3"));
    let got: Vec<String> = h
        .claim_as("jobs", 10, "m1")
        .into_iter()
        .map(|t| t.0)
        .collect();
    assert_eq!(got, vec![a1.clone(), b1]);
    assert!(h.claim("jobs").is_empty());
    h.call(ack(&a1, 1)).unwrap();
    assert_eq!(h.claim_one("jobs").0, a2);
}

#[test]
fn paused_queue_accepts_but_hands_out_nothing_until_resumed() {
    let mut h = Harness::new();
    h.create("jobs", QueuePatch::default());
    h.call(EngineRequest::QueuePause(ops::QueuePause(QueueName {
        queue: "jobs".into(),
    })))
    .unwrap();
    let id = h.enqueue("jobs", "1");
    assert!(h.claim("jobs").is_empty());
    h.call(EngineRequest::QueueResume(ops::QueueResume(QueueName {
        queue: "jobs".into(),
    })))
    .unwrap();
    assert_eq!(h.claim_one("jobs").0, id);
}

#[test]
fn a_waiting_claim_is_served_by_a_later_enqueue_or_times_out_empty() {
    let mut h = Harness::new();
    h.create("jobs", QueuePatch::default());
    let claim = |wait| EngineRequest::Claim(Claim::new(["jobs"]).max(5).wait_ms(wait));
    let waiting = h.send(claim(5000));
    assert!(h.reply_for(waiting).is_none());
    let id = h.enqueue("jobs", "1");
    match h.reply_for(waiting).unwrap().unwrap() {
        Reply::Claim(c) => assert_eq!(
            c.tasks.iter().map(|d| d.id.clone()).collect::<Vec<_>>(),
            vec![id]
        ),
        other => panic!("{other:?}"),
    }
    let idle = h.send(claim(5000));
    h.advance(4999);
    assert!(h.reply_for(idle).is_none());
    let now = h.now;
    assert_eq!(h.engine().next_timer(now), Some(1));
    h.advance(1);
    match h.reply_for(idle).unwrap().unwrap() {
        Reply::Claim(c) => assert!(c.tasks.is_empty()),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_claim_over_several_queues_takes_them_round_robin() {
    let mut h = Harness::new();
    for q in ["a", "b", "c"] {
        h.create(q, QueuePatch::default());
        for i in 0..3 {
            h.enqueue(q, &i.to_string());
        }
    }
    let req = EngineRequest::Claim(Claim::new(["a", "b", "c"]).max(6));
    match h.call(req).unwrap() {
        Reply::Claim(c) => {
            let queues: Vec<_> = c.tasks.iter().map(|d| d.queue.as_str()).collect();
            assert_eq!(queues, ["a", "b", "c", "a", "b", "c"]);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn requires_labels_gate_delivery() {
    let mut h = Harness::new();
    h.create("jobs", QueuePatch::default());
    let mut t = NewTask::new(raw("1"));
    t.requires = vec!["gpu".into()];
    let gpu = h.enqueue_task("jobs", t);
    let plain = h.enqueue("jobs", "2");
    assert_eq!(
        h.claim_as("jobs", 5, "cpu-box")
            .into_iter()
            .map(|t| t.0)
            .collect::<Vec<_>>(),
        vec![plain]
    );
    let req = EngineRequest::Claim(
        Claim::new(["jobs"])
            .max(5)
            .member("gpu-box")
            .labels(["gpu", "big"]),
    );
    match h.call(req).unwrap() {
        Reply::Claim(c) => assert_eq!(
            c.tasks.iter().map(|d| d.id.clone()).collect::<Vec<_>>(),
            vec![gpu]
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn wait_answers_when_every_task_finishes_or_at_its_timeout() {
    let mut h = Harness::new();
    h.create("jobs", QueuePatch::default());
    let a = h.enqueue("jobs", "1");
    let b = h.enqueue("jobs", "2");
    let waiting = h.send(EngineRequest::Wait(Wait {
        tasks: vec![a.clone(), b.clone()],
        timeout_ms: Some(10_000),
    }));
    let (_, ea) = h.claim_one("jobs");
    h.call(ack(&a, ea)).unwrap();
    assert!(h.reply_for(waiting).is_none());
    h.call(EngineRequest::Cancel(Cancel {
        task: b.clone(),
        if_state: None,
    }))
    .unwrap();
    match h.reply_for(waiting).unwrap().unwrap() {
        Reply::Wait(w) => {
            let states: Vec<_> = w.finished.iter().map(|t| (t.id.clone(), t.state)).collect();
            assert_eq!(
                states,
                vec![(a, TaskState::Done), (b, TaskState::Cancelled)]
            );
            assert!(w.pending.is_empty());
        }
        other => panic!("{other:?}"),
    }
    let c = h.enqueue("jobs", "3");
    let timed = h.send(EngineRequest::Wait(Wait {
        tasks: vec![c.clone()],
        timeout_ms: Some(1000),
    }));
    h.advance(1000);
    match h.reply_for(timed).unwrap().unwrap() {
        Reply::Wait(w) => assert_eq!((w.finished.len(), w.pending), (0, vec![c])),
        other => panic!("{other:?}"),
    }
}

#[test]
fn task_list_pages_through_a_state_in_id_order() {
    let mut h = Harness::new();
    h.create("jobs", QueuePatch::default());
    let ids: Vec<String> = (0..5).map(|i| h.enqueue("jobs", &i.to_string())).collect();
    let page = |h: &mut Harness, after: Option<String>| match h
        .call(EngineRequest::TaskList(TaskList {
            queue: "jobs".into(),
            state: TaskState::Ready,
            after,
            limit: Some(2),
        }))
        .unwrap()
    {
        Reply::TaskList(l) => (
            l.tasks.into_iter().map(|t| t.id).collect::<Vec<_>>(),
            l.next,
        ),
        other => panic!("{other:?}"),
    };
    let (p1, n1) = page(&mut h, None);
    let (p2, n2) = page(&mut h, n1);
    let (p3, n3) = page(&mut h, n2);
    assert_eq!(
        (p1, p2, p3),
        (ids[0..2].to_vec(), ids[2..4].to_vec(), ids[4..5].to_vec())
    );
    assert_eq!(n3, None);
}

#[test]
fn purge_and_delete_remove_tasks() {
    let mut h = Harness::new();
    h.create("jobs", QueuePatch::default());
    let leased = h.enqueue("jobs", "1");
    h.enqueue("jobs", "2");
    h.enqueue("jobs", "3");
    let mut t = NewTask::new(raw("4"));
    t.delay_ms = Some(1000);
    h.enqueue_task("jobs", t);
    assert_eq!(h.claim_one("jobs").0, leased);
    match h
        .call(EngineRequest::QueuePurge(ops::QueuePurge(QueueName {
            queue: "jobs".into(),
        })))
        .unwrap()
    {
        Reply::Count(c) => assert_eq!(c.count, 3),
        other => panic!("{other:?}"),
    }
    assert_eq!(h.counts("jobs"), [0, 0, 1, 0, 0, 0, 0]);
    match h
        .call(EngineRequest::QueueDelete(ops::QueueDelete(QueueName {
            queue: "jobs".into(),
        })))
        .unwrap()
    {
        Reply::Count(c) => assert_eq!(c.count, 1),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        h.code(EngineRequest::QueueDescribe(ops::QueueDescribe(
            QueueName {
                queue: "jobs".into()
            }
        ))),
        ErrorCode::NotFound
    );
    h.restart(0);
    match h
        .call(EngineRequest::QueueList(ops::QueueList::default()))
        .unwrap()
    {
        Reply::QueueList(l) => assert!(l.queues.is_empty()),
        other => panic!("{other:?}"),
    }
}

#[test]
fn bad_requests_are_refused_with_their_codes_and_change_nothing() {
    let mut h = Harness::new();
    assert_eq!(
        h.code(EngineRequest::QueueCreate(QueueCreate {
            queue: "Bad Name".into(),
            options: QueuePatch::default()
        })),
        ErrorCode::BadRequest
    );
    h.create("jobs", QueuePatch::default());
    assert_eq!(
        h.code(EngineRequest::QueueCreate(QueueCreate {
            queue: "jobs".into(),
            options: QueuePatch::default()
        })),
        ErrorCode::AlreadyExists
    );
    assert_eq!(
        h.code(EngineRequest::QueueCreate(QueueCreate {
            queue: "x".into(),
            options: QueuePatch {
                lease_ms: Some(1),
                ..QueuePatch::default()
            }
        })),
        ErrorCode::BadRequest
    );
    let big = format!(
        "\"{}\"",
        "x".repeat(muster_protocol::limits::MAX_PAYLOAD_BYTES)
    );
    let enqueue = |tasks| {
        EngineRequest::Enqueue(Enqueue {
            queue: "jobs".into(),
            tasks,
        })
    };
    assert_eq!(
        h.code(enqueue(vec![
            NewTask::new(raw("1")),
            NewTask::new(raw(&big))
        ])),
        ErrorCode::TooLarge
    );
    assert_eq!(h.code(enqueue(vec![])), ErrorCode::BadRequest);
    assert_eq!(
        h.code(enqueue((0..1001).map(|_| NewTask::new(raw("1"))).collect())),
        ErrorCode::TooLarge
    );
    let mut bad_priority = NewTask::new(raw("1"));
    bad_priority.priority = Some(10);
    assert_eq!(h.code(enqueue(vec![bad_priority])), ErrorCode::BadRequest);
    assert_eq!(
        h.code(EngineRequest::Enqueue(Enqueue {
            queue: "nope".into(),
            tasks: vec![NewTask::new(raw("1"))]
        })),
        ErrorCode::NotFound
    );
    assert_eq!(h.code(ack("not-a-ulid", 1)), ErrorCode::BadRequest);
    assert_eq!(
        h.code(ack("01JDQ8Z9M4X6K2V7N3B5C8D1EF", 1)),
        ErrorCode::NotFound
    );
    let claim = |max, wait| EngineRequest::Claim(Claim::new(["jobs"]).max(max).wait_ms(wait));
    assert_eq!(h.code(claim(0, 0)), ErrorCode::BadRequest);
    assert_eq!(h.code(claim(1001, 0)), ErrorCode::BadRequest);
    assert_eq!(h.code(claim(1, 300_001)), ErrorCode::BadRequest);
    assert_eq!(h.counts("jobs"), [0, 0, 0, 0, 0, 0, 0]);
}

#[test]
fn leases_survive_a_restart_with_a_fresh_period_and_old_claims_still_settle() {
    let mut h = Harness::new();
    let (id, e) = claimed_with_lease(&mut h, 10_000);
    h.advance(9_000);
    // Down for a minute: by wall time the lease ran out long ago.
    h.restart(60_000);
    assert_eq!(h.state(&id), (TaskState::Leased, 1, 0));
    let expires = h.task(&id).lease.unwrap().expires_ms;
    assert_eq!(expires, h.now.wall_ms + 10_000);
    h.advance(9_999);
    assert_eq!(h.state(&id).0, TaskState::Leased);
    h.call(renew(&id, e)).unwrap();
    h.advance(9_999);
    h.call(ack(&id, e)).unwrap();
    assert_eq!(h.state(&id), (TaskState::Done, 1, 0));
}

/// Sends a request that succeeds and runs its round; returns whether the round wrote
/// the store (and so waits for an fsync before its replies).
fn writes(h: &mut Harness, req: EngineRequest) -> bool {
    let reply = h.call(req);
    assert!(reply.is_ok(), "{reply:?}");
    h.wrote
}

#[test]
fn a_plain_renewal_is_kept_in_memory_and_a_restart_still_honours_its_deadline() {
    let mut h = Harness::new();
    let (id, e) = claimed_with_lease(&mut h, 10_000);
    let granted_expiry = h.task(&id).lease.unwrap().expires_ms;
    h.advance(6_000);
    // No progress, no extension past one lease period: nothing to write.
    assert!(!writes(&mut h, renew(&id, e)));
    let told = h.now.wall_ms + 10_000;
    assert_eq!(h.task(&id).lease.unwrap().expires_ms, told);
    // The old deadline passes and the lease holds: the in-memory deadline rules.
    h.advance(5_000);
    assert_eq!(h.state(&id), (TaskState::Leased, 1, 0));
    // A crash loses the renewal (the store still has the grant's expiry, now past),
    // and the restart gives a full period from then: past what the holder was told.
    h.restart(1_000);
    let restored = h.task(&id).lease.unwrap().expires_ms;
    assert!(
        granted_expiry < told && told <= restored,
        "{granted_expiry} {told} {restored}"
    );
    assert_eq!(restored, h.now.wall_ms + 10_000);

    // Progress is written, and so is an extension past one lease period.
    let with_progress = renew_with(&id, e, None, Some(r#"{"step":1}"#));
    assert!(writes(&mut h, with_progress));
    assert!(writes(&mut h, renew_with(&id, e, Some(10_001), None)));
    let shorter = renew_with(&id, e, Some(2_000), None);
    // The stored expiry is the extension's, more than a period away: a restart would
    // keep the lease that long, so shortening it is written.
    assert!(writes(&mut h, shorter));
    assert!(!writes(&mut h, renew(&id, e)));
    let told = h.now.wall_ms + 10_000;

    // Shortening the queue's lease period writes the renewals kept in memory: a
    // restart now gives only the shorter period, which would end them early.
    let shorten = EngineRequest::QueueUpdate(ops::QueueUpdate {
        queue: "jobs".into(),
        options: QueuePatch {
            lease_ms: Some(1_000),
            ..QueuePatch::default()
        },
    });
    assert!(writes(&mut h, shorten));
    h.restart(0);
    assert_eq!(h.task(&id).lease.unwrap().expires_ms, told);
    assert_eq!(h.task(&id).progress.unwrap().get(), r#"{"step":1}"#);
    h.call(ack(&id, e)).unwrap();
    assert_eq!(h.state(&id), (TaskState::Done, 1, 0));

    // A claim for longer than the queue's period: its first plain renewal shortens
    // the lease and is written, so a restart (its holder gone with the host) does not
    // hold the task for the claim's hour.
    let id = h.enqueue("jobs", "2");
    let req = EngineRequest::Claim(Claim::new(["jobs"]).lease_ms(3_600_000));
    let e = match h.call(req).unwrap() {
        Reply::Claim(c) => c.tasks[0].epoch,
        other => panic!("{other:?}"),
    };
    assert!(writes(&mut h, renew(&id, e)));
    assert!(!writes(&mut h, renew(&id, e)));
    h.restart(0);
    assert_eq!(h.task(&id).lease.unwrap().expires_ms, h.now.wall_ms + 1_000);
}

#[test]
fn state_after_a_restart_equals_state_before_it() {
    let mut h = Harness::new();
    h.create("jobs", no_jitter(2));
    h.create(
        "other",
        QueuePatch {
            key_concurrency: Some(2),
            ..QueuePatch::default()
        },
    );
    let ids: Vec<String> = (0..6).map(|i| h.enqueue("jobs", &i.to_string())).collect();
    h.enqueue("other", "7");
    let (a, ea) = h.claim_one("jobs");
    h.call(ack(&a, ea)).unwrap();
    let (b, eb) = h.claim_one("jobs");
    h.call(nack(&b, eb, None)).unwrap();
    let (c, ec) = h.claim_one("jobs");
    h.call(dead_letter(&c, ec)).unwrap();
    h.claim_one("jobs");
    h.call(EngineRequest::Cancel(Cancel {
        task: ids[5].clone(),
        if_state: None,
    }))
    .unwrap();
    let snapshot = |h: &mut Harness| {
        let tasks: Vec<String> = ids
            .iter()
            .map(|id| serde_json::to_string(&h.task(id)).unwrap())
            .collect();
        let queues = match h
            .call(EngineRequest::QueueList(ops::QueueList::default()))
            .unwrap()
        {
            // Totals count since the daemon started: everything else must survive.
            Reply::QueueList(mut l) => {
                for q in &mut l.queues {
                    q.totals = Default::default();
                }
                serde_json::to_string(&l.queues).unwrap()
            }
            other => panic!("{other:?}"),
        };
        (tasks, queues)
    };
    let before = snapshot(&mut h);
    h.restart(0);
    assert_eq!(snapshot(&mut h), before);
    // New ids keep growing after a restart.
    let newer = h.enqueue("jobs", "8");
    assert!(newer > ids[5], "{newer} after {}", ids[5]);
}

#[test]
fn a_retention_change_applies_to_tasks_already_finished() {
    let mut h = Harness::new();
    h.create(
        "jobs",
        QueuePatch {
            retention_ms: Some(3_600_000),
            ..QueuePatch::default()
        },
    );
    let id = h.enqueue("jobs", "1");
    let (_, e) = h.claim_one("jobs");
    h.call(ack(&id, e)).unwrap();
    h.advance(1000);
    h.call(EngineRequest::QueueUpdate(ops::QueueUpdate {
        queue: "jobs".into(),
        options: QueuePatch {
            retention_ms: Some(5000),
            ..QueuePatch::default()
        },
    }))
    .unwrap();
    h.advance(3999);
    assert_eq!(h.counts("jobs"), [0, 0, 0, 1, 0, 0, 0]);
    h.advance(1);
    assert_eq!(h.counts("jobs"), [0, 0, 0, 0, 0, 0, 0]);
}

#[test]
fn jitter_never_takes_a_delay_past_the_cap() {
    let mut h = Harness::new();
    let patch = QueuePatch {
        max_attempts: Some(0),
        retry_backoff: Some(Backoff {
            base_ms: 1000,
            factor: 1.0,
            cap_ms: 1000,
            jitter: 1.0,
        }),
        ..QueuePatch::default()
    };
    h.create("jobs", patch);
    let id = h.enqueue("jobs", "1");
    for _ in 0..20 {
        let (_, e) = h.claim_one("jobs");
        let at = h.now.wall_ms;
        let delay = match h.call(nack(&id, e, None)).unwrap() {
            Reply::Settle(s) => s.not_before_ms.map_or(0, |nb| nb - at),
            other => panic!("{other:?}"),
        };
        assert!(delay <= 1000, "delay {delay} past the cap");
        h.advance(1000);
    }
}

#[test]
fn renew_after_max_runtime_is_lease_lost() {
    let mut h = Harness::new();
    h.create(
        "jobs",
        QueuePatch {
            lease_ms: Some(5000),
            max_runtime_ms: Some(1000),
            ..QueuePatch::default()
        },
    );
    let id = h.enqueue("jobs", "1");
    let (_, e) = h.claim_one("jobs");
    h.advance(999);
    assert_eq!(h.state(&id).0, TaskState::Leased);
    h.advance(1);
    assert_eq!(h.state(&id), (TaskState::Ready, 1, 1));
    assert_eq!(h.code(renew(&id, e)), ErrorCode::LeaseLost);
}

#[test]
fn a_wait_ends_when_its_task_is_removed() {
    let mut h = Harness::new();
    h.create("jobs", QueuePatch::default());
    let id = h.enqueue("jobs", "1");
    let waiting = h.send(EngineRequest::Wait(Wait {
        tasks: vec![id.clone()],
        timeout_ms: Some(60_000),
    }));
    assert!(h.reply_for(waiting).is_none());
    h.call(EngineRequest::QueuePurge(ops::QueuePurge(QueueName {
        queue: "jobs".into(),
    })))
    .unwrap();
    match h.reply_for(waiting).unwrap().unwrap() {
        Reply::Wait(w) => assert_eq!(
            (w.finished.len(), w.pending.len(), w.removed),
            (0, 0, vec![id])
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_claim_reply_stops_growing_past_its_byte_budget() {
    let mut h = Harness::new();
    h.create("big", QueuePatch::default());
    let payload = format!("\"{}\"", "x".repeat(900 * 1024));
    for _ in 0..5 {
        h.enqueue("big", &payload);
    }
    // 900 KiB each: the third crosses 2 MiB, so the reply stops there.
    assert_eq!(h.claim_as("big", 5, "m").len(), 3);
    assert_eq!(h.counts("big"), [0, 2, 3, 0, 0, 0, 0]);
}

fn open(member: &str, capacity: u32, reclaim: bool, resume: bool) -> EngineRequest {
    EngineRequest::SessionOpen(ops::SessionOpen {
        member: member.into(),
        labels: Vec::new(),
        capacity,
        reclaim,
        resume,
        held: None,
        liveness_ms: None,
    })
}

fn subscribe(member: &str, queues: &[&str]) -> EngineRequest {
    EngineRequest::Subscribe(ops::Subscribe {
        member: member.into(),
        queues: queues.iter().map(|q| (*q).to_owned()).collect(),
    })
}

#[test]
fn consumers_are_subscribed_sessions_and_parked_claims() {
    let mut h = Harness::new();
    h.create("jobs", QueuePatch::default());
    h.create("other", QueuePatch::default());
    let consumers = |h: &mut Harness, queue: &str| match h
        .call(EngineRequest::QueueDescribe(ops::QueueDescribe(
            QueueName {
                queue: queue.into(),
            },
        )))
        .unwrap()
    {
        Reply::Queue(r) => r.queue.consumers,
        other => panic!("{other:?}"),
    };
    assert_eq!(consumers(&mut h, "jobs"), 0);
    h.call_on(1, open("a", 1, false, false)).unwrap();
    assert_eq!(
        consumers(&mut h, "jobs"),
        0,
        "a session alone takes nothing"
    );
    h.call_on(1, subscribe("a", &["jobs"])).unwrap();
    assert_eq!(consumers(&mut h, "jobs"), 1);
    assert_eq!(consumers(&mut h, "other"), 0);
    // A claim parked on a queue counts while it waits.
    let parked = h.send_on(
        2,
        EngineRequest::Claim(Claim::new(["jobs", "other"]).wait_ms(10_000)),
    );
    assert_eq!(
        h.reply_for(parked).map(|r| r.is_ok()),
        None,
        "still waiting"
    );
    assert_eq!(
        (consumers(&mut h, "jobs"), consumers(&mut h, "other")),
        (2, 1)
    );
    h.advance(10_000);
    assert!(h.reply_for(parked).is_some());
    // A draining member takes nothing new.
    h.call(EngineRequest::MemberDrain(ops::MemberDrain(
        ops::MemberName { member: "a".into() },
    )))
    .unwrap();
    assert_eq!(consumers(&mut h, "jobs"), 0);
}

fn delivered(pushes: &[Push]) -> Vec<(String, u64, bool)> {
    pushes
        .iter()
        .filter_map(|p| match p {
            Push::Deliver(d) => Some((d.id.clone(), d.attempt, d.reclaimed)),
            _ => None,
        })
        .collect()
}

/// A member on connection 1 that holds three tasks, two of them with progress.
fn member_holding_three(h: &mut Harness) -> Vec<String> {
    h.create("jobs", QueuePatch::default());
    let ids: Vec<String> = (0..3).map(|i| h.enqueue("jobs", &i.to_string())).collect();
    h.call_on(1, open("gpu-3/agent-7", 3, false, false))
        .unwrap();
    let got = h.claim_as("jobs", 3, "gpu-3/agent-7");
    assert_eq!(got.iter().map(|t| t.0.clone()).collect::<Vec<_>>(), ids);
    for id in &ids[..2] {
        h.call(renew_with(id, 1, None, Some(r#"{"step":5}"#)))
            .unwrap();
    }
    ids
}

#[test]
fn a_restarted_member_reclaims_its_tasks_at_once_with_progress() {
    let mut h = Harness::new();
    let ids = member_holding_three(&mut h);
    // The agent process restarts: a new connection, a new session with reclaim.
    let reply = match h.call_on(2, open("gpu-3/agent-7", 3, true, false)).unwrap() {
        Reply::SessionOpen(r) => r,
        other => panic!("{other:?}"),
    };
    let got: Vec<_> = reply
        .reclaimed
        .iter()
        .map(|d| (d.id.clone(), d.epoch, d.attempt, d.reclaimed))
        .collect();
    assert_eq!(
        got,
        ids.iter()
            .map(|id| (id.clone(), 2, 2, true))
            .collect::<Vec<_>>()
    );
    let progress: Vec<_> = reply
        .reclaimed
        .iter()
        .map(|d| d.progress.as_ref().map(|p| p.get().to_owned()))
        .collect();
    assert_eq!(
        progress,
        vec![
            Some(r#"{"step":5}"#.to_owned()),
            Some(r#"{"step":5}"#.to_owned()),
            None
        ]
    );
    // A fresh full lease (30 s), not what was left of the old one.
    assert_eq!(reply.reclaimed[0].lease_expires_ms, h.now.wall_ms + 30_000);
    let t = h.task(&ids[0]);
    assert_eq!(
        (t.state, t.deliveries, t.failures),
        (TaskState::Leased, 2, 1)
    );
    assert_eq!(t.history.last().unwrap().event, "reclaimed");
    // The claims of the dead process are fenced off.
    assert_eq!(h.code(ack(&ids[0], 1)), ErrorCode::LeaseLost);
    h.call(ack(&ids[0], 2)).unwrap();
}

#[test]
fn a_session_without_reclaim_releases_and_with_resume_keeps() {
    let mut h = Harness::new();
    let ids = member_holding_three(&mut h);
    match h.call_on(1, open("gpu-3/agent-7", 3, false, true)).unwrap() {
        Reply::SessionOpen(r) => assert_eq!((r.reclaimed.len(), r.kept, r.released), (0, 3, 0)),
        other => panic!("{other:?}"),
    }
    assert_eq!(h.state(&ids[0]), (TaskState::Leased, 1, 0));
    match h
        .call_on(2, open("gpu-3/agent-7", 3, false, false))
        .unwrap()
    {
        Reply::SessionOpen(r) => assert_eq!((r.reclaimed.len(), r.kept, r.released), (0, 0, 3)),
        other => panic!("{other:?}"),
    }
    for id in &ids {
        assert_eq!(h.state(id), (TaskState::Ready, 1, 0));
    }
    assert_eq!(h.code(open("x", 1, true, true)), ErrorCode::BadRequest);
    assert_eq!(h.code(open("x", 0, false, false)), ErrorCode::BadRequest);
    assert_eq!(
        h.code(open("bad name", 1, false, false)),
        ErrorCode::BadRequest
    );
}

fn resume_naming(member: &str, held: Vec<ops::LeaseRef>) -> EngineRequest {
    match open(member, 3, false, true) {
        EngineRequest::SessionOpen(o) => EngineRequest::SessionOpen(ops::SessionOpen {
            held: Some(held),
            ..o
        }),
        other => unreachable!("{other:?}"),
    }
}

fn lease_ref(task: &str, epoch: u64) -> ops::LeaseRef {
    ops::LeaseRef {
        task: task.into(),
        epoch,
    }
}

#[test]
fn a_resumed_session_gets_the_leases_its_agent_never_heard_of_without_a_failure() {
    let mut h = Harness::new();
    let ids = member_holding_three(&mut h);
    // The agent knows the first two (the third's grant was lost with its connection)
    // and names an epoch of the second that is not the held one, and a task it does
    // not hold at all: neither changes anything.
    let other = h.enqueue("jobs", "9");
    let held = vec![
        lease_ref(&ids[0], 1),
        lease_ref(&ids[1], 1),
        lease_ref(&ids[1], 7),
        lease_ref(&other, 1),
    ];
    let before = h.now.wall_ms;
    let reply = match h.call_on(2, resume_naming("gpu-3/agent-7", held)).unwrap() {
        Reply::SessionOpen(r) => r,
        other => panic!("{other:?}"),
    };
    assert_eq!((reply.kept, reply.released, reply.dead), (2, 0, 0));
    let got: Vec<_> = reply
        .reclaimed
        .iter()
        .map(|d| (d.id.clone(), d.epoch, d.attempt, d.failures, d.reclaimed))
        .collect();
    assert_eq!(got, vec![(ids[2].clone(), 2, 2, 0, false)]);
    assert_eq!(reply.reclaimed[0].lease_expires_ms, before + 30_000);
    assert_eq!(h.state(&ids[0]), (TaskState::Leased, 1, 0));
    assert_eq!(h.state(&ids[2]), (TaskState::Leased, 2, 0));
    assert_eq!(h.state(&other), (TaskState::Ready, 0, 0));
    assert_eq!(h.task(&ids[2]).history.last().unwrap().event, "redelivered");
    // The unheard-of epoch is fenced off; the kept and the new ones settle.
    assert_eq!(h.code(ack(&ids[2], 1)), ErrorCode::LeaseLost);
    h.call(ack(&ids[2], 2)).unwrap();
    h.call(ack(&ids[0], 1)).unwrap();
}

#[test]
fn a_bad_held_list_is_refused_and_changes_nothing() {
    let mut h = Harness::new();
    let ids = member_holding_three(&mut h);
    let too_many = vec![lease_ref(&ids[0], 1); MAX_RESUME_HELD + 1];
    let not_an_id = vec![lease_ref("nope", 1)];
    for bad in [
        resume_naming("gpu-3/agent-7", too_many),
        resume_naming("gpu-3/agent-7", not_an_id),
        match resume_naming("gpu-3/agent-7", Vec::new()) {
            EngineRequest::SessionOpen(o) => {
                EngineRequest::SessionOpen(ops::SessionOpen { resume: false, ..o })
            }
            other => unreachable!("{other:?}"),
        },
    ] {
        assert_eq!(
            h.call_on(2, bad).map(|_| ()).unwrap_err().code,
            ErrorCode::BadRequest
        );
    }
    for id in &ids {
        assert_eq!(h.state(id), (TaskState::Leased, 1, 0));
    }
    // The session is still the first connection's.
    h.call_on(1, subscribe("gpu-3/agent-7", &["jobs"])).unwrap();
}

#[test]
fn a_second_session_takes_over_and_the_first_is_told_replaced() {
    let mut h = Harness::new();
    h.create("jobs", QueuePatch::default());
    h.call_on(1, open("agent", 1, false, false)).unwrap();
    h.call_on(2, open("agent", 1, false, true)).unwrap();
    match h.pushed(1).as_slice() {
        [Push::Closed(e)] => assert_eq!(e.code, ErrorCode::Replaced),
        other => panic!("{other:?}"),
    }
    // The old connection no longer owns the session.
    assert_eq!(
        h.call_on(1, subscribe("agent", &["jobs"]))
            .unwrap_err()
            .code,
        ErrorCode::BadRequest
    );
    h.call_on(2, subscribe("agent", &["jobs"])).unwrap();
}

#[test]
fn pushes_follow_capacity_and_go_to_whoever_is_free() {
    let mut h = Harness::new();
    h.create("jobs", QueuePatch::default());
    for (conn, name) in [(1, "a"), (2, "b")] {
        h.call_on(conn, open(name, 2, false, false)).unwrap();
        h.call_on(conn, subscribe(name, &["jobs"])).unwrap();
    }
    let ids: Vec<String> = (0..6).map(|i| h.enqueue("jobs", &i.to_string())).collect();
    let a = delivered(&h.pushed(1));
    let b = delivered(&h.pushed(2));
    assert_eq!((a.len(), b.len()), (2, 2), "a {a:?} b {b:?}");
    let mut first_four: Vec<String> = a.iter().chain(&b).map(|d| d.0.clone()).collect();
    first_four.sort();
    assert_eq!(first_four, ids[..4].to_vec());
    // b finishes one task: the next ready task goes to b, the member with room.
    h.call(ack(&b[0].0, 1)).unwrap();
    assert_eq!(delivered(&h.pushed(2)), vec![(ids[4].clone(), 1, false)]);
    assert!(h.pushed(1).is_empty());
    // Pull claims keep working beside pushes.
    assert_eq!(h.claim_as("jobs", 5, "cli").len(), 1);
}

#[test]
fn labels_changed_during_a_session_take_effect_for_the_next_push() {
    let mut h = Harness::new();
    h.create("jobs", QueuePatch::default());
    let mut t = NewTask::new(raw("1"));
    t.requires = vec!["gpu".into()];
    let id = h.enqueue_task("jobs", t);
    h.call_on(1, open("m", 1, false, false)).unwrap();
    h.call_on(1, subscribe("m", &["jobs"])).unwrap();
    assert!(h.pushed(1).is_empty());
    let update = EngineRequest::SessionUpdate(ops::SessionUpdate {
        member: "m".into(),
        labels: Some(vec!["gpu".into()]),
        capacity: None,
    });
    h.call_on(1, update).unwrap();
    assert_eq!(delivered(&h.pushed(1)), vec![(id, 1, false)]);
}

#[test]
fn cancel_drain_and_revoke_reach_the_holder() {
    let mut h = Harness::new();
    h.create("jobs", QueuePatch::default());
    let a = h.enqueue("jobs", "1");
    let b = h.enqueue("jobs", "2");
    h.call_on(1, open("m", 2, false, false)).unwrap();
    h.call_on(1, subscribe("m", &["jobs"])).unwrap();
    assert_eq!(delivered(&h.pushed(1)).len(), 2);
    h.call(EngineRequest::Cancel(Cancel {
        task: a.clone(),
        if_state: None,
    }))
    .unwrap();
    match h.pushed(1).as_slice() {
        [Push::Cancel(l)] => assert_eq!((l.task.as_str(), l.epoch), (a.as_str(), 1)),
        other => panic!("{other:?}"),
    }
    match h
        .call(EngineRequest::LeaseRevoke(ops::LeaseRevoke {
            task: b.clone(),
        }))
        .unwrap()
    {
        Reply::Settle(s) => assert_eq!(s.state, TaskState::Ready),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        h.state(&b),
        (TaskState::Ready, 1, 1),
        "not handed straight back to the member it was revoked from"
    );
    match h.pushed(1).as_slice() {
        [Push::Revoked(l)] => assert_eq!((l.task.as_str(), l.epoch), (b.as_str(), 1)),
        other => panic!("{other:?}"),
    }
    // Heard from after the revoke, and the only member: it may have the task again.
    let now = h.now;
    h.engine().heard(1, now);
    h.round();
    assert_eq!(h.state(&b), (TaskState::Leased, 2, 1));
    assert_eq!(delivered(&h.pushed(1)), vec![(b.clone(), 2, false)]);
    // Drained: told so, keeps its leases, takes nothing new by push or pull.
    match h
        .call(EngineRequest::MemberDrain(ops::MemberDrain(
            ops::MemberName { member: "m".into() },
        )))
        .unwrap()
    {
        Reply::Member(m) => assert_eq!((m.member.draining, m.member.leased), (true, 2)),
        other => panic!("{other:?}"),
    }
    assert_eq!(h.pushed(1).len(), 1);
    h.call(ack(&b, 2)).unwrap();
    h.enqueue("jobs", "3");
    assert!(h.pushed(1).is_empty());
    assert!(h.claim_as("jobs", 1, "m").is_empty());
    match h
        .call(EngineRequest::MemberList(ops::MemberList::default()))
        .unwrap()
    {
        Reply::MemberList(l) => {
            let m = &l.members[0];
            assert_eq!(
                (m.name.as_str(), m.leased, m.connected, m.draining),
                ("m", 1, true, true)
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn reclaim_past_max_attempts_sends_the_task_to_dead() {
    let mut h = Harness::new();
    h.create(
        "jobs",
        QueuePatch {
            max_attempts: Some(1),
            ..QueuePatch::default()
        },
    );
    let id = h.enqueue("jobs", "1");
    h.call_on(1, open("m", 1, false, false)).unwrap();
    h.claim_as("jobs", 1, "m");
    match h.call_on(2, open("m", 1, true, false)).unwrap() {
        Reply::SessionOpen(r) => assert_eq!((r.reclaimed.len(), r.dead), (0, 1)),
        other => panic!("{other:?}"),
    }
    let t = h.task(&id);
    assert_eq!(
        (t.state, t.dead_reason.as_deref()),
        (TaskState::Dead, Some("max_attempts"))
    );
}

#[test]
fn one_connection_holds_one_member_session() {
    let mut h = Harness::new();
    h.call_on(1, open("a", 1, false, false)).unwrap();
    assert_eq!(
        h.call_on(1, open("b", 1, false, false)).unwrap_err().code,
        ErrorCode::BadRequest
    );
    // The same member may open its session again on its own connection.
    h.call_on(1, open("a", 2, false, true)).unwrap();
}

#[test]
fn a_reconnecting_member_stays_drained_and_a_restarted_one_does_not() {
    let mut h = Harness::new();
    h.create("jobs", QueuePatch::default());
    h.call_on(1, open("m", 1, false, false)).unwrap();
    h.call(EngineRequest::MemberDrain(ops::MemberDrain(
        ops::MemberName { member: "m".into() },
    )))
    .unwrap();
    h.engine().disconnected(1);
    h.call_on(2, open("m", 1, false, true)).unwrap();
    h.enqueue("jobs", "1");
    assert!(
        h.claim_as("jobs", 1, "m").is_empty(),
        "resume keeps the drain"
    );
    h.call_on(3, open("m", 1, true, false)).unwrap();
    assert_eq!(
        h.claim_as("jobs", 1, "m").len(),
        1,
        "a fresh start clears it"
    );
}

#[test]
fn an_undrained_member_takes_work_again_and_one_known_only_for_its_drain_is_forgotten() {
    let mut h = Harness::new();
    h.create("jobs", QueuePatch::default());
    let undrain = |member: &str| {
        EngineRequest::MemberUndrain(ops::MemberUndrain(ops::MemberName {
            member: member.into(),
        }))
    };
    let drain = |member: &str| {
        EngineRequest::MemberDrain(ops::MemberDrain(ops::MemberName {
            member: member.into(),
        }))
    };
    h.call_on(1, open("m", 1, false, false)).unwrap();
    h.call(drain("m")).unwrap();
    h.enqueue("jobs", "1");
    assert!(h.claim_as("jobs", 1, "m").is_empty(), "drained");
    match h.call(undrain("m")).unwrap() {
        Reply::Member(m) => assert_eq!((m.member.name.as_str(), m.member.draining), ("m", false)),
        other => panic!("{other:?}"),
    }
    assert_eq!(h.claim_as("jobs", 1, "m").len(), 1, "served again");
    // Again: nothing to undrain, nothing changes.
    match h.call(undrain("m")).unwrap() {
        Reply::Member(m) => assert_eq!((m.member.draining, m.member.leased), (false, 1)),
        other => panic!("{other:?}"),
    }
    // A member with no session and no lease is kept only while drained.
    h.call_on(2, open("gone", 1, false, false)).unwrap();
    h.call(drain("gone")).unwrap();
    h.engine().disconnected(2);
    h.round();
    let describe = |member: &str| {
        EngineRequest::MemberDescribe(ops::MemberDescribe(ops::MemberName {
            member: member.into(),
        }))
    };
    h.call(describe("gone")).unwrap();
    h.call(undrain("gone")).unwrap();
    assert_eq!(
        h.call(describe("gone")).unwrap_err().code,
        ErrorCode::NotFound
    );
    assert_eq!(
        h.call(undrain("nobody")).unwrap_err().code,
        ErrorCode::NotFound
    );
}

#[test]
fn a_cancel_requested_task_is_cancelled_not_handed_back_on_reclaim_or_release() {
    let mut h = Harness::new();
    h.create("jobs", QueuePatch::default());
    let a = h.enqueue("jobs", "1");
    h.call_on(1, open("m", 2, false, false)).unwrap();
    h.claim_as("jobs", 1, "m");
    h.call(EngineRequest::Cancel(Cancel {
        task: a.clone(),
        if_state: None,
    }))
    .unwrap();
    match h.call_on(2, open("m", 2, true, false)).unwrap() {
        Reply::SessionOpen(r) => assert_eq!((r.reclaimed.len(), r.released), (0, 1)),
        other => panic!("{other:?}"),
    }
    assert_eq!(h.state(&a), (TaskState::Cancelled, 1, 0));
}

/// A session opened while a queue it holds leases in is being deleted (a delete of
/// several slices): the open succeeds, and the leases it would hand back (reclaim, or
/// a resume's lease its agent never heard of) are released instead, without a
/// failure: nothing more is leased from that queue, and the task goes with it. A lease
/// a resume keeps stays kept.
#[test]
fn a_session_open_during_a_queue_delete_releases_the_leases_it_would_hand_back() {
    let mut h = Harness::new();
    h.create("jobs", QueuePatch::default());
    let held: Vec<String> = (0..3).map(|i| h.enqueue("jobs", &i.to_string())).collect();
    for (i, member) in ["m", "r", "k"].into_iter().enumerate() {
        h.call_on(i as u64 + 1, open(member, 3, false, false))
            .unwrap();
        assert_eq!(h.claim_as("jobs", 1, member)[0], (held[i].clone(), 1, 1));
    }
    for _ in 0..4 {
        let tasks = (0..1000)
            .map(|i| NewTask::new(raw(&i.to_string())))
            .collect();
        let batch = Enqueue {
            queue: "jobs".into(),
            tasks,
        };
        h.call(EngineRequest::Enqueue(batch)).unwrap();
    }
    // The delete removes 250 tasks a round, the 4,000 ready ones first: the leased
    // ones wait 16 rounds.
    let delete = h.send(EngineRequest::QueueDelete(ops::QueueDelete(QueueName {
        queue: "jobs".into(),
    })));
    assert!(h.reply_for(delete).is_none(), "the delete takes 17 slices");
    h.pushed(1);
    h.pushed(2);

    // m's agent restarts and reclaims; r's reconnects knowing of no lease; k's
    // reconnects knowing its lease.
    let opened = |h: &mut Harness, conn: u64, req: EngineRequest| match h.call_on(conn, req) {
        Ok(Reply::SessionOpen(r)) => (r.reclaimed.len(), r.released, r.kept, r.dead),
        other => panic!("session_open: {other:?}"),
    };
    assert_eq!(opened(&mut h, 11, open("m", 3, true, false)), (0, 1, 0, 0));
    assert_eq!(
        opened(&mut h, 12, resume_naming("r", Vec::new())),
        (0, 1, 0, 0)
    );
    assert_eq!(
        opened(&mut h, 13, resume_naming("k", vec![lease_ref(&held[2], 1)])),
        (0, 0, 1, 0)
    );
    // The old sessions were taken over, as for any session open.
    for conn in [1, 2] {
        match h.pushed(conn).as_slice() {
            [Push::Closed(e)] => assert_eq!(e.code, ErrorCode::Replaced),
            other => panic!("connection {conn}: {other:?}"),
        }
    }
    for (i, member) in ["m", "r"].into_iter().enumerate() {
        let t = h.task(&held[i]);
        assert_eq!(
            (t.state, t.deliveries, t.failures),
            (TaskState::Ready, 1, 0)
        );
        let last = t.history.last().unwrap();
        assert_eq!(
            (last.event.as_str(), last.member.as_deref(), last.epoch),
            ("released", Some(member), Some(1))
        );
        let info = member_info(&mut h, member);
        assert_eq!((info.leased, info.connected), (0, true));
    }
    assert_eq!(h.state(&held[2]), (TaskState::Leased, 1, 0));
    assert_eq!(member_info(&mut h, "k").leased, 1);
    // Nothing is leased from the queue meanwhile.
    assert!(h.pushed(11).is_empty() && h.pushed(12).is_empty());

    assert!(
        h.reply_for(delete).is_none(),
        "the delete is still under way"
    );
    // The last slices remove the rest, the released tasks and the kept lease with them.
    let mut rounds = 0;
    let deleted = loop {
        if let Some(reply) = h.reply_for(delete) {
            break reply;
        }
        rounds += 1;
        assert!(rounds <= 17, "the delete ends within its slices");
        h.round();
    };
    match deleted {
        Ok(Reply::Count(c)) => assert_eq!(c.count, 4003),
        other => panic!("queue_delete: {other:?}"),
    }
    for id in &held {
        let refused = h.call(EngineRequest::TaskGet(TaskGet { task: id.clone() }));
        assert_eq!(refused.unwrap_err().code, ErrorCode::NotFound);
    }
    assert_eq!(member_info(&mut h, "k").leased, 0);
    assert_eq!(h.code(ack(&held[2], 1)), ErrorCode::NotFound);
}

#[test]
fn a_member_whose_connection_ends_without_leases_is_forgotten() {
    let mut h = Harness::new();
    h.create("jobs", QueuePatch::default());
    h.call_on(1, open("idle", 1, false, false)).unwrap();
    h.call_on(2, open("busy", 1, false, false)).unwrap();
    h.enqueue("jobs", "1");
    h.claim_as("jobs", 1, "busy");
    h.engine().disconnected(1);
    h.engine().disconnected(2);
    match h
        .call(EngineRequest::MemberList(ops::MemberList::default()))
        .unwrap()
    {
        Reply::MemberList(l) => {
            let names: Vec<_> = l
                .members
                .iter()
                .map(|m| (m.name.as_str(), m.connected, m.leased))
                .collect();
            assert_eq!(names, [("busy", false, 1)]);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn queue_list_pages_by_name() {
    let mut h = Harness::new();
    for name in ["c", "a", "b", "d", "e"] {
        h.create(name, QueuePatch::default());
    }
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let req = EngineRequest::QueueList(ops::QueueList {
            after: after.clone(),
            limit: Some(2),
        });
        match h.call(req).unwrap() {
            Reply::QueueList(l) => {
                assert!(l.queues.len() <= 2);
                seen.extend(l.queues.into_iter().map(|q| q.name));
                match l.next {
                    Some(next) => after = Some(next),
                    None => break,
                }
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(seen, ["a", "b", "c", "d", "e"]);
    let e = h
        .call(EngineRequest::QueueList(ops::QueueList {
            after: None,
            limit: Some(0),
        }))
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::BadRequest);
}

#[test]
fn a_deleted_queue_stays_subscribed_and_serves_again_when_created_again() {
    let mut h = Harness::new();
    h.create("a", QueuePatch::default());
    h.create("b", QueuePatch::default());
    h.call_on(1, open("m", 1, false, false)).unwrap();
    h.call_on(1, subscribe("m", &["a", "b"])).unwrap();
    h.call(EngineRequest::QueueDelete(ops::QueueDelete(QueueName {
        queue: "a".into(),
    })))
    .unwrap();
    match h
        .call(EngineRequest::MemberList(ops::MemberList::default()))
        .unwrap()
    {
        Reply::MemberList(l) => assert_eq!(l.members[0].subscribed, ["a", "b"]),
        other => panic!("{other:?}"),
    }
    // The name comes back: the subscription serves it again.
    h.create("a", QueuePatch::default());
    let id = h.enqueue("a", "1");
    assert_eq!(delivered(&h.pushed(1)), vec![(id, 1, false)]);
}

#[test]
fn a_renewal_keeps_a_disconnected_members_labels_capacity_and_last_seen() {
    let mut h = Harness::new();
    h.create("jobs", QueuePatch::default());
    let id = h.enqueue("jobs", "1");
    let mut o = match open("m", 3, false, false) {
        EngineRequest::SessionOpen(o) => o,
        _ => unreachable!(),
    };
    o.labels = vec!["gpu".into()];
    h.call_on(1, EngineRequest::SessionOpen(o)).unwrap();
    h.call_on(1, subscribe("m", &["jobs"])).unwrap();
    assert_eq!(delivered(&h.pushed(1)).len(), 1);
    h.engine().disconnected(1);
    let before = member_info(&mut h, "m");
    h.call(renew(&id, 1)).unwrap();
    h.call(EngineRequest::Cancel(Cancel {
        task: id.clone(),
        if_state: None,
    }))
    .unwrap();
    let after = member_info(&mut h, "m");
    assert_eq!(after, before);
    assert_eq!(
        (
            after.labels,
            after.capacity,
            after.leased,
            after.last_seen_ms.is_some()
        ),
        (vec!["gpu".to_owned()], 3, 1, true)
    );
}

fn member_info(h: &mut Harness, name: &str) -> muster_protocol::model::MemberInfo {
    match h
        .call(EngineRequest::MemberDescribe(ops::MemberDescribe(
            ops::MemberName {
                member: name.into(),
            },
        )))
        .unwrap()
    {
        Reply::MemberDescribe(d) => d.member,
        other => panic!("{other:?}"),
    }
}

#[test]
fn max_runtime_holds_across_a_restart() {
    let mut h = Harness::new();
    let (id, epoch) = claimed_under_runtime_cap(&mut h, 1_000, 3_000);
    h.advance(900);
    h.call(renew(&id, epoch)).unwrap();
    // Down for a second; the delivery is 1.9 s old when the daemon is back.
    h.restart(1_000);
    h.call(renew(&id, epoch)).unwrap();
    h.advance(900);
    h.call(renew(&id, epoch)).unwrap();
    // 2.8 s old: the renewal is granted up to the cap (3 s from the grant), not beyond.
    match h.call(renew(&id, epoch)).unwrap() {
        Reply::Renew(r) => assert_eq!(r.lease_ms, 200),
        other => panic!("{other:?}"),
    }
    h.advance(200);
    assert_eq!(h.code(renew(&id, epoch)), ErrorCode::LeaseLost);
    let t = h.task(&id);
    assert_eq!(
        (t.state, t.failures),
        (TaskState::Ready, 1),
        "{:?}",
        t.history
    );
}

#[test]
fn lowering_max_runtime_ends_running_leases_at_the_new_cap() {
    let mut h = Harness::new();
    let (id, epoch) = claimed_with_lease(&mut h, 10_000);
    h.advance(2_000);
    h.call(EngineRequest::QueueUpdate(ops::QueueUpdate {
        queue: "jobs".into(),
        options: QueuePatch {
            max_runtime_ms: Some(1_000),
            ..QueuePatch::default()
        },
    }))
    .unwrap();
    // The delivery is 2 s old, past the new 1 s cap: the lease ended with the update's
    // round, so the refusal of a renewal is the truth, and an ack is refused too.
    assert_eq!(h.code(renew(&id, epoch)), ErrorCode::LeaseLost);
    assert_eq!(h.code(ack(&id, epoch)), ErrorCode::LeaseLost);
    let t = h.task(&id);
    assert_eq!((t.state, t.failures), (TaskState::Ready, 1));
}

#[test]
fn a_reclaim_reaching_max_attempts_names_the_member_in_its_dead_lettered_event() {
    let mut h = Harness::new();
    h.create(
        "jobs",
        QueuePatch {
            max_attempts: Some(1),
            ..QueuePatch::default()
        },
    );
    let id = h.enqueue("jobs", "1");
    h.call_on(1, open("m", 1, false, false)).unwrap();
    h.call_on(1, subscribe("m", &["jobs"])).unwrap();
    assert_eq!(delivered(&h.pushed(1)).len(), 1);
    h.call_on(2, open("m", 1, true, false)).unwrap();
    let t = h.task(&id);
    assert_eq!(t.state, TaskState::Dead);
    let last = t.history.last().expect("events");
    assert_eq!(
        (
            last.event.as_str(),
            last.member.as_deref(),
            last.error.as_deref()
        ),
        ("dead_lettered", Some("m"), Some("max_attempts"))
    );
}

mod bounds;
mod crash_model;
mod fair;
mod family;
mod find;
mod limits;
mod limits_model;
mod liveness;
mod member_names;
mod model;
mod output;
mod quotas;
mod schedules;
mod suspend;
mod watch;

#[test]
fn the_disk_alarm_refuses_enqueues_only_and_lifts() {
    let mut h = Harness::new();
    h.create("jobs", QueuePatch::default());
    let a = h.enqueue("jobs", "1");
    let b = h.enqueue("jobs", "2");
    let (held, epoch) = h.claim_one("jobs");
    assert_eq!(held, a);
    h.engine().set_disk_alarm(true);
    let enqueue = EngineRequest::Enqueue(Enqueue {
        queue: "jobs".into(),
        tasks: vec![NewTask::new(raw("3"))],
    });
    assert_eq!(h.code(enqueue), ErrorCode::DiskFull);
    assert_eq!(h.counts("jobs"), [0, 1, 1, 0, 0, 0, 0]);
    // Agents and operators go on: renew, ack, claim, cancel.
    h.call(renew(&a, epoch)).unwrap();
    h.call(ack(&a, epoch)).unwrap();
    let (next, _) = h.claim_one("jobs");
    assert_eq!(next, b);
    h.call(EngineRequest::Cancel(Cancel {
        task: b.clone(),
        if_state: None,
    }))
    .unwrap();
    h.engine().set_disk_alarm(false);
    let c = h.enqueue("jobs", "3");
    assert_eq!(h.state(&c), (TaskState::Ready, 0, 0));
}

#[test]
fn a_large_purge_proceeds_in_slices_while_other_requests_are_served() {
    use crate::engine::bulk::BULK_SLICE;
    let mut h = Harness::new();
    h.create("jobs", QueuePatch::default());
    // Four slices: the purge's own round, then one per later round.
    let total = 3 * BULK_SLICE + BULK_SLICE / 2;
    let batch: Vec<NewTask> = (0..total).map(|_| NewTask::new(raw("1"))).collect();
    for chunk in batch.chunks(1000) {
        h.call(EngineRequest::Enqueue(Enqueue {
            queue: "jobs".into(),
            tasks: chunk.to_vec(),
        }))
        .unwrap();
    }
    let (held, epoch) = h.claim_one("jobs");
    let purge = h.send(EngineRequest::QueuePurge(ops::QueuePurge(QueueName {
        queue: "jobs".into(),
    })));
    // One slice went; the reply waits for the last.
    assert!(h.reply_for(purge).is_none());
    assert_eq!(
        h.counts("jobs"),
        [0, (total - 1 - BULK_SLICE) as u64, 1, 0, 0, 0, 0]
    );
    // Meanwhile: a renewal is served in its own round, and a task is leased before its
    // slice comes: it is not purged.
    h.call(renew(&held, epoch)).unwrap();
    let late = h.claim_as("jobs", 1, "m2");
    assert_eq!(late.len(), 1);
    let reply = h
        .reply_for(purge)
        .expect("the purge is done after its last slice");
    match reply {
        Ok(Reply::Count(c)) => assert_eq!(c.count, (total - 2) as u64),
        other => panic!("purge: {other:?}"),
    }
    assert_eq!(h.counts("jobs"), [0, 0, 2, 0, 0, 0, 0]);
    assert_eq!(h.state(&late[0].0).0, TaskState::Leased);

    // A deletion: the queue is gone at once for requests naming it, and removed with
    // its last slice.
    for chunk in batch.chunks(1000) {
        h.call(EngineRequest::Enqueue(Enqueue {
            queue: "jobs".into(),
            tasks: chunk.to_vec(),
        }))
        .unwrap();
    }
    let delete = h.send(EngineRequest::QueueDelete(ops::QueueDelete(QueueName {
        queue: "jobs".into(),
    })));
    assert!(h.reply_for(delete).is_none());
    let enqueue = EngineRequest::Enqueue(Enqueue {
        queue: "jobs".into(),
        tasks: vec![NewTask::new(raw("1"))],
    });
    assert_eq!(h.code(enqueue), ErrorCode::NotFound);
    h.round();
    h.round();
    match h.reply_for(delete).expect("the deletion is done") {
        Ok(Reply::Count(c)) => assert_eq!(c.count, (total + 2) as u64),
        other => panic!("delete: {other:?}"),
    }
}

#[test]
fn a_restart_indexes_a_store_of_several_scan_batches_and_refuses_a_record_that_does_not_decode() {
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    let n = 2 * crate::store::SCAN_BATCH + 7;
    let mut ids = Vec::with_capacity(n);
    while ids.len() < n {
        let tasks = (0..(n - ids.len()).min(muster_protocol::limits::MAX_BATCH))
            .map(|_| NewTask::new(raw("1")))
            .collect();
        match h.call(EngineRequest::Enqueue(Enqueue {
            queue: "q".into(),
            tasks,
        })) {
            Ok(Reply::Enqueue(r)) => ids.extend(r.tasks.into_iter().map(|t| t.id)),
            other => panic!("enqueue: {other:?}"),
        }
    }
    h.restart(0);
    assert_eq!(h.counts("q"), [0, n as u64, 0, 0, 0, 0, 0]);
    assert_eq!(h.claim_one("q").0, ids[0], "the oldest first, as before");
    // A record past the first batches that does not decode: start-up stops, naming it.
    let spoiled: ulid::Ulid = ids[crate::store::SCAN_BATCH + 3].parse().unwrap();
    let engine = h.engine.take().unwrap();
    engine.store().spoil_task(spoiled);
    engine.store().persist(crate::store::Persist::All).unwrap();
    drop(engine);
    let store = Store::open(h.dir.path(), 8 << 20).unwrap();
    let err = Engine::<Tag>::open(store, h.now, 9).err().expect("refused");
    assert!(
        err.to_string()
            .starts_with(&format!("store: corrupt record task {spoiled}: ")),
        "{err}"
    );
}

/// The ids of the fresh tasks (see `Caches::fresh`), oldest first.
fn fresh_ids(h: &mut Harness) -> Vec<String> {
    let mut ids: Vec<ulid::Ulid> = h.engine().caches.fresh.tasks.keys().copied().collect();
    ids.sort();
    ids.iter().map(ulid::Ulid::to_string).collect()
}

#[test]
fn a_fresh_task_is_delivered_from_memory_until_it_is_written() {
    let mut h = Harness::new();
    h.create("jobs", QueuePatch::default());
    let a = h.enqueue("jobs", r#"{"n":1}"#);
    let b = h.enqueue("jobs", r#"{"n":2}"#);
    let c = h.enqueue("jobs", r#"{"n":3}"#);
    // A delayed task is written when it becomes ready: not kept.
    let mut delayed = NewTask::new(raw("4"));
    delayed.delay_ms = Some(1_000);
    h.enqueue_task("jobs", delayed);
    assert_eq!(fresh_ids(&mut h), [a.clone(), b.clone(), c.clone()]);

    // A change to a waiting task's record is written: its kept copy goes.
    let update = EngineRequest::TaskUpdate(ops::TaskUpdate {
        task: c.clone(),
        priority: Some(1),
        run_now: false,
    });
    h.call(update).unwrap();
    assert_eq!(fresh_ids(&mut h), [a.clone(), b.clone()]);

    // The first delivery takes the payload from memory and ends the freshness.
    let claim = |h: &mut Harness| match h.call(EngineRequest::Claim(Claim::new(["jobs"]))) {
        Ok(Reply::Claim(r)) => (r.tasks[0].id.clone(), r.tasks[0].payload.get().to_owned()),
        other => panic!("claim: {other:?}"),
    };
    assert_eq!(claim(&mut h), (c.clone(), r#"{"n":3}"#.to_owned()));
    assert_eq!(claim(&mut h), (a.clone(), r#"{"n":1}"#.to_owned()));
    assert_eq!(fresh_ids(&mut h), std::slice::from_ref(&b));

    // A restart keeps nothing fresh: the store serves the delivery.
    h.restart(0);
    assert!(fresh_ids(&mut h).is_empty());
    assert_eq!(claim(&mut h), (b.clone(), r#"{"n":2}"#.to_owned()));
    assert_eq!(h.engine().caches.fresh.bytes, 0);
}

#[test]
fn fresh_tasks_are_kept_within_their_byte_budget() {
    let mut h = Harness::new();
    h.create("jobs", QueuePatch::default());
    // Payloads of nearly 1 MiB: the budget holds as many as fit, the first ones.
    let big = format!("\"{}\"", "x".repeat(MAX_PAYLOAD_BYTES - 1024));
    let n = FRESH_BYTES / MAX_PAYLOAD_BYTES + 8;
    let ids: Vec<String> = (0..n).map(|_| h.enqueue("jobs", &big)).collect();
    let kept = fresh_ids(&mut h);
    let each = h.engine().caches.fresh.bytes / kept.len();
    assert!(each > big.len(), "{each}");
    assert_eq!(kept, ids[..FRESH_BYTES / each]);
    assert!(kept.len() < ids.len());
    // Every task reads back whole, kept or not (those past the budget from the store),
    // and every one is delivered.
    for id in &ids {
        let task = h.task(id);
        assert_eq!(task.payload.get().len(), big.len());
    }
    // A claim's reply is bounded in bytes: a few such tasks at a time.
    let mut delivered = 0;
    for _ in 0..ids.len() {
        let got = h.claim_as("jobs", n as u32, "m1");
        if got.is_empty() {
            break;
        }
        delivered += got.len();
    }
    assert_eq!(delivered, ids.len());
    assert!(fresh_ids(&mut h).is_empty());
}
