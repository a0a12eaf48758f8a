"""Python SDK throughput next to the Rust SDK's, on one machine, in one run.

    python bench/bench.py --runs 5 --tasks 50000

Needs a release ``musterd``, the release Rust baseline
(``agent-sdk/examples/sdk_baseline.rs``, shared with the Node SDK's benchmark) and this
package built in release mode in the running interpreter (BENCHMARKS.md has the
commands). Each figure is measured on a fresh daemon with its own temporary data
directory (fsync before every reply), Rust and Python taking turns within each run:

- enqueue: one client, one task (256 bytes of JSON) per request, 256 requests in flight;
- enqueue, batched: one client, ``enqueue_many`` of all the tasks (1000 per request,
  every request sent before the first reply is awaited);
- drain: one ``Worker`` of capacity 32 whose handler returns at once (an ack with no
  result), from the first task to the last ack; in Python once with a coroutine handler
  and once with a plain function (run in the worker's thread pool).

Prints medians, minima and maxima over the runs, and writes every figure to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import muster

REPO = Path(__file__).resolve().parents[3]
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))

WINDOW = 256
"""Single-task enqueues in flight (as ``muster bench``'s producers and the baseline)."""

CAPACITY = 32
"""Tasks the draining worker holds at once (as the baseline)."""

PAYLOAD = {"t": 0, "pad": "x" * (256 - len('{"t":0,"pad":""}'))}
"""256 bytes of JSON, as ``muster bench`` and the baseline send."""

POLL = 0.005
"""How often a drain looks at the queue's done count, in seconds."""

START_TIMEOUT = 60.0
"""Longest a daemon may take to report that it listens."""


class Daemon:
    """A release ``musterd`` on a fresh temporary data directory."""

    def __init__(self, musterd: Path) -> None:
        """Starts it and waits until it listens."""
        self.dir = tempfile.TemporaryDirectory(prefix="muster-pybench-")
        log_path = Path(self.dir.name) / "musterd.log"
        with open(log_path, "w") as log:
            self.proc = subprocess.Popen(
                [
                    musterd,
                    "--data",
                    self.dir.name,
                    "--listen",
                    "127.0.0.1:0",
                    "--log-format",
                    "json",
                ],
                env={**os.environ, "MUSTER_LOG": "info"},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        self.addr = ""
        deadline = time.monotonic() + START_TIMEOUT
        while not self.addr and time.monotonic() < deadline and self.proc.poll() is None:
            time.sleep(0.02)
            for line in log_path.read_text().splitlines():
                fields = json.loads(line).get("fields", {}) if line.startswith("{") else {}
                if str(fields.get("message", "")).startswith("musterd listening"):
                    self.addr = fields["addr"]
        if not self.addr:
            self.stop()
            raise RuntimeError(f"musterd did not start: {log_path.read_text()}")

    def stop(self) -> None:
        """SIGTERM and wait, then remove the data directory."""
        self.proc.terminate()
        self.proc.wait(timeout=60)
        self.dir.cleanup()


async def create_queue(daemon: Daemon) -> None:
    async with await muster.Client.connect(daemon.addr, data=daemon.dir.name) as client:
        await client.queue_create("bench")


def rust(baseline: Path, phase: str, daemon: Daemon, tasks: int) -> float:
    """Runs a phase of the Rust baseline; its rate in tasks per second."""
    out = subprocess.run(
        [baseline, phase, daemon.addr, daemon.dir.name, str(tasks)],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return float(out.stdout.strip())


async def python_enqueue(daemon: Daemon, tasks: int) -> float:
    async with await muster.Client.connect(daemon.addr, data=daemon.dir.name) as client:

        async def lane(count: int) -> None:
            for _ in range(count):
                await client.enqueue("bench", PAYLOAD)

        lanes = [tasks // WINDOW + (1 if n < tasks % WINDOW else 0) for n in range(WINDOW)]
        started = time.perf_counter()
        await asyncio.gather(*(lane(n) for n in lanes))
        return tasks / (time.perf_counter() - started)


async def python_enqueue_batched(daemon: Daemon, tasks: int) -> float:
    async with await muster.Client.connect(daemon.addr, data=daemon.dir.name) as client:
        payloads = [PAYLOAD] * tasks
        started = time.perf_counter()
        await client.enqueue_many("bench", payloads)
        return tasks / (time.perf_counter() - started)


async def noop(task: muster.Task) -> None:
    """The coroutine handler of the drain: ack at once."""


def noop_sync(task: muster.Task) -> None:
    """The plain-function handler of the drain: ack at once."""


async def python_drain(daemon: Daemon, tasks: int, handler: muster.Handler) -> float:
    async with await muster.Client.connect(daemon.addr, data=daemon.dir.name) as monitor:
        worker = muster.Worker(
            "bench/python", "bench", capacity=CAPACITY, addr=daemon.addr, data=daemon.dir.name
        )
        started = time.perf_counter()
        running = asyncio.ensure_future(worker.run(handler, handle_signals=False))
        while (await monitor.queue_describe("bench")).done < tasks:
            if running.done():
                running.result()
            await asyncio.sleep(POLL)
        elapsed = time.perf_counter() - started
        worker.shutdown()
        await running
        return tasks / elapsed


def one_run(musterd: Path, baseline: Path, tasks: int) -> Dict[str, float]:
    """Every figure once, each phase pair on fresh daemons."""
    figures: Dict[str, float] = {}

    def fresh() -> Daemon:
        daemon = Daemon(musterd)
        asyncio.run(create_queue(daemon))
        return daemon

    d = fresh()
    figures["rust enqueue"] = rust(baseline, "enqueue", d, tasks)
    figures["rust drain"] = rust(baseline, "drain", d, tasks)
    d.stop()
    d = fresh()
    figures["python enqueue"] = asyncio.run(python_enqueue(d, tasks))
    figures["python drain"] = asyncio.run(python_drain(d, tasks, noop))
    d.stop()
    d = fresh()
    figures["rust enqueue batched"] = rust(baseline, "enqueue-batched", d, tasks)
    d.stop()
    d = fresh()
    figures["python enqueue batched"] = asyncio.run(python_enqueue_batched(d, tasks))
    figures["python drain, sync handler"] = asyncio.run(python_drain(d, tasks, noop_sync))
    d.stop()
    return figures


def main(argv: Optional[List[str]] = None) -> None:
    """Runs the benchmark and prints the table."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tasks", type=int, default=50_000)
    parser.add_argument("--musterd", type=Path, default=TARGET / "release" / "musterd")
    parser.add_argument(
        "--baseline", type=Path, default=TARGET / "release" / "examples" / "sdk_baseline"
    )
    parser.add_argument("--out", type=Path, default=Path("pybench.json"))
    args = parser.parse_args(argv)
    runs: List[Dict[str, float]] = []
    for n in range(args.runs):
        runs.append(one_run(args.musterd, args.baseline, args.tasks))
        print(f"run {n + 1} of {args.runs}: {json.dumps(runs[-1])}", file=sys.stderr, flush=True)
    print(f"tasks/s, {args.runs} runs of {args.tasks} tasks")
    print(f"{'figure':<30}{'median':>10}{'min':>10}{'max':>10}")
    for name in runs[0]:
        values = [r[name] for r in runs]
        print(
            f"{name:<30}{statistics.median(values):>10.0f}{min(values):>10.0f}{max(values):>10.0f}"
        )
    report: Dict[str, Any] = {"tasks": args.tasks, "runs": runs}
    args.out.write_text(json.dumps(report, indent=2))
    print(f"all figures: {args.out}")


if __name__ == "__main__":
    main()
