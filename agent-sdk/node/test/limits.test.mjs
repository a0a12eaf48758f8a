// Flow control through the Client against real daemons: limits (limitSet, limitGet,
// limitList, limitDelete), tasks drawing on them, throttles (throttled) and fair
// dispatch between groups.

import assert from 'node:assert/strict'
import { test } from 'node:test'

import { BadRequest, Client, InvalidInput, LeaseLost, NotFound, TooLarge } from '../index.mjs'
import { daemon } from './harness.mjs'
import { refused } from './refused.mjs'

const HOUR_MS = 3_600_000

async function connected(t) {
  const d = await daemon(t)
  const client = await Client.connect(d.connect)
  t.after(() => client.close())
  return client
}

test('limits are set, read, listed, replaced and deleted', async (t) => {
  const client = await connected(t)
  const openai = await client.limitSet('openai', { rate: { count: 500, perMs: 60_000 }, concurrency: 50 })
  assert.deepEqual(openai, {
    name: 'openai',
    rate: { count: 500, perMs: 60_000 },
    burst: 500,
    concurrency: 50,
    perKey: false,
    held: 0,
    waiting: 0,
    granted: 0,
    throttled: 0,
    // A new limit's bucket starts empty: in use while it fills, full a minute (500
    // tokens at 500 a minute) after its creation.
    keysInUse: 1,
    keys: [{ key: '', tokens: 0, held: 0, waiting: 0, fullMs: openai.createdMs + 60_000 }],
    createdMs: openai.createdMs,
    updatedMs: openai.createdMs,
  })
  const mail = await client.limitSet('mail', { rate: { count: 10, perMs: 1000 }, burst: 25 })
  assert.deepEqual([mail.rate, mail.burst, mail.concurrency, mail.perKey], [{ count: 10, perMs: 1000 }, 25, undefined, false])
  const gpu = await client.limitSet('gpu', { concurrency: 2, perKey: true })
  assert.deepEqual([gpu.rate, gpu.burst, gpu.concurrency, gpu.perKey, gpu.keysInUse, gpu.keys], [undefined, undefined, 2, true, 0, []])
  const slow = await client.limitSet('slow', { rate: { count: 3, perMs: 120_000 } })
  assert.deepEqual([slow.rate, slow.burst], [{ count: 3, perMs: 120_000 }, 3])

  // Read again later: the same, but for when the filling bucket is full, which the
  // daemon gives by the wall clock from its monotonic one (they may have drifted a
  // millisecond apart meanwhile).
  const settled = (info) => {
    const full = info.keys[0].fullMs
    assert.ok(Math.abs(full - (openai.createdMs + 60_000)) <= 1, `${full}`)
    return { ...info, keys: openai.keys }
  }
  assert.deepEqual(settled(await client.limitGet('openai')), openai)
  const listed = await client.limitList()
  assert.deepEqual(listed.map((x) => x.name), ['gpu', 'mail', 'openai', 'slow'])
  assert.deepEqual(settled(listed[2]), openai)

  // Set again: every setting replaced, the creation time kept.
  const replaced = await client.limitSet('openai', { concurrency: 5 })
  assert.deepEqual([replaced.rate, replaced.burst, replaced.concurrency], [undefined, undefined, 5])
  assert.equal(replaced.createdMs, openai.createdMs)
  assert.ok(replaced.updatedMs >= openai.updatedMs)
  assert.deepEqual(await client.limitGet('openai'), replaced)

  assert.equal(await client.limitDelete('mail'), 0)
  await refused(() => client.limitGet('mail'), NotFound, 'not_found', 'not_found: no limit mail')
  await refused(() => client.limitDelete('mail'), NotFound, 'not_found', 'not_found: no limit mail')
  assert.deepEqual((await client.limitList()).map((x) => x.name), ['gpu', 'openai', 'slow'])

  // Refusals: by the daemon, or before anything is sent.
  const daemonRefusals = [
    ['a limit needs a rate, a concurrency, or both', {}],
    ['a limit needs a rate, a concurrency, or both', undefined],
    ['a burst needs a rate', { burst: 5, concurrency: 1 }],
    ['a rate adds 1 to 1000000000 tokens every 1 to 86400000 ms, not 0 every 60000 ms', { rate: { count: 0, perMs: 60_000 } }],
    ['a rate adds 1 to 1000000000 tokens every 1 to 86400000 ms, not 1 every 0 ms', { rate: { count: 1, perMs: 0 } }],
  ]
  for (const [message, spec] of daemonRefusals) {
    await refused(() => client.limitSet('x', spec), BadRequest, 'bad_request', `bad_request: ${message}`)
  }
  await refused(() => client.limitSet('Not A Name', { concurrency: 1 }), BadRequest, 'bad_request', /invalid limit name/)
  await refused(() => client.limitSet('x', { concurrency: 0 }), BadRequest, 'bad_request')
  await refused(() => client.limitSet('x', { rate: '500/min' }), InvalidInput, 'invalid_input')
  await refused(() => client.limitSet('x', { rate: { count: 1 } }), InvalidInput, 'invalid_input', /perMs/)
  await refused(() => client.limitSet('x', { rate: { count: 1, perMs: -1 } }), InvalidInput, 'invalid_input', /integer `-1`, expected u64/)
  await refused(() => client.limitSet('x', { concurrency: -1 }), InvalidInput, 'invalid_input', /integer `-1`, expected u32/)
  assert.deepEqual((await client.limitList()).map((x) => x.name), ['gpu', 'openai', 'slow'])
})

