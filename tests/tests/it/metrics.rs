//! The Prometheus endpoint: scraped numbers match the queue.

use std::io::{Read, Write};
use std::time::Duration;

use muster_sdk::protocol::ops::Claim;
use muster_sdk::{NewTask, QueuePatch};
use muster_tests::Daemon;

fn scrape(addr: &str) -> String {
    let mut stream = std::net::TcpStream::connect(addr).expect("metrics endpoint");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    stream
        .write_all(format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .expect("request");
    let mut body = String::new();
    stream.read_to_string(&mut body).expect("response");
    body
}

fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scraped_metrics_match_the_queue() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let metrics_addr = format!("127.0.0.1:{port}");
    let d = Daemon::start_with(&["--metrics-addr", &metrics_addr]);
    let client = d.client().await;
    client
        .queue_create("jobs", QueuePatch::default())
        .await
        .unwrap();
    for n in 0..5 {
        client
            .enqueue("jobs", NewTask::new(muster_sdk::json(&n).unwrap()))
            .await
            .unwrap();
    }
    let got = client.claim(&Claim::new(["jobs"]).max(2)).await.unwrap();
    client.ack(&got[0].id, got[0].epoch, None).await.unwrap();
    client
        .nack(&got[1].id, got[1].epoch, Some(3_600_000), None)
        .await
        .unwrap();
    // One task stays leased (in flight).
    let held = client.claim(&Claim::new(["jobs"]).max(1)).await.unwrap();
    assert_eq!(held.len(), 1);
    // A queue whose one task's lease lapses, and with one attempt goes dead.
    let short = QueuePatch {
        lease_ms: Some(200),
        max_attempts: Some(1),
        ..QueuePatch::default()
    };
    client.queue_create("short", short).await.unwrap();
    client
        .enqueue("short", NewTask::new(muster_sdk::json(&0).unwrap()))
        .await
        .unwrap();
    assert_eq!(client.claim(&Claim::new(["short"])).await.unwrap().len(), 1);
    // A connected member.
    let agent = d.client().await;
    let open = muster_sdk::protocol::ops::SessionOpen {
        member: "gpu-1".into(),
        labels: vec![],
        capacity: 1,
        reclaim: false,
        resume: false,
        liveness_ms: None,
    };
    let _session = agent.open_session(&open).await.unwrap();
    let want = [
        ("jobs", "ready", 2.0),
        ("jobs", "leased", 1.0),
        ("jobs", "scheduled", 1.0),
        ("jobs", "done", 1.0),
        ("jobs", "dead", 0.0),
        ("short", "leased", 0.0),
        ("short", "dead", 1.0),
    ];
    // Gauges refresh once a second: poll (bounded) until they caught up.
    let mut text = String::new();
    for _ in 0..50 {
        text = scrape(&metrics_addr);
        let all = want.iter().all(|(queue, state, n)| {
            value(
                &text,
                &format!(r#"muster_tasks{{queue="{queue}",state="{state}"}}"#),
            ) == Some(*n)
        }) && value(&text, "muster_members_connected") == Some(1.0);
        if all {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for (queue, state, n) in want {
        let series = format!(r#"muster_tasks{{queue="{queue}",state="{state}"}}"#);
        assert_eq!(value(&text, &series), Some(n), "{series} in\n{text}");
    }
    let age = value(&text, r#"muster_oldest_ready_age_seconds{queue="jobs"}"#).expect("age");
    assert!(age > 0.0 && age < 120.0, "oldest ready age {age} s");
    // Exact values: a lapse counted, no ready task in `short` (age 0), the totals, the member.
    for (series, n) in [
        (r#"muster_lapsed_total{queue="short"}"#, 1.0),
        (r#"muster_oldest_ready_age_seconds{queue="short"}"#, 0.0),
        (r#"muster_enqueued_total{queue="jobs"}"#, 5.0),
        (r#"muster_acked_total{queue="jobs"}"#, 1.0),
        (r#"muster_nacked_total{queue="jobs"}"#, 1.0),
        ("muster_members_connected", 1.0),
        ("muster_members_unreachable", 0.0),
    ] {
        assert_eq!(value(&text, series), Some(n), "{series} in\n{text}");
    }
    let fsyncs = value(&text, "muster_fsync_batch_requests_count").expect("fsync histogram");
    assert!(fsyncs >= 8.0, "{fsyncs} fsyncs recorded");
}
