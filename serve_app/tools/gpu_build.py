"""Which paddlepaddle-gpu build this machine can run: picked from what
nvidia-smi says (driver version, each GPU's compute capability), or a stop
that names the fix. `make install-gpu` calls it with the Python it will
build the environment from, before downloading anything: that Python is
checked first (3.11 or 3.12 with venv: Ubuntu 22.04's python3 is 3.10, and
paddlepaddle-gpu installs there before the project itself is refused),
then the driver and the GPUs.

    python3 -m serve_app.tools.gpu_build              # prints e.g. cu126
    python3 -m serve_app.tools.gpu_build --cuda cu118 # checks a choice

Standard library only (it runs before the GPU environment exists). The
table below is read from Paddle's install pages and NVIDIA's CUDA release
notes, not run on a GPU here:

- Paddle 3.x GPU wheels are on Paddle's own index, one per CUDA version
  (https://www.paddlepaddle.org.cn/packages/stable/<cuda>/): cu118, cu126,
  cu129. PyPI's paddlepaddle-gpu stops at 2.6.2.
- cu118 (CUDA 11.8) is not built for Hopper (sm_90: H100, H200) nor
  Blackwell; Paddle's table lists Hopper under CUDA 12.
- cu126 (CUDA 12.6) has no Blackwell kernels (sm_100 B200/GB200, sm_120
  RTX 50xx / RTX PRO 6000): those need CUDA >= 12.8, so cu129.
- Driver floors: cu118 >= 450.80.02, cu126 >= 550.54.14, cu129 >= 575.51.03
  (the toolkits' drivers in NVIDIA's CUDA release notes; Blackwell needs an
  R570+ driver in any case). CUDA's minor-version compatibility would let a
  12.x runtime start on an R525/R535 driver without PTX JIT, but Paddle's
  install pages state no minimum that allows it for its cu126 wheels, so
  R535 is not taken as enough for cu126: a T4/A10/A100 on R535 gets cu118
  (which has no TensorRT: said at once), a Hopper on R535 stops at once
  naming the driver to install.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import dataclass
from typing import Optional, Sequence

QUERY = ["nvidia-smi", "--query-gpu=name,driver_version,compute_cap", "--format=csv,noheader"]


@dataclass(frozen=True)
class Build:
    cuda: str
    min_driver: tuple[int, ...]
    min_cc: tuple[int, int]   # lowest compute capability it has kernels for
    max_cc: tuple[int, int]   # highest (inclusive)


# In order of preference for a GPU several builds can run: cu126 is Paddle's
# default and what the Docker image uses; cu129 only where it is needed.
BUILDS = (
    Build("cu126", (550, 54, 14), (6, 0), (9, 0)),
    Build("cu129", (575, 51, 3), (7, 5), (12, 0)),
    Build("cu118", (450, 80, 2), (6, 0), (8, 9)),
)


class Stop(Exception):
    """No build fits: the message says why and what to do."""


PYTHONS = ((3, 11), (3, 12))  # pyproject.toml requires-python (and what paddlepaddle-gpu has wheels for)


def check_python(version: Sequence[int], has_venv: bool, executable: str = "python3") -> None:
    """The Python `make install-gpu` builds .venv-gpu from: 3.11 or 3.12
    with its venv module, or a stop before any download."""
    v = tuple(version[:2])
    if v not in PYTHONS:
        raise Stop(f"{executable} is Python {v[0]}.{v[1]}; this project needs 3.11 or 3.12, and nothing was "
                   "downloaded: run `make install-gpu PY=python3.12` (Ubuntu 24.04: apt-get install python3.12 "
                   "python3.12-venv; Ubuntu 22.04: the deadsnakes PPA, or `uv python install 3.12`)")
    if not has_venv:
        raise Stop(f"{executable} (Python {v[0]}.{v[1]}) has no venv/ensurepip module to make .venv-gpu: "
                   f"apt-get install python{v[0]}.{v[1]}-venv")


NO_TENSORRT = {"cu118": "cu118 runs WITHOUT TensorRT (Paddle's CUDA 11.8 build wants TensorRT 8.6, which NVIDIA's "
                        "pip index does not have for CUDA 11); a driver >= 550.54.14 would give cu126 with TensorRT"}


@dataclass(frozen=True)
class Gpu:
    name: str
    driver: tuple[int, ...]
    cc: tuple[int, int]


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.strip().split("."))


def _dotted(v: Sequence[int]) -> str:
    return ".".join(f"{x:02d}" if i == 2 else str(x) for i, x in enumerate(v))


def parse(output: str) -> list[Gpu]:
    """nvidia-smi's CSV lines (name, driver_version, compute_cap)."""
    gpus = []
    for line in output.splitlines():
        if not line.strip():
            continue
        if "not a valid field" in line or "compute_cap" in line:
            raise Stop("this NVIDIA driver is too old to report compute_cap (it came with R510): "
                       "upgrade the driver to >= 550.54.14 (https://www.nvidia.com/Download/index.aspx)")
        parts = [p.strip() for p in line.rsplit(",", 2)]
        if len(parts) != 3:
            raise Stop(f"cannot read nvidia-smi's line {line!r}: run {' '.join(QUERY)} and check the driver")
        try:
            major, minor = parts[2].split(".")
            gpus.append(Gpu(parts[0], _version(parts[1]), (int(major), int(minor))))
        except ValueError:
            raise Stop(f"cannot read nvidia-smi's line {line!r}: run {' '.join(QUERY)} and check the driver") from None
    if not gpus:
        raise Stop("nvidia-smi lists no GPU: check `nvidia-smi` (driver loaded? GPU passed to this container "
                   "with --gpus all?)")
    return gpus


