from __future__ import annotations

import os
import resource
import signal
from pathlib import Path

from radixcache.hashing import Namespace
from storage.codec import HEADER_SIZE
from storage.disk import DiskTier
from tests.storage.blocks import VALUE_BYTES, chain, encoded


def test_lru_budget_and_fanout_layout(tmp_path: Path, ns: Namespace) -> None:
    tier = DiskTier(tmp_path, 3 * VALUE_BYTES)
    hashes = chain(ns, 4)
    tier.put(ns, encoded(hashes[:3]))
    tier.get(ns, [hashes[0]])
    tier.put(ns, encoded(hashes[3:]))
    assert tier.contains(ns, hashes) == [True, False, True, True]
    assert tier.stats.evictions == 1
    path = tier.path_of(ns, hashes[0])
    assert path.parent.parent.name == ns.hex and path.parent.name == f"{hashes[0]:016x}"[:2]
    files = sorted(tmp_path.rglob("*"))
    assert sum(1 for p in files if p.is_file()) == 3  # evicted file removed, no temp files left
    assert not tier.path_of(ns, hashes[1]).exists()


def test_restart_rebuilds_the_index(tmp_path: Path, ns: Namespace) -> None:
    hashes = chain(ns, 5)
    items = encoded(hashes)
    DiskTier(tmp_path, 10 * VALUE_BYTES).put(ns, items)
    # leftovers of a crash mid-write and foreign files are not blocks
    (tmp_path / ns.hex / "00").mkdir(exist_ok=True)
    (tmp_path / ns.hex / "00" / ".0000000000000001.kv.1.2.tmp").write_bytes(b"partial")
    (tmp_path / "README").write_text("not a block")
    again = DiskTier(tmp_path, 10 * VALUE_BYTES)
    assert len(again) == 5 and again.used_bytes() == 5 * VALUE_BYTES
    assert again.get(ns, hashes) == [v for _, v in items]
    assert not list(tmp_path.rglob("*.tmp"))
    # a smaller budget at restart drops the oldest files
    smaller = DiskTier(tmp_path, 2 * VALUE_BYTES)
    assert len(smaller) == 2 and smaller.used_bytes() <= 2 * VALUE_BYTES


def test_corrupt_and_truncated_files_are_discarded_and_counted(
    tmp_path: Path, ns: Namespace
) -> None:
    hashes = chain(ns, 4)
    items = encoded(hashes)
    DiskTier(tmp_path, 10 * VALUE_BYTES).put(ns, items)
    tier = DiskTier(tmp_path, 10 * VALUE_BYTES)
    flipped = tier.path_of(ns, hashes[1])
    data = bytearray(flipped.read_bytes())
    data[HEADER_SIZE + 3] ^= 0x40
    flipped.write_bytes(bytes(data))
    truncated = tier.path_of(ns, hashes[2])
    truncated.write_bytes(truncated.read_bytes()[:100])
    assert tier.get(ns, hashes) == [items[0][1], None, None, items[3][1]]
    assert tier.stats.corrupt == 2
    assert not flipped.exists() and not truncated.exists()
    assert tier.contains(ns, hashes) == [True, False, False, True]
    assert tier.used_bytes() == 2 * VALUE_BYTES


def test_tiny_budget_stops_writes_reads_continue(tmp_path: Path, ns: Namespace) -> None:
    tier = DiskTier(tmp_path, VALUE_BYTES - 1)
    tier.put(ns, encoded(chain(ns, 3)))
    assert len(tier) == 0 and tier.stats.rejected_writes == 3
    assert tier.get(ns, chain(ns, 3)) == [None] * 3


def test_disk_full_stops_writes_for_a_cooldown(tmp_path: Path, ns: Namespace) -> None:
    now = [0.0]
    tier = DiskTier(tmp_path, 100 * VALUE_BYTES, full_cooldown_s=10.0, clock=lambda: now[0])
    hashes = chain(ns, 4)
    tier.put(ns, encoded(hashes[:1]))
    # a real write failure: files may not grow past VALUE_BYTES // 2 (EFBIG, like a full disk)
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (VALUE_BYTES // 2, old_limit[1]))
    try:
        tier.put(ns, encoded(hashes[1:2]))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)
    assert tier.stats.errors == 1 and tier.writes_stopped_until == 10.0
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]
    tier.put(ns, encoded(hashes[2:3]))  # still inside the cool-down: refused without I/O
    assert tier.stats.rejected_writes == 2
    assert tier.get(ns, hashes[:1]) != [None]  # serving continues
    now[0] = 11.0
    tier.put(ns, encoded(hashes[3:4]))
    assert tier.contains(ns, hashes) == [True, False, False, True]
    assert os.path.getsize(tier.path_of(ns, hashes[3])) == VALUE_BYTES
