"""docs/launch.md's Kubernetes recipe, checked where it can be here (no cluster): the pod
template against Kubernetes' own OpenAPI schema (kubernetes-validate, strict: no unknown
field), and the PyTorchJob's elastic policy against the titan run command it carries. The
PyTorchJob wrapper itself is a Kubeflow CRD whose schema no installable package ships: not
schema-validated, and the recipe has not run on a cluster (docs/launch.md says so)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")
kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is not installed (the dev extra has it)")

ROOT = Path(__file__).resolve().parents[2]


def _manifest() -> dict:
    doc = (ROOT / "docs" / "launch.md").read_text()
    sec = doc[doc.index("### Kubernetes"):]
    m = re.search(r"```yaml\n(.*?)```", sec, re.S)
    assert m, "docs/launch.md has no yaml block under '### Kubernetes'"
    return yaml.safe_load(m.group(1))


def test_the_recipes_pod_template_is_a_valid_pod_spec():
    job = _manifest()
    assert job["kind"] == "PyTorchJob" and job["apiVersion"] == "kubeflow.org/v1", job.get("kind")
    tmpl = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "titan-tinygpt-worker-0"}, "spec": tmpl["spec"]}
    kv.validate(pod, kv.latest_version(), strict=True)  # raises ValidationError naming the field
    bad = {**pod, "spec": {**pod["spec"], "containers": [{**pod["spec"]["containers"][0], "volumeMount": []}]}}
    with pytest.raises(kv.ValidationError):  # the check bites: a misspelt field is refused
        kv.validate(bad, kv.latest_version(), strict=True)


def test_the_elastic_policy_matches_the_titan_run_command():
    job = _manifest()
    pol = job["spec"]["elasticPolicy"]
    worker = job["spec"]["pytorchReplicaSpecs"]["Worker"]
    args = shlex.split(" ".join(worker["template"]["spec"]["containers"][0]["args"]))
    nnodes = args[args.index("--nnodes") + 1]
    assert nnodes == f"{pol['minReplicas']}:{pol['maxReplicas']}", (nnodes, pol)
    assert pol["minReplicas"] <= worker["replicas"] <= pol["maxReplicas"], (worker["replicas"], pol)
    assert pol["rdzvBackend"] == args[args.index("--rdzv-backend") + 1]
    mounts = {m["name"] for m in worker["template"]["spec"]["containers"][0]["volumeMounts"]}
    assert mounts <= {v["name"] for v in worker["template"]["spec"]["volumes"]}, mounts
