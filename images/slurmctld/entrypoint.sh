#!/bin/bash
# Entrypoint of the slurmk8s slurmctld image (/usr/local/bin/slurmk8s-entrypoint).
#
#   slurmk8s-entrypoint [SLURMCTLD_ARGS...]   set up the pod, then run slurmctld
#                                             in the foreground (extra arguments,
#                                             e.g. -i or -v, go to slurmctld)
#   slurmk8s-entrypoint ready                 exit 0 when `scontrol ping` says UP
#                                             (the pod's readiness/startup probe)
#
# Needs: /etc/slurm/slurm.conf (ConfigMap), /run/slurmk8s/munge/munge.key
# (Secret), /run/slurmk8s/users/{passwd,group} (ConfigMap), the state volume at
# StateSaveLocation, and the JWT key Secret when slurm.conf names one.
set -euo pipefail
SK_COMPONENT=slurmctld
here=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")
lib=$here/../common/slurmk8s-lib.sh
[ -r "$lib" ] || lib=/usr/local/lib/slurmk8s/lib.sh
# shellcheck source=images/common/slurmk8s-lib.sh
. "$lib"

conf=/etc/slurm/slurm.conf

if [ "${1:-}" = ready ]; then
  out=$(sk_quick scontrol ping 2>&1) || true
  case $out in
    *" is UP"*) exit 0 ;;
    *) printf '%s\n' "$out" >&2; exit 1 ;;
  esac
fi

sk_is_root || sk_die "slurmctld's entrypoint must start as root (it starts munged and then slurmctld, which switches to SlurmUser itself)"
[ -r "$conf" ] || sk_die "$conf is missing: mount the <cluster>-slurm-config ConfigMap at /etc/slurm"

slurm_user=$(sk_conf_value "$conf" SlurmUser)
slurm_user=${slurm_user:-slurm}
getent passwd "$slurm_user" >/dev/null || sk_die "SlurmUser $slurm_user does not exist in this image"

# slurmctld only starts on the host slurm.conf names.
ctld_host=$(sk_conf_value "$conf" SlurmctldHost)
ctld_host=${ctld_host%%(*}
if [ -n "$ctld_host" ] && [ "$ctld_host" != "$(hostname -s)" ]; then
  sk_die "this pod's host name is $(hostname -s) but slurm.conf has SlurmctldHost=$ctld_host: run slurmctld in the pod of that name (the StatefulSet's pod 0)"
fi

sk_setup_users
# slurmctld resolves an association's user to a uid when the association
# arrives; one that arrived before its user's passwd line (the operator adds
# associations at once, the kubelet syncs the ConfigMap later) is resolved
# again by a reconfigure.
sk_follow_users 30 scontrol reconfigure
sk_start_munge

state=$(sk_conf_value "$conf" StateSaveLocation)
state=${state:-/var/spool/slurmctld}
mkdir -p "$state"
chown "$slurm_user:" "$state"
chmod 0700 "$state"
sk_log "state directory $state ($(find "$state" -mindepth 1 -maxdepth 1 | wc -l) entries)"

# With slurmrestd enabled slurm.conf names a JWT key, which slurmctld 22.05
# reads as SlurmUser (not as root): a Secret mounted 0400 root is unreadable
# to it ("fatal: auth/jwt: Could not load key file"). When slurm.conf names a
# path outside the Secret's mount, the key is copied there, owned by SlurmUser.
jwt_key=$(sk_conf_value "$conf" AuthAltParameters | tr ',' '\n' | sed -n 's/^jwt_key=//p')
jwt_secret=$SK_MOUNTS/jwt/jwt_hs256.key
if [ -n "$jwt_key" ]; then
  if [ "$jwt_key" != "$jwt_secret" ]; then
    [ -r "$jwt_secret" ] || sk_die "slurm.conf names a JWT key ($jwt_key) but the <cluster>-jwt-key Secret is not mounted at $(dirname "$jwt_secret")"
    install -D -o "$slurm_user" -g "$(id -g "$slurm_user")" -m 0400 "$jwt_secret" "$jwt_key"
    sk_log "copied the JWT key to $jwt_key (owner $slurm_user, mode 0400)"
  elif ! setpriv --reuid="$slurm_user" --regid="$(id -g "$slurm_user")" --init-groups test -r "$jwt_key"; then
    sk_die "slurmctld reads the JWT key $jwt_key as $slurm_user, who cannot read it: mount the Secret group-readable by $slurm_user (defaultMode 0440 with the pod's fsGroup $(id -g "$slurm_user")), or have slurm.conf name a path outside $(dirname "$jwt_secret") so this entrypoint copies the key there"
  fi
fi

# With accounting, slurmctld learns its TRES and associations from slurmdbd and
# keeps them in its state directory. Without either (the very first start) it
# refuses to run ("we have no TRES from it"): only then wait for slurmdbd. Once
# the state is there, slurmctld starts and runs jobs while slurmdbd is away,
# and sends the queued records when it returns.
if [ "$(sk_conf_value "$conf" AccountingStorageType)" = accounting_storage/slurmdbd ] \
    && [ ! -e "$state/last_tres" ] && [ ! -e "$state/assoc_mgr_state" ]; then
  dbd_host=$(sk_conf_value "$conf" AccountingStorageHost)
  dbd_port=$(sk_conf_value "$conf" AccountingStoragePort)
  sk_wait_port "$dbd_host" "${dbd_port:-6819}" 0 "first start with accounting: slurmctld needs slurmdbd once to learn its TRES and associations" \
    "check the <cluster>-slurmdbd and <cluster>-mariadb pods"
fi

sk_run slurmctld -D -f "$conf" "$@"
