"""The native CPU kernels (engine/attention/csrc), built on first use by torch's extension
mechanism (a C++ compiler and ninja; cached under ~/.cache/torch_extensions). Without them the
torch path runs: it is the fallback and the reference the kernels are tested against."""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from types import ModuleType

log = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "csrc" / "paged_attention.cpp"
CFLAGS = ["-O3", "-march=native", "-fopenmp-simd"]


@functools.cache
def load_native() -> ModuleType | None:
    """The compiled module (paged_decode), or None when it cannot be built here."""
    try:
        from torch.utils.cpp_extension import load

        return load(name="radixcache_attention", sources=[str(SOURCE)], extra_cflags=CFLAGS)
    except Exception as exc:  # no compiler, no ninja, a build error: the torch path still works
        log.warning("native attention kernel unavailable, using the torch path: %s", exc)
        return None
