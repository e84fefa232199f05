"""Greedy generation equals transformers token for token; logprobs close (fp32)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from engine.llm import LLM
from engine.sampling_params import SamplingParams

PROMPTS = [
    [72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100],
    [5, 17, 200, 33, 90, 91, 92, 7, 150, 151, 3, 44, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69],
    [120, 121],
]


def hf_greedy(path, prompt: list[int], steps: int) -> tuple[list[int], list[torch.Tensor]]:
    """Reference: full recompute each step with transformers; returns tokens and log-softmaxes."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.tensor([prompt])
    tokens, logprobs = [], []
    with torch.no_grad():
        for _ in range(steps):
            lp = torch.log_softmax(model(ids).logits[0, -1].float(), -1)
            nxt = int(lp.argmax())
            tokens.append(nxt)
            logprobs.append(lp)
            ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
    return tokens, logprobs


def check_parity(
    path, prompts: list[list[int]], steps: int, block_size: int, atol: float, **engine: Any
) -> None:
    """Our greedy tokens equal transformers' (its float32 model on CPU); logprobs within atol.
    engine: more engine settings (device="cuda")."""
    llm = LLM(str(path), dtype="float32", num_blocks=256, block_size=block_size, **engine)
    params = SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True, logprobs=3)
    outs = llm.generate(prompts, params)
    for prompt, out in zip(prompts, outs, strict=True):
        ref_tokens, ref_lps = hf_greedy(path, prompt, steps)
        got = out.outputs[0]
        assert got.token_ids == ref_tokens
        for step, ref in enumerate(ref_lps):  # step 0 = prefill logits, then decode
            assert got.logprobs[step] == pytest.approx(float(ref.max()), abs=atol)
            for tok, lp in got.top_logprobs[step].items():
                assert lp == pytest.approx(float(ref[tok]), abs=atol)
    llm.engine.kv.cache.check_integrity()


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_tiny_models_match_transformers(tiny_models, arch):
    check_parity(tiny_models[arch], PROMPTS, steps=12, block_size=4, atol=1e-4)


@pytest.mark.slow
def test_default_model_matches_transformers(default_model_path):
    from engine.loader import load_tokenizer

    tok = load_tokenizer(default_model_path)
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}]
    )
    check_parity(default_model_path, [prompt], steps=8, block_size=16, atol=2e-3)


def long_text(lines: int) -> str:
    colors = ["red", "green", "blue", "amber", "violet", "grey", "white"]
    animals = ["fox", "owl", "cat", "heron", "mole", "wren", "hare", "lynx", "crab", "eel", "yak"]
    return " ".join(
        f"Line {i}: the {colors[i % 7]} {animals[i % 11]} jumps over {i * 7 % 13} fences."
        for i in range(lines)
    )


@pytest.mark.slow
def test_gemma3_270m_matches_transformers_past_its_window(gemma_model_path):
    """Real Gemma 3 weights, a prompt past the 512-token window of its sliding layers, prefilled
    in chunks that cross it: 16 greedy tokens equal transformers' and logprobs close."""
    from engine.loader import load_tokenizer

    prompt = load_tokenizer(gemma_model_path).encode(long_text(56))
    assert 700 < len(prompt) < 1024, len(prompt)
    steps = 16
    llm = LLM(
        str(gemma_model_path),
        dtype="float32",
        num_blocks=128,
        block_size=16,
        max_num_batched_tokens=192,
    )
    params = SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True, logprobs=3)
    got = llm.generate([prompt], params)[0].outputs[0]
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(gemma_model_path, dtype=torch.float32)
    with torch.no_grad():
        ref = hf.eval().generate(torch.tensor([prompt]), max_new_tokens=steps, do_sample=False)
        ref_lps = torch.log_softmax(hf(ref[:, :-1]).logits[0, len(prompt) - 1 :].float(), -1)
    assert got.token_ids == ref[0, len(prompt) :].tolist()
    for step, ref in enumerate(ref_lps):
        assert got.logprobs[step] == pytest.approx(float(ref.max()), abs=2e-3)
        for tok, lp in got.top_logprobs[step].items():
            assert lp == pytest.approx(float(ref[tok]), abs=2e-3)
