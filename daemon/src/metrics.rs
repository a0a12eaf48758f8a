//! Prometheus metrics, rendered by a well-kept exporter and served on `--metrics-addr`
//! (HTTP, `GET /metrics`, content type `text/plain; version=0.0.4`).
//!
//! Per queue (label `queue`), every series present from the queue's creation (zero):
//!
//! | metric | kind | more labels |
//! |--------|------|-------------|
//! | `muster_tasks` | gauge: tasks per state | `state` |
//! | `muster_oldest_ready_age_seconds` | gauge: age of the oldest ready task (since its enqueue) | |
//! | `muster_held_back_tasks` | gauge: ready tasks waiting behind their key | |
//! | `muster_unclaimable_tasks` | gauge: ready tasks no connected member has the labels for | |
//! | `muster_leases_in_flight` | gauge: leased tasks | |
//! | `muster_queue_wait_seconds` | histogram: ready (enqueued, or its delay over) to first lease | |
//! | `muster_run_seconds` | histogram: lease to its end | `outcome`: acked, nacked, released, throttled, dead_lettered, lapsed, revoked, reclaimed, redelivered, cancelled, suspended |
//! | `muster_enqueued_total`, `muster_leased_total` (not reclaims) | counters | |
//! | `muster_acked_total`, `muster_nacked_total`, `muster_released_total`, `muster_throttled_total`, `muster_lapsed_total`, `muster_revoked_total`, `muster_reclaimed_total` | counters: leases ended so | |
//! | `muster_suspended_total` | counter: leases ended by a suspend | |
//! | `muster_resumed_total` | counter: suspended tasks made ready (by a resume, a timeout that resumes, or the end of the children a parent waited for) | |
//! | `muster_spawned_total` | counter: children spawned into the queue (each also counts in `muster_enqueued_total`) | |
//! | `muster_output_chunks_total`, `muster_output_bytes_total` | counters: output stored by emits | |
//! | `muster_output_dropped_total` | counter: output chunks dropped (oldest first) to keep tasks within their output limit | |
//! | `muster_dead_lettered_total` | counter | `reason`: max_attempts, dead_lettered (by its holder), suspend_timed_out |
//! | `muster_cancelled_total` | counter: tasks ended cancelled | |
//! | `muster_redriven_total`, `muster_discarded_total`, `muster_purged_total` | counters: operators' repairs | |
//!
//! Per limit (label `limit`), set once a second while the limit exists:
//!
//! | metric | kind | more labels |
//! |--------|------|-------------|
//! | `muster_limit_held`, `muster_limit_waiting` | gauges: leases held that draw on it, ready tasks waiting for its room | |
//! | `muster_limit_keys_in_use` | gauge: its keys in use (below full, holding leases, waited on or throttled) | |
//! | `muster_limit_granted_total`, `muster_limit_throttled_total` | counters: leases granted, throttles reported, since the daemon started | |
//! | `muster_limit_key_held`, `muster_limit_key_waiting`, `muster_limit_key_tokens` | gauges of its busiest keys only ([`MAX_LISTED_LIMIT_KEYS`](muster_protocol::limits::MAX_LISTED_LIMIT_KEYS), 10, by leases held then tasks waiting; `""` is the keyless bucket; tokens only with a rate) | `key` |
//!
//! So a limit has at most 35 series however many keys it has, and the daemon at most
//! 35 × `MAX_LIMITS` (1,000).
//!
//! Per schedule (label `schedule`: the first
//! [`MAX_SCHEDULE_SERIES`](crate::engine::telemetry::MAX_SCHEDULE_SERIES) (1,000) by
//! name; the counters of the rest summed under `_other`), set once a second while the
//! schedule exists, from counts its record keeps (they survive restarts and failovers):
//!
//! | metric | kind | more labels |
//! |--------|------|-------------|
//! | `muster_schedule_fires_total` | counter: fires that enqueued a task | |
//! | `muster_schedule_runs_total` | counter: tasks `schedule_run` enqueued | |
//! | `muster_schedule_missed_total` | counter: fires missed past the grace and skipped | |
//! | `muster_schedule_failures_total` | counter: fires that could not enqueue their task | |
//! | `muster_schedule_next_fire_timestamp_seconds` | gauge: its next fire, Unix seconds (0 while paused) | |
//!
//! and `muster_schedules`, a gauge of how many there are.
//!
//! For the daemon:
//!
//! | metric | kind | labels |
//! |--------|------|--------|
//! | `muster_members_connected`, `muster_members_unreachable` | gauges | |
//! | `muster_member_leases`, `muster_member_capacity` | gauges | `member`: the first [`MAX_MEMBER_SERIES`](crate::engine::telemetry::MAX_MEMBER_SERIES) (100) by name, the rest summed under `_other` |
//! | `muster_build_info` | gauge, 1 | `version`, `commit` |
//! | `muster_store_size_bytes` | gauge: the store's files on disk | |
//! | `muster_disk_free_bytes`, `muster_disk_alarm` | gauges: free space of the data directory's file system, the disk alarm (1 on) | |
//! | `muster_fsync_batch_requests` | histogram: requests made durable by one fsync | |
//! | `muster_fsync_seconds` | histogram: time of one persist (a cluster node: of one append to its raft log) | |
//! | `muster_round_seconds` | histogram: time of one dispatcher round (requests applied, timers, persist, replies handed on) | |
//! | `muster_otlp_spans_exported_total`, `muster_otlp_spans_dropped_total` | counters: task spans exported over OTLP, and dropped (queue full, export failed); only with `--otlp-endpoint` | |
//! | `process_cpu_seconds_total`, `process_resident_memory_bytes`, `process_open_fds`, `process_max_fds`, `process_threads`, … | the process | |
//!
//! A cluster node (`cluster::node`, `cluster::storage`, `cluster::net`):
//!
//! | metric | kind | labels |
//! |--------|------|--------|
//! | `muster_cluster_leader`, `muster_cluster_term` | gauges: 1 on the leader; the raft term | |
//! | `muster_cluster_last_log_index`, `muster_cluster_last_applied_index`, `muster_cluster_snapshot_index` | gauges: the node's log, state machine and snapshot positions | |
//! | `muster_cluster_voters` | gauge: voters of the membership the node applied | |
//! | `muster_cluster_node_lag` | gauge, leader only: entries a node's log is behind | `node` |
//! | `muster_cluster_node_last_contact_seconds` | gauge, leader only: since a node last answered | `node` |
//! | `muster_cluster_voters_reachable` | gauge, leader only: voters not unreachable, itself included | |
//! | `muster_cluster_rounds_in_flight` | histogram, leader only: rounds being agreed on when one is proposed, itself included (at most `MAX_ROUNDS_IN_FLIGHT`, 8) | |
//!
//! Every cluster node exports the disk, store and fsync series and, from what its state
//! machine applied, `muster_tasks`, `muster_leases_in_flight` and
//! `muster_oldest_ready_age_seconds`; the counters, the other histograms, held-back and
//! unclaimable tasks and members come from the node that serves, the leader, alone.
//! A leader records `muster_fsync_batch_requests` per round agreed on.
//!
//! Gauges are refreshed at most once a second ([`GAUGE_INTERVAL`]) from counts the
//! engine keeps anyway: publishing costs no scan of the tasks. A gauge not refreshed
//! for [`GAUGE_IDLE_TIMEOUT`] (a deleted queue's, a departed member's) is dropped.
//! Counters and histograms of a deleted queue stay until the daemon restarts.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode, body::Incoming, header};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use metrics_util::MetricKindMask;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How often the dispatcher refreshes the engine's gauges, and the process metrics are read.
pub const GAUGE_INTERVAL: Duration = Duration::from_secs(1);

