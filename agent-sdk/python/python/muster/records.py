"""What the daemon answers, as frozen dataclasses.

The fields mirror PROTOCOL.md §4 one to one, names included: instants and durations
stay integers of milliseconds (``created_ms``, ``lease_ms``), task states are the
protocol's strings. Payloads, results and progress checkpoints are decoded from JSON
into Python objects (``None`` when absent).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Literal, Optional

TaskState = Literal["scheduled", "ready", "leased", "suspended", "done", "dead", "cancelled"]
"""A task's state: ``scheduled``, ``ready``, ``leased``, ``suspended``, ``done``, ``dead`` or
``cancelled``."""

OnTimeout = Literal["resume", "fail", "cancel"]
"""What a suspension's timeout does: ``resume`` (ready, ``timed_out``), ``fail`` (dead,
reason ``suspend_timed_out``) or ``cancel``."""

MemberState = Literal["connected", "unreachable", "gone"]
"""Whether the daemon hears from a member: ``connected``, ``unreachable`` or ``gone``."""

CatchUp = Literal["skip", "once"]
"""What a schedule does with fires it missed by more than its grace: ``skip`` (none
enqueued) or ``once`` (the latest missed fire enqueues one task for them all)."""

ClusterRole = Literal["leader", "follower", "candidate", "learner", "shutdown"]
"""A cluster node's role: ``leader``, ``follower``, ``candidate``, ``learner`` or ``shutdown``."""

_Dict = Dict[str, Any]


@dataclass(frozen=True)
class Backoff:
    """Exponential retry backoff: ``base_ms * factor**(failures-1)``, capped, ± jitter."""

    base_ms: int
    factor: float
    cap_ms: int
    jitter: float

    @staticmethod
    def _from(d: _Dict) -> Backoff:
        return Backoff(d["base_ms"], d["factor"], d["cap_ms"], d["jitter"])


@dataclass(frozen=True)
class QueueOptions:
    """A queue's options (PROTOCOL.md §4.2)."""

    lease_ms: int
    max_attempts: int
    retry_backoff: Backoff
    key_concurrency: int
    retention_ms: int
    max_runtime_ms: Optional[int]
    paused: bool
    fair: bool
    """Groups of tasks take turns among tasks of equal priority (PROTOCOL.md §4.15)."""
    group_weights: Dict[str, int]
    """Each named group's weight in fair dispatch (2 to 1000); a group not named weighs 1."""

    @staticmethod
    def _from(d: _Dict) -> QueueOptions:
        return QueueOptions(
            lease_ms=d["lease_ms"],
            max_attempts=d["max_attempts"],
            retry_backoff=Backoff._from(d["retry_backoff"]),
            key_concurrency=d["key_concurrency"],
            retention_ms=d["retention_ms"],
            max_runtime_ms=d.get("max_runtime_ms"),
            paused=d["paused"],
            fair=d.get("fair", False),
            group_weights=d.get("group_weights", {}),
        )


@dataclass(frozen=True)
class QueueTotals:
    """A queue's counters since the daemon started."""

    enqueued: int
    acked: int
    nacked: int
    lapsed: int

    @staticmethod
    def _from(d: _Dict) -> QueueTotals:
        return QueueTotals(d["enqueued"], d["acked"], d["nacked"], d["lapsed"])


