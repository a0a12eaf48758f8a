"""Cron schedules from Python against a real daemon: an every-second schedule fires,
pauses, runs by hand, lists and is deleted; a bad pattern is the daemon's
``bad_request``."""

from __future__ import annotations

import asyncio
import time

import muster
import muster.sync
import pytest
from conftest import Daemon, run


def test_a_schedule_fires_pauses_runs_and_is_deleted(daemon: Daemon) -> None:
    async def body() -> None:
        async with await muster.Client.connect(**daemon.connect) as client:
            await client.queue_create("ticks")
            made = await client.schedule_set(
                "tick",
                cron="* * * * * *",
                queue="ticks",
                payload={"tick": True},
                priority=3,
                key="k",
                requires=["gpu"],
            )
            assert (made.name, made.cron, made.tz, made.queue) == (
                "tick",
                "* * * * * *",
                "UTC",
                "ticks",
            )
            assert (made.catch_up, made.paused, made.fires, made.runs) == ("skip", False, 0, 0)
            assert made.next_fire_ms is not None
            assert made.task["payload"] == {"tick": True}
            assert (made.task["priority"], made.task["key"], made.task["requires"]) == (
                3,
                "k",
                ["gpu"],
            )
            deadline = time.monotonic() + 15
            while (await client.schedule_get("tick")).fires < 2:
                assert time.monotonic() < deadline, "the schedule did not fire twice"
                await asyncio.sleep(0.2)
            paused = await client.schedule_pause("tick")
            assert paused.paused and paused.next_fire_ms is None
            fires = paused.fires
            ran = await client.schedule_run("tick")
            assert (ran.duplicate, ran.state) == (False, "ready")
            task = await client.task_get(ran.id)
            assert (task.queue, task.payload, task.priority) == ("ticks", {"tick": True}, 3)
            await asyncio.sleep(1.5)
            after = await client.schedule_get("tick")
            assert (after.fires, after.runs, after.last_task) == (fires, 1, ran.id)
            assert after.failures == 0 and after.last_error is None
            queue = await client.queue_describe("ticks")
            assert queue.ready + queue.scheduled == fires + 1
            resumed = await client.schedule_resume("tick")
            assert not resumed.paused and resumed.next_fire_ms is not None
            assert [s.name for s in await client.schedule_list()] == ["tick"]
            with pytest.raises(muster.BadRequest) as refused:
                await client.schedule_set("bad", cron="not a cron", queue="ticks")
            assert refused.value.code == "bad_request"
            with pytest.raises(muster.NotFound):
                await client.schedule_set("lost", cron="@hourly", queue="nowhere")
            await client.schedule_delete("tick")
            assert await client.schedule_list() == []
            with pytest.raises(muster.NotFound):
                await client.schedule_get("tick")

    run(body())


def test_the_blocking_client_sets_schedules(daemon: Daemon) -> None:
    with muster.sync.Client.connect(**daemon.connect) as client:
        client.queue_create("jobs")
        made = client.schedule_set(
            "nightly",
            cron="0 3 * * *",
            queue="jobs",
            tz="Europe/Paris",
            catch_up="once",
            paused=True,
        )
        assert (made.tz, made.catch_up, made.paused, made.task["payload"]) == (
            "Europe/Paris",
            "once",
            True,
            None,
        )
        assert client.schedule_get("nightly") == made
        assert client.schedule_run("nightly").state == "ready"
        client.schedule_delete("nightly")
