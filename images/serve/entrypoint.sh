#!/bin/bash
# Entrypoint of the slurmk8s serve image (/usr/local/bin/slurmk8s-entrypoint).
#
#   slurmk8s-entrypoint                serve SLURMK8S_MODEL_DIR on SLURMK8S_SERVE_PORT
#   slurmk8s-entrypoint ARGS...        serve.py ARGS (--model-dir DIR --port PORT ...)
#
# Serves the model version that <model dir>/LATEST names and follows LATEST
# as training jobs publish new versions (slurmk8s/serve.py). GET / answers
# with the version, step and path; GET /healthz is 503 until a model is
# loaded, which is what the readinessProbe asks.
#
# Environment: SLURMK8S_MODEL_DIR (the model directory on the shared volume,
# mounted read-only, e.g. /shared/checkpoints/researcher/train),
# SLURMK8S_SERVE_PORT (default 8080).
set -euo pipefail
SK_COMPONENT=serve
here=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")
lib=$here/../common/slurmk8s-lib.sh
[ -r "$lib" ] || lib=/usr/local/lib/slurmk8s/lib.sh
# shellcheck source=images/common/slurmk8s-lib.sh
. "$lib"

server=$here/../../slurmk8s/serve.py
[ -r "$server" ] || server=/usr/local/lib/slurmk8s/serve.py
[ -r "$server" ] || sk_die "the server $server is missing from the image"
command -v python3 >/dev/null || sk_die "python3 is not installed (a custom BASE_IMAGE needs it)"

if [ $# -eq 0 ]; then
  sk_require_env SLURMK8S_MODEL_DIR
  port=${SLURMK8S_SERVE_PORT:-8080}
  case $port in '' | *[!0-9]*) sk_die "SLURMK8S_SERVE_PORT must be a port number, not '$port'" ;; esac
  if [ ! -d "$SLURMK8S_MODEL_DIR" ]; then
    sk_log "warning: $SLURMK8S_MODEL_DIR does not exist (yet): is the shared volume mounted at the path the Slurm pods use? Not ready until a job publishes a model there"
  fi
  set -- --model-dir "$SLURMK8S_MODEL_DIR" --port "$port"
fi
sk_log "serving: python3 $server $*"
exec python3 "$server" "$@"
