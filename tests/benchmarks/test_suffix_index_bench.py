"""bench_suffix_index at a small bound: the index keeps to it past the bound, repetitive text
holds fewer keys than random text, and a context from a held run drafts."""

from __future__ import annotations

from benchmarks.bench_suffix_index import bench


def test_rows_at_a_small_bound() -> None:
    rows = {kind: bench(kind, 20_000, 100, (4, 3)) for kind in ("random", "repetitive")}
    for row in rows.values():
        assert 19_900 <= row["tokens_held"] <= 20_000
        assert row["bytes_per_token"] > 0 and row["add_us_per_token"] > 0
        assert row["hit_share"] == 1.0
    assert rows["random"]["keys"] > 1.9 * rows["random"]["tokens_held"]  # two n-gram sizes
    assert rows["repetitive"]["keys"] < rows["random"]["keys"] / 2
