// The radixcache dashboard: polls /v1/cache/stats, /v1/cache/stats/history and /dashboard/data
// every few seconds and draws them with plotly.js (served by this server, no CDN).
"use strict";

const REFRESH_MS = 3000;
const TIER_ORDER = ["device", "host", "disk", "redis"];
const PLOT_CONFIG = { displayModeBar: false, responsive: true };
const BASE_LAYOUT = {
  margin: { l: 50, r: 55, t: 10, b: 35 },
  legend: { orientation: "h", y: -0.2 },
  font: { size: 11 },
};

const TIME_SERIES = ["hit-rate", "latency", "requests", "tiers"];
const KEY_STORE = "radixcache-dashboard-key";
let busy = false;

function takeKeyFromHash() {
  const match = /(?:^#|&)key=([^&]+)/.exec(window.location.hash);
  if (match) {
    sessionStorage.setItem(KEY_STORE, decodeURIComponent(match[1]));
    history.replaceState(null, "", window.location.pathname + window.location.search);
  }
}

async function api(path, options = {}) {
  const headers = { "content-type": "application/json" };
  const key = sessionStorage.getItem(KEY_STORE);
  if (key) headers.authorization = "Bearer " + key;
  const response = await fetch(path, { ...options, headers });
  const body = await response.json();
  if (!response.ok) {
    throw new Error((body.error && body.error.message) || response.statusText);
  }
  return body;
}

function tiersOf(points, field) {
  const seen = new Set();
  points.forEach((p) => Object.keys(p[field] || {}).forEach((t) => seen.add(t)));
  return [...seen].sort((a, b) => TIER_ORDER.indexOf(a) - TIER_ORDER.indexOf(b));
}

function layout(extra) {
  return { ...BASE_LAYOUT, ...extra };
}

function draw(id, traces, extraLayout) {
  Plotly.react("plot-" + id, traces, layout(extraLayout), PLOT_CONFIG);
  const points = traces.reduce((n, t) => n + (t.x ? t.x.length : 0), 0);
  document.getElementById("panel-" + id).dataset.points = String(points);
}

// Before the first history sample a time-series plot would be empty axes: say what is coming.
function showCollecting(id, intervalS, collecting) {
  const panel = document.getElementById("panel-" + id);
  const plot = document.getElementById("plot-" + id);
  let note = panel.querySelector(".collecting");
  if (!collecting) {
    if (note) note.hidden = true;
    plot.hidden = false;
    return;
  }
  if (!note) {
    note = document.createElement("p");
    note.className = "collecting";
    panel.insertBefore(note, plot);
  }
  note.textContent = `Collecting data: the server samples its counters every ${intervalS} s; ` +
    "this plot starts with the first sample.";
  note.hidden = false;
  Plotly.purge(plot);
  plot.hidden = true;
  panel.dataset.points = "0";
}

function drawTimeSeries(history) {
  const points = history.points;
  TIME_SERIES.forEach((id) => showCollecting(id, history.interval_s, points.length === 0));
  if (points.length === 0) return;
  const x = points.map((p) => new Date(p.end * 1000));
  drawHitRate(points, x);
  drawLatency(points, x);
  drawRequests(points, x);
  drawTiers(points, x);
}

function drawHitRate(points, x) {
  // bars on the base axis, rates on the overlaying one: plotly draws the overlay on top
  const traces = [
    { name: "tokens saved", type: "bar", x, y: points.map((p) => p.tokens_saved), marker: { color: "#9fd8a4" } },
    { name: "tokens computed", type: "bar", x, y: points.map((p) => p.tokens_computed), marker: { color: "#f4b7a6" } },
    { name: "hit rate", mode: "lines+markers", x, y: points.map((p) => p.hit_rate), yaxis: "y2", line: { width: 3, color: "#1d2433" } },
  ];
  tiersOf(points, "hit_rate_by_tier").forEach((tier) => {
    traces.push({ name: tier, mode: "lines+markers", x, y: points.map((p) => (p.hit_rate_by_tier || {})[tier] ?? null), yaxis: "y2" });
  });
  draw("hit-rate", traces, {
    barmode: "stack",
    yaxis: { title: "prompt tokens", side: "right", rangemode: "tozero" },
    yaxis2: { title: "hit rate", overlaying: "y", side: "left", range: [0, 1], tickmode: "linear", tick0: 0, dtick: 0.2 },
  });
}

function drawLatency(points, x) {
  draw("latency", [
    { name: "TTFT p50 (s)", mode: "lines+markers", x, y: points.map((p) => p.ttft_p50_s) },
    { name: "TTFT p99 (s)", mode: "lines+markers", x, y: points.map((p) => p.ttft_p99_s) },
    { name: "output tokens/s", mode: "lines", x, y: points.map((p) => p.output_tokens_per_s), yaxis: "y2" },
  ], {
    yaxis: { title: "seconds", rangemode: "tozero" },
    yaxis2: { title: "tokens/s", overlaying: "y", side: "right", showgrid: false, rangemode: "tozero" },
  });
}

function drawRequests(points, x) {
  draw("requests", [
    { name: "running", mode: "lines", x, y: points.map((p) => p.running), line: { shape: "hv" } },
    { name: "waiting", mode: "lines", x, y: points.map((p) => p.waiting), line: { shape: "hv" } },
  ], { yaxis: { title: "requests", rangemode: "tozero" } });
}

function drawTiers(points, x) {
  const traces = [];
  tiersOf(points, "occupancy").forEach((tier) => {
    traces.push({ name: tier + " occupancy", mode: "lines", x, y: points.map((p) => (p.occupancy || {})[tier]) });
  });
  tiersOf(points, "evictions_by_tier").forEach((tier) => {
    traces.push({ name: tier + " evictions", type: "bar", x, y: points.map((p) => (p.evictions_by_tier || {})[tier] ?? 0), yaxis: "y2", opacity: 0.6 });
  });
  draw("tiers", traces, {
    yaxis: { title: "occupancy", range: [0, 1] },
    yaxis2: { title: "blocks evicted", overlaying: "y", side: "right", showgrid: false, rangemode: "tozero" },
  });
}

function drawCurve(stats, advice, spill) {
  const curve = stats.miss_ratio_curve || [];
  const now = curve.filter((p) => p.size_ratio === 1);
  const withTiers = spill && spill.size_ratio ? [spill] : [];
  draw("mrc", [
    { name: "estimated hit rate", mode: "lines+markers", x: curve.map((p) => p.size_ratio), y: curve.map((p) => p.hit_rate),
      text: curve.map((p) => p.size_blocks + " blocks"), hovertemplate: "%{x}x (%{text}): %{y:.3f}<extra></extra>" },
    { name: "this pool", mode: "markers", x: now.map((p) => p.size_ratio), y: now.map((p) => p.hit_rate),
      marker: { size: 12, color: "#d62728" } },
    { name: "device + spill tiers", mode: "markers", x: withTiers.map((p) => p.size_ratio), y: withTiers.map((p) => p.hit_rate),
      marker: { size: 12, symbol: "diamond", color: "#9467bd" } },
  ], {
    xaxis: { title: "pool size / current", type: "log", tickvals: curve.map((p) => p.size_ratio) },
    yaxis: { title: "hit rate", range: [0, 1] },
  });
  document.getElementById("advice").textContent = advice;
  document.getElementById("spill-advice").textContent = spill ? spill.line : "";
}

function drawTenants(tenants) {
  const x = tenants.map((t) => t.tenant);
  draw("tenants", [
    { name: "since start", type: "bar", x, y: tenants.map((t) => t.hit_rate) },
    { name: "last 5 min", type: "bar", x, y: tenants.map((t) => t.window_hit_rate) },
  ], { barmode: "group", yaxis: { title: "hit rate", range: [0, 1] } });
}

function cell(row, text, className) {
  const td = row.insertCell();
  td.textContent = text;
  if (className) td.className = className;
  return td;
}

async function pinRow(prefix, pin) {
  const body = JSON.stringify({ prompt: prefix.pin_tokens, cache_salt: prefix.cache_salt });
  try {
    await api(pin ? "/v1/cache/pin" : "/v1/cache/unpin", { method: "POST", body });
    await refresh();
  } catch (err) {
    showError(err);
  }
}

function drawPrefixes(prefixes, isAdmin) {
  const body = document.querySelector("#prefixes tbody");
  body.replaceChildren();
  prefixes.forEach((p) => {
    const row = body.insertRow();
    cell(row, p.tenant);
    cell(row, p.preview, "preview").title = p.preview;
    cell(row, String(p.num_tokens), "num");
    cell(row, String(p.hits), "num");
    cell(row, String(p.tokens_saved), "num");
    cell(row, p.pinned ? "yes" : "no", "pinned");
    cell(row, p.last_used ? new Date(p.last_used).toLocaleTimeString() : "-");
    const actions = row.insertCell();
    if (isAdmin) {
      const button = document.createElement("button");
      const whole = p.pins_whole_prefix ? "" : " first " + p.pin_tokens.length + " tokens";
      button.textContent = (p.pinned ? "unpin" : "pin") + whole;
      button.className = p.pinned ? "unpin" : "pin";
      button.addEventListener("click", () => pinRow(p, !p.pinned));
      actions.appendChild(button);
    }
  });
  document.getElementById("panel-prefixes").dataset.points = String(prefixes.length);
}

const TOP_KEYS = 10;

function drawKeys(keys) {
  // the caller's keys from /v1/cache/stats, busiest first (sorted again: a JS object puts
  // integer-like keys first); the keys folded away are summed in "other"
  const body = document.querySelector("#keys tbody");
  body.replaceChildren();
  const rows = Object.entries(keys.keys)
    .sort(([a, x], [b, y]) => y.requests - x.requests || (a < b ? -1 : 1))
    .slice(0, TOP_KEYS);
  rows.forEach(([label, k]) => {
    const row = body.insertRow();
    cell(row, label, "key");
    cell(row, k.tenant ?? "-");
    cell(row, String(k.requests), "num");
    cell(row, String(k.prompt_tokens), "num");
    cell(row, String(k.cached_tokens), "num");
    cell(row, percent(k.hit_rate), "num");
  });
  const more = keys.tracked_keys - rows.length;
  const folded = keys.folded_keys
    ? `${keys.folded_keys} keys folded into other (${keys.other.requests} requests, hit rate ${percent(keys.other.hit_rate)}); `
    : "";
  document.getElementById("keys-other").textContent =
    (more > 0 ? `${more} more keys tracked; ` : "") + folded + `at most ${keys.max_keys} keys are counted apart.`;
  document.getElementById("panel-keys").dataset.points = String(rows.length);
}

function percent(rate) {
  return (100 * rate).toFixed(2) + "%";
}

function drawHeadline(stats, data) {
  const hit = document.getElementById("hit-rate");
  hit.textContent = percent(stats.since_start.hit_rate);
  hit.dataset.value = String(stats.since_start.hit_rate);
  document.getElementById("window-hit-rate").textContent = percent(stats.window.hit_rate);
  document.getElementById("tokens-saved").textContent = stats.since_start.tokens_saved.toLocaleString();
  document.getElementById("requests-now").textContent = stats.requests.running + " / " + stats.requests.waiting;
  drawSpeculative(stats.speculative);
  drawLayerTypes(stats.layer_types);
  document.getElementById("updated").textContent = new Date().toLocaleTimeString();
  document.getElementById("model").textContent = data.model;
  const who = data.caller.is_admin ? "admin: every tenant" : "tenant: " + (data.caller.tenant ?? "(none)");
  document.getElementById("who").textContent = who;
}

function drawSpeculative(spec) {
  const box = document.getElementById("spec-acceptance");
  box.dataset.value = String(spec.acceptance_rate);
  if (!spec.num_drafts) {
    box.textContent = "no drafts";
    box.title = "";
    return;
  }
  box.textContent = percent(spec.acceptance_rate) + " / " + spec.mean_accepted_length.toFixed(2);
  box.title = "acceptance by draft position: " + spec.acceptance_per_pos.map(percent).join(", ");
}

function drawLayerTypes(layers) {
  // a model with sliding-window layers: their pool, and how much of the full layers' hits they kept
  if (!layers) return;
  const win = layers.sliding_window;
  const full = layers.full_attention;
  document.getElementById("layer-types-figure").hidden = false;
  const box = document.getElementById("layer-types");
  box.textContent = win.referenced + " / " + win.cached + " / " + win.num_blocks;
  const kept = full.hit_tokens ? percent(win.hit_tokens / full.hit_tokens) : "-";
  box.title = "window " + win.window + " tokens; " + win.tombstones + " cached blocks without their " +
    "windowed half; windowed layers kept " + kept + " of the full-attention layers' hit tokens";
}

function showError(err) {
  const box = document.getElementById("error");
  box.textContent = String(err.message || err);
  box.hidden = false;
}

async function refresh() {
  if (busy) return;
  busy = true;
  try {
    const [stats, history, data] = await Promise.all([
      api("/v1/cache/stats"),
      api("/v1/cache/stats/history"),
      api("/dashboard/data"),
    ]);
    drawHeadline(stats, data);
    drawTimeSeries(history);
    drawCurve(stats, data.sizing_advice, data.spill_estimate);
    drawTenants(data.tenants);
    drawPrefixes(data.prefixes, data.caller.is_admin);
    drawKeys(stats.prompt_cache_keys);
    document.getElementById("error").hidden = true;
    document.body.dataset.refreshes = String(Number(document.body.dataset.refreshes || 0) + 1);
  } catch (err) {
    showError(err);
  } finally {
    busy = false;
  }
}

document.getElementById("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(KEY_STORE, document.getElementById("key").value);
  refresh();
});
takeKeyFromHash();
refresh();
setInterval(refresh, REFRESH_MS);
