"""DiskTier: one file per block under a folder, byte budget with LRU, survives restarts.

Layout: <root>/<namespace hex>/<first 2 hex of hash>/<block hash hex>.kv (256-way fan-out per
namespace). A write goes to a temp file in the same folder and is renamed into place, so a reader
never sees half a value under the final name. At start the index is rebuilt from the folder (stat
only; LRU order = modification time); a value is verified (header + xxh64) when it is read, and a
damaged one is deleted and counted.

A full filesystem (ENOSPC / EDQUOT) caps the budget at the bytes the tier held when it filled up:
the least recently used files make room and the write is tried again (a few times: another
thread's write may take the room first), so the tier keeps turning over within the space it has
(a budget larger than the disk, or a disk others fill). The cap lifts after `full_cooldown_s`, to grow again where space was freed. When that does not help
(nothing of ours to drop, or EFBIG: a file-size limit) writes stop for `full_cooldown_s`; reads
keep working throughout.

Crash safety: a SIGKILL leaves at most `.tmp` files (deleted at the next start) and never a
half-written value under a final name; a machine crash can leave a renamed file whose bytes never
reached the disk, which the checksum catches on read. `fsync=True` (`--disk-fsync per-file`) syncs
each file before its rename and its folder after, so a block that was written survives a power loss
too, at the cost of one or two syncs per block; the default (`none`) relies on the checksum and
recomputes what a crash lost.

Retention (`retain`, a request's prompt_cache_retention): retained blocks leave the LRU for a
RetentionLedger (storage/retention.py) and are not evicted for room until their retention ends
(expired, or dropped past the ledger's byte budget, or the budget itself no longer fits): then
they rejoin the LRU at its cold end, as ordinary entries. A retained file's modification time is
set to its retention's deadline (a time in the future) and back to now when the retention ends, so
a restart finds the retentions still running: the files whose time is still ahead, retained again
for what is left of their 24 h (within the budget, oldest first out).
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from radixcache.shared.tier_names import TierName
from storage.base import SpillDown, TierStats
from storage.codec import CorruptBlock, verify_block
from storage.retention import RETAIN_S, RetentionLedger, RetentionStats

if TYPE_CHECKING:
    from radixcache.hashing import Namespace

SUFFIX = ".kv"
_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
_NO_SPACE_ERRNOS = {errno.ENOSPC, errno.EDQUOT}  # dropping files of ours frees room
_FULL_RETRIES = 3


def _is_hex(name: str, length: int) -> bool:
    return len(name) == length and all(c in "0123456789abcdef" for c in name)


class DiskTier:
    """Thread-safe; file I/O for reads happens outside the index lock."""

    name = TierName.DISK

    def __init__(
        self,
        root: Path | str,
        capacity_bytes: int,
        *,
        spill_down: SpillDown | None = None,
        full_cooldown_s: float = 30.0,
        fsync: bool = False,
        clock: Callable[[], float] = time.monotonic,
        retained_bytes: int = 0,
        retain_s: float = RETAIN_S,
    ) -> None:
        self.root = Path(root)
        self.fsync = fsync
        self.capacity_bytes = capacity_bytes
        self.spill_down = spill_down
        self.full_cooldown_s = full_cooldown_s
        self.stats = TierStats()
        self.writes_stopped_until = float("-inf")
        self.space_limit_bytes: float = float("inf")  # the filesystem's cap (see above)
        self.space_limit_until = float("-inf")
        self._clock = clock
        self._lock = threading.Lock()
        # key -> file size, LRU first: the files eviction may take (retained ones are not here)
        self._index: OrderedDict[tuple[str, int], int] = OrderedDict()
        self.retention: RetentionLedger[tuple[str, int]] = RetentionLedger(
            retained_bytes, retain_s, clock
        )
        self._used = 0
        self._namespaces: dict[str, Namespace] = {}  # seen in this process (for spilling lower)
        self._dirs: set[Path] = set()
        self.root.mkdir(parents=True, exist_ok=True)
        self._rebuild_index()

    # --- Tier interface ---
    def contains(self, ns: Namespace, hashes: list[int]) -> list[bool]:
        self._namespaces.setdefault(ns.hex, ns)
        nsx = ns.hex
        with self._lock:
            return [self._holds((nsx, h)) for h in hashes]

    def get(self, ns: Namespace, hashes: list[int]) -> list[bytes | None]:
        self._namespaces.setdefault(ns.hex, ns)
        return [self._read(ns.hex, h) for h in hashes]

    def put(self, ns: Namespace, items: list[tuple[int, bytes]]) -> None:
        self._namespaces.setdefault(ns.hex, ns)
        for h, value in items:
            self._write(ns.hex, h, value)

    def retain(self, ns: Namespace, items: list[tuple[int, bytes]]) -> None:
        """Writes a prefix's blocks (in prefix order) where missing and retains them (see the
        module's docstring). Tail first, each retained as soon as it is in, so the writes of
        its own blocks cannot evict the others, and the head's retention is the newest."""
        self._namespaces.setdefault(ns.hex, ns)
        for h, value in reversed(items):
            key = (ns.hex, h)
            self._write(ns.hex, h, value)
            with self._lock:
                size = self._index.pop(key, None) or self.retention.size_of(key)
                if size is not None:  # (None: the write was refused)
                    self._demote(self.retention.grant([(key, size)]))
                    self._stamp(key, time.time() + self.retention.duration_s)

    def retention_stats(self) -> RetentionStats:
        with self._lock:
            self._demote(self.retention.expire())
        return self.retention.snapshot()

    def delete(self, ns: Namespace, hashes: list[int]) -> None:
        with self._lock:
            for h in hashes:
                self._remove((ns.hex, h))

    def used_bytes(self) -> int:
        return self._used

    def __len__(self) -> int:
        return len(self._index) + len(self.retention)

    def close(self) -> None:
        pass

    def path_of(self, ns: Namespace, block_hash: int) -> Path:
        return self._path(ns.hex, block_hash)

    # --- internals ---
    def _path(self, nsx: str, h: int) -> Path:
        hx = f"{h:016x}"
        return self.root / nsx / hx[:2] / (hx + SUFFIX)

    def _read(self, nsx: str, h: int) -> bytes | None:
        key = (nsx, h)
        with self._lock:
            if not self._holds(key):
                return None
            if key in self._index:
                self._index.move_to_end(key)
        try:
            with open(self._path(nsx, h), "rb") as f:
                data = f.read()
        except FileNotFoundError:  # evicted or deleted meanwhile
            with self._lock:
                self._forget(key)
            return None
        except OSError:
            self.stats.errors += 1
            return None
        self.stats.bytes_read += len(data)
        try:
            verify_block(data)
        except CorruptBlock:
            self.stats.corrupt += 1
            with self._lock:
                self._remove(key)
            return None
        return data

    def _write(self, nsx: str, h: int, value: bytes) -> None:
        key = (nsx, h)
        with self._lock:
            if key in self._index:
                self._index.move_to_end(key)
                return
            if key in self.retention:
                return
        if len(value) > self.capacity_bytes or self._clock() < self.writes_stopped_until:
            self.stats.rejected_writes += 1
            return
        path = self._path(nsx, h)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        for attempt in range(_FULL_RETRIES + 1):
            try:
                self._write_tmp(tmp, value)
                break
            except OSError as e:
                # room is made by dropping LRU files, then the write is tried again; another
                # thread's write (the loader spills too) may take that room first, hence a few tries
                if (
                    attempt == _FULL_RETRIES
                    or e.errno not in _NO_SPACE_ERRNOS
                    or not self._cap_at_full(tmp, len(value))
                ):
                    self._write_failed(e, tmp)
                    return
        with self._lock:
            evicted = self._make_room(len(value))
            os.replace(tmp, path)
            self._index[key] = len(value)
            self._used += len(value)
        if self.fsync:
            self._sync_dir(path.parent)
        self.stats.bytes_written += len(value)
        self.stats.blocks_written += 1
        self._spill(evicted)

    def _write_tmp(self, tmp: Path, value: bytes) -> None:
        if tmp.parent not in self._dirs:
            tmp.parent.mkdir(parents=True, exist_ok=True)
            self._dirs.add(tmp.parent)
        with open(tmp, "wb") as f:
            f.write(value)
            if self.fsync:
                f.flush()
                os.fsync(f.fileno())

    def _cap_at_full(self, tmp: Path, size: int) -> bool:
        """The filesystem is full: cap the budget at what the tier holds and drop LRU files until
        `size` more bytes fit under it. False if the tier holds nothing to drop."""
        with self._lock:
            if not self._index and not len(self.retention):
                return False
            self.space_limit_bytes = self._used
            self.space_limit_until = self._clock() + self.full_cooldown_s
            evicted = self._make_room(size)
        self.stats.errors += 1
        tmp.unlink(missing_ok=True)
        self._spill(evicted)
        return True

    def _limit(self) -> float:
        """Under the lock: the byte budget, or the filesystem's cap while it holds."""
        if self._clock() >= self.space_limit_until:
            self.space_limit_bytes = float("inf")
        return min(self.capacity_bytes, self.space_limit_bytes)

    def _sync_dir(self, folder: Path) -> None:
        """Makes the rename itself durable (POSIX: the entry lives in the folder's data)."""
        try:
            fd = os.open(folder, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError:
            self.stats.errors += 1

    def _write_failed(self, e: OSError, tmp: Path) -> None:
        self.stats.errors += 1
        self.stats.rejected_writes += 1
        if e.errno in _FULL_ERRNOS:
            self.writes_stopped_until = self._clock() + self.full_cooldown_s
        tmp.unlink(missing_ok=True)

    def _make_room(self, size: int) -> list[tuple[str, int, bytes]]:
        """Under the lock: drop LRU files until `size` more bytes fit; returns what to spill."""
        evicted = []
        limit = self._limit()
        self._demote(self.retention.expire())
        while self._used + size > limit and (self._index or len(self.retention)):
            if not self._index:  # all that is left is retained: the oldest retention yields
                oldest = self.retention.drop_oldest()
                assert oldest is not None
                self._demote([oldest])
            key = next(iter(self._index))
            if self.spill_down is not None and key[0] in self._namespaces:
                with contextlib.suppress(OSError):
                    evicted.append((*key, self._path(*key).read_bytes()))
            self._remove(key)
            self.stats.evictions += 1
        return evicted

    def _spill(self, evicted: list[tuple[str, int, bytes]]) -> None:
        if self.spill_down is None:
            return
        for nsx, h, value in evicted:
            self.spill_down(self._namespaces[nsx], [(h, value)])

    def _holds(self, key: tuple[str, int]) -> bool:
        return key in self._index or key in self.retention

    def _demote(self, blocks: list[tuple[tuple[str, int], int]]) -> None:
        """Under the lock: blocks whose retention ended rejoin the LRU at its cold end."""
        for key, size in blocks:
            self._index[key] = size
            self._index.move_to_end(key, last=False)
            self._stamp(key, time.time())

    def _stamp(self, key: tuple[str, int], mtime: float) -> None:
        """A file's modification time: its retention's deadline, or now once it has none."""
        with contextlib.suppress(OSError):  # gone meanwhile: nothing to keep
            os.utime(self._path(*key), (mtime, mtime))

    def _remove(self, key: tuple[str, int]) -> None:
        """Under the lock: forget the key and delete its file."""
        if self._forget(key):
            self._path(*key).unlink(missing_ok=True)

    def _forget(self, key: tuple[str, int]) -> bool:
        size = self._index.pop(key, None)
        if size is None:
            size = self.retention.release(key)
        if size is None:
            return False
        self._used -= size
        return True

    def _rebuild_index(self) -> None:
        found: list[tuple[float, tuple[str, int], int]] = []
        for ns_dir in os.scandir(self.root):
            if not (ns_dir.is_dir() and _is_hex(ns_dir.name, 16)):
                continue
            for sub in os.scandir(ns_dir.path):
                if sub.is_dir() and _is_hex(sub.name, 2):
                    found += self._scan_fanout(ns_dir.name, sub)
        now = time.time()
        for mtime, key, size in sorted(found):
            self._used += size
            if mtime <= now:
                self._index[key] = size
                continue
            # a retention still running when the last process stopped: what is left of it
            left = min(mtime - now, self.retention.duration_s)
            with self._lock:
                self._demote(self.retention.grant([(key, size)], duration_s=left))
        with self._lock:
            self._make_room(0)  # the budget may have shrunk since the last run

    def _scan_fanout(self, nsx: str, sub: os.DirEntry) -> list[tuple[float, tuple[str, int], int]]:
        found = []
        for entry in os.scandir(sub.path):
            stem = entry.name[: -len(SUFFIX)]
            if entry.name.endswith(".tmp"):  # a write interrupted by a crash
                Path(entry.path).unlink(missing_ok=True)
            elif entry.name.endswith(SUFFIX) and _is_hex(stem, 16) and stem[:2] == sub.name:
                st = entry.stat()
                found.append((st.st_mtime, (nsx, int(stem, 16)), st.st_size))
        return found
