"""A real redis-server on a free loopback port, for tests (import the `redis_server` fixture).

from tests.redis_server import redis_server  # noqa: F401  (in a conftest.py)

def test_x(redis_server):
    url = redis_server.url          # redis://127.0.0.1:<port>/0
    redis_server.kill()             # SIGKILL, as a crash would
    redis_server.start()            # same port, empty data
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import redis

STARTUP_TIMEOUT_S = 10.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    def __init__(self, workdir: Path, port: int | None = None, password: str | None = None) -> None:
        self.binary = shutil.which("redis-server")
        if self.binary is None:
            raise RuntimeError(
                "redis-server not found: run `make install-dev` (scripts/ensure_redis.sh)"
            )
        self.workdir = workdir
        self.port = port or free_port()
        self.password = password  # requirepass: clients must AUTH
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> None:
        if self.running:
            return
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--save", "",
                "--appendonly", "no",
                "--dir", str(self.workdir),
                "--protected-mode", "no",
                *self.extra_args(),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self._wait_ready()

    def extra_args(self) -> list[str]:
        """Options beyond the loopback, no-persistence base every test server runs with."""
        return ["--requirepass", self.password] if self.password else []

    def _wait_ready(self) -> None:
        client = redis.Redis(
            port=self.port, password=self.password, socket_timeout=0.5, socket_connect_timeout=0.5
        )
        end = time.monotonic() + STARTUP_TIMEOUT_S
        try:
            while True:
                if self.proc is not None and self.proc.poll() is not None:
                    raise RuntimeError(f"redis-server exited with {self.proc.returncode}")
                try:
                    if client.ping():
                        return
                except redis.ConnectionError:
                    if time.monotonic() > end:
                        raise
                    time.sleep(0.01)  # poll interval while the server binds its port
        finally:
            client.close()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: the server vanishes mid-workload, connections reset."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, password=self.password, socket_timeout=2)
