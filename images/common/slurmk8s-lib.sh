# shellcheck shell=bash
# Shared code of the slurmk8s image entrypoints; sourced, never run.
#
# In an image this file is /usr/local/lib/slurmk8s/lib.sh. The sandbox runs the
# entrypoints straight from the repository, where it is
# images/common/slurmk8s-lib.sh. Everything here works inside a container's
# own view of the file system: it touches /etc/passwd, /etc/group,
# /etc/munge, /run, /home and the spool directories of the pod only (the
# sandbox gives each pod private copies of those), never systemd.
#
# The paths below are the contract with the renderer
# (slurmk8s/render/manifests.py); images/README.md describes it.

SK_MOUNTS=/run/slurmk8s
SK_MUNGE_KEY=$SK_MOUNTS/munge/munge.key
SK_USERS_DIR=$SK_MOUNTS/users
# shellcheck disable=SC2034 # used by the login entrypoint
SK_USER_KEYS_DIR=$SK_MOUNTS/user-keys
# shellcheck disable=SC2034 # used by the login entrypoint
SK_SSH_HOST_KEYS_DIR=$SK_MOUNTS/ssh-host-keys
SK_MUNGE_SOCKET=/run/munge/munge.socket.2
SK_MUNGED_PID=
SK_MAIN_PID=
SK_MAIN_CMD=

# The component name in log lines; each entrypoint sets it before sourcing.
: "${SK_COMPONENT:=slurmk8s}"

sk_log() {
  printf 'slurmk8s-entrypoint[%s]: %s\n' "$SK_COMPONENT" "$*" >&2
}

sk_die() {
  sk_log "error: $*"
  exit 1
}

sk_is_root() {
  [ "$(id -u)" -eq 0 ]
}

# sk_require_env NAME...: fail with a clear message if a variable is unset or empty.
sk_require_env() {
  local name
  for name in "$@"; do
    if [ -z "${!name:-}" ]; then
      sk_die "environment variable $name is not set: the pod spec the slurmk8s operator renders sets it; set it by hand when running the image outside Kubernetes"
    fi
  done
}

# sk_port_open HOST PORT: true when a TCP connection to HOST:PORT succeeds within 2 s.
sk_port_open() {
  # shellcheck disable=SC2016 # expanded by the inner bash
  timeout 2 bash -c 'exec 3<>"/dev/tcp/$1/$2"' _ "$1" "$2" 2>/dev/null
}

# sk_wait_port HOST PORT SECONDS WHY HINT: wait until HOST:PORT accepts
# connections, saying every 10 s what for (WHY) and what to check (HINT);
# fail after SECONDS, or wait as long as it takes when SECONDS is 0.
sk_wait_port() {
  local host=$1 port=$2 limit=$3 why=$4 hint=$5 start=$SECONDS next=0
  while ! sk_port_open "$host" "$port"; do
    if [ "$limit" -gt 0 ] && [ $((SECONDS - start)) -ge "$limit" ]; then
      sk_die "$host:$port did not answer within ${limit}s: $hint"
    fi
    if [ "$SECONDS" -ge "$next" ]; then
      sk_log "$why: waiting for $host:$port ($((SECONDS - start))s$([ "$limit" -gt 0 ] && echo " of ${limit}s")): $hint"
      next=$((SECONDS + 10))
    fi
    sleep 1
  done
}

