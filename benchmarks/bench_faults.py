"""Faults under load: a streaming soak (64 clients: hang-ups, n>1, stop strings, long prompts, the
device cache flushed every few requests so prefixes come back from the tiers) against a small
device pool over host, disk and Redis tiers (a redis-server of its own; the disk folder on a tmpfs
of its own). One server lives through four faults in turn, each in three phases, before / during /
after, the fault injected from this process once a quarter of the phase's requests are done:

    redis      SIGKILL the redis-server; once the server's breaker opened, start it again
    disk-full  fill what is left of the disk's tmpfs (ENOSPC) while its files already fill it
               (the disk budget is larger than the filesystem); the ballast is deleted after
    corrupt    flip bytes of block files while the server reads them
    restart    SIGKILL the server, start it again on the same port and disk folder; a request
               that fails with a connection error or a 503 meanwhile is aborted, retried after

Per phase: requests/s, TTFT p50/p99, statuses other than 200, answers that differ from the
cache-off reference (float32: must be 0), hit tokens per tier, and after it: referenced blocks when
idle, the integrity report, and whether the disk tier's byte count equals its files'.
Needs root with CAP_SYS_ADMIN (mount -t tmpfs) and redis-server.

    python -m benchmarks.bench_faults                     # default model, 64 clients, all faults
    python -m benchmarks.bench_faults --clients 16 --requests 32 --faults redis,restart
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import asdict
from pathlib import Path

from benchmarks.results_io import write_results
from benchmarks.soak_driver import SoakRequest, make_requests, wait_idle
from engine.llm import LLM
from engine.loader import ensure_default_model
from engine.sampling_params import SamplingParams
from tests.fault_load import Fault, PhaseReport, disk_bytes_match, run_phase
from tests.faults import DiskCorrupter, DiskFill, RedisBounce, ServerRestart
from tests.redis_server import RedisServer
from tests.restartable_serve import RestartableServe
from tests.tmpfs import tmpfs

FAULTS = ("redis", "disk-full", "corrupt", "restart")
PHASES = ("before", "during", "after")


def reference(model: Path, dtype: str, requests: list[SoakRequest]) -> list[str]:
    llm = LLM(str(model), dtype=dtype, enable_prefix_caching=False, max_model_len=1024)
    params = [SamplingParams(temperature=0, max_tokens=r.max_tokens, stop=r.stop) for r in requests]
    texts = [o.outputs[0].text for o in llm.generate([r.prompt for r in requests], params)]
    llm.engine.close()
    return texts


def serve_args(args: argparse.Namespace, model: Path, kv: Path, redis_url: str) -> list[str]:
    out = ["--model", str(model), "--dtype", args.dtype, "--num-blocks", str(args.num_blocks)]
    out += ["--max-model-len", "1024", "--host-tier-bytes", str(args.host_bytes)]
    out += ["--disk-path", str(kv), "--disk-bytes", str(args.disk_bytes), "--redis-url", redis_url]
    return [*out, "--log-level", "warning"]


def make_fault(
    name: str, server: RestartableServe, redis: RedisServer, kv: Path, model: str
) -> Fault:
    if name == "redis":
        return RedisBounce(redis, server.url, model)
    if name == "disk-full":
        return DiskFill(kv.parent, kv)
    if name == "corrupt":
        return DiskCorrupter(kv)
    return ServerRestart(server)


def fault_notes(fault: Fault) -> dict:
    """What the fault itself saw (how far it got), for the JSON."""
    if isinstance(fault, RedisBounce):
        return {"pokes_until_back": fault.pokes}
    if isinstance(fault, DiskFill):
        stored = fault.files_at_recovery - fault.files_when_filled
        return {"hit_enospc": fault.hit_enospc, "stored_while_full": len(stored)}
    if isinstance(fault, DiskCorrupter):
        return {"files_corrupted": len(fault.corrupted), "corrupted_gone": fault.discarded()}
    assert isinstance(fault, ServerRestart)
    return {"server_starts": fault.server.starts}


def main(args: argparse.Namespace) -> None:
    model = Path(args.model) if args.model else ensure_default_model()
    faults = args.faults.split(",")
    # one load per phase, the same for every fault (phases compare across faults), all sharing
    # four prefixes (what one phase cached, the next hits)
    loads = {
        p: make_requests(args.requests, seed=1 + i, prefix_len=256, head_seed=0)
        for i, p in enumerate(PHASES)
    }
    flat = [r for load in loads.values() for r in load]
    print(f"cache-off reference for {len(flat)} requests ...", flush=True)
    texts = iter(reference(model, args.dtype, flat))
    want = {p: [next(texts) for _ in load] for p, load in loads.items()}
    home = Path(tempfile.mkdtemp(prefix="faults-"))
    (home / "redis").mkdir()
    redis = RedisServer(home / "redis")
    redis.start()
    rows = []
    try:
        with tmpfs(home / "mnt", args.tmpfs_bytes) as mount:
            kv = mount / "kv"
            server = RestartableServe(serve_args(args, model, kv, redis.url), home / "serve")
            server.start()
            try:
                server.wait_healthy(300)
                for name in faults:
                    fault = make_fault(name, server, redis, kv, model.name)
                    for phase in PHASES:
                        load = (model.name, loads[phase], want[phase])
                        rows.append(one_phase(args, server, kv, fault, phase, load))
                        print_row(rows[-1], header=len(rows) == 1)
            finally:
                server.stop()
    finally:
        redis.stop()
    meta = {"model": model.name, "dtype": args.dtype, "clients": args.clients}
    meta |= {"requests_per_phase": args.requests, "num_blocks": args.num_blocks}
    meta |= {"host_bytes": args.host_bytes, "disk_bytes": args.disk_bytes}
    meta |= {"tmpfs_bytes": args.tmpfs_bytes, "flush_every": args.flush_every}
    print(f"\nwrote {write_results('faults', rows, **meta)}")


def one_phase(
    args: argparse.Namespace,
    server: RestartableServe,
    kv: Path,
    fault: Fault,
    phase: str,
    load: tuple[str, list[SoakRequest], list[str]],
) -> dict:
    """Runs one phase (the fault injected if "during"), then checks the idle server."""
    model, requests, want = load
    report: PhaseReport = run_phase(
        server.url, model, requests, want, args.clients, fault=fault.name, phase=phase,
        inject=fault if phase == "during" else None, flush_every=args.flush_every,
        tolerate_restart=isinstance(fault, ServerRestart) and phase == "during",
    )  # fmt: skip
    idle = wait_idle(server.url, timeout_s=120)
    row = asdict(report) | {"errors": list(report.errors)[:5], "error_count": len(report.errors)}
    row |= {"referenced_when_idle": idle["blocks"]["referenced"], "integrity_ok": idle["ok"]}
    row["disk_bytes_match_files"] = disk_bytes_match(server.url, kv)
    if phase == "during":
        row |= fault_notes(fault)
    return row


def print_row(row: dict, header: bool) -> None:
    if header:
        print(
            f"{'fault':>14} {'phase':>6} {'reqs':>5} {'done':>5} {'hung':>5} {'abort':>5} "
            f"{'req/s':>7} {'TTFT p50/p99 s':>15} {'non-200 (status:count)':>24} {'wrong':>5} "
            f"{'hit tok dev/host/disk/redis':>28} {'idle ok':>7}"
        )
    ttft = f"{row['ttft_p50_s']:.2f}/{row['ttft_p99_s']:.2f}"
    bad = " ".join(f"{s}:{n}" for s, n in sorted(row["statuses"].items()) if s != "200") or "-"
    if row["error_count"]:
        bad += f" errors:{row['error_count']}"
    hits = row["hit_tokens_by_tier"]
    tiers = "/".join(str(hits.get(t, 0)) for t in ("device", "host", "disk", "redis"))
    ok = row["integrity_ok"] and not row["referenced_when_idle"] and row["disk_bytes_match_files"]
    print(
        f"{row['fault']:>14} {row['phase']:>6} {row['requests']:>5} {row['completed']:>5} "
        f"{row['hung_up']:>5} {row['aborted']:>5} {row['requests_per_s']:>7.2f} {ttft:>15} "
        f"{bad:>24} {row['wrong']:>5} {tiers:>28} {'yes' if ok else 'NO':>7}",
        flush=True,
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=None, help="HF folder (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--requests", type=int, default=64, help="requests per phase")
    parser.add_argument("--faults", default=",".join(FAULTS), help="comma-separated, in order")
    parser.add_argument("--num-blocks", type=int, default=256, help="device KV blocks (small)")
    parser.add_argument("--host-bytes", type=int, default=32 << 20, help="host tier budget")
    parser.add_argument("--disk-bytes", type=int, default=512 << 20, help="disk tier budget")
    parser.add_argument(
        "--tmpfs-bytes", type=int, default=192 << 20, help="the disk folder's filesystem"
    )
    parser.add_argument("--flush-every", type=int, default=16, help="requests between flushes")
    main(parser.parse_args())
