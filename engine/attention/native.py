"""The native CPU kernels (engine/attention/csrc), built on first use by torch's extension
mechanism (a C++ compiler and ninja) into a folder named by a digest of the source, flags and
torch version (~/.cache/radixcache/native/<digest>, or $RADIXCACHE_NATIVE_DIR). Without them the
torch path runs: it is the fallback and the reference the kernels are tested against."""

from __future__ import annotations

import fcntl
import functools
import hashlib
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.kv.quant import KVFormat

log = logging.getLogger(__name__)

SOURCES = (
    Path(__file__).parent / "csrc" / "paged_attention.cpp",
    Path(__file__).parent / "csrc" / "row_ops.cpp",  # a decoder layer's row-wise ops
    Path(__file__).parent / "csrc" / "quant_attention.cpp",  # over quantized KV blocks
)
HEADERS = (  # included by the sources
    Path(__file__).parent / "csrc" / "vec_exp.h",
    Path(__file__).parent / "csrc" / "kv_quant.h",
)
# -fopenmp: at::parallel_for is OpenMP inline code, serial without it; libgomp.so.1 is the copy
# torch already loaded (same soname), so the kernels share torch's thread pool and thread count
CFLAGS = ("-O3", "-march=native", "-fopenmp")
LDFLAGS = ("-fopenmp",)


def build_dir() -> Path:
    """Where this source, built with these flags for this torch and Python, lives: two checkouts
    never share (or rebuild over) one folder, even with the same kernels (ninja's build file names
    the sources' paths, so a second checkout's start would rebuild the first one's)."""
    root = os.environ.get("RADIXCACHE_NATIVE_DIR") or Path.home() / ".cache/radixcache/native"
    key = hashlib.sha256(b"".join(source.read_bytes() for source in SOURCES + HEADERS))
    paths = [str(source.resolve()) for source in SOURCES]
    key.update(repr((paths, CFLAGS, LDFLAGS, torch.__version__, sys.version_info[:2])).encode())
    return Path(root) / key.hexdigest()[:16]


@functools.cache
def load_native() -> NativeKernels | None:
    """The compiled kernels (built once per machine), or None when they cannot be built here."""
    try:
        from torch.utils.cpp_extension import load

        folder = build_dir()
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "build.flock", "w") as guard:
            # one builder at a time; the OS drops this lock when its holder dies, whereas torch's
            # own "lock" file stays behind after a killed build and makes every later start wait
            # forever: holding the flock, no one else is building, so a leftover one is stale
            fcntl.flock(guard, fcntl.LOCK_EX)
            (folder / "lock").unlink(missing_ok=True)
            load(
                name="radixcache_attention",
                sources=[str(source) for source in SOURCES],
                extra_cflags=list(CFLAGS),  # torch appends to the lists it is given
                extra_ldflags=list(LDFLAGS),
                build_directory=str(folder),
                is_python_module=False,
            )
    except Exception as exc:  # no compiler, no ninja, a build error: the torch path still works
        log.warning("native attention kernel unavailable, using the torch path: %s", exc)
        return None
    return NativeKernels()


@dataclass(frozen=True)
class SharedDecodeGroups:
    """Decode sequences sharing their first blocks (a cached prefix), for paged_decode: group g's
    members are members[offsets[g]:offsets[g + 1]] (rows of q), whose tables share blocks[g]
    leading blocks; the kernel reads those keys once for the whole group."""

    offsets: torch.Tensor  # int32 [G + 1]
    members: torch.Tensor  # int32 [sum of group sizes]
    blocks: torch.Tensor  # int32 [G]

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.offsets, self.members, self.blocks


