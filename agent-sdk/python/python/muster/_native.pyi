"""Types of the extension module ``muster._native`` (src/*.rs): the private layer under
the public API. Requests go as dicts of their fields and replies come back as dicts;
durations are integer milliseconds."""

import asyncio
from typing import Any, Awaitable, Callable, Coroutine, Dict, List, Optional, Tuple, final

__all__ = [
    "Loop",
    "Client",
    "Json",
    "Worker",
    "Task",
    "connect",
    "next_log",
    "stop_logs",
    "MusterError",
    "ConnectError",
    "ConnectionLost",
    "ProtocolError",
    "InvalidInput",
    "ServerError",
    "BadRequest",
    "UnknownOp",
    "NotFound",
    "AlreadyExists",
    "LeaseLost",
    "InvalidState",
    "TooLarge",
    "LimitExceeded",
    "Unauthorized",
    "Forbidden",
    "Replaced",
    "ShuttingDown",
    "DiskFull",
    "NotLeader",
    "OutcomeUnknown",
    "StaleToken",
    "MAX_BATCH",
    "MAX_PAGE",
]

MAX_BATCH: int
MAX_PAGE: int

class MusterError(Exception):
    """The root of every error raised by muster."""

    code: Optional[str]
    """The protocol's error code of a refusal (a ``ServerError`` subclass), else ``None``."""

class ConnectError(MusterError):
    """The connection could not be made: the address, the TLS trust or the handshake
    failed, or the contexts file is unreadable or names no such context."""

class ConnectionLost(MusterError):
    """The connection was lost before the reply came: the request may or may not have
    taken effect."""

class ProtocolError(MusterError):
    """The daemon sent something this client does not understand."""

class InvalidInput(MusterError):
    """The request was refused before it was sent: not JSON-serialisable, over a size
    limit, or out of range."""

class ServerError(MusterError):
    """The daemon refused the request; ``code`` is the protocol's error code."""

class BadRequest(ServerError):
    """bad_request: the request is malformed or a value is invalid."""

class UnknownOp(ServerError):
    """unknown_op: the daemon does not know the operation."""

class NotFound(ServerError):
    """not_found: the named queue, task or member does not exist."""

class AlreadyExists(ServerError):
    """already_exists: the queue to create exists already."""

class LeaseLost(ServerError):
    """lease_lost: the claim's epoch is not the task's current lease (it lapsed, was
    revoked, re-leased or settled)."""

class InvalidState(ServerError):
    """invalid_state: the task's state does not allow the request."""

class TooLarge(ServerError):
    """too_large: a size limit was exceeded (payload, result, progress, error text, batch)."""

class LimitExceeded(ServerError):
    """limit: a count limit of the daemon was reached (e.g. the number of queues)."""

class Unauthorized(ServerError):
    """unauthorized: no valid token was presented."""

class Forbidden(ServerError):
    """forbidden: the token's roles or queue patterns do not allow this, or the member
    name belongs to another principal."""

class Replaced(ServerError):
    """replaced: a newer session under the same member name took over."""

class ShuttingDown(ServerError):
    """shutting_down: the daemon is stopping and takes no new work."""

class DiskFull(ServerError):
    """disk_full: the daemon's disk alarm is on; enqueues are refused until space comes back."""

class NotLeader(ServerError):
    """not_leader: the cluster node is not the leader; the client connects to the leader
    itself when given every node's address (``addr="HOST:PORT,HOST:PORT,..."``)."""

class OutcomeUnknown(ServerError):
    """outcome_unknown: the cluster's leader lost its leadership before the request was
    agreed on: it may or may not have taken effect; retry it idempotently."""

class StaleToken(ServerError):
    """stale_token: the resume token does not name the task's current suspension: it was
    spent, it is an earlier suspension's, or the task is no longer suspended."""

