"""A rolling restart under load: two `radixcache serve` processes (tiny model, one shared Redis
tier written through, KV events, a short drain timeout) behind a real router; streaming chat
clients that share system prompts run the whole time while each replica in turn is SIGTERMed,
waited for (exit code 0), started again on the same port and waited for until the router sees it
ready. No request fails, no stream is cut short, and each restarted process loads shared prefixes
it never computed from Redis (the tier's hits in its own stats).

8 clients rather than the bench's 32 (benchmarks/bench_rolling.py): two replica processes, the
router and the clients share the suite's 2 cores; 8 keep both replicas busy (the drain has
streams to wait for) and the test within its time."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from api.router.config import RouterConfig
from api.router.replicas import ReplicaSpec
from tests.api.router_peers import start_router
from tests.ports import free_port
from tests.redis_server import RedisServer
from tests.restartable_serve import RestartableServe
from tests.rolling_load import ChatWorkload, Load, first_served, roll, summarise, wait_for

CLIENTS = 8
DRAIN_TIMEOUT_S = 20  # far above a tiny model's 16-token stream: every drain ends drained


def replica(model: Path, redis_url: str, home: Path) -> tuple[RestartableServe, ReplicaSpec]:
    events, replay = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    args = ["--model", str(model), "--dtype", "float32", "--block-size", "4"]
    args += ["--num-blocks", "32768", "--max-model-len", "1024", "--threads", "1"]
    args += ["--no-disk", "--host-tier-bytes", "0", "--redis-url", redis_url]
    args += ["--write-policy", "write-through", "--drain-timeout", str(DRAIN_TIMEOUT_S)]
    args += ["--kv-events-endpoint", events, "--kv-events-replay-endpoint", replay]
    args += ["--log-level", "info"]
    server = RestartableServe(args, home)
    return server, ReplicaSpec(server.url, events, replay)


@pytest.fixture
def replicas(
    tiny_llama: Path, redis_server: RedisServer, tmp_path: Path
) -> Iterator[list[tuple[RestartableServe, ReplicaSpec]]]:
    pairs = [replica(tiny_llama, redis_server.url, tmp_path / f"r{i}") for i in range(2)]
    for server, _ in pairs:
        server.start()
    try:
        for server, _ in pairs:
            server.wait_healthy()
        yield pairs
    finally:
        for server, _ in pairs:
            server.kill()


def _tier_hits(url: str) -> dict[str, int]:
    stats = httpx.get(f"{url}/v1/cache/stats", timeout=10).json()
    return stats["since_start"]["hit_tokens_by_tier"]


@pytest.mark.slow
def test_rolling_restart_under_load_loses_nothing_and_hits_resume_from_redis(
    replicas: list[tuple[RestartableServe, ReplicaSpec]], tiny_llama: Path
) -> None:
    specs = tuple(spec for _, spec in replicas)
    # round-robin: each restarted replica gets requests as soon as it is back (cache-aware would
    # keep the shared prefixes on the replica that holds them). The default 1 s health interval:
    # requests still reach a draining replica, which refuses them, and the router retries them
    config = RouterConfig(
        specs, tiny_llama, policy="round-robin", block_size=4, health_interval_s=1.0
    )
    router = start_router(config)
    load = Load(router.url, ChatWorkload(tiny_llama.name), CLIENTS)
    servers = [server for server, _ in replicas]
    try:
        load.start()
        # 2 x CLIENTS requests per phase: every system prompt computed before the first restart
        # (client i starts on prompt i), and a restarted replica's first requests in its phase
        phases, restarts = roll(load, servers, router.stats, settle_requests=2 * CLIENTS)

        def restarts_seen() -> list[int]:
            subscribers = [r["subscriber"] for r in router.stats()["replicas"].values()]
            return [s["restarts"] for s in subscribers]

        # each restarted replica's events began again from 0: the router rebuilt its index
        wait_for(lambda: min(restarts_seen()) >= 1, 30, "the router to see both restarts")
    finally:
        load.stop()
        router.stop()
    rows = summarise(load.outcomes, phases)
    bad = [o for o in load.outcomes if o.failed or o.truncated]
    assert not bad, (bad[:5], rows)
    assert all(r["requests"] > 0 for r in rows), rows
    for restart, server in zip(restarts, servers, strict=True):
        log = server.log()
        assert restart.exit_code == 0, log[-3000:]
        assert log.count("SIGTERM: draining") == 1 and "drain timed out" not in log
        # the new process loaded shared prefixes from Redis that it never computed: its device
        # pool started empty, there is no host or disk tier, and 32768 blocks never evict, so
        # nothing spilled: write-through put them there. Not asserted of its very first request:
        # on a starved CPU that load may pass the tier's 0.5 s deadline and it recomputes
        first = first_served(load, restart)
        assert first is not None, f"{restart.replica} served nothing once back"
        assert _tier_hits(server.url).get("redis", 0) > 0, first
