//! Local users and tenants (issue 18): the private data directory and local-only mode
//! (another user is refused), token files, principals (duplicate names, queue-scoped
//! admins, session scope), member names (patterns, empty claims, release, expiry, the
//! cap per principal), quotas and the start-up warnings.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

use muster_sdk::protocol::ops::{Claim, SessionOpen, View};
use muster_sdk::{ErrorCode, NewTask, QueuePatch};
use muster_tests::{Daemon, muster_bin};

const ADMIN: &str = "admin-token-0123456789abcdef";
const JOBS_ADMIN: &str = "jobs-admin-token-0123456789";
const GPU: &str = "gpu-agents-token-0123456789";
const OTHER: &str = "other-agents-token-012345678";

/// The code of a call's error, or None if it succeeded.
fn code<T>(r: Result<T, muster_sdk::Error>) -> Option<ErrorCode> {
    r.err().map(|e| {
        e.code()
            .unwrap_or_else(|| panic!("not a daemon error: {e}"))
    })
}

fn session(member: &str, reclaim: bool) -> SessionOpen {
    SessionOpen {
        member: member.into(),
        labels: vec![],
        capacity: 1,
        reclaim,
        resume: false,
        held: None,
        liveness_ms: None,
    }
}

/// The error output of a command that must have failed with exit status 1.
fn failed(out: std::process::Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{err}");
    err
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .expect("metadata")
        .permissions()
        .mode()
        & 0o777
}

/// A daemon with tokens in a config file (plain text, which it warns about).
fn with_config(config: &str, extra: &[&str]) -> (Daemon, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("config dir");
    let path = dir.path().join("muster.toml");
    std::fs::write(&path, config).expect("writing config");
    let mut args = vec!["--config", path.to_str().expect("utf-8 path")];
    args.extend_from_slice(extra);
    (Daemon::start_with(&args), dir)
}

