"""The CUDA path on a real GPU: the compiled triton kernels against the dense reference (the
interpreter tests' checks, unchanged), the fused row ops against torch, and the engine on CUDA
against transformers, with the cache and speculation on and off, and with decode steps replayed
from CUDA graphs against eager steps.

Marked `cuda` and left out of the default run (pyproject's addopts): on a machine with a GPU run
`pytest -m cuda` (scripts/gpu_check.sh runs it with the benchmarks).
"""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from engine.attention import build_attention_metadata
from engine.attention.metadata import AttentionMetadata
from engine.kv.admin import CacheStatsOp, Flush
from engine.llm import LLM
from engine.sampling_params import SamplingParams
from storage.pinned_host import PinnedHostTier
from tests.tiny_models import GEMMA_CONFIGS, TINY_VOCAB, make_tiny_gemma

from .row_ops_checks import ROW_OPS_CHECKS
from .test_attention_triton import CHECKS, TRITON_CASES
from .test_attention_window import WINDOW_CASES
from .test_llm_parity import PROMPTS, check_parity
from .triton_quant_checks import QUANT_CHECKS, check_attention

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)


def _on_cuda(meta: AttentionMetadata) -> AttentionMetadata:
    tensors = ("cu_seqlens_q", "seq_lens", "block_tables", "slot_mapping")
    return dataclasses.replace(meta, **{f: getattr(meta, f).cuda() for f in tensors})


class CompiledKernels:
    """triton_kernels' two entry points taking the checks' CPU tensors: each call runs the
    compiled kernel on copies on the GPU and writes its results back in place."""

    def __init__(self) -> None:
        from engine.attention import triton_kernels

        self.kernels = triton_kernels

    def store_kv(self, k, v, k_cache, v_cache, slot_mapping) -> None:
        kc, vc = k_cache.cuda(), v_cache.cuda()
        self.kernels.store_kv(k.cuda(), v.cuda(), kc, vc, slot_mapping.cuda())
        k_cache.copy_(kc.cpu())
        v_cache.copy_(vc.cpu())

    def paged_attention(self, q, k_cache, v_cache, out, meta, scale, window=None) -> None:
        o = torch.full_like(out, float("nan"), device="cuda")  # every row must be written
        self.kernels.paged_attention(
            q.cuda(), k_cache.cuda(), v_cache.cuda(), o, _on_cuda(meta), scale, window
        )
        out.copy_(o.cpu())


@pytest.mark.parametrize("name", list(CHECKS))
def test_compiled_triton_kernel(name):
    CHECKS[name](CompiledKernels())


@pytest.mark.parametrize("name", list(ROW_OPS_CHECKS))
def test_compiled_row_ops(name):
    from engine.attention.triton_row_ops import TritonRowOps

    ROW_OPS_CHECKS[name](TritonRowOps(), "cuda")


@pytest.mark.parametrize("name", list(QUANT_CHECKS))
def test_compiled_quantized_kv_kernels(name):
    """The interpreter's checks of the kernels over packed pools (triton_quant_checks.py)."""
    QUANT_CHECKS[name]("cuda")


@pytest.mark.parametrize("kv_dtype", ["int8", "fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("case", [TRITON_CASES[3], WINDOW_CASES[6]], ids=["d64", "d256"])
def test_quantized_attention_in_bfloat16_on_the_gpu(kv_dtype, case):
    from engine.kv.quant import KV_FORMATS

    check_attention(KV_FORMATS[kv_dtype], case, "cuda", dtype=torch.bfloat16)


def test_store_kv_from_strided_views_on_the_gpu():
    """k and v as the model hands them over on CUDA: column slices of the fused qkv output."""
    from engine.attention import triton_kernels

    qkv = torch.randn(5, 3 * 2 * 64, device="cuda")
    k, v = qkv[:, 128:256].view(5, 2, 64), qkv[:, 256:].view(5, 2, 64)
    k_cache, v_cache = (torch.zeros(4, 4, 2, 64, device="cuda") for _ in range(2))
    slots = torch.tensor([15, 0, 7, 8, 3], device="cuda")
    triton_kernels.store_kv(k, v, k_cache, v_cache, slots)
    assert torch.equal(k_cache.view(-1, 2, 64)[slots], k)
    assert torch.equal(v_cache.view(-1, 2, 64)[slots], v)


def test_bfloat16_attention_close_to_float32():
    from engine.attention import triton_kernels

    from .test_attention import dense_reference, make_batch

    query_lens, prefix_lens = [1, 1, 70, 9], [300, 17, 0, 100]
    q, k, v, k_cache, v_cache, tables, full_k, full_v = make_batch(
        3, query_lens, prefix_lens, 16, 9, 3, 64
    )
    seq_lens = [a + b for a, b in zip(query_lens, prefix_lens, strict=True)]
    meta = _on_cuda(build_attention_metadata(query_lens, seq_lens, tables, 16))
    bf = [x.to("cuda", torch.bfloat16) for x in (q, k, v, k_cache, v_cache)]
    triton_kernels.store_kv(*bf[1:], meta.slot_mapping)
    out = torch.empty_like(bf[0])
    triton_kernels.paged_attention(bf[0], bf[3], bf[4], out, meta, 64**-0.5)
    ref = dense_reference(q, full_k, full_v, query_lens, 64**-0.5)
    torch.testing.assert_close(out.float().cpu(), ref, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_tiny_models_on_cuda_match_transformers(tiny_models, arch):
    check_parity(tiny_models[arch], PROMPTS, steps=12, block_size=4, atol=1e-4, device="cuda")


@pytest.mark.parametrize("arch", ["mistral-swa", "qwen2-swa"])
def test_windowed_models_on_cuda_match_transformers(windowed_models, arch):
    prompts = [[(7 * i + 3) % 250 for i in range(n)] for n in (5, 23, 40)]
    check_parity(windowed_models[arch], prompts, steps=12, block_size=4, atol=1e-4, device="cuda")


def test_default_model_on_cuda_matches_transformers(default_model_path):
    from engine.loader import load_tokenizer

    tok = load_tokenizer(default_model_path)
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}]
    )
    check_parity(default_model_path, [prompt], steps=8, block_size=16, atol=2e-3, device="cuda")


