import pytest

from radixcache.block_pool import BlockPool, BlockPoolError


def test_take_and_decref_round_trip():
    pool = BlockPool(4)
    ids = pool.take(3)
    assert sorted(ids) == [0, 1, 2] and pool.num_free() == 1 and pool.num_private() == 3
    pool.incref([ids[0]])
    assert pool.decref(ids[0]) == 1 and pool.num_free() == 1
    for b in ids:
        pool.decref(b)
    assert pool.num_free() == 4 and pool.num_private() == 0


def test_double_free_and_bad_ids_raise():
    pool = BlockPool(2)
    (b,) = pool.take(1)
    pool.decref(b)
    with pytest.raises(BlockPoolError):
        pool.decref(b)
    with pytest.raises(BlockPoolError):
        pool.incref([5])


def test_adopted_block_is_not_freed_by_private_refs():
    pool = BlockPool(2)
    (b,) = pool.take(1)
    pool.incref([b])
    assert pool.adopt_many([b]) == [b]  # a second holder remains
    with pytest.raises(BlockPoolError):
        pool.adopt_many([b])  # already owned
    assert pool.decref(b) == 0
    assert pool.num_free() == 1  # owned by the tree, not free
    pool.release_owned([b])
    assert pool.num_free() == 2


@pytest.mark.parametrize("n", [3, 300])  # the set and the scatter repeat checks
def test_adopt_checks_runs_and_scattered_ids_alike(n: int):
    pool = BlockPool(4 * n)
    run = pool.take(2 * n)  # consecutive ids: checked through a slice
    scattered = run[::2]
    assert pool.adopt_many(scattered) == [] and pool.owned(scattered[-1])
    rest = run[1::2]
    with pytest.raises(BlockPoolError):
        pool.adopt_many(rest + [rest[0]])  # a repeat
    with pytest.raises(BlockPoolError):
        pool.adopt_many(rest + [scattered[0]])  # owned already
    with pytest.raises(BlockPoolError):
        pool.adopt_many([-1] + rest)
    with pytest.raises(BlockPoolError):
        pool.adopt_many(rest + [4 * n])
    assert pool.num_private() == n  # nothing changed by the failed calls
    more = pool.take(n)
    pool.incref(more[:1])
    assert pool.adopt_many(more) == more[:1]  # a second holder remains
    pool.release_owned(scattered)
    assert pool.num_free() == 4 * n - 3 * n + n


def test_hash_index_keeps_the_first_block_of_a_colliding_hash():
    pool = BlockPool(4)
    pool.index_hashes([0, 1], [10, 11])
    assert pool.cached_block(11) == 1 and pool.hash_collisions == 0
    pool.index_hashes([2], [11])  # a collision: block 1 keeps the entry
    assert pool.cached_block(11) == 1 and pool.hash_collisions == 1
    pool.unindex_hashes([2], [11])
    assert pool.cached_block(11) == 1
    pool.unindex_hashes([0, 1], [10, 11])
    assert pool.hash_index == {} and pool.cached_block(10) is None
