"""#29 item 1, #39 item 2: TensorRT is optional, and on purpose. Paddle's probe (a bare
dlopen("libnvinfer.so") and "libnvinfer_plugin.so", searched on libpaddle.so's
RUNPATH among others) is stood in by folders under tmp_path and a loader that
records what it was asked to open; the versioned names the pip wheels ship
(libnvinfer.so.10) are linked under the probed names."""

from __future__ import annotations

import os

import pytest

from serve_app.core.engine_config import PredictorOptions
from serve_app.core.errors import ConfigError
from serve_app.inference.gpu import resolve_tensorrt, tensorrt_decision
from serve_app.inference.tensorrt_libs import TensorRTLibs, locate


def _paddle(tmp_path):
    paddle = tmp_path / "site-packages" / "paddle"
    (paddle / "libs").mkdir(parents=True)
    return paddle


WHEEL = ("libnvinfer.so", "libnvinfer_plugin.so", "libnvinfer_lean.so", "libnvinfer_dispatch.so",
         "libnvonnxparser.so")


def _wheel(tmp_path, major="10", names=WHEEL, minor=".5.0", resources=("libnvinfer_builder_resource.so",
                                                                      "libnvinfer_builder_resource_win.so")):
    """What tensorrt_cu12_libs installs: site-packages/tensorrt_libs with
    versioned names only, the builder resources under their full version
    (what libnvinfer opens by name at its first engine build)."""
    libs = tmp_path / "site-packages" / "tensorrt_libs"
    libs.mkdir(parents=True, exist_ok=True)
    for n in names:
        real = libs / f"{n}.{major}{minor}"
        real.write_bytes(b"\x7fELF")
        (libs / f"{n}.{major}").symlink_to(real.name)
    for n in resources:
        (libs / f"{n}.{major}{minor}").write_bytes(b"\x7fELF")
    return libs


class Loader:
    def __init__(self, fail=()):
        self.opened, self.fail = [], fail

    def __call__(self, path):
        self.opened.append(path)
        if any(f in path for f in self.fail):
            raise OSError(f"{path}: libcudart.so.12: cannot open shared object file")


def test_versioned_wheel_libraries_are_linked_where_paddle_looks(tmp_path):
    paddle, wheel, load = _paddle(tmp_path), _wheel(tmp_path), Loader()
    libs = locate((10, 5, 0), str(paddle), other_dirs=[str(wheel)], loader=load)
    assert libs.usable, libs.reason
    for name in ("libnvinfer.so", "libnvinfer_plugin.so"):
        link = paddle / "libs" / name
        assert link.is_symlink() and os.readlink(link) == str(wheel / f"{name}.10")
        assert libs.found[name] == str(wheel / f"{name}.10.5.0")
    # What Paddle will open is what was checked to load; then all of the
    # wheel's libraries, as NVIDIA's own `tensorrt` package loads them, the
    # builder resource first, the Windows one (~2 GB) not at all.
    assert load.opened[:2] == [str(paddle / "libs" / "libnvinfer.so"), str(paddle / "libs" / "libnvinfer_plugin.so")]
    preloaded = [os.path.basename(p) for p in load.opened[2:]]
    assert preloaded[0] == "libnvinfer_builder_resource.so.10.5.0"
    assert sorted(preloaded[1:]) == sorted(f"{n}.10.5.0" for n in WHEEL)
    assert libs.preloaded == load.opened[2:]
    # A second replica finds the links and makes none.
    again = locate((10, 5, 0), str(paddle), other_dirs=[str(wheel)], loader=Loader())
    assert again.usable and again.linked == {}


def test_absent_tensorrt_says_what_to_install(tmp_path):
    libs = locate((10, 5, 0), str(_paddle(tmp_path)), other_dirs=[str(tmp_path / "nowhere")], loader=Loader())
    assert not libs.usable
    assert "libnvinfer.so" in libs.reason and "tensorrt_libs install" in libs.reason


