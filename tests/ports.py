"""Free loopback ports for the servers tests start (redis-server, radixcache serve, replicas)."""

from __future__ import annotations

import socket

_HANDED_OUT: set[int] = set()  # ports this process gave a server: never given twice


def free_port() -> int:
    """A loopback port free now and not handed out before in this process (the kernel may offer a
    port again once its probe socket closes: a node's bus port then collided with a server's)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
