#!/bin/sh
# Container entry point. With HVD_TRAIN_SSH_KEYS set (a folder shared by all containers of a job,
# holding the key pair the `keys` service made), it trusts that key, starts a key-only sshd for
# horovodrun's launcher, and configures ssh to use it. Then it runs the command.
set -eu
if [ -n "${HVD_TRAIN_SSH_KEYS:-}" ]; then
    mkdir -p /root/.ssh /run/sshd
    cp "$HVD_TRAIN_SSH_KEYS/id_ed25519" /root/.ssh/id_ed25519
    cp "$HVD_TRAIN_SSH_KEYS/id_ed25519.pub" /root/.ssh/authorized_keys
    printf 'Host *\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n' \
        > /root/.ssh/config
    chmod 700 /root/.ssh && chmod 600 /root/.ssh/*
    /usr/sbin/sshd -o PasswordAuthentication=no -o KbdInteractiveAuthentication=no \
        -o PermitRootLogin=prohibit-password -o PermitUserEnvironment=no
fi
exec "$@"
