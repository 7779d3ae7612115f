"""Can Paddle load TensorRT here? Found, linked if need be, and said why not.

What Paddle 3.3.1 does (read in its source, not run on a GPU here):
paddle/phi/backends/dynload/tensorrt.cc opens TensorRT with a bare
`dlopen("libnvinfer.so", RTLD_LAZY | RTLD_LOCAL)` (and "libnvinfer_plugin.so"
for plugins) the first time a TensorRT engine is built: FLAGS_tensorrt_dir is
not consulted there (dynamic_loader.cc's GetTensorRtDsoHandle, which reads
it, is not what the engine uses). A bare dlopen searches the LD_LIBRARY_PATH
the process started with, the calling library's DT_RUNPATH (libpaddle.so's
lists `$ORIGIN/../libs/`, i.e. site-packages/paddle/libs, and the pip CUDA
libraries' folders), the ld.so cache and /lib, /usr/lib.

NVIDIA's pip wheels (`tensorrt-cu12`, whose `tensorrt_cu12_libs` puts the
libraries in site-packages/tensorrt_libs) and its Debian packages' runtime
parts ship only the versioned names (libnvinfer.so.10), so Paddle's probe
finds nothing although TensorRT is installed. The fix made here: a symlink
`libnvinfer.so -> .../libnvinfer.so.<major>` (and the plugin) in
paddle/libs, a folder on libpaddle.so's RUNPATH, so Paddle's own dlopen
finds it whatever the process's environment (a Ray worker's included).
Only the major Paddle was compiled against is linked. Setting
LD_LIBRARY_PATH in a running process would change nothing (glibc reads it
at start).

TensorRT itself opens more at run time: libnvinfer.so.10 dlopens
libnvinfer_builder_resource.so.<full version> by name when it builds its
first engine (not at load), from its own search path, which holds neither
paddle/libs nor site-packages/tensorrt_libs. NVIDIA's own `tensorrt`
package (python/packaging/tensorrt/__init__.py in NVIDIA/TensorRT) makes
that work by loading every library of its folder with ctypes at import;
a library already loaded is found by its soname. `preload` does the same
here, in every process that uses TensorRT, before its first predictor, and
a TensorRT folder without the builder resource is not usable (engines would
fail at their first build, not at start).

Installing: `install` (python -m serve_app.inference.tensorrt_libs install
--cuda cu126) pip-installs `tensorrt-cu12-libs` of the version this paddle
was compiled against from NVIDIA's index (https://pypi.nvidia.com), wheels
only: on PyPI the same name is an sdist (`nvidia-stub`) that downloads the
wheel from NVIDIA at install time and hides that step's failures. cu118
gets none: Paddle's cu118 build wants TensorRT 8.6, and NVIDIA's pip
packages for CUDA 11 (`tensorrt-cu11-libs`) start at 10.0.

No paddle import: the caller passes the TensorRT version Paddle was compiled
against and where paddle lives; the loader is a parameter (ctypes by default)
so tests stand in for dlopen.
"""

from __future__ import annotations

import ctypes
import glob
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

# The bare names Paddle dlopens (tensorrt.cc), and which of them it must have.
PROBED = ("libnvinfer.so", "libnvinfer_plugin.so")
# What libnvinfer opens by name when it builds an engine (TensorRT >= 8.6).
BUILDER_RESOURCE = "libnvinfer_builder_resource.so"
NVIDIA_INDEX = "https://pypi.nvidia.com"
PYPI_INDEX = "https://pypi.org/simple"
_LOADED: list = []  # handles of preloaded libraries (ctypes never unloads; kept for clarity)


@dataclass(frozen=True)
class TensorRTLibs:
    """What was found: usable (Paddle's dlopen will find a TensorRT of the
    major it was compiled against), why (one line for logs and stats), the
    file each probed name resolves to, and the links made here."""

    usable: bool
    reason: str
    found: dict = field(default_factory=dict)
    linked: dict = field(default_factory=dict)
    preloaded: list = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"usable": self.usable, "reason": self.reason, "found": dict(self.found),
                "linked": dict(self.linked), "preloaded": list(self.preloaded)}


