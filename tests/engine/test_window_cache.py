"""The prefix cache of models with sliding-window layers (a hybrid KV cache: those layers keep a
pool of their own). Float32 tiny models, 4-token blocks; every answer is checked against the
cache turned off, and the window pool's references against the sequences' tables.

- a running sequence lets go of its windowed layers' blocks that fell out of its window;
- a hit needs only the windowed blocks before it: a cached prefix whose older twins were
  evicted still hits, a match is cut where the twins it reads are missing;
- windowed blocks spill to a tier with their full-attention half and load back."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from engine.kv.admin import CacheStatsOp, CheckIntegrity, Flush
from engine.kv.hybrid_cache import HybridKVCache
from engine.request import Prompt
from engine.sampling_params import SamplingParams
from radixcache.window_blocks import NULL_BLOCK, blocks_before_hit
from storage.config import TierConfig
from tests.tiny_models import GEMMA_CONFIGS, WINDOWS, make_tiny_gemma

BS = 4
GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
MODELS = ["mistral-swa", "qwen2-swa", "gemma-d32-mixed"]


@pytest.fixture(scope="module")
def hybrid_models(windowed_models, tmp_path_factory) -> dict[str, tuple[Path, int]]:
    """name -> (folder, window): Mistral (every layer windowed), Qwen2 (layer 1 windowed),
    Gemma 3 (sliding and full layers interleaved)."""
    _, gemma = make_tiny_gemma(tmp_path_factory.mktemp("gemma"), "d32-mixed")
    out = {arch: (windowed_models[arch], WINDOWS[arch]) for arch in WINDOWS}
    out["gemma-d32-mixed"] = (gemma, GEMMA_CONFIGS["d32-mixed"]["sliding_window"])
    return out


def tokens_of(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 250) for _ in range(n)]


def answers(llm, prompts: list[list[int]], params: SamplingParams = GREEDY) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


def check(llm) -> None:
    llm.engine.admin(CheckIntegrity())


@pytest.mark.parametrize("name", MODELS)
def test_a_sequence_lets_go_of_blocks_out_of_its_window(make_llm, hybrid_models, name):
    path, window = hybrid_models[name]
    prompt = tokens_of(1, 10 * window)
    want = answers(make_llm(path, num_blocks=128, enable_prefix_caching=False), [prompt])
    held = {}
    for release in (True, False):
        llm = make_llm(
            path, num_blocks=128, max_num_batched_tokens=16, release_window_blocks=release
        )
        assert isinstance(llm.engine.kv.kv_cache, HybridKVCache)
        engine = llm.engine
        engine.add_request("r", Prompt(prompt), GREEDY)
        most, tokens = 0, []
        while engine.has_unfinished():
            for out in engine.step():
                tokens += out.outputs[0].token_ids
            for seq in engine.scheduler.running:
                live = [w for w in seq.window_block_ids if w != NULL_BLOCK]
                assert len(seq.window_block_ids) == len(seq.block_ids)
                most = max(most, len(live))
                if release:  # nothing before the next token's window
                    first = (seq.num_computed_tokens - window + 1) // BS
                    assert all(w == NULL_BLOCK for w in seq.window_block_ids[: max(0, first)])
            check(llm)
        assert tokens == want[0]
        held[release] = most
        check(llm)
    total = -(-(len(prompt) + GREEDY.max_tokens) // BS)
    assert held[False] >= total - 1
    # its window, the step's chunk (16 tokens) and a partial block
    assert held[True] <= blocks_before_hit(window, BS) + 16 // BS + 1 < held[False]


@pytest.mark.parametrize("name", MODELS)
def test_hits_reuse_released_twins_and_stay_exact(make_llm, hybrid_models, name):
    """Shared heads 6x the window: hits whole, mid-node and mid-block, and a second turn over
    the first turn's answer; every answer equals the cache off."""
    path, window = hybrid_models[name]
    head = tokens_of(2, 6 * window)
    prompts = [
        head + tokens_of(3, 9),
        head[:-3] + tokens_of(4, 9),  # diverges inside the first prompt's node, mid-block
        head[: window + 5] + tokens_of(5, 7),  # a hit far shorter than the cached head
    ]
    cold = make_llm(path, num_blocks=256, enable_prefix_caching=False)
    want = answers(cold, prompts)
    warm = make_llm(path, num_blocks=256, max_num_batched_tokens=16)
    for prompt, expected in zip(prompts, want, strict=True):
        assert answers(warm, [prompt]) == [expected]
        check(warm)
    stats = warm.engine.admin(CacheStatsOp()).windows
    assert stats.evicted == 0 and stats.hit_tokens == stats.full_hit_tokens
    assert stats.hit_tokens >= (len(head) - 3) // BS * BS + (window + 5) // BS * BS - 2 * BS
    second = [p + ids + tokens_of(6, window) for p, ids in zip(prompts, want, strict=True)]
    assert answers(warm, second) == answers(cold, second)
    check(warm)


