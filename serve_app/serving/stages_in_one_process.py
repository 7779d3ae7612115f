"""Other stages beside the recogniser, in one replica process: the direction
classifier (`classifier.beside_recognizer: true`) and the detector
(`detector.beside_recognizer: true`); and, with `recognizer.with_pipeline:
true`, the pipeline too (PipelineWithModels, below), as in
deployments.light.yaml.

A model replica is a process of its own, and each holds its own copy of
Paddle's and OpenVINO's runtimes and of Ray's worker (~0.35 GB PSS for the
classifier's process, of which its model and 6 compiled shapes are a few
tens of MB: `python -m load_tests memory footprint`). Here those stages'
predictors are built in every recogniser replica instead: the deployment is
the recogniser's (its name, resources, replicas and user_config come from
the `TextRecognizer` block of the Serve config) and also answers `classify`
and `detect`. Their predictors run on the recogniser's cores (their blocks'
`cpu_cores`, `threads` and `malloc_*` settings are not used: a process
has one affinity and one malloc). Every predictor is loaded and warmed
before the replica is ready, the detector on a thread of its own beside
the other two (ready 1-2 s sooner on 2 cores, `python -m load_tests startup serve-run`): every
detector and classifier shape, and the recogniser's per `recognizer.warm`.
Each keeps its own batch queue, lanes,
metrics and canary (serve_app.serving.deployments), and its own thread:
Paddle's predictors are called from one thread each. The classifier takes
the deployment's user_config as the recogniser does; the detector keeps
its own batch defaults (4 images, no wait: serve_app.core.app_args.BATCH_DEFAULTS).
What is given up with the detector here: it scales with the recogniser,
not on its own backlog."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

from ray import serve

from serve_app.core.engine_config import EngineConfig, for_model
from serve_app.flow.pipeline import Stages
from serve_app.serving.deployments import (
    DirectionClassifierDeployment, OcrPipeline, TextDetectorDeployment, TextRecognizerDeployment,
)
from serve_app.core.app_args import ClassifierArgs, DetectorArgs, LaneArgs, ModelArgs, RecognizerArgs

_Recognizer = TextRecognizerDeployment.func_or_class
_Classifier = DirectionClassifierDeployment.func_or_class
_Detector = TextDetectorDeployment.func_or_class


@serve.deployment(name="TextRecognizer")
class RecognizerWithParts(_Recognizer):
    def __init__(self, engine: EngineConfig, rec_args: RecognizerArgs, cls_args: Optional[ClassifierArgs] = None,
                 det_args: Optional[DetectorArgs] = None, lanes: LaneArgs = LaneArgs()):
        # One process has one CPU affinity: building a predictor pins the whole
        # process to its cores (serve_app.inference.predictor.pin_process, within what the
        # process already has), so every part takes the recogniser's cores
        # (else the one built last would narrow all to its own); the malloc
        # settings are the process's too.
        same = {k: getattr(rec_args, k) for k in ModelArgs.model_fields
                if k in ("cpu_cores", "threads") or k.startswith("malloc_")}
        self.parts: dict[str, Any] = {}
        # The detector is loaded and warmed on a thread of its own while the
        # classifier and the recogniser are, here: each predictor runs on its
        # own thread anyway (serve_app.inference.predictor), and a shape's
        # first run is mostly the engine compiling it on one core, so on two
        # cores the detector's 21 shapes overlap the others' instead of
        # following them. The replica is ready only once all have warmed.
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="build-det") as pool:
            det = None
            if det_args is not None:
                det = pool.submit(_Detector, engine, det_args.model_copy(update=same), lanes)
            if cls_args is not None:
                self.parts["cls"] = _Classifier(engine, cls_args.model_copy(update=same), lanes)
            super().__init__(engine, rec_args, lanes)
            if det is not None:
                self.parts["det"] = det.result()

    # Other model sets' stages in this process (PipelineWithModels): their work counts as busy too.
    peers: tuple = ()

    def _others_busy(self) -> bool:
        # The detector or classifier has an image or crops queued or running:
        # the recogniser's shapes left after ready wait (they would take the
        # cores from that request; the first request after ready was 0.8-1.1 s).
        # So does any other set's detector or recogniser in this process.
        return any(part.replica.pending for part in self.parts.values()) or any(
            peer.replica.pending or any(part.replica.pending for part in peer.parts.values()) for peer in self.peers)

    async def classify(self, crops, deadline: Optional[float] = None, lane: Optional[str] = None):
        return await self.parts["cls"].classify(crops, deadline, lane)

    async def detect(self, image, deadline: Optional[float] = None, params=None, lane: Optional[str] = None):
        return await self.parts["det"].detect(image, deadline, params, lane)

    def reconfigure(self, user_config: dict) -> None:
        super().reconfigure(user_config)
        if "cls" in self.parts:
            self.parts["cls"].reconfigure(user_config)
        if "det" in self.parts:
            self.parts["det"].reconfigure({})  # its own knobs; its canary runs again as the others' do

    async def check_health(self) -> None:
        for part in self.parts.values():
            await part.check_health()
        await super().check_health()

    def ready(self) -> bool:
        return all(part.ready() for part in self.parts.values()) and super().ready()

    def stats(self, stage: Optional[str] = None) -> dict[str, Any]:
        """The recogniser's stats, or with stage "cls" / "det" that part's."""
        return self.parts[stage].stats() if stage in self.parts else super().stats()



@serve.deployment(name="OcrPipeline")
class PipelineWithModels(OcrPipeline.func_or_class):
    """`recognizer.with_pipeline: true`: the pipeline and the three models in
    one replica process. The OcrPipeline deployment (what the ingress and
    the job store call, as ever) builds a RecognizerWithParts here, as a
    plain object, and its pipeline calls the stages' methods directly: the
    same batch queues, crop scheduler, lanes and deadlines as behind a
    handle, requests' images and crops still batched together, but no Ray
    hop, no object store and no second event loop between the pipeline and
    the models. What is given up: the stages no longer have replicas of
    their own (the pipeline's replicas are the models' replicas), and the
    pipeline's own CPU work (decoding, crops, PDF pages) shares the models'
    process."""

    def __init__(self, engine: EngineConfig, rec_args: RecognizerArgs, cls_args: Optional[ClassifierArgs],
                 det_args: DetectorArgs, lanes: LaneArgs = LaneArgs(), models: Optional[list[str]] = None):
        """`engine`: the default model set's config; `models`: every set
        served (default: engine's alone). Each set's detector and
        recogniser are built here, one after the other, all warmed before
        the replica is ready; the classifier once (the default set's),
        shared by every set."""
        self.models = m = RecognizerWithParts.func_or_class(engine, rec_args, cls_args, det_args, lanes)
        self.handles = {}  # no stage deployments: stats() and ready() read the parts here
        classify = (lambda crops, ctx: m.classify(crops, ctx.deadline, ctx.lane)) if "cls" in m.parts else None
        self.sets = {engine.model: m}
        names = models or [engine.model]
        if names[0] != engine.model:
            raise ValueError(f"the first model set served ({names[0]}) must be engine's ({engine.model})")
        for name in names[1:]:
            self.sets[name] = RecognizerWithParts.func_or_class(for_model(engine, name), rec_args, None, det_args,
                                                                lanes)
        for s in self.sets.values():
            s.peers = tuple(other for other in self.sets.values() if other is not s)
        self._setup({name: (Stages(
            detect=lambda image, params, ctx, s=s: s.detect(image, ctx.deadline, params, ctx.lane),
            classify=classify,
            recognize=lambda crops, ctx=None, s=s: s.recognize(crops, ctx.deadline, ctx.lane),
        ), for_model(engine, name)) for name, s in self.sets.items()}, lanes)

    def reconfigure(self, user_config: dict) -> None:
        """The OcrPipeline block's user_config: the recognisers' (and classifier's) batch knobs."""
        for s in self.sets.values():
            s.reconfigure(user_config)

    async def check_health(self) -> None:
        for s in self.sets.values():
            await s.check_health()

    def _named(self) -> list[tuple[str, RecognizerWithParts]]:
        """(suffix, models) per set: "" for the default, "@name" for the others."""
        return [("" if k == 0 else f"@{name}", s) for k, (name, s) in enumerate(self.sets.items())]

    async def stats(self, calls: Optional[dict[str, int]] = None, timeout_s: float = 2.0) -> dict[str, list[dict]]:
        """stage -> [this replica's stats() of it] (every stage is here);
        a further set's stages as "det@NAME", "rec@NAME"."""
        out: dict[str, list[dict]] = {}
        for suffix, s in self._named():
            out.update({f"{name}{suffix}": [s.stats(name)] for name in s.parts})
            out[f"rec{suffix}"] = [s.stats()]
        return out

    async def ready(self) -> dict[str, bool]:
        out: dict[str, bool] = {}
        for suffix, s in self._named():
            out.update({f"{name}{suffix}": part.ready() for name, part in s.parts.items()})
            out[f"rec{suffix}"] = s.ready()
        return out
