#!/usr/bin/env bash
# PID 1 of a sandbox pod, the part a pause container plays: set the pod's
# host name, start each container in a mount namespace of its own, pass
# SIGTERM on to all of them, and end the pod when any container ends (the
# sandbox restarts no container in place).
#
# Usage: pod-init.sh POD_DIR
#
# Started by slurmk8s/sandbox/runtime.py as
#   nsenter --net=/var/run/netns/<pod> unshare --uts --mount --pid --fork ...
# so the containers share the pod's network, host name and process space and
# each has its own root file system (container-init.sh). POD_DIR holds:
#   hostname            the pod's host name
#   containers/<i>/     one directory per container, in the pod spec's order
#                       (container-init.sh says what is in it); each
#                       container's output goes to its log there, and the
#                       number its process has in the pod to its nspid
set -euo pipefail
pod=$1
here=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")

hostname "$(cat "$pod/hostname")"

pids=()
names=()
for ctr in "$pod"/containers/*; do
  unshare --mount --propagation private -- bash "$here/container-init.sh" "$pod" "$ctr" >>"$ctr/log" 2>&1 &
  pids+=("$!")
  names+=("$(cat "$ctr/name")")
  echo "$!" >"$ctr/nspid"
done

stopping=0
stop_all() {
  stopping=1
  local pid
  for pid in "${pids[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
}
trap stop_all TERM INT

# Wait until one container ends (or a signal stops them all).
ended=
while [ -z "$ended" ]; do
  for i in "${!pids[@]}"; do
    if ! kill -0 "${pids[$i]}" 2>/dev/null; then
      ended=$i
      break
    fi
  done
  [ -n "$ended" ] || wait -n "${pids[@]}" 2>/dev/null || true
done
rc=0
wait "${pids[$ended]}" || rc=$?
if [ "$stopping" = 0 ]; then
  echo "pod-init: container ${names[$ended]} exited with status $rc; stopping the pod" >&2
fi
stop_all
for pid in "${pids[@]}"; do
  wait "$pid" 2>/dev/null || true
done
exit "$rc"
