"""One writer for benchmark results: rows plus the conditions they were measured under."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

from engine.dtypes import cpu_flags

RESULTS = Path(__file__).parent / "results"


def cpu_kind() -> str:
    """The CPU model and the vector features that decide our kernels (AMX, AVX512-BF16, AVX2)."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.partition(":")[2].strip()
                break
    except OSError:
        pass
    features = [f for f in ("amx_bf16", "avx512_bf16", "avx512f", "avx2") if f in cpu_flags()]
    return f"{model} ({', '.join(features) or 'no AVX2'})"


def run_meta(**extra: object) -> dict:
    """The command, threads, CPU and machine load of this run (the CPUs may be shared)."""
    return {
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "cpu": cpu_kind(),
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "openmp_env": {k: v for k, v in os.environ.items() if k.startswith(("OMP_", "GOMP_"))},
        "huge_pages_env": os.environ.get("THP_MEM_ALLOC_ENABLE"),  # engine/host_memory.py
        "torch": torch.__version__,
        "python": platform.python_version(),
        "finished_at": time.strftime("%Y-%m-%d %H:%M:%S"),
        **({"cuda_device": torch.cuda.get_device_name(0)} if torch.cuda.is_available() else {}),
        **extra,
    }


def write_results(name: str, rows: list[dict], **extra: object) -> Path:
    """benchmarks/results/<name>.json = {"meta": run_meta(**extra), "rows": rows}."""
    path = RESULTS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"meta": run_meta(**extra), "rows": rows}, indent=2) + "\n")
    return path
