"""`python -m benchmarks.bench_policy --tiers`: the Mooncake trace through the KV manager, a small
device pool and the spill tiers below it (host RAM, disk: benchmarks/tier_replay.py); hit rate
per level next to the unlimited-cache ceiling and Belady, and what a tier hit costs at the
default model's block size against the prefill it saves (benchmarks/tier_load_cost.py).

Sizes are fractions of the trace's unique blocks (one 16-token block per trace id); a block is
the default model's 16 tokens of KV wherever bytes are reported. The device pool holds bf16
blocks. The host and disk tiers are byte budgets: what their fraction of the blocks takes in
bf16, encoded (tier_load_cost.model_value_bytes); with --tier-kv-dtype int8 / fp8 the tiers hold
quantized blocks, so the same bytes hold ~1.88x the blocks. Prints two tables, writes
benchmarks/results/policy_tiers.json (policy_tiers_<format>.json for a quantized tier format;
--quick: a prefix of the trace and small load checks, written only with --out).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks import bench_index as bi
from benchmarks import tier_load_cost
from benchmarks.results_io import RESULTS, write_results
from benchmarks.tier_load_cost import LoadCost
from benchmarks.tier_replay import BS, LEVELS, ReplayResult, Sizes, replay_tiers, tiny_value_bytes
from engine.kv.quant import KV_FORMATS, KVFormat, kv_format
from radixcache.policy import POLICIES, make_policy

QUICK_REQUESTS = 400
PREFILL_SOURCE = RESULTS / "bench_model.json"  # its prefill-1024 bfloat16 row
PREFILL_ROW = ("prefill-1024", "bfloat16")
SHM = "/dev/shm"
COST_HEADER = [
    "tier",
    "format",
    "block B",
    "load us",
    "min us",
    "recompute us",
    "recompute/load",
    "spill us",
    "replay get us",
]


def add_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("--tiers (tier-aware replay)")
    g.add_argument("--quick", action="store_true", help="a trace prefix and small load checks")
    g.add_argument("--requests", type=int, help="replay the first N requests (default: all)")
    g.add_argument("--device-frac", type=float, default=0.05, help="device pool, of unique blocks")
    g.add_argument("--host-frac", type=float, default=0.20, help="host RAM tier (0: none)")
    g.add_argument("--disk-frac", type=float, default=1.0, help="disk tier (0: none)")
    g.add_argument("--policy", default="lru", choices=sorted(POLICIES), help="device eviction")
    g.add_argument(
        "--prefill-ms-per-token",
        type=float,
        help=f"recompute cost (default: {PREFILL_SOURCE.name}, {' '.join(PREFILL_ROW)} row)",
    )
    g.add_argument("--cost-blocks", type=int, default=64, help="blocks per load-cost load")
    g.add_argument(
        "--cost-threads",
        type=int,
        default=1,
        help="torch threads while the load costs are measured (tier_load_cost.measure)",
    )
    g.add_argument(
        "--tier-kv-dtype",
        default="auto",
        choices=("auto", *KV_FORMATS),
        help="the tiers' block format (auto: the pool's bf16; the others quantized, in the "
        "same byte budgets)",
    )
    g.add_argument(
        "--replay-dir",
        default=SHM if Path(SHM).is_dir() else None,
        help="where the replay's disk tier makes its temp folder (default: tmpfs %(default)s, "
        "so its ~180k block files go quickly; the load costs use the system temp folder)",
    )
    g.add_argument(
        "--out",
        help="results name (default policy_tiers, policy_tiers_<format> for a quantized "
        "--tier-kv-dtype; --quick: none)",
    )


@dataclass(frozen=True)
class Prefill:
    ms_per_token: float
    source: str


def prefill_cost(flag: float | None) -> Prefill:
    """The default model's prefill time per token: the flag, else the CPU model benchmark's."""
    if flag is not None:
        return Prefill(flag, "--prefill-ms-per-token")
    rows = json.loads(PREFILL_SOURCE.read_text())["rows"]
    row = next(r for r in rows if (r["workload"], r["dtype"]) == PREFILL_ROW)
    where = f"benchmarks/results/{PREFILL_SOURCE.name} {' '.join(PREFILL_ROW)}"
    return Prefill(row["ms"] / row["tokens"], f"{where} ({row['ms']} ms / {row['tokens']} tok)")


@dataclass(frozen=True)
class Budgets:
    """The tiers' byte budgets at the default model's block size: `frac` of the unique blocks
    in bf16, encoded."""

    host: int
    disk: int


def budgets_for(unique: int, args: argparse.Namespace) -> Budgets:
    bf16 = tier_load_cost.model_value_bytes()
    return Budgets(round(args.host_frac * unique) * bf16, round(args.disk_frac * unique) * bf16)


def sizes_for(unique: int, args: argparse.Namespace, budgets: Budgets) -> Sizes:
    """Blocks per level: the device's fraction of the unique blocks; the tiers' budgets over a
    block encoded in the tier format (the replay's tiny blocks get the same counts)."""
    value = tier_load_cost.model_value_bytes(kv_format(args.tier_kv_dtype))
    return Sizes(
        device=max(1, round(args.device_frac * unique)),
        host=budgets.host // value,
        disk=budgets.disk // value,
    )


def bounds(trace: list[list[int]], sizes: Sizes, policy: str) -> list[dict]:
    """Hit rates the replay is measured against (blocks hit / blocks looked up)."""
    everything = sizes.device + sizes.host + sizes.disk
    device_only = bi.replay(trace, sizes.device, make_policy(policy))["hit_rate"]
    rates = [
        ("unlimited", "ceiling: every block seen kept", None, bi.unlimited_hit_rate(trace)),
        ("belady_device", "Belady at the device's size", sizes.device,
         bi.belady_hit_rate(trace, sizes.device)),
        ("belady_device_tiers", "Belady at device + host + disk", everything,
         bi.belady_hit_rate(trace, everything)),
        ("device_only", f"device alone ({policy}, index replay)", sizes.device, device_only),
    ]  # fmt: skip
    return [
        {"section": "bounds", "bound": key, "label": label, "blocks": blocks, "hit_rate": rate}
        for key, label, blocks, rate in rates
    ]


def hit_rows(result: ReplayResult, sizes: Sizes, fmt: KVFormat | None) -> list[dict]:
    """Per level: blocks it holds, their bytes at the default model's size (the device's pool
    rows, a tier's encoded blocks), blocks it served (the replay's count and the store's)."""
    held = {"device": sizes.device, "host": sizes.host, "disk": sizes.disk}
    value = tier_load_cost.model_value_bytes(fmt)
    block = {"device": tier_load_cost.model_block_bytes(), "host": value, "disk": value}
    rows = [
        {
            "section": "hits",
            "level": str(level),
            "blocks": held[level],
            "model_gib": held[level] * block[level] / 2**30,
            "hit_blocks": result.hits[level],
            "hit_rate": result.rate(level),
            "store_hits": None if level == "device" else result.tier_stats[level].hits,
        }
        for level in LEVELS
        if held[level]
    ]
    rows.append(
        {
            "section": "hits",
            "level": "total",
            "blocks": sum(held.values()),
            "model_gib": sum(r["model_gib"] for r in rows),
            "hit_blocks": result.hit_blocks,
            "hit_rate": result.rate(),
        }
    )
    return rows


def cost_rows(
    costs: list[LoadCost], prefill: Prefill, result: ReplayResult, replay_format: str
) -> list[dict]:
    """Per tier and format: a load per block against the prefill of a block; the replay's reads
    beside (in the format the replay's tiers held)."""
    recompute_us = prefill.ms_per_token * BS * 1e3
    rows = []
    for c in costs:
        stats = result.tier_stats.get(c.tier) if c.format == replay_format else None
        get_us = stats.load_time_s / stats.hits * 1e6 if stats and stats.hits else None
        rows.append(
            {
                "section": "cost",
                **asdict(c),
                "replay_get_us": get_us,
                "recompute_us": recompute_us,
                "recompute_over_load": recompute_us / c.load_us,
            }
        )
    return rows


def print_tables(report: Report) -> None:
    rows = report.rows
    hits = [r for r in rows if r["section"] == "hits"]
    limits = [r for r in rows if r["section"] == "bounds"]
    costs = [r for r in rows if r["section"] == "cost"]
    result, meta = report.result, report.meta
    bi.print_table(
        f"Mooncake trace through the KV manager and tiers: {result.requests:,} requests, "
        f"{result.lookups:,} blocks looked up, {report.unique_blocks:,} unique (one {BS}-token "
        f"block per trace id); tiers hold {meta['tier_format']} blocks "
        f"({meta['tier_value_bytes']:,} B each at the default model's size; the budgets: bf16's "
        f"{meta['bf16_value_bytes']:,} B x the fractions); GiB: the default model's device pool "
        f"/ encoded tier blocks; replay {result.seconds:.0f} s",
        ["level", "blocks", "GiB", "hit blocks", "hit rate"],
        [[r["level"], r["blocks"], r["model_gib"], r["hit_blocks"], r["hit_rate"]] for r in hits]
        + [[r["label"], r["blocks"] or "", "", "", r["hit_rate"]] for r in limits],
    )
    bi.print_table(
        f"Cost of a tier hit per {BS}-token block of the default model (block B: the stored "
        "payload; bf16 pool): load (+ dequantize) + copy into the pool (median and fastest of "
        "the reps) against the prefill it saves; spill: (quantize +) encode + write; replay "
        "get: the tier's read in the replay above (its tiny blocks)",
        COST_HEADER,
        [cost_cells(r) for r in costs],
    )


def cost_cells(r: dict) -> list:
    get = "" if r["replay_get_us"] is None else r["replay_get_us"]
    return [r["tier"], r["format"], r["block_bytes"], r["load_us"], r["load_us_min"],
            r["recompute_us"],
            r["recompute_over_load"], r["spill_us"], get]  # fmt: skip


@dataclass(frozen=True)
class Report:
    rows: list[dict]
    result: ReplayResult
    unique_blocks: int
    meta: dict


def measure(args: argparse.Namespace, replay_root: Path, cost_root: Path) -> Report:
    """The replay (its disk tier under `replay_root`), its bounds, the load costs (their disk
    tier under `cost_root`)."""
    fmt = kv_format(args.tier_kv_dtype)
    prefill = prefill_cost(args.prefill_ms_per_token)
    trace = bi.load_trace()
    trace = trace[: args.requests or (QUICK_REQUESTS if args.quick else len(trace))]
    unique = bi.unique_blocks(trace)
    budgets = budgets_for(unique, args)
    sizes = sizes_for(unique, args, budgets)
    result = replay_tiers(trace, sizes, replay_root / "disk", args.policy, args.tier_kv_dtype)
    cost_blocks, reps = (8, 3) if args.quick else (args.cost_blocks, 7)
    formats = tuple(dict.fromkeys(("auto", args.tier_kv_dtype)))  # bf16's rows beside
    costs = tier_load_cost.measure(cost_root, cost_blocks, reps, args.cost_threads, formats)
    tier_format = "bfloat16" if fmt is None else fmt.name
    rows = hit_rows(result, sizes, fmt) + bounds(trace, sizes, args.policy)
    rows += cost_rows(costs, prefill, result, tier_format)
    meta = {
        "requests": result.requests,
        "lookups": result.lookups,
        "unique_blocks": unique,
        "block_size": BS,
        "model_block_bytes": tier_load_cost.model_block_bytes(),
        "tier_format": tier_format,
        "tier_value_bytes": tier_load_cost.model_value_bytes(fmt),
        "bf16_value_bytes": tier_load_cost.model_value_bytes(),
        "tier_budget_bytes": asdict(budgets),
        "sizes": asdict(sizes),
        "held_blocks": {
            name: used // tiny_value_bytes(fmt) for name, used in result.held_bytes.items()
        },
        "fractions": {"device": args.device_frac, "host": args.host_frac, "disk": args.disk_frac},
        "policy": args.policy,
        "tier_kv_dtype": args.tier_kv_dtype,
        "prefill_ms_per_token": prefill.ms_per_token,
        "prefill_source": prefill.source,
        "cost_threads": args.cost_threads,
        "replay_disk": "tmpfs" if str(replay_root).startswith(SHM) else "disk",
        "replay_seconds": result.seconds,
        "loads": asdict(result.loads),
        "wrong_blocks": result.wrong_blocks,
        "referenced_at_end": result.referenced_at_end,
        "store": asdict(result.store_stats),
    }
    return Report(rows, result, unique, meta)


def results_name(args: argparse.Namespace) -> str:
    quantized = args.tier_kv_dtype != "auto"
    return "policy_tiers" + (f"_{args.tier_kv_dtype}" if quantized else "")


def run(args: argparse.Namespace) -> None:
    """Measures, prints; writes results/<--out or results_name>.json (--quick: only with --out)."""
    roots = [Path(tempfile.mkdtemp(prefix="policy-tiers-", dir=d)) for d in (args.replay_dir, None)]
    try:
        report = measure(args, *roots)
    finally:
        for root in roots:
            shutil.rmtree(root, ignore_errors=True)
    print_tables(report)
    if args.out or not args.quick:
        path = write_results(args.out or results_name(args), report.rows, **report.meta)
        print(f"\nwrote {path}")
