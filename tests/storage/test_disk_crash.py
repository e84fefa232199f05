"""The disk tier under a crash: SIGKILL the server while it spills heavily, then restart on the same
folder. No temp file survives the restart, no damaged value is ever served, and hits resume."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from engine.sampling_params import SamplingParams
from storage.codec import CorruptBlock, verify_block
from storage.disk import SUFFIX, DiskTier
from tests.api.servers import fresh_text
from tests.serve_process import ServeProcess

BLOCK = 4
PROMPTS = [fresh_text(48, seed=100 + i) for i in range(24)]  # 12 blocks each, 24 blocks of pool
MAX_TOKENS = 4


def serve_args(model: Path, disk: Path, fsync: str) -> list[str]:
    args = ["--model", str(model), "--dtype", "float32", "--block-size", str(BLOCK)]
    args += ["--num-blocks", "24", "--max-num-seqs", "4", "--threads", "1"]
    return [*args, "--disk-path", str(disk), "--disk-fsync", fsync, "--log-level", "warning"]


def complete(client: httpx.Client, model: str, prompt: str) -> list[int]:
    body = {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}
    body["return_token_ids"] = True
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["token_ids"]


def block_files(disk: Path) -> list[Path]:
    return [p for p in disk.rglob("*") if p.is_file()]


def wait_for_files(disk: Path, at_least: int, server: ServeProcess, timeout_s: float = 60) -> None:
    """Polls the folder until the spills have written `at_least` block files."""
    deadline = time.monotonic() + timeout_s
    while len([p for p in block_files(disk) if p.suffix == SUFFIX]) < at_least:
        assert server.proc.poll() is None, server.output()
        assert time.monotonic() < deadline, "the server spilled too little"
        time.sleep(0.01)  # polling interval


@pytest.mark.slow
@pytest.mark.parametrize("fsync", ["none", "per-file"])
def test_sigkill_while_spilling_then_restart(make_llm, tiny_llama: Path, tmp_path, fsync):
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    reference = make_llm(num_blocks=64, enable_prefix_caching=False, block_size=BLOCK)
    expected = [o.outputs[0].token_ids for o in reference.generate(PROMPTS, params)]
    disk = tmp_path / "kv"

    first = ServeProcess(serve_args(tiny_llama, disk, fsync), tmp_path / "home")
    first.wait_healthy()
    pool = ThreadPoolExecutor(4)
    client = httpx.Client(base_url=first.url, timeout=60)
    for p in PROMPTS:  # in flight while the server dies; their failures are expected
        pool.submit(complete, client, tiny_llama.name, p)
    wait_for_files(disk, 30, first)
    first.kill()
    pool.shutdown(wait=True, cancel_futures=True)
    client.close()

    tier = DiskTier(disk, 1 << 30)  # what a restart does first: rebuild the index from the folder
    assert not [p for p in block_files(disk) if p.name.endswith(".tmp")]
    for path in block_files(disk):
        try:
            verify_block(path.read_bytes())
        except CorruptBlock as exc:  # tmp + rename: never half a value under a final name
            raise AssertionError(f"{path} is damaged") from exc
    assert len(tier) > 0

    second = ServeProcess(serve_args(tiny_llama, disk, fsync), tmp_path / "home")
    second.wait_healthy()
    try:
        with httpx.Client(base_url=second.url, timeout=60) as c:
            assert [complete(c, tiny_llama.name, p) for p in PROMPTS] == expected
            stats = c.get("/v1/cache/stats").json()
        assert stats["since_start"]["hit_tokens_by_tier"].get("disk", 0) > 0
    finally:
        second.terminate()


def test_per_file_fsync_syncs_each_block_and_its_folder(tmp_path, monkeypatch, ns):
    from tests.storage.blocks import chain, encoded

    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    items = encoded(chain(ns, 3))
    DiskTier(tmp_path / "off", 1 << 30).put(ns, items)
    assert synced == []  # the default relies on the checksum
    tier = DiskTier(tmp_path / "on", 1 << 30, fsync=True)
    tier.put(ns, items)
    assert len(synced) == 2 * len(items)  # the file before its rename, the folder after
    assert tier.get(ns, [h for h, _ in items]) == [v for _, v in items]
