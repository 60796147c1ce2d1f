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
#                  start, in /run/slurmk8s/node. Where nvidia-smi is on PATH
#                  (the NVIDIA container toolkit mounts the driver's), the
#                  driver must also answer for each of them, within
#                  SMI_SECONDS, with no uncorrectable volatile ECC error, no
#                  retired page pending and no row remapping pending or
#                  failed; a value the GPU does not report ([N/A], [Not
#                  Supported]) is no failure. The drain's reason names the
#                  GPU and the problem
#   munge          a credential made here decodes here (munged answers, the key
#                  is readable)
#   sharedStorage  every shared volume's mount point is mounted read-write
#                  (its mount options: nothing is written, so root-squashed
#                  NFS passes)
#   disk           the file system of slurmd's spool directory has at
#                  least HealthMinFreeDisk bytes free, counting what the
#                  running jobs' users hold in the scratch directories on it
#                  (/tmp, /var/tmp) as free: a job filling its scratch is the
#                  job's business, not the node's fault
#   memory         the pod's memory limit (cgroup v2; the node's memory
#                  without one) leaves at least HealthMinAvailableMemory
#                  bytes after everything but the jobs: the anonymous memory
#                  of processes that are not the job users'. Page cache, tmpfs
#                  (/dev/shm) and the jobs' own memory never count
#   site checks    each file of /etc/slurmk8s/health.d (the ConfigMap
#                  spec.healthCheck.siteChecks names, labelled for it), in
#                  name order, as nobody, within 10 s; its name names the
#                  check. Every process it leaves (backgrounded, or in a
#                  session of its own) is killed when it ends
#
# A job's process is one whose real uid is a user's: 1000 or more, and not
# SlurmUser's, nobody's or the site checks'. A job cannot change its uid, so
# it cannot hide its use as the node's.
#
# A failure drains the node with the reason `slurmk8s: health: <check>`
# (`slurmk8s: health: gpus: <GPU>: <problem>` for what the driver reports),
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

why=''  # why the check that failed failed
# Where it reads the pod's state (tests point them elsewhere after sourcing this file).
PROC=/proc
CGROUP=/sys/fs/cgroup
SPOOL=/var/spool/slurmd
SCRATCH="/tmp /var/tmp"
# Where the gpus check finds the pod's devices, and how long one nvidia-smi query may take
# (slurmd kills the whole program after 60 s, so two queries must fit with the rest).
DEV=/dev
SMI_SECONDS=15
gpus=''
detail=''  # what the drain's reason says after the check's name, where the check names it
# Who a site check runs as (nobody), and for how long.
CHECK_UID=65534 CHECK_GID=65534 CHECK_SECONDS=10
SLURM_UID=$(id -u slurm 2>/dev/null || echo 64030)

# The uids of the job users that have a process in the pod, one a line.
job_uids() {
  cat "$PROC"/[0-9]*/status 2>/dev/null | awk -v slurm="$SLURM_UID" -v check="$CHECK_UID" '
    $1 == "Uid:" && $2 >= 1000 && $2 != slurm && $2 != 65534 && $2 != check { seen[$2] = 1 }
    END { for (u in seen) print u }'
}

# Bytes of anonymous memory of the job users' processes (RssAnon).
jobs_anon_bytes() {
  cat "$PROC"/[0-9]*/status 2>/dev/null | awk -v slurm="$SLURM_UID" -v check="$CHECK_UID" '
    $1 == "Name:" { job = 0 }
    $1 == "Uid:" { job = $2 >= 1000 && $2 != slurm && $2 != 65534 && $2 != check }
    $1 == "RssAnon:" && job { kb += $2 }
    END { printf "%.0f\n", kb * 1024 }'
}

