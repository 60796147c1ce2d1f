#!/bin/bash
# Slurm HealthCheckProgram of the slurmk8s slurmd image
# (/usr/local/lib/slurmk8s/healthcheck).
#
# slurmd runs it as root when it starts and every HealthCheckInterval seconds
# (spec.healthCheck). It runs the checks the `#slurmk8s:Health*` lines of this
# node's slurm.conf name (templates/slurm.conf.j2), in this order, and stops
# at the first that fails:
#
#   gpus           the pod has exactly the GPU devices (/dev/nvidiaN, character
#                  devices) its gres says: the count the entrypoint found at
#                  start, in /run/slurmk8s/node
#   munge          a credential made here decodes here (munged answers, the key
#                  is readable)
#   sharedStorage  every shared volume's mount point is mounted read-write
#                  (its mount options: nothing is written, so root-squashed
#                  NFS passes)
#   disk           /tmp has at least HealthMinFreeDisk bytes free
#   memory         the pod's memory limit leaves at least
#                  HealthMinAvailableMemory bytes unused (cgroup v2)
#   site checks    each file of /etc/slurmk8s/health.d (the ConfigMap
#                  spec.healthCheck.siteChecks names), in name order, as
#                  nobody, within 10 s; its name names the check
#
# A failure drains the node with the reason `slurmk8s: health: <check>`,
# unless it is drained already for another reason (an administrator's, the
# operator's): that drain is left as it is. When every check passes, a drain
# of its own (`slurmk8s: health: ...`) is resumed, and no other. It never
# fails itself: slurmd ignores its exit status, and a check it cannot run is
# reported in /run/slurmk8s/healthcheck.log, not guessed.
set -u
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export LC_ALL=C
PREFIX="slurmk8s: health:"

# What it did, for `kubectl exec <pod> -- cat /run/slurmk8s/healthcheck.log`
# (slurmd keeps none of its output); the last 256 KiB.
LOG=/run/slurmk8s/healthcheck.log
log() {
  if [ -f "$LOG" ] && [ ! -L "$LOG" ] && [ "$(stat -c %s "$LOG")" -gt 262144 ]; then mv -f "$LOG" "$LOG.1"; fi
  [ -L "$LOG" ] || echo "$(date -u +%FT%TZ) $*" >>"$LOG"
}

# What the entrypoint found at start: NODE=<slurm node name>, GPUS=<count>,
# SLURM_CONF=<the slurm.conf this slurmd runs with>.
facts=/run/slurmk8s/node
node='' gpus='' conf=''
if [ -r "$facts" ] && [ ! -L "$facts" ]; then
  while IFS='=' read -r key value; do
    case $key in
      NODE) node=$value ;;
      GPUS) gpus=$value ;;
      SLURM_CONF) conf=$value ;;
    esac
  done <"$facts"
fi
node=${node:-${SLURMD_NODENAME:-$(hostname -s)}}
[ -n "$conf" ] && [ -r "$conf" ] || conf=/run/slurm/conf/slurm.conf
export SLURM_CONF=$conf
[ -r "$conf" ] || { log "no slurm.conf at $conf: nothing checked"; exit 0; }

setting() { sed -n "s/^#slurmk8s:$1=//p" "$conf" | tail -n 1; }
checks=$(setting HealthChecks)
shared=$(setting HealthSharedPaths)
min_disk=$(setting HealthMinFreeDisk)
min_memory=$(setting HealthMinAvailableMemory)

check_gpus() {
  [ -n "$gpus" ] && [ "$gpus" != 0 ] || return 0
  local n=0 f
  for f in /dev/nvidia*; do
    if [[ $f =~ ^/dev/nvidia[0-9]+$ ]] && [ -c "$f" ] && [ ! -L "$f" ]; then n=$((n + 1)); fi
  done
  [ "$n" -eq "$gpus" ] || { why="$n of its $gpus GPU devices present"; return 1; }
}

check_munge() {
  munge -n 2>/dev/null | unmunge >/dev/null 2>&1 || { why="munge -n | unmunge failed"; return 1; }
}

check_sharedStorage() {
  local path options
  for path in $shared; do
    options=$(findmnt -n -o OPTIONS --mountpoint "$path" 2>/dev/null | head -n 1)
    [ -n "$options" ] || { why="$path is not mounted"; return 1; }
    case ",$options," in *,ro,*) why="$path is mounted read-only"; return 1 ;; esac
  done
}

check_disk() {
  [ -n "$min_disk" ] || return 0
  local free
  free=$(df -P -B1 /tmp 2>/dev/null | awk 'NR == 2 { print $4 }')
  [ -n "$free" ] || { why="df /tmp failed"; return 1; }
  [ "$free" -ge "$min_disk" ] || { why="/tmp has $free bytes free, under $min_disk"; return 1; }
}

check_memory() {
  [ -n "$min_memory" ] || return 0
  local max current
  max=$(cat /sys/fs/cgroup/memory.max 2>/dev/null) current=$(cat /sys/fs/cgroup/memory.current 2>/dev/null)
  if [ -z "$current" ] || [ -z "$max" ] || [ "$max" = max ]; then
    max=$(awk '/^MemTotal:/ { print $2 * 1024 }' /proc/meminfo)
    current=$((max - $(awk '/^MemAvailable:/ { print $2 * 1024 }' /proc/meminfo)))
  fi
  [ $((max - current)) -ge "$min_memory" ] || { why="$((max - current)) bytes of memory left, under $min_memory"; return 1; }
}

failed='' why=''
for check in $checks; do
  case $check in
    gpus) check_gpus ;;
    munge) check_munge ;;
    sharedStorage) check_sharedStorage ;;
    disk) check_disk ;;
    memory) check_memory ;;
    *) log "unknown check '$check' in $conf: skipped"; true ;;
  esac || { failed=$check; break; }
done
if [ -z "$failed" ] && [ -d /etc/slurmk8s/health.d ]; then
  for script in /etc/slurmk8s/health.d/*; do
    name=${script##*/}
    # ConfigMap keys: letters, digits, '-', '_', '.'; the kubelet's ..data entries are not checks.
    if ! [[ $name =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] || [ ! -f "$script" ]; then continue; fi
    if ! (cd / && timeout -k 2 10 setpriv --reuid=nobody --regid=nogroup --clear-groups --inh-caps=-all \
          --no-new-privs -- /bin/sh "$script" >/dev/null 2>&1); then
      failed=$name why="exited non-zero or took over 10 s"
      break
    fi
  done
fi

state=$(timeout 10 sinfo -h -n "$node" -o '%T' 2>/dev/null | head -n 1)
reason=$(timeout 10 sinfo -h -n "$node" -o '%E' 2>/dev/null | head -n 1)
[ -n "$state" ] || { log "node $node not known to slurmctld (yet): nothing changed"; exit 0; }
drained=0
case $state in *drain* | *DRAIN*) drained=1 ;; esac

if [ -n "$failed" ]; then
  if [ "$drained" = 0 ] || { [[ $reason == "$PREFIX"* ]] && [ "$reason" != "$PREFIX $failed" ]; }; then
    log "node $node failed the $failed check ($why): draining it"
    timeout 10 scontrol update nodename="$node" state=drain reason="$PREFIX $failed" ||
      log "could not drain $node"
  fi
elif [ "$drained" = 1 ] && [[ $reason == "$PREFIX"* ]]; then
  log "node $node passes every check again: resuming it ($reason cleared)"
  timeout 10 scontrol update nodename="$node" state=resume || log "could not resume $node"
fi
exit 0