@dataclass(frozen=True)
class QueueInfo:
    """A queue with its options and counts (PROTOCOL.md §4.4)."""

    name: str
    options: QueueOptions
    scheduled: int
    ready: int
    leased: int
    done: int
    dead: int
    cancelled: int
    suspended: int
    """Tasks suspended until a resume or their timeout."""
    held_back: int
    """Ready tasks waiting behind an earlier task of their key."""
    unclaimable: int
    """Ready tasks whose ``requires`` no connected member's labels cover."""
    waiting_on_limits: int
    """Ready tasks waiting for room in a limit they draw on (PROTOCOL.md §4.14)."""
    unclaimable_requires: List[List[str]]
    """The label sets holding the most unclaimable tasks (at most 16)."""
    unclaimable_sets: int
    """How many label sets unclaimable tasks require in all."""
    consumers: int
    """Connected, not draining sessions subscribed to it, and claims parked on it."""
    totals: QueueTotals
    oldest_ready_ms: Optional[int]
    created_ms: int

    @staticmethod
    def _from(d: _Dict) -> QueueInfo:
        return QueueInfo(
            name=d["name"],
            options=QueueOptions._from(d["options"]),
            scheduled=d["scheduled"],
            ready=d["ready"],
            leased=d["leased"],
            done=d["done"],
            dead=d["dead"],
            cancelled=d["cancelled"],
            suspended=d.get("suspended", 0),
            held_back=d.get("held_back", 0),
            unclaimable=d.get("unclaimable", 0),
            waiting_on_limits=d.get("waiting_on_limits", 0),
            unclaimable_requires=d.get("unclaimable_requires", []),
            unclaimable_sets=d.get("unclaimable_sets", 0),
            consumers=d.get("consumers", 0),
            totals=QueueTotals._from(d["totals"]),
            oldest_ready_ms=d.get("oldest_ready_ms"),
            created_ms=d["created_ms"],
        )


@dataclass(frozen=True)
class LeaseInfo:
    """The lease of a leased task."""

    member: str
    """The holder; ``""`` for an anonymous claim."""
    epoch: int
    expires_ms: int

    @staticmethod
    def _from(d: Optional[_Dict]) -> Optional[LeaseInfo]:
        return None if d is None else LeaseInfo(d["member"], d["epoch"], d["expires_ms"])


@dataclass(frozen=True)
class TimelineEvent:
    """One event of a task's timeline (PROTOCOL.md §4.11)."""

    at_ms: int
    event: str
    member: Optional[str]
    epoch: Optional[int]
    error: Optional[str]

    @staticmethod
    def _from(d: _Dict) -> TimelineEvent:
        return TimelineEvent(
            d["at_ms"], d["event"], d.get("member"), d.get("epoch"), d.get("error")
        )


@dataclass(frozen=True)
class Suspension:
    """A suspended task's suspension, as people see it (PROTOCOL.md §4.9): never its token."""

    reason: str
    member: str
    """The member that suspended it (``""`` for an anonymous claim)."""
    epoch: int
    """The epoch of the lease it was suspended under, which its resume token names."""
    since_ms: int
    timeout_at_ms: int
    on_timeout: OnTimeout
    children: bool
    """True when it waits for its children (a spawn with ``wait``): it is ready again
    once every one has finished."""

    @staticmethod
    def _from(d: Optional[_Dict]) -> Optional[Suspension]:
        if d is None:
            return None
        return Suspension(
            d["reason"],
            d["member"],
            d["epoch"],
            d["since_ms"],
            d["timeout_at_ms"],
            d["on_timeout"],
            d.get("children", False),
        )


@dataclass(frozen=True)
class ChildOutcome:
    """A child task as its waiting parent's next holder sees it (in
    :attr:`Resumed.children`, :attr:`muster.Task.children`): its state when the wait
    ended (``done``, ``dead`` or ``cancelled`` once all have finished), its ``result``
    when done and its ``error`` when it has one. ``omitted`` is true when the result or
    error was left out to keep the parent small (over 4 KiB, or past 64 KiB for all
    the children): read the child by its ``id``."""

    id: str
    child_key: str
    queue: str
    state: TaskState
    result: Any
    error: Optional[str]
    omitted: bool

    @staticmethod
    def _from(d: _Dict) -> ChildOutcome:
        return ChildOutcome(
            id=d["id"],
            child_key=d["child_key"],
            queue=d["queue"],
            state=d["state"],
            result=d.get("result"),
            error=d.get("error"),
            omitted=d.get("omitted", False),
        )


@dataclass(frozen=True)
class ChildSummary:
    """A child task as its parent's :class:`TaskInfo` lists it: its id, key, queue,
    state, and how many children it has itself."""

    id: str
    child_key: str
    queue: str
    state: TaskState
    children: int

    @staticmethod
    def _from(d: _Dict) -> ChildSummary:
        return ChildSummary(d["id"], d["child_key"], d["queue"], d["state"], d.get("children", 0))


