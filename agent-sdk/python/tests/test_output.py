"""Live task output from Python against a real daemon: a handler's chunks followed live
and read again afterwards, numbers that go on across runs, chunks refused before they
are sent, output that stops with a lost lease, a pulled task's emits, a synchronous
handler's, and the blocking client's follow."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any, List, Optional, Tuple

import muster
import muster.sync
import pytest
from conftest import Daemon, run

LINES = 100
"""Text chunks the streaming handler emits before its JSON chunk."""

TOKENS = {"tokens": 412, "done": True}
"""The streaming handler's JSON chunk."""


PAGE = 16 + 1
"""Bytes an emit takes as stored besides its chunks: its page's 16-byte header and a
bracket."""

MAX_OUTPUT = 1024 * 1024
"""Bytes of output a task keeps, as stored (its pages')."""


def line(i: int) -> str:
    return f"line {i}\n"


def text_stored(text: str) -> int:
    """Bytes a text chunk takes in its emit as stored: its JSON as the daemon writes it
    (``{"text":"…"}``, compact, ``"``, ``\\`` and control characters escaped, not
    non-ASCII) and a comma."""
    return len(json.dumps({"text": text}, separators=(",", ":"), ensure_ascii=False).encode()) + 1


def json_stored(raw: bytes) -> int:
    """Bytes a JSON chunk takes in its emit as stored: ``{"json":…}`` around its JSON
    text as sent, and a comma."""
    return len(b'{"json":' + raw + b"}") + 1


def assert_output(
    summary: Optional[muster.OutputSummary], first: int, next: int, sizes: List[int]
) -> None:
    """That a task's output summary holds chunks ``first`` to ``next - 1``, whose stored
    sizes are ``sizes``, in some number of emits: a worker sends as many chunks in each
    as have gathered, so they may be stored in 1 to ``len(sizes)`` pages, each taking
    ``PAGE`` bytes besides its chunks."""
    assert summary is not None
    assert (summary.first, summary.next) == (first, next)
    pages = (summary.bytes - sum(sizes)) // PAGE
    assert summary.bytes == sum(sizes) + PAGE * pages, (summary.bytes, sizes)
    assert 1 <= pages <= len(sizes), (summary.bytes, sizes)


def start(
    daemon: Daemon, handler: muster.Handler, **options: Any
) -> Tuple[muster.Worker, asyncio.Future[None]]:
    """A worker on queue ``talk`` running in the background of the test's loop."""
    worker = muster.Worker("py/talker", "talk", **daemon.connect, **options)
    return worker, asyncio.ensure_future(worker.run(handler, handle_signals=False))


async def stop(worker: muster.Worker, running: asyncio.Future[None]) -> None:
    worker.shutdown()
    await asyncio.wait_for(running, 30)


def test_a_follower_sees_every_chunk_a_handler_emits_in_order_then_the_end(
    daemon: Daemon,
) -> None:
    async def body() -> None:
        starts: List[int] = []

        async def handle(task: muster.Task) -> Any:
            starts.append(task.output_start)
            for i in range(LINES):
                await task.emit(line(i))
            await task.emit_json(TOKENS)
            return "said"

        async with await muster.Client.connect(**daemon.connect) as client:
            await client.queue_create("talk")
            task_id = await client.enqueue("talk", {"q": "why is the sky blue?"})
            # Before any output: nothing, at once, and no summary.
            assert await client.follow(task_id) == muster.FollowResult([], 0, 0, "ready", False)
            assert (await client.task_get(task_id)).output is None

            # The follower starts first: it waits for the chunks as they are stored.
            async def follow() -> List[muster.OutputChunk]:
                return [c async for c in client.follow_stream(task_id, poll=5)]

            following = asyncio.ensure_future(follow())
            await asyncio.sleep(0.2)
            assert not following.done()
            worker, running = start(daemon, handle)
            chunks = await asyncio.wait_for(following, 30)
            assert [c.n for c in chunks] == list(range(LINES + 1))
            assert [c.text for c in chunks] == [line(i) for i in range(LINES)] + [None]
            assert [c.json for c in chunks] == [None] * LINES + [TOKENS]
            assert all(c.at_ms > 0 for c in chunks)
            assert starts == [0]
            (done,) = (await client.wait(task_id, 20)).finished
            assert (done.state, done.result) == ("done", "said")

            # Read again afterwards: the task's output summary, then all of it at once.
            # As stored, a line is {"text":"line i\n"} (its newline escaped) and a comma,
            # 13 bytes more than its text; the JSON chunk {"json":…} and a comma, 10 more.
            sizes = [text_stored(line(i)) for i in range(LINES)]
            sizes.append(json_stored(json.dumps(TOKENS, separators=(",", ":")).encode()))
            assert sum(sizes) == 790 + 13 * LINES + 26 + 10
            info = await client.task_get(task_id)
            assert_output(info.output, 0, LINES + 1, sizes)
            whole = await client.follow(task_id)
            assert (whole.chunks, whole.dropped, whole.next, whole.state, whole.end) == (
                chunks,
                0,
                LINES + 1,
                "done",
                True,
            )
            # From a number on, and from the end (a finished task answers at once, even
            # with time to wait).
            tail = await client.follow(task_id, 95, timeout=30)
            assert [c.n for c in tail.chunks] == [95, 96, 97, 98, 99, 100]
            assert (tail.next, tail.end) == (LINES + 1, True)
            assert await client.follow(task_id, LINES + 1, timeout=30) == muster.FollowResult(
                [], 0, LINES + 1, "done", True
            )
            assert [c.n async for c in client.follow_stream(task_id, 99)] == [99, 100]
            with pytest.raises(muster.BadRequest) as past:
                await client.follow(task_id, LINES + 2)
            assert str(past.value) == (
                f"bad_request: follow from chunk 102: task {task_id} has emitted 101 chunks"
            )
            with pytest.raises(muster.BadRequest):
                await client.follow(task_id, timeout=301)
            with pytest.raises(muster.InvalidInput) as poll:
                client.follow_stream(task_id, poll=0)
            assert str(poll.value) == "poll is 1 ms to 300 s, not 0"
            with pytest.raises(muster.NotFound):
                await client.follow("01JHMPFNMW1HEAD8X4A1JH69RE")
            await stop(worker, running)

    run(body())


