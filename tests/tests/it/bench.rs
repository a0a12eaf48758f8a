//! `muster bench` end to end on a small workload, and its refusals of bad input.

use std::process::{Command, Output};

use muster_tests::{muster_bin, musterd_bin};

fn bench(args: &[&str]) -> Output {
    Command::new(muster_bin())
        .arg("bench")
        .args(args)
        .output()
        .expect("run muster bench")
}

/// Every phase on a small workload, twice: every figure of every run is in the JSON
/// file, each one in its range, and every row is in the table.
#[test]
fn every_phase_gives_every_figure_in_the_json_and_the_table() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("bench.json");
    let musterd = musterd_bin();
    let o = bench(&[
        "--phase",
        "all",
        "--runs",
        "2",
        "--tasks",
        "600",
        "--producers",
        "2",
        "--window",
        "16",
        "--workers",
        "2",
        "--prefetch",
        "4",
        "--rate",
        "200",
        // Two seconds: the limited phase's rate past its first second is a figure too.
        "--seconds",
        "2",
        "--roundtrips",
        "20",
        "--stored",
        "1000",
        "--members",
        "5",
        "--limit-rate",
        "200",
        "--limit-agents",
        "3",
        "--limit-burst",
        "4",
        "--limit-keys",
        "50",
        "--fair-groups",
        "40",
        "--children",
        "20",
        "--emitters",
        "3",
        "--chunk-rate",
        "50",
        "--burn-tasks",
        "2500",
        "--musterd",
        musterd.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{}\n{stdout}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );

    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    // The arguments as given, defaults filled in.
    let args = &json["args"];
    assert_eq!(args["phase"], serde_json::json!(["all"]), "{args}");
    assert_eq!(args["runs"], 2, "{args}");
    assert_eq!(args["tasks"], 600, "{args}");
    assert_eq!(args["rate"], 200.0, "{args}");
    assert_eq!(args["durability"], "sync", "{args}");
    assert_eq!(args["musterd"], musterd.to_str().unwrap(), "{args}");
    let runs = json["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    // Every figure of every phase, each present; those that time something are above 0.
    // The daemon's CPU is counted in 10 ms ticks, which 600 tasks may not reach (so the
    // CPU of flow control's tasks against plain ones, a ratio, may be absent).
    let positive = [
        "cpu_probe_ms",
        "fdatasync_p50_ms",
        "fdatasync_p99_ms",
        "enqueue_per_s",
        "drain_per_s",
        "latency_p50_ms",
        "latency_p99_ms",
        "latency_p999_ms",
        "latency_max_ms",
        "latency_disk_p99_ms",
        "latency_disk_p999_ms",
        "latency_disk_max_ms",
        "roundtrip_mean_ms",
        "suspend_p50_ms",
        "suspend_p99_ms",
        "resume_to_lease_p50_ms",
        "resume_to_lease_p99_ms",
        "fanout_spawn_ms",
        "fanout_children_per_s",
        "fanout_total_ms",
        "output_chunks_per_s",
        "output_delay_p50_ms",
        "output_delay_p99_ms",
        "startup_s",
        "startup_rss_mib",
        "members_rss_mib",
        "limited_per_s",
        "limited_steady_per_s",
        "fair_b_wait_p50_ms",
        "fair_b_wait_p99_ms",
        "fair_b_wait_max_ms",
        "fair_groups_drain_per_s",
        "fair_groups_vs_plain",
        "limit_cost_drain_per_s",
        "limit_cost_vs_plain",
        "burndown_enqueue_per_s",
        "burndown_per_s",
        "burndown_rss_mib",
        "rss_mib",
    ];
    for run in runs {
        let figure = |k: &str| {
            run[k]
                .as_f64()
                .unwrap_or_else(|| panic!("{k} is missing in {run}"))
        };
        for k in positive {
            assert!(figure(k) > 0.0, "{k} = {} in {run}", figure(k));
        }
        // The limit's bucket starts empty and refills 200 a second, a burst of 4: no
        // second can hand out more than 204 (the agents' clocks add a little jitter).
        let most = figure("limited_most_in_1s");
        assert!((1.0..=214.0).contains(&most), "most in 1 s {most} in {run}");
        for k in [
            "enqueue_cpu_s_per_1000",
            "drain_cpu_s_per_1000",
            "limit_cost_cpu_s_per_1000",
            "fair_groups_cpu_s_per_1000",
            "fanin_ms",
            "output_cpu_us_per_chunk",
            "output_disk_bytes_per_chunk",
            "burndown_cpu_s_per_1000",
        ] {
            assert!(figure(k) >= 0.0, "{k} = {} in {run}", figure(k));
        }
        // Every request of a batch counts; a batch holds at least one.
        assert!(figure("enqueue_batch_factor") >= 1.0, "{run}");
        assert!(figure("drain_batch_factor") >= 1.0, "{run}");
        let steal = figure("steal_percent");
        assert!((0.0..=100.0).contains(&steal), "steal {steal} in {run}");
        let cpu = figure("members_cpu_percent");
        assert!((0.0..=200.0).contains(&cpu), "members CPU {cpu} in {run}");
        // Memory per member is a difference over 5 members: present, of either sign.
        figure("members_kib_per_member");
    }

    let table: Vec<&str> = stdout.lines().collect();
    assert!(
        table[0].starts_with("figure") && table[0].ends_with("runs: 2"),
        "{stdout}"
    );
    for row in [
        "machine: CPU probe ms",
        "machine: CPU stolen during the run %",
        "disk fdatasync p50 ms",
        "disk fdatasync p99 ms",
        "enqueue tasks/s",
        "enqueue fsync batch factor",
        "enqueue daemon CPU s / 1000 tasks",
        "drain tasks/s",
        "drain fsync batch factor",
        "drain daemon CPU s / 1000 tasks",
        "latency p50 ms",
        "latency p99 ms",
        "latency p99.9 ms",
        "latency max ms",
        "disk fdatasync meanwhile p99 ms",
        "disk fdatasync meanwhile p99.9 ms",
        "disk fdatasync meanwhile max ms",
        "round trip mean ms",
        "suspend: reply p50 ms",
        "suspend: reply p99 ms",
        "suspend: resume to next lease p50 ms",
        "suspend: resume to next lease p99 ms",
        "fanout: spawn reply ms",
        "fanout: children run/s",
        "fanout: spawn to parent's next lease ms",
        "fanout: last child's ack to parent's next lease ms",
        "output: chunks followed/s",
        "output: follower delay p50 ms",
        "output: follower delay p99 ms",
        "output: daemon CPU us / chunk",
        "output: daemon disk bytes / chunk",
        "startup to serving s",
        "startup RSS MiB",
        "members: daemon CPU %",
        "members: daemon RSS MiB",
        "members: daemon KiB per member",
        "limited: tasks/s",
        "limited: tasks/s past the first s",
        "limited: most in any 1 s",
        "fair: other group's wait p50 ms",
        "fair: other group's wait p99 ms",
        "fair: other group's wait max ms",
        "fair: groups' drain tasks/s",
        "fair: groups' tasks/s vs plain",
        "fair: groups' daemon CPU s / 1000 tasks",
        "limit-cost: drain tasks/s",
        "limit-cost: tasks/s vs plain",
        "limit-cost: daemon CPU s / 1000 tasks",
        "burndown: enqueue tasks/s",
        "burndown: tasks worked/s",
        "burndown: daemon CPU s / 1000 tasks",
        "burndown: daemon RSS at the end MiB",
        "daemon RSS after the run MiB",
    ] {
        let line = table
            .iter()
            .find(|l| l.starts_with(row))
            .unwrap_or_else(|| panic!("no {row:?} row in:\n{stdout}"));
        // The row's median, min and max.
        let numbers: Vec<f64> = line[row.len()..]
            .split_whitespace()
            .map(|v| v.parse().unwrap())
            .collect();
        assert_eq!(numbers.len(), 3, "{line}");
        assert!(
            numbers[1] <= numbers[0] && numbers[0] <= numbers[2],
            "{line}"
        );
    }
    assert_eq!(
        table.last().unwrap(),
        &format!("all figures: {}", out.display())
    );
}

/// Only the phases asked for run: the others' figures stay out of the JSON and the table.
#[test]
fn only_the_phases_asked_for_run() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("bench.json");
    let musterd = musterd_bin();
    let o = bench(&[
        "--phase",
        "roundtrip",
        "--roundtrips",
        "10",
        "--musterd",
        musterd.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    assert_eq!(json["args"]["phase"], serde_json::json!(["roundtrip"]));
    let run = &json["runs"][0];
    assert!(run["roundtrip_mean_ms"].as_f64().unwrap() > 0.0, "{run}");
    for k in [
        "enqueue_per_s",
        "drain_per_s",
        "latency_p50_ms",
        "startup_s",
        "members_cpu_percent",
        "suspend_p50_ms",
    ] {
        assert!(run[k].is_null(), "{k} in {run}");
    }
    assert!(stdout.contains("round trip mean ms"), "{stdout}");
    assert!(!stdout.contains("enqueue tasks/s"), "{stdout}");
}

/// A bad value is refused before any daemon starts: exit 1, one line on stderr naming
/// the option and the reason, nothing written.
#[test]
fn bad_values_are_refused_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("bench.json");
    for (args, says) in [
        (
            &["--phase", "enqeue"][..],
            "invalid value 'enqeue' for '--phase <PHASE>'",
        ),
        (
            &["--phase", "enqueue,"][..],
            "a value is required for '--phase <PHASE>'",
        ),
        (
            &["--producers", "0"][..],
            "invalid value '0' for '--producers <PRODUCERS>': must be at least 1",
        ),
        (
            &["--runs", "0"][..],
            "invalid value '0' for '--runs <RUNS>': must be at least 1",
        ),
        (&["--runs", "-1"][..], "unexpected argument '-1'"),
        (
            &["--tasks", "many"][..],
            "invalid value 'many' for '--tasks <TASKS>': \"many\" is not a count",
        ),
        (
            &["--prefetch", "0"][..],
            "invalid value '0' for '--prefetch <PREFETCH>': 0 is not in 1..=4294967295",
        ),
        (
            &["--rate", "0"][..],
            "invalid value '0' for '--rate <RATE>': must be from 1 to 1000000",
        ),
        (
            &["--rate", "inf"][..],
            "invalid value 'inf' for '--rate <RATE>': must be from 1 to 1000000",
        ),
        (
            &["--seconds", "NaN"][..],
            "invalid value 'NaN' for '--seconds <SECONDS>': must be from 1 to 86400",
        ),
        (
            &["--durability", "fast"][..],
            "invalid value 'fast' for '--durability <DURABILITY>'",
        ),
    ] {
        let mut all = args.to_vec();
        all.extend(["--out", out.to_str().unwrap()]);
        let o = bench(&all);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.starts_with("muster: "), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(
            stderr.contains(says),
            "{args:?} should say {says:?}: {stderr}"
        );
        assert!(o.stdout.is_empty(), "{args:?}");
        assert!(!out.exists(), "{args:?} wrote {}", out.display());
    }
}
