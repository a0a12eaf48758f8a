"""Flow control against a real daemon: limits (``limit_set``/``get``/``list``/``delete``),
tasks drawing on them, throttles (``Client.throttled``, ``Task.throttled``,
``Throttled``) and fair dispatch between groups."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from datetime import timedelta
from typing import Any, Dict, List, Tuple

import muster
import muster.sync
import pytest
from conftest import Daemon, run

HOUR_MS = 3_600_000


def start(
    daemon: Daemon, handler: muster.Handler, **options: Any
) -> Tuple[muster.Worker, asyncio.Future[None]]:
    """A worker on queue ``jobs`` running in the background of the test's loop."""
    worker = muster.Worker("py/limits", "jobs", **daemon.connect, **options)
    return worker, asyncio.ensure_future(worker.run(handler, handle_signals=False))


async def stop(worker: muster.Worker, running: asyncio.Future[None]) -> None:
    """Drains the worker and waits for it."""
    worker.shutdown()
    await asyncio.wait_for(running, 30)


def test_limits_are_set_read_listed_replaced_and_deleted(daemon: Daemon) -> None:
    async def body() -> None:
        async with await muster.Client.connect(**daemon.connect) as client:
            openai = await client.limit_set("openai", rate=(500, 60), concurrency=50)
            assert openai == muster.LimitInfo(
                name="openai",
                rate=muster.Rate(count=500, per_ms=60_000),
                burst=500,
                concurrency=50,
                per_key=False,
                held=0,
                waiting=0,
                granted=0,
                throttled=0,
                # A new limit's bucket starts empty: in use while it fills, full a
                # minute (500 tokens at 500 a minute) after its creation.
                keys_in_use=1,
                keys=[
                    muster.LimitKeyInfo(
                        key="",
                        tokens=0,
                        held=0,
                        waiting=0,
                        full_ms=openai.created_ms + 60_000,
                        throttled_until_ms=None,
                    )
                ],
                created_ms=openai.created_ms,
                updated_ms=openai.created_ms,
            )
            mail = await client.limit_set("mail", rate=muster.Rate(10, 1000), burst=25)
            assert (mail.rate, mail.burst, mail.concurrency, mail.per_key) == (
                muster.Rate(10, 1000),
                25,
                None,
                False,
            )
            gpu = await client.limit_set("gpu", concurrency=2, per_key=True)
            assert (gpu.rate, gpu.burst, gpu.concurrency, gpu.per_key) == (None, None, 2, True)
            slow = await client.limit_set("slow", rate=[3, timedelta(minutes=2)])
            assert (slow.rate, slow.burst) == (muster.Rate(3, 120_000), 3)

            # Read again later: the same, but for when the filling bucket is full, which
            # the daemon gives by the wall clock from its monotonic one (the two may
            # have drifted a millisecond apart meanwhile).
            def settled(info: muster.LimitInfo) -> muster.LimitInfo:
                full = info.keys[0].full_ms
                assert full is not None and abs(full - (openai.created_ms + 60_000)) <= 1
                return dataclasses.replace(info, keys=openai.keys)

            assert settled(await client.limit_get("openai")) == openai
            assert [x.name for x in await client.limit_list()] == ["gpu", "mail", "openai", "slow"]
            assert settled((await client.limit_list())[2]) == openai

            # Set again: every setting replaced, the creation time kept.
            replaced = await client.limit_set("openai", concurrency=5)
            assert (replaced.rate, replaced.burst, replaced.concurrency) == (None, None, 5)
            assert replaced.created_ms == openai.created_ms
            assert replaced.updated_ms >= openai.updated_ms
            assert await client.limit_get("openai") == replaced

            assert await client.limit_delete("mail") == 0
            with pytest.raises(muster.NotFound) as gone:
                await client.limit_get("mail")
            assert (gone.value.code, str(gone.value)) == ("not_found", "not_found: no limit mail")
            with pytest.raises(muster.NotFound):
                await client.limit_delete("mail")
            assert [x.name for x in await client.limit_list()] == ["gpu", "openai", "slow"]

            # Refusals: by the daemon, or before anything is sent.
            refused = {
                "a limit needs a rate, a concurrency, or both": {},
                "a burst needs a rate": {"burst": 5, "concurrency": 1},
                "a rate adds 1 to 1000000000 tokens every 1 to 86400000 ms, not 0 every 60000 ms": {
                    "rate": (0, 60)
                },
                "a rate adds 1 to 1000000000 tokens every 1 to 86400000 ms, not 1 every 0 ms": {
                    "rate": (1, 0)
                },
            }
            for message, settings in refused.items():
                with pytest.raises(muster.BadRequest) as bad:
                    await client.limit_set("x", **settings)
                assert (bad.value.code, str(bad.value)) == (
                    "bad_request",
                    f"bad_request: {message}",
                )
            with pytest.raises(muster.BadRequest, match="invalid limit name"):
                await client.limit_set("Not A Name", concurrency=1)
            with pytest.raises(muster.InvalidInput) as text:
                await client.limit_set("x", rate="500/min")  # type: ignore[arg-type]
            assert str(text.value) == (
                "a rate is a Rate or a pair (count, per) with per in seconds, not '500/min'"
            )
            with pytest.raises(muster.InvalidInput, match="the rate's period must be a duration"):
                await client.limit_set("x", rate=(1, -1))
            assert [x.name for x in await client.limit_list()] == ["gpu", "openai", "slow"]

    run(body())


