"""Key smoothing (engine/models/key_smoothing.py): folded factors leave an unquantized model's
logits bit for bit, the measured ones find planted outlier channels (rope pairs together) and
shrink the int8 pool's error, and a smoothed engine's namespace names its factors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.attention import build_attention_metadata, compute_positions
from engine.kv.paged_cache import KVCache
from engine.kv.quant import INT8, KVFormat
from engine.loader import load_model
from engine.models.key_smoothing import (
    KeySmoothing,
    fold_key_smoothing,
    measure_key_smoothing,
    smooth_keys,
)
from tests.tiny_models import TINY_VOCAB, make_tiny_gemma, make_tiny_model

BLOCK = 16


def _hidden(model, ids: torch.Tensor, fmt: KVFormat | None = None) -> torch.Tensor:
    """One prefill of `ids` over a fresh pool of `fmt` rows: the final hidden states."""
    model.use_kv_format(fmt)
    n = len(ids)
    blocks = -(-n // BLOCK)
    kv = KVCache.for_model(model, blocks, BLOCK, fmt)
    meta = build_attention_metadata([n], [n], [list(range(blocks))], BLOCK)
    positions = torch.from_numpy(compute_positions([n], [n]))
    return model(ids, positions, kv.tensor, meta)


def _ids(n: int = 48) -> torch.Tensor:
    return torch.randint(0, TINY_VOCAB, (n,), generator=torch.Generator().manual_seed(3))


@pytest.fixture(scope="module", params=["qwen2", "qwen3", "gemma"])
def model_folder(request, tmp_path_factory) -> Path:
    """qwen2: factors in qkv_proj and its bias; qwen3 and gemma: in q_norm / k_norm."""
    folder = tmp_path_factory.mktemp(request.param)
    if request.param == "gemma":
        return make_tiny_gemma(folder, "d32-mixed")[1]
    return make_tiny_model(folder, request.param)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_folded_factors_keep_the_logits_bit_for_bit(model_folder: Path, dtype) -> None:
    plain = load_model(model_folder, dtype, prepack=False)
    folded = load_model(model_folder, dtype, prepack=False)
    c = folded.config
    gen = torch.Generator().manual_seed(1)
    exponents = torch.randint(0, 6, (c.num_hidden_layers, c.head_dim), generator=gen)
    half = c.head_dim // 2  # every tiny config ropes the whole head: pairs share a factor
    exponents[:, half:] = exponents[:, :half]
    fold_key_smoothing(folded, KeySmoothing(exponents.to(torch.int8)))
    plain.prepack(), folded.prepack()
    ids = _ids()
    assert torch.equal(_hidden(plain, ids), _hidden(folded, ids))
    # the keys the pool holds did change: the model is not the checkpoint's any more
    assert folded.model_id.startswith(plain.model_id + "+ks") and folded.model_id != plain.model_id


def test_folding_after_prepack_is_refused(tmp_path: Path) -> None:
    model = load_model(make_tiny_model(tmp_path, "llama"), torch.bfloat16)
    assert model.layers[0].packed  # oneDNN holds the projections
    with pytest.raises(ValueError, match="before prepack"):
        smooth_keys(model)


def _plant_outliers(model, channel: int, factor: float) -> None:
    """Key channel `channel` (and its rope pair) of every kv head x factor, the same query
    channels / factor: scores unchanged, keys with outlier channels, as real checkpoints have."""
    half = model.config.head_dim // 2
    with torch.no_grad():
        for layer in model.layers:
            d, q, kv = layer.head_dim, layer.q_size, layer.kv_size
            queries = layer.qkv_proj[:q].view(-1, d, layer.qkv_proj.shape[1])
            keys = layer.qkv_proj[q : q + kv].view(-1, d, layer.qkv_proj.shape[1])
            for c in (channel, channel + half):
                queries[:, c] /= factor
                keys[:, c] *= factor


def test_measured_smoothing_finds_outliers_and_shrinks_the_int8_error(tmp_path: Path) -> None:
    folder = make_tiny_model(tmp_path, "llama")
    channel, half = 5, None
    errors = {}
    for smoothed in (False, True):
        model = load_model(folder, torch.float32, prepack=False)
        half = model.config.head_dim // 2
        _plant_outliers(model, channel, 24.0)
        if smoothed:
            smoothing = measure_key_smoothing(model)
            fold_key_smoothing(model, smoothing)
        ids = _ids(96)
        reference = _hidden(model, ids)
        errors[smoothed] = (_hidden(model, ids, INT8) - reference).pow(2).mean().item()
    e = smoothing.exponents
    assert torch.equal(e[:, :half], e[:, half:])  # a rope pair takes one factor
    assert (e[:, channel] >= 3).all()  # ~24x: shrunk by 8x or more
    assert e.ge(0).all() and e.le(8).all()
    assert errors[True] < 0.5 * errors[False], errors


def test_a_quantized_engine_serves_smoothed_keys_under_its_own_namespace(make_llm) -> None:
    plain, int8 = make_llm(), make_llm(kv_cache_dtype="int8")
    assert "+ks" not in plain.engine.namespace.model_id
    assert int8.engine.namespace.model_id.startswith(plain.engine.namespace.model_id + "+ks")
