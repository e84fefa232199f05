"""Gemma 3 against transformers (float32) on tiny random configs: sliding and full layers, a
local rope base, qk-norm, head dims 32 and 256, softcapped logits; and its config parsing."""

from __future__ import annotations

import pytest
import torch
import transformers

from engine.llm import LLM
from engine.loader import load_model
from engine.models.config import ModelConfig
from engine.models.gemma import GemmaForCausalLM
from engine.sampling import SamplingParams
from tests.engine.test_models import assert_close, hf_logits, run_steps
from tests.tiny_models import TINY_VOCAB, write_tokenizer

VOCAB = TINY_VOCAB
CONFIGS = {
    "d32-mixed": dict(  # full layers between sliding ones, scaled global rope, softcapped logits
        num_hidden_layers=5,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"]
        + ["full_attention", "sliding_attention"],
        head_dim=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        sliding_window=8,
        query_pre_attn_scalar=24,
        rope_local_base_freq=100.0,
        rope_theta=1e4,
        rope_scaling={"rope_type": "linear", "factor": 2.0},
        final_logit_softcapping=30.0,
    ),
    "d256-pattern": dict(  # Gemma 3 270M's shape: head dim 256, one KV head, every sixth full
        num_hidden_layers=6,
        head_dim=256,
        num_attention_heads=2,
        num_key_value_heads=1,
        sliding_window=16,
        query_pre_attn_scalar=256,
    ),
}


def gemma_config(name: str) -> transformers.Gemma3TextConfig:
    return transformers.Gemma3TextConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        **CONFIGS[name],
    )


def randomize(model: torch.nn.Module) -> None:
    """Norm weights around 0 (the forward multiplies by 1 + w), projections large enough for
    peaked logits (no near-ties in greedy runs)."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.3 if "norm" in name else 0.15))


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def gemma(request, tmp_path_factory):
    torch.manual_seed(0)
    hf = transformers.Gemma3ForCausalLM(gemma_config(request.param)).eval()
    randomize(hf)
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path)
    write_tokenizer(path)
    window = CONFIGS[request.param]["sliding_window"]
    return hf, path, window


def test_the_folder_loads_as_gemma(gemma):
    hf, path, window = gemma
    ours = load_model(path, torch.float32, "cpu")
    assert isinstance(ours, GemmaForCausalLM)
    types = hf.config.layer_types
    assert ours.config.layer_windows == tuple(
        window if t == "sliding_attention" else None for t in types
    )
    assert {layer.sliding for layer in ours.layers} == {True, False}


def test_prefill_and_decode_logits_match(gemma):
    hf, path, window = gemma
    ours = load_model(path, torch.float32, "cpu")
    n = min(window - 1, 30)
    ids = torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(1)).tolist()
    assert_close(run_steps(ours, [ids]), hf_logits(hf, ids))
    steps = [ids[:3], ids[3:5], *[[t] for t in ids[5:]]]
    assert_close(run_steps(ours, steps), hf_logits(hf, ids))


def test_greedy_generation_matches_transformers(gemma):
    hf, path, window = gemma
    prompt = torch.randint(0, VOCAB, (window // 2,), generator=torch.Generator().manual_seed(2))
    steps = window // 2 - 1
    ref = hf.generate(prompt[None], max_new_tokens=steps, do_sample=False, eos_token_id=None)
    llm = LLM(str(path), dtype="float32", num_blocks=64, block_size=4)
    params = SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True)
    out = llm.generate([prompt.tolist()], params)[0].outputs[0]
    assert out.token_ids == ref[0, len(prompt) :].tolist()


def test_gemma3_multimodal_and_legacy_configs_parse_to_the_text_config():
    text = gemma_config("d32-mixed").to_dict()
    flat = ModelConfig.from_dict(text)
    wrapped = ModelConfig.from_dict({"model_type": "gemma3", "text_config": text})
    assert wrapped.layer_windows == flat.layer_windows == (8, None, 8, None, 8)
    assert flat.rope.theta == 1e4 and flat.rope.rope_type == "linear" and flat.rope.factor == 2
    assert flat.local_rope is not None and flat.local_rope.theta == 100.0
    assert flat.qk_norm and flat.tie_word_embeddings and flat.head_dim == 32
    legacy = {  # a transformers 4 config.json: flat rope fields, the pattern as an int
        k: v for k, v in text.items() if k not in ("rope_parameters", "layer_types")
    }
    legacy.update(rope_theta=1e6, rope_local_base_freq=1e4, sliding_window_pattern=3)
    parsed = ModelConfig.from_dict(legacy)
    assert parsed.layer_windows == (8, 8, None, 8, 8)
    assert parsed.rope.theta == 1e6 and parsed.local_rope.theta == 1e4
    with pytest.raises(ValueError, match="hidden_act"):
        ModelConfig.from_dict({**text, "hidden_activation": "relu"})
