"""A real redis-server on a free loopback port, for tests (import the `redis_server` fixture).

from tests.redis_server import redis_server  # noqa: F401  (in a conftest.py)

def test_x(redis_server):
    url = redis_server.url          # redis://127.0.0.1:<port>/0
    redis_server.kill()             # SIGKILL, as a crash would
    redis_server.start()            # same port, empty data

RedisServer(folder, password="pw", username="alice") adds an ACL user (the default user is then
off); RedisServer(folder, tls=make_tls_files(folder)) listens for TLS only (`rediss://` URLs that
trust the test CA through `?ssl_ca_certs=`).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import redis

from tests.ports import free_port

STARTUP_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class TlsFiles:
    ca_cert: Path  # the CA clients must trust
    cert: Path  # the server's certificate (for 127.0.0.1 and localhost), signed by the CA
    key: Path


def make_tls_files(folder: Path) -> TlsFiles:
    """A fresh CA and a server certificate it signed, as PEM files in `folder`."""
    import trustme  # only the TLS tests need it (and cryptography)

    folder.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    issued = ca.issue_cert("127.0.0.1", "localhost")
    files = TlsFiles(folder / "ca.pem", folder / "server.pem", folder / "server.key")
    ca.cert_pem.write_to_path(str(files.ca_cert))
    issued.cert_chain_pems[0].write_to_path(str(files.cert))
    issued.private_key_pem.write_to_path(str(files.key))
    return files


class RedisServer:
    def __init__(
        self,
        workdir: Path,
        port: int | None = None,
        password: str | None = None,
        username: str | None = None,
        tls: TlsFiles | None = None,
    ) -> None:
        self.binary = shutil.which("redis-server")
        if self.binary is None:
            raise RuntimeError(
                "redis-server not found: run `make install-dev` (scripts/ensure_redis.sh)"
            )
        self.workdir = workdir
        self.port = port or free_port()
        self.password = password  # requirepass, or the ACL user's password: clients must AUTH
        self.username = username
        self.tls = tls
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        auth = f"{self.username or ''}:{self.password}@" if self.password else ""
        if self.tls is None:
            return f"redis://{auth}127.0.0.1:{self.port}/0"
        return f"rediss://{auth}127.0.0.1:{self.port}/0?ssl_ca_certs={self.tls.ca_cert}"

    def start(self) -> None:
        if self.running:
            return
        self.proc = subprocess.Popen(
            [
                self.binary,
                *self.listen_args(),
                "--bind", "127.0.0.1",
                "--save", "",
                "--appendonly", "no",
                "--dir", str(self.workdir),
                "--protected-mode", "no",
                *self.extra_args(),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self._wait_ready()

    def listen_args(self) -> list[str]:
        if self.tls is None:
            return ["--port", str(self.port)]
        return [
            "--port", "0",  # no plain-text listener
            "--tls-port", str(self.port),
            "--tls-cert-file", str(self.tls.cert),
            "--tls-key-file", str(self.tls.key),
            "--tls-ca-cert-file", str(self.tls.ca_cert),
            "--tls-auth-clients", "no",  # server-authenticated TLS, as a managed Redis offers
        ]  # fmt: skip

    def extra_args(self) -> list[str]:
        """Options beyond the loopback, no-persistence base every test server runs with."""
        if self.password is None:
            return []
        if self.username is None:
            return ["--requirepass", self.password]
        return ["--user", "default", "off", "--user", self.username, "on", f">{self.password}",
                "~*", "&*", "+@all"]  # fmt: skip

    def _wait_ready(self) -> None:
        client = self.client(timeout_s=0.5)
        end = time.monotonic() + STARTUP_TIMEOUT_S
        try:
            while True:
                if self.proc is not None and self.proc.poll() is not None:
                    raise RuntimeError(f"redis-server exited with {self.proc.returncode}")
                try:
                    if client.ping():
                        return
                except redis.ConnectionError:
                    if time.monotonic() > end:
                        raise
                    time.sleep(0.01)  # poll interval while the server binds its port
        finally:
            client.close()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: the server vanishes mid-workload, connections reset."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    def client(self, timeout_s: float = 2) -> redis.Redis:
        tls = {"ssl": True, "ssl_ca_certs": str(self.tls.ca_cert)} if self.tls else {}
        return redis.Redis(
            port=self.port,
            username=self.username,
            password=self.password,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            **tls,
        )