def test_another_major_is_not_taken_for_the_compiled_one(tmp_path):
    paddle, wheel = _paddle(tmp_path), _wheel(tmp_path, major="8", minor=".6.1")
    (paddle / "libs" / "libnvinfer.so").symlink_to(wheel / "libnvinfer.so.8")  # a stale link to TensorRT 8
    libs = locate((10, 5, 0), str(paddle), other_dirs=[str(wheel)], loader=Loader())
    assert not libs.usable and "TensorRT 10" in libs.reason


def test_a_library_that_does_not_load_is_not_usable(tmp_path):
    paddle, wheel = _paddle(tmp_path), _wheel(tmp_path)
    libs = locate((10, 5, 0), str(paddle), other_dirs=[str(wheel)], loader=Loader(fail=("libnvinfer.so",)))
    assert not libs.usable and "does not load" in libs.reason and "libcudart" in libs.reason


def test_a_folder_that_cannot_take_the_link_is_reported_with_the_fix(tmp_path):
    paddle, wheel = _paddle(tmp_path), _wheel(tmp_path)
    # (Tests run as root here, so no permission can stand in: a file where the folder should be.)
    (paddle / "libs").rmdir()
    (paddle / "libs").write_text("")
    libs = locate((10, 5, 0), str(paddle), other_dirs=[str(wheel)], loader=Loader())
    assert not libs.usable and "cannot be linked" in libs.reason
    assert "python -m serve_app.inference.tensorrt_libs" in libs.reason


def test_a_wheel_without_the_builder_resource_is_not_usable(tmp_path):
    """TensorRT opens libnvinfer_builder_resource only when it builds its
    first engine: without it every engine build fails later, so it is
    refused now, naming the file."""
    paddle, wheel = _paddle(tmp_path), _wheel(tmp_path, resources=())
    libs = locate((10, 5, 0), str(paddle), other_dirs=[str(wheel)], loader=Loader())
    assert not libs.usable and "libnvinfer_builder_resource.so.10" in libs.reason
    failing = locate((10, 5, 0), str(_paddle(tmp_path / "b")), other_dirs=[str(_wheel(tmp_path / "b"))],
                     loader=Loader(fail=("builder_resource.so",)))
    assert not failing.usable and "does not load" in failing.reason


def test_an_optional_library_that_does_not_load_is_skipped(tmp_path):
    paddle, wheel = _paddle(tmp_path), _wheel(tmp_path)
    libs = locate((10, 5, 0), str(paddle), other_dirs=[str(wheel)], loader=Loader(fail=("libnvinfer_lean",)))
    assert libs.usable, libs.reason
    assert not any("lean" in p for p in libs.preloaded)


# --- installing it: NVIDIA's index, named; REQUIRE_TENSORRT=1 fails the build ---------------------------


class Pip:
    def __init__(self, rc=0):
        self.rc, self.calls = rc, []

    def __call__(self, cmd):
        self.calls.append(cmd)
        return self.rc


def _install(tmp_path, cuda="cu126", require=False, compiled=(10, 5, 0), pip=None, wheel=True):
    from serve_app.inference.tensorrt_libs import install

    lines: list[str] = []
    paddle = _paddle(tmp_path)
    others = [str(_wheel(tmp_path))] if wheel else [str(tmp_path / "nowhere")]
    rc = install(cuda, require, compiled, str(paddle), "/opt/paddle-pin.txt", run=pip or Pip(), python="py",
                 out=lines.append, other_dirs=others, loader=Loader())
    return rc, "\n".join(lines)


def test_install_takes_the_wheel_from_nvidias_index_at_paddles_version(tmp_path):
    pip = Pip()
    rc, out = _install(tmp_path, pip=pip)
    assert rc == 0 and "TensorRT usable" in out
    (cmd,) = pip.calls
    assert cmd[-1] == "tensorrt-cu12-libs==10.5.*"
    assert cmd[cmd.index("--index-url") + 1] == "https://pypi.nvidia.com/"
    assert cmd[cmd.index("--only-binary") + 1] == "tensorrt-cu12-libs"  # never PyPI's nvidia-stub sdist
    assert cmd[cmd.index("-c") + 1] == "/opt/paddle-pin.txt"


