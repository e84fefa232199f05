"""Pins with a deadline: prompt-cache breakpoints (Anthropic's cache_control TTLs) as leases on
pinned prefixes, protocol-neutral.

A prefix (its token ids, in a cache salt's namespace) is pinned once per (salt, prefix) through
the engine's Pin operation, within the pin budget (max_pinned_fraction of the pool: a pin may
hold fewer tokens than asked, or none); its lease ends `ttl` after the last request that held it
(a later hit extends it, never shortens it). `sweep` unpins the expired leases (the app runs it
from a background task; tests call it after moving the injected clock), `release_all` unpins
everything at shutdown: every pin taken here is undone exactly once. A lease that pinned nothing
(the prefix was not cached, or the budget was spent) pins again on its next hit.

The methods block on the engine thread (admin operations): call them off the event loop. They
are thread-safe."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from engine.kv.admin import AdminOp, Pin, Unpin

log = logging.getLogger("radixcache.api")

SWEEP_INTERVAL_S = 5.0
Key = tuple[str, tuple[int, ...]]  # (cache salt, prefix token ids)


@dataclass
class Lease:
    pinned_tokens: int  # what the pin holds; 0: nothing pinned (retried on the next hit)
    expires: float  # on the keeper's clock


class PinLeases:
    def __init__(
        self, run: Callable[[AdminOp[Any]], Any], clock: Callable[[], float] = time.monotonic
    ) -> None:
        """`run`: the engine's admin call (AsyncEngine.admin); `clock`: seconds, monotonic."""
        self._run = run
        self.clock = clock
        self._lock = threading.Lock()
        self._leases: dict[Key, Lease] = {}

    def hold(self, salt: str, prefix: Sequence[int], ttl_s: float) -> int:
        """Pins `prefix` until now + ttl_s (or extends its lease); tokens its pin holds."""
        key = (salt, tuple(prefix))
        with self._lock:
            expires = self.clock() + ttl_s
            lease = self._leases.setdefault(key, Lease(0, expires))
            lease.expires = max(lease.expires, expires)
            if lease.pinned_tokens == 0:
                lease.pinned_tokens = self._run(Pin(list(key[1]), salt))
            return lease.pinned_tokens

    def sweep(self) -> int:
        """Unpins the leases that expired; how many ended."""
        with self._lock:
            now = self.clock()
            ended = [k for k, lease in self._leases.items() if lease.expires <= now]
            for key in ended:
                self._end(key)
            return len(ended)

    def release_all(self) -> int:
        """Unpins every lease (shutdown); how many ended."""
        with self._lock:
            keys = list(self._leases)
            for key in keys:
                self._end(key)
            return len(keys)

    def leases(self, salt: str) -> dict[tuple[int, ...], Lease]:
        """The salt's leases by prefix (a copy)."""
        with self._lock:
            return {
                k[1]: Lease(v.pinned_tokens, v.expires)
                for k, v in self._leases.items()
                if k[0] == salt
            }

    def _end(self, key: Key) -> None:
        lease = self._leases.pop(key)
        if lease.pinned_tokens > 0:  # an Unpin without its Pin would undo another lease's pin
            self._run(Unpin(list(key[1]), key[0]))


async def sweep_forever(leases: PinLeases, interval_s: float = SWEEP_INTERVAL_S) -> None:
    """The app's background task: ends expired leases every `interval_s`."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            await asyncio.to_thread(leases.sweep)
        except Exception:  # a failing sweep must not take the server down; the next one retries
            log.exception("sweeping pin leases failed")
