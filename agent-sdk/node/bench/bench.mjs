// Node SDK throughput next to the Rust SDK's, on one machine, in one run, and the event
// loop's delay while the Node worker drains.
//
//     node bench/bench.mjs --runs 5 --tasks 50000
//
// Needs a release `musterd`, the release Rust baseline (agent-sdk/examples/sdk_baseline.rs,
// shared with the Python SDK's benchmark) and this package built in release mode
// (BENCHMARKS.md has the commands). Each pair of figures is measured on a fresh daemon
// with its own temporary data directory (fsync before every reply), Rust and Node taking
// turns within each run, as agent-sdk/python/bench/bench.py does:
// - enqueue: one client, one task (256 bytes of JSON) per request, 256 requests in flight;
// - enqueue, batched: one client, `enqueueMany` of 1,000 tasks per request, every request
//   sent before the first reply is awaited;
// - drain: one `Worker` of capacity 32 whose handler returns at once (an ack with no
//   result), from the first task to the last ack; in Node with `worker.run(handler)`,
//   measuring the event loop's delay meanwhile (`perf_hooks.monitorEventLoopDelay`, 1 ms
//   resolution: the p50, p99 and max of how late a timer of the loop ran).
// Prints medians, minima and maxima over the runs, and writes every figure to --out.
import { spawnSync } from 'node:child_process'
import { rmSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { parseArgs } from 'node:util'
import { monitorEventLoopDelay } from 'node:perf_hooks'

import { Client, Worker } from '../index.mjs'
import { Daemon, REPO, tempDir } from '../test/harness.mjs'

/** Single-task enqueues in flight (as `muster bench`'s producers and the baseline). */
const WINDOW = 256
/** Tasks the draining worker holds at once (as the baseline). */
const CAPACITY = 32
/** 256 bytes of JSON, as `muster bench` and the baseline send. */
const PAYLOAD = { t: 0, pad: 'x'.repeat(256 - '{"t":0,"pad":""}'.length) }
/** How often a drain looks at the queue's done count, in ms. */
const POLL_MS = 5

const TARGET = process.env.CARGO_TARGET_DIR || join(REPO, 'target')
const { values: options } = parseArgs({
  options: {
    runs: { type: 'string', default: '5' },
    tasks: { type: 'string', default: '50000' },
    bins: { type: 'string', default: join(TARGET, 'release') },
    baseline: { type: 'string', default: join(TARGET, 'release', 'examples', 'sdk_baseline') },
    out: { type: 'string', default: 'nodebench.json' },
  },
})
const runs = Number(options.runs)
const tasks = Number(options.tasks)

async function fresh() {
  const data = tempDir('muster-nodebench-')
  const daemon = await new Daemon(data, [], options.bins).start()
  const client = await Client.connect(daemon.connect)
  await client.queueCreate('bench')
  await client.close()
  return daemon
}

async function finish(daemon) {
  await daemon.stop()
  rmSync(daemon.data, { recursive: true, force: true })
}

function rust(phase, daemon) {
  const run = spawnSync(options.baseline, [phase, daemon.addr, daemon.data, String(tasks)], { encoding: 'utf8', timeout: 600_000 })
  if (run.status !== 0) throw new Error(`sdk_baseline ${phase} failed: ${run.stderr}`)
  return Number(run.stdout.trim())
}

async function nodeEnqueue(daemon) {
  const client = await Client.connect(daemon.connect)
  const lanes = Array.from({ length: WINDOW }, (_, n) => Math.floor(tasks / WINDOW) + (n < tasks % WINDOW ? 1 : 0))
  const started = performance.now()
  await Promise.all(
    lanes.map(async (count) => {
      for (let i = 0; i < count; i++) await client.enqueue('bench', PAYLOAD)
    }),
  )
  const rate = tasks / ((performance.now() - started) / 1000)
  await client.close()
  return rate
}

async function nodeEnqueueBatched(daemon) {
  const client = await Client.connect(daemon.connect)
  const batches = []
  for (let left = tasks; left > 0; left -= 1000) batches.push(Array.from({ length: Math.min(1000, left) }, () => ({ payload: PAYLOAD })))
  const started = performance.now()
  await Promise.all(batches.map((batch) => client.enqueueMany('bench', batch)))
  const rate = tasks / ((performance.now() - started) / 1000)
  await client.close()
  return rate
}

async function nodeDrain(daemon) {
  const monitor = await Client.connect(daemon.connect)
  const worker = new Worker({ member: 'bench/node', queues: ['bench'], capacity: CAPACITY, connect: daemon.connect })
  const delay = monitorEventLoopDelay({ resolution: 1 })
  const started = performance.now()
  delay.enable()
  const running = worker.run(async () => {}, { signals: false })
  let failed = null
  running.catch((e) => (failed = e))
  while ((await monitor.queueDescribe('bench')).done < tasks) {
    if (failed) throw failed
    await new Promise((r) => setTimeout(r, POLL_MS))
  }
  const elapsed = (performance.now() - started) / 1000
  delay.disable()
  worker.shutdown()
  await running
  await monitor.close()
  const ms = (ns) => ns / 1e6
  return {
    rate: tasks / elapsed,
    delayP50: ms(delay.percentile(50)),
    delayP99: ms(delay.percentile(99)),
    delayMax: ms(delay.max),
  }
}

async function oneRun() {
  const figures = {}
  let d = await fresh()
  figures['rust enqueue'] = rust('enqueue', d)
  figures['rust drain'] = rust('drain', d)
  await finish(d)
  d = await fresh()
  figures['node enqueue'] = await nodeEnqueue(d)
  const drain = await nodeDrain(d)
  figures['node drain'] = drain.rate
  figures['node drain: event loop delay p50 (ms)'] = drain.delayP50
  figures['node drain: event loop delay p99 (ms)'] = drain.delayP99
  figures['node drain: event loop delay max (ms)'] = drain.delayMax
  await finish(d)
  d = await fresh()
  figures['rust enqueue batched'] = rust('enqueue-batched', d)
  await finish(d)
  d = await fresh()
  figures['node enqueue batched'] = await nodeEnqueueBatched(d)
  await finish(d)
  return figures
}

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b)
  const m = Math.floor(s.length / 2)
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2
}

const all = []
for (let run = 1; run <= runs; run++) {
  const figures = await oneRun()
  all.push(figures)
  console.log(`run ${run}: ${JSON.stringify(figures)}`)
}
const names = Object.keys(all[0])
for (const name of names) {
  const xs = all.map((f) => f[name])
  console.log(`${name.padEnd(40)} median ${median(xs).toFixed(1).padStart(10)}  min ${Math.min(...xs).toFixed(1).padStart(10)}  max ${Math.max(...xs).toFixed(1).padStart(10)}`)
}
for (const [node, rustName] of [
  ['node enqueue', 'rust enqueue'],
  ['node enqueue batched', 'rust enqueue batched'],
  ['node drain', 'rust drain'],
]) {
  console.log(`${node} ÷ ${rustName}: median of the runs' ratios ${median(all.map((f) => f[node] / f[rustName])).toFixed(2)}`)
}
writeFileSync(options.out, JSON.stringify({ runs: all }, null, 2))
