"""Child tasks from Python against a real daemon: a planner that waits for its children
on a worker of one slot and sums their results, a spawn that keeps the lease and
answers a key spawned before with the same child, a pulled parent spawning through the
client, and spawns the daemon refuses, which store nothing."""

from __future__ import annotations

import asyncio
from typing import Any, Dict, List, Optional, Tuple

import muster
import pytest
from conftest import Daemon, run


def start(
    daemon: Daemon, queues: List[str], handler: muster.Handler, **options: Any
) -> Tuple[muster.Worker, asyncio.Future[None]]:
    """A worker on ``queues`` running in the background of the test's loop."""
    worker = muster.Worker("py/planner", queues, **daemon.connect, **options)
    return worker, asyncio.ensure_future(worker.run(handler, handle_signals=False))


def events(info: muster.TaskInfo) -> List[str]:
    """The events of a task's timeline, in order."""
    return [e.event for e in info.history]


def test_a_planner_waits_for_its_children_on_one_slot_and_sums_their_results(
    daemon: Daemon,
) -> None:
    async def body() -> None:
        # Made inside the test's loop: before Python 3.10 a queue or an event binds to
        # the event loop current when it is made.
        spawned: asyncio.Queue[muster.Spawned] = asyncio.Queue()
        counting: asyncio.Queue[str] = asyncio.Queue()
        counted = asyncio.Event()
        parents: Dict[str, Optional[str]] = {}
        planned: List[List[muster.ChildOutcome]] = []

        async def handle(task: muster.Task) -> Any:
            parents[task.id] = task.parent
            if task.queue == "count":
                await counting.put(task.id)
                await counted.wait()
                return task.payload * 10
            planned.append(task.children)
            if task.resumed is None:
                parts = [muster.Child(f"part-{n}", "count", n) for n in task.payload]
                await spawned.put(
                    await task.spawn_and_wait(parts, "counting the parts", timeout=600)
                )
                return "ignored: the planner waits for its children"
            return sum(child.result for child in task.children)

        async with await muster.Client.connect(**daemon.connect) as client:
            await client.queue_create("plan")
            await client.queue_create("count")
            plan = await client.enqueue("plan", [1, 2, 3])
            # One slot: the children run only because their waiting parent holds none.
            worker, running = start(daemon, ["plan", "count"], handle, capacity=1)
            reply = await asyncio.wait_for(spawned.get(), 20)
            assert reply.state == "suspended"
            assert reply.resume_token is not None and reply.timeout_at_ms is not None
            assert [(c.child_key, c.duplicate, c.state) for c in reply.children] == [
                ("part-1", False, "ready"),
                ("part-2", False, "ready"),
                ("part-3", False, "ready"),
            ]
            ids = [c.id for c in reply.children]
            # The first child is in its handler, the others wait for the one slot.
            assert await asyncio.wait_for(counting.get(), 20) == ids[0]
            waiting = await client.task_get(plan)
            assert (waiting.state, waiting.lease, waiting.deliveries) == ("suspended", None, 1)
            assert waiting.suspension is not None
            assert (
                waiting.suspension.reason,
                waiting.suspension.children,
                waiting.suspension.on_timeout,
            ) == ("counting the parts", True, "fail")
            assert waiting.children == [
                muster.ChildSummary(ids[0], "part-1", "count", "leased", 0),
                muster.ChildSummary(ids[1], "part-2", "count", "ready", 0),
                muster.ChildSummary(ids[2], "part-3", "count", "ready", 0),
            ]
            assert [t.id for t in (await client.task_list("plan", "suspended")).tasks] == [plan]
            child = await client.task_get(ids[1])
            assert (child.parent, child.child_key, child.children, child.payload) == (
                plan,
                "part-2",
                [],
                2,
            )
            counted.set()
            (finished,) = (await client.wait(plan, 30)).finished
            assert (finished.state, finished.result, finished.failures, finished.deliveries) == (
                "done",
                60,
                0,
                2,
            )
            assert (finished.parent, finished.child_key) == (None, None)
            assert finished.children == [
                muster.ChildSummary(ids[0], "part-1", "count", "done", 0),
                muster.ChildSummary(ids[1], "part-2", "count", "done", 0),
                muster.ChildSummary(ids[2], "part-3", "count", "done", 0),
            ]
            assert finished.resumed is not None
            assert (finished.resumed.by, finished.resumed.timed_out) == ("", False)
            assert events(finished) == [
                "enqueued",
                "leased",
                "spawned",
                "suspended",
                "children_finished",
                "leased",
                "done",
            ]
            # The planner's first run had no children; its second, their outcomes.
            assert planned == [
                [],
                [
                    muster.ChildOutcome(ids[0], "part-1", "count", "done", 10, None, False),
                    muster.ChildOutcome(ids[1], "part-2", "count", "done", 20, None, False),
                    muster.ChildOutcome(ids[2], "part-3", "count", "done", 30, None, False),
                ],
            ]
            assert finished.resumed.children == planned[1]
            assert parents == {plan: None, ids[0]: plan, ids[1]: plan, ids[2]: plan}
            worker.shutdown()
            await asyncio.wait_for(running, 30)

    run(body())


