//! The deploy kit: the systemd unit's flags start a real daemon (not under systemd),
//! and the Grafana dashboard and the alert rules only query series the daemon exports:
//! a single daemon all but the cluster's, and the nodes of a cluster every one (a
//! follower all but what only the serving leader exports). promtool, where it is
//! installed, checks the rules and runs their unit tests (`.ci/run` checks them too).

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use muster_tests::cluster::Cluster;
use muster_tests::{muster_bin, musterd_bin};

use crate::metrics::{local_token, node_metrics_addr, scrape as scrape_with_token};

const OPS: &str = "ops-token-0123456789abcdef";

fn deploy_file(path: &str) -> String {
    let file = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(path);
    std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}

/// The unit's ExecStart arguments (after the binary), with the directories systemd
/// would give it.
fn unit_args(state: &Path, config_dir: &Path) -> Vec<String> {
    let unit = deploy_file("systemd/musterd.service");
    let exec = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("the unit has an ExecStart");
    let mut words = exec.split_whitespace();
    assert_eq!(words.next(), Some("/usr/local/bin/musterd"));
    words
        .map(|w| {
            w.replace("${STATE_DIRECTORY}", &state.display().to_string())
                .replace(
                    "${CONFIGURATION_DIRECTORY}",
                    &config_dir.display().to_string(),
                )
        })
        .collect()
}

/// The value given to `flag` in `args`, replaced by `value`.
fn set_flag(args: &mut [String], flag: &str, value: &str) {
    let at = args
        .iter()
        .position(|a| a == flag)
        .unwrap_or_else(|| panic!("the unit passes {flag}"));
    value.clone_into(&mut args[at + 1]);
}

fn scrape(addr: &str) -> String {
    let mut stream = std::net::TcpStream::connect(addr).expect("metrics endpoint");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    stream
        .write_all(format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .expect("request");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("response");
    response
}

/// The metric names a PromQL text names (`muster_*` and `process_*`), histogram
/// series reduced to their family.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find(['m', 'p']) {
        let word: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let starts_word = at == 0
            || !rest[..at]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        if starts_word && (word.starts_with("muster_") || word.starts_with("process_")) {
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| word.strip_suffix(s))
                .unwrap_or(&word);
            names.insert(family.to_owned());
        }
        rest = &rest[at + word.len().max(1)..];
    }
    names
}

/// The alert rules' expressions, one a rule (each on one line, as the file keeps them).
fn rule_exprs() -> Vec<String> {
    let rules = deploy_file("prometheus/muster-rules.yml");
    let exprs: Vec<String> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("expr: "))
        .map(str::to_owned)
        .collect();
    let alerts = rules
        .lines()
        .filter(|l| l.trim().starts_with("- alert: "))
        .count();
    assert_eq!(exprs.len(), alerts, "one single-line expr per alert");
    exprs
}

/// Every metric name the dashboard's panels and the alert rules query, after checking
/// the panels' shape.
fn queried() -> BTreeSet<String> {
    let dashboard: serde_json::Value =
        serde_json::from_str(&deploy_file("grafana/muster.json")).expect("the dashboard is JSON");
    let mut queried = BTreeSet::new();
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(dashboard["schemaVersion"].as_u64().is_some_and(|v| v >= 36));
    assert!(dashboard["title"].is_string() && dashboard["uid"].is_string());
    let mut ids = BTreeSet::new();
    for panel in panels {
        assert!(
            ids.insert(panel["id"].as_u64().expect("a panel id")),
            "{panel}"
        );
    }
    for panel in panels.iter().filter(|p| p["type"] != "row") {
        let title = panel["title"].as_str().expect("a panel title");
        assert_eq!(panel["datasource"]["uid"], "${DS_PROMETHEUS}", "{title}");
        assert!(panel["gridPos"]["w"].as_u64().is_some(), "{title}");
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title} has no query");
        for t in targets {
            let expr = t["expr"].as_str().expect("a query");
            assert!(!expr.is_empty() && t["refId"].is_string(), "{title}");
            queried.extend(metric_names(expr));
        }
    }
    for expr in rule_exprs() {
        queried.extend(metric_names(&expr));
    }
    queried
}