def test_a_run_after_a_retry_numbers_its_chunks_on_from_the_first_runs(daemon: Daemon) -> None:
    async def body() -> None:
        starts: List[int] = []

        async def handle(task: muster.Task) -> Any:
            starts.append(task.output_start)
            for i in range(3):
                await task.emit(f"run {task.attempt} chunk {i}")
            if task.attempt == 1:
                raise muster.Retry("again", delay=0)
            return task.output_start

        async with await muster.Client.connect(**daemon.connect) as client:
            await client.queue_create("talk")
            task_id = await client.enqueue("talk", None)
            worker, running = start(daemon, handle)
            (done,) = (await client.wait(task_id, 20)).finished
            assert (done.state, done.result, done.failures) == ("done", 3, 1)
            assert starts == [0, 3]
            read = await client.follow(task_id)
            assert [(c.n, c.text) for c in read.chunks] == [
                (n, f"run {n // 3 + 1} chunk {n % 3}") for n in range(6)
            ]
            assert read.end
            sizes = [text_stored(f"run {n // 3 + 1} chunk {n % 3}") for n in range(6)]
            assert sizes == [13 + 12] * 6
            assert_output((await client.task_get(task_id)).output, 0, 6, sizes)
            await stop(worker, running)

    run(body())


def test_malformed_and_too_large_chunks_are_refused_before_they_are_sent(daemon: Daemon) -> None:
    async def body() -> None:
        refusals: List[Tuple[type, str]] = []
        largest = "x" * 65_536

        async def handle(task: muster.Task) -> Any:
            tries: List[Any] = [
                task.emit(largest + "x"),
                task.emit("é" * 32_768 + "x"),
                task.emit(42),  # type: ignore[arg-type]
                task.emit_json(None),
                task.emit_json(b"null"),
                task.emit_json(b"{not json"),
                task.emit_json({1, 2}),
                task.emit_json({"big": "y" * 65_530}),
            ]
            for attempt in tries:
                try:
                    await attempt
                    raise AssertionError("refused")
                except muster.MusterError as e:
                    refusals.append((type(e), str(e)))
            # Nothing was sent, and output goes on: the largest chunk is allowed.
            await task.emit(largest)
            await task.emit_json(b' {"k": [1, 2]} ')
            await task.flush_output()
            return "ok"

        async with await muster.Client.connect(**daemon.connect) as client:
            await client.queue_create("talk")
            task_id = await client.enqueue("talk", None)
            worker, running = start(daemon, handle)
            (done,) = (await client.wait(task_id, 20)).finished
            assert done.result == "ok"
            assert refusals == [
                (muster.InvalidInput, "invalid input: a chunk of 65537 bytes exceeds 65536"),
                (muster.InvalidInput, "invalid input: a chunk of 65537 bytes exceeds 65536"),
                (
                    muster.InvalidInput,
                    "a text chunk is a str, not int: emit_json sends a JSON value",
                ),
                (
                    muster.InvalidInput,
                    "a JSON chunk is not None (the protocol reads null as none)",
                ),
                (
                    muster.InvalidInput,
                    "a JSON chunk is not null (the protocol reads null as no chunk)",
                ),
                (
                    muster.InvalidInput,
                    "the JSON chunk bytes are not one JSON value:"
                    " Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
                ),
                (
                    muster.InvalidInput,
                    "the JSON chunk is not JSON-serialisable:"
                    " Object of type set is not JSON serializable",
                ),
                (muster.InvalidInput, "invalid input: a chunk of 65540 bytes exceeds 65536"),
            ]
            read = await client.follow(task_id)
            assert [(c.n, c.text, c.json) for c in read.chunks] == [
                (0, largest, None),
                (1, None, {"k": [1, 2]}),
            ]
            # The JSON text as sent, but the whitespace around it: {"k": [1, 2]}.
            sizes = [text_stored(largest), json_stored(b'{"k": [1, 2]}')]
            assert sizes == [65_536 + 12, 13 + 10]
            assert_output((await client.task_get(task_id)).output, 0, 2, sizes)
            await stop(worker, running)

    run(body())


