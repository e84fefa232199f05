"""The OpenMP runtime torch runs on, for handing a thread's compute to another thread.

Every thread that runs a parallel region keeps its own docked worker threads. libgomp counts them
all, and once it manages more threads than the process has CPUs it throttles its spin-waiting:
every parallel region then wakes its workers through the kernel. A model built on one thread and
run on another (the async engine's loop) pays that on every op unless the building thread's
workers are freed first."""

from __future__ import annotations

import ctypes
import functools
import logging
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

RUNTIMES = ("libgomp", "libiomp5", "libomp")  # GNU (torch's Linux wheels), Intel, LLVM
OMP_PAUSE_SOFT = 1  # omp_pause_resource_t: free the threads, keep what can be kept


@functools.cache
def _pause_all() -> Callable[[int], int] | None:
    """omp_pause_resource_all of the OpenMP library already mapped into this process (torch's),
    None when there is none or it predates OpenMP 5."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:  # not Linux
        return None
    for line in maps.splitlines():
        path = line.rsplit(" ", 1)[-1]
        name = Path(path).name
        if name.startswith(RUNTIMES) and ".so" in name:
            try:
                pause = ctypes.CDLL(path).omp_pause_resource_all
            except (OSError, AttributeError):
                return None
            pause.argtypes, pause.restype = [ctypes.c_int], ctypes.c_int
            return pause
    return None


def release_thread_pool() -> bool:
    """Frees the calling thread's OpenMP workers (OpenMP 5's omp_pause_resource_all); its next
    parallel region starts new ones. Call it on a thread that hands its compute to another one.
    False where no OpenMP runtime is loaded or it refuses (inside a parallel region)."""
    pause = _pause_all()
    if pause is None:
        return False
    ok = pause(OMP_PAUSE_SOFT) == 0
    if not ok:
        log.debug("the OpenMP runtime kept this thread's pool")
    return ok
