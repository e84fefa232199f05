"""Spill-tier benchmark: load-back vs recompute, tier bandwidth vs raw, multi-round chat per tier set.

    python -m benchmarks.bench_tiers                       # all four sections, default model
    python -m benchmarks.bench_tiers --sections bandwidth  # one section
    python -m benchmarks.bench_tiers --quick               # smaller sizes (smoke run)
    python -m benchmarks.bench_tiers --sections cluster    # Redis Cluster next to one Redis
    python -m benchmarks.bench_tiers --sections itl        # running streams' time per token
                                                           # while others load (tier_itl.py)
    python -m benchmarks.bench_tiers --sections device --device cuda
                                                           # host-tier spill / load GB/s to
                                                           # the pool's device (tier_device.py)

Prints a table per section and writes benchmarks/results/bench_tiers.json. Starts its own
redis-server on a free loopback port (and, for `cluster`, a 3-master Redis Cluster). Disk numbers
are page-cache reads (files just written).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import redis
import redis.utils
import torch

from benchmarks.tier_device import bench_device
from benchmarks.tier_itl import bench_itl
from engine.kv.admin import Flush
from engine.llm import LLM
from engine.sampling_params import SamplingParams
from radixcache.hashing import Namespace, block_hashes
from storage import DiskTier, RedisTier, TierConfig, TieredStore, encode_block
from tests.redis_cluster import RedisClusterServers, running_cluster
from tests.redis_server import RedisServer

ROOT = Path(__file__).resolve().parents[1]

RESULTS_DIR = ROOT / "benchmarks" / "results"
# SmolLM2-135M: 30 layers, 3 KV heads, head_dim 64, bfloat16, 16-token blocks
DEFAULT_BLOCK = (30, 2, 16, 3, 64)
BATCH = 32  # blocks per tier call, as the TieredStore's loader does


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


# --- engine helpers ---
def tier_store(llm: LLM) -> TieredStore | None:
    """The TieredStore the engine built from its TierConfig."""
    bridge = llm.engine.kv.tiers
    return None if bridge is None else bridge.store


def make_llm(tiers: TierConfig | None, **kw: object) -> LLM:
    return LLM(None, tiers=tiers, seed=0, **kw)


def random_prompt(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(100, vocab - 100) for _ in range(n)]


def ttft(llm: LLM, prompt: list[int]) -> tuple[float, dict[str, int]]:
    out = llm.generate([prompt], SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))[0]
    m = out.metrics
    return m["first_token_time"] - m["arrival_time"], out.cached_tokens_by_tier


def settle(llm: LLM) -> None:
    """Device cache emptied into the tiers, every queued write done."""
    llm.engine.admin(Flush())
    store = tier_store(llm)
    if store is not None:
        store.wait_idle()


# --- section 1: load-back vs recompute TTFT ---
def place_only_in(store: TieredStore, ns: Namespace, hashes: list[int], name: str) -> None:
    """After a flush the blocks sit in the top tier (host): move them so that only `name` has them."""
    assert store.wait_idle(600)
    tiers = {t.name: t for t in store.tiers}
    values = tiers["host"].get(ns, hashes)
    assert all(v is not None for v in values), "host tier too small for the prompt"
    for tier in store.tiers:
        if tier.name == name:
            tier.put(ns, list(zip(hashes, values, strict=True)))
        else:
            tier.delete(ns, hashes)


def bench_loadback(server: RedisServer, tmp: Path, sizes: list[int], repeats: int) -> list[dict]:
    """One engine with all three tiers (deadline raised so no load is cut short); before each
    timed request the prompt's blocks are placed in exactly one tier."""
    cfg = TierConfig(
        host_bytes=1 << 30,
        disk_path=tmp / "loadback-disk",
        redis_url=server.url,
        redis_prefix="bench-loadback",
        redis_timeout_s=10.0,
        deadline_s=60.0,
    )
    llm = make_llm(cfg, num_blocks=1100)
    store, ns = tier_store(llm), llm.engine.namespace
    vocab, max_len = llm.tokenizer.vocab_size, llm.engine.max_model_len
    rng = random.Random(1)
    ttft(llm, random_prompt(rng, 64, vocab))  # warm-up
    rows = []
    for size in sizes:
        n = min(size, max_len - 1)  # one output token must fit in the context
        recompute = []
        for _ in range(repeats):
            settle(llm)
            recompute.append(ttft(llm, random_prompt(rng, n, vocab))[0])
        prompt = random_prompt(rng, n, vocab)
        ttft(llm, prompt)  # computes the prefix once
        hashes = block_hashes(ns, prompt[: (n - 1) // ns.block_size * ns.block_size])
        for tier in ("host", "disk", "redis"):
            load, reads, loaded = [], [], {}
            for _ in range(repeats):
                settle(llm)
                place_only_in(store, ns, hashes, tier)
                before = store.stats().tiers[tier].stats.load_time_s
                t, loaded = ttft(llm, prompt)
                load.append(t)
                reads.append(store.stats().tiers[tier].stats.load_time_s - before)
            rec, ld = statistics.median(recompute), statistics.median(load)
            rows.append(
                {
                    "tier": tier,
                    "prompt_tokens": n,
                    "loaded_tokens": loaded.get(tier, 0),
                    "recompute_ttft_s": rec,
                    "load_ttft_s": ld,
                    "tier_read_s": statistics.median(reads),
                    "speedup": rec / ld,
                }
            )
            print(f"  loadback {tier} {n}: recompute {rec:.3f}s load {ld:.3f}s", flush=True)
    llm.engine.close()
    clipped = sorted({r["prompt_tokens"] for r in rows} - set(sizes))
    if clipped:
        print(
            f"\nnote: prompt sizes clipped to {clipped}: the default model's context is "
            f"{max_len} tokens and one output token must fit"
        )
    table(
        f"Load-back vs recompute: TTFT (s) of a prompt whose prefix lives only in one tier, "
        f"median of {repeats} (default model, bfloat16)",
        [
            "tier",
            "prompt tokens",
            "loaded tokens",
            "recompute TTFT",
            "load TTFT",
            "of which tier read",
            "recompute/load",
        ],
        [
            [
                r["tier"],
                r["prompt_tokens"],
                r["loaded_tokens"],
                r["recompute_ttft_s"],
                r["load_ttft_s"],
                r["tier_read_s"],
                r["speedup"],
            ]
            for r in rows
        ],
    )
    return rows


# --- section 3: multi-round chat per tier configuration ---
SYSTEM, TURN = 512, 64  # MT-small: shared system prompt, tokens per user message


def chat_configs(tmp: Path, url: str, host_bytes: int) -> dict[str, TierConfig | None]:
    return {
        "device only": None,
        "device + host": TierConfig(host_bytes=host_bytes),
        "device + disk": TierConfig(disk_path=tmp / "chat-disk", disk_bytes=8 << 30),
        "device + redis": TierConfig(redis_url=url, redis_prefix="bench-chat", redis_timeout_s=5.0),
    }


def run_chat(llm: LLM, users: int, turns: int, answer: int, seed: int) -> dict[str, float]:
    """MT-small shape: a shared system prompt, user turns appended to each history with the
    greedy answer; all users' turn-t requests are submitted together."""
    rng = random.Random(seed)
    vocab = llm.tokenizer.vocab_size
    system = random_prompt(rng, SYSTEM, vocab)
    history = [list(system) for _ in range(users)]
    params = SamplingParams(max_tokens=answer, temperature=0.0, ignore_eos=True)
    ttfts, prompt_tokens, cached, by_tier = [], 0, 0, {}
    start = time.perf_counter()
    for _ in range(turns):
        prompts = [h + random_prompt(rng, TURN, vocab) for h in history]
        for h, p, out in zip(history, prompts, llm.generate(prompts, params), strict=True):
            h[:] = p + out.outputs[0].token_ids
            ttfts.append(out.metrics["first_token_time"] - out.metrics["arrival_time"])
            prompt_tokens += len(p)
            cached += out.num_cached_tokens
            for tier, n in out.cached_tokens_by_tier.items():
                by_tier[tier] = by_tier.get(tier, 0) + n
    return {
        "wall_s": time.perf_counter() - start,
        "prompt_tokens": prompt_tokens,
        "hit_rate": cached / prompt_tokens,
        "mean_ttft_s": statistics.mean(ttfts),
        **{f"hit_rate_{t}": n / prompt_tokens for t, n in sorted(by_tier.items())},
    }


def bench_chat(server: RedisServer, tmp: Path, users: int, turns: int, answer: int) -> list[dict]:
    block_bytes = 30 * 2 * 16 * 3 * 64 * 2
    working_blocks = (SYSTEM + users * turns * (TURN + answer)) // 16
    longest = -(-(SYSTEM + turns * (TURN + answer)) // 16)  # a user's last request and answer
    device_blocks = max(working_blocks // 4, longest + 1)
    rows = []
    for name, cfg in chat_configs(tmp, server.url, working_blocks * (block_bytes + 100)).items():
        llm = make_llm(cfg, num_blocks=device_blocks, max_num_seqs=1)
        row = run_chat(llm, users, turns, answer, 7)
        rows.append({"config": name, "device_blocks": device_blocks, **row})
        print(f"  chat {name}: {rows[-1]}", flush=True)
        llm.engine.close()
    cols = ["hit_rate_device", "hit_rate_host", "hit_rate_disk", "hit_rate_redis"]
    table(
        f"Multi-round chat: {users} users x {turns} turns ({SYSTEM}-token shared system prompt, "
        f"{TURN}-token turns, {answer}-token answers, one request at a time), device pool "
        f"{device_blocks} blocks = {device_blocks / working_blocks:.0%} of the "
        f"~{working_blocks}-block working set",
        ["config", "hit rate", "device", "host", "disk", "redis", "mean TTFT (s)", "wall (s)"],
        [
            [
                r["config"],
                r["hit_rate"],
                *[r.get(c, 0.0) for c in cols],
                r["mean_ttft_s"],
                r["wall_s"],
            ]
            for r in rows
        ],
    )
    return rows


# --- section 4: Redis Cluster next to one Redis ---
class NamespaceTaggedTier(RedisTier):
    """The other hash-tag choice, for comparison: every block of a namespace in one slot."""

    def key(self, ns: Namespace, block_hash: int) -> str:
        return f"{{{self.prefix}:{ns.hex}}}:{block_hash:016x}"


def raw_pipelined_get(client: redis.Redis | redis.RedisCluster, keys: list[list[str]]) -> list:
    """What a redis-py user writes: a pipeline of GETs per batch (RedisCluster's pipeline groups
    the batch by node, writes every node, then reads)."""
    out = []
    for batch in keys:
        pipe = (
            client.pipeline(transaction=False)
            if isinstance(client, redis.Redis)
            else client.pipeline()
        )
        for k in batch:
            pipe.get(k)
        out.append(pipe.execute())
    return out


def bench_cluster_bandwidth(
    server: RedisServer, cluster: RedisClusterServers, num_blocks: int, repeats: int
) -> list[dict]:
    ns = Namespace("bench-cluster-bandwidth", "bfloat16", DEFAULT_BLOCK[2])
    hashes = block_hashes(ns, list(range(num_blocks * ns.block_size)))
    gen = torch.Generator().manual_seed(0)
    values = [
        (h, encode_block(torch.randn(DEFAULT_BLOCK, generator=gen).bfloat16())) for h in hashes
    ]
    nbytes = sum(len(v) for _, v in values)
    batches = [hashes[i : i + BATCH] for i in range(0, len(hashes), BATCH)]
    setups = [
        ("one Redis", RedisTier(server.url, prefix="bench", socket_timeout_s=30), server.client()),
        ("cluster, per-block slots", RedisTier(cluster.url, prefix="bench", socket_timeout_s=30),
         cluster.client()),
        ("cluster, one slot per namespace",
         NamespaceTaggedTier(cluster.url, prefix="bench", socket_timeout_s=30), cluster.client()),
    ]  # fmt: skip
    rows = []
    for name, tier, client in setups:
        tier.put(ns, values)
        keys = [[tier.key(ns, h) for h in b] for b in batches]
        store = TieredStore(TierConfig(deadline_s=600), tiers=[tier])
        gbps = median_gbps(
            nbytes,
            {
                "raw": lambda client=client, keys=keys: raw_pipelined_get(client, keys),
                "get": lambda tier=tier: [tier.get(ns, b) for b in batches],
                "load": lambda store=store: store.load_prefix(ns, hashes),
            },
            repeats,
        )
        reads = [h.blocks_read for h in tier.stats.nodes.values()]
        rows.append({"setup": name, **gbps, "busiest_node_share": max(reads) / sum(reads)})
        store.close()
    parser = "hiredis" if redis.utils.HIREDIS_AVAILABLE else "pure-Python parser"
    table(
        f"Redis read bandwidth, one server vs a 3-master cluster: {num_blocks} blocks of "
        f"{len(values[0][1]):,} B ({nbytes / 1e6:.0f} MB), batches of {BATCH}, median of "
        f"{repeats}; raw = pipelined GET with redis-py ({parser}) on the same server(s)",
        ["setup", "raw GB/s", "tier get GB/s", "get/raw", "load_prefix GB/s", "load/raw",
         "busiest node's share of reads"],
        [[r["setup"], r["raw"], r["get"], r["get"] / r["raw"], r["load"], r["load"] / r["raw"],
          r["busiest_node_share"]] for r in rows],
    )  # fmt: skip
    return rows


def cluster_ttfts(llm: LLM, prompts: list[list[int]]) -> dict[str, float]:
    """Median TTFT, median Redis read time and mean share of the prompt loaded from Redis, over
    `prompts` (device cache emptied before each, so a prefix can only come from Redis)."""
    store = tier_store(llm)
    times, reads, shares = [], [], []
    for prompt in prompts:
        settle(llm)
        before = store.stats().tiers["redis"].stats.load_time_s
        t, by_tier = ttft(llm, prompt)
        times.append(t)
        reads.append(store.stats().tiers["redis"].stats.load_time_s - before)
        shares.append(by_tier.get("redis", 0) / len(prompt))
    return {
        "ttft_s": statistics.median(times),
        "read_s": statistics.median(reads),
        "hit_rate": statistics.mean(shares),
    }


DEAD_MASTER_PROMPT = 2048  # tokens of the prompts replayed with one master dead


def bench_cluster_loadback(
    server: RedisServer, cluster: RedisClusterServers, sizes: list[int], prompts_per_size: int
) -> list[dict]:
    """Engines whose only spill tier is one Redis or the cluster (deadline raised so no load is
    cut short): recompute vs load-back TTFT per prompt size, then one master SIGKILLed."""
    rows = []
    rng = random.Random(2)
    for name, url in (("one Redis", server.url), ("cluster", cluster.url)):
        cfg = TierConfig(redis_url=url, redis_prefix=f"bench-ttft-{name}", redis_timeout_s=10.0,
                         deadline_s=60.0, redis_cooldown_s=3600.0)  # fmt: skip
        llm = make_llm(cfg, num_blocks=1100)
        vocab, max_len = llm.tokenizer.vocab_size, llm.engine.max_model_len
        ttft(llm, random_prompt(rng, 64, vocab))  # warm-up
        at_2048: tuple[list[list[int]], dict] | None = None
        for size in sizes:
            n = min(size, max_len - 1)
            prompts = [random_prompt(rng, n, vocab) for _ in range(prompts_per_size)]
            recompute = cluster_ttfts(llm, prompts)  # first sight: computed
            load = cluster_ttfts(llm, prompts)  # flushed to Redis, loaded back
            row = {"setup": name, "prompt_tokens": n, "state": "healthy",
                   "recompute_ttft_s": recompute["ttft_s"], "load_ttft_s": load["ttft_s"],
                   "redis_read_s": load["read_s"], "hit_rate": load["hit_rate"]}  # fmt: skip
            rows.append(row)
            print(f"  cluster-ttft {name} {n}: {row}", flush=True)
            if size == DEAD_MASTER_PROMPT:
                at_2048 = (prompts, row)
        if name == "cluster" and at_2048 is not None:
            rows += dead_master_rows(llm, cluster, *at_2048)
        llm.engine.close()
    table(
        f"TTFT (s) from Redis vs recomputed, default model bf16, median of {prompts_per_size} "
        "prompts per size (device cache emptied before each); hit rate = prompt share loaded "
        "from Redis",
        ["setup", "prompt tokens", "state", "recompute TTFT", "load TTFT", "of which Redis read",
         "recompute/load", "hit rate"],
        [[r["setup"], r["prompt_tokens"], r["state"], r["recompute_ttft_s"], r["load_ttft_s"],
          r["redis_read_s"], r["recompute_ttft_s"] / r["load_ttft_s"], r["hit_rate"]]
         for r in rows],
    )  # fmt: skip
    return rows


def dead_master_rows(
    llm: LLM, cluster: RedisClusterServers, prompts: list[list[int]], healthy: dict
) -> list[dict]:
    """The largest prompts again with one master SIGKILLed (its slots unserved: no replica):
    first sight (the leading run ends at the dead node's first block; the rest is recomputed and
    its blocks handed off to stand-ins), then again (served from the stand-ins). Recompute TTFT
    is remeasured on fresh prompts at the same time."""
    settle(llm)  # every block in Redis, none on the device: the crash is the only loss
    cluster.nodes[0].kill()
    cluster.wait_noticed_down(cluster.nodes[0])
    vocab, n = llm.tokenizer.vocab_size, healthy["prompt_tokens"]
    rng = random.Random(3)
    fresh = [random_prompt(rng, n, vocab) for _ in prompts]
    rows = []
    for state in ("1 of 3 masters dead, first request", "1 of 3 masters dead, after hand-off"):
        load = cluster_ttfts(llm, prompts)
        recompute = cluster_ttfts(llm, fresh)
        fresh = [random_prompt(rng, n, vocab) for _ in prompts]
        rows.append(healthy | {"state": state, "recompute_ttft_s": recompute["ttft_s"],
                               "load_ttft_s": load["ttft_s"], "redis_read_s": load["read_s"],
                               "hit_rate": load["hit_rate"]})  # fmt: skip
        print(f"  cluster-ttft {rows[-1]}", flush=True)
    cluster.restart(cluster.nodes[0])
    return rows


def bench_cluster(server: RedisServer, tmp: Path, quick: bool) -> dict[str, list[dict]]:
    with running_cluster(tmp / "bench-cluster") as cluster:
        bandwidth = bench_cluster_bandwidth(
            server, cluster, 128 if quick else 512, 3 if quick else 7
        )
        sizes = [512, 2048] if quick else [512, 2048, 8192]
        ttfts = bench_cluster_loadback(server, cluster, sizes, 2 if quick else 4)
    return {"bandwidth": bandwidth, "ttft": ttfts}


def print_device(rows: list[dict]) -> None:
    keys = ["store_us_per_block", "spill_gbps", "load_gbps", "install_us_per_block"]
    first = rows[0]
    table(
        f"Host tier <-> {first['device']}: {first['blocks']} blocks of "
        f"{first['block_bytes']:,} B, median of {first['repeats']}",
        ["tier", "store us/blk", "spill GB/s", "load GB/s", "install us/blk"],
        [[r["tier"], *(r.get(k, "") for k in keys)] for r in rows],
    )


def save(results: dict[str, object], path: Path) -> None:
    """Merges into the JSON file: the sections run now replace theirs, others are kept."""
    path.parent.mkdir(parents=True, exist_ok=True)
    previous = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps(previous | results, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", default="bandwidth,loadback,chat,itl")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--device", default="cpu", help="the KV pool's device (section device)")
    parser.add_argument("--out", default="bench_tiers", help="results/<out>.json")
    args = parser.parse_args()
    sections = args.sections.split(",")
    torch.manual_seed(0)
    quick = args.quick
    results = RESULTS_DIR / f"{args.out}.json"
    if "device" in sections:  # needs no Redis (a GPU machine may have none)
        sections.remove("device")
        rows = bench_device(args.device, 64 if quick else 512, 3 if quick else 5)
        print_device(rows)
        save({"device": {"quick": quick, "rows": rows}}, results)
    if not sections:
        return print(f"\nwrote {results}")
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp))
        server.start()
        try:
            for section in sections:
                if section == "bandwidth":
                    rows = bench_bandwidth(server, 128 if quick else 512, 3 if quick else 7)
                elif section == "loadback":
                    sizes = [512, 2048] if quick else [512, 2048, 8192]
                    rows = bench_loadback(server, Path(tmp), sizes, 1 if quick else 2)
                elif section == "cluster":
                    rows = bench_cluster(server, Path(tmp), quick)
                elif section == "itl":
                    rows = bench_itl(server, Path(tmp), quick)
                elif section == "chat":
                    users, turns = (6, 2) if quick else (12, 3)
                    rows = bench_chat(server, Path(tmp), users, turns, answer=8)
                else:
                    raise SystemExit(f"unknown section {section!r}")
                save({section: {"quick": quick, "rows": rows}}, results)
        finally:
            server.stop()
    print(f"\nwrote {results}")


if __name__ == "__main__":
    main()
