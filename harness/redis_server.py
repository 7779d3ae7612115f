"""A real redis-server for the job-book tests (Debian's package, installed by
`make test` through tests/system/packages.txt): on a free loopback port, in a
temporary folder, with the append-only file fsynced on every write
(appendonly yes, appendfsync always: what docs/jobs.md asks of production).
A missing redis-server fails the test that needs it, saying how to install
it; nothing is skipped and nothing is faked."""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Optional

INSTALL = "install it: `make test-system` (Debian's redis-server, tests/system/packages.txt)"


def free_port(host: str = "127.0.0.1", below: Optional[int] = None) -> int:
    """A port free now; `below`: one under that number (a cluster-mode Redis
    needs its port + 10000 for its bus, so at most 55535), tried at random."""
    if below is None:
        with socket.socket() as s:
            s.bind((host, 0))
            return s.getsockname()[1]
    for port in random.sample(range(20000, below + 1), 200):
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port between 20000 and {below} on {host}")


class RedisServer:
    def __init__(self, folder: Path, host: str = "127.0.0.1", fsync: str = "always", appendonly: str = "yes",
                 password: Optional[str] = None, extra: tuple[str, ...] = (), port: Optional[int] = None):
        """password: required of every client (`requirepass`), e.g. when host
        is not a loopback address: Redis's protected mode answers only
        loopback clients of a server without one, and stays on here.
        extra: further redis-server arguments (e.g. cluster mode)."""
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError(f"redis-server is not on PATH; the job-book tests run against a real one: {INSTALL}")
        self.exe, self.folder, self.host = exe, Path(folder), host
        self.fsync, self.appendonly, self.password, self.extra = fsync, appendonly, password, tuple(extra)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port(host)
        self.proc = None
        self.start()

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}{self.host}:{self.port}/0"

    def start(self) -> None:
        """(Again, after stop(): the same port and folder, so the AOF is read back.)"""
        self.proc = subprocess.Popen(
            [self.exe, "--port", str(self.port), "--bind", self.host, "--dir", str(self.folder),
             "--appendonly", self.appendonly, "--appendfsync", self.fsync, "--save", "",
             "--daemonize", "no", "--protected-mode", "yes", "--logfile", str(self.folder / "redis.log"),
             *(["--requirepass", self.password] if self.password else []), *self.extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited at start ({self.proc.returncode}): "
                                   f"{self.proc.stderr.read().decode()[-2000:]} {self.log()}")
            try:
                with socket.create_connection((self.host, self.port), timeout=0.5) as s:
                    auth = f"AUTH {self.password}\r\n".encode() if self.password else b""
                    s.sendall(auth + b"PING\r\n")
                    got = b""
                    while b"+PONG" not in got and b"-" not in got and len(got) < 256:
                        chunk = s.recv(64)  # (a timeout is an OSError: tried again)
                        if not chunk:
                            break
                        got += chunk
                    if b"+PONG" in got:
                        return
            except OSError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server did not answer PING on {self.host}:{self.port}: {self.log()}")

    def log(self) -> str:
        p = self.folder / "redis.log"
        return p.read_text()[-2000:] if p.exists() else ""

    def stop(self, kill: bool = False) -> None:
        """kill: SIGKILL (no shutdown save: what survives is what the AOF had)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        (self.proc.kill if kill else self.proc.terminate)()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=20)

    def flush(self) -> None:
        import redis

        with redis.Redis.from_url(self.url) as r:
            r.flushall()
