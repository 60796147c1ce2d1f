#!/bin/bash
# Slurm Prolog of the slurmk8s slurmd image (/usr/local/lib/slurmk8s/prolog).
#
# slurm.conf names it (Prolog=) when the SlurmCluster reads researchers from a
# directory (spec.identity.ldap). slurmd runs it as root on each node of a job
# before the job starts there. It looks the job's user and their groups up once
# through NSS, so this node's sssd container holds them: the job's own lookups
# (`id`, `whoami`, `ls -l`) then answer from sssd's cache should the directory
# go away while the job runs. (Slurm launches the job without asking NSS: the
# credential carries the user, so nothing else on this node may have asked.)
#
# It never fails and never waits long: a prolog that fails drains the node.
if [ -n "${SLURM_JOB_UID:-}" ]; then
  timeout 10 getent passwd "$SLURM_JOB_UID" >/dev/null 2>&1
fi
if [ -n "${SLURM_JOB_USER:-}" ]; then
  timeout 10 getent initgroups -- "$SLURM_JOB_USER" >/dev/null 2>&1
fi
exit 0
