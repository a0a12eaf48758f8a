"""The asyncio ``Worker``: the Rust worker's semantics with a Python handler per task."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import inspect
import json
import logging
import signal
import threading
import time
import traceback
from typing import Any, Awaitable, Callable, List, Optional, Sequence, Union

from . import _loop, _native, _trace
from ._client import Child, _children
from ._convert import Duration, json_text, ms, ms_required
from .records import ChildOutcome, OnTimeout, Resumed, Spawned, SpawnedChild, Suspended

_log = logging.getLogger("muster")

Handler = Callable[["Task"], Union[Awaitable[Any], Any]]
"""A handler: ``async def handle(task)``, or a plain function run in a thread pool."""


class Retry(Exception):
    """Raise from a handler to fail the task and have it retried after ``delay``.

    ``delay`` is seconds or a :class:`~datetime.timedelta`; ``None`` uses the queue's
    backoff. The failure counts toward the queue's ``max_attempts``; the message becomes
    the task's ``last_error``.
    """

    def __init__(self, message: str = "retry requested", *, delay: Optional[Duration] = None):
        """A retry after ``delay`` with ``message`` as the task's error."""
        super().__init__(message)
        self.delay = delay
        """The delay before the retry; the queue's backoff if ``None``."""


class DeadLetter(Exception):
    """Raise from a handler to send the task to dead at once, with ``reason`` as its error.

    No retry follows and no failure is counted; an operator can redrive it.
    """

    def __init__(self, reason: str):
        """Dead-letters the task with ``reason``."""
        super().__init__(reason)
        self.reason = reason
        """Why the task is dead; it becomes the task's ``last_error``."""


class Throttled(Exception):
    """Raise from a handler when a provider it calls said to slow down (an HTTP 429, a
    quota error): the task goes back as :meth:`Task.throttled` gives it back, spending
    no attempt.

    ``retry_after`` is seconds or a :class:`~datetime.timedelta` (1 ms to 365 days; 1 s
    if ``None``); ``limit`` the limit the provider throttled, one the task draws on
    (every one it draws on if ``None``).
    """

    def __init__(self, *, retry_after: Optional[Duration] = None, limit: Optional[str] = None):
        """A throttle of ``limit`` for ``retry_after``."""
        super().__init__(f"throttled (limit {limit!r}, retry after {retry_after!r})")
        self.retry_after = retry_after
        """How long the limit (or the task, if it draws on none) waits; 1 s if ``None``."""
        self.limit = limit
        """The limit the provider throttled; every one the task draws on if ``None``."""


