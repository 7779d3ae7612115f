"""The GPU smoke run's Python steps (load_tests/gpu_run.sh calls them; each
prints a Markdown section for the report):

    python -m load_tests.gpu_smoke probe      # paddle's build, the GPUs it sees, TensorRT
    python -m load_tests.gpu_smoke engines --json OUT/engines.json
    python -m load_tests.gpu_smoke service --url http://127.0.0.1:8000 --engines OUT/engines.json

engines: the in-process engine over the peer images on the CPU and on the
GPU (plain Paddle: one predictor config for all stages), text compared,
ms/img each. service: load against the deployed GPU profile (TensorRT fp16
runs here), its answers against the CPU engine's, every model replica's
stats beside the GPU memory nvidia-smi sees for its process."""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from harness.peer import PEER, REPO, peer_names
from load_tests.stats import md_table
from load_tests.loadgen import post_file, threaded_load as load, threaded_summary as summarize  # noqa: F401 (the tests')


def peer_images() -> list[Path]:
    return [PEER / n for n in peer_names()]


def probe() -> int:
    import paddle
    from paddle import inference

    cuda = paddle.is_compiled_with_cuda()
    n = paddle.device.cuda.device_count() if cuda else 0
    print("## Paddle and the GPU\n")
    print(f"- paddle {paddle.__version__}, CUDA build: {cuda}, CUDA {paddle.version.cuda()}, "
          f"cuDNN {paddle.version.cudnn()}, GPUs visible: {n}")
    for i in range(n):
        p = paddle.device.cuda.get_device_properties(i)
        print(f"- GPU {i}: {p.name}, {p.total_memory // (1 << 20)} MiB")
    try:
        trt = tuple(inference.get_trt_compile_version())
        rt = tuple(inference.get_trt_runtime_version())
    except Exception as e:  # noqa: BLE001 - a build without TensorRT
        trt, rt = None, f"unavailable ({e})"
    print(f"- TensorRT: paddle compiled against {trt}, runtime {rt}")
    print(f"- allocator strategy: {paddle.get_flags('FLAGS_allocator_strategy')['FLAGS_allocator_strategy']}")
    return 0 if n else 1


def _gpu_profile_engine():
    import yaml

    from serve_app.core.app_args import AppArgs

    cfg = yaml.safe_load((REPO / "deployments.gpu.yaml").read_text())
    return AppArgs.model_validate(cfg["applications"][0]["args"]).engine


def _read_all(engine, images: list[Path]) -> tuple[dict[str, list[str]], float]:
    engine.read(str(images[0]))  # first-call costs out of the timing
    texts, t0 = {}, time.perf_counter()
    for p in images:
        texts[p.name] = [line.text for line in engine.read(str(p)).lines]
    return texts, (time.perf_counter() - t0) * 1000 / len(images)


def line_agreement(a: dict[str, list[str]], b: dict[str, list[str]]) -> tuple[int, int, list[str]]:
    """(lines of `a` also read by `b` for the same image, lines of `a`,
    images whose lines differ)."""
    same = total = 0
    differ = []
    for name, lines in a.items():
        other = collections.Counter(b.get(name, []))
        total += len(lines)
        for t in lines:
            if other[t] > 0:
                other[t] -= 1
                same += 1
        if sorted(lines) != sorted(b.get(name, [])):
            differ.append(name)
    return same, total, differ


def engines(out_json: Path) -> int:
    from serve_app.core.engine_config import PredictorOptions
    from serve_app.engine import OcrEngine

    images = peer_images()
    base = _gpu_profile_engine()
    # The CPU reference: oneDNN fp32 (the GPU build of paddle may not bundle OpenVINO).
    cpu_cfg = base.model_copy(update={"predictor": PredictorOptions(device="cpu", enable_mkldnn=True,
                                                                     cpu_math_library_num_threads=4)})
    gpu_cfg = base.model_copy(update={"predictor": base.predictor.model_copy(update={"tensorrt": None})})
    results = {}
    for name, cfg in (("cpu", cpu_cfg), ("gpu", gpu_cfg)):
        with OcrEngine(cfg) as engine:
            texts, ms = _read_all(engine, images)
        results[name] = {"ms_per_image": round(ms, 1), "texts": texts}
    same, total, differ = line_agreement(results["cpu"]["texts"], results["gpu"]["texts"])
    out_json.write_text(json.dumps(results, ensure_ascii=False, indent=1))
    print(f"## In-process engine, {len(images)} peer images\n")
    print("\n".join(md_table(["device", "ms/img (sequential, after one warm image)"],
                             ([n, results[n]["ms_per_image"]] for n in ("cpu", "gpu")))))
    print(f"\nGPU (plain Paddle, fp32) vs CPU (oneDNN fp32): {same}/{total} CPU lines read identically "
          f"({100 * same / max(total, 1):.1f}%); images that differ: {', '.join(differ) or 'none'}")
    return 0


