//! A three-node cluster: it forms and its followers name the leader; a kill -9 of the
//! leader keeps every acknowledged task and lease; long-lived agents (the SDK's worker,
//! `muster work`) follow a killed leader in seconds and run nothing twice; `muster
//! enqueue -` prints exactly the ids a killed leader stored; the checker
//! under kills and partitions finds nothing lost, doubled or split; a node added after
//! the log was compacted catches up from a snapshot and serves everything; a node that
//! cannot catch up is never made a voter; suspensions, their tokens and timeouts
//! outlive the leader's death.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use muster_sdk::protocol::model::MemberState;
use muster_sdk::protocol::ops::{Claim, Enqueue, SessionOpen};
use muster_sdk::{
    Client, ErrorCode, NewTask, Outcome, QueuePatch, TaskState, TaskSummary, Worker, WorkerConfig,
};
use muster_tests::cluster::{self, CLUSTER_ID, Cluster, reply_error_code, reply_error_leader};
use muster_tests::{Daemon, until};

use crate::cli::Feeder;

/// Nodes in every cluster here but the snapshot test's.
const NODES: usize = 3;

/// Tasks per page when listing a queue (the daemon's page limit).
const PAGE: u32 = 1000;

fn task(n: usize) -> NewTask {
    NewTask::new(muster_sdk::json(&n).expect("json"))
}

/// Every task of `queue` in `state`, by id.
async fn tasks_in(client: &Client, queue: &str, state: TaskState) -> BTreeMap<String, TaskSummary> {
    let mut found = BTreeMap::new();
    let mut cursor = None;
    loop {
        let page = client
            .task_list(queue, state, cursor, Some(PAGE))
            .await
            .expect("task_list");
        found.extend(page.tasks.into_iter().map(|t| (t.id.clone(), t)));
        match page.next {
            Some(next) => cursor = Some(next),
            None => return found,
        }
    }
}

/// The harness's raw probe against a single daemon: its hello names no cluster, and a
/// refusal's code is read from the reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_speaks_the_wire_and_a_single_daemon_names_no_cluster() {
    let d = Daemon::start();
    let mut probe = cluster::Probe::open(&d.options()).await.expect("probe");
    assert_eq!(probe.cluster(), None, "{}", probe.hello());
    assert!(
        probe.hello()["server"]
            .as_str()
            .is_some_and(|s| s.starts_with("musterd ")),
        "{}",
        probe.hello()
    );
    let reply = probe
        .call(&Enqueue {
            queue: "missing".into(),
            tasks: vec![task(1)],
        })
        .await
        .expect("an answer");
    assert_eq!(reply_error_code(&reply), Some("not_found"), "{reply}");
    assert_eq!(reply_error_leader(&reply), None, "{reply}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_forms_and_followers_name_the_leader() {
    let cluster = Cluster::start(NODES).await;
    let leader = cluster.leader().await;
    for id in cluster.node_ids() {
        let hello = cluster
            .probe(id)
            .await
            .cluster()
            .unwrap_or_else(|| panic!("node {id}'s hello names no cluster"));
        assert_eq!(
            (
                hello.cluster_id.as_str(),
                hello.node,
                hello.term,
                hello.leader,
                hello.leader_addr.as_deref()
            ),
            (
                CLUSTER_ID,
                id,
                leader.term,
                Some(leader.node),
                Some(leader.addr.as_str())
            ),
            "node {id}'s hello"
        );
    }

    let client = cluster.client().await;
    client
        .queue_create("q", QueuePatch::default())
        .await
        .expect("queue_create through the cluster");
    let follower = cluster.follower(leader.node, 0);
    let mut probe = cluster.probe(follower).await;
    let reply = probe
        .call(&Enqueue {
            queue: "q".into(),
            tasks: vec![task(1)],
        })
        .await
        .expect("the follower answers");
    assert_eq!(reply_error_code(&reply), Some("not_leader"), "{reply}");
    assert_eq!(
        reply_error_leader(&reply),
        Some(leader.addr.as_str()),
        "{reply}"
    );
    let q = client.queue_describe("q").await.expect("queue_describe");
    assert_eq!(q.counts.ready, 0, "the refused enqueue left a task");

    let status = cluster.ok(&["--json", "cluster", "status"]).await;
    let status = cluster::node_status(&status).expect("cluster status");
    assert_eq!(status.voters, [1, 2, 3]);
    assert_eq!(
        (status.leader, status.term),
        (Some(leader.node), leader.term)
    );

    // Membership: an unknown node cannot be removed; a follower can.
    let unknown = cluster.cli(&["cluster", "remove", "9"]).await;
    assert_eq!(unknown.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&unknown.stderr).trim(),
        "muster: not_found: node 9 is not a member of the cluster"
    );
    let removed = cluster.follower(leader.node, 1);
    cluster
        .ok(&["cluster", "remove", &removed.to_string()])
        .await;
    let status = cluster::node_status(&cluster.ok(&["--json", "cluster", "status"]).await)
        .expect("cluster status");
    let mut left = vec![1, 2, 3];
    left.retain(|&n| n != removed);
    assert_eq!(status.voters, left);
}

