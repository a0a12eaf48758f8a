//! Stores written by earlier versions open with every task, lease and member binding
//! intact. `tests/fixtures/store-v1` was written by musterd as of commit 0106c23 (store
//! format 1, before the format was recorded in the store): a queue `fixture` (lease
//! 1 h, retention 365 d) with one task in each state, the leased one held by member
//! `agent-1` of principal `agents` with a progress checkpoint; `ids.json` names them.
//! Every later version must open it, and this test says so; since format 2 its task
//! records are read as JSON and rewritten in binary as they change.

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
    // The fixture ages: its scheduled task falls due 300 days after it was written and
    // its finished tasks expire 365 days after they finished. From then on the test
    // checks that the daemon moved and removed them instead.
    let now = u64::try_from(wall_ms()).unwrap();
    let scheduled = admin.task_get(&id("scheduled")).await.unwrap();
    let due_ms = scheduled
        .not_before_ms
        .expect("a delayed task keeps its time");
    let due = now >= due_ms;
    let expires_ms = ulid_ms(&id("done")) + RETENTION_MS;
    let expired = match now {
        n if n + EXPIRY_MARGIN_MS < expires_ms => false,
        n if n > expires_ms + EXPIRY_MARGIN_MS => true,
        _ => panic!("run this test again in an hour: the fixture's finished tasks expire now"),
    };
    assert_eq!(
        (
            q.counts.scheduled,
            q.counts.ready,
            q.counts.leased,
            q.counts.dead,
            q.counts.done,
            q.counts.cancelled
        ),
        (
            u64::from(!due),
            1 + u64::from(due),
            1,
            1,
            u64::from(!expired),
            u64::from(!expired)
        )
    );

    let leased = admin.task_get(&id("leased")).await.unwrap();
    assert_eq!(leased.state, TaskState::Leased);
    let lease = leased.lease.clone().unwrap();
    assert_eq!((lease.member.as_str(), lease.epoch), ("agent-1", 1));
    assert_eq!(leased.progress.unwrap().get(), "{\"step\":3}");
    assert_eq!(leased.payload.get(), r#"{"task":"a","held":true}"#);

    // Finished tasks are kept for the queue's retention (365 d from when they finished).
    if expired {
        for finished in ["done", "cancelled"] {
            let e = admin.task_get(&id(finished)).await.unwrap_err();
            assert_eq!(e.code(), Some(ErrorCode::NotFound), "{finished}: {e}");
        }
    } else {
        let done = admin.task_get(&id("done")).await.unwrap();
        assert_eq!(
            (done.state, done.result.unwrap().get()),
            (TaskState::Done, "{\"ok\":true}")
        );
        let cancelled = admin.task_get(&id("cancelled")).await.unwrap();
        assert_eq!(cancelled.state, TaskState::Cancelled);
    }
    let dead = admin.task_get(&id("dead")).await.unwrap();
    assert_eq!(
        (
            dead.state,
            dead.dead_reason.as_deref(),
            dead.last_error.as_deref()
        ),
        (TaskState::Dead, Some("dead_lettered"), Some("poison"))
    );
    let want = if due {
        TaskState::Ready
    } else {
        TaskState::Scheduled
    };
    assert_eq!(scheduled.state, want);
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
        held: None,
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

    // The store now records its format; it opens again after a restart, the records
    // rewritten since (the lease, in format 2) next to those that were not (format 1).
    drop((admin, other, agent));
    assert_eq!(d.terminate(), Some(0));
    d.restart();
    let admin = d.client_as(ADMIN).await;
    let leased = admin.task_get(&id("leased")).await.unwrap();
    assert_eq!(
        (
            leased.state,
            leased.lease.map(|l| (l.member, l.epoch)),
            leased.progress.unwrap().get()
        ),
        (
            TaskState::Leased,
            Some(("agent-1".to_owned(), 1)),
            "{\"step\":3}"
        )
    );
    let ready = admin.task_get(&id("ready")).await.unwrap();
    assert_eq!(
        (ready.state, ready.key.as_deref(), ready.requires),
        (TaskState::Ready, Some("k1"), vec!["gpu".to_owned()])
    );
}

/// The fixture queue's retention.
const RETENTION_MS: u64 = 365 * 24 * 3_600_000;

/// Around the fixture's expiry, finished tasks may or may not be gone: `make.py`
/// finished them within seconds of enqueueing them.
const EXPIRY_MARGIN_MS: u64 = 3_600_000;

/// The creation time of a task, from its id (a ULID's first 10 characters).
fn ulid_ms(id: &str) -> u64 {
    const CROCKFORD: &str = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";
    id[..10].chars().fold(0, |ms, c| {
        let digit = CROCKFORD
            .find(c.to_ascii_uppercase())
            .unwrap_or_else(|| panic!("{id}: not a ULID"));
        ms * 32 + digit as u64
    })
}

fn wall_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis()
}