test('a concurrency-one limit leases one task at a time, over every queue', async (t) => {
  const client = await connected(t)
  await client.queueCreate('jobs')
  await client.queueCreate('other')
  await client.limitSet('one', { concurrency: 1 })
  const first = (await client.enqueue('jobs', 1, { limits: [{ limit: 'one' }] })).id
  const [{ id: second }] = await client.enqueueMany('other', [{ payload: 2, limits: [{ limit: 'one', cost: 1 }] }])
  const free = (await client.enqueue('jobs', 3)).id
  assert.deepEqual((await client.get(first)).limits, [{ limit: 'one', cost: 1 }])
  assert.deepEqual((await client.get(second)).limits, [{ limit: 'one', cost: 1 }])
  assert.deepEqual((await client.get(free)).limits, [])

  // One lease at a time over both queues; the task without a limit is not held up.
  const claimed = await client.claim(['jobs', 'other'], { max: 3 })
  assert.deepEqual(claimed.map((x) => x.id).sort(), [first, free].sort())
  const held = claimed.find((x) => x.id === first)
  assert.deepEqual(await client.claim(['jobs', 'other'], { waitMs: 300 }), [])
  assert.equal((await client.queueDescribe('other')).waitingOnLimits, 1)
  assert.equal((await client.queueDescribe('jobs')).waitingOnLimits, 0)
  assert.deepEqual((await client.get(second)).waitingOn, { limit: 'one', key: '' })
  let one = await client.limitGet('one')
  assert.deepEqual([one.held, one.waiting, one.granted, one.throttled, one.keysInUse], [1, 1, 1, 0, 1])
  assert.deepEqual(one.keys, [{ key: '', held: 1, waiting: 1 }])

  // The ack frees the slot: the waiting task goes to a claim waiting for it.
  const waiting = client.claim('other', { waitMs: 20_000 })
  await client.ack(held)
  const [next] = await waiting
  assert.equal(next.id, second)
  assert.equal((await client.queueDescribe('other')).waitingOnLimits, 0)
  one = await client.limitGet('one')
  assert.deepEqual([one.held, one.waiting, one.granted], [1, 0, 2])
  await client.ack(next)
  one = await client.limitGet('one')
  assert.deepEqual([one.held, one.waiting, one.granted, one.keysInUse, one.keys], [0, 0, 2, 0, []])

  // Per key: each key has its own count; a key's second task waits.
  await client.limitSet('per-account', { concurrency: 1, perKey: true })
  const [a1, b1, a2] = (
    await client.enqueueMany('jobs', [
      { payload: 'a1', limits: [{ limit: 'per-account', key: 'a' }] },
      { payload: 'b1', limits: [{ limit: 'per-account', key: 'b' }] },
      { payload: 'a2', limits: [{ limit: 'per-account', key: 'a' }] },
    ])
  ).map((x) => x.id)
  assert.deepEqual((await client.claim('jobs', { max: 3 })).map((x) => x.id), [a1, b1])
  const perAccount = await client.limitGet('per-account')
  assert.deepEqual([perAccount.held, perAccount.waiting, perAccount.keysInUse], [2, 1, 2])
  assert.deepEqual(perAccount.keys, [
    { key: 'a', held: 1, waiting: 1 },
    { key: 'b', held: 1, waiting: 0 },
  ])
  // Deleting the limit frees the tasks that waited on it.
  assert.equal(await client.limitDelete('per-account'), 1)
  const [freed] = await client.claim('jobs', { waitMs: 20_000 })
  assert.equal(freed.id, a2)
})

