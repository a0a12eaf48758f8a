// `refused`: asserts that a call is refused with an error of the class and code given,
// whether the addon throws at once (an argument of the wrong type) or the promise
// rejects (refused before sending, or by the daemon).

import assert from 'node:assert/strict'

/**
 * Calls `call()` and awaits it; asserts it fails with an instance of `cls` whose `code`
 * is `code`, and whose message is `message` (a string: exactly; a RegExp: matching).
 * Returns the error.
 */
export async function refused(call, cls, code, message) {
  let error
  try {
    await call()
  } catch (e) {
    error = e
  }
  assert.ok(error !== undefined, `expected ${cls.name} (${code}), and the call succeeded`)
  assert.ok(error instanceof cls, `expected ${cls.name} (${code}), got ${error?.name}: ${error?.message}`)
  assert.equal(error.code, code)
  if (typeof message === 'string') assert.equal(error.message, message)
  else if (message instanceof RegExp) assert.match(error.message, message)
  return error
}