@final
class Loop:
    """One asyncio event loop's end of the bridge: calls resolve their futures through
    it when the loop calls ``pump`` (it watches ``wakeup_fd``)."""

    def __init__(self) -> None:
        """A bridge; register ``pump`` on ``wakeup_fd`` with the loop."""
    @property
    def wakeup_fd(self) -> int:
        """The descriptor the loop watches."""
    def pump(self) -> None:
        """Resolves the futures of every call that finished."""

def connect(
    done: Loop,
    addr: Optional[str] = None,
    data: Optional[str] = None,
    ca: Optional[str] = None,
    pin: Optional[str] = None,
    token: Optional[str] = None,
    server_name: Optional[str] = None,
    token_file: Optional[str] = None,
    context: Optional[str] = None,
    node: bool = False,
) -> Awaitable[Client]:
    """Connects; resolves to a ``Client``. The options are settled as the CLI settles
    them (arguments, ``MUSTER_*`` variables, the context in use); raises ``ConnectError``
    for a bad contexts file or an unknown context. With ``node``, to exactly the one
    address given, leader or not; else to the leader among the addresses."""

def next_log() -> Optional[Tuple[int, str]]:
    """Waits, without the GIL, for the next SDK log record ``(logging level, message)``;
    ``None`` once ``stop_logs`` was called."""

def stop_logs() -> None:
    """Ends every wait of ``next_log``."""

@final
class Client:
    """A connection to ``musterd``; every method returns an awaitable."""

    def close(self, done: Loop) -> Awaitable[None]:
        """Closes the connection, waiting (at most 1 s) until the daemon was told."""
    def call(
        self, done: Loop, op: str, requests: List[Dict[str, Any]]
    ) -> Awaitable[List[Dict[str, Any]]]:
        """Sends op ``op`` once per request (each a dict of its fields, ``None`` ones
        left out; ``bytes`` and ``Json`` values are JSON values), in order and
        pipelined; the replies (each the reply frame's object) in the same order. A
        request the daemon would not decode raises ``InvalidInput`` and is not sent."""

@final
class Json:
    """A JSON value in a request's fields, written as ``json.dumps(value,
    separators=(",", ":"), ensure_ascii=False, allow_nan=False)`` writes it; a value it
    refuses raises ``InvalidInput`` naming ``what``."""

    def __new__(cls, value: Any, what: str) -> Json:
        """Wraps ``value``; ``what`` names it in errors."""

@final
class Worker:
    """``muster_sdk::Worker`` running a Python handler per task."""

    def __new__(
        cls,
        member: str,
        queues: List[str],
        capacity: int,
        labels: List[str],
        grace_ms: int,
        reclaim_on_start: bool,
        liveness_ms: int,
        addr: Optional[str] = None,
        data: Optional[str] = None,
        ca: Optional[str] = None,
        pin: Optional[str] = None,
        token: Optional[str] = None,
        server_name: Optional[str] = None,
        token_file: Optional[str] = None,
        context: Optional[str] = None,
    ) -> Worker:
        """A worker for ``member`` on ``queues``; settles the connection options as
        ``connect`` does."""
    def shutdown(self) -> None:
        """Starts a graceful shutdown; callable from any thread."""
    @property
    def wakeup_fd(self) -> int:
        """The descriptor the event loop watches with ``pump`` while the worker runs."""
    def pump(self) -> None:
        """Starts and cancels handlers as the worker asked; called by the event loop."""
    def run(
        self,
        done: Loop,
        runner: Callable[[Task], Coroutine[Any, Any, None]],
        event_loop: asyncio.AbstractEventLoop,
    ) -> asyncio.Future[None]:
        """Runs until shut down; ``runner(task)`` makes the coroutine for one task, run
        on ``event_loop``, which must watch ``wakeup_fd`` with ``pump`` meanwhile."""