def test_a_concurrency_one_limit_leases_one_task_at_a_time(daemon: Daemon) -> None:
    async def body() -> None:
        async with await muster.Client.connect(**daemon.connect) as client:
            await client.queue_create("jobs")
            await client.queue_create("other")
            await client.limit_set("one", concurrency=1)
            first = await client.enqueue("jobs", 1, limits=["one"])
            (second,) = await client.enqueue_many(
                "other", [muster.NewTask(2, limits=[{"limit": "one", "cost": 1}])]
            )
            free = await client.enqueue("jobs", 3)
            assert (await client.task_get(first)).limits == [muster.LimitUse("one", cost=1)]
            assert (await client.task_get(second)).limits == [muster.LimitUse("one", cost=1)]
            assert (await client.task_get(free)).limits == []

            # The limit spans queues: one lease at a time over both; the task without
            # a limit is not held up.
            claimed = await client.claim(["jobs", "other"], max=3)
            assert sorted(c.id for c in claimed) == sorted([first, free])
            held = next(c for c in claimed if c.id == first)
            assert await client.claim(["jobs", "other"], wait=0.3) == []
            assert (await client.queue_describe("other")).waiting_on_limits == 1
            assert (await client.queue_describe("jobs")).waiting_on_limits == 0
            one = await client.limit_get("one")
            assert (one.held, one.waiting, one.granted, one.throttled, one.keys_in_use) == (
                1,
                1,
                1,
                0,
                1,
            )
            assert one.keys == [muster.LimitKeyInfo("", None, 1, 1, None, None)]

            # The ack frees the slot: the waiting task goes to a claim waiting for it.
            waiting = asyncio.ensure_future(client.claim("other", wait=10))
            await client.ack(held)
            (next_claim,) = await waiting
            assert next_claim.id == second
            assert (await client.queue_describe("other")).waiting_on_limits == 0
            one = await client.limit_get("one")
            assert (one.held, one.waiting, one.granted) == (1, 0, 2)
            await client.ack(next_claim)
            one = await client.limit_get("one")
            assert (one.held, one.waiting, one.granted, one.keys_in_use, one.keys) == (
                0,
                0,
                2,
                0,
                [],
            )

            # Per key: each key has its own count; a key's second task waits.
            await client.limit_set("per-account", concurrency=1, per_key=True)
            a1, b1, a2 = await client.enqueue_many(
                "jobs",
                [
                    muster.NewTask("a1", limits=[muster.LimitUse("per-account", key="a")]),
                    muster.NewTask("b1", limits=[muster.LimitUse("per-account", key="b")]),
                    muster.NewTask("a2", limits=[muster.LimitUse("per-account", key="a")]),
                ],
            )
            claimed = await client.claim("jobs", max=3)
            assert [c.id for c in claimed] == [a1, b1]
            per_account = await client.limit_get("per-account")
            assert (per_account.held, per_account.waiting, per_account.keys_in_use) == (2, 1, 2)
            assert per_account.keys == [
                muster.LimitKeyInfo("a", None, 1, 1, None, None),
                muster.LimitKeyInfo("b", None, 1, 0, None, None),
            ]
            # Deleting the limit frees the tasks that waited on it.
            assert await client.limit_delete("per-account") == 1
            (freed,) = await client.claim("jobs", wait=10)
            assert freed.id == a2

    run(body())


