"""A blocking facade for scripts: the same ``Client`` and ``Worker``, without ``await``.

Each :class:`Client` keeps a private event loop and runs every call to completion on
it, so it must not be used from inside a running event loop (use :class:`muster.Client`
there). Methods take the same arguments and return the same records as their asyncio
counterparts; see those for the details::

    from muster.sync import Client

    with Client.connect() as client:
        client.queue_create("jobs")
        ids = client.enqueue_many("jobs", [{"n": n} for n in range(10)])
        print(client.wait(ids, timeout=60).finished)
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import (
    Any,
    AsyncGenerator,
    AsyncIterator,
    Callable,
    Coroutine,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    TypeVar,
    Union,
)

from . import _client, _worker
from ._convert import Duration
from .records import (
    Backoff,
    CancelResult,
    CatchUp,
    Claim,
    ClusterStatus,
    CountResult,
    EmitResult,
    EnqueuedTask,
    FindCursor,
    FindResult,
    FollowResult,
    LimitInfo,
    MemberDescription,
    MemberInfo,
    OnTimeout,
    OutputChunk,
    QueueInfo,
    RenewResult,
    ResumeResult,
    Schedule,
    ServerStats,
    SettleResult,
    SnapshotResult,
    Spawned,
    Suspended,
    TaskInfo,
    TaskPage,
    TaskState,
    TaskSummary,
    WaitResult,
)

_T = TypeVar("_T")

__all__ = ["Client", "Worker"]


class Client:
    """A blocking :class:`muster.Client`. Not thread-safe: one thread at a time."""

    __slots__ = ("_client", "_loop")

    def __init__(self, client: _client.Client, loop: asyncio.AbstractEventLoop) -> None:
        """Wraps an asyncio client and its loop; use :meth:`connect` instead."""
        self._client = client
        self._loop = loop

    @classmethod
    def connect(
        cls,
        addr: Optional[str] = None,
        *,
        data: Optional[str] = None,
        ca: Optional[str] = None,
        pin: Optional[str] = None,
        token: Optional[str] = None,
        server_name: Optional[str] = None,
        token_file: Optional[str] = None,
        context: Optional[str] = None,
    ) -> Client:
        """Connects as :meth:`muster.Client.connect` does."""
        return cls._open(
            _client.Client.connect,
            addr,
            data=data,
            ca=ca,
            pin=pin,
            token=token,
            server_name=server_name,
            token_file=token_file,
            context=context,
        )

    @classmethod
    def connect_node(
        cls,
        addr: Optional[str] = None,
        *,
        data: Optional[str] = None,
        ca: Optional[str] = None,
        pin: Optional[str] = None,
        token: Optional[str] = None,
        server_name: Optional[str] = None,
        token_file: Optional[str] = None,
        context: Optional[str] = None,
    ) -> Client:
        """Connects to exactly one cluster node as :meth:`muster.Client.connect_node` does."""
        return cls._open(
            _client.Client.connect_node,
            addr,
            data=data,
            ca=ca,
            pin=pin,
            token=token,
            server_name=server_name,
            token_file=token_file,
            context=context,
        )

    @classmethod
    def _open(
        cls,
        connect: Callable[..., Coroutine[Any, Any, _client.Client]],
        addr: Optional[str],
        **options: Optional[str],
    ) -> Client:
        _refuse_inside_a_loop()
        loop = asyncio.new_event_loop()
        try:
            client = loop.run_until_complete(connect(addr, **options))
        except BaseException:
            loop.close()
            raise
        return cls(client, loop)

    def _run(self, call: Coroutine[Any, Any, _T]) -> _T:
        try:
            _refuse_inside_a_loop()
        except RuntimeError:
            call.close()
            raise
        return self._loop.run_until_complete(call)

    def close(self) -> None:
        """Closes the connection and the private loop."""
        try:
            self._run(self._client.close())
        finally:
            self._loop.close()

    def __enter__(self) -> Client:
        """The client itself; it is closed on exit."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Closes the client."""
        self.close()

    def follow_stream(
        self, task: str, from_: int = 0, *, poll: Duration = 30.0
    ) -> Iterator[OutputChunk]:
        """Blocking :meth:`muster.Client.follow_stream`: an iterator of the task's output
        chunks until its end, each step run on the client's loop. A ``poll`` out of
        range raises now; stopping early (``break``) ends the stream's follow."""
        return self._iterate(self._client.follow_stream(task, from_, poll=poll))

    def _iterate(self, stream: AsyncIterator[_T]) -> Iterator[_T]:
        """The items of an async iterator, each awaited on the client's loop; an async
        generator left before its end is closed on that loop."""
        try:
            while True:
                _refuse_inside_a_loop()
                try:
                    item = self._loop.run_until_complete(stream.__anext__())
                except StopAsyncIteration:
                    return
                yield item
        finally:
            if isinstance(stream, AsyncGenerator) and not self._loop.is_closed():
                try:
                    _refuse_inside_a_loop()
                except RuntimeError:
                    pass  # left open: it never runs again
                else:
                    self._loop.run_until_complete(stream.aclose())

    # Generated by scripts/gen_sync.py from _client.py: do not edit below.

    def queue_create(
        self,
        queue: str,
        *,
        lease: Optional[Duration] = None,
        max_attempts: Optional[int] = None,
        retry_backoff: Optional[Backoff] = None,
        key_concurrency: Optional[int] = None,
        retention: Optional[Duration] = None,
        max_runtime: Optional[Duration] = None,
        paused: Optional[bool] = None,
        fair: Optional[bool] = None,
        group_weights: Optional[Mapping[str, int]] = None,
    ) -> QueueInfo:
        """Blocking :meth:`muster.Client.queue_create`."""
        return self._run(
            self._client.queue_create(
                queue,
                lease=lease,
                max_attempts=max_attempts,
                retry_backoff=retry_backoff,
                key_concurrency=key_concurrency,
                retention=retention,
                max_runtime=max_runtime,
                paused=paused,
                fair=fair,
                group_weights=group_weights,
            )
        )

    def queue_list(self) -> List[QueueInfo]:
        """Blocking :meth:`muster.Client.queue_list`."""
        return self._run(self._client.queue_list())

    def queue_describe(self, queue: str) -> QueueInfo:
        """Blocking :meth:`muster.Client.queue_describe`."""
        return self._run(self._client.queue_describe(queue))

    def queue_update(
        self,
        queue: str,
        *,
        lease: Optional[Duration] = None,
        max_attempts: Optional[int] = None,
        retry_backoff: Optional[Backoff] = None,
        key_concurrency: Optional[int] = None,
        retention: Optional[Duration] = None,
        max_runtime: Optional[Duration] = None,
        paused: Optional[bool] = None,
        fair: Optional[bool] = None,
        group_weights: Optional[Mapping[str, int]] = None,
    ) -> QueueInfo:
        """Blocking :meth:`muster.Client.queue_update`."""
        return self._run(
            self._client.queue_update(
                queue,
                lease=lease,
                max_attempts=max_attempts,
                retry_backoff=retry_backoff,
                key_concurrency=key_concurrency,
                retention=retention,
                max_runtime=max_runtime,
                paused=paused,
                fair=fair,
                group_weights=group_weights,
            )
        )

    def queue_pause(self, queue: str) -> QueueInfo:
        """Blocking :meth:`muster.Client.queue_pause`."""
        return self._run(self._client.queue_pause(queue))

    def queue_resume(self, queue: str) -> QueueInfo:
        """Blocking :meth:`muster.Client.queue_resume`."""
        return self._run(self._client.queue_resume(queue))

    def queue_purge(self, queue: str) -> int:
        """Blocking :meth:`muster.Client.queue_purge`."""
        return self._run(self._client.queue_purge(queue))

    def queue_delete(self, queue: str) -> int:
        """Blocking :meth:`muster.Client.queue_delete`."""
        return self._run(self._client.queue_delete(queue))

    def enqueue(
        self,
        queue: str,
        payload: Any,
        *,
        priority: Optional[int] = None,
        key: Optional[str] = None,
        delay: Optional[Duration] = None,
        at: Optional[Union[datetime, float]] = None,
        requires: Sequence[str] = (),
        idempotency_key: Optional[str] = None,
        limits: Sequence[_client.LimitRef] = (),
        group: Optional[str] = None,
        traceparent: Optional[str] = None,
        tracestate: Optional[str] = None,
    ) -> str:
        """Blocking :meth:`muster.Client.enqueue`."""
        return self._run(
            self._client.enqueue(
                queue,
                payload,
                priority=priority,
                key=key,
                delay=delay,
                at=at,
                requires=requires,
                idempotency_key=idempotency_key,
                limits=limits,
                group=group,
                traceparent=traceparent,
                tracestate=tracestate,
            )
        )

    def enqueue_many(self, queue: str, tasks: Iterable[Union[_client.NewTask, Any]]) -> List[str]:
        """Blocking :meth:`muster.Client.enqueue_many`."""
        return self._run(self._client.enqueue_many(queue, tasks))

    def task_get(self, task: str) -> TaskInfo:
        """Blocking :meth:`muster.Client.task_get`."""
        return self._run(self._client.task_get(task))

    def task_list(
        self,
        queue: str,
        state: TaskState,
        *,
        after: Optional[str] = None,
        limit: Optional[int] = None,
    ) -> TaskPage:
        """Blocking :meth:`muster.Client.task_list`."""
        return self._run(self._client.task_list(queue, state, after=after, limit=limit))

    def task_find(
        self,
        queue: Optional[str] = None,
        *,
        state: Optional[TaskState] = None,
        id_prefix: Optional[str] = None,
        key: Optional[str] = None,
        idempotency_key: Optional[str] = None,
        label: Optional[str] = None,
        error: Optional[str] = None,
        payload: Optional[str] = None,
        field: Optional[Tuple[str, Any]] = None,
        newest_first: bool = False,
        after: Optional[FindCursor] = None,
        limit: Optional[int] = None,
    ) -> FindResult:
        """Blocking :meth:`muster.Client.task_find`."""
        return self._run(
            self._client.task_find(
                queue,
                state=state,
                id_prefix=id_prefix,
                key=key,
                idempotency_key=idempotency_key,
                label=label,
                error=error,
                payload=payload,
                field=field,
                newest_first=newest_first,
                after=after,
                limit=limit,
            )
        )

    def task_update(
        self, task: str, *, priority: Optional[int] = None, run_now: bool = False
    ) -> TaskSummary:
        """Blocking :meth:`muster.Client.task_update`."""
        return self._run(self._client.task_update(task, priority=priority, run_now=run_now))

    def wait(self, tasks: Union[str, Sequence[str]], timeout: Duration) -> WaitResult:
        """Blocking :meth:`muster.Client.wait`."""
        return self._run(self._client.wait(tasks, timeout))

    def cancel(self, task: str) -> CancelResult:
        """Blocking :meth:`muster.Client.cancel`."""
        return self._run(self._client.cancel(task))

    def claim(
        self,
        queues: Union[str, Sequence[str]],
        *,
        max: int = 1,
        wait: Optional[Duration] = None,
        lease: Optional[Duration] = None,
        member: Optional[str] = None,
        labels: Sequence[str] = (),
    ) -> List[Claim]:
        """Blocking :meth:`muster.Client.claim`."""
        return self._run(
            self._client.claim(
                queues, max=max, wait=wait, lease=lease, member=member, labels=labels
            )
        )

    def renew(
        self, claim: _client.ClaimRef, *, extend: Optional[Duration] = None, progress: Any = None
    ) -> RenewResult:
        """Blocking :meth:`muster.Client.renew`."""
        return self._run(self._client.renew(claim, extend=extend, progress=progress))

    def ack(self, claim: _client.ClaimRef, result: Any = None) -> SettleResult:
        """Blocking :meth:`muster.Client.ack`."""
        return self._run(self._client.ack(claim, result))

    def nack(
        self,
        claim: _client.ClaimRef,
        *,
        delay: Optional[Duration] = None,
        error: Optional[str] = None,
    ) -> SettleResult:
        """Blocking :meth:`muster.Client.nack`."""
        return self._run(self._client.nack(claim, delay=delay, error=error))

    def release(self, claim: _client.ClaimRef) -> SettleResult:
        """Blocking :meth:`muster.Client.release`."""
        return self._run(self._client.release(claim))

    def throttled(
        self,
        claim: _client.ClaimRef,
        *,
        retry_after: Optional[Duration] = None,
        limit: Optional[str] = None,
        error: Optional[str] = None,
    ) -> SettleResult:
        """Blocking :meth:`muster.Client.throttled`."""
        return self._run(
            self._client.throttled(claim, retry_after=retry_after, limit=limit, error=error)
        )

    def suspend(
        self,
        claim: _client.ClaimRef,
        reason: str,
        *,
        timeout: Optional[Duration] = None,
        on_timeout: Optional[OnTimeout] = None,
    ) -> Suspended:
        """Blocking :meth:`muster.Client.suspend`."""
        return self._run(
            self._client.suspend(claim, reason, timeout=timeout, on_timeout=on_timeout)
        )

    def spawn(
        self,
        claim: _client.ClaimRef,
        children: Sequence[_client.Child],
        *,
        wait: bool = False,
        reason: Optional[str] = None,
        timeout: Optional[Duration] = None,
        on_timeout: Optional[OnTimeout] = None,
    ) -> Spawned:
        """Blocking :meth:`muster.Client.spawn`."""
        return self._run(
            self._client.spawn(
                claim, children, wait=wait, reason=reason, timeout=timeout, on_timeout=on_timeout
            )
        )

    def emit(
        self, claim: _client.ClaimRef, at: int, chunks: Sequence[Union[str, _client.Chunk]]
    ) -> EmitResult:
        """Blocking :meth:`muster.Client.emit`."""
        return self._run(self._client.emit(claim, at, chunks))

    def follow(
        self, task: str, from_: int = 0, *, timeout: Optional[Duration] = None
    ) -> FollowResult:
        """Blocking :meth:`muster.Client.follow`."""
        return self._run(self._client.follow(task, from_, timeout=timeout))

    def resume(self, token: str, data: Any = None) -> ResumeResult:
        """Blocking :meth:`muster.Client.resume`."""
        return self._run(self._client.resume(token, data))

    def resume_task(self, task: str, data: Any = None) -> ResumeResult:
        """Blocking :meth:`muster.Client.resume_task`."""
        return self._run(self._client.resume_task(task, data))

    def dead_letter(self, claim: _client.ClaimRef, error: str) -> SettleResult:
        """Blocking :meth:`muster.Client.dead_letter`."""
        return self._run(self._client.dead_letter(claim, error))

    def limit_set(
        self,
        name: str,
        *,
        rate: Optional[_client.RateRef] = None,
        burst: Optional[int] = None,
        concurrency: Optional[int] = None,
        per_key: bool = False,
    ) -> LimitInfo:
        """Blocking :meth:`muster.Client.limit_set`."""
        return self._run(
            self._client.limit_set(
                name, rate=rate, burst=burst, concurrency=concurrency, per_key=per_key
            )
        )

    def limit_get(self, name: str) -> LimitInfo:
        """Blocking :meth:`muster.Client.limit_get`."""
        return self._run(self._client.limit_get(name))

    def limit_list(self) -> List[LimitInfo]:
        """Blocking :meth:`muster.Client.limit_list`."""
        return self._run(self._client.limit_list())

    def limit_delete(self, name: str) -> int:
        """Blocking :meth:`muster.Client.limit_delete`."""
        return self._run(self._client.limit_delete(name))

    def schedule_set(
        self,
        name: str,
        *,
        cron: str,
        queue: str,
        payload: Any = None,
        tz: Optional[str] = None,
        catch_up: Optional[CatchUp] = None,
        paused: Optional[bool] = None,
        priority: Optional[int] = None,
        key: Optional[str] = None,
        delay: Optional[Duration] = None,
        requires: Sequence[str] = (),
        limits: Sequence[_client.LimitRef] = (),
        group: Optional[str] = None,
    ) -> Schedule:
        """Blocking :meth:`muster.Client.schedule_set`."""
        return self._run(
            self._client.schedule_set(
                name,
                cron=cron,
                queue=queue,
                payload=payload,
                tz=tz,
                catch_up=catch_up,
                paused=paused,
                priority=priority,
                key=key,
                delay=delay,
                requires=requires,
                limits=limits,
                group=group,
            )
        )

    def schedule_get(self, name: str) -> Schedule:
        """Blocking :meth:`muster.Client.schedule_get`."""
        return self._run(self._client.schedule_get(name))

    def schedule_list(self) -> List[Schedule]:
        """Blocking :meth:`muster.Client.schedule_list`."""
        return self._run(self._client.schedule_list())

    def schedule_pause(self, name: str) -> Schedule:
        """Blocking :meth:`muster.Client.schedule_pause`."""
        return self._run(self._client.schedule_pause(name))

    def schedule_resume(self, name: str) -> Schedule:
        """Blocking :meth:`muster.Client.schedule_resume`."""
        return self._run(self._client.schedule_resume(name))

    def schedule_delete(self, name: str) -> None:
        """Blocking :meth:`muster.Client.schedule_delete`."""
        return self._run(self._client.schedule_delete(name))

    def schedule_run(self, name: str) -> EnqueuedTask:
        """Blocking :meth:`muster.Client.schedule_run`."""
        return self._run(self._client.schedule_run(name))

    def redrive(
        self, queue: str, ids: Sequence[str] = (), *, all: bool = False, dry_run: bool = False
    ) -> CountResult:
        """Blocking :meth:`muster.Client.redrive`."""
        return self._run(self._client.redrive(queue, ids, all=all, dry_run=dry_run))

    def discard(
        self, queue: str, ids: Sequence[str] = (), *, all: bool = False, dry_run: bool = False
    ) -> CountResult:
        """Blocking :meth:`muster.Client.discard`."""
        return self._run(self._client.discard(queue, ids, all=all, dry_run=dry_run))

    def member_list(self) -> List[MemberInfo]:
        """Blocking :meth:`muster.Client.member_list`."""
        return self._run(self._client.member_list())

    def member_describe(self, member: str) -> MemberDescription:
        """Blocking :meth:`muster.Client.member_describe`."""
        return self._run(self._client.member_describe(member))

    def member_drain(self, member: str) -> MemberInfo:
        """Blocking :meth:`muster.Client.member_drain`."""
        return self._run(self._client.member_drain(member))

    def member_undrain(self, member: str) -> MemberInfo:
        """Blocking :meth:`muster.Client.member_undrain`."""
        return self._run(self._client.member_undrain(member))

    def member_release(self, member: str) -> None:
        """Blocking :meth:`muster.Client.member_release`."""
        return self._run(self._client.member_release(member))

    def lease_revoke(self, task: str) -> SettleResult:
        """Blocking :meth:`muster.Client.lease_revoke`."""
        return self._run(self._client.lease_revoke(task))

    def server_stats(self) -> ServerStats:
        """Blocking :meth:`muster.Client.server_stats`."""
        return self._run(self._client.server_stats())

    def admin_snapshot(self, dir: str) -> SnapshotResult:
        """Blocking :meth:`muster.Client.admin_snapshot`."""
        return self._run(self._client.admin_snapshot(dir))

    def cluster_status(self) -> ClusterStatus:
        """Blocking :meth:`muster.Client.cluster_status`."""
        return self._run(self._client.cluster_status())

    def cluster_add(
        self,
        node: int,
        addr: str,
        cluster_addr: str,
        *,
        learner: bool = False,
        catch_up: Optional[Duration] = None,
    ) -> ClusterStatus:
        """Blocking :meth:`muster.Client.cluster_add`."""
        return self._run(
            self._client.cluster_add(node, addr, cluster_addr, learner=learner, catch_up=catch_up)
        )

    def cluster_remove(self, node: int) -> ClusterStatus:
        """Blocking :meth:`muster.Client.cluster_remove`."""
        return self._run(self._client.cluster_remove(node))

    # End of the generated methods.


def _refuse_inside_a_loop() -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise RuntimeError("muster.sync blocks: inside a running event loop, use muster.Client")


class Worker(_worker.Worker):
    """A :class:`muster.Worker` whose :meth:`run` blocks until the worker is done.

    Handlers may be coroutine functions or plain functions (run in a thread pool).
    """

    def run(self, handler: _worker.Handler, *, handle_signals: bool = True) -> None:  # type: ignore[override]
        """Runs the worker on a new event loop until it is shut down (SIGTERM and SIGINT
        drain it when this is the main thread)."""
        asyncio.run(super().run(handler, handle_signals=handle_signals))
