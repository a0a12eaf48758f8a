//! Trust, refusals at start-up, and pipelining over one connection.

use std::collections::HashSet;

use muster_sdk::{Client, ConnectOptions, NewTask, QueuePatch, Trust};
use muster_tests::Daemon;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_supervisor_learns_address_and_fingerprint_from_the_ready_file() {
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("musterd.ready");
    let mut d = Daemon::start_with(&["--ready-file", ready.to_str().unwrap()]);
    let text = std::fs::read_to_string(&ready).expect("the ready file exists once serving");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["addr"].as_str(), Some(d.addr.as_str()));
    assert_eq!(v["fingerprint"].as_str(), Some(d.fingerprint.as_str()));
    assert_eq!(v["pid"].as_u64(), Some(u64::from(d.pid())));
    let options = ConnectOptions {
        trust: Trust::Pin(v["fingerprint"].as_str().unwrap().to_owned()),
        addr: v["addr"].as_str().unwrap().to_owned(),
        token_file: Some(d.data().join(muster_protocol::LOCAL_TOKEN_FILE)),
        ..d.options()
    };
    Client::connect(options)
        .await
        .expect("connecting from the ready file");
    assert_eq!(d.terminate(), Some(0));
    assert!(!ready.exists(), "removed on a clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pins_and_ca_files_are_checked() {
    let d = Daemon::start();
    assert_eq!(d.fingerprint.len(), 64);
    // Trusted by pin or CA file, a client presents the local-only token itself.
    let local_token = d.data().join(muster_protocol::LOCAL_TOKEN_FILE);
    let with = |trust| ConnectOptions {
        trust,
        token_file: Some(local_token.clone()),
        ..d.options()
    };
    let pinned = Client::connect(with(Trust::Pin(d.fingerprint.clone())))
        .await
        .unwrap();
    assert!(pinned.queue_list().await.unwrap().is_empty());
    // The daemon's version from hello, and its durability mode, are the client's to see.
    assert_eq!(
        pinned.server(),
        concat!("musterd ", env!("CARGO_PKG_VERSION"))
    );
    assert_eq!(pinned.server_stats().await.unwrap().durability, "sync");
    let ca = Client::connect(with(Trust::CaFile(d.data().join("cert.pem"))))
        .await
        .unwrap();
    assert!(ca.queue_list().await.unwrap().is_empty());
    let wrong = Client::connect(with(Trust::Pin("00".repeat(32))))
        .await
        .err()
        .expect("a wrong pin must fail");
    let msg = wrong.to_string();
    assert!(msg.contains("does not match the pinned"), "{msg}");

    let out = d.cli(&["--pin", &"11".repeat(32), "queue", "list"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.starts_with("muster: connect: ") && err.contains("does not match the pinned"),
        "{err}"
    );
    let token_file = local_token.to_str().unwrap();
    assert_eq!(
        d.ok(&[
            "--pin",
            &d.fingerprint,
            "--token-file",
            token_file,
            "queue",
            "list",
            "--no-headers"
        ]),
        ""
    );
}

#[test]
fn musterd_refuses_a_public_address_open_without_insecure() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(muster_tests::musterd_bin())
        .arg("--data")
        .arg(dir.path())
        .args(["--listen", "0.0.0.0:0", "--open"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("refusing to listen on 0.0.0.0:0"), "{err}");
    assert!(err.contains("--insecure"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_pipelines_many_concurrent_requests_and_they_share_fsyncs() {
    let mut d = Daemon::start();
    let client = d.client().await;
    client
        .queue_create("pipe", QueuePatch::default())
        .await
        .unwrap();
    let calls: Vec<_> = (0..500)
        .map(|n| {
            let client = client.clone();
            tokio::spawn(async move {
                client
                    .enqueue("pipe", NewTask::new(muster_sdk::json(&n).unwrap()))
                    .await
            })
        })
        .collect();
    let mut ids = HashSet::new();
    for c in calls {
        ids.insert(c.await.unwrap().unwrap().id);
    }
    assert_eq!(ids.len(), 500);
    assert_eq!(
        client.queue_describe("pipe").await.unwrap().counts.ready,
        500
    );
    drop(client);
    assert_eq!(d.terminate(), Some(0));
    // The daemon's last line counts fsyncs and the requests they covered.
    let log = d.log();
    let last = log
        .lines()
        .rev()
        .find(|l| l.contains("musterd stopped"))
        .expect("a stop line");
    let v: serde_json::Value = serde_json::from_str(last).unwrap();
    let (syncs, requests) = (
        v["fields"]["syncs"].as_u64().unwrap(),
        v["fields"]["requests"].as_u64().unwrap(),
    );
    assert!(requests >= 501, "{requests} requests in persisted rounds");
    assert!(
        syncs * 4 <= requests,
        "{syncs} fsyncs for {requests} requests: no group commit"
    );
    eprintln!("group commit: {syncs} fsyncs for {requests} requests");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_flushes_requests_whose_replies_were_never_awaited() {
    let d = Daemon::start();
    let client = d.client().await;
    client
        .queue_create("flush", QueuePatch::default())
        .await
        .unwrap();
    client
        .queue_create("idle", QueuePatch::default())
        .await
        .unwrap();
    // A claim the daemon holds back on an empty queue: close does not wait for it.
    let parked = client
        .send(&muster_protocol::ops::Claim::new(["idle"]).wait_ms(60_000))
        .await
        .unwrap();
    // 2,000 enqueues sent and their replies dropped unawaited, then closed at once.
    for n in 0..2_000u32 {
        let req = muster_protocol::ops::Enqueue {
            queue: "flush".into(),
            tasks: vec![NewTask::new(muster_sdk::json(&n).unwrap())],
        };
        drop(client.send(&req).await.unwrap());
    }
    let started = std::time::Instant::now();
    client.close().await;
    let took = started.elapsed();
    assert!(
        took < muster_sdk::client::FLUSH_WAIT,
        "close waited {took:?}: it waited for the parked claim"
    );
    let other = d.client().await;
    assert_eq!(
        other.queue_describe("flush").await.unwrap().counts.ready,
        2_000,
        "every enqueue sent before close was applied"
    );
    let ended = parked
        .reply()
        .await
        .expect_err("the parked claim ends with the connection");
    assert!(matches!(ended, muster_sdk::Error::Closed(_)), "{ended}");
}

/// A local UDP port where nothing listens (bound, read, let go): below the ephemeral
/// range, so no client's socket takes it before the test is done.
fn dead_port() -> u16 {
    let socket = muster_tests::free_port_below_ephemeral();
    socket.local_addr().expect("its address").port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_of_addresses_reaches_the_single_daemon_among_them() {
    let d = Daemon::start();
    let dead = format!("127.0.0.1:{}", dead_port());
    for addr in [format!("{dead},{}", d.addr), format!("{} , {dead}", d.addr)] {
        let client = Client::connect(ConnectOptions {
            addr: addr.clone(),
            ..d.options()
        })
        .await
        .unwrap_or_else(|e| panic!("{addr}: {e}"));
        assert_eq!(client.cluster(), None, "a single daemon names no cluster");
        assert!(client.queue_list().await.unwrap().is_empty());
        // Its cluster ops say it runs alone.
        let err = client.cluster_status().await.unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid_state: this daemon is not a cluster node (start it with --cluster-id to run a cluster)"
        );
    }
    // One node's own view takes exactly one address.
    let err = Client::connect_node(ConnectOptions {
        addr: format!("{dead},{}", d.addr),
        ..d.options()
    })
    .await
    .err()
    .expect("two addresses are refused");
    assert_eq!(
        err.to_string(),
        format!(
            "invalid input: one address is needed to connect to one node, not 2 ({dead},{})",
            d.addr
        )
    );
    let node = Client::connect_node(d.options()).await.unwrap();
    assert_eq!(node.cluster(), None);
    // A bad list is refused before anything is sent.
    let err = Client::connect(ConnectOptions {
        addr: format!("{},", d.addr),
        ..d.options()
    })
    .await
    .err()
    .expect("an empty entry is refused");
    assert_eq!(
        err.to_string(),
        format!(
            "invalid input: an empty address in \"{},\" (addresses are HOST:PORT separated by commas)",
            d.addr
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_where_nothing_answers_fails_naming_each_address() {
    let d = Daemon::start();
    let (a, b) = (
        format!("127.0.0.1:{}", dead_port()),
        format!("127.0.0.1:{}", dead_port()),
    );
    let started = std::time::Instant::now();
    let err = Client::connect(ConnectOptions {
        addr: format!("{a},{b}"),
        ..d.options()
    })
    .await
    .err()
    .expect("nothing listens");
    let waited = started.elapsed();
    assert!(
        waited >= muster_sdk::connect::FIND_LEADER_TIMEOUT - std::time::Duration::from_millis(200)
            && waited < muster_sdk::connect::FIND_LEADER_TIMEOUT * 2,
        "{waited:?}"
    );
    let nothing =
        "nothing listens there (the host answered \"port unreachable\"): is musterd running?";
    assert_eq!(
        err.to_string(),
        format!(
            "connect: no leader found among {a},{b} within 10 s: connect: {a}: {nothing}; connect: {b}: {nothing}"
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raw_call_is_decoded_as_the_daemon_decodes_it_before_anything_is_sent() {
    let d = Daemon::start();
    let client = d.client().await;
    let created = client
        .call_raw(
            "queue_create",
            r#" {"queue":"raw","options":{"lease_ms":5000}} "#,
        )
        .await
        .expect("a raw queue_create");
    let created: serde_json::Value = serde_json::from_str(&created).expect("a JSON reply");
    assert_eq!(created["ok"], true);
    assert_eq!(created["queue"]["name"], "raw");
    assert_eq!(created["queue"]["options"]["lease_ms"], 5000);
    // The daemon's refusal keeps its code.
    let err = client
        .call_raw("queue_create", r#"{"queue":"raw"}"#)
        .await
        .expect_err("the queue exists");
    assert_eq!(
        err.to_string(),
        "already_exists: queue \"raw\" exists already"
    );
    // Raw requests sent one after another are applied in that order.
    let mut pending = Vec::new();
    for n in 0..3 {
        let fields = format!(r#"{{"queue":"raw","tasks":[{{"payload":{n}}}]}}"#);
        pending.push(client.send_raw("enqueue", &fields).await.expect("sent"));
    }
    let mut ids = Vec::new();
    for reply in pending {
        let reply: serde_json::Value =
            serde_json::from_str(&reply.reply().await.expect("enqueued")).expect("JSON");
        ids.push(reply["tasks"][0]["id"].as_str().expect("an id").to_owned());
    }
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(ids, sorted, "ids grow in the order the enqueues were sent");
    // Bad input is refused here, and nothing reaches the daemon.
    for (op, fields, message) in [
        ("queue_fly", "{}", "unknown op \"queue_fly\""),
        (
            "queue_create",
            "[]",
            "queue_create: the fields are not a JSON object",
        ),
        (
            "queue_create",
            r#"{"queue":"x""#,
            "queue_create: the fields are not a JSON object",
        ),
        (
            "queue_create",
            r#"{"queue":7}"#,
            "queue_create: invalid request: invalid type: integer `7`, expected a string",
        ),
        (
            "queue_create",
            r#"{"options":{}}"#,
            "queue_create: invalid request: missing field `queue`",
        ),
        (
            "queue_create",
            r#"{"queue":"x"}{"queue":"y"}"#,
            "queue_create: frame is not a JSON object with a numeric id and a string op: trailing characters",
        ),
        (
            "queue_create",
            r#"{"id":7,"queue":"x"}"#,
            "queue_create: frame is not a JSON object with a numeric id and a string op: duplicate field `id`",
        ),
        (
            "queue_create",
            r#"{"queue":"x","op":"queue_delete"}"#,
            "queue_create: frame is not a JSON object with a numeric id and a string op: duplicate field `op`",
        ),
    ] {
        let err = client
            .call_raw(op, fields)
            .await
            .expect_err("bad input is refused");
        assert!(
            matches!(&err, muster_sdk::Error::InvalidInput(m) if m == message),
            "{op} {fields}: {err}"
        );
    }
    let queues = client.queue_list().await.expect("queues");
    assert_eq!(
        queues.iter().map(|q| q.name.as_str()).collect::<Vec<_>>(),
        ["raw"]
    );
    assert_eq!(queues[0].counts.ready, 3);
}
