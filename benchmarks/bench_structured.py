"""Constrained decoding: mask fill and apply, grammar compiles against a cached prompt's TTFT, the
decode step with 0/50/100% of 16 rows constrained, and (--compare-libraries) llguidance beside
xgrammar on the default model's 49,152-token vocabulary.

    python -m benchmarks.bench_structured --threads 2 --compare-libraries
    python -m benchmarks.bench_structured --section fill apply   # some sections alone

Prints tables, writes benchmarks/results/structured.json. The engine uses llguidance only;
xgrammar is imported inside the comparison and skipped with a note when it is not installed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.results_io import write_results
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.request import Prompt
from engine.sampler import apply_token_masks
from engine.sampling_params import SamplingParams
from engine.structured.compiler import GrammarCompiler
from engine.structured.constraints import (
    Choice,
    Constraint,
    JsonObject,
    Regex,
    TaggedJson,
    canonical_json,
)
from engine.structured.masks import MaskFiller, TokenMasks
from engine.structured.matcher import SequenceMatcher

SECTIONS = ("fill", "apply", "compile", "decode")
CHOICES = ("yes", "no", "maybe", "positive", "negative", "neutral")
PHONE = r"\(\d{3}\) \d{3}-\d{4}"
BEGIN, END = "<tool_call>\n", "\n</tool_call>"


# --- workloads: tools, their call schema, realistic outputs ---
def make_tools(n: int) -> list[dict[str, Any]]:
    kinds = ["string", "integer", "boolean", "number"]
    tools = []
    for i in range(n):
        props: dict[str, Any] = {
            f"arg{j}": {"type": kinds[(i + j) % 4], "description": f"argument {j} of tool {i}"}
            for j in range(3)
        }
        props["mode"] = {"enum": ["fast", "slow", "auto"]}
        tools.append(
            {
                "type": "function",
                "function": {
                    "name": f"tool_{i}_{'abcdefgh'[i % 8]}",
                    "description": f"Tool number {i}: does thing {i} to the inputs it is given.",
                    "parameters": {
                        "type": "object",
                        "properties": props,
                        "required": ["arg0", "mode"],
                    },
                },
            }
        )
    return tools


def call_schema(tools: list[dict[str, Any]]) -> dict[str, Any]:
    calls = [
        {
            "type": "object",
            "properties": {
                "name": {"const": t["function"]["name"]},
                "arguments": t["function"]["parameters"],
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for t in tools
    ]
    return calls[0] if len(calls) == 1 else {"anyOf": calls}


def tool_constraint(n: int) -> TaggedJson:
    return TaggedJson(BEGIN, canonical_json(call_schema(make_tools(n))), END)


def call_text(tools: list[dict[str, Any]], i: int) -> str:
    name = tools[i]["function"]["name"]
    args = {"arg0": "Paris, France" if i % 4 == 0 else 42, "mode": "auto"}
    if i % 4 == 1:
        args["arg0"] = 17
    elif i % 4 == 2:
        args["arg0"] = True
    elif i % 4 == 3:
        args["arg0"] = 3.25
    return json.dumps({"name": name, "arguments": args}, separators=(",", ":"))


OBJECT_TEXT = json.dumps(
    {"name": "Ada Lovelace", "born": 1815, "fields": ["mathematics", "computing"], "ok": True},
    separators=(",", ":"),
)


def cases(tools: list[dict[str, Any]]) -> dict[str, tuple[Constraint, str]]:
    """kind -> (constraint, a valid output to walk)."""
    return {
        "tool_call(20 tools)": (
            TaggedJson(BEGIN, canonical_json(call_schema(tools)), END),
            BEGIN + call_text(tools, 13) + END,
        ),
        "json_object": (JsonObject(), OBJECT_TEXT),
        "regex(phone)": (Regex(PHONE), "(555) 123-4567"),
        "choice(6)": (Choice(CHOICES), "negative"),
    }


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def us(seconds: float) -> float:
    return round(seconds * 1e6, 1)


# --- sections ---
def section_fill(grammars: GrammarCompiler, tokenizer: Any, repeats: int) -> list[dict]:
    """µs to fill one row's mask, per step of a valid output (llguidance, as the engine does)."""
    filler = MaskFiller(grammars.vocab_size)
    rows = []
    for kind, (constraint, text) in cases(make_tools(20)).items():
        tokens = tokenizer.encode(text, add_special_tokens=False)
        times: list[float] = []
        for _ in range(repeats):
            matcher = SequenceMatcher.start(grammars.compile(constraint))
            for token in tokens:
                t0 = time.perf_counter()
                filler.fill([0], [matcher])
                times.append(time.perf_counter() - t0)
                assert matcher.accept(token), (kind, token)
        rows.append(
            {
                "section": "fill",
                "kind": kind,
                "steps": len(times),
                "p50_us": us(pct(times, 50)),
                "p99_us": us(pct(times, 99)),
                "p99.9_us": us(pct(times, 99.9)),
            }
        )
    return rows


