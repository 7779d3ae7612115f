"""A user's own model sets: fine-tuned PP-OCR detectors and recognisers
declared in the application's config (`own_models:` in the args block),
served beside the built-in ones (serve_app.core.model_sets) and chosen the
same way (`options.model`). No Ray, no Paddle import.

A declaration names the exported Paddle inference folders (PaddleOCR's
`export_model`: `inference.pdmodel` or `inference.json`, and
`inference.pdiparams`), the dictionary, and the pre/post-processing values
the model was trained with (the engine's own det/rec fields). What can be
checked without Paddle is checked when the application is built (files
present and not empty, the dictionary readable, the name free); the
recogniser's output classes against the dictionary and one inference on a
blank input are checked at start too, in a child process
(serve_app.serving.set_check), so a bad declaration fails the
deployment with the file and the problem named, never a user's request."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

from serve_app.core.model_sets import SETS, Cost, Dictionary, ModelSet

# A dictionary's bounds (its classes are the recogniser's output width, and each is decoded per time step).
MAX_DICT_CLASSES = 50_000
MAX_DICT_BYTES = 1 << 20


# A complete declaration, every field (README.md and docs/configuration.md show it; tests load it): a
# fine-tuned PP-OCRv4-architecture pair, in the application's `args:` of either profile.
OWN_MODELS_EXAMPLE = """\
models: [ppocrv6_small, invoices]        # the catalogue; an own set not listed is added last
own_models:
  - name: invoices                       # what a request names: "options": {"model": "invoices"}
    title: Invoices (fine-tuned PP-OCRv4)
    det_model: ~/models/invoices/det     # PaddleOCR export_model folders
    rec_model: ~/models/invoices/rec
    rec_dict: ~/models/invoices/keys.txt # one character per line, as trained
    languages: [en, de]
    det: {mean: [0.5, 0.5, 0.5], std: [0.5, 0.5, 0.5], thresh: 0.3, box_thresh: 0.6, unclip_ratio: 1.6}
    rec: {image_height: 48, use_space_char: true}
    predictor: {enable_memory_optim: true}  # false for Paddle 3 exports (inference.json)
    # cls_model: refused (every set shares the shipped direction classifier)
"""


class OwnModelSet(BaseModel):
    """One of a user's own model sets."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(
        ..., pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
        description="What requests name it by (options.model); not a built-in set's name.")
    title: Optional[str] = Field(None, description="A title for GET /v1/models and the page; None: the name.")
    det_model: str = Field(..., description="The detector's exported inference folder.")
    rec_model: str = Field(..., description="The recogniser's exported inference folder.")
    rec_dict: str = Field(
        ...,
        description="The recogniser's dictionary (one character per line); its size plus the CTC blank (and the "
        "space with rec.use_space_char) must equal the recogniser's output classes.")
    cls_model: Optional[str] = Field(
        None, description="Not supported: every set of an application shares the shipped direction classifier "
        "(ch_ppocr_mobile_v2.0_cls: one predictor and its warmed shapes, a crop's 0/180 judged from its pixels "
        "alone); a declaration naming one is refused.")
    languages: list[str] = Field([], description="ISO 639-1 codes of what it reads, for GET /v1/models.")
    det: dict[str, Any] = Field(
        {},
        description="The detector's values it was trained with (engine.det fields: mean, std, thresh, box_thresh, "
        "unclip_ratio, ...), laid over the engine's; a built-in set's own values are not carried over.")
    rec: dict[str, Any] = Field(
        {},
        description="The recogniser's values (engine.rec fields: image_height, use_space_char, ...), laid over the "
        "engine's.")
    predictor: dict[str, Any] = Field(
        {},
        description="Predictor options its files need (engine.predictor fields), laid over the engine's: files "
        "exported by Paddle 3 (inference.json, as the v6 sets') need enable_memory_optim: false.")

    @field_validator("cls_model")
    @classmethod
    def _no_own_classifier(cls, v: Optional[str]) -> Optional[str]:
        if v is not None:
            raise ValueError(f"cls_model {v!r}: an own set cannot bring its own direction classifier; every set of "
                             "an application shares the shipped ch_ppocr_mobile_v2.0_cls (remove cls_model)")
        return v

    @field_validator("name")
    @classmethod
    def _not_built_in(cls, v: str) -> str:
        if v in SETS:
            raise ValueError(f"own model set name {v!r} is a built-in set's; choose another name")
        return v

    def engine_fields(self) -> dict[str, Any]:
        """What serve_app.core.engine_config.for_model lays over the base config."""
        files = {"det_model": self.det_model, "rec_model": self.rec_model, "rec_dict": self.rec_dict}
        return {**files, **{k: dict(v) for k, v in (("det", self.det), ("rec", self.rec), ("predictor", self.predictor))
                            if v}}

    def model_set(self) -> ModelSet:
        """As GET /v1/models describes it (no counted costs: admission prices it as the default set); its
        folders and dictionary by their names only, never the server's paths."""
        return ModelSet(
            name=self.name, title=self.title or self.name, det=Path(self.det_model).name,
            cls=SETS["ppocrv4_mobile"].cls, rec=Path(self.rec_model).name,
            dictionary=Dictionary(Path(self.rec_dict).name, dictionary_size(Path(self.rec_dict))),
            languages=tuple(self.languages), cost=Cost(None, None, None), own=True)


