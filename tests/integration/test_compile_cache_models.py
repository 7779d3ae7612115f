"""The compiled-engine cache with the real models: the first engine
compiles and publishes one entry per model into the cache folder, the next
loads them (hit), and both read a peer image alike; without a cache nothing
is written, not even Paddle's ./__cache__ in the working directory."""

from __future__ import annotations

import os

from harness.in_child import call_in_child
from harness.peer import read_with_cache

IMAGE = "rapidocr_en.jpg"


def _read(cache_dir):
    """A new engine's reading of IMAGE and each predictor's cache record, in
    a child process (an engine keeps ~1 GB after close: this process does not
    keep three), which starts in this process's working folder."""
    return call_in_child(read_with_cache, cache_dir, IMAGE)


def test_first_engine_publishes_the_next_one_hits_and_reads_alike(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "cache-{uid}"
    first, c1 = _read(str(root))
    second, c2 = _read(str(root))
    folder = tmp_path / f"cache-{os.getuid()}"
    assert {k: (v["hit"], v["published"]) for k, v in c1.items()} == {s: (False, True) for s in ("det", "cls", "rec")}
    assert {k: (v["hit"], v["published"]) for k, v in c2.items()} == {s: (True, False) for s in ("det", "cls", "rec")}
    assert sorted(e.split("-")[0] for e in os.listdir(folder)) == ["cls", "det", "rec"]
    assert all(any(f.endswith(".blob") for f in os.listdir(folder / e)) for e in os.listdir(folder))
    assert oct(folder.stat().st_mode & 0o777) == "0o700"
    assert first == second and "MovieShots" in " ".join(first)
    assert not (tmp_path / "__cache__").exists()


def test_no_cache_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    lines, caches = _read(None)
    assert lines and all(c == {"dir": None, "hit": False, "published": False} for c in caches.values())
    assert os.listdir(tmp_path) == []
