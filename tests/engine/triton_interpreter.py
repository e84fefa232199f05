"""Triton checks under the CPU interpreter: TRITON_INTERPRET=1 must be set before triton is first
imported, so a test module's checks run in one subprocess started with it set, which prints one
JSON line of results (each check's "ok" or traceback) for the tests to read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def report(checks: dict[str, Callable[[], None]]) -> None:
    """Runs every check (in the subprocess) and prints their results as one JSON line."""
    results = {}
    for name, check in checks.items():
        try:
            check()
            results[name] = "ok"
        except Exception:  # reported by the test of that name
            results[name] = traceback.format_exc()
    print(json.dumps(results))


def run_interpreted(module: str) -> dict[str, str]:
    """`module`.run_all() in a subprocess with TRITON_INTERPRET=1: the results it reported."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    code = f"from {module} import run_all; run_all()"
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
