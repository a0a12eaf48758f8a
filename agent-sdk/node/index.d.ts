// The package's types: the addon's, generated from src/ into binding.d.ts by `napi
// build`, with what index.js adds in JavaScript declared below.
import type { ConnectOptions, FollowResult, OutputChunk, Task, WaitReply } from './binding'

export * from './binding'

declare module './binding' {
  interface Worker {
    /**
     * Runs the worker until it is shut down (by `shutdown()`, SIGTERM or SIGINT unless
     * `signals` is false, or an operator's drain) and every task is settled or
     * released. `handler(task)` runs for each task, up to `capacity` at once; its
     * outcome settles the task unless it settled it itself: a return value acks it
     * (the value, if not `undefined`, is the result); throwing `Retry` nacks it after
     * `delayMs`, `DeadLetter` dead-letters it, `Throttled` gives it back throttled,
     * and any other error nacks it with `Name: message` as its error, unless the task
     * must stop (`task.signal` aborted), when it is released without a failure.
     * An aborted `signal` drains the worker as `shutdown()` does. Rejects with
     * `Replaced` when another process took the member name over, or the daemon's
     * refusal of the session. A worker runs once.
     */
    run(handler: (task: Task) => unknown, options?: { signals?: boolean; signal?: AbortSignal }): Promise<void>
    /**
     * `for await (const task of worker)`: the tasks handed over, each to be settled by
     * the loop (`ack`, `nack`, ...), until the worker stops. SIGTERM and SIGINT drain it
     * meanwhile; leaving the loop early drains it too.
     */
    [Symbol.asyncIterator](): AsyncGenerator<Task, void, undefined>
  }
  interface Task {
    /**
     * Aborted when the task must stop: a cancel was asked, its lease was lost or
     * revoked or may lapse, or the worker's grace period ended. Pass it to `fetch`,
     * timers and SDKs that take one.
     */
    readonly signal: AbortSignal
  }
  interface FollowOptions {
    /** Closes the follower when it aborts: `next()` resolves `null`, the iteration ends. */
    signal?: AbortSignal
  }
  interface Follower {
    /** `for await (const chunk of follower)`: every chunk to the task's end; closes the follower after. */
    [Symbol.asyncIterator](): AsyncGenerator<OutputChunk, void, undefined>
  }
  interface Client {
    /**
     * `wait` with an `AbortSignal`: aborted, the call rejects at once with the signal's
     * reason (the daemon's wait runs on to its timeout, its answer dropped).
     */
    wait(tasks: Array<string>, timeoutMs: number, options?: { signal?: AbortSignal }): Promise<WaitReply>
    /** `follow` with an `AbortSignal`, as `wait` takes one. */
    follow(task: string, from: number | undefined | null, timeoutMs: number | undefined | null, options?: { signal?: AbortSignal }): Promise<FollowResult>
  }
  // The statics index.js gives the class (the functions `connect` and `connectNode`).
  namespace Client {
    /** Connects: to the daemon the options name, or to the leader among a cluster's nodes. */
    function connect(options?: ConnectOptions | null): Promise<Client>
    /** Connects to exactly the one address given, leader or not. */
    function connectNode(options?: ConnectOptions | null): Promise<Client>
  }
}

/** Every code a muster error has: the client's own, then the protocol's (PROTOCOL.md §2). */
export type ErrorCode =
  | 'connect_error'
  | 'connection_lost'
  | 'protocol_error'
  | 'invalid_input'
  | 'bad_request'
  | 'unknown_op'
  | 'not_found'
  | 'already_exists'
  | 'lease_lost'
  | 'invalid_state'
  | 'too_large'
  | 'limit'
  | 'unauthorized'
  | 'forbidden'
  | 'replaced'
  | 'shutting_down'
  | 'disk_full'
  | 'not_leader'
  | 'outcome_unknown'
  | 'stale_token'

/** The root of every error muster raises. */
export class MusterError extends Error {
  /** Its stable code. */
  readonly code: ErrorCode
}
/** The connection could not be made, or the contexts file is unreadable or names no such context. */
export class ConnectError extends MusterError {}
/** The connection was lost before the reply came: the request may or may not have taken effect. */
export class ConnectionLost extends MusterError {}
/** The daemon sent something this client does not understand. */
export class ProtocolError extends MusterError {}
/** The request was refused before it was sent. */
export class InvalidInput extends MusterError {}
/** The daemon refused the request; `code` is the protocol's error code. */
export class ServerError extends MusterError {}
/** bad_request: the request is malformed or a value is invalid. */
export class BadRequest extends ServerError {}
/** unknown_op: the daemon does not know the operation. */
export class UnknownOp extends ServerError {}
/** not_found: the named queue, task or member does not exist. */
export class NotFound extends ServerError {}
/** already_exists: the queue to create exists already. */
export class AlreadyExists extends ServerError {}
/** lease_lost: the claim's epoch is not the task's current lease. */
export class LeaseLost extends ServerError {}
/** invalid_state: the task's state does not allow the request. */
export class InvalidState extends ServerError {}
/** too_large: a size limit was exceeded. */
export class TooLarge extends ServerError {}
/** limit: a count limit of the daemon was reached. */
export class LimitExceeded extends ServerError {}
/** unauthorized: no valid token was presented. */
export class Unauthorized extends ServerError {}
/** forbidden: the token's roles or queue patterns do not allow this. */
export class Forbidden extends ServerError {}
/** replaced: a newer session under the same member name took over. */
export class Replaced extends ServerError {}
/** shutting_down: the daemon is stopping and takes no new work. */
export class ShuttingDown extends ServerError {}
/** disk_full: the daemon's disk alarm is on. */
export class DiskFull extends ServerError {}
/** not_leader: the cluster node is not the leader. */
export class NotLeader extends ServerError {}
/** outcome_unknown: the leader lost its leadership before the request was agreed on: retry it idempotently. */
export class OutcomeUnknown extends ServerError {}
/** stale_token: the resume token does not name the task's current suspension. */
export class StaleToken extends ServerError {}

/** Throw from a handler to nack its task: retried after `delayMs` (the queue's backoff if left out). */
export class Retry extends Error {
  constructor(message: string, options?: { delayMs?: number })
  readonly delayMs?: number
}
/** Throw from a handler to send its task to dead at once, with `message` as its error. */
export class DeadLetter extends Error {
  constructor(message: string)
}
/** Throw from a handler when a provider said to slow down: the task goes back as `task.throttled` gives it back, spending no attempt. */
export class Throttled extends Error {
  constructor(options?: { retryAfterMs?: number; limit?: string })
  readonly retryAfterMs?: number
  readonly limit?: string
}
