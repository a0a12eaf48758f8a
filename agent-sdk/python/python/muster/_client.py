"""The asyncio ``Client``: one method per op of the protocol, but the member session's
(``session_open``, ``session_update``, ``subscribe``, ``unsubscribe``: ``Worker`` holds
the session) and ``watch``/``unwatch`` (a console's stream of pushes). Each method is
its op's fields, as a ``dict``, sent through the extension's one call
(``_native.Client.call``), and its reply's records."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from datetime import datetime
from typing import (
    Any,
    AsyncIterator,
    Awaitable,
    Dict,
    Iterable,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Union,
)

from . import _loop, _native, _trace
from ._convert import Duration, claim_of, instant_ms, json_value, ms, ms_required
from ._native import MAX_BATCH, MAX_PAGE
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
    LimitUse,
    MemberDescription,
    MemberInfo,
    OnTimeout,
    OutputChunk,
    QueueInfo,
    Rate,
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

ClaimRef = Union[Claim, str]
"""A claim to settle: a :class:`Claim`, or the claim string ``ID.EPOCH``."""

LimitRef = Union[LimitUse, Mapping[str, Any], str]
"""A limit a task draws on: a :class:`~muster.LimitUse`, a ``dict`` of its fields
(``{"limit": "openai", "key": "acct-7", "cost": 5}``; ``limit`` required), or a limit's
name (its keyless bucket, cost 1)."""

RateRef = Union[Rate, Tuple[int, Duration]]
"""A limit's rate: a :class:`~muster.Rate`, or ``(count, per)``: ``count`` tokens every
``per`` (seconds or :class:`~datetime.timedelta`), e.g. ``(500, 60)`` for 500 a minute."""


@dataclass(frozen=True)
class NewTask:
    """One task to enqueue with :meth:`Client.enqueue_many`.

    ``payload`` is any JSON-serialisable object, or ``bytes`` holding JSON text (UTF-8),
    sent as it is: the protocol carries JSON, so ``bytes`` are never an opaque blob (put
    binary data in a JSON string, e.g. base64) and text that is not JSON is refused
    with :class:`~muster.InvalidInput`. Durations
    are seconds (or :class:`~datetime.timedelta`); ``at`` is a :class:`~datetime.datetime`
    or seconds since the Unix epoch. Without an ``idempotency_key`` the client attaches a
    fresh one, so a retry after a lost reply cannot enqueue twice.
    """

    payload: Any
    priority: Optional[int] = None
    """0..9, higher first."""
    key: Optional[str] = None
    """Tasks of one key go in enqueue order, at most the queue's ``key_concurrency`` at once."""
    delay: Optional[Duration] = None
    """Not handed out before this long from now."""
    at: Optional[Union[datetime, float]] = None
    """Not handed out before this instant (the later of ``delay`` and ``at`` wins)."""
    requires: Sequence[str] = field(default_factory=tuple)
    """Labels a member must carry to get the task."""
    idempotency_key: Optional[str] = None
    """A repeated enqueue with this key returns the first task instead of a new one."""
    limits: Sequence[LimitRef] = field(default_factory=tuple)
    """The limits it draws on (at most 4, each named once): it is leased only while
    every one has room for it (PROTOCOL.md §4.14)."""
    group: Optional[str] = None
    """Its group (a tenant, a customer): in a queue with ``fair`` on, groups take turns."""
    traceparent: Optional[str] = None
    """The W3C trace context it carries (``00-<trace id>-<span id>-<flags>``); with
    OpenTelemetry installed, the current span's if ``None`` (and no ``tracestate``)."""
    tracestate: Optional[str] = None
    """The W3C ``tracestate`` that goes with ``traceparent`` (at most 512 bytes)."""

    def _fields(self) -> Dict[str, Any]:
        return _task(
            self.payload,
            self.priority,
            self.key,
            self.delay,
            self.at,
            self.requires,
            self.idempotency_key,
            self.limits,
            self.group,
            self.traceparent,
            self.tracestate,
        )


@dataclass(frozen=True)
class Child:
    """One child task to spawn with :meth:`Task.spawn <muster.Task.spawn>`,
    :meth:`Task.spawn_and_wait <muster.Task.spawn_and_wait>` or :meth:`Client.spawn`
    (PROTOCOL.md §4.17).

    ``child_key`` names it among its parent's children (a short name, each given once
    per spawn): a spawn of a key the parent spawned before enqueues nothing and answers
    that child (``duplicate``), so a handler that runs again (reclaimed, retried) may
    spawn the same children again. ``queue`` is any existing queue, the parent's or
    another. The rest are a task's options as :class:`NewTask` takes them, without an
    ``idempotency_key``: the child key is one.
    """

    child_key: str
    queue: str
    payload: Any
    priority: Optional[int] = None
    """0..9, higher first."""
    key: Optional[str] = None
    """Tasks of one key go in enqueue order, at most the queue's ``key_concurrency`` at once."""
    delay: Optional[Duration] = None
    """Not handed out before this long from now."""
    at: Optional[Union[datetime, float]] = None
    """Not handed out before this instant (the later of ``delay`` and ``at`` wins)."""
    requires: Sequence[str] = field(default_factory=tuple)
    """Labels a member must carry to get the task."""
    limits: Sequence[LimitRef] = field(default_factory=tuple)
    """The limits it draws on (at most 4, each named once)."""
    group: Optional[str] = None
    """Its group, for a queue with ``fair`` on."""
    traceparent: Optional[str] = None
    """The W3C trace context it carries; with OpenTelemetry installed, the current
    span's if ``None`` (and no ``tracestate``): in a handler, its ``muster.task`` span's.
    A child spawned with none is in its parent's trace."""
    tracestate: Optional[str] = None
    """The W3C ``tracestate`` that goes with ``traceparent``."""

    def _fields(self) -> Dict[str, Any]:
        task = _task_fields(
            self.payload,
            self.priority,
            self.key,
            self.delay,
            self.at,
            self.requires,
            self.limits,
            self.group,
            self.traceparent,
            self.tracestate,
        )
        return {"child_key": self.child_key, "queue": self.queue, "task": task}


