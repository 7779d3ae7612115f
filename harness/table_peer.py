"""The peer for table structure: RapidTable (rapid_table==0.3.0: the same
SLANet_plus as ONNX on onnxruntime, with its own table matcher) over
RapidOCR (rapidocr_onnxruntime, the `bench` extra), given the true table
crop. Used by load_tests/bench_structure.py."""

from __future__ import annotations

import numpy as np


def require_rapid_table():
    try:
        from rapid_table import RapidTable
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(
            "rapid_table is not installed: pip install -e '.[bench]' -c constraints.txt (rapid_table==0.3.0)") from e
    import importlib.util

    if importlib.util.find_spec("rapidocr_onnxruntime") is None:
        raise ModuleNotFoundError("rapidocr_onnxruntime is not installed: pip install -e '.[bench]' -c constraints.txt")
    return RapidTable


class RapidTablePeer:
    """`read(crop_bgr) -> html`: RapidOCR reads the crop, SLANet_plus finds
    the structure, RapidTable's matcher puts the lines into cells."""

    def __init__(self):
        import onnxruntime

        # SLANet_plus's ONNX graph warns of an output shape on every run; errors still show
        onnxruntime.set_default_logger_severity(3)
        self.table = require_rapid_table()()  # its default: slanet-plus.onnx, RapidOCR as its reader

    def read(self, crop_bgr: np.ndarray) -> str:
        html, _boxes, _elapse = self.table(crop_bgr)
        return html