@dataclass(frozen=True)
class Resumed:
    """How a task's last suspension ended: the resume's ``data`` and who sent it
    (``by``: the token's name, ``""`` without tokens), or ``timed_out``; for a task that
    waited for its children, each child's outcome (``children``, in the order they were
    spawned; ``by`` is ``""`` when their end woke it)."""

    data: Any
    by: str
    at_ms: int
    timed_out: bool
    children: List[ChildOutcome]

    @staticmethod
    def _from(d: Optional[_Dict]) -> Optional[Resumed]:
        if d is None:
            return None
        return Resumed(
            d.get("data"),
            d["by"],
            d["at_ms"],
            d["timed_out"],
            [ChildOutcome._from(c) for c in d.get("children", [])],
        )


@dataclass(frozen=True)
class Suspended:
    """What a suspend answers: ``suspended`` with the one-time ``resume_token`` and when
    the timeout acts, or ``cancelled`` (a cancel was pending; no token)."""

    state: TaskState
    resume_token: Optional[str]
    timeout_at_ms: Optional[int]

    @staticmethod
    def _from(d: _Dict) -> Suspended:
        return Suspended(d["state"], d.get("resume_token"), d.get("timeout_at_ms"))


@dataclass(frozen=True)
class SpawnedChild:
    """A child a spawn enqueued, or found spawned before under its ``child_key``
    (``duplicate``), with its id and state."""

    child_key: str
    id: str
    duplicate: bool
    state: TaskState

    @staticmethod
    def _from(d: _Dict) -> SpawnedChild:
        return SpawnedChild(d["child_key"], d["id"], d["duplicate"], d["state"])


@dataclass(frozen=True)
class Spawned:
    """What a spawn answers: each child asked for, in order, and the parent's state:
    ``leased`` without a wait; with one ``suspended`` (with a ``resume_token`` that ends
    the wait early, and when its timeout acts), ``ready`` when every child had
    finished already, or ``cancelled`` if a cancel was pending."""

    children: List[SpawnedChild]
    state: TaskState
    resume_token: Optional[str]
    timeout_at_ms: Optional[int]

    @staticmethod
    def _from(d: _Dict) -> Spawned:
        return Spawned(
            [SpawnedChild._from(c) for c in d["children"]],
            d["state"],
            d.get("resume_token"),
            d.get("timeout_at_ms"),
        )


@dataclass(frozen=True)
class ResumeResult:
    """The task a resume made ready, and its state (``ready``)."""

    task: str
    state: TaskState

    @staticmethod
    def _from(d: _Dict) -> ResumeResult:
        return ResumeResult(d["task"], d["state"])


@dataclass(frozen=True)
class OutputSummary:
    """What a task's live output holds (PROTOCOL.md §4.18): chunks ``first`` to
    ``next - 1`` are kept (those before ``first`` were dropped, oldest first, to keep
    the task within 1 MiB as stored and 1,024 emits), ``bytes`` their size as stored."""

    first: int
    """The number of the oldest chunk kept."""
    next: int
    """The number the next chunk gets: how many chunks the task emitted."""
    bytes: int
    """Bytes of the output kept, as stored: for each emit kept, 17 bytes and, for
    each of its chunks, its JSON (``{"text":"…"}`` with its escapes, or
    ``{"json":…}`` with the JSON text as sent) and a comma."""

    @staticmethod
    def _from(d: Optional[_Dict]) -> Optional[OutputSummary]:
        return None if d is None else OutputSummary(d["first"], d["next"], d["bytes"])


@dataclass(frozen=True)
class OutputChunk:
    """One chunk of a task's live output, as a follower reads it: its number ``n``
    (from 0, one more for each chunk after it), when the daemon stored it, and its
    ``text``, or (``text`` is ``None``) its ``json`` value, decoded."""

    n: int
    at_ms: int
    text: Optional[str]
    json: Any

    @staticmethod
    def _from(d: _Dict) -> OutputChunk:
        return OutputChunk(d["n"], d["at_ms"], d.get("text"), d.get("json"))


@dataclass(frozen=True)
class FollowResult:
    """One read of a task's output (PROTOCOL.md §5.51): ``chunks`` in order with no
    gap, after ``dropped`` chunks from the number asked for that are no longer kept;
    ``next``, the number to ask from next; the task's ``state``; and ``end``, true once
    the task is finished and every chunk it emitted was sent (nothing more to follow)."""

    chunks: List[OutputChunk]
    dropped: int
    next: int
    state: TaskState
    end: bool

    @staticmethod
    def _from(d: _Dict) -> FollowResult:
        return FollowResult(
            [OutputChunk._from(c) for c in d["chunks"]],
            d.get("dropped", 0),
            d["next"],
            d["state"],
            d["end"],
        )


