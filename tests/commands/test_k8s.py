"""`hvd-train k8s`: the MPIJob it renders runs the recipe under horovodrun on the operator's
hostfile, docker/mpijob.yaml is its output for the defaults, and its pod templates are valid
Kubernetes (kubernetes-validate, against the API's own schemas, strictly: no unknown field)."""

import copy
import subprocess
import sys

import kubernetes_validate
import pytest
import yaml

from hvd_train.commands.k8s import mpijob
from tests.conftest import REPO

KUBERNETES = "1.33"  # the oldest release still maintained upstream when this was written


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
