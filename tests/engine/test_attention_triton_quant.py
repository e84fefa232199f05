"""The triton kernels over quantized KV pools, run by triton's CPU interpreter against the torch
reference (tests/engine/triton_quant_checks.py): the quantized store and the fused rope store
bit for bit, attention per format, a tiny model's forward and decode graphs over a packed pool.

As in test_attention_triton.py, TRITON_INTERPRET=1 must be set before triton is first imported,
so the checks run in one subprocess started with it set; each check is reported as its own test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

from .triton_quant_checks import QUANT_CHECKS

ROOT = Path(__file__).resolve().parents[2]


def run_all() -> None:
    """Entry point of the subprocess (TRITON_INTERPRET=1): one JSON line of results."""
    from triton.runtime.interpreter import InterpretedFunction

    from engine.attention import triton_kernels

    assert isinstance(triton_kernels._store_kv_quantized_kernel, InterpretedFunction)
    results = {}
    for name, check in QUANT_CHECKS.items():
        try:
            check("cpu")
            results[name] = "ok"
        except Exception:  # reported by the test of that name
            results[name] = traceback.format_exc()
    print(json.dumps(results))


@pytest.fixture(scope="module")
def interpreted():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    code = "from tests.engine.test_attention_triton_quant import run_all; run_all()"
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", list(QUANT_CHECKS))
def test_quantized_triton_kernel_in_interpreter(interpreted, name):
    assert interpreted[name] == "ok", interpreted[name]