def section_apply(grammars: GrammarCompiler, tokenizer: Any, repeats: int) -> list[dict]:
    """µs to apply masks to 1/8/16 of 16 logits rows, and to fill 16 rows in one batched call."""
    vocab = grammars.vocab_size
    constraint, text = cases(make_tools(20))["json_object"]
    matchers = [SequenceMatcher.start(grammars.compile(constraint)) for _ in range(16)]
    for m in matchers:
        for token in tokenizer.encode(text[:20], add_special_tokens=False):
            m.accept(token)
    filler = MaskFiller(vocab)
    logits = torch.randn(16, vocab)
    rows = []
    for n in (1, 8, 16):
        masks = filler.fill(list(range(n)), matchers[:n])
        apply_times, fill_times = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            apply_token_masks(logits, TokenMasks(masks.rows, masks.bitmask))
            apply_times.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            filler.fill(list(range(n)), matchers[:n])
            fill_times.append(time.perf_counter() - t0)
        rows.append(
            {
                "section": "apply",
                "rows": n,
                "apply_p50_us": us(pct(apply_times, 50)),
                "apply_p99_us": us(pct(apply_times, 99)),
                "batched_fill_p50_us": us(pct(fill_times, 50)),
                "batched_fill_p99_us": us(pct(fill_times, 99)),
            }
        )
    return rows


def system_prompt(tools: list[dict[str, Any]]) -> str:
    blocks = "\n".join(json.dumps(t, separators=(", ", ": ")) for t in tools)
    return (
        "You are a function calling AI model. You are provided with function signatures within "
        f"<tools></tools> XML tags.\n<tools>\n{blocks}\n</tools>\nFor each function call return "
        f"a json object with function name and arguments within {BEGIN.strip()} tags."
    )


def section_compile(engine: LLMEngine, repeats: int) -> list[dict]:
    """Compile cold (a fresh cache) and cached for 5/20/50 tools, beside the TTFT of the same
    tools' prompt when it is cached (the offline engine, one token out)."""
    rows = []
    tok = engine.tokenizer
    for n in (5, 20, 50):
        constraint = tool_constraint(n)
        cold, cached = [], []
        for _ in range(repeats):
            fresh = GrammarCompiler(
                tok.backend.to_str(), engine.vocab_size, list(tok.eos_token_ids)
            )
            _ = fresh.tokenizer  # built once per engine, not per grammar
            t0 = time.perf_counter()
            fresh.compile(constraint)
            cold.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            fresh.compile(constraint)
            cached.append(time.perf_counter() - t0)
        messages = [
            {"role": "system", "content": system_prompt(make_tools(n))},
            {"role": "user", "content": "Call one of the tools."},
        ]
        prompt = tok.apply_chat_template(messages)
        ttft = cached_ttft(engine, prompt)
        rows.append(
            {
                "section": "compile",
                "tools": n,
                "prompt_tokens": len(prompt),
                "cold_ms": round(statistics.median(cold) * 1e3, 2),
                "cached_us": us(statistics.median(cached)),
                "cached_prompt_ttft_ms": round(ttft * 1e3, 1),
            }
        )
    return rows