# sk_conf_value FILE KEY: the value of KEY= in a slurm.conf-style file (keys are case-insensitive).
sk_conf_value() {
  awk -v key="$2" '
    { sub(/#.*/, "") }
    {
      n = split($0, words, /[ \t]+/)
      for (i = 1; i <= n; i++) {
        eq = index(words[i], "=")
        if (eq > 1 && tolower(substr(words[i], 1, eq - 1)) == tolower(key)) { print substr(words[i], eq + 1); exit }
      }
    }' "$1"
}

# --- users -------------------------------------------------------------------

# _sk_merge_db FRAGMENT TARGET FIELDS: append the lines of FRAGMENT whose name
# (first field) TARGET lacks. Appends in place: TARGET may be a bind mount.
_sk_merge_db() {
  local fragment=$1 target=$2 fields=$3 line name id added=0 other
  if [ ! -e "$fragment" ]; then
    sk_log "no $fragment: no entries to add to $target"
    return 0
  fi
  # A last line without a newline would be glued to the first appended one.
  if [ -s "$target" ] && [ -n "$(tail -c1 "$target")" ]; then
    printf '\n' >>"$target"
  fi
  while IFS= read -r line || [ -n "$line" ]; do
    case $line in '' | '#'*) continue ;; esac
    if [ "$(awk -F: '{ print NF }' <<<"$line")" -ne "$fields" ]; then
      sk_log "warning: skipping malformed line in $fragment (want $fields fields): $line"
      continue
    fi
    name=${line%%:*}
    if cut -d: -f1 "$target" | grep -qxF -- "$name"; then
      continue
    fi
    id=$(cut -d: -f3 <<<"$line")
    other=$(awk -F: -v id="$id" '$3 == id { print $1; exit }' "$target")
    if [ -n "$other" ]; then
      sk_log "warning: $name's id $id is already taken by $other in $target; files owned by $id will show as $other"
    fi
    printf '%s\n' "$line" >>"$target"
    added=$((added + 1))
  done <"$fragment"
  sk_log "added $added entries from $fragment to $target"
}

# _sk_shadow_entries: an /etc/shadow line, with no password that can match
# ("*"), for each user of the users ConfigMap that has none: PAM's account
# check (su, runuser -l, cron) refuses a user without one. Users log in with
# their SSH keys, which "*" does not lock.
_sk_shadow_entries() {
  local name added=0
  [ -w /etc/shadow ] || return 0
  while read -r name _; do
    if ! cut -d: -f1 /etc/shadow | grep -qxF -- "$name"; then
      printf '%s:*:%s:0:99999:7:::\n' "$name" "$(($(date +%s) / 86400))" >>/etc/shadow
      added=$((added + 1))
    fi
  done < <(sk_users_each)
  [ "$added" -eq 0 ] || sk_log "added $added entries to /etc/shadow (no password: SSH keys only)"
}

# sk_follow_users SECONDS [COMMAND...]: merge the users ConfigMap again every
# SECONDS in the background, so that users added to spec.login.users (the
# kubelet updates the mounted ConfigMap) get names in this pod without a
# restart; when a merge added someone, run COMMAND. Merging only adds.
sk_follow_users() {
  local every=$1
  shift
  (
    while sleep "$every"; do
      before=$(wc -l </etc/passwd)
      sk_setup_users >/dev/null 2>&1 || true
      if [ "$(wc -l </etc/passwd)" -gt "$before" ] && [ $# -gt 0 ]; then
        sk_log "new users in /etc/passwd: running $*"
        "$@" || sk_log "warning: $* failed"
      fi
    done
  ) &
}

# sk_users_each: print "name uid gid home" for each user of the users ConfigMap.
sk_users_each() {
  [ -r "$SK_USERS_DIR/passwd" ] || return 0
  awk -F: 'NF == 7 && $1 !~ /^#/ { print $1, $3, $4, $6 }' "$SK_USERS_DIR/passwd"
}

# sk_directory_user NAME: succeeds when the directory (spec.identity.ldap) may
# answer for NAME: a user name (slurmk8s/api/fields.py, POSIX_NAME_RE) that is
# not an account of the pod's own files (/etc/passwd: the image's accounts, and
# spec.login.users once sk_setup_users merged them), which win over the directory.
sk_directory_user() {
  LC_ALL=C
  [[ ${1:-} =~ ^[a-z_][a-z0-9_-]{0,31}$ ]] || return 1
  ! getent -s files passwd -- "$1" >/dev/null 2>&1
}

# sk_valid_keys [WHAT]: copy the OpenSSH public keys on stdin to stdout, one
# per line, by the rule spec.login.users[].sshPublicKeys follows
# (slurmk8s/api/fields.py, SSH_KEY_RE): '<type> <base64> [comment]' of
# printable ASCII, a known type, at most 16384 characters, and no
# authorized_keys options (command=, from=, environment=, ...). Blank lines
# and comments are dropped; any other line is dropped and its number logged
# (not its text) as a line of WHAT.
sk_valid_keys() {
  LC_ALL=C awk -v what="${1:-stdin}" '
    /^$/ || /^#/ { next }
    length($0) <= 16384 && $0 ~ /^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp256|ecdsa-sha2-nistp384|ecdsa-sha2-nistp521|sk-ssh-ed25519@openssh[.]com|sk-ecdsa-sha2-nistp256@openssh[.]com) [A-Za-z0-9+\/]+=?=?=?( [ -~]*)?$/ { print; next }
    { printf "slurmk8s-entrypoint: warning: line %d of %s is not an OpenSSH public key without options (\"<type> <base64> [comment]\"): skipped\n", NR, what > "/dev/stderr" }'
}

# sk_user_dir PARENT NAME UID GID: PARENT/NAME for a user on shared storage,
# created once and owned by the user. An existing entry is left alone (never
# chowned or followed: it may be the user's own symlink), with a warning when
# it is not the user's own directory (someone else may have made it first).
# Users may write to PARENT, so nothing here follows what they can make: mkdir
# (no -p) fails on any entry made since the check, and chown -h changes a link
# swapped in after mkdir, never what it points to.
#
# Not every volume lets root give a directory away. Root-squashed NFS makes
# root "nobody" there (it may create only where nobody may write, and chown
# nothing); an EFS access point does every operation as the access point's
# own uid (chown is refused, every file is that uid's). So when root may not
# create the directory or give it to the user, the user makes it: on
# root-squashed NFS whose PARENT users may write (mode 1777, as /tmp) it is
# then the user's own. What the volume does not allow is logged with what it
# must allow, and the caller goes on: a volume that refuses chown never
# stops the pod.
sk_user_dir() {
  local dir=$1/$2 owner must
  must="For a directory of each user's own in $1 the volume must let root change owners (NFS exported with no_root_squash; EFS mounted without an access point), or let users create entries in $1 (mode 1777, as /tmp), or the directories must be made on the file server, each owned by its user."
  if [ -e "$dir" ] || [ -L "$dir" ]; then
    if [ -L "$dir" ] || [ ! -d "$dir" ] || [ "$(stat -c %u -- "$dir")" != "$3" ]; then
      sk_log "warning: $dir is a link, not a directory, or not $2's: left alone; remove it so that $2 gets a directory of their own"
    fi
    return 0
  fi
  if mkdir -m 0755 -- "$dir" 2>/dev/null; then
    if chown -h -- "$3:$4" "$dir" 2>/dev/null; then
      sk_log "created $dir for $2"
      return 0
    fi
    # Made, but root may not give it away. Empty and root's (or the volume's
    # one owner's): taken back, so that the user can make it their own.
    if ! rmdir -- "$dir" 2>/dev/null; then
      sk_log "warning: $1 does not let root change owners (chown is not permitted: an EFS access point, or root-squashed NFS), and $dir could not be removed again: it stays owned by uid $(stat -c %u -- "$dir" 2>/dev/null || echo '?'), not $2 (uid $3). $must"
      return 0
    fi
  fi
  if setpriv --reuid="$3" --regid="$4" --clear-groups -- mkdir -m 0755 -- "$dir" 2>/dev/null; then
    owner=$(stat -c %u -- "$dir" 2>/dev/null || echo '?')
    if [ "$owner" = "$3" ]; then
      sk_log "created $dir for $2, as $2: $1 does not let root make it (chown is not permitted, or root may not write there: root-squashed NFS)"
      return 0
    fi
    sk_log "warning: created $dir for $2, but the volume made it uid $owner's, not $2's (uid $3): $1 gives every file one owner and refuses chown, as an EFS access point does; every user works there as uid $owner. $must"
    return 0
  fi
  sk_log "warning: could not create $dir for $2: root may not create it and give it to $2 (chown is not permitted, or root may not write there: root-squashed NFS), and $2 may not create it either. $must"
  return 0
}

# sk_fix_home NAME UID GID HOME: make HOME, an existing directory, belong to
# the user and be writable by nobody else, as sshd's StrictModes requires.
# A link is left alone (never followed as root); the mode is changed as the
# user, so nothing in a user's home is changed by root but its owner.
sk_fix_home() {
  local name=$1 uid=$2 gid=$3 home=$4 owner
  if [ -L "$home" ]; then
    sk_log "warning: home directory $home of $name is a symbolic link: left as it is (sshd may refuse its keys)"
    return 0
  fi
  [ -d "$home" ] || return 0
  owner=$(stat -c '%u:%g' -- "$home")
  if [ "$owner" != "$uid:$gid" ]; then
    if ! chown -h -- "$uid:$gid" "$home" 2>/dev/null; then
      sk_log "warning: home directory $home of $name belongs to $owner and root may not give it to $uid:$gid: its volume does not allow chown (an EFS access point, or root-squashed NFS); sshd may refuse $name's keys there. Mount that volume so that root may change owners, or give the directory to $name on the file server"
      return 0
    fi
    sk_log "home directory $home of $name belonged to $owner: now to $uid:$gid"
  fi
  if [ -n "$(find "$home" -maxdepth 0 -perm /022)" ]; then
    if setpriv --reuid="$uid" --regid="$gid" --clear-groups -- chmod go-w -- "$home"; then
      sk_log "home directory $home of $name was writable by others: no longer"
    else
      sk_log "warning: could not make $home of $name writable by $name only (sshd will refuse its keys)"
    fi
  fi
}

# sk_setup_users: the cluster's users and groups (same uid/gid in every pod)
# and their home directories, each owned by its user.
sk_setup_users() {
  local name uid gid home
  if ! sk_is_root; then
    sk_log "not root: leaving /etc/passwd and /etc/group as they are"
    return 0
  fi
  _sk_merge_db "$SK_USERS_DIR/group" /etc/group 4
  _sk_merge_db "$SK_USERS_DIR/passwd" /etc/passwd 7
  _sk_shadow_entries
  sk_users_each | while read -r name uid gid home; do
    case $home in /?*) ;; *) sk_log "warning: $name has no absolute home directory ($home)"; continue ;; esac
    if [ ! -e "$home" ] && [ ! -L "$home" ]; then
      if install -d -m 0700 -o "$uid" -g "$gid" "$home" 2>/dev/null; then
        sk_log "created home directory $home of $name"
      else
        sk_log "warning: could not create home directory $home of $name owned by $uid:$gid: on shared storage its volume must let root write and change owners (NFS exported with no_root_squash; EFS mounted without an access point)"
        if [ -d "$home" ] && [ ! -L "$home" ]; then sk_fix_home "$name" "$uid" "$gid" "$home"; fi
      fi
    else
      sk_fix_home "$name" "$uid" "$gid" "$home"
    fi
  done
}

