//! The daemon's log tells the story: a member's life, lapses, dead letters and every
//! operator action at INFO, in JSON lines with unique keys and no build paths.

use std::time::Duration;

use muster_sdk::protocol::ops::{Claim, DeadSelection, SessionOpen};
use muster_sdk::{Client, NewTask, QueuePatch, TaskState};
use muster_tests::Daemon;
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

const OPS: &str = "ops-token-0123456789abcdef";
const PRODUCER: &str = "producer-token-0123456789";
const AGENT: &str = "agent-token-0123456789abc";

fn config() -> String {
    format!(
        r#"
[[tokens]]
name = "ops"
token = "{OPS}"
roles = ["admin"]

[[tokens]]
name = "ci-producer"
token = "{PRODUCER}"
roles = ["produce"]

[[tokens]]
name = "gpu-agents"
token = "{AGENT}"
roles = ["consume"]
"#
    )
}

/// A JSON value that refuses an object with a key twice (serde_json keeps the last).
struct UniqueKeys;

impl<'de> Deserialize<'de> for UniqueKeys {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(UniqueKeysVisitor)
    }
}

struct UniqueKeysVisitor;

impl<'de> Visitor<'de> for UniqueKeysVisitor {
    type Value = UniqueKeys;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JSON")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<UniqueKeys, A::Error> {
        let mut keys = std::collections::HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if !keys.insert(key.clone()) {
                return Err(serde::de::Error::custom(format!("duplicate key {key:?}")));
            }
            map.next_value::<UniqueKeys>()?;
        }
        Ok(UniqueKeys)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<UniqueKeys, A::Error> {
        while seq.next_element::<UniqueKeys>()?.is_some() {}
        Ok(UniqueKeys)
    }

    fn visit_bool<E>(self, _: bool) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }
    fn visit_i64<E>(self, _: i64) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }
    fn visit_u64<E>(self, _: u64) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }
    fn visit_f64<E>(self, _: f64) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }
    fn visit_str<E>(self, _: &str) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }
    fn visit_unit<E>(self) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }
}

/// The story lines of the log: a member's life, lapses, dead letters and operator
/// actions, each as its message and the fields that tell it.
fn story(log: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in log.lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("a JSON log line");
        let f = &v["fields"];
        let s = |k: &str| match &f[k] {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let told = match f["message"].as_str().unwrap_or_default() {
            "member connected" => format!(
                "connected {} reclaimed={} released={}",
                s("member"),
                s("reclaimed"),
                s("released")
            ),
            "member gone" => format!("gone {} leases={}", s("member"), s("leases")),
            "member replaced by a newer session" => format!("replaced {}", s("member")),
            "member unreachable" => format!("unreachable {}", s("member")),
            "lease lapsed" => format!(
                "lapsed {} member={:?} epoch={}",
                s("task"),
                s("member"),
                s("epoch")
            ),
            "task dead-lettered" => format!("dead {} {} {}", s("task"), s("queue"), s("reason")),
            "operator action" => format!(
                "{} {} {} tasks={}",
                s("principal"),
                s("op"),
                s("target"),
                s("tasks")
            ),
            _ => continue,
        };
        assert_eq!(v["level"], "INFO", "{line}");
        out.push(told);
    }
    out
}

fn session(reclaim: bool) -> SessionOpen {
    SessionOpen {
        member: "w1".into(),
        labels: vec![],
        capacity: 2,
        reclaim,
        resume: false,
        held: None,
        liveness_ms: None,
    }
}

fn all(queue: &str) -> DeadSelection {
    DeadSelection {
        queue: queue.into(),
        ids: vec![],
        all: true,
        dry_run: false,
    }
}