@dataclass(frozen=True)
class EmitResult:
    """What an emit answers (PROTOCOL.md §5.50): ``next``, the number the next chunk
    gets (the next emit's ``at``); ``repeated``, chunks of this emit stored before (by
    an earlier try whose reply was lost); ``wait_ms``, how long to wait before the next
    emit (the task's output rate is spent until then); and whether a cancel is pending."""

    next: int
    repeated: int
    wait_ms: int
    cancel_requested: bool

    @staticmethod
    def _from(d: _Dict) -> EmitResult:
        return EmitResult(
            d["next"], d.get("repeated", 0), d.get("wait_ms", 0), d["cancel_requested"]
        )


@dataclass(frozen=True)
class TaskInfo:
    """A whole task, as ``task_get`` and ``wait`` return it (PROTOCOL.md §4.9)."""

    id: str
    queue: str
    state: TaskState
    payload: Any
    priority: int
    key: Optional[str]
    requires: List[str]
    limits: List[LimitUse]
    """The limits it draws on, each with its key and cost as enqueued."""
    group: Optional[str]
    """Its group for fair dispatch, if any."""
    not_before_ms: Optional[int]
    idempotency_key: Optional[str]
    deliveries: int
    failures: int
    lease: Optional[LeaseInfo]
    cancel_requested: bool
    progress: Any
    result: Any
    last_error: Optional[str]
    dead_reason: Optional[str]
    suspension: Optional[Suspension]
    """While suspended: why, since when, and what its timeout does."""
    resumed: Optional[Resumed]
    """How its last suspension ended, until its next suspension."""
    parent: Optional[str]
    """The task that spawned it, if it is a child."""
    child_key: Optional[str]
    """Its key among its parent's children, if it is a child."""
    children: List[ChildSummary]
    """The children it spawned that are still stored, in the order they were spawned."""
    output: Optional[OutputSummary]
    """What its live output holds (chunks kept, the next number); ``None`` if it never
    emitted any."""
    traceparent: Optional[str]
    """The W3C trace context it was enqueued (or spawned) with, if any."""
    tracestate: Optional[str]
    """The W3C ``tracestate`` that goes with ``traceparent``, if any."""
    created_ms: int
    updated_ms: int
    history: List[TimelineEvent]

    @staticmethod
    def _from(d: _Dict) -> TaskInfo:
        return TaskInfo(
            id=d["id"],
            queue=d["queue"],
            state=d["state"],
            payload=d["payload"],
            priority=d["priority"],
            key=d.get("key"),
            requires=d.get("requires", []),
            limits=[LimitUse._from(u) for u in d.get("limits", [])],
            group=d.get("group"),
            not_before_ms=d.get("not_before_ms"),
            idempotency_key=d.get("idempotency_key"),
            deliveries=d["deliveries"],
            failures=d["failures"],
            lease=LeaseInfo._from(d.get("lease")),
            cancel_requested=d["cancel_requested"],
            progress=d.get("progress"),
            result=d.get("result"),
            last_error=d.get("last_error"),
            dead_reason=d.get("dead_reason"),
            suspension=Suspension._from(d.get("suspension")),
            resumed=Resumed._from(d.get("resumed")),
            parent=d.get("parent"),
            child_key=d.get("child_key"),
            children=[ChildSummary._from(c) for c in d.get("children", [])],
            output=OutputSummary._from(d.get("output")),
            traceparent=d.get("traceparent"),
            tracestate=d.get("tracestate"),
            created_ms=d["created_ms"],
            updated_ms=d["updated_ms"],
            history=[TimelineEvent._from(e) for e in d.get("history", [])],
        )


