"""Every ``Client`` method against a real daemon, and the synchronous facade."""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, List

import muster
import muster.sync
import pytest
from conftest import Daemon, run


def test_queues_are_created_changed_and_deleted(daemon: Daemon) -> None:
    async def body() -> None:
        async with await muster.Client.connect(**daemon.connect) as client:
            backoff = muster.Backoff(base_ms=500, factor=3.0, cap_ms=60_000, jitter=0.1)
            q = await client.queue_create(
                "jobs",
                lease=timedelta(seconds=45),
                max_attempts=3,
                retry_backoff=backoff,
                key_concurrency=2,
                retention=3600,
                max_runtime=600.5,
            )
            assert q.name == "jobs"
            assert q.options.lease_ms == 45_000
            assert q.options.max_attempts == 3
            assert q.options.retry_backoff == backoff
            assert q.options.key_concurrency == 2
            assert q.options.retention_ms == 3_600_000
            assert q.options.max_runtime_ms == 600_500
            assert (q.ready, q.leased, q.totals.enqueued) == (0, 0, 0)
            with pytest.raises(muster.AlreadyExists) as exists:
                await client.queue_create("jobs")
            assert exists.value.code == "already_exists"
            assert isinstance(exists.value, muster.ServerError)
            with pytest.raises(muster.BadRequest):
                await client.queue_create("Not A Name")

            await client.queue_create("other")
            assert [q.name for q in await client.queue_list()] == ["jobs", "other"]
            updated = await client.queue_update("jobs", max_attempts=0, max_runtime=0)
            assert updated.options.max_attempts == 0
            assert updated.options.max_runtime_ms is None
            assert updated.options.lease_ms == 45_000

            assert (await client.queue_pause("jobs")).options.paused
            assert (await client.queue_describe("jobs")).options.paused
            assert not (await client.queue_resume("jobs")).options.paused

            await client.enqueue_many("jobs", [{"n": n} for n in range(3)])
            await client.enqueue("jobs", {"later": True}, delay=3600)
            described = await client.queue_describe("jobs")
            assert (described.ready, described.scheduled) == (3, 1)
            assert described.oldest_ready_ms is not None
            assert await client.queue_purge("jobs") == 4
            await client.enqueue("jobs", 1)
            assert await client.queue_delete("jobs") == 1
            with pytest.raises(muster.NotFound) as missing:
                await client.queue_describe("jobs")
            assert "jobs" in str(missing.value)

    run(body())


