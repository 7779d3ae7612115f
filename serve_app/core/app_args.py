"""The application's typed arguments (the `args:` block of deployments.yaml),
one model per deployment, and the batch knobs (a model deployment's
`user_config`). Pydantic, no Ray import: every bad value is refused when the
application is built, with a message naming it.

Where each setting lives (one home each):
- resources, replica counts, autoscaling, max_ongoing_requests: the Serve
  config file (deployments.yaml / deployments.gpu.yaml), never the code;
- batch knobs: `user_config` of each model deployment (changed live), with
  the defaults below for a config that gives none;
- everything else: the typed args here.
"""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from serve_app.core.engine_config import EngineConfig, PredictorOptions
from serve_app.core.errors import ConfigError
from serve_app.core.job_args import JobArgs, LaneArgs, _Args
from serve_app.core.own_sets import OwnModelSet, SetLoading
from serve_app.core.ingress_args import AdmissionArgs, CacheArgs, IngressArgs

__all__ = ["AdmissionArgs", "AppArgs", "BATCH_DEFAULTS", "BatchKnobs", "CacheArgs", "ClassifierArgs", "DetectorArgs", "IngressArgs",
           "JobArgs", "LaneArgs", "ModelArgs", "RecognizerArgs"]


class ModelArgs(_Args):
    """How one model deployment's replicas run its predictor. The malloc_*
    settings tune the process's glibc heap (serve_app/serving/heap.py,
    docs/operations.md, "Memory"): with a model beside the recogniser, the
    recogniser's values hold (one process, one heap). The heap's arena limit
    is not a setting here: glibc reads it once, at the process's first
    allocation, so its one home is MALLOC_ARENA_MAX in the deployment's
    runtime_env (every profile gives the model processes 1)."""

    @model_validator(mode="before")
    @classmethod
    def _arena_in_the_environment(cls, data: Any) -> Any:
        if isinstance(data, dict) and "malloc_arena_max" in data:
            raise ValueError("malloc_arena_max is not an arg: set MALLOC_ARENA_MAX in the deployment's "
                             "ray_actor_options.runtime_env.env_vars (glibc reads it at the process's first "
                             "allocation; docs/operations.md, \"Memory\")")
        return data

    predictor: Optional[PredictorOptions] = Field(
        None,
        description="Predictor options for this stage, laid over engine.predictor inside AppArgs (only what differs "
        "is written here: `tensorrt: {...}` alone keeps the engine's `device: gpu`); None = the engine's.")
    cpu_cores: Optional[list[int]] = Field(
        None,
        description="Cores this stage's replicas pin their inference threads to. Replica k on a node takes `threads` "
        "consecutive entries starting at k * threads (wrapping), so replicas of one stage spread over the "
        "listed cores.")
    threads: int = Field(
        1, ge=1,
        description="cores (and inference threads) each replica takes from cpu_cores; no effect without cpu_cores")
    canary_interval_s: float = Field(
        60.0, ge=0,
        description="The correctness canary (serve_app.serving.canary): each replica reads its golden input before it "
        "is ready, after every live reconfigure (not the one Serve makes as it starts the replica, right after "
        "that first read), and every this many seconds (checked within Serve's health "
        "checks, so at most every health_check_period_s); 0 = not periodically.")
    malloc_mmap_threshold: Optional[int] = Field(
        None, ge=64 * 1024, le=32 * 1024 * 1024,
        description="bytes: a fixed glibc mmap threshold for the replica's process (mallopt "
        "M_MMAP_THRESHOLD, set before its predictor is built): larger buffers are mapped on every "
        "allocation and unmapped when freed. null (the default): glibc's own threshold, which rises to the "
        "largest buffer freed, so image-sized buffers are reused from the heap; 131072 was the default "
        "before and cost ~25 ms of page faults per image here (the heap_settings benchmark, deleted once it had decided this; commit 4adefb1 has it). "
        "At least 64 KiB and at most 32 MiB (glibc's own ceiling)")
    malloc_trim_idle_s: Optional[float] = Field(
        1.0, gt=0,
        description="seconds: the heap's free pages go back to the OS (malloc_trim) after warm-up and once "
        "no predictor call has begun or ended in the process for this long; null: never trimmed (the "
        "heap keeps its peak)")