def trt_compile_version() -> tuple[int, int, int]:
    """The TensorRT this paddle was compiled against; (0, 0, 0): none."""
    from paddle import inference

    try:
        v = tuple(int(x) for x in inference.get_trt_compile_version())
    except Exception:  # noqa: BLE001 - a build without the call
        return (0, 0, 0)
    return (v + (0, 0, 0))[:3]  # type: ignore[return-value]


def paddle_location() -> str:
    import paddle

    return os.path.dirname(os.path.abspath(paddle.__file__))


def default_loader(path: str) -> None:
    """dlopen `path` as Paddle does (RTLD_LOCAL); raises OSError if it (or
    one of its dependencies) cannot be loaded. The library stays loaded."""
    _LOADED.append(ctypes.CDLL(path, mode=os.RTLD_LAZY | os.RTLD_LOCAL))


def preload(libnvinfer: str, major: int, loader: Callable[[str], None] = default_loader) -> tuple[list[str], str]:
    """Load TensorRT's libraries from the folder `libnvinfer` really is in,
    as NVIDIA's `tensorrt` package does for its tensorrt_libs: the builder
    resource first (libnvinfer opens it by name at its first engine build),
    then the rest of TensorRT `major`'s libraries there (libnvinfer*,
    libnvonnxparser*); libnvinfer_builder_resource_win (engines for Windows,
    ~2 GB) is skipped. Returns (files loaded, "" or why TensorRT cannot
    build engines here)."""
    folder = os.path.dirname(os.path.realpath(libnvinfer))
    names = sorted({os.path.basename(p) for pattern in (f"libnvinfer*.so.{major}*", f"libnvonnxparser*.so.{major}*")
                    for p in glob.glob(os.path.join(folder, pattern)) if "_win" not in os.path.basename(p)})
    real = sorted({os.path.realpath(os.path.join(folder, n)) for n in names})
    resource = [p for p in real if os.path.basename(p).startswith(BUILDER_RESOURCE + ".")]
    if not resource:
        return [], (f"no {BUILDER_RESOURCE}.{major}.* beside {os.path.realpath(libnvinfer)}: TensorRT opens it to "
                    "build its first engine, so every engine build would fail; install the whole tensorrt-cu12-libs "
                    "wheel (python -m serve_app.inference.tensorrt_libs install)")
    loaded: list[str] = []
    for path in resource + [p for p in real if p not in resource]:
        try:
            loader(path)
        except OSError as e:
            if path in resource:
                return loaded, f"{path} does not load ({e})"
            continue  # an optional part (lean, dispatch, parsers) NVIDIA's loader also skips on failure
        loaded.append(path)
    return loaded, ""


def paddle_runpath_dirs(paddle_dir: str) -> list[str]:
    """libpaddle.so's RUNPATH folders that hold TensorRT candidates: paddle/libs
    (`$ORIGIN/../libs/` from paddle/base/libpaddle.so, as the 3.3.1 wheels
    are linked)."""
    return [os.path.join(paddle_dir, "libs")]


def system_dirs(environ=os.environ, ldconfig: Optional[str] = None) -> list[str]:
    """Where else a bare dlopen looks, and where TensorRT is usually put:
    LD_LIBRARY_PATH, the folders of the ld.so cache's libnvinfer entries,
    the pip wheel's site-packages/tensorrt_libs, and the usual lib folders."""
    dirs = [d for d in environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    if ldconfig is None:
        try:
            ldconfig = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.TimeoutExpired):
            ldconfig = ""
    dirs += [os.path.dirname(p) for p in re.findall(r"=>\s*(\S*/libnvinfer[^/\s]*\.so[.\d]*)\s*$", ldconfig, re.M)]
    for site in sys.path:
        if site.endswith("site-packages"):
            dirs.append(os.path.join(site, "tensorrt_libs"))
    dirs += ["/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/local/tensorrt/lib", "/usr/lib"]
    out: list[str] = []
    for d in dirs:
        if d not in out:
            out.append(d)
    return out