@dataclass(frozen=True)
class LimitUse:
    """A limit a task draws on (PROTOCOL.md §4.5): give these in ``limits`` when
    enqueueing; :class:`TaskInfo` shows them with the ``cost`` filled in.

    ``limit`` names an existing limit. ``key`` picks the bucket of a per-key limit (tasks
    without one share the keyless bucket; a limit that is not per key ignores it).
    ``cost`` is the tokens its lease takes, 1 to the limit's burst (1 if ``None``).
    """

    limit: str
    key: Optional[str] = None
    cost: Optional[int] = None

    def _fields(self) -> _Dict:
        return {"limit": self.limit, "key": self.key, "cost": self.cost}

    @staticmethod
    def _from(d: _Dict) -> LimitUse:
        return LimitUse(d["limit"], d.get("key"), d.get("cost"))


@dataclass(frozen=True)
class Rate:
    """A limit's rate: ``count`` tokens every ``per_ms`` milliseconds, added a little at
    a time. :meth:`muster.Client.limit_set` takes one, or a pair ``(count, per)`` with
    ``per`` a duration (seconds or :class:`~datetime.timedelta`)."""

    count: int
    per_ms: int

    @staticmethod
    def _from(d: Optional[_Dict]) -> Optional[Rate]:
        return None if d is None else Rate(d["count"], d["per_ms"])


@dataclass(frozen=True)
class LimitKeyInfo:
    """One bucket of a limit in use: a key of a per-key limit, or ``""`` for the one
    bucket of a limit that is not per key."""

    key: str
    tokens: Optional[int]
    """Whole tokens in its bucket now; ``None`` for a limit without a rate."""
    held: int
    """Leases held on it."""
    waiting: int
    """Ready tasks waiting for its room."""
    full_ms: Optional[int]
    """When its bucket is full again, if it is not."""
    throttled_until_ms: Optional[int]
    """Until when it hands nothing out, while a throttle lasts."""

    @staticmethod
    def _from(d: _Dict) -> LimitKeyInfo:
        return LimitKeyInfo(
            key=d["key"],
            tokens=d.get("tokens"),
            held=d["held"],
            waiting=d["waiting"],
            full_ms=d.get("full_ms"),
            throttled_until_ms=d.get("throttled_until_ms"),
        )


@dataclass(frozen=True)
class LimitInfo:
    """A limit with its settings and its state now (PROTOCOL.md §4.14): a token bucket
    (``rate``, ``burst``), a cap on leases held at once (``concurrency``), or both;
    with ``per_key``, each key has its own."""

    name: str
    rate: Optional[Rate]
    burst: Optional[int]
    """The most tokens a bucket holds (the rate's count unless set); ``None`` without a rate."""
    concurrency: Optional[int]
    per_key: bool
    held: int
    """Leases held that draw on it, on all its keys."""
    waiting: int
    """Ready tasks waiting for its room, on all its keys."""
    granted: int
    """Leases granted that drew on it since the daemon started."""
    throttled: int
    """Throttles reported on it since the daemon started."""
    keys_in_use: int
    """Its buckets in use: below full, holding leases, with tasks waiting or throttled."""
    keys: List[LimitKeyInfo]
    """The busiest buckets in use (most leases held, then most waiting), at most 10."""
    created_ms: int
    updated_ms: int

    @staticmethod
    def _from(d: _Dict) -> LimitInfo:
        return LimitInfo(
            name=d["name"],
            rate=Rate._from(d.get("rate")),
            burst=d.get("burst"),
            concurrency=d.get("concurrency"),
            per_key=d.get("per_key", False),
            held=d["held"],
            waiting=d["waiting"],
            granted=d["granted"],
            throttled=d["throttled"],
            keys_in_use=d["keys_in_use"],
            keys=[LimitKeyInfo._from(k) for k in d["keys"]],
            created_ms=d["created_ms"],
            updated_ms=d["updated_ms"],
        )


