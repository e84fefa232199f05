"""load_model: a Hugging Face folder (config.json + *.safetensors, sharded or not) -> model."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from safetensors import safe_open

from engine.attention import AttentionBackend
from engine.models.config import ModelConfig
from engine.models.gemma import GemmaForCausalLM
from engine.models.llama import LlamaForCausalLM

_NORM_PATHS = {"q_norm": "self_attn.q_norm", "k_norm": "self_attn.k_norm"}
_MODELS: dict[str, type[LlamaForCausalLM]] = {"gemma3_text": GemmaForCausalLM}
_TEXT_PREFIXES = (
    ("language_model.model.", "model."),
    ("model.language_model.", "model."),
    ("language_model.lm_head.", "lm_head."),
)
_VISION = tuple(
    prefix + name
    for prefix in ("", "model.")
    for name in ("vision_tower.", "multi_modal_projector.")
)
_SAMPLE_CHUNKS, _CHUNK = 8, 1 << 16


def weight_files(path: Path) -> list[Path]:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {path}")
    return files


def model_digest(path: str | Path) -> str:
    """Cheap identity of a model folder: config.json, and per weights file its name, size,
    safetensors header and a few sampled chunks of its bytes (sha256, 32 hex chars)."""
    path = Path(path)
    h = hashlib.sha256((path / "config.json").read_bytes())
    for f in weight_files(path):
        size = f.stat().st_size
        h.update(f"{f.name}:{size}".encode())
        with f.open("rb") as fh:
            header_len = int.from_bytes(fh.read(8), "little")
            h.update(fh.read(min(header_len, 1 << 24)))
            for i in range(_SAMPLE_CHUNKS):
                fh.seek(size * i // _SAMPLE_CHUNKS)
                h.update(fh.read(_CHUNK))
    return h.hexdigest()[:32]


def _text_name(stored: str) -> str | None:
    """The decoder's tensor name of a stored one: a gemma3 (multimodal) checkpoint nests the text
    model under language_model (None: its vision tower and projector, which are not loaded)."""
    if stored.startswith(_VISION):
        return None
    for prefix, plain in _TEXT_PREFIXES:
        if stored.startswith(prefix):
            return plain + stored[len(prefix) :]
    return stored


def _targets(model: LlamaForCausalLM) -> dict[str, tuple[torch.Tensor, slice]]:
    """HF tensor name -> (our parameter, rows of it) for every tensor the model needs."""
    c = model.config
    q, kv, inter = c.q_size, c.kv_size, c.intermediate_size
    full = slice(None)
    out: dict[str, tuple[torch.Tensor, slice]] = {
        "model.embed_tokens.weight": (model.embed_tokens, full),
        "model.norm.weight": (model.norm, full),
    }
    if not c.tie_word_embeddings:
        out["lm_head.weight"] = (model.lm_head, full)
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        qkv = {"q": slice(0, q), "k": slice(q, q + kv), "v": slice(q + kv, q + 2 * kv)}
        attn = {f"{p}self_attn.{n}_proj": rows for n, rows in qkv.items()}
        _add_linear(out, attn, layer.qkv_proj, layer.qkv_bias)
        _add_linear(out, {f"{p}self_attn.o_proj": full}, layer.o_proj, layer.o_bias)
        for norm in model.layer_norms:
            if getattr(layer, norm) is not None:
                out[f"{p}{_NORM_PATHS.get(norm, norm)}.weight"] = (getattr(layer, norm), full)
        gate_up = {"gate": slice(0, inter), "up": slice(inter, 2 * inter)}
        mlp = {f"{p}mlp.{n}_proj": rows for n, rows in gate_up.items()}
        _add_linear(out, mlp, layer.gate_up_proj, layer.gate_up_bias)
        _add_linear(out, {f"{p}mlp.down_proj": full}, layer.down_proj, layer.down_bias)
    return out


def _add_linear(
    out: dict[str, tuple[torch.Tensor, slice]],
    rows_by_name: dict[str, slice],
    weight: torch.Tensor,
    bias: torch.Tensor | None,
) -> None:
    """HF projections `name` -> rows of our (possibly fused) weight and bias."""
    for name, rows in rows_by_name.items():
        out[f"{name}.weight"] = (weight, rows)
        if bias is not None:
            out[f"{name}.bias"] = (bias, rows)


def load_model(
    path: str | Path,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    *,
    prepack: bool = True,
    attention: AttentionBackend | None = None,
    invariant: bool = False,
) -> LlamaForCausalLM:
    """Build the decoder for the folder's config.json and copy its weights in (fused qkv/gate_up).
    prepack: on CPU in bfloat16, hold the projections in oneDNN's packed layout.
    attention: the attention backend (default: make_attention_backend(device)); invariant: that
    default in its batch- and cache-invariant form (EngineConfig.deterministic)."""
    path = Path(path)
    config = ModelConfig.from_file(path)
    model = _MODELS.get(config.model_type, LlamaForCausalLM)(
        config, dtype=dtype, device=device, attention=attention, invariant=invariant
    )
    targets = _targets(model)
    missing = set(targets)
    with torch.no_grad():
        for f in weight_files(path):
            with safe_open(f, framework="pt") as st:
                for stored in st.keys():  # noqa: SIM118 (safe_open is not a mapping)
                    name = _text_name(stored)
                    if name is None:
                        continue
                    if name not in targets:
                        if name == "lm_head.weight" or name.endswith("rotary_emb.inv_freq"):
                            continue
                        raise ValueError(f"unexpected tensor {name!r} in {f.name}")
                    param, rows = targets[name]
                    param[rows].copy_(st.get_tensor(stored))
                    missing.discard(name)
    if missing:
        raise ValueError(f"missing tensors in {path}: {sorted(missing)[:5]} ...")
    model.finish_load()
    model.model_id = f"{config.model_type}-{model_digest(path)}"
    if prepack:
        model.prepack()
    return model