def _major_of(path: str) -> Optional[int]:
    """The major version a library file is: from its real name
    (libnvinfer.so.10.5.0 -> 10); None when the name carries none."""
    m = re.search(r"\.so\.(\d+)", os.path.basename(os.path.realpath(path)))
    return int(m.group(1)) if m else None


def _first(name: str, dirs: Sequence[str]) -> Optional[str]:
    for d in dirs:
        p = os.path.join(d, name)
        if os.path.exists(p):
            return p
    return None


def _versioned(base: str, major: int, dirs: Sequence[str]) -> Optional[str]:
    """`base`.so.<major> (or .so.<major>.x.y) in the first folder that has one."""
    for d in dirs:
        exact = os.path.join(d, f"{base}.{major}")
        if os.path.exists(exact):
            return exact
        more = sorted(glob.glob(os.path.join(d, f"{base}.{major}.*")))
        if more:
            return more[0]
    return None


def locate(compiled: Sequence[int], paddle_dir: str, link: bool = True,
           other_dirs: Optional[Sequence[str]] = None,
           loader: Callable[[str], None] = default_loader) -> TensorRTLibs:
    """Whether Paddle's `dlopen("libnvinfer.so")` will load a TensorRT of
    the major in `compiled` (paddle.inference.get_trt_compile_version()).
    With link, a versioned library found elsewhere is linked under its
    probed name into paddle/libs (when that folder is writable)."""
    major = int(compiled[0]) if compiled else 0
    if major <= 0:
        return TensorRTLibs(False, "this paddle build has no TensorRT support (compiled against TensorRT 0)")
    runpath = paddle_runpath_dirs(paddle_dir)
    others = list(other_dirs) if other_dirs is not None else system_dirs()
    found: dict[str, str] = {}
    linked: dict[str, str] = {}
    for name in PROBED:
        path = _first(name, runpath + others)
        if path is not None and _major_of(path) not in (None, major):
            path = None  # another major: Paddle would load it and fail; look for ours instead
        if path is None:
            target = _versioned(name, major, runpath + others)
            if target is None:
                return TensorRTLibs(False, f"no {name} (or {name}.{major}) for TensorRT {major} on Paddle's search "
                                    f"path nor in {', '.join(others[:4])}...: install it (python -m "
                                    f"serve_app.inference.tensorrt_libs install --cuda cu126: tensorrt-cu12-libs "
                                    f"{major}.x from {NVIDIA_INDEX})", found, linked)
            where = runpath[0]
            dest = os.path.join(where, name)
            if not link:
                return TensorRTLibs(False, f"{target} is there but Paddle opens {name}: link it into {where} "
                                    "(python -m serve_app.inference.tensorrt_libs)", found, linked)
            try:
                if os.path.islink(dest):
                    os.unlink(dest)  # a stale link (another major, a removed wheel)
                os.symlink(target, dest)
            except OSError as e:
                return TensorRTLibs(False, f"{target} is there but Paddle opens {name}, and it cannot be linked into "
                                    f"{where} ({e.strerror}): run python -m serve_app.inference.tensorrt_libs as the owner "
                                    "of that folder (the Docker image does at build time)", found, linked)
            linked[dest] = target
            path = dest
        try:
            loader(path)
        except OSError as e:
            return TensorRTLibs(False, f"{path} does not load ({e}): a dependency (CUDA runtime, cuDNN) is missing "
                                "or of another version", found, linked)
        found[name] = os.path.realpath(path)
    preloaded, why_not = preload(found["libnvinfer.so"], major, loader)
    if why_not:
        return TensorRTLibs(False, why_not, found, linked, preloaded)
    return TensorRTLibs(True, f"TensorRT {major} found: {found['libnvinfer.so']} ({len(preloaded)} libraries "
                        "loaded, the builder resource included)", found, linked, preloaded)


