"""A short soak: 64 concurrent streaming clients (hang-ups, n>1, stop strings, long prompts) against
a small KV pool with host and disk tiers. Afterwards, idle: nothing referenced, invariants hold,
memory flat, and every completed answer equals the cache-off reference."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from benchmarks.soak_driver import is_idle, make_requests, rss_bytes, run_soak, wait_idle
from engine.sampling_params import SamplingParams
from tests.serve_process import ServeProcess

BLOCK = 4
CLIENTS = 64
ROUNDS = 5
WARM_UP_ROUNDS = 3  # the allocators settle over the first rounds
# Bounded caches would make memory climb for rounds before it is flat: the disk tier's index and
# the suffix index (one entry per stored block and per finished token) are bounded small enough
# to fill in the first round, and oneDNN's primitive cache (a primitive per padded row count and
# weight shape, up to 1,024, each with its scratch memory) is off, so what is measured is ours.
BOUNDED = ["--disk-bytes", "4M", "--speculative-index-tokens", "4096"]
NO_PRIMITIVE_CACHE = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "0"}


def reference_texts(make_llm, requests) -> list[str]:
    llm = make_llm(num_blocks=512, block_size=BLOCK, enable_prefix_caching=False, max_model_len=512)
    params = [
        SamplingParams(temperature=0, max_tokens=r.max_tokens, stop=r.stop, ignore_eos=False)
        for r in requests
    ]
    return [o.outputs[0].text for o in llm.generate([r.prompt for r in requests], params)]


@pytest.mark.slow
def test_soak_leaves_nothing_behind(make_llm, tiny_llama: Path, tmp_path: Path) -> None:
    rounds = [make_requests(2 * CLIENTS, seed=s, prefix_len=64) for s in range(ROUNDS)]
    args = ["--model", str(tiny_llama), "--dtype", "float32", "--block-size", str(BLOCK)]
    args += ["--num-blocks", "160", "--max-num-seqs", "8", "--max-model-len", "512"]
    args += ["--host-tier-bytes", "2M", "--disk-path", str(tmp_path / "kv"), "--threads", "1"]
    args += [*BOUNDED, "--log-level", "warning"]
    server = ServeProcess(args, tmp_path / "home", env=NO_PRIMITIVE_CACHE)
    server.wait_healthy()
    rss = []
    try:
        for requests in rounds:
            result = asyncio.run(run_soak(server.url, tiny_llama.name, requests, CLIENTS))
            assert result.errors == []
            assert result.completed + result.hung_up == len(requests)
            assert result.hung_up > 0 and result.completed > len(requests) // 2
            want = reference_texts(make_llm, requests)
            for index, texts in result.texts.items():
                assert texts == [want[index]] * requests[index].n, requests[index]
            report = wait_idle(server.url)
            assert is_idle(report), report
            assert report["ok"], report["error"]
            rss.append(rss_bytes(server.proc.pid))
    finally:
        server.terminate()
    rss_mb = [r // 2**20 for r in rss]
    assert rss[-1] <= rss[WARM_UP_ROUNDS - 1] * 1.05, rss_mb  # after the warm-up, memory is flat
