"""The router's checks across real network hops: every `radixcache serve` replica and every
`radixcache route` router is a process in its own network namespace, bound to that namespace's
address, so the router's HTTP to the replicas and its ZMQ subscriptions to their KV events cross
veth pairs and a bridge; the test talks to the routers across the bridge too. It needs root to
make the namespaces: without it the module's fixture fails with the reason (never a skip).
test_router.py runs the same checks over loopback."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai
import pytest

from tests.api.netns_peers import NetReplica, NetRouter, spawn_replica, start_router
from tests.api.router_peers import route_through_a_dying_replica, wait_until
from tests.api.servers import ENGINE_SETTINGS, fresh_text, metric
from tests.netns import Network

pytestmark = pytest.mark.slow  # five processes, each loading torch or a tokenizer
BS = ENGINE_SETTINGS["block_size"]
HEADER = "x-radixcache-replica"
USERS, TURNS = 3, 3  # an odd number of users: round-robin moves each conversation every turn


@pytest.fixture(scope="module")
def network() -> Iterator[Network]:
    net = Network()  # no root: raises NamespacesUnavailable (an AssertionError) saying why
    try:
        yield net
    finally:
        net.close()  # also ends any process a failed test left running


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("netns_logs")


@pytest.fixture(scope="module")
def replicas(network: Network, tiny_llama: Path, logs: Path) -> Iterator[list[NetReplica]]:
    """Three replicas, loaded side by side: two steady ones, and one the kill test kills."""
    started: list[NetReplica] = []
    try:
        for _ in range(3):
            started.append(spawn_replica(network, tiny_llama, ENGINE_SETTINGS, logs))
        for r in started:
            r.wait_healthy(180)
        yield started
    finally:
        for r in started:
            r.kill()


@dataclass
class Traffic:
    """What the same conversations got through one router."""

    homes: dict[int, list[str]] = field(default_factory=dict)  # user -> replica of each turn
    cached: list[list[int]] = field(default_factory=list)  # [turn][user] cached tokens
    prompt: list[list[int]] = field(default_factory=list)  # [turn][user] prompt tokens
    stats: dict = field(default_factory=dict)  # the router's, after the last turn
    bytes_through: dict[str, int] = field(default_factory=dict)  # replica -> veth bytes

    @property
    def cached_share(self) -> float:
        return sum(map(sum, self.cached)) / sum(map(sum, self.prompt))


def converse(router: NetRouter, net: Network, replicas: list[NetReplica], seed: int) -> Traffic:
    """USERS conversations of TURNS turns, one request at a time, each turn sent once the router
    has applied every KV event the replica that answered the last one had published by then."""
    client = openai.OpenAI(base_url=f"{router.url}/v1", api_key="none", max_retries=0)
    model = httpx.get(f"{replicas[0].url}/v1/models", timeout=10).json()["data"][0]["id"]
    by_url = {r.url: r for r in replicas}
    before = {r.url: net.bytes_through(r.ns) for r in replicas}
    users = {
        u: [{"role": "system", "content": fresh_text(120, seed=seed + u)}] for u in range(USERS)
    }
    out = Traffic(homes={u: [] for u in users})
    for turn in range(TURNS):
        out.cached.append([])
        out.prompt.append([])
        for u, history in users.items():
            history.append({"role": "user", "content": fresh_text(40, seed=seed + 100 * turn + u)})
            raw = client.chat.completions.with_raw_response.create(
                model=model,
                messages=history,
                max_tokens=8,
                temperature=0,
                extra_body={"ignore_eos": True},
            )
            reply, name = raw.parse(), raw.headers[HEADER]
            out.homes[u].append(name)
            out.cached[-1].append(reply.usage.prompt_tokens_details.cached_tokens)
            out.prompt[-1].append(reply.usage.prompt_tokens)
            history.append({"role": "assistant", "content": reply.choices[0].message.content})
            _wait_indexed(router, by_url[router.stats()["replicas"][name]["url"]], name)
    out.stats = router.stats()
    out.bytes_through = {
        name: net.bytes_through(by_url[r["url"]].ns) - before[r["url"]]
        for name, r in out.stats["replicas"].items()
    }
    return out


def _wait_indexed(router: NetRouter, replica: NetReplica, name: str) -> None:
    """Until the router's subscriber has applied as many events as the replica has handed to its
    publisher so far (read once: later ones, e.g. evictions, need not wait)."""
    scrape = httpx.get(f"{replica.url}/metrics", timeout=10).text
    offered = metric(scrape, "radixcache_kv_events_offered_total")
    wait_until(
        lambda: router.stats()["replicas"][name]["subscriber"]["events"] >= offered,
        20,
        f"{name}'s KV events to cross to the router",
    )


@pytest.fixture(scope="module")
def cache_aware(
    network: Network, replicas: list[NetReplica], tiny_llama: Path, logs: Path
) -> Traffic:
    router = start_router(network, replicas[:2], tiny_llama, "cache-aware", BS, logs)
    try:
        return converse(router, network, replicas[:2], seed=0)
    finally:
        router.kill()


def test_later_turns_stay_on_the_replica_holding_the_earlier_ones(
    cache_aware: Traffic, network: Network
) -> None:
    t = cache_aware
    assert all(len(set(h)) == 1 for h in t.homes.values()), t.homes
    assert {h[0] for h in t.homes.values()} == {"r0", "r1"}  # users spread over both
    assert all(c > 0 for turn in t.cached[1:] for c in turn), t.cached
    stats = t.stats
    assert stats["policy"] == "cache-aware"
    assert stats["decisions"]["cache_hit"] >= USERS * (TURNS - 1), stats["decisions"]
    for name, r in stats["replicas"].items():
        # the replica is at its own namespace's address, its events too: nothing went by loopback
        assert r["url"].startswith(f"http://10.213.{network.net}.")
        assert r["events"].startswith(f"tcp://10.213.{network.net}.")
        # its index was fed by the replica's KV events over the network, and predicted hits
        sub = r["subscriber"]
        assert sub["batches"] > 0 and sub["events"] > 0 and r["index"]["stored_blocks"] > 0
        assert sub["gaps"] == 0 and sub["bad_payloads"] == 0 and sub["bad_events"] == 0
        assert r["requests"] > 0 and r["predicted_cached_tokens"] > 0
        assert r["reported_cached_tokens"] > 0 and r["prompt_tokens"] > 0
        # what crossed its veth: at least the HTTP bodies and the events' token ids
        assert t.bytes_through[name] > r["prompt_tokens"], (name, t.bytes_through)


def test_round_robin_caches_less_of_the_same_traffic(
    cache_aware: Traffic, network: Network, replicas: list[NetReplica], tiny_llama: Path, logs: Path
) -> None:
    router = start_router(network, replicas[:2], tiny_llama, "round-robin", BS, logs)
    try:
        rr = converse(router, network, replicas[:2], seed=5000)  # the same shapes, new text
    finally:
        router.kill()
    ca = cache_aware
    print(f"\ncached share: cache-aware {ca.cached_share:.3f}, round-robin {rr.cached_share:.3f}")
    assert rr.stats["decisions"] == {"round_robin": USERS * TURNS}
    assert all(len(set(h)) == 2 for h in rr.homes.values()), rr.homes  # moved every turn
    assert sum(map(sum, rr.prompt)) == pytest.approx(sum(map(sum, ca.prompt)), rel=0.05)
    assert rr.cached_share < ca.cached_share, (rr.cached, ca.cached)
    assert sum(rr.cached[1]) < sum(ca.cached[1])  # turn 2 lands where turn 1 never was


def test_a_killed_replica_loses_no_request(
    network: Network, replicas: list[NetReplica], tiny_llama: Path, logs: Path
) -> None:
    doomed, steady = replicas[2], replicas[0]
    router = start_router(network, [doomed, steady], tiny_llama, "round-robin", BS, logs)
    try:
        _route_through_a_dying_replica(router, doomed)
    finally:
        router.kill()
        doomed.kill()


def _route_through_a_dying_replica(router: NetRouter, doomed: NetReplica) -> None:
    model = httpx.get(f"{doomed.url}/v1/models", timeout=10).json()["data"][0]["id"]
    # SIGKILL: its connections across the bridge are reset mid-request
    route_through_a_dying_replica(router.url, router.stats, model, doomed.kill)