@final
class Task:
    """A task in a Python handler's hands."""

    @property
    def id(self) -> str:
        """The task's id."""
    @property
    def queue(self) -> str:
        """The task's queue."""
    @property
    def epoch(self) -> int:
        """The lease epoch."""
    @property
    def attempt(self) -> int:
        """The delivery number."""
    @property
    def failures(self) -> int:
        """Failures so far."""
    @property
    def priority(self) -> int:
        """The priority."""
    @property
    def key(self) -> Optional[str]:
        """The key, if any."""
    @property
    def reclaimed(self) -> bool:
        """Reclaimed after this member restarted."""
    @property
    def payload(self) -> str:
        """The payload as JSON text."""
    @property
    def progress(self) -> Optional[str]:
        """The latest checkpoint as JSON text."""
    @property
    def resumed(self) -> Optional[str]:
        """How the last suspension ended, as JSON text, if it was resumed."""
    def suspend(
        self, done: Loop, reason: str, timeout_ms: Optional[int], on_timeout: Optional[str]
    ) -> Awaitable[List[Dict[str, Any]]]:
        """Suspends the task; resolves with the reply as a one-element list; raises
        ``InvalidInput`` for an ``on_timeout`` other than resume, fail or cancel."""
    def spawn(self, done: Loop, children: List[Dict[str, Any]]) -> Awaitable[List[Dict[str, Any]]]:
        """Spawns children (each a ``dict`` of its fields) keeping the lease; resolves
        with each spawned child; raises ``InvalidInput`` for a ``dict`` that is not one."""
    def spawn_and_wait(
        self,
        done: Loop,
        children: List[Dict[str, Any]],
        reason: str,
        timeout_ms: Optional[int],
        on_timeout: Optional[str],
    ) -> Awaitable[List[Dict[str, Any]]]:
        """Spawns children and suspends the task until they have finished; resolves with
        the reply as a one-element list."""
    @property
    def output(self) -> int:
        """The number this run's first output chunk gets (the delivery's ``output``)."""
    def emit(self, done: Loop, text: Optional[str], json: Optional[str]) -> Awaitable[None]:
        """Appends a chunk, ``text`` or ``json`` (JSON text, not ``null``), exactly one, to
        the task's output; resolves once it is buffered. Raises ``InvalidInput`` for a
        malformed chunk or one over 64 KiB, ``ConnectionLost`` once output stopped."""
    def emit_blocking(self, text: Optional[str], json: Optional[str]) -> None:
        """``emit``, blocking the calling thread (not an event loop's) without the GIL."""
    def flush_output(self, done: Loop) -> Awaitable[None]:
        """Resolves once the daemon has every chunk emitted so far; ``ConnectionLost``
        if output stopped before."""
    @property
    def parent(self) -> Optional[str]:
        """The task that spawned this one, if it is a child."""
    @property
    def traceparent(self) -> Optional[str]:
        """The delivery's W3C ``traceparent``, if it carries one."""
    @property
    def tracestate(self) -> Optional[str]:
        """The delivery's W3C ``tracestate``, if it carries one."""
    @property
    def is_cancelled(self) -> bool:
        """True once the task should stop."""
    @property
    def is_draining(self) -> bool:
        """True once the worker is draining."""
    @property
    def lease_remaining(self) -> float:
        """Seconds until the lease's local deadline."""
    def set_progress(self, progress: str) -> None:
        """Sets a checkpoint (JSON text)."""
    def draining(self, done: Loop) -> Awaitable[None]:
        """Resolves when the worker starts draining."""
    def ack(self, result: Optional[str] = None) -> None:
        """Acks with a result (JSON text)."""
    def nack(self, delay_ms: Optional[int], error: str) -> None:
        """Nacks: retry after ``delay_ms`` or the queue's backoff."""
    def dead_letter(self, error: str) -> None:
        """Dead-letters."""
    def throttled(self, retry_after_ms: Optional[int], limit: Optional[str]) -> None:
        """Gives the task back throttled: no failure, ``limit`` (every one if ``None``)
        held for ``retry_after_ms`` (1 s if ``None``); raises ``InvalidInput`` for a
        ``retry_after_ms`` out of 1 ms..365 d or a ``limit`` that is no limit's name."""
    def release(self) -> None:
        """Releases without a failure."""
    def ended(self, _future: Any) -> None:
        """Done-callback: releases if no outcome was given."""
