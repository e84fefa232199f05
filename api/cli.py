"""`radixcache` command line: `serve` (the HTTP server), `route` (a cache-aware router in front of
several servers) and `pull` (fetch a named model: the default one or gemma3-270m)."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any, get_args

from api.config import METRIC_NAMES, ApiConfig
from api.openai.tool_parsers import PARSERS
from api.router.config import RouterConfig
from api.router.discovery import DnsReplicas
from api.router.policy import POLICIES, Balance
from engine.config import EVICTION_POLICIES, EngineConfig
from engine.dtypes import AUTO, DTYPES
from engine.host_memory import request_huge_pages
from engine.kv.events import KVEventsConfig
from engine.kv.quant import KV_FORMATS
from engine.loader.default_model import DEFAULT_MODEL_NAME, default_cache_dir
from engine.loader.named_models import NAMED_MODELS
from engine.speculative.config import SPECULATIVE_MODES, STEP_COST_MODELS
from radixcache.shared.tier_names import TierName
from storage.config import DiskFsync, TierConfig, WritePolicy

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
# every default below is the config dataclasses' own (one copy of each)
ENGINE, API, TIERS = EngineConfig(), ApiConfig(), TierConfig()


def _default(config: type, name: str) -> Any:
    """A dataclass field's default, for configs that have required fields."""
    return config.__dataclass_fields__[name].default


