//! Agents that die, hang or stop: a dead member's tasks wait for another member with
//! one failure each, clean exits are seen at once, `muster work` supervises its
//! programs (process groups, a guardian, SIGTERM then SIGKILL, checkpoints kept on a
//! drain, a private progress directory), a broken runner costs no task a failure,
//! revoked tasks go to another member and cancelled ones end without a failure.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use muster_sdk::protocol::model::MemberState;
use muster_sdk::{Client, NewTask, QueuePatch, TaskState};
use muster_tests::{Daemon, Proc, until};

fn block<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

async fn queue(client: &Client, name: &str, lease_ms: u64, max_attempts: u32) {
    let patch = QueuePatch {
        lease_ms: Some(lease_ms),
        max_attempts: Some(max_attempts),
        ..QueuePatch::default()
    };
    client
        .queue_create(name, patch)
        .await
        .expect("queue_create");
}

async fn enqueue(client: &Client, queue: &str, n: u64) -> String {
    let payload = muster_sdk::json(&serde_json::json!({ "n": n })).expect("json");
    client
        .enqueue(queue, NewTask::new(payload))
        .await
        .expect("enqueue")
        .id
}

async fn member_state(client: &Client, member: &str) -> Option<(MemberState, u64)> {
    client
        .member_describe(member)
        .await
        .ok()
        .map(|d| (d.member.state, d.member.leased))
}

/// A shell script in `dir`, executable.
fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).expect("writing a script");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

/// Sends `signal` to one process (not its group).
fn signal(pid: u32, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill {signal} {pid}");
}

fn alive(pid: u32) -> bool {
    // A zombie is dead for our purposes: it runs nothing.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit(')')
            .next()
            .is_some_and(|r| !r.trim_start().starts_with('Z'))
    })
}

