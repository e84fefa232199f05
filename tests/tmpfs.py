"""A small tmpfs mounted for a test: a real filesystem that fills up (ENOSPC). Needs root with
CAP_SYS_ADMIN (mount); a machine without it fails the test rather than skipping it."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def tmpfs(folder: Path, size_bytes: int) -> Iterator[Path]:
    """A tmpfs of `size_bytes` mounted on `folder`, unmounted afterwards."""
    folder.mkdir(parents=True, exist_ok=True)
    mount = ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(folder)]
    done = subprocess.run(mount, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"cannot mount a tmpfs (root with CAP_SYS_ADMIN?): {done.stderr}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False, capture_output=True)
