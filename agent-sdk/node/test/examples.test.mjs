// The examples as printed in the READMEs, run as programs against a real daemon: a
// producer and two agents; an agent killed with -9 and started again under its member
// name, which gets its task back at once from its last checkpoint; SIGTERM draining an
// agent, its unfinished task released without a failure.
import assert from 'node:assert/strict'
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import { test } from 'node:test'

import { Client } from '../index.mjs'
import { PACKAGE, REPO, daemon, eventually, programs } from './harness.mjs'

const AGENT = join(PACKAGE, 'examples/agent.mjs')
const PRODUCER = join(PACKAGE, 'examples/producer.mjs')

/** A daemon with queue `jobs` holding one long job (400 tokens of 50 ms), a client and a program starter. */
async function longJob(t) {
  const d = await daemon(t)
  assert.equal(d.cli('queue', 'create', 'jobs').status, 0)
  const start = programs(t)
  const client = await Client.connect(d.connect)
  t.after(() => client.close())
  const { id } = await client.enqueue('jobs', { prompt: 'long', tokens: 400, token_ms: 50 })
  return { d, start, client, id }
}

test('the READMEs print the examples exactly as they are run', () => {
  for (const readme of [join(PACKAGE, 'README.md'), join(REPO, 'README.md')]) {
    const text = readFileSync(readme, 'utf8')
    for (const example of [PRODUCER, AGENT]) {
      const block = '```js\n' + readFileSync(example, 'utf8') + '```\n'
      assert.ok(text.includes(block), `${readme} shows ${example} as it is`)
    }
  }
})

test('a producer and two agents: every job done once', async (t) => {
  const d = await daemon(t)
  const start = programs(t)
  const env = d.env()
  const agents = [start([AGENT, 'node/agent-1', 'jobs', '2'], env), start([AGENT, 'node/agent-2', 'jobs', '2'], env)]
  const producer = start([PRODUCER, 'jobs', '6'], env)
  assert.deepEqual(await producer.wait(60_000), { code: 0, signal: null })
  const enqueued = producer.lines.filter((l) => l.startsWith('enqueued ')).map((l) => l.split(' ')[1])
  const done = producer.lines.filter((l) => l.startsWith('done '))
  assert.equal(enqueued.length, 6)
  assert.equal(done.length, 6)
  for (const line of done) {
    const result = JSON.parse(line.split(' ').slice(2).join(' '))
    assert.equal(result.completion, 'the quick brown fox jumps')
    assert.equal(result.tokens, 5)
  }
  // Each job ran once, on one agent or the other.
  const started = agents.flatMap((a) => a.lines.filter((l) => l.startsWith('start ')).map((l) => l.split(' ')[1]))
  assert.deepEqual([...started].sort(), [...enqueued].sort())
  // Run again, the producer's idempotency keys answer the same tasks.
  const again = start([PRODUCER, 'jobs', '6'], env)
  assert.deepEqual(await again.wait(60_000), { code: 0, signal: null })
  assert.deepEqual(again.lines.filter((l) => l.startsWith('enqueued ')).map((l) => l.split(' ')[1]), enqueued)
  for (const a of agents) a.signal('SIGTERM')
  for (const a of agents) assert.deepEqual(await a.wait(30_000), { code: 0, signal: null })
})

test('kill -9 and a restart under the same member name gets the task back at once, from its checkpoint', async (t) => {
  const { d, start, client, id } = await longJob(t)
  const first = start([AGENT, 'node/gpu-1', 'jobs'], d.env())
  await first.line((l) => l === `start ${id} attempt=1 reclaimed=false progress=null`)
  await eventually('a checkpoint of 3 tokens', async () => ((await client.get(id)).progress?.tokens?.length ?? 0) >= 3)
  await first.kill9()
  const before = performance.now()
  const second = start([AGENT, 'node/gpu-1', 'jobs'], d.env())
  const line = await second.line((l) => l.startsWith(`start ${id} `))
  const waited = performance.now() - before
  assert.match(line, new RegExp(`^start ${id} attempt=2 reclaimed=true progress=\\{"tokens":\\["the","quick","brown"`))
  // Reclaimed at the session's start, not after the 30 s lease: the process start is most of this.
  assert.ok(waited < 10_000, `the restarted agent got its task after ${waited.toFixed(0)} ms`)
  second.signal('SIGTERM')
  assert.deepEqual(await second.wait(30_000), { code: 0, signal: null })
})

test('SIGTERM drains an agent: its unfinished task is released without a failure and it exits 0', async (t) => {
  const { d, start, client, id } = await longJob(t)
  const agent = start([AGENT, 'node/drained', 'jobs'], { ...d.env(), MUSTER_GRACE_MS: '300' })
  await agent.line((l) => l.startsWith(`start ${id} `))
  agent.signal('SIGTERM')
  assert.deepEqual(await agent.wait(30_000), { code: 0, signal: null })
  assert.ok(agent.lines.includes(`cancelled ${id}`), agent.lines.join('\n'))
  const info = await client.get(id)
  assert.deepEqual([info.state, info.failures], ['ready', 0])
  assert.ok(info.progress.tokens.length >= 1)
})
