"""`radixcache serve` as a real process: banner, tiers, a request, clean shutdown on SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_subprocess(tiny_llama: Path, tmp_path: Path) -> None:
    port = free_port()
    cmd = [sys.executable, "-m", "api.cli", "serve", "--model", str(tiny_llama)]
    cmd += ["--port", str(port), "--dtype", "float32", "--kv-memory", "8M"]
    cmd += [
        "--disk-path",
        str(tmp_path / "kv"),
        "--host-tier-bytes",
        "16M",
        "--log-level",
        "warning",
    ]
    env_home = {"RADIXCACHE_HOME": str(tmp_path / "home")}
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **env_home},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        healthy = False
        while time.monotonic() < deadline and proc.poll() is None and not healthy:
            try:
                healthy = httpx.get(url + "/health", timeout=1).status_code == 200
            except httpx.TransportError:
                time.sleep(0.1)  # polling interval
        assert healthy, "server did not come up"
        body = {"model": tiny_llama.name, "prompt": "hello", "max_tokens": 3, "temperature": 0}
        r = httpx.post(url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    # uvicorn shuts down gracefully, then re-raises the signal it caught
    assert proc.returncode in (0, -signal.SIGTERM), out
    assert f"at {url}/v1" in out
    tiers = next(line for line in out.splitlines() if "KV cache tiers" in line)
    assert "device" in tiers and "host" in tiers and "disk" in tiers and "redis" not in tiers
