"""Quantized KV blocks (--kv-cache-dtype, --tier-kv-dtype): accuracy against the unquantized KV,
capacity, load cost and decode speed, per format.

Run: python -m benchmarks.bench_kv_quant [--models default,gemma3-270m,tiny-llama,tiny-gemma]
Prints tables; writes benchmarks/results/kv_quant.json (the sections run replace theirs).

- accuracy: mean KL(unquantized || quantized) of next-token distributions and the perplexity
  change over windows of the license texts, each window prefilled over a pool of that format;
  greedy agreement: the share of prompts (license text) whose first --tokens greedy tokens from
  the engine (deterministic mode) equal the unquantized KV's.
- capacity: pool bytes per token, blocks per GiB, and the LRU hit rate of the Mooncake
  conversation trace with a device pool of a fixed memory budget (sized so that the model
  dtype's pool holds a share of the trace's blocks).
- load: a tier-stored block's bytes and what loading it into a pool costs (codec checks,
  dequantizing for a model-dtype pool, the copy).
- decode: bench_model's step workloads with the pool in each format.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from benchmarks import bench_index as bi
from benchmarks.bench_index import print_table
from benchmarks.kv_quant_accuracy import (
    agreement,
    distribution_row,
    greedy_tokens,
    license_text,
    text_windows,
)
from benchmarks.kv_quant_capacity import (
    TRACE_BLOCK,
    capacity_row,
    decode_rows,
    load_row,
    pool_bytes_per_token,
    trace_hit_rates,
)
from benchmarks.results_io import RESULTS, run_meta, write_results
from engine.dtypes import resolve_dtype, torch_dtype
from engine.kv.quant import KV_FORMATS, KVFormat
from engine.loader import load_model, load_tokenizer
from engine.loader.named_models import NAMED_MODELS
from engine.models.key_smoothing import smooth_keys

TRACE_SHARES = (0.05, 0.1, 0.2)  # of the trace's unique blocks, held by the model dtype's pool
DECODE_WORKLOADS = ["decode-16x1100-private", "decode-16x1100-shared", "prefill-16x64+1024-cached"]


def model_folder(name: str, scratch: Path) -> Path:
    """A named model (fetched once), or a tiny random-weight parity config built in `scratch`."""
    if name in NAMED_MODELS:
        return NAMED_MODELS[name](None, False)
    from tests.tiny_models import make_tiny_gemma, make_tiny_model

    if name == "tiny-llama":
        return make_tiny_model(scratch / name, "llama")
    if name == "tiny-gemma":
        return make_tiny_gemma(scratch / name, "d32-mixed")[1]
    raise ValueError(f"unknown model {name!r}")


def accuracy_rows(name: str, folder: Path, formats: list[KVFormat], args) -> list[dict]:
    dtype = torch_dtype(resolve_dtype("auto", "cpu"))
    ids = load_tokenizer(folder).encode(license_text(), add_special_tokens=False)
    model = load_model(folder, dtype, torch.device("cpu"), prepack=False)
    smooth_keys(model)  # as the engine serves a quantized KV (its unquantized logits: the same)
    model.prepack()
    vocab = model.config.vocab_size
    ids = [i for i in ids if i < vocab]  # tiny configs: a real tokenizer, a small vocabulary
    length = min(args.window_len, model.config.max_position_embeddings)
    windows = text_windows(ids, args.windows, length)
    prompts = text_windows(ids, args.prompts, args.prompt_len)
    reference = greedy_tokens(folder, prompts, "auto", args.tokens)
    rows = []
    for fmt in formats:
        row = {"model": name, "kv": fmt.name, "dtype": str(dtype).removeprefix("torch.")}
        row.update(distribution_row(model, windows, fmt))
        row.update(agreement(reference, greedy_tokens(folder, prompts, fmt.name, args.tokens)))
        rows.append(row)
        print(f"  ... {name} {fmt.name} done", flush=True)
    return rows


def capacity_rows(folder: Path, formats: list[KVFormat], trace: list[list[int]]) -> list[dict]:
    dtype = torch_dtype(resolve_dtype("auto", "cpu"))
    mc = load_model(folder, dtype, torch.device("cpu")).config
    base_per_token = pool_bytes_per_token(mc, dtype, None)
    budgets = [s * bi.unique_blocks(trace) * TRACE_BLOCK * base_per_token for s in TRACE_SHARES]
    rows = []
    for fmt in [None, *formats]:
        row = {"kv": fmt.name if fmt else str(dtype).removeprefix("torch.")}
        row.update(capacity_row(mc, dtype, fmt))
        rates = trace_hit_rates(trace, budgets, pool_bytes_per_token(mc, dtype, fmt))
        row.update({f"hit@{s:.0%}": r for s, r in zip(TRACE_SHARES, rates, strict=True)})
        row.update(load_row(mc, dtype, fmt, fmt))
        if fmt is not None:  # a model-dtype pool loading this format from a tier
            tier = load_row(mc, dtype, fmt, None)
            row.update({"tier_load_us_into_model_dtype": tier["load_us"]})
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models", default="SmolLM2-135M-Instruct,gemma3-270m,tiny-llama,tiny-gemma"
    )
    parser.add_argument("--formats", default=",".join(KV_FORMATS))
    parser.add_argument("--windows", type=int, default=8, help="text windows per model")
    parser.add_argument("--window-len", type=int, default=512)
    parser.add_argument("--prompts", type=int, default=32, help="greedy prompts per model")
    parser.add_argument("--prompt-len", type=int, default=96)
    parser.add_argument("--tokens", type=int, default=64, help="greedy tokens compared")
    parser.add_argument("--reps", type=int, default=5, help="decode step repetitions")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--sections", default="accuracy,capacity,decode")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    formats = [KV_FORMATS[f] for f in args.formats.split(",")]
    sections = set(args.sections.split(","))
    models = args.models.split(",")
    out: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        folders = {m: model_folder(m, Path(scratch)) for m in models}
        if "accuracy" in sections:
            out["accuracy"] = [
                r for m in models for r in accuracy_rows(m, folders[m], formats, args)
            ]
            print_table(
                "Accuracy against the unquantized KV (KL: mean over positions, nats; greedy: "
                f"share of {args.prompts} prompts whose first {args.tokens} tokens are identical)",
                ["model", "kv", "positions", "KL", "ppl", "ref ppl", "ppl %", "greedy", "common"],
                [
                    [r["model"], r["kv"], r["positions"], r["mean_kl_nats"], r["ppl"],
                     r["ref_ppl"], r["ppl_delta_pct"], r["greedy_identical"],
                     r["mean_common_tokens"]]
                    for r in out["accuracy"]
                ],
            )  # fmt: skip
        first = folders[models[0]]
        if "capacity" in sections:
            trace = bi.load_trace()
            out["capacity"] = capacity_rows(first, formats, trace)
            hits = [f"hit@{s:.0%}" for s in TRACE_SHARES]
            print_table(
                f"Capacity and loads ({models[0]}; hit@x: LRU hit rate of the Mooncake trace in the "
                "memory that holds x of its blocks in the model dtype; load: one stored block into "
                "a pool of its own format / into a model-dtype pool)",
                ["kv", "B/token", "blocks/GiB", *hits, "stored B", "load us", "GB/s", "into dtype us"],
                [
                    [r["kv"], r["bytes_per_token"], r["blocks_per_gib"], *[r[h] for h in hits],
                     r["stored_bytes"], r["load_us"], r["load_gbps"],
                     r.get("tier_load_us_into_model_dtype", "")]
                    for r in out["capacity"]
                ],
            )  # fmt: skip
        if "decode" in sections:
            dtype = torch_dtype(resolve_dtype("auto", "cpu"))
            model = load_model(first, dtype, torch.device("cpu"))  # prepacked, as served
            names = ["model dtype", *[f.name for f in formats]]
            out["decode"] = decode_rows(model, [None, *formats], DECODE_WORKLOADS, args.reps)
            print_table(
                f"Step time, ms ({models[0]}, {dtype}; bench_model's workloads, median of "
                f"{args.reps})",
                ["workload", *names],
                [[r["workload"], *[r[n] for n in names]] for r in out["decode"]],
            )
    rows, runs = earlier_sections(set(out))
    rows += [{"section": k, **r} for k, v in out.items() for r in v]
    run = run_meta()
    runs.update({k: {x: run[x] for x in ("command", "cpu", "finished_at")} for k in out})
    print(f"\nwrote {write_results('kv_quant', rows, section_runs=runs)}")


def earlier_sections(replaced: set[str]) -> tuple[list[dict], dict]:
    """The rows of the sections this run did not measure, and the runs that did, from the
    results file: one file holds each section's latest run."""
    path = RESULTS / "kv_quant.json"
    if not path.exists():
        return [], {}
    old = json.loads(path.read_text())
    rows = [r for r in old["rows"] if r["section"] not in replaced]
    runs = old["meta"].get("section_runs", {})
    return rows, {k: v for k, v in runs.items() if k not in replaced}


if __name__ == "__main__":
    main()
