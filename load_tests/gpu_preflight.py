"""What `make gpu-check` needs, checked before anything is installed or
started, each missing piece a stop at once with its fix (not a 30-minute
wait on a server that can never answer).

    python3 -m load_tests.gpu_preflight [--port 8000]

Prints the Paddle build to install (cu118 / cu126 / cu129, from
serve_app/tools/gpu_build.py) on stdout; exit 1 with "STOPPED: ..." on
stderr otherwise. Standard library only: it runs before any environment
exists.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, Optional

from serve_app.tools.gpu_build import Stop, choose, parse, query
from load_tests.cli import standalone

REPO = Path(__file__).resolve().parents[1]

INDEXES = ("https://pypi.org/simple/pip/", "https://www.paddlepaddle.org.cn/packages/stable/cu126/")
MIN_FREE_GB = 20  # paddlepaddle-gpu and its CUDA wheels (~6 GB unpacked), pip's cache, TensorRT, Ray's logs


def _python_ok(candidate: str, run) -> bool:
    try:
        out = run([candidate, "-c", "import sys; sys.exit(not (3, 11) <= sys.version_info[:2] < (3, 13))"],
                  capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0


def find_python(which: Callable[[str], Optional[str]] = shutil.which, run=subprocess.run) -> str:
    for c in ("python3.12", "python3.11", "python3"):
        path = which(c)
        if path and _python_ok(path, run):
            return path
    raise Stop("no Python 3.11 or 3.12 on PATH (the package needs one): e.g. `apt-get install python3.12 "
               "python3.12-venv` (Ubuntu 24.04 has it; on 22.04 from the deadsnakes PPA), or `uv python install 3.12`")


def check_tools(which: Callable[[str], Optional[str]] = shutil.which) -> None:
    fixes = {"curl": "apt-get install curl (gpu_run.sh polls /readyz with it)",
             "git": "apt-get install git (the report names the commit)",
             "make": "apt-get install make"}
    missing = [f"{t}: {fix}" for t, fix in fixes.items() if which(t) is None]
    if missing:
        raise Stop("missing tools: " + "; ".join(missing))


def check_venv(python: str, run=subprocess.run) -> None:
    out = run([python, "-c", "import venv, ensurepip"], capture_output=True, timeout=20)
    if out.returncode != 0:
        v = run([python, "-c", "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')"],
                capture_output=True, text=True, timeout=20).stdout.strip()
        raise Stop(f"{python} has no venv/ensurepip (make install-gpu makes .venv-gpu with it): "
                   f"apt-get install python{v}-venv")


def check_indexes(urlopen=urllib.request.urlopen, urls=INDEXES) -> None:
    for url in urls:
        try:
            with urlopen(url, timeout=15) as r:
                if r.status >= 400:
                    raise OSError(f"HTTP {r.status}")
        except (OSError, urllib.error.URLError) as e:
            raise Stop(f"cannot reach {url} ({e}): make install-gpu downloads paddlepaddle-gpu from Paddle's index "
                       "and the rest from PyPI; allow them through the proxy (HTTPS_PROXY) or firewall") from None


def check_disk(path: Path = REPO, free_gb: Optional[float] = None) -> None:
    free = free_gb if free_gb is not None else shutil.disk_usage(path).free / 2**30
    if free < MIN_FREE_GB:
        raise Stop(f"{free:.1f} GiB free under {path}; the GPU environment needs about {MIN_FREE_GB} GiB: free some "
                   "space or clone elsewhere")


def check_port(port: int) -> None:
    s = socket.socket()
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
    except OSError:
        raise Stop(f"port {port} is taken (another Serve or Ray?): stop it (`serve shutdown -y; ray stop`) or "
                   "run with PORT=another") from None
    finally:
        s.close()


def preflight(port: int, run=subprocess.run, which=shutil.which, urlopen=urllib.request.urlopen,
              free_gb: Optional[float] = None, cuda: Optional[str] = None) -> tuple[str, str, str]:
    """(cuda build, why, python): each check in the order a fresh machine fails them."""
    check_tools(which)
    cuda_tag, why = choose(parse(query(run)), cuda)
    python = find_python(which, run)
    check_venv(python, run)
    check_disk(free_gb=free_gb)
    check_port(port)
    check_indexes(urlopen, (INDEXES[0], f"https://www.paddlepaddle.org.cn/packages/stable/{cuda_tag}/"))
    return cuda_tag, why, python


def add_cli_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--cuda", default=None)


def main(args: argparse.Namespace) -> int:
    a = args
    try:
        cuda, why, python = preflight(a.port, cuda=a.cuda or None)
    except Stop as e:
        print(f"STOPPED: {e}", file=sys.stderr)
        return 1
    print(f"{why}; Python {python}", file=sys.stderr)
    print(f"{cuda} {python}")
    return 0


if __name__ == "__main__":
    sys.exit(standalone(__name__))
