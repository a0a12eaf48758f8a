//! The Prometheus endpoint: every counter and histogram driven through a real daemon,
//! with exact values; every series of a queue present (zero) from its creation; every
//! node of a cluster, followers too, exporting its disk, store, fsync and queue depths.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::time::Duration;

use muster_sdk::protocol::ops::{Claim, DeadSelection, SessionOpen};
use muster_sdk::{Client, NewTask, QueuePatch};
use muster_tests::Daemon;
use muster_tests::cluster::{Cluster, NodeId};

/// A scrape: the response's content type and its series by their full name and labels.
pub(crate) struct Scrape {
    content_type: String,
    series: BTreeMap<String, f64>,
    text: String,
}

impl Scrape {
    fn get(&self, series: &str) -> Option<f64> {
        self.series.get(series).copied()
    }

    /// The metric names of the series (a histogram's under its own name).
    pub(crate) fn names(&self) -> std::collections::BTreeSet<String> {
        self.series
            .keys()
            .map(|series| {
                let name = series.split('{').next().unwrap_or(series);
                ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| name.strip_suffix(s))
                    .unwrap_or(name)
                    .to_owned()
            })
            .collect()
    }

    /// The value of `series`, which must be exported.
    #[track_caller]
    fn value(&self, series: &str) -> f64 {
        self.get(series)
            .unwrap_or_else(|| panic!("{series} in\n{}", self.text))
    }

    #[track_caller]
    fn check(&self, want: &[(String, f64)]) {
        for (series, n) in want {
            assert_eq!(self.get(series), Some(*n), "{series} in\n{}", self.text);
        }
    }
}

/// The HTTP response to `GET /metrics`, presenting `token` as a bearer token if given.
fn get_metrics(addr: &str, token: Option<&str>) -> String {
    let mut stream = std::net::TcpStream::connect(addr).expect("metrics endpoint");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let authorization = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    stream
        .write_all(
            format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n{authorization}\r\n").as_bytes(),
        )
        .expect("request");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("response");
    response
}

/// The local token of the daemon whose data directory is `data`, which a local-only
/// daemon's metrics endpoint asks for.
pub(crate) fn local_token(data: &std::path::Path) -> String {
    std::fs::read_to_string(data.join(muster_protocol::LOCAL_TOKEN_FILE))
        .expect("the local token")
        .trim()
        .to_owned()
}

pub(crate) fn scrape(addr: &str, token: &str) -> Scrape {
    let response = get_metrics(addr, Some(token));
    let (head, body) = response.split_once("\r\n\r\n").expect("HTTP head and body");
    assert!(head.starts_with("HTTP/1.0 200 OK"), "{head}");
    let content_type = head
        .lines()
        .find_map(|l| l.strip_prefix("content-type: "))
        .expect("a content type")
        .to_owned();
    let series = body
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (name, value) = l.rsplit_once(' ').expect("series and value");
            (name.to_owned(), value.parse().expect("a number"))
        })
        .collect();
    Scrape {
        content_type,
        series,
        text: body.to_owned(),
    }
}

/// Where cluster node `id` serves metrics: started with `--metrics-addr 127.0.0.1:0`, it
/// logs the address it bound before it logs that it listens.
pub(crate) fn node_metrics_addr(cluster: &Cluster, id: NodeId) -> String {
    cluster
        .log(id)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["fields"]["message"] == "serving Prometheus metrics")
        .and_then(|v| v["fields"]["addr"].as_str().map(str::to_owned))
        .unwrap_or_else(|| panic!("node {id} logged no metrics address"))
}

/// Scrapes `addr` (a node started with the cluster's shared local token in `data`)
/// until `done` holds of the scrape, for up to 10 s (gauges refresh once a second).
async fn scrape_until(
    addr: &str,
    data: &std::path::Path,
    done: impl Fn(&Scrape) -> bool,
) -> Scrape {
    let token = local_token(data);
    let mut s = scrape(addr, &token);
    for _ in 0..100 {
        if done(&s) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        s = scrape(addr, &token);
    }
    s
}

