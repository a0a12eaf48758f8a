//! Prometheus metrics, served as text on `--metrics-addr` by a well-kept exporter.
//!
//! | metric | kind | labels |
//! |--------|------|--------|
//! | `muster_tasks` | gauge: tasks per state | `queue`, `state` |
//! | `muster_oldest_ready_age_seconds` | gauge | `queue` |
//! | `muster_members_connected` | gauge | |
//! | `muster_enqueued_total`, `muster_acked_total`, `muster_nacked_total`, `muster_lapsed_total` | counters | `queue` |
//! | `muster_fsync_batch_requests` | histogram: requests made durable by one fsync | |
//! | `muster_fsync_seconds` | histogram: time of one persist | |
//!
//! Gauges are refreshed by the dispatcher at most once a second ([`GAUGE_INTERVAL`]),
//! from counts it keeps anyway: publishing costs no scan of the tasks. In-flight work is
//! `muster_tasks{state="leased"}`, dead letters `muster_tasks{state="dead"}`.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use metrics_exporter_prometheus::PrometheusBuilder;

/// How often the dispatcher refreshes the gauges.
pub const GAUGE_INTERVAL: Duration = Duration::from_secs(1);

/// Starts the exporter's HTTP listener on the current tokio runtime.
pub fn install(addr: SocketAddr) -> anyhow::Result<()> {
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Full("muster_fsync_batch_requests".into()),
            &[
                1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0,
            ],
        )
        .context("histogram buckets")?
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Full("muster_fsync_seconds".into()),
            &[
                0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 1.0,
            ],
        )
        .context("histogram buckets")?
        .install()
        .with_context(|| format!("serving metrics on {addr}"))?;
    metrics::describe_gauge!("muster_tasks", "Tasks per queue and state.");
    metrics::describe_gauge!(
        "muster_oldest_ready_age_seconds",
        "Age of the oldest ready task per queue."
    );
    metrics::describe_gauge!(
        "muster_members_connected",
        "Members with a connected session."
    );
    metrics::describe_counter!("muster_enqueued_total", "Tasks enqueued.");
    metrics::describe_counter!("muster_acked_total", "Tasks acked.");
    metrics::describe_counter!("muster_nacked_total", "Nacks.");
    metrics::describe_counter!("muster_lapsed_total", "Leases that lapsed.");
    metrics::describe_histogram!(
        "muster_fsync_batch_requests",
        "Requests made durable by one fsync."
    );
    metrics::describe_histogram!(
        "muster_fsync_seconds",
        metrics::Unit::Seconds,
        "Time of one persist of the store."
    );
    Ok(())
}
