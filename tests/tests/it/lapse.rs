//! Leases that run out: redelivery with a failure, max_attempts, dead letters, redrive.

use muster_tests::Daemon;

#[test]
fn a_lapsed_lease_comes_back_then_dies_and_redrive_revives_it() {
    let d = Daemon::start();
    d.ok(&[
        "queue",
        "create",
        "slow",
        "--lease",
        "1s",
        "--max-attempts",
        "2",
    ]);
    let id = d.ok(&["enqueue", "slow", r#"{"job":1}"#]).trim().to_owned();

    let first = d.ok(&["claim", "slow", "--wait", "5s"]);
    assert_eq!(first, format!("{id}.1\t1\t{{\"job\":1}}\n"));
    // Nobody renews: the lease lapses after 1 s and the task is handed out again.
    let second = d.ok(&["claim", "slow", "--wait", "10s"]);
    assert_eq!(second, format!("{id}.2\t2\t{{\"job\":1}}\n"));
    let t: serde_json::Value =
        serde_json::from_str(&d.ok(&["task", "get", &id, "--json"])).unwrap();
    assert_eq!(
        (t["deliveries"].as_u64(), t["failures"].as_u64()),
        (Some(2), Some(1))
    );

    // The second lapse reaches max_attempts: dead, with reason and error.
    let waited = d.ok(&["wait", &id, "--timeout", "10s"]);
    assert_eq!(waited, format!("{id}\tdead\t-\n"));
    let t: serde_json::Value =
        serde_json::from_str(&d.ok(&["task", "get", &id, "--json"])).unwrap();
    assert_eq!(t["state"], "dead");
    assert_eq!(t["failures"], 2);
    assert_eq!(t["dead_reason"], "max_attempts");
    assert_eq!(t["last_error"], "lease lapsed (member \"\", epoch 2)");
    let dead = d.ok(&["dead", "slow"]);
    assert_eq!(
        dead,
        format!(
            "ID\tQUEUE\tSTATE\tPRIORITY\tDELIVERIES\tFAILURES\tLAST_ERROR\n{id}\tslow\tdead\t0\t2\t2\tlease lapsed (member \"\", epoch 2)\n"
        )
    );

    assert_eq!(
        d.ok(&["redrive", "slow", &id, "--dry-run"]),
        format!("{id}\nwould be redriven: 1\n")
    );
    assert_eq!(d.ok(&["redrive", "slow", &id]), "redriven 1\n");
    let t: serde_json::Value =
        serde_json::from_str(&d.ok(&["task", "get", &id, "--json"])).unwrap();
    assert_eq!(
        (t["state"].as_str(), t["failures"].as_u64()),
        (Some("ready"), Some(0))
    );
    let third = d.ok(&["claim", "slow", "--lease", "30s"]);
    assert_eq!(third, format!("{id}.3\t3\t{{\"job\":1}}\n"));
    assert_eq!(
        d.ok(&["dead-letter", &format!("{id}.3"), "--error", "bad input"]),
        "dead\n"
    );
    assert_eq!(
        d.ok(&["discard", "slow", "--all", "--yes"]),
        "discarded 1\n"
    );
    assert_eq!(
        d.ok(&["queue", "list"]),
        "NAME\tREADY\tSCHEDULED\tLEASED\tSUSPENDED\tDONE\tDEAD\tCANCELLED\tPAUSED\nslow\t0\t0\t0\t0\t0\t0\t0\tfalse\n"
    );
}

#[test]
fn renew_keeps_a_lease_and_reports_a_cancel() {
    let d = Daemon::start();
    d.ok(&["queue", "create", "jobs", "--lease", "2s"]);
    let id = d.ok(&["enqueue", "jobs", "1"]).trim().to_owned();
    let claim = d
        .ok(&["claim", "jobs"])
        .split('\t')
        .next()
        .unwrap()
        .to_owned();
    let renewed = d.ok(&[
        "renew",
        &claim,
        "--extend",
        "60s",
        "--progress",
        r#"{"pct":50}"#,
    ]);
    assert!(renewed.ends_with("\tcancel_requested=false\n"), "{renewed}");
    assert_eq!(d.ok(&["cancel", &id]), "cancel_requested\n");
    let renewed = d.ok(&["renew", &claim]);
    assert!(renewed.ends_with("\tcancel_requested=true\n"), "{renewed}");
    assert_eq!(d.ok(&["release", &claim]), "cancelled\n");
    let t: serde_json::Value =
        serde_json::from_str(&d.ok(&["task", "get", &id, "--json"])).unwrap();
    assert_eq!(t["progress"], serde_json::json!({"pct": 50}));
    assert_eq!(t["state"], "cancelled");
    assert_eq!(d.ok(&["claim", "jobs"]), "");
}