@dataclass(frozen=True)
class TaskSummary:
    """A task in a listing (``task_list``, ``task_find``, ``task_update``,
    ``member_describe``): no payload, result or history, and the progress checkpoint
    only as a short text (PROTOCOL.md §4.10)."""

    id: str
    queue: str
    state: TaskState
    priority: int
    key: Optional[str]
    deliveries: int
    failures: int
    not_before_ms: Optional[int]
    lease: Optional[LeaseInfo]
    last_error: Optional[str]
    dead_reason: Optional[str]
    suspension: Optional[Suspension]
    """While suspended: why, since when, and what its timeout does."""
    created_ms: int
    updated_ms: int
    progress: Optional[str]
    """The JSON text of the last progress checkpoint cut to 256 bytes (``…`` appended
    when cut, so then no longer JSON); ``None`` without one. ``task_get`` has it whole."""

    @staticmethod
    def _from(d: _Dict) -> TaskSummary:
        return TaskSummary(
            id=d["id"],
            queue=d["queue"],
            state=d["state"],
            priority=d["priority"],
            key=d.get("key"),
            deliveries=d["deliveries"],
            failures=d["failures"],
            not_before_ms=d.get("not_before_ms"),
            lease=LeaseInfo._from(d.get("lease")),
            last_error=d.get("last_error"),
            dead_reason=d.get("dead_reason"),
            suspension=Suspension._from(d.get("suspension")),
            created_ms=d["created_ms"],
            updated_ms=d["updated_ms"],
            progress=d.get("progress"),
        )


@dataclass(frozen=True)
class TaskPage:
    """One page of ``task_list``: pass ``next`` as ``after`` for the next page (``None``
    on the last)."""

    tasks: List[TaskSummary]
    next: Optional[str]

    @staticmethod
    def _from(d: _Dict) -> TaskPage:
        return TaskPage([TaskSummary._from(t) for t in d["tasks"]], d.get("next"))


@dataclass(frozen=True)
class FindCursor:
    """Where a ``task_find`` stopped: pass it as ``after`` to continue."""

    queue: str
    id: str

    @staticmethod
    def _from(d: Optional[_Dict]) -> Optional[FindCursor]:
        return None if d is None else FindCursor(d["queue"], d["id"])


@dataclass(frozen=True)
class FindResult:
    """One step of a ``task_find`` search (PROTOCOL.md §5.35).

    A step does a bounded amount of work, so it may hold fewer matches than asked for,
    even none, and still have a ``next``; ``next`` is ``None`` once every candidate
    was examined. ``scanned`` is how much this step examined.
    """

    tasks: List[TaskSummary]
    next: Optional[FindCursor]
    scanned: int

    @staticmethod
    def _from(d: _Dict) -> FindResult:
        return FindResult(
            [TaskSummary._from(t) for t in d["tasks"]],
            FindCursor._from(d.get("next")),
            d["scanned"],
        )


@dataclass(frozen=True)
class WaitResult:
    """What ``wait`` saw: every id asked for is in exactly one of the four lists.

    ``omitted`` names finished tasks left out of ``finished`` so that the reply fits
    one frame: read them with ``task_get``.
    """

    finished: List[TaskInfo]
    pending: List[str]
    removed: List[str]
    omitted: List[str]

    @staticmethod
    def _from(d: _Dict) -> WaitResult:
        return WaitResult(
            [TaskInfo._from(t) for t in d["finished"]],
            d["pending"],
            d["removed"],
            d.get("omitted", []),
        )


@dataclass(frozen=True)
class CancelResult:
    """The task's state after ``cancel``; ``cancel_requested`` when it was leased."""

    state: TaskState
    cancel_requested: bool

    @staticmethod
    def _from(d: _Dict) -> CancelResult:
        return CancelResult(d["state"], d["cancel_requested"])


@dataclass(frozen=True)
class Claim:
    """A task leased by ``claim``: settle it with its id and epoch (PROTOCOL.md §4.7).

    ``str(claim)`` is the CLI's claim string ``ID.EPOCH``, which the settle methods
    accept too.
    """

    id: str
    epoch: int
    queue: str
    payload: Any
    attempt: int
    failures: int
    priority: int
    key: Optional[str]
    lease_expires_ms: int
    lease_ms: int
    progress: Any
    reclaimed: bool
    resumed: Optional[Resumed]
    """How the task's last suspension ended, if it was resumed (or timed out into ready,
    or its children finished: ``resumed.children``)."""
    parent: Optional[str]
    """The task that spawned this one, if it is a child."""
    output: int
    """The number the task's next output chunk gets: the ``at`` of this holder's first
    :meth:`~muster.Client.emit` (0 when the task has no output yet)."""
    traceparent: Optional[str]
    """The trace context this holder's work belongs to, if any: the producer's, or,
    when ``musterd`` exports spans, this lease's span in the same trace."""
    tracestate: Optional[str]
    """The W3C ``tracestate`` that goes with ``traceparent``, if any."""

    def __str__(self) -> str:
        """The claim string ``ID.EPOCH``."""
        return f"{self.id}.{self.epoch}"

    @staticmethod
    def _from(d: _Dict) -> Claim:
        return Claim(
            id=d["id"],
            epoch=d["epoch"],
            queue=d["queue"],
            payload=d["payload"],
            attempt=d["attempt"],
            failures=d["failures"],
            priority=d["priority"],
            key=d.get("key"),
            lease_expires_ms=d["lease_expires_ms"],
            lease_ms=d["lease_ms"],
            progress=d.get("progress"),
            reclaimed=d["reclaimed"],
            resumed=Resumed._from(d.get("resumed")),
            parent=d.get("parent"),
            output=d.get("output", 0),
            traceparent=d.get("traceparent"),
            tracestate=d.get("tracestate"),
        )