check_disk() {
  local min=$1 free dev dir held=0 used uids
  [ -n "$min" ] || return 0
  free=$(df -P -B1 "$SPOOL" 2>/dev/null | awk 'NR == 2 { print $4 }')
  [ -n "$free" ] || { why="df $SPOOL failed"; return 1; }
  dev=$(stat -c %d "$SPOOL")
  uids=$(job_uids | awk '{ printf "%s-uid %s", (NR > 1 ? " -o " : ""), $1 }')
  if [ -n "$uids" ]; then
    for dir in $SCRATCH; do
      if ! { [ -d "$dir" ] && [ ! -L "$dir" ] && [ "$(stat -c %d "$dir")" = "$dev" ]; }; then continue; fi
      # Blocks of 512 bytes of the running jobs' users' files (a file that goes meanwhile is
      # skipped); a scratch too large to read in 30 s is not judged.
      # shellcheck disable=SC2086
      used=$(timeout 30 find "$dir" -xdev -type f \( $uids \) -printf '%b\n' 2>/dev/null |
             awk '{ b += $1 } END { printf "%.0f\n", b * 512 }'; [ "${PIPESTATUS[0]}" -lt 124 ]) ||
        { log "reading the jobs' scratch in $dir took over 30 s: disk not judged"; return 0; }
      held=$((held + used))
    done
  fi
  [ $((free + held)) -ge "$min" ] ||
    { why="$SPOOL's file system has $free bytes free ($held more in the jobs' scratch), under $min"; return 1; }
}

check_memory() {
  local min=$1 max anon jobs node left
  [ -n "$min" ] || return 0
  jobs=$(jobs_anon_bytes)
  max=$(cat "$CGROUP/memory.max" 2>/dev/null)
  anon=$(awk '$1 == "anon" { print $2 }' "$CGROUP/memory.stat" 2>/dev/null)
  if [ -n "$max" ] && [ "$max" != max ] && [ -n "$anon" ]; then
    node=$((anon - jobs))
    [ "$node" -ge 0 ] || node=0
    left=$((max - node))
  else  # no limit: the node's memory, with what the jobs hold counted as available
    left=$(awk '/^MemAvailable:/ { printf "%.0f\n", $2 * 1024 }' "$PROC/meminfo")
    [ -n "$left" ] || { why="no memory.max nor MemAvailable to read"; return 1; }
    left=$((left + jobs))
  fi
  [ "$left" -ge "$min" ] ||
    { why="$left bytes of memory left besides the jobs', under $min"; return 1; }
}

# One site check: 0 when it exits 0 within CHECK_SECONDS. It runs as CHECK_UID, with no
# capability and no way to gain one; a process it puts in a session of its own leaves
# timeout's process group, not its uid, so when it ends every process of that uid is
# killed at once (kill -1 as that uid: the kernel signals them under one lock, and a
# process being killed forks no more).
run_site_check() {
  local rc
  (cd / && exec timeout -k 2 "$CHECK_SECONDS" setpriv --reuid="$CHECK_UID" --regid="$CHECK_GID" --clear-groups \
      --inh-caps=-all --no-new-privs -- /bin/sh "$1" >/dev/null 2>&1 </dev/null)
  rc=$?
  setpriv --reuid="$CHECK_UID" --regid="$CHECK_GID" --clear-groups --inh-caps=-all --no-new-privs -- \
    kill -9 -1 2>/dev/null
  return "$rc"
}

# bounded SECONDS OUT COMMAND...: COMMAND's output (stdout and stderr) in OUT, and its exit
# status; 124 when it ran over SECONDS. A process the kernel holds (a driver call stuck in D
# state) outlives even SIGKILL: it is left behind then, not waited for.
bounded() {
  local seconds=$1 out=$2 i
  shift 2
  rm -f "$out.rc"
  (timeout -k 2 "$seconds" "$@" >"$out" 2>&1 </dev/null; echo "$?" >"$out.rc") &
  for ((i = 0; i < (seconds + 4) * 10; i++)); do
    if [ -s "$out.rc" ]; then
      wait "$!"
      i=$(cat "$out.rc")
      [ "$i" != 137 ] || i=124  # killed after the grace: timed out all the same
      return "$i"
    fi
    sleep 0.1
  done
  return 124
}

# A PCI address as one spelling (nvidia-smi writes 00000000:3B:00.0 in its rows and
# 0000:3b:00.0 in some messages): 8 upper-case hex digits of domain.
bus_key() {
  local domain=${1%%:*}
  printf '%08X:%s\n' "$((16#$domain))" "${1#*:}" | tr 'a-f' 'A-F'
}

BUS_RE='[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]'
YES_RE='^(Yes|YES|yes|1)$'

