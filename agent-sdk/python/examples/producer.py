"""A producer: enqueues N prompts on a queue and waits for their completions.

    python producer.py jobs 10 20

Arguments: queue, number of prompts, tokens per completion (an agent such as
``agent.py`` makes them at 50 ms a token).

The daemon is found as the CLI finds it (``MUSTER_ADDR``, ``MUSTER_DATA``, ...). It
prints ``enqueued N tasks on QUEUE``, then one line per task, ``ID<TAB>STATE<TAB>RESULT``,
in enqueue order (``removed`` or ``unfinished`` for those that did not finish).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import muster

WAIT = 300.0
"""Longest one ``wait`` request may wait (the protocol's limit)."""


async def main(queue: str, count: int, tokens: int) -> None:
    """Enqueues ``count`` jobs and prints their results."""
    async with await muster.Client.connect() as client:
        try:
            await client.queue_create(queue)
        except muster.AlreadyExists:
            pass
        jobs = [{"prompt": f"question {n}", "tokens": tokens, "token_ms": 50} for n in range(count)]
        ids = await client.enqueue_many(queue, jobs)
        print(f"enqueued {len(ids)} tasks on {queue}", flush=True)
        results: dict[str, str] = {}
        deadline = time.monotonic() + 3600
        while len(results) < len(ids) and time.monotonic() < deadline:
            pending = [i for i in ids if i not in results][: muster.MAX_BATCH]
            reply = await client.wait(pending, WAIT)
            results.update((t.id, f"{t.state}\t{json.dumps(t.result)}") for t in reply.finished)
            results.update((i, "removed\t-") for i in reply.removed)
        for task_id in ids:
            outcome = results.get(task_id, "unfinished\t-")
            print(f"{task_id}\t{outcome}")


if __name__ == "__main__":
    asyncio.run(
        main(
            sys.argv[1] if len(sys.argv) > 1 else "jobs",
            int(sys.argv[2]) if len(sys.argv) > 2 else 10,
            int(sys.argv[3]) if len(sys.argv) > 3 else 10,
        )
    )
