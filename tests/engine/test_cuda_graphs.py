"""The decode-graph bookkeeping (engine/cuda_graphs/runner.py) on CPU: buckets, padding, static buffers
and which steps replay, driven through the real tiny model with the eager-replay backend (a
replay re-runs the static-buffer forward, where CUDA replays a graph of it)."""

from __future__ import annotations

import random

import pytest
import torch

from engine.attention import build_attention_metadata, compute_positions
from engine.cuda_graphs import DecodeGraphs
from engine.cuda_graphs.backends import EagerReplayBackend
from engine.cuda_graphs.layout import bucket_sizes, pad_layout
from engine.kv.paged_cache import KVCache
from engine.kv.quant import KV_FORMATS, KVFormat
from engine.sampling_params import SamplingParams

BLOCK = 4
PROMPT_LENS = [5, 9, 3, 12, 7, 4, 10]


def test_buckets_are_1_2_4_8_then_steps_of_8():
    assert bucket_sizes(1) == [1]
    assert bucket_sizes(3) == [1, 2, 4]
    assert bucket_sizes(16) == [1, 2, 4, 8, 16]
    assert bucket_sizes(20) == [1, 2, 4, 8, 16, 24]


def test_padding_layout():
    # 2 sequences, 3 rows (a verify of 2 rows, a decode) in a bucket of 8: 5 padding sequences
    # of one row each, then one empty sequence
    layout = pad_layout([2, 1], [10, 6], 8)
    assert layout.query_lens == [2, 1, 1, 1, 1, 1, 1, 0]
    assert layout.seq_lens == [10, 6, 1, 1, 1, 1, 1, 0]
    assert layout.cu_seqlens_q.tolist() == [0, 2, 3, 4, 5, 6, 7, 8, 8]
    with pytest.raises(ValueError):
        pad_layout([4, 4], [9, 9], 4)


def test_scratch_block_is_outside_the_pool_and_inside_the_budget():
    per_block = 2 * 2 * BLOCK * 2 * 8 * 4  # layers, K/V, slots, heads, dim, float32
    kw = {"memory_bytes": 10 * per_block}
    plain = KVCache.from_budget(2, BLOCK, 2, 8, torch.float32, **kw)
    kv = KVCache.from_budget(2, BLOCK, 2, 8, torch.float32, scratch_block=True, **kw)
    assert (plain.num_blocks, plain.scratch_block) == (10, None)
    assert (kv.num_blocks, kv.scratch_block, kv.tensor.shape[2]) == (9, 9, 10)
    assert kv.nbytes == plain.nbytes


@pytest.fixture(scope="module")
def model(tiny_models):
    from engine.loader import load_model

    return load_model(tiny_models["llama"])


def _tables() -> list[list[int]]:
    """Disjoint block tables with room for each prompt plus a few tokens."""
    tables, next_block = [], 0
    for n in PROMPT_LENS:
        count = -(-(n + 4) // BLOCK)
        tables.append(list(range(next_block, next_block + count)))
        next_block += count
    return tables


def _prefilled(model, kv_format: KVFormat | None = None) -> KVCache:
    kv = KVCache(
        model.config.num_hidden_layers,
        48,
        BLOCK,
        model.config.num_key_value_heads,
        model.config.head_dim,
        model.dtype,
        scratch_block=True,
        kv_format=kv_format,
    )
    meta = build_attention_metadata(PROMPT_LENS, PROMPT_LENS, _tables(), BLOCK)
    ids = torch.randint(3, 250, (sum(PROMPT_LENS),), generator=torch.Generator().manual_seed(0))
    positions = torch.from_numpy(compute_positions(PROMPT_LENS, PROMPT_LENS))
    model.forward(ids, positions, kv.tensor, meta)
    return kv


def _step(num_seqs: int, drafts: dict[int, int], seed: int):
    """A decode step of the first num_seqs sequences; drafts[b]: b verifies that many drafts."""
    query_lens = [1 + drafts.get(b, 0) for b in range(num_seqs)]
    seq_lens = [PROMPT_LENS[b] + q for b, q in enumerate(query_lens)]
    verify = [b in drafts for b in range(num_seqs)]
    meta = build_attention_metadata(
        query_lens, seq_lens, _tables()[:num_seqs], BLOCK, verify=verify
    )
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 250, (sum(query_lens),), generator=gen)
    positions = torch.from_numpy(compute_positions(query_lens, seq_lens))
    return ids, positions, meta


