"""dtype="auto": the fastest dtype this device computes natively, resolved once by the factory."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.config import EngineConfig
from engine.dtypes import DTYPES, cpu_flags, resolve_dtype


def test_auto_picks_bfloat16_only_where_the_cpu_has_bf16_dot_products():
    assert resolve_dtype("auto", "cpu", frozenset({"avx2", "avx512f", "avx512_bf16"})) == "bfloat16"
    assert resolve_dtype("auto", "cpu", frozenset({"avx2", "amx_tile", "amx_bf16"})) == "bfloat16"
    assert resolve_dtype("auto", "cpu", frozenset({"avx2", "fma", "avx512f"})) == "float32"
    assert resolve_dtype("auto", "cpu", frozenset()) == "float32"


def test_an_explicit_dtype_is_kept_and_a_bad_one_is_refused():
    assert resolve_dtype("bfloat16", "cpu", frozenset()) == "bfloat16"
    assert resolve_dtype("float16", "cpu", frozenset({"avx512_bf16"})) == "float16"
    with pytest.raises(ValueError, match="dtype must be one of"):
        resolve_dtype("int8", "cpu")
    with pytest.raises(ValueError, match="auto"):
        EngineConfig(dtype="bf16")
    assert EngineConfig().dtype == "auto"


def test_cpu_flags_read_from_cpuinfo(tmp_path: Path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512_bf16\nbugs\t\t: none\n")
    assert cpu_flags(info) == {"fpu", "avx2", "avx512_bf16"}
    assert cpu_flags(tmp_path / "missing") == frozenset()
    assert "fpu" in cpu_flags()  # this machine's own list is read


def test_the_engine_runs_in_the_resolved_dtype(make_llm):
    llm = make_llm(dtype="auto", num_blocks=16)
    want = resolve_dtype("auto", "cpu")
    assert llm.engine.namespace.kv_dtype == want
    assert llm.engine.model.embed_tokens.dtype == DTYPES[want]
