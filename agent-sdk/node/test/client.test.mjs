import assert from 'node:assert/strict'
import { test } from 'node:test'

import { existsSync, realpathSync, statSync } from 'node:fs'
import { join } from 'node:path'

import {
  AlreadyExists,
  BadRequest,
  Client,
  ConnectError,
  InvalidInput,
  InvalidState,
  LeaseLost,
  LimitExceeded,
  MAX_PAGE,
  MusterError,
  NotFound,
  ServerError,
  StaleToken,
  TooLarge,
} from '../index.mjs'
import { daemon } from './harness.mjs'
import { refused } from './refused.mjs'

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

// ---- every other op of the Client, against real daemons -------------------------------

const HOUR_MS = 3_600_000

test('queues are created, listed, changed, paused, purged and deleted', async (t) => {
  const d = await daemon(t)
  const client = await Client.connect(d.connect)
  t.after(() => client.close())
  const backoff = { baseMs: 500, factor: 3, capMs: 60_000, jitter: 0.1 }
  const q = await client.queueCreate('jobs', {
    leaseMs: 45_000,
    maxAttempts: 3,
    retryBackoff: backoff,
    keyConcurrency: 2,
    retentionMs: HOUR_MS,
    maxRuntimeMs: 600_500,
  })
  assert.equal(q.name, 'jobs')
  assert.deepEqual(q.options, {
    leaseMs: 45_000,
    maxAttempts: 3,
    retryBackoff: backoff,
    keyConcurrency: 2,
    retentionMs: HOUR_MS,
    maxRuntimeMs: 600_500,
    paused: false,
    fair: false,
    groupWeights: {},
  })
  assert.deepEqual(
    [q.scheduled, q.ready, q.leased, q.suspended, q.done, q.dead, q.cancelled, q.heldBack, q.unclaimable, q.waitingOnLimits, q.consumers],
    [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
  )
  assert.deepEqual(q.totals, { enqueued: 0, acked: 0, nacked: 0, lapsed: 0 })
  assert.deepEqual([q.unclaimableRequires, q.unclaimableSets, q.oldestReadyMs], [[], 0, undefined])
  assert.ok(q.createdMs > 0)
  const exists = await refused(() => client.queueCreate('jobs'), AlreadyExists, 'already_exists', 'already_exists: queue "jobs" exists already')
  assert.ok(exists instanceof ServerError)
  await refused(() => client.queueCreate('Not A Name'), BadRequest, 'bad_request', /invalid queue name "Not A Name"/)
  // Defaults, when no option is given.
  const other = await client.queueCreate('other')
  assert.deepEqual(other.options, {
    leaseMs: 30_000,
    maxAttempts: 5,
    retryBackoff: { baseMs: 1000, factor: 2, capMs: 300_000, jitter: 0.2 },
    keyConcurrency: 1,
    retentionMs: 86_400_000,
    paused: false,
    fair: false,
    groupWeights: {},
  })
  assert.deepEqual((await client.queueList()).map((x) => x.name), ['jobs', 'other'])

  // An update changes what it names; a max runtime of 0 removes the bound.
  const updated = await client.queueUpdate('jobs', { maxAttempts: 0, maxRuntimeMs: 0 })
  assert.deepEqual([updated.options.maxAttempts, updated.options.maxRuntimeMs, updated.options.leaseMs], [0, undefined, 45_000])
  assert.equal('maxRuntimeMs' in updated.options, false)
  assert.deepEqual((await client.queueDescribe('jobs')).options, updated.options)

  // Paused: enqueues accepted, nothing handed out.
  assert.equal((await client.queuePause('jobs')).options.paused, true)
  assert.equal((await client.queueDescribe('jobs')).options.paused, true)
  await client.enqueue('jobs', { n: 0 })
  assert.deepEqual(await client.claim('jobs'), [])
  assert.equal((await client.queueResume('jobs')).options.paused, false)
  const [claimed] = await client.claim('jobs')
  assert.deepEqual(claimed.payload, { n: 0 })
  await client.ack(claimed)

  await client.enqueueMany('jobs', [1, 2, 3].map((n) => ({ payload: { n } })))
  await client.enqueue('jobs', { later: true }, { delayMs: HOUR_MS })
  const described = await client.queueDescribe('jobs')
  assert.deepEqual([described.ready, described.scheduled, described.done], [3, 1, 1])
  assert.deepEqual(described.totals, { enqueued: 5, acked: 1, nacked: 0, lapsed: 0 })
  assert.equal(typeof described.oldestReadyMs, 'number')
  // A purge takes the ready and scheduled tasks, not the finished one.
  assert.equal(await client.queuePurge('jobs'), 4)
  assert.deepEqual([(await client.queueDescribe('jobs')).ready, (await client.queueDescribe('jobs')).done], [0, 1])
  await client.enqueue('jobs', 1)
  assert.equal(await client.queueDelete('jobs'), 2)
  await refused(() => client.queueDescribe('jobs'), NotFound, 'not_found', 'not_found: no queue "jobs"')
  for (const call of [
    () => client.queueUpdate('jobs', { paused: true }),
    () => client.queuePause('jobs'),
    () => client.queueResume('jobs'),
    () => client.queuePurge('jobs'),
    () => client.queueDelete('jobs'),
  ]) {
    await refused(call, NotFound, 'not_found', 'not_found: no queue "jobs"')
  }
  // Refused options: by the daemon (a range), or before anything is sent (a type).
  await refused(() => client.queueUpdate('other', { leaseMs: 10 }), BadRequest, 'bad_request', 'bad_request: lease of 10 ms is outside 100..=86400000 ms')
  await refused(() => client.queueUpdate('other', { keyConcurrency: 0 }), BadRequest, 'bad_request')
  await refused(
    () => client.queueUpdate('other', { maxAttempts: -1 }),
    InvalidInput,
    'invalid_input',
    'invalid input: queue_update: invalid request: invalid value: integer `-1`, expected u32',
  )
  await refused(() => client.queueUpdate('other', { retryBackoff: { baseMs: 1 } }), InvalidInput, 'invalid_input', /factor/)
  await refused(() => client.queueUpdate('other', { paused: 'yes' }), InvalidInput, 'invalid_input')
  await refused(() => client.queueDescribe(), InvalidInput, 'invalid_input')
  // No option named: nothing changes.
  assert.deepEqual((await client.queueUpdate('other')).options, other.options)
  assert.deepEqual((await client.queueDescribe('other')).options, other.options)
})

test('queueList reads every page', async (t) => {
  const d = await daemon(t)
  const client = await Client.connect(d.connect)
  t.after(() => client.close())
  // One more queue than a page holds: the listing asks for a second page.
  const names = Array.from({ length: MAX_PAGE + 1 }, (_, i) => `q-${String(i).padStart(4, '0')}`)
  await Promise.all(names.map((name) => client.queueCreate(name)))
  assert.deepEqual((await client.queueList()).map((q) => q.name), names)
})

test('tasks are listed page by page, found by what they hold and updated', async (t) => {
  const d = await daemon(t)
  const client = await Client.connect(d.connect)
  t.after(() => client.close())
  await client.queueCreate('bulk')
  const ids = [
    ...(await client.enqueueMany('bulk', Array.from({ length: 1000 }, (_, n) => ({ payload: n })))),
    ...(await client.enqueueMany('bulk', Array.from({ length: 200 }, (_, n) => ({ payload: 1000 + n })))),
  ].map((x) => x.id)
  const page = await client.list('bulk', 'ready', { limit: 1000 })
  assert.deepEqual(page.tasks.map((x) => x.id), ids.slice(0, 1000))
  assert.equal(page.next, ids[999])
  const rest = await client.list('bulk', 'ready', { after: page.next, limit: 1000 })
  assert.deepEqual(rest.tasks.map((x) => x.id), ids.slice(1000))
  assert.equal(rest.next, undefined)
  const first = await client.list('bulk', 'ready')
  assert.equal(first.tasks.length, 100)
  assert.deepEqual(first.tasks[0], {
    id: ids[0],
    queue: 'bulk',
    state: 'ready',
    priority: 0,
    deliveries: 0,
    failures: 0,
    createdMs: first.tasks[0].createdMs,
    updatedMs: first.tasks[0].updatedMs,
  })
  assert.deepEqual((await client.list('bulk', 'dead')).tasks, [])
  await refused(() => client.list('bulk', 'sleeping'), InvalidInput, 'invalid_input', /unknown variant `sleeping`/)
  await refused(() => client.list('bulk', 'ready', { limit: 1001 }), BadRequest, 'bad_request')
  await refused(() => client.list('nowhere', 'ready'), NotFound, 'not_found')

  // The searches below span every queue: the bulk ones would take more than a step.
  assert.equal(await client.queueDelete('bulk'), 1200)
  await client.queueCreate('jobs', { maxAttempts: 1 })
  await client.queueCreate('other')
  const a = (await client.enqueue('jobs', { order: { sku: 'A-1' } }, { key: 'k1', idempotencyKey: 'order-1' })).id
  const b = (await client.enqueue('jobs', { order: { sku: 'B-2' }, n: 1.0 }, { delayMs: HOUR_MS })).id
  const c = (await client.enqueue('other', { order: { sku: 'A-1' } }, { requires: ['gpu'] })).id
  const found = async (search) => {
    const result = await client.find(search)
    assert.equal(result.next, undefined, 'each search here fits one step')
    return result.tasks.map((x) => x.id)
  }
  // Every filter, alone; queues in name order, ids in enqueue order.
  assert.deepEqual(await found({ queue: 'jobs' }), [a, b])
  assert.deepEqual(await found({ payload: '"A-1"' }), [a, c])
  assert.deepEqual(await found({ payload: '"A-1"', newestFirst: true }), [c, a])
  assert.deepEqual(await found({ field: { path: 'order.sku', value: 'B-2' } }), [b])
  assert.deepEqual(await found({ field: { path: 'n', value: 1 } }), [b])
  assert.deepEqual(await found({ state: 'scheduled' }), [b])
  assert.deepEqual(await found({ key: 'k1' }), [a])
  assert.deepEqual(await found({ idempotencyKey: 'order-1' }), [a])
  assert.deepEqual(await found({ label: 'gpu' }), [c])
  assert.deepEqual(await found({ idPrefix: b.toLowerCase() }), [b])
  assert.deepEqual(await found({ queue: 'jobs', label: 'gpu' }), [])
  // Step by step with a cursor.
  const step = await client.find({ queue: 'jobs', limit: 1 })
  assert.deepEqual(step.tasks.map((x) => x.id), [a])
  assert.deepEqual(step.next, { queue: 'jobs', id: a })
  assert.ok(step.scanned >= 1)
  const second = await client.find({ queue: 'jobs', limit: 1, after: step.next })
  assert.deepEqual(second.tasks.map((x) => x.id), [b])
  await refused(() => client.find({ queue: 'nowhere' }), NotFound, 'not_found')
  await refused(() => client.find({ limit: 0 }), BadRequest, 'bad_request')
  await refused(() => client.find({ state: 'sleeping' }), InvalidInput, 'invalid_input', /unknown variant `sleeping`/)
  await refused(() => client.find({ after: { queue: 'jobs' } }), InvalidInput, 'invalid_input', /id/)

  // A summary carries the progress checkpoint as text, cut to 256 bytes.
  const [claim] = await client.claim('jobs', { member: 'cli-9' })
  assert.equal(claim.id, a)
  await client.renew(claim, { progress: { page: 7 } })
  assert.equal((await client.find({ idPrefix: a })).tasks[0].progress, '{"page":7}')
  await client.renew(claim, { progress: { text: 'x'.repeat(300) } })
  const cut = (await client.find({ idPrefix: a })).tasks[0].progress
  assert.ok(cut.endsWith('…'), cut)
  assert.ok(Buffer.byteLength(cut) <= 256 + Buffer.byteLength('…'))
  assert.equal('progress' in (await client.find({ idPrefix: b })).tasks[0], false)
  await client.nack(claim, { error: 'upstream Timed Out' })
  assert.deepEqual(await found({ error: 'timed out', state: 'dead' }), [a])

  // update: a priority and run now; only waiting tasks change.
  const changed = await client.update(b, { priority: 8, runNow: true })
  assert.deepEqual([changed.id, changed.state, changed.priority, changed.notBeforeMs], [b, 'ready', 8, undefined])
  assert.deepEqual((await client.get(b)).history.slice(-2).map((e) => e.event), ['priority_changed', 'run_now'])
  await refused(() => client.update(b, {}), BadRequest, 'bad_request', 'bad_request: name a change: priority, run_now or both')
  await refused(() => client.update(b), BadRequest, 'bad_request', 'bad_request: name a change: priority, run_now or both')
  await refused(() => client.update(b, { priority: 10 }), BadRequest, 'bad_request')
  await refused(() => client.update(b, { priority: -1 }), InvalidInput, 'invalid_input', /integer `-1`, expected u8/)
  await refused(() => client.update(a, { priority: 1 }), InvalidState, 'invalid_state')
  await refused(() => client.update('01JHMPFNMW1HEAD8X4A1JH69RE', { runNow: true }), NotFound, 'not_found')
})

test('claims are renewed and settled by epoch', async (t) => {
  const d = await daemon(t)
  const client = await Client.connect(d.connect)
  t.after(() => client.close())
  await client.queueCreate('jobs', { maxAttempts: 5 })
  const ids = (await client.enqueueMany('jobs', [0, 1, 2, 3, 4].map((n) => ({ payload: { n } })))).map((x) => x.id)
  const claims = await client.claim('jobs', { max: 5, waitMs: 1000, leaseMs: 30_000, member: 'node-1' })
  assert.deepEqual(claims.map((x) => x.id), ids)
  const [first] = claims
  assert.deepEqual(first, {
    id: ids[0],
    epoch: 1,
    queue: 'jobs',
    payload: { n: 0 },
    attempt: 1,
    failures: 0,
    priority: 0,
    leaseExpiresMs: first.leaseExpiresMs,
    leaseMs: 30_000,
    reclaimed: false,
    output: 0,
  })
  assert.ok(first.leaseExpiresMs > Date.now())

  const renewed = await client.renew(first, { extendMs: 60_000, progress: { page: 7 } })
  assert.deepEqual([renewed.leaseMs, renewed.cancelRequested], [60_000, false])
  assert.ok(renewed.leaseExpiresMs >= first.leaseExpiresMs)
  assert.deepEqual((await client.get(first.id)).progress, { page: 7 })
  // A null checkpoint is none: the stored one is kept.
  await client.renew(first, { progress: null })
  assert.deepEqual((await client.get(first.id)).progress, { page: 7 })

  assert.deepEqual(await client.ack(first, { pages: 12 }), { state: 'done' })
  assert.deepEqual((await client.get(first.id)).result, { pages: 12 })
  await refused(() => client.ack(first), LeaseLost, 'lease_lost')
  await refused(() => client.renew(first), LeaseLost, 'lease_lost')

  // A claim string ID.EPOCH names a lease too, as a { id, epoch } does.
  const nacked = await client.nack(`${claims[1].id}.1`, { delayMs: HOUR_MS, error: 'upstream timed out' })
  assert.equal(nacked.state, 'scheduled')
  assert.ok(nacked.notBeforeMs >= Date.now() + HOUR_MS - 60_000)
  const info = await client.get(claims[1].id)
  assert.deepEqual([info.lastError, info.failures, info.notBeforeMs], ['upstream timed out', 1, nacked.notBeforeMs])
  assert.deepEqual(await client.release({ id: claims[2].id, epoch: 1 }), { state: 'ready' })
  assert.deepEqual(await client.deadLetter(claims[3], 'schema v1'), { state: 'dead' })
  const dead = await client.get(claims[3].id)
  assert.deepEqual([dead.deadReason, dead.lastError, dead.failures], ['dead_lettered', 'schema v1', 0])
  assert.deepEqual(await client.nack(claims[4], { delayMs: 0 }), { state: 'ready' })
  assert.equal((await client.get(claims[4].id)).lastError, 'nacked')

  const again = await client.claim(['jobs'], { max: 10 })
  assert.deepEqual(again.map((x) => x.id).sort(), [claims[2].id, claims[4].id].sort())
  assert.ok(again.every((x) => x.epoch === 2 && x.attempt === 2))
  assert.deepEqual(again.map((x) => x.failures).sort(), [0, 1])
  await refused(() => client.renew(claims[2]), LeaseLost, 'lease_lost')
  assert.deepEqual(await client.claim('jobs', { waitMs: 100 }), [])

  // Refusals.
  await refused(() => client.ack('not-a-claim'), InvalidInput, 'invalid_input', '"not-a-claim" is not a claim string ID.EPOCH')
  await refused(() => client.ack(`${first.id}.`), InvalidInput, 'invalid_input', /is not a claim string/)
  await refused(() => client.ack(`${first.id}.-1`), InvalidInput, 'invalid_input', /is not a claim string/)
  await refused(() => client.ack(5), InvalidInput, 'invalid_input')
  await refused(() => client.ack({ id: first.id }), InvalidInput, 'invalid_input')
  await refused(() => client.ack({ id: first.id, epoch: -1 }), InvalidInput, 'invalid_input', /integer `-1`, expected u64/)
  await refused(() => client.ack({ id: 'nope', epoch: 1 }), BadRequest, 'bad_request')
  await refused(() => client.ack({ id: '01JHMPFNMW1HEAD8X4A1JH69RE', epoch: 1 }), NotFound, 'not_found')
  await refused(() => client.claim('nowhere'), NotFound, 'not_found', 'not_found: no queue "nowhere"')
  await refused(() => client.claim([]), BadRequest, 'bad_request')
  await refused(() => client.claim('jobs', { max: 0 }), BadRequest, 'bad_request')
  await refused(() => client.claim('jobs', { waitMs: 300_001 }), BadRequest, 'bad_request')
  await refused(() => client.claim('jobs', { labels: ['not a label'] }), BadRequest, 'bad_request')
  await refused(() => client.claim(5), InvalidInput, 'invalid_input')
  await refused(() => client.renew(again[0], { extendMs: 50 }), BadRequest, 'bad_request')
  await refused(() => client.nack(again[0], { delayMs: -1 }), InvalidInput, 'invalid_input', /integer `-1`, expected u64/)
  await refused(() => client.nack(again[0], { error: 'e'.repeat(8193) }), TooLarge, 'too_large')
  await refused(() => client.ack(again[0], 'x'.repeat(1 << 20)), TooLarge, 'too_large')
  // The refusals left the leases as they were.
  for (const claim of again) assert.deepEqual(await client.ack(claim), { state: 'done' })

  // Calls made without awaiting each other are pipelined on the connection.
  const many = await Promise.all(Array.from({ length: 100 }, (_, n) => client.enqueue('jobs', n)))
  assert.equal(new Set(many.map((x) => x.id)).size, 100)
})

test('wait, cancel, redrive and discard', async (t) => {
  const d = await daemon(t)
  const client = await Client.connect(d.connect)
  t.after(() => client.close())
  await client.queueCreate('jobs', { maxAttempts: 1 })
  const [a, b, c, e] = (await client.enqueueMany('jobs', ['a', 'b', 'c', 'd'].map((payload) => ({ payload })))).map((x) => x.id)
  assert.deepEqual(await client.wait([a, b], 0), { finished: [], omitted: [], pending: [a, b], removed: [] })

  assert.deepEqual(await client.cancel(a), { state: 'cancelled', cancelRequested: false })
  assert.deepEqual(await client.cancel(a), { state: 'cancelled', cancelRequested: false })
  const [held] = await client.claim('jobs')
  assert.equal(held.id, b)
  assert.deepEqual(await client.cancel(b), { state: 'leased', cancelRequested: true })
  assert.equal((await client.renew(held)).cancelRequested, true)
  assert.equal((await client.get(b)).cancelRequested, true)

  // A wait for the cancel-requested task ends with its holder's settle.
  let answered = false
  const waiting = client.wait([b], 20_000).then((reply) => {
    answered = true
    return reply
  })
  assert.equal((await client.get(b)).state, 'leased')
  assert.equal(answered, false)
  assert.deepEqual(await client.release(held), { state: 'cancelled' })
  const { finished } = await waiting
  assert.deepEqual(finished.map((x) => [x.id, x.state]), [[b, 'cancelled']])

  for (const claim of await client.claim('jobs', { max: 2 })) {
    assert.deepEqual(await client.nack(claim, { error: 'broken' }), { state: 'dead' })
  }
  const deadOnes = await client.wait([c, e], 1000)
  assert.deepEqual(deadOnes.finished.map((x) => [x.id, x.state, x.deadReason, x.lastError]), [
    [c, 'dead', 'max_attempts', 'broken'],
    [e, 'dead', 'max_attempts', 'broken'],
  ])
  await refused(() => client.cancel(c), InvalidState, 'invalid_state')
  await refused(() => client.cancel('01JHMPFNMW1HEAD8X4A1JH69RE'), NotFound, 'not_found')
  await refused(() => client.wait(['01JHMPFNMW1HEAD8X4A1JH69RE'], 0), NotFound, 'not_found')
  await refused(() => client.wait([a], 300_001), BadRequest, 'bad_request')

  const dry = await client.redrive('jobs', { all: true, dryRun: true })
  assert.deepEqual([dry.count, dry.ids], [2, [c, e].sort()])
  assert.equal((await client.get(c)).state, 'dead')
  assert.deepEqual(await client.redrive('jobs', { ids: [c] }), { count: 1, ids: [] })
  const redriven = await client.get(c)
  assert.deepEqual([redriven.state, redriven.failures, redriven.deadReason, redriven.lastError], ['ready', 0, undefined, 'broken'])
  // The selection is checked whole: one task that is not dead changes nothing.
  await refused(() => client.redrive('jobs', { ids: [c, e] }), InvalidState, 'invalid_state', `invalid_state: task ${c} is ready, not dead`)
  await refused(() => client.discard('jobs', { ids: [e, '01JHMPFNMW1HEAD8X4A1JH69RE'] }), NotFound, 'not_found')
  assert.equal((await client.get(e)).state, 'dead')
  await refused(() => client.redrive('jobs', {}), BadRequest, 'bad_request', 'bad_request: name 1 to 1000 task ids, or all')
  await refused(() => client.discard('jobs'), BadRequest, 'bad_request', 'bad_request: name 1 to 1000 task ids, or all')
  await refused(() => client.discard('nowhere', { all: true }), NotFound, 'not_found')
  await refused(() => client.redrive('jobs', { ids: 'all' }), InvalidInput, 'invalid_input')
  assert.deepEqual(await client.discard('jobs', { ids: [e], dryRun: true }), { count: 1, ids: [e] })
  assert.deepEqual(await client.discard('jobs', { all: true }), { count: 1, ids: [] })
  await refused(() => client.get(e), NotFound, 'not_found')
  // A task removed while waited for counts as finished. A wait may travel apart from
  // the requests sent after it, so the purge may come first (the wait is then refused,
  // its task unknown): each try is with a fresh task.
  let removed
  for (let attempt = 0; attempt < 5 && removed === undefined; attempt++) {
    const task = attempt === 0 ? c : (await client.enqueue('jobs', attempt)).id
    const waiting = client.wait([task], 20_000).then(
      (reply) => ({ reply }),
      (error) => ({ error }),
    )
    assert.equal((await client.get(task)).state, 'ready')
    assert.equal(await client.queuePurge('jobs'), 1)
    const { reply, error } = await waiting
    if (error) {
      assert.ok(error instanceof NotFound, `${error.name}: ${error.message}`)
      continue
    }
    assert.deepEqual(reply, { finished: [], omitted: [], pending: [], removed: [task] })
    removed = task
  }
  assert.ok(removed !== undefined, 'a wait saw its task removed')
  await refused(() => client.wait([removed], 0), NotFound, 'not_found', `not_found: no task ${removed}`)
})

test('members are listed, described, drained and released; leases revoked; stats and snapshots', async (t) => {
  const d = await daemon(t)
  const client = await Client.connect(d.connect)
  t.after(() => client.close())
  await client.queueCreate('jobs')
  const [a, b] = (await client.enqueueMany('jobs', [{ payload: 1 }, { payload: 2 }])).map((x) => x.id)
  assert.deepEqual(await client.memberList(), [])
  await client.claim('jobs', { max: 2, member: 'cli-7' })
  const member = {
    name: 'cli-7',
    labels: [],
    capacity: 0,
    leased: 2,
    connected: false,
    state: 'gone',
    livenessMs: 0,
    draining: false,
    subscribed: [],
  }
  assert.deepEqual(await client.memberList(), [member])
  const described = await client.memberDescribe('cli-7')
  assert.deepEqual(described.member, member)
  assert.equal(described.leasesTotal, 2)
  assert.deepEqual(described.leases.map((x) => [x.id, x.state, x.lease.member, x.lease.epoch]), [
    [a, 'leased', 'cli-7', 1],
    [b, 'leased', 'cli-7', 1],
  ])

  assert.deepEqual(await client.leaseRevoke(a), { state: 'ready' })
  const revoked = await client.get(a)
  assert.equal(revoked.failures, 1)
  assert.equal(revoked.lastError, 'lease revoked by an operator (member "cli-7", epoch 1)')
  assert.deepEqual(revoked.history.slice(-1).map((x) => [x.event, x.member, x.epoch]), [['revoked', 'cli-7', 1]])
  await refused(() => client.leaseRevoke(a), InvalidState, 'invalid_state')
  await refused(() => client.leaseRevoke('01JHMPFNMW1HEAD8X4A1JH69RE'), NotFound, 'not_found')

  // A drained member gets nothing from a claim naming it, until undrained.
  assert.deepEqual(await client.memberDrain('cli-7'), { ...member, leased: 1, draining: true })
  assert.deepEqual(await client.claim('jobs', { member: 'cli-7' }), [])
  assert.deepEqual(await client.memberUndrain('cli-7'), { ...member, leased: 1 })
  const [held] = await client.claim('jobs', { member: 'cli-7' })
  assert.equal(held.id, a)
  for (const call of [client.memberDescribe, client.memberDrain, client.memberUndrain]) {
    await refused(() => call.call(client, 'nobody'), NotFound, 'not_found')
  }
  // member_release refuses a member with leases, and a name bound to no token (as
  // every name is without tokens).
  await refused(() => client.memberRelease('cli-7'), InvalidState, 'invalid_state', /holds 2 leases/)
  await client.ack(held)
  await client.ack({ id: b, epoch: 1 })
  await refused(() => client.memberRelease('cli-7'), NotFound, 'not_found', /bound to no principal/)

  const stats = await client.serverStats()
  assert.ok(stats.syncs > 0 && stats.syncedRequests >= stats.syncs, JSON.stringify(stats))
  assert.deepEqual([stats.durability, stats.diskAlarm, stats.membersConnected], ['sync', false, 0])
  assert.ok(stats.uptimeMs >= 0 && stats.fsyncTotalUs >= stats.fsyncLastUs)

  // A snapshot of the store, on the daemon's host, in its snapshot root (by default
  // `backups` in its data directory); nowhere else.
  const root = join(realpathSync(d.data), 'backups')
  const copy = await client.adminSnapshot('snapshot')
  assert.deepEqual(copy, { dir: join(root, 'snapshot'), tasks: 2, queues: 1 })
  assert.ok(statSync(copy.dir).isDirectory())
  await refused(() => client.adminSnapshot(copy.dir), AlreadyExists, 'already_exists')
  const elsewhere = join(d.data, 'elsewhere')
  await refused(() => client.adminSnapshot(elsewhere), BadRequest, 'bad_request', /not inside the snapshot root/)
  assert.equal(existsSync(elsewhere), false)
  await refused(() => client.adminSnapshot('../up'), BadRequest, 'bad_request')
})

test('a pulled task is suspended and resumed by its token or by its id', async (t) => {
  const d = await daemon(t)
  const client = await Client.connect(d.connect)
  t.after(() => client.close())
  await client.queueCreate('jobs')
  const [late, kept] = (await client.enqueueMany('jobs', [{ payload: 'late' }, { payload: 'kept' }])).map((x) => x.id)
  const [first, second] = await client.claim('jobs', { max: 2, member: 'puller' })
  const suspended = await client.suspend(first, 'waiting for the export', { timeoutMs: 300 })
  assert.equal(suspended.state, 'suspended')
  assert.match(suspended.resumeToken, new RegExp(`^${late}\\.1\\.[0-9a-f]{32}$`))
  const asked = await client.suspend(second, 'waiting for a person')
  const info = await client.get(kept)
  assert.deepEqual(info.suspension, {
    reason: 'waiting for a person',
    member: 'puller',
    epoch: 1,
    sinceMs: info.suspension.sinceMs,
    timeoutAtMs: asked.timeoutAtMs,
    onTimeout: 'fail',
    children: false,
  })
  assert.equal(asked.timeoutAtMs - info.suspension.sinceMs, 7 * 24 * HOUR_MS)
  assert.deepEqual([info.state, info.failures, info.deliveries, info.lease], ['suspended', 0, 1, undefined])
  // Its lease ended with the suspend.
  await refused(() => client.ack(second), LeaseLost, 'lease_lost')

  // The timeout fails the task: dead, redrivable, no failure counted.
  const [dead] = (await client.wait([late], 20_000)).finished
  assert.deepEqual([dead.state, dead.deadReason, dead.failures], ['dead', 'suspend_timed_out', 0])
  const waited = /^suspension timed out after (\d+) ms$/.exec(dead.lastError)
  assert.ok(waited && Number(waited[1]) >= 300, dead.lastError)
  await refused(() => client.resume(suspended.resumeToken), StaleToken, 'stale_token')
  assert.equal((await client.queueDescribe('jobs')).suspended, 1)

  // By id: an approver's (or admin's) way; only a suspended task resumes.
  assert.deepEqual(await client.resumeTask(kept, [1, 2]), { task: kept, state: 'ready' })
  await refused(() => client.resumeTask(kept), InvalidState, 'invalid_state')
  await refused(() => client.resume(asked.resumeToken), StaleToken, 'stale_token')
  const [again] = await client.claim('jobs', { member: 'puller' })
  assert.equal(again.id, kept)
  // Resumed by the local token (this daemon has no others).
  assert.deepEqual(again.resumed, { data: [1, 2], by: 'local', atMs: again.resumed.atMs, timedOut: false, children: [] })

  // By its token, once.
  const third = await client.suspend(again, 'may I merge?', { timeoutMs: HOUR_MS, onTimeout: 'cancel' })
  assert.equal((await client.get(kept)).suspension.onTimeout, 'cancel')
  // A token with another secret is not this suspension's.
  const forged = third.resumeToken.replace(/[0-9a-f]{32}$/, '0'.repeat(32))
  await refused(() => client.resume(forged), StaleToken, 'stale_token')
  assert.deepEqual(await client.resume(third.resumeToken, { approved: true }), { task: kept, state: 'ready' })
  await refused(() => client.resume(third.resumeToken), StaleToken, 'stale_token')
  const [answered] = await client.claim('jobs', { member: 'puller' })
  assert.deepEqual([answered.epoch, answered.resumed.data, answered.resumed.timedOut], [3, { approved: true }, false])
  assert.deepEqual((await client.get(kept)).history.map((x) => x.event), [
    'enqueued', 'leased', 'suspended', 'resumed', 'leased', 'suspended', 'resumed', 'leased',
  ])

  // Refusals leave the lease held.
  await refused(() => client.suspend(answered, ' '), BadRequest, 'bad_request')
  await refused(() => client.suspend(answered, 'x'.repeat(1025)), TooLarge, 'too_large')
  await refused(() => client.suspend(answered, 'x', { onTimeout: 'later' }), InvalidInput, 'invalid_input', 'onTimeout "later" is not resume, fail or cancel')
  await refused(() => client.suspend(answered, 'x', { timeoutMs: 0 }), BadRequest, 'bad_request')
  await refused(() => client.suspend(answered, 'x', { timeoutMs: -1 }), InvalidInput, 'invalid_input')
  await refused(() => client.suspend({ id: kept, epoch: 2 }, 'x'), LeaseLost, 'lease_lost')
  await refused(() => client.resume('not a token'), BadRequest, 'bad_request')
  await refused(() => client.resume(third.resumeToken, 'x'.repeat(65_537)), TooLarge, 'too_large')
  // A cancel asked of the holder ends its suspend as cancelled, with no token.
  assert.deepEqual(await client.cancel(kept), { state: 'leased', cancelRequested: true })
  assert.deepEqual(await client.suspend(answered, 'too late'), { state: 'cancelled' })
  assert.equal((await client.get(kept)).state, 'cancelled')
})

test('a pulled parent spawns children and its next claim sees their outcomes', async (t) => {
  const d = await daemon(t)
  const client = await Client.connect(d.connect)
  t.after(() => client.close())
  await client.queueCreate('plan')
  await client.queueCreate('count')
  const plan = (await client.enqueue('plan', 'two parts')).id
  const [claim] = await client.claim('plan', { member: 'puller' })
  assert.equal(claim.parent, undefined)
  await refused(
    () => client.spawn(claim, [{ childKey: 'x', queue: 'count', payload: 0 }], { reason: 'no wait' }),
    InvalidInput,
    'invalid_input',
    'reason, timeoutMs and onTimeout are a wait\'s: give them with wait: true',
  )
  const spawned = await client.spawn(
    claim,
    [
      { childKey: 'good', queue: 'count', payload: 1 },
      { childKey: 'bad', queue: 'count', payload: 2, options: { priority: 3 } },
    ],
    { wait: true },
  )
  assert.equal(spawned.state, 'suspended')
  assert.match(spawned.resumeToken, new RegExp(`^${plan}\\.1\\.`))
  assert.equal(typeof spawned.timeoutAtMs, 'number')
  assert.deepEqual(spawned.children.map((x) => [x.childKey, x.duplicate, x.state]), [
    ['good', false, 'ready'],
    ['bad', false, 'ready'],
  ])
  const [good, bad] = spawned.children.map((x) => x.id)
  const waiting = await client.get(plan)
  assert.deepEqual([waiting.state, waiting.suspension.reason, waiting.suspension.children], ['suspended', 'waiting for its children', true])
  assert.deepEqual(waiting.children, [
    { id: good, childKey: 'good', queue: 'count', state: 'ready', children: 0 },
    { id: bad, childKey: 'bad', queue: 'count', state: 'ready', children: 0 },
  ])
  const child = await client.get(bad)
  assert.deepEqual([child.parent, child.childKey, child.priority], [plan, 'bad', 3])

  const [one, two] = await client.claim('count', { max: 2, member: 'puller' })
  // Priority first: the child of priority 3 goes first.
  assert.deepEqual([[one.id, one.parent], [two.id, two.parent]], [[bad, plan], [good, plan]])
  await client.ack(two, { counted: 1 })
  await client.deadLetter(one, 'no such part')
  const [again] = await client.claim('plan', { member: 'puller', waitMs: 20_000 })
  assert.deepEqual([again.id, again.parent, again.epoch], [plan, undefined, 2])
  assert.deepEqual(again.resumed.children, [
    { id: good, childKey: 'good', queue: 'count', state: 'done', result: { counted: 1 }, omitted: false },
    { id: bad, childKey: 'bad', queue: 'count', state: 'dead', error: 'no such part', omitted: false },
  ])
  // A key spawned before: the same child again, nothing enqueued.
  const seen = await client.spawn(`${again.id}.${again.epoch}`, [{ childKey: 'good', queue: 'count', payload: 1 }])
  assert.deepEqual(seen, { children: [{ childKey: 'good', id: good, duplicate: true, state: 'done' }], state: 'leased' })
  assert.equal((await client.queueDescribe('count')).totals.enqueued, 2)
  // A wait for children that have all finished: ready at once, with no token.
  assert.deepEqual(await client.spawn(again, [], { wait: true }), { children: [], state: 'ready' })
  await refused(() => client.ack(again), LeaseLost, 'lease_lost')
  const [last] = await client.claim('plan', { member: 'puller' })
  assert.deepEqual([last.id, last.epoch, last.resumed.children.map((x) => x.state)], [plan, 3, ['done', 'dead']])
  assert.deepEqual(await client.ack(last, 'partly counted'), { state: 'done' })

  // A refused spawn stores nothing and leaves the task leased.
  const other = (await client.enqueue('plan', 'pulled')).id
  const [pulled] = await client.claim('plan', { member: 'puller' })
  assert.equal(pulled.id, other)
  await refused(() => client.spawn(pulled, [{ childKey: 'x', queue: 'nowhere', payload: 1 }], { wait: true }), NotFound, 'not_found', 'not_found: no queue "nowhere"')
  await refused(() => client.spawn(pulled, []), BadRequest, 'bad_request', 'bad_request: a spawn names children, or waits for them, or both')
  await refused(
    () => client.spawn(pulled, [{ childKey: '', queue: 'count', payload: 1 }]),
    BadRequest,
    'bad_request',
    'bad_request: child 0: invalid child key "": want 1 to 128 bytes without control characters',
  )
  await refused(
    () => client.spawn(pulled, [{ childKey: 'twice', queue: 'count', payload: 1 }, { childKey: 'twice', queue: 'count', payload: 2 }]),
    BadRequest,
    'bad_request',
    'bad_request: child 1: child key "twice" is given twice',
  )
  await refused(() => client.spawn(pulled, [], { wait: true, onTimeout: 'later' }), InvalidInput, 'invalid_input', 'onTimeout "later" is not resume, fail or cancel')
  await refused(() => client.spawn(pulled, [{ childKey: 'x', queue: 'count', payload: 1, options: { priority: -1 } }]), InvalidInput, 'invalid_input')
  await refused(() => client.spawn(pulled, ['not a child']), InvalidInput, 'invalid_input')
  await refused(() => client.spawn({ id: other, epoch: 9 }, [{ childKey: 'x', queue: 'count', payload: 1 }]), LeaseLost, 'lease_lost')
  const untouched = await client.get(other)
  assert.deepEqual([untouched.state, untouched.children, untouched.suspension], ['leased', [], undefined])
  assert.equal((await client.queueDescribe('count')).totals.enqueued, 2)

  // Cancelling a waiting parent cancels its unfinished children.
  const fanned = await client.spawn(
    pulled,
    [0, 1, 2].map((n) => ({ childKey: `part-${n}`, queue: 'count', payload: n })),
    { wait: true, reason: 'counting', timeoutMs: 600_000, onTimeout: 'cancel' },
  )
  const suspension = (await client.get(other)).suspension
  assert.deepEqual([suspension.reason, suspension.onTimeout, suspension.timeoutAtMs], ['counting', 'cancel', fanned.timeoutAtMs])
  const parts = fanned.children.map((x) => x.id)
  const [part] = await client.claim('count', { member: 'puller' })
  assert.equal(part.id, parts[0])
  await client.ack(part, 0)
  assert.deepEqual(await client.cancel(other), { state: 'cancelled', cancelRequested: false })
  const finished = (await client.wait(parts, 20_000)).finished
  assert.deepEqual(Object.fromEntries(finished.map((x) => [x.id, x.state])), {
    [parts[0]]: 'done',
    [parts[1]]: 'cancelled',
    [parts[2]]: 'cancelled',
  })
})

test('a pulled task emits output and a follower reads it', async (t) => {
  const d = await daemon(t)
  const client = await Client.connect(d.connect)
  t.after(() => client.close())
  await client.queueCreate('talk')
  const task = (await client.enqueue('talk', null)).id
  // Before any output: nothing, at once, and no summary.
  assert.deepEqual(await client.follow(task), { chunks: [], dropped: 0, next: 0, state: 'ready', end: false })
  assert.equal((await client.get(task)).output, undefined)
  const [claim] = await client.claim('talk', { member: 'puller' })
  assert.equal(claim.output, 0)
  const chunks = ['thinking', { json: { step: 1 } }, { text: 'done' }]
  assert.deepEqual(await client.emit(claim, claim.output, chunks), { next: 3, repeated: 0, waitMs: 0, cancelRequested: false })
  // The same emit again (as after a lost reply) stores nothing twice.
  assert.deepEqual(await client.emit(claim, 0, chunks), { next: 3, repeated: 3, waitMs: 0, cancelRequested: false })
  const partly = await client.emit(`${task}.${claim.epoch}`, 2, ['done', 'and more'])
  assert.deepEqual([partly.next, partly.repeated], [4, 1])
  await refused(() => client.emit(claim, 9, ['x']), BadRequest, 'bad_request', `bad_request: emit at chunk 9: task ${task}'s next chunk is numbered 4`)
  await refused(() => client.emit(claim, 4, ['x'.repeat(65_537)]), TooLarge, 'too_large', 'too_large: chunk 0 holds 65537 bytes, more than 65536')
  await refused(() => client.emit({ id: task, epoch: claim.epoch + 1 }, 4, ['x']), LeaseLost, 'lease_lost')
  for (const bad of [{}, { text: 'a', json: 1 }, { json: null }]) {
    await refused(() => client.emit(claim, 4, ['fine', bad]), InvalidInput, 'invalid_input', 'chunk 1: a chunk holds exactly one of text and json (not null)')
  }
  await refused(() => client.emit(claim, 4, [7]), InvalidInput, 'invalid_input')
  await refused(() => client.emit(claim, 4, 'one str'), InvalidInput, 'invalid_input')
  await refused(() => client.emit(claim, -1, ['x']), InvalidInput, 'invalid_input')
  await refused(() => client.emit(claim, 4, []), BadRequest, 'bad_request')

  // Read while the task runs; a follow with time to wait is answered by the next emit,
  // or by its timeout with nothing.
  const live = await client.follow(task)
  assert.deepEqual(live.chunks.map((x) => [x.n, x.text, x.json]), [
    [0, 'thinking', undefined],
    [1, undefined, { step: 1 }],
    [2, 'done', undefined],
    [3, 'and more', undefined],
  ])
  assert.ok(live.chunks.every((x) => x.atMs > 0))
  assert.deepEqual([live.dropped, live.next, live.state, live.end], [0, 4, 'leased', false])
  assert.deepEqual(await client.follow(task, 4, 50), { chunks: [], dropped: 0, next: 4, state: 'leased', end: false })
  const following = client.follow(task, 4, 30_000)
  assert.equal((await client.emit(claim, 4, ['live'])).next, 5)
  const followed = await following
  assert.deepEqual([followed.chunks.map((x) => [x.n, x.text]), followed.next], [[[4, 'live']], 5])

  // The next delivery numbers on from the first's; a finished task's output ends.
  await client.release(claim)
  const [next] = await client.claim('talk', { member: 'puller' })
  assert.deepEqual([next.epoch, next.output], [2, 5])
  await client.ack(next)
  const whole = await client.follow(task)
  assert.deepEqual([whole.chunks.length, whole.next, whole.state, whole.end], [5, 5, 'done', true])
  assert.deepEqual(await client.follow(task, 5, 30_000), { chunks: [], dropped: 0, next: 5, state: 'done', end: true })
  const summary = (await client.get(task)).output
  assert.deepEqual([summary.first, summary.next], [0, 5])
  assert.ok(summary.bytes > 0)
  await refused(() => client.follow(task, 6), BadRequest, 'bad_request', `bad_request: follow from chunk 6: task ${task} has emitted 5 chunks`)
  await refused(() => client.follow(task, 0, 300_001), BadRequest, 'bad_request')
  await refused(() => client.follow(task, -1), InvalidInput, 'invalid_input')
  await refused(() => client.follow('01JHMPFNMW1HEAD8X4A1JH69RE'), NotFound, 'not_found')
})

test('a follower is told of the chunks dropped past the output limit', async (t) => {
  const d = await daemon(t)
  const client = await Client.connect(d.connect)
  t.after(() => client.close())
  await client.queueCreate('talk')
  const task = (await client.enqueue('talk', null)).id
  const [claim] = await client.claim('talk', { member: 'puller' })
  // Five emits of four 64 KiB chunks, each one page as stored: a 16-byte header, the
  // brackets, and four {"text":"…"} with commas, 17 + 4 × (65,536 + 12) bytes. A task
  // keeps 1 MiB: the fourth and fifth emits each drop the oldest page whole.
  const page = 17 + 4 * (65_536 + 12)
  let at = 0
  let waitMs = 0
  for (let e = 0; e < 5; e++) {
    // The rate counts pages as stored too: the emit that empties the 1 MiB bucket
    // (refilled at 256 KiB/s) says how long until the next may go.
    if (waitMs > 0) await new Promise((r) => setTimeout(r, waitMs))
    const reply = await client.emit(claim, at, [0, 1, 2, 3].map((n) => `${e}${n}`.padEnd(65_536, '.')))
    at = reply.next
    waitMs = reply.waitMs
  }
  // Five pages are past 1 MiB and whatever refilled meanwhile: the last one waits.
  assert.ok(waitMs > 0, `the fifth emit waits ${waitMs} ms`)
  // One sent sooner is refused and not stored.
  const sent = Date.now()
  try {
    await client.emit(claim, at, ['too soon'])
    assert.ok(Date.now() - sent >= waitMs, 'an emit sent before its wait was over is refused')
  } catch (error) {
    assert.ok(error instanceof LimitExceeded, `${error.name}: ${error.message}`)
    assert.equal(error.code, 'limit')
  }
  assert.equal(at, 20)
  await client.ack(claim)
  assert.deepEqual((await client.get(task)).output, { first: 8, next: 20, bytes: 3 * page })
  const read = await client.follow(task, 2)
  assert.deepEqual([read.dropped, read.chunks[0].n, read.chunks[0].text.slice(0, 2)], [6, 8, '20'])
})