def cached_ttft(engine: LLMEngine, prompt: list[int], repeats: int = 3) -> float:
    params = SamplingParams(max_tokens=1, temperature=0.0)
    run_to_end(engine, prompt, params, "warm")
    times = []
    for i in range(repeats):
        t0 = time.perf_counter()
        run_to_end(engine, prompt, params, f"ttft-{i}")
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run_to_end(engine: LLMEngine, prompt: list[int], params: SamplingParams, rid: str) -> None:
    engine.add_request(rid, Prompt(prompt), params)
    while engine.has_unfinished():
        engine.step()


DECODE_SCHEMA = canonical_json(
    {  # realistic JSON that cannot end within the measured steps
        "type": "object",
        "properties": {
            "notes": {
                "type": "array",
                "items": {"type": "string", "maxLength": 40},
                "minItems": 64,
            }
        },
        "required": ["notes"],
    }
)


def section_decode(engine: LLMEngine, steps: int, rounds: int) -> list[dict]:
    """Median decode-step time of 16 rows with 0/8/16 constrained (interleaved rounds), and
    the median time in mask fill + sampling, which is what the constraints add to."""
    from engine.structured.constraints import JsonSchema

    tok = engine.tokenizer
    prompts = [
        tok.apply_chat_template([{"role": "user", "content": f"List {i + 3} facts as JSON."}])
        for i in range(16)
    ]
    per: dict[int, list[float]] = {0: [], 8: [], 16: []}
    sample: dict[int, list[float]] = {0: [], 8: [], 16: []}
    cpu: dict[int, list[float]] = {0: [], 8: [], 16: []}
    free = [SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)] * 16
    decode_steps(engine, prompts, free, "warm")  # first steps pay one-time costs
    for r in range(rounds):
        order = list(per)[r % 3 :] + list(per)[: r % 3]  # no count always runs first
        for n in order:
            params = [
                SamplingParams(
                    max_tokens=steps + 4,
                    temperature=0.0,
                    ignore_eos=True,
                    constraint=JsonSchema(DECODE_SCHEMA) if i < n else None,
                )
                for i in range(16)
            ]
            steps_s, sample_s, cpu_s = decode_steps(engine, prompts, params, f"d{r}-{n}")
            per[n] += steps_s
            sample[n] += sample_s
            cpu[n] += cpu_s
    base = statistics.median(per[0])
    cpu_base = statistics.median(cpu[0])
    return [
        {
            "section": "decode",
            "rows": 16,
            "constrained": n,
            "steps": len(times),
            "step_ms_p50": round(statistics.median(times) * 1e3, 2),
            "ratio_to_free": round(statistics.median(times) / base, 3),
            # masks fill + apply, sampling: the part constraints add to
            "sample_ms_p50": round(statistics.median(sample[n]) * 1e3, 2),
            # CPU seconds of every thread of the process (the fill thread's included): on a
            # shared machine the fairer cost, as wall time there depends on the neighbours
            "cpu_ms_p50": round(statistics.median(cpu[n]) * 1e3, 2),
            "cpu_ratio": round(statistics.median(cpu[n]) / cpu_base, 3),
        }
        for n, times in per.items()
    ]


def decode_steps(
    engine: LLMEngine, prompts: list[list[int]], params: list[SamplingParams], tag: str
) -> list[float]:
    for i, (p, sp) in enumerate(zip(prompts, params, strict=True)):
        engine.add_request(f"{tag}-{i}", Prompt(p), sp)
    times, samples, cpu = [], [], []
    while engine.has_unfinished():
        decoding = len(engine.scheduler.running) == 16 and all(
            s.num_computed_tokens == s.num_tokens - 1 for s in engine.scheduler.running
        )
        t0, c0 = time.perf_counter(), time.process_time()
        engine.step()
        if decoding and len(engine.scheduler.running) == 16:
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            samples.append(engine.stats.recent[-1].sample_time)
    return times[1:], samples[1:], cpu[1:]  # the first decode step warms caches