class DetectorArgs(ModelArgs):
    warm_shapes: list[tuple[int, int]] = Field(
        [(960, 960), (640, 640), (320, 960)],
        description="Detector input shapes (h, w) warmed before the replica is ready when engine.det's sizing is an "
        "open mode (\"max\"/\"min\"); with the default \"ladder\" every input shape of its closed set is warmed "
        "instead.")
    warm: Literal["full", "core"] = Field(
        "core",
        description="Which detector input shapes a replica runs before it is ready. \"full\": every one (21 "
        "with the default ladder). \"core\": the largest only (its buffers are the heap's high-water mark, "
        "which every later shape fits in); each other shape's first run is then a request's, ~40 ms slower "
        "than its next ones. Not with TensorRT, which builds an engine per shape: every shape is warmed.")
    beside_recognizer: bool = Field(
        False,
        description="true: no TextDetector deployment; each recogniser replica also runs the detector "
        "(serve_app/serving/stages_in_one_process.py): one process and one copy of the runtimes fewer, "
        "but the detector then scales with the recogniser. Its predictor options still apply; its cores, "
        "threads, replicas, resources and user_config are the recogniser's (its batch knobs stay the "
        "code's defaults).")


class ClassifierArgs(ModelArgs):
    beside_recognizer: bool = Field(
        False,
        description="true: no DirectionClassifier deployment; each recogniser replica also runs the classifier "
        "(serve_app/serving/stages_in_one_process.py): one process and one copy of the runtimes fewer. "
        "Its predictor options still apply; its cores, threads, replicas and resources are the "
        "recogniser's.")


class RecognizerArgs(ModelArgs):
    warm_widths: list[int] = Field(
        [480, 640, 960],
        description="Crop widths (at height 48) warmed when the width set is open (rec.batch_padding \"batch_max\"); "
        "with the width ladder every shape is.")
    warm: Literal["full", "core"] = Field(
        "core",
        description="Which input shapes a replica runs before it is ready. \"full\": all of them (71 by default). "
        "\"core\": every width of the ladder up to warm_core_max_width at batch size 1 (9 of 15 by default); "
        "the rest are built after ready on the "
        "predictor's thread, one at a time and only while no batch is queued (the wider widths at batch size "
        "1 first), and until then a batch at a "
        "shape not built yet runs as batches of built shapes of its width (a width with none built: as batches "
        "of 1, the first of which builds it): the same text, and no request "
        "waits on the predictor for more than the one build running when it came and the one its own batch "
        "needs; but the builds take CPU "
        "from the other stages, so the first requests after ready are slower "
        "(serve_app/serving/shapes_after_ready.py). Applies with bucket padding unless TensorRT is on (it "
        "builds an engine per shape; a replica on the CPU fallback defers); otherwise every shape is "
        "warmed.")
    warm_core_max_width: int = Field(
        1024, ge=1,
        description="With warm \"core\": the widest crop width (at height 48) warmed before the replica is "
        "ready; the wider widths at batch size 1 are the first shapes built after it. A shape's first run "
        "costs about as much again as its next ones, and the wide ones cost most (docs/performance.md, "
        "start-up). A line that wide in the first seconds after ready costs its width's one build (~50-190 "
        "ms here).")
    batch_sizes: Optional[list[int]] = Field(
        None,
        description="The predictor batch sizes a replica builds at each width, besides the width's largest (a full "
        "batch, batch_limit); a batch of any other size runs as batches of built sizes (5 crops as 4 + "
        "1), reading the same text (bucket padding: a crop is padded to its own bucket in any batch). "
        "Each shape a replica builds keeps ~3.5 MB of the engine's kernels and buffers; null: every size "
        "from 1 to the width's largest (71 shapes by default, against 51 with [1, 2, 4]). Needs 1 (a lone "
        "crop); applies with bucket padding unless TensorRT is on, as `warm` does.")
    with_pipeline: bool = Field(
        False,
        description="true (with detector.beside_recognizer, and classifier.beside_recognizer unless engine.cls is "
        "off): the pipeline's own work (decoding, crops, order) runs in the recogniser's process too, "
        "which is then the OcrPipeline deployment (serve_app/serving/stages_in_one_process.py, "
        "PipelineWithModels): no TextRecognizer deployment, and an image's three stage calls are local "
        "calls instead of Ray hops (~7-10 ms each here). The deployment's resources, replicas, "
        "max_ongoing_requests and user_config (the recogniser's and classifier's batch knobs) come from "
        "the YAML's OcrPipeline block.")
    fan_out: int = Field(
        1, ge=1,
        description="An image with at least `fan_out_min_items` crops is sent as up to `fan_out` calls (crops dealt "
        "out in width order), so that several replicas read one text-dense page at once. 1 = one call per "
        "image. Answers are the same either way (crops are batched by width bucket wherever they are "
        "read).")
    fan_out_min_items: int = Field(12, ge=2, description="(see fan_out)")


    @field_validator("batch_sizes")
    @classmethod
    def _sizes(cls, v: Optional[list[int]]) -> Optional[list[int]]:
        if v is None:
            return v
        if 1 not in v or any(n < 1 for n in v) or len(set(v)) != len(v):
            raise ValueError(f"batch_sizes {v}: distinct sizes of at least 1, including 1 (a lone crop)")
        return sorted(v)