@pytest.mark.parametrize("name", sorted(GEMMA_CONFIGS))
def test_tiny_gemma_on_cuda_matches_transformers(tmp_path, name):
    """Sliding and full layers, a local rope, qk-norm, head dims 32 and 256, softcapping."""
    hf, path = make_tiny_gemma(tmp_path, name)
    window = GEMMA_CONFIGS[name]["sliding_window"]
    prompt = torch.randint(0, TINY_VOCAB, (3 * window,), generator=torch.Generator().manual_seed(2))
    steps = window + 2
    ref = hf.generate(prompt[None], max_new_tokens=steps, do_sample=False, eos_token_id=None)
    llm = LLM(
        str(path),
        dtype="float32",
        device="cuda",
        num_blocks=64,
        block_size=4,
        max_num_batched_tokens=20,
    )
    params = SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True)
    out = llm.generate([prompt.tolist()], params)[0].outputs[0]
    assert out.token_ids == ref[0, len(prompt) :].tolist()


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    head = [rng.randrange(3, 250) for _ in range(12)]
    return [head + [rng.randrange(3, 250) for _ in range(rng.randrange(5, 40))] for _ in range(n)]


def _outputs(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    return [r.outputs[0].token_ids for r in llm.generate(prompts, GREEDY)]


def _released(llm: LLM) -> bool:
    cache = llm.engine.kv.cache
    cache.check_integrity()
    return cache.num_free_blocks() + cache.num_evictable_blocks() == cache.num_blocks


def test_cache_on_and_off_identical_on_cuda(make_llm):
    prompts = _prompts(6)
    off = _outputs(make_llm(device="cuda", enable_prefix_caching=False), prompts)
    llm = make_llm(device="cuda")
    assert _outputs(llm, prompts) == off
    assert _outputs(llm, prompts) == off  # every prompt now a device-tree hit
    assert llm.engine.admin(CacheStatsOp()).total().hit_tokens >= sum(map(len, prompts)) // 2
    assert _released(llm)


@pytest.mark.parametrize("max_num_seqs", [1, 8])
def test_greedy_repeat_is_identical_with_speculation_on_cuda(make_llm, max_num_seqs):
    """float32: a second wave of the same prompts drafts the first wave's answers from the
    tree; the tokens equal speculation off's, and the drafts are really accepted."""
    prompts = _prompts(8)
    settings = {"device": "cuda", "max_num_seqs": max_num_seqs}
    off_llm = make_llm(speculative="off", **settings)
    off = _outputs(off_llm, prompts) + _outputs(off_llm, prompts)
    llm = make_llm(speculative="cache", **settings)
    assert _outputs(llm, prompts) + _outputs(llm, prompts) == off
    spec = llm.engine.stats.spec
    assert spec.num_accepted_tokens > 0.5 * spec.num_draft_tokens > 0
    assert _released(llm)


@pytest.mark.parametrize("tier", ["host", "disk"])
def test_spill_tiers_on_cuda_load_back_the_same_outputs(make_llm, tmp_path, tier):
    """Blocks evicted from the GPU pool go to a tier and come back into it: the second pass over
    the same prompts hits the tier and answers as the cache-off engine does."""
    from storage.config import TierConfig

    prompts = _prompts(10, seed=4)
    want = _outputs(make_llm(device="cuda", enable_prefix_caching=False), prompts)
    config = {
        "host": TierConfig(host_bytes=1 << 26),
        "disk": TierConfig(disk_path=str(tmp_path / "kv"), disk_bytes=1 << 28),
    }[tier]
    llm = make_llm(device="cuda", num_blocks=48, tiers=config)
    assert _outputs(llm, prompts) == want  # spilling as it goes
    llm.engine.admin(Flush())
    assert llm.engine.kv.tiers.store.wait_idle(30)
    assert _outputs(llm, prompts) == want  # the prefixes come back from the tier
    store = llm.engine.kv.tiers.store
    assert store.stats().tiers[tier].stats.hits > 0
    if tier == "host":  # a GPU pool's host tier: slots of one pinned arena
        assert isinstance(store.tiers[0], PinnedHostTier) and store.tiers[0]._arena.is_pinned()
    assert _released(llm)


def test_host_tier_round_trip_through_the_side_streams():
    """Spills copy on a side stream while the engine goes on; loads come back on the GPU. The
    spilled blocks are fresh tensors whose memory is handed back (and overwritten) before the
    writer has read them: their copies must still see the old contents."""
    from radixcache.hashing import Namespace, block_hashes
    from storage.config import TierConfig
    from storage.tiered import TieredStore

    store = TieredStore(TierConfig(host_bytes=1 << 26), device="cuda")
    assert isinstance(store.tiers[0], PinnedHostTier)
    ns = Namespace(model_id="cuda-side-streams", kv_dtype="bfloat16", block_size=16)
    shape = (4, 2, 16, 2, 64)
    blocks = [torch.randn(shape, device="cuda").to(torch.bfloat16) for _ in range(32)]
    want = [b.cpu() for b in blocks]
    hashes = block_hashes(ns, list(range(32 * 16)))
    store.store(ns, list(zip(hashes, blocks, strict=True)))
    del blocks
    junk = [torch.full(shape, 7.0, dtype=torch.bfloat16, device="cuda") for _ in range(32)]
    assert store.wait_idle(30)
    got = store.load_prefix(ns, hashes, deadline_s=30, shape=shape)
    assert len(got.blocks) == 32 and all(b.device.type == "cuda" for b in got.blocks)
    assert all(torch.equal(b.cpu(), w) for b, w in zip(got.blocks, want, strict=True))
    assert junk[0].sum() != 0
    store.close()


def test_a_decode_step_waits_for_the_gpu_once(make_llm):
    """A step's inputs go up in one asynchronous copy and its logits stay on the GPU: the one
    synchronizing call of a greedy decode step is the copy of its sampled tokens."""
    import warnings

    from engine.request import Prompt

    llm = make_llm(device="cuda", async_scheduling=False)
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    for i, prompt in enumerate(_prompts(4)):
        engine.add_request(f"r{i}", Prompt(prompt), params)
    for _ in range(3):
        engine.step()
    while engine.stats.recent[-1].num_prefill_tokens:
        engine.step()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            engine.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    syncs = [str(w.message) for w in caught if "synchroniz" in str(w.message)]
    assert engine.stats.recent[-1].num_decode_tokens == 4
    assert len(syncs) == 1, syncs


def test_steps_run_ahead_answer_as_step_by_step_on_cuda(make_llm):
    """Steps launched before the previous step's tokens are read (the default on CUDA, with
    speculation off) give the tokens of the step-by-step engine."""
    prompts = _prompts(8, seed=6)
    want = _outputs(make_llm(device="cuda", speculative="off", async_scheduling=False), prompts)
    llm = make_llm(device="cuda", speculative="off")
    assert _outputs(llm, prompts) == want
    assert llm.engine.stats.steps_run_ahead > 0 and llm.engine.in_flight is None
    assert _released(llm)


def test_logprobs_come_back_with_tokens_run_ahead_on_cuda(make_llm):
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=2)
    prompts = _prompts(4, seed=7)

    def run(llm) -> list:
        outs = [r.outputs[0] for r in llm.generate(prompts, params)]
        return [(o.token_ids, o.logprobs, o.top_logprobs) for o in outs]

    want = run(make_llm(device="cuda", speculative="off", async_scheduling=False))
    llm = make_llm(device="cuda", speculative="off")
    assert run(llm) == want and llm.engine.stats.steps_run_ahead > 0


