"""Deployment artefacts: the Serve profiles, the KubeRay RayService that embeds
the GPU one, and the Dockerfile. Parsing only: no Ray import, no Kubernetes,
no Docker, no paddle (a few seconds). Validation against Ray Serve's own
schema models imports ray and is in tests/integration/test_serve_configs.py."""

from __future__ import annotations

import importlib.metadata
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
GPU_PROFILE = REPO / "deployments.gpu.yaml"
RAYSERVICE = REPO / "deploy" / "kuberay" / "rayservice.yaml"
DOCKERFILE = REPO / "deploy" / "docker" / "Dockerfile"

MODEL_CHECK = (
    "python -c \"from serve_app.weights import model_files, dictionary_path; "
    "[model_files(s) for s in ('det','cls','rec')]; dictionary_path()\""
)


def _load(path: Path) -> Any:
    with path.open() as f:
        return yaml.safe_load(f)


@pytest.fixture(scope="module")
def rayservice() -> dict:
    return _load(RAYSERVICE)


@pytest.fixture(scope="module")
def embedded(rayservice) -> dict:
    text = rayservice["spec"]["serveConfigV2"]
    assert isinstance(text, str), "serveConfigV2 must be a YAML string (`serveConfigV2: |`)"
    return yaml.safe_load(text)


@pytest.fixture(scope="module")
def cluster(rayservice) -> dict:
    return rayservice["spec"]["rayClusterConfig"]


# --- RayService --------------------------------------------------------------------------


def test_rayservice_kind(rayservice):
    assert rayservice["apiVersion"] == "ray.io/v1"
    assert rayservice["kind"] == "RayService"


def test_rayservice_is_generated_from_the_gpu_profile():
    """`python -m serve_app.tools.rayservice` has been run since the last
    change of deployments.gpu.yaml or the template."""
    from serve_app.tools.rayservice import MANIFEST, PROFILE, TEMPLATE, render

    assert MANIFEST.read_text() == render(TEMPLATE.read_text(), PROFILE.read_text()), (
        "deploy/kuberay/rayservice.yaml is stale: run python -m serve_app.tools.rayservice")


def test_embedded_applications_equal_the_gpu_profile(embedded):
    """The profile with its job book moved to Redis (the generator's one
    change; tests/unit/test_kuberay_schema.py checks the Redis side)."""
    from serve_app.tools.rayservice import redis_overlay

    assert embedded["applications"] == redis_overlay(_load(GPU_PROFILE))["applications"], (
        "deploy/kuberay/rayservice.yaml serveConfigV2 and deployments.gpu.yaml differ: keep them in sync"
    )


def test_embedded_http_options_match_the_gpu_profile(embedded):
    gpu = _load(GPU_PROFILE)
    assert embedded.get("proxy_location") == gpu.get("proxy_location")
    assert embedded.get("http_options") == gpu.get("http_options")
    assert embedded["http_options"]["host"] == "0.0.0.0"  # reachable from the pod network
    assert embedded["http_options"]["port"] == 8000  # the port the probe and the Serve Service use


def test_cluster_autoscaling_and_ray_version(cluster):
    # The installed distribution's version, read without importing ray.
    assert cluster["enableInTreeAutoscaling"] is True
    assert cluster["rayVersion"] == importlib.metadata.version("ray")


def test_token_auth_is_an_explicit_choice(cluster):
    """Ray 2.60 turns token auth on for clusters it creates; on Kubernetes the
    manifest must say how the token is supplied, or that auth is off."""
    mode = (cluster.get("authOptions") or {}).get("mode")
    if mode is None:
        for c in _ray_containers(cluster):
            env = {e["name"] for e in c.get("env", [])}
            assert "RAY_AUTH_MODE" in env, f"{c['name']}: set RAY_AUTH_MODE (or use authOptions)"
    else:
        assert mode in ("token", "disabled")


def _ray_containers(cluster: dict) -> list[dict]:
    groups = [cluster["headGroupSpec"]] + cluster["workerGroupSpecs"]
    return [g["template"]["spec"]["containers"][0] for g in groups]


def _cpu(q) -> float:
    q = str(q)
    return float(q[:-1]) / 1000 if q.endswith("m") else float(q)


def _limits(container: dict) -> dict:
    res = container["resources"]
    return {**res.get("requests", {}), **res.get("limits", {})}


def test_every_ray_container_has_requests_and_limits(cluster):
    image = None
    for c in _ray_containers(cluster):
        for kind in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(c["resources"][kind]), f"{c['name']}: {kind}"
        image = image or c["image"]
        assert c["image"] == image, "head and workers must run the same image"


