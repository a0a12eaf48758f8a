//! Spans of tasks, exported over OTLP/HTTP (`--otlp-endpoint`) when configured.
//!
//! The engine describes what happened to a task that carries a W3C trace context (see
//! `engine::telemetry`): each lease (its member, epoch, attempt and how it ended:
//! acked, nacked, lapsed, reclaimed, …) and the wait in the queue before it, as spans in
//! the task's trace, children of the span that enqueued it. Their ids are derived from
//! the task and the lease's epoch, so the daemon hands each holder a trace context
//! whose parent is its lease's span without keeping any state for it.
//!
//! [`record`] only puts a span on a bounded channel (at most [`QUEUED_SPANS`]; past it,
//! spans are dropped and counted in `muster_otlp_spans_dropped_total`); one thread of
//! its own builds them into OpenTelemetry's `SpanData` and hands them, at most
//! [`EXPORT_BATCH`] at a time and at least every [`EXPORT_EVERY`], to
//! `opentelemetry-otlp`'s HTTP exporter. Off by default: without an endpoint nothing
//! is recorded and [`enabled`] is one atomic load.

use std::sync::OnceLock;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, UNIX_EPOCH};

use anyhow::Context as _;
use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanExporter, SpanLinks};

/// Most spans waiting for the exporter thread; past it new ones are dropped.
pub const QUEUED_SPANS: usize = 16_384;

/// Most spans one export carries.
pub const EXPORT_BATCH: usize = 512;

/// Longest a recorded span waits before it is exported.
pub const EXPORT_EVERY: Duration = Duration::from_secs(1);

/// Longest one export may take (the collector is slow or gone: the batch is dropped).
pub const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// A span to export: a task's lease or its wait in the queue.
#[derive(Debug, Clone)]
pub struct SpanRecord {
    /// `muster.lease` or `muster.queued`.
    pub name: &'static str,
    /// The task's trace.
    pub trace_id: TraceId,
    /// The span that enqueued the task.
    pub parent_id: SpanId,
    /// This span.
    pub span_id: SpanId,
    /// The trace's flags (a span of a trace not sampled is not exported).
    pub flags: TraceFlags,
    /// The task's `tracestate`, if any.
    pub tracestate: Option<String>,
    /// When it started and ended, wall ms.
    pub start_ms: u64,
    /// See `start_ms`.
    pub end_ms: u64,
    /// `muster.*` attributes: task, queue, member, epoch, attempt, outcome, parent.
    pub attributes: Vec<KeyValue>,
}

/// Where recorded spans go, once the exporter runs.
static SINK: OnceLock<flume::Sender<SpanRecord>> = OnceLock::new();

/// True when spans are exported: only then does the engine build them.
pub fn enabled() -> bool {
    SINK.get().is_some()
}

/// Hands a span to the exporter (dropped, and counted, when its queue is full).
pub fn record(span: SpanRecord) {
    if let Some(tx) = SINK.get()
        && tx.try_send(span).is_err()
    {
        metrics::counter!("muster_otlp_spans_dropped_total").increment(1);
    }
}

/// The exporter's thread, stopped (and its last spans sent) by [`Exporter::shutdown`].
pub struct Exporter {
    stop: flume::Sender<()>,
    thread: JoinHandle<()>,
}

impl Exporter {
    /// Starts exporting to `endpoint` (the collector's OTLP/HTTP base URL, e.g.
    /// `http://127.0.0.1:4318`; spans go to its `/v1/traces`), as service
    /// `service_name`. At most once per process.
    pub fn start(endpoint: &str, service_name: &str) -> anyhow::Result<Exporter> {
        let url = format!("{}/v1/traces", endpoint.trim_end_matches('/'));
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(url.clone())
            .with_timeout(EXPORT_TIMEOUT)
            .build()
            .with_context(|| format!("setting up the OTLP exporter to {url}"))?;
        exporter.set_resource(
            &Resource::builder_empty()
                .with_attribute(KeyValue::new("service.name", service_name.to_owned()))
                .build(),
        );
        let (tx, rx) = flume::bounded(QUEUED_SPANS);
        SINK.set(tx)
            .map_err(|_| anyhow::anyhow!("the OTLP exporter is started once"))?;
        let (stop, stopped) = flume::bounded(1);
        let thread = std::thread::Builder::new()
            .name("otlp".into())
            .spawn(move || export_loop(&exporter, &rx, &stopped))
            .context("starting the OTLP exporter's thread")?;
        tracing::info!(endpoint = %url, "exporting task spans over OTLP/HTTP");
        Ok(Exporter { stop, thread })
    }

