//! Dispatch policy through the CLI against a real daemon, with exact orders:
//! priorities, delays (also across a restart), keys, labels, fairness and retention.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use muster_tests::Daemon;

/// The task ids in the order `muster claim` printed them.
fn claimed(out: &str) -> Vec<String> {
    out.lines()
        .map(|l| l.split('.').next().expect("a claim").to_owned())
        .collect()
}

fn claim_of(out: &str) -> String {
    out.split('\t').next().expect("a claim").to_owned()
}

fn field(text: &str, key: &str) -> String {
    text.lines()
        .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix('\t')))
        .unwrap_or_else(|| panic!("no {key} in {text}"))
        .to_owned()
}

fn enqueue(d: &Daemon, queue: &str, payload: &str, flags: &[&str]) -> String {
    let mut args = vec!["enqueue", queue, payload];
    args.extend_from_slice(flags);
    d.ok(&args).trim().to_owned()
}

#[test]
fn higher_priority_first_then_enqueue_order_and_a_retry_keeps_its_place() {
    let d = Daemon::start();
    d.ok(&["queue", "create", "p"]);
    let a = enqueue(&d, "p", "1", &[]);
    let b = enqueue(&d, "p", "2", &["--priority", "5"]);
    let c = enqueue(&d, "p", "3", &[]);
    let e = enqueue(&d, "p", "4", &["--priority", "9"]);
    assert_eq!(
        claimed(&d.ok(&["claim", "p", "--max", "3"])),
        [e.clone(), b, a.clone()]
    );
    let a_claim = format!("{a}.1");
    assert_eq!(d.ok(&["nack", &a_claim, "--delay", "0s"]), "ready\n");
    assert_eq!(claimed(&d.ok(&["claim", "p", "--max", "5"])), [a, c]);
    let _ = e;
}

/// The delayed task's delay: long enough that the two commands after its enqueue (each
/// a process of its own) finish within it even on a loaded machine.
const DELAY_MS: u64 = 3_000;

