// Agents that wait and stream, through the Worker: a suspension resumed by a person,
// children waited for on one slot, and live output followed to its end across a
// daemon restart.
import assert from 'node:assert/strict'
import { test } from 'node:test'

import { Client, ConnectionLost, Follower, StaleToken, Worker } from '../index.mjs'
import { daemon, eventually } from './harness.mjs'

async function setup(t, queues = ['jobs']) {
  const d = await daemon(t)
  for (const q of queues) assert.equal(d.cli('queue', 'create', q).status, 0)
  const client = await Client.connect(d.connect)
  t.after(() => client.close())
  return { d, client }
}

function worker(t, d, queues, options = {}) {
  const w = new Worker({ member: 'node/waiter', queues, connect: d.connect, ...options })
  t.after(() => w.shutdown())
  return w
}

test('a handler asks a person, frees its slot, and runs again with the answer', async (t) => {
  const { d, client } = await setup(t)
  const tokens = []
  const runs = []
  const w = worker(t, d, ['jobs'])
  const running = w.run(async (task) => {
    runs.push({ attempt: task.attempt, resumed: task.resumed ?? null })
    if (!task.resumed) {
      const asked = await task.suspend('may I merge PR 42?', { timeoutMs: 3_600_000, onTimeout: 'cancel' })
      assert.equal(asked.state, 'suspended')
      assert.ok(asked.timeoutAtMs > Date.now() + 3_500_000)
      assert.equal(task.settled, true)
      tokens.push(asked.resumeToken)
      return 'ignored: the task is suspended'
    }
    return { merged: task.resumed.data.approved === true, by: task.resumed.by }
  }, { signals: false })
  const { id } = await client.enqueue('jobs', { pr: 42 })
  await eventually('suspended', async () => (await client.get(id)).state === 'suspended')
  const info = await client.get(id)
  assert.equal(info.suspension.reason, 'may I merge PR 42?')
  assert.equal(info.suspension.onTimeout, 'cancel')
  assert.equal(info.lease, undefined)
  assert.equal(tokens.length, 1)
  await client.resume(tokens[0], { approved: true })
  await assert.rejects(client.resume(tokens[0], { approved: false }), (e) => e instanceof StaleToken && e.code === 'stale_token')
  const { finished } = await client.wait([id], 10_000)
  assert.equal(finished[0].state, 'done')
  assert.equal(finished[0].result.merged, true)
  assert.equal(finished[0].failures, 0)
  assert.equal(runs.length, 2)
  assert.equal(runs[0].resumed, null)
  assert.deepEqual(runs[1].resumed.data, { approved: true })
  assert.equal(runs[1].resumed.timedOut, false)
  w.shutdown()
  await running
})

test('a planner waits for its children on one slot and sums their results', async (t) => {
  const { d, client } = await setup(t, ['plan', 'count'])
  const w = worker(t, d, ['plan', 'count'], { capacity: 1 })
  const running = w.run(async (task) => {
    if (task.queue === 'count') {
      assert.ok(task.parent)
      return task.payload.length
    }
    if (!task.resumed) {
      const parts = task.payload.map((p, n) => ({ childKey: `part-${n}`, queue: 'count', payload: p }))
      const spawned = await task.spawnAndWait(parts, 'counting the parts', { timeoutMs: 60_000 })
      assert.equal(spawned.children.length, 3)
      assert.ok(spawned.children.every((c) => c.duplicate === false))
      return undefined
    }
    assert.equal(task.children.length, 3)
    return task.children.filter((c) => c.state === 'done').reduce((sum, c) => sum + c.result, 0)
  }, { signals: false })
  const { id } = await client.enqueue('plan', ['ab', 'cde', 'fghi'])
  const { finished } = await client.wait([id], 20_000)
  assert.deepEqual([finished[0].state, finished[0].result], ['done', 9])
  const planner = await client.get(id)
  assert.deepEqual(planner.children.map((c) => [c.childKey, c.state]), [
    ['part-0', 'done'],
    ['part-1', 'done'],
    ['part-2', 'done'],
  ])
  w.shutdown()
  await running
})

test('a follower sees every chunk a handler emits, in order, to the end, across a daemon restart', async (t) => {
  const { d, client } = await setup(t)
  let release
  const gate = new Promise((r) => (release = r))
  const w = worker(t, d, ['jobs'])
  const running = w.run(async (task) => {
    for (let n = 0; n < 200; n++) await task.emit(`line ${n}\n`)
    await task.emitJson({ half: true })
    await task.flushOutput()
    await gate
    for (let n = 200; n < 400; n++) await task.emit(`line ${n}\n`)
    return 'streamed'
  }, { signals: false })
  const { id } = await client.enqueue('jobs', {})
  await eventually('the first half stored', async () => (await client.get(id)).output?.next === 201)
  const follower = new Follower(id, { connect: d.connect })
  const seen = []
  const reading = (async () => {
    for await (const chunk of follower) {
      seen.push(chunk)
      if (seen.length === 201) {
        // The daemon dies under the follower and the agent; both carry on after it is back.
        await d.kill9()
        await d.start()
        release()
      }
    }
  })()
  await reading
  assert.equal(seen.length, 401)
  assert.deepEqual(seen.map((c) => c.n), Array.from({ length: 401 }, (_, n) => n))
  assert.equal(seen[0].text, 'line 0\n')
  assert.deepEqual(seen[200].json, { half: true })
  assert.equal(seen[400].text, 'line 399\n')
  assert.equal(follower.position, 401)
  const again = await Client.connect(d.connect)
  t.after(() => again.close())
  const info = await again.get(id)
  assert.deepEqual([info.state, info.result], ['done', 'streamed'])
  w.shutdown()
  await running
})

test('an aborted signal ends a follow; output stops with a lost lease and says why', async (t) => {
  const { d, client } = await setup(t)
  const { id } = await client.enqueue('jobs', {})
  const controller = new AbortController()
  const follower = new Follower(id, { connect: d.connect, signal: controller.signal })
  const chunks = []
  const reading = (async () => {
    for await (const chunk of follower) chunks.push(chunk)
  })()
  setTimeout(() => controller.abort(), 200)
  await reading
  assert.deepEqual(chunks, [])

  let stopped
  const w = worker(t, d, ['jobs'])
  const running = w.run(async (task) => {
    await task.emit(`before, attempt ${task.attempt}`)
    await task.flushOutput()
    if (task.attempt > 1) return 'second run'
    await eventually('the lease revoked', () => task.isCancelled)
    stopped = await task.emit('after').then(() => task.flushOutput()).catch((e) => e)
    throw stopped
  }, { signals: false })
  await eventually('leased', async () => (await client.get(id)).state === 'leased')
  await eventually('the first chunk stored', async () => (await client.get(id)).output?.next === 1)
  await client.leaseRevoke(id)
  await eventually('the handler saw its output stop', () => stopped !== undefined)
  assert.ok(stopped instanceof ConnectionLost, String(stopped))
  assert.match(stopped.message, /output stopped/)
  // Revoked, the task went back and ran again: its output is each run's first chunk,
  // and never the revoked run's later one.
  const { finished } = await client.wait([id], 10_000)
  assert.deepEqual([finished[0].state, finished[0].result], ['done', 'second run'])
  const output = await client.follow(id, 0, 0)
  assert.deepEqual(output.chunks.map((c) => c.text), ['before, attempt 1', 'before, attempt 2'])
  assert.equal(output.end, true)
  w.shutdown()
  await running
})
