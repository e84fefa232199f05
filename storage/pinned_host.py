"""PinnedHostTier: the host tier of a GPU pool, its values in slots of one pinned arena.

A copy from pinned memory to the GPU runs asynchronously at the link's speed; from ordinary
(pageable) memory the driver stages it through a bounce buffer. Every value of one engine's tiers
has the same size (one block in one format), so the arena is cut into equal slots, sized by the
first value written and made then (the whole budget pinned at once, in place: pinning it later,
value by value, would stall the writer). A value of another size is refused.

Loads copy straight from a slot to the device (copy_out) under the tier's lock, so the slot cannot
be reused while the copy reads it. pin=False keeps the arena in ordinary memory: the same tier on
a CPU, for tests.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch

from storage.codec import HEADER_SIZE, CorruptBlock, expect_block, read_header
from storage.host import HostTier

if TYPE_CHECKING:
    from radixcache.hashing import Namespace
    from storage.base import SpillDown

log = logging.getLogger(__name__)

ToDevice = Callable[[list[torch.Tensor]], list[torch.Tensor]]


class PinnedHostTier(HostTier):
    def __init__(
        self, capacity_bytes: int, spill_down: SpillDown | None = None, *, pin: bool = True
    ) -> None:
        super().__init__(capacity_bytes, spill_down)
        self.pin = pin
        self._arena: torch.Tensor | None = None  # [slots, slot bytes] uint8
        self._slots: np.ndarray | None = None  # the same memory, for byte copies
        self._free: list[int] = []

    @property
    def slot_bytes(self) -> int | None:
        return None if self._arena is None else self._arena.shape[1]

    def copy_out(
        self,
        ns: Namespace,
        hashes: list[int],
        kv_format: str,
        shape: tuple[int, ...] | None,
        to_device: ToDevice,
        dropped: Callable[[list[int]], None] | None = None,
    ) -> list[torch.Tensor | None]:
        """The leading run of `hashes` held here, as blocks of `kv_format` and `shape` on the
        device: `to_device` copies them there (into memory of its own: the slots may be reused
        once this returns) and returns once they are. A value whose header does not hold is
        dropped, counted as corrupt and passed to `dropped` (once the lock is released); the run
        ends before it."""
        views: list[torch.Tensor] = []
        corrupt: list[int] = []
        with self._lock:
            for h in hashes:
                entry = self._entries.get((ns.hex, h))
                if entry is None:
                    break
                slot = entry[1]
                try:
                    header = read_header(memoryview(self._slots[slot]))
                    expect_block(header, kv_format, shape)
                except CorruptBlock:
                    self.stats.corrupt += 1
                    self._forget((ns.hex, h))
                    corrupt.append(h)
                    break
                self._entries.move_to_end((ns.hex, h))
                self.stats.bytes_read += entry[2]
                payload = self._arena[slot, HEADER_SIZE:]
                views.append(payload.view(header.dtype).view(header.shape))
            blocks: list[torch.Tensor | None] = list(to_device(views))
        if corrupt and dropped is not None:
            dropped(corrupt)
        return blocks + [None] * (len(hashes) - len(blocks))

    def close(self) -> None:
        super().close()
        with self._lock:
            if self.pin and self._arena is not None:
                _unregister(self._arena)
            self._arena = self._slots = None
            self._free = []

    def _fits(self, size: int) -> bool:
        if self._arena is None and size <= self.capacity_bytes:
            slots = self.capacity_bytes // size
            self._arena = torch.empty((slots, size), dtype=torch.uint8)
            if self.pin and not _register(self._arena):
                self.pin = False  # loads still work, through the driver's staging copies
            self._slots = self._arena.numpy()
            self._free = list(range(slots - 1, -1, -1))
        return size == self.slot_bytes

    def _keep(self, value: bytes) -> int:
        slot = self._free.pop()  # _make_room left one: every value has the slot size
        self._slots[slot] = np.frombuffer(value, dtype=np.uint8)
        return slot

    def _value(self, kept: int) -> bytes:
        return self._slots[kept].tobytes()

    def _drop(self, kept: int) -> None:
        self._free.append(kept)


def _register(arena: torch.Tensor) -> bool:
    """Pins the arena where it lies (pin_memory=True would go through torch's caching host
    allocator, which rounds a size up to a power of two: up to twice the budget pinned).
    False, with a warning, when the driver refuses (a locked-memory limit, say)."""
    error = int(torch.cuda.cudart().cudaHostRegister(arena.data_ptr(), arena.nbytes, 0))
    if error:
        log.warning(
            "host tier left unpinned: pinning %d B failed (CUDA error %d)", arena.nbytes, error
        )
    return not error


def _unregister(arena: torch.Tensor) -> None:
    torch.cuda.cudart().cudaHostUnregister(arena.data_ptr())
