"""The engine's one table of dtype names (EngineConfig.dtype, Namespace.kv_dtype) -> torch dtypes.

storage/ cannot import the engine; its codec reads names through torch itself and knows only its
own wire codes (storage/codec.py DTYPE_CODES), so no second name table exists. The quantized KV
formats' names (engine/kv/quant.py) it does keep, with their codes (PACKED_CODES; a test holds the
two lists equal)."""

from __future__ import annotations

from pathlib import Path

import torch

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def torch_dtype(name: str) -> torch.dtype:
    """'bfloat16' -> torch.bfloat16; a clear error for any other name."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"dtype must be one of {tuple(DTYPES)}, got {name!r}") from None


AUTO = "auto"
# CPU features that make bf16 matmuls faster than float32 (native bf16 dot products). Without them
# oneDNN converts bf16 around float32 kernels, much slower than float32 itself.
FAST_BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The CPU's feature flags as the kernel lists them (empty where /proc/cpuinfo is absent)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


def resolve_dtype(name: str, device: str, flags: frozenset[str] | None = None) -> str:
    """EngineConfig.dtype -> a DTYPES name. "auto" picks the fastest dtype the device computes
    natively: on CPU bfloat16 where it has bf16 dot products, else float32; on CUDA bfloat16
    where supported, else float16."""
    if name != AUTO:
        torch_dtype(name)
        return name
    if device.startswith("cuda"):
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    features = cpu_flags() if flags is None else flags
    return "bfloat16" if features & FAST_BF16_CPU_FLAGS else "float32"
