"""Engine throughput on the GSP-small and MT-small workloads of DESIGN.md.

Rows: our engine with the prefix cache on and off; with --vllm-python, vLLM's CPU build on the
same prompts and model folder (benchmarks/vllm_runner.py in that interpreter), run right after
our row of the same mode so both see the same machine; transformers `generate` one request at a
time (--hf-requests). --profile adds a time breakdown of our cache-on run per workload.

    GOMP_CPU_AFFINITY="0 1" python -m benchmarks.bench_engine --workloads gsp mt \\
        --threads 2 --vllm-python /work/venvs/vllm/bin/python --profile --cached-ttft 512 2048

GOMP_CPU_AFFINITY pins our two OpenMP threads to cores 0 and 1, as VLLM_CPU_OMP_THREADS_BIND=0-1
pins vLLM's (it must be set before the process starts). On a shared, oversubscribed machine
OMP_WAIT_POLICY=PASSIVE keeps waiting threads from spinning (there a decode-sized matmul on 2
threads measured 13x faster with it).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from benchmarks.results_io import write_results
from benchmarks.step_limit import ModelCosts
from benchmarks.workloads import (
    GSP_IDEAL_PREFILL,
    MAX_RUNNING,
    MT_IDEAL_PREFILL,
    OUT_TOKENS,
    WARMUP_SEED,
    gsp_prompts,
    mt_turns,
    random_tokens,
)
from engine.attention import make_attention_backend
from engine.config import EngineConfig
from engine.dtypes import resolve_dtype, torch_dtype
from engine.host_memory import HUGE_PAGES_ENV, request_huge_pages
from engine.kv.admin import Flush
from engine.llm_engine import LLMEngine
from engine.outputs import RequestResult
from engine.request import Prompt
from engine.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=OUT_TOKENS, ignore_eos=True)
KV_MEMORY = 2 << 30
VLLM_RUNNER = Path(__file__).parent / "vllm_runner.py"
VLLM_MAX_MODEL_LEN = 4096


@dataclass
class Row:
    workload: str
    system: str
    dtype: str
    total_s: float
    output_tokens: int
    ttft_s: list[float] = field(repr=False)
    prompt_tokens: int = 0
    prefill_computed: int | None = None
    ideal_prefill: int = 0
    step_overhead_ms: float | None = None
    steps: int | None = None
    decode_step_ms: float | None = None  # mean forward time of steps with only decode tokens
    cpu_s: float | None = (
        None  # CPU seconds of this process (all threads): robust to a busy machine
    )
    note: str = ""

    def summary(self) -> dict:
        t = sorted(self.ttft_s)
        out = {k: v for k, v in asdict(self).items() if k != "ttft_s"}
        out["output_tok_s"] = self.output_tokens / self.total_s if self.total_s else None
        if t:
            out["ttft_mean_s"] = statistics.fmean(t)
            out["ttft_p50_s"] = t[len(t) // 2]
            out["ttft_p99_s"] = t[min(len(t) - 1, round(0.99 * (len(t) - 1)))]
        if self.prefill_computed is not None and self.prompt_tokens:
            out["hit_rate"] = 1 - self.prefill_computed / self.prompt_tokens
        out["load_average_1m"] = round(os.getloadavg()[0], 2)
        return out


def run_batch(
    engine: LLMEngine, prompts: list[list[int]], tag: str, step_range: bool = False
) -> tuple[list, list[float]]:
    """Submits all prompts at once and steps to completion; returns outputs and TTFTs.
    step_range: wrap each step in a profiler range ("engine.step", read by step_profile)."""
    t0 = time.monotonic()
    ids = [f"{tag}-{i}" for i in range(len(prompts))]
    for rid, p in zip(ids, prompts, strict=True):
        engine.add_request(rid, Prompt(p), GREEDY)
    done = {rid: RequestResult(rid) for rid in ids}
    while engine.has_unfinished():
        if step_range:
            with torch.profiler.record_function("engine.step"):
                outs = engine.step()
        else:
            outs = engine.step()
        for out in outs:
            done[out.request_id].add(out)
    outs = [done[i] for i in ids]
    return outs, [o.metrics["first_token_time"] - t0 for o in outs]


def make_engine(
    model: Path, dtype: str, caching: bool, deterministic: bool = False, kv_dtype: str = "auto"
) -> LLMEngine:
    config = EngineConfig(
        deterministic=deterministic,
        model=str(model),
        device=args.device,
        dtype=dtype,
        kv_cache_dtype=kv_dtype,
        max_num_seqs=MAX_RUNNING,
        max_num_batched_tokens=args.batched_tokens,
        enable_prefix_caching=caching,
        kv_cache_memory=KV_MEMORY,
        num_threads=args.threads,
    )
    engine = LLMEngine(config)
    if args.attention != "auto":  # the one backend object the model (and so the runner) uses
        model = engine.model
        native = args.attention != "torch"
        prefill = args.attention == "native"  # wherever the kernel exists, even where slower
        model.attention = make_attention_backend(
            "cpu", native, model.dtype, model.config.head_dim, prefill=prefill
        )
    return engine


def run_workload(engine: LLMEngine, workload: str, vocab: int, step_range: bool = False):
    """(ttfts, prompt tokens, output tokens, ideal prefill) of one timed run of the workload."""
    if workload == "gsp":
        prompts = gsp_prompts(vocab)
        outs, ttfts = run_batch(engine, prompts, "gsp", step_range)
        out_tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        return ttfts, sum(map(len, prompts)), out_tokens, GSP_IDEAL_PREFILL
    mt = mt_turns(vocab)
    history = [list(mt.system) for _ in mt.turns[0]]
    ttfts, prompt_tokens, out_tokens = [], 0, 0
    for t, messages in enumerate(mt.turns):
        prompts = [h + m for h, m in zip(history, messages, strict=True)]
        outs, tt = run_batch(engine, prompts, f"mt{t}", step_range)
        ttfts += tt
        prompt_tokens += sum(map(len, prompts))
        out_tokens += sum(len(o.outputs[0].token_ids) for o in outs)
        history = [p + o.outputs[0].token_ids for p, o in zip(prompts, outs, strict=True)]
    return ttfts, prompt_tokens, out_tokens, MT_IDEAL_PREFILL


def warm(engine: LLMEngine, vocab: int) -> None:
    run_batch(engine, [random_tokens(random.Random(WARMUP_SEED), 64, vocab)], "warm")
    engine.admin(Flush())


def bench_engine(
    model: Path,
    dtype: str,
    caching: bool,
    workload: str,
    vocab: int,
    deterministic: bool = False,
    kv_dtype: str = "auto",
) -> Row:
    engine = make_engine(model, dtype, caching, deterministic, kv_dtype)
    warm(engine, vocab)
    before = engine.stats.snapshot()
    t0, cpu0 = time.perf_counter(), time.process_time()
    ttfts, prompt_tokens, out_tokens, ideal = run_workload(engine, workload, vocab)
    total, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    after = engine.stats.snapshot()
    steps = after["num_steps"] - before["num_steps"]
    overhead = after["python_overhead"] - before["python_overhead"]
    recent = list(engine.stats.recent)[-steps:]  # the last 256 steps at most
    decode = [s.forward_time for s in recent if s.num_prefill_tokens == 0]
    engine.close()
    return Row(
        workload,
        f"radixcache cache-{'on' if caching else 'off'}{' determ.' if deterministic else ''}"
        + (f" kv {kv_dtype}" if kv_dtype != "auto" else ""),
        dtype,
        total,
        out_tokens,
        ttfts,
        prompt_tokens,
        after["prefill_tokens"] - before["prefill_tokens"],
        ideal,
        1000 * overhead / max(1, steps),
        steps,
        1000 * statistics.fmean(decode) if decode else None,
        cpu,
    )


def bench_cached_ttft(model: Path, dtype: str, vocab: int, lengths: list[int]) -> list[dict]:
    """A repeated prompt (every block but the last cached) against one decode step of the same
    request: TTFT of the repeat, and its time per output token over 16 more tokens (batch 1)."""
    engine = make_engine(model, dtype, True)
    warm(engine, vocab)
    params = SamplingParams(temperature=0, max_tokens=17, ignore_eos=True)
    rows = []
    for length in lengths:
        prompt = random_tokens(random.Random(length), length, vocab)
        runs = []
        for tag in ("cold", "repeat-1", "repeat-2", "repeat-3"):
            t0 = time.monotonic()
            engine.add_request(f"ttft-{length}-{tag}", Prompt(prompt), params)
            result = RequestResult(f"ttft-{length}-{tag}")
            while engine.has_unfinished():
                for out in engine.step():
                    result.add(out)
            first, last = result.metrics["first_token_time"], time.monotonic()
            runs.append((first - t0, (last - first) / (params.max_tokens - 1)))
        repeats = runs[1:]
        ttft = statistics.median(t for t, _ in repeats)
        tpot = statistics.median(d for _, d in repeats)
        rows.append(
            {
                "prompt_tokens": length,
                "cold_ttft_ms": 1000 * runs[0][0],
                "cached_ttft_ms": 1000 * ttft,
                "decode_step_ms": 1000 * tpot,
                "ttft_over_step": ttft / tpot,
            }
        )
    engine.close()
    return rows


def print_cached_ttft(rows: list[dict]) -> None:
    print("\nfully cached TTFT (the same prompt again, alone) vs one decode step of that request")
    print(
        f"{'prompt':>7} {'cold TTFT ms':>13} {'cached TTFT ms':>15} {'decode step ms':>15} {'ratio':>6}"
    )
    for r in rows:
        print(
            f"{r['prompt_tokens']:>7} {r['cold_ttft_ms']:>13.1f} {r['cached_ttft_ms']:>15.1f} "
            f"{r['decode_step_ms']:>15.1f} {r['ttft_over_step']:>6.2f}"
        )


def bench_vllm(
    model: Path, dtype: str, caching: bool, workload: str, vocab: int, kv_dtype: str = "auto"
) -> Row:
    """The same workload in vLLM's CPU build, in its own interpreter (args.vllm_python)."""
    request: dict = {
        "model": str(model),
        "dtype": dtype,
        "kv_cache_dtype": kv_dtype,
        "caching": caching,
        "max_num_seqs": MAX_RUNNING,
        "max_model_len": VLLM_MAX_MODEL_LEN,
        "out_tokens": OUT_TOKENS,
        "warmup": random_tokens(random.Random(WARMUP_SEED), 64, vocab),
    }
    if workload == "gsp":
        request["prompts"] = gsp_prompts(vocab)
    else:
        mt = mt_turns(vocab)
        request["mt"] = {"system": mt.system, "turns": mt.turns}
    # vLLM binds its OpenMP threads itself (PEERS.md); our own OpenMP settings stay with us
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_", "KMP_"))}
    env.pop(HUGE_PAGES_ENV, None)  # vLLM runs with its own defaults
    env.update(VLLM_CPU_KVCACHE_SPACE="4", VLLM_CPU_OMP_THREADS_BIND="0-1")
    with tempfile.TemporaryDirectory() as tmp:
        req, res = Path(tmp) / "request.json", Path(tmp) / "result.json"
        req.write_text(json.dumps(request))
        cmd = [args.vllm_python, str(VLLM_RUNNER), str(req), str(res)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tmp)
        if proc.returncode != 0:
            raise RuntimeError(f"vLLM runner failed:\n{proc.stderr[-3000:]}")
        result = json.loads(res.read_text())
    ideal = GSP_IDEAL_PREFILL if workload == "gsp" else MT_IDEAL_PREFILL
    return Row(
        workload,
        f"vLLM-CPU {result['version']} cache-{'on' if caching else 'off'}"
        + (f" kv {kv_dtype}" if kv_dtype != "auto" else ""),
        dtype,
        result["total_s"],
        result["output_tokens"],
        result["ttft_s"],
        result["prompt_tokens"],
        ideal_prefill=ideal,
        note="enforce_eager, max_model_len 4096, KV 4 GiB, OMP bound to cores 0-1",
    )


