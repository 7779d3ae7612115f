"""Every RayService manifest in deploy/ against the RayService CRD KubeRay
publishes (pinned in deploy/kuberay/crd/, with its release and sha256),
validated with jsonschema as the API server would: types, enums, required
fields, int-or-string, int32/int64 ranges, and unknown fields refused where
the schema lists an object's properties (what `kubectl apply`'s default
strict field validation does; this CRD has no x-kubernetes-preserve-unknown-fields).
Not checked: the CRD's CEL rules (x-kubernetes-validations), which only an
API server evaluates. Also the Redis the manifest relies on
(deploy/kuberay/redis.yaml) and the job book on it. No cluster, no Ray."""

from __future__ import annotations

import copy
import hashlib
import re
from pathlib import Path

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
KUBERAY = REPO / "deploy" / "kuberay"
CRD = KUBERAY / "crd" / "ray.io_rayservices.yaml"
Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the CRD is 1 MB


def _load_all(path: Path) -> list:
    return [d for d in yaml.load_all(path.read_text(), Loader=Loader) if d is not None]


def strict(node):
    """The CRD's structural schema as a JSON Schema that refuses unknown
    fields: an object with `properties` and no `additionalProperties` (and
    no x-kubernetes-preserve-unknown-fields) gets additionalProperties:
    false; int-or-string becomes integer-or-string; nullable allows null."""
    if isinstance(node, list):
        return [strict(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: strict(v) if k in ("items", "additionalProperties", "not") else v for k, v in node.items()}
    for key in ("anyOf", "allOf", "oneOf"):
        if key in node:
            out[key] = [strict(n) for n in node[key]]
    if "properties" in node:
        out["properties"] = {k: strict(v) for k, v in node["properties"].items()}
        if "additionalProperties" not in node and not node.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


FORMATS = jsonschema.FormatChecker()


@FORMATS.checks("int32")
def _int32(value) -> bool:
    return not isinstance(value, int) or -2**31 <= value < 2**31


@FORMATS.checks("int64")
def _int64(value) -> bool:
    return not isinstance(value, int) or -2**63 <= value < 2**63


@pytest.fixture(scope="module")
def crd() -> dict:
    (doc,) = _load_all(CRD)
    return doc


@pytest.fixture(scope="module")
def validator(crd):
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = strict(version["schema"]["openAPIV3Schema"])
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema, format_checker=FORMATS)


def rayservice_manifests() -> dict[str, dict]:
    """Every RayService in deploy/ (the template excepted: it is not YAML
    until rendered), and the generator's other output, --runtime-class."""
    from serve_app.tools.rayservice import PROFILE, TEMPLATE, render

    found = {}
    for path in sorted((REPO / "deploy").rglob("*.yaml")):
        if path == TEMPLATE or CRD.parent in path.parents:
            continue
        for i, doc in enumerate(_load_all(path)):
            if isinstance(doc, dict) and doc.get("kind") == "RayService":
                found[f"{path.relative_to(REPO)}#{i}"] = doc
    found["rayservice --runtime-class nvidia"] = yaml.safe_load(
        render(TEMPLATE.read_text(), PROFILE.read_text(), "nvidia"))
    found["rayservice --trt-cache-claim ocr-trt-cache"] = yaml.safe_load(
        render(TEMPLATE.read_text(), PROFILE.read_text(), trt_cache_claim="ocr-trt-cache"))
    return found


def errors(validator, manifest: dict) -> list[str]:
    return sorted(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(manifest))


def test_the_pinned_crd_is_the_released_file(crd):
    readme = (CRD.parent / "README.md").read_text()
    digest = hashlib.sha256(CRD.read_bytes()).hexdigest()
    assert f"sha256: `{digest}`" in readme, "the CRD changed: record its release and sha256 in crd/README.md"
    assert re.search(r"tag `v\d+\.\d+\.\d+`, commit `[0-9a-f]{40}`", readme)
    assert crd["kind"] == "CustomResourceDefinition" and crd["spec"]["names"]["kind"] == "RayService"
    assert crd["spec"]["group"] == "ray.io"


def test_every_rayservice_in_deploy_is_valid_against_the_crd(validator):
    manifests = rayservice_manifests()
    assert "deploy/kuberay/rayservice.yaml#0" in manifests
    for name, manifest in manifests.items():
        assert manifest["apiVersion"] == "ray.io/v1", name
        assert errors(validator, manifest) == [], name
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", manifest["metadata"]["name"]), name


@pytest.fixture(scope="module")
def manifest() -> dict:
    return _load_all(KUBERAY / "rayservice.yaml")[0]


