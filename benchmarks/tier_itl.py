"""Inter-token latency of running streams while other requests load their prefixes from a spill
tier (bench_tiers --sections itl).

    python -m benchmarks.bench_tiers --sections itl [--quick]
    python -m benchmarks.tier_itl [--quick]        # the same, standalone

Per tier (disk only, Redis only): `streams` requests decode while nothing else happens (the
baseline), then while `loads` requests whose prefix sits only in that tier arrive one after
another, then while the same requests arrive as device hits; the time between consecutive tokens
of every stream is recorded in each phase. Three rounds of the three phases (the device cache
flushed to the tier before each), after one load that warms the process's allocator.
Written against the engine's public surface (LLM, add_request, step) only, so this file also
runs unchanged on older checkouts (copy it there) for a before/after comparison.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

from engine.llm import LLM
from engine.request import Prompt
from engine.sampling_params import SamplingParams
from storage import TierConfig
from tests.redis_server import RedisServer


def _flush(llm: LLM) -> None:
    """Device cache emptied into the tiers, every queued write done (any engine version)."""
    engine = llm.engine
    if hasattr(engine, "admin"):
        from engine.kv.admin import Flush

        engine.admin(Flush())
    else:  # before the typed admin path
        engine.flush()
    assert engine.kv.tiers.store.wait_idle(600)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _run_phase(
    llm: LLM, streams: list[str], steps: int, loads: list[list[int]], ttfts: list[float] | None
) -> list[float]:
    """Steps the engine; a new load request arrives whenever the previous one finished (its
    time to its one token goes to `ttfts`). Returns the gaps between consecutive tokens of the
    streams (seconds)."""
    engine, last, gaps = llm.engine, {}, []
    pending = list(loads)
    loading: str | None = None
    done = 0
    greedy1 = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    arrived = 0.0
    while done < steps or pending or loading is not None:
        if loading is None and pending:
            loading = f"load{len(pending)}-{time.monotonic_ns()}"
            arrived = time.perf_counter()
            engine.add_request(loading, Prompt(pending.pop(0)), greedy1)
        outputs = engine.step()
        now = time.perf_counter()
        for out in outputs:
            if out.request_id in streams:
                if out.request_id in last:
                    gaps.append(now - last[out.request_id])
                last[out.request_id] = now
            elif out.request_id == loading and out.finished:
                loading = None
                if ttfts is not None:
                    ttfts.append(now - arrived)
        done += 1
    return gaps


def bench_itl_tier(
    name: str,
    cfg: TierConfig,
    prompt_tokens: int,
    num_streams: int,
    num_loads: int,
    steps: int,
    rounds: int,
) -> dict:
    # speculation off: with it a stream's steps depend on what the earlier phases left to draft
    # from, which the phases would not share
    llm = LLM(None, tiers=cfg, seed=0, num_blocks=2048, speculative="off")
    vocab = llm.tokenizer.vocab_size
    rng = random.Random(4)
    n = min(prompt_tokens, llm.engine.max_model_len - 1)
    prompts = [[rng.randrange(100, vocab - 100) for _ in range(n)] for _ in range(num_loads + 1)]
    greedy1 = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    llm.generate(prompts, greedy1)
    _flush(llm)  # the prompts' blocks now live only in the tier
    # a process's first load touches fresh memory for every block it reads (the allocator's
    # heap grows), several times a later load's cost: one load before the phases, nothing decoding
    warm, loads = prompts[0], prompts[1:]
    llm.generate([warm], greedy1)
    # each phase has fresh streams (same prompt length), so their contexts, and with them the
    # time of a step, are alike across phases; they outlast their phase (paced loads take steps)
    most = llm.engine.max_model_len - 65
    long = SamplingParams(max_tokens=min(40 * steps, most), temperature=0.0, ignore_eos=True)

    def phase(tag: str, arrivals: list[list[int]], ttfts: list[float] | None) -> list[float]:
        streams = [f"{tag}-stream{i}" for i in range(num_streams)]
        for sid in streams:
            prompt = Prompt([rng.randrange(100, vocab - 100) for _ in range(64)])
            llm.engine.add_request(sid, prompt, long)
        for _ in range(8):  # warm-up: every stream prefilled and decoding
            llm.engine.step()
        gaps = _run_phase(llm, streams, steps, arrivals, ttfts)
        for sid in streams:
            llm.engine.abort(sid)
        return gaps

    # rounds of the three phases, each round's loads from the tier again (the device cache
    # flushed before it), so p99 rests on a few hundred gaps per phase rather than one or two
    base, with_loads, device_hits = [], [], []
    load_ttfts: list[float] = []
    hit_ttfts: list[float] = []
    for r in range(rounds):
        if r:
            _flush(llm)
        base += phase(f"base{r}", [], None)
        with_loads += phase(f"loads{r}", loads, load_ttfts)
        # the same requests again, now device hits: what serving them costs the streams
        # without any tier I/O (their last token is computed either way)
        device_hits += phase(f"hits{r}", loads, hit_ttfts)
    llm.engine.close()
    row = {
        "tier": name,
        "prompt_tokens": n,
        "streams": num_streams,
        "loads": num_loads,
        "rounds": rounds,
        "gaps_per_phase": len(base),
        "itl_p50_s": _pct(base, 0.5),
        "itl_p99_s": _pct(base, 0.99),
        "itl_p50_loads_s": _pct(with_loads, 0.5),
        "itl_p99_loads_s": _pct(with_loads, 0.99),
        "itl_max_loads_s": max(with_loads),
        "mean_s": statistics.mean(base),
        "mean_loads_s": statistics.mean(with_loads),
        "itl_p50_device_hits_s": _pct(device_hits, 0.5),
        "itl_p99_device_hits_s": _pct(device_hits, 0.99),
        # what pacing costs the loading requests: their time to first token, loaded and as hits
        "load_ttft_median_s": statistics.median(load_ttfts),
        "hit_ttft_median_s": statistics.median(hit_ttfts),
    }
    row["p99_ratio"] = row["itl_p99_loads_s"] / row["itl_p99_s"]
    row["p99_ratio_to_device_hits"] = row["itl_p99_loads_s"] / row["itl_p99_device_hits_s"]
    print(f"  itl {name}: {row}", flush=True)
    return row


def bench_itl(server: RedisServer, tmp: Path, quick: bool) -> list[dict]:
    size, streams, loads, steps, rounds = (512, 2, 3, 24, 1) if quick else (2048, 4, 8, 96, 3)
    configs = {
        "disk": TierConfig(disk_path=tmp / "itl-disk", deadline_s=60.0),
        "redis": TierConfig(
            redis_url=server.url, redis_prefix="bench-itl", redis_timeout_s=10.0, deadline_s=60.0
        ),
    }
    rows = [
        bench_itl_tier(name, cfg, size, streams, loads, steps, rounds)
        for name, cfg in configs.items()
    ]
    header = ["tier", "prompt", "streams", "loads", "p50", "p99", "p50 loads", "p99 loads"]
    header += ["p50 hits", "p99 hits", "p99 ratio to hits", "p99 ratio", "load TTFT", "hit TTFT"]
    print(
        "\nTime per output token (s) of running streams, alone and while other requests load "
        "their prefix from the tier, and while the same requests are device hits (deadline 60 s: no "
        "load cut short)"
    )
    print("  ".join(header))
    for r in rows:
        cells = [r["tier"], r["prompt_tokens"], r["streams"], r["loads"], r["itl_p50_s"],
                 r["itl_p99_s"], r["itl_p50_loads_s"], r["itl_p99_loads_s"],
                 r["itl_p50_device_hits_s"], r["itl_p99_device_hits_s"],
                 r["p99_ratio_to_device_hits"], r["p99_ratio"],
                 r["load_ttft_median_s"], r["hit_ttft_median_s"]]  # fmt: skip
        print("  ".join(f"{c:.4f}" if isinstance(c, float) else str(c) for c in cells))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp))
        server.start()
        try:
            bench_itl(server, Path(tmp), args.quick)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
