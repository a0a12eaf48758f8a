//! The console at scale: 100,000 ready tasks in a queue, 200 connected members at work.
//!
//! ```sh
//! cargo run --release -p muster-tests --example console_load -- [RUNS] [SECONDS]
//! ```
//! (defaults: 3 runs of 20 s). One release `musterd` (fsync on) holds queue `inference`
//! with 100,000 ready tasks; 200 SDK workers (capacity 1) take tasks by push, work 2 s
//! and ack, and a producer enqueues 100 tasks/s, so the counts change every second and
//! every watch is pushed every second (the worst case for the daemon).
//!
//! 1. Key press → redraw: the console's own `App` and `ui` over a real connection,
//!    drawn into an 80×24 `TestBackend`, as the real loop does. For each key: press,
//!    watch the new screen (the daemon builds it), draw the frame. Keys that change
//!    screen (open the queue, switch tabs, open a task, back, members, next page) and
//!    keys that only move the selection are reported apart: median, p99, max.
//! 2. What a watching console costs the daemon: the daemon's CPU time
//!    (`/proc/PID/stat` utime + stime) over SECONDS with no console, with the real
//!    `muster tui` (in tmux) on the queue's ready tab, and on the members screen,
//!    interleaved RUNS times. The console's cost is the median with, minus the median
//!    without, in percent of one core.
//! 3. The same cost from the other side, free of the swarm's noise: the daemon's CPU
//!    time for 2,000 `watch` requests of each screen in a row, per request. A console
//!    is sent at most one screen a second, so this (request handling included) is an
//!    upper bound of its cost per second.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::Terminal;
use ratatui::backend::TestBackend;

use muster_sdk::protocol::model::TaskState;
use muster_sdk::protocol::ops::View;
use muster_sdk::{Client, NewTask, Outcome, QueuePatch, Task, Worker, WorkerConfig};
use muster_tests::{Daemon, muster_bin};
use muster_tui::console::app::{App, Effect, PAGE_ROWS};
use muster_tui::console::ui;

const BACKLOG: usize = 100_000;
const MEMBERS: usize = 200;

fn payload(i: usize) -> NewTask {
    let body = format!(r#"{{"prompt":"task {i}","pad":"{}"}}"#, "x".repeat(200));
    NewTask::new(muster_sdk::raw_json(&body).expect("json"))
}

async fn work(_task: Task) -> Outcome {
    tokio::time::sleep(Duration::from_secs(2)).await;
    Outcome::Ack(None)
}

fn start_swarm(d: &Daemon) {
    for i in 0..MEMBERS {
        let mut config = WorkerConfig::new(format!("agent-{i:03}"), ["inference"]);
        config.capacity = 1;
        let worker = Worker::new(d.options(), config);
        tokio::spawn(async move {
            if let Err(e) = worker.run(work).await {
                eprintln!("worker: {e}");
            }
        });
    }
}

fn start_producer(client: Client) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        let mut n = BACKLOG;
        loop {
            tick.tick().await;
            if client
                .enqueue_batch("inference", (n..n + 10).map(payload).collect())
                .await
                .is_err()
            {
                return;
            }
            n += 10;
        }
    });
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn report(name: &str, mut ms: Vec<f64>) {
    ms.sort_by(f64::total_cmp);
    println!(
        "{name:<28} n={:<4} p50={:>6.2} ms  p99={:>6.2} ms  max={:>6.2} ms",
        ms.len(),
        percentile(&ms, 0.5),
        percentile(&ms, 0.99),
        ms.last().copied().unwrap_or(f64::NAN)
    );
}

