"""The slot tier (storage/pinned_host.py) with its arena in ordinary memory: what a GPU pool's
host tier does, on a CPU (tests/engine/test_cuda.py runs it pinned, loading into the GPU)."""

from __future__ import annotations

import pytest
import torch

from radixcache.hashing import Namespace
from storage.codec import HEADER_SIZE, decode_block, encode_block
from storage.config import TierConfig
from storage.disk import DiskTier
from storage.pinned_host import PinnedHostTier
from storage.tiered import TieredStore
from storage.transfer import DeviceCopies
from tests.storage.blocks import BLOCK_SHAPE, VALUE_BYTES, chain, encoded, make_block

COPIES = DeviceCopies("cpu")


def copy_out(tier: PinnedHostTier, ns: Namespace, hashes: list[int]) -> list:
    return tier.copy_out(ns, hashes, "bfloat16", BLOCK_SHAPE, COPIES.copy_to_device)


def test_slots_are_reused_and_a_value_of_another_size_refused(ns: Namespace) -> None:
    tier = PinnedHostTier(3 * VALUE_BYTES + 7, pin=False)
    hashes = chain(ns, 6)
    tier.put(ns, encoded(hashes))
    assert tier.slot_bytes == VALUE_BYTES and len(tier) == 3
    assert tier.contains(ns, hashes) == [False] * 3 + [True] * 3
    assert tier.get(ns, hashes[3:]) == [v for _, v in encoded(hashes)[3:]]
    small = encode_block(make_block(0)[:, :, :2])
    tier.put(ns, [(chain(ns, 1, start=999)[0], small)])
    assert tier.stats.rejected_writes == 1 and len(tier) == 3


def test_copy_out_gives_the_blocks_and_owns_their_memory(ns: Namespace) -> None:
    tier = PinnedHostTier(2 * VALUE_BYTES, pin=False)
    a, b, c = chain(ns, 3)
    tier.put(ns, encoded([a, b]))
    blocks = copy_out(tier, ns, [a, b, c])
    assert blocks[2] is None  # the run ends at the first block missing
    for i, block in enumerate(blocks[:2]):
        assert torch.equal(block, make_block(i))
    tier.put(ns, encoded([c], seed=7))  # evicts a: its slot now holds c
    assert torch.equal(blocks[0], make_block(0))
    assert torch.equal(copy_out(tier, ns, [c])[0], make_block(7))
    assert tier.stats.bytes_read == 3 * VALUE_BYTES


def test_a_slot_whose_header_broke_is_dropped_and_ends_the_run(ns: Namespace) -> None:
    tier = PinnedHostTier(3 * VALUE_BYTES, pin=False)
    hashes = chain(ns, 3)
    tier.put(ns, encoded(hashes))
    slot = tier._entries[(ns.hex, hashes[1])][1]
    tier._arena[slot, :4] = 0  # the magic
    blocks = copy_out(tier, ns, hashes)
    assert blocks[0] is not None and blocks[1:] == [None, None]
    assert tier.stats.corrupt == 1 and tier.contains(ns, hashes) == [True, False, True]
    assert tier.used_bytes() == 2 * VALUE_BYTES


def test_a_block_of_another_shape_is_not_handed_out(ns: Namespace) -> None:
    tier = PinnedHostTier(VALUE_BYTES, pin=False)
    (h,) = chain(ns, 1)
    tier.put(ns, encoded([h]))
    assert tier.copy_out(ns, [h], "bfloat16", (1, *BLOCK_SHAPE), COPIES.copy_to_device) == [None]
    assert tier.stats.corrupt == 1


