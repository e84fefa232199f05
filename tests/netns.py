"""Network namespaces joined by a Linux bridge, for tests whose processes must talk across a real
network interface (veth pairs) rather than loopback. Namespace i has 10.213.<net>.<i+2>/24; the
bridge, in the test's own namespace, has .1, so the test reaches every namespace too. Creating them
needs root (CAP_NET_ADMIN): without it `Network` raises with the reason, and the test fails."""

from __future__ import annotations

import os
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class NamespacesUnavailable(AssertionError):
    pass


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise NamespacesUnavailable(f"`ip {' '.join(args)}` failed: {done.stderr.strip()}")


@dataclass
class Network:
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    net: int = field(default_factory=lambda: 64 + os.getpid() % 128)
    names: list[str] = field(default_factory=list)

    @property
    def bridge(self) -> str:
        return f"rcbr{self.tag}"

    def __post_init__(self) -> None:
        if os.geteuid() != 0:
            raise NamespacesUnavailable("network namespaces need root (CAP_NET_ADMIN)")
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.address(-1)}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")

    def address(self, i: int) -> str:
        """Namespace i's address (-1: the bridge's, in the test's namespace)."""
        return f"10.213.{self.net}.{i + 2}"

    def add(self) -> tuple[str, str]:
        """A new namespace on the bridge -> (its name, its address)."""
        i = len(self.names)
        name, outer, inner = f"rc{self.tag}n{i}", f"rc{self.tag}h{i}", f"rc{self.tag}p{i}"
        _ip("netns", "add", name)
        self.names.append(name)
        _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
        _ip("link", "set", inner, "netns", name)
        _ip("link", "set", outer, "master", self.bridge, "up")
        _ip("-n", name, "addr", "add", f"{self.address(i)}/24", "dev", inner)
        _ip("-n", name, "link", "set", inner, "up")
        _ip("-n", name, "link", "set", "lo", "up")
        return name, self.address(i)

    def popen(self, name: str, args: list[str], cwd: Path, **kw: Any) -> subprocess.Popen:
        """`args` run inside namespace `name`."""
        return subprocess.Popen(["ip", "netns", "exec", name, *args], cwd=cwd, **kw)

    def close(self) -> None:
        for name in self.names:  # deleting a namespace deletes its veth and the peer with it
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
        self.names.clear()
