//! Safe maintenance: one daemon per data directory, versions with their commit, a
//! configuration check that starts nothing, a snapshot of the live store that restores
//! exactly what it held, and a daemon without transparent huge pages.

use std::process::Command;

use muster_tests::{Daemon, muster_bin, musterd_bin};

fn run(cmd: &mut Command) -> (i32, String, String) {
    let out = cmd.output().expect("running a binary");
    (
        out.status.code().expect("exit status"),
        String::from_utf8(out.stdout).expect("utf-8 stdout"),
        String::from_utf8(out.stderr).expect("utf-8 stderr"),
    )
}

#[test]
fn a_second_daemon_on_the_same_data_directory_is_refused_naming_the_first() {
    let d = Daemon::start();
    let (code, stdout, stderr) = run(Command::new(musterd_bin())
        .arg("--data")
        .arg(d.data())
        .args(["--listen", "127.0.0.1:0"])
        .env("MUSTER_LOG", "off"));
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(stdout, "");
    assert_eq!(
        stderr,
        format!(
            "musterd: data directory {} is in use by another musterd (process {} holds musterd.lock)\n",
            d.data().display(),
            d.pid()
        )
    );
    // The first one still serves.
    assert_eq!(d.ok(&["queue", "list", "--no-headers"]), "");
}

#[test]
fn both_binaries_print_their_version_and_the_same_commit() {
    let (code, daemon, _) = run(Command::new(musterd_bin()).arg("--version"));
    assert_eq!(code, 0);
    let (code, cli, _) = run(Command::new(muster_bin()).arg("--version"));
    assert_eq!(code, 0);
    let commit = |line: &str, name: &str| {
        let rest = line
            .strip_prefix(&format!("{name} {} (commit ", env!("CARGO_PKG_VERSION")))
            .and_then(|r| r.strip_suffix(")\n"))
            .unwrap_or_else(|| panic!("{name} --version printed {line:?}"))
            .to_owned();
        assert!(
            rest == "unknown" || (rest.len() == 12 && rest.bytes().all(|b| b.is_ascii_hexdigit())),
            "{name} --version printed {line:?}"
        );
        rest
    };
    assert_eq!(commit(&daemon, "musterd"), commit(&cli, "muster"));
}

