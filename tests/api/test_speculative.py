"""Speculative decoding through the real app: the serve flags reach the engine, a repeated
request is answered the same (drafted from its cached continuation), and the acceptance shows in
/v1/cache/stats and /metrics, under our names and under vLLM's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from api.cli import build_parser, engine_config
from api.config import ApiConfig
from tests.api.servers import Server, fresh_text, start_server
from tests.api.servers import engine_config as server_engine_config


def _families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def _value(family, suffix: str = "_total", **labels: str) -> float:
    (value,) = [
        s.value
        for s in family.samples
        if s.name == family.name + suffix and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    return value


def _repeat(server: Server) -> list[str]:
    body = {
        "model": server.model,
        "prompt": fresh_text(40, 600),
        "max_tokens": 48,
        "temperature": 0,
        "ignore_eos": True,
    }
    with httpx.Client(base_url=server.url, timeout=120.0) as client:
        texts = []
        for _ in range(2):  # the second answer drafts from the first's cached blocks
            reply = client.post("/v1/completions", json=body)
            assert reply.status_code == 200, reply.text
            texts.append(reply.json()["choices"][0]["text"])
    return texts


@pytest.fixture(scope="module", params=["radixcache", "vllm"])
def spec_server(request, tiny_llama: Path) -> Iterator[tuple[Server, str]]:
    engine = server_engine_config(tiny_llama, speculative="cache", num_speculative_tokens=6)
    handle = start_server(engine, ApiConfig(metrics_names=request.param))
    yield handle, request.param
    handle.stop()


def test_stats_and_metrics_report_acceptance(spec_server) -> None:
    server, names = spec_server
    first, second = _repeat(server)
    assert first == second
    spec = httpx.get(f"{server.url}/v1/cache/stats").json()["speculative"]
    assert spec["num_drafts"] > 0 and spec["num_accepted_tokens"] > 0
    assert spec["acceptance_rate"] == pytest.approx(
        spec["num_accepted_tokens"] / spec["num_draft_tokens"], abs=1e-6
    )
    assert spec["mean_accepted_length"] > 1
    assert 1 <= len(spec["accepted_per_pos"]) <= 6 and spec["accepted_per_pos"][0] > 0
    assert spec["verify_step_ms"] > 0
    found = _families(httpx.get(f"{server.url}/metrics").text)
    if names == "vllm":
        labels = {"model_name": server.model, "engine": "0"}
        prefix = "vllm:spec_decode_"
        assert "radixcache_spec_decode_num_drafts" not in found
    else:
        labels = {}
        prefix = "radixcache_spec_decode_"
        assert _value(found[prefix + "acceptance_rate"], "") == pytest.approx(
            spec["acceptance_rate"], abs=1e-6
        )
    assert _value(found[prefix + "num_drafts"], **labels) == spec["num_drafts"]
    assert _value(found[prefix + "num_draft_tokens"], **labels) == spec["num_draft_tokens"]
    assert _value(found[prefix + "num_accepted_tokens"], **labels) == spec["num_accepted_tokens"]
    per_pos = found[prefix + "num_accepted_tokens_per_pos"]
    assert found[prefix + "num_drafts"].type == "counter" and per_pos.type == "counter"
    assert _value(per_pos, position="0", **labels) == spec["accepted_per_pos"][0]


def test_serve_flags_reach_the_engine_config(tmp_path: Path) -> None:
    args = build_parser().parse_args(
        [
            "serve",
            "--speculative",
            "ngram",
            "--num-speculative-tokens",
            "3",
            "--speculative-step-cost",
            "prior",
            "--no-cuda-graphs",
        ]
    )
    config = engine_config(args, tmp_path)
    assert (config.speculative, config.num_speculative_tokens) == ("ngram", 3)
    assert (config.speculative_step_cost, config.cuda_graphs) == ("prior", False)
    default = engine_config(build_parser().parse_args(["serve"]), tmp_path)
    assert (default.speculative, default.speculative_step_cost) == ("cache", "fitted")
    assert default.cuda_graphs
    assert engine_config(build_parser().parse_args(["serve", "--speculative", "off"]), tmp_path)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--speculative", "eagle"])
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        engine_config(
            build_parser().parse_args(["serve", "--num-speculative-tokens", "0"]), tmp_path
        )
