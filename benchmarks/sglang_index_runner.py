"""Replays bench_index's token traces through SGLang's RadixCache (run by SGLang's own interpreter).

Run by benchmarks/bench_index.py as `SGLANG_PYTHON sglang_index_runner.py IN.json OUT.json`; it
imports nothing of radixcache. IN holds the traces and how to build the eviction trees; OUT gets per-request CPU
microseconds (match, insert) and evict(1,024 tokens) times, measured with the same clock and gc
handling as bench_index (thread CPU time; gc.collect + gc.freeze after the inputs are built).
SGLang's import reaches triton, tvm_ffi and torchvision (GPU / vision packages); they are stood
in for by empty modules here, before the import, since the radix tree never calls them.

The interpreter's venv, outside the project (what `sglang.srt.mem_cache.radix_cache` imports):
    python3 -m venv /work/venvs/sglang && P=/work/venvs/sglang/bin/pip
    $P install torch==2.13.0 numpy && $P install --no-deps sglang==0.5.23
    $P install orjson psutil pybase64 requests pillow msgspec pydantic pyzmq tqdm aiohttp \
        starlette transformers packaging ipython dill sentencepiece loguru gguf
    $P install --no-deps compressed-tensors
(pip warns that sglang pins other torch / transformers versions: the radix tree does not care.)
"""

from __future__ import annotations

import gc
import importlib.abc
import importlib.machinery
import importlib.metadata
import json
import random
import statistics
import sys
import time
import types
from array import array


class _Stub(types.ModuleType):
    """A module whose every attribute is another stub (class names give an empty class)."""

    def __getattr__(self, name: str):  # noqa: ANN204
        if name.startswith("__"):
            raise AttributeError(name)
        if name[:1].isupper():  # for isinstance() checks and subclassing at import time
            return type(name, (), {"__init__": lambda self, *a, **k: None})
        return _Stub(f"{self.__name__}.{name}")

    def __call__(self, *args, **kwargs):  # noqa: ANN204
        # used as a decorator (triton.jit): hand back the function
        return args[0] if len(args) == 1 and callable(args[0]) and not kwargs else self


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots: tuple[str, ...]) -> None:
        self.roots = roots

    def find_spec(self, name, path=None, target=None):  # noqa: ANN001, ANN201
        if name.split(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):  # noqa: ANN001, ANN201
        return _Stub(spec.name)

    def exec_module(self, module) -> None:  # noqa: ANN001
        module.__path__ = []
        module.__version__ = "0.0.0"


def import_radix_cache():  # noqa: ANN201
    sys.meta_path.insert(0, _StubFinder(("triton", "tvm_ffi")))
    # transformers records which optional packages exist at import: let it see no torchvision
    import transformers.utils.import_utils  # noqa: F401

    sys.meta_path.insert(0, _StubFinder(("torchvision",)))
    from sglang.srt.mem_cache import radix_cache
    from sglang.srt.mem_cache.base_prefix_cache import (
        EvictParams,
        InsertParams,
        MatchPrefixParams,
    )

    return radix_cache, MatchPrefixParams, InsertParams, EvictParams


class MockAllocator:
    """What RadixCache asks of the KV allocator when it evicts: nothing is really freed."""

    device = "cpu"

    def free_segment(self, *args, **kwargs) -> None:
        pass

    def free(self, *args, **kwargs) -> None:
        pass


def rand_tokens(rng: random.Random, n: int, vocab: int = 49152) -> list[int]:
    return [rng.randrange(100, vocab - 100) for _ in range(n)]


def evict_sequences(kind: str, seed: int) -> list[list[int]]:
    """The prompts of a ~10^6-token eviction tree (shared with bench_index, so both trees match).

    "many_leaves": 488 groups x 16 prompts of a 1,024-token prefix + 64 tokens (~7,800 leaves);
    "long_leaves": 115 groups x 4 prompts of a 256-token prefix + 2,112 tokens (460 leaves)."""
    groups, per_group, prefix_len, suffix_len = {
        "many_leaves": (488, 16, 1024, 64),
        "long_leaves": (115, 4, 256, 2112),
    }[kind]
    rng = random.Random(seed)
    out = []
    for _ in range(groups):
        prefix = rand_tokens(rng, prefix_len)
        out += [prefix + rand_tokens(rng, suffix_len) for _ in range(per_group)]
    return out


def clock() -> int:
    return time.thread_time_ns()


def settle() -> None:
    gc.collect()
    gc.freeze()


def main() -> None:
    import torch

    torch.set_num_threads(1)
    rc, MatchPrefixParams, InsertParams, EvictParams = import_radix_cache()
    RadixCache, RadixKey = rc.RadixCache, rc.RadixKey
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    out: dict = {"sglang": importlib.metadata.version("sglang"), "traces": {}, "evict": {}}

    def new_tree(page_size: int):  # noqa: ANN202
        return RadixCache.create_simulated(mock_allocator=MockAllocator(), page_size=page_size)

    for name, trace in spec["traces"].items():
        for ps in spec["block_sizes"]:
            tree = new_tree(ps)
            keys = [array("q", t) for t in trace]
            lookups = [array("q", t[:-1]) for t in trace]
            values = [torch.arange(len(t), dtype=torch.int64) for t in trace]
            match_t, insert_t, matched = [], [], []
            settle()
            for key, lookup, value in zip(keys, lookups, values, strict=True):
                t0 = clock()
                m = tree.match_prefix(MatchPrefixParams(key=RadixKey(lookup)))
                t1 = clock()
                node = m.last_device_node
                tree.inc_lock_ref(node)
                t2 = clock()
                tree.insert(InsertParams(key=RadixKey(key), value=value))
                t3 = clock()
                tree.dec_lock_ref(node)
                match_t.append((t1 - t0) / 1e3)
                insert_t.append((t3 - t2) / 1e3)
                matched.append(m.device_prefix_len)
            gc.unfreeze()
            out["traces"][f"{name}/{ps}"] = {
                "match": match_t,
                "insert": insert_t,
                "matched": matched,
            }
    for name, tree_spec in spec["evict_trees"].items():
        ps = tree_spec["block_size"]
        tree = new_tree(ps)
        for seq in evict_sequences(tree_spec["kind"], tree_spec["seed"]):
            n = len(seq) // ps * ps
            tree.insert(InsertParams(key=RadixKey(array("q", seq[:n])), value=torch.arange(n)))
        leaves, cached = len(tree.evictable_leaves), tree.total_size()
        settle()
        times, freed = [], []
        for _ in range(spec["evict_reps"]):
            t0 = clock()
            res = tree.evict(EvictParams(num_tokens=spec["evict_tokens"]))
            times.append((clock() - t0) / 1e3)
            freed.append(res.num_tokens_evicted)
        gc.unfreeze()
        out["evict"][name] = {
            "leaves": leaves,
            "cached_tokens": cached,
            "us": statistics.median(times),
            "tokens_freed": statistics.median(freed),
        }
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
