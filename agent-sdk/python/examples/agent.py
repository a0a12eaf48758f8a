"""An agent that simulates an LLM call: it streams tokens, checkpoints its progress and
stops when told to.

    python agent.py gpu-3/agent-7 jobs 3

Arguments: member name, queue, capacity. Each job is ``{"prompt": "...", "tokens": N,
"token_ms": M}``: N tokens of M milliseconds each, a checkpoint after every token. A
restarted agent (same member name) gets its tasks back at once and resumes from the
last checkpoint. SIGTERM or Ctrl-C drains: running jobs get the grace period
(``MUSTER_GRACE`` seconds, default 10), the rest is released for other agents. A
cancelled job (``muster cancel ID``) stops at once.

The daemon is found as the CLI finds it (``MUSTER_ADDR``, ``MUSTER_DATA``, ...). It
prints one line per event, for people and for tests: ``start ID attempt=A
reclaimed=R progress=P``, ``done ID``, ``cancelled ID``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any, Dict

import muster

WORDS = "the quick brown fox jumps over the lazy dog".split()


def say(line: str) -> None:
    """One line on stdout, at once."""
    print(line, flush=True)


async def complete(task: muster.Task) -> Dict[str, Any]:
    """The fake model call: one token every ``token_ms``, checkpointed."""
    job = task.payload
    tokens, token_ms = int(job.get("tokens", 20)), int(job.get("token_ms", 100))
    done = (task.progress or {}).get("tokens", [])
    progress = json.dumps(task.progress) if task.progress is not None else "-"
    say(f"start {task.id} attempt={task.attempt} reclaimed={task.reclaimed} progress={progress}")
    try:
        for n in range(len(done), tokens):
            await asyncio.sleep(token_ms / 1000)
            done = [*done, WORDS[n % len(WORDS)]]
            await task.set_progress({"tokens": done})
    except asyncio.CancelledError:
        # Cancelled, revoked, or the drain's grace is over: the task goes back (or ends
        # cancelled) with its last checkpoint, and no failure is counted.
        say(f"cancelled {task.id}")
        raise
    say(f"done {task.id}")
    return {"prompt": job.get("prompt"), "completion": " ".join(done), "tokens": tokens}


def main() -> None:
    """Runs the agent until SIGTERM or SIGINT."""
    member = sys.argv[1] if len(sys.argv) > 1 else "example/agent-1"
    queue = sys.argv[2] if len(sys.argv) > 2 else "jobs"
    capacity = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    grace = float(os.environ.get("MUSTER_GRACE", "10"))
    worker = muster.Worker(member, queue, capacity=capacity, grace=grace)
    asyncio.run(worker.run(complete))


if __name__ == "__main__":
    main()
