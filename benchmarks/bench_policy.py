"""Eviction policies and the online miss-ratio curve on the Mooncake trace and synthetic workloads.

Run: python -m benchmarks.bench_policy. Prints tables, writes benchmarks/results/policy.json.
With --tiers: the trace through the real KV manager and spill tiers instead (policy_tiers.py).
"""

from __future__ import annotations

import argparse
import bisect
import json
import random
import statistics
import sys
import time
from pathlib import Path

from sortedcontainers import SortedList

from benchmarks import bench_index as bi
from benchmarks import policy_tiers
from radixcache import Namespace, PrefixCache, block_hashes
from radixcache.policy import FrequencyAgeingPolicy, LRUPolicy
from radixcache.policy_learned import LearnedReusePolicy

HERE = Path(__file__).resolve().parent

POLICIES = {"LRU": LRUPolicy, "freq-ageing": FrequencyAgeingPolicy, "learned": LearnedReusePolicy}
NEW = "learned"
OLD = "freq-ageing"
SYNTH_FRACTIONS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0)
MRC_RATIOS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
BS = 16
Request = tuple[list[int], list[int]]  # (prompt looked up, tokens inserted after the request)


# --- synthetic workloads (shapes of DESIGN.md) ---
def gsp_small(rng: random.Random) -> list[Request]:
    reqs = []
    for _ in range(8):
        system = bi.rand_tokens(rng, 1024)
        for _ in range(8):
            prompt = system + bi.rand_tokens(rng, 64)
            reqs.append((prompt, prompt + bi.rand_tokens(rng, 32)))
    random.Random(1).shuffle(reqs)
    return reqs


def mt_small(
    rng: random.Random, users: int = 8, turns: int = 4, system: int = 512
) -> list[Request]:
    prefix = bi.rand_tokens(rng, system)
    history = [list(prefix) for _ in range(users)]
    reqs = []
    for _ in range(turns):
        for u in range(users):
            prompt = history[u] + bi.rand_tokens(rng, 64)
            history[u] = prompt + bi.rand_tokens(rng, 32)
            reqs.append((prompt, history[u]))
    return reqs


def as_requests(prompts: list[list[int]]) -> list[Request]:
    return [(p, p) for p in prompts]


def workloads() -> dict[str, list[Request]]:
    return {
        "GSP-small": gsp_small(random.Random(11)),
        "MT-small": mt_small(random.Random(12)),
        "GSP-64x16": as_requests(bi.shared_prefix_trace(random.Random(2))),
        "MT-64x8": as_requests(bi.multi_turn_trace(random.Random(3))),
    }


def replay_requests(reqs: list[Request], capacity: int, policy) -> float:  # noqa: ANN001
    """Block hit rate of prompt lookups (engine order: match tokens[:-1], then insert)."""
    ns = Namespace("synthetic", "bfloat16", BS)
    cache = PrefixCache(capacity, BS, policy=policy, mrc_sample_rate=None)
    hits = total = 0
    for prompt, full in reqs:
        hits += bi.serve_request(cache, ns, prompt[:-1], full, BS)
        total += (len(prompt) - 1) // BS
    return hits / total