/// Presses keys on an in-process console and times each until its frame is drawn.
async fn key_latency(d: &Daemon, rounds: usize) {
    let client = d.client().await;
    // Pushes are not needed here (each key's watch reply carries its screen).
    let mut pushes = client.watch_pushes();
    tokio::spawn(async move { while pushes.recv().await.is_some() {} });
    let mut terminal = Terminal::new(TestBackend::new(80, 24)).expect("terminal");
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    };
    let (mut app, first) = App::new(d.addr.clone(), false, now());
    let mut effects = vec![first];
    let (mut screens, mut moves) = (Vec::new(), Vec::new());
    let key = |c: KeyCode| KeyEvent::new(c, KeyModifiers::NONE);
    let mut script = Vec::new();
    for _ in 0..rounds {
        script.extend([
            KeyCode::Enter, // the queue's ready tab: 100 of 100,000 rows
            KeyCode::Char('j'),
            KeyCode::Char(']'), // its next page
            KeyCode::Tab,       // scheduled
            KeyCode::Tab,       // leased: 200 rows, holders
            KeyCode::Enter,     // one leased task, whole
            KeyCode::Esc,
            KeyCode::Tab, // dead
            KeyCode::Esc, // the queues
            KeyCode::Char(':'),
            KeyCode::Char('m'),
            KeyCode::Char('e'),
            KeyCode::Char('m'),
            KeyCode::Char('b'),
            KeyCode::Char('e'),
            KeyCode::Char('r'),
            KeyCode::Char('s'),
            KeyCode::Enter, // the members, 100 of 200
            KeyCode::Char('j'),
            KeyCode::Char(']'),
            KeyCode::Esc,
        ]);
    }
    for code in script {
        app.now_ms = now();
        let started = Instant::now();
        effects.extend(app.on_key(key(code)));
        let changes_screen = !effects.is_empty();
        while let Some(effect) = effects.pop() {
            match effect {
                Effect::Watch { view, tag } => {
                    let reply = client.watch(view, tag).await.expect("watch");
                    effects.extend(app.on_watch(reply));
                }
                Effect::Find { search, tag } => {
                    let reply = client.task_find(&search).await.map_err(|e| e.to_string());
                    effects.extend(app.on_found(tag, reply));
                }
                Effect::Run(verb) => panic!("the script runs no verbs: {verb:?}"),
                Effect::Edit(_) | Effect::Copy { .. } => {
                    panic!("the script edits and copies nothing")
                }
            }
        }
        terminal.draw(|f| ui::render(&app, f)).expect("draw");
        let ms = started.elapsed().as_secs_f64() * 1000.0;
        if changes_screen {
            screens.push(ms);
        } else if matches!(code, KeyCode::Char('j')) {
            moves.push(ms);
        }
    }
    report("key that changes screen", screens);
    report("key that moves selection", moves);
}

fn clock_ticks() -> f64 {
    let out = Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .expect("getconf");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("CLK_TCK")
}

/// CPU seconds a process used so far (user + system).
fn cpu_seconds(pid: u32, ticks: f64) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc/PID/stat");
    let after = stat.rsplit_once(')').expect("comm").1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let utime: f64 = fields[11].parse().expect("utime");
    let stime: f64 = fields[12].parse().expect("stime");
    (utime + stime) / ticks
}

struct Tmux {
    _dir: tempfile::TempDir,
    socket: PathBuf,
}

