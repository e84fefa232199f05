"""The triton kernels over quantized KV pools, run by triton's CPU interpreter against the torch
reference (tests/engine/triton_quant_checks.py): the quantized store and the fused rope store
bit for bit, attention per format, a tiny model's forward and decode graphs over a packed pool.

As in test_attention_triton.py, TRITON_INTERPRET=1 must be set before triton is first imported,
so the checks run in one subprocess started with it set; each check is reported as its own test.
"""

from __future__ import annotations

from functools import partial

import pytest

from .triton_interpreter import report, run_interpreted
from .triton_quant_checks import QUANT_CHECKS


def run_all() -> None:
    """Entry point of the subprocess (TRITON_INTERPRET=1): one JSON line of results."""
    from triton.runtime.interpreter import InterpretedFunction

    from engine.attention import triton_kernels

    assert isinstance(triton_kernels._store_kv_quantized_kernel, InterpretedFunction)
    report({name: partial(check, "cpu") for name, check in QUANT_CHECKS.items()})


@pytest.fixture(scope="module")
def interpreted():
    return run_interpreted("tests.engine.test_attention_triton_quant")


@pytest.mark.parametrize("name", list(QUANT_CHECKS))
def test_quantized_triton_kernel_in_interpreter(interpreted, name):
    assert interpreted[name] == "ok", interpreted[name]