def test_sampling_on_the_gpu_draws_what_the_host_draws():
    """Temperature, top-k / top-p / min-p, penalties, a bias, per-request seeds and logprobs on
    GPU logits give the host's tokens (the uniforms come from the same CPU generators), and the
    sampler waits for the GPU only to read its results."""
    import warnings

    from engine.sampler import Sampler, SampleRow

    kinds = [
        SamplingParams(temperature=0),
        SamplingParams(temperature=0.8, top_p=0.9),
        SamplingParams(temperature=1.0, top_k=5, min_p=0.05),
        SamplingParams(temperature=0.7, repetition_penalty=1.3, presence_penalty=0.5),
        SamplingParams(temperature=1.2, logit_bias={3: 5.0, 7: -100.0}, seed=11),
    ]
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(40, 512, generator=gen) * 4

    def rows() -> list[SampleRow]:
        out = []
        for i in range(40):
            p = kinds[i % len(kinds)]
            seed = None if p.seed is None else torch.Generator().manual_seed(p.seed + i)
            out.append(SampleRow(p, [i % 97, (3 * i) % 97, 7], 2, seed))
        return out

    want = Sampler(seed=3)(logits, rows()).token_ids
    on_gpu = logits.cuda()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = Sampler(seed=3)(on_gpu, rows()).token_ids
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert got == want
    syncs = [str(w.message) for w in caught if "synchroniz" in str(w.message)]
    assert len(syncs) == 1, syncs  # the tokens' copy


