// The test harness: real `musterd` processes on loopback, as tests/src/lib.rs and the
// Python SDK's conftest.py run them.
//
// `startDaemon` starts `musterd` with a fresh data directory on a loopback port below the
// kernel's ephemeral range (no client's port-0 socket can take it while the daemon is
// down for a restart) and waits for its JSON log to say it listens. The binaries are
// target/debug/musterd and target/debug/muster (`CARGO_TARGET_DIR` honoured, or
// `MUSTER_BIN_DIR`). Every wait here is bounded; only processes a test started are
// signalled, by their PID.

import { spawn, spawnSync } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { createSocket } from 'node:dgram'
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join, resolve } from 'node:path'
import { createInterface } from 'node:readline'
import { fileURLToPath } from 'node:url'

export const PACKAGE = resolve(dirname(fileURLToPath(import.meta.url)), '..')
export const REPO = resolve(PACKAGE, '../..')

/** Longest a daemon may take to report that it listens. */
export const START_TIMEOUT_MS = 60_000

/** The lowest port the harness chooses for a daemon. */
const PORTS_FROM = 10_000

let nextPort = null

// Each test's configuration directory is its own, and none of the user's connection
// variables is seen: the user's contexts never decide where a test connects.
const CONFIG = mkdtempSync(join(tmpdir(), 'muster-node-config-'))
process.env.XDG_CONFIG_HOME = CONFIG
for (const name of Object.keys(process.env)) {
  if (name.startsWith('MUSTER_')) delete process.env[name]
}

/** The directory of `musterd` and `muster`. */
export function binDir() {
  if (process.env.MUSTER_BIN_DIR) return process.env.MUSTER_BIN_DIR
  const target = process.env.CARGO_TARGET_DIR || join(REPO, 'target')
  const built = join(target, 'debug')
  if (!existsSync(join(built, 'musterd')) || !existsSync(join(built, 'muster'))) {
    throw new Error(`no musterd in ${built}: cargo build -p muster-daemon -p muster-tui --bins`)
  }
  return built
}

function ephemeralStart() {
  try {
    const first = Number(readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').split(/\s+/)[0])
    return first > PORTS_FROM + 1000 ? first : 32768
  } catch {
    return 32768
  }
}

async function udpFree(port) {
  const socket = createSocket('udp4')
  return new Promise((done) => {
    socket.once('error', () => {
      socket.close()
      done(false)
    })
    socket.bind(port, '127.0.0.1', () => socket.close(() => done(true)))
  })
}

/** A free loopback UDP port below the kernel's ephemeral range, handed out in turn from a random start. */
export async function freePortBelowEphemeral() {
  const end = ephemeralStart()
  const span = end - PORTS_FROM
  let port = nextPort ?? PORTS_FROM + (randomBytes(2).readUInt16BE() % span)
  for (let i = 0; i < span; i++) {
    port = port + 1 >= end ? PORTS_FROM : port + 1
    if (await udpFree(port)) {
      nextPort = port
      return port
    }
  }
  throw new Error(`no free UDP port on 127.0.0.1 between ${PORTS_FROM} and ${end}`)
}

/** A fresh temporary directory, removed by `cleanup`. */
export function tempDir(prefix = 'muster-node-') {
  return mkdtempSync(join(tmpdir(), prefix))
}

/** A running `musterd` with its data directory. */
export class Daemon {
  /** `bins`: the directory of the binaries (a release one for benchmarks). */
  constructor(data, args = [], bins = binDir()) {
    this.bins = bins
    this.data = data
    this.args = args
    this.addr = null
    this.proc = null
    this.exited = null
  }

  /** Starts the daemon (again, on the same port and data directory). */
  async start() {
    if (this.proc) throw new Error('stop the daemon before starting it again')
    if (!this.addr) this.addr = `127.0.0.1:${await freePortBelowEphemeral()}`
    const proc = spawn(join(this.bins, 'musterd'), ['--data', this.data, '--listen', this.addr, '--log-format', 'json', ...this.args], {
      env: { ...process.env, MUSTER_LOG: 'info', MUSTER_DISK_ALARM_FREE_MIB: '0', MUSTER_DISK_ALARM_FREE_PERCENT: '0' },
      stdio: ['ignore', 'ignore', 'pipe'],
    })
    this.proc = proc
    this.exited = new Promise((done) => proc.once('exit', (code, signal) => done({ code, signal })))
    const lines = createInterface({ input: proc.stderr })
    let timer
    const listening = new Promise((done, fail) => {
      timer = setTimeout(() => fail(new Error(`musterd did not report listening within ${START_TIMEOUT_MS} ms; data in ${this.data}`)), START_TIMEOUT_MS)
      proc.once('exit', (code) => fail(new Error(`musterd exited (${code}) before it listened; data in ${this.data}`)))
      lines.on('line', (line) => {
        let fields
        try {
          fields = JSON.parse(line).fields || {}
        } catch {
          return
        }
        if (String(fields.message || '').startsWith('musterd listening')) {
          this.addr = fields.addr
          this.fingerprint = fields.fingerprint
          done()
        }
      })
    })
    try {
      await listening
    } finally {
      clearTimeout(timer)
    }
    return this
  }

  /** Options of `Client.connect` and `new Worker` for this daemon. */
  get connect() {
    return { addr: this.addr, data: this.data }
  }

  /** The environment of a program that connects to this daemon. */
  env() {
    const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('MUSTER_')))
    return { ...env, MUSTER_ADDR: this.addr, MUSTER_DATA: this.data }
  }

  /** SIGKILL, and waits for the daemon to be gone. */
  async kill9() {
    if (!this.proc) return
    this.proc.kill('SIGKILL')
    await this.exited
    this.proc = null
  }

  /** SIGTERM, and waits (SIGKILL after 30 s). */
  async stop() {
    if (!this.proc) return
    this.proc.kill('SIGTERM')
    const timer = setTimeout(() => this.proc && this.proc.kill('SIGKILL'), 30_000)
    await this.exited
    clearTimeout(timer)
    this.proc = null
  }

  /** Runs the `muster` CLI against this daemon: `{ status, stdout, stderr }`. */
  cli(...args) {
    const run = spawnSync(join(this.bins, 'muster'), args, { env: this.env(), encoding: 'utf8', timeout: 60_000 })
    return { status: run.status, stdout: run.stdout, stderr: run.stderr }
  }
}

