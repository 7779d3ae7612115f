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


def _quantity(q) -> float:
    """A Kubernetes memory quantity in bytes."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?", str(q))
    assert m, q
    units = {None: 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
    return float(m.group(1)) * units[m.group(2)]


def kuberay_probe(container: dict) -> dict:
    """The readiness probe the pod runs: the container's own, else the one
    KubeRay v1.6.2 injects for a RayService worker (common/pod.go,
    initLivenessAndReadinessProbe): the raylet's health through the
    dashboard agent, and the Serve proxy's /-/healthz on the port named
    "serve", which the proxy answers itself."""
    if container.get("readinessProbe"):
        return container["readinessProbe"]
    port = next((p["containerPort"] for p in container.get("ports", []) if p.get("name") == "serve"), 8000)
    return {"exec": {"command": ["bash", "-c", "wget -T 2 -q -O- http://localhost:52365/api/local_raylet_healthz"
                                 f" && wget -T 2 -q -O- http://localhost:{port}/-/healthz"]}, "injected": True}


def test_worker_readiness_cannot_queue_behind_work(cluster):
    """#39 item 3 / issue item 6: a worker's readiness is the raylet and its
    Serve proxy (KubeRay's injected probe), not /readyz, whose in-band
    ready() calls wait behind OCR batches and empty the Service under load."""
    for g in _gpu_groups(cluster):
        c = g["template"]["spec"]["containers"][0]
        probe = kuberay_probe(c)
        assert probe.get("injected"), f"{g['groupName']}: an own readinessProbe replaces KubeRay's: {probe}"
        assert "/-/healthz" in " ".join(probe["exec"]["command"])
        assert {p["name"]: p["containerPort"] for p in c["ports"]}["serve"] == 8000


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


def _stage_bases() -> list[str]:
    """The base image of every stage, in order (the last is the image's)."""
    args: dict[str, str] = {}
    bases = []
    for word, rest in _dockerfile_instructions():
        if word == "ARG" and "=" in rest:
            name, _, default = rest.partition("=")
            args[name.strip()] = default.strip().strip('"')
        if word == "FROM":
            image = rest.split()[0]
            bases.append(re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), image))
    assert bases, "no FROM in the Dockerfile"
    return bases


def _base_image() -> str:
    return _stage_bases()[-1]


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
    args = _dockerfile_args()
    assert PADDLE_CUDA[args["CUDA"]] == cuda, (args["CUDA"], image)
    assert args["PADDLE_GPU_VERSION"] == "3.3.1"
    # The converter stage (`models`, CPU only) on the same Ubuntu: its conversions are made by the Python the
    # image's is (its build step checks 3.11 or 3.12 too).
    for base in _stage_bases()[:-1]:
        assert re.fullmatch(rf"ubuntu:{re.escape(ubuntu)}", base), (base, image)
    # (What the build steps check, the Python version included, is run by
    # tests/integration/test_docker_build_steps.py.)