@dataclass(frozen=True)
class RenewResult:
    """A renewed lease: its new deadline, its length, and whether a cancel is pending."""

    lease_expires_ms: int
    lease_ms: int
    cancel_requested: bool

    @staticmethod
    def _from(d: _Dict) -> RenewResult:
        return RenewResult(d["lease_expires_ms"], d["lease_ms"], d["cancel_requested"])


@dataclass(frozen=True)
class SettleResult:
    """The task's state after a settle; ``not_before_ms`` when it was scheduled for a retry."""

    state: TaskState
    not_before_ms: Optional[int]

    @staticmethod
    def _from(d: _Dict) -> SettleResult:
        return SettleResult(d["state"], d.get("not_before_ms"))


@dataclass(frozen=True)
class CountResult:
    """How many tasks a redrive or discard touched; ``ids`` only for a dry run."""

    count: int
    ids: List[str]

    @staticmethod
    def _from(d: _Dict) -> CountResult:
        return CountResult(d["count"], d.get("ids", []))


@dataclass(frozen=True)
class MemberInfo:
    """A member: a stable agent name with its session's state (PROTOCOL.md §4.13)."""

    name: str
    labels: List[str]
    capacity: int
    leased: int
    connected: bool
    state: MemberState
    liveness_ms: int
    draining: bool
    subscribed: List[str]
    last_seen_ms: Optional[int]

    @staticmethod
    def _from(d: _Dict) -> MemberInfo:
        return MemberInfo(
            name=d["name"],
            labels=d["labels"],
            capacity=d["capacity"],
            leased=d["leased"],
            connected=d["connected"],
            state=d["state"],
            liveness_ms=d["liveness_ms"],
            draining=d["draining"],
            subscribed=d["subscribed"],
            last_seen_ms=d.get("last_seen_ms"),
        )


@dataclass(frozen=True)
class MemberDescription:
    """A member and the tasks it holds (``leases`` as many as fit one frame, of
    ``leases_total``)."""

    member: MemberInfo
    leases: List[TaskSummary]
    leases_total: int

    @staticmethod
    def _from(d: _Dict) -> MemberDescription:
        return MemberDescription(
            MemberInfo._from(d["member"]),
            [TaskSummary._from(t) for t in d["leases"]],
            d.get("leases_total", len(d["leases"])),
        )


@dataclass(frozen=True)
class SnapshotResult:
    """A copy of the store written by ``admin_snapshot``: where, and what it holds."""

    dir: str
    tasks: int
    queues: int

    @staticmethod
    def _from(d: _Dict) -> SnapshotResult:
        return SnapshotResult(d["dir"], d["tasks"], d["queues"])


@dataclass(frozen=True)
class ServerStats:
    """The daemon's group-commit counters: ``synced_requests / syncs`` is the batch factor."""

    syncs: int
    synced_requests: int

    @staticmethod
    def _from(d: _Dict) -> ServerStats:
        return ServerStats(d["syncs"], d["synced_requests"])