# --- llguidance beside xgrammar ---
def compare_libraries(model: Path, repeats: int) -> list[dict]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))
    config = json.loads((model / "config.json").read_text())
    vocab = int(config["vocab_size"])
    eos = [int(config["eos_token_id"])]
    tools = make_tools(20)
    work = cases(tools)
    work["json_schema(call)"] = (None, call_text(tools, 13))  # type: ignore[assignment]
    rows = llguidance_rows(tokenizer, vocab, eos, work, tools, repeats)
    try:
        import xgrammar  # noqa: F401
    except ImportError:
        print("xgrammar is not installed: its rows are skipped")
        return rows
    return rows + xgrammar_rows(model, tokenizer, vocab, eos, work, tools, repeats)


def _walk(
    tokens: list[int], fill: Callable[[], None], accept: Callable[[int], bool]
) -> list[float]:
    times = []
    for token in tokens:
        t0 = time.perf_counter()
        fill()
        times.append(time.perf_counter() - t0)
        if not accept(token):
            raise RuntimeError(f"token {token} rejected")
    return times


UNSUPPORTED = (  # JSON Schema keywords neither library implements: an error, or ignored?
    {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
    {"type": "array", "contains": {"type": "integer"}},
    {"if": {"type": "string"}, "then": {"maxLength": 3}},
    {"type": "object", "dependentSchemas": {"a": {"required": ["b"]}}},
)


def unsupported_row(lib: str, compile_schema: Callable[[str], Any]) -> dict:
    rejected = 0
    for schema in UNSUPPORTED:
        try:
            compile_schema(json.dumps(schema))
        except Exception:
            rejected += 1
    return {
        "section": "libraries",
        "library": lib,
        "kind": f"unsupported keywords rejected: {rejected}/{len(UNSUPPORTED)}",
    }


def _row(lib: str, kind: str, init_s: float, compile_s: list[float], fills: list[float]) -> dict:
    return {
        "section": "libraries",
        "library": lib,
        "kind": kind,
        "tokenizer_init_ms": round(init_s * 1e3, 1),
        "compile_cold_ms": round(statistics.median(compile_s) * 1e3, 2),
        "fill_p50_us": us(pct(fills, 50)),
        "fill_p99_us": us(pct(fills, 99)),
    }


def llguidance_rows(tokenizer, vocab, eos, work, tools, repeats) -> list[dict]:
    import llguidance as llg

    from engine.structured.compiler import JSON_OPTIONS, closed, grammar_text

    t0 = time.perf_counter()
    llt = llg.LLTokenizer(tokenizer.to_str(), n_vocab=vocab, eos_token=eos)
    init = time.perf_counter() - t0
    words = (vocab + 31) // 32
    mask = torch.empty((1, words), dtype=torch.int32)
    rows = []
    for kind, (constraint, text) in work.items():
        if constraint is None:
            grammar = llg.LLMatcher.grammar_from_json_schema(
                closed(call_schema(tools)), overrides=JSON_OPTIONS
            )
        else:
            grammar = grammar_text(constraint)
        compile_s, fills = [], []
        tokens = tokenizer.encode(text, add_special_tokens=False).ids
        for _ in range(repeats):
            t0 = time.perf_counter()
            m = llg.LLMatcher(llt, grammar, log_level=0)
            compile_s.append(time.perf_counter() - t0)
            assert not m.is_error(), m.get_error()
            fills += _walk(
                tokens,
                lambda m=m: m.unsafe_compute_mask_ptr(mask.data_ptr(), words * 4),
                m.consume_token,
            )
        rows.append(_row("llguidance", kind, init, compile_s, fills))

    def compile_schema(text: str) -> None:
        grammar = llg.LLMatcher.grammar_from_json_schema(text, overrides=JSON_OPTIONS)
        m = llg.LLMatcher(llt, grammar, log_level=0)
        if m.is_error():
            raise ValueError(m.get_error())

    return [*rows, unsupported_row("llguidance", compile_schema)]


def xgrammar_rows(model, tokenizer, vocab, eos, work, tools, repeats) -> list[dict]:
    import xgrammar as xgr
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_file=str(model / "tokenizer.json"))
    t0 = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab, stop_token_ids=eos)
    init = time.perf_counter() - t0
    compact = {"any_whitespace": False, "separators": (",", ":")}
    schema = call_schema(tools)
    tagged = {  # xgrammar's structural tag: begin + JSON schema + end
        "type": "structural_tag",
        "format": {
            "type": "sequence",
            "elements": [
                {"type": "const_string", "value": BEGIN},
                {"type": "json_schema", "json_schema": schema},
                {"type": "const_string", "value": END},
            ],
        },
    }
    compilers = {
        "tool_call(20 tools)": lambda c: c.compile_structural_tag(json.dumps(tagged)),
        "json_object": lambda c: c.compile_json_schema('{"type":"object"}', **compact),
        "regex(phone)": lambda c: c.compile_regex(PHONE),
        "choice(6)": lambda c: c.compile_grammar(
            "root ::= " + " | ".join(json.dumps(o) for o in CHOICES)
        ),
        "json_schema(call)": lambda c: c.compile_json_schema(json.dumps(schema), **compact),
    }
    mask = xgr.allocate_token_bitmask(1, vocab)
    rows = []
    for kind, (_, text) in work.items():
        tokens = tokenizer.encode(text, add_special_tokens=False).ids
        compile_s, fills = [], []
        try:
            for _ in range(repeats):
                compiler = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False)
                t0 = time.perf_counter()
                compiled = compilers[kind](compiler)
                compile_s.append(time.perf_counter() - t0)
                m = xgr.GrammarMatcher(compiled)
                fills += _walk(
                    tokens, lambda m=m: m.fill_next_token_bitmask(mask, 0), m.accept_token
                )
        except Exception as exc:  # a format this version does not take: say so, go on
            print(f"xgrammar {kind}: {type(exc).__name__}: {exc}")
            continue
        rows.append(_row("xgrammar", kind, init, compile_s, fills))
    compiler = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False)
    return [*rows, unsupported_row("xgrammar", compiler.compile_json_schema)]


