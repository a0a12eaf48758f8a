// Type-checked (never run) by `npm run typecheck`: the package's declarations (index.d.ts
// over the generated binding.d.ts) as a TypeScript user writes against them. Each
// `@ts-expect-error` line must be an error, so a declaration that grew too loose fails.
import {
  Client,
  DeadLetter,
  Follower,
  MusterError,
  NotFound,
  Retry,
  Throttled,
  Worker,
  type ErrorCode,
  type OutputChunk,
  type Task,
  type TaskInfo,
} from '@muster/sdk'

export async function producer(): Promise<TaskInfo> {
  const client = await Client.connect({ addr: '127.0.0.1:7420', data: '/var/lib/muster' })
  const { id, duplicate } = await client.enqueue('jobs', { prompt: 'hi' }, { idempotencyKey: 'k', priority: 5, delayMs: 10 })
  const many = await client.enqueueMany('jobs', [{ payload: 1 }, { payload: 2, key: 'repo' }])
  const waited = await client.wait([id, ...many.map((t) => t.id)], 1_000, { signal: AbortSignal.timeout(5_000) })
  const pending: string[] = waited.pending
  void pending
  void duplicate
  try {
    return await client.get(id)
  } catch (e) {
    if (e instanceof NotFound) {
      const code: ErrorCode = e.code
      void code
    }
    throw e
  } finally {
    await client.close()
  }
  // @ts-expect-error: enqueue takes a queue name
  await client.enqueue(42, {})
}

export async function agent(): Promise<void> {
  const worker = new Worker({ member: 'ts/agent', queues: ['jobs'], capacity: 2, graceMs: 1_000 })
  await worker.run(async (task: Task) => {
    const signal: AbortSignal = task.signal
    void signal
    if (task.attempt > 3) throw new DeadLetter('too many')
    if (task.isCancelled) throw new Retry('later', { delayMs: 5 })
    if (task.key === 'slow') throw new Throttled({ retryAfterMs: 1_000, limit: 'openai' })
    task.setProgress({ step: 1 })
    await task.emit('working')
    await task.emitJson({ tokens: 3 })
    return { ok: true }
  })
  for await (const task of worker) {
    task.ack()
    // @ts-expect-error: nack takes an error text
    task.nack(3)
  }
}

export async function follow(task: string): Promise<number> {
  let count = 0
  for await (const chunk of new Follower(task, { from: 0 })) {
    const c: OutputChunk = chunk
    count += c.text?.length ?? 0
  }
  return count
}

export function isMuster(e: unknown): e is MusterError {
  return e instanceof MusterError
}
