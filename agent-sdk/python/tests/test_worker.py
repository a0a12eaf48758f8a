"""``Worker`` in this process against a real daemon: outcomes, progress, cancellation,
lost leases (revoked, or renewals cut off), blocking handlers, drain (by the worker or
an operator), a daemon restart, labels, and the blocking ``muster.sync.Worker``."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any, Awaitable, Callable, Dict, List, Tuple

import muster
import muster.sync
import pytest
from conftest import Daemon, Relay, run


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


def test_a_worker_started_before_its_queue_waits_for_it_and_says_so_once(
    daemon: Daemon, caplog: pytest.LogCaptureFixture
) -> None:
    async def handle(task: muster.Task) -> Any:
        return {"got": task.payload}

    def waited() -> int:
        return sum(
            1
            for r in caplog.records
            if r.name == "muster"
            and r.levelno == logging.WARNING
            and r.getMessage()
            == "the queue does not exist; waiting for it to be created queue=jobs"
        )

    async def body() -> None:
        # Started before queue jobs exists (an agent brought up first): it waits.
        worker, running = start(daemon, handle, member="py/early")

        async def warned() -> bool:
            return waited() == 1

        await until(warned)
        assert not running.done()
        async with await muster.Client.connect(**daemon.connect) as client:
            await client.queue_create("jobs")
            [task_id] = await client.enqueue_many("jobs", [{"n": 1}])
            done = (await client.wait([task_id], 20)).finished
            assert [(t.state, t.result) for t in done] == [("done", {"got": {"n": 1}})]
        await stop(worker, running)
        assert waited() == 1

    with caplog.at_level(logging.WARNING, logger="muster"):
        run(body())


def test_a_daemon_killed_and_restarted_under_a_running_handler_loses_nothing(
    daemon: Daemon,
) -> None:
    # As the Rust SDK's a_daemon_restart_does_not_take_work_away_from_a_working_agent:
    # the worker reconnects, resumes its session with the lease it holds, and the
    # handler's ack settles the task once, on its first delivery.
    async def body() -> None:
        started: List[int] = []
        finish = asyncio.Event()

        async def handle(task: muster.Task) -> str:
            started.append(task.attempt)
            await finish.wait()
            return "ok"

        async with await muster.Client.connect(**daemon.connect) as client:
            await client.queue_create("jobs", lease=30)
            task_id = await client.enqueue("jobs", {"n": 1})
        worker, running = start(daemon, handle, member="py/steady")
        await until(lambda: asyncio.sleep(0, started == [1]))

        def restart() -> None:
            daemon.kill9()
            daemon.start()

        await asyncio.get_running_loop().run_in_executor(None, restart)
        finish.set()
        async with await muster.Client.connect(**daemon.connect) as client:
            (t,) = (await client.wait(task_id, 60)).finished
            assert (t.state, t.result, t.deliveries, t.failures) == ("done", "ok", 1, 0)
            assert [e.event for e in t.history] == ["enqueued", "leased", "done"]
            assert started == [1]
            await stop(worker, running)

    run(body())


def test_an_operator_drain_lets_the_running_task_finish_and_ends_run(daemon: Daemon) -> None:
    async def body() -> None:
        began = asyncio.Event()

        async def handle(task: muster.Task) -> str:
            began.set()
            await task.draining()
            return "finished while draining"

        async with await muster.Client.connect(**daemon.connect) as client:
            await client.queue_create("jobs")
            first = await client.enqueue("jobs", 1)
            worker, running = start(daemon, handle, member="py/drained", grace=10)
            await asyncio.wait_for(began.wait(), 10)
            assert (await client.member_drain("py/drained")).draining
            # run returns by itself, with nothing left to settle.
            await asyncio.wait_for(running, 30)
            done = await client.task_get(first)
            assert (done.state, done.result, done.deliveries) == (
                "done",
                "finished while draining",
                1,
            )
            second = await client.enqueue("jobs", 2)
            assert (await client.task_get(second)).state == "ready"
            # The session is closed; the daemon keeps the member's drain (until
            # member_undrain), so the name gets no work.
            (member,) = await client.member_list()
            assert (member.name, member.connected, member.leased, member.draining) == (
                "py/drained",
                False,
                0,
                True,
            )

    run(body())


def test_a_lease_whose_renewals_stop_arriving_stops_its_handler_before_it_lapses(
    daemon: Daemon,
) -> None:
    # The worker reaches the daemon through a relay that is cut: renewals stop
    # arriving. By its own clock the worker cancels the handler before the daemon's
    # deadline (renewal send time + lease), then the daemon lapses the lease; healed,
    # the worker gets the task again and finishes it. Two seconds: a renewal must be
    # confirmed within a third of the lease less the margins (about 450 ms), which a
    # busy two-core machine running the relay in Python does not always meet at 1 s.
    lease = 2.0

    async def body() -> None:
        relay = Relay(daemon.addr)
        cancelled_at: List[float] = []
        attempts: List[int] = []

        async def handle(task: muster.Task) -> str:
            attempts.append(task.attempt)
            if task.attempt == 1:
                try:
                    await asyncio.sleep(60)
                except asyncio.CancelledError:
                    cancelled_at.append(time.monotonic())
                    raise
            return f"attempt {task.attempt}"

        try:
            async with await muster.Client.connect(**daemon.connect) as client:
                await client.queue_create("jobs", lease=lease)
                task_id = await client.enqueue("jobs", "work")
                worker = muster.Worker("py/cut", "jobs", addr=relay.addr, data=str(daemon.data))
                running = asyncio.ensure_future(worker.run(handle, handle_signals=False))
                await until(lambda: asyncio.sleep(0, attempts == [1]))
                # Two renewals' worth of leasing first: the lease is kept alive by them.
                await asyncio.sleep(2 * lease)
                assert (await client.task_get(task_id)).state == "leased"
                relay.cut = True
                cut_at = time.monotonic()

                async def lapsed() -> bool:
                    history = (await client.task_get(task_id)).history
                    return any(e.event == "lapsed" for e in history)

                await until(lapsed)
                assert cancelled_at, "the handler ran on after the daemon lapsed its lease"
                assert cancelled_at[0] - cut_at < lease
                relay.cut = False
                (done,) = (await client.wait(task_id, 30)).finished
                assert done.state == "done" and done.result == f"attempt {attempts[-1]}"
                assert attempts[0] == 1 and attempts[-1] >= 2
                # Each lapse is a failure (a push lost to the cut may lapse once more).
                assert done.failures == done.deliveries - 1 >= 1
                assert [e.event for e in done.history].count("done") == 1
                await stop(worker, running)
        finally:
            relay.close()

    run(body())


def test_labelled_tasks_go_only_to_a_worker_with_the_labels(daemon: Daemon) -> None:
    def named(name: str) -> muster.Handler:
        async def handle(task: muster.Task) -> str:
            return name

        return handle

    async def body() -> None:
        async with await muster.Client.connect(**daemon.connect) as client:
            await client.queue_create("jobs")

            async def connected(*members: str) -> bool:
                up = {m.name for m in await client.member_list() if m.connected and m.subscribed}
                return up >= set(members)

            plain, plain_running = start(daemon, named("plain"), member="py/plain", capacity=4)
            await until(lambda: connected("py/plain"))
            tasks = [muster.NewTask(n, requires=["gpu"]) for n in range(6)]
            ids = await client.enqueue_many("jobs", tasks)

            async def unclaimable() -> bool:
                return (await client.queue_describe("jobs")).unclaimable == 6

            await until(unclaimable)
            gpu, gpu_running = start(
                daemon, named("gpu"), member="py/gpu", labels=["gpu", "cuda"], capacity=2
            )
            finished = (await client.wait(ids, 20)).finished
            assert [t.result for t in finished] == ["gpu"] * 6
            labels = {m.name: sorted(m.labels) for m in await client.member_list()}
            assert labels == {"py/gpu": ["cuda", "gpu"], "py/plain": []}
            await stop(plain, plain_running)
            await stop(gpu, gpu_running)

    run(body())


def test_the_sync_worker_runs_tasks_until_shut_down(daemon: Daemon) -> None:
    def handle(task: muster.Task) -> Dict[str, Any]:
        return {"double": task.payload * 2}

    worker = muster.sync.Worker("py/sync", "jobs", **daemon.connect)
    with muster.sync.Client.connect(**daemon.connect) as client:
        client.queue_create("jobs")
        ids = client.enqueue_many("jobs", [1, 2])
        # Signals are the main thread's: this one runs without them.
        thread = threading.Thread(
            target=worker.run, args=(handle,), kwargs={"handle_signals": False}
        )
        thread.start()
        finished = client.wait(ids, 20).finished
        assert sorted(t.result["double"] for t in finished) == [2, 4]
        assert all((t.state, t.deliveries) == ("done", 1) for t in finished)
        worker.shutdown()
        thread.join(30)
        assert not thread.is_alive()
        assert client.member_list() == []
