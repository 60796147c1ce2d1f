#!/bin/bash
# Entrypoint of the slurmk8s slurmd image (/usr/local/bin/slurmk8s-entrypoint).
#
#   slurmk8s-entrypoint [SLURMD_ARGS...]   set up the pod, wait for slurmctld,
#                                          then run slurmd as a dynamic,
#                                          configless node named `hostname -s`
#                                          (a GPU node: see SLURMK8S_GRES_CONF)
#   slurmk8s-entrypoint ready              exit 0 when this node is registered
#                                          and not DOWN/INVAL/NOT_RESPONDING
#
# On SIGTERM (pod deletion) the node is drained (reason SLURMK8S_DRAIN_REASON)
# and the entrypoint waits while jobs run there. Emptying the node is not its
# job: the operator does that by the one evacuation rule (slurmk8s.evacuation:
# signal, grace period, requeue or cancel, start again at once) for scale-in,
# rolling updates and worker pods deleted by anyone; the bridge does it before
# it deletes a lent node's pod. Only as a last resort, when jobs still run
# SLURMK8S_DRAIN_TIMEOUT seconds (the node set's grace period; default 30)
# plus 30 s later (no operator is running, say), the node is set DOWN:
# slurmctld then ends its jobs and requeues those that may be requeued, as for
# any failed node. Then slurmd stops and the node is deleted from slurmctld so
# that no ghost node is left behind.
#
# Environment: SLURMK8S_CONTROLLER, SLURMK8S_CONTROLLER_PORT (default 6817),
# SLURMK8S_NODE_CONF (slurmd --conf), SLURMK8S_DRAIN_REASON (the reason of the
# drain on pod deletion: the one the operator knows as its own, rendered from
# slurmk8s.slurm.model.POD_TERMINATING), optional SLURMK8S_GPU_COUNT (the pod
# must have exactly that many /dev/nvidiaN, whichever N the device plugin
# gave it), SLURMK8S_WAIT_TIMEOUT (seconds to wait for slurmctld, default
# 300), SLURMK8S_DRAIN_TIMEOUT.
#
# A GPU node sets SLURMK8S_GRES_CONF: its gres.conf, with @GPU_FILES@ where
# its devices go (/dev/nvidia[4-7]). Its slurmd is not configless: it reads
# the cluster's config files, mounted at /etc/slurm, through links in its own
# config dir that hold that gres.conf instead of the cluster's (no gres.conf
# can name a pod's devices before it starts). A lent node (a Kubernetes node
# the bridge lends to Slurm) also sets SLURMK8S_NODE_NAME (its Slurm node
# name: the Kubernetes node's name).
set -euo pipefail
SK_COMPONENT=slurmd
here=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")
lib=$here/../common/slurmk8s-lib.sh
[ -r "$lib" ] || lib=/usr/local/lib/slurmk8s/lib.sh
# shellcheck source=images/common/slurmk8s-lib.sh
. "$lib"

node=${SLURMK8S_NODE_NAME:-$(hostname -s)}
spool=/var/spool/slurmd
own_conf=/run/slurm/own-conf
if [ -n "${SLURMK8S_GRES_CONF:-}" ]; then
  export SLURM_CONF=$own_conf/slurm.conf
else
  # A configless slurmd keeps the config it fetched in SlurmdSpoolDir/conf-cache
  # and links /run/slurm/conf to it. Slurm 22.05 commands fall back to
  # /run/slurm/conf/slurm.conf only when /etc/slurm/slurm.conf is absent, so
  # name it outright: the node's own scontrol/squeue then never read a stale or
  # foreign /etc/slurm.
  export SLURM_CONF=/run/slurm/conf/slurm.conf
fi

node_state() {  # the node's State= field, e.g. IDLE+DRAIN
  sk_quick scontrol -o show node "$node" 2>/dev/null | tr ' ' '\n' | sed -n 's/^State=//p'
}

if [ "${1:-}" = ready ]; then
  [ -r "$SLURM_CONF" ] || { echo "slurmd has not fetched its config yet" >&2; exit 1; }
  state=$(node_state) || true
  case $state in
    '') echo "node $node is not registered" >&2; exit 1 ;;
    *DOWN* | *INVAL* | *NOT_RESPONDING* | *FAIL*) echo "node $node is $state" >&2; exit 1 ;;
    *) exit 0 ;;
  esac
fi

