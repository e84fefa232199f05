"""release_thread_pool frees the calling thread's OpenMP workers (the async engine's start relies on
it so the engine thread's parallel regions are not throttled by the builder's idle pool)."""

import os
import threading
import time

import torch

from engine.openmp import release_thread_pool


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _wait_for(predicate, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def test_release_frees_the_threads_of_this_threads_pool():
    counts: dict[str, int | bool] = {}
    previous = torch.get_num_threads()
    torch.set_num_threads(2)

    def work() -> None:  # a fresh thread: the pool it starts is its own
        counts["before"] = _threads()
        a = torch.randn(512, 512)
        for _ in range(3):
            a @ a  # a parallel region on 2 threads: one worker joins this thread
        counts["with_pool"] = _threads()
        counts["released"] = release_thread_pool()
        counts["drained"] = _wait_for(lambda: _threads() < counts["with_pool"])

    try:
        thread = threading.Thread(target=work)
        thread.start()
        thread.join()
    finally:
        torch.set_num_threads(previous)
    assert counts["with_pool"] > counts["before"]  # the region started worker threads
    assert counts["released"] is True
    assert counts["drained"], counts  # and the release ended them
