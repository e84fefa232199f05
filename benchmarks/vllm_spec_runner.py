"""bench_spec's vLLM-CPU rows, run by vLLM's own interpreter (never imported by our code):

    VLLM_PYTHON benchmarks/vllm_spec_runner.py REQUEST.json RESULT.json

REQUEST: {"model", "dtype", "max_num_seqs", "prompts": [[ids]], "warm" (run them once untimed
first), "max_tokens", "ignore_eos", "num_speculative_tokens"}. RESULT: {"rows": [one per mode:
"vllm" (no speculation) and "vllm-ngram" (its n-gram proposer), with seconds, output_tokens,
tokens_per_s, or "error" when the build refuses]}."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from vllm_runner import patch_version_lookup  # noqa: E402


def run(request: dict, speculative: dict | None) -> dict:
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=request["model"],
        dtype=request["dtype"],
        enable_prefix_caching=True,
        max_model_len=4096,
        max_num_seqs=request["max_num_seqs"],
        enforce_eager=True,
        speculative_config=speculative,
    )
    params = SamplingParams(
        temperature=0, max_tokens=request["max_tokens"], ignore_eos=request["ignore_eos"]
    )
    prompts = [{"prompt_token_ids": p} for p in request["prompts"]]
    if request["warm"]:
        llm.generate(prompts, params, use_tqdm=False)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - t0
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    return {
        "seconds": round(seconds, 3),
        "output_tokens": tokens,
        "tokens_per_s": round(tokens / seconds, 2),
    }


def main() -> None:
    request = json.loads(Path(sys.argv[1]).read_text())
    patch_version_lookup()
    ngram = {
        "method": "ngram",
        "num_speculative_tokens": request["num_speculative_tokens"],
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 4,
    }
    rows = []
    for mode, spec in (("vllm", None), ("vllm-ngram", ngram)):
        try:
            rows.append({"mode": mode, **run(request, spec)})
        except Exception as e:  # noqa: BLE001 - the build's refusal is the result
            rows.append({"mode": mode, "error": f"{type(e).__name__}: {e}"})
    Path(sys.argv[2]).write_text(json.dumps({"rows": rows}))


if __name__ == "__main__":
    main()
