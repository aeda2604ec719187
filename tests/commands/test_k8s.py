"""`hvd-train k8s`: the MPIJob it renders runs the recipe under horovodrun on the operator's
hostfile, docker/mpijob.yaml is its output for the defaults, and its pod templates are valid
Kubernetes (kubernetes-validate, against the API's own schemas, strictly: no unknown field), and
the whole MPIJob fits the MPI Operator's published schema of it (vendored in docker/crds/)."""

import copy
import subprocess
import sys
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from hvd_train.commands.k8s import mpijob
from tests.conftest import REPO

KUBERNETES = "1.33"  # the oldest release still maintained upstream when this was written
MPIJOB_SCHEMA = REPO / "docker" / "crds" / "mpijob-v2beta1.schema.yaml"


def k8s(*arguments: str) -> str:
    command = [sys.executable, "-m", "hvd_train", "k8s", *arguments]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout


def pod_templates(job: dict) -> dict[str, dict]:
    """Each replica's pod template, as the PodTemplate resource Kubernetes validates it as."""
    specs = job["spec"]["mpiReplicaSpecs"]
    return {
        role: {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": role.lower()}}
        | {"template": spec["template"]}
        for role, spec in specs.items()
    }


def test_the_shipped_mpijob_is_the_rendered_default():
    assert (REPO / "docker" / "mpijob.yaml").read_text() == k8s("--image", "hvd-train:cpu")


def test_the_rendered_job_runs_the_training_flags_on_every_rank():
    job = yaml.safe_load(k8s("--image", "registry.example/hvd:1", "-np", "8",
                             "--slots-per-worker", "4", "--name", "mnist", "--",
                             "--recipe", "mnist_bn", "--epochs", "3"))  # fmt: skip
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v2beta1", "MPIJob")
    assert job["metadata"]["name"] == "mnist" and job["spec"]["slotsPerWorker"] == 4
    assert job["spec"]["sshAuthMountPath"] == "/root/.ssh"
    specs = job["spec"]["mpiReplicaSpecs"]
    assert specs["Worker"]["replicas"] == 2 and specs["Launcher"]["replicas"] == 1
    (launcher,) = specs["Launcher"]["template"]["spec"]["containers"]
    assert launcher["image"] == "registry.example/hvd:1"
    assert launcher["command"] == ["horovodrun", "-np", "8", "--hostfile", "/etc/mpi/hostfile",
                                   "python", "-m", "hvd_train", "--recipe", "mnist_bn",
                                   "--epochs", "3"]  # fmt: skip


@pytest.mark.parametrize("role", ["Launcher", "Worker"])
def test_the_pod_templates_are_valid_kubernetes(role):
    template = pod_templates(mpijob("hvd-train:cpu", 4, 2))[role]
    kubernetes_validate.validate(template, KUBERNETES, strict=True)
    # The check can fail: a misspelt field, and a wrong type.
    misspelt = copy.deepcopy(template)
    misspelt["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError, match="imagePullPolicyy"):
        kubernetes_validate.validate(misspelt, KUBERNETES, strict=True)
    mistyped = copy.deepcopy(template)
    mistyped["template"]["spec"]["containers"][0]["command"] = "horovodrun -np 4"
    with pytest.raises(kubernetes_validate.ValidationError, match="is not of type 'array'"):
        kubernetes_validate.validate(mistyped, KUBERNETES, strict=True)


def strict(schema: Any) -> Any:
    """The schema refusing fields it does not name, as the API server's strict field
    validation does (kubectl's default since Kubernetes 1.27), instead of pruning them."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    tightened = {key: strict(value) for key, value in schema.items()}
    if (
        "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        tightened["additionalProperties"] = False
    return tightened


def test_the_mpijob_fits_the_operators_schema():
    schema = strict(yaml.safe_load(MPIJOB_SCHEMA.read_text()))
    rendered = k8s("--image", "registry.example/hvd:1", "-np", "8", "--slots-per-worker", "4",
                   "--cpu", "2", "--memory", "4Gi")  # fmt: skip
    job = yaml.safe_load(rendered)
    jsonschema.validate(job, schema)
    jsonschema.validate(yaml.safe_load((REPO / "docker" / "mpijob.yaml").read_text()), schema)
    # The check can fail: a misspelt field of the operator's, and a wrong type.
    misspelt = copy.deepcopy(job)
    misspelt["spec"]["sshAuthMountPth"] = misspelt["spec"].pop("sshAuthMountPath")
    with pytest.raises(jsonschema.ValidationError, match="sshAuthMountPth"):
        jsonschema.validate(misspelt, schema)
    mistyped = copy.deepcopy(job)
    mistyped["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] = "2"
    with pytest.raises(jsonschema.ValidationError, match="'2' is not of type 'integer'"):
        jsonschema.validate(mistyped, schema)
