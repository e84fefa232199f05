"""`radixcache serve` as a real process: banner, tiers, a request, clean shutdown on SIGTERM."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx

from tests.huge_pages import anon_huge_kb, thp_mode
from tests.serve_process import ServeProcess


def test_serve_subprocess(tiny_llama: Path, tmp_path: Path) -> None:
    args = ["--model", str(tiny_llama), "--dtype", "float32", "--kv-memory", "8M"]
    args += ["--disk-path", str(tmp_path / "kv"), "--host-tier-bytes", "16M"]
    server = ServeProcess([*args, "--log-level", "warning"], tmp_path / "home")
    url = server.url
    try:
        server.wait_healthy()
        body = {"model": tiny_llama.name, "prompt": "hello", "max_tokens": 3, "temperature": 0}
        r = httpx.post(url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        if thp_mode() != "never":  # the 8 MB KV pool on huge pages (engine/host_memory.py)
            assert anon_huge_kb(server.proc.pid) >= 2048
    finally:
        out = server.terminate()
    proc = server.proc
    # uvicorn shuts down gracefully, then re-raises the signal it caught
    assert proc.returncode in (0, -signal.SIGTERM), out
    assert f"at {url}/v1" in out
    tiers = next(line for line in out.splitlines() if "KV cache tiers" in line)
    assert "device" in tiers and "host" in tiers and "disk" in tiers and "redis" not in tiers
