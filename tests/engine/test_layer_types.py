"""Each layer's sliding window and rope, read from config.json as transformers reads it."""

from __future__ import annotations

import pytest
import transformers

from engine.models.config import ModelConfig, RopeConfig
from engine.models.layer_types import FULL, SLIDING, layer_windows

TINY = dict(
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=64,
)


def windows_of(config: transformers.PretrainedConfig) -> tuple[int | None, ...]:
    return layer_windows(config.to_dict())


def transformers_windows(config: transformers.PretrainedConfig) -> tuple[int | None, ...]:
    """What transformers' own attention layers use (their layer_types and window)."""
    return tuple(config.sliding_window if t == SLIDING else None for t in config.layer_types)


def test_mistral_windows_every_layer():
    assert windows_of(transformers.MistralConfig(**TINY, sliding_window=16)) == (16,) * 6
    assert windows_of(transformers.MistralConfig(**TINY, sliding_window=None)) == (None,) * 6
    config = ModelConfig.from_dict(transformers.MistralConfig(**TINY, sliding_window=16).to_dict())
    assert config.has_windows and config.sliding_window == 16 and config.local_rope is None


@pytest.mark.parametrize("cls", [transformers.Qwen2Config, transformers.Qwen3Config])
@pytest.mark.parametrize("first", [0, 2, 6, 28])
def test_qwen_windows_follow_use_sliding_window_and_max_window_layers(cls, first):
    on = cls(**TINY, use_sliding_window=True, sliding_window=12, max_window_layers=first)
    assert windows_of(on) == transformers_windows(on)
    assert windows_of(on) == tuple(12 if i >= first else None for i in range(6))
    off = cls(**TINY, use_sliding_window=False, sliding_window=12, max_window_layers=first)
    assert windows_of(off) == (None,) * 6
    assert not ModelConfig.from_dict(off.to_dict()).has_windows


def test_a_qwen_config_without_layer_types_uses_the_max_window_layers_rule():
    raw = transformers.Qwen2Config(
        **TINY, use_sliding_window=True, sliding_window=12, max_window_layers=4
    ).to_dict()
    del raw["layer_types"]  # as older config.json files on the Hub
    assert layer_windows(raw) == (None,) * 4 + (12, 12)


def test_gemma3_windows_from_layer_types_or_the_pattern():
    config = transformers.Gemma3TextConfig(**TINY, head_dim=8, sliding_window=16)
    assert windows_of(config) == transformers_windows(config) == (16,) * 5 + (None,)
    raw = config.to_dict()
    del raw["layer_types"]
    assert layer_windows({**raw, "sliding_window_pattern": 3}) == (16, 16, None) * 2
    types = [SLIDING, FULL, SLIDING, SLIDING, FULL, FULL]
    assert layer_windows({**raw, "layer_types": types}) == (16, None, 16, 16, None, None)
    with pytest.raises(ValueError, match="layer_types"):
        layer_windows({**raw, "layer_types": types[:5]})


def test_gemma3_local_rope_for_windowed_layers():
    raw = transformers.Gemma3TextConfig(**TINY, head_dim=8).to_dict()
    # transformers 5 nests the ropes per layer type; older config.json files have
    # rope_theta + rope_local_base_freq
    assert RopeConfig.from_hf(raw).theta == 1_000_000.0
    assert RopeConfig.from_hf(raw, SLIDING).theta == 10_000.0
    legacy = {
        k: v for k, v in raw.items() if k not in ("rope_parameters", "rope_scaling", "rope_theta")
    }
    legacy.update(rope_theta=2e6, rope_local_base_freq=5e4)
    assert RopeConfig.from_hf(legacy).theta == 2e6
    assert RopeConfig.from_hf(legacy, SLIDING).theta == 5e4


def test_llama_reads_no_window_and_layer_ropes_default_to_the_global_one():
    raw = transformers.LlamaConfig(**TINY).to_dict()
    config = ModelConfig.from_dict({**raw, "sliding_window": 8})  # LlamaModel ignores it too
    assert config.layer_windows == (None,) * 6 and not config.has_windows
    assert config.sliding_window is None and config.local_rope is None
    assert all(config.layer_rope(i) == config.rope for i in range(6))


def test_layer_windows_must_cover_every_layer():
    config = ModelConfig.from_dict(transformers.LlamaConfig(**TINY).to_dict())
    fields = {f: getattr(config, f) for f in config.__dataclass_fields__}
    with pytest.raises(ValueError, match="layer_windows has 2 entries for 6 layers"):
        ModelConfig(**{**fields, "layer_windows": (8, None)})


def test_layer_ropes_give_windowed_layers_the_local_table():
    """What Gemma 3 needs of the rope tables: one table per distinct rope, looked up once per
    step, windowed layers reading the local one."""
    import dataclasses

    import torch

    from engine.models.rope import LayerRopes, RotaryEmbedding

    raw = transformers.Qwen2Config(
        **TINY, use_sliding_window=True, sliding_window=4, max_window_layers=4
    ).to_dict()
    config = dataclasses.replace(ModelConfig.from_dict(raw), local_rope=RopeConfig(theta=10.0))
    assert [config.layer_rope(i) for i in range(6)] == [config.rope] * 4 + [config.local_rope] * 2
    ropes = LayerRopes(config, torch.float32, torch.device("cpu"))
    assert len(ropes.tables) == 2
    positions = torch.tensor([0, 3, 17])
    per_layer = ropes.lookup(positions, 18)
    for i, (cos, sin) in enumerate(per_layer):
        want = RotaryEmbedding(config, torch.float32, torch.device("cpu"), config.layer_rope(i))
        want_cos, want_sin = want.lookup(positions, 18)
        assert torch.equal(cos, want_cos) and torch.equal(sin, want_sin)
    assert per_layer[0][0] is per_layer[3][0] and not torch.equal(per_layer[0][0], per_layer[4][0])