def test_a_store_over_the_slot_tier_spills_to_disk_and_loads_from_both(
    ns: Namespace, tmp_path
) -> None:
    """Through the TieredStore: blocks stored as tensors land in slots; the slots' evictions go
    down to disk as encoded values; a load takes the run from both tiers, promoting disk's."""
    config = TierConfig(host_bytes=2 * VALUE_BYTES, disk_path=tmp_path)
    host = PinnedHostTier(config.host_bytes, pin=False)
    store = TieredStore(config, tiers=[host, DiskTier(tmp_path, config.disk_bytes)])
    hashes = chain(ns, 4)
    store.store(ns, [(h, make_block(i)) for i, h in enumerate(hashes)])
    assert store.wait_idle(10)
    assert store.locate(ns, hashes) == ["disk", "disk", "host", "host"]
    loaded = store.load_prefix(ns, hashes, deadline_s=10, shape=BLOCK_SHAPE)
    assert loaded.tiers == ["disk", "disk", "host", "host"]
    for i, block in enumerate(loaded.blocks):
        assert torch.equal(block, make_block(i))
    assert store.wait_idle(10)
    assert store.locate(ns, hashes[:2]) == ["host", "host"]  # promoted
    store.close()


class Changes:
    """A TierObserver that keeps what it is told: (tier, "stored" / "removed", hashes)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, list[int]]] = []

    def stored(self, tier: str, ns: Namespace, hashes: list[int]) -> None:
        self.seen.append((tier, "stored", hashes))

    def removed(self, tier: str, ns: Namespace, hashes: list[int]) -> None:
        self.seen.append((tier, "removed", hashes))


def test_a_corrupt_slot_met_by_a_load_is_reported_removed(ns: Namespace) -> None:
    """KV events (a router's view of this replica) hear of the slot dropped, as of any other."""
    changes = Changes()
    host = PinnedHostTier(3 * VALUE_BYTES, pin=False)
    store = TieredStore(TierConfig(host_bytes=host.capacity_bytes), tiers=[host], observer=changes)
    hashes = chain(ns, 3)
    store.store(ns, [(h, make_block(i)) for i, h in enumerate(hashes)])
    assert store.wait_idle(10)
    host._arena[host._entries[(ns.hex, hashes[1])][1], :4] = 0  # the magic
    loaded = store.load_prefix(ns, hashes, deadline_s=10, shape=BLOCK_SHAPE)
    assert loaded.tiers == ["host"]
    assert changes.seen[-1] == ("host", "removed", [hashes[1]])
    assert host.contains(ns, hashes) == [True, False, True]
    store.close()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_payload_views_are_aligned_for_their_dtype(ns: Namespace, dtype: torch.dtype) -> None:
    value = encode_block(make_block(3, dtype))
    tier = PinnedHostTier(3 * len(value), pin=False)
    hashes = chain(ns, 3)
    tier.put(ns, [(h, value) for h in hashes])
    fmt = str(dtype).removeprefix("torch.")
    blocks = tier.copy_out(ns, hashes, fmt, BLOCK_SHAPE, COPIES.copy_to_device)
    want = decode_block(value, dtype, BLOCK_SHAPE)
    assert HEADER_SIZE % 8 == 0 and all(torch.equal(b, want) for b in blocks)


def test_a_snapshot_is_a_copy(ns: Namespace) -> None:
    pool = make_block(0)
    (snap,), ready = COPIES.snapshot([pool])
    ready()
    pool.zero_()
    assert torch.equal(snap, make_block(0))


def test_loads_racing_writes_never_see_a_reused_slot(ns: Namespace) -> None:
    """The writer keeps putting blocks (every put evicts, so slots are reused) while this thread
    copies out whatever the tier holds: every block it gets is the one stored under its hash."""
    import threading

    tier = PinnedHostTier(4 * VALUE_BYTES, pin=False)
    hashes = chain(ns, 64)
    values = dict(encoded(hashes))
    want = {h: make_block(i) for i, h in enumerate(hashes)}
    enough, done = threading.Event(), threading.Event()

    def write() -> None:  # until this thread has checked 300 blocks
        rounds = 0
        while not enough.is_set() and rounds < 10_000:
            for h in hashes:
                tier.put(ns, [(h, values[h])])
            rounds += 1
        done.set()

    checked = 0
    writer = threading.Thread(target=write)
    writer.start()
    while not done.is_set():
        for h in hashes[checked % 7 :: 7]:
            (block,) = copy_out(tier, ns, [h])
            if block is not None:
                assert torch.equal(block, want[h])
                checked += 1
        if checked >= 300:
            enough.set()
    writer.join()
    assert checked >= 300 and tier.stats.evictions > 300
