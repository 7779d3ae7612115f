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