def test_head_holds_no_replicas_and_has_no_gpu(cluster):
    head = cluster["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"  # rayStartParams values are strings
    assert head["rayStartParams"]["metrics-export-port"] == "8080"
    container = head["template"]["spec"]["containers"][0]
    assert "nvidia.com/gpu" not in _limits(container)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    # KubeRay builds the Serve Service from the head's port named "serve".
    assert ports["serve"] == 8000 and ports["metrics"] == 8080 and ports["dashboard"] == 8265


def test_head_readiness_does_not_wait_for_the_app(cluster):
    """KubeRay submits serveConfigV2 only once the head pod is Ready: a head
    probe on /readyz (ready only once the app runs) would never let it."""
    probe = cluster["headGroupSpec"]["template"]["spec"]["containers"][0].get("readinessProbe") or {}
    assert (probe.get("httpGet") or {}).get("path") != "/readyz"


def _gpu_groups(cluster: dict) -> list[dict]:
    return [g for g in cluster["workerGroupSpecs"]
            if "nvidia.com/gpu" in _limits(g["template"]["spec"]["containers"][0])]


def test_gpu_worker_group(cluster):
    groups = _gpu_groups(cluster)
    assert groups, "no worker group requests nvidia.com/gpu"
    for g in groups:
        c = g["template"]["spec"]["containers"][0]
        res = c["resources"]
        assert int(res["limits"]["nvidia.com/gpu"]) == 1
        assert int(res["requests"].get("nvidia.com/gpu", 1)) == int(res["limits"]["nvidia.com/gpu"])
        assert 0 < g["minReplicas"] <= g["replicas"] <= g["maxReplicas"]
        assert g["maxReplicas"] > g["minReplicas"], "nothing for the autoscaler to do"
        assert g["rayStartParams"]["metrics-export-port"] == "8080"


def test_serving_pods_are_ready_only_when_the_app_is(cluster):
    for g in _gpu_groups(cluster):
        c = g["template"]["spec"]["containers"][0]
        get = c["readinessProbe"]["httpGet"]
        port = get["port"]
        if isinstance(port, str):  # a named port
            port = {p["name"]: p["containerPort"] for p in c["ports"]}[port]
        assert get["path"] == "/readyz"
        assert port == 8000


def _demand(cfg: dict, at: str) -> tuple[float, float]:
    """(CPUs, GPUs) the app asks Ray for with every deployment at its
    minimum or maximum replica count."""
    cpus = gpus = 0.0
    for app in cfg["applications"]:
        for d in app["deployments"]:
            auto = d.get("autoscaling_config")
            n = auto[f"{at}_replicas"] if auto else d.get("num_replicas", 1)
            opts = d.get("ray_actor_options") or {}
            cpus += n * opts.get("num_cpus", 1)
            gpus += n * opts.get("num_gpus", 0)
    return cpus, gpus


def test_workers_have_room_for_the_app(cluster, embedded):
    """The head offers no CPU, so the ingress, JobStore and pipeline must fit
    on the workers too: at the minimum on minReplicas pods, at the maximum on
    maxReplicas pods, and every single replica on one pod."""
    groups = cluster["workerGroupSpecs"]
    per_pod = [(_cpu(_limits(c)["cpu"]), float(_limits(c).get("nvidia.com/gpu", 0)))
               for c in (g["template"]["spec"]["containers"][0] for g in groups)]
    for at, count in (("min", "minReplicas"), ("max", "maxReplicas")):
        cpus, gpus = _demand(embedded, at)
        room_cpu = sum(g[count] * c for g, (c, _) in zip(groups, per_pod))
        room_gpu = sum(g[count] * n for g, (_, n) in zip(groups, per_pod))
        assert cpus <= room_cpu, f"{at}: the app needs {cpus} CPUs, the workers offer {room_cpu}"
        assert gpus <= room_gpu, f"{at}: the app needs {gpus} GPUs, the workers offer {room_gpu}"
    for app in embedded["applications"]:
        for d in app["deployments"]:
            opts = d.get("ray_actor_options") or {}
            assert any(opts.get("num_cpus", 1) <= c and opts.get("num_gpus", 0) <= n for c, n in per_pod), d["name"]


def test_tensorrt_cache_dirs_are_on_a_volume(cluster, embedded):
    args = embedded["applications"][0]["args"]
    dirs = [s["predictor"]["tensorrt"]["cache_dir"] for s in args.values()
            if isinstance(s, dict) and ((s.get("predictor") or {}).get("tensorrt") or {}).get("cache_dir")]
    assert dirs
    for g in _gpu_groups(cluster):
        mounts = [m["mountPath"].rstrip("/") + "/" for m in g["template"]["spec"]["containers"][0]["volumeMounts"]]
        for d in dirs:
            assert any(d.startswith(m) for m in mounts), f"{d} is not under a mounted volume"


# --- Dockerfile --------------------------------------------------------------------------


def _dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined; heredoc
    bodies are skipped."""
    out: list[tuple[str, str]] = []
    lines = DOCKERFILE.read_text().splitlines()
    i, pending, heredoc = 0, "", None
    while i < len(lines):
        line = lines[i]
        i += 1
        if heredoc:
            if line.strip() == heredoc:
                heredoc = None
            continue
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        full = pending + line
        pending = ""
        m = re.search(r"<<-?'?\"?(\w+)'?\"?\s*$", full)
        if m:
            heredoc = m.group(1)
        word, _, rest = full.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def _base_image() -> str:
    args: dict[str, str] = {}
    for word, rest in _dockerfile_instructions():
        if word == "ARG" and "=" in rest:
            name, _, default = rest.partition("=")
            args[name.strip()] = default.strip().strip('"')
        if word == "FROM":
            image = rest.split()[0]
            return re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), image)
    raise AssertionError("no FROM in the Dockerfile")


# The python3 each Ubuntu release ships (what `apt-get install python3` gives
# on the base): 20.04 3.8, 22.04 3.10, 24.04 3.12.
UBUNTU_PYTHON = {"20.04": (3, 8), "22.04": (3, 10), "24.04": (3, 12)}
# Paddle's CUDA builds and the CUDA major.minor of the matching base image.
PADDLE_CUDA = {"cu118": "11.8", "cu126": "12.6", "cu129": "12.9"}


def _dockerfile_args() -> dict[str, str]:
    return {rest.partition("=")[0].strip(): rest.partition("=")[2].strip().strip('"')
            for word, rest in _dockerfile_instructions() if word == "ARG" and "=" in rest}


def test_dockerfile_base_has_a_python_the_package_accepts():
    """#29 item 1: the base's own python3 is 3.11 or 3.12 (Paddle's GPU image
    ships 3.10 and stopped the build), and its CUDA is the Paddle build's."""
    words = [w for w, _ in _dockerfile_instructions() if w != "ARG"]
    assert words[0] == "FROM"
    image = _base_image()
    m = re.fullmatch(r"nvidia/cuda:(\d+)\.(\d+)\.(\d+)-(base|runtime|cudnn-runtime)-ubuntu(\d+\.\d+)", image)
    assert m, f"{image}: expected an nvidia/cuda:X.Y.Z-...-ubuntuNN.NN tag"
    cuda, ubuntu = f"{m.group(1)}.{m.group(2)}", m.group(5)
    assert (3, 11) <= UBUNTU_PYTHON[ubuntu] < (3, 13), f"ubuntu {ubuntu} ships Python {UBUNTU_PYTHON[ubuntu]}"
    runs = " ".join(rest for word, rest in _dockerfile_instructions() if word == "RUN")
    assert "apt-get install" in runs and " python3 " in runs and "deadsnakes" not in runs
    args = _dockerfile_args()
    assert PADDLE_CUDA[args["CUDA"]] == cuda, (args["CUDA"], image)
    assert "packages/stable/${CUDA}/" in runs  # paddlepaddle-gpu from Paddle's index for that CUDA
    assert args["PADDLE_GPU_VERSION"] == "3.3.1"


