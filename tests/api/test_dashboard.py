"""The operators' dashboard in a real headless Chromium (Debian's, driven by playwright) against a
real server: every panel draws data, the hit rate shown is /v1/cache/stats's, no console errors,
a tenant sees only its own prefixes, the admin pins from the page. Also the history endpoint's
bounds and the offline /docs page."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from api.auth import Caller
from api.config import ApiConfig
from api.observability.dashboard.view import (
    owned_salts,
    sizing_advice,
    spill_estimate,
    tenant_of_salt,
)
from api.observability.engine_stats import CacheCounters, NamespaceCounters, TierOccupancy
from api.observability.stats_history import StatsHistory
from radixcache.stats import MissRatioPoint
from storage.config import TierConfig
from tests.api.servers import ADMIN_KEY, API_KEYS, Server, engine_config, fresh_text, start_server

PANELS = ("hit-rate", "latency", "requests", "tiers", "mrc", "tenants", "keys", "prefixes")
# the picture the README shows; refreshed when RADIXCACHE_SCREENSHOT=1 (a run elsewhere keeps it)
SCREENSHOT = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "dashboard.png"
ALICE = "ALICE-SECRET-PROMPT " + fresh_text(45, 301)  # 65 tokens: 4 cached blocks
BOB = "BOB-SECRET-PROMPT " + fresh_text(47, 302)
SPILL = "ADMIN-SPILLED-PROMPT " + fresh_text(60, 303)
ALICE_KEY, BOB_KEY = "alice-support-chat", "bob-batch-job"  # their prompt_cache_keys
TIMEOUT_MS = 30_000


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def chromium_path() -> str:
    for candidate in (os.environ.get("RADIXCACHE_CHROMIUM"), "/usr/lib/chromium/chromium"):
        if candidate and Path(candidate).is_file():
            return candidate
    found = shutil.which("chromium")
    assert found, "chromium is missing: run scripts/ensure_chromium.sh (make install-dev)"
    return found


def poll(check: Callable[[], Any], timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)  # polling interval
    raise AssertionError("condition not met before the deadline")


def _send_traffic(handle: Server, rounds: int) -> None:
    """Hits and misses over several sampling intervals: each tenant's prompt again (a hit after
    the first), a fresh one (a miss), and an admin prompt flushed to the host tier each round (a
    host-tier hit from the second round on)."""
    admin = bearer(ADMIN_KEY)
    with httpx.Client(base_url=handle.url, timeout=60.0) as client:

        def complete(key: str, prompt: str, cache_key: str | None = None) -> None:
            body = {"model": handle.model, "prompt": prompt, "max_tokens": 4}
            if cache_key is not None:
                body["prompt_cache_key"] = cache_key
            r = client.post("/v1/completions", json=body, headers=bearer(key))
            assert r.status_code == 200, r.text

        def samples_held() -> int:
            r = client.get("/v1/cache/stats/history", headers=admin)
            return r.json()["samples_held"]

        def spill_in_host() -> bool:
            r = client.post("/v1/cache/lookup", json={"prompt": SPILL}, headers=admin)
            return r.json()["cached_tokens_by_tier"].get("host", 0) > 0

        for i in range(rounds):
            held = samples_held()
            complete("sk-alice", ALICE, ALICE_KEY)
            complete("sk-alice", fresh_text(40, 400 + i))
            complete("sk-bob", BOB, BOB_KEY)
            complete(ADMIN_KEY, SPILL)
            r = client.post("/v1/cache/flush", json={"cache_salt": ""}, headers=admin)
            assert r.status_code == 200 and r.json()["flushed_blocks"] > 0
            poll(spill_in_host)
            poll(lambda held=held: samples_held() > held)  # the next round: a later interval


@pytest.fixture(scope="module")
def dash_server(tiny_llama: Path) -> Iterator[Server]:
    cfg = ApiConfig(
        api_keys=dict(API_KEYS), admin_key=ADMIN_KEY, stats_interval_s=0.5, stats_history_s=60
    )
    tiers = TierConfig(host_bytes=16 << 20)
    handle = start_server(engine_config(tiny_llama, tiers=tiers), cfg)
    _send_traffic(handle, rounds=4)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=chromium_path(), headless=True)
        yield launched
        launched.close()


class Dashboard:
    """One page of the dashboard, opened with a key, that records console errors."""

    def __init__(self, browser: Browser, url: str, key: str) -> None:
        self.context = browser.new_context(viewport={"width": 1400, "height": 1100})
        self.page: Page = self.context.new_page()
        self.errors: list[str] = []
        self.outside: list[str] = []  # requests to anywhere but this server (no CDN)
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on(
            "request",
            lambda r: r.url.startswith((url, "data:")) or self.outside.append(r.url),
        )
        self.page.goto(f"{url}/dashboard#key={key}")
        self.wait_ready()

    def wait_ready(self) -> None:
        script = "ids => ids.every(id => Number(document.getElementById('panel-' + id)" + (
            ".dataset.points || 0) > 0) && Number(document.body.dataset.refreshes || 0) > 0"
        )
        self.page.wait_for_function(script, arg=list(PANELS), timeout=TIMEOUT_MS)

    def traces(self, panel: str) -> list[dict]:
        return self.page.evaluate(
            "id => document.getElementById('plot-' + id).data.map(t => ({name: t.name, "
            "x: Array.from(t.x || []).map(String), y: Array.from(t.y || [])}))",
            panel,
        )

    def close(self) -> None:
        self.context.close()


@pytest.fixture()
def open_dashboard(browser: Browser, dash_server: Server) -> Iterator[Callable[[str], Dashboard]]:
    pages: list[Dashboard] = []

    def open_with(key: str) -> Dashboard:
        pages.append(Dashboard(browser, dash_server.url, key))
        return pages[-1]

    yield open_with
    for page in pages:
        page.close()


def test_admin_sees_every_panel_with_the_stats_numbers(open_dashboard, dash_server) -> None:
    dash = open_dashboard(ADMIN_KEY)
    page = dash.page
    stats = httpx.get(f"{dash_server.url}/v1/cache/stats", headers=bearer(ADMIN_KEY)).json()
    rate = stats["since_start"]["hit_rate"]
    assert 0 < rate < 1
    shown = page.locator("#hit-rate")
    assert float(shown.get_attribute("data-value")) == rate
    assert shown.inner_text() == f"{100 * rate:.2f}%"
    spec = stats["speculative"]  # sampled answers: drafts rarely match, there may be none
    shown_spec = page.locator("#spec-acceptance")
    assert float(shown_spec.get_attribute("data-value")) == spec["acceptance_rate"]
    rate_text = f"{100 * spec['acceptance_rate']:.2f}% / {spec['mean_accepted_length']:.2f}"
    assert shown_spec.inner_text() == (rate_text if spec["num_drafts"] else "no drafts")
    hit_traces = {t["name"]: t for t in dash.traces("hit-rate")}
    assert {"hit rate", "device", "host", "tokens saved", "tokens computed"} <= set(hit_traces)
    assert max(v or 0 for v in hit_traces["host"]["y"]) > 0
    assert max(v or 0 for v in hit_traces["hit rate"]["y"]) > 0
    assert sum(hit_traces["tokens saved"]["y"]) > 0 and sum(hit_traces["tokens computed"]["y"]) > 0
    latency = {t["name"]: t for t in dash.traces("latency")}
    assert any(v is not None and v > 0 for v in latency["TTFT p50 (s)"]["y"])
    tiers = {t["name"]: t for t in dash.traces("tiers")}
    assert {"device occupancy", "host occupancy", "device evictions"} <= set(tiers)
    assert max(v or 0 for v in tiers["host occupancy"]["y"]) > 0
    assert sum(tiers["device evictions"]["y"]) > 0
    curve = next(t for t in dash.traces("mrc") if t["name"] == "estimated hit rate")
    assert [float(x) for x in curve["x"]] == [p["size_ratio"] for p in stats["miss_ratio_curve"]]
    assert curve["y"] == [p["hit_rate"] for p in stats["miss_ratio_curve"]]
    advice = page.locator("#advice").inner_text()
    assert (
        advice
        == httpx.get(f"{dash_server.url}/dashboard/data", headers=bearer(ADMIN_KEY)).json()[
            "sizing_advice"
        ]
    )
    assert page.locator(".collecting:visible").count() == 0  # samples exist: plots, no note
    tenants = dash.traces("tenants")[0]
    assert {"alice", "bob"} <= set(tenants["x"])
    table = page.locator("#prefixes").inner_text()
    assert "ALICE-SECRET-PROMPT" in table and "BOB-SECRET-PROMPT" in table
    keys = stats["prompt_cache_keys"]["keys"]
    alice_row = page.locator("#keys tbody tr", has_text=ALICE_KEY)
    assert alice_row.locator("td").all_inner_texts() == [
        f"tenant:alice|{ALICE_KEY}",
        "alice",
        "4",
        str(keys[f"tenant:alice|{ALICE_KEY}"]["prompt_tokens"]),
        str(keys[f"tenant:alice|{ALICE_KEY}"]["cached_tokens"]),
        f"{100 * keys[f'tenant:alice|{ALICE_KEY}']['hit_rate']:.2f}%",
    ]
    assert BOB_KEY in page.locator("#keys").inner_text()
    shot = page.screenshot(full_page=True)
    assert shot.startswith(b"\x89PNG")
    if os.environ.get("RADIXCACHE_SCREENSHOT") == "1":
        SCREENSHOT.write_bytes(shot)
    assert dash.errors == [] and dash.outside == []


def test_before_the_first_sample_the_plots_say_data_is_being_collected(
    browser: Browser, tiny_llama: Path
) -> None:
    # a sampling interval longer than the test: the history holds no point while the page is open
    cfg = ApiConfig(stats_interval_s=600, stats_history_s=1200)
    handle = start_server(engine_config(tiny_llama), cfg)
    context = browser.new_context(viewport={"width": 1400, "height": 1100})
    try:
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"{handle.url}/dashboard")
        page.wait_for_function("Number(document.body.dataset.refreshes || 0) > 0")
        assert httpx.get(f"{handle.url}/v1/cache/stats/history").json()["points"] == []
        for panel in ("hit-rate", "latency", "requests", "tiers"):
            note = page.locator(f"#panel-{panel} .collecting")
            assert note.is_visible(), panel
            assert "Collecting data" in note.inner_text() and "600 s" in note.inner_text()
            assert page.locator(f"#plot-{panel}").is_hidden(), panel
            assert page.locator(f"#plot-{panel} .main-svg").count() == 0  # no empty axes
        assert page.locator("#plot-mrc .main-svg").count() > 0  # the curve needs no history
        assert errors == []
    finally:
        context.close()
        handle.stop()


def test_tenant_sees_only_its_own_prefixes(open_dashboard) -> None:
    dash = open_dashboard("sk-alice")
    page = dash.page
    html = page.content()
    assert "ALICE-SECRET-PROMPT" in page.locator("#prefixes").inner_text()
    assert "BOB-SECRET-PROMPT" not in html and "bob" not in dash.traces("tenants")[0]["x"]
    assert page.locator("#keys tbody td.key").all_inner_texts() == [ALICE_KEY]
    assert BOB_KEY not in html
    assert dash.traces("tenants")[0]["x"] == ["alice"]
    assert page.locator("#prefixes button").count() == 0  # pinning is the admin's
    assert "tenant: alice" in page.locator("#who").inner_text()
    assert dash.errors == []


def _alice_row_pinned(url: str) -> bool | None:
    rows = httpx.get(f"{url}/v1/cache/prefixes", headers=bearer(ADMIN_KEY)).json()["data"]
    alice = [r for r in rows if r["preview"].startswith("ALICE-SECRET-PROMPT") and r["hits"]]
    return alice[0]["pinned"] if alice else None


def test_admin_pins_and_unpins_from_the_page(open_dashboard, dash_server) -> None:
    dash = open_dashboard(ADMIN_KEY)
    row = dash.page.locator("#prefixes tbody tr", has_text="ALICE-SECRET-PROMPT").first
    assert _alice_row_pinned(dash_server.url) is False
    row.locator("button.pin").click()
    poll(lambda: _alice_row_pinned(dash_server.url) is True)
    stats = httpx.get(f"{dash_server.url}/v1/cache/stats", headers=bearer(ADMIN_KEY)).json()
    assert stats["device"]["pinned"] >= 4  # the prompt's 4 blocks
    pinned_row = dash.page.locator("#prefixes tbody tr", has_text="ALICE-SECRET-PROMPT").first
    pinned_row.locator("td.pinned", has_text="yes").wait_for(timeout=TIMEOUT_MS)
    pinned_row.locator("button.unpin").click()
    poll(lambda: _alice_row_pinned(dash_server.url) is False)
    assert dash.errors == []


def test_dashboard_data_filters_by_caller(dash_server) -> None:
    with httpx.Client(base_url=dash_server.url, timeout=30.0) as client:
        assert client.get("/dashboard/data").status_code == 401
        bob = client.get("/dashboard/data", headers=bearer("sk-bob")).json()
        assert [t["tenant"] for t in bob["tenants"]] == ["bob"]
        assert bob["prefixes"] and all(p["tenant"] == "bob" for p in bob["prefixes"])
        assert all("pin_tokens" not in p for p in bob["prefixes"])
        admin = client.get("/dashboard/data", headers=bearer(ADMIN_KEY)).json()
        assert {"alice", "bob"} <= {t["tenant"] for t in admin["tenants"]}
        assert admin["sizing_advice"]
        # the page and its assets need no key (they carry no data) and come from this server
        html = client.get("/dashboard").text
        assert "https://" not in html and "http://" not in html
        js = client.get("/dashboard/assets/plotly.min.js")
        assert js.status_code == 200 and len(js.content) > 1_000_000
        assert client.get("/dashboard/assets/..%2Fapp.py").status_code == 404


@pytest.mark.parametrize(
    "params",
    [
        {"seconds": -1},
        {"seconds": 0},
        {"seconds": 1e12},
        {"seconds": "nan"},
        {"seconds": "soon"},
        {"seconds": 10, "step_s": 0.01},
        {"seconds": 10, "step_s": 11},
        {"step_s": -5},
    ],
)
def test_history_rejects_bad_ranges(dash_server, params) -> None:
    r = httpx.get(
        f"{dash_server.url}/v1/cache/stats/history", params=params, headers=bearer("sk-alice")
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_history_points_are_intervals(dash_server) -> None:
    url = f"{dash_server.url}/v1/cache/stats/history"
    body = httpx.get(url, params={"seconds": 30, "step_s": 1}, headers=bearer("sk-bob")).json()
    points = body["points"]
    assert body["step_s"] == 1 and points
    for a, b in zip(points, points[1:], strict=False):
        assert b["start"] == a["end"] and b["end"] - b["start"] >= 0.99
    for p in points:
        assert p["tokens_saved"] == p["hit_tokens"]
        if p["query_tokens"]:
            assert 0 <= p["hit_rate"] <= 1
        else:  # no lookups: no hit rate, rather than a misleading 0
            assert p["hit_rate"] is None
    assert body["samples_held"] <= body["max_samples"] == 2 + 60 / 0.5


def test_history_ring_stays_bounded() -> None:
    history: StatsHistory[CacheCounters] = StatsHistory(keep_s=3600, interval_s=5)
    for i in range(10_000):  # far more samples than an hour holds, some out of turn
        history.record(i * 0.5, CacheCounters(query_tokens=i))
    assert len(history) == history.max_samples == 2 + 720
    assert [s.counters.query_tokens for s in history.since(4990.0)][0] == 9980


def test_docs_are_served_offline(http) -> None:
    html = http.get("/docs").text
    assert "cdn" not in html.lower() and "https://" not in html
    for asset in ("/docs/assets/swagger-ui-bundle.js", "/docs/assets/swagger-ui.css"):
        assert asset in html
        r = http.get(asset)
        assert r.status_code == 200 and len(r.content) > 10_000
    assert http.get("/openapi.json").json()["paths"]["/v1/cache/stats/history"]
    assert http.get("/redoc").status_code == 404  # ReDoc loads from a CDN only: off


def _curve(*rates: float) -> list[MissRatioPoint]:
    ratios = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
    return [MissRatioPoint(int(r * 1000), r, h) for r, h in zip(ratios, rates, strict=True)]


def test_sizing_advice_reads_the_curve() -> None:
    growing = _curve(0.3, 0.5, 0.61, 0.68, 0.7, 0.7)
    assert sizing_advice(growing, 0.6) == (
        "Doubling the pool (1000 -> 2000 blocks) would raise the hit rate from 0.61 to 0.68."
    )
    assert "halving it (1000 -> 500 blocks)" in sizing_advice(_curve(*[0.8] * 6), 0.8)
    assert "large enough" in sizing_advice(_curve(0.2, 0.6, 0.8, 0.805, 0.81, 0.81), 0.8)
    assert "Too few sampled lookups" in sizing_advice(_curve(*[1.0] * 6), 0.5)
    assert "No miss-ratio curve" in sizing_advice([], None)


def test_tenant_of_salt() -> None:
    assert tenant_of_salt("tenant:alice") == "alice"
    assert tenant_of_salt("tenant:alice|chat-7") == "alice"
    assert tenant_of_salt("") == tenant_of_salt("my-salt") == "(no tenant)"


def test_spill_estimate_reads_the_curve_at_the_tiers_size() -> None:
    curve = _curve(0.3, 0.5, 0.6, 0.7, 0.8, 0.9)
    device = TierOccupancy(used_blocks=10, capacity_blocks=1000)
    host = TierOccupancy(used_bytes=0, capacity_bytes=1000 * 4096, block_bytes=4096)
    within = spill_estimate(curve, {"device": device, "host": host})
    assert within["size_ratio"] == 2.0 and within["hit_rate"] == 0.7
    assert "host 1000 blocks" in within["line"] and "2.0x" in within["line"]
    mid = spill_estimate(curve, {"device": device, "host": TierOccupancy(0, None, 0, 2**21, 2**11)})
    assert mid["size_ratio"] == 2.024 and 0.7 < mid["hit_rate"] < 0.8  # log-interpolated
    disk = TierOccupancy(used_bytes=0, capacity_bytes=100_000 * 4096, block_bytes=4096)
    beyond = spill_estimate(curve, {"device": device, "disk": disk})
    assert beyond["hit_rate"] == 0.9 and "beyond the curve" in beyond["line"]
    redis = TierOccupancy(used_bytes=5, capacity_bytes=None, block_bytes=4096)
    assert "no budget" in spill_estimate(curve, {"device": device, "redis": redis})["line"]
    unwritten = TierOccupancy(used_bytes=0, capacity_bytes=4096)
    assert "no block yet" in spill_estimate(curve, {"device": device, "host": unwritten})["line"]
    assert spill_estimate(curve, {"device": device}) is None
    far_off = spill_estimate(curve, {"device": device, "host": host}, measured=0.1)
    assert "more samples" in far_off["line"] and "hit_rate" not in far_off


def test_owned_salts_are_the_callers_busiest() -> None:
    spaces = {f"ns{i}": NamespaceCounters(f"tenant:alice|{i}", query_tokens=i) for i in range(40)}
    spaces["bob"] = NamespaceCounters("tenant:bob", query_tokens=10**6)
    total = CacheCounters(namespaces=spaces)
    alice = owned_salts(total, Caller(tenant="alice", is_admin=False), most=3)
    assert alice == ["tenant:alice|39", "tenant:alice|38", "tenant:alice|37"]
    assert owned_salts(total, Caller(tenant="bob", is_admin=False)) == ["tenant:bob"]


def test_docs_render_in_the_browser(browser: Browser, dash_server: Server) -> None:
    context = browser.new_context()
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda m: m.type == "error" and errors.append(m.text))
    page.on("pageerror", lambda e: errors.append(str(e)))
    outside: list[str] = []
    page.on("request", lambda r: r.url.startswith(dash_server.url) or outside.append(r.url))
    page.goto(f"{dash_server.url}/docs")
    page.locator(".opblock-summary-path", has_text="/tokenize").first.wait_for(timeout=TIMEOUT_MS)
    assert page.locator(".opblock").count() >= 10
    context.close()
    assert errors == [] and outside == []
