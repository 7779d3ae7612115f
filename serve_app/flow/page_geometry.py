"""A document page's render size, shared by the PDF and the multi-page TIFF
readers (flow/documents.py, flow/tiff_pages.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PageGeometry:
    scale: float  # pixels per PDF point (1.0 for a TIFF page)
    width: int  # pixels
    height: int
