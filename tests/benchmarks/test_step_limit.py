"""The step limit bench_model prints: its bytes and flops for the default model's shapes."""

from __future__ import annotations

import torch

from benchmarks.bench_model import BLOCK, workload
from benchmarks.step_limit import ModelCosts, step_limit
from engine.models.config import ModelConfig

SMOLLM2_135M = {  # the default model's shapes
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "vocab_size": 49152,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 100000.0,
    "tie_word_embeddings": True,
}


def test_a_decode_step_reads_the_weights_once_and_each_distinct_key_once():
    costs = ModelCosts.of(ModelConfig.from_dict(SMOLLM2_135M), torch.bfloat16)
    assert costs.weight_bytes == 2 * (30 * 576 * (2 * 576 + 2 * 192 + 3 * 1536) + 49152 * 576)
    assert costs.kv_bytes_per_key == 30 * 2 * 192 * 2
    private = step_limit(costs, *workload("decode-16x1100-private"), BLOCK, 50.0, 1600.0)
    shared = step_limit(costs, *workload("decode-16x1100-shared"), BLOCK, 50.0, 1600.0)
    assert private.bytes == costs.weight_bytes + 16 * 1100 * costs.kv_bytes_per_key
    assert shared.bytes == costs.weight_bytes + (1024 + 16 * 76) * costs.kv_bytes_per_key
    assert private.flops == shared.flops  # the same arithmetic over the same keys
    assert private.seconds == max(private.bytes / 50e9, private.flops / 1600e9)
    assert private.memory_s > private.compute_s  # at an AMX peak, bound by its bytes


def test_a_long_prefill_is_bound_by_its_arithmetic():
    costs = ModelCosts.of(ModelConfig.from_dict(SMOLLM2_135M), torch.bfloat16)
    limit = step_limit(costs, *workload("prefill-1024"), BLOCK, 50.0, 1600.0)
    causal_keys = 1024 * 1025 // 2
    assert limit.flops == (
        2 * costs.linear_params * 1024
        + 2 * costs.head_params
        + costs.attention_flops_per_key * causal_keys
    )
    assert limit.compute_s > limit.memory_s
