"""Each asyncio event loop's end of the native bridge (see ``src/bridge.rs``).

Native calls resolve their futures from an inbox that wakes the loop through a file
descriptor; the first call on a loop makes that loop's :class:`_native.Loop` and has
the loop watch it. The loop holds it (through its reader callback) for as long as the
loop lives; it is forgotten with the loop.
"""

from __future__ import annotations

import asyncio
import weakref

from . import _native

_bridges: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _native.Loop] = (
    weakref.WeakKeyDictionary()
)


def current() -> _native.Loop:
    """The running loop's bridge, made and registered on first use."""
    loop = asyncio.get_running_loop()
    bridge = _bridges.get(loop)
    if bridge is None:
        bridge = _native.Loop()
        loop.add_reader(bridge.wakeup_fd, bridge.pump)
        _bridges[loop] = bridge
    return bridge
