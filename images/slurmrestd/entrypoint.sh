#!/bin/bash
# Entrypoint of the slurmk8s slurmrestd image (/usr/local/bin/slurmk8s-entrypoint).
#
#   slurmk8s-entrypoint [SLURMRESTD_ARGS...]   run slurmrestd on SLURMK8S_RESTD_LISTEN
#                                              (default 0.0.0.0:6820); extra
#                                              arguments (e.g. -vv) go to slurmrestd
#   slurmk8s-entrypoint ready                  exit 0 when that port accepts connections
#
# slurmrestd refuses to run as root or as SlurmUser: the pod runs it as
# 65534:65534 (nobody). Clients authenticate with JWTs (X-SLURM-USER-NAME and
# X-SLURM-USER-TOKEN headers, tokens from `scontrol token`); slurmrestd passes
# them on to slurmctld, which checks them with its JWT key. So this pod needs
# no munged and no key of its own, only /etc/slurm (the ConfigMap).
#
# Slurm 22.05 has no slurmdbd here, so only the openapi/v0.0.38 plugin is
# loaded (the dbv0.0.38 one would need slurmdbd). Set SLURMK8S_RESTD_OPENAPI
# to load others (comma-separated).
set -euo pipefail
SK_COMPONENT=slurmrestd
here=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")
lib=$here/../common/slurmk8s-lib.sh
[ -r "$lib" ] || lib=/usr/local/lib/slurmk8s/lib.sh
# shellcheck source=images/common/slurmk8s-lib.sh
. "$lib"

listen=${SLURMK8S_RESTD_LISTEN:-0.0.0.0:6820}

if [ "${1:-}" = ready ]; then
  sk_port_open 127.0.0.1 "${listen##*:}" || { echo "slurmrestd does not accept connections on port ${listen##*:}" >&2; exit 1; }
  exit 0
fi

conf=/etc/slurm/slurm.conf
[ -r "$conf" ] || sk_die "$conf is missing: mount the <cluster>-slurm-config ConfigMap at /etc/slurm"
case $(sk_conf_value "$conf" AuthAltTypes) in
  *auth/jwt*) ;;
  *) sk_die "slurm.conf has no AuthAltTypes=auth/jwt: slurmctld would reject every token; enable spec.restApi so the operator renders it" ;;
esac

user_args=()
if sk_is_root; then
  # Outside the pod's securityContext (e.g. `docker run`): drop to nobody
  # once the socket is open.
  sk_log "running as root: slurmrestd will switch to user nobody"
  user_args=(-u nobody)
fi

# Without SLURM_JWT=daemon, slurmrestd passes tokens through its primary auth
# plugin (auth/munge), which rejects them: "Rejecting thread config token for
# user X" and HTTP 401 for every request. With it, auth/jwt is primary.
export SLURM_JWT=daemon
openapi=${SLURMK8S_RESTD_OPENAPI:-openapi/v0.0.38}
sk_log "starting slurmrestd on $listen as uid $(id -u) (auth rest_auth/jwt, plugins $openapi)"
# Nothing else runs in this pod (no munged), so slurmrestd may replace the shell.
exec slurmrestd -a rest_auth/jwt -s "$openapi" "${user_args[@]}" "$@" "$listen"
