"""The direction classifier beside the recogniser, in one replica process
(`classifier.beside_recognizer: true`, deployments.light.yaml).

A model replica is a process of its own, and each holds its own copy of
Paddle's and OpenVINO's runtimes and of Ray's worker (~0.3 GB PSS for the
classifier's process, of which its model and 6 compiled shapes are a few
tens of MB: docs/performance.md, "Footprint"). Here the classifier's
predictor is built in every recogniser replica instead: the deployment is
the recogniser's (its name, resources, replicas and user_config come from
the `TextRecognizer` block of the Serve config) and also answers
`classify`. The classifier's predictor runs on the recogniser's cores
(its block's `cpu_cores` and `threads` are not used). Both predictors are
loaded and warmed before the replica is ready (every classifier shape; the
recogniser's per `recognizer.warm`); each keeps its own batch queue, lanes,
metrics and canary (serve_app.serving.deployments)."""

from __future__ import annotations

from typing import Any, Optional

from ray import serve

from serve_app.core.engine_config import EngineConfig
from serve_app.serving.deployments import DirectionClassifierDeployment, TextRecognizerDeployment
from serve_app.core.app_args import ClassifierArgs, LaneArgs, RecognizerArgs

_Recognizer = TextRecognizerDeployment.func_or_class
_Classifier = DirectionClassifierDeployment.func_or_class


@serve.deployment(name="TextRecognizer")
class RecognizerWithClassifier(_Recognizer):
    def __init__(self, engine: EngineConfig, rec_args: RecognizerArgs, cls_args: ClassifierArgs,
                 lanes: LaneArgs = LaneArgs()):
        # One process has one CPU affinity: building a predictor pins the whole
        # process to its cores (serve_app.inference.predictor.pin_process, within what the
        # process already has), so the classifier takes the recogniser's cores
        # (else the one built last would narrow both to its own); the malloc
        # threshold is the process's too.
        cls_args = cls_args.model_copy(update={"cpu_cores": rec_args.cpu_cores, "threads": rec_args.threads,
                                               "malloc_mmap_threshold": rec_args.malloc_mmap_threshold})
        # The classifier first: a replica is ready only once both have warmed.
        self.classifier_part = _Classifier(engine, cls_args, lanes)
        super().__init__(engine, rec_args, lanes)

    async def classify(self, crops, deadline: Optional[float] = None, lane: Optional[str] = None):
        return await self.classifier_part.classify(crops, deadline, lane)

    def reconfigure(self, user_config: dict) -> None:
        super().reconfigure(user_config)
        self.classifier_part.reconfigure(user_config)

    async def check_health(self) -> None:
        await self.classifier_part.check_health()
        await super().check_health()

    def ready(self) -> bool:
        return self.classifier_part.ready() and super().ready()

    def stats(self, stage: Optional[str] = None) -> dict[str, Any]:
        """The recogniser's stats, or with stage "cls" the classifier's."""
        return self.classifier_part.stats() if stage == "cls" else super().stats()
