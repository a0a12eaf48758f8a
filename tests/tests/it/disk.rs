//! A full disk: the daemon's data directory is on a tmpfs the test mounts (as root, or
//! in an unprivileged user namespace) with 16 MiB free, and a burst of enqueues fills it. The daemon acknowledges nothing it could not store, its
//! clients get an error (the connection closes) instead of hanging, it stops with a
//! non-zero exit and a clear log line, and after the file system grows and the daemon
//! restarts every acknowledged task is there with its payload and new work is taken.
//! With the disk alarm set above what the disk holds, the daemon refuses enqueues
//! (`disk_full`) instead, serves agents meanwhile, and takes enqueues again once space
//! is freed.

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

/// A small tmpfs for the test: mounted directly when the test may (root), else inside
/// an unprivileged user and mount namespace (`unshare --user --map-root-user --mount`)
/// held by a `sleep`, and reached from outside through `/proc/<holder>/root`. Its free
/// space is bounded by a ballast file, removed to free space up (a remount would need
/// privileges the namespace does not give). Unmounted, or its holder killed, on drop.
struct Tmpfs {
    mount_point: tempfile::TempDir,
    /// The namespace's holder, when not mounted directly.
    holder: Option<std::process::Child>,
}

/// Longest the namespace's holder may take to mount the tmpfs.
const MOUNT_TIMEOUT: Duration = Duration::from_secs(10);

