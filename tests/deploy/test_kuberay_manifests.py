"""deploy/kuberay/ against the CRD schemas of KubeRay v1.7.0 (tests/deploy/kuberay_crds/, SOURCE.md) and the
Kubernetes core schemas of `kubernetes-validate`.

How the CRD schema is applied, and why it is stricter than `kubectl apply` without server-side validation:
- **Unknown fields are refused.** The API server prunes a field a structural schema does not declare (silently,
  unless field validation is Strict); here every object node that declares `properties` and neither
  `additionalProperties` nor `x-kubernetes-preserve-unknown-fields` gets `additionalProperties: false`, so a typo
  fails. (Neither CRD has a preserve-unknown-fields node; the test says so if that changes.)
- **Map-valued fields** (`labels`, `rayStartParams`, `nodeSelector`, ...) take any key by schema; the keys that
  matter are checked by what reads them: rayStartParams keys are `ray start` options of the installed Ray, and
  Ray labels are valid label names with the architecture in `cluster.accelerator`'s form.
- **`metadata`** is `type: object` in the CRD (the API server applies ObjectMeta): it is checked against
  ObjectMeta from kubernetes-validate's schemas.
- **CEL rules** (`x-kubernetes-validations`) are not evaluated here: a manifest value under such a node fails the
  test rather than passing unchecked (our manifests set none).
- **The operator's own checks** (Go, in KubeRay v1.7.0 ray-operator/controllers/ray/utils/validation.go, run
  when it reconciles, after the API server accepted the object) that concern fields we set are repeated below.
"""

from __future__ import annotations

import copy
import gzip
import json
import re
import shlex
import subprocess
from functools import cache
from pathlib import Path
from typing import Any, Iterator

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kuberay"
CRDS = Path(__file__).parent / "kuberay_crds"
KUBERNETES_VERSION = "1.33"  # kubernetes-validate's schemas for core resources (the Secret, ObjectMeta)

MANIFESTS = {"rayjob.yaml": "rayjobs", "raycronjob.yaml": "raycronjobs"}


# ------------------------------------------------------------------------------------------------ the validator

