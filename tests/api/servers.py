"""A real server for the API tests: create_app + uvicorn on a free port, in a background thread,
with the tiny random-weight Llama of the engine tests (float32, small KV pool)."""

from __future__ import annotations

import random
import re
import socket
import string
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from api.app import create_app
from api.config import ApiConfig
from api.state import ServerState
from engine.async_engine import AsyncEngine
from engine.config import EngineConfig

API_KEYS = {"sk-alice": "alice", "sk-bob": "bob"}
ADMIN_KEY = "sk-admin"
NUM_BLOCKS = 512
BLOCK_SIZE = 16
MAX_MODEL_LEN = 512


@dataclass
class Server:
    url: str
    app: Any
    server: uvicorn.Server
    thread: threading.Thread

    @property
    def state(self) -> ServerState:
        return self.app.state.server

    @property
    def engine(self) -> AsyncEngine:
        return self.state.engine

    @property
    def model(self) -> str:
        return self.state.model_name

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)


# the engine settings of every test server and of the offline reference
ENGINE_SETTINGS: dict[str, Any] = dict(
    dtype="float32",
    num_blocks=NUM_BLOCKS,
    block_size=BLOCK_SIZE,
    max_model_len=MAX_MODEL_LEN,
    max_num_seqs=8,
    max_num_batched_tokens=1024,
    speculative_step_cost="prior",  # drafts the same way however loaded the machine is
)


def engine_config(model_dir: Path, **overrides: Any) -> EngineConfig:
    return EngineConfig(model=str(model_dir), **{**ENGINE_SETTINGS, **overrides})


def start_server(
    engine_cfg: EngineConfig,
    api_cfg: ApiConfig,
    healthy_timeout_s: float = 120.0,
    host: str = "127.0.0.1",
    port: int = 0,
) -> Server:
    """Binds the port first (a free one by default: no race), runs uvicorn in a thread, waits
    for /health."""
    app = create_app(engine_cfg, api_cfg)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    handle = Server(f"http://{host}:{port}", app, server, thread)
    wait_healthy(handle, healthy_timeout_s)
    return handle


def wait_healthy(handle: Server, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    with httpx.Client(base_url=handle.url, timeout=2.0) as client:
        while time.monotonic() < deadline and handle.thread.is_alive():
            try:
                if client.get("/health").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)  # polling interval
    handle.stop()
    raise RuntimeError("server did not become healthy")


def fresh_text(n: int, seed: int) -> str:
    """n random ASCII characters (n tokens with the byte-level tiny tokenizer)."""
    rng = random.Random(seed)
    return "".join(rng.choice(string.ascii_letters + " ") for _ in range(n))


def metric(text: str, name: str, labels: str = "") -> float:
    """The value of one Prometheus sample in /metrics text."""
    pattern = re.escape(name + (f"{{{labels}}}" if labels else "")) + r" ([0-9.e+-]+)"
    found = re.search(r"^" + pattern + "$", text, re.MULTILINE)
    assert found is not None, f"{name}{labels} missing"
    return float(found.group(1))


def flush_until_in_tier(
    client: httpx.Client, prompt: str, tier: str, timeout_s: float = 30
) -> None:
    """Empty the device cache into the tiers (write-back) and poll the lookup until some of
    `prompt`'s blocks are in `tier` (the writes are asynchronous)."""
    client.post("/v1/cache/flush", json={})
    deadline = time.monotonic() + timeout_s
    while True:
        found = client.post("/v1/cache/lookup", json={"prompt": prompt}).json()
        if found["cached_tokens_by_tier"].get(tier, 0) > 0:
            return
        assert time.monotonic() < deadline, f"no block of the prompt reached the {tier} tier"
        time.sleep(0.02)  # polling interval
