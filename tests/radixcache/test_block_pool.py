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
