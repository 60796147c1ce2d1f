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
# There is no slurmdbd, so only the plugin of slurmctld's endpoints is loaded
# (the db ones would need slurmdbd). Which plugin and data parser that is
# depends on the Slurm release: the renderer sets SLURMK8S_RESTD_OPENAPI
# (slurmrestd -s, comma-separated) and, for releases with data parser
# plugins, SLURMK8S_RESTD_DATA_PARSER (slurmrestd -d) from its version table.
# Without them the image picks what it has: openapi/slurmctld if installed,
# else its newest openapi/v0.0.N.
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
openapi=${SLURMK8S_RESTD_OPENAPI:-}
if [ -z "$openapi" ]; then
  plugins=$(find /usr/lib /usr/lib64 -path '*slurm*' -name 'openapi_*.so' 2>/dev/null | sed 's|.*/openapi_||; s|\.so$||' | sort -V)
  if printf '%s\n' "$plugins" | grep -qx slurmctld; then
    openapi=openapi/slurmctld
  else
    openapi=$(printf '%s\n' "$plugins" | sed -n 's/^v\([0-9_]*\)$/v\1/p' | tail -n 1 | tr _ .)
    [ -n "$openapi" ] || sk_die "found no openapi plugin of slurmrestd in this image; set SLURMK8S_RESTD_OPENAPI"
    openapi=openapi/$openapi
  fi
fi
parser_args=()
[ -z "${SLURMK8S_RESTD_DATA_PARSER:-}" ] || parser_args=(-d "$SLURMK8S_RESTD_DATA_PARSER")
sk_log "starting slurmrestd on $listen as uid $(id -u) (auth rest_auth/jwt, plugins $openapi${SLURMK8S_RESTD_DATA_PARSER:+, data parser $SLURMK8S_RESTD_DATA_PARSER})"
# Nothing else runs in this pod (no munged), so slurmrestd may replace the shell.
exec slurmrestd -a rest_auth/jwt -s "$openapi" "${parser_args[@]}" "${user_args[@]}" "$@" "$listen"
