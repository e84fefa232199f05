"""`radixcache serve` replicas and `radixcache route` routers as processes, each in its own network
namespace of a tests.netns.Network and bound to that namespace's address: the router's HTTP to
the replicas and its ZMQ subscriptions to their KV events cross veth pairs and a bridge, and the
test reaches the router from its own namespace across the bridge. Every namespace has its own
ports, so each process uses fixed ones."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx

from tests.api.router_peers import ROOT, wait_until
from tests.netns import Network

P = TypeVar("P", bound="NetProcess")
HTTP_PORT, EVENTS_PORT, REPLAY_PORT = 8000, 5557, 5558


@dataclass
class NetProcess:
    """A process in namespace `ns` at `address`; its stderr goes to `log`."""

    ns: str
    address: str
    proc: subprocess.Popen
    log: Path

    @property
    def url(self) -> str:
        return f"http://{self.address}:{HTTP_PORT}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-6000:] if self.log.exists() else ""

    def wait_healthy(self, timeout_s: float) -> None:
        """Until /health answers across the bridge; else killed, and the log tail is the error."""
        try:
            wait_until(lambda: self.proc.poll() is None and _healthy(self.url), timeout_s, self.url)
        except AssertionError:
            code = self.proc.poll()
            if code is None:  # stuck: on SIGABRT faulthandler writes its threads' stacks to the log
                os.kill(self.proc.pid, signal.SIGABRT)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(10)
            self.kill()
            raise AssertionError(
                f"{self.url} (namespace {self.ns}) never answered /health across the bridge "
                f"(exit code {code}); its log ends:\n{self.log_tail()}"
            ) from None


@dataclass
class NetReplica(NetProcess):
    @property
    def spec(self) -> str:
        """Its --replica argument: HTTP, KV events and replay, all at its namespace's address."""
        a = self.address
        return f"{self.url},tcp://{a}:{EVENTS_PORT},tcp://{a}:{REPLAY_PORT}"


@dataclass
class NetRouter(NetProcess):
    def stats(self) -> dict:
        return httpx.get(f"{self.url}/v1/router/stats", timeout=10).json()


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _spawn(kind: type[P], net: Network, args: list[str], log: Path) -> P:
    """`args` ({ADDR}: the namespace's address) in a new namespace, stderr to `log`."""
    ns, address = net.add()
    args = [a.replace("{ADDR}", address) for a in args]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONFAULTHANDLER": "1"}
    with log.open("w") as err:
        proc = net.popen(ns, args, ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err)
    return kind(ns, address, proc, log)


def spawn_replica(net: Network, model: Path, settings: dict[str, Any], logs: Path) -> NetReplica:
    """`radixcache serve` on the tiny model in a new namespace (not yet healthy: wait_healthy)."""
    args = [sys.executable, "-m", "api.cli", "serve", "--model", str(model), "--no-disk"]
    args += ["--threads", "1", "--host", "{ADDR}", "--port", str(HTTP_PORT)]
    args += ["--log-level", "warning", "--dtype", settings["dtype"]]
    args += ["--block-size", str(settings["block_size"])]
    args += ["--num-blocks", str(settings["num_blocks"])]
    args += ["--max-model-len", str(settings["max_model_len"])]
    args += ["--kv-events-endpoint", f"tcp://{{ADDR}}:{EVENTS_PORT}"]
    args += ["--kv-events-replay-endpoint", f"tcp://{{ADDR}}:{REPLAY_PORT}"]
    log = logs / f"replica-{len(net.names)}.log"
    args += ["--responses-store", str(log.with_suffix(".sqlite"))]
    return _spawn(NetReplica, net, args, log)


def start_router(
    net: Network, replicas: list[NetReplica], model: Path, policy: str, block_size: int, logs: Path
) -> NetRouter:
    """`radixcache route` over `replicas` in a new namespace, healthy when this returns."""
    args = [sys.executable, "-m", "api.cli", "route", "--model", str(model), "--policy", policy]
    args += ["--block-size", str(block_size), "--host", "{ADDR}", "--port", str(HTTP_PORT)]
    args += ["--log-level", "warning"]
    for r in replicas:
        args += ["--replica", r.spec]
    router = _spawn(NetRouter, net, args, logs / f"router-{len(net.names)}.log")
    router.wait_healthy(60)
    return router
