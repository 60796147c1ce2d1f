#!/bin/bash
# Slurm TaskProlog of the slurmk8s slurmd image (/usr/local/lib/slurmk8s/task-prolog).
#
# slurm.conf names it (TaskProlog=) when the SlurmCluster sets
# spec.sharedStorage.checkpointDir. slurmstepd runs it as the job's user before
# each task, with the job's environment, and reads its standard output:
# `export NAME=value` lines set variables in the task, `print TEXT` lines go to
# the task's output. It gives every task
#
#   SLURMK8S_CHECKPOINT_DIR=<checkpointDir>/<user>/<job name>[_<array task id>]
#
# and creates that directory (as the user, so it is theirs) if it is missing.
# It exports it only when it and <checkpointDir>/<user> are real directories
# (not links) that belong to the job's user: no one else can have made them.
# The job name is made a safe path component: characters other than letters,
# digits, '.', '_' and '-' become '_' (byte by byte), a leading '.' becomes '_', at most 128
# characters, `job` if empty. The path depends on the job's user, name and
# array task id only, so it stays the same when the job is requeued or
# resubmitted under the same name: that is how a job finds its checkpoint.
# Array tasks each get their own directory (a sweep's tasks would otherwise
# overwrite each other's checkpoints); the array job id is left out because a
# resubmitted array gets a new one.
#
# The checkpoint directory is read from the `#slurmk8s:CheckpointDir=` line the
# renderer writes beside TaskProlog= (templates/slurm.conf.j2), in the
# slurm.conf this slurmd runs with. The per-user directory
# <checkpointDir>/<user> is made by the login pod. This script never fails a
# task: when something is amiss it prints one line to the task's output and
# leaves the variable unset.
set -u
export LC_ALL=C  # the name is cleaned byte by byte, whatever the job's locale

# The slurm.conf this node runs with: SLURM_CONF when slurmstepd passes it on,
# else where a configless slurmd caches it, else where a slurmd started with
# -f from mounted config files (a lent node) should have it.
conf=
for f in "${SLURM_CONF:-}" /run/slurm/conf/slurm.conf /etc/slurm/slurm.conf; do
  if [ -n "$f" ] && [ -r "$f" ]; then
    conf=$f
    break
  fi
done
[ -n "$conf" ] || exit 0
root=$(sed -n 's/^#slurmk8s:CheckpointDir=//p' "$conf" | tail -n 1)
[ -n "$root" ] || exit 0

user=${SLURM_JOB_USER:-$(id -un)}
name=${SLURM_JOB_NAME:-}
name=${name//[!A-Za-z0-9._-]/_}
name=${name/#./_}
name=${name:0:128}
name=${name:-job}
if [ -n "${SLURM_ARRAY_TASK_ID:-}" ]; then
  name=${name}_${SLURM_ARRAY_TASK_ID}
fi
dir=$root/$user/$name
uid=$(id -u)

# own_dir PATH: PATH is a directory, not a symbolic link, and this user's.
# (stat without -L reads the entry itself, never what a link points to.)
own_dir() {
  [ ! -L "$1" ] && [ -d "$1" ] && [ "$(stat -c %u -- "$1")" = "$uid" ]
}

# Only the user may have made $root/$user and $dir: another user who could
# write to the checkpoint root could otherwise have made them first (a
# directory of theirs, or a link to one) and read or replace this user's
# checkpoints. Each is made without -p, so an existing entry is never
# followed, and is then checked.
for d in "$root/$user" "$dir"; do
  [ -e "$d" ] || [ -L "$d" ] || mkdir -m 0755 -- "$d" 2>/dev/null
  if ! own_dir "$d"; then
    echo "print slurmk8s: cannot use the checkpoint directory $dir: $d is missing, a symbolic link, or not $user's (does $root/$user exist and belong to $user?); SLURMK8S_CHECKPOINT_DIR is not set"
    exit 0
  fi
done
echo "export SLURMK8S_CHECKPOINT_DIR=$dir"
exit 0