class Task:
    """A task in a handler's hands.

    Its lease is renewed by the worker, in Rust, whatever the handler does. When the
    task must stop (a cancel, a lost or revoked lease, a lease that may lapse before a
    renewal gets through, or the grace period of a drain over) the handler's asyncio
    task is cancelled: it sees :class:`asyncio.CancelledError`, and the task is
    released without a failure unless the handler returns or raises something else. A
    synchronous handler cannot be interrupted: it should check :attr:`is_cancelled`.
    """

    __slots__ = ("_native", "_payload", "_resumed")

    def __init__(self, native: _native.Task) -> None:
        """Wraps the worker's native task; handlers are given one."""
        self._native = native
        self._payload: Any = _UNSET
        self._resumed: Any = _UNSET

    def __repr__(self) -> str:
        return f"<muster.Task {self.id}.{self.epoch} attempt={self.attempt}>"

    @property
    def id(self) -> str:
        """The task's id."""
        return self._native.id

    @property
    def queue(self) -> str:
        """The task's queue."""
        return self._native.queue

    @property
    def epoch(self) -> int:
        """The lease epoch of this delivery."""
        return self._native.epoch

    @property
    def attempt(self) -> int:
        """The delivery number: 1 on the first."""
        return self._native.attempt

    @property
    def failures(self) -> int:
        """Failures so far (nacks, lapses, revokes and reclaims)."""
        return self._native.failures

    @property
    def priority(self) -> int:
        """The task's priority, 0..9."""
        return self._native.priority

    @property
    def key(self) -> Optional[str]:
        """The task's key, if any."""
        return self._native.key

    @property
    def reclaimed(self) -> bool:
        """True if this member held the task before it restarted and got it back."""
        return self._native.reclaimed

    @property
    def payload(self) -> Any:
        """The payload, decoded from JSON."""
        if self._payload is _UNSET:
            self._payload = json.loads(self._native.payload)
        return self._payload

    @property
    def raw_payload(self) -> str:
        """The payload as the JSON text the producer sent."""
        return self._native.payload

    @property
    def progress(self) -> Any:
        """The latest checkpoint, decoded: the one this handler set, else the one stored
        by an earlier holder (``None`` if there is none)."""
        text = self._native.progress
        return None if text is None else json.loads(text)

    async def set_progress(self, progress: Any) -> None:
        """Sets a checkpoint (any JSON-serialisable object, or ``bytes`` of UTF-8 JSON
        text; at most 64 KiB of JSON).

        The worker stores it with a renewal within about a second, and before the task
        is released when the handler is stopped, so a new holder (or this member after a
        restart, with :attr:`reclaimed`) resumes from it. Awaiting does not wait for the
        daemon.
        """
        self.set_progress_nowait(progress)

    def set_progress_nowait(self, progress: Any) -> None:
        """:meth:`set_progress` for synchronous handlers (callable from any thread)."""
        self._native.set_progress(json_text(progress, "progress"))

    @property
    def is_cancelled(self) -> bool:
        """True once the task should stop; synchronous handlers should poll it."""
        return self._native.is_cancelled

    @property
    def is_draining(self) -> bool:
        """True once the worker is shutting down: finish within the grace period, or
        checkpoint and stop."""
        return self._native.is_draining

    async def draining(self) -> None:
        """Returns when the worker starts shutting down."""
        await self._native.draining(_loop.current())

    def throttled(
        self, *, retry_after: Optional[Duration] = None, limit: Optional[str] = None
    ) -> None:
        """Gives the task back because a provider it calls said to slow down (an HTTP
        429, a quota error), spending no attempt (callable from any thread).

        The task is ready again at its place with no failure counted, and ``limit``
        (one the task draws on; every one it draws on if ``None``) hands nothing out for
        the task's key for ``retry_after`` (seconds or :class:`~datetime.timedelta`, 1 ms
        to 365 days; 1 s if ``None``); a task that draws on no limit waits
        ``retry_after`` itself (PROTOCOL.md §5.46). This is the handler's outcome: the
        first outcome counts, so what the handler returns or raises afterwards is
        ignored; return right after. Raising :class:`Throttled` does the same.

        Raises :class:`~muster.InvalidInput` for a ``retry_after`` out of range or a
        ``limit`` that is not a limit's name. A limit the task does not draw on is
        refused by the daemon: the worker logs it, and the task's lease lapses.
        """
        self._native.throttled(ms(retry_after, "retry_after"), limit)

    @property
    def resumed(self) -> Optional[Resumed]:
        """How the task's last suspension ended, if it was suspended and resumed: the
        resume's ``data`` and who sent it, or ``timed_out``, and after a wait for its
        children their outcomes (:attr:`children`)."""
        if self._resumed is _UNSET:
            text = self._native.resumed
            self._resumed = None if text is None else Resumed._from(json.loads(text))
        resumed: Optional[Resumed] = self._resumed
        return resumed

    @property
    def children(self) -> List[ChildOutcome]:
        """The outcome of each child the task waited for (:meth:`spawn_and_wait`), as
        its wait ended, in the order they were spawned: ``state`` (``done``, ``dead``
        or ``cancelled`` once all have finished), ``result``, ``error``, and
        ``omitted`` when those were left out for size (read the child by its ``id``).
        Empty if the task did not wait for children."""
        resumed = self.resumed
        return [] if resumed is None else resumed.children

    @property
    def parent(self) -> Optional[str]:
        """The id of the task that spawned this one, if it is a child."""
        return self._native.parent

    @property
    def traceparent(self) -> Optional[str]:
        """The W3C ``traceparent`` this delivery carries, if any: the trace context of
        the span that enqueued (or spawned) the task, or, when ``musterd`` exports spans
        (``--otlp-endpoint``), this lease's span in that trace. With OpenTelemetry
        installed the handler already runs in a ``muster.task`` span that is its
        child."""
        return self._native.traceparent

    @property
    def tracestate(self) -> Optional[str]:
        """The W3C ``tracestate`` that goes with :attr:`traceparent`, if any."""
        return self._native.tracestate

    async def spawn(self, children: Sequence[Child]) -> List[SpawnedChild]:
        """Spawns children of the task, keeping its lease: each :class:`~muster.Child`
        becomes a task of its own (in its ``queue``, any existing one) that names this
        one as its :attr:`parent`, all in one atomic change. A ``child_key`` this task
        spawned before (in this run or an earlier one) enqueues nothing and answers that
        child, ``duplicate``: spawning again after a retry or a reclaim is safe.
        Cancelling this task cancels its unfinished children. Returns each child, in
        order, with its id and state.

        Raises what the daemon refuses with, storing nothing: :class:`~muster.BadRequest`
        (a bad or repeated child key), :class:`~muster.NotFound` (a queue that does not
        exist), :class:`~muster.LimitExceeded` (past 1000 children of one task, or 8
        spawns deep), :class:`~muster.LeaseLost`; :class:`~muster.ConnectionLost` if
        the worker is not connected (spawn again); :class:`~muster.InvalidInput`
        before sending for an item that is not a :class:`~muster.Child`.
        """
        fields = _children(children)
        replies = await self._native.spawn(_loop.current(), fields)
        return [SpawnedChild._from(c) for c in replies]

    async def spawn_and_wait(
        self,
        children: Sequence[Child],
        reason: str,
        *,
        timeout: Optional[Duration] = None,
        on_timeout: Optional[OnTimeout] = None,
    ) -> Spawned:
        """Spawns children as :meth:`spawn` does and suspends the task until every
        child it spawned (now or before) has finished, in one change: its lease ends as
        with :meth:`suspend` (the worker's slot is free, no attempt is spent; ``reason``
        is shown to people, ``timeout`` and ``on_timeout`` bound the wait as there). Once
        it succeeds the handler's outcome is the suspension, whatever it returns or
        raises: return. When every child has finished the task is ready again, and its
        next holder finds their outcomes in :attr:`children`.

        The reply's ``state`` is ``suspended`` (with a ``resume_token`` that ends the
        wait early), ``ready`` when every child had finished already (the next run comes
        at once), or ``cancelled``. ``children`` may be empty: then it waits for those
        spawned before. A refused spawn raises as :meth:`spawn` does, and the lease is
        still held: the handler's outcome is what it returns then.
        """
        fields = _children(children)
        (reply,) = await self._native.spawn_and_wait(
            _loop.current(), fields, reason, ms(timeout, "timeout"), on_timeout
        )
        return Spawned._from(reply)

    async def suspend(
        self,
        reason: str,
        *,
        timeout: Optional[Duration] = None,
        on_timeout: Optional[OnTimeout] = None,
    ) -> Suspended:
        """Suspends the task instead of settling it: its lease ends (the worker's slot
        is free, no attempt is spent, the checkpoint is kept) and it waits until someone
        resumes it with the returned ``resume_token`` (or an approver by its id), or its
        ``timeout`` (seconds or :class:`~datetime.timedelta`; 7 days if ``None``) does
        ``on_timeout`` (``"resume"``, ``"fail"`` or ``"cancel"``; ``"fail"`` if
        ``None``). Hand the token to whoever decides, then return: once suspended, what
        the handler returns or raises is ignored. The next holder sees
        :attr:`resumed`. Raises :class:`~muster.LeaseLost` if the lease is gone, and
        :class:`~muster.ConnectionLost` if the worker is not connected (the lease is
        still held then)."""
        (reply,) = await self._native.suspend(
            _loop.current(), reason, ms(timeout, "timeout"), on_timeout
        )
        return Suspended._from(reply)

    @property
    def output_start(self) -> int:
        """The number this run's first output chunk gets: how many chunks earlier runs
        of the task emitted (0 on its first, or if none did). Its chunks are numbered
        on from there, in the order emitted."""
        return self._native.output

    async def emit(self, text: str) -> None:
        """Appends a text chunk (at most 64 KiB of UTF-8) to the task's live output,
        which anyone allowed to read the task may follow (:meth:`Client.follow
        <muster.Client.follow>`, ``muster tail -f``; PROTOCOL.md §4.18).

        Chunks are buffered here and sent in order by the worker, in Rust, as many in
        each emit as have gathered, each stored once whatever the connection does;
        the worker sends what is buffered before it settles the task, so a follower
        sees every chunk, then the end. Returns once the chunk is buffered: it waits
        only while 1 MiB of chunks is (the daemon holds a task to 256 KiB/s as stored
        on average, after a 1 MiB burst); :meth:`flush_output` waits until the daemon
        has it. A task keeps its last 1 MiB (and 1,024 emits) of output as stored (each
        emit's chunks as JSON, a comma each, and 17 bytes): older chunks are
        dropped.

        Raises :class:`~muster.InvalidInput` for ``text`` that is not a ``str`` or is
        over 64 KiB; :class:`~muster.ConnectionLost` (its message ``output stopped:``
        and why) once the task's output has stopped: its lease was lost (e.g.
        ``lease_lost``), the daemon refused an emit for good (``disk_full``), or the
        worker stopped. Nothing emitted after that is stored; the handler should
        stop (it is usually being cancelled already).
        """
        await self._native.emit(_loop.current(), _text(text), None)

    async def emit_json(self, value: Any) -> None:
        """Appends a JSON chunk to the task's live output, as :meth:`emit` appends a
        text chunk: any JSON-serialisable object but ``None`` (the protocol reads a
        ``null`` chunk as none), or ``bytes`` of UTF-8 JSON text (sent as it is), at
        most 64 KiB of JSON. A follower reads it decoded, as the chunk's ``json``.
        Raises :class:`~muster.InvalidInput` for a value that is not JSON-serialisable,
        is ``None`` or is over 64 KiB, and what :meth:`emit` raises."""
        await self._native.emit(_loop.current(), None, _json_chunk(value))

    async def flush_output(self) -> None:
        """Waits until the daemon has stored every chunk emitted so far (the worker
        does this before it settles the task in any case). Raises
        :class:`~muster.ConnectionLost` (``output stopped: ...``) if the task's output
        stopped before (see :meth:`emit`)."""
        await self._native.flush_output(_loop.current())

    def emit_blocking(self, text: str) -> None:
        """:meth:`emit` for synchronous handlers (run in a thread): blocks until the
        chunk is buffered. Not from an event loop's thread (:class:`RuntimeError`):
        await :meth:`emit` there."""
        _refuse_inside_a_loop("emit_blocking")
        self._native.emit_blocking(_text(text), None)

    def emit_json_blocking(self, value: Any) -> None:
        """:meth:`emit_json` for synchronous handlers (run in a thread), as
        :meth:`emit_blocking` is :meth:`emit`'s."""
        _refuse_inside_a_loop("emit_json_blocking")
        self._native.emit_blocking(None, _json_chunk(value))

    @property
    def lease_deadline(self) -> float:
        """When, on the :func:`time.monotonic` clock, the worker stops this handler unless
        a renewal moves it: work that must not outlive the lease (a child process) should
        end by then."""
        return time.monotonic() + self._native.lease_remaining