/// A gauge not set for this long is dropped from the exposition: long enough that a
/// slow round never drops a live one, short enough that a deleted queue soon goes.
pub const GAUGE_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// The exposition format's content type, with its version.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Most scrapes served at once; more wait for a slot.
const MAX_SCRAPES: usize = 8;

/// Longest one scrape's connection may stay open (a client that never finishes its
/// request does not hold a slot longer).
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(10);

/// Buckets of the latency histograms that see milliseconds to hours (queue wait,
/// run time), in seconds.
const TASK_SECONDS: &[f64] = &[
    0.005, 0.025, 0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 14400.0,
];

/// The metrics endpoint: the exporter's handle and its listener.
pub struct Endpoint {
    handle: PrometheusHandle,
    listener: tokio::net::TcpListener,
}

/// Buckets of a persist's and a dispatcher round's time, in seconds.
const ROUND_SECONDS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 1.0,
];

/// Installs the exporter as the process's recorder and binds the listener; [`serve`]
/// then answers scrapes.
pub async fn install(addr: SocketAddr) -> anyhow::Result<Endpoint> {
    let handle = PrometheusBuilder::new()
        .idle_timeout(MetricKindMask::GAUGE, Some(GAUGE_IDLE_TIMEOUT))
        .set_buckets_for_metric(
            Matcher::Full("muster_fsync_batch_requests".into()),
            &[
                1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0,
            ],
        )
        .context("histogram buckets")?
        .set_buckets_for_metric(Matcher::Full("muster_fsync_seconds".into()), ROUND_SECONDS)
        .context("histogram buckets")?
        .set_buckets_for_metric(Matcher::Full("muster_round_seconds".into()), ROUND_SECONDS)
        .context("histogram buckets")?
        .set_buckets_for_metric(
            Matcher::Full("muster_cluster_rounds_in_flight".into()),
            &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0],
        )
        .context("histogram buckets")?
        .set_buckets_for_metric(
            Matcher::Full("muster_queue_wait_seconds".into()),
            TASK_SECONDS,
        )
        .context("histogram buckets")?
        .set_buckets_for_metric(Matcher::Full("muster_run_seconds".into()), TASK_SECONDS)
        .context("histogram buckets")?
        .install_recorder()
        .context("installing the metrics recorder")?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("serving metrics on {addr}"))?;
    describe();
    metrics_process::Collector::default().describe();
    Ok(Endpoint { handle, listener })
}

