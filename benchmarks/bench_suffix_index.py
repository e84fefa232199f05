"""The speculative suffix index (radixcache/suffix_index.py) at its bound: memory and speed.

Finished runs are added until the index holds --tokens tokens (the engine's bound by default) and
keeps evicting the oldest; then its Python memory (tracemalloc), bytes per token held, microseconds
per token added and per draft proposed. Two kinds of text: random tokens (every n-gram new: the
most keys, the worst case for memory) and repetitive text (16 passages, each run one of them with
5% of its tokens changed: n-grams recur and the latest run takes them over).

    python -m benchmarks.bench_suffix_index [--tokens 262144] [--run-tokens 300]
"""

from __future__ import annotations

import argparse
import random
import time
import tracemalloc

from benchmarks.results_io import write_results
from engine.speculative.config import DEFAULT_INDEX_TOKENS, SpecConfig
from radixcache import Namespace
from radixcache.suffix_index import SuffixIndex

NS = Namespace("bench-model", "bfloat16", 16)
TEXTS = ("random", "repetitive")
VOCAB = 49_152


def make_runs(kind: str, count: int, run_tokens: int, rng: random.Random) -> list[list[int]]:
    if kind == "random":
        return [[rng.randrange(VOCAB) for _ in range(run_tokens)] for _ in range(count)]
    passages = make_runs("random", 16, run_tokens, rng)
    runs = []
    for i in range(count):
        run = list(passages[i % len(passages)])
        for j in rng.sample(range(run_tokens), run_tokens // 20):
            run[j] = rng.randrange(VOCAB)
        runs.append(run)
    return runs


def bench(kind: str, max_tokens: int, run_tokens: int, ngram_sizes: tuple[int, ...]) -> dict:
    rng = random.Random(0)
    # past the bound: evictions run as in a long-lived server
    runs = make_runs(kind, 2 * max_tokens // run_tokens, run_tokens, rng)
    index = SuffixIndex(max_tokens, ngram_sizes)
    t0 = time.perf_counter()
    for run in runs:
        index.add(NS, run)
    add_s = time.perf_counter() - t0
    tracemalloc.start()  # a second index for the memory: tracing slows every allocation
    traced = SuffixIndex(max_tokens, ngram_sizes)
    for run in runs:
        traced.add(NS, run)
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    added = len(runs) * run_tokens
    held_runs = runs[-(max_tokens // run_tokens) :][-64:]  # runs the index still holds
    queries = [run[: rng.randrange(8, run_tokens)] for run in held_runs] * 50
    t0 = time.perf_counter()
    hits = sum(len(index.propose(NS, q, 8)) > 0 for q in queries)
    propose_s = time.perf_counter() - t0
    return {
        "text": kind,
        "bound_tokens": max_tokens,
        "tokens_held": index.num_tokens,
        "keys": index.num_keys(),
        "mib": held / 2**20,
        "bytes_per_token": held / index.num_tokens,
        "add_us_per_token": 1e6 * add_s / added,
        "propose_us": 1e6 * propose_s / len(queries),
        "hit_share": hits / len(queries),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=DEFAULT_INDEX_TOKENS, help="the bound")
    parser.add_argument("--run-tokens", type=int, default=300, help="tokens of one finished run")
    parser.add_argument("--out", default="suffix_index")
    args = parser.parse_args()
    sizes = SpecConfig().ngram_sizes  # the engine's n-gram sizes
    rows = [bench(kind, args.tokens, args.run_tokens, sizes) for kind in TEXTS]
    print(
        f"{'text':<11} {'tokens':>8} {'keys':>8} {'MiB':>7} {'B/token':>8} "
        f"{'add us/tok':>10} {'propose us':>10} {'hits':>5}"
    )
    for r in rows:
        print(
            f"{r['text']:<11} {r['tokens_held']:>8} {r['keys']:>8} {r['mib']:>7.1f} "
            f"{r['bytes_per_token']:>8.0f} {r['add_us_per_token']:>10.2f} "
            f"{r['propose_us']:>10.2f} {r['hit_share']:>5.0%}"
        )
    print(f"wrote {write_results(args.out, rows, ngram_sizes=list(sizes))}")


if __name__ == "__main__":
    main()
