// Builds the native addon: npm's install script. `napi build` compiles the crate (Rust
// 1.90 or later is needed) and writes muster.<platform>.node with its loader binding.js
// and its types binding.d.ts, generated from src/. A release build, unless
// MUSTER_NODE_DEBUG=1 (the repository's tests, which share the workspace's target
// directory through CARGO_TARGET_DIR).
import { spawnSync } from 'node:child_process'
import { existsSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'

const dir = dirname(dirname(fileURLToPath(import.meta.url)))
// The package's own CLI (`npm ci` here), else the one npm put on the PATH of its
// install script (a project that installed this package).
const local = join(dir, 'node_modules', '.bin', 'napi')
const napi = existsSync(local) ? local : 'napi'
const args = ['build', '--platform', '--js', 'binding.js', '--dts', 'binding.d.ts']
if (process.env.MUSTER_NODE_DEBUG !== '1') args.push('--release')
const run = spawnSync(napi, args, {
  cwd: dir,
  stdio: 'inherit',
})
if (run.error) {
  console.error(`@muster/sdk: could not run napi build: ${run.error.message}`)
  process.exit(1)
}
process.exit(run.status ?? 1)
