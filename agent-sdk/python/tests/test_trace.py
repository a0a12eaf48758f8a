"""W3C trace context from Python against a real daemon (run without ``--otlp-endpoint``,
so a delivery carries the producer's context): enqueues and spawns carry the current
OpenTelemetry span's context, the worker runs each handler in a ``muster.task`` span
that is its delivery's child, an explicit ``traceparent`` wins, a malformed one is the
daemon's ``bad_request``; and the SDK without OpenTelemetry importable."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from typing import Any, Dict, Iterator, List, Optional, Tuple

import muster
import muster.sync
import pytest
from conftest import Daemon, run

pytest.importorskip("opentelemetry.sdk.trace")

from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)

_EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module")
def tracer() -> trace.Tracer:
    """The process's tracer provider (set once: OpenTelemetry allows one), exporting
    every ended span to the in-memory exporter at once."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    return trace.get_tracer("muster-tests")


@pytest.fixture
def spans(tracer: trace.Tracer) -> Iterator[InMemorySpanExporter]:
    """The exporter, emptied before the test."""
    _EXPORTER.clear()
    yield _EXPORTER


def traceparent_of(span: Any) -> str:
    """The traceparent W3C writes for a span."""
    ctx = span.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def handler_spans(exporter: InMemorySpanExporter, count: int) -> List[ReadableSpan]:
    """The ``muster.task`` spans exported, once there are ``count`` (waits up to 10 s)."""
    deadline = time.monotonic() + 10
    while True:
        found = [s for s in exporter.get_finished_spans() if s.name == "muster.task"]
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.01)


def test_enqueues_carry_the_current_span_and_an_explicit_context_wins(
    daemon: Daemon, tracer: trace.Tracer
) -> None:
    explicit = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

    async def body() -> None:
        async with await muster.Client.connect(**daemon.connect) as client:
            await client.queue_create("jobs")
            outside = await client.enqueue("jobs", {"n": 0})
            with tracer.start_as_current_span("produce") as span:
                one = await client.enqueue("jobs", {"n": 1})
                many = await client.enqueue_many(
                    "jobs",
                    [
                        {"n": 2},
                        muster.NewTask({"n": 3}, priority=2),
                        muster.NewTask({"n": 4}, traceparent=explicit, tracestate="k=v"),
                    ],
                )
                given = await client.enqueue("jobs", {"n": 5}, traceparent=explicit)
            expected = traceparent_of(span)
            info = await client.task_get(one)
            assert (info.traceparent, info.tracestate) == (expected, None)
            for task in many[:2]:
                assert (await client.task_get(task)).traceparent == expected
            explicit_info = await client.task_get(many[2])
            assert (explicit_info.traceparent, explicit_info.tracestate) == (explicit, "k=v")
            assert (await client.task_get(given)).traceparent == explicit
            assert (await client.task_get(outside)).traceparent is None
            # A delivery carries it (no --otlp-endpoint: the producer's context).
            claims = await client.claim("jobs", max=10, wait=5)
            carried = {c.payload["n"]: (c.traceparent, c.tracestate) for c in claims}
            assert carried[0] == (None, None)
            assert carried[1] == (expected, None)
            assert carried[4] == (explicit, "k=v")

    run(body())


def test_the_blocking_client_carries_the_callers_span(daemon: Daemon, tracer: trace.Tracer) -> None:
    with muster.sync.Client.connect(**daemon.connect) as client:
        client.queue_create("jobs")
        with tracer.start_as_current_span("produce") as span:
            task = client.enqueue("jobs", {"n": 1})
        assert client.task_get(task).traceparent == traceparent_of(span)


def test_a_malformed_trace_context_is_a_bad_request(daemon: Daemon) -> None:
    async def body() -> None:
        async with await muster.Client.connect(**daemon.connect) as client:
            await client.queue_create("jobs")
            for fields in (
                {"traceparent": "00-xyz-b7ad6b7169203331-01"},
                {"traceparent": "00-00000000000000000000000000000000-b7ad6b7169203331-01"},
                {"tracestate": "k=v"},
            ):
                with pytest.raises(muster.BadRequest) as refused:
                    await client.enqueue("jobs", {}, **fields)
                assert refused.value.code == "bad_request"
            with pytest.raises(muster.BadRequest):
                await client.enqueue_many("jobs", [muster.NewTask({}, traceparent="nope")])
            assert (await client.queue_describe("jobs")).ready == 0

    run(body())