#[test]
fn a_delayed_task_becomes_ready_on_time_and_right_after_a_restart() {
    let mut d = Daemon::start();
    d.ok(&["queue", "create", "later"]);
    let delay = format!("{DELAY_MS}ms");
    let delayed = enqueue(&d, "later", r#""delayed""#, &["--delay", &delay]);
    let now = enqueue(&d, "later", r#""now""#, &[]);
    assert_eq!(claimed(&d.ok(&["claim", "later", "--max", "5"])), [now]);
    // A waiting claim gets the delayed task when its time comes.
    assert_eq!(
        claimed(&d.ok(&["claim", "later", "--wait", "10s"])),
        std::slice::from_ref(&delayed)
    );
    let t: serde_json::Value =
        serde_json::from_str(&d.ok(&["task", "get", &delayed, "--json"])).unwrap();
    let created = t["created_ms"].as_u64().unwrap();
    let leased_at = t["history"][1]["at_ms"].as_u64().unwrap();
    let late = leased_at - (created + DELAY_MS);
    eprintln!("delayed task handed out {late} ms after its time");
    assert!(late <= 250, "handed out {late} ms late");

    // Scheduled with --at; the daemon is down when the time comes.
    let at_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
        + 600;
    let at =
        humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(at_ms)).to_string();
    let scheduled = enqueue(&d, "later", r#""at""#, &["--at", &at]);
    let t: serde_json::Value =
        serde_json::from_str(&d.ok(&["task", "get", &scheduled, "--json"])).unwrap();
    assert_eq!(
        (t["state"].as_str(), t["not_before_ms"].as_u64()),
        (Some("scheduled"), Some(at_ms))
    );
    d.kill9();
    // Wall-clock time must pass while the daemon is down: that is the point of the test.
    while (SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64)
        < at_ms + 50
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    d.restart();
    assert_eq!(claimed(&d.ok(&["claim", "later"])), [scheduled]);
}

#[test]
fn a_key_goes_in_order_one_at_a_time_without_holding_up_other_keys() {
    let d = Daemon::start();
    d.ok(&["queue", "create", "refunds"]);
    let capture = enqueue(&d, "refunds", r#""capture 42""#, &["--key", "order-42"]);
    let refund = enqueue(
        &d,
        "refunds",
        r#""refund 42""#,
        &["--key", "order-42", "--priority", "9"],
    );
    let other = enqueue(&d, "refunds", r#""capture 43""#, &["--key", "order-43"]);
    let plain = enqueue(&d, "refunds", r#""report""#, &[]);
    // The refund has the higher priority but waits behind the capture of its order.
    let first = d.ok(&["claim", "refunds", "--max", "10"]);
    assert_eq!(claimed(&first), [capture.clone(), other, plain]);
    let described = d.ok(&["queue", "describe", "refunds"]);
    assert_eq!(
        (field(&described, "ready"), field(&described, "held_back")),
        ("1".into(), "1".into())
    );
    // A failed capture still heads its line: the refund keeps waiting for the retry.
    // The retry's delay outlasts the next command (a process of its own) on a loaded
    // machine.
    let capture_claim = claim_of(first.lines().next().unwrap());
    assert_eq!(
        d.ok(&["nack", &capture_claim, "--delay", "2s"]),
        "scheduled\n"
    );
    assert_eq!(d.ok(&["claim", "refunds"]), "");
    assert_eq!(
        claimed(&d.ok(&["claim", "refunds", "--wait", "10s"])),
        std::slice::from_ref(&capture)
    );
    assert_eq!(d.ok(&["ack", &format!("{capture}.2")]), "done\n");
    assert_eq!(claimed(&d.ok(&["claim", "refunds"])), [refund]);

    // With key_concurrency 2, two of a key go at once, still in order.
    d.ok(&["queue", "create", "pairs", "--key-concurrency", "2"]);
    let ids: Vec<String> = (0..3)
        .map(|i| enqueue(&d, "pairs", &i.to_string(), &["--key", "k"]))
        .collect();
    assert_eq!(
        claimed(&d.ok(&["claim", "pairs", "--max", "3"])),
        ids[..2].to_vec()
    );
}

#[test]
fn required_labels_gate_delivery_and_unclaimable_tasks_show_in_describe() {
    let d = Daemon::start();
    d.ok(&["queue", "create", "ml"]);
    let gpu = enqueue(&d, "ml", r#""train""#, &["--requires", "gpu"]);
    let any = enqueue(&d, "ml", r#""tokenize""#, &[]);
    // A CPU box gets the task it can take, even though the GPU task is older.
    assert_eq!(
        claimed(&d.ok(&[
            "claim", "ml", "--member", "cpu-1", "--labels", "cpu", "--max", "5"
        ])),
        [any]
    );
    let described = d.ok(&["queue", "describe", "ml"]);
    assert_eq!(field(&described, "unclaimable"), "1 (requires gpu)");
    // A member carrying the label connects: the task is claimable, and it takes it.
    let _work = d.spawn_cli(&[
        "work", "ml", "--member", "gpu-1", "--labels", "gpu,big", "--", "sleep", "60",
    ]);
    let mut held = String::new();
    for _ in 0..200 {
        held = d.ok(&["members", "--no-headers"]);
        if held.contains("gpu-1\tconnected\t1/1\t") {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // The pull claimer holds its lease under its name, without a session.
    assert!(held.starts_with("cpu-1\tgone\t1/0\t"), "{held}");
    assert!(
        held.contains("\ngpu-1\tconnected\t1/1\tactive\tgpu,big\t"),
        "{held}"
    );
    let t: serde_json::Value =
        serde_json::from_str(&d.ok(&["task", "get", &gpu, "--json"])).unwrap();
    assert_eq!(t["lease"]["member"], "gpu-1");
    assert_eq!(
        field(&d.ok(&["queue", "describe", "ml"]), "unclaimable"),
        "0"
    );
}

#[test]
fn one_claim_over_several_queues_serves_them_round_robin() {
    let d = Daemon::start();
    for q in ["a", "b", "c"] {
        d.ok(&["queue", "create", q]);
        for i in 0..2 {
            enqueue(&d, q, &format!(r#""{q}{i}""#), &[]);
        }
    }
    let out = d.ok(&["claim", "a", "b", "c", "--max", "6"]);
    let payloads: Vec<&str> = out
        .lines()
        .map(|l| l.rsplit('\t').next().unwrap())
        .collect();
    assert_eq!(
        payloads,
        [
            r#""a0""#, r#""b0""#, r#""c0""#, r#""a1""#, r#""b1""#, r#""c1""#
        ]
    );
}

#[test]
fn finished_tasks_go_after_their_retention_and_dead_ones_stay() {
    let d = Daemon::start();
    d.ok(&["queue", "create", "short", "--retention", "1s"]);
    let done = enqueue(&d, "short", "1", &[]);
    let dead = enqueue(&d, "short", "2", &[]);
    let out = d.ok(&["claim", "short", "--max", "2"]);
    let claims: Vec<String> = out.lines().map(claim_of).collect();
    assert_eq!(d.ok(&["ack", &claims[0]]), "done\n");
    assert_eq!(
        d.ok(&["dead-letter", &claims[1], "--error", "bad"]),
        "dead\n"
    );
    let mut gone = false;
    for _ in 0..100 {
        if !d.cli(&["task", "get", &done]).status.success() {
            gone = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(gone, "the done task outlived its retention");
    let left = d.ok(&["queue", "describe", "short"]);
    assert_eq!(
        (field(&left, "done"), field(&left, "dead")),
        ("0".into(), "1".into())
    );
    assert_eq!(
        d.ok(&["dead", "short", "--no-headers"]).split('\t').next(),
        Some(dead.as_str())
    );
}