/// Tasks enqueued before the kill.
const TASKS: usize = 200;

/// Leases the member holds across the kill.
const HELD: usize = 5;

/// The queue's lease: outlives the failover and every check after it.
const LONG_LEASE_MS: u64 = 300_000;

/// The member holding the leases.
const MEMBER: &str = "survivor";

fn session(resume: bool) -> SessionOpen {
    SessionOpen {
        member: MEMBER.into(),
        labels: vec![],
        capacity: HELD as u32 + 1,
        reclaim: false,
        resume,
        held: None,
        liveness_ms: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_keeps_every_acknowledged_task_and_lease() {
    let mut cluster = Cluster::start(NODES).await;
    let admin = cluster.client().await;
    admin
        .queue_create(
            "ha",
            QueuePatch {
                lease_ms: Some(LONG_LEASE_MS),
                ..QueuePatch::default()
            },
        )
        .await
        .expect("queue_create");
    let ids: BTreeSet<String> = admin
        .enqueue_batch("ha", (0..TASKS).map(task).collect())
        .await
        .expect("enqueue")
        .into_iter()
        .map(|t| t.id)
        .collect();
    assert_eq!(ids.len(), TASKS);

    // The member claims one more than it keeps: the released one's epoch is stale.
    let agent = cluster.client().await;
    let (_, _pushes) = agent.open_session(&session(false)).await.expect("session");
    let mut claimed = agent
        .claim(&Claim::new(["ha"]).max(HELD as u32 + 1).member(MEMBER))
        .await
        .expect("claim");
    assert_eq!(claimed.len(), HELD + 1);
    let stale = claimed.pop().expect("the extra delivery");
    agent
        .release(&stale.id, stale.epoch)
        .await
        .expect("release");
    let held: BTreeMap<String, u64> = claimed.into_iter().map(|d| (d.id, d.epoch)).collect();

    let old = cluster.leader().await;
    cluster.kill9(old.node);
    let new = cluster.leader().await;
    assert_ne!(new.node, old.node);
    drop((admin, agent));

    // The member reconnects through the list and resumes its session.
    let agent = cluster.client().await;
    let (reply, _pushes) = agent.open_session(&session(true)).await.expect("resume");
    assert_eq!(reply.kept, HELD as u64);
    let ready = tasks_in(&agent, "ha", TaskState::Ready).await;
    let leased = tasks_in(&agent, "ha", TaskState::Leased).await;
    let present: BTreeSet<String> = ready.keys().chain(leased.keys()).cloned().collect();
    assert_eq!(present, ids, "the tasks after the failover");
    assert_eq!(ready.len(), TASKS - HELD);
    let leases: BTreeMap<String, (String, u64)> = leased
        .into_iter()
        .map(|(id, t)| {
            let lease = t.lease.expect("a leased task's lease");
            (id, (lease.member, lease.epoch))
        })
        .collect();
    let expected: BTreeMap<String, (String, u64)> = held
        .iter()
        .map(|(id, epoch)| (id.clone(), (MEMBER.to_owned(), *epoch)))
        .collect();
    assert_eq!(leases, expected, "the leases after the failover");

    // A stale epoch stays refused; the held ones settle with their old epochs.
    let refused = agent
        .ack(&stale.id, stale.epoch, None)
        .await
        .expect_err("an ack with a stale epoch");
    assert_eq!(refused.code(), Some(ErrorCode::LeaseLost), "{refused}");
    for (id, epoch) in &held {
        let acked = agent
            .ack(id, *epoch, None)
            .await
            .expect("ack with the old epoch");
        assert_eq!(acked.state, TaskState::Done);
    }

    // The rest is delivered once each, none of the acked again.
    let mut delivered = BTreeSet::new();
    for _ in 0..=TASKS {
        let got = agent
            .claim(&Claim::new(["ha"]).max(PAGE))
            .await
            .expect("claim");
        if got.is_empty() {
            break;
        }
        for d in got {
            agent.ack(&d.id, d.epoch, None).await.expect("ack");
            assert!(delivered.insert(d.id.clone()), "{} delivered twice", d.id);
        }
    }
    assert_eq!(delivered, ready.keys().cloned().collect::<BTreeSet<_>>());
    let done = tasks_in(&agent, "ha", TaskState::Done).await;
    assert_eq!(done.keys().cloned().collect::<BTreeSet<_>>(), ids);
    for (id, t) in &done {
        let expected = if *id == stale.id { 2 } else { 1 };
        assert_eq!(t.deliveries, expected, "deliveries of {id}");
    }

    // The old leader rejoins and catches up.
    cluster.restart(old.node).await;
    cluster.wait_caught_up(old.node).await;
}

/// Suspensions are replicated with their tokens' digests and timeouts: after the
/// leader's kill -9, the new leader resumes a suspension by its token (once), refuses
/// an earlier suspension's token, and times out another on schedule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suspensions_their_tokens_and_timeouts_outlive_the_leaders_death() {
    use muster_sdk::protocol::model::OnTimeout;
    let mut cluster = Cluster::start(NODES).await;
    let client = cluster.client().await;
    client
        .queue_create("ask", QueuePatch::default())
        .await
        .expect("queue_create");
    let asked = client.enqueue("ask", task(0)).await.expect("enqueue").id;
    let timing = client.enqueue("ask", task(1)).await.expect("enqueue").id;
    let mut tokens = Vec::new();
    // `asked` is suspended twice (its first token is then an earlier suspension's).
    for round in 0..2 {
        let got = client
            .claim(&Claim::new(["ask"]).max(2))
            .await
            .expect("claim");
        for d in got {
            let suspension = if d.id == timing {
                muster_sdk::Suspension::new("until the export")
                    .timeout(Duration::from_secs(4), OnTimeout::Resume)
            } else {
                muster_sdk::Suspension::new("may I merge?")
            };
            let reply = client
                .suspend(&d.id, d.epoch, suspension)
                .await
                .expect("suspend");
            if d.id == asked {
                tokens.push(reply.resume_token.expect("a token"));
                if round == 0 {
                    client
                        .resume(tokens.last().unwrap(), None)
                        .await
                        .expect("resume");
                }
            }
        }
    }
    let suspended_at = Instant::now();
    let old = cluster.leader().await;
    cluster.kill9(old.node);
    let new = cluster.leader().await;
    assert_ne!(new.node, old.node);
    drop(client);
    let client = cluster.client().await;
    let t = client.task_get(&asked).await.expect("task_get");
    assert_eq!(
        (t.state, t.deliveries, t.failures),
        (TaskState::Suspended, 2, 0)
    );
    let stale = client
        .resume(&tokens[0], None)
        .await
        .expect_err("an earlier suspension's token");
    assert_eq!(stale.code(), Some(ErrorCode::StaleToken), "{stale}");
    let data = muster_sdk::raw_json(r#"{"approved":true}"#).unwrap();
    let resumed = client
        .resume(&tokens[1], Some(data))
        .await
        .expect("resume on the new leader");
    assert_eq!(resumed.state, TaskState::Ready);
    let again = client.resume(&tokens[1], None).await.expect_err("twice");
    assert_eq!(again.code(), Some(ErrorCode::StaleToken), "{again}");
    // The other times out on the new leader, no sooner than it was told.
    until(
        Duration::from_secs(20),
        "the timeout resumed it",
        || async { client.task_get(&timing).await.expect("task_get").state == TaskState::Ready },
    )
    .await;
    assert!(
        suspended_at.elapsed() >= Duration::from_secs(3),
        "timed out early"
    );
    let mut seen = BTreeMap::new();
    for d in client
        .claim(&Claim::new(["ask"]).max(2))
        .await
        .expect("claim")
    {
        let r = d.resumed.expect("resumed");
        seen.insert(d.id, (r.timed_out, r.data.map(|d| d.get().to_owned())));
    }
    assert_eq!(
        seen,
        BTreeMap::from([
            (asked, (false, Some(r#"{"approved":true}"#.to_owned()))),
            (timing, (true, None)),
        ])
    );
}

/// The lease of the tasks agents hold across the leader's death: longer than finding
/// the new leader takes (the client's silence limit of 2 s, overlapping an election),
/// far shorter than QUIC's 30 s idle timeout, which used to strand agents on a dead
/// leader until their leases had lapsed and their tasks had gone to others.
const FOLLOW_LEASE_MS: u64 = 8_000;

/// Longest the agents may take to be connected to the new leader after the kill.
const FOLLOW_WITHIN: Duration = Duration::from_secs(15);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_lived_agents_follow_a_killed_leader_and_run_nothing_twice() {
    let mut cluster = Cluster::start(NODES).await;
    let admin = cluster.client().await;
    for queue in ["sdk", "cli"] {
        admin
            .queue_create(
                queue,
                QueuePatch {
                    lease_ms: Some(FOLLOW_LEASE_MS),
                    ..QueuePatch::default()
                },
            )
            .await
            .expect("queue_create");
    }
    let enqueue = |queue: &'static str, n: usize| {
        let admin = admin.clone();
        async move {
            admin
                .enqueue_batch(queue, (0..n).map(task).collect())
                .await
                .expect("enqueue")
                .into_iter()
                .map(|t| t.id)
                .collect::<Vec<String>>()
        }
    };
    let (sdk_ids, cli_ids) = (enqueue("sdk", 2).await, enqueue("cli", 1).await);

    // The SDK's worker holds both its tasks until told to finish.
    let (started, mut starts) = tokio::sync::mpsc::unbounded_channel();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let worker = Worker::new(
        cluster.options(),
        WorkerConfig {
            capacity: 2,
            ..WorkerConfig::new("sdk-agent", ["sdk"])
        },
    );
    let handle = worker.handle();
    let held = Arc::clone(&gate);
    let running = tokio::spawn(worker.run(move |task| {
        let (started, gate) = (started.clone(), Arc::clone(&held));
        async move {
            let _ = started.send(task.id().to_owned());
            gate.acquire().await.expect("the gate").forget();
            Outcome::Ack(None)
        }
    }));
    // `muster work` runs a program that notes each run and waits for a file.
    let dir = tempfile::tempdir().expect("a directory");
    let (runs, go) = (dir.path().join("runs"), dir.path().join("go"));
    let script = format!(
        "cat >/dev/null; echo run >> {runs}; while [ ! -e {go} ]; do sleep 0.05; done",
        runs = runs.display(),
        go = go.display()
    );
    let _work = cluster.spawn_cli(&[
        "work",
        "cli",
        "--member",
        "cli-agent",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    let mut first = BTreeSet::new();
    while first.len() < sdk_ids.len() {
        first.insert(starts.recv().await.expect("a start"));
    }
    assert_eq!(first, sdk_ids.iter().cloned().collect::<BTreeSet<_>>());
    until(
        Duration::from_secs(30),
        "muster work runs its program",
        || {
            let runs = runs.clone();
            async move { runs.exists() }
        },
    )
    .await;
    drop(admin);

    let old = cluster.leader().await;
    cluster.kill9(old.node);
    let killed = Instant::now();
    let new = cluster.leader().await;
    assert_ne!(new.node, old.node);
    let admin = cluster.client().await;
    until(
        FOLLOW_WITHIN,
        "both agents are connected to the new leader",
        || {
            let admin = admin.clone();
            async move {
                let members = admin.member_list().await.unwrap_or_default();
                ["sdk-agent", "cli-agent"].iter().all(|name| {
                    members
                        .iter()
                        .any(|m| m.name == *name && m.state == MemberState::Connected)
                })
            }
        },
    )
    .await;
    eprintln!(
        "the agents were connected to the new leader {:.2} s after the kill",
        killed.elapsed().as_secs_f64()
    );

    // They finish with the leases they held: each task ran once, with one delivery.
    gate.add_permits(sdk_ids.len());
    std::fs::write(&go, b"").expect("the go file");
    let all: Vec<String> = sdk_ids.iter().chain(&cli_ids).cloned().collect();
    let reply = admin.wait(all.clone(), 30_000).await.expect("wait");
    assert!(
        reply.pending.is_empty(),
        "not finished: {:?}",
        reply.pending
    );
    for t in &reply.finished {
        let events: Vec<&str> = t.history.iter().map(|e| e.event.as_str()).collect();
        assert_eq!(
            (t.state, t.deliveries, events),
            (TaskState::Done, 1, vec!["enqueued", "leased", "done"]),
            "task {}",
            t.id
        );
    }
    assert!(starts.try_recv().is_err(), "an SDK task ran twice");
    let cli_runs = std::fs::read_to_string(&runs).expect("the runs file");
    assert_eq!(cli_runs, "run\n", "the program's runs");
    handle.shutdown();
    running
        .await
        .expect("the worker's task")
        .expect("a clean stop");
}

/// `muster enqueue QUEUE -` across a kill -9 of the leader it streams to: every id it
/// printed is stored on the new leader, nothing else is, and the lines sent after the
/// kill are named as sent without an answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_from_stdin_across_a_leader_kill_prints_exactly_what_is_stored() {
    let mut cluster = Cluster::start(NODES).await;
    cluster.ok(&["queue", "create", "stream"]).await;
    let mut feeder = Feeder::spawn(cluster.cli_command(&["enqueue", "stream", "-"]));
    let mut acknowledged = BTreeSet::new();
    for n in 1..=3 {
        feeder.send(&format!("{{\"n\":{n}}}"));
        acknowledged.insert(feeder.id());
    }
    let old = cluster.leader().await;
    cluster.kill9(old.node);
    feeder.send(r#"{"n":4}"#);
    feeder.send(r#"{"n":5}"#);
    let (status, rest, stderr) = tokio::task::spawn_blocking(move || feeder.finish())
        .await
        .expect("the feeder's exit");
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(rest.is_empty(), "no more ids: {rest:?}");
    let stderr = stderr.trim_end();
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(
        stderr.starts_with("muster: line 4: connection lost: "),
        "{stderr}"
    );
    assert!(
        stderr.ends_with(
            "3 lines enqueued (their ids printed); 2 sent without an answer (outcome_unknown: they may be stored; enqueue them again with idempotency keys): lines 4-5; stdin was not read past line 5"
        ),
        "{stderr}"
    );
    let new = cluster.leader().await;
    assert_ne!(new.node, old.node);
    let client = cluster.client().await;
    let stored: BTreeSet<String> = tasks_in(&client, "stream", TaskState::Ready)
        .await
        .into_keys()
        .collect();
    assert_eq!(stored, acknowledged);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adding_a_node_that_cannot_catch_up_leaves_the_voters_unchanged() {
    let cluster = Cluster::start(NODES).await;
    let leader = cluster.leader().await;
    // A port where nothing listens (bound, then closed) for the node's cluster address.
    let silent = std::net::UdpSocket::bind("127.0.0.1:0")
        .expect("a UDP port")
        .local_addr()
        .expect("its address")
        .to_string();
    // Node 9 at that address, waiting `catch_up` for it.
    let add_silent = |catch_up: &'static str| {
        let (cluster, silent) = (&cluster, silent.clone());
        async move {
            let args = [
                "cluster",
                "add",
                "9",
                "--node-addr",
                &silent,
                "--cluster-addr",
                &silent,
            ];
            cluster
                .cli(&[&args[..], &["--catch-up", catch_up]].concat())
                .await
        }
    };
    let out = add_silent("2s").await;
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "muster: invalid_state: node 9 did not catch up within 2.0 s (it has not answered the leader at all): it stays a learner and the cluster's voters are unchanged; is it running, reachable at its cluster address, and started with this cluster's id and secret? (`muster cluster remove 9` takes it out)\n"
    );
    let status = cluster.status(leader.node).await;
    assert_eq!(status.voters, [1, 2, 3], "{status:?}");
    assert_eq!(status.learners, [9], "{status:?}");
    // Asking again (to promote it) fails the same way; removing it works.
    let again = add_silent("1s").await;
    assert_eq!(again.status.code(), Some(1));
    cluster.ok(&["cluster", "remove", "9"]).await;
    // Both changes are in the leader's audit trail.
    let audited: Vec<(String, String)> = cluster
        .log(leader.node)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["fields"]["message"] == "operator action")
        .map(|v| {
            let field = |k: &str| v["fields"][k].as_str().unwrap_or_default().to_owned();
            (field("op"), field("target"))
        })
        .filter(|(_, target)| target.starts_with("node 9"))
        .collect();
    assert_eq!(
        audited,
        [
            ("cluster_add".to_owned(), "node 9 (a learner)".to_owned()),
            ("cluster_remove".to_owned(), "node 9".to_owned()),
        ]
    );
    let status = cluster.status(leader.node).await;
    assert_eq!(status.voters, [1, 2, 3], "{status:?}");
    assert!(status.learners.is_empty(), "{status:?}");
    // The cluster still serves.
    cluster.ok(&["queue", "create", "after"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_under_faults_loses_nothing() {
    let config = cluster::Config::from_env();
    let report = cluster::check(config.clone()).await;
    assert!(report.is_clean(), "the checker found violations: {report}");
    if config.run_for.is_none() {
        assert_eq!(report.faults, config.faults, "{report}");
    }
    assert!(report.acknowledged > 0, "nothing acknowledged: {report}");
    assert!(report.children > 0, "no child spawned: {report}");
    assert_eq!(
        report.done as usize,
        report.acknowledged + report.recovered,
        "{report}"
    );
}

/// Log entries after which each node snapshots and compacts its log.
const SNAPSHOT_EVERY: &str = "100";

/// Tasks enqueued one per request (one log entry each) before the new node joins:
/// several snapshots' worth.
const COMPACTED_TASKS: usize = 500;

/// Most leaders killed to make the new node the leader; each election goes to it with
/// a chance of about a half, so all of them missing it is a one in 65,000 event.
const MAX_FAILOVERS: usize = 16;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_added_after_compaction_gets_a_snapshot() {
    let mut cluster = Cluster::start_with(2, &["--cluster-snapshot-every", SNAPSHOT_EVERY]).await;
    let client = cluster.client().await;
    client
        .queue_create("snap", QueuePatch::default())
        .await
        .expect("queue_create");
    let mut ids = BTreeSet::new();
    for n in 0..COMPACTED_TASKS {
        ids.insert(client.enqueue("snap", task(n)).await.expect("enqueue").id);
    }
    drop(client);
    let added = cluster.add_node().await;
    // The log before the last snapshot was purged: the new node could only catch up
    // from a snapshot (`add_node` returns once it has).
    // (Its log is copied from its stderr by a thread: read until the line is there.)
    let c = &cluster;
    until(
        Duration::from_secs(10),
        "the added node logs the snapshot it installed",
        || async move {
            c.log(added)
                .contains("installed a snapshot from the leader")
        },
    )
    .await;

    // Kill whoever else leads until the new node does: it must then serve from what
    // the snapshot gave it.
    for failovers in 0.. {
        let leader = cluster.leader().await;
        if leader.node == added {
            break;
        }
        assert!(
            failovers < MAX_FAILOVERS,
            "node {added} did not become the leader in {MAX_FAILOVERS} failovers"
        );
        cluster.kill9(leader.node);
        cluster.leader().await;
        cluster.restart(leader.node).await;
    }
    let before = cluster.leader().await;
    let client = cluster.client().await;
    let ready = tasks_in(&client, "snap", TaskState::Ready).await;
    assert_eq!(ready.keys().cloned().collect::<BTreeSet<_>>(), ids);
    assert_eq!(
        cluster.leader().await,
        before,
        "the leadership moved while the tasks were read"
    );
    assert_eq!(before.node, added);
}

/// How long a follower is kept alone: five times the longest election timeout, so that
/// without a pre-vote it would have raised its term several times. Time alone is what
/// the test is about, so it waits it out.
const ALONE: Duration = Duration::from_secs(4);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_back_from_a_partition_rejoins_without_an_election() {
    let cluster = Cluster::start_relayed(NODES).await;
    let client = cluster.client().await;
    client
        .queue_create("steady", QueuePatch::default())
        .await
        .expect("queue_create");
    let before = cluster.leader().await;
    let follower = cluster.follower(before.node, 0);
    assert_eq!(cluster.status(follower).await.term, before.term);

    cluster.partition_node(follower);
    tokio::time::sleep(ALONE).await;
    let alone = cluster.status(follower).await;
    assert_eq!(
        alone.term, before.term,
        "the follower raised its term alone: {alone:?}"
    );
    // The leader and the other follower serve meanwhile.
    client
        .enqueue("steady", task(1))
        .await
        .expect("enqueue while one node is away");

    cluster.heal_node(follower);
    cluster.wait_caught_up(follower).await;
    let after = cluster.leader().await;
    assert_eq!(
        (after.node, after.term),
        (before.node, before.term),
        "the rejoining node forced an election"
    );
    // The same connection still serves: a leadership change would have closed it.
    client
        .enqueue("steady", task(2))
        .await
        .expect("enqueue after the heal");
    assert_eq!(cluster.status(follower).await.term, before.term);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_survivor_is_forced_into_a_one_node_cluster_with_everything_it_held() {
    let mut cluster = Cluster::start(NODES).await;
    let admin = cluster.client().await;
    admin
        .queue_create("kept", QueuePatch::default())
        .await
        .expect("queue_create");
    let ids: BTreeSet<String> = admin
        .enqueue_batch("kept", (0..TASKS).map(task).collect())
        .await
        .expect("enqueue")
        .into_iter()
        .map(|t| t.id)
        .collect();
    drop(admin);
    let leader = cluster.leader().await;
    let survivor = cluster.follower(leader.node, 0);
    cluster.wait_caught_up(survivor).await;

    // The majority is lost for good; the survivor alone cannot serve.
    for id in cluster.node_ids() {
        cluster.kill9(id);
    }
    cluster.restart(survivor).await;
    let alone = cluster.status(survivor).await;
    assert_eq!(alone.voters, [1, 2, 3], "{alone:?}");

    // Forced: it leads alone, with everything it held.
    cluster.kill9(survivor);
    cluster
        .restart_with(survivor, &["--cluster-force-single-node"])
        .await;
    let client = connect_node_when_leading(&cluster, survivor).await;
    let ready = tasks_in(&client, "kept", TaskState::Ready).await;
    assert_eq!(ready.keys().cloned().collect::<BTreeSet<_>>(), ids);
    let status = cluster.status(survivor).await;
    assert_eq!(
        (status.leader, status.voters.clone()),
        (Some(survivor), vec![survivor])
    );
    client
        .enqueue("kept", task(TASKS))
        .await
        .expect("an enqueue alone");
    assert!(
        cluster
            .log(survivor)
            .contains("forced a one-node cluster from this node's store"),
        "the forced recovery is logged"
    );

    // Started again with the flag left in place, it changes nothing.
    drop(client);
    cluster.kill9(survivor);
    cluster
        .restart_with(survivor, &["--cluster-force-single-node"])
        .await;
    let client = connect_node_when_leading(&cluster, survivor).await;
    assert_eq!(
        tasks_in(&client, "kept", TaskState::Ready).await.len(),
        TASKS + 1
    );
    assert_eq!(cluster.status(survivor).await.voters, [survivor]);
}

/// A client of exactly node `id`, once it leads (bounded by the harness's wait for a
/// leader).
async fn connect_node_when_leading(cluster: &Cluster, id: u64) -> Client {
    let deadline = Instant::now() + cluster::LEADER_TIMEOUT;
    loop {
        if let Ok(client) = Client::connect(cluster.node_options(id)).await
            && client.cluster().and_then(|c| c.leader) == Some(id)
        {
            return client;
        }
        assert!(Instant::now() < deadline, "node {id} does not lead alone");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