# --- munge ---------------------------------------------------------------------

# sk_start_munge: install the cluster's munge key and run munged (as user
# munge, in the foreground, as a child of this shell so it is stopped with the
# pod). Fails unless a credential can be made and decoded.
sk_start_munge() {
  local i
  [ -r "$SK_MUNGE_KEY" ] || sk_die "munge key $SK_MUNGE_KEY is missing: mount the <cluster>-munge-key Secret there (the slurmk8s operator creates it)"
  getent passwd munge >/dev/null || sk_die "user munge does not exist: install the Debian munge package in the image"
  install -d -o munge -g munge -m 0700 /etc/munge
  install -o munge -g munge -m 0400 "$SK_MUNGE_KEY" /etc/munge/munge.key
  install -d -o munge -g munge -m 0755 /run/munge
  # The seed file lives in /run so that nothing outside the pod is written.
  setpriv --reuid=munge --regid=munge --init-groups -- \
    munged --foreground --seed-file=/run/munge/munged.seed &
  SK_MUNGED_PID=$!
  # Whatever way this shell ends, munged goes with it.
  trap sk_stop_munge EXIT
  # Asked every 50 ms: a lent node's slurmd waits on this to register.
  for i in $(seq 1 200); do
    if [ -S "$SK_MUNGE_SOCKET" ] && munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
      sk_log "munged is running (pid $SK_MUNGED_PID)"
      return 0
    fi
    kill -0 "$SK_MUNGED_PID" 2>/dev/null || sk_die "munged exited (see its messages above): check the munge key Secret ($SK_MUNGE_KEY) holds the cluster's key"
    [ "$i" -lt 200 ] && sleep 0.05
  done
  sk_die "munged did not answer on $SK_MUNGE_SOCKET within 10s"
}

