"""Key smoothing for quantized KV pools and tiers: every score q.k kept exactly, keys' rows evened.

A few channels of some layers' keys (after rope) run 10-30x larger than the rest (Gemma 3 270M:
amax 60-98 against a median of 2.5-3), so a row's one int8 scale spends its codes on them and
rounds the other channels coarsely (KL 0.023 nats over real text, against 0.004 for its values).
Dividing such a channel of every key by a power of two and multiplying the same channel of every
query by it changes no score: a power of two scales a float exactly, so the products q_i k_i are
the same numbers. An unquantized pool gives the same logits bit for bit; an int8 one stores rows
whose range the outliers no longer set.

Which channels, by how much: int8 rounds each value of a row to a step of (row amax) / 127, an
error spread evenly over +-step/2, and a query multiplies channel i's error by q_i s_i. The mean
squared score error is thus proportional to mean_rows(step^2) x sum_i E[q_i^2] s_i^2: shrinking
an outlier shortens every row's step but lengthens its own channel's error. The exponents that
minimize it are found by coordinate descent over the channels, on the queries and keys of a
prefill of fixed random token ids (text measured no better). Rope turns channel i with channel
i + rotary_dim / 2, so the two take one exponent. Only keys shrink (s >= 1).

The factors fold into the weights: into q_norm and k_norm where the model has them (Gemma 3,
Qwen3: the norm would undo a scaled projection), else into the q and k rows of qkv_proj and its
bias. The folded model's keys are not the checkpoint's, so its model_id gains the factors' digest:
a shared tier never mixes its blocks with those of an unsmoothed or differently measured engine.
The fp8 formats take the same factors: their codes' error is relative to the value, which the
cost does not model, yet e4m3's KL drops too (Gemma 3 270M: 0.035 -> 0.028).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.attention import build_attention_metadata, compute_positions
from engine.kv.paged_cache import KVCache

CALIBRATION_TOKENS = 512
CALIBRATION_VOCAB = 32000  # ids below this (and the model's vocabulary): ordinary tokens
MAX_EXPONENT = 8  # a key channel shrinks at most 256x
DESCENT_SWEEPS = 3
_BLOCK = 16


@dataclass(frozen=True)
class KeySmoothing:
    exponents: torch.Tensor  # int8 [layers, head_dim]: keys / 2**e, queries * 2**e, per channel

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.exponents.cpu().numpy().tobytes()).hexdigest()[:12]

    @property
    def factors(self) -> torch.Tensor:
        """float32 [layers, head_dim]: 2**exponents."""
        return torch.exp2(self.exponents.float())


def smooth_keys(model: torch.nn.Module) -> KeySmoothing:
    """For a model whose KV is quantized on the device or in the tiers: measures its key
    smoothing and folds it into its weights (before prepack: the projections must be plain
    tensors; before use_kv_format: the calibration reads an unquantized pool). Returns the
    factors folded."""
    smoothing = measure_key_smoothing(model)
    fold_key_smoothing(model, smoothing)
    return smoothing


@dataclass
class _Recorder:
    """An attention backend that keeps each layer's queries and keys (after rope), in order."""

    inner: Any
    queries: list[torch.Tensor] = field(default_factory=list)
    keys: list[torch.Tensor] = field(default_factory=list)

    def plan(self, meta: Any) -> Any:
        return self.inner.plan(meta)

    def forward(self, q: torch.Tensor, k: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        self.queries.append(q.float().cpu())
        self.keys.append(k.float().cpu())
        return self.inner.forward(q, k, *args, **kwargs)


@torch.inference_mode()
def calibration_rows(
    model: torch.nn.Module, tokens: int = CALIBRATION_TOKENS
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per layer, the queries [T, H, D] and keys [T, Hkv, D] (float32, after rope) of a prefill
    of `tokens` fixed random ids over an unquantized pool."""
    c, device = model.config, model.device
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, min(c.vocab_size, CALIBRATION_VOCAB), (tokens,), generator=gen)
    blocks = -(-tokens // _BLOCK)
    kv = KVCache.for_model(model, blocks, _BLOCK)
    meta = build_attention_metadata([tokens], [tokens], [list(range(blocks))], _BLOCK, device)
    positions = torch.from_numpy(compute_positions([tokens], [tokens])).to(device)
    recorder = _Recorder(model.attention)
    model.attention = recorder
    try:
        model(ids.to(device), positions, kv.tensor, meta)
    finally:
        model.attention = recorder.inner
    kv.release()
    return recorder.queries, recorder.keys


def rotary_halves(model: torch.nn.Module) -> list[int]:
    """Per layer, rotary_dim / 2: channel i and i + that turn together (i below it)."""
    at_zero = torch.zeros(1, dtype=torch.int64, device=model.device)
    return [sin.shape[-1] for _, sin in model.ropes.lookup(at_zero, 1)]


def layer_exponents(queries: torch.Tensor, keys: torch.Tensor, half: int) -> torch.Tensor:
    """int8 [D]: the exponents minimizing mean_rows(step^2) x sum_i E[q_i^2] 4^e_i (the module
    docstring), one per rope pair, by coordinate descent from 0."""
    d = keys.shape[-1]
    magnitudes = keys.abs().reshape(-1, d)  # [rows, D]
    q_power = queries.pow(2).mean(dim=(0, 1))  # [D]
    group = torch.arange(d)
    group[half : 2 * half] -= half  # a rope pair is one group
    candidates = torch.arange(MAX_EXPONENT + 1, dtype=torch.float32)

    def cost(trials: torch.Tensor) -> torch.Tensor:  # [C, D] exponents -> [C]
        step = (magnitudes * torch.exp2(-trials)[:, None, :]).amax(dim=-1)  # [C, rows]
        return step.pow(2).mean(dim=-1) * (q_power * torch.exp2(2 * trials)).sum(dim=-1)

    exponents = torch.zeros(d)
    best = float(cost(exponents[None])[0])
    for _ in range(DESCENT_SWEEPS):
        improved = False
        for g in group.unique().tolist():
            trials = exponents.repeat(len(candidates), 1)
            trials[:, group == g] = candidates[:, None]
            costs = cost(trials)
            i = int(costs.argmin())
            if float(costs[i]) < best:
                best, exponents, improved = float(costs[i]), trials[i], True
        if not improved:
            break
    return exponents.to(torch.int8)


def measure_key_smoothing(model: torch.nn.Module) -> KeySmoothing:
    """The model's factors. float16 models keep their keys (2**8 times a query may overflow)."""
    layers, head_dim = model.config.num_hidden_layers, model.config.head_dim
    if model.dtype == torch.float16:
        return KeySmoothing(torch.zeros(layers, head_dim, dtype=torch.int8))
    queries, keys = calibration_rows(model)
    halves = rotary_halves(model)
    return KeySmoothing(
        torch.stack([layer_exponents(*rows) for rows in zip(queries, keys, halves, strict=True)])
    )


@torch.no_grad()
def fold_key_smoothing(model: torch.nn.Module, smoothing: KeySmoothing) -> None:
    """Queries * factor, keys / factor, per channel, in the weights; model_id names the factors."""
    for layer, factor in zip(model.layers, smoothing.factors, strict=True):
        if layer.q_norm is not None:
            layer.q_norm.mul_(factor.to(layer.q_norm.device, layer.q_norm.dtype))
            layer.k_norm.div_(factor.to(layer.k_norm.device, layer.k_norm.dtype))
            continue
        if layer.packed:
            raise ValueError("fold key smoothing before prepack: the projections are packed")
        for fused in (layer.qkv_proj, layer.qkv_bias):
            if fused is not None:
                _scale_query_key_rows(layer, fused, factor)
    model.model_id = f"{model.model_id}+ks{smoothing.digest}"


def _scale_query_key_rows(layer, fused: torch.Tensor, factor: torch.Tensor) -> None:
    """The q rows x factor and the k rows / factor (per channel of every head) of a fused qkv
    weight [rows, hidden] or bias [rows]."""
    f = factor.to(fused.device, fused.dtype).view(1, -1, *([1] * (fused.dim() - 1)))
    q_end, k_end = layer.q_size, layer.q_size + layer.kv_size
    fused[:q_end].view(-1, layer.head_dim, *fused.shape[1:]).mul_(f)
    fused[q_end:k_end].view(-1, layer.head_dim, *fused.shape[1:]).div_(f)
