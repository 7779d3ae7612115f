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
     ("readinessProbe", "readinesProbe")),
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
    probe["readinessProbe"]["httpGet"]["port"] = "serve"  # a named port
    assert errors(validator, ok) == []
    probe["readinessProbe"]["httpGet"]["port"] = 8000.5
    assert errors(validator, ok)


# --- GCS fault tolerance and the job book on Redis ---------------------------------------------


def _redis_objects() -> dict[str, dict]:
    return {d["kind"]: d for d in _load_all(KUBERAY / "redis.yaml")}


def _containers(manifest: dict) -> list[dict]:
    cluster = manifest["spec"]["rayClusterConfig"]
    return [g["template"]["spec"]["containers"][0] for g in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]]


def test_gcs_fault_tolerance_uses_the_redis_with_a_password_from_a_secret(manifest):
    ft = manifest["spec"]["rayClusterConfig"]["gcsFaultToleranceOptions"]
    service = _redis_objects()["Service"]
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


def test_the_redis_keeps_what_the_job_book_requires():
    """The JobStore refuses a Redis without appendonly yes / appendfsync
    always (jobs.redis_fsync); the password comes from the same Secret."""
    objs = _redis_objects()
    assert set(objs) == {"Service", "StatefulSet"}
    sts = objs["StatefulSet"]
    assert sts["spec"]["replicas"] == 1 and sts["spec"]["serviceName"] == objs["Service"]["metadata"]["name"]
    (c,) = sts["spec"]["template"]["spec"]["containers"]
    command = " ".join(c["command"] + c["args"])
    for flag in ("--appendonly yes", "--appendfsync always", '--requirepass "$REDIS_PASSWORD"', "--dir /data"):
        assert flag in command, flag
    env = {e["name"]: e for e in c["env"]}
    assert env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "ocr-redis", "key": "password"}
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]  # one writer: no ReadWriteMany class needed
    assert {"name": claim["metadata"]["name"], "mountPath": "/data"} in c["volumeMounts"]
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert sts["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert objs["Service"]["spec"]["selector"].items() <= labels.items()


def test_the_generator_moves_only_the_job_book():
    from serve_app.tools.rayservice import PROFILE, on_redis, redis_overlay

    profile = yaml.safe_load(PROFILE.read_text())
    moved = yaml.safe_load(on_redis(PROFILE.read_text()))
    assert moved == redis_overlay(profile)
    for a, b in zip(profile["applications"], moved["applications"]):
        assert {k: v for k, v in a["args"].items() if k != "jobs"} == {k: v for k, v in b["args"].items() if k != "jobs"}
    with pytest.raises(ValueError, match="adapt on_redis"):
        on_redis(PROFILE.read_text().replace("        journal:", "        journal_path:"))