impl Endpoint {
    /// Where scrapes go.
    pub fn local_addr(&self) -> anyhow::Result<SocketAddr> {
        self.listener
            .local_addr()
            .context("reading the metrics address")
    }
}

/// Answers scrapes and refreshes the process metrics until `shutdown`. With a `bearer`
/// token, only scrapes presenting it (`Authorization: Bearer TOKEN`) get the metrics;
/// others get 401.
pub async fn serve(endpoint: Endpoint, bearer: Option<String>, shutdown: CancellationToken) {
    let bearer: Option<Arc<[u8; 32]>> = bearer.map(|t| Arc::new(crate::auth::digest(&t)));
    let Endpoint { handle, listener } = endpoint;
    let slots = Arc::new(Semaphore::new(MAX_SCRAPES));
    let tracker = TaskTracker::new();
    let collector = metrics_process::Collector::default();
    let mut tick = tokio::time::interval(GAUGE_INTERVAL);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            _ = tick.tick() => {
                collector.collect();
                build_info();
                handle.run_upkeep();
            }
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let Ok(slot) = Arc::clone(&slots).acquire_owned().await else { break };
                let (handle, bearer) = (handle.clone(), bearer.clone());
                tracker.spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let (handle, bearer) = (handle.clone(), bearer.clone());
                        async move {
                            Ok::<_, std::convert::Infallible>(answer(&req, &handle, bearer.as_deref()))
                        }
                    });
                    let conn = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
                    // A scrape that errs or times out only loses its own answer.
                    let _ = tokio::time::timeout(SCRAPE_TIMEOUT, conn).await;
                    drop(slot);
                });
            }
        }
    }
    tracker.close();
    tracker.wait().await;
}

