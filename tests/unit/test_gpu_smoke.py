"""The GPU smoke run's comparison and inputs, on the CPU (the run itself
needs a GPU: load_tests/gpu_run.sh)."""

from __future__ import annotations

from load_tests.gpu_smoke import PEER, line_agreement, peer_images


def test_line_agreement_counts_lines_read_identically_per_image():
    cpu = {"a.png": ["TEST", "TEST", "x"], "b.png": ["hello"], "c.png": []}
    gpu = {"a.png": ["TEST", "x", "y"], "b.png": ["hello"], "c.png": ["noise"]}
    same, total, differ = line_agreement(cpu, gpu)
    assert (same, total) == (3, 4)  # one of the two TESTs is missing on the GPU
    assert differ == ["a.png", "c.png"]


def test_the_peer_images_travel_with_the_repo():
    images = peer_images()
    assert len(images) == 60 and all(p.parent == PEER for p in images)
    assert (PEER / "rapidocr_issue_170.png") in images


# --- #29 item 7: make gpu-check's parsing and failure paths ------------------------------

import os  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from load_tests import gpu_preflight as pre  # noqa: E402
from load_tests.gpu_smoke import replica_summary, stage_ms, summarize  # noqa: E402
from serve_app.tools.gpu_build import Stop  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def test_stage_ms_at_batch_one_and_at_the_served_batch():
    batches = [{"items": 1, "ms": 4.0}, {"items": 1, "ms": 6.0}, {"items": 8, "ms": 20.0}, {"items": 3, "ms": 9.0},
               {"items": 8, "ms": 22.0}, {"items": 8, "ms": 30.0}]
    assert stage_ms(batches) == {"batch1_ms": 5.0, "served_batch": 8, "served_ms": 22.0}
    assert stage_ms([]) == {"batch1_ms": None, "served_batch": None, "served_ms": None}


def test_summarize_load_percentiles_and_statuses():
    r = summarize(8, [float(x) for x in range(1, 101)], {200: 99, 503: 1}, wall_s=10.0)
    assert r["img_s"] == pytest.approx(9.9) and r["p50_ms"] == pytest.approx(50.5)
    assert r["p99_ms"] == pytest.approx(99.01) and r["clean"] is False  # a 503 is not a clean run
    assert summarize(1, [5.0], {"ConnectionError": 1}, 1.0)["clean"] is False


def test_replica_summary_says_tensorrt_and_memory():
    s = {"device": "gpu", "gpu_memory_limit_mb": 34000, "recent_batches": [{"items": 16, "ms": 12.5}],
         "tensorrt": {"enabled": False, "why": "tensorrt.enable: auto, running on Paddle's GPU kernels: no libnvinfer.so"}}
    text = replica_summary(s, 2100)
    assert "n/a ms at batch 1" in text and "12.5 ms at batch 16" in text
    assert "2100 MiB used (nvidia-smi) vs limit 34000 MiB" in text and "TensorRT off (tensorrt.enable: auto" in text


class Run:
    """subprocess.run stood in: nvidia-smi answers `smi`, Pythons per their name."""

    def __init__(self, smi="NVIDIA H200, 570.124.06, 9.0\n", pythons=("python3.12",), venv=True):
        self.smi, self.pythons, self.venv = smi, pythons, venv

    def __call__(self, cmd, **kw):
        if cmd[0] == "nvidia-smi":
            if self.smi is None:
                raise FileNotFoundError("nvidia-smi")
            return subprocess.CompletedProcess(cmd, 0, self.smi, "")
        ok = Path(cmd[0]).name in self.pythons
        if "import venv, ensurepip" in cmd[-1]:
            ok = self.venv
        return subprocess.CompletedProcess(cmd, 0 if ok else 1, "3.12\n", "")


def which_of(*present):
    return lambda name: f"/usr/bin/{name}" if name in present else None


class Answer:
    status = 200

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def test_preflight_passes_and_names_the_build():
    tools = which_of("curl", "git", "make", "python3.12")
    cuda, why, python = pre.preflight(pre_port(), run=Run(), which=tools, urlopen=lambda u, timeout: Answer(),
                                      free_gb=100)
    assert cuda == "cu126" and python == "/usr/bin/python3.12" and "H200" in why


