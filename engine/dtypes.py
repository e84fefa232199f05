"""The engine's one table of dtype names (EngineConfig.dtype, Namespace.kv_dtype) -> torch dtypes.

storage/ cannot import the engine; its codec reads names through torch itself and knows only its
own wire codes (storage/codec.py DTYPE_CODES), so no second name table exists."""

from __future__ import annotations

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