#[test]
fn check_config_validates_flags_and_tokens_without_starting() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let good = dir.path().join("good.toml");
    std::fs::write(
        &good,
        "[[tokens]]\nname = \"ops\"\ntoken = \"a-long-enough-operator-token\"\nroles = [\"admin\"]\n",
    )
    .unwrap();
    let check = |args: &[&str]| {
        run(Command::new(musterd_bin())
            .arg("--check-config")
            .arg("--data")
            .arg(&data)
            .args(args))
    };
    let (code, stdout, stderr) = check(&[
        "--config",
        good.to_str().unwrap(),
        "--listen",
        "0.0.0.0:7420",
    ]);
    assert_eq!((code, stderr.as_str()), (0, ""));
    assert_eq!(
        stdout,
        format!(
            "musterd: configuration is valid: 1 token(s), data directory {}, listening on 0.0.0.0:7420\n",
            data.display()
        )
    );
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[[tokens]]\nname = \"ops\"\ntoken = \"short\"\nroles = [\"admin\"]\n",
    )
    .unwrap();
    let (code, stdout, stderr) = check(&["--config", bad.to_str().unwrap()]);
    assert_eq!((code, stdout.as_str()), (1, ""));
    assert_eq!(
        stderr,
        format!(
            "musterd: in config {}: token \"ops\" is shorter than 16 bytes\n",
            bad.display()
        )
    );
    let (code, _, stderr) = check(&["--listen", "0.0.0.0:7420"]);
    assert_eq!(code, 1);
    assert!(
        stderr.starts_with("musterd: refusing to listen on 0.0.0.0:7420: "),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    let (code, _, stderr) = check(&["--cert", good.to_str().unwrap()]);
    assert_eq!(
        (code, stderr.as_str()),
        (1, "musterd: --cert and --key must be given together\n")
    );
    assert!(!data.exists(), "--check-config created the data directory");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_of_the_live_store_restores_exactly_what_it_held() {
    use muster_sdk::protocol::ops::Claim;
    use muster_sdk::{NewTask, QueuePatch, TaskState};

    use muster_sdk::protocol::model::{LimitSpec, LimitUse};

    let d = Daemon::start();
    let client = d.client().await;
    // A fair queue with a weight, and a limit its tasks draw on: all in the snapshot.
    let fair = QueuePatch {
        fair: Some(true),
        group_weights: Some([("g1".to_owned(), 3)].into()),
        ..QueuePatch::default()
    };
    client.queue_create("jobs", fair).await.unwrap();
    let api = LimitSpec {
        concurrency: Some(3),
        ..LimitSpec::default()
    };
    client.limit_set("api", api.clone()).await.unwrap();
    let uses = |n: usize| LimitUse {
        limit: "api".into(),
        key: None,
        cost: Some(n as u64 % 2 + 1),
    };
    let mut ids = Vec::new();
    for n in 0..5 {
        let task = NewTask {
            limits: vec![uses(n)],
            group: Some(format!("g{}", n % 2)),
            ..NewTask::new(muster_sdk::json(&n).unwrap())
        };
        ids.push(client.enqueue("jobs", task).await.unwrap().id);
    }
    let got = client.claim(&Claim::new(["jobs"]).max(2)).await.unwrap();
    client.ack(&got[0].id, got[0].epoch, None).await.unwrap();

    // By default snapshots go to `backups` in the data directory: a relative name is
    // taken there, an absolute path must lie there.
    let backups = d.data().join("backups");
    let snap = backups.join("snap-1");
    let snap_arg = snap.to_str().unwrap();
    assert_eq!(
        d.ok(&["admin", "snapshot", "snap-1"]),
        format!("{snap_arg}\ttasks=5 queues=1\n")
    );
    // Changes after the snapshot are not in it.
    for n in 5..8 {
        let task = NewTask::new(muster_sdk::json(&n).unwrap());
        client.enqueue("jobs", task).await.unwrap();
    }
    client
        .queue_create("later", QueuePatch::default())
        .await
        .unwrap();
    // Refused: an existing directory, `..`, a path outside the root, a symbolic link
    // out of it; nothing is written.
    let again = d.cli(&["admin", "snapshot", snap_arg]);
    assert_eq!(again.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&again.stderr)
            .starts_with(&format!("muster: already_exists: creating {snap_arg}: ")),
        "{again:?}"
    );
    let dotdot = d.cli(&["admin", "snapshot", "../escaped"]);
    assert_eq!(
        String::from_utf8_lossy(&dotdot.stderr),
        "muster: bad_request: snapshot directory \"../escaped\" must name a new directory without . or .. in it\n"
    );
    let elsewhere = tempfile::tempdir().unwrap();
    let root = backups.canonicalize().unwrap();
    let outside = elsewhere.path().join("copy");
    let link = backups.join("link");
    std::os::unix::fs::symlink(elsewhere.path(), &link).unwrap();
    for target in [outside.clone(), link.join("copy")] {
        let refused = d.cli(&["admin", "snapshot", target.to_str().unwrap()]);
        let shown = if target.starts_with(&backups) {
            root.join("link/copy")
        } else {
            target.clone()
        };
        assert_eq!(
            String::from_utf8_lossy(&refused.stderr),
            format!(
                "muster: bad_request: snapshot directory {} is not inside the snapshot root {} (symbolic links and .. are not followed; musterd --snapshot-root sets the root)\n",
                shown.display(),
                root.display()
            )
        );
    }
    assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0);
    assert!(!d.data().join("escaped").exists());

    // Restore: a daemon on a data directory whose `store` is the snapshot.
    let restored = Daemon::start_from(&snap, &[]);
    let back = restored.client().await;
    let queues: Vec<String> = back
        .queue_list()
        .await
        .unwrap()
        .into_iter()
        .map(|q| q.name)
        .collect();
    assert_eq!(queues, ["jobs"]);
    let counts = back.queue_describe("jobs").await.unwrap().counts;
    assert_eq!(
        (counts.ready, counts.leased, counts.done),
        (3, 1, 1),
        "{counts:?}"
    );
    let options = back.queue_describe("jobs").await.unwrap().options;
    assert_eq!(
        (options.fair, options.group_weights),
        (true, [("g1".to_owned(), 3)].into())
    );
    let limit = back.limit_get("api").await.unwrap();
    assert_eq!(
        (limit.spec, limit.held),
        (api, 1),
        "the lease held counts again"
    );
    for (n, id) in ids.iter().enumerate() {
        let t = back.task_get(id).await.unwrap();
        assert_eq!(t.payload.get(), n.to_string(), "task {id}");
        assert_eq!(
            (t.limits, t.group),
            (vec![uses(n)], Some(format!("g{}", n % 2))),
            "task {id}"
        );
        let want = match n {
            0 => TaskState::Done,
            1 => TaskState::Leased,
            _ => TaskState::Ready,
        };
        assert_eq!(t.state, want, "task {id}");
    }
    // The restored lease is still the holder's.
    back.ack(&got[1].id, got[1].epoch, None).await.unwrap();
}

/// The daemon turns transparent huge pages off for itself (a huge page is resident and
/// zeroed whole); the kernel shows it in the process's status.
#[test]
fn the_daemon_runs_without_transparent_huge_pages() {
    let d = Daemon::start();
    let status = std::fs::read_to_string(format!("/proc/{}/status", d.pid())).unwrap();
    let thp = status
        .lines()
        .find_map(|l| l.strip_prefix("THP_enabled:"))
        .unwrap_or_else(|| panic!("no THP_enabled line in:\n{status}"));
    assert_eq!(thp.trim(), "0", "{status}");
    // The test process itself still has them: the daemon changed only itself.
    let own = std::fs::read_to_string("/proc/self/status").unwrap();
    assert!(own.contains("THP_enabled:\t1"), "{own}");
}