sk_is_root || sk_die "slurmd's entrypoint must run as root (slurmd launches jobs as their users)"
sk_require_env SLURMK8S_CONTROLLER SLURMK8S_NODE_CONF SLURMK8S_DRAIN_REASON
drain_reason=$SLURMK8S_DRAIN_REASON
port=${SLURMK8S_CONTROLLER_PORT:-6817}
drain_timeout=${SLURMK8S_DRAIN_TIMEOUT:-30}
case $drain_timeout in '' | *[!0-9]*) sk_die "SLURMK8S_DRAIN_TIMEOUT must be a whole number of seconds, not '$drain_timeout'" ;; esac
# The operator's rule signals at its next round and gives the grace period
# from there: 30 s more before the last resort (the pod's termination grace
# period is the grace period + KillWait + 60 s).
drain_limit=$((drain_timeout + 30))

# GPUs: the device nodes the runtime gave this pod. The NVIDIA device plugin
# and container toolkit hand a pod the host's own /dev/nvidiaN (GPUs 4-7 of an
# 8-GPU node are /dev/nvidia4../dev/nvidia7), so they are found, not assumed,
# and the node's gres.conf names exactly those: slurmd turns a node INVAL
# whose gres.conf names a missing file or one that is not a character device.
gpu_files=''
if [ -n "${SLURMK8S_GPU_COUNT:-}" ] && [ "$SLURMK8S_GPU_COUNT" != 0 ]; then
  case $SLURMK8S_GPU_COUNT in *[!0-9]*) sk_die "SLURMK8S_GPU_COUNT must be a number, not '$SLURMK8S_GPU_COUNT'" ;; esac
  gpus=()
  for f in /dev/nvidia*; do
    if [[ $f =~ ^/dev/nvidia([0-9]+)$ ]] && [ -c "$f" ] && [ ! -L "$f" ]; then gpus+=("${BASH_REMATCH[1]}"); fi
  done
  if [ ${#gpus[@]} -gt 0 ]; then mapfile -t gpus < <(printf '%s\n' "${gpus[@]}" | sort -n); fi
  if [ ${#gpus[@]} -ne "$SLURMK8S_GPU_COUNT" ]; then
    given=$(printf '/dev/nvidia%s ' "${gpus[@]}")
    [ ${#gpus[@]} -gt 0 ] || given='none '
    if [ -n "${SLURMK8S_NODESET:-}" ]; then what="node set $SLURMK8S_NODESET has $SLURMK8S_GPU_COUNT ${SLURMK8S_GPU_TYPE:-} GPUs per node (spec.nodeSets[].gpus.count)"
    else what="node $node is lent with $SLURMK8S_GPU_COUNT GPUs (its allocatable nvidia.com/gpu)"; fi
    sk_die "$what, but its pod was given ${#gpus[@]} GPU devices (${given% }): the pod's nvidia.com/gpu limit makes the NVIDIA device plugin add that many; check the node runs the device plugin and has that many free GPUs, or fix the count"
  fi
  gpu_files=/dev/nvidia$(sk_ranges "${gpus[@]}")
  sk_log "found $SLURMK8S_GPU_COUNT GPU devices: $gpu_files"
fi

# What the health check (HealthCheckProgram, images/slurmd/healthcheck.sh) needs
# and slurmd does not pass it: this node's name, its GPU count, its slurm.conf.
install -d -m 0755 /run/slurmk8s
printf 'NODE=%s\nGPUS=%s\nSLURM_CONF=%s\n' "$node" "${SLURMK8S_GPU_COUNT:-0}" "$SLURM_CONF" >/run/slurmk8s/node.tmp
mv -f /run/slurmk8s/node.tmp /run/slurmk8s/node

terminating=0
# shellcheck disable=SC2317 # run from a trap
on_term_early() {
  sk_log "got SIGTERM before slurmd started: nothing to drain, exiting"
  exit 0
}
trap on_term_early TERM INT

sk_setup_users
sk_start_munge
mkdir -p "$spool"
chmod 0755 "$spool"

sk_wait_port "$SLURMK8S_CONTROLLER" "$port" "${SLURMK8S_WAIT_TIMEOUT:-300}" "slurmd registers with slurmctld" \
  "check that the slurmctld pod is running and ready (kubectl get pods; kubectl logs <cluster>-controller-0) and that this pod resolves $SLURMK8S_CONTROLLER"
sk_log "slurmctld answers at $SLURMK8S_CONTROLLER:$port; registering node $node with: $SLURMK8S_NODE_CONF"

# scontrol, bounded so that an unreachable slurmctld cannot hold up the pod's end.
# shellcheck disable=SC2317 # run from a trap
sctl() {
  timeout 15 scontrol "$@"
}

# shellcheck disable=SC2317 # run from a trap
jobs_on_node() {
  timeout 15 squeue -h -w "$node" -o %i \
    -t RUNNING,COMPLETING,CONFIGURING,SUSPENDED,SIGNALING,STOPPED,STAGE_OUT 2>/dev/null | paste -sd, -
}

# last_resort JOBS: the pod is going away with these jobs still on it and
# nobody emptied the node. Set it DOWN while slurmd still runs: slurmctld ends
# the jobs there (their processes get SIGTERM, then SIGKILL after KillWait)
# and requeues those that may be requeued, with Slurm's requeue delay. This is
# Slurm's handling of a failed node, not a policy of ours.
# shellcheck disable=SC2317 # run from a trap
last_resort() {
  local jobs=$1 start=$SECONDS limit kill_wait
  sk_log "warning: jobs $jobs still on $node after ${drain_limit}s and nobody emptied the node (is the slurmk8s operator running?): setting it DOWN, Slurm ends them and requeues what it may"
  sctl update nodename="$node" state=down reason="$drain_reason" ||
    sk_log "warning: could not set $node DOWN"
  kill_wait=$(sk_conf_value "$SLURM_CONF" KillWait)
  limit=$((${kill_wait:-30} + 10))
  while jobs=$(jobs_on_node) && [ -n "$jobs" ] && [ $((SECONDS - start)) -lt "$limit" ]; do
    sleep 1
  done
  [ -z "$jobs" ] || sk_log "warning: jobs $jobs still on $node after ${limit}s; stopping slurmd anyway"
}

# shellcheck disable=SC2317 # run from a trap
drain_and_leave() {
  local start=$SECONDS next=0 jobs rc=0 i
  [ "$terminating" = 0 ] || return 0
  terminating=1
  trap '' TERM INT HUP
  sk_log "the pod is going away: draining node $node ($drain_reason)"
  if ! sctl update nodename="$node" state=drain reason="$drain_reason"; then
    sk_log "warning: could not drain $node (is slurmctld reachable?); stopping anyway"
  fi
  while jobs=$(jobs_on_node) && [ -n "$jobs" ]; do
    if [ $((SECONDS - start)) -ge "$drain_limit" ]; then
      last_resort "$jobs"
      break
    fi
    if [ "$SECONDS" -ge "$next" ]; then
      sk_log "waiting for jobs $jobs on $node to leave: the operator signals and requeues them ($((SECONDS - start))s of ${drain_limit}s)"
      next=$((SECONDS + 5))
    fi
    sleep 1
  done
  sk_log "stopping slurmd (pid $SK_MAIN_PID)"
  kill -TERM "$SK_MAIN_PID" 2>/dev/null || true
  wait "$SK_MAIN_PID" || rc=$?
  sk_log "slurmd exited with status $rc"
  for i in 1 2 3 4 5; do
    # Gone already: the bridge removes a lent node before it deletes the pod.
    if ! sctl show node "$node" >/dev/null 2>&1 && sctl ping >/dev/null 2>&1; then
      sk_log "node $node is not in slurmctld (any more)"
      break
    fi
    if sctl delete nodename="$node"; then
      sk_log "deleted node $node from slurmctld"
      break
    fi
    if [ "$i" = 5 ]; then
      sk_log "warning: could not delete node $node from slurmctld; the operator removes such leftover nodes"
      break
    fi
    sleep 2
  done
  sk_stop_munge
  exit 0
}

if [ -n "${SLURMK8S_GRES_CONF:-}" ]; then
  # Links follow the ConfigMap's updates, so `scontrol reconfigure` reads new files.
  [ -r /etc/slurm/slurm.conf ] || sk_die "a GPU node reads the cluster's config files at /etc/slurm, but /etc/slurm/slurm.conf is missing: mount the cluster's ConfigMap there"
  mkdir -p "$own_conf"
  for f in /etc/slurm/*; do
    [ "$(basename "$f")" = gres.conf ] || ln -sfn "$f" "$own_conf/$(basename "$f")"
  done
  case $SLURMK8S_GRES_CONF in *@GPU_FILES@*) [ -n "$gpu_files" ] || sk_die "SLURMK8S_GRES_CONF names GPU devices, but SLURMK8S_GPU_COUNT is not set" ;; esac
  gres=${SLURMK8S_GRES_CONF//@GPU_FILES@/$gpu_files}
  printf '%s\n' "$gres" >"$own_conf/gres.conf"
  sk_log "slurmd reads $own_conf (links to /etc/slurm) with its own gres.conf: $(grep -v '^#' "$own_conf/gres.conf" | tr '\n' ' ')"
  sk_spawn slurmd -D -Z -N "$node" -f "$SLURM_CONF" --conf "$SLURMK8S_NODE_CONF" "$@"
else
  sk_spawn slurmd -D -Z -N "$node" --conf-server "$SLURMK8S_CONTROLLER:$port" --conf "$SLURMK8S_NODE_CONF" "$@"
fi
trap drain_and_leave TERM INT
sk_supervise
