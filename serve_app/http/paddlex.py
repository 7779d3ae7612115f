"""PaddleX's OCR serving API (`POST /ocr`) and PP-StructureV3's
(`POST /layout-parsing`) on top of this service: their request in, their
response shape out. No Ray import: unit-tested on its own.

Built from PaddleX's own serving code and docs (PaddlePaddle/PaddleX):
- paddlex/inference/serving/schemas/ocr.py and schemas/shared/ocr.py: the
  request (`file`, `fileType` 0 = PDF / 1 = image, the use*/textDet*/
  textRecScoreThresh options, `visualize`) and the result
  (`ocrResults[].prunedResult`, `ocrImage`, `docPreprocessingImage`,
  `inputImage`; `dataInfo`);
- paddlex/inference/serving/basic_serving/_pipeline_apps/ocr.py: one
  ocrResults item per page, images only when visualizing, None fields left
  out (`response_model_exclude_none`);
- paddlex/inference/serving/basic_serving/_app.py and infra/models.py: the
  envelope `{"logId", "errorCode": 0, "errorMsg": "Success", "result"}` and
  errors as HTTP status + `{"logId", "errorCode": status, "errorMsg"}`
  (422 for a request that does not validate); `dataInfo` as
  `{"width", "height", "type": "image"}` or
  `{"numPages", "pages": [{"width", "height"}], "type": "pdf"}`;
- docs/pipeline_usage/tutorials/ocr_pipelines/OCR.md (serving section): the
  client example (`{"file": base64, "fileType": 1}`, then
  `res["prunedResult"]` and `base64.b64decode(res["ocrImage"])`) and the
  prunedResult keys (rec_texts, rec_scores, rec_polys, rec_boxes, dt_polys,
  model_settings, text_det_params, text_type, text_rec_score_thresh).

Where this service differs, on purpose:
- `file` must be base64: a URL is a 400 (this service fetches nothing).
- `fileType` null is inferred from the bytes (PaddleX infers it from a URL
  only); a fileType that contradicts the bytes is a 400.
- No 10-page cap: a PDF may have engine.documents.max_pages pages.
- `useDocOrientationClassify` / `useDocUnwarping` true are a 400: there is
  no document orientation or unwarping model here, and PaddleX itself fails
  a request for a sub-pipeline it has not loaded; false or null are fine.
- prunedResult has no `textline_orientation_angles` and no `dt_scores`
  (the pipeline does not report them per line), and `dt_polys` is
  `rec_polys` (lines below the score threshold are not kept).
- `ocrImage` is the input with the line boxes drawn on it (PaddleX also
  renders the text beside it, which needs its fonts); the pipeline draws it
  (`visualize: "boxes"`, serve_app/ocr/visualize.py) from the image it decoded.

`POST /layout-parsing` (PP-StructureV3: schemas/pp_structurev3.py,
basic_serving/_pipeline_apps/pp_structurev3.py) reads with options.structure:
the same `file`, `fileType`, text detection and recognition fields; per page
`layoutParsingResults[]` with `prunedResult` (`parsing_res_list`: each region
in reading order as `block_label`, `block_content` (its text; a table's
HTML), `block_bbox` [x0, y0, x1, y1], `block_id`, `block_order`;
`layout_det_res.boxes`; `overall_ocr_res`, the page's OCR prunedResult;
`table_res_list`: each table's `pred_html` and `cell_box_list`) and
`markdown` (`text`: the page as format=markdown writes it, `images` {},
`isStart`/`isEnd` true). Where it differs: the layout model is PicoDet on
CDLA's ten classes, named as PP-DocLayout names them (LAYOUT_LABELS: title
is `paragraph_title`, figure `image`, equation `formula`, captions
`figure_title`/`table_title`; `cls_id` is the index in REGION_TYPES); seal,
formula, chart and region recognition, and the layout_* knobs, are not
here (true or set is a 400 naming the field); useTableRecognition false is
a 400 (tables are always read); pictures (`visualize` true) are the OCR
boxes drawn on the page (outputImages `overall_ocr_res`), off by default.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, replace
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, ValidationError

from serve_app.core.engine_config import EngineConfig
from serve_app.core.errors import BadRequest, OcrError
from serve_app.core.request_options import OcrOptions, parse_options
from serve_app.flow.upload import document_format


class PaddleXOcrRequest(BaseModel):
    """schemas/ocr.py InferRequest (unknown fields are ignored, as there)."""

    model_config = ConfigDict(extra="ignore")

    file: str
    fileType: Optional[Literal[0, 1]] = None
    useDocOrientationClassify: Optional[bool] = None
    useDocUnwarping: Optional[bool] = None
    useTextlineOrientation: Optional[bool] = None
    textDetLimitSideLen: Optional[int] = None
    textDetLimitType: Optional[str] = None
    textDetThresh: Optional[float] = None
    textDetBoxThresh: Optional[float] = None
    textDetUnclipRatio: Optional[float] = None
    textRecScoreThresh: Optional[float] = None
    visualize: Optional[bool] = None
    # Not PaddleX's: the model set to read with (options.model; GET /v1/models).
    model: Optional[str] = None


# PaddleX request field -> the OcrOptions field it sets. None: this service
# cannot honour it, and a request that sets it (to anything but null, or
# false for the use* switches) is refused with a 400 naming it. To support
# one, name its OcrOptions field here (the value is then validated with
# the other options).
OPTION_FIELDS: dict[str, Optional[str]] = {
    "useTextlineOrientation": "cls",
    "useDocOrientationClassify": None,  # no document orientation model here
    "useDocUnwarping": None,  # no unwarping (UVDoc) model here
    "textDetLimitSideLen": "limit_side_len",  # on the detector's closed ladder (rounded down to a rung)
    "textDetLimitType": None,  # the service's input policy stays its own (a closed set of shapes)
    "textDetThresh": "thresh",
    "textDetBoxThresh": "box_thresh",
    "textDetUnclipRatio": "unclip_ratio",
    "textRecScoreThresh": "drop_score",
    "model": "model",  # this service's extension: a served model set
}


class PaddleXValidation(OcrError):
    """A request that does not validate: 422, as PaddleX answers it."""

    status = 422
    code = "invalid_request"


def parse_request(body: bytes, model: type[PaddleXOcrRequest] = PaddleXOcrRequest) -> PaddleXOcrRequest:
    # The request is one flat object: refuse a body of nested bombs unparsed.
    if body.count(b"{") + body.count(b"[") > 16:
        raise PaddleXValidation("body: not the PaddleX OCR request object (too many nested objects or arrays)")
    try:
        return model.model_validate_json(body)
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        where = ".".join(str(x) for x in first["loc"]) or "body"
        raise PaddleXValidation(f"{where}: {first['msg']}") from None


class PaddleXLayoutRequest(PaddleXOcrRequest):
    """schemas/pp_structurev3.py InferRequest: the OCR request's fields and
    the structure switches (those this service has no model for refused
    when asked for: LAYOUT_OPTION_FIELDS)."""

    useSealRecognition: Optional[bool] = None
    useTableRecognition: Optional[bool] = None
    useFormulaRecognition: Optional[bool] = None
    useChartRecognition: Optional[bool] = None
    useRegionDetection: Optional[bool] = None
    layoutThreshold: Optional[Union[float, dict]] = None
    layoutNms: Optional[bool] = None
    layoutUnclipRatio: Optional[Union[float, list, dict]] = None
    layoutMergeBboxesMode: Optional[Union[str, dict]] = None


# PaddleX's PP-StructureV3 switches -> None: not served here (true, or any
# value for the layout_* knobs, is a 400 naming it). useTableRecognition is
# checked on its own: true or null reads tables, false is refused.
LAYOUT_OPTION_FIELDS: dict[str, Optional[str]] = {
    **OPTION_FIELDS,
    "useSealRecognition": None,  # no seal model here
    "useFormulaRecognition": None,  # no formula model here (an equation region is its recognised text)
    "useChartRecognition": None,  # no chart model here
    "useRegionDetection": None,  # no region detector beside the layout model
    "layoutThreshold": None,  # the layout model's own thresholds (engine config)
    "layoutNms": None,
    "layoutUnclipRatio": None,
    "layoutMergeBboxesMode": None,
}

# This service's region types (serve_app.core.results.REGION_TYPES) as
# PP-DocLayout labels them in PP-StructureV3's answers.
LAYOUT_LABELS = {"text": "text", "title": "paragraph_title", "figure": "image", "figure_caption": "figure_title",
                 "table": "table", "table_caption": "table_title", "header": "header", "footer": "footer",
                 "reference": "reference", "equation": "formula"}
# Labels PP-StructureV3 gives no reading-order number (block_order null).
UNORDERED = ("header", "footer")


def to_call(req: PaddleXOcrRequest, fields_of: Optional[dict[str, Optional[str]]] = None) -> tuple[bytes, OcrOptions]:
    """The file's bytes and this service's options; BadRequest for what
    cannot be honoured. `fields_of`: the request's field map (OPTION_FIELDS
    for /ocr, LAYOUT_OPTION_FIELDS for /layout-parsing)."""
    fields_of = OPTION_FIELDS if fields_of is None else fields_of
    data = file_bytes(req.file)
    pdf = document_format(data) == "pdf"
    if req.fileType == 0 and not pdf:
        raise BadRequest("fileType is 0 (PDF) but file is not a PDF")
    if req.fileType == 1 and pdf:
        raise BadRequest("fileType is 1 (image) but file is a PDF; send fileType 0")
    fields: dict[str, Any] = {}
    for name, field in fields_of.items():
        value = getattr(req, name)
        if value is None or (value is False and name.startswith("use")):
            if field is not None and value is not None:
                fields[field] = value
            continue
        if field is None:
            raise BadRequest(f"{name}={value!r} is not supported by this service (supported: "
                             f"{', '.join(n for n, f in fields_of.items() if f)}); leave it out or null")
        fields[field] = value
    return data, parse_options(fields)


def file_bytes(file: str) -> bytes:
    if file.lstrip()[:8].lower().startswith(("http://", "https://")) or "://" in file[:16]:
        raise BadRequest("file is a URL; this service fetches nothing: send the file's bytes as base64")
    try:
        return base64.b64decode(file, validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest("file is not valid base64 (nor a URL, which this service would not fetch)") from None


@dataclass(frozen=True)
class PaddleXDefaults:
    """What prunedResult reports of the service's own settings."""

    text_det_params: dict
    text_rec_score_thresh: float
    use_textline_orientation: bool
    exif_transpose: bool = True  # how the pipeline decodes images (the visualization does the same)

    @staticmethod
    def of(engine: EngineConfig) -> "PaddleXDefaults":
        det = engine.det
        return PaddleXDefaults(
            {"limit_side_len": det.side_ladder[-1] if det.limit_type == "ladder" else det.limit_side_len,
             "limit_type": det.limit_type, "thresh": det.thresh, "box_thresh": det.box_thresh,
             "unclip_ratio": det.unclip_ratio},
            engine.pipeline.drop_score, engine.cls.enabled, engine.pipeline.exif_transpose)