# --- output ---
def print_table(title: str, rows: list[dict]) -> None:
    if not rows:
        return
    keys = [k for k in rows[0] if k != "section"]
    print(f"\n## {title}")
    print(" | ".join(keys))
    for row in rows:
        print(" | ".join(str(row.get(k, "")) for k in keys))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--section", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--compare-libraries", action="store_true")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    parser.add_argument("--model", default=None, help="HF folder (default: the default model)")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--repeats", type=int, default=20, help="walks / repeats per figure")
    parser.add_argument("--decode-steps", type=int, default=24)
    parser.add_argument("--decode-rounds", type=int, default=3)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    config = EngineConfig.from_kwargs(
        model=args.model, dtype=args.dtype, num_threads=args.threads or 0, max_num_seqs=16
    )
    engine = LLMEngine(config)
    model = Path(args.model) if args.model else engine_model_path()
    rows: list[dict] = []
    grammars, tok = engine.grammars, engine.tokenizer
    runs = {
        "fill": lambda: section_fill(grammars, tok, args.repeats),
        "apply": lambda: section_apply(grammars, tok, args.repeats * 10),
        "compile": lambda: section_compile(engine, max(3, args.repeats // 4)),
        "decode": lambda: section_decode(engine, args.decode_steps, args.decode_rounds),
    }
    titles = {
        "fill": "mask fill, one row, µs per step (llguidance)",
        "apply": "mask apply on 16 x vocab logits, and a batched fill",
        "compile": "grammar compile (tool-call TaggedJson) vs the cached prompt's TTFT",
        "decode": "decode step, 16 rows, 0/8/16 constrained",
    }
    for name in args.section:
        section_rows = runs[name]()
        print_table(titles[name], section_rows)
        rows += section_rows
    if args.compare_libraries:
        lib_rows = compare_libraries(model, max(3, args.repeats // 4))
        print_table("llguidance vs xgrammar (cold compile, mask fill per step)", lib_rows)
        rows += lib_rows
    engine.close()
    path = write_results("structured", rows, model=str(model), dtype=args.dtype)
    print(f"\nwrote {path}")


def engine_model_path() -> Path:
    from engine.loader import ensure_default_model

    return ensure_default_model(progress=False)


if __name__ == "__main__":
    main()
