"""What the kernel says of transparent huge pages: its mode and a process's huge-page memory
(tests of engine/host_memory.py)."""

from __future__ import annotations

from pathlib import Path


def thp_mode() -> str:
    """The kernel's transparent huge page mode: always, madvise or never ("never" where the file
    is missing: not Linux, or a kernel without THP)."""
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return "never"
    return text.split("[")[1].split("]")[0]


def anon_huge_kb(pid: int | str = "self") -> int:
    """kB of a process's anonymous memory on huge pages (/proc/PID/smaps_rollup)."""
    rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
    return int(rollup.split("AnonHugePages:")[1].split()[0])
