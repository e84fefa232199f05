"""`python -m benchmarks.bench_policy --tiers`: the Mooncake trace through the KV manager, a small
device pool and the spill tiers below it (host RAM, disk: benchmarks/tier_replay.py); hit rate
per level next to the unlimited-cache ceiling and Belady, and what a tier hit costs at the
default model's block size against the prefill it saves (benchmarks/tier_load_cost.py).

Sizes are fractions of the trace's unique blocks (one 16-token block per trace id); a block is
the default model's 16 tokens of bf16 KV (tier_load_cost.model_block_bytes) wherever bytes are
reported. Prints two tables, writes benchmarks/results/policy_tiers.json (--quick: a prefix of
the trace and small load checks, written only with --out).
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
from benchmarks.tier_replay import BS, LEVELS, ReplayResult, Sizes, replay_tiers
from engine.kv.quant import kv_format
from radixcache.policy import POLICIES, make_policy

QUICK_REQUESTS = 400
PREFILL_SOURCE = RESULTS / "bench_model.json"  # its prefill-1024 bfloat16 row
PREFILL_ROW = ("prefill-1024", "bfloat16")
SHM = "/dev/shm"
COST_HEADER = [
    "tier",
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
        choices=("auto", "int8"),
        help="the tiers' block format (auto: the pool's bf16)",
    )
    g.add_argument(
        "--replay-dir",
        default=SHM if Path(SHM).is_dir() else None,
        help="where the replay's disk tier makes its temp folder (default: tmpfs %(default)s, "
        "so its ~180k block files go quickly; the load costs use the system temp folder)",
    )
    g.add_argument("--out", help="results name (default policy_tiers; --quick: none)")


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


def check_tier_format(name: str) -> None:
    """The hook for quantized tier blocks: the tiers store the device pool's blocks as they are
    (no tier quantization on main yet), so only auto is accounted; int8 (engine/kv/quant.py's
    format, bytes_per_block(..., kv_format)) goes in here and in tier_load_cost when it lands."""
    if kv_format(name) is not None:
        raise SystemExit(
            f"--tier-kv-dtype {name}: the spill tiers have no quantized format yet (they store "
            "the device pool's bf16 blocks); only auto is measured"
        )


def sizes_for(unique: int, args: argparse.Namespace) -> Sizes:
    return Sizes(
        device=max(1, round(args.device_frac * unique)),
        host=round(args.host_frac * unique),
        disk=round(args.disk_frac * unique),
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


def hit_rows(result: ReplayResult, sizes: Sizes) -> list[dict]:
    """Per level: blocks it holds, blocks it served (the replay's count and the store's)."""
    gib = tier_load_cost.model_block_bytes() / 2**30
    held = {"device": sizes.device, "host": sizes.host, "disk": sizes.disk}
    rows = [
        {
            "section": "hits",
            "level": str(level),
            "blocks": held[level],
            "model_gib": held[level] * gib,
            "hit_blocks": result.hits[level],
            "hit_rate": result.rate(level),
            "store_hits": None if level == "device" else result.tier_stats[level].hits,
        }
        for level in LEVELS
        if held[level]
    ]
    total = sum(held.values())
    rows.append(
        {
            "section": "hits",
            "level": "total",
            "blocks": total,
            "model_gib": total * gib,
            "hit_blocks": result.hit_blocks,
            "hit_rate": result.rate(),
        }
    )
    return rows


def cost_rows(costs: list[LoadCost], prefill: Prefill, result: ReplayResult) -> list[dict]:
    """Per tier: a load per block against the prefill of a block; the replay's reads beside."""
    recompute_us = prefill.ms_per_token * BS * 1e3
    rows = []
    for c in costs:
        stats = result.tier_stats.get(c.tier)
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


def print_tables(rows: list[dict], result: ReplayResult, unique: int) -> None:
    hits = [r for r in rows if r["section"] == "hits"]
    limits = [r for r in rows if r["section"] == "bounds"]
    costs = [r for r in rows if r["section"] == "cost"]
    bi.print_table(
        f"Mooncake trace through the KV manager and tiers: {result.requests:,} requests, "
        f"{result.lookups:,} blocks looked up, {unique:,} unique (one {BS}-token block per "
        f"trace id); GiB: of the default model's bf16 KV; replay {result.seconds:.0f} s",
        ["level", "blocks", "GiB", "hit blocks", "hit rate"],
        [[r["level"], r["blocks"], r["model_gib"], r["hit_blocks"], r["hit_rate"]] for r in hits]
        + [[r["label"], r["blocks"] or "", "", "", r["hit_rate"]] for r in limits],
    )
    bi.print_table(
        f"Cost of a tier hit per {BS}-token block of the default model (bf16, "
        f"{tier_load_cost.model_block_bytes():,} B): load + copy into the pool (median and "
        "fastest of the reps) against the prefill it saves; replay get: the tier's read in the "
        "replay above (its tiny blocks)",
        COST_HEADER,
        [cost_cells(r) for r in costs],
    )


def cost_cells(r: dict) -> list:
    get = "" if r["replay_get_us"] is None else r["replay_get_us"]
    return [r["tier"], r["load_us"], r["load_us_min"], r["recompute_us"],
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
    check_tier_format(args.tier_kv_dtype)
    prefill = prefill_cost(args.prefill_ms_per_token)
    trace = bi.load_trace()
    trace = trace[: args.requests or (QUICK_REQUESTS if args.quick else len(trace))]
    unique = bi.unique_blocks(trace)
    sizes = sizes_for(unique, args)
    result = replay_tiers(trace, sizes, replay_root / "disk", args.policy)
    cost_blocks, reps = (8, 3) if args.quick else (args.cost_blocks, 7)
    costs = tier_load_cost.measure(cost_root, cost_blocks, reps, args.cost_threads)
    rows = hit_rows(result, sizes) + bounds(trace, sizes, args.policy)
    rows += cost_rows(costs, prefill, result)
    meta = {
        "requests": result.requests,
        "lookups": result.lookups,
        "unique_blocks": unique,
        "block_size": BS,
        "model_block_bytes": tier_load_cost.model_block_bytes(),
        "sizes": asdict(sizes),
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


def run(args: argparse.Namespace) -> None:
    """Measures, prints; writes results/<--out or policy_tiers>.json (--quick: only with --out)."""
    roots = [Path(tempfile.mkdtemp(prefix="policy-tiers-", dir=d)) for d in (args.replay_dir, None)]
    try:
        report = measure(args, *roots)
    finally:
        for root in roots:
            shutil.rmtree(root, ignore_errors=True)
    print_tables(report.rows, report.result, report.unique_blocks)
    if args.out or not args.quick:
        path = write_results(args.out or "policy_tiers", report.rows, **report.meta)
        print(f"\nwrote {path}")
