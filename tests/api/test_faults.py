"""Faults under a streaming load (16 clients, hang-ups, n>1, stop strings, device flushes) against
a small device pool over host, disk (its own tmpfs) and Redis tiers: (a) the redis-server is
SIGKILLed and started again, (b) the disk's filesystem fills up (ENOSPC) past the tier's budget,
(c) block files are corrupted while they are read, (d) the server is SIGKILLed and started again
on the same disk folder. Each fault runs before / during / after phases; every phase: no 5xx (503
or a refused connection only while restarting, retried after), every completed answer equals the
cache-off reference, idle integrity clean, the disk's byte count equal to its files; afterwards
hits come back."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from benchmarks.soak_driver import SoakRequest, is_idle, make_requests, wait_idle
from engine.sampling_params import SamplingParams
from tests.fault_load import (
    Fault,
    PhaseReport,
    cache_stats,
    disk_bytes_match,
    disk_files,
    disk_used_bytes,
    run_phase,
    wait_for,
)
from tests.faults import DiskCorrupter, DiskFill, RedisBounce, ServerRestart
from tests.redis_server import RedisServer
from tests.restartable_serve import RestartableServe
from tests.tmpfs import tmpfs

BLOCK = 4
PREFIX_LEN = 64  # characters of the shared prefixes (a token each)
CLIENTS = 16
REQUESTS = 32  # per phase
DISK_BUDGET = 256 << 10  # ~120 blocks of the tiny model (2.1 KB each)
TMPFS_BYTES = 1 << 20  # 256 pages: block files take one each


def reference_texts(make_llm, requests: list[SoakRequest]) -> list[str]:
    llm = make_llm(num_blocks=512, block_size=BLOCK, enable_prefix_caching=False, max_model_len=512)
    params = [
        SamplingParams(temperature=0, max_tokens=r.max_tokens, stop=r.stop, ignore_eos=False)
        for r in requests
    ]
    return [o.outputs[0].text for o in llm.generate([r.prompt for r in requests], params)]


def phase_loads(make_llm) -> dict[str, tuple[list[SoakRequest], list[str]]]:
    """Each phase's requests and their cache-off answers. The same four prefixes in every phase:
    what one phase cached, the next one hits."""
    phases = ("before", "during", "after")
    loads = [make_requests(REQUESTS, seed=s, prefix_len=PREFIX_LEN, head_seed=0) for s in (1, 2, 3)]
    want = reference_texts(make_llm, [r for load in loads for r in load])
    return {
        phase: (load, want[i * REQUESTS : (i + 1) * REQUESTS])
        for i, (phase, load) in enumerate(zip(phases, loads, strict=True))
    }


@contextmanager
def fault_server(
    tiny_llama: Path, tmp_path: Path, redis: RedisServer | None, disk_budget: int = DISK_BUDGET
) -> Iterator[tuple[RestartableServe, Path]]:
    """The server under test, its disk tier on a tmpfs of its own."""
    with tmpfs(tmp_path / "mnt", TMPFS_BYTES) as mount:
        kv = mount / "kv"
        args = ["--model", str(tiny_llama), "--dtype", "float32", "--block-size", str(BLOCK)]
        args += ["--num-blocks", "160", "--max-num-seqs", "8", "--max-model-len", "512"]
        args += ["--host-tier-bytes", "64K", "--disk-path", str(kv)]
        args += ["--disk-bytes", str(disk_budget)]
        args += ["--threads", "1", "--log-level", "warning"]
        if redis is not None:
            args += ["--redis-url", redis.url]
        server = RestartableServe(args, tmp_path / "home")
        server.start()
        try:
            server.wait_healthy()
            yield server, kv
        finally:
            server.stop()


def assert_clean(report: PhaseReport, url: str, kv: Path, restarting: bool = False) -> None:
    assert report.errors == (), report
    fives = {s for s in report.statuses if s.isdigit() and int(s) >= 500}
    assert fives <= ({"503"} if restarting else set()), report.statuses
    assert restarting or "connection" not in report.statuses, report.statuses
    assert report.completed + report.hung_up == report.requests, report
    assert report.wrong == 0, report
    idle = wait_idle(url)
    assert is_idle(idle), idle
    assert idle["ok"], idle["error"]
    assert disk_bytes_match(url, kv), (disk_used_bytes(url), sum(disk_files(kv).values()))


def run_fault(
    make_llm, server: RestartableServe, kv: Path, fault: Fault, restarting: bool = False
) -> dict[str, PhaseReport]:
    """Before / during (`fault` injected) / after phases, each checked by assert_clean."""
    model = Path(server.args[server.args.index("--model") + 1]).name
    reports = {}
    for phase, (requests, want) in phase_loads(make_llm).items():
        report = run_phase(
            server.url, model, requests, want, CLIENTS, fault=fault.name, phase=phase,
            inject=fault if phase == "during" else None, tolerate_restart=restarting,
        )  # fmt: skip
        assert_clean(report, server.url, kv, restarting and phase == "during")
        reports[phase] = report
    assert reports["after"].hit_tokens > 0, reports["after"]  # hits resume
    return reports


def disk_hit_tokens(url: str) -> int:
    stats = cache_stats(url)
    assert stats is not None
    return stats["since_start"]["hit_tokens_by_tier"].get("disk", 0)


def writes_done(url: str) -> bool:
    stats = cache_stats(url)
    return stats is not None and stats["tier_traffic"]["pending_writes"] == 0


def disk_hits_alone(url: str, model: str) -> int:
    """Each shared prefix alone after a device flush, twice over: the first round reads (and
    drops) a damaged file still on disk and stores its blocks anew; in the second, the prefixes
    the small host tier no longer holds come back from disk. The disk's hit tokens meanwhile.
    (Under the phases' load, running requests hold most blocks through the flushes, so whether
    any reaches the disk is up to timing.)"""
    requests = make_requests(REQUESTS, seed=1, prefix_len=PREFIX_LEN, head_seed=0)
    heads = dict.fromkeys(r.prompt[:PREFIX_LEN] for r in requests)
    before = disk_hit_tokens(url)
    with httpx.Client(base_url=url, timeout=60) as client:
        for _ in range(2):
            for head in heads:
                client.post("/v1/cache/flush").raise_for_status()
                wait_for(lambda: writes_done(url), 30, "tier writes")
                body = {"model": model, "prompt": head + "?", "max_tokens": 1, "temperature": 0}
                client.post("/v1/completions", json=body).raise_for_status()
    return disk_hit_tokens(url) - before


def disk_hits(reports: dict[str, PhaseReport], *phases: str) -> int:
    return sum(reports[p].hit_tokens_by_tier.get("disk", 0) for p in phases)


def test_redis_sigkill_and_back(make_llm, tiny_llama: Path, tmp_path: Path, redis_server) -> None:
    with fault_server(tiny_llama, tmp_path, redis_server) as (server, kv):
        bounce = RedisBounce(redis_server, server.url, tiny_llama.name)
        run_fault(make_llm, server, kv, bounce)  # the node went down, then came back into service
        # the restarted (empty) Redis takes the disk's evictions again
        assert redis_server.client().dbsize() > 0


def test_disk_full_past_budget(make_llm, tiny_llama: Path, tmp_path: Path) -> None:
    # the budget is twice the filesystem: the tier's own files fill it, then a ballast file the rest
    with fault_server(tiny_llama, tmp_path, None, disk_budget=2 * TMPFS_BYTES) as (server, kv):
        fill = DiskFill(kv.parent, kv)
        run_fault(make_llm, server, kv, fill)
        # full: ENOSPC for the ballast (free space read afterwards races with the tier, which
        # deletes its oldest files on ENOSPC)
        assert fill.hit_enospc
        # the tier kept storing blocks while the filesystem was full (dropping its oldest)
        stored_while_full = fill.files_at_recovery - fill.files_when_filled
        assert len(stored_while_full) >= 8
        # and serves hits again
        assert disk_hits_alone(server.url, tiny_llama.name) > 0


def test_disk_files_corrupted_while_read(make_llm, tiny_llama: Path, tmp_path: Path) -> None:
    with fault_server(tiny_llama, tmp_path, None) as (server, kv):
        corrupter = DiskCorrupter(kv)
        run_fault(make_llm, server, kv, corrupter)
        # damaged files were read (and dropped, the request recomputed): answers stayed right
        assert corrupter.corrupted and corrupter.discarded() > 0
        # and the disk serves hits again
        assert disk_hits_alone(server.url, tiny_llama.name) > 0


@pytest.mark.slow
def test_server_sigkill_and_restart(make_llm, tiny_llama: Path, tmp_path: Path) -> None:
    with fault_server(tiny_llama, tmp_path, None) as (server, kv):
        reports = run_fault(make_llm, server, kv, ServerRestart(server), restarting=True)
        assert server.starts == 2 and reports["during"].aborted > 0
        # the new process found the blocks the old one left on disk (the during phase counts the
        # new process's hits since its start: right after it the host tier is empty), and no
        # half-written file
        assert disk_hits(reports, "during", "after") > 0
        assert not list(kv.rglob("*.tmp"))
