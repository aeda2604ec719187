#!/usr/bin/env bash
# Installs the system packages multi-process and multi-host runs use, where it can:
# Open MPI (openmpi-bin, libopenmpi-dev), so Horovod is built with the MPI controller too,
# OpenSSH (client and server), which horovodrun uses to start workers on other hosts, and
# iproute2 (`ip`), with which the multi-host test makes its hosts in network namespaces.
# With --containers, what `make test-containers` uses instead: a Docker engine (docker.io),
# Compose (docker-compose) and mmdebstrap, which makes Debian base images from Debian's packages.
# With --clusters, what `make test-clusters` uses: Slurm's controller, node daemon and commands
# (slurmctld, slurmd, slurm-client) and munge, its authentication.
# Without root or apt-get it says what is missing and goes on: one host with Gloo needs neither,
# and the container tests skip, saying why.
set -euo pipefail

missing=()
if [ "${1:-}" = --containers ]; then
    wanted="a Docker engine, Compose and mmdebstrap"
    without="the container tests skip; install them and run make test-containers again"
    command -v dockerd >/dev/null || missing+=(docker.io)
    command -v docker-compose >/dev/null || docker compose version >/dev/null 2>&1 \
        || missing+=(docker-compose)
    command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
elif [ "${1:-}" = --clusters ]; then
    wanted="Slurm and munge"
    without="the Slurm tests skip; install them and run make test-clusters again"
    command -v slurmctld >/dev/null || missing+=(slurmctld)
    command -v slurmd >/dev/null || missing+=(slurmd)
    command -v sbatch >/dev/null || missing+=(slurm-client)
    command -v munged >/dev/null || missing+=(munge)
else
    wanted="Open MPI, OpenSSH and iproute2"
    without="Horovod will be built without MPI if Open MPI is missing, and multi-host runs need"
    without+=" OpenSSH; install them and run make setup again"
    command -v mpicxx >/dev/null && command -v mpirun >/dev/null \
        || missing+=(openmpi-bin libopenmpi-dev)
    command -v ssh >/dev/null || missing+=(openssh-client)
    [ -x /usr/sbin/sshd ] || missing+=(openssh-server)
    command -v ip >/dev/null || missing+=(iproute2)
fi
if [ ${#missing[@]} -eq 0 ]; then
    echo "[install-system-packages] $wanted: installed"
elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "[install-system-packages] installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
else
    echo "[install-system-packages] not installed: ${missing[*]} (installing needs root and" \
         "apt-get). Without them, $without." >&2
fi