sk_stop_munge() {
  if [ -n "$SK_MUNGED_PID" ] && kill -0 "$SK_MUNGED_PID" 2>/dev/null; then
    kill -TERM "$SK_MUNGED_PID" 2>/dev/null || true
    wait "$SK_MUNGED_PID" 2>/dev/null || true
  fi
  SK_MUNGED_PID=
}

# --- running the main process --------------------------------------------------

# sk_forward SIGNAL: pass a signal on to the main process.
sk_forward() {
  if [ -n "$SK_MAIN_PID" ]; then
    sk_log "got SIG$1: passing it on to pid $SK_MAIN_PID"
    kill -s "$1" "$SK_MAIN_PID" 2>/dev/null || true
  fi
}

# sk_run COMMAND...: run the component's daemon as a child, pass SIGTERM,
# SIGINT and SIGHUP on to it, stop munged when it ends and exit with its
# status. (Not exec: munged is our child too, and must not outlive the pod
# where nothing else reaps it, as in the sandbox.) An entrypoint may set its
# own TERM trap after calling sk_spawn and before sk_supervise instead.
sk_run() {
  sk_spawn "$@"
  trap 'sk_forward TERM' TERM
  trap 'sk_forward INT' INT
  trap 'sk_forward HUP' HUP
  sk_supervise
}