def test_spawn_keeps_the_lease_and_a_key_spawned_again_answers_the_same_child(
    daemon: Daemon,
) -> None:
    async def body() -> None:
        # Made inside the test's loop: before Python 3.10 a queue or an event binds to
        # the event loop current when it is made.
        replies: asyncio.Queue[Tuple[List[muster.SpawnedChild], List[muster.SpawnedChild]]] = (
            asyncio.Queue()
        )

        async def handle(task: muster.Task) -> Any:
            first = await task.spawn(
                [
                    muster.Child("a", "side", {"n": 1}),
                    muster.Child("b", "side", {"n": 2}, priority=7, key="k", requires=["gpu"]),
                ]
            )
            again = await task.spawn(
                [
                    muster.Child("a", "side", {"n": 99}),
                    muster.Child("b", "side", {"n": 2}),
                    muster.Child("c", "side", b'{"n": 3}'),
                ]
            )
            await replies.put((first, again))
            return {"spawned": len(again)}

        async with await muster.Client.connect(**daemon.connect) as client:
            await client.queue_create("jobs")
            await client.queue_create("side")
            parent = await client.enqueue("jobs", "fan out")
            worker, running = start(daemon, ["jobs"], handle)
            first, again = await asyncio.wait_for(replies.get(), 20)
            assert [(c.child_key, c.duplicate, c.state) for c in first] == [
                ("a", False, "ready"),
                ("b", False, "ready"),
            ]
            a, b = (c.id for c in first)
            assert [(c.child_key, c.id, c.duplicate, c.state) for c in again[:2]] == [
                ("a", a, True, "ready"),
                ("b", b, True, "ready"),
            ]
            assert (again[2].child_key, again[2].duplicate, again[2].state) == ("c", False, "ready")
            c = again[2].id
            assert len({a, b, c}) == 3
            (finished,) = (await client.wait(parent, 20)).finished
            assert (finished.state, finished.result) == ("done", {"spawned": 3})
            assert events(finished) == ["enqueued", "leased", "spawned", "spawned", "done"]
            assert finished.children == [
                muster.ChildSummary(a, "a", "side", "ready", 0),
                muster.ChildSummary(b, "b", "side", "ready", 0),
                muster.ChildSummary(c, "c", "side", "ready", 0),
            ]
            # The key spawned again enqueued nothing: the first child stands as spawned.
            child_a, child_b, child_c = [await client.task_get(i) for i in (a, b, c)]
            assert (child_a.payload, child_a.parent, child_a.child_key) == ({"n": 1}, parent, "a")
            assert (child_b.priority, child_b.key, child_b.requires) == (7, "k", ["gpu"])
            assert (child_c.payload, child_c.child_key, child_c.idempotency_key) == (
                {"n": 3},
                "c",
                None,
            )
            side = await client.queue_describe("side")
            assert (side.ready, side.totals.enqueued) == (3, 3)
            worker.shutdown()
            await asyncio.wait_for(running, 30)

    run(body())


def test_a_pulled_parent_spawns_through_the_client_and_its_next_claim_sees_the_outcomes(
    daemon: Daemon,
) -> None:
    async def body() -> None:
        async with await muster.Client.connect(**daemon.connect) as client:
            await client.queue_create("plan")
            await client.queue_create("count")
            plan = await client.enqueue("plan", "two parts")
            (claim,) = await client.claim("plan", member="puller")
            assert claim.parent is None
            with pytest.raises(muster.InvalidInput, match="give them with wait=True"):
                await client.spawn(claim, [muster.Child("x", "count", 0)], reason="no wait")
            spawned = await client.spawn(
                claim,
                [muster.Child("good", "count", 1), muster.Child("bad", "count", 2)],
                wait=True,
            )
            assert (spawned.state, [c.child_key for c in spawned.children]) == (
                "suspended",
                ["good", "bad"],
            )
            good, bad = (c.id for c in spawned.children)
            waiting = await client.task_get(plan)
            assert waiting.suspension is not None
            assert (waiting.state, waiting.suspension.reason, waiting.suspension.children) == (
                "suspended",
                "waiting for its children",
                True,
            )
            first, second = await client.claim("count", max=2, member="puller")
            assert [(t.id, t.parent) for t in (first, second)] == [(good, plan), (bad, plan)]
            await client.ack(first, {"counted": 1})
            await client.dead_letter(second, "no such part")
            (again,) = await client.claim("plan", member="puller", wait=20)
            assert (again.id, again.parent) == (plan, None)
            assert again.resumed is not None
            assert again.resumed.children == [
                muster.ChildOutcome(good, "good", "count", "done", {"counted": 1}, None, False),
                muster.ChildOutcome(bad, "bad", "count", "dead", None, "no such part", False),
            ]
            # An earlier holder's key: the same child again, nothing enqueued.
            (seen,) = (await client.spawn(again, [muster.Child("good", "count", 1)])).children
            assert (seen.id, seen.duplicate, seen.state) == (good, True, "done")
            assert (await client.ack(again, "partly counted")).state == "done"

    run(body())