def test_output_stops_with_a_lost_lease_and_says_why(daemon: Daemon) -> None:
    async def body() -> None:
        emitted = asyncio.Event()
        stopped: List[Tuple[type, str]] = []
        starts: List[int] = []

        async def handle(task: muster.Task) -> Any:
            starts.append(task.output_start)
            if task.attempt > 1:
                await task.emit("second run")
                return "again"
            await task.emit("before the revoke")
            await task.flush_output()
            emitted.set()
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                pass  # the lease is gone: try to emit all the same
            await task.emit("after the revoke")
            try:
                await task.flush_output()
            except muster.MusterError as e:
                stopped.append((type(e), str(e)))
            try:
                await task.emit("later still")
            except muster.MusterError as e:
                stopped.append((type(e), str(e)))
            raise asyncio.CancelledError

        async with await muster.Client.connect(**daemon.connect) as client:
            await client.queue_create("talk")
            task_id = await client.enqueue("talk", None)
            worker, running = start(daemon, handle)
            await asyncio.wait_for(emitted.wait(), 20)
            assert (await client.lease_revoke(task_id)).state == "ready"
            (done,) = (await client.wait(task_id, 20)).finished
            assert (done.state, done.result, done.deliveries) == ("done", "again", 2)
            assert len(stopped) == 2
            for kind, text in stopped:
                assert kind is muster.ConnectionLost
                assert text.startswith("connection lost: output stopped: lease_lost: "), text
            assert starts == [0, 1]
            read = await client.follow(task_id)
            assert [(c.n, c.text) for c in read.chunks] == [
                (0, "before the revoke"),
                (1, "second run"),
            ]
            await stop(worker, running)

    run(body())


def test_a_pulled_task_emits_through_the_client(daemon: Daemon) -> None:
    async def body() -> None:
        async with await muster.Client.connect(**daemon.connect) as client:
            await client.queue_create("talk")
            task_id = await client.enqueue("talk", None)
            (claim,) = await client.claim("talk", member="puller")
            assert claim.output == 0
            chunks = ["thinking", muster.Chunk(json={"step": 1}), muster.Chunk(text="done")]
            first = await client.emit(claim, claim.output, chunks)
            assert first == muster.EmitResult(next=3, repeated=0, wait_ms=0, cancel_requested=False)
            # The same emit again (as after a lost reply) stores nothing twice.
            again = await client.emit(claim, 0, chunks)
            assert again == muster.EmitResult(3, 3, 0, False)
            partly = await client.emit(str(claim), 2, ["done", "and more"])
            assert (partly.next, partly.repeated) == (4, 1)
            with pytest.raises(muster.BadRequest) as past:
                await client.emit(claim, 9, ["x"])
            assert str(past.value) == (
                f"bad_request: emit at chunk 9: task {task_id}'s next chunk is numbered 4"
            )
            with pytest.raises(muster.TooLarge) as large:
                await client.emit(claim, 4, ["x" * 65_537])
            assert str(large.value) == "too_large: chunk 0 holds 65537 bytes, more than 65536"
            with pytest.raises(muster.LeaseLost):
                await client.emit(f"{task_id}.{claim.epoch + 1}", 4, ["x"])
            for bad in (muster.Chunk(), muster.Chunk(text="a", json=1), 7):
                with pytest.raises(muster.InvalidInput):
                    await client.emit(claim, 4, [bad])  # type: ignore[list-item]
            with pytest.raises(muster.InvalidInput):
                await client.emit(claim, 4, "one str")
            await client.release(claim)
            (claim,) = await client.claim("talk", member="puller")
            assert (claim.epoch, claim.output) == (2, 4)
            await client.ack(claim)
            read = await client.follow(task_id)
            assert [(c.n, c.text, c.json) for c in read.chunks] == [
                (0, "thinking", None),
                (1, None, {"step": 1}),
                (2, "done", None),
                (3, "and more", None),
            ]
            assert (read.next, read.state, read.end) == (4, "done", True)

    run(body())


