//! The Jepsen-style checker against a real daemon: producers and agents run while a
//! nemesis kill -9s and restarts the daemon ten times at random 1–5 s intervals (and,
//! for power loss, tears the tail of its journal each time); nothing acknowledged is
//! lost, nothing is held by two agents at once, nothing is done twice, and the queue
//! drains, children spawned and waited for included. `MUSTER_CHECKER_SEED` replays a seed, `MUSTER_CHECKER_SECONDS` runs long.

use muster_tests::checker::{self, Config, Nemesis};

fn assert_clean(report: &checker::Report) {
    assert!(report.is_clean(), "the checker found violations: {report}");
    assert!(report.faults >= 10, "too few faults: {report}");
    assert!(report.acknowledged > 0, "nothing acknowledged: {report}");
    assert!(report.children > 0, "no child spawned: {report}");
    assert_eq!(report.done as usize, report.acknowledged + report.recovered);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_ten_times_loses_nothing_and_never_doubles_a_holder() {
    let report = checker::run(Config::from_env(Nemesis::Kill9)).await;
    assert_clean(&report);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_loss_with_a_torn_journal_loses_nothing_and_starts() {
    let report = checker::run(Config::from_env(Nemesis::PowerLoss)).await;
    assert_clean(&report);
}
