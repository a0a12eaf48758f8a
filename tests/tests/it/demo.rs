//! `muster demo`: a daemon restart costs it nothing, and SIGTERM drains it.

use std::time::Duration;

use muster_sdk::Client;
use muster_sdk::protocol::model::{MemberInfo, MemberState};
use muster_tests::Daemon;

/// Tasks on queue `demo` in every state.
async fn stored(client: &Client) -> u64 {
    let c = client
        .queue_describe("demo")
        .await
        .expect("queue demo")
        .counts;
    c.scheduled + c.ready + c.leased + c.done + c.dead + c.cancelled
}

/// Waits (bounded) until queue `demo` holds more than `than` tasks.
async fn until_more_than(d: &Daemon, than: u64) -> u64 {
    let client = d.client().await;
    for _ in 0..300 {
        let n = stored(&client).await;
        if n > than {
            client.close().await;
            return n;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("queue demo never held more than {than} tasks");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_survives_a_daemon_restart_and_drains_on_sigterm() {
    let mut d = Daemon::start();
    let mut demo = d.spawn_cli(&["demo", "--rate", "20"]);
    demo.lines_matching(1, Duration::from_secs(10), |l| {
        l.starts_with("demo: 4 agents")
    });
    let before = until_more_than(&d, 5).await;

    d.kill9();
    d.restart();
    let back = demo.lines_matching(1, Duration::from_secs(20), |l| {
        l.starts_with("demo: producer reconnected after ")
    });
    assert_eq!(back.len(), 1);
    until_more_than(&d, before).await;
    assert_eq!(demo.wait(Duration::ZERO), None, "the demo is still running");
    // Its agents reconnected too: all four hold sessions again.
    let client = d.client().await;
    let connected = |members: &[MemberInfo]| {
        members
            .iter()
            .filter(|m| m.state == MemberState::Connected)
            .count()
    };
    for _ in 0..200 {
        if connected(&client.member_list().await.expect("members")) == 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(connected(&client.member_list().await.expect("members")), 4);

    demo.signal("-TERM");
    demo.lines_matching(1, Duration::from_secs(5), |l| l == "demo: draining agents");
    assert_eq!(demo.wait(Duration::from_secs(20)), Some(0));
    // Every connection was closed on the way out: the daemon sees the agents gone, and
    // nothing is left leased to them.
    let members = client.member_list().await.expect("members");
    assert_eq!(connected(&members), 0, "{members:?}");
    let c = client.queue_describe("demo").await.expect("demo").counts;
    assert_eq!(c.leased, 0);
}