fn tokens_config(gpu_queues: &str) -> String {
    format!(
        r#"
[[tokens]]
name = "admin"
token = "{ADMIN}"
roles = ["admin"]

[[tokens]]
name = "jobs-admin"
token = "{JOBS_ADMIN}"
roles = ["admin"]
queues = ["jobs"]

[[tokens]]
name = "gpu-agents"
token = "{GPU}"
roles = ["consume"]
queues = [{gpu_queues}]
members = ["gpu/*"]

[[tokens]]
name = "other-agents"
token = "{OTHER}"
roles = ["consume"]
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_only_daemon_serves_its_own_user_and_refuses_every_other() {
    let d = Daemon::start();
    // Private: the directory 0700, every file in it 0600, the token among them.
    assert_eq!(mode(d.data()), 0o700);
    let token = d.data().join(muster_protocol::LOCAL_TOKEN_FILE);
    assert_eq!(mode(&token), 0o600);
    let mut files = 0;
    let mut stack = vec![d.data().to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                assert_eq!(mode(&path), 0o700, "{}", path.display());
                stack.push(path);
            } else {
                assert_eq!(mode(&path), 0o600, "{}", path.display());
                files += 1;
            }
        }
    }
    assert!(
        files >= 5,
        "the store, certificate, key, token, log: {files} files"
    );
    assert!(d.log().contains("local-only"), "{}", d.log());
    assert!(!d.log().contains("readable by other users"), "{}", d.log());
    // The daemon's own user: the CLI finds the token by itself.
    assert_eq!(
        d.ok(&["queue", "create", "jobs"]).lines().next(),
        Some("name\tjobs")
    );

    // Another user. As root (CI runs the suite as root and as nobody), the CLI really
    // runs as uid 65534: it can read neither the certificate nor the token, and with
    // the certificate pinned it still has no token to present.
    let root = std::fs::metadata(d.data()).unwrap().uid() == 0;
    let other_user = |args: &[&str]| {
        let mut cmd = if root {
            let mut c = std::process::Command::new("setpriv");
            c.args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
                .arg(muster_bin());
            c
        } else {
            // Not root: the same refusal for a client without the token file (a user
            // who cannot read the data directory has nothing more).
            std::process::Command::new(muster_bin())
        };
        // That user's own home: no contexts of the test's user.
        cmd.args(args)
            .env("HOME", "/nonexistent")
            .env_remove("XDG_CONFIG_HOME")
            .env("MUSTER_ADDR", &d.addr)
            .env_remove("MUSTER_DATA")
            .env_remove("MUSTER_TOKEN")
            .env_remove("MUSTER_TOKEN_FILE")
            .output()
            .expect("running muster as another user")
    };
    let err = failed(other_user(&["--pin", &d.fingerprint, "queue", "list"]));
    assert!(err.starts_with("muster: unauthorized: "), "{err}");
    if root {
        let data = d.data().to_str().unwrap();
        let err = failed(other_user(&["--data", data, "queue", "list"]));
        assert!(err.contains("Permission denied"), "{err}");
    }
    eprintln!("another user (root: {root}) is refused");

    // A data directory opened up by hand is made private again at start, with a warning.
    let mut d = d;
    assert_eq!(d.terminate(), Some(0));
    let journal = std::fs::read_dir(d.data().join("store"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.is_file())
        .expect("a file in the store");
    std::fs::set_permissions(d.data(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&journal, std::fs::Permissions::from_mode(0o644)).unwrap();
    d.restart();
    assert_eq!((mode(d.data()), mode(&journal)), (0o700, 0o600));
    assert!(
        d.log().contains("readable by other users: made private"),
        "{}",
        d.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_daemon_serves_everyone_and_keeps_no_token() {
    let d = Daemon::start_with(&["--open"]);
    assert!(!d.data().join(muster_protocol::LOCAL_TOKEN_FILE).exists());
    assert_eq!(
        d.ok(&["--pin", &d.fingerprint, "queue", "list", "--no-headers"]),
        ""
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_file_keeps_the_token_off_the_command_line() {
    let (d, dir) = with_config(&tokens_config(r#""jobs""#), &[]);
    let file = dir.path().join("admin.token");
    std::fs::write(&file, format!("{ADMIN}\n")).unwrap();
    let file = file.to_str().unwrap();
    // No token at all: this daemon keeps no local token, so nothing is presented.
    let err = failed(d.cli(&["queue", "list"]));
    assert!(err.starts_with("muster: unauthorized: "), "{err}");
    assert_eq!(
        d.ok(&["--token-file", file, "queue", "create", "jobs"])
            .lines()
            .next(),
        Some("name\tjobs")
    );
    // The variable, as `muster work` and the console read it too.
    let out = std::process::Command::new(muster_bin())
        .args(["queue", "list", "--no-headers"])
        .env("MUSTER_ADDR", &d.addr)
        .env("MUSTER_DATA", d.data())
        .env("MUSTER_TOKEN_FILE", file)
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).split('\t').next(),
        Some("jobs")
    );
    let missing = dir.path().join("missing");
    let err = failed(d.cli(&["--token-file", missing.to_str().unwrap(), "queue", "list"]));
    assert!(err.contains("reading token file"), "{err}");
    // The plain-text tokens of this config were warned about.
    assert!(
        d.log().contains("holds token \\\"admin\\\" in plain text"),
        "{}",
        d.log()
    );
}

#[test]
fn duplicate_token_names_are_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("muster.toml");
    let mut config = tokens_config(r#""jobs""#);
    config.push_str(
        "\n[[tokens]]\nname = \"gpu-agents\"\ntoken = \"sandbox-token-0123456789ab\"\nroles = [\"consume\"]\nqueues = [\"sandbox\"]\n",
    );
    std::fs::write(&path, config).unwrap();
    let out = std::process::Command::new(muster_tests::musterd_bin())
        .arg("--data")
        .arg(dir.path().join("data"))
        .arg("--config")
        .arg(&path)
        .output()
        .unwrap();
    let err = failed(out);
    assert!(
        err.contains("tokens 3 and 5 are both named \"gpu-agents\""),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_token_and_its_config_entry_work_as_printed() {
    let out = std::process::Command::new(muster_bin())
        .args([
            "--json", "admin", "token", "new", "--name", "ci", "--roles", "admin",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let token = v["token"].as_str().unwrap();
    assert_eq!(token.len(), 64);
    assert!(token.bytes().all(|b| b.is_ascii_hexdigit()));
    let config = v["config"].as_str().unwrap();
    assert!(!config.contains(token), "the entry holds only the SHA-256");
    assert!(config.contains(v["token_sha256"].as_str().unwrap()));
    let (d, _dir) = with_config(config, &[]);
    let admin = d.client_as(token).await;
    admin
        .queue_create("jobs", QueuePatch::default())
        .await
        .unwrap();
    assert!(!d.log().contains("plain text"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_scoped_admins_see_only_members_of_their_queues_and_sessions_keep_to_their_scope() {
    let (mut d, dir) = with_config(&tokens_config(r#""jobs", "ml""#), &[]);
    let admin = d.client_as(ADMIN).await;
    for q in ["jobs", "ml"] {
        admin.queue_create(q, QueuePatch::default()).await.unwrap();
    }
    // gpu/1 works on jobs, gpu/2 on ml.
    let (one, two) = (d.client_as(GPU).await, d.client_as(GPU).await);
    one.open_session(&session("gpu/1", false)).await.unwrap();
    one.subscribe("gpu/1", &["jobs".into()]).await.unwrap();
    let (_, mut pushed) = two.open_session(&session("gpu/2", false)).await.unwrap();
    two.subscribe("gpu/2", &["ml".into()]).await.unwrap();
    // A member name outside the token's patterns.
    let stray = d.client_as(GPU).await;
    assert_eq!(
        code(stray.open_session(&session("cpu/1", false)).await),
        Some(ErrorCode::Forbidden)
    );
    assert_eq!(
        code(stray.claim(&Claim::new(["jobs"]).member("cpu/1")).await),
        Some(ErrorCode::Forbidden)
    );

    let scoped = d.client_as(JOBS_ADMIN).await;
    let names: Vec<String> = scoped
        .member_list()
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.name)
        .collect();
    assert_eq!(names, ["gpu/1"]);
    assert_eq!(admin.member_list().await.unwrap().len(), 2);
    assert!(scoped.member_describe("gpu/1").await.is_ok());
    assert_eq!(
        code(scoped.member_describe("gpu/2").await),
        Some(ErrorCode::Forbidden)
    );
    assert_eq!(
        code(scoped.member_drain("gpu/2").await),
        Some(ErrorCode::Forbidden)
    );
    assert_eq!(
        code(scoped.member_release("gpu/2").await),
        Some(ErrorCode::Forbidden)
    );
    let members = View::Members {
        after: None,
        limit: None,
    };
    assert_eq!(
        code(scoped.watch(members, 1).await),
        Some(ErrorCode::Forbidden)
    );
    assert!(scoped.member_drain("gpu/1").await.unwrap().draining);

    // gpu/2 holds an ml task; then the token loses ml. Reopening the session would hand
    // the task back (or release it): refused, as is a subscription outside the scope.
    admin
        .enqueue("ml", NewTask::new(muster_sdk::json(&1).unwrap()))
        .await
        .unwrap();
    // Subscribed to ml with room, gpu/2 has it pushed.
    let delivery = tokio::time::timeout(Duration::from_secs(5), pushed.recv())
        .await
        .expect("a push within 5 s");
    let Some(muster_sdk::Push::Deliver(delivery)) = delivery else {
        panic!("not a delivery: {delivery:?}");
    };
    drop((one, two, stray, scoped, admin));
    assert_eq!(d.terminate(), Some(0));
    std::fs::write(dir.path().join("muster.toml"), tokens_config(r#""jobs""#)).unwrap();
    d.restart();
    let agent = d.client_as(GPU).await;
    assert_eq!(
        code(agent.open_session(&session("gpu/2", true)).await),
        Some(ErrorCode::Forbidden)
    );
    agent.open_session(&session("gpu/3", false)).await.unwrap();
    assert_eq!(
        code(agent.subscribe("gpu/3", &["ml".into()]).await),
        Some(ErrorCode::Forbidden)
    );
    let admin = d.client_as(ADMIN).await;
    let task = admin.task_get(&delivery.id).await.unwrap();
    assert_eq!(task.state, muster_sdk::TaskState::Leased, "untouched");
}

/// Polls `f` every 50 ms until it returns true, for at most `limit`.
async fn eventually(limit: Duration, mut f: impl AsyncFnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !f().await {
        assert!(start.elapsed() < limit, "not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    start.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_names_are_not_squatted_released_expire_and_are_capped_per_token() {
    let (d, _dir) = with_config(&tokens_config(r#""jobs""#), &["--member-name-expiry", "1s"]);
    let admin = d.client_as(ADMIN).await;
    admin
        .queue_create("jobs", QueuePatch::default())
        .await
        .unwrap();
    let gpu = d.client_as(GPU).await;
    let other = d.client_as(OTHER).await;
    // An empty claim binds nothing: the other token may use the name at once.
    assert!(
        gpu.claim(&Claim::new(["jobs"]).member("gpu/squat"))
            .await
            .unwrap()
            .is_empty()
    );
    other
        .open_session(&session("gpu/squat", false))
        .await
        .unwrap();
    // Now it is the other token's, and its session squats it: an admin's release ends
    // that session (its connection is closed: replaced) and frees the name at once.
    admin.member_release("gpu/squat").await.unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(5), other.closed_reason())
        .await
        .expect("the squatter's connection is closed");
    assert!(ended.contains("replaced (code 3)"), "{ended}");
    gpu.open_session(&session("gpu/squat", false))
        .await
        .expect("the released name is free for its owner");
    gpu.close().await;
    let gpu = d.client_as(GPU).await;
    let waited = eventually(Duration::from_secs(5), async || {
        code(admin.member_release("gpu/squat").await) != Some(ErrorCode::InvalidState)
    })
    .await;
    eprintln!("released {waited:?} after the session closed");
    // Released above; the CLI says why a second release fails.
    let err = failed(d.cli(&["--token", ADMIN, "member", "release", "gpu/squat"]));
    assert!(
        err.starts_with("muster: not_found: member name \"gpu/squat\" is bound to no principal"),
        "{err}"
    );
    let gpu_session = d.client_as(GPU).await;
    gpu_session
        .open_session(&session("gpu/cli", false))
        .await
        .unwrap();
    gpu_session.close().await;
    let released = eventually(Duration::from_secs(5), async || {
        d.cli(&["--token", ADMIN, "member", "release", "gpu/cli"])
            .status
            .success()
    })
    .await;
    eprintln!("muster member release: {released:?} after the session closed");
    let gpu_session = d.client_as(GPU).await;
    gpu_session
        .open_session(&session("gpu/squat", false))
        .await
        .unwrap();
    // Expiry: once the session is gone the name is free again after about 1 s.
    gpu_session.close().await;
    let other = d.client_as(OTHER).await;
    let freed = eventually(Duration::from_secs(10), async || {
        other
            .open_session(&session("gpu/squat", false))
            .await
            .is_ok()
    })
    .await;
    eprintln!("member name freed {freed:?} after its session ended (expiry 1 s)");
    // Not before the expiry less one sweep (1 s / 8), when the session was last seen.
    assert!(freed >= Duration::from_millis(800), "{freed:?}");

    // The cap: 4,096 names per token, each bound by a claim that got a task.
    let cap = 4096;
    for chunk in 0..=cap / 1000 {
        let n = (cap + 1 - chunk * 1000).min(1000);
        let tasks = (0..n)
            .map(|i| NewTask::new(muster_sdk::json(&i).unwrap()))
            .collect();
        admin.enqueue_batch("jobs", tasks).await.unwrap();
    }
    let start = Instant::now();
    let claims: Vec<_> = (0..cap)
        .map(|i| {
            let other = other.clone();
            tokio::spawn(async move {
                other
                    .claim(&Claim::new(["jobs"]).member(format!("bulk-{i}")))
                    .await
            })
        })
        .collect();
    // The name above is this token's too (its session is open): room for 4,095 more.
    let mut bound = 0;
    for c in claims {
        match c.await.unwrap() {
            Ok(t) if t.len() == 1 => bound += 1,
            Ok(t) => panic!("a claim got {} tasks", t.len()),
            Err(e) => assert_eq!(e.code(), Some(ErrorCode::Limit), "{e}"),
        }
    }
    assert_eq!(bound, cap - 1);
    let refused = other
        .claim(&Claim::new(["jobs"]).member("bulk-one-more"))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Some(ErrorCode::Limit), "{refused}");
    assert!(
        refused.to_string().contains("4096 member names"),
        "{refused}"
    );
    eprintln!(
        "{} names bound in {:?}, the next refused with limit",
        bound + 1,
        start.elapsed()
    );
    // Another token is not affected by this one's cap.
    assert_eq!(
        gpu.claim(&Claim::new(["jobs"]).member("gpu/9"))
            .await
            .unwrap()
            .len(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quotas_refuse_with_limit_and_hold_across_a_restart() {
    let config = format!(
        "{}\n[[tokens]]\nname = \"producer\"\ntoken = \"producer-token-0123456789\"\nroles = [\"produce\"]\n",
        tokens_config(r#""jobs""#)
    );
    let (mut d, _dir) = with_config(
        &config,
        &[
            "--max-tasks-per-queue",
            "5",
            "--max-bytes-per-token",
            "4000",
        ],
    );
    let admin = d.client_as(ADMIN).await;
    admin
        .queue_create("jobs", QueuePatch::default())
        .await
        .unwrap();
    let producer = d.client_as("producer-token-0123456789").await;
    let payload = |n: usize| NewTask::new(muster_sdk::json(&"x".repeat(n)).unwrap());
    // Two payloads of 402 bytes (a JSON string of 400) with their records (1024 bytes
    // each): 2852 bytes stored.
    producer
        .enqueue_batch("jobs", vec![payload(400), payload(400)])
        .await
        .unwrap();
    let refused = producer.enqueue("jobs", payload(200)).await.unwrap_err();
    assert_eq!(refused.code(), Some(ErrorCode::Limit), "{refused}");
    assert!(
        refused.to_string().contains("--max-bytes-per-token"),
        "{refused}"
    );
    // The admin's bytes are its own; the queue's five tasks are everyone's.
    admin
        .enqueue_batch("jobs", vec![payload(1), payload(1), payload(1)])
        .await
        .unwrap();
    let err = failed(d.cli(&["--token", ADMIN, "enqueue", "jobs", "1"]));
    assert!(
        err.starts_with("muster: limit: queue \"jobs\" holds 5 tasks"),
        "{err}"
    );
    drop((admin, producer));
    assert_eq!(d.terminate(), Some(0));
    d.restart();
    // The producer's 2852 bytes were counted again at start: refused on an empty queue.
    d.client_as(ADMIN)
        .await
        .queue_create("more", QueuePatch::default())
        .await
        .unwrap();
    let producer = d.client_as("producer-token-0123456789").await;
    let refused = producer.enqueue("more", payload(200)).await.unwrap_err();
    assert_eq!(refused.code(), Some(ErrorCode::Limit), "{refused}");
    assert!(
        refused.to_string().contains("has 2852 bytes stored"),
        "{refused}"
    );
    producer.enqueue("more", payload(100)).await.unwrap();
}

/// A data directory another user controls is refused at start, whatever it holds:
/// that user could have planted a local token (and so be admin) or a store.
#[test]
fn a_data_directory_another_user_owns_is_refused() {
    let root = tempfile::tempdir().unwrap();
    // What this process creates is owned by its effective user.
    let me = std::fs::metadata(root.path()).unwrap().uid();
    let (data, owner) = if me == 0 {
        // Planted by uid 4242 before the daemon's first start.
        let data = root.path().join("planted");
        std::fs::create_dir(&data).unwrap();
        let token = data.join(muster_protocol::LOCAL_TOKEN_FILE);
        std::fs::write(&token, format!("{}\n", "a".repeat(64))).unwrap();
        for path in [&data, &token] {
            std::os::unix::fs::chown(path, Some(4242), Some(4242)).unwrap();
        }
        (data, 4242)
    } else {
        // As any other user: a directory root owns.
        (std::path::PathBuf::from("/"), 0)
    };
    let out = std::process::Command::new(muster_tests::musterd_bin())
        .arg("--data")
        .arg(&data)
        .args(["--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    let err = failed(out);
    assert!(
        err.contains(&format!(
            "{} is owned by uid {owner}, not by this daemon's user (uid {me}): refusing to use a data directory another user controls",
            data.display()
        )),
        "{err}"
    );
}

/// A start refused for its flags changes nothing: the local token stays.
#[test]
fn a_refused_start_keeps_the_local_token() {
    let mut d = Daemon::start();
    let token_file = d.data().join(muster_protocol::LOCAL_TOKEN_FILE);
    let token = std::fs::read_to_string(&token_file).unwrap();
    d.kill9();
    let out = std::process::Command::new(muster_tests::musterd_bin())
        .arg("--data")
        .arg(d.data())
        .args(["--open", "--listen", "0.0.0.0:0"])
        .output()
        .unwrap();
    let err = failed(out);
    assert!(err.contains("refusing to listen on 0.0.0.0:0"), "{err}");
    assert_eq!(std::fs::read_to_string(&token_file).unwrap(), token);
}

/// A token file others can write is refused by the CLI (and the SDKs): whoever can
/// write it chooses whom the client claims to be.
#[test]
fn a_token_file_others_can_write_is_refused() {
    let (d, dir) = with_config(&tokens_config(r#""jobs""#), &[]);
    let file = dir.path().join("admin.token");
    std::fs::write(&file, format!("{ADMIN}\n")).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).unwrap();
    let err = failed(d.cli(&["--token-file", file.to_str().unwrap(), "queue", "list"]));
    assert_eq!(
        err,
        format!(
            "muster: invalid input: token file {} is writable by other users (mode 666): chmod go-w it\n",
            file.display()
        )
    );
}
