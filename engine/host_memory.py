"""Transparent huge pages for the engine's large host tensors (weights, the KV pool, activations).

torch's CPU allocator advises the kernel to back each allocation of 2 MB or more with huge pages
(madvise) when THP_MEM_ALLOC_ENABLE=1 is in the environment at its first allocation in the
process. A decode step streams every weight and the KV of every sequence, and with 4 KB pages it
pays a TLB miss every few rows: on the Zen 5 EPYC, decode-16x1100-private took 26.15, 26.17 and
25.05 ms with huge pages against 27.62, 26.99 and 27.54 without (bench_model), and GSP-small 7.64
and 7.81 s against 8.14 and 8.18 (bench_engine, cache on). Where the kernel's THP mode is "never"
the advice changes nothing.

Entry points call request_huge_pages() before anything allocates (the CLI, the benchmarks); a user
may set THP_MEM_ALLOC_ENABLE=0 to keep 4 KB pages."""

from __future__ import annotations

import os

HUGE_PAGES_ENV = "THP_MEM_ALLOC_ENABLE"


def request_huge_pages() -> bool:
    """Asks torch for huge pages unless the environment says otherwise; whether they are asked
    for. Too late (no effect) once torch has allocated host memory in this process."""
    return os.environ.setdefault(HUGE_PAGES_ENV, "1") == "1"
