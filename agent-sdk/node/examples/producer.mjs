// A producer: creates the queue if needed, enqueues jobs (once each, whatever retries
// this script makes: idempotency keys) and waits for their results.
//
//     node examples/producer.mjs jobs 3
//
// Arguments: queue, number of jobs. The daemon is found as the CLI finds it
// (MUSTER_ADDR, MUSTER_DATA, ...). Prints each job's id, then each result.
import { AlreadyExists, Client } from '@muster/sdk'

const [queue = 'jobs', count = '3'] = process.argv.slice(2)
const client = await Client.connect()
try {
  await client.queueCreate(queue, { leaseMs: 30_000, maxAttempts: 5 })
} catch (error) {
  if (!(error instanceof AlreadyExists)) throw error
}
const jobs = Array.from({ length: Number(count) }, (_, n) => ({
  payload: { prompt: `job ${n}`, tokens: 5, token_ms: 20 },
  idempotencyKey: `example-${queue}-${n}`,
}))
const enqueued = await client.enqueueMany(queue, jobs)
for (const task of enqueued) console.log(`enqueued ${task.id}`)
const { finished, pending } = await client.wait(enqueued.map((t) => t.id), 60_000)
for (const task of finished) console.log(`${task.state} ${task.id} ${JSON.stringify(task.result)}`)
await client.close()
process.exitCode = pending.length === 0 ? 0 : 1
