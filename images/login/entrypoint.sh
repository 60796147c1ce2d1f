#!/bin/bash
# Entrypoint of the slurmk8s login image (/usr/local/bin/slurmk8s-entrypoint).
#
#   slurmk8s-entrypoint [SSHD_ARGS...]   set up users, their keys, munge and the
#                                        host key, then run sshd in the foreground
#   slurmk8s-entrypoint ready            exit 0 when sshd accepts connections
#
# Users come from /run/slurmk8s/users/passwd (same uid/gid in every pod of the
# cluster). A user's authorized keys are the inline ones
# (/run/slurmk8s/users/<user>.authorized_keys) plus those of a Secret
# (/run/slurmk8s/user-keys/<user>); they are written, as that user, into a
# marked block of ~/.ssh/authorized_keys, so keys a user added outside the block
# survive a restart when the home directory is persistent. Keys from both are
# checked by the rule the API applies to inline keys (sk_valid_keys): a line
# with options such as command= or from= is skipped.
set -euo pipefail
SK_COMPONENT=login
here=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")
lib=$here/../common/slurmk8s-lib.sh
[ -r "$lib" ] || lib=/usr/local/lib/slurmk8s/lib.sh
# shellcheck source=images/common/slurmk8s-lib.sh
. "$lib"

sshd_config=$here/sshd_config
[ -r "$sshd_config" ] || sshd_config=/etc/ssh/sshd_config.slurmk8s
port=$(sk_conf_value "$sshd_config" Port)
port=${port:-22}
# Where the host key goes: a directory of the pod's own (not /etc/ssh, which in
# the sandbox is the host's).
keydir=/run/slurmk8s-sshd

if [ "${1:-}" = ready ]; then
  sk_port_open 127.0.0.1 "$port" || { echo "sshd does not accept connections on port $port" >&2; exit 1; }
  exit 0
fi

sk_is_root || sk_die "the login entrypoint must run as root (sshd switches to each user itself)"
[ -r /etc/slurm/slurm.conf ] || sk_die "/etc/slurm/slurm.conf is missing: mount the <cluster>-slurm-config ConfigMap at /etc/slurm"

BEGIN_MARK="# BEGIN slurmk8s keys (rewritten when the login pod starts; add your own keys outside this block)"
END_MARK="# END slurmk8s keys"

# user_keys NAME: the user's keys from both sources, one per line, each a
# plain OpenSSH public key (no options).
user_keys() {
  local f
  for f in "$SK_USERS_DIR/$1.authorized_keys" "$SK_USER_KEYS_DIR/$1"; do
    if [ -r "$f" ]; then
      sk_valid_keys "$f (keys of $1)" <"$f"
    fi
  done
  return 0
}

# install_keys NAME UID GID HOME: write the keys block as the user (so that
# nothing in a user-controlled home is written by root).
install_keys() {
  local name=$1 uid=$2 gid=$3 home=$4 keys count
  keys=$(user_keys "$name")
  count=$(awk 'NF' <<<"$keys" | wc -l)
  if [ "$count" -eq 0 ]; then
    sk_log "warning: user $name has no SSH keys (spec.login.users[].sshPublicKeys or sshPublicKeysFrom): they cannot log in"
  fi
  # shellcheck disable=SC2016 # the script runs as the user, in its own bash
  if ! printf '%s\n%s\n%s\n' "$BEGIN_MARK" "$keys" "$END_MARK" |
    setpriv --reuid="$uid" --regid="$gid" --clear-groups -- bash -c '
      set -e
      umask 077
      mkdir -p "$1/.ssh"
      chmod go-w "$1/.ssh"  # StrictModes: writable by its owner only
      f=$1/.ssh/authorized_keys
      {
        if [ -f "$f" ]; then sed "/^# BEGIN slurmk8s keys/,/^# END slurmk8s keys/d" "$f"; fi
        awk NF
      } >"$f.slurmk8s-new"
      mv -f "$f.slurmk8s-new" "$f"
      chmod 0600 "$f"' _ "$home"; then
    sk_log "warning: could not write $home/.ssh/authorized_keys as $name (uid $uid): is $home owned by $name?"
    return 0
  fi
  sk_log "installed $count SSH key(s) for $name in $home/.ssh/authorized_keys"
}