@pytest.mark.parametrize("path, typo", [
    (("spec", "rayClusterConfig"), ("gcsFaultToleranceOptions", "gcsFaultToleranceOption")),
    (("spec",), ("excludeHeadPodFromServeSvc", "excludeHeadPodFromServeService")),
    (("spec", "rayClusterConfig", "headGroupSpec"), ("rayStartParams", "rayStartParam")),
    (("spec", "rayClusterConfig", "workerGroupSpecs", 0), ("maxReplicas", "maxReplica")),
    (("spec", "rayClusterConfig", "workerGroupSpecs", 0, "template", "spec", "containers", 0),
     ("volumeMounts", "volumeMount")),
])
def test_a_misspelled_field_is_refused(validator, manifest, path, typo):
    bad = copy.deepcopy(manifest)
    node = bad
    for key in path:
        node = node[key]
    right, wrong = typo
    node[wrong] = node.pop(right)
    found = errors(validator, bad)
    assert any(repr(wrong) in e and "not allowed" in e for e in found), found


@pytest.mark.parametrize("edit, where", [
    (lambda m: m["spec"]["rayClusterConfig"]["workerGroupSpecs"][0].update(maxReplicas="3"), "maxReplicas"),
    (lambda m: m["spec"]["rayClusterConfig"]["authOptions"].update(mode="tokens"), "mode"),
    (lambda m: m["spec"]["rayClusterConfig"]["workerGroupSpecs"][0].update(replicas=2**31), "replicas"),
    (lambda m: m["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0].pop("name"),
     "containers/0"),
    (lambda m: m["spec"]["rayClusterConfig"]["gcsFaultToleranceOptions"].update(redisPassword="plain"),
     "redisPassword"),
])
def test_a_wrong_value_is_refused(validator, manifest, edit, where):
    bad = copy.deepcopy(manifest)
    edit(bad)
    found = errors(validator, bad)
    assert any(where in e for e in found), found


def test_int_or_string_takes_both(validator, manifest):
    ok = copy.deepcopy(manifest)
    probe = ok["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    probe["readinessProbe"] = {"httpGet": {"path": "/-/healthz", "port": "serve"}}  # a named port
    assert errors(validator, ok) == []
    probe["readinessProbe"]["httpGet"]["port"] = 8000.5
    assert errors(validator, ok)


# --- GCS fault tolerance and the job book on Redis ---------------------------------------------


def _redis_objects() -> dict[tuple[str, str], dict]:
    return {(d["kind"], d["metadata"]["name"]): d for d in _load_all(KUBERAY / "redis.yaml")}


def _containers(manifest: dict) -> list[dict]:
    cluster = manifest["spec"]["rayClusterConfig"]
    return [g["template"]["spec"]["containers"][0] for g in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]]


def test_gcs_fault_tolerance_uses_the_redis_with_a_password_from_a_secret(manifest):
    ft = manifest["spec"]["rayClusterConfig"]["gcsFaultToleranceOptions"]
    service = _redis_objects()[("Service", "ocr-gcs-redis")]
    host, _, port = ft["redisAddress"].partition(":")
    assert host == service["metadata"]["name"]
    assert int(port) in [p["port"] for p in service["spec"]["ports"]]
    assert ft["redisPassword"] == {"valueFrom": {"secretKeyRef": {"name": "ocr-redis", "key": "password"}}}
    # KubeRay refuses a password given twice (gcsFaultToleranceOptions and rayStartParams).
    assert "redis-password" not in manifest["spec"]["rayClusterConfig"]["headGroupSpec"]["rayStartParams"]


def test_the_job_book_is_on_redis_with_its_url_from_a_secret(manifest):
    embedded = yaml.safe_load(manifest["spec"]["serveConfigV2"])
    (app,) = embedded["applications"]
    jobs = app["args"]["jobs"]
    assert jobs["backend"] == "redis" and "journal" not in jobs
    env_name = jobs.get("redis_url_env", "OCR_REDIS_URL")
    stores = [d for d in app["deployments"] if d["name"] == "JobStore"]
    assert stores and stores[0]["num_replicas"] >= 2  # either replica runs any job (leases)
    for c in _containers(manifest):
        env = {e["name"]: e for e in c.get("env", [])}
        assert env[env_name] == {"name": env_name, "valueFrom": {"secretKeyRef": {"name": "ocr-redis", "key": "url"}}}
        mounts = [m["mountPath"] for m in c.get("volumeMounts", [])]
        assert "/tmp/ocr-serve" not in mounts, "no journal volume is needed with the Redis book"


def _server_args(sts: dict) -> list[str]:
    """The redis-server arguments of a StatefulSet's `sh -c "exec redis-server ..."`."""
    import shlex

    (c,) = sts["spec"]["template"]["spec"]["containers"]
    assert c["command"] == ["sh", "-c"]
    words = shlex.split(" ".join(c["args"]))
    assert words[:2] == ["exec", "redis-server"]
    return words[2:]


def _memory(q: str) -> int:
    n, unit = re.fullmatch(r"(\d+)(Mi|Gi)", q).groups()
    return int(n) * {"Mi": 2**20, "Gi": 2**30}[unit]


@pytest.mark.parametrize("name, fsync", [("ocr-redis", "always"), ("ocr-gcs-redis", "everysec")])
def test_each_redis_runs_with_its_manifests_arguments(name, fsync, tmp_path):
    """#39 item 3 / issue item 7: each StatefulSet's own arguments, given to
    a real redis-server here (its port, folder and password swapped for
    local ones): maxmemory with noeviction, the AOF policy, and a container
    limit 1.5x maxmemory (the AOF rewrite forks)."""
    import subprocess

    from harness.redis_server import free_port

    objs = _redis_objects()
    sts = objs[("StatefulSet", name)]
    assert objs[("Service", name)]["spec"]["selector"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()
    args = _server_args(sts)
    port = free_port()
    swap = {"--port": str(port), "--dir": str(tmp_path), "--requirepass": "pw"}
    local = [swap.get(args[i - 1], a) if i else a for i, a in enumerate(args)]
    proc = subprocess.Popen(["redis-server", *local, "--bind", "127.0.0.1"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        import redis

        r = redis.Redis(port=port, password="pw", decode_responses=True)
        for _ in range(200):
            try:
                r.ping()
                break
            except redis.ConnectionError:
                assert proc.poll() is None, proc.stderr.read().decode()
                import time

                time.sleep(0.05)
        got = {k: v for pattern in ("maxmemory*", "append*") for k, v in r.config_get(pattern).items()}
        r.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert got["maxmemory-policy"] == "noeviction" and got["appendonly"] == "yes" and got["appendfsync"] == fsync
    (c,) = sts["spec"]["template"]["spec"]["containers"]
    assert _memory(c["resources"]["limits"]["memory"]) >= 1.5 * int(got["maxmemory"])
    assert c["resources"]["requests"]["memory"] == c["resources"]["limits"]["memory"]  # not evicted first
    env = {e["name"]: e for e in c["env"]}
    assert env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "ocr-redis", "key": "password"}
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]  # one writer: no ReadWriteMany class needed
    if name == "ocr-redis":
        # The book's bounds in the RayService's profile, and a quarter on top, fit under maxmemory.
        from serve_app.app import AppArgs

        manifest = _load_all(KUBERAY / "rayservice.yaml")[0]
        (app,) = yaml.safe_load(manifest["spec"]["serveConfigV2"])["applications"]
        jobs = AppArgs.model_validate(app["args"]).jobs
        book = jobs.max_queued_bytes + jobs.max_finished_bytes + jobs.capacity * 4096
        assert 1.25 * book <= int(got["maxmemory"]), (book, got["maxmemory"])


def test_the_gcs_and_the_job_book_are_on_different_servers(manifest):
    """A full book (noeviction refuses writes) never stops the GCS."""
    gcs_host = manifest["spec"]["rayClusterConfig"]["gcsFaultToleranceOptions"]["redisAddress"].partition(":")[0]
    url = "redis://:P@ocr-redis:6379/1"  # the Secret's url, as install.sh writes it
    assert gcs_host != url.split("@")[1].partition(":")[0]
    assert {("StatefulSet", gcs_host), ("StatefulSet", "ocr-redis")} <= set(_redis_objects())


def test_the_generator_moves_only_the_job_book():
    from serve_app.tools.rayservice import PROFILE, on_redis, redis_overlay

    profile = yaml.safe_load(PROFILE.read_text())
    moved = yaml.safe_load(on_redis(PROFILE.read_text()))
    assert moved == redis_overlay(profile)
    for a, b in zip(profile["applications"], moved["applications"]):
        assert {k: v for k, v in a["args"].items() if k != "jobs"} == {k: v for k, v in b["args"].items() if k != "jobs"}
    with pytest.raises(ValueError, match="adapt on_redis"):
        on_redis(PROFILE.read_text().replace("        journal:", "        journal_path:"))
