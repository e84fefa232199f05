"""`radixcache serve` as a child process that can be SIGKILLed and started again on the same port
and folders (a crash and its restart, as a supervisor would do it). Output goes to a log file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.ports import free_port
from tests.serve_process import poll_health

ROOT = Path(__file__).resolve().parents[1]


class RestartableServe:
    def __init__(self, args: list[str], home: Path) -> None:
        """`args`: what follows `radixcache serve` (the port is added); `home`: RADIXCACHE_HOME,
        which also holds the log (serve.log, every start appended)."""
        self.args = args
        self.home = home
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = home / "serve.log"
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "api.cli", "serve", *self.args, "--port", str(self.port)]
        env = {**os.environ, "RADIXCACHE_HOME": str(self.home)}
        with open(self.log_path, "a") as log:
            self.proc = subprocess.Popen(
                cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env
            )
        self.starts += 1

    def wait_healthy(self, timeout_s: float = 300.0) -> None:
        """Polls /health; a first start may build the native kernels (minutes on a busy machine)."""
        if poll_health(self.url, lambda: self.running, timeout_s):
            return
        self.kill()
        raise AssertionError(f"server did not come up: {self.log()[-4000:]}")

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs (a crash)."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=30)
            self.proc = None

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM (graceful shutdown), SIGKILL if it does not end in time."""
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self.proc = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
