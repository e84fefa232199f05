"""`radixcache serve` as a real child process on a free loopback port (for tests that kill it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[1]


def poll_health(url: str, alive: Callable[[], bool], timeout_s: float) -> bool:
    """Polls url/health until it answers 200 (True), the process dies or the deadline passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and alive():
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return True
        except httpx.TransportError:
            time.sleep(0.05)  # polling interval
    return False


class ServeProcess:
    def __init__(self, args: list[str], home: Path, env: dict[str, str] | None = None) -> None:
        """`args`: what follows `radixcache serve` (the port is added); `home`: RADIXCACHE_HOME;
        `env`: variables set beside this process's."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "api.cli", "serve", *args, "--port", str(self.port)]
        env = {**os.environ, **(env or {}), "RADIXCACHE_HOME": str(home)}
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )

    def wait_healthy(self, timeout_s: float = 120.0) -> None:
        if poll_health(self.url, lambda: self.proc.poll() is None, timeout_s):
            return
        self.kill()
        raise AssertionError(f"server did not come up: {self.output()}")

    def terminate(self) -> str:
        """SIGTERM (graceful shutdown); returns everything it printed."""
        self.proc.send_signal(signal.SIGTERM)
        return self.output()

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs (a crash)."""
        self.proc.kill()
        self.proc.wait(timeout=30)

    def output(self) -> str:
        out, _ = self.proc.communicate(timeout=60)
        return out


def tiny_redis_serve(model: Path, redis_url: str, home: Path) -> ServeProcess:
    """`radixcache serve` of a tiny model (float32, 4-token blocks, 32 device blocks) over one
    Redis tier and no disk, logging at info (the banner names the tier)."""
    args = ["--model", str(model), "--dtype", "float32", "--block-size", "4", "--num-blocks", "32"]
    args += ["--no-disk", "--redis-url", redis_url, "--log-level", "info"]
    return ServeProcess(args, home)
