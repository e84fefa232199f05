"""The disk tier on a filesystem that fills up (a real tmpfs, ENOSPC): smaller than the budget, or
filled by someone else. The tier keeps taking new blocks within the space it has, its byte count
stays its files', and nothing is left half-written."""

from __future__ import annotations

import errno
from pathlib import Path

from radixcache.hashing import Namespace
from storage.disk import DiskTier
from tests.storage.blocks import chain, encoded
from tests.tmpfs import tmpfs

FS_BYTES = 64 << 10  # 16 pages: each block file takes one


def files_of(root: Path) -> dict[Path, int]:
    return {p: p.stat().st_size for p in root.rglob("*.kv")}


def test_a_disk_smaller_than_the_budget_keeps_turning_over(tmp_path: Path, ns: Namespace) -> None:
    now = [0.0]
    with tmpfs(tmp_path / "fs", FS_BYTES) as root:
        tier = DiskTier(root, 1 << 20, full_cooldown_s=10.0, clock=lambda: now[0])
        hashes = chain(ns, 40)
        for item in encoded(hashes):
            tier.put(ns, [item])
        # the newest blocks are there (without the cap, writes stopped when the disk filled)
        assert tier.contains(ns, hashes[-4:]) == [True] * 4
        assert tier.get(ns, hashes[-1:]) != [None]
        assert tier.stats.errors >= 1 and tier.stats.evictions > 0  # under its byte budget
        assert tier.writes_stopped_until == float("-inf")
        files = files_of(root)
        assert tier.used_bytes() == sum(files.values()) and len(tier) == len(files)
        assert tier.space_limit_bytes < FS_BYTES
        assert not list(root.rglob("*.tmp"))
        now[0] = 11.0  # after the cool-down the cap lifts (to grow where space was freed)
        tier.put(ns, encoded(chain(ns, 1, start=10_000)))
        assert tier.used_bytes() == sum(files_of(root).values())


def test_a_disk_filled_by_others_stops_writes_reads_continue(tmp_path: Path, ns: Namespace) -> None:
    now = [0.0]
    with tmpfs(tmp_path / "fs", FS_BYTES) as root:
        tier = DiskTier(root / "kv", 1 << 20, full_cooldown_s=10.0, clock=lambda: now[0])
        ballast = root / "ballast"
        with open(ballast, "wb", buffering=0) as f:
            try:
                while f.write(b"\0" * 4096):
                    pass
            except OSError as e:
                assert e.errno == errno.ENOSPC
        hashes = chain(ns, 2)
        tier.put(ns, encoded(hashes[:1]))  # nothing of its own to drop: writes stop
        assert tier.writes_stopped_until == 10.0 and tier.stats.errors == 1
        assert tier.contains(ns, hashes[:1]) == [False] and tier.used_bytes() == 0
        assert not list(root.rglob("*.tmp"))
        ballast.unlink()
        now[0] = 11.0
        tier.put(ns, encoded(hashes[1:]))
        assert tier.contains(ns, hashes) == [False, True]
        assert tier.used_bytes() == sum(files_of(root / "kv").values())


class RoomTakenOnce(DiskTier):
    """Another writer (the loader's spills share the tier) takes the room the first drop made,
    before the retry: a page of ballast written right after it."""

    def __init__(self, *args, ballast: Path, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.ballast = ballast
        self.taken = 0

    def _cap_at_full(self, tmp: Path, size: int) -> bool:
        made = super()._cap_at_full(tmp, size)
        if made and not self.taken:
            with open(self.ballast, "ab", buffering=0) as f:
                self.taken = f.write(b"\0" * 4096)
        return made


def test_room_taken_by_another_write_is_made_again(tmp_path: Path, ns: Namespace) -> None:
    with tmpfs(tmp_path / "fs", FS_BYTES) as root:
        tier = RoomTakenOnce(root / "kv", 1 << 20, ballast=root / "ballast")
        hashes = chain(ns, 24)
        for item in encoded(hashes):
            tier.put(ns, [item])
        assert tier.taken == 4096  # the race happened
        # the write was tried again (more room made) rather than writes stopping for the cool-down
        assert tier.writes_stopped_until == float("-inf")
        assert tier.contains(ns, hashes[-4:]) == [True] * 4
        assert tier.used_bytes() == sum(files_of(root / "kv").values())
        assert not list(root.rglob("*.tmp"))