def test_a_failed_install_fails_only_when_required(tmp_path):
    rc, out = _install(tmp_path, pip=Pip(rc=1), wheel=False)
    assert rc == 0 and "NOT installed: pip exited 1" in out and "REQUIRE_TENSORRT=1" in out
    rc, out = _install(tmp_path / "again", pip=Pip(rc=1), require=True, wheel=False)
    assert rc == 1 and "NOT installed" in out


def test_installed_but_unusable_fails_when_required(tmp_path):
    rc, out = _install(tmp_path, require=True, wheel=False)
    assert rc == 1 and "TensorRT NOT usable" in out


def test_cu118_says_at_once_it_runs_without_tensorrt(tmp_path):
    pip = Pip()
    rc, out = _install(tmp_path, cuda="cu118", pip=pip)
    assert rc == 0 and pip.calls == [] and "cu118: runs WITHOUT TensorRT" in out and "8.6" in out
    assert _install(tmp_path / "r", cuda="cu118", require=True)[0] == 2


def test_install_on_a_paddle_without_tensorrt(tmp_path):
    rc, out = _install(tmp_path, compiled=(0, 0, 0), require=True)
    assert rc == 2 and "no TensorRT support" in out


def test_the_command_line_install_on_this_machines_paddle():
    """The same step the Dockerfile and `make install-gpu` run, on the CPU
    paddle here (compiled against no TensorRT): cu118 stops before paddle is
    imported, cu126 says this paddle has none; --require turns both into a
    failed build."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    for cuda, want, require, rc in (("cu118", "runs WITHOUT TensorRT", True, 2),
                                    ("cu126", "no TensorRT support", False, 0)):
        out = subprocess.run([sys.executable, "-m", "serve_app.inference.tensorrt_libs", "install", "--cuda", cuda]
                             + (["--require"] if require else []), capture_output=True, text=True, env=env,
                             timeout=120)
        assert out.returncode == rc and want in out.stdout, (cuda, require, out.stdout, out.stderr[-500:])


def test_a_paddle_built_without_tensorrt(tmp_path):
    libs = locate((0, 0, 0), str(_paddle(tmp_path)), other_dirs=[], loader=Loader())
    assert not libs.usable and "no TensorRT support" in libs.reason


def test_auto_falls_back_and_true_refuses():
    assert tensorrt_decision("auto", True, "TensorRT 10 found") == (True, "TensorRT 10 found")
    on, why = tensorrt_decision("auto", False, "no libnvinfer.so")
    assert on is False and "Paddle's GPU kernels" in why and "no libnvinfer.so" in why
    with pytest.raises(ConfigError, match="no libnvinfer.so") as e:
        tensorrt_decision(True, False, "no libnvinfer.so")
    assert "enable: auto" in str(e.value)
    assert tensorrt_decision(False, True, "found")[0] is False


def test_resolve_tensorrt_drops_it_on_auto_and_keeps_it_when_found():
    opts = PredictorOptions(device="gpu", tensorrt={"precision": "fp16"})
    absent = lambda: TensorRTLibs(False, "no libnvinfer.so for TensorRT 10")  # noqa: E731
    got, status = resolve_tensorrt(opts, absent)
    assert got.tensorrt is None and status["on"] is False and status["enable"] == "auto"
    got, status = resolve_tensorrt(opts, lambda: TensorRTLibs(True, "TensorRT 10 found: /x/libnvinfer.so.10.5.0"))
    assert got.tensorrt is not None and status["on"] is True
    with pytest.raises(ConfigError):
        resolve_tensorrt(PredictorOptions(device="gpu", tensorrt=True), absent)
    # On the CPU (a fallback) nothing is probed.
    got, status = resolve_tensorrt(PredictorOptions(device="cpu"), absent)
    assert status["on"] is False


def test_tensorrt_shorthands():
    assert PredictorOptions(device="gpu", tensorrt="auto").tensorrt.enable == "auto"
    assert PredictorOptions(device="gpu", tensorrt=True).tensorrt.enable is True
    assert PredictorOptions(device="gpu", tensorrt=False).tensorrt is None
    assert PredictorOptions(device="gpu", tensorrt={"enable": False, "precision": "fp32"}).tensorrt is None
