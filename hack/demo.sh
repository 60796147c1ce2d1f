#!/usr/bin/env bash
# The main job, today: validate the example SlurmCluster and render every
# Kubernetes object it becomes. (Later: bring it up in the sandbox.)
set -euo pipefail
cd "$(dirname "$0")/.."
hack/setup.sh
example=${1:-examples/slurmcluster.yaml}
out=${OUT_DIR:-build/demo}
mkdir -p "$out"

.venv/bin/slurmk8s validate -f "$example"
.venv/bin/slurmk8s render -f "$example" --keys-dir "$out/keys" > "$out/objects.yaml"
printf '\nRendered %s objects from %s into %s/objects.yaml:\n' \
  "$(grep -c '^kind:' "$out/objects.yaml")" "$example" "$out"
awk '/^kind:/{k=$2} /^  name:/{if(k){printf "  %-22s %s\n", k, $2; k=""}}' "$out/objects.yaml"
printf '\nslurm.conf:\n'
.venv/bin/python - "$out/objects.yaml" <<'PY'
import sys, yaml
for doc in yaml.safe_load_all(open(sys.argv[1])):
    if doc["kind"] == "ConfigMap" and doc["metadata"]["name"].endswith("-slurm-config"):
        print("  " + doc["data"]["slurm.conf"].replace("\n", "\n  "))
PY
printf 'Next: read %s/objects.yaml, or apply it to a cluster with the CRDs installed:\n' "$out"
printf '  kubectl apply -f charts/slurmk8s/crds/ && kubectl apply -f %s/objects.yaml\n' "$out"
