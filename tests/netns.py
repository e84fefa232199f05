"""Network namespaces joined by a Linux bridge, for tests whose processes must talk across a real
network interface (veth pairs) rather than loopback. Namespace i has 10.213.<net>.<i+2>/24; the
bridge, in the test's own namespace, has .1, so the test reaches every namespace too. Creating them
needs root (CAP_NET_ADMIN) and iproute2's `ip`: without them `Network` raises with the reason (an
AssertionError), and the test fails. `close` ends the processes started with `popen` that are still
running, then removes the namespaces, their veth pairs and the bridge."""

from __future__ import annotations

import os
import shutil
import signal
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


def _unrouted_net(preferred: int) -> int:
    """`preferred`, or the next N whose 10.213.N.0/24 this namespace routes nowhere yet (another
    run's bridge, left behind by a killed test, would take the traffic meant for ours)."""
    routes = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout
    for k in range(256):
        net = (preferred + k) % 256
        if f"10.213.{net}.0/24" not in routes:
            return net
    raise NamespacesUnavailable("every 10.213.N.0/24 is routed already")


@dataclass
class Network:
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    net: int = field(default_factory=lambda: 64 + os.getpid() % 128)
    names: list[str] = field(default_factory=list)
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def bridge(self) -> str:
        return f"rcbr{self.tag}"

    def __post_init__(self) -> None:
        if os.geteuid() != 0:
            raise NamespacesUnavailable("network namespaces need root (CAP_NET_ADMIN)")
        if shutil.which("ip") is None:
            raise NamespacesUnavailable("network namespaces need iproute2's `ip` command")
        self.net = _unrouted_net(self.net)
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.address(-1)}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
        except NamespacesUnavailable:
            self.close()  # a half-made bridge does not outlive the failure
            raise

    def address(self, i: int) -> str:
        """Namespace i's address (-1: the bridge's, in the test's namespace)."""
        return f"10.213.{self.net}.{i + 2}"

    def _outer(self, i: int) -> str:
        return f"rc{self.tag}h{i}"

    def add(self) -> tuple[str, str]:
        """A new namespace on the bridge -> (its name, its address)."""
        i = len(self.names)
        name, outer, inner = f"rc{self.tag}n{i}", self._outer(i), f"rc{self.tag}p{i}"
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
        """`args` run inside namespace `name` (`ip netns exec` execs them: the pid is theirs)."""
        proc = subprocess.Popen(["ip", "netns", "exec", name, *args], cwd=cwd, **kw)
        self.procs.append(proc)
        return proc

    def bytes_through(self, name: str) -> int:
        """Bytes received plus sent so far on namespace `name`'s veth (its end on the bridge)."""
        stats = Path("/sys/class/net") / self._outer(self.names.index(name)) / "statistics"
        return sum(int((stats / f).read_text()) for f in ("rx_bytes", "tx_bytes"))

    def close(self) -> None:
        for proc in self.procs:  # a process left in a deleted namespace would keep running
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait(30)
        self.procs.clear()
        for i, name in enumerate(self.names):
            # deleting a namespace deletes its veth and the peer with it; the outer end is
            # deleted by name too, for a pair whose inner end never made it into the namespace
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
            subprocess.run(["ip", "link", "del", self._outer(i)], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
        self.names.clear()