@cache
def _crd_schema(plural: str) -> dict[str, Any]:
    crd = yaml.load(gzip.open(CRDS / f"ray.io_{plural}.yaml.gz"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    assert version["served"] and version["storage"]
    return version["schema"]["openAPIV3Schema"]


def _strict(node: Any) -> Any:
    """The CRD schema as the API server's strict field validation reads it (the module docstring)."""
    if isinstance(node, list):
        return [_strict(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _strict(v) for k, v in node.items()}
    assert not out.get("x-kubernetes-preserve-unknown-fields"), "a preserve-unknown-fields node: decide how to check it"
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    if out.pop("nullable", False) and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


def _cel_not_evaluated(validator, rules, instance, schema):
    yield jsonschema.ValidationError(f"a CEL rule applies here and is not evaluated by this test: {rules}")


def _list_type(validator, kind, instance, schema):
    """x-kubernetes-list-type: `set` items unique, `map` items unique by x-kubernetes-list-map-keys."""
    if not isinstance(instance, list):
        return
    if kind == "set":
        seen = [json.dumps(i, sort_keys=True) for i in instance]
    elif kind == "map":
        seen = [json.dumps([i.get(k) for k in schema["x-kubernetes-list-map-keys"]]) for i in instance]
    else:
        return
    if len(seen) != len(set(seen)):
        yield jsonschema.ValidationError(f"x-kubernetes-list-type {kind}: duplicate items {seen}")


CRDValidator = jsonschema.validators.extend(
    jsonschema.Draft4Validator,
    {"x-kubernetes-validations": _cel_not_evaluated, "x-kubernetes-list-type": _list_type})


@cache
def _object_meta_validator() -> jsonschema.protocols.Validator:
    """ObjectMeta as kubernetes-validate's strict schemas declare it, with their shared definitions."""
    import referencing
    from kubernetes_validate.utils import schema_contents

    folder = f"kubernetes-json-schema/v{KUBERNETES_VERSION}.0-local-strict"
    schema = schema_contents(f"{folder}/objectmeta-meta-v1.json", KUBERNETES_VERSION)
    definitions = referencing.Resource.from_contents(schema_contents(f"{folder}/_definitions.json", KUBERNETES_VERSION))
    registry = referencing.Registry().with_resources([("/api/_definitions.json", definitions)])
    return jsonschema.Draft202012Validator(schema, registry=registry)


def _errors(validator: jsonschema.protocols.Validator, doc: Any, prefix: str = "") -> list[str]:
    return [f"{prefix}{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
            for e in validator.iter_errors(doc)]


def crd_errors(doc: dict[str, Any], plural: str) -> list[str]:
    schema = _strict(_crd_schema(plural))  # a fresh copy: _strict builds new nodes
    schema["properties"]["metadata"] = {"type": "object"}  # ObjectMeta: checked below
    return sorted(_errors(CRDValidator(schema), doc)
                  + _errors(_object_meta_validator(), doc.get("metadata", {}), "metadata."))


def load(name: str) -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / name).read_text())


def cluster_spec(doc: dict[str, Any]) -> dict[str, Any]:
    spec = doc["spec"]
    return (spec["jobTemplate"] if doc["kind"] == "RayCronJob" else spec)["rayClusterSpec"]


def containers(spec: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    yield "head", spec["headGroupSpec"]["template"]["spec"]["containers"][0]
    for group in spec["workerGroupSpecs"]:
        for c in group["template"]["spec"]["containers"]:
            yield group["groupName"], c


# ------------------------------------------------------------------------------------------------------- the tests

@pytest.mark.parametrize("name", sorted(MANIFESTS))
def test_manifest_matches_the_kuberay_crd_schema(name):
    assert crd_errors(load(name), MANIFESTS[name]) == []


@pytest.mark.parametrize("path, value", [
    (("spec", "shutdownAfterJobFinish"), True),                        # a typo of shutdownAfterJobFinishes
    (("rayClusterSpec", "headGroupSpec", "template", "spec", "containers", 0, "envv"), []),
    (("rayClusterSpec", "workerGroupSpecs", 0, "rayLabels"), {"gpu-arch": "sm_90"}),
    (("metadata", "labelz"), {}),
])
def test_the_validator_refuses_an_unknown_field(path, value):
    """The check above is not vacuous: a field the schema does not know is an error at its path."""
    doc = load("rayjob.yaml")
    node = doc if path[0] in ("spec", "metadata") else doc["spec"]
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    errors = crd_errors(doc, "rayjobs")
    assert len(errors) == 1 and "Additional properties are not allowed" in errors[0] and repr(path[-1]) in errors[0]


def test_the_validator_refuses_a_wrong_type_and_a_cel_governed_field():
    doc = load("rayjob.yaml")
    doc["spec"]["ttlSecondsAfterFinished"] = "1h"
    doc["spec"]["managedBy"] = "ray.io/kuberay-operator"  # governed by CEL rules in the CRD
    errors = crd_errors(doc, "rayjobs")
    assert any(e.startswith("spec.ttlSecondsAfterFinished: '1h' is not of type 'integer'") for e in errors)
    assert any(e.startswith("spec.managedBy: a CEL rule applies here") for e in errors)


@pytest.mark.parametrize("name", sorted(MANIFESTS))
def test_what_the_kuberay_operator_checks_on_reconcile(name):
    """validation.go (KubeRay v1.7.0): ValidateRayJobMetadata / ValidateRayCronJobSpec name lengths (47 / 36:
    MaxRayJobNameLength, MaxRayCronJobNameLength in utils/constant.go) and DNS-1035 names; validateRayGroupLabels
    (labels never in rayStartParams; qualified key, valid value); validateRayGroupResources (num-cpus etc. not in
    both rayStartParams and `resources`); ValidateRayClusterSpec (minReplicas and maxReplicas set without
    autoscaling, min <= max); ValidateRayCronJobSpec (no TZ in schedule, non-empty timeZone)."""
    doc = load(name)
    limit = 36 if doc["kind"] == "RayCronJob" else 47
    assert len(doc["metadata"]["name"]) <= limit and re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", doc["metadata"]["name"])
    spec = cluster_spec(doc)
    assert not spec.get("enableInTreeAutoscaling")
    groups = [("head", spec["headGroupSpec"])] + [(g["groupName"], g) for g in spec["workerGroupSpecs"]]
    for group_name, group in groups:
        assert "labels" not in group.get("rayStartParams", {}), group_name
        for key, value in group.get("labels", {}).items():
            assert re.fullmatch(r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?", key)
            assert re.fullmatch(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?", value)
        if group.get("resources"):
            assert not {"num-cpus", "num-gpus", "memory", "resources"} & set(group.get("rayStartParams", {}))
        if group_name != "head":
            assert 0 <= group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
    if doc["kind"] == "RayCronJob":
        assert "TZ" not in doc["spec"]["schedule"] and doc["spec"]["timeZone"]


@pytest.mark.parametrize("name", sorted(MANIFESTS))
def test_ray_start_params_are_options_of_the_installed_ray(name):
    """KubeRay turns each rayStartParams key into `ray start --key=value`: a key ray start lacks fails the pod."""
    from ray.scripts.scripts import start

    options = {o.lstrip("-") for p in start.params for o in p.opts}
    spec = cluster_spec(load(name))
    for group in [spec["headGroupSpec"], *spec["workerGroupSpecs"]]:
        assert set(group["rayStartParams"]) <= options


@pytest.mark.parametrize("name", sorted(MANIFESTS))
def test_gpu_groups_carry_the_labels_placement_reads(name):
    """One worker group per architecture, its Ray label under `cluster.accelerator_label` in `cluster.accelerator`'s
    form, on Kubernetes nodes whose GPU Feature Discovery compute capability is that architecture."""
    from orchestrator.config.settings import ClusterSettings

    key = ClusterSettings().accelerator_label
    spec = cluster_spec(load(name))
    archs = {}
    for group in spec["workerGroupSpecs"]:
        arch = group["labels"][key]
        assert re.fullmatch(r"sm_\d+[a-z]?", arch)
        selector = group["template"]["spec"]["nodeSelector"]
        assert f"sm_{selector['nvidia.com/gpu.compute.major']}{selector['nvidia.com/gpu.compute.minor']}" == arch
        gpus = group["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
        assert int(gpus) > 0
        archs[group["groupName"]] = arch
    assert sorted(archs.values()) == ["sm_120", "sm_90"]
    assert key not in spec["headGroupSpec"].get("labels", {}) and spec["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"


@pytest.mark.parametrize("name", sorted(MANIFESTS))
def test_mlflow_settings_come_from_the_secret_and_reach_the_head_only(name):
    spec = cluster_spec(load(name))
    secret = load("mlflow-secret.example.yaml")
    for group, container in containers(spec):
        env = {e["name"]: e for e in container.get("env", [])}
        mlflow = {k: v for k, v in env.items() if k.startswith("MLFLOW_")}
        if group != "head":
            assert mlflow == {}, group  # workers never talk to MLflow: the driver records
            continue
        assert set(mlflow) == set(secret["stringData"])
        for var, entry in mlflow.items():
            assert "value" not in entry
            ref = entry["valueFrom"]["secretKeyRef"]
            assert ref["name"] == secret["metadata"]["name"] and ref["key"] == var
            assert ref.get("optional", False) == (var != "MLFLOW_TRACKING_URI")


def test_the_secret_is_a_valid_core_resource():
    import kubernetes_validate

    kubernetes_validate.validate(load("mlflow-secret.example.yaml"), KUBERNETES_VERSION, strict=True)
    with pytest.raises(kubernetes_validate.ValidationError):
        bad = load("mlflow-secret.example.yaml")
        bad["stringDate"] = bad.pop("stringData")
        kubernetes_validate.validate(bad, KUBERNETES_VERSION, strict=True)


def test_the_cronjob_is_the_nightly_schedule_on_the_rayjob_cluster():
    """Same cron, time zone and overrides as orchestrator/schedules/nightly.yaml, tagged with its name, and the
    cluster of rayjob.yaml (but for that tag)."""
    from orchestrator.schedules.definition import load_schedules

    (nightly,) = [s for s in load_schedules(grid=False) if s.name == "nightly-longctx"]
    cron = load("raycronjob.yaml")
    assert cron["spec"]["schedule"] == nightly.cron and cron["spec"]["timeZone"] == nightly.timezone
    argv = shlex.split(cron["spec"]["jobTemplate"]["entrypoint"])
    assert argv[0] == "specsweep" and set(nightly.overrides) <= set(argv[1:])
    spec = copy.deepcopy(cluster_spec(cron))
    head_env = spec["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]
    (tag,) = [e for e in head_env if e["name"] == "SPECSWEEP_SCHEDULE"]
    assert tag["value"] == nightly.name
    head_env.remove(tag)
    assert spec == cluster_spec(load("rayjob.yaml"))
    job = load("rayjob.yaml")["spec"]
    assert {k: v for k, v in cron["spec"]["jobTemplate"].items() if k not in ("entrypoint", "rayClusterSpec")} == \
        {k: v for k, v in job.items() if k not in ("entrypoint", "rayClusterSpec")}


def _shell_words(line: str, shell: str) -> list[str]:
    """The words `shell` makes of a command line it is handed (printed NUL-separated by the real shell)."""
    out = subprocess.run([shell, "-c", f"printf '%s\\0' {line}"], capture_output=True, check=True, env={}).stdout
    return out.decode().split("\0")[:-1]


@pytest.mark.parametrize("name", sorted(MANIFESTS))
def test_entrypoint_reaches_the_driver_unexpanded_and_composes(name, tmp_path):
    """The entrypoint goes through two shells: the submitter's (KubeRay pastes it after `ray job submit --`;
    common/job.go BuildJobSubmitCommand) and the job supervisor's (shell=True, ray
    dashboard/modules/job/job_supervisor.py:182-184), with `ray job submit` re-quoting its words in between
    (shlex.join, dashboard/modules/job/cli.py:312-317). The MLflow URI must arrive as OmegaConf's interpolation,
    read from the driver's environment: composed by the real command, it resolves to the Secret's value."""
    doc = load(name)
    entrypoint = (doc["spec"]["jobTemplate"] if doc["kind"] == "RayCronJob" else doc["spec"])["entrypoint"]
    job_line = shlex.join(_shell_words(entrypoint, "bash"))
    argv = _shell_words(job_line, "sh")
    assert "tracking.uri=${oc.env:MLFLOW_TRACKING_URI}" in argv
    uri = f"sqlite:///{tmp_path}/from-the-secret.db"
    out = subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-c",
                          "import sys; from hydra import compose, initialize_config_module; "
                          "from orchestrator.config.schema import register_configs; register_configs(); "
                          "initialize_config_module('conf', version_base=None); "
                          "cfg = compose('config', overrides=[a for a in sys.argv[1:] if not a.startswith('+sweep')]); "
                          "print(cfg.tracking.uri)", *argv[1:]],
                         capture_output=True, text=True, cwd=ROOT, env={"MLFLOW_TRACKING_URI": uri, "PATH": "/usr/bin"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == uri


def test_an_unset_mlflow_variable_is_refused_before_anything_starts(tmp_path):
    """A RayJob whose Secret lacks the URI: the driver exits 1 naming the key and the variable, no traceback, and
    leaves no sweep record (Hydra's multirun.yaml) behind."""
    argv = shlex.split(load("rayjob.yaml")["spec"]["entrypoint"])
    out = subprocess.run([str(ROOT / ".venv" / "bin" / "specsweep"), *argv[1:], "hydra.launcher.dry_run=true"],
                         capture_output=True, text=True, cwd=tmp_path, env={"PATH": "/usr/bin:/bin"})
    assert out.returncode == 1
    assert "tracking.uri: " in out.stderr and "'MLFLOW_TRACKING_URI' not found" in out.stderr
    assert "Traceback" not in out.stderr
    assert list(tmp_path.iterdir()) == []
