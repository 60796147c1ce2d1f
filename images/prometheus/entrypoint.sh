#!/bin/bash
# Entrypoint of the slurmk8s prometheus image (/usr/local/bin/slurmk8s-entrypoint).
#
#   slurmk8s-entrypoint                Prometheus with /etc/prometheus/prometheus.yml, data in /prometheus
#   slurmk8s-entrypoint ARGS...        Prometheus with those flags after the defaults (a later flag wins)
#
# Listens on :9090; /-/ready answers once the configuration is loaded, which
# is what the readinessProbe asks. Runs as nobody (65534); /prometheus must be
# writable (an emptyDir or a claim).
set -euo pipefail
SK_COMPONENT=prometheus
here=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")
lib=$here/../common/slurmk8s-lib.sh
[ -r "$lib" ] || lib=/usr/local/lib/slurmk8s/lib.sh
# shellcheck source=images/common/slurmk8s-lib.sh
. "$lib"

config=${SLURMK8S_PROMETHEUS_CONFIG:-/etc/prometheus/prometheus.yml}
[ -r "$config" ] || sk_die "no Prometheus configuration at $config: mount one (a ConfigMap) there"
exec /usr/bin/prometheus --config.file="$config" --storage.tsdb.path=/prometheus \
  --web.listen-address=:9090 "$@"