def test_cancelling_a_waiting_parent_cancels_its_unfinished_children(daemon: Daemon) -> None:
    async def body() -> None:
        async with await muster.Client.connect(**daemon.connect) as client:
            await client.queue_create("plan")
            await client.queue_create("count")
            plan = await client.enqueue("plan", "three parts")
            (claim,) = await client.claim("plan", member="puller")
            spawned = await client.spawn(
                claim,
                [muster.Child(f"part-{n}", "count", n) for n in range(3)],
                wait=True,
                reason="counting",
                timeout=600,
                on_timeout="cancel",
            )
            ids = [c.id for c in spawned.children]
            (held,) = await client.claim("count", member="puller")
            assert held.id == ids[0]
            await client.ack(held, 0)
            assert (await client.cancel(plan)).state == "cancelled"
            finished = (await client.wait(ids, 20)).finished
            assert {t.id: t.state for t in finished} == {
                ids[0]: "done",
                ids[1]: "cancelled",
                ids[2]: "cancelled",
            }
            assert [(c.child_key, c.state) for c in (await client.task_get(plan)).children] == [
                ("part-0", "done"),
                ("part-1", "cancelled"),
                ("part-2", "cancelled"),
            ]

    run(body())


def test_a_refused_spawn_raises_the_daemons_error_and_stores_nothing(daemon: Daemon) -> None:
    async def body() -> None:
        # Made inside the test's loop: before Python 3.10 a queue or an event binds to
        # the event loop current when it is made.
        refusals: asyncio.Queue[List[Tuple[str, Optional[str], str]]] = asyncio.Queue()

        async def handle(task: muster.Task) -> Any:
            seen: List[Tuple[str, Optional[str], str]] = []
            attempts = [
                lambda: task.spawn([muster.Child("", "side", 1)]),
                lambda: task.spawn(
                    [muster.Child("kept", "side", 1), muster.Child("lost", "nowhere", 2)]
                ),
                lambda: task.spawn(
                    [muster.Child("twice", "side", 1), muster.Child("twice", "side", 2)]
                ),
                lambda: task.spawn_and_wait([muster.Child("", "side", 1)], "never waits"),
                lambda: task.spawn_and_wait([], "never waits", on_timeout="later"),  # type: ignore[arg-type]
                lambda: task.spawn(["not a child"]),  # type: ignore[list-item]
            ]
            for attempt in attempts:
                try:
                    await attempt()
                    seen.append(("spawned", None, ""))
                except muster.MusterError as e:
                    seen.append((type(e).__name__, getattr(e, "code", None), str(e)))
            await refusals.put(seen)
            # Every spawn was refused: the lease is still held, and this return settles it.
            return "still held"

        async with await muster.Client.connect(**daemon.connect) as client:
            await client.queue_create("jobs")
            await client.queue_create("side")
            parent = await client.enqueue("jobs", "fan out")
            worker, running = start(daemon, ["jobs"], handle)
            seen = await asyncio.wait_for(refusals.get(), 20)
            empty_key = (
                "BadRequest",
                "bad_request",
                'bad_request: child 0: invalid child key "": want 1 to 128 bytes without'
                " control characters",
            )
            assert seen == [
                empty_key,
                ("NotFound", "not_found", 'not_found: no queue "nowhere"'),
                (
                    "BadRequest",
                    "bad_request",
                    'bad_request: child 1: child key "twice" is given twice',
                ),
                empty_key,
                ("InvalidInput", None, 'on_timeout "later" is not resume, fail or cancel'),
                ("InvalidInput", None, "a child to spawn is a muster.Child, not 'not a child'"),
            ]
            (finished,) = (await client.wait(parent, 20)).finished
            assert (finished.state, finished.result, finished.children) == (
                "done",
                "still held",
                [],
            )
            assert events(finished) == ["enqueued", "leased", "done"]
            worker.shutdown()
            await asyncio.wait_for(running, 30)

            # The client's spawn, refused as well, leaves the pulled task leased.
            other = await client.enqueue("jobs", "pulled")
            (claim,) = await client.claim("jobs", member="puller")
            with pytest.raises(muster.NotFound) as lost:
                await client.spawn(claim, [muster.Child("x", "nowhere", 1)], wait=True)
            assert lost.value.code == "not_found"
            with pytest.raises(muster.BadRequest) as empty:
                await client.spawn(claim, [])
            assert str(empty.value) == (
                "bad_request: a spawn names children, or waits for them, or both"
            )
            info = await client.task_get(other)
            assert (info.state, info.children, info.suspension) == ("leased", [], None)
            side = await client.queue_describe("side")
            assert (side.ready, side.totals.enqueued) == (0, 0)

    run(body())
