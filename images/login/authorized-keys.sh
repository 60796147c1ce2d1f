#!/bin/bash
# sshd's AuthorizedKeysCommand on a login pod whose cluster reads users from a
# directory (spec.identity.ldap): /usr/local/lib/slurmk8s/authorized-keys USER.
#
# Prints USER's OpenSSH public keys from the directory, each by the rule
# spec.login.users' keys follow (no options). The sssd container beside this
# one answers on a socket of its own (images/sssd/keys-of.sh: SSSD's
# sss_ssh_authorizedkeys, from its cache while the directory is down), so
# this image needs none of SSSD's daemon packages. When USER has keys, it
# first gives a user who never logged in their home directory and their
# directories on shared storage, as the login entrypoint does for
# spec.login.users at start. Runs as root (sshd's AuthorizedKeysCommandUser)
# for that; it never follows a link a user made (sk_user_dir), and USER is
# checked before anything uses it. An account of the pod's own files (the
# image's, spec.login.users) is never the directory's: their keys are in their
# ~/.ssh/authorized_keys, and the directory is not asked (sk_directory_user).
set -uo pipefail
# sshd runs this with an empty environment: what the entrypoint knew is in files.
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
SK_COMPONENT=login-keys
# The shared directories where each user gets one of their own (the entrypoint writes it).
parents_file=/run/slurmk8s-sshd/user-dir-parents
here=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")
lib=$here/../common/slurmk8s-lib.sh
[ -r "$lib" ] || lib=/usr/local/lib/slurmk8s/lib.sh
# shellcheck source=images/common/slurmk8s-lib.sh
. "$lib"

user=${1:-}
LC_ALL=C
sk_directory_user "$user" || exit 0
keys=$(printf '%s\n' "$user" | timeout 15 nc -N -U /var/lib/sss/pipes/private/slurmk8s-keys 2>/dev/null \
  | sk_valid_keys "the directory's keys of $user") || keys=
[ -n "$keys" ] || exit 0

IFS=: read -r _ _ uid gid _ home _ < <(getent passwd -- "$user") || exit 0
if [[ $uid =~ ^[0-9]+$ && $gid =~ ^[0-9]+$ && $uid -ge 1000 ]]; then
  # The home directory: under /home, made once; its contents are the user's.
  if [ "$home" = "/home/$user" ] && [ ! -e "$home" ] && [ ! -L "$home" ]; then
    sk_user_dir /home "$user" "$uid" "$gid" >&2
    chmod 0700 "$home" 2>/dev/null || true
  fi
  while read -r parent; do
    if [ -d "$parent" ] && [ ! -L "$parent" ] && [ ! -e "$parent/$user" ] && [ ! -L "$parent/$user" ]; then
      sk_user_dir "$parent" "$user" "$uid" "$gid" >&2
    fi
  done < <(cat "$parents_file" 2>/dev/null)
fi
printf '%s\n' "$keys"
