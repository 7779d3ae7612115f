"""#29 item 2: `make install-gpu` picks the paddlepaddle-gpu build from
nvidia-smi (driver version, compute capability), or stops naming the fix.
Captured nvidia-smi outputs (--query-gpu=name,driver_version,compute_cap
--format=csv,noheader); nvidia-smi itself stood in."""

from __future__ import annotations

import subprocess

import pytest

from serve_app.tools.gpu_build import Stop, choose, main, parse

H200 = "NVIDIA H200, 570.124.06, 9.0\n"
H100_OLD = "NVIDIA H100 80GB HBM3, 535.161.08, 9.0\n"
A100_535 = "NVIDIA A100-SXM4-80GB, 535.183.01, 8.0\nNVIDIA A100-SXM4-80GB, 535.183.01, 8.0\n"
L4 = "NVIDIA L4, 560.35.03, 8.9\n"
T4_470 = "Tesla T4, 470.239.06, 7.5\n"
B200 = "NVIDIA B200, 575.57.08, 10.0\n"
B200_570 = "NVIDIA B200, 570.133.20, 10.0\n"
RTX5090 = "NVIDIA GeForce RTX 5090, 576.02, 12.0\n"
K80 = "Tesla K80, 470.82.01, 3.7\n"
MIXED = "NVIDIA H100 PCIe, 580.65.06, 9.0\nNVIDIA GeForce RTX 5090, 580.65.06, 12.0\n"
OLD_DRIVER = 'Field "compute_cap" is not a valid field to query.\n'


def pick(out, wanted=None):
    return choose(parse(out), wanted)[0]


@pytest.mark.parametrize("out, want", [
    (H200, "cu126"),          # Hopper: not cu118
    (L4, "cu126"),
    (A100_535, "cu118"),      # driver below cu126's 550.54.14: the build it can run
    (T4_470, "cu118"),
    (B200, "cu129"),          # Blackwell: not cu126
    (RTX5090, "cu129"),
    (MIXED, "cu129"),         # one build for both generations
])
def test_the_build_follows_driver_and_generation(out, want):
    assert pick(out) == want


@pytest.mark.parametrize("out, words", [
    (H100_OLD, ["upgrade the NVIDIA driver", "550.54.14", "535.161.08"]),   # Hopper on an old driver: cu118 cannot
    (B200_570, ["upgrade the NVIDIA driver", "575.51.03"]),
    (K80, ["no kernels", "3.7"]),
    (OLD_DRIVER, ["too old", "compute_cap"]),
    ("", ["lists no GPU"]),
])
def test_no_fit_stops_with_the_fix(out, words):
    with pytest.raises(Stop) as e:
        pick(out)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_an_explicit_choice_is_checked():
    assert pick(MIXED, "cu129") == "cu129" and pick(L4, "cu118") == "cu118"
    with pytest.raises(Stop, match="575.51.03; this machine has 570.124.06"):
        pick(H200, "cu129")  # a fitting generation, too old a driver for that build
    with pytest.raises(Stop, match="cu118 has no kernels for NVIDIA H200"):
        pick(H200, "cu118")
    with pytest.raises(Stop, match="cu126 has no kernels for NVIDIA B200"):
        pick(B200, "cu126")
    with pytest.raises(Stop, match="not a Paddle 3 build"):
        pick(H200, "cu121")


class Smi:
    def __init__(self, stdout="", rc=0, missing=False, stderr=""):
        self.stdout, self.rc, self.missing, self.stderr = stdout, rc, missing, stderr

    def __call__(self, cmd, **kw):
        assert cmd[0] == "nvidia-smi"
        if self.missing:
            raise FileNotFoundError(cmd[0])
        return subprocess.CompletedProcess(cmd, self.rc, self.stdout, self.stderr)


def test_main_prints_the_tag_or_stops_at_once(capsys):
    assert main([], run=Smi(H200)) == 0
    out = capsys.readouterr()
    assert out.out.strip() == "cu126" and "H200" in out.err
    assert main([], run=Smi(missing=True)) == 1
    assert "nvidia-smi not found" in capsys.readouterr().err
    failed = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    assert main([], run=Smi(failed, rc=9)) == 1
    err = capsys.readouterr().err
    assert "couldn't communicate" in err and "STOPPED" in err
