// Builds the native addon: npm's install script. `napi build` compiles the crate (Rust
// 1.90 or later is needed) and writes muster.<platform>.node with its loader binding.js
// and its types binding.d.ts, generated from src/. A release build, unless
// MUSTER_NODE_DEBUG=1 (the repository's tests, which share the workspace's target
// directory through CARGO_TARGET_DIR).
import { spawnSync } from 'node:child_process'
import { dirname } from 'node:path'
import { fileURLToPath } from 'node:url'

const args = ['build', '--platform', '--js', 'binding.js', '--dts', 'binding.d.ts']
if (process.env.MUSTER_NODE_DEBUG !== '1') args.push('--release')
const run = spawnSync('napi', args, {
  cwd: dirname(dirname(fileURLToPath(import.meta.url))),
  stdio: 'inherit',
})
if (run.error) {
  console.error(`@muster/sdk: could not run napi build: ${run.error.message}`)
  process.exit(1)
}
process.exit(run.status ?? 1)
