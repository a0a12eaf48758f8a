"""W3C trace context across tasks, with OpenTelemetry's API when it is installed.

A task carries the trace context (``traceparent``, ``tracestate``) of the span that
enqueued it, and every delivery hands one to its holder. When the ``opentelemetry``
API package is importable (``pip install 'muster[otel]'``), enqueues and spawns fill
it in from the current span (a task given a ``traceparent`` keeps its own), and the
worker runs each handler in a ``muster.task`` span whose parent is its delivery's
context, so one trace runs from the producer through every holder to the children
they spawn. Contexts are written and read by OpenTelemetry's W3C propagator
(``TraceContextTextMapPropagator``) whatever propagators the application configured,
since the protocol's fields are W3C's. Without the package nothing is filled in and
handlers run as they are.
"""

from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterable, Iterator, Optional, Tuple

try:
    from opentelemetry import context as _otel_context
    from opentelemetry import trace as _otel_trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the optional dependency is not installed: no tracing
    _enabled = False
else:
    _enabled = True
    _propagator = TraceContextTextMapPropagator()
    # A proxy until the application sets its tracer provider, then that provider's.
    _tracer = _otel_trace.get_tracer("muster")


def enabled() -> bool:
    """True when OpenTelemetry's API is importable."""
    return _enabled


def current() -> Optional[Tuple[str, Optional[str]]]:
    """The current span's context as ``(traceparent, tracestate)``, if there is a
    current valid span (``None`` without OpenTelemetry)."""
    if not _enabled:
        return None
    if not _otel_trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: Dict[str, str] = {}
    _propagator.inject(carrier)
    traceparent = carrier.get("traceparent")
    if traceparent is None:
        return None
    return traceparent, carrier.get("tracestate") or None


def fill(tasks: Iterable[Dict[str, Any]]) -> None:
    """Fills in the trace context of tasks (each a ``dict`` of a ``NewTask``'s fields)
    that name none (neither ``traceparent`` nor ``tracestate``) from the current span's;
    the current context is read once."""
    context: Any = _UNREAD
    for task in tasks:
        if task.get("traceparent") is not None or task.get("tracestate") is not None:
            continue
        if context is _UNREAD:
            context = current()
        if context is None:
            return
        task["traceparent"], task["tracestate"] = context


_UNREAD = object()


@contextlib.contextmanager
def handler_span(
    task: str,
    queue: str,
    attempt: int,
    epoch: int,
    traceparent: Optional[str],
    tracestate: Optional[str],
) -> Iterator[Any]:
    """Runs its body in the span ``muster.task`` (made current; ``None`` without
    OpenTelemetry), a child of the delivery's trace context when it carries one, else
    the root of a trace of its own. The caller sets its status."""
    if not _enabled:
        yield None
        return
    parent = _otel_context.Context()
    if traceparent is not None:
        carrier = {"traceparent": traceparent}
        if tracestate is not None:
            carrier["tracestate"] = tracestate
        parent = _propagator.extract(carrier, context=parent)
    attributes = {
        "muster.task": task,
        "muster.queue": queue,
        "muster.attempt": attempt,
        "muster.epoch": epoch,
    }
    with _tracer.start_as_current_span(
        "muster.task",
        context=parent,
        kind=_otel_trace.SpanKind.CONSUMER,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield span


def failed(span: Any, description: str, error: Optional[BaseException] = None) -> None:
    """Marks a handler's span failed (the task nacked or dead-lettered), recording the
    exception that failed it."""
    if span is None:
        return
    if error is not None:
        span.record_exception(error)
    span.set_status(_otel_trace.Status(_otel_trace.StatusCode.ERROR, description))
