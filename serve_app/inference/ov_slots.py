"""One OpenVINO engine per live predictor, however many predictors of one
program a process holds.

Paddle Inference keeps its OpenVINO engines in one process-wide table
(OVEngineManager), keyed by a hash of the program's variable names, their
graph node ids and the precision (openvino_subgraph_pass.cc,
GenerateEngineKey). Neither the parameter file, the thread count nor the
predictor enters the key. Creating a predictor whose key is already in the
table replaces that engine (`engines_[name].reset(...)`) while the first
predictor's op still holds a raw pointer to it: its next run reads freed
memory ("CompiledModel was not initialized", or a segfault). That happens to
a second predictor of the same program in one process (a test's or the
CLI's engine beside another), and to two programs of one architecture whose
variable names match (a user's fine-tuned recogniser beside the set it was
trained from, in make serve's one-process profile).

So each live predictor of a program (per precision) holds a slot here.
Slot 0 loads the files as they are; slot n > 0 loads a copy of the program
in which one intermediate variable is renamed (`<name>.ocr_slot<n>`), which
changes the key and nothing else (the same parameters, from a link to the
same file beside it, where OpenVINO's Paddle frontend looks; a renamed
activation is not a parameter). A closed predictor gives its
slot back, and the next predictor to take it replaces the closed one's
engine, so a process holds at most as many engines per program as it ever
held live predictors at once.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Optional

from serve_app.inference.weights import ModelFiles

log = logging.getLogger(__name__)
SUFFIX = ".ocr_slot"

_lock = threading.Lock()
_taken: dict[str, set[int]] = {}


def _program(path: Path):
    from paddle.base.proto import framework_pb2  # the legacy ProgramDesc

    prog = framework_pb2.ProgramDesc()
    prog.ParseFromString(path.read_bytes())
    return prog


@lru_cache(maxsize=64)
def _signature(path: str, size: int, mtime_ns: int) -> Optional[str]:
    """sha256 over the program's variable names (every block), or None for
    a program that is not a legacy ProgramDesc (OpenVINO does not run it)."""
    if not path.endswith(".pdmodel"):
        return None
    try:
        prog = _program(Path(path))
    except Exception as e:  # a malformed program fails in Paddle, with Paddle's message
        log.debug("%s: not parsed as a ProgramDesc (%s)", path, e)
        return None
    names = sorted(v.name for b in prog.blocks for v in b.vars)
    return hashlib.sha256("\n".join(names).encode()).hexdigest()


def signature(files: ModelFiles) -> Optional[str]:
    st = Path(files.program).stat()
    return _signature(str(files.program), st.st_size, st.st_mtime_ns)


def renamed_program(source: Path, dest: Path, index: int) -> str:
    """Write `source` with its first intermediate variable (not persistable,
    not fed or fetched) renamed to `<name>.ocr_slot<index>` in every block
    and op argument; the name renamed."""
    prog = _program(source)
    io_names = {a for b in prog.blocks for op in b.ops if op.type in ("feed", "fetch")
                for part in (*op.inputs, *op.outputs) for a in part.arguments}
    target = next((v.name for b in prog.blocks for v in b.vars
                   if not v.persistable and v.name not in io_names and v.name not in ("feed", "fetch")), None)
    if target is None:
        raise ValueError(f"{source}: no intermediate variable to rename")
    new = f"{target}{SUFFIX}{index}"
    for b in prog.blocks:
        for v in b.vars:
            if v.name == target:
                v.name = new
        for op in b.ops:
            for part in (*op.inputs, *op.outputs):
                if target in part.arguments:
                    args = [new if a == target else a for a in part.arguments]
                    del part.arguments[:]
                    part.arguments.extend(args)
    dest.write_bytes(prog.SerializeToString())
    return target


@dataclass
class Slot:
    """A live predictor's place among the predictors of its program."""

    key: Optional[str]
    index: int
    files: ModelFiles  # what the predictor loads
    folder: Optional[str] = None  # the renamed program's folder (slot > 0)
    released: bool = field(default=False, repr=False)

    def release(self) -> None:
        """After the predictor is closed (or its build failed); harmless twice."""
        if self.released:
            return
        self.released = True
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
        if self.key is not None:
            with _lock:
                _taken.get(self.key, set()).discard(self.index)


def acquire(files: ModelFiles, precision: str) -> Slot:
    """The lowest free slot for `files`' program at `precision`, and the
    files to load for it."""
    sig = signature(files)
    if sig is None:
        return Slot(None, 0, files)
    key = f"{sig}|{precision}"
    with _lock:
        taken = _taken.setdefault(key, set())
        index = next(i for i in range(len(taken) + 1) if i not in taken)
        taken.add(index)
    if index == 0:
        return Slot(key, 0, files)
    folder = tempfile.mkdtemp(prefix=f"ocr-ov-slot{index}-")
    try:
        program = Path(folder) / Path(files.program).name
        renamed = renamed_program(Path(files.program), program, index)
        # OpenVINO's Paddle frontend reads the parameters beside the program, by its stem.
        params = program.with_suffix(".pdiparams")
        os.symlink(Path(files.params).resolve(), params)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        Slot(key, index, files).release()
        raise
    log.info("%s: OpenVINO slot %d (another predictor of this program is live here): %s renamed in %s",
             files.name, index, renamed, folder)
    return Slot(key, index, ModelFiles(files.name, program, params), folder)

