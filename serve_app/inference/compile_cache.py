"""Where compiled engines are kept between replica starts, and how a new
entry is published. Pure (no paddle, no Ray): the predictor
(serve_app/inference/predictor.py) asks for a plan before it creates a Paddle
predictor and finishes the plan after.

What is cached, per engine:
- OpenVINO (the CPU default): the compiled-model blob OpenVINO writes into
  Paddle's optim cache dir (`ov::cache_dir`, set by Paddle's
  openvino_subgraph_pass from `Config.set_optim_cache_dir`). Without a
  folder Paddle writes it to `./__cache__` in the process's working
  directory, so a cache is always written somewhere; this module decides
  where.
- TensorRT (GPU): the serialized engines and tuned shape ranges
  (`use_static`), in a keyed folder under `tensorrt.cache_dir`.

A folder's name is a digest of everything that makes a compiled engine
valid: the model files' sha256, the engine, precision, threads, input
shapes, the library versions and the CPU (or GPU) it was built for. Any
change gives a new folder; an old one is never read for a new model.

Several replicas may start at once. An OpenVINO entry is built into a
private temporary folder and renamed into place when complete: a reader
sees no folder or a whole one, and when two replicas build the same entry
the first rename wins and the other's copy is dropped. (TensorRT writes
engines while the replica warms, so its folder is guarded by a per-folder
file lock instead: file_lock below.)
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Optional

from serve_app.core.errors import ConfigError

# The default root (PredictorOptions.cache_dir): per user, 0700.
DEFAULT_ROOT = "/tmp/ocr-serve-{uid}/cache"
_TMP_MARK = ".tmp-"
# A temporary folder older than this is a builder that died mid-build.
STALE_TMP_S = 600.0


def key_digest(parts: dict[str, Any]) -> str:
    """A short, stable digest of a cache key's parts (order-free)."""
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def entry_name(stage: str, engine: str, parts: dict[str, Any]) -> str:
    """`{stage}-{engine}-{digest}`: readable by an operator, unique per key."""
    return f"{stage}-{engine}-{key_digest({'stage': stage, 'engine': engine, **parts})}"


def cpu_signature(cpuinfo: str) -> str:
    """The CPU a CPU engine was compiled for: model name and the vector
    flags OpenVINO picks kernels by (a blob made with AMX/AVX-512 kernels
    must not be loaded where they are missing)."""
    model = ""
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        name = name.strip()
        if name == "model name" and not model:
            model = value.strip()
        elif name == "flags" and not flags:
            flags = set(value.split())
    wanted = sorted(f for f in flags if f.startswith(("avx", "amx", "sse4", "fma", "f16c", "vnni")))
    return f"{model}|{','.join(wanted)}"


def resolve_root(template: str) -> str:
    """The cache root with `{uid}` replaced, made (0700) if missing. A root
    owned by another user is refused: its files would be loaded into this
    process unchecked."""
    root = os.path.abspath(os.path.expanduser(template.replace("{uid}", str(os.getuid()))))
    os.makedirs(root, mode=0o700, exist_ok=True)
    st = os.stat(root)
    if st.st_uid != os.getuid():
        raise ConfigError(f"predictor.cache_dir {root} belongs to uid {st.st_uid}, not this user ({os.getuid()}): "
                          "use a folder of your own (the default holds {uid}), or cache_dir: null for no cache")
    if st.st_mode & 0o077:
        os.chmod(root, 0o700)
    return root


@dataclass
class CachePlan:
    """Which folder a predictor compiles into, and what to do after."""

    final: Optional[str]  # the published entry; None: no cache (a throwaway folder)
    workdir: str  # what the engine is given as its cache dir
    hit: bool  # the entry was already published when the predictor started

    @property
    def publishes(self) -> bool:
        return self.final is not None and self.workdir != self.final

    def finish(self) -> dict[str, Any]:
        """After the predictor is created: publish a new entry (or drop it
        if another replica published first, or it is empty), drop a
        throwaway folder. What happened, for the replica's stats."""
        if self.final is None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            return {"dir": None, "hit": False, "published": False}
        published = publish(self.workdir, self.final) if self.publishes else False
        return {"dir": self.final, "hit": self.hit, "published": published}

    def abandon(self) -> None:
        """The build failed: nothing is published."""
        if self.workdir != self.final:
            shutil.rmtree(self.workdir, ignore_errors=True)


def plan(root: Optional[str], name: str) -> CachePlan:
    """A published entry is used as it is; a missing one is built in a
    private temporary folder next to it. root None: no cache."""
    if root is None:
        return CachePlan(None, tempfile.mkdtemp(prefix="ocr-nocache-"), False)
    final = os.path.join(root, name)
    if os.path.isdir(final):
        return CachePlan(final, final, True)
    sweep_stale(root)
    return CachePlan(final, tempfile.mkdtemp(prefix=f".{name}{_TMP_MARK}", dir=root), False)


def publish(tmp: str, final: str) -> bool:
    """Rename a complete folder into place; False (and `tmp` removed) when
    another writer got there first or there is nothing to publish. rename(2)
    of a folder onto an existing non-empty one fails, so the first complete
    entry stays and readers never see a partial one."""
    if not os.listdir(tmp):
        shutil.rmtree(tmp, ignore_errors=True)
        return False
    try:
        os.rename(tmp, final)
        return True
    except OSError as e:
        if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        shutil.rmtree(tmp, ignore_errors=True)
        return False


def sweep_stale(root: str, older_than_s: float = STALE_TMP_S) -> list[str]:
    """Remove temporary folders of builders that died (older than
    `older_than_s`); a live builder's folder is younger."""
    removed = []
    now = time.time()
    for entry in os.listdir(root):
        if not (entry.startswith(".") and _TMP_MARK in entry):
            continue
        path = os.path.join(root, entry)
        try:
            if now - os.stat(path).st_mtime > older_than_s:
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
        except FileNotFoundError:
            pass
    return removed


@contextmanager
def file_lock(path: str):
    """An exclusive flock on `path` (created if missing): one holder per node
    at a time. Released when the process dies, so a crashed builder never
    blocks the others."""
    import fcntl

    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
