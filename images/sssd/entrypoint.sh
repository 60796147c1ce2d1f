#!/bin/bash
# Entrypoint of the slurmk8s sssd image (/usr/local/bin/slurmk8s-entrypoint).
#
#   slurmk8s-entrypoint          write /etc/sssd/sssd.conf (the rendered one from the
#                                <cluster>-sssd ConfigMap plus the bind password from
#                                its Secret), then run sssd in the foreground, and
#                                the login pod's key socket beside it (keys-of.sh)
#                                and, with PROBE_SECONDS set, a probe of the
#                                directory that often (probe.sh: reachable, TLS,
#                                bind; its verdict in /var/lib/sss/pipes/slurmk8s-directory,
#                                and the members of the groups accounts follow in
#                                /var/lib/sss/pipes/slurmk8s-groups)
#   slurmk8s-entrypoint ready    exit 0 when sssd's and the key socket are there for
#                                the Slurm container (a directory that is down does
#                                not make it unready: cached users still resolve)
#
# Mounts (slurmk8s/render/identity.py): /run/slurmk8s/sssd/sssd.conf,
# /run/slurmk8s/ldap-bind/password (root's), /run/slurmk8s/ldap-ca/ca.crt,
# and the emptyDirs /var/lib/sss/pipes and /var/lib/sss/mc (shared with the
# Slurm container) and /var/lib/sss/db (the cache, which outlives a restart
# of this container).
set -euo pipefail
SK_COMPONENT=sssd
here=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")
lib=$here/../common/slurmk8s-lib.sh
[ -r "$lib" ] || lib=/usr/local/lib/slurmk8s/lib.sh
# shellcheck source=images/common/slurmk8s-lib.sh
. "$lib"

rendered=$SK_MOUNTS/sssd/sssd.conf
password_file=$SK_MOUNTS/ldap-bind/password
pipes=/var/lib/sss/pipes
keys_socket=$pipes/private/slurmk8s-keys
# The probe's verdict on the directory, and the members of the groups accounts
# follow, which the agent beside slurmctld reads (slurmk8s/slurm/directory.py).
verdict=$pipes/slurmk8s-directory
members=$pipes/slurmk8s-groups

if [ "${1:-}" = ready ]; then
  for s in "$pipes/nss" "$keys_socket"; do
    [ -S "$s" ] || { echo "the socket $s is not there yet" >&2; exit 1; }
  done
  exit 0
fi

sk_is_root || sk_die "the sssd entrypoint must run as root (sssd reads its root-only config and serves every user)"
[ -r "$rendered" ] || sk_die "$rendered is missing: mount the <cluster>-sssd ConfigMap at $SK_MOUNTS/sssd"

umask 077
install -d -m 0711 /etc/sssd
tmp=$(mktemp /etc/sssd/.sssd.conf.XXXXXX)
cp "$rendered" "$tmp"
if [ -e "$password_file" ]; then
  # One line, as the operator checked it (slurmk8s/api/secrets.py BIND_PASSWORD_RE);
  # sssd.conf reads a value to the end of its line. The rendered file ends in the
  # directory's domain section, where the password belongs.
  password=$(head -n 1 "$password_file")
  LC_ALL=C
  if ! [[ $password =~ ^[!-~]{1,256}$ ]]; then
    rm -f "$tmp"
    sk_die "the bind password in $password_file must be 1 to 256 printable ASCII characters without spaces: fix the Secret that spec.identity.ldap.bindPasswordSecret names"
  fi
  printf 'ldap_default_authtok = %s\n' "$password" >>"$tmp"
  unset password
fi
chmod 0600 "$tmp"
mv -f "$tmp" /etc/sssd/sssd.conf

# The sockets' directory is an emptyDir the Slurm container reads: root's, and
# others may only reach the sockets in it (private/ stays root's).
install -d -m 0755 "$pipes" /var/lib/sss/mc
install -d -m 0700 "$pipes/private" /var/lib/sss/db
# A socket or pid file left by an earlier run of this container would make sssd refuse to start.
rm -f /var/run/sssd.pid /run/sssd.pid "$keys_socket" "$verdict" "$members"
socat "UNIX-LISTEN:$keys_socket,fork,mode=600" EXEC:/usr/local/lib/slurmk8s/keys-of &
relay=$!
# The directory's health, for the cluster's status (probe.sh): every PROBE_SECONDS,
# which the operator sets in the controller pod's sssd container only.
helpers=("$relay")
if [[ ${PROBE_SECONDS:-} =~ ^[1-9][0-9]{0,3}$ ]]; then
  (
    while true; do
      /usr/local/lib/slurmk8s/probe /etc/sssd/sssd.conf "$password_file" "$verdict" \
        "$SK_MOUNTS/sssd/groups" "$members" || true
      sleep "$PROBE_SECONDS"
    done
  ) &
  helpers+=("$!")
fi
# shellcheck disable=SC2317 # run from a trap
stop_helpers() { kill "${helpers[@]}" 2>/dev/null || true; }
trap stop_helpers EXIT
sk_log "answering key questions on $keys_socket; starting sssd for $(sed -n 's/^ldap_uri = //p' /etc/sssd/sssd.conf)"
sk_run sssd -i --logger=stderr
