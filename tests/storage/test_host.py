"""The host tier's LRU and budget, for both ways of keeping its values: bytes (a CPU pool's) and
slots of one arena (a GPU pool's, unpinned here)."""

from __future__ import annotations

from functools import partial

import pytest

from radixcache.hashing import Namespace
from storage.host import HostTier
from storage.pinned_host import PinnedHostTier
from tests.storage.blocks import VALUE_BYTES, chain, encoded


@pytest.fixture(params=["bytes", "slots"])
def make_tier(request):
    return {"bytes": HostTier, "slots": partial(PinnedHostTier, pin=False)}[request.param]


def test_lru_keeps_within_budget_and_spills_oldest(ns: Namespace, make_tier) -> None:
    spilled: list[tuple[Namespace, list[int]]] = []
    tier = make_tier(
        3 * VALUE_BYTES, spill_down=lambda n, items: spilled.append((n, [h for h, _ in items]))
    )
    hashes = chain(ns, 5)
    tier.put(ns, encoded(hashes[:3]))
    tier.get(ns, [hashes[0]])  # touch: hashes[1] is now least recently used
    tier.put(ns, encoded(hashes[3:5]))
    assert tier.contains(ns, hashes) == [True, False, False, True, True]
    assert tier.used_bytes() == 3 * VALUE_BYTES <= tier.capacity_bytes
    assert tier.stats.evictions == 2
    assert spilled == [(ns, [hashes[1], hashes[2]])]


def test_value_over_budget_is_rejected(ns: Namespace, make_tier) -> None:
    tier = make_tier(VALUE_BYTES - 1)
    tier.put(ns, encoded(chain(ns, 1)))
    assert len(tier) == 0 and tier.stats.rejected_writes == 1


def test_rewrite_of_a_present_block_only_touches_it(ns: Namespace, make_tier) -> None:
    tier = make_tier(2 * VALUE_BYTES)
    a, b, c = chain(ns, 3)
    tier.put(ns, encoded([a, b]))
    tier.put(ns, encoded([a]))  # a becomes most recent
    tier.put(ns, encoded([c]))
    assert tier.contains(ns, [a, b, c]) == [True, False, True]
    assert tier.stats.blocks_written == 3


def test_a_large_value_evicts_as_many_small_ones_as_it_needs(ns: Namespace) -> None:
    """Bytes values of any size: room for a value three times the others' takes three of them
    (the budget holds after every put)."""
    tier = HostTier(4 * VALUE_BYTES)
    small = encoded(chain(ns, 4))
    tier.put(ns, small)
    big = (chain(ns, 1, start=500)[0], small[0][1] * 3)
    tier.put(ns, [big])
    assert tier.used_bytes() <= tier.capacity_bytes
    assert tier.contains(ns, [h for h, _ in small]) == [False, False, False, True]
    assert tier.stats.evictions == 3