@dataclass(frozen=True)
class Chunk:
    """One chunk of output to emit with :meth:`Client.emit` (PROTOCOL.md §4.18): its
    ``text``, or a ``json`` value (any JSON-serialisable object but ``None``, or
    ``bytes`` of UTF-8 JSON text), exactly one; each at most 64 KiB. ``Client.emit``
    takes a ``str`` as a text chunk. (An agent's way is :meth:`Task.emit
    <muster.Task.emit>` and :meth:`Task.emit_json <muster.Task.emit_json>`.)"""

    text: Optional[str] = None
    json: Any = None

    def _fields(self) -> Dict[str, Any]:
        if (self.text is None) == (self.json is None):
            raise _native.InvalidInput(
                f"a chunk holds exactly one of text and json (not None), not {self!r}"
            )
        if self.text is not None:
            if not isinstance(self.text, str):
                raise _native.InvalidInput(f"a chunk's text is a str, not {self.text!r}")
            return {"text": self.text}
        return {"json": json_value(self.json, "the chunk's json")}


def _chunks(chunks: Sequence[Union[str, Chunk]]) -> List[Dict[str, Any]]:
    """The fields of an emit's chunks: a ``str`` is a text chunk."""
    fields: List[Dict[str, Any]] = []
    for chunk in _listed(chunks, "chunks"):
        if isinstance(chunk, str):
            fields.append({"text": chunk})
        elif isinstance(chunk, Chunk):
            fields.append(chunk._fields())
        else:
            raise _native.InvalidInput(f"a chunk to emit is a str or a muster.Chunk, not {chunk!r}")
    return fields


def _children(children: Sequence[Child]) -> List[Dict[str, Any]]:
    """The fields of a spawn's children, each checked to be a :class:`Child`, those that
    name no trace context in the current span's (with OpenTelemetry)."""
    fields: List[Dict[str, Any]] = []
    for child in _listed(children, "children"):
        if not isinstance(child, Child):
            raise _native.InvalidInput(f"a child to spawn is a muster.Child, not {child!r}")
        fields.append(child._fields())
    _trace.fill(c["task"] for c in fields)
    return fields


def _task(
    payload: Any,
    priority: Optional[int],
    key: Optional[str],
    delay: Optional[Duration],
    at: Optional[Union[datetime, float]],
    requires: Sequence[str],
    idempotency_key: Optional[str],
    limits: Sequence[LimitRef],
    group: Optional[str],
    traceparent: Optional[str] = None,
    tracestate: Optional[str] = None,
) -> Dict[str, Any]:
    """A task's fields for ``enqueue``, with a fresh idempotency key if none is given."""
    fields = _task_fields(
        payload, priority, key, delay, at, requires, limits, group, traceparent, tracestate
    )
    fields["idempotency_key"] = _fresh_key() if idempotency_key is None else idempotency_key
    return fields


def _task_fields(
    payload: Any,
    priority: Optional[int],
    key: Optional[str],
    delay: Optional[Duration],
    at: Optional[Union[datetime, float]],
    requires: Sequence[str],
    limits: Sequence[LimitRef],
    group: Optional[str],
    traceparent: Optional[str] = None,
    tracestate: Optional[str] = None,
) -> Dict[str, Any]:
    """A task's fields but its idempotency key (a child's, or ``_task``'s start); the
    trace context only as given (``_trace.fill`` fills it in)."""
    delay_ms = None if delay is None else ms(delay, "delay")
    not_before_ms = None if at is None else instant_ms(at)
    return {
        "payload": json_value(payload, "payload"),
        "priority": priority,
        "key": key,
        "delay_ms": delay_ms,
        "not_before_ms": not_before_ms,
        "requires": list(requires) if requires else None,
        "limits": [_limit_use(u) for u in _listed(limits, "limits")] or None,
        "group": group,
        "traceparent": traceparent,
        "tracestate": tracestate,
    }


_LIMIT_USE_FIELDS = ("limit", "key", "cost")


def _listed(values: Sequence[Any], what: str) -> Sequence[Any]:
    """A sequence argument, checked not to be a lone string (which would be its letters)."""
    if isinstance(values, (str, bytes)):
        raise _native.InvalidInput(f"{what} is a list, not a single {type(values).__name__}")
    return values


def _limit_use(value: LimitRef) -> Dict[str, Any]:
    """The fields of one limit a task draws on."""
    if isinstance(value, str):
        return {"limit": value}
    if isinstance(value, LimitUse):
        return value._fields()
    if isinstance(value, Mapping):
        unknown = [k for k in value if k not in _LIMIT_USE_FIELDS]
        if unknown or "limit" not in value:
            raise _native.InvalidInput(
                f"a limit a task draws on has the fields limit (required), key and cost,"
                f" not {dict(value)!r}"
            )
        return dict(value)
    raise _native.InvalidInput(
        "a limit a task draws on is a LimitUse, a dict of its fields or a limit's name,"
        f" not {value!r}"
    )


def _rate(rate: RateRef) -> Dict[str, Any]:
    """The fields of a limit's rate."""
    if isinstance(rate, Rate):
        return {"count": rate.count, "per_ms": rate.per_ms}
    if isinstance(rate, (tuple, list)) and len(rate) == 2:
        count, per = rate
        return {"count": count, "per_ms": ms_required(per, "the rate's period")}
    raise _native.InvalidInput(
        f"a rate is a Rate or a pair (count, per) with per in seconds, not {rate!r}"
    )


def _group_weights(weights: Mapping[str, int]) -> Dict[str, int]:
    """A queue's group weights, each checked to be an integer (none left out as ``None``)."""
    for group, weight in weights.items():
        if isinstance(weight, bool) or not isinstance(weight, int):
            raise _native.InvalidInput(
                f"the weight of group {group!r} is an integer from 1 to 1000, not {weight!r}"
            )
    return dict(weights)


def _payload_only(payload: Any) -> Dict[str, Any]:
    """:func:`_task` of a payload with no options."""
    return {"payload": json_value(payload, "payload"), "idempotency_key": _fresh_key()}


def _fresh_key() -> str:
    """A fresh idempotency key: 128 random bits, so a retry after a lost reply finds
    the task it made instead of making another."""
    return os.urandom(16).hex()


