"""Spill-tier benchmark: load-back vs recompute, tier bandwidth vs raw, multi-round chat per tier set.

    python benchmarks/bench_tiers.py                       # all three sections, default model
    python benchmarks/bench_tiers.py --sections bandwidth  # one section
    python benchmarks/bench_tiers.py --quick               # smaller sizes (smoke run)

Prints a table per section and writes benchmarks/results/bench_tiers.json. Starts its own
redis-server on a free loopback port. Disk numbers are page-cache reads (files just written).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import redis
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from radixcache.hashing import Namespace, block_hashes  # noqa: E402
from storage import DiskTier, RedisTier, TierConfig, TieredStore, encode_block  # noqa: E402
from tests.redis_server import RedisServer  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "bench_tiers.json"
# SmolLM2-135M: 30 layers, 3 KV heads, head_dim 64, bfloat16, 16-token blocks
DEFAULT_BLOCK = (30, 2, 16, 3, 64)
BATCH = 32  # blocks per tier call, as TieredStore.load_prefix does


def table(title: str, header: list[str], rows: list[list]) -> None:
    cells = [header] + [[f"{c:.3f}" if isinstance(c, float) else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    print(f"\n{title}")
    for i, r in enumerate(cells):
        print("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))
        if i == 0:
            print("  ".join("-" * w for w in widths))


def timed(fn: Callable[[], object]) -> float:
    """Seconds one call takes; its result (the data read, held like a caller would) is freed after."""
    gc.collect()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def median_gbps(
    nbytes: int, fns: dict[str, Callable[[], object]], repeats: int
) -> dict[str, float]:
    """Runs the candidates interleaved `repeats` times (after a warm-up); GB/s of the median."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        fn()
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(timed(fn))
    return {name: nbytes / statistics.median(t) / 1e9 for name, t in times.items()}


# --- section 2: tier bandwidth vs the raw limit ---
def bench_bandwidth(server: RedisServer, num_blocks: int, repeats: int) -> list[dict]:
    ns = Namespace("bench-bandwidth", "bfloat16", DEFAULT_BLOCK[2])
    hashes = block_hashes(ns, list(range(num_blocks * ns.block_size)))
    gen = torch.Generator().manual_seed(0)
    values = [
        (h, encode_block(torch.randn(DEFAULT_BLOCK, generator=gen).bfloat16())) for h in hashes
    ]
    nbytes = sum(len(v) for _, v in values)
    batches = [hashes[i : i + BATCH] for i in range(0, len(hashes), BATCH)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        disk = DiskTier(tmp, 1 << 40)
        disk.put(ns, values)
        paths = [[disk.path_of(ns, h) for h in b] for b in batches]
        store = TieredStore(TierConfig(deadline_s=600), tiers=[disk])
        gbps = median_gbps(
            nbytes,
            {
                "raw": lambda: [[p.read_bytes() for p in b] for b in paths],
                "get": lambda: [disk.get(ns, b) for b in batches],
                "load": lambda: store.load_prefix(ns, hashes),
            },
            repeats,
        )
        store.close()
    rows.append({"tier": "disk", "baseline": "file reads (open+read)", **gbps})
    tier = RedisTier(server.url, prefix="bench", socket_timeout_s=30)
    tier.put(ns, values)
    client = redis.Redis(port=server.port, socket_timeout=30)
    keys = [[tier.key(ns, h) for h in b] for b in batches]

    def raw_redis() -> list[list[bytes]]:
        out = []
        for b in keys:
            pipe = client.pipeline(transaction=False)
            for k in b:
                pipe.get(k)
            out.append(pipe.execute())
        return out

    store = TieredStore(TierConfig(deadline_s=600), tiers=[tier])
    gbps = median_gbps(
        nbytes,
        {
            "raw": raw_redis,
            "get": lambda: [tier.get(ns, b) for b in batches],
            "load": lambda: store.load_prefix(ns, hashes),
        },
        repeats,
    )
    store.close()
    rows.append({"tier": "redis", "baseline": "pipelined GET (redis-py)", **gbps})
    table(
        f"Tier read bandwidth: {num_blocks} blocks of {len(values[0][1]):,} B "
        f"({nbytes / 1e6:.0f} MB), batches of {BATCH}, median of {repeats}",
        [
            "tier",
            "raw baseline",
            "raw GB/s",
            "tier get GB/s",
            "get/raw",
            "load_prefix GB/s",
            "load/raw",
        ],
        [
            [
                r["tier"],
                r["baseline"],
                r["raw"],
                r["get"],
                r["get"] / r["raw"],
                r["load"],
                r["load"] / r["raw"],
            ]
            for r in rows
        ],
    )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", default="loadback,bandwidth,chat")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    sections = set(args.sections.split(","))
    torch.manual_seed(0)
    results: dict[str, object] = {"quick": args.quick}
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp))
        server.start()
        try:
            if "bandwidth" in sections:
                results["bandwidth"] = bench_bandwidth(
                    server, 128 if args.quick else 512, 3 if args.quick else 7
                )
        finally:
            server.stop()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2))
    print(f"\nwrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
