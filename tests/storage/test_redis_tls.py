"""Redis over TLS (`rediss://`, `rediss+cluster://`) with an ACL user: the spill tier works end to
end against real TLS redis-servers that trust a test CA, a client that does not trust the server
degrades to recomputation, and no credential shows in the banner, stats, metrics or errors."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from radixcache.hashing import Namespace
from storage.redis_nodes import ClusterAddress, parse_cluster_url, redacted_url
from storage.redis_tier import RedisTier
from tests.api.servers import flush_until_in_tier, fresh_text
from tests.redis_cluster import running_cluster
from tests.redis_server import RedisServer, TlsFiles, make_tls_files
from tests.serve_process import tiny_redis_serve
from tests.storage.blocks import chain, encoded

USER, SECRET = "alice", "tls-S3cret-pw"
NS = Namespace("tls-model", "bfloat16", 4)


@pytest.fixture
def tls(tmp_path: Path) -> TlsFiles:
    return make_tls_files(tmp_path / "tls")


@pytest.fixture
def tls_redis(tmp_path: Path, tls: TlsFiles):
    (tmp_path / "redis").mkdir()
    server = RedisServer(tmp_path / "redis", password=SECRET, username=USER, tls=tls)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_tls_url_options() -> None:
    url = f"rediss+cluster://{USER}:{SECRET}@h1:7000,h2:7001?ssl_ca_certs=/etc/ca.pem"
    assert parse_cluster_url(url) == ClusterAddress(
        (("h1", 7000), ("h2", 7001)),
        USER,
        SECRET,
        ssl=True,
        ssl_options=(("ssl_ca_certs", "/etc/ca.pem"),),
    )
    assert (
        redacted_url(url) == f"rediss+cluster://{USER}:***@h1:7000,h2:7001?ssl_ca_certs=/etc/ca.pem"
    )
    with pytest.raises(ValueError, match="unknown query option") as err:
        parse_cluster_url(f"redis+cluster://{USER}:{SECRET}@h:7000?ssl_ca_certs=/x")  # no TLS
    assert SECRET not in str(err.value)


def test_tier_round_trip_over_tls_with_an_acl_user(tls_redis: RedisServer) -> None:
    tier = RedisTier(tls_redis.url, prefix="tls")
    hashes = chain(NS, 8)
    items = encoded(hashes)
    tier.put(NS, items)
    assert tier.get(NS, hashes) == [v for _, v in items]
    assert tls_redis.client().dbsize() == 8  # really stored, through the TLS port
    tier.close()


def test_untrusted_or_plain_clients_miss_and_never_leak(tls_redis: RedisServer, tmp_path) -> None:
    other_ca = make_tls_files(tmp_path / "other")
    port = tls_redis.port
    for url in (
        f"rediss://{USER}:{SECRET}@127.0.0.1:{port}/0?ssl_ca_certs={other_ca.ca_cert}",
        f"redis://{USER}:{SECRET}@127.0.0.1:{port}/0",  # plain text to a TLS-only port
        f"rediss://{USER}:wrong-{SECRET}@127.0.0.1:{port}/0?ssl_ca_certs={tls_redis.tls.ca_cert}",
    ):
        tier = RedisTier(url, socket_timeout_s=1.0)
        hashes = chain(NS, 2)
        tier.put(NS, encoded(hashes))  # dropped and counted, not raised
        assert tier.get(NS, hashes) == [None, None]
        snap = tier.stats.snapshot()
        assert snap["errors"] > 0
        assert SECRET not in repr(snap)
        tier.close()
    assert tls_redis.client().dbsize() == 0


def test_tier_on_a_tls_cluster(tmp_path: Path, tls: TlsFiles) -> None:
    with running_cluster(tmp_path / "cluster", tls=tls) as cluster:
        assert cluster.url.startswith("rediss+cluster://")
        tier = RedisTier(cluster.url, prefix="tls-cluster")
        hashes = chain(NS, 30)
        items = encoded(hashes)
        tier.put(NS, items)
        assert tier.get(NS, hashes) == [v for _, v in items]
        per_node = [node.client().dbsize() for node in cluster.nodes]
        assert sum(per_node) == 30 and min(per_node) > 0, per_node
        tier.close()


@pytest.mark.slow
def test_serve_over_tls_with_credentials(tiny_llama: Path, tmp_path: Path, tls_redis) -> None:
    server = tiny_redis_serve(tiny_llama, tls_redis.url, tmp_path / "home")
    seen: list[str] = []
    try:
        server.wait_healthy()
        with httpx.Client(base_url=server.url, timeout=60) as client:
            prompt = fresh_text(64, seed=11)
            body = {"model": tiny_llama.name, "prompt": prompt, "max_tokens": 4, "temperature": 0}
            first = client.post("/v1/completions", json=body)
            assert first.status_code == 200
            flush_until_in_tier(client, prompt, "redis")
            again = client.post("/v1/completions", json=body).json()
            assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
            assert again["choices"][0]["text"] == first.json()["choices"][0]["text"]
            seen += [client.get("/v1/cache/stats").text, client.get("/metrics").text]
    finally:
        seen.append(server.terminate())
    assert f"rediss://{USER}:***@" in seen[-1]  # the banner names the tier, redacted
    for text in seen:
        assert SECRET not in text