def test_dockerfile_runs_as_a_non_root_user_with_the_ports_exposed():
    ins = _dockerfile_instructions()
    users = [rest for word, rest in ins if word == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    workdirs = [rest for word, rest in ins if word == "WORKDIR"]
    assert workdirs and workdirs[-1] == "/app"
    exposed = {p.split("/")[0] for word, rest in ins if word == "EXPOSE" for p in rest.split()}
    assert {"8000", "8265", "8080"} <= exposed


def test_dockerfile_copies_paths_that_exist():
    """Each COPY source exists and the build context's allow-list
    (.dockerignore: `*`, then `!path`) lets it in."""
    allowed = [line[1:].rstrip("/") for line in (REPO / ".dockerignore").read_text().splitlines()
               if line.startswith("!")]
    for word, rest in _dockerfile_instructions():
        if word == "COPY" and "--from" not in rest:
            *sources, _dest = [a for a in shlex.split(rest) if not a.startswith("--")]
            for s in sources:
                assert (REPO / s).exists(), f"COPY {s}: no such path in the repository"
                assert any(s.rstrip("/") == a or s.startswith(a + "/") for a in allowed), (
                    f"COPY {s}: not in .dockerignore's allow-list (add !{s})")


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


def dev_shm_bytes(spec: dict) -> float:
    """/dev/shm of the pod's Ray container as KubeRay v1.6.2 makes it: the
    container's own mount (its emptyDir's sizeLimit), else the memory-backed
    one KubeRay adds, sized to the container's memory limit (common/pod.go,
    addEmptyDir / findMemoryReqOrLimit)."""
    c = spec["containers"][0]
    mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
    if "/dev/shm" not in mounts:
        return _quantity(_limits(c)["memory"])
    vol = next(v for v in spec.get("volumes", []) if v["name"] == mounts["/dev/shm"])
    return _quantity(vol["emptyDir"].get("sizeLimit") or _limits(c)["memory"])


def test_dev_shm_holds_rays_object_store(cluster):
    """#39 item 3 / issue item 4: Ray puts its object store (30% of the
    memory by default) in /dev/shm and falls back to /tmp on disk when that
    is smaller; every Ray pod's /dev/shm holds it."""
    for spec in _pod_specs(cluster):
        memory = _quantity(_limits(spec["containers"][0])["memory"])
        assert dev_shm_bytes(spec) >= 0.3 * memory, spec["containers"][0]["name"]


def test_tensorrt_engine_cache_is_an_emptydir_by_default(cluster, embedded):
    """#39 item 3 / issue item 3: the workers schedule on any cluster: no
    claim, no ReadWriteMany class needed."""
    args = embedded["applications"][0]["args"]
    for g in _gpu_groups(cluster):
        spec = g["template"]["spec"]
        assert all("persistentVolumeClaim" not in v for v in spec["volumes"]), spec["volumes"]
        mounts = {m["name"]: m["mountPath"].rstrip("/") + "/" for m in spec["containers"][0]["volumeMounts"]}
        for stage in ("detector", "recognizer"):
            cache = args[stage]["predictor"]["tensorrt"]["cache_dir"]
            name = next(n for n, p in mounts.items() if cache.startswith(p))
            vol = next(v for v in spec["volumes"] if v["name"] == name)
            assert "emptyDir" in vol and _quantity(vol["emptyDir"]["sizeLimit"]) >= 4 * 2**30


def _claim_variant() -> dict:
    from serve_app.tools.rayservice import PROFILE, TEMPLATE, render

    return yaml.safe_load(render(TEMPLATE.read_text(), PROFILE.read_text(), trt_cache_claim="ocr-trt-cache"))


def test_the_claim_variant_mounts_the_claim_and_hands_it_to_the_apps_user(tmp_path):
    """--trt-cache-claim: the cache on the claim of trt-cache-pvc.yaml, and
    an init container whose script, run here on a root-owned folder (mode
    0755, as an export may come), leaves it writable by uid 1000."""
    import os
    import subprocess

    pvc = _load(REPO / "deploy" / "kuberay" / "trt-cache-pvc.yaml")
    cluster = _claim_variant()["spec"]["rayClusterConfig"]
    (g,) = _gpu_groups(cluster)
    spec = g["template"]["spec"]
    vol = next(v for v in spec["volumes"] if v["name"] == "trt-cache")
    assert vol["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    assert spec["securityContext"]["fsGroup"] == spec["securityContext"]["runAsUser"] == 1000
    (init,) = spec["initContainers"]
    assert init["securityContext"]["runAsUser"] == 0 and init["volumeMounts"][0]["name"] == "trt-cache"
    import shutil
    import tempfile

    top = Path(tempfile.mkdtemp(dir="/tmp"))  # (pytest's tmp_path is not reachable by uid 1000)
    try:
        top.chmod(0o755)
        folder = top / "export"
        folder.mkdir(mode=0o755)
        os.chown(folder, 0, 0)
        before = subprocess.run(["setpriv", "--reuid=1000", "--regid=1000", "--clear-groups", "touch",
                                 str(folder / "engine")], capture_output=True, text=True, timeout=30)
        assert before.returncode != 0  # what the replicas would meet without the init container
        cmd = [a.replace("/tmp/ocr_trt_cache", str(folder)) for a in init["command"]]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stdout + out.stderr
        after = subprocess.run(["setpriv", "--reuid=1000", "--regid=1000", "--clear-groups", "touch",
                                str(folder / "engine")], capture_output=True, text=True, timeout=30)
        assert after.returncode == 0, after.stderr
    finally:
        shutil.rmtree(top)


def test_the_claim_init_stops_the_pod_when_the_folder_stays_unwritable(tmp_path):
    """Where chown cannot help (a path that is not a folder stands in for an
    export squashing root), the pod stops with the fix instead of the
    replicas failing on their first engine."""
    import subprocess

    (init,) = _gpu_groups(_claim_variant()["spec"]["rayClusterConfig"])[0]["template"]["spec"]["initContainers"]
    blocker = tmp_path / "file"
    blocker.write_text("")
    cmd = [a.replace("/tmp/ocr_trt_cache", str(blocker / "sub")) for a in init["command"]]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    assert out.returncode == 1 and "not writable by uid 1000" in out.stdout and "emptyDir" in out.stdout


def test_install_script_keeps_everything_in_one_namespace(tmp_path):
    """#39 item 3 / issue item 9: deploy/kuberay/install.sh against a
    stand-in kubectl (records its calls, finds nothing, accepts all): every
    call names the namespace given, the Secrets the manifests read are
    created before anything that reads them is applied, and the RayService
    goes in with the image given instead of the placeholder."""
    import os
    import subprocess

    log, applied = tmp_path / "calls", tmp_path / "applied"
    applied.mkdir()
    kubectl = tmp_path / "bin" / "kubectl"
    kubectl.parent.mkdir()
    kubectl.write_text(f"""#!/bin/bash
echo "$*" >> {log}
case " $* " in *" get "*) exit 1;; esac
if [ "${{@: -1}}" = "-" ]; then cat > {applied}/stdin.yaml; fi
exit 0
""")
    kubectl.chmod(0o755)
    env = {**os.environ, "PATH": f"{kubectl.parent}:{os.environ['PATH']}"}
    script = REPO / "deploy" / "kuberay" / "install.sh"
    out = subprocess.run(["bash", str(script), "ocr-test", "registry.example/ocr:1"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    calls = log.read_text().splitlines()
    assert calls[0:2] == ["get namespace ocr-test", "create namespace ocr-test"]
    assert all(c.startswith("--namespace ocr-test ") for c in calls[2:]), calls
    created = [c.split()[5] for c in calls if " create secret generic " in c]
    first_apply = next(i for i, c in enumerate(calls) if " apply " in c)
    assert all(i < first_apply for i, c in enumerate(calls) if " create secret " in c)
    rayservice = yaml.safe_load((applied / "stdin.yaml").read_text())
    read = {ref["secretKeyRef"]["name"] for c in _ray_containers(rayservice["spec"]["rayClusterConfig"])
            for e in c.get("env", []) for ref in [e.get("valueFrom") or {}] if "secretKeyRef" in ref}
    read |= {rayservice["spec"]["rayClusterConfig"]["gcsFaultToleranceOptions"]["redisPassword"]["valueFrom"]
             ["secretKeyRef"]["name"]}
    assert read <= set(created), (read, created)
    assert {c["image"] for c in _ray_containers(rayservice["spec"]["rayClusterConfig"])} == {"registry.example/ocr:1"}
    assert "namespace" not in rayservice["metadata"]  # the manifests name none: the script's is the one
    no_image = subprocess.run(["bash", str(script), "ocr-test"], env=env, capture_output=True, text=True, timeout=60)
    assert no_image.returncode != 0 and "IMAGE" in no_image.stderr


def test_runtime_class_is_optional_and_only_on_gpu_pods():
    from serve_app.tools.rayservice import PROFILE, TEMPLATE, render

    plain = yaml.safe_load(render(TEMPLATE.read_text(), PROFILE.read_text()))["spec"]["rayClusterConfig"]
    assert all("runtimeClassName" not in s for s in _pod_specs(plain))  # the committed manifest: none
    with_rc = yaml.safe_load(render(TEMPLATE.read_text(), PROFILE.read_text(), "nvidia"))["spec"]["rayClusterConfig"]
    assert [g["template"]["spec"].get("runtimeClassName") for g in _gpu_groups(with_rc)] == ["nvidia"]
    assert "runtimeClassName" not in with_rc["headGroupSpec"]["template"]["spec"]
    with pytest.raises(ValueError, match="not a Kubernetes object name"):
        render(TEMPLATE.read_text(), PROFILE.read_text(), "Nvidia Runtime")
