// The operator's ops that need more than one plain daemon, through the Client: a
// cluster's membership (clusterStatus, clusterAdd, clusterRemove) on two nodes on
// loopback, and what tokens allow (memberRelease of a name bound to a token, admin ops
// refused to lesser tokens); and what a single daemon answers to the cluster ops.

import assert from 'node:assert/strict'
import { createHash, randomBytes } from 'node:crypto'
import { copyFileSync, mkdirSync, realpathSync, rmSync, statSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { test } from 'node:test'

import { AlreadyExists, BadRequest, Client, Forbidden, InvalidInput, InvalidState, NotFound, NotLeader } from '../index.mjs'
import { Daemon, daemon, eventually, freePortBelowEphemeral, tempDir } from './harness.mjs'
import { refused } from './refused.mjs'

const TOKENS = {
  ops: 'o'.repeat(40),
  'jobs-admin': 'j'.repeat(40),
  producer: 'p'.repeat(40),
  'team-a': 'a'.repeat(40),
  'team-b': 'b'.repeat(40),
}

/** A daemon configuration with the tokens above: an admin of every queue, an admin of
 * queues `jobs*` only, a producer and two consumers. */
const CONFIG = [
  ['ops', '["admin"]', ''],
  ['jobs-admin', '["admin"]', 'queues = ["jobs", "jobs.*"]\n'],
  ['producer', '["produce"]', ''],
  ['team-a', '["consume"]', ''],
  ['team-b', '["consume"]', ''],
]
  .map(([name, roles, queues]) => {
    const sha = createHash('sha256').update(TOKENS[name]).digest('hex')
    return `[[tokens]]\nname = "${name}"\ntoken_sha256 = "${sha}"\nroles = ${roles}\n${queues}\n`
  })
  .join('')

const CLUSTER_ID = 'node-test'

/** Two cluster nodes in a fresh directory, stopped and removed after the test: node 1
 * bootstrapped (a one-node cluster it leads), node 2 started with node 1's identity
 * and not yet added. Each has `clusterAddr`, its node-to-node address. */
async function twoNodes(t) {
  const root = tempDir('muster-node-cluster-')
  const nodes = {}
  t.after(async () => {
    for (const node of Object.values(nodes)) await node.stop()
    rmSync(root, { recursive: true, force: true })
  })
  const config = join(root, 'muster.toml')
  writeFileSync(config, CONFIG)
  const secret = join(root, 'cluster.secret')
  writeFileSync(secret, `${randomBytes(48).toString('hex')}\n`, { mode: 0o600 })
  for (const n of [1, 2]) {
    const data = join(root, `node-${n}`)
    mkdirSync(data, { mode: 0o700 })
    // Every node has node 1's certificate: one trust (node 1's data directory) for all.
    if (n > 1) for (const file of ['cert.pem', 'key.pem']) copyFileSync(join(nodes[1].data, file), join(data, file))
    const clusterAddr = `127.0.0.1:${await freePortBelowEphemeral()}`
    const args = ['--cluster-id', CLUSTER_ID, '--node-id', String(n), '--cluster-listen', clusterAddr, '--cluster-secret-file', secret, '--config', config]
    if (n === 1) args.push('--bootstrap')
    nodes[n] = new Daemon(data, args)
    nodes[n].clusterAddr = clusterAddr
    await nodes[n].start()
  }
  return nodes
}

test('a cluster is read, grown by a learner made a voter, and shrunk', async (t) => {
  const nodes = await twoNodes(t)
  const options = (n, token = 'ops') => ({ addr: nodes[n].addr, data: nodes[1].data, token: TOKENS[token] })
  const member = (n, matched) => ({ node: n, addr: nodes[n].addr, clusterAddr: nodes[n].clusterAddr, voter: true, ...(matched === undefined ? {} : { matched }) })
  const client = await Client.connect(options(1))
  t.after(() => client.close())

  // Node 1 alone: a one-node cluster it leads.
  const alone = await client.clusterStatus()
  assert.deepEqual([alone.clusterId, alone.node, alone.role, alone.leader], [CLUSTER_ID, 1, 'leader', 1])
  assert.ok(alone.term >= 1)
  assert.deepEqual(alone.members, [member(1, alone.lastLogIndex)])

  // Node 2 joins as a learner (it copies the log, it does not vote); a second add
  // promotes it.
  const learner = await client.clusterAdd(2, nodes[2].addr, nodes[2].clusterAddr, { learner: true, catchUpMs: 30_000 })
  assert.deepEqual([learner.node, learner.role], [1, 'leader'])
  assert.deepEqual(learner.members.map((x) => [x.node, x.voter]), [[1, true], [2, false]])
  const two = await client.clusterAdd(2, nodes[2].addr, nodes[2].clusterAddr)
  assert.deepEqual(two.members.map((x) => [x.node, x.addr, x.clusterAddr, x.voter]), [
    [1, nodes[1].addr, nodes[1].clusterAddr, true],
    [2, nodes[2].addr, nodes[2].clusterAddr, true],
  ])

  // Node 2's own view, once it holds and applied the leader's whole log.
  const follower = await Client.connectNode(options(2))
  t.after(() => follower.close())
  const [leaderView, followerView] = await eventually('node 2 follows node 1 with the whole log', async () => {
    const leader = await client.clusterStatus()
    const own = await follower.clusterStatus()
    const caughtUp =
      own.leader === 1 &&
      own.term === leader.term &&
      own.lastApplied === leader.lastLogIndex &&
      leader.members.every((x) => x.matched === leader.lastLogIndex)
    return caughtUp && [leader, own]
  })
  const last = leaderView.lastLogIndex
  assert.deepEqual(leaderView, {
    clusterId: CLUSTER_ID,
    node: 1,
    role: 'leader',
    term: leaderView.term,
    leader: 1,
    lastLogIndex: last,
    lastApplied: last,
    members: [member(1, last), member(2, last)],
  })
  // Only the leader knows how far the others are.
  assert.deepEqual(followerView, {
    clusterId: CLUSTER_ID,
    node: 2,
    role: 'follower',
    term: leaderView.term,
    leader: 1,
    lastLogIndex: last,
    lastApplied: last,
    members: [member(1), member(2)],
  })

  // A follower answers its status and refuses the rest, saying where the leader is.
  await refused(() => follower.clusterRemove(2), NotLeader, 'not_leader', /node 1/)
  await refused(() => follower.clusterAdd(4, '127.0.0.1:1', '127.0.0.1:2'), NotLeader, 'not_leader')
  await refused(() => follower.queueList(), NotLeader, 'not_leader')
  // Connecting through node 2 reaches the leader.
  const through = await Client.connect(options(2))
  t.after(() => through.close())
  assert.equal((await through.clusterStatus()).node, 1)

  // A snapshot of the leader's store, in its snapshot root.
  await client.queueCreate('jobs')
  await client.enqueueMany('jobs', [{ payload: { n: 1 } }, { payload: { n: 2 } }])
  const root = join(realpathSync(nodes[1].data), 'backups')
  assert.deepEqual(await client.adminSnapshot('before-remove'), { dir: join(root, 'before-remove'), tasks: 2, queues: 1 })
  assert.ok(statSync(join(root, 'before-remove')).isDirectory())

  // Refusals, each with its class and code; none changes the membership.
  await refused(() => client.clusterAdd(2, nodes[2].addr, nodes[2].clusterAddr), AlreadyExists, 'already_exists', /node 2 is a voter/)
  await refused(() => client.clusterRemove(9), NotFound, 'not_found', /node 9/)
  await refused(() => client.clusterAdd(5, '127.0.0.1:1', '127.0.0.1:2', { catchUpMs: 0 }), BadRequest, 'bad_request', /catch_up_ms 0 is out of range/)
  await refused(() => client.clusterAdd(-1, '127.0.0.1:1', '127.0.0.1:2'), InvalidInput, 'invalid_input', /integer `-1`, expected u64/)
  await refused(() => client.clusterAdd(5, '127.0.0.1:1', '127.0.0.1:2', { catchUpMs: -1 }), InvalidInput, 'invalid_input', /integer `-1`, expected u64/)
  await refused(() => client.clusterAdd(5, '127.0.0.1:1'), InvalidInput, 'invalid_input')
  await refused(() => client.clusterRemove(-1), InvalidInput, 'invalid_input', /integer `-1`, expected u64/)
  await refused(() => client.clusterRemove('2'), InvalidInput, 'invalid_input')
  assert.deepEqual((await client.clusterStatus()).members.map((x) => [x.node, x.voter]), [[1, true], [2, true]])

  // Tokens: membership changes and snapshots need an admin of every queue; the
  // status, any admin.
  const limited = await Client.connect(options(1, 'jobs-admin'))
  t.after(() => limited.close())
  assert.equal((await limited.clusterStatus()).node, 1)
  for (const call of [
    () => limited.clusterAdd(4, '127.0.0.1:1', '127.0.0.1:2'),
    () => limited.clusterRemove(2),
    () => limited.adminSnapshot('limited'),
  ]) {
    await refused(call, Forbidden, 'forbidden', /limited to some queues/)
  }
  const producer = await Client.connect(options(1, 'producer'))
  t.after(() => producer.close())
  for (const call of [() => producer.clusterStatus(), () => producer.clusterRemove(2)]) {
    await refused(call, Forbidden, 'forbidden', /lacks the role admin/)
  }

  // Node 2 leaves: node 1 goes on alone.
  const after = await client.clusterRemove(2)
  assert.deepEqual([after.node, after.role, after.members.map((x) => x.node)], [1, 'leader', [1]])
  assert.deepEqual((await client.clusterStatus()).members.map((x) => [x.node, x.voter]), [[1, true]])
})

test('a single daemon is not a cluster', async (t) => {
  const d = await daemon(t)
  const client = await Client.connect(d.connect)
  t.after(() => client.close())
  for (const call of [
    () => client.clusterStatus(),
    () => client.clusterAdd(2, '127.0.0.1:1', '127.0.0.1:2'),
    () => client.clusterRemove(2),
  ]) {
    await refused(call, InvalidState, 'invalid_state', 'invalid_state: this daemon is not a cluster node (start it with --cluster-id to run a cluster)')
  }
  const own = await Client.connectNode(d.connect)
  t.after(() => own.close())
  await refused(() => own.clusterStatus(), InvalidState, 'invalid_state')
})

test('tokens: a member name bound to one is freed by memberRelease; lesser tokens are refused admin ops', async (t) => {
  const data = tempDir()
  const config = join(data, 'muster.toml')
  writeFileSync(config, CONFIG)
  const d = await daemon(t, ['--config', config])
  const connect = async (name) => {
    const client = await Client.connect({ ...d.connect, token: TOKENS[name] })
    t.after(() => client.close())
    return client
  }
  t.after(() => rmSync(data, { recursive: true, force: true }))
  const ops = await connect('ops')
  const a = await connect('team-a')
  const b = await connect('team-b')
  await ops.queueCreate('jobs')
  await ops.enqueueMany('jobs', [{ payload: { n: 1 } }, { payload: { n: 2 } }])
  // A claim that gets a task binds the name (an empty one binds nothing).
  const [first] = await a.claim('jobs', { member: 'gpu-1' })
  await a.ack(first)
  await refused(() => b.claim('jobs', { member: 'gpu-1' }), Forbidden, 'forbidden', /gpu-1/)
  assert.equal(await ops.memberRelease('gpu-1'), undefined)
  const [second] = await b.claim('jobs', { member: 'gpu-1' })
  await b.ack(second)
  await refused(() => a.claim('jobs', { member: 'gpu-1' }), Forbidden, 'forbidden', /gpu-1/)
  await refused(() => ops.memberRelease('gpu-2'), NotFound, 'not_found', /bound to no principal/)
  // A consumer may not release a name, set a limit, create a queue or read the stats.
  for (const call of [
    () => a.memberRelease('gpu-1'),
    () => a.limitSet('api', { concurrency: 1 }),
    () => a.queueCreate('mine'),
    () => a.serverStats(),
  ]) {
    await refused(call, Forbidden, 'forbidden')
  }
  // A limit spans queues: an admin of some queues may not set one, any role may read.
  const limited = await connect('jobs-admin')
  await refused(() => limited.limitSet('api', { concurrency: 1 }), Forbidden, 'forbidden')
  await ops.limitSet('api', { concurrency: 1 })
  assert.deepEqual((await a.limitList()).map((x) => x.name), ['api'])
  await refused(() => limited.limitDelete('api'), Forbidden, 'forbidden')
})