def _queue_options(
    lease: Optional[Duration],
    max_attempts: Optional[int],
    retry_backoff: Optional[Backoff],
    key_concurrency: Optional[int],
    retention: Optional[Duration],
    max_runtime: Optional[Duration],
    paused: Optional[bool],
    fair: Optional[bool],
    group_weights: Optional[Mapping[str, int]],
) -> Dict[str, Any]:
    patch: Dict[str, Any] = {}
    if lease is not None:
        patch["lease_ms"] = ms(lease, "lease")
    if max_attempts is not None:
        patch["max_attempts"] = max_attempts
    if retry_backoff is not None:
        patch["retry_backoff"] = {
            "base_ms": retry_backoff.base_ms,
            "factor": retry_backoff.factor,
            "cap_ms": retry_backoff.cap_ms,
            "jitter": retry_backoff.jitter,
        }
    if key_concurrency is not None:
        patch["key_concurrency"] = key_concurrency
    if retention is not None:
        patch["retention_ms"] = ms(retention, "retention")
    if max_runtime is not None:
        patch["max_runtime_ms"] = ms(max_runtime, "max_runtime")
    if paused is not None:
        patch["paused"] = paused
    if fair is not None:
        patch["fair"] = fair
    if group_weights is not None:
        patch["group_weights"] = _group_weights(group_weights)
    return patch


def _node_id(node: int) -> int:
    """A cluster node's id, checked to be a u64 before anything is sent."""
    if isinstance(node, bool) or not isinstance(node, int) or not 0 <= node < 2**64:
        raise _native.InvalidInput(f"a node id is an integer from 0 to 2**64-1, not {node!r}")
    return node


_Reply = Dict[str, Any]
"""A reply frame's object: the op's fields (PROTOCOL.md §5), with ``id`` and ``ok``."""

_TASK_STATES = ("scheduled", "ready", "leased", "suspended", "done", "dead", "cancelled")


