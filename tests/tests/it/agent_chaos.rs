//! The agent chaos checker against a real daemon: producers, `muster work` runners and
//! SDK workers share one queue while a nemesis kill -9s, drains, freezes and partitions
//! the agents (24 faults in CI); nothing acknowledged is lost, nothing is done twice or
//! run twice at once, nothing dies, and every failure the daemon counts belongs to a
//! fault. `MUSTER_AGENT_CHAOS_SEED` replays a seed, `MUSTER_AGENT_CHAOS_SECONDS` runs long.

use muster_tests::agent_chaos::{self, Config};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// A finding is returned, not panicked: the test's output then ends with the report, not
// with a backtrace of the test harness.
async fn agents_killed_drained_frozen_and_cut_off_lose_nothing_and_never_run_twice_at_once()
-> Result<(), String> {
    let config = Config::from_env();
    let long = config.run_for.is_some();
    let report = agent_chaos::run(config).await;
    if !report.is_clean() {
        return Err(format!(
            "the checker found violations: {report}; {}",
            report.details.join("; ")
        ));
    }
    if !long && report.faults() < 20 {
        return Err(format!("too few faults: {report}"));
    }
    if report.acknowledged == 0 || report.completions == 0 {
        return Err(format!("no work done: {report}"));
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// As above, against a relayed three-node cluster whose leader is kill -9ed, isolated and
// deafened (one-way loss) meanwhile, so that agents frozen or cut off past their lease
// come back to a different leader than the one that granted it.
async fn agents_of_a_cluster_whose_leader_changes_lose_nothing_and_never_run_twice_at_once()
-> Result<(), String> {
    let config = Config::cluster_from_env();
    let long = config.run_for.is_some();
    let report = agent_chaos::run(config).await;
    if !report.is_clean() {
        return Err(format!(
            "the checker found violations: {report}; {}",
            report.details.join("; ")
        ));
    }
    if !long && (report.faults() < 20 || report.leader_faults < 3) {
        return Err(format!("too few faults: {report}"));
    }
    if report.acknowledged == 0 || report.completions == 0 {
        return Err(format!("no work done: {report}"));
    }
    Ok(())
}
