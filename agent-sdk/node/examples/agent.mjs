// An agent that simulates an LLM call: it streams tokens, checkpoints its progress and
// stops when told to.
//
//     node examples/agent.mjs gpu-3/agent-7 jobs 3
//
// Arguments: member name, queue, capacity. Each job is {"prompt": "...", "tokens": N,
// "token_ms": M}: N tokens of M milliseconds each, a checkpoint after every token. A
// restarted agent (same member name) gets its tasks back at once and resumes from the
// last checkpoint. SIGTERM or Ctrl-C drains: running jobs get the grace period
// (MUSTER_GRACE_MS, default 10000), the rest is released for other agents. A cancelled
// job (`muster cancel ID`) stops at once. The daemon is found as the CLI finds it
// (MUSTER_ADDR, MUSTER_DATA, ...). It prints one line per event, for people and for
// tests: `start ID attempt=A reclaimed=R progress=P`, `done ID`, `cancelled ID`.
import { setTimeout as sleep } from 'node:timers/promises'
import { Worker } from '@muster/sdk'

const [member = 'example/agent-1', queue = 'jobs', capacity = '1'] = process.argv.slice(2)
const WORDS = 'the quick brown fox jumps over the lazy dog'.split(' ')

const worker = new Worker({
  member,
  queues: [queue],
  capacity: Number(capacity),
  graceMs: Number(process.env.MUSTER_GRACE_MS ?? 10_000),
})

await worker.run(async (task) => {
  const { prompt, tokens = 20, token_ms = 100 } = task.payload
  let done = task.progress?.tokens ?? []
  console.log(`start ${task.id} attempt=${task.attempt} reclaimed=${task.reclaimed} progress=${JSON.stringify(task.progress ?? null)}`)
  try {
    for (let n = done.length; n < tokens; n++) {
      await sleep(token_ms, undefined, { signal: task.signal }) // rejects when the task must stop
      done = [...done, WORDS[n % WORDS.length]]
      task.setProgress({ tokens: done })
    }
  } catch (error) {
    // Cancelled, revoked, or the drain's grace is over: the task goes back (or ends
    // cancelled) with its last checkpoint, and no failure is counted.
    console.log(`cancelled ${task.id}`)
    throw error
  }
  console.log(`done ${task.id}`)
  return { prompt, completion: done.join(' '), tokens }
})
