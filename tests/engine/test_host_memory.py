"""request_huge_pages (engine/host_memory.py) in a fresh process, as the CLI calls it: torch's
large host tensors come on huge pages where the kernel's THP mode allows them, and a user's
THP_MEM_ALLOC_ENABLE=0 is kept."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.huge_pages import thp_mode

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
from engine.host_memory import request_huge_pages
asked = request_huge_pages()
import torch
x = torch.empty(64 << 20)  # 256 MB
x.fill_(1.0)
from tests.huge_pages import anon_huge_kb
print(int(asked), anon_huge_kb())
"""


def probe(env: dict[str, str]) -> tuple[bool, int]:
    env = {**{k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}, **env}
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    return out[0] == "1", int(out[1])


@pytest.mark.parametrize("user", [None, "0"])
def test_large_tensors_on_huge_pages_unless_the_user_says_no(user: str | None) -> None:
    asked, huge_kb = probe({} if user is None else {"THP_MEM_ALLOC_ENABLE": user})
    assert asked == (user is None)
    if asked and thp_mode() != "never":
        assert huge_kb >= 128 << 10  # most of the 256 MB
    elif thp_mode() != "always":
        assert huge_kb == 0
