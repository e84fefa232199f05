"""The batched sampler and the incremental detokenizer (no model needed)."""

from __future__ import annotations

import pytest
import torch

from engine.detokenizer import IncrementalDetokenizer
from engine.sampler import Sampler, SampleRow, apply_penalties, apply_top_k_top_p
from engine.sampling_params import SamplingParams

VOCAB = 50


def _row(params: SamplingParams, tokens: list[int] | None = None, seed: int | None = None):
    gen = None if seed is None else torch.Generator().manual_seed(seed)
    tokens = tokens or [1, 2, 3]
    return SampleRow(params, tokens, len(tokens), gen)


def _logits(rows: int = 4, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_is_argmax():
    logits = _logits()
    out = Sampler()(logits, [_row(SamplingParams(temperature=0))] * 4)
    assert out.token_ids == logits.argmax(-1).tolist()
    assert out.logprobs is None


def test_mixed_greedy_and_random_rows():
    logits = _logits()
    rows = [_row(SamplingParams(temperature=0)), _row(SamplingParams(temperature=1.0))] * 2
    out = Sampler()(logits, rows)
    assert out.token_ids[0] == int(logits[0].argmax())
    assert out.token_ids[2] == int(logits[2].argmax())


def test_seed_reproducible_and_batch_independent():
    logits = _logits(3)
    p = SamplingParams(temperature=1.0)
    a = Sampler(seed=1)(logits, [_row(p, seed=7), _row(p), _row(p)]).token_ids[0]
    b = Sampler(seed=2)(logits[:1], [_row(p, seed=7)]).token_ids[0]
    assert a == b
    draws = {Sampler()(logits[:1], [_row(p, seed=s)]).token_ids[0] for s in range(40)}
    assert len(draws) > 1


def test_top_k_one_is_greedy():
    logits = _logits()
    rows = [_row(SamplingParams(temperature=5.0, top_k=1), seed=i) for i in range(4)]
    assert Sampler()(logits, rows).token_ids == logits.argmax(-1).tolist()


def test_top_p_keeps_the_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    masked = apply_top_k_top_p(logits, [SamplingParams(top_p=0.7)])
    assert torch.isfinite(masked[0, :2]).all() and torch.isinf(masked[0, 2:]).all()
    masked = apply_top_k_top_p(logits, [SamplingParams(top_p=0.1)])
    assert torch.isfinite(masked[0]).sum() == 1


def test_min_p_filters_unlikely_tokens():
    logits = torch.log(torch.tensor([[0.6, 0.35, 0.05]]))
    p = SamplingParams(temperature=1.0, min_p=0.2)
    seen = {Sampler()(logits, [_row(p, seed=s)]).token_ids[0] for s in range(200)}
    assert seen == {0, 1}


def test_sampling_follows_the_distribution():
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]])).repeat(4000, 1)
    p = SamplingParams(temperature=1.0)
    tokens = torch.tensor(Sampler(seed=3)(logits, [_row(p)] * 4000).token_ids)
    freq = torch.bincount(tokens, minlength=3).float() / 4000
    assert torch.allclose(freq, torch.tensor([0.7, 0.2, 0.1]), atol=0.03)


def test_repetition_penalty_matches_hf_semantics():
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5]])
    row = SampleRow(SamplingParams(repetition_penalty=2.0), [0, 1], 1, None)
    out = apply_penalties(logits, [row])
    assert out.tolist() == [[1.0, -4.0, 1.0, 0.5]]


def test_presence_and_frequency_penalties_count_output_only():
    logits = torch.zeros(1, 4)
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25)
    row = SampleRow(params, [3, 1, 1, 2], 1, None)  # prompt [3], output [1, 1, 2]
    out = apply_penalties(logits, [row])
    assert out.tolist() == [[0.0, -1.0, -0.75, 0.0]]


def test_logprobs_of_raw_distribution():
    logits = _logits(2)
    rows = [_row(SamplingParams(temperature=0, logprobs=3))] * 2
    out = Sampler()(logits, rows)
    ref = torch.log_softmax(logits, -1)
    for i in range(2):
        assert out.logprobs[i] == pytest.approx(float(ref[i].max()), abs=1e-6)
        assert len(out.top_logprobs[i]) == 3
        assert out.token_ids[i] in out.top_logprobs[i]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"n": 0},
        {"max_tokens": 0},
        {"temperature": -1},
        {"top_p": 0},
        {"top_p": 1.5},
        {"top_k": -1},
        {"min_p": 2},
        {"logprobs": 99},
        {"stop": [""]},
    ],
)
def test_invalid_params_raise(kwargs):
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)


def test_stop_string_params_accept_a_single_string():
    assert SamplingParams(stop="END").stop == ("END",)


class CharTokenizer:
    """Token i decodes to chr(i); 0xFF splits a two-byte character across two tokens."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        out = bytearray()
        for i in ids:
            out += bytes([0xC3]) if i == 0xFF else (bytes([0xA9]) if i == 0xFE else chr(i).encode())
        return out.decode("utf-8", errors="replace")


def _feed(detok: IncrementalDetokenizer, text: str) -> list[bool]:
    return [detok.append(ord(c)) for c in text]


def test_detokenizer_incremental_text_and_utf8():
    detok = IncrementalDetokenizer(CharTokenizer())
    _feed(detok, "ab")
    detok.append(0xFF)
    assert detok.text == "ab"  # incomplete character held
    detok.append(0xFE)
    assert detok.text == "abé"


def test_stop_string_cuts_text_and_holds_back_prefix():
    detok = IncrementalDetokenizer(CharTokenizer(), stop=("STOP",))
    stops = _feed(detok, "hello ST")
    assert not any(stops)
    assert detok.visible_text(finished=False) == "hello "  # "ST" may start "STOP"
    assert detok.visible_text(finished=True) == "hello ST"
    assert _feed(detok, "OP!") == [False, True, False]
    assert detok.text == "hello " and detok.stopped


def test_stop_string_spanning_tokens_found():
    detok = IncrementalDetokenizer(CharTokenizer(), stop=("\n\n", "xyz"))
    assert _feed(detok, "a\n\nb") == [False, False, True, False]
    assert detok.text == "a"