def bench_transformers(model: Path, dtype: str, workload: str, vocab: int, limit: int) -> Row:
    """transformers generate, one request at a time (limit requests; the total is scaled)."""
    import transformers
    from transformers.generation.streamers import BaseStreamer

    class FirstToken(BaseStreamer):
        def __init__(self) -> None:
            self.calls, self.first = 0, None

        def put(self, value) -> None:  # noqa: ANN001
            self.calls += 1
            if self.calls == 2:
                self.first = time.monotonic()

        def end(self) -> None:
            pass

    hf = transformers.AutoModelForCausalLM.from_pretrained(model, dtype=torch_dtype(dtype))
    hf.eval()
    service: list[float] = []  # seconds per request
    first: list[float] = []  # seconds from a request's start to its first token

    def run(prompt: list[int]) -> list[int]:
        streamer, start = FirstToken(), time.monotonic()
        with torch.inference_mode():
            out = hf.generate(
                torch.tensor([prompt]),
                max_new_tokens=OUT_TOKENS,
                min_new_tokens=OUT_TOKENS,
                do_sample=False,
                streamer=streamer,
                pad_token_id=0,
            )
        service.append(time.monotonic() - start)
        first.append(streamer.first - start)
        return out[0, len(prompt) :].tolist()

    out_tokens = 0
    if workload == "gsp":
        total, wave = 64, 64  # all 64 submitted at once
        for p in gsp_prompts(vocab)[:limit]:
            out_tokens += len(run(p))
    else:  # whole conversations (each with its own answers) for limit // 4 users
        total, wave = 32, 8  # each turn: 8 requests submitted together
        mt = mt_turns(vocab)
        for u in range(max(1, limit // 4)):
            history = list(mt.system)
            for t in range(4):
                prompt = history + mt.turns[t][u]
                answer = run(prompt)
                out_tokens += len(answer)
                history = prompt + answer
    scale = total / len(service)
    per_request, to_first = statistics.fmean(service), statistics.fmean(first)
    # one at a time: the i-th request of a wave starts when the one before it ends
    ttfts = [(i % wave) * per_request + to_first for i in range(total)]
    note = f"measured {len(service)} of {total} requests; total and TTFT scaled from them"
    return Row(
        workload,
        "transformers generate (1 at a time)",
        dtype,
        sum(service) * scale,
        int(out_tokens * scale),
        ttfts,
        note=note if scale > 1 else "",
    )


def profile_engine(model: Path, dtype: str, workload: str, vocab: int) -> dict:
    """One more cache-on run under torch.profiler: the time breakdown, achieved GFLOP/s and GB/s
    (the profiler's own cost inflates the Python figures; the timed rows carry no profiler)."""
    from benchmarks.bench_model import measure_peaks
    from benchmarks.step_profile import breakdown, profiler_event_cost

    engine = make_engine(model, dtype, True)
    warm(engine, vocab)
    event_cost = profiler_event_cost()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        # the clocks start once the profiler has: its start-up (seconds on a CPU-only build)
        # is no part of the run, and outside every step range it would read as time between
        # steps; they stop before its post-processing
        cpu0, t0 = time.process_time(), time.perf_counter()
        run_workload(engine, workload, vocab, step_range=True)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    b = breakdown(prof.events(), wall, event_cost)
    costs = ModelCosts.of(engine.model.config, engine.model.dtype)
    engine.close()
    peaks = measure_peaks()
    figures = {}
    for kind in ("prefill", "mixed", "decode"):
        t = b.seconds.get(f"matmul ({kind})", 0.0)
        # decode steps sample every row: their head matmul counts too
        params = costs.linear_params + (costs.head_params if kind == "decode" else 0)
        if t and b.tokens[kind]:
            figures[f"matmul GFLOP/s ({kind})"] = 2 * params * b.tokens[kind] / t / 1e9
    decode_s = sum(v for k, v in b.seconds.items() if "decode" in k) or None
    if b.steps["decode"] and b.seconds.get("matmul (decode)"):
        weight_bytes = costs.weight_bytes * b.steps["decode"]
        figures["decode matmul GB/s (weights)"] = weight_bytes / b.seconds["matmul (decode)"] / 1e9
    decode_kernel = b.seconds.get("attention: decode kernel (decode)")  # decode-only steps
    if decode_kernel:  # whose keys the range names give
        figures["decode attention GB/s (KV read)"] = (
            b.keys["decode"] * costs.kv_bytes_per_key / decode_kernel / 1e9
        )
    return {
        "workload": workload,
        "dtype": dtype,
        "wall_s": wall,
        "cpu_utilisation": cpu / (wall * torch.get_num_threads()),
        "seconds": dict(b.seconds),
        "steps": dict(b.steps),
        "tokens": dict(b.tokens),
        "python_us_per_layer": 1e6
        * (
            b.seconds["python: forward (plan, layer loop)"]
            + b.seconds["python: per layer (attention)"]
        )
        / max(1, b.layers_seen),
        "figures": figures,
        "profiler_us_per_op": 1e6 * event_cost,
        "peaks": peaks,
        "decode_attention_s": decode_s,
    }


def print_profile(p: dict) -> None:
    print(f"\ntime breakdown: {p['workload']} {p['dtype']} cache-on, under the profiler")
    print(
        f"  wall {p['wall_s']:.2f} s; cores busy {100 * p['cpu_utilisation']:.0f}% of "
        f"{torch.get_num_threads()} threads; steps {p['steps']}; new tokens {p['tokens']}"
    )
    for name, sec in sorted(p["seconds"].items(), key=lambda kv: -kv[1]):
        print(f"  {name:<48} {sec:8.2f} s {100 * sec / p['wall_s']:5.1f}%")
    print(
        f"  python per layer per step: {p['python_us_per_layer']:.0f} us (the profiler's cost, "
        f"{p['profiler_us_per_op']:.1f} us per recorded op, taken out)"
    )
    for name, value in p["figures"].items():
        print(f"  {name:<48} {value:8.1f}")
    pk = p["peaks"]
    print(
        f"  this CPU: bf16 matmul peak {pk['bf16_matmul_gflops']} GFLOP/s, "
        f"memory {pk['memory_read_gbps']} GB/s read ({pk['memory_gbps']} GB/s copy)"
    )


def print_table(rows: list[dict]) -> None:
    head = (
        f"{'workload':8} {'system':30} {'dtype':8} {'total s':>8} {'vs vLLM':>7} {'out tok/s':>9} "
        f"{'TTFT mean/p50/p99 s':>19} {'decode ms':>9} {'prefill computed/ideal':>22} {'hit':>6} "
        f"{'py ms/step':>10} {'cpu s':>7}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        ttft = "-"
        if r.get("ttft_mean_s") is not None:
            ttft = f"{r['ttft_mean_s']:.2f}/{r['ttft_p50_s']:.2f}/{r['ttft_p99_s']:.2f}"
        pre = f"{r['prefill_computed']}/{r['ideal_prefill']}" if r.get("prefill_computed") else "-"
        hit = f"{100 * r['hit_rate']:.1f}%" if r.get("hit_rate") is not None else "-"
        ovh = f"{r['step_overhead_ms']:.2f}" if r.get("step_overhead_ms") is not None else "-"
        tps = f"{r['output_tok_s']:.1f}" if r.get("output_tok_s") else "-"
        dec = f"{r['decode_step_ms']:.1f}" if r.get("decode_step_ms") else "-"
        ratio = f"{r['ratio_vs_vllm']:.2f}" if r.get("ratio_vs_vllm") else "-"
        cpu = f"{r['cpu_s']:.1f}" if r.get("cpu_s") else "-"
        print(
            f"{r['workload']:8} {r['system']:30} {r['dtype']:8} {r['total_s']:8.2f} {ratio:>7} "
            f"{tps:>9} {ttft:>19} {dec:>9} {pre:>22} {hit:>6} {ovh:>10} {cpu:>7}"
            + (f"  ({r['note']})" if r["note"] else "")
        )


def main() -> None:
    request_huge_pages()  # as the server runs (engine/host_memory.py)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"load average {os.getloadavg()}, torch threads {torch.get_num_threads()}")
    from engine.loader import ensure_default_model, load_tokenizer

    model = Path(args.model) if args.model else ensure_default_model()
    vocab = load_tokenizer(model).vocab_size
    args.dtypes = [resolve_dtype(d, args.device) for d in args.dtypes]
    rows: list[dict] = []
    profiles: list[dict] = []
    cached_ttft: dict[str, list[dict]] = {}
    for dtype in args.dtypes if args.cached_ttft else []:
        cached_ttft[dtype] = bench_cached_ttft(model, dtype, vocab, args.cached_ttft)
        print_cached_ttft(cached_ttft[dtype])
    for workload in args.workloads:
        for dtype in args.dtypes:
            for caching in (mode == "on" for mode in args.modes):
                for _rep in range(args.repeat):
                    ours_rows = []
                    for kv_dtype in args.kv_dtypes:
                        row = bench_engine(model, dtype, caching, workload, vocab, False, kv_dtype)
                        ours_rows.append(row.summary())
                        rows.append(ours_rows[-1])
                        print_table(rows[-1:])
                    ours = ours_rows[0]
                    if args.deterministic:
                        det = bench_engine(model, dtype, caching, workload, vocab, True)
                        rows.append(det.summary())
                        rows[-1]["cost_vs_default"] = det.total_s / ours["total_s"]
                        rows[-1]["note"] = f"{det.total_s / ours['total_s']:.2f}x the default row"
                        print_table(rows[-1:])
                    for i, kv_dtype in enumerate(args.vllm_kv_dtypes if args.vllm_python else []):
                        peer = bench_vllm(model, dtype, caching, workload, vocab, kv_dtype)
                        rows.append(peer.summary())
                        print_table(rows[-1:])
                        if i == 0:  # each of our rows against the peer's default KV
                            for r in ours_rows:
                                r["ratio_vs_vllm"] = r["total_s"] / rows[-1]["total_s"]
            if args.hf_requests > 0:
                row = bench_transformers(model, dtype, workload, vocab, args.hf_requests)
                rows.append(row.summary())
                print_table(rows[-1:])
            if args.profile:
                profiles.append(profile_engine(model, dtype, workload, vocab))
                print_profile(profiles[-1])
    print()
    print_table(rows)
    for p in profiles:
        print_profile(p)
    for rows_of_dtype in cached_ttft.values():
        print_cached_ttft(rows_of_dtype)
    out = write_results(
        args.out,
        rows,
        batched_tokens=args.batched_tokens,
        attention=args.attention,
        model=str(model),
        profiles=profiles,
        cached_ttft=cached_ttft,
        settings_that_differ=(
            "vLLM: enforce_eager, max_model_len 4096, VLLM_CPU_KVCACHE_SPACE=4 GiB, "
            "VLLM_CPU_OMP_THREADS_BIND=0-1 (its scheduler/front-end processes share the cores); "
            f"ours: {KV_MEMORY >> 30} GiB KV, token budget {args.batched_tokens}, "
            f"{args.threads or torch.get_num_threads()} torch threads; both: max 16 running, "
            "prefix caching per row, greedy, 32 tokens, EOS ignored, same model folder"
        ),
    )
    print(f"\nwrote {out}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workloads", nargs="+", default=["gsp", "mt"], choices=["gsp", "mt"])
    parser.add_argument(
        "--dtypes", nargs="+", default=["auto"], help="auto: what `radixcache serve` picks here"
    )
    parser.add_argument("--hf-requests", type=int, default=0, help="requests run by transformers")
    parser.add_argument("--modes", nargs="*", default=["on", "off"], choices=["on", "off"])
    parser.add_argument("--batched-tokens", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    parser.add_argument("--device", default="cpu", help="torch device of our rows (cpu, cuda)")
    parser.add_argument("--model", default=None, help="HF folder (default: the default model)")
    parser.add_argument("--vllm-python", default=None, help="vLLM's interpreter: adds its rows")
    parser.add_argument(
        "--kv-dtypes", nargs="+", default=["auto"], help="our rows' --kv-cache-dtype, each a row"
    )
    parser.add_argument(
        "--vllm-kv-dtypes",
        nargs="+",
        default=["auto"],
        help="vLLM's kv_cache_dtype, each a row (fp8: where its CPU build takes it)",
    )
    parser.add_argument("--profile", action="store_true", help="time breakdown per workload")
    parser.add_argument(
        "--deterministic",
        action="store_true",
        help="also run each of our rows with EngineConfig.deterministic (its cost)",
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs of each row (alternated)")
    parser.add_argument(
        "--attention",
        default="auto",
        choices=["auto", "native", "native-decode", "torch"],
        help="CPU attention: the default choice (auto), native prefill + decode kernels, "
        "native decode with torch prefill, or pure torch",
    )
    parser.add_argument(
        "--cached-ttft",
        nargs="*",
        type=int,
        default=[],
        metavar="TOKENS",
        help="also time a fully cached repeat of prompts of these lengths against a decode step",
    )
    parser.add_argument("--out", default="engine", help="results/<out>.json")
    args = parser.parse_args()
    main()
