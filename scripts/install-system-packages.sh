#!/usr/bin/env bash
# Installs the system packages multi-process and multi-host runs use, where it can:
# Open MPI (openmpi-bin, libopenmpi-dev), so Horovod is built with the MPI controller too,
# OpenSSH (client and server), which horovodrun uses to start workers on other hosts, and
# iproute2 (`ip`), with which the multi-host test makes its hosts in network namespaces.
# Without root or apt-get it says what is missing and goes on: one host with Gloo needs neither.
set -euo pipefail

missing=()
command -v mpicxx >/dev/null && command -v mpirun >/dev/null || missing+=(openmpi-bin libopenmpi-dev)
command -v ssh >/dev/null || missing+=(openssh-client)
[ -x /usr/sbin/sshd ] || missing+=(openssh-server)
command -v ip >/dev/null || missing+=(iproute2)
if [ ${#missing[@]} -eq 0 ]; then
    echo "[install-system-packages] Open MPI, OpenSSH and iproute2 are installed"
elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "[install-system-packages] installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
else
    echo "[install-system-packages] not installed: ${missing[*]} (installing needs root and" \
         "apt-get). Horovod will be built without MPI if Open MPI is missing, and multi-host" \
         "runs need OpenSSH; install them and run make setup again." >&2
fi