def test_a_throttled_claim_spends_no_attempt_and_holds_its_limit(daemon: Daemon) -> None:
    async def body() -> None:
        async with await muster.Client.connect(**daemon.connect) as client:
            await client.queue_create("jobs", max_attempts=1)
            await client.limit_set("api", concurrency=10)
            task = await client.enqueue("jobs", "call", limits=["api"])
            plain = await client.enqueue("jobs", "no limit")
            claimed = await client.claim("jobs", max=2, member="puller")
            by_id = {c.id: c for c in claimed}

            before_ms = int(time.time() * 1000)
            settled = await client.throttled(
                by_id[task], retry_after=3600, limit="api", error="429 from upstream"
            )
            assert settled == muster.SettleResult("ready", None)
            info = await client.task_get(task)
            assert (info.state, info.failures, info.deliveries, info.last_error) == (
                "ready",
                0,
                1,
                None,
            )
            assert info.history[-1] == muster.TimelineEvent(
                info.history[-1].at_ms, "throttled", "puller", 1, "429 from upstream"
            )
            api = await client.limit_get("api")
            assert (api.held, api.waiting, api.granted, api.throttled, api.keys_in_use) == (
                0,
                1,
                1,
                1,
                1,
            )
            (bucket,) = api.keys
            assert (bucket.key, bucket.tokens, bucket.held, bucket.waiting) == ("", None, 0, 1)
            assert bucket.throttled_until_ms is not None
            assert (
                before_ms + HOUR_MS <= bucket.throttled_until_ms <= time.time() * 1000 + 1 + HOUR_MS
            )
            assert (await client.queue_describe("jobs")).waiting_on_limits == 1
            assert await client.claim("jobs", wait=0.2) == []

            # A task that draws on no limit waits itself; a throttle refused leaves
            # the lease as it was.
            with pytest.raises(muster.BadRequest) as not_drawn:
                await client.throttled(by_id[plain], limit="api")
            assert not_drawn.value.code == "bad_request"
            with pytest.raises(muster.BadRequest) as zero:
                await client.throttled(by_id[plain], retry_after=0)
            assert zero.value.code == "bad_request"
            after_ms = int(time.time() * 1000)
            scheduled = await client.throttled(str(by_id[plain]), retry_after=timedelta(hours=1))
            assert scheduled.state == "scheduled"
            assert scheduled.not_before_ms is not None
            assert after_ms + HOUR_MS <= scheduled.not_before_ms <= time.time() * 1000 + 1 + HOUR_MS
            assert (await client.task_get(plain)).failures == 0
            with pytest.raises(muster.LeaseLost):
                await client.throttled(by_id[plain])

    run(body())


def test_a_handler_throttled_gets_its_task_again_with_no_failure(daemon: Daemon) -> None:
    """``task.throttled`` (on a named limit), ``raise Throttled`` (every limit the task
    draws on) and a throttle of a task without limits: each task comes back once the
    throttle is over, with its failures at 0."""
    throttled_at: Dict[str, float] = {}
    again: Dict[str, Dict[str, Any]] = {}
    refusals: List[str] = []

    async def handle(task: muster.Task) -> Any:
        if task.attempt == 2:
            again[task.id] = {
                "after": time.monotonic() - throttled_at[task.id],
                "failures": task.failures,
            }
            return "done"
        how = task.payload
        throttled_at[task.id] = time.monotonic()
        if how == "method":
            for bad in ({"retry_after": 0}, {"retry_after": 366 * 86400}, {"limit": "Not A"}):
                try:
                    task.throttled(**bad)
                except muster.InvalidInput as e:
                    refusals.append(str(e))
            task.throttled(retry_after=0.5, limit="api")
            return "ignored: the throttle came first"
        if how == "raise":
            raise muster.Throttled(retry_after=timedelta(milliseconds=500))
        assert how == "no limit"
        task.throttled(retry_after=0.5)
        return None

    async def body() -> None:
        async with await muster.Client.connect(**daemon.connect) as client:
            await client.queue_create("jobs", max_attempts=1)
            await client.limit_set("api", concurrency=5)
            await client.limit_set("other", concurrency=5)
            method, raised, plain = await client.enqueue_many(
                "jobs",
                [
                    muster.NewTask("method", limits=["api"]),
                    muster.NewTask("raise", limits=["other"]),
                    muster.NewTask("no limit"),
                ],
            )
            worker, running = start(daemon, handle, capacity=3)
            finished = (await client.wait([method, raised, plain], 20)).finished
            assert len(finished) == 3
            for info in finished:
                assert (info.state, info.result, info.failures, info.deliveries) == (
                    "done",
                    "done",
                    0,
                    2,
                )
                assert [e.event for e in info.history] == [
                    "enqueued",
                    "leased",
                    "throttled",
                    "leased",
                    "done",
                ]
                assert again[info.id]["failures"] == 0
                assert again[info.id]["after"] >= 0.49, again[info.id]
            for name in ("api", "other"):
                limit = await client.limit_get(name)
                assert (limit.throttled, limit.granted, limit.held, limit.waiting) == (1, 2, 0, 0)
            assert refusals == [
                "retry_after is 0 ms, out of range (1 ms to 31536000000 ms, 365 days)",
                "retry_after is 31622400000 ms, out of range (1 ms to 31536000000 ms, 365 days)",
                'invalid limit name "Not A": want [a-z0-9][a-z0-9._-]{0,127}',
            ]
            await stop(worker, running)

    run(body())