def pruned_result(lines: list[dict], page_index: Optional[int], options: OcrOptions,
                  defaults: PaddleXDefaults) -> dict:
    """One page's `prunedResult` from this service's line dicts."""
    polys = [[[int(round(x)), int(round(y))] for x, y in line["box"]] for line in lines]
    boxes = [[min(p[0] for p in q), min(p[1] for p in q), max(p[0] for p in q), max(p[1] for p in q)]
             for q in polys]
    use_cls = defaults.use_textline_orientation if options.cls is None else options.cls
    return {
        "page_index": page_index,
        "model_settings": {"use_doc_preprocessor": False, "use_textline_orientation": bool(use_cls)},
        "dt_polys": polys,
        # What this request ran with: its own values where it sent them.
        "text_det_params": {**defaults.text_det_params,
                            **{k: getattr(options, k) for k in ("limit_side_len", "thresh", "box_thresh", "unclip_ratio")
                               if getattr(options, k) is not None}},
        "text_type": "general",
        "text_rec_score_thresh": defaults.text_rec_score_thresh if options.drop_score is None else options.drop_score,
        "rec_texts": [line["text"] for line in lines],
        "rec_scores": [line["score"] for line in lines],
        "rec_polys": polys,
        "rec_boxes": boxes,
    }


def pages_of(body: dict) -> list[dict]:
    """This service's body (image or document) as pages: {width, height, results} (and regions, a picture)."""
    if "document" in body:
        return body["pages"]
    page = {"width": body["image"]["width"], "height": body["image"]["height"], "results": body["results"]}
    for key in ("visualization", "regions", "blocks"):
        if key in body:
            page[key] = body[key]
    return [page]