@pytest.mark.parametrize("name", MODELS)
def test_a_small_window_pool_evicts_twins_and_cuts_matches(make_llm, hybrid_models, name):
    """The window pool at its least: twins are evicted while their full blocks stay, matches
    are cut to where the windowed layers have their blocks, and no answer changes."""
    path, window = hybrid_models[name]
    least = blocks_before_hit(window, BS) + 16 // BS + 1
    heads = [tokens_of(10 + i, 5 * window) for i in range(3)]
    prompts = [h + tokens_of(20 + i, 6) for i, h in enumerate(heads)]
    prompts += [h + tokens_of(30 + i, 6) for i, h in enumerate(heads)]
    cold = make_llm(path, num_blocks=256, enable_prefix_caching=False)
    want = answers(cold, prompts)
    warm = make_llm(
        path, num_blocks=256, num_window_blocks=least, max_num_batched_tokens=16, max_num_seqs=1
    )
    for prompt, expected in zip(prompts, want, strict=True):
        assert answers(warm, [prompt]) == [expected]
        check(warm)
    cache = warm.engine.admin(CacheStatsOp())
    stats = cache.windows
    assert stats.num_blocks == least and stats.evicted > 0
    assert stats.tombstones > 0 and cache.cached > stats.cached
    assert stats.hit_tokens < stats.full_hit_tokens  # some matches were cut


def test_the_budget_gives_the_window_pool_a_small_share(make_llm, hybrid_models):
    path, window = hybrid_models["gemma-d32-mixed"]
    llm = make_llm(path, kv_cache_memory=64 << 20, max_model_len=512, max_num_batched_tokens=64)
    kv = llm.engine.kv.kv_cache
    assert isinstance(kv, HybridKVCache)
    assert kv.groups.full_layers == (1, 3) and kv.groups.window_layers == (0, 2, 4)
    # a 512-token sequence: 128 full blocks, its window and a chunk: 2 + 16 + 1 window blocks
    assert kv.num_window_blocks == pytest.approx(kv.num_blocks * 19 / 128, rel=0.01)
    assert (64 << 20) * 0.99 <= kv.nbytes <= 64 << 20
    with pytest.raises(ValueError, match="at least"):
        make_llm(path, num_blocks=64, num_window_blocks=2)


@pytest.mark.parametrize("name", ["mistral-swa", "gemma-d32-mixed"])
def test_windowed_blocks_spill_to_disk_and_load_back(make_llm, hybrid_models, tmp_path, name):
    path, window = hybrid_models[name]
    head = tokens_of(40, 5 * window)
    first, second = head + tokens_of(41, 5), head + tokens_of(42, 5)
    cold = make_llm(path, num_blocks=256, enable_prefix_caching=False)
    want = answers(cold, [first, second])
    llm = make_llm(path, num_blocks=256, tiers=TierConfig(disk_path=tmp_path / "disk"))
    assert answers(llm, [first]) == want[:1]
    llm.engine.admin(Flush())  # every cached block goes down, both halves
    assert llm.engine.kv.tiers.store.wait_idle(30)
    out = llm.generate([second], GREEDY)[0]
    assert out.outputs[0].token_ids == want[1]
    assert out.cached_tokens_by_tier.get("disk", 0) >= len(head) // BS * BS - BS
    check(llm)