def test_a_follower_is_told_of_the_chunks_dropped_past_the_output_limit(daemon: Daemon) -> None:
    async def body() -> None:
        async with await muster.Client.connect(**daemon.connect) as client:
            await client.queue_create("talk")
            task_id = await client.enqueue("talk", None)
            (claim,) = await client.claim("talk", member="puller")
            # Five emits of four 64 KiB chunks. Each emit is one page as stored: its
            # header and bracket, then four {"text":"…"} (nothing to escape) and commas,
            # 17 + 4 × (65,536 + 12) bytes. A task keeps 1 MiB as stored: a fourth page
            # is past it, so the fourth and fifth emits each drop the oldest page whole,
            # and the last 3 emits' chunks are kept (8 to 19).
            page = PAGE + 4 * text_stored("x" * 65_536)
            assert page == 262_209
            kept = MAX_OUTPUT // page
            assert kept == 3
            at, wait_ms = 0, 0
            for e in range(5):
                # The rate counts pages as stored too: the fourth empties the 1 MiB
                # bucket, and its reply says how long to wait.
                await asyncio.sleep(wait_ms / 1000)
                chunks = [f"{e}{n}".ljust(65_536, ".") for n in range(4)]
                reply = await client.emit(claim, at, chunks)
                at, wait_ms = reply.next, reply.wait_ms
            assert (at, wait_ms > 0) == (20, True)
            await client.ack(claim)
            first = 4 * (5 - kept)
            info = await client.task_get(task_id)
            assert info.output == muster.OutputSummary(first=first, next=20, bytes=kept * page)
            assert first == 8
            read = await client.follow(task_id, 2)
            assert (read.dropped, read.chunks[0].n, read.chunks[0].text[:2]) == (first - 2, 8, "20")
            assert [c.n async for c in client.follow_stream(task_id)] == list(range(first, 20))

    run(body())


def test_a_sync_handler_emits_from_its_thread_and_the_sync_client_follows(
    daemon: Daemon,
) -> None:
    loop_refusals: List[str] = []

    def handle(task: muster.Task) -> Any:
        assert threading.current_thread() is not threading.main_thread()
        for i in range(5):
            task.emit_blocking(line(i))
        task.emit_json_blocking([1, "two"])
        return "synced"

    async def refused_inside_a_loop(client: muster.Client, task_id: str) -> None:
        async def inside(task: muster.Task) -> Any:
            try:
                task.emit_blocking("x")
            except RuntimeError as e:
                loop_refusals.append(str(e))
            return None

        worker, running = start(daemon, inside)
        await client.wait(task_id, 20)
        await stop(worker, running)

    with muster.sync.Client.connect(**daemon.connect) as client:
        client.queue_create("talk")
        task_id = client.enqueue("talk", None)
        worker = muster.sync.Worker("py/sync", "talk", **daemon.connect)
        runner = threading.Thread(
            target=worker.run, args=(handle,), kwargs={"handle_signals": False}
        )
        runner.start()
        chunks = list(client.follow_stream(task_id, poll=5))
        worker.shutdown()
        runner.join(30)
        want = [(i, line(i), None) for i in range(5)] + [(5, None, [1, "two"])]
        assert [(c.n, c.text, c.json) for c in chunks] == want
        assert client.follow(task_id, 5) == muster.FollowResult([chunks[5]], 0, 6, "done", True)
        sizes = [text_stored(line(i)) for i in range(5)] + [json_stored(b'[1,"two"]')]
        assert sum(sizes) == 35 + 13 * 5 + 9 + 10
        assert_output(client.task_get(task_id).output, 0, 6, sizes)
        # Leaving a stream before its end closes it.
        stream = client.follow_stream(task_id)
        assert next(stream).n == 0
        stream.close()
        assert client.wait(task_id, 1).finished[0].result == "synced"
        other = client.enqueue("talk", None)

    async def inside_a_loop() -> None:
        async with await muster.Client.connect(**daemon.connect) as client:
            await refused_inside_a_loop(client, other)

    run(inside_a_loop())
    assert loop_refusals == [
        "Task.emit_blocking blocks: inside a running event loop, await its coroutine"
    ]
