// JSON values both ways: whatever a call sends is what JSON.stringify writes (bytes are
// JSON text), whatever comes back holds numbers as JSON.parse reads them (no BigInt);
// and the refusals that need no daemon round trip: a follower closed while it waits, a
// worker's impossible names.
import assert from 'node:assert/strict'
import { test } from 'node:test'

import { Client, Follower, InvalidInput, Worker } from '../index.mjs'
import { daemon } from './harness.mjs'

const BIG = '{"n":1152921504606846976,"neg":-9007199254740993,"small":7}'

test('values are sent as JSON.stringify writes them and read as JSON.parse reads them', async (t) => {
  const d = await daemon(t)
  assert.equal(d.cli('queue', 'create', 'jobs').status, 0)
  const client = await Client.connect(d.connect)
  t.after(() => client.close())
  const [big] = await client.enqueueMany('jobs', [{ payload: Buffer.from(BIG) }])
  const stored = await client.get(big.id)
  assert.deepEqual(stored.payload, JSON.parse(BIG))
  assert.equal(typeof stored.payload.n, 'number')
  await assert.rejects(client.enqueueMany('jobs', [{ payload: 1 }, { payload: { n: 10n } }]), (e) => e instanceof InvalidInput && /^the payload of task 1 is not JSON-serialisable: /.test(e.message))

  const worker = new Worker({ member: 'node/values', queues: ['jobs'], connect: d.connect })
  t.after(() => worker.shutdown())
  const seen = []
  const running = worker.run(async (task) => {
    seen.push(task.payload)
    task.setProgress({ when: new Date(0) })
    assert.throws(() => task.setProgress({ n: 1n }), (e) => e instanceof InvalidInput && /^progress is not JSON-serialisable: /.test(e.message))
    await task.emitJson({ when: new Date(0), skipped: undefined })
    await task.flushOutput()
    return { at: new Date(0), big: 2 ** 60, nan: NaN, list: [undefined, 1], custom: { toJSON: () => 'mine' } }
  }, { signals: false })
  const { finished } = await client.wait([big.id], 10_000)
  assert.equal(typeof seen[0].n, 'number')
  assert.equal(seen[0].n, 2 ** 60)
  assert.deepEqual(finished[0].result, { at: '1970-01-01T00:00:00.000Z', big: 2 ** 60, nan: null, list: [null, 1], custom: 'mine' })
  assert.equal(typeof finished[0].result.big, 'number')
  const output = await client.follow(big.id, 0, 0)
  assert.deepEqual(output.chunks.map((c) => c.json), [{ when: '1970-01-01T00:00:00.000Z' }])
  worker.shutdown()
  await running
})

test('a follower closed while it waits for chunks ends at once; a worker with impossible names is refused at once', async (t) => {
  const d = await daemon(t)
  assert.equal(d.cli('queue', 'create', 'jobs').status, 0)
  const client = await Client.connect(d.connect)
  t.after(() => client.close())
  const { id } = await client.enqueue('jobs', {})
  const follower = new Follower(id, { connect: d.connect })
  const waiting = follower.next()
  // Past the connect: the follow is waiting on the daemon's long poll.
  await new Promise((r) => setTimeout(r, 300))
  const before = performance.now()
  await follower.close()
  assert.equal(await waiting, null)
  assert.equal(await follower.next(), null)
  const took = performance.now() - before
  assert.ok(took < 2_000, `closing took ${took.toFixed(0)} ms`)

  for (const [options, message] of [
    [{ member: 'node/ok', queues: ['Bad Q'] }, /queue/],
    [{ member: 'node/ok', queues: [] }, /^a worker takes tasks from at least one queue$/],
    [{ member: '', queues: ['jobs'] }, /member/],
  ]) {
    assert.throws(() => new Worker({ ...options, connect: d.connect }), (e) => e instanceof InvalidInput && message.test(e.message), JSON.stringify(options))
  }
})

test('an aborted signal rejects a long wait or follow at once, and the client goes on', async (t) => {
  const d = await daemon(t)
  assert.equal(d.cli('queue', 'create', 'jobs').status, 0)
  const client = await Client.connect(d.connect)
  t.after(() => client.close())
  const { id } = await client.enqueue('jobs', {})
  const controller = new AbortController()
  const before = performance.now()
  setTimeout(() => controller.abort(), 100)
  await assert.rejects(client.wait([id], 30_000, { signal: controller.signal }), (e) => e.name === 'AbortError')
  await assert.rejects(client.follow(id, 0, 30_000, { signal: controller.signal }), (e) => e.name === 'AbortError')
  const took = performance.now() - before
  assert.ok(took < 2_000, `the aborted calls took ${took.toFixed(0)} ms`)
  assert.equal((await client.get(id)).state, 'ready')
  // Without a signal, or with one never aborted, the calls answer as before.
  assert.deepEqual((await client.wait([id], 10, { signal: new AbortController().signal })).pending, [id])
  assert.equal((await client.follow(id, 0, 10)).end, false)
})
