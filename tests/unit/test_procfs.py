"""harness/procfs.py, the one /proc reader: PSS from smaps_rollup (of this
process and of a gone one) and a process tree from the parent links."""

from __future__ import annotations

import os

import pytest

from harness.procfs import descendants, pss_mb, smaps_rollup_kb


def test_smaps_rollup_of_this_process_and_of_a_gone_one(tmp_path):
    r = smaps_rollup_kb()
    assert r["Pss"] > 0 and r["Rss"] >= r["Pss"] - 1  # PSS shares pages, so never (much) above RSS
    m = pss_mb()
    assert m is not None and m["pss"] == pytest.approx(r["Pss"] / 1024, rel=0.2)
    assert m["anon"] + m["file"] + m["shmem"] == pytest.approx(m["pss"], rel=0.05)
    assert smaps_rollup_kb(2**22 + 12345) == {} and pss_mb(2**22 + 12345) is None


def test_descendants_follow_the_parent_links():
    table = {1: (0, 0.0), 10: (1, 0.0), 11: (10, 0.0), 12: (11, 0.0), 20: (1, 0.0), 13: (10, 0.0)}
    assert descendants(10, table) == [11, 12, 13]
    assert descendants(12, table) == []
    assert os.getpid() not in descendants(os.getpid())
