//! W3C trace context across tasks.
//!
//! A task carries the trace context (`traceparent`, `tracestate`) of the span that
//! enqueued it, and every delivery hands one to its holder. With the `otel` feature,
//! [`Client`](crate::Client)'s enqueues and spawns fill it in from the current `tracing`
//! span's OpenTelemetry context (through `tracing-opentelemetry`, when the application
//! installed its layer), and [`handler_span`] makes each handler's span a child of its
//! delivery's context, so one trace runs from the producer through every holder to the
//! children they spawn. Without the feature (or outside a trace) nothing is filled in,
//! and the handler's span is a plain `tracing` span.

use muster_protocol::model::Delivery;
use tracing::Span;

/// The trace context of the current span, `(traceparent, tracestate)`, if it is in a
/// trace (always `None` without the `otel` feature).
pub fn current() -> Option<(String, Option<String>)> {
    #[cfg(feature = "otel")]
    {
        use opentelemetry::propagation::TextMapPropagator;
        use opentelemetry_sdk::propagation::TraceContextPropagator;
        use tracing_opentelemetry::OpenTelemetrySpanExt;
        let mut carrier = std::collections::HashMap::new();
        TraceContextPropagator::new().inject_context(&Span::current().context(), &mut carrier);
        let traceparent = carrier.remove("traceparent")?;
        Some((
            traceparent,
            carrier.remove("tracestate").filter(|s| !s.is_empty()),
        ))
    }
    #[cfg(not(feature = "otel"))]
    None
}

/// The span a handler runs in: `muster.task` with the task's id, queue, attempt and
/// epoch; with the `otel` feature, a child of the trace context its delivery carries.
pub fn handler_span(delivery: &Delivery) -> Span {
    let span = tracing::info_span!(
        "muster.task",
        task = %delivery.id,
        queue = %delivery.queue,
        attempt = delivery.attempt,
        epoch = delivery.epoch,
    );
    #[cfg(feature = "otel")]
    if let Some(traceparent) = &delivery.traceparent {
        use opentelemetry::propagation::TextMapPropagator;
        use opentelemetry_sdk::propagation::TraceContextPropagator;
        use tracing_opentelemetry::OpenTelemetrySpanExt;
        let mut carrier = std::collections::HashMap::new();
        carrier.insert("traceparent".to_owned(), traceparent.clone());
        if let Some(tracestate) = &delivery.tracestate {
            carrier.insert("tracestate".to_owned(), tracestate.clone());
        }
        let parent = TraceContextPropagator::new().extract(&carrier);
        // Without tracing-opentelemetry's layer installed there is no trace to join.
        let _ = span.set_parent(parent);
    }
    span
}

/// Fills in the trace context of tasks that name none from the current span's.
pub(crate) fn fill<'a>(tasks: impl IntoIterator<Item = &'a mut muster_protocol::model::NewTask>) {
    let mut current_context = None;
    for task in tasks {
        if task.traceparent.is_some() {
            continue;
        }
        let Some((traceparent, tracestate)) = current_context.get_or_insert_with(current) else {
            return;
        };
        task.traceparent = Some(traceparent.clone());
        task.tracestate = tracestate.clone();
    }
}