class BatchKnobs(_Args):
    """A model deployment's `user_config`: its `@serve.batch` knobs."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    max_batch_size: int = Field(ge=1, description="requests per @serve.batch call at most")
    batch_wait_timeout_s: float = Field(
        0.0, ge=0,
        description="seconds a batch waits to fill (0: it runs with what is there)")

    def updated(self, user_config: Optional[dict[str, Any]]) -> "BatchKnobs":
        """These knobs with a user_config's values laid over them; a bad key
        or value is a ConfigError naming it."""
        try:
            return BatchKnobs.model_validate({**self.model_dump(), **(user_config or {})})
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(x) for x in first.get("loc", ())) or "user_config"
            raise ConfigError(f"user_config {where}: {first.get('msg')} "
                              f"(allowed: max_batch_size >= 1, batch_wait_timeout_s >= 0)") from None


# For a Serve config whose model deployments give no user_config. No batch
# wait: on the CPU a wait is pure latency (the GPU profile sets its own).
BATCH_DEFAULTS = {
    "det": BatchKnobs(max_batch_size=4),
    "cls": BatchKnobs(max_batch_size=24),
    "rec": BatchKnobs(max_batch_size=24),
    # Document structure (options.structure): pages per layout batch, table crops per table batch.
    "layout": BatchKnobs(max_batch_size=4),
    "table": BatchKnobs(max_batch_size=8),
}


STAGES = ("detector", "classifier", "recognizer", "layout", "table")


def _given(value: Any) -> dict[str, Any]:
    """The settings a config wrote (a dict as written, or a model's
    explicitly set fields)."""
    if isinstance(value, BaseModel):
        return value.model_dump(exclude_unset=True)
    return dict(value)


def _overlay(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """`top` laid over `base`, nested mappings (tensorrt) key by key."""
    out = dict(base)
    for key, value in top.items():
        below = out.get(key)
        if isinstance(value, (dict, BaseModel)) and isinstance(below, dict):
            out[key] = _overlay(below, _given(value))
        else:
            out[key] = value.model_dump() if isinstance(value, BaseModel) else value
    return out


class AppArgs(_Args):
    """The `args:` block of an application in deployments.yaml."""

    engine: EngineConfig = Field(
        EngineConfig(predictor=PredictorOptions(enable_openvino_engine=True)),
        description="The in-process engine: model files, stage parameters, limits and the default predictor options.")
    models: list[str] = Field(
        ["ppocrv6_small"],
        description="The model sets this application may serve, its catalogue (serve_app.core.model_sets, and "
        "own_models' names); the first is the default (a request naming none), loaded and warmed before the "
        "application is ready; each other one is loaded on its first request (set_loading). Each set has its "
        "own detector and recogniser; the direction classifier is shared. engine's settings apply to every "
        "set, each set's own detector thresholds and normalisation filling what engine does not name.")
    own_models: list[OwnModelSet] = Field(
        [],
        description="A user's own model sets (serve_app.core.own_sets): each is catalogued (added to models if not "
        "listed) and checked when the application is built and at start.")
    set_loading: SetLoading = Field(SetLoading(), description="How replicas load and unload the catalogue's sets.")
    ingress: IngressArgs = Field(IngressArgs(), description="Admission control and deadlines at the HTTP edge.")
    cache: CacheArgs = Field(CacheArgs(), description="Identical work done once: the ingress's result cache.")
    jobs: JobArgs = Field(
        JobArgs(),
        description="The job book (POST /v1/ocr/jobs): its bounds, its store and its journal.")
    detector: DetectorArgs = Field(DetectorArgs(), description="How the TextDetector deployment's replicas run.")
    classifier: ClassifierArgs = Field(
        ClassifierArgs(),
        description="How the DirectionClassifier deployment's replicas run.")
    recognizer: RecognizerArgs = Field(
        RecognizerArgs(),
        description="How the TextRecognizer deployment's replicas run.")
    lanes: LaneArgs = Field(
        LaneArgs(),
        description="Priority lanes: interactive work first, bulk in the spare capacity.")
    layout: ModelArgs = Field(
        ModelArgs(),
        description="How the LayoutDetector deployment's replicas run (document structure: started on the first "
        "request that asks; with recognizer.with_pipeline, loaded in the pipeline's process and on the "
        "recogniser's cores instead).")
    table: ModelArgs = Field(
        ModelArgs(),
        description="How the TableRecognizer deployment's replicas run (likewise).")

    @model_validator(mode="before")
    @classmethod
    def _own_catalogued(cls, data: Any) -> Any:
        from serve_app.core.own_sets import catalogued

        return catalogued(data, cls.model_fields["models"].default)

    @model_validator(mode="after")
    def _catalogue(self) -> "AppArgs":
        from serve_app.core.own_sets import check_catalogue

        check_catalogue(self.models, self.own_models)
        return self

    def engines(self) -> dict[str, EngineConfig]:
        """Each catalogued set's engine config, the default first."""
        from serve_app.core.engine_config import for_model

        own = {o.name: o.engine_fields() for o in self.own_models}
        return {name: for_model(self.engine, name, own.get(name)) for name in self.models}


    @model_validator(mode="after")
    def _pipeline_beside_models(self) -> "AppArgs":
        if self.recognizer.with_pipeline and not (
                self.detector.beside_recognizer and (self.classifier.beside_recognizer or not self.engine.cls.enabled)):
            raise ValueError("recognizer.with_pipeline needs detector.beside_recognizer: true and "
                             "classifier.beside_recognizer: true (or engine.cls.enabled: false): "
                             "the pipeline then calls every stage in its own process")
        return self

    @model_validator(mode="before")
    @classmethod
    def _stage_predictors_overlay(cls, data: Any) -> Any:
        """A stage's `predictor` is laid over engine.predictor, so a value
        has one home (the GPU profile says `device: gpu` once). The merged
        options are validated as a whole: `tensorrt` in a stage is valid
        when the engine's device is gpu."""
        if not isinstance(data, dict) or not any(
                isinstance(data.get(s), (dict, BaseModel)) and _given(data[s]).get("predictor") is not None
                for s in STAGES):
            return data
        engine = data.get("engine", cls.model_fields["engine"].default)
        try:
            engine = engine if isinstance(engine, EngineConfig) else EngineConfig.model_validate(engine)
        except ValidationError:
            return data  # reported by the field's own validation, with its path
        base = engine.predictor.model_dump()
        out = dict(data)
        for stage in STAGES:
            block = data.get(stage)
            if not isinstance(block, (dict, BaseModel)):
                continue
            given = _given(block)
            top = given.get("predictor")
            if top is None or not isinstance(top, (dict, BaseModel)):
                continue
            out[stage] = {**given, "predictor": _overlay(base, _given(top))}
        return out
