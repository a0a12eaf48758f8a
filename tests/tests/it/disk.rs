//! A full disk: the daemon's data directory is a 16 MiB tmpfs the test mounts, and a
//! burst of enqueues fills it. The daemon acknowledges nothing it could not store, its
//! clients get an error (the connection closes) instead of hanging, it stops with a
//! non-zero exit and a clear log line, and after the file system grows and the daemon
//! restarts every acknowledged task is there with its payload and new work is taken.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use muster_sdk::{ErrorCode, NewTask, QueuePatch, TaskState};
use muster_tests::Daemon;

/// Bytes of each payload: 16 MiB hold a few hundred of them.
const PAYLOAD_BYTES: usize = 32 * 1024;
/// Concurrent enqueuers.
const SENDERS: u64 = 4;
/// Enqueues per sender: far more than fit (16 MiB / 32 KiB = 512 in all).
const PER_SENDER: u64 = 2_000;
/// Longest one enqueue may take: a hang fails the test.
const CALL_TIMEOUT: Duration = Duration::from_secs(20);

/// A tmpfs mounted by the test, unmounted when dropped.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Tmpfs {
        let dir = tempfile::tempdir().expect("mount point");
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .expect("running mount");
        assert!(
            out.status.success(),
            "this test needs to mount a tmpfs (root or CAP_SYS_ADMIN): mount failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn resize(&self, size: &str) {
        let out = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(self.dir.path())
            .output()
            .expect("running mount -o remount");
        assert!(
            out.status.success(),
            "remount failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

/// An incompressible payload (the store compresses blocks), the same for the same task.
fn payload(sender: u64, n: u64) -> String {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(sender << 32 | n);
    let pad: String = (0..PAYLOAD_BYTES)
        .map(|_| char::from(b"0123456789abcdef"[rng.random_range(0..16)]))
        .collect();
    format!(r#"{{"s":{sender},"n":{n},"pad":"{pad}"}}"#)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_acknowledges_nothing_unstored_and_recovers_after_space_is_freed() {
    let fs = Tmpfs::mount("16m");
    let mut d = Daemon::start_in(fs.path(), &[]);
    let data: PathBuf = d.data().to_path_buf();
    d.client()
        .await
        .queue_create("fill", QueuePatch::default())
        .await
        .unwrap();

    // (sender, n) -> task id, for every acknowledged enqueue.
    let acked: Arc<Mutex<BTreeMap<(u64, u64), String>>> = Arc::default();
    let mut senders = Vec::new();
    for s in 0..SENDERS {
        let client = d.client().await;
        let acked = Arc::clone(&acked);
        senders.push(tokio::spawn(async move {
            for n in 0..PER_SENDER {
                let task = NewTask::new(muster_sdk::protocol::ops::raw(&payload(s, n)).unwrap());
                let r = tokio::time::timeout(CALL_TIMEOUT, client.enqueue("fill", task))
                    .await
                    .expect("an enqueue hung on a full disk");
                match r {
                    Ok(t) => {
                        acked.lock().unwrap().insert((s, n), t.id);
                    }
                    Err(e) => return e,
                }
            }
            panic!("sender {s}: {PER_SENDER} enqueues of {PAYLOAD_BYTES} bytes fit in 16 MiB");
        }));
    }
    for s in senders {
        let e = s.await.unwrap();
        // The daemon stops on the write error and never replies to the requests of
        // the failed round: they see the connection close. Requests that reach it while
        // it stops are refused with `shutting_down`.
        match e.code() {
            Some(code) => assert_eq!(code, ErrorCode::ShuttingDown, "{e}"),
            None => assert!(e.to_string().starts_with("connection lost"), "{e}"),
        }
    }
    assert_eq!(
        d.wait_exit(Duration::from_secs(30)),
        Some(1),
        "the daemon goes on after a failed write"
    );
    let log = d.log();
    let last = log
        .lines()
        .rfind(|l| l.starts_with("musterd: "))
        .unwrap_or_else(|| panic!("no error line from musterd:\n{log}"));
    assert!(
        last.starts_with(
            "musterd: the store failed; nothing unacknowledged was reported as durable"
        ) && last.ends_with("No space left on device (os error 28)"),
        "{last}"
    );
    println!("full disk: {last}");
    let acked = acked.lock().unwrap().clone();
    assert!(
        !acked.is_empty(),
        "nothing was acknowledged before the disk filled"
    );

    fs.resize("64m");
    d.restart();
    assert_eq!(d.data(), data);
    let client = d.client().await;
    for ((s, n), id) in &acked {
        let t = client.task_get(id).await.unwrap();
        assert_eq!(
            (t.state, t.payload.get()),
            (TaskState::Ready, payload(*s, *n).as_str()),
            "task {id}"
        );
    }
    let counts = client.queue_describe("fill").await.unwrap().counts;
    // Unacknowledged enqueues may have landed (their reply was lost), never fewer.
    assert!(
        counts.ready >= acked.len() as u64,
        "{} ready, {} acknowledged",
        counts.ready,
        acked.len()
    );
    let recovered = counts.ready - acked.len() as u64;
    println!(
        "full disk: acknowledged={} recovered={recovered}",
        acked.len()
    );
    // The daemon works again: a new task goes in and comes out.
    let id = client
        .enqueue("fill", NewTask::new(muster_sdk::json(&"after").unwrap()))
        .await
        .unwrap()
        .id;
    let t = client.task_get(&id).await.unwrap();
    assert_eq!(t.state, TaskState::Ready);
    drop(client);
    drop(d);
}
