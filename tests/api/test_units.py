"""Parts of the API that need no engine: CLI parsing, key parsing, tenant salts, request models,
counter windows."""

from __future__ import annotations

import argparse

import pytest

from api.auth import Caller
from api.cli import build_parser, engine_config, parse_size, tier_config
from api.config import ApiConfig, parse_api_keys
from api.errors import ApiError, parse_body
from api.observability.engine_stats import CacheCounters
from api.observability.stats_history import StatsHistory
from api.openai.protocol import ChatCompletionRequest, CompletionRequest
from engine.config import EngineConfig


def test_parse_size() -> None:
    assert parse_size("4096") == 4096
    assert parse_size("512M") == 512 << 20
    assert parse_size("2G") == 2 << 30
    assert parse_size("1.5GiB") == 3 << 29
    with pytest.raises(argparse.ArgumentTypeError):
        parse_size("lots")


def test_serve_defaults_need_no_arguments(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RADIXCACHE_HOME", str(tmp_path))
    args = build_parser().parse_args(["serve"])
    assert (args.host, args.port) == ("127.0.0.1", 8000)
    tiers = tier_config(args)
    assert tiers.disk_path == tmp_path / "kv" and tiers.host_bytes == 0
    cfg = engine_config(args, tmp_path / "model")
    assert cfg.model == str(tmp_path / "model") and cfg.enable_prefix_caching


def test_serve_options_map_to_configs(tmp_path) -> None:
    args = build_parser().parse_args(
        [
            "serve",
            "--no-disk",
            "--host-tier-bytes",
            "64M",
            "--redis-url",
            "redis://localhost:6379/0",
            "--write-policy",
            "write-through",
            "--block-size",
            "32",
            "--kv-memory",
            "256M",
            "--dtype",
            "float32",
            "--api-key",
            "team=sk-1",
            "--admin-key",
            "adm",
            "--port",
            "9000",
            "--max-queue",
            "7",
            "--eviction-policy",
            "learned",
        ]
    )
    tiers = tier_config(args)
    assert tiers.disk_path is None and tiers.host_bytes == 64 << 20
    assert tiers.write_policy == "write-through" and tiers.redis_url.startswith("redis://")
    cfg = engine_config(args, tmp_path)
    assert (cfg.block_size, cfg.kv_cache_memory, cfg.dtype) == (32, 256 << 20, "float32")
    assert (
        cfg.eviction_policy == "learned"
        and engine_config(build_parser().parse_args(["serve"]), tmp_path).eviction_policy == "lru"
    )
    assert args.port == 9000 and args.max_queue == 7
    assert parse_api_keys(args.api_key) == {"sk-1": "team"}


def test_tier_kv_dtype_maps_and_a_second_quantized_format_is_refused(tmp_path) -> None:
    parser = build_parser()
    args = parser.parse_args(
        ["serve", "--no-disk", "--host-tier-bytes", "1M", "--tier-kv-dtype", "int8"]
    )
    assert tier_config(args).kv_dtype == "int8"
    assert engine_config(args, tmp_path).tiers.kv_dtype == "int8"
    assert (
        tier_config(parser.parse_args(["serve", "--disk-path", str(tmp_path)])).kv_dtype == "auto"
    )
    both = ["serve", "--disk-path", str(tmp_path), "--kv-cache-dtype", "int8"]
    assert engine_config(parser.parse_args([*both, "--tier-kv-dtype", "int8"]), tmp_path)
    with pytest.raises(ValueError, match="--tier-kv-dtype fp8_e4m3 with --kv-cache-dtype int8"):
        engine_config(parser.parse_args([*both, "--tier-kv-dtype", "fp8_e4m3"]), tmp_path)


def test_help_documents_every_option(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["serve", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for option in (
        "--model",
        "--host-tier-bytes",
        "--disk-path",
        "--redis-url",
        "--write-policy",
        "--tier-kv-dtype",
        "--api-key",
        "--admin-key",
        "--port",
        "--max-queue",
        "--kv-memory",
        "--eviction-policy",
    ):
        assert option in text
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    assert "pull" in capsys.readouterr().out


def test_api_keys_and_tenant_salts() -> None:
    keys = parse_api_keys(["sk-a", "acme=sk-b", "acme=sk-c"])
    assert keys["sk-b"] == keys["sk-c"] == "acme"
    assert keys["sk-a"].startswith("key-")
    with pytest.raises(ValueError):
        parse_api_keys(["acme="])
    alice, bob = Caller("alice", False), Caller("bob", False)
    assert alice.cache_salt(None) != bob.cache_salt(None)
    assert alice.cache_salt("x") != bob.cache_salt("x")
    assert alice.owns_salt(alice.cache_salt("x")) and not bob.owns_salt(alice.cache_salt("x"))
    assert not alice.owns_salt("") and Caller(None, True).owns_salt(alice.cache_salt(None))
    assert ApiConfig().auth_enabled is False


def test_request_models_are_strict() -> None:
    ok = parse_body(b'{"model": "m", "prompt": [1, 2, 3], "max_tokens": 4}', CompletionRequest)
    assert ok.prompts() == [[1, 2, 3]]
    bad = [
        b'{"model": "m", "prompt": "x", "max_tokens": "4"}',
        b'{"model": "m", "prompt": "x", "temperature": -0.1}',
        b'{"model": "m", "prompt": "x", "top_p": 0}',
        b'{"model": "m", "prompt": "x", "max_tokens": 0}',
        b'{"prompt": "x"}',
        b"{not json",
        b"[1, 2]",
        b"",
    ]
    for body in bad:
        with pytest.raises(ApiError) as exc:
            parse_body(body, CompletionRequest)
        assert exc.value.status == 400
    with pytest.raises(ApiError) as exc:
        parse_body(b'{"model": "m", "messages": []}', ChatCompletionRequest)
    assert exc.value.param == "messages"


def test_stats_history_windows() -> None:
    h: StatsHistory[CacheCounters] = StatsHistory(keep_s=100)
    for t in range(0, 50, 10):
        h.record(float(t), CacheCounters(hit_tokens=t * 2))
    diff, covered = h.delta(45.0, CacheCounters(hit_tokens=100), 20.0)
    assert covered == 25.0 and diff.hit_tokens == 100 - 40
    diff, covered = h.delta(45.0, CacheCounters(hit_tokens=100), 1000.0)
    assert covered == 45.0 and diff.hit_tokens == 100
    h.record(500.0, CacheCounters(hit_tokens=1000))
    assert h.start().time >= 40.0


def test_engine_config_names_the_eviction_policies() -> None:
    with pytest.raises(ValueError, match="learned"):
        EngineConfig(eviction_policy="fifo")
    assert EngineConfig(eviction_policy="learned").eviction_policy == "learned"
