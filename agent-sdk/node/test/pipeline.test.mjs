// `enqueue` calls made in one turn of the event loop go out through one `enqueueEach`:
// each is still its own request, sent in call order and answered or refused alone.
import assert from 'node:assert/strict'
import { test } from 'node:test'

import { BadRequest, Client, InvalidInput, NotFound } from '../index.mjs'
import { daemon } from './harness.mjs'

test('concurrent enqueues are each their own request, sent in call order, refused alone', async (t) => {
  const d = await daemon(t)
  assert.equal(d.cli('queue', 'create', 'jobs').status, 0)
  const client = await Client.connect(d.connect)
  t.after(() => client.close())
  const calls = []
  for (let n = 0; n < 3000; n++) {
    if (n === 10) calls.push(client.enqueue('missing', { n }))
    else if (n === 20) calls.push(client.enqueue(42, { n }))
    else if (n === 30) calls.push(client.enqueue('jobs', { n }, { priority: 99 }))
    else calls.push(client.enqueue('jobs', { n }, { idempotencyKey: n === 40 ? 'key-0' : `key-${n}` }))
  }
  const settled = await Promise.allSettled(calls)
  assert.ok(settled[10].reason instanceof NotFound, String(settled[10].reason))
  assert.ok(settled[20].reason instanceof InvalidInput, String(settled[20].reason))
  assert.ok(settled[30].reason instanceof BadRequest || settled[30].reason instanceof InvalidInput, String(settled[30].reason))
  // Key 0 was enqueued by call 0 before call 40 asked for it: the same task.
  assert.deepEqual(settled[40].value, { id: settled[0].value.id, duplicate: true, state: 'ready' })
  const ok = settled.filter((s, n) => s.status === 'fulfilled' && n !== 40)
  assert.equal(ok.length, 3000 - 4)
  assert.equal(new Set(ok.map((s) => s.value.id)).size, ok.length)
  assert.equal((await client.queueDescribe('jobs')).ready, 3000 - 4)
  // Beyond one call's limit, directly: refused before anything is sent.
  await assert.rejects(client.enqueueEach(Array.from({ length: 1025 }, () => ({ queue: 'jobs', payload: 1 }))), (e) => e instanceof InvalidInput && e.message === 'enqueue_each: 1025 calls, over the limit of 1024')
})

test('a payload is sent as JSON.stringify writes it; one that cannot be is refused alone', async (t) => {
  const d = await daemon(t)
  assert.equal(d.cli('queue', 'create', 'jobs').status, 0)
  const client = await Client.connect(d.connect)
  t.after(() => client.close())
  const when = new Date(Date.UTC(2026, 11, 7))
  const [dated, bigint, nothing, fn, plain] = await Promise.allSettled([
    client.enqueue('jobs', { when, skipped: undefined, list: [undefined, 1] }),
    client.enqueue('jobs', { n: 10n }),
    client.enqueue('jobs', undefined),
    client.enqueue('jobs', () => 1),
    client.enqueue('jobs', 'plain'),
  ])
  assert.deepEqual((await client.get(dated.value.id)).payload, { when: '2026-12-07T00:00:00.000Z', list: [null, 1] })
  assert.ok(bigint.reason instanceof InvalidInput && /^the payload is not JSON-serialisable: /.test(bigint.reason.message), String(bigint.reason))
  assert.ok(nothing.reason instanceof InvalidInput && nothing.reason.message === 'the payload is not JSON-serialisable: undefined')
  assert.ok(fn.reason instanceof InvalidInput && fn.reason.message === 'the payload is not JSON-serialisable: function')
  assert.equal((await client.get(plain.value.id)).payload, 'plain')
  // Bytes are JSON text, sent as they are; bytes that are not UTF-8 JSON are refused.
  const [bytes, notJson, notUtf8] = await Promise.allSettled([
    client.enqueue('jobs', Buffer.from('{"z": 1,\n "a": [1.50]}')),
    client.enqueue('jobs', Buffer.from('not json')),
    client.enqueue('jobs', new Uint8Array([0x22, 0xff, 0x22])),
  ])
  assert.deepEqual((await client.get(bytes.value.id)).payload, { z: 1, a: [1.5] })
  assert.ok(notJson.reason instanceof InvalidInput && /^the payload is not one JSON value: /.test(notJson.reason.message), String(notJson.reason))
  assert.ok(notUtf8.reason instanceof InvalidInput && /^the payload is not JSON-serialisable: /.test(notUtf8.reason.message), String(notUtf8.reason))
  // JSON text in hand goes as it is; text that is not one JSON value is refused.
  const outcomes = await client.enqueueEach([
    { queue: 'jobs', payloadJson: '{"b":2,  "a":1}' },
    { queue: 'jobs', payloadJson: '1,"priority":9' },
    { queue: 'jobs', payload: { c: 3 }, payloadJson: '{}' },
    { queue: 'jobs', payload: [1, 2] },
  ])
  assert.deepEqual((await client.get(outcomes[0].task.id)).payload, { b: 2, a: 1 })
  assert.match(outcomes[1].error, /^\[invalid_input\] the payload is not one JSON value: /)
  assert.equal(outcomes[2].error, '[invalid_input] an enqueue holds exactly one of payload and payloadJson')
  assert.deepEqual((await client.get(outcomes[3].task.id)).payload, [1, 2])
  assert.equal((await client.queueDescribe('jobs')).ready, 5)
})