impl Tmux {
    fn run(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("tmux");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn console(d: &Daemon, keys: &[&str]) -> Tmux {
        let dir = tempfile::tempdir().expect("dir");
        let t = Tmux {
            socket: dir.path().join("tmux.sock"),
            _dir: dir,
        };
        t.run(&[
            "-f",
            "/dev/null",
            "new-session",
            "-d",
            "-s",
            "c",
            "-x",
            "80",
            "-y",
            "24",
            "-e",
            &format!("MUSTER_ADDR={}", d.addr),
            "-e",
            &format!("MUSTER_DATA={}", d.data().display()),
            &format!("{} tui", muster_bin().display()),
        ]);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !t
            .run(&["capture-pane", "-p", "-t", "c"])
            .contains("inference")
        {
            assert!(
                Instant::now() < deadline,
                "the console never showed the queue"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut args = vec!["send-keys", "-t", "c"];
        args.extend(keys);
        t.run(&args);
        t
    }

    fn pid(&self) -> u32 {
        self.run(&["list-panes", "-t", "c", "-F", "#{pane_pid}"])
            .trim()
            .parse()
            .expect("pane pid")
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        self.run(&["kill-server"]);
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let runs: usize = args.next().map_or(3, |a| a.parse().expect("RUNS"));
    let seconds: u64 = args.next().map_or(20, |a| a.parse().expect("SECONDS"));
    let d = Daemon::start();
    let client = d.client().await;
    client
        .queue_create("inference", QueuePatch::default())
        .await
        .expect("queue");
    muster_tests::fill(&client, "inference", BACKLOG, payload).await;
    start_swarm(&d);
    start_producer(client.clone());
    // Let every member connect and take its first task.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let members = client.member_list().await.expect("members");
        if members
            .iter()
            .filter(|m| m.connected && m.leased > 0)
            .count()
            == MEMBERS
        {
            break;
        }
        assert!(Instant::now() < deadline, "the swarm did not start");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let q = client.queue_describe("inference").await.expect("describe");
    println!(
        "queue inference: {} ready, {} leased; {MEMBERS} members connected",
        q.counts.ready, q.counts.leased
    );
    key_latency(&d, 10).await;

    let ticks = clock_ticks();
    let pid = d.pid();
    let span = Duration::from_secs(seconds);
    let (mut none, mut queue, mut members, mut console) = (vec![], vec![], vec![], vec![]);
    for run in 0..runs {
        for setup in ["none", "queue", "members"] {
            let tmux = match setup {
                "none" => None,
                "queue" => Some(Tmux::console(&d, &["Enter"])),
                _ => Some(Tmux::console(&d, &[":members", "Enter"])),
            };
            tokio::time::sleep(Duration::from_secs(1)).await;
            let tui = tmux.as_ref().map(Tmux::pid);
            let (before, tui_before) =
                (cpu_seconds(pid, ticks), tui.map(|p| cpu_seconds(p, ticks)));
            let started = Instant::now();
            tokio::time::sleep(span).await;
            let wall = started.elapsed().as_secs_f64();
            let share = (cpu_seconds(pid, ticks) - before) / wall * 100.0;
            if let (Some(p), Some(b)) = (tui, tui_before) {
                console.push((cpu_seconds(p, ticks) - b) / wall * 100.0);
            }
            println!("run {run} {setup:<8} daemon {share:5.2}% of a core");
            match setup {
                "none" => none.push(share),
                "queue" => queue.push(share),
                _ => members.push(share),
            }
        }
    }
    let base = median(none.clone());
    println!("daemon CPU, median of {runs} runs of {seconds} s, % of one core:");
    println!("  no console               {base:5.2}");
    println!(
        "  console on the queue     {:5.2}  (cost {:+.2})",
        median(queue.clone()),
        median(queue) - base
    );
    println!(
        "  console on the members   {:5.2}  (cost {:+.2})",
        median(members.clone()),
        median(members) - base
    );
    println!("  the muster tui process itself: {:5.2}", median(console));

    let views = [
        (
            "queues",
            View::Queues {
                after: None,
                limit: Some(PAGE_ROWS),
            },
        ),
        (
            "queue ready tab",
            View::Tasks {
                queue: "inference".into(),
                state: TaskState::Ready,
                after: None,
                limit: Some(PAGE_ROWS),
            },
        ),
        (
            "queue leased tab",
            View::Tasks {
                queue: "inference".into(),
                state: TaskState::Leased,
                after: None,
                limit: Some(PAGE_ROWS),
            },
        ),
        (
            "members",
            View::Members {
                after: None,
                limit: Some(PAGE_ROWS),
            },
        ),
    ];
    println!("daemon CPU per screen built (2,000 watch requests each, less the swarm's share):");
    for (name, view) in views {
        let before = cpu_seconds(pid, ticks);
        let started = Instant::now();
        for tag in 0..2000 {
            client.watch(view.clone(), tag).await.expect("watch");
        }
        // The swarm's own load during the loop (the median without a console) is taken off.
        let swarm = base / 100.0 * started.elapsed().as_secs_f64();
        let per = (cpu_seconds(pid, ticks) - before - swarm).max(0.0) / 2000.0;
        println!(
            "  {name:<18} {:7.1} µs  → at one push a second {:.3} % of a core",
            per * 1e6,
            per * 100.0
        );
    }
}
