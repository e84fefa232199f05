"""How far a quantized KV cache moves a model's outputs from the unquantized one (bench_kv_quant):
next-token distributions over windows of real text (mean KL divergence, perplexity) and greedy
continuations (the share of prompts whose first tokens are identical).

The text: the license texts under /usr/share/common-licenses (English prose, on every Debian)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.attention import build_attention_metadata, compute_positions
from engine.kv.paged_cache import KVCache
from engine.kv.quant import KVFormat

LICENSES = Path("/usr/share/common-licenses")
BLOCK = 16
ROWS = 128  # logits rows at a time (a 262k vocabulary makes a whole window's logits GBs)


def license_text() -> str:
    """Every license text there, in name order (links and folders skipped)."""
    files = sorted(p for p in LICENSES.iterdir() if p.is_file() and not p.is_symlink())
    return "\n\n".join(p.read_text(errors="replace") for p in files)


def text_windows(ids: list[int], count: int, length: int) -> list[list[int]]:
    """`count` windows of `length` tokens spread evenly over `ids`."""
    stride = max(length, (len(ids) - length) // max(1, count - 1))
    windows = [ids[i : i + length] for i in range(0, len(ids) - length + 1, stride)]
    if len(windows) < count:
        raise ValueError(f"the text has {len(ids)} tokens: too few for {count} x {length}")
    return windows[:count]


@dataclass(frozen=True)
class WindowScores:
    kl_sum: float  # summed KL(reference || this) over positions, nats
    nll_sum: float  # summed -log p(next token)
    ref_nll_sum: float
    positions: int


def _window_hidden(model, ids: list[int], fmt: KVFormat | None) -> torch.Tensor:
    """The window's hidden states, prefilled in one step over a pool of `fmt` rows: every token
    attends the stored (quantized) keys, as it would in the engine."""
    model.use_kv_format(fmt)
    blocks = -(-len(ids) // BLOCK)
    kv = KVCache.for_model(model, blocks, BLOCK, fmt)
    meta = build_attention_metadata([len(ids)], [len(ids)], [list(range(blocks))], BLOCK)
    input_ids = torch.tensor(ids, dtype=torch.int64)
    positions = torch.from_numpy(compute_positions([len(ids)], [len(ids)]))
    return model(input_ids, positions, kv.tensor, meta)


@torch.inference_mode()
def score_window(model, ids: list[int], fmt: KVFormat) -> WindowScores:
    """KL of `fmt`'s next-token distributions from the unquantized KV's, and both NLLs."""
    ref_hidden = _window_hidden(model, ids, None)
    hidden = _window_hidden(model, ids, fmt)
    model.use_kv_format(None)
    targets = torch.tensor(ids[1:], dtype=torch.int64)
    kl = nll = ref_nll = 0.0
    for start in range(0, len(ids) - 1, ROWS):
        end = min(start + ROWS, len(ids) - 1)
        ref = torch.log_softmax(model.compute_logits(ref_hidden[start:end]).double(), -1)
        got = torch.log_softmax(model.compute_logits(hidden[start:end]).double(), -1)
        kl += float((ref.exp() * (ref - got)).sum())
        rows, want = torch.arange(end - start), targets[start:end]
        nll -= float(got[rows, want].sum())
        ref_nll -= float(ref[rows, want].sum())
    return WindowScores(kl, nll, ref_nll, len(ids) - 1)


def distribution_row(model, windows: list[list[int]], fmt: KVFormat) -> dict:
    scores = [score_window(model, w, fmt) for w in windows]
    n = sum(s.positions for s in scores)
    ppl = math.exp(sum(s.nll_sum for s in scores) / n)
    ref_ppl = math.exp(sum(s.ref_nll_sum for s in scores) / n)
    return {
        "positions": n,
        "mean_kl_nats": sum(s.kl_sum for s in scores) / n,
        "ppl": ppl,
        "ref_ppl": ref_ppl,
        "ppl_delta_pct": 100 * (ppl / ref_ppl - 1),
    }


def greedy_tokens(model_path: Path, prompts: list[list[int]], kv_dtype: str, tokens: int):
    """The engine's greedy continuations of `prompts` with the pool in `kv_dtype`."""
    from engine.llm import LLM
    from engine.sampling_params import SamplingParams

    llm = LLM(str(model_path), kv_cache_dtype=kv_dtype, max_model_len=1024, deterministic=True)
    try:
        params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
        return [r.outputs[0].token_ids for r in llm.generate(prompts, params)]
    finally:
        llm.engine.close()


def agreement(reference: list[list[int]], got: list[list[int]]) -> dict:
    """The share of identical continuations, and the mean length of the common start."""

    def common(a: list[int], b: list[int]) -> int:
        return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), len(a))

    same = sum(a == b for a, b in zip(reference, got, strict=True))
    starts = [common(a, b) for a, b in zip(reference, got, strict=True)]
    return {
        "greedy_identical": same / len(reference),
        "mean_common_tokens": sum(starts) / len(starts),
    }