impl Tmpfs {
    /// A tmpfs of `total_mib`, of which `free_mib` are free at first.
    fn mount(total_mib: u64, free_mib: u64) -> Tmpfs {
        let mount_point = tempfile::tempdir().expect("mount point");
        let size = format!("size={total_mib}m");
        let direct = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &size, "tmpfs"])
            .arg(mount_point.path())
            .output()
            .expect("running mount");
        let holder = if direct.status.success() {
            None
        } else {
            Some(Tmpfs::namespaced(mount_point.path(), &size, &direct.stderr))
        };
        let fs = Tmpfs {
            mount_point,
            holder,
        };
        let ballast = vec![1u8; ((total_mib - free_mib) << 20) as usize];
        std::fs::write(fs.path().join("ballast"), ballast).expect("writing the ballast");
        fs
    }

    /// Mounts the tmpfs in a user and mount namespace of its own; returns its holder.
    fn namespaced(dir: &Path, size: &str, direct_error: &[u8]) -> std::process::Child {
        use std::io::BufRead;
        let mut holder = Command::new("unshare")
            .args([
                "--user",
                "--map-root-user",
                "--mount",
                "--propagation",
                "private",
            ])
            .args([
                "sh",
                "-c",
                "mount -t tmpfs -o \"$1\" tmpfs \"$2\" && echo mounted && exec sleep 86400",
            ])
            .arg("sh")
            .arg(size)
            .arg(dir)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("running unshare (util-linux)");
        let stdout = holder.stdout.take().expect("holder stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = std::io::BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        match rx.recv_timeout(MOUNT_TIMEOUT) {
            Ok(line) if line.trim() == "mounted" => holder,
            _ => {
                let _ = holder.kill();
                let out = holder.wait_with_output().expect("holder output");
                panic!(
                    "this test mounts a small tmpfs: as root with mount ({}), else in an \
                     unprivileged user namespace with unshare --user --map-root-user --mount ({}); \
                     both failed",
                    String::from_utf8_lossy(direct_error).trim(),
                    String::from_utf8_lossy(&out.stderr).trim()
                )
            }
        }
    }

    /// Where the tmpfs is seen from this process.
    fn path(&self) -> PathBuf {
        match &self.holder {
            None => self.mount_point.path().to_path_buf(),
            Some(holder) => {
                let inside = self.mount_point.path().strip_prefix("/").expect("absolute");
                PathBuf::from(format!("/proc/{}/root", holder.id())).join(inside)
            }
        }
    }

    /// Frees the ballast's space.
    fn free_up(&self) {
        std::fs::remove_file(self.path().join("ballast")).expect("removing the ballast");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        match self.holder.as_mut() {
            Some(holder) => {
                let _ = holder.kill();
                let _ = holder.wait();
            }
            None => {
                let _ = Command::new("umount").arg(self.mount_point.path()).status();
            }
        }
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
    let fs = Tmpfs::mount(64, 16);
    // The disk alarm off (a threshold of 0): the disk really fills.
    let alarm_off = [
        "--disk-alarm-free-mib",
        "0",
        "--disk-alarm-free-percent",
        "0",
    ];
    let mut d = Daemon::start_in(&fs.path(), &alarm_off);
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
    // The failed write is either the daemon's own (the journal) or one of fjall's
    // background table writes, after which fjall refuses every write.
    let (cause, space) = last
        .strip_prefix("musterd: the store failed; nothing unacknowledged was reported as durable: ")
        .and_then(|rest| rest.rsplit_once("; "))
        .unwrap_or_else(|| panic!("{last}"));
    assert!(
        cause.ends_with("No space left on device (os error 28)")
            || cause.starts_with("store: fjall takes no more writes after one of its background writes (a flush or compaction) failed"),
        "{last}"
    );
    let free: u64 = space
        .strip_prefix(&format!("{} has ", data.display()))
        .and_then(|s| s.split_once(" bytes free of "))
        .map(|(free, _)| free.parse().unwrap())
        .unwrap_or_else(|| panic!("{last}"));
    println!("full disk: {free} bytes free");
    println!("full disk: {last}");
    let acked = acked.lock().unwrap().clone();
    assert!(
        !acked.is_empty(),
        "nothing was acknowledged before the disk filled"
    );

    fs.free_up();
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

/// Free space of the alarm's test: the alarm goes off below 24 MiB free of 40 MiB.
const ALARM_FREE_MIB: &str = "24";

/// The alarm test's lease: longer than the whole test, so no held task lapses.
const FILL_LEASE_MS: u64 = 600_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_disk_alarm_refuses_enqueues_serves_agents_and_lifts_when_space_is_back() {
    let fs = Tmpfs::mount(64, 40);
    let d = Daemon::start_in(
        &fs.path(),
        &[
            "--disk-alarm-free-mib",
            ALARM_FREE_MIB,
            "--disk-alarm-free-percent",
            "0",
        ],
    );
    let producer = d.client().await;
    // The held leases must outlast filling the disk however slow the machine is: a
    // lapse here would be the machine's, not the alarm's.
    let long_lease = QueuePatch {
        lease_ms: Some(FILL_LEASE_MS),
        ..QueuePatch::default()
    };
    producer.queue_create("fill", long_lease).await.unwrap();
    // An agent holds work before the disk fills.
    let agent = d.client().await;
    for n in 0..8 {
        producer
            .enqueue("fill", NewTask::new(muster_sdk::json(&n).unwrap()))
            .await
            .unwrap();
    }
    let held = agent
        .claim(&muster_sdk::protocol::ops::Claim::new(["fill"]).max(8))
        .await
        .unwrap();
    assert_eq!(held.len(), 8);

    // Enqueue until refused: 16 MiB over the threshold hold about 500 payloads.
    let mut acked = Vec::new();
    let refusal = loop {
        assert!(
            acked.len() < 2_000,
            "no alarm after {} enqueues",
            acked.len()
        );
        let n = acked.len() as u64;
        let task = NewTask::new(muster_sdk::protocol::ops::raw(&payload(0, n)).unwrap());
        match tokio::time::timeout(CALL_TIMEOUT, producer.enqueue("fill", task))
            .await
            .expect("an enqueue hung")
        {
            Ok(t) => acked.push((n, t.id)),
            Err(e) => break e,
        }
    };
    assert_eq!(refusal.code(), Some(ErrorCode::DiskFull), "{refusal}");
    assert!(
        acked.len() > 100,
        "{} enqueues before the alarm",
        acked.len()
    );
    println!("disk alarm: on after {} enqueues", acked.len());
    // The daemon stays up; its stats say why enqueues are refused.
    let stats = d.ok(&["stats"]);
    let daemon = stats.lines().last().expect("the daemon's line");
    assert!(daemon.ends_with("\ton"), "{stats}");

    // Agents go on: renew, ack the held work, claim and settle more. What would grow
    // the store much is kept out: a new progress checkpoint is not stored (the lease is
    // renewed), and a result over 1 KiB is stored as a marker of its size.
    let checkpoint =
        muster_sdk::protocol::ops::raw(&format!("\"{}\"", "c".repeat(60_000))).unwrap();
    agent
        .renew(&held[0].id, held[0].epoch, None, Some(checkpoint))
        .await
        .unwrap();
    let big =
        muster_sdk::protocol::ops::raw(&format!("\"{}\"", "r".repeat(1024 * 1024 - 2))).unwrap();
    agent
        .ack(&held[0].id, held[0].epoch, Some(big))
        .await
        .unwrap();
    let first = producer.task_get(&held[0].id).await.unwrap();
    assert_eq!(first.state, TaskState::Done);
    assert!(first.progress.is_none(), "{:?}", first.progress);
    assert_eq!(
        first.result.as_ref().map(|r| r.get()),
        Some(r#"{"muster_truncated":{"reason":"disk_alarm","bytes":1048576}}"#)
    );
    let small = muster_sdk::protocol::ops::raw(r#"{"ok":true}"#).unwrap();
    agent
        .ack(&held[1].id, held[1].epoch, Some(small))
        .await
        .unwrap();
    let second = producer.task_get(&held[1].id).await.unwrap();
    assert_eq!(
        second.result.as_ref().map(|r| r.get()),
        Some(r#"{"ok":true}"#)
    );
    for t in &held[2..] {
        agent.ack(&t.id, t.epoch, None).await.unwrap();
    }
    let more = agent
        .claim(&muster_sdk::protocol::ops::Claim::new(["fill"]).max(4))
        .await
        .unwrap();
    assert_eq!(more.len(), 4);
    for t in &more {
        agent.ack(&t.id, t.epoch, None).await.unwrap();
    }
    // Still refused while space is short.
    let again = producer
        .enqueue("fill", NewTask::new(muster_sdk::json(&"late").unwrap()))
        .await
        .unwrap_err();
    assert_eq!(again.code(), Some(ErrorCode::DiskFull), "{again}");

    // Space comes back: enqueues resume (the alarm is read every 100 ms).
    fs.free_up();
    let mut resumed = None;
    for _ in 0..100 {
        let task = NewTask::new(muster_sdk::json(&"after").unwrap());
        match producer.enqueue("fill", task).await {
            Ok(t) => {
                resumed = Some(t.id);
                break;
            }
            Err(e) => assert_eq!(e.code(), Some(ErrorCode::DiskFull), "{e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let resumed = resumed.expect("enqueues resume once space is freed");
    assert_eq!(
        producer.task_get(&resumed).await.unwrap().state,
        TaskState::Ready
    );
    assert!(!d.ok(&["stats"]).contains("disk_alarm"));

    // Nothing acknowledged is lost: every enqueue is there with its payload, the acked
    // work is done.
    let client = d.client().await;
    for (n, id) in &acked {
        let t = client.task_get(id).await.unwrap();
        assert_eq!(t.payload.get(), payload(0, *n).as_str(), "task {id}");
    }
    for t in held.iter().chain(&more) {
        assert_eq!(client.task_get(&t.id).await.unwrap().state, TaskState::Done);
    }
    let log = d.log();
    let raised = log
        .lines()
        .filter(|l| l.contains("disk alarm: free space is below the threshold"))
        .count();
    let lifted = log
        .lines()
        .filter(|l| l.contains("disk alarm lifted"))
        .count();
    assert_eq!((raised, lifted), (1, 1), "{log}");
}