def chained_ids(reqs: list[Request]) -> tuple[list[list[int]], list[int]]:
    """Block ids (chained hashes) inserted per request and how many of them are looked up."""
    ns = Namespace("synthetic", "bfloat16", BS)
    return [block_hashes(ns, full) for _, full in reqs], [(len(p) - 1) // BS for p, _ in reqs]


def belady(trace: list[list[int]], lookups: list[int], capacity: int) -> float:
    """Offline optimum (furthest next use goes first), hits counted over the looked-up blocks."""
    never = len(trace)
    nxt: list[list[int]] = [[] for _ in trace]
    last: dict[int, int] = {}
    for r in range(len(trace) - 1, -1, -1):
        nxt[r] = [last.get(h, never) for h in trace[r]]
        for h in trace[r][: lookups[r]]:
            last[h] = r
    order, key = SortedList(), {}
    hits = total = 0
    for r, ids in enumerate(trace):
        for h in ids[: lookups[r]]:
            if h not in key:
                break
            hits += 1
        total += lookups[r]
        for depth, (h, n) in enumerate(zip(ids, nxt[r], strict=True)):
            if h in key:
                order.remove(key[h])
            key[h] = (n, depth, h)
            order.add(key[h])
        while len(order) > capacity:
            del key[order.pop()[2]]
    return hits / total


def synthetic_tables() -> dict[str, list[dict]]:
    out = {}
    for name, reqs in workloads().items():
        ids, lookups = chained_ids(reqs)
        uniq = len({h for r in ids for h in r})
        rows = []
        for frac in SYNTH_FRACTIONS:
            cap = max(1, round(frac * uniq))
            row = {"fraction": frac, "blocks": cap}
            for pname, factory in POLICIES.items():
                row[pname] = replay_requests(reqs, cap, factory())
            row["belady"] = belady(ids, lookups, cap)
            rows.append(row)
        out[name] = rows
        bi.print_table(
            f"{name}: {len(reqs)} requests, {uniq:,} unique {BS}-token blocks; block hit rate",
            ["pool", "blocks", "LRU", OLD, NEW, "Belady", f"{NEW}-LRU"],
            [
                [
                    f"{r['fraction']:.0%}",
                    r["blocks"],
                    r["LRU"],
                    r[OLD],
                    r[NEW],
                    r["belady"],
                    r[NEW] - r["LRU"],
                ]
                for r in rows
            ],
        )
    return out


# --- Mooncake ---
class ReuseOracle:
    """Benchmark-only bound: the learned policy's GreedyDual, told by the trace's future whether
    each block will be looked up again (P = 1 or 0). What a perfect reuse predictor would reach."""

    name = "oracle"

    def __init__(self, trace: list[list[int]], id_of_hash: dict[int, int]) -> None:
        self.id_of_hash = id_of_hash
        self.uses: dict[int, list[int]] = {}
        for r, ids in enumerate(trace):
            for h in ids:
                self.uses.setdefault(h, []).append(r)
        self.now = 0
        self.clock = 0.0

    def attach(self, num_blocks: int) -> None:
        pass

    def set_request(self, r: int) -> None:
        self.now = r

    def _value(self, block_hash: int) -> float:
        uses = self.uses[self.id_of_hash[block_hash]]
        reused = bisect.bisect_right(uses, self.now) < len(uses)
        return self.clock + (1.0 if reused else 0.01)

    def on_insert(self, node, tick: int) -> None:  # noqa: ANN001
        body = node.hashes[:-1] or node.hashes  # a one-block node is all tail
        node.prio = max(self._value(h) for h in body)
        node.tail_prio = self._value(node.hashes[-1])

    def on_access(self, node, tick: int, hit: bool) -> None:  # noqa: ANN001
        if hit:
            node.prio = max(self._value(h) for h in node.hashes)

    def record_eviction(self, node, hashes: tuple[int, ...]) -> None:  # noqa: ANN001
        self.clock = max(self.clock, node.evict_prio)


def mooncake_table(trace: list[list[int]]) -> list[dict]:
    uniq = bi.unique_blocks(trace)
    ceiling = bi.unlimited_hit_rate(trace)
    id_of_hash = bi.trace_hashes(trace)
    rows = []
    for frac in bi.FRACTIONS:
        cap = round(frac * uniq)
        row = {"fraction": frac, "blocks": cap, "unlimited": ceiling}
        for pname, factory in POLICIES.items():
            r = bi.replay(trace, cap, factory())
            row[pname] = r["hit_rate"]
            row[f"{pname}_us_per_request"] = r["seconds"] / len(trace) * 1e6
        oracle = ReuseOracle(trace, id_of_hash)
        row["oracle"] = bi.replay(trace, cap, oracle, on_request=oracle.set_request)["hit_rate"]
        row["belady"] = bi.belady_hit_rate(trace, cap)
        rows.append(row)
        print(f"  ... {frac:.0%} done", file=sys.stderr, flush=True)
    bi.print_table(
        f"Mooncake conversation trace: {len(trace):,} requests, {uniq:,} unique 512-token blocks; "
        "block hit rate; oracle = the learned policy's GreedyDual told whether each block is read "
        "again; us = CPU us per request (match + allocate/evict + insert)",
        [
            "pool",
            "blocks",
            "LRU",
            OLD,
            NEW,
            "oracle",
            "Belady",
            "unlimited",
            "LRU/Bel",
            "new/Bel",
            "new-LRU",
            "LRU us",
            "new us",
        ],
        [
            [
                f"{r['fraction']:.0%}",
                r["blocks"],
                r["LRU"],
                r[OLD],
                r[NEW],
                r["oracle"],
                r["belady"],
                r["unlimited"],
                r["LRU"] / r["belady"],
                r[NEW] / r["belady"],
                r[NEW] - r["LRU"],
                r["LRU_us_per_request"],
                r[f"{NEW}_us_per_request"],
            ]
            for r in rows
        ],
    )
    return rows


def mrc_table(trace: list[list[int]], exact: dict[int, float]) -> dict:
    """The curve a 10% pool estimates online vs exact LRU replays at each size."""
    uniq = bi.unique_blocks(trace)
    pool = round(0.10 * uniq)
    rate = 512 / 4096  # the PrefixCache default: one sampled block per 4,096 tokens
    runs = {"on": [], "off": []}
    for _ in range(2):  # alternate, keep the fastest: the machine is shared
        for label, r in (("off", None), ("on", rate)):
            runs[label].append(bi.replay(trace, pool, LRUPolicy(), mrc_sample_rate=r))
    on = min(runs["on"], key=lambda r: r["seconds"])
    off = min(runs["off"], key=lambda r: r["seconds"])
    estimated = on["cache"].miss_ratio_curve(MRC_RATIOS)
    rows = []
    for p in estimated:
        if p.size_blocks not in exact:
            exact[p.size_blocks] = bi.replay(trace, p.size_blocks, LRUPolicy())["hit_rate"]
        rows.append(
            {
                "ratio": p.size_ratio,
                "blocks": p.size_blocks,
                "estimated": p.hit_rate,
                "exact": exact[p.size_blocks],
            }
        )
    overhead = on["seconds"] / off["seconds"] - 1
    bi.print_table(
        f"Online miss-ratio curve of a {pool:,}-block LRU pool (sample rate {rate:g}) vs exact "
        f"LRU replays; sampling overhead {overhead:+.1%} of index CPU time",
        ["size", "blocks", "est. hit", "exact hit", "abs err"],
        [
            [
                f"{r['ratio']:g}x",
                r["blocks"],
                r["estimated"],
                r["exact"],
                abs(r["estimated"] - r["exact"]),
            ]
            for r in rows
        ],
    )
    return {"pool": pool, "sample_rate": rate, "overhead": overhead, "rows": rows}


def mrc_overhead_small_blocks(pairs: int = 41) -> dict:
    """Sampling overhead on the block-size-16 shared-prefix trace (engine-like requests): the
    median over `pairs` back-to-back runs without and with sampling (the machine is shared)."""
    reqs = bi.shared_prefix_trace(random.Random(2))
    bi.settle()

    def run(rate: float | None) -> float:
        cache = PrefixCache(sum(len(r) for r in reqs) // BS + 1, BS, mrc_sample_rate=rate)
        t0 = time.thread_time()
        for toks in reqs:
            m = cache.match(bi.NS, toks[:-1])
            blocks = cache.allocate(len(toks) // BS - len(m.block_ids))
            res = cache.insert(bi.NS, toks, m.block_ids + blocks)
            cache.free(res.duplicates)
        return (time.thread_time() - t0) / len(reqs) * 1e6

    runs = [(run(None), run(BS / 4096)) for _ in range(pairs)]
    out = {
        "off": statistics.median(off for off, _ in runs),
        "on": statistics.median(on for _, on in runs),
        "overhead": statistics.median(on / off - 1 for off, on in runs),
    }
    print(
        f"\nsampling overhead, block size 16 shared-prefix trace: {out['off']:.1f} -> "
        f"{out['on']:.1f} CPU us per request (median of {pairs} pairs: {out['overhead']:+.1%})"
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tiers", action="store_true", help="the tier-aware replay")
    policy_tiers.add_args(parser)
    args = parser.parse_args()
    if args.tiers:
        policy_tiers.run(args)
        return
    out: dict = {"synthetic": synthetic_tables()}
    trace = bi.load_trace()
    out["mooncake"] = mooncake_table(trace)
    exact = {r["blocks"]: r["LRU"] for r in out["mooncake"]}
    out["mrc"] = mrc_table(trace, exact)
    out["mrc_overhead_bs16"] = mrc_overhead_small_blocks()
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "policy.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