def result(body: dict, options: OcrOptions, defaults: PaddleXDefaults,
           images: Optional[list[dict[str, str]]] = None) -> dict:
    """`result` of the response: ocrResults (one per page) and dataInfo.
    `images`: per page, the visualization fields (ocrImage, inputImage)."""
    pages = pages_of(body)
    pdf = "document" in body
    items = []
    for k, page in enumerate(pages):
        item = {"prunedResult": pruned_result(page["results"], k if pdf else None, options, defaults)}
        if images is not None:
            item.update(images[k])
        items.append(item)
    return {"ocrResults": items, "dataInfo": data_info(pages, pdf)}


# -- PP-StructureV3's /layout-parsing --------------------------------------------


def to_layout_call(req: PaddleXLayoutRequest) -> tuple[bytes, OcrOptions]:
    """The file's bytes and this service's options, structure on."""
    if req.useTableRecognition is False:
        raise BadRequest("useTableRecognition=false is not supported by this service: a table region is always "
                         "read as rows and cells; leave it out, null or true")
    data, opts = to_call(req, LAYOUT_OPTION_FIELDS)
    return data, replace(opts, structure=True)


def _bbox(box: list) -> list[int]:
    xs, ys = [float(p[0]) for p in box], [float(p[1]) for p in box]
    return [int(round(min(xs))), int(round(min(ys))), int(round(max(xs))), int(round(max(ys)))]