class NativeKernels:
    """The ops the extension registers (torch.ops.radixcache.*)."""

    PREFILL_HEAD_DIMS = (16, 32, 64, 128, 256)

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
        window: int | None = None,  # token at p attends keys [max(0, p - window + 1), p]
    ) -> None:
        torch.ops.radixcache.paged_prefill(
            q, k_cache, v_cache, out, q_starts, q_lens, seq_lens, block_tables, scale, window
        )

    @staticmethod
    def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """x [rows, n] -> RMSNorm(x) * weight (float32 statistics; one op)."""
        return torch.ops.radixcache.rms_norm.default(x, weight, eps)

    @staticmethod
    def add_rms_norm(
        x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> torch.Tensor:
        """residual [rows, n] += x (in place, rounded to the dtype) -> RMSNorm(residual) * weight."""
        return torch.ops.radixcache.add_rms_norm.default(x, residual, weight, eps)

    @staticmethod
    def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
        """gate_up [rows, 2 * inter] -> silu(gate) * up [rows, inter] (silu rounded first)."""
        return torch.ops.radixcache.silu_mul.default(gate_up)

    @staticmethod
    def rope_store_kv(
        qk: torch.Tensor,  # [T, Hq + Hkv, D], heads of D contiguous values
        v: torch.Tensor,  # [T, Hkv, D]
        cos: torch.Tensor,  # [T, 1, D]: [cos, cos, 1...]
        sin: torch.Tensor,  # [T, 1, rotary_dim / 2]
        k_cache: torch.Tensor,  # [num_blocks, bs, Hkv, D], contiguous
        v_cache: torch.Tensor,
        slots: torch.Tensor,  # int64 [T]
    ) -> torch.Tensor:  # [T, Hq + Hkv, D]: qk roped; its k heads and v stored at the slots
        return torch.ops.radixcache.rope_store_kv.default(qk, v, cos, sin, k_cache, v_cache, slots)

    @staticmethod
    def rope_store_kv_q(
        qk: torch.Tensor,  # [T, Hq + Hkv, D], heads of D contiguous values
        v: torch.Tensor,  # [T, Hkv, D]
        cos: torch.Tensor,  # [T, 1, D]: [cos, cos, 1...]
        sin: torch.Tensor,  # [T, 1, rotary_dim / 2]
        k_cache: torch.Tensor,  # uint8 [num_blocks, bs, Hkv, D + 4], contiguous
        v_cache: torch.Tensor,
        slots: torch.Tensor,  # int64 [T]
        fmt: KVFormat,
    ) -> torch.Tensor:  # [T, Hq + Hkv, D]: qk roped; its k heads and v quantized at the slots
        return torch.ops.radixcache.rope_store_kv_q.default(
            qk, v, cos, sin, k_cache, v_cache, slots, fmt.code
        )

    @staticmethod
    def quantize_store_kv(
        k: torch.Tensor,  # [T, Hkv, D] (any float dtype; heads of D contiguous values)
        v: torch.Tensor,
        k_cache: torch.Tensor,  # uint8 [num_blocks, bs, Hkv, D + 4], contiguous
        v_cache: torch.Tensor,
        slots: torch.Tensor,  # int64 [T]
        fmt: KVFormat,
    ) -> None:
        """k and v quantized (bit for bit as engine/kv/quant.py's quantize) into the slots."""
        torch.ops.radixcache.quantize_store_kv.default(k, v, k_cache, v_cache, slots, fmt.code)

    @staticmethod
    def paged_attention_q(
        q: torch.Tensor,  # [T, Hq, D] (each token's heads contiguous)
        k_cache: torch.Tensor,  # uint8 [num_blocks, bs, Hkv, D + 4] rows of fmt
        v_cache: torch.Tensor,
        out: torch.Tensor,  # [T, Hq, D] of q's dtype: rows of the listed sequences are written
        q_starts: torch.Tensor,  # int32 [N]: first row of each sequence's new tokens
        q_lens: torch.Tensor,  # int32 [N]
        seq_lens: torch.Tensor,  # int32 [N]: new token i sits at seq_len - q_len + i
        block_tables: torch.Tensor,  # int32 [N, max_blocks]
        scale: float,
        window: int | None,  # token at p attends keys [max(0, p - window + 1), p]
        fmt: KVFormat,
    ) -> None:
        """Prefill and decode over quantized blocks, dequantized in the kernel; each row's bits
        depend on its q, position and keys only (batch-, chunk- and cache-invariant)."""
        torch.ops.radixcache.paged_attention_q(
            q,
            k_cache,
            v_cache,
            out,
            q_starts,
            q_lens,
            seq_lens,
            block_tables,
            scale,
            window,
            fmt.code,
        )

    @staticmethod
    def paged_decode(
        q: torch.Tensor,  # [N, Hq, D]: one new token per sequence
        k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D] (contiguous)
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,  # int32 [N, max_blocks]
        seq_lens: torch.Tensor,  # int32 [N]: keys [0, seq_len) of each sequence
        scale: float,
        shared: SharedDecodeGroups | None = None,
        window: int | None = None,  # keys [max(0, seq_len - window), seq_len) only; no shared
    ) -> torch.Tensor:  # [N, Hq, D]
        offsets, members, blocks = shared.tensors() if shared is not None else (None,) * 3
        return torch.ops.radixcache.paged_decode(
            q, k_cache, v_cache, block_tables, seq_lens, scale, offsets, members, blocks, window
        )
