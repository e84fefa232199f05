"""The native CPU kernels (engine/attention/csrc), built on first use by torch's extension
mechanism (a C++ compiler and ninja; cached under ~/.cache/torch_extensions). Without them the
torch path runs: it is the fallback and the reference the kernels are tested against."""

from __future__ import annotations

import functools
import logging
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "csrc" / "paged_attention.cpp"
# -fopenmp: at::parallel_for is OpenMP inline code, serial without it; libgomp.so.1 is the copy
# torch already loaded (same soname), so the kernels share torch's thread pool and thread count
CFLAGS = ["-O3", "-march=native", "-fopenmp"]
LDFLAGS = ["-fopenmp"]


@functools.cache
def load_native() -> NativeKernels | None:
    """The compiled kernels (built once per machine), or None when they cannot be built here."""
    try:
        from torch.utils.cpp_extension import load

        load(
            name="radixcache_attention",
            sources=[str(SOURCE)],
            extra_cflags=CFLAGS,
            extra_ldflags=LDFLAGS,
            is_python_module=False,
        )
    except Exception as exc:  # no compiler, no ninja, a build error: the torch path still works
        log.warning("native attention kernel unavailable, using the torch path: %s", exc)
        return None
    return NativeKernels()


class NativeKernels:
    """The ops the extension registers (torch.ops.radixcache.*)."""

    PREFILL_HEAD_DIMS = (16, 32, 64, 128)

    @staticmethod
    def has_native_prefill(dtype: torch.dtype) -> bool:
        """Whether paged_prefill serves dtype (head dims PREFILL_HEAD_DIMS) on this CPU: bfloat16
        with AVX512-BF16 (bf16 pairs; head dim 16 on the 8-wide kernel) or AVX2 + FMA (widened
        to float32); float32 with AVX2 + FMA."""
        return bool(torch.ops.radixcache.has_native_prefill(dtype))

    @staticmethod
    def vector_isa() -> str:
        """The vector code compiled for this CPU: avx512bf16, avx512, avx2 or scalar."""
        return str(torch.ops.radixcache.vector_isa())

    @staticmethod
    def paged_prefill(
        q: torch.Tensor,  # [T, Hq, D] (each token's heads contiguous)
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        out: torch.Tensor,  # [T, Hq, D]: rows of the listed sequences are written
        q_starts: torch.Tensor,  # int32 [N]: first row of each sequence's new tokens
        q_lens: torch.Tensor,  # int32 [N]
        seq_lens: torch.Tensor,  # int32 [N]: new token i sits at seq_len - q_len + i
        block_tables: torch.Tensor,  # int32 [N, max_blocks]
        scale: float,
    ) -> None:
        torch.ops.radixcache.paged_prefill(
            q, k_cache, v_cache, out, q_starts, q_lens, seq_lens, block_tables, scale
        )

    @staticmethod
    def paged_decode(
        q: torch.Tensor,  # [N, Hq, D]: one new token per sequence
        k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D] (contiguous)
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,  # int32 [N, max_blocks]
        seq_lens: torch.Tensor,  # int32 [N]: keys [0, seq_len) of each sequence
        scale: float,
    ) -> torch.Tensor:  # [N, Hq, D]
        return torch.ops.radixcache.paged_decode(q, k_cache, v_cache, block_tables, seq_lens, scale)
