"""Types of the extension module ``muster._native`` (src/*.rs): the private layer under
the public API. Records travel as JSON text; durations as integer milliseconds."""

import asyncio
from typing import Any, Awaitable, Callable, Coroutine, List, Optional, Tuple, final

__all__ = [
    "Loop",
    "Client",
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
    "MAX_BATCH",
]

MAX_BATCH: int

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
    """A connection to ``musterd``; every method returns an awaitable. The protocol's
    ops but the member session's (the native ``Worker`` holds it) and ``watch``."""

    def close(self, done: Loop) -> Awaitable[None]:
        """Closes the connection, waiting (at most 1 s) until the daemon was told."""
    def queue_create(self, done: Loop, queue: str, options: str) -> Awaitable[str]:
        """Creates a queue (options: QueuePatch JSON); QueueInfo JSON."""
    def queue_list(self, done: Loop) -> Awaitable[str]:
        """Every queue; JSON list of QueueInfo."""
    def queue_describe(self, done: Loop, queue: str) -> Awaitable[str]:
        """One queue; QueueInfo JSON."""
    def queue_update(self, done: Loop, queue: str, options: str) -> Awaitable[str]:
        """Changes a queue's options (QueuePatch JSON); QueueInfo JSON."""
    def queue_pause(self, done: Loop, queue: str) -> Awaitable[str]:
        """Pauses a queue; QueueInfo JSON."""
    def queue_resume(self, done: Loop, queue: str) -> Awaitable[str]:
        """Resumes a queue; QueueInfo JSON."""
    def queue_purge(self, done: Loop, queue: str) -> Awaitable[int]:
        """Removes ready and scheduled tasks; how many."""
    def queue_delete(self, done: Loop, queue: str) -> Awaitable[int]:
        """Deletes a queue; how many tasks went with it."""
    def enqueue(self, done: Loop, queue: str, tasks: str) -> Awaitable[List[str]]:
        """Enqueues a JSON list of NewTask in batches of MAX_BATCH; the ids in order."""
    def task_get(self, done: Loop, task: str) -> Awaitable[str]:
        """One task; TaskInfo JSON."""
    def task_list(
        self,
        done: Loop,
        queue: str,
        state: str,
        after: Optional[str] = None,
        limit: Optional[int] = None,
    ) -> Awaitable[str]:
        """One page of tasks; TaskListReply JSON."""
    def task_find(self, done: Loop, search: str) -> Awaitable[str]:
        """Searches tasks (search: TaskFind JSON); TaskFindReply JSON."""
    def task_update(
        self, done: Loop, task: str, priority: Optional[int] = None, run_now: bool = False
    ) -> Awaitable[str]:
        """Changes a waiting task's priority or runs it now; TaskSummary JSON."""
    def wait(self, done: Loop, tasks: List[str], timeout_ms: int) -> Awaitable[str]:
        """Waits for tasks to finish; WaitReply JSON."""
    def cancel(self, done: Loop, task: str) -> Awaitable[str]:
        """Cancels a task; CancelReply JSON."""
    def claim(
        self,
        done: Loop,
        queues: List[str],
        max: Optional[int] = None,
        wait_ms: Optional[int] = None,
        lease_ms: Optional[int] = None,
        member: Optional[str] = None,
        labels: List[str] = ...,
    ) -> Awaitable[str]:
        """Leases ready tasks; JSON list of Delivery."""
    def renew(
        self,
        done: Loop,
        task: str,
        epoch: int,
        extend_ms: Optional[int] = None,
        progress: Optional[str] = None,
    ) -> Awaitable[str]:
        """Extends a lease; RenewReply JSON."""
    def ack(
        self, done: Loop, task: str, epoch: int, result: Optional[str] = None
    ) -> Awaitable[str]:
        """Acks a leased task; SettleReply JSON."""
    def nack(
        self,
        done: Loop,
        task: str,
        epoch: int,
        delay_ms: Optional[int] = None,
        error: Optional[str] = None,
    ) -> Awaitable[str]:
        """Nacks a leased task; SettleReply JSON."""
    def release(self, done: Loop, task: str, epoch: int) -> Awaitable[str]:
        """Releases a leased task; SettleReply JSON."""
    def dead_letter(self, done: Loop, task: str, epoch: int, error: str) -> Awaitable[str]:
        """Dead-letters a leased task; SettleReply JSON."""
    def redrive(
        self, done: Loop, queue: str, ids: List[str], all: bool, dry_run: bool
    ) -> Awaitable[str]:
        """Redrives dead tasks; CountReply JSON."""
    def discard(
        self, done: Loop, queue: str, ids: List[str], all: bool, dry_run: bool
    ) -> Awaitable[str]:
        """Discards dead tasks; CountReply JSON."""
    def member_list(self, done: Loop) -> Awaitable[str]:
        """Every member; JSON list of MemberInfo."""
    def member_describe(self, done: Loop, member: str) -> Awaitable[str]:
        """One member and its leases; MemberDescribeReply JSON."""
    def member_drain(self, done: Loop, member: str) -> Awaitable[str]:
        """Drains a member; MemberInfo JSON."""
    def member_undrain(self, done: Loop, member: str) -> Awaitable[str]:
        """Ends a member's drain; MemberInfo JSON."""
    def member_release(self, done: Loop, member: str) -> Awaitable[None]:
        """Frees a member name from its principal."""
    def admin_snapshot(self, done: Loop, dir: str) -> Awaitable[str]:
        """Writes a copy of the store on the daemon's host; SnapshotReply JSON."""
    def cluster_status(self, done: Loop) -> Awaitable[str]:
        """The cluster as the connected node sees it; ClusterStatusReply JSON."""
    def cluster_add(
        self,
        done: Loop,
        node: int,
        addr: str,
        cluster_addr: str,
        learner: bool = False,
        catch_up_ms: Optional[int] = None,
    ) -> Awaitable[str]:
        """Adds a node to the cluster; ClusterStatusReply JSON."""
    def cluster_remove(self, done: Loop, node: int) -> Awaitable[str]:
        """Removes a node from the cluster; ClusterStatusReply JSON."""
    def lease_revoke(self, done: Loop, task: str) -> Awaitable[str]:
        """Revokes a lease; SettleReply JSON."""
    def server_stats(self, done: Loop) -> Awaitable[str]:
        """The daemon's counters; ServerStatsReply JSON."""

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
    def release(self) -> None:
        """Releases without a failure."""
    def ended(self, _future: Any) -> None:
        """Done-callback: releases if no outcome was given."""
