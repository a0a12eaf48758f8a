//! `muster tui` in a real terminal (tmux) against a real daemon: keys in, screen out.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use muster_tests::{Daemon, muster_bin};

/// Longest a screen may take to show what a key asked for.
const SCREEN_TIMEOUT: Duration = Duration::from_secs(15);

/// Longest wait for a search over 100,000 tasks to show its match and its end (a debug
/// build beside the other tests; BENCHMARKS.md times the search).
const SEARCH_TIMEOUT: Duration = Duration::from_secs(120);

/// A tmux server of the test's own (its socket in a temporary directory), one session
/// running `muster tui` in an 100×30 window. Dropping it kills that server only.
struct Tmux {
    dir: tempfile::TempDir,
    socket: PathBuf,
    /// Where the pane's shell writes the console's exit status.
    status: PathBuf,
}

impl Tmux {
    fn start(d: &Daemon, args: &[&str]) -> Tmux {
        Tmux::start_with_env(d, args, &[])
    }

    /// Starts the console with these extra environment variables (`NAME=value`).
    fn start_with_env(d: &Daemon, args: &[&str], env: &[String]) -> Tmux {
        let dir = tempfile::tempdir().expect("a directory for the tmux socket");
        let t = Tmux {
            socket: dir.path().join("tmux.sock"),
            status: dir.path().join("status"),
            dir,
        };
        let mut command = vec![muster_bin().display().to_string(), "tui".into()];
        command.extend(args.iter().map(|a| (*a).to_owned()));
        let command = format!("{}; echo $? > {}", command.join(" "), t.status.display());
        // Keep the pane after the program exits, to read the screen it left: set in the
        // server's configuration, so it holds from the pane's first moment.
        let config = t.dir.path().join("tmux.conf");
        std::fs::write(&config, "set-option -g remain-on-exit on\n").expect("tmux.conf");
        let session = [
            "-f",
            config.to_str().expect("a UTF-8 temporary path"),
            "new-session",
            "-d",
            "-s",
            "console",
            "-x",
            "100",
            "-y",
            "30",
            "-e",
            &format!("MUSTER_ADDR={}", d.addr),
            "-e",
            &format!("MUSTER_DATA={}", d.data().display()),
            "-e",
            "TERM=xterm-256color",
        ]
        .into_iter()
        .map(str::to_owned)
        .chain(env.iter().flat_map(|e| ["-e".to_owned(), e.clone()]))
        .chain([command])
        .collect::<Vec<String>>();
        let out = t.run(&session.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(
            out.status.success(),
            "tmux new-session: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        t
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new("tmux")
            // The pane's shell: the user's login shell may be nologin (CI runs these
            // tests as `nobody`), and tmux takes SHELL first.
            .env("SHELL", "/bin/sh")
            .arg("-S")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("tmux is installed (see .ci/run)")
    }

    fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "console"];
        args.extend(keys);
        let out = self.run(&args);
        assert!(
            out.status.success(),
            "tmux send-keys: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn screen(&self) -> String {
        String::from_utf8_lossy(&self.run(&["capture-pane", "-p", "-t", "console"]).stdout)
            .into_owned()
    }

    /// Waits until the screen shows `text`; fails with the screen as it was.
    fn wait_for(&self, text: &str) -> String {
        self.wait_for_within(text, SCREEN_TIMEOUT)
    }

    /// [`Tmux::wait_for`] for a screen that follows long work (a search over a whole
    /// queue, whose speed on a loaded machine the test does not judge).
    fn wait_for_within(&self, text: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let screen = self.screen();
            if screen.contains(text) {
                return screen;
            }
            assert!(
                Instant::now() < deadline,
                "the screen never showed {text:?}:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The console's exit status, once it exited (the pane's shell writes it to a file).
    fn wait_exit(&self) -> i32 {
        let deadline = Instant::now() + SCREEN_TIMEOUT;
        loop {
            if let Ok(text) = std::fs::read_to_string(&self.status)
                && text.ends_with('\n')
            {
                return text.trim().parse().expect("an exit status");
            }
            assert!(
                Instant::now() < deadline,
                "muster tui did not exit:\n{}",
                self.screen()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}

/// A queue with one ready task and one dead task; returns the dead task's id.
fn queue_with_a_dead_task(d: &Daemon) -> String {
    d.ok(&["queue", "create", "jobs"]);
    d.ok(&["enqueue", "jobs", r#"{"n":1}"#]);
    d.ok(&["enqueue", "jobs", r#"{"n":2}"#]);
    let claim = d.ok(&["claim", "jobs"]);
    let claim = claim.split('\t').next().expect("a claim").to_owned();
    d.ok(&["dead-letter", &claim, "--error", "poison pill"]);
    claim.rsplit_once('.').expect("ID.EPOCH").0.to_owned()
}

fn state(d: &Daemon, id: &str) -> String {
    let task: serde_json::Value =
        serde_json::from_str(&d.ok(&["task", "get", id, "--json"])).expect("task JSON");
    task["state"].as_str().expect("a state").to_owned()
}

#[test]
fn redrive_a_dead_task_from_the_console_with_confirm() {
    let mut d = Daemon::start();
    let dead = queue_with_a_dead_task(&d);
    let tmux = Tmux::start(&d, &[]);
    let queues = tmux.wait_for("jobs");
    assert!(queues.contains("QUEUE"), "{queues}");
    // To the dead letters, by command.
    tmux.keys(&[":dead", "Enter"]);
    let screen = tmux.wait_for(&dead);
    assert!(
        screen.contains("poison pill") && screen.contains("dead_lettered"),
        "{screen}"
    );
    tmux.keys(&["r"]);
    tmux.wait_for(&format!("Redrive dead task {dead} of jobs?"));
    assert_eq!(
        state(&d, &dead),
        "dead",
        "nothing happens before the confirm"
    );
    tmux.keys(&["y"]);
    tmux.wait_for("redriven 1 task of jobs");
    assert_eq!(state(&d, &dead), "ready");
    tmux.wait_for("no dead tasks");
    // Back to the queues: the queue's counts moved (2 ready, 0 dead).
    tmux.keys(&["Escape"]);
    let queues = tmux.wait_for("QUEUE");
    let row = queues
        .lines()
        .find(|l| l.contains("jobs"))
        .expect("the jobs row");
    let counts: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(&counts[1..6], ["2", "0", "0", "0", "0"], "{row}");
    // The daemon is killed and comes back: the console stays up, learns of the restart
    // from the new daemon's stateless reset (its next keep-alive), and reconnects.
    d.kill9();
    d.restart();
    tmux.wait_for("reconnected");
    let queues = tmux.wait_for("jobs");
    assert!(queues.contains("QUEUE"), "{queues}");
    tmux.keys(&["q"]);
    assert_eq!(tmux.wait_exit(), 0);
    // The terminal was restored: the alternate screen is gone.
    let after = tmux.screen();
    assert!(
        !after.contains("QUEUE"),
        "the console's screen is still shown:\n{after}"
    );
}

#[test]
fn read_only_console_offers_no_verbs() {
    let d = Daemon::start();
    let dead = queue_with_a_dead_task(&d);
    let tmux = Tmux::start(&d, &["--readonly"]);
    tmux.wait_for("read-only");
    tmux.keys(&[":dead", "Enter"]);
    let screen = tmux.wait_for(&dead);
    assert!(
        !screen.contains("redrive"),
        "no verb in the footer:\n{screen}"
    );
    tmux.keys(&["r", "y", "x", "y"]);
    // The keys went through (help opens after them) and did nothing.
    tmux.keys(&["?"]);
    let help = tmux.wait_for("Keys");
    assert!(!help.contains("discard"), "{help}");
    assert_eq!(state(&d, &dead), "dead");
    tmux.keys(&["q", "q"]);
    assert_eq!(tmux.wait_exit(), 0);
}

#[test]
fn the_console_fails_cleanly_without_a_daemon() {
    let d = Daemon::start();
    let out = Command::new(muster_bin())
        .args(["tui"])
        .env("MUSTER_ADDR", "127.0.0.1:9")
        .env("MUSTER_DATA", d.data())
        .output()
        .expect("running muster tui");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("muster: connect"), "{stderr}");
}

/// The next watch push, or `None` after `within`.
async fn next_push(
    pushes: &mut tokio::sync::mpsc::UnboundedReceiver<muster_sdk::protocol::ops::WatchReply>,
    within: Duration,
) -> Option<muster_sdk::protocol::ops::WatchReply> {
    tokio::time::timeout(within, pushes.recv())
        .await
        .ok()
        .flatten()
}

fn ready_of(update: &muster_sdk::protocol::ops::WatchUpdate) -> u64 {
    match update {
        muster_sdk::protocol::ops::WatchUpdate::Queues { queues, .. } => queues[0].counts.ready,
        other => panic!("not the queues screen: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_pushes_the_watched_screen_when_it_changes_at_most_once_a_second() {
    use muster_sdk::protocol::ops::{View, WatchUpdate};
    let d = Daemon::start();
    let watcher = d.client().await;
    let producer = d.client().await;
    producer
        .queue_create("jobs", muster_sdk::QueuePatch::default())
        .await
        .expect("queue");
    let mut pushes = watcher.watch_pushes();
    let reply = watcher
        .watch(
            View::Queues {
                after: None,
                limit: None,
            },
            1,
        )
        .await
        .expect("watch");
    assert_eq!((reply.tag, ready_of(&reply.update)), (1, 0));
    // Nothing changes: nothing is pushed.
    assert!(
        next_push(&mut pushes, Duration::from_millis(1500))
            .await
            .is_none()
    );
    // A change is pushed (the interval since the reply has passed: at once).
    let task = muster_sdk::NewTask::new(muster_sdk::raw_json("1").expect("json"));
    producer
        .enqueue("jobs", task.clone())
        .await
        .expect("enqueue");
    let push = next_push(&mut pushes, Duration::from_secs(5))
        .await
        .expect("a push");
    assert_eq!((push.tag, ready_of(&push.update)), (1, 1));
    // 20 changes in quick succession: at most one push per second, the last one true.
    let started = std::time::Instant::now();
    for _ in 0..20 {
        producer
            .enqueue("jobs", task.clone())
            .await
            .expect("enqueue");
    }
    let mut seen = Vec::new();
    while let Some(push) = next_push(&mut pushes, Duration::from_millis(2500)).await {
        seen.push(ready_of(&push.update));
    }
    let window = started.elapsed().as_secs_f64();
    assert_eq!(seen.last(), Some(&21), "{seen:?}");
    assert!(
        seen.len() as f64 <= window.ceil() + 1.0,
        "{} pushes in {window:.1} s: {seen:?}",
        seen.len()
    );
    // Another screen under a new tag: the members, pushed when an agent connects.
    let reply = watcher
        .watch(
            View::Members {
                after: None,
                limit: None,
            },
            2,
        )
        .await
        .expect("watch");
    match reply.update {
        WatchUpdate::Members {
            members, connected, ..
        } => assert_eq!((members.len(), connected), (0, 0)),
        other => panic!("{other:?}"),
    }
    let mut agent = d.spawn_agent("gpu-1", "jobs", 1);
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let push = next_push(&mut pushes, Duration::from_secs(5))
            .await
            .expect("a push");
        // Pushes of the replaced watch sent before its reply may still be queued here.
        if push.tag == 1 {
            continue;
        }
        assert_eq!(push.tag, 2);
        if let WatchUpdate::Members {
            members, connected, ..
        } = push.update
            && connected == 1
        {
            assert_eq!(members[0].name, "gpu-1");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the agent never showed"
        );
    }
    agent.kill9();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slash_finds_one_task_among_100_000_and_says_how_long_it_took() {
    const TASKS: usize = 100_000;
    const NEEDLE: usize = 61_803;
    let d = Daemon::start();
    let client = d.client().await;
    client
        .queue_create("big", muster_sdk::QueuePatch::default())
        .await
        .expect("queue");
    muster_tests::fill(&client, "big", TASKS, |i| {
        let text = if i == NEEDLE {
            r#"{"n":"needle-61803"}"#.to_owned()
        } else {
            format!(r#"{{"n":{i}}}"#)
        };
        muster_sdk::NewTask::new(muster_sdk::raw_json(&text).expect("json"))
    })
    .await;
    // The SDK's own search, paged to the end, names the task the console must find.
    let mut request = muster_sdk::protocol::ops::TaskFind {
        queue: Some("big".into()),
        payload: Some("needle".into()),
        ..Default::default()
    };
    let mut want = None;
    for _ in 0..TASKS {
        let page = client.task_find(&request).await.expect("find");
        if let Some(t) = page.tasks.first() {
            want = Some(t.id.clone());
            break;
        }
        match page.next {
            Some(next) => request.after = Some(next),
            None => break,
        }
    }
    let want = want.expect("the needle is stored");
    client.close().await;

    let tmux = Tmux::start(&d, &[]);
    tmux.wait_for("big");
    tmux.keys(&[":queue big", "Enter"]);
    tmux.wait_for("Queue big");
    tmux.keys(&["/payload:needle"]);
    tmux.wait_for("/payload:needle");
    let started = Instant::now();
    tmux.keys(&["Enter"]);
    tmux.wait_for_within(&want, SEARCH_TIMEOUT);
    let took = started.elapsed();
    eprintln!("console: / over {TASKS} tasks showed the match in {took:?}");
    // The search goes on to the end of the queue (the page is not full): one match.
    let found = tmux.wait_for_within("examined, all", SEARCH_TIMEOUT);
    assert!(found.contains("1 found"), "{found}");
    // Enter opens it: the payload is the needle's.
    tmux.keys(&["Enter"]);
    tmux.wait_for("needle-61803");
    tmux.keys(&["q"]);
    assert_eq!(tmux.wait_exit(), 0);
}

#[test]
fn edit_and_requeue_a_dead_task_from_the_console() {
    let d = Daemon::start();
    let dead = queue_with_a_dead_task(&d);
    // The "editor" changes the payload the way an operator would, and exits.
    let dir = tempfile::tempdir().expect("a directory for the editor");
    let editor = dir.path().join("fix-payload");
    std::fs::write(&editor, "#!/bin/sh\nsed -i 's/1/42/' \"$1\"\n").expect("the editor script");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&editor, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let tmux = Tmux::start_with_env(
        &d,
        &[],
        &["VISUAL=".to_owned(), format!("EDITOR={}", editor.display())],
    );
    tmux.wait_for("jobs");
    tmux.keys(&[":dead", "Enter"]);
    tmux.wait_for(&dead);
    tmux.keys(&["Enter"]);
    tmux.wait_for(&format!("Task {dead}"));
    // The title is drawn at once, the task when the daemon's reply arrives.
    tmux.wait_for("state      dead");
    tmux.keys(&["e"]);
    tmux.wait_for("Enqueue the edited payload on queue jobs");
    assert_eq!(
        state(&d, &dead),
        "dead",
        "nothing happens before the confirm"
    );
    tmux.keys(&["y"]);
    let screen = tmux.wait_for(&format!("requeued {dead} as "));
    let new = screen
        .split(&format!("requeued {dead} as "))
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .expect("the new id")
        .to_owned();
    let task: serde_json::Value =
        serde_json::from_str(&d.ok(&["task", "get", &new, "--json"])).expect("task JSON");
    assert_eq!(
        (task["state"].as_str(), &task["payload"]),
        (Some("ready"), &serde_json::json!({"n": 42}))
    );
    let gone = d.cli(&["task", "get", &dead]);
    assert_eq!(gone.status.code(), Some(1), "the dead task was discarded");
    tmux.keys(&["q"]);
    assert_eq!(tmux.wait_exit(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_set_options_run_now_reprioritize_and_undrain_from_the_console() {
    let d = Daemon::start();
    d.ok(&["queue", "create", "jobs"]);
    let later = d.ok(&["enqueue", "jobs", r#"{"n":1}"#, "--delay", "1h"]);
    let later = later.trim().to_owned();
    // A member's session, drained by an operator: it stays known while drained.
    let client = d.client().await;
    let open = muster_sdk::protocol::ops::SessionOpen {
        member: "m1".into(),
        labels: vec![],
        capacity: 1,
        reclaim: false,
        resume: false,
        held: None,
        liveness_ms: None,
    };
    let _session = client.open_session(&open).await.expect("session");
    d.ok(&["member", "drain", "m1"]);
    // The "editor" edits queue options (a longer lease) or writes a new task's payload.
    let dir = tempfile::tempdir().expect("a directory for the editor");
    let editor = dir.path().join("edit");
    std::fs::write(
        &editor,
        "#!/bin/sh\nif grep -q lease_ms \"$1\"; then\n  sed -i 's/\"lease_ms\": 30000/\"lease_ms\": 45000/' \"$1\"\nelse\n  printf '{\"order\":7}' > \"$1\"\nfi\n",
    )
    .expect("the editor script");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&editor, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let tmux = Tmux::start_with_env(
        &d,
        &[],
        &["VISUAL=".to_owned(), format!("EDITOR={}", editor.display())],
    );
    tmux.wait_for("jobs");

    // a: a new task, its payload from the editor, after a confirm.
    tmux.keys(&["a"]);
    tmux.wait_for("Enqueue the edited payload (11 bytes) on queue jobs?");
    tmux.keys(&["y"]);
    let screen = tmux.wait_for("enqueued ");
    let new = screen
        .split("enqueued ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .expect("the new id")
        .to_owned();
    let task: serde_json::Value =
        serde_json::from_str(&d.ok(&["task", "get", &new, "--json"])).expect("task JSON");
    assert_eq!(
        (task["state"].as_str(), &task["payload"]),
        (Some("ready"), &serde_json::json!({"order": 7}))
    );

    // o: the queue's options, only what changed confirmed.
    tmux.keys(&["o"]);
    tmux.wait_for("Update queue jobs: lease_ms 30000 → 45000?");
    tmux.keys(&["y"]);
    tmux.wait_for("updated queue jobs: lease_ms 30000 → 45000");
    let queue: serde_json::Value =
        serde_json::from_str(&d.ok(&["queue", "describe", "jobs", "--json"])).expect("JSON");
    assert_eq!(queue["options"]["lease_ms"], 45_000, "{queue}");

    // N on the scheduled tab: the task runs now.
    tmux.keys(&[":queue jobs scheduled", "Enter"]);
    tmux.wait_for(&later);
    tmux.keys(&["N"]);
    tmux.wait_for(&format!("Run scheduled task {later} now?"));
    assert_eq!(state(&d, &later), "scheduled", "nothing before the confirm");
    tmux.keys(&["y"]);
    tmux.wait_for(&format!("task {later} is ready now"));
    assert_eq!(state(&d, &later), "ready");

    // + on the ready tab: the first task (the one run now, enqueued first) goes up one.
    tmux.keys(&[":queue jobs", "Enter"]);
    tmux.wait_for(&new);
    tmux.keys(&["+"]);
    tmux.wait_for(&format!("Task {later}: priority 0 → 1?"));
    tmux.keys(&["y"]);
    tmux.wait_for(&format!("task {later} now has priority 1"));
    let task: serde_json::Value =
        serde_json::from_str(&d.ok(&["task", "get", &later, "--json"])).expect("task JSON");
    assert_eq!(task["priority"], 1);

    // u on the members: the drained member gets work again.
    tmux.keys(&[":members", "Enter"]);
    tmux.wait_for("draining");
    tmux.keys(&["u"]);
    tmux.wait_for("Undrain member m1? It gets work again.");
    tmux.keys(&["y"]);
    tmux.wait_for("undrained m1: it gets work again");
    let m1 = client.member_describe("m1").await.expect("member");
    assert!(!m1.member.draining);
    tmux.keys(&["q"]);
    assert_eq!(tmux.wait_exit(), 0);
}
