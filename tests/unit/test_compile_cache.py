"""The compiled-engine cache's pure parts: keys, the per-user root, atomic
publish, concurrent builders (serve_app/inference/compile_cache.py)."""

import multiprocessing as mp
import os
import time

import pytest

from serve_app.inference import compile_cache as cc
from serve_app.core.errors import ConfigError

BASE = {"model": "ab" * 32, "precision": "bf16", "threads": 1, "cpu": "EPYC|avx2", "paddle": "3.3.1"}


def test_entry_name_is_stable_and_readable():
    a = cc.entry_name("rec", "openvino", BASE)
    assert a == cc.entry_name("rec", "openvino", dict(reversed(list(BASE.items()))))  # order-free
    assert a.startswith("rec-openvino-") and len(a.split("-")[-1]) == 20


@pytest.mark.parametrize("change", [
    {"model": "cd" * 32}, {"precision": "fp32"}, {"threads": 2}, {"cpu": "Xeon|amx_bf16,avx2"},
    {"paddle": "3.3.2"}, {"input_shapes": [[1, 3, 48, 320]]},
])
def test_every_part_of_the_key_changes_the_entry(change):
    assert cc.entry_name("rec", "openvino", {**BASE, **change}) != cc.entry_name("rec", "openvino", BASE)


def test_stage_and_engine_change_the_entry():
    names = {cc.entry_name(s, e, BASE) for s in ("det", "rec") for e in ("openvino", "tensorrt")}
    assert len(names) == 4


def test_cpu_signature_keeps_model_and_vector_flags_only():
    info = ("processor : 0\nmodel name : AMD EPYC 9R14\nflags : fpu vme avx2 avx512f avx512_bf16 sse4_2 ht\n"
            "processor : 1\nmodel name : AMD EPYC 9R14\nflags : fpu vme avx2 avx512f avx512_bf16 sse4_2 ht\n")
    assert cc.cpu_signature(info) == "AMD EPYC 9R14|avx2,avx512_bf16,avx512f,sse4_2"
    assert cc.cpu_signature(info.replace(" avx512_bf16", "")) != cc.cpu_signature(info)


def test_root_is_per_user_and_private(tmp_path):
    root = cc.resolve_root(str(tmp_path / "c-{uid}" / "cache"))
    assert root == str(tmp_path / f"c-{os.getuid()}" / "cache")
    assert os.stat(root).st_mode & 0o777 == 0o700
    os.chmod(root, 0o755)
    cc.resolve_root(root)
    assert os.stat(root).st_mode & 0o777 == 0o700


def test_root_of_another_user_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "getuid", lambda: os.stat(tmp_path).st_uid + 1)
    with pytest.raises(ConfigError, match="belongs to uid"):
        cc.resolve_root(str(tmp_path))


def test_miss_builds_privately_then_publishes(tmp_path):
    p = cc.plan(str(tmp_path), "rec-openvino-x")
    assert not p.hit and p.publishes and not os.path.exists(p.final)
    assert os.path.dirname(p.workdir) == str(tmp_path)
    (open(os.path.join(p.workdir, "1.blob"), "wb")).write(b"compiled")
    assert p.finish() == {"dir": p.final, "hit": False, "published": True}
    assert os.listdir(tmp_path) == ["rec-openvino-x"]
    again = cc.plan(str(tmp_path), "rec-openvino-x")
    assert again.hit and again.workdir == again.final and not again.publishes
    assert again.finish() == {"dir": again.final, "hit": True, "published": False}


def test_an_empty_build_is_not_published(tmp_path):
    p = cc.plan(str(tmp_path), "det-openvino-x")
    assert p.finish()["published"] is False
    assert os.listdir(tmp_path) == []  # a later replica builds again instead of reading an empty entry


def test_no_cache_uses_a_throwaway_folder():
    p = cc.plan(None, "")
    assert os.path.isdir(p.workdir)
    assert p.finish() == {"dir": None, "hit": False, "published": False}
    assert not os.path.exists(p.workdir)


def test_abandoned_build_leaves_nothing(tmp_path):
    p = cc.plan(str(tmp_path), "rec-openvino-x")
    open(os.path.join(p.workdir, "half.blob"), "wb").write(b"hal")
    p.abandon()
    assert os.listdir(tmp_path) == []


def test_second_publisher_loses_and_keeps_the_first_entry(tmp_path):
    a, b = cc.plan(str(tmp_path), "e"), cc.plan(str(tmp_path), "e")
    for p, data in ((a, b"A" * 100), (b, b"B" * 100)):
        open(os.path.join(p.workdir, "m.blob"), "wb").write(data)
    assert a.finish()["published"] is True
    assert b.finish()["published"] is False
    assert open(os.path.join(tmp_path, "e", "m.blob"), "rb").read() == b"A" * 100
    assert os.listdir(tmp_path) == ["e"]


def test_stale_temporary_folders_are_swept(tmp_path):
    dead = tmp_path / f".e{cc._TMP_MARK}dead"
    live = tmp_path / f".e{cc._TMP_MARK}live"
    dead.mkdir(), live.mkdir()
    old = time.time() - cc.STALE_TMP_S - 5
    os.utime(dead, (old, old))
    assert cc.sweep_stale(str(tmp_path)) == [str(dead)]
    assert live.exists()


def _builder(root: str, me: int, size: int, out) -> None:
    p = cc.plan(root, "rec-openvino-k")
    if not p.hit:
        with open(os.path.join(p.workdir, "model.blob"), "wb") as f:
            for _ in range(size // 4096):  # written slowly, in pieces
                f.write(bytes([me]) * 4096)
    out.put((me, p.finish()))


def _reader(root: str, size: int, stop, saw, out) -> None:
    seen = bad = 0
    final = os.path.join(root, "rec-openvino-k", "model.blob")
    while not stop.is_set():
        try:
            data = open(final, "rb").read()
        except FileNotFoundError:
            continue
        seen += 1
        bad += len(data) != size or len(set(data)) != 1
        saw.set()
    out.put((seen, bad))


def test_concurrent_builders_publish_one_whole_entry_and_readers_never_see_part(tmp_path):
    size, n = 1 << 20, 6
    ctx = mp.get_context("fork")
    out, reads, stop, saw = ctx.Queue(), ctx.Queue(), ctx.Event(), ctx.Event()
    reader = ctx.Process(target=_reader, args=(str(tmp_path), size, stop, saw, reads))
    reader.start()
    builders = [ctx.Process(target=_builder, args=(str(tmp_path), k + 1, size, out)) for k in range(n)]
    for b in builders:
        b.start()
    for b in builders:
        b.join(30)
    results = [out.get(timeout=5) for _ in builders]
    assert saw.wait(30), "the reader never read the published entry"
    stop.set()
    reader.join(10)
    seen, bad = reads.get(timeout=5)
    published = [me for me, r in results if r["published"]]
    assert len(published) == 1 and all(r["dir"].endswith("rec-openvino-k") for _, r in results)
    assert os.listdir(tmp_path) == ["rec-openvino-k"]  # no temporary folder left behind
    data = open(os.path.join(tmp_path, "rec-openvino-k", "model.blob"), "rb").read()
    assert len(data) == size and len(set(data)) == 1
    assert data[0] == published[0]
    assert seen > 0 and bad == 0