fn answer(
    req: &Request<Incoming>,
    handle: &PrometheusHandle,
    bearer: Option<&[u8; 32]>,
) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::new()));
    if req.uri().path() != "/metrics" {
        *response.status_mut() = StatusCode::NOT_FOUND;
        return response;
    }
    if let Some(want) = bearer {
        let presented = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(|t| crate::auth::digest(t.trim()));
        if presented.as_ref() != Some(want) {
            *response.status_mut() = StatusCode::UNAUTHORIZED;
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer realm=\"musterd metrics\""),
            );
            return response;
        }
    }
    if req.method() != hyper::Method::GET && req.method() != hyper::Method::HEAD {
        *response.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
        return response;
    }
    *response.body_mut() = Full::new(Bytes::from(handle.render()));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(CONTENT_TYPE),
    );
    response
}

/// `muster_build_info`: set with the process metrics, so it is never idle.
fn build_info() {
    metrics::gauge!(
        "muster_build_info",
        "version" => env!("CARGO_PKG_VERSION"),
        "commit" => crate::GIT_COMMIT
    )
    .set(1.0);
}

fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_gauge!("muster_tasks", "Tasks per queue and state.");
    describe_gauge!(
        "muster_oldest_ready_age_seconds",
        Unit::Seconds,
        "Age of the oldest ready task per queue, since its enqueue."
    );
    describe_gauge!(
        "muster_held_back_tasks",
        "Ready tasks waiting behind another task of their key."
    );
    describe_gauge!(
        "muster_unclaimable_tasks",
        "Ready tasks whose labels no connected member carries."
    );
    describe_gauge!("muster_leases_in_flight", "Leased tasks per queue.");
    describe_gauge!(
        "muster_members_connected",
        "Members with a connected session heard from within their liveness."
    );
    describe_gauge!(
        "muster_members_unreachable",
        "Members with a session silent past their liveness."
    );
    describe_gauge!("muster_member_leases", "Leases a member holds.");
    describe_gauge!("muster_member_capacity", "A member's capacity.");
    describe_gauge!("muster_build_info", "Version and git commit of musterd.");
    describe_gauge!(
        "muster_store_size_bytes",
        Unit::Bytes,
        "Size of the store's files on disk."
    );
    describe_gauge!(
        "muster_disk_free_bytes",
        Unit::Bytes,
        "Free space of the data directory's file system."
    );
    describe_gauge!(
        "muster_disk_alarm",
        "1 while the disk alarm is on (enqueues refused), else 0."
    );
    describe_gauge!(
        "muster_cluster_leader",
        "1 on the cluster's leader, else 0."
    );
    describe_gauge!("muster_cluster_term", "The node's raft term.");
    describe_gauge!(
        "muster_cluster_last_log_index",
        "Index of the last entry of the node's raft log."
    );
    describe_gauge!(
        "muster_cluster_last_applied_index",
        "Index of the last entry the node applied."
    );
    describe_gauge!(
        "muster_cluster_snapshot_index",
        "Index of the last entry in the node's snapshot."
    );
    describe_gauge!(
        "muster_cluster_voters",
        "Voters of the membership the node applied."
    );
    describe_gauge!(
        "muster_cluster_node_lag",
        "On the leader: entries each node's log is behind the leader's."
    );
    describe_gauge!(
        "muster_cluster_node_last_contact_seconds",
        Unit::Seconds,
        "On the leader: time since each other node last answered it."
    );
    describe_gauge!(
        "muster_cluster_voters_reachable",
        "On the leader: voters not unreachable, the leader included."
    );
    describe_histogram!(
        "muster_cluster_rounds_in_flight",
        "On the leader: rounds being agreed on when one is proposed, itself included."
    );
    describe_histogram!(
        "muster_queue_wait_seconds",
        Unit::Seconds,
        "From ready (enqueued, or its delay over) to first lease."
    );
    describe_histogram!(
        "muster_run_seconds",
        Unit::Seconds,
        "From a lease's grant to its end, by outcome."
    );
    describe_counter!("muster_enqueued_total", "Tasks enqueued.");
    describe_counter!("muster_leased_total", "Leases granted (not reclaims).");
    describe_counter!("muster_acked_total", "Leases ended by an ack.");
    describe_counter!("muster_nacked_total", "Leases ended by a nack.");
    describe_counter!("muster_released_total", "Leases released.");
    describe_counter!(
        "muster_throttled_total",
        "Leases given back because a provider throttled them (no attempt spent)."
    );
    describe_counter!("muster_lapsed_total", "Leases that lapsed.");
    describe_counter!(
        "muster_suspended_total",
        "Leases ended by a suspend (no attempt spent)."
    );
    describe_counter!(
        "muster_resumed_total",
        "Suspended tasks made ready by a resume, a timeout that resumes, or their children's end."
    );
    describe_counter!(
        "muster_spawned_total",
        "Children spawned into the queue (each also counted as enqueued)."
    );
    describe_counter!(
        "muster_output_chunks_total",
        "Output chunks stored by emits of the queue's tasks."
    );
    describe_counter!(
        "muster_output_bytes_total",
        "Bytes of output chunks stored by emits of the queue's tasks."
    );
    describe_counter!(
        "muster_output_dropped_total",
        "Output chunks dropped, oldest first, to keep tasks within their output limit."
    );
    describe_gauge!("muster_limit_held", "Leases held that draw on the limit.");
    describe_gauge!(
        "muster_limit_waiting",
        "Ready tasks waiting for room in the limit."
    );
    describe_gauge!(
        "muster_limit_keys_in_use",
        "Keys of the limit in use: below full, holding leases, waited on or throttled."
    );
    describe_counter!(
        "muster_limit_granted_total",
        "Leases granted that drew on the limit, since the daemon started."
    );
    describe_counter!(
        "muster_limit_throttled_total",
        "Throttles reported on the limit, since the daemon started."
    );
    describe_gauge!(
        "muster_limit_key_held",
        "Leases held on one of the limit's busiest keys."
    );
    describe_gauge!(
        "muster_limit_key_waiting",
        "Ready tasks waiting on one of the limit's busiest keys."
    );
    describe_gauge!(
        "muster_limit_key_tokens",
        "Whole tokens in the bucket of one of the limit's busiest keys."
    );
    describe_counter!(
        "muster_schedule_fires_total",
        "Fires of the schedule that enqueued a task."
    );
    describe_counter!(
        "muster_schedule_runs_total",
        "Tasks of the schedule enqueued by schedule_run."
    );
    describe_counter!(
        "muster_schedule_missed_total",
        "Fires of the schedule missed past the grace and skipped."
    );
    describe_counter!(
        "muster_schedule_failures_total",
        "Fires of the schedule that could not enqueue their task."
    );
    describe_gauge!(
        "muster_schedule_next_fire_timestamp_seconds",
        Unit::Seconds,
        "The schedule's next fire, Unix time (0 while paused)."
    );
    describe_gauge!("muster_schedules", "Schedules the daemon holds.");
    describe_counter!(
        "muster_otlp_spans_exported_total",
        "Task spans exported over OTLP."
    );
    describe_counter!(
        "muster_otlp_spans_dropped_total",
        "Task spans dropped: the export queue was full or an export failed."
    );
    describe_counter!("muster_revoked_total", "Leases revoked by an operator.");
    describe_counter!(
        "muster_reclaimed_total",
        "Leases handed back to a restarted agent."
    );
    describe_counter!("muster_dead_lettered_total", "Tasks gone dead, by reason.");
    describe_counter!("muster_cancelled_total", "Tasks ended cancelled.");
    describe_counter!("muster_redriven_total", "Dead tasks redriven.");
    describe_counter!("muster_discarded_total", "Dead tasks discarded.");
    describe_counter!("muster_purged_total", "Tasks removed by a purge.");
    describe_histogram!(
        "muster_fsync_batch_requests",
        "Requests made durable by one fsync."
    );
    describe_histogram!(
        "muster_fsync_seconds",
        Unit::Seconds,
        "Time of one persist of the store (a cluster node: of one append to its raft log)."
    );
    describe_histogram!(
        "muster_round_seconds",
        Unit::Seconds,
        "Time of one dispatcher round: requests applied, timers run, the store persisted, replies handed on."
    );
}