def test_enqueue_shapes_tasks_and_returns_ids_in_order(daemon: Daemon) -> None:
    async def body() -> None:
        async with await muster.Client.connect(**daemon.connect) as client:
            await client.queue_create("jobs")
            at = time.time() + 7200
            task_id = await client.enqueue(
                "jobs",
                {"order": 42},
                priority=7,
                key="customer-7",
                at=at,
                requires=["gpu", "big"],
                idempotency_key="order-42",
            )
            task = await client.task_get(task_id)
            assert task.payload == {"order": 42}
            assert (task.priority, task.key, task.state) == (7, "customer-7", "scheduled")
            assert task.requires == ["gpu", "big"]
            assert task.idempotency_key == "order-42"
            assert task.not_before_ms is not None
            assert abs(task.not_before_ms - at * 1000) < 2
            assert [e.event for e in task.history] == ["enqueued"]
            again = await client.enqueue("jobs", {"order": 43}, idempotency_key="order-42")
            assert again == task_id

            # Raw JSON bytes go through verbatim.
            raw_id = await client.enqueue("jobs", b'{"kept" :  [1, 2.50]}')
            assert (await client.task_get(raw_id)).payload == {"kept": [1, 2.5]}
            with pytest.raises(muster.InvalidInput, match="payload bytes are not one JSON value"):
                await client.enqueue("jobs", b"{not json")
            # Bytes are one JSON value: text that would close the task and open another
            # is refused (the count of ready tasks below shows none was made).
            with pytest.raises(muster.InvalidInput, match="payload bytes are not one JSON value"):
                await client.enqueue("jobs", b'1},{"payload":2')
            # Bytes are JSON text, UTF-8: not an opaque blob.
            with pytest.raises(muster.InvalidInput, match="not UTF-8"):
                await client.enqueue("jobs", b'"\xff"')
            utf8_id = await client.enqueue("jobs", '"grüße"'.encode())
            assert (await client.task_get(utf8_id)).payload == "grüße"
            with pytest.raises(muster.InvalidInput):
                await client.enqueue("jobs", {"when": object()})
            with pytest.raises(muster.InvalidInput):
                await client.enqueue("jobs", float("nan"))
            with pytest.raises(muster.InvalidInput):
                await client.enqueue("jobs", 1, delay=-1)
            with pytest.raises(muster.BadRequest):
                await client.enqueue("jobs", 1, priority=10)
            with pytest.raises(muster.TooLarge):
                await client.enqueue("jobs", "x" * (1 << 20))

            # More than one batch: several requests, ids in input order.
            tasks = [muster.NewTask({"n": n}, priority=n % 3) for n in range(2500)]
            ids = await client.enqueue_many("jobs", tasks)
            assert len(ids) == 2500
            assert ids == sorted(ids)
            assert await client.enqueue_many("jobs", []) == []
            # A bad task in a later batch leaves the earlier batches unsent too.
            before = (await client.queue_describe("jobs")).ready
            bad = [*([muster.NewTask({"n": 0})] * 1500), muster.NewTask(1, priority=-1)]
            with pytest.raises(
                muster.InvalidInput, match="enqueue: invalid request: invalid value: integer `-1`"
            ):
                await client.enqueue_many("jobs", bad)
            assert (await client.queue_describe("jobs")).ready == before
            # Concurrent calls are pipelined over one connection.
            many = await asyncio.gather(*(client.enqueue("jobs", n) for n in range(200)))
            assert len(set(many)) == 200

            page = await client.task_list("jobs", "ready", limit=1000)
            assert len(page.tasks) == 1000
            assert page.next == page.tasks[-1].id
            rest = await client.task_list("jobs", "ready", after=page.next, limit=1000)
            total = len(page.tasks) + len(rest.tasks)
            while rest.next is not None:
                rest = await client.task_list("jobs", "ready", after=rest.next, limit=1000)
                total += len(rest.tasks)
            assert total == 2500 + 200 + 2  # and the raw and the UTF-8 ones above
            with pytest.raises(muster.InvalidInput, match='"sleeping" is not a task state'):
                await client.task_list("jobs", "sleeping")  # type: ignore[arg-type]

    run(body())


def test_claims_are_renewed_and_settled_by_epoch(daemon: Daemon) -> None:
    async def body() -> None:
        async with await muster.Client.connect(**daemon.connect) as client:
            await client.queue_create("jobs", max_attempts=5)
            ids = await client.enqueue_many("jobs", [{"n": n} for n in range(5)])
            claims = await client.claim("jobs", max=5, wait=1, lease=30, member="py-1")
            assert [c.id for c in claims] == ids
            first = claims[0]
            assert isinstance(first, muster.Claim)
            assert (first.epoch, first.attempt, first.failures) == (1, 1, 0)
            assert first.payload == {"n": 0}
            assert first.lease_ms == 30_000
            assert not first.reclaimed
            assert str(first) == f"{first.id}.1"

            renewed = await client.renew(first, extend=60, progress={"page": 7})
            assert renewed.lease_ms == 60_000
            assert not renewed.cancel_requested
            assert (await client.task_get(first.id)).progress == {"page": 7}

            done = await client.ack(first, {"pages": 12})
            assert done.state == "done"
            assert (await client.task_get(first.id)).result == {"pages": 12}
            with pytest.raises(muster.LeaseLost) as lost:
                await client.ack(first)
            assert lost.value.code == "lease_lost"

            nacked = await client.nack(str(claims[1]), delay=3600, error="upstream timed out")
            assert nacked.state == "scheduled"
            assert nacked.not_before_ms is not None
            assert (await client.task_get(claims[1].id)).last_error == "upstream timed out"
            assert (await client.release(claims[2])).state == "ready"
            assert (await client.dead_letter(claims[3], "schema v1")).state == "dead"
            assert (await client.nack(claims[4], delay=0)).state == "ready"

            again = await client.claim(["jobs"], max=10)
            assert sorted(c.id for c in again) == sorted([claims[2].id, claims[4].id])
            assert all(c.epoch == 2 and c.attempt == 2 for c in again)
            with pytest.raises(muster.LeaseLost):
                await client.renew(claims[2])
            assert await client.claim("jobs", wait=0.1) == []
            with pytest.raises(muster.InvalidInput):
                await client.ack("not-a-claim")

    run(body())


