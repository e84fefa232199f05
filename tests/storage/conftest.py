"""Fixtures of the storage tests (blocks and hashes are in tests/storage/blocks.py)."""

from __future__ import annotations

import pytest

from radixcache.hashing import Namespace


@pytest.fixture
def ns() -> Namespace:
    return Namespace(model_id="tiny-test-model", kv_dtype="bfloat16", block_size=4)