def pre_port() -> int:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.mark.parametrize("kw, words", [
    ({"which": which_of("git", "make", "python3.12")}, ["curl", "apt-get install curl"]),
    ({"run": Run(smi=None)}, ["nvidia-smi not found", "--gpus all"]),
    ({"run": Run(smi="NVIDIA H100 80GB HBM3, 535.161.08, 9.0\n")}, ["upgrade the NVIDIA driver", "550.54.14"]),
    ({"run": Run(pythons=()), "which": which_of("curl", "git", "make", "python3")}, ["no Python 3.11 or 3.12"]),
    ({"run": Run(venv=False)}, ["python3.12-venv"]),
    ({"free_gb": 3.0}, ["3.0 GiB free"]),
    ({"urlopen": "down"}, ["cannot reach https://pypi.org", "HTTPS_PROXY"]),
])
def test_each_missing_piece_stops_at_once_with_its_fix(kw, words):
    def down(url, timeout):
        raise OSError("Name or service not known")

    args = {"run": Run(), "which": which_of("curl", "git", "make", "python3.12"),
            "urlopen": lambda u, timeout: Answer(), "free_gb": 100}
    args.update(kw)
    if args["urlopen"] == "down":
        args["urlopen"] = down
    with pytest.raises(Stop) as e:
        pre.preflight(pre_port(), **args)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_a_taken_port_stops_it():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    try:
        with pytest.raises(Stop, match="is taken"):
            pre.check_port(s.getsockname()[1])
    finally:
        s.close()


def _path_with(tmp_path, tools) -> str:
    """A PATH holding only `tools` (and this interpreter as python3)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(os.path.realpath(sys.executable))
    for tool in tools:
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    return str(bin_dir)


BASICS = ("bash", "git", "make", "date", "mkdir", "tee", "grep", "sed", "cat", "dirname", "tr", "tail", "head", "od",
          "env")


def test_gpu_run_without_curl_stops_at_once_instead_of_waiting(tmp_path):
    """The old script polled /readyz with curl for up to 30 minutes; without
    curl every poll failed. Now the real script, on a PATH without curl,
    stops in its preflight with the fix, before installing anything."""
    out = tmp_path / "out"
    env = {**os.environ, "PATH": _path_with(tmp_path, BASICS)}
    proc = subprocess.run(["bash", str(REPO / "load_tests" / "gpu_run.sh"), str(out)], env=env, capture_output=True,
                          text=True, timeout=120)
    report = (out / "report.md").read_text()
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "STOPPED" in report and "curl" in report and "apt-get install curl" in report
    assert not (out / "install.log").exists()  # nothing was installed


def test_gpu_run_without_a_driver_stops_naming_it(tmp_path):
    """curl there, nvidia-smi not (a PATH without it, on any machine): the
    preflight says to install the driver."""
    path = _path_with(tmp_path, BASICS)
    curl = Path(path) / "curl"  # a stand-in: the preflight stops before anything calls it
    curl.write_text("#!/bin/sh\nexit 7\n")
    curl.chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "PATH": path, "PORT": str(pre_port())}
    proc = subprocess.run(["bash", str(REPO / "load_tests" / "gpu_run.sh"), str(out)], capture_output=True,
                          text=True, timeout=120, env=env)
    report = (out / "report.md").read_text()
    assert proc.returncode == 1 and "nvidia-smi not found" in report, report
    assert not (out / "install.log").exists()


def test_the_report_gives_each_stages_agreement_with_fp32():
    from load_tests.gpu_smoke import precision_summary

    base = {"device": "gpu", "gpu_memory_limit_mb": 34000, "recent_batches": []}
    assert precision_summary({**base, "tensorrt": None}) == "fp32 (no TensorRT: nothing to check)"
    assert precision_summary({**base, "tensorrt": {"enabled": True, "precision": "fp32"}}) == \
        "TensorRT fp32: no check (fp32)"
    det = {**base, "tensorrt": {"enabled": True, "precision": "int8", "int8_calibration": {
        "reused": False, "batches": 2, "opt": [8, 3, 640, 640], "tables": ["trt_calib_1", "trt_calib_2"]}},
        "precision_check": {"precision": "int8", "identical": 165, "total": 165, "fraction": 1.0,
                            "unit": "boxes matched to fp32's at IoU >= 0.9"}}
    assert precision_summary(det) == ("TensorRT int8: 165/165 boxes matched to fp32's at IoU >= 0.9 (100.0%); "
                                      "int8 table made (2 batches of [8, 3, 640, 640], 2 tables)")
    assert replica_summary(det, 900).endswith("; " + precision_summary(det))