def catalogued(data: Any, default_models: list[str]) -> Any:
    """AppArgs' input with each own set in the catalogue (added to `models` when not listed)."""
    if isinstance(data, dict) and data.get("own_models"):
        names = [o.get("name") if isinstance(o, dict) else getattr(o, "name", None) for o in data["own_models"]]
        listed = list(data.get("models") or default_models)
        data = {**data, "models": [*listed, *(n for n in names if n and n not in listed)]}
    return data


def check_catalogue(models: list[str], own: list[OwnModelSet]) -> None:
    """A catalogue: known names, distinct, own sets named once and their files in place (ValueError)."""
    from serve_app.core.model_sets import check_served

    names = [o.name for o in own]
    if len(set(names)) != len(names):
        raise ValueError(f"own_models declares a name twice: {names}")
    check_served(models, tuple(names))
    for o in own:
        check_files(o)


def described(models: list[str], own: list[OwnModelSet]) -> tuple[dict, ...]:
    """A catalogue as GET /v1/models lists it, the default first (the service adds each set's state)."""
    mine = {o.name: o for o in own}
    return tuple((SETS[name] if name in SETS else mine[name].model_set()).describe(default=k == 0)
                 for k, name in enumerate(models))


def dictionary_size(path: Path) -> int:
    """Characters in a dictionary file (as serve_app.ocr.recognition.load_charset reads it); 0 if unreadable."""
    try:
        lines = path.expanduser().read_text(encoding="utf-8").split("\n")
    except (OSError, UnicodeDecodeError):
        return 0
    return len(lines) - (1 if lines and lines[-1] == "" else 0)


def check_files(own: OwnModelSet) -> None:
    """What can be checked without Paddle: ValueError naming the set, the file and the problem."""
    where = f"own model set {own.name!r}"
    for stage, folder in (("det", own.det_model), ("rec", own.rec_model)):
        d = Path(folder).expanduser()
        if not d.is_dir():
            raise ValueError(f"{where}: {stage}_model {d} is not a folder (PaddleOCR's export_model writes one)")
        programs = [p for p in (d / "inference.pdmodel", d / "inference.json") if p.is_file()]
        if not programs:
            raise ValueError(f"{where}: {stage}_model {d} holds neither inference.pdmodel nor inference.json")
        for f in (programs[0], d / "inference.pdiparams"):
            if not f.is_file():
                raise ValueError(f"{where}: {f} is missing")
            if f.stat().st_size == 0:
                raise ValueError(f"{where}: {f} is empty")
    p = Path(own.rec_dict).expanduser()
    if not p.is_file():
        raise ValueError(f"{where}: rec_dict {p} is not a file (one character per line)")
    if p.stat().st_size > MAX_DICT_BYTES:
        raise ValueError(f"{where}: rec_dict {p} has {p.stat().st_size} bytes, more than a dictionary of "
                         f"{MAX_DICT_CLASSES} characters needs ({MAX_DICT_BYTES}): is it the recogniser's dictionary?")
    try:
        p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{where}: rec_dict {p} is not UTF-8 text ({e})") from None
    size = dictionary_size(p)
    if size == 0:
        raise ValueError(f"{where}: rec_dict {p} is empty")
    if size > MAX_DICT_CLASSES:
        raise ValueError(f"{where}: rec_dict {p} has {size} lines, more than {MAX_DICT_CLASSES} (the largest "
                         "PP-OCR dictionary has 18,708): one character per line")


class SetLoading(BaseModel):
    """How a replica holds the catalogue's sets: the default one loaded and
    warmed before ready, each other one on its first request."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    memory_mb: Union[int, Literal["auto"]] = Field(
        "auto",
        description="MB of memory the further sets (all but the default) may hold at once in a replica that "
        "loads them in its own process (recognizer.with_pipeline): each set's PSS as measured when it loaded "
        "(before: the largest measured so far, or 800); loading one that does not fit first unloads the least "
        "recently used idle ones, their predictors closed and their memory returned. auto: half the machine's "
        "available memory (MemAvailable) when the replica has loaded its default set.")
    max_loaded: int = Field(
        16, le=16,
        description="Also at most this many sets held at once, the default included (memory_mb bounds them "
        "first). With every loaded set busy, a request for another gets 503 with Retry-After.")
    load_wait_s: float = Field(
        15.0, ge=0, le=600,
        description="seconds a request for a set that is not loaded waits for its load (started by that request, "
        "one load at a time per replica); a load that takes longer answers 503 with a Retry-After of the "
        "load's expected remaining time, and the load goes on for the retry.")
    min_resident_s: float = Field(
        120.0, ge=0,
        description="seconds after a load before a load that must unload another set may start: a client "
        "naming the catalogue's sets in turn makes at most one load per this many seconds per replica once "
        "they do not all fit (each is seconds of CPU the other requests share), and gets 503 with Retry-After "
        "meanwhile; sets that fit are loaded at once.")
    retry_failed_s: float = Field(
        60.0, ge=1,
        description="seconds after a failed load (the reason in the replica's log) before a request may try "
        "loading that set again; until then its requests get 503 with this Retry-After.")

    @field_validator("max_loaded")
    @classmethod
    def _room_for_another(cls, v: int) -> int:
        if v < 2:
            raise ValueError(f"set_loading.max_loaded {v} holds the default set alone: every request for another "
                             "set would be refused; set 2 or more, or leave it out (memory_mb bounds the sets)")
        return v

    @field_validator("memory_mb")
    @classmethod
    def _some_memory(cls, v: Union[int, str]) -> Union[int, str]:
        if isinstance(v, int) and v < 100:
            raise ValueError(f"set_loading.memory_mb {v} is less than one model set needs (a few hundred MB); "
                             "give 100 or more, or auto (half the memory available at start)")
        return v
