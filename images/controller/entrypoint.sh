#!/bin/bash
# Entrypoint of the slurmk8s controller image (/usr/local/bin/slurmk8s-entrypoint):
# the operator and the node-lending bridge, i.e. `slurmk8s "$@"`, e.g.
#   slurmk8s-entrypoint operator
#
# The Slurm facade drives the Slurm commands (scontrol, sinfo, squeue), which
# this image has. They need munged: when the pod runs as root and mounts a
# cluster's munge key at /run/slurmk8s/munge/munge.key (and its slurm.conf at
# /etc/slurm), munged is started first. Otherwise slurmk8s replaces this shell.
set -euo pipefail
SK_COMPONENT=controller
here=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")
lib=$here/../common/slurmk8s-lib.sh
[ -r "$lib" ] || lib=/usr/local/lib/slurmk8s/lib.sh
# shellcheck source=images/common/slurmk8s-lib.sh
. "$lib"

command -v slurmk8s >/dev/null || sk_die "the slurmk8s command is not installed (pip install the repository)"

if [ -r "$SK_MUNGE_KEY" ] && sk_is_root; then
  sk_start_munge
  sk_run slurmk8s "$@"
fi
exec slurmk8s "$@"