@pytest.mark.parametrize(
    ("num_seqs", "drafts"),
    [
        (1, {}),  # bucket 1, no padding
        (3, {}),  # bucket 4: one padding row
        (5, {}),  # bucket 8: three padding rows
        (7, {}),  # bucket 8
        (3, {0: 2, 2: 3}),  # verify rows: 8 rows in bucket 8, empty sequences after
        (2, {1: 2}),  # 4 rows of 2 sequences: bucket 4, one empty sequence
        (4, {3: 1}),  # 5 rows: bucket 8, padding rows and an empty sequence
    ],
)
def test_padded_static_buffer_step_equals_the_eager_step(model, num_seqs, drafts):
    kv = _prefilled(model)
    eager_kv = kv.tensor.clone()
    graphs = DecodeGraphs(model, kv, 8, 4, 64, EagerReplayBackend())
    graphs.capture()
    assert sorted(graphs.replays) == [1, 2, 4, 8]
    ids, positions, meta = _step(num_seqs, drafts, seed=num_seqs)
    want = model.compute_logits(model.forward(ids, positions, eager_kv, meta))
    hidden = graphs.forward(ids, positions, meta)
    assert hidden is not None and graphs.num_replayed == 1
    got = model.compute_logits(hidden)
    assert torch.equal(got, want)  # float32: the padding changes no bit of the real rows
    # the step's K/V landed where the eager step put them; only the scratch block differs
    scratch = kv.scratch_block
    assert torch.equal(kv.tensor[:, :, :scratch], eager_kv[:, :, :scratch])


@pytest.mark.parametrize("kv_dtype", ["int8", "fp8_e5m2"])
@pytest.mark.parametrize(("num_seqs", "drafts"), [(5, {}), (4, {3: 1})])
def test_padded_step_over_a_quantized_pool_equals_the_eager_step(
    tiny_models, kv_dtype, num_seqs, drafts
):
    """A packed pool (uint8 rows of codes and scale; its scratch block takes the padding rows'
    quantized K/V) through the torch reference path: the padding changes no bit either."""
    from engine.loader import load_model

    fmt = KV_FORMATS[kv_dtype]
    model = load_model(tiny_models["llama"])
    model.use_kv_format(fmt, native=False)
    kv = _prefilled(model, fmt)
    assert kv.tensor.dtype == torch.uint8 and kv.tensor.shape[2] == 49
    eager_kv = kv.tensor.clone()
    graphs = DecodeGraphs(model, kv, 8, 4, 64, EagerReplayBackend())
    graphs.capture()
    ids, positions, meta = _step(num_seqs, drafts, seed=num_seqs)
    want = model.compute_logits(model.forward(ids, positions, eager_kv, meta))
    hidden = graphs.forward(ids, positions, meta)
    assert hidden is not None and graphs.num_replayed == 1
    assert torch.equal(model.compute_logits(hidden), want)
    scratch = kv.scratch_block
    assert torch.equal(kv.tensor[:, :, :scratch], eager_kv[:, :, :scratch])
    assert kv.tensor[:, :, scratch].any()  # the padding rows' K/V went to the scratch block


def test_steps_outside_the_buckets_run_eagerly(model):
    kv = _prefilled(model)
    graphs = DecodeGraphs(model, kv, 4, 2, 64, EagerReplayBackend())
    graphs.capture()
    assert sorted(graphs.replays) == [1, 2, 4]
    for num_seqs, drafts in [(5, {}), (2, {0: 2})]:  # 5 rows; 3 rows of one sequence
        ids, positions, meta = _step(num_seqs, drafts, seed=1)
        assert graphs.forward(ids, positions, meta) is None
    prefill = build_attention_metadata([3], [3], [[40]], BLOCK)
    assert graphs.forward(torch.tensor([5, 6, 7]), torch.arange(3), prefill) is None
    assert (graphs.num_replayed, graphs.num_eager) == (0, 3)
    ids, positions, meta = _step(2, {1: 1}, seed=2)  # 3 rows, a verify of 2: bucket 4
    assert graphs.forward(ids, positions, meta) is not None


def _prompts(n: int) -> list[list[int]]:
    rng = random.Random(3)
    head = [rng.randrange(3, 250) for _ in range(10)]
    return [head + [rng.randrange(3, 250) for _ in range(rng.randrange(3, 20))] for _ in range(n)]


@pytest.mark.parametrize(
    ("speculative", "kv_cache_dtype"), [("off", "auto"), ("cache", "auto"), ("off", "int8")]
)
def test_engine_with_replayed_decode_steps_answers_as_eager(make_llm, speculative, kv_cache_dtype):
    """Whole generations (batches of every size as requests finish; with speculation, verify
    steps) with decode steps replayed from the static buffers give eager's tokens."""
    prompts = _prompts(6)
    greedy = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    settings = {"max_num_seqs": 6, "speculative": speculative, "num_speculative_tokens": 3}
    settings["kv_cache_dtype"] = kv_cache_dtype
    eager = make_llm(cuda_graphs=False, **settings)
    want = [r.outputs[0].token_ids for r in eager.generate(prompts + prompts, greedy)]
    assert eager.engine.kv.kv_cache.scratch_block is None  # graphs off: no block set aside
    llm = make_llm(**settings)
    runner = llm.engine.runner
    assert runner.graphs is None  # CPU: no graphs unless attached
    per_seq = 1 + (3 if speculative == "cache" else 0)
    graphs = DecodeGraphs(
        runner.model, runner.kv_cache, 6 * per_seq, per_seq, 256, EagerReplayBackend()
    )
    graphs.capture()
    runner.graphs = graphs
    got = [r.outputs[0].token_ids for r in llm.generate(prompts + prompts, greedy)]
    assert got == want
    assert graphs.num_replayed > 10 and graphs.num_eager > 0  # prefills ran eagerly
    if speculative == "cache":
        assert llm.engine.stats.spec.num_accepted_tokens > 0  # verify rows were replayed
