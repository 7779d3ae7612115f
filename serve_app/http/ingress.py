"""The HTTP ingress deployment: a Serve shell around one Front
(serve_app/http/front.py) per replica. It gives the front Ray's parts (the
metrics, the Ray errors behind a handle call, Serve's status), serves the
app built over it (serve_app/http/app.py) and the handle API
(`serve.get_app_handle("ocr").ocr.remote(...)`)."""

import contextvars
from typing import Any, Optional

import ray
from fastapi import FastAPI
from ray import serve
from ray.exceptions import ActorUnavailableError, RayActorError, RayError
from ray.serve.exceptions import BackPressureError
from ray.serve.handle import DeploymentHandle

from serve_app.core.app_args import CacheArgs, IngressArgs, LaneArgs
from serve_app.core.engine_config import DocumentLimits, ImageLimits
from serve_app.core.errors import Overloaded, Unavailable
from serve_app.http import paddlex
from serve_app.http.app import build_app
from serve_app.http.front import Front, HandleErrors
from serve_app.http.headers import check_exposure
from serve_app.serving.metrics import AdmissionMetrics, CacheMetrics, RequestMetrics


def unwrap(e: BaseException) -> BaseException:
    """The domain error behind a Ray error, if any: a replica's exception
    (a RayTaskError's cause), Serve's back-pressure refusal as our 503
    Overloaded, a dead replica as our 503 Unavailable."""
    if isinstance(e, BackPressureError):
        return Overloaded("the service is at capacity; retry shortly")
    if isinstance(e, (RayActorError, ActorUnavailableError)):
        return Unavailable("a replica serving this request stopped; retry shortly")
    cause = getattr(e, "cause", None)
    return cause if isinstance(cause, BaseException) else e


def outside_request(start, *args):
    """`start(*args)` (a handle call) as a call of no request, in a context
    of its own: the proxy cancels a request whose client went away with
    `ray.cancel`, recursively, and Ray finds the children by the async task
    id in the caller's context (ray._raylet.async_task_id), Serve by its
    request context (ray.serve.context, cancel_on_parent_request_cancel);
    a computation that identical requests share belongs to all that wait
    on it (Dedupe cancels it once none does). The call's own arguments
    carry the request's deadline, lane and client."""
    return contextvars.Context().run(start, *args)


# RayTaskError (a replica's exception), RayActorError, Serve's back-pressure refusal; shared calls outside requests.
RAY_ERRORS = HandleErrors((RayError, BackPressureError), unwrap, outside_request)


class ServeCluster:
    """What the front asks of Serve: this replica's application, Serve's status."""

    @staticmethod
    def app_name() -> str:
        return serve.get_replica_context().app_name

    @staticmethod
    def status():
        return serve.status()


def _serve_host() -> Optional[str]:
    """The host Serve's HTTP proxies listen on (http_options.host); None if unknown."""
    try:
        from ray.serve.context import _get_global_client

        return _get_global_client().http_config.host
    except Exception:
        return None


@serve.deployment(name="OcrIngress")
@serve.ingress()  # the app is built in each replica over its front (__serve_build_asgi_app__)
class OcrIngress:
    def __init__(self, pipeline: DeploymentHandle, jobs: DeploymentHandle, limits: ImageLimits,
                 args: IngressArgs = IngressArgs(), documents: DocumentLimits = DocumentLimits(),
                 paddlex_defaults: Optional[paddlex.PaddleXDefaults] = None, cache: CacheArgs = CacheArgs(),
                 model_id: str = "", lanes: LaneArgs = LaneArgs(), models: tuple = ("ppocrv6_small",)):
        self.front = Front(pipeline, jobs, limits, args, documents, paddlex_defaults, cache, model_id, lanes,
                           metrics=RequestMetrics(), admission_metrics=AdmissionMetrics(),
                           cache_metrics=CacheMetrics(), errors=RAY_ERRORS, cluster=ServeCluster(),
                           models=models, put=ray.put)
        check_exposure(_serve_host(), self.front.clients.requires_token(self.front.token), args.allow_anonymous)

    def __serve_build_asgi_app__(self) -> FastAPI:
        return build_app(self.front)

    # -- handle API (other Ray jobs and deployments) -------------------------
    async def ocr(self, image: Any, options: Optional[dict] = None) -> Any:
        """`serve.get_app_handle("ocr").ocr.remote(image_bytes_or_array)`:
        Front.ocr (the same dict as the HTTP body, or a rendered document)."""
        return await self.front.ocr(image, options)
