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
before the replica is ready, the detector and then the classifier on a
thread of their own beside the recogniser (`python -m load_tests startup
serve-run` times it): the shapes of `detector.warm`, every classifier
shape, and the recogniser's per `recognizer.warm`.
Each keeps its own batch queue, lanes,
metrics and canary (serve_app.serving.deployments), and its own thread:
Paddle's predictors are called from one thread each. The classifier takes
the deployment's user_config as the recogniser does; the detector keeps
its own batch defaults (4 images, no wait: serve_app.core.app_args.BATCH_DEFAULTS).
What is given up with the detector here: it scales with the recogniser,
not on its own backlog."""

from __future__ import annotations

import contextlib
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncIterator, Optional

from ray import serve

from serve_app.core.engine_config import EngineConfig
from serve_app.core.own_sets import SetLoading
from serve_app.flow.pipeline import Pipeline, Stages
from serve_app.serving.heap import trim
from serve_app.serving.set_cache import SetCache, one_replica
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
        # The detector, then the classifier, are loaded and warmed on a thread
        # of their own while the recogniser is, here: each predictor runs on
        # its own thread anyway (serve_app.inference.predictor), and a
        # predictor's load and warm-up use about one core, so on two cores
        # they overlap instead of following one another. The replica is
        # ready only once all have warmed.
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="build-det") as pool:
            det = cls = None
            if det_args is not None:
                det = pool.submit(_Detector, engine, det_args.model_copy(update=same), lanes)
            if cls_args is not None:
                cls = pool.submit(_Classifier, engine, cls_args.model_copy(update=same), lanes)
            super().__init__(engine, rec_args, lanes)
            if cls is not None:
                self.parts["cls"] = cls.result()
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
            peer.replica.pending or any(part.replica.pending for part in peer.parts.values())
            for peer in self.peers if peer is not self)

    async def classify(self, crops, deadline: Optional[float] = None, lane: Optional[str] = None,
                       client: Optional[str] = None):
        return await self.parts["cls"].classify(crops, deadline, lane, client)

    async def detect(self, image, deadline: Optional[float] = None, params=None, lane: Optional[str] = None,
                     client: Optional[str] = None):
        return await self.parts["det"].detect(image, deadline, params, lane, client)

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

    def close(self) -> None:
        for part in self.parts.values():
            part.close()
        super().close()

    def ready(self) -> bool:
        return all(part.ready() for part in self.parts.values()) and super().ready()

    def stats(self, stage: Optional[str] = None) -> dict[str, Any]:
        """The recogniser's stats, or with stage "cls" / "det" that part's."""
        return self.parts[stage].stats() if stage in self.parts else super().stats()



def replicas_configured() -> tuple[Optional[int], Optional[int]]:
    """(num_replicas, autoscaling max_replicas) of the deployment this replica is of; (None, None) outside Serve."""
    try:
        config = serve.get_replica_context()._deployment_config
    except Exception:  # not in a replica (a test building the class itself)
        return None, None
    auto = config.autoscaling_config
    return config.num_replicas, (auto.max_replicas if auto is not None else None)


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
                 det_args: DetectorArgs, lanes: LaneArgs = LaneArgs(),
                 engines: Optional[dict[str, EngineConfig]] = None, loading: SetLoading = SetLoading(),
                 layout_args: ModelArgs = ModelArgs(), table_args: ModelArgs = ModelArgs()):
        """`engine`: the default model set's config; `engines`: every
        catalogued set's (default: engine's alone), the default first. The
        default set's detector and recogniser, and the classifier (shared by
        every set), are built and warmed here, before the replica is ready;
        each other set's on its first request, within loading.memory_mb
        (serve_app/serving/set_cache.py). The document-structure models
        (layout_args, table_args) are built here on the first request that
        asks for structure, on the recogniser's cores
        (serve_app/serving/structure_start.py StructureInProcess)."""
        from serve_app.serving.structure_deployments import build_both
        from serve_app.serving.structure_start import StructureInProcess

        one_replica(*replicas_configured())
        t0 = time.perf_counter()
        self.models = m = RecognizerWithParts.func_or_class(engine, rec_args, cls_args, det_args, lanes)
        self.handles = {}  # no stage deployments: stats() and ready() read the parts here
        self._classify = ((lambda crops, ctx: m.classify(crops, ctx.deadline, ctx.lane, ctx.client))
                          if "cls" in m.parts else None)
        self._engines = dict(engines or {engine.model: engine})
        if next(iter(self._engines)) != engine.model:
            raise ValueError(f"the first model set served ({next(iter(self._engines))}) must be engine's ({engine.model})")
        self._rec_args, self._det_args, self._lanes = rec_args, det_args, lanes
        same = {k: getattr(rec_args, k) for k in ModelArgs.model_fields
                if k in ("cpu_cores", "threads") or k.startswith("malloc_")}  # one process, one affinity and heap
        self.structure = StructureInProcess(lambda: build_both(engine, layout_args.model_copy(update=same),
                                                               table_args.model_copy(update=same), lanes), loading)
        self._user_config: Optional[dict] = None
        self._peers: list[RecognizerWithParts] = [m]  # every loaded set's models: each one's _others_busy
        m.peers = self._peers
        self._setup({engine.model: (self._stages(m), engine)}, lanes)
        self.served = tuple(self._engines)  # the catalogue: every set a request may name
        self.sets = SetCache(self.served, self._build_set, self._close_set, loading, after_unload=trim)
        self.sets.add(engine.model, (m, self.pipeline), time.perf_counter() - t0)

    def _stages(self, s: "RecognizerWithParts") -> Stages:
        return self.structure.stages(Stages(
            detect=lambda image, params, ctx: s.detect(image, ctx.deadline, params, ctx.lane, ctx.client),
            classify=self._classify,
            recognize=lambda crops, ctx=None: s.recognize(crops, ctx.deadline, ctx.lane, ctx.client)))

    def _build_set(self, name: str) -> tuple["RecognizerWithParts", Pipeline]:
        """A further set's detector and recogniser, built and warmed (on the set cache's loader thread)."""
        engine = self._engines[name]
        s = RecognizerWithParts.func_or_class(engine, self._rec_args, None, self._det_args, self._lanes)
        s.peers = self._peers
        if self._user_config is not None:  # the batch knobs the loaded sets run with
            s.reconfigure(self._user_config)
        self._peers.append(s)
        hold = self.bulk_gate.hold if self.bulk_gate is not None else None
        return s, Pipeline(self._stages(s), engine, hold)

    def _close_set(self, loaded: tuple["RecognizerWithParts", Pipeline]) -> None:
        s = loaded[0]
        self._peers.remove(s)
        s.close()

    @contextlib.asynccontextmanager
    async def _set(self, name: str) -> AsyncIterator[Pipeline]:
        async with self.sets.use(name) as (_, pipeline):
            yield pipeline

    def model_states(self) -> dict[str, dict[str, Any]]:
        return self.sets.states()

    def reconfigure(self, user_config: dict) -> None:
        """The OcrPipeline block's user_config: the recognisers' (and classifier's) batch knobs."""
        self._user_config = user_config
        for s in self._loaded().values():
            s.reconfigure(user_config)

    async def check_health(self) -> None:
        for s in self._loaded().values():
            await s.check_health()
        for part in self._structure_parts().values():
            await part.check_health()

    def _loaded(self) -> dict[str, "RecognizerWithParts"]:
        """The loaded sets' models, the default first."""
        return {name: obj[0] for name, obj in sorted(self.sets.loaded.items(), key=lambda kv: kv[0] != self.served[0])}

    def _named(self) -> list[tuple[str, RecognizerWithParts]]:
        """(suffix, models) per loaded set: "" for the default, "@name" for the others."""
        return [("" if k == 0 else f"@{name}", s) for k, (name, s) in enumerate(self._loaded().items())]

    async def stats(self, calls: Optional[dict[str, int]] = None, timeout_s: float = 2.0) -> dict[str, list[dict]]:
        """stage -> [this replica's stats() of it] (every stage is here);
        a further set's stages as "det@NAME", "rec@NAME"."""
        out: dict[str, list[dict]] = {}
        for suffix, s in self._named():
            out.update({f"{name}{suffix}": [s.stats(name)] for name in s.parts})
            out[f"rec{suffix}"] = [s.stats()]
        for name, part in self._structure_parts().items():
            out[name] = [part.stats()]
        return out

    def _structure_parts(self) -> dict[str, Any]:
        """The structure models, once a request has loaded them."""
        loaded = self.structure.loaded()
        return {} if loaded is None else dict(zip(("layout", "table"), loaded))

    async def ready(self) -> dict[str, bool]:
        out: dict[str, bool] = {}
        for suffix, s in self._named():
            out.update({f"{name}{suffix}": part.ready() for name, part in s.parts.items()})
            out[f"rec{suffix}"] = s.ready()
        out.update({name: part.ready() for name, part in self._structure_parts().items()})
        return out