def test_handlers_run_in_spans_of_the_producers_trace_and_children_follow(
    daemon: Daemon, tracer: trace.Tracer, spans: InMemorySpanExporter
) -> None:
    async def body() -> Tuple[str, Dict[str, Any]]:
        seen: Dict[str, Any] = {}
        finished = asyncio.Event()

        async def handle(task: muster.Task) -> Any:
            current = trace.get_current_span()
            seen[task.queue] = {
                "traceparent": task.traceparent,
                "tracestate": task.tracestate,
                "span": traceparent_of(current),
                "id": task.id,
            }
            if task.queue == "plan":
                (child,) = await task.spawn([muster.Child("part", "count", {"n": 1})])
                seen["child"] = child.id
                return "planned"
            finished.set()
            return "counted"

        async with await muster.Client.connect(**daemon.connect) as client:
            await client.queue_create("plan")
            await client.queue_create("count")
            with tracer.start_as_current_span("produce") as producer:
                plan = await client.enqueue("plan", {})
            worker = muster.Worker("py/tracer", ["plan", "count"], **daemon.connect)
            running = asyncio.ensure_future(worker.run(handle, handle_signals=False))
            await asyncio.wait_for(finished.wait(), 20)
            done = await client.wait([plan, seen["child"]], timeout=20)
            assert sorted(t.state for t in done.finished) == ["done", "done"]
            child = await client.task_get(seen["child"])
            seen["child_info"] = child
            worker.shutdown()
            await asyncio.wait_for(running, 20)
        return traceparent_of(producer), seen

    producer, seen = run(body())
    # The delivery carried the producer's context; the handler ran in a span of its own.
    assert seen["plan"]["traceparent"] == producer
    assert seen["plan"]["tracestate"] is None
    handler = seen["plan"]["span"]
    assert handler != producer and handler.split("-")[1] == producer.split("-")[1]
    # The child was spawned in the handler's span, and its handler is that span's child.
    assert seen["child_info"].traceparent == handler
    assert seen["count"]["traceparent"] == handler

    exported = {s.attributes["muster.queue"]: s for s in handler_spans(spans, 2) if s.attributes}
    plan_span, count_span = exported["plan"], exported["count"]
    producer_span_id = int(producer.split("-")[2], 16)
    assert plan_span.parent is not None and plan_span.parent.span_id == producer_span_id
    assert plan_span.parent.is_remote
    assert plan_span.context.trace_id == int(producer.split("-")[1], 16)
    assert count_span.parent is not None
    assert count_span.parent.span_id == plan_span.context.span_id
    assert count_span.context.trace_id == plan_span.context.trace_id
    assert dict(plan_span.attributes or {}) == {
        "muster.task": seen["plan"]["id"],
        "muster.queue": "plan",
        "muster.attempt": 1,
        "muster.epoch": 1,
    }
    assert plan_span.kind == trace.SpanKind.CONSUMER
    assert plan_span.status.status_code == trace.StatusCode.UNSET


def test_a_failed_handler_marks_its_span_and_a_task_without_context_starts_a_trace(
    daemon: Daemon, spans: InMemorySpanExporter
) -> None:
    async def body() -> Optional[str]:
        failed = asyncio.Event()
        carried: List[Optional[str]] = []

        async def handle(task: muster.Task) -> Any:
            carried.append(task.traceparent)
            failed.set()
            raise ValueError("no good")

        async with await muster.Client.connect(**daemon.connect) as client:
            await client.queue_create("jobs")
            await client.enqueue("jobs", {})
            worker = muster.Worker("py/failing", "jobs", **daemon.connect)
            running = asyncio.ensure_future(worker.run(handle, handle_signals=False))
            await asyncio.wait_for(failed.wait(), 20)
            worker.shutdown()
            await asyncio.wait_for(running, 20)
        return carried[0]

    assert run(body()) is None
    (span,) = handler_spans(spans, 1)[:1]
    assert span.parent is None
    assert span.status.status_code == trace.StatusCode.ERROR
    assert span.status.description == "ValueError: no good"
    assert [e.name for e in span.events] == ["exception"]


_WITHOUT_OTEL = """
import asyncio, json, sys
sys.modules["opentelemetry"] = None  # import opentelemetry raises ImportError
import muster, muster._trace
assert not muster._trace.enabled()
connect = json.loads(sys.argv[1])
explicit = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

async def main():
    seen = []
    async def handle(task):
        seen.append((task.traceparent, task.tracestate))
        if task.payload == 0:
            await task.spawn([muster.Child("c", "jobs", 1)])
        return task.payload
    async with await muster.Client.connect(**connect) as client:
        await client.queue_create("jobs")
        plain = await client.enqueue("jobs", 0)
        given = await client.enqueue("jobs", 2, traceparent=explicit, tracestate="k=v")
        worker = muster.Worker("py/plain", "jobs", **connect)
        running = asyncio.ensure_future(worker.run(handle, handle_signals=False))
        while len(seen) < 3:
            await asyncio.sleep(0.01)
        info = await client.task_get(plain)
        assert (await client.task_get(given)).traceparent == explicit
        worker.shutdown()
        await running
    print(json.dumps({"seen": sorted(seen, key=str), "plain": info.traceparent}))

asyncio.run(asyncio.wait_for(main(), 30))
"""


def test_the_sdk_works_without_opentelemetry(daemon: Daemon) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_OTEL, json.dumps(daemon.connect)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    explicit = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert out["plain"] is None
    assert sorted(out["seen"], key=str) == sorted(
        [[None, None], [None, None], [explicit, "k=v"]], key=str
    )