def test_a_bad_throttle_raised_by_a_handler_fails_the_task_saying_why(daemon: Daemon) -> None:
    async def handle(task: muster.Task) -> None:
        raise muster.Throttled(retry_after=-1)

    async def body() -> None:
        async with await muster.Client.connect(**daemon.connect) as client:
            await client.queue_create("jobs", max_attempts=1)
            task = await client.enqueue("jobs", 1)
            worker, running = start(daemon, handle)
            (dead,) = (await client.wait(task, 20)).finished
            assert (dead.state, dead.failures, dead.last_error) == (
                "dead",
                1,
                "the handler's throttle could not be sent: Throttled.retry_after"
                " must be a duration of 0 s or more, not -1",
            )
            await stop(worker, running)

    run(body())


def test_groups_of_a_fair_queue_take_turns(daemon: Daemon) -> None:
    async def body() -> None:
        async with await muster.Client.connect(**daemon.connect) as client:
            even = await client.queue_create("even", fair=True)
            assert (even.options.fair, even.options.group_weights) == (True, {})
            # Group a's backlog is enqueued first; b's tasks still go every other turn.
            ids = await client.enqueue_many(
                "even", [muster.NewTask(f"a{n}", group="a") for n in range(4)]
            )
            ids += [await client.enqueue("even", f"b{n}", group="b") for n in range(4)]
            assert (await client.task_get(ids[0])).group == "a"
            assert (await client.task_get(ids[4])).group == "b"
            claimed = await client.claim("even", max=8)
            assert [c.payload for c in claimed] == ["a0", "b0", "a1", "b1", "a2", "b2", "a3", "b3"]

            # Weights: b twice as often as a.
            weighted = await client.queue_create("weighted", fair=True, group_weights={"b": 2})
            assert weighted.options.group_weights == {"b": 2}
            await client.enqueue_many(
                "weighted",
                [muster.NewTask(f"a{n}", group="a") for n in range(4)]
                + [muster.NewTask(f"b{n}", group="b") for n in range(6)],
            )
            claimed = await client.claim("weighted", max=10)
            assert [c.payload for c in claimed] == [
                "a0",
                "b0",
                "b1",
                "a1",
                "b2",
                "b3",
                "a2",
                "b4",
                "b5",
                "a3",
            ]

            # Weights merge; a weight of 1 takes a group's entry out; fair turns off.
            merged = await client.queue_update("weighted", group_weights={"c": 5})
            assert merged.options.group_weights == {"b": 2, "c": 5}
            cleared = await client.queue_update("weighted", group_weights={"b": 1}, fair=False)
            assert (cleared.options.fair, cleared.options.group_weights) == (False, {"c": 5})
            # Without fair, groups are ignored: enqueue order.
            await client.enqueue_many(
                "weighted",
                [muster.NewTask(n, group="a") for n in range(3)] + [muster.NewTask(9, group="b")],
            )
            assert [c.payload for c in await client.claim("weighted", max=4)] == [0, 1, 2, 9]

    run(body())