def _graphs_on_and_off(make_llm, model=None, **settings):
    """(graphs-on LLM, its outputs, graphs-off outputs) over prompts that finish at different
    times (batches of every size, so most steps are padded)."""
    prompts = _prompts(7, seed=5)
    off = _outputs(make_llm(model, device="cuda", cuda_graphs=False, **settings), prompts)
    llm = make_llm(model, device="cuda", **settings)
    return llm, _outputs(llm, prompts), off


@pytest.mark.parametrize("speculative", ["off", "cache"])
def test_decode_graphs_answer_as_eager_steps_on_cuda(make_llm, speculative):
    """float32, token for token; with speculation the verify steps replay too."""
    llm, on, off = _graphs_on_and_off(make_llm, speculative=speculative, max_num_seqs=8)
    assert on == off
    graphs = llm.engine.runner.graphs
    assert graphs is not None and graphs.num_replayed > 0 and graphs.num_eager > 0
    assert _released(llm)


@pytest.mark.parametrize("kv_cache_dtype", ["int8", "fp8_e4m3", "fp8_e5m2"])
def test_quantized_kv_decode_graphs_answer_as_eager_steps_on_cuda(make_llm, kv_cache_dtype):
    """A packed pool (its scratch block taking the padding rows): graphs on and off agree."""
    llm, on, off = _graphs_on_and_off(make_llm, kv_cache_dtype=kv_cache_dtype, max_num_seqs=8)
    assert on == off
    assert llm.engine.kv.kv_cache.tensor.dtype == torch.uint8
    assert llm.engine.runner.graphs.num_replayed > 0
    assert _released(llm)


def test_decode_graphs_on_the_default_model(make_llm, default_model_path):
    llm, on, off = _graphs_on_and_off(make_llm, default_model_path, speculative="off")
    assert on == off
    assert llm.engine.runner.graphs.num_replayed > 0


def test_graph_memory_within_what_the_kv_budget_gave_up(make_llm):
    from engine.cuda_graphs import graph_memory_reserve

    budget = 256 << 20
    on = make_llm(device="cuda", kv_cache_memory=budget, max_num_seqs=32)
    off = make_llm(device="cuda", kv_cache_memory=budget, max_num_seqs=32, cuda_graphs=False)
    graphs, model = on.engine.runner.graphs, on.engine.runner.model
    estimate = graph_memory_reserve(on.engine.config, model.config, model.dtype)
    assert 0 < graphs.memory_bytes <= estimate, (graphs.memory_bytes, estimate)
    kv_on, kv_off = on.engine.kv.kv_cache, off.engine.kv.kv_cache
    assert kv_on.nbytes + estimate <= kv_off.nbytes + kv_off.nbytes // kv_off.num_blocks
    print(f"graphs {graphs.memory_bytes >> 20} MiB, estimate {estimate >> 20} MiB")


def _launches_per_decode_step(llm: LLM) -> float:
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.bench_cuda_step import launches, start_decoding

    engine, steps = llm.engine, 8
    ids = start_decoding(engine, 4, steps, 250)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            engine.step()
        torch.cuda.synchronize()
    for request_id in ids:
        engine.abort(request_id)
    return launches(prof) / steps


def test_decode_graphs_cut_the_launches_per_step(make_llm):
    off = _launches_per_decode_step(make_llm(device="cuda", cuda_graphs=False, speculative="off"))
    on = _launches_per_decode_step(make_llm(device="cuda", speculative="off"))
    print(f"launches per decode step: graphs on {on:.0f}, off {off:.0f}")
    assert on <= 60 and on < off / 2