def test_wait_cancel_redrive_and_discard(daemon: Daemon) -> None:
    async def body() -> None:
        async with await muster.Client.connect(**daemon.connect) as client:
            await client.queue_create("jobs", max_attempts=1)
            a, b, c, d = await client.enqueue_many("jobs", ["a", "b", "c", "d"])
            waited = await client.wait([a, b], timeout=0)
            assert waited.pending == [a, b]
            assert waited.finished == [] and waited.removed == []

            cancelled = await client.cancel(a)
            assert (cancelled.state, cancelled.cancel_requested) == ("cancelled", False)
            (claimed,) = await client.claim("jobs")
            assert claimed.id == b
            leased = await client.cancel(b)
            assert (leased.state, leased.cancel_requested) == ("leased", True)
            renewed = await client.renew(claimed)
            assert renewed.cancel_requested

            waiting = asyncio.ensure_future(client.wait(b, timeout=10))
            await asyncio.sleep(0.05)
            assert not waiting.done()
            assert (await client.release(claimed)).state == "cancelled"
            finished = (await waiting).finished
            assert [(t.id, t.state) for t in finished] == [(b, "cancelled")]

            for claim in await client.claim("jobs", max=2):
                await client.nack(claim, error="broken")
            assert {t.state for t in (await client.wait([c, d], 1)).finished} == {"dead"}
            with pytest.raises(muster.InvalidState):
                await client.cancel(c)
            dry = await client.redrive("jobs", all=True, dry_run=True)
            assert (dry.count, sorted(dry.ids)) == (2, sorted([c, d]))
            assert (await client.redrive("jobs", [c])).count == 1
            assert (await client.task_get(c)).state == "ready"
            assert (await client.discard("jobs", all=True)).count == 1
            with pytest.raises(muster.NotFound):
                await client.task_get(d)
            with pytest.raises(muster.BadRequest):
                await client.redrive("jobs")

    run(body())


def test_members_drain_revoke_and_stats(daemon: Daemon) -> None:
    async def body() -> None:
        async with await muster.Client.connect(**daemon.connect) as client:
            await client.queue_create("jobs")
            a, b = await client.enqueue_many("jobs", [1, 2])
            await client.claim("jobs", max=2, member="cli-7")
            (member,) = await client.member_list()
            assert (member.name, member.leased, member.state) == ("cli-7", 2, "gone")
            described = await client.member_describe("cli-7")
            assert [t.id for t in described.leases] == [a, b]
            assert described.leases[0].lease is not None
            assert described.leases[0].lease.member == "cli-7"
            revoked = await client.lease_revoke(a)
            assert revoked.state == "ready"
            info = await client.task_get(a)
            assert info.failures == 1
            assert info.last_error is not None and "revoked" in info.last_error
            assert (await client.member_drain("cli-7")).draining
            with pytest.raises(muster.NotFound):
                await client.member_describe("nobody")
            stats = await client.server_stats()
            assert stats.syncs > 0 and stats.synced_requests >= stats.syncs

    run(body())


def test_connection_options_and_errors(daemon: Daemon, monkeypatch: pytest.MonkeyPatch) -> None:
    async def body() -> None:
        # Trusted by pin, the client presents the daemon's local token from a file.
        token_file = str(daemon.data / "local.token")
        pinned = await muster.Client.connect(
            daemon.addr, pin=daemon.fingerprint, token_file=token_file
        )
        assert await pinned.queue_list() == []
        await pinned.close()
        # Without it, the local-only daemon refuses the connection.
        with pytest.raises(muster.Unauthorized):
            await muster.Client.connect(daemon.addr, pin=daemon.fingerprint)
        with pytest.raises(muster.ConnectionLost):
            await pinned.queue_list()
        with pytest.raises(muster.ConnectError) as wrong:
            await muster.Client.connect(daemon.addr, pin="ab" * 32)
        assert "fingerprint" in str(wrong.value)
        with pytest.raises(muster.ConnectError):
            await muster.Client.connect(daemon.addr, data=str(daemon.data / "nowhere"))
        # The CLI's variables.
        monkeypatch.setenv("MUSTER_ADDR", daemon.addr)
        monkeypatch.setenv("MUSTER_DATA", str(daemon.data))
        async with await muster.Client.connect() as client:
            assert await client.queue_list() == []
        # A call cancelled by its caller is abandoned; the client goes on.
        async with await muster.Client.connect() as client:
            await client.queue_create("jobs")
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(client.claim("jobs", wait=10), 0.2)
            assert await client.enqueue("jobs", 1)

    run(body())


