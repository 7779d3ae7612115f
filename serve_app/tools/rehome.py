"""Rooms by role (issue 23 item 5): where each of serve_app's flat modules
went, and the tool that moves them and rewrites what names them.

    python -m serve_app.tools.rehome rewrite FILE...   # rewrite old paths in these files (idempotent)
    python -m serve_app.tools.rehome rewrite --tree     # ... in every tracked text file of the repo
    python -m serve_app.tools.rehome move               # git mv the old modules to their rooms (once)
    python -m serve_app.tools.rehome check FILE...      # exit 1 naming the files that still use old paths

What `rewrite` changes, in any file (.py, .yaml, .md, Makefile, .toml, .sh, ...):
- dotted paths `serve_app.X[.Y...]` (imports, `import_path`s, `policy_function`s,
  `python -m`, mock.patch targets, class paths in YAML) to the new module;
- `from serve_app import X` to `from serve_app.ROOM import NEW as X` (the name
  the code uses stays);
- `from serve_app.OLD import a, b` where a name moved out of OLD when a big
  module was split (SYMBOLS) to one import per new module;
- file paths `serve_app/X.py` and folders (`serve_app/stages/`) in prose;
- in .py files under serve_app/, relative imports (`from .config import X`,
  `from . import paddlex`, `from ..errors import Y`) to absolute new ones,
  resolved against the file's place, or against its old place when the file
  has already been moved (a branch's edited module re-applied in its room).
A path that is already new is left alone, so running it twice, or over a
tree that mixes old and new paths, gives the same result. Paths of modules
this table does not know (a module a branch added at serve_app's top level)
are left as they are: move such a module into its room by hand (and add it
to MODULES so that the next run rewrites its importers). A file holding the
marker KEEP (below) is skipped: this table, and its test's fixtures.

rehome: keep old paths"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path
from typing import Iterable, Optional

from serve_app import LAYERS  # the rooms, bottom to top

# old module path -> new module path
MODULES: dict[str, str] = {
    # core: the shared vocabulary (errors, static config, per-request options,
    # result carriers, the request's context and its lanes); imports nothing else
    "serve_app.errors": "serve_app.core.errors",
    "serve_app.config": "serve_app.core.engine_config",
    "serve_app.settings": "serve_app.core.app_args",
    "serve_app.options": "serve_app.core.request_options",
    "serve_app.results": "serve_app.core.results",
    "serve_app.lanes": "serve_app.core.lanes",
    "serve_app.request_context": "serve_app.core.request_context",
    # ocr: pure numpy/OpenCV steps on one image (no Ray, no Paddle)
    "serve_app.stages": "serve_app.ocr",
    "serve_app.stages.crop": "serve_app.ocr.crop",
    "serve_app.stages.db_postprocess": "serve_app.ocr.db_postprocess",
    "serve_app.stages.decode": "serve_app.ocr.decode",
    "serve_app.stages.det_preprocess": "serve_app.ocr.det_preprocess",
    "serve_app.stages.direction": "serve_app.ocr.direction",
    "serve_app.stages.layout": "serve_app.ocr.layout",
    "serve_app.stages.orientation": "serve_app.ocr.orientation",
    "serve_app.stages.reading_order": "serve_app.ocr.reading_order",
    "serve_app.stages.recognition": "serve_app.ocr.recognition",
    "serve_app.stages.tiling": "serve_app.ocr.tiling",
    "serve_app.stages.words": "serve_app.ocr.words",
    "serve_app.image_header": "serve_app.ocr.image_header",
    "serve_app.visualize": "serve_app.ocr.visualize",
    # inference: the Paddle Inference seam (predictors, weights, compiled
    # caches, shape ranges, the stage runners over a predictor)
    "serve_app.predictor": "serve_app.inference.predictor",
    "serve_app.weights": "serve_app.inference.weights",
    "serve_app.compile_cache": "serve_app.inference.compile_cache",
    "serve_app.shape_ranges": "serve_app.inference.shape_ranges",
    "serve_app.runners": "serve_app.inference.runners",
    "serve_app.tensorrt_libs": "serve_app.inference.tensorrt_libs",
    "serve_app.precision_check": "serve_app.inference.precision_check",
    "serve_app.int8_calibration": "serve_app.inference.int8_calibration",
    # flow: a read from upload to answer (pipeline, documents and their
    # pages, the answer's formats); no Ray
    "serve_app.pipeline": "serve_app.flow.pipeline",
    "serve_app.documents": "serve_app.flow.documents",
    "serve_app.pdf_worker": "serve_app.flow.pdf_worker",
    "serve_app.tiff_pages": "serve_app.flow.tiff_pages",
    "serve_app.upload": "serve_app.flow.upload",
    "serve_app.formats": "serve_app.flow.formats",
    # serving: Serve deployments and the policies around them
    "serve_app.deployments": "serve_app.serving.deployments",
    "serve_app.replica": "serve_app.serving.replica",
    "serve_app.crop_scheduler": "serve_app.serving.crop_scheduler",
    "serve_app.admission": "serve_app.serving.admission",
    "serve_app.result_cache": "serve_app.serving.result_cache",
    "serve_app.routing": "serve_app.serving.routing",
    "serve_app.cls_beside_rec": "serve_app.serving.cls_beside_rec",
    "serve_app.autoscaling": "serve_app.serving.autoscaling",
    "serve_app.canary": "serve_app.serving.canary",
    "serve_app.live_stats": "serve_app.serving.live_stats",
    "serve_app.metrics": "serve_app.serving.metrics",
    "serve_app.isolation": "serve_app.serving.isolation",
    "serve_app.payloads": "serve_app.serving.payloads",
    # jobs: the job book, its journal and Redis backends, the JobStore deployment
    "serve_app.jobs": "serve_app.jobs.store",
    "serve_app.job_book": "serve_app.jobs.book",
    "serve_app.job_clients": "serve_app.http.clients",
    "serve_app.job_journal": "serve_app.jobs.journal",
    "serve_app.job_redis": "serve_app.jobs.redis_book",
    "serve_app.job_results": "serve_app.jobs.results",
    "serve_app.job_state": "serve_app.jobs.state",
    # http: the ingress and one module per API; reading a request
    "serve_app.ingress": "serve_app.http.ingress",
    "serve_app.http_body": "serve_app.http.body",
    "serve_app.http_headers": "serve_app.http.headers",
    "serve_app.http_schema": "serve_app.http.schema",
    "serve_app.paddlex": "serve_app.http.paddlex",
    "serve_app.ui": "serve_app.http.ui",
    # integrations: other programs answered by the service
    "serve_app.ocrmypdf_plugin": "serve_app.integrations.ocrmypdf_plugin",
}

# Folders of package data that moved with the module that reads them.
FOLDERS: dict[str, str] = {
    "serve_app/stages": "serve_app/ocr",
    "serve_app/static": "serve_app/http/static",
    "serve_app/calibration": "serve_app/inference/calibration",
}

# Names that moved out of a module when it was split (old module path.name
# -> new module path); a name not listed stayed in its module's new home.
SYMBOLS: dict[str, str] = {
    **{f"serve_app.predictor.{name}": "serve_app.inference.gpu" for name in (
        "trt_compile_version", "paddle_location", "tensorrt_decision", "resolve_tensorrt", "GpuMemoryBound",
        "gpu_memory_limit_mb", "GpuMemoryLimiter", "_limiter", "_process_limiter", "device_total_mb")},
    **{f"serve_app.ingress.{name}": "serve_app.http.api" for name in (
        "log", "api", "unwrap", "downstream", "_ingress", "request_id", "RequestId", "authorized", "V1",
        "paddlex_shape", "PADDLEX", "Format", "with_lane", "formatted", "error_response", "_item_error",
        "_request_id_of", "domain_error", "invalid_request", "http_error", "DOC_PATHS", "PAGE_HEADERS", "app_path",
        "docs_behind_token", "cross_origin", "count_outcomes")},
    **{f"serve_app.ingress.{name}": f"serve_app.http.{room}" for name, room in (
        ("V1Routes", "v1"), ("PaddleXRoutes", "paddlex_api"), ("JobRoutes", "jobs_api"), ("PageRoutes", "page"))},
    **{f"serve_app.admission.{name}": "serve_app.serving.cost" for name in (
        "UNKNOWN_PIXELS", "Size", "image_size", "_tiles", "CostModel", "DrainMeter", "Decision", "retry_after", "expected_seconds", "decide", "Calibration")},
    **{f"serve_app.job_redis.{name}": "serve_app.jobs.redis_scripts" for name in (
        "_FORGET", "_SUBMIT", "_CLAIM", "_RENEW", "_PROGRESS", "_FINISH", "_FORGET_ONE", "_EXPIRE", "redis_prefix", "check_fsync")},
    **{f"serve_app.pipeline.{name}": "serve_app.flow.fan_out" for name in (
        "fan_out_parts", "deal_by_width", "merge_shares", "PART_OFFSETS", "route_tag", "parse_route_tag", "preferred_replica", "fanned_out")},
    **{f"serve_app.pdf_worker.{name}": "serve_app.flow.pdf_child" for name in (
        "_vm_bytes", "_Server", "_PageError", "Char", "_page_chars", "_runs", "_quad", "_line", "_die_with_parent", "main")},
}
# ... and the same names under their old module's new home
SYMBOLS.update({MODULES[old.rsplit(".", 1)[0]] + "." + old.rsplit(".", 1)[1]: new for old, new in list(SYMBOLS.items())})

NEW_MODULES = set(MODULES.values()) | {"serve_app", "serve_app.app", "serve_app.engine", "serve_app.client",
                                       "serve_app.__main__", "serve_app.tools"} | {
    "serve_app." + room for room in LAYERS}
NEW_MODULES |= set(SYMBOLS.values())

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
# (not the module of a `from X import`: the from-pass rewrote it already)
_DOTTED = re.compile(rf"(?<![\w.])serve_app(?:\.{_NAME})+(?!\w)(?!\.[A-Za-z_])(?![ \t]+import\b)")
_SLASHED = re.compile(r"(?<![\w/])serve_app/(?:[A-Za-z0-9_]+/)*[A-Za-z0-9_]+(?:\.py)?")
_FROM = re.compile(rf"^(?P<indent>[ \t]*)from[ \t]+(?P<mod>\.+(?:{_NAME}(?:\.{_NAME})*)?|serve_app(?:\.{_NAME})*)"
                   rf"[ \t]+import[ \t]+(?P<names>\([^)]*\)|[^\n#]*?)(?P<tail>[ \t]*(?:#[^\n]*)?)$", re.M)


def _segments(path: str) -> int:
    return path.count(".") + 1


def _longest(path: str, known: Iterable[str]) -> Optional[str]:
    best = None
    for k in known:
        if (path == k or path.startswith(k + ".")) and (best is None or len(k) > len(best)):
            best = k
    return best


def new_path(dotted: str) -> str:
    """A dotted path (module, module.attr, ...) in the new tree; a path that
    is already new, or unknown, unchanged."""
    old = _longest(dotted, set(MODULES) | set(SYMBOLS))
    if old is None:
        return dotted
    new = _longest(dotted, NEW_MODULES)
    # Already new: a new module matches at least as deep as the old one
    # (`serve_app.jobs` is both the old module and the new package: a path
    # under it is new only if it names one of the package's modules).
    if new is not None and (_segments(new) > _segments(old) or (new == old and old not in MODULES)):
        return dotted
    if old in SYMBOLS:
        return SYMBOLS[old] + "." + old.rsplit(".", 1)[1] + dotted[len(old):]
    return MODULES[old] + dotted[len(old):]


def _slashed(m: re.Match) -> str:
    text = m.group(0)
    for old, new in FOLDERS.items():
        if text == old or text.startswith(old + "/"):
            return new + text[len(old):]
    if not text.endswith(".py"):
        return text
    dotted = text[:-3].replace("/", ".")
    if dotted.endswith(".__init__"):
        return text
    moved = new_path(dotted)
    return moved.replace(".", "/") + ".py" if moved != dotted else text


def _module_of(path: Path) -> Optional[str]:
    """The dotted module of a file under serve_app/ (by its place in the repo)."""
    parts = path.resolve().parts
    if "serve_app" not in parts or path.suffix != ".py":
        return None
    i = len(parts) - 1 - parts[::-1].index("serve_app")
    mod = ".".join(parts[i:])[:-3]
    return mod[: -len(".__init__")] if mod.endswith(".__init__") else mod


def _resolve(relative: str, module: str, is_package: bool) -> str:
    dots = len(relative) - len(relative.lstrip("."))
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (dots - 1)] if dots > 1 else base
    rest = relative[dots:]
    return ".".join(base + ([rest] if rest else []))


def _known(path: str) -> bool:
    return path in NEW_MODULES or path in MODULES or _longest(path, NEW_MODULES | set(MODULES)) is not None


def _absolute(relative: str, names: list[tuple[str, str]], module: Optional[str], is_package: bool) -> str:
    """A relative import's module, absolute. A file in a module's new home
    whose imports are still relative is an old module's text (rewrite never
    writes relative imports): resolved against the old place first."""
    if module is None:
        return relative
    candidates = [_resolve(relative, old, False) for old, new in MODULES.items() if new == module]
    candidates.append(_resolve(relative, module, is_package))
    known = set(MODULES) | NEW_MODULES
    for c in candidates:
        if c in known or any(f"{c}.{n}" in known for n, _ in names):
            return c
    return candidates[-1]


def _split_names(names: str) -> list[tuple[str, str]]:
    """`a, b as c` -> [("a", "a"), ("b", "c")] (name, the name it is bound to)."""
    inner = names.strip()
    if inner.startswith("("):
        inner = inner[1:-1]
    inner = re.sub(r"#[^\n]*", "", inner)
    out = []
    for item in inner.replace("\\\n", " ").split(","):
        item = " ".join(item.split())
        if not item:
            continue
        if " as " in item:
            name, alias = item.split(" as ")
            out.append((name.strip(), alias.strip()))
        else:
            out.append((item, item))
    return out


def _import_line(indent: str, module: str, names: list[tuple[str, str]], tail: str) -> str:
    items = [n if n == a else f"{n} as {a}" for n, a in names]
    line = f"{indent}from {module} import {', '.join(items)}"
    if len(line) + len(tail) <= 120:
        return line + tail
    rows, row = [], ""
    for item in items:
        if row and len(indent) + 4 + len(row) + len(item) + 2 > 120:
            rows.append(row)
            row = ""
        row += f"{item}, "
    rows.append(row)
    body = "".join(f"{indent}    {r.rstrip()}\n" for r in rows)
    return f"{indent}from {module} import ({tail}\n{body}{indent})"


def _rewrite_from(m: re.Match, module: Optional[str], is_package: bool) -> str:
    indent, mod, names_text, tail = m.group("indent"), m.group("mod"), m.group("names"), m.group("tail")
    names = _split_names(names_text)
    if not names or names == [("*", "*")]:
        if mod.startswith("."):
            mod = _absolute(mod, [], module, is_package)
        return f"{indent}from {new_path(mod)} import {names_text}{tail}"
    absolute = _absolute(mod, names, module, is_package) if mod.startswith(".") else mod
    if not absolute.startswith("serve_app"):
        return m.group(0)
    # Each name: a module of its own (`from serve_app import config`) or an
    # attribute of the module (`from serve_app.config import EngineConfig`).
    groups: dict[str, list[tuple[str, str]]] = {}
    for name, alias in names:
        full = f"{absolute}.{name}"
        if full in MODULES or full in NEW_MODULES:
            moved = new_path(full)
            parent, leaf = moved.rsplit(".", 1)
            groups.setdefault(parent, []).append((leaf, alias))
        else:
            moved = new_path(full)
            groups.setdefault(moved.rsplit(".", 1)[0], []).append((name, alias))
    if list(groups) == [absolute] and not mod.startswith("."):
        return m.group(0)  # nothing moved: the line as it was
    return "\n".join(_import_line(indent, target, group, tail if i == 0 else "")
                     for i, (target, group) in enumerate(groups.items()))


def rewrite_text(text: str, path: Optional[Path] = None) -> str:
    """`text` (of the file at `path`, which places its relative imports) with
    every old path rewritten; idempotent."""
    module = _module_of(path) if path is not None else None
    is_package = path is not None and path.name == "__init__.py"
    text = _FROM.sub(lambda m: _rewrite_from(m, module, is_package), text)
    text = _DOTTED.sub(lambda m: new_path(m.group(0)), text)
    return _SLASHED.sub(_slashed, text)


# A file holding this marker is left alone (this table, its test's fixtures).
KEEP = "rehome: " + "keep old paths"


def rewrite_files(paths: Iterable[Path]) -> list[Path]:
    """Rewrite each file in place; the files that changed."""
    changed = []
    for p in paths:
        try:
            text = p.read_text()
        except (UnicodeDecodeError, IsADirectoryError, FileNotFoundError):
            continue
        if KEEP in text:
            continue
        new = rewrite_text(text, p)
        if new != text:
            p.write_text(new)
            changed.append(p)
    return changed


TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".sh", ".txt", ".cfg", ".ini", ".json", ".j2", ".tmpl"}


def tracked_files(root: Path) -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=root, capture_output=True, text=True,
                         check=True).stdout.split()
    return [root / f for f in out if Path(f).suffix in TEXT_SUFFIXES or Path(f).name in ("Makefile", "Dockerfile")]


def move(root: Path) -> None:
    """git mv every old module (and data folder) that is still at its old
    place to its new one, creating the rooms' packages."""
    def mv(src: Path, dst: Path) -> None:
        dst.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "mv", str(src), str(dst)], cwd=root, check=True)

    for old, new in FOLDERS.items():
        if old == "serve_app/stages":
            continue  # its modules move one by one (MODULES)
        if (root / old).is_dir():
            mv(root / old, root / new)
    for old, new in sorted(MODULES.items()):
        src = root / (old.replace(".", "/") + ".py")
        dst = root / (new.replace(".", "/") + ".py")
        if src.is_file() and not dst.exists():
            mv(src, dst)
    for room in LAYERS:
        init = root / "serve_app" / room / "__init__.py"
        if not init.exists():
            init.parent.mkdir(parents=True, exist_ok=True)
            init.write_text("")
            subprocess.run(["git", "add", str(init)], cwd=root, check=True)
    old_init = root / "serve_app" / "stages" / "__init__.py"
    if old_init.exists():
        subprocess.run(["git", "rm", "-q", str(old_init)], cwd=root, check=True)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m serve_app.tools.rehome", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    rw = sub.add_parser("rewrite", help="rewrite old serve_app paths in files (idempotent)")
    rw.add_argument("files", nargs="*", type=Path)
    rw.add_argument("--tree", action="store_true", help="every tracked (and untracked, not ignored) text file")
    ck = sub.add_parser("check", help="exit 1 if any of the files would be rewritten")
    ck.add_argument("files", nargs="*", type=Path)
    ck.add_argument("--tree", action="store_true")
    sub.add_parser("move", help="git mv the old modules into their rooms")
    args = ap.parse_args(argv)
    root = Path(subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                               check=True).stdout.strip())
    if args.cmd == "move":
        move(root)
        return 0
    files = [f for f in (tracked_files(root) if args.tree else args.files) if f.is_file()]
    if args.cmd == "check":
        stale = [f for f in files if KEEP not in f.read_text() and rewrite_text(f.read_text(), f) != f.read_text()]
        for f in stale:
            print(f)
        return 1 if stale else 0
    for f in rewrite_files(files):
        print(f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