def wheel_spec(cuda: str, compiled: Sequence[int]) -> tuple[Optional[str], str]:
    """(pip requirement, why) of NVIDIA's TensorRT libraries for a Paddle
    build: None with the reason where there is none to install."""
    if cuda.startswith("cu11"):
        return None, (f"{cuda}: runs WITHOUT TensorRT: Paddle's CUDA 11.8 build wants TensorRT 8.6 and NVIDIA's "
                      "pip packages for CUDA 11 (tensorrt-cu11-libs) start at 10.0; for TensorRT use a cu126 or "
                      "cu129 build (driver >= 550.54.14 / 575.51.03: python3 -m serve_app.tools.gpu_build)")
    major = int(compiled[0]) if compiled else 0
    if major <= 0:
        return None, "this paddle build has no TensorRT support (compiled against TensorRT 0)"
    minor = int(compiled[1]) if len(compiled) > 1 else 0
    return f"tensorrt-cu12-libs=={major}.{minor}.*", f"TensorRT {major}.{minor}, which this paddle was compiled against"


def install_command(python: str, spec: str, constraint: Optional[str] = None) -> list[str]:
    """pip installing `spec` from NVIDIA's index, wheels only (never PyPI's
    nvidia-stub sdist of the same name); its CUDA dependencies may come from
    PyPI; `constraint` keeps the installed paddle as it is."""
    name = spec.split("==")[0]
    return ([python, "-m", "pip", "install", "--index-url", NVIDIA_INDEX + "/", "--extra-index-url", PYPI_INDEX,
             "--only-binary", name] + (["-c", constraint] if constraint else []) + [spec])


def install(cuda: str, require: bool, compiled: Sequence[int], paddle_dir: str, constraint: Optional[str] = None,
            run: Callable[[list[str]], int] = lambda cmd: subprocess.call(cmd),
            python: str = sys.executable, out: Callable[[str], None] = print,
            **locate_kw) -> int:
    """Install TensorRT for this paddle, link it where Paddle looks and check
    that it loads. 0: usable, or not required; 1: required and not usable;
    2: required and this paddle (or this CUDA build) has no TensorRT."""
    spec, why = wheel_spec(cuda, compiled)
    if spec is None:
        out(f"TensorRT NOT installed: {why}")
        return 2 if require else 0
    cmd = install_command(python, spec, constraint)
    out(f"installing {spec} ({why}) from {NVIDIA_INDEX}: {' '.join(cmd)}")
    rc = run(cmd)
    if rc != 0:
        out(f"TensorRT NOT installed: pip exited {rc} installing {spec} from {NVIDIA_INDEX}"
            + ("" if require else "; replicas run without it (tensorrt.enable: auto); REQUIRE_TENSORRT=1 "
               "makes this fail the build"))
        return 1 if require else 0
    libs = locate(compiled, paddle_dir, **locate_kw)
    for dest, target in libs.linked.items():
        out(f"linked {dest} -> {target}")
    out(("TensorRT usable: " if libs.usable else "TensorRT NOT usable: ") + libs.reason)
    return 1 if require and not libs.usable else 0


def main(argv=None) -> int:
    """Link (if need be) and report; or `install` first. Exit 0, or with
    --require: 1 not usable, 2 this paddle has no TensorRT support."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m serve_app.inference.tensorrt_libs", description=__doc__.splitlines()[0])
    p.add_argument("action", nargs="?", choices=("check", "install"), default="check",
                   help="check (default): link and report; install: pip-install from NVIDIA's index first")
    p.add_argument("--cuda", default="cu126", help="install: the Paddle build (cu118, cu126, cu129)")
    p.add_argument("--constraint", default=None, help="install: a pip constraints file (the installed paddle)")
    p.add_argument("--require", action="store_true", help="exit non-zero unless TensorRT is usable")
    a = p.parse_args(argv)

    if a.action == "install":
        if a.cuda.startswith("cu11"):  # said at once, before paddle is imported
            return install(a.cuda, a.require, (0, 0, 0), "")
        return install(a.cuda, a.require, trt_compile_version(), paddle_location(), a.constraint)
    compiled = trt_compile_version()
    libs = locate(compiled, paddle_location())
    for dest, target in libs.linked.items():
        print(f"linked {dest} -> {target}")
    print(("TensorRT usable: " if libs.usable else "TensorRT NOT usable: ") + libs.reason)
    if libs.usable or not a.require:
        return 0
    return 2 if not compiled or not compiled[0] else 1


if __name__ == "__main__":
    sys.exit(main())