def test_kv_events_follow_both_halves_of_a_block(make_llm, hybrid_models):
    """Group 0 (full attention) and group 1 (sliding window, with its window) are published
    apart: replaying each group's events gives the blocks the tree holds and the blocks that
    still have their twin; a twin evicted on its own removes only group 1."""
    from engine.kv.events import KVEventsConfig

    from .test_kv_events import events_of

    path, window = hybrid_models["gemma-d32-mixed"]
    least = blocks_before_hit(window, BS) + 16 // BS + 1
    llm = make_llm(
        path,
        num_blocks=64,
        num_window_blocks=least,
        max_num_batched_tokens=16,
        max_num_seqs=1,
        kv_events=KVEventsConfig("tcp://127.0.0.1:0", "tcp://127.0.0.1:0"),
    )
    for i in range(6):  # more blocks than the pool holds: both kinds of eviction happen
        answers(llm, [tokens_of(50 + i, 4 * window)])
    events = events_of(llm.engine.kv.publisher)
    held: dict[int, set[int]] = {0: set(), 1: set()}
    for e in events[1:]:  # after the first AllBlocksCleared
        assert e.group_idx in (0, 1) and e.medium == "GPU"
        if hasattr(e, "token_ids"):
            kind = {0: ("full_attention", None), 1: ("sliding_window", window)}[e.group_idx]
            assert (e.kv_cache_spec_kind, e.kv_cache_spec_sliding_window) == kind
            held[e.group_idx].update(e.block_hashes)
        else:
            held[e.group_idx].difference_update(e.block_hashes)
    cache = llm.engine.kv.cache
    windows = cache.windows
    tree_blocks = [b for n in cache.tree.iter_nodes() for b in n.blocks]
    hashes = dict(zip(tree_blocks, cache.block_hashes_of(tree_blocks), strict=True))
    assert held[0] == set(hashes.values())
    assert held[1] == {h for b, h in hashes.items() if windows.twin_of(b) != NULL_BLOCK}
    assert windows.stats().evicted > 0 and held[1] < held[0]


@pytest.mark.slow
def test_real_gemma3_hits_past_its_window_change_no_token(gemma_model_path):
    """Gemma 3 270M (float32, 512-token windows on 15 of 18 layers): prompts sharing a head of
    ~770 tokens, hit whole and cut mid-block, a second turn over the first answer; each answer
    equals the cache off."""
    from engine.llm import LLM
    from engine.loader import load_tokenizer

    from .test_llm_parity import long_text

    head = load_tokenizer(gemma_model_path).encode(long_text(56))
    prompts = [head + tokens_of(60, 20), head[:-5] + tokens_of(61, 20)]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    settings = {"dtype": "float32", "block_size": 16, "max_num_batched_tokens": 256}
    cold = LLM(str(gemma_model_path), **settings, num_blocks=128, enable_prefix_caching=False)
    want = answers(cold, prompts, params)
    second = prompts[0] + want[0] + tokens_of(62, 30)
    want.append(answers(cold, [second], params)[0])
    cold.engine.close()
    warm = LLM(str(gemma_model_path), **settings, num_blocks=256)
    got = [answers(warm, [p], params)[0] for p in (*prompts, second)]
    assert got == want
    stats = warm.engine.admin(CacheStatsOp()).windows
    assert stats.hit_tokens >= 2 * (len(head) - 5) // 16 * 16
    check(warm)
    warm.engine.close()
