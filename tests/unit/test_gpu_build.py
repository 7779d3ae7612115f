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


# --- #39 item 5: an install that fails fast -------------------------------------------------------


def test_the_python_is_checked_before_nvidia_smi_and_any_download(capsys):
    """Ubuntu 22.04's python3 (3.10): stopped before nvidia-smi is even
    asked, naming the fix; a Python without venv too."""
    assert main([], run=lambda *a, **k: pytest.fail("nvidia-smi asked before the Python check"),
                python=(3, 10, 12), has_venv=True) == 1
    err = capsys.readouterr().err
    assert "Python 3.10" in err and "nothing was downloaded" in err and "PY=python3.12" in err
    assert main([], run=Smi(H200), python=(3, 12, 3), has_venv=False) == 1
    assert "python3.12-venv" in capsys.readouterr().err
    assert main([], run=Smi(H200), python=(3, 12, 3), has_venv=True) == 0


def test_an_r535_driver_gets_cu118_without_tensorrt_said_at_once_or_stops_on_hopper(capsys):
    t4_535 = "Tesla T4, 535.230.02, 7.5\n"
    assert main([], run=Smi(t4_535)) == 0
    out = capsys.readouterr()
    assert out.out.strip() == "cu118" and "runs WITHOUT TensorRT" in out.err
    assert main([], run=Smi(H100_OLD)) == 1
    err = capsys.readouterr().err
    assert "upgrade the NVIDIA driver" in err and "550.54.14" in err


def test_make_install_gpu_stops_before_making_the_environment(tmp_path):
    """`make install-gpu` with a stand-in nvidia-smi on PATH reporting a
    driver too old for any build: it stops with the fix, and no
    environment was made (nothing downloaded)."""
    import os
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA H100 80GB HBM3, 535.161.08, 9.0'\n")
    smi.chmod(0o755)
    venv = tmp_path / "venv-gpu"
    out = subprocess.run(["make", "--no-print-directory", "install-gpu", f"PY={sys.executable}", f"GPU_VENV={venv}"],
                         cwd=repo, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(repo)})
    assert out.returncode != 0 and "STOPPED" in out.stderr and "550.54.14" in out.stderr, out.stderr
    assert not venv.exists()


def test_the_gpu_check_stops_at_once_and_reports_each_steps_time(tmp_path):
    """load_tests/gpu_run.sh with a stand-in nvidia-smi (an H100 on R535):
    the preflight stops it before any install, and the report ends with the
    time of each step run; the bounded part without an install stops at once."""
    import os
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA H100 80GB HBM3, 80GB, 535.161.08, 9.0'\n"
                   "case \"$*\" in *noheader*) echo 'NVIDIA H100 80GB HBM3, 535.161.08, 9.0';; esac\n")
    smi.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(repo)}
    out_dir = tmp_path / "out"
    run = subprocess.run(["bash", "load_tests/gpu_run.sh", "--install-only", str(out_dir)], cwd=repo, env=env,
                         capture_output=True, text=True, timeout=120)
    report = (out_dir / "report.md").read_text()
    assert run.returncode == 1 and "STOPPED" in report and "550.54.14" in report, report
    assert "## Time per step" in report and "| preflight |" in report and "STOPPED |" in report
    assert "make install-gpu" not in report  # nothing installed
    check = subprocess.run(["bash", "load_tests/gpu_run.sh", "--installed", str(tmp_path / "out2")], cwd=repo,
                           env={**env, "PATH": env["PATH"]}, capture_output=True, text=True, timeout=60)
    if not (repo / ".venv-gpu" / "bin" / "python").exists():
        assert check.returncode == 1 and "no .venv-gpu" in (tmp_path / "out2" / "report.md").read_text()
