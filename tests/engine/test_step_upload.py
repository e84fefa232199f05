"""StepUpload packs a step's inputs into one buffer (one asynchronous copy on a GPU); on a CPU
with packed=True the same packing runs, so the bookkeeping is tested here and the engine's
answers with it are compared to the plain path's."""

from __future__ import annotations

import random

import pytest
import torch

from engine.kv.hybrid_cache import HybridKVCache
from engine.sampling_params import SamplingParams
from engine.step_upload import ALIGN, StepUpload
from tests.tiny_models import GEMMA_CONFIGS, make_tiny_gemma

CPU = torch.device("cpu")


def _inputs(seed: int, scale: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [
        torch.randint(0, 1 << 40, (5 * scale,), generator=gen),  # ids
        torch.randint(0, 1 << 20, (3,), generator=gen, dtype=torch.int32),  # cu_seqlens
        torch.empty(0, dtype=torch.int64),  # no sampling rows
        torch.randint(0, 99, (2, 3 * scale), generator=gen, dtype=torch.int32),  # block table
        torch.randint(0, 99, (1,), generator=gen),
    ]


def test_packed_tensors_keep_values_dtypes_shapes_and_alignment() -> None:
    upload = StepUpload(CPU, packed=True)
    for seed, scale in ((0, 1), (1, 7), (2, 4000)):  # the last one grows the buffers
        tensors = _inputs(seed, scale)
        moved = upload(tensors)
        base = moved[0].untyped_storage().data_ptr()
        for want, got in zip(tensors, moved, strict=True):
            assert got.dtype == want.dtype and got.shape == want.shape
            assert torch.equal(got, want)
            assert (got.data_ptr() - base) % ALIGN == 0
            assert got.untyped_storage().data_ptr() == base  # one buffer: one copy


def test_plain_upload_on_a_cpu_passes_tensors_through() -> None:
    tensors = _inputs(0, 1)
    assert all(a is b for a, b in zip(StepUpload(CPU)(tensors), tensors, strict=True))


def _prompts(n: int) -> list[list[int]]:
    rng = random.Random(3)
    head = [rng.randrange(3, 250) for _ in range(20)]
    return [head + [rng.randrange(3, 250) for _ in range(rng.randrange(3, 30))] for _ in range(n)]


@pytest.mark.parametrize("speculative", ["off", "cache"])
def test_engine_answers_the_same_with_packed_uploads(make_llm, speculative) -> None:
    """Prefill chunks, decode and verify steps (logit rows of drafts) from packed inputs."""
    prompts = _prompts(6)
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    settings = {"speculative": speculative, "max_num_batched_tokens": 48}
    want = [r.outputs[0].token_ids for r in make_llm(**settings).generate(prompts * 2, greedy)]
    llm = make_llm(**settings)
    llm.engine.runner.upload = StepUpload(CPU, packed=True)
    assert [r.outputs[0].token_ids for r in llm.generate(prompts * 2, greedy)] == want


def test_windowed_model_answers_the_same_with_packed_uploads(make_llm, tmp_path) -> None:
    """A hybrid KV cache: the windowed layers' metadata travels in the same upload."""
    _, path = make_tiny_gemma(tmp_path, sorted(GEMMA_CONFIGS)[0])
    prompts = _prompts(4)
    greedy = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    settings = {"dtype": "float32", "block_size": 4, "num_blocks": 256}
    want = [r.outputs[0].token_ids for r in make_llm(path, **settings).generate(prompts, greedy)]
    llm = make_llm(path, **settings)
    assert isinstance(llm.engine.runner.kv_cache, HybridKVCache)
    llm.engine.runner.upload = StepUpload(CPU, packed=True)
    assert [r.outputs[0].token_ids for r in llm.generate(prompts, greedy)] == want