fn work(d: &Daemon, queue: &str, member: &str, capacity: u32, grace: &str, program: &Path) -> Proc {
    d.spawn_cli(&[
        "work",
        queue,
        "--member",
        member,
        "--capacity",
        &capacity.to_string(),
        "--grace",
        grace,
        "--",
        program.to_str().expect("utf-8 path"),
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_agent_that_never_returns_costs_its_tasks_one_failure_each() {
    let d = Daemon::start();
    let client = d.client().await;
    queue(&client, "gq", 3_000, 3).await;
    let a = enqueue(&client, "gq", 1).await;
    let b = enqueue(&client, "gq", 2).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let slow = script(dir.path(), "slow.sh", "exec sleep 60");
    let mut ghost = work(&d, "gq", "ghost/agent1", 2, "1s", &slow);
    until(Duration::from_secs(20), "ghost holds both", || async {
        member_state(&client, "ghost/agent1").await == Some((MemberState::Connected, 2))
    })
    .await;
    block(|| ghost.kill9());
    // The leases lapse (3 s) before the dead member counts as unreachable (5 s): the
    // tasks must not go back to it. Wait until it is unreachable, then look.
    until(Duration::from_secs(15), "ghost unreachable", || async {
        member_state(&client, "ghost/agent1")
            .await
            .is_some_and(|(s, _)| s == MemberState::Unreachable)
    })
    .await;
    for id in [&a, &b] {
        let t = client.task_get(id).await.expect("task_get");
        assert_eq!(
            (t.state, t.deliveries, t.failures),
            (TaskState::Ready, 1, 1),
            "{id}: {:?}",
            t.history
        );
    }
    let members = d.ok(&["members", "--no-headers"]);
    assert!(
        members.starts_with("ghost/agent1\tunreachable\t0/2\t"),
        "{members}"
    );
    // A second agent under another name finishes them as soon as it starts.
    let quick = script(dir.path(), "quick.sh", "echo ok");
    let started = Instant::now();
    let _rescuer = work(&d, "gq", "rescuer", 2, "1s", &quick);
    let reply = client
        .wait(vec![a.clone(), b.clone()], 20_000)
        .await
        .expect("wait");
    eprintln!(
        "rescuer finished both {:?} after its start",
        started.elapsed()
    );
    assert_eq!(reply.finished.len(), 2, "{:?}", reply.pending);
    for t in reply.finished {
        assert_eq!((t.state, t.deliveries, t.failures), (TaskState::Done, 2, 1));
        assert_eq!(t.lease, None);
        let leased_to: Vec<_> = t
            .history
            .iter()
            .filter(|e| e.event == "leased")
            .map(|e| e.member.clone().unwrap_or_default())
            .collect();
        assert_eq!(leased_to, ["ghost/agent1", "rescuer"]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_runner_leaves_no_program_running_and_no_progress_directory() {
    let d = Daemon::start();
    let client = d.client().await;
    queue(&client, "orph", 30_000, 3).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let pids = dir.path().join("pids");
    // The program starts a child of its own, then both wait: kill -9 of the runner
    // must take both (the whole group) within a second.
    let body = format!(
        "sleep 600 &\necho $$ $! \"$(dirname \"$MUSTER_PROGRESS_FILE\")\" >> {}\nwait",
        pids.display()
    );
    let program = script(dir.path(), "family.sh", &body);
    let runner = work(&d, "orph", "orphans", 1, "5s", &program);
    enqueue(&client, "orph", 1).await;
    let line = {
        let mut line = String::new();
        until(Duration::from_secs(20), "the program started", || {
            line = std::fs::read_to_string(&pids).unwrap_or_default();
            let ready = line.split_whitespace().count() == 3;
            async move { ready }
        })
        .await;
        line
    };
    let fields: Vec<&str> = line.split_whitespace().collect();
    let (shell, child): (u32, u32) = (fields[0].parse().unwrap(), fields[1].parse().unwrap());
    let progress_dir = PathBuf::from(fields[2]);
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&progress_dir)
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700, "{}", progress_dir.display());
    }
    assert!(alive(shell) && alive(child));
    // kill -9 of the runner alone, as the OOM killer would.
    signal(runner.pid(), "-KILL");
    let killed = Instant::now();
    until(
        Duration::from_secs(1),
        "the program's group died with the runner",
        || {
            let gone = !alive(shell) && !alive(child) && !progress_dir.exists();
            async move { gone }
        },
    )
    .await;
    eprintln!(
        "program and its child gone {:?} after kill -9 of the runner",
        killed.elapsed()
    );
    drop(runner);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_sends_sigterm_first_keeps_the_checkpoint_and_counts_no_failure() {
    let d = Daemon::start();
    let client = d.client().await;
    queue(&client, "drain", 30_000, 3).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("signals");
    // Traps TERM: writes a checkpoint, says so, exits non-zero (stopped, not done).
    let body = format!(
        "trap 'echo \"{{\\\"step\\\":7}}\" > \"$MUSTER_PROGRESS_FILE\"; echo term >> {log}; exit 3' TERM\necho started >> {log}\nsleep 600 &\nwait",
        log = log.display()
    );
    let program = script(dir.path(), "trap.sh", &body);
    let mut runner = work(&d, "drain", "drainer", 1, "10s", &program);
    let id = enqueue(&client, "drain", 1).await;
    until(Duration::from_secs(20), "the program started", || {
        let started = std::fs::read_to_string(&log).is_ok_and(|l| l.contains("started"));
        async move { started }
    })
    .await;
    // SIGTERM to the runner alone, as an orchestrator stopping it would send.
    signal(runner.pid(), "-TERM");
    assert_eq!(block(|| runner.wait(Duration::from_secs(15))), Some(0));
    let exited = Instant::now();
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        "started\nterm\n",
        "the program must see SIGTERM (not only SIGKILL)"
    );
    let t = client.task_get(&id).await.expect("task_get");
    assert_eq!(
        (t.state, t.deliveries, t.failures),
        (TaskState::Ready, 1, 0)
    );
    assert_eq!(
        t.progress.map(|p| p.get().to_owned()).as_deref(),
        Some("{\"step\":7}")
    );
    let events: Vec<&str> = t.history.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(events, ["enqueued", "leased", "released"]);
    // The runner closed its connection before exiting: gone at once, not in 30 s.
    until(
        Duration::from_secs(1),
        "the member is gone after a clean exit",
        || async {
            member_state(&client, "drainer")
                .await
                .is_none_or(|(s, _)| s == MemberState::Gone)
        },
    )
    .await;
    eprintln!("member gone {:?} after the runner exited", exited.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoke_hands_the_task_to_another_member_and_cancel_ends_it_without_a_failure() {
    let d = Daemon::start();
    let client = d.client().await;
    queue(&client, "ops", 30_000, 3).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("log");
    let body = format!(
        "trap 'echo term $MUSTER_CLAIM >> {log}; exit 143' TERM\necho start $MUSTER_CLAIM >> {log}\nsleep 600 &\nwait",
        log = log.display()
    );
    let program = script(dir.path(), "ops.sh", &body);
    let id = enqueue(&client, "ops", 1).await;
    let _first = work(&d, "ops", "first", 1, "5s", &program);
    until(Duration::from_secs(20), "first holds it", || async {
        member_state(&client, "first").await == Some((MemberState::Connected, 1))
    })
    .await;
    let _second = work(&d, "ops", "second", 1, "5s", &program);
    until(Duration::from_secs(20), "second is connected", || async {
        member_state(&client, "second").await == Some((MemberState::Connected, 0))
    })
    .await;
    assert_eq!(d.ok(&["lease", "revoke", &id]), "ready\n");
    until(
        Duration::from_secs(5),
        "second holds the revoked task",
        || async { member_state(&client, "second").await == Some((MemberState::Connected, 1)) },
    )
    .await;
    let t = client.task_get(&id).await.expect("task_get");
    let lease = t.lease.expect("leased");
    assert_eq!(
        (lease.member.as_str(), lease.epoch, t.failures),
        ("second", 2, 1)
    );
    until(
        Duration::from_secs(5),
        "the first program got SIGTERM",
        || {
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            let ok =
                log.contains(&format!("term {id}.1")) && log.contains(&format!("start {id}.2"));
            async move { ok }
        },
    )
    .await;
    // Cancel the running task: it ends cancelled, no failure counted for it.
    client.cancel(&id).await.expect("cancel");
    let reply = client.wait(vec![id.clone()], 10_000).await.expect("wait");
    assert_eq!(reply.finished.len(), 1, "{:?}", reply.pending);
    let t = &reply.finished[0];
    assert_eq!((t.state, t.failures), (TaskState::Cancelled, 1));
    assert!(
        std::fs::read_to_string(&log)
            .unwrap()
            .contains(&format!("term {id}.2")),
        "the cancelled program got SIGTERM"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_whose_program_is_missing_refuses_to_start_or_costs_no_failure() {
    let d = Daemon::start();
    let client = d.client().await;
    queue(&client, "cnf", 30_000, 2).await;
    // Missing at start: refused at once, one line, non-zero.
    let out = d.cli(&["work", "cnf", "--member", "x2", "--", "/nonexistent/prog"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8(out.stderr).unwrap(),
        "muster: COMMAND \"/nonexistent/prog\" is not an executable file\n"
    );
    let out = d.cli(&[
        "work",
        "cnf",
        "--member",
        "x2",
        "--",
        "no-such-program-anywhere",
    ]);
    assert_eq!(out.status.code(), Some(1));
    // Gone after start: each task is held, released without a failure, never dead.
    let dir = tempfile::tempdir().expect("tempdir");
    let program = script(dir.path(), "vanishing.sh", "echo ok");
    let _runner = work(&d, "cnf", "x2", 2, "1s", &program);
    until(
        Duration::from_secs(20),
        "the runner is connected",
        || async {
            member_state(&client, "x2")
                .await
                .is_some_and(|(s, _)| s == MemberState::Connected)
        },
    )
    .await;
    std::fs::remove_file(&program).expect("removing the program");
    let ids = [
        enqueue(&client, "cnf", 1).await,
        enqueue(&client, "cnf", 2).await,
    ];
    // Two holds of the runner's backoff (1 s, then 2 s), side by side, release both.
    until(
        Duration::from_secs(20),
        "both tasks tried and released",
        || async {
            let mut released = 0;
            for id in &ids {
                let t = client.task_get(id).await.expect("task_get");
                if t.history.iter().any(|e| e.event == "released") {
                    released += 1;
                }
            }
            released == 2
        },
    )
    .await;
    for id in &ids {
        let t = client.task_get(id).await.expect("task_get");
        assert_eq!(t.failures, 0, "{id}: {:?}", t.history);
        assert_ne!(t.state, TaskState::Dead);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_to_the_demo_drains_its_agents_without_lapses_and_they_leave_at_once() {
    let d = Daemon::start();
    let client = d.client().await;
    let mut demo = d.spawn_cli(&["demo", "--rate", "50"]);
    // Wait until the agents hold work.
    until(
        Duration::from_secs(30),
        "the demo's agents hold tasks",
        || async {
            let mut held = 0;
            for n in 1..=4 {
                held += member_state(&client, &format!("demo/agent-{n}"))
                    .await
                    .map_or(0, |(_, l)| l);
            }
            held >= 4
        },
    )
    .await;
    signal(demo.pid(), "-TERM");
    assert_eq!(block(|| demo.wait(Duration::from_secs(20))), Some(0));
    let exited = Instant::now();
    until(Duration::from_secs(1), "every demo agent gone", || async {
        let list = client.member_list().await.expect("member_list");
        list.iter()
            .filter(|m| m.name.starts_with("demo/"))
            .all(|m| m.state == MemberState::Gone && m.leased == 0)
    })
    .await;
    eprintln!(
        "demo agents gone {:?} after the demo exited",
        exited.elapsed()
    );
    let leased = client
        .queue_describe("demo")
        .await
        .expect("queue_describe")
        .counts
        .leased;
    assert_eq!(
        leased, 0,
        "every task held at SIGTERM was settled or released"
    );
    let info = client.queue_describe("demo").await.expect("queue_describe");
    assert_eq!(info.totals.lapsed, 0, "no lease lapsed");
}

/// Records the wall-clock time it is dropped: when a handler's future ended, whether
/// it returned or was aborted.
struct EndsAt(std::sync::Arc<std::sync::Mutex<Option<u64>>>);

impl Drop for EndsAt {
    fn drop(&mut self) {
        *self.0.lock().expect("lock") = Some(wall_ms());
    }
}

fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_cut_off_from_the_daemon_stops_its_handler_before_the_lease_can_lapse() {
    use muster_sdk::{Outcome, Worker, WorkerConfig};
    use std::sync::{Arc, Mutex};
    let d = Daemon::start();
    let client = d.client().await;
    queue(&client, "cut", 3_000, 5).await;
    let relay = muster_tests::relay::Relay::start(d.addr.parse().expect("daemon address"))
        .await
        .expect("relay");
    let mut options = d.options();
    options.addr = relay.addr().to_string();
    let ended = Arc::new(Mutex::new(None));
    let (started_tx, mut started) = tokio::sync::mpsc::unbounded_channel();
    let mut config = WorkerConfig::new("islander", ["cut"]);
    config.grace = Duration::from_secs(2);
    let worker = Worker::new(options, config);
    let handle = worker.handle();
    let end = Arc::clone(&ended);
    let running = tokio::spawn(worker.run(move |task| {
        let (end, started_tx) = (EndsAt(Arc::clone(&end)), started_tx.clone());
        async move {
            let _end = end;
            let _ = started_tx.send(task.id().to_owned());
            // Works until told to stop, then hands the task back.
            task.cancelled().await;
            Outcome::Release
        }
    }));
    let id = enqueue(&client, "cut", 1).await;
    assert_eq!(started.recv().await.as_deref(), Some(id.as_str()));
    // Let one renewal through (at a third of the lease), then cut the cable.
    until(
        Duration::from_secs(5),
        "a renewal moved the deadline",
        || async {
            let t = client.task_get(&id).await.expect("task_get");
            t.lease.is_some_and(|l| l.expires_ms > t.created_ms + 3_500)
        },
    )
    .await;
    relay.partition();
    let cut_at = wall_ms();
    until(
        Duration::from_secs(10),
        "the daemon lapsed the lease",
        || async {
            let t = client.task_get(&id).await.expect("task_get");
            t.history.iter().any(|e| e.event == "lapsed")
        },
    )
    .await;
    let t = client.task_get(&id).await.expect("task_get");
    let lapsed_at = t
        .history
        .iter()
        .find(|e| e.event == "lapsed")
        .map(|e| e.at_ms)
        .expect("a lapse");
    let ended_at = ended
        .lock()
        .expect("lock")
        .expect("the handler must have ended before the lapse");
    eprintln!(
        "cut at {cut_at}: handler ended {} ms later, the daemon lapsed the lease {} ms later",
        ended_at - cut_at,
        lapsed_at - cut_at
    );
    assert!(
        ended_at < lapsed_at,
        "handler ended at {ended_at}, after the lapse at {lapsed_at}"
    );
    assert_eq!((t.state, t.failures), (TaskState::Ready, 1));
    relay.heal();
    let healed = Instant::now();
    handle.shutdown();
    tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .expect("the worker stops")
        .expect("join")
        .expect("the worker ends cleanly");
    eprintln!("worker stopped {:?} after the heal", healed.elapsed());
}

/// A member that sends nothing but the SDK's keep-alive pings stays connected however
/// long it idles (the daemon counts every packet, each connection's count read once per
/// `HEARD_POLL` by one task for all connections), and is unreachable once its packets
/// stop, not before its liveness timeout allows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_member_is_kept_connected_by_its_pings_alone_and_unreachable_once_cut_off() {
    const LIVENESS: Duration = Duration::from_secs(3);
    let d = Daemon::start();
    let admin = d.client().await;
    let relay = muster_tests::relay::Relay::start(d.addr.parse().expect("daemon address"))
        .await
        .expect("relay");
    let mut options = d.options();
    options.addr = relay.addr().to_string();
    let member = Client::connect(options).await.expect("connect");
    let open = muster_protocol::ops::SessionOpen {
        member: "idler".into(),
        labels: Vec::new(),
        capacity: 1,
        reclaim: false,
        resume: false,
        held: None,
        liveness_ms: Some(LIVENESS.as_millis() as u64),
    };
    let (_, _pushes) = member.open_session(&open).await.expect("session_open");
    // More than two liveness timeouts without a request from the member: only its
    // pings speak for it. Its state is read throughout, from another connection.
    let idle = Instant::now();
    let mut reads = 0;
    while idle.elapsed() < 2 * LIVENESS + Duration::from_secs(1) {
        assert_eq!(
            member_state(&admin, "idler").await,
            Some((MemberState::Connected, 0)),
            "after {:?} of idling",
            idle.elapsed()
        );
        reads += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(reads >= 20, "the state was read only {reads} times");
    relay.partition();
    let cut = Instant::now();
    until(Duration::from_secs(15), "idler unreachable", || async {
        member_state(&admin, "idler")
            .await
            .is_some_and(|(s, _)| s == MemberState::Unreachable)
    })
    .await;
    // Its last packet came at most one ping interval and one reading of the packet
    // counts (every 250 ms, PROTOCOL.md "Keep-alive and liveness") before the cut.
    const HEARD_POLL: Duration = Duration::from_millis(250);
    let earliest = LIVENESS - muster_sdk::connect::KEEP_ALIVE - HEARD_POLL;
    assert!(
        cut.elapsed() >= earliest,
        "unreachable {:?} after the cut, before its liveness timeout allows",
        cut.elapsed()
    );
    // Open until here: its silence came from the cut, not from a close.
    drop(member);
}

/// A lease the daemon granted in a push its agent never received (lost with the
/// connection, as a cluster leader's last round can be when its successor agrees on
/// it) is handed to the agent again when it resumes its session, with a new epoch and
/// no failure, instead of lapsing unworked a whole lease later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_pushed_into_a_dead_connection_is_handed_over_again_on_resume() {
    use muster_sdk::{Outcome, Worker, WorkerConfig};
    use muster_tests::relay::{Direction, Relay};
    let d = Daemon::start();
    let client = d.client().await;
    // A lease far longer than the test: only a re-delivery can start the task again.
    queue(&client, "unheard", 60_000, 5).await;
    let relay = Relay::start(d.addr.parse().expect("daemon address"))
        .await
        .expect("relay");
    let mut options = d.options();
    options.addr = relay.addr().to_string();
    let (started_tx, mut started) = tokio::sync::mpsc::unbounded_channel();
    let worker = Worker::new(options, WorkerConfig::new("forgetful", ["unheard"]));
    let handle = worker.handle();
    let running = tokio::spawn(worker.run(move |task| {
        let d = task.delivery();
        let _ = started_tx.send((d.id.clone(), d.epoch, d.failures, d.reclaimed));
        async { Outcome::Ack(None) }
    }));
    until(Duration::from_secs(10), "forgetful connected", || async {
        member_state(&client, "forgetful").await == Some((MemberState::Connected, 0))
    })
    .await;
    // Nothing from the daemon reaches the agent: the push of the lease is lost.
    relay.cut(Direction::Back);
    let id = enqueue(&client, "unheard", 1).await;
    until(Duration::from_secs(10), "the lease granted", || async {
        let t = client.task_get(&id).await.expect("task_get");
        t.lease
            .is_some_and(|l| l.member == "forgetful" && l.epoch == 1)
    })
    .await;
    // The agent gives the silent connection up (its close reaches the daemon); only
    // then may packets flow again, to its next connection.
    until(
        Duration::from_secs(10),
        "the old connection closed",
        || async { member_state(&client, "forgetful").await == Some((MemberState::Gone, 1)) },
    )
    .await;
    relay.heal();
    let run = tokio::time::timeout(Duration::from_secs(20), started.recv())
        .await
        .expect("the lease never reached the agent")
        .expect("worker running");
    assert_eq!(run, (id.clone(), 2, 0, false));
    until(Duration::from_secs(10), "the task done", || async {
        client.task_get(&id).await.expect("task_get").state == TaskState::Done
    })
    .await;
    let t = client.task_get(&id).await.expect("task_get");
    let events: Vec<_> = t
        .history
        .iter()
        .map(|e| (e.event.as_str(), e.epoch))
        .collect();
    assert_eq!(
        (t.failures, events),
        (
            0,
            vec![
                ("enqueued", None),
                ("leased", Some(1)),
                ("redelivered", Some(2)),
                ("done", Some(2))
            ]
        )
    );
    assert!(started.try_recv().is_err(), "the task ran twice");
    handle.shutdown();
    running.await.expect("worker task").expect("worker");
}