sk_spawn() {
  sk_log "starting: $*"
  SK_MAIN_CMD=$1
  "$@" &
  SK_MAIN_PID=$!
}

sk_supervise() {
  local rc
  # `wait` returns early when a trapped signal arrives; wait again until the
  # process is gone, then once more for its exit status.
  while kill -0 "$SK_MAIN_PID" 2>/dev/null; do
    wait "$SK_MAIN_PID" || true
  done
  rc=0
  wait "$SK_MAIN_PID" || rc=$?
  sk_log "${SK_MAIN_CMD##*/} exited with status $rc"
  sk_stop_munge
  exit "$rc"
}

# sk_quick COMMAND...: run a command for a readiness check, bounded so the
# check answers within the probe's timeoutSeconds (5).
sk_quick() {
  timeout "${SK_READY_TIMEOUT:-4}" "$@"
}

# sk_ranges N...: ascending numbers as the suffix of a Slurm hostlist
# expression: 4 5 6 7 -> [4-7]; 1 3 4 -> [1,3-4]; 5 -> 5.
sk_ranges() {
  if [ $# -eq 1 ]; then printf '%s' "$1"; return; fi
  local out='' start='' prev='' n
  for n in "$@" ''; do
    if [ -n "$start" ] && { [ -z "$n" ] || [ "$n" -ne $((prev + 1)) ]; }; then
      out+="${out:+,}$start"
      [ "$start" = "$prev" ] || out+="-$prev"
      start=''
    fi
    [ -z "$n" ] && break
    [ -z "$start" ] && start=$n
    prev=$n
  done
  printf '[%s]' "$out"
}