fn free_port() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    format!("127.0.0.1:{port}")
}

fn task(n: u32) -> NewTask {
    NewTask::new(muster_sdk::json(&n).expect("a JSON number"))
}

fn session(member: &str, reclaim: bool) -> SessionOpen {
    SessionOpen {
        member: member.into(),
        labels: vec![],
        capacity: 2,
        reclaim,
        resume: false,
        held: None,
        liveness_ms: None,
    }
}

/// `name{queue="q"}` and `name{queue="q",extra}`.
fn q(name: &str, queue: &str, extra: &str, n: f64) -> (String, f64) {
    let sep = if extra.is_empty() { "" } else { "," };
    (format!(r#"{name}{{queue="{queue}"{sep}{extra}}}"#), n)
}

/// Every queue series with its value, given the counters that moved and the
/// histograms' counts (everything else zero).
fn queue_series(
    queue: &str,
    counters: &[(&str, f64)],
    runs: &[(&str, f64)],
    waits: f64,
) -> Vec<(String, f64)> {
    let mut want = Vec::new();
    for name in [
        "enqueued",
        "leased",
        "acked",
        "nacked",
        "released",
        "lapsed",
        "revoked",
        "reclaimed",
        "redelivered",
        "cancelled",
        "redriven",
        "discarded",
        "purged",
    ] {
        let n = counters
            .iter()
            .find(|(c, _)| *c == name)
            .map_or(0.0, |c| c.1);
        want.push(q(&format!("muster_{name}_total"), queue, "", n));
    }
    for reason in ["max_attempts", "dead_lettered"] {
        let n = counters
            .iter()
            .find(|(c, _)| *c == format!("dead:{reason}"))
            .map_or(0.0, |c| c.1);
        let label = format!(r#"reason="{reason}""#);
        want.push(q("muster_dead_lettered_total", queue, &label, n));
    }
    for outcome in [
        "acked",
        "nacked",
        "released",
        "dead_lettered",
        "lapsed",
        "revoked",
        "reclaimed",
        "redelivered",
        "cancelled",
    ] {
        let n = runs
            .iter()
            .find(|(o, _)| *o == outcome)
            .map_or(0.0, |r| r.1);
        let label = format!(r#"outcome="{outcome}""#);
        want.push(q("muster_run_seconds_count", queue, &label, n));
        // Every run of this test is shorter than a minute.
        let bucket = format!(r#"outcome="{outcome}",le="60""#);
        want.push(q("muster_run_seconds_bucket", queue, &bucket, n));
    }
    want.push(q("muster_queue_wait_seconds_count", queue, "", waits));
    want.push(q(
        "muster_queue_wait_seconds_bucket",
        queue,
        r#"le="60""#,
        waits,
    ));
    want
}

async fn ids(client: &Client, queue: &str, n: u32) -> Vec<(String, u64)> {
    let got = client
        .claim(&Claim::new([queue]).max(n))
        .await
        .expect("claim");
    assert_eq!(got.len(), n as usize);
    got.into_iter().map(|d| (d.id, d.epoch)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_counter_and_histogram_counts_exactly_what_happened() {
    let metrics_addr = free_port();
    let d = Daemon::start_with(&["--metrics-addr", &metrics_addr]);
    let token = local_token(d.data());
    let client = d.client().await;
    for queue in ["jobs", "idle", "gpu"] {
        client
            .queue_create(queue, QueuePatch::default())
            .await
            .unwrap();
    }
    let short = QueuePatch {
        lease_ms: Some(200),
        max_attempts: Some(1),
        ..QueuePatch::default()
    };
    client.queue_create("short", short).await.unwrap();

    // jobs: six tasks through every way a lease ends.
    let mut t = Vec::new();
    for n in 0..6 {
        t.push(client.enqueue("jobs", task(n)).await.unwrap().id);
    }
    let two = ids(&client, "jobs", 2).await;
    assert_eq!(
        (two[0].0.as_str(), two[1].0.as_str()),
        (t[0].as_str(), t[1].as_str())
    );
    client.ack(&two[0].0, two[0].1, None).await.unwrap();
    client
        .nack(&two[1].0, two[1].1, Some(3_600_000), None)
        .await
        .unwrap();
    let one = ids(&client, "jobs", 1).await;
    assert_eq!(one[0].0, t[2]);
    client.release(&one[0].0, one[0].1).await.unwrap();
    // Its second lease: not a first wait.
    let one = ids(&client, "jobs", 1).await;
    assert_eq!(one[0].0, t[2]);
    client
        .dead_letter(&one[0].0, one[0].1, "unsupported")
        .await
        .unwrap();
    let one = ids(&client, "jobs", 1).await;
    assert_eq!(one[0].0, t[3]);
    client.lease_revoke(&t[3]).await.unwrap();
    client.cancel(&t[4]).await.unwrap();
    // A member takes t[3] again; its agent restarts and reclaims it, then acks it.
    let agent = d.client().await;
    let _first = agent.open_session(&session("m1", false)).await.unwrap();
    let held = agent
        .claim(&Claim::new(["jobs"]).member("m1"))
        .await
        .unwrap();
    assert_eq!(held[0].id, t[3]);
    let restarted = d.client().await;
    let (reply, _pushes) = restarted.open_session(&session("m1", true)).await.unwrap();
    assert_eq!(reply.reclaimed.len(), 1);
    let back = &reply.reclaimed[0];
    restarted.ack(&back.id, back.epoch, None).await.unwrap();
    let all = |queue: &str| DeadSelection {
        queue: queue.into(),
        ids: vec![],
        all: true,
        dry_run: false,
    };
    assert_eq!(client.redrive(all("jobs")).await.unwrap().count, 1);
    // The nacked (scheduled), the redriven and the never-leased task.
    assert_eq!(client.queue_purge("jobs").await.unwrap(), 3);

    // short: a lease that lapses on its one attempt, then discarded.
    let lapsing = client.enqueue("short", task(0)).await.unwrap().id;
    ids(&client, "short", 1).await;
    let mut dead = false;
    for _ in 0..100 {
        if client.task_get(&lapsing).await.unwrap().state == muster_sdk::TaskState::Dead {
            dead = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(dead, "the lease lapsed and the task died");
    assert_eq!(client.discard(all("short")).await.unwrap().count, 1);

    // gpu: a task no connected member can take, and a key line with one held back.
    let mut gpu = task(0);
    gpu.requires = vec!["gpu".into()];
    client.enqueue("gpu", gpu).await.unwrap();
    for n in 1..=2 {
        let mut keyed = task(n);
        keyed.key = Some("k".into());
        client.enqueue("gpu", keyed).await.unwrap();
    }
    ids(&client, "gpu", 1).await;

    let gauges = [
        q("muster_tasks", "jobs", r#"state="done""#, 2.0),
        q("muster_tasks", "jobs", r#"state="cancelled""#, 1.0),
        q("muster_tasks", "jobs", r#"state="ready""#, 0.0),
        q("muster_tasks", "short", r#"state="dead""#, 0.0),
        q("muster_tasks", "gpu", r#"state="ready""#, 2.0),
        q("muster_tasks", "gpu", r#"state="leased""#, 1.0),
        q("muster_tasks", "idle", r#"state="ready""#, 0.0),
        q("muster_leases_in_flight", "gpu", "", 1.0),
        q("muster_leases_in_flight", "jobs", "", 0.0),
        q("muster_held_back_tasks", "gpu", "", 1.0),
        q("muster_unclaimable_tasks", "gpu", "", 1.0),
        q("muster_unclaimable_tasks", "idle", "", 0.0),
        q("muster_oldest_ready_age_seconds", "idle", "", 0.0),
        ("muster_members_connected".into(), 1.0),
        ("muster_members_unreachable".into(), 0.0),
        (r#"muster_member_leases{member="m1"}"#.into(), 0.0),
        (r#"muster_member_capacity{member="m1"}"#.into(), 2.0),
    ];
    // Gauges refresh once a second: poll (bounded) until they caught up.
    let mut s = scrape(&metrics_addr, &token);
    for _ in 0..50 {
        if gauges.iter().all(|(series, n)| s.get(series) == Some(*n)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        s = scrape(&metrics_addr, &token);
    }
    assert_eq!(s.content_type, "text/plain; version=0.0.4; charset=utf-8");
    s.check(&gauges);
    s.check(&queue_series(
        "jobs",
        &[
            ("enqueued", 6.0),
            ("leased", 6.0),
            ("acked", 2.0),
            ("nacked", 1.0),
            ("released", 1.0),
            ("revoked", 1.0),
            ("reclaimed", 1.0),
            ("cancelled", 1.0),
            ("dead:dead_lettered", 1.0),
            ("redriven", 1.0),
            ("purged", 3.0),
        ],
        &[
            ("acked", 2.0),
            ("nacked", 1.0),
            ("released", 1.0),
            ("dead_lettered", 1.0),
            ("revoked", 1.0),
            ("reclaimed", 1.0),
        ],
        4.0,
    ));
    s.check(&queue_series(
        "short",
        &[
            ("enqueued", 1.0),
            ("leased", 1.0),
            ("lapsed", 1.0),
            ("dead:max_attempts", 1.0),
            ("discarded", 1.0),
        ],
        &[("lapsed", 1.0)],
        1.0,
    ));
    s.check(&queue_series("idle", &[], &[], 0.0));
    s.check(&queue_series(
        "gpu",
        &[("enqueued", 3.0), ("leased", 1.0)],
        &[],
        1.0,
    ));

    let build = format!(
        r#"muster_build_info{{version="{}",commit="{}"}}"#,
        env!("CARGO_PKG_VERSION"),
        String::from_utf8(
            std::process::Command::new(muster_tests::muster_bin())
                .arg("--version")
                .output()
                .expect("muster --version")
                .stdout
        )
        .expect("utf-8")
        .trim()
        .rsplit_once("(commit ")
        .and_then(|(_, c)| c.strip_suffix(')'))
        .expect("muster --version names its commit")
    );
    assert_eq!(s.get(&build), Some(1.0), "{build} in\n{}", s.text);
    for series in [
        "muster_store_size_bytes",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_threads",
        "muster_fsync_seconds_count",
        "muster_fsync_batch_requests_count",
        "muster_round_seconds_count",
    ] {
        let v = s
            .get(series)
            .unwrap_or_else(|| panic!("{series} in\n{}", s.text));
        assert!(v > 0.0, "{series} = {v}");
    }
    assert!(s.get("process_cpu_seconds_total").is_some(), "{}", s.text);
}

/// A cluster node exports its role, term and log positions; a lone node leads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_node_exports_its_role_term_and_log() {
    let metrics_addr = free_port();
    let cluster =
        muster_tests::cluster::Cluster::start_with(1, &["--metrics-addr", &metrics_addr]).await;
    let client = cluster.client().await;
    client
        .queue_create("q", QueuePatch::default())
        .await
        .expect("queue_create");
    client.enqueue("q", task(1)).await.expect("enqueue");
    let leader = cluster.leader().await;
    let applied = cluster.status(leader.node).await.applied;
    let token = local_token(cluster.data(leader.node));
    // Gauges refresh once a second: scrape until they show the enqueue.
    let mut s = scrape(&metrics_addr, &token);
    for _ in 0..50 {
        if s.get("muster_cluster_last_applied_index") >= Some(applied as f64) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        s = scrape(&metrics_addr, &token);
    }
    s.check(&[
        ("muster_cluster_leader".into(), 1.0),
        ("muster_cluster_term".into(), leader.term as f64),
        ("muster_cluster_last_log_index".into(), applied as f64),
        ("muster_cluster_last_applied_index".into(), applied as f64),
        ("muster_cluster_snapshot_index".into(), 0.0),
    ]);
}

/// Every node of a cluster exports the same disk, store and fsync series as a single
/// daemon, and a follower the queue depths it applied: exactly the leader's once it
/// caught up. Dispatch (held-back and unclaimable tasks, members) and the counters are
/// the serving leader's alone, as is its view of the others, which shows a killed
/// follower unreachable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_cluster_node_exports_its_disk_store_fsync_and_queue_depths() {
    let started = std::time::Instant::now();
    let cluster = Cluster::start_with(3, &["--metrics-addr", "127.0.0.1:0"]).await;
    let leader = cluster.leader().await;
    let (follower, other) = (
        cluster.follower(leader.node, 0),
        cluster.follower(leader.node, 1),
    );
    assert_ne!(follower, other);
    let client = cluster.client().await;
    for queue in ["jobs", "idle"] {
        client
            .queue_create(queue, QueuePatch::default())
            .await
            .expect("queue_create");
    }
    for n in 0..5 {
        client.enqueue("jobs", task(n)).await.expect("enqueue");
    }
    let leased = ids(&client, "jobs", 2).await;
    client
        .ack(&leased[0].0, leased[0].1, None)
        .await
        .expect("ack");
    cluster.wait_caught_up(follower).await;
    let applied = cluster.status(leader.node).await.applied as f64;

    // jobs: 3 ready, 1 leased, 1 done; idle: empty. On every node alike.
    let mut depths = Vec::new();
    for (state, n) in [
        ("scheduled", 0.0),
        ("ready", 3.0),
        ("leased", 1.0),
        ("done", 1.0),
        ("dead", 0.0),
        ("cancelled", 0.0),
    ] {
        let label = format!(r#"state="{state}""#);
        depths.push(q("muster_tasks", "jobs", &label, n));
        depths.push(q("muster_tasks", "idle", &label, 0.0));
    }
    depths.push(q("muster_leases_in_flight", "jobs", "", 1.0));
    depths.push(q("muster_leases_in_flight", "idle", "", 0.0));
    depths.push(q("muster_oldest_ready_age_seconds", "idle", "", 0.0));
    depths.push(("muster_disk_alarm".into(), 0.0));
    depths.push(("muster_cluster_voters".into(), 3.0));

    let mut follower_view = depths.clone();
    follower_view.extend([
        ("muster_cluster_leader".into(), 0.0),
        ("muster_cluster_term".into(), leader.term as f64),
        ("muster_cluster_last_applied_index".into(), applied),
    ]);
    let f = scrape_until(
        &node_metrics_addr(&cluster, follower),
        cluster.data(follower),
        |s| {
            follower_view
                .iter()
                .all(|(series, n)| s.get(series) == Some(*n))
        },
    )
    .await;
    f.check(&follower_view);

    let others = |id: NodeId| format!(r#"{{node="{id}"}}"#);
    let mut leader_view = depths;
    leader_view.extend([
        ("muster_cluster_leader".into(), 1.0),
        ("muster_cluster_term".into(), leader.term as f64),
        ("muster_cluster_last_applied_index".into(), applied),
        (format!("muster_cluster_node_lag{}", others(follower)), 0.0),
        ("muster_cluster_voters_reachable".into(), 3.0),
        q("muster_held_back_tasks", "jobs", "", 0.0),
        q("muster_unclaimable_tasks", "jobs", "", 0.0),
        ("muster_members_connected".into(), 0.0),
    ]);
    let leader_addr = node_metrics_addr(&cluster, leader.node);
    let l = scrape_until(&leader_addr, cluster.data(leader.node), |s| {
        leader_view
            .iter()
            .all(|(series, n)| s.get(series) == Some(*n))
    })
    .await;
    l.check(&leader_view);

    for s in [&f, &l] {
        // The oldest ready task was enqueued during this test.
        let age = s.value(r#"muster_oldest_ready_age_seconds{queue="jobs"}"#);
        assert!(
            age > 0.0 && age <= started.elapsed().as_secs_f64(),
            "oldest ready age {age}"
        );
        for series in ["muster_store_size_bytes", "muster_disk_free_bytes"] {
            assert!(s.value(series) > 0.0, "{series} in\n{}", s.text);
        }
        // Every append to the raft log is an fsync, timed.
        let fsyncs = s.value("muster_fsync_seconds_count");
        assert!(fsyncs >= 1.0, "{}", s.text);
        assert_eq!(
            s.get(r#"muster_fsync_seconds_bucket{le="+Inf"}"#),
            Some(fsyncs)
        );
    }
    // The leader's rounds: 2 queues, 5 enqueues, a claim and an ack, each agreed on.
    assert!(
        l.value("muster_fsync_batch_requests_count") >= 9.0,
        "{}",
        l.text
    );
    for id in [follower, other] {
        let contact = l.value(&format!(
            "muster_cluster_node_last_contact_seconds{}",
            others(id)
        ));
        assert!((0.0..5.0).contains(&contact), "node {id}: {contact}");
    }
    // What describes dispatch, the counters and the view of the others: not on a
    // follower (so the alerts on them fire for the leader alone).
    let names = f.names();
    for leader_only in [
        "muster_held_back_tasks",
        "muster_unclaimable_tasks",
        "muster_members_connected",
        "muster_members_unreachable",
        "muster_enqueued_total",
        "muster_fsync_batch_requests",
        "muster_cluster_node_lag",
        "muster_cluster_node_last_contact_seconds",
        "muster_cluster_voters_reachable",
    ] {
        assert!(!names.contains(leader_only), "{leader_only} in\n{}", f.text);
    }

    // A voter killed: the leader reaches two of three, and has not heard from it since.
    let mut cluster = cluster;
    cluster.kill9(other);
    let killed = std::time::Instant::now();
    let contact = format!("muster_cluster_node_last_contact_seconds{}", others(other));
    let l = scrape_until(&leader_addr, cluster.data(leader.node), |s| {
        s.get("muster_cluster_voters_reachable") == Some(2.0)
    })
    .await;
    assert_eq!(
        l.get("muster_cluster_voters_reachable"),
        Some(2.0),
        "{}",
        l.text
    );
    let silent = l.value(&contact);
    assert!(
        silent >= 1.0 && silent <= killed.elapsed().as_secs_f64() + 1.0,
        "node {other} silent for {silent} s"
    );
}

/// A local-only daemon's metrics (queue names and counts) are for its own user: a
/// scrape without its local token, or with another, gets 401 and nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_only_daemons_metrics_need_its_local_token() {
    let metrics_addr = free_port();
    let d = Daemon::start_with(&["--metrics-addr", &metrics_addr]);
    d.client()
        .await
        .queue_create("secret-queue", QueuePatch::default())
        .await
        .expect("queue_create");
    for token in [None, Some("0".repeat(64).as_str())] {
        let response = get_metrics(&metrics_addr, token);
        let (head, body) = response.split_once("\r\n\r\n").expect("HTTP head and body");
        assert!(head.starts_with("HTTP/1.0 401 Unauthorized"), "{head}");
        assert!(
            head.lines()
                .any(|l| l == r#"www-authenticate: Bearer realm="musterd metrics""#),
            "{head}"
        );
        assert_eq!(body, "");
    }
    let s = scrape(&metrics_addr, &local_token(d.data()));
    assert!(s.text.contains("secret-queue"), "{}", s.text);
}

/// With --metrics-token-file, scrapes present that token instead; a token file others
/// can write is refused at start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_ask_for_the_token_file_they_are_given() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("a directory");
    let file = dir.path().join("metrics.token");
    std::fs::write(&file, "scrape-token-0123456789\n").expect("the token file");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let metrics_addr = free_port();
    let d = Daemon::start_with(&[
        "--metrics-addr",
        &metrics_addr,
        "--metrics-token-file",
        file.to_str().expect("utf-8"),
    ]);
    let refused = get_metrics(&metrics_addr, Some(&local_token(d.data())));
    assert!(
        refused.starts_with("HTTP/1.0 401 Unauthorized"),
        "{refused}"
    );
    // Served (`scrape` asserts the 200) with the metrics rendered.
    let s = scrape(&metrics_addr, "scrape-token-0123456789");
    assert!(!s.series.is_empty(), "{}", s.text);
    drop(d);

    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let data = tempfile::tempdir().expect("a data directory");
    let out = std::process::Command::new(muster_tests::musterd_bin())
        .args([
            "--data",
            data.path().to_str().expect("utf-8"),
            "--listen",
            "127.0.0.1:0",
        ])
        .args([
            "--metrics-addr",
            &free_port(),
            "--metrics-token-file",
            file.to_str().expect("utf-8"),
        ])
        .output()
        .expect("running musterd");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "token file {} is writable by other users (mode 666): chmod go-w it",
            file.display()
        )),
        "{stderr}"
    );
}

/// A limit's series, and its busiest keys' (ten of twelve keys in use): exactly what
/// `limit_get` says, a throttle counted, and no series for the keys beyond ten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_limit_and_its_ten_busiest_keys_have_their_series() {
    use muster_sdk::protocol::model::{LimitSpec, LimitUse, Rate};
    let metrics_addr = free_port();
    let d = Daemon::start_with(&["--metrics-addr", &metrics_addr]);
    let client = d.client().await;
    client
        .queue_create("q", QueuePatch::default())
        .await
        .unwrap();
    let api = LimitSpec {
        concurrency: Some(2),
        ..LimitSpec::default()
    };
    client.limit_set("api", api).await.unwrap();
    // One token an hour and an empty bucket: every task of `per` waits.
    let per = LimitSpec {
        rate: Some(Rate {
            count: 1,
            per_ms: 3_600_000,
        }),
        per_key: true,
        ..LimitSpec::default()
    };
    client.limit_set("per", per).await.unwrap();
    let task = |limit: &str, key: Option<String>| NewTask {
        limits: vec![LimitUse {
            limit: limit.into(),
            key,
            cost: None,
        }],
        ..NewTask::new(muster_sdk::json(&1).unwrap())
    };
    let api_tasks: Vec<NewTask> = (0..3).map(|_| task("api", None)).collect();
    client.enqueue_batch("q", api_tasks).await.unwrap();
    let per_tasks: Vec<NewTask> = (0..12)
        .map(|k| task("per", Some(format!("k{k}"))))
        .collect();
    client.enqueue_batch("q", per_tasks).await.unwrap();
    let got = client
        .claim(&Claim::new(["q"]).max(10).member("m"))
        .await
        .unwrap();
    assert_eq!(
        got.len(),
        2,
        "two leases fit api's concurrency, per has no token"
    );
    client
        .throttled(&got[0].id, got[0].epoch, Some(60_000), Some("api".into()))
        .await
        .unwrap();

    let s = scrape_until(&metrics_addr, d.data(), |s| {
        s.get(r#"muster_limit_throttled_total{limit="api"}"#) == Some(1.0)
            && s.get(r#"muster_limit_waiting{limit="per"}"#) == Some(12.0)
    })
    .await;
    let key =
        |name: &str, limit: &str, key: &str| format!(r#"{name}{{limit="{limit}",key="{key}"}}"#);
    s.check(&[
        (r#"muster_limit_held{limit="api"}"#.into(), 1.0),
        // The throttled task waits out its throttle in api's line, with the third.
        (r#"muster_limit_waiting{limit="api"}"#.into(), 2.0),
        (r#"muster_limit_granted_total{limit="api"}"#.into(), 2.0),
        (r#"muster_limit_throttled_total{limit="api"}"#.into(), 1.0),
        (r#"muster_limit_keys_in_use{limit="api"}"#.into(), 1.0),
        (key("muster_limit_key_held", "api", ""), 1.0),
        (key("muster_limit_key_waiting", "api", ""), 2.0),
        (r#"muster_limit_held{limit="per"}"#.into(), 0.0),
        (r#"muster_limit_waiting{limit="per"}"#.into(), 12.0),
        (r#"muster_limit_keys_in_use{limit="per"}"#.into(), 12.0),
        (r#"muster_limit_granted_total{limit="per"}"#.into(), 0.0),
        (key("muster_limit_key_tokens", "per", "k0"), 0.0),
        (key("muster_limit_key_waiting", "per", "k0"), 1.0),
    ]);
    let per_keys = s
        .series
        .keys()
        .filter(|k| k.starts_with(r#"muster_limit_key_waiting{limit="per""#))
        .count();
    assert_eq!(per_keys, 10, "the ten busiest keys only\n{}", s.text);
    assert!(
        !s.series
            .keys()
            .any(|k| k.starts_with("muster_limit_key_tokens{limit=\"api\"")),
        "a limit without a rate has no tokens\n{}",
        s.text
    );
}

/// A schedule's series say what its record says: fires, runs, missed and failed fires
/// (a fire into a deleted queue), its next fire (0 while paused), and how many
/// schedules there are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_schedule_exports_its_own_counts_and_next_fire() {
    use muster_sdk::protocol::ops::ScheduleSet;
    let metrics_addr = free_port();
    let d = Daemon::start_with(&["--metrics-addr", &metrics_addr]);
    let client = d.client().await;
    for queue in ["ticks", "doomed"] {
        client
            .queue_create(queue, QueuePatch::default())
            .await
            .expect("queue_create");
    }
    let every_second = |name: &str, queue: &str| ScheduleSet {
        name: name.into(),
        cron: "* * * * * *".into(),
        tz: None,
        queue: queue.into(),
        task: NewTask::new(muster_sdk::json(&1).expect("json")),
        catch_up: None,
        paused: None,
    };
    client
        .schedule_set(&every_second("tick", "ticks"))
        .await
        .expect("schedule_set");
    client
        .schedule_set(&every_second("orphan", "doomed"))
        .await
        .expect("schedule_set");
    client.queue_delete("doomed").await.expect("queue_delete");
    muster_tests::until(
        Duration::from_secs(20),
        "fires and a failed fire",
        || async {
            let tick = client.schedule_get("tick").await.expect("schedule_get");
            let orphan = client.schedule_get("orphan").await.expect("schedule_get");
            tick.fires >= 2 && orphan.failures >= 1
        },
    )
    .await;
    client.schedule_pause("tick").await.expect("pause");
    client.schedule_pause("orphan").await.expect("pause");
    client.schedule_run("tick").await.expect("run");
    let tick = client.schedule_get("tick").await.expect("schedule_get");
    let orphan = client.schedule_get("orphan").await.expect("schedule_get");
    assert_eq!(orphan.fires, 0);
    assert!(
        orphan
            .last_error
            .as_deref()
            .is_some_and(|e| e.starts_with("not_found")),
        "{:?}",
        orphan.last_error
    );
    let want = vec![
        (
            r#"muster_schedule_fires_total{schedule="tick"}"#.to_owned(),
            tick.fires as f64,
        ),
        (
            r#"muster_schedule_runs_total{schedule="tick"}"#.to_owned(),
            1.0,
        ),
        (
            r#"muster_schedule_missed_total{schedule="tick"}"#.to_owned(),
            0.0,
        ),
        (
            r#"muster_schedule_failures_total{schedule="tick"}"#.to_owned(),
            0.0,
        ),
        (
            r#"muster_schedule_fires_total{schedule="orphan"}"#.to_owned(),
            0.0,
        ),
        (
            r#"muster_schedule_failures_total{schedule="orphan"}"#.to_owned(),
            orphan.failures as f64,
        ),
        (
            r#"muster_schedule_next_fire_timestamp_seconds{schedule="tick"}"#.to_owned(),
            0.0,
        ),
        ("muster_schedules".to_owned(), 2.0),
    ];
    let s = scrape_until(&metrics_addr, d.data(), |s| {
        want.iter().all(|(series, n)| s.get(series) == Some(*n))
    })
    .await;
    s.check(&want);
}