/** A fresh daemon in a fresh directory; `t.after` stops it and removes the directory. */
export async function daemon(t, args = []) {
  const data = tempDir()
  const d = new Daemon(data, args)
  t.after(async () => {
    await d.stop()
    rmSync(data, { recursive: true, force: true })
  })
  return d.start()
}

/** Resolves once `predicate()` (sync or async) is truthy; fails after `timeoutMs`, naming `what`. */
export async function eventually(what, predicate, timeoutMs = 20_000) {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    const value = await predicate()
    if (value) return value
    if (Date.now() > deadline) throw new Error(`${what}: not within ${timeoutMs} ms`)
    await new Promise((r) => setTimeout(r, 20))
  }
}

/** A Node program started by a test in a process group of its own, with its stdout lines. */
export class Program {
  constructor(args, env) {
    // Run from the package, so `import '@muster/sdk'` resolves to it (self-reference).
    this.proc = spawn(process.execPath, args, { env, cwd: PACKAGE, stdio: ['ignore', 'pipe', 'pipe'], detached: true })
    this.lines = []
    /** Everything the program wrote to stderr so far. */
    this.stderr = ''
    this.proc.stderr.setEncoding('utf8')
    this.proc.stderr.on('data', (text) => {
      this.stderr += text
      process.stderr.write(text)
    })
    this.waiters = []
    this.exited = new Promise((done) => this.proc.once('exit', (code, signal) => done({ code, signal })))
    createInterface({ input: this.proc.stdout }).on('line', (line) => {
      this.lines.push(line)
      for (const w of this.waiters.splice(0)) w()
    })
  }

  /** Resolves with the first stdout line matching `pred` (seen before or after the call); fails after `timeoutMs`. */
  async line(pred, timeoutMs = 30_000) {
    const deadline = Date.now() + timeoutMs
    for (;;) {
      const found = this.lines.find(pred)
      if (found !== undefined) return found
      const left = deadline - Date.now()
      if (left <= 0) throw new Error(`no matching line within ${timeoutMs} ms: ${JSON.stringify(this.lines)}`)
      await new Promise((r) => {
        const t = setTimeout(r, left)
        this.waiters.push(() => {
          clearTimeout(t)
          r()
        })
      })
    }
  }

  /** Signals the program's process group. */
  signal(sig) {
    process.kill(-this.proc.pid, sig)
  }

  /** Waits for the program to exit (bounded); `{ code, signal }`. */
  async wait(timeoutMs = 60_000) {
    let timer
    const timeout = new Promise((_, fail) => {
      timer = setTimeout(() => fail(new Error(`the program did not exit within ${timeoutMs} ms`)), timeoutMs)
    })
    try {
      return await Promise.race([this.exited, timeout])
    } finally {
      clearTimeout(timer)
    }
  }

  /** kill -9 of the program's process group if it still runs. */
  async kill9() {
    if (this.proc.exitCode === null && this.proc.signalCode === null) {
      process.kill(-this.proc.pid, 'SIGKILL')
      await this.exited
    }
  }
}

/** Starts Node programs; `t.after` kills whatever is left of them. */
export function programs(t) {
  const started = []
  t.after(async () => {
    for (const p of started) await p.kill9()
  })
  return (args, env) => {
    const p = new Program(args, env)
    started.push(p)
    return p
  }
}