@dataclass(frozen=True)
class ClusterMember:
    """One node of a cluster's membership, in a :class:`ClusterStatus` (PROTOCOL.md §5.39)."""

    node: int
    addr: str
    """The address clients reach it at, ``HOST:PORT``."""
    cluster_addr: str
    """The address the other nodes reach it at, ``HOST:PORT``."""
    voter: bool
    """Whether it votes (``False``: a learner)."""
    matched: Optional[int]
    """The last log index the leader knows the node holds; ``None`` when the answering
    node is not the leader or does not know."""

    @staticmethod
    def _from(d: _Dict) -> ClusterMember:
        return ClusterMember(d["node"], d["addr"], d["cluster_addr"], d["voter"], d.get("matched"))


@dataclass(frozen=True)
class ClusterStatus:
    """A cluster as the node that answered sees it (PROTOCOL.md §5.39): after the change,
    for ``cluster_add`` and ``cluster_remove``.

    ``last_log_index``, ``last_applied`` and ``snapshot_index`` are ``None`` before the
    node has such an entry; ``leader`` is ``None`` during an election.
    """

    cluster_id: str
    node: int
    """The answering node's id."""
    role: ClusterRole
    term: int
    leader: Optional[int]
    last_log_index: Optional[int]
    last_applied: Optional[int]
    snapshot_index: Optional[int]
    members: List[ClusterMember]
    """Every voter and learner, by node id."""

    @property
    def voters(self) -> List[int]:
        """The ids of the members that vote."""
        return [m.node for m in self.members if m.voter]

    @property
    def learners(self) -> List[int]:
        """The ids of the members that copy the log without voting."""
        return [m.node for m in self.members if not m.voter]

    @staticmethod
    def _from(d: _Dict) -> ClusterStatus:
        return ClusterStatus(
            cluster_id=d["cluster_id"],
            node=d["node"],
            role=d["role"],
            term=d["term"],
            leader=d.get("leader"),
            last_log_index=d.get("last_log_index"),
            last_applied=d.get("last_applied"),
            snapshot_index=d.get("snapshot_index"),
            members=[ClusterMember._from(m) for m in d["members"]],
        )


@dataclass(frozen=True)
class EnqueuedTask:
    """A task an enqueue made (or found, ``duplicate``) and its state now."""

    id: str
    duplicate: bool
    state: TaskState

    @staticmethod
    def _from(d: _Dict) -> EnqueuedTask:
        return EnqueuedTask(d["id"], d["duplicate"], d["state"])


@dataclass(frozen=True)
class Schedule:
    """A cron schedule, as ``schedule_get`` and ``schedule_list`` show it: its settings,
    when it fires next and what its fires did (PROTOCOL.md's ``ScheduleInfo``).

    ``task`` is the task each fire enqueues, as the protocol's ``NewTask`` fields
    (``payload`` decoded, ``priority``, ``key``, ``requires``, ``limits``, ``group``,
    ``delay_ms``, ... as set; each fire sets its own idempotency key)."""

    name: str
    cron: str
    tz: str
    """The IANA time zone its pattern is read in (``UTC`` if none was given)."""
    queue: str
    task: Dict[str, Any]
    catch_up: CatchUp
    paused: bool
    next_fire_ms: Optional[int]
    """When it fires next (wall ms); ``None`` while paused."""
    last_fire_ms: Optional[int]
    """The time its last fire was for (the time the pattern named), if any."""
    last_task: Optional[str]
    """The task its last fire or run enqueued, if any."""
    fires: int
    """Fires that enqueued a task (or found it enqueued already)."""
    runs: int
    """Tasks ``schedule_run`` enqueued."""
    missed: int
    """Fires missed by more than the grace and skipped."""
    failures: int
    """Fires whose task could not be enqueued (each recorded and passed)."""
    last_error: Optional[str]
    """Why the last failed fire failed (``code: message``), if one did."""
    created_ms: int
    updated_ms: int

    @staticmethod
    def _from(d: _Dict) -> Schedule:
        return Schedule(
            name=d["name"],
            cron=d["cron"],
            tz=d["tz"],
            queue=d["queue"],
            task=d["task"],
            catch_up=d["catch_up"],
            paused=d["paused"],
            next_fire_ms=d.get("next_fire_ms"),
            last_fire_ms=d.get("last_fire_ms"),
            last_task=d.get("last_task"),
            fires=d["fires"],
            runs=d["runs"],
            missed=d["missed"],
            failures=d["failures"],
            last_error=d.get("last_error"),
            created_ms=d["created_ms"],
            updated_ms=d["updated_ms"],
        )