def _post(url: str, path: Path):
    import os

    token = os.environ.get("OCR_AUTH_TOKEN")  # the GPU profile's token (gpu_run.sh sets one)
    return post_file(url, path, headers={"Authorization": f"Bearer {token}"} if token else {})


def stage_ms(batches: list[dict]) -> dict:
    """From a replica's recent batches: median ms of a batch of one item and
    of the largest batch seen (the served batch under load)."""
    by_items: dict[int, list[float]] = collections.defaultdict(list)
    for b in batches:
        by_items[int(b["items"])].append(float(b["ms"]))
    served = max(by_items) if by_items else None
    return {"batch1_ms": statistics.median(by_items[1]) if 1 in by_items else None, "served_batch": served,
            "served_ms": statistics.median(by_items[served]) if served else None}


def service(url: str, engines_json: Path, seconds: float, levels: list[int]) -> int:
    images = peer_images()
    print("## The GPU profile as a service (deployments.gpu.yaml)\n")
    # Answers vs the CPU engine (one request at a time).
    texts, t0 = {}, time.perf_counter()
    for p in images:
        r = _post(url, p)
        texts[p.name] = [x["text"] for x in r.json().get("results", [])] if r.status_code == 200 else []
    seq_ms = (time.perf_counter() - t0) * 1000 / len(images)
    agreement = "n/a (no engines step)"
    if engines_json.exists():
        cpu = json.loads(engines_json.read_text())["cpu"]["texts"]
        same, total, differ = line_agreement(cpu, texts)
        agreement = (f"{same}/{total} lines identical ({100 * same / max(total, 1):.1f}%); images that differ: "
                     f"{', '.join(differ) or 'none'}")
    runs = [load(url, images, n, seconds, _post) for n in levels]
    rows = replicas()
    print("\n## Summary\n")
    print("\n".join(md_table(["what", "value"], [
        ["text, service on the GPU vs in-process CPU engine (peer images)", agreement],
        ["one request at a time over HTTP", f"{seq_ms:.1f} ms/img"],
        *([f"{r['clients']} clients, {seconds:.0f} s", f"{r['img_s']:.2f} img/s, p50 {r['p50_ms']:.0f} ms, "
           f"p99 {r['p99_ms']:.0f} ms; statuses {r['codes']}"] for r in runs),
        *([f"{row['stage']} pid {row['pid']}", row["summary"]] for row in rows)], "ll")))
    print("\n## Agreement with fp32 per stage (start-up check, packaged real images: rec CER <= 1%, det mean IoU >= 0.9, cls 98%; else fp32)\n")
    print("\n".join(md_table(["stage", "replica", "precision and agreement"],
                             ([row["stage"], row["pid"], row["precision"]] for row in rows), "lrl")))
    return 0 if all(r["clean"] for r in runs) else 1


def _gpu_memory_by_pid() -> dict[int, int]:
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    used = {}
    for line in out.splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            used[int(parts[0])] = int(parts[1])
    return used


