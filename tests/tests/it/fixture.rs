//! Stores written by earlier versions open with every task, lease and member binding
//! intact. `tests/fixtures/store-v1` was written by musterd as of commit 0106c23 (store
//! format 1, before the format was recorded in the store): a queue `fixture` (lease
//! 1 h, retention 365 d) with one task in each state, the leased one held by member
//! `agent-1` of principal `agents` with a progress checkpoint; `ids.json` names them.
//! Every later version must open it, and this test says so.

use std::path::PathBuf;

use muster_sdk::protocol::ops::SessionOpen;
use muster_sdk::{ErrorCode, NewTask, TaskState};
use muster_tests::Daemon;

/// The tokens `muster.toml` of the fixture names (by their SHA-256).
const ADMIN: &str = "fixture-admin-token";
const AGENT: &str = "fixture-agent-token";
/// A third principal the test adds, to show the member binding holds.
const OTHER: &str = "fixture-other-token";

fn fixture() -> PathBuf {
    muster_tests::fixtures_dir().join("store-v1")
}

fn sha256_hex(text: &str) -> String {
    let out = std::process::Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(text.as_bytes())?;
            child.wait_with_output()
        })
        .expect("sha256sum");
    String::from_utf8(out.stdout).expect("utf-8")[..64].to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_format_1_store_opens_with_every_task_lease_and_member_binding() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("muster.toml");
    let mut toml = std::fs::read_to_string(fixture().join("muster.toml")).unwrap();
    toml.push_str(&format!(
        "\n[[tokens]]\nname = \"others\"\ntoken_sha256 = \"{}\"\nroles = [\"consume\"]\n",
        sha256_hex(OTHER)
    ));
    std::fs::write(&config, toml).unwrap();
    let ids: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture().join("ids.json")).unwrap())
            .unwrap();
    let id = |state: &str| ids[state].as_str().unwrap().to_owned();
    let mut d = Daemon::start_from(
        &fixture().join("store"),
        &["--config", config.to_str().unwrap()],
    );
    let admin = d.client_as(ADMIN).await;

    let q = admin.queue_describe("fixture").await.unwrap();
    assert_eq!(
        (
            q.options.lease_ms,
            q.options.max_attempts,
            q.options.retention_ms
        ),
        (3_600_000, 5, 365 * 24 * 3_600_000)
    );
    assert_eq!(
        (
            q.counts.scheduled,
            q.counts.ready,
            q.counts.leased,
            q.counts.dead
        ),
        (1, 1, 1, 1)
    );

    let leased = admin.task_get(&id("leased")).await.unwrap();
    assert_eq!(leased.state, TaskState::Leased);
    let lease = leased.lease.clone().unwrap();
    assert_eq!((lease.member.as_str(), lease.epoch), ("agent-1", 1));
    assert_eq!(leased.progress.unwrap().get(), "{\"step\":3}");
    assert_eq!(leased.payload.get(), r#"{"task":"a","held":true}"#);

    // Finished tasks are kept for the queue's retention (365 d from when they finished).
    let finished_within_retention = |t: &muster_sdk::TaskInfo| {
        t.updated_ms + 365 * 24 * 3_600_000 > u64::try_from(wall_ms()).unwrap()
    };
    let done = admin.task_get(&id("done")).await.unwrap();
    assert!(
        finished_within_retention(&done),
        "regenerate the fixture: it is a year old"
    );
    assert_eq!(
        (done.state, done.result.unwrap().get()),
        (TaskState::Done, "{\"ok\":true}")
    );
    let dead = admin.task_get(&id("dead")).await.unwrap();
    assert_eq!(
        (
            dead.state,
            dead.dead_reason.as_deref(),
            dead.last_error.as_deref()
        ),
        (TaskState::Dead, Some("dead_lettered"), Some("poison"))
    );
    let cancelled = admin.task_get(&id("cancelled")).await.unwrap();
    assert_eq!(cancelled.state, TaskState::Cancelled);
    let scheduled = admin.task_get(&id("scheduled")).await.unwrap();
    assert_eq!(scheduled.state, TaskState::Scheduled);
    assert!(scheduled.not_before_ms.unwrap() > u64::try_from(wall_ms()).unwrap());
    let ready = admin.task_get(&id("ready")).await.unwrap();
    assert_eq!(
        (
            ready.state,
            ready.priority,
            ready.key.as_deref(),
            ready.requires.clone(),
            ready.idempotency_key.as_deref()
        ),
        (
            TaskState::Ready,
            7,
            Some("k1"),
            vec!["gpu".to_owned()],
            Some("f-1")
        )
    );
    // The idempotency key still finds its task.
    let mut again = NewTask::new(muster_sdk::json(&serde_json::json!({"task": "f"})).unwrap());
    again.idempotency_key = Some("f-1".into());
    let dup = admin.enqueue("fixture", again).await.unwrap();
    assert_eq!(
        (dup.id.as_str(), dup.duplicate),
        (id("ready").as_str(), true)
    );

    // The member binding survived: another principal cannot take agent-1's session...
    let open = |reclaim: bool, resume: bool| SessionOpen {
        member: "agent-1".into(),
        labels: vec![],
        capacity: 1,
        reclaim,
        resume,
        liveness_ms: None,
    };
    let other = d.client_as(OTHER).await;
    let e = other.open_session(&open(false, true)).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Forbidden), "{e}");
    // ...while its owner resumes it with the lease as it was.
    let agent = d.client_as(AGENT).await;
    let (reply, _pushes) = agent.open_session(&open(false, true)).await.unwrap();
    assert_eq!(reply.kept, 1);
    agent
        .renew(&id("leased"), 1, None, None)
        .await
        .expect("the owner renews the restored lease");

    // The store now records its format; it opens again after a restart.
    drop((admin, other, agent));
    assert_eq!(d.terminate(), Some(0));
    d.restart();
    let admin = d.client_as(ADMIN).await;
    assert_eq!(
        admin.task_get(&id("leased")).await.unwrap().state,
        TaskState::Leased
    );
}

fn wall_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis()
}