test('a throttled claim spends no attempt and holds its limit back', async (t) => {
  const client = await connected(t)
  await client.queueCreate('jobs', { maxAttempts: 1 })
  await client.limitSet('api', { concurrency: 10 })
  const task = (await client.enqueue('jobs', 'call', { limits: [{ limit: 'api' }] })).id
  const plain = (await client.enqueue('jobs', 'no limit')).id
  const byId = Object.fromEntries((await client.claim('jobs', { max: 2, member: 'puller' })).map((x) => [x.id, x]))

  const beforeMs = Date.now()
  const settled = await client.throttled(byId[task], { retryAfterMs: HOUR_MS, limit: 'api', error: '429 from upstream' })
  assert.deepEqual(settled, { state: 'ready' })
  const info = await client.get(task)
  assert.deepEqual([info.state, info.failures, info.deliveries, info.lastError], ['ready', 0, 1, undefined])
  assert.deepEqual(info.history.at(-1), { atMs: info.history.at(-1).atMs, event: 'throttled', member: 'puller', epoch: 1, error: '429 from upstream' })
  const api = await client.limitGet('api')
  assert.deepEqual([api.held, api.waiting, api.granted, api.throttled, api.keysInUse], [0, 1, 1, 1, 1])
  const [bucket] = api.keys
  assert.deepEqual([bucket.key, bucket.tokens, bucket.held, bucket.waiting], ['', undefined, 0, 1])
  assert.ok(beforeMs + HOUR_MS <= bucket.throttledUntilMs && bucket.throttledUntilMs <= Date.now() + 1 + HOUR_MS, `${bucket.throttledUntilMs}`)
  assert.equal((await client.queueDescribe('jobs')).waitingOnLimits, 1)
  assert.deepEqual(await client.claim('jobs', { waitMs: 200 }), [])

  // A task that draws on no limit waits itself; a throttle refused leaves the lease as
  // it was.
  await refused(() => client.throttled(byId[plain], { limit: 'api' }), BadRequest, 'bad_request')
  await refused(() => client.throttled(byId[plain], { retryAfterMs: 0 }), BadRequest, 'bad_request')
  await refused(() => client.throttled(byId[plain], { retryAfterMs: -1 }), InvalidInput, 'invalid_input')
  await refused(() => client.throttled(byId[plain], { error: 'e'.repeat(8193) }), TooLarge, 'too_large', 'too_large: error text of 8193 bytes exceeds the limit of 8192')
  const afterMs = Date.now()
  const scheduled = await client.throttled(`${plain}.1`, { retryAfterMs: HOUR_MS })
  assert.equal(scheduled.state, 'scheduled')
  assert.ok(afterMs + HOUR_MS <= scheduled.notBeforeMs && scheduled.notBeforeMs <= Date.now() + 1 + HOUR_MS)
  assert.equal((await client.get(plain)).failures, 0)
  await refused(() => client.throttled(byId[plain]), LeaseLost, 'lease_lost')
})

