"""Suspended tasks from Python against a real daemon: a handler that asks and is resumed
with an answer, a token that resumes once, and a timeout that fails the task."""

from __future__ import annotations

import asyncio
import re
from typing import Any, Dict, List, Tuple

import muster
from conftest import Daemon, run


def start(
    daemon: Daemon, handler: muster.Handler, **options: Any
) -> Tuple[muster.Worker, asyncio.Future[None]]:
    """A worker on queue ``jobs`` running in the background of the test's loop."""
    worker = muster.Worker("py/approver", "jobs", **daemon.connect, **options)
    return worker, asyncio.ensure_future(worker.run(handler, handle_signals=False))


def test_a_handler_asks_frees_its_slot_and_runs_again_with_the_answer(daemon: Daemon) -> None:
    async def body() -> None:
        # Made inside the test's loop: before Python 3.10 a queue or an event binds to
        # the event loop current when it is made.
        tokens: asyncio.Queue[str] = asyncio.Queue()
        answers: Dict[str, Any] = {}
        refused: List[str] = []

        async def handle(task: muster.Task) -> Any:
            if task.payload == "merge" and task.resumed is None:
                try:
                    await task.suspend("may I merge?", on_timeout="later")  # type: ignore[arg-type]
                except muster.InvalidInput as e:
                    refused.append(str(e))
                asked = await task.suspend("may I merge?", timeout=3600, on_timeout="cancel")
                assert asked.state == "suspended" and asked.resume_token is not None
                await tokens.put(asked.resume_token)
                return "ignored: the suspend came first"
            answers[task.id] = task.resumed
            return {"merged": task.resumed is not None}

        async with await muster.Client.connect(**daemon.connect) as client:
            await client.queue_create("jobs")
            merge, other = await client.enqueue_many(
                "jobs", [muster.NewTask("merge"), muster.NewTask("other")]
            )
            # Capacity one: "other" runs only because "merge" gave its slot back.
            worker, running = start(daemon, handle, capacity=1)
            token = await asyncio.wait_for(tokens.get(), 20)
            (done,) = (await client.wait(other, 20)).finished
            assert done.state == "done"
            info = await client.task_get(merge)
            assert (info.state, info.failures, info.deliveries) == ("suspended", 0, 1)
            assert info.suspension is not None
            assert (info.suspension.reason, info.suspension.member, info.suspension.on_timeout) == (
                "may I merge?",
                "py/approver",
                "cancel",
            )
            assert (await client.queue_describe("jobs")).suspended == 1
            resumed = await client.resume(token, {"approved": True})
            assert resumed == muster.ResumeResult(merge, "ready")
            try:
                await client.resume(token)
                raise AssertionError("a token resumes once")
            except muster.StaleToken as e:
                assert e.code == "stale_token"
            (finished,) = (await client.wait(merge, 20)).finished
            assert (finished.state, finished.result, finished.failures) == (
                "done",
                {"merged": True},
                0,
            )
            seen = answers[merge]
            assert isinstance(seen, muster.Resumed)
            assert (seen.data, seen.timed_out) == ({"approved": True}, False)
            assert [e.event for e in finished.history] == [
                "enqueued",
                "leased",
                "suspended",
                "resumed",
                "leased",
                "done",
            ]
            assert refused == ['on_timeout "later" is not resume, fail or cancel']
            worker.shutdown()
            await asyncio.wait_for(running, 30)

    run(body())


def test_a_suspension_that_times_out_fails_its_task_and_an_approver_resumes_by_id(
    daemon: Daemon,
) -> None:
    async def body() -> None:
        async with await muster.Client.connect(**daemon.connect) as client:
            await client.queue_create("jobs")
            late, kept = await client.enqueue_many(
                "jobs", [muster.NewTask("late"), muster.NewTask("kept")]
            )
            first, second = await client.claim("jobs", max=2, member="puller")
            suspended = await client.suspend(first, "waiting for the export", timeout=0.3)
            assert suspended.state == "suspended"
            await client.suspend(second, "waiting for a person")
            (dead,) = (await client.wait(late, 20)).finished
            assert (dead.state, dead.dead_reason, dead.failures) == ("dead", "suspend_timed_out", 0)
            # How long it waited by the daemon's wall clock: the timeout, or a few ms more
            # when its timer fired late (a loaded machine).
            waited = re.fullmatch(r"suspension timed out after (\d+) ms", dead.last_error or "")
            assert waited is not None, dead.last_error
            assert 300 <= int(waited.group(1)) < 20_000
            assert (await client.resume_task(kept, [1, 2])).state == "ready"
            try:
                await client.resume_task(kept)
                raise AssertionError("only a suspended task resumes")
            except muster.InvalidState as e:
                assert e.code == "invalid_state"
            (again,) = await client.claim("jobs", member="puller")
            assert again.id == kept
            assert again.resumed is not None
            assert (again.resumed.data, again.resumed.timed_out) == ([1, 2], False)

    run(body())
