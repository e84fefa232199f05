"""Helpers for the router tests: a real router on a free port (uvicorn in a thread), a real
`radixcache serve` replica as a separate process (so it can be killed), and a scripted KV-events
peer (raw ZMQ PUB + ROUTER sockets speaking vLLM's protocol, as a vLLM replica would)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import uvicorn
import zmq

from api.router.app import create_router_app
from api.router.config import RouterConfig
from radixcache.shared.kv_events_wire import END_SEQ_FRAME
from tests.api.servers import fresh_text
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


def wait_until(check: Any, timeout_s: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.02)  # polling interval
    raise AssertionError(f"timed out waiting for {what}")


@dataclass
class RouterHandle:
    url: str
    app: Any
    server: uvicorn.Server
    thread: threading.Thread

    @property
    def state(self) -> Any:
        return self.app.state.router

    def stats(self) -> dict:
        return httpx.get(f"{self.url}/v1/router/stats", timeout=10).json()

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def start_router(config: RouterConfig, replicas_up: bool = True) -> RouterHandle:
    """Waits for the router's /health: a 200 (a replica is up), or any answer where the test
    means no replica to be up (`replicas_up=False`: its /health is then a 503)."""
    app = create_router_app(config)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    handle = RouterHandle(f"http://127.0.0.1:{port}", app, server, thread)
    wait_until(lambda: _healthy(handle.url, replicas_up), 60, "the router")
    return handle


def _healthy(url: str, replicas_up: bool = True) -> bool:
    try:
        status = httpx.get(f"{url}/health", timeout=2).status_code
    except httpx.HTTPError:
        return False
    return status == 200 or not replicas_up


@dataclass
class ReplicaProcess:
    url: str
    events: str
    replay: str
    proc: subprocess.Popen

    @property
    def spec(self) -> str:
        return f"{self.url},{self.events},{self.replay}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)


def spawn_replica(model: Path, settings: dict[str, Any]) -> ReplicaProcess:
    """`python -m api.cli serve` on the tiny model, 1 thread, KV events on free ports."""
    port, events, replay = free_port(), free_port(), free_port()
    args = [sys.executable, "-m", "api.cli", "serve", "--model", str(model), "--no-disk"]
    args += ["--threads", "1", "--port", str(port), "--log-level", "warning"]
    args += ["--dtype", settings["dtype"], "--block-size", str(settings["block_size"])]
    args += ["--num-blocks", str(settings["num_blocks"])]
    args += ["--max-model-len", str(settings["max_model_len"])]
    args += ["--kv-events-endpoint", f"tcp://127.0.0.1:{events}"]
    args += ["--kv-events-replay-endpoint", f"tcp://127.0.0.1:{replay}"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    handle = ReplicaProcess(
        f"http://127.0.0.1:{port}", f"tcp://127.0.0.1:{events}", f"tcp://127.0.0.1:{replay}", proc
    )
    try:
        wait_until(lambda: proc.poll() is None and _healthy(handle.url), 120, "the replica")
    except AssertionError:
        handle.kill()
        raise
    return handle


@dataclass
class ScriptedPeer:
    """Publishes exactly the (seq, payload) frames a test asks for, and replays from its log."""

    ctx: zmq.Context = field(default_factory=zmq.Context)
    log: list[tuple[int, bytes]] = field(default_factory=list)
    replay_requests: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.bind("tcp://127.0.0.1:0")
        self.endpoint = self.pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.bind("tcp://127.0.0.1:0")
        self.replay_endpoint = self.router.getsockopt_string(zmq.LAST_ENDPOINT)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._server = threading.Thread(target=self._serve_replays, daemon=True)
        self._server.start()

    def record(self, seq: int, payload: bytes) -> None:
        """Keeps a batch for replay without publishing it live (as if the SUB had missed it)."""
        with self._lock:
            self.log.append((seq, payload))

    def publish(self, seq: int, payload: bytes) -> None:
        self.record(seq, payload)
        with self._lock:
            self.pub.send_multipart([b"kv-events", seq.to_bytes(8, "big"), payload])

    def _serve_replays(self) -> None:
        """Answers replay requests until closed (the ROUTER socket lives on this thread)."""
        while not self._stop.is_set():
            if not self.router.poll(20):
                continue
            client, _, start = self.router.recv_multipart()
            first = int.from_bytes(start, "big")
            self.replay_requests.append(first)
            with self._lock:
                batches = [(s, p) for s, p in self.log if s >= first]
            for seq, payload in batches:
                self.router.send_multipart(
                    [client, b"", b"kv-events", seq.to_bytes(8, "big"), payload]
                )
            self.router.send_multipart([client, b"", b"", END_SEQ_FRAME, b""])

    def close(self) -> None:
        self._stop.set()
        self._server.join(10)
        self.pub.close(linger=0)
        self.router.close(linger=0)
        self.ctx.term()


def route_through_a_dying_replica(
    router_url: str, stats: Callable[[], dict], model: str, kill: Callable[[], None]
) -> None:
    """A round-robin router over a replica to kill (r0) and a steady one (r1): a stream opens on
    r0, 12 requests run at once, r0 is SIGKILLed (`kill`) with at least 2 of them on it. None of
    the 12 is lost (those cut before their first byte are retried on r1) and the stream ends with
    the router's error event, never hangs."""
    client = openai.OpenAI(base_url=f"{router_url}/v1", api_key="none", max_retries=0, timeout=120)
    stream = client.completions.create(
        model=model,
        prompt="stream me",
        max_tokens=400,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    first = next(iter(stream))  # round-robin: the first request went to the doomed replica
    assert first.choices

    def one(i: int) -> str:
        out = client.completions.create(
            model=model,
            prompt=fresh_text(30, seed=i),
            max_tokens=120,
            extra_body={"ignore_eos": True},
        )
        return out.choices[0].text

    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(one, i) for i in range(12)]
        wait_until(lambda: stats()["replicas"]["r0"]["load"] >= 2, 30, "requests on the doomed")
        kill()
        results = [f.result(timeout=120) for f in futures]
    assert len(results) == 12 and all(results)
    with pytest.raises(openai.APIError, match="replica failed"):
        for _ in stream:
            pass
    replicas = stats()["replicas"]
    assert replicas["r0"]["failures"] >= 1 and not replicas["r0"]["healthy"]
    assert replicas["r1"]["requests"] >= 12 - replicas["r0"]["requests"] + 1