/// A member's series exist only once there is a member (the metrics test checks them).
const MEMBER_SERIES: [&str; 2] = ["muster_member_leases", "muster_member_capacity"];

/// What a cluster's follower does not export of what the kit queries: the counters and
/// histograms of the engine that serves, what describes dispatch (held-back and
/// unclaimable tasks, members), and the leader's view of the other nodes.
const LEADER_ONLY: [&str; 20] = [
    "muster_enqueued_total",
    "muster_acked_total",
    "muster_nacked_total",
    "muster_lapsed_total",
    "muster_revoked_total",
    "muster_reclaimed_total",
    "muster_dead_lettered_total",
    "muster_queue_wait_seconds",
    "muster_run_seconds",
    "muster_fsync_batch_requests",
    "muster_held_back_tasks",
    "muster_unclaimable_tasks",
    "muster_members_connected",
    "muster_members_unreachable",
    "muster_member_leases",
    "muster_member_capacity",
    "muster_cluster_node_lag",
    "muster_cluster_node_last_contact_seconds",
    "muster_cluster_voters_reachable",
    "muster_round_seconds",
];

#[test]
fn the_units_flags_start_a_daemon_whose_series_the_dashboard_and_alerts_use() {
    let dir = tempfile::tempdir().unwrap();
    let (state, etc): (PathBuf, PathBuf) = (dir.path().join("state"), dir.path().join("etc"));
    std::fs::create_dir_all(&state).unwrap();
    std::fs::create_dir_all(&etc).unwrap();
    // The layout of deploy/systemd/muster.toml: the operator's token in clear, digests
    // for the others.
    let template = deploy_file("systemd/muster.toml");
    let digest = "0123456789abcdef".repeat(4);
    let mut n = 0;
    let config: String = template
        .lines()
        .map(|l| {
            if !l.starts_with("token_sha256") {
                return format!("{l}\n");
            }
            n += 1;
            if n == 1 {
                format!("token = \"{OPS}\"\n")
            } else {
                format!("token_sha256 = \"{}{n}\"\n", &digest[1..])
            }
        })
        .collect();
    assert_eq!(n, 3, "the example configures three tokens");
    std::fs::write(etc.join("muster.toml"), config).unwrap();

    // Exactly the unit's flags: valid.
    let args = unit_args(&state, &etc);
    let out = Command::new(musterd_bin())
        .arg("--check-config")
        .args(&args)
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!(
            "musterd: configuration is valid: 3 token(s), data directory {}, listening on 0.0.0.0:7420\n",
            state.display()
        ),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success());

    // The unit's flags, on loopback ports of the system's choosing: it serves.
    let mut args = args;
    set_flag(&mut args, "--listen", "127.0.0.1:0");
    set_flag(&mut args, "--metrics-addr", "127.0.0.1:0");
    let mut child = Command::new(musterd_bin())
        .args(&args)
        .env_remove("MUSTER_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut metrics_addr = None;
    let addr;
    loop {
        let line = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("musterd logs that it serves");
        let v: serde_json::Value = serde_json::from_str(&line).expect("--log-format json");
        match v["fields"]["message"].as_str() {
            Some("serving Prometheus metrics") => {
                metrics_addr = v["fields"]["addr"].as_str().map(str::to_owned);
            }
            Some(m) if m.starts_with("musterd listening") => {
                addr = v["fields"]["addr"].as_str().expect("addr").to_owned();
                break;
            }
            _ => {}
        }
    }
    let metrics_addr = metrics_addr.expect("the metrics address was logged first");
    // A queue, so that its series exist.
    let created = Command::new(muster_bin())
        .args(["--addr", &addr, "--token", OPS, "--data"])
        .arg(&state)
        .args(["queue", "create", "jobs"])
        .output()
        .unwrap();
    assert!(created.status.success(), "{created:?}");
    let mut exported = String::new();
    for _ in 0..50 {
        exported = scrape(&metrics_addr);
        if exported.contains("muster_tasks{queue=\"jobs\"") {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let exported = metric_names(&exported);
    assert!(exported.contains("muster_fsync_seconds"), "{exported:?}");

    // Every series the dashboard and the alert rules query is exported (a member's
    // only once there is a member), but a cluster's (the cluster test checks those; a
    // single daemon exports none).
    let queried = queried();
    let missing: Vec<&String> = queried
        .iter()
        .filter(|m| !exported.contains(*m) && !MEMBER_SERIES.contains(&m.as_str()))
        .filter(|m| !m.starts_with("muster_cluster_"))
        .collect();
    assert!(missing.is_empty(), "queried but not exported: {missing:?}");
    assert!(queried.len() > 20, "{queried:?}");
    assert!(
        exported.iter().all(|m| !m.starts_with("muster_cluster_")),
        "{exported:?}"
    );

    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    assert_eq!(child.wait().unwrap().code(), Some(0));
    reader.join().unwrap();
}

/// Every series the dashboard and the alert rules query is exported by the nodes of a
/// cluster: the leader exports every one (but a member's), a follower every one but
/// [`LEADER_ONLY`], which it does not export.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_series_the_kit_queries_is_exported_by_a_clusters_nodes() {
    let cluster = Cluster::start_with(3, &["--metrics-addr", "127.0.0.1:0"]).await;
    let leader = cluster.leader().await.node;
    let follower = cluster.follower(leader, 0);
    let client = cluster.client().await;
    client
        .queue_create("jobs", muster_sdk::QueuePatch::default())
        .await
        .expect("queue_create");
    cluster.wait_caught_up(follower).await;
    let token = local_token(cluster.data(leader));
    // Gauges refresh once a second: scrape (bounded) until the queue's are there, and
    // the leader's view of the others.
    let mut views = Vec::new();
    for (id, also) in [
        (leader, "muster_cluster_voters_reachable"),
        (follower, "muster_cluster_voters"),
    ] {
        let addr = node_metrics_addr(&cluster, id);
        let mut names = BTreeSet::new();
        for _ in 0..100 {
            names = scrape_with_token(&addr, &token).names();
            if names.contains("muster_tasks") && names.contains(also) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        views.push(names);
    }
    let (at_leader, at_follower) = (&views[0], &views[1]);
    let queried = queried();
    assert!(
        queried.iter().any(|m| m.starts_with("muster_cluster_")),
        "{queried:?}"
    );
    let missing: Vec<&String> = queried
        .iter()
        .filter(|m| !at_leader.contains(*m) && !MEMBER_SERIES.contains(&m.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "queried, not exported by the leader: {missing:?}"
    );
    let missing: Vec<&String> = queried
        .iter()
        .filter(|m| !at_follower.contains(*m) && !LEADER_ONLY.contains(&m.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "queried, not exported by a follower: {missing:?}"
    );
    let exported: Vec<&&str> = LEADER_ONLY
        .iter()
        .filter(|m| at_follower.contains(**m))
        .collect();
    assert!(
        exported.is_empty(),
        "exported by a follower after all: {exported:?}"
    );
}

/// promtool (where it is installed) accepts the rules and the scrape configuration, and
/// the rules pass their unit tests (`deploy/prometheus/muster-rules.test.yml`: each
/// alert fires once where it should, for a single daemon and for a cluster).
#[test]
fn the_alert_rules_pass_promtool_and_their_unit_tests() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/prometheus");
    let checks: [&[&str]; 3] = [
        &["check", "rules", "muster-rules.yml"],
        &["check", "config", "prometheus.yml"],
        &["test", "rules", "muster-rules.test.yml"],
    ];
    for args in checks {
        let out = match Command::new("promtool")
            .args(args)
            .current_dir(&dir)
            .output()
        {
            Ok(out) => out,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                eprintln!("promtool is not installed: the rules' checks are skipped");
                return;
            }
            Err(e) => panic!("running promtool: {e}"),
        };
        assert!(
            out.status.success(),
            "promtool {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
