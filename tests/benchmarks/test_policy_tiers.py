"""The tier-aware Mooncake replay (`python -m benchmarks.bench_policy --tiers --quick`): the first
400 requests through the real KV manager, a device pool of 5% of their blocks, a host RAM tier
and a disk tier; its counts must add up, stay under their bounds, agree with the store's own
counters, bring back the right KV, and leave no block referenced."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from benchmarks import policy_tiers
from benchmarks.policy_tiers import Report


def quick_args(*extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    policy_tiers.add_args(parser)
    return parser.parse_args(["--quick", *extra])


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Report:
    root = tmp_path_factory.mktemp("policy-tiers")
    return policy_tiers.measure(quick_args(), root / "replay", root / "cost")


def rows(report: Report, section: str, key: str) -> dict[str, dict]:
    return {r[key]: r for r in report.rows if r["section"] == section}


def test_hit_rates_add_up_and_stay_within_their_bounds(report: Report) -> None:
    hits, bounds = rows(report, "hits", "level"), rows(report, "bounds", "bound")
    levels = [hits[name] for name in ("device", "host", "disk")]
    total = hits["total"]
    assert sum(r["hit_blocks"] for r in levels) == total["hit_blocks"]
    assert sum(r["hit_rate"] for r in levels) == pytest.approx(total["hit_rate"])
    assert total["hit_blocks"] == pytest.approx(total["hit_rate"] * report.result.lookups)
    assert total["hit_blocks"] <= report.result.lookups
    ceiling = bounds["unlimited"]["hit_rate"]
    assert total["hit_rate"] <= ceiling
    assert total["hit_rate"] <= bounds["belady_device_tiers"]["hit_rate"]
    assert hits["device"]["hit_rate"] <= bounds["belady_device"]["hit_rate"]
    # the disk holds every block the trace has: the tiers bring back all the device lost
    assert ceiling - total["hit_rate"] <= 0.01


def test_a_tiny_device_pool_gets_hits_from_each_tier(report: Report) -> None:
    hits = rows(report, "hits", "level")
    assert hits["device"]["blocks"] == round(0.05 * report.unique_blocks)
    assert hits["host"]["hit_blocks"] > 0
    assert hits["disk"]["hit_blocks"] > 0
    loads = report.result.loads
    assert loads.found > 0
    assert loads.found_blocks == hits["host"]["hit_blocks"] + hits["disk"]["hit_blocks"]


def test_each_tier_hit_is_counted_once_and_brings_back_its_own_kv(report: Report) -> None:
    result = report.result
    for level in ("host", "disk"):  # the sequences' count against the store's
        assert rows(report, "hits", "level")[level]["store_hits"] == result.hits[level]
    store = result.store_stats
    assert store.loaded_blocks == result.hits["host"] + result.hits["disk"]
    assert store.dropped_blocks == store.deadline_misses == store.load_errors == 0
    assert result.wrong_blocks == 0


def test_no_block_is_left_referenced(report: Report) -> None:
    assert report.result.requests == policy_tiers.QUICK_REQUESTS
    assert report.result.referenced_at_end == 0


def test_load_costs_are_measured_per_tier_against_the_recompute(report: Report) -> None:
    costs = rows(report, "cost", "tier")
    assert set(costs) == {"host", "disk", "disk-cold"}
    prefill = report.meta["prefill_ms_per_token"]
    for c in costs.values():
        assert c["block_bytes"] == 30 * 2 * 16 * 3 * 64 * 2  # the default model's bf16 block
        assert 0 < c["load_us_min"] <= c["load_us"]
        assert c["recompute_us"] == pytest.approx(prefill * 16 * 1e3)
        assert c["recompute_over_load"] == pytest.approx(c["recompute_us"] / c["load_us"])
    assert costs["host"]["replay_get_us"] > 0 and costs["disk"]["replay_get_us"] > 0


def test_quantized_tier_blocks_are_refused_until_the_tiers_have_them(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="no quantized format yet"):
        policy_tiers.measure(quick_args("--tier-kv-dtype", "int8"), tmp_path, tmp_path)
