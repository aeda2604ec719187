"""`hvd-train k8s`: a Kubeflow MPI Operator MPIJob (kubeflow.org/v2beta1) that trains a recipe
with horovodrun across worker pods, rendered for an image, a number of ranks and the training
command's flags, so that nobody edits YAML by hand. docker/mpijob.yaml is its output for the
defaults.

The operator starts one launcher pod and the worker pods, gives them SSH keys (mounted at
`sshAuthMountPath`) and writes /etc/mpi/hostfile, one `host slots=N` line per worker, which
horovodrun reads as it reads any hostfile.
"""

from __future__ import annotations

import math
from typing import Any

from hvd_train.frameworks import DEFAULT_FRAMEWORK

HOSTFILE = "/etc/mpi/hostfile"
DEFAULT_TRAIN_ARGUMENTS = ("--recipe", "mnist_cnn", "--framework", DEFAULT_FRAMEWORK)


def mpijob(
    image: str,
    ranks: int,
    slots_per_worker: int = 1,
    train_arguments: tuple[str, ...] = DEFAULT_TRAIN_ARGUMENTS,
    name: str = "hvd-train",
    cpu: str = "2",
    memory: str = "4Gi",
) -> dict[str, Any]:
    """The MPIJob: `ranks` ranks on ceil(ranks / slots_per_worker) workers, each with `cpu` and
    `memory`, running `python -m hvd_train TRAIN_ARGUMENTS` under horovodrun."""
    workers = math.ceil(ranks / slots_per_worker)
    command = ["horovodrun", "-np", str(ranks), "--hostfile", HOSTFILE,
               "python", "-m", "hvd_train", *train_arguments]  # fmt: skip
    launcher = container("launcher", image, command, {"cpu": "500m", "memory": "1Gi"})
    worker = container("worker", image, ["/usr/sbin/sshd", "-De"], {"cpu": cpu, "memory": memory})
    return {
        "apiVersion": "kubeflow.org/v2beta1",
        "kind": "MPIJob",
        "metadata": {"name": name},
        "spec": {
            "slotsPerWorker": slots_per_worker,
            "sshAuthMountPath": "/root/.ssh",
            "runPolicy": {"cleanPodPolicy": "Running"},
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "template": {"spec": {"containers": [launcher]}}},
                "Worker": {"replicas": workers, "template": {"spec": {"containers": [worker]}}},
            },
        },
    }


def container(name: str, image: str, command: list[str], resources: dict[str, str]) -> dict:
    return {
        "name": name,
        "image": image,
        "command": command,
        "resources": {"requests": dict(resources), "limits": dict(resources)},
    }


def render(manifest: dict[str, Any]) -> str:
    """`manifest` as YAML, under a comment saying how it was made and how to apply it."""
    import yaml

    header = (
        "# Rendered by `hvd-train k8s` for the Kubeflow MPI Operator (kubeflow.org/v2beta1):\n"
        "#   kubectl apply -f this.yaml\n"
    )
    return header + yaml.safe_dump(manifest, sort_keys=False)
