import assert from 'node:assert/strict'
import { test } from 'node:test'

import { Client, InvalidInput, NotFound, ConnectError, MusterError } from '../index.mjs'
import { daemon } from './harness.mjs'

test('enqueue, get and wait against a real daemon', async (t) => {
  const d = await daemon(t)
  const client = await Client.connect(d.connect)
  t.after(() => client.close())
  assert.equal(d.cli('queue', 'create', 'jobs').status, 0)
  const first = await client.enqueue('jobs', { n: 1, text: 'héllo', nested: [1, 2.5, null, true] }, { idempotencyKey: 'k-1', priority: 7 })
  assert.equal(first.duplicate, false)
  assert.equal(first.state, 'ready')
  const again = await client.enqueue('jobs', { other: true }, { idempotencyKey: 'k-1' })
  assert.deepEqual(again, { id: first.id, duplicate: true, state: 'ready' })
  const info = await client.get(first.id)
  assert.equal(info.queue, 'jobs')
  assert.equal(info.priority, 7)
  assert.equal(info.idempotencyKey, 'k-1')
  assert.deepEqual(info.payload, { n: 1, text: 'héllo', nested: [1, 2.5, null, true] })
  const waited = await client.wait([first.id], 50)
  assert.deepEqual(waited.pending, [first.id])
  assert.deepEqual(waited.finished, [])
})

test('errors are typed with their stable codes', async (t) => {
  const d = await daemon(t)
  const client = await Client.connect(d.connect)
  t.after(() => client.close())
  await assert.rejects(client.enqueue('missing', {}), (e) => {
    assert.ok(e instanceof NotFound)
    assert.ok(e instanceof MusterError)
    assert.equal(e.code, 'not_found')
    assert.equal(e.message, 'not_found: no queue "missing"')
    return true
  })
  // An argument of the wrong type is refused before anything is sent, synchronously.
  assert.throws(() => client.wait('not-a-list', 1), (e) => e instanceof InvalidInput && e.code === 'invalid_input')
  await assert.rejects(client.enqueueMany('jobs', []), (e) => e instanceof InvalidInput && e.message === 'enqueue_many: no task to enqueue')
  await assert.rejects(Client.connect({ addr: '127.0.0.1:1', data: d.data }), (e) => e instanceof ConnectError && e.code === 'connect_error')
})
