"""The faults of tests/fault_load.py, each injected from the test or benchmark process:
RedisBounce (SIGKILL the redis-server, start it again on its port once the server noticed),
DiskFill (fill the disk tier's own tmpfs to ENOSPC, empty it on recovery), DiskCorrupter (flip
bytes of block files while the server reads them), ServerRestart (SIGKILL `radixcache serve`,
start it again on the same port and disk folder)."""

from __future__ import annotations

import contextlib
import errno
import random
import string
import threading
from collections.abc import Callable
from pathlib import Path

import httpx

from tests.fault_load import cache_stats, disk_files, wait_for
from tests.redis_server import RedisServer
from tests.restartable_serve import RestartableServe


def redis_nodes(url: str) -> dict[str, dict[str, int]]:
    stats = cache_stats(url)
    return {} if stats is None else stats["redis_nodes"]


def poke(url: str, model: str, seed: int) -> None:
    """One short request of a fresh prompt: the server asks its tiers for it (and so probes a
    Redis whose breaker is half-open: with no traffic it never would)."""
    prompt = "".join(random.Random(seed).choice(string.ascii_letters) for _ in range(24))
    body = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0}
    httpx.post(url + "/v1/completions", json=body, timeout=60).raise_for_status()


class RedisBounce:
    """SIGKILL, then (once the server's breaker opened) a fresh redis-server on the same port;
    the fault ends when the server has the node in service again."""

    name = "redis-sigkill"

    def __init__(self, redis: RedisServer, url: str, model: str, timeout_s: float = 60) -> None:
        self.redis, self.url, self.model, self.timeout_s = redis, url, model, timeout_s
        self.pokes = 0

    def inject(self) -> None:
        self.redis.kill()
        try:
            self._wait_nodes(lambda nodes: any(not h["up"] for h in nodes.values()), "down")
        finally:
            self.redis.start()  # same port, empty data
        self._wait_nodes(lambda nodes: all(h["up"] for h in nodes.values()), "back up")

    def recover(self) -> None:
        pass

    def _wait_nodes(self, condition: Callable[[dict], bool], what: str) -> None:
        def check() -> bool:
            if condition(redis_nodes(self.url)):
                return True
            self.pokes += 1
            poke(self.url, self.model, seed=self.pokes)
            return False

        wait_for(check, self.timeout_s, f"the Redis node {what}")


class DiskFill:
    """Fills what is left of the disk tier's filesystem with a ballast file (the tier then gets
    ENOSPC); recovery deletes it. Notes the block files there as the fill ends and as it is
    recovered: blocks the tier stored while the filesystem was full are the difference."""

    name = "disk-full"

    def __init__(self, mount: Path, kv: Path) -> None:
        self.ballast = mount / "ballast"
        self.kv = kv
        self.filled_bytes = 0
        self.hit_enospc = False  # the ballast's last write was refused: the filesystem was full
        self.files_when_filled: set[Path] = set()
        self.files_at_recovery: set[Path] = set()

    def inject(self) -> None:
        chunk = b"\0" * 4096
        with open(self.ballast, "wb", buffering=0) as f:
            try:
                while True:
                    self.filled_bytes += f.write(chunk)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                self.hit_enospc = True
        self.files_when_filled = set(disk_files(self.kv))

    def recover(self) -> None:
        self.files_at_recovery = set(disk_files(self.kv))
        self.ballast.unlink(missing_ok=True)


class DiskCorrupter:
    """A thread that flips a byte (header or payload, size kept) of `share` of the block files
    as they appear, each once, chosen at random; the others are spared, so reads keep hitting
    however fast the machine corrupts (flipping every file it finds left none to hit)."""

    name = "disk-corrupt"

    def __init__(self, root: Path, seed: int = 0, share: float = 0.5) -> None:
        self.root = root
        self.rng = random.Random(seed)
        self.share = share
        self.seen: set[Path] = set()
        self.corrupted: set[Path] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="corrupter")

    def inject(self) -> None:
        self._thread.start()

    def recover(self) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.is_set():
            for path, size in sorted(disk_files(self.root).items()):
                if path in self.seen:
                    continue
                self.seen.add(path)
                if self.rng.random() < self.share:
                    with contextlib.suppress(FileNotFoundError):
                        self._flip(path, size)
            self._stop.wait(0.01)

    def _flip(self, path: Path, size: int) -> None:
        at = self.rng.randrange(size) if self.rng.random() < 0.8 else self.rng.randrange(64)
        with open(path, "r+b") as f:
            f.seek(at)
            old = f.read(1)
            f.seek(at)
            f.write(bytes([old[0] ^ 0xFF]) if old else b"\0")
        self.corrupted.add(path)

    def discarded(self) -> int:
        """Corrupted files the server has since deleted (read, failed the check, dropped) or
        evicted."""
        return sum(not p.exists() for p in self.corrupted)


class ServerRestart:
    name = "server-sigkill"

    def __init__(self, server: RestartableServe) -> None:
        self.server = server

    def inject(self) -> None:
        self.server.kill()
        self.server.start()
        self.server.wait_healthy()

    def recover(self) -> None:
        pass


def integrity(url: str) -> dict:
    return httpx.get(url + "/v1/cache/integrity", timeout=30).json()
