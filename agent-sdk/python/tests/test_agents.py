"""The examples as processes: a producer with agents, kill -9 and restart, SIGTERM and
SIGINT drains, and ``muster cancel`` from the CLI."""

from __future__ import annotations

import json
import signal
import time
from typing import Any, Callable, Dict, List

import muster.sync
import pytest
from conftest import EXAMPLES, Daemon, Program

StartProgram = Callable[..., Program]


def agent(
    programs: StartProgram, daemon: Daemon, member: str, capacity: int, grace: float = 10
) -> Program:
    """Starts ``examples/agent.py`` on queue ``jobs``."""
    env = {**daemon.env(), "MUSTER_GRACE": str(grace)}
    return programs([str(EXAMPLES / "agent.py"), member, "jobs", str(capacity)], env)


def starts(program: Program, n: int, timeout: float) -> Dict[str, Dict[str, Any]]:
    """The next ``n`` ``start`` lines of the agent, by task id: attempt, reclaimed,
    progress and when the line was read."""
    found = {}
    for at, line in program.lines_matching(n, timeout, lambda line: line.startswith("start ")):
        _, task_id, attempt, reclaimed, progress = line.split(" ", 4)
        found[task_id] = {
            "at": at,
            "attempt": int(attempt.split("=")[1]),
            "reclaimed": reclaimed == "reclaimed=True",
            "progress": None if progress == "progress=-" else json.loads(progress.split("=", 1)[1]),
        }
    return found


def wait_for(check: Callable[[], bool], timeout: float) -> None:
    """Polls ``check`` until it holds; fails after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_producer_and_agents(daemon: Daemon, programs: StartProgram) -> None:
    with muster.sync.Client.connect(**daemon.connect) as client:
        # Before the agents (a worker started first would wait for it).
        client.queue_create("jobs")
    agents = [agent(programs, daemon, f"py/agent-{n}", 2, grace=0.5) for n in range(2)]
    producer = programs([str(EXAMPLES / "producer.py"), "jobs", "6", "5"], daemon.env())
    assert producer.wait(60) == 0
    lines: List[str] = []
    while not producer.lines.empty():
        lines.append(producer.lines.get()[1])
    assert lines[0] == "enqueued 6 tasks on jobs"
    assert len(lines) == 7
    for line in lines[1:]:
        _, state, result = line.split("\t")
        assert state == "done"
        completion = json.loads(result)
        assert completion["tokens"] == 5
        assert completion["completion"] == "the quick brown fox jumps"
    for program in agents:
        program.signal(signal.SIGTERM)
        assert program.wait(30) == 0


def test_kill9_and_restart_gets_tasks_back_at_once(daemon: Daemon, programs: StartProgram) -> None:
    with muster.sync.Client.connect(**daemon.connect) as client:
        # A long lease: only a reclaim can hand the tasks back within it.
        client.queue_create("jobs", lease=60)
        ids = client.enqueue_many("jobs", [{"tokens": 10_000, "token_ms": 50} for _ in range(3)])
        first = agent(programs, daemon, "py/agent-7", 3, grace=0.5)
        assert sorted(starts(first, 3, 30)) == sorted(ids)

        def checkpointed() -> bool:
            return all(client.task_get(i).progress is not None for i in ids)

        wait_for(checkpointed, 10)
        first.kill9()
        stored = {i: client.task_get(i).progress for i in ids}
        assert all(len(p["tokens"]) >= 1 for p in stored.values())

        restarted_at = time.monotonic()
        second = agent(programs, daemon, "py/agent-7", 3, grace=0.5)
        again = starts(second, 3, 30)
        assert sorted(again) == sorted(ids)
        for task_id, start in again.items():
            assert (start["attempt"], start["reclaimed"]) == (2, True)
            assert start["progress"] == stored[task_id]
        # At once: the time it takes a Python process to start and connect, not a lease.
        took = max(s["at"] for s in again.values()) - restarted_at
        assert took < 10, f"reclaimed after {took:.1f} s"
        for task_id in ids:
            task = client.task_get(task_id)
            assert (task.state, task.failures, task.deliveries) == ("leased", 1, 2)
        second.signal(signal.SIGTERM)
        assert second.wait(30) == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_drains_and_releases_without_failure(
    daemon: Daemon, programs: StartProgram, sig: signal.Signals
) -> None:
    with muster.sync.Client.connect(**daemon.connect) as client:
        client.queue_create("jobs")
        ids = client.enqueue_many("jobs", [{"tokens": 10_000, "token_ms": 50} for _ in range(2)])
        program = agent(programs, daemon, "py/drained", 2, grace=0.5)
        starts(program, 2, 30)
        program.signal(sig)
        cancelled = program.lines_matching(2, 10, lambda line: line.startswith("cancelled "))
        assert sorted(line.split()[1] for _, line in cancelled) == sorted(ids)
        assert program.wait(10) == 0
        for task_id in ids:
            task = client.task_get(task_id)
            assert (task.state, task.failures) == ("ready", 0)
            assert task.progress is not None and len(task.progress["tokens"]) >= 1
            assert task.history[-1].event == "released"
        assert client.member_list() == []


def test_cli_cancel_stops_the_handler(daemon: Daemon, programs: StartProgram) -> None:
    with muster.sync.Client.connect(**daemon.connect) as client:
        client.queue_create("jobs")
        task_id = client.enqueue("jobs", {"tokens": 10_000, "token_ms": 50})
        program = agent(programs, daemon, "py/cancelled", 1, grace=0.5)
        starts(program, 1, 30)
        cli = daemon.cli("cancel", task_id)
        replied = time.monotonic()
        assert cli.returncode == 0, cli.stderr
        ((seen, line),) = program.lines_matching(1, 10, lambda line: line.startswith("cancelled "))
        assert line == f"cancelled {task_id}"
        # The cancel took effect before the CLI got its reply.
        assert seen - replied < 0.1, f"the handler stopped {(seen - replied) * 1000:.0f} ms after"
        (task,) = client.wait(task_id, 10).finished
        assert (task.state, task.failures) == ("cancelled", 0)
        program.signal(signal.SIGTERM)
        assert program.wait(30) == 0
