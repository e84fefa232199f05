"""Prefix index benchmarks: micro latencies (vs a flat dict of chained hashes) and Mooncake hit rates.

Run: python -m benchmarks.bench_index [--quick] [--sglang-python PATH]. Prints tables, writes
benchmarks/results/index.json. With --sglang-python (an interpreter with SGLang installed, see
../shared/PEERS.md) the same token traces and eviction trees are replayed through SGLang's
RadixCache by benchmarks/sglang_index_runner.py in the same run, alternating with ours.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import subprocess
import tempfile
import time
from array import array
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from sortedcontainers import SortedList

from benchmarks.sglang_index_runner import evict_sequences
from radixcache import Namespace, PrefixCache, block_hashes

HERE = Path(__file__).resolve().parent


TRACE = HERE.parent.parent / "shared" / "data" / "mooncake_conversation_trace.jsonl"
BS = 16
NS = Namespace("bench-model", "bfloat16", BS)
VOCAB = 49152
FRACTIONS = (0.01, 0.02, 0.05, 0.10, 0.20, 0.40)


def rand_tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(100, VOCAB - 100) for _ in range(n)]


def clock() -> int:
    """CPU time of this thread (ns): the machine is shared, so wall time is noisy."""
    return time.thread_time_ns()


def settle() -> None:
    """Move the inputs built so far out of the GC's way (as a server does after start-up)."""
    gc.collect()
    gc.freeze()


def timed(fn: Callable[[], object]) -> float:
    t0 = clock()
    fn()
    return (clock() - t0) / 1e3


class FlatDictCache:
    """The simplest correct alternative (vLLM / nano-vllm): chained hash -> block id, LRU order."""

    def __init__(self, ns: Namespace) -> None:
        self.ns = ns
        self.blocks: OrderedDict[int, int] = OrderedDict()
        self.next_id = 0

    def match(self, tokens: list[int]) -> list[int]:
        out = []
        for h in block_hashes(self.ns, tokens):
            b = self.blocks.get(h)
            if b is None:
                break
            self.blocks.move_to_end(h)
            out.append(b)
        return out

    def insert(self, tokens: list[int]) -> None:
        for h in block_hashes(self.ns, tokens):
            if h in self.blocks:
                self.blocks.move_to_end(h)
            else:
                self.blocks[h] = self.next_id
                self.next_id += 1

    def evict(self, n: int) -> None:
        for _ in range(min(n, len(self.blocks))):
            self.blocks.popitem(last=False)


# --- micro benchmarks ---
def bench_hashing(rng: random.Random, reps: int) -> dict[str, float]:
    tokens = rand_tokens(rng, 4096)
    us = statistics.median(timed(lambda: block_hashes(NS, tokens)) for _ in range(reps))
    return {"tokens": 4096, "us": us, "mtok_per_s": 4096 / us}