test('the groups of a fair queue take turns, as often as their weights say', async (t) => {
  const client = await connected(t)
  const even = await client.queueCreate('even', { fair: true })
  assert.deepEqual([even.options.fair, even.options.groupWeights], [true, {}])
  // Group a's backlog is enqueued first; b's tasks still go every other turn.
  const ids = (await client.enqueueMany('even', [0, 1, 2, 3].map((n) => ({ payload: `a${n}`, group: 'a' })))).map((x) => x.id)
  for (const n of [0, 1, 2, 3]) ids.push((await client.enqueue('even', `b${n}`, { group: 'b' })).id)
  assert.equal((await client.get(ids[0])).group, 'a')
  assert.equal((await client.get(ids[4])).group, 'b')
  assert.deepEqual((await client.claim('even', { max: 8 })).map((x) => x.payload), ['a0', 'b0', 'a1', 'b1', 'a2', 'b2', 'a3', 'b3'])

  // Weights: b twice as often as a.
  const weighted = await client.queueCreate('weighted', { fair: true, groupWeights: { b: 2 } })
  assert.deepEqual(weighted.options.groupWeights, { b: 2 })
  await client.enqueueMany('weighted', [
    ...[0, 1, 2, 3].map((n) => ({ payload: `a${n}`, group: 'a' })),
    ...[0, 1, 2, 3, 4, 5].map((n) => ({ payload: `b${n}`, group: 'b' })),
  ])
  assert.deepEqual((await client.claim('weighted', { max: 10 })).map((x) => x.payload), ['a0', 'b0', 'b1', 'a1', 'b2', 'b3', 'a2', 'b4', 'b5', 'a3'])

  // Weights merge; a weight of 1 takes a group's entry out; fair turns off.
  assert.deepEqual((await client.queueUpdate('weighted', { groupWeights: { c: 5 } })).options.groupWeights, { b: 2, c: 5 })
  const cleared = await client.queueUpdate('weighted', { groupWeights: { b: 1 }, fair: false })
  assert.deepEqual([cleared.options.fair, cleared.options.groupWeights], [false, { c: 5 }])
  // Without fair, groups are ignored: enqueue order.
  await client.enqueueMany('weighted', [
    ...[0, 1, 2].map((n) => ({ payload: n, group: 'a' })),
    { payload: 9, group: 'b' },
  ])
  assert.deepEqual((await client.claim('weighted', { max: 4 })).map((x) => x.payload), [0, 1, 2, 9])
})

test('bad flow control input is refused, and nothing of it is stored', async (t) => {
  const client = await connected(t)
  await client.queueCreate('jobs')
  await client.limitSet('one', { concurrency: 1 })
  await client.limitSet('openai', { rate: { count: 500, perMs: 60_000 } })

  await refused(() => client.enqueue('jobs', 1, { limits: [{ limit: 'nope' }] }), NotFound, 'not_found', 'not_found: task 0: no limit nope')
  const daemonRefusals = [
    ['task 0: limit one is named twice', [{ limit: 'one' }, { limit: 'one' }]],
    ['task 0: a cost on limit one is 1 to 1000000 (its burst), not 0', [{ limit: 'one', cost: 0 }]],
    ['task 0: a cost on limit openai is 1 to 500 (its burst), not 501', [{ limit: 'openai', cost: 501 }]],
    ['task 0: 5 limits exceed the limit of 4 per task', Array(5).fill({ limit: 'one' })],
  ]
  for (const [message, limits] of daemonRefusals) {
    await refused(() => client.enqueue('jobs', 1, { limits }), BadRequest, 'bad_request', `bad_request: ${message}`)
  }
  await refused(() => client.enqueue('jobs', 1, { group: '' }), BadRequest, 'bad_request', /invalid group ""/)
  // Refused before anything is sent.
  await refused(() => client.enqueue('jobs', 1, { limits: 'one' }), InvalidInput, 'invalid_input')
  await refused(() => client.enqueue('jobs', 1, { limits: [5] }), InvalidInput, 'invalid_input')
  await refused(() => client.enqueue('jobs', 1, { limits: [{ key: 'k' }] }), InvalidInput, 'invalid_input', /limit/)
  await refused(() => client.enqueue('jobs', 1, { limits: [{ limit: 'one', cost: -1 }] }), InvalidInput, 'invalid_input', /^invalid input: enqueue: invalid request/)

  await refused(() => client.queueCreate('w', { fair: true, groupWeights: { a: 0 } }), BadRequest, 'bad_request', 'bad_request: group "a": weight 0 is outside 1..=1000')
  await refused(() => client.queueUpdate('jobs', { groupWeights: { a: 1001 } }), BadRequest, 'bad_request', /weight 1001 is outside 1\.\.=1000/)
  await refused(() => client.queueUpdate('jobs', { groupWeights: { a: '2' } }), InvalidInput, 'invalid_input')
  await refused(() => client.queueUpdate('jobs', { groupWeights: { a: -2 } }), InvalidInput, 'invalid_input', /integer `-2`, expected u32/)
  // Nothing of the refused requests was stored.
  const jobs = await client.queueDescribe('jobs')
  assert.deepEqual([jobs.ready, jobs.options.fair, jobs.options.groupWeights], [0, false, {}])
  assert.deepEqual((await client.queueList()).map((x) => x.name), ['jobs'])
})
