"""``Worker`` in this process against a real daemon: outcomes, progress, cancellation,
lost leases, blocking handlers, drain."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any, Awaitable, Callable, Dict, List, Tuple

import muster
import pytest
from conftest import Daemon, run


def start(
    daemon: Daemon, handler: muster.Handler, member: str = "py/w1", **options: Any
) -> Tuple[muster.Worker, asyncio.Future[None]]:
    """A worker on queue ``jobs`` running in the background of the test's loop."""
    worker = muster.Worker(member, "jobs", **daemon.connect, **options)
    return worker, asyncio.ensure_future(worker.run(handler, handle_signals=False))


async def stop(worker: muster.Worker, running: asyncio.Future[None]) -> None:
    """Drains the worker and waits for it."""
    worker.shutdown()
    await asyncio.wait_for(running, 30)


async def until(check: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    """Polls ``check`` until it holds; fails after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def test_outcomes_settle_tasks(daemon: Daemon) -> None:
    async def handle(task: muster.Task) -> Any:
        kind = task.payload["kind"]
        if kind == "ok":
            return {"echo": task.payload, "attempt": task.attempt, "queue": task.queue}
        if kind == "none":
            return None
        if kind == "raw":
            return b'{"raw" : true}'
        if kind == "fail":
            raise ValueError("bad input")
        if kind == "retry":
            raise muster.Retry("upstream busy", delay=3600)
        if kind == "dead":
            raise muster.DeadLetter("schema v1 is gone")
        if kind == "long-error":
            raise RuntimeError("x" * 20_000)
        if kind == "bad-result":
            return {"not json": object()}
        raise AssertionError(kind)

    async def body() -> None:
        async with await muster.Client.connect(**daemon.connect) as client:
            await client.queue_create("jobs", max_attempts=5)
            kinds = ["ok", "none", "raw", "fail", "retry", "dead", "long-error", "bad-result"]
            ids = dict(zip(kinds, await client.enqueue_many("jobs", [{"kind": k} for k in kinds])))
            worker, running = start(daemon, handle, capacity=4)

            done = (
                await client.wait([ids["ok"], ids["none"], ids["raw"], ids["dead"]], 20)
            ).finished
            by_id = {t.id: t for t in done}
            ok = by_id[ids["ok"]]
            assert (ok.state, ok.result) == (
                "done",
                {"echo": {"kind": "ok"}, "attempt": 1, "queue": "jobs"},
            )
            assert (by_id[ids["none"]].state, by_id[ids["none"]].result) == ("done", None)
            assert by_id[ids["raw"]].result == {"raw": True}
            dead = by_id[ids["dead"]]
            assert (dead.state, dead.dead_reason, dead.last_error) == (
                "dead",
                "dead_lettered",
                "schema v1 is gone",
            )
            assert dead.failures == 0

            async def failed() -> bool:
                kinds = ["fail", "retry", "long-error", "bad-result"]
                tasks = [await client.task_get(ids[k]) for k in kinds]
                return all(t.failures == 1 for t in tasks)

            await until(failed)
            fail = await client.task_get(ids["fail"])
            assert fail.last_error == "ValueError: bad input"
            retry = await client.task_get(ids["retry"])
            assert (retry.state, retry.last_error) == ("scheduled", "upstream busy")
            assert retry.not_before_ms is not None
            assert retry.not_before_ms > (time.time() + 3500) * 1000
            long_error = (await client.task_get(ids["long-error"])).last_error
            assert long_error is not None and long_error.startswith("RuntimeError: xxx")
            assert len(long_error) == 8192
            bad = (await client.task_get(ids["bad-result"])).last_error
            assert bad is not None and "result" in bad and "not JSON-serialisable" in bad
            await stop(worker, running)

    run(body())


def test_sync_handlers_run_in_a_thread_pool(daemon: Daemon) -> None:
    loop_thread = threading.get_ident()

    def handle(task: muster.Task) -> Dict[str, Any]:
        assert threading.get_ident() != loop_thread
        task.set_progress_nowait({"seen": task.payload})
        if task.payload == "fail":
            raise KeyError("missing")
        return {"thread": threading.current_thread().name, "progress": task.progress}

    async def body() -> None:
        async with await muster.Client.connect(**daemon.connect) as client:
            await client.queue_create("jobs")
            ok, fail = await client.enqueue_many("jobs", ["ok", "fail"])
            worker, running = start(daemon, handle, capacity=2)
            (done,) = (await client.wait(ok, 20)).finished
            assert done.result["thread"].startswith("muster-handler")
            assert done.result["progress"] == {"seen": "ok"}

            async def failed() -> bool:
                return (await client.task_get(fail)).failures == 1

            await until(failed)
            assert (await client.task_get(fail)).last_error == "KeyError: 'missing'"
            await stop(worker, running)

    run(body())


def test_progress_is_stored_while_the_handler_runs(daemon: Daemon) -> None:
    seen: List[Any] = []

    async def body() -> None:
        # Made on the test's loop: before 3.10 an Event binds the loop current when it
        # is made.
        proceed = asyncio.Event()

        async def handle(task: muster.Task) -> str:
            seen.append(task.progress)
            await task.set_progress({"step": 1})
            seen.append(task.progress)
            await proceed.wait()
            return "finished"

        async with await muster.Client.connect(**daemon.connect) as client:
            await client.queue_create("jobs")
            task_id = await client.enqueue("jobs", "work")
            worker, running = start(daemon, handle)

            async def stored() -> bool:
                return (await client.task_get(task_id)).progress == {"step": 1}

            await until(stored, timeout=5)
            assert seen == [None, {"step": 1}]
            proceed.set()
            (done,) = (await client.wait(task_id, 10)).finished
            assert (done.state, done.result, done.progress) == ("done", "finished", {"step": 1})
            await stop(worker, running)

    run(body())


def test_cancel_reaches_the_handler_within_100_ms(daemon: Daemon) -> None:
    started: Dict[str, asyncio.Event] = {}
    cancelled_at: Dict[str, float] = {}

    async def handle(task: muster.Task) -> None:
        started[task.id].set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled_at[task.id] = time.monotonic()
            raise

    async def body() -> None:
        async with await muster.Client.connect(**daemon.connect) as client:
            await client.queue_create("jobs")
            ids = await client.enqueue_many("jobs", [1, 2, 3])
            for task_id in ids:
                started[task_id] = asyncio.Event()
            worker, running = start(daemon, handle, capacity=3)
            for task_id in ids:
                await asyncio.wait_for(started[task_id].wait(), 10)
                before = time.monotonic()
                assert (await client.cancel(task_id)).cancel_requested
                (finished,) = (await client.wait(task_id, 10)).finished
                assert (finished.state, finished.failures) == ("cancelled", 0)
                delay = cancelled_at[task_id] - before
                assert 0 <= delay < 0.1, f"the handler saw the cancel after {delay * 1000:.1f} ms"
            await stop(worker, running)

    run(body())


def test_a_lost_lease_cancels_the_handler(daemon: Daemon) -> None:
    async def body() -> None:
        first_cancelled = asyncio.Event()  # on the test's loop, as above

        async def handle(task: muster.Task) -> str:
            if task.attempt == 1:
                try:
                    await asyncio.sleep(60)
                except asyncio.CancelledError:
                    first_cancelled.set()
                    raise
            return f"attempt {task.attempt}"

        async with await muster.Client.connect(**daemon.connect) as client:
            await client.queue_create("jobs")
            task_id = await client.enqueue("jobs", "work")
            worker, running = start(daemon, handle)

            async def leased() -> bool:
                return (await client.task_get(task_id)).state == "leased"

            await until(leased)
            assert (await client.lease_revoke(task_id)).state == "ready"
            await asyncio.wait_for(first_cancelled.wait(), 5)
            # The revoked lease is gone: the member gets the task again as a new delivery.
            (done,) = (await client.wait(task_id, 20)).finished
            assert (done.state, done.result, done.failures, done.deliveries) == (
                "done",
                "attempt 2",
                1,
                2,
            )
            await stop(worker, running)

    run(body())


def test_a_blocking_sync_handler_does_not_delay_other_leases(daemon: Daemon) -> None:
    def handle(task: muster.Task) -> str:
        end = time.monotonic() + 5
        if task.payload == "sleep":
            time.sleep(5)
        elif task.payload == "spin":
            n = 0
            while time.monotonic() < end:  # pure Python: holds the GIL but for switches
                n += 1
        else:
            while time.monotonic() < end:
                time.sleep(0.05)
        return task.payload

    async def body() -> None:
        async with await muster.Client.connect(**daemon.connect) as client:
            # Renewed every third of a second: a renewal held up for 5 s would let
            # every lease lapse.
            await client.queue_create("jobs", lease=1)
            ids = await client.enqueue_many("jobs", ["sleep", "spin", "steps"])
            worker, running = start(daemon, handle, capacity=3)
            gaps: List[float] = []
            last = time.monotonic()
            waiting = asyncio.ensure_future(client.wait(ids, 30))
            while not waiting.done():
                await asyncio.sleep(0.02)
                now = time.monotonic()
                gaps.append(now - last)
                last = now
            finished = waiting.result().finished
            assert len(finished) == 3
            for task in finished:
                assert (task.state, task.deliveries, task.failures) == ("done", 1, 0), task
            # The event loop went on too (the handlers ran in threads).
            assert max(gaps) < 0.5
            await stop(worker, running)

    run(body())


def test_shutdown_drains_and_releases_unfinished_tasks(daemon: Daemon) -> None:
    began: List[str] = []
    cancelled: List[str] = []

    async def handle(task: muster.Task) -> str:
        began.append(task.payload)
        if task.payload == "quick":
            await task.draining()
            assert task.is_draining
            return "finished while draining"
        await task.set_progress({"checkpoint": 3})
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append(task.payload)
            raise
        return "never"

    async def body() -> None:
        async with await muster.Client.connect(**daemon.connect) as client:
            await client.queue_create("jobs")
            quick, slow = await client.enqueue_many("jobs", ["quick", "slow"])
            worker, running = start(daemon, handle, capacity=2, grace=0.5)
            await until(lambda: asyncio.sleep(0, len(began) == 2))
            await stop(worker, running)
            assert cancelled == ["slow"]
            done = await client.task_get(quick)
            assert (done.state, done.result) == ("done", "finished while draining")
            released = await client.task_get(slow)
            assert (released.state, released.failures) == ("ready", 0)
            assert released.progress == {"checkpoint": 3}
            assert released.history[-1].event == "released"
            # Closed on the way out: the daemon forgot the member at once (no session,
            # no lease).
            assert await client.member_list() == []

    run(body())


def test_cancelling_run_drains_the_worker(daemon: Daemon) -> None:
    async def handle(task: muster.Task) -> None:
        await asyncio.sleep(60)

    async def body() -> None:
        async with await muster.Client.connect(**daemon.connect) as client:
            await client.queue_create("jobs")
            task_id = await client.enqueue("jobs", "work")
            worker, running = start(daemon, handle, grace=0.2)

            async def leased() -> bool:
                return (await client.task_get(task_id)).state == "leased"

            await until(leased)
            running.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(running, 30)
            task = await client.task_get(task_id)
            assert (task.state, task.failures) == ("ready", 0)

    run(body())


def test_session_refusals_end_run(daemon: Daemon) -> None:
    async def handle(task: muster.Task) -> None:
        await asyncio.sleep(60)

    async def body() -> None:
        async with await muster.Client.connect(**daemon.connect) as client:
            await client.queue_create("jobs")
        worker, running = start(daemon, handle, member="bad name!")
        with pytest.raises(muster.BadRequest):
            await asyncio.wait_for(running, 30)
        with pytest.raises(muster.InvalidInput):
            await worker.run(handle)

        first, first_running = start(daemon, handle, member="twin")
        async with await muster.Client.connect(**daemon.connect) as client:

            async def connected() -> bool:
                return any(m.connected for m in await client.member_list())

            await until(connected)
        second, second_running = start(daemon, handle, member="twin")
        with pytest.raises(muster.Replaced):
            await asyncio.wait_for(first_running, 30)
        await stop(second, second_running)

    run(body())


def test_sdk_warnings_reach_logging(daemon: Daemon, caplog: pytest.LogCaptureFixture) -> None:
    async def handle(task: muster.Task) -> None:
        raise AssertionError("no task expected")

    async def body() -> None:
        # A wrong pin: every connection attempt fails, and the worker says so and retries.
        worker = muster.Worker("py/lost", "jobs", addr=daemon.addr, pin="ab" * 32)
        running = asyncio.ensure_future(worker.run(handle, handle_signals=False))

        async def warned() -> bool:
            return any(
                r.name == "muster"
                and r.levelno == logging.WARNING
                and "cannot reach musterd" in r.getMessage()
                for r in caplog.records
            )

        await until(warned)
        await stop(worker, running)

    with caplog.at_level(logging.WARNING, logger="muster"):
        run(body())
