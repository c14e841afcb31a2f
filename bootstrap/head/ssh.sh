#!/usr/bin/env bash
# `ssh` first on the head's horovodrun's PATH: horovodrun starts every rank as `ssh -o
# PasswordAuthentication=no -o StrictHostKeyChecking=no HOST ...` through a shell, with no
# keep-alive (horovod/runner/util/remote.py SSH_COMMAND_PREFIX, v0.28.1), so a rank whose host's
# network died would hold its ssh session, and the survivors' reset at Horovod's barrier, until
# TCP gives up (minutes). With these, ssh ends a silent session in 5 x 3 = 15 s (exit 255) and a
# connection that never answers in 10 s. ssh takes the first value it obtains for each option
# (https://man.openbsd.org/ssh_config), so these win over any later one. Shell only to exec.
set -euo pipefail
exec "${HOROVOD_FLEET_SSH:?the real ssh, set by the head}" -o ServerAliveInterval=5 \
	-o ServerAliveCountMax=3 -o ConnectTimeout=10 "$@"
