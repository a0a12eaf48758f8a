//! Cron schedules on real daemons: a schedule that fires every second enqueues one task
//! per second, each under its time's key, across a kill -9 and restart of a single
//! daemon and across the kill -9 of a cluster's leader; nothing fires twice, no time
//! within the grace is lost, and the schedule's own count agrees with the tasks.

use std::collections::BTreeSet;
use std::time::Duration;

use muster_sdk::protocol::model::CatchUp;
use muster_sdk::protocol::ops::ScheduleSet;
use muster_sdk::{Client, NewTask, QueuePatch, TaskState};
use muster_tests::cluster::Cluster;
use muster_tests::{Daemon, until};

/// A schedule firing every second into `queue`.
fn every_second(name: &str, queue: &str) -> ScheduleSet {
    ScheduleSet {
        name: name.into(),
        cron: "* * * * * *".into(),
        tz: None,
        queue: queue.into(),
        task: NewTask::new(muster_sdk::json(&serde_json::json!({"tick": true})).expect("json")),
        catch_up: Some(CatchUp::Skip),
        paused: None,
    }
}

/// What the tasks of `queue` say of `schedule`'s fires: their times (from their
/// idempotency keys), in order, once each; how many tasks were fires (a time fired
/// twice would show as more tasks than times); and how many were runs.
async fn fires_in(client: &Client, queue: &str, schedule: &str) -> (Vec<u64>, usize, usize) {
    let (mut times, mut fires, mut runs) = (Vec::new(), 0, 0);
    for state in [TaskState::Ready, TaskState::Leased, TaskState::Done] {
        let mut cursor = None;
        loop {
            let page = client
                .task_list(queue, state, cursor, Some(1000))
                .await
                .expect("task_list");
            for t in &page.tasks {
                let task = client.task_get(&t.id).await.expect("task_get");
                let key = task.idempotency_key.expect("a schedule's task has a key");
                let rest = key
                    .strip_prefix(&format!("schedule:{schedule}:"))
                    .unwrap_or_else(|| panic!("a key of {schedule}, not {key:?}"));
                if rest.starts_with("run:") {
                    runs += 1;
                    continue;
                }
                times.push(rest.parse::<u64>().expect("a fire time"));
                fires += 1;
            }
            match page.next {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
    }
    times.sort_unstable();
    times.dedup();
    (times, fires, runs)
}

/// Asserts that the tasks of `queue` are `schedule`'s fires every second from the first
/// to the last, once each (at least `at_least` of them), and `runs` runs; and that the
/// schedule counted exactly those.
async fn assert_every_second_once(
    client: &Client,
    queue: &str,
    schedule: &str,
    at_least: usize,
    runs: usize,
) {
    let (times, fires, ran) = fires_in(client, queue, schedule).await;
    assert_eq!(fires, times.len(), "no time fired twice: {times:?}");
    assert_eq!(ran, runs);
    assert!(times.len() >= at_least, "{} fires: {times:?}", times.len());
    let gaps: BTreeSet<u64> = times.windows(2).map(|w| w[1] - w[0]).collect();
    assert_eq!(gaps, BTreeSet::from([1000]), "every second once: {times:?}");
    let info = client.schedule_get(schedule).await.expect("schedule_get");
    assert_eq!(info.fires, times.len() as u64, "the schedule's count");
    assert_eq!(info.runs, runs as u64);
    assert_eq!((info.missed, info.failures), (0, 0));
    assert_eq!(info.last_fire_ms, times.last().copied());
}

/// Waits until `schedule` has fired at least `n` times.
async fn fired_at_least(client: &Client, schedule: &str, n: u64) {
    until(Duration::from_secs(30), "the schedule fired", || async {
        client
            .schedule_get(schedule)
            .await
            .is_ok_and(|s| s.fires >= n)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_fires_once_per_second_across_a_kill9_and_restart() {
    let mut d = Daemon::start();
    let client = d.client().await;
    client
        .queue_create("ticks", QueuePatch::default())
        .await
        .expect("queue_create");
    let set = client
        .schedule_set(&every_second("tick", "ticks"))
        .await
        .expect("schedule_set");
    assert_eq!((set.tz.as_str(), set.fires), ("UTC", 0));
    assert!(set.next_fire_ms.is_some());
    fired_at_least(&client, "tick", 3).await;
    let ran = client.schedule_run("tick").await.expect("schedule_run");
    assert!(!ran.duplicate);
    drop(client);
    d.kill9();
    // Down for three seconds: the times it passed are late by less than the grace and
    // fire at the start.
    std::thread::sleep(Duration::from_secs(3));
    d.restart();
    let client = d.client().await;
    let before = client
        .schedule_get("tick")
        .await
        .expect("schedule_get")
        .fires;
    fired_at_least(&client, "tick", before + 5).await;
    let paused = client.schedule_pause("tick").await.expect("pause");
    assert!(paused.paused);
    assert_eq!(paused.next_fire_ms, None);
    assert_every_second_once(&client, "ticks", "tick", 9, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_fires_once_per_second_across_the_leaders_kill9() {
    let mut cluster = Cluster::start(3).await;
    let client = cluster.client().await;
    client
        .queue_create("ticks", QueuePatch::default())
        .await
        .expect("queue_create");
    client
        .schedule_set(&every_second("tick", "ticks"))
        .await
        .expect("schedule_set");
    fired_at_least(&client, "tick", 3).await;
    let old = cluster.leader().await;
    cluster.kill9(old.node);
    let new = cluster.leader().await;
    assert_ne!(new.node, old.node);
    drop(client);
    let client = cluster.client().await;
    let before = client
        .schedule_get("tick")
        .await
        .expect("schedule_get")
        .fires;
    fired_at_least(&client, "tick", before + 4).await;
    client.schedule_pause("tick").await.expect("pause");
    assert_every_second_once(&client, "ticks", "tick", 7, 0).await;
}

/// The README's console block under "Recurring work: schedules", run as written: each
/// `$` line in a shell with `muster` on its path, against a fresh daemon; its output
/// must be what the README prints but for times, relative times and task ids.
#[test]
fn the_readmes_schedule_example_runs_as_printed() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("README.md");
    let section = readme
        .split("## Recurring work: schedules")
        .nth(1)
        .expect("the README's schedules section");
    let block = section
        .split("```console\n")
        .nth(1)
        .and_then(|b| b.split("\n```").next())
        .expect("its console block");
    // Commands (a trailing `\` continues one) and the lines each prints.
    let mut steps: Vec<(String, Vec<String>)> = Vec::new();
    let mut continued = false;
    for line in block.lines() {
        if let Some(cmd) = line.strip_prefix("$ ") {
            steps.push((cmd.trim_end_matches('\\').to_owned(), Vec::new()));
            continued = line.ends_with('\\');
        } else if continued {
            let (cmd, _) = steps.last_mut().expect("a command");
            cmd.push_str(line.trim_end_matches('\\'));
            continued = line.ends_with('\\');
        } else {
            steps.last_mut().expect("a command").1.push(line.to_owned());
        }
    }
    assert_eq!(steps.len(), 6, "{steps:?}");
    let d = Daemon::start();
    let bin_dir = muster_tests::muster_bin()
        .parent()
        .expect("the binary's directory")
        .to_owned();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let varying = regex::Regex::new(
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z \((in \S+|\S+ ago)\)|\b[0-9A-HJKMNP-TV-Z]{26}\b",
    )
    .expect("a regex");
    let normal = |text: &str| varying.replace_all(text, "…").into_owned();
    for (cmd, expected) in steps {
        let out = std::process::Command::new("sh")
            .args(["-c", &cmd])
            .env("PATH", &path)
            .env("MUSTER_ADDR", &d.addr)
            .env("MUSTER_DATA", d.data())
            .env_remove("MUSTER_PIN")
            .env_remove("MUSTER_CA")
            .output()
            .expect("sh");
        let printed = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let printed: Vec<String> = printed.lines().map(normal).collect();
        let expected: Vec<String> = expected
            .iter()
            .map(|l| normal(l.split("  #").next().unwrap_or(l).trim_end()))
            .collect();
        assert_eq!(printed, expected, "{cmd}");
        assert_eq!(
            out.status.success(),
            !cmd.contains("--cron '61"),
            "{cmd}: exit {:?}",
            out.status
        );
    }
}
