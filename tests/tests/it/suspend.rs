//! Suspended tasks against a real daemon: an SDK agent that asks a person and is
//! resumed through the CLI across a kill -9, `muster work`'s suspend file and the
//! resume data in the next run's environment, and the CLI's suspend with a timeout that
//! resumes, and a worker whose suspend reply is lost with its connection.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use muster_sdk::protocol::model::OnTimeout;
use muster_sdk::{NewTask, Outcome, QueuePatch, Suspension, TaskState, Worker, WorkerConfig};
use muster_tests::{Daemon, until};
use tokio::sync::mpsc;

/// A task the agent ran after a resume, and the resume's data as JSON text.
type Answer = (String, Option<String>);

fn task(payload: serde_json::Value) -> NewTask {
    NewTask::new(muster_sdk::json(&payload).expect("json"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_asks_a_person_frees_its_slot_and_resumes_with_the_answer_across_a_kill_9() {
    let mut d = Daemon::start();
    let client = d.client().await;
    client
        .queue_create("coding", QueuePatch::default())
        .await
        .unwrap();
    let merge = client
        .enqueue("coding", task(serde_json::json!({"pr": 42})))
        .await
        .unwrap()
        .id;
    let other = client
        .enqueue("coding", task(serde_json::json!({"pr": 43})))
        .await
        .unwrap()
        .id;
    // One agent of capacity one: the second task runs only once the first is
    // suspended and holds no slot.
    let mut config = WorkerConfig::new("coder", ["coding"]);
    config.capacity = 1;
    let worker = Worker::new(d.options(), config);
    let handle = worker.handle();
    let (tokens, mut token_rx) = mpsc::unbounded_channel::<String>();
    let answers: Arc<Mutex<Vec<Answer>>> = Arc::default();
    let seen = Arc::clone(&answers);
    let run = tokio::spawn(worker.run(move |task| {
        let (tokens, seen) = (tokens.clone(), Arc::clone(&seen));
        async move {
            let pr = task.payload().get().to_owned();
            if pr.contains("42") && task.resumed().is_none() {
                let reply = task
                    .suspend(Suspension::new("may I merge PR 42?"))
                    .await
                    .expect("suspend");
                tokens.send(reply.resume_token.expect("a token")).unwrap();
                return Outcome::Suspended;
            }
            let data = task
                .resumed()
                .and_then(|r| r.data.as_ref().map(|d| d.get().to_owned()));
            seen.lock().unwrap().push((task.id().to_owned(), data));
            Outcome::Ack(None)
        }
    }));
    let token = tokio::time::timeout(Duration::from_secs(10), token_rx.recv())
        .await
        .expect("the agent suspended in time")
        .expect("a token");
    until(Duration::from_secs(10), "the other task done", || async {
        client.task_get(&other).await.unwrap().state == TaskState::Done
    })
    .await;
    let t = client.task_get(&merge).await.unwrap();
    assert_eq!(
        (t.state, t.deliveries, t.failures),
        (TaskState::Suspended, 1, 0)
    );
    let info = t.suspension.expect("its suspension");
    assert_eq!(
        (info.reason.as_str(), info.member.as_str()),
        ("may I merge PR 42?", "coder")
    );
    let listed = d.ok(&["queue", "describe", "coding"]);
    assert!(listed.contains("suspended\t1"), "{listed}");

    // The daemon dies and comes back: the suspension and its token survive.
    d.kill9();
    d.restart();
    let out = d.cli(&["resume", &token, "--with", r#"{"approved":true}"#]);
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        d.log()
    );
    let resumed = String::from_utf8(out.stdout).unwrap();
    assert_eq!(resumed, format!("{merge}\tready\n"));
    // A token resumes once.
    let again = d.cli(&["resume", &token]);
    assert_eq!(again.status.code(), Some(1));
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(err.contains("stale_token"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");

    // The resume is audited: the principal and the task, never the token's secret.
    let secret = token.rsplit('.').next().unwrap().to_owned();
    let log = d.log();
    let audited: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("operator action") && l.contains(r#""op":"resume""#))
        .collect();
    assert_eq!(audited.len(), 1, "{log}");
    assert!(
        audited[0].contains(&format!(r#""target":"{merge}""#)),
        "{}",
        audited[0]
    );
    assert!(!log.contains(&secret), "the log holds the token's secret");
    let client = d.client().await;
    until(Duration::from_secs(20), "the resumed task done", || async {
        client.task_get(&merge).await.unwrap().state == TaskState::Done
    })
    .await;
    let seen = answers.lock().unwrap().clone();
    assert!(
        seen.contains(&(merge.clone(), Some(r#"{"approved":true}"#.into()))),
        "{seen:?}"
    );
    let t = client.task_get(&merge).await.unwrap();
    assert_eq!((t.deliveries, t.failures), (2, 0));
    let resumed = t.resumed.expect("how it was resumed");
    assert!(!resumed.timed_out);
    handle.shutdown();
    tokio::time::timeout(Duration::from_secs(20), run)
        .await
        .expect("the worker stopped")
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_muster_work_program_suspends_with_a_file_and_its_next_run_reads_the_resume() {
    let d = Daemon::start();
    let client = d.client().await;
    client
        .queue_create("review", QueuePatch::default())
        .await
        .unwrap();
    let id = client
        .enqueue("review", task(serde_json::json!({"doc": "q3"})))
        .await
        .unwrap()
        .id;
    // First run: ask and exit. Second run: print what the resume said, as the result.
    let script = r#"if [ -z "$MUSTER_RESUMED" ]; then
  printf '{"reason":"approve the q3 summary?","timeout_ms":600000,"on_timeout":"cancel"}' > "$MUSTER_SUSPEND_FILE"
else
  printf '%s' "$MUSTER_RESUMED"
fi"#;
    let log_dir = tempfile::tempdir().unwrap();
    let log_path = log_dir.path().join("work.log");
    // Its log is read as it goes; dropped, its process group is killed.
    let mut work = d.spawn_cli_logged(
        &[
            "work", "review", "--member", "reviewer", "--grace", "1s", "--", "sh", "-c", script,
        ],
        &log_path,
    );
    let read_log = || std::fs::read_to_string(&log_path).unwrap();
    until(Duration::from_secs(15), "the task suspended", || async {
        client.task_get(&id).await.unwrap().state == TaskState::Suspended
    })
    .await;
    let t = client.task_get(&id).await.unwrap();
    let info = t.suspension.expect("suspended");
    assert_eq!(
        (info.reason.as_str(), info.on_timeout, t.failures),
        ("approve the q3 summary?", OnTimeout::Cancel, 0)
    );
    // The runner logged the token, for whoever decides.
    until(Duration::from_secs(5), "the token logged", || async {
        read_log().lines().any(|l| {
            l.contains(r#"outcome="suspended""#) && l.contains(&format!("resume_token={id}.1."))
        })
    })
    .await;
    // An approver resumes by id.
    assert_eq!(
        d.ok(&["resume", "--task", &id, "--with", r#"{"ok":1}"#]),
        format!("{id}\tready\n")
    );
    until(Duration::from_secs(15), "the resumed run done", || async {
        client.task_get(&id).await.unwrap().state == TaskState::Done
    })
    .await;
    let result: serde_json::Value =
        serde_json::from_str(client.task_get(&id).await.unwrap().result.unwrap().get()).unwrap();
    assert_eq!(
        (
            &result["data"],
            result["timed_out"].as_bool(),
            result["by"].as_str()
        ),
        (&serde_json::json!({"ok": 1}), Some(false), Some("local")),
        "{}",
        read_log()
    );
    work.signal("-TERM");
    let code = tokio::task::block_in_place(|| work.wait(Duration::from_secs(20)));
    assert_eq!(code, Some(0), "{}", read_log());
}

#[test]
fn the_cli_suspends_a_claim_and_its_timeout_resumes_it() {
    let d = Daemon::start();
    d.ok(&["queue", "create", "jobs"]);
    let id = d.ok(&["enqueue", "jobs", "{}"]).trim().to_owned();
    let claimed = d.ok(&["claim", "jobs"]);
    let claim = format!("{id}.1");
    assert!(claimed.starts_with(&claim), "{claimed}");
    let bad = d.cli(&["suspend", &claim, "--reason", "wait", "--timeout", "400d"]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("bad_request"));
    let token = d.ok(&[
        "suspend",
        &claim,
        "--reason",
        "waiting for the nightly export",
        "--timeout",
        "1s",
        "--on-timeout",
        "resume",
    ]);
    assert!(token.starts_with(&format!("{id}.1.")), "{token}");
    let shown = d.ok(&["task", "get", &id]);
    assert!(shown.contains("state\tsuspended"), "{shown}");
    assert!(
        shown.contains("suspended\treason=\"waiting for the nightly export\""),
        "{shown}"
    );
    // The lease is gone: an ack of the claim is refused.
    let ack = d.cli(&["ack", &claim]);
    assert!(String::from_utf8_lossy(&ack.stderr).contains("lease_lost"));
    let mut waited = 0;
    let line = loop {
        let line = d.ok(&["claim", "jobs", "--wait", "5s"]);
        if !line.is_empty() || waited >= 3 {
            break line;
        }
        waited += 1;
    };
    assert!(line.starts_with(&format!("{id}.2\t2\t")), "{line}");
    let shown = d.ok(&["task", "get", &id]);
    assert!(shown.contains("resumed\tby=- at="), "{shown}");
    assert!(shown.contains("timed_out=true data=-"), "{shown}");
}

/// A worker's suspend reaches the daemon but its reply is lost with the connection: the
/// worker gives the silent connection up, asks again on its next one (the repeat gets
/// a new token, the lost one is replaced), and hands the token that works to its
/// handler; the task was suspended once and resumes with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suspend_whose_reply_is_lost_is_asked_again_and_its_handler_gets_a_token_that_works() {
    use muster_sdk::protocol::model::MemberState;
    use muster_tests::relay::{Direction, Relay};
    let d = Daemon::start();
    let client = d.client().await;
    client
        .queue_create("gate", QueuePatch::default())
        .await
        .unwrap();
    let relay = Relay::start(d.addr.parse().expect("daemon address"))
        .await
        .expect("relay");
    let mut options = d.options();
    options.addr = relay.addr().to_string();
    let (ready_tx, mut ready) = mpsc::unbounded_channel::<()>();
    let (go_tx, go) = tokio::sync::watch::channel(false);
    let (tokens, mut token_rx) = mpsc::unbounded_channel::<Result<String, String>>();
    let (done_tx, mut done) = mpsc::unbounded_channel::<Option<String>>();
    let worker = Worker::new(options, WorkerConfig::new("gatekeeper", ["gate"]));
    let handle = worker.handle();
    let run = tokio::spawn(worker.run(move |task| {
        let (ready_tx, tokens, done_tx) = (ready_tx.clone(), tokens.clone(), done_tx.clone());
        let mut go = go.clone();
        async move {
            if let Some(r) = task.resumed() {
                let _ = done_tx.send(r.data.as_ref().map(|d| d.get().to_owned()));
                return Outcome::Ack(None);
            }
            let _ = ready_tx.send(());
            let _ = go.wait_for(|go| *go).await;
            match task.suspend(Suspension::new("may I?")).await {
                Ok(reply) => {
                    let _ = tokens.send(Ok(reply.resume_token.expect("a token")));
                    Outcome::Suspended
                }
                Err(e) => {
                    let _ = tokens.send(Err(e.to_string()));
                    Outcome::Release
                }
            }
        }
    }));
    let id = client
        .enqueue("gate", task(serde_json::json!({"pr": 7})))
        .await
        .unwrap()
        .id;
    tokio::time::timeout(Duration::from_secs(10), ready.recv())
        .await
        .expect("the handler started")
        .expect("a handler");
    // Nothing from the daemon reaches the worker: the suspend's reply is lost.
    relay.cut(Direction::Back);
    go_tx.send(true).unwrap();
    until(Duration::from_secs(10), "the task suspended", || async {
        client.task_get(&id).await.unwrap().state == TaskState::Suspended
    })
    .await;
    // The worker gives the silent connection up (its call goes unanswered); then
    // packets flow again, to its next connection.
    until(
        Duration::from_secs(45),
        "the old connection closed",
        // Gone, or forgotten: a member with no lease is dropped with its connection.
        || async {
            client
                .member_describe("gatekeeper")
                .await
                .map_or(true, |d| d.member.state == MemberState::Gone)
        },
    )
    .await;
    relay.heal();
    let token = tokio::time::timeout(Duration::from_secs(20), token_rx.recv())
        .await
        .expect("the handler got an answer")
        .expect("a handler")
        .expect("the suspend asked again succeeds");
    let t = client.task_get(&id).await.unwrap();
    let suspends = t.history.iter().filter(|e| e.event == "suspended").count();
    assert_eq!(
        (t.state, t.deliveries, t.failures, suspends),
        (TaskState::Suspended, 1, 0, 1)
    );
    client
        .resume(&token, Some(muster_sdk::json(&"yes").unwrap()))
        .await
        .expect("the handler's token resumes");
    let data = tokio::time::timeout(Duration::from_secs(20), done.recv())
        .await
        .expect("the task ran again")
        .expect("a handler");
    assert_eq!(data.as_deref(), Some("\"yes\""));
    handle.shutdown();
    tokio::time::timeout(Duration::from_secs(20), run)
        .await
        .expect("the worker stopped")
        .unwrap()
        .unwrap();
}
