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
from engine.sampling_params import SamplingParams
from tests.engine.test_models import assert_close, hf_logits, run_steps
from tests.tiny_models import (
    GEMMA_CONFIGS,
    TINY_VOCAB,
    make_tiny_gemma,
    randomize_gemma,
    tiny_gemma_config,
)

VOCAB = TINY_VOCAB


@pytest.fixture(scope="module", params=sorted(GEMMA_CONFIGS))
def gemma(request, tmp_path_factory):
    hf, path = make_tiny_gemma(tmp_path_factory.mktemp(request.param), request.param)
    return hf, path, GEMMA_CONFIGS[request.param]["sliding_window"]


def test_the_folder_loads_as_gemma(gemma):
    hf, path, window = gemma
    ours = load_model(path, torch.float32, "cpu")
    assert isinstance(ours, GemmaForCausalLM)
    types = hf.config.layer_types
    assert ours.config.layer_windows == tuple(
        window if t == "sliding_attention" else None for t in types
    )
    assert len(ours.ropes.tables) == 2  # the local rope of sliding layers, the global one


def test_prefill_and_decode_logits_match(gemma):
    hf, path, window = gemma
    ours = load_model(path, torch.float32, "cpu")
    n = 3 * window + window // 2  # sliding layers see a window, full ones all keys
    ids = torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(1)).tolist()
    ref = hf_logits(hf, ids)
    assert_close(run_steps(ours, [ids]), ref)
    cut = window + 3  # chunks that end inside and past a window, then decode tokens
    steps = [ids[:5], ids[5:cut], ids[cut : 2 * window], *[[t] for t in ids[2 * window :]]]
    assert_close(run_steps(ours, steps), ref)


def test_greedy_generation_matches_transformers(gemma):
    hf, path, window = gemma
    prompt = torch.randint(0, VOCAB, (3 * window,), generator=torch.Generator().manual_seed(2))
    steps = window + 2
    ref = hf.generate(prompt[None], max_new_tokens=steps, do_sample=False, eos_token_id=None)
    llm = LLM(str(path), dtype="float32", num_blocks=64, block_size=4, max_num_batched_tokens=20)
    params = SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True)
    out = llm.generate([prompt.tolist()], params)[0].outputs[0]
    assert out.token_ids == ref[0, len(prompt) :].tolist()


def test_gemma3_multimodal_and_legacy_configs_parse_to_the_text_config():
    text = tiny_gemma_config("d32-mixed").to_dict()
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


def test_a_gemma3_multimodal_folder_serves_its_text_model(tmp_path):
    """A gemma3 (image-text) checkpoint: the text model's tensors under language_model, the
    vision tower's skipped; logits of text-only input equal transformers' multimodal model."""
    text = tiny_gemma_config("d32-mixed").to_dict()
    text["final_logit_softcapping"] = None  # Gemma3ForConditionalGeneration never applies it
    vision = dict(
        model_type="siglip_vision_model",
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=28,
        patch_size=14,
    )
    config = transformers.Gemma3Config(
        text_config=text, vision_config=vision, mm_tokens_per_image=4
    )
    torch.manual_seed(0)
    hf = transformers.Gemma3ForConditionalGeneration(config).eval()
    randomize_gemma(hf)
    hf.save_pretrained(tmp_path)
    ours = load_model(tmp_path, torch.float32, "cpu")
    assert isinstance(ours, GemmaForCausalLM)
    ids = torch.randint(0, VOCAB, (7,), generator=torch.Generator().manual_seed(3)).tolist()
    assert_close(run_steps(ours, [ids]), hf_logits(hf, ids))


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_deterministic_mode_serves_head_dim_256_bit_exact(make_llm, tmp_path, dtype):
    """Deterministic mode (the native prefill kernel for every token) at Gemma 3's head dim 256,
    prompts past the window sharing a head: batch size, chunk size and cache hits change no bit."""
    from tests.engine.test_invariance import answers, prompts_sharing_a_head

    _, path = make_tiny_gemma(tmp_path / "g", "d256-pattern")
    prompts = prompts_sharing_a_head(6, 40, 250)

    def make(**settings) -> LLM:
        return make_llm(path, dtype=dtype, num_blocks=512, deterministic=True, **settings)

    want = answers(make(enable_prefix_caching=False), prompts)
    assert len({tuple(lp) for _, lp in want}) == len(want)  # distinct answers: a real check
    assert answers(make(max_num_seqs=1, max_num_batched_tokens=16), prompts) == want
    llm = make(max_num_seqs=6)
    assert answers(llm, prompts) == want  # cold
    assert answers(llm, prompts) == want  # device-tree hits, past the window


def test_bfloat16_tracks_the_float32_reference(gemma):
    """The bf16 serving path (norms in float32, native kernels where they build) past the window
    against transformers in float32."""
    hf, path, window = gemma
    ours = load_model(path, torch.bfloat16, "cpu")
    ids = torch.randint(0, VOCAB, (3 * window,), generator=torch.Generator().manual_seed(5))
    ids = ids.tolist()
    steps = [ids[: window + 1], ids[window + 1 : 2 * window], *[[t] for t in ids[2 * window :]]]
    ref = hf_logits(hf, ids)
    scale = ref.abs().max().item()
    torch.testing.assert_close(run_steps(ours, steps).float(), ref, rtol=0.0, atol=0.08 * scale)
