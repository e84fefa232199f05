"""bench_tiers' device section on the CPU: both host tiers hand every block back (the section
asserts it) and the figures are there."""

from __future__ import annotations

from benchmarks.tier_device import bench_device


def test_device_section_rows() -> None:
    rows = bench_device("cpu", num_blocks=8, repeats=1)
    assert [r["tier"].split(",")[0] for r in rows] == ["host tier", "host tier", "raw copy"]
    for row in rows[:2]:
        assert row["blocks"] == 8
        assert min(row["spill_gbps"], row["load_gbps"], row["install_us_per_block"]) > 0