    /// Sends what was recorded and stops.
    pub fn shutdown(self) {
        let _ = self.stop.send(());
        if self.thread.join().is_err() {
            tracing::warn!("the OTLP exporter's thread panicked");
        }
    }
}

/// Gathers spans into batches and exports them, until told to stop (then exports what
/// is left).
fn export_loop(
    exporter: &opentelemetry_otlp::SpanExporter,
    rx: &flume::Receiver<SpanRecord>,
    stopped: &flume::Receiver<()>,
) {
    let scope = InstrumentationScope::builder("musterd")
        .with_version(env!("CARGO_PKG_VERSION"))
        .build();
    let mut batch: Vec<SpanData> = Vec::with_capacity(EXPORT_BATCH);
    let mut due = Instant::now() + EXPORT_EVERY;
    loop {
        let stopping = stopped.try_recv().is_ok();
        let wait = due.saturating_duration_since(Instant::now());
        if let Ok(span) = rx.recv_timeout(if stopping { Duration::ZERO } else { wait }) {
            if span.flags.is_sampled() {
                batch.push(span_data(span, &scope));
            }
            if batch.len() < EXPORT_BATCH {
                continue;
            }
        } else if !stopping && Instant::now() < due {
            continue;
        }
        if !batch.is_empty() {
            let spans = std::mem::replace(&mut batch, Vec::with_capacity(EXPORT_BATCH));
            let n = spans.len();
            match futures_executor::block_on(exporter.export(spans)) {
                Ok(()) => metrics::counter!("muster_otlp_spans_exported_total").increment(n as u64),
                Err(e) => {
                    metrics::counter!("muster_otlp_spans_dropped_total").increment(n as u64);
                    tracing::warn!(error = %e, spans = n, "an OTLP export failed; its spans are dropped");
                }
            }
        }
        due = Instant::now() + EXPORT_EVERY;
        if stopping && rx.is_empty() {
            let _ = exporter.shutdown();
            return;
        }
    }
}

fn span_data(s: SpanRecord, scope: &InstrumentationScope) -> SpanData {
    let at = |ms: u64| UNIX_EPOCH + Duration::from_millis(ms);
    let state = s
        .tracestate
        .as_deref()
        .and_then(|t| t.parse::<TraceState>().ok())
        .unwrap_or_default();
    SpanData {
        span_context: SpanContext::new(s.trace_id, s.span_id, s.flags, false, state),
        parent_span_id: s.parent_id,
        parent_span_is_remote: true,
        span_kind: if s.name == LEASE_SPAN {
            SpanKind::Consumer
        } else {
            SpanKind::Internal
        },
        name: s.name.into(),
        start_time: at(s.start_ms),
        end_time: at(s.end_ms.max(s.start_ms)),
        attributes: s.attributes,
        dropped_attributes_count: 0,
        events: SpanEvents::default(),
        links: SpanLinks::default(),
        status: Status::Unset,
        instrumentation_scope: scope.clone(),
    }
}

/// The name of a lease's span.
pub const LEASE_SPAN: &str = "muster.lease";
/// The name of the span of a task's wait in its queue before a lease.
pub const QUEUED_SPAN: &str = "muster.queued";

/// A task's trace context read back (it was checked when the task was enqueued): its
/// trace, the span that enqueued it and its flags.
pub fn parse(traceparent: &str) -> Option<(TraceId, SpanId, TraceFlags)> {
    let mut parts = traceparent.split('-');
    let (_version, trace, span, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    Some((
        TraceId::from_hex(trace).ok()?,
        SpanId::from_hex(span).ok()?,
        TraceFlags::new(u8::from_str_radix(flags, 16).ok()?),
    ))
}

/// The span id of lease `epoch` of task `id` (`queued`: of its wait before that
/// lease): derived, never zero, the same on every node.
pub fn span_id(id: ulid::Ulid, epoch: u64, queued: bool) -> SpanId {
    let mut bytes = [0u8; 25];
    bytes[..16].copy_from_slice(&id.to_bytes());
    bytes[16..24].copy_from_slice(&epoch.to_be_bytes());
    bytes[24] = u8::from(queued);
    SpanId::from(xxhash_rust::xxh3::xxh3_64(&bytes) | 1)
}