# The pod's GPUs (the N of its /dev/nvidiaN, as arguments) as the driver reports them: each
# answers nvidia-smi, with no uncorrectable volatile ECC error, no retired page pending, no
# row remapping pending or failed. Its output is parsed strictly: a line of another shape
# is logged, a value the GPU does not report ([N/A], [Not Supported]) is no failure, and a
# GPU that is not the pod's (a privileged pod sees the host's) is not judged.
check_gpus_driver() {
  local tmp rc line minor bus ecc retired pending failure gpu n=0 answered=' ' lost='' missing='' problem
  local -a problems=()
  local -A names=()
  tmp=$(mktemp -d) || { log "no temporary directory: GPUs not asked of the driver"; return 0; }
  bounded "$SMI_SECONDS" "$tmp/gpus" nvidia-smi \
    --query-gpu=minor_number,pci.bus_id,ecc.errors.uncorrected.volatile.total,retired_pages.pending \
    --format=csv,noheader,nounits
  rc=$?
  case $rc in
    124) why="nvidia-smi did not answer within $SMI_SECONDS s" detail=$why; rm -rf "$tmp"; return 1 ;;
    126 | 127) log "nvidia-smi could not run (exit $rc): the GPU devices alone judged"; rm -rf "$tmp"; return 0 ;;
  esac
  # A lost GPU gets a line of its own and no row; nvidia-smi then exits non-zero, the
  # others' rows printed all the same.
  while IFS= read -r line; do
    if [[ $line =~ ^([0-9]{1,6}),\ ($BUS_RE),\ ([^,]*),\ ([^,]*)$ ]]; then
      minor=$((10#${BASH_REMATCH[1]})) bus=$(bus_key "${BASH_REMATCH[2]}") ecc=${BASH_REMATCH[3]} retired=${BASH_REMATCH[4]}
      [[ " $* " == *" $minor "* && $answered != *" $minor "* ]] || continue
      answered+="$minor " n=$((n + 1)) gpu="GPU /dev/nvidia$minor ($bus)" names[$bus]="GPU /dev/nvidia$minor ($bus)"
      if [[ $ecc =~ ^[0-9]{1,18}$ ]] && [ "$ecc" -gt 0 ]; then problems+=("$gpu: $ecc uncorrectable ECC errors"); fi
      if [[ $retired =~ $YES_RE ]]; then problems+=("$gpu: retired pages pending"); fi
    elif [[ $line =~ Unable\ to\ determine\ the\ device\ handle|GPU\ is\ lost ]]; then
      if [[ $line =~ GPU\ is\ lost ]]; then problem="GPU is lost"; else problem="no device handle"; fi
      if [[ $line =~ ($BUS_RE) ]]; then lost+="${lost:+, }$(bus_key "${BASH_REMATCH[1]}"): $problem"; fi
      log "nvidia-smi: ${line:0:300}"
    elif [ -n "$line" ]; then
      log "nvidia-smi (exit $rc), a line not understood: ${line:0:300}"
    fi
  done <"$tmp/gpus"
  if [ "$n" -lt "$#" ]; then
    for minor in "$@"; do [[ $answered == *" $minor "* ]] || missing+="${missing:+, }/dev/nvidia$minor"; done
    why="$n of its $# GPUs answer nvidia-smi (exit $rc)"
    detail="GPU $missing does not answer nvidia-smi${lost:+ ($lost)}"
    [ "$n" -lt $(($# - 1)) ] && detail="GPUs $missing do not answer nvidia-smi${lost:+ ($lost)}"
    rm -rf "$tmp"
    return 1
  fi
  if [ "${#problems[@]}" -eq 0 ]; then
    # Row remapping (A100 and later; older GPUs answer [N/A] or nothing this query knows).
    bounded "$SMI_SECONDS" "$tmp/rows" nvidia-smi \
      --query-remapped-rows=gpu_bus_id,remapped_rows.pending,remapped_rows.failure --format=csv,noheader
    rc=$?
    [ "$rc" != 124 ] || { why="nvidia-smi did not answer within $SMI_SECONDS s" detail=$why; rm -rf "$tmp"; return 1; }
    while IFS= read -r line; do
      if [[ $line =~ ^($BUS_RE),\ ([^,]*),\ ([^,]*)$ ]]; then
        gpu=${names[$(bus_key "${BASH_REMATCH[1]}")]:-} pending=${BASH_REMATCH[2]} failure=${BASH_REMATCH[3]}
        [ -n "$gpu" ] || continue
        if [[ $pending =~ $YES_RE ]]; then problems+=("$gpu: row remapping pending"); fi
        if [[ $failure =~ $YES_RE ]]; then problems+=("$gpu: row remapping failed"); fi
      elif [ -n "$line" ]; then
        log "nvidia-smi --query-remapped-rows (exit $rc), a line not understood: ${line:0:300}"
      fi
    done <"$tmp/rows"
  fi
  rm -rf "$tmp"
  [ "${#problems[@]}" -eq 0 ] && return 0
  why=$(printf '%s; ' "${problems[@]}") why=${why%; }
  detail=${problems[0]}
  [ "${#problems[@]}" -eq 1 ] || detail+=" (and $((${#problems[@]} - 1)) more)"
  return 1
}

# The pod has exactly the GPU devices its gres says (gpus: the count the entrypoint found),
# and where nvidia-smi is on PATH, the driver finds each healthy.
check_gpus() {
  [ -n "$gpus" ] && [ "$gpus" != 0 ] || return 0
  local f minors=()
  for f in "$DEV"/nvidia*; do
    if [[ ${f#"$DEV"/} =~ ^nvidia([0-9]+)$ ]] && [ -c "$f" ] && [ ! -L "$f" ]; then minors+=("${BASH_REMATCH[1]}"); fi
  done
  [ "${#minors[@]}" -eq "$gpus" ] || { why="${#minors[@]} of its $gpus GPU devices present"; return 1; }
  command -v nvidia-smi >/dev/null 2>&1 || return 0
  check_gpus_driver "${minors[@]}"
}

# settle NODE FAILED DETAIL WHY: drain NODE when a check FAILED (its name; DETAIL follows it in
# the reason, WHY goes to the log), unless it is drained for a reason not the health check's;
# resume it when none failed and the drain is the health check's own.
settle() {
  local node=$1 failed=$2 detail=${3:0:200} why=$4 state reason want drained=0
  state=$(timeout 10 sinfo -h -n "$node" -o '%T' 2>/dev/null | head -n 1)
  reason=$(timeout 10 sinfo -h -n "$node" -o '%E' 2>/dev/null | head -n 1)
  [ -n "$state" ] || { log "node $node not known to slurmctld (yet): nothing changed"; return 0; }
  case $state in *drain* | *DRAIN*) drained=1 ;; esac
  if [ -n "$failed" ]; then
    want="$PREFIX $failed${detail:+: $detail}"
    if [ "$drained" = 0 ] || { [[ $reason == "$PREFIX"* ]] && [ "$reason" != "$want" ]; }; then
      log "node $node failed the $failed check ($why): draining it"
      timeout 10 scontrol update nodename="$node" state=drain reason="$want" || log "could not drain $node"
    fi
  elif [ "$drained" = 1 ] && [[ $reason == "$PREFIX"* ]]; then
    log "node $node passes every check again: resuming it ($reason cleared)"
    timeout 10 scontrol update nodename="$node" state=resume || log "could not resume $node"
  fi
}

# Run as a program (not sourced, as the tests do): the checks this node's slurm.conf names.
[[ ${BASH_SOURCE[0]} == "$0" ]] || return 0

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
spool=$(sed -n 's/^SlurmdSpoolDir=//p' "$conf" | tail -n 1)
[ -z "$spool" ] || SPOOL=$spool
checks=$(setting HealthChecks)
shared=$(setting HealthSharedPaths)
min_disk=$(setting HealthMinFreeDisk)
min_memory=$(setting HealthMinAvailableMemory)

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

failed='' why='' detail=''
for check in $checks; do
  case $check in
    gpus) check_gpus ;;
    munge) check_munge ;;
    sharedStorage) check_sharedStorage ;;
    disk) check_disk "$min_disk" ;;
    memory) check_memory "$min_memory" ;;
    *) log "unknown check '$check' in $conf: skipped"; true ;;
  esac || { failed=$check; break; }
done
if [ -z "$failed" ] && [ -d /etc/slurmk8s/health.d ]; then
  for script in /etc/slurmk8s/health.d/*; do
    name=${script##*/}
    # ConfigMap keys: letters, digits, '-', '_', '.'; the kubelet's ..data entries are not checks.
    if ! [[ $name =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] || [ ! -f "$script" ]; then continue; fi
    if ! run_site_check "$script"; then
      failed=$name why="exited non-zero or took over $CHECK_SECONDS s"
      break
    fi
  done
fi

settle "$node" "$failed" "$detail" "$why"
exit 0
