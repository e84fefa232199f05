"""The tier-aware Mooncake replay (`python -m benchmarks.bench_policy --tiers --quick`): the first
400 requests through the real KV manager, a device pool of 5% of their blocks, a host RAM tier
and a disk tier, holding bf16 blocks (auto) or int8 ones in the same bytes; its counts must add
up, stay under their bounds, agree with the store's own counters, bring back the right KV, and
leave no block referenced."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import pytest
import torch

from benchmarks import policy_tiers
from benchmarks.policy_tiers import Report
from benchmarks.tier_replay import id_rows, row_top, tiny_value_bytes
from engine.kv.quant import INT8, KV_FORMATS, dequantize, quantize

BF16_VALUE = 56 + 30 * 2 * 16 * 3 * 64 * 2  # codec header + the default model's bf16 block
INT8_VALUE = 56 + 30 * 2 * 16 * 3 * (64 + 4)  # its int8 rows: codes + a float32 scale each


def quick_args(*extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    policy_tiers.add_args(parser)
    return parser.parse_args(["--quick", *extra])


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Report]:
    """The quick report for a --tier-kv-dtype, measured once per module."""
    done: dict[str, Report] = {}

    def get(tier_kv_dtype: str) -> Report:
        if tier_kv_dtype not in done:
            root = tmp_path_factory.mktemp(f"policy-tiers-{tier_kv_dtype}")
            args = quick_args("--tier-kv-dtype", tier_kv_dtype)
            done[tier_kv_dtype] = policy_tiers.measure(args, root / "replay", root / "cost")
        return done[tier_kv_dtype]

    return get


@pytest.fixture(params=["auto", "int8"])
def report(request: pytest.FixtureRequest, measured: Callable[[str], Report]) -> Report:
    return measured(request.param)


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


def test_load_costs_are_measured_per_tier_and_format_against_the_recompute(
    report: Report,
) -> None:
    costs = {(r["tier"], r["format"]): r for r in report.rows if r["section"] == "cost"}
    tier_format = report.meta["tier_format"]
    formats = {"bfloat16", tier_format}  # a quantized run measures bf16's rows beside its own
    assert set(costs) == {(t, f) for t in ("host", "disk", "disk-cold") for f in formats}
    value = {"bfloat16": BF16_VALUE, "int8": INT8_VALUE}
    prefill = report.meta["prefill_ms_per_token"]
    for (tier, fmt), c in costs.items():
        assert c["value_bytes"] == value[fmt] == c["block_bytes"] + 56
        assert 0 < c["load_us_min"] <= c["load_us"]
        assert c["recompute_us"] == pytest.approx(prefill * 16 * 1e3)
        assert c["recompute_over_load"] == pytest.approx(c["recompute_us"] / c["load_us"])
        if tier != "disk-cold":  # the replay's reads, beside the rows of its own format
            assert (c["replay_get_us"] is not None) == (fmt == tier_format)
    assert costs["host", tier_format]["replay_get_us"] > 0
    assert costs["disk", tier_format]["replay_get_us"] > 0


def test_an_int8_tier_holds_188x_the_blocks_in_bf16s_bytes(
    measured: Callable[[str], Report],
) -> None:
    auto, int8 = measured("auto"), measured("int8")
    budget = auto.meta["tier_budget_bytes"]
    assert int8.meta["tier_budget_bytes"] == budget
    assert budget["host"] == round(0.2 * auto.unique_blocks) * BF16_VALUE
    a, q = rows(auto, "hits", "level"), rows(int8, "hits", "level")
    assert a["host"]["blocks"] == budget["host"] // BF16_VALUE
    assert q["host"]["blocks"] == budget["host"] // INT8_VALUE
    assert q["host"]["blocks"] / a["host"]["blocks"] == pytest.approx(1.882, abs=1e-3)
    int8_bytes = q["host"]["model_gib"] * 2**30
    assert budget["host"] - INT8_VALUE < int8_bytes <= budget["host"]  # all but a block's part
    # the real host tier ends full, of as many blocks in the tiny pool's encoding
    assert auto.result.held_bytes["host"] == a["host"]["blocks"] * tiny_value_bytes()
    assert int8.result.held_bytes["host"] == q["host"]["blocks"] * tiny_value_bytes(INT8)
    # the disk holds every block either way: what the host keeps more, the disk serves less
    assert int8.result.hits["host"] > auto.result.hits["host"]
    assert int8.result.hit_blocks == auto.result.hit_blocks


@pytest.mark.parametrize("name", sorted(KV_FORMATS))
def test_the_stand_in_kv_survives_each_quantized_format_exactly(name: str) -> None:
    fmt = KV_FORMATS[name]
    ids = [0, 1, 7, 8, 4095, 182_789, 8**7 - 1]
    rows_ = id_rows(ids, row_top(fmt))
    assert torch.equal(dequantize(quantize(rows_, fmt), fmt, torch.bfloat16), rows_)
    lossy = id_rows(ids, 1.0)  # without the top value, the rows' scales round their digits
    assert not torch.equal(dequantize(quantize(lossy, fmt), fmt, torch.bfloat16), lossy)