def _fits(build: Build, gpu: Gpu) -> Optional[str]:
    """None when `build` runs on `gpu`, else why not."""
    if gpu.cc < build.min_cc or gpu.cc > build.max_cc:
        return (f"{build.cuda} has no kernels for {gpu.name} (compute capability {gpu.cc[0]}.{gpu.cc[1]}; "
                f"it covers {build.min_cc[0]}.{build.min_cc[1]}-{build.max_cc[0]}.{build.max_cc[1]})")
    if gpu.driver < build.min_driver:
        return (f"{build.cuda} needs NVIDIA driver >= {_dotted(build.min_driver)}; this machine has "
                f"{_dotted(gpu.driver)}")
    return None


def choose(gpus: Sequence[Gpu], wanted: Optional[str] = None) -> tuple[str, str]:
    """(cuda tag, why) for every GPU of this machine, or Stop naming the fix."""
    candidates = [b for b in BUILDS if wanted in (None, b.cuda)]
    if not candidates:
        raise Stop(f"CUDA={wanted} is not a Paddle 3 build: use one of {', '.join(b.cuda for b in BUILDS)}, "
                   "or leave CUDA unset to pick from the driver")
    why_not: list[str] = []
    for b in candidates:
        problems = [p for p in (_fits(b, g) for g in gpus) if p]
        if not problems:
            names = sorted({f"{g.name} (cc {g.cc[0]}.{g.cc[1]})" for g in gpus})
            note = f"; {NO_TENSORRT[b.cuda]}" if b.cuda in NO_TENSORRT else ""
            return b.cuda, (f"{b.cuda}: driver {_dotted(gpus[0].driver)} and {', '.join(names)} "
                            f"{'as asked' if wanted else 'picked from nvidia-smi'}{note}")
        why_not += problems
    arch_only = all("no kernels" in p for p in why_not)
    fix = ("no Paddle 3 build covers these GPUs together: give each node one GPU generation"
           if arch_only and len({g.cc for g in gpus}) > 1 else
           "no Paddle 3 build has kernels for this GPU" if arch_only else
           "upgrade the NVIDIA driver (https://www.nvidia.com/Download/index.aspx)")
    if wanted:
        fix += f", or leave CUDA unset (not CUDA={wanted}) to pick the build from the driver"
    raise Stop(f"{fix}: " + "; ".join(dict.fromkeys(why_not)))


def query(run=subprocess.run) -> str:
    try:
        out = run(QUERY, capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        raise Stop("nvidia-smi not found: install the NVIDIA driver on this machine (it brings nvidia-smi); in "
                   "a container, start it with --gpus all (NVIDIA Container Toolkit). Without a GPU: make install") \
            from None
    except subprocess.TimeoutExpired:
        raise Stop("nvidia-smi did not answer in 30 s: the driver is stuck; check `nvidia-smi` and dmesg") from None
    if out.returncode != 0:
        msg = (out.stdout + out.stderr).strip().splitlines()
        raise Stop(f"nvidia-smi failed ({msg[0] if msg else 'exit ' + str(out.returncode)}): the NVIDIA driver "
                   "is not loaded or does not match its kernel module; reinstall or reboot")
    return out.stdout


def _has_venv() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("venv", "ensurepip"))


def main(argv=None, run=subprocess.run, python: Optional[Sequence[int]] = None,
         has_venv: Optional[bool] = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m serve_app.tools.gpu_build", description=__doc__.splitlines()[0])
    p.add_argument("--cuda", default=None, help="check this build instead of picking one")
    a = p.parse_args(argv)
    try:
        check_python(sys.version_info if python is None else python, _has_venv() if has_venv is None else has_venv,
                     sys.executable)
        cuda, why = choose(parse(query(run)), a.cuda or None)
    except Stop as e:
        print(f"make install-gpu: STOPPED: {e}", file=sys.stderr)
        return 1
    print(why, file=sys.stderr)
    print(cuda)
    return 0


if __name__ == "__main__":
    sys.exit(main())
