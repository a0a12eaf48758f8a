// The package's two entries: CommonJS (index.js) and ES modules (index.mjs) give the same
// objects, one copy of the addon; every error code has its class.
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import { test } from 'node:test'

import * as esm from '../index.mjs'
import muster from '../index.mjs'

const require = createRequire(import.meta.url)

test('require and import give the same objects, every one of them', () => {
  const cjs = require('@muster/sdk')
  assert.equal(cjs, muster, 'the default export is the CommonJS module')
  const named = Object.keys(esm).filter((k) => k !== 'default').sort()
  assert.deepEqual(named, Object.keys(cjs).sort(), 'index.mjs exports every name index.js does')
  for (const name of named) assert.equal(esm[name], cjs[name], name)
})

test('every error code has its class, a subclass of MusterError', () => {
  const cjs = require('@muster/sdk')
  const expected = {
    connect_error: 'ConnectError',
    connection_lost: 'ConnectionLost',
    protocol_error: 'ProtocolError',
    invalid_input: 'InvalidInput',
    bad_request: 'BadRequest',
    unknown_op: 'UnknownOp',
    not_found: 'NotFound',
    already_exists: 'AlreadyExists',
    lease_lost: 'LeaseLost',
    invalid_state: 'InvalidState',
    too_large: 'TooLarge',
    limit: 'LimitExceeded',
    unauthorized: 'Unauthorized',
    forbidden: 'Forbidden',
    replaced: 'Replaced',
    shutting_down: 'ShuttingDown',
    disk_full: 'DiskFull',
    not_leader: 'NotLeader',
    outcome_unknown: 'OutcomeUnknown',
    stale_token: 'StaleToken',
  }
  // The addon's codes are the protocol's: a code added there without a class here fails.
  assert.deepEqual(cjs.errorCodes(), Object.keys(expected))
  for (const [code, name] of Object.entries(expected)) {
    const cls = cjs[name]
    assert.equal(typeof cls, 'function', name)
    assert.ok(cls.prototype instanceof cjs.MusterError, name)
    const serverSide = !['ConnectError', 'ConnectionLost', 'ProtocolError', 'InvalidInput'].includes(name)
    assert.equal(cls.prototype instanceof cjs.ServerError, serverSide, `${name} (${code}) is a ServerError`)
    assert.equal(new cls('x', code).name, name)
  }
})