class Client:
    """A connection to ``musterd``, for producers, operators and pulling consumers.

    Make one with ``await Client.connect(...)`` (or :meth:`connect_node` for one
    cluster node's own view); it is safe to share between tasks:
    concurrent calls are pipelined over one QUIC stream. Every method is a coroutine
    that waits without holding the GIL and raises a :class:`~muster.MusterError`
    subclass on failure (a refusal by the daemon is the :class:`~muster.ServerError`
    subclass of its code, e.g. :class:`~muster.NotFound`). Use it as an async context
    manager, or call :meth:`close`.

    It has a method for every op of the protocol (PROTOCOL.md §5) but two kinds: the
    member session's (``session_open``, ``session_update``, ``subscribe``,
    ``unsubscribe``), which :class:`~muster.Worker` holds, and ``watch``/``unwatch``,
    the console's stream of pushes, which the Python SDK does not offer.

    Durations are seconds (``float``) or :class:`~datetime.timedelta`; records mirror
    the protocol (PROTOCOL.md §4), with ``*_ms`` fields in milliseconds. Payloads,
    results and progress checkpoints are JSON, as the protocol carries them: give any
    JSON-serialisable object, or ``bytes`` of JSON text (UTF-8), which is sent as it is
    (not an opaque blob); they come back decoded.
    """

    __slots__ = ("_native",)

    def __init__(self, native: _native.Client) -> None:
        """Wraps a native client; use :meth:`connect` instead."""
        self._native = native

    def _send(self, op: str, fields: Dict[str, Any]) -> Awaitable[List[_Reply]]:
        """Sends op ``op`` with its fields (``None`` ones left out); awaits its reply
        (a list of the one reply)."""
        return self._native.call(_loop.current(), op, [fields])

    async def _call(self, op: str, fields: Dict[str, Any]) -> _Reply:
        """Sends op ``op`` with its fields and returns its reply."""
        (reply,) = await self._native.call(_loop.current(), op, [fields])
        return reply

    async def _pages(self, op: str, items: str) -> List[Dict[str, Any]]:
        """Every item of a paged listing (``queue_list``, ``member_list``,
        ``limit_list``), page after page, each page's ``next`` the following one's
        ``after``."""
        found: List[Dict[str, Any]] = []
        after: Optional[str] = None
        while True:
            page = await self._call(op, {"after": after, "limit": MAX_PAGE})
            found.extend(page[items])
            after = page.get("next")
            if after is None:
                return found

    @classmethod
    async def connect(
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
        """Connects to a daemon, settling where it is exactly as the ``muster`` CLI does
        (the same code, in the Rust SDK).

        Each argument not given comes from its variable: ``MUSTER_ADDR``,
        ``MUSTER_DATA``, ``MUSTER_CA``, ``MUSTER_PIN``, ``MUSTER_TOKEN``,
        ``MUSTER_TOKEN_FILE``, ``MUSTER_CONTEXT``. Then the named context in use fills in
        the address and the trust not given, and its token file (with its trust, when
        no token or token file was given): ``context`` (else ``MUSTER_CONTEXT``, else
        the current one of ``muster context use``) from ``contexts.toml`` in the user's
        configuration directory (``$XDG_CONFIG_HOME/muster/``, by default
        ``~/.config/muster/``). Without a context: ``127.0.0.1:7420``, trusting the
        certificate the daemon wrote in its data directory and presenting the token it
        wrote there.

        ``addr`` is ``HOST:PORT``, or a cluster's nodes ``HOST:PORT,HOST:PORT,...`` (at
        most 16): the client connects to the leader, waiting out an election (at most
        10 s). Trust and token apply to every node.

        Trust is taken whole: if any of ``pin``, ``ca`` and ``data`` is given (or set in
        the environment), the context's is not used. ``pin`` (the certificate's SHA-256,
        hex) beats ``ca`` (a PEM file) beats ``data`` (a data directory); ``token``
        beats ``token_file`` (a file holding the token, which keeps it out of the
        process's arguments). Raises :class:`~muster.ConnectError` when the daemon
        cannot be reached or trusted (after at most 5 s), or when the contexts file is
        malformed or has no such context.
        """
        native = await _native.connect(
            _loop.current(), addr, data, ca, pin, token, server_name, token_file, context
        )
        return cls(native)

    @classmethod
    async def connect_node(
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
        """Connects to exactly one cluster node, leader or not, as
        ``muster --addr NODE cluster status`` does: to read that node's own view with
        :meth:`cluster_status` (a node that does not lead answers every other op with
        :class:`~muster.NotLeader`). The options are settled as :meth:`connect` settles
        them; they must name one address (several are refused with
        :class:`~muster.InvalidInput`).
        """
        native = await _native.connect(
            _loop.current(), addr, data, ca, pin, token, server_name, token_file, context, True
        )
        return cls(native)

    async def close(self) -> None:
        """Closes the connection, waiting (at most 1 s) until the daemon was told.

        Calls still in flight fail with :class:`~muster.ConnectionLost`.
        """
        await self._native.close(_loop.current())

    async def __aenter__(self) -> Client:
        """The client itself; it is closed on exit."""
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Closes the client."""
        await self.close()

    # Queues.

    async def queue_create(
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
        """Creates a queue; options not given take their defaults (PROTOCOL.md §4.2).

        ``max_attempts`` 0 means unlimited; ``max_runtime`` 0 removes the bound. With
        ``fair``, the tasks' groups take turns among tasks of equal priority, each as
        often as its weight in ``group_weights`` says (1 to 1000; a group not named
        weighs 1) (PROTOCOL.md §4.15). Raises :class:`~muster.AlreadyExists` if it exists.
        """
        options = _queue_options(
            lease,
            max_attempts,
            retry_backoff,
            key_concurrency,
            retention,
            max_runtime,
            paused,
            fair,
            group_weights,
        )
        reply = await self._call("queue_create", {"queue": queue, "options": options})
        return QueueInfo._from(reply["queue"])

    async def queue_list(self) -> List[QueueInfo]:
        """Every queue with its counts, by name."""
        return [QueueInfo._from(q) for q in await self._pages("queue_list", "queues")]

    async def queue_describe(self, queue: str) -> QueueInfo:
        """One queue with its counts."""
        return QueueInfo._from((await self._call("queue_describe", {"queue": queue}))["queue"])

    async def queue_update(
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
        """Changes the options given; the others keep their values. ``group_weights``
        are merged into the queue's: a weight of 1 takes a group's entry out."""
        options = _queue_options(
            lease,
            max_attempts,
            retry_backoff,
            key_concurrency,
            retention,
            max_runtime,
            paused,
            fair,
            group_weights,
        )
        reply = await self._call("queue_update", {"queue": queue, "options": options})
        return QueueInfo._from(reply["queue"])

    async def queue_pause(self, queue: str) -> QueueInfo:
        """Pauses a queue: it accepts enqueues and hands nothing out."""
        return QueueInfo._from((await self._call("queue_pause", {"queue": queue}))["queue"])

    async def queue_resume(self, queue: str) -> QueueInfo:
        """Resumes a paused queue."""
        return QueueInfo._from((await self._call("queue_resume", {"queue": queue}))["queue"])

    async def queue_purge(self, queue: str) -> int:
        """Removes every ready and scheduled task of a queue; returns how many."""
        count: int = (await self._call("queue_purge", {"queue": queue}))["count"]
        return count

    async def queue_delete(self, queue: str) -> int:
        """Deletes a queue and all its tasks; returns how many tasks went with it."""
        count: int = (await self._call("queue_delete", {"queue": queue}))["count"]
        return count

    # Producing.

    async def enqueue(
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
        limits: Sequence[LimitRef] = (),
        group: Optional[str] = None,
        traceparent: Optional[str] = None,
        tracestate: Optional[str] = None,
    ) -> str:
        """Enqueues one task and returns its id (see :class:`NewTask` for the options).

        ``payload`` is a JSON-serialisable object or ``bytes`` of UTF-8 JSON text.

        With an ``idempotency_key`` that names an existing task of the queue, that
        task's id is returned and nothing is created. A limit named in ``limits`` that
        does not exist raises :class:`~muster.NotFound`.

        The task carries a W3C trace context to its holders: ``traceparent`` (and
        ``tracestate``) as given, else, with OpenTelemetry installed, the current
        span's. A malformed one raises :class:`~muster.BadRequest`.
        """
        task = _task(
            payload,
            priority,
            key,
            delay,
            at,
            requires,
            idempotency_key,
            limits,
            group,
            traceparent,
            tracestate,
        )
        _trace.fill([task])
        (reply,) = await self._send("enqueue", {"queue": queue, "tasks": [task]})
        task_id: str = reply["tasks"][0]["id"]
        return task_id

    async def enqueue_many(self, queue: str, tasks: Iterable[Union[NewTask, Any]]) -> List[str]:
        """Enqueues tasks in order and returns their ids in the same order.

        Each item is a :class:`NewTask`, or a payload enqueued with no options. Up to
        :data:`MAX_BATCH` (1000) tasks go in one atomic request; more are sent as
        several requests back to back (each atomic, all pipelined on the connection).
        Tasks that name no trace context carry the current span's, with OpenTelemetry
        installed (as :meth:`enqueue`'s do).
        """
        items = [t._fields() if isinstance(t, NewTask) else _payload_only(t) for t in tasks]
        if not items:
            return []
        _trace.fill(items)
        batches = [
            {"queue": queue, "tasks": items[at : at + MAX_BATCH]}
            for at in range(0, len(items), MAX_BATCH)
        ]
        replies = await self._native.call(_loop.current(), "enqueue", batches)
        return [t["id"] for reply in replies for t in reply["tasks"]]

    # Reading and waiting.

    async def task_get(self, task: str) -> TaskInfo:
        """Reads a whole task, with its timeline."""
        return TaskInfo._from((await self._call("task_get", {"task": task}))["task"])

    async def task_list(
        self,
        queue: str,
        state: TaskState,
        *,
        after: Optional[str] = None,
        limit: Optional[int] = None,
    ) -> TaskPage:
        """One page (``limit``, default 100, at most 1000) of a queue's tasks in a state,
        oldest first; pass the page's ``next`` as ``after`` for the next page."""
        if state not in _TASK_STATES:
            raise _native.InvalidInput(
                f"{json.dumps(state)} is not a task state (scheduled, ready, leased,"
                " suspended, done, dead, cancelled)"
            )
        fields = {"queue": queue, "state": state, "after": after, "limit": limit}
        return TaskPage._from(await self._call("task_list", fields))

    async def task_find(
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
        """Searches the tasks of ``queue`` (every queue the token covers if ``None``) by
        what they hold; every filter given must match (PROTOCOL.md §5.35).

        ``id_prefix``: the start of the id (any case). ``key``, ``idempotency_key``:
        equal. ``label``: one of the task's ``requires``. ``error``: contained in
        ``last_error``, ASCII case-insensitive. ``payload``: contained in the payload's
        JSON text, case-sensitive. ``field``: ``(path, value)``, the payload's value at
        the dotted ``path`` (``"order.lines.0.sku"``) equals ``value`` (any
        JSON-serialisable object). Oldest first, or ``newest_first``.

        One call does a bounded amount of work and returns up to ``limit`` (default
        100, at most 1000) matches; pass the result's ``next`` as ``after`` until it is
        ``None`` to search everything::

            after = None
            while True:
                found = await client.task_find("jobs", state="dead", after=after)
                ...  # found.tasks
                if (after := found.next) is None:
                    break
        """
        search: Dict[str, Any] = {
            "queue": queue,
            "state": state,
            "id_prefix": id_prefix,
            "key": key,
            "idempotency_key": idempotency_key,
            "label": label,
            "error": error,
            "payload": payload,
            "limit": limit,
            "newest_first": newest_first or None,
        }
        if field is not None:
            path, value = field
            search["field"] = {"path": path, "value": json_value(value, "field")}
        if after is not None:
            search["after"] = {"queue": after.queue, "id": after.id}
        return FindResult._from(await self._call("task_find", search))

    async def task_update(
        self, task: str, *, priority: Optional[int] = None, run_now: bool = False
    ) -> TaskSummary:
        """Changes a task that waits (``ready`` or ``scheduled``): its ``priority``
        (0..9), or with ``run_now`` a scheduled task becomes ready now. Give at least one.
        Returns the task after the change; raises :class:`~muster.InvalidState` for a
        task that is leased or finished."""
        if priority is not None and not 0 <= priority <= 255:
            raise _native.InvalidInput(f"priority {priority} is out of range (0..9)")
        fields = {"task": task, "priority": priority, "run_now": run_now or None}
        return TaskSummary._from((await self._call("task_update", fields))["task"])

    async def wait(self, tasks: Union[str, Sequence[str]], timeout: Duration) -> WaitResult:
        """Waits until the tasks (an id or up to 1000 ids) are finished (done, dead or
        cancelled) or removed, or ``timeout`` (at most 300 s) has passed."""
        ids = [tasks] if isinstance(tasks, str) else list(tasks)
        timeout_ms = ms_required(timeout, "timeout")
        return WaitResult._from(await self._call("wait", {"tasks": ids, "timeout_ms": timeout_ms}))

    async def cancel(self, task: str) -> CancelResult:
        """Cancels a task: at once if it is waiting; a leased task's holder is told to
        stop, and its settle ends it ``cancelled``."""
        return CancelResult._from(await self._call("cancel", {"task": task}))

    # Consuming by pull.

    async def claim(
        self,
        queues: Union[str, Sequence[str]],
        *,
        max: int = 1,
        wait: Optional[Duration] = None,
        lease: Optional[Duration] = None,
        member: Optional[str] = None,
        labels: Sequence[str] = (),
    ) -> List[Claim]:
        """Leases up to ``max`` ready tasks of the queues, waiting up to ``wait`` (at
        most 300 s) for the first. Renew and settle each with its :class:`Claim`.

        Agents should prefer :class:`~muster.Worker`, which renews, cancels and
        settles by itself.
        """
        names = [queues] if isinstance(queues, str) else list(queues)
        fields = {
            "queues": names,
            "max": max,
            "wait_ms": ms(wait, "wait"),
            "lease_ms": ms(lease, "lease"),
            "member": member,
            "labels": list(labels) or None,
        }
        (reply,) = await self._send("claim", fields)
        return [Claim._from(d) for d in reply["tasks"]]

    async def renew(
        self,
        claim: ClaimRef,
        *,
        extend: Optional[Duration] = None,
        progress: Any = None,
    ) -> RenewResult:
        """Extends a lease (by the queue's lease if ``extend`` is absent), storing a
        progress checkpoint if given (a JSON-serialisable object or ``bytes`` of UTF-8
        JSON text, at most 64 KiB). Raises :class:`~muster.LeaseLost` if the claim is no
        longer the task's lease."""
        task, epoch = claim_of(claim)
        fields = {
            "task": task,
            "epoch": epoch,
            "extend_ms": ms(extend, "extend"),
            "progress": None if progress is None else json_value(progress, "progress"),
        }
        (reply,) = await self._send("renew", fields)
        return RenewResult._from(reply)

    async def ack(self, claim: ClaimRef, result: Any = None) -> SettleResult:
        """Settles a leased task as done, with an optional result (a JSON-serialisable
        object or ``bytes`` of UTF-8 JSON text, at most 1 MiB)."""
        task, epoch = claim_of(claim)
        json_result = None if result is None else json_value(result, "result")
        (reply,) = await self._send("ack", {"task": task, "epoch": epoch, "result": json_result})
        return SettleResult._from(reply)

    async def nack(
        self,
        claim: ClaimRef,
        *,
        delay: Optional[Duration] = None,
        error: Optional[str] = None,
    ) -> SettleResult:
        """Hands a leased task back as failed: retried after ``delay`` (the queue's
        backoff if absent), or dead when out of attempts."""
        task, epoch = claim_of(claim)
        fields = {"task": task, "epoch": epoch, "delay_ms": ms(delay, "delay"), "error": error}
        (reply,) = await self._send("nack", fields)
        return SettleResult._from(reply)

    async def release(self, claim: ClaimRef) -> SettleResult:
        """Hands a leased task back without counting a failure."""
        task, epoch = claim_of(claim)
        (reply,) = await self._send("release", {"task": task, "epoch": epoch})
        return SettleResult._from(reply)

    async def throttled(
        self,
        claim: ClaimRef,
        *,
        retry_after: Optional[Duration] = None,
        limit: Optional[str] = None,
        error: Optional[str] = None,
    ) -> SettleResult:
        """Hands a leased task back because a provider it calls said to slow down (an
        HTTP 429, a quota error), spending no attempt: the task is ready again at its
        place with no failure counted, and ``limit`` (one the task draws on; every one
        it draws on if ``None``) hands nothing out for its key for ``retry_after`` (1 ms
        to 365 days; 1 s if ``None``). A task that draws on no limit is scheduled
        ``retry_after`` from now instead. ``error`` (what the provider said) goes into
        the task's timeline (PROTOCOL.md §5.46). Raises :class:`~muster.BadRequest` for
        a limit the task does not draw on."""
        task, epoch = claim_of(claim)
        fields = {
            "task": task,
            "epoch": epoch,
            "retry_after_ms": ms(retry_after, "retry_after"),
            "limit": limit,
            "error": error,
        }
        (reply,) = await self._send("throttled", fields)
        return SettleResult._from(reply)

    async def suspend(
        self,
        claim: ClaimRef,
        reason: str,
        *,
        timeout: Optional[Duration] = None,
        on_timeout: Optional[OnTimeout] = None,
    ) -> Suspended:
        """Suspends a leased task instead of settling it (an agent's way is
        :meth:`Task.suspend <muster.Task.suspend>`): its lease ends with no failure
        counted and it waits, ``suspended``, until a :meth:`resume` with the returned
        ``resume_token`` (valid once) or its ``timeout`` (1 ms to 365 days; 7 days if
        ``None``), which does ``on_timeout`` (``"fail"`` if ``None``; PROTOCOL.md
        §5.47)."""
        task, epoch = claim_of(claim)
        fields = {
            "task": task,
            "epoch": epoch,
            "reason": reason,
            "timeout_ms": ms(timeout, "timeout"),
            "on_timeout": on_timeout,
        }
        (reply,) = await self._send("suspend", fields)
        return Suspended._from(reply)

    async def spawn(
        self,
        claim: ClaimRef,
        children: Sequence[Child],
        *,
        wait: bool = False,
        reason: Optional[str] = None,
        timeout: Optional[Duration] = None,
        on_timeout: Optional[OnTimeout] = None,
    ) -> Spawned:
        """Spawns children of a leased task (an agent's way is :meth:`Task.spawn
        <muster.Task.spawn>` and :meth:`Task.spawn_and_wait
        <muster.Task.spawn_and_wait>`), in one atomic change: each is a task of its own
        that names the claimed one as its ``parent``, enqueued once per ``child_key`` (a
        key spawned before answers that child, ``duplicate``); cancelling the parent
        cancels its unfinished children (PROTOCOL.md §5.49).

        Without ``wait`` the lease is kept (``state`` ``leased``). With ``wait`` the
        task is suspended until every child it spawned (now or before) has finished,
        as :meth:`suspend` suspends it (``reason``, shown to people, "waiting for its
        children" if ``None``; ``timeout`` and ``on_timeout`` as there): then it is
        ready again and its next holder finds each child's outcome in
        ``resumed.children``; ``state`` is ``suspended`` with a ``resume_token`` that
        ends the wait early, or ``ready`` when every child had finished already.
        ``children`` may be empty only with ``wait``. A refused spawn (e.g.
        :class:`~muster.BadRequest` for a bad child key, :class:`~muster.NotFound` for a
        queue that does not exist, :class:`~muster.LimitExceeded` past 1000 children of
        one task or 8 spawns deep) stores nothing.
        """
        task, epoch = claim_of(claim)
        if not wait and (reason, timeout, on_timeout) != (None, None, None):
            raise _native.InvalidInput(
                "reason, timeout and on_timeout are a wait's: give them with wait=True"
            )
        fields: Dict[str, Any] = {"task": task, "epoch": epoch, "children": _children(children)}
        if wait:
            fields["wait"] = {
                "reason": reason,
                "timeout_ms": ms(timeout, "timeout"),
                "on_timeout": on_timeout,
            }
        (reply,) = await self._send("spawn", fields)
        return Spawned._from(reply)

    async def emit(
        self, claim: ClaimRef, at: int, chunks: Sequence[Union[str, Chunk]]
    ) -> EmitResult:
        """Appends chunks to a leased task's live output (an agent's way is
        :meth:`Task.emit <muster.Task.emit>`, which buffers, batches, numbers and
        repeats for you; PROTOCOL.md §5.50). Each chunk is a ``str`` (a text chunk) or
        a :class:`Chunk`; 1 to 1000 of them, each at most 64 KiB, together at most
        512 KiB as stored (each chunk's JSON, ``{"text":"…"}`` escaped or
        ``{"json":…}``, and a comma, plus 17 bytes: any one chunk fits). ``at`` is
        the number the first chunk is to get: the claim's ``output``, then each
        reply's ``next``. Chunks numbered before the task's next number were stored by
        an earlier try of this emit (its reply lost) and are not stored again
        (``repeated`` counts them), so an emit may be sent again as it was. Wait the
        reply's ``wait_ms`` before the next emit. An emit does not renew the lease.

        Raises :class:`~muster.LeaseLost` if the claim is no longer the task's lease,
        :class:`~muster.TooLarge` for a chunk or an emit over its size,
        :class:`~muster.BadRequest` for an ``at`` past the task's next number or too
        many chunks, :class:`~muster.LimitExceeded` when sent before a ``wait_ms`` was
        over, :class:`~muster.DiskFull` while the daemon's disk alarm is on; and
        :class:`~muster.InvalidInput`, before sending, for an item that is neither a
        ``str`` nor a :class:`Chunk`, or a chunk that does not hold exactly one of its
        fields."""
        task, epoch = claim_of(claim)
        fields = {"task": task, "epoch": epoch, "at": at, "chunks": _chunks(chunks)}
        (reply,) = await self._send("emit", fields)
        return EmitResult._from(reply)

    async def follow(
        self, task: str, from_: int = 0, *, timeout: Optional[Duration] = None
    ) -> FollowResult:
        """Reads task ``task``'s live output from chunk ``from_`` (PROTOCOL.md §5.51):
        what is kept from there at once (at most 256 KiB of it; at least one chunk when
        any is kept), else, when the task is not finished, waits up to ``timeout``
        (``None`` or 0: not at all; at most 300 s) for the next chunks or the task's
        end; a timeout answers with no chunks. Ask again from the result's ``next``
        until its ``end``: no chunk is missed or read twice, on this connection or a
        new one (after a lost one). ``dropped`` counts the chunks from ``from_`` no
        longer kept (a task keeps at most 1 MiB as stored). :meth:`follow_stream` does
        the asking again.

        Raises :class:`~muster.NotFound` for no such task (or one removed while
        followed), :class:`~muster.BadRequest` for a ``from_`` past the task's output
        or a ``timeout`` over 300 s."""
        fields = {"task": task, "from": from_, "timeout_ms": ms(timeout, "timeout")}
        return FollowResult._from(await self._call("follow", fields))

    def follow_stream(
        self, task: str, from_: int = 0, *, poll: Duration = 30.0
    ) -> AsyncIterator[OutputChunk]:
        """Every chunk of task ``task``'s live output from chunk ``from_``, as it is
        stored, until the task is finished and its last chunk was read::

            async for chunk in client.follow_stream(task_id):
                print(chunk.text if chunk.text is not None else chunk.json)

        It is :meth:`follow` asked again from each result's ``next``, each waiting up
        to ``poll`` (1 ms to 300 s) for more. Chunks dropped before they were read (a
        task keeps at most 1 MiB of output as stored) are skipped: a gap in the chunks' ``n``
        shows them. The stream of a task that does not finish (a suspended one, say)
        goes on until the caller stops iterating; a ``dead`` task's ends (a redrive may
        let it emit again: follow it anew from the last chunk's ``n + 1``).

        It does not reconnect: a lost connection raises :class:`~muster.ConnectionLost`
        (and a cluster leader that stops leading :class:`~muster.NotLeader` or
        :class:`~muster.OutcomeUnknown`), as :meth:`follow` raises. Connect again and
        follow from the last chunk's ``n + 1`` (``from_`` if none came): nothing is
        missed or read twice. Raises :class:`~muster.InvalidInput` now for a ``poll``
        out of range, and what :meth:`follow` raises as it is iterated.
        """
        poll_ms = ms_required(poll, "poll")
        if not 1 <= poll_ms <= 300_000:
            raise _native.InvalidInput(f"poll is 1 ms to 300 s, not {poll!r}")
        return self._follow_stream(task, from_, poll_ms / 1000)

    async def _follow_stream(
        self, task: str, from_: int, poll: float
    ) -> AsyncIterator[OutputChunk]:
        """:meth:`follow_stream`'s generator."""
        while True:
            result = await self.follow(task, from_, timeout=poll)
            for chunk in result.chunks:
                yield chunk
            if result.end:
                return
            from_ = result.next

    async def resume(self, token: str, data: Any = None) -> ResumeResult:
        """Resumes the suspension ``token`` names: the task is ready again at its place
        and its next holder sees ``data`` (JSON-serialisable, at most 64 KiB of JSON).
        Raises :class:`~muster.StaleToken` for a token that was spent, is an earlier
        suspension's, or names a task no longer suspended (PROTOCOL.md §5.48)."""
        fields = {"token": token, "data": None if data is None else json_value(data, "data")}
        (reply,) = await self._send("resume", fields)
        return ResumeResult._from(reply)

    async def resume_task(self, task: str, data: Any = None) -> ResumeResult:
        """Resumes suspended task ``task`` by its id: for approve and admin tokens.
        Raises :class:`~muster.InvalidState` if it is not suspended."""
        fields = {"task": task, "data": None if data is None else json_value(data, "data")}
        (reply,) = await self._send("resume", fields)
        return ResumeResult._from(reply)

    async def dead_letter(self, claim: ClaimRef, error: str) -> SettleResult:
        """Sends a leased task to dead at once, with an error."""
        task, epoch = claim_of(claim)
        fields = {"task": task, "epoch": epoch, "error": error}
        (reply,) = await self._send("dead_letter", fields)
        return SettleResult._from(reply)

    # Limits.

    async def limit_set(
        self,
        name: str,
        *,
        rate: Optional[RateRef] = None,
        burst: Optional[int] = None,
        concurrency: Optional[int] = None,
        per_key: bool = False,
    ) -> LimitInfo:
        """Creates limit ``name`` or replaces all its settings (PROTOCOL.md §4.14): a
        budget tasks of any queue draw on (``limits`` of :meth:`enqueue`).

        ``rate`` is a token bucket's refill: ``(count, per)``, ``count`` tokens every
        ``per`` seconds (or :class:`~datetime.timedelta`), e.g. ``(500, 60)`` for 500 a
        minute, or a :class:`~muster.Rate`; ``burst`` the most tokens the bucket holds
        (the rate's count if ``None``; only with a rate). ``concurrency`` caps the
        leases held at once. Give a rate, a concurrency or both. With ``per_key`` every
        key tasks name for it gets its own bucket and count. Needs an admin token over
        every queue (:class:`~muster.Forbidden`); a value out of range raises
        :class:`~muster.BadRequest`.
        """
        fields = {
            "name": name,
            "rate": None if rate is None else _rate(rate),
            "burst": burst,
            "concurrency": concurrency,
            "per_key": per_key,
        }
        return LimitInfo._from((await self._call("limit_set", fields))["limit"])

    async def limit_get(self, name: str) -> LimitInfo:
        """One limit with its state now: leases held, tasks waiting, its busiest keys."""
        return LimitInfo._from((await self._call("limit_get", {"name": name}))["limit"])

    async def limit_list(self) -> List[LimitInfo]:
        """Every limit, by name."""
        return [LimitInfo._from(x) for x in await self._pages("limit_list", "limits")]

    async def limit_delete(self, name: str) -> int:
        """Deletes a limit; returns how many tasks were waiting on it (they no longer
        wait on it, and draw on it again if a limit of that name is set anew)."""
        count: int = (await self._call("limit_delete", {"name": name}))["count"]
        return count

    # Schedules.

    async def schedule_set(
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
        limits: Sequence[LimitRef] = (),
        group: Optional[str] = None,
    ) -> Schedule:
        """Creates schedule ``name`` or replaces its settings: each time its ``cron``
        pattern names, one task (``payload``, JSON; ``null`` if ``None``; with the
        task options :meth:`enqueue` takes, but ``at`` and ``idempotency_key``, which
        each fire sets) is enqueued into ``queue``, which must exist, with the
        idempotency key ``schedule:NAME:FIRE_MS``, so a fire enqueues once.

        ``cron`` has five fields (minute granularity) or six with seconds first
        (``"*/10 * * * * *"``); ``@hourly``-style aliases and croner's extensions (``L``,
        ``#``, ``W``) are accepted. ``tz`` is the IANA time zone it is read in (``UTC``
        if ``None``). ``catch_up`` says what fires missed by more than the grace do
        (``"skip"``, the default, or ``"once"``). ``paused`` creates it (or leaves it)
        paused; a replaced schedule keeps its state if ``None``. Fires carry no trace
        context. Raises :class:`~muster.BadRequest` for a bad pattern or time zone,
        :class:`~muster.NotFound` for a queue that does not exist.
        """
        task = _task_fields(payload, priority, key, delay, None, requires, limits, group)
        fields = {
            "name": name,
            "cron": cron,
            "tz": tz,
            "queue": queue,
            "task": task,
            "catch_up": catch_up,
            "paused": paused,
        }
        return Schedule._from((await self._call("schedule_set", fields))["schedule"])

    async def schedule_get(self, name: str) -> Schedule:
        """One schedule with its next fire and what its fires did."""
        return Schedule._from((await self._call("schedule_get", {"name": name}))["schedule"])

    async def schedule_list(self) -> List[Schedule]:
        """Every schedule this client may see, by name."""
        return [Schedule._from(x) for x in await self._pages("schedule_list", "schedules")]

    async def schedule_pause(self, name: str) -> Schedule:
        """Pauses a schedule: it does not fire until resumed."""
        return Schedule._from((await self._call("schedule_pause", {"name": name}))["schedule"])

    async def schedule_resume(self, name: str) -> Schedule:
        """Resumes a paused schedule: it fires from its pattern's next time after now
        (the times it passed while paused do not fire)."""
        reply = await self._call("schedule_resume", {"name": name})
        return Schedule._from(reply["schedule"])

    async def schedule_delete(self, name: str) -> None:
        """Deletes a schedule (the tasks it enqueued stay)."""
        await self._call("schedule_delete", {"name": name})

    async def schedule_run(self, name: str) -> EnqueuedTask:
        """Enqueues the schedule's task now, once, whatever its pattern and pause; its
        fires go on as before."""
        return EnqueuedTask._from((await self._call("schedule_run", {"name": name}))["task"])

    # Dead letters.

    async def redrive(
        self,
        queue: str,
        ids: Sequence[str] = (),
        *,
        all: bool = False,
        dry_run: bool = False,
    ) -> CountResult:
        """Makes dead tasks of a queue (these ``ids``, or ``all``) ready again with their
        failures reset; ``dry_run`` only counts and lists them."""
        fields = {"queue": queue, "ids": list(ids), "all": all, "dry_run": dry_run}
        return CountResult._from(await self._call("redrive", fields))

    async def discard(
        self,
        queue: str,
        ids: Sequence[str] = (),
        *,
        all: bool = False,
        dry_run: bool = False,
    ) -> CountResult:
        """Removes dead tasks of a queue (these ``ids``, or ``all``)."""
        fields = {"queue": queue, "ids": list(ids), "all": all, "dry_run": dry_run}
        return CountResult._from(await self._call("discard", fields))

    # Members.

    async def member_list(self) -> List[MemberInfo]:
        """Every member the daemon knows, by name."""
        return [MemberInfo._from(m) for m in await self._pages("member_list", "members")]

    async def member_describe(self, member: str) -> MemberDescription:
        """One member and the tasks it holds."""
        reply = await self._call("member_describe", {"member": member})
        return MemberDescription._from(reply)

    async def member_drain(self, member: str) -> MemberInfo:
        """Drains a member: it keeps its leases, gets nothing new, and its worker drains."""
        reply = await self._call("member_drain", {"member": member})
        return MemberInfo._from(reply["member"])

    async def member_undrain(self, member: str) -> MemberInfo:
        """Ends a member's drain: it gets work again. A worker that already began to
        drain at the drain push still drains to its end."""
        reply = await self._call("member_undrain", {"member": member})
        return MemberInfo._from(reply["member"])

    async def member_release(self, member: str) -> None:
        """Frees a member name from the token that first used it, so another token may
        use it. Raises :class:`~muster.InvalidState` while the member has a session or
        leases, :class:`~muster.NotFound` if no token holds the name (always without
        tokens)."""
        await self._call("member_release", {"member": member})

    async def lease_revoke(self, task: str) -> SettleResult:
        """Revokes a task's lease: it lapses now (one failure) and its holder is told to stop."""
        return SettleResult._from(await self._call("lease_revoke", {"task": task}))

    async def server_stats(self) -> ServerStats:
        """The daemon's group-commit counters."""
        return ServerStats._from(await self._call("server_stats", {}))

    async def admin_snapshot(self, dir: str) -> SnapshotResult:
        """Writes a consistent copy of the whole store into ``dir``, a new directory
        **on the daemon's host** inside its snapshot root (a name there, or an absolute
        path inside it): a backup (PROTOCOL.md §5.36). Returns once the copy is
        durable, with the absolute path written."""
        return SnapshotResult._from(await self._call("admin_snapshot", {"dir": dir}))

    # Cluster.

    async def cluster_status(self) -> ClusterStatus:
        """The cluster as the connected node sees it (PROTOCOL.md §5.39): its role, term,
        leader, log and applied positions and snapshot, and every voter and learner
        (with, on the leader, how far it knows each to be). Any node answers, leader or
        not: connect with :meth:`connect_node` for one node's own view. Needs an admin
        token (when tokens are configured); a single daemon raises
        :class:`~muster.InvalidState`."""
        return ClusterStatus._from(await self._call("cluster_status", {}))

    async def cluster_add(
        self,
        node: int,
        addr: str,
        cluster_addr: str,
        *,
        learner: bool = False,
        catch_up: Optional[Duration] = None,
    ) -> ClusterStatus:
        """Adds node ``node`` to the cluster, on the leader (PROTOCOL.md §5.40): clients
        reach it at ``addr`` and the other nodes at ``cluster_addr`` (both
        ``HOST:PORT``). It joins as a learner; the leader waits up to ``catch_up``
        (60 s if ``None``; 1 ms to 1 h) until it holds the log, then makes it a voter
        unless ``learner``. Adding a learner again promotes it. Returns the cluster
        afterwards, as the leader sees it.

        A node that did not catch up in time stays a learner and this raises
        :class:`~muster.InvalidState` saying how far it got. Raises
        :class:`~muster.AlreadyExists` for a node that votes already,
        :class:`~muster.NotLeader` on a node that does not lead,
        :class:`~muster.BadRequest` for a ``catch_up`` out of range and
        :class:`~muster.Forbidden` without an admin token over every queue.
        """
        fields = {
            "node": _node_id(node),
            "addr": addr,
            "cluster_addr": cluster_addr,
            "learner": learner,
            "catch_up_ms": ms(catch_up, "catch_up"),
        }
        return ClusterStatus._from(await self._call("cluster_add", fields))

    async def cluster_remove(self, node: int) -> ClusterStatus:
        """Removes node ``node`` from the cluster, on the leader (PROTOCOL.md §5.41); stop
        its process afterwards. Returns the cluster afterwards. Raises
        :class:`~muster.NotFound` for a node that is not a member,
        :class:`~muster.NotLeader` on a node that does not lead and
        :class:`~muster.Forbidden` without an admin token over every queue."""
        reply = await self._call("cluster_remove", {"node": _node_id(node)})
        return ClusterStatus._from(reply)