def join_lines(texts: list[str]) -> str:
    """A block's lines as one text, as PP-StructureV3 writes block_content:
    a space between two Latin lines, none between CJK ones."""
    out = ""
    for t in (t.strip() for t in texts):
        if not t:
            continue
        if out and (out[-1].isascii() and out[-1].isalnum() or out[-1] in ".,;:!?)") and t[0].isascii():
            out += " "
        elif out and out[-1] == "-" and t[0].isascii():  # a word broken at the line's end
            out = out[:-1]
        out += t
    return out


def parsing_results(page: dict, page_index: Optional[int], options: OcrOptions, defaults: PaddleXDefaults) -> dict:
    """One page's `layoutParsingResults` item: prunedResult and markdown."""
    from serve_app.core.results import REGION_TYPES
    from serve_app.flow.markdown import render_markdown

    lines = page.get("results") or []
    texts = [str(line.get("text", "")) for line in lines]
    regions = [r for r in page.get("regions") or () if isinstance(r, dict)]
    blocks, boxes, tables = [], [], []
    order = 0
    for k, r in enumerate(regions):
        kind = str(r.get("type", "text"))
        label = LAYOUT_LABELS.get(kind, kind)
        bbox = _bbox(r["box"])
        table = r.get("table") if isinstance(r.get("table"), dict) else None
        if table is not None:
            content = str(table.get("html", ""))
            tables.append({"pred_html": content,
                           "cell_box_list": [_bbox(c["box"]) for c in table.get("cells") or () if "box" in c]})
        else:
            content = join_lines([texts[i] for i in r.get("lines") or () if 0 <= int(i) < len(texts)])
        if kind not in UNORDERED:
            order += 1
        blocks.append({"block_label": label, "block_content": content, "block_bbox": bbox, "block_id": k,
                       "block_order": None if kind in UNORDERED else order})
        boxes.append({"cls_id": REGION_TYPES.index(kind) if kind in REGION_TYPES else -1, "label": label,
                      "score": r.get("score", 0.0), "coordinate": [float(v) for v in bbox]})
    use_cls = defaults.use_textline_orientation if options.cls is None else options.cls
    pruned = {
        "page_index": page_index,
        "model_settings": {"use_doc_preprocessor": False, "use_textline_orientation": bool(use_cls),
                           "use_seal_recognition": False, "use_table_recognition": True,
                           "use_formula_recognition": False, "use_chart_recognition": False,
                           "use_region_detection": False},
        "parsing_res_list": blocks,
        "layout_det_res": {"boxes": boxes},
        "overall_ocr_res": pruned_result(lines, page_index, options, defaults),
        "table_res_list": tables,
    }
    md = render_markdown({"results": lines, "regions": page.get("regions"), **(
        {"blocks": page["blocks"]} if "blocks" in page else {})})
    return {"prunedResult": pruned, "markdown": {"text": md, "images": {}, "isStart": True, "isEnd": True}}


def layout_result(body: dict, options: OcrOptions, defaults: PaddleXDefaults, visualize: bool = False) -> dict:
    """`result` of /layout-parsing: layoutParsingResults (one per page) and
    dataInfo; with `visualize`, each page's picture (the OCR boxes drawn)
    as outputImages.overall_ocr_res and inputImage."""
    pages = pages_of(body)
    pdf = "document" in body
    items = []
    for k, page in enumerate(pages):
        item = parsing_results(page, k if pdf else None, options, defaults)
        picture = images_of(page) if visualize else {}
        if picture:
            item["outputImages"] = {"overall_ocr_res": picture["ocrImage"]}
            item["inputImage"] = picture["inputImage"]
        items.append(item)
    return {"layoutParsingResults": items, "dataInfo": data_info(pages, pdf)}


def data_info(pages: list[dict], pdf: bool) -> dict:
    if pdf:
        return {"numPages": len(pages), "pages": [{"width": p["width"], "height": p["height"]} for p in pages],
                "type": "pdf"}
    return {"width": pages[0]["width"], "height": pages[0]["height"], "type": "image"}


def success(log_id: str, result_: dict) -> dict:
    return {"logId": log_id, "result": result_, "errorCode": 0, "errorMsg": "Success"}


def failure(log_id: str, status: int, message: str) -> dict:
    return {"logId": log_id, "errorCode": status, "errorMsg": message}


def images_of(page: dict) -> dict[str, str]:
    """A page's ocrImage and inputImage, from the picture the pipeline drew
    for it (`visualize: "boxes"`, serve_app.ocr.visualize.render_boxes)."""
    picture = page.get("visualization")  # none for a page read from its text layer (never asked here)
    if picture is None:
        return {}
    return {"ocrImage": picture["base64"], "inputImage": picture["input"]["base64"]}
