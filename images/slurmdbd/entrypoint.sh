#!/bin/bash
# Entrypoint of the slurmk8s slurmdbd image (/usr/local/bin/slurmk8s-entrypoint).
#
#   slurmk8s-entrypoint [SLURMDBD_ARGS...]   set up the pod, wait for the
#                                            database, then run slurmdbd in the
#                                            foreground
#   slurmk8s-entrypoint ready                exit 0 when slurmdbd accepts
#                                            connections on its port
#
# Needs: /run/slurmk8s/slurmdbd/slurmdbd.conf (the <cluster>-slurmdbd-config
# ConfigMap), /run/slurmk8s/db/password (the database password Secret),
# /run/slurmk8s/munge/munge.key (Secret); SLURMK8S_DB_HOST and
# SLURMK8S_DB_PORT name the database it waits for.
set -euo pipefail
SK_COMPONENT=slurmdbd
here=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")
lib=$here/../common/slurmk8s-lib.sh
[ -r "$lib" ] || lib=/usr/local/lib/slurmk8s/lib.sh
# shellcheck source=images/common/slurmk8s-lib.sh
. "$lib"

rendered=$SK_MOUNTS/slurmdbd/slurmdbd.conf
password_file=$SK_MOUNTS/db/password
conf=/etc/slurm/slurmdbd.conf

if [ "${1:-}" = ready ]; then
  port=$(sk_conf_value "$conf" DbdPort)
  sk_port_open 127.0.0.1 "${port:-6819}" && exit 0
  echo "slurmdbd does not accept connections on port ${port:-6819}" >&2
  exit 1
fi

# sk_db_password_ok PASSWORD: whether slurmdbd.conf can hold it unquoted.
sk_db_password_ok() {
  local LC_ALL=C
  [ -n "$1" ] && [ "${#1}" -le 256 ] || return 1
  case $1 in
    *[!!-~]* | *[\#\"\'\\]*) return 1 ;;
  esac
}

sk_is_root || sk_die "slurmdbd's entrypoint must start as root (it starts munged and writes slurmdbd.conf for SlurmUser; slurmdbd switches to SlurmUser itself)"
[ -r "$rendered" ] || sk_die "$rendered is missing: mount the <cluster>-slurmdbd-config ConfigMap at $(dirname "$rendered")"
[ -r "$password_file" ] || sk_die "$password_file is missing: mount the database password Secret (spec.accounting.database) at $(dirname "$password_file")"
sk_require_env SLURMK8S_DB_HOST SLURMK8S_DB_PORT

slurm_user=$(sk_conf_value "$rendered" SlurmUser)
slurm_user=${slurm_user:-slurm}
getent passwd "$slurm_user" >/dev/null || sk_die "SlurmUser $slurm_user does not exist in this image"

# slurmdbd reads its config only when it is private to SlurmUser, and runs
# only on the host DbdHost names: this pod's. The password is appended here,
# never written to a ConfigMap, unquoted: whitespace would start another
# Key=Value, '#' a comment, quotes or '\' change how the rest reads. Only
# printable ASCII without those passes (slurmk8s.api.secrets.DB_PASSWORD_RE,
# which the operator checks first).
password=$(head -n1 "$password_file")
if ! LC_ALL=C sk_db_password_ok "$password"; then
  sk_die "the database password in $password_file must be 1 to 256 printable ASCII characters without spaces, '#', quotes or '\\'"
fi
install -d -o "$slurm_user" -g "$(id -g "$slurm_user")" -m 0755 /etc/slurm /run/slurmdbd
umask 077
{
  cat "$rendered"
  printf 'DbdHost=%s\n' "$(hostname -s)"
  printf 'StoragePass=%s\n' "$password"
} >"$conf"
chown "$slurm_user:" "$conf"
chmod 0600 "$conf"
umask 022
unset password

sk_start_munge

# slurmdbd gives up when the database does not answer at its start: wait for it
# (the managed MariaDB may still be creating its files), saying so every 10 s.
sk_wait_port "$SLURMK8S_DB_HOST" "$SLURMK8S_DB_PORT" 0 "slurmdbd needs its database at start" \
  "check the database's pod, or spec.accounting.database.external"

sk_run slurmdbd -D "$@"