def test_bad_flow_control_input_is_refused(daemon: Daemon) -> None:
    async def body() -> None:
        async with await muster.Client.connect(**daemon.connect) as client:
            await client.queue_create("jobs")
            await client.limit_set("one", concurrency=1)
            await client.limit_set("openai", rate=(500, 60))

            with pytest.raises(muster.NotFound) as unknown:
                await client.enqueue("jobs", 1, limits=["nope"])
            assert (unknown.value.code, str(unknown.value)) == (
                "not_found",
                "not_found: task 0: no limit nope",
            )
            daemon_refusals = {
                "task 0: limit one is named twice": ["one", "one"],
                "task 0: a cost on limit one is 1 to 1000000 (its burst), not 0": [
                    {"limit": "one", "cost": 0}
                ],
                "task 0: a cost on limit openai is 1 to 500 (its burst), not 501": [
                    muster.LimitUse("openai", cost=501)
                ],
                "task 0: 5 limits exceed the limit of 4 per task": ["one"] * 5,
            }
            for message, limits in daemon_refusals.items():
                with pytest.raises(muster.BadRequest) as bad:
                    await client.enqueue("jobs", 1, limits=limits)
                assert (bad.value.code, str(bad.value)) == (
                    "bad_request",
                    f"bad_request: {message}",
                )
            with pytest.raises(muster.BadRequest, match='invalid group ""'):
                await client.enqueue("jobs", 1, group="")

            client_refusals = {
                "limits is a list, not a single str": "one",
                "a limit a task draws on has the fields limit (required), key"
                " and cost, not {'limit': 'one', 'weight': 2}": [{"limit": "one", "weight": 2}],
                "a limit a task draws on has the fields limit (required), key"
                " and cost, not {'key': 'k'}": [{"key": "k"}],
                "a limit a task draws on is a LimitUse, a dict of its fields or"
                " a limit's name, not 5": [5],
            }
            for message, limits in client_refusals.items():
                with pytest.raises(muster.InvalidInput) as invalid:
                    await client.enqueue("jobs", 1, limits=limits)  # type: ignore[arg-type]
                assert str(invalid.value) == message
            with pytest.raises(muster.InvalidInput, match="enqueue: invalid request"):
                await client.enqueue("jobs", 1, limits=[muster.LimitUse("one", cost=-1)])

            with pytest.raises(muster.BadRequest) as zero:
                await client.queue_create("w", fair=True, group_weights={"a": 0})
            assert (zero.value.code, str(zero.value)) == (
                "bad_request",
                'bad_request: group "a": weight 0 is outside 1..=1000',
            )
            with pytest.raises(muster.BadRequest, match="weight 1001 is outside 1..=1000"):
                await client.queue_update("jobs", group_weights={"a": 1001})
            with pytest.raises(muster.InvalidInput) as text:
                await client.queue_update("jobs", group_weights={"a": "2"})  # type: ignore[dict-item]
            assert str(text.value) == (
                "the weight of group 'a' is an integer from 1 to 1000, not '2'"
            )
            # Nothing of the refused requests was stored.
            jobs = await client.queue_describe("jobs")
            assert (jobs.ready, jobs.options.fair, jobs.options.group_weights) == (0, False, {})
            assert [q.name for q in await client.queue_list()] == ["jobs"]

    run(body())


def test_the_sync_client_has_the_flow_control_ops(daemon: Daemon) -> None:
    with muster.sync.Client.connect(**daemon.connect) as client:
        client.queue_create("jobs", fair=True, group_weights={"big": 3})
        limit = client.limit_set("api", concurrency=2)
        assert (limit.name, limit.concurrency) == ("api", 2)
        task = client.enqueue("jobs", 1, limits=[muster.LimitUse("api", key="k")], group="big")
        info = client.task_get(task)
        assert (info.limits, info.group) == ([muster.LimitUse("api", key="k", cost=1)], "big")
        (claim,) = client.claim("jobs")
        assert client.throttled(claim, retry_after=3600).state == "ready"
        assert client.limit_get("api").throttled == 1
        assert client.queue_describe("jobs").waiting_on_limits == 1
        assert [x.name for x in client.limit_list()] == ["api"]
        assert client.limit_delete("api") == 1
        assert client.limit_list() == []
        assert client.queue_update("jobs", fair=False).options.fair is False
