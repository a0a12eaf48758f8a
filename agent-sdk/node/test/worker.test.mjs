// `Worker` in this process against a real daemon: outcomes, `for await`, progress,
// cancellation through `task.signal`, shutdown, a refused session, and a daemon killed
// and restarted under a running handler.
import assert from 'node:assert/strict'
import { test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'

import { Client, DeadLetter, InvalidInput, Replaced, Retry, Throttled, Worker } from '../index.mjs'
import { daemon, eventually, programs } from './harness.mjs'

/** A worker on queue `jobs` running `handler` (signals left alone: the test runner's). */
function start(t, d, handler, options = {}) {
  const worker = stopAfter(t, new Worker({ member: 'node/w1', queues: ['jobs'], ...options, connect: d.connect }))
  return { worker, running: worker.run(handler, { signals: false }) }
}

/** Shuts `worker` down after the test, passed or failed (a running worker keeps Node alive). */
function stopAfter(t, worker) {
  t.after(() => worker.shutdown())
  return worker
}

async function setup(t, queueArgs = []) {
  const d = await daemon(t)
  const created = d.cli('queue', 'create', 'jobs', ...queueArgs)
  assert.equal(created.status, 0, created.stderr)
  const client = await Client.connect(d.connect)
  t.after(() => client.close())
  return { d, client }
}

test('a handler outcome settles its task', async (t) => {
  const { d, client } = await setup(t, ['--max-attempts', '5'])
  const kinds = ['ok', 'none', 'fail', 'retry', 'dead', 'long-error', 'bad-result', 'string']
  const enqueued = await client.enqueueMany('jobs', kinds.map((kind) => ({ payload: { kind } })))
  const ids = Object.fromEntries(kinds.map((k, i) => [k, enqueued[i].id]))
  const { worker, running } = start(t, d, async (task) => {
    const { kind } = task.payload
    if (kind === 'ok') return { echo: task.payload, attempt: task.attempt, queue: task.queue }
    if (kind === 'none') return undefined
    if (kind === 'fail') throw new TypeError('bad input')
    if (kind === 'retry') throw new Retry('upstream busy', { delayMs: 3_600_000 })
    if (kind === 'dead') throw new DeadLetter('schema v1 is gone')
    if (kind === 'long-error') throw new Error('x'.repeat(20_000))
    if (kind === 'bad-result') return { big: 'y'.repeat(2 * 1024 * 1024) }
    return 'plain text'
  }, { capacity: 4 })

  const { finished } = await client.wait([ids.ok, ids.none, ids.dead, ids.string], 20_000)
  const byId = Object.fromEntries(finished.map((f) => [f.id, f]))
  assert.equal(byId[ids.ok].state, 'done')
  assert.deepEqual(byId[ids.ok].result, { echo: { kind: 'ok' }, attempt: 1, queue: 'jobs' })
  assert.equal(byId[ids.none].state, 'done')
  assert.equal(byId[ids.none].result, undefined)
  assert.equal(byId[ids.string].result, 'plain text')
  assert.equal(byId[ids.dead].state, 'dead')
  assert.equal(byId[ids.dead].deadReason, 'dead_lettered')
  assert.equal(byId[ids.dead].lastError, 'schema v1 is gone')

  // Nacked: ready again later (the backoff, or the Retry's hour), one failure each.
  for (const [kind, error] of [
    ['fail', 'TypeError: bad input'],
    ['retry', 'Retry: upstream busy'],
  ]) {
    const info = await eventually(`${kind} nacked`, async () => {
      const info = await client.get(ids[kind])
      return info.failures === 1 ? info : null
    })
    assert.equal(info.lastError, error)
    assert.ok(['scheduled', 'ready', 'leased'].includes(info.state), info.state)
  }
  const retried = await client.get(ids.retry)
  assert.equal(retried.state, 'scheduled')
  assert.ok(retried.notBeforeMs - Date.now() > 3_500_000, 'the Retry delay holds the task back an hour')
  const long = await eventually('long error nacked', async () => {
    const info = await client.get(ids['long-error'])
    return info.failures >= 1 ? info : null
  })
  assert.equal(long.lastError.length, 8192, 'an error is cut to 8 KiB')
  assert.ok(long.lastError.startsWith('Error: xxx'))
  const bad = await eventually('bad result nacked', async () => {
    const info = await client.get(ids['bad-result'])
    return info.failures >= 1 ? info : null
  })
  assert.match(bad.lastError, /^the handler's result could not be sent: InvalidInput: the result is \d+ bytes as JSON, over the limit of 1048576$/)

  worker.shutdown()
  await running
})

test('for await hands tasks over one by one; the loop settles them and leaving it drains the worker', async (t) => {
  const { d, client } = await setup(t)
  const enqueued = await client.enqueueMany('jobs', [1, 2, 3].map((n) => ({ payload: n })))
  const worker = stopAfter(t, new Worker({ member: 'node/iter', queues: ['jobs'], connect: d.connect }))
  const seen = []
  for await (const task of worker) {
    seen.push(task.payload)
    assert.equal(task.payloadJson, String(task.payload))
    assert.equal(task.settled, false)
    task.ack({ n: task.payload })
    assert.equal(task.settled, true)
    task.nack('ignored: settled already')
    if (seen.length === 3) break
  }
  assert.deepEqual(seen.sort(), [1, 2, 3])
  const { finished } = await client.wait(enqueued.map((e) => e.id), 10_000)
  assert.deepEqual(finished.map((f) => [f.state, f.result.n, f.failures]).sort(), [
    ['done', 1, 0],
    ['done', 2, 0],
    ['done', 3, 0],
  ])
  // The break drained it: the iteration is over for good.
  assert.equal(await worker.nextTasks(), null)
  // A worker runs once.
  await assert.rejects(worker.run(async () => {}, { signals: false }), (e) => e instanceof InvalidInput && e.message === 'this worker has run already: make a new one')
})

test('a cancel aborts task.signal within 100 ms and the task ends cancelled without a failure', async (t) => {
  const { d, client } = await setup(t)
  const started = new Map()
  const abortedAt = new Map()
  const { worker, running } = start(t, d, async (task) => {
    started.get(task.payload)?.()
    try {
      await sleep(60_000, undefined, { signal: task.signal })
    } catch (error) {
      abortedAt.set(task.id, performance.now())
      assert.equal(error.name, 'AbortError')
      assert.equal(task.isCancelled, true)
      throw error
    }
  }, { capacity: 3 })
  for (const n of [1, 2, 3]) {
    const began = new Promise((r) => started.set(n, r))
    const { id } = await client.enqueue('jobs', n)
    await began
    const before = performance.now()
    const cancel = await client.cancel(id)
    assert.equal(cancel.cancelRequested, true)
    const { finished } = await client.wait([id], 10_000)
    assert.deepEqual([finished[0].state, finished[0].failures], ['cancelled', 0])
    const delay = abortedAt.get(id) - before
    assert.ok(delay >= 0 && delay < 100, `the handler saw the cancel after ${delay.toFixed(1)} ms`)
  }
  worker.shutdown()
  await running
})

test('a handler that throws Throttled gets its task again later with no failure; a bad throttle fails it saying why', async (t) => {
  const { d, client } = await setup(t)
  await client.limitSet('api', { concurrency: 5 })
  const deliveredAt = []
  const { worker, running } = start(t, d, async (task) => {
    if (task.payload === 'bad') throw new Throttled({ retryAfterMs: 0 })
    deliveredAt.push(performance.now())
    if (task.attempt === 1) throw new Throttled({ retryAfterMs: 400, limit: 'api' })
    return { attempt: task.attempt }
  })
  const { id } = await client.enqueue('jobs', 'good', { limits: [{ limit: 'api' }] })
  const { finished } = await client.wait([id], 10_000)
  assert.deepEqual([finished[0].state, finished[0].result, finished[0].failures, finished[0].deliveries], ['done', { attempt: 2 }, 0, 2])
  assert.ok(deliveredAt[1] - deliveredAt[0] >= 350, `the limit held the task ${(deliveredAt[1] - deliveredAt[0]).toFixed(0)} ms`)
  const bad = await client.enqueue('jobs', 'bad')
  const info = await eventually('the bad throttle nacked', async () => {
    const info = await client.get(bad.id)
    return info.failures === 1 ? info : null
  })
  assert.equal(info.lastError, "the handler's outcome could not be sent: InvalidInput: retryAfterMs is 0, out of range (1 to 31536000000, 365 days)")
  worker.shutdown()
  await running
})

test('progress is renewed with the lease and handed to the next holder', async (t) => {
  const { d, client } = await setup(t)
  const { id } = await client.enqueue('jobs', { steps: 3 })
  let release
  const blocked = new Promise((r) => (release = r))
  const { worker, running } = start(t, d, async (task) => {
    task.setProgress({ step: 2, note: 'half way' })
    assert.deepEqual(task.progress, { step: 2, note: 'half way' })
    assert.throws(() => task.setProgress('z'.repeat(70_000)), (e) => e instanceof InvalidInput && /over the limit of 65536/.test(e.message))
    await blocked
    task.release()
  })
  await eventually('progress stored', async () => {
    const info = await client.get(id)
    return info.progress?.step === 2
  })
  release()
  worker.shutdown()
  await running
  const info = await client.get(id)
  assert.equal(info.state, 'ready')
  assert.equal(info.failures, 0)
  assert.deepEqual(info.progress, { step: 2, note: 'half way' })
})

test('shutdown lets a running handler finish within the grace and releases the rest', async (t) => {
  const { d, client } = await setup(t)
  const enqueued = await client.enqueueMany('jobs', [{ payload: 'quick' }, { payload: 'stuck' }])
  const began = new Map()
  const both = Promise.all(['quick', 'stuck'].map((p) => new Promise((r) => began.set(p, r))))
  const { worker, running } = start(t, d, async (task) => {
    began.get(task.payload)()
    if (task.payload === 'quick') {
      await task.draining()
      return 'finished in the grace period'
    }
    await sleep(600_000, undefined, { signal: task.signal })
  }, { capacity: 2, graceMs: 500 })
  await both
  worker.shutdown()
  await running
  const [quick, stuck] = await Promise.all(enqueued.map((e) => client.get(e.id)))
  assert.deepEqual([quick.state, quick.result], ['done', 'finished in the grace period'])
  assert.deepEqual([stuck.state, stuck.failures], ['ready', 0])
})

test('a second worker under the same member name replaces the first, whose run rejects', async (t) => {
  const { d } = await setup(t)
  const first = stopAfter(t, new Worker({ member: 'node/same', queues: ['jobs'], connect: d.connect }))
  const firstRun = first.run(async () => {}, { signals: false })
  await eventually('first session open', () => d.cli('member', 'describe', 'node/same').status === 0)
  const second = stopAfter(t, new Worker({ member: 'node/same', queues: ['jobs'], connect: d.connect }))
  const secondRun = second.run(async () => {}, { signals: false })
  await assert.rejects(firstRun, (e) => e instanceof Replaced && e.code === 'replaced')
  second.shutdown()
  await secondRun
  assert.throws(() => new Worker({ member: 'node/x', queues: ['jobs'], capacity: 0, connect: d.connect }), (e) => e instanceof InvalidInput && e.message === 'capacity is at least 1')
  // A name the daemon could never accept is refused before anything connects.
  assert.throws(() => new Worker({ member: 'bad name!', queues: ['jobs'], connect: d.connect }), (e) => e instanceof InvalidInput && e.message === 'invalid member name "bad name!": want [A-Za-z0-9._:/@-]{1,128}')
})

test('a daemon killed and restarted under a running handler loses nothing', async (t) => {
  const { d, client } = await setup(t)
  const { id } = await client.enqueue('jobs', 'survive')
  let began
  const running1 = new Promise((r) => (began = r))
  let finish
  const finishing = new Promise((r) => (finish = r))
  const { worker, running } = start(t, d, async (task) => {
    began()
    task.setProgress({ before: 'the crash' })
    await finishing
    return { attempt: task.attempt }
  })
  await running1
  await eventually('checkpoint stored', async () => (await client.get(id)).progress !== undefined)
  await client.close()
  await d.kill9()
  await d.start()
  finish()
  const again = await Client.connect(d.connect)
  t.after(() => again.close())
  const { finished } = await again.wait([id], 30_000)
  assert.equal(finished.length, 1)
  assert.deepEqual([finished[0].state, finished[0].result, finished[0].failures], ['done', { attempt: 1 }, 0])
  worker.shutdown()
  await running
})

test("the SDK's warnings reach stderr: a worker started before its queue says once that it waits, then serves it", async (t) => {
  const d = await daemon(t)
  const start = programs(t)
  const agent = start(
    [
      '--input-type=module',
      '-e',
      `import { Worker } from '@muster/sdk'
       const worker = new Worker({ member: 'node/early', queues: ['later'] })
       await worker.run(async (task) => { console.log('ran ' + task.payload); worker.shutdown() })
       console.log('stopped')`,
    ],
    { ...d.env(), MUSTER_LOG: 'warn' },
  )
  await eventually('the warning', () => agent.stderr.includes('the queue does not exist; waiting for it to be created'))
  assert.match(agent.stderr, /WARN muster_sdk::worker: the queue does not exist; waiting for it to be created queue=later/)
  assert.equal(d.cli('queue', 'create', 'later').status, 0)
  const client = await Client.connect(d.connect)
  t.after(() => client.close())
  await client.enqueue('later', 'now')
  await agent.line((l) => l === 'stopped', 60_000)
  assert.ok(agent.lines.includes('ran now'))
  assert.deepEqual(await agent.wait(30_000), { code: 0, signal: null })
  assert.equal(agent.stderr.split('the queue does not exist').length - 1, 1, 'said once')
})