def fill(cache: PrefixCache, flat: FlatDictCache, target: int, rng: random.Random) -> list:
    """Insert 4,096-token prompts (70% share a random prefix of an earlier one) up to `target`."""
    seqs: list[list[int]] = []
    while cache.num_cached_blocks() * BS < target:
        share = 0
        if seqs and rng.random() < 0.7:
            share = rng.randrange(0, 4096 // BS) * BS
        toks = (rng.choice(seqs)[:share] if share else []) + rand_tokens(rng, 4096 - share)
        insert(cache, toks)
        flat.insert(toks)
        seqs.append(toks)
    return seqs


def insert(cache: PrefixCache, toks: list[int]) -> float:
    blocks = cache.allocate(len(toks) // BS)
    assert blocks is not None
    t0 = clock()
    res = cache.insert(NS, toks, blocks)
    dt = (clock() - t0) / 1e3
    cache.free(res.duplicates)
    return dt


def bench_tree_size(target: int, rng: random.Random, reps: int) -> dict[str, float]:
    cache = PrefixCache(target // BS + 2 * 4096 // BS, BS)
    flat = FlatDictCache(NS)
    seqs = fill(cache, flat, target, rng)
    probes = [rng.choice(seqs) for _ in range(reps)]
    news = [rng.choice(seqs)[:2048] + rand_tokens(rng, 2048) for _ in range(reps)]
    settle()
    match_us = statistics.median(timed(lambda t=t: cache.match(NS, t)) for t in probes)
    flat_match_us = statistics.median(timed(lambda t=t: flat.match(t)) for t in probes)
    insert_us = statistics.median(insert(cache, t) for t in news)
    flat_insert_us = statistics.median(timed(lambda t=t: flat.insert(t)) for t in news)
    rounds = min(reps, cache.num_evictable_blocks() // 64)  # each round really frees 64 blocks
    evict_us = statistics.median(timed(lambda: cache.evict(64)) for _ in range(rounds)) / 64
    flat_evict_us = statistics.median(timed(lambda: flat.evict(64)) for _ in range(rounds)) / 64
    return {
        "cached_tokens": target,
        "match_us": match_us,
        "flat_match_us": flat_match_us,
        "insert_us": insert_us,
        "flat_insert_us": flat_insert_us,
        "evict_us_per_block": evict_us,
        "flat_evict_us_per_block": flat_evict_us,
    }


def shared_prefix_trace(rng: random.Random) -> list[list[int]]:
    reqs = []
    for _ in range(64):
        prefix = rand_tokens(rng, 2048)
        reqs += [prefix + rand_tokens(rng, 128) for _ in range(16)]
    rng.shuffle(reqs)
    return reqs


def multi_turn_trace(rng: random.Random) -> list[list[int]]:
    """64 users x 8 turns: shared 512-token system prompt, +128-token message, +128-token answer."""
    system = rand_tokens(rng, 512)
    history = [list(system) for _ in range(64)]
    reqs = []
    for _ in range(8):
        for h in history:
            h += rand_tokens(rng, 128)
            reqs.append(list(h))
            h += rand_tokens(rng, 128)
    return reqs


# --- side by side with SGLang's RadixCache ---
PEER_BLOCK_SIZES = (1, 16)
EVICT_TREES = {"many_leaves": 1, "long_leaves": 4}  # kind -> seed of its token sequences
EVICT_TOKENS = 1024


def peer_traces() -> dict[str, list[list[int]]]:
    """The two request traces, through JSON as the runner gets them: equal token ids are then
    distinct int objects, as in requests tokenized one by one."""
    traces = {
        "shared_prefix": shared_prefix_trace(random.Random(2)),
        "multi_turn": multi_turn_trace(random.Random(3)),
    }
    return json.loads(json.dumps(traces))


def percentile(xs: list[float], q: float) -> float:
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def serve_times(requests: list[list[int]], bs: int, as_array: bool) -> dict[str, list]:
    """Per request in the engine's order: match, lock, allocate the rest, insert, unlock.

    Token ids as array("q") (`as_array`: what the engine's sequences hold, and SGLang's
    RadixKey) or as lists (other callers: the index packs them into an array at its door),
    built before the clock runs, as the runner does for SGLang."""
    ns = Namespace("bench-model", "bfloat16", bs)
    cache = PrefixCache(sum(len(r) for r in requests) // bs + 1, bs)
    kind = (lambda t: array("q", t)) if as_array else list
    fulls = [kind(t) for t in requests]
    lookups = [kind(t[:-1]) for t in requests]
    match_t, insert_t, matched = [], [], []
    settle()
    for toks, lookup in zip(fulls, lookups, strict=True):
        t0 = clock()
        m = cache.match(ns, lookup)
        t1 = clock()
        cache.lock(m.handle)
        blocks = cache.allocate(len(toks) // bs - len(m.block_ids))
        assert blocks is not None
        t2 = clock()
        res = cache.insert(ns, toks, m.block_ids + blocks)
        t3 = clock()
        cache.free(res.duplicates)
        cache.unlock(m.handle)
        match_t.append((t1 - t0) / 1e3)
        insert_t.append((t3 - t2) / 1e3)
        matched.append(m.num_tokens)
    gc.unfreeze()
    return {"match": match_t, "insert": insert_t, "matched": matched}


def evict_tree(kind: str, seed: int, bs: int) -> PrefixCache:
    ns = Namespace("bench-model", "bfloat16", bs)
    seqs = evict_sequences(kind, seed)
    cache = PrefixCache(sum(len(t) for t in seqs) // bs + 64, bs)
    for toks in seqs:
        n = len(toks) // bs
        res = cache.insert(ns, toks[: n * bs], cache.allocate(n))
        cache.free(res.duplicates)
    return cache


def evict_times(kind: str, seed: int, bs: int, reps: int) -> dict[str, float]:
    """evict(1,024 tokens) and drop(1,024 tokens), `reps` times each in a row, each on its own
    ~10^6-token tree (median CPU us). evict hands back an EvictedBlock (id, hash, tokens) per
    block for the spill tiers; drop (what allocate does) only frees, as SGLang's evict does."""
    out: dict[str, float] = {}
    for op in ("evict", "drop"):
        cache = evict_tree(kind, seed, bs)
        out["leaves"], out["cached_tokens"] = (
            len(cache.tree.evictable_nodes),
            cache.num_cached_blocks() * bs,
        )
        fn = cache.evict if op == "evict" else cache.drop
        settle()
        times, freed = [], []
        for _ in range(reps):
            before = cache.num_cached_blocks()
            t0 = clock()
            fn(EVICT_TOKENS // bs)
            times.append((clock() - t0) / 1e3)
            freed.append((before - cache.num_cached_blocks()) * bs)
        gc.unfreeze()
        out["us" if op == "evict" else "drop_us"] = statistics.median(times)
        out["tokens_freed"] = statistics.median(freed)
    return out


def ours_run(traces: dict[str, list[list[int]]], reps: int) -> dict:
    out: dict = {"traces": {}, "traces_list": {}, "evict": {}}  # traces: what the engine does
    for name, trace in traces.items():
        for bs in PEER_BLOCK_SIZES:
            out["traces"][f"{name}/{bs}"] = serve_times(trace, bs, as_array=True)
            out["traces_list"][f"{name}/{bs}"] = serve_times(trace, bs, as_array=False)
    for kind, seed in EVICT_TREES.items():
        for bs in PEER_BLOCK_SIZES:
            out["evict"][f"{kind}/{bs}"] = evict_times(kind, seed, bs, reps)
    return out


def sglang_run(python: str, spec_path: Path) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "sglang.json"
        runner = HERE / "sglang_index_runner.py"
        subprocess.run([python, str(runner), str(spec_path), str(result)], check=True)
        return json.loads(result.read_text())


def peer_comparison(python: str | None, runs: int, reps: int) -> dict:
    """Alternating runs of ours and (with `python`) SGLang's; the median of the runs' figures."""
    traces = peer_traces()
    ours, theirs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        spec_path = Path(tmp) / "spec.json"
        spec = {
            "traces": traces,
            "block_sizes": list(PEER_BLOCK_SIZES),
            "evict_trees": {f"{k}/{bs}": {"kind": k, "seed": s, "block_size": bs}
                            for k, s in EVICT_TREES.items() for bs in PEER_BLOCK_SIZES},
            "evict_reps": reps,
            "evict_tokens": EVICT_TOKENS,
        }  # fmt: skip
        spec_path.write_text(json.dumps(spec))
        for _ in range(runs):
            ours.append(ours_run(traces, reps))
            if python:
                theirs.append(sglang_run(python, spec_path))
    return summarize(ours, theirs)


def summarize(ours: list[dict], theirs: list[dict]) -> dict:
    def trace_stats(runs: list[dict], key: str, part: str = "traces") -> dict[str, float]:
        out = {}
        for op in ("match", "insert"):
            for q in (50, 99):
                out[f"{op}_p{q}"] = statistics.median(
                    percentile(r[part][key][op], q / 100) for r in runs
                )
        return out

    summary: dict = {"runs": len(ours), "traces": {}, "evict": {}}
    if theirs:
        summary["sglang_version"] = theirs[0]["sglang"]
    for key in ours[0]["traces"]:
        row = {
            "radixcache": trace_stats(ours, key),  # array("q") ids, as the engine passes them
            "radixcache_list": trace_stats(ours, key, "traces_list"),
        }
        if theirs:
            row["sglang"] = trace_stats(theirs, key)
            same = ours[0]["traces"][key]["matched"] == theirs[0]["traces"][key]["matched"]
            row["matched_lengths_equal"] = same
        summary["traces"][key] = row
    for key in ours[0]["evict"]:
        row = {
            "radixcache": {
                **ours[0]["evict"][key],
                "us": statistics.median(r["evict"][key]["us"] for r in ours),
                "drop_us": statistics.median(r["evict"][key]["drop_us"] for r in ours),
            }
        }
        if theirs:
            row["sglang"] = {
                **theirs[0]["evict"][key],
                "us": statistics.median(r["evict"][key]["us"] for r in theirs),
            }
        summary["evict"][key] = row  # fmt: skip
    return summary


def print_peer_tables(summary: dict) -> None:
    have_peer = "sglang_version" in summary
    peer = f"SGLang {summary['sglang_version']}" if have_peer else "SGLang (not run)"
    rows = []
    for key, row in summary["traces"].items():
        theirs = row.get("sglang", {})
        for op in ("match", "insert"):
            cells = [key, op]
            t50 = theirs.get(f"{op}_p50")
            for side in ("radixcache", "radixcache_list"):
                o50, o99 = row[side][f"{op}_p50"], row[side][f"{op}_p99"]
                cells += [f"{o50:.1f} / {o99:.0f}", f"{o50 / t50:.2f}" if theirs else "-"]
            cells.append(f"{t50:.1f} / {theirs[f'{op}_p99']:.0f}" if theirs else "-")
            cells.append(str(row.get("matched_lengths_equal", "-")))
            rows.append(cells)
    print_table(
        f"per request CPU us, p50 / p99 (median of {summary['runs']} alternating runs); "
        f"x = ours / {peer} at p50; ours with token ids as array('q') (what the engine passes) "
        "and as lists (packed into an array at the index's door)",
        ["trace/block", "op", "ours engine (array)", "x", "ours list", "x", "sglang", "same match"],
        rows,
    )
    rows = []
    for key, row in summary["evict"].items():
        ours, theirs = row["radixcache"], row.get("sglang")
        cells = [key, ours["cached_tokens"], ours["leaves"], ours["tokens_freed"], ours["us"],
                 ours["drop_us"]]  # fmt: skip
        if theirs:
            cells += [theirs["leaves"], theirs["tokens_freed"], theirs["us"],
                      theirs["us"] / ours["us"], theirs["us"] / ours["drop_us"]]  # fmt: skip
        else:
            cells += ["-"] * 5
        rows.append(cells)
    print_table(
        f"evict({EVICT_TOKENS:,} tokens), median CPU us; speedup = {peer} / ours (evict, drop)",
        ["tree/block", "cached", "leaves", "freed", "evict", "drop", "sglang leaves", "freed",
         "us", "x evict", "x drop"],
        rows,
    )  # fmt: skip


# --- Mooncake replay ---
def load_trace(path: Path = TRACE) -> list[list[int]]:
    with path.open() as f:
        return [json.loads(line)["hash_ids"] for line in f]


def trace_namespace(block_size: int) -> Namespace:
    return Namespace("mooncake", "bfloat16", block_size)


def block_tokens(block_id: int, block_size: int) -> list[int]:
    return [100 + block_id % 40000, 100 + block_id // 40000] + [7] * (block_size - 2)


def trace_tokens(ids: list[int], block_size: int, table: dict[int, list[int]]) -> list[int]:
    """The tokens of a trace request (`table` caches each block's tokens)."""
    toks: list[int] = []
    for h in ids:
        t = table.get(h)
        if t is None:
            t = table[h] = block_tokens(h, block_size)
        toks += t
    return toks


def trace_hashes(trace: list[list[int]], block_size: int = 512) -> dict[int, int]:
    """Trace block id of each chained block hash `replay` inserts."""
    ns = trace_namespace(block_size)
    table: dict[int, list[int]] = {}
    out: dict[int, int] = {}
    known: set[int] = set()  # a trace id stands for its whole prefix
    for ids in trace:
        if ids[-1] in known:
            continue
        toks = trace_tokens(ids, block_size, table)
        out.update(zip(block_hashes(ns, toks), ids, strict=True))
        known.update(ids)
    return out


def serve_request(
    cache: PrefixCache, ns: Namespace, lookup: list[int], full: list[int], block_size: int
) -> int:
    """What the engine does for one request: match `lookup`, hold the match, insert as many
    blocks of `full` as the pool can hold, release. Returns the matched blocks."""
    m = cache.match(ns, lookup)
    cache.lock(m.handle)
    want = len(full) // block_size - len(m.block_ids)
    want = min(want, cache.num_free_blocks() + cache.num_evictable_blocks())
    blocks = cache.allocate(want)
    assert blocks is not None
    n = len(m.block_ids) + want
    res = cache.insert(ns, full[: n * block_size], m.block_ids + blocks)
    cache.free(res.duplicates)
    cache.unlock(m.handle)
    return len(m.block_ids)


def replay(
    trace: list[list[int]],
    capacity: int,
    policy=None,  # noqa: ANN001
    block_size: int = 512,
    mrc_sample_rate: float | None = None,
    on_request: Callable[[int], None] | None = None,
) -> dict:
    """Block hit rate of the PrefixCache (one block per hash id) at `capacity` blocks.

    `on_request(r)` is called before request r (for policies that read the future)."""
    ns = trace_namespace(block_size)
    cache = PrefixCache(capacity, block_size, policy=policy, mrc_sample_rate=mrc_sample_rate)
    table: dict[int, list[int]] = {}
    hits = total = 0
    t0 = time.thread_time()
    for r, ids in enumerate(trace):
        if on_request is not None:
            on_request(r)
        toks = trace_tokens(ids, block_size, table)
        hits += serve_request(cache, ns, toks, toks, block_size)
        total += len(ids)
    return {"hit_rate": hits / total, "seconds": time.thread_time() - t0, "cache": cache}


def unlimited_hit_rate(trace: list[list[int]]) -> float:
    seen: set[int] = set()
    hits = total = 0
    for ids in trace:
        for h in ids:
            if h not in seen:
                break
            hits += 1
        seen.update(ids)
        total += len(ids)
    return hits / total


def belady_hit_rate(trace: list[list[int]], capacity: int) -> float:
    """Offline optimum: after each request evict the blocks used furthest in the future."""
    never = len(trace)
    nxt: list[list[int]] = [[] for _ in trace]
    last: dict[int, int] = {}
    for r in range(len(trace) - 1, -1, -1):
        nxt[r] = [last.get(h, never) for h in trace[r]]
        for h in trace[r]:
            last[h] = r
    order = SortedList()  # (next use, depth, id): the last one goes first
    key: dict[int, tuple[int, int, int]] = {}
    hits = total = 0
    for r, ids in enumerate(trace):
        for h in ids:
            if h not in key:
                break
            hits += 1
        total += len(ids)
        for depth, (h, n) in enumerate(zip(ids, nxt[r], strict=True)):
            old = key.get(h)
            if old is not None:
                order.remove(old)
            key[h] = (n, depth, h)
            order.add(key[h])
        while len(order) > capacity:
            del key[order.pop()[2]]
    return hits / total


def unique_blocks(trace: list[list[int]]) -> int:
    return len({h for ids in trace for h in ids})


def hit_rate_table(trace: list[list[int]]) -> list[dict]:
    uniq = unique_blocks(trace)
    ceiling = unlimited_hit_rate(trace)
    rows = []
    for frac in FRACTIONS:
        cap = round(frac * uniq)
        lru = replay(trace, cap)["hit_rate"]
        opt = belady_hit_rate(trace, cap)
        rows.append({"fraction": frac, "blocks": cap, "lru": lru, "belady": opt,
                     "unlimited": ceiling, "lru_over_belady": lru / opt})  # fmt: skip
    return rows


# --- output ---
def print_table(title: str, header: list[str], rows: list[list]) -> None:
    print(f"\n{title}")
    cells = [header] + [[f"{c:.4g}" if isinstance(c, float) else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    for i, r in enumerate(cells):
        print("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))
        if i == 0:
            print("  ".join("-" * w for w in widths))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer repetitions, no 10^6 tree")
    parser.add_argument("--sglang-python", help="interpreter with SGLang installed (PEERS.md)")
    parser.add_argument("--runs", type=int, default=3, help="alternating runs of each side")
    parser.add_argument("--peer-only", action="store_true", help="only the SGLang comparison")
    args = parser.parse_args()
    rng = random.Random(0)
    reps = 50 if args.quick else 200
    out: dict = {"block_size": BS}
    out["peer"] = peer_comparison(args.sglang_python, args.runs, 100)
    print_peer_tables(out["peer"])
    if args.peer_only:  # keep the other sections of the last full run
        path = HERE / "results" / "index.json"
        old = json.loads(path.read_text()) if path.exists() else {}
        write_results({**old, "peer": out["peer"]})
        return
    out["hashing"] = bench_hashing(rng, reps)
    h = out["hashing"]
    print(f"\nhashing: 4,096 tokens in {h['us']:.1f} us = {h['mtok_per_s']:.1f} M tokens/s")
    sizes = (10**4, 10**5) if args.quick else (10**4, 10**5, 10**6)
    out["micro"] = [bench_tree_size(s, random.Random(s), reps) for s in sizes]
    rows = [[m["cached_tokens"], m["match_us"], m["flat_match_us"], m["flat_match_us"] / m["match_us"],
             m["insert_us"], m["flat_insert_us"], m["flat_insert_us"] / m["insert_us"],
             m["evict_us_per_block"], m["flat_evict_us_per_block"]] for m in out["micro"]]  # fmt: skip
    print_table(
        "4,096-token prompt, median CPU us; flat = dict of chained hashes; x = flat / radix",
        ["cached", "match", "flat", "x", "insert", "flat", "x", "evict/blk", "flat"],
        rows,
    )
    trace = load_trace()
    out["mooncake"] = hit_rate_table(trace)
    print_table(
        f"Mooncake conversation trace: {len(trace):,} requests, {unique_blocks(trace):,} unique "
        "512-token blocks; block hit rate",
        ["pool", "blocks", "LRU", "Belady", "unlimited", "LRU/Belady"],
        [
            [
                f"{r['fraction']:.0%}",
                r["blocks"],
                r["lru"],
                r["belady"],
                r["unlimited"],
                r["lru_over_belady"],
            ]
            for r in out["mooncake"]
        ],  # fmt: skip
    )
    write_results(out)


def write_results(out: dict) -> None:
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "index.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