# Each user gets a directory of their own on every writable shared volume
# (SLURMK8S_SHARED_DIRS) and under the checkpoint root
# (SLURMK8S_CHECKPOINT_ROOT), so their files there belong to them. A volume
# that does not let root create or give away directories (an EFS access
# point, root-squashed NFS) gets what it allows, and a warning that says what
# it must allow (sk_user_dir); the pod starts either way.
prepare_shared_dirs() {
  local parent name uid gid home
  if [ -n "${SLURMK8S_CHECKPOINT_ROOT:-}" ] && [ ! -e "$SLURMK8S_CHECKPOINT_ROOT" ] && [ ! -L "$SLURMK8S_CHECKPOINT_ROOT" ]; then
    if ! install -d -m 0755 "$SLURMK8S_CHECKPOINT_ROOT" 2>/dev/null; then
      sk_log "warning: could not create the checkpoint directory $SLURMK8S_CHECKPOINT_ROOT: root may not write in $(dirname "$SLURMK8S_CHECKPOINT_ROOT") (root-squashed NFS?); create it on the file server, mode 1777 or owned by root with no_root_squash"
    fi
  fi
  for parent in ${SLURMK8S_SHARED_DIRS:-} ${SLURMK8S_CHECKPOINT_ROOT:-}; do
    if [ ! -d "$parent" ] || [ -L "$parent" ]; then
      sk_log "warning: shared directory $parent is missing (not mounted, or not created) or a link; no user directories there"
      continue
    fi
    sk_users_each | while read -r name uid gid home; do
      sk_user_dir "$parent" "$name" "$uid" "$gid"
    done
  done
}

sk_setup_users
prepare_shared_dirs
sk_users_each | while read -r name uid gid home; do
  if [ -d "$home" ]; then
    install_keys "$name" "$uid" "$gid" "$home"
  else
    sk_log "warning: home directory $home of $name is missing; no keys installed"
  fi
done

sk_start_munge

install -d -m 0700 "$keydir"
host_key=$SK_SSH_HOST_KEYS_DIR/ssh_host_ed25519_key
if [ -r "$host_key" ]; then
  install -m 0600 "$host_key" "$keydir/ssh_host_ed25519_key"
  ssh-keygen -y -f "$keydir/ssh_host_ed25519_key" >"$keydir/ssh_host_ed25519_key.pub"
else
  sk_log "warning: no host key at $host_key (the <cluster>-ssh-host-keys Secret): generating one for this pod only, so its fingerprint changes with every restart"
  rm -f "$keydir/ssh_host_ed25519_key" "$keydir/ssh_host_ed25519_key.pub"
  ssh-keygen -q -t ed25519 -N '' -C "slurmk8s-login" -f "$keydir/ssh_host_ed25519_key"
fi
sk_log "host key: $(ssh-keygen -l -f "$keydir/ssh_host_ed25519_key.pub")"

# The sshd_config sshd runs with: the image's, and with a directory
# (spec.identity.ldap: SLURMK8S_DIRECTORY set) its users' keys from SSSD through
# the helper that also makes their directories at their first login, and only
# the members of spec.identity.ldap.loginGroups (SLURMK8S_LOGIN_GROUPS) or of a
# group of spec.login.users let in.
effective=$keydir/sshd_config
cp "$sshd_config" "$effective"
if [ -n "${SLURMK8S_DIRECTORY:-}" ]; then
  # shellcheck disable=SC2086 # each a path without spaces (the API allows none)
  printf '%s\n' ${SLURMK8S_SHARED_DIRS:-} ${SLURMK8S_CHECKPOINT_ROOT:-} >"$keydir/user-dir-parents"
  {
    echo "AuthorizedKeysCommand /usr/local/lib/slurmk8s/authorized-keys %u"
    echo "AuthorizedKeysCommandUser root"
  } >>"$effective"
  if [ -n "${SLURMK8S_LOGIN_GROUPS:-}" ]; then
    local_groups=$(awk -F: 'NF == 4 && $1 !~ /^#/ { printf " %s", $1 }' "$SK_USERS_DIR/group" 2>/dev/null || true)
    echo "AllowGroups $SLURMK8S_LOGIN_GROUPS$local_groups" >>"$effective"
  fi
  sk_log "directory users log in with their keys from SSSD${SLURMK8S_LOGIN_GROUPS:+ (groups: $SLURMK8S_LOGIN_GROUPS, and spec.login.users)}"
fi

# sshd's privilege separation directory.
install -d -m 0755 /run/sshd
/usr/sbin/sshd -t -f "$effective" || sk_die "sshd rejects $effective (see above)"
sk_run /usr/sbin/sshd -D -e -f "$effective" "$@"