def test_sync_client(daemon: Daemon) -> None:
    with muster.sync.Client.connect(**daemon.connect) as client:
        client.queue_create("jobs", lease=10)
        ids = client.enqueue_many("jobs", [{"n": n} for n in range(3)])
        assert client.enqueue("jobs", {"n": 3}, key="k") not in ids
        (claim,) = client.claim("jobs", member="script")
        assert [m.name for m in client.member_list()] == ["script"]
        client.renew(claim, progress={"half": True})
        assert client.ack(claim, {"ok": True}).state == "done"
        assert client.wait(claim.id, timeout=1).finished[0].result == {"ok": True}
        assert client.queue_describe("jobs").done == 1
        with pytest.raises(muster.NotFound):
            client.task_get("01JHMPFNMW1HEAD8X4A1JH69RE")

    async def inside_a_loop() -> None:
        with pytest.raises(RuntimeError):
            muster.sync.Client.connect(**daemon.connect)

    run(inside_a_loop())


def test_connect_settles_options_as_the_cli_does_with_named_contexts(
    daemon: Daemon, private_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two contexts made by the CLI: "local" (this daemon, trusted through its data
    # directory; the first added is current) and "away" (nothing listens there).
    away = "127.0.0.1:9"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MUSTER_")}

    def cli(*args: str) -> None:
        done = subprocess.run(
            [str(daemon.bins / "muster"), *args], env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr

    cli("context", "add", "local", "--addr", daemon.addr, "--data", str(daemon.data))
    cli("context", "add", "away", "--addr", away, "--pin", "ab" * 32)
    assert (private_config / "muster" / "contexts.toml").exists()

    async def names(**options: Any) -> List[str]:
        async with await muster.Client.connect(**options) as client:
            return [q.name for q in await client.queue_list()]

    async def body() -> None:
        # The current context.
        async with await muster.Client.connect() as client:
            await client.queue_create("ctx-jobs")
        cli("context", "use", "away")
        with pytest.raises(muster.ConnectError, match="nothing listens"):
            await muster.Client.connect()
        # context= and MUSTER_CONTEXT name another; context= wins over the variable.
        assert await names(context="local") == ["ctx-jobs"]
        monkeypatch.setenv("MUSTER_CONTEXT", "local")
        assert await names() == ["ctx-jobs"]
        with pytest.raises(muster.ConnectError, match="nothing listens"):
            await muster.Client.connect(context="away")
        monkeypatch.delenv("MUSTER_CONTEXT")
        # An address given wins over the context's (its trust stays the context's)...
        with pytest.raises(muster.ConnectError, match="nothing listens"):
            await muster.Client.connect(away, context="local")
        # ... and so does any trust given, whole: "away"'s pin is not kept beside it.
        assert await names(addr=daemon.addr, data=str(daemon.data)) == ["ctx-jobs"]
        # The variables too, each below its argument.
        monkeypatch.setenv("MUSTER_ADDR", daemon.addr)
        monkeypatch.setenv("MUSTER_DATA", str(daemon.data))
        assert await names() == ["ctx-jobs"]
        with pytest.raises(muster.ConnectError, match="nothing listens"):
            await muster.Client.connect(away)
        monkeypatch.delenv("MUSTER_ADDR")
        monkeypatch.delenv("MUSTER_DATA")
        # An unknown context is refused before anything connects, as the CLI says it.
        with pytest.raises(muster.ConnectError) as unknown:
            await muster.Client.connect(context="nope")
        assert str(unknown.value) == 'no context "nope" (see `muster context list`)'
        with pytest.raises(muster.ConnectError, match="no context"):
            muster.Worker("py/ctx", "ctx-jobs", context="nope")

    run(body())
    with muster.sync.Client.connect(context="local") as client:
        assert [q.name for q in client.queue_list()] == ["ctx-jobs"]
    # A malformed file is an error, not "no contexts".
    (private_config / "muster" / "contexts.toml").write_text('current = "gone"\n')
    with pytest.raises(muster.ConnectError, match='current context "gone" is not defined'):
        muster.sync.Client.connect()


def test_find_update_undrain_release_and_snapshot(daemon: Daemon, tmp_path: Path) -> None:
    async def body() -> None:
        async with await muster.Client.connect(**daemon.connect) as client:
            await client.queue_create("jobs", max_attempts=1)
            await client.queue_create("other")
            a = await client.enqueue(
                "jobs", {"order": {"sku": "A-1"}}, key="k1", idempotency_key="order-1"
            )
            b = await client.enqueue("jobs", {"order": {"sku": "B-2"}}, delay=3600)
            c = await client.enqueue("other", {"order": {"sku": "A-1"}}, requires=["gpu"])

            async def ids(**search: Any) -> List[str]:
                found = await client.task_find(**search)
                assert found.next is None, "each search here fits one step"
                return [t.id for t in found.tasks]

            # Every filter, alone; queues in name order, ids in enqueue order.
            assert await ids(queue="jobs") == [a, b]
            assert await ids(payload='"A-1"') == [a, c]
            assert await ids(payload='"A-1"', newest_first=True) == [c, a]
            assert await ids(field=("order.sku", "B-2")) == [b]
            assert await ids(state="scheduled") == [b]
            assert await ids(key="k1") == [a]
            assert await ids(idempotency_key="order-1") == [a]
            assert await ids(label="gpu") == [c]
            assert await ids(id_prefix=b.lower()) == [b]
            # Step by step with a cursor.
            first = await client.task_find("jobs", limit=1)
            assert [t.id for t in first.tasks] == [a]
            assert first.next == muster.FindCursor("jobs", a) and first.scanned >= 1
            second = await client.task_find("jobs", limit=1, after=first.next)
            assert [t.id for t in second.tasks] == [b]
            with pytest.raises(muster.NotFound):
                await client.task_find("nowhere")
            with pytest.raises(muster.BadRequest):
                await client.task_find(limit=0)

            # A summary carries the progress checkpoint as text, cut to 256 bytes.
            (claim,) = await client.claim("jobs", member="cli-9")
            assert claim.id == a
            await client.renew(claim, progress={"page": 7})
            (summary,) = (await client.task_find(id_prefix=a)).tasks
            assert summary.progress == '{"page":7}'
            await client.renew(claim, progress={"text": "x" * 300})
            (summary,) = (await client.task_find(id_prefix=a)).tasks
            assert summary.progress is not None and summary.progress.endswith("…")
            assert len(summary.progress.encode()) <= 256 + len("…".encode())
            assert (await client.task_find(id_prefix=b)).tasks[0].progress is None
            await client.nack(claim, error="upstream Timed Out")
            assert await ids(error="timed out", state="dead") == [a]

            # task_update: a priority and run now; only waiting tasks change.
            updated = await client.task_update(b, priority=8, run_now=True)
            assert (updated.id, updated.state, updated.priority) == (b, "ready", 8)
            assert updated.not_before_ms is None
            events = [e.event for e in (await client.task_get(b)).history]
            assert events[-2:] == ["priority_changed", "run_now"]
            with pytest.raises(muster.BadRequest):
                await client.task_update(b)
            with pytest.raises(muster.BadRequest):
                await client.task_update(b, priority=10)
            with pytest.raises(muster.InvalidInput):
                await client.task_update(b, priority=-1)
            with pytest.raises(muster.InvalidState):
                await client.task_update(a, priority=1)

            # member_undrain ends a drain; member_release refuses a member with leases,
            # and a name bound to no token (as every name is without tokens).
            (held,) = await client.claim("jobs", member="cli-9")
            assert (await client.member_drain("cli-9")).draining
            assert (await client.claim("jobs", member="cli-9")) == []
            undrained = await client.member_undrain("cli-9")
            assert (undrained.name, undrained.draining) == ("cli-9", False)
            with pytest.raises(muster.NotFound):
                await client.member_undrain("nobody")
            with pytest.raises(muster.InvalidState):
                await client.member_release("cli-9")
            await client.ack(held)
            with pytest.raises(muster.NotFound, match="bound to no principal"):
                await client.member_release("cli-9")

            # A snapshot of the store, on the daemon's host, in its snapshot root (by
            # default `backups` in its data directory); nowhere else.
            snapshot = (daemon.data / "backups").resolve() / "snapshot"
            copy = await client.admin_snapshot("snapshot")
            assert (copy.dir, copy.tasks, copy.queues) == (str(snapshot), 3, 2)
            assert snapshot.is_dir()
            with pytest.raises(muster.AlreadyExists):
                await client.admin_snapshot(str(snapshot))
            with pytest.raises(muster.BadRequest, match="not inside the snapshot root"):
                await client.admin_snapshot(str(tmp_path / "elsewhere"))
            assert not (tmp_path / "elsewhere").exists()

    run(body())


def test_member_release_frees_a_name_bound_to_a_token(bins: Path, tmp_path: Path) -> None:
    # With tokens, a member name is bound to the first token that uses it; an admin's
    # member_release frees it for another token.
    tokens = {"ops": "o" * 40, "team-a": "a" * 40, "team-b": "b" * 40}
    config = tmp_path / "muster.toml"
    config.write_text(
        "".join(
            f'[[tokens]]\nname = "{name}"\n'
            f'token_sha256 = "{hashlib.sha256(token.encode()).hexdigest()}"\n'
            f'roles = ["{"admin" if name == "ops" else "consume"}"]\n\n'
            for name, token in tokens.items()
        )
    )
    data = tmp_path / "data"
    data.mkdir()
    daemon = Daemon(bins, data, ["--config", str(config)])
    try:

        async def body() -> None:
            def connect(name: str) -> Any:
                return muster.Client.connect(**daemon.connect, token=tokens[name])

            async with (
                await connect("ops") as ops,
                await connect("team-a") as a,
                await connect("team-b") as b,
            ):
                await ops.queue_create("jobs")
                await ops.enqueue_many("jobs", [{"n": 1}, {"n": 2}])
                # A claim that gets a task binds the name (an empty one binds nothing).
                (first,) = await a.claim("jobs", member="gpu-1")
                await a.ack(first)
                with pytest.raises(muster.Forbidden, match="gpu-1"):
                    await b.claim("jobs", member="gpu-1")
                assert await ops.member_release("gpu-1") is None
                (second,) = await b.claim("jobs", member="gpu-1")
                await b.ack(second)
                with pytest.raises(muster.Forbidden, match="gpu-1"):
                    await a.claim("jobs", member="gpu-1")
                with pytest.raises(muster.NotFound, match="bound to no principal"):
                    await ops.member_release("gpu-2")

        run(body())
    finally:
        daemon.stop()


def test_sync_client_has_the_new_ops(daemon: Daemon, tmp_path: Path) -> None:
    with muster.sync.Client.connect(**daemon.connect) as client:
        client.queue_create("jobs")
        task = client.enqueue("jobs", {"n": 1}, delay=3600)
        assert [t.id for t in client.task_find("jobs", state="scheduled").tasks] == [task]
        assert client.task_update(task, run_now=True).state == "ready"
        client.claim("jobs", member="script")
        assert client.member_drain("script").draining
        assert not client.member_undrain("script").draining
        with pytest.raises(muster.InvalidState):
            client.member_release("script")
        assert client.admin_snapshot("copy").tasks == 1


def test_cluster_error_codes_have_their_classes() -> None:
    assert issubclass(muster.NotLeader, muster.ServerError)
    assert issubclass(muster.OutcomeUnknown, muster.ServerError)
    assert muster.NotLeader.code == "not_leader"
    assert muster.OutcomeUnknown.code == "outcome_unknown"


def test_a_list_of_addresses_reaches_the_single_daemon_among_them(daemon: Daemon) -> None:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"

    async def body() -> None:
        options = dict(daemon.connect, addr=f"{dead},{daemon.addr}")
        async with await muster.Client.connect(**options) as client:
            assert await client.queue_list() == []
        with pytest.raises(muster.InvalidInput) as bad:
            await muster.Client.connect(**dict(daemon.connect, addr=f"{daemon.addr},"))
        assert str(bad.value) == (
            f'invalid input: an empty address in "{daemon.addr}," '
            "(addresses are HOST:PORT separated by commas)"
        )

    run(body())
