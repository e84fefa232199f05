"""load_model / load_tokenizer on small Hugging Face folders."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from engine.attention import build_attention_metadata, compute_positions
from engine.kv.paged_cache import KVCache
from engine.loader import load_model, load_tokenizer, model_digest
from engine.models.config import ModelConfig

TINY = dict(
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=1,
    vocab_size=64,
    max_position_embeddings=128,
)


def save_tiny(path, cls=transformers.LlamaConfig, **kw):
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(cls(**TINY, **kw), dtype=torch.float32)
    hf.save_pretrained(path, max_shard_size="20KB")
    return hf


def test_sharded_folder_loads_every_tensor(tmp_path):
    hf = save_tiny(tmp_path, transformers.Qwen2Config)
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    model = load_model(tmp_path, torch.float32, "cpu", prepack=False)
    sd = hf.state_dict()
    layer = model.layers[1]
    q, kv = model.config.q_size, model.config.kv_size
    w = sd["model.layers.1.self_attn.k_proj.weight"]
    assert torch.equal(layer.qkv_proj[q : q + kv], w)
    assert torch.equal(layer.qkv_bias[q + kv :], sd["model.layers.1.self_attn.v_proj.bias"])
    assert torch.equal(layer.gate_up_proj[48:], sd["model.layers.1.mlp.up_proj.weight"])
    assert torch.equal(model.lm_head, sd["lm_head.weight"])
    assert model.config.attention_bias and not model.config.o_proj_bias


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_load_with_and_without_packed_weights(tmp_path, dtype):
    save_tiny(tmp_path, tie_word_embeddings=True)
    packed = load_model(tmp_path, dtype, "cpu")
    plain = load_model(tmp_path, dtype, "cpu", prepack=False)
    assert packed.embed_tokens.dtype == dtype
    assert packed.lm_head is packed.embed_tokens
    # oneDNN packs float32 on any x86 CPU, bfloat16 only with AVX-512 (else the plain path runs)
    avx512 = torch.backends.cpu.get_cpu_capability().startswith("AVX512")
    can_pack = dtype == torch.float32 or avx512
    assert bool(packed.layers[0].packed) == can_pack and not plain.layers[0].packed
    outs = []
    for model in (packed, plain):
        kv = KVCache.for_model(model, 8, 4).tensor
        for query_lens, seq_lens in (([5, 3], [5, 3]), ([1, 1], [6, 4])):
            meta = build_attention_metadata(query_lens, seq_lens, [[0, 1], [2, 3]], 4)
            pos = torch.from_numpy(compute_positions(query_lens, seq_lens))
            ids = torch.arange(sum(query_lens)) * 7 % 64
            outs.append(model.compute_logits(model(ids, pos, kv, meta)))
    torch.testing.assert_close(torch.cat(outs[:2]), torch.cat(outs[2:]), rtol=2e-2, atol=2e-2)


def test_model_id_is_stable_and_tracks_weights(tmp_path):
    save_tiny(tmp_path / "a")
    save_tiny(tmp_path / "b")
    assert model_digest(tmp_path / "a") == model_digest(tmp_path / "b")
    assert load_model(tmp_path / "a").model_id == load_model(tmp_path / "b").model_id
    hf = save_tiny(tmp_path / "c")
    with torch.no_grad():
        for p in hf.parameters():
            p.mul_(1.5)
    hf.save_pretrained(tmp_path / "c", max_shard_size="20KB")
    assert model_digest(tmp_path / "c") != model_digest(tmp_path / "a")


def test_missing_tensor_is_an_error(tmp_path):
    save_tiny(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["num_hidden_layers"] = 4
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="missing"):
        load_model(tmp_path)


def test_config_parsing_variants():
    legacy = ModelConfig.from_dict(
        dict(
            model_type="llama",
            **TINY,
            rope_theta=5e5,
            rope_scaling={"type": "linear", "factor": 2.0},
            eos_token_id=[7, 9],
        )
    )
    assert (legacy.rope.theta, legacy.rope.rope_type, legacy.rope.factor) == (5e5, "linear", 2.0)
    assert legacy.eos_token_ids == (7, 9) and legacy.head_dim == 8
    qwen3 = ModelConfig.from_dict(transformers.Qwen3Config(**TINY, head_dim=16).to_dict())
    assert qwen3.qk_norm and qwen3.head_dim == 16 and not qwen3.attention_bias
    mistral = ModelConfig.from_dict(transformers.MistralConfig(**TINY, sliding_window=64).to_dict())
    assert mistral.sliding_window == 64
    assert ModelConfig.from_dict(transformers.Qwen2Config(**TINY).to_dict()).sliding_window is None
    with pytest.raises(ValueError, match="unsupported model_type"):
        ModelConfig.from_dict(dict(model_type="gpt2", **TINY))


def write_tiny_tokenizer(path):
    vocab = {"<s>": 0, "</s>": 1, "<|user|>": 2, "h": 3, "i": 4, "hi": 5, "Ġ": 6, "!": 7}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[("h", "i")]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<s>", "</s>", "<|user|>"])
    tok.save(str(path / "tokenizer.json"))
    template = (
        "{% for m in messages %}{{ '<|user|>' if m['role'] == 'user' else '' }}"
        "{{ m['content'] }}{{ eos_token }}{% endfor %}{% if add_generation_prompt %}<s>{% endif %}"
    )
    (path / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": "</s>", "bos_token": "<s>", "chat_template": template})
    )
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 7]}))


def test_tokenizer_encode_decode_chat_template_and_eos(tmp_path):
    write_tiny_tokenizer(tmp_path)
    tok = load_tokenizer(tmp_path)
    assert tok.encode("hi!") == [5, 7]
    assert tok.decode([0, 5, 7]) == "hi!"
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == [2, 5, 1, 0]
    assert tok.eos_token_ids == {1, 7}
    assert tok.vocab_size == 8