def test_dockerfile_tensorrt_is_optional_and_linked():
    args = _dockerfile_args()
    assert args["REQUIRE_TENSORRT"] == "0" and args["TENSORRT"] == "1"
    runs = " ".join(rest for word, rest in _dockerfile_instructions() if word == "RUN")
    assert "python -m serve_app.inference.tensorrt_libs" in runs and "tensorrt-${cu}-libs" in runs


def test_dockerfile_verifies_the_models_at_build_time():
    runs = " ".join(rest for word, rest in _dockerfile_instructions() if word == "RUN")
    assert MODEL_CHECK in re.sub(r"\s+", " ", runs)


def test_dockerfile_runs_as_a_non_root_user_with_the_ports_exposed():
    ins = _dockerfile_instructions()
    users = [rest for word, rest in ins if word == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    workdirs = [rest for word, rest in ins if word == "WORKDIR"]
    assert workdirs and workdirs[-1] == "/app"
    exposed = {p.split("/")[0] for word, rest in ins if word == "EXPOSE" for p in rest.split()}
    assert {"8000", "8265", "8080"} <= exposed


def test_dockerfile_copies_paths_that_exist():
    for word, rest in _dockerfile_instructions():
        if word == "COPY" and "--from" not in rest:
            *sources, _dest = [a for a in shlex.split(rest) if not a.startswith("--")]
            for s in sources:
                assert (REPO / s).exists(), f"COPY {s}: no such path in the repository"


# --- Python version -----------------------------------------------------


def test_python_versions_agree_with_the_code():
    """serve_app/http/front.py uses asyncio.Task.cancelling() (3.11+): the package and the
    image refuse older Pythons."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["requires-python"].startswith(">=3.11")
    assert "cancelling()" in (REPO / "serve_app" / "http" / "front.py").read_text()
    runs = " ".join(rest for word, rest in _dockerfile_instructions() if word == "RUN")
    assert "(3, 11) <= v" in runs


def test_service_token_comes_from_a_secret_in_every_ray_container(cluster, embedded):
    """#24 item 4: the embedded profile names its token variable, and every
    Ray container (the build runs on the head, the ingress on workers) reads
    it from a Kubernetes Secret, never from a literal."""
    name = embedded["applications"][0]["args"]["ingress"]["auth_token_env"]
    assert name == "OCR_AUTH_TOKEN"
    assert not embedded["applications"][0]["args"]["ingress"].get("allow_anonymous")
    for c in _ray_containers(cluster):
        env = {e["name"]: e for e in c.get("env", [])}
        assert name in env, f"{c['name']}: no {name}"
        assert "value" not in env[name], f"{c['name']}: {name} must come from a Secret"
        ref = env[name]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": "ocr-auth-token", "key": "token"}, ref


# --- GPU packaging on KubeRay (#29 item 3) ------------------------------------------------


def _pod_specs(cluster: dict) -> list[dict]:
    return [g["template"]["spec"] for g in [cluster["headGroupSpec"]] + cluster["workerGroupSpecs"]]


def test_every_ray_pod_has_a_memory_backed_dev_shm(cluster):
    for spec in _pod_specs(cluster):
        mounts = {m["mountPath"]: m["name"] for m in spec["containers"][0]["volumeMounts"]}
        assert "/dev/shm" in mounts, spec["containers"][0]["name"]
        vol = next(v for v in spec["volumes"] if v["name"] == mounts["/dev/shm"])
        assert vol["emptyDir"]["medium"] == "Memory" and vol["emptyDir"]["sizeLimit"]


def test_tensorrt_engine_cache_is_on_a_claim_that_outlives_pods(cluster, embedded):
    pvc = _load(REPO / "deploy" / "kuberay" / "trt-cache-pvc.yaml")
    assert pvc["kind"] == "PersistentVolumeClaim" and "ReadWriteMany" in pvc["spec"]["accessModes"]
    args = embedded["applications"][0]["args"]
    for g in _gpu_groups(cluster):
        spec = g["template"]["spec"]
        mounts = {m["name"]: m["mountPath"].rstrip("/") + "/" for m in spec["containers"][0]["volumeMounts"]}
        for stage in ("detector", "recognizer"):
            cache = args[stage]["predictor"]["tensorrt"]["cache_dir"]
            name = next((n for n, p in mounts.items() if cache.startswith(p)), None)
            assert name, f"{stage}'s engine cache {cache} is on no mounted volume"
            vol = next(v for v in spec["volumes"] if v["name"] == name)
            assert vol.get("persistentVolumeClaim", {}).get("claimName") == pvc["metadata"]["name"], vol


def test_runtime_class_is_optional_and_only_on_gpu_pods():
    from serve_app.tools.rayservice import PROFILE, TEMPLATE, render

    plain = yaml.safe_load(render(TEMPLATE.read_text(), PROFILE.read_text()))["spec"]["rayClusterConfig"]
    assert all("runtimeClassName" not in s for s in _pod_specs(plain))  # the committed manifest: none
    with_rc = yaml.safe_load(render(TEMPLATE.read_text(), PROFILE.read_text(), "nvidia"))["spec"]["rayClusterConfig"]
    assert [g["template"]["spec"].get("runtimeClassName") for g in _gpu_groups(with_rc)] == ["nvidia"]
    assert "runtimeClassName" not in with_rc["headGroupSpec"]["template"]["spec"]
    with pytest.raises(ValueError, match="not a Kubernetes object name"):
        render(TEMPLATE.read_text(), PROFILE.read_text(), "Nvidia Runtime")