def replicas() -> list[dict]:
    """Every model replica's stats (through Serve handles), with the GPU
    memory nvidia-smi sees for its process."""
    import ray
    from ray import serve

    from harness.service import replica_stats

    ray.init(address="auto", logging_level="ERROR")
    used = _gpu_memory_by_pid()
    rows: list[dict] = []
    print("\n### Model replicas\n")
    print("| stage | pid | device | Ray GPU share | Paddle limit MiB (enforced) | GPU MiB used (nvidia-smi) "
          "| TensorRT shapes / batch max | batches seen | items per batch (count) |")
    print("|---|---:|---|---:|---:|---:|---|---:|---|")
    for name in ("TextDetector", "DirectionClassifier", "TextRecognizer"):
        seen = replica_stats(serve.get_deployment_handle(name, app_name="ocr"), n=10**6, tries=40)  # every pid 40 calls reach
        for pid, s in sorted(seen.items()):
            trt = s.get("tensorrt") or {}
            sizes = collections.Counter(b["items"] for b in s["recent_batches"])
            print(f"| {s['stage']} | {pid} | {s['device']} | {s.get('gpu_memory_fraction')} | "
                  f"{s.get('gpu_memory_limit_mb')} | {used.get(pid, 'n/a')} | "
                  f"{trt.get('input_shapes', '-')} / {trt.get('max_batch_size', '-')} | {len(s['recent_batches'])} | "
                  f"{dict(sorted(sizes.items()))} |")
            rows.append({"stage": s["stage"], "pid": pid, "summary": replica_summary(s, used.get(pid)),
                         "precision": precision_summary(s)})
    print("\nPaddle's limit counts what Paddle allocates; nvidia-smi also counts the CUDA context, "
          "cuBLAS/cuDNN and TensorRT's own memory: the difference per replica is the figure for "
          "gpu_memory_reserve_mb (768 MiB by default, not measured before this run).")
    return rows


def precision_summary(s: dict) -> str:
    """A replica's precision and its start-up agreement with fp32
    (serve_app/inference/precision_check.py), with the int8 table it used."""
    trt = s.get("tensorrt") or {}
    if not trt.get("enabled"):
        return "fp32 (no TensorRT: nothing to check)"
    check = s.get("precision_check")
    if not check:
        return f"TensorRT {trt.get('precision')}: no check (fp32)"
    text = (f"TensorRT {check.get('precision', trt.get('precision'))}: {check['identical']}/{check['total']} "
            f"{check.get('unit', 'lines identical to fp32')} ({100 * check['fraction']:.1f}%)")
    cal = trt.get("int8_calibration")
    if cal:
        text += (f"; int8 table {'reused' if cal.get('reused') else 'made'} ({cal.get('batches')} batches of "
                 f"{cal.get('opt')}, {len(cal.get('tables') or [])} tables)")
    return text


def replica_summary(s: dict, gpu_used_mib) -> str:
    """One cell: ms per batch at 1 and at the served batch, GPU memory
    against the limit, TensorRT on/off and why, the agreement with fp32."""
    ms = stage_ms(s.get("recent_batches") or [])
    trt = s.get("tensorrt") or {}
    trt_text = ("TensorRT " + ("on" if trt.get("enabled") else "off") + f" ({trt.get('why')})") if trt else "no TensorRT"
    b1 = f"{ms['batch1_ms']:.1f}" if ms["batch1_ms"] is not None else "n/a"
    served = f"{ms['served_ms']:.1f} ms at batch {ms['served_batch']}" if ms["served_batch"] else "no batch seen"
    return (f"{s.get('device')}: {b1} ms at batch 1, {served}; GPU {gpu_used_mib if gpu_used_mib is not None else 'n/a'}"
            f" MiB used (nvidia-smi) vs limit {s.get('gpu_memory_limit_mb')} MiB; {trt_text}; "
            f"{precision_summary(s)}")


def add_cli_args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="cmd")
    sub.add_parser("probe")
    e = sub.add_parser("engines")
    e.add_argument("--json", type=Path, required=True)
    s = sub.add_parser("service")
    s.add_argument("--url", default="http://127.0.0.1:8000")
    s.add_argument("--engines", type=Path, default=Path("/nonexistent"))
    s.add_argument("--seconds", type=float, default=20, help="per client level")
    s.add_argument("--clients", default="1,8,32", help="client levels, comma-separated")


def main(a: argparse.Namespace) -> int:
    if a.cmd is None:
        raise SystemExit("gpu smoke: name a step: probe, engines or service")
    if a.cmd == "probe":
        return probe()
    if a.cmd == "engines":
        return engines(a.json)
    return service(a.url, a.engines, a.seconds, [int(c) for c in a.clients.split(",")])


if __name__ == "__main__":
    from load_tests.cli import standalone

    sys.exit(standalone(__name__))