async fn until_dead(client: &Client, id: &str) {
    for _ in 0..100 {
        if client.task_get(id).await.expect("task get").state == TaskState::Dead {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("task {id} did not die");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn info_lines_tell_a_members_life_and_every_operator_action() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("muster.toml");
    std::fs::write(&path, config()).unwrap();
    let d = Daemon::start_logging("debug", &["--config", path.to_str().unwrap()]);
    let ops = d.client_as(OPS).await;
    let producer = d.client_as(PRODUCER).await;
    ops.queue_create("jobs", QueuePatch::default())
        .await
        .unwrap();
    let short = QueuePatch {
        lease_ms: Some(200),
        max_attempts: Some(1),
        ..QueuePatch::default()
    };
    ops.queue_create("short", short).await.unwrap();
    let mut t = Vec::new();
    for n in 0..4 {
        let task = NewTask::new(muster_sdk::json(&n).unwrap());
        t.push(producer.enqueue("jobs", task).await.unwrap().id);
    }
    let s0 = producer
        .enqueue("short", NewTask::new(muster_sdk::json(&0).unwrap()))
        .await
        .unwrap()
        .id;

    // A member's life: connected, holding two, gone, back reclaiming them, replaced.
    let a = d.client_as(AGENT).await;
    let _a_session = a.open_session(&session(false)).await.unwrap();
    let held = a
        .claim(&Claim::new(["jobs"]).member("w1").max(2))
        .await
        .unwrap();
    assert_eq!(held.len(), 2);
    a.close().await;
    let mut gone = false;
    for _ in 0..100 {
        let members = ops.member_list().await.unwrap();
        if members.iter().all(|m| !m.connected) {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(gone, "the daemon saw the member's connection close");
    let b = d.client_as(AGENT).await;
    let (reply, _b_pushes) = b.open_session(&session(true)).await.unwrap();
    assert_eq!(reply.reclaimed.len(), 2);
    let c = d.client_as(AGENT).await;
    let (reply, _c_pushes) = c.open_session(&session(false)).await.unwrap();
    assert_eq!(reply.released, 2);
    let one = c.claim(&Claim::new(["jobs"]).member("w1")).await.unwrap();
    assert_eq!(one[0].id, t[0]);
    c.dead_letter(&one[0].id, one[0].epoch, "bad input")
        .await
        .unwrap();

    // A lease that lapses on its one attempt.
    let lapsing = ops.claim(&Claim::new(["short"])).await.unwrap();
    assert_eq!(lapsing[0].id, s0);
    until_dead(&ops, &s0).await;

    // Operator actions.
    ops.cancel(&t[3]).await.unwrap();
    let one = c.claim(&Claim::new(["jobs"]).member("w1")).await.unwrap();
    assert_eq!(one[0].id, t[1]);
    ops.lease_revoke(&t[1]).await.unwrap();
    ops.member_drain("w1").await.unwrap();
    assert_eq!(ops.redrive(all("jobs")).await.unwrap().count, 1);
    assert_eq!(ops.discard(all("short")).await.unwrap().count, 1);
    let refused = ops.queue_purge("nope").await.unwrap_err();
    assert_eq!(refused.code(), Some(muster_sdk::ErrorCode::NotFound));
    assert_eq!(ops.queue_purge("jobs").await.unwrap(), 3);
    assert_eq!(ops.queue_delete("jobs").await.unwrap(), 1);
    // Limits are operator actions too; reading one is not.
    let spec = muster_sdk::protocol::model::LimitSpec {
        concurrency: Some(2),
        ..Default::default()
    };
    ops.limit_set("openai", spec).await.unwrap();
    ops.limit_get("openai").await.unwrap();
    assert_eq!(ops.limit_delete("openai").await.unwrap(), 0);

    let last = "ops limit_delete openai tasks=0";
    let mut log = String::new();
    for _ in 0..100 {
        log = d.log();
        if story(&log).iter().any(|l| l == last) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let want = [
        "ops queue_create jobs tasks=0".to_owned(),
        "ops queue_create short tasks=0".to_owned(),
        "connected w1 reclaimed=0 released=0".to_owned(),
        "gone w1 leases=2".to_owned(),
        "connected w1 reclaimed=2 released=0".to_owned(),
        "replaced w1".to_owned(),
        "connected w1 reclaimed=0 released=2".to_owned(),
        format!("dead {} jobs dead_lettered", t[0]),
        format!("lapsed {s0} member=\"\" epoch=1"),
        format!("dead {s0} short max_attempts"),
        format!("ops cancel {} tasks=1", t[3]),
        format!("ops lease_revoke {} tasks=1", t[1]),
        "ops member_drain w1 tasks=0".to_owned(),
        "ops redrive jobs tasks=1".to_owned(),
        "ops discard short tasks=1".to_owned(),
        "ops queue_purge jobs tasks=3".to_owned(),
        "ops queue_delete jobs tasks=1".to_owned(),
        "ops limit_set openai tasks=0".to_owned(),
        last.to_owned(),
    ];
    assert_eq!(story(&log), want, "log:\n{log}");

    // Every line is JSON with unique keys, without colour or the paths of a build.
    for line in log.lines() {
        serde_json::from_str::<UniqueKeys>(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(!line.contains('\u{1b}'), "colour in {line}");
        assert!(
            !line.contains(".cargo/registry") && !line.contains("\"log.file\""),
            "{line}"
        );
    }
    // The refused purge is one DEBUG line, not also an `applied` one.
    let purge_lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(r#""op":"queue_purge""#) && l.contains(r#""message":"#))
        .filter(|l| l.contains(r#""message":"refused""#) || l.contains(r#""message":"applied""#))
        .collect();
    assert_eq!(purge_lines.len(), 2, "{purge_lines:#?}");
    assert!(
        purge_lines[0].contains(r#""message":"refused""#)
            && purge_lines[0].contains(r#""level":"DEBUG""#)
    );
    assert!(
        purge_lines[0].contains(r#""error":"no queue \"nope\"""#),
        "{}",
        purge_lines[0]
    );
    assert!(purge_lines[1].contains(r#""message":"applied""#));
}

/// The leader's log lines after its first `skip`, parsed.
fn lines_after(log: &str, skip: usize) -> Vec<serde_json::Value> {
    log.lines()
        .skip(skip)
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// The lines saying `message` of cluster node `node`.
fn about_node<'a>(
    lines: &'a [serde_json::Value],
    message: &'a str,
    node: u64,
) -> impl Iterator<Item = &'a serde_json::Value> {
    lines
        .iter()
        .filter(move |v| v["fields"]["message"] == message && v["fields"]["node"] == node)
}

/// The WARN and ERROR lines.
fn alarming(lines: &[serde_json::Value]) -> Vec<&serde_json::Value> {
    lines
        .iter()
        .filter(|v| v["level"] == "WARN" || v["level"] == "ERROR")
        .collect()
}

const UNREACHABLE: &str =
    "cluster node unreachable: its RPCs are retried without further lines until it answers";
const REACHABLE: &str = "cluster node reachable again";

/// Most WARN and ERROR lines the leader may log while a follower is down and after it
/// is back: the one `cluster node unreachable` line. The leader keeps its majority, so
/// nothing else is worth a warning; openraft's own line per failed heartbeat and per
/// retry (29 lines in the first 3 s before they were filtered, about 10 a second
/// after) must not come back.
const MOST_ALARMS: usize = 1;

/// A follower killed: its leader logs it unreachable once at WARN, not at every retry
/// of openraft's, and nothing else at WARN or ERROR; back, it logs it reachable again
/// once at INFO.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_node_is_logged_once_not_at_every_retry() {
    let mut cluster = muster_tests::cluster::Cluster::start(3).await;
    let leader = cluster.leader().await.node;
    let dead = cluster.follower(leader, 0);
    let before = cluster.log(leader).lines().count();
    cluster.kill9(dead);
    let killed = std::time::Instant::now();
    // Until the leader says so (within a second and a half or so: a second of failed
    // RPCs), and at least 3 s in all, in which openraft would have retried some 6
    // times.
    let mut lines = Vec::new();
    while killed.elapsed() < Duration::from_secs(10) {
        lines = lines_after(&cluster.log(leader), before);
        if about_node(&lines, UNREACHABLE, dead).count() > 0
            && killed.elapsed() >= Duration::from_secs(3)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let said: Vec<_> = about_node(&lines, UNREACHABLE, dead).collect();
    assert_eq!(said.len(), 1, "{said:?}");
    assert_eq!(said[0]["level"], "WARN");
    assert!(said[0]["fields"]["error"].is_string(), "{}", said[0]);
    assert!(
        said[0]["fields"]["silent_ms"]
            .as_u64()
            .is_some_and(|ms| ms >= 1_000),
        "{}",
        said[0]
    );
    let alarms = alarming(&lines);
    assert!(alarms.len() <= MOST_ALARMS, "{alarms:#?}");

    cluster.restart(dead).await;
    let back = std::time::Instant::now();
    while back.elapsed() < Duration::from_secs(20) {
        lines = lines_after(&cluster.log(leader), before);
        if about_node(&lines, REACHABLE, dead).count() > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let said: Vec<_> = about_node(&lines, REACHABLE, dead).collect();
    assert_eq!(said.len(), 1, "{said:?}");
    assert_eq!(said[0]["level"], "INFO");
    assert!(
        said[0]["fields"]["unreachable_ms"]
            .as_u64()
            .is_some_and(|ms| ms > 0),
        "{}",
        said[0]
    );
    assert_eq!(about_node(&lines, UNREACHABLE, dead).count(), 1);
    let alarms = alarming(&lines);
    assert!(alarms.len() <= MOST_ALARMS, "{alarms:#?}");
}
