"""The engine with spill tiers below a device pool far smaller than the working set: evicted
blocks go down (write-back), admission loads them back.

Tiny random-weight llama (float32, 4-token blocks); greedy outputs with tiers on must equal the
outputs with the cache off, and the tiers' counters must show the load-backs and the faults."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from engine.kv.admin import CheckIntegrity, Flush, Lookup
from engine.llm import LLM
from engine.sampling_params import SamplingParams
from storage.base import TierStats
from storage.codec import HEADER_SIZE
from storage.config import TierConfig
from storage.tiered import TieredStore
from tests.redis_server import RedisServer
from tests.tier_workload import (
    DEVICE_BLOCKS,
    PARAMS,
    cache_off_reference,
    tier_prompts,
    token_ids,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return tier_prompts()


@pytest.fixture(scope="module")
def expected(tiny_llama: Path, prompts: list[list[int]]) -> list[list[int]]:
    return cache_off_reference(tiny_llama, prompts)


def tier_store(llm: LLM) -> TieredStore:
    store = llm.engine.kv.tiers.store
    assert isinstance(store, TieredStore)
    return store


TIERED = {"max_num_seqs": 2, "num_blocks": DEVICE_BLOCKS}  # with make_llm's float32, 4-token blocks


def settle(llm: LLM) -> dict[str, TierStats]:
    """Empty the device cache into the tiers, wait for the writes; the tier counters."""
    llm.engine.admin(Flush())
    store = tier_store(llm)
    assert store.wait_idle(30)
    return {name: tier.stats for name, tier in store.stats().tiers.items()}


def tier_config(kind: str, tmp: Path, url: str, **kw: object) -> TierConfig:
    if kind == "host":
        return TierConfig(host_bytes=1 << 24, **kw)
    if kind == "disk":
        return TierConfig(disk_path=tmp / "disk", **kw)
    if kind == "redis":
        return TierConfig(redis_url=url, redis_prefix=f"e2e-{tmp.name}", **kw)
    return TierConfig(
        host_bytes=20_000, disk_path=tmp / "disk", disk_bytes=40_000, redis_url=url, **kw
    )


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["host", "disk", "redis", "chain"])
def test_load_back_equals_cache_off(
    make_llm, prompts, expected, tmp_path: Path, redis_server: RedisServer, kind: str
) -> None:
    llm = make_llm(**TIERED, tiers=tier_config(kind, tmp_path, redis_server.url))
    for _ in range(2):  # the second round finds most of its blocks evicted to the tiers
        outs = llm.generate(prompts, PARAMS)
        assert token_ids(outs) == expected
    stats = settle(llm)
    lower = {name: s.hits for name, s in stats.items()}
    assert sum(lower.values()) > 0, stats
    if kind != "chain":
        assert lower[kind] > 0
    from_tiers = sum(n for o in outs for t, n in o.cached_tokens_by_tier.items() if t != "device")
    assert from_tiers > 0
    assert token_ids(llm.generate(prompts, PARAMS)) == expected  # all from the tiers


def test_restart_on_the_same_disk_folder_gets_disk_hits(
    make_llm, prompts, expected, tmp_path: Path
) -> None:
    cfg = TierConfig(disk_path=tmp_path / "disk")
    first = make_llm(**TIERED, tiers=cfg)
    assert token_ids(first.generate(prompts, PARAMS)) == expected
    settle(first)
    first.engine.close()
    del first
    second = make_llm(**TIERED, tiers=cfg)
    outs = second.generate(prompts, PARAMS)
    assert token_ids(outs) == expected
    assert outs[0].cached_tokens_by_tier.get("disk", 0) >= 40  # 48-token prompt, 4-token blocks
    assert tier_store(second).stats().tiers["disk"].stats.hits > 0


FIRST_PROCESS = """
import json, sys
from engine.llm import LLM
from engine.sampling_params import SamplingParams
from storage.config import TierConfig
tiny_llama, url, prompts, out = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
tiers = TierConfig(redis_url=url, redis_prefix="shared", write_policy="write-through")
llm = LLM(tiny_llama, dtype="float32", block_size=4, max_num_seqs=2, seed=0, num_blocks=32, tiers=tiers)
p = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
ids = [o.outputs[0].token_ids for o in llm.generate(prompts, p)]
llm.engine.close()
open(out, "w").write(json.dumps(ids))
"""


@pytest.mark.slow
def test_two_processes_share_one_redis(
    make_llm, tiny_llama: Path, prompts, expected, tmp_path: Path, redis_server: RedisServer
) -> None:
    out = tmp_path / "first.json"
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    args = [str(tiny_llama), redis_server.url, json.dumps(prompts), str(out)]
    subprocess.run([sys.executable, "-c", FIRST_PROCESS, *args], check=True, env=env, timeout=300)
    assert json.loads(out.read_text()) == expected
    tiers = TierConfig(redis_url=redis_server.url, redis_prefix="shared")
    second = make_llm(**TIERED, tiers=tiers)
    outs = second.generate(prompts, PARAMS)
    assert token_ids(outs) == expected
    assert outs[0].cached_tokens_by_tier.get("redis", 0) >= 40
    assert tier_store(second).stats().tiers["redis"].stats.hits > 0


def test_redis_killed_mid_workload(
    make_llm, prompts, expected, tmp_path: Path, redis_server: RedisServer
) -> None:
    cfg = TierConfig(redis_url=redis_server.url, redis_cooldown_s=0.0, redis_timeout_s=0.5)
    llm = make_llm(**TIERED, tiers=cfg)
    assert token_ids(llm.generate(prompts, PARAMS)) == expected
    settle(llm)
    redis_server.kill()
    assert token_ids(llm.generate(prompts, PARAMS)) == expected
    stats = settle(llm)["redis"]
    assert stats.errors >= 1 and stats.breaker_opens >= 1
    redis_server.start()  # back, empty: the tier refills and serves again
    assert token_ids(llm.generate(prompts, PARAMS)) == expected
    settle(llm)
    assert token_ids(llm.generate(prompts, PARAMS)) == expected
    assert tier_store(llm).stats().tiers["redis"].stats.hits > stats.hits


def test_corrupt_disk_files_are_recomputed_and_counted(
    make_llm, prompts, expected, tmp_path: Path
) -> None:
    llm = make_llm(**TIERED, tiers=TierConfig(disk_path=tmp_path / "disk"))
    assert token_ids(llm.generate(prompts, PARAMS)) == expected
    settle(llm)
    files = sorted((tmp_path / "disk").rglob("*.kv"))
    assert files
    for i, f in enumerate(files):
        data = bytearray(f.read_bytes())
        if i % 2:
            data[HEADER_SIZE + i % 64] ^= 0x10  # one flipped bit
        else:
            del data[len(data) // 2 :]  # truncated
        f.write_bytes(bytes(data))
    assert token_ids(llm.generate(prompts, PARAMS)) == expected
    stats = settle(llm)["disk"]
    assert stats.corrupt > 0


def test_tiny_disk_budget_stops_writes_serving_continues(
    make_llm, prompts, expected, tmp_path: Path
) -> None:
    llm = make_llm(**TIERED, tiers=TierConfig(disk_path=tmp_path / "disk", disk_bytes=100))
    for _ in range(2):
        assert token_ids(llm.generate(prompts, PARAMS)) == expected
    stats = settle(llm)["disk"]
    assert stats.rejected_writes > 0 and stats.blocks_written == 0
    assert not list((tmp_path / "disk").rglob("*.kv"))


def test_namespaces_isolated_through_the_engine(
    make_llm, prompts, expected, tmp_path: Path, redis_server: RedisServer
) -> None:
    llm = make_llm(**TIERED, tiers=tier_config("chain", tmp_path, redis_server.url))
    assert token_ids(llm.generate(prompts, PARAMS, cache_salt="tenant-a")) == expected
    settle(llm)
    outs = llm.generate(prompts, PARAMS, cache_salt="tenant-b")
    assert token_ids(outs) == expected
    assert outs[0].num_cached_tokens == 0


SHORT = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


def short_prompts() -> list[list[int]]:
    rng = random.Random(5)
    return [[rng.randrange(3, 250) for _ in range(21)] for _ in range(4)]


def test_host_tier_loads_back_evicted_prefixes(make_llm):
    prompts = short_prompts()
    reference = token_ids(
        make_llm(num_blocks=64, enable_prefix_caching=False).generate(prompts, SHORT)
    )
    llm = make_llm(num_blocks=8, tiers=TierConfig(host_bytes=8 << 20))
    engine = llm.engine
    first = [llm.generate([p], SHORT)[0] for p in prompts]  # each evicts the previous
    assert token_ids(first) == reference
    engine.kv.tiers.store.wait_idle(10)
    assert (
        engine.admin(Lookup(prompts[0]))["host"] == 20
    )  # five blocks of tokens[:-1] (all but the last)
    again = llm.generate([prompts[0]], SHORT)[0]
    assert again.outputs[0].token_ids == reference[0]
    assert again.cached_tokens_by_tier.get("host", 0) == 20
    assert again.num_cached_tokens == 20
    engine.kv.cache.check_integrity()
    assert engine.snapshot().tiers.tiers["host"].stats.hits >= 5


def test_disk_tier_survives_a_restart(make_llm, tmp_path):
    prompts = short_prompts()
    tiers = TierConfig(disk_path=tmp_path / "kv", disk_bytes=64 << 20)
    first = make_llm(num_blocks=64, tiers=tiers)
    want = token_ids(first.generate(prompts[:2], SHORT))
    first.engine.admin(Flush())  # evict everything: write-back to disk
    first.engine.close()
    second = make_llm(num_blocks=64, tiers=tiers)
    outs = second.generate(prompts[:2], SHORT)
    assert token_ids(outs) == want
    assert all(o.cached_tokens_by_tier.get("disk", 0) == 20 for o in outs)


def test_a_load_from_a_stalled_tier_does_not_stall_running_streams(
    make_llm, tmp_path: Path, redis_server: RedisServer
) -> None:
    """While Redis stalls every client, a request whose prefix is only in Redis waits in its own
    state (LOADING) and the running stream gets a token every step; once Redis answers, the
    request is admitted with its prefix loaded, not recomputed."""
    from engine.request import Prompt, SequenceStatus

    tiers = tier_config("redis", tmp_path, redis_server.url, deadline_s=60.0, redis_timeout_s=30.0)
    llm = make_llm(num_blocks=256, tiers=tiers)
    engine = llm.engine
    rng = random.Random(7)
    loaded = [rng.randrange(10, 200) for _ in range(41)]  # 10 full blocks of tokens[:-1]
    llm.generate([loaded], PARAMS)
    settle(llm)  # its blocks now live only in Redis
    long = SamplingParams(max_tokens=500, temperature=0.0, ignore_eos=True)
    engine.add_request("stream", Prompt([rng.randrange(10, 200) for _ in range(9)]), long)
    while not engine.requests["stream"].seqs[0].num_output_tokens:
        engine.step()
    redis_server.client().client_pause(2000)  # the loader's Redis calls block for 2 s
    engine.add_request("load", Prompt(loaded), PARAMS)
    waiting = engine.requests["load"].seqs[0]
    stream = engine.requests["stream"].seqs[0]
    steps = stream_tokens = 0
    while not stream.is_finished:
        outs = engine.step()
        if waiting.status is not SequenceStatus.LOADING:
            break
        steps += 1
        stream_tokens += sum(len(d.token_ids) for o in outs for d in o.outputs)
    assert steps >= 2 and stream_tokens == steps  # a token every step while the load waited
    result = None
    while result is None:
        result = next((o for o in engine.step() if o.request_id == "load" and o.finished), None)
    assert result.cached_tokens_by_tier.get("redis", 0) == 40
    engine.abort("stream")  # (when still running)
    engine.admin(CheckIntegrity())


def _start_a_stream_and_a_load(make_llm, tmp_path: Path):
    """A stream decoding, then a request whose 10-block prefix is only on disk; with no share of
    a step for it, the engine copies one loaded block a step into the pool while the stream
    decodes."""
    from engine.request import Prompt

    llm = make_llm(num_blocks=256, tiers=tier_config("disk", tmp_path, "", deadline_s=60.0))
    engine = llm.engine
    engine.kv.tiers.install_share = 0.0
    rng = random.Random(11)
    loaded = [rng.randrange(10, 200) for _ in range(41)]  # 10 full blocks of tokens[:-1]
    want = token_ids(llm.generate([loaded], PARAMS))
    settle(llm)
    long = SamplingParams(max_tokens=500, temperature=0.0, ignore_eos=True)
    engine.add_request("stream", Prompt([rng.randrange(10, 200) for _ in range(9)]), long)
    while not engine.requests["stream"].seqs[0].num_output_tokens:
        engine.step()
    engine.add_request("load", Prompt(loaded), PARAMS)
    return llm, want


def test_a_long_load_goes_into_the_pool_over_several_steps(make_llm, tmp_path: Path) -> None:
    from engine.request import SequenceStatus

    llm, want = _start_a_stream_and_a_load(make_llm, tmp_path)
    engine = llm.engine
    engine.step()
    seq, stream = engine.requests["load"].seqs[0], engine.requests["stream"].seqs[0]
    written: list[int] = []
    while seq.status is SequenceStatus.LOADING:
        before = stream.num_output_tokens
        engine.step()
        assert stream.num_output_tokens == before + 1  # the stream never waits for the load
        if seq.kv_load is not None and seq.kv_load.arrived is not None:
            written.append(seq.kv_load.written)
    assert written == list(range(1, 10))  # one a step; the step with the last one admits it
    outs = []
    while not outs:
        outs = [o for o in engine.step() if o.request_id == "load" and o.finished]
    assert outs[0].cached_tokens_by_tier.get("disk", 0) == 40
    assert [seq.output_token_ids] == want  # as computed before it went to disk
    engine.abort("stream")
    engine.admin(CheckIntegrity())


def test_a_request_aborted_while_its_load_goes_in_leaks_nothing(make_llm, tmp_path: Path) -> None:
    llm, _ = _start_a_stream_and_a_load(make_llm, tmp_path)
    engine = llm.engine
    free_before = engine.kv.cache.num_free_blocks()
    seq = engine.requests["load"].seqs[0]
    while seq.kv_load is None or not seq.kv_load.written:
        engine.step()
    assert seq.kv_load.written < 10  # part of it copied in
    engine.abort("load")
    engine.step()
    engine.admin(CheckIntegrity())
    assert engine.kv.cache.num_free_blocks() >= free_before - 1  # at most the stream's new block
    engine.abort("stream")
