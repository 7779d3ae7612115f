"""The application's typed arguments (the `args:` block of deployments.yaml)
and the replica-side helpers that apply them."""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict, Field

from .config import EngineConfig, PredictorOptions
from .errors import ConfigError

# For the pure-Python replicas that handle whole images (pipeline, ingress):
# glibc's mmap threshold fixed at 128 KiB, so image-sized buffers are
# returned to the OS when freed. By default the threshold rises after the
# first large free, later images come from the heap, and the process's
# memory ratchets up with every burst of load (seen in the soak). glibc
# reads it at process start, hence the runtime_env.
FIXED_MMAP_THRESHOLD = {"runtime_env": {"env_vars": {"MALLOC_MMAP_THRESHOLD_": "131072"}}}


class StageRuntime(BaseModel):
    """How one model deployment's replicas run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Predictor options for this stage; None = the engine's.
    predictor: Optional[PredictorOptions] = None
    # Cores this stage's replicas pin their inference threads to. Replica k on
    # a node takes `threads` consecutive entries starting at k * threads
    # (wrapping), so replicas of one stage spread over the listed cores.
    cpu_cores: Optional[list[int]] = None
    threads: int = Field(1, ge=1)
    # Initial batch knobs; user_config's max_batch_size / batch_wait_timeout_s
    # replace them live.
    max_batch_size: int = Field(4, ge=1)
    batch_wait_timeout_s: float = Field(0.0, ge=0)
    # Recogniser only: an image with at least `fan_out_min_items` crops is
    # sent as up to `fan_out` calls (crops dealt out in width order), so that
    # several replicas read one text-dense page at once. 1 = one call per
    # image. Answers are the same either way (crops are batched by width
    # bucket wherever they are read).
    fan_out: int = Field(1, ge=1)
    fan_out_min_items: int = Field(12, ge=2)
    # Warm-up shapes (detector (h, w) inputs; recogniser crop widths at height 48).
    warm_det_shapes: list[tuple[int, int]] = [(960, 960), (640, 640), (320, 960)]
    # Detector: also warm every input shape a large image can give (long side
    # scaled to the limit; 79 shapes at 1280). Paddle's OpenVINO engine keeps
    # memory for each input shape it meets (~20 MB for these): warmed, it is
    # taken before ready (2.4 GB and 21 s of warm-up per replica on the
    # 2-core machine) instead of growing in service as new photo sizes come.
    # Off by default: turn it on for a long-running service fed images of
    # many sizes, where predictable memory matters more than start-up.
    warm_det_large_images: bool = False
    warm_rec_widths: list[int] = [480, 640, 960]


class IngressArgs(BaseModel):
    """Admission control and deadlines at the HTTP edge."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Synchronous requests one ingress replica works on at once; more get 503
    # with Retry-After instead of waiting in an unbounded queue.
    max_in_flight: int = Field(32, ge=1)
    retry_after_s: int = Field(1, ge=1)
    # Deadline for a request that names none (X-Request-Timeout, seconds).
    default_timeout_s: float = Field(120.0, gt=0)
    max_timeout_s: float = Field(600.0, gt=0)
    # Bearer-token authentication for /v1/*: the name of an environment
    # variable (in the ingress replica) holding the token. None = off (the
    # default, for 127.0.0.1); set it whenever the port is reachable by others.
    auth_token_env: Optional[str] = None


def replica_cores(runtime: StageRuntime) -> Optional[list[int]]:
    if not runtime.cpu_cores:
        return None
    try:
        from ray import serve

        rank = serve.get_replica_context().rank.local_rank
    except Exception:  # outside a replica (tests, library use)
        rank = 0
    n = len(runtime.cpu_cores)
    return sorted({runtime.cpu_cores[(rank * runtime.threads + j) % n] for j in range(runtime.threads)})


def batch_params(user_config: dict, size: int, wait: float) -> tuple[int, float]:
    """Validate a user_config's batch knobs, keeping current values for the
    ones it leaves out."""
    unknown = set(user_config) - {"max_batch_size", "batch_wait_timeout_s"}
    if unknown:
        raise ConfigError(f"unknown user_config keys {sorted(unknown)}; "
                          f"allowed: max_batch_size, batch_wait_timeout_s")
    size = user_config.get("max_batch_size", size)
    wait = user_config.get("batch_wait_timeout_s", wait)
    if not isinstance(size, int) or size < 1:
        raise ConfigError(f"user_config max_batch_size must be an integer >= 1, got {size!r}")
    if not isinstance(wait, (int, float)) or wait < 0:
        raise ConfigError(f"user_config batch_wait_timeout_s must be a number >= 0, got {wait!r}")
    return size, float(wait)


class JobArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    ttl_s: float = Field(3600, gt=0, description="how long a finished job's result is kept")
    capacity: int = Field(1000, ge=1, description="jobs held at once (queued, running or finished)")
    concurrency: int = Field(8, ge=1, description="jobs sent to the pipeline at once")
    journal: Optional[str] = Field(
        None, description="SQLite file holding every accepted job until it expires, so that a restarted store "
        "loses none (unfinished ones run again). It must be reachable by the restarted replica: on a multi-node "
        "cluster, shared storage, or the JobStore pinned to one node. None: jobs are in memory only.")


class AppArgs(BaseModel):
    """The `args:` block of an application in deployments.yaml."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    engine: EngineConfig = EngineConfig(predictor=PredictorOptions(enable_openvino_engine=True))
    ingress: IngressArgs = IngressArgs()
    jobs: JobArgs = JobArgs()
    detector: StageRuntime = StageRuntime()
    classifier: StageRuntime = StageRuntime(max_batch_size=24)
    recognizer: StageRuntime = StageRuntime(max_batch_size=24)