def parse_size(text: str) -> int:
    """'512M', '2G', '1.5GiB', '1048576' -> bytes."""
    match = _SIZE.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 4096, 512M, 2G)")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def parse_ttl(text: str) -> int:
    """Seconds >= 0 (0: no expiry)."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"not a number of seconds >= 0: {text!r}")
    return int(text)


def human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows '(default: X)' only where there is a meaningful default."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, False, [], argparse.SUPPRESS):
            return action.help
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="radixcache",
        description="An OpenAI-compatible LLM server built around a prefix-caching KV store.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = sub.add_parser(
        "serve",
        help="run the HTTP server (defaults: SmolLM2-135M-Instruct, disk tier, 127.0.0.1:8000)",
        description="Run the OpenAI-compatible server. With no options: the default model "
        "(downloaded on first start), the device KV pool plus a disk tier under the cache folder "
        "($RADIXCACHE_HOME or ~/.cache/radixcache), listening on 127.0.0.1:8000.",
        formatter_class=_HelpFormatter,
    )
    _model_args(serve)
    _tier_args(serve)
    _events_args(serve)
    _server_args(serve)
    _responses_args(serve)
    route = sub.add_parser(
        "route",
        help="run a cache-aware router in front of several replicas",
        description="An OpenAI-compatible front that sends each request to the replica holding "
        "the longest cached prefix of its prompt (from the replicas' KV events), balanced by load.",
        formatter_class=_HelpFormatter,
    )
    _route_args(route)
    _server_args(route)
    pull = sub.add_parser("pull", help="download and convert a named model into the cache")
    pull.add_argument(
        "name", nargs="?", default=DEFAULT_MODEL_NAME, choices=sorted(NAMED_MODELS), help="model"
    )
    pull.add_argument("--cache-dir", type=Path, default=None, help="omitted: the cache folder")
    return parser


def _model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model and KV pool")
    g.add_argument(
        "--model",
        default=None,
        help="Llama-family or Gemma 3 HF folder, or a name fetched on first start: "
        f"{', '.join(sorted(NAMED_MODELS))}; omitted: {DEFAULT_MODEL_NAME}",
    )
    g.add_argument(
        "--served-model-name",
        default=None,
        help="model name clients use; omitted: the model folder's name",
    )
    g.add_argument(
        "--dtype",
        default=ENGINE.dtype,
        choices=[AUTO, *DTYPES],
        help="weights and KV cache dtype; auto: bfloat16 where the CPU has bf16 dot products "
        "(avx512_bf16, AMX) or on CUDA, float32 on other CPUs",
    )
    g.add_argument(
        "--kv-cache-dtype",
        default=ENGINE.kv_cache_dtype,
        choices=[AUTO, *KV_FORMATS],
        help="the device KV pool's rows: auto (the model dtype) or quantized with a scale per "
        "token and head, 1.88x the tokens in the same memory. int8: KL 0.003 nats, perplexity "
        "+0.1%% on the default model (gemma3-270m: 0.006, -0.4%%); fp8_e4m3 and fp8_e5m2 are "
        "experimental (KL 0.013 / 0.042, perplexity +1.2%% / +1.9%%): README, "
        "benchmarks/bench_kv_quant.py",
    )
    g.add_argument("--device", default=ENGINE.device, help="torch device (cpu, cuda)")
    g.add_argument(
        "--deterministic",
        action="store_true",
        help="outputs bit-identical whatever the batch, chunking or cache hits (every token's "
        "attention through the native prefill kernel, matmuls in row-invariant calls; CPU)",
    )
    g.add_argument("--block-size", type=int, default=ENGINE.block_size, help="tokens per KV block")
    g.add_argument(
        "--kv-memory",
        type=parse_size,
        default=ENGINE.kv_cache_memory,
        help="bytes for the device KV pool (e.g. 512M, 2G)",
    )
    g.add_argument("--num-blocks", type=int, default=None, help="KV blocks (overrides --kv-memory)")
    g.add_argument(
        "--num-window-blocks",
        type=int,
        default=ENGINE.num_window_blocks,
        help="blocks of the sliding-window layers' own pool; omitted: sized from the budget",
    )
    g.add_argument(
        "--no-release-window-blocks",
        action="store_true",
        help="sequences keep their sliding-window layers' out-of-window blocks (to measure)",
    )
    g.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="context window in tokens; omitted: the model's",
    )
    g.add_argument(
        "--max-num-seqs", type=int, default=ENGINE.max_num_seqs, help="sequences run together"
    )
    g.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=ENGINE.max_num_batched_tokens,
        help="token budget per step",
    )
    g.add_argument("--no-prefix-caching", action="store_true", help="turn the prefix cache off")
    g.add_argument(
        "--eviction-policy",
        choices=EVICTION_POLICIES,
        default=ENGINE.eviction_policy,
        help="device-pool eviction order (learned: better hit rates on small pools, see README)",
    )
    g.add_argument(
        "--threads", type=int, default=None, help="torch threads; omitted: torch's default"
    )
    g.add_argument(
        "--speculative",
        choices=SPECULATIVE_MODES,
        default=ENGINE.speculative,
        help="speculative decoding drafts: ngram = the request's own prompt and output; cache = "
        "the radix tree's cached continuation, then ngram, then the tenant's finished outputs",
    )
    g.add_argument(
        "--num-speculative-tokens",
        type=int,
        default=ENGINE.num_speculative_tokens,
        help="most draft tokens per sequence and step (the length adapts below it)",
    )
    g.add_argument(
        "--speculative-index-tokens",
        type=int,
        default=ENGINE.speculative_index_tokens,
        help="cache drafts: the most tokens of finished outputs kept to draft from (all tenants; "
        "at most about 300 bytes of memory a token)",
    )
    g.add_argument(
        "--speculative-step-cost",
        choices=STEP_COST_MODELS,
        default=ENGINE.speculative_step_cost,
        help="what a draft row is weighed against: fitted = the decode steps' measured cost; "
        "prior = a fixed share of a step (the same requests draft alike on any machine)",
    )
    g.add_argument(
        "--no-cuda-graphs",
        action="store_true",
        help="CUDA: run every decode step eagerly instead of replaying graphs captured at start",
    )
    g.add_argument(
        "--no-async-scheduling",
        action="store_true",
        help="CUDA: read each step's sampled tokens before scheduling the next step (by default "
        "the next step is scheduled and launched while the GPU still samples)",
    )


def _tier_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("spill tiers below the device pool")
    g.add_argument(
        "--host-tier-bytes",
        type=parse_size,
        default=TIERS.host_bytes,
        help="host RAM tier budget (0 = off)",
    )
    g.add_argument(
        "--disk-path", type=Path, default=None, help="disk tier folder; omitted: <cache folder>/kv"
    )
    g.add_argument("--disk-bytes", type=parse_size, default=TIERS.disk_bytes, help="disk budget")
    g.add_argument("--no-disk", action="store_true", help="no disk tier")
    g.add_argument(
        "--disk-fsync",
        default=TIERS.disk_fsync,
        choices=get_args(DiskFsync),
        help="per-file: fsync each block and its folder (survives power loss; slower writes)",
    )
    g.add_argument(
        "--redis-url",
        default=None,
        help="Redis tier: redis://HOST:PORT/DB, or a Redis Cluster: redis+cluster://HOST:PORT[,...]",
    )
    g.add_argument(
        "--redis-ttl",
        type=parse_ttl,
        default=TIERS.redis_ttl_s,
        help="seconds a block lives in Redis (0: no expiry, Redis's maxmemory-policy evicts)",
    )
    g.add_argument(
        "--retained-bytes",
        type=parse_size,
        default=TIERS.retained_bytes,
        help="budget of the prefixes requests keep for 24 h (prompt_cache_retention: 24h) in the "
        "disk tier, else Redis; past it the oldest lose their retention first (0: off, such "
        "requests get a 400)",
    )
    g.add_argument(
        "--tier-kv-dtype",
        default=TIERS.kv_dtype,
        choices=[AUTO, *KV_FORMATS],
        help="the rows the tiers hold: auto (the device pool's, as they are) or, under a pool of "
        "the model dtype, quantized with a scale per token and head (about half the bytes; loads "
        "dequantize); a quantized pool takes only auto or its own format",
    )
    g.add_argument(
        "--write-policy",
        default=TIERS.write_policy,
        choices=get_args(WritePolicy),
        help="write-back: evicted blocks spill down; write-through: also to Redis at once",
    )


def _events_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("KV cache events (vLLM's format, for routers)")
    g.add_argument(
        "--kv-events-endpoint",
        default=None,
        metavar="tcp://HOST:PORT",
        help="publish every change of the cached set on this ZMQ PUB address",
    )
    g.add_argument(
        "--kv-events-replay-endpoint",
        default=None,
        metavar="tcp://HOST:PORT",
        help="serve replays of past event batches on this ZMQ ROUTER address",
    )
    g.add_argument(
        "--kv-events-topic",
        default=_default(KVEventsConfig, "topic"),
        help="topic of every message",
    )


def _route_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("routing")
    g.add_argument(
        "--replica",
        action="append",
        default=[],
        metavar="http://HOST:PORT[,tcp://HOST:EVENTS[,tcp://HOST:REPLAY]]",
        help="a replica and, optionally, its KV-events and replay addresses (repeatable)",
    )
    g.add_argument(
        "--replicas-dns",
        default=None,
        metavar="NAME:PORT",
        help="find the replicas by resolving NAME (e.g. a Kubernetes headless Service) again and "
        "again: one replica per address, added and dropped as the records change",
    )
    g.add_argument(
        "--replica-events-port",
        type=int,
        default=None,
        help="with --replicas-dns: each replica's KV-events port",
    )
    g.add_argument(
        "--replica-replay-port",
        type=int,
        default=None,
        help="with --replicas-dns: each replica's KV-events replay port",
    )
    g.add_argument(
        "--health-interval",
        type=float,
        default=_default(RouterConfig, "health_interval_s"),
        help="seconds between two rounds of the replicas' /ready checks (a draining replica "
        "leaves the rotation within one)",
    )
    g.add_argument(
        "--dns-interval",
        type=float,
        default=_default(DnsReplicas, "interval_s"),
        help="seconds between two resolutions of --replicas-dns",
    )
    g.add_argument(
        "--policy",
        choices=POLICIES,
        default=_default(RouterConfig, "policy"),
        help="routing policy",
    )
    g.add_argument(
        "--model",
        default=None,
        help="model folder (or fetched model name) whose tokenizer the router uses; omitted: "
        "the default model",
    )
    b = Balance()
    g.add_argument(
        "--balance-abs-threshold", type=int, default=b.abs_threshold, help="load gap that counts"
    )
    g.add_argument(
        "--balance-rel-threshold",
        type=float,
        default=b.rel_threshold,
        help="load ratio that counts",
    )
    g.add_argument(
        "--cache-threshold",
        type=float,
        default=b.cache_threshold,
        help="shortest cached share of the prompt that counts as a hit",
    )
    g.add_argument(
        "--block-size",
        type=int,
        default=_default(RouterConfig, "block_size"),
        help="block size of replicas without events",
    )
    g.add_argument(
        "--shared-response-store",
        action="store_true",
        help="the replicas keep stored responses in one Redis (each served with the same "
        "--redis-url): any replica may answer for a response id the router has not seen",
    )


def _responses_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("/v1/responses store (store=true, previous_response_id)")
    g.add_argument(
        "--responses-store",
        type=Path,
        default=None,
        help="SQLite file of stored responses; omitted: <cache folder>/responses.sqlite",
    )
    g.add_argument(
        "--responses-ttl",
        type=float,
        default=API.responses_ttl_s,
        help="seconds a stored response is kept (OpenAI's: 30 days)",
    )
    g.add_argument(
        "--responses-max",
        type=int,
        default=API.responses_max,
        help="stored responses kept at most (the oldest dropped first)",
    )


def _server_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("HTTP server")
    g.add_argument("--host", default="127.0.0.1", help="address to bind")
    g.add_argument("--port", type=int, default=8000, help="port to bind")
    g.add_argument(
        "--api-key",
        action="append",
        default=[],
        metavar="[TENANT=]KEY",
        help="require this Bearer key (repeatable); a key's tenant gets its own cache",
    )
    g.add_argument(
        "--admin-key", default=None, help="key for /v1/cache/prefixes, flush, pin and unpin"
    )
    g.add_argument(
        "--open-admin",
        action="store_true",
        help="with no keys on a network address: every caller may use the admin endpoints"
        " (without it they are closed there; on loopback they are open anyway)",
    )
    g.add_argument(
        "--max-queue",
        type=int,
        default=API.max_queue,
        help="requests in flight (running + waiting) before 429",
    )
    g.add_argument(
        "--max-body-bytes",
        type=parse_size,
        default=API.max_body_bytes,
        help="larger request bodies get 413",
    )
    g.add_argument(
        "--metrics-names",
        default=API.metrics_names,
        choices=METRIC_NAMES,
        help="/metrics names: ours, or vLLM's for what vLLM also reports (its dashboards work)",
    )
    g.add_argument(
        "--tool-call-parser",
        default=None,
        choices=sorted(PARSERS),
        help="format of the model's tool calls (default: the one its chat template teaches)",
    )
    g.add_argument(
        "--drain-timeout",
        type=float,
        default=API.drain_timeout_s,
        help="seconds running requests get to finish once SIGTERM (or POST /admin/drain) starts a "
        "drain; meanwhile /ready is 503 and new requests get 503 with Retry-After",
    )
    g.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"], help="uvicorn"
    )


def tier_config(args: argparse.Namespace) -> Any:
    from storage.config import TierConfig

    disk_path = None
    if not args.no_disk:
        disk_path = args.disk_path or default_cache_dir() / "kv"
    tiers = TierConfig(
        host_bytes=args.host_tier_bytes,
        disk_path=disk_path,
        disk_bytes=args.disk_bytes,
        disk_fsync=args.disk_fsync,
        redis_url=args.redis_url,
        redis_ttl_s=args.redis_ttl or None,
        write_policy=args.write_policy,
        retained_bytes=args.retained_bytes,
        kv_dtype=args.tier_kv_dtype,
    )
    return tiers if tiers.enabled else None


def engine_config(args: argparse.Namespace, model_path: Path) -> Any:
    from engine.config import EngineConfig

    return EngineConfig(
        model=str(model_path),
        dtype=args.dtype,
        kv_cache_dtype=args.kv_cache_dtype,
        device=args.device,
        block_size=args.block_size,
        kv_cache_memory=args.kv_memory,
        num_blocks=args.num_blocks,
        num_window_blocks=args.num_window_blocks,
        release_window_blocks=not args.no_release_window_blocks,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        enable_prefix_caching=not args.no_prefix_caching,
        eviction_policy=args.eviction_policy,
        num_threads=args.threads,
        tiers=tier_config(args),
        kv_events=events_config(args),
        deterministic=args.deterministic,
        speculative=args.speculative,
        num_speculative_tokens=args.num_speculative_tokens,
        speculative_step_cost=args.speculative_step_cost,
        speculative_index_tokens=args.speculative_index_tokens,
        cuda_graphs=not args.no_cuda_graphs,
        async_scheduling=False if args.no_async_scheduling else None,
    )


def events_config(args: argparse.Namespace) -> Any:
    if args.kv_events_endpoint is None:
        if args.kv_events_replay_endpoint is not None:
            raise ValueError("--kv-events-replay-endpoint needs --kv-events-endpoint")
        return None
    return KVEventsConfig(
        args.kv_events_endpoint, args.kv_events_replay_endpoint, topic=args.kv_events_topic
    )


def api_config(args: argparse.Namespace) -> Any:
    from api.config import ApiConfig, parse_api_keys

    return ApiConfig(
        api_keys=parse_api_keys(args.api_key),
        admin_key=args.admin_key,
        open_admin=admin_open(args),
        served_model_name=args.served_model_name,
        max_queue=args.max_queue,
        max_body_bytes=args.max_body_bytes,
        metrics_names=args.metrics_names,
        tool_call_parser=args.tool_call_parser,
        drain_timeout_s=args.drain_timeout,
        responses_store_path=args.responses_store or default_cache_dir() / "responses.sqlite",
        responses_ttl_s=args.responses_ttl,
        responses_max=args.responses_max,
    )


def describe_tiers(cfg: Any, device_blocks: int | None = None) -> str:
    parts = [TierName.DEVICE + (f" ({device_blocks} blocks)" if device_blocks else "")]
    tiers = cfg.tiers
    if tiers is not None:
        if tiers.host_bytes:
            parts.append(f"host ({human(tiers.host_bytes)})")
        if tiers.disk_path is not None:
            parts.append(f"disk ({tiers.disk_path}, {human(tiers.disk_bytes)})")
        if tiers.redis_url:
            from storage.redis_nodes import redacted_url

            parts.append(f"redis ({redacted_url(tiers.redis_url)}, {tiers.write_policy})")
    if not cfg.enable_prefix_caching:
        return "off (prefix caching disabled)"
    rows = f" ({tiers.kv_dtype} rows)" if tiers is not None and tiers.kv_dtype != AUTO else ""
    return " -> ".join(parts) + rows


def admin_open(args: argparse.Namespace) -> bool:
    """Keyless callers are admins on loopback, elsewhere only with --open-admin."""
    from api.config import is_loopback

    return args.open_admin or is_loopback(args.host)


def describe_auth(acfg: Any, host: str) -> str:
    from api.config import is_loopback

    if not acfg.auth_enabled and acfg.open_admin:
        if not is_loopback(host):
            return (
                f"no API keys and --open-admin: every caller who can reach {host} may use the"
                " admin endpoints (every tenant's prompt previews, flush, pin)"
            )
        return "no API keys: local mode, every caller may use the admin endpoints"
    if not acfg.auth_enabled:
        return (
            f"no API keys: the API is open to every caller on {host}; the admin endpoints and"
            " the dashboard's admin view are closed (bound to a network address: give"
            " --admin-key, or --open-admin to open them to every caller)"
        )
    keys = f"{len(acfg.api_keys)} API key(s)" if acfg.api_keys else "API open (no --api-key)"
    admin = "admin key set" if acfg.admin_key else "admin endpoints disabled (no --admin-key)"
    return f"{keys}; {admin}"


def cmd_pull(args: argparse.Namespace) -> int:
    path = NAMED_MODELS[args.name](args.cache_dir or default_cache_dir(), True)
    print(f"{args.name} ready: {path}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from api.app import create_app
    from api.lifecycle.server import serve

    if args.model is None or args.model in NAMED_MODELS:
        model_path = NAMED_MODELS[args.model or DEFAULT_MODEL_NAME](default_cache_dir(), True)
    else:
        model_path = Path(args.model)
        if not model_path.is_dir():
            print(f"radixcache: --model {model_path} is not a folder", file=sys.stderr)
            return 2
    ecfg = engine_config(args, model_path)
    acfg = api_config(args)
    url = f"http://{args.host}:{args.port}"

    def ready(state: Any) -> None:
        device = state.counters().occupancy.get(TierName.DEVICE)
        blocks = device.capacity_blocks if device is not None else None
        dtype = state.engine.kv_dtype
        print(f"radixcache: serving {state.model_name} ({dtype}) at {url}/v1", flush=True)
        print(f"radixcache: KV cache tiers: {describe_tiers(ecfg, blocks)}", flush=True)
        print(f"radixcache: {describe_auth(acfg, args.host)}", flush=True)
        publisher = state.engine.kv_events
        if publisher is not None:
            replay = publisher.replay_endpoint or "no replay"
            print(f"radixcache: KV events at {publisher.endpoint} ({replay})", flush=True)

    print(f"radixcache: loading {model_path} ...", flush=True)
    app = create_app(ecfg, acfg, on_ready=ready)
    serve(app, args.host, args.port, args.log_level, app.state.drain)
    return 0


def cmd_route(args: argparse.Namespace) -> int:
    import uvicorn

    from api.config import ApiConfig, parse_api_keys
    from api.router.app import create_router_app
    from api.router.config import RouterConfig
    from api.router.replicas import ReplicaSpec

    # the router runs no model: it only reads the folder's tokenizer (no torch import)
    name = args.model or DEFAULT_MODEL_NAME
    folder = default_cache_dir() / "models" / name if name in NAMED_MODELS else Path(name)
    if not (folder / "tokenizer.json").is_file():
        print(f"radixcache: no tokenizer.json in {folder} (run `radixcache pull`)", file=sys.stderr)
        return 2
    acfg = ApiConfig(
        api_keys=parse_api_keys(args.api_key),
        admin_key=args.admin_key,
        open_admin=admin_open(args),
        max_queue=args.max_queue,
        max_body_bytes=args.max_body_bytes,
    )
    dns = None
    if args.replicas_dns is not None:
        dns = DnsReplicas.parse(
            args.replicas_dns,
            events_port=args.replica_events_port,
            replay_port=args.replica_replay_port,
            interval_s=args.dns_interval,
        )
    config = RouterConfig(
        replicas=tuple(ReplicaSpec.parse(r) for r in args.replica),
        replicas_dns=dns,
        health_interval_s=args.health_interval,
        tokenizer=folder,
        policy=args.policy,
        balance=Balance(
            args.balance_abs_threshold, args.balance_rel_threshold, args.cache_threshold
        ),
        api=acfg,
        block_size=args.block_size,
        shared_response_store=args.shared_response_store,
    )
    over = f"{len(config.replicas)} replica(s)"
    if dns is not None:
        over += f" and those {dns.host}:{dns.port} resolves to (every {dns.interval_s:g} s)"
    print(f"radixcache: routing ({args.policy}) at http://{args.host}:{args.port}/v1 over {over}")
    uvicorn.run(create_router_app(config), host=args.host, port=args.port, log_level=args.log_level)
    return 0


def main(argv: list[str] | None = None) -> int:
    request_huge_pages()  # before torch allocates: engine/host_memory.py
    args = build_parser().parse_args(argv)
    try:
        if args.command == "pull":
            return cmd_pull(args)
        if args.command == "route":
            return cmd_route(args)
        return cmd_serve(args)
    except ValueError as exc:
        print(f"radixcache: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
