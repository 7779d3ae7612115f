"""#29 item 1: TensorRT is optional. Paddle's probe (a bare
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


def _wheel(tmp_path, major="10", names=("libnvinfer.so", "libnvinfer_plugin.so"), minor=".5.0"):
    """What tensorrt_cu12_libs installs: site-packages/tensorrt_libs with versioned names only."""
    libs = tmp_path / "site-packages" / "tensorrt_libs"
    libs.mkdir(parents=True, exist_ok=True)
    for n in names:
        real = libs / f"{n}.{major}{minor}"
        real.write_bytes(b"\x7fELF")
        (libs / f"{n}.{major}").symlink_to(real.name)
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
    # What Paddle will open is what was checked to load.
    assert load.opened == [str(paddle / "libs" / "libnvinfer.so"), str(paddle / "libs" / "libnvinfer_plugin.so")]
    # A second replica finds the links and makes none.
    again = locate((10, 5, 0), str(paddle), other_dirs=[str(wheel)], loader=Loader())
    assert again.usable and again.linked == {}


def test_absent_tensorrt_says_what_to_install(tmp_path):
    libs = locate((10, 5, 0), str(_paddle(tmp_path)), other_dirs=[str(tmp_path / "nowhere")], loader=Loader())
    assert not libs.usable
    assert "libnvinfer.so" in libs.reason and "tensorrt-cu12==10.*" in libs.reason


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