_UNSET = object()


def _text(text: str) -> str:
    """A text chunk, checked to be a ``str``."""
    if not isinstance(text, str):
        raise _native.InvalidInput(
            f"a text chunk is a str, not {type(text).__name__}: emit_json sends a JSON value"
        )
    return text


def _json_chunk(value: Any) -> str:
    """The JSON text of a JSON chunk, checked not to be ``null``."""
    if value is None:
        raise _native.InvalidInput("a JSON chunk is not None (the protocol reads null as none)")
    return json_text(value, "the JSON chunk")


def _refuse_inside_a_loop(what: str) -> None:
    """Raises :class:`RuntimeError` on a thread running an event loop, which a blocking
    call would stall."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise RuntimeError(f"Task.{what} blocks: inside a running event loop, await its coroutine")


class Worker:
    """An agent: a member session that runs ``handler(task)`` for every task pushed to it.

    It is the Rust SDK's ``muster_sdk::Worker``, driven from asyncio: the member
    session, renewals (at a third of the lease, sooner with new progress), local lease
    deadlines, reconnects with resume, reclaim on start and drain all run in Rust, so a
    slow handler never delays another task's renewal.

    The handler's outcome settles the task: a return value acks it (the value, if not
    ``None``, is the result: JSON-serialisable, or ``bytes`` of UTF-8 JSON text, as the
    protocol carries JSON); raising
    :class:`Retry` or any other exception nacks it (with the exception's text as the
    error); :class:`DeadLetter` dead-letters it; :class:`Throttled` (or
    :meth:`Task.throttled`) gives it back without a failure and holds its limit; a
    handler cancelled by the worker (:class:`asyncio.CancelledError`) releases it
    without a failure. Coroutine
    functions run on the event loop that awaits :meth:`run`; plain functions run in a
    thread pool (``executor``, else one of ``capacity`` threads), so they never block
    it, and stop early by raising :class:`asyncio.CancelledError` themselves.

    ``member`` is the stable agent name leases belong to; a restarted process under the
    same name gets its tasks back at once (``reclaim_on_start``). ``grace`` (seconds) is
    how long handlers get to finish on shutdown; ``liveness`` (2 to 60 s) how long the
    daemon may not hear from the agent before it counts it unreachable. Connection
    arguments are those of :meth:`Client.connect <muster.Client.connect>`.
    """

    def __init__(
        self,
        member: str,
        queues: Union[str, Sequence[str]],
        *,
        capacity: int = 1,
        labels: Sequence[str] = (),
        grace: Duration = 25.0,
        reclaim_on_start: bool = True,
        liveness: Duration = 5.0,
        executor: Optional[concurrent.futures.Executor] = None,
        addr: Optional[str] = None,
        data: Optional[str] = None,
        ca: Optional[str] = None,
        pin: Optional[str] = None,
        token: Optional[str] = None,
        server_name: Optional[str] = None,
        token_file: Optional[str] = None,
        context: Optional[str] = None,
    ) -> None:
        """Configures a worker; nothing connects before :meth:`run`, but the connection
        options are settled here (the contexts file is read): a bad context raises
        :class:`~muster.ConnectError` now."""
        names = [queues] if isinstance(queues, str) else list(queues)
        self._capacity = capacity
        self._executor = executor
        self._native = _native.Worker(
            member,
            names,
            capacity,
            list(labels),
            ms_required(grace, "grace"),
            reclaim_on_start,
            ms_required(liveness, "liveness"),
            addr,
            data,
            ca,
            pin,
            token,
            server_name,
            token_file,
            context,
        )

    def shutdown(self) -> None:
        """Starts a graceful shutdown (from any thread): take nothing new, let handlers
        finish within the grace period, cancel the rest, release what is left with its
        latest checkpoint, and close the connection. :meth:`run` returns then."""
        self._native.shutdown()

    async def run(self, handler: Handler, *, handle_signals: bool = True) -> None:
        """Runs until shut down (by :meth:`shutdown`, SIGTERM or SIGINT when
        ``handle_signals`` and this is the main thread, or an operator's drain) and every
        task is settled or released. A worker runs once.

        Cancelling this coroutine drains the worker as :meth:`shutdown` does, then
        raises :class:`asyncio.CancelledError`. Raises :class:`~muster.Replaced` when
        another process took the member name over, or the daemon's refusal of the
        session (e.g. :class:`~muster.BadRequest` for a bad name,
        :class:`~muster.Forbidden` for a queue the token may not consume). A queue that
        does not exist yet is waited for, not raised: the worker logs it once (a warning
        naming it, on the ``muster`` logger), serves its other queues meanwhile and
        subscribes again with its backoff until the queue is created.
        """
        loop = asyncio.get_running_loop()
        signals = self._install_signals(loop) if handle_signals else []
        pool: Optional[concurrent.futures.ThreadPoolExecutor] = None
        executor = self._executor
        is_async = _is_coroutine_function(handler)
        if executor is None and not is_async:
            pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=self._capacity, thread_name_prefix="muster-handler"
            )
            executor = pool
        runner = functools.partial(_run_one, handler, is_async, executor)
        # Handlers start and are cancelled from the native worker's inbox, which wakes
        # the loop through this file descriptor (src/worker.rs).
        wakeup = self._native.wakeup_fd
        loop.add_reader(wakeup, self._native.pump)
        try:
            running = self._native.run(_loop.current(), runner, loop)
            stopped = False
            while not running.done():
                try:
                    await asyncio.shield(running)
                except asyncio.CancelledError:
                    if running.done():
                        raise
                    stopped = True
                    self.shutdown()
            running.result()
            if stopped:
                raise asyncio.CancelledError
        finally:
            loop.remove_reader(wakeup)
            for sig in signals:
                loop.remove_signal_handler(sig)
            if pool is not None:
                # Threads of handlers that were given up may still run: do not wait.
                pool.shutdown(wait=False)

    def _install_signals(self, loop: asyncio.AbstractEventLoop) -> List[signal.Signals]:
        if threading.current_thread() is not threading.main_thread():
            return []
        installed: List[signal.Signals] = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self._on_signal, sig)
            except (NotImplementedError, RuntimeError, ValueError):
                continue
            installed.append(sig)
        return installed

    def _on_signal(self, sig: int) -> None:
        _log.info("%s received: draining", signal.Signals(sig).name)
        self.shutdown()


def _is_coroutine_function(handler: Handler) -> bool:
    call = getattr(handler, "__call__", None)  # noqa: B004 - callable objects too
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call)


async def _run_one(
    handler: Handler,
    is_async: bool,
    executor: Optional[concurrent.futures.Executor],
    native: _native.Task,
) -> None:
    """Runs the handler on one task and hands its outcome to the native worker, in the
    span ``muster.task`` when OpenTelemetry is installed (see ``_trace``)."""
    with _trace.handler_span(
        native.id, native.queue, native.attempt, native.epoch, native.traceparent, native.tracestate
    ) as span:
        await _settle(handler, is_async, executor, native, span)


async def _settle(
    handler: Handler,
    is_async: bool,
    executor: Optional[concurrent.futures.Executor],
    native: _native.Task,
    span: Any,
) -> None:
    """Runs the handler on one task and hands its outcome to the native worker; a
    failure marks ``span`` (``None`` without OpenTelemetry)."""
    task = Task(native)
    try:
        if is_async:
            result = await handler(task)
        else:
            result = await _in_thread(handler, task, executor)
        if inspect.isawaitable(result):
            result = await result
    except asyncio.CancelledError:
        native.release()
        raise
    except Retry as e:
        _trace.failed(span, f"retry: {e}")
        native.nack(ms(e.delay, "Retry.delay"), str(e))
        return
    except DeadLetter as e:
        _trace.failed(span, f"dead letter: {e.reason}")
        native.dead_letter(e.reason)
        return
    except Throttled as e:
        try:
            native.throttled(ms(e.retry_after, "Throttled.retry_after"), e.limit)
        except _native.MusterError as bad:
            native.nack(None, f"the handler's throttle could not be sent: {bad}")
        return
    except Exception as e:
        _log.warning("task %s: the handler failed", native.id, exc_info=True)
        error = _error_text(e)
        _trace.failed(span, error, e)
        native.nack(None, error)
        return
    try:
        native.ack(None if result is None else json_text(result, "the handler's result"))
    except _native.MusterError as e:
        error = f"the handler's result could not be sent: {e}"
        _trace.failed(span, error, e)
        native.nack(None, error)


async def _in_thread(
    handler: Handler, task: Task, executor: Optional[concurrent.futures.Executor]
) -> Any:
    """Runs a synchronous handler in the executor. A cancel cannot stop the thread, so
    it is waited for all the same (the handler should check ``task.is_cancelled`` and
    raise :class:`asyncio.CancelledError` to stop); if the worker gives the handler up
    (its lease ended), the thread's outcome is moot."""
    loop = asyncio.get_running_loop()
    call = functools.partial(contextvars.copy_context().run, _stoppable, handler, task)
    running = loop.run_in_executor(executor, call)
    while True:
        try:
            result = await asyncio.shield(running)
        except asyncio.CancelledError:
            if running.cancelled():
                raise
            continue
        if result is _STOPPED:
            raise asyncio.CancelledError
        return result


def _stoppable(handler: Handler, task: Task) -> Any:
    """Calls a synchronous handler; its :class:`asyncio.CancelledError` becomes
    :data:`_STOPPED`, which the event loop's side raises again."""
    try:
        return handler(task)
    except asyncio.CancelledError:
        return _STOPPED


_STOPPED = object()


def _error_text(error: BaseException) -> str:
    """``Type: message`` of an exception, as a task's error."""
    return "".join(traceback.format_exception_only(type(error), error)).strip()
