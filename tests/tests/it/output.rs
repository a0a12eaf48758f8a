//! Live output against real daemons: an SDK agent's chunks followed by `muster tail
//! -f` across a kill -9 of the daemon, and of a cluster's leader (no gap, no
//! duplicate), and `muster work --output stream` turning a program's stdout into its
//! task's output.

use std::sync::Arc;
use std::time::Duration;

use muster_sdk::{NewTask, Outcome, QueuePatch, TaskState, Worker, WorkerConfig};
use muster_tests::cluster::Cluster;
use muster_tests::{Daemon, until};

/// Lines the agent emits before and after the daemon's kill.
const BEFORE: usize = 200;
const AFTER: usize = 200;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_sees_a_stream_whole_across_a_kill_9_of_the_daemon() {
    let mut d = Daemon::start();
    let client = d.client().await;
    client
        .queue_create("talk", QueuePatch::default())
        .await
        .unwrap();
    let id = client
        .enqueue("talk", NewTask::new(muster_sdk::raw_json("{}").unwrap()))
        .await
        .unwrap()
        .id;
    client.close().await;
    // The followers start before any output: they wait for the first chunk. One is
    // `muster tail -f`, one the SDK's follower in this process.
    let tail = d.spawn_cli(&["tail", "-f", &id]);
    let mut follower = muster_sdk::Follower::new(d.options(), &id, 0);
    let sdk_follower = tokio::spawn(async move {
        let mut text = String::new();
        while let Some(reply) = follower.next().await.expect("following") {
            assert_eq!(reply.dropped, 0);
            for c in reply.chunks {
                text.push_str(c.text.as_deref().expect("text chunks"));
            }
        }
        (text, follower.position())
    });
    let go_on = Arc::new(tokio::sync::Notify::new());
    let worker = Worker::new(d.options(), WorkerConfig::new("talker", ["talk"]));
    let handle = worker.handle();
    let resume = Arc::clone(&go_on);
    let run = tokio::spawn(worker.run(move |task| {
        let resume = Arc::clone(&resume);
        async move {
            // A JSON null is no JSON on the wire: refused here, output goes on.
            let null = muster_sdk::Chunk::json(muster_sdk::raw_json("null").unwrap());
            match task.emit(null).await {
                Err(muster_sdk::Error::InvalidInput(e)) => {
                    assert_eq!(e, "a JSON chunk cannot be null")
                }
                other => panic!("a null chunk: {other:?}"),
            }
            for i in 0..BEFORE {
                task.emit_text(format!("line {i}\n")).await.unwrap();
            }
            task.flush_output().await.unwrap();
            resume.notified().await;
            for i in BEFORE..BEFORE + AFTER {
                task.emit_text(format!("line {i}\n")).await.unwrap();
                if i % 50 == 0 {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
            Outcome::Ack(None)
        }
    }));
    let seen = tail.lines_matching(BEFORE, Duration::from_secs(20), |_| true);
    assert_eq!(seen.last().map(String::as_str), Some("line 199"));
    // kill -9 with a follower and an emitter connected; both go on after the restart.
    d.kill9();
    d.restart();
    go_on.notify_one();
    let rest = tail.lines_matching(AFTER, Duration::from_secs(60), |_| true);
    let mut tail = tail;
    assert_eq!(
        tail.wait(Duration::from_secs(30)),
        Some(0),
        "the follow ends with the task"
    );
    let all: Vec<String> = seen.into_iter().chain(rest).collect();
    let want: Vec<String> = (0..BEFORE + AFTER).map(|i| format!("line {i}")).collect();
    assert_eq!(all, want, "every line once, in order");
    let (text, position) = tokio::time::timeout(Duration::from_secs(30), sdk_follower)
        .await
        .expect("the SDK's follower ended with the task")
        .unwrap();
    assert_eq!(
        text,
        want.iter().map(|l| format!("{l}\n")).collect::<String>(),
        "the SDK's follower too"
    );
    assert_eq!(position, (BEFORE + AFTER) as u64);

    let client = d.client().await;
    until(Duration::from_secs(10), "the task done", || async {
        client.task_get(&id).await.unwrap().state == TaskState::Done
    })
    .await;
    let t = client.task_get(&id).await.unwrap();
    let out = t.output.expect("an output summary");
    assert_eq!((out.first, out.next), (0, (BEFORE + AFTER) as u64));
    // Read again afterwards: all of it, from a number, and as JSON lines.
    let whole = d.ok(&["tail", &id]);
    assert_eq!(
        whole,
        want.iter().map(|l| format!("{l}\n")).collect::<String>()
    );
    assert_eq!(
        d.ok(&["tail", &id, "--from", "397"]),
        "line 397\nline 398\nline 399\n"
    );
    let json = d.ok(&["--json", "tail", &id, "--from", "399"]);
    let chunk: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    assert_eq!(
        (chunk["n"].as_u64(), chunk["text"].as_str()),
        (Some(399), Some("line 399\n"))
    );
    let refused = d.cli(&["tail", &id, "--from", "401"]);
    assert_eq!(refused.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&refused.stderr).trim(),
        format!("muster: bad_request: follow from chunk 401: task {id} has emitted 400 chunks")
    );
    stop(handle, run).await;
}

#[test]
fn muster_work_streams_a_programs_stdout_as_its_tasks_output() {
    let (d, id, shown) = streamed(
        "for i in 1 2 3; do echo \"step $i\"; done; printf 'd\\303'; sleep 0.3; printf '\\251one\\n'",
    );
    assert!(shown.contains("\nresult\t-\n"), "{shown}");
    // A character cut between two writes arrives whole.
    assert_eq!(d.ok(&["tail", &id]), "step 1\nstep 2\nstep 3\ndéone\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_followed_stream_goes_on_whole_across_the_leaders_kill_9() {
    let mut cluster = Cluster::start(3).await;
    let client = cluster.client().await;
    client
        .queue_create("talk", QueuePatch::default())
        .await
        .unwrap();
    let id = client
        .enqueue("talk", NewTask::new(muster_sdk::raw_json("{}").unwrap()))
        .await
        .unwrap()
        .id;
    drop(client);
    let tail = cluster.spawn_cli(&["tail", "-f", &id]);
    let go_on = Arc::new(tokio::sync::Notify::new());
    let worker = Worker::new(cluster.options(), WorkerConfig::new("talker", ["talk"]));
    let handle = worker.handle();
    let resume = Arc::clone(&go_on);
    let run = tokio::spawn(worker.run(move |task| {
        let resume = Arc::clone(&resume);
        async move {
            for i in 0..BEFORE {
                task.emit_text(format!("line {i}\n")).await.unwrap();
            }
            task.flush_output().await.unwrap();
            resume.notified().await;
            // Emits go on while the new leader is found: they wait in the buffer and
            // are sent (again, if a reply was lost) once it is.
            for i in BEFORE..BEFORE + AFTER {
                task.emit_text(format!("line {i}\n")).await.unwrap();
            }
            Outcome::Ack(None)
        }
    }));
    let seen = tail.lines_matching(BEFORE, Duration::from_secs(30), |_| true);
    let old = cluster.leader().await;
    cluster.kill9(old.node);
    go_on.notify_one();
    let rest = tail.lines_matching(AFTER, Duration::from_secs(60), |_| true);
    let mut tail = tail;
    assert_eq!(tail.wait(Duration::from_secs(30)), Some(0));
    let all: Vec<String> = seen.into_iter().chain(rest).collect();
    let want: Vec<String> = (0..BEFORE + AFTER).map(|i| format!("line {i}")).collect();
    assert_eq!(all, want, "every line once, in order");
    let new = cluster.leader().await;
    assert_ne!(new.node, old.node);
    let client = cluster.client().await;
    let t = client.task_get(&id).await.unwrap();
    assert_eq!(t.state, TaskState::Done);
    assert_eq!(t.output.map(|o| o.next), Some((BEFORE + AFTER) as u64));
    stop(handle, run).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suspend_sends_the_output_emitted_before_it() {
    let d = Daemon::start();
    let client = d.client().await;
    client
        .queue_create("ask", QueuePatch::default())
        .await
        .unwrap();
    let id = client
        .enqueue("ask", NewTask::new(muster_sdk::raw_json("{}").unwrap()))
        .await
        .unwrap()
        .id;
    let worker = Worker::new(d.options(), WorkerConfig::new("asker", ["ask"]));
    let handle = worker.handle();
    let run = tokio::spawn(worker.run(|task| async move {
        for i in 0..50 {
            task.emit_text(format!("thought {i}\n")).await.unwrap();
        }
        // At once: the chunks still buffered go before the suspend ends the lease.
        task.suspend(muster_sdk::Suspension::new("may I?"))
            .await
            .unwrap();
        Outcome::Suspended
    }));
    until(Duration::from_secs(10), "the task suspended", || async {
        client.task_get(&id).await.unwrap().state == TaskState::Suspended
    })
    .await;
    let t = client.task_get(&id).await.unwrap();
    assert_eq!(t.output.map(|o| (o.first, o.next)), Some((0, 50)));
    stop(handle, run).await;
}

#[test]
fn muster_work_streams_a_burst_past_the_limit_to_its_end() {
    // 1.5 MB at once, then exit: past the burst the rate holds the runner back, and
    // the end still arrives (the oldest is dropped past 1 MiB kept).
    let (d, id, _) = streamed("head -c 1500000 /dev/zero | tr '\\0' x; echo END");
    let out = d.cli(&["tail", &id]);
    assert_eq!(out.status.code(), Some(0));
    assert!(out.stdout.ends_with(b"xxxEND\n"), "the end arrived");
    assert!(
        out.stdout.len() < 1024 * 1024,
        "{} bytes kept",
        out.stdout.len()
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("muster: chunks 0 to ")
            && stderr.contains(&format!(" of task {id} were dropped")),
        "{stderr}"
    );
}

/// Stops a worker a test started, and waits for it to end cleanly.
async fn stop<E: std::fmt::Debug>(
    handle: muster_sdk::WorkerHandle,
    run: tokio::task::JoinHandle<Result<(), E>>,
) {
    handle.shutdown();
    tokio::time::timeout(Duration::from_secs(20), run)
        .await
        .expect("the worker stopped")
        .expect("the worker's task")
        .expect("the worker ended cleanly");
}

/// Runs `script` under `muster work --output stream` on one task until the task is
/// done: the daemon, the task's id and its `task get` text then.
fn streamed(script: &str) -> (Daemon, String, String) {
    let d = Daemon::start();
    d.ok(&["queue", "create", "q"]);
    let id = d.ok(&["enqueue", "q", "{}"]).trim().to_owned();
    let mut agent = d.spawn_cli(&[
        "work", "q", "--member", "streamer", "--output", "stream", "--", "sh", "-c", script,
    ]);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let shown = loop {
        let shown = d.ok(&["task", "get", &id]);
        if shown.contains("state\tdone") {
            break shown;
        }
        assert!(std::time::Instant::now() < deadline, "not done: {shown}");
        std::thread::sleep(Duration::from_millis(50));
    };
    agent.kill9();
    (d, id, shown)
}
