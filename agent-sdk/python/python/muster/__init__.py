"""muster for Python: producers and agents on the Rust SDK's core.

``Client`` speaks the protocol's ops for producers, operators and pulling consumers
(all but ``watch``/``unwatch``, a console's stream of pushes; the member session's ops
are ``Worker``'s, which holds the session); ``Worker`` turns a handler into an agent,
with the Rust ``Worker``'s lease logic (renewals, cancellation, progress, reclaim,
drain, fencing) running in Rust on a runtime of the extension's own. Both are
asyncio-native; :mod:`muster.sync` has a blocking facade for scripts::

    import asyncio, muster

    async def handle(task: muster.Task):
        await task.set_progress({"step": 1})
        return {"echo": task.payload}

    asyncio.run(muster.Worker("gpu-3/agent-7", "jobs", capacity=4).run(handle))

Connection options are settled as the CLI settles them, by the same code: arguments,
else the ``MUSTER_*`` variables, else the named context in use (``context=``,
``MUSTER_CONTEXT``, the current one of ``muster context use``). The SDK's warnings
go to the :mod:`logging` logger ``muster``; ``MUSTER_LOG`` (``tracing`` directives, e.g.
``info`` or ``muster_sdk=debug``) shows more.

Supported: CPython 3.9 and later (one abi3 wheel), Linux and macOS.
"""

from __future__ import annotations

import atexit
import logging
import threading

from . import _native
from ._client import Child, Chunk, ClaimRef, Client, LimitRef, NewTask, RateRef
from ._convert import Duration
from ._native import (
    AlreadyExists,
    BadRequest,
    ConnectError,
    ConnectionLost,
    DiskFull,
    Forbidden,
    InvalidInput,
    InvalidState,
    LeaseLost,
    LimitExceeded,
    MusterError,
    NotFound,
    NotLeader,
    OutcomeUnknown,
    ProtocolError,
    Replaced,
    ServerError,
    ShuttingDown,
    StaleToken,
    TooLarge,
    Unauthorized,
    UnknownOp,
)
from ._worker import DeadLetter, Handler, Retry, Task, Throttled, Worker
from .records import (
    Backoff,
    CancelResult,
    CatchUp,
    ChildOutcome,
    ChildSummary,
    Claim,
    ClusterMember,
    ClusterRole,
    ClusterStatus,
    CountResult,
    EmitResult,
    EnqueuedTask,
    FindCursor,
    FindResult,
    FollowResult,
    LeaseInfo,
    LimitInfo,
    LimitKeyInfo,
    LimitUse,
    MemberDescription,
    MemberInfo,
    MemberState,
    OnTimeout,
    OutputChunk,
    OutputSummary,
    QueueInfo,
    QueueOptions,
    QueueTotals,
    Rate,
    RenewResult,
    Resumed,
    ResumeResult,
    Schedule,
    ServerStats,
    SettleResult,
    SnapshotResult,
    Spawned,
    SpawnedChild,
    Suspended,
    Suspension,
    TaskInfo,
    TaskPage,
    TaskState,
    TaskSummary,
    TimelineEvent,
    WaitResult,
)

MAX_BATCH: int = _native.MAX_BATCH
"""Most tasks in one atomic enqueue request (PROTOCOL.md §3)."""

__all__ = [
    "MAX_BATCH",
    "AlreadyExists",
    "Backoff",
    "BadRequest",
    "CancelResult",
    "CatchUp",
    "Child",
    "ChildOutcome",
    "ChildSummary",
    "Chunk",
    "Claim",
    "ClaimRef",
    "Client",
    "ClusterMember",
    "ClusterRole",
    "ClusterStatus",
    "ConnectError",
    "ConnectionLost",
    "CountResult",
    "DeadLetter",
    "DiskFull",
    "EmitResult",
    "EnqueuedTask",
    "Duration",
    "FindCursor",
    "FindResult",
    "FollowResult",
    "Forbidden",
    "Handler",
    "InvalidInput",
    "InvalidState",
    "LeaseInfo",
    "LeaseLost",
    "LimitExceeded",
    "LimitInfo",
    "LimitKeyInfo",
    "LimitRef",
    "LimitUse",
    "MemberDescription",
    "MemberInfo",
    "MemberState",
    "MusterError",
    "NewTask",
    "NotFound",
    "NotLeader",
    "OnTimeout",
    "OutcomeUnknown",
    "OutputChunk",
    "OutputSummary",
    "ProtocolError",
    "QueueInfo",
    "QueueOptions",
    "QueueTotals",
    "Rate",
    "RateRef",
    "Replaced",
    "RenewResult",
    "Resumed",
    "ResumeResult",
    "Retry",
    "Schedule",
    "ServerError",
    "ServerStats",
    "SettleResult",
    "ShuttingDown",
    "SnapshotResult",
    "Spawned",
    "SpawnedChild",
    "StaleToken",
    "Suspended",
    "Suspension",
    "Task",
    "TaskInfo",
    "TaskPage",
    "TaskState",
    "TaskSummary",
    "Throttled",
    "TimelineEvent",
    "TooLarge",
    "Unauthorized",
    "UnknownOp",
    "WaitResult",
    "Worker",
]


def _pump_logs() -> None:
    """Logs the SDK's records to the ``muster`` logger until :func:`_stop_logs`."""
    log = logging.getLogger("muster")
    while True:
        record = _native.next_log()
        if record is None:
            return
        level, message = record
        log.log(level, "%s", message)


_logs = threading.Thread(target=_pump_logs, name="muster-logs", daemon=True)
_logs.start()


@atexit.register
def _stop_logs() -> None:
    """Ends the log thread before the interpreter finalizes (see ``src/logging.rs``)."""
    _native.stop_logs()
    _logs.join(timeout=1.0)
